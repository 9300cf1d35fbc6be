//! Device work of the optimiser around a batched step, counted on the simulated device's op log
//! (kernel launches, memsets, device copies and products: every call that queues work on the
//! stream, which a captured step turns into one graph node each). Parameters and gradients live
//! in one flat buffer each, so zero_grad, the global norm, clipping, AdamW's gate and its
//! update cost a fixed handful of launches whatever the parameter count (issue 12), instead of
//! several per parameter.

// The launch counts belong in the test's output (reported before/after in issue 12).
#![allow(clippy::print_stderr)]

use zcompute::{Backend, CudaBackend};
use zdevice::sim::calls;
use zdevice::sim::{Effect, OpRecord};
use zdevice::{Device, DeviceConfig, SimConfig, SimDriver};
use zgrad::{
    AdamW, AdamWHyper, StepSource, Tape, TrainSchedule, Trainer, TrainerConfig, Var, XAsset,
    XAssetConfig, clip_grad_norm, grad_norm, zero_grad,
};
use zmem::{Arena, ArenaConfig};

fn mock() -> CudaBackend<SimDriver> {
    let sim = SimDriver::new(SimConfig::with_capacity(512 << 20));
    zcompute::cuda::twins::register(&sim);
    let dev = Device::open(
        sim,
        DeviceConfig {
            blas_workspace_bytes: 0,
            ..DeviceConfig::default()
        },
    )
    .expect("the simulated device opens");
    let arena = Arena::new(dev, ArenaConfig::default()).expect("arena");
    CudaBackend::new(arena).expect("backend")
}

fn small() -> XAssetConfig {
    XAssetConfig {
        features: 7,
        scales: 3,
        width: 8,
        heads: 2,
        ff: 12,
        layers: 1,
    }
}

/// Calls that queue work on a stream (one graph node each when captured).
fn is_device_work(r: &OpRecord) -> bool {
    [
        calls::LAUNCH_KERNEL,
        calls::MEMSET_D32_ASYNC,
        calls::MEMSET_D8_ASYNC,
        calls::MEMCPY_DTOD_ASYNC,
        calls::GEMM_STRIDED_BATCHED,
    ]
    .contains(&r.call)
}

/// Device work queued by `f`.
fn launches<R>(b: &CudaBackend<SimDriver>, f: impl FnOnce() -> R) -> (usize, R) {
    let driver = b.device().driver();
    driver.clear_op_log();
    let r = f();
    let n = driver.op_log().iter().filter(|r| is_device_work(r)).count();
    (n, r)
}

fn batch(c: &XAssetConfig, n: usize) -> (Vec<f32>, Vec<f32>) {
    let x = (0..n * c.scales * c.features)
        .map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0)
        .collect();
    let y = (0..n).map(|i| (i % 2) as f32).collect();
    (x, y)
}

#[test]
fn zero_grad_norm_clip_gate_and_adamw_are_a_few_launches_over_the_flat_buffers() {
    let b = mock();
    let c = small();
    let model = XAsset::init(&b, c, 3).expect("model");
    let params = model.parameters();
    let (x, y) = batch(&c, 4);
    b.begin_step().expect("step");
    let xs = Var::constant(b.upload(&x, &[4, c.scales, c.features]).expect("x"));
    let ys = Var::constant(b.upload(&y, &[4]).expect("y"));
    let tape = Tape::new(&b);
    let (loss, _) = model.loss(&tape, &xs, &ys).expect("loss");
    tape.backward(&loss).expect("backward");
    drop(tape);

    let mut opt = AdamW::new(&b, &params, AdamWHyper::default()).expect("adamw");
    let (norm_launches, norm) = launches(&b, || grad_norm(&b, &params).expect("norm"));
    let (clip_launches, _) = launches(&b, || clip_grad_norm(&b, &params, 1e-3).expect("clip"));
    let tensors = opt.tensors();
    let (gate_launches, ()) = launches(&b, || {
        tensors.write_gate(&b, loss.value(), &norm).expect("gate")
    });
    opt.prepare(&b, 1e-3).expect("prepare");
    // The gate of a finite step is 0: the update runs.
    let (adamw_launches, ()) = launches(&b, || tensors.apply(&b, &params).expect("apply"));
    let (zero_launches, ()) = launches(&b, || zero_grad(&b, &params).expect("zero_grad"));
    b.end_step().expect("end");
    eprintln!(
        "{} parameters: zero_grad {zero_launches}, grad_norm {norm_launches}, \
         clip_grad_norm {clip_launches}, write_gate {gate_launches}, AdamW {adamw_launches}",
        params.len()
    );
    assert_eq!(
        zero_launches, 1,
        "zero_grad: one memset of the flat gradient buffer"
    );
    assert_eq!(
        norm_launches, 1,
        "grad_norm: both reduction passes in one launch (its last block sums the partials)"
    );
    assert_eq!(
        clip_launches, 2,
        "clip_grad_norm: the norm's one, one scaling"
    );
    assert_eq!(gate_launches, 1, "write_gate: one launch");
    assert_eq!(adamw_launches, 1, "AdamW: one launch over the flat buffers");
    for p in &params {
        assert_eq!(p.version(), 1, "every parameter's version bumped once");
    }
}

