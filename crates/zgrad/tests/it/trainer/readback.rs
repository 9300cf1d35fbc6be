//! The queued steps' read-back comes back asynchronously (issue 21 item 2): a full window's
//! copy to the host is queued and the window before it is read, so the host never waits for
//! the steps it just queued. Over 100 steps (every 8, ending mid-window) the reports equal
//! the per-step path's, bit for bit, in step order, from the call that fills the next window
//! or from the drain; a non-finite step in the first window, in the second, or found by the
//! drain is named, with the model and count as its predecessor left them and training going
//! on; on the simulated device a window boundary neither synchronizes nor drains the stream.

use crate::support::small::{SMALL, labelled};
use crate::support::steps::{param_bits, rows_of, step_bits};
use rstest::rstest;
use zcompute::{Capture, CpuBackend, Engine};
use zdevice::sim::calls;
use zgrad::{
    Applied, GradError, Load, NonFiniteKind, StepReport, StepSource, TrainSchedule, Trainer,
    TrainerConfig, XAsset,
};

const N: usize = 20;

fn learner<B: Capture<f32> + Clone + 'static>(
    b: &B,
    schedule: TrainSchedule,
    capture: bool,
) -> Trainer<B, f32, XAsset<B>> {
    let model = XAsset::init(b, SMALL, 5).expect("model");
    let config = TrainerConfig {
        schedule,
        capture,
        clip_grad: Some(0.5),
        ..TrainerConfig::default()
    };
    Trainer::new(b.clone(), model, config).expect("trainer")
}

/// `n` steps over a data set of `N`: batches of 8, 8 and 4 rows (an epoch's short last
/// batch, which runs eagerly beside a captured step), each epoch in another order.
fn steps(n: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..N).collect();
    let mut out = Vec::new();
    for epoch in 0.. {
        order.rotate_left(7);
        order.swap(epoch % N, (epoch * 3 + 1) % N);
        for chunk in order.chunks(8) {
            if out.len() == n {
                return out;
            }
            out.push(chunk.to_vec());
        }
    }
    out
}

fn bits(r: &[StepReport]) -> Vec<(u64, u64, u64, u64, usize, bool)> {
    r.iter().map(step_bits).collect()
}

/// 100 queued steps, every 8, against a host `step` on the same rows: a call returns the
/// window completed one window before (steps s - 15..=s - 8 at step s, a multiple of 8), the
/// drain the 12 left; the same reports, parameters and count, bit for bit.
fn same_reports<B: Capture<f32> + Clone + 'static>(b: &B, schedule: TrainSchedule, capture: bool) {
    let (x, y) = labelled(SMALL, N, 41);
    let (mut host, mut dev) = (learner(b, schedule, capture), learner(b, schedule, capture));
    dev.load(Load::Training { x: &x, y: &y, n: N })
        .expect("load");
    let (mut want, mut got) = (Vec::new(), Vec::new());
    for (k, rows) in steps(100).iter().enumerate() {
        let s = k as u64 + 1;
        let (xs, ys) = rows_of(&x, &y, rows);
        want.push(
            host.step(StepSource::host(&xs, &ys, rows.len()))
                .expect("host step"),
        );
        let back = dev.queue(StepSource::loaded(rows), 8).expect("queued step");
        let expect: Vec<u64> = if s.is_multiple_of(8) && s >= 16 {
            (s - 15..=s - 8).collect()
        } else {
            Vec::new()
        };
        let steps: Vec<u64> = back.iter().map(|r| r.step).collect();
        assert_eq!(steps, expect, "step {s}: the window one window back");
        got.extend(back);
    }
    assert_eq!(
        dev.status().queued,
        12,
        "the window in flight (89..=96) and 97..=100"
    );
    let rest = dev.drain().expect("drain");
    assert_eq!(rest.first().map(|r| r.step), Some(89));
    got.extend(rest);
    assert_eq!(dev.status().queued, 0);
    assert_eq!(bits(&got), bits(&want), "{schedule:?} capture {capture}");
    assert_eq!(dev.status().step, 100);
    assert_eq!(param_bits(b, &dev), param_bits(b, &host));
}

