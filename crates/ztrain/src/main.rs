//! `ztrain`: trains the XAsset model. See `ztrain --help` and the README. The command is
//! XAsset's use of the run loop library (`ztrain::fit`).

use std::process::ExitCode;

fn main() -> ExitCode {
    ztrain::fit::main(&ztrain::xasset::XAssetFit)
}
