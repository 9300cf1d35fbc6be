//! Optimiser utilities: zero_grad, the global norm and clipping by it, SGD, and AdamW's
//! [lr, t] slot (a schedule's rate reaches the kernel through device memory).

use zcompute::{Backend, CpuBackend};
use zgrad::StepSource;
use zgrad::{AdamW, AdamWHyper, Sgd, SgdHyper, Var, clip_grad_norm, grad_norm, zero_grad};

const B: CpuBackend = CpuBackend;

fn params() -> Vec<Var<CpuBackend, f64>> {
    let a = Var::parameter_from(&B, &[1.0, 2.0], &[2]).unwrap();
    let b = Var::parameter_from(&B, &[3.0], &[1]).unwrap();
    B.upload_into(&[3.0, 4.0], a.grad().unwrap()).unwrap();
    B.upload_into(&[12.0], b.grad().unwrap()).unwrap();
    vec![a, b]
}

fn grads(ps: &[Var<CpuBackend, f64>]) -> Vec<f64> {
    ps.iter()
        .flat_map(|p| B.download(p.grad().unwrap()).unwrap())
        .collect()
}

#[test]
fn global_norm_over_every_gradient() {
    let ps = params();
    assert_eq!(
        B.download(&grad_norm(&B, &ps).unwrap()).unwrap(),
        vec![13.0]
    );
}

#[test]
fn clipping_scales_to_the_max_norm_and_returns_the_old_norm() {
    let ps = params();
    let norm = clip_grad_norm(&B, &ps, 6.5).unwrap();
    assert_eq!(B.download(&norm).unwrap(), vec![13.0]);
    let g = grads(&ps);
    let scale = 6.5 / (13.0 + 1e-6);
    for (got, want) in g.iter().zip([3.0, 4.0, 12.0]) {
        assert!((got - want * scale).abs() < 1e-12);
    }
    // Below the limit nothing changes.
    let ps = params();
    clip_grad_norm(&B, &ps, 100.0).unwrap();
    assert_eq!(grads(&ps), vec![3.0, 4.0, 12.0]);
}

#[test]
fn zero_grad_zeroes() {
    let ps = params();
    zero_grad(&B, &ps).unwrap();
    assert_eq!(grads(&ps), vec![0.0; 3]);
}

#[test]
fn sgd_with_weight_decay() {
    let ps = params();
    let hyper = SgdHyper {
        weight_decay: 0.5,
        ..SgdHyper::default()
    };
    Sgd::new(&B, &ps, hyper)
        .unwrap()
        .step(&B, &ps, 0.1)
        .unwrap();
    // p - lr (g + wd p)
    assert_eq!(
        ps[0].to_vec(&B).unwrap(),
        vec![1.0 - 0.1 * 3.5, 2.0 - 0.1 * 5.0]
    );
    assert_eq!(ps[1].to_vec(&B).unwrap(), vec![3.0 - 0.1 * 13.5]);
    assert_eq!(ps[0].version(), 1);
}

#[test]
fn adamw_reads_rate_and_step_from_its_slot() {
    let ps = params();
    let mut opt = AdamW::new(
        &B,
        &ps,
        AdamWHyper {
            weight_decay: 0.0,
            ..AdamWHyper::default()
        },
    )
    .unwrap();
    opt.step(&B, &ps, 0.1).unwrap();
    // Step 1 from zero moments moves each parameter by lr * g / (|g| + eps): about lr.
    let p = ps[0].to_vec(&B).unwrap();
    assert!(
        (p[0] - 0.9).abs() < 1e-6 && (p[1] - 1.9).abs() < 1e-6,
        "{p:?}"
    );
    let slot = B.download(&opt.tensors().slot).unwrap();
    assert_eq!(slot, vec![0.1, 1.0, 0.0], "[lr, t, gate]");
    opt.step(&B, &ps, 0.05).unwrap();
    assert_eq!(
        B.download(&opt.tensors().slot).unwrap(),
        vec![0.05, 2.0, 0.0]
    );
    assert_eq!(opt.step_count(), 2);
    let state = opt.export(&B, &["a".into(), "b".into()]).unwrap();
    assert_eq!(state.step, 2);
    assert_eq!(state.moments[1].name, "b");
    let mut fresh = AdamW::new(&B, &ps, AdamWHyper::default()).unwrap();
    fresh.import(&B, &state).unwrap();
    assert_eq!(fresh.export(&B, &["a".into(), "b".into()]).unwrap(), state);
}

