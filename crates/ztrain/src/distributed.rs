//! ztrain as one rank of a data-parallel job, or as the launcher of one (`--gpus N`).
//!
//! `--gpus N` with no launcher variables set: this process is the launcher; it starts N copies
//! of itself with `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `ZCOMM_RENDEZVOUS_SOCKET` (a Unix socket
//! in a directory only the user may enter: no port), a fresh job secret (`ZCOMM_SECRET`) and
//! `NCCL_NVLS_ENABLE=0` (zcomm's
//! `launch`), passes SIGINT/SIGTERM on to them, and trains nothing itself. With the variables
//! set (by this launcher, torchrun, SLURM or mpirun) ztrain joins as that rank: `--device sim`
//! through zcomm's simulated communicator, `--device cuda` through NCCL, after a rendezvous
//! that proves the job secret both ways (zcomm's `secret`). Rank 0 alone prints, writes
//! checkpoints and reports.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use zcomm::launch::{LaunchSpec, Launched, launch};
use zcomm::rendezvous;
use zcomm::{Collective, LaunchEnv, NcclCollective, SimCollective, Watched};
use zcompute::{CudaBackend, CudaDriver, SimDriver};
use zgrad::GradSync;

use crate::cli::Options;
use crate::error::{EXIT_PEER_FAILED, Result, TrainError};
use crate::signals::StopSignal;

/// The longest `--comm-timeout`: a day (longer waits are a hang by another name, and every
/// deadline must stay far from `Instant`'s end).
pub const MAX_COMM_TIMEOUT_SECS: f64 = 86_400.0;

/// What this process is in the job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// A job of one process (no `--gpus`, no launcher variables).
    Single,
    /// Starts `--gpus` ranks and watches them.
    Launcher(usize),
    /// One rank of a job, as the launcher variables say.
    Rank(LaunchEnv),
}

/// Reads the launcher variables and `--gpus`.
pub fn role(options: &Options) -> Result<Role> {
    let env = LaunchEnv::from_env()?;
    let gpus = usize::from(options.gpus);
    if env.info.world > 1 {
        if gpus != 1 && gpus != env.info.world {
            return Err(TrainError::Options(format!(
                "--gpus {gpus} but the launcher variables say WORLD_SIZE={}; leave --gpus out when a launcher starts the ranks",
                env.info.world
            )));
        }
        return Ok(Role::Rank(env));
    }
    // `--plan` starts no rank: one plan, a rank's shard (`plan::print`).
    Ok(if gpus > 1 && !options.plan {
        Role::Launcher(gpus)
    } else {
        Role::Single
    })
}

/// The deadline of every wait on another rank: more than 0, at most a day.
pub fn comm_timeout(options: &Options) -> Result<Duration> {
    Some(options.comm_timeout)
        .filter(|s| *s <= MAX_COMM_TIMEOUT_SECS)
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            TrainError::Options(format!(
                "--comm-timeout {}: expected a positive number of seconds, at most {MAX_COMM_TIMEOUT_SECS} (a day)",
                options.comm_timeout
            ))
        })
}

/// The most MiB `--bucket-mib` takes (a bucket beyond the whole gradient is one bucket).
pub const MAX_BUCKET_MIB: f64 = 4096.0;

/// How a rank sums the gradients (`--bucket-mib`): buckets overlapped with backward, or with
/// 0 one all-reduce after it.
pub fn grad_sync(options: &Options) -> Result<GradSync> {
    let mib = options.bucket_mib;
    if !(0.0..=MAX_BUCKET_MIB).contains(&mib) {
        return Err(TrainError::Options(format!(
            "--bucket-mib {mib}: expected MiB from 0 (one all-reduce after backward) to {MAX_BUCKET_MIB}"
        )));
    }
    if mib == 0.0 {
        return Ok(GradSync::AfterBackward);
    }
    // At least one f32: a bucket is whole parameters anyway.
    let bucket_bytes = ((mib * 1_048_576.0) as usize).max(4);
    Ok(GradSync::Overlapped { bucket_bytes })
}

