//! Issue 23's attacks on the rendezvous, over loopback: an impostor without the job secret, a
//! process squatting on rank 0's port, a plain TCP probe, garbage bytes, an idle connection, a
//! frame header claiming a gigabyte, a world size above 32 bits, and a stop asked for during
//! the wait. Each gets nothing and knocks nothing over: the real ranks meet as if it were not
//! there, or the victim gets a typed error naming what happened.

use super::{detail, info};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};
use zcomm::rendezvous::{Config, Server, join};
use zcomm::{Auth, Collective, CommError, JobSecret, SimCollective};
use zcompute::{Backend, Engine};

const T: Duration = Duration::from_secs(10);
const ID: &[u8] = b"the-communicator-id";

fn secret(text: &str) -> Auth {
    Auth::Secret(JobSecret::from_text(text, "test").unwrap())
}

/// The job's rendezvous config: its secret, and a short greeting deadline.
fn job() -> Config {
    let mut c = Config::new(secret("0123456789abcdef0123456789abcdef"), T);
    c.greeting_timeout = Duration::from_millis(500);
    c
}

/// Rank 0 serving a world of `world` on a thread; its address.
fn rank0(world: usize) -> (thread::JoinHandle<zcomm::Result<usize>>, String) {
    let s = Server::bind("127.0.0.1:0").unwrap();
    let addr = s.local_addr().unwrap().to_string();
    let h = thread::spawn(move || s.serve(world, ID, job()).map(|j| j.peers.len()));
    (h, addr)
}

/// A protocol-3 greeting: "ZCRV", version, rank, world (u64 each), a 32-byte nonce.
fn hello(rank: u64, world: u64) -> Vec<u8> {
    let mut h = b"ZCRV".to_vec();
    for w in [3u64, rank, world] {
        h.extend_from_slice(&w.to_le_bytes());
    }
    h.extend_from_slice(&[7u8; 32]);
    h
}

/// Reads until the peer closes (or 3 s pass): everything the peer sent.
fn drain(s: &mut TcpStream) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    got
}

#[test]
fn an_impostor_without_the_secret_gets_nothing_and_the_job_goes_on() {
    let (serving, addr) = rank0(2);
    // Speaks the protocol, claims rank 1, answers the challenge with a guess.
    let mut impostor = TcpStream::connect(&addr).unwrap();
    impostor.write_all(&hello(1, 2)).unwrap();
    let mut challenge = [0u8; 84];
    impostor.read_exact(&mut challenge).unwrap();
    impostor.write_all(&[0u8; 32]).unwrap();
    // Also one with another secret, through the real client: it refuses rank 0 (the proof
    // does not check under its key) before saying anything.
    let mut other = Config::new(secret("fedcba9876543210fedcba9876543210"), T);
    other.greeting_timeout = Duration::from_millis(500);
    let e = join(&addr, info(1, 2), other).unwrap_err();
    assert!(
        detail(&e).contains("did not prove it holds the job secret"),
        "{e}"
    );
    // The real rank 1 still joins; the impostor was dropped without the id.
    let (id, _) = join(&addr, info(1, 2), job()).unwrap();
    assert_eq!(id, ID);
    assert_eq!(serving.join().unwrap().unwrap(), 1);
    let got = drain(&mut impostor);
    assert!(
        !got.windows(ID.len()).any(|w| w == ID),
        "the impostor got the id: {got:?}"
    );
    assert!(got.is_empty(), "the impostor was told something: {got:?}");
}

#[test]
fn a_port_squatter_feeds_a_rank_nothing() {
    // Squats before rank 0, and answers as rank 0 would, without the secret: a challenge
    // with a guessed tag, then a welcome with a forged id.
    let squatting = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = squatting.local_addr().unwrap().to_string();
    let squatter = squatting.try_clone().unwrap();
    let forging = thread::spawn(move || {
        let (mut c, _) = squatter.accept().unwrap();
        let mut h = [0u8; 60];
        c.read_exact(&mut h).unwrap();
        let mut answer = b"ZCRV".to_vec();
        answer.extend_from_slice(&[1u8; 80]);
        answer.push(0);
        answer.extend_from_slice(&5u64.to_le_bytes());
        answer.extend_from_slice(b"FORGE");
        let _ = c.write_all(&answer);
        drain(&mut c)
    });
    let e = join(&addr, info(1, 2), job()).unwrap_err();
    assert!(
        detail(&e).contains("did not prove it holds the job secret"),
        "{e}"
    );
    let proof = forging.join().unwrap();
    assert!(proof.is_empty(), "the rank answered a squatter: {proof:?}");
    // The real rank 0 cannot listen there, and says so.
    let e = Server::bind(&addr).unwrap_err();
    assert!(detail(&e).contains("cannot listen"), "{e}");
}

