use super::*;
use clap::CommandFactory;
use rstest::rstest;

fn parse(args: &[&str]) -> Options {
    Options::try_parse_from(std::iter::once("ztrain").chain(args.iter().copied())).expect("parses")
}

#[test]
fn the_command_definition_is_consistent() {
    Options::command().debug_assert();
}

#[test]
fn defaults_are_the_xasset_size_on_synthetic_data() {
    let c = parse(&[]).config().expect("valid");
    assert_eq!(
        (
            c.model.scales,
            c.model.features,
            c.model.width,
            c.model.heads,
            c.model.ff
        ),
        (12, 193, 256, 4, 1024)
    );
    assert_eq!(c.batch, 256);
    assert!(matches!(c.data, DataSource::Synthetic { .. }));
}

#[rstest]
#[case(&["--width", "10", "--heads", "4"], "multiple")]
#[case(&["--batch", "0"], "--batch")]
#[case(&["--epochs", "0"], "--epochs")]
#[case(&["--validate-fraction", "1"], "--validate-fraction")]
#[case(&["--lr=-1"], "--lr")]
#[case(&["--clip-grad", "0"], "--clip-grad")]
#[case(&["--momentum", "0.9"], "--optimizer sgd")]
#[case(&["--optimizer", "sgd", "--nesterov"], "--nesterov")]
#[case(&["--optimizer", "sgd", "--momentum=-1"], "--momentum")]
#[case(&["--samples", "1"], "--samples")]
#[case(&["--stop-after", "3"], "--checkpoint")]
#[case(&["--features", "0"], "--features")]
#[case(&["--readback-every", "0"], "--readback-every must be at least 1")]
fn bad_values_are_named(#[case] args: &[&str], #[case] named: &str) {
    let err = parse(args).config().expect_err("invalid");
    assert!(err.to_string().contains(named), "{err}");
}

#[test]
fn arena_options_override_and_sizes_take_suffixes() {
    let o = parse(&["--arena-bytes", "1M", "--segment-bytes", "512K", "--poison"]);
    let a = o
        .arena
        .engine_config()
        .expect("parses")
        .arena_config(4 << 30)
        .expect("valid");
    assert_eq!(
        (a.initial_bytes, a.segment_bytes, a.poison),
        (1 << 20, 512 << 10, true)
    );
    assert!(Options::try_parse_from(["ztrain", "--arena-bytes", "12Q"]).is_err());
}

/// `--optimizer sgd --momentum M --nesterov` reaches the trainer's configuration (with the
/// run's weight decay) and the run's JSON (so a checkpoint of one optimiser does not resume as
/// the other); AdamW's configuration and JSON are unchanged.
#[test]
fn sgd_is_chosen_with_its_momentum() {
    let c = parse(&[
        "--optimizer",
        "sgd",
        "--momentum",
        "0.9",
        "--nesterov",
        "--weight-decay",
        "0",
    ])
    .config()
    .expect("valid");
    let want = zgrad::SgdHyper {
        momentum: 0.9,
        nesterov: true,
        weight_decay: 0.0,
        ..zgrad::SgdHyper::default()
    };
    assert_eq!(c.sgd, Some(want));
    assert_eq!(crate::step::trainer_config(&c, 10).sgd, Some(want));
    assert_eq!(c.to_json(None)["optimizer"]["name"], "sgd");
    let adamw = parse(&[]).config().expect("valid");
    assert_eq!(adamw.sgd, None);
    assert!(adamw.to_json(None).get("optimizer").is_none());
    assert_eq!(crate::step::trainer_config(&adamw, 10).sgd, None);
}
