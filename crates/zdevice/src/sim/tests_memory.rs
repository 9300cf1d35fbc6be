//! Memory: capacity, granularity, generations, poison, pools, stream-ordered frees.

use proptest::prelude::*;

use super::{KernelFault, SimConfig, SimDriver};
use crate::driver::{CuCode, Driver};
use crate::types::*;

fn sim_with(capacity: u64) -> SimDriver {
    let d = SimDriver::new(SimConfig::with_capacity(capacity));
    d.init().expect("init");
    d
}

#[test]
fn out_of_memory_now_and_never_both_answer_2_and_capacity_tells_them_apart() {
    let d = sim_with(1 << 20);
    assert_eq!(d.mem_get_info().unwrap(), (1 << 20, 1 << 20));
    let big = d.mem_alloc(768 << 10).unwrap();
    let now = d.mem_alloc(512 << 10).unwrap_err();
    let never = d.mem_alloc(2 << 20).unwrap_err();
    assert_eq!(now.cuda_code(), Some(CuCode::OUT_OF_MEMORY));
    assert_eq!(never.cuda_code(), Some(CuCode::OUT_OF_MEMORY));
    assert_eq!(d.capacity(), 1 << 20);
    assert_eq!(d.device_total_mem(0).unwrap(), 1 << 20);
    d.mem_free(big).unwrap();
    d.mem_alloc(512 << 10).unwrap();
}

#[test]
fn usage_counts_in_256_byte_units_and_addresses_are_aligned() {
    let d = sim_with(1 << 20);
    let a = d.mem_alloc(1).unwrap();
    let b = d.mem_alloc(257).unwrap();
    assert_eq!(d.used_bytes(), 256 + 512);
    assert_eq!((a.0 & 0xFF, b.0 & 0xFF), (0, 0));
    assert_eq!(d.mem_get_info().unwrap().0, (1 << 20) - 768);
    assert_eq!(
        d.mem_alloc(0).unwrap_err().cuda_code(),
        Some(CuCode::INVALID_VALUE)
    );
}

#[test]
fn free_of_unknown_or_stale_pointer_is_invalid_value() {
    let d = sim_with(1 << 20);
    let a = d.mem_alloc(256).unwrap();
    d.mem_free(a).unwrap();
    assert_eq!(
        d.mem_free(a).unwrap_err().cuda_code(),
        Some(CuCode::INVALID_VALUE)
    );
    assert_eq!(
        d.mem_free(DevicePtr(12345)).unwrap_err().cuda_code(),
        Some(CuCode::INVALID_VALUE)
    );
    let b = d.mem_alloc(256).unwrap();
    assert_eq!(
        a.0 & 0xFFFF_FFFF_FFFF,
        b.0 & 0xFFFF_FFFF_FFFF,
        "the range is reissued"
    );
    assert_ne!(a, b, "with a new generation");
    assert_eq!(
        d.mem_free(a).unwrap_err().cuda_code(),
        Some(CuCode::INVALID_VALUE)
    );
    assert!(matches!(d.peek(a, 4), Err(KernelFault::Stale { .. })));
    d.mem_free(b).unwrap();
}

#[test]
fn pointer_arithmetic_resolves_within_the_allocation_only() {
    let d = sim_with(1 << 20);
    let a = d.mem_alloc(1000).unwrap();
    d.memset_d8(a.offset(500), 7, 500).unwrap();
    assert_eq!(d.peek(a.offset(999), 1).unwrap(), [7]);
    assert!(matches!(
        d.peek(a.offset(999), 2),
        Err(KernelFault::OutOfBounds { .. })
    ));
    // Past the requested size but inside the 256-byte rounding is still out of bounds.
    assert_eq!(
        d.memset_d8(a.offset(1000), 0, 1).unwrap_err().cuda_code(),
        Some(CuCode::INVALID_VALUE)
    );
}

#[test]
fn freed_memory_is_poisoned_for_its_next_owner() {
    let d = sim_with(1 << 20);
    let a = d.mem_alloc(64).unwrap();
    d.memset_d8(a, 0, 64).unwrap();
    d.mem_free(a).unwrap();
    let b = d.mem_alloc(64).unwrap();
    let mut back = [0u8; 64];
    d.memcpy_dtoh(&mut back, b).unwrap();
    assert_eq!(back, [0xFF; 64]);
    assert!(d.peek_f32(b, 16).unwrap().iter().all(|v| v.is_nan()));
    let quiet = SimDriver::new(SimConfig {
        poison_on_free: false,
        ..SimConfig::default()
    });
    quiet.init().unwrap();
    let c = quiet.mem_alloc(64).unwrap();
    assert_eq!(quiet.peek(c, 64).unwrap(), vec![0; 64]);
}

