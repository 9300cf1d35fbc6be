//! Finite differences in float64 on the CPU for the backward of every op of the tape: for
//! `loss = sum(op(inputs) * w)` with a fixed random `w`, the analytic gradient of each input
//! must match the central difference `(loss(x + h) - loss(x - h)) / 2h` to a relative norm of
//! 1e-6 (the difference itself is accurate to about h² + eps/h ≈ 1e-10).

use rstest::rstest;
use zcompute::{BinaryOp, CpuBackend, MatmulOpts, ReduceOp, ScalarSide, UnaryOp};
use zgrad::rng::SplitMix64;
use zgrad::{Tape, Var};

type V = Var<CpuBackend, f64>;
type Tp<'a> = Tape<'a, CpuBackend, f64>;
type OpFn = fn(&Tp<'_>, &[V]) -> zgrad::Result<V>;

const BE: CpuBackend = CpuBackend;

#[derive(Clone, Copy, Debug)]
enum Dist {
    /// N(0, 1).
    Normal,
    /// Uniform in [0.5, 2] (log, sqrt, divisors).
    Positive,
    /// Uniform in [0, 1] (BCE targets in the second input).
    Probability,
}

fn sample(rng: &mut SplitMix64, dist: Dist, n: usize, input: usize) -> Vec<f64> {
    match dist {
        Dist::Normal => rng.normal_vec(n),
        Dist::Positive => rng.uniform_vec(n, 0.5, 2.0),
        Dist::Probability if input == 1 => rng.uniform_vec(n, 0.0, 1.0),
        Dist::Probability => rng.normal_vec(n),
    }
}

fn loss_of(f: OpFn, inputs: &[(Vec<f64>, Vec<usize>)], w: &[f64]) -> f64 {
    let tape = Tape::no_grad(&BE);
    let vars: Vec<V> = inputs
        .iter()
        .map(|(d, s)| Var::constant(zcompute::CpuTensor::from_vec(d.clone(), s).unwrap()))
        .collect();
    let out = f(&tape, &vars).unwrap().to_vec(&BE).unwrap();
    out.iter().zip(w).map(|(a, b)| a * b).sum()
}

fn rel_err(got: &[f64], want: &[f64]) -> f64 {
    let diff: f64 = got.iter().zip(want).map(|(a, b)| (a - b) * (a - b)).sum();
    let norm: f64 = want.iter().map(|b| b * b).sum();
    diff.sqrt() / norm.sqrt().max(1e-12)
}

/// "2,3;4" -> [[2, 3], [4]]; an empty piece is a rank-0 shape.
fn parse(shapes: &str) -> Vec<Vec<usize>> {
    shapes
        .split(';')
        .map(|s| {
            s.split(',')
                .filter(|d| !d.is_empty())
                .map(|d| d.parse().unwrap())
                .collect()
        })
        .collect()
}

fn check(shapes: &[Vec<usize>], dist: Dist, f: OpFn) {
    let mut rng = SplitMix64::new(0x5eed);
    let inputs: Vec<(Vec<f64>, Vec<usize>)> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| (sample(&mut rng, dist, s.iter().product(), i), s.to_vec()))
        .collect();

    let tape = Tape::new(&BE);
    let params: Vec<V> = inputs
        .iter()
        .map(|(d, s)| Var::parameter_from(&BE, d, s).unwrap())
        .collect();
    let out = f(&tape, &params).unwrap();
    let w_data = rng.normal_vec(out.value().numel());
    let w = Var::constant(zcompute::CpuTensor::from_vec(w_data.clone(), out.shape()).unwrap());
    let loss = tape.sum_all(&tape.mul(&out, &w).unwrap()).unwrap();
    tape.backward(&loss).unwrap();
    assert_eq!(
        tape.pending_nodes(),
        0,
        "backward consumed every node on the path"
    );

    let h = 1e-6;
    for (i, p) in params.iter().enumerate() {
        let analytic = zcompute::Backend::download(&BE, p.grad().unwrap()).unwrap();
        let mut numeric = Vec::with_capacity(analytic.len());
        for j in 0..inputs[i].0.len() {
            let mut plus = inputs.clone();
            plus[i].0[j] += h;
            let mut minus = inputs.clone();
            minus[i].0[j] -= h;
            numeric.push((loss_of(f, &plus, &w_data) - loss_of(f, &minus, &w_data)) / (2.0 * h));
        }
        let err = rel_err(&analytic, &numeric);
        assert!(
            err < 1e-6,
            "input {i}: relative error {err:e}\n analytic {analytic:?}\n numeric {numeric:?}"
        );
    }
}

