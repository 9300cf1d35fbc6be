//! The trainer under a precision policy (issue 42), on any backend: the checks the CPU
//! (precision.rs) and the simulated device and GPU (device.rs) share. Needs the binary's
//! `fixtures` module.

use zcompute::Capture;
use zgrad::{
    Precision, StepSource, TensorFile, TrainSchedule, Trainer, TrainerConfig, XAsset, read_tensors,
};

/// ‖got − want‖ / ‖want‖.
fn rel(got: &[f32], want: &[f32]) -> f64 {
    let d: f64 = got
        .iter()
        .zip(want)
        .map(|(a, b)| (f64::from(*a) - f64::from(*b)).powi(2))
        .sum();
    let n: f64 = want.iter().map(|b| f64::from(*b).powi(2)).sum();
    d.sqrt() / n.sqrt()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// What `steps` trainer steps from the oracle fixture `fixture`'s parameters and batch left:
/// the loss of each step (f32 bits: the trainer's loss is a float32 read back), then every
/// gradient of the last step and every parameter after it, by name.
pub struct Run {
    pub losses: Vec<u64>,
    pub grads: Vec<(String, Vec<f32>)>,
    pub params: Vec<Vec<f32>>,
}

/// `steps` steps of `schedule` (`capture`: the graph replays from the second step on) under
/// `precision`, each on the fixture's batch scaled by `1 + 0.1·k` so the steps differ.
pub fn run<B: Capture<f32> + Clone + 'static>(
    b: &B,
    fixture: &str,
    (schedule, capture, precision): (TrainSchedule, bool, Precision),
    steps: usize,
) -> Run {
    let path = crate::support::fixtures::fixture(&format!("xasset_{fixture}_in.safetensors"));
    let input: TensorFile<f32> = read_tensors(&path).unwrap();
    let x = &input.tensors["x"];
    let (xs, ys) = (&x.data, &input.tensors["y"].data);
    let model = XAsset::from_tensors(b, &input, &path).unwrap();
    let cfg = TrainerConfig {
        schedule,
        capture,
        precision,
        ..TrainerConfig::default()
    };
    let mut t = Trainer::new(b.clone(), model, cfg).unwrap();
    let mut losses = Vec::new();
    for k in 0..steps {
        let scaled: Vec<f32> = xs.iter().map(|v| v * (1.0 + 0.1 * k as f32)).collect();
        let r = t.step(StepSource::host(&scaled, ys, x.shape[0])).unwrap();
        assert_eq!(r.captured, capture, "capture works on this backend");
        losses.push(r.loss.to_bits());
    }
    let named = t.model().named_parameters();
    Run {
        losses,
        grads: named
            .iter()
            .map(|(n, p)| (n.clone(), b.download(p.grad().unwrap()).unwrap()))
            .collect(),
        params: named.iter().map(|(_, p)| p.to_vec(b).unwrap()).collect(),
    }
}

/// Loss relative to float32 within this under bf16: each product's operands are rounded by
/// at most 2⁻⁹ relative; the fixtures (L = 1..3) measure 1e-6..3e-4 on the CPU (PyTorch
/// autocast's loss error on them is 3e-4..9e-4: docs/precision.md).
pub const BF16_LOSS_REL: f64 = 2e-3;
/// Each gradient tensor relative to float32 (‖Δ‖/‖g‖) within this under bf16: the backward's
/// products round their operands too, and errors add along the layers (PyTorch's own bf16
/// autocast gradients are 1.3e-2..1.0e-1 from the float64 oracle: docs/precision.md).
pub const BF16_GRAD_REL: f64 = 5e-2;

/// One step of each schedule under bf16 against the same step in float32, on the fixture
/// `fixture`: the loss and every gradient within the bounds above, and not equal to float32
/// (the mode really ran: the loss and every gradient but kn.bias's, whose gradient is
/// rounding noise around zero, differ in some bit).
pub fn bf16_step_is_near_float32_and_not_equal<B: Capture<f32> + Clone + 'static>(
    b: &B,
    fixture: &str,
) {
    for schedule in [TrainSchedule::Batched, TrainSchedule::PerSample] {
        let what = format!("{fixture} {schedule:?}");
        let f32_run = run(b, fixture, (schedule, false, Precision::F32), 1);
        let bf16_run = run(b, fixture, (schedule, false, Precision::Bf16), 1);
        let loss = |r: &Run| f64::from_bits(r.losses[0]);
        let (lf, lb) = (loss(&f32_run), loss(&bf16_run));
        assert_ne!(
            lf.to_bits(),
            lb.to_bits(),
            "{what}: the bf16 loss is not float32's"
        );
        let loss_rel = ((lb - lf) / lf).abs();
        assert!(
            loss_rel <= BF16_LOSS_REL,
            "{what}: loss {lb} vs {lf} ({loss_rel:e})"
        );
        for ((name, gf), (_, gb)) in f32_run.grads.iter().zip(&bf16_run.grads) {
            if name.ends_with("kn.bias") {
                continue;
            }
            assert_ne!(bits(gf), bits(gb), "{what}: grad.{name} is float32's");
            let e = rel(gb, gf);
            assert!(
                e <= BF16_GRAD_REL,
                "{what}: grad.{name}: {e:e} from float32"
            );
        }
    }
}

/// Under `precision`, three captured steps of each schedule equal three eager ones bit for
/// bit: the losses, the last gradients and the parameters after.
pub fn captured_equals_eager_bitwise<B: Capture<f32> + Clone + 'static>(
    b: &B,
    precision: Precision,
) {
    for schedule in [TrainSchedule::Batched, TrainSchedule::PerSample] {
        let what = format!("{} {schedule:?}", precision.name());
        let eager = run(b, "tiny", (schedule, false, precision), 3);
        let captured = run(b, "tiny", (schedule, true, precision), 3);
        assert_eq!(eager.losses, captured.losses, "{what}: losses");
        for ((name, ge), (_, gc)) in eager.grads.iter().zip(&captured.grads) {
            assert_eq!(bits(ge), bits(gc), "{what}: grad.{name}");
        }
        for (pe, pc) in eager.params.iter().zip(&captured.params) {
            assert_eq!(bits(pe), bits(pc), "{what}: parameters");
        }
    }
}
