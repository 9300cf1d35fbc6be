//! Issue 45's relay, replayed as the attacker ran it: a name that resolves to two addresses,
//! rank 0 started on that name, and a relay between a real rank and rank 0's second address
//! that forwards the handshake untouched and then alters, reorders, replays or splices the
//! gradient records. The name's two addresses come from a hosts file bind-mounted over
//! `/etc/hosts` in a private mount namespace (glibc's `getaddrinfo`, which std's
//! `ToSocketAddrs` calls, reads it through `nsswitch.conf`'s `files`): `127.0.0.1` and
//! `127.0.0.2`, both loopback, so no network namespace is needed.

use super::info;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs as _};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Mutex, mpsc};
use std::thread;
use std::time::Duration;
use zcomm::rendezvous::{Config, MAX_RECORD, Server, join};
use zcomm::{Auth, Collective, CommError, JobSecret, SimCollective};
use zcompute::{Backend, Engine};

/// The name rank 0 is started on; it resolves to [`FIRST`] and [`SECOND`].
const NAME: &str = "zcomm-two-addresses";
const FIRST: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
const SECOND: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
/// Where the relay listens: what the joining rank is given for the name once rank 0 holds
/// both of its addresses.
const RELAY: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 3);
/// Set in the child process, which enters the namespace and runs the attack.
const CHILD: &str = "ZCOMM_TEST_RELAY_CHILD";
/// What the child prints when it cannot have a mount namespace of its own.
const NO_NAMESPACE: &str = "no private mount namespace";
/// A record's MAC (HMAC-SHA-256) after its payload.
const TAG: usize = 32;
const T: Duration = Duration::from_secs(20);

fn job_config() -> Config {
    let key = JobSecret::from_text("00112233445566778899aabbccddeeff", "test").unwrap();
    Config::new(Auth::Secret(key), T)
}

