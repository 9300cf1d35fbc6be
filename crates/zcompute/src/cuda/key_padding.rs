//! Key-padding attention on the device (`AttentionOps::key_padding_attention`):
//! `attention.cu`'s `zc_key_padding_attention*` kernels (one block per query row forward; the
//! backward one block per query row for dq and the rows' stats, then one per key row for dk and
//! dv) where the sequences fit their shared memory, the composite of the op set otherwise. The
//! mask's pointer is null when there is none. No atomics: two runs give the same bits.

use super::kernels::{Args, Kernel, ptr};
use super::{CudaBackend, CudaStorage, CudaTensor};
use crate::attention::{
    KeyPaddingAttention, KeyPaddingAttentionGrads, key_padding_composite_backward,
    key_padding_composite_forward,
};
use crate::error::Result;
use crate::validate::{self, KeyPadding};
use zdevice::{DevicePtr, Driver, KernelArg, LaunchConfig};

/// Longest query or key sequence the kernels take (a row's probabilities and dS live in
/// shared memory: 2 · 4096 floats, 32 KiB, under the 48 KiB a launch may use without opt-in).
pub(crate) const MAX_SEQ: usize = 4096;
/// Threads per block.
pub(crate) const THREADS: u32 = 128;

/// The shared memory of each kernel: the forward `Sk + 2` floats, the query pass `2·Sk + 2`,
/// the key pass `2·Sq`.
pub(crate) fn shared_bytes(kernel: Kernel, a: KeyPadding) -> usize {
    4 * match kernel {
        Kernel::KeyPaddingAttention => a.k_len + 2,
        Kernel::KeyPaddingAttentionBackwardQ => 2 * a.k_len + 2,
        _ => 2 * a.q_len,
    }
}

/// The launch of `kernel` (one block per query row, or per key row for the key pass), or
/// `None` where the shape is not one the kernels take (the caller runs the composite).
pub(crate) fn launch_config(kernel: Kernel, a: KeyPadding) -> Option<LaunchConfig> {
    let fits = !a.is_empty() && a.q_len <= MAX_SEQ && a.k_len <= MAX_SEQ;
    let rows = match kernel {
        Kernel::KeyPaddingAttentionBackwardKv => a.batch.checked_mul(a.k_len)?,
        _ => a.batch.checked_mul(a.q_len)?,
    };
    // Every size is passed as 32 bits.
    let small = [a.batch, a.dk, a.dv, rows]
        .iter()
        .all(|&v| v < i32::MAX as usize);
    (fits && small).then(|| LaunchConfig {
        grid: (rows as u32, 1, 1),
        block: (THREADS, 1, 1),
        shared_mem_bytes: shared_bytes(kernel, a) as u32,
    })
}

fn sizes(a: KeyPadding) -> [KernelArg; 5] {
    // `launch_config` checked each fits in 32 bits.
    [a.batch, a.q_len, a.k_len, a.dk, a.dv].map(|v| KernelArg::U32(v as u32))
}

impl<D: Driver> CudaBackend<D> {
    /// q, k, v and the mask (null when absent), dense, as kernel arguments.
    fn key_padding_operands(
        &self,
        op: &'static str,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        key_keep: Option<&CudaTensor>,
    ) -> Result<Args> {
        let mut args = Args::new();
        for t in [q, k, v] {
            args.push(ptr(self.ptr(op, &self.dense(op, t)?)?));
        }
        let keep = match key_keep {
            Some(m) => self.ptr(op, &self.dense(op, m)?)?,
            None => DevicePtr::NULL,
        };
        args.push(ptr(keep));
        Ok(args)
    }

    pub(crate) fn key_padding_attention_fused(
        &self,
        att: &KeyPaddingAttention<'_, CudaStorage>,
    ) -> Result<CudaTensor> {
        const OP: &str = "key_padding_attention";
        let KeyPaddingAttention {
            q,
            k,
            v,
            key_keep,
            scale,
        } = *att;
        let a = validate::key_padding_attention(OP, q, k, v, key_keep, scale)?;
        let kernel = Kernel::KeyPaddingAttention;
        let Some(config) = launch_config(kernel, a) else {
            return key_padding_composite_forward(self, q, k, v, key_keep, scale);
        };
        let out = self.alloc(OP, &[a.batch, a.q_len, a.dv])?;
        let mut args: Args = std::iter::once(ptr(self.ptr(OP, &out)?)).collect();
        args.extend(self.key_padding_operands(OP, q, k, v, key_keep)?);
        args.extend(sizes(a));
        args.push(KernelArg::F32(scale));
        self.launch(OP, kernel, config, &args)?;
        Ok(out)
    }

