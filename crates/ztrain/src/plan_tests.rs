//! The arena sized from the plan (issue 21 item 6), on the accounting-only simulated device:
//! the default run's steps and evaluation, its arena with zmem's fixed defaults and sized from
//! its plan.

use super::*;
use crate::cli::Options;
use crate::console::Console;
use clap::Parser as _;
use zcompute::{AllocClass, SimDriver};
use zdevice::SimConfig;
use zgrad::{EvalSource, StepSource, Trainer, XAsset};

const M: u64 = 1 << 20;
/// An H100's memory, as the accounting device's.
const DEVICE: u64 = 80 << 30;

fn options(args: &[&str]) -> Options {
    let mut argv = vec!["ztrain", "--device", "sim"];
    argv.extend_from_slice(args);
    Options::try_parse_from(argv).expect("parses")
}

/// The arena `args` give the run on a device of [`DEVICE`] bytes: fixed defaults, or sized
/// from the plan.
fn arena(args: &[&str], sized: bool) -> ArenaConfig {
    let o = options(args);
    let config = o.config().expect("config");
    let mut engine = o.arena.engine_config().expect("engine");
    if sized {
        engine = sized_engine(engine, &config, 1).expect("planned");
    }
    engine.arena_config(DEVICE).expect("valid")
}

/// Peak live and peak reserved bytes of the run `args` describe, on the accounting device:
/// three steps (the last one smaller, as an epoch's last batch) and an evaluation of the
/// default validation split in `--batch` chunks, as `ztrain` runs them.
fn peaks(args: &[&str], sized: bool) -> (u64, u64) {
    let o = options(args);
    let config = o.config().expect("config");
    let mut engine = o.arena.engine_config().expect("engine");
    if sized {
        engine = sized_engine(engine, &config, 1).expect("planned");
    }
    let b = engine
        .sim_driver(SimDriver::new(SimConfig::accounting(DEVICE)))
        .expect("engine opens");
    let model = XAsset::zeroed(&b, config.model).expect("model");
    let mut trainer = Trainer::new(b.clone(), model, trainer_config(&config, 3)).expect("trainer");
    let per = config.model.scales * config.model.features;
    let x = vec![0.0f32; config.batch * per];
    let y = vec![0.0f32; config.batch];
    for n in [config.batch, config.batch, config.batch / 2 + 1] {
        trainer
            .step(StepSource::host(&x[..n * per], &y[..n], n))
            .expect("step");
    }
    let val = 2048;
    trainer
        .evaluate(EvalSource::Host(
            &vec![0.0f32; val * per],
            &vec![0.0f32; val],
        ))
        .expect("evaluation");
    let d = b.arena().diagnostics();
    assert_eq!(d.overflow.calls, 0, "{d}");
    (d.peak_live_bytes, d.peak_reserved_bytes)
}

#[test]
fn the_default_run_s_arena_is_sized_from_its_plan() {
    let fixed = arena(&[], false);
    assert_eq!(
        (
            fixed.initial_bytes,
            fixed.segment_bytes,
            fixed.overflow_reserve_bytes
        ),
        (64 * M, 64 * M, 64 * M)
    );
    // The default XAsset batched step plans about 123 MiB (persistent 12.8, saved 53.3,
    // scratch 57.0): segments of an eighth of it, the scratch peak beyond the saved one up
    // front (the rest is lent from memory saved tensors give back), a reserve of a
    // thirty-second.
    let sized = arena(&[], true);
    assert_eq!(
        (
            sized.initial_bytes,
            sized.segment_bytes,
            sized.overflow_reserve_bytes
        ),
        (16 * M, 16 * M, 4 * M)
    );
    assert_eq!(sized.cap_bytes, fixed.cap_bytes);
}

#[test]
fn an_explicit_size_still_wins_over_the_plan() {
    let args = [
        "--arena-bytes",
        "256M",
        "--segment-bytes",
        "128M",
        "--overflow-reserve",
        "32M",
    ];
    let a = arena(&args, true);
    assert_eq!(
        (a.initial_bytes, a.segment_bytes, a.overflow_reserve_bytes),
        (256 * M, 128 * M, 32 * M)
    );
    // Given alone, the initial size keeps the fixed segment (it must divide it); the reserve
    // still follows the plan.
    let a = arena(&["--arena-bytes", "128M"], true);
    assert_eq!(
        (a.initial_bytes, a.segment_bytes, a.overflow_reserve_bytes),
        (128 * M, 64 * M, 4 * M)
    );
}

