//! `Tape::masked_attention` on its fused node (`Tape::key_padding_attention`, taken where the
//! shapes are a key-padding mask's) against the composite of the tape's ops (taken for a mask
//! given per query): the same outputs and gradients within f32 rounding, an all-padding sample
//! zeros with zero gradients; and the sequence example's model (embedding, key-padding mask,
//! attention) through the trainer: captured equals eager bit for bit in both schedules, and
//! per-sample gradients equal batched ones within f32 rounding. The PyTorch float64 oracle of
//! the op is in `oracle.rs`.

use crate::examples::sequence::{Sequence, SequenceClassifier};
use zcompute::{BTensor, Capture, prelude::*};
use zgrad::{StepSource, Tape, TrainSchedule, Trainer, TrainerConfig, Var};

/// Leading axes `[2, 3]`, 4 queries, 5 keys, width 8: sample (1, *) keeps no key, the others
/// some.
const LEAD: [usize; 2] = [2, 3];
const SQ: usize = 4;
const SK: usize = 5;
const D: usize = 8;

fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (((i * 37 + seed * 101) % 97) as f32 - 48.0) / 24.0)
        .collect()
}

/// The output and the gradients of q, k, v of `sum(out · w)`, with the mask `[2, 3, 1, SK]`
/// (`per_query`: broadcast to `[2, 3, SQ, SK]`, which takes the composite).
fn run<B: Ops<f32>>(b: &B, per_query: bool) -> [Vec<f32>; 4] {
    // A device backend's ops need an open step (its scratch lives until the step's end).
    b.begin_step().unwrap();
    let shape = |s: usize, w: usize| [LEAD[0], LEAD[1], s, w];
    let param = |s: usize, w: usize, seed: usize| {
        let sh = shape(s, w);
        let n = sh.iter().product();
        Var::parameter(b, b.upload(&values(n, seed), &sh).unwrap()).unwrap()
    };
    let (q, k, v) = (param(SQ, D, 1), param(SK, D, 2), param(SK, D, 3));
    let keep: Vec<f32> = (0..LEAD[0] * LEAD[1] * SK)
        .map(|i| {
            let (sample, j) = (i / SK, i % SK);
            f32::from(u8::from(sample / LEAD[1] != 1 && (j + sample) % 4 != 3))
        })
        .collect();
    let mut keep: BTensor<B, f32> = b.upload(&keep, &shape(1, SK)).unwrap();
    if per_query {
        let ones = b.full(&shape(SQ, SK), 1.0).unwrap();
        keep = b.mul(&ones, &keep).unwrap();
    }
    let tape = Tape::new(b);
    let y = tape
        .masked_attention(&q, &k, &v, &Var::constant(keep), 8f32.powf(-0.5))
        .unwrap();
    let w = Var::constant(b.upload(&values(y.value().numel(), 4), y.shape()).unwrap());
    let loss = tape.sum_all(&tape.mul(&y, &w).unwrap()).unwrap();
    tape.backward(&loss).unwrap();
    let d = |t: &BTensor<B, f32>| b.download(t).unwrap();
    let out = [
        d(y.value()),
        d(q.grad().unwrap()),
        d(k.grad().unwrap()),
        d(v.grad().unwrap()),
    ];
    b.end_step().unwrap();
    out
}

fn fused_equals_composite<B: Ops<f32>>(b: &B) {
    let (fused, composite) = (run(b, false), run(b, true));
    for (name, (f, c)) in ["out", "dq", "dk", "dv"]
        .iter()
        .zip(fused.iter().zip(&composite))
    {
        assert!(f.iter().all(|x| x.is_finite()), "{name}: not finite");
        let scale = c.iter().fold(1e-30f32, |m, x| m.max(x.abs()));
        let err = f.iter().zip(c).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale;
        assert!(err < 1e-5, "{name}: fused vs composite {err:e}");
        // Samples (1, *) keep no key: zeros out and zero gradients of q, k, v.
        let per = f.len() / (LEAD[0] * LEAD[1]);
        let second = &f[LEAD[1] * per..2 * LEAD[1] * per];
        assert!(
            second.iter().all(|x| *x == 0.0),
            "{name}: all-padding samples"
        );
    }
}

#[test]
fn masked_attention_fused_equals_the_composite_on_the_cpu() {
    fused_equals_composite(&zcompute::CpuBackend);
}

#[test]
fn masked_attention_fused_equals_the_composite_on_the_simulated_device() {
    fused_equals_composite(&super::sim());
}