#[rstest]
fn reports_equal_the_per_step_paths_on_the_simulated_device(
    #[values(TrainSchedule::Batched, TrainSchedule::PerSample)] schedule: TrainSchedule,
    #[values(false, true)] capture: bool,
) {
    let b = Engine::sim(256 << 20).expect("simulated backend");
    b.set_poison(true);
    same_reports(&b, schedule, capture);
}

#[rstest]
fn reports_equal_the_per_step_paths_on_the_cpu(
    #[values(TrainSchedule::Batched, TrainSchedule::PerSample)] schedule: TrainSchedule,
    #[values(false, true)] capture: bool,
) {
    same_reports(&CpuBackend, schedule, capture);
}

/// Where the non-finite step is found.
#[derive(Clone, Copy, Debug)]
enum Found {
    /// Step 2 (first window of four), read when step 8 fills the second: the next window
    /// was queued whole behind it, every step of it skipped.
    NextWindow,
    /// Step 6 (second window), read when step 12 fills the third.
    SecondWindow,
    /// Step 10 (third window), read by the drain at step 13, after the second window's
    /// clean reports came back from step 12.
    Drain,
}

/// A NaN in one sample of step `bad`: the error names the step (and the sample), the
/// parameters are bitwise those after `bad - 1` on the per-step path, the count is `bad - 1`,
/// nothing stays queued, and training goes on from there as the per-step path does.
fn non_finite<B: Capture<f32> + Clone + 'static>(
    b: &B,
    schedule: TrainSchedule,
    capture: bool,
    found: Found,
) {
    let (bad, queue) = match found {
        Found::NextWindow => (2, 8),
        Found::SecondWindow => (6, 12),
        Found::Drain => (10, 13),
    };
    // One more row, with a NaN, used by step `bad` only.
    let (mut x, y) = labelled(SMALL, N + 1, 42);
    let per = x.len() / (N + 1);
    x[N * per + 3] = f32::NAN;
    let mut rows = steps(24);
    rows[bad - 1][1] = N;
    let mut host = learner(b, schedule, capture);
    for r in &rows[..bad - 1] {
        let (xs, ys) = rows_of(&x, &y, r);
        host.step(StepSource::host(&xs, &ys, r.len()))
            .expect("host step");
    }
    let mut dev = learner(b, schedule, capture);
    dev.load(Load::Training {
        x: &x,
        y: &y,
        n: N + 1,
    })
    .expect("load");
    let mut back = Vec::new();
    for r in &rows[..queue - 1] {
        back.extend(
            dev.queue(StepSource::loaded(r), 4)
                .expect("queued: nothing read yet is bad"),
        );
    }
    let e = match found {
        Found::Drain => {
            back.extend(
                dev.queue(StepSource::loaded(&rows[queue - 1]), 4)
                    .expect("queued"),
            );
            dev.drain().expect_err("the drain reads the NaN")
        }
        _ => dev
            .queue(StepSource::loaded(&rows[queue - 1]), 4)
            .expect_err("the read-back finds the NaN"),
    };
    let clean = ((bad - 1) / 4 * 4) as u64;
    assert_eq!(back.last().map_or(0, |r| r.step), clean, "{found:?}");
    assert_eq!(e.applied(), Some(Applied::No), "{e}");
    let step = bad as u64;
    assert!(
        matches!(e.cause(), GradError::NonFinite { step: s, sample: Some(1), kind: NonFiniteKind::Loss } if *s == step),
        "{found:?}: {e:?}"
    );
    assert_eq!(dev.status().step, step - 1);
    assert_eq!(dev.status().queued, 0, "the later steps are dropped");
    assert_eq!(param_bits(b, &dev), param_bits(b, &host), "{found:?}");
    // Going on (rows without the NaN) matches the per-step path, across a window boundary.
    let (mut want, mut got) = (Vec::new(), Vec::new());
    for r in rows.iter().skip(bad).take(9) {
        let (xs, ys) = rows_of(&x, &y, r);
        want.push(
            host.step(StepSource::host(&xs, &ys, r.len()))
                .expect("host step"),
        );
        got.extend(
            dev.queue(StepSource::loaded(r), 4)
                .expect("queued after the error"),
        );
    }
    got.extend(dev.drain().expect("drain"));
    assert_eq!(bits(&got), bits(&want), "{found:?}");
    assert_eq!(param_bits(b, &dev), param_bits(b, &host));
}

