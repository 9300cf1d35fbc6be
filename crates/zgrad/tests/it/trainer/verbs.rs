//! The trainer's verbs over every source: a step on rows of the loaded data set read back at
//! once is the host step on the same rows, bit for bit; sources that `queue` does not take,
//! and a step read back at once while queued steps are unread, are refused with nothing
//! applied.

use crate::support::small::{SMALL, labelled};
use crate::support::steps::{param_bits, rows_of, step_bits};
use rstest::rstest;
use zcompute::{Capture, CpuBackend, Engine};
use zgrad::{Applied, GradError, Load, StepSource, TrainSchedule, Trainer, TrainerConfig, XAsset};

const N: usize = 12;

fn learner<B: Capture<f32> + Clone + 'static>(
    b: &B,
    schedule: TrainSchedule,
    capture: bool,
) -> Trainer<B, f32, XAsset<B>> {
    let model = XAsset::init(b, SMALL, 9).expect("model");
    let config = TrainerConfig {
        schedule,
        capture,
        ..TrainerConfig::default()
    };
    Trainer::new(b.clone(), model, config).expect("trainer")
}

/// Six steps of 4, 4 and 3 rows (a short batch beside a captured step), from the host and
/// from the loaded set: the same reports and parameters, nothing left queued.
fn loaded_equals_host<B: Capture<f32> + Clone + 'static>(
    b: &B,
    schedule: TrainSchedule,
    capture: bool,
) {
    let (x, y) = labelled(SMALL, N, 17);
    let (mut host, mut dev) = (learner(b, schedule, capture), learner(b, schedule, capture));
    dev.load(Load::Training { x: &x, y: &y, n: N })
        .expect("load");
    let batches: [&[usize]; 6] = [
        &[0, 5, 2, 7],
        &[1, 3, 9, 11],
        &[4, 6, 8],
        &[10, 0, 1, 2],
        &[3, 4, 5, 6],
        &[7, 8, 9],
    ];
    for rows in batches {
        let (xs, ys) = rows_of(&x, &y, rows);
        let want = host
            .step(StepSource::host(&xs, &ys, rows.len()))
            .expect("host step");
        let got = dev.step(StepSource::loaded(rows)).expect("loaded step");
        assert_eq!(
            step_bits(&got),
            step_bits(&want),
            "{schedule:?} capture {capture}"
        );
        assert_eq!(dev.status().queued, 0, "read back at once");
    }
    assert_eq!(dev.status().step, 6);
    assert_eq!(param_bits(b, &dev), param_bits(b, &host));
}

#[rstest]
fn a_step_on_loaded_rows_is_the_host_step(
    #[values(TrainSchedule::Batched, TrainSchedule::PerSample)] schedule: TrainSchedule,
    #[values(false, true)] capture: bool,
) {
    let b = Engine::sim(256 << 20).expect("simulated backend");
    loaded_equals_host(&b, schedule, capture);
    loaded_equals_host(&CpuBackend, schedule, capture);
}

fn refused_with_nothing_applied(e: &GradError, what: &str) {
    assert_eq!(e.applied(), Some(Applied::No), "{what}: {e}");
    assert!(matches!(e.cause(), GradError::BadInput(_)), "{what}: {e}");
}

#[test]
fn queueing_host_rows_or_the_held_batch_is_refused() {
    let b = Engine::sim(256 << 20).expect("simulated backend");
    let (x, y) = labelled(SMALL, 4, 3);
    let mut t = learner(&b, TrainSchedule::Batched, true);
    t.step(StepSource::host(&x, &y, 4)).expect("captured step");
    let before = param_bits(&b, &t);
    let e = t.queue(StepSource::host(&x, &y, 4), 2).unwrap_err();
    refused_with_nothing_applied(&e, "host rows");
    let e = t.queue(StepSource::held(|_| {}), 2).unwrap_err();
    refused_with_nothing_applied(&e, "the held batch");
    assert_eq!((t.status().step, t.status().queued), (1, 0));
    assert_eq!(param_bits(&b, &t), before);
}

