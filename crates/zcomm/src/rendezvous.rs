//! Rank 0 hands a job's unique id (NCCL's `ncclUniqueId`, or the simulated communicator's) to
//! every other rank over TCP. Rank 0 listens on `MASTER_ADDR:MASTER_PORT`; every other rank
//! connects, says who it is, and receives the id once the whole world has checked in. Every
//! connect, accept, read and write is bounded by one deadline; a wrong world size, a rank
//! claimed twice, a rank outside the world, or bytes that are not this protocol are refused
//! with a typed [`CommError::Rendezvous`] on both ends.
//!
//! The connections stay open for callers that want them (the simulated communicator exchanges
//! its buffers over them); `exchange_id` drops them once the id is out.

use crate::RankInfo;
use crate::env::Master;
use crate::error::{CommError, Result};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

const MAGIC: &[u8; 4] = b"ZCRV";
const VERSION: u32 = 1;
/// Longest id or refusal accepted from the wire (NCCL's id is 128 bytes).
const MAX_PAYLOAD: u32 = 64 << 10;
const WELCOME: u8 = 0;
const REFUSED: u8 = 1;

/// Rank 0's listening socket.
#[derive(Debug)]
pub struct Server {
    listener: TcpListener,
    addr: String,
}

/// The connections rank 0 holds once everyone checked in: `peers[r - 1]` is rank `r`'s.
#[derive(Debug)]
pub struct Joined {
    pub peers: Vec<TcpStream>,
}

