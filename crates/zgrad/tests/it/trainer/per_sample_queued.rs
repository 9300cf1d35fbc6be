//! The per-sample schedule queued with nothing read back per step (issue 21 items 2 and 4):
//! `queue` of loaded rows (rows gathered from the device data set) and `queue` of a pinned batch (rows staged from
//! pinned batches) queue each per-sample step, eager or captured (one sample's graph replayed
//! per sample), and read the window back every `every` steps. Against a host `step` on the
//! same rows, step by step: every report (the loss summed on the host in `f64` from the
//! per-sample losses) and the parameters, bit for bit; no download or wait between drains; a
//! non-finite sample at step k of a window named as step k, with the model as step k - 1
//! left it.

use crate::support::small::{SMALL, labelled};
use crate::support::steps::{param_bits, rows_of, step_bits};
use rstest::rstest;
use zcompute::{Capture, CpuBackend, Engine, PinnedHost};
use zdevice::CuCode;
use zdevice::sim::calls;
use zgrad::{
    Applied, GradError, Load, NonFiniteKind, PinnedBatch, StepReport, StepSource, TrainSchedule,
    Trainer, TrainerConfig, XAsset,
};

const N: usize = 20;

fn data(seed: u64) -> (Vec<f32>, Vec<f32>) {
    labelled(SMALL, N, seed)
}

fn learner<B: Capture<f32> + Clone + 'static>(b: &B, capture: bool) -> Trainer<B, f32, XAsset<B>> {
    learner_of(b, TrainSchedule::PerSample, capture)
}

fn learner_of<B: Capture<f32> + Clone + 'static>(
    b: &B,
    schedule: TrainSchedule,
    capture: bool,
) -> Trainer<B, f32, XAsset<B>> {
    let model = XAsset::init(b, SMALL, 3).expect("model");
    let config = TrainerConfig {
        schedule,
        capture,
        clip_grad: Some(0.5),
        ..TrainerConfig::default()
    };
    Trainer::new(b.clone(), model, config).expect("trainer")
}

/// Batches of 8, 8 and 4 rows (an epoch's short last batch) over two epochs, shuffled, with a
/// repeated row.
fn steps() -> Vec<Vec<usize>> {
    let order = [
        7, 3, 19, 0, 12, 5, 5, 16, 1, 9, 14, 2, 18, 11, 4, 13, 6, 17, 10, 8,
    ];
    let mut out: Vec<Vec<usize>> = order.chunks(8).map(<[usize]>::to_vec).collect();
    let back: Vec<usize> = order.iter().rev().copied().collect();
    out.extend(back.chunks(8).map(<[usize]>::to_vec));
    out
}

/// Where the queued steps' rows come from.
#[derive(Clone, Copy, Debug)]
enum From {
    /// The device data set, by uploaded indices.
    Device,
    /// Two pinned batches filled in turn.
    Pinned,
}

/// Queues steps on `t` from `from`: the device data set (loaded on the first call) or two
/// pinned batches in turn.
struct Queue<B: PinnedHost<f32>> {
    from: From,
    bufs: Vec<PinnedBatch<B>>,
    k: usize,
}

impl<B: Capture<f32> + PinnedHost<f32> + Clone + 'static> Queue<B> {
    fn new(b: &B, t: &mut Trainer<B, f32, XAsset<B>>, from: From, x: &[f32], y: &[f32]) -> Self {
        let bufs = match from {
            From::Device => {
                t.load(Load::Training { x, y, n: N }).expect("load");
                Vec::new()
            }
            From::Pinned => (0..2)
                .map(|_| PinnedBatch::new(b, 8, SMALL.scales, SMALL.features).expect("pinned"))
                .collect(),
        };
        Queue { from, bufs, k: 0 }
    }

    fn step(
        &mut self,
        t: &mut Trainer<B, f32, XAsset<B>>,
        x: &[f32],
        y: &[f32],
        rows: &[usize],
        every: usize,
    ) -> zgrad::Result<Vec<StepReport>> {
        match self.from {
            From::Device => t.queue(StepSource::loaded(rows), every),
            From::Pinned => {
                let buf = &mut self.bufs[self.k % 2];
                self.k += 1;
                let (xs, ys) = rows_of(x, y, rows);
                buf.fill(|px, py| {
                    px[..xs.len()].copy_from_slice(&xs);
                    py[..ys.len()].copy_from_slice(&ys);
                })
                .expect("fill");
                t.queue(StepSource::pinned(buf, rows.len()), every)
            }
        }
    }
}

