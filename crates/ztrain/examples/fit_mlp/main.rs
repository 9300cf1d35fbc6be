//! A model of a user's own trained through ztrain's run loop (`ztrain::fit`): the whole
//! program is `ztrain::fit::main` of the model, so it takes every option of `ztrain` (the data
//! files, `--epochs`, `--checkpoint`/`--resume`, `--data-on`, `--metrics`, `--memory-report`,
//! `--timeline`, SIGINT/SIGTERM) and `--gpus N` (it starts N copies of itself as ranks). The
//! options of XAsset's sizes (`--width`, `--heads`, `--ff`, `--layers`) are not this model's:
//! it refuses them as unknown options. Its lines and errors say `fit_mlp`, the executable's
//! name (`FitModel::program`).
//!
//! ```sh
//! cargo run --release -p ztrain --example fit_mlp                            # CPU
//! cargo run --release -p ztrain --example fit_mlp -- --device sim --gpus 2   # 2 simulated ranks
//! cargo run --release -p ztrain --example fit_mlp -- --data bars.parquet --window 16 --features 5
//! ```

mod model;

use std::process::ExitCode;

fn main() -> ExitCode {
    ztrain::fit::main(&model::MlpFit {
        hidden: 32,
        task: zgrad::Task::binary(),
    })
}
