//! Host cost of the arena's paths on the simulated device (the scratch paths make no device
//! call, so this is what they cost on any device). Step ends are included, amortised over 1024
//! allocations, as in a loop that reclaims after every sample.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use zdevice::{Device, DeviceConfig, MockDevice, SimConfig, SimDriver};
use zmem::{Arena, ArenaConfig};

fn device() -> MockDevice {
    let driver = SimDriver::new(SimConfig::with_capacity(1 << 30));
    Device::open(
        driver,
        DeviceConfig {
            blas_workspace_bytes: 0,
            ..DeviceConfig::default()
        },
    )
    .expect("the simulated device opens")
}

fn config() -> ArenaConfig {
    ArenaConfig {
        initial_bytes: 64 << 20,
        segment_bytes: 64 << 20,
        cap_bytes: Some(256 << 20),
        overflow_reserve_bytes: 1 << 20,
        timeline_events: 4096,
        ..ArenaConfig::default()
    }
}

fn scratch(iters: u64, arena: &Arena<SimDriver>) -> Duration {
    let t = Instant::now();
    let mut step = arena.step().expect("step");
    for i in 0..iters {
        let b = step.alloc_scratch(4096).expect("alloc");
        black_box(b.raw_ptr());
        drop(b);
        if i % 1024 == 1023 {
            step.end().expect("end");
            step = arena.step().expect("step");
        }
    }
    drop(step);
    t.elapsed()
}

/// The same through an `OwnedStep`, whose scratch comes out as refcounted `Block`s (the
/// locked path: what a compute backend holding the step beside the arena uses).
fn owned(iters: u64, arena: &Arena<SimDriver>) -> Duration {
    let t = Instant::now();
    let mut step = arena.step_owned().expect("step");
    for i in 0..iters {
        let b = step.alloc_scratch(4096).expect("alloc");
        black_box(b.raw_ptr());
        drop(b);
        if i % 1024 == 1023 {
            step.end().expect("end");
            step = arena.step_owned().expect("step");
        }
    }
    drop(step);
    t.elapsed()
}

fn benches(c: &mut Criterion) {
    let dev = device();
    let arena = Arena::new(dev.clone(), config()).expect("arena");
    c.bench_function("arena scratch alloc+free (4 KiB)", |b| {
        b.iter_custom(|iters| scratch(iters, &arena));
    });
    c.bench_function("owned step scratch Block alloc+free (4 KiB)", |b| {
        b.iter_custom(|iters| owned(iters, &arena));
    });
    c.bench_function("arena saved alloc+free (4 KiB)", |b| {
        b.iter(|| black_box(arena.alloc_saved(4096).expect("alloc")));
    });
    let quiet = Arena::new(
        dev,
        ArenaConfig {
            timeline_events: 0,
            ..config()
        },
    )
    .expect("arena");
    c.bench_function("arena scratch alloc+free (4 KiB, no timeline)", |b| {
        b.iter_custom(|iters| scratch(iters, &quiet));
    });
}

criterion_group!(arena, benches);
criterion_main!(arena);