/// A step read back at once while queued steps are not read back yet would return before
/// them: refused until `drain`, then taken.
#[test]
fn a_step_with_queued_steps_unread_waits_for_the_drain() {
    let b = Engine::sim(256 << 20).expect("simulated backend");
    let (x, y) = labelled(SMALL, N, 5);
    let mut t = learner(&b, TrainSchedule::Batched, false);
    t.load(Load::Training { x: &x, y: &y, n: N }).expect("load");
    assert!(
        t.queue(StepSource::loaded(&[0, 1, 2]), 4)
            .expect("queued")
            .is_empty()
    );
    let (xs, ys) = rows_of(&x, &y, &[3, 4]);
    for e in [
        t.step(StepSource::loaded(&[3, 4])).unwrap_err(),
        t.step(StepSource::host(&xs, &ys, 2)).unwrap_err(),
    ] {
        refused_with_nothing_applied(&e, "queued steps unread");
    }
    assert_eq!((t.status().step, t.status().queued), (1, 1));
    assert_eq!(t.drain().expect("drain").len(), 1);
    assert_eq!(t.step(StepSource::loaded(&[3, 4])).expect("step").step, 2);
}

/// `restore` puts back the parameters and optimiser state it is given: the step after a
/// restore to the state before it repeats it bit for bit. Values of another count or size are
/// refused (`BadInput`) with nothing written and the step count as it was.
#[test]
fn restore_rewinds_the_trainer_and_refuses_values_of_other_sizes() {
    let b = CpuBackend;
    let mut t = learner(&b, TrainSchedule::Batched, false);
    let (x, y) = labelled(SMALL, N, 5);
    let names: Vec<String> = t
        .model()
        .named_parameters()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    let values = |t: &Trainer<CpuBackend, f32, XAsset<CpuBackend>>| -> Vec<Vec<f32>> {
        let ps = t.model().named_parameters();
        ps.iter()
            .map(|(_, p)| p.to_vec(&b).expect("values"))
            .collect()
    };
    let (start, state) = (values(&t), t.optimizer().export(&b, &names).expect("state"));
    let first = t.step(StepSource::host(&x, &y, N)).expect("step");
    let after = param_bits(&b, &t);

    let mut short = start.clone();
    short[0].pop();
    for bad in [&short[..], &start[1..]] {
        let e = t.restore(bad, &state).expect_err("refused");
        assert!(matches!(e, GradError::BadInput(_)), "{e}");
        assert_eq!(param_bits(&b, &t), after, "nothing written");
        assert_eq!(t.status().step, 1);
    }

    t.restore(&start, &state).expect("restore");
    assert_eq!(t.status().step, 0);
    let again = t.step(StepSource::host(&x, &y, N)).expect("step again");
    assert_eq!(step_bits(&again), step_bits(&first));
    assert_eq!(param_bits(&b, &t), after);
}

/// An optimiser state that does not fit (a moment of another shape; another optimiser's
/// state) is refused before anything is written, as values of another size are: the
/// parameters and the step count as they were, and the next step trains as it would have.
#[test]
fn restore_refuses_a_state_that_does_not_fit_before_writing_anything() {
    let b = CpuBackend;
    let (x, y) = labelled(SMALL, N, 5);
    let names: Vec<String> = learner(&b, TrainSchedule::Batched, false)
        .model()
        .named_parameters()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    let fresh = || learner(&b, TrainSchedule::Batched, false);
    // What an untouched trainer does in its second step: the reference.
    let mut reference = fresh();
    reference.step(StepSource::host(&x, &y, N)).expect("step");
    let second = reference.step(StepSource::host(&x, &y, N)).expect("step");

    let mut t = fresh();
    let start: Vec<Vec<f32>> = t
        .model()
        .named_parameters()
        .iter()
        .map(|(_, p)| p.to_vec(&b).expect("values"))
        .collect();
    let zgrad::OptimizerState::AdamW(good) = t.optimizer().export(&b, &names).expect("state")
    else {
        panic!("the default optimiser is AdamW")
    };
    t.step(StepSource::host(&x, &y, N)).expect("step");
    let after = param_bits(&b, &t);
    let mut misshapen = good.clone();
    let last = misshapen.moments.last_mut().expect("a moment");
    last.shape.push(1);
    let other = zgrad::OptimizerState::Sgd(zgrad::SgdState {
        step: 0,
        buffers: Vec::new(),
    });
    for bad in [zgrad::OptimizerState::AdamW(misshapen), other] {
        let e = t.restore(&start, &bad).expect_err("refused");
        assert!(
            matches!(
                e,
                GradError::BadInput(_) | GradError::OptimizerMismatch { .. }
            ),
            "{e}"
        );
        assert_eq!(param_bits(&b, &t), after, "nothing written: {e}");
        assert_eq!(t.status().step, 1);
    }
    let r = t.step(StepSource::host(&x, &y, N)).expect("the next step");
    assert_eq!(step_bits(&r), step_bits(&second));
}
