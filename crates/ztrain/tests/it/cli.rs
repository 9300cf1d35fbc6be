//! The `ztrain` command as a user runs it: the built binary on tiny model sizes.
//!
//! Its feature modules: `checkpoints` (resume, refused checkpoints), `init_from` (`--init-from`),
//! `data_on` (`--data-on`).

use crate::common;

use common::{TINY, assert_fails_with, path_str, text, tiny, ztrain, ztrain_with_env};
use ztrain::data::{csv, synthetic};

/// Checkpoints: resume equals an uninterrupted run; corrupt or mismatched ones are refused.
mod checkpoints;
/// `--data` in every format, hostile files, `--window` (issue 43).
pub(crate) mod data_files;
/// `--data-on`: the training set on the device, each step's rows gathered there and read back
/// every few steps, against the host path (issue 21).
mod data_on;
/// `--init-from`: a run started from a parameter file (the oracle's, or a refused one).
mod init_from;
/// `--precision`: bf16 and TF32 runs on the CPU and the simulated device, their checkpoints.
mod precision;
/// `--stream`: pre-cut samples read from their file batch by batch (issue 43).
pub(crate) mod streamed;

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
        "--precision",
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
    // XAsset (binary) prints its accuracy, as it always has, and no regression's metrics.
    for line in stdout.lines().filter(|l| l.starts_with("epoch ")) {
        let val = line.split(", val loss ").nth(1).expect("val loss");
        let (loss, rest) = val.split_once(" acc ").expect("`val loss L acc A`");
        assert!(loss.parse::<f64>().is_ok(), "{line}");
        let acc = rest.split(',').next().expect("acc");
        assert!(
            (0.0..=1.0).contains(&acc.parse::<f64>().expect(acc)),
            "{line}"
        );
        assert!(!line.contains("mse") && !line.contains("NaN"), "{line}");
    }
}

/// The summary's rate is the trainer's own, the waits for its queued steps included: with the
/// training set on the (simulated) device the host queues a window of steps and then waits
/// for them at the epoch's end, so a rate of the queueing alone would be far above the epoch
/// lines' (it printed 2,825,032 samples/s beside epochs of 11,600). On two ranks the wait is
/// where they agree on signals, once a read-back window (it printed 52,944 beside 5,700).
#[rstest::rstest]
#[case::one_process(&[])]
#[case::two_ranks_window_of_two(&["--gpus", "2", "--readback-every", "2"])]
fn the_summary_rate_counts_the_wait_for_queued_steps(#[case] extra: &[&str]) {
    let mut args = vec!["--device", "sim", "--data-on", "device", "--capture"];
    args.extend_from_slice(extra);
    let o = tiny(&args);
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stdout}\n{stderr}");
    let rate_in = |line: &str, before: &str| -> Option<f64> {
        let head = line.split(before).next()?;
        head.rsplit([' ', ','])
            .find(|w| !w.is_empty())?
            .parse()
            .ok()
    };
    let epochs: Vec<f64> = stdout
        .lines()
        .filter(|l| l.starts_with("epoch "))
        .filter_map(|l| rate_in(l, " samples/s,"))
        .collect();
    assert_eq!(epochs.len(), 2, "{stdout}");
    let summary = stdout
        .lines()
        .find(|l| l.starts_with("summary:"))
        .expect("summary");
    let rate = rate_in(summary, " samples/s;").expect("the summary's rate");
    let fastest = epochs.iter().copied().fold(0.0, f64::max);
    // The same work timed two ways (the epoch lines with the loop's own bookkeeping): within
    // a factor of 2 whatever the machine's speed.
    assert!(
        rate < 2.0 * fastest,
        "{rate} samples/s against epochs at {epochs:?}: {summary}"
    );
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
    // The loss curves beside the memory timeline: one point per epoch's train and validation
    // loss and validation accuracy.
    assert!(html.contains("Loss and metrics"), "no curves");
    assert_eq!(html.matches("<circle").count(), 3);
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