fn un(op: UnaryOp) -> OpFn {
    match op {
        UnaryOp::Neg => |t, x| t.unary(UnaryOp::Neg, &x[0]),
        UnaryOp::Exp => |t, x| t.unary(UnaryOp::Exp, &x[0]),
        UnaryOp::Log => |t, x| t.unary(UnaryOp::Log, &x[0]),
        UnaryOp::Sqrt => |t, x| t.unary(UnaryOp::Sqrt, &x[0]),
        UnaryOp::Rsqrt => |t, x| t.unary(UnaryOp::Rsqrt, &x[0]),
        UnaryOp::Tanh => |t, x| t.unary(UnaryOp::Tanh, &x[0]),
        UnaryOp::Sigmoid => |t, x| t.unary(UnaryOp::Sigmoid, &x[0]),
        UnaryOp::Relu => |t, x| t.unary(UnaryOp::Relu, &x[0]),
        UnaryOp::Gelu => |t, x| t.unary(UnaryOp::Gelu, &x[0]),
    }
}

#[rstest]
#[case::neg(UnaryOp::Neg, Dist::Normal)]
#[case::exp(UnaryOp::Exp, Dist::Normal)]
#[case::log(UnaryOp::Log, Dist::Positive)]
#[case::sqrt(UnaryOp::Sqrt, Dist::Positive)]
#[case::rsqrt(UnaryOp::Rsqrt, Dist::Positive)]
#[case::tanh(UnaryOp::Tanh, Dist::Normal)]
#[case::sigmoid(UnaryOp::Sigmoid, Dist::Normal)]
#[case::relu(UnaryOp::Relu, Dist::Normal)]
#[case::gelu(UnaryOp::Gelu, Dist::Normal)]
fn unary(#[case] op: UnaryOp, #[case] dist: Dist) {
    check(&parse("3,5"), dist, un(op));
}

#[rstest]
#[case::add_same("2,3;2,3", |t: &Tp<'_>, x: &[V]| t.add(&x[0], &x[1]))]
#[case::add_broadcast("2,3,4;3,1", |t: &Tp<'_>, x: &[V]| t.add(&x[0], &x[1]))]
#[case::sub_broadcast_lhs("4;2,3,4", |t: &Tp<'_>, x: &[V]| t.sub(&x[0], &x[1]))]
#[case::mul_broadcast("2,1,4;3,1", |t: &Tp<'_>, x: &[V]| t.mul(&x[0], &x[1]))]
#[case::mul_same_var("5", |t: &Tp<'_>, x: &[V]| t.mul(&x[0], &x[0]))]
#[case::div_broadcast("2,3;3", |t: &Tp<'_>, x: &[V]| t.div(&x[0], &x[1]))]
#[case::maximum("3,4;4", |t: &Tp<'_>, x: &[V]| t.maximum(&x[0], &x[1]))]
#[case::rank0_times(";2,3", |t: &Tp<'_>, x: &[V]| t.mul(&x[0], &x[1]))]
fn binary(#[case] shapes: &str, #[case] f: OpFn) {
    // Positive inputs keep divisors away from zero; maximum still gets elements on both sides.
    check(&parse(shapes), Dist::Positive, f);
}