#[test]
fn stream_ordered_free_releases_when_the_stream_gets_there() {
    let d = sim_with(1 << 20);
    let s = d.stream_create(StreamKind::NonBlocking).unwrap();
    let a = d.mem_alloc_async(4096, s).unwrap();
    d.memset_d8_async(a, 1, 4096, s).unwrap();
    d.mem_free_async(a, s).unwrap();
    assert_eq!(
        d.mem_free_async(a, s).unwrap_err().cuda_code(),
        Some(CuCode::INVALID_VALUE)
    );
    assert_eq!(d.peek(a, 1).unwrap(), [0xFF], "nothing ran yet");
    d.stream_synchronize(s).unwrap();
    assert!(d.peek(a, 1).is_err(), "released in stream order");
    assert_eq!(
        d.used_bytes(),
        0,
        "the default pool keeps nothing (threshold 0)"
    );
}

#[test]
fn pools_keep_memory_up_to_their_threshold_and_trim() {
    let d = sim_with(1 << 20);
    let s = d.stream_create(StreamKind::NonBlocking).unwrap();
    let pool = d
        .mem_pool_create(PoolProps {
            ordinal: 0,
            max_size: 0,
        })
        .unwrap();
    d.mem_pool_set_release_threshold(pool, u64::MAX).unwrap();
    let a = d.mem_alloc_from_pool_async(100_000, pool, s).unwrap();
    let reserved = d.mem_pool_reserved(pool).unwrap();
    assert_eq!(reserved, 100_096);
    d.mem_free_async(a, s).unwrap();
    d.stream_synchronize(s).unwrap();
    assert_eq!(
        d.mem_pool_reserved(pool).unwrap(),
        reserved,
        "kept for reuse"
    );
    assert_eq!(
        d.used_bytes(),
        reserved,
        "reserved bytes count against capacity"
    );
    let b = d.mem_alloc_from_pool_async(50_000, pool, s).unwrap();
    assert_eq!(
        d.mem_pool_reserved(pool).unwrap(),
        reserved,
        "reused, not grown"
    );
    d.mem_pool_trim_to(pool, 0).unwrap();
    assert_eq!(
        d.mem_pool_reserved(pool).unwrap(),
        50_176,
        "never below what is in use"
    );
    d.mem_free_async(b, s).unwrap();
    d.stream_synchronize(s).unwrap();
    d.mem_pool_trim_to(pool, 0).unwrap();
    assert_eq!((d.mem_pool_reserved(pool).unwrap(), d.used_bytes()), (0, 0));
    let capped = d
        .mem_pool_create(PoolProps {
            ordinal: 0,
            max_size: 4096,
        })
        .unwrap();
    let e = d.mem_alloc_from_pool_async(8192, capped, s).unwrap_err();
    assert_eq!(e.cuda_code(), Some(CuCode::OUT_OF_MEMORY));
    d.mem_pool_destroy(capped).unwrap();
    assert_eq!(
        d.mem_pool_reserved(capped).unwrap_err().cuda_code(),
        Some(CuCode::INVALID_VALUE)
    );
}

#[test]
fn host_memory_round_trips_and_async_copies_use_it_in_stream_order() {
    let d = sim_with(1 << 20);
    let s = d.stream_create(StreamKind::NonBlocking).unwrap();
    let h = d.mem_alloc_host(16).unwrap();
    let p = d.mem_alloc(16).unwrap();
    d.host_write(h, &[5; 16]).unwrap();
    // SAFETY: simulator-owned host memory.
    unsafe { d.memcpy_htod_async(p, h, 16, s) }.unwrap();
    d.host_write(h, &[6; 16]).unwrap();
    d.stream_synchronize(s).unwrap();
    assert_eq!(
        d.peek(p, 16).unwrap(),
        vec![6; 16],
        "the copy read host memory when it ran"
    );
    // SAFETY: as above.
    unsafe { d.memcpy_dtoh_async(h.offset_host(8), p, 8, s) }.unwrap();
    d.stream_synchronize(s).unwrap();
    let mut back = [0u8; 16];
    d.host_read(h, &mut back).unwrap();
    assert_eq!(back, [6; 16]);
    d.mem_free_host(h).unwrap();
    assert!(d.host_read(h, &mut back).is_err());
    // Host memory is stored lazily too: a terabyte request costs nothing until written.
    let huge = d.mem_alloc_host(1 << 40).unwrap();
    d.host_write(HostPtr(huge.0 + (1 << 39)), &[1]).unwrap();
    d.mem_free_host(huge).unwrap();
    assert_eq!(
        d.mem_free_host(h).unwrap_err().cuda_code(),
        Some(CuCode::INVALID_VALUE)
    );
}

