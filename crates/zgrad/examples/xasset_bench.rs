//! Times one XAsset training step at the default size (F=193, S=12, D=256, H=4, FF=1024,
//! B=256) on CUDA device 0, in both schedules, eager and captured (the batched graph holds
//! zero_grad, forward, backward and AdamW; the per-sample graph one sample's forward+backward),
//! as `reference/xasset_torch.py bench` does for PyTorch. Prints one JSON object: medians of
//! wall-clock milliseconds per optimiser step (each step ends by reading the loss back, so the
//! device has finished), plus the arena's high-water mark.
//!
//! `cargo run --release -p zgrad --features gpu --example xasset_bench [-- --iters N]`
#![allow(clippy::print_stdout)]

use std::time::{Duration, Instant};
use zcompute::CudaBackend;
use zdevice::{CudaDriver, Device, DeviceConfig};
use zgrad::rng::SplitMix64;
use zgrad::{TrainSchedule, Trainer, TrainerConfig, XAsset, XAssetConfig};
use zmem::{Arena, ArenaConfig};

type Gpu = CudaBackend<CudaDriver>;
type Error = Box<dyn std::error::Error>;

/// Median milliseconds of `iters` timed steps after `warm` untimed ones.
fn median_ms(
    warm: usize,
    iters: usize,
    mut step: impl FnMut() -> zgrad::Result<()>,
) -> Result<f64, Error> {
    for _ in 0..warm {
        step()?;
    }
    let mut ms = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t0 = Instant::now();
        step()?;
        ms.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    ms.sort_by(f64::total_cmp);
    Ok(ms[ms.len() / 2])
}

fn run(
    gpu: &Gpu,
    schedule: TrainSchedule,
    capture: bool,
    data: &(Vec<f32>, Vec<f32>),
    iters: usize,
) -> Result<(f64, bool), Error> {
    let model = XAsset::init(gpu, XAssetConfig::default(), 0)?;
    let cfg = TrainerConfig {
        schedule,
        capture,
        ..TrainerConfig::default()
    };
    let mut t = Trainer::new(gpu.clone(), model, cfg)?;
    let (x, y) = data;
    let mut captured = false;
    let warm = if schedule == TrainSchedule::Batched {
        5
    } else {
        2
    };
    let ms = median_ms(warm, iters, || {
        captured = t.train_batch(x, y, 256)?.captured;
        Ok(())
    })?;
    Ok((ms, captured))
}

fn main() -> Result<(), Error> {
    let iters: usize = std::env::args()
        .skip_while(|a| a != "--iters")
        .nth(1)
        .map(|v| v.parse())
        .transpose()?
        .unwrap_or(20);
    let driver = CudaDriver::load()?;
    let dev = Device::open(
        driver,
        DeviceConfig {
            sync_deadline: Duration::from_secs(120),
            ..DeviceConfig::default()
        },
    )?;
    let device = dev.info().name.clone();
    let arena = Arena::new(
        dev,
        ArenaConfig {
            initial_bytes: 256 << 20,
            segment_bytes: 256 << 20,
            cap_bytes: None,
            overflow_reserve_bytes: 64 << 20,
            poison: false,
            timeline_events: 0,
            from_env: Vec::new(),
        },
    )?;
    let gpu = CudaBackend::new(arena)?;
    let c = XAssetConfig::default();
    let mut rng = SplitMix64::new(1);
    let x: Vec<f32> = rng
        .normal_vec(256 * c.scales * c.features)
        .iter()
        .map(|&v| v as f32)
        .collect();
    let y: Vec<f32> = (0..256)
        .map(|_| f32::from(u8::from(rng.next_f64() > 0.5)))
        .collect();
    let data = (x, y);

    let (batched_eager, _) = run(&gpu, TrainSchedule::Batched, false, &data, iters)?;
    let high_water = gpu.arena().diagnostics().high_water;
    let (batched_graph, bg) = run(&gpu, TrainSchedule::Batched, true, &data, iters)?;
    let ps_iters = (iters / 4).max(3);
    let (per_sample_eager, _) = run(&gpu, TrainSchedule::PerSample, false, &data, ps_iters)?;
    let (per_sample_graph, pg) = run(&gpu, TrainSchedule::PerSample, true, &data, ps_iters)?;
    println!(
        "{{\"device\":\"{device}\",\"config\":[{},{},{},{},{}],\"batch\":256,\"iters\":{iters},\
         \"batched_eager_ms\":{batched_eager:.3},\"batched_graph_ms\":{batched_graph:.3},\
         \"batched_graph_captured\":{bg},\"per_sample_eager_ms\":{per_sample_eager:.2},\
         \"per_sample_graph_ms\":{per_sample_graph:.2},\"per_sample_graph_captured\":{pg},\
         \"arena_high_water_MiB_after_batched_eager\":{:.1}}}",
        c.features,
        c.scales,
        c.width,
        c.heads,
        c.ff,
        high_water as f64 / f64::from(1 << 20)
    );
    Ok(())
}
