//! The connection between a rank and rank 0 after the handshake: every byte either way travels
//! in a record under a MAC (HMAC-SHA-256) with a key of its own direction, derived from the
//! handshake (both nonces, the rank, the world, rank 0's job id and the rendezvous address:
//! `handshake::Transcript::keys`), and an implicit sequence number. Something between the two
//! that alters, drops, reorders or replays a record, reflects one back, or splices in a record
//! of another connection or another job fails the next check: the read returns an error
//! carrying [`BadFrame`], and the rank stops.
//!
//! ```text
//! record: len u32 (1..=MAX_RECORD) | payload[len] | HMAC(k_dir, seq u64 | len | payload)
//! ```
//!
//! A length past [`MAX_RECORD`] is refused before anything is allocated. The stream of
//! records is a byte stream to its users (`read_exact`, `write_all`), so frames of any size
//! cross it.

use super::io::{read_exact, write_all};
use super::stream::Stream;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::time::Instant;

/// Longest record payload: bounds what one unchecked length may make a rank allocate.
pub const MAX_RECORD: usize = 256 << 10;
const TAG: usize = 32;

/// Why a record was refused: not what the peer sent under the job's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadFrame {
    /// The record's place in its direction (0 is the first after the handshake).
    pub seq: u64,
    /// What was wrong.
    pub detail: String,
}

impl std::fmt::Display for BadFrame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "bad frame #{} on the authenticated channel ({}): altered, replayed, reordered or from another connection or job",
            self.seq, self.detail
        )
    }
}

impl std::error::Error for BadFrame {}

impl BadFrame {
    /// The `BadFrame` inside an I/O error from [`Channel::read_exact`], if that is what it is.
    #[must_use]
    pub fn of(e: &std::io::Error) -> Option<&BadFrame> {
        e.get_ref()
            .and_then(|inner| inner.downcast_ref::<BadFrame>())
    }
}

/// One direction's keyed MAC (cloned for each record) and its next sequence number.
#[derive(Clone)]
struct Direction {
    keyed: Hmac<Sha256>,
    seq: u64,
}

impl Direction {
    fn mac(&self, payload: &[u8]) -> Hmac<Sha256> {
        let mut m = self.keyed.clone();
        m.update(&self.seq.to_le_bytes());
        m.update(&(payload.len() as u32).to_le_bytes());
        m.update(payload);
        m
    }
}

/// An authenticated connection to one peer (see the module docs).
pub struct Channel {
    stream: Stream,
    // Boxed: a keyed HMAC state is a few hundred bytes, and channels sit in enums and vectors.
    send: Box<Direction>,
    recv: Box<Direction>,
    /// Payload of the last record read, not yet handed out, from `at`.
    pending: Vec<u8>,
    at: usize,
}

impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Channel")
            .field("peer", &self.stream.peer())
            .field("sent", &self.send.seq)
            .field("received", &self.recv.seq)
            .finish_non_exhaustive()
    }
}

impl Channel {
    pub(crate) fn new(stream: Stream, send: Hmac<Sha256>, recv: Hmac<Sha256>) -> Channel {
        Channel {
            stream,
            send: Box::new(Direction {
                keyed: send,
                seq: 0,
            }),
            recv: Box::new(Direction {
                keyed: recv,
                seq: 0,
            }),
            pending: Vec::new(),
            at: 0,
        }
    }

    /// The connection underneath (TCP or a Unix socket; writing to it directly breaks the
    /// channel).
    #[must_use]
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// Sends `buf` in records, every write bounded by `deadline`.
    pub fn write_all(&mut self, buf: &[u8], deadline: Instant) -> std::io::Result<()> {
        for chunk in buf.chunks(MAX_RECORD) {
            let tag = self.send.mac(chunk).finalize().into_bytes();
            let mut record = Vec::with_capacity(4 + chunk.len() + TAG);
            record.extend_from_slice(&(chunk.len() as u32).to_le_bytes());
            record.extend_from_slice(chunk);
            record.extend_from_slice(&tag);
            write_all(&mut self.stream, &record, deadline)?;
            self.send.seq += 1;
        }
        Ok(())
    }

    /// Fills `buf` from checked records, every read bounded by `deadline`. A record that
    /// fails its check is an `InvalidData` error carrying [`BadFrame`]; the channel is of no
    /// use after it.
    pub fn read_exact(&mut self, buf: &mut [u8], deadline: Instant) -> std::io::Result<()> {
        let mut filled = 0;
        while filled < buf.len() {
            if self.at == self.pending.len() {
                self.next_record(deadline)?;
            }
            let n = (self.pending.len() - self.at).min(buf.len() - filled);
            buf[filled..filled + n].copy_from_slice(&self.pending[self.at..self.at + n]);
            self.at += n;
            filled += n;
        }
        Ok(())
    }

