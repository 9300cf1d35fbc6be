//! What holds without a GPU: the checks `join` makes on every driver, in order (rank, capture,
//! id, the options, then the driver), and how NCCL's errors become `CommError`s naming rank, op and step.

use std::time::Duration;

use rstest::rstest;
use zcompute::{CudaBackend, Engine};
use zdevice::cuda::nccl::NcclError;
use zdevice::{DeviceError, SimDriver};

use super::{JoinOptions, NcclCollective, UNIQUE_ID_BYTES, errors::convert};
use crate::{CommError, RankInfo};

fn sim() -> CudaBackend<SimDriver> {
    Engine::sim(1 << 30).expect("the simulated engine opens")
}

fn rank(rank: usize, world: usize) -> RankInfo {
    RankInfo {
        rank,
        world,
        local_rank: rank,
    }
}

#[rstest]
#[case(2, 2)]
#[case(0, 0)]
#[case(5, 3)]
fn join_refuses_a_rank_outside_the_world(#[case] r: usize, #[case] world: usize) {
    let err = NcclCollective::join(&sim(), rank(r, world), &[0; UNIQUE_ID_BYTES]).unwrap_err();
    assert!(
        matches!(err, CommError::BadRank { rank, world: w, op: "init", step: 0 } if rank == r && w == world),
        "{err:?}"
    );
}

#[test]
fn join_is_refused_while_the_device_captures() {
    let b = sim();
    let dev = b.device().clone();
    let cap = dev.begin_capture(dev.stream()).expect("capture begins");
    let err = NcclCollective::join(&b, rank(0, 2), &[0; UNIQUE_ID_BYTES]).unwrap_err();
    assert!(
        matches!(
            err,
            CommError::CaptureIllegal {
                call: "NcclCollective::join"
            }
        ),
        "{err:?}"
    );
    cap.end().map_err(|e| e.into_error()).expect("capture ends");
    // Out of the capture, the same call gets past the capture check (to the driver check).
    let err = NcclCollective::join(&b, rank(0, 2), &[0; UNIQUE_ID_BYTES]).unwrap_err();
    assert!(matches!(err, CommError::NotCuda { .. }), "{err:?}");
}

