//! Broadcasting binary ops and their scalar forms, f32 against the f64 run and a direct loop.

use crate::common::{assert_f32_matches, cpu32, cpu64, numel, pair, rand_pair, rel_err64, uniform};
use rstest::rstest;
use zcompute::{Backend, BinaryOp, CpuTensor, Layout, ScalarSide, broadcast_shapes};

/// Operands for `op`: the divisor stays away from zero.
/// An f32 tensor and its f64 twin.
type Pair = (CpuTensor<f32>, CpuTensor<f64>);

fn operands(op: BinaryOp, a: &[usize], b: &[usize]) -> (Pair, Pair) {
    let lhs = rand_pair(a, 21);
    let rhs = if op == BinaryOp::Div {
        let mut v = uniform(numel(b), 22, 0.5, 2.0);
        for (i, x) in v.iter_mut().enumerate() {
            if i % 2 == 1 {
                *x = -*x;
            }
        }
        pair(&v, b)
    } else {
        rand_pair(b, 22)
    };
    (lhs, rhs)
}

#[rstest]
#[case(&[7], &[7])]
#[case(&[1], &[1025])]
#[case(&[1025], &[1])]
#[case(&[7, 193], &[193])]
#[case(&[193], &[7, 193])]
#[case(&[7, 1], &[1, 193])]
#[case(&[1, 7], &[7, 1])]
#[case(&[2, 3, 1, 5], &[3, 4, 1])]
#[case(&[1, 1, 1025], &[1, 1025])]
#[case(&[3, 1, 7], &[3, 193, 1])]
fn binary_broadcasts(
    #[case] a: &[usize],
    #[case] b: &[usize],
    #[values(
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Maximum
    )]
    op: BinaryOp,
) {
    let ((a32, a64), (b32, b64)) = operands(op, a, b);
    let y32 = cpu32().binary(op, &a32, &b32).unwrap();
    let y64 = cpu64().binary(op, &a64, &b64).unwrap();
    let shape = broadcast_shapes("test", a, b).unwrap();
    assert_eq!(y32.shape(), shape.as_slice());
    assert_f32_matches(&format!("{op:?} {a:?} {b:?}"), &y32, &y64);

    // Direct loop: index both operands by explicit broadcast arithmetic.
    let (va, vb) = (a64.to_vec(), b64.to_vec());
    let la = Layout::contiguous(a);
    let lb = Layout::contiguous(b);
    let out = Layout::contiguous(&shape);
    let mut formula = Vec::new();
    let mut idx = vec![0usize; shape.len()];
    for _ in 0..out.numel() {
        let pick = |l: &Layout, v: &[f64]| {
            let lead = shape.len() - l.rank();
            let sub: Vec<usize> = (0..l.rank())
                .map(|i| if l.shape()[i] == 1 { 0 } else { idx[lead + i] })
                .collect();
            v[l.offset_of(&sub).unwrap()]
        };
        let (x, y) = (pick(&la, &va), pick(&lb, &vb));
        formula.push(match op {
            BinaryOp::Add => x + y,
            BinaryOp::Sub => x - y,
            BinaryOp::Mul => x * y,
            BinaryOp::Div => x / y,
            BinaryOp::Maximum => x.max(y),
        });
        for ax in (0..shape.len()).rev() {
            idx[ax] += 1;
            if idx[ax] < shape[ax] {
                break;
            }
            idx[ax] = 0;
        }
    }
    assert!(rel_err64(&y64.to_vec(), &formula) <= 1e-15);
}

#[rstest]
fn binary_scalar_both_sides(
    #[values(
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Maximum
    )]
    op: BinaryOp,
    #[values(ScalarSide::Rhs, ScalarSide::Lhs)] side: ScalarSide,
    #[values(&[1][..], &[193][..], &[7, 1025][..])] shape: &[usize],
) {
    // Positive inputs keep `s / x` well away from division by zero.
    let (x32, x64) = pair(&uniform(numel(shape), 9, 0.25, 3.0), shape);
    let s = 1.75;
    let y32 = cpu32().binary_scalar(op, &x32, s as f32, side).unwrap();
    let y64 = cpu64().binary_scalar(op, &x64, s, side).unwrap();
    assert_f32_matches(&format!("{op:?} {side:?}"), &y32, &y64);
    // The scalar form equals the tensor form with a broadcast rank-0 operand.
    let st = CpuTensor::scalar(s);
    let via_tensor = match side {
        ScalarSide::Rhs => cpu64().binary(op, &x64, &st),
        ScalarSide::Lhs => cpu64().binary(op, &st, &x64),
    }
    .unwrap();
    assert_eq!(via_tensor.to_vec(), y64.to_vec());
}

#[test]
fn maximum_propagates_nan_and_aliasing_is_fine() {
    let a = CpuTensor::from_vec(vec![1.0f32, f32::NAN, 3.0], &[3]).unwrap();
    let b = CpuTensor::from_vec(vec![f32::NAN, 2.0, 1.0], &[3]).unwrap();
    let m = cpu32().maximum(&a, &b).unwrap().to_vec();
    assert!(m[0].is_nan() && m[1].is_nan());
    assert_eq!(m[2], 3.0);
    // An operand with itself (shared storage, one transposed) reads consistently.
    let x = CpuTensor::from_vec((0..6).map(|i| i as f32).collect(), &[2, 3]).unwrap();
    let xt = x.transpose(0, 1).unwrap();
    let y = cpu32()
        .add(&x.reshape(&[2, 3, 1]).unwrap(), &xt.unsqueeze(0).unwrap())
        .unwrap();
    assert_eq!(y.shape(), &[2, 3, 2]);
    assert_eq!(y.to_vec()[..6], [0.0, 3.0, 2.0, 5.0, 4.0, 7.0]);
}