/// Refuses, before any rank starts, a `--data` that every rank could not read whole: a pipe
/// (or a terminal, a socket) would be split between the ranks that read it.
pub fn check_data_for_ranks(options: &Options, ranks: usize) -> Result<()> {
    let Some(path) = &options.data else {
        return Ok(());
    };
    match std::fs::metadata(path) {
        Ok(m) if !m.is_file() => Err(TrainError::Options(format!(
            "--data {} is not a regular file (a pipe?): with --gpus {ranks} every rank reads the data itself, so a stream would be split between them; save it to a file first (or train with --gpus 1)",
            path.display()
        ))),
        // A missing file is reported by the ranks, with the rest of the checks.
        _ => Ok(()),
    }
}

/// Starts `ranks` copies of this program with the same arguments and watches them until they
/// end or one fails (every rank is taken down); a signal `stop()` returns (SIGINT/SIGTERM) is
/// passed on to every rank.
pub fn launch_ranks(
    options: &Options,
    ranks: usize,
    stop: &dyn Fn() -> Option<i32>,
) -> Result<Launched> {
    check_data_for_ranks(options, ranks)?;
    grad_sync(options)?;
    nccl_channels(options)?;
    overlap_ctas(options)?;
    let program = std::env::current_exe().map_err(|source| TrainError::Io {
        what: "finding the running executable, to start the ranks as copies of it",
        path: std::env::args_os().next().unwrap_or_default().into(),
        source,
    })?;
    let spec = LaunchSpec {
        program: program.into_os_string(),
        args: std::env::args_os().skip(1).collect(),
        ranks,
        // The failed rank's peers get the time to report their own errors first: each wait of
        // theirs ends at --comm-timeout (the device deadline of a rank), plus a margin to print.
        grace: comm_timeout(options)? + Duration::from_secs(5),
        peer_failure_code: Some(i32::from(EXIT_PEER_FAILED)),
        nccl_max_channels: nccl_channels(options)?,
    };
    Ok(launch(&spec, stop)?)
}

/// The most NCCL channels a collective of the ranks takes (`--nccl-channels`; 0: NCCL's
/// choice). NCCL's own limit is 32 channels a collective.
pub fn nccl_channels(options: &Options) -> Result<Option<u32>> {
    match options.nccl_channels {
        0 => Ok(None),
        n @ 1..=NCCL_CHANNELS_MAX => Ok(Some(n)),
        n => Err(TrainError::Options(format!(
            "--nccl-channels {n}: give 1 to {NCCL_CHANNELS_MAX} channels, or 0 for NCCL's own choice"
        ))),
    }
}

/// The most thread blocks an overlapped all-reduce takes (`--overlap-ctas`; 0: one
/// communicator, NCCL's choice). Bounded as `--nccl-channels` is.
pub fn overlap_ctas(options: &Options) -> Result<Option<u32>> {
    match options.overlap_ctas {
        0 => Ok(None),
        n @ 1..=NCCL_CHANNELS_MAX => Ok(Some(n)),
        n => Err(TrainError::Options(format!(
            "--overlap-ctas {n}: give 1 to {NCCL_CHANNELS_MAX} thread blocks, or 0 for one communicator"
        ))),
    }
}

/// The most channels `--nccl-channels` takes (NCCL's own limit).
const NCCL_CHANNELS_MAX: u32 = 32;

/// The rendezvous of this rank: the job secret of the environment (a job across hosts
/// without one is refused), bounded by `timeout`, ended at once by a stop signal.
pub fn rendezvous_config(
    env: &LaunchEnv,
    timeout: Duration,
    stop: &StopSignal,
) -> Result<rendezvous::Config> {
    let config = match &env.master {
        Some(master) => rendezvous::Config::from_env(master, timeout)?,
        None => rendezvous::Config::from(timeout),
    };
    Ok(config.with_cancel(stop.as_cancel()))
}