/// Every queued step's report comes back from the call that fills the next window (none from
/// the others) or from the drain, and equals the per-step path's, bit for bit, as do the
/// parameters.
fn same_as_the_per_step_path<B>(b: &B, capture: bool, from: From, every: usize)
where
    B: Capture<f32> + PinnedHost<f32> + Clone + 'static,
{
    let (x, y) = data(31);
    let mut host = learner(b, capture);
    let mut dev = learner(b, capture);
    let mut queue = Queue::new(b, &mut dev, from, &x, &y);
    let (mut want, mut got) = (Vec::new(), Vec::new());
    for (k, rows) in steps().iter().enumerate() {
        let (xs, ys) = rows_of(&x, &y, rows);
        want.push(
            host.step(StepSource::host(&xs, &ys, rows.len()))
                .expect("per-step"),
        );
        let back = queue.step(&mut dev, &x, &y, rows, every).expect("queued");
        // A full window's copy is queued; the window before it comes back.
        let expect = if (k + 1) % every == 0 && k + 1 > every {
            every
        } else {
            0
        };
        assert_eq!(back.len(), expect, "step {}: reports back", k + 1);
        let copied = if k + 1 >= every { every } else { 0 };
        let queued = (k + 1) % every + copied;
        assert_eq!(dev.status().queued, queued, "step {}: queued", k + 1);
        got.extend(back);
    }
    got.extend(dev.drain().expect("drain"));
    assert_eq!(dev.status().queued, 0);
    let at = format!("capture {capture} {from:?} every {every}");
    let w: Vec<_> = want.iter().map(step_bits).collect();
    let g: Vec<_> = got.iter().map(step_bits).collect();
    assert_eq!(g, w, "{at}");
    assert_eq!(dev.status().step, host.status().step, "{at}");
    assert_eq!(param_bits(b, &dev), param_bits(b, &host), "{at}");
}

#[rstest]
fn queued_per_sample_steps_equal_the_per_step_path_on_the_simulated_device(
    #[values(false, true)] capture: bool,
    #[values(From::Device, From::Pinned)] from: From,
    #[values(3, 4)] every: usize,
) {
    let b = Engine::sim(256 << 20).expect("simulated backend");
    b.set_poison(true);
    same_as_the_per_step_path(&b, capture, from, every);
}

#[rstest]
fn queued_per_sample_steps_equal_the_per_step_path_on_the_cpu(
    #[values(false, true)] capture: bool,
    #[values(From::Device, From::Pinned)] from: From,
) {
    same_as_the_per_step_path(&CpuBackend, capture, from, 3);
}

/// Device calls that bring data back to the host or make it wait for the device.
const WAITS: [&str; 5] = [
    calls::MEMCPY_DTOH,
    calls::MEMCPY_DTOH_ASYNC,
    calls::STREAM_SYNCHRONIZE,
    calls::CTX_SYNCHRONIZE,
    calls::EVENT_SYNCHRONIZE,
];