/// Issue 45: with `localhost` resolving to `::1` and `127.0.0.1`, rank 0 bound one of them
/// without a word; another user listened on the other, forwarded the handshake untouched and
/// rewrote the gradient frames: both ranks exited 0 and the poisoned checkpoint was written.
///
/// It needs root (`CAP_SYS_ADMIN`, for a private mount namespace), which CI and this machine's
/// tests have: the test binary runs again for this test alone, enters a mount namespace of
/// its own (its mounts made private first, so nothing reaches the host), bind-mounts a hosts
/// file in which [`NAME`] resolves to two addresses, and checks that `getaddrinfo` sees it.
/// Rank 0 started on the name must bind exactly both addresses, log both, and leave neither
/// to another process. A relay (on [`RELAY`]: the hosts file then gives the rank that
/// address for the name, as the attacker's address was given by the name before) forwards a
/// real rank's handshake to rank 0's *second* address and then, in turn: nothing (the sums
/// come out), a byte of a gradient changed, the first two records swapped, the first record
/// replayed, and the first record replaced by the one another job's rank (same secret) sent.
/// Each time rank 0 stops with `PeerFailed` naming the bad frame, and the rank with an error.
/// A rank of another job relayed into this one during the handshake is refused.
///
/// Not root, or where a mount namespace is refused, there is no second address to have: the
/// test says so on stderr and checks what one uid can, that rank 0 on `localhost` holds each
/// address the name resolves to (another process's bind on each is refused), so it never
/// passes without a refusal checked.
#[test]
// It says which path ran, and the child what it saw.
#[allow(clippy::print_stdout, clippy::print_stderr)]
fn a_relay_on_the_second_address_of_a_name_alters_and_splices_nothing() {
    if std::env::var_os(CHILD).is_some() {
        return attack_in_a_private_namespace();
    }
    if nix::unistd::geteuid().is_root() {
        let name =
            "rendezvous::relay::a_relay_on_the_second_address_of_a_name_alters_and_splices_nothing";
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([name, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD, "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "the child failed:\n{text}");
        eprintln!("{text}");
        if !text.contains(NO_NAMESPACE) {
            for seen in [
                "getaddrinfo sees the hosts file",
                "rank 0 bound exactly",
                "through the relay untouched",
                "a byte changed: rank 0 stopped",
                "swapped: rank 0 stopped",
                "replayed: rank 0 stopped",
                "spliced from another job: rank 0 stopped",
                "relayed into another job: refused",
            ] {
                assert!(
                    text.contains(seen),
                    "the child never said {seen:?}:\n{text}"
                );
            }
            return;
        }
    } else {
        eprintln!(
            "not root: {NO_NAMESPACE} (no hosts file of the test's own); checking that rank 0 on localhost holds every address instead"
        );
    }
    let s = Server::bind("localhost:0").unwrap();
    let port = s.local_addr().unwrap().port();
    let addrs: Vec<SocketAddr> = ("localhost", port).to_socket_addrs().unwrap().collect();
    for a in addrs {
        let e = TcpListener::bind(a).expect_err("another process listens on rank 0's address");
        assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse, "{a}: {e}");
    }
}

/// The child: the namespace, the hosts file, then every case (see the test above).
#[allow(clippy::print_stdout)]
fn attack_in_a_private_namespace() {
    use nix::mount::{MsFlags, mount};
    use nix::sched::{CloneFlags, unshare};
    // This thread (and those it starts) alone: the test harness's others keep the host's.
    if let Err(e) = unshare(CloneFlags::CLONE_NEWNS) {
        println!("{NO_NAMESPACE}: {e}");
        return;
    }
    let none = None::<&str>;
    mount(none, "/", none, MsFlags::MS_REC | MsFlags::MS_PRIVATE, none)
        .expect("the namespace's mounts made private, so the bind below stays in it");
    let dir = tempfile::tempdir().unwrap();
    let hosts = dir.path().join("hosts");
    std::fs::write(&hosts, name_on(&[FIRST, SECOND])).unwrap();
    mount(Some(&hosts), "/etc/hosts", none, MsFlags::MS_BIND, none)
        .expect("the hosts file bind-mounted over /etc/hosts");
    let mut seen: Vec<SocketAddr> = (NAME, 1).to_socket_addrs().unwrap().collect();
    seen.sort();
    assert_eq!(
        seen,
        [SocketAddr::from((FIRST, 1)), SocketAddr::from((SECOND, 1))],
        "getaddrinfo does not read the bind-mounted /etc/hosts"
    );
    println!("getaddrinfo sees the hosts file: {NAME} is {seen:?}");
    let log = Log::default();
    let sink = log.clone();
    tracing_subscriber::fmt()
        .with_writer(move || sink.clone())
        .init();

    let sums = run_job(&hosts, &log, Tamper::Nothing, 2.0);
    let (r0, r1) = (sums.0.unwrap(), sums.1.unwrap());
    assert!(
        r0.iter().chain(&r1).all(|v| *v == 3.0),
        "the relay forwards faithfully"
    );
    println!("through the relay untouched: both ranks sum 3.0");

    for (case, tamper, seq) in [
        ("a byte changed", Tamper::FlipAByte, 0),
        ("swapped", Tamper::Swap, 0),
        ("replayed", Tamper::Replay, 1),
    ] {
        let (r0, r1) = run_job(&hosts, &log, tamper, 2.0);
        stopped_on_a_bad_frame(case, r0, r1, seq);
    }

    // Job B (the same secret) runs clean; its rank's first record goes into job A.
    let (tx, rx) = mpsc::channel();
    let (b0, b1) = run_job(&hosts, &log, Tamper::SendFirstTo(tx), 5.0);
    assert!(b0.unwrap().iter().chain(&b1.unwrap()).all(|v| *v == 6.0));
    let (r0, r1) = run_job(&hosts, &log, Tamper::SpliceFrom(rx), 2.0);
    stopped_on_a_bad_frame("spliced from another job", r0, r1, 0);

    // A rank of another job (its rendezvous at another port of the name) relayed into this
    // one's second address during the handshake.
    let (server, port) = rank0_on_both(&hosts, &log);
    std::fs::write(&hosts, name_on(&[RELAY])).unwrap();
    let relay = TcpListener::bind((RELAY, 0)).unwrap();
    let other = relay.local_addr().unwrap().port();
    thread::spawn(move || {
        let (victim, _) = relay.accept().unwrap();
        let upstream = TcpStream::connect((SECOND, port)).unwrap();
        pipe(&upstream, &victim);
        forward(victim, upstream, &AtomicBool::new(false), Tamper::Nothing);
    });
    let serving = thread::spawn(move || {
        let mut cfg = job_config();
        cfg.timeout = Duration::from_secs(3);
        server.serve(2, b"job A", cfg).map(drop)
    });
    let e = join(&format!("{NAME}:{other}"), info(1, 2), job_config()).unwrap_err();
    assert!(
        e.to_string()
            .contains("did not prove it holds the job secret"),
        "{e}"
    );
    let a = serving.join().unwrap().unwrap_err();
    println!("relayed into another job: refused ({e}); job A got no rank from it ({a})");
}

/// The hosts file with [`NAME`] on `addrs`.
fn name_on(addrs: &[Ipv4Addr]) -> String {
    let mut text = "127.0.0.1 localhost\n".to_string();
    for a in addrs {
        text += &format!("{a} {NAME}\n");
    }
    text
}

/// Rank 0 started on [`NAME`] (its hosts file rewritten to the two addresses): it must bind
/// exactly both, say so, and leave neither to another process. The server and its port.
#[allow(clippy::print_stdout)]
fn rank0_on_both(hosts: &Path, log: &Log) -> (Server, u16) {
    std::fs::write(hosts, name_on(&[FIRST, SECOND])).unwrap();
    let s = Server::bind(&format!("{NAME}:0")).unwrap();
    let port = s.local_addr().unwrap().port();
    let both = [
        SocketAddr::from((FIRST, port)),
        SocketAddr::from((SECOND, port)),
    ];
    for a in both {
        // Where the attacker listened before: each of the name's addresses, at rank 0's port.
        match TcpListener::bind(a) {
            Ok(l) => panic!(
                "another process listens on {:?}, an address of rank 0's name",
                l.local_addr()
            ),
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse, "{a}: {e}"),
        }
    }
    let mut bound = s.local_addrs().unwrap();
    bound.sort();
    assert_eq!(
        bound, both,
        "rank 0 bound other than the name's two addresses"
    );
    let text = log.text();
    let line = text
        .lines()
        .rev()
        .find(|l| l.contains("zcomm.rendezvous.bind"))
        .expect("rank 0 logged what it bound");
    let mut said: Vec<&str> = line
        .rsplit_once("bound=")
        .map(|(_, b)| b.split(", ").collect())
        .unwrap_or_default();
    said.sort_unstable();
    assert_eq!(said, both.map(|a| a.to_string()), "{line}");
    println!("rank 0 bound exactly {said:?}, said so, and another process cannot listen on either");
    (s, port)
}

