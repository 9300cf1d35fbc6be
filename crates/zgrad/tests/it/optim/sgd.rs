//! SGD with momentum, dampening, Nesterov and weight decay in parameter groups (issue 40 item
//! 5): against the float64 oracle of `torch.optim.SGD` (`tests/fixtures/make_sgd.py`) on the
//! CPU (f64, f32) and the simulated device, over the flat buffers and per parameter; PyTorch's
//! refusals; and through the trainer: captured equals eager bitwise, a resumed run equals the
//! run that went on, per-sample equals batched within float32 rounding, queued steps equal
//! the per-step path (a non-finite first step taken back, so the next step starts the buffer
//! again), a checkpoint of one optimiser refused by the other, and training lowers the loss.

use crate::support::fixtures::fixture;
use crate::support::head::{Head, LossKind, classes};
use crate::support::steps::rows_of;
use rstest::rstest;
use zcompute::{CpuBackend, Element, Engine, prelude::*};
use zgrad::{
    AdamWHyper, DecayGroups, GradError, HostTensor, Load, Model, OptimizerKind, ParameterSet, Sgd,
    SgdHyper, StepSource, Task, TrainSchedule, Trainer, TrainerConfig, Var, read_tensors,
};

type Oracle = std::collections::HashMap<String, HostTensor<f64>>;

fn oracle() -> Oracle {
    read_tensors::<f64>(&fixture("sgd_oracle.safetensors"))
        .expect("SGD oracle (make_sgd.py)")
        .tensors
        .into_iter()
        .collect()
}

/// The fixture's parameters, in its order.
const NAMES: [&str; 4] = ["w", "b", "w2", "scale"];
const CONFIGS: [&str; 5] = ["plain", "decay", "momentum", "nesterov", "nesterov_groups"];

fn hyper_of(o: &Oracle, config: &str) -> SgdHyper {
    let h = &o[&format!("{config}.hyper")].data;
    SgdHyper {
        momentum: h[0],
        dampening: h[1],
        nesterov: h[2] != 0.0,
        weight_decay: h[3],
        decay: if h[4] != 0.0 {
            DecayGroups::Matrices
        } else {
            DecayGroups::All
        },
    }
}

/// Four steps of every configuration from the fixture's parameters and gradients, over the
/// flat buffers (`flat`) or separately allocated parameters: the parameters and momentum
/// buffers against the oracle within `tol` (relative to the largest value).
fn against_oracle<B: Ops<T>, T: Element>(b: &B, flat: bool, tol: f64) -> Vec<Vec<T>> {
    let o = oracle();
    let cast = |v: &[f64]| -> Vec<T> { v.iter().map(|&x| T::from_f64(x)).collect() };
    let shapes: Vec<Vec<usize>> = NAMES
        .iter()
        .map(|n| o[&format!("p0.{n}")].shape.clone())
        .collect();
    let mut finals = Vec::new();
    for config in CONFIGS {
        let hyper = hyper_of(&o, config);
        let values: Vec<Vec<T>> = NAMES
            .iter()
            .map(|n| cast(&o[&format!("p0.{n}")].data))
            .collect();
        let params: Vec<Var<B, T>> = if flat {
            ParameterSet::allocate(b, &shapes, Some(&values)).unwrap().1
        } else {
            values
                .iter()
                .zip(&shapes)
                .map(|(v, s)| Var::parameter_from(b, v, s).unwrap())
                .collect()
        };
        assert_eq!(ParameterSet::of(&params).is_some(), flat);
        let mut sgd = Sgd::new(b, &params, hyper).unwrap();
        for (step, &lr) in o["lr"].data.iter().enumerate() {
            for (p, n) in params.iter().zip(NAMES) {
                let g = cast(&o[&format!("g{}.{n}", step + 1)].data);
                b.upload_into(&g, p.grad().unwrap()).unwrap();
            }
            sgd.step(b, &params, lr).unwrap();
        }
        assert_eq!(sgd.step_count(), 4);
        let names: Vec<String> = NAMES.iter().map(|n| n.to_string()).collect();
        let state = sgd.export(b, &names).unwrap();
        assert_eq!(
            state.buffers.len(),
            if hyper.momentum != 0.0 { 4 } else { 0 }
        );
        for (i, n) in NAMES.iter().enumerate() {
            let got = params[i].to_vec(b).unwrap();
            let check = |what: &str, got: &[T], want: &[f64]| {
                let scale = want.iter().fold(1.0f64, |m, v| m.max(v.abs()));
                for (g, w) in got.iter().zip(want) {
                    let err = (g.to_f64() - w).abs() / scale;
                    assert!(
                        err <= tol,
                        "{config} {what}.{n}: {} vs {w} ({err:e})",
                        g.to_f64()
                    );
                }
            };
            check("p", &got, &o[&format!("{config}.p.{n}")].data);
            if let Some(buf) = state.buffers.get(i) {
                assert_eq!(buf.name, *n);
                check("buf", &buf.buf, &o[&format!("{config}.buf.{n}")].data);
            }
            finals.push(got);
        }
    }
    finals
}

