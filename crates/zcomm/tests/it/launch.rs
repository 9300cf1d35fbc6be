//! The launcher: N ranks with the launcher variables; one failing rank takes every rank down
//! (the others do not run to their end) and the exit code names it; a stop request does too.

#[path = "launch/no_port.rs"]
mod no_port;
#[path = "launch/stops.rs"]
mod stops;

use std::ffi::OsString;
use std::time::{Duration, Instant};
use zcomm::launch::{LaunchSpec, RankEnd, launch, nccl_channel_setting, nccl_graph_mixing_setting};

fn sh(script: &str, ranks: usize) -> LaunchSpec {
    LaunchSpec {
        program: "sh".into(),
        args: vec![OsString::from("-c"), script.into()],
        ranks,
        grace: Duration::from_millis(300),
        peer_failure_code: Some(3),
        nccl_max_channels: None,
    }
}

#[test]
fn every_rank_gets_the_launcher_variables() {
    let dir = tempfile::tempdir().unwrap();
    let script = format!(
        "echo \"$RANK $WORLD_SIZE $LOCAL_RANK $NCCL_NVLS_ENABLE $NCCL_GRAPH_MIXING_SUPPORT ${{MASTER_ADDR:-none}} ${{MASTER_PORT:-none}} $ZCOMM_RENDEZVOUS_SOCKET\" > {}/$RANK",
        dir.path().display()
    );
    let out = launch(&sh(&script, 3), &|| None).unwrap();
    assert_eq!(out.failed, None);
    assert_eq!(out.exit_code(), 0);
    for r in 0..3 {
        let line = std::fs::read_to_string(dir.path().join(r.to_string())).unwrap();
        let f: Vec<&str> = line.split_whitespace().collect();
        // No TCP address: the ranks meet on a Unix socket (issue 45).
        assert_eq!(
            &f[..7],
            [
                &r.to_string(),
                "3",
                &r.to_string(),
                "0",
                "0",
                "none",
                "none"
            ]
        );
        assert!(f[7].ends_with("/rendezvous.sock"), "{line}");
    }
}

#[test]
fn a_failing_rank_takes_every_rank_down_and_is_named() {
    let start = Instant::now();
    let out = launch(
        // 4: a failure of its own (3 is the peer-failure status: a victim, see `stops`).
        &sh("if [ \"$RANK\" = 2 ]; then exit 4; fi; sleep 30", 3),
        &|| None,
    )
    .unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(out.failed, Some((2, RankEnd::Exited(4))));
    assert_eq!(out.exit_code(), 102);
    assert!(
        out.message().contains("rank 2 of 3 exited with status 4"),
        "{}",
        out.message()
    );
    // The sleeping ranks were killed when the grace ran out, not left to finish, and the
    // message says so for each.
    for r in [0, 1] {
        assert_eq!(out.ends[r], Some(RankEnd::TakenDown), "{:?}", out.ends);
        assert!(
            out.message().contains(&format!(
                "rank {r} was killed by the launcher when the grace ran out"
            )),
            "{}",
            out.message()
        );
    }
}

#[test]
fn a_rank_killed_by_a_signal_is_named() {
    let out = launch(
        &sh("if [ \"$RANK\" = 1 ]; then kill -9 $$; fi; sleep 30", 2),
        &|| None,
    )
    .unwrap();
    assert_eq!(out.failed, Some((1, RankEnd::Signalled(Some(9)))));
    assert_eq!(out.exit_code(), 101);
}

#[test]
fn a_stop_request_takes_every_rank_down() {
    let start = Instant::now();
    let asked = Instant::now() + Duration::from_millis(300);
    let out = launch(&sh("sleep 30", 2), &|| {
        (Instant::now() >= asked).then_some(15)
    })
    .unwrap();
    assert!(out.stopped && out.failed.is_none());
    // sh's `sleep` dies of the passed-on SIGTERM: the job's status is 143.
    assert_eq!(out.exit_code(), 143);
    assert!(start.elapsed() < Duration::from_secs(10));
}

/// A channel limit the spec asks for reaches every rank as `NCCL_MAX_NCHANNELS`; none asked
/// leaves the variable as the environment has it.
#[test]
fn ranks_get_the_nccl_channel_limit_the_spec_asks_for() {
    // Where this test's own environment sets a limit, the ranks inherit it (the user's word
    // wins, as the table below checks).
    let inherited = std::env::var("NCCL_MAX_NCHANNELS").ok();
    let user_set = inherited.is_some() || std::env::var_os("NCCL_MAX_CTAS").is_some();
    let dir = tempfile::tempdir().unwrap();
    let script = format!(
        "echo \"x${{NCCL_MAX_NCHANNELS}}\" > {}/$RANK",
        dir.path().display()
    );
    let unasked = format!("x{}", inherited.unwrap_or_default());
    for (asked, seen) in [
        (Some(8), if user_set { unasked.as_str() } else { "x8" }),
        (None, unasked.as_str()),
    ] {
        let mut spec = sh(&script, 2);
        spec.nccl_max_channels = asked;
        let out = launch(&spec, &|| None).unwrap();
        assert_eq!(out.exit_code(), 0);
        for r in 0..2 {
            let line = std::fs::read_to_string(dir.path().join(r.to_string())).unwrap();
            assert_eq!(line.trim(), seen, "rank {r}, asked {asked:?}");
        }
    }
}

/// The user's `NCCL_MAX_NCHANNELS` or `NCCL_MAX_CTAS` wins over the spec's limit.
#[rstest::rstest]
#[case::nothing_set(None, Some(8), Some(("NCCL_MAX_NCHANNELS", "8".to_string())))]
#[case::none_asked(None, None, None)]
#[case::user_channels(Some("NCCL_MAX_NCHANNELS"), Some(8), None)]
#[case::user_ctas(Some("NCCL_MAX_CTAS"), Some(8), None)]
#[case::other_variable(Some("NCCL_DEBUG"), Some(4), Some(("NCCL_MAX_NCHANNELS", "4".to_string())))]
fn the_users_channel_limit_wins(
    #[case] set: Option<&str>,
    #[case] asked: Option<u32>,
    #[case] expected: Option<(&str, String)>,
) {
    let env = |v: &str| (Some(v) == set).then(|| OsString::from("2"));
    assert_eq!(nccl_channel_setting(asked, &env), expected);
}

/// The ranks run without NCCL's graph-mixing ordering unless the user's environment sets it.
#[rstest::rstest]
#[case::nothing_set(None, Some(("NCCL_GRAPH_MIXING_SUPPORT", "0")))]
#[case::user_sets_it(Some("NCCL_GRAPH_MIXING_SUPPORT"), None)]
#[case::other_variable(Some("NCCL_DEBUG"), Some(("NCCL_GRAPH_MIXING_SUPPORT", "0")))]
fn graph_mixing_is_off_unless_the_user_says(
    #[case] set: Option<&str>,
    #[case] expected: Option<(&str, &str)>,
) {
    let env = |v: &str| (Some(v) == set).then(|| OsString::from("1"));
    assert_eq!(nccl_graph_mixing_setting(&env), expected);
}
