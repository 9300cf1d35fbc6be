//! How many collectives a data-parallel step makes: the parameters are views of one flat
//! buffer, so the start broadcasts it once and every optimiser step all-reduces the flat
//! gradient buffer once (plus the loss), in both schedules, eager and captured. Counted with a
//! collective that records its calls (world 2, sums nothing: the numbers are not the point).

use rstest::rstest;
use std::cell::RefCell;
use std::rc::Rc;
use zcomm::{Collective, RankInfo};
use zcompute::{BTensor, CpuBackend};
use zgrad::{TrainSchedule, Trainer, TrainerConfig, XAsset, XAssetConfig};

type Cpu = CpuBackend;

#[derive(Default)]
struct Recorder {
    calls: RefCell<Vec<(&'static str, usize)>>,
}

impl Collective<Cpu, f32> for Recorder {
    fn info(&self) -> RankInfo {
        RankInfo {
            rank: 0,
            world: 2,
            local_rank: 0,
        }
    }

    fn all_reduce_sum(&self, _b: &Cpu, x: &BTensor<Cpu, f32>, _step: u64) -> zcomm::Result<()> {
        self.calls.borrow_mut().push(("all_reduce", x.numel()));
        Ok(())
    }

    fn broadcast(
        &self,
        _b: &Cpu,
        x: &BTensor<Cpu, f32>,
        _root: usize,
        _step: u64,
    ) -> zcomm::Result<()> {
        self.calls.borrow_mut().push(("broadcast", x.numel()));
        Ok(())
    }

    fn synchronize(&self, _b: &Cpu) -> zcomm::Result<()> {
        Ok(())
    }
}

#[rstest]
#[case::batched_eager(TrainSchedule::Batched, false)]
#[case::batched_captured(TrainSchedule::Batched, true)]
#[case::per_sample_eager(TrainSchedule::PerSample, false)]
#[case::per_sample_captured(TrainSchedule::PerSample, true)]
fn one_collective_over_the_flat_gradient_buffer_per_step(
    #[case] schedule: TrainSchedule,
    #[case] capture: bool,
) {
    let cfg = XAssetConfig {
        features: 5,
        scales: 3,
        width: 8,
        heads: 2,
        ff: 12,
        layers: 1,
    };
    let b = CpuBackend;
    let model = XAsset::init(&b, cfg, 3).expect("model");
    let flat = model.flat_gradients().expect("flat buffer").numel();
    let recorder = Rc::new(Recorder::default());
    let config = TrainerConfig {
        schedule,
        capture,
        ..TrainerConfig::default()
    };
    let mut t = Trainer::new(b, model, config)
        .and_then(|t| t.with_collective(recorder.clone()))
        .expect("trainer");
    assert_eq!(
        recorder.calls.borrow().as_slice(),
        &[("broadcast", flat)],
        "the start broadcasts the flat parameter buffer once"
    );
    recorder.calls.borrow_mut().clear();
    let batch = 4;
    let x: Vec<f32> = (0..batch * 3 * 5)
        .map(|i| (i as f32 * 0.37).sin())
        .collect();
    let y: Vec<f32> = (0..batch).map(|i| (i % 2) as f32).collect();
    for _ in 0..2 {
        t.train_batch(&x, &y, batch).expect("step");
    }
    let grads = recorder
        .calls
        .borrow()
        .iter()
        .filter(|(op, n)| *op == "all_reduce" && *n == flat)
        .count();
    let per_param = recorder
        .calls
        .borrow()
        .iter()
        .filter(|(op, n)| *op == "all_reduce" && *n > 1 && *n != flat)
        .count();
    // Two steps, one gradient all-reduce each (the CPU backend's graph reruns its body on
    // replay, so a captured step calls the trait every time too).
    assert_eq!(grads, 2, "calls: {:?}", recorder.calls.borrow());
    assert_eq!(per_param, 0, "calls: {:?}", recorder.calls.borrow());
}
