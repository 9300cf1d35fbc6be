//! How an engine opens: the arena's settings pass through to zmem's [`ArenaOverrides`] (their
//! one owner: precedence, defaults and the one check, against the device, are there), and the
//! device settings of the devices the engine opens. Nothing is checked until the device's
//! memory is known ([`EngineConfig::arena_config`]), and then once, by zmem.

use zdevice::StreamPriority;
use zmem::{ArenaConfig, ArenaOverrides, MemError};
pub use zmem::{ArenaSetting, Labels};

use crate::error::{ComputeError, Result};

/// How an engine opens: its arena's settings (zmem's [`ArenaOverrides`], the one owner: the
/// defaults, the environment, a plan's sizes and explicit overrides, checked once by
/// [`ArenaOverrides::resolve`]) and the device settings of the devices it opens. Build it with
/// [`EngineConfig::from_env`] (or [`EngineConfig::new`] to ignore the environment), override
/// with the builder methods (each forwards to the overrides) or [`EngineConfig::arena`], open
/// with [`EngineConfig::cuda`], [`EngineConfig::sim`] or [`EngineConfig::on_device`].
#[derive(Clone, Debug, Default)]
pub struct EngineConfig {
    arena: ArenaOverrides,
    /// The device's deadline on every wait (`DeviceConfig::sync_deadline`) for the devices
    /// this config opens (`cuda`, `sim`); `None` keeps zdevice's default.
    sync_deadline: Option<std::time::Duration>,
    /// The cuBLAS workspace the devices this config opens reserve; `None` keeps zdevice's.
    blas_workspace_bytes: Option<u64>,
    /// The engine stream's priority on the devices this config opens
    /// (`DeviceConfig::engine_priority`).
    engine_priority: StreamPriority,
}

impl EngineConfig {
    /// zmem's defaults, the environment ignored.
    #[must_use]
    pub fn new() -> EngineConfig {
        EngineConfig::default()
    }

    /// zmem's defaults overridden by the `ZMEM_*` environment variables (read once per process).
    /// A malformed value is [`ComputeError::ArenaSetting`] naming the variable.
    pub fn from_env() -> Result<EngineConfig> {
        Ok(EngineConfig::new().arena(ArenaOverrides::from_env().map_err(setting_error)?))
    }

    /// Defaults overridden by the `ZMEM_*` entries of `vars` (others ignored): the environment
    /// read from a list, for tests and embedders.
    pub fn from_vars(vars: impl IntoIterator<Item = (String, String)>) -> Result<EngineConfig> {
        Ok(EngineConfig::new().arena(ArenaOverrides::from_vars(vars).map_err(setting_error)?))
    }

    /// The arena's settings, replaced whole (a caller that built its own overrides: ztrain's
    /// options, a memory plan).
    #[must_use]
    pub fn arena(mut self, overrides: ArenaOverrides) -> Self {
        self.arena = overrides;
        self
    }

    /// The arena's settings as given.
    #[must_use]
    pub fn overrides(&self) -> &ArenaOverrides {
        &self.arena
    }

    /// The deadline of every wait of the devices this config opens (`cuda`, `sim`; a device
    /// passed to `on_device` keeps its own): a data-parallel rank sets its communicator's
    /// timeout here, so a collective whose peer died ends with a typed `Timeout` in time.
    #[must_use]
    pub fn sync_deadline(mut self, deadline: std::time::Duration) -> Self {
        self.sync_deadline = Some(deadline);
        self
    }

    /// The cuBLAS workspace the devices this config opens reserve (a memory plan passes the
    /// run's).
    #[must_use]
    pub fn blas_workspace(mut self, bytes: u64) -> Self {
        self.blas_workspace_bytes = Some(bytes);
        self
    }

    /// The engine stream's priority on the devices this config opens (`cuda`, `sim`): a
    /// data-parallel rank gives it [`StreamPriority::High`], so that where backward's
    /// kernels and the overlapped collectives' blocks both wait for SMs, backward's start first.
    #[must_use]
    pub fn engine_priority(mut self, priority: StreamPriority) -> Self {
        self.engine_priority = priority;
        self
    }

