//! GPU twins of the CLI tests (`cli.rs` runs the same on the CPU and the simulated device):
//! built only with `--features gpu` (`cargo xtask test-gpu`); a missing GPU fails them.
#![cfg(feature = "gpu")]

use crate::common;

use common::{path_str, resume_matches_uninterrupted, text, tiny};
use ztrain::checkpoint::Checkpoint;

#[test]
fn gpu_a_tiny_run_trains_on_the_cuda_backend() {
    let o = tiny(&["--device", "cuda"]);
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("CUDA backend on"), "{stdout}");
    assert!(stdout.contains("peak device memory"), "{stdout}");
}

#[test]
fn gpu_resume_equals_an_uninterrupted_run_batched() {
    resume_matches_uninterrupted(&["--device", "cuda"], "13");
}

#[test]
fn gpu_resume_equals_an_uninterrupted_run_per_sample_captured() {
    resume_matches_uninterrupted(
        &[
            "--device",
            "cuda",
            "--schedule",
            "per-sample",
            "--capture",
            "--samples",
            "60",
        ],
        "2",
    );
}

#[test]
fn gpu_memory_report() {
    let dir = tempfile::tempdir().expect("tempdir");
    let report = dir.path().join("m.html");
    let o = tiny(&[
        "--device",
        "cuda",
        "--epochs",
        "1",
        "--memory-report",
        path_str(&report),
    ]);
    assert!(o.status.success(), "{:?}", text(&o));
    let html = std::fs::read_to_string(&report).expect("report");
    assert!(html.contains("class=\"area persistent\"") && html.contains("high-water"));
}

/// Final parameters and optimiser state (as bits) and progress of a tiny GPU run.
fn gpu_final_state(extra: &[&str]) -> (Vec<(String, Vec<u32>)>, ztrain::checkpoint::Progress) {
    let dir = tempfile::tempdir().expect("tempdir");
    let ck = dir.path().join("ck.st");
    let o = tiny(&[extra, &["--checkpoint", path_str(&ck)]].concat());
    assert!(o.status.success(), "{:?}", text(&o));
    let c = Checkpoint::load(&ck).expect("checkpoint");
    let bits = c
        .params
        .iter()
        .chain(c.optim.iter())
        .map(|(n, t)| (n.clone(), t.data.iter().map(|v| v.to_bits()).collect()))
        .collect();
    (bits, c.progress)
}

/// The README's promise on the GPU: same binary, device kind, options and seed give bitwise
/// identical parameters (twin: `reliability::soak::two_runs_with_one_seed_end_bitwise_equal`).
#[test]
fn gpu_two_runs_with_one_seed_end_bitwise_equal() {
    for extra in [
        &["--device", "cuda"][..],
        &[
            "--device",
            "cuda",
            "--schedule",
            "per-sample",
            "--capture",
            "--samples",
            "60",
        ][..],
    ] {
        let a = gpu_final_state(extra);
        assert!(a == gpu_final_state(extra), "{extra:?}: two runs differ");
        let other = gpu_final_state(&[extra, &["--seed", "7"]].concat());
        assert!(a.0 != other.0, "{extra:?}: the seed changes nothing");
    }
}

/// A short soak on the GPU, eager and captured: the arena and the driver's device memory are
/// flat after the warm-up (the 10,000-step soak is docs/ztrain.md's command; twin:
/// `reliability::soak::a_per_sample_soak_on_the_simulated_device_is_flat_after_warm_up`).
#[test]
fn gpu_per_sample_soak_is_flat_after_warm_up() {
    for capture in [&[][..], &["--capture"][..]] {
        let dir = tempfile::tempdir().expect("tempdir");
        let report = dir.path().join("soak.json");
        let args = [
            &[
                "--device",
                "cuda",
                "--schedule",
                "per-sample",
                "--samples",
                "100",
                "--validate-fraction",
                "0",
                "--epochs",
                "30",
                "--soak-every",
                "10",
                "--soak-report",
                path_str(&report),
            ][..],
            capture,
        ]
        .concat();
        let o = tiny(&args);
        assert!(o.status.success(), "{:?}", text(&o));
        let r: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&report).expect("report")).expect("json");
        let slope = |series: &str| r["slopes_bytes_per_1000_steps"][series].as_f64();
        for series in ["arena_bytes", "arena_high_water"] {
            assert_eq!(slope(series), Some(0.0), "{capture:?} {series}: {r}");
        }
        // The driver's number counts the whole GPU: flat within a MiB per 1,000 steps.
        let device = slope("device_used_bytes").expect("device slope");
        assert!(
            device.abs() < f64::from(1 << 20),
            "{capture:?}: {device}: {r}"
        );
    }
}

/// The training set on the GPU (rows gathered in the captured step, read back every 3 steps)
/// and the validation set there too (captured chunks, one read-back an epoch) against the host
/// path: the same losses, validation numbers and final checkpoint, bit for bit.
#[test]
fn gpu_data_on_device_equals_host() {
    for extra in [
        &["--device", "cuda", "--capture"][..],
        &["--device", "cuda"],
        &[
            "--device",
            "cuda",
            "--capture",
            "--schedule",
            "per-sample",
            "--samples",
            "40",
        ],
    ] {
        common::data_on_device_matches_host(extra);
    }
}
