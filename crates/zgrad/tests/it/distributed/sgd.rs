//! Data parallel with SGD (momentum, Nesterov, weight decay in groups): two simulated ranks at
//! a global batch equal one rank at that batch within rounding, every rank the same bits, in
//! both schedules, eager and captured (each rank updates its own momentum buffers from the
//! all-reduced gradient).

use super::simulated::{ranks, rel};
use crate::support::head::{Head, LossKind, classes};
use rstest::rstest;
use std::rc::Rc;
use zcomm::SimCollective;
use zcompute::{CudaBackend, Engine, SimDriver};
use zgrad::{
    DecayGroups, Model, SgdHyper, StepSource, Task, TrainSchedule, Trainer, TrainerConfig,
};

fn config(schedule: TrainSchedule, capture: bool) -> TrainerConfig {
    TrainerConfig {
        schedule,
        capture,
        lr: 0.05,
        clip_grad: Some(1.0),
        sgd: Some(SgdHyper {
            momentum: 0.9,
            nesterov: true,
            weight_decay: 0.01,
            decay: DecayGroups::Matrices,
            ..SgdHyper::default()
        }),
        ..TrainerConfig::default()
    }
}

/// Six steps on global batches of 7 (unequal shards on two ranks); the parameters after.
fn train(b: &CudaBackend<SimDriver>, comm: Option<SimCollective>, cfg: TrainerConfig) -> Vec<f32> {
    let m = Head::new(b, 12, 4, Some(Task::class_index(4)), LossKind::Task).unwrap();
    let mut t = Trainer::new(b.clone(), m, cfg).unwrap();
    if let Some(c) = comm {
        t = t.with_collective(Rc::new(c)).unwrap();
    }
    for step in 0..6 {
        let (x, y) = classes(20 + step, 7, 12, 4);
        t.step(StepSource::host(&x, &y, 7)).unwrap();
    }
    assert_eq!(t.status().step, 6);
    t.model()
        .parameters()
        .iter()
        .flat_map(|p| p.to_vec(t.backend()).unwrap())
        .collect()
}

#[rstest]
fn two_ranks_match_one_rank_with_sgd(
    #[values(TrainSchedule::Batched, TrainSchedule::PerSample)] schedule: TrainSchedule,
    #[values(false, true)] capture: bool,
) {
    let cfg = config(schedule, capture);
    let one = train(&Engine::sim(256 << 20).unwrap(), None, cfg);
    let seen = ranks(2, move |b, c| train(b, Some(c), cfg));
    for (r, s) in seen.iter().enumerate() {
        let d = rel(s, &one);
        assert!(d <= 1e-5, "{schedule:?} capture {capture} rank {r}: {d:e}");
        assert_eq!(s, &seen[0], "rank {r} differs from rank 0");
    }
    assert_ne!(
        one,
        train(
            &Engine::sim(256 << 20).unwrap(),
            None,
            TrainerConfig::default()
        )
    );
}
