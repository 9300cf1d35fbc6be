//! `ztrain` as a data-parallel job on simulated devices, ranks as processes: `--gpus 2` end to
//! end gives the numbers of one process; a rank killed with SIGKILL mid-run stops every other
//! rank with a typed error within the deadline and the launcher's exit code names it; a rank
//! that stalls (SIGSTOP) times the others out, each exiting on its own with status 3; bad
//! launcher variables are typed errors; a checkpoint records the number of ranks (resume with
//! the same number is bitwise, with another refused).

use crate::common;
#[path = "distributed/peer_faults.rs"]
mod peer_faults;
#[path = "distributed/stops.rs"]
mod stops;

use common::{
    TINY, path_str, resume_matches_uninterrupted, text, tiny, ztrain_binary, ztrain_with_env,
};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn summary(stdout: &str) -> String {
    let lines: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("summary:"))
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "one summary (rank 0 alone prints):\n{stdout}"
    );
    // "summary: 20 steps in 4.6 s; train loss ...; validation ...; peak ...": the numbers.
    // The throughput ("N samples trained at R samples/s") is a timing: left out.
    lines[0]
        .split("; ")
        .skip(1)
        .filter(|part| !part.contains("samples/s"))
        .take(2)
        .collect::<Vec<_>>()
        .join("; ")
}

#[test]
fn sim_gpus_2_end_to_end_gives_the_numbers_of_one_process() {
    for extra in [
        &["--device", "sim"][..],
        &["--device", "sim", "--capture", "--schedule", "per-sample"],
    ] {
        let one = tiny(extra);
        assert!(one.status.success(), "{:?}", text(&one));
        let two = tiny(&[extra, &["--gpus", "2"]].concat());
        let (stdout, stderr) = text(&two);
        assert!(two.status.success(), "{stdout}\n{stderr}");
        assert!(stdout.contains("data-parallel job of 2 ranks"), "{stdout}");
        assert_eq!(summary(&stdout), summary(&text(&one).0), "{extra:?}");
    }
}

#[test]
fn resume_with_the_same_ranks_is_bitwise_and_with_others_refused() {
    resume_matches_uninterrupted(&["--device", "sim", "--gpus", "2"], "3");
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck.st");
    let o = tiny(&[
        "--device",
        "sim",
        "--gpus",
        "2",
        "--checkpoint",
        path_str(&ck),
        "--stop-after",
        "2",
    ]);
    assert!(o.status.success(), "{:?}", text(&o));
    for gpus in ["1", "3"] {
        let o = tiny(&["--device", "sim", "--gpus", gpus, "--resume", path_str(&ck)]);
        let (_, stderr) = text(&o);
        assert!(!o.status.success());
        assert!(
            stderr.contains("written by a job of 2 rank(s)"),
            "--gpus {gpus}: {stderr}"
        );
    }
}