#[rstest]
#[case(0)]
#[case(127)]
#[case(129)]
fn join_refuses_an_id_of_the_wrong_length(#[case] len: usize) {
    let err = NcclCollective::join(&sim(), rank(1, 2), &vec![7; len]).unwrap_err();
    match err {
        CommError::InvalidArgument { op: "init", reason } => {
            assert!(reason.contains(&len.to_string()), "{reason}");
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

#[test]
fn join_over_the_simulator_says_nccl_needs_cuda() {
    let err = NcclCollective::join(&sim(), rank(0, 1), &[0; UNIQUE_ID_BYTES]).unwrap_err();
    match err {
        CommError::NotCuda { driver } => assert!(!driver.is_empty()),
        other => panic!("expected NotCuda, got {other:?}"),
    }
}

#[test]
fn unique_id_is_bytes_or_a_typed_load_error() {
    match NcclCollective::unique_id() {
        // A machine with NCCL: an id is never all zeros (it carries the root's address).
        Ok(id) => assert!(id.iter().any(|b| *b != 0)),
        Err(CommError::Library(e)) => assert!(e.to_string().contains("libnccl"), "{e}"),
        Err(other) => panic!("expected an id or CommError::Library, got {other:?}"),
    }
}

#[test]
fn a_timeout_names_rank_op_step_and_the_deadline() {
    let e = NcclError::Timeout {
        call: "ncclAllReduce",
        deadline: Duration::from_secs(3),
    };
    let err = convert(e.clone(), rank(1, 3), "all_reduce", 10);
    assert!(
        matches!(
            &err,
            CommError::Timeout { rank: 1, op: "all_reduce", step: 10, waited_for, silent: crate::Silent::OneOf { ranks, .. } } if *waited_for == Duration::from_secs(3) && ranks[..] == [0, 2]
        ),
        "{err:?}"
    );
    let shown = err.to_string();
    assert!(shown.contains("rank 1") && shown.contains("all_reduce") && shown.contains("step 10"));
    // Issue 44: NCCL does not say which peer it waits for: the candidates, and why; of two
    // ranks, the other one.
    assert!(
        shown.contains("a peer of ranks 0, 2 (NCCL does not say which peer its kernel waits for) did not answer within 3s"),
        "{shown}"
    );
    let two = convert(e, rank(1, 2), "all_reduce", 10);
    assert!(
        two.to_string().contains("rank 0 did not answer within 3s"),
        "{two}"
    );
}

#[rstest]
#[case("ncclRemoteError", 6, true)]
#[case("ncclSystemError", 2, true)]
#[case("ncclInternalError", 3, false)]
#[case("ncclInvalidUsage", 5, false)]
fn an_asynchronous_error_from_a_peer_is_peer_failed(
    #[case] name: &'static str,
    #[case] code: u32,
    #[case] peer: bool,
) {
    let e = NcclError::Async {
        call: "synchronize",
        code,
        name,
        detail: "socket closed".into(),
    };
    match convert(e, rank(0, 2), "synchronize", 4) {
        CommError::PeerFailed {
            rank: 0,
            op: "synchronize",
            step: 4,
            detail,
        } => {
            assert!(peer, "{name} is not a peer's failure");
            assert!(
                detail.contains(name) && detail.contains("socket closed"),
                "{detail}"
            );
            // Issue 44: of two ranks, the peer is named (NCCL does not say which); a system
            // error may be this rank's own.
            let who = match name {
                "ncclRemoteError" => "rank 1 vanished or failed: ",
                _ => "rank 1 may have vanished or failed (or this rank's system): ",
            };
            assert!(detail.starts_with(who), "{detail}");
        }
        CommError::Nccl {
            rank: 0,
            op: "synchronize",
            step: 4,
            code: c,
            name: shown,
        } => {
            assert!(!peer, "{name} is a peer's failure");
            assert_eq!(c, i32::try_from(code).unwrap());
            assert!(shown.contains(name), "{shown}");
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn other_nccl_errors_keep_their_kind() {
    let aborted = convert(
        NcclError::Aborted {
            call: "ncclAllReduce",
        },
        rank(1, 2),
        "all_reduce",
        2,
    );
    assert!(
        matches!(
            aborted,
            CommError::PeerFailed {
                rank: 1,
                op: "all_reduce",
                step: 2,
                ..
            }
        ),
        "{aborted:?}"
    );
    let call = convert(
        NcclError::Call {
            call: "ncclBroadcast",
            code: 4,
            name: "ncclInvalidArgument",
            detail: String::new(),
        },
        rank(0, 2),
        "broadcast",
        0,
    );
    assert!(
        matches!(call, CommError::Nccl { code: 4, ref name, .. } if name.contains("ncclInvalidArgument")),
        "{call:?}"
    );
    let old = convert(
        NcclError::VersionTooOld {
            found: "2.27.7".into(),
            needed: "2.28.3".into(),
        },
        rank(0, 2),
        "init",
        0,
    );
    assert!(matches!(old, CommError::VersionTooOld { .. }), "{old:?}");
    let capture = convert(
        NcclError::Device(DeviceError::CaptureIllegal {
            call: "cuStreamQuery",
            why: "end the capture first",
        }),
        rank(0, 2),
        "synchronize",
        3,
    );
    assert!(
        matches!(
            capture,
            CommError::CaptureIllegal {
                call: "cuStreamQuery"
            }
        ),
        "{capture:?}"
    );
}

#[test]
fn join_refuses_overlapped_collectives_of_no_thread_block() {
    let options = JoinOptions {
        overlap_ctas: Some(0),
        ..JoinOptions::default()
    };
    let err =
        NcclCollective::join_with(&sim(), rank(0, 2), &[0; UNIQUE_ID_BYTES], options).unwrap_err();
    assert!(
        matches!(&err, CommError::InvalidArgument { op: "init", reason } if reason.contains("thread block")),
        "{err:?}"
    );
}

/// Issue 44, over the simulator: rank 0 of three runs the peer-memory tail; rank 1's words come,
/// rank 2 stopped and never writes. The launch waits (its stream cannot drain), is given up
/// from the host, and the error the tail reports names rank 2, the one that did not answer
/// (before, only a world of two named a peer: "the other one").
#[test]
fn a_tail_given_up_on_a_stopped_peer_names_that_peer() {
    use zcompute::Backend;
    use zcompute::cuda::PeerExchange;
    const LAST: usize = 300;
    const N: usize = 1000;
    let b = sim();
    let side = |r| PeerExchange::new(&b, r, 3, LAST).expect("exchange");
    let (mut e0, e1, e2) = (side(0), side(1), side(2));
    e0.connect_addressable(&[e0.receive_words(), e1.receive_words(), e2.receive_words()])
        .expect("connect");
    // Rank 1's launch of epoch 1 stored its words into rank 0's (half 1, slot 1).
    let words: Vec<u8> = (0..LAST)
        .flat_map(|i| (u64::from((i as f32).to_bits()) | (1u64 << 32)).to_le_bytes())
        .collect();
    let d = b.device();
    let staging = d.alloc_pinned(words.len() as u64).expect("staging");
    d.write_pinned(&staging, &words).expect("write");
    let at = e0.receive_words().offset(((3 + 1) * LAST * 8) as u64);
    d.upload_async(at, &staging, words.len() as u64, d.stream())
        .expect("upload");
    let x = b.upload(&vec![1.0f32; N], &[N]).expect("x");
    let waited_for = Duration::from_secs(3600);
    let _norm = e0.sum_and_norm(&b, &x, waited_for).expect("launch");
    assert!(
        matches!(d.synchronize(d.stream()), Err(DeviceError::Timeout { .. })),
        "the launch waits for rank 2"
    );
    e0.give_up().expect("give up");
    d.synchronize(d.stream()).expect("the launch gave up");
    d.free_pinned(staging).expect("free");
    let tail = super::tail::Tail {
        exchange: e0,
        len: N,
        timeout: waited_for,
    };
    let e = super::tail::failure(&tail, rank(0, 3), 5)
        .expect("the flag reads")
        .expect("the tail failed");
    match &e {
        CommError::Timeout {
            rank: 0,
            op: "all_reduce_last_and_norm",
            step: 5,
            silent: crate::Silent::Rank(2),
            ..
        } => assert!(e.to_string().contains("rank 2 did not answer"), "{e}"),
        other => panic!("{other:?}"),
    }
}
