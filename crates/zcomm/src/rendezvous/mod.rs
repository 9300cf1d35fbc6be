//! Rank 0 hands a job's unique id (NCCL's `ncclUniqueId`, or the simulated communicator's) to
//! every other rank over TCP. Rank 0 listens on `MASTER_ADDR:MASTER_PORT`; every other rank
//! connects, and the two prove to each other that they hold the job secret
//! ([`crate::secret`]; the protocol is in `handshake.rs`) before the rank says anything of the
//! job or rank 0 hands out anything. The id goes out once the whole world has checked in.
//!
//! Rank 0 listens on every address `MASTER_ADDR` resolves to, or refuses to start (it never
//! falls back to some of them: another user could listen on the rest), and logs which
//! (`zcomm.rendezvous.bind`).
//!
//! Rank 0's listener cannot be knocked over: each connection's greeting is read on a thread of
//! its own under a short deadline ([`Config::greeting_timeout`]), so an idle, garbage,
//! unauthenticated or duplicate connection is dropped and logged (`zcomm.rendezvous.serve`)
//! while the others go on. At most [`MAX_PENDING_GREETINGS`] unproven connections are held; a
//! new one evicts the oldest unproven, never one that proved the secret. A joining rank whose
//! connection is dropped before rank 0 answers retries, backing off, until its deadline. Only a member that proved the secret and disagrees about the job (its
//! world size, a rank outside it) fails the rendezvous, on both ends, with a typed
//! [`CommError::Rendezvous`]. Every wait is bounded by [`Config::timeout`] and ends within
//! 50 ms of a stop request ([`Config::cancel`]).
//!
//! The connections stay open for callers that want them (the simulated communicator exchanges
//! its buffers over them), as authenticated [`Channel`]s bound to the job; `exchange_id` drops
//! them once the id is out.

mod channel;
mod handshake;
mod io;
mod stream;

pub use channel::{BadFrame, Channel, MAX_RECORD};
pub use stream::{Stream, UNIX_PREFIX, check_peer_uid, check_private_dir, unix_path};

use crate::RankInfo;
use crate::env::Master;
use crate::error::{CommError, Result};
use crate::secret::Auth;
use handshake::{JOB_ID, JoinFailure, REFUSED, Transcript, WELCOME};
use io::{is_cancelled, remaining, write_all};
use std::collections::VecDeque;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use stream::ConnectFailure;

/// A stop request a rendezvous polls while it waits (SIGINT/SIGTERM in `ztrain`).
pub type Cancel = Arc<dyn Fn() -> bool + Send + Sync>;

/// Unproven connections held at once; one more evicts the oldest of them.
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

/// One of rank 0's listening sockets.
#[derive(Debug)]
enum Listener {
    Tcp(TcpListener),
    /// The socket and its path (removed when the server goes).
    Unix(UnixListener, PathBuf),
}

/// Rank 0's listening sockets: one on each address its name resolves to, all on one port;
/// or one Unix socket (`unix:PATH`, see [`UNIX_PREFIX`]).
#[derive(Debug)]
pub struct Server {
    listeners: Vec<Listener>,
    /// The only user whose processes may connect to a Unix socket (this process's).
    uid: u32,
    addr: String,
    /// The rendezvous address as the ranks are given it (the name, the bound port): part of
    /// every handshake's transcript.
    job_addr: String,
}

/// The connections rank 0 holds once everyone checked in: `peers[r - 1]` is rank `r`'s.
#[derive(Debug)]
pub struct Joined {
    pub peers: Vec<Channel>,
}

/// A joining rank as it says it is (only believed once it proved the secret).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Who {
    pub rank: usize,
    pub world: usize,
}

/// A connection that proved the secret: its stream and what it claims.
struct Greeted {
    stream: Stream,
    rank: u64,
    world: u64,
    transcript: Transcript,
}

/// Where a held connection's handshake stands: rank 0 evicts only `Greeting` ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Greeting,
    Proven,
    Evicted,
}

