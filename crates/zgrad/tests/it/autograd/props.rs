//! Invariants over random shapes and op chains: broadcasting gradients count the copies, a
//! backward consumes every node on its path, and gradients are linear in the seed.

use proptest::prelude::*;
use zcompute::{Backend, CpuBackend, UnaryOp};
use zgrad::{Tape, Var};

const B: CpuBackend = CpuBackend;

/// A shape of rank 1-3 and a second shape broadcastable against it (sizes kept or set to 1,
/// leading axes maybe dropped).
fn broadcast_pair() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    prop::collection::vec(1usize..4, 1..4).prop_flat_map(|a| {
        let n = a.len();
        (
            Just(a.clone()),
            prop::collection::vec(any::<bool>(), n),
            0..n,
        )
            .prop_map(|(a, ones, drop)| {
                let b: Vec<usize> = a
                    .iter()
                    .zip(&ones)
                    .map(|(&d, &one)| if one { 1 } else { d })
                    .skip(drop)
                    .collect();
                (a, b)
            })
    })
}

fn ramp(n: usize) -> Vec<f64> {
    (0..n).map(|i| 0.1 * i as f64 - 0.3).collect()
}

proptest! {
    #[test]
    fn broadcast_gradients_count_the_copies((a_shape, b_shape) in broadcast_pair(), swap in any::<bool>()) {
        let (a_shape, b_shape) = if swap { (b_shape, a_shape) } else { (a_shape, b_shape) };
        let a = Var::parameter_from(&B, &ramp(a_shape.iter().product()), &a_shape).unwrap();
        let b = Var::parameter_from(&B, &ramp(b_shape.iter().product()), &b_shape).unwrap();
        let tape = Tape::new(&B);
        let out = tape.add(&a, &b).unwrap();
        let n_out = out.value().numel() as f64;
        tape.backward(&tape.sum_all(&out).unwrap()).unwrap();
        for p in [&a, &b] {
            let copies = n_out / p.value().numel() as f64;
            let g = B.download(p.grad().unwrap()).unwrap();
            prop_assert!(g.iter().all(|&v| v == copies), "{:?}: {g:?}", p.shape());
        }
        prop_assert_eq!(tape.pending_nodes(), 0);
    }

    #[test]
    fn chains_are_consumed_and_linear_in_the_seed(
        ops in prop::collection::vec(0usize..5, 1..8),
        rows in 1usize..4,
        cols in 1usize..5,
        factor in 0.5f64..4.0,
    ) {
        let grad_for = |seed_scale: f64| {
            let x = Var::parameter_from(&B, &ramp(rows * cols), &[rows, cols]).unwrap();
            let tape = Tape::new(&B);
            let mut h = x.clone();
            for &op in &ops {
                h = match op {
                    0 => tape.unary(UnaryOp::Tanh, &h),
                    1 => tape.unary(UnaryOp::Sigmoid, &h),
                    2 => tape.mul(&h, &h),
                    3 => tape.softmax_last(&h),
                    _ => tape.transpose(&h, 0, 1).and_then(|t| tape.contiguous(&t)).and_then(|t| tape.transpose(&t, 0, 1)),
                }
                .unwrap();
            }
            let seed = B.full(h.shape(), seed_scale).unwrap();
            tape.backward_with(&h, seed).unwrap();
            assert_eq!(tape.pending_nodes(), 0);
            B.download(x.grad().unwrap()).unwrap()
        };
        let g1 = grad_for(1.0);
        let gk = grad_for(factor);
        for (a, b) in g1.iter().zip(&gk) {
            prop_assert!((a * factor - b).abs() <= 1e-12 * (1.0 + b.abs()), "{a} * {factor} vs {b}");
        }
    }
}
