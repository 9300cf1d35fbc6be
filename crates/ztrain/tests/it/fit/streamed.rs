//! `--stream` for every task the run loop trains (one target value a sample, a label in
//! {0, 1} as every loader reads it: a binary classifier's, a class index of two classes, or
//! one regression value),
//! in one process and on two simulated ranks (each rank reading its shard of the rows):
//! the same file in each streamed format (a `.npy` pair, safetensors, Parquet) trains and
//! evaluates as the run that reads it whole, bit for bit: every epoch's losses and metrics,
//! the last parameters and the optimiser's state.

use super::model::MlpFit;
use super::{MLP, assert_same_checkpoint, bits, fit_run, ranks_in_process};
use crate::cli::streamed::files;
use crate::common::path_str;
use rstest::rstest;
use zgrad::Task;
use ztrain::fit::Outcome;
use ztrain::signals::StopSignal;

/// A run of `model` on `world` ranks (in this process) as `args` say, writing its metrics
/// and checkpoint under `dir` as `name`: rank 0's outcome and its metrics' rows without the
/// timing columns.
fn run(
    model: MlpFit,
    world: usize,
    args: &[&str],
    dir: &std::path::Path,
    name: &str,
) -> (Outcome, Vec<String>) {
    let (metrics, ck) = (
        dir.join(format!("{name}.csv")),
        dir.join(format!("{name}.st")),
    );
    let args = [
        args,
        &[
            "--metrics",
            path_str(&metrics),
            "--checkpoint",
            path_str(&ck),
        ],
    ]
    .concat();
    let (out, outcome) = if world == 1 {
        fit_run(&model, &args, &StopSignal::never())
    } else {
        ranks_in_process(model, world, &args)
    };
    assert!(outcome.validation.is_some(), "{out}");
    let rows = std::fs::read_to_string(&metrics)
        .expect("metrics")
        .lines()
        .map(|l| {
            // Every column but samples/s and the elapsed time (the 9th and 10th).
            let cells = l
                .split(',')
                .enumerate()
                .filter(|(i, _)| !(8..10).contains(i));
            cells.map(|(_, c)| c).collect::<Vec<_>>().join(",")
        })
        .collect();
    (outcome, rows)
}

#[rstest]
#[case::binary(Task::binary())]
#[case::class_index(Task::class_index(2))]
#[case::regression(Task::regression(1))]
fn every_task_streams_bitwise_as_the_file_read_whole_on_one_rank_and_two(#[case] task: Task) {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = MlpFit { task, ..MLP };
    for data in files(dir.path()) {
        let data: Vec<&str> = data.iter().map(String::as_str).collect();
        for world in [1, 2] {
            let args = [
                &data[..],
                &["--device", "sim", "--epochs", "2", "--batch", "16"],
            ]
            .concat();
            let whole = run(model, world, &args, dir.path(), "whole");
            let streamed_args = [&args[..], &["--stream"]].concat();
            let streamed = run(model, world, &streamed_args, dir.path(), "streamed");
            let at = format!("{task} on {world} ranks, {data:?}");
            assert_eq!(whole.1, streamed.1, "{at}: the metrics rows");
            assert_eq!(
                bits(whole.0.validation),
                bits(streamed.0.validation),
                "{at}"
            );
            assert_eq!(bits(whole.0.train), bits(streamed.0.train), "{at}");
            assert_eq!(whole.0.steps, streamed.0.steps, "{at}");
            assert_same_checkpoint(
                &dir.path().join("whole.st"),
                &dir.path().join("streamed.st"),
            );
        }
    }
}
