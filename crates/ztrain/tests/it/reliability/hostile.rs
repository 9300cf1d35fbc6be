//! Items 10 and 12: no option value makes the process panic or abort; a size the machine cannot
//! hold is a typed error naming what is needed and what there is; arena options the arena
//! would change are refused, from the command line or the environment.

use std::process::Command;

use crate::common::{TINY, text, tiny, ztrain_binary};

const MAX: &str = "18446744073709551615";

/// Runs the tiny configuration with `extra`, and says what the user saw.
fn hostile(extra: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let o = Command::new(ztrain_binary())
        .env_remove("ZMEM_ARENA_BYTES")
        .envs(env.iter().copied())
        .args(TINY)
        .args(["--epochs", "1"])
        .args(extra)
        .output()
        .expect("runs ztrain");
    let (_, stderr) = text(&o);
    (o.status.code(), stderr)
}

#[test]
fn no_option_value_panics_or_aborts() {
    let table: &[(&[&str], &str)] = &[
        // Host memory or the simulated device's, whichever the machine runs out of first.
        (
            &["--device", "sim", "--width", "100000", "--heads", "4"],
            "the run needs about",
        ),
        (
            &[
                "--device",
                "cpu",
                "--scales",
                "20000",
                "--samples",
                "1000000",
            ],
            "of host memory",
        ),
        (
            &["--device", "cpu", "--ff", "4611686018427387904"],
            "more than 2^64 parameters",
        ),
        (
            &["--device", "cpu", "--scales", "4611686018427387904"],
            "more than 2^64 bytes",
        ),
        (
            &["--device", "cpu", "--width", MAX, "--heads", MAX],
            "more than 2^64 parameters",
        ),
        (
            &["--device", "cpu", "--samples", MAX],
            "more than 2^64 bytes",
        ),
        (&["--device", "cpu", "--features", MAX], "more than 2^64"),
        (
            &["--device", "cpu", "--batch", "1", "--epochs", MAX],
            "more than 2^64 steps",
        ),
        (&["--device", "sim", "--sim-memory", "0"], "--sim-memory"),
        (&["--device", "sim", "--sim-op-time", "0"], "--sim-op-time"),
        (
            &["--device", "sim", "--sim-op-time", "1e300"],
            "--sim-op-time",
        ),
        (
            &["--device", "sim", "--sim-op-time", "NaN"],
            "--sim-op-time",
        ),
        (
            &[
                "--device",
                "sim",
                "--sim-memory",
                "1G",
                "--width",
                "4096",
                "--heads",
                "4",
            ],
            "(--sim-memory) has 1.0 GiB",
        ),
        (
            &["--device", "sim", "--arena-bytes", "16000T"],
            "--arena-bytes",
        ),
        (
            &["--device", "sim", "--segment-bytes", "100G"],
            "--segment-bytes",
        ),
    ];
    for (args, says) in table {
        let (code, stderr) = hostile(args, &[]);
        assert_eq!(code, Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: `{says}` not in {stderr}");
        assert!(
            !stderr.contains("panicked") && !stderr.contains("memory allocation"),
            "{args:?}: {stderr}"
        );
    }
}

#[test]
fn extreme_but_valid_values_train() {
    for args in [
        &["--device", "cpu", "--batch", MAX][..],
        &["--device", "sim", "--sim-memory", "256M", "--batch", MAX][..],
        &[
            "--device",
            "cpu",
            "--warmup-steps",
            MAX,
            "--lr-schedule",
            "cosine",
        ][..],
    ] {
        let o = tiny(&[args, &["--epochs", "1"]].concat());
        assert!(o.status.success(), "{args:?}: {:?}", text(&o));
    }
}

#[test]
fn arena_sizes_the_arena_would_change_are_refused() {
    let sim = ["--device", "sim", "--sim-memory", "4G"];
    for value in ["0", "1", "4K", "100M", "100G"] {
        let (code, stderr) = hostile(&[&sim[..], &["--arena-bytes", value]].concat(), &[]);
        assert_eq!(code, Some(1), "{value}: {stderr}");
        assert!(
            stderr.contains("--arena-bytes") && stderr.contains("whole number of segments"),
            "{value}: {stderr}"
        );
    }
    let (code, stderr) = hostile(&sim, &[("ZMEM_ARENA_BYTES", "4K")]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("error: ZMEM_ARENA_BYTES 4.0 KiB"),
        "{stderr}"
    );
    let (code, stderr) = hostile(&[&sim[..], &["--arena-cap", "5G"]].concat(), &[]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("at most the device's memory"), "{stderr}");
    let (code, stderr) = hostile(&[&sim[..], &["--arena-bytes", "128M"]].concat(), &[]);
    assert_eq!(
        code,
        Some(0),
        "a whole number of segments is honoured: {stderr}"
    );
}

/// Issue 45: any environment variable that was not UTF-8 made every ztrain panic
/// (`std::env::vars()`), printing the value: the secret itself when that was the variable.
/// Now a variable ztrain does not read is ignored, and one it reads is named, never shown.
#[test]
fn an_environment_variable_that_is_not_utf8_is_named_never_shown_never_a_panic() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt as _;
    let bad = OsStr::from_bytes(b"s3cr3t\xff\xfe");
    let run = |extra: &[&str], env: &[(&str, &OsStr)]| {
        let mut c = Command::new(ztrain_binary());
        c.env_remove("ZMEM_ARENA_BYTES");
        for (k, v) in env {
            c.env(k, v);
        }
        let o = c
            .args(TINY)
            .args(["--epochs", "1"])
            .args(extra)
            .output()
            .expect("runs ztrain");
        (o.status.code(), text(&o).1)
    };
    let sim = ["--device", "sim", "--sim-memory", "256M"];
    let (code, stderr) = run(&sim, &[("ZTRAIN_TEST_JUNK", bad)]);
    assert_eq!(code, Some(0), "{stderr}");
    let (code, stderr) = run(&sim, &[("ZMEM_POISON", bad)]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("ZMEM_POISON") && stderr.contains("not valid UTF-8"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("s3cr3t") && !stderr.contains("panicked"),
        "{stderr}"
    );
    let rank1 = [
        ("RANK", OsStr::new("1")),
        ("WORLD_SIZE", OsStr::new("2")),
        ("LOCAL_RANK", OsStr::new("1")),
        ("MASTER_ADDR", OsStr::new("127.0.0.1")),
        ("MASTER_PORT", OsStr::new("9")),
        ("ZCOMM_SECRET", bad),
    ];
    let (code, stderr) = run(&sim, &rank1);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("ZCOMM_SECRET is not valid UTF-8"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("s3cr3t") && !stderr.contains("panicked"),
        "{stderr}"
    );
}
