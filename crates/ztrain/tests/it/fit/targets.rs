//! `K` target values a sample (`Task::regression(K)`, `y` `[N, K]`, the last `K` columns of a
//! table): the same samples in every format (CSV, Parquet, Arrow IPC, `.npz`, a `.npy` pair,
//! safetensors) train through `ztrain::fit` to the same numbers, bit for bit, read whole and
//! streamed, with the training set on the host and on the device, and on two simulated
//! ranks as in one process; a file whose labels are not the model's task's shape is an error
//! naming the file and both shapes (or the column counts). A weighted (masked) task takes a
//! missing label (NaN, an empty CSV cell) as a masked target; any other task refuses it.

use super::model::MlpFit;
use super::{MLP, assert_same_checkpoint, bits, fit_run, options, printed, ranks_in_process};
use crate::cli::data_files::write_npz_as;
use crate::common::path_str;
use rstest::rstest;
use zgrad::Task;
use ztrain::data::{Dataset, synthetic};
use ztrain::fit::{self, Outcome};
use ztrain::signals::StopSignal;

/// 120 samples of 3 x 6 features and `k` regression targets each, learnable from them.
fn data(k: usize) -> Dataset {
    let mut d = synthetic::generate(120, 3, 6, 5);
    let w = d.sample_width();
    d.y = (0..d.len())
        .flat_map(|i| {
            let x = &d.x[i * w..(i + 1) * w];
            (0..k).map(move |j| x[j] - 0.5 * x[j + 1] + 0.125 * j as f32)
        })
        .collect();
    d
}

/// `model` trained through `ztrain::fit` as `args` say (its checkpoint at `ck`, its metrics
/// beside it): the outcome, or the error's report.
fn fit_result(model: &MlpFit, args: &[&str], ck: &std::path::Path) -> Result<Outcome, String> {
    let metrics = ck.with_extension("csv");
    let args = [
        args,
        &[
            "--checkpoint",
            path_str(ck),
            "--metrics",
            path_str(&metrics),
        ],
    ]
    .concat();
    fit::run(
        model,
        &options(&args),
        &mut Vec::new(),
        false,
        &StopSignal::never(),
    )
    .map_err(|e| ztrain::error::report(&e))
}

/// `d` in every format in `dir` (`cli::data_files::every_format`; its `.npz` of stored
/// members, `np.savez`, which `--stream` reads): the `--data` arguments of each.
fn every_format(d: &Dataset, dir: &std::path::Path) -> Vec<Vec<String>> {
    let args = crate::cli::data_files::every_format(d, dir);
    write_npz_as(d, &dir.join("d.npz"), zip::CompressionMethod::Stored);
    args
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn k_targets_train_alike_from_every_format_whole_streamed_on_the_host_and_the_device() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = MlpFit {
        task: Task::regression(3),
        ..MLP
    };
    let ck = |n: &str| dir.path().join(format!("{n}.st"));
    let mut first = None;
    for data in every_format(&data(3), dir.path()) {
        let data = strs(&data);
        let at = format!("{data:?}");
        let run = |extra: &[&str], name: &str| {
            let args = [&data[..], &["--epochs", "2", "--batch", "16"], extra].concat();
            fit_result(&model, &args, &ck(name)).unwrap_or_else(|e| panic!("{at} {extra:?}: {e}"))
        };
        let cpu = run(&["--device", "cpu"], "cpu");
        assert!(cpu.validation.is_some(), "{at}");
        // Every format holds the same numbers: the same run, bit for bit.
        let first = first.get_or_insert(bits(cpu.validation));
        assert_eq!(
            *first,
            bits(cpu.validation),
            "{at}: another format's numbers"
        );
        let host = run(&["--device", "sim", "--data-on", "host"], "host");
        let device = run(
            &[
                "--device",
                "sim",
                "--data-on",
                "device",
                "--readback-every",
                "3",
            ],
            "device",
        );
        let streamed = run(
            &["--device", "sim", "--data-on", "host", "--stream"],
            "streamed",
        );
        for (other, name) in [(&device, "device"), (&streamed, "streamed")] {
            assert_eq!(
                bits(other.validation),
                bits(host.validation),
                "{at}: {name}"
            );
            assert_eq!(bits(other.train), bits(host.train), "{at}: {name}");
            assert_same_checkpoint(&ck("host"), &ck(name));
        }
    }
    // The metrics file's epoch rows: the validation loss (the mean squared error over the
    // samples' 3 values) of each epoch, finite; no accuracy for a regression.
    let rows = std::fs::read_to_string(ck("cpu").with_extension("csv")).expect("metrics");
    let header: Vec<&str> = rows.lines().next().expect("header").split(',').collect();
    let col = |name: &str| header.iter().position(|c| *c == name).expect(name);
    let epochs: Vec<Vec<&str>> = rows
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect::<Vec<_>>())
        .filter(|r| r[col("kind")] == "epoch")
        .collect();
    assert_eq!(epochs.len(), 2, "{rows}");
    for r in &epochs {
        let loss: f64 = r[col("val_loss")].parse().expect("a number");
        assert!(loss.is_finite() && loss > 0.0, "{rows}");
    }
}