/// A connection whose greeting is being read.
struct Pending {
    id: u64,
    from: String,
    /// A handle on the connection, to shut it down when evicted.
    stream: Stream,
    stage: Arc<Mutex<Stage>>,
}

type Greeting = (u64, String, std::result::Result<Greeted, String>);

/// The host part of `host:port` (an IPv6 literal keeps its brackets).
fn host_of(addr: &str) -> &str {
    addr.rsplit_once(':').map_or(addr, |(h, _)| h)
}

impl Server {
    /// Listens on every address `addr` (`host:port`; port 0 picks a free one, see
    /// [`Server::local_addr`]) resolves to, all on one port, or fails naming the one it could
    /// not take.
    pub fn bind(addr: &str) -> Result<Server> {
        if let Some(socket) = unix_path(addr) {
            let l = stream::bind_unix(socket)?;
            tracing::info!(target: "zcomm.rendezvous.bind", %addr, "rank 0 listens on a Unix socket in a private directory (no port)");
            return Ok(Server {
                listeners: vec![Listener::Unix(l, socket.to_path_buf())],
                uid: stream::own_uid(),
                addr: addr.to_string(),
                job_addr: addr.to_string(),
            });
        }
        let resolved: Vec<SocketAddr> = addr
            .to_socket_addrs()
            .map_err(|e| err(addr, 0, "cannot resolve the address to listen on", e))?
            .collect();
        let mut unique: Vec<SocketAddr> = Vec::new();
        for a in resolved {
            if !unique.contains(&a) {
                unique.push(a);
            }
        }
        let listeners = bind_all(addr, &unique)?;
        let port = listeners[0]
            .local_addr()
            .map_err(|e| err(addr, 0, "cannot read the bound address", e))?
            .port();
        let bound: Vec<String> = listeners
            .iter()
            .filter_map(|l| l.local_addr().ok())
            .map(|a| a.to_string())
            .collect();
        tracing::info!(target: "zcomm.rendezvous.bind", %addr, bound = %bound.join(", "), "rank 0 listens on every address the name resolves to");
        Ok(Server {
            listeners: listeners.into_iter().map(Listener::Tcp).collect(),
            uid: stream::own_uid(),
            addr: addr.to_string(),
            job_addr: format!("{}:{port}", host_of(addr)),
        })
    }

