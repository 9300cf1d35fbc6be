//! The CPU backend: every op of `Backend` for f32 and f64 over host `Vec`s. It is the reference
//! the CUDA backend is tested against: plain, checkable row-wise loops over dense data (read in
//! place when a tensor is contiguous, gathered into logical order otherwise), split over a
//! thread pool by independent outputs only, so results are bitwise the same for any thread
//! count (`par`); matrix products run matrixmultiply's packed kernels.

mod accumulate;
pub(crate) mod attention;
mod common;
mod dense;
mod elementwise;
mod families;
pub(crate) mod fused;
pub(crate) mod indexed;
pub(crate) mod key_padding;
pub(crate) mod math;
mod matmul;
pub(crate) mod norm;
mod par;
pub(crate) mod pool;
mod precision;
pub(crate) mod reduce;
pub(crate) mod select;
pub(crate) mod train;

use crate::backend::{
    AdamWConfig, Backend, BinaryOp, LayerNormGrads, LayerNormOut, MatmulOpts, ReduceOp, ScalarSide,
    UnaryOp,
};
use crate::element::Element;
use crate::error::Result;
use crate::storage::CpuStorage;
use crate::tensor::CpuTensor;
use crate::validate;

use common::scatter;
pub(crate) use common::{dense, gather};

pub use par::{
    THREADS_VAR, ThreadsError, default_threads, parse_threads, set_threads, threads, with_threads,
};

/// The host backend. Stateless: tensors own their storage.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuBackend;

impl<T: Element> Backend<T> for CpuBackend {
    type Storage = CpuStorage<T>;

    fn name(&self) -> &'static str {
        "cpu"
    }

    fn upload(&self, data: &[T], shape: &[usize]) -> Result<CpuTensor<T>> {
        validate::upload::<T>(data.len(), shape)?;
        dense(data.to_vec(), shape)
    }

    fn upload_into(&self, data: &[T], dst: &CpuTensor<T>) -> Result<()> {
        validate::upload_into(data.len(), dst)?;
        scatter(data, dst);
        Ok(())
    }

    fn download(&self, x: &CpuTensor<T>) -> Result<Vec<T>> {
        Ok(gather(x))
    }

    fn full(&self, shape: &[usize], value: T) -> Result<CpuTensor<T>> {
        let n = validate::full::<T>(shape)?;
        dense(vec![value; n], shape)
    }

    fn fill(&self, dst: &CpuTensor<T>, value: T) -> Result<()> {
        validate::fill(dst)?;
        let mut data = dst.storage().write();
        if dst.is_contiguous() {
            let start = dst.layout().offset();
            data[start..start + dst.numel()].fill(value);
        } else {
            for o in dst.layout().offsets() {
                data[o] = value;
            }
        }
        Ok(())
    }

    fn contiguous(&self, x: &CpuTensor<T>) -> Result<CpuTensor<T>> {
        dense(gather(x), x.shape())
    }

    fn copy_into(&self, src: &CpuTensor<T>, dst: &CpuTensor<T>) -> Result<()> {
        validate::copy_into(src, dst)?;
        // Gather first (read lock released) so `src` may alias `dst`, even overlapping.
        let values = gather(src);
        scatter(&values, dst);
        Ok(())
    }

    fn unary(&self, op: UnaryOp, x: &CpuTensor<T>) -> Result<CpuTensor<T>> {
        elementwise::unary(op, x)
    }

    fn binary(&self, op: BinaryOp, a: &CpuTensor<T>, b: &CpuTensor<T>) -> Result<CpuTensor<T>> {
        elementwise::binary(op, a, b)
    }

    fn binary_scalar(
        &self,
        op: BinaryOp,
        x: &CpuTensor<T>,
        s: T,
        side: ScalarSide,
    ) -> Result<CpuTensor<T>> {
        elementwise::binary_scalar(op, x, s, side)
    }

    fn reduce(
        &self,
        op: ReduceOp,
        x: &CpuTensor<T>,
        axis: usize,
        keepdim: bool,
    ) -> Result<CpuTensor<T>> {
        reduce::reduce(op, x, axis, keepdim)
    }

    fn softmax_last(&self, x: &CpuTensor<T>) -> Result<CpuTensor<T>> {
        norm::softmax_last(x)
    }

    fn layer_norm(
        &self,
        x: &CpuTensor<T>,
        weight: Option<&CpuTensor<T>>,
        bias: Option<&CpuTensor<T>>,
        eps: T,
    ) -> Result<LayerNormOut<CpuStorage<T>>> {
        norm::layer_norm(x, weight, bias, eps)
    }

    fn matmul(&self, a: &CpuTensor<T>, b: &CpuTensor<T>, opts: MatmulOpts) -> Result<CpuTensor<T>> {
        matmul::matmul(a, b, opts)
    }

    // The provided composites replaced by one pass each (`accumulate`).

    fn add_into(&self, src: &CpuTensor<T>, dst: &CpuTensor<T>) -> Result<()> {
        accumulate::add_into(src, dst)
    }

    fn matmul_into(
        &self,
        a: &CpuTensor<T>,
        b: &CpuTensor<T>,
        opts: MatmulOpts,
        dst: &CpuTensor<T>,
    ) -> Result<()> {
        accumulate::matmul_into(a, b, opts, dst)
    }

    fn sum_rows_into(&self, x: &CpuTensor<T>, dst: &CpuTensor<T>) -> Result<()> {
        accumulate::sum_rows_into(x, dst)
    }

    fn softmax_backward(&self, g: &CpuTensor<T>, y: &CpuTensor<T>) -> Result<CpuTensor<T>> {
        accumulate::softmax_backward(g, y)
    }

    fn layer_norm_backward(
        &self,
        g: &CpuTensor<T>,
        x: &CpuTensor<T>,
        mean: &CpuTensor<T>,
        rstd: &CpuTensor<T>,
        weight: Option<&CpuTensor<T>>,
        want: [bool; 2],
    ) -> Result<LayerNormGrads<CpuStorage<T>>> {
        accumulate::layer_norm_backward(g, x, mean, rstd, weight, want)
    }

    fn bce_with_logits_mean(
        &self,
        logits: &CpuTensor<T>,
        targets: &CpuTensor<T>,
    ) -> Result<CpuTensor<T>> {
        train::bce_with_logits_mean(logits, targets)
    }

    fn adamw_step(
        &self,
        p: &CpuTensor<T>,
        m: &CpuTensor<T>,
        v: &CpuTensor<T>,
        g: &CpuTensor<T>,
        slot: &CpuTensor<T>,
        cfg: &AdamWConfig<T>,
    ) -> Result<()> {
        train::adamw_step(p, m, v, g, slot, cfg)
    }

    fn gather_row(
        &self,
        src: &CpuTensor<T>,
        index: &CpuTensor<T>,
        dst: &CpuTensor<T>,
    ) -> Result<()> {
        indexed::gather_row(src, index, dst)
    }

    fn scatter_row(
        &self,
        src: &CpuTensor<T>,
        index: &CpuTensor<T>,
        dst: &CpuTensor<T>,
        advance: bool,
    ) -> Result<()> {
        indexed::scatter_row(src, index, dst, advance)
    }
}