#[rstest]
#[case::add_rhs(BinaryOp::Add, ScalarSide::Rhs)]
#[case::add_lhs(BinaryOp::Add, ScalarSide::Lhs)]
#[case::sub_rhs(BinaryOp::Sub, ScalarSide::Rhs)]
#[case::sub_lhs(BinaryOp::Sub, ScalarSide::Lhs)]
#[case::mul_rhs(BinaryOp::Mul, ScalarSide::Rhs)]
#[case::mul_lhs(BinaryOp::Mul, ScalarSide::Lhs)]
#[case::div_rhs(BinaryOp::Div, ScalarSide::Rhs)]
#[case::div_lhs(BinaryOp::Div, ScalarSide::Lhs)]
#[case::maximum_rhs(BinaryOp::Maximum, ScalarSide::Rhs)]
#[case::maximum_lhs(BinaryOp::Maximum, ScalarSide::Lhs)]
fn scalar(#[case] op: BinaryOp, #[case] side: ScalarSide) {
    // Scalar 1.25 sits inside the Positive range, so maximum has elements on both sides.
    let f: OpFn = match (op, side) {
        (BinaryOp::Add, ScalarSide::Rhs) => {
            |t, x| t.binary_scalar(BinaryOp::Add, &x[0], 1.25, ScalarSide::Rhs)
        }
        (BinaryOp::Add, ScalarSide::Lhs) => {
            |t, x| t.binary_scalar(BinaryOp::Add, &x[0], 1.25, ScalarSide::Lhs)
        }
        (BinaryOp::Sub, ScalarSide::Rhs) => {
            |t, x| t.binary_scalar(BinaryOp::Sub, &x[0], 1.25, ScalarSide::Rhs)
        }
        (BinaryOp::Sub, ScalarSide::Lhs) => {
            |t, x| t.binary_scalar(BinaryOp::Sub, &x[0], 1.25, ScalarSide::Lhs)
        }
        (BinaryOp::Mul, ScalarSide::Rhs) => {
            |t, x| t.binary_scalar(BinaryOp::Mul, &x[0], 1.25, ScalarSide::Rhs)
        }
        (BinaryOp::Mul, ScalarSide::Lhs) => {
            |t, x| t.binary_scalar(BinaryOp::Mul, &x[0], 1.25, ScalarSide::Lhs)
        }
        (BinaryOp::Div, ScalarSide::Rhs) => {
            |t, x| t.binary_scalar(BinaryOp::Div, &x[0], 1.25, ScalarSide::Rhs)
        }
        (BinaryOp::Div, ScalarSide::Lhs) => {
            |t, x| t.binary_scalar(BinaryOp::Div, &x[0], 1.25, ScalarSide::Lhs)
        }
        (BinaryOp::Maximum, ScalarSide::Rhs) => {
            |t, x| t.binary_scalar(BinaryOp::Maximum, &x[0], 1.25, ScalarSide::Rhs)
        }
        (BinaryOp::Maximum, ScalarSide::Lhs) => {
            |t, x| t.binary_scalar(BinaryOp::Maximum, &x[0], 1.25, ScalarSide::Lhs)
        }
    };
    check(&parse("4,3"), Dist::Positive, f);
}