#[rstest]
fn a_non_finite_step_is_named_wherever_it_is_read(
    #[values(TrainSchedule::Batched, TrainSchedule::PerSample)] schedule: TrainSchedule,
    #[values(false, true)] capture: bool,
    #[values(Found::NextWindow, Found::SecondWindow, Found::Drain)] found: Found,
) {
    let b = Engine::sim(256 << 20).expect("simulated backend");
    b.set_poison(true);
    non_finite(&b, schedule, capture, found);
}

#[rstest]
fn a_non_finite_step_is_named_on_the_cpu(#[values(Found::NextWindow, Found::Drain)] found: Found) {
    non_finite(&CpuBackend, TrainSchedule::Batched, true, found);
}

/// On the simulated device (a stream's work runs only when something waits for it): from the
/// capture on, no call synchronizes a stream or the context, and each returns with work still
/// queued, the calls that fill a window included, with the window's steps still queued: the
/// window's copy is queued (one asynchronous download) and the window before it read after a
/// wait for its own copy only.
#[rstest]
fn a_window_boundary_does_not_drain_the_stream(
    #[values(TrainSchedule::Batched, TrainSchedule::PerSample)] schedule: TrainSchedule,
) {
    let b = Engine::sim(256 << 20).expect("simulated backend");
    let (dev, engine) = (b.device(), b.device().stream());
    let (x, y) = labelled(SMALL, N, 43);
    let mut t = learner(&b, schedule, true);
    t.load(Load::Training { x: &x, y: &y, n: N }).expect("load");
    let rows: Vec<Vec<usize>> = steps(24).into_iter().filter(|r| r.len() == 8).collect();
    t.queue(StepSource::loaded(&rows[0]), 4)
        .expect("step 1 (the capture)");
    for (k, r) in rows[1..13].iter().enumerate() {
        let s = k + 2;
        dev.driver().clear_op_log();
        let back = t.queue(StepSource::loaded(r), 4).expect("queued");
        let log = dev.driver().op_log();
        let count = |call: &str| log.iter().filter(|op| op.call == call).count();
        for call in [
            calls::STREAM_SYNCHRONIZE,
            calls::CTX_SYNCHRONIZE,
            calls::EVENT_SYNCHRONIZE,
            calls::MEMCPY_DTOH,
        ] {
            assert_eq!(count(call), 0, "step {s}: {call}");
        }
        let boundary = s % 4 == 0;
        // Each step queues one op at least: at a boundary the window's four steps are still
        // queued (a read-back that drained the stream would leave only what follows it).
        let least = if boundary { 4 } else { 1 };
        assert!(
            dev.driver().pending_ops(engine) >= least,
            "step {s}: its work is still queued"
        );
        assert_eq!(
            count(calls::MEMCPY_DTOH_ASYNC),
            usize::from(boundary),
            "step {s}"
        );
        assert_eq!(
            back.len(),
            if boundary && s > 4 { 4 } else { 0 },
            "step {s}"
        );
    }
    let rest: Vec<u64> = t.drain().expect("drain").iter().map(|r| r.step).collect();
    assert_eq!(rest, (9..=13).collect::<Vec<_>>());
}

