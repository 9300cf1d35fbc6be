//! The captured batched step replayed on the batch already on the device
//! (a step from the held batch, what the benchmark times with CUDA events) and the captured
//! graphs' node counts, on the CUDA backend over the simulated driver. The node report at the
//! default size runs on the accounting-only simulator (the graphs are the same; no kernel runs).

#![allow(clippy::print_stdout)]

use crate::support::small::{SMALL, labelled};
use zcompute::{CudaBackend, Engine};
use zdevice::{Device, DeviceConfig, SimConfig, SimDriver};
use zgrad::{
    Applied, GradError, ReplayMark, StepReport, StepSource, TrainSchedule, Trainer, TrainerConfig,
    XAsset, XAssetConfig,
};
use zmem::{Arena, ArenaConfig};

type Sim = CudaBackend<SimDriver>;

fn batch(c: XAssetConfig, n: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
    labelled(c, n, seed)
}

fn trainer(schedule: TrainSchedule, capture: bool) -> (Sim, Trainer<Sim, f32, XAsset<Sim>>) {
    let b = Engine::sim(256 << 20).expect("simulated backend");
    b.set_poison(true);
    let model = XAsset::init(&b, SMALL, 3).expect("model");
    let config = TrainerConfig {
        schedule,
        capture,
        ..TrainerConfig::default()
    };
    let t = Trainer::new(b.clone(), model, config).expect("trainer");
    (b, t)
}

fn params(b: &Sim, t: &Trainer<Sim, f32, XAsset<Sim>>) -> Vec<Vec<u32>> {
    t.model()
        .parameters()
        .iter()
        .map(|p| p.to_vec(b).unwrap().iter().map(|v| v.to_bits()).collect())
        .collect()
}

fn bits(r: &StepReport) -> (u64, u64, u64, bool) {
    (r.step, r.loss.to_bits(), r.grad_norm.to_bits(), r.captured)
}

#[test]
fn replaying_the_resident_batch_equals_train_batch_of_that_batch() {
    let (x, y) = batch(SMALL, 4, 11);
    let (b1, mut uploads) = trainer(TrainSchedule::Batched, true);
    let (b2, mut resident) = trainer(TrainSchedule::Batched, true);
    assert!(uploads.step(StepSource::host(&x, &y, 4)).unwrap().captured);
    assert!(resident.step(StepSource::host(&x, &y, 4)).unwrap().captured);
    for _ in 0..3 {
        let want = uploads.step(StepSource::host(&x, &y, 4)).unwrap();
        let mut marks = Vec::new();
        let got = resident.step(StepSource::held(|m| marks.push(m))).unwrap();
        assert_eq!(marks, [ReplayMark::Before, ReplayMark::After]);
        assert_eq!(bits(&got), bits(&want));
    }
    assert_eq!(resident.status().step, 4);
    assert_eq!(params(&b2, &resident), params(&b1, &uploads));
    assert_eq!(resident.graphs().step.map(|g| g.replays()), Some(3));
}

#[test]
fn replay_resident_without_a_captured_step_is_refused_and_applies_nothing() {
    let (x, y) = batch(SMALL, 4, 12);
    for capture in [true, false] {
        let (b, mut t) = trainer(TrainSchedule::Batched, capture);
        if !capture {
            t.step(StepSource::host(&x, &y, 4)).unwrap();
        }
        let before = params(&b, &t);
        let mut marks = 0;
        let e = t.step(StepSource::held(|_| marks += 1)).unwrap_err();
        assert_eq!(e.applied(), Some(Applied::No), "{e}");
        assert!(
            matches!(e.cause(), GradError::BadInput(m) if m.contains("no captured batched step")),
            "{e:?}"
        );
        assert_eq!(
            (marks, t.status().step, params(&b, &t)),
            (0, u64::from(!capture), before)
        );
    }
}