#[rstest]
#[case::sum0(ReduceOp::Sum, 0, false)]
#[case::sum1_keep(ReduceOp::Sum, 1, true)]
#[case::mean2(ReduceOp::Mean, 2, false)]
#[case::mean0_keep(ReduceOp::Mean, 0, true)]
#[case::max1(ReduceOp::Max, 1, false)]
#[case::max2_keep(ReduceOp::Max, 2, true)]
fn reduce(#[case] op: ReduceOp, #[case] axis: usize, #[case] keepdim: bool) {
    let f: OpFn = match (op, axis, keepdim) {
        (ReduceOp::Sum, 0, false) => |t, x| t.reduce(ReduceOp::Sum, &x[0], 0, false),
        (ReduceOp::Sum, 1, true) => |t, x| t.reduce(ReduceOp::Sum, &x[0], 1, true),
        (ReduceOp::Mean, 2, false) => |t, x| t.reduce(ReduceOp::Mean, &x[0], 2, false),
        (ReduceOp::Mean, 0, true) => |t, x| t.reduce(ReduceOp::Mean, &x[0], 0, true),
        (ReduceOp::Max, 1, false) => |t, x| t.reduce(ReduceOp::Max, &x[0], 1, false),
        _ => |t, x| t.reduce(ReduceOp::Max, &x[0], 2, true),
    };
    check(&parse("2,3,4"), Dist::Normal, f);
}

fn mm(trans_a: bool, trans_b: bool) -> MatmulOpts {
    MatmulOpts { trans_a, trans_b }
}

#[rstest]
#[case::plain("3,4;4,5", |t: &Tp<'_>, x: &[V]| t.matmul(&x[0], &x[1], mm(false, false)))]
#[case::trans_a("4,3;4,5", |t: &Tp<'_>, x: &[V]| t.matmul(&x[0], &x[1], mm(true, false)))]
#[case::trans_b("3,4;5,4", |t: &Tp<'_>, x: &[V]| t.matmul(&x[0], &x[1], mm(false, true)))]
#[case::trans_both("4,3;5,4", |t: &Tp<'_>, x: &[V]| t.matmul(&x[0], &x[1], mm(true, true)))]
#[case::batch_times_matrix("2,3,4;5,4", |t: &Tp<'_>, x: &[V]| t.matmul(&x[0], &x[1], mm(false, true)))]
#[case::broadcast_batch("2,1,3,4;3,4,2", |t: &Tp<'_>, x: &[V]| t.matmul(&x[0], &x[1], mm(false, false)))]
#[case::batched_trans_a("2,4,3;2,4,5", |t: &Tp<'_>, x: &[V]| t.matmul(&x[0], &x[1], mm(true, false)))]
fn matmul(#[case] shapes: &str, #[case] f: OpFn) {
    check(&parse(shapes), Dist::Normal, f);
}

#[rstest]
#[case::softmax("3,5", |t: &Tp<'_>, x: &[V]| t.softmax_last(&x[0]))]
#[case::layer_norm_affine("2,3,6;6;6", |t: &Tp<'_>, x: &[V]| t.layer_norm(&x[0], Some(&x[1]), Some(&x[2]), 1e-5))]
#[case::layer_norm_plain("4,6", |t: &Tp<'_>, x: &[V]| t.layer_norm(&x[0], None, None, 1e-5))]
#[case::layer_norm_bias_only("4,6;6", |t: &Tp<'_>, x: &[V]| t.layer_norm(&x[0], None, Some(&x[1]), 1e-5))]
#[case::layer_norm_strided("6,4", |t: &Tp<'_>, x: &[V]| t.layer_norm(&t.transpose(&x[0], 0, 1)?, None, None, 1e-5))]
// `layer_norm_stream`: the stream and the norm both feed the loss (the stream's gradient
// joins LayerNorm's in its backward kernel), only the norm, only the stream.
#[case::layer_norm_stream("2,3,6;6;6", |t: &Tp<'_>, x: &[V]| {
    let (s, y) = t.layer_norm_stream(&x[0], Some(&x[1]), Some(&x[2]), 1e-5)?;
    t.add(&t.tanh(&s)?, &y)
})]
#[case::layer_norm_stream_y_only("4,6;6;6", |t: &Tp<'_>, x: &[V]| Ok(t.layer_norm_stream(&x[0], Some(&x[1]), Some(&x[2]), 1e-5)?.1))]
#[case::layer_norm_stream_only("4,6;6;6", |t: &Tp<'_>, x: &[V]| {
    let (s, _y) = t.layer_norm_stream(&x[0], Some(&x[1]), Some(&x[2]), 1e-5)?;
    t.tanh(&s)
})]
#[case::bce("7;7", |t: &Tp<'_>, x: &[V]| t.bce_with_logits(&x[0], &x[1]))]
#[case::mse("2,3;2,3", |t: &Tp<'_>, x: &[V]| t.mse(&x[0], &x[1]))]
#[case::cross_entropy("3,4", |t: &Tp<'_>, x: &[V]| {
    let targets = zgrad::one_hot::<f64>(&[2, 0, 3], 4)?;
    let targets = Var::constant(zcompute::Backend::upload(t.backend(), &targets, &[3, 4])?);
    t.cross_entropy(&x[0], &targets)
})]
fn rows_and_losses(#[case] shapes: &str, #[case] f: OpFn) {
    let dist = if shapes == "7;7" {
        Dist::Probability
    } else {
        Dist::Normal
    };
    check(&parse(shapes), dist, f);
}