/// Reserved over live for the default run, both schedules, eager and captured, L = 1 and 3:
/// sized from the plan, always below the fixed defaults', and at most 1.5 (issue 21 item 6).
/// The batched eager step is the hard case: its saved tensors live in the held region and
/// its backward's scratch, allocated while they are freed, used to take segments of its own
/// (2.17x at L = 1 before the held region lent its free memory to scratch).
#[test]
#[allow(
    clippy::print_stderr,
    reason = "every case's ratio, for `--nocapture` (the coordinator's record)"
)]
fn reserved_over_live_of_the_default_run_sized_from_its_plan() {
    let cases: [&[&str]; 6] = [
        &[],
        &["--capture"],
        &["--schedule", "per-sample"],
        &["--schedule", "per-sample", "--capture"],
        &["--layers", "3"],
        &["--layers", "3", "--capture"],
    ];
    let mut above = Vec::new();
    for args in cases {
        let (live, reserved) = peaks(args, true);
        let (fixed_live, fixed_reserved) = peaks(args, false);
        let ratio = reserved as f64 / live as f64;
        let fixed = fixed_reserved as f64 / fixed_live as f64;
        let says = format!(
            "{args:?}: live {live} reserved {reserved} ({ratio:.2}x; fixed defaults {fixed:.2}x)"
        );
        eprintln!("{says}");
        assert!(
            reserved < fixed_reserved,
            "{says}: reserves more than the fixed defaults"
        );
        if ratio > 1.5 {
            above.push(says);
        }
    }
    assert!(above.is_empty(), "above 1.5: {above:#?}");
}

#[test]
fn the_plan_s_peaks_are_what_the_sizes_follow() {
    let o = options(&[]);
    let config = o.config().expect("config");
    let request = PlanRequest::new(
        config.model,
        config.batch,
        trainer_config(&config, 1),
        ArenaConfig::default(),
    );
    let p = zgrad::plan::plan_schedule(&request, config.schedule).expect("plan");
    assert!(p.peak.get(AllocClass::Saved) > 0 && p.peak.get(AllocClass::Scratch) > 0);
}

/// `--batch 2^64-1` is valid (a step takes what the data set has): the plan's step is the data
/// set's size, not a batch no host could hold. (`tests/reliability` extreme_but_valid_values_train
/// failed with "--plan: a batch of 18446744073709551615 samples ... does not fit" before.)
#[test]
fn a_batch_beyond_the_data_plans_the_data_s_samples() {
    let o = options(&[
        "--batch",
        "18446744073709551615",
        "--samples",
        "64",
        "--scales",
        "3",
        "--features",
        "6",
        "--width",
        "16",
        "--heads",
        "2",
        "--ff",
        "32",
    ]);
    let config = o.config().expect("config");
    let engine = o.arena.engine_config().expect("engine");
    let sized = sized_engine(engine, &config, 1).expect("plans the data set's 64 samples");
    let a = sized.arena_config(DEVICE).expect("valid");
    assert_eq!(
        a.segment_bytes,
        zcompute::ArenaOverrides::new()
            .planned(Default::default())
            .resolve(DEVICE)
            .unwrap()
            .segment_bytes
    );
}

/// Issue 21 item 2: with the training set on the device the plan holds it (its persistent
/// peak and arena grow by the set's bytes) and says so in its lines and JSON; `auto` decides
/// from the plan as the run does (a simulated device too small keeps it on the host). The plan
/// against the run: `the_plan_is_within_5_percent_of_ztrain_s_own_run`.
#[test]
fn the_plan_counts_a_training_set_on_the_device() {
    let small = [
        "--samples",
        "5000",
        "--scales",
        "3",
        "--features",
        "6",
        "--width",
        "16",
        "--heads",
        "2",
        "--ff",
        "32",
        "--batch",
        "64",
    ];
    let with = |extra: &[&str]| {
        let mut v = small.to_vec();
        v.extend_from_slice(extra);
        options(&v)
    };
    let host = make(&with(&["--data-on", "host"])).expect("plan");
    let dev = make(&with(&["--data-on", "device"])).expect("plan");
    let auto = make(&with(&[])).expect("plan");
    // The set, its index buffer and the queued steps' table (windows of 32 steps).
    let bytes = zgrad::device_data_bytes(4000, 18, 1, 4) + zgrad::step_table_bytes(32, 64, 4);
    assert_eq!(
        dev.data,
        DataPlan {
            samples: Some(4000),
            bytes,
            on_device: true,
            validation_samples: Some(1000),
            validation_bytes: zgrad::validation_data_bytes(1000, 18, 64, 4),
            validation_on_device: true,
        }
    );
    assert!(!host.data.on_device && auto.data.on_device, "{auto:?}");
    // Both sets on the device (and the final evaluation's logits of the training set).
    let both = bytes + dev.data.validation_bytes;
    for (h, d) in host.plan.schedules.iter().zip(&dev.plan.schedules) {
        let grown = d.peak.get(AllocClass::Persistent) - h.peak.get(AllocClass::Persistent);
        assert!(
            grown >= both && grown < both + both / 10,
            "{:?}: persistent grew by {grown} for {both}",
            d.schedule
        );
    }
    let lines = to_lines(&dev, "ztrain").join("\n");
    assert!(
        lines.contains("training set on the device: 4000 samples, 320.8 KiB"),
        "{lines}"
    );
    assert_eq!(to_json(&dev)["training_set"]["on_device"], true);
    let cramped = make(&with(&["--sim-memory", "80M"])).expect("plan");
    assert!(!cramped.data.on_device, "{cramped:?}");
    assert!(
        to_lines(&cramped, "ztrain")
            .join("\n")
            .contains("training set on the host: 4000 samples")
    );
}