/// A window's copy that fails to be queued (the simulated driver refuses the download):
/// the steps not read back may or may not have run, so the error says `Applied::Maybe`
/// naming the window's first step, nothing stays queued, and the trainer refuses further
/// steps until its state is restored.
#[test]
fn a_failed_read_back_leaves_the_window_unknown() {
    let b = Engine::sim(256 << 20).expect("simulated backend");
    let (x, y) = labelled(SMALL, N, 44);
    let mut t = learner(&b, TrainSchedule::Batched, true);
    t.load(Load::Training { x: &x, y: &y, n: N }).expect("load");
    let rows = steps(8);
    for r in &rows[..7] {
        t.queue(StepSource::loaded(r), 4).expect("queued");
    }
    b.device()
        .driver()
        .fail_nth(calls::MEMCPY_DTOH_ASYNC, 1, zdevice::CuCode::INVALID_VALUE);
    let e = t
        .queue(StepSource::loaded(&rows[7]), 4)
        .expect_err("the copy fails");
    assert_eq!(e.applied(), Some(Applied::Maybe), "{e}");
    assert!(matches!(e, GradError::Step { step: 5, .. }), "{e:?}");
    assert_eq!(t.status().queued, 0);
    let refused = t
        .queue(StepSource::loaded(&rows[0]), 4)
        .expect_err("state unknown");
    assert!(
        matches!(refused.cause(), GradError::StateUnknown { step: 5 }),
        "{refused:?}"
    );
}

/// The same on CUDA device 0: the reports and parameters equal the per-step path's, and a
/// non-finite step found after the next window was queued is named with the model as its
/// predecessor left it.
#[cfg(feature = "gpu")]
mod gpu {
    use super::Found;
    use rstest::rstest;
    use zgrad::TrainSchedule;

    use crate::support::steps::poisoned_gpu as gpu;

    #[rstest]
    fn reports_equal_the_per_step_paths_on_the_gpu(
        #[values(TrainSchedule::Batched, TrainSchedule::PerSample)] schedule: TrainSchedule,
    ) {
        super::same_reports(&gpu(), schedule, true);
    }

    #[rstest]
    fn a_non_finite_step_is_named_on_the_gpu(
        #[values(Found::NextWindow, Found::Drain)] found: Found,
    ) {
        super::non_finite(&gpu(), TrainSchedule::Batched, true, found);
    }
}

/// A longer read-back window after captured steps makes the device history anew; the captured
/// step must then write its rows there (not into the history it was captured with), so the
/// reports stay a host `step`'s, bit for bit (captured, it reported zeros and shifted steps).
#[rstest]
#[case::captured(true)]
#[case::eager(false)]
fn a_longer_window_after_captured_steps_reports_the_steps(#[case] capture: bool) {
    let b = Engine::sim(256 << 20).expect("simulated backend");
    let (x, y) = labelled(SMALL, N, 47);
    let mut host = learner(&b, TrainSchedule::Batched, capture);
    let mut dev = learner(&b, TrainSchedule::Batched, capture);
    dev.load(Load::Training { x: &x, y: &y, n: N })
        .expect("load");
    let (mut want, mut got) = (Vec::new(), Vec::new());
    for (k, rows) in steps(9).iter().enumerate() {
        let (xs, ys) = rows_of(&x, &y, rows);
        want.push(
            host.step(StepSource::host(&xs, &ys, rows.len()))
                .expect("host step"),
        );
        // Windows of 1 for the first steps, then of 4.
        let every = if k < 4 { 1 } else { 4 };
        got.extend(
            dev.queue(StepSource::loaded(rows), every)
                .expect("queued step"),
        );
    }
    got.extend(dev.drain().expect("drain"));
    assert_eq!(bits(&got), bits(&want));
    assert_eq!(param_bits(&b, &dev), param_bits(&b, &host));
}
