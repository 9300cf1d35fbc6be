use super::*;
use rstest::rstest;

const G: u64 = 1 << 30;
const M: u64 = 1 << 20;

fn vars(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect()
}

fn option_names(s: ArenaSetting) -> &'static str {
    match s {
        ArenaSetting::InitialBytes => "--arena-bytes",
        ArenaSetting::SegmentBytes => "--segment-bytes",
        ArenaSetting::CapBytes => "--arena-cap",
        _ => "--other",
    }
}

fn refused(cfg: &EngineConfig, total: u64) -> (ArenaSetting, String) {
    match cfg.arena_config(total) {
        Err(e @ ComputeError::ArenaSetting { setting, .. }) => (setting, e.to_string()),
        other => panic!("expected ArenaSetting, got {other:?}"),
    }
}

#[rstest]
#[case::zero(0, None, ArenaSetting::InitialBytes, "--arena-bytes 0 B")]
#[case::one(1, None, ArenaSetting::InitialBytes, "--arena-bytes 1 B")]
#[case::four_k(4 << 10, None, ArenaSetting::InitialBytes, "--arena-bytes 4.0 KiB")]
#[case::not_whole(100 * M, None, ArenaSetting::InitialBytes, "e.g. 64.0 MiB or 128.0 MiB")]
#[case::above_default_cap(100 * G, None, ArenaSetting::InitialBytes, "3/4 of the device's memory")]
#[case::cap_above_device(64 * M, Some(5 * G), ArenaSetting::CapBytes, "--arena-cap 5.0 GiB")]
#[case::cap_below_initial(128 * M, Some(64 * M), ArenaSetting::InitialBytes, "--arena-cap")]
fn values_the_arena_would_change_are_refused(
    #[case] initial: u64,
    #[case] cap: Option<u64>,
    #[case] setting: ArenaSetting,
    #[case] says: &str,
) {
    let mut cfg = EngineConfig::new()
        .labels(option_names)
        .arena_bytes(initial);
    if let Some(c) = cap {
        cfg = cfg.arena_cap(c);
    }
    let (got, text) = refused(&cfg, 4 * G);
    assert_eq!(got, setting, "{text}");
    assert!(text.contains(says), "{text}");
}

#[rstest]
#[case::tiny_segment(16, "must be between 256 B")]
#[case::segment_above_cap(4 * G, "must be between 256 B and the default arena cap")]
fn segments_outside_their_range_are_refused(#[case] seg: u64, #[case] says: &str) {
    let cfg = EngineConfig::new().segment_bytes(seg).arena_bytes(seg);
    let (got, text) = refused(&cfg, 4 * G);
    assert_eq!(got, ArenaSetting::SegmentBytes, "{text}");
    assert!(text.starts_with("EngineConfig::segment_bytes"), "{text}");
    assert!(text.contains(says), "{text}");
}

#[test]
fn the_overflow_reserve_must_fit_beside_the_arena() {
    let cfg = EngineConfig::new().overflow_reserve(4 * G);
    let (got, text) = refused(&cfg, 4 * G);
    assert_eq!(got, ArenaSetting::OverflowReserveBytes, "{text}");
    assert!(text.contains("exceeds the device's memory"), "{text}");
}

#[rstest]
#[case(64 * M, None)]
#[case(3 * G, None)]
#[case(4 * G - 64 * M, Some(4 * G))]
fn values_it_honours_pass_unchanged(#[case] initial: u64, #[case] cap: Option<u64>) {
    let mut cfg = EngineConfig::new().arena_bytes(initial);
    if let Some(c) = cap {
        cfg = cfg.arena_cap(c);
    }
    let a = cfg.arena_config(4 * G).expect("honoured");
    assert_eq!((a.initial_bytes, a.cap_bytes), (initial, cap));
}

#[test]
fn precedence_is_defaults_then_environment_then_overrides() {
    let env = EngineConfig::from_vars(vars(&[
        ("ZMEM_ARENA_BYTES", "128M"),
        ("ZMEM_SEGMENT_BYTES", "32M"),
        ("ZMEM_POISON", "1"),
    ]))
    .expect("parses");
    let merged = env.clone().arena_bytes(64 * M).merged();
    // The override wins over the variable; the variable over the default; the rest default.
    assert_eq!(merged.initial_bytes, 64 * M);
    assert_eq!(merged.segment_bytes, 32 * M);
    assert!(merged.poison);
    assert_eq!(
        merged.overflow_reserve_bytes,
        ArenaConfig::default().overflow_reserve_bytes
    );
    assert_eq!(env.merged().initial_bytes, 128 * M);
    // An override can also turn a variable's switch off.
    assert!(!env.poison(false).merged().poison);
}

#[test]
fn a_setting_from_the_environment_is_named_by_its_variable() {
    let cfg = EngineConfig::from_vars(vars(&[("ZMEM_ARENA_BYTES", "4K")]))
        .expect("parses")
        .labels(option_names);
    let (_, text) = refused(&cfg, 4 * G);
    assert!(text.starts_with("ZMEM_ARENA_BYTES 4.0 KiB"), "{text}");
    // Overridden, the same setting is named by its label.
    let (_, text) = refused(&cfg.arena_bytes(4 << 10), 4 * G);
    assert!(text.starts_with("--arena-bytes 4.0 KiB"), "{text}");
}

#[rstest]
#[case("ZMEM_ARENA_BYTES", "lots", ArenaSetting::InitialBytes)]
#[case("ZMEM_POISON", "maybe", ArenaSetting::Poison)]
#[case("ZMEM_TIMELINE_EVENTS", "-1", ArenaSetting::TimelineEvents)]
fn a_malformed_variable_is_a_typed_error_naming_it(
    #[case] var: &str,
    #[case] value: &str,
    #[case] setting: ArenaSetting,
) {
    match EngineConfig::from_vars(vars(&[(var, value)])) {
        Err(ComputeError::ArenaSetting {
            setting: s,
            name,
            value: v,
            ..
        }) => assert_eq!((s, name, v.as_str()), (setting, var, value)),
        other => panic!("expected ArenaSetting, got {other:?}"),
    }
}