/// AdamW's parameter groups (`DecayGroups::Matrices`): no weight decay on biases and norms
/// (rank < 2), the decay on matrices, over the flat buffers (one launch per run of one group)
/// and per parameter alike, bitwise.
#[test]
fn adamw_groups_leave_biases_and_norms_undecayed() {
    use zgrad::DecayGroups;
    use zgrad::model::{Init, ParameterBuilder};
    let hyper = |decay| AdamWHyper {
        weight_decay: 0.5,
        decay,
        ..AdamWHyper::default()
    };
    let mut p = ParameterBuilder::new(1);
    p.add("w", &[2, 3], Init::Constant(1.0))
        .add("b", &[2], Init::Constant(1.0))
        .add("norm.weight", &[3], Init::Constant(1.0))
        .add("w2", &[3, 1], Init::Constant(1.0));
    let mut out = Vec::new();
    for flat in [true, false] {
        for decay in [DecayGroups::All, DecayGroups::Matrices] {
            let ps: Vec<Var<CpuBackend, f64>> = if flat {
                p.build(&B).unwrap().into_iter().map(|(_, v)| v).collect()
            } else {
                [&[2usize, 3][..], &[2], &[3], &[3, 1]]
                    .iter()
                    .map(|s| Var::parameter_from(&B, &vec![1.0; s.iter().product()], s).unwrap())
                    .collect()
            };
            assert_eq!(zgrad::ParameterSet::of(&ps).is_some(), flat);
            // Zero gradients: AdamW's own term is 0, only the decay moves a parameter.
            let mut opt = AdamW::new(&B, &ps, hyper(decay)).unwrap();
            opt.step(&B, &ps, 0.1).unwrap();
            let values: Vec<Vec<f64>> = ps.iter().map(|p| p.to_vec(&B).unwrap()).collect();
            let decayed = 1.0 - 0.1 * 0.5;
            let want = |matrix: bool| {
                if matrix || decay == DecayGroups::All {
                    decayed
                } else {
                    1.0
                }
            };
            for (v, matrix) in values.iter().zip([true, false, false, true]) {
                assert!(
                    v.iter().all(|&x| x == want(matrix)),
                    "{decay:?} flat {flat}: {values:?}"
                );
            }
            out.push(values);
        }
    }
    assert_eq!(out[0..2], out[2..4], "flat and per-parameter differ");
}

/// A trainer with AdamW groups: captured equals eager bitwise in both schedules, and a run
/// resumed from a checkpoint equals the run that went on, bitwise.
#[test]
fn adamw_groups_in_the_trainer_captured_and_resumed_bitwise() {
    use crate::support::head::{Head, LossKind, classes};
    use zgrad::{DecayGroups, Model, Task, TrainSchedule, Trainer, TrainerConfig};
    let config = |schedule, capture| TrainerConfig {
        schedule,
        capture,
        lr: 1e-2,
        adamw: AdamWHyper {
            weight_decay: 0.1,
            decay: DecayGroups::Matrices,
            ..AdamWHyper::default()
        },
        ..TrainerConfig::default()
    };
    let (x, y) = classes(9, 8, 12, 4);
    let bits = |t: &Trainer<_, f32, Head<_, f32>>| -> Vec<u32> {
        t.model()
            .parameters()
            .iter()
            .flat_map(|p| p.to_vec(t.backend()).unwrap())
            .map(f32::to_bits)
            .collect()
    };
    let make = |schedule, capture| {
        let b = zcompute::Engine::sim(256 << 20).unwrap();
        let m = Head::new(&b, 12, 4, Some(Task::class_index(4)), LossKind::Task).unwrap();
        Trainer::new(b, m, config(schedule, capture)).unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    for schedule in [TrainSchedule::Batched, TrainSchedule::PerSample] {
        let mut runs = Vec::new();
        for capture in [false, true] {
            let mut t = make(schedule, capture);
            for _ in 0..2 {
                t.step(StepSource::host(&x, &y, 8)).unwrap();
            }
            let path = dir
                .path()
                .join(format!("{schedule:?}{capture}.safetensors"));
            t.save_checkpoint(&path, Default::default()).unwrap();
            for _ in 0..2 {
                t.step(StepSource::host(&x, &y, 8)).unwrap();
            }
            let mut resumed = make(schedule, capture);
            resumed.load_checkpoint(&path).unwrap();
            for _ in 0..2 {
                resumed.step(StepSource::host(&x, &y, 8)).unwrap();
            }
            assert_eq!(
                bits(&resumed),
                bits(&t),
                "{schedule:?} capture {capture}: resume differs"
            );
            runs.push(bits(&t));
        }
        assert_eq!(
            runs[0], runs[1],
            "{schedule:?}: captured differs from eager"
        );
    }
}

/// SGD with momentum and Nesterov: the oracle, the trainer's paths, checkpoints.
mod sgd;
