//! Times one XAsset training step at the default size (F=193, S=12, D=256, H=4, FF=1024,
//! B=256) on CUDA device 0, in both schedules, eager and captured (the batched graph holds
//! zero_grad, forward, backward and AdamW; the per-sample graph one sample's forward+backward),
//! as `reference/xasset_torch.py bench` does for PyTorch. Prints one JSON object: medians of
//! wall-clock milliseconds per optimiser step (each step ends by reading the loss back, so the
//! device has finished), plus the arena's high-water mark.
//!
//! `cargo run --release -p zgrad --features gpu --example xasset_bench [-- --iters N]
//! [--only batched|per-sample]` (`--only` times one schedule, e.g. to profile it alone; the
//! other's fields print as null).
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

/// The value after `flag` on the command line, if any.
fn arg(flag: &str) -> Option<String> {
    std::env::args().skip_while(|a| a != flag).nth(1)
}

/// A timing as JSON: three decimals, or null where the schedule was skipped.
fn json_ms(ms: Option<f64>) -> String {
    ms.map_or_else(|| "null".into(), |v| format!("{v:.3}"))
}

fn main() -> Result<(), Error> {
    let iters: usize = arg("--iters").map(|v| v.parse()).transpose()?.unwrap_or(20);
    let only = arg("--only");
    if let Some(o) = only.as_deref()
        && o != "batched"
        && o != "per-sample"
    {
        return Err(format!("--only takes batched or per-sample, not {o}").into());
    }
    let want = |s: &str| only.as_deref().is_none_or(|o| o == s);
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
            sanitize: false,
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

    let (mut batched_eager, mut batched_graph, mut bg) = (None, None, false);
    let mut high_water = 0.0;
    if want("batched") {
        batched_eager = Some(run(&gpu, TrainSchedule::Batched, false, &data, iters)?.0);
        high_water = gpu.arena().diagnostics().high_water as f64 / f64::from(1 << 20);
        let (ms, captured) = run(&gpu, TrainSchedule::Batched, true, &data, iters)?;
        (batched_graph, bg) = (Some(ms), captured);
    }
    let (mut per_sample_eager, mut per_sample_graph, mut pg) = (None, None, false);
    if want("per-sample") {
        let ps_iters = (iters / 4).max(3);
        per_sample_eager = Some(run(&gpu, TrainSchedule::PerSample, false, &data, ps_iters)?.0);
        let (ms, captured) = run(&gpu, TrainSchedule::PerSample, true, &data, ps_iters)?;
        (per_sample_graph, pg) = (Some(ms), captured);
    }
    println!(
        "{{\"device\":\"{device}\",\"config\":[{},{},{},{},{}],\"batch\":256,\"iters\":{iters},\
         \"batched_eager_ms\":{},\"batched_graph_ms\":{},\
         \"batched_graph_captured\":{bg},\"per_sample_eager_ms\":{},\
         \"per_sample_graph_ms\":{},\"per_sample_graph_captured\":{pg},\
         \"arena_high_water_MiB_after_batched_eager\":{high_water:.1}}}",
        c.features,
        c.scales,
        c.width,
        c.heads,
        c.ff,
        json_ms(batched_eager),
        json_ms(batched_graph),
        json_ms(per_sample_eager),
        json_ms(per_sample_graph),
    );
    Ok(())
}