#[test]
fn probes_garbage_and_idle_connections_are_dropped_and_the_job_goes_on() {
    let start = Instant::now();
    let (serving, addr) = rank0(3);
    let probe = TcpStream::connect(&addr).unwrap();
    drop(probe);
    let mut garbage = TcpStream::connect(&addr).unwrap();
    garbage
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    garbage
        .write_all(&[0xff; 100])
        .expect("garbage is read, not refused at once");
    let _idle = TcpStream::connect(&addr).unwrap();
    // An old (version 1) greeting: "ZCRV", then u32 version, rank, world.
    let mut old = TcpStream::connect(&addr).unwrap();
    old.write_all(b"ZCRV\x01\0\0\0\x01\0\0\0\x03\0\0\0")
        .unwrap();
    let ranks: Vec<_> = (1..3)
        .map(|r| {
            let addr = addr.clone();
            thread::spawn(move || join(&addr, info(r, 3), job()))
        })
        .collect();
    for r in ranks {
        assert_eq!(r.join().unwrap().unwrap().0, ID);
    }
    assert_eq!(serving.join().unwrap().unwrap(), 2);
    // Neither the idle connection nor the old greeting held the rendezvous up: the others
    // met long before the 10 s deadline.
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    assert!(drain(&mut garbage).is_empty());
    assert!(drain(&mut old).is_empty());
}

#[test]
fn a_world_size_above_32_bits_is_refused_not_cut() {
    let (serving, addr) = rank0(2);
    // 2^32 + 2: the old protocol's u32 made it 2, and the rank trained on another shard.
    let e = join(&addr, info(1, (1usize << 32) + 2), job()).unwrap_err();
    assert!(detail(&e).contains("4294967298 ranks"), "{e}");
    let e = serving.join().unwrap().unwrap_err();
    assert!(
        detail(&e).contains("believes the world has 4294967298"),
        "{e}"
    );
}

#[test]
fn a_frame_header_claiming_a_gigabyte_is_refused_before_anything_is_allocated() {
    let server = Server::bind("127.0.0.1:0").unwrap();
    let addr = server.local_addr().unwrap().to_string();
    let hub = thread::spawn(move || {
        let b = Engine::sim(256 << 20).unwrap();
        let c = SimCollective::serve(&b, server, 2, T).unwrap();
        let x = b.upload(&[1.0f32; 4], &[4]).unwrap();
        let started = Instant::now();
        c.all_reduce_sum(&b, &x, 1).unwrap();
        let e = c.synchronize(&b).unwrap_err();
        (e, started.elapsed())
    });
    let (_id, mut s) = join(&addr, info(1, 2), T).unwrap();
    // A data frame header: "ZCSM", kind 1, rank 1, collective #0, then 1 GiB of payload.
    let mut h = b"ZCSM\x01\0\0\0".to_vec();
    for w in [1u64, 0, 1 << 30] {
        h.extend_from_slice(&w.to_le_bytes());
    }
    s.write_all(&h, Instant::now() + T).unwrap();
    let (e, took) = hub.join().unwrap();
    let text = e.to_string();
    assert!(matches!(e, CommError::PeerFailed { .. }), "{e:?}");
    assert!(text.contains("1073741824-byte"), "{text}");
    assert!(text.contains("needs 16 bytes"), "{text}");
    // Refused on the header, not after waiting for a gigabyte that never comes.
    assert!(took < Duration::from_secs(5), "{took:?}");
}

#[test]
fn a_stop_during_the_rendezvous_ends_the_wait_at_once() {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    let cancel: zcomm::rendezvous::Cancel = Arc::new(move || flag.load(Ordering::SeqCst));
    let s = Server::bind("127.0.0.1:0").unwrap();
    let addr = s.local_addr().unwrap().to_string();
    let cfg = job().with_cancel(Arc::clone(&cancel));
    let serving = thread::spawn(move || s.serve(3, ID, cfg));
    // Rank 1 checked in and waits for the id; rank 2 never comes.
    let cfg = job().with_cancel(cancel);
    let waiting = thread::spawn(move || join(&addr, info(1, 3), cfg));
    thread::sleep(Duration::from_millis(300));
    let asked = Instant::now();
    stop.store(true, Ordering::SeqCst);
    for e in [
        serving.join().unwrap().unwrap_err(),
        waiting.join().unwrap().unwrap_err(),
    ] {
        assert!(matches!(e, CommError::Interrupted { .. }), "{e:?}");
    }
    assert!(
        asked.elapsed() < Duration::from_secs(1),
        "{:?}",
        asked.elapsed()
    );
}

#[test]
fn a_name_that_does_not_resolve_is_retried_until_the_deadline() {
    let start = Instant::now();
    let e = join(
        "no-such-host.invalid:29500",
        info(1, 2),
        Duration::from_millis(400),
    )
    .unwrap_err();
    assert!(detail(&e).contains("before the deadline"), "{e}");
    assert!(
        start.elapsed() >= Duration::from_millis(400),
        "{:?}",
        start.elapsed()
    );
}