/// How long a rank's watchdog (`zcomm::Watched`) lets its training thread make no progress
/// before it aborts the communicators: `--comm-timeout` and a quarter more (at most 2 s
/// more). Every wait with a deadline of its own ends at `--comm-timeout` with its own typed
/// error, first; the watchdog ends the waits that have none (a launch blocked behind a full
/// queue), still within the launcher's grace of `--comm-timeout` + 5 s (issue 44).
#[must_use]
pub fn watchdog_timeout(comm_timeout: Duration) -> Duration {
    comm_timeout + (comm_timeout / 4).min(Duration::from_secs(2))
}

/// How long a rank that gave its job up (aborted its communicators) may go on before its last
/// resort ends the process (zcomm's `Watched::with_last_resort`; ztrain's
/// `fit::end_rank_now`): a quarter of `--comm-timeout`, from half a second to 2 s. The
/// teardown after an abort takes no device wait (the device is marked lost), so it ends well
/// within that; a thread blocked on the device past it never would (issue 44). The latest
/// abort is the watchdog's, at [`watchdog_timeout`]: the rank ends within `--comm-timeout` +
/// 4 s, inside the launcher's grace of `--comm-timeout` + 5 s.
#[must_use]
pub fn last_resort_after(comm_timeout: Duration) -> Duration {
    (comm_timeout / 4).clamp(Duration::from_millis(500), Duration::from_secs(2))
}

/// `inner` under its watchdog ([`watchdog_timeout`]) with ztrain's last resort
/// ([`last_resort_after`]).
fn watched<C: Send + Sync + 'static>(
    inner: Arc<C>,
    info: zcomm::RankInfo,
    timeout: Duration,
    abort: impl Fn(&C, &str) + Send + Sync + 'static,
) -> Result<Watched<C>> {
    Ok(
        Watched::new_in(inner, info, watchdog_timeout(timeout), abort)?
            .with_last_resort(last_resort_after(timeout), move |e| {
                crate::fit::end_rank_now(info, e)
            }),
    )
}

/// Whether a rank's steps are captured (`--capture`) over NCCL's `transport` (zcomm's
/// `nccl::transport::transport`): the one owner of that policy (issue 44, item 3). Over NCCL's
/// network transport (sockets as between hosts, or peer-to-peer and shared memory off) a
/// captured step never completed on 2 H200s while eager steps trained at 49,290 samples/s, and
/// nothing this side can make NCCL's proxy progress a replayed graph's collectives: the steps
/// run eagerly there, and the log says why (`ztrain.distributed.capture`).
#[must_use]
pub fn captured_steps(capture: bool, transport: &zcomm::nccl::transport::Transport) -> bool {
    match transport {
        zcomm::nccl::transport::Transport::Network { why } if capture => {
            tracing::warn!(target: "ztrain.distributed.capture", %why, "NCCL moves data over its network transport, where a captured step was measured to hang: the steps run eagerly (--capture is not used)");
            false
        }
        _ => capture,
    }
}

/// The simulated communicator of this rank, over its simulated device, under its watchdog;
/// the ranks meet as `config` says (`rendezvous_config`), every wait bounded by its timeout.
pub fn sim_collective(
    b: &CudaBackend<SimDriver>,
    env: &LaunchEnv,
    config: rendezvous::Config,
) -> Result<Rc<dyn Collective<CudaBackend<SimDriver>, f32>>> {
    let timeout = config.timeout;
    let comm = Arc::new(SimCollective::connect(b, env, config)?);
    Ok(Rc::new(watched(
        comm,
        env.info,
        timeout,
        |c: &SimCollective, why: &str| c.abort(why),
    )?))
}

