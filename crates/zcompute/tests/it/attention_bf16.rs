//! Attention's core under bf16 products (issue 42: `AttentionOps::qk_norm_attention_mode` and
//! its backward): every operand of `Q·Kᵀ`, `P·V`, `dO·Vᵀ`, `Pᵀ·dO`, `dS·K` and `dSᵀ·Q` rounded
//! to bf16, float32 accumulation, LayerNorm and softmax in float32. The CPU backend's emulation
//! against exact pins (one key: the output is `v` rounded, `dv` is `dO` rounded) and against
//! the composite of the op set with its products under bf16 (`PrecisionOps::matmul_mode`, an
//! independent path through the same roundings), and far from float32; the simulated device's
//! fused kernels bit for bit the CPU (output and qkv's gradient; the parameter gradients are
//! column sums in the device's order, as under float32); with `--features gpu` the CUDA
//! kernels within a stated tolerance of the CPU. Float32 and TF32 under the mode method are the
//! float32 op bit for bit.

use crate::attention::{Case, Results, inputs};
use crate::common::{CPU, rel_err64};
use zcompute::prelude::*;
use zcompute::{Backend, ComputeError, MathMode, QkNorm};

const NAMES: [&str; 6] = [
    "out",
    "g_qkv",
    "g_q_weight",
    "g_q_bias",
    "g_k_weight",
    "g_k_bias",
];

/// Forward and backward under `mode`: the backend's mode ops, or (`composite`) the composite
/// of the op set with its products under the mode.
fn run_mode<B: Ops<f32>>(b: &B, c: Case, mode: MathMode, composite: bool) -> Results {
    let [qkv, qw, qb, kw, kb, g] = inputs(c);
    let up = |v: &[f64], shape: &[usize]| {
        let data: Vec<f32> = v.iter().map(|&x| x as f32).collect();
        b.upload(&data, shape).expect("upload")
    };
    let width = c.heads * c.dh;
    let qkv = up(&qkv, &[c.batch, c.seq, 3 * width]);
    let g = up(&g, &[c.batch, c.seq, width]);
    let params = [&qw, &qb, &kw, &kb].map(|v| up(v, &[c.dh]));
    let norm = QkNorm {
        q_weight: &params[0],
        q_bias: &params[1],
        k_weight: &params[2],
        k_bias: &params[3],
        heads: c.heads,
        eps: 1e-5,
    };
    let (out, grads) = if composite {
        (
            zcompute::attention::composite_forward_mode(b, &qkv, &norm, mode),
            zcompute::attention::composite_backward_mode(b, &g, &qkv, &norm, mode),
        )
    } else {
        (
            b.qk_norm_attention_mode(&qkv, &norm, mode),
            b.qk_norm_attention_backward_mode(&g, &qkv, &norm, mode),
        )
    };
    let (out, grads) = (out.expect("forward"), grads.expect("backward"));
    let down = |t: &zcompute::BTensor<B, f32>| -> Vec<f64> {
        b.download(t)
            .expect("download")
            .into_iter()
            .map(f64::from)
            .collect()
    };
    (
        down(&out),
        [
            down(&grads.qkv),
            down(&grads.q_weight),
            down(&grads.q_bias),
            down(&grads.k_weight),
            down(&grads.k_bias),
        ],
    )
}

/// Per tensor, `‖a − b‖ / ‖b‖`; the k bias gradient (zero up to rounding: softmax cancels a
/// shift of a row's scores) measured against the norm of the k weight gradient instead.
fn errors(a: &Results, b: &Results) -> [f64; 6] {
    let a_all: Vec<&Vec<f64>> = std::iter::once(&a.0).chain(&a.1).collect();
    let b_all: Vec<&Vec<f64>> = std::iter::once(&b.0).chain(&b.1).collect();
    std::array::from_fn(|i| {
        if NAMES[i] == "g_k_bias" {
            let diff = a_all[i]
                .iter()
                .zip(b_all[i])
                .map(|(x, y)| (x - y).powi(2))
                .sum::<f64>()
                .sqrt();
            let scale = b_all[4].iter().map(|v| v * v).sum::<f64>().sqrt();
            diff / scale
        } else {
            rel_err64(a_all[i], b_all[i])
        }
    })
}

/// Six errors, printed in scientific notation.
struct Errs([f64; 6]);

impl std::fmt::LowerExp for Errs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown: Vec<String> = self.0.iter().map(|e| format!("{e:.1e}")).collect();
        write!(f, "[{}]", shown.join(", "))
    }
}

fn bits(r: &Results) -> Vec<u64> {
    std::iter::once(&r.0)
        .chain(&r.1)
        .flat_map(|v| v.iter().map(|x| x.to_bits()))
        .collect()
}