trait HostOffset {
    fn offset_host(self, bytes: u64) -> HostPtr;
}

impl HostOffset for HostPtr {
    fn offset_host(self, bytes: u64) -> HostPtr {
        HostPtr(self.0 + bytes)
    }
}

#[derive(Clone, Debug)]
enum Step {
    Alloc(u64),
    Free(usize),
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        prop_oneof![
            (1u64..40_000).prop_map(Step::Alloc),
            (0usize..64).prop_map(Step::Free)
        ],
        1..120,
    )
}

proptest! {
    /// Random alloc/free sequences: live allocations never overlap, usage is the sum of rounded
    /// sizes, everything that fits is granted, and every freed pointer is stale afterwards.
    #[test]
    fn allocations_never_overlap_and_accounting_adds_up(steps in steps()) {
        let cap = 256 * 1024;
        let d = sim_with(cap);
        let mut live: Vec<(DevicePtr, u64)> = Vec::new();
        let mut freed: Vec<DevicePtr> = Vec::new();
        for step in steps {
            match step {
                Step::Alloc(n) => {
                    let rounded = n.div_ceil(256) * 256;
                    let fits = d.used_bytes() + rounded <= cap;
                    match d.mem_alloc(n) {
                        Ok(p) => { prop_assert!(fits); live.push((p, n)); }
                        Err(e) => {
                            prop_assert!(!fits);
                            prop_assert_eq!(e.cuda_code(), Some(CuCode::OUT_OF_MEMORY));
                        }
                    }
                }
                Step::Free(i) if !live.is_empty() => {
                    let (p, _) = live.remove(i % live.len());
                    d.mem_free(p).unwrap();
                    freed.push(p);
                }
                Step::Free(_) => {}
            }
            let used: u64 = live.iter().map(|(_, n)| n.div_ceil(256) * 256).sum();
            prop_assert_eq!(d.used_bytes(), used);
            prop_assert_eq!(d.mem_get_info().unwrap(), (cap - used, cap));
            let mut spans: Vec<(u64, u64)> =
                live.iter().map(|(p, n)| (p.0 & 0xFFFF_FFFF_FFFF, *n)).collect();
            spans.sort_unstable();
            for w in spans.windows(2) {
                prop_assert!(w[0].0 + w[0].1 <= w[1].0, "overlap: {:?}", w);
            }
            for p in &freed {
                prop_assert!(d.peek(*p, 1).is_err(), "freed {:?} still resolves", p);
            }
            for (p, n) in &live {
                prop_assert!(d.peek(*p, *n).is_ok());
            }
        }
    }
}

#[test]
fn accounting_only_counts_memory_but_runs_no_data_operation() {
    // A terabyte device: allocations are bookkeeping only, and a memset over 64 GiB neither
    // writes nor allocates host memory (without the mode it would materialise every page).
    let d = SimDriver::new(SimConfig::accounting(1 << 40));
    d.init().unwrap();
    let s = d.stream_create(StreamKind::NonBlocking).unwrap();
    let big = d.mem_alloc(64 << 30).unwrap();
    assert_eq!(d.used_bytes(), 64 << 30);
    d.memset_d8_async(big, 7, 64 << 30, s).unwrap();
    d.memset_d8(big, 9, 64 << 30).unwrap();
    d.stream_synchronize(s).unwrap();
    let mut back = [1u8; 16];
    d.memcpy_dtoh(&mut back, big).unwrap();
    assert_eq!(
        back, [0; 16],
        "device memory reads as zeros: nothing was written"
    );
    d.mem_free(big).unwrap();
    assert_eq!(d.used_bytes(), 0);
    assert_eq!(
        d.mem_alloc(2 << 40).unwrap_err().cuda_code(),
        Some(CuCode::OUT_OF_MEMORY),
        "the capacity still holds"
    );
}
