//! `--data-on`: the training set on the device, each step's rows gathered there and read back
//! every few steps, against the host path (issue 21).

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
