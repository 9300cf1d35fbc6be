//! The simulated communicator's exchange: a star through rank 0 over the rendezvous's TCP
//! connections. Every rank sends its buffer to rank 0; rank 0 sums in rank order (0, 1, 2, ...,
//! so every rank gets the same bits, run after run) or picks the root's buffer, and sends the
//! result back. A rank that fails tells rank 0 (an abort frame), and rank 0 tells the rest; a
//! closed connection or a passed deadline is reported the same way, so every rank returns.

use crate::RankInfo;
use crate::error::{CommError, Silent};
use crate::rendezvous::{BadFrame, Channel, Stream};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const MAGIC: &[u8; 4] = b"ZCSM";
const HEADER: usize = 32;
/// Longest reason an abort frame may carry.
const MAX_ABORT_TEXT: u64 = 4 << 10;

/// What a frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    /// A rank's buffer, to rank 0.
    Data = 1,
    /// The combined buffer, from rank 0.
    Result = 2,
    /// A failure (UTF-8 text): the sender gives up and so must the receiver.
    Abort = 3,
}

/// One collective's identity: every rank must agree on it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Call {
    pub op: &'static str,
    /// Sequence number of the collective on this communicator.
    pub seq: u64,
    pub step: u64,
    /// Broadcast root; None for an all-reduce.
    pub root: Option<usize>,
}

/// A rank's side of the star.
#[derive(Debug)]
pub(crate) enum Star {
    /// Rank 0: `peers[r - 1]` is rank r's connection.
    Hub(Vec<Mutex<Channel>>),
    /// Any other rank: its connection to rank 0.
    Spoke(Mutex<Channel>),
}

struct Frame {
    kind: Kind,
    rank: u64,
    seq: u64,
    payload: Vec<u8>,
}

/// Why an exchange failed, before it is turned into a `CommError`.
enum Failure {
    /// The peer (where one rank was waited for) did not answer by the deadline.
    Timeout(Option<usize>),
    Peer(String),
    /// The peer's connection is gone (its process died): the detail.
    Vanished(usize, String),
}

/// An exchange's error and the peer it found silent (timed out or vanished), if it did.
pub(crate) struct ExchangeError {
    /// (Boxed: it keeps the exchange's result small.)
    pub error: Box<CommError>,
    pub silent: Option<usize>,
}

impl Star {
    /// Runs one collective on `data` (this rank's buffer), returning the combined buffer.
    pub fn exchange(
        &self,
        rank: usize,
        world: usize,
        call: Call,
        data: &[f32],
        timeout: Duration,
    ) -> Result<Vec<f32>, ExchangeError> {
        // Rank 0 gives up on a silent peer at 4/5 of the deadline, so that the others, waiting
        // the whole of it, learn which rank stalled (rather than all timing out at once).
        let waited = match self {
            Star::Hub(_) => timeout.mul_f64(0.8),
            Star::Spoke(_) => timeout,
        };
        let deadline = Instant::now() + waited;
        let out = match self {
            Star::Hub(peers) => hub(peers, world, call, data, deadline),
            Star::Spoke(s) => spoke(s, rank, call, data, deadline),
        };
        let info = RankInfo {
            rank,
            world,
            local_rank: 0,
        };
        let failed = |detail| {
            Box::new(CommError::PeerFailed {
                rank,
                op: call.op,
                step: call.step,
                detail,
            })
        };
        out.map_err(|f| match f {
            Failure::Timeout(silent) => ExchangeError {
                error: Box::new(CommError::Timeout {
                    rank,
                    op: call.op,
                    step: call.step,
                    waited_for: waited,
                    silent: Silent::of(info, silent, "rank 0 relays every exchange"),
                }),
                silent,
            },
            Failure::Peer(detail) => ExchangeError {
                error: failed(detail),
                silent: None,
            },
            Failure::Vanished(peer, detail) => ExchangeError {
                error: failed(detail),
                silent: Some(peer),
            },
        })
    }