impl Server {
    /// Listens on `addr` (`host:port`; port 0 picks a free one, see [`Server::local_addr`]).
    pub fn bind(addr: &str) -> Result<Server> {
        let listener = TcpListener::bind(addr).map_err(|e| err(addr, 0, "cannot listen", e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| err(addr, 0, "cannot listen", e))?;
        Ok(Server {
            listener,
            addr: addr.to_string(),
        })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.listener
            .local_addr()
            .map_err(|e| err(&self.addr, 0, "cannot read the bound address", e))
    }

    /// Waits (until `timeout` has passed) for ranks `1..world` to check in, then hands each
    /// `id`. A rank claimed twice, a world size other than `world` or a malformed greeting
    /// refuses that connection and fails the rendezvous.
    pub fn serve(self, world: usize, id: &[u8], timeout: Duration) -> Result<Joined> {
        let deadline = Instant::now() + timeout;
        let mut slots: Vec<Option<TcpStream>> = (1..world).map(|_| None).collect();
        let mut missing = world.saturating_sub(1);
        while missing > 0 {
            let (mut s, from) = self.accept(deadline, missing)?;
            let who = match greeting(&mut s, deadline) {
                Ok(who) => who,
                Err(detail) => {
                    let _ = refuse(&mut s, &detail, deadline);
                    return Err(fail(&self.addr, 0, format!("from {from}: {detail}")));
                }
            };
            let problem = if who.world != world {
                Some(format!(
                    "rank {} believes the world has {} ranks; rank 0 has {world}",
                    who.rank, who.world
                ))
            } else if who.rank == 0 || who.rank >= world {
                Some(format!("rank {} is outside 1..{world}", who.rank))
            } else if slots[who.rank - 1].is_some() {
                Some(format!(
                    "a second process claims rank {} (from {from})",
                    who.rank
                ))
            } else {
                None
            };
            if let Some(p) = problem {
                let _ = refuse(&mut s, &p, deadline);
                return Err(fail(&self.addr, 0, p));
            }
            tracing::debug!(target: "zcomm.rendezvous.serve", rank = who.rank, %from, "rank checked in");
            slots[who.rank - 1] = Some(s);
            missing -= 1;
        }
        let mut peers = Vec::with_capacity(slots.len());
        for (i, s) in slots.into_iter().enumerate() {
            let Some(mut s) = s else {
                return Err(fail(
                    &self.addr,
                    0,
                    format!("rank {} never checked in", i + 1),
                ));
            };
            let mut msg = vec![WELCOME];
            msg.extend_from_slice(&(id.len() as u32).to_le_bytes());
            msg.extend_from_slice(id);
            write_all(&mut s, &msg, deadline).map_err(|e| {
                err(
                    &self.addr,
                    0,
                    &format!("sending the id to rank {}", i + 1),
                    e,
                )
            })?;
            peers.push(s);
        }
        Ok(Joined { peers })
    }

    fn accept(&self, deadline: Instant, missing: usize) -> Result<(TcpStream, SocketAddr)> {
        loop {
            match self.listener.accept() {
                Ok((s, from)) => {
                    s.set_nonblocking(false)
                        .and_then(|()| s.set_nodelay(true))
                        .map_err(|e| err(&self.addr, 0, "accepting a rank", e))?;
                    return Ok((s, from));
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        return Err(fail(
                            &self.addr,
                            0,
                            format!("{missing} rank(s) did not check in before the deadline"),
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(err(&self.addr, 0, "accepting a rank", e)),
            }
        }
    }
}

/// Rank `info.rank` (not 0) connects to rank 0 at `addr`, retrying a refused connection until
/// `timeout` (rank 0 may start later), and receives the id. Returns the id and the connection.
pub fn join(addr: &str, info: RankInfo, timeout: Duration) -> Result<(Vec<u8>, TcpStream)> {
    let deadline = Instant::now() + timeout;
    let rank = info.rank;
    let mut s = connect(addr, rank, deadline)?;
    let mut hello = MAGIC.to_vec();
    for v in [VERSION, info.rank as u32, info.world as u32] {
        hello.extend_from_slice(&v.to_le_bytes());
    }
    write_all(&mut s, &hello, deadline).map_err(|e| err(addr, rank, "greeting rank 0", e))?;
    let mut status = [0u8];
    read_exact(&mut s, &mut status, deadline)
        .map_err(|e| err(addr, rank, "waiting for the id (rank 0 gone?)", e))?;
    if ![WELCOME, REFUSED].contains(&status[0]) {
        let other = status[0];
        return Err(fail(
            addr,
            rank,
            format!("garbage on the wire: rank 0 answered {other:#x}, not this protocol"),
        ));
    }
    let payload =
        read_payload(&mut s, deadline).map_err(|e| err(addr, rank, "reading the id", e))?;
    if status[0] == REFUSED {
        return Err(fail(
            addr,
            rank,
            format!("rank 0 refused: {}", String::from_utf8_lossy(&payload)),
        ));
    }
    Ok((payload, s))
}

/// The id of the job: rank 0 makes it (`make_id`) and hands it out at `master`; the others
/// receive it. The connections are closed afterwards.
pub fn exchange_id(
    master: &Master,
    info: RankInfo,
    make_id: impl FnOnce() -> Result<Vec<u8>>,
    timeout: Duration,
) -> Result<Vec<u8>> {
    if info.rank == 0 {
        let server = Server::bind(&master.address())?;
        let id = make_id()?;
        server.serve(info.world, &id, timeout)?;
        Ok(id)
    } else {
        join(&master.address(), info, timeout).map(|(id, _)| id)
    }
}

struct Who {
    rank: usize,
    world: usize,
}

/// Reads a joining rank's greeting; the error is what to tell it.
fn greeting(s: &mut TcpStream, deadline: Instant) -> std::result::Result<Who, String> {
    let mut buf = [0u8; 16];
    read_exact(s, &mut buf, deadline).map_err(|e| format!("no greeting: {e}"))?;
    if &buf[..4] != MAGIC {
        return Err(format!(
            "garbage on the wire: {:02x?} is not a rank's greeting",
            &buf[..4]
        ));
    }
    let word = |i: usize| u32::from_le_bytes([buf[i], buf[i + 1], buf[i + 2], buf[i + 3]]);
    if word(4) != VERSION {
        return Err(format!(
            "protocol version {} (rank 0 speaks {VERSION})",
            word(4)
        ));
    }
    Ok(Who {
        rank: word(8) as usize,
        world: word(12) as usize,
    })
}

fn refuse(s: &mut TcpStream, why: &str, deadline: Instant) -> std::io::Result<()> {
    let mut msg = vec![REFUSED];
    msg.extend_from_slice(&(why.len() as u32).to_le_bytes());
    msg.extend_from_slice(why.as_bytes());
    write_all(s, &msg, deadline)
}

fn read_payload(s: &mut TcpStream, deadline: Instant) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    read_exact(s, &mut len, deadline)?;
    let len = u32::from_le_bytes(len);
    if len > MAX_PAYLOAD {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("garbage on the wire: a {len}-byte payload"),
        ));
    }
    let mut buf = vec![0u8; len as usize];
    read_exact(s, &mut buf, deadline)?;
    Ok(buf)
}

fn connect(addr: &str, rank: usize, deadline: Instant) -> Result<TcpStream> {
    let targets: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| err(addr, rank, "cannot resolve rank 0's address", e))?
        .collect();
    let mut last = None;
    loop {
        for t in &targets {
            let Some(left) = remaining(deadline) else {
                break;
            };
            match TcpStream::connect_timeout(t, left) {
                Ok(s) => {
                    s.set_nodelay(true)
                        .map_err(|e| err(addr, rank, "connecting to rank 0", e))?;
                    return Ok(s);
                }
                Err(e) => last = Some(e),
            }
        }
        if remaining(deadline).is_none() {
            let detail = "rank 0 could not be reached before the deadline".to_string();
            return Err(CommError::Rendezvous {
                addr: addr.to_string(),
                rank,
                detail,
                source: last,
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Time left before `deadline`, None once it passed.
pub(crate) fn remaining(deadline: Instant) -> Option<Duration> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
}

fn timed_out() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::TimedOut, "deadline passed")
}

/// `read_exact` with every read bounded by `deadline`.
pub(crate) fn read_exact(
    s: &mut TcpStream,
    buf: &mut [u8],
    deadline: Instant,
) -> std::io::Result<()> {
    let mut at = 0;
    while at < buf.len() {
        s.set_read_timeout(Some(remaining(deadline).ok_or_else(timed_out)?))?;
        match s.read(&mut buf[at..]) {
            Ok(0) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the connection was closed",
                ));
            }
            Ok(n) => at += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(timed_out());
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// `write_all` with every write bounded by `deadline`.
pub(crate) fn write_all(s: &mut TcpStream, buf: &[u8], deadline: Instant) -> std::io::Result<()> {
    let mut at = 0;
    while at < buf.len() {
        s.set_write_timeout(Some(remaining(deadline).ok_or_else(timed_out)?))?;
        match s.write(&buf[at..]) {
            Ok(0) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::WriteZero,
                    "peer gone",
                ));
            }
            Ok(n) => at += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(timed_out());
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn err(addr: &str, rank: usize, what: &str, e: std::io::Error) -> CommError {
    CommError::Rendezvous {
        addr: addr.to_string(),
        rank,
        detail: format!("{what}: {e}"),
        source: Some(e),
    }
}

fn fail(addr: &str, rank: usize, detail: String) -> CommError {
    CommError::Rendezvous {
        addr: addr.to_string(),
        rank,
        detail,
        source: None,
    }
}
