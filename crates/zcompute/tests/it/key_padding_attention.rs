//! Scaled dot-product attention with a key-padding mask (`AttentionOps::key_padding_attention`
//! and its backward): the fused CPU pass in f64 against the composite of the op set; f32 on the
//! CPU and the CUDA backend (fused kernels and composite fallback) against the f64 reference;
//! fused equals composite within f32 rounding; all-padding rows are zeros with zero
//! gradients, never NaN; no mask equals an all-ones mask; per-sample equals batched; two runs
//! and a captured replay bitwise equal to eager; typed errors alike on every backend. The
//! PyTorch float64 oracle of the op runs through `Tape::masked_attention` in zgrad's
//! `model_ops::oracle` (tests/fixtures/make_ops.py).

use crate::common::{CPU, TOL, rel_err, rel_err64, uniform};
use zcompute::attention::{key_padding_composite_backward, key_padding_composite_forward};
use zcompute::prelude::*;
use zcompute::{BTensor, Backend, CudaBackend, Driver, Element, KeyPaddingAttention};

/// A shape: `q [batch, q_len, dk]`, `k [batch, k_len, dk]`, `v [batch, k_len, dv]`, and which
/// mask (`Mask::None`: no mask).
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub batch: usize,
    pub q_len: usize,
    pub k_len: usize,
    pub dk: usize,
    pub dv: usize,
    pub mask: Mask,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mask {
    /// No mask argument.
    None,
    /// Every key kept (the mask given, all ones).
    AllKept,
    /// Sample `b` keeps its first `k_len - b` keys, and sample 1 keeps none (all padding).
    Padded,
}

fn case(batch: usize, q_len: usize, k_len: usize, dk: usize, dv: usize, mask: Mask) -> Case {
    Case {
        batch,
        q_len,
        k_len,
        dk,
        dv,
        mask,
    }
}

/// The output, then the gradients of q, k and v.
pub type Results = [Vec<f64>; 4];

/// The mask's values `[batch, k_len]`, if there is one.
fn mask_values(c: Case) -> Option<Vec<f64>> {
    let kept = |b: usize, j: usize| match c.mask {
        Mask::Padded => b != 1 && j + b < c.k_len,
        _ => true,
    };
    (c.mask != Mask::None).then(|| {
        (0..c.batch * c.k_len)
            .map(|i| f64::from(u8::from(kept(i / c.k_len.max(1), i % c.k_len.max(1)))))
            .collect()
    })
}

/// f32-representable inputs (the f64 reference sees exactly what f32 runs see): q, k, v, g.
fn inputs(c: Case) -> [Vec<f64>; 4] {
    let round = |v: Vec<f64>| -> Vec<f64> { v.iter().map(|&x| f64::from(x as f32)).collect() };
    let seed = (c.batch * 10000 + c.q_len * 1000 + c.k_len * 100 + c.dk * 10 + c.dv) as u64;
    [
        round(uniform(c.batch * c.q_len * c.dk, seed, -2.0, 2.0)),
        round(uniform(c.batch * c.k_len * c.dk, seed + 1, -2.0, 2.0)),
        round(uniform(c.batch * c.k_len * c.dv, seed + 2, -1.0, 1.0)),
        round(uniform(c.batch * c.q_len * c.dv, seed + 3, -1.0, 1.0)),
    ]
}

fn upload<B: Backend<T>, T: Element>(b: &B, v: &[f64], shape: &[usize]) -> BTensor<B, T> {
    let data: Vec<T> = v.iter().map(|&x| T::from_f64(x)).collect();
    b.upload(&data, shape).expect("upload")
}

fn down<B: Backend<T>, T: Element>(b: &B, t: &BTensor<B, T>) -> Vec<f64> {
    b.download(t)
        .expect("download")
        .into_iter()
        .map(Element::to_f64)
        .collect()
}

