//! Failure class B: weights uploaded first, then capture on. The captured training step (the
//! whole batched step, and the per-sample forward+backward) completes, matches eager execution,
//! and the timeline shows that nothing was allocated outside the capture's reservation.
#![allow(clippy::print_stdout)]

use zcompute::CudaBackend;
use zdevice::Driver;
use zgrad::StepSource;
use zgrad::TrainSchedule;
use zmem::{EventKind, Source};

use crate::common::{
    Size, batch, config, data, initial_parameters, parameters, record_events, rel, trainer,
};

pub fn captured_step_matches_eager_inside_its_reservation<D: Driver>(
    dev: CudaBackend<D>,
    size: Size,
) {
    let ds = data(&size, 31);
    let init = initial_parameters(&size);
    for schedule in [TrainSchedule::Batched, TrainSchedule::PerSample] {
        // Weights (and optimiser state) are uploaded when the trainers are made, before any capture.
        let mut eager = trainer(dev.clone(), &size, &init, config(schedule, false));
        let mut captured = trainer(dev.clone(), &size, &init, config(schedule, true));
        let events = record_events(dev.arena());
        let mut allocations_after_capture = 0usize;
        for k in 0..size.batches {
            let (x, y) = batch(&size, &ds, k);
            let e = eager
                .step(StepSource::host(x, y, size.batch))
                .expect("eager step");
            let mark = events.lock().expect("events").len();
            let c = captured
                .step(StepSource::host(x, y, size.batch))
                .expect("captured step");
            assert!(c.captured, "{schedule:?} batch {k}: the step ran captured");
            assert!(
                (e.loss - c.loss).abs() <= 1e-6 * e.loss.abs(),
                "{schedule:?} batch {k}: loss {} eager vs {} captured",
                e.loss,
                c.loss
            );
            if k > 0 {
                let log = events.lock().expect("events");
                let window = &log[mark..];
                // The per-sample schedule captures each sample's forward+backward; its
                // optimiser step runs eagerly in the batch's last step, after the replays, and
                // may allocate, as may its bookkeeping between steps. The sample steps (every
                // step but the last) must allocate nothing outside the graph; the captured
                // batched step nothing at all.
                let last_step = window.iter().map(|ev| ev.step).max().unwrap_or(0);
                let mut open = false;
                let mut stray = Vec::new();
                for ev in window {
                    match ev.kind {
                        EventKind::StepStart => open = true,
                        EventKind::StepEnd { .. } => open = false,
                        EventKind::Alloc { source, .. } if source != Source::Reservation => {
                            let in_sample = open && ev.step != last_step;
                            if schedule == TrainSchedule::Batched || in_sample {
                                stray.push(ev);
                            }
                        }
                        _ => {}
                    }
                }
                if !stray.is_empty() {
                    println!(
                        "{schedule:?} batch {k}: {} allocations outside the reservation, first {:?}",
                        stray.len(),
                        stray[0]
                    );
                }
                allocations_after_capture += stray.len();
            }
        }
        // During the capture every allocation came from the reservation.
        let log = events.lock().expect("events");
        let mut inside = false;
        let (mut reserved, mut outside) = (0usize, Vec::new());
        for ev in log.iter() {
            match &ev.kind {
                EventKind::CaptureBegin { .. } => inside = true,
                EventKind::CaptureEnd { .. } => inside = false,
                EventKind::Alloc {
                    source,
                    class,
                    bytes,
                    ..
                } if inside => {
                    if *source == Source::Reservation {
                        reserved += 1;
                    } else {
                        outside.push((*class, *bytes, *source));
                    }
                }
                _ => {}
            }
        }
        assert!(
            reserved > 0,
            "{schedule:?}: the capture allocated from its reservation"
        );
        assert!(
            outside.is_empty(),
            "{schedule:?}: allocations outside the reservation during capture: {outside:?}"
        );
        // Replays allocate nothing from the arena: the graph owns what it uses.
        assert_eq!(
            allocations_after_capture, 0,
            "{schedule:?}: replays allocated outside the reservation"
        );
        let (pe, pc) = (
            parameters(&dev, eager.model()),
            parameters(&dev, captured.model()),
        );
        for (i, (a, b)) in pc.iter().zip(&pe).enumerate() {
            let err = rel(a, b);
            assert!(
                err <= 1e-6,
                "{schedule:?}: parameter {i} captured vs eager {err:e}"
            );
        }
        println!(
            "{schedule:?}: {} captured steps equal eager; {reserved} allocations from the reservation",
            size.batches
        );
    }
}

mod mock {
    use crate::common::{Size, TINY, mock, roomy_arena};
    #[test]
    fn captured_step_matches_eager_inside_its_reservation() {
        super::captured_step_matches_eager_inside_its_reservation(
            mock(roomy_arena(true)),
            Size { batches: 4, ..TINY },
        );
    }
}

#[cfg(feature = "gpu")]
mod gpu {
    use crate::common::{Size, cuda, roomy_arena};
    #[test]
    fn captured_step_matches_eager_inside_its_reservation() {
        let size = Size {
            model: zgrad::XAssetConfig::default(),
            batch: 256,
            batches: 4,
        };
        let mut arena = roomy_arena(true);
        arena.cap_bytes = Some(16 << 30);
        super::captured_step_matches_eager_inside_its_reservation(cuda(arena), size);
    }
}
