//! `ztrain --plan` as a user runs it: the memory plan before the run, on any machine.

use crate::common;
#[path = "plan/ranges.rs"]
mod ranges;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{text, ztrain, ztrain_binary};

fn json_of(args: &[&str]) -> serde_json::Value {
    let o = ztrain(args);
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

#[test]
fn plan_prints_every_class_for_both_schedules_without_training() {
    let o = ztrain(&["--plan", "--width", "64", "--ff", "128", "--batch", "16"]);
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    for needle in [
        "persistent",
        "saved",
        "scratch",
        "graph",
        "batched",
        "per-sample",
        "arena that holds one step without overflow",
        "cuBLAS workspace",
        "device:",
    ] {
        assert!(stdout.contains(needle), "{needle} missing:\n{stdout}");
    }
    // No epoch line ("epoch 1/2: train loss ..."); the plan's own lines may say what happens
    // every epoch (the validation set's line does where it goes on the device).
    assert!(
        !stdout.lines().any(|l| l.starts_with("epoch ")),
        "--plan trains nothing:\n{stdout}"
    );
    // On a machine without a GPU it says so and still prints the plan.
    if stdout.contains("no usable GPU") {
        assert!(
            stdout.contains("the plan holds for any GPU with at least"),
            "{stdout}"
        );
    }
}

#[test]
fn plan_json_says_whether_the_device_and_the_cap_hold_it() {
    let args = |mem: &'static str| {
        [
            "--plan",
            "--json",
            "--capture",
            "--device",
            "sim",
            "--sim-memory",
            mem,
            "--width",
            "64",
            "--ff",
            "128",
            "--batch",
            "16",
            // Under `auto` the training set's place (and so the plan) follows the device.
            "--data-on",
            "host",
        ]
    };
    let big = json_of(&args("4G"));
    assert_eq!(big["fits"], true, "{big}");
    assert_eq!(big["arena_cap_holds"], true, "{big}");
    let schedules = big["schedules"].as_array().expect("schedules");
    assert_eq!(schedules.len(), 2);
    for s in schedules {
        for class in ["persistent", "saved", "scratch", "graph"] {
            assert!(s["peak_bytes"][class].as_u64().unwrap() > 0, "{class}: {s}");
        }
        assert_eq!(s["captured"], true, "{s}");
    }
    let need = big["device_bytes"].as_u64().unwrap();
    let arena = big["arena_bytes"].as_u64().unwrap();
    assert!(need > arena, "{big}");
    // A device smaller than the plan: legitimately full. The plan is on the arena the run
    // would size from its plan there (a few MiB at this size, not zmem's fixed 64 MiB
    // segments), so the default cap (3/4 of the device) still holds it; a cap too small is
    // `plan_names_a_cap_too_small_for_one_step`.
    let small = json_of(&args("24M"));
    assert_eq!(
        small["device_bytes"], need,
        "the same plan: the arena's sizes do not depend on a device this size"
    );
    assert_eq!(small["fits"], false, "{small}");
    assert_eq!(small["arena_cap_holds"], true, "{small}");
}

#[test]
fn plan_names_a_cap_too_small_for_one_step() {
    let o = ztrain(&[
        "--plan",
        "--device",
        "sim",
        "--arena-cap",
        "64M",
        "--arena-bytes",
        "64M",
    ]);
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stdout.contains("too small, the step would overflow; raise --arena-cap to at least"),
        "{stdout}"
    );
}

/// Peak resident memory of a process, sampled from `/proc` until it exits (Linux).
fn peak_rss_kib(child: &mut std::process::Child) -> u64 {
    let status = format!("/proc/{}/status", child.id());
    let mut peak = 0;
    loop {
        if let Ok(text) = std::fs::read_to_string(&status) {
            let hwm = text
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok());
            peak = peak.max(hwm.unwrap_or(0));
        }
        if child.try_wait().expect("waits").is_some() {
            return peak;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
#[allow(clippy::print_stdout)] // the time and RSS belong in the test's output (reported)
fn plan_at_width_16384_stays_under_1_gib_of_host_memory() {
    let start = Instant::now();
    let mut child = Command::new(ztrain_binary())
        .args(["--plan", "--json", "--width", "16384"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("runs ztrain");
    let rss = peak_rss_kib(&mut child);
    let took = start.elapsed();
    assert!(child.wait().expect("exit status").success());
    // Reported, not asserted (no timed assertions): the bound is 10 s.
    println!("ztrain --plan --width 16384: {took:?}, peak RSS {rss} KiB");
    assert!(rss > 0, "no /proc sample of the process");
    assert!(rss < 1 << 20, "peak RSS {rss} KiB is not under 1 GiB");
}

/// `--layers` is in the plan: three blocks hold three blocks' parameters (persistent memory
/// grows by about two blocks' parameters, gradients and moments) and the JSON says so.
#[test]
fn plan_counts_every_block() {
    let persistent = |layers: &str| {
        let j = json_of(&[
            "--plan", "--json", "--width", "64", "--ff", "128", "--batch", "8", "--layers", layers,
        ]);
        assert_eq!(j["model"]["layers"].to_string(), layers, "{j}");
        j["schedules"][0]["peak_bytes"]["persistent"]
            .as_u64()
            .expect("persistent bytes")
    };
    let (one, three) = (persistent("1"), persistent("3"));
    // One block at width 64, FF 128: 3·64² + 64² + 2·64·128 weights and small vectors, times
    // parameters, gradients and two moments (4 bytes each).
    let block_bytes = (4 * 64 * 64 + 2 * 64 * 128) * 16;
    assert!(
        three >= one + 2 * block_bytes && three < one + 3 * block_bytes,
        "persistent {one} with one block, {three} with three"
    );
    let o = ztrain(&[
        "--plan", "--width", "64", "--ff", "128", "--batch", "8", "--layers", "3",
    ]);
    assert!(text(&o).0.contains("XAsset L=3 D=64"), "{:?}", text(&o));
}

/// Under `--precision bf16` the plan holds the weights' bf16 copy in a class of its own
/// (`shadow`, two bytes a parameter value), in the table and the JSON; float32 holds none.
#[test]
fn a_bf16_plan_shows_the_weight_copy_as_its_own_class() {
    let args = |precision: &'static str| {
        [
            "--plan",
            "--json",
            "--device",
            "sim",
            "--width",
            "64",
            "--ff",
            "128",
            "--batch",
            "16",
            "--precision",
            precision,
        ]
    };
    for (precision, holds_copy) in [("bf16", true), ("f32", false)] {
        let plan = json_of(&args(precision));
        let schedules = plan["schedules"].as_array().expect("schedules");
        assert_eq!(schedules.len(), 2, "{plan}");
        for s in schedules {
            let shadow = s["peak_bytes"]["shadow"].as_u64().expect("a shadow class");
            assert_eq!(shadow > 0, holds_copy, "{precision}: {s}");
        }
    }
    let table: Vec<&str> = args("bf16")
        .into_iter()
        .filter(|a| *a != "--json")
        .collect();
    let o = ztrain(&table);
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("shadow"), "{stdout}");
}