/// The CPU's fused bf16 core against the composite with bf16 products: both round the same
/// float32 values (the same LayerNorm and softmax arithmetic), so only the float32
/// accumulation order differs (measured at most 2.4e-7 per tensor; float32 against bf16 is
/// 1.4e-3 to 5.3e-3).
const CPU_TOL: f64 = 1e-5;

/// The device's bf16 core against the CPU's. The GPU's float32 values before a rounding may
/// differ from the CPU's in the last bits (its own order of the sums, fused multiply-adds,
/// `expf`), and then an operand rounds to the neighbouring bf16 value (2⁻⁸ relative): rare
/// (a value within a float32 ulp or two of a bf16 midpoint, about 2⁻¹⁵ of them) and each
/// moving one term of one sum, so far below bf16's own effect (≥ 1.4e-3 above). 5e-4 leaves
/// that room and still tells a rounded product from a float32 one (also checked: 4x nearer
/// the CPU's bf16 than its float32).
const BF16_TOL: f64 = 5e-4;

/// `ours` within `tol` of the bf16 `reference` per tensor, and each tensor of `ours` farther
/// from `f32` than from the reference by a factor 4 (its operands really rounded).
fn assert_bf16_close(
    c: Case,
    what: &str,
    tol: f64,
    (ours, reference, f32): (&Results, &Results, &Results),
) {
    let near = errors(ours, reference);
    let far = errors(ours, f32);
    for ((name, n), f) in NAMES.iter().zip(near).zip(far) {
        assert!(
            n <= tol,
            "{c:?} {what} {name}: {n:e} from the bf16 reference"
        );
        assert!(
            f > 4.0 * n && f > 1e-4,
            "{c:?} {what} {name}: {f:e} from float32, {n:e} from the bf16 reference"
        );
    }
}

const fn case(batch: usize, seq: usize, heads: usize, dh: usize) -> Case {
    Case {
        batch,
        seq,
        heads,
        dh,
    }
}

/// The CPU's bf16 core against the composite with bf16 products, and far from float32.
#[rstest::rstest]
#[case::xasset(case(3, 12, 4, 64))]
#[case::narrow_heads(case(2, 7, 2, 32))]
#[case::other_width(case(2, 17, 2, 24))]
#[case::long_sequence(case(1, 70, 2, 8))]
fn cpu_bf16_matches_the_composite_with_bf16_products(#[case] c: Case) {
    let fused = run_mode(&CPU, c, MathMode::Bf16, false);
    let composite = run_mode(&CPU, c, MathMode::Bf16, true);
    let f32 = run_mode(&CPU, c, MathMode::F32, false);
    // The measured errors belong in the test's output.
    #[allow(clippy::print_stdout)]
    {
        println!(
            "{c:?}: fused bf16 vs composite bf16 {:.1e}, vs float32 {:.1e}",
            Errs(errors(&fused, &composite)),
            Errs(errors(&fused, &f32))
        );
    }
    assert_bf16_close(c, "CPU", CPU_TOL, (&fused, &composite, &f32));
}

/// One key: softmax gives it probability 1 exactly, so the output is `P·v = v` read as a bf16
/// operand, and `dv = Pᵀ·dO` is `dO` rounded, bit for bit; float32 gives `v` and `dO` as they
/// are (the inputs are not bf16 values, so the two differ).
#[test]
fn one_key_gives_v_and_the_output_gradient_rounded_to_bf16() {
    let c = case(2, 1, 3, 24);
    let [qkv, .., g] = inputs(c);
    let width = c.heads * c.dh;
    let bf16 = |x: f64| f64::from(zdevice::rounding::round_to_bf16(x as f32));
    // qkv rows are [q | k | v], each `width` wide.
    let v: Vec<f64> = qkv
        .chunks_exact(3 * width)
        .flat_map(|row| row[2 * width..].to_vec())
        .collect();
    for (mode, round) in [
        (MathMode::Bf16, &bf16 as &dyn Fn(f64) -> f64),
        (MathMode::F32, &|x: f64| x),
    ] {
        let (out, grads) = run_mode(&CPU, c, mode, false);
        let want: Vec<f64> = v.iter().map(|&x| round(x)).collect();
        assert_eq!(out, want, "{mode:?}: output");
        let dv: Vec<f64> = grads[0]
            .chunks_exact(3 * width)
            .flat_map(|row| row[2 * width..].to_vec())
            .collect();
        let want: Vec<f64> = g.iter().map(|&x| round(x)).collect();
        assert_eq!(dv, want, "{mode:?}: dv");
    }
    assert_ne!(v.iter().map(|&x| bf16(x)).collect::<Vec<_>>(), v);
}

