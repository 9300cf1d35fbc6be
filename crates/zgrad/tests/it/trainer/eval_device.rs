//! Evaluation on the device (issue 21 item 3): a validation set uploaded once and evaluated in
//! captured chunks read through a device cursor, and the resident training set evaluated where
//! it lies; both read the logits back once per evaluation and report bitwise what `evaluate`
//! reports from the host. On the simulated device (its op log counts the copies and captures)
//! and on the CPU backend; `gpu`: CUDA device 0.

use crate::support::small::{SMALL, labelled};
use rstest::rstest;
use zcompute::{Capture, CpuBackend, CudaBackend, Engine};
use zdevice::SimDriver;
use zgrad::{
    EvalReport, EvalSource, GradError, Load, StepSource, TrainSchedule, Trainer, TrainerConfig,
    XAsset,
};

/// `n` samples, labels 0 and 1.
fn set(n: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
    labelled(SMALL, n, seed)
}

fn learner<B: Capture<f32> + Clone + 'static>(
    b: &B,
    schedule: TrainSchedule,
    capture: bool,
    eval_batch: usize,
) -> Trainer<B, f32, XAsset<B>> {
    let model = XAsset::init(b, SMALL, 3).expect("model");
    let config = TrainerConfig {
        schedule,
        capture,
        eval_batch,
        ..TrainerConfig::default()
    };
    Trainer::new(b.clone(), model, config).expect("trainer")
}

/// Loads the training set, then the validation set (`x`, `y`, samples each).
fn load_sets<B: Capture<f32> + Clone + 'static>(
    t: &mut Trainer<B, f32, XAsset<B>>,
    (x, y, n): (&[f32], &[f32], usize),
    (vx, vy, n_val): (&[f32], &[f32], usize),
) {
    t.load(Load::Training { x, y, n }).expect("training set");
    t.load(Load::Validation {
        x: vx,
        y: vy,
        n: n_val,
    })
    .expect("validation set");
}

fn bits(r: &EvalReport) -> (u64, u64, usize) {
    (r.loss.to_bits(), r.accuracy.to_bits(), r.samples)
}

/// Three epochs of two steps, each followed by both evaluations on the device against
/// `evaluate` of the same values from the host: the same bits every time (the graphs read
/// the parameters each epoch's steps changed).
fn same_as_evaluate<B: Capture<f32> + Clone + 'static>(
    b: &B,
    schedule: TrainSchedule,
    capture: bool,
    n_val: usize,
    eval_batch: usize,
) {
    let (x, y) = set(24, 31);
    let (vx, vy) = set(n_val, 32);
    let mut t = learner(b, schedule, capture, eval_batch);
    load_sets(&mut t, (&x, &y, 24), (&vx, &vy, n_val));
    assert_eq!(t.status().validation_rows, Some(n_val));
    for epoch in 0..3 {
        for rows in [[0, 5, 9, 11, 2, 23], [3, 3, 17, 8, 1, 20]] {
            t.queue(StepSource::loaded(&rows), 1).expect("step");
        }
        t.drain().expect("drained");
        let says =
            format!("{schedule:?} capture {capture} n {n_val} chunk {eval_batch} epoch {epoch}");
        let want = t
            .evaluate(EvalSource::Host(&vx, &vy))
            .expect("host evaluation");
        assert_eq!(
            bits(&t.evaluate(EvalSource::Validation).expect("device")),
            bits(&want),
            "{says}"
        );
        let want = t
            .evaluate(EvalSource::Host(&x, &y))
            .expect("host evaluation");
        assert_eq!(
            bits(&t.evaluate(EvalSource::Loaded).expect("device")),
            bits(&want),
            "{says}"
        );
    }
}

#[rstest]
fn device_evaluation_equals_evaluate_bitwise_on_the_simulated_device(
    #[values(TrainSchedule::Batched, TrainSchedule::PerSample)] schedule: TrainSchedule,
    #[values(false, true)] capture: bool,
    #[values((23, 8), (16, 8), (5, 8), (1, 256))] sizes: (usize, usize),
) {
    let b = Engine::sim(256 << 20).expect("simulated backend");
    b.set_poison(true);
    same_as_evaluate(&b, schedule, capture, sizes.0, sizes.1);
}