/// On the simulated device (its streams run their work only when something waits for it):
/// after the first step (a capture's warm-up waits for the device), queued per-sample steps
/// make no download and no wait, and their work is still queued when the call returns; the
/// drain then reads them back, one download.
#[rstest]
fn queued_per_sample_steps_read_nothing_back_between_drains(
    #[values(false, true)] capture: bool,
    #[values(From::Device, From::Pinned)] from: From,
) {
    let b = Engine::sim(256 << 20).expect("simulated backend");
    let (dev, engine) = (b.device(), b.device().stream());
    let (x, y) = data(32);
    let mut t = learner(&b, capture);
    let mut queue = Queue::new(&b, &mut t, from, &x, &y);
    let rows = steps();
    queue.step(&mut t, &x, &y, &rows[0], 8).expect("step 1");
    for (k, r) in rows[1..4].iter().enumerate() {
        dev.driver().clear_op_log();
        let back = queue.step(&mut t, &x, &y, r, 8).expect("queued");
        assert!(back.is_empty(), "step {}: nothing read back", k + 2);
        let log = dev.driver().op_log();
        let waits: Vec<_> = log
            .iter()
            .filter(|op| WAITS.contains(&op.call))
            .map(|op| op.call)
            .collect();
        assert!(waits.is_empty(), "step {}: {waits:?}", k + 2);
        assert!(
            log.iter()
                .any(|op| op.call == calls::LAUNCH_KERNEL || op.call == calls::GRAPH_LAUNCH),
            "step {}: the step's work was queued",
            k + 2
        );
        assert!(
            dev.driver().pending_ops(engine) > 0,
            "step {}: the step is still queued",
            k + 2
        );
    }
    assert_eq!(t.status().queued, 4);
    dev.driver().clear_op_log();
    let reports = t.drain().expect("drain");
    assert_eq!(
        reports.iter().map(|r| r.step).collect::<Vec<_>>(),
        [1, 2, 3, 4]
    );
    let downloads = dev
        .driver()
        .op_log()
        .iter()
        .filter(|op| op.call == calls::MEMCPY_DTOH || op.call == calls::MEMCPY_DTOH_ASYNC)
        .count();
    assert_eq!(downloads, 1, "the drain is one download");
}

/// A NaN in sample 5 of step 2 of a window of four: the read-back (the drain after the
/// window's copy was queued) names step 2 and sample 5, the model and step count are as step 1 left them
/// (steps 2 to 4 were skipped on the device), and training goes on from there as the per-step
/// path does. Eager and captured, from the device data set and from pinned batches (the
/// sample is found from the per-sample losses the window kept).
fn non_finite_named<B>(b: &B, capture: bool, from: From)
where
    B: Capture<f32> + PinnedHost<f32> + Clone + 'static,
{
    let (mut x, y) = data(33);
    let per = x.len() / N;
    let rows = steps();
    let bad_row = rows[1][5];
    x[bad_row * per + 2] = f32::NAN;
    let mut host = learner(b, capture);
    let (xs, ys) = rows_of(&x, &y, &rows[0]);
    host.step(StepSource::host(&xs, &ys, 8)).expect("step 1");
    let mut dev = learner(b, capture);
    let mut queue = Queue::new(b, &mut dev, from, &x, &y);
    for r in &rows[..4] {
        // The fourth fills the window: its copy is queued, nothing read yet.
        let back = queue.step(&mut dev, &x, &y, r, 4).expect("queued");
        assert!(back.is_empty());
    }
    assert_eq!(dev.status().step, 4, "counted as queued");
    let e = dev.drain().expect_err("the window holds a NaN");
    assert_eq!(e.applied(), Some(Applied::No), "{e}");
    assert!(
        matches!(
            e.cause(),
            GradError::NonFinite {
                step: 2,
                sample: Some(5),
                kind: NonFiniteKind::Loss
            }
        ),
        "{e:?}"
    );
    assert_eq!(dev.status().step, 1);
    assert_eq!(dev.status().queued, 0);
    assert_eq!(param_bits(b, &dev), param_bits(b, &host));
    // Going on past the bad step (rows without the NaN) matches the per-step path again.
    let clean = &rows[2];
    let (xs, ys) = rows_of(&x, &y, clean);
    let want = host
        .step(StepSource::host(&xs, &ys, clean.len()))
        .expect("step 2");
    queue.step(&mut dev, &x, &y, clean, 4).expect("queued");
    let got = dev.drain().expect("drain");
    assert_eq!(
        got.iter().map(step_bits).collect::<Vec<_>>(),
        [step_bits(&want)]
    );
    assert_eq!(param_bits(b, &dev), param_bits(b, &host));
}

#[rstest]
fn a_non_finite_sample_is_named_by_its_step_and_its_window_skipped(
    #[values(false, true)] capture: bool,
    #[values(From::Device, From::Pinned)] from: From,
) {
    let b = Engine::sim(256 << 20).expect("simulated backend");
    b.set_poison(true);
    non_finite_named(&b, capture, from);
}

