//! `bench.sh` run end to end on stand-ins for the GPU programs (shell and Python stubs printing
//! the JSON the real ones print), with the real `compare.py`: one table, every row, the ratios.
//! Needs bash and python3 (CI has both: `build-kernels` uses python3).

use super::BENCH_SH;
use crate::toolchain::workspace_root;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const OURS: &str = r#"{"device":"GPU","batch":256,"batched_step_peak_live_MiB":120.0,"batched_step_peak_reserved_MiB":352.0,"batched_eager_ms":2.251,"batched_first_step_ms":150.0,"batched_graph_captured":true,"batched_graph_nodes":420,"batched_graph_ms":1.950,"batched_graph_e2e_ms":2.300,"batched_graph_e2e_host_slice_ms":2.700,"per_sample_eager_ms":208.8,"per_sample_graph_nodes":250,"per_sample_graph_ms":88.0}"#;
const TORCH: &str = r#"{"device": "GPU", "torch": "2.11", "batched_step_peak_MiB": 150.0, "batched_eager_ms": 3.492, "per_sample_eager_ms": 763.8, "batched_graph_ms": 1.179, "per_sample_graph_ms": 57.48, "compiled_batched_graph_ms": 0.975, "compiled_per_sample_graph_ms": 57.74}"#;
/// Ours and PyTorch's batched graph under `--precision bf16` / `--bf16` and TF32.
const OURS_BF16: &str =
    r#"{"device":"GPU","batch":256,"precision":"bf16","batched_graph_ms":0.500}"#;
const TORCH_BF16: &str = r#"{"device": "GPU", "torch": "2.11", "batched_graph_ms": 1.0, "compiled_batched_graph_ms": 0.625}"#;
const OURS_TF32: &str =
    r#"{"device":"GPU","batch":256,"precision":"tf32","batched_graph_ms":0.700}"#;
const TORCH_TF32: &str = r#"{"device": "GPU", "torch": "2.11", "batched_graph_ms": 1.4, "compiled_batched_graph_ms": 0.875}"#;
const E2E: &str = r#"{"batched_step_peak_MiB": 150.0, "batched_step_peak_reserved_MiB": 176.0, "batched_first_step_ms": 900.0, "batched_graph_nodes": 167, "batched_graph_e2e_ms": 1.5, "compiled_batched_graph_e2e_ms": 1.15}"#;

