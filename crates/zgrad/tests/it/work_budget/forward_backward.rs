//! The fused epilogues and tail in the XAsset model on the simulated device: how much stream
//! work (kernel launches, gemms, copies, memsets: each a node of a captured graph) one
//! forward+backward issues, held under a budget so it cannot creep back, and two runs of it
//! bitwise equal. Loss and gradients against the oracle, and captured against eager, are
//! `device.rs`'s (the model runs the fused ops there too).

use zcompute::{Backend, CudaBackend};
use zdevice::sim::{Effect, OpRecord};
use zdevice::{Device, DeviceConfig, SimConfig, SimDriver};
use zgrad::rng::SplitMix64;
use zgrad::{Tape, Var, XAsset, XAssetConfig, in_step};
use zmem::{Arena, ArenaConfig};

type Mock = CudaBackend<SimDriver>;
/// Stream work per driver call (`cuLaunchKernel`, a gemm, ...): how many were enqueued.
type Work = Vec<(&'static str, usize)>;

/// A simulated device; `poison` fills fresh and reclaimed memory with NaN (which costs memsets
/// that a production step does not issue, so the node count runs without it).
fn mock(poison: bool) -> Mock {
    let sim = SimDriver::new(SimConfig {
        poison_on_free: poison,
        ..SimConfig::with_capacity(512 << 20)
    });
    zcompute::cuda::twins::register(&sim);
    let config = DeviceConfig {
        blas_workspace_bytes: 0,
        ..DeviceConfig::default()
    };
    let dev = Device::open(sim, config).expect("the simulated device opens");
    let arena = Arena::new(
        dev,
        ArenaConfig {
            initial_bytes: 16 << 20,
            segment_bytes: 16 << 20,
            cap_bytes: Some(256 << 20),
            overflow_reserve_bytes: 4 << 20,
            poison,
            sanitize: false,
            timeline_events: 256,
            from_env: Vec::new(),
        },
    )
    .expect("arena");
    let b = CudaBackend::new(arena).expect("backend");
    b.set_poison(poison);
    b
}

/// Stream work per kind (launches, gemms, copies, memsets) in `log`.
fn stream_work(log: &[OpRecord]) -> Work {
    let mut counts: Work = Vec::new();
    for r in log.iter().filter(|r| r.effect == Effect::Enqueued) {
        match counts.iter_mut().find(|(c, _)| *c == r.call) {
            Some((_, n)) => *n += 1,
            None => counts.push((r.call, 1)),
        }
    }
    counts
}

/// One forward+backward of `model` on a batch of `batch` samples with `scales` scales: the
/// loss, every gradient, and the stream work it issued (uploads excluded: the batch is
/// uploaded before the count starts).
fn step(b: &Mock, model: &XAsset<Mock>, batch: usize, scales: usize) -> (f32, Vec<Vec<f32>>, Work) {
    let features = model.config.features;
    let mut rng = SplitMix64::new(7);
    let x: Vec<f32> = rng
        .normal_vec(batch * scales * features)
        .iter()
        .map(|&v| v as f32)
        .collect();
    let y: Vec<f32> = (0..batch).map(|i| (i % 2) as f32).collect();
    for p in model.parameters() {
        b.fill(p.grad().unwrap(), 0.0).unwrap();
    }
    let sim = b.device().driver();
    let (loss, work) = in_step(b, || {
        let xv = Var::constant(b.upload(&x, &[batch, scales, features])?);
        let yv = Var::constant(b.upload(&y, &[batch])?);
        sim.clear_op_log();
        let tape = Tape::new(b);
        let (loss, _) = model.loss(&tape, &xv, &yv)?;
        tape.backward(&loss)?;
        let work = stream_work(&sim.op_log());
        Ok((loss.to_vec(b)?[0], work))
    })
    .unwrap();
    let grads = model
        .parameters()
        .iter()
        .map(|p| b.download(p.grad().unwrap()).unwrap())
        .collect();
    (loss, grads, work)
}

fn total(work: &[(&'static str, usize)]) -> usize {
    work.iter().map(|(_, n)| n).sum()
}

/// Stream work of one per-sample forward+backward at the default size (S = 12, D = 256,
/// FF = 1024), which a captured per-sample graph replays as that many nodes: 125 before the
/// fused epilogues and tail (75 launches, 23 gemms, 25 copies, 2 memsets), 109 with them (62
/// launches, 20 gemms), 44 after the fused attention core, the flat buffers, in-place
/// gradient accumulation, `Tape::linear`, `layer_norm_stream` and adjacent parameter
/// gradients added at once (27 launches, 14 gemms, 2 copies, 1 memset); the budget keeps it
/// from creeping back.
const PER_SAMPLE_BUDGET: usize = 44;

#[test]
#[allow(clippy::print_stdout)] // the count per kind belongs in the test's output (reported)
fn a_per_sample_step_stays_within_its_node_budget() {
    let b = mock(false);
    let model = XAsset::init(&b, XAssetConfig::default(), 3).unwrap();
    let (_, _, work) = step(&b, &model, 1, 12);
    println!(
        "per-sample forward+backward stream work: {} {work:?}",
        total(&work)
    );
    assert!(
        total(&work) <= PER_SAMPLE_BUDGET,
        "{} stream ops per sample, budget {PER_SAMPLE_BUDGET}: {work:?}",
        total(&work)
    );
}

/// Two runs of the same step (fresh devices) are bitwise equal: no reduction depends on
/// timing. At odd sizes (S = 17, D = 24, FF = 37, 3 heads).
#[test]
fn reruns_are_bitwise_equal_at_odd_sizes() {
    let config = XAssetConfig {
        features: 11,
        scales: 17,
        width: 24,
        heads: 3,
        ff: 37,
        layers: 1,
    };
    let run = || {
        let b = mock(true);
        let model = XAsset::init(&b, config, 5).unwrap();
        let (loss, grads, _) = step(&b, &model, 3, 17);
        (loss.to_bits(), grads)
    };
    let (first, second) = (run(), run());
    assert_eq!(first.0, second.0, "loss bits");
    for (i, (a, b)) in first.1.iter().zip(&second.1).enumerate() {
        let (a, b): (Vec<u32>, Vec<u32>) = (
            a.iter().map(|v| v.to_bits()).collect(),
            b.iter().map(|v| v.to_bits()).collect(),
        );
        assert_eq!(a, b, "gradient {i}");
    }
}