/// Device work of one eager forward and backward of the batch `x`, `y` (4 samples).
fn forward_backward_launches(
    b: &CudaBackend<SimDriver>,
    model: &XAsset<CudaBackend<SimDriver>, f32>,
    c: &XAssetConfig,
    x: &[f32],
    y: &[f32],
) -> usize {
    launches(b, || {
        b.begin_step().expect("step");
        let xs = Var::constant(b.upload(x, &[4, c.scales, c.features]).expect("x"));
        let ys = Var::constant(b.upload(y, &[4]).expect("y"));
        let tape = Tape::new(b);
        let (loss, _) = model.loss(&tape, &xs, &ys).expect("loss");
        tape.backward(&loss).expect("backward");
        drop(tape);
        b.end_step().expect("end");
    })
    .0
}

/// A whole eager batched step (trainer): its launches beyond the forward and backward of the
/// same batch are the optimiser's handful, at most 6 (zero_grad 1, norm 2, stats 2, AdamW 1).
#[test]
fn a_batched_step_adds_a_fixed_handful_of_launches_to_forward_and_backward() {
    let b = mock();
    let c = small();
    let (x, y) = batch(&c, 4);
    let model = XAsset::init(&b, c, 3).expect("model");
    let fwd_bwd = forward_backward_launches(&b, &model, &c, &x, &y);
    let cfg = TrainerConfig {
        schedule: TrainSchedule::Batched,
        capture: false,
        ..TrainerConfig::default()
    };
    let mut t = Trainer::new(b.clone(), model, cfg).expect("trainer");
    let (step, _) = launches(&b, || t.step(StepSource::host(&x, &y, 4)).expect("step"));
    eprintln!(
        "eager batched step: {step} launches, forward+backward {fwd_bwd}, optimiser tail {}",
        step - fwd_bwd
    );
    assert!(
        step - fwd_bwd <= 6,
        "optimiser tail of a batched step: {} launches",
        step - fwd_bwd
    );
}

/// Calls captured into the graph of a captured batched step (the trainer's whole step as one
/// graph): beyond the forward and backward of the same batch, the optimiser's handful plus the
/// gate, at most 7.
#[test]
fn a_captured_batched_step_adds_a_fixed_handful_of_nodes_to_forward_and_backward() {
    let b = mock();
    let c = small();
    let (x, y) = batch(&c, 4);
    let model = XAsset::init(&b, c, 3).expect("model");
    let fwd_bwd = forward_backward_launches(&b, &model, &c, &x, &y);
    let cfg = TrainerConfig {
        schedule: TrainSchedule::Batched,
        capture: true,
        ..TrainerConfig::default()
    };
    let mut t = Trainer::new(b.clone(), model, cfg).expect("trainer");
    let driver = b.device().driver();
    driver.clear_op_log();
    let report = t.step(StepSource::host(&x, &y, 4)).expect("step");
    assert!(report.captured, "the step was captured");
    let nodes: usize = driver
        .op_log()
        .iter()
        .filter_map(|r| match r.effect {
            Effect::Captured(n) => Some(n),
            _ => None,
        })
        .sum();
    let captured_calls = driver
        .op_log()
        .iter()
        .filter(|r| matches!(r.effect, Effect::Captured(_)))
        .count();
    eprintln!(
        "captured batched step: {captured_calls} captured calls ({nodes} graph nodes: the \
         simulator counts a product as 4), forward+backward {fwd_bwd} calls, optimiser tail {}",
        captured_calls - fwd_bwd
    );
    assert!(
        captured_calls - fwd_bwd <= 7,
        "optimiser tail of a captured batched step: {} calls",
        captured_calls - fwd_bwd
    );
}

/// Backward adds a parameter's gradient into its buffer (a view of the flat gradient buffer)
/// in place: one launch, no sum allocated and copied back.
#[test]
fn a_leaf_gradient_accumulates_in_one_launch() {
    let b = mock();
    let model = XAsset::init(&b, small(), 3).expect("model");
    let w = model.blocks[0].ff.f1.weight.clone();
    let n = w.value().numel();
    let seed: Vec<f32> = (0..n).map(|i| i as f32 / 7.0).collect();
    b.begin_step().expect("step");
    for round in 1..=2 {
        let s = b.upload(&seed, w.shape()).expect("seed");
        let tape = Tape::new(&b);
        let (count, ()) = launches(&b, || tape.backward_with(&w, s).expect("backward"));
        assert_eq!(
            count, 1,
            "round {round}: one launch accumulates the gradient"
        );
        let g = b.download(w.grad().expect("leaf")).expect("grad");
        for (i, (got, s)) in g.iter().zip(&seed).enumerate() {
            assert_eq!(*got, s * round as f32, "element {i} after {round} rounds");
        }
    }
    b.end_step().expect("end");
}

