//! The `ztrain` command as a user runs it: the built binary on tiny model sizes.

use crate::common;

use common::{
    TINY, assert_fails_with, path_str, resume_matches_uninterrupted, text, tiny, ztrain,
    ztrain_with_env,
};
use ztrain::data::{csv, synthetic};

#[test]
fn help_explains_every_option() {
    let o = ztrain(&["--help"]);
    let (stdout, _) = text(&o);
    assert!(o.status.success());
    for opt in [
        "--device",
        "--data",
        "--schedule",
        "--capture",
        "--epochs",
        "--batch",
        "--lr",
        "--lr-schedule",
        "--clip-grad",
        "--seed",
        "--features",
        "--scales",
        "--width",
        "--heads",
        "--ff",
        "--layers",
        "--init-from",
        "--arena-bytes",
        "--arena-cap",
        "--checkpoint",
        "--resume",
        "--memory-report",
        "--validate-fraction",
        "--samples",
        "--data-seed",
        "--soak-report",
        "--soak-every",
        "--plan",
        "--json",
    ] {
        assert!(stdout.contains(opt), "{opt} missing from --help:\n{stdout}");
    }
    for status in [
        "Exit status",
        "130 stopped by SIGINT",
        "143 by SIGTERM",
        "a second signal",
    ] {
        assert!(
            stdout.contains(status),
            "`{status}` missing from --help:\n{stdout}"
        );
    }
}

#[test]
fn a_tiny_run_on_the_cpu_prints_epochs_and_a_summary() {
    let o = tiny(&["--device", "cpu"]);
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("CPU backend"), "{stdout}");
    assert!(
        stdout.contains("epoch 1/2:") && stdout.contains("epoch 2/2:"),
        "{stdout}"
    );
    let summary = stdout
        .lines()
        .find(|l| l.starts_with("summary:"))
        .expect("summary");
    for part in [
        "train loss",
        "validation loss",
        "acc",
        "peak host memory",
        " s;",
    ] {
        assert!(summary.contains(part), "{part}: {summary}");
    }
    // The trainer's own throughput: every training sample of both epochs, at a rate.
    let n_train: u64 = stdout
        .split(" train / ")
        .next()
        .and_then(|head| head.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("the training set's size in the header");
    let (trained, rate) = summary
        .split("; ")
        .find_map(|part| {
            let (n, rest) = part.split_once(" samples trained at ")?;
            let rate = rest.strip_suffix(" samples/s")?;
            Some((n.parse::<u64>().ok()?, rate.parse::<f64>().ok()?))
        })
        .expect("`N samples trained at R samples/s` in the summary");
    assert_eq!(trained, 2 * n_train, "{summary}");
    assert!(rate > 0.0, "{summary}");
    assert!(stdout.contains("\narena: "), "{stdout}");
}

#[test]
fn cuda_without_a_gpu_is_a_clear_error() {
    // No visible device: on this machine the driver library is missing as well; on a GPU
    // machine the driver loads and finds no device. Both must be the same clear error.
    let args: Vec<&str> = TINY
        .iter()
        .copied()
        .chain(["--device", "cuda", "--epochs", "1"])
        .collect();
    let o = ztrain_with_env(&args, &[("CUDA_VISIBLE_DEVICES", "")]);
    assert_fails_with(&o, &["--device cuda: no usable GPU", "--device cpu"]);
}

#[test]
fn cpu_threads_follow_the_variable_and_a_bad_value_is_refused_by_name() {
    let args: Vec<&str> = TINY
        .iter()
        .copied()
        .chain(["--device", "cpu", "--epochs", "1"])
        .collect();
    let o = ztrain_with_env(&args, &[("ZGPU_CPU_THREADS", "3")]);
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout
            .lines()
            .next()
            .unwrap_or_default()
            .contains("3 threads"),
        "{stdout}"
    );
    let o = ztrain_with_env(&args, &[("ZGPU_CPU_THREADS", "zero")]);
    assert_fails_with(&o, &["ZGPU_CPU_THREADS", "\"zero\""]);
}

#[test]
fn auto_says_which_backend_it_picked() {
    let o = tiny(&["--epochs", "1"]);
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stdout}\n{stderr}");
    let first = stdout.lines().next().unwrap_or_default();
    assert!(
        first.contains("CPU backend (no usable GPU") || first.contains("CUDA backend on"),
        "{first}"
    );
}

