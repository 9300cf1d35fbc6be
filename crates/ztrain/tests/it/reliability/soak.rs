//! Item 16: the soak report (memory flat after warm-up) and bitwise determinism of two runs
//! with one seed, on the simulated device and the CPU. GPU twins: `tests/gpu.rs`.

use serde_json::Value;

use crate::common::{path_str, text, tiny};
use ztrain::checkpoint::{Checkpoint, Progress};

fn soak(extra: &[&str]) -> Value {
    let dir = tempfile::tempdir().expect("tempdir");
    let report = dir.path().join("soak.json");
    let o = tiny(
        &[
            extra,
            &["--soak-report", path_str(&report), "--soak-every", "5"],
        ]
        .concat(),
    );
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("soak: ") && stdout.contains("slopes per 1000 steps"),
        "{stdout}"
    );
    serde_json::from_slice(&std::fs::read(&report).expect("report")).expect("json")
}

fn slope(report: &Value, series: &str) -> f64 {
    report["slopes_bytes_per_1000_steps"][series]
        .as_f64()
        .unwrap_or_else(|| panic!("no slope for {series}: {report}"))
}

#[test]
fn a_per_sample_soak_on_the_simulated_device_is_flat_after_warm_up() {
    for capture in [&[][..], &["--capture"][..]] {
        let r = soak(
            &[
                &[
                    "--device",
                    "sim",
                    "--sim-memory",
                    "256M",
                    "--schedule",
                    "per-sample",
                    "--samples",
                    "50",
                    "--epochs",
                    "10",
                ][..],
                capture,
            ]
            .concat(),
        );
        // 40 training samples in batches of 16: 3 steps an epoch, 30 in all, a sample every 5.
        assert_eq!(r["steps"], 30, "{r}");
        assert_eq!(r["samples"].as_array().map(Vec::len), Some(6), "{r}");
        for series in ["arena_bytes", "arena_high_water", "device_used_bytes"] {
            assert_eq!(slope(&r, series), 0.0, "{capture:?} {series}: {r}");
        }
        assert!(r["samples"][0]["host_rss_bytes"].as_u64() > Some(0), "{r}");
    }
}

#[test]
fn the_soak_report_works_on_the_cpu() {
    let r = soak(&["--device", "cpu", "--epochs", "5"]);
    assert_eq!(r["steps"], 50, "{r}");
    assert!(slope(&r, "host_rss_bytes").is_finite());
    assert_eq!(slope(&r, "arena_bytes"), 0.0, "no arena on the CPU");
}

/// Everything a tiny run with `extra` options ends with: parameters and optimiser state as
/// bits, and the counters, generator and data order. (The file's bytes are not compared: the
/// safetensors header's metadata keys come in hash order.)
fn final_state(extra: &[&str]) -> (Vec<(String, Vec<u32>)>, Progress) {
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

#[test]
fn two_runs_with_one_seed_end_bitwise_equal() {
    let sim = ["--device", "sim", "--sim-memory", "256M", "--samples", "60"];
    for extra in [
        &["--device", "cpu"][..],
        &sim[..],
        &[&sim[..], &["--schedule", "per-sample", "--capture"]].concat()[..],
    ] {
        let a = final_state(extra);
        assert!(a == final_state(extra), "{extra:?}: two runs differ");
        let other = final_state(&[extra, &["--seed", "7"]].concat());
        assert!(a.0 != other.0, "{extra:?}: the seed changes nothing");
    }
}
