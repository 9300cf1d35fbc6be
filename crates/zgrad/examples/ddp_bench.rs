//! Data-parallel XAsset training on N GPUs of this host, timed for issue 13's scaling table
//! beside `torchrun --nproc_per_node N reference/xasset_ddp_torch.py`.
//!
//! `ddp_bench --gpus N [--iters I]` starts N ranks of itself through zcomm's launcher (one
//! process per GPU, `NCCL_NVLS_ENABLE=0`), each on the device `LOCAL_RANK` names, joined by
//! NCCL (rank 0 hands out the unique id over TCP). With `--gpus 1` it runs in this process,
//! without a collective. Rank 0 prints one JSON object; for weak scaling (256 rows per rank,
//! global batch 256·N) and strong scaling (global batch 256, 256/N per rank), milliseconds per
//! optimiser step, medians:
//!
//! - `captured_ms`: CUDA events around the replay of the captured batched step (zero_grad,
//!   forward, backward, the all-reduce of the flat gradient buffer, the global norm, AdamW),
//!   with the shard already on the device (`Trainer::replay_resident`), as PyTorch's events
//!   around `g.replay()`;
//! - `captured_e2e_ms`: host wall-clock of `train_batch` on the captured step (shard copied in,
//!   replay, loss read back);
//! - `eager_ms`: host wall-clock of an eager `train_batch`;
//! - `samples_per_s`: the global batch over `captured_ms`;
//!
//! and the all-reduce of the flat gradient buffer alone (`allreduce_ms`, events around it).
#![allow(clippy::print_stdout, clippy::print_stderr)]

// Shared with xasset_bench, which uses every helper; this bench uses some.
#[allow(dead_code)]
#[path = "xasset_bench/timing.rs"]
mod timing;

use std::rc::Rc;
use std::time::Duration;
use timing::{Error, EventPair, Json, median_of, wall_ms};
use zcomm::launch::{LaunchSpec, launch};
use zcomm::{Collective, LaunchEnv, NcclCollective, rendezvous};
use zcompute::CudaBackend;
use zdevice::{CudaDriver, Device, DeviceConfig};
use zgrad::rng::SplitMix64;
use zgrad::{ReplayMark, TrainSchedule, Trainer, TrainerConfig, XAsset, XAssetConfig};
use zmem::{Arena, ArenaConfig};

type Gpu = CudaBackend<CudaDriver>;
type Comm = Rc<dyn Collective<Gpu, f32>>;

const PER_RANK: usize = 256;

fn arg(flag: &str) -> Option<String> {
    std::env::args().skip_while(|a| a != flag).nth(1)
}