/// Attention's four QK-norm gradients go straight into their buffers: when the four
/// parameters' gradient buffers are adjacent views of the flat buffer (dh a multiple of 64, as
/// at the default size), the backward is two launches (its kernel and one column reduction
/// adding into all four buffers; three before, with a separate add), and with four separate
/// buffers one reduction each, to the same values.
#[test]
fn adjacent_parameter_gradients_of_one_node_accumulate_in_one_launch() {
    const DH: usize = 64;
    let b = mock();
    let norm: Vec<Vec<f32>> = (0..4)
        .map(|p| {
            (0..DH)
                .map(|i| 1.0 + ((p * DH + i) % 7) as f32 / 10.0)
                .collect()
        })
        .collect();
    let qkv: Vec<f32> = (0..3 * 3 * DH)
        .map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0)
        .collect();
    let seed: Vec<f32> = (0..3 * DH).map(|i| ((i * 13 % 17) as f32) / 8.0).collect();
    let run = |params: &[Var<CudaBackend<SimDriver>, f32>]| {
        b.begin_step().expect("step");
        let tape = Tape::new(&b);
        let x = Var::constant(b.upload(&qkv, &[1, 3, 3 * DH]).expect("qkv"));
        let [qw, qb, kw, kb] = [0, 1, 2, 3].map(|i| &params[i]);
        let y = tape
            .qk_norm_attention(&x, qw, qb, kw, kb, 1, 1e-5)
            .expect("attention");
        let s = b.upload(&seed, y.shape()).expect("seed");
        let (count, ()) = launches(&b, || tape.backward_with(&y, s).expect("backward"));
        let grads: Vec<Vec<f32>> = params
            .iter()
            .map(|p| b.download(p.grad().expect("leaf")).expect("grad"))
            .collect();
        b.end_step().expect("end");
        (count, grads)
    };
    let separate: Vec<_> = norm
        .iter()
        .map(|v| Var::parameter_from(&b, v, &[DH]).expect("parameter"))
        .collect();
    let shapes = vec![vec![DH]; 4];
    let (_set, flat) = zgrad::ParameterSet::allocate(&b, &shapes, Some(&norm)).expect("flat");
    let (separate_count, separate_grads) = run(&separate);
    let (flat_count, flat_grads) = run(&flat);
    eprintln!(
        "attention backward: {separate_count} launches with separate parameter buffers, {flat_count} with adjacent views of one"
    );
    assert_eq!(
        flat_count, 2,
        "the kernel and one reduction adding into the flat buffer"
    );
    assert_eq!(flat_count + 3, separate_count, "four reductions became one");
    assert_eq!(flat_grads, separate_grads);
}

/// The pooled head's weight and bias gradients go straight into their buffers (adjacent views
/// of the flat buffer, or buffers of their own): a small batch's backward is the one kernel
/// (three launches before: the kernel and an add into each buffer, the bias's buffer being
/// 64-aligned and so not adjacent to a weight of 40), to the same values.
#[test]
fn the_pooled_heads_gradients_accumulate_from_its_backward_kernel() {
    const D: usize = 40;
    const B: usize = 2;
    const S: usize = 5;
    let b = mock();
    let h: Vec<f32> = (0..B * S * D)
        .map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0)
        .collect();
    let w: Vec<f32> = (0..D)
        .map(|i| ((i * 13 % 17) as f32) / 40.0 - 0.2)
        .collect();
    let params_init = vec![w.clone(), vec![0.1]];
    let run = |params: &[Var<CudaBackend<SimDriver>, f32>]| {
        b.begin_step().expect("step");
        let tape = Tape::new(&b);
        let x = Var::constant(b.upload(&h, &[B, S, D]).expect("h"));
        let y = Var::constant(b.upload(&[1.0, 0.0], &[B]).expect("targets"));
        let (loss, _logits) = tape
            .pool_head_bce(&x, &params[0], &params[1], &y)
            .expect("head");
        let seed = b.upload(&[1.0], &[]).expect("seed");
        let (count, ()) = launches(&b, || tape.backward_with(&loss, seed).expect("backward"));
        let grads: Vec<Vec<f32>> = params
            .iter()
            .map(|p| b.download(p.grad().expect("leaf")).expect("grad"))
            .collect();
        b.end_step().expect("end");
        (count, grads)
    };
    let separate = vec![
        Var::parameter_from(&b, &w, &[1, D]).expect("weight"),
        Var::parameter_from(&b, &[0.1], &[1]).expect("bias"),
    ];
    let shapes = vec![vec![1, D], vec![1]];
    let (_set, flat) =
        zgrad::ParameterSet::allocate(&b, &shapes, Some(&params_init)).expect("flat");
    let (separate_count, separate_grads) = run(&separate);
    let (flat_count, flat_grads) = run(&flat);
    eprintln!(
        "pooled head backward: {separate_count} launches with separate parameter buffers, {flat_count} with adjacent views of one"
    );
    assert_eq!(
        flat_count, 1,
        "the backward kernel adds into the flat buffer"
    );
    assert_eq!(
        separate_count, 1,
        "the backward kernel adds into both buffers"
    );
    assert_eq!(flat_grads, separate_grads);
    assert!(
        flat_grads[0].iter().any(|&v| v != 0.0),
        "a weight gradient arrived"
    );
}
