//! The rendezvous's frames and its mutual challenge-response (protocol version 3). Every
//! integer is a little-endian u64; every frame has a fixed length or a length checked against
//! [`MAX_PAYLOAD`] before anything is allocated.
//!
//! ```text
//! rank -> rank 0   hello:     "ZCRV" | version | rank | world | nonce_r[32]            (60 bytes)
//! rank 0 -> rank   challenge: "ZCRV" | nonce_0[32] | job[16] | HMAC(k, "rank 0" | T)  (84)
//! rank -> rank 0   proof:     HMAC(k, "rank" | T)                                       (32)
//! rank 0 -> rank   outcome:   status u8 | len | payload | HMAC(k, "outcome" | T | status
//!                             | payload)   (status 0: the id; 1: why refused)
//!     T = hello | nonce_0 | job | the rendezvous address (`MASTER_ADDR:MASTER_PORT`)
//! ```
//!
//! HMAC-SHA-256 (RustCrypto), tags compared in constant time. The secret never travels; each
//! side's tag covers the other's fresh nonce, so a recorded exchange proves nothing later, and
//! the two directions use different labels, so one side's tag is never the other's. Rank 0
//! answers nothing about the job (its world, the id) before the rank's proof checks.
//!
//! The transcript binds the job: `job` is chosen at random by rank 0 for this rendezvous, and
//! each side puts in the address as *it* was given it, so a rank relayed to another job's rank
//! 0 (two jobs that share a secret) finds rank 0's proof wrong and stops. After the outcome,
//! every byte either way is under a MAC with a key of its direction derived from `T`
//! ([`Transcript::keys`], the `channel` module).

use super::io::{read_exact, read_exact_until, write_all};
use super::stream::Stream;
use super::{Cancel, Who};
use crate::secret::Auth;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::time::Instant;

pub(crate) const MAGIC: &[u8; 4] = b"ZCRV";
pub(crate) const VERSION: u64 = 3;
const NONCE: usize = 32;
const TAG: usize = 32;
/// Rank 0's random identity of one rendezvous.
pub(crate) const JOB_ID: usize = 16;
pub(crate) const HELLO_LEN: usize = 4 + 8 + 8 + 8 + NONCE;
const CHALLENGE_LEN: usize = 4 + NONCE + JOB_ID + TAG;
/// Longest id or refusal on the wire (NCCL's id is 128 bytes).
pub(crate) const MAX_PAYLOAD: u64 = 64 << 10;
pub(crate) const WELCOME: u8 = 0;
pub(crate) const REFUSED: u8 = 1;

const LABEL_RANK0: &[u8] = b"zcomm rendezvous v3: rank 0";
const LABEL_RANK: &[u8] = b"zcomm rendezvous v3: rank";
const LABEL_OUTCOME: &[u8] = b"zcomm rendezvous v3: outcome";
const LABEL_KEY_UP: &[u8] = b"zcomm channel v3: rank to rank 0";
const LABEL_KEY_DOWN: &[u8] = b"zcomm channel v3: rank 0 to rank";

/// What both ends of one handshake share once it is done: every later tag covers it.
#[derive(Debug)]
pub(crate) struct Transcript {
    hello: [u8; HELLO_LEN],
    nonce0: [u8; NONCE],
    job: [u8; JOB_ID],
    addr: String,
}

impl Transcript {
    fn parts(&self) -> [&[u8]; 4] {
        [&self.hello, &self.nonce0, &self.job, self.addr.as_bytes()]
    }

    /// The channel's keyed MACs: (rank to rank 0, rank 0 to rank), each under a key derived
    /// from the secret and the whole transcript (HMAC as the PRF), so no two connections,
    /// directions or jobs share one.
    pub(crate) fn keys(&self, auth: &Auth) -> std::io::Result<(Hmac<Sha256>, Hmac<Sha256>)> {
        let derive = |label: &[u8]| {
            tag(&sign(auth.key(), label, &self.parts()), b"", &[])
                .ok_or_else(|| std::io::Error::other("deriving the channel keys"))
        };
        Ok((derive(LABEL_KEY_UP)?, derive(LABEL_KEY_DOWN)?))
    }
}

