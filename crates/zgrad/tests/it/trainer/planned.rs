//! A plan of the rows to come (`Load::Order`, issue 21): a queued batched step on the
//! device data set that takes the plan's next chunk finds its indices and `[lr, t]` on the
//! device, put up with the rest of its read-back window by one copy at the window's first
//! planned step; every other step uploads its own (two copies) and ends the plan. Whatever
//! the plan, the steps are a host `step`'s on the same rows, bit for bit: across windows and
//! epochs, an epoch's short last batch, a step off the plan, and a non-finite step read back
//! after later planned steps were queued (the step count wound back, the plan made again).

use crate::support::small::{SMALL, labelled};
use crate::support::steps::{param_bits, rows_of, step_bits};
use rstest::rstest;
use zcompute::{Capture, CpuBackend, CudaBackend, Engine, SimDriver};

type Sim = CudaBackend<SimDriver>;
use zdevice::sim::calls;
use zgrad::{
    Applied, GradError, Load, LrSchedule, NonFiniteKind, StepReport, StepSource, TrainSchedule,
    Trainer, TrainerConfig, XAsset,
};

const N: usize = 20;
const BATCH: usize = 8;
const EVERY: usize = 4;

fn learner<B: Capture<f32> + Clone + 'static>(b: &B, capture: bool) -> Trainer<B, f32, XAsset<B>> {
    let model = XAsset::init(b, SMALL, 5).expect("model");
    let config = TrainerConfig {
        schedule: TrainSchedule::Batched,
        capture,
        clip_grad: Some(0.5),
        // A learning rate that changes every step: a planned row carries its step's.
        lr_schedule: LrSchedule::Cosine {
            warmup_steps: 3,
            total_steps: 40,
            min_ratio: 0.1,
        },
        ..TrainerConfig::default()
    };
    Trainer::new(b.clone(), model, config).expect("trainer")
}

/// Epoch `e`'s order of the `N` rows.
fn epoch_order(e: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..N).collect();
    order.rotate_left((3 + 7 * e) % N);
    order.swap(e % N, (e * 5 + 2) % N);
    order
}

fn bits(r: &[StepReport]) -> Vec<(u64, u64, u64, u64, usize, bool)> {
    r.iter().map(step_bits).collect()
}

fn htod(b: &Sim) -> u64 {
    let sim = b.device().driver();
    sim.call_count(calls::MEMCPY_HTOD_ASYNC) + sim.call_count(calls::MEMCPY_HTOD)
}

/// Four epochs of three steps (8, 8 and 4 rows) in windows of 4, planned at each epoch's
/// start: the same reports and parameters as a host `step`, and host-to-device copies only
/// where a window or an epoch's plan starts (one there); without a plan, two a step.
fn planned_run(b: &Sim, capture: bool, planned: bool) -> Vec<u64> {
    let (x, y) = labelled(SMALL, N, 51);
    let mut host = learner(b, capture);
    let mut dev = learner(b, capture);
    dev.load(Load::Training { x: &x, y: &y, n: N })
        .expect("load");
    let (mut want, mut got, mut copies) = (Vec::new(), Vec::new(), Vec::new());
    for e in 0..4 {
        let order = epoch_order(e);
        if planned {
            dev.load(Load::Order {
                order: &order,
                batch: BATCH,
            })
            .expect("plan");
        }
        for rows in order.chunks(BATCH) {
            let (xs, ys) = rows_of(&x, &y, rows);
            want.push(
                host.step(StepSource::host(&xs, &ys, rows.len()))
                    .expect("host step"),
            );
            let before = htod(b);
            got.extend(
                dev.queue(StepSource::loaded(rows), EVERY)
                    .expect("queued step"),
            );
            copies.push(htod(b) - before);
        }
    }
    got.extend(dev.drain().expect("drain"));
    assert_eq!(
        bits(&got),
        bits(&want),
        "planned {planned} capture {capture}"
    );
    assert_eq!(param_bits(b, &dev), param_bits(b, &host));
    copies
}