/// What the relay does to the records the rank sends after the handshake.
enum Tamper {
    Nothing,
    /// A byte of a gradient value in the first record.
    FlipAByte,
    /// The first two records in the other order.
    Swap,
    /// The first record, then the first record again.
    Replay,
    /// The first record forwarded, and handed to another relay.
    SendFirstTo(mpsc::Sender<Vec<u8>>),
    /// The first record replaced by one from another relay.
    SpliceFrom(mpsc::Receiver<Vec<u8>>),
}

impl Tamper {
    /// Reads the records it needs from `r` and returns the bytes to forward in their place.
    fn apply(self, r: &mut impl Read) -> Vec<u8> {
        match self {
            Tamper::Nothing => Vec::new(),
            Tamper::FlipAByte => {
                let mut first = record(r);
                // Past the length (4) and the collective's frame header (32): a float.
                first[4 + 32 + 1] ^= 0x40;
                first
            }
            Tamper::Swap => {
                let (a, b) = (record(r), record(r));
                [b, a].concat()
            }
            Tamper::Replay => {
                let (a, b) = (record(r), record(r));
                [a.clone(), a, b].concat()
            }
            Tamper::SendFirstTo(tx) => {
                let first = record(r);
                tx.send(first.clone()).unwrap();
                first
            }
            Tamper::SpliceFrom(rx) => {
                let _own = record(r);
                rx.recv().unwrap()
            }
        }
    }
}

/// One record off the wire, as it was: length, payload, MAC.
fn record(r: &mut impl Read) -> Vec<u8> {
    let mut head = [0u8; 4];
    r.read_exact(&mut head).unwrap();
    let len = u32::from_le_bytes(head) as usize;
    let mut rec = vec![0u8; 4 + len + TAG];
    rec[..4].copy_from_slice(&head);
    r.read_exact(&mut rec[4..]).unwrap();
    rec
}

