//! `cargo xtask test-gpu [--bundle DIR | --sanitize ...] [-- ARGS]`: the GPU test run, here or
//! on a machine without Rust, or under compute-sanitizer (`sanitize_cmd`).
//!
//! GPU tests are, by convention, the tests whose path contains `gpu` (module `gpu`,
//! `cuda_conformance_gpu`, ...). A run that executes none of them fails: a GPU job that silently
//! tested only the CPU paths is worse than a red one.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::error::{Result, XtaskError, io};
use crate::toolchain::{self, workspace_root};

/// `--features` value naming every workspace package's `gpu` feature.
fn gpu_features() -> Result<String> {
    let meta = toolchain::output(
        Command::new(cargo())
            .args(["metadata", "--format-version", "1", "--no-deps"])
            .current_dir(workspace_root()),
    )?;
    let meta: serde_json::Value = serde_json::from_str(&meta)
        .map_err(|e| XtaskError::Other(format!("cargo metadata is not JSON: {e}")))?;
    let mut features = Vec::new();
    for pkg in meta["packages"].as_array().into_iter().flatten() {
        if pkg["features"].get("gpu").is_some()
            && let Some(name) = pkg["name"].as_str()
        {
            features.push(format!("{name}/gpu"));
        }
    }
    if features.is_empty() {
        return Err(XtaskError::Other(
            "no workspace package has a `gpu` feature".into(),
        ));
    }
    Ok(features.join(","))
}

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string())
}

/// Whether a libtest line reports a GPU test that ran (passed or failed, not ignored).
fn ran_gpu_test(line: &str) -> bool {
    let Some(rest) = line.strip_prefix("test ") else {
        return false;
    };
    let Some((name, outcome)) = rest.split_once(" ... ") else {
        return false;
    };
    // With --nocapture the test's own output may follow "... " before the outcome, so a started
    // test counts unless it was ignored.
    name.contains("gpu") && !outcome.starts_with("ignored")
}

/// `cargo xtask test-gpu [-- ARGS]`: runs the whole workspace's tests with the GPU features.
pub fn run(extra: &[String]) -> Result<()> {
    let smi = Command::new("nvidia-smi").arg("-L").output();
    match smi {
        Ok(out) if out.status.success() => eprint!("{}", String::from_utf8_lossy(&out.stdout)),
        _ => {
            return Err(XtaskError::Other(
                "no GPU found: `nvidia-smi -L` is absent or failed".into(),
            ));
        }
    }
    let features = gpu_features()?;
    let mut cmd = Command::new(cargo());
    cmd.current_dir(workspace_root())
        .args([
            "test",
            "--release",
            "--workspace",
            "--features",
            &features,
            "--",
        ])
        .args(extra)
        .stdout(Stdio::piped());
    let shown = format!("{cmd:?}");
    let mut child = cmd.spawn().map_err(|e| XtaskError::Command {
        command: shown.clone(),
        reason: e.to_string(),
    })?;
    let mut gpu_tests = 0usize;
    if let Some(stdout) = child.stdout.take() {
        for line in BufReader::new(stdout).lines() {
            let line = line.map_err(io("reading output of", "cargo test"))?;
            println!("{line}");
            gpu_tests += usize::from(ran_gpu_test(&line));
        }
    }
    let status = child.wait().map_err(|e| XtaskError::Command {
        command: shown.clone(),
        reason: e.to_string(),
    })?;
    eprintln!("{gpu_tests} GPU test(s) ran");
    if !status.success() {
        return Err(XtaskError::Command {
            command: shown,
            reason: status.to_string(),
        });
    }
    if gpu_tests == 0 {
        return Err(XtaskError::Other(
            "no GPU test ran (no test path contains `gpu`)".into(),
        ));
    }
    Ok(())
}