#[rstest]
fn planned_steps_upload_once_a_window(#[values(false, true)] capture: bool) {
    let b = Engine::sim(256 << 20).expect("simulated backend");
    b.set_poison(true);
    let copies = planned_run(&b, capture, true);
    // Steps 1..=12: windows start at 1, 5, 9; epochs (plans) at 1, 4, 7, 10.
    let want: Vec<u64> = (1..=12)
        .map(|s| u64::from(s % EVERY == 1 || s % 3 == 1))
        .collect();
    assert_eq!(copies, want);
    let unplanned = planned_run(&b, capture, false);
    assert_eq!(
        unplanned,
        vec![2; 12],
        "without a plan: indices and [lr, t]"
    );
}

/// Three planned epochs against a host `step`, bit for bit (the CPU backend, the GPU).
fn planned_equal_train_batch<B: Capture<f32> + Clone + 'static>(b: &B) {
    let (x, y) = labelled(SMALL, N, 52);
    let mut host = learner(b, true);
    let mut dev = learner(b, true);
    dev.load(Load::Training { x: &x, y: &y, n: N })
        .expect("load");
    let (mut want, mut got) = (Vec::new(), Vec::new());
    for e in 0..3 {
        let order = epoch_order(e);
        dev.load(Load::Order {
            order: &order,
            batch: BATCH,
        })
        .expect("plan");
        for rows in order.chunks(BATCH) {
            let (xs, ys) = rows_of(&x, &y, rows);
            want.push(
                host.step(StepSource::host(&xs, &ys, rows.len()))
                    .expect("host step"),
            );
            got.extend(
                dev.queue(StepSource::loaded(rows), EVERY)
                    .expect("queued step"),
            );
        }
    }
    got.extend(dev.drain().expect("drain"));
    assert_eq!(bits(&got), bits(&want));
    assert_eq!(param_bits(b, &dev), param_bits(b, &host));
}

#[test]
fn planned_steps_equal_train_batch_on_the_cpu() {
    planned_equal_train_batch(&CpuBackend);
}

#[test]
fn planned_steps_equal_train_batch_on_the_simulated_device() {
    let b = Engine::sim(256 << 20).expect("simulated backend");
    b.set_poison(true);
    planned_equal_train_batch(&b);
}

/// The same on CUDA device 0, captured.
#[cfg(feature = "gpu")]
mod gpu {
    use crate::support::steps::poisoned_gpu as gpu;

    #[test]
    fn planned_steps_equal_train_batch_on_the_gpu() {
        super::planned_equal_train_batch(&gpu());
    }
}

/// A step that takes other rows than the plan's next uploads its own and ends the plan: the
/// steps after it upload theirs too, and all stay a host `step`'s.
#[rstest]
fn a_step_off_the_plan_uploads_its_own(#[values(false, true)] capture: bool) {
    let b = Engine::sim(256 << 20).expect("simulated backend");
    let (x, y) = labelled(SMALL, N, 53);
    let mut host = learner(&b, capture);
    let mut dev = learner(&b, capture);
    dev.load(Load::Training { x: &x, y: &y, n: N })
        .expect("load");
    let order = epoch_order(1);
    dev.load(Load::Order {
        order: &order,
        batch: BATCH,
    })
    .expect("plan");
    let mut other = order[BATCH..2 * BATCH].to_vec();
    other.swap(0, 1);
    let steps = [
        &order[..BATCH],
        &other[..],
        &order[BATCH..2 * BATCH],
        &order[2 * BATCH..],
    ];
    let (mut want, mut got, mut copies) = (Vec::new(), Vec::new(), Vec::new());
    for rows in steps {
        let (xs, ys) = rows_of(&x, &y, rows);
        want.push(
            host.step(StepSource::host(&xs, &ys, rows.len()))
                .expect("host step"),
        );
        let before = htod(&b);
        got.extend(
            dev.queue(StepSource::loaded(rows), EVERY)
                .expect("queued step"),
        );
        copies.push(htod(&b) - before);
    }
    got.extend(dev.drain().expect("drain"));
    assert_eq!(copies, [1, 2, 2, 2]);
    assert_eq!(bits(&got), bits(&want));
    assert_eq!(param_bits(&b, &dev), param_bits(&b, &host));
}

