//! How many collectives a data-parallel step makes: the parameters are views of one flat
//! buffer, so the start broadcasts it once; a batched step's loss rides in the loss slot after
//! the flat gradient buffer, so the step is exactly one all-reduce of that buffer and the slot
//! after backward (`GradSync::AfterBackward`), or exactly its buckets (covering them once, from
//! the end; the plan the `GradSync` names), every one on the second stream but the last, which
//! goes on the engine stream after one join (`GradSync::Overlapped`, `OverlappedUniform`),
//! eager and captured; the per-sample step is one all-reduce of the buffer and the slot after
//! its last sample. Counted with a collective that records its calls (world 2, sums
//! nothing: the numbers are not the point).

use rstest::rstest;
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use zcomm::{Collective, RankInfo};
use zcompute::{BTensor, Backend, CpuBackend};
use zgrad::{GradSync, StepSource, TrainSchedule, Trainer, TrainerConfig, XAsset, XAssetConfig};

type Cpu = CpuBackend;

/// Each call: the operation, the element count and the operand's offset in its buffer.
#[derive(Default)]
struct Recorder {
    calls: RefCell<Vec<(&'static str, usize)>>,
    offsets: RefCell<Vec<usize>>,
    /// The overlapped call (counted from 1) that fails, if any.
    fail_overlapped: Cell<Option<usize>>,
    overlapped: Cell<usize>,
    /// Whether it takes the last bucket with the norm (`prepare_last_and_norm`'s answer), and
    /// each `(len, last)` it was asked to prepare.
    fuse: Cell<bool>,
    prepared: RefCell<Vec<(usize, usize)>>,
}

impl Collective<Cpu, f32> for Recorder {
    fn info(&self) -> RankInfo {
        RankInfo {
            rank: 0,
            world: 2,
            local_rank: 0,
        }
    }

    fn all_reduce_sum(&self, _b: &Cpu, x: &BTensor<Cpu, f32>, _step: u64) -> zcomm::Result<()> {
        self.calls.borrow_mut().push(("all_reduce", x.numel()));
        self.offsets.borrow_mut().push(x.layout().offset());
        Ok(())
    }

    fn all_reduce_sum_overlapped(
        &self,
        _b: &Cpu,
        x: &BTensor<Cpu, f32>,
        _step: u64,
    ) -> zcomm::Result<()> {
        self.overlapped.set(self.overlapped.get() + 1);
        if self.fail_overlapped.get() == Some(self.overlapped.get()) {
            self.calls.borrow_mut().push(("failed bucket", x.numel()));
            return Err(zcomm::CommError::InvalidArgument {
                op: "all_reduce",
                reason: "the recorder fails this bucket".into(),
            });
        }
        self.calls.borrow_mut().push(("bucket", x.numel()));
        self.offsets.borrow_mut().push(x.layout().offset());
        Ok(())
    }

    fn join_overlapped(&self, _b: &Cpu) -> zcomm::Result<()> {
        self.calls.borrow_mut().push(("join", 0));
        self.offsets.borrow_mut().push(0);
        Ok(())
    }

    fn broadcast(
        &self,
        _b: &Cpu,
        x: &BTensor<Cpu, f32>,
        _root: usize,
        _step: u64,
    ) -> zcomm::Result<()> {
        self.calls.borrow_mut().push(("broadcast", x.numel()));
        Ok(())
    }

    fn synchronize(&self, _b: &Cpu) -> zcomm::Result<()> {
        Ok(())
    }

    fn prepare_last_and_norm(
        &self,
        _b: &Cpu,
        len: usize,
        last: usize,
        _step: u64,
    ) -> zcomm::Result<bool> {
        self.prepared.borrow_mut().push((len, last));
        Ok(self.fuse.get())
    }