/// `cargo xtask test-gpu --bundle DIR`: release test binaries plus `run.sh`, `sanitize.sh` and
/// `comm.sh` (the multi-GPU checks of issue 13), for a GPU machine without Rust.
pub fn bundle(dir: &Path) -> Result<()> {
    let features = gpu_features()?;
    let (count, mut total) = build_test_binaries(dir, &features)?;
    let script = dir.join("run.sh");
    std::fs::write(&script, RUN_SH).map_err(io("writing", &script))?;
    set_executable(&script)?;
    total += RUN_SH.len() as u64;
    let comm = dir.join("comm.sh");
    std::fs::write(&comm, COMM_SH).map_err(io("writing", &comm))?;
    set_executable(&comm)?;
    crate::sanitize_cmd::write_script(dir)?;
    total += copy_files(&workspace_root().join(FIXTURES), &dir.join(FIXTURES))?;
    let benches = bundle_benches(dir, &features)?;
    println!(
        "bundle {}: {count} test binaries + run.sh + sanitize.sh + comm.sh, {benches} benchmark(s) + bench.sh, {:.1} MiB",
        dir.display(),
        total as f64 / (1024.0 * 1024.0)
    );
    Ok(())
}

/// The oracle fixtures the test binaries read (`ZGPU_FIXTURES`, which `run.sh` points at the
/// bundle's copy, so the bundle runs from any folder).
const FIXTURES: &str = "tests/fixtures";

/// Copies the files directly in `src` into `dst` (created); returns their total size.
fn copy_files(src: &Path, dst: &Path) -> Result<u64> {
    std::fs::create_dir_all(dst).map_err(io("creating", dst))?;
    let mut total = 0;
    for entry in std::fs::read_dir(src).map_err(io("reading", src))? {
        let path = entry.map_err(io("reading", src))?.path();
        if path.is_file() {
            let to = dst.join(path.file_name().unwrap_or_default());
            total += std::fs::copy(&path, &to).map_err(io("copying", &path))?;
        }
    }
    Ok(total)
}

/// `cargo xtask test-gpu --sanitize`: the release test binaries and `sanitize.sh` in
/// `target/sanitize-bundle`, then the script with `args` (see `sanitize_cmd`).
pub fn sanitize(args: &[String]) -> Result<()> {
    let smi = Command::new("nvidia-smi").arg("-L").output();
    if !matches!(&smi, Ok(out) if out.status.success()) {
        return Err(XtaskError::Other(
            "no GPU found: `nvidia-smi -L` is absent or failed".into(),
        ));
    }
    let features = gpu_features()?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| workspace_root().join("target"), PathBuf::from);
    let dir = target.join("sanitize-bundle");
    let (count, _) = build_test_binaries(&dir, &features)?;
    crate::sanitize_cmd::write_script(&dir)?;
    eprintln!("{count} test binaries in {}", dir.display());
    crate::sanitize_cmd::run_script(&dir, args)
}

/// Builds the workspace's release test binaries with the GPU features into `DIR/bin` (emptied
/// first), named by [`binary_name`]. Returns how many and their total size.
fn build_test_binaries(dir: &Path, features: &str) -> Result<(usize, u64)> {
    let mut cmd = Command::new(cargo());
    cmd.current_dir(workspace_root()).args([
        "test",
        "--release",
        "--workspace",
        // xtask's own tests check the checkout (the tidy test reads ARCHITECTURE.md and runs
        // `cargo metadata`): they belong to CI, not to a GPU machine without the sources.
        "--exclude",
        "xtask",
        "--features",
        features,
        "--no-run",
        "--message-format=json",
    ]);
    let out = toolchain::output(&mut cmd)?;
    let bin = dir.join("bin");
    if bin.exists() {
        std::fs::remove_dir_all(&bin).map_err(io("clearing", &bin))?;
    }
    std::fs::create_dir_all(&bin).map_err(io("creating", &bin))?;
    let mut total = 0u64;
    let mut count = 0usize;
    for line in out.lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if msg["reason"] != "compiler-artifact" || msg["profile"]["test"] != true {
            continue;
        }
        let Some(exe) = msg["executable"].as_str() else {
            continue;
        };
        let name = binary_name(&msg);
        let dest = bin.join(&name);
        std::fs::copy(exe, &dest).map_err(io("copying", exe))?;
        // Release test binaries are already stripped by the profile; this catches a profile
        // change, and a missing `strip` only costs size.
        let _ = Command::new("strip").arg(&dest).status();
        total += std::fs::metadata(&dest)
            .map_err(io("reading", &dest))?
            .len();
        count += 1;
    }
    if count == 0 {
        return Err(XtaskError::Other("cargo built no test binary".into()));
    }
    Ok((count, total))
}