#[rstest]
fn sgd_matches_the_pytorch_oracle_on_the_cpu(#[values(true, false)] flat: bool) {
    against_oracle::<_, f64>(&CpuBackend, flat, 1e-14);
    against_oracle::<_, f32>(&CpuBackend, flat, 2e-6);
}

#[test]
fn sgd_matches_the_pytorch_oracle_on_the_simulated_device() {
    let b = Engine::sim(256 << 20).unwrap();
    b.set_poison(true);
    let flat = against_oracle::<_, f32>(&b, true, 2e-6);
    let per_parameter = against_oracle::<_, f32>(&b, false, 2e-6);
    // One launch over the flat buffers and one per parameter: the same bits.
    assert_eq!(flat, per_parameter);
    assert_eq!(flat, against_oracle::<_, f32>(&CpuBackend, true, 2e-6));
}

/// What `torch.optim.SGD` raises a `ValueError` for is a `Config` error, from the optimiser
/// and from the trainer, before anything is allocated or trained.
#[rstest]
#[case::nesterov_without_momentum(0.0, 0.0, true, 0.0)]
#[case::nesterov_with_dampening(0.9, 0.1, true, 0.0)]
#[case::negative_momentum(-0.1, 0.0, false, 0.0)]
#[case::negative_weight_decay(0.9, 0.0, false, -1e-4)]
#[case::nan_dampening(0.9, f64::NAN, false, 0.0)]
fn refused_as_pytorch_refuses(
    #[case] momentum: f64,
    #[case] dampening: f64,
    #[case] nesterov: bool,
    #[case] weight_decay: f64,
) {
    let hyper = SgdHyper {
        momentum,
        dampening,
        nesterov,
        weight_decay,
        decay: DecayGroups::All,
    };
    let b = CpuBackend;
    let p = vec![Var::<_, f32>::parameter_from(&b, &[1.0], &[1]).unwrap()];
    assert!(matches!(Sgd::new(&b, &p, hyper), Err(GradError::Config(_))));
    let m = Head::<_, f32>::new(&b, 3, 1, None, LossKind::Task).unwrap();
    let config = TrainerConfig {
        sgd: Some(hyper),
        ..TrainerConfig::default()
    };
    match Trainer::new(b, m, config) {
        Err(GradError::Config(msg)) => assert!(msg.contains("SGD"), "{msg}"),
        other => panic!("{other:?}"),
    }
}

fn nesterov() -> SgdHyper {
    SgdHyper {
        momentum: 0.9,
        dampening: 0.0,
        nesterov: true,
        weight_decay: 0.05,
        decay: DecayGroups::Matrices,
    }
}

fn sgd_config(schedule: TrainSchedule, capture: bool, hyper: SgdHyper) -> TrainerConfig {
    TrainerConfig {
        schedule,
        capture,
        lr: 0.05,
        sgd: Some(hyper),
        ..TrainerConfig::default()
    }
}

type SimHead = Head<zcompute::CudaBackend<zcompute::SimDriver>, f32>;

fn sim_head(
    config: TrainerConfig,
) -> Trainer<zcompute::CudaBackend<zcompute::SimDriver>, f32, SimHead> {
    let b = Engine::sim(256 << 20).unwrap();
    b.set_poison(true);
    let m = Head::new(&b, 12, 4, Some(Task::class_index(4)), LossKind::Task).unwrap();
    Trainer::new(b, m, config).unwrap()
}

fn bits<B: Capture<f32> + 'static, M: Model<B, f32>>(t: &Trainer<B, f32, M>) -> Vec<u32> {
    t.model()
        .parameters()
        .iter()
        .flat_map(|p| p.to_vec(t.backend()).unwrap())
        .map(f32::to_bits)
        .collect()
}

