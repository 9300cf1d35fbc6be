//! The simulated communicator: ranks are processes (or threads, in unit tests), each over its
//! own simulated device (`CudaBackend<SimDriver>`), exchanging buffers over TCP through rank 0
//! (`wire.rs`). It stands in for NCCL in CI: the same rendezvous, the same deadlines, the same
//! typed errors, and the same behaviour under capture: a collective is a kernel launched on the
//! engine stream (a closure registered on the simulator for this communicator), so a captured
//! graph contains it and every replay runs the exchange again.
//!
//! A failed exchange (a peer that stalled past the deadline, gave up or vanished) records the
//! typed error here, fails the kernel (the simulator makes that a sticky device error at the
//! next sync, as NCCL's abort poisons a real stream) and is reported by
//! [`Collective::take_failure`] and [`Collective::synchronize`].
//!
//! The overlapped all-reduce launches the same kernel on the communicator's side stream
//! (zcompute's `SideStream`, forked from the engine stream before each call, joined back by
//! `join_overlapped`): the simulator's cross-stream capture puts it in a captured graph too.
//!
//! A peer that stops answering (stopped, killed, or gone silent past the timeout) is modelled as
//! on a GPU, where NCCL's kernel spins on the device for a peer it never hears from: the
//! collective kernel does not complete (zdevice's `KernelFault::Waiting`), its stream and every
//! stream or event behind it never drain, until the communicator is aborted; the host's waits
//! end only at their own deadlines. A peer that aborts (its abort frame arrives) fails the
//! collective at once, as before. A peer that died (its connection closed: the process was
//! killed) while a replayed graph's collective waits for it is worse, as measured on 2 H200s
//! in captured runs (issue 44; eager runs ended in time): the host is not told (no error before
//! a deadline), the collective never completes, even after the abort, so its stream never
//! drains, and a launch behind it blocks for good once the stream's queue is full (zdevice's
//! `SimConfig::launch_queue_depth`). Only the process's end ends such a rank: its watchdog's
//! last resort (`crate::Watched::with_last_resort`).
//!
//! As over NCCL, a synchronize that passes the device's deadline (a collective stuck on the
//! stream) is a [`CommError::Timeout`] naming the rank and the step, and [`SimCollective::abort`]
//! marks the device lost: its stream holds collectives that may never complete, so the
//! teardown that follows never waits on it again.

mod wire;

use crate::env::LaunchEnv;
use crate::error::{CommError, Result};
use crate::rendezvous::{self, Server};
use crate::{Collective, RankInfo};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use wire::{Call, Star};
use zcompute::cuda::SideStream;
use zcompute::{Backend, CudaBackend, CudaTensor, SimDriver};
use zdevice::sim::{KernelArgs, KernelFault, SimMemory};
use zdevice::{Device, DeviceError, Function, KernelArg, LaunchConfig, LoadedModule};

/// Tells communicators of one process apart (each registers its own kernel).
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

const ALL_REDUCE: u64 = 0;
const BROADCAST: u64 = 1;

/// The state the collective kernel works on.
#[derive(Debug)]
struct Link {
    info: RankInfo,
    star: Star,
    timeout: Duration,
    /// Collectives run so far (every rank runs the same sequence).
    seq: AtomicU64,
    /// The optimiser step the next collectives belong to (set before every replay).
    step: AtomicU64,
    /// The first failure; every later collective refuses at once.
    failure: Mutex<Option<CommError>>,
    failed: std::sync::atomic::AtomicBool,
    /// Set when a peer stopped answering: the collective kernel then waits on the device
    /// (never completes) until the communicator is aborted (`failed`), as on a GPU.
    waiting_on: Mutex<Option<String>>,
    /// The peer an exchange found silent (timed out or vanished), the first one.
    silent: Mutex<Option<usize>>,
    /// Set when the peer it waits for died (its connection closed): the collective then
    /// waits for good, the abort notwithstanding (see the module documentation).
    dead: std::sync::atomic::AtomicBool,
    /// Second handles on the connections' sockets: an abort cuts a connection an exchange
    /// holds with them (`Star::abort`).
    cutters: Vec<rendezvous::Stream>,
}