/// The arena diagnostics of ztrain's own run of `args` (`run::train`: the sets placed as
/// `--data-on` says, the epochs of steps with their short last batch, the validation pass
/// every epoch, the final evaluation of the training set), on the accounting device with
/// the arena sized from the run's plan as `ztrain` sizes it.
fn ztrain_run(args: &[&str]) -> zmem::Diagnostics {
    let o = options(args);
    let config = o.config().expect("config");
    let engine = o.arena.engine_config().expect("engine");
    let (engine, planned) = sized_engine_and_plan(engine, &config, 1).expect("sized");
    let b = engine
        .sim_driver(SimDriver::new(SimConfig::accounting(DEVICE)))
        .expect("engine opens");
    let estimate = crate::budget::Estimate::of(&config).expect("estimate");
    let room = crate::run::device_room(&engine, planned.as_ref(), Some(&estimate), DEVICE);
    let stop = crate::signals::StopSignal::never();
    let ctx = crate::run::Context {
        options: &o,
        world: 1,
        rank: 0,
        config: &config,
        backend_name: "sim",
        description: "the accounting device",
        show_bar: false,
        stop: &stop,
        room: Some(room),
        model_line: String::new(),
    };
    let mut out = Vec::new();
    crate::run::train(
        &crate::xasset::XAssetFit,
        b.clone(),
        None,
        &ctx,
        &mut Console::new(&mut out, "ztrain"),
    )
    .expect("the run");
    let d = b.arena().diagnostics();
    assert_eq!(d.overflow.calls, 0, "{d}");
    d
}

/// Issue 21's "the plan within 5% of the run": `ztrain --plan` against ztrain's own run of
/// the same options (two epochs of the default model, batch 256), every class, all classes
/// together and the arena, within 5%: the training set on the device or the host (pinned
/// batches through two landing buffers), the validation set on the device (captured chunks
/// with `--capture`) or the host, both schedules, L = 1 and 3. Before the plan counted the
/// evaluations, the sets and the run's arena sizing it missed the validation pass's scratch
/// and graph memory and planned on zmem's fixed 64 MiB segments (see the commit).
#[rstest::rstest]
#[case::device_eager(&[])]
#[case::device_captured(&["--capture"])]
#[case::host_eager(&["--data-on", "host"])]
#[case::host_captured(&["--data-on", "host", "--capture"])]
#[case::three_blocks_captured(&["--layers", "3", "--capture"])]
#[case::per_sample(&["--schedule", "per-sample", "--samples", "640", "--batch", "32"])]
#[case::per_sample_captured(&["--schedule", "per-sample", "--capture", "--samples", "640", "--batch", "32"])]
fn the_plan_is_within_5_percent_of_ztrain_s_own_run(#[case] extra: &[&str]) {
    let mut args = vec!["--samples", "5000", "--epochs", "2", "--sim-memory", "80G"];
    args.extend_from_slice(extra);
    let report = make(&options(&args)).expect("plan");
    let config = options(&args).config().expect("config");
    let planned = report.plan.schedule(config.schedule).expect("planned");
    let real = ztrain_run(&args);
    let mut off = Vec::new();
    let mut check = |what: String, p: u64, r: u64| {
        let says = format!("{extra:?} {what}: plan {p} run {r}");
        record(&says);
        if p.abs_diff(r) as f64 > 0.05 * r as f64 {
            off.push(says);
        }
    };
    for class in AllocClass::ALL {
        let (p, r) = (planned.peak.get(class), real.peak_bytes_by_class.get(class));
        check(class.to_string(), p, r);
    }
    check(
        "all classes".into(),
        planned.peak.total(),
        real.peak_bytes_by_class.total(),
    );
    check("arena".into(), planned.arena_bytes, real.capacity);
    assert!(off.is_empty(), "beyond 5%: {off:#?}\n{report:?}");
}

#[allow(
    clippy::print_stderr,
    reason = "every class's plan and run, for `--nocapture` (the coordinator's record)"
)]
fn record(line: &str) {
    eprintln!("{line}");
}

/// Issue 45: `--plan` with a size beyond any machine said "timed out after 60 s waiting for
/// event" (the accounting device's step gave up) and named no option. Now the option that
/// makes the need, and the memory it would need, are named before anything is planned.
#[rstest::rstest]
#[case::width(&["--width", "1000000"], "--width 1000000")]
#[case::ff(&["--ff", "100000000"], "--ff 100000000")]
#[case::cpu(&["--device", "cpu", "--width", "1000000"], "--width 1000000")]
fn a_plan_beyond_any_machine_names_the_option_and_the_size(
    #[case] args: &[&str],
    #[case] named: &str,
) {
    let mut argv = vec!["ztrain", "--device", "sim", "--plan"];
    argv.extend_from_slice(args);
    let o = Options::try_parse_from(argv).expect("parses");
    let e = make(&o).expect_err("no machine holds it").to_string();
    assert!(e.contains(named), "{e}");
    assert!(e.contains("TiB"), "the size it would need: {e}");
    assert!(!e.contains("timed out"), "{e}");
}