/// Both schedules: captured equals eager bitwise, and a run resumed from a checkpoint (the
/// momentum buffers under `optim.momentum_buffer.<name>`) equals the run that went on.
#[test]
fn sgd_in_the_trainer_captured_equals_eager_and_resumes_bitwise() {
    let (x, y) = classes(9, 8, 12, 4);
    let dir = tempfile::tempdir().unwrap();
    for schedule in [TrainSchedule::Batched, TrainSchedule::PerSample] {
        let mut runs = Vec::new();
        for capture in [false, true] {
            let make = || sim_head(sgd_config(schedule, capture, nesterov()));
            let mut t = make();
            for _ in 0..2 {
                t.step(StepSource::host(&x, &y, 8)).unwrap();
            }
            let path = dir
                .path()
                .join(format!("{schedule:?}{capture}.safetensors"));
            t.save_checkpoint(&path, Default::default()).unwrap();
            let file = zgrad::CheckpointFile::<f32>::read(&path).unwrap();
            assert!(file.optimizer.contains_key("momentum_buffer.l1.weight"));
            assert_eq!(file.optimizer.len(), 4, "one buffer per parameter");
            assert_eq!(file.optimizer_name().as_deref(), Some("sgd"));
            for _ in 0..3 {
                t.step(StepSource::host(&x, &y, 8)).unwrap();
            }
            let mut resumed = make();
            resumed.load_checkpoint(&path).unwrap();
            assert_eq!(resumed.status().step, 2);
            for _ in 0..3 {
                resumed.step(StepSource::host(&x, &y, 8)).unwrap();
            }
            assert_eq!(
                bits(&resumed),
                bits(&t),
                "{schedule:?} capture {capture}: resume"
            );
            runs.push(bits(&t));
        }
        assert_eq!(
            runs[0], runs[1],
            "{schedule:?}: captured differs from eager"
        );
    }
}

/// The per-sample schedule (gradients accumulated sample by sample) equals the batched one
/// within float32 rounding after five SGD steps with momentum.
#[test]
fn sgd_per_sample_equals_batched_within_rounding() {
    let (x, y) = classes(10, 8, 12, 4);
    let mut out = Vec::new();
    for schedule in [TrainSchedule::Batched, TrainSchedule::PerSample] {
        let mut t = sim_head(sgd_config(schedule, true, nesterov()));
        for _ in 0..5 {
            t.step(StepSource::host(&x, &y, 8)).unwrap();
        }
        out.push(
            t.model()
                .parameters()
                .iter()
                .flat_map(|p| p.to_vec(t.backend()).unwrap())
                .collect::<Vec<f32>>(),
        );
    }
    for (a, b) in out[0].iter().zip(&out[1]) {
        assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{a} vs {b}");
    }
    assert_ne!(out[0], vec![0.0; out[0].len()]);
}

/// Queued steps on the device data set (read back every 4) equal the per-step path bit for
/// bit. Step 1 is not finite: read back at step 8, it and every later queued step were
/// skipped on the device and the count goes back to 0, so the next step is step 1 again and
/// starts the momentum buffer from its direction (with a dampening, a buffer that went on
/// from zero would differ).
#[rstest]
fn queued_sgd_equals_the_per_step_path(
    #[values(TrainSchedule::Batched, TrainSchedule::PerSample)] schedule: TrainSchedule,
    #[values(false, true)] capture: bool,
) {
    let hyper = SgdHyper {
        momentum: 0.8,
        dampening: 0.5,
        nesterov: false,
        weight_decay: 0.01,
        decay: DecayGroups::All,
    };
    let n = 12;
    let (mut x, y) = classes(11, n + 1, 12, 4);
    x[n * 12 + 2] = f32::NAN;
    let rows: Vec<Vec<usize>> = (0..16)
        .map(|k| (0..4).map(|i| (k * 5 + i * 3) % n).collect())
        .collect();
    let mut rows_bad = rows.clone();
    rows_bad[0][1] = n;
    let mut host = sim_head(sgd_config(schedule, capture, hyper));
    let mut dev = sim_head(sgd_config(schedule, capture, hyper));
    dev.load(Load::Training {
        x: &x,
        y: &y,
        n: n + 1,
    })
    .unwrap();
    for r in &rows_bad[..7] {
        assert!(dev.queue(StepSource::loaded(r), 4).unwrap().is_empty());
    }
    let e = dev
        .queue(StepSource::loaded(&rows_bad[7]), 4)
        .expect_err("the read-back finds the NaN");
    assert!(
        matches!(e.cause(), GradError::NonFinite { step: 1, .. }),
        "{e:?}"
    );
    assert_eq!(dev.status().step, 0);
    assert_eq!(bits(&dev), bits(&host), "nothing was applied");
    let (mut want, mut got) = (Vec::new(), Vec::new());
    for r in &rows[8..] {
        let (xs, ys) = rows_of(&x, &y, r);
        want.push(host.step(StepSource::host(&xs, &ys, r.len())).unwrap());
        got.extend(dev.queue(StepSource::loaded(r), 4).unwrap());
    }
    got.extend(dev.drain().unwrap());
    let report_bits = |r: &[zgrad::StepReport]| -> Vec<_> {
        r.iter().map(crate::support::steps::step_bits).collect()
    };
    assert_eq!(report_bits(&got), report_bits(&want));
    assert_eq!(dev.status().step, 8);
    assert_eq!(bits(&dev), bits(&host), "{schedule:?} capture {capture}");
}

