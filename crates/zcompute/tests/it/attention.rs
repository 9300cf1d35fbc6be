//! Attention's core (`AttentionOps::qk_norm_attention` and its backward): the CPU reference in f64
//! against the composite of the op set; f32 on the CPU and on the CUDA backend (outputs
//! poisoned with NaN, fused kernels and composite fallback) against the f64 reference at many
//! shapes; typed errors alike on every backend; two runs bitwise equal.

use crate::common::{CPU, TOL, rel_err, rel_err64, uniform};
use zcompute::prelude::*;
use zcompute::{Backend, ComputeError, CudaBackend, Driver, Element, QkNorm};

/// A shape of attention's core: `qkv [batch, seq, 3 * heads * dh]`.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub batch: usize,
    pub seq: usize,
    pub heads: usize,
    pub dh: usize,
}

impl Case {
    fn width(self) -> usize {
        self.heads * self.dh
    }
}

/// Forward output, then the gradients of qkv, q weight, q bias, k weight, k bias.
pub type Results = (Vec<f64>, [Vec<f64>; 5]);

/// f32-representable inputs (so the f64 reference sees exactly what f32 runs see): qkv, the
/// four parameters, the output gradient.
pub fn inputs(c: Case) -> [Vec<f64>; 6] {
    let round = |v: Vec<f64>| -> Vec<f64> { v.iter().map(|&x| f64::from(x as f32)).collect() };
    let seed = (c.batch * 1000 + c.seq * 100 + c.heads * 10 + c.dh) as u64;
    let (rows, dh) = (c.batch * c.seq, c.dh);
    [
        round(uniform(rows * 3 * c.width(), seed, -2.0, 2.0)),
        round(uniform(dh, seed + 1, 0.5, 1.5)),
        round(uniform(dh, seed + 2, -0.5, 0.5)),
        round(uniform(dh, seed + 3, 0.5, 1.5)),
        round(uniform(dh, seed + 4, -0.5, 0.5)),
        round(uniform(rows * c.width(), seed + 5, -1.0, 1.0)),
    ]
}

