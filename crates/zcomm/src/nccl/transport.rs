//! Which of NCCL's transports a job's ranks move data over, from what is known before they
//! join (issue 44, item 3): NCCL's own settings and the launcher's variables.
//!
//! On 2 H200s with `NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1` (NCCL's socket
//! transport, as between hosts) a captured step never completed (the watchdog ended the run at
//! step 34) while eager steps trained at 49,290 samples/s. The peer-memory tail needs
//! peer-to-peer mapping; NCCL's captured collectives over its network transport hung. So:
//! - the tail declines when NCCL may not use peer-to-peer or shared memory
//!   ([`peer_memory_declined`]; the ranks then also find out whether they share a host and can
//!   map each other's memory when they agree on it: `tail.rs`);
//! - the application runs its steps eagerly when [`transport`] says
//!   [`Transport::Network`] (ztrain's `distributed::captured_steps` is that policy's one owner).

use crate::RankInfo;

/// NCCL's data path between the ranks of a job, as far as the settings say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transport {
    /// The ranks may share a host and NCCL may use peer-to-peer or shared memory.
    Local,
    /// NCCL moves data over its network transport (sockets, InfiniBand): `why` names the
    /// setting, or the launcher's variables that say the job spans hosts.
    Network { why: String },
}

/// Whether `get(var)` holds a non-zero integer (how NCCL reads its `*_DISABLE` switches).
fn switched_on(get: &impl Fn(&str) -> Option<String>, var: &str) -> bool {
    get(var).is_some_and(|v| v.trim().parse::<i64>().is_ok_and(|n| n != 0))
}

/// Why NCCL may not use peer-to-peer between the GPUs: `NCCL_P2P_DISABLE` on, or
/// `NCCL_P2P_LEVEL` at `LOC` (or 0), peer-to-peer only within one GPU.
fn p2p_off(get: &impl Fn(&str) -> Option<String>) -> Option<String> {
    if switched_on(get, "NCCL_P2P_DISABLE") {
        return Some("NCCL_P2P_DISABLE is set".into());
    }
    let level = get("NCCL_P2P_LEVEL")?;
    let level = level.trim();
    (level.eq_ignore_ascii_case("LOC") || level == "0")
        .then(|| format!("NCCL_P2P_LEVEL={level} (peer-to-peer within one GPU only)"))
}

/// Why this rank keeps the last bucket on NCCL because of how NCCL was set up (`get` reads the
/// environment): peer-to-peer off (`NCCL_P2P_DISABLE`, `NCCL_P2P_LEVEL=LOC`) or shared memory
/// off (`NCCL_SHM_DISABLE`). `None`: the settings allow the peer-memory tail.
pub fn peer_memory_declined(get: impl Fn(&str) -> Option<String>) -> Option<String> {
    let why = p2p_off(&get).or_else(|| {
        switched_on(&get, "NCCL_SHM_DISABLE").then(|| "NCCL_SHM_DISABLE is set".to_string())
    })?;
    Some(format!(
        "{why}: NCCL may not use peer memory, so neither does the last bucket"
    ))
}

/// NCCL's transport for rank `info` of its job (`get` reads the environment): the network
/// one when the launcher's variables say the job spans hosts (`LOCAL_WORLD_SIZE`, torchrun's
/// and others', below `WORLD_SIZE`), or when peer-to-peer and shared memory are both off.
pub fn transport(get: impl Fn(&str) -> Option<String>, info: RankInfo) -> Transport {
    if info.world < 2 {
        return Transport::Local;
    }
    if let Some(local) = get("LOCAL_WORLD_SIZE").and_then(|v| v.trim().parse::<usize>().ok())
        && local < info.world
    {
        return Transport::Network {
            why: format!(
                "the job spans hosts (LOCAL_WORLD_SIZE={local} of WORLD_SIZE={})",
                info.world
            ),
        };
    }
    match (p2p_off(&get), switched_on(&get, "NCCL_SHM_DISABLE")) {
        (Some(p2p), true) => Transport::Network {
            why: format!("{p2p} and NCCL_SHM_DISABLE is set"),
        },
        _ => Transport::Local,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_string())
        }
    }

    const TWO: RankInfo = RankInfo {
        rank: 1,
        world: 2,
        local_rank: 1,
    };

    /// Issue 44: the socket transport (peer-to-peer and shared memory off, or hosts apart) is
    /// the network one; either switch alone leaves NCCL a local path; a single process has none.
    #[rstest]
    #[case::defaults(&[], TWO, None)]
    #[case::comm_sh_socket(&[("NCCL_P2P_DISABLE", "1"), ("NCCL_SHM_DISABLE", "1"), ("NCCL_IB_DISABLE", "1")], TWO, Some("NCCL_P2P_DISABLE"))]
    #[case::p2p_level_loc(&[("NCCL_P2P_LEVEL", "loc"), ("NCCL_SHM_DISABLE", "1")], TWO, Some("NCCL_P2P_LEVEL=loc"))]
    #[case::p2p_alone(&[("NCCL_P2P_DISABLE", "1")], TWO, None)]
    #[case::shm_alone(&[("NCCL_SHM_DISABLE", "1")], TWO, None)]
    #[case::switched_off(&[("NCCL_P2P_DISABLE", "0"), ("NCCL_SHM_DISABLE", "0")], TWO, None)]
    #[case::not_a_number(&[("NCCL_P2P_DISABLE", "yes"), ("NCCL_SHM_DISABLE", "1")], TWO, None)]
    #[case::two_hosts(&[("LOCAL_WORLD_SIZE", "1")], TWO, Some("spans hosts"))]
    #[case::one_host(&[("LOCAL_WORLD_SIZE", "2")], TWO, None)]
    #[case::single(&[("NCCL_P2P_DISABLE", "1"), ("NCCL_SHM_DISABLE", "1")], RankInfo::SINGLE, None)]
    fn the_network_transport_is_named_with_its_cause(
        #[case] vars: &[(&str, &str)],
        #[case] info: RankInfo,
        #[case] why: Option<&str>,
    ) {
        match (transport(env(vars), info), why) {
            (Transport::Local, None) => {}
            (Transport::Network { why: got }, Some(want)) => {
                assert!(got.contains(want), "{got}");
            }
            (got, want) => panic!("{vars:?}: got {got:?}, want {want:?}"),
        }
    }

    /// The tail needs peer memory: it declines on any switch that takes it from NCCL.
    #[rstest]
    #[case(&[], None)]
    #[case(&[("NCCL_P2P_DISABLE", "0")], None)]
    #[case(&[("NCCL_P2P_DISABLE", "1")], Some("NCCL_P2P_DISABLE"))]
    #[case(&[("NCCL_SHM_DISABLE", " 1")], Some("NCCL_SHM_DISABLE"))]
    #[case(&[("NCCL_P2P_LEVEL", "LOC")], Some("NCCL_P2P_LEVEL=LOC"))]
    #[case(&[("NCCL_P2P_LEVEL", "NVL")], None)]
    #[case(&[("NCCL_P2P_DISABLE", "yes")], None)]
    fn the_tail_declines_without_peer_memory(
        #[case] vars: &[(&str, &str)],
        #[case] named: Option<&str>,
    ) {
        let why = peer_memory_declined(env(vars));
        match named {
            None => assert_eq!(why, None),
            Some(k) => assert!(why.as_deref().is_some_and(|w| w.contains(k)), "{why:?}"),
        }
    }
}
