//! Issue 45's attacks around the handshake, over loopback: junk connections that filled rank
//! 0's pending greetings and pushed the real rank out, a rank of another job (sharing the
//! secret) relayed in, rank 0 listening on only some of its name's addresses, and frames
//! after the handshake altered on the way (`Channel`).

use super::info;
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};
use zcomm::rendezvous::{Config, MAX_PENDING_GREETINGS, Server, join};
use zcomm::{Auth, Collective, CommError, JobSecret, SimCollective};
use zcompute::{Backend, Engine};

const T: Duration = Duration::from_secs(20);
const ID: &[u8] = b"the-communicator-id";

fn job() -> Config {
    let key = JobSecret::from_text("00112233445566778899aabbccddeeff", "test").unwrap();
    // Junk is held as long as a greeting may take: only eviction makes room.
    let mut c = Config::new(Auth::Secret(key), T);
    c.greeting_timeout = T;
    c
}

/// `n` idle connections to `addr`, held open, opened before (`early`) or while rank 1 joins.
fn junk_then_join(n: usize, early: bool) {
    let s = Server::bind("127.0.0.1:0").unwrap();
    let addr = s.local_addr().unwrap().to_string();
    let serving = thread::spawn(move || s.serve(2, ID, job()).map(|j| j.peers.len()));
    let a = addr.clone();
    // As many as the kernel's listen queue lets through (it refuses the rest).
    let flood = move || {
        (0..n)
            .filter_map(|_| TcpStream::connect(&a).ok())
            .collect::<Vec<_>>()
    };
    let (held, joining) = if early {
        let held = flood();
        // Rank 0 has taken them all (each is read by then) before rank 1 comes.
        thread::sleep(Duration::from_millis(200));
        (held, thread::spawn(move || join(&addr, info(1, 2), job())))
    } else {
        let joining = thread::spawn(move || join(&addr, info(1, 2), job()));
        (flood(), joining)
    };
    let (id, _) = joining.join().unwrap().expect("the real rank 1 joins");
    assert_eq!(id, ID);
    assert_eq!(serving.join().unwrap().unwrap(), 1);
    drop(held);
}

/// Issue 45: 64 idle connections made the real rank 1 exit 3 at once (rank 0 dropped every
/// connection past 64 pending; rank 1 never retried).
#[test]
fn sixty_four_junk_connections_do_not_stop_a_two_rank_job() {
    junk_then_join(MAX_PENDING_GREETINGS, true);
}

#[test]
fn a_thousand_junk_connections_before_or_during_the_join_do_not_stop_it() {
    junk_then_join(1000, true);
    junk_then_join(1000, false);
}

/// Issue 45: rank 1 of job B, relayed into job A (both jobs made with one secret file), joined
/// A and fed it its gradients. Each rank binds the rendezvous address it was given into the
/// handshake, and rank 0 a job id of its own: the relayed rank refuses rank 0's proof.
#[test]
fn a_rank_relayed_into_another_job_sharing_the_secret_is_refused() {
    let a = Server::bind("127.0.0.1:0").unwrap();
    let a_addr = a.local_addr().unwrap();
    let serving = thread::spawn(move || {
        let mut cfg = job();
        cfg.timeout = Duration::from_secs(3);
        a.serve(2, ID, cfg)
    });
    // The relay: job B's rendezvous address, forwarding every byte to job A's rank 0.
    let relay = TcpListener::bind("127.0.0.1:0").unwrap();
    let b_addr = relay.local_addr().unwrap().to_string();
    thread::spawn(move || {
        let (victim, _) = relay.accept().unwrap();
        let upstream = TcpStream::connect(a_addr).unwrap();
        pipe(&victim, &upstream);
        pipe(&upstream, &victim);
    });
    let e = join(&b_addr, info(1, 2), job()).unwrap_err();
    assert!(matches!(e, CommError::Rendezvous { .. }), "{e:?}");
    assert!(
        e.to_string()
            .contains("did not prove it holds the job secret"),
        "{e}"
    );
    // Job A got no rank 1 from it.
    assert!(serving.join().unwrap().is_err());
}

fn pipe(from: &TcpStream, to: &TcpStream) {
    let (mut from, mut to) = (from.try_clone().unwrap(), to.try_clone().unwrap());
    thread::spawn(move || {
        let _ = std::io::copy(&mut from, &mut to);
        let _ = to.shutdown(std::net::Shutdown::Write);
    });
}

/// Issue 45: with a name resolving to two addresses, rank 0 fell back to one of them without a
/// word, and another user listening on the other relayed the job. Rank 0 listens on all of a
/// name's addresses (here, those of `localhost`), and logs which.
#[test]
fn rank_0_listens_on_every_address_its_name_resolves_to() {
    use std::net::ToSocketAddrs as _;
    let s = Server::bind("localhost:0").unwrap();
    let port = s.local_addr().unwrap().port();
    let mut want: Vec<_> = ("localhost", port).to_socket_addrs().unwrap().collect();
    want.sort();
    want.dedup();
    let mut got = s.local_addrs().unwrap();
    got.sort();
    assert_eq!(got, want);
    for a in want {
        TcpStream::connect(a).expect("every address is rank 0's");
    }
}

/// One of the addresses taken by another process: rank 0 refuses to start, naming it.
#[test]
fn rank_0_refuses_to_start_when_another_process_holds_one_of_its_addresses() {
    let squat = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = squat.local_addr().unwrap().port();
    let e = Server::bind(&format!("127.0.0.1:{port}")).unwrap_err();
    assert!(e.to_string().contains("cannot listen on 127.0.0.1"), "{e}");
}

/// The channel carries buffers of any size in records (each at most `MAX_RECORD`), and the
/// sums come out as before.
#[test]
fn buffers_larger_than_a_record_cross_the_authenticated_channel() {
    let s = Server::bind("127.0.0.1:0").unwrap();
    let addr = s.local_addr().unwrap().to_string();
    let n = zcomm::rendezvous::MAX_RECORD; // floats: four records' worth of bytes
    let hub = thread::spawn(move || {
        let b = Engine::sim(256 << 20).unwrap();
        let c = SimCollective::serve(&b, s, 2, job()).unwrap();
        let x = b.upload(&vec![1.0f32; n], &[n]).unwrap();
        c.all_reduce_sum(&b, &x, 1).unwrap();
        c.synchronize(&b).unwrap();
        b.download(&x).unwrap()
    });
    let b = Engine::sim(256 << 20).unwrap();
    let c = SimCollective::join(&b, &addr, info(1, 2), job()).unwrap();
    let x = b.upload(&vec![2.0f32; n], &[n]).unwrap();
    c.all_reduce_sum(&b, &x, 1).unwrap();
    c.synchronize(&b).unwrap();
    let started = Instant::now();
    assert!(b.download(&x).unwrap().iter().all(|v| *v == 3.0));
    assert!(hub.join().unwrap().iter().all(|v| *v == 3.0));
    assert!(started.elapsed() < T);
}
