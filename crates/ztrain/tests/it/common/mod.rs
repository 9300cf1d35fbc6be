//! Running the built `ztrain` binary on tiny sizes (shared by the CLI tests and their GPU twins).
#![allow(dead_code)] // each test binary uses a subset

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ztrain::checkpoint::Checkpoint;

/// A tiny model and data set: a run takes well under a second.
pub const TINY: &[&str] = &[
    "--features",
    "6",
    "--scales",
    "3",
    "--width",
    "16",
    "--heads",
    "2",
    "--ff",
    "32",
    "--samples",
    "200",
    "--batch",
    "16",
    "--epochs",
    "2",
];

/// The `ztrain` binary: `ZTRAIN_BIN` if set, else the one cargo built, else one beside the test
/// binary or in its parent folder (the GPU bundle copies test binaries to `bin/` and `ztrain`
/// beside that folder, on a machine where the build path does not exist).
pub fn ztrain_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("ZTRAIN_BIN") {
        return PathBuf::from(p);
    }
    let built = PathBuf::from(env!("CARGO_BIN_EXE_ztrain"));
    if built.is_file() {
        return built;
    }
    let exe = std::env::current_exe().unwrap_or_default();
    exe.ancestors()
        .skip(1)
        .take(2)
        .map(|d| d.join("ztrain"))
        .find(|p| p.is_file())
        .unwrap_or(built)
}

pub fn ztrain(args: &[&str]) -> Output {
    ztrain_with_env(args, &[])
}

/// Runs `ztrain` with extra environment variables.
pub fn ztrain_with_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(ztrain_binary())
        .envs(env.iter().copied())
        .args(args)
        .env_remove("ZMEM_ARENA_BYTES")
        .output()
        .expect("runs ztrain")
}

pub fn tiny(extra: &[&str]) -> Output {
    let args: Vec<&str> = TINY.iter().chain(extra).copied().collect();
    ztrain(&args)
}

pub fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

pub fn assert_fails_with(o: &Output, needles: &[&str]) {
    let (stdout, stderr) = text(o);
    assert_eq!(
        o.status.code(),
        Some(1),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    for n in needles {
        assert!(stderr.contains(n), "`{n}` not in stderr:\n{stderr}");
    }
    assert!(!stderr.contains("panicked"), "{stderr}");
}

pub fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

/// Trains the tiny run once straight through and once stopped at `stop` and resumed; the
/// final checkpoints (parameters, optimiser state, counters, generator, order) are equal.
pub fn resume_matches_uninterrupted(extra: &[&str], stop: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (full, split) = (dir.path().join("full.st"), dir.path().join("split.st"));
    let run = |args: &[&str]| {
        let o = tiny(&[extra, args].concat());
        assert!(o.status.success(), "{:?}", text(&o));
        text(&o).0
    };
    run(&["--checkpoint", path_str(&full)]);
    let first = run(&["--checkpoint", path_str(&split), "--stop-after", stop]);
    assert!(
        first.contains(&format!("stopped after step {stop}")),
        "{first}"
    );
    let partial = Checkpoint::load(&split).expect("partial checkpoint");
    assert_eq!(partial.progress.step.to_string(), stop);
    let second = run(&[
        "--checkpoint",
        path_str(&split),
        "--resume",
        path_str(&split),
    ]);
    assert!(
        second.contains(&format!("resumed from {} at step {stop}", split.display())),
        "{second}"
    );
    let (a, b) = (
        Checkpoint::load(&full).expect("full"),
        Checkpoint::load(&split).expect("split"),
    );
    assert_eq!(a.progress, b.progress);
    for (name, t) in &a.params {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&t.data),
            bits(&b.params[name].data),
            "parameter {name} differs"
        );
    }
    assert_eq!(a.optim, b.optim);
}

/// The tiny run with `extra` options, its training set on the host and on the device (read
/// back every 3 steps; the validation set on the device too, evaluated there in captured
/// chunks with `--capture`): the same epoch losses and accuracies printed (validation's
/// included), and the same final checkpoint (parameters, optimiser state, progress), bit for
/// bit.
pub fn data_on_device_matches_host(extra: &[&str]) {
    let dir = tempfile::tempdir().expect("tempdir");
    let run = |name: &str, place: &[&str]| {
        let ck = dir.path().join(name);
        let o = tiny(&[extra, place, &["--checkpoint", path_str(&ck)]].concat());
        let (stdout, stderr) = text(&o);
        assert!(o.status.success(), "{stdout}\n{stderr}");
        // The numbers of each epoch line and of the summary, without rates and times.
        let numbers: Vec<String> = stdout
            .lines()
            .filter_map(|l| {
                if l.starts_with("epoch ") {
                    l.split(" samples/s")
                        .next()?
                        .rsplit_once(", ")
                        .map(|(a, _)| a.to_string())
                } else if l.starts_with("summary:") {
                    let after = l.split_once("samples/s; ")?.1;
                    Some(after.split("; peak").next()?.to_string())
                } else {
                    None
                }
            })
            .collect();
        (stdout, numbers, Checkpoint::load(&ck).expect("checkpoint"))
    };
    let (out_h, host, ck_h) = run("host.st", &["--data-on", "host"]);
    let (out_d, device, ck_d) = run(
        "device.st",
        &["--data-on", "device", "--readback-every", "3"],
    );
    assert!(out_h.contains("training set on the host"), "{out_h}");
    assert!(out_d.contains("training set on the device"), "{out_d}");
    assert!(out_d.contains("validation set on the device"), "{out_d}");
    assert!(!out_h.contains("validation set on the device"), "{out_h}");
    assert!(!host.is_empty());
    assert_eq!(device, host);
    assert_eq!(ck_d.progress, ck_h.progress);
    for (name, t) in &ck_h.params {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&t.data), bits(&ck_d.params[name].data), "{name}");
    }
    assert_eq!(ck_d.optim, ck_h.optim);
}