/// Forward and backward on `b` (fused where the backend fuses), or through the composite.
pub fn run<B: Ops<T>, T: Element>(b: &B, c: Case, composite: bool) -> Results {
    let [q, k, v, g] = inputs(c);
    let q = upload(b, &q, &[c.batch, c.q_len, c.dk]);
    let k = upload(b, &k, &[c.batch, c.k_len, c.dk]);
    let v = upload(b, &v, &[c.batch, c.k_len, c.dv]);
    let g = upload(b, &g, &[c.batch, c.q_len, c.dv]);
    let keep = mask_values(c).map(|m| upload(b, &m, &[c.batch, c.k_len]));
    let (keep, scale) = (keep.as_ref(), T::from_f64(1.0 / (c.dk as f64).sqrt()));
    let (out, grads) = if composite {
        (
            key_padding_composite_forward(b, &q, &k, &v, keep, scale),
            key_padding_composite_backward(b, &g, &q, &k, &v, keep, scale),
        )
    } else {
        (
            b.key_padding_attention(&KeyPaddingAttention {
                q: &q,
                k: &k,
                v: &v,
                key_keep: keep,
                scale,
            }),
            b.key_padding_attention_backward(
                &g,
                &KeyPaddingAttention {
                    q: &q,
                    k: &k,
                    v: &v,
                    key_keep: keep,
                    scale,
                },
            ),
        )
    };
    let (out, r) = (out.expect("forward"), grads.expect("backward"));
    assert_eq!(r.q.shape(), q.shape(), "dq shape");
    assert_eq!(r.k.shape(), k.shape(), "dk shape");
    assert_eq!(r.v.shape(), v.shape(), "dv shape");
    [down(b, &out), down(b, &r.q), down(b, &r.k), down(b, &r.v)]
}

const NAMES: [&str; 4] = ["out", "dq", "dk", "dv"];

/// Every value finite, and within `tol` (relative, per tensor) of `reference`.
pub fn assert_close(c: Case, ours: &Results, reference: &Results, tol: f64) {
    for ((name, o), r) in NAMES.iter().zip(ours).zip(reference) {
        assert!(o.iter().all(|v| v.is_finite()), "{c:?} {name}: not finite");
        let o32: Vec<f32> = o.iter().map(|&v| v as f32).collect();
        let err = rel_err(&o32, r);
        assert!(err <= tol, "{c:?} {name}: relative error {err:e}");
    }
}

/// The fused run on `b` in f32 against the CPU's fused pass in f64.
pub fn parity<B: Ops<f32>>(b: &B, c: Case) {
    assert_close(
        c,
        &run::<_, f32>(b, c, false),
        &run::<_, f64>(&CPU, c, false),
        TOL,
    );
}

/// Fused and composite in f32 on one backend agree within f32 rounding.
pub fn fused_equals_composite<B: Ops<f32>>(b: &B, c: Case) {
    let composite = run::<_, f32>(b, c, true);
    assert_close(c, &run::<_, f32>(b, c, false), &composite, TOL);
}

/// A sample whose keys are all padding: zeros out, zero gradients of its q (and of every padded
/// key's k and v), on the fused path and the composite alike.
pub fn all_padding_rows_are_zero<B: Ops<f32>>(b: &B) {
    let c = case(3, 4, 5, 8, 6, Mask::Padded);
    for composite in [false, true] {
        let r = run::<_, f32>(b, c, composite);
        let sample1 = |v: &[f64], per: usize| v[per..2 * per].to_vec();
        for (name, v, per) in [
            ("out", &r[0], c.q_len * c.dv),
            ("dq", &r[1], c.q_len * c.dk),
            ("dk", &r[2], c.k_len * c.dk),
            ("dv", &r[3], c.k_len * c.dv),
        ] {
            assert!(v.iter().all(|x| x.is_finite()), "{name}: not finite");
            assert!(
                sample1(v, per).iter().all(|&x| x == 0.0),
                "composite {composite}: {name} of the all-padding sample is not 0"
            );
        }
        // Sample 2 pads its last two keys: their dk and dv rows are 0.
        let row = |v: &[f64], j: usize, w: usize| v[(2 * c.k_len + j) * w..][..w].to_vec();
        for j in [3, 4] {
            assert!(row(&r[2], j, c.dk).iter().all(|&x| x == 0.0), "dk key {j}");
            assert!(row(&r[3], j, c.dv).iter().all(|&x| x == 0.0), "dv key {j}");
        }
    }
}

/// No mask and an all-ones mask give the same bits (the kernels' null mask pointer).
pub fn no_mask_equals_all_kept<B: Ops<f32>>(b: &B) {
    let none = run::<_, f32>(b, case(2, 5, 7, 8, 4, Mask::None), false);
    let ones = run::<_, f32>(b, case(2, 5, 7, 8, 4, Mask::AllKept), false);
    let bits = |r: &Results| -> Vec<u64> { r.iter().flatten().map(|x| x.to_bits()).collect() };
    assert_eq!(bits(&none), bits(&ones));
}