/// The NCCL communicator of this rank, on the GPU `LOCAL_RANK` names (the caller opened it):
/// rank 0 makes the unique id and hands it out at `MASTER_ADDR:MASTER_PORT` (or the launcher's
/// Unix socket), every
/// rank joins with it; both waits bounded by the rendezvous `config`'s timeout (the join by the
/// device's deadline). Under its watchdog ([`watchdog_timeout`]).
/// `overlap_ctas`: see [`overlap_ctas`]; `last_bucket`: `--last-bucket`.
pub fn nccl_collective(
    b: &CudaBackend<CudaDriver>,
    env: &LaunchEnv,
    config: rendezvous::Config,
    overlap_ctas: Option<u32>,
    last_bucket: crate::cli::LastBucket,
) -> Result<Rc<dyn Collective<CudaBackend<CudaDriver>, f32>>> {
    let master = env.master.as_ref().ok_or_else(|| {
        TrainError::Options(format!(
            "rank {} of {}: MASTER_ADDR/MASTER_PORT (or ZCOMM_RENDEZVOUS_SOCKET) are not set; the ranks cannot meet",
            env.info.rank, env.info.world
        ))
    })?;
    let id = zcomm::rendezvous::exchange_id(
        master,
        env.info,
        || Ok(NcclCollective::unique_id()?.to_vec()),
        config.clone(),
    )?;
    let options = join_options(overlap_ctas, last_bucket);
    let comm = Arc::new(NcclCollective::join_with(b, env.info, &id, options)?);
    // The abort that gives the peer-memory tail up (a store from the host) and runs
    // `ncclCommAbort` on a helper thread: nothing that waits for the device.
    Ok(Rc::new(
        watched(
            comm,
            env.info,
            config.timeout,
            |c: &NcclCollective, why: &str| {
                tracing::error!(target: "ztrain.rank.watchdog", why, "aborting the NCCL communicators");
                c.abort();
            },
        )?
        .polling(NcclCollective::poll_async_error),
    ))
}

/// `e`, the error a rank of a job stops on, with a wait on its device that passed its deadline
/// (the read-back window's, the stop agreement's, an evaluation's or a checkpoint's download)
/// made the collective's error naming the peer the device waits behind
/// ([`Collective::device_wait_error`]; a step's wrapper kept). Issue 44: on a GPU nothing
/// tells the host when a collective's peer died; the device wait that ends first named none.
/// Anything else, and every error of a job of one, comes back as it was.
#[must_use]
pub fn name_the_silent_peer<B: zcompute::Backend<f32>>(
    comm: Option<&dyn Collective<B, f32>>,
    e: TrainError,
) -> TrainError {
    let Some(comm) = comm.filter(|c| c.info().world > 1) else {
        return e;
    };
    match e {
        TrainError::Compute(c) => match comm.device_wait_error(c) {
            Ok(named) => TrainError::from(named),
            Err(c) => TrainError::Compute(c),
        },
        TrainError::Grad(g) => TrainError::Grad(g.map_cause(|cause| match cause {
            zgrad::GradError::Compute(c) => match comm.device_wait_error(c) {
                Ok(named) => zgrad::GradError::from(named),
                Err(c) => zgrad::GradError::Compute(c),
            },
            other => other,
        })),
        other => other,
    }
}

/// A phase of this rank's own, between drained steps (the checkpoint written, an evaluation):
/// its watchdog does not take it for a stall however long it lasts
/// ([`Collective::set_local_phase`], issue 44); left when dropped.
pub struct LocalPhase<'a, B: zcompute::Backend<f32>>(Option<&'a dyn Collective<B, f32>>);

impl<B: zcompute::Backend<f32>> std::fmt::Debug for LocalPhase<'_, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalPhase")
            .field("ranks", &self.0.map(|c| c.info().world))
            .finish()
    }
}

impl<'a, B: zcompute::Backend<f32>> LocalPhase<'a, B> {
    /// Enters phase `what` on `comm` (none: a job of one, nothing to tell).
    pub fn enter(comm: Option<&'a dyn Collective<B, f32>>, what: &'static str) -> Self {
        if let Some(c) = comm {
            c.set_local_phase(Some(what));
        }
        LocalPhase(comm)
    }
}

