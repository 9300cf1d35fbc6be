//! `cargo xtask`: the workspace's build chores (bindings, kernels, GPU test runs).
// A command-line tool reports to its user on the terminal.
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod bindgen_cmd;
mod error;
// Not named after `gpu`: its own unit test must not count as a GPU test.
mod hw_tests;
mod kernels_cmd;
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
    /// Run every test with the GPU features (fails without a GPU or if no GPU test ran), or
    /// with --bundle, build the test binaries and a run.sh for a GPU machine without Rust.
    TestGpu {
        /// Write stripped release test binaries and run.sh into this folder instead of running.
        #[arg(long)]
        bundle: Option<PathBuf>,
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
        Cmd::TestGpu { bundle: None, args } => hw_tests::run(&args),
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
