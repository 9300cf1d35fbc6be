//! The validation layer's table: per op, bad inputs (wrong ranks and shapes, shapes that do not
//! broadcast, lengths that do not match, aliased in-place operands, broadcast destinations,
//! out-of-range axes, empty axes with no value, outputs too large to exist, NaN and out-of-range
//! scalars) run on the CPU backend and on a CUDA backend, and each must give exactly the
//! expected error on both, leaving every argument as it was. A backend that skipped a check
//! runs the op (an `Ok`), fails later with another error, or panics: the row fails either way.
//!
//! Element types need no row: a `Backend<f32>` only takes its own storage's tensors, so a
//! mismatched dtype does not compile (a `compile_fail` doctest in `src/validate/mod.rs`).

use super::bodies::{View, input};
use zcompute::{
    Activation, AdamWConfig, BTensor, Backend, BinaryOp, ComputeError, CpuBackend, CudaBackend,
    LayerNormBackward, MatmulOpts, ReduceOp,
};
use zdevice::Driver;

/// How one argument of a row is made.
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    /// A fresh dense tensor of this shape.
    T(&'static [usize]),
    /// A tensor of the first shape seen broadcast to the second (it reaches elements twice).
    Bcast(&'static [usize], &'static [usize]),
    /// Argument `i` again: the very same tensor.
    Same(usize),
    /// `len` entries of axis 0 of argument `i` from `start`: a view sharing its storage.
    Part(usize, usize, usize),
    /// The elements of the flat argument `i` from `start`, in this shape: a view sharing its
    /// storage (a parameter's gradient in a flat gradient buffer).
    View(usize, usize, &'static [usize]),
    /// An optional argument left out.
    Absent,
}

/// The op a row calls, with its non-tensor arguments.
#[derive(Clone, Copy, Debug)]
pub enum Op {
    Upload(usize, &'static [usize]),
    /// `upload_into` of this many values into argument 0.
    UploadInto(usize),
    Full(&'static [usize]),
    Fill,
    CopyInto,
    Binary(BinaryOp),
    Reduce(ReduceOp, usize),
    Softmax,
    SoftmaxBackward,
    LayerNorm(f32),
    LayerNormBackward,
    Matmul(MatmulOpts),
    Bce,
    AdamW(AdamWConfig<f32>),
    // The fusion families' ops (`LinearOps`, `NormOps`, `PooledLossOps`).
    /// `bias_act(x, bias)`.
    BiasAct(Activation),
    /// `tanh_backward(g, y)`.
    TanhBackward,
    /// `linear(x, w, bias)`.
    Linear(Activation),
    /// `linear_add(x, w, bias, residual)`.
    LinearAdd(Activation),
    /// `linear_param_grads_into(g, x, dw, db?)`.
    LinearParamGradsInto,
    /// `linear_backward_into(g, x, w?, (act, y?), (dw, db?))`.
    LinearBackwardInto(Activation),
    /// `add_layer_norm(a, b, weight?, bias?, eps)`.
    AddLayerNorm(f32),
    /// `layer_norm_backward_add(g, residual?, x, mean, rstd, weight?)`, both gradients wanted.
    LayerNormBackwardAdd,
    /// `layer_norm_backward_into(g, residual?, x, mean, rstd, weight?, dw?, db?)`, the input's
    /// gradient wanted.
    LayerNormBackwardInto,
    /// `pool_head_bce(h, weight, bias, targets)`.
    PoolHeadBce,
    /// `pool_head_bce_backward(g, h, weight, logits, targets)`.
    PoolHeadBceBackward,
}

pub const ADAMW: AdamWConfig<f32> = AdamWConfig {
    beta1: 0.9,
    beta2: 0.999,
    eps: 1e-8,
    weight_decay: 0.01,
};

/// Elements beyond which an argument is not downloaded to check it was left alone (the
/// broadcast views that ask for absurd outputs have 2^31 elements over one stored value).
const SNAPSHOT_LIMIT: usize = 1 << 16;

/// The argument tensors of a row, made the same way on any backend.
fn build<B: Backend<f32>>(b: &B, args: &[Arg]) -> Vec<Option<BTensor<B, f32>>> {
    let mut out: Vec<Option<BTensor<B, f32>>> = args
        .iter()
        .enumerate()
        .map(|(i, a)| match *a {
            Arg::T(shape) => Some(input(b, shape, View::Dense, 40 + i as u64, -1.0, 1.0)),
            Arg::Bcast(shape, to) => Some(
                input(b, shape, View::Dense, 40 + i as u64, -1.0, 1.0)
                    .broadcast_to(to)
                    .expect("a valid broadcast"),
            ),
            Arg::Same(_) | Arg::Part(..) | Arg::View(..) | Arg::Absent => None,
        })
        .collect();
    for (i, a) in args.iter().enumerate() {
        out[i] = match *a {
            Arg::Same(j) => out[j].clone(),
            Arg::Part(j, start, len) => Some(
                out[j]
                    .as_ref()
                    .expect("a part of a made tensor")
                    .narrow(0, start, len)
                    .expect("a valid part"),
            ),
            Arg::View(j, start, shape) => Some(
                out[j]
                    .as_ref()
                    .expect("a view of a made tensor")
                    .narrow(0, start, shape.iter().product())
                    .and_then(|t| t.reshape(shape))
                    .expect("a valid view"),
            ),
            _ => out[i].take(),
        };
    }
    out
}

/// Runs `op` on `b`, returning its error and the arguments' values before and after.
fn run<B: zcompute::Ops<f32>>(
    b: &B,
    op: Op,
    args: &[Arg],
) -> (ComputeError, Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let ts = build(b, args);
    let snapshot = |ts: &[Option<BTensor<B, f32>>]| -> Vec<Vec<f32>> {
        ts.iter()
            .flatten()
            .filter(|t| t.numel() <= SNAPSHOT_LIMIT)
            .map(|t| b.download(t).expect("download an argument"))
            .collect()
    };
    let before = snapshot(&ts);
    let t = |i: usize| ts[i].as_ref().expect("a tensor argument");
    let opt = |i: usize| ts.get(i).and_then(Option::as_ref);
    let data = |n: usize| vec![0.5f32; n];
    let result: zcompute::Result<()> = match op {
        Op::Upload(len, shape) => b.upload(&data(len), shape).map(drop),
        Op::UploadInto(len) => b.upload_into(&data(len), t(0)),
        Op::Full(shape) => b.full(shape, 1.0).map(drop),
        Op::Fill => b.fill(t(0), 1.0),
        Op::CopyInto => b.copy_into(t(0), t(1)),
        Op::Binary(o) => b.binary(o, t(0), t(1)).map(drop),
        Op::Reduce(o, axis) => b.reduce(o, t(0), axis, false).map(drop),
        Op::Softmax => b.softmax_last(t(0)).map(drop),
        Op::SoftmaxBackward => b.softmax_backward(t(0), t(1)).map(drop),
        Op::LayerNorm(eps) => b.layer_norm(t(0), opt(1), opt(2), eps).map(drop),
        Op::LayerNormBackward => b
            .layer_norm_backward(t(0), t(1), t(2), t(3), opt(4), [true, true])
            .map(drop),
        Op::Matmul(opts) => b.matmul(t(0), t(1), opts).map(drop),
        Op::Bce => b.bce_with_logits_mean(t(0), t(1)).map(drop),
        Op::AdamW(cfg) => b.adamw_step(t(0), t(1), t(2), t(3), t(4), &cfg),
        Op::BiasAct(act) => b.bias_act(t(0), t(1), act).map(drop),
        Op::TanhBackward => b.tanh_backward(t(0), t(1)).map(drop),
        Op::Linear(act) => b.linear(t(0), t(1), t(2), act).map(drop),
        Op::LinearAdd(act) => b.linear_add(t(0), t(1), t(2), act, t(3)).map(drop),
        Op::LinearParamGradsInto => b.linear_param_grads_into(t(0), t(1), t(2), opt(3)),
        Op::LinearBackwardInto(act) => b
            .linear_backward_into(t(0), t(1), opt(2), (act, opt(3)), (t(4), opt(5)))
            .map(drop),
        Op::AddLayerNorm(eps) => b.add_layer_norm(t(0), t(1), opt(2), opt(3), eps).map(drop),
        Op::LayerNormBackwardAdd => b
            .layer_norm_backward_add(
                &LayerNormBackward {
                    g: t(0),
                    residual: opt(1),
                    x: t(2),
                    mean: t(3),
                    rstd: t(4),
                    weight: opt(5),
                },
                [true, true],
            )
            .map(drop),
        Op::LayerNormBackwardInto => b
            .layer_norm_backward_into(
                &LayerNormBackward {
                    g: t(0),
                    residual: opt(1),
                    x: t(2),
                    mean: t(3),
                    rstd: t(4),
                    weight: opt(5),
                },
                true,
                opt(6),
                opt(7),
            )
            .map(drop),
        Op::PoolHeadBce => b.pool_head_bce(t(0), t(1), t(2), t(3)).map(drop),
        Op::PoolHeadBceBackward => b
            .pool_head_bce_backward(t(0), t(1), t(2), t(3), t(4))
            .map(drop),
    };
    let err = match result {
        Ok(()) => panic!("{} accepted {op:?} on {args:?}", b.name()),
        Err(e) => e,
    };
    let after = snapshot(&ts);
    (err, before, after)
}

/// One row: the expected error, exactly (variant, op name and every field), from the CPU
/// backend and from `gpu`, and no argument changed on either.
pub fn check<D: Driver>(gpu: &CudaBackend<D>, op: Op, args: &[Arg], expected: &ComputeError) {
    // Compared through `Debug`, which prints every field: exact, and independent of whether
    // the error type implements `PartialEq`.
    let want = format!("{expected:?}");
    let (cpu_err, cpu_before, cpu_after) = run(&CpuBackend, op, args);
    assert_eq!(format!("{cpu_err:?}"), want, "cpu: {op:?} on {args:?}");
    assert_eq!(cpu_before, cpu_after, "cpu: {op:?} changed an argument");
    let (dev_err, dev_before, dev_after) = run(gpu, op, args);
    assert_eq!(format!("{dev_err:?}"), want, "cuda: {op:?} on {args:?}");
    assert_eq!(dev_before, dev_after, "cuda: {op:?} changed an argument");
}

pub fn dims(shape: &[usize]) -> Box<[usize]> {
    shape.into()
}
