use super::*;
use rstest::rstest;

const G: u64 = 1 << 30;
const M: u64 = 1 << 20;

fn vars(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect()
}

/// The default XAsset batched step's peaks (zgrad's plan, 2026-11-26).
fn planned() -> ClassBytes {
    let mut p = ClassBytes::default();
    p.add(AllocClass::Persistent, 13 * M);
    p.add(AllocClass::Saved, 53 * M);
    p.add(AllocClass::Scratch, 57 * M);
    p
}

#[test]
fn without_a_plan_the_fixed_defaults_and_the_default_cap_resolve() {
    let c = ArenaOverrides::new().resolve(4 * G).expect("valid");
    let d = ArenaConfig::default();
    assert_eq!(
        (c.initial_bytes, c.segment_bytes, c.overflow_reserve_bytes),
        (d.initial_bytes, d.segment_bytes, d.overflow_reserve_bytes)
    );
    assert_eq!(c.cap_bytes, None);
    assert_eq!(c.cap_for(4 * G), default_cap(4 * G));
    assert_eq!(default_cap(4 * G), 3 * G);
}

#[test]
fn a_plan_sizes_segments_initial_scratch_and_the_reserve() {
    let c = ArenaOverrides::new()
        .planned(planned())
        .resolve(80 * G)
        .expect("valid");
    // 123 MiB planned: segments of 1/8 (16 MiB), the scratch peak beyond the saved one
    // (57.0 - 53.3 MiB: the rest is lent from what saved blocks give back) in whole segments,
    // a reserve of 1/32 (4 MiB): no longer 64 MiB each.
    assert_eq!(c.segment_bytes, 16 * M);
    assert_eq!(c.initial_bytes, 16 * M);
    assert_eq!(c.overflow_reserve_bytes, 4 * M);
}

#[test]
fn a_tiny_plan_keeps_the_smallest_segment_and_reserve() {
    let mut tiny = ClassBytes::default();
    tiny.add(AllocClass::Scratch, 1 << 10);
    let c = ArenaOverrides::new()
        .planned(tiny)
        .resolve(G)
        .expect("valid");
    assert_eq!(
        (c.segment_bytes, c.initial_bytes, c.overflow_reserve_bytes),
        (
            PLANNED_SEGMENT_MIN,
            PLANNED_SEGMENT_MIN,
            PLANNED_SEGMENT_MIN
        )
    );
}

#[rstest]
#[case::explicit(ArenaOverrides::new().arena_bytes(128 * M).overflow_reserve(32 * M))]
#[case::environment(ArenaOverrides::from_vars(vars(&[
    ("ZMEM_ARENA_BYTES", "128M"),
    ("ZMEM_OVERFLOW_RESERVE_BYTES", "32M"),
])).expect("parses"))]
fn a_given_size_wins_over_the_plan(#[case] given: ArenaOverrides) {
    let c = given.planned(planned()).resolve(80 * G).expect("valid");
    // The initial size given, so the segment keeps its fixed default (it must divide it).
    assert_eq!(c.initial_bytes, 128 * M);
    assert_eq!(c.segment_bytes, 64 * M);
    assert_eq!(c.overflow_reserve_bytes, 32 * M);
}

#[test]
fn a_given_segment_sizes_the_planned_initial_scratch() {
    let c = ArenaOverrides::new()
        .segment_bytes(32 * M)
        .planned(planned())
        .resolve(80 * G)
        .expect("valid");
    assert_eq!((c.segment_bytes, c.initial_bytes), (32 * M, 32 * M));
}

#[test]
fn a_plan_larger_than_the_cap_is_clamped_to_whole_segments_under_it() {
    let mut big = ClassBytes::default();
    big.add(AllocClass::Scratch, 3 * G);
    let c = ArenaOverrides::new()
        .planned(big)
        .resolve(G)
        .expect("valid");
    assert!(c.initial_bytes <= default_cap(G), "{c}");
    assert_eq!(c.initial_bytes % c.segment_bytes, 0, "{c}");
}

#[test]
fn a_whole_config_converts_to_explicit_overrides() {
    let full = ArenaConfig {
        initial_bytes: 2 * M,
        segment_bytes: M,
        cap_bytes: Some(8 * M),
        overflow_reserve_bytes: M,
        poison: true,
        ..ArenaConfig::default()
    };
    let o = ArenaOverrides::from(full.clone()).planned(planned());
    assert!(ArenaSetting::ALL.iter().all(|s| o.is_overridden(*s)));
    assert_eq!(o.resolve(G).expect("valid"), full);
}

#[test]
fn a_refused_setting_is_a_typed_error_naming_it() {
    let err = ArenaOverrides::new()
        .arena_bytes(100 * M)
        .resolve(4 * G)
        .expect_err("not whole segments");
    match err {
        MemError::Setting { setting, name, .. } => {
            assert_eq!(setting, ArenaSetting::InitialBytes);
            assert_eq!(name, "EngineConfig::arena_bytes");
        }
        other => panic!("expected Setting, got {other:?}"),
    }
}

/// ztrain's option proptest found `--arena-bytes 18446744073709551615` overflowing the
/// "nearest whole segments" arithmetic of the refusal (a panic, before this was saturating).
#[rstest]
#[case(u64::MAX, 64 * M)]
#[case(u64::MAX - 1, 256)]
fn an_initial_size_near_two_to_the_64_is_refused_not_a_panic(#[case] init: u64, #[case] seg: u64) {
    let err = ArenaOverrides::new()
        .arena_bytes(init)
        .segment_bytes(seg)
        .resolve(u64::MAX)
        .expect_err("above the cap");
    assert!(
        matches!(
            err,
            MemError::Setting {
                setting: ArenaSetting::InitialBytes,
                ..
            }
        ),
        "{err}"
    );
}
