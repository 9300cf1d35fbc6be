//! ztrain: trains the XAsset model (docs/xasset.md) from the command line, through a run
//! loop that trains any zgrad `Model` ([`fit`]: a user's binary gets the same options, data,
//! checkpoints, signals and `--gpus N`). The library holds the pieces (options, data,
//! checkpoints, the memory report, the training run) so that tests reach them; `main.rs` is
//! the thin command, `fit::main` of [`xasset::XAssetFit`].

pub mod arena_options;
pub mod budget;
pub mod checkpoint;
pub mod cli;
pub mod config;
pub mod console;
pub mod data;
pub mod device;
pub mod distributed;
pub mod error;
pub mod files;
pub mod fit;
pub mod memory;
pub mod metrics;
pub mod plan;
pub mod progress;
pub mod report;
pub mod resume;
pub mod rng;
pub mod run;
pub mod signals;
pub mod soak;
pub mod step;
pub mod summary;
pub mod timeline;
pub mod xasset;

pub use error::{Result, TrainError};
