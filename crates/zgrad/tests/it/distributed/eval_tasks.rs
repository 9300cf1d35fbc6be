//! Data-parallel evaluation of every task (issue 40 item 2): each of 2 simulated ranks
//! reduces its shard's chunks to statistics rows on its device, the rows of every rank are
//! summed over the ranks (each rank's own, zero elsewhere: a gather) and merged in f64. Every
//! rank reports the same bits from the host (`evaluate`) and the device
//! (`evaluate(EvalSource::Validation)`, captured; `evaluate(EvalSource::Loaded)`), within the single-rank report's
//! tolerance (`trainer::eval_tasks`: the chunks fall elsewhere, so the f32 sums differ).

use super::simulated::ranks;
use crate::support::tasks::{TASKS, assert_report_close, report_bits, task_data, task_trainer};
use rstest::rstest;
use std::rc::Rc;
use zcompute::Engine;
use zgrad::EvalSource;
use zgrad::Load;

const CHUNK: usize = 5;

/// The reports of rank `rank`'s three evaluations of `n` samples of `name`'s task.
fn reports(
    b: &zcompute::CudaBackend<zcompute::SimDriver>,
    comm: Option<zcomm::SimCollective>,
    name: &str,
    n: usize,
) -> Vec<zgrad::EvalReport> {
    let (task, outputs, x, y) = task_data(name, n, 61);
    let mut t = task_trainer(b.clone(), task, outputs, true, CHUNK);
    if let Some(c) = comm {
        t = t.with_collective(Rc::new(c)).expect("collective");
    }
    let mut out = vec![t.evaluate(EvalSource::Host(&x, &y)).expect("evaluate")];
    t.load(Load::Validation { x: &x, y: &y, n })
        .expect("validation set");
    for _ in 0..2 {
        out.push(
            t.evaluate(EvalSource::Validation)
                .expect("device evaluation"),
        );
    }
    if task.target_len() == 1 {
        t.load(Load::Training { x: &x, y: &y, n })
            .expect("training set");
        out.push(t.evaluate(EvalSource::Loaded).expect("resident evaluation"));
    }
    out
}

#[rstest]
fn two_ranks_report_what_one_rank_does_for_every_task(
    #[values(0, 1, 2, 3, 4, 5, 6)] task: usize,
    // 23: unequal shards (12 and 11 samples); 1: rank 1's shard is empty.
    #[values(23, 1)] n: usize,
) {
    let name = TASKS[task];
    let one = reports(&Engine::sim(256 << 20).expect("sim"), None, name, n);
    let two = ranks(2, move |b, c| reports(b, Some(c), TASKS[task], n));
    let first = &two[0][0];
    for (rank, seen) in two.iter().enumerate() {
        for (way, r) in seen.iter().enumerate() {
            let at = format!("{name} n {n}: rank {rank}, evaluation {way}");
            assert_eq!(report_bits(r), report_bits(first), "{at}");
        }
    }
    assert_report_close(&format!("{name} n {n}: 2 ranks"), first, &one[0], 1e-5);
}
