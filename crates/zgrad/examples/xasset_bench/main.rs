//! Times XAsset training at the default size (F=193, S=12, D=256, H=4, FF=1024, B=256) on CUDA
//! device 0, in both schedules, eager and captured (the batched graph holds zero_grad, forward,
//! backward, norm and AdamW; the per-sample graph one sample's forward+backward), timed as
//! `crates/zgrad/benches/xasset_torch.py bench` times PyTorch. Prints one JSON object
//! (`benches/compare.py` puts it beside PyTorch's):
//!
//! - `batched_graph_ms`: CUDA events around the replay of the captured batched step with the
//!   batch already on the device (a step from the held batch; the update and the stats read
//!   back are part of every step, outside the events): the GPU time per step, kernels and the
//!   gaps between them, as PyTorch's events around `g.replay()`. `batched_graph_host_ms` is the
//!   same call's host wall-clock, read-back included.
//! - `batched_graph_e2e_ms`: host wall-clock of a pinned `step` on the captured step,
//!   as `xasset_e2e_torch.py` times PyTorch's (`X.copy_(pinned, non_blocking=True)`, replay,
//!   `loss.item()`): the batch copied in from pinned host memory filled once before the loop
//!   (`PinnedBatch`, as PyTorch's `Xp`/`Yp`), the `[lr, t]` slot written, the replay, the
//!   loss (and gradient norm, one read) read back; median after 5 warm steps.
//! - `batched_graph_e2e_host_slice_ms`: the same from a host slice (a host `step`: the
//!   backend copies the slice into its own pinned staging buffers, then the DMA).
//! - `per_sample_graph_ms`: CUDA events around the per-sample schedule's a host `step` (every
//!   sample's forward+backward replayed, the AdamW step, the stats read back; the batch is
//!   uploaded once per step and each replay reads its sample through a device-side index: see
//!   `per_sample_timing`).
//! - `*_first_step_ms`: host wall-clock of a fresh trainer's first captured step (warm-up run,
//!   capture, instantiation); `*_nodes`: nodes of the captured graphs.
//! - `*_eager_ms`: host wall-clock per a host `step` (each ends by reading the loss back), the
//!   median over `--runs` runs (default 3) of each run's median; the runs are listed.
//! - `batched_step_peak_live_MiB` / `batched_step_peak_reserved_MiB`: the arena's peak live
//!   bytes over all classes and its peak reserved bytes over one eager batched step after a
//!   warm one (PyTorch: `max_memory_allocated` / `max_memory_reserved` after
//!   `reset_peak_memory_stats`); the cuBLAS workspace the device reserved at open is beside.
//!
//! `cargo run --release -p zgrad --features gpu --example xasset_bench [-- --iters N]
//! [--runs R] [--only batched|per-sample] [--layers L] [--precision f32|tf32|bf16]` (`--only`
//! times one schedule, e.g. to profile it alone; the other's fields print as null; `--layers`
//! the number of encoder blocks, default 1, as `xasset_torch.py bench --layers L`;
//! `--precision` every trainer's policy, `TrainerConfig::precision`, default f32: under
//! `tf32` or `bf16` the object gains a `"precision"` field naming it, as
//! `xasset_torch.py bench --tf32` / `--bf16` name theirs; under f32 it is as before).
#![allow(clippy::print_stdout)]

mod timing;

use std::time::Duration;
use timing::{Error, EventPair, Json, median, median_of, wall_ms};
use zcompute::CudaBackend;
use zdevice::{CudaDriver, Device, DeviceConfig, DeviceError};
use zgrad::rng::SplitMix64;
use zgrad::{
    PinnedBatch, Precision, ReplayMark, StepSource, TrainSchedule, Trainer, TrainerConfig, XAsset,
    XAssetConfig,
};
use zmem::{Arena, ArenaConfig};

type Gpu = CudaBackend<CudaDriver>;
/// XAsset's trainer on the GPU.
type GpuTrainer = Trainer<Gpu, f32, XAsset<Gpu>>;
const BATCH: usize = 256;
const MIB: f64 = (1u64 << 20) as f64;

struct Bench {
    gpu: Gpu,
    /// The default size with `--layers` blocks.
    config: XAssetConfig,
    x: Vec<f32>,
    y: Vec<f32>,
    iters: usize,
    runs: usize,
    /// Every trainer's precision policy (`--precision`).
    precision: Precision,
}

impl Bench {
    fn trainer(&self, schedule: TrainSchedule, capture: bool) -> Result<GpuTrainer, Error> {
        let model = XAsset::init(&self.gpu, self.config, 0)?;
        self.trainer_of(model, schedule, capture)
    }

    fn trainer_of(
        &self,
        model: XAsset<Gpu>,
        schedule: TrainSchedule,
        capture: bool,
    ) -> Result<GpuTrainer, Error> {
        let cfg = TrainerConfig {
            schedule,
            capture,
            precision: self.precision,
            ..TrainerConfig::default()
        };
        Ok(Trainer::new(self.gpu.clone(), model, cfg)?)
    }

