//! `ztrain::fit`, the run loop as a library: a user's model (the example's MLP, not XAsset)
//! trained through it, stopped by SIGINT's stop request with a checkpoint and resumed, equals
//! the uninterrupted run bit for bit; the same model on two simulated ranks (in this process,
//! each a thread of its own meeting at a Unix socket) gives the numbers of one process; and
//! XAsset given as a user would give it trains through the library to `ztrain`'s own result,
//! bit for bit.

/// Labels as the model's task takes them: class indices, real values; bad ones refused.
mod labels;
#[path = "../../examples/fit_mlp/model.rs"]
mod model;
/// `--stream` for every task the run loop's data carries, in one process and on two ranks.
mod streamed;
/// `K` target values a sample (`y` `[N, K]`, `K` label columns), and masked labels.
mod targets;

use crate::common::{TINY, path_str, text, tiny};
use clap::Parser as _;
use model::MlpFit;
use rstest::rstest;
use ztrain::checkpoint::Checkpoint;
use ztrain::cli::Options;
use ztrain::config::RunConfig;
use ztrain::fit::{self, FitModel, Job, Outcome};
use ztrain::signals::{SIGINT, StopSignal};
use ztrain::step::{Tally, TrainBackend};

const MLP: MlpFit = MlpFit {
    hidden: 8,
    task: zgrad::Task {
        target: zgrad::Target::Binary,
        weighted: false,
    },
};

fn options(extra: &[&str]) -> Options {
    let args = ["fit-test"].iter().chain(TINY).chain(extra).copied();
    Options::try_parse_from(args).expect("options parse")
}

/// Trains `model` in this process as `extra` says; its output and outcome.
fn fit_run<S: FitModel>(model: &S, extra: &[&str], stop: &StopSignal) -> (String, Outcome) {
    let mut out = Vec::new();
    let outcome = fit::run(model, &options(extra), &mut out, false, stop).expect("the run");
    (String::from_utf8(out).expect("utf-8"), outcome)
}

/// The file name of the running executable: a user's model's name in its lines by default.
fn running_program() -> String {
    let argv0 = std::env::args_os().next().expect("argv[0]");
    let name = std::path::Path::new(&argv0)
        .file_name()
        .expect("a file name");
    name.to_string_lossy().into_owned()
}

/// No line of a user's program's output says it is `ztrain`.
fn assert_no_ztrain_lines(out: &str) {
    for line in out.lines() {
        assert!(
            !line.starts_with("ztrain"),
            "a line names ztrain: {line}\n{out}"
        );
    }
}

fn bits(t: Option<Tally>) -> Option<(u64, u64, u64)> {
    t.map(|t| (t.loss_sum.to_bits(), t.correct.to_bits(), t.samples))
}

/// The two checkpoints are the same state: progress, parameters and optimiser, bit for bit.
fn assert_same_checkpoint(a: &std::path::Path, b: &std::path::Path) {
    let (a, b) = (
        Checkpoint::load(a).expect("a"),
        Checkpoint::load(b).expect("b"),
    );
    assert_eq!(a.progress, b.progress);
    assert_eq!(a.params.len(), b.params.len());
    for (name, t) in &a.params {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&t.data),
            bits(&b.params[name].data),
            "parameter {name}"
        );
    }
    assert_eq!(a.optim, b.optim);
}

