//! The trainer's captured graphs at the default XAsset size on the accounting-only simulated
//! device (every size and call as on the GPU, no arithmetic, so CI runs it in seconds): the
//! node budget of each captured graph, the host's work per sample of the captured per-sample
//! schedule (one graph launch, the batch uploaded once per step), and its memory peak, that of
//! one sample whatever the batch. The counts belong in the test's output (reported), so it
//! prints them.

#![allow(clippy::print_stderr)]

use zcompute::{AllocClass, CudaBackend, CudaGraph};
use zdevice::sim::{OpRecord, calls};
use zdevice::{Device, DeviceConfig, SimConfig, SimDriver};
use zgrad::{StepSource, TrainSchedule, Trainer, TrainerConfig, XAsset, XAssetConfig};
use zmem::{Arena, ArenaConfig, ClassBytes};

/// Node budgets of the captured graphs at the default XAsset size, in one place: lowered as
/// fused kernels land, never raised to let a change through.
///
/// The per-sample graph (one sample's gather from the device-resident batch, forward,
/// backward, loss scatter and index advance): 21 nodes today. 33 before the fusions of the
/// sixth session: a Linear layer's backward one kernel (`Backend::linear_backward_into`: tanh's
/// backward, dX and the weight and bias gradients; -5), the feed-forward block's residual add
/// the f2 product's epilogue (`linear_add`; -1), each LayerNorm's backward adding its weight's
/// and bias's gradients in the same launch (`layer_norm_backward_into`; -4), attention's
/// QK-norm gradients added into the flat buffer by their column reduction and the head's by
/// its backward kernel (`backward_into`; -2). 33 was, as on the GPU, 58 there before the
/// products went from cuBLAS (the simulator counts a gemm as several nodes) to the small-row
/// kernels, a Linear layer's forward and its weight and bias gradients one kernel each.
/// Before: 85 with cuBLAS products, 86 before the head's
/// weight and bias gradients came back as adjacent views (one add into their adjacent
/// buffers), 89 before adjacent parameter gradients of one node were added by one launch
/// (attention's four QK-norm gradients), 90 before ln1's input gradient and the residual
/// stream's were summed in LayerNorm's backward kernel (`layer_norm_stream`), 93 before the
/// loss's 1/B scale became backward's seed (no product forward, seed fill or product
/// backward), 107 before parameter gradients were accumulated in place (weight gradients by
/// gemms with `beta = 1`, bias and LayerNorm gradients by column reductions adding into their
/// buffers: no `add_into` after them). PyTorch: 101 kernels.
const PER_SAMPLE_NODE_BUDGET: usize = 21;
/// The batched step (zero_grad, forward, backward, norm, gated AdamW): 82 nodes today (88
/// before the reductions finished in their last block and the step's stats and gate became
/// one launch, `StepOps::step_tail`; 90 before attention's and the head's parameter gradients went straight into the flat buffer, 91
/// before the head's adjacent gradients, 94 before adjacent parameter gradients were added by
/// one launch, 95 before backward's seed was a persistent 1 instead of a fill, 96 before
/// `layer_norm_stream`, 110 before the in-place accumulation).
const BATCHED_NODE_BUDGET: usize = 82;

type Sim = CudaBackend<SimDriver>;

struct Run {
    trainer: Trainer<Sim, f32, XAsset<Sim>>,
    arena: Arena<SimDriver>,
}

fn run(schedule: TrainSchedule, capture: bool) -> Run {
    let sim = SimDriver::new(SimConfig::accounting(1 << 40));
    zcompute::cuda::twins::register(&sim);
    let device = Device::open(
        sim,
        DeviceConfig {
            blas_workspace_bytes: 0,
            ..DeviceConfig::default()
        },
    )
    .expect("the simulated device opens");
    let arena = Arena::new(
        device,
        ArenaConfig {
            poison: false,
            ..ArenaConfig::default()
        },
    )
    .expect("arena");
    let backend = CudaBackend::new(arena.clone()).expect("backend");
    let model = XAsset::zeroed(&backend, XAssetConfig::default()).expect("model");
    let config = TrainerConfig {
        schedule,
        capture,
        ..TrainerConfig::default()
    };
    let trainer = Trainer::new(backend, model, config).expect("trainer");
    Run { trainer, arena }
}

fn batch(n: usize) -> (Vec<f32>, Vec<f32>) {
    let m = XAssetConfig::default();
    (vec![0.0; n * m.scales * m.features], vec![0.0; n])
}

impl Run {
    fn step(&mut self, n: usize) {
        let (x, y) = batch(n);
        let report = self
            .trainer
            .step(StepSource::host(&x, &y, n))
            .expect("step");
        assert_eq!(report.captured, self.trainer.config().capture);
    }

    /// The driver calls of one more step of `n` samples.
    fn logged_step(&mut self, n: usize) -> Vec<OpRecord> {
        let arena = self.arena.clone();
        let sim = arena.device().driver();
        sim.clear_op_log();
        self.step(n);
        assert_eq!(sim.op_log_dropped(), 0, "the op log kept the whole step");
        sim.op_log()
    }
}

fn nodes(g: Option<&CudaGraph<SimDriver>>) -> usize {
    g.expect("a captured graph").nodes()
}

fn count(log: &[OpRecord], call: &str) -> usize {
    log.iter().filter(|r| r.call == call).count()
}