#[test]
fn trains_on_a_csv_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("data.csv");
    std::fs::write(&path, csv::to_csv(&synthetic::generate(120, 3, 6, 5))).expect("write");
    let o = tiny(&[
        "--device",
        "cpu",
        "--data",
        path_str(&path),
        "--epochs",
        "1",
    ]);
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("96 train / 24 validation samples"),
        "{stdout}"
    );
}

#[test]
fn bad_csv_stops_with_line_and_column() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases: [(&str, String, &[&str]); 4] = [
        (
            "empty.csv",
            String::new(),
            &["empty.csv: line 1, column 1", "empty"],
        ),
        (
            "short.csv",
            format!("{}\n{}\n", "h,".repeat(18) + "label", "0,".repeat(17) + "1"),
            &[
                "short.csv: line 2, column 19",
                "expected 19 columns (scales × features, then the label), found 18",
            ],
        ),
        (
            "nan.csv",
            format!("{}\n{}NaN,1\n", "h,".repeat(18) + "label", "0,".repeat(17)),
            &["nan.csv: line 2, column 18", "`NaN` is not a finite"],
        ),
        (
            "label.csv",
            format!("{}\n{}3\n", "h,".repeat(18) + "label", "0,".repeat(18)),
            &["label.csv: line 2, column 19", "label `3` must be 0 or 1"],
        ),
    ];
    for (name, content, needles) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, content).expect("write");
        let o = tiny(&["--device", "cpu", "--data", path_str(&path)]);
        assert_fails_with(&o, needles);
    }
}

#[test]
fn a_corrupt_checkpoint_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("ck.safetensors");
    std::fs::write(&path, b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":").expect("write");
    let o = tiny(&["--device", "cpu", "--resume", path_str(&path)]);
    assert_fails_with(
        &o,
        &["ck.safetensors is corrupt or not a ztrain checkpoint"],
    );
}

#[test]
fn a_checkpoint_of_another_configuration_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ck = dir.path().join("ck.safetensors");
    let o = tiny(&[
        "--device",
        "cpu",
        "--epochs",
        "1",
        "--checkpoint",
        path_str(&ck),
    ]);
    assert!(o.status.success(), "{:?}", text(&o));
    let o = tiny(&["--device", "cpu", "--batch", "8", "--resume", path_str(&ck)]);
    assert_fails_with(
        &o,
        &["different configuration", "batch: checkpoint 16, now 8"],
    );
}

#[test]
fn resume_mid_epoch_equals_an_uninterrupted_run_on_the_cpu() {
    // 160 training samples in batches of 16: step 13 is in the middle of the second epoch.
    resume_matches_uninterrupted(&["--device", "cpu"], "13");
}

#[test]
fn resume_at_an_epoch_end_equals_an_uninterrupted_run_on_the_cpu() {
    resume_matches_uninterrupted(&["--device", "cpu", "--lr-schedule", "cosine"], "10");
}

#[test]
fn resume_equals_an_uninterrupted_run_on_the_simulated_device_per_sample() {
    resume_matches_uninterrupted(
        &[
            "--device",
            "sim",
            "--sim-memory",
            "256M",
            "--schedule",
            "per-sample",
            "--samples",
            "60",
        ],
        "2",
    );
}

#[test]
fn memory_report_from_the_simulated_device() {
    let dir = tempfile::tempdir().expect("tempdir");
    let report = dir.path().join("m.html");
    let o = tiny(&[
        "--device",
        "sim",
        "--sim-memory",
        "256M",
        "--epochs",
        "1",
        "--layers",
        "2",
        "--memory-report",
        path_str(&report),
    ]);
    assert!(o.status.success(), "{:?}", text(&o));
    let html = std::fs::read_to_string(&report).expect("report");
    assert!(
        html.contains("FF=32 L=2"),
        "the model's depth is in the report"
    );
    assert!(html.contains("<svg") && html.contains("class=\"area persistent\""));
    assert!(html.contains("high-water"));
    assert!(html.contains("simulated driver"));
}

#[test]
fn memory_report_needs_a_device_arena() {
    let o = tiny(&[
        "--device",
        "cpu",
        "--memory-report",
        "/tmp/never-written.html",
    ]);
    assert_fails_with(&o, &["--memory-report", "--device sim"]);
}