#[rstest]
#[case::reshape("2,6", |t: &Tp<'_>, x: &[V]| t.reshape(&x[0], &[3, 4]))]
#[case::permute("2,3,4", |t: &Tp<'_>, x: &[V]| t.permute(&x[0], &[2, 0, 1]))]
#[case::transpose("2,3,4", |t: &Tp<'_>, x: &[V]| t.transpose(&x[0], 0, 2))]
#[case::narrow("3,5", |t: &Tp<'_>, x: &[V]| t.narrow(&x[0], 1, 1, 3))]
#[case::split_two_used("2,6", |t: &Tp<'_>, x: &[V]| { let p = t.split(&x[0], 1, &[1, 2, 3])?; t.mul(&p[0], &p[2]) })]
#[case::split_one_used("6,2", |t: &Tp<'_>, x: &[V]| { let p = t.split(&x[0], 0, &[2, 4])?; t.tanh(&p[1]) })]
#[case::broadcast_to("3,1", |t: &Tp<'_>, x: &[V]| t.broadcast_to(&x[0], &[2, 3, 4]))]
#[case::unsqueeze("3,4", |t: &Tp<'_>, x: &[V]| t.unsqueeze(&x[0], 1))]
#[case::contiguous_permuted("3,4", |t: &Tp<'_>, x: &[V]| { let p = t.permute(&x[0], &[1, 0])?; let c = t.contiguous(&p)?; t.reshape(&c, &[12]) })]
#[case::sum_all("3,4", |t: &Tp<'_>, x: &[V]| t.sum_all(&x[0]))]
#[case::mean_all("3,4", |t: &Tp<'_>, x: &[V]| t.mean_all(&x[0]))]
fn views(#[case] shapes: &str, #[case] f: OpFn) {
    check(&parse(shapes), Dist::Normal, f);
}

/// A fixed k bias: attention's output does not depend on it (it adds `q·b` to every score of
/// a row, which softmax cancels), so its gradient is zero up to rounding and a relative
/// difference is meaningless; `k_bias_gradient_vanishes` checks that one instead.
fn fixed_k_bias(dh: usize) -> V {
    let data: Vec<f64> = (0..dh).map(|i| 0.3 - 0.2 * i as f64).collect();
    Var::constant(zcompute::CpuTensor::from_vec(data, &[dh]).unwrap())
}

/// Attention's core (one node): qkv `[B, S, 3D]`, then q weight, q bias and k weight `[dh]`.
#[rstest]
#[case::one_head("2,3,12;4;4;4", |t: &Tp<'_>, x: &[V]| {
    t.qk_norm_attention(&x[0], &x[1], &x[2], &x[3], &fixed_k_bias(4), 1, 1e-5)
})]
#[case::two_odd_heads("1,5,18;3;3;3", |t: &Tp<'_>, x: &[V]| {
    t.qk_norm_attention(&x[0], &x[1], &x[2], &x[3], &fixed_k_bias(3), 2, 1e-5)
})]
fn qk_norm_attention(#[case] shapes: &str, #[case] f: OpFn) {
    check(&parse(shapes), Dist::Normal, f);
}

