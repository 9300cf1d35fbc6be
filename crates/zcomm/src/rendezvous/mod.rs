//! Rank 0 hands a job's unique id (NCCL's `ncclUniqueId`, or the simulated communicator's) to
//! every other rank over TCP. Rank 0 listens on `MASTER_ADDR:MASTER_PORT`; every other rank
//! connects, and the two prove to each other that they hold the job secret
//! ([`crate::secret`]; the protocol is in `handshake.rs`) before the rank says anything of the
//! job or rank 0 hands out anything. The id goes out once the whole world has checked in.
//!
//! Rank 0's listener cannot be knocked over: each connection's greeting is read on a thread of
//! its own under a short deadline ([`Config::greeting_timeout`]), so an idle, garbage,
//! unauthenticated or duplicate connection is dropped and logged (`zcomm.rendezvous.serve`)
//! while the others go on. Only a member that proved the secret and disagrees about the job (its
//! world size, a rank outside it) fails the rendezvous, on both ends, with a typed
//! [`CommError::Rendezvous`]. Every wait is bounded by [`Config::timeout`] and ends within
//! 50 ms of a stop request ([`Config::cancel`]).
//!
//! The connections stay open for callers that want them (the simulated communicator exchanges
//! its buffers over them); `exchange_id` drops them once the id is out.

mod handshake;
mod io;

use crate::RankInfo;
use crate::env::Master;
use crate::error::{CommError, Result};
use crate::secret::Auth;
use handshake::{JoinFailure, REFUSED, Transcript, WELCOME};
use io::{is_cancelled, remaining};
pub(crate) use io::{read_exact, write_all};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

/// A stop request a rendezvous polls while it waits (SIGINT/SIGTERM in `ztrain`).
pub type Cancel = Arc<dyn Fn() -> bool + Send + Sync>;

/// Greetings read at once; a connection past these is dropped at once.
pub const MAX_PENDING_GREETINGS: usize = 64;

/// How a rendezvous runs.
#[derive(Clone)]
pub struct Config {
    /// Who may join.
    pub auth: Auth,
    /// The longest the whole rendezvous may take.
    pub timeout: Duration,
    /// The longest one connection may take to greet and prove itself (rank 0's side).
    pub greeting_timeout: Duration,
    /// Asked every 50 ms at most while waiting: true ends the wait with
    /// [`CommError::Interrupted`].
    pub cancel: Option<Cancel>,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("auth", &self.auth)
            .field("timeout", &self.timeout)
            .field("greeting_timeout", &self.greeting_timeout)
            .field("cancel", &self.cancel.is_some())
            .finish()
    }
}

/// Default [`Config::greeting_timeout`].
pub const GREETING_TIMEOUT: Duration = Duration::from_secs(5);

impl Config {
    /// A rendezvous proving `auth`, bounded by `timeout`.
    #[must_use]
    pub fn new(auth: Auth, timeout: Duration) -> Config {
        Config {
            auth,
            timeout,
            greeting_timeout: GREETING_TIMEOUT.min(timeout),
            cancel: None,
        }
    }

    /// The process environment's secret for `master` ([`Auth::from_env`]).
    pub fn from_env(master: &Master, timeout: Duration) -> Result<Config> {
        Ok(Config::new(Auth::from_env(master)?, timeout))
    }

    /// The same, ending its waits once `cancel` says so.
    #[must_use]
    pub fn with_cancel(mut self, cancel: Cancel) -> Config {
        self.cancel = Some(cancel);
        self
    }

    fn cancelled(&self) -> bool {
        self.cancel.as_ref().is_some_and(|c| c())
    }
}

/// An unauthenticated rendezvous bounded by the duration: for ranks of one test process.
/// Jobs read their secret with [`Config::from_env`].
impl From<Duration> for Config {
    fn from(timeout: Duration) -> Config {
        Config::new(Auth::Unauthenticated, timeout)
    }
}

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

/// A joining rank as it says it is (only believed once it proved the secret).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Who {
    pub rank: usize,
    pub world: usize,
}

/// A connection that proved the secret: its stream and what it claims.
struct Greeted {
    stream: TcpStream,
    rank: u64,
    world: u64,
    transcript: Transcript,
}

