//! The entry of a training program (`main` of `ztrain`, and of a user's binary): the options,
//! logging, signals, the launcher of `--gpus N` and the exit status. The one place of the
//! library that prints: a failed run's error, on the user's terminal.

use std::ffi::OsString;
use std::io::{IsTerminal as _, Write as _};
use std::process::ExitCode;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use clap::parser::ValueSource;
use clap::{CommandFactory as _, FromArgMatches as _};
use tracing_subscriber::filter::LevelFilter;

use super::{FitModel, run};
use crate::cli::Options;
use crate::signals::StopSignal;

/// A training program's `main` for `model`: parses ztrain's options from the command line,
/// sets up logging (`--log`), the SIGINT/SIGTERM handlers, and either starts `--gpus N` ranks
/// (copies of this program) and watches them, or trains as one process or rank ([`run`]);
/// prints an error with its causes and returns the exit status ztrain's are (0; 1 on an error;
/// 128 + a signal that stopped the run; 3 for a rank whose peer failed; the launcher's codes).
/// The `ztrain` command is `main(&XAssetFit)`.
pub fn main<S: FitModel>(model: &S) -> ExitCode {
    let program = model.program();
    PROGRAM.get_or_init(|| program.clone());
    // Clap exits on `--help`, `--version` and bad usage (status 2), as `Parser::parse` does.
    let options = options_from(model, std::env::args_os()).unwrap_or_else(|e| e.exit());
    let level: LevelFilter = options.log.parse().unwrap_or(LevelFilter::WARN);
    tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .try_init()
        .ok();
    // A rank started by `ztrain --gpus N` dies with its launcher, however the launcher dies.
    if let Err(e) = zcomm::launch::die_with_launcher() {
        return fail(&format!("error: {e}"));
    }
    if let Some(path) = &options.make_secret {
        return match zcomm::secret::write_new_secret_file(path) {
            Ok(_) => {
                #[allow(clippy::print_stdout)]
                {
                    println!(
                        "wrote a new job secret to {} (mode 0600); give every rank of the job ZCOMM_SECRET_FILE={}",
                        path.display(),
                        path.display()
                    );
                }
                ExitCode::SUCCESS
            }
            Err(e) => fail(&format!("error: {e}")),
        };
    }
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let show_bar = std::io::stderr().is_terminal();
    let stop = match StopSignal::install() {
        Ok(stop) => stop,
        Err(e) => {
            return fail(&format!(
                "error: installing the SIGINT/SIGTERM handlers: {e}"
            ));
        }
    };
    let role = crate::distributed::role(&options);
    if !matches!(role, Ok(crate::distributed::Role::Launcher(_)))
        && let Err(e) = stop.exit_at_once_until_training(&program)
    {
        return fail(&format!("error: starting the signal watcher: {e}"));
    }
    let rank = match role {
        Err(e) => return fail(&crate::error::report(&e)),
        Ok(crate::distributed::Role::Launcher(ranks)) => {
            return launcher(&program, &options, ranks, &stop);
        }
        Ok(crate::distributed::Role::Rank(env)) => Some(env.info),
        Ok(crate::distributed::Role::Single) => None,
    };
    match run(model, &options, &mut out, show_bar, &stop) {
        // 128 + the signal, as a shell reports a process the signal ended (130, 143).
        Ok(outcome) => match outcome.interrupted {
            Some(sig) => ExitCode::from(u8::try_from(128 + sig).unwrap_or(1)),
            None => ExitCode::SUCCESS,
        },
        // Ctrl-C while waiting for the other ranks: a stop like any other.
        Err(e) if e.is_interrupted() && stop.received().is_some() => {
            let sig = stop.received().unwrap_or(crate::signals::SIGINT);
            let who = rank.map_or(String::new(), |i| {
                format!(" rank {} of {}", i.rank, i.world)
            });
            let _ = fail(&format!(
                "{program}{who}: stopped by {} while waiting for the other ranks; nothing was trained",
                crate::signals::name(sig)
            ));
            ExitCode::from(u8::try_from(128 + sig).unwrap_or(1))
        }
        Err(e) => match rank {
            // A rank names itself: the launcher interleaves every rank's stderr.
            Some(info) => {
                let code = if e.is_peer_failure() {
                    crate::error::EXIT_PEER_FAILED
                } else {
                    1
                };
                let line = format!(
                    "{program} rank {} of {}: {}",
                    info.rank,
                    info.world,
                    crate::error::report(&e)
                );
                let _ = out.flush();
                // A rank whose peer failed ends here, running no destructor and no atexit
                // handler: its communicators were aborted, and the library teardown at exit
                // (NCCL's, the driver's) can wait for an abort that does not return (issue
                // 44: on 2 H200s such a rank never exited on its own).
                report_rank_once(&line, code);
                if e.is_peer_failure() {
                    exit_now(code);
                }
                ExitCode::from(code)
            }
            None => fail(&crate::error::report(&e)),
        },
    }
}

/// The program's name, for a rank's last-resort line ([`end_rank_now`]).
static PROGRAM: OnceLock<String> = OnceLock::new();