/// Each sample alone equals its slice of the batched run, bit for bit (one pass per row).
pub fn per_sample_equals_batched<B: Ops<f32>>(b: &B) {
    let c = case(3, 4, 5, 8, 6, Mask::Padded);
    let [q, k, v, g] = inputs(c);
    let keep = mask_values(c).expect("mask");
    let (sq, sk, dk, dv) = (c.q_len, c.k_len, c.dk, c.dv);
    let batched = |x: &[f64], n: usize, w: usize| upload::<_, f32>(b, x, &[c.batch, n, w]);
    let scale = 1.0 / (dk as f32).sqrt();
    let whole = {
        let keep = upload(b, &keep, &[c.batch, sk]);
        let (q, k, v, g) = (
            batched(&q, sq, dk),
            batched(&k, sk, dk),
            batched(&v, sk, dv),
            batched(&g, sq, dv),
        );
        let out = b
            .key_padding_attention(&KeyPaddingAttention {
                q: &q,
                k: &k,
                v: &v,
                key_keep: Some(&keep),
                scale,
            })
            .unwrap();
        let r = b
            .key_padding_attention_backward(
                &g,
                &KeyPaddingAttention {
                    q: &q,
                    k: &k,
                    v: &v,
                    key_keep: Some(&keep),
                    scale,
                },
            )
            .unwrap();
        [down(b, &out), down(b, &r.q), down(b, &r.k), down(b, &r.v)]
    };
    for s in 0..c.batch {
        let one = |x: &[f64], n: usize, w: usize| {
            upload::<_, f32>(b, &x[s * n * w..][..n * w], &[1, n, w])
        };
        let (q1, k1, v1, g1) = (
            one(&q, sq, dk),
            one(&k, sk, dk),
            one(&v, sk, dv),
            one(&g, sq, dv),
        );
        let m1 = one(&keep, 1, sk).reshape(&[1, sk]).unwrap();
        let out = b
            .key_padding_attention(&KeyPaddingAttention {
                q: &q1,
                k: &k1,
                v: &v1,
                key_keep: Some(&m1),
                scale,
            })
            .unwrap();
        let r = b
            .key_padding_attention_backward(
                &g1,
                &KeyPaddingAttention {
                    q: &q1,
                    k: &k1,
                    v: &v1,
                    key_keep: Some(&m1),
                    scale,
                },
            )
            .unwrap();
        let alone = [down(b, &out), down(b, &r.q), down(b, &r.k), down(b, &r.v)];
        for (i, (name, w)) in NAMES
            .iter()
            .zip([sq * dv, sq * dk, sk * dk, sk * dv])
            .enumerate()
        {
            assert_eq!(alone[i], whole[i][s * w..][..w], "sample {s} {name}");
        }
    }
}

pub fn deterministic<B: Ops<f32>>(b: &B, c: Case) {
    let bits = |r: &Results| -> Vec<u64> { r.iter().flatten().map(|x| x.to_bits()).collect() };
    assert_eq!(
        bits(&run::<_, f32>(b, c, false)),
        bits(&run::<_, f32>(b, c, false)),
        "{c:?}: two runs differ"
    );
}

/// Forward and backward into preallocated outputs (out, dq, dk, dv): the body a capture records.
fn into<B: Ops<f32>>(
    b: &B,
    qkvg: &[BTensor<B, f32>; 4],
    keep: &BTensor<B, f32>,
    outs: &[BTensor<B, f32>; 4],
) -> zcompute::Result<()> {
    let [q, k, v, g] = qkvg;
    let scale = 0.25;
    let out = b.key_padding_attention(&KeyPaddingAttention {
        q,
        k,
        v,
        key_keep: Some(keep),
        scale,
    })?;
    let r = b.key_padding_attention_backward(
        g,
        &KeyPaddingAttention {
            q,
            k,
            v,
            key_keep: Some(keep),
            scale,
        },
    )?;
    for (t, dst) in [out, r.q, r.k, r.v].iter().zip(outs) {
        b.copy_into(t, dst)?;
    }
    Ok(())
}