/// A rank of a simulated job. See the module documentation. Clones share the communicator.
#[derive(Clone, Debug)]
pub struct SimCollective {
    link: Arc<Link>,
    function: Function,
    _module: Arc<LoadedModule<SimDriver>>,
    /// The device the collectives run on (marked lost by an abort).
    device: Device<SimDriver>,
    /// Where overlapped all-reduces run.
    side: Arc<SideStream<SimDriver>>,
}

impl SimCollective {
    /// Joins the job the launcher variables describe (`env`), rank 0 serving the rendezvous
    /// at `MASTER_ADDR:MASTER_PORT` under `config` (its secret, its stop request). Every wait,
    /// here and in every collective, is bounded by the config's timeout.
    pub fn connect(
        b: &CudaBackend<SimDriver>,
        env: &LaunchEnv,
        config: impl Into<rendezvous::Config>,
    ) -> Result<Self> {
        let config = config.into();
        let Some(master) = &env.master else {
            return Self::new(b, env.info, Star::Hub(Vec::new()), config.timeout);
        };
        if env.info.rank == 0 {
            Self::serve(b, Server::bind(&master.address())?, env.info.world, config)
        } else {
            Self::join(b, &master.address(), env.info, config)
        }
    }

    /// Rank 0 of a world of `world`, serving the rendezvous on `server`.
    pub fn serve(
        b: &CudaBackend<SimDriver>,
        server: Server,
        world: usize,
        config: impl Into<rendezvous::Config>,
    ) -> Result<Self> {
        refuse_in_capture(b)?;
        let config = config.into();
        let timeout = config.timeout;
        let id = NEXT_ID.load(Ordering::Relaxed).to_le_bytes();
        let joined = server.serve(world, &id, config)?;
        let peers = joined.peers.into_iter().map(Mutex::new).collect();
        let info = RankInfo {
            rank: 0,
            world,
            local_rank: 0,
        };
        Self::new(b, info, Star::Hub(peers), timeout)
    }

    /// Rank `info.rank` (not 0), joining rank 0 at `addr`.
    pub fn join(
        b: &CudaBackend<SimDriver>,
        addr: &str,
        info: RankInfo,
        config: impl Into<rendezvous::Config>,
    ) -> Result<Self> {
        refuse_in_capture(b)?;
        let config = config.into();
        let timeout = config.timeout;
        let (_id, stream) = rendezvous::join(addr, info, config)?;
        Self::new(b, info, Star::Spoke(Mutex::new(stream)), timeout)
    }

    fn new(
        b: &CudaBackend<SimDriver>,
        info: RankInfo,
        star: Star,
        timeout: Duration,
    ) -> Result<Self> {
        refuse_in_capture(b)?;
        let cutters = star.cutters().map_err(|source| CommError::Io {
            op: "keeping a handle on the connections",
            source,
        })?;
        let link = Arc::new(Link {
            info,
            cutters,
            star,
            timeout,
            seq: AtomicU64::new(0),
            step: AtomicU64::new(0),
            failure: Mutex::new(None),
            failed: std::sync::atomic::AtomicBool::new(false),
            waiting_on: Mutex::new(None),
            silent: Mutex::new(None),
            dead: std::sync::atomic::AtomicBool::new(false),
        });
        let name = format!(
            "zcomm_sim_collective_{}",
            NEXT_ID.fetch_add(1, Ordering::Relaxed)
        );
        let kernel_link = Arc::clone(&link);
        b.device()
            .driver()
            .register_kernel(&name, move |_, args, mem| kernel_link.run(args, mem));
        let ptx = format!(
            ".version 8.0\n.target sm_80\n.address_size 64\n\n.visible .entry {name}(\n\t.param .u64 p0,\n\t.param .u64 p1,\n\t.param .u64 p2,\n\t.param .u64 p3,\n\t.param .u64 p4\n)\n{{\n\tret;\n}}\n"
        );
        let device_err = |source| CommError::Device { op: "init", source };
        let module = b.device().load_module(&ptx).map_err(device_err)?;
        let function = module.function(&name).map_err(device_err)?;
        let side =
            SideStream::new(b).map_err(|source| CommError::Compute { op: "init", source })?;
        tracing::debug!(target: "zcomm.sim.init", rank = info.rank, world = info.world, "simulated communicator ready");
        Ok(SimCollective {
            link,
            function,
            _module: Arc::new(module),
            device: b.device().clone(),
            side: Arc::new(side),
        })
    }