#[test]
fn captured_graphs_stay_within_their_node_budgets() {
    let mut per_sample = run(TrainSchedule::PerSample, true);
    per_sample.step(4);
    let n = nodes(per_sample.trainer.graphs().step);
    let mut batched = run(TrainSchedule::Batched, true);
    batched.step(4);
    let m = nodes(batched.trainer.graphs().step);
    eprintln!("nodes: per-sample graph {n} (nodes per sample), batched graph {m} (per step)");
    assert!(
        n <= PER_SAMPLE_NODE_BUDGET,
        "per-sample graph: {n} nodes, budget {PER_SAMPLE_NODE_BUDGET}"
    );
    assert!(
        m <= BATCHED_NODE_BUDGET,
        "batched graph: {m} nodes, budget {BATCHED_NODE_BUDGET}"
    );
}

/// Sample after sample of a step whose graph exists, the host only launches the graph: no
/// upload, kernel, copy or memset between the first and the last launch, one launch per
/// sample; the batch goes up in one copy per step (beside it AdamW's `[lr, t]` slot, and 1/B
/// when B changed).
#[test]
fn per_sample_host_work_is_one_graph_launch_per_sample_and_one_batch_upload_per_step() {
    let mut r = run(TrainSchedule::PerSample, true);
    r.step(8);
    for (n, other_uploads) in [(8, 1), (8, 1), (5, 2), (5, 1)] {
        let log = r.logged_step(n);
        let launches: Vec<usize> = (0..log.len())
            .filter(|&i| log[i].call == calls::GRAPH_LAUNCH)
            .collect();
        assert_eq!(launches.len(), n, "one graph launch per sample");
        let (first, last) = (launches[0], launches[n - 1]);
        let mut between: Vec<&str> = log[first..=last].iter().map(|r| r.call).collect();
        between.sort_unstable();
        between.dedup();
        eprintln!(
            "batch {n}: {} graph launches, {} uploads, {} calls in the step; between the launches only {between:?}",
            launches.len(),
            count(&log, calls::MEMCPY_HTOD_ASYNC),
            log.len()
        );
        for call in &between {
            assert!(
                !call.starts_with("cuMemcpy")
                    && !call.starts_with("cuMemset")
                    && *call != calls::LAUNCH_KERNEL,
                "the host issued {call} between two samples"
            );
        }
        assert_eq!(
            count(&log, calls::MEMCPY_HTOD_ASYNC),
            1 + other_uploads,
            "one batch upload per step"
        );
    }
}
/// The eager per-sample schedule reads the same device-resident batch: one batch upload per
/// step (beside AdamW's slot) whatever the batch, no upload per sample.
#[test]
fn eager_per_sample_uploads_the_batch_once_per_step() {
    let mut r = run(TrainSchedule::PerSample, false);
    r.step(8);
    for n in [8, 3] {
        let log = r.logged_step(n);
        let uploads = count(&log, calls::MEMCPY_HTOD_ASYNC);
        eprintln!(
            "eager, batch {n}: {uploads} uploads, {} calls in the step",
            log.len()
        );
        // A batch of 3 after one of 8 writes 1/B again.
        assert_eq!(uploads, if n == 8 { 2 } else { 3 }, "batch {n}");
    }
}

/// Peak bytes by class of a captured per-sample run with batch `n`, and the graph's
/// reservation.
fn per_sample_peaks(n: usize) -> (ClassBytes, u64) {
    let mut r = run(TrainSchedule::PerSample, true);
    r.step(n);
    r.step(n);
    let reserved = r.trainer.graphs().step.expect("graph").reserved_bytes();
    (r.arena.diagnostics().peak_bytes_by_class, reserved)
}

/// Scratch plus graph memory of the captured per-sample schedule at the default size: today
/// (and before the batch moved to the device) 7,209,728 scratch (the capture's warm-up) plus a
/// 7,675,392-byte graph reservation; the budget is that plus 10%.
const PER_SAMPLE_PEAK_BUDGET: u64 = (7_209_728 + 7_675_392) * 11 / 10;

/// The peak of every class but the persistent one (parameters, optimiser state, the batch
/// table) is one sample's, whatever the batch, and within the budget.
#[test]
fn the_per_sample_peak_is_one_samples_whatever_the_batch() {
    let (small, reserved_small) = per_sample_peaks(2);
    let (large, reserved_large) = per_sample_peaks(8);
    for (name, p, res) in [
        ("batch 2", small, reserved_small),
        ("batch 8", large, reserved_large),
    ] {
        eprintln!(
            "{name}: peak scratch {} saved {} persistent {} graph {}; graph reservation {res}",
            p.get(AllocClass::Scratch),
            p.get(AllocClass::Saved),
            p.get(AllocClass::Persistent),
            p.get(AllocClass::Graph)
        );
    }
    for class in [AllocClass::Scratch, AllocClass::Saved, AllocClass::Graph] {
        assert_eq!(
            small.get(class),
            large.get(class),
            "{class} peak grew with the batch"
        );
    }
    assert_eq!(reserved_small, reserved_large);
    let peak = large.get(AllocClass::Scratch) + large.get(AllocClass::Graph);
    assert!(
        peak <= PER_SAMPLE_PEAK_BUDGET,
        "scratch + graph peak {peak} over the budget {PER_SAMPLE_PEAK_BUDGET}"
    );
}
