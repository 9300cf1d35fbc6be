//! XAsset (docs/xasset.md) as the run loop's model: the `ztrain` command is
//! `fit::main(&XAssetFit)`. Its sizes come from the command line (`--features`, `--scales`,
//! `--width`, `--heads`, `--ff`, `--layers`), its memory estimate from `budget`, its arena
//! from its memory plan (`plan`), and `--init-from` reads its parameters (`resume::init_from`).

use std::io::Write;
use std::path::Path;

use serde_json::json;
use zcompute::EngineConfig;
use zgrad::{SchedulePlan, XAsset};

use crate::budget::Estimate;
use crate::cli::Options;
use crate::config::RunConfig;
use crate::error::Result;
use crate::fit::FitModel;
use crate::step::TrainBackend;

/// XAsset of the run configuration's sizes (`RunConfig::model`).
#[derive(Clone, Copy, Debug, Default)]
pub struct XAssetFit;

impl FitModel for XAssetFit {
    type Model<B: TrainBackend> = XAsset<B>;

    fn describe(&self, config: &RunConfig) -> String {
        format!("XAsset {}", self.report_line(config))
    }

    fn report_line(&self, config: &RunConfig) -> String {
        let m = &config.model;
        format!(
            "F={} S={} D={} H={} FF={} L={}",
            m.features, m.scales, m.width, m.heads, m.ff, m.layers
        )
    }

    /// `ztrain`, whatever the executable's file is called.
    fn program(&self) -> String {
        "ztrain".into()
    }

    /// The command's own `--help` text (its doc comment).
    fn about(&self) -> Option<&str> {
        None
    }

    fn reads_xasset_sizes(&self) -> bool {
        true
    }

    fn parameters(&self, config: &RunConfig) -> Result<u64> {
        crate::config::parameters(&config.model)
    }

    fn config_json(&self, config: &RunConfig) -> serde_json::Value {
        let m = &config.model;
        json!({"scales": m.scales, "features": m.features, "width": m.width,
               "heads": m.heads, "ff": m.ff, "layers": m.layers})
    }

    fn init<B: TrainBackend>(&self, b: &B, config: &RunConfig) -> zgrad::Result<XAsset<B>> {
        XAsset::init(b, config.model, config.seed)
    }

    fn init_from<B: TrainBackend>(
        &self,
        b: &B,
        path: &Path,
        config: &RunConfig,
        limit: u64,
    ) -> Result<XAsset<B>> {
        crate::resume::init_from(b, path, &config.model, limit)
    }

    fn estimate(&self, config: &RunConfig) -> Result<Option<Estimate>> {
        Estimate::of(config).map(Some)
    }

    fn sized_engine(
        &self,
        engine: EngineConfig,
        config: &RunConfig,
        world: usize,
    ) -> Result<(EngineConfig, Option<SchedulePlan>)> {
        crate::plan::sized_engine_and_plan(engine, config, world)
    }

    fn print_plan(&self, options: &Options, out: &mut dyn Write) -> Result<()> {
        let report = crate::plan::print(options, out)?;
        tracing::debug!(target: "ztrain.plan", fits = ?report.fits(), "memory plan printed");
        Ok(())
    }
}