    /// The device settings `cuda` and `sim` open devices with (`ordinal`, the deadline, the
    /// cuBLAS workspace and the engine stream's priority).
    pub(crate) fn device_config(&self, ordinal: u32) -> zdevice::DeviceConfig {
        let base = zdevice::DeviceConfig::default();
        zdevice::DeviceConfig {
            ordinal,
            sync_deadline: self.sync_deadline.unwrap_or(base.sync_deadline),
            blas_workspace_bytes: self
                .blas_workspace_bytes
                .unwrap_or(base.blas_workspace_bytes),
            engine_priority: self.engine_priority,
            ..base
        }
    }

    fn with(mut self, f: impl FnOnce(ArenaOverrides) -> ArenaOverrides) -> Self {
        self.arena = f(self.arena);
        self
    }

    /// [`ArenaOverrides::arena_bytes`].
    #[must_use]
    pub fn arena_bytes(self, bytes: u64) -> Self {
        self.with(|a| a.arena_bytes(bytes))
    }

    /// [`ArenaOverrides::segment_bytes`].
    #[must_use]
    pub fn segment_bytes(self, bytes: u64) -> Self {
        self.with(|a| a.segment_bytes(bytes))
    }

    /// [`ArenaOverrides::arena_cap`].
    #[must_use]
    pub fn arena_cap(self, bytes: u64) -> Self {
        self.with(|a| a.arena_cap(bytes))
    }

    /// [`ArenaOverrides::overflow_reserve`].
    #[must_use]
    pub fn overflow_reserve(self, bytes: u64) -> Self {
        self.with(|a| a.overflow_reserve(bytes))
    }

    /// [`ArenaOverrides::poison`].
    #[must_use]
    pub fn poison(self, on: bool) -> Self {
        self.with(|a| a.poison(on))
    }

    /// [`ArenaOverrides::timeline_events`].
    #[must_use]
    pub fn timeline_events(self, events: usize) -> Self {
        self.with(|a| a.timeline_events(events))
    }

    /// [`ArenaOverrides::sanitize`].
    #[must_use]
    pub fn sanitize(self, on: bool) -> Self {
        self.with(|a| a.sanitize(on))
    }

    /// [`ArenaOverrides::labels`].
    #[must_use]
    pub fn labels(self, labels: Labels) -> Self {
        self.with(|a| a.labels(labels))
    }

    /// [`ArenaOverrides::is_overridden`].
    #[must_use]
    pub fn is_overridden(&self, setting: ArenaSetting) -> bool {
        self.arena.is_overridden(setting)
    }

    /// [`ArenaOverrides::name_of`].
    #[must_use]
    pub fn name_of(&self, setting: ArenaSetting) -> &'static str {
        self.arena.name_of(setting)
    }

    /// [`ArenaOverrides::given`].
    #[must_use]
    pub fn merged(&self) -> ArenaConfig {
        self.arena.given()
    }

    /// The arena configuration for a device of `total` bytes ([`ArenaOverrides::resolve`],
    /// the one check): [`ComputeError::ArenaSetting`] names a refused setting.
    pub fn arena_config(&self, total: u64) -> Result<ArenaConfig> {
        self.arena.resolve(total).map_err(setting_error)
    }
}

/// A refused or malformed arena setting, named as the caller spelled it; other memory
/// errors unchanged.
pub(crate) fn setting_error(e: MemError) -> ComputeError {
    match e {
        MemError::Setting {
            setting,
            name,
            value,
            reason,
        } => ComputeError::ArenaSetting {
            setting,
            name,
            value,
            reason,
        },
        MemError::Config { var, value, reason } => ComputeError::ArenaSetting {
            setting: ArenaSetting::of_env_var(var).unwrap_or(ArenaSetting::InitialBytes),
            name: var,
            value,
            reason,
        },
        other => crate::cuda::mem_error("EngineConfig", other),
    }
}

#[cfg(test)]
#[path = "settings_tests.rs"]
mod tests;