#[rstest]
fn device_evaluation_equals_evaluate_bitwise_on_the_cpu(#[values(false, true)] capture: bool) {
    same_as_evaluate(&CpuBackend, TrainSchedule::Batched, capture, 23, 8);
}

/// How many of the simulated driver's calls named `call` (any of them) `f` made.
fn calls<R>(b: &CudaBackend<SimDriver>, names: &[&str], f: impl FnOnce() -> R) -> (R, usize) {
    let driver = b.device().driver();
    driver.clear_op_log();
    let out = f();
    let n = driver
        .op_log()
        .iter()
        .filter(|op| names.contains(&op.call))
        .count();
    (out, n)
}

const DOWNLOADS: [&str; 2] = ["cuMemcpyDtoHAsync_v2", "cuMemcpyDtoH_v2"];
const UPLOADS: [&str; 2] = ["cuMemcpyHtoDAsync_v2", "cuMemcpyHtoD_v2"];

/// One download per evaluation and no upload, however many chunks (23 samples in chunks of
/// 4: five full chunks and one of 3), eager and captured; `evaluate` from the host makes one
/// upload and one download per chunk. (`evaluate(EvalSource::Loaded)` read the logits and the labels
/// back before: 2 downloads.)
#[rstest]
fn a_device_evaluation_reads_back_once_and_uploads_nothing(#[values(false, true)] capture: bool) {
    let b = Engine::sim(256 << 20).expect("simulated backend");
    let (vx, vy) = set(23, 33);
    let mut t = learner(&b, TrainSchedule::Batched, capture, 4);
    t.load(Load::Validation {
        x: &vx,
        y: &vy,
        n: 23,
    })
    .expect("validation set");
    t.load(Load::Training {
        x: &vx,
        y: &vy,
        n: 23,
    })
    .expect("training set");
    for epoch in 0..2 {
        let (r, down) = calls(&b, &DOWNLOADS, || {
            t.evaluate(EvalSource::Validation).expect("device")
        });
        assert_eq!((r.samples, down), (23, 1), "epoch {epoch}: downloads");
        let (_, up) = calls(&b, &UPLOADS, || {
            t.evaluate(EvalSource::Validation).expect("device")
        });
        assert_eq!(up, 0, "epoch {epoch}: uploads");
        let (_, down) = calls(&b, &DOWNLOADS, || {
            t.evaluate(EvalSource::Loaded).expect("device")
        });
        assert_eq!(down, 1, "epoch {epoch}: evaluate_loaded's downloads");
    }
    let (_, down) = calls(&b, &DOWNLOADS, || {
        t.evaluate(EvalSource::Host(&vx, &vy)).expect("host")
    });
    assert_eq!(down, 6, "the host path: one per chunk");
}

/// Captured once per chunk shape (a full chunk's and the last one's), then replayed: no
/// capture after the first evaluation, every chunk a graph launch, the replays counted.
#[test]
fn the_chunk_graphs_are_replayed_not_recaptured_across_epochs() {
    let b = Engine::sim(256 << 20).expect("simulated backend");
    let (x, y) = set(24, 34);
    let (vx, vy) = set(23, 35);
    let mut t = learner(&b, TrainSchedule::Batched, true, 4);
    load_sets(&mut t, (&x, &y, 24), (&vx, &vy, 23));
    let (_, captures) = calls(&b, &["cuStreamBeginCapture_v2"], || {
        t.evaluate(EvalSource::Validation).expect("first")
    });
    assert_eq!(captures, 2, "one capture per chunk shape");
    assert_eq!(t.graphs().validation.len(), 2);
    for epoch in 1..4 {
        t.queue(StepSource::loaded(&[1, 2, 3, 4]), 1).expect("step");
        t.drain().expect("drained");
        let (_, launched) = calls(&b, &["cuStreamBeginCapture_v2", "cuGraphLaunch"], || {
            t.evaluate(EvalSource::Validation).expect("again")
        });
        assert_eq!(
            launched, 6,
            "epoch {epoch}: six chunk graphs launched, none captured"
        );
    }
    let mut replays: Vec<u64> = t
        .graphs()
        .validation
        .into_iter()
        .map(|g| g.replays())
        .collect();
    replays.sort_unstable();
    // The last chunk: 3 replays; the five full ones: 4 the first time (the capture ran one),
    // then 5 an epoch.
    assert_eq!(replays, [3, 4 + 3 * 5]);
}

