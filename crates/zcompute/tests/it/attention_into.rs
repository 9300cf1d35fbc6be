//! `AttentionOps::qk_norm_attention_backward_into`: the four QK-norm parameter gradients added into
//! the caller's buffers (non-zero before), on the CPU and on the CUDA backend (poison on),
//! against the f64 reference plus the buffers' old values: buffers adjacent and in order in one
//! flat buffer (one column reduction adds all four), apart in one buffer, in four buffers, and
//! some not given (returned instead); fused shapes and the composite fallback. Two runs are
//! bitwise equal, and equal to the backward followed by `add_into`. Typed errors for bad
//! buffers. Which launches run is pinned on the simulator.

use crate::attention::{Case, inputs, run as reference_run};
use crate::common::{CPU, TOL, rel_err, uniform};
use zcompute::prelude::*;
use zcompute::{BTensor, Element, Layout, QkNorm, Storage, Tensor};

/// Where the four gradient buffers live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Buffers {
    /// Adjacent and in order in one flat buffer, after a 3-element prefix (zgrad's layout).
    Adjacent,
    /// In one flat buffer with a gap between each pair.
    Apart,
    /// Four buffers of their own.
    Separate,
    /// Only the q weight's and the k bias's are given; the others come back.
    Some2,
}

const GAP: usize = 2;
const PREFIX: usize = 3;

/// Views of the four gradient buffers (`None` where not given) and the flat tensors holding
/// them, filled with non-zero starting values.
pub fn buffers<B: Ops<T>, T: Element>(
    b: &B,
    dh: usize,
    layout: Buffers,
    init: &[Vec<f64>; 4],
) -> [Option<BTensor<B, T>>; 4] {
    let up = |v: Vec<f64>| -> BTensor<B, T> {
        let n = v.len();
        let data: Vec<T> = v.into_iter().map(T::from_f64).collect();
        b.upload(&data, &[n]).expect("upload")
    };
    let view = |flat: &BTensor<B, T>, at: usize| -> BTensor<B, T> {
        let layout = Layout::new(&[dh], &[1], at).expect("layout");
        Tensor::from_parts(flat.storage().clone(), layout).expect("view")
    };
    let stride = match layout {
        Buffers::Adjacent => dh,
        _ => dh + GAP,
    };
    match layout {
        Buffers::Adjacent | Buffers::Apart => {
            let mut flat = vec![7.0; PREFIX + 4 * stride + GAP];
            for (k, v) in init.iter().enumerate() {
                flat[PREFIX + k * stride..][..dh].copy_from_slice(v);
            }
            let flat = up(flat);
            std::array::from_fn(|k| Some(view(&flat, PREFIX + k * stride)))
        }
        Buffers::Separate => std::array::from_fn(|k| Some(up(init[k].clone()))),
        Buffers::Some2 => std::array::from_fn(|k| (k == 0 || k == 3).then(|| up(init[k].clone()))),
    }
}

/// A case's inputs on `b` (`attention::inputs`): qkv, the output gradient and the four
/// QK-norm parameters (q weight, q bias, k weight, k bias).
pub struct Uploaded<B: Ops<T>, T: Element> {
    pub qkv: BTensor<B, T>,
    pub g: BTensor<B, T>,
    pub params: [BTensor<B, T>; 4],
}

pub fn upload<B: Ops<T>, T: Element>(b: &B, c: Case) -> Uploaded<B, T> {
    let [qkv, qw, qb, kw, kb, g] = inputs(c);
    let up = |v: &[f64], shape: &[usize]| {
        let data: Vec<T> = v.iter().map(|&x| T::from_f64(x)).collect();
        b.upload(&data, shape).expect("upload")
    };
    Uploaded {
        qkv: up(&qkv, &[c.batch, c.seq, 3 * c.heads * c.dh]),
        g: up(&g, &[c.batch, c.seq, c.heads * c.dh]),
        params: [&qw, &qb, &kw, &kb].map(|v| up(v, &[c.dh])),
    }
}

/// The QK-norm of uploaded parameters, eps 1e-5.
pub fn qk_norm<S: Storage>(params: &[Tensor<S>; 4], heads: usize) -> QkNorm<'_, S>
where
    S::Elem: Element,
{
    QkNorm {
        q_weight: &params[0],
        q_bias: &params[1],
        k_weight: &params[2],
        k_bias: &params[3],
        heads,
        eps: S::Elem::from_f64(1e-5),
    }
}