/// Forward and backward on `b` (fused where the backend fuses), or through the composite.
pub fn run<B: Ops<T>, T: Element>(b: &B, c: Case, composite: bool) -> Results {
    let [qkv, qw, qb, kw, kb, g] = inputs(c);
    let up = |v: &[f64], shape: &[usize]| {
        let data: Vec<T> = v.iter().map(|&x| T::from_f64(x)).collect();
        b.upload(&data, shape).expect("upload")
    };
    let qkv = up(&qkv, &[c.batch, c.seq, 3 * c.width()]);
    let g = up(&g, &[c.batch, c.seq, c.width()]);
    let params = [&qw, &qb, &kw, &kb].map(|v| up(v, &[c.dh]));
    let norm = QkNorm {
        q_weight: &params[0],
        q_bias: &params[1],
        k_weight: &params[2],
        k_bias: &params[3],
        heads: c.heads,
        eps: T::from_f64(1e-5),
    };
    let (out, grads) = if composite {
        (
            zcompute::attention::composite_forward(b, &qkv, &norm),
            zcompute::attention::composite_backward(b, &g, &qkv, &norm),
        )
    } else {
        (
            b.qk_norm_attention(&qkv, &norm),
            b.qk_norm_attention_backward(&g, &qkv, &norm),
        )
    };
    let (out, grads) = (out.expect("forward"), grads.expect("backward"));
    let down = |t: &zcompute::BTensor<B, T>| -> Vec<f64> {
        b.download(t)
            .expect("download")
            .into_iter()
            .map(Element::to_f64)
            .collect()
    };
    assert_eq!(grads.qkv.shape(), qkv.shape(), "g_qkv shape");
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

const NAMES: [&str; 6] = [
    "out",
    "g_qkv",
    "g_q_weight",
    "g_q_bias",
    "g_k_weight",
    "g_k_bias",
];

/// Asserts f32 results within `TOL` of the f64 reference, per tensor (NaN fails).
pub fn assert_f32_close(c: Case, ours: &Results, reference: &Results) {
    let ours = std::iter::once(&ours.0).chain(&ours.1);
    let reference = std::iter::once(&reference.0).chain(&reference.1);
    for ((name, o), r) in NAMES.iter().zip(ours).zip(reference) {
        let o32: Vec<f32> = o.iter().map(|&v| v as f32).collect();
        // The k bias gradient is zero up to rounding (softmax cancels a shift of every score
        // of a row): measured against the scale of the k weight gradient instead.
        let err = if *name == "g_k_bias" {
            o.iter().map(|v| v.abs()).fold(0.0, f64::max)
        } else {
            rel_err(&o32, r)
        };
        assert!(
            err <= TOL,
            "{c:?} {name}: relative error {err:e} (f32 vs f64)"
        );
    }
}

pub fn parity<D: Driver>(gpu: &CudaBackend<D>, c: Case) {
    let reference = run::<_, f64>(&CPU, c, false);
    let device = run::<_, f32>(gpu, c, false);
    assert_f32_close(c, &device, &reference);
}

pub fn deterministic<D: Driver>(gpu: &CudaBackend<D>, c: Case) {
    let first = run::<_, f32>(gpu, c, false);
    let second = run::<_, f32>(gpu, c, false);
    let bits = |r: &Results| -> Vec<u64> {
        std::iter::once(&r.0)
            .chain(&r.1)
            .flat_map(|v| v.iter().map(|x| x.to_bits()))
            .collect()
    };
    assert_eq!(bits(&first), bits(&second), "{c:?}: two runs differ");
}

/// Forward and backward of the core into preallocated outputs (out, g_qkv, then the four
/// parameter gradients): the body a capture records.
fn core_into<B: Ops<f32>>(
    b: &B,
    qkv: &zcompute::BTensor<B, f32>,
    g: &zcompute::BTensor<B, f32>,
    params: &[zcompute::BTensor<B, f32>; 4],
    heads: usize,
    outs: &[zcompute::BTensor<B, f32>; 6],
) -> zcompute::Result<()> {
    let norm = QkNorm {
        q_weight: &params[0],
        q_bias: &params[1],
        k_weight: &params[2],
        k_bias: &params[3],
        heads,
        eps: 1e-5,
    };
    let out = b.qk_norm_attention(qkv, &norm)?;
    let r = b.qk_norm_attention_backward(g, qkv, &norm)?;
    let results = [out, r.qkv, r.q_weight, r.q_bias, r.k_weight, r.k_bias];
    for (t, dst) in results.iter().zip(outs) {
        b.copy_into(t, dst)?;
    }
    Ok(())
}

/// A captured forward+backward, replayed with fresh qkv and g, equals the eager run on the
/// same inputs bit for bit.
pub fn captured_equals_eager<D: Driver>(gpu: &CudaBackend<D>, c: Case) {
    use zcompute::Capture;
    let [qkv0, qw, qb, kw, kb, g0] = inputs(c);
    let f32s = |v: &[f64]| -> Vec<f32> { v.iter().map(|&x| x as f32).collect() };
    let up = |v: &[f64], shape: &[usize]| gpu.upload(&f32s(v), shape).expect("upload");
    let (qkv_shape, out_shape) = ([c.batch, c.seq, 3 * c.width()], [c.batch, c.seq, c.width()]);
    let qkv = up(&qkv0, &qkv_shape);
    let g = up(&g0, &out_shape);
    let params = [&qw, &qb, &kw, &kb].map(|v| up(v, &[c.dh]));
    let shapes: [&[usize]; 6] = [&out_shape, &qkv_shape, &[c.dh], &[c.dh], &[c.dh], &[c.dh]];
    let outs = shapes.map(|s| gpu.zeros(s).expect("output"));
    let eager_outs = shapes.map(|s| gpu.zeros(s).expect("output"));
    let body = {
        let (be, qkv, g, params, outs) = (
            gpu.clone(),
            qkv.clone(),
            g.clone(),
            params.clone(),
            outs.clone(),
        );
        Box::new(move || core_into(&be, &qkv, &g, &params, c.heads, &outs))
    };
    let mut graph = gpu.capture(body).expect("capture");
    for r in 0..2u64 {
        let fresh = |n: usize, seed: u64| f32s(&uniform(n, seed, -2.0, 2.0));
        gpu.upload_into(&fresh(qkv0.len(), 500 + r), &qkv)
            .expect("qkv");
        gpu.upload_into(&fresh(g0.len(), 600 + r), &g).expect("g");
        gpu.replay(&mut graph).expect("replay");
        core_into(gpu, &qkv, &g, &params, c.heads, &eager_outs).expect("eager");
        for (i, (cap, eager)) in outs.iter().zip(&eager_outs).enumerate() {
            let (cap, eager) = (gpu.download(cap).unwrap(), gpu.download(eager).unwrap());
            assert!(
                cap.iter().all(|v| v.is_finite()),
                "{c:?} output {i}: not finite"
            );
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&cap), bits(&eager), "{c:?} replay {r} output {i}");
        }
    }
}