type Greeting = (SocketAddr, std::result::Result<Greeted, String>);

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

    /// Waits (until the config's timeout) for ranks `1..world` to check in, then hands each
    /// `id`. See the module documentation for what is dropped and what fails.
    pub fn serve(self, world: usize, id: &[u8], config: impl Into<Config>) -> Result<Joined> {
        let config = config.into();
        let deadline = Instant::now() + config.timeout;
        let auth = Arc::new(config.auth.clone());
        let (tx, rx) = mpsc::channel::<Greeting>();
        let mut slots: Vec<Option<Greeted>> = (1..world).map(|_| None).collect();
        let mut pending = 0usize;
        while slots.iter().any(Option::is_none) {
            if config.cancelled() {
                return Err(CommError::Interrupted {
                    during: "the rendezvous (rank 0)",
                });
            }
            if remaining(deadline).is_none() {
                let missing: Vec<String> = (1..world)
                    .filter(|r| slots[r - 1].is_none())
                    .map(|r| r.to_string())
                    .collect();
                return Err(fail(
                    &self.addr,
                    0,
                    format!(
                        "{} rank(s) did not check in before the deadline (rank {})",
                        missing.len(),
                        missing.join(", ")
                    ),
                ));
            }
            self.accept_pending(&tx, &mut pending, &auth, &config, deadline);
            match rx.recv_timeout(Duration::from_millis(10)) {
                Ok((from, Ok(g))) => {
                    pending = pending.saturating_sub(1);
                    self.admit(g, from, world, &mut slots, &auth, deadline)?;
                }
                Ok((from, Err(why))) => {
                    pending = pending.saturating_sub(1);
                    tracing::warn!(target: "zcomm.rendezvous.serve", %from, reason = %why, "connection dropped; the rendezvous goes on");
                }
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {}
            }
        }
        let mut peers = Vec::with_capacity(slots.len());
        for (i, g) in slots.into_iter().enumerate() {
            let Some(mut g) = g else {
                return Err(fail(
                    &self.addr,
                    0,
                    format!("rank {} never checked in", i + 1),
                ));
            };
            let msg = handshake::outcome(WELCOME, id, &g.transcript, &auth);
            write_all(&mut g.stream, &msg, deadline).map_err(|e| {
                err(
                    &self.addr,
                    0,
                    &format!("sending the id to rank {}", i + 1),
                    e,
                )
            })?;
            peers.push(g.stream);
        }
        Ok(Joined { peers })
    }

    /// Takes every connection waiting on the listener and reads its greeting on a thread of
    /// its own, bounded by the greeting timeout.
    fn accept_pending(
        &self,
        tx: &mpsc::Sender<Greeting>,
        pending: &mut usize,
        auth: &Arc<Auth>,
        config: &Config,
        deadline: Instant,
    ) {
        loop {
            let (s, from) = match self.listener.accept() {
                Ok(c) => c,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    // Out of descriptors, a connection reset before it was taken: not the
                    // job's end.
                    tracing::warn!(target: "zcomm.rendezvous.serve", error = %e, "accept failed; the rendezvous goes on");
                    return;
                }
            };
            if *pending >= MAX_PENDING_GREETINGS {
                tracing::warn!(target: "zcomm.rendezvous.serve", %from, "too many greetings at once; connection dropped");
                continue;
            }
            let until = deadline.min(Instant::now() + config.greeting_timeout);
            let (tx, auth) = (tx.clone(), Arc::clone(auth));
            let spawned = std::thread::Builder::new()
                .name("zcomm-greeting".into())
                .spawn(move || {
                    let _ = tx.send((from, greet_connection(s, &auth, until)));
                });
            match spawned {
                Ok(_) => *pending += 1,
                Err(e) => {
                    tracing::warn!(target: "zcomm.rendezvous.serve", %from, error = %e, "no thread for the greeting; connection dropped");
                }
            }
        }
    }

    /// A connection that proved the secret: takes its rank's slot, or refuses it. A second
    /// claim of a rank is dropped (the first keeps it); a disagreement about the job fails.
    fn admit(
        &self,
        mut g: Greeted,
        from: SocketAddr,
        world: usize,
        slots: &mut [Option<Greeted>],
        auth: &Auth,
        deadline: Instant,
    ) -> Result<()> {
        let problem = if g.world != world as u64 {
            Some(format!(
                "rank {} believes the world has {} ranks; rank 0 has {world}",
                g.rank, g.world
            ))
        } else if g.rank == 0 || g.rank >= world as u64 {
            Some(format!("rank {} is outside 1..{world}", g.rank))
        } else {
            None
        };
        let bounded = deadline.max(Instant::now() + Duration::from_millis(200));
        if let Some(p) = problem {
            let msg = handshake::outcome(REFUSED, p.as_bytes(), &g.transcript, auth);
            let _ = write_all(&mut g.stream, &msg, bounded);
            return Err(fail(&self.addr, 0, format!("from {from}: {p}")));
        }
        // g.rank is in 1..world: it fits a usize.
        let slot = &mut slots[(g.rank - 1) as usize];
        if slot.is_some() {
            let p = format!("rank {} is already taken by another process", g.rank);
            tracing::warn!(target: "zcomm.rendezvous.serve", %from, rank = g.rank, "a second process claims this rank; dropped");
            let msg = handshake::outcome(REFUSED, p.as_bytes(), &g.transcript, auth);
            let _ = write_all(&mut g.stream, &msg, bounded);
            return Ok(());
        }
        tracing::debug!(target: "zcomm.rendezvous.serve", rank = g.rank, %from, "rank checked in");
        *slot = Some(g);
        Ok(())
    }
}