#[rstest]
#[case::cpu(&["--device", "cpu"])]
#[case::sim_data_on_device(&["--device", "sim", "--data-on", "device", "--readback-every", "3"])]
#[case::sim_data_on_host(&["--device", "sim", "--data-on", "host"])]
fn a_users_model_stopped_by_sigint_and_resumed_equals_the_uninterrupted_run(
    #[case] device: &[&str],
) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (full, split) = (dir.path().join("full.st"), dir.path().join("split.st"));
    let (full_out, whole) = fit_run(
        &MLP,
        &[device, &["--checkpoint", path_str(&full)]].concat(),
        &StopSignal::never(),
    );
    // The user's program names itself (by default the running executable's file name).
    let me = running_program();
    assert!(
        full_out.contains(&format!("{me}: MLP F=6 S=3 H=8 (161 parameters)")),
        "{full_out}"
    );
    assert_no_ztrain_lines(&full_out);
    assert_eq!(whole.interrupted, None);
    // The stop request SIGINT's handler makes, there before the first step: the run stops
    // after it, writes the checkpoint and says how to go on.
    let stop = StopSignal::never();
    stop.raise(SIGINT);
    let (first, stopped) = fit_run(
        &MLP,
        &[device, &["--checkpoint", path_str(&split)]].concat(),
        &stop,
    );
    assert_eq!(stopped.interrupted, Some(SIGINT), "{first}");
    assert!(stopped.steps >= 1 && stopped.steps < whole.steps, "{first}");
    assert!(
        first.contains(&format!("{me}: stopped by SIGINT after step")),
        "{first}"
    );
    let (second, resumed) = fit_run(
        &MLP,
        &[
            device,
            &[
                "--checkpoint",
                path_str(&split),
                "--resume",
                path_str(&split),
            ],
        ]
        .concat(),
        &StopSignal::never(),
    );
    assert!(second.contains(&format!("{me}: resumed from")), "{second}");
    assert_no_ztrain_lines(&second);
    assert_eq!(resumed.steps, whole.steps);
    assert_eq!(bits(resumed.validation), bits(whole.validation));
    assert_eq!(bits(resumed.train), bits(whole.train));
    assert_same_checkpoint(&full, &split);
}