/// qkv shape, heads, k weight width, g shape, the error expected.
type ErrorRow = (
    &'static [usize],
    usize,
    usize,
    &'static [usize],
    &'static str,
);

/// Bad arguments give the same typed error on the CPU and on `gpu`.
pub fn errors<D: Driver>(gpu: &CudaBackend<D>) {
    fn first_error<B: Ops<f32>>(
        b: &B,
        qkv: &[usize],
        heads: usize,
        param: usize,
        g: &[usize],
    ) -> String {
        let t = |shape: &[usize]| b.zeros(shape).expect("zeros");
        let (qkv, g, p, dh4) = (t(qkv), t(g), t(&[param]), t(&[4]));
        let norm = QkNorm {
            q_weight: &dh4,
            q_bias: &dh4,
            k_weight: &p,
            k_bias: &dh4,
            heads,
            eps: 1e-5,
        };
        let fwd = b.qk_norm_attention(&qkv, &norm).err();
        let bwd = b.qk_norm_attention_backward(&g, &qkv, &norm).err();
        let show = |e: Option<ComputeError>| e.map_or("ok".to_string(), |e| format!("{e:?}"));
        format!("{} | {}", show(fwd), show(bwd))
    }
    let table: [ErrorRow; 6] = [
        (&[2, 3, 24], 2, 4, &[2, 3, 8], "ok"),
        (&[3, 24], 2, 4, &[3, 8], "RankTooLow"),
        (&[2, 3, 25], 2, 4, &[2, 3, 8], "ShapeMismatch"),
        (&[2, 3, 24], 3, 4, &[2, 3, 8], "InvalidScalar"),
        (&[2, 3, 24], 2, 5, &[2, 3, 8], "ShapeMismatch"),
        (&[2, 3, 24], 2, 4, &[2, 4, 8], "ShapeMismatch"),
    ];
    for (qkv, heads, param, g, want) in table {
        let cpu = first_error(&CPU, qkv, heads, param, g);
        let dev = first_error(gpu, qkv, heads, param, g);
        assert_eq!(cpu, dev, "{qkv:?} heads {heads}: CPU and device differ");
        assert!(cpu.contains(want), "{qkv:?} heads {heads}: {cpu}");
    }
    // Only the backward's g is wrong in the last row: the forward is fine.
    let last = first_error(&CPU, &[2, 3, 24], 2, 4, &[2, 4, 8]);
    assert!(last.starts_with("ok | ShapeMismatch"), "{last}");
}

macro_rules! attention_suite {
    ($backend:path) => {
        use super::{Case, deterministic, errors, parity};
        use rstest::rstest;

        #[rstest]
        fn fused_parity(
            #[values(1, 3, 12, 17)] seq: usize,
            #[values(64, 32, 24, 5)] dh: usize,
            #[values(1, 4)] heads: usize,
            #[values(1, 3)] batch: usize,
        ) {
            parity(
                &$backend(),
                Case {
                    batch,
                    seq,
                    heads,
                    dh,
                },
            );
        }

        /// Enough (batch, head) pairs that the short kernels run several rows a warp (4 warps a
        /// block from 512 pairs), at both head widths they take, and a sequence at their limit.
        #[rstest]
        #[case::xasset_batch(160, 12, 4, 64)]
        #[case::narrow_heads(130, 7, 4, 32)]
        #[case::longest_short(40, 16, 16, 64)]
        fn many_heads_parity(
            #[case] batch: usize,
            #[case] seq: usize,
            #[case] heads: usize,
            #[case] dh: usize,
        ) {
            parity(
                &$backend(),
                Case {
                    batch,
                    seq,
                    heads,
                    dh,
                },
            );
        }

        /// Shapes the fused kernels do not take (a long sequence, a wide head, a backward
        /// whose shared memory does not fit): the composite runs, with the same results.
        #[rstest]
        #[case::long_sequence(1, 70, 2, 8)]
        #[case::wide_head(2, 2, 1, 260)]
        #[case::fused_forward_composite_backward(1, 64, 2, 64)]
        #[case::empty_batch(0, 3, 2, 4)]
        fn fallback_parity(
            #[case] batch: usize,
            #[case] seq: usize,
            #[case] heads: usize,
            #[case] dh: usize,
        ) {
            parity(
                &$backend(),
                Case {
                    batch,
                    seq,
                    heads,
                    dh,
                },
            );
        }

        #[rstest]
        #[case::xasset(3, 12, 4, 64)]
        #[case::xasset_batch(160, 12, 4, 64)]
        #[case::odd(2, 17, 1, 5)]
        fn two_runs_bitwise_equal(
            #[case] batch: usize,
            #[case] seq: usize,
            #[case] heads: usize,
            #[case] dh: usize,
        ) {
            deterministic(
                &$backend(),
                Case {
                    batch,
                    seq,
                    heads,
                    dh,
                },
            );
        }

        #[rstest]
        #[case::fused(3, 12, 4, 64)]
        #[case::fused_many_heads(160, 12, 4, 64)]
        #[case::general_kernel(2, 17, 2, 24)]
        #[case::composite(1, 70, 2, 8)]
        fn captured_equals_eager(
            #[case] batch: usize,
            #[case] seq: usize,
            #[case] heads: usize,
            #[case] dh: usize,
        ) {
            super::captured_equals_eager(
                &$backend(),
                Case {
                    batch,
                    seq,
                    heads,
                    dh,
                },
            );
        }

        #[test]
        fn typed_errors() {
            errors(&$backend());
        }
    };
}