/// Closing a queued step's scope (its last reclaim's poison memset) fails after its update
/// was queued: the error says `Applied::Yes`, the step is counted and its report comes back
/// with the window, so going on with the next rows equals a run that never failed (no update
/// applied twice, no step number used twice). Per-sample eager and captured, batched eager (a
/// replayed batched step has no scratch to poison).
#[rstest]
#[case::per_sample(TrainSchedule::PerSample, false)]
#[case::per_sample_captured(TrainSchedule::PerSample, true)]
#[case::batched(TrainSchedule::Batched, false)]
fn a_failed_reclaim_after_a_queued_update_counts_the_step(
    #[case] schedule: TrainSchedule,
    #[case] capture: bool,
) {
    // Poisoned reclaims: the arena memsets the memory a step scope gives back.
    let open = || {
        let sim = zdevice::SimDriver::new(zdevice::SimConfig::with_capacity(512 << 20));
        zcompute::cuda::twins::register(&sim);
        let config = zdevice::DeviceConfig {
            blas_workspace_bytes: 0,
            ..zdevice::DeviceConfig::default()
        };
        let device = zdevice::Device::open(sim, config).expect("the simulated device opens");
        let config = zmem::ArenaConfig {
            poison: true,
            cap_bytes: Some(192 << 20),
            ..zmem::ArenaConfig::default()
        };
        let arena = zmem::Arena::new(device, config).expect("arena");
        let b = zcompute::CudaBackend::new(arena).expect("backend");
        b.set_poison(true);
        b
    };
    let (b, clean_b) = (open(), open());
    let (x, y) = data(34);
    let mut t = learner_of(&b, schedule, capture);
    let mut clean = learner_of(&clean_b, schedule, capture);
    t.load(Load::Training { x: &x, y: &y, n: N }).expect("load");
    clean
        .load(Load::Training { x: &x, y: &y, n: N })
        .expect("load");
    let poison_memsets = |b: &zcompute::CudaBackend<zdevice::SimDriver>| {
        b.device().driver().call_count(calls::MEMSET_D8_ASYNC)
    };
    for (k, rows) in steps().iter().take(5).enumerate() {
        // The same step on the twin says how many poison memsets it makes; the last is that
        // of the step's last reclaim, after its update was queued.
        let before = poison_memsets(&clean_b);
        clean
            .queue(StepSource::loaded(rows), 8)
            .expect("clean step");
        let poisons = poison_memsets(&clean_b) - before;
        assert!(poisons > 0, "poison is on");
        if k == 2 {
            b.device()
                .driver()
                .fail_nth(calls::MEMSET_D8_ASYNC, poisons, CuCode::INVALID_VALUE);
            let err = t
                .queue(StepSource::loaded(rows), 8)
                .expect_err("the reclaim fails");
            assert_eq!(err.applied(), Some(Applied::Yes), "{err}");
            assert!(matches!(err, GradError::Step { step: 3, .. }), "{err}");
            assert_eq!(t.status().step, 3, "the applied step is counted");
            continue;
        }
        t.queue(StepSource::loaded(rows), 8).expect("queued");
    }
    let (got, want) = (t.drain().expect("drain"), clean.drain().expect("drain"));
    let bits = |r: &[StepReport]| r.iter().map(step_bits).collect::<Vec<_>>();
    assert_eq!(bits(&got), bits(&want), "every step read back once");
    assert_eq!(param_bits(&b, &t), param_bits(&clean_b, &clean));
}

/// The same on CUDA device 0: queued equals per-step bit for bit, and a non-finite sample is
/// named by its step with the window skipped.
#[cfg(feature = "gpu")]
mod gpu {
    use super::From;
    use rstest::rstest;

    use crate::support::steps::poisoned_gpu as gpu;

    #[rstest]
    fn queued_per_sample_steps_equal_the_per_step_path_on_the_gpu(
        #[values(false, true)] capture: bool,
        #[values(From::Device, From::Pinned)] from: From,
    ) {
        super::same_as_the_per_step_path(&gpu(), capture, from, 3);
    }

    #[rstest]
    fn a_non_finite_sample_is_named_by_its_step_on_the_gpu(
        #[values(false, true)] capture: bool,
        #[values(From::Device, From::Pinned)] from: From,
    ) {
        super::non_finite_named(&gpu(), capture, from);
    }
}
