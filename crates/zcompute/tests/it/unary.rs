//! Elementwise unary ops: f32 against the f64 run, and GELU against a series erf.

use crate::common::{
    assert_f32_matches, assert_matches_formula, cpu32, cpu64, numel, pair, uniform,
};
use rstest::rstest;
use zcompute::{Backend, UnaryOp};

/// Inputs inside each op's domain (log, sqrt and rsqrt need positive values).
fn input(op: UnaryOp, shape: &[usize], seed: u64) -> Vec<f64> {
    match op {
        UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt => uniform(numel(shape), seed, 0.05, 4.0),
        _ => uniform(numel(shape), seed, -4.0, 4.0),
    }
}

#[rstest]
fn unary_f32_matches_f64(
    #[values(
        UnaryOp::Neg,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Sqrt,
        UnaryOp::Rsqrt,
        UnaryOp::Tanh,
        UnaryOp::Sigmoid,
        UnaryOp::Relu,
        UnaryOp::Gelu
    )]
    op: UnaryOp,
    #[values(&[1][..], &[7][..], &[193][..], &[1025][..], &[1, 7][..], &[3, 1, 193][..])]
    shape: &[usize],
) {
    let (x32, x64) = pair(&input(op, shape, 11), shape);
    let y32 = cpu32().unary(op, &x32).unwrap();
    let y64 = cpu64().unary(op, &x64).unwrap();
    assert_f32_matches(&format!("{op:?} {shape:?}"), &y32, &y64);
}

#[rstest]
fn unary_on_strided_view(#[values(UnaryOp::Exp, UnaryOp::Gelu, UnaryOp::Sigmoid)] op: UnaryOp) {
    let (x32, x64) = pair(&input(op, &[7, 193], 3), &[7, 193]);
    let v32 = x32.transpose(0, 1).unwrap().narrow(0, 5, 100).unwrap();
    let v64 = x64.transpose(0, 1).unwrap().narrow(0, 5, 100).unwrap();
    let y32 = cpu32().unary(op, &v32).unwrap();
    let y64 = cpu64().unary(op, &v64).unwrap();
    assert_eq!(y32.shape(), &[100, 7]);
    assert_f32_matches(&format!("{op:?} view"), &y32, &y64);
}

/// erf by its Maclaurin series, independent of libm: fine in f64 for |z| <= 3.
fn erf_series(z: f64) -> f64 {
    let mut term = z;
    let mut sum = z;
    for n in 1..200 {
        term *= -z * z / f64::from(n);
        sum += term / f64::from(2 * n + 1);
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

#[rstest]
fn gelu_matches_erf_formula(
    #[values(&[1][..], &[7][..], &[193][..], &[1025][..])] shape: &[usize],
) {
    let (x32, x64) = pair(&uniform(numel(shape), 5, -4.0, 4.0), shape);
    let formula: Vec<f64> = x64
        .to_vec()
        .iter()
        .map(|&x| 0.5 * x * (1.0 + erf_series(x / std::f64::consts::SQRT_2)))
        .collect();
    let y32 = cpu32().unary(UnaryOp::Gelu, &x32).unwrap();
    let y64 = cpu64().unary(UnaryOp::Gelu, &x64).unwrap();
    assert_matches_formula("gelu", &y32, &y64, &formula);
}

#[test]
fn sigmoid_and_relu_extremes() {
    let x =
        zcompute::CpuTensor::from_vec(vec![-1000.0f32, -30.0, 0.0, 30.0, 1000.0], &[5]).unwrap();
    let s = cpu32().unary(UnaryOp::Sigmoid, &x).unwrap().to_vec();
    assert!(s.iter().all(|v| v.is_finite()));
    assert_eq!(s[0], 0.0);
    assert_eq!(s[2], 0.5);
    assert_eq!(s[4], 1.0);
    let r = cpu32().unary(UnaryOp::Relu, &x).unwrap().to_vec();
    assert_eq!(r, vec![0.0, 0.0, 0.0, 30.0, 1000.0]);
    let nan = zcompute::CpuTensor::from_vec(vec![f32::NAN], &[1]).unwrap();
    assert!(cpu32().unary(UnaryOp::Relu, &nan).unwrap().to_vec()[0].is_nan());
}