#[test]
fn a_users_model_starts_from_a_parameter_file_by_name_and_another_models_file_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let [trained, from_file, from_seed, xasset] =
        ["trained.st", "from_file.st", "from_seed.st", "xasset.st"].map(|f| dir.path().join(f));
    let never = StopSignal::never();
    fit_run(
        &MLP,
        &["--device", "cpu", "--checkpoint", path_str(&trained)],
        &never,
    );
    // A learning rate so small that no update moves a float32 parameter: a run's last
    // parameters are the ones it started from.
    let still = ["--device", "cpu", "--lr", "1e-30", "--weight-decay", "0"];
    let (out, _) = fit_run(
        &MLP,
        &[
            &still[..],
            &[
                "--init-from",
                path_str(&trained),
                "--checkpoint",
                path_str(&from_file),
            ],
        ]
        .concat(),
        &never,
    );
    assert!(
        out.contains(&format!("{}: parameters from", running_program())),
        "{out}"
    );
    fit_run(
        &MLP,
        &[&still[..], &["--checkpoint", path_str(&from_seed)]].concat(),
        &never,
    );
    let params = |p: &std::path::Path| {
        let ck = Checkpoint::load(p).expect("checkpoint");
        ck.params
            .iter()
            .map(|(n, t)| {
                (
                    n.clone(),
                    t.data.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                )
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(params(&from_file), params(&trained));
    assert_ne!(
        params(&from_seed),
        params(&trained),
        "the seed's start is not the file's"
    );
    // XAsset's parameters into the MLP: every name of both named.
    let o = tiny(&["--device", "cpu", "--checkpoint", path_str(&xasset)]);
    assert!(o.status.success(), "{:?}", text(&o));
    let options = options(&["--device", "cpu", "--init-from", path_str(&xasset)]);
    let e = fit::run(&MLP, &options, &mut Vec::new(), false, &never).unwrap_err();
    let report = ztrain::error::report(&e);
    for needle in [
        "--init-from",
        "missing",
        "l1.weight",
        "l2.bias",
        "extra",
        "emb.weight",
    ] {
        assert!(report.contains(needle), "`{needle}` not in: {report}");
    }
}

#[test]
fn a_users_model_has_its_memory_plan() {
    let plan = |extra: &[&str]| {
        let mut out = Vec::new();
        let o = fit::run(
            &MLP,
            &options(&[&["--plan", "--device", "sim"], extra].concat()),
            &mut out,
            false,
            &StopSignal::never(),
        )
        .expect("the plan");
        assert_eq!(o.steps, 0);
        String::from_utf8(out).expect("utf-8")
    };
    let lines = plan(&[]);
    assert!(
        lines.starts_with(&format!(
            "{} --plan: MLP F=6 S=3 H=8, batch 16, eager",
            running_program()
        )),
        "{lines}"
    );
    assert!(lines.contains("\nbatched "), "{lines}");
    assert!(
        lines.contains("device: the simulated device (--sim-memory)"),
        "{lines}"
    );
    let json: serde_json::Value = serde_json::from_str(plan(&["--json"]).trim()).expect("json");
    assert_eq!(json["model"]["mlp"]["hidden"], 8);
    assert!(
        json["arena_bytes"].as_u64().is_some_and(|b| b > 0),
        "{json}"
    );
}

/// Ranks `0..world` of a job in this process, each on a thread of its own and a simulated
/// device, training `model`; rank 0's output and outcome.
fn ranks_in_process(model: MlpFit, world: usize, extra: &[&str]) -> (String, Outcome) {
    let dir = tempfile::tempdir().expect("tempdir");
    // zcomm's rule for a rendezvous socket: in a directory only the user may enter.
    let private = <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o700);
    std::fs::set_permissions(dir.path(), private).expect("mode 700");
    let socket = dir.path().join("rendezvous.sock");
    let runs: Vec<_> = (0..world)
        .map(|rank| {
            let options = options(extra);
            let job = Job {
                env: zcomm::LaunchEnv {
                    info: zcomm::RankInfo {
                        rank,
                        world,
                        local_rank: rank,
                    },
                    master: Some(zcomm::Master::Local {
                        socket: socket.clone(),
                    }),
                },
                auth: Some(zcomm::Auth::Unauthenticated),
            };
            std::thread::spawn(move || {
                let mut out = Vec::new();
                let stop = StopSignal::never();
                let outcome = fit::run_rank(&model, &options, &job, &mut out, false, &stop)
                    .unwrap_or_else(|e| panic!("rank {rank}: {}", ztrain::error::report(&e)));
                (String::from_utf8(out).expect("utf-8"), outcome)
            })
        })
        .collect();
    let mut results: Vec<(String, Outcome)> =
        runs.into_iter().map(|r| r.join().expect("rank")).collect();
    results.swap_remove(0)
}

/// The numbers a run's summary prints (4 decimals): what one process and a job agree on.
fn printed(t: Option<Tally>) -> Option<String> {
    t.map(|t| format!("{:.4} {}", t.mean_loss(), t.metrics_text()))
}

#[rstest]
#[case::eager(&["--device", "sim"])]
#[case::per_sample_captured(&["--device", "sim", "--schedule", "per-sample", "--capture"])]
fn a_users_model_on_two_simulated_ranks_gives_the_numbers_of_one_process(#[case] extra: &[&str]) {
    let (one_out, one) = fit_run(&MLP, extra, &StopSignal::never());
    let (two_out, two) = ranks_in_process(MLP, 2, extra);
    assert!(
        two_out.contains("data-parallel job of 2 ranks"),
        "{two_out}"
    );
    assert_eq!(two.steps, one.steps);
    assert!(one.validation.is_some());
    assert_eq!(
        printed(two.validation),
        printed(one.validation),
        "{one_out}\n{two_out}"
    );
    assert_eq!(
        printed(two.train),
        printed(one.train),
        "{one_out}\n{two_out}"
    );
}

/// XAsset as a user would give it to the library: from zgrad's public API alone.
struct UsersXAsset;

impl FitModel for UsersXAsset {
    type Model<B: TrainBackend> = zgrad::XAsset<B>;

    fn describe(&self, _: &RunConfig) -> String {
        "XAsset of my own".into()
    }

    fn parameters(&self, config: &RunConfig) -> ztrain::Result<u64> {
        Ok(config.model.parameter_count() as u64)
    }

    fn config_json(&self, config: &RunConfig) -> serde_json::Value {
        serde_json::json!({"mine": format!("{:?}", config.model)})
    }

    fn init<B: TrainBackend>(&self, b: &B, config: &RunConfig) -> zgrad::Result<zgrad::XAsset<B>> {
        zgrad::XAsset::init(b, config.model, config.seed)
    }

    fn program(&self) -> String {
        "my-xasset".into()
    }

    fn reads_xasset_sizes(&self) -> bool {
        true
    }
}

/// The numbers of every epoch's line and of the summary (the rates and times left out).
fn numbers(stdout: &str) -> Vec<String> {
    stdout
        .lines()
        .filter(|l| l.starts_with("epoch ") || l.starts_with("summary:"))
        .map(|l| {
            l.split([',', ';'])
                .filter(|p| p.contains("loss") || p.contains(" acc "))
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect()
}

#[rstest]
#[case::cpu(&["--device", "cpu"])]
#[case::sim(&["--device", "sim", "--data-on", "device"])]
fn xasset_through_the_library_equals_the_ztrain_command_bitwise(#[case] device: &[&str]) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (command, library) = (dir.path().join("command.st"), dir.path().join("library.st"));
    let o = tiny(&[device, &["--checkpoint", path_str(&command)]].concat());
    assert!(o.status.success(), "{:?}", text(&o));
    let (out, _) = fit_run(
        &UsersXAsset,
        &[device, &["--checkpoint", path_str(&library)]].concat(),
        &StopSignal::never(),
    );
    assert!(out.contains("my-xasset: XAsset of my own"), "{out}");
    assert_no_ztrain_lines(&out);
    let expected = numbers(&text(&o).0);
    assert_eq!(
        expected.len(),
        3,
        "two epochs and the summary: {expected:?}"
    );
    assert_eq!(numbers(&out), expected);
    assert_same_checkpoint(&command, &library);
}

#[test]
fn a_users_binary_refuses_xassets_sizes_and_names_itself_in_help() {
    // Named as its lines are (`FitModel::program`: the running executable's file name).
    let me = running_program();
    fn args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
        let mut a = vec!["fit_mlp", "--device", "cpu"];
        a.extend_from_slice(extra);
        a
    }
    for size in ["--width", "--heads", "--ff", "--layers"] {
        let e = fit::options_from(&MLP, args(&[size, "2"])).expect_err("refused");
        assert_eq!(e.kind(), clap::error::ErrorKind::UnknownArgument, "{size}");
        let text = e.render().to_string();
        assert!(text.contains(size), "{text}");
        assert!(text.contains(&format!("Usage: {me}")), "{text}");
    }
    // The data's shape and every option of the run loop are the user's.
    let o = fit::options_from(&MLP, args(&["--scales", "3", "--epochs", "1"])).expect("parses");
    assert_eq!((o.scales, o.epochs), (3, 1));
    let help = fit::options_from(&MLP, args(&["--help"])).expect_err("help");
    assert_eq!(help.kind(), clap::error::ErrorKind::DisplayHelp);
    let help = help.render().to_string();
    assert!(help.contains(&format!("Usage: {me} [OPTIONS]")), "{help}");
    assert!(help.contains("two-layer MLP"), "{help}");
    for absent in ["--width", "--heads", "--ff ", "--layers", "XAsset model"] {
        assert!(
            !help.contains(absent),
            "`{absent}` in the user's --help:\n{help}"
        );
    }
    let version = fit::options_from(&MLP, args(&["--version"])).expect_err("version");
    assert!(
        version.render().to_string().starts_with(&format!("{me} ")),
        "{}",
        version.render()
    );
    // XAsset's sizes are the ztrain command's, and a model's that reads them.
    let xasset = ztrain::xasset::XAssetFit;
    let o =
        fit::options_from(&xasset, ["ztrain", "--width", "64", "--layers", "2"]).expect("ztrain");
    assert_eq!((o.width, o.layers), (64, 2));
    let o = fit::options_from(&UsersXAsset, ["mine", "--heads", "2"]).expect("a user's XAsset");
    assert_eq!(o.heads, 2);
}