#[rstest]
#[case::eager(&["--device", "sim"])]
#[case::on_the_device(&["--device", "sim", "--data-on", "device"])]
#[case::streamed(&["--device", "sim", "--stream"])]
fn k_targets_on_two_simulated_ranks_give_the_numbers_of_one_process(#[case] extra: &[&str]) {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = MlpFit {
        task: Task::regression(3),
        ..MLP
    };
    let formats = every_format(&data(3), dir.path());
    // The `.npz` and the Parquet table.
    for data in [&formats[3], &formats[1]] {
        let args = [&strs(data)[..], extra].concat();
        let (one_out, one) = fit_run(&model, &args, &StopSignal::never());
        let (two_out, two) = ranks_in_process(model, 2, &args);
        assert!(one.validation.is_some(), "{one_out}");
        assert_eq!(two.steps, one.steps);
        assert_eq!(
            printed(two.validation),
            printed(one.validation),
            "{one_out}\n{two_out}"
        );
        assert_eq!(
            printed(two.train),
            printed(one.train),
            "{one_out}\n{two_out}"
        );
    }
}

/// Labels of another shape than the model's task's: `y` `[N]` or `[N, 2]` for a model of 3
/// target values, `[N, 3]` for a binary one, one label column for a model of 3; each an
/// error naming the file and what was expected and found, read whole or streamed.
#[rstest]
#[case::one_for_three(1, Task::regression(3), "[N, 3]", "[120]")]
#[case::two_for_three(2, Task::regression(3), "[N, 3]", "[120, 2]")]
#[case::three_for_binary(3, Task::binary(), "[N] or [N, 1]", "[120, 3]")]
fn labels_of_another_shape_than_the_tasks_name_the_file_and_both_shapes(
    #[case] k: usize,
    #[case] task: Task,
    #[case] expected: &str,
    #[case] found: &str,
) {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = MlpFit { task, ..MLP };
    let mut d = data(k);
    if task == Task::binary() {
        d.y = d.y.iter().map(|v| f32::from(*v > 0.0)).collect();
    }
    let want = task.target_len();
    // CSV, Parquet, Arrow: the column counts; `.npz`, the `.npy` pair, safetensors: shapes.
    let tables = [
        ("d.csv", format!("expected {} columns", 18 + want)),
        ("d.parquet", format!("expected {} columns", 18 + want)),
        ("d.arrow", format!("expected {} columns", 18 + want)),
    ];
    let arrays =
        ["d.npz", "y.npy", "d.safetensors"].map(|f| (f, format!("expected shape {expected}")));
    for (data, (file, message)) in every_format(&d, dir.path())
        .iter()
        .zip(tables.into_iter().chain(arrays))
    {
        for stream in [&[][..], &["--stream"]] {
            let args = [
                &strs(data)[..],
                &["--device", "cpu", "--epochs", "1"],
                stream,
            ]
            .concat();
            let e = fit_result(&model, &args, &dir.path().join("ck.st"))
                .expect_err("labels of another shape");
            let found = format!("found {found}");
            let found = if file.ends_with(".npz")
                || file.ends_with(".npy")
                || file.ends_with(".safetensors")
            {
                found.as_str()
            } else {
                ""
            };
            for part in [file, message.as_str(), found] {
                assert!(e.contains(part), "{task}, {args:?}: `{part}` not in: {e}");
            }
            assert!(!dir.path().join("ck.st").exists(), "nothing written: {e}");
        }
    }
}