/// A rank's error line was printed (by `main` or by [`end_rank_now`]): once only.
static REPORTED: AtomicBool = AtomicBool::new(false);

/// The status the rank exits with once its error line is printed.
static EXIT_CODE: AtomicU8 = AtomicU8::new(crate::error::EXIT_PEER_FAILED);

/// Prints a rank's error `line` unless one was printed already, and records `code` as its exit
/// status. Written to the standard error's descriptor directly, without its lock: the last
/// resort runs while another thread may hold it, blocked.
fn report_rank_once(line: &str, code: u8) {
    if REPORTED.swap(true, Ordering::AcqRel) {
        return;
    }
    EXIT_CODE.store(code, Ordering::Release);
    let fd = std::os::fd::AsFd::as_fd(&std::io::stderr()).try_clone_to_owned();
    match fd {
        Ok(fd) => {
            let _ = std::fs::File::from(fd).write_all(format!("{line}\n").as_bytes());
        }
        Err(_) => {
            #[allow(clippy::print_stderr)]
            {
                eprintln!("{line}");
            }
        }
    }
}

/// Ends the process with `code` at once: `_exit`, so no destructor, atexit handler or driver
/// teardown runs (each of which can wait for a device that waits for a dead peer).
fn exit_now(code: u8) -> ! {
    signal_hook::low_level::exit(i32::from(code))
}

/// A rank's last resort (zcomm's `Watched::with_last_resort`, issue 44): it gave the job up
/// (aborted its communicators) and still runs, a thread blocked on the device. Prints its
/// error line (the error names the peer that stopped answering) unless the rank printed one
/// already, and ends the process with the status that line goes with (3 for a peer's
/// failure), running no teardown. Runs on the watchdog's thread; never touches the standard
/// output (the training thread holds its lock).
pub(crate) fn end_rank_now(info: zcomm::RankInfo, e: &zcomm::CommError) -> ! {
    let program = PROGRAM.get().map_or("ztrain", String::as_str);
    report_rank_once(
        &format!("{program} rank {} of {}: error: {e}", info.rank, info.world),
        crate::error::EXIT_PEER_FAILED,
    );
    exit_now(EXIT_CODE.load(Ordering::Acquire))
}

/// `--gpus N`: starts the ranks and exits with what they did: 0, `100 + r` when rank r failed
/// first (the message says how), or 128 + the signal that stopped the job (the launcher's,
/// passed on to every rank, every time).
fn launcher(program: &str, options: &Options, ranks: usize, stop: &StopSignal) -> ExitCode {
    match crate::distributed::launch_ranks(options, ranks, &|| stop.received()) {
        Err(e) => fail(&crate::error::report(&e)),
        Ok(l) if l.exit_code() == 0 => ExitCode::SUCCESS,
        Ok(l) => {
            let _ = fail(&format!("{program}: {}", l.message()));
            ExitCode::from(l.exit_code())
        }
    }
}

/// The command's one place that prints an error, with its causes: the user's terminal.
fn fail(report: &str) -> ExitCode {
    #[allow(clippy::print_stderr)]
    {
        eprintln!("{report}");
    }
    ExitCode::FAILURE
}

/// The options of `model`'s program from `args` (`args[0]`: the program as started): ztrain's,
/// less XAsset's sizes (`--width`, `--heads`, `--ff`, `--layers`) where the model does not read
/// them ([`FitModel::reads_xasset_sizes`]: they are refused as unknown options and left out of
/// `--help`). `--help` says what the program trains ([`FitModel::about`]), its usage line and
/// `--version` name it ([`FitModel::program`], as its lines do, whatever `args[0]` says). The
/// error is clap's: `--help` and `--version` as well as bad usage, for `clap::Error::exit` to
/// print.
pub fn options_from<S, I, T>(model: &S, args: I) -> Result<Options, clap::Error>
where
    S: FitModel,
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let program = model.program();
    let mut command = Options::command()
        .name(program.clone())
        .bin_name(program.clone());
    if let Some(about) = model.about() {
        command = command.about(about.to_string()).long_about(None);
    }
    if !model.reads_xasset_sizes() {
        for id in XASSET_SIZES {
            command = command.mut_arg(id, |a| a.hide(true));
        }
        for id in ["scales", "features"] {
            command = command.mut_arg(id, |a| a.help_heading("Samples"));
        }
    }
    let matches = command.clone().try_get_matches_from(args)?;
    if !model.reads_xasset_sizes()
        && let Some(id) = XASSET_SIZES
            .into_iter()
            .find(|id| matches.value_source(id) == Some(ValueSource::CommandLine))
    {
        let mut command = command;
        return Err(command.error(
            clap::error::ErrorKind::UnknownArgument,
            format!(
                "unexpected argument '--{id}' found: --width, --heads, --ff and --layers are XAsset's sizes (the ztrain command's), not {program}'s model's"
            ),
        ));
    }
    Options::from_arg_matches(&matches)
}

/// The options of XAsset's sizes (their clap ids), offered only where the model reads them.
const XASSET_SIZES: [&str; 4] = ["width", "heads", "ff", "layers"];