/// Rank 0's side of one connection's handshake, on its own thread: the greeted peer, or why
/// it is dropped.
fn greet_connection(
    mut s: TcpStream,
    auth: &Auth,
    until: Instant,
) -> std::result::Result<Greeted, String> {
    s.set_nonblocking(false)
        .and_then(|()| s.set_nodelay(true))
        .map_err(|e| format!("setting up the connection: {e}"))?;
    let (rank, world, transcript) = handshake::greet(&mut s, auth, until)?;
    Ok(Greeted {
        stream: s,
        rank,
        world,
        transcript,
    })
}

/// Rank `info.rank` (not 0) connects to rank 0 at `addr`, retrying (the name's resolution
/// too) until the config's timeout (rank 0 may start later), proves the secret, checks rank
/// 0's proof, and receives the id. Returns the id and the connection.
pub fn join(addr: &str, info: RankInfo, config: impl Into<Config>) -> Result<(Vec<u8>, TcpStream)> {
    let config = config.into();
    let deadline = Instant::now() + config.timeout;
    let rank = info.rank;
    let mut s = connect(addr, rank, deadline, &config)?;
    let who = Who {
        rank,
        world: info.world,
    };
    match handshake::join(&mut s, who, &config.auth, deadline, config.cancel.as_ref()) {
        Ok(id) => Ok((id, s)),
        // A stop was asked for: whatever ended the wait (rank 0 stopping too), that is why.
        Err(JoinFailure::Io(_, e)) if is_cancelled(&e) || config.cancelled() => {
            Err(CommError::Interrupted {
                during: "the rendezvous",
            })
        }
        Err(JoinFailure::Io(what, e)) => Err(err(addr, rank, what, e)),
        Err(JoinFailure::Bad(detail)) => Err(fail(addr, rank, detail)),
        Err(JoinFailure::Refused(why)) => Err(fail(addr, rank, format!("rank 0 refused: {why}"))),
    }
}

/// The id of the job: rank 0 makes it (`make_id`) and hands it out at `master`; the others
/// receive it. The connections are closed afterwards.
pub fn exchange_id(
    master: &Master,
    info: RankInfo,
    make_id: impl FnOnce() -> Result<Vec<u8>>,
    config: impl Into<Config>,
) -> Result<Vec<u8>> {
    if info.rank == 0 {
        let server = Server::bind(&master.address())?;
        let id = make_id()?;
        server.serve(info.world, &id, config)?;
        Ok(id)
    } else {
        join(&master.address(), info, config).map(|(id, _)| id)
    }
}

fn connect(addr: &str, rank: usize, deadline: Instant, config: &Config) -> Result<TcpStream> {
    let mut last = None;
    loop {
        if config.cancelled() {
            return Err(CommError::Interrupted {
                during: "the rendezvous",
            });
        }
        // Resolved anew every round: a name that does not resolve yet (a host still booting,
        // a DNS record not yet there) may by the deadline.
        match addr.to_socket_addrs() {
            Ok(targets) => {
                for t in targets {
                    let Some(left) = remaining(deadline) else {
                        break;
                    };
                    match TcpStream::connect_timeout(&t, left.min(Duration::from_secs(1))) {
                        Ok(s) => {
                            s.set_nodelay(true)
                                .map_err(|e| err(addr, rank, "connecting to rank 0", e))?;
                            return Ok(s);
                        }
                        Err(e) => last = Some(e),
                    }
                }
            }
            Err(e) => last = Some(e),
        }
        if remaining(deadline).is_none() {
            return Err(CommError::Rendezvous {
                addr: addr.to_string(),
                rank,
                detail: "rank 0 could not be reached (or its name resolved) before the deadline"
                    .to_string(),
                source: last,
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
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