impl<B: zcompute::Backend<f32>> Drop for LocalPhase<'_, B> {
    fn drop(&mut self) {
        if let Some(c) = self.0 {
            c.set_local_phase(None);
        }
    }
}

/// How a rank joins the NCCL communicator: `--overlap-ctas` and `--last-bucket`.
#[must_use]
pub fn join_options(
    overlap_ctas: Option<u32>,
    last_bucket: crate::cli::LastBucket,
) -> zcomm::JoinOptions {
    zcomm::JoinOptions {
        overlap_ctas,
        last_bucket_on_nccl: last_bucket == crate::cli::LastBucket::Nccl,
        ..zcomm::JoinOptions::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use rstest::rstest;

    fn options(args: &[&str]) -> Options {
        Options::try_parse_from(std::iter::once("ztrain").chain(args.iter().copied()))
            .expect("parses")
    }

    #[rstest]
    #[case::default(&[], Some(GradSync::Overlapped { bucket_bytes: 1 << 20 }))]
    #[case::quarter(&["--bucket-mib", "0.25"], Some(GradSync::Overlapped { bucket_bytes: 1 << 18 }))]
    #[case::after_backward(&["--bucket-mib", "0"], Some(GradSync::AfterBackward))]
    #[case::negative(&["--bucket-mib=-1"], None)]
    #[case::not_a_number(&["--bucket-mib", "NaN"], None)]
    #[case::too_large(&["--bucket-mib", "5000"], None)]
    fn bucket_mib_picks_how_the_gradients_are_summed(
        #[case] args: &[&str],
        #[case] want: Option<GradSync>,
    ) {
        match (grad_sync(&options(args)), want) {
            (Ok(got), Some(want)) => assert_eq!(got, want),
            (Err(TrainError::Options(msg)), None) => {
                assert!(msg.contains("--bucket-mib"), "{msg}");
            }
            (got, want) => panic!("{args:?}: got {got:?}, want {want:?}"),
        }
    }

    #[rstest]
    #[case::default_one_communicator(&[], Some(None))]
    #[case::one_communicator(&["--overlap-ctas", "0"], Some(None))]
    #[case::four(&["--overlap-ctas", "4"], Some(Some(4)))]
    #[case::too_many(&["--overlap-ctas", "33"], None)]
    fn overlap_ctas_bounds_an_overlapped_collectives_blocks(
        #[case] args: &[&str],
        #[case] want: Option<Option<u32>>,
    ) {
        match (overlap_ctas(&options(args)), want) {
            (Ok(got), Some(want)) => assert_eq!(got, want),
            (Err(TrainError::Options(msg)), None) => {
                assert!(msg.contains("--overlap-ctas"), "{msg}");
            }
            (other, want) => panic!("{args:?}: got {other:?}, want {want:?}"),
        }
    }

    /// `--last-bucket`: the peer-memory tail by default (the faster in ztrain's loop once its
    /// set-up queued nothing on the legacy stream, measured), NCCL's all-reduce when asked;
    /// anything else is refused by the parser.
    #[rstest]
    #[case::default_peer(&[], Some(false))]
    #[case::nccl(&["--last-bucket", "nccl"], Some(true))]
    #[case::peer(&["--last-bucket", "peer"], Some(false))]
    #[case::bogus(&["--last-bucket", "shared"], None)]
    fn last_bucket_picks_how_the_last_bucket_is_summed(
        #[case] args: &[&str],
        #[case] want: Option<bool>,
    ) {
        let parsed = Options::try_parse_from(std::iter::once("ztrain").chain(args.iter().copied()));
        match (parsed, want) {
            (Ok(o), Some(want)) => {
                assert_eq!(
                    join_options(Some(4), o.last_bucket).last_bucket_on_nccl,
                    want
                );
                assert_eq!(join_options(Some(4), o.last_bucket).overlap_ctas, Some(4));
            }
            (Err(e), None) => assert!(e.to_string().contains("--last-bucket"), "{e}"),
            (other, want) => panic!(
                "{args:?}: got {:?}, want {want:?}",
                other.map(|o| o.last_bucket)
            ),
        }
    }

    /// The watchdog waits past --comm-timeout (the waits with deadlines end first, with their
    /// own errors) and stays within the launcher's grace of --comm-timeout + 5 s, its last
    /// resort included.
    #[rstest]
    #[case::short(0.4, 0.5)]
    #[case::comm_sh(3.0, 3.75)]
    #[case::ten(10.0, 12.0)]
    #[case::default(120.0, 122.0)]
    fn the_watchdog_waits_past_the_timeout_within_the_grace(
        #[case] comm_timeout: f64,
        #[case] want: f64,
    ) {
        let got = watchdog_timeout(Duration::from_secs_f64(comm_timeout));
        assert_eq!(got, Duration::from_secs_f64(want));
        assert!(got < Duration::from_secs_f64(comm_timeout + 5.0));
        // Issue 44: the latest abort is the watchdog's; the last resort ends the rank after
        // it, still within the launcher's grace, a second to spare.
        let last = last_resort_after(Duration::from_secs_f64(comm_timeout));
        assert!(last >= Duration::from_millis(500), "{last:?}");
        assert!(
            got + last <= Duration::from_secs_f64(comm_timeout + 4.0),
            "{got:?} + {last:?}"
        );
    }

    /// Issue 44: a captured run over NCCL's network transport runs its steps eagerly; any
    /// other transport keeps what was asked.
    #[rstest]
    #[case::local_captured(false, true, true)]
    #[case::local_eager(false, false, false)]
    #[case::network_captured(true, true, false)]
    #[case::network_eager(true, false, false)]
    fn captured_steps_run_eagerly_over_the_network_transport(
        #[case] network: bool,
        #[case] asked: bool,
        #[case] want: bool,
    ) {
        use zcomm::nccl::transport::Transport;
        let t = if network {
            Transport::Network {
                why: "NCCL_P2P_DISABLE is set and NCCL_SHM_DISABLE is set".into(),
            }
        } else {
            Transport::Local
        };
        assert_eq!(captured_steps(asked, &t), want);
    }

    /// A local phase is entered and left around its scope, on the collective it was given.
    #[test]
    fn a_local_phase_is_left_when_its_scope_ends() {
        let rank = RankOf::new(2);
        {
            let _phase = LocalPhase::enter(Some(&rank), "writing the checkpoint");
            assert_eq!(*rank.phases.borrow(), [Some("writing the checkpoint")]);
        }
        assert_eq!(
            *rank.phases.borrow(),
            [Some("writing the checkpoint"), None]
        );
        drop(LocalPhase::<zcompute::CpuBackend>::enter(
            None,
            "nothing to tell",
        ));
    }

    /// A rank of `world` ranks (rank 0) whose collectives do nothing; it keeps the local
    /// phases it is told of.
    struct RankOf {
        world: usize,
        phases: std::cell::RefCell<Vec<Option<&'static str>>>,
    }

    impl RankOf {
        fn new(world: usize) -> Self {
            RankOf {
                world,
                phases: std::cell::RefCell::default(),
            }
        }
    }

    impl Collective<zcompute::CpuBackend, f32> for RankOf {
        fn info(&self) -> zcomm::RankInfo {
            zcomm::RankInfo {
                rank: 0,
                world: self.world,
                local_rank: 0,
            }
        }
        fn all_reduce_sum(
            &self,
            _: &zcompute::CpuBackend,
            _: &zcompute::BTensor<zcompute::CpuBackend, f32>,
            _: u64,
        ) -> zcomm::Result<()> {
            Ok(())
        }
        fn broadcast(
            &self,
            _: &zcompute::CpuBackend,
            _: &zcompute::BTensor<zcompute::CpuBackend, f32>,
            _: usize,
            _: u64,
        ) -> zcomm::Result<()> {
            Ok(())
        }
        fn synchronize(&self, _: &zcompute::CpuBackend) -> zcomm::Result<()> {
            Ok(())
        }
        fn set_local_phase(&self, phase: Option<&'static str>) {
            self.phases.borrow_mut().push(phase);
        }
    }

    /// Issue 44: a step whose read-back passed its deadline (how rank 0 of 2 stopped after its
    /// peer was killed under a replayed graph: "readback_wait: timed out waiting for the
    /// device", no peer named) names the peer the device waits behind: of two ranks the other
    /// one, of more the candidates and why; the step's wrapper and the device's error stay.
    /// Not a wait past its deadline, or a job of one: unchanged.
    #[rstest]
    #[case::two_ranks(Some(2), true, Some("rank 1 did not answer"))]
    #[case::three_ranks(
        Some(3),
        true,
        Some(
            "a peer of ranks 1, 2 (the transport does not say which peer its collectives wait for) did not answer"
        )
    )]
    #[case::not_a_timeout(Some(2), false, None)]
    #[case::one_rank(Some(1), true, None)]
    #[case::no_collective(None, true, None)]
    fn a_device_wait_past_its_deadline_names_the_silent_peer(
        #[case] world: Option<usize>,
        #[case] timeout: bool,
        #[case] named: Option<&str>,
    ) {
        let device = if timeout {
            zdevice::DeviceError::Timeout {
                waited_for: "event Event(0xc1e) to complete".into(),
                deadline: Duration::from_secs(3),
                elapsed: Duration::from_secs(3),
                device_lost: false,
            }
        } else {
            zdevice::DeviceError::DeviceLost {
                reason: "the device was lost".into(),
            }
        };
        let wait = zcompute::ComputeError::Timeout {
            op: "readback_wait",
            source: device,
        };
        let e = TrainError::Grad(zgrad::GradError::Step {
            step: 44,
            applied: zgrad::Applied::Maybe,
            source: Box::new(zgrad::GradError::Compute(wait)),
        });
        let comm = world.map(RankOf::new);
        let got = name_the_silent_peer(comm.as_ref().map(|c| c as &dyn Collective<_, f32>), e);
        let report = crate::error::report(&got);
        assert!(report.starts_with("error: step 44 failed"), "{report}");
        assert!(report.contains("readback_wait"), "{report}");
        match named {
            Some(peer) => {
                assert!(report.contains(&format!("rank 0: a wait on the device passed its deadline behind the job's collectives: {peer}")), "{report}");
                assert!(got.is_peer_failure(), "{report}");
            }
            None => assert!(!report.contains("did not answer"), "{report}"),
        }
    }

    #[rstest]
    #[case::default_nccls_choice(&[], Some(None))]
    #[case::nccls_choice(&["--nccl-channels", "0"], Some(None))]
    #[case::eight(&["--nccl-channels", "8"], Some(Some(8)))]
    #[case::one(&["--nccl-channels", "1"], Some(Some(1)))]
    #[case::nccls_limit(&["--nccl-channels", "32"], Some(Some(32)))]
    #[case::too_many(&["--nccl-channels", "33"], None)]
    fn nccl_channels_bounds_a_collectives_channels(
        #[case] args: &[&str],
        #[case] want: Option<Option<u32>>,
    ) {
        match (nccl_channels(&options(args)), want) {
            (Ok(got), Some(want)) => assert_eq!(got, want),
            (Err(TrainError::Options(msg)), None) => {
                assert!(msg.contains("--nccl-channels"), "{msg}");
            }
            (got, want) => panic!("{args:?}: got {got:?}, want {want:?}"),
        }
    }
}
