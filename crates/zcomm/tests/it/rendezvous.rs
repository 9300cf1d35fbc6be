//! Rank 0 hands out the id over TCP: every rank gets it; a wrong world size, a rank that never
//! comes and a rank 0 that is not there are typed `Rendezvous` errors within the deadline; a
//! second claim of a rank is dropped and the job goes on. `attacks` tries what a hostile or
//! careless process would (issue 23); `guard` what issue 45 found around the handshake; `relay` its relay
//! on the second address of a name (a hosts file in a private mount namespace).

#[path = "rendezvous/attacks.rs"]
mod attacks;
#[path = "rendezvous/guard.rs"]
mod guard;
#[path = "rendezvous/relay.rs"]
mod relay;

use std::thread;
use std::time::{Duration, Instant};
use zcomm::rendezvous::{Server, join};
use zcomm::{CommError, RankInfo};

const T: Duration = Duration::from_secs(5);

fn info(rank: usize, world: usize) -> RankInfo {
    RankInfo {
        rank,
        world,
        local_rank: rank,
    }
}

fn server() -> (Server, String) {
    let s = Server::bind("127.0.0.1:0").unwrap();
    let addr = s.local_addr().unwrap().to_string();
    (s, addr)
}

fn detail(e: &CommError) -> String {
    match e {
        CommError::Rendezvous { detail, .. } => detail.clone(),
        other => panic!("expected a Rendezvous error, got {other:?}"),
    }
}

#[test]
fn every_rank_gets_the_id() {
    let (s, addr) = server();
    let id = b"the-unique-id".to_vec();
    let joiners: Vec<_> = (1..4)
        .map(|r| {
            let addr = addr.clone();
            thread::spawn(move || join(&addr, info(r, 4), T).map(|(id, _)| id))
        })
        .collect();
    let joined = s.serve(4, &id, T).unwrap();
    assert_eq!(joined.peers.len(), 3);
    for j in joiners {
        assert_eq!(j.join().unwrap().unwrap(), id);
    }
}

#[test]
fn a_rank_that_starts_before_rank_0_waits_for_it() {
    let probe = Server::bind("127.0.0.1:0").unwrap();
    let addr = probe.local_addr().unwrap().to_string();
    drop(probe);
    let a = addr.clone();
    let joiner = thread::spawn(move || join(&a, info(1, 2), T).map(|(id, _)| id));
    thread::sleep(Duration::from_millis(200));
    let s = Server::bind(&addr).unwrap();
    s.serve(2, b"x", T).unwrap();
    assert_eq!(joiner.join().unwrap().unwrap(), b"x");
}

#[test]
fn a_wrong_world_size_is_refused_on_both_ends() {
    let (s, addr) = server();
    let joiner = thread::spawn(move || join(&addr, info(1, 3), T));
    let e = s.serve(2, b"id", T).unwrap_err();
    assert!(detail(&e).contains("3 ranks"), "{e}");
    let e = joiner.join().unwrap().unwrap_err();
    assert!(detail(&e).contains("refused"), "{e}");
}

#[test]
fn a_rank_claimed_twice_is_dropped_and_the_job_goes_on() {
    let (s, addr) = server();
    let serving = thread::spawn(move || s.serve(3, b"id", T));
    let first = {
        let addr = addr.clone();
        thread::spawn(move || join(&addr, info(1, 3), T))
    };
    // The first claim has its slot by now; the second is refused at once.
    thread::sleep(Duration::from_millis(500));
    let second = join(&addr, info(1, 3), T).unwrap_err();
    assert!(
        detail(&second).contains("rank 1 is already taken"),
        "{second}"
    );
    let third = join(&addr, info(2, 3), T).unwrap();
    assert_eq!(third.0, b"id");
    assert_eq!(first.join().unwrap().unwrap().0, b"id");
    assert_eq!(serving.join().unwrap().unwrap().peers.len(), 2);
}

#[test]
fn a_rank_that_never_comes_times_out() {
    let (s, _addr) = server();
    let start = Instant::now();
    let e = s.serve(2, b"id", Duration::from_millis(300)).unwrap_err();
    assert!(detail(&e).contains("did not check in"), "{e}");
    assert!(start.elapsed() < T);
}

#[test]
fn rank_0_gone_times_out() {
    let probe = Server::bind("127.0.0.1:0").unwrap();
    let addr = probe.local_addr().unwrap().to_string();
    drop(probe);
    let e = join(&addr, info(1, 2), Duration::from_millis(300)).unwrap_err();
    assert!(detail(&e).contains("could not be reached"), "{e}");
}

#[test]
fn rank_0_that_accepts_and_dies_is_reported() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let dead = thread::spawn(move || {
        let (c, _) = listener.accept().unwrap();
        drop(c);
    });
    let e = join(&addr, info(1, 2), T).unwrap_err();
    dead.join().unwrap();
    assert!(matches!(e, CommError::Rendezvous { .. }), "{e}");
}
