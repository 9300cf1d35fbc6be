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