/// A weighted task (`Task::regression(3).weighted()`): a missing label (NaN in every format,
/// an empty cell in CSV) is a masked target, weight 0: the run trains on the others, the same
/// in every format, read whole or streamed, on the host or the device, and not as the label
/// 0 would. An unweighted task refuses the same file, naming it and the value.
#[test]
fn a_masked_tasks_missing_labels_are_masked_and_an_unmasked_task_refuses_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let masked = MlpFit {
        task: Task::regression(3).weighted(),
        ..MLP
    };
    let mut d = data(3);
    let missing: Vec<usize> = (0..d.len()).step_by(7).map(|i| i * 3 + i % 3).collect();
    for &m in &missing {
        d.y[m] = f32::NAN;
    }
    let ck = |n: &str| dir.path().join(format!("{n}.st"));
    let mut first = None;
    let formats = every_format(&d, dir.path());
    // The CSV again with empty cells for the missing labels.
    let csv = std::fs::read_to_string(dir.path().join("d.csv")).expect("csv");
    std::fs::write(dir.path().join("e.csv"), csv.replace("NaN", "")).expect("csv");
    let empty = vec![
        "--data".into(),
        path_str(&dir.path().join("e.csv")).to_string(),
    ];
    for data in formats.iter().chain([&empty]) {
        let data = strs(data);
        let at = format!("{data:?}");
        let run = |model: &MlpFit, extra: &[&str], name: &str| {
            let args = [&data[..], &["--epochs", "2", "--batch", "16"], extra].concat();
            fit_result(model, &args, &ck(name))
        };
        let ok = |r: Result<Outcome, String>| r.unwrap_or_else(|e| panic!("{at}: {e}"));
        let cpu = ok(run(&masked, &["--device", "cpu"], "cpu"));
        let first = first.get_or_insert(bits(cpu.validation));
        assert_eq!(
            *first,
            bits(cpu.validation),
            "{at}: another format's numbers"
        );
        let host = ok(run(
            &masked,
            &["--device", "sim", "--data-on", "host"],
            "host",
        ));
        for (extra, name) in [
            (&["--device", "sim", "--data-on", "device"][..], "device"),
            (
                &["--device", "sim", "--data-on", "host", "--stream"][..],
                "streamed",
            ),
        ] {
            let other = ok(run(&masked, extra, name));
            assert_eq!(
                bits(other.validation),
                bits(host.validation),
                "{at}: {name}"
            );
            assert_same_checkpoint(&ck("host"), &ck(name));
        }
        if data[1].ends_with("e.csv") {
            continue;
        }
        let plain = MlpFit {
            task: Task::regression(3),
            ..MLP
        };
        for stream in [&[][..], &["--stream"]] {
            let e = run(
                &plain,
                &[&["--device", "cpu"][..], stream].concat(),
                "plain",
            )
            .expect_err("NaN without a mask");
            let file = std::path::Path::new(data.last().expect("a file"))
                .file_name()
                .and_then(|f| f.to_str())
                .expect("name");
            for part in [file, "NaN"] {
                assert!(e.contains(part), "{at} {stream:?}: `{part}` not in: {e}");
            }
        }
    }
    // The missing labels count for nothing: not as labels of 0 would.
    for &m in &missing {
        d.y[m] = 0.0;
    }
    let zeros_dir = dir.path().join("zeros");
    std::fs::create_dir(&zeros_dir).expect("mkdir");
    let zeros = every_format(&d, &zeros_dir);
    let args = [
        &strs(&zeros[0])[..],
        &["--epochs", "2", "--batch", "16", "--device", "cpu"],
    ]
    .concat();
    let with_zeros = fit_result(&masked, &args, &ck("zeros")).expect("zeros");
    assert_ne!(first, Some(bits(with_zeros.validation)));
}