/// Final parameters of a tiny run with `extra` options, as bits.
fn final_bits(extra: &[&str]) -> Vec<(String, Vec<u32>)> {
    let dir = tempfile::tempdir().expect("tempdir");
    let ck = dir.path().join("ck.st");
    let o = tiny(&[extra, &["--checkpoint", path_str(&ck)]].concat());
    assert!(o.status.success(), "{:?}", text(&o));
    let c = ztrain::checkpoint::Checkpoint::load(&ck).expect("checkpoint");
    c.params
        .into_iter()
        .map(|(n, t)| (n, t.data.iter().map(|v| v.to_bits()).collect()))
        .collect()
}

#[test]
fn capture_gives_the_eager_result_on_the_simulated_device() {
    for schedule in ["batched", "per-sample"] {
        let base = [
            "--device",
            "sim",
            "--sim-memory",
            "256M",
            "--samples",
            "60",
            "--schedule",
            schedule,
        ];
        let eager = final_bits(&base);
        let captured = final_bits(&[&base[..], &["--capture"]].concat());
        assert!(
            eager == captured,
            "{schedule}: captured run differs from eager"
        );
    }
}

/// The synthetic rule is learnable: a small model (the default size takes minutes; the README
/// shows that run) gets near the 0.95 ceiling in a few seconds.
#[test]
fn a_small_model_learns_the_synthetic_rule() {
    let o = ztrain(&[
        "--device",
        "cpu",
        "--features",
        "50",
        "--scales",
        "6",
        "--width",
        "64",
        "--heads",
        "4",
        "--ff",
        "128",
        "--samples",
        "3000",
        "--batch",
        "32",
        "--epochs",
        "2",
    ]);
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stdout}\n{stderr}");
    let summary = stdout
        .lines()
        .find(|l| l.starts_with("summary:"))
        .expect("summary");
    let acc: f64 = summary
        .split("validation loss ")
        .nth(1)
        .and_then(|rest| rest.split(" acc ").nth(1))
        .and_then(|rest| rest.split(';').next())
        .and_then(|v| v.trim().parse().ok())
        .expect("validation accuracy in the summary");
    assert!(
        (0.9..=1.0).contains(&acc),
        "validation accuracy {acc}: {summary}"
    );
}

/// An oracle fixture (tests/fixtures): its parameter file, and its x and y as a CSV file
/// in `dir` (S·F feature columns, then the label).
fn oracle_run_files(dir: &std::path::Path, name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
    let input = fixtures.join(format!("xasset_{name}_in.safetensors"));
    let file = zgrad::read_tensors::<f64>(&input).expect("fixture");
    let (x, y) = (&file.tensors["x"], &file.tensors["y"]);
    let per = x.shape[1] * x.shape[2];
    let mut csv = (0..per)
        .map(|i| format!("c{i}"))
        .collect::<Vec<_>>()
        .join(",")
        + ",label\n";
    for (i, label) in y.data.iter().enumerate() {
        let row: Vec<String> = x.data[i * per..(i + 1) * per]
            .iter()
            .map(|v| format!("{}", *v as f32))
            .collect();
        csv += &format!("{},{}\n", row.join(","), *label as u8);
    }
    let data = dir.join(format!("{name}.csv"));
    std::fs::write(&data, csv).expect("csv");
    (input, data)
}