    fn step(&self, t: &mut GpuTrainer) -> Result<bool, Error> {
        Ok(t.step(StepSource::host(&self.x, &self.y, BATCH))?.captured)
    }

    /// The batch in pinned host memory, written in place once (PyTorch's `Xp`, `Yp`).
    fn pinned(&self) -> Result<PinnedBatch<Gpu>, Error> {
        let c = self.config;
        let mut p = PinnedBatch::new(&self.gpu, BATCH, c.scales, c.features)?;
        p.fill(|x, y| {
            x.copy_from_slice(&self.x);
            y.copy_from_slice(&self.y);
        })?;
        Ok(p)
    }

    /// Host wall-clock per eager a host `step`: each run's median, `runs` fresh trainers.
    fn eager_runs(&self, schedule: TrainSchedule) -> Result<Vec<f64>, Error> {
        let (warm, iters) = match schedule {
            TrainSchedule::Batched => (5, self.iters),
            TrainSchedule::PerSample => (2, (self.iters / 6).max(5)),
        };
        (0..self.runs)
            .map(|_| {
                let mut t = self.trainer(schedule, false)?;
                median_of(warm, iters, || Ok(wall_ms(|| self.step(&mut t))?.0))
            })
            .collect()
    }

    /// Peak live and peak reserved MiB of one eager batched step after a warm one, and the
    /// scratch high-water mark (what earlier tables reported).
    fn eager_batched_memory(&self) -> Result<(f64, f64, f64), Error> {
        let mut t = self.trainer(TrainSchedule::Batched, false)?;
        self.step(&mut t)?;
        self.gpu.arena().reset_peaks();
        self.step(&mut t)?;
        let d = self.gpu.arena().diagnostics();
        Ok((
            d.peak_live_bytes as f64 / MIB,
            d.peak_reserved_bytes as f64 / MIB,
            d.high_water as f64 / MIB,
        ))
    }

    /// A fresh captured trainer and its first step's wall-clock milliseconds (warm-up,
    /// capture, instantiation), whether it captured, and its graph's nodes.
    fn first_captured(
        &self,
        schedule: TrainSchedule,
    ) -> Result<(GpuTrainer, f64, bool, Option<usize>), Error> {
        let model = XAsset::init(&self.gpu, self.config, 0)?;
        let (ms, (t, captured)) = wall_ms(|| {
            let mut t = self.trainer_of(model, schedule, true)?;
            let captured = self.step(&mut t)?;
            Ok((t, captured))
        })?;
        let nodes = t.graphs().step.map(|g| g.nodes());
        Ok((t, ms, captured, nodes))
    }
}

/// CUDA-event milliseconds of one resident replay of the captured batched step (the events
/// enclose the replay only), and the call's host wall-clock.
fn resident_ms(t: &mut GpuTrainer, ev: &EventPair) -> Result<(f64, f64), Error> {
    let mut failed: Option<DeviceError> = None;
    let (host, _) = wall_ms(|| {
        Ok(t.step(StepSource::held(|mark| {
            let r = match mark {
                ReplayMark::Before => ev.start(),
                ReplayMark::After => ev.end(),
            };
            if let Err(e) = r {
                failed.get_or_insert(e);
            }
        }))?)
    })?;
    if let Some(e) = failed {
        return Err(e.into());
    }
    Ok((ev.elapsed_ms()?, host))
}

/// The value after `flag` on the command line, if any.
fn arg(flag: &str) -> Option<String> {
    std::env::args().skip_while(|a| a != flag).nth(1)
}

fn open_gpu() -> Result<Gpu, Error> {
    let driver = CudaDriver::load()?;
    let dev = Device::open(
        driver,
        DeviceConfig {
            sync_deadline: Duration::from_secs(120),
            ..DeviceConfig::default()
        },
    )?;
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
    Ok(CudaBackend::new(arena)?)
}

