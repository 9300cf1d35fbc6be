//! Issue 44: comm.sh's scenarios on simulated devices, in CI. A 2-rank job (`--gpus 2`, as
//! comm.sh runs it) whose rank 1 is killed (SIGKILL) or stopped (SIGSTOP) once the first epoch
//! is done, in both last-bucket modes, captured and eager. The simulator models the peer as a
//! GPU does: a collective whose peer stopped or died never completes until the communicator is
//! aborted, and the stream behind it never drains. Every time, rank 0 stops with its typed
//! error and exits on its own with status 3 (never killed by the launcher when its grace ran
//! out), the launcher names rank 1, and no process is left.

use super::finish;
use super::stops::assert_gone;
use crate::common::{TINY, ztrain_binary};
use rstest::rstest;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Starts a long 2-rank job with `extra` and waits (bounded) until rank 0 printed the first
/// epoch's line; the launcher and its children, rank 0 and 1.
fn start_two_ranks(dir: &std::path::Path, extra: &[&str]) -> (std::process::Child, Vec<String>) {
    let mut args: Vec<&str> = TINY.to_vec();
    args.extend([
        "--epochs",
        "500",
        "--device",
        "sim",
        "--gpus",
        "2",
        "--comm-timeout",
        "3",
    ]);
    args.extend(extra);
    let stdout = dir.join("stdout");
    let mut launcher = Command::new(ztrain_binary())
        .args(&args)
        .stdout(std::fs::File::create(&stdout).unwrap())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = launcher.id();
    let until = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(&stdout)
        .is_ok_and(|s| s.lines().any(|l| l.starts_with("epoch 1/")))
    {
        assert!(Instant::now() < until, "no epoch: the run did not start");
        assert!(
            launcher.try_wait().unwrap().is_none(),
            "the run ended before the signal"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap();
    let ranks: Vec<String> = children.split_whitespace().map(String::from).collect();
    assert_eq!(ranks.len(), 2, "{children}");
    (launcher, ranks)
}

#[rstest]
fn a_peer_killed_or_stopped_after_the_first_epoch_never_hangs_the_job(
    #[values("KILL", "STOP")] signal: &str,
    #[values("peer", "nccl")] last_bucket: &str,
    #[values(true, false)] captured: bool,
) {
    let dir = tempfile::tempdir().unwrap();
    let mut extra = vec!["--last-bucket", last_bucket];
    if captured {
        extra.push("--capture");
    }
    let (mut launcher, ranks) = start_two_ranks(dir.path(), &extra);
    let at = Instant::now();
    let sent = Command::new("kill")
        .args([&format!("-{signal}"), &ranks[1]])
        .status()
        .unwrap()
        .success();
    assert!(sent, "kill -{signal} {}", ranks[1]);
    let (status, stderr) = finish(&mut launcher, at);
    assert_eq!(
        status.code(),
        Some(101),
        "the launcher names rank 1:\n{stderr}"
    );
    let named = match signal {
        "KILL" => "rank 1 of 2 was killed by signal 9",
        _ => "rank 1 of 2 was stopped (SIGSTOP or a debugger)",
    };
    assert!(stderr.contains(named), "{stderr}");
    assert!(
        stderr.contains("ztrain rank 0 of 2: error: "),
        "rank 0's typed error missing:\n{stderr}"
    );
    assert!(
        stderr.contains("rank 0 exited with status 3"),
        "rank 0 did not exit on its own with status 3:\n{stderr}"
    );
    // Issue 44: rank 0's own error names the peer that did not answer, as the launcher does.
    if signal == "STOP" {
        // The error line and its causes.
        let error: Vec<&str> = stderr
            .lines()
            .skip_while(|l| !l.contains("ztrain rank 0 of 2: error: "))
            .take_while(|l| {
                l.contains("ztrain rank 0 of 2: error: ") || l.starts_with("  caused by: ")
            })
            .collect();
        let error = error.join("\n");
        assert!(
            error.contains("rank 1 did not answer within"),
            "rank 0's error does not name rank 1: {error}\n{stderr}"
        );
    }
    assert_gone(&ranks);
}