    /// Tells the other ranks this one gives up (say, after a failed step), so they stop at
    /// their next collective instead of waiting for the deadline (bounded: half a second per
    /// peer at most), and marks this rank's device lost, as an NCCL abort does: collectives
    /// queued on its stream may never complete, and no wait of the teardown waits for them.
    pub fn abort(&self, why: &str) {
        let rank = self.link.info.rank;
        tracing::warn!(target: "zcomm.sim.abort", rank, why, "aborting the simulated communicator");
        self.link.failed.store(true, Ordering::Release);
        self.device.abandon(format!(
            "the simulated communicator of rank {rank} was aborted; its collectives on the stream may never complete"
        ));
        self.link
            .star
            .abort(rank, why, Duration::from_millis(500), &self.link.cutters);
        // As `ncclCommAbort` ends NCCL's kernels on a GPU, and with them every wait behind
        // them (a launch blocked behind a full queue, a synchronize): the simulator's held
        // calls (`FaultAction::Hang`, how its tests hold a thread in such a wait) return.
        self.device.driver().release_hangs();
    }

    /// Whether the communicator failed or was aborted: every later collective is refused
    /// (as [`crate::NcclCollective::is_aborted`] says over NCCL).
    #[must_use]
    pub fn is_aborted(&self) -> bool {
        self.link.failed.load(Ordering::Acquire)
    }

    /// `synchronize`'s error for a failed wait: a wait past the device's deadline is the
    /// collective's [`CommError::Timeout`] (as over NCCL), the rest the backend's.
    fn sync_error(&self, source: zcompute::ComputeError) -> CommError {
        let deadline = match source.device_error() {
            Some(DeviceError::Timeout { deadline, .. }) => Some(*deadline),
            _ => None,
        };
        match deadline {
            Some(waited_for) => CommError::Timeout {
                rank: self.link.info.rank,
                op: "synchronize",
                step: self.link.step.load(Ordering::Relaxed),
                waited_for,
                silent: Collective::<CudaBackend<SimDriver>, f32>::silent(self),
            },
            None => CommError::Compute {
                op: "synchronize",
                source,
            },
        }
    }

    fn launch(
        &self,
        b: &CudaBackend<SimDriver>,
        op: &'static str,
        x: &CudaTensor,
        kind: u64,
        root: usize,
        step: u64,
    ) -> Result<()> {
        self.launch_on(b, op, x, [kind, root as u64], step, false)
    }

    /// Launches the collective kernel on `x` (`[kind, root]`), on the engine stream or, when
    /// `overlapped`, on the side stream after a fork.
    fn launch_on(
        &self,
        b: &CudaBackend<SimDriver>,
        op: &'static str,
        x: &CudaTensor,
        [kind, root]: [u64; 2],
        step: u64,
        overlapped: bool,
    ) -> Result<()> {
        if let Some(e) = self.failure_now(op, step) {
            return Err(e);
        }
        if !x.is_contiguous() {
            return Err(CommError::Compute {
                op,
                source: zcompute::ComputeError::Unsupported {
                    op,
                    reason: "collectives take dense tensors".into(),
                },
            });
        }
        if !b.device().is_capturing() {
            self.link.step.store(step, Ordering::Relaxed);
        }
        let config = LaunchConfig {
            grid: (1, 1, 1),
            block: (1, 1, 1),
            shared_mem_bytes: 0,
        };
        let scalars = [
            KernelArg::U64(x.numel() as u64),
            KernelArg::U64(kind),
            KernelArg::U64(root),
            // Captured (replayed from a graph): a dead peer is then waited for unseen.
            KernelArg::U64(u64::from(b.device().is_capturing())),
        ];
        let launched = if overlapped {
            self.side.fork().and_then(|()| {
                self.side
                    .launch_simulated(b, op, self.function, config, &[x], &scalars)
            })
        } else {
            zcompute::cuda::twins::launch_simulated(b, op, self.function, config, &[x], &scalars)
        };
        launched.map_err(|source| CommError::Compute { op, source })
    }

