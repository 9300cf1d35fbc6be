//! `cargo xtask`: the workspace's build chores (bindings, kernels, GPU test runs).
// A command-line tool reports to its user on the terminal.
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod bindgen_cmd;
mod error;
// Not named after `gpu`: its own unit test must not count as a GPU test.
mod hw_tests;
mod kernels_cmd;
mod sanitize_cmd;
#[cfg(test)]
mod tidy;
mod toolchain;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "xtask",
    about = "Workspace chores: bindings, kernels, GPU tests"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Regenerate cuda-sys's bindings from the pinned CUDA 13.0 headers.
    Bindgen {
        /// Regenerate into a temporary folder and fail if the committed files differ.
        #[arg(long)]
        check: bool,
    },
    /// Compile kernels/*.cu to kernels/ptx/*.ptx with the pinned nvcc.
    BuildKernels {
        /// Compile into a temporary folder and fail if committed PTX is stale, missing or extra.
        #[arg(long)]
        check: bool,
    },
    /// Run every test with the GPU features (fails without a GPU or if no GPU test ran); with
    /// --bundle, build the test binaries, run.sh and sanitize.sh for a GPU machine without Rust;
    /// with --sanitize, run compute-sanitizer over the GPU suites in zmem's sanitizer mode.
    TestGpu {
        /// Write stripped release test binaries, run.sh and sanitize.sh into this folder instead
        /// of running, plus the commands, the `*_bench` examples, the `crates/*/benches/*.py`
        /// scripts and bench.sh (`./bench.sh [--reference xasset_torch.py] [--xasset-only]`:
        /// the XAsset comparison table of ours, PyTorch and torch.compile, then the rest), and
        /// comm.sh (`GPUS=2 ./comm.sh`: the NCCL tests and a rank killed or stopped mid-run,
        /// each survivor's error line and time to exit).
        #[arg(long, conflicts_with = "sanitize")]
        bundle: Option<PathBuf>,
        /// Run the GPU tests under compute-sanitizer with ZMEM_SANITIZE=1 (every arena block its
        /// own driver allocation), after the planted out-of-bounds control; fails if a tool
        /// reports an error. Prints one line per binary x tool (errors, wall time).
        #[arg(long)]
        sanitize: bool,
        /// With --sanitize: the tools for suites without their own list (comma-separated from
        /// memcheck, racecheck, initcheck, synccheck; default all).
        #[arg(long, requires = "sanitize")]
        tools: Option<String>,
        /// With --sanitize: `SUITE[:FILTER]=TOOLS`, repeatable, e.g. `--sanitize-run zmem=all
        /// --sanitize-run zcompute=memcheck`. SUITE: a test-binary prefix (zdevice, zmem,
        /// zcompute, zgrad, tests); FILTER: a libtest filter (default `gpu`). Default: zdevice,
        /// zmem, zcompute and zgrad with --tools.
        #[arg(long = "sanitize-run", requires = "sanitize")]
        sanitize_run: Vec<String>,
        /// With --sanitize: skip the planted out-of-bounds control.
        #[arg(long, requires = "sanitize")]
        no_control: bool,
        /// Extra arguments for the test binaries (after `--`).
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Generation proper, in a child process that has LIBCLANG_PATH set.
    #[command(hide = true)]
    BindgenInner { out: PathBuf },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Cmd::Bindgen { check } => bindgen_cmd::run(check),
        Cmd::BuildKernels { check } => kernels_cmd::run(check),
        Cmd::TestGpu {
            bundle: Some(dir), ..
        } => hw_tests::bundle(&dir),
        Cmd::TestGpu {
            sanitize: true,
            tools,
            sanitize_run,
            no_control,
            ..
        } => sanitize_cmd::script_args(tools.as_deref(), &sanitize_run, !no_control)
            .and_then(|a| hw_tests::sanitize(&a)),
        Cmd::TestGpu { args, .. } => hw_tests::run(&args),
        Cmd::BindgenInner { out } => bindgen_cmd::inner(&out),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
