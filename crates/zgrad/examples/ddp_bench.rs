//! Data-parallel XAsset training on N GPUs of this host: weak and strong scaling of the captured
//! step, the gradient all-reduce overlapped with backward and not, against one GPU, in one call
//! (issue 21 item 5; `torchrun --nproc_per_node N crates/zgrad/benches/xasset_ddp_torch.py` is
//! PyTorch's side).
//!
//! `ddp_bench --gpus N [--iters I] [--grad-sync both|all|LIST] [--bucket-mib M] [--rounds R]
//! [--strong 256,512,1024] [--warmup-steps W] [--nccl-channels C]
//! [--stream-priority same|engine|comm] [--overlap-ctas B]
//! [--last-bucket peer|nccl]` starts N ranks of itself
//! through zcomm's launcher (one process per GPU, `NCCL_NVLS_ENABLE=0`,
//! `NCCL_GRAPH_MIXING_SUPPORT=0` unless the environment sets it, and with C > 0 NCCL's
//! channels limited to C, as ztrain's `--nccl-channels`; 0, the default, leaves NCCL's own
//! choice, as does a set `NCCL_MAX_NCHANNELS` or `NCCL_MAX_CTAS`; JSON key
//! `nccl_max_nchannels`), each on the device `LOCAL_RANK` names, joined by NCCL (rank 0
//! hands out the unique id over TCP). With `--gpus 1` it runs in this process, without a
//! collective. Rank 0 prints one JSON object. For each way of summing the gradients
//! (`overlapped`: buckets of `--bucket-mib` MiB, default 1, tapering toward the buffer's start,
//! all-reduced on a second stream as backward finishes them; `uniform`: the same without the
//! taper, every bucket at least `--bucket-mib`, the plan before it; `after`: one all-reduce of
//! the flat gradient buffer after backward; `--grad-sync` takes a comma-separated list of them,
//! `both` (the default) is `overlapped,after`, `all` the three, measured in the same processes;
//! JSON keys `overlapped`, `overlapped_uniform`, `after_backward`), the weak-scaling row
//! (256 rows per rank, global batch 256·N) and one strong-scaling row per `--strong` global batch
//! (each rank its shard of it), milliseconds per optimiser step, medians:
//!
//! - `captured_ms`: CUDA events around the replay of the captured batched step (zero_grad,
//!   forward, backward, the gradient all-reduce, the global norm, AdamW), with the shard already
//!   on the device (a step from the held batch, whose stats are read back after every step), as
//!   PyTorch's events around `g.replay()`;
//! - `pipelined_ms`: host wall-clock per step of 32 steps queued back to back on the data set
//!   loaded on the device (`queue` of loaded rows, read back once at the end: ztrain's
//!   `--data-on device` loop), so that one rank's host never holds the others' GPUs;
//! - `captured_e2e_ms`: host wall-clock of a host `step` on the captured step (shard copied in,
//!   replay, loss read back);
//! - `eager_ms`: host wall-clock of an eager a host `step`;
//! - `samples_per_s`: the global batch over `pipelined_ms`;
//!
//! `--stream-priority` says which of a rank's two streams the device favours when both have
//! blocks waiting for SMs: `engine` (the default, as ztrain's ranks) gives the engine stream
//! (forward, backward, the optimiser) the device's greatest priority, `same` leaves both at
//! CUDA's default, `comm` gives it to the stream of the overlapped bucket all-reduces (JSON key
//! `stream_priority`). `--overlap-ctas B` runs the overlapped bucket all-reduces on a second
//! communicator whose collectives take at most B thread blocks (NCCL's `maxCTAs`), the last
//! bucket's on the first (JSON key `overlap_ctas`, 0 for one communicator).
//! `--last-bucket nccl` keeps the bucket backward finishes last on NCCL's all-reduce and the
//! norm on a launch of its own (the step before the peer-memory tail); `peer`, the default, sums
//! it through the ranks' mapped device memory with the norm in one launch, where every rank can
//! map every other's (JSON key `last_bucket`).
//!
//! Before the first timed row every rank replays the captured weak-scaling step `W` times
//! (default 2000, about 1.5 s): the first process a freshly started GPU machine runs measured its
//! first rows 9-18% slower than every later process, while the one-GPU rows, measured last,
//! were always warm (`--warmup-steps 0` measures cold).
//!
//! then, with N > 1, rank 0 alone (the communicators closed) measures the same rows on one GPU
//! (`one_gpu`), and prints the weak-scaling efficiency T(1)/T(N) and the strong-scaling speedup
//! T(1)/T(N) at each global batch, by `captured_ms` and by `pipelined_ms`; and the all-reduce of
//! the flat gradient buffer alone (`allreduce_ms`, events around it, on the engine stream).
//!
//! `--rounds R` (default 5; 0 skips them), before the communicators close: the weak-scaling
//! step's one-GPU and N-GPU replays alternated R times in the same processes (`rounds.rs`), each
//! round's efficiency on stderr and, under `weak_rounds`, every round's `one_gpu_ms`,
//! `<sync>_ms` and `<sync>_efficiency`, with `<sync>_efficiency_median` and `_range`: the
//! figure to quote, where the single `scaling_*` ratios compare rows measured at different
//! moments: a trainer made after the rows' trainers were made and dropped runs its step about
//! 2.5% slower than the first ones (measured; not the time elapsed; cause not known), so the
//! weak row, whose N-GPU figure is taken first and one-GPU figure last, overstates the
//! efficiency by about that much (docs/benchmarks.md).
#![allow(clippy::print_stdout, clippy::print_stderr)]