    /// This rank's connections, in order (rank 0's: rank 1, 2, ...).
    fn channels(&self) -> Vec<&Mutex<Channel>> {
        match self {
            Star::Hub(p) => p.iter().collect(),
            Star::Spoke(s) => vec![s],
        }
    }

    /// A second handle on each connection's socket ([`Star::abort`] cuts with it, without
    /// the connection's lock).
    pub fn cutters(&self) -> std::io::Result<Vec<Stream>> {
        self.channels()
            .into_iter()
            .map(|p| lock(p).stream().try_clone())
            .collect()
    }

    /// Tells the other side(s) this rank gives up (best effort, bounded by `timeout`). A
    /// connection held past `timeout` by an exchange (blocked on a silent peer, as an NCCL
    /// enqueue behind a full queue: the abort may come from another thread, the watchdog's)
    /// is cut through its handle in `cutters` instead, so the abort never waits for that
    /// exchange's deadline and the exchange returns at once (issue 44).
    pub fn abort(&self, rank: usize, why: &str, timeout: Duration, cutters: &[Stream]) {
        let deadline = Instant::now() + timeout;
        let frame = encode(Kind::Abort, rank, u64::MAX, why.as_bytes());
        for (i, p) in self.channels().into_iter().enumerate() {
            match lock_by(p, deadline) {
                Some(mut c) => {
                    let _ = c.write_all(&frame, deadline);
                }
                None => {
                    if let Some(cut) = cutters.get(i) {
                        let _ = cut.shutdown();
                    }
                }
            }
        }
    }
}