#[test]
fn a_non_finite_resident_step_names_its_sample_and_applies_nothing() {
    let (mut x, y) = batch(SMALL, 4, 13);
    let (b, mut t) = trainer(TrainSchedule::Batched, true);
    t.step(StepSource::host(&x, &y, 4)).unwrap();
    // A NaN in sample 2 of the batch on the device, as the last upload left it.
    x[2 * SMALL.scales * SMALL.features] = f32::NAN;
    let e = t.step(StepSource::host(&x, &y, 4)).unwrap_err();
    assert_eq!(e.applied(), Some(Applied::No), "{e}");
    let before = params(&b, &t);
    let e = t.step(StepSource::held(|_| {})).unwrap_err();
    assert_eq!(e.applied(), Some(Applied::No), "{e}");
    assert!(
        matches!(
            e.cause(),
            GradError::NonFinite {
                sample: Some(2),
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!((t.status().step, params(&b, &t)), (1, before));
}

/// Nodes per captured batched step and per captured per-sample step at the default size
/// (batch 256), printed for the benchmark's report; the per-sample graph's budget is checked
/// beside its schedule.
#[test]
fn nodes_per_captured_step_at_the_default_size() {
    let mut nodes = Vec::new();
    for schedule in [TrainSchedule::Batched, TrainSchedule::PerSample] {
        let sim = SimDriver::new(SimConfig::accounting(64 << 30));
        zcompute::cuda::twins::register(&sim);
        let device = Device::open(sim, DeviceConfig::default()).expect("accounting device");
        let arena = Arena::new(
            device,
            ArenaConfig {
                cap_bytes: Some(32 << 30),
                ..ArenaConfig::default()
            },
        )
        .expect("arena");
        let b = CudaBackend::new(arena).expect("backend");
        let c = XAssetConfig::default();
        let model = XAsset::zeroed(&b, c).expect("model");
        let config = TrainerConfig {
            schedule,
            capture: true,
            ..TrainerConfig::default()
        };
        let mut t = Trainer::new(b, model, config).expect("trainer");
        let x = vec![0.0f32; 256 * c.scales * c.features];
        let y = vec![0.0f32; 256];
        assert!(
            t.step(StepSource::host(&x, &y, 256)).unwrap().captured,
            "{schedule:?}"
        );
        let graph = t.graphs().step;
        let n = graph.expect("a captured graph").nodes();
        assert!(n > 0, "{schedule:?}: an empty graph");
        nodes.push(n);
    }
    println!(
        "graph nodes at the default size, batch 256: batched step {}, per-sample step {} (x256 per optimiser step)",
        nodes[0], nodes[1]
    );
}

/// The data set on the device (issue 21): steps queued by their rows' indices, gathered on the
/// device inside the (captured) step, read back every few steps. The new path's losses,
/// norms and parameters against a host `step` on the same rows copied on the host, bit for
/// bit, on the simulated device and on the CPU backend, in both schedules, eager and captured.
mod device_data {
    use super::{SMALL, batch};
    use crate::support::steps::{param_bits, rows_of};
    use rstest::rstest;
    use zcompute::{Capture, CpuBackend, Engine};
    use zgrad::{
        Applied, GradError, NonFiniteKind, StepReport, TrainSchedule, Trainer, TrainerConfig,
        XAsset,
    };
    use zgrad::{EvalSource, Load, StepSource};

    const N: usize = 20;

    fn learner<B: Capture<f32> + Clone + 'static>(
        b: &B,
        schedule: TrainSchedule,
        capture: bool,
    ) -> Trainer<B, f32, XAsset<B>> {
        let model = XAsset::init(b, SMALL, 3).expect("model");
        let config = TrainerConfig {
            schedule,
            capture,
            eval_batch: 6,
            ..TrainerConfig::default()
        };
        Trainer::new(b.clone(), model, config).expect("trainer")
    }

    /// Batches of 8, 8 and 4 rows (an epoch's short last batch) over two epochs, in a
    /// shuffled order with a repeated row.
    fn steps() -> Vec<Vec<usize>> {
        let order = [
            7, 3, 19, 0, 12, 5, 5, 16, 1, 9, 14, 2, 18, 11, 4, 13, 6, 17, 10, 8,
        ];
        let mut out: Vec<Vec<usize>> = order.chunks(8).map(<[usize]>::to_vec).collect();
        out.extend(
            order
                .iter()
                .rev()
                .copied()
                .collect::<Vec<_>>()
                .chunks(8)
                .map(<[usize]>::to_vec),
        );
        out
    }

    fn report_bits(r: &StepReport) -> (u64, u64, u64, u64) {
        (
            r.step,
            r.loss.to_bits(),
            r.grad_norm.to_bits(),
            r.lr.to_bits(),
        )
    }

    /// The host path and the device path on one backend: every report and the parameters.
    fn same_as_the_host_path<B: Capture<f32> + Clone + 'static>(
        b: &B,
        schedule: TrainSchedule,
        capture: bool,
        every: usize,
    ) {
        let (x, y) = batch(SMALL, N, 21);
        let mut host = learner(b, schedule, capture);
        let mut dev = learner(b, schedule, capture);
        dev.load(Load::Training { x: &x, y: &y, n: N })
            .expect("load");
        assert_eq!(dev.status().loaded_rows, Some(N));
        let (mut want, mut got) = (Vec::new(), Vec::new());
        for rows in steps() {
            let (xs, ys) = rows_of(&x, &y, &rows);
            want.push(
                host.step(StepSource::host(&xs, &ys, rows.len()))
                    .expect("host step"),
            );
            got.extend(
                dev.queue(StepSource::loaded(&rows), every)
                    .expect("queued step"),
            );
            // The window being filled and, at most, the one whose copy is in flight.
            assert!(dev.status().filling < every && dev.status().queued < 2 * every);
        }
        got.extend(dev.drain().expect("drain"));
        assert_eq!(dev.status().queued, 0);
        let w: Vec<_> = want.iter().map(report_bits).collect();
        let g: Vec<_> = got.iter().map(report_bits).collect();
        assert_eq!(g, w, "{schedule:?} capture {capture} every {every}");
        assert_eq!(dev.status().step, host.status().step);
        assert_eq!(param_bits(b, &dev), param_bits(b, &host));
        if capture && schedule == TrainSchedule::Batched {
            assert!(got[0].captured && got[1].captured && !got[2].captured);
        }
        let (e_host, e_dev) = (
            host.evaluate(EvalSource::Host(&x, &y)).expect("eval"),
            dev.evaluate(EvalSource::Loaded).expect("eval"),
        );
        assert_eq!(e_dev.loss.to_bits(), e_host.loss.to_bits());
        assert_eq!(e_dev.accuracy.to_bits(), e_host.accuracy.to_bits());
        assert_eq!(e_dev.samples, N);
    }

    #[rstest]
    fn losses_equal_the_host_paths_on_the_simulated_device(
        #[values(TrainSchedule::Batched, TrainSchedule::PerSample)] schedule: TrainSchedule,
        #[values(false, true)] capture: bool,
        #[values(1, 4)] every: usize,
    ) {
        let b = Engine::sim(256 << 20).expect("simulated backend");
        b.set_poison(true);
        same_as_the_host_path(&b, schedule, capture, every);
    }

    #[rstest]
    fn losses_equal_the_host_paths_on_the_cpu(
        #[values(TrainSchedule::Batched, TrainSchedule::PerSample)] schedule: TrainSchedule,
        #[values(false, true)] capture: bool,
    ) {
        same_as_the_host_path(&CpuBackend, schedule, capture, 3);
    }

    /// A NaN in a sample of the second step of a window of four: the drain names step 2
    /// and the sample, the model and step count are as step 1 left them (the steps after it
    /// were skipped on the device), and training goes on from there as the host path does.
    #[rstest]
    fn a_non_finite_step_is_named_and_its_window_skipped(#[values(false, true)] capture: bool) {
        let b = Engine::sim(256 << 20).expect("simulated backend");
        let (mut x, y) = batch(SMALL, N, 22);
        let per = x.len() / N;
        let rows = steps();
        let bad_row = rows[1][5];
        x[bad_row * per + 2] = f32::NAN;
        let mut host = learner(&b, TrainSchedule::Batched, capture);
        let (xs, ys) = rows_of(&x, &y, &rows[0]);
        host.step(StepSource::host(&xs, &ys, 8)).expect("step 1");
        let mut dev = learner(&b, TrainSchedule::Batched, capture);
        dev.load(Load::Training { x: &x, y: &y, n: N })
            .expect("load");
        for r in &rows[..4] {
            // The fourth fills the window: its copy is queued, nothing read yet.
            assert!(
                dev.queue(StepSource::loaded(r), 4)
                    .expect("queued")
                    .is_empty()
            );
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
        assert_eq!(param_bits(&b, &dev), param_bits(&b, &host));
        // Going on past the bad step (rows without the NaN) matches the host path again.
        let clean = &rows[2];
        let (xs, ys) = rows_of(&x, &y, clean);
        let want = host
            .step(StepSource::host(&xs, &ys, clean.len()))
            .expect("host step 2");
        dev.queue(StepSource::loaded(clean), 4).expect("queued");
        let got = dev.drain().expect("drain");
        assert_eq!(
            got.iter().map(report_bits).collect::<Vec<_>>(),
            [report_bits(&want)]
        );
        assert_eq!(param_bits(&b, &dev), param_bits(&b, &host));
    }

    /// Two pinned batches filled in turn (the host stages step k + 1 into one while step k
    /// reads the other), queued, read back every 3 steps: the host path's reports and
    /// parameters, bit for bit, on the simulated device and the CPU.
    fn pinned_same_as_the_host_path<B>(b: &B, capture: bool)
    where
        B: Capture<f32> + zcompute::PinnedHost<f32> + Clone + 'static,
    {
        let (x, y) = batch(SMALL, N, 24);
        let per = x.len() / N;
        let mut host = learner(b, TrainSchedule::Batched, capture);
        let mut dev = learner(b, TrainSchedule::Batched, capture);
        let mut bufs = [0, 1]
            .map(|_| zgrad::PinnedBatch::new(b, 8, SMALL.scales, SMALL.features).expect("pinned"));
        let (mut want, mut got) = (Vec::new(), Vec::new());
        for (k, rows) in steps().into_iter().enumerate() {
            let (xs, ys) = rows_of(&x, &y, &rows);
            want.push(
                host.step(StepSource::host(&xs, &ys, rows.len()))
                    .expect("host step"),
            );
            let buf = &mut bufs[k % 2];
            buf.fill(|px, py| {
                px[..xs.len()].copy_from_slice(&xs);
                py[..ys.len()].copy_from_slice(&ys);
            })
            .expect("fill");
            got.extend(
                dev.queue(StepSource::pinned(buf, rows.len()), 3)
                    .expect("queued"),
            );
        }
        got.extend(dev.drain().expect("drain"));
        let w: Vec<_> = want.iter().map(report_bits).collect();
        let g: Vec<_> = got.iter().map(report_bits).collect();
        assert_eq!(g, w, "capture {capture}");
        assert_eq!(param_bits(b, &dev), param_bits(b, &host));
        assert_eq!(per, SMALL.scales * SMALL.features);
    }

    #[rstest]
    fn pinned_double_buffered_steps_equal_the_host_path(#[values(false, true)] capture: bool) {
        let b = Engine::sim(256 << 20).expect("simulated backend");
        b.set_poison(true);
        pinned_same_as_the_host_path(&b, capture);
        pinned_same_as_the_host_path(&CpuBackend, capture);
    }

    /// Position in `log` of the first call named `call` on a stream `on` accepts, from `from`.
    fn find(
        log: &[zdevice::sim::OpRecord],
        from: usize,
        call: &str,
        on: impl Fn(zdevice::Stream) -> bool,
    ) -> Option<usize> {
        (from..log.len()).find(|&i| log[i].call == call && log[i].stream.is_some_and(&on))
    }

    /// The host path's copy stream (issue 21 item 1), on the simulated device whose streams
    /// run their work only when something waits for it: each queued pinned step's rows are
    /// copied on a stream other than the engine's, after a wait on that stream (the landing
    /// buffer's free mark) and after the host filled the batch; the engine stream waits for the
    /// copy's event before the step's work (its graph launch once captured) and marks the
    /// buffer free after it. When `queue` of a pinned batch returns, the copy and the step are still
    /// queued (the host waited for neither), and the refill of the batch two steps later
    /// waits only for its copy: the results are the host path's, bit for bit
    /// (`pinned_double_buffered_steps_equal_the_host_path`).
    #[rstest]
    fn pinned_rows_are_copied_on_a_second_stream_ordered_by_events(
        #[values(false, true)] capture: bool,
    ) {
        let b = Engine::sim(256 << 20).expect("simulated backend");
        let (dev, engine) = (b.device(), b.device().stream());
        let (x, y) = batch(SMALL, N, 25);
        let mut t = learner(&b, TrainSchedule::Batched, capture);
        let mut bufs = [0, 1]
            .map(|_| zgrad::PinnedBatch::new(&b, 8, SMALL.scales, SMALL.features).expect("pinned"));
        let mut copy_stream = None;
        for (k, rows) in steps().into_iter().take(3).enumerate() {
            let (xs, ys) = rows_of(&x, &y, &rows);
            dev.driver().clear_op_log();
            bufs[k % 2]
                .fill(|px, py| {
                    px[..xs.len()].copy_from_slice(&xs);
                    py[..ys.len()].copy_from_slice(&ys);
                })
                .expect("fill");
            let filled = dev.driver().op_log().len();
            t.queue(StepSource::pinned(&bufs[k % 2], rows.len()), 8)
                .expect("queued");
            let log = dev.driver().op_log();
            let copy = find(&log, filled, "cuMemcpyHtoDAsync_v2", |s| s != engine)
                .unwrap_or_else(|| panic!("step {k}: no copy beside the engine stream"));
            let side = log[copy].stream.expect("a stream");
            assert_eq!(*copy_stream.get_or_insert(side), side, "one copy stream");
            let waited = find(&log, filled, "cuStreamWaitEvent", |s| s == side)
                .expect("the copy stream waits for the landing buffer's free mark");
            assert!(waited < copy, "step {k}: the wait comes before the copy");
            let copied = find(&log, copy, "cuEventRecord", |s| s == side).expect("copy event");
            let engine_waits = find(&log, copied, "cuStreamWaitEvent", |s| s == engine)
                .expect("the engine stream waits for the copy");
            let step_work = ["cuLaunchKernel", "cuGraphLaunch", "cuMemcpyDtoDAsync_v2"]
                .iter()
                .filter_map(|c| find(&log, filled, c, |s| s == engine))
                .min()
                .expect("the step's work");
            assert!(
                engine_waits < step_work,
                "step {k}: engine wait at {engine_waits}, first step work at {step_work}"
            );
            if capture && k == 1 {
                let launch = find(&log, filled, "cuGraphLaunch", |s| s == engine);
                assert!(
                    launch.is_some_and(|l| l > engine_waits),
                    "replayed after the wait"
                );
            }
            let last_work = (0..log.len())
                .rev()
                .find(|&i| log[i].stream == Some(engine) && log[i].call != "cuEventRecord")
                .expect("engine work");
            assert!(
                find(&log, last_work, "cuEventRecord", |s| s == engine).is_some(),
                "step {k}: the landing buffer is marked free after the step"
            );
            if k > 0 || !capture {
                // (A capture's warm-up waits for the device.)
                assert!(
                    dev.driver().pending_ops(side) > 0,
                    "step {k}: the copy is still queued"
                );
                assert!(
                    dev.driver().pending_ops(engine) > 0,
                    "step {k}: the step is still queued"
                );
            }
        }
        assert_eq!(t.drain().expect("drain").len(), 3);
    }

    #[test]
    fn bad_rows_and_mixed_paths_are_refused_and_apply_nothing() {
        let b = Engine::sim(256 << 20).expect("simulated backend");
        let (x, y) = batch(SMALL, N, 23);
        let mut t = learner(&b, TrainSchedule::Batched, true);
        let cause = |e: GradError| match e.cause() {
            GradError::BadInput(m) => m.clone(),
            other => panic!("{other:?}"),
        };
        let e = t
            .queue(StepSource::loaded(&[0, 1]), 2)
            .expect_err("nothing loaded");
        assert_eq!(e.applied(), Some(Applied::No));
        assert!(cause(e).contains("Load::Training first"));
        assert!(t.evaluate(EvalSource::Loaded).is_err());
        assert!(
            t.load(Load::Training {
                x: &x,
                y: &y[..N - 1],
                n: N
            })
            .is_err(),
            "labels short"
        );
        t.load(Load::Training { x: &x, y: &y, n: N }).expect("load");
        assert!(
            cause(t.queue(StepSource::loaded(&[0, N]), 2).unwrap_err())
                .contains(&format!("row {N} of"))
        );
        assert!(cause(t.queue(StepSource::loaded(&[]), 2).unwrap_err()).contains("0 rows"));
        assert!(
            cause(t.queue(StepSource::loaded(&[0; N + 1]), 2).unwrap_err())
                .contains("1 to 20 rows")
        );
        assert_eq!(t.status().step, 0);
        t.queue(StepSource::loaded(&[0, 1]), 2).expect("queued");
        let e = t
            .step(StepSource::host(&x[..2 * x.len() / N], &y[..2], 2))
            .expect_err("queued first");
        assert!(cause(e).contains("drain first"));
        assert_eq!(t.drain().expect("drain").len(), 1);
        assert_eq!(t.status().step, 1);
    }
}