fn batched(b: &Bench, out: &mut Json) -> Result<(), Error> {
    // Memory first, before any capture (as the PyTorch script measures it).
    let (live, reserved, high_water) = b.eager_batched_memory()?;
    out.raw("batched_step_peak_live_MiB", format!("{live:.1}"));
    out.raw("batched_step_peak_reserved_MiB", format!("{reserved:.1}"));
    out.raw(
        "arena_high_water_MiB_after_batched_eager",
        format!("{high_water:.1}"),
    );
    let mut runs = b.eager_runs(TrainSchedule::Batched)?;
    out.list("batched_eager_runs_ms", &runs);
    out.ms("batched_eager_ms", Some(median(&mut runs)));

    let (mut t, first, captured, nodes) = b.first_captured(TrainSchedule::Batched)?;
    out.ms("batched_first_step_ms", Some(first));
    out.raw("batched_graph_captured", captured);
    out.opt("batched_graph_nodes", nodes);
    let pinned = b.pinned()?;
    let e2e = median_of(5, b.iters, || {
        let (ms, replayed) = wall_ms(|| Ok(t.step(StepSource::pinned(&pinned, BATCH))?.captured))?;
        if replayed == captured {
            Ok(ms)
        } else {
            Err("a step from the pinned batch did not replay the captured graph".into())
        }
    })?;
    let e2e_slice = median_of(5, b.iters, || Ok(wall_ms(|| b.step(&mut t))?.0))?;
    let ev = EventPair::new(&b.gpu)?;
    let mut host = Vec::new();
    let gpu = median_of(5, b.iters.max(50), || {
        let (gpu, h) = resident_ms(&mut t, &ev)?;
        host.push(h);
        Ok(gpu)
    })?;
    out.ms("batched_graph_ms", Some(gpu));
    out.ms("batched_graph_host_ms", Some(median(&mut host)));
    out.ms("batched_graph_e2e_ms", Some(e2e));
    out.ms("batched_graph_e2e_host_slice_ms", Some(e2e_slice));
    Ok(())
}

fn per_sample(b: &Bench, out: &mut Json) -> Result<(), Error> {
    let mut runs = b.eager_runs(TrainSchedule::PerSample)?;
    out.list("per_sample_eager_runs_ms", &runs);
    out.ms("per_sample_eager_ms", Some(median(&mut runs)));
    let (mut t, first, captured, nodes) = b.first_captured(TrainSchedule::PerSample)?;
    out.ms("per_sample_first_step_ms", Some(first));
    out.raw("per_sample_graph_captured", captured);
    out.opt("per_sample_graph_nodes", nodes);
    let ev = EventPair::new(&b.gpu)?;
    let ms = median_of(2, (b.iters / 6).max(5), || {
        ev.start()?;
        b.step(&mut t)?;
        ev.end()?;
        ev.elapsed_ms()
    })?;
    out.ms("per_sample_graph_ms", Some(ms));
    out.str(
        "per_sample_timing",
        "CUDA events around `Trainer::step` from a host slice: the batch copied in once (one host-to-device upload), then one graph launch per sample reading its sample through a device-side index, the AdamW step and the stats read back",
    );
    Ok(())
}

fn main() -> Result<(), Error> {
    let iters: usize = arg("--iters").map(|v| v.parse()).transpose()?.unwrap_or(30);
    let runs: usize = arg("--runs").map(|v| v.parse()).transpose()?.unwrap_or(3);
    if iters == 0 || runs == 0 {
        return Err("--iters and --runs take a positive count".into());
    }
    let only = arg("--only");
    if let Some(o) = only.as_deref()
        && o != "batched"
        && o != "per-sample"
    {
        return Err(format!("--only takes batched or per-sample, not {o}").into());
    }
    let want = |s: &str| only.as_deref().is_none_or(|o| o == s);
    let precision = match arg("--precision") {
        None => Precision::F32,
        Some(name) => Precision::from_name(&name)
            .ok_or_else(|| format!("--precision takes f32, tf32 or bf16, not {name}"))?,
    };
    let layers: usize = arg("--layers").map(|v| v.parse()).transpose()?.unwrap_or(1);
    if layers == 0 {
        return Err("--layers takes a positive count".into());
    }
    let c = XAssetConfig {
        layers,
        ..XAssetConfig::default()
    };
    let gpu = open_gpu()?;
    let mut rng = SplitMix64::new(1);
    let x: Vec<f32> = rng
        .normal_vec(BATCH * c.scales * c.features)
        .iter()
        .map(|&v| v as f32)
        .collect();
    let y: Vec<f32> = (0..BATCH)
        .map(|_| f32::from(u8::from(rng.next_f64() > 0.5)))
        .collect();
    let mut out = Json::default();
    out.str("device", &gpu.device().info().name);
    out.raw(
        "config",
        format!(
            "[{},{},{},{},{}]",
            c.features, c.scales, c.width, c.heads, c.ff
        ),
    );
    out.raw("layers", c.layers);
    out.raw("parameters", c.parameter_count());
    out.raw("batch", BATCH);
    out.raw("iters", iters);
    out.raw("runs", runs);
    if precision != Precision::F32 {
        out.str("precision", precision.name());
    }
    out.raw(
        "blas_workspace_MiB",
        format!(
            "{:.1}",
            DeviceConfig::default().blas_workspace_bytes as f64 / MIB
        ),
    );
    let b = Bench {
        gpu,
        config: c,
        x,
        y,
        iters,
        runs,
        precision,
    };
    if want("batched") {
        batched(&b, &mut out)?;
    }
    if want("per-sample") {
        per_sample(&b, &mut out)?;
    }
    println!("{}", out.finish());
    Ok(())
}
