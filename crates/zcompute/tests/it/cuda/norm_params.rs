//! `layer_norm_backward_into` (LayerNorm's backward with its weight's and bias's gradients added
//! into their buffers) on a CUDA backend against the CPU backend in f64, poison on: rows 1, 3,
//! 12 and the one-launch limit (32), and past it in chunks (33, 100, 3072), widths 5, 37, 64, 193,
//! 256 and 600, with and without the residual stream's gradient and the weight, the input gradient
//! wanted or not, dw and db both or either, as adjacent views of one buffer holding non-zero
//! values (they are accumulated into; the elements around them must stay as they were). Per
//! tensor ||ours - f64|| / ||f64|| within 1e-5; two runs bitwise equal; a captured call
//! replayed equals it run eagerly. The `mock` suite runs on the simulated device, the `gpu`
//! suite (feature `gpu`) on CUDA device 0. Launch counts and bad arguments: mock only, below.

use super::fused::{close, pair};
use zcompute::prelude::*;
use zcompute::{
    Backend, Capture, CpuBackend, CpuTensor, CudaBackend, CudaTensor, LayerNormBackward,
};
use zdevice::Driver;

const CPU: CpuBackend = CpuBackend;
const EPS: f32 = 1e-5;

/// Rows of every parity case: the one-launch path's 1, 3, 12 and its limit, then the chunked
/// path's: one past the limit, a last chunk of 4 rows, and a batch's 3072 (96 chunks).
pub const ROWS: [usize; 7] = [1, 3, 12, 32, 33, 100, 3072];
/// Widths: a batch's rows up to 512 wide take the one-warp-a-row kernel, 600 the block-row
/// chunks.
pub const WIDTHS: [usize; 6] = [5, 37, 64, 193, 256, 600];

fn bits<D: Driver>(gpu: &CudaBackend<D>, t: &CudaTensor) -> Vec<u32> {
    let v = gpu.download(t).expect("download");
    v.into_iter().map(f32::to_bits).collect()
}

/// The operands of one LayerNorm backward, on the device and (f64) on the host.
pub struct Operands {
    g: (CudaTensor, CpuTensor<f64>),
    residual: Option<(CudaTensor, CpuTensor<f64>)>,
    x: (CudaTensor, CpuTensor<f64>),
    mean: (CudaTensor, CpuTensor<f64>),
    rstd: (CudaTensor, CpuTensor<f64>),
    weight: Option<(CudaTensor, CpuTensor<f64>)>,
}

impl Operands {
    /// The device operands `[g, residual, x, mean, rstd, weight]` (residual and weight given).
    pub fn device(&self) -> [CudaTensor; 6] {
        let res = self.residual.as_ref().expect("a residual gradient");
        let w = self.weight.as_ref().expect("a weight");
        [&self.g, res, &self.x, &self.mean, &self.rstd, w].map(|t| t.0.clone())
    }
}

/// `x [rows, n]` normalised forward on each backend (its mean and rstd), `g`, and the residual
/// gradient and weight when asked for.
pub fn operands<D: Driver>(
    gpu: &CudaBackend<D>,
    (rows, n): (usize, usize),
    residual: bool,
    weight: bool,
) -> Operands {
    let x = pair(gpu, &[rows, n], 31, (-2.0, 2.0), false);
    let w = weight.then(|| pair(gpu, &[n], 32, (0.5, 1.5), false));
    let fwd = gpu
        .layer_norm(&x.0, w.as_ref().map(|w| &w.0), None, EPS)
        .expect("forward");
    let want = CPU
        .layer_norm(&x.1, w.as_ref().map(|w| &w.1), None, f64::from(EPS))
        .expect("cpu forward");
    Operands {
        g: pair(gpu, &[rows, n], 33, (-1.0, 1.0), false),
        residual: residual.then(|| pair(gpu, &[rows, n], 34, (-1.0, 1.0), false)),
        x,
        mean: (fwd.mean, want.mean),
        rstd: (fwd.rstd, want.rstd),
        weight: w,
    }
}

