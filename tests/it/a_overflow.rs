//! Failure class A: an arena smaller than one step's working set. Training completes through
//! the stream-ordered overflow pool, with the same losses as the CPU, and the diagnostics say
//! what happened; with overflow switched off the same run stops with a clear `OutOfMemory`.
#![allow(clippy::print_stdout)] // the diagnostics line is the scenario's output

use zcompute::{ComputeError, CpuBackend, CudaBackend};
use zdevice::Driver;
use zgrad::{Applied, GradError, StepSource, TrainSchedule};
use zmem::FillCause;

use crate::common::{Size, batch, config, data, initial_parameters, trainer};

/// A few batches of each schedule on `dev` (whose arena is too small) and on the CPU: same
/// losses; the arena overflowed, and its diagnostics name a full working set or step.
pub fn training_completes_through_overflow<D: Driver>(dev: CudaBackend<D>, size: Size) {
    let ds = data(&size, 21);
    let init = initial_parameters(&size);
    for schedule in [TrainSchedule::Batched, TrainSchedule::PerSample] {
        let mut on_dev = trainer(dev.clone(), &size, &init, config(schedule, false));
        let mut on_cpu = trainer(CpuBackend, &size, &init, config(schedule, false));
        for k in 0..size.batches {
            let (x, y) = batch(&size, &ds, k);
            let a = on_dev
                .step(StepSource::host(x, y, size.batch))
                .expect("training through overflow");
            let b = on_cpu
                .step(StepSource::host(x, y, size.batch))
                .expect("CPU step");
            assert!(
                (a.loss - b.loss).abs() <= 1e-5 * b.loss.abs(),
                "{schedule:?} batch {k}: loss {} vs CPU {}",
                a.loss,
                b.loss
            );
        }
    }
    let d = dev.arena().diagnostics();
    println!("{d}");
    assert!(
        d.overflow.calls > 0,
        "the arena should have overflowed: {d}"
    );
    assert!(d.overflow.bytes > 0 && d.overflow.peak > 0, "{d}");
    assert!(
        matches!(
            d.fill_cause(),
            FillCause::WorkingSetFull | FillCause::StepTooLarge
        ),
        "the verdict should name a working set or step larger than the arena: {d}"
    );
    let line = d.to_string();
    assert!(line.contains("overflow"), "{line}");
}

/// The same run with overflow switched off: the first step that does not fit is a typed
/// `OutOfMemory` naming the request and the arena's state, not a hang and not a panic.
pub fn without_overflow_it_is_out_of_memory<D: Driver>(dev: CudaBackend<D>, size: Size) {
    dev.arena().set_overflow_enabled(false);
    let ds = data(&size, 22);
    let init = initial_parameters(&size);
    let mut t = trainer(
        dev.clone(),
        &size,
        &init,
        config(TrainSchedule::Batched, false),
    );
    let (x, y) = batch(&size, &ds, 0);
    let err = t
        .step(StepSource::host(x, y, size.batch))
        .expect_err("the step cannot fit");
    assert_eq!(err.applied(), Some(Applied::No), "{err}");
    match err.cause() {
        GradError::Compute(ComputeError::OutOfMemory { source, .. }) => {
            println!("{err}");
            let detail = source.to_string();
            assert!(
                detail.contains("overflow"),
                "the zmem error under it carries the diagnostics: {detail}"
            );
        }
        other => panic!("expected OutOfMemory, got {other}"),
    }
    assert_eq!(
        dev.arena().diagnostics().overflow.calls,
        0,
        "nothing went to the pool"
    );
    // Nothing is lost: with overflow back on, the same trainer takes the step.
    dev.arena().set_overflow_enabled(true);
    t.step(StepSource::host(x, y, size.batch))
        .expect("the step after overflow is allowed again");
}

macro_rules! scenario_a {
    ($backend:expr, $size:expr) => {
        #[test]
        fn training_completes_through_overflow() {
            super::training_completes_through_overflow($backend(), $size);
        }
        #[test]
        fn without_overflow_it_is_out_of_memory() {
            super::without_overflow_it_is_out_of_memory($backend(), $size);
        }
    };
}

mod mock {
    use crate::common::{Size, TINY, mock};
    use zmem::ArenaConfig;
    const SIZE: Size = Size { batches: 3, ..TINY };
    /// 40 KiB in 8 KiB segments: less than one tiny step needs (the flat parameters, moments
    /// and gradients alone take 26 KiB, saved tensors 8 KiB, scratch 8.5 KiB at the peak; a
    /// 64 KiB arena held a whole step once the flat buffers and fused kernels landed).
    fn backend() -> zcompute::CudaBackend<zdevice::SimDriver> {
        mock(ArenaConfig {
            initial_bytes: 8 << 10,
            segment_bytes: 8 << 10,
            cap_bytes: Some(40 << 10),
            overflow_reserve_bytes: 8 << 20,
            poison: true,
            timeline_events: 1024,
            sanitize: false,
            from_env: Vec::new(),
        })
    }
    scenario_a!(backend, SIZE);
}

#[cfg(feature = "gpu")]
mod gpu {
    use crate::common::{Size, cuda};
    use zmem::ArenaConfig;
    const SIZE: Size = Size {
        model: zgrad::XAssetConfig {
            features: 193,
            scales: 12,
            width: 256,
            heads: 4,
            ff: 1024,
            layers: 1,
        },
        batch: 16,
        batches: 3,
    };
    /// 24 MiB: the default model's parameters, moments and gradients (13 MiB) fit, one step's
    /// activations do not.
    fn backend() -> zcompute::CudaBackend<zdevice::CudaDriver> {
        cuda(ArenaConfig {
            initial_bytes: 8 << 20,
            segment_bytes: 8 << 20,
            cap_bytes: Some(24 << 20),
            overflow_reserve_bytes: 256 << 20,
            poison: true,
            timeline_events: 4096,
            sanitize: false,
            from_env: Vec::new(),
        })
    }
    scenario_a!(backend, SIZE);
}