/// Issue 19: `--init-from` an oracle input, one batched step over the fixture's batch with
/// the oracle's AdamW settings (ztrain's defaults: lr 1e-3, betas 0.9/0.999, eps 1e-8, weight
/// decay 0.01): the checkpoint's parameters are the oracle's `adamw.*` within 1e-5 per tensor
/// (kn.bias, whose update is the sign of rounding noise, within 2·lr per element).
#[test]
fn init_from_an_oracle_input_steps_to_the_oracle_update() {
    for (name, sizes) in [
        ("tiny", ["7", "3", "8", "2", "16", "1", "4"]),
        ("deep2", ["7", "3", "8", "2", "16", "2", "4"]),
        ("deep3", ["5", "4", "12", "3", "8", "3", "5"]),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let (input, data) = oracle_run_files(dir.path(), name);
        let ck = dir.path().join("ck.safetensors");
        let [f, s, d, h, ff, l, b] = sizes;
        let o = ztrain(&[
            "--device",
            "cpu",
            "--init-from",
            path_str(&input),
            "--data",
            path_str(&data),
            "--validate-fraction",
            "0",
            "--features",
            f,
            "--scales",
            s,
            "--width",
            d,
            "--heads",
            h,
            "--ff",
            ff,
            "--layers",
            l,
            "--batch",
            b,
            "--epochs",
            "1",
            "--checkpoint",
            path_str(&ck),
        ]);
        let (stdout, stderr) = text(&o);
        assert!(o.status.success(), "{name}:\n{stdout}\n{stderr}");
        assert!(
            stdout.contains("optimiser moments zero, step 0"),
            "{stdout}"
        );
        let c = ztrain::checkpoint::Checkpoint::load(&ck).expect("checkpoint");
        assert_eq!(c.progress.step, 1);
        let fixtures = input.parent().expect("folder").to_path_buf();
        let oracle =
            zgrad::read_tensors::<f64>(&fixtures.join(format!("xasset_{name}_oracle.safetensors")))
                .expect("oracle");
        let params = oracle
            .tensors
            .keys()
            .filter_map(|k| k.strip_prefix("adamw."))
            .count();
        assert_eq!(c.params.len(), params, "{name}: every parameter, no other");
        for (pname, t) in &c.params {
            let want = &oracle.tensors[&format!("adamw.{pname}")].data;
            let got: Vec<f64> = t.data.iter().map(|&v| f64::from(v)).collect();
            if pname.ends_with("kn.bias") {
                let apart = got
                    .iter()
                    .zip(want)
                    .map(|(a, w)| (a - w).abs())
                    .fold(0.0, f64::max);
                assert!(apart <= 2e-3, "{name} {pname}: {apart:e}");
                continue;
            }
            let diff: f64 = got.iter().zip(want).map(|(a, w)| (a - w).powi(2)).sum();
            let norm: f64 = want.iter().map(|w| w * w).sum();
            let e = (diff / norm).sqrt();
            assert!(e <= 1e-5, "{name} adamw.{pname}: relative error {e:e}");
        }
    }
}

/// `--init-from` of a file that cannot be the options' model: typed errors naming the
/// problem (other depth and width, a missing file, a directory, a corrupt file), exit 1.
#[test]
fn init_from_refuses_files_that_are_not_the_model() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (input, data) = oracle_run_files(dir.path(), "deep2");
    let run = |file: &str, layers: &str, width: &str| {
        ztrain(&[
            "--device",
            "cpu",
            "--init-from",
            file,
            "--data",
            path_str(&data),
            "--validate-fraction",
            "0",
            "--features",
            "7",
            "--scales",
            "3",
            "--width",
            width,
            "--heads",
            "2",
            "--ff",
            "16",
            "--layers",
            layers,
            "--batch",
            "4",
            "--epochs",
            "1",
        ])
    };
    assert_fails_with(
        &run(path_str(&input), "3", "16"),
        &[
            "--init-from",
            "layers: file 2, asked 3",
            "width: file 8, asked 16",
        ],
    );
    let missing = dir.path().join("none.safetensors");
    assert_fails_with(
        &run(path_str(&missing), "2", "8"),
        &["none.safetensors", "No such file"],
    );
    assert_fails_with(
        &run(path_str(dir.path()), "2", "8"),
        &["--init-from", "directory"],
    );
    let corrupt = dir.path().join("corrupt.safetensors");
    std::fs::write(&corrupt, b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":").expect("write");
    assert_fails_with(
        &run(path_str(&corrupt), "2", "8"),
        &["--init-from", "corrupt.safetensors"],
    );
    let o = ztrain(&[
        "--init-from",
        path_str(&input),
        "--resume",
        path_str(&input),
    ]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "--init-from and --resume exclude each other"
    );
}

/// A checkpoint of another depth or width is refused naming the difference.
#[test]
fn a_checkpoint_of_another_depth_is_refused_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ck = dir.path().join("ck.safetensors");
    let o = tiny(&[
        "--device",
        "cpu",
        "--epochs",
        "1",
        "--layers",
        "2",
        "--checkpoint",
        path_str(&ck),
    ]);
    assert!(o.status.success(), "{:?}", text(&o));
    let c = ztrain::checkpoint::Checkpoint::load(&ck).expect("checkpoint");
    assert!(
        c.params.contains_key("blocks.1.f2.bias"),
        "{:?}",
        c.params.keys()
    );
    let o = tiny(&[
        "--device",
        "cpu",
        "--layers",
        "3",
        "--resume",
        path_str(&ck),
    ]);
    assert_fails_with(&o, &["checkpoint has 2 layers, the options 3"]);
    let o = tiny(&[
        "--device",
        "cpu",
        "--layers",
        "2",
        "--width",
        "32",
        "--resume",
        path_str(&ck),
    ]);
    assert_fails_with(&o, &["width 16 vs 32"]);
    // The same depth resumes, and its parameters start the run from the checkpoint's.
    let o = tiny(&[
        "--device",
        "cpu",
        "--layers",
        "2",
        "--epochs",
        "2",
        "--resume",
        path_str(&ck),
    ]);
    assert!(o.status.success(), "{:?}", text(&o));
}