    /// Sums nothing (as every call here) and takes the norm as the trainer would.
    fn all_reduce_last_and_norm(
        &self,
        b: &Cpu,
        grads: &BTensor<Cpu, f32>,
        last: usize,
        _step: u64,
    ) -> zcomm::Result<Option<BTensor<Cpu, f32>>> {
        self.calls.borrow_mut().push(("last_and_norm", last));
        self.offsets.borrow_mut().push(grads.layout().offset());
        let norm =
            zcompute::Backend::norm2(b, grads).map_err(|source| zcomm::CommError::Compute {
                op: "all_reduce_last_and_norm",
                source,
            })?;
        Ok(Some(norm))
    }
}

const CFG: XAssetConfig = XAssetConfig {
    features: 5,
    scales: 3,
    width: 8,
    heads: 2,
    ff: 12,
    layers: 1,
};

/// The rows every test here trains on: a batch of 4 samples of `CFG`'s shape, its labels.
const ROWS: usize = 4;

fn rows() -> (Vec<f32>, Vec<f32>) {
    let x = (0..ROWS * 3 * 5).map(|i| (i as f32 * 0.37).sin()).collect();
    let y = (0..ROWS).map(|i| (i % 2) as f32).collect();
    (x, y)
}

/// A trainer of `CFG` (seed 3) over `recorder` with `config` and `sync`, and the length of its
/// flat buffer.
fn trainer_over(
    recorder: &Rc<Recorder>,
    config: TrainerConfig,
    sync: GradSync,
) -> (Trainer<Cpu, f32, XAsset<Cpu>>, usize) {
    let b = CpuBackend;
    let model = XAsset::init(&b, CFG, 3).expect("model");
    let flat = model.flat_gradients().expect("flat buffer").numel();
    let t = Trainer::new(b, model, config)
        .and_then(|t| t.with_collective(recorder.clone()))
        .and_then(|t| t.with_grad_sync(sync))
        .expect("trainer");
    (t, flat)
}

/// Two steps of a batch of 4 on a trainer over a recorder: the calls of the steps (the start's
/// broadcast checked and left out), their offsets, and the flat buffer's length.
fn two_steps(
    schedule: TrainSchedule,
    capture: bool,
    sync: GradSync,
) -> (Vec<(&'static str, usize)>, Vec<usize>, usize) {
    let recorder = Rc::new(Recorder::default());
    let config = TrainerConfig {
        schedule,
        capture,
        ..TrainerConfig::default()
    };
    let (mut t, flat) = trainer_over(&recorder, config, sync);
    assert_eq!(recorder.calls.borrow().as_slice(), &[("broadcast", flat)]);
    recorder.calls.borrow_mut().clear();
    recorder.offsets.borrow_mut().clear();
    let (x, y) = rows();
    for _ in 0..2 {
        t.step(StepSource::host(&x, &y, ROWS)).expect("step");
    }
    let calls = recorder.calls.borrow().clone();
    let offsets = recorder.offsets.borrow().clone();
    (calls, offsets, flat)
}

/// A batched data-parallel step is one collective (the loss rides in the slot after the
/// gradient buffer): the all-reduce of the flat gradient buffer and the slot (`flat + 1`
/// elements) after backward, nothing else, eager and captured.
#[rstest]
#[case::eager(false)]
#[case::captured(true)]
fn a_batched_step_after_backward_is_one_all_reduce(#[case] capture: bool) {
    let (calls, _, flat) = two_steps(TrainSchedule::Batched, capture, GradSync::AfterBackward);
    assert_eq!(calls, [("all_reduce", flat + 1); 2], "two steps");
}

/// The bucket sizes of each of the two steps, checked: exactly buckets covering the flat
/// gradient buffer and the loss slot after it once from the end, adjacent, every one on the
/// second stream but the last, which follows the join (none when it is the only bucket) on the
/// engine stream.
fn buckets_per_step(
    calls: &[(&'static str, usize)],
    offsets: &[usize],
    flat: usize,
) -> Vec<Vec<usize>> {
    let per_step = calls.len() / 2;
    assert_eq!(calls.len(), 2 * per_step, "two steps alike: {calls:?}");
    let mut steps = Vec::new();
    for (step, (c, o)) in calls
        .chunks(per_step)
        .zip(offsets.chunks(per_step))
        .enumerate()
    {
        let last = per_step - 1;
        assert_eq!(
            c[last].0, "all_reduce",
            "step {step}: the last bucket: {c:?}"
        );
        let overlapped = if last == 0 {
            0
        } else {
            assert_eq!(c[last - 1], ("join", 0), "step {step}: {c:?}");
            last - 1
        };
        let buckets: Vec<(usize, usize)> = c[..overlapped]
            .iter()
            .zip(o)
            .map(|(&(op, n), &at)| {
                assert_eq!(op, "bucket", "step {step}: {c:?}");
                (n, at)
            })
            .chain([(c[last].1, o[last])])
            .collect();
        let mut end = flat + 1;
        for &(n, at) in &buckets {
            assert_eq!(
                at + n,
                end,
                "step {step}: buckets from the end, adjacent: {c:?} at {o:?}"
            );
            end = at;
        }
        assert_eq!(
            end, 0,
            "step {step}: the buckets cover the buffer and the slot"
        );
        steps.push(buckets.iter().map(|&(n, _)| n).collect());
    }
    steps
}

/// An overlapped batched step is exactly its buckets, covering the flat gradient buffer and
/// the loss slot once from the end (one per parameter at 256 bytes: every parameter here pads
/// to 64 floats or more), the last one on the engine stream after one join; the loss takes no
/// collective of its own. Eager and captured.
#[rstest]
#[case::eager(false)]
#[case::captured(true)]
fn an_overlapped_batched_step_is_its_buckets_and_one_join(#[case] capture: bool) {
    let shapes = CFG.shapes();
    for (bucket_bytes, buckets) in [(256, shapes.len()), (zgrad::DEFAULT_BUCKET_BYTES, 1)] {
        for sync in [
            GradSync::Overlapped { bucket_bytes },
            GradSync::OverlappedUniform { bucket_bytes },
        ] {
            let (calls, offsets, flat) = two_steps(TrainSchedule::Batched, capture, sync);
            for sizes in buckets_per_step(&calls, &offsets, flat) {
                assert_eq!(sizes.len(), buckets, "{sync:?}: {calls:?}");
            }
        }
    }
}

/// The step issues the plan its `GradSync` names: at 2 KiB (512 floats, a third of this
/// model's gradient), the uniform plan's buckets hold 512 floats or more but the buffer's
/// start's remainder, while the tapered one's shrink toward the buffer's start (a fifth of what
/// is left to issue, at least 32 floats), so backward's last gradients go in small buckets.
/// Eager and captured.
#[rstest]
#[case::eager(false)]
#[case::captured(true)]
fn the_tapered_plan_ends_in_smaller_buckets(#[case] capture: bool) {
    let plan = |sync| {
        let (calls, offsets, flat) = two_steps(TrainSchedule::Batched, capture, sync);
        let steps = buckets_per_step(&calls, &offsets, flat);
        assert_eq!(steps[0], steps[1], "{sync:?}: the same buckets every step");
        steps[0].clone()
    };
    let uniform = plan(GradSync::OverlappedUniform { bucket_bytes: 2048 });
    let tapered = plan(GradSync::Overlapped { bucket_bytes: 2048 });
    assert!(
        uniform[..uniform.len() - 1].iter().all(|&n| n >= 512),
        "{uniform:?}"
    );
    assert!(tapered.len() > uniform.len(), "{tapered:?} vs {uniform:?}");
    assert!(
        tapered.last() < uniform.last(),
        "the last bucket: {tapered:?} vs {uniform:?}"
    );
    assert!(
        tapered.windows(2).skip(1).all(|w| w[1] <= 2 * w[0]),
        "shrinking toward the start: {tapered:?}"
    );
}

/// A step whose second bucket fails still joins the first back to the engine stream before it
/// returns its error: nothing of it stays on the second stream unordered with what the
/// communicator runs next (NCCL's own ordering of captured collectives is off under zcomm's
/// launcher). Eager, and a capture that fails so (the trainer goes on as after any failed
/// capture).
#[rstest]
#[case::eager(false)]
#[case::captured(true)]
fn a_step_failing_between_buckets_joins_the_issued_ones(#[case] capture: bool) {
    let b = CpuBackend;
    let model = XAsset::init(&b, CFG, 3).expect("model");
    let recorder = Rc::new(Recorder::default());
    let config = TrainerConfig {
        capture,
        ..TrainerConfig::default()
    };
    let mut t = Trainer::new(b, model, config)
        .and_then(|t| t.with_collective(recorder.clone()))
        .and_then(|t| t.with_grad_sync(GradSync::Overlapped { bucket_bytes: 256 }))
        .expect("trainer");
    recorder.calls.borrow_mut().clear();
    recorder.fail_overlapped.set(Some(2));
    let (batch, (x, y)) = (ROWS, rows());
    let r = t.step(StepSource::host(&x, &y, batch));
    let calls = recorder.calls.borrow().clone();
    let ops: Vec<&str> = calls.iter().map(|&(op, _)| op).collect();
    // The failed capture is over (the trainer then steps as it does when a capture fails):
    // its first calls are the first bucket, the failed one and the join.
    assert_eq!(ops[..3], ["bucket", "failed bucket", "join"], "{calls:?}");
    if !capture {
        assert!(r.is_err(), "the bucket's error: {calls:?}");
        assert_eq!(ops.len(), 3, "{calls:?}");
    }
}

#[rstest]
#[case::per_sample_eager(TrainSchedule::PerSample, false)]
#[case::per_sample_captured(TrainSchedule::PerSample, true)]
fn one_collective_over_the_flat_gradient_buffer_per_step(
    #[case] schedule: TrainSchedule,
    #[case] capture: bool,
) {
    let cfg = XAssetConfig {
        features: 5,
        scales: 3,
        width: 8,
        heads: 2,
        ff: 12,
        layers: 1,
    };
    let b = CpuBackend;
    let model = XAsset::init(&b, cfg, 3).expect("model");
    let flat = model.flat_gradients().expect("flat buffer").numel();
    let recorder = Rc::new(Recorder::default());
    let config = TrainerConfig {
        schedule,
        capture,
        ..TrainerConfig::default()
    };
    let mut t = Trainer::new(b, model, config)
        .and_then(|t| t.with_collective(recorder.clone()))
        .expect("trainer");
    assert_eq!(
        recorder.calls.borrow().as_slice(),
        &[("broadcast", flat)],
        "the start broadcasts the flat parameter buffer once"
    );
    recorder.calls.borrow_mut().clear();
    let (batch, (x, y)) = (ROWS, rows());
    for _ in 0..2 {
        t.step(StepSource::host(&x, &y, batch)).expect("step");
    }
    let grads = recorder
        .calls
        .borrow()
        .iter()
        .filter(|(op, n)| *op == "all_reduce" && *n == flat + 1)
        .count();
    let per_param = recorder
        .calls
        .borrow()
        .iter()
        .filter(|(op, n)| *op == "all_reduce" && *n > 1 && *n != flat + 1)
        .count();
    // Two steps, one all-reduce each of the gradients and the loss slot after them (the loss
    // takes none of its own).
    assert_eq!(grads, 2, "calls: {:?}", recorder.calls.borrow());
    assert_eq!(per_param, 0, "calls: {:?}", recorder.calls.borrow());
    assert_eq!(
        recorder.calls.borrow().len(),
        2,
        "calls: {:?}",
        recorder.calls.borrow()
    );
}

/// A bucket of 0 bytes is refused by name, tapered or not (`BadInput`); a bucket of one byte
/// (one parameter a bucket) is taken.
#[rstest]
#[case::tapered(GradSync::Overlapped { bucket_bytes: 0 }, GradSync::Overlapped { bucket_bytes: 1 })]
#[case::uniform(GradSync::OverlappedUniform { bucket_bytes: 0 }, GradSync::OverlappedUniform { bucket_bytes: 1 })]
fn a_bucket_of_zero_bytes_is_refused(#[case] zero: GradSync, #[case] one: GradSync) {
    let trainer = || {
        let b = CpuBackend;
        let model: XAsset<Cpu, f32> = XAsset::init(&b, CFG, 3).expect("model");
        Trainer::new(b, model, TrainerConfig::default()).expect("trainer")
    };
    match trainer().with_grad_sync(zero) {
        Err(zgrad::GradError::BadInput(msg)) => assert!(msg.contains("0 bytes"), "{msg}"),
        other => panic!("{zero:?}: {other:?}"),
    }
    assert!(trainer().with_grad_sync(one).is_ok(), "{one:?}");
}

/// Where the collective takes the last bucket with the norm (`prepare_last_and_norm` answered
/// yes), the step's last bucket is that one call, after the join, in place of its all-reduce;
/// the trainer asks once, at the first step, with the buffer's length and the plan's last
/// bucket; clipping uses the norm it returned, so the parameters are bitwise those of the
/// steps that take the norm themselves. Asked nothing where the plan has one bucket or the sum
/// is after backward. Eager and captured.
#[rstest]
#[case::eager(false)]
#[case::captured(true)]
fn the_last_bucket_goes_with_the_norm_where_the_collective_takes_it(#[case] capture: bool) {
    let run = |fuse: bool, sync: GradSync| {
        let recorder = Rc::new(Recorder::default());
        recorder.fuse.set(fuse);
        let config = TrainerConfig {
            schedule: TrainSchedule::Batched,
            capture,
            clip_grad: Some(0.05),
            ..TrainerConfig::default()
        };
        let (mut t, flat) = trainer_over(&recorder, config, sync);
        recorder.calls.borrow_mut().clear();
        recorder.offsets.borrow_mut().clear();
        let (x, y) = rows();
        for _ in 0..2 {
            t.step(StepSource::host(&x, &y, ROWS)).expect("step");
        }
        let params: Vec<u32> = t
            .model()
            .parameters()
            .iter()
            .flat_map(|p| CpuBackend.download(p.value()).expect("value"))
            .map(f32::to_bits)
            .collect();
        let calls = recorder.calls.borrow().clone();
        let prepared = recorder.prepared.borrow().clone();
        (calls, prepared, params, flat)
    };
    let sync = GradSync::Overlapped { bucket_bytes: 256 };
    let (plain, asked, plain_params, flat) = run(false, sync);
    let (fused, asked_fused, fused_params, _) = run(true, sync);
    let last = plain.last().expect("calls").1;
    assert_eq!(plain.last(), Some(&("all_reduce", last)), "{plain:?}");
    assert!(
        last < flat,
        "the last bucket holds gradients alone: {plain:?}"
    );
    assert_eq!(asked, [(flat, last)], "asked once, at the first step");
    assert_eq!(asked_fused, [(flat, last)]);
    let per_step = fused.len() / 2;
    for step in fused.chunks(per_step) {
        assert_eq!(
            step[per_step - 2..],
            [("join", 0), ("last_and_norm", last)],
            "{fused:?}"
        );
        assert!(step.iter().all(|c| c.0 != "all_reduce"), "{fused:?}");
    }
    assert_eq!(fused.len(), plain.len(), "the same buckets before it");
    assert_eq!(
        fused_params, plain_params,
        "clipped by the norm it returned, bitwise"
    );
    for sync in [
        GradSync::AfterBackward,
        GradSync::Overlapped {
            bucket_bytes: zgrad::DEFAULT_BUCKET_BYTES,
        },
    ] {
        let (calls, asked, _, _) = run(true, sync);
        assert!(asked.is_empty(), "{sync:?}: nothing to fuse: {asked:?}");
        assert!(
            calls.iter().all(|c| c.0 != "last_and_norm"),
            "{sync:?}: {calls:?}"
        );
    }
}

/// The trainer asks the collective once, not at every step; a new `GradSync` after steps (a
/// new plan, a new last bucket) is asked for again at the next step.
#[test]
fn the_fused_tail_is_asked_for_again_after_a_new_grad_sync() {
    let recorder = Rc::new(Recorder::default());
    recorder.fuse.set(true);
    let sync = GradSync::Overlapped { bucket_bytes: 256 };
    let (mut t, flat) = trainer_over(&recorder, TrainerConfig::default(), sync);
    let (x, y) = rows();
    for _ in 0..3 {
        t.step(StepSource::host(&x, &y, ROWS)).expect("step");
    }
    let first = recorder.prepared.borrow().clone();
    assert_eq!(first.len(), 1, "asked once over three steps: {first:?}");
    let mut t = t
        .with_grad_sync(GradSync::OverlappedUniform { bucket_bytes: 2048 })
        .expect("new plan");
    t.step(StepSource::host(&x, &y, ROWS)).expect("step");
    let asked = recorder.prepared.borrow().clone();
    assert_eq!(asked.len(), 2, "asked again for the new plan: {asked:?}");
    assert_eq!(asked[1].0, flat);
    assert_ne!(asked[1].1, asked[0].1, "another last bucket: {asked:?}");
}

/// The per-sample step sums its gradients once after its last sample: the trainer never asks
/// the collective to fuse a last bucket for it (no set-up, no memory), eager or captured.
#[rstest]
#[case::eager(false)]
#[case::captured(true)]
fn the_per_sample_step_asks_for_no_fused_tail(#[case] capture: bool) {
    let recorder = Rc::new(Recorder::default());
    recorder.fuse.set(true);
    let config = TrainerConfig {
        schedule: TrainSchedule::PerSample,
        capture,
        ..TrainerConfig::default()
    };
    let sync = GradSync::Overlapped { bucket_bytes: 256 };
    let (mut t, _) = trainer_over(&recorder, config, sync);
    let (x, y) = rows();
    for _ in 0..2 {
        t.step(StepSource::host(&x, &y, ROWS)).expect("step");
    }
    assert!(
        recorder.prepared.borrow().is_empty(),
        "{:?}",
        recorder.prepared.borrow()
    );
}
