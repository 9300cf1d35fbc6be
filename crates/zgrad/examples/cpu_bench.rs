//! Times XAsset training on the CPU backend at the default size (F=193, S=12, D=256, H=4,
//! FF=1024), float32, in both schedules, and PyTorch eager on the same threads beside it when
//! PyTorch is installed (`benches/xasset_cpu_torch.py`, run with `$ZGPU_PYTHON`, else
//! `python3`), with the ratios ours / PyTorch in samples per second:
//!
//! - batched: one `train_batch` of `--batch` samples (default 256): forward, backward, AdamW.
//! - per-sample: one `train_batch` of `--per-sample` samples (default 32) in the per-sample
//!   schedule: each sample's forward and backward, then one AdamW step.
//!
//! Each figure is the median step time over `--iters` steps (default 10) after warm-up steps,
//! wall-clock and, on Linux, the CPU time of all the process's threads (what a loaded
//! machine's other work does not inflate; PyTorch's is measured the same way).
//! `--only batched|per-sample` runs one schedule.
//! `--threads N` sets the CPU backend's threads (and PyTorch's); default: the machine's
//! processors, or `ZGPU_CPU_THREADS`.
//!
//! `cargo run --release -p zgrad --example cpu_bench -- [--threads N] [--iters N]
//! [--batch N] [--per-sample N] [--no-torch]`
#![allow(clippy::print_stdout)]

use std::process::Command;
use std::time::Instant;
use zcompute::CpuBackend;
use zgrad::rng::SplitMix64;
use zgrad::{TrainSchedule, Trainer, TrainerConfig, XAsset, XAssetConfig};

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

/// CPU time of every thread of this process so far, in milliseconds (Linux; 0 elsewhere).
fn cpu_ms() -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0.0;
    };
    let ns: u64 = tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    ns as f64 / 1e6
}

/// Median wall-clock and CPU milliseconds of `iters` steps after `warm` steps.
fn median_ms(
    warm: usize,
    iters: usize,
    mut step: impl FnMut() -> Result<(), Error>,
) -> Result<(f64, f64), Error> {
    for _ in 0..warm {
        step()?;
    }
    let (mut wall, mut cpu) = (Vec::with_capacity(iters), Vec::with_capacity(iters));
    for _ in 0..iters {
        let (t, c) = (Instant::now(), cpu_ms());
        step()?;
        wall.push(t.elapsed().as_secs_f64() * 1e3);
        cpu.push(cpu_ms() - c);
    }
    wall.sort_by(f64::total_cmp);
    cpu.sort_by(f64::total_cmp);
    Ok((wall[iters / 2], cpu[iters / 2]))
}

/// Our step's wall and CPU milliseconds for `batch` samples in `schedule`.
fn ours(schedule: TrainSchedule, batch: usize, iters: usize) -> Result<(f64, f64), Error> {
    let cfg = XAssetConfig::default();
    let per = cfg.scales * cfg.features;
    let mut rng = SplitMix64::new(7);
    let x: Vec<f32> = (0..batch * per).map(|_| rng.normal() as f32).collect();
    let y: Vec<f32> = (0..batch).map(|i| (i % 2) as f32).collect();
    let model = XAsset::init(&CpuBackend, cfg, 0)?;
    let tc = TrainerConfig {
        schedule,
        ..TrainerConfig::default()
    };
    let mut t = Trainer::new(CpuBackend, model, tc)?;
    median_ms(2, iters, || {
        t.train_batch(&x, &y, batch)?;
        Ok(())
    })
}

/// PyTorch's `key=value` lines, or why there are none.
fn torch(
    threads: usize,
    batch: usize,
    per_sample: usize,
    iters: usize,
) -> Result<Vec<(String, String)>, String> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/xasset_cpu_torch.py");
    let python = std::env::var("ZGPU_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(&python)
        .arg(script)
        .args([
            "--threads",
            &threads.to_string(),
            "--batch",
            &batch.to_string(),
        ])
        .args([
            "--per-sample",
            &per_sample.to_string(),
            "--iters",
            &iters.to_string(),
        ])
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

fn main() -> Result<(), Error> {
    let threads = match arg("--threads") {
        Some(v) => zcompute::cpu::parse_threads(&v)?,
        None => zcompute::cpu::default_threads()?,
    };
    zcompute::cpu::set_threads(threads)?;
    let iters = num("--iters", 10)?.max(1);
    let batch = num("--batch", 256)?.max(1);
    let per_sample = num("--per-sample", 32)?.max(1);

    let only = arg("--only");
    let run = |name: &str| only.as_deref().is_none_or(|o| o == name);
    let nan = (f64::NAN, f64::NAN);
    let b = if run("batched") {
        ours(TrainSchedule::Batched, batch, iters)?
    } else {
        nan
    };
    let p = if run("per-sample") {
        ours(TrainSchedule::PerSample, per_sample, iters)?
    } else {
        nan
    };
    println!(
        "XAsset default size, float32, CPU, {threads} threads; median ms per step (wall / CPU of all threads)"
    );
    let line = |who: &str, b: (f64, f64), p: (f64, f64)| {
        println!(
            "{who:8} batched B={batch}: {:8.2} / {:8.2} ms {:8.1} samples/s | per-sample {per_sample} + AdamW: {:8.2} / {:8.2} ms {:8.1} samples/s",
            b.0,
            b.1,
            batch as f64 / b.0 * 1e3,
            p.0,
            p.1,
            per_sample as f64 / p.0 * 1e3
        );
    };
    line("ours", b, p);
    if std::env::args().any(|a| a == "--no-torch") {
        return Ok(());
    }
    match torch(threads, batch, per_sample, iters) {
        Ok(kv) => {
            let get = |k: &str| {
                kv.iter()
                    .find(|(key, _)| key == k)
                    .and_then(|(_, v)| v.parse::<f64>().ok())
                    .unwrap_or(f64::NAN)
            };
            let tb = (get("batched_ms"), get("batched_cpu_ms"));
            let tp = (get("per_sample_ms"), get("per_sample_cpu_ms"));
            line("PyTorch", tb, tp);
            let version = kv
                .iter()
                .find(|(k, _)| k == "torch")
                .map_or("?", |(_, v)| v);
            println!(
                "ours / PyTorch (torch {version} eager), samples/s by wall-clock: batched {:.2}x, per-sample {:.2}x; by CPU time: batched {:.2}x, per-sample {:.2}x",
                tb.0 / b.0,
                tp.0 / p.0,
                tb.1 / b.1,
                tp.1 / p.1
            );
        }
        Err(why) => println!("PyTorch: not run: {why}"),
    }
    Ok(())
}