    /// A failure recorded earlier, as an error for `op` (the first failure itself is handed out
    /// once by `take_failure`).
    fn failure_now(&self, op: &'static str, step: u64) -> Option<CommError> {
        self.link
            .failed
            .load(Ordering::Acquire)
            .then(|| CommError::PeerFailed {
                rank: self.link.info.rank,
                op,
                step,
                detail: "the communicator failed earlier".into(),
            })
    }
}

impl Link {
    /// The collective kernel: `(float* x, u64 n, u64 kind, u64 root, u64 captured)`.
    fn run(
        &self,
        args: &[KernelArg],
        mem: &mut SimMemory<'_>,
    ) -> std::result::Result<(), KernelFault> {
        let a = KernelArgs(args);
        let (x, n, kind, root) = (a.ptr(0)?, a.u64(1)?, a.u64(2)?, a.u64(3)?);
        let captured = a.u64(4)? != 0;
        // Waiting for a peer that died: for good, aborted or not (the GPU's measured case).
        if self.dead.load(Ordering::Acquire)
            && let Some(why) = self
                .waiting_on
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .as_ref()
        {
            return Err(KernelFault::Waiting(why.clone()));
        }
        if self.failed.load(Ordering::Acquire) {
            return Err(fault("the communicator failed earlier".into()));
        }
        // Run again while it waits for a peer that does not answer (see `run`'s error arm).
        if let Some(why) = self
            .waiting_on
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
        {
            return Err(KernelFault::Waiting(why.clone()));
        }
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let step = self.step.load(Ordering::Relaxed);
        let (op, root) = match kind {
            ALL_REDUCE => ("all_reduce", None),
            _ => ("broadcast", Some(root as usize)),
        };
        let data = mem.read_f32(x, n)?;
        let call = Call {
            op,
            seq,
            step,
            root,
        };
        let (rank, world) = (self.info.rank, self.info.world);
        if let Some(why) = self
            .waiting_on
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
        {
            return Err(KernelFault::Waiting(why.clone()));
        }
        match self.star.exchange(rank, world, call, &data, self.timeout) {
            Ok(out) => mem.write_f32(x, &out),
            Err(wire::ExchangeError { error, silent }) => {
                let e = *error;
                // The peer found silent, kept where the host is told of the failure (not for a
                // dead peer under a replayed graph, of which a GPU's host hears nothing).
                let keep_silent = || {
                    if let Some(peer) = silent {
                        self.silent
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .get_or_insert(peer);
                    }
                };
                let msg = e.to_string();
                let mut slot = self
                    .failure
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if wire::peer_went_silent(&e) {
                    // As NCCL's kernel on a GPU: a peer that stopped or died is never noticed
                    // on the device; the collective waits until the communicator is aborted,
                    // and the stream behind it does not drain. The host's wait ends at its
                    // deadline, and this error tells it which peer did not answer.
                    tracing::error!(target: "zcomm.sim.collective", rank, op, step, error = %msg, "collective waiting for a peer that does not answer");
                    *self
                        .waiting_on
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(msg.clone());
                    // A peer that died, waited for by a replayed graph: as measured on 2 H200s
                    // (issue 44), nothing tells the host (no error until a deadline) and the
                    // abort does not end the wait. Not when this rank's own abort cut the
                    // connection (it marks `failed` first).
                    if captured && wire::peer_died(&e) && !self.failed.load(Ordering::Acquire) {
                        self.dead.store(true, Ordering::Release);
                        return Err(KernelFault::Waiting(msg));
                    }
                    keep_silent();
                    slot.get_or_insert(e);
                    return Err(KernelFault::Waiting(msg));
                }
                tracing::error!(target: "zcomm.sim.collective", rank, op, step, error = %msg, "collective failed");
                self.failed.store(true, Ordering::Release);
                keep_silent();
                slot.get_or_insert(e);
                Err(fault(msg))
            }
        }
    }
}