// Shared with xasset_bench, which uses every helper; this bench uses some.
#[allow(dead_code)]
#[path = "xasset_bench/timing.rs"]
mod timing;

#[path = "ddp_bench/rounds.rs"]
mod rounds;

use std::rc::Rc;
use std::time::{Duration, Instant};
use timing::{Error, EventPair, Json, median_of, wall_ms};
use zcomm::launch::{LaunchSpec, launch};
use zcomm::{Collective, JoinOptions, LaunchEnv, NcclCollective, rendezvous};
use zcompute::CudaBackend;
use zdevice::{CudaDriver, Device, DeviceConfig, StreamPriority};
use zgrad::rng::SplitMix64;
use zgrad::{
    GradSync, Load, ReplayMark, StepSource, TrainSchedule, Trainer, TrainerConfig, XAsset,
    XAssetConfig,
};
use zmem::{Arena, ArenaConfig};

type Gpu = CudaBackend<CudaDriver>;
type Comm = Rc<dyn Collective<Gpu, f32>>;

const PER_RANK: usize = 256;

fn arg(flag: &str) -> Option<String> {
    std::env::args().skip_while(|a| a != flag).nth(1)
}

fn open_gpu(ordinal: u32, engine_priority: StreamPriority) -> Result<Gpu, Error> {
    let dev = Device::open(
        CudaDriver::load()?,
        DeviceConfig {
            ordinal,
            sync_deadline: Duration::from_secs(120),
            engine_priority,
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

fn trainer(
    gpu: &Gpu,
    comm: Option<&Comm>,
    capture: bool,
    sync: GradSync,
) -> Result<Trainer<Gpu, f32, XAsset<Gpu>>, Error> {
    let model = XAsset::init(gpu, XAssetConfig::default(), 0)?;
    let config = TrainerConfig {
        schedule: TrainSchedule::Batched,
        capture,
        ..TrainerConfig::default()
    };
    let t = Trainer::new(gpu.clone(), model, config)?;
    Ok(match comm {
        Some(c) => t.with_collective(Rc::clone(c))?.with_grad_sync(sync)?,
        None => t,
    })
}

/// Steps queued back to back in `pipelined_ms`.
const PIPELINED: usize = 32;

/// Host milliseconds per step of `PIPELINED` steps queued on the loaded data set, read back
/// once (median over `iters / 4 + 1` windows after two untimed ones).
fn pipelined_ms(
    t: &mut Trainer<Gpu, f32, XAsset<Gpu>>,
    global: usize,
    iters: usize,
) -> Result<f64, Error> {
    let rows: Vec<usize> = (0..global).collect();
    let planned = rows.repeat(PIPELINED);
    median_of(2, iters / 4 + 1, || {
        let t0 = Instant::now();
        // As ztrain: the window's rows planned, so its steps upload nothing between them.
        t.load(Load::Order {
            order: &planned,
            batch: global,
        })?;
        for _ in 0..PIPELINED {
            t.queue(StepSource::loaded(&rows), PIPELINED)?;
        }
        t.drain()?;
        Ok(t0.elapsed().as_secs_f64() * 1e3 / PIPELINED as f64)
    })
}

/// Events around the replay of the captured step (a step from the held batch), median.
fn captured_ms(
    gpu: &Gpu,
    t: &mut Trainer<Gpu, f32, XAsset<Gpu>>,
    iters: usize,
) -> Result<f64, Error> {
    let ev = EventPair::new(gpu)?;
    median_of(3, iters, || {
        let mut failed = None;
        t.step(StepSource::held(|mark| {
            let r = match mark {
                ReplayMark::Before => ev.start(),
                ReplayMark::After => ev.end(),
            };
            if let Err(e) = r {
                failed = Some(e);
            }
        }))?;
        if let Some(e) = failed {
            return Err(e.into());
        }
        ev.elapsed_ms()
    })
}

/// Replays the captured weak-scaling step `steps` times, untimed, so that the first timed row
/// does not run on a cold GPU and communicator (every rank the same count: the step's
/// collectives pair up).
fn warm_up(gpu: &Gpu, comm: Option<&Comm>, world: usize, steps: usize) -> Result<(), Error> {
    if steps == 0 {
        return Ok(());
    }
    let global = PER_RANK * world;
    let (x, y) = data(global);
    let mut t = trainer(gpu, comm, true, GradSync::AfterBackward)?;
    t.step(StepSource::host(&x, &y, global))?;
    for _ in 0..steps {
        t.step(StepSource::held(|_| {}))?;
    }
    Ok(())
}

/// One scaling row: `global` rows per step over every rank.
fn row(
    gpu: &Gpu,
    comm: Option<&Comm>,
    global: usize,
    iters: usize,
    sync: GradSync,
) -> Result<(Json, [f64; 2]), Error> {
    let (x, y) = data(global);
    let mut out = Json::default();
    out.raw("global_batch", global);
    let mut t = trainer(gpu, comm, true, sync)?;
    let e2e = median_of(3, iters, || {
        Ok(wall_ms(|| Ok(t.step(StepSource::host(&x, &y, global))?))?.0)
    })?;
    let captured = captured_ms(gpu, &mut t, iters)?;
    t.load(Load::Training {
        x: &x,
        y: &y,
        n: global,
    })?;
    let pipelined = pipelined_ms(&mut t, global, iters)?;
    drop(t);
    let mut t = trainer(gpu, comm, false, sync)?;
    let eager = median_of(3, iters, || {
        Ok(wall_ms(|| Ok(t.step(StepSource::host(&x, &y, global))?))?.0)
    })?;
    out.ms("captured_ms", Some(captured));
    out.ms("pipelined_ms", Some(pipelined));
    out.ms("captured_e2e_ms", Some(e2e));
    out.ms("eager_ms", Some(eager));
    out.raw(
        "samples_per_s",
        format!("{:.0}", global as f64 / pipelined * 1e3),
    );
    Ok((out, [captured, pipelined]))
}

/// The weak row (256 per rank) and the strong rows (each global batch): their JSON and times.
type Rows = (Json, Vec<(usize, [f64; 2])>);

fn rows(
    gpu: &Gpu,
    comm: Option<&Comm>,
    world: usize,
    strong: &[usize],
    iters: usize,
    sync: GradSync,
) -> Result<Rows, Error> {
    let mut out = Json::default();
    let mut times = Vec::new();
    let (weak, t) = row(gpu, comm, PER_RANK * world, iters, sync)?;
    out.raw("weak_256_per_rank", weak.finish());
    times.push((0, t));
    for &global in strong {
        let (r, t) = row(gpu, comm, global, iters, sync)?;
        out.raw(&format!("strong_{global}_global"), r.finish());
        times.push((global, t));
    }
    Ok((out, times))
}

/// Events around one all-reduce of the flat gradient buffer (eager, on the engine stream).
fn allreduce_ms(gpu: &Gpu, comm: &Comm, iters: usize) -> Result<f64, Error> {
    let t = trainer(gpu, Some(comm), false, GradSync::AfterBackward)?;
    let grads = t.model().flat_gradients()?;
    let ev = EventPair::new(gpu)?;
    median_of(5, iters, || {
        ev.start()?;
        comm.all_reduce_sum(gpu, &grads, 0)?;
        ev.end()?;
        ev.elapsed_ms()
    })
}

/// What the command line asks for.
struct Args {
    iters: usize,
    rounds: usize,
    warmup_steps: usize,
    syncs: Vec<(&'static str, GradSync)>,
    strong: Vec<usize>,
    /// `--stream-priority`: its name, the engine stream's priority, the collectives' stream's.
    priority: (&'static str, StreamPriority, StreamPriority),
    /// `--overlap-ctas`: 0 for one communicator.
    overlap_ctas: u32,
    /// `--last-bucket nccl`: the last bucket on NCCL's all-reduce, the norm on its own launch.
    last_bucket_on_nccl: bool,
}

fn args() -> Result<Args, Error> {
    let iters: usize = arg("--iters").map(|v| v.parse()).transpose()?.unwrap_or(30);
    let warmup_steps: usize = arg("--warmup-steps")
        .map(|v| v.parse())
        .transpose()?
        .unwrap_or(2000);
    let mib: f64 = arg("--bucket-mib")
        .map(|v| v.parse())
        .transpose()?
        .unwrap_or(1.0);
    if iters == 0 || !(mib > 0.0 && mib <= 4096.0) {
        return Err("--iters takes a positive count, --bucket-mib a size in (0, 4096]".into());
    }
    let overlapped = GradSync::Overlapped {
        bucket_bytes: ((mib * 1048576.0) as usize).max(4),
    };
    let uniform = GradSync::OverlappedUniform {
        bucket_bytes: ((mib * 1048576.0) as usize).max(4),
    };
    let mut syncs = Vec::new();
    for name in arg("--grad-sync").as_deref().unwrap_or("both").split(',') {
        let more: &[(&'static str, GradSync)] = match name.trim() {
            "both" => &[
                ("overlapped", overlapped),
                ("after_backward", GradSync::AfterBackward),
            ],
            "all" => &[
                ("overlapped", overlapped),
                ("overlapped_uniform", uniform),
                ("after_backward", GradSync::AfterBackward),
            ],
            "overlapped" => &[("overlapped", overlapped)],
            "uniform" => &[("overlapped_uniform", uniform)],
            "after" => &[("after_backward", GradSync::AfterBackward)],
            other => {
                return Err(format!(
                    "--grad-sync {other}: expected both, all, or a comma-separated list of \
                     overlapped, uniform and after"
                )
                .into());
            }
        };
        for &(n, sync) in more {
            if !syncs.iter().any(|&(m, _)| m == n) {
                syncs.push((n, sync));
            }
        }
    }
    let strong = arg("--strong")
        .unwrap_or_else(|| "256,512,1024".into())
        .split(',')
        .map(|v| v.trim().parse::<usize>().map_err(Error::from))
        .collect::<Result<Vec<_>, _>>()?;
    if strong.contains(&0) {
        return Err("--strong takes positive global batch sizes".into());
    }
    let rounds: usize = arg("--rounds").map(|v| v.parse()).transpose()?.unwrap_or(5);
    let (normal, high) = (StreamPriority::Normal, StreamPriority::High);
    let priority = match arg("--stream-priority").as_deref().unwrap_or("engine") {
        "same" => ("same", normal, normal),
        "engine" => ("engine", high, normal),
        "comm" => ("comm", normal, high),
        other => {
            return Err(format!("--stream-priority {other}: expected same, engine or comm").into());
        }
    };
    let overlap_ctas: u32 = arg("--overlap-ctas")
        .map(|v| v.parse())
        .transpose()?
        .unwrap_or(0);
    let last_bucket_on_nccl = match arg("--last-bucket").as_deref().unwrap_or("peer") {
        "peer" => false,
        "nccl" => true,
        other => return Err(format!("--last-bucket {other}: expected peer or nccl").into()),
    };
    Ok(Args {
        priority,
        overlap_ctas,
        last_bucket_on_nccl,
        iters,
        rounds,
        warmup_steps,
        syncs,
        strong,
    })
}

/// T(1)/T(N) for every row of `many` by its one-GPU twin in `one`: `[captured, pipelined]`.
fn ratios(one: &[(usize, [f64; 2])], many: &[(usize, [f64; 2])]) -> String {
    let mut out = Json::default();
    for ((g, t1), (_, tn)) in one.iter().zip(many) {
        let key = if *g == 0 {
            "weak".to_string()
        } else {
            format!("strong_{g}")
        };
        out.raw(
            &key,
            format!("[{:.4}, {:.4}]", t1[0] / tn[0], t1[1] / tn[1]),
        );
    }
    out.finish()
}

fn rank_main(env: &LaunchEnv, args: &Args) -> Result<(), Error> {
    let info = env.info;
    let (priority, engine_priority, side_priority) = args.priority;
    let gpu = open_gpu(u32::try_from(info.local_rank)?, engine_priority)?;
    let mut out = Json::default();
    out.str("device", &gpu.device().info().name);
    out.str("stream_priority", priority);
    out.raw("overlap_ctas", args.overlap_ctas);
    out.str(
        "last_bucket",
        if args.last_bucket_on_nccl {
            "nccl"
        } else {
            "peer"
        },
    );
    out.raw("gpus", info.world);
    out.raw("iters", args.iters);
    out.raw("rounds", args.rounds);
    out.raw("warmup_steps", args.warmup_steps);
    // What this rank's NCCL was given (the launcher's limit, or the user's own).
    out.str(
        "nccl_max_nchannels",
        &std::env::var("NCCL_MAX_NCHANNELS").unwrap_or_else(|_| "NCCL's choice".into()),
    );
    if info.world == 1 {
        warm_up(&gpu, None, 1, args.warmup_steps)?;
        let (one, _) = rows(
            &gpu,
            None,
            1,
            &args.strong,
            args.iters,
            GradSync::AfterBackward,
        )?;
        out.raw("one_gpu", one.finish());
        println!("{}", out.finish());
        return Ok(());
    }
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
    let options = JoinOptions {
        side_priority,
        overlap_ctas: (args.overlap_ctas > 0).then_some(args.overlap_ctas),
        last_bucket_on_nccl: args.last_bucket_on_nccl,
    };
    let comm: Comm = Rc::new(NcclCollective::join_with(&gpu, info, &id, options)?);
    warm_up(&gpu, Some(&comm), info.world, args.warmup_steps)?;
    let mut many = Vec::new();
    for &(name, sync) in &args.syncs {
        let (json, times) = rows(
            &gpu,
            Some(&comm),
            info.world,
            &args.strong,
            args.iters,
            sync,
        )?;
        out.raw(name, json.finish());
        many.push((name, times));
    }
    out.ms("allreduce_ms", Some(allreduce_ms(&gpu, &comm, args.iters)?));
    let weak_rounds = rounds::weak_rounds(
        &gpu,
        &comm,
        info.world,
        args.rounds,
        args.iters,
        &args.syncs,
    )?;
    // Every rank closes its communicator here; rank 0 then measures one GPU alone.
    drop(comm);
    if info.rank != 0 {
        return Ok(());
    }
    let (one, one_rows) = rows(
        &gpu,
        None,
        1,
        &args.strong,
        args.iters,
        GradSync::AfterBackward,
    )?;
    out.raw("one_gpu", one.finish());
    if let Some(weak_rounds) = weak_rounds {
        out.raw("weak_rounds", weak_rounds.finish());
    }
    for (name, times) in &many {
        out.raw(
            &format!("scaling_{name}_captured_pipelined"),
            ratios(&one_rows, times),
        );
    }
    println!("{}", out.finish());
    Ok(())
}

fn main() -> Result<(), Error> {
    let gpus: usize = arg("--gpus").map(|v| v.parse()).transpose()?.unwrap_or(1);
    let args = args()?;
    if gpus == 0 {
        return Err("--gpus takes a positive count".into());
    }
    let env = LaunchEnv::from_env()?;
    if env.info.world == 1 && gpus > 1 {
        let channels: u32 = arg("--nccl-channels")
            .map(|v| v.parse())
            .transpose()?
            .unwrap_or(0);
        let spec = LaunchSpec {
            program: std::env::current_exe()?.into_os_string(),
            args: std::env::args_os().skip(1).collect(),
            ranks: gpus,
            grace: Duration::from_secs(10),
            peer_failure_code: None,
            nccl_max_channels: (channels > 0).then_some(channels),
        };
        let launched = launch(&spec, &|| None)?;
        if launched.exit_code() != 0 {
            eprintln!("ddp_bench: {}", launched.message());
            std::process::exit(i32::from(launched.exit_code()));
        }
        return Ok(());
    }
    rank_main(&env, &args)
}
