//! Times XAsset training on the CPU backend at the default size (F=193, S=12, D=256, H=4,
//! FF=1024), float32, in both schedules, and PyTorch eager on the same threads beside it when
//! PyTorch is installed (`benches/xasset_cpu_torch.py`, run with `$ZGPU_PYTHON`, else
//! `python3`), with the ratios ours / PyTorch in samples per second:
//!
//! - batched: one a host `step` of `--batch` samples (default 256): forward, backward, AdamW.
//! - per-sample: one a host `step` of `--per-sample` samples (default 32) in the per-sample
//!   schedule: each sample's forward and backward, then one AdamW step.
//!
//! Each figure is the median over `--iters` steps (default 10) after warm-up steps, at
//! `--threads N` (default: the machine's processors, or `ZGPU_CPU_THREADS`) and again at 1
//! thread, for ours and PyTorch: wall-clock, the CPU time of all the process's threads (Linux)
//! and their ratio, the threads kept busy. Wall-clock ratios need an idle machine; the CPU time
//! at 1 thread is the step's work, which other load disturbs least. For ours at N threads it
//! also prints how the CPU time divides between the calling thread (the small ops, and its
//! share of every split op) and the helper threads, and what the split costs against 1 thread.
//! `--only batched|per-sample` runs one schedule; `--no-torch` skips PyTorch. `--rounds R`
//! repeats the whole measurement R times (ours, then PyTorch right after, each round with its
//! load average) and ends with the median and range of the rounds' wall-clock ratios: on a
//! machine others use, one round's ratio moves with the load of the minute it ran in.
//!
//! `cargo run --release -p zgrad --example cpu_bench -- [--threads N] [--iters N]
//! [--rounds R] [--batch N] [--per-sample N] [--only batched|per-sample] [--no-torch]`
#![allow(clippy::print_stdout)]

use std::process::Command;
use std::time::Instant;
use zcompute::CpuBackend;
use zgrad::rng::SplitMix64;
use zgrad::{StepSource, TrainSchedule, Trainer, TrainerConfig, XAsset, XAssetConfig};

type Error = Box<dyn std::error::Error>;

/// The value after `flag` on the command line, if any.
fn arg(flag: &str) -> Option<String> {
    std::env::args().skip_while(|a| a != flag).nth(1)
}

fn num(flag: &str, default: usize) -> Result<usize, Error> {
    arg(flag).map_or(Ok(default), |v| {
        v.parse()
            .map_err(|_| format!("{flag} wants a whole number, got {v:?}").into())
    })
}

/// CPU milliseconds of this process's threads so far (Linux; 0 elsewhere): all of them, and
/// the calling (main) thread alone.
fn cpu_ms() -> (f64, f64) {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return (0.0, 0.0);
    };
    let main = std::process::id().to_string();
    let (mut all, mut own) = (0u64, 0u64);
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("schedstat")) else {
            continue;
        };
        let ns = stat
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        all += ns;
        if task.file_name().to_str() == Some(main.as_str()) {
            own += ns;
        }
    }
    (all as f64 / 1e6, own as f64 / 1e6)
}

/// Median figures of one step, in milliseconds.
#[derive(Clone, Copy)]
struct Timing {
    wall: f64,
    /// CPU time of all threads.
    cpu: f64,
    /// CPU time of the calling thread.
    serial: f64,
}

impl Timing {
    const NONE: Timing = Timing {
        wall: f64::NAN,
        cpu: f64::NAN,
        serial: f64::NAN,
    };
}

/// Median wall-clock, CPU and calling-thread CPU milliseconds of `iters` steps after `warm`
/// steps (each the median of its own series).
fn median_ms(
    warm: usize,
    iters: usize,
    mut step: impl FnMut() -> Result<(), Error>,
) -> Result<Timing, Error> {
    for _ in 0..warm {
        step()?;
    }
    let mut series = [(); 3].map(|()| Vec::with_capacity(iters));
    for _ in 0..iters {
        let (t, (c, s)) = (Instant::now(), cpu_ms());
        step()?;
        let (c2, s2) = cpu_ms();
        series[0].push(t.elapsed().as_secs_f64() * 1e3);
        series[1].push(c2 - c);
        series[2].push(s2 - s);
    }
    let [wall, cpu, serial] = series.map(|mut v| {
        v.sort_by(f64::total_cmp);
        v[iters / 2]
    });
    Ok(Timing { wall, cpu, serial })
}

/// One schedule's figures: its name as `--only` takes it, and samples per step.
#[derive(Clone, Copy)]
struct Schedule {
    name: &'static str,
    schedule: TrainSchedule,
    samples: usize,
}