fn open_gpu(ordinal: u32) -> Result<Gpu, Error> {
    let dev = Device::open(
        CudaDriver::load()?,
        DeviceConfig {
            ordinal,
            sync_deadline: Duration::from_secs(120),
            ..DeviceConfig::default()
        },
    )?;
    let arena = Arena::new(
        dev,
        ArenaConfig {
            initial_bytes: 512 << 20,
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

/// `rows` samples of the default size, the same on every rank (each trains on its shard).
fn data(rows: usize) -> (Vec<f32>, Vec<f32>) {
    let c = XAssetConfig::default();
    let mut rng = SplitMix64::new(1);
    let x = rng
        .normal_vec(rows * c.scales * c.features)
        .iter()
        .map(|&v| v as f32)
        .collect();
    let y = (0..rows)
        .map(|_| f32::from(u8::from(rng.next_f64() > 0.5)))
        .collect();
    (x, y)
}

fn trainer(gpu: &Gpu, comm: Option<&Comm>, capture: bool) -> Result<Trainer<Gpu>, Error> {
    let model = XAsset::init(gpu, XAssetConfig::default(), 0)?;
    let config = TrainerConfig {
        schedule: TrainSchedule::Batched,
        capture,
        ..TrainerConfig::default()
    };
    let t = Trainer::new(gpu.clone(), model, config)?;
    Ok(match comm {
        Some(c) => t.with_collective(Rc::clone(c))?,
        None => t,
    })
}

/// One scaling row: `global` rows per step over every rank.
fn row(gpu: &Gpu, comm: Option<&Comm>, global: usize, iters: usize) -> Result<Json, Error> {
    let (x, y) = data(global);
    let mut out = Json::default();
    out.raw("global_batch", global);
    let mut t = trainer(gpu, comm, true)?;
    let e2e = median_of(3, iters, || {
        Ok(wall_ms(|| Ok(t.train_batch(&x, &y, global)?))?.0)
    })?;
    let ev = EventPair::new(gpu)?;
    let captured = median_of(3, iters, || {
        let mut failed = None;
        t.replay_resident(|mark| {
            let r = match mark {
                ReplayMark::Before => ev.start(),
                ReplayMark::After => ev.end(),
            };
            if let Err(e) = r {
                failed = Some(e);
            }
        })?;
        if let Some(e) = failed {
            return Err(e.into());
        }
        ev.elapsed_ms()
    })?;
    let mut t = trainer(gpu, comm, false)?;
    let eager = median_of(3, iters, || {
        Ok(wall_ms(|| Ok(t.train_batch(&x, &y, global)?))?.0)
    })?;
    out.ms("captured_ms", Some(captured));
    out.ms("captured_e2e_ms", Some(e2e));
    out.ms("eager_ms", Some(eager));
    out.raw(
        "samples_per_s",
        format!("{:.0}", global as f64 / captured * 1e3),
    );
    Ok(out)
}

/// Events around one all-reduce of the flat gradient buffer (eager, on the engine stream).
fn allreduce_ms(gpu: &Gpu, comm: &Comm, iters: usize) -> Result<f64, Error> {
    let t = trainer(gpu, Some(comm), false)?;
    let grads = t.gradients()?;
    let ev = EventPair::new(gpu)?;
    median_of(5, iters, || {
        ev.start()?;
        comm.all_reduce_sum(gpu, &grads, 0)?;
        ev.end()?;
        ev.elapsed_ms()
    })
}

fn rank_main(env: &LaunchEnv, iters: usize) -> Result<(), Error> {
    let info = env.info;
    let gpu = open_gpu(u32::try_from(info.local_rank)?)?;
    let comm: Option<Comm> = if info.world > 1 {
        let master = env
            .master
            .as_ref()
            .ok_or("MASTER_ADDR/MASTER_PORT are not set")?;
        let id = rendezvous::exchange_id(
            master,
            info,
            || Ok(NcclCollective::unique_id()?.to_vec()),
            rendezvous::Config::from_env(master, Duration::from_secs(60))?,
        )?;
        Some(Rc::new(NcclCollective::join(&gpu, info, &id)?))
    } else {
        None
    };
    let weak = row(&gpu, comm.as_ref(), PER_RANK * info.world, iters)?;
    let strong = row(&gpu, comm.as_ref(), PER_RANK, iters)?;
    let allreduce = match &comm {
        Some(c) => Some(allreduce_ms(&gpu, c, iters)?),
        None => None,
    };
    if info.rank == 0 {
        let mut out = Json::default();
        out.str("device", &gpu.device().info().name);
        out.raw("gpus", info.world);
        out.raw("iters", iters);
        out.raw("weak_256_per_rank", weak.finish());
        out.raw("strong_256_global", strong.finish());
        out.ms("allreduce_ms", allreduce);
        println!("{}", out.finish());
    }
    Ok(())
}

fn main() -> Result<(), Error> {
    let gpus: usize = arg("--gpus").map(|v| v.parse()).transpose()?.unwrap_or(1);
    let iters: usize = arg("--iters").map(|v| v.parse()).transpose()?.unwrap_or(30);
    if gpus == 0 || iters == 0 {
        return Err("--gpus and --iters take a positive count".into());
    }
    let env = LaunchEnv::from_env()?;
    if env.info.world == 1 && gpus > 1 {
        let spec = LaunchSpec {
            program: std::env::current_exe()?.into_os_string(),
            args: std::env::args_os().skip(1).collect(),
            ranks: gpus,
            grace: Duration::from_secs(10),
            peer_failure_code: None,
        };
        let launched = launch(&spec, &|| None)?;
        if launched.exit_code() != 0 {
            eprintln!("ddp_bench: {}", launched.message());
            std::process::exit(i32::from(launched.exit_code()));
        }
        return Ok(());
    }
    rank_main(&env, iters)
}