/// Bytes of capture reservations on `b`'s arena, and how many there are.
fn graph_memory<D: zdevice::Driver>(b: &CudaBackend<D>) -> (u64, usize) {
    let d = b.arena().diagnostics();
    (d.capture.reserved, d.capture.reservations)
}

/// The chunk graphs of one set never run at the same time: they share one reservation (a
/// graph pool), the size the full chunk's graph needs alone, which goes when the set does.
#[test]
fn the_chunk_graphs_share_one_reservation_the_size_of_the_largest() {
    let b = Engine::sim(256 << 20).expect("simulated backend");
    // 24 samples in chunks of 4: one chunk shape, so one graph, alone.
    let (vx, vy) = set(24, 36);
    let mut t = learner(&b, TrainSchedule::Batched, true, 4);
    t.load(Load::Validation {
        x: &vx,
        y: &vy,
        n: 24,
    })
    .expect("validation set");
    t.evaluate(EvalSource::Validation)
        .expect("full chunks only");
    let (full_alone, n) = graph_memory(&b);
    assert_eq!((t.graphs().validation.len(), n), (1, 1));
    // 23 samples: the full chunks' graph and the last chunk's (3 samples).
    let (vx, vy) = set(23, 35);
    t.load(Load::Validation {
        x: &vx,
        y: &vy,
        n: 23,
    })
    .expect("validation set");
    assert_eq!(
        graph_memory(&b),
        (0, 0),
        "the old set's graphs went with it"
    );
    let want = t.evaluate(EvalSource::Host(&vx, &vy)).expect("host");
    for pass in 0..3 {
        let got = t.evaluate(EvalSource::Validation).expect("device");
        assert_eq!(bits(&got), bits(&want), "pass {pass}");
        assert_eq!(t.graphs().validation.len(), 2);
        assert_eq!(
            graph_memory(&b),
            (full_alone, 1),
            "pass {pass}: one reservation, the full chunks' graph's alone"
        );
    }
    let graph = b.arena().diagnostics().bytes_by_class;
    assert!(graph.get(zcompute::AllocClass::Graph) <= full_alone);
}

/// The captured training step and the evaluation graphs run on one stream and never
/// together, and everything that outlives a replay (parameters, gradients, moments, the
/// AdamW slot and gate, the history rows, the evaluation's input and logits) is persistent:
/// they share the step graph's reservation. A per-sample step's graph is smaller than the
/// evaluation's: the evaluation gets memory of its own size, as before. The reports stay
/// `evaluate`'s.
#[rstest]
fn the_step_graph_and_the_evaluation_graphs_share_one_reservation(
    #[values(TrainSchedule::Batched, TrainSchedule::PerSample)] schedule: TrainSchedule,
) {
    let b = Engine::sim(256 << 20).expect("simulated backend");
    step_and_evaluation_share(&b, schedule);
}