/// A regression's metrics (`zgrad::EvalReport::regression`) are what a run reports of it:
/// the metrics file's epoch rows (CSV and JSON lines) carry `val_mse`, `val_mae` and
/// `val_pearson`, finite and consistent with each other and the validation loss, and leave
/// `val_accuracy` empty (`null`); the epoch lines and the summary print them, and no NaN.
#[rstest]
#[case::plain(Task::regression(3))]
#[case::masked(Task::regression(3).weighted())]
fn a_regressions_metrics_are_its_mse_mae_and_pearson_in_the_file_and_the_lines(#[case] task: Task) {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = MlpFit { task, ..MLP };
    let formats = every_format(&data(3), dir.path());
    for file in ["m.csv", "m.jsonl"] {
        let metrics = dir.path().join(file);
        let args = [
            &strs(&formats[0])[..],
            &["--epochs", "2", "--batch", "16", "--device", "cpu"],
            &["--metrics", path_str(&metrics)],
        ]
        .concat();
        let (out, outcome) = fit_run(&model, &args, &StopSignal::never());
        assert!(outcome.validation.is_some(), "{out}");
        assert!(!out.contains("NaN"), "a NaN printed:\n{out}");
        let lines: Vec<&str> = out
            .lines()
            .filter(|l| l.starts_with("epoch ") || l.starts_with("summary:"))
            .collect();
        assert_eq!(lines.len(), 3, "two epoch lines and the summary:\n{out}");
        for l in &lines {
            for part in ["mse ", "mae ", "pearson "] {
                assert!(l.contains(part), "`{part}` not in: {l}");
            }
            assert!(!l.contains(" acc "), "an accuracy for a regression: {l}");
        }
        let text = std::fs::read_to_string(&metrics).expect("metrics");
        // Each epoch row: (val_loss, val_mse, val_mae, val_pearson, val_accuracy present).
        let epochs: Vec<[f64; 4]> = if file.ends_with(".csv") {
            let header: Vec<&str> = text.lines().next().expect("header").split(',').collect();
            let col = |name: &str| header.iter().position(|c| *c == name).expect(name);
            text.lines()
                .skip(1)
                .map(|l| l.split(',').collect::<Vec<_>>())
                .filter(|r| r[col("kind")] == "epoch")
                .map(|r| {
                    assert_eq!(r[col("val_accuracy")], "", "{text}");
                    ["val_loss", "val_mse", "val_mae", "val_pearson"]
                        .map(|c| r[col(c)].parse::<f64>().expect(c))
                })
                .collect()
        } else {
            text.lines()
                .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("json"))
                .filter(|v| v["kind"] == "epoch")
                .map(|v| {
                    assert!(v["val_accuracy"].is_null(), "{text}");
                    ["val_loss", "val_mse", "val_mae", "val_pearson"]
                        .map(|c| v[c].as_f64().expect(c))
                })
                .collect()
        };
        assert_eq!(epochs.len(), 2, "{text}");
        for [loss, mse, mae, pearson] in epochs {
            assert!(
                [loss, mse, mae, pearson].iter().all(|v| v.is_finite()),
                "{text}"
            );
            // Unmasked, every target counts once: the loss is the mean squared error.
            assert!((mse - loss).abs() <= 1e-9 * loss, "{text}");
            // |e| averaged is at most the root of e² averaged, and more than 0.
            assert!(mae > 0.0 && mae * mae <= mse * (1.0 + 1e-12), "{text}");
            assert!((-1.0..=1.0).contains(&pearson), "{text}");
        }
    }
    // The report's curves draw them (the report needs a device arena: the simulated one).
    let report = dir.path().join("r.html");
    let args = [
        &strs(&formats[0])[..],
        &["--epochs", "2", "--batch", "16", "--device", "sim"],
        &["--memory-report", path_str(&report)],
    ]
    .concat();
    let (out, _) = fit_run(&model, &args, &StopSignal::never());
    let html = std::fs::read_to_string(&report).unwrap_or_else(|e| panic!("{e}: {out}"));
    for name in ["validation MSE", "validation MAE", "validation Pearson r"] {
        assert!(html.contains(name), "{name} not in the report");
    }
    assert!(!html.contains("validation accuracy"), "an accuracy curve");
}

/// A model of the user's own with 3 regression targets under `--precision bf16` (issue 42 for
/// the models we never planned): it trains through `ztrain::fit` on the CPU and the simulated
/// device, its numbers are not float32's (the policy ran) and its validation loss is within 2%
/// of float32's; on the simulated device the training set on the host and on the device give
/// the same bits, and a captured run the eager run's.
#[test]
fn k_targets_train_under_bf16_near_float32_on_the_cpu_and_the_simulated_device() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = MlpFit {
        task: Task::regression(3),
        ..MLP
    };
    let formats = every_format(&data(3), dir.path());
    let data = strs(&formats[1]);
    let run = |extra: &[&str], name: &str| {
        let args = [&data[..], &["--epochs", "2", "--batch", "16"], extra].concat();
        let ck = dir.path().join(format!("{name}.st"));
        fit_result(&model, &args, &ck).unwrap_or_else(|e| panic!("{extra:?}: {e}"))
    };
    for device in ["cpu", "sim"] {
        let f32_run = run(&["--device", device], &format!("{device}-f32"));
        let bf16_run = run(
            &["--device", device, "--precision", "bf16"],
            &format!("{device}-bf16"),
        );
        assert_ne!(
            bits(bf16_run.validation),
            bits(f32_run.validation),
            "{device}"
        );
        let (a, b) = (
            bf16_run.validation.expect("validated").mean_loss(),
            f32_run.validation.expect("validated").mean_loss(),
        );
        assert!(
            a.is_finite() && (a - b).abs() <= 0.02 * b,
            "{device}: bf16 validation loss {a} against float32's {b}"
        );
    }
    let sim = |extra: &[&str], name: &str| {
        let args = [&["--device", "sim", "--precision", "bf16"], extra].concat();
        run(&args, name)
    };
    let host = sim(&["--data-on", "host"], "host");
    for (other, name) in [
        (sim(&["--data-on", "device"], "device"), "device"),
        (
            sim(&["--data-on", "host", "--capture"], "captured"),
            "captured",
        ),
    ] {
        assert_eq!(bits(other.validation), bits(host.validation), "{name}");
        assert_eq!(bits(other.train), bits(host.train), "{name}");
    }
}