    /// The TCP address actually bound (the first, when the name resolves to several).
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.local_addrs()?.into_iter().next().ok_or_else(|| {
            fail(
                &self.addr,
                0,
                "a Unix socket has no TCP address: give the ranks the `unix:` address".into(),
            )
        })
    }

    /// Every TCP address bound (none for a Unix socket).
    pub fn local_addrs(&self) -> Result<Vec<SocketAddr>> {
        self.listeners
            .iter()
            .filter_map(|l| match l {
                Listener::Tcp(l) => Some(l),
                Listener::Unix(..) => None,
            })
            .map(|l| {
                l.local_addr()
                    .map_err(|e| err(&self.addr, 0, "cannot read the bound address", e))
            })
            .collect()
    }

    /// Only processes of `uid` may connect to the Unix socket (tests: another user's).
    #[cfg(test)]
    fn expecting_uid(mut self, uid: u32) -> Server {
        self.uid = uid;
        self
    }

    /// Waits (until the config's timeout) for ranks `1..world` to check in, then hands each
    /// `id`. See the module documentation for what is dropped and what fails.
    pub fn serve(self, world: usize, id: &[u8], config: impl Into<Config>) -> Result<Joined> {
        let config = config.into();
        let deadline = Instant::now() + config.timeout;
        let auth = Arc::new(config.auth.clone());
        let mut job = [0u8; JOB_ID];
        getrandom::fill(&mut job).map_err(|e| {
            fail(
                &self.addr,
                0,
                format!("the operating system's random generator failed: {e}"),
            )
        })?;
        let (tx, rx) = mpsc::channel::<Greeting>();
        let mut slots: Vec<Option<Greeted>> = (1..world).map(|_| None).collect();
        let mut pending: VecDeque<Pending> = VecDeque::new();
        let mut next_id = 0u64;
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
            let greeting = Greeting0 {
                tx: &tx,
                auth: &auth,
                config: &config,
                deadline,
                job,
            };
            self.accept_pending(&greeting, &mut pending, &mut next_id);
            match rx.recv_timeout(Duration::from_millis(10)) {
                Ok((id_of, from, result)) => {
                    pending.retain(|p| p.id != id_of);
                    match result {
                        Ok(g) => self.admit(g, from, world, &mut slots, &auth, deadline)?,
                        Err(why) => {
                            tracing::warn!(target: "zcomm.rendezvous.serve", %from, reason = %why, "connection dropped; the rendezvous goes on");
                        }
                    }
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
            let what = format!("sending the id to rank {}", i + 1);
            let msg = handshake::outcome(WELCOME, id, &g.transcript, &auth);
            write_all(&mut g.stream, &msg, deadline).map_err(|e| err(&self.addr, 0, &what, e))?;
            let (up, down) = g
                .transcript
                .keys(&auth)
                .map_err(|e| err(&self.addr, 0, &what, e))?;
            peers.push(Channel::new(g.stream, down, up));
        }
        Ok(Joined { peers })
    }

    /// Takes every connection waiting on the listeners and reads its greeting on a thread of
    /// its own, bounded by the greeting timeout. Past [`MAX_PENDING_GREETINGS`] unproven
    /// connections, the oldest unproven one is evicted for the new one.
    fn accept_pending(
        &self,
        g: &Greeting0<'_>,
        pending: &mut VecDeque<Pending>,
        next_id: &mut u64,
    ) {
        for listener in &self.listeners {
            loop {
                let (s, from) = match self.accept(listener) {
                    Ok(Some(c)) => c,
                    Ok(None) => continue,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => {
                        // Out of descriptors, a connection reset before it was taken: not the
                        // job's end.
                        tracing::warn!(target: "zcomm.rendezvous.serve", error = %e, "accept failed; the rendezvous goes on");
                        break;
                    }
                };
                if pending.len() >= MAX_PENDING_GREETINGS && !evict_oldest_unproven(pending) {
                    tracing::warn!(target: "zcomm.rendezvous.serve", %from, "every held connection proved the secret; connection dropped");
                    continue;
                }
                let Ok(handle) = s.try_clone() else {
                    tracing::warn!(target: "zcomm.rendezvous.serve", %from, "no descriptor for the connection; dropped");
                    continue;
                };
                let id = *next_id;
                *next_id += 1;
                let stage = Arc::new(Mutex::new(Stage::Greeting));
                let until = g.deadline.min(Instant::now() + g.config.greeting_timeout);
                let (tx, auth, job, addr) = (
                    g.tx.clone(),
                    Arc::clone(g.auth),
                    g.job,
                    self.job_addr.clone(),
                );
                let st = Arc::clone(&stage);
                let sent_from = from.clone();
                let spawned = std::thread::Builder::new()
                    .name("zcomm-greeting".into())
                    .spawn(move || {
                        let got = greet_connection(s, &auth, until, job, &addr, &st);
                        let _ = tx.send((id, sent_from, got));
                    });
                match spawned {
                    Ok(_) => pending.push_back(Pending {
                        id,
                        from,
                        stream: handle,
                        stage,
                    }),
                    Err(e) => {
                        tracing::warn!(target: "zcomm.rendezvous.serve", %from, error = %e, "no thread for the greeting; connection dropped");
                    }
                }
            }
        }
    }

    /// The next connection waiting on `listener`, with who it is from; `Ok(None)` for a
    /// process of another user on the Unix socket (refused: [`CommError::ForeignPeer`]).
    fn accept(&self, listener: &Listener) -> std::io::Result<Option<(Stream, String)>> {
        match listener {
            Listener::Tcp(l) => {
                let (s, from) = l.accept()?;
                Ok(Some((Stream::Tcp(s), from.to_string())))
            }
            Listener::Unix(l, path) => {
                let (s, _) = l.accept()?;
                let uid = stream::peer_uid(&s)?;
                if let Err(e) = check_peer_uid(path, uid, self.uid) {
                    tracing::warn!(target: "zcomm.rendezvous.serve", error = %e, "connection refused; the rendezvous goes on");
                    return Ok(None);
                }
                Ok(Some((Stream::Unix(s), format!("a process of uid {uid}"))))
            }
        }
    }

    /// A connection that proved the secret: takes its rank's slot, or refuses it. A second
    /// claim of a rank is dropped (the first keeps it); a disagreement about the job fails.
    fn admit(
        &self,
        mut g: Greeted,
        from: String,
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

impl Drop for Server {
    /// A Unix socket's file goes with its listener (the launcher removes its directory).
    fn drop(&mut self) {
        for l in &self.listeners {
            if let Listener::Unix(_, path) = l {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

/// What every greeting thread gets from the serving loop.
struct Greeting0<'a> {
    tx: &'a mpsc::Sender<Greeting>,
    auth: &'a Arc<Auth>,
    config: &'a Config,
    deadline: Instant,
    job: [u8; JOB_ID],
}

/// Listens on each of `addrs` on one port (the first's, when `addr` asks for port 0).
fn bind_all(addr: &str, addrs: &[SocketAddr]) -> Result<Vec<TcpListener>> {
    let Some(first) = addrs.first() else {
        return Err(fail(addr, 0, "the name resolves to no address".into()));
    };
    let mut listeners: Vec<TcpListener> = Vec::with_capacity(addrs.len());
    let mut port = first.port();
    for a in addrs {
        let at = SocketAddr::new(a.ip(), port);
        let l = TcpListener::bind(at).map_err(|e| {
            let what = if addrs.len() > 1 {
                format!("cannot listen on {at}, one of the {} addresses the name resolves to (rank 0 listens on all of them or none: another process may hold that one; give MASTER_ADDR as one address)", addrs.len())
            } else {
                format!("cannot listen on {at}")
            };
            err(addr, 0, &what, e)
        })?;
        l.set_nonblocking(true)
            .map_err(|e| err(addr, 0, "cannot listen", e))?;
        if port == 0 {
            port = l
                .local_addr()
                .map_err(|e| err(addr, 0, "cannot read the bound address", e))?
                .port();
        }
        listeners.push(l);
    }
    Ok(listeners)
}

/// Shuts down the oldest connection that has not proved the secret; false when every held
/// connection has.
fn evict_oldest_unproven(pending: &mut VecDeque<Pending>) -> bool {
    for i in 0..pending.len() {
        let mut stage = pending[i]
            .stage
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if *stage == Stage::Greeting {
            *stage = Stage::Evicted;
            drop(stage);
            if let Some(p) = pending.remove(i) {
                let _ = p.stream.shutdown();
                tracing::debug!(target: "zcomm.rendezvous.serve", from = %p.from, "the oldest unproven connection evicted for a new one");
            }
            return true;
        }
    }
    false
}

/// Rank 0's side of one connection's handshake, on its own thread: the greeted peer, or why
/// it is dropped.
fn greet_connection(
    mut s: Stream,
    auth: &Auth,
    until: Instant,
    job: [u8; JOB_ID],
    addr: &str,
    stage: &Mutex<Stage>,
) -> std::result::Result<Greeted, String> {
    s.set_nonblocking(false)
        .and_then(|()| s.set_nodelay())
        .map_err(|e| format!("setting up the connection: {e}"))?;
    let (rank, world, transcript) = handshake::greet(&mut s, auth, until, job, addr)?;
    let mut stage = stage.lock().unwrap_or_else(PoisonError::into_inner);
    if *stage == Stage::Evicted {
        return Err("evicted for a newer connection before it proved the secret".into());
    }
    *stage = Stage::Proven;
    Ok(Greeted {
        stream: s,
        rank,
        world,
        transcript,
    })
}

/// Rank `info.rank` (not 0) connects to rank 0 at `addr`, retrying (the name's resolution
/// too) until the config's timeout (rank 0 may start later, or drop the connection before it
/// answers: backing off from 20 ms to 1 s), proves the secret, checks rank 0's proof, and
/// receives the id. Returns the id and the authenticated channel to rank 0.
pub fn join(addr: &str, info: RankInfo, config: impl Into<Config>) -> Result<(Vec<u8>, Channel)> {
    let config = config.into();
    let deadline = Instant::now() + config.timeout;
    let rank = info.rank;
    let who = Who {
        rank,
        world: info.world,
    };
    let mut backoff = Duration::from_millis(20);
    loop {
        let mut s = connect(addr, rank, deadline, &config)?;
        let failure = match handshake::join(
            &mut s,
            who,
            &config.auth,
            addr,
            deadline,
            config.cancel.as_ref(),
        ) {
            Ok((id, t)) => {
                let (up, down) = t
                    .keys(&config.auth)
                    .map_err(|e| err(addr, rank, "deriving the channel keys", e))?;
                return Ok((id, Channel::new(s, up, down)));
            }
            Err(f) => f,
        };
        match failure {
            // A stop was asked for: whatever ended the wait (rank 0 stopping too), that is why.
            JoinFailure::Io(_, e) if is_cancelled(&e) || config.cancelled() => {
                return Err(CommError::Interrupted {
                    during: "the rendezvous",
                });
            }
            // Dropped before rank 0 answered (evicted among junk connections, rank 0
            // restarting): again, until the deadline.
            JoinFailure::Io(what, e) => {
                let Some(left) = remaining(deadline) else {
                    return Err(err(addr, rank, what, e));
                };
                tracing::info!(target: "zcomm.rendezvous.join", %addr, rank, error = %e, "{what}: the connection failed; retrying");
                sleep_unless_cancelled(backoff.min(left), &config);
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
            JoinFailure::Bad(detail) => return Err(fail(addr, rank, detail)),
            JoinFailure::Refused(why) => {
                return Err(fail(addr, rank, format!("rank 0 refused: {why}")));
            }
        }
    }
}

/// Sleeps `d`, waking every [`io::POLL`] to look at the stop request.
fn sleep_unless_cancelled(d: Duration, config: &Config) {
    let until = Instant::now() + d;
    while let Some(left) = remaining(until) {
        if config.cancelled() {
            return;
        }
        std::thread::sleep(left.min(io::POLL));
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

fn connect(addr: &str, rank: usize, deadline: Instant, config: &Config) -> Result<Stream> {
    let mut last = None;
    loop {
        if config.cancelled() {
            return Err(CommError::Interrupted {
                during: "the rendezvous",
            });
        }
        if let Some(socket) = unix_path(addr) {
            // Not there yet (rank 0 still starting) is retried; rank 0 of another user is not.
            match stream::connect_unix(socket) {
                Ok(s) => return Ok(Stream::Unix(s)),
                Err(ConnectFailure::Refused(e)) => return Err(e),
                Err(ConnectFailure::Io(e)) => last = Some(e),
            }
        } else {
            match connect_tcp(addr, deadline) {
                Ok(s) => return Ok(Stream::Tcp(s)),
                Err(Some(e)) => last = Some(e),
                Err(None) => {}
            }
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

/// One round of connecting to every address `addr` resolves to (resolved anew every round:
/// a name that does not resolve yet, a host still booting, a DNS record not yet there, may
/// by the deadline). The error of the last try, if any was made in time.
fn connect_tcp(
    addr: &str,
    deadline: Instant,
) -> std::result::Result<TcpStream, Option<std::io::Error>> {
    let mut last = None;
    match addr.to_socket_addrs() {
        Ok(targets) => {
            for t in targets {
                let Some(left) = remaining(deadline) else {
                    break;
                };
                match TcpStream::connect_timeout(&t, left.min(Duration::from_secs(1)))
                    .and_then(|s| s.set_nodelay(true).map(|()| s))
                {
                    Ok(s) => return Ok(s),
                    Err(e) => last = Some(e),
                }
            }
        }
        Err(e) => last = Some(e),
    }
    Err(last)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secret::JobSecret;
    use std::os::unix::fs::PermissionsExt as _;

    fn private_socket() -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let addr = format!("{UNIX_PREFIX}{}", dir.path().join("rdv.sock").display());
        (dir, addr)
    }

    fn rank1() -> RankInfo {
        RankInfo {
            rank: 1,
            world: 2,
            local_rank: 1,
        }
    }

    /// Ranks of one host meet over the Unix socket, the handshake on top, and the channel
    /// carries bytes both ways; the socket's file goes with rank 0's server.
    #[test]
    fn ranks_of_one_host_meet_on_a_unix_socket_with_the_secret() {
        let (dir, addr) = private_socket();
        let auth = Auth::Secret(JobSecret::generate().unwrap());
        let server = Server::bind(&addr).unwrap();
        assert!(server.local_addrs().unwrap().is_empty(), "no TCP address");
        let (a, c) = (
            addr.clone(),
            Config::new(auth.clone(), Duration::from_secs(10)),
        );
        let joiner = std::thread::spawn(move || join(&a, rank1(), c));
        let mut joined = server
            .serve(2, b"the id", Config::new(auth, Duration::from_secs(10)))
            .unwrap();
        let (id, mut to0) = joiner.join().unwrap().unwrap();
        assert_eq!(id, b"the id");
        assert!(matches!(to0.stream(), Stream::Unix(_)));
        let soon = Instant::now() + Duration::from_secs(5);
        to0.write_all(b"gradients", soon).unwrap();
        let mut got = [0u8; 9];
        joined.peers[0].read_exact(&mut got, soon).unwrap();
        assert_eq!(&got, b"gradients");
        assert!(
            std::fs::read_dir(dir.path()).unwrap().next().is_none(),
            "the socket file is removed"
        );
    }

    /// Issue 45: a process of another user (here: rank 0 told to expect another uid than this
    /// test's) is refused before it says anything; the rendezvous goes on without it.
    #[test]
    fn a_process_of_another_uid_is_refused_on_the_unix_socket() {
        let (_dir, addr) = private_socket();
        let other = stream::own_uid().wrapping_add(1);
        let server = Server::bind(&addr).unwrap().expecting_uid(other);
        let a = addr.clone();
        let joiner = std::thread::spawn(move || {
            join(&a, rank1(), Config::from(Duration::from_millis(1500)))
        });
        let served = server.serve(2, b"id", Config::from(Duration::from_secs(1)));
        let e = served.unwrap_err();
        assert!(e.to_string().contains("did not check in"), "{e}");
        assert!(
            joiner.join().unwrap().is_err(),
            "the refused rank got nothing"
        );
    }

    /// Set in the child that [`a_process_of_another_real_uid_is_refused_on_the_unix_socket`]
    /// starts: the rendezvous address it connects to as another user.
    const FOREIGN_CHILD: &str = "ZCOMM_TEST_FOREIGN_CHILD";
    /// The user the child becomes: `nobody`.
    const NOBODY: u32 = 65534;

    /// Issue 45: a process of another real uid is refused on the Unix socket of `--gpus N`.
    /// It needs root (to become another user), which CI and this machine's tests have: rank 0
    /// listens, and a child (this test binary run again for this test alone) takes `nobody`'s
    /// effective uid and connects. With `nobody`'s filesystem uid too, the socket's directory
    /// (mode 700) refuses it: it cannot reach the socket (EACCES). With root's filesystem uid
    /// kept (`setfsuid`, one thread), it reaches the socket while `SO_PEERCRED` carries its
    /// effective uid: rank 0's accept refuses it (`ForeignPeer`, logged; `accept` gives
    /// nothing) and its own join refuses rank 0 (`ForeignPeer` naming uid 0). Not root, there
    /// is no other uid to become: the test says so on stderr and checks the same refusal by
    /// rank 0's accept with the expected uid injected instead (the connection is this
    /// process's), so it never passes without a refusal checked.
    #[test]
    // It says which path ran (the real uid or the injected one), and the child what it saw.
    #[allow(clippy::print_stdout, clippy::print_stderr)]
    fn a_process_of_another_real_uid_is_refused_on_the_unix_socket() {
        if let Some(addr) = std::env::var_os(FOREIGN_CHILD) {
            return connect_as_nobody(&addr.to_string_lossy());
        }
        let (_dir, addr) = private_socket();
        let root = stream::own_uid() == 0;
        let server = if root {
            Server::bind(&addr).unwrap()
        } else {
            Server::bind(&addr)
                .unwrap()
                .expecting_uid(stream::own_uid().wrapping_add(1))
        };
        let path = unix_path(&addr).unwrap().to_path_buf();
        let mut child = None;
        let mut own = None;
        if root {
            eprintln!("as root: a child process of uid {NOBODY} connects (the real path)");
            let name =
                "rendezvous::tests::a_process_of_another_real_uid_is_refused_on_the_unix_socket";
            child = Some(
                std::process::Command::new(std::env::current_exe().unwrap())
                    .args([name, "--exact", "--nocapture", "--test-threads=1"])
                    .env(FOREIGN_CHILD, &addr)
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap(),
            );
        } else {
            eprintln!(
                "not root (uid {}): no other uid to become; rank 0 expects another uid instead (the injected path)",
                stream::own_uid()
            );
            own = Some(std::os::unix::net::UnixStream::connect(&path).unwrap());
        }
        // Rank 0's accept, until the child is done (its join connects after its first try).
        let (mut refused, deadline) = (0, Instant::now() + Duration::from_secs(20));
        loop {
            match server.accept(&server.listeners[0]) {
                Ok(Some((_, from))) => panic!("accepted {from}"),
                Ok(None) => refused += 1,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    let done = match child.as_mut() {
                        Some(c) => c.try_wait().unwrap().is_some(),
                        None => refused > 0,
                    };
                    if done {
                        break;
                    }
                    assert!(Instant::now() < deadline, "no connection came");
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => panic!("accept: {e}"),
            }
        }
        drop(own);
        if let Some(c) = child {
            let out = c.wait_with_output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "the child failed:\n{text}");
            assert!(text.contains("the directory refused uid 65534"), "{text}");
            assert!(text.contains("the join refused rank 0"), "{text}");
            eprintln!("{text}");
        }
        assert!(refused >= 1, "rank 0 refused nothing");
    }

    /// The child's side: `nobody` by its effective uid, reaching the socket only with root's
    /// filesystem uid, refused both ways (see the test above).
    #[allow(clippy::print_stdout)]
    fn connect_as_nobody(addr: &str) {
        use nix::unistd::{Uid, seteuid, setfsuid};
        use std::io::Read as _;
        let path = unix_path(addr).unwrap();
        // glibc applies seteuid to every thread of the process (and the filesystem uid with it).
        seteuid(Uid::from_raw(NOBODY)).unwrap();
        assert_eq!(stream::own_uid(), NOBODY);
        let e = std::os::unix::net::UnixStream::connect(path).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
        println!("the directory refused uid {NOBODY}: {e}");
        // This thread alone keeps root's filesystem uid: it reaches the socket, as nobody.
        setfsuid(Uid::from_raw(0));
        let mut held = std::os::unix::net::UnixStream::connect(path)
            .expect("root's filesystem uid reaches the socket");
        assert_eq!(stream::peer_uid(&held).unwrap(), 0, "rank 0 is root");
        let e = join(addr, rank1(), Config::from(Duration::from_secs(5))).unwrap_err();
        assert!(
            matches!(
                e,
                CommError::ForeignPeer {
                    peer_uid: 0,
                    own_uid: NOBODY,
                    ..
                }
            ),
            "{e}"
        );
        println!("the join refused rank 0: {e}");
        // Until rank 0 has accepted and dropped the held connection.
        held.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let _ = held.read(&mut [0u8; 1]);
    }
}