/// Which parameter buffers are given: dw at `[1, 1 + n)` and db at `[1 + n, 1 + 2n)` of one
/// `[2n + 2]` buffer (adjacent views, an element either side).
fn views<S: zcompute::Storage>(
    flat: &zcompute::Tensor<S>,
    n: usize,
    [with_dw, with_db]: [bool; 2],
) -> (Option<zcompute::Tensor<S>>, Option<zcompute::Tensor<S>>) {
    let dw = with_dw.then(|| flat.narrow(0, 1, n).expect("dw"));
    let db = with_db.then(|| flat.narrow(0, 1 + n, n).expect("db"));
    (dw, db)
}

/// Runs `layer_norm_backward_into` on the device into a fresh copy of `init` (`[2n + 2]`):
/// the input gradient and the whole buffer.
fn run_device<D: Driver>(
    gpu: &CudaBackend<D>,
    o: &Operands,
    init: &[f32],
    want_input: bool,
    params: [bool; 2],
) -> (Option<CudaTensor>, CudaTensor) {
    let n = o.x.0.shape()[1];
    let flat = gpu.upload(init, &[2 * n + 2]).expect("flat");
    let (dw, db) = views(&flat, n, params);
    let input = gpu
        .layer_norm_backward_into(
            &LayerNormBackward {
                g: &o.g.0,
                residual: o.residual.as_ref().map(|r| &r.0),
                x: &o.x.0,
                mean: &o.mean.0,
                rstd: &o.rstd.0,
                weight: o.weight.as_ref().map(|w| &w.0),
            },
            want_input,
            dw.as_ref(),
            db.as_ref(),
        )
        .expect("layer_norm_backward_into");
    (input, flat)
}

pub fn parity<D: Driver>(
    gpu: &CudaBackend<D>,
    rows: usize,
    n: usize,
    residual: bool,
    weight: bool,
) {
    let o = operands(gpu, (rows, n), residual, weight);
    let (flat0, flatc0) = pair(gpu, &[2 * n + 2], 35, (-0.5, 0.5), false);
    let init = gpu.download(&flat0).expect("init");
    for want_input in [true, false] {
        for params in [[true, true], [true, false], [false, true]] {
            let what = format!(
                "rows {rows} n {n} residual {residual} weight {weight} input {want_input} \
                 (dw, db) {params:?}"
            );
            let (input, flat) = run_device(gpu, &o, &init, want_input, params);
            let flatc = CpuTensor::from_vec(flatc0.to_vec(), &[2 * n + 2]).expect("cpu flat");
            let (dwc, dbc) = views(&flatc, n, params);
            let inputc = CPU
                .layer_norm_backward_into(
                    &LayerNormBackward {
                        g: &o.g.1,
                        residual: o.residual.as_ref().map(|r| &r.1),
                        x: &o.x.1,
                        mean: &o.mean.1,
                        rstd: &o.rstd.1,
                        weight: o.weight.as_ref().map(|w| &w.1),
                    },
                    want_input,
                    dwc.as_ref(),
                    dbc.as_ref(),
                )
                .expect("cpu");
            match (&input, &inputc) {
                (Some(ours), Some(want)) => close(&format!("{what} input"), gpu, ours, want),
                (None, None) => assert!(!want_input, "{what}: no input gradient"),
                _ => panic!("{what}: input gradient on one backend only"),
            }
            // The parameters' gradients, and the elements around them untouched.
            close(&format!("{what} flat buffer"), gpu, &flat, &flatc);
            let got = gpu.download(&flat).expect("flat");
            assert_eq!(got[0].to_bits(), init[0].to_bits(), "{what}: before dw");
            assert_eq!(
                got[2 * n + 1].to_bits(),
                init[2 * n + 1].to_bits(),
                "{what}: after db"
            );
            if !params[0] {
                assert_eq!(got[1..=n], init[1..=n], "{what}: dw not given, not written");
            }
            if !params[1] {
                assert_eq!(
                    got[n + 1..=2 * n],
                    init[n + 1..=2 * n],
                    "{what}: db untouched"
                );
            }
            let (input2, flat2) = run_device(gpu, &o, &init, want_input, params);
            assert_eq!(bits(gpu, &flat), bits(gpu, &flat2), "{what}: rerun buffer");
            if let (Some(a), Some(b)) = (&input, &input2) {
                assert_eq!(bits(gpu, a), bits(gpu, b), "{what}: rerun input");
            }
        }
    }
}