/// A captured forward+backward, replayed with fresh q, k, v, g and mask, equals the eager run
/// on the same inputs bit for bit.
pub fn captured_equals_eager<D: Driver>(gpu: &CudaBackend<D>, c: Case) {
    use zcompute::Capture;
    let f32s = |v: &[f64]| -> Vec<f32> { v.iter().map(|&x| x as f32).collect() };
    let shapes = [
        [c.batch, c.q_len, c.dk],
        [c.batch, c.k_len, c.dk],
        [c.batch, c.k_len, c.dv],
        [c.batch, c.q_len, c.dv],
    ];
    let ins = shapes.map(|s| gpu.zeros(&s).expect("input"));
    let keep = gpu.zeros(&[c.batch, c.k_len]).expect("mask");
    let out_shapes = [shapes[3], shapes[0], shapes[1], shapes[2]];
    let outs = out_shapes.map(|s| gpu.zeros(&s).expect("output"));
    let eager_outs = out_shapes.map(|s| gpu.zeros(&s).expect("output"));
    let body = {
        let (be, ins, keep, outs) = (gpu.clone(), ins.clone(), keep.clone(), outs.clone());
        Box::new(move || into(&be, &ins, &keep, &outs))
    };
    let mut graph = gpu.capture(body).expect("capture");
    for r in 0..2u64 {
        for (i, t) in ins.iter().enumerate() {
            let n = t.shape().iter().product();
            gpu.upload_into(&f32s(&uniform(n, 700 + 10 * r + i as u64, -2.0, 2.0)), t)
                .expect("input");
        }
        let mask: Vec<f32> = (0..c.batch * c.k_len)
            .map(|i| {
                f32::from(u8::from(
                    !(i as u64 + r).is_multiple_of(3) && i / c.k_len != 1,
                ))
            })
            .collect();
        gpu.upload_into(&mask, &keep).expect("mask");
        gpu.replay(&mut graph).expect("replay");
        into(gpu, &ins, &keep, &eager_outs).expect("eager");
        for (i, (cap, eager)) in outs.iter().zip(&eager_outs).enumerate() {
            let (cap, eager) = (gpu.download(cap).unwrap(), gpu.download(eager).unwrap());
            assert!(cap.iter().all(|v| v.is_finite()), "{c:?} output {i}");
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&cap), bits(&eager), "{c:?} replay {r} output {i}");
        }
    }
}

/// Bad arguments give the same typed error on the CPU and on `b`.
pub fn errors<B: Ops<f32>>(b: &B) {
    fn first_error<B: Ops<f32>>(b: &B, shapes: [&[usize]; 5]) -> String {
        let t = |s: &[usize]| b.zeros(s).expect("zeros");
        let [q, k, v, keep, g] = shapes.map(t);
        let fwd = b.key_padding_attention(&KeyPaddingAttention {
            q: &q,
            k: &k,
            v: &v,
            key_keep: Some(&keep),
            scale: 0.5,
        });
        let bwd = b.key_padding_attention_backward(
            &g,
            &KeyPaddingAttention {
                q: &q,
                k: &k,
                v: &v,
                key_keep: Some(&keep),
                scale: 0.5,
            },
        );
        let show = |r: Result<(), zcompute::ComputeError>| match r {
            Ok(()) => "ok".to_string(),
            Err(e) => format!("{e:?}"),
        };
        format!("{} | {}", show(fwd.map(drop)), show(bwd.map(drop)))
    }
    let rows: [([&[usize]; 5], &str); 5] = [
        (
            [&[2, 3, 4], &[2, 5, 4], &[2, 5, 6], &[2, 5], &[2, 3, 6]],
            "ok | ok",
        ),
        (
            [&[2, 3, 4], &[2, 5, 3], &[2, 5, 6], &[2, 5], &[2, 3, 6]],
            "ShapeMismatch",
        ),
        (
            [&[2, 3, 4], &[2, 5, 4], &[2, 5, 6], &[2, 1, 5], &[2, 3, 6]],
            "ShapeMismatch",
        ),
        (
            [&[3, 4], &[2, 5, 4], &[2, 5, 6], &[2, 5], &[2, 3, 6]],
            "RankTooLow",
        ),
        (
            [&[2, 3, 4], &[2, 5, 4], &[2, 5, 6], &[2, 5], &[2, 3, 4]],
            "ok | ShapeMismatch",
        ),
    ];
    for (shapes, want) in rows {
        let (cpu, dev) = (first_error(&CPU, shapes), first_error(b, shapes));
        assert_eq!(cpu, dev, "{shapes:?}: CPU and device differ");
        assert!(cpu.contains(want), "{shapes:?}: {cpu}");
    }
    // A non-finite scale is refused.
    let t = |s: &[usize]| b.zeros(s).expect("zeros");
    let e = b
        .key_padding_attention(&KeyPaddingAttention {
            q: &t(&[1, 2, 2]),
            k: &t(&[1, 2, 2]),
            v: &t(&[1, 2, 2]),
            key_keep: None,
            scale: f32::NAN,
        })
        .unwrap_err();
    assert!(format!("{e:?}").contains("scale"), "{e:?}");
}