#[test]
fn k_bias_gradient_vanishes() {
    let mut rng = SplitMix64::new(7);
    let tape = Tape::new(&BE);
    let p = |data: Vec<f64>, shape: &[usize]| Var::parameter_from(&BE, &data, shape).unwrap();
    let qkv = p(rng.normal_vec(2 * 3 * 12), &[2, 3, 12]);
    let params: Vec<V> = (0..4).map(|_| p(rng.normal_vec(4), &[4])).collect();
    let out = tape
        .qk_norm_attention(
            &qkv, &params[0], &params[1], &params[2], &params[3], 1, 1e-5,
        )
        .unwrap();
    let w = Var::constant(
        zcompute::CpuTensor::from_vec(rng.normal_vec(out.value().numel()), out.shape()).unwrap(),
    );
    tape.backward(&tape.sum_all(&tape.mul(&out, &w).unwrap()).unwrap())
        .unwrap();
    let gkb = zcompute::Backend::download(&BE, params[3].grad().unwrap()).unwrap();
    let gkw = zcompute::Backend::download(&BE, params[2].grad().unwrap()).unwrap();
    assert!(
        gkb.iter().all(|g| g.abs() < 1e-12),
        "k bias gradient {gkb:?}"
    );
    assert!(
        gkw.iter().any(|g| g.abs() > 1e-3),
        "k weight gradient {gkw:?}"
    );
}

/// The fused ops (bias epilogue, residual add + LayerNorm, pooled head + BCE), at odd widths
/// and S in {1, 12, 17}. Both outputs of `add_layer_norm` feed the loss, so its backward sees
/// the residual gradient and LayerNorm's at once.
#[rstest]
#[case::bias_identity("3,5;5", |t: &Tp<'_>, x: &[V]| t.bias_act(&x[0], &x[1], zcompute::Activation::Identity))]
#[case::bias_tanh("2,3,5;5", |t: &Tp<'_>, x: &[V]| t.bias_act(&x[0], &x[1], zcompute::Activation::Tanh))]
#[case::add_layer_norm("2,3,5;2,3,5;5;5", |t: &Tp<'_>, x: &[V]| {
    let (h, y) = t.add_layer_norm(&x[0], &x[1], &x[2], &x[3], 1e-5)?;
    t.add(&t.tanh(&h)?, &y)
})]
#[case::add_layer_norm_y_only("4,5;4,5;5;5", |t: &Tp<'_>, x: &[V]| Ok(t.add_layer_norm(&x[0], &x[1], &x[2], &x[3], 1e-5)?.1))]
#[case::add_layer_norm_h_only("4,5;4,5;5;5", |t: &Tp<'_>, x: &[V]| Ok(t.add_layer_norm(&x[0], &x[1], &x[2], &x[3], 1e-5)?.0))]
#[case::pool_head_bce_s1("3,1,5;1,5;1", pool_head)]
#[case::pool_head_bce_s12("2,12,5;1,5;1", pool_head)]
#[case::pool_head_bce_s17("3,17,4;1,4;1", pool_head)]
fn fused(#[case] shapes: &str, #[case] f: OpFn) {
    check(&parse(shapes), Dist::Normal, f);
}

fn pool_head(t: &Tp<'_>, x: &[V]) -> zgrad::Result<V> {
    let batch = x[0].shape()[0];
    let y: Vec<f64> = (0..batch).map(|i| [0.0, 1.0, 0.25][i % 3]).collect();
    let y = Var::constant(zcompute::Backend::upload(t.backend(), &y, &[batch])?);
    Ok(t.pool_head_bce(&x[0], &x[1], &x[2], &y)?.0)
}