fn fault(reason: String) -> KernelFault {
    KernelFault::BadArgument { index: 0, reason }
}

fn refuse_in_capture(b: &CudaBackend<SimDriver>) -> Result<()> {
    if b.device().is_capturing() {
        return Err(CommError::CaptureIllegal {
            call: "SimCollective::new",
        });
    }
    Ok(())
}

impl Collective<CudaBackend<SimDriver>, f32> for SimCollective {
    fn info(&self) -> RankInfo {
        self.link.info
    }

    fn all_reduce_sum(&self, b: &CudaBackend<SimDriver>, x: &CudaTensor, step: u64) -> Result<()> {
        if self.link.info.world == 1 {
            return Ok(());
        }
        self.launch(b, "all_reduce", x, ALL_REDUCE, 0, step)
    }

    fn all_reduce_sum_overlapped(
        &self,
        b: &CudaBackend<SimDriver>,
        x: &CudaTensor,
        step: u64,
    ) -> Result<()> {
        if self.link.info.world == 1 {
            return Ok(());
        }
        self.launch_on(b, "all_reduce", x, [ALL_REDUCE, 0], step, true)
    }

    fn join_overlapped(&self, _b: &CudaBackend<SimDriver>) -> Result<()> {
        if self.link.info.world == 1 {
            return Ok(());
        }
        self.side.join().map_err(|source| CommError::Compute {
            op: "join_overlapped",
            source,
        })
    }

    fn broadcast(
        &self,
        b: &CudaBackend<SimDriver>,
        x: &CudaTensor,
        root: usize,
        step: u64,
    ) -> Result<()> {
        let world = self.link.info.world;
        if root >= world {
            return Err(CommError::BadRank {
                rank: root,
                world,
                op: "broadcast",
                step,
            });
        }
        if world == 1 {
            return Ok(());
        }
        self.launch(b, "broadcast", x, BROADCAST, root, step)
    }

    fn synchronize(&self, b: &CudaBackend<SimDriver>) -> Result<()> {
        // The side stream first: an overlapped collective never joined (its step failed
        // before the join) runs, or fails, here.
        let synced = self.side.synchronize().and_then(|()| b.synchronize());
        // As over NCCL, a failed wait aborts the communicator: a collective still waiting on
        // the device for a peer then ends, and no later wait waits for it.
        if let Some(e) = self.take_failure() {
            self.abort(&e.to_string());
            return Err(e);
        }
        synced.map_err(|source| {
            let e = self.sync_error(source);
            self.abort(&e.to_string());
            e
        })
    }

    fn set_step(&self, step: u64) {
        self.link.step.store(step, Ordering::Relaxed);
    }

    fn take_failure(&self) -> Option<CommError> {
        self.link
            .failure
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }

    fn abort(&self, why: &str) {
        SimCollective::abort(self, why);
    }

    /// The peer an exchange found silent (it timed out, or its connection closed) and told the
    /// host of; else of two ranks the other one, of more the others (as over NCCL: the host of
    /// a replayed graph waiting for a dead peer hears nothing).
    fn silent(&self) -> crate::Silent {
        let known = *self
            .link
            .silent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        crate::Silent::of(
            self.link.info,
            known,
            "no exchange of this rank has failed yet",
        )
    }
}