/// A NaN in step 6 (second window), read back when step 12 fills the third: the error names
/// step 6 with the model as step 5 left it; planned again from step 6's successor's rows,
/// the steps (their step numbers and learning rates those of the wound-back count) are
/// a host `step`'s.
#[rstest]
fn a_non_finite_planned_step_rewinds_and_plans_again(#[values(false, true)] capture: bool) {
    let b = Engine::sim(256 << 20).expect("simulated backend");
    b.set_poison(true);
    let (mut x, y) = labelled(SMALL, N + 1, 54);
    let per = x.len() / (N + 1);
    x[N * per + 2] = f32::NAN;
    let mut order: Vec<usize> = (0..5).flat_map(epoch_order).collect();
    order[5 * BATCH + 1] = N;
    let chunks: Vec<&[usize]> = order.chunks(BATCH).collect();
    let mut host = learner(&b, capture);
    for rows in &chunks[..5] {
        let (xs, ys) = rows_of(&x, &y, rows);
        host.step(StepSource::host(&xs, &ys, rows.len()))
            .expect("host step");
    }
    let mut dev = learner(&b, capture);
    dev.load(Load::Training {
        x: &x,
        y: &y,
        n: N + 1,
    })
    .expect("load");
    dev.load(Load::Order {
        order: &order,
        batch: BATCH,
    })
    .expect("plan");
    for rows in &chunks[..11] {
        dev.queue(StepSource::loaded(rows), EVERY)
            .expect("nothing read yet is bad");
    }
    let e = dev
        .queue(StepSource::loaded(chunks[11]), EVERY)
        .expect_err("the read-back finds the NaN");
    assert_eq!(e.applied(), Some(Applied::No), "{e}");
    assert!(
        matches!(
            e.cause(),
            GradError::NonFinite {
                step: 6,
                sample: Some(1),
                kind: NonFiniteKind::Loss
            }
        ),
        "{e:?}"
    );
    assert_eq!(dev.status().step, 5);
    assert_eq!(param_bits(&b, &dev), param_bits(&b, &host));
    // Step 6 again on the chunks after the bad one, planned anew.
    let rest = &order[6 * BATCH..];
    dev.load(Load::Order {
        order: rest,
        batch: BATCH,
    })
    .expect("plan again");
    let (mut want, mut got) = (Vec::new(), Vec::new());
    for rows in rest.chunks(BATCH).take(7) {
        let (xs, ys) = rows_of(&x, &y, rows);
        want.push(
            host.step(StepSource::host(&xs, &ys, rows.len()))
                .expect("host step"),
        );
        let before = htod(&b);
        got.extend(
            dev.queue(StepSource::loaded(rows), EVERY)
                .expect("queued after the error"),
        );
        assert!(htod(&b) - before <= 1, "planned: one copy a window at most");
    }
    got.extend(dev.drain().expect("drain"));
    assert_eq!(got.first().map(|r| r.step), Some(6));
    assert_eq!(bits(&got), bits(&want));
    assert_eq!(param_bits(&b, &dev), param_bits(&b, &host));
}