/// One sample's LayerNorm backward into `flat`'s views, the input gradient copied to `gx`.
fn step<D: Driver>(be: &CudaBackend<D>, o: &[CudaTensor; 6], gx: &CudaTensor, flat: &CudaTensor) {
    let n = o[2].shape()[1];
    let (dw, db) = views(flat, n, [true, true]);
    let input = be
        .layer_norm_backward_into(
            &LayerNormBackward {
                g: &o[0],
                residual: Some(&o[1]),
                x: &o[2],
                mean: &o[3],
                rstd: &o[4],
                weight: Some(&o[5]),
            },
            true,
            dw.as_ref(),
            db.as_ref(),
        )
        .expect("backward")
        .expect("input gradient");
    be.copy_into(&input, gx).expect("copy");
}

/// A captured call replayed with fresh `g` equals it run eagerly, bitwise: a sample's rows
/// (one launch) and a batch's (chunks and their finishing reduction).
pub fn replay_matches_eager<D: Driver>(gpu: &CudaBackend<D>) {
    for rows in [12, 300] {
        replay_matches_eager_rows(gpu, rows);
    }
}

fn replay_matches_eager_rows<D: Driver>(gpu: &CudaBackend<D>, rows: usize) {
    let n = 256;
    let o = operands(gpu, (rows, n), true, true);
    let ops = o.device();
    let bufs = || {
        (
            gpu.zeros(&[rows, n]).unwrap(),
            gpu.zeros(&[2 * n + 2]).unwrap(),
        )
    };
    let captured = bufs();
    let body = {
        let (be, ops, c) = (gpu.clone(), ops.clone(), captured.clone());
        Box::new(move || {
            step(&be, &ops, &c.0, &c.1);
            Ok(())
        })
    };
    let mut graph = gpu.capture(body).expect("capture");
    for r in 0..3u64 {
        let (fresh, _) = pair(gpu, &[rows, n], 40 + r, (-1.0, 1.0), false);
        let fresh = gpu.download(&fresh).unwrap();
        gpu.upload_into(&fresh, &ops[0]).expect("refill");
        gpu.fill(&captured.0, 0.0).expect("reset");
        gpu.fill(&captured.1, 0.5).expect("reset");
        gpu.replay(&mut graph).expect("replay");
        let eager = bufs();
        gpu.fill(&eager.1, 0.5).expect("init");
        step(gpu, &ops, &eager.0, &eager.1);
        assert_eq!(
            bits(gpu, &captured.0),
            bits(gpu, &eager.0),
            "replay {r} input"
        );
        assert_eq!(
            bits(gpu, &captured.1),
            bits(gpu, &eager.1),
            "replay {r} buffer"
        );
    }
}

macro_rules! norm_params_suite {
    ($backend:path) => {
        use super::super::norm_params::{ROWS, WIDTHS};
        use rstest::rstest;

        #[rstest]
        fn layer_norm_backward_into(
            #[values(0, 1, 2, 3, 4, 5, 6)] rows: usize,
            #[values(0, 1, 2, 3, 4, 5)] width: usize,
            #[values(false, true)] residual: bool,
            #[values(false, true)] weight: bool,
        ) {
            super::super::norm_params::parity(
                &$backend(),
                ROWS[rows],
                WIDTHS[width],
                residual,
                weight,
            );
        }

        #[test]
        fn layer_norm_backward_into_replay_matches_eager() {
            super::super::norm_params::replay_matches_eager(&$backend());
        }
    };
}

mod mock_suite {
    norm_params_suite!(super::super::mock);
}

#[cfg(feature = "gpu")]
mod gpu {
    norm_params_suite!(super::super::gpu);
}