/// A checkpoint of AdamW loaded into an SGD trainer, and the reverse (with momentum or
/// without: a file with no optimiser tensors is told apart by its `zgrad.optimizer`), is an
/// `OptimizerMismatch` naming both, and changes nothing.
#[test]
fn a_checkpoint_of_one_optimizer_is_refused_by_the_other() {
    let (x, y) = classes(12, 8, 12, 4);
    let dir = tempfile::tempdir().unwrap();
    let plain = SgdHyper::default();
    let configs = [
        (None, "adamw"),
        (Some(nesterov()), "sgd"),
        (Some(plain), "sgd"),
    ];
    let save = |sgd: Option<SgdHyper>, name: &str| {
        let mut t = sim_head(TrainerConfig {
            sgd,
            adamw: AdamWHyper::default(),
            ..TrainerConfig::default()
        });
        t.step(StepSource::host(&x, &y, 8)).unwrap();
        let path = dir.path().join(format!("{name}.safetensors"));
        t.save_checkpoint(&path, Default::default()).unwrap();
        path
    };
    let paths: Vec<_> = configs
        .iter()
        .enumerate()
        .map(|(i, (sgd, _))| save(*sgd, &i.to_string()))
        .collect();
    for (i, (sgd, now)) in configs.iter().enumerate() {
        for (j, (_, saved)) in configs.iter().enumerate() {
            if now == saved {
                continue;
            }
            let mut t = sim_head(TrainerConfig {
                sgd: *sgd,
                ..TrainerConfig::default()
            });
            let before = bits(&t);
            match t.load_checkpoint(&paths[j]) {
                Err(GradError::OptimizerMismatch {
                    saved: s, now: n, ..
                }) => {
                    assert_eq!((s.as_str(), n.as_str()), (*saved, *now), "{i} <- {j}");
                }
                other => panic!("{i} <- {j}: {other:?}"),
            }
            assert_eq!(bits(&t), before);
            assert_eq!(t.status().step, 0);
        }
    }
    // SGD with momentum from a file of SGD without: the buffers are missing, all named.
    let mut t = sim_head(TrainerConfig {
        sgd: Some(nesterov()),
        ..TrainerConfig::default()
    });
    match t.load_checkpoint(&paths[2]) {
        Err(GradError::ParameterMismatch { missing, .. }) => {
            assert_eq!(missing.len(), 4, "{missing:?}");
            assert!(
                missing[0].starts_with("optim.momentum_buffer."),
                "{missing:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(t.optimizer().kind(), OptimizerKind::Sgd { momentum: true });
}

/// SGD with Nesterov momentum trains a 4-class classifier: the loss falls, on the CPU.
#[test]
fn sgd_training_lowers_the_loss() {
    let (x, y) = classes(13, 64, 12, 4);
    let b = CpuBackend;
    let m = Head::<_, f32>::new(&b, 12, 4, Some(Task::class_index(4)), LossKind::Task).unwrap();
    let mut t = Trainer::new(b, m, sgd_config(TrainSchedule::Batched, false, nesterov())).unwrap();
    let first = t.step(StepSource::host(&x, &y, 64)).unwrap().loss;
    let mut last = first;
    for _ in 0..60 {
        last = t.step(StepSource::host(&x, &y, 64)).unwrap().loss;
    }
    assert!(last < 0.6 * first, "loss {first} -> {last}");
}
