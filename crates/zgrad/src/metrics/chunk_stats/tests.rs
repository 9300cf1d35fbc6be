//! The statistics rows against the host's report (`metrics::report_of`), in a file of its
//! own: it names `metrics.rs`, which names the statistics.

use super::{chunk_stats, global_chunks, report_of_stats, stats_len};
use crate::metrics::report_of;
use crate::rng::SplitMix64;
use crate::task::Task;
use proptest::prelude::*;
use zcompute::{Backend, CpuBackend};

/// `n` samples of random outputs and valid targets for `task` (weights in {0, 0.5, 1, 2}).
fn sample(task: &Task, n: usize, seed: u64) -> (Vec<f64>, Vec<f64>) {
    let mut rng = SplitMix64::new(seed);
    let out = rng.uniform_vec(n * task.output_len(), -3.0, 3.0);
    let values: usize = task.value_shape().iter().product::<usize>().max(1);
    let mut y = Vec::new();
    for _ in 0..n {
        let v: Vec<f64> = match task.target {
            crate::Target::Binary => vec![f64::from(u8::from(rng.next_f64() > 0.5))],
            crate::Target::ClassIndex { classes } => {
                vec![(rng.next_u64() % classes as u64) as f64]
            }
            crate::Target::Distribution { .. } => {
                let e: Vec<f64> = (0..values).map(|_| rng.next_f64() + 0.01).collect();
                let s: f64 = e.iter().sum();
                e.iter().map(|x| x / s).collect()
            }
            // Far from 0 against their spread: raw moments would cancel here.
            crate::Target::Regression { .. } => {
                (0..values).map(|_| 1e3 + rng.uniform(-1.0, 1.0)).collect()
            }
        };
        y.extend(v);
        if task.weighted {
            y.extend((0..values).map(|_| [0.0, 0.5, 1.0, 2.0][(rng.next_u64() % 4) as usize]));
        }
    }
    (out, y)
}

/// In f64 (the CPU backend's f64 ops) the chunk statistics merged on the host give the
/// host formula's report (`report_of`) to f64 rounding: the shifted-data formulas and
/// Chan's merge are exact algebra, whatever the chunking.
#[test]
fn merged_chunk_statistics_are_the_host_report_in_f64() {
    let tasks = [
        Task::binary().weighted(),
        Task::class_index(4),
        Task::class_index(4).weighted(),
        Task::distribution(3),
        Task::regression(2),
        Task::regression(3).weighted(),
    ];
    let b = CpuBackend;
    for (i, task) in tasks.iter().enumerate() {
        let n = 37;
        let (out, y) = sample(task, n, 90 + i as u64);
        let want = report_of(task, &out, &y);
        for chunk in [1, 5, 37] {
            let mut rows = Vec::new();
            for start in (0..n).step_by(chunk) {
                let len = chunk.min(n - start);
                let (po, py) = (task.output_len(), task.target_len());
                let o = b
                    .upload(
                        &out[start * po..(start + len) * po],
                        &Task::batched(len, &task.output_shape()),
                    )
                    .unwrap();
                let t = b
                    .upload(
                        &y[start * py..(start + len) * py],
                        &Task::batched(len, &task.target_shape()),
                    )
                    .unwrap();
                let row = chunk_stats(&b, task, &o, &t).unwrap();
                rows.extend(b.download(&row).unwrap());
            }
            assert_eq!(rows.len(), n.div_ceil(chunk) * stats_len(task).unwrap());
            let got = report_of_stats(task, &rows, n);
            let close = |a: f64, b: f64| (a - b).abs() <= 1e-10 * b.abs().max(1.0);
            let at = format!("{task} chunk {chunk}: {got:?} against {want:?}");
            assert!(close(got.loss, want.loss), "{at}");
            assert!(
                close(got.accuracy, want.accuracy) || want.accuracy.is_nan(),
                "{at}"
            );
            if let (Some(g), Some(w)) = (got.regression, want.regression) {
                assert!(close(g.mse, w.mse) && close(g.mae, w.mae), "{at}");
                // The host formula's raw moments lose about 1e-10 of Pearson here
                // (values near 1e3, spread 1): still far inside this bound.
                assert!((g.pearson - w.pearson).abs() < 1e-6, "{at}");
            }
        }
    }
}

proptest! {
    /// The ranks' chunks tile the set's: rank r's start where rank r - 1's end, all of
    /// them together are every rank's count.
    #[test]
    fn ranks_chunks_follow_one_another(world in 1usize..6, total in 0usize..60, chunk in 1usize..9) {
        let mut next = 0;
        for r in 0..world {
            let (own, before, all) = global_chunks(r, world, total, chunk);
            prop_assert_eq!(before, next);
            next += own;
            prop_assert_eq!(own, crate::shard(r, world, total).len().div_ceil(chunk));
            prop_assert_eq!(all, (0..world).map(|q| global_chunks(q, world, total, chunk).0).sum::<usize>());
        }
    }
}