/// The host twin of a device graph: the recorded body, run again on each replay.
pub struct CpuGraph {
    body: Box<dyn FnMut() -> Result<()>>,
    replays: u64,
}

impl CpuGraph {
    /// How many times the graph was replayed.
    #[must_use]
    pub fn replays(&self) -> u64 {
        self.replays
    }
}

impl std::fmt::Debug for CpuGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuGraph")
            .field("replays", &self.replays)
            .finish_non_exhaustive()
    }
}

impl<T: Element> crate::capture::Capture<T> for CpuBackend {
    type Graph = CpuGraph;

    fn capture(&self, mut body: Box<dyn FnMut() -> Result<()>>) -> Result<CpuGraph> {
        body()?;
        Ok(CpuGraph { body, replays: 0 })
    }

    fn replay(&self, graph: &mut CpuGraph) -> Result<()> {
        (graph.body)()?;
        graph.replays += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ComputeError;

    #[test]
    fn upload_into_writes_through_a_view_and_checks_length() {
        let b = CpuBackend;
        let t = CpuTensor::<f32>::from_vec(vec![0.0; 6], &[2, 3]).unwrap();
        let col = t.narrow(1, 1, 1).unwrap();
        Backend::upload_into(&b, &[7.0, 8.0], &col).unwrap();
        assert_eq!(t.to_vec(), vec![0.0, 7.0, 0.0, 0.0, 8.0, 0.0]);
        let err = Backend::upload_into(&b, &[1.0], &col).unwrap_err();
        assert!(matches!(
            err,
            ComputeError::LengthMismatch {
                expected: 2,
                got: 1,
                ..
            }
        ));
    }

    #[test]
    fn cpu_capture_runs_once_then_once_per_replay() {
        use crate::capture::Capture;
        let b = CpuBackend;
        let x = CpuTensor::<f32>::from_vec(vec![1.0, 2.0], &[2]).unwrap();
        let acc = CpuTensor::<f32>::from_vec(vec![0.0, 0.0], &[2]).unwrap();
        let (xc, ac) = (x.clone(), acc.clone());
        let mut g = Capture::<f32>::capture(
            &b,
            Box::new(move || {
                let s = Backend::add(&CpuBackend, &ac, &xc)?;
                Backend::copy_into(&CpuBackend, &s, &ac)
            }),
        )
        .unwrap();
        assert_eq!(acc.to_vec(), vec![1.0, 2.0]);
        Backend::upload_into(&b, &[10.0, 20.0], &x).unwrap();
        Capture::<f32>::replay(&b, &mut g).unwrap();
        assert_eq!(acc.to_vec(), vec![11.0, 22.0]);
        assert_eq!(g.replays(), 1);
    }
}
