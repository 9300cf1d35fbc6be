//! ztrain as one rank of a data-parallel job, or as the launcher of one (`--gpus N`).
//!
//! `--gpus N` with no launcher variables set: this process is the launcher; it starts N copies
//! of itself with `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR=127.0.0.1`, `MASTER_PORT` (a
//! free port) and `NCCL_NVLS_ENABLE=0` (zcomm's `launch`), and trains nothing itself. With the
//! variables set (by this launcher, torchrun, SLURM or mpirun) ztrain joins as that rank:
//! `--device sim` through zcomm's simulated communicator, `--device cuda` through NCCL. Rank 0
//! alone prints, writes checkpoints and reports.

use std::rc::Rc;
use std::time::Duration;

use zcomm::launch::{LaunchSpec, Launched, launch};
use zcomm::{Collective, LaunchEnv, NcclCollective, SimCollective};
use zcompute::{CudaBackend, CudaDriver, SimDriver};

use crate::cli::Options;
use crate::error::{Result, TrainError};

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
    Ok(if gpus > 1 {
        Role::Launcher(gpus)
    } else {
        Role::Single
    })
}

/// The deadline of every wait on another rank.
pub fn comm_timeout(options: &Options) -> Result<Duration> {
    Duration::try_from_secs_f64(options.comm_timeout)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            TrainError::Options(format!(
                "--comm-timeout {}: expected a positive number of seconds",
                options.comm_timeout
            ))
        })
}

/// Starts `ranks` copies of this program with the same arguments and watches them until they
/// end, one fails (every rank is taken down) or `stop()` (SIGINT/SIGTERM) says so.
pub fn launch_ranks(options: &Options, ranks: usize, stop: &dyn Fn() -> bool) -> Result<Launched> {
    let program = std::env::current_exe().map_err(|source| TrainError::Io {
        what: "finding the ztrain executable to start the ranks",
        path: "ztrain".into(),
        source,
    })?;
    let spec = LaunchSpec {
        program: program.into_os_string(),
        args: std::env::args_os().skip(1).collect(),
        ranks,
        // The failed rank's peers get the time to report their own errors first: each wait of
        // theirs ends at --comm-timeout (the device deadline of a rank), plus a margin to print.
        grace: comm_timeout(options)? + Duration::from_secs(5),
    };
    Ok(launch(&spec, stop)?)
}

/// The simulated communicator of this rank, over its simulated device.
pub fn sim_collective(
    b: &CudaBackend<SimDriver>,
    env: &LaunchEnv,
    timeout: Duration,
) -> Result<Rc<dyn Collective<CudaBackend<SimDriver>, f32>>> {
    Ok(Rc::new(SimCollective::connect(b, env, timeout)?))
}

/// The NCCL communicator of this rank, on the GPU `LOCAL_RANK` names (the caller opened it):
/// rank 0 makes the unique id and hands it out over TCP at `MASTER_ADDR:MASTER_PORT`, every
/// rank joins with it; both waits bounded by `timeout` (the join by the device's deadline).
pub fn nccl_collective(
    b: &CudaBackend<CudaDriver>,
    env: &LaunchEnv,
    timeout: Duration,
) -> Result<Rc<dyn Collective<CudaBackend<CudaDriver>, f32>>> {
    let master = env.master.as_ref().ok_or_else(|| {
        TrainError::Options(format!(
            "rank {} of {}: MASTER_ADDR/MASTER_PORT are not set; the ranks cannot meet",
            env.info.rank, env.info.world
        ))
    })?;
    let id = zcomm::rendezvous::exchange_id(
        master,
        env.info,
        || Ok(NcclCollective::unique_id()?.to_vec()),
        timeout,
    )?;
    Ok(Rc::new(NcclCollective::join(b, env.info, &id)?))
}