/// Our step of `s` on `threads` threads.
fn ours(s: Schedule, threads: usize, iters: usize) -> Result<Timing, Error> {
    zcompute::cpu::set_threads(threads)?;
    let cfg = XAssetConfig::default();
    let per = cfg.scales * cfg.features;
    let mut rng = SplitMix64::new(7);
    let x: Vec<f32> = (0..s.samples * per).map(|_| rng.normal() as f32).collect();
    let y: Vec<f32> = (0..s.samples).map(|i| (i % 2) as f32).collect();
    let model = XAsset::init(&CpuBackend, cfg, 0)?;
    let tc = TrainerConfig {
        schedule: s.schedule,
        ..TrainerConfig::default()
    };
    let mut t = Trainer::new(CpuBackend, model, tc)?;
    median_ms(2, iters, || {
        t.step(StepSource::host(&x, &y, s.samples))?;
        Ok(())
    })
}

/// PyTorch's `key=value` lines for `only` (a schedule's name or `all`) on `threads`, or why
/// there are none.
fn torch(
    threads: usize,
    [batch, per_sample]: [usize; 2],
    iters: usize,
    only: &str,
) -> Result<Vec<(String, String)>, String> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/xasset_cpu_torch.py");
    let python = std::env::var("ZGPU_PYTHON").unwrap_or_else(|_| "python3".into());
    let flags = [
        ("--threads", threads.to_string()),
        ("--batch", batch.to_string()),
        ("--per-sample", per_sample.to_string()),
        ("--iters", iters.to_string()),
        ("--only", only.to_owned()),
    ];
    let out = Command::new(&python)
        .arg(script)
        .args(flags.iter().flat_map(|(k, v)| [*k, v.as_str()]))
        .output()
        .map_err(|e| format!("could not run {python}: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "{python} {script} failed (PyTorch not installed? set ZGPU_PYTHON): {}",
            err.lines().last().unwrap_or("")
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect())
}