fn step_and_evaluation_share<D: zdevice::Driver + 'static>(
    b: &CudaBackend<D>,
    schedule: TrainSchedule,
) {
    let (x, y) = set(24, 37);
    let (vx, vy) = set(23, 38);
    let mut t = learner(b, schedule, true, 4);
    load_sets(&mut t, (&x, &y, 24), (&vx, &vy, 23));
    t.queue(StepSource::loaded(&[0, 5, 9, 11, 2, 23]), 1)
        .expect("step");
    t.drain().expect("drained");
    let (step_alone, n) = graph_memory(b);
    assert_eq!(n, 1, "the step graph");
    for epoch in 0..2 {
        let want = t.evaluate(EvalSource::Host(&vx, &vy)).expect("host");
        let got = t.evaluate(EvalSource::Validation).expect("device");
        assert_eq!(bits(&got), bits(&want), "epoch {epoch}");
        t.queue(StepSource::loaded(&[3, 3, 17, 8, 1, 20]), 1)
            .expect("step");
        t.drain().expect("drained");
    }
    let (reserved, n) = graph_memory(b);
    match schedule {
        TrainSchedule::Batched => assert_eq!(
            (reserved, n),
            (step_alone, 1),
            "the evaluation shares the step's reservation"
        ),
        _ => assert!(
            n == 2 && reserved > step_alone,
            "{reserved} {n} {step_alone}"
        ),
    }
}

#[test]
fn bad_validation_sets_are_refused_by_name_and_load_nothing() {
    let b = Engine::sim(256 << 20).expect("simulated backend");
    let (mut vx, vy) = set(6, 36);
    let mut t = learner(&b, TrainSchedule::Batched, true, 4);
    let cause = |e: GradError| match e {
        GradError::BadInput(m) => m,
        other => panic!("{other:?}"),
    };
    assert!(
        cause(t.evaluate(EvalSource::Validation).unwrap_err()).contains("Load::Validation first")
    );
    // Labels of the wrong length: the target contract's error, naming both shapes.
    assert!(matches!(
        t.load(Load::Validation { x: &vx, y: &vy[..5], n: 6 }),
        Err(GradError::Target { expected, given, .. }) if expected == [6] && given == [5]
    ));
    assert!(matches!(
        t.load(Load::Validation {
            x: &vx[..vx.len() - 1],
            y: &vy,
            n: 6
        }),
        Err(GradError::BadInput(_))
    ));
    vx[4 * SMALL.scales * SMALL.features + 2] = f32::INFINITY;
    let m = cause(
        t.load(Load::Validation {
            x: &vx,
            y: &vy,
            n: 6,
        })
        .unwrap_err(),
    );
    assert!(m.contains("validation sample 4 of 6"), "{m}");
    let mut bad_label = vy.clone();
    bad_label[1] = f32::NAN;
    vx[4 * SMALL.scales * SMALL.features + 2] = 0.5;
    let m = cause(
        t.load(Load::Validation {
            x: &vx,
            y: &bad_label,
            n: 6,
        })
        .unwrap_err(),
    );
    assert!(m.contains("validation sample 1 of 6"), "{m}");
    assert_eq!(t.status().validation_rows, None, "nothing loaded");
    assert!(cause(t.evaluate(EvalSource::Loaded).unwrap_err()).contains("Load::Training first"));
}

#[cfg(feature = "gpu")]
mod gpu {
    use super::*;

    /// The simulated twin is `device_evaluation_equals_evaluate_bitwise_on_the_simulated_device`.
    #[rstest]
    fn gpu_device_evaluation_equals_evaluate_bitwise(
        #[values(false, true)] capture: bool,
        #[values((23, 8), (1000, 256))] sizes: (usize, usize),
    ) {
        let b = Engine::cuda(0).expect("CUDA device 0 opens");
        same_as_evaluate(&b, TrainSchedule::Batched, capture, sizes.0, sizes.1);
    }

    /// The simulated twin is `the_step_graph_and_the_evaluation_graphs_share_one_reservation`.
    #[rstest]
    fn gpu_the_step_graph_and_the_evaluation_graphs_share_one_reservation(
        #[values(TrainSchedule::Batched, TrainSchedule::PerSample)] schedule: TrainSchedule,
    ) {
        let b = Engine::cuda(0).expect("CUDA device 0 opens");
        step_and_evaluation_share(&b, schedule);
    }
}
