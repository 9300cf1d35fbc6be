//! Issue 44: comm.sh's scenarios on simulated devices, in CI. A 2-rank job (`--gpus 2`, as
//! comm.sh runs it) whose rank 1 is killed (SIGKILL) or stopped (SIGSTOP) once the first epoch
//! is done (during the next epoch's steps, at the next validation, or while checkpoints are
//! written: the moment read off the job's output, never a fixed time; a run that ended before
//! the signal fails), in both last-bucket modes, captured and eager. The simulator models the peer as a
//! GPU does: a collective whose peer stopped or died never completes until the communicator is
//! aborted, and the stream behind it never drains. Every time, rank 0 stops with its typed
//! error and exits on its own with status 3 (never killed by the launcher when its grace ran
//! out), the launcher names rank 1, and no process is left.

use super::stops::assert_gone;
use crate::common::{TINY, ztrain_binary};
use rstest::rstest;
use std::process::Command;
use std::time::{Duration, Instant};

/// Where rank 1 is signalled, as comm.sh's phases: the extra options and the line (in the
/// job's stderr, after the first epoch's line) that says the phase is under way.
fn phase(name: &str, dir: &std::path::Path) -> (Vec<String>, Option<&'static str>) {
    match name {
        // Epochs of 100 steps read back once (`--readback-every 100`): the signal lands in the
        // first steps of the second epoch, and the host queues the rest of it behind a
        // collective waiting for a dead peer, past the stream's queue (deterministically:
        // about 1,000 operations, a few dozen steps).
        "train" => (
            ["--samples", "400", "--readback-every", "100"]
                .map(String::from)
                .to_vec(),
            None,
        ),
        // The second epoch's validation.
        "eval" => (
            ["--validate-fraction", "0.5", "--log", "info"]
                .map(String::from)
                .to_vec(),
            Some("zgrad.trainer.eval"),
        ),
        // Every step writes a checkpoint: the signal lands while one is written or its step
        // runs.
        _ => (
            vec![
                "--checkpoint".into(),
                dir.join("ck.st").display().to_string(),
                "--checkpoint-every".into(),
                "1".into(),
                "--log".into(),
                "info".into(),
            ],
            Some("ztrain.checkpoint.save"),
        ),
    }
}

