//! Item 11: SIGINT/SIGTERM finish the step, write the checkpoint, print the summary and exit
//! 128 + the signal; a second signal exits at once; a closed stdout never stops training.

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};

use rstest::rstest;

use crate::common::{TINY, path_str, ztrain_binary};
use ztrain::checkpoint::Checkpoint;

fn spawn(args: &[&str]) -> Child {
    Command::new(ztrain_binary())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ztrain")
}

fn kill(child: &Child, signal: &str) {
    let sent = Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(sent.success());
}

/// Reads stdout lines until one starts with `prefix`; returns the lines read.
fn read_until(lines: &mut impl Iterator<Item = String>, prefix: &str) -> Vec<String> {
    let mut seen = Vec::new();
    for l in lines.by_ref() {
        let hit = l.starts_with(prefix);
        seen.push(l);
        if hit {
            return seen;
        }
    }
    panic!("no line starting with `{prefix}`: {seen:?}");
}

#[rstest]
#[case("INT", "SIGINT", 130)]
#[case("TERM", "SIGTERM", 143)]
fn a_signal_finishes_the_step_writes_the_checkpoint_and_exits_128_plus_it(
    #[case] signal: &str,
    #[case] name: &str,
    #[case] code: i32,
) {
    let dir = tempfile::tempdir().expect("tempdir");
    let ck = dir.path().join("ck.st");
    let args: Vec<&str> = TINY
        .iter()
        .copied()
        .chain([
            "--device",
            "cpu",
            "--epochs",
            "100000",
            "--checkpoint",
            path_str(&ck),
        ])
        .collect();
    let mut child = spawn(&args);
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines().map_while(Result::ok);
    read_until(&mut lines, "epoch 1/");
    kill(&child, signal);
    let rest: Vec<String> = lines.collect();
    let status = child.wait().expect("wait");
    assert_eq!(status.code(), Some(code), "{rest:?}");
    let stopped = rest
        .iter()
        .find(|l| l.contains(&format!("stopped by {name} after step")))
        .unwrap_or_else(|| panic!("no stop line: {rest:?}"));
    assert!(stopped.contains("checkpoint written to"), "{stopped}");
    assert!(rest.iter().any(|l| l.starts_with("summary: ")), "{rest:?}");
    let step: u64 = stopped
        .split("after step ")
        .nth(1)
        .and_then(|r| r.split(';').next())
        .and_then(|n| n.parse().ok())
        .expect("step number");
    let saved = Checkpoint::load(&ck).expect("checkpoint written");
    assert_eq!(saved.progress.step, step);
    assert!(step >= 10, "stopped after the first epoch, at {step}");
}

#[test]
fn a_second_signal_exits_at_once() {
    // A step long enough (the default model size, 1,600 samples one after the other: seconds
    // even in a release build) that the second signal arrives while the first one's step is
    // still running; the immediate exit makes its length cost nothing.
    let dir = tempfile::tempdir().expect("tempdir");
    let ck = dir.path().join("ck.st");
    let mut child = spawn(&[
        "--device",
        "cpu",
        "--samples",
        "2000",
        "--batch",
        "1600",
        "--schedule",
        "per-sample",
        "--checkpoint",
        path_str(&ck),
    ]);
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines().map_while(Result::ok);
    read_until(&mut lines, "ztrain: XAsset");
    kill(&child, "INT");
    std::thread::sleep(std::time::Duration::from_millis(300));
    kill(&child, "INT");
    let rest: Vec<String> = lines.collect();
    let status = child.wait().expect("wait");
    assert_eq!(status.code(), Some(130), "{rest:?}");
    assert!(
        !rest.iter().any(|l| l.starts_with("summary:")),
        "the second signal did not wait for the step: {rest:?}"
    );
    assert!(
        !ck.exists(),
        "no checkpoint half-written by the immediate exit"
    );
}

#[test]
fn a_closed_stdout_stops_the_printing_not_the_training() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ck = dir.path().join("ck.st");
    let args: Vec<&str> = TINY
        .iter()
        .copied()
        .chain([
            "--device",
            "cpu",
            "--epochs",
            "6",
            "--checkpoint",
            path_str(&ck),
        ])
        .collect();
    let mut child = spawn(&args);
    let stdout = child.stdout.take().expect("stdout");
    {
        // `ztrain … | head -3`
        let mut lines = BufReader::new(stdout).lines().map_while(Result::ok);
        let first: Vec<String> = lines.by_ref().take(3).collect();
        assert_eq!(first.len(), 3);
    }
    let o = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("error:"), "{stderr}");
    let saved = Checkpoint::load(&ck).expect("checkpoint");
    assert_eq!(saved.progress.epoch, 6, "every epoch trained and saved");
}