/// Release builds (with the GPU features) of the workspace's commands into `DIR/`, of every
/// example named `*_bench` into `DIR/bench/` and of the other examples (the programs a user
/// copies: `classifier`, `sequence`, ...) into `DIR/examples/`, so they run on the GPU machine
/// with `--device cuda` as written in the guide; the Python scripts `crates/*/benches/*.py`
/// (PyTorch references, `compare.py`) beside them, and `bench.sh`, which runs the benchmarks.
/// Returns how many files it bundled.
fn bundle_benches(dir: &Path, features: &str) -> Result<usize> {
    let mut cmd = Command::new(cargo());
    cmd.current_dir(workspace_root()).args([
        "build",
        "--release",
        "--workspace",
        "--examples",
        "--bins",
        "--features",
        features,
        "--message-format=json",
    ]);
    let out = toolchain::output(&mut cmd)?;
    let bench = dir.join("bench");
    if bench.exists() {
        std::fs::remove_dir_all(&bench).map_err(io("clearing", &bench))?;
    }
    std::fs::create_dir_all(&bench).map_err(io("creating", &bench))?;
    let examples = dir.join("examples");
    if examples.exists() {
        std::fs::remove_dir_all(&examples).map_err(io("clearing", &examples))?;
    }
    std::fs::create_dir_all(&examples).map_err(io("creating", &examples))?;
    let mut count = 0usize;
    for line in out.lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let name = msg["target"]["name"].as_str().unwrap_or_default();
        if msg["reason"] != "compiler-artifact" {
            continue;
        }
        // The workspace's commands (ztrain) go beside `bin/`, where their CLI tests look.
        if msg["target"]["kind"][0] == "bin" && name != "xtask" {
            if let Some(exe) = msg["executable"].as_str() {
                std::fs::copy(exe, dir.join(name)).map_err(io("copying", exe))?;
                count += 1;
            }
            continue;
        }
        if msg["target"]["kind"][0] != "example" {
            continue;
        }
        let into = if name.ends_with("_bench") {
            &bench
        } else {
            &examples
        };
        if let Some(exe) = msg["executable"].as_str() {
            std::fs::copy(exe, into.join(name)).map_err(io("copying", exe))?;
            count += 1;
        }
    }
    let crates = workspace_root().join("crates");
    for entry in std::fs::read_dir(&crates).map_err(io("listing", &crates))? {
        let benches = entry
            .map_err(io("listing", &crates))?
            .path()
            .join("benches");
        let Ok(files) = std::fs::read_dir(&benches) else {
            continue;
        };
        for file in files.flatten() {
            let path = file.path();
            if path.extension().and_then(|e| e.to_str()) == Some("py")
                && let Some(name) = path.file_name()
            {
                std::fs::copy(&path, bench.join(name)).map_err(io("copying", &path))?;
                count += 1;
            }
        }
    }
    let script = dir.join("bench.sh");
    std::fs::write(&script, BENCH_SH).map_err(io("writing", &script))?;
    set_executable(&script)?;
    Ok(count)
}

/// The XAsset comparison (our benchmark, PyTorch's two scripts, a `ztrain` run, `compare.py`'s
/// table), then every other bundled benchmark binary and Python reference, in one session.
pub(crate) const BENCH_SH: &str = include_str!("bench.sh");

/// Issue 13 on several GPUs: the zcomm NCCL tests, then a `ztrain --gpus` job whose rank 1 is
/// killed (SIGKILL) and one whose rank 1 is stopped (SIGSTOP); for each surviving rank its
/// error lines and the time from the signal to its exit, checked against the launcher's grace.
pub(crate) const COMM_SH: &str = include_str!("comm.sh");