macro_rules! key_padding_suite {
    ($backend:path) => {
        use super::{Case, Mask, case};
        use rstest::rstest;

        /// Masked, unmasked and all-ones; one query, one key, sequences of different lengths,
        /// widths of q·k and of v that differ, more threads than keys and the reverse.
        #[rstest]
        #[case::padded(case(3, 4, 5, 8, 6, Mask::Padded))]
        #[case::no_mask(case(2, 5, 7, 8, 4, Mask::None))]
        #[case::all_kept(case(2, 5, 7, 8, 4, Mask::AllKept))]
        #[case::one_query_one_key(case(2, 1, 1, 3, 2, Mask::None))]
        #[case::long_keys(case(3, 3, 300, 16, 5, Mask::Padded))]
        #[case::long_queries(case(3, 200, 6, 4, 130, Mask::Padded))]
        fn fused_parity(#[case] c: Case) {
            super::parity(&$backend(), c);
            super::fused_equals_composite(&$backend(), c);
        }

        /// Past the kernels' sequence limit: the composite runs, with the same results.
        #[rstest]
        #[case::keys_past_the_limit(case(1, 2, 4097, 2, 2, Mask::Padded))]
        #[case::empty_batch(case(0, 3, 4, 2, 2, Mask::Padded))]
        #[case::no_keys(case(2, 3, 0, 2, 2, Mask::Padded))]
        fn fallback_parity(#[case] c: Case) {
            super::parity(&$backend(), c);
        }

        #[test]
        fn all_padding_rows_are_zero() {
            super::all_padding_rows_are_zero(&$backend());
        }

        #[test]
        fn no_mask_equals_all_kept() {
            super::no_mask_equals_all_kept(&$backend());
        }

        #[test]
        fn per_sample_equals_batched() {
            super::per_sample_equals_batched(&$backend());
        }

        #[test]
        fn two_runs_bitwise_equal() {
            super::deterministic(&$backend(), case(3, 12, 12, 32, 32, Mask::Padded));
        }

        #[test]
        fn typed_errors() {
            super::errors(&$backend());
        }
    };
}

/// The CPU's fused pass in f64 against the composite of the op set in f64.
#[rstest::rstest]
#[case(case(3, 4, 5, 8, 6, Mask::Padded))]
#[case(case(2, 5, 7, 8, 4, Mask::None))]
#[case(case(3, 3, 40, 16, 5, Mask::Padded))]
fn cpu_fused_matches_composite_in_f64(#[case] c: Case) {
    let fused = run::<_, f64>(&CPU, c, false);
    let composite = run::<_, f64>(&CPU, c, true);
    for ((name, f), m) in NAMES.iter().zip(&fused).zip(&composite) {
        let err = rel_err64(f, m);
        assert!(err <= 1e-12, "{c:?} {name}: {err:e}");
    }
}

/// The capture's test, for the device backends.
macro_rules! key_padding_capture {
    ($backend:path) => {
        #[rstest]
        #[case::fused(case(3, 6, 7, 8, 8, Mask::Padded))]
        #[case::composite(case(1, 2, 4097, 2, 2, Mask::Padded))]
        fn captured_equals_eager(#[case] c: Case) {
            super::captured_equals_eager(&$backend(), c);
        }
    };
}

mod cpu_suite {
    key_padding_suite!(super::cpu);
}

mod mock_suite {
    key_padding_suite!(super::super::cuda::mock);
    key_padding_capture!(super::super::cuda::mock);
}

#[cfg(feature = "gpu")]
mod gpu_suite {
    key_padding_suite!(super::super::cuda::gpu);
    key_padding_capture!(super::super::cuda::gpu);
}

fn cpu() -> zcompute::CpuBackend {
    CPU
}

/// On the simulated device the fused shapes take the kernels (one launch forward, two
/// backward), the long ones the composite.
#[test]
fn the_kernels_are_taken_on_the_simulator() {
    let gpu = crate::cuda::mock();
    let launches = |c: Case| -> usize {
        let sim = gpu.device().driver();
        sim.clear_op_log();
        let _ = run::<_, f32>(&gpu, c, false);
        let is_launch = |r: &&zdevice::sim::OpRecord| {
            r.call == zdevice::sim::calls::LAUNCH_KERNEL
                || r.call == zdevice::sim::calls::GEMM_STRIDED_BATCHED
        };
        sim.op_log().iter().filter(is_launch).count()
    };
    assert_eq!(
        launches(case(3, 4, 5, 8, 6, Mask::Padded)),
        1 + 2,
        "forward one launch, backward two"
    );
    let composite = launches(case(1, 2, 4097, 2, 2, Mask::Padded));
    assert!(composite > 5, "composite launches {composite}");
}