/// PyTorch's timing of schedule `name` from its `key=value` lines (the calling thread's CPU
/// time is not measured there).
fn torch_timing(kv: &[(String, String)], name: &str) -> Timing {
    let key = name.replace('-', "_");
    let get = |k: &str| {
        kv.iter()
            .find(|(key, _)| key == k)
            .and_then(|(_, v)| v.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    Timing {
        wall: get(&format!("{key}_ms")),
        cpu: get(&format!("{key}_cpu_ms")),
        serial: f64::NAN,
    }
}

fn row(who: &str, s: Schedule, threads: usize, t: Timing) {
    let what = format!("{who} {} ({} samples)", s.name, s.samples);
    println!(
        "{what:34} {threads:>7} {:>9.2} {:>9.2} {:>6.2} {:>10.1}",
        t.wall,
        t.cpu,
        t.cpu / t.wall,
        s.samples as f64 / t.wall * 1e3
    );
}

/// How our step's CPU time at `threads` divides between the calling thread (which runs the
/// small ops alone and takes its share of every split one) and the helper threads, against
/// the 1-thread step's CPU time (the work): the difference is what the split costs.
fn serial_line(s: Schedule, threads: usize, at: Timing, one: Timing) {
    println!(
        "ours {} at {threads} threads: {:.2} ms CPU on the calling thread, {:.2} ms on the \
         {} helper thread(s); {:.2} ms in all against {:.2} ms at 1 thread ({:+.1}%)",
        s.name,
        at.serial,
        at.cpu - at.serial,
        threads - 1,
        at.cpu,
        one.cpu,
        (at.cpu / one.cpu - 1.0) * 100.0
    );
}

/// What one round measures: the schedules, the thread counts (the asked one, then 1), steps
/// per figure, the batch sizes and `--only`.
struct Plan {
    schedules: Vec<Schedule>,
    counts: Vec<usize>,
    threads: usize,
    iters: usize,
    sizes: [usize; 2],
    only: String,
    torch: bool,
}

fn main() -> Result<(), Error> {
    let threads = match arg("--threads") {
        Some(v) => zcompute::cpu::parse_threads(&v)?,
        None => zcompute::cpu::default_threads()?,
    };
    let iters = num("--iters", 10)?.max(1);
    let rounds = num("--rounds", 1)?.max(1);
    let (batch, per_sample) = (num("--batch", 256)?.max(1), num("--per-sample", 32)?.max(1));
    let only = arg("--only");
    let schedules: Vec<Schedule> = [
        ("batched", TrainSchedule::Batched, batch),
        ("per-sample", TrainSchedule::PerSample, per_sample),
    ]
    .into_iter()
    .filter(|(name, ..)| only.as_deref().is_none_or(|o| o == *name))
    .map(|(name, schedule, samples)| Schedule {
        name,
        schedule,
        samples,
    })
    .collect();
    let plan = Plan {
        schedules,
        // The asked count, then 1 thread: the step's work, which other load disturbs least.
        counts: if threads == 1 {
            vec![1]
        } else {
            vec![threads, 1]
        },
        threads,
        iters,
        sizes: [batch, per_sample],
        only: only.unwrap_or_else(|| "all".into()),
        torch: !std::env::args().any(|a| a == "--no-torch"),
    };
    // Each round's ours / PyTorch by wall-clock at `threads`, per schedule.
    let mut ratios: Vec<(&str, Vec<f64>)> = Vec::new();
    for r in 1..=rounds {
        if rounds > 1 {
            println!("round {r} of {rounds}, load average {}", load_average());
        }
        for (name, ratio) in round(&plan)? {
            match ratios.iter_mut().find(|(n, _)| *n == name) {
                Some((_, v)) => v.push(ratio),
                None => ratios.push((name, vec![ratio])),
            }
        }
    }
    if rounds > 1 {
        for (name, mut v) in ratios {
            v.sort_by(f64::total_cmp);
            let list: Vec<String> = v.iter().map(|r| format!("{r:.2}")).collect();
            println!(
                "ours / PyTorch, {name} samples/s by wall-clock at {threads} threads over {} \
                 rounds: median {:.2}x, range {:.2}-{:.2}x ({})",
                v.len(),
                v[v.len() / 2],
                v[0],
                v[v.len() - 1],
                list.join(", ")
            );
        }
    }
    Ok(())
}

/// The 1-minute load average (Linux; "?" elsewhere): other work on the machine, which moves
/// wall-clock figures.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}

/// One round: ours at every count, then PyTorch at every count right after (so both see
/// about the same load), the tables and ratios printed; returns ours / PyTorch by
/// wall-clock at `plan.threads` per schedule (none without PyTorch).
fn round(plan: &Plan) -> Result<Vec<(&'static str, f64)>, Error> {
    let (threads, iters) = (plan.threads, plan.iters);
    let mut mine = Vec::new();
    for &s in &plan.schedules {
        for &n in &plan.counts {
            mine.push((s, n, ours(s, n, iters)?));
        }
    }
    println!("XAsset default size, float32, CPU; median per step of {iters} steps");
    println!(
        "{:34} {:>7} {:>9} {:>9} {:>6} {:>10}",
        "", "threads", "wall ms", "CPU ms", "busy", "samples/s"
    );
    for &(s, n, t) in &mine {
        row("ours", s, n, t);
    }
    if !plan.torch {
        serial_lines(&mine, threads);
        return Ok(Vec::new());
    }
    let mut theirs = Vec::new();
    for &n in &plan.counts {
        match torch(n, plan.sizes, iters, &plan.only) {
            Ok(kv) => theirs.push((n, kv)),
            Err(why) => {
                println!("PyTorch: not run: {why}");
                serial_lines(&mine, threads);
                return Ok(Vec::new());
            }
        }
    }
    let mut pairs = Vec::new();
    for (n, kv) in &theirs {
        for &s in &plan.schedules {
            let t = torch_timing(kv, s.name);
            row("PyTorch", s, *n, t);
            pairs.push((s, *n, t));
        }
    }
    serial_lines(&mine, threads);
    let version = theirs[0]
        .1
        .iter()
        .find(|(k, _)| k == "torch")
        .map_or("?", |(_, v)| v);
    Ok(ratio_lines(&mine, &pairs, threads, version))
}

/// [`serial_line`] for each schedule measured at more than one thread.
fn serial_lines(mine: &[(Schedule, usize, Timing)], threads: usize) {
    if threads == 1 {
        return;
    }
    for &(s, n, at) in mine.iter().filter(|(_, n, _)| *n == threads) {
        let one = mine
            .iter()
            .find(|(o, k, _)| o.name == s.name && *k == 1)
            .map_or(Timing::NONE, |m| m.2);
        serial_line(s, n, at, one);
    }
}

/// Ours / PyTorch in samples per second: by wall-clock at each thread count, and by CPU time
/// at 1 thread (the work itself).
fn ratio_lines(
    mine: &[(Schedule, usize, Timing)],
    theirs: &[(Schedule, usize, Timing)],
    threads: usize,
    version: &str,
) -> Vec<(&'static str, f64)> {
    let find = |v: &[(Schedule, usize, Timing)], name: &str, n: usize| {
        v.iter()
            .find(|(s, k, _)| s.name == name && *k == n)
            .map_or(Timing::NONE, |m| m.2)
    };
    let mut ratios = Vec::new();
    for &(s, ..) in mine.iter().filter(|(_, n, _)| *n == threads) {
        let (a, b) = (find(mine, s.name, threads), find(theirs, s.name, threads));
        ratios.push((s.name, b.wall / a.wall));
        let (a1, b1) = (find(mine, s.name, 1), find(theirs, s.name, 1));
        println!(
            "ours / PyTorch (torch {version} eager), {} samples/s: {:.2}x by wall-clock at \
             {threads} threads; at 1 thread {:.2}x by wall-clock, {:.2}x by CPU time",
            s.name,
            b.wall / a.wall,
            b1.wall / a1.wall,
            b1.cpu / a1.cpu
        );
    }
    ratios
}
