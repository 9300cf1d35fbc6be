//! Reductions over each axis, with and without keepdim.

use crate::common::{assert_f32_matches, cpu32, cpu64, rand_pair, rel_err64};
use rstest::rstest;
use zcompute::{Backend, ReduceOp};

#[rstest]
#[case(&[1], 0)]
#[case(&[1025], 0)]
#[case(&[1, 1], 1)]
#[case(&[7, 193, 3], 0)]
#[case(&[7, 193, 3], 1)]
#[case(&[7, 193, 3], 2)]
#[case(&[2, 1025], 1)]
#[case(&[1, 7, 1], 1)]
fn reduce_matches_reference(
    #[case] shape: &[usize],
    #[case] axis: usize,
    #[values(ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max)] op: ReduceOp,
    #[values(false, true)] keepdim: bool,
) {
    let (x32, x64) = rand_pair(shape, 31);
    let y32 = cpu32().reduce(op, &x32, axis, keepdim).unwrap();
    let y64 = cpu64().reduce(op, &x64, axis, keepdim).unwrap();
    let mut expect_shape = shape.to_vec();
    if keepdim {
        expect_shape[axis] = 1;
    } else {
        expect_shape.remove(axis);
    }
    assert_eq!(y32.shape(), expect_shape.as_slice());
    assert_f32_matches(&format!("{op:?} {shape:?} axis {axis}"), &y32, &y64);

    // Direct formula over the f64 input.
    let v = x64.to_vec();
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis + 1..].iter().product();
    let n = shape[axis];
    let mut formula = Vec::new();
    for o in 0..outer {
        for i in 0..inner {
            let lane = (0..n).map(|j| v[(o * n + j) * inner + i]);
            formula.push(match op {
                ReduceOp::Sum => lane.sum(),
                ReduceOp::Mean => lane.sum::<f64>() / n as f64,
                ReduceOp::Max => lane.fold(f64::NEG_INFINITY, f64::max),
            });
        }
    }
    assert!(rel_err64(&y64.to_vec(), &formula) <= 1e-14);
}

#[test]
fn sum_over_empty_axis_is_zero() {
    let x = zcompute::CpuTensor::<f32>::from_vec(vec![], &[3, 0]).unwrap();
    let y = cpu32().sum(&x, 1, false).unwrap();
    assert_eq!(y.to_vec(), vec![0.0; 3]);
}