/// The f64 reference (per head, as the kernels) against the composite of the op set.
#[rstest::rstest]
#[case(1, 1, 1, 5)]
#[case(3, 12, 4, 64)]
#[case(2, 17, 4, 24)]
#[case(1, 70, 2, 8)]
fn reference_matches_composite(
    #[case] batch: usize,
    #[case] seq: usize,
    #[case] heads: usize,
    #[case] dh: usize,
) {
    let c = Case {
        batch,
        seq,
        heads,
        dh,
    };
    let direct = run::<_, f64>(&CPU, c, false);
    let composite = run::<_, f64>(&CPU, c, true);
    let pairs = std::iter::once((&direct.0, &composite.0)).chain(direct.1.iter().zip(&composite.1));
    for (name, (d, m)) in NAMES.iter().zip(pairs) {
        let err = if *name == "g_k_bias" {
            d.iter().chain(m).map(|v| v.abs()).fold(0.0, f64::max)
        } else {
            rel_err64(d, m)
        };
        assert!(err <= 1e-12, "{c:?} {name}: {err:e}");
    }
}

#[rstest::rstest]
#[case(3, 12, 4, 64)]
#[case(2, 17, 1, 5)]
fn cpu_f32_matches_f64(
    #[case] batch: usize,
    #[case] seq: usize,
    #[case] heads: usize,
    #[case] dh: usize,
) {
    let c = Case {
        batch,
        seq,
        heads,
        dh,
    };
    assert_f32_close(
        c,
        &run::<_, f32>(&CPU, c, false),
        &run::<_, f64>(&CPU, c, false),
    );
}

/// On the simulated device the fused shapes take the fused kernels (one launch forward; the
/// backward kernel and the partials' column reduction), the others the composite.
#[test]
#[allow(clippy::print_stdout)] // the counts belong in the test's output (reported)
fn fused_kernels_are_taken_on_the_simulator() {
    let gpu = crate::cuda::mock();
    let launches = |c: Case, composite: bool| -> usize {
        let sim = gpu.device().driver();
        sim.clear_op_log();
        let _ = run::<_, f32>(&gpu, c, composite);
        let is_launch = |r: &&zdevice::sim::OpRecord| {
            r.call == zdevice::sim::calls::LAUNCH_KERNEL
                || r.call == zdevice::sim::calls::GEMM_STRIDED_BATCHED
        };
        sim.op_log().iter().filter(is_launch).count()
    };
    let xasset = Case {
        batch: 3,
        seq: 12,
        heads: 4,
        dh: 64,
    };
    let (fused, before) = (launches(xasset, false), launches(xasset, true));
    println!(
        "attention core forward+backward {xasset:?}: composite {before} launches, fused {fused}"
    );
    assert_eq!(fused, 2 + 1, "forward 1, backward 1 + one column reduction");
    let composite = launches(
        Case {
            batch: 1,
            seq: 70,
            heads: 2,
            dh: 8,
        },
        false,
    );
    assert!(composite > 10, "composite launches {composite}");
}

mod mock_suite {
    attention_suite!(super::super::cuda::mock);
}

#[cfg(feature = "gpu")]
mod gpu_suite {
    attention_suite!(super::super::cuda::gpu);
}
