//! `--rounds R`: the weak-scaling efficiency of the captured step, robust to what differs
//! between processes and over time (a fresh machine's first process, clocks, warm-up). Every
//! rank captures the one-GPU step (256 rows, no collective, on its own GPU) and the N-GPU step
//! of each `--grad-sync` (256 rows per rank) once, then alternates timed replays of them R
//! times in the same processes: odd rounds one GPU first and the syncs in order, even rounds
//! the syncs in reverse and one GPU last, so a drift over the run weighs on every side alike. A round's efficiency is T(1)/T(N) by the median of
//! `--iters` event-timed replays each; rank 0 prints each round on stderr and returns the rounds,
//! their median and range for the JSON.

use super::timing::{Error, Json};
use super::{Comm, Gpu, PER_RANK, captured_ms, data, trainer};
use zcompute::prelude::*;
use zgrad::{GradSync, StepSource, Trainer, XAsset};

/// Every rank has queued and finished everything before this returns (a one-element
/// all-reduce, then the communicator's bounded synchronize): the next timed replays start
/// together.
fn barrier(gpu: &Gpu, comm: &Comm) -> Result<(), Error> {
    let flag = gpu.zeros(&[1])?;
    comm.all_reduce_sum(gpu, &flag, 0)?;
    comm.synchronize(gpu)?;
    Ok(())
}

/// A trainer whose step is captured (its first step, untimed).
fn captured(
    gpu: &Gpu,
    comm: Option<&Comm>,
    world: usize,
    sync: GradSync,
) -> Result<Trainer<Gpu, f32, XAsset<Gpu>>, Error> {
    let global = PER_RANK * world;
    let (x, y) = data(global);
    let mut t = trainer(gpu, comm, true, sync)?;
    t.step(StepSource::host(&x, &y, global))?;
    Ok(t)
}

/// Median and range of `v`, as `[median, min, max]`.
fn summary(v: &[f64]) -> [f64; 3] {
    let mut sorted = v.to_vec();
    sorted.sort_by(f64::total_cmp);
    [
        sorted[sorted.len() / 2],
        sorted[0],
        sorted[sorted.len() - 1],
    ]
}

/// R alternated rounds (see the module docs); the JSON of rank 0's timings, `None` for
/// `rounds` 0 or on the other ranks.
pub fn weak_rounds(
    gpu: &Gpu,
    comm: &Comm,
    world: usize,
    rounds: usize,
    iters: usize,
    syncs: &[(&'static str, GradSync)],
) -> Result<Option<Json>, Error> {
    if rounds == 0 {
        return Ok(None);
    }
    let mut one = captured(gpu, None, 1, GradSync::AfterBackward)?;
    let mut many = Vec::new();
    for &(name, sync) in syncs {
        many.push((name, captured(gpu, Some(comm), world, sync)?));
    }
    let mut one_ms = Vec::new();
    let mut many_ms = vec![Vec::new(); many.len()];
    let rank0 = comm.info().rank == 0;
    for r in 1..=rounds {
        let mut time_one = || -> Result<(), Error> {
            barrier(gpu, comm)?;
            one_ms.push(captured_ms(gpu, &mut one, iters)?);
            barrier(gpu, comm)
        };
        if r % 2 == 1 {
            time_one()?;
        }
        // Odd rounds in order, even rounds reversed: each side's drift cancels over pairs.
        let mut order: Vec<usize> = (0..many.len()).collect();
        if r % 2 == 0 {
            order.reverse();
        }
        for k in order {
            let ms = captured_ms(gpu, &mut many[k].1, iters)?;
            many_ms[k].push(ms);
        }
        if r % 2 == 0 {
            time_one()?;
        }
        if rank0 {
            let rows: Vec<String> = many
                .iter()
                .zip(&many_ms)
                .map(|((name, _), ms)| {
                    let (t1, tn) = (one_ms[r - 1], ms[r - 1]);
                    format!("{name} {tn:.3} ms ({:.1}%)", 100.0 * t1 / tn)
                })
                .collect();
            eprintln!(
                "round {r} of {rounds}: one GPU {:.3} ms; {world} GPUs: {}",
                one_ms[r - 1],
                rows.join(", ")
            );
        }
    }
    if !rank0 {
        return Ok(None);
    }
    let mut out = Json::default();
    out.raw("rounds", rounds);
    out.list("one_gpu_ms", &one_ms);
    for ((name, _), ms) in many.iter().zip(&many_ms) {
        let eff: Vec<f64> = one_ms.iter().zip(ms).map(|(t1, tn)| t1 / tn).collect();
        let [median, lo, hi] = summary(&eff);
        out.list(&format!("{name}_ms"), ms);
        let items: Vec<String> = eff.iter().map(|e| format!("{e:.4}")).collect();
        out.raw(
            &format!("{name}_efficiency"),
            format!("[{}]", items.join(",")),
        );
        out.raw(&format!("{name}_efficiency_median"), format!("{median:.4}"));
        out.raw(
            &format!("{name}_efficiency_range"),
            format!("[{lo:.4},{hi:.4}]"),
        );
        eprintln!(
            "weak-scaling efficiency, {name}, over {rounds} rounds: median {:.1}%, range \
             {:.1}-{:.1}%",
            100.0 * median,
            100.0 * lo,
            100.0 * hi
        );
    }
    Ok(Some(out))
}