/// Resuming with two blocks continues exactly as an uninterrupted two-block run.
#[test]
fn resume_of_a_two_block_run_equals_an_uninterrupted_run() {
    resume_matches_uninterrupted(&["--device", "cpu", "--layers", "2"], "13");
}

/// `--data-on`: the training set on the device, each step's rows gathered there and read back
/// every few steps, against the host path (issue 21).
mod data_on {
    use super::common::{
        assert_fails_with, data_on_device_matches_host, resume_matches_uninterrupted, text, tiny,
    };

    #[test]
    fn device_equals_host_on_the_simulated_device_and_the_cpu() {
        for extra in [
            &["--device", "sim", "--sim-memory", "256M"][..],
            &["--device", "sim", "--sim-memory", "256M", "--capture"],
            &[
                "--device",
                "sim",
                "--sim-memory",
                "256M",
                "--capture",
                "--schedule",
                "per-sample",
                "--samples",
                "40",
            ],
            &["--device", "cpu", "--capture"],
        ] {
            data_on_device_matches_host(extra);
        }
    }

    /// A stop at step 13 with read-backs every 4 steps: exact, and the resumed run ends as
    /// the uninterrupted one. Batched captured, and the per-sample schedule (queued too) from
    /// the device data set, captured, and from the host's pinned batches.
    #[test]
    fn resume_on_the_device_equals_an_uninterrupted_run() {
        let sim = [
            "--device",
            "sim",
            "--sim-memory",
            "256M",
            "--readback-every",
            "4",
        ];
        for extra in [
            &["--capture", "--data-on", "device"][..],
            &[
                "--capture",
                "--schedule",
                "per-sample",
                "--data-on",
                "device",
            ],
            &["--schedule", "per-sample", "--data-on", "host"],
        ] {
            resume_matches_uninterrupted(&[&sim[..], extra].concat(), "13");
        }
    }

    #[test]
    fn auto_puts_a_set_that_fits_on_the_device_and_keeps_the_cpus_on_the_host() {
        let o = tiny(&["--device", "sim", "--sim-memory", "256M"]);
        assert!(
            text(&o).0.contains("training set on the device"),
            "{:?}",
            text(&o)
        );
        let o = tiny(&["--device", "cpu"]);
        assert!(
            text(&o).0.contains("training set on the host"),
            "{:?}",
            text(&o)
        );
    }

    /// A data set that does not fit: `device` says how much is needed and free; `auto` keeps
    /// it on the host and trains.
    #[test]
    fn device_that_does_not_fit_is_a_clear_error_and_auto_falls_back() {
        // 4,000 samples of 30 x 60 values: 27 MiB, beyond 9/10 of a 24 MiB arena cap.
        let big = [
            "--device",
            "sim",
            "--sim-memory",
            "256M",
            "--arena-cap",
            "24M",
            "--segment-bytes",
            "4M",
            "--arena-bytes",
            "8M",
            "--overflow-reserve",
            "4M",
            "--samples",
            "4000",
            "--scales",
            "30",
            "--features",
            "60",
            "--epochs",
            "1",
        ];
        let o = tiny(&[&big[..], &["--data-on", "device"]].concat());
        assert_fails_with(
            &o,
            &[
                "training set on the device",
                "is free for it",
                "--data-on host",
            ],
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let ck = dir.path().join("ck.st");
        let stop = ["--stop-after", "2", "--checkpoint", super::path_str(&ck)];
        let o = tiny(&[&big[..], &stop[..]].concat());
        let (stdout, stderr) = text(&o);
        assert!(o.status.success(), "{stdout}\n{stderr}");
        assert!(
            stdout.contains("training set on the host"),
            "{stdout}\n{stderr}"
        );
    }
}
