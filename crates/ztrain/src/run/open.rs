//! The checks before the device opens (outputs, the memory estimate against the host and the
//! device), the arena's settings and the backend itself.

use super::device_room;
use std::path::PathBuf;

use zcomm::LaunchEnv;
use zcompute::{EngineConfig, StreamPriority};

use crate::arena_options;
use crate::budget::Estimate;
use crate::cli::{DeviceChoice, Options};
use crate::config::RunConfig;
use crate::data::placement::DeviceRoom;
use crate::device::{self, AnyBackend};
use crate::error::{Result, TrainError};
use crate::files::{self, Named};
use crate::fit::FitModel;

/// Checks every output against the inputs and each other, and that it can be written, before
/// anything trains (`crate::files`).
fn check_files(options: &Options) -> Result<()> {
    fn named<'a>(option: &'static str, path: &'a Option<PathBuf>) -> Option<Named<'a>> {
        path.as_deref().map(|path| Named { option, path })
    }
    let outputs: Vec<Named<'_>> = [
        named("--checkpoint", &options.checkpoint),
        named("--memory-report", &options.memory_report),
        named("--soak-report", &options.soak_report),
        named("--timeline", &options.timeline),
        named("--metrics", &options.metrics),
    ]
    .into_iter()
    .flatten()
    .collect();
    let inputs: Vec<Named<'_>> = [
        named("--data", &options.data),
        named("--resume", &options.resume),
        named("--init-from", &options.init_from),
    ]
    .into_iter()
    .flatten()
    .collect();
    files::check_outputs(&outputs, &inputs, &[("--checkpoint", "--resume")])
}

/// A data-parallel rank's device settings. Every wait, a collective whose peer died included,
/// ends at --comm-timeout with a typed error of its own (the device's default deadline may be
/// longer). The engine stream (forward, backward, the optimiser) takes the device's greatest
/// priority over the overlapped all-reduces' stream: where backward's kernels and a bucket's
/// blocks both wait for SMs, backward's start first (2x H100: weak scaling 96.6-96.8% against
/// 95.6% with NCCL's graph ordering off; docs/benchmarks.md, sixteenth session).
fn rank_engine(engine: EngineConfig, options: &Options) -> Result<EngineConfig> {
    Ok(engine
        .sync_deadline(crate::distributed::comm_timeout(options)?)
        .engine_priority(StreamPriority::High))
}

/// The checks before the device opens (outputs, the memory estimate against the host and the
/// device), the arena's settings (options, the run's plan) and the backend itself.
pub(super) fn open_backend<S: FitModel>(
    spec: &S,
    options: &Options,
    env: &LaunchEnv,
    config: &RunConfig,
) -> Result<(device::Opened, Option<DeviceRoom>)> {
    let mut engine = options.arena.engine_config()?;
    if env.info.world > 1 {
        engine = rank_engine(engine, options)?;
    }
    check_files(options)?;
    // Without the model's estimate nothing is checked before the device opens.
    let estimate = spec.estimate(config)?;
    let device_estimate = estimate.as_ref().map(Estimate::device).transpose()?;
    let mut sim_arena = 0;
    if options.device == DeviceChoice::Sim {
        // The simulated device's memory is known now: its options first, before the host.
        let arena = engine
            .arena_config(options.sim_memory)
            .map_err(arena_options::refused)?;
        sim_arena = arena
            .initial_bytes
            .saturating_add(arena.overflow_reserve_bytes);
    }
    if let (Some(estimate), Some(device)) = (&estimate, device_estimate) {
        match options.device {
            DeviceChoice::Cpu => estimate.check_host(device)?,
            DeviceChoice::Sim => estimate.check_host(device.max(sim_arena))?,
            DeviceChoice::Auto | DeviceChoice::Cuda => estimate.check_host(0)?,
        }
    }
    // The arena's sizes from the run's plan (after the checks above: the plan steps on a batch
    // in host memory), unless the user gave them. A run the device cannot hold is refused by
    // the estimate once the device is open: not planned first (a plan's time grows with it).
    let bound = match options.device {
        DeviceChoice::Sim => options.sim_memory,
        _ => crate::plan::SIZING_MAX_DEVICE_BYTES,
    };
    let mut planned = None;
    if options.device != DeviceChoice::Cpu && device_estimate.is_none_or(|d| d <= bound) {
        (engine, planned) = spec.sized_engine(engine, config, env.info.world)?;
    }
    let ordinal = u32::try_from(env.info.local_rank)
        .map_err(|_| TrainError::Options("LOCAL_RANK does not fit a device ordinal".into()))?;
    let opened = device::open_on(options.device, &engine, &options.sim_config(), ordinal)?;
    if let Some(total) = opened.backend.device_memory() {
        let (name, raise) = match opened.backend {
            AnyBackend::Sim(_) => (
                "the simulated device (--sim-memory)",
                ", or raise --sim-memory",
            ),
            _ => ("the GPU", ""),
        };
        if let Some(estimate) = &estimate {
            estimate.check_device(total, name, raise)?;
        }
    }
    if options.memory_report.is_some() && matches!(opened.backend, AnyBackend::Cpu(_)) {
        return Err(TrainError::MemoryReport(format!(
            "the {} has no device arena to report on; use --device sim (or cuda)",
            opened.description
        )));
    }
    if let (Some(estimate), Some(device)) = (&estimate, device_estimate)
        && options.device == DeviceChoice::Auto
        && matches!(opened.backend, AnyBackend::Cpu(_))
    {
        estimate.check_host(device)?;
    }
    let room = opened
        .backend
        .device_memory()
        .map(|total| device_room(&engine, planned.as_ref(), estimate.as_ref(), total));
    Ok((opened, room))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn a_rank_opens_its_engine_stream_at_the_greatest_priority_and_waits_its_timeout() {
        let options = Options::try_parse_from(["ztrain", "--comm-timeout", "7"]).expect("parses");
        let small = || {
            EngineConfig::new()
                .arena_bytes(1 << 20)
                .segment_bytes(1 << 20)
                .overflow_reserve(1 << 20)
        };
        let b = rank_engine(small(), &options)
            .unwrap()
            .sim(64 << 20)
            .expect("opens");
        let dev = b.device();
        let greatest = dev.stream_priority_range().expect("range").greatest;
        assert_eq!(dev.driver().stream_priority(dev.stream()), Some(greatest));
        assert_eq!(
            dev.config().sync_deadline,
            std::time::Duration::from_secs(7)
        );
        let single = small().sim(64 << 20).expect("opens");
        let dev = single.device();
        assert_eq!(dev.driver().stream_priority(dev.stream()), Some(0));
    }
}