/// The four parameter gradients after `qk_norm_attention_backward_into` (each the buffer's
/// contents, or the returned gradient where no buffer was given), and qkv's gradient.
pub fn run_into<B: Ops<T>, T: Element>(b: &B, c: Case, layout: Buffers) -> [Vec<f64>; 5] {
    let Uploaded { qkv, g, params } = upload(b, c);
    let norm = qk_norm(&params, c.heads);
    let bufs = buffers(b, c.dh, layout, &starting_values(c.dh));
    let r = b
        .qk_norm_attention_backward_into(&g, &qkv, &norm, [0, 1, 2, 3].map(|k| bufs[k].as_ref()))
        .expect("backward_into");
    let down = |t: &BTensor<B, T>| -> Vec<f64> {
        let v = b.download(t).expect("download");
        v.into_iter().map(Element::to_f64).collect()
    };
    let mut out: [Vec<f64>; 5] = Default::default();
    out[0] = down(&r.qkv);
    for k in 0..4 {
        out[k + 1] = match (&bufs[k], &r.params[k]) {
            (Some(buf), None) => down(buf),
            (None, Some(grad)) => down(grad),
            _ => panic!("{c:?} {layout:?} param {k}: buffer and returned gradient both or neither"),
        };
    }
    out
}

/// Non-zero starting values of the four buffers (f32-representable).
pub fn starting_values(dh: usize) -> [Vec<f64>; 4] {
    std::array::from_fn(|k| {
        uniform(dh, 900 + k as u64, -1.0, 1.0)
            .into_iter()
            .map(|x| f64::from(x as f32))
            .collect()
    })
}

/// f32 results on `b` against the f64 reference gradients plus the starting values.
pub fn parity<B: Ops<f32>>(b: &B, c: Case, layout: Buffers) {
    let (_, want) = reference_run::<_, f64>(&CPU, c, false);
    let start = starting_values(c.dh);
    let ours = run_into::<_, f32>(b, c, layout);
    for (k, (o, w)) in ours.iter().zip(&want).enumerate() {
        let expected: Vec<f64> = if k == 0 {
            w.clone()
        } else {
            let given = layout != Buffers::Some2 || k == 1 || k == 4;
            let base = given.then(|| &start[k - 1]);
            w.iter()
                .enumerate()
                .map(|(i, &x)| x + base.map_or(0.0, |s| s[i]))
                .collect()
        };
        let o32: Vec<f32> = o.iter().map(|&v| v as f32).collect();
        // The k bias gradient is zero up to rounding: measured as an absolute error against
        // the k weight gradient's scale (as in `crate::attention`).
        let err = if k == 4 {
            o.iter()
                .zip(&expected)
                .map(|(a, e)| (a - e).abs())
                .fold(0.0, f64::max)
        } else {
            rel_err(&o32, &expected)
        };
        assert!(err <= TOL, "{c:?} {layout:?} tensor {k}: error {err:e}");
    }
}

/// Two runs bitwise equal, and equal to the backward then one `add_into` per parameter.
pub fn bitwise<B: Ops<f32>>(b: &B, c: Case, layout: Buffers) {
    let first = run_into::<_, f32>(b, c, layout);
    let second = run_into::<_, f32>(b, c, layout);
    let bits =
        |r: &[Vec<f64>; 5]| -> Vec<u64> { r.iter().flatten().map(|x| x.to_bits()).collect() };
    assert_eq!(
        bits(&first),
        bits(&second),
        "{c:?} {layout:?}: two runs differ"
    );
    // The same sums added afterwards.
    let f32s = |v: &[f64]| -> Vec<f32> { v.iter().map(|&x| x as f32).collect() };
    let Uploaded { qkv, g, params } = upload(b, c);
    let norm = qk_norm(&params, c.heads);
    let r = b.qk_norm_attention_backward(&g, &qkv, &norm).unwrap();
    let start = starting_values(c.dh);
    for (k, grad) in [r.q_weight, r.q_bias, r.k_weight, r.k_bias]
        .iter()
        .enumerate()
    {
        let buf = b.upload(&f32s(&start[k]), &[c.dh]).unwrap();
        b.add_into(grad, &buf).unwrap();
        let after: Vec<u64> = b
            .download(&buf)
            .unwrap()
            .iter()
            .map(|&x| f64::from(x).to_bits())
            .collect();
        let given = layout != Buffers::Some2 || k == 0 || k == 3;
        if given {
            let ours: Vec<u64> = first[k + 1].iter().map(|x| x.to_bits()).collect();
            assert_eq!(
                ours, after,
                "{c:?} {layout:?} param {k}: not the backward + add_into"
            );
        }
    }
}

