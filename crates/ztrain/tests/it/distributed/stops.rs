//! Issue 23: no rank outlives its launcher, and a signal to the launcher or to any one rank
//! stops the whole job after one same step: rank 0 writes the checkpoint, the job exits
//! 128 + the signal, every time, and no process is left (checked by the ranks' pids). A
//! Ctrl-C during the rendezvous wait is honoured at once.

use super::{finish, start_three_ranks};
use crate::common::{TINY, ztrain_binary};
use rstest::rstest;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn kill(signal: &str, pid: &str) {
    let ok = Command::new("kill")
        .args([&format!("-{signal}"), pid])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{signal} {pid}");
}

/// Whether `pid` is alive (a zombie waiting for its parent counts as gone).
fn alive(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let state = stat.rsplit_once(')').map(|(_, s)| s.trim_start());
        !state.is_some_and(|s| s.starts_with('Z') || s.starts_with('X'))
    })
}

/// Every one of `pids` is gone within 5 s.
pub(crate) fn assert_gone(pids: &[String]) {
    let until = Instant::now() + Duration::from_secs(5);
    while pids.iter().any(|p| alive(p)) {
        assert!(
            Instant::now() < until,
            "processes left behind: {:?}",
            pids.iter().filter(|p| alive(p)).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The step rank 0 says the job stopped after, and that its checkpoint is there.
fn stopped_after(dir: &std::path::Path, name: &str) -> u64 {
    let stdout = std::fs::read_to_string(dir.join("stdout")).unwrap();
    let line = stdout
        .lines()
        .find(|l| l.contains(&format!("stopped by {name} after step")))
        .unwrap_or_else(|| panic!("no stop line:\n{stdout}"));
    assert!(line.contains("checkpoint written to"), "{line}");
    let step = line
        .split("after step ")
        .nth(1)
        .and_then(|r| r.split(';').next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    let saved = ztrain::checkpoint::Checkpoint::load(&dir.join("ck.st")).unwrap();
    assert_eq!(
        saved.progress.step, step,
        "the checkpoint is the stop step's"
    );
    step
}

#[rstest]
#[case("INT", "SIGINT", 130)]
#[case("TERM", "SIGTERM", 143)]
fn a_signal_to_the_launcher_stops_every_rank_after_one_step_every_time(
    #[case] signal: &str,
    #[case] name: &str,
    #[case] code: i32,
) {
    for _ in 0..2 {
        let dir = tempfile::tempdir().unwrap();
        let (mut launcher, ranks) = start_three_ranks(dir.path(), "20");
        let at = Instant::now();
        kill(signal, &launcher.id().to_string());
        let (status, stderr) = finish(&mut launcher, at);
        assert_eq!(status.code(), Some(code), "{stderr}");
        assert!(
            stderr.contains(&format!("stopped by {name}: passed on to every rank")),
            "{stderr}"
        );
        for r in 0..3 {
            assert!(
                stderr.contains(&format!("rank {r} exited with status {code}")),
                "{stderr}"
            );
        }
        stopped_after(dir.path(), name);
        assert_gone(&ranks);
    }
}

#[rstest]
#[case(0, "INT", "SIGINT", 130)]
#[case(1, "INT", "SIGINT", 130)]
#[case(2, "TERM", "SIGTERM", 143)]
fn a_signal_to_one_rank_stops_the_job_and_names_that_rank(
    #[case] rank: usize,
    #[case] signal: &str,
    #[case] name: &str,
    #[case] code: i32,
) {
    let dir = tempfile::tempdir().unwrap();
    let (mut launcher, ranks) = start_three_ranks(dir.path(), "20");
    let at = Instant::now();
    kill(signal, &ranks[rank]);
    let (status, stderr) = finish(&mut launcher, at);
    assert_eq!(status.code(), Some(code), "{stderr}");
    assert!(
        stderr.contains(&format!("{name} reached rank {rank} only")),
        "{stderr}"
    );
    assert!(!stderr.contains("error:"), "{stderr}");
    stopped_after(dir.path(), name);
    assert_gone(&ranks);
}

#[test]
fn ranks_die_with_a_launcher_that_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let (mut launcher, ranks) = start_three_ranks(dir.path(), "20");
    kill("KILL", &launcher.id().to_string());
    let _ = launcher.wait();
    assert_gone(&ranks);
}

#[test]
fn ctrl_c_during_the_rendezvous_is_honoured_at_once() {
    // Rank 0 of 2 whose rank 1 never comes: it waits (up to --comm-timeout, 60 s) until the
    // signal.
    let port = zcomm::launch::free_port().unwrap();
    let args: Vec<&str> = TINY
        .iter()
        .copied()
        .chain(["--device", "sim", "--comm-timeout", "60"])
        .collect();
    let mut rank0 = Command::new(ztrain_binary())
        .args(&args)
        .envs([
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_RANK", "0"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", &port.to_string()),
            ("ZCOMM_SECRET", "0123456789abcdef0123456789abcdef"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Listening: the rendezvous wait has begun.
    let until = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < until, "rank 0 never listened");
        std::thread::sleep(Duration::from_millis(20));
    }
    let at = Instant::now();
    kill("INT", &rank0.id().to_string());
    let (status, stderr) = finish(&mut rank0, at);
    assert!(at.elapsed() < Duration::from_secs(2), "{:?}", at.elapsed());
    assert_eq!(status.code(), Some(130), "{stderr}");
    // Said by the rendezvous's own stop or the watcher of the time before training, whichever
    // comes first.
    assert!(
        stderr.contains("stopped by SIGINT") && stderr.contains("nothing was trained"),
        "{stderr}"
    );
}

#[test]
fn data_from_a_pipe_with_gpus_is_refused_before_any_rank_starts() {
    use std::io::Write as _;
    let args: Vec<&str> = TINY
        .iter()
        .copied()
        .chain(["--device", "sim", "--gpus", "2", "--data", "/dev/stdin"])
        .collect();
    let mut child = Command::new(ztrain_binary())
        .args(&args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Before: each rank read part of the stream (a false parse error in one of them).
    let mut stdin = child.stdin.take().unwrap();
    let _ = stdin.write_all(b"a,b,label\n1,2,0\n");
    drop(stdin);
    let o = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("is not a regular file (a pipe?)"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("ztrain rank") && !stderr.contains("rank 0"),
        "a rank started: {stderr}"
    );
}
