//! Rank 0 hands out the id over TCP: every rank gets it; a wrong world size, a rank claimed
//! twice, garbage on the wire, a rank that never comes and a rank 0 that is not there are
//! typed `Rendezvous` errors within the deadline.

use std::io::Write;
use std::net::TcpStream;
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
fn a_rank_claimed_twice_is_refused() {
    let (s, addr) = server();
    let first = {
        let addr = addr.clone();
        thread::spawn(move || join(&addr, info(1, 3), T))
    };
    thread::sleep(Duration::from_millis(100));
    let second = thread::spawn(move || join(&addr, info(1, 3), T));
    let e = s.serve(3, b"id", T).unwrap_err();
    assert!(detail(&e).contains("second process claims rank 1"), "{e}");
    let (a, b) = (first.join().unwrap(), second.join().unwrap());
    assert!(a.is_err() && b.is_err(), "{a:?} {b:?}");
}

#[test]
fn garbage_on_the_wire_is_refused() {
    let (s, addr) = server();
    let mut c = TcpStream::connect(&addr).unwrap();
    c.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    let e = s.serve(2, b"id", T).unwrap_err();
    assert!(detail(&e).contains("garbage"), "{e}");
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