/// `m`'s lock if it comes by `deadline` (polled: a holder may be blocked until far later).
fn lock_by<T>(m: &Mutex<T>, deadline: Instant) -> Option<std::sync::MutexGuard<'_, T>> {
    loop {
        match m.try_lock() {
            Ok(g) => return Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => return Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) if Instant::now() >= deadline => return None,
            Err(std::sync::TryLockError::WouldBlock) => {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

fn hub(
    peers: &[Mutex<Channel>],
    world: usize,
    call: Call,
    data: &[f32],
    deadline: Instant,
) -> Result<Vec<f32>, Failure> {
    let mut acc = match call.root {
        Some(0) | None => data.to_vec(),
        Some(_) => Vec::new(),
    };
    for r in 1..world {
        // What rank r must send: its buffer, or nothing (a broadcast it does not root).
        let expect = match call.root {
            Some(root) if root != r => 0,
            _ => data.len() * 4,
        };
        let got = recv(&peers[r - 1], r, call, expect, deadline).and_then(|f| {
            if f.kind != Kind::Data {
                return Err(Failure::Peer(format!(
                    "rank {r} sent {:?}, not its buffer",
                    f.kind
                )));
            }
            floats(&f.payload, r)
        });
        let got = match got {
            Ok(g) => g,
            Err(f) => {
                let why = match &f {
                    Failure::Timeout(_) => format!(
                        "rank {r} did not join {} of step {} before the deadline",
                        call.op, call.step
                    ),
                    Failure::Peer(d) | Failure::Vanished(_, d) => d.clone(),
                };
                abort_all(peers, &why, deadline);
                return Err(match f {
                    Failure::Timeout(_) => Failure::Timeout(Some(r)),
                    Failure::Peer(_) => Failure::Peer(why),
                    Failure::Vanished(..) => Failure::Vanished(r, why),
                });
            }
        };
        match call.root {
            None if got.len() != data.len() => {
                let why = format!(
                    "rank {r} all-reduces {} values, rank 0 {}",
                    got.len(),
                    data.len()
                );
                abort_all(peers, &why, deadline);
                return Err(Failure::Peer(why));
            }
            None => {
                for (a, g) in acc.iter_mut().zip(&got) {
                    *a += *g;
                }
            }
            Some(root) if root == r => acc = got,
            Some(_) => {}
        }
    }
    if acc.len() != data.len() {
        let why = format!(
            "the broadcast root sent {} values, rank 0 expects {}",
            acc.len(),
            data.len()
        );
        abort_all(peers, &why, deadline);
        return Err(Failure::Peer(why));
    }
    let frame = encode(Kind::Result, 0, call.seq, &bytes(&acc));
    for (i, p) in peers.iter().enumerate() {
        lock(p)
            .write_all(&frame, deadline)
            .map_err(|e| io_failure(e, i + 1))?;
    }
    Ok(acc)
}

fn spoke(
    s: &Mutex<Channel>,
    rank: usize,
    call: Call,
    data: &[f32],
    deadline: Instant,
) -> Result<Vec<f32>, Failure> {
    let mine = match call.root {
        Some(root) if root != rank => Vec::new(),
        _ => bytes(data),
    };
    let frame = encode(Kind::Data, rank, call.seq, &mine);
    let sent = lock(s).write_all(&frame, deadline);
    if let Err(e) = sent {
        return Err(relayed_reason(s, call, io_failure(e, 0)));
    }
    let f = recv(s, 0, call, data.len() * 4, deadline)?;
    if f.kind != Kind::Result {
        return Err(Failure::Peer(format!(
            "rank 0 sent {:?}, not the result",
            f.kind
        )));
    }
    let out = floats(&f.payload, 0)?;
    if out.len() != data.len() {
        return Err(Failure::Peer(format!(
            "rank 0 sent {} values for a buffer of {}",
            out.len(),
            data.len()
        )));
    }
    Ok(out)
}

/// What to report when this rank's write to rank 0 failed with `failed`. When rank 0's
/// connection is gone, rank 0 may have given up first (a peer died), said why in an abort frame
/// and exited before this rank's buffer reached it: that frame is still in this connection's
/// receive queue, and it names the rank that failed, where `failed` would name rank 0, which
/// only relayed it. Anything else (nothing queued, another frame) leaves `failed` as it is.
fn relayed_reason(s: &Mutex<Channel>, call: Call, failed: Failure) -> Failure {
    if !matches!(failed, Failure::Vanished(..)) {
        return failed;
    }
    // Queued bytes read at once; a connection with nothing queued is at its end (rank 0
    // exited), so the wait is bounded by this short deadline only in the unlikely case that
    // the write failed while rank 0 still lives.
    let deadline = Instant::now() + Duration::from_millis(100);
    match recv(s, 0, call, 0, deadline) {
        Err(Failure::Peer(why)) if why.starts_with("rank 0 gave up: ") => Failure::Peer(why),
        _ => failed,
    }
}

/// Reads one frame from rank `from`; an abort or a frame of another collective is a failure.
/// Its length is checked before anything is allocated: `expect` bytes for a buffer (what this
/// collective needs, nothing more), a short text for an abort.
fn recv(
    s: &Mutex<Channel>,
    from: usize,
    call: Call,
    expect: usize,
    deadline: Instant,
) -> Result<Frame, Failure> {
    let mut s = lock(s);
    let mut h = [0u8; HEADER];
    s.read_exact(&mut h, deadline)
        .map_err(|e| io_failure(e, from))?;
    if &h[..4] != MAGIC {
        return Err(Failure::Peer(format!(
            "garbage on the wire from rank {from}"
        )));
    }
    let kind = match h[4] {
        1 => Kind::Data,
        2 => Kind::Result,
        3 => Kind::Abort,
        k => return Err(Failure::Peer(format!("rank {from} sent frame kind {k:#x}"))),
    };
    let word = |i: usize| u64::from_le_bytes(h[i..i + 8].try_into().unwrap_or([0; 8]));
    let (rank, seq, n) = (word(8), word(16), word(24));
    let fits = match kind {
        Kind::Abort => n <= MAX_ABORT_TEXT,
        Kind::Data | Kind::Result => n == expect as u64,
    };
    if !fits {
        return Err(Failure::Peer(format!(
            "garbage on the wire from rank {from}: a {n}-byte {kind:?} frame where this {} needs {expect} bytes",
            call.op
        )));
    }
    // n is at most `expect` (a buffer this rank holds) or MAX_ABORT_TEXT: it fits a usize.
    let mut payload = vec![0u8; n as usize];
    s.read_exact(&mut payload, deadline)
        .map_err(|e| io_failure(e, from))?;
    let frame = Frame {
        kind,
        rank,
        seq,
        payload,
    };
    if frame.kind == Kind::Abort {
        return Err(Failure::Peer(format!(
            "rank {} gave up: {}",
            frame.rank,
            String::from_utf8_lossy(&frame.payload)
        )));
    }
    if frame.seq != call.seq || frame.rank != from as u64 {
        return Err(Failure::Peer(format!(
            "rank {} is out of step: collective #{} from it, #{} here ({})",
            frame.rank, frame.seq, call.seq, call.op
        )));
    }
    Ok(frame)
}

fn abort_all(peers: &[Mutex<Channel>], why: &str, deadline: Instant) {
    // Bounded even when the deadline has passed: a peer that reads nothing must not hold us.
    let deadline = deadline.max(Instant::now() + Duration::from_millis(200));
    let frame = encode(Kind::Abort, 0, u64::MAX, abort_text(why));
    for p in peers {
        let _ = lock(p).write_all(&frame, deadline);
    }
}

/// Whether `e`, from [`Star::exchange`], says a peer stopped answering (a timeout, or its
/// connection gone: a process stopped or killed) rather than that it gave up and said so.
pub(crate) fn peer_went_silent(e: &CommError) -> bool {
    match e {
        CommError::Timeout { .. } => true,
        CommError::PeerFailed { detail, .. } => detail.contains(VANISHED),
        _ => false,
    }
}

/// Whether an exchange's error says a peer's connection is gone (its process died), rather
/// than that it stopped answering.
pub(crate) fn peer_died(e: &CommError) -> bool {
    matches!(e, CommError::PeerFailed { detail, .. } if detail.contains(VANISHED))
}

/// How an exchange's error says a peer's connection is gone.
const VANISHED: &str = " vanished: ";

fn io_failure(e: std::io::Error, peer: usize) -> Failure {
    if let Some(bad) = BadFrame::of(&e) {
        // Not the peer's doing: something between the two altered the stream.
        return Failure::Peer(format!("from rank {peer}: {bad}"));
    }
    if e.kind() == std::io::ErrorKind::TimedOut {
        Failure::Timeout(Some(peer))
    } else {
        Failure::Vanished(peer, format!("rank {peer}{VANISHED}{e}"))
    }
}

fn encode(kind: Kind, rank: usize, seq: u64, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(HEADER + payload.len());
    f.extend_from_slice(MAGIC);
    f.extend_from_slice(&[kind as u8, 0, 0, 0]);
    f.extend_from_slice(&(rank as u64).to_le_bytes());
    f.extend_from_slice(&seq.to_le_bytes());
    f.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    debug_assert_eq!(f.len(), HEADER);
    f.extend_from_slice(payload);
    f
}

/// At most MAX_ABORT_TEXT bytes of `why` (cut at a character boundary).
fn abort_text(why: &str) -> &[u8] {
    let mut end = why.len().min(MAX_ABORT_TEXT as usize);
    while !why.is_char_boundary(end) {
        end -= 1;
    }
    &why.as_bytes()[..end]
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn floats(b: &[u8], from: usize) -> Result<Vec<f32>, Failure> {
    if !b.len().is_multiple_of(4) {
        return Err(Failure::Peer(format!(
            "rank {from} sent {} bytes, not floats",
            b.len()
        )));
    }
    Ok(b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