/// A fresh bundle-like folder: bench.sh, the real compare.py, stubs for the rest, one level
/// down in a folder of its own (removed whole by `remove`). Without `--reference`, bench.sh
/// takes the bundle's own `bench/xasset_torch.py`, which only some tests write.
fn bundle(name: &str) -> PathBuf {
    let root = std::env::temp_dir().join(format!("xtask-bench-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let dir = root.join("bundle");
    std::fs::create_dir_all(dir.join("bench")).unwrap();
    let write = |rel: &str, text: &str| {
        let p = dir.join(rel);
        std::fs::write(&p, text).unwrap();
        super::set_executable(&p).unwrap();
    };
    write("bench.sh", BENCH_SH);
    let compare = workspace_root().join("crates/zgrad/benches/compare.py");
    write(
        "bench/compare.py",
        &std::fs::read_to_string(compare).unwrap(),
    );
    write(
        "bench/xasset_bench",
        &format!(
            "#!/bin/sh\ncase \"$*\" in\n*'--precision bf16'*) echo '{OURS_BF16}' ;;\n*'--precision tf32'*) echo '{OURS_TF32}' ;;\n*) echo '{OURS}' ;;\nesac\n"
        ),
    );
    // Python stand-ins: print the object (the reduced-precision one under --bf16 / --tf32)
    // and write it to the file after --json.
    let py = |obj: &str| {
        format!(
            "import sys\nobj = '{obj}'\nif '--bf16' in sys.argv:\n    obj = '{TORCH_BF16}'\nif '--tf32' in sys.argv:\n    obj = '{TORCH_TF32}'\nprint(obj)\nif '--json' in sys.argv:\n    open(sys.argv[sys.argv.index('--json') + 1], 'w').write(obj)\n"
        )
    };
    write("bench/xasset_e2e_torch.py", &py(E2E));
    write("reference.py", &py(TORCH));
    write(
        "ztrain",
        "#!/bin/sh\ncase \"$*\" in *'--precision bf16'*) rate=7001 ;; *'--precision tf32'*) rate=6001 ;; *) rate=5123 ;; esac\necho 'epoch 1/1: 4000 samples/s'\necho \"summary: 205 steps in 9.0 s; 52428 samples trained at $rate samples/s; peak gpu memory 1 MiB\"\n",
    );
    write("bench/other_bench", "#!/bin/sh\necho other bench ran\n");
    write("bench/torch_ref.py", "print('torch_ref ran')\n");
    dir
}

/// Removes a folder `bundle` made, with the folder of its own around it.
fn remove(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir.parent().unwrap_or(dir));
}

fn bench_sh(dir: &Path, args: &[&str]) -> (Output, String) {
    let out = Command::new("bash")
        .arg(dir.join("bench.sh"))
        .args(args)
        .env("OUT", dir)
        .env_remove("XASSET_TORCH")
        .current_dir(dir)
        .output()
        .expect("bash runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (out, text)
}

#[test]
fn bench_sh_prints_one_table_with_every_row_and_ratio() {
    let dir = bundle("table");
    let reference = dir.join("reference.py");
    let (out, text) = bench_sh(&dir, &["--reference", reference.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for row in [
        "| batched, whole step as one graph (ms, CUDA events, data on device) | 1.950 | 1.179 | 0.975 | 2.00 |",
        "| per-sample, each sample's forward+backward captured (ms) | 88.00 | 57.48 | 57.74 | 1.53 |",
        "| batched, eager (ms, median of runs) | 2.251 | 3.492 | - | 0.64 |",
        "| per-sample, eager (ms, median of runs) | 208.8 | 763.8 | - | 0.27 |",
        "| batched graph end to end: pinned copy in, replay, loss read back (ms) | 2.300 | 1.500 | 1.150 | 2.00 |",
        "| batched graph end to end from a host slice (ms; ours: staged into pinned memory first) | 2.700 | - | - | - |",
        "| peak live memory of an eager batched step (MiB; torch: max_memory_allocated) | 120.0 | 150.0 | - | 0.80 |",
        "| peak reserved memory of an eager batched step (MiB; torch: max_memory_reserved) | 352.0 | 176.0 | - | 2.00 |",
        "| graph nodes per captured batched step | 420 | 167 | - | 2.51 |",
        "| graph nodes per captured per-sample step (one sample) | 250 | - | - | - |",
        "| time to the first captured batched step (ms: warm-up, capture, instantiate) | 150.0 | 900.0 | - | 0.17 |",
        "| ztrain samples/s (its own summary) | 5123 | - | - | - |",
    ] {
        assert!(text.contains(row), "missing `{row}` in:\n{text}");
    }
    assert!(
        text.contains("other bench ran") && text.contains("torch_ref ran"),
        "{text}"
    );
    let merged = std::fs::read_to_string(dir.join("bench-results/comparison.json")).unwrap();
    let merged: serde_json::Value = serde_json::from_str(&merged).unwrap();
    assert_eq!(merged["batched_graph_ms"]["torch"], 1.179);
    assert_eq!(merged["ztrain_samples_per_s"], 5123.0);
    remove(&dir);
}

/// After the float32 table, the same call prints a TF32 and a bf16 table: ours under
/// `--precision P` beside the reference under `--tf32` / `--bf16`, with the ratios, and
/// `ztrain --precision P`'s rate; rows neither side has are left out.
#[test]
fn bench_sh_prints_the_tf32_and_bf16_tables_beside_float32() {
    let dir = bundle("precision");
    let reference = dir.join("reference.py");
    let (out, text) = bench_sh(&dir, &["--reference", reference.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let graph = "| batched, whole step as one graph (ms, CUDA events, data on device) |";
    let f32_at = text.find("float32 TF32 off").expect("the float32 table");
    let tf32_at = text.find(", TF32 products").expect("the TF32 table");
    let bf16_at = text.find(", bf16 products").expect("the bf16 table");
    assert!(f32_at < tf32_at && tf32_at < bf16_at, "{text}");
    for (section, row) in [
        (
            &text[f32_at..tf32_at],
            format!("{graph} 1.950 | 1.179 | 0.975 | 2.00 |"),
        ),
        (
            &text[tf32_at..bf16_at],
            format!("{graph} 0.700 | 1.400 | 0.875 | 0.80 |"),
        ),
        (
            &text[bf16_at..],
            format!("{graph} 0.500 | 1.000 | 0.625 | 0.80 |"),
        ),
        (
            &text[tf32_at..bf16_at],
            "| ztrain samples/s (its own summary) | 6001 |".into(),
        ),
        (
            &text[bf16_at..],
            "| ztrain samples/s (its own summary) | 7001 |".into(),
        ),
    ] {
        assert!(section.contains(&row), "missing `{row}` in:\n{section}");
    }
    assert!(!text[bf16_at..].contains("per-sample, eager"), "{text}");
    let merged = std::fs::read_to_string(dir.join("bench-results/comparison_bf16.json")).unwrap();
    let merged: serde_json::Value = serde_json::from_str(&merged).unwrap();
    assert_eq!(merged["batched_graph_ms"]["ours_over_best"], 0.8);
    remove(&dir);
}

#[test]
fn bench_sh_without_the_reference_fails_but_still_prints_our_side() {
    let dir = bundle("noref");
    let (out, text) = bench_sh(&dir, &["--xasset-only"]);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("xasset_torch.py not found: pass --reference FILE"),
        "{text}"
    );
    // Our numbers and PyTorch's end-to-end ones still make the table; the reference's are dashes.
    assert!(
        text.contains("| batched, whole step as one graph (ms, CUDA events, data on device) | 1.950 | - | - | - |"),
        "{text}"
    );
    assert!(
        !text.contains("other bench ran"),
        "--xasset-only ran the others:\n{text}"
    );
    let (out, text) = bench_sh(&dir, &["--bogus"]);
    assert_eq!(out.status.code(), Some(2), "{text}");
    remove(&dir);
}

/// With no `--reference` and no `XASSET_TORCH`, bench.sh runs the bundle's own
/// `bench/xasset_torch.py` (the bundle carries crates/zgrad/benches/*.py), and leaves the
/// reference scripts that need arguments of their own (torchrun, a job name) to be run by hand.
#[test]
fn bench_sh_takes_the_bundled_reference_and_leaves_the_hand_run_scripts() {
    let dir = bundle("bundled-ref");
    let write = |rel: &str, text: &str| std::fs::write(dir.join(rel), text).unwrap();
    let py = format!(
        "import sys\nobj = '{TORCH}'\nprint(obj)\nif '--json' in sys.argv:\n    open(sys.argv[sys.argv.index('--json') + 1], 'w').write(obj)\n"
    );
    write("bench/xasset_torch.py", &py);
    for hand_run in ["xasset_ddp_torch.py", "xasset_user_loop_torch.py"] {
        write(
            &format!("bench/{hand_run}"),
            "print('hand-run script ran'); raise SystemExit(3)\n",
        );
    }
    let (out, text) = bench_sh(&dir, &[]);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("| batched, whole step as one graph (ms, CUDA events, data on device) | 1.950 | 1.179 | 0.975 | 2.00 |"),
        "{text}"
    );
    assert!(!text.contains("hand-run script ran"), "{text}");
    remove(&dir);
}

/// `comm.sh` (bundled beside `bench.sh`) is a script bash accepts.
#[test]
fn comm_sh_parses() {
    let dir = bundle("comm");
    let script = dir.join("comm.sh");
    std::fs::write(&script, super::COMM_SH).unwrap();
    let out = Command::new("bash")
        .arg("-n")
        .arg(&script)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    remove(&dir);
}