#[test]
fn a_plan_is_refused_without_data_a_batch_or_its_rows() {
    let b = Engine::sim(256 << 20).expect("simulated backend");
    let mut t = learner(&b, false);
    let no_data = t
        .load(Load::Order {
            order: &[0, 1],
            batch: 2,
        })
        .expect_err("nothing loaded");
    assert!(matches!(no_data, GradError::BadInput(_)), "{no_data:?}");
    let (x, y) = labelled(SMALL, N, 55);
    t.load(Load::Training { x: &x, y: &y, n: N }).expect("load");
    for (order, batch) in [(vec![0, 1], 0), (vec![0, N], 2)] {
        let e = t
            .load(Load::Order {
                order: &order,
                batch,
            })
            .expect_err("refused");
        assert!(matches!(e, GradError::BadInput(_)), "{e:?}");
    }
    t.load(Load::Order {
        order: &[],
        batch: 4,
    })
    .expect("an empty plan plans nothing");
}

/// A queued step whose update fails after its tail moved the window's cursor on the device
/// (eager, the update's launch refused): the host did not count the step, so its next step
/// must not read the row after the one it put up. After the state is restored from a
/// checkpoint, the steps (planned or not) are a host `step`'s on the same rows, bit for bit.
#[rstest]
fn a_step_failing_after_its_tail_leaves_the_cursor_where_the_host_puts_rows(
    #[values(false, true)] planned: bool,
) {
    let b = Engine::sim(256 << 20).expect("simulated backend");
    let sim = b.device().driver();
    let (x, y) = labelled(SMALL, N, 56);
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("state.safetensors");
    let order: Vec<usize> = (0..3).flat_map(epoch_order).collect();
    let chunks: Vec<&[usize]> = order.chunks(BATCH).collect();
    let mut host = learner(&b, false);
    let mut dev = learner(&b, false);
    dev.load(Load::Training { x: &x, y: &y, n: N })
        .expect("load");
    for rows in &chunks[..2] {
        let (xs, ys) = rows_of(&x, &y, rows);
        host.step(StepSource::host(&xs, &ys, rows.len()))
            .expect("host step");
        dev.queue(StepSource::loaded(rows), EVERY)
            .expect("queued step");
    }
    dev.drain().expect("drain");
    dev.save_checkpoint(&path, std::collections::HashMap::new())
        .expect("save");
    // Step 3 queued (the window's row 0), then step 4 with its last launch (the update,
    // after the tail) refused.
    dev.queue(StepSource::loaded(chunks[2]), EVERY)
        .expect("step 3");
    let before = sim.call_count(calls::LAUNCH_KERNEL);
    dev.queue(StepSource::loaded(chunks[2]), EVERY)
        .expect("a step to count the launches");
    let launches = sim.call_count(calls::LAUNCH_KERNEL) - before;
    sim.fail_nth(
        calls::LAUNCH_KERNEL,
        launches,
        zdevice::CuCode::INVALID_VALUE,
    );
    dev.queue(StepSource::loaded(chunks[3]), EVERY)
        .expect_err("the update's launch fails");
    assert!(dev.optimizer().unknown_step().is_some());
    dev.load_checkpoint(&path).expect("restore step 2's state");
    let rest = &order[2 * BATCH..];
    if planned {
        dev.load(Load::Order {
            order: rest,
            batch: BATCH,
        })
        .expect("plan");
    }
    let (mut want, mut got) = (Vec::new(), Vec::new());
    for rows in rest.chunks(BATCH).take(6) {
        let (xs, ys) = rows_of(&x, &y, rows);
        want.push(
            host.step(StepSource::host(&xs, &ys, rows.len()))
                .expect("host step"),
        );
        got.extend(
            dev.queue(StepSource::loaded(rows), EVERY)
                .expect("queued after the restore"),
        );
    }
    got.extend(dev.drain().expect("drain"));
    // The two steps queued before the failure come back first (they ran).
    assert_eq!(
        got.iter().take(2).map(|r| r.step).collect::<Vec<_>>(),
        [3, 4]
    );
    assert_eq!(bits(&got[2..]), bits(&want));
    assert_eq!(param_bits(&b, &dev), param_bits(&b, &host));
}
