//! The launcher variables: none set is one process; a job of several ranks needs all five,
//! and each malformed one is a typed `BadEnv` naming it.

#[path = "env/secret.rs"]
mod secret;

use proptest::prelude::*;
use rstest::rstest;
use std::collections::HashMap;
use zcomm::{CommError, LaunchEnv, Master, RankInfo};

fn env(vars: &[(&str, &str)]) -> Result<LaunchEnv, CommError> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect();
    LaunchEnv::from_vars(|k| map.get(k).cloned())
}

const FULL: [(&str, &str); 5] = [
    ("RANK", "2"),
    ("WORLD_SIZE", "4"),
    ("LOCAL_RANK", "2"),
    ("MASTER_ADDR", "10.0.0.7"),
    ("MASTER_PORT", "29500"),
];

#[test]
fn nothing_set_is_a_single_process() {
    assert_eq!(env(&[]).unwrap(), LaunchEnv::SINGLE);
}

#[test]
fn all_five_give_the_rank_and_the_master() {
    let e = env(&FULL).unwrap();
    assert_eq!(
        e.info,
        RankInfo {
            rank: 2,
            world: 4,
            local_rank: 2
        }
    );
    let m = e.master.unwrap();
    assert_eq!(
        m,
        Master::Tcp {
            host: "10.0.0.7".into(),
            port: 29500
        }
    );
    assert_eq!(m.address(), "10.0.0.7:29500");
}

#[test]
fn one_rank_needs_no_master() {
    let e = env(&[("RANK", "0"), ("WORLD_SIZE", "1")]).unwrap();
    assert_eq!(e, LaunchEnv::SINGLE);
}

#[rstest]
#[case::missing_world("WORLD_SIZE", None, "WORLD_SIZE")]
#[case::missing_rank("RANK", None, "RANK")]
#[case::missing_local_rank("LOCAL_RANK", None, "LOCAL_RANK")]
#[case::missing_addr("MASTER_ADDR", None, "MASTER_ADDR")]
#[case::missing_port("MASTER_PORT", None, "MASTER_PORT")]
#[case::rank_not_a_number("RANK", Some("two"), "RANK")]
#[case::negative_rank("RANK", Some("-1"), "RANK")]
#[case::rank_at_world("RANK", Some("4"), "RANK")]
#[case::world_zero("WORLD_SIZE", Some("0"), "WORLD_SIZE")]
#[case::world_not_a_number("WORLD_SIZE", Some("4.0"), "WORLD_SIZE")]
#[case::local_rank_above_rank("LOCAL_RANK", Some("3"), "LOCAL_RANK")]
#[case::port_zero("MASTER_PORT", Some("0"), "MASTER_PORT")]
#[case::port_too_large("MASTER_PORT", Some("70000"), "MASTER_PORT")]
#[case::empty_addr("MASTER_ADDR", Some(" "), "MASTER_ADDR")]
fn a_bad_variable_is_named(#[case] var: &str, #[case] value: Option<&str>, #[case] named: &str) {
    let vars: Vec<(&str, &str)> = FULL
        .iter()
        .filter(|(k, _)| *k != var)
        .copied()
        .chain(value.map(|v| (var, v)))
        .collect();
    match env(&vars) {
        Err(CommError::BadEnv { var, .. }) => assert_eq!(var, named),
        other => panic!("{var}={value:?}: expected BadEnv, got {other:?}"),
    }
}

#[test]
fn a_world_above_the_limit_is_refused_not_cut() {
    for world in [
        "65537",
        "4294967298",
        "18446744073709551615",
        "18446744073709551616",
    ] {
        let vars: Vec<(&str, &str)> = FULL
            .iter()
            .map(|&(k, v)| {
                if k == "WORLD_SIZE" {
                    (k, world)
                } else {
                    (k, v)
                }
            })
            .collect();
        match env(&vars) {
            Err(CommError::BadEnv { var, .. }) => assert_eq!(var, "WORLD_SIZE", "{world}"),
            other => panic!("WORLD_SIZE={world}: {other:?}"),
        }
    }
}

proptest::proptest! {
    /// Whatever the launcher variables hold, reading them never panics, and what it accepts
    /// is a coherent job: 1 <= world <= MAX_WORLD_SIZE, rank < world, local rank <= rank,
    /// a port above 0.
    #[test]
    fn any_launcher_variables_give_a_coherent_job_or_a_typed_error(
        values in proptest::collection::vec(
            proptest::option::of(proptest::prop_oneof![
                "[0-9]{1,25}",
                "-?[0-9]{1,5}",
                "\\PC{0,12}",
                proptest::num::u64::ANY.prop_map(|v| v.to_string()),
            ]),
            5,
        )
    ) {
        let names = zcomm::env::VARS;
        let map: HashMap<&str, String> = names
            .iter()
            .zip(&values)
            .filter_map(|(k, v)| v.clone().map(|v| (*k, v)))
            .collect();
        match LaunchEnv::from_vars(|k| map.get(k).cloned()) {
            Ok(e) => {
                prop_assert!(e.info.world >= 1 && e.info.world <= zcomm::env::MAX_WORLD_SIZE);
                prop_assert!(e.info.rank < e.info.world);
                prop_assert!(e.info.world == 1 || e.info.local_rank <= e.info.rank);
                if let Some(m) = e.master {
                    let tcp_port_set = matches!(m, zcomm::Master::Tcp { port, .. } if port > 0);
                    prop_assert!(tcp_port_set);
                }
            }
            Err(CommError::BadEnv { .. }) => {}
            Err(other) => prop_assert!(false, "not a BadEnv: {other:?}"),
        }
    }
}