/// Bad buffers give the same typed error on the CPU and on `b`.
pub fn errors<B: Ops<f32>>(b: &B) {
    fn first_error<B: Ops<f32>>(b: &B, case: usize) -> String {
        let t = |shape: &[usize]| b.zeros(shape).expect("zeros");
        let (qkv, g, p) = (t(&[2, 3, 24]), t(&[2, 3, 8]), t(&[4]));
        let norm = QkNorm {
            q_weight: &p,
            q_bias: &p,
            k_weight: &p,
            k_bias: &p,
            heads: 2,
            eps: 1e-5,
        };
        let flat = t(&[8]);
        let at = |o: usize, n: usize| {
            Tensor::from_parts(flat.storage().clone(), Layout::new(&[n], &[1], o).unwrap()).unwrap()
        };
        let broadcast = t(&[1]).broadcast_to(&[4]).unwrap();
        let (ok, wide, overlap, of_g) = (at(0, 4), at(0, 5), at(2, 4), g.reshape(&[48]).unwrap());
        let of_g = of_g.narrow(0, 0, 4).unwrap();
        let bufs: [Option<&BTensor<B, f32>>; 4] = match case {
            0 => [Some(&ok), None, None, None],
            1 => [Some(&wide), None, None, None],
            2 => [Some(&ok), Some(&overlap), None, None],
            3 => [None, None, Some(&of_g), None],
            4 => [None, Some(&broadcast), None, None],
            _ => [None, None, None, Some(&p)],
        };
        match b.qk_norm_attention_backward_into(&g, &qkv, &norm, bufs) {
            Ok(_) => "ok".into(),
            Err(e) => format!("{e:?}"),
        }
    }
    let want = [
        "ok",
        "ShapeMismatch",
        "Aliased",
        "Aliased",
        "OverlappingDestination",
        "Aliased",
    ];
    for (case, want) in want.iter().enumerate() {
        let cpu = first_error(&CPU, case);
        let dev = first_error(b, case);
        assert_eq!(cpu, dev, "case {case}: CPU and device differ");
        assert!(cpu.contains(want), "case {case}: {cpu}");
    }
}

macro_rules! attention_into_suite {
    ($backend:path) => {
        use super::Buffers::{self, Adjacent, Apart, Separate, Some2};
        use super::Case;
        use rstest::rstest;

        #[rstest]
        fn parity(
            #[values(12, 17)] seq: usize,
            #[values(64, 5)] dh: usize,
            #[values(1, 4)] heads: usize,
            #[values(1, 3)] batch: usize,
            #[values(Adjacent, Apart, Separate, Some2)] layout: Buffers,
        ) {
            let c = Case {
                batch,
                seq,
                heads,
                dh,
            };
            super::parity(&$backend(), c, layout);
        }

        /// Shapes the fused kernels do not take: the composite, then adds.
        #[rstest]
        fn fallback_parity(#[values(Buffers::Adjacent, Buffers::Some2)] layout: Buffers) {
            let c = Case {
                batch: 1,
                seq: 70,
                heads: 2,
                dh: 8,
            };
            super::parity(&$backend(), c, layout);
        }

        #[rstest]
        fn bitwise(
            #[values((3, 12, 4, 64), (2, 17, 1, 5), (1, 70, 2, 8))] shape: (
                usize,
                usize,
                usize,
                usize,
            ),
            #[values(Buffers::Adjacent, Buffers::Apart, Buffers::Some2)] layout: Buffers,
        ) {
            let (batch, seq, heads, dh) = shape;
            super::bitwise(
                &$backend(),
                Case {
                    batch,
                    seq,
                    heads,
                    dh,
                },
                layout,
            );
        }

        #[rstest]
        #[case::fused(3, 12, 4, 64)]
        #[case::odd(1, 17, 1, 5)]
        #[case::composite(1, 70, 2, 8)]
        fn captured_equals_eager(
            #[case] batch: usize,
            #[case] seq: usize,
            #[case] heads: usize,
            #[case] dh: usize,
            #[values(Adjacent, Some2)] layout: Buffers,
        ) {
            let c = Case {
                batch,
                seq,
                heads,
                dh,
            };
            crate::attention_into_graph::captured_equals_eager(&$backend(), c, layout);
        }

        #[test]
        fn typed_errors() {
            super::errors(&$backend());
        }
    };
}

mod cpu_suite {
    fn cpu() -> zcompute::CpuBackend {
        zcompute::CpuBackend
    }
    attention_into_suite!(cpu);
}

mod mock_suite {
    attention_into_suite!(super::super::cuda::mock);
}

#[cfg(feature = "gpu")]
mod gpu_suite {
    attention_into_suite!(super::super::cuda::gpu);
}