/// Waits (bounded) until `done` holds for the job's output, while the launcher runs; fails if
/// the run ended first (before the signal: the cell would pass by accident).
fn wait_for(launcher: &mut std::process::Child, what: &str, done: impl Fn() -> bool) {
    let until = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(
            Instant::now() < until,
            "no {what}: the run did not get there"
        );
        assert!(
            launcher.try_wait().unwrap().is_none(),
            "the run ended before {what}, before the signal"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts a long 2-rank job with `extra` and waits (bounded) until rank 0 printed the first
/// epoch's line and then, if `trigger` is given, a stderr line holding it; the launcher and
/// its children, rank 0 and 1. Both outputs go to files (`dir`), so no pipe fills.
fn start_two_ranks(
    dir: &std::path::Path,
    extra: &[String],
    trigger: Option<&str>,
) -> (std::process::Child, Vec<String>) {
    let mut args: Vec<String> = TINY.iter().map(|a| (*a).to_string()).collect();
    // Epochs of 50 steps, longer than a read-back window, as comm.sh's run (256 steps an
    // epoch on the GPU): the host queues steps ahead of a collective waiting for a dead peer
    // until the stream's queue is full (zdevice's `SimConfig::launch_queue_depth`).
    let batch = args
        .iter()
        .position(|a| a == "--batch")
        .expect("TINY sets --batch")
        + 1;
    args[batch] = "4".into();
    args.extend(
        [
            "--epochs",
            "500",
            "--device",
            "sim",
            "--gpus",
            "2",
            "--comm-timeout",
            "3",
        ]
        .map(String::from),
    );
    args.extend(extra.iter().cloned());
    let (stdout, stderr) = (dir.join("stdout"), dir.join("stderr"));
    let mut launcher = Command::new(ztrain_binary())
        .args(&args)
        .stdout(std::fs::File::create(&stdout).unwrap())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    let pid = launcher.id();
    let read = |p: &std::path::Path| std::fs::read_to_string(p).unwrap_or_default();
    wait_for(&mut launcher, "first epoch", || {
        read(&stdout).lines().any(|l| l.starts_with("epoch 1/"))
    });
    if let Some(trigger) = trigger {
        // Only lines after the first epoch's count: stderr's length now is the mark.
        let mark = read(&stderr).len();
        wait_for(&mut launcher, trigger, || {
            read(&stderr)
                .get(mark..)
                .is_some_and(|s| s.contains(trigger))
        });
    }
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap();
    let ranks: Vec<String> = children.split_whitespace().map(String::from).collect();
    assert_eq!(ranks.len(), 2, "{children}");
    (launcher, ranks)
}

/// Waits (bounded: the launcher's grace and a margin) for the job to end; its status and
/// stderr.
fn finish(
    launcher: &mut std::process::Child,
    from: Instant,
    dir: &std::path::Path,
) -> (std::process::ExitStatus, String) {
    let status = loop {
        if let Some(s) = launcher.try_wait().unwrap() {
            break s;
        }
        assert!(
            from.elapsed() < Duration::from_secs(30),
            "the job did not stop"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    (status, std::fs::read_to_string(dir.join("stderr")).unwrap())
}

#[rstest]
fn a_peer_killed_or_stopped_after_the_first_epoch_never_hangs_the_job(
    #[values("KILL", "STOP")] signal: &str,
    #[values("peer", "nccl")] last_bucket: &str,
    #[values(true, false)] captured: bool,
    #[values("train", "eval", "checkpoint")] at: &str,
) {
    let dir = tempfile::tempdir().unwrap();
    let (mut extra, trigger) = phase(at, dir.path());
    extra.extend(["--last-bucket".into(), last_bucket.into()]);
    if captured {
        extra.push("--capture".into());
    }
    let (mut launcher, ranks) = start_two_ranks(dir.path(), &extra, trigger);
    let sent_at = Instant::now();
    let sent = Command::new("kill")
        .args([&format!("-{signal}"), &ranks[1]])
        .status()
        .unwrap()
        .success();
    assert!(sent, "kill -{signal} {}", ranks[1]);
    let (status, stderr) = finish(&mut launcher, sent_at, dir.path());
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
    // Issue 44, the GPU's worst case: a peer killed while replayed graphs wait for it. The
    // host hears nothing, its launches block behind the wait, which the abort does not end
    // (the simulator models it so, `zcomm::sim`); rank 0's last resort ends it, naming rank 1.
    // On a loaded machine the read-back's own deadline can end that wait first (CI saw it):
    // its error names rank 1 too ("rank 1 did not answer").
    if signal == "KILL" && captured && at == "train" {
        assert!(
            stderr.contains("ztrain rank 0 of 2: error: rank 0: rank 1 stopped answering")
                || stderr.contains("rank 0: a wait on the device passed its deadline behind the job's collectives: rank 1 did not answer"),
            "rank 0's last resort did not name rank 1:\n{stderr}"
        );
    }
    // Issue 44: rank 0's own error names the peer that did not answer, as the launcher does,
    // in every cell: whichever wait ended first (a collective's, the watchdog's, the last
    // resort's, or a read-back's on the device: with rank 1 killed under a replayed graph, an
    // evaluation's or a checkpoint's read-back passed its deadline, naming no peer, before
    // the fix).
    let error: Vec<&str> = stderr
        .lines()
        .skip_while(|l| !l.contains("ztrain rank 0 of 2: error: "))
        .take_while(|l| l.contains("ztrain rank 0 of 2: error: ") || l.starts_with("  caused by: "))
        .collect();
    let error = error.join("\n");
    let named = match signal {
        // A stopped peer never closes its connection: it did not answer.
        "STOP" => &["rank 1 did not answer"][..],
        _ => &[
            "rank 1 did not answer",
            "rank 1 vanished",
            "rank 1 stopped answering",
        ],
    };
    assert!(
        named.iter().any(|n| error.contains(n)),
        "rank 0's error does not name rank 1: {error}\n{stderr}"
    );
    assert_gone(&ranks);
}

/// Issue 44 item 2: a stop signal to the launcher holds while a rank is stuck. Rank 1 is
/// stopped (SIGSTOP) once the first epoch is done, so rank 0 blocks in a wait for it; then the
/// launcher gets SIGTERM. It passes the signal on; rank 0, which cannot finish its step, ends
/// on its own at its deadline with its typed error naming rank 1 (exit 3, not killed by the
/// launcher), the stopped rank 1 is killed when the grace runs out, the job exits 143 (the
/// signal it was given) and no process is left.
#[test]
fn a_stop_signal_to_the_launcher_holds_while_a_rank_is_stuck() {
    let dir = tempfile::tempdir().unwrap();
    let (extra, trigger) = phase("train", dir.path());
    let (mut launcher, ranks) = start_two_ranks(dir.path(), &extra, trigger);
    let stop = |sig: &str, pid: &str| {
        let sent = Command::new("kill")
            .args([&format!("-{sig}"), pid])
            .status()
            .unwrap()
            .success();
        assert!(sent, "kill -{sig} {pid}");
    };
    stop("STOP", &ranks[1]);
    let sent_at = Instant::now();
    stop("TERM", &launcher.id().to_string());
    let (status, stderr) = finish(&mut launcher, sent_at, dir.path());
    assert_eq!(status.code(), Some(143), "{stderr}");
    assert!(
        stderr.contains("ztrain rank 0 of 2: error: "),
        "rank 0's typed error missing:\n{stderr}"
    );
    assert!(
        stderr.contains("rank 1 did not answer"),
        "rank 0's error does not name rank 1:\n{stderr}"
    );
    assert!(
        !stderr.contains("rank 0 was killed"),
        "rank 0 did not end on its own:\n{stderr}"
    );
    assert_gone(&ranks);
}