    fn next_record(&mut self, deadline: Instant) -> std::io::Result<()> {
        let bad = |seq: u64, detail: String| {
            std::io::Error::new(std::io::ErrorKind::InvalidData, BadFrame { seq, detail })
        };
        let seq = self.recv.seq;
        let mut head = [0u8; 4];
        read_exact(&mut self.stream, &mut head, deadline)?;
        let len = u32::from_le_bytes(head) as usize;
        if len == 0 || len > MAX_RECORD {
            return Err(bad(
                seq,
                format!("a length of {len} bytes, outside 1..={MAX_RECORD}"),
            ));
        }
        // `len` is at most MAX_RECORD: checked before this allocation.
        let mut record = vec![0u8; len + TAG];
        read_exact(&mut self.stream, &mut record, deadline)?;
        let tag = record.split_off(len);
        if self.recv.mac(&record).verify_slice(&tag).is_err() {
            return Err(bad(seq, "its MAC does not check".into()));
        }
        self.recv.seq += 1;
        self.pending = record;
        self.at = 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read as _, Write as _};
    use std::net::{TcpListener, TcpStream};
    use std::time::Duration;

    fn keyed(k: u8) -> Hmac<Sha256> {
        <Hmac<Sha256> as Mac>::new_from_slice(&[k; 32]).expect("any key length")
    }

    fn pair() -> (Stream, Stream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        (Stream::Tcp(a), Stream::Tcp(l.accept().unwrap().0))
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(10)
    }

    /// The records a sender with key `send` writes for `frames`, as bytes on the wire.
    fn records(send: u8, frames: &[&[u8]]) -> Vec<Vec<u8>> {
        let (a, mut raw) = pair();
        let mut tx = Channel::new(a, keyed(send), keyed(99));
        frames
            .iter()
            .map(|f| {
                tx.write_all(f, soon()).unwrap();
                let mut r = vec![0u8; 4 + f.len() + TAG];
                raw.read_exact(&mut r).unwrap();
                r
            })
            .collect()
    }

    /// A receiver expecting key `recv` fed `wire`; what it reads (frames of `len` bytes) until
    /// the first failure.
    fn receive(recv: u8, wire: &[u8], len: usize, frames: usize) -> Result<(), BadFrame> {
        let (mut raw, b) = pair();
        raw.write_all(wire).unwrap();
        let mut rx = Channel::new(b, keyed(98), keyed(recv));
        for _ in 0..frames {
            let mut buf = vec![0u8; len];
            if let Err(e) = rx.read_exact(&mut buf, soon()) {
                return Err(BadFrame::of(&e)
                    .cloned()
                    .expect("a bad frame, not an I/O error"));
            }
        }
        Ok(())
    }

    #[test]
    fn frames_cross_intact_and_every_alteration_is_a_bad_frame() {
        let r = records(1, &[b"gradient one", b"gradient two"]);
        let both = [r[0].clone(), r[1].clone()].concat();
        assert_eq!(receive(1, &both, 12, 2), Ok(()));
        // A float rewritten on the way.
        let mut flipped = r[0].clone();
        flipped[6] ^= 0x40;
        assert_eq!(receive(1, &flipped, 12, 1).unwrap_err().seq, 0);
        // Replayed, reordered.
        let replayed = [r[0].clone(), r[0].clone()].concat();
        assert_eq!(receive(1, &replayed, 12, 2).unwrap_err().seq, 1);
        let reordered = [r[1].clone(), r[0].clone()].concat();
        assert_eq!(receive(1, &reordered, 12, 2).unwrap_err().seq, 0);
        // Reflected (the receiver's own direction) or spliced from another connection.
        assert!(receive(98, &r[0], 12, 1).is_err());
        assert!(receive(2, &r[0], 12, 1).is_err());
        let e = receive(1, &flipped, 12, 1).unwrap_err();
        assert!(e.to_string().contains("bad frame #0"), "{e}");
    }

    #[test]
    fn a_record_length_past_the_limit_is_refused_before_anything_is_allocated() {
        let wire = u32::MAX.to_le_bytes();
        let e = receive(1, &wire, 4, 1).unwrap_err();
        assert!(e.detail.contains("outside 1..="), "{e}");
    }

    #[test]
    fn a_frame_longer_than_a_record_crosses_in_several() {
        let big: Vec<u8> = (0..MAX_RECORD * 2 + 5).map(|i| (i % 251) as u8).collect();
        let (a, b) = pair();
        let mut tx = Channel::new(a, keyed(1), keyed(2));
        let mut rx = Channel::new(b, keyed(2), keyed(1));
        let sent = big.clone();
        let writer = std::thread::spawn(move || tx.write_all(&sent, soon()).map(|()| tx.send.seq));
        let mut got = vec![0u8; big.len()];
        rx.read_exact(&mut got, soon()).unwrap();
        assert_eq!(writer.join().unwrap().unwrap(), 3);
        assert_eq!(got, big);
    }
}