/// `<package dir>-<kind>-<target>`, e.g. `zdevice-test-it`: readable and unique per workspace.
fn binary_name(msg: &serde_json::Value) -> String {
    let package = msg["manifest_path"]
        .as_str()
        .map(PathBuf::from)
        .and_then(|p| {
            p.parent()
                .and_then(|d| d.file_name())
                .map(|n| n.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "package".into());
    let kind = msg["target"]["kind"][0].as_str().unwrap_or("test");
    let target = msg["target"]["name"].as_str().unwrap_or("target");
    format!("{package}-{kind}-{target}")
}

pub(crate) fn set_executable(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .map_err(io("chmod", path))
}

/// Runs every binary, logs into `${OUT:-bundle}/logs`, sums libtest's results into the last line
/// `N passed, N failed`, and fails on any failure or when no GPU test ran.
const RUN_SH: &str = r#"#!/usr/bin/env bash
# Generated by `cargo xtask test-gpu --bundle`. Usage: ./run.sh [libtest args...]
set -u
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export ZGPU_FIXTURES="${ZGPU_FIXTURES:-$here/tests/fixtures}"
logs="${OUT:-$here}/logs"
mkdir -p "$logs"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || echo "nvidia-smi failed: no GPU?"
passed=0; failed=0; gpu=0; bad=0
for bin in "$here"/bin/*; do
  name="$(basename "$bin")"
  log="$logs/$name.log"
  echo "== $name"
  "$bin" --test-threads=1 "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then bad=1; echo "== $name exited $rc"; fi
  while read -r p f; do
    passed=$((passed + p)); failed=$((failed + f))
  done < <(sed -nE 's/^test result: [A-Za-z]+\. ([0-9]+) passed; ([0-9]+) failed.*/\1 \2/p' "$log")
  # A started GPU test counts unless ignored (with --nocapture its output follows "... ").
  g=$(grep -E '^test [^ ]*gpu[^ ]* \.\.\. ' "$log" | grep -cvE ' \.\.\. ignored' || true)
  gpu=$((gpu + g))
done
echo "$gpu GPU test(s) ran"
if [ "$gpu" -eq 0 ]; then echo "no GPU test ran"; bad=1; fi
if [ "$failed" -ne 0 ]; then bad=1; fi
echo "$passed passed, $failed failed"
exit "$bad"
"#;

#[cfg(test)]
#[path = "bench_tests.rs"]
mod bench_tests;

#[cfg(test)]
mod tests {
    use super::ran_gpu_test;

    /// The bundle carries the fixtures its tests read and points them there from any folder
    /// (before, a bundle run outside a checkout failed the oracle tests: no fixture found).
    #[test]
    fn the_bundle_carries_its_fixtures_and_run_sh_points_at_them() {
        let out = std::env::temp_dir().join(format!("xtask-fixtures-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out);
        let root = super::workspace_root();
        let copied = super::copy_files(&root.join(super::FIXTURES), &out).expect("copy");
        let oracle = out.join("xasset_tiny_oracle.safetensors");
        assert!(oracle.is_file(), "{} missing", oracle.display());
        assert!(copied > 0);
        std::fs::remove_dir_all(&out).expect("clean up");
        assert!(
            super::RUN_SH
                .contains("export ZGPU_FIXTURES=\"${ZGPU_FIXTURES:-$here/tests/fixtures}\"")
        );
    }

    #[test]
    fn accelerator_tests_are_recognised_by_path() {
        assert!(ran_gpu_test("test gpu::fill_runs ... ok"));
        assert!(ran_gpu_test("test cuda_conformance_gpu::alloc ... FAILED"));
        assert!(!ran_gpu_test("test gpu::slow ... ignored"));
        assert!(ran_gpu_test(
            "test gpu_smoke ... CudaDriver (libcuda, driver API 13.0)"
        ));
        assert!(!ran_gpu_test("test sim::alloc ... ok"));
        assert!(!ran_gpu_test("test result: ok. 3 passed; 0 failed"));
    }
}