#[test]
fn bad_launcher_variables_are_typed_errors() {
    let base = [
        ("WORLD_SIZE", "2"),
        ("LOCAL_RANK", "0"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29511"),
    ];
    for (rank, needle) in [
        ("2", "RANK=\"2\": must be below WORLD_SIZE=2"),
        ("one", "RANK=\"one\""),
    ] {
        let env: Vec<(&str, &str)> = base.iter().copied().chain([("RANK", rank)]).collect();
        let args: Vec<&str> = TINY.iter().copied().chain(["--device", "sim"]).collect();
        let o = ztrain_with_env(&args, &env);
        let (_, stderr) = text(&o);
        assert_eq!(o.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(needle), "{stderr}");
    }
}

/// Starts a long 3-rank job on simulated devices (TINY's sizes, checkpointed every step) with
/// `--comm-timeout comm_timeout` and waits until it trains; returns the launcher and its
/// children, rank 0, 1, 2.
pub(crate) fn start_three_ranks(
    dir: &std::path::Path,
    comm_timeout: &str,
) -> (std::process::Child, Vec<String>) {
    let ck = dir.join("ck.st");
    let mut args: Vec<&str> = TINY.to_vec();
    args.extend([
        "--epochs",
        "200",
        "--device",
        "sim",
        "--gpus",
        "3",
        "--comm-timeout",
        comm_timeout,
    ]);
    args.extend(["--checkpoint", path_str(&ck), "--checkpoint-every", "1"]);
    let mut launcher = Command::new(ztrain_binary())
        .args(&args)
        .stdout(std::fs::File::create(dir.join("stdout")).unwrap())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = launcher.id();
    let until = Instant::now() + Duration::from_secs(60);
    while !ck.exists() {
        assert!(
            Instant::now() < until,
            "no checkpoint: the run did not start"
        );
        assert!(
            launcher.try_wait().unwrap().is_none(),
            "the launcher ended early"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The launcher's children in the order it started them: rank 0, 1, 2.
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap();
    let ranks: Vec<String> = children.split_whitespace().map(String::from).collect();
    assert_eq!(ranks.len(), 3, "{children}");
    (launcher, ranks)
}

/// Waits (bounded) for the launcher to end; its status and stderr.
pub(crate) fn finish(
    launcher: &mut std::process::Child,
    from: Instant,
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
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut launcher.stderr.take().unwrap(), &mut stderr).unwrap();
    (status, stderr)
}

#[test]
fn a_rank_killed_mid_run_stops_the_others_and_the_launcher_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let (mut launcher, ranks) = start_three_ranks(dir.path(), "5");
    let killed_at = Instant::now();
    assert!(
        Command::new("kill")
            .args(["-9", &ranks[1]])
            .status()
            .unwrap()
            .success()
    );
    let (status, stderr) = finish(&mut launcher, killed_at);
    assert_eq!(status.code(), Some(101), "{stderr}");
    assert!(
        stderr.contains("rank 1 of 3 was killed by signal 9"),
        "{stderr}"
    );
    // Ranks 0 and 2 stopped on their own with the typed error, within the deadline (5 s; the
    // launcher would have killed them only after 7 s).
    assert!(
        killed_at.elapsed() < Duration::from_secs(7),
        "{:?}",
        killed_at.elapsed()
    );
    for r in [0, 2] {
        let named = stderr.lines().any(|l| {
            l.contains(&format!("rank {r}: ")) && l.contains(" of step ") && l.contains("rank 1")
        });
        assert!(named, "rank {r}'s error missing:\n{stderr}");
        // Its final line names it, and it exited on its own with the peer-failure status.
        assert!(
            stderr.contains(&format!("ztrain rank {r} of 3: error: ")),
            "rank {r}'s final error line missing:\n{stderr}"
        );
        assert!(
            stderr.contains(&format!("rank {r} exited with status 3")),
            "rank {r} did not exit on its own with status 3:\n{stderr}"
        );
    }
}

/// A rank that stalls (SIGSTOP: alive, its connections open, answering nothing) holds up no
/// one: the others' collectives end at --comm-timeout with typed errors naming themselves and
/// the step, each exits on its own with the peer-failure status 3 (not killed by the
/// launcher when its grace ran out), and the launcher names the stalled rank (issue 23: it
/// named a healthy one, 100 or 102).
#[test]
fn a_rank_that_stalls_mid_run_times_the_others_out_and_is_the_one_named() {
    let dir = tempfile::tempdir().unwrap();
    let (mut launcher, ranks) = start_three_ranks(dir.path(), "2");
    let stopped_at = Instant::now();
    assert!(
        Command::new("kill")
            .args(["-STOP", &ranks[1]])
            .status()
            .unwrap()
            .success()
    );
    let (status, stderr) = finish(&mut launcher, stopped_at);
    assert_eq!(status.code(), Some(101), "{stderr}");
    assert!(
        stderr.contains("rank 1 of 3 was stopped (SIGSTOP or a debugger) and answered no one"),
        "{stderr}"
    );
    for r in [0, 2] {
        let head = format!("ztrain rank {r} of 3: error: ");
        let Some(line) = stderr.lines().find(|l| l.starts_with(&head)) else {
            panic!("rank {r}'s final error line missing:\n{stderr}");
        };
        // Rank 0, which waited for rank 1, names it (issue 44); rank 2 hears of it from rank 0.
        let cause = match r {
            0 => "rank 0: rank 1 did not answer within ".to_string(),
            _ => format!("rank {r}: all_reduce of step "),
        };
        // A stall that lands in a step ends it (`step N failed ...`, caused by the collective's
        // error); one that lands between steps (the epoch's evaluation or checkpoint, which a
        // loaded machine makes longer: CI saw it) ends with that typed error itself, which
        // names the rank and the step too.
        let said = &line[head.len()..];
        let in_step = said.starts_with("step ") && stderr.contains(&format!("caused by: {cause}"));
        assert!(
            in_step || said.starts_with(&cause),
            "rank {r}'s typed error missing:\n{stderr}"
        );
        assert!(
            stderr.contains(&format!("rank {r} exited with status 3")),
            "rank {r} did not exit on its own with status 3:\n{stderr}"
        );
    }
    stops::assert_gone(&ranks);
}
