//! `ztrain`: trains the XAsset model. See `ztrain --help` and the README.

use std::io::IsTerminal as _;
use std::process::ExitCode;

use clap::Parser as _;
use tracing_subscriber::filter::LevelFilter;
use ztrain::cli::Options;

fn main() -> ExitCode {
    let options = Options::parse();
    let level: LevelFilter = options.log.parse().unwrap_or(LevelFilter::WARN);
    tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .init();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let show_bar = std::io::stderr().is_terminal();
    match ztrain::run::run(&options, &mut out, show_bar) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            // The command's one place that prints an error: the user's terminal.
            #[allow(clippy::print_stderr)]
            {
                eprintln!("error: {e}");
            }
            ExitCode::FAILURE
        }
    }
}