#[cfg(feature = "gpu")]
#[test]
fn masked_attention_fused_equals_the_composite_on_the_gpu() {
    fused_equals_composite(&super::gpu());
}

const BATCH: usize = 8;

fn example() -> Sequence {
    Sequence {
        vocab: 12,
        tokens: 6,
        classes: 3,
        width: 8,
        ..Sequence::default()
    }
}

type Seq<B> = Trainer<B, f32, SequenceClassifier<B>>;

fn trainer<B: Capture<f32> + 'static>(b: B, schedule: TrainSchedule, capture: bool) -> Seq<B> {
    let ex = example();
    let model =
        SequenceClassifier::new(&b, ex.vocab, ex.tokens, ex.classes, ex.width, 7).expect("model");
    let config = TrainerConfig {
        schedule,
        capture,
        lr: 1e-2,
        ..TrainerConfig::default()
    };
    Trainer::new(b, model, config).expect("trainer")
}

fn parameters<B: Capture<f32> + 'static>(t: &Seq<B>) -> Vec<f32> {
    use zgrad::Model;
    t.model()
        .parameters()
        .iter()
        .flat_map(|p| p.to_vec(t.backend()).expect("download"))
        .collect()
}

/// Losses and parameters (as bits) after 3 steps, and whether every step ran captured.
fn steps<B: Capture<f32> + 'static>(
    b: B,
    schedule: TrainSchedule,
    capture: bool,
) -> (Vec<u64>, Vec<u32>, bool) {
    let mut t = trainer(b, schedule, capture);
    let (mut losses, mut captured) = (Vec::new(), true);
    for step in 0..3 {
        let (x, y) = example().data(step, BATCH);
        let r = t.step(StepSource::host(&x, &y, BATCH)).expect("step");
        losses.push(r.loss.to_bits());
        captured &= r.captured;
    }
    let bits = parameters(&t).into_iter().map(f32::to_bits).collect();
    (losses, bits, captured)
}

fn captured_equals_eager<B: Capture<f32> + 'static>(make: impl Fn() -> B) {
    for schedule in [TrainSchedule::Batched, TrainSchedule::PerSample] {
        let eager = steps(make(), schedule, false);
        let captured = steps(make(), schedule, true);
        assert!(
            !eager.2 && captured.2,
            "{schedule:?}: captured only when asked"
        );
        assert_eq!(captured.0, eager.0, "{schedule:?}: losses");
        assert_eq!(captured.1, eager.1, "{schedule:?}: parameters");
    }
}

#[test]
fn the_sequence_model_captured_equals_eager_bitwise_on_the_simulated_device() {
    captured_equals_eager(super::sim);
}

#[cfg(feature = "gpu")]
#[test]
fn the_sequence_model_captured_equals_eager_bitwise_on_the_gpu() {
    captured_equals_eager(super::gpu);
}

/// One step of each schedule from the same start: the same loss and the same gradients within
/// f32 rounding (the per-sample step runs the fused attention on one sample at a time).
#[test]
fn the_sequence_model_per_sample_equals_batched_on_the_simulated_device() {
    let (x, y) = example().data(0, BATCH);
    let step = |schedule| {
        use zgrad::Model;
        let mut t = trainer(super::sim(), schedule, false);
        let r = t.step(StepSource::host(&x, &y, BATCH)).expect("step");
        let grads: Vec<f32> = t
            .model()
            .parameters()
            .iter()
            .flat_map(|p| {
                t.backend()
                    .download(p.grad().expect("a parameter"))
                    .expect("download")
            })
            .collect();
        (r.loss, grads, r.grad_norm)
    };
    let (batched, per_sample) = (step(TrainSchedule::Batched), step(TrainSchedule::PerSample));
    assert!(
        (batched.0 - per_sample.0).abs() < 1e-5,
        "loss {} vs {}",
        batched.0,
        per_sample.0
    );
    let norm = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    let diff: Vec<f32> = batched
        .1
        .iter()
        .zip(&per_sample.1)
        .map(|(a, b)| a - b)
        .collect();
    assert!(norm(&batched.1) > 0.0, "a gradient at all");
    let err = norm(&diff) / norm(&batched.1);
    assert!(err < 1e-5, "gradients differ by {err:e}");
    let err = (batched.2 - per_sample.2).abs() / batched.2;
    assert!(
        err < 1e-5,
        "gradient norms {} vs {}",
        batched.2,
        per_sample.2
    );
}