    pub(crate) fn key_padding_attention_backward_fused(
        &self,
        g: &CudaTensor,
        att: &KeyPaddingAttention<'_, CudaStorage>,
    ) -> Result<KeyPaddingAttentionGrads<CudaStorage>> {
        const OP: &str = "key_padding_attention_backward";
        let KeyPaddingAttention {
            q,
            k,
            v,
            key_keep,
            scale,
        } = *att;
        let a = validate::key_padding_attention_backward(g, q, k, v, key_keep, scale)?;
        let (query, key) = (
            Kernel::KeyPaddingAttentionBackwardQ,
            Kernel::KeyPaddingAttentionBackwardKv,
        );
        let (Some(query_config), Some(key_config)) =
            (launch_config(query, a), launch_config(key, a))
        else {
            return key_padding_composite_backward(self, g, q, k, v, key_keep, scale);
        };
        let dq = self.alloc(OP, q.shape())?;
        let dk = self.alloc(OP, k.shape())?;
        let dv = self.alloc(OP, v.shape())?;
        // Each query row's max, 1 / sum and Σ P·dP, for the key pass.
        let stats = self.alloc_temp(OP, &[a.batch * a.q_len, 3])?;
        let g = self.dense(OP, g)?;
        let operands = self.key_padding_operands(OP, q, k, v, key_keep)?;
        let tail = |args: &mut Args| {
            args.extend(operands.iter().copied());
            args.extend(sizes(a));
            args.push(KernelArg::F32(scale));
        };
        let mut args: Args = [&dq, &stats, &g]
            .into_iter()
            .map(|t| self.ptr(OP, t).map(ptr))
            .collect::<Result<_>>()?;
        tail(&mut args);
        self.launch(OP, query, query_config, &args)?;
        let mut args: Args = [&dk, &dv, &stats, &g]
            .into_iter()
            .map(|t| self.ptr(OP, t).map(ptr))
            .collect::<Result<_>>()?;
        tail(&mut args);
        self.launch(OP, key, key_config, &args)?;
        Ok(KeyPaddingAttentionGrads {
            q: dq,
            k: dk,
            v: dv,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(batch: usize, q_len: usize, k_len: usize) -> KeyPadding {
        KeyPadding {
            batch,
            q_len,
            k_len,
            dk: 8,
            dv: 6,
        }
    }

    /// One block per query row (per key row for the key pass); sequences past the shared
    /// memory's limit and empty shapes go to the composite.
    #[rstest::rstest]
    #[case::forward(Kernel::KeyPaddingAttention, shape(3, 4, 5), Some((12, 4 * 7)))]
    #[case::query_pass(Kernel::KeyPaddingAttentionBackwardQ, shape(3, 4, 5), Some((12, 4 * 12)))]
    #[case::key_pass(Kernel::KeyPaddingAttentionBackwardKv, shape(3, 4, 5), Some((15, 4 * 8)))]
    #[case::longest(Kernel::KeyPaddingAttentionBackwardQ, shape(1, 1, MAX_SEQ), Some((1, 4 * (2 * MAX_SEQ + 2))))]
    #[case::too_long_keys(Kernel::KeyPaddingAttention, shape(1, 1, MAX_SEQ + 1), None)]
    #[case::too_long_queries(Kernel::KeyPaddingAttentionBackwardKv, shape(1, MAX_SEQ + 1, 1), None)]
    #[case::no_keys(Kernel::KeyPaddingAttention, shape(2, 3, 0), None)]
    #[case::empty_batch(Kernel::KeyPaddingAttention, shape(0, 3, 3), None)]
    fn launch_for_each_shape(
        #[case] kernel: Kernel,
        #[case] a: KeyPadding,
        #[case] want: Option<(u32, usize)>,
    ) {
        let got = launch_config(kernel, a).map(|c| {
            assert_eq!(c.block.0, THREADS);
            (c.grid.0, c.shared_mem_bytes as usize)
        });
        assert_eq!(got, want);
        assert!(shared_bytes(kernel, shape(1, MAX_SEQ, MAX_SEQ)) <= 48 * 1024);
    }
}