/// A job of two ranks: rank 0 on both addresses of [`NAME`], rank 1 through a relay to the
/// second doing `tamper` once both handshakes are done, one all-reduce of rank 0's ones and
/// rank 1's `value`s, large enough for two records. What each rank ends with.
fn run_job(
    hosts: &Path,
    log: &Log,
    tamper: Tamper,
    value: f32,
) -> (zcomm::Result<Vec<f32>>, zcomm::Result<Vec<f32>>) {
    let (server, port) = rank0_on_both(hosts, log);
    std::fs::write(hosts, name_on(&[RELAY])).unwrap();
    let relay = TcpListener::bind((RELAY, port)).unwrap();
    let armed = Arc::new(AtomicBool::new(false));
    let arm = Arc::clone(&armed);
    thread::spawn(move || {
        let (victim, _) = relay.accept().unwrap();
        let upstream = TcpStream::connect((SECOND, port)).unwrap();
        pipe(&upstream, &victim);
        forward(victim, upstream, &arm, tamper);
    });
    // Both handshakes done, then the relay armed, then the gradients.
    let met = Arc::new(Barrier::new(3));
    let n = MAX_RECORD / 4;
    // Rank 0 with its server, rank 1 without.
    let rank = |server: Option<Server>, met: Arc<Barrier>| {
        thread::spawn(move || {
            let b = Engine::sim(256 << 20).unwrap();
            let joining = server.is_none();
            let c = match server {
                Some(s) => SimCollective::serve(&b, s, 2, job_config()),
                None => {
                    SimCollective::join(&b, &format!("{NAME}:{port}"), info(1, 2), job_config())
                }
            };
            met.wait();
            met.wait();
            let c = c.expect("the relay forwards the handshake untouched: both ranks meet");
            let x = b
                .upload(&vec![if joining { value } else { 1.0 }; n], &[n])
                .unwrap();
            c.all_reduce_sum(&b, &x, 1)?;
            c.synchronize(&b)?;
            Ok(b.download(&x).unwrap())
        })
    };
    let rank0 = rank(Some(server), Arc::clone(&met));
    let rank1 = rank(None, Arc::clone(&met));
    met.wait();
    armed.store(true, Ordering::SeqCst);
    met.wait();
    (rank0.join().unwrap(), rank1.join().unwrap())
}

/// Rank 0 stopped on the bad frame `seq` (a typed `PeerFailed` naming it); rank 1 with an
/// error.
#[allow(clippy::print_stdout)]
fn stopped_on_a_bad_frame(
    case: &str,
    rank0: zcomm::Result<Vec<f32>>,
    rank1: zcomm::Result<Vec<f32>>,
    seq: u64,
) {
    let e = match rank0 {
        Ok(sums) => panic!(
            "{case}: rank 0 summed {:?}.. as if nothing happened",
            &sums[..2]
        ),
        Err(e) => e,
    };
    assert!(matches!(e, CommError::PeerFailed { .. }), "{case}: {e:?}");
    assert!(
        e.to_string().contains(&format!("bad frame #{seq} ")),
        "{case}: {e}"
    );
    let e1 = rank1.expect_err("rank 1 went on after rank 0 stopped");
    println!("{case}: rank 0 stopped: {e}; rank 1: {e1}");
}

/// Copies `from` to `to` untouched until `armed`; then `tamper` on the records that follow,
/// and the rest untouched.
fn forward(mut from: TcpStream, mut to: TcpStream, armed: &AtomicBool, tamper: Tamper) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        // Everything of the handshake was read (and forwarded) before the relay was armed:
        // what comes after is records.
        if armed.load(Ordering::SeqCst) {
            let mut rest = std::io::Cursor::new(buf[..n].to_vec()).chain(from);
            let _ = to.write_all(&tamper.apply(&mut rest));
            let _ = std::io::copy(&mut rest, &mut to);
            break;
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
}

fn pipe(from: &TcpStream, to: &TcpStream) {
    let (mut from, mut to) = (from.try_clone().unwrap(), to.try_clone().unwrap());
    thread::spawn(move || {
        let _ = std::io::copy(&mut from, &mut to);
        let _ = to.shutdown(std::net::Shutdown::Write);
    });
}

/// What the child's `tracing` subscriber writes: rank 0's bind log, read back.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl Log {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl Write for Log {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