fn tag(key: &[u8], label: &[u8], parts: &[&[u8]]) -> Option<Hmac<Sha256>> {
    // HMAC takes keys of any length: this never fails.
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).ok()?;
    m.update(label);
    for p in parts {
        m.update(&(p.len() as u64).to_le_bytes());
        m.update(p);
    }
    Some(m)
}

fn sign(key: &[u8], label: &[u8], parts: &[&[u8]]) -> [u8; TAG] {
    let mut out = [0u8; TAG];
    if let Some(m) = tag(key, label, parts) {
        out.copy_from_slice(&m.finalize().into_bytes());
    }
    out
}

/// Constant-time check of `got` against the tag of `parts`.
fn verify(key: &[u8], label: &[u8], parts: &[&[u8]], got: &[u8]) -> bool {
    tag(key, label, parts).is_some_and(|m| m.verify_slice(got).is_ok())
}

pub(crate) fn nonce() -> std::io::Result<[u8; NONCE]> {
    let mut n = [0u8; NONCE];
    getrandom::fill(&mut n).map_err(|e| std::io::Error::other(format!("random nonce: {e}")))?;
    Ok(n)
}

fn word(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// Rank 0's side, up to the rank's proof: who the peer is, or why it is dropped (the peer is
/// told nothing then).
pub(crate) fn greet(
    s: &mut Stream,
    auth: &Auth,
    deadline: Instant,
    job: [u8; JOB_ID],
    addr: &str,
) -> Result<(u64, u64, Transcript), String> {
    let mut hello = [0u8; HELLO_LEN];
    read_exact(s, &mut hello, deadline).map_err(|e| format!("no greeting: {e}"))?;
    if &hello[..4] != MAGIC {
        return Err(format!(
            "garbage on the wire: {:02x?} is not a rank's greeting",
            &hello[..4]
        ));
    }
    let version = word(&hello, 4);
    if version != VERSION {
        return Err(format!(
            "protocol version {version} (rank 0 speaks {VERSION})"
        ));
    }
    let (rank, world) = (word(&hello, 12), word(&hello, 20));
    let nonce0 = nonce().map_err(|e| e.to_string())?;
    let t = Transcript {
        hello,
        nonce0,
        job,
        addr: addr.to_string(),
    };
    let mut challenge = MAGIC.to_vec();
    challenge.extend_from_slice(&nonce0);
    challenge.extend_from_slice(&job);
    challenge.extend_from_slice(&sign(auth.key(), LABEL_RANK0, &t.parts()));
    write_all(s, &challenge, deadline).map_err(|e| format!("sending the challenge: {e}"))?;
    let mut proof = [0u8; TAG];
    read_exact(s, &mut proof, deadline).map_err(|e| format!("no proof: {e}"))?;
    if !verify(auth.key(), LABEL_RANK, &t.parts(), &proof) {
        return Err("it does not hold the job secret (its proof failed)".into());
    }
    Ok((rank, world, t))
}

/// Rank 0's last word to a rank: the id (`WELCOME`) or why it is refused, under a tag.
pub(crate) fn outcome(status: u8, payload: &[u8], t: &Transcript, auth: &Auth) -> Vec<u8> {
    let mut msg = vec![status];
    msg.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    msg.extend_from_slice(payload);
    let [hello, nonce0, job, addr] = t.parts();
    let mac = sign(
        auth.key(),
        LABEL_OUTCOME,
        &[hello, nonce0, job, addr, &[status], payload],
    );
    msg.extend_from_slice(&mac);
    msg
}

/// Why a rank's side of the handshake failed.
#[derive(Debug)]
pub(crate) enum JoinFailure {
    Io(&'static str, std::io::Error),
    /// The peer is not this protocol, or did not prove it holds the secret.
    Bad(String),
    /// Rank 0 refused (its reason).
    Refused(String),
}

/// A rank's side, on a connection to rank 0 at `addr` (as this rank was given it): greets,
/// checks rank 0's proof, proves itself, and waits (until `deadline`, or `cancel`) for the id.
/// Returns the id and the transcript the channel's keys come from.
pub(crate) fn join(
    s: &mut Stream,
    who: Who,
    auth: &Auth,
    addr: &str,
    deadline: Instant,
    cancel: Option<&Cancel>,
) -> Result<(Vec<u8>, Transcript), JoinFailure> {
    let mut hello = [0u8; HELLO_LEN];
    hello[..4].copy_from_slice(MAGIC);
    hello[4..12].copy_from_slice(&VERSION.to_le_bytes());
    hello[12..20].copy_from_slice(&(who.rank as u64).to_le_bytes());
    hello[20..28].copy_from_slice(&(who.world as u64).to_le_bytes());
    hello[28..].copy_from_slice(&nonce().map_err(|e| JoinFailure::Io("making a nonce", e))?);
    write_all(s, &hello, deadline).map_err(|e| JoinFailure::Io("greeting rank 0", e))?;
    let mut challenge = [0u8; CHALLENGE_LEN];
    read_exact_until(s, &mut challenge, deadline, cancel)
        .map_err(|e| JoinFailure::Io("waiting for rank 0's challenge", e))?;
    if &challenge[..4] != MAGIC {
        return Err(JoinFailure::Bad(format!(
            "garbage on the wire: rank 0 answered {:02x?}, not this protocol",
            &challenge[..4]
        )));
    }
    let mut nonce0 = [0u8; NONCE];
    nonce0.copy_from_slice(&challenge[4..4 + NONCE]);
    let mut job = [0u8; JOB_ID];
    job.copy_from_slice(&challenge[4 + NONCE..4 + NONCE + JOB_ID]);
    let t = Transcript {
        hello,
        nonce0,
        job,
        addr: addr.to_string(),
    };
    if !verify(
        auth.key(),
        LABEL_RANK0,
        &t.parts(),
        &challenge[4 + NONCE + JOB_ID..],
    ) {
        return Err(JoinFailure::Bad(format!(
            "the process listening there did not prove it holds the job secret for the rendezvous at {addr}: another process squats rank 0's port or relays another job, rank 0 has another secret (ZCOMM_SECRET), or its MASTER_ADDR:MASTER_PORT is not written as this rank's"
        )));
    }
    let proof = sign(auth.key(), LABEL_RANK, &t.parts());
    write_all(s, &proof, deadline).map_err(|e| JoinFailure::Io("proving the secret", e))?;
    let id = read_outcome(s, &t, auth, deadline, cancel)?;
    Ok((id, t))
}

fn read_outcome(
    s: &mut Stream,
    t: &Transcript,
    auth: &Auth,
    deadline: Instant,
    cancel: Option<&Cancel>,
) -> Result<Vec<u8>, JoinFailure> {
    let waiting = "waiting for the id (rank 0 gone?)";
    let mut head = [0u8; 9];
    read_exact_until(s, &mut head, deadline, cancel).map_err(|e| JoinFailure::Io(waiting, e))?;
    let status = head[0];
    let len = word(&head, 1);
    if ![WELCOME, REFUSED].contains(&status) || len > MAX_PAYLOAD {
        return Err(JoinFailure::Bad(format!(
            "garbage on the wire: status {status:#x} with a {len}-byte payload"
        )));
    }
    // `len` is at most MAX_PAYLOAD: checked before this allocation.
    let mut payload = vec![0u8; len as usize + TAG];
    read_exact_until(s, &mut payload, deadline, cancel)
        .map_err(|e| JoinFailure::Io("reading the id", e))?;
    let mac = payload.split_off(len as usize);
    let [hello, nonce0, job, addr] = t.parts();
    if !verify(
        auth.key(),
        LABEL_OUTCOME,
        &[hello, nonce0, job, addr, &[status], &payload],
        &mac,
    ) {
        return Err(JoinFailure::Bad(
            "rank 0's answer failed its check (altered on the way)".into(),
        ));
    }
    if status == REFUSED {
        return Err(JoinFailure::Refused(
            String::from_utf8_lossy(&payload).into_owned(),
        ));
    }
    Ok(payload)
}