/// Float32 and TF32 under the mode methods are the float32 op bit for bit (no TF32 form of
/// the fused core: float32 is within TF32's error, which the mode allows).
#[rstest::rstest]
#[case::f32(MathMode::F32)]
#[case::tf32(MathMode::Tf32)]
fn f32_and_tf32_are_the_float32_op(#[case] mode: MathMode) {
    let c = case(3, 12, 4, 64);
    let plain = crate::attention::run::<_, f32>(&CPU, c, false);
    assert!(bits(&run_mode(&CPU, c, mode, false)) == bits(&plain), "CPU");
    let gpu = crate::cuda::mock();
    let plain = crate::attention::run::<_, f32>(&gpu, c, false);
    assert!(
        bits(&run_mode(&gpu, c, mode, false)) == bits(&plain),
        "simulated device"
    );
}

/// f64 elements have no bf16 products: refused with a typed error, never run in float64.
#[test]
fn f64_refuses_bf16() {
    let t = |shape: &[usize]| Backend::<f64>::zeros(&CPU, shape).expect("zeros");
    let (qkv, g, p) = (t(&[1, 2, 24]), t(&[1, 2, 8]), t(&[4]));
    let norm = QkNorm {
        q_weight: &p,
        q_bias: &p,
        k_weight: &p,
        k_bias: &p,
        heads: 2,
        eps: 1e-5,
    };
    let refused = |e: Option<ComputeError>| {
        matches!(
            e,
            Some(ComputeError::MathModeUnsupported { mode: "bf16", .. })
        )
    };
    assert!(refused(
        CPU.qk_norm_attention_mode(&qkv, &norm, MathMode::Bf16)
            .err()
    ));
    assert!(refused(
        CPU.qk_norm_attention_backward_mode(&g, &qkv, &norm, MathMode::Bf16)
            .err()
    ));
    assert!(refused(
        CPU.qk_norm_attention_backward_into_mode(&g, &qkv, &norm, [None; 4], MathMode::Bf16)
            .err()
    ));
    assert!(
        CPU.qk_norm_attention_mode(&qkv, &norm, MathMode::F32)
            .is_ok()
    );
}

/// The device's bf16 core against the CPU's: within [`BF16_TOL`] per tensor and far from
/// float32; where `exact` (the simulator running its fused kernels, whose twins are the CPU's
/// code) the output and qkv's gradient bit for bit.
pub fn device_matches_cpu<B: Ops<f32>>(gpu: &B, c: Case, exact: bool) {
    let device = run_mode(gpu, c, MathMode::Bf16, false);
    let cpu = run_mode(&CPU, c, MathMode::Bf16, false);
    if exact {
        // The kernels' own outputs: the output and qkv's gradient (the parameter gradients are
        // the device's column sums of the kernel's partials, in its own order, as in float32).
        let kernel_bits =
            |r: &Results| -> Vec<u64> { r.0.iter().chain(&r.1[0]).map(|x| x.to_bits()).collect() };
        let differ = kernel_bits(&device)
            .iter()
            .zip(kernel_bits(&cpu))
            .filter(|(d, c)| **d != *c)
            .count();
        assert_eq!(
            differ, 0,
            "{c:?}: values where the device and the CPU differ"
        );
    }
    let f32 = run_mode(&CPU, c, MathMode::F32, false);
    assert_bf16_close(c, "device", BF16_TOL, (&device, &cpu, &f32));
}

macro_rules! bf16_suite {
    ($backend:path, $exact:expr) => {
        use super::{case, device_matches_cpu};

        /// The short kernels (heads of 64 and 32, one warp a row and four warps a block),
        /// attention.cu's kernel (another head width, a longer sequence). (On the CPU the
        /// composite with bf16 products gives the fused core's output and qkv gradient bits, so
        /// a composite backward on the simulator is exact too.)
        #[rstest::rstest]
        #[case::xasset(case(3, 12, 4, 64))]
        #[case::xasset_many_heads(case(160, 12, 4, 64))]
        #[case::narrow_heads(case(2, 7, 2, 32))]
        #[case::general_kernel(case(2, 17, 2, 24))]
        // attention.cu's forward; its backward's shared memory does not fit: the composite's.
        #[case::general_forward_composite_backward(case(1, 40, 1, 64))]
        fn fused_bf16_matches_the_cpu(#[case] c: crate::attention::Case) {
            device_matches_cpu(&$backend(), c, $exact);
        }

        /// A shape the fused kernels do not take: the composite with bf16 products (cuBLAS
        /// under bf16 on the GPU, its emulation on the simulator), within the tolerance.
        #[test]
        fn composite_bf16_matches_the_cpu() {
            device_matches_cpu(&$backend(), case(1, 70, 2, 8), false);
        }
    };
}

mod mock_suite {
    bf16_suite!(super::super::cuda::mock, true);
}

#[cfg(feature = "gpu")]
mod gpu_suite {
    bf16_suite!(super::super::cuda::gpu, false);
}
