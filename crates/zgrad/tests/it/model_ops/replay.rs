//! Dropout on the counter-based generator and the embedding's scatter-add under graph replay:
//! the step lives in device memory that the captured graph reads and advances, so each replay
//! draws the next step's mask, bit for bit the mask an eager run draws at that step.

use super::custom::{bits, to_compute};
use zcompute::{BTensor, Capture, CpuBackend, prelude::*};
use zgrad::{Tape, Var};

const SEED: u64 = 0x5EED_0040;
const P: f64 = 0.3;

/// One training-like step: `y = dropout(x W)` with an embedding in front, `loss = sum(y²)`,
/// the gradients of the table and of W into their buffers, `out` = y, then the step advanced.
struct Step<B: Ops<f32>> {
    b: B,
    table: BTensor<B, f32>,
    table_grad: BTensor<B, f32>,
    w: BTensor<B, f32>,
    w_grad: BTensor<B, f32>,
    index: BTensor<B, f32>,
    step: BTensor<B, f32>,
    out: BTensor<B, f32>,
}

impl<B: Ops<f32> + Clone> Step<B> {
    fn new(b: &B) -> Self {
        let table: Vec<f32> = (0..24).map(|i| ((i * 7 % 11) as f32 - 5.0) / 4.0).collect();
        let w: Vec<f32> = (0..12).map(|i| ((i * 5 % 7) as f32 - 3.0) / 3.0).collect();
        Step {
            b: b.clone(),
            table: b.upload(&table, &[8, 3]).unwrap(),
            table_grad: b.zeros(&[8, 3]).unwrap(),
            w: b.upload(&w, &[3, 4]).unwrap(),
            w_grad: b.zeros(&[3, 4]).unwrap(),
            index: b.upload(&[1.0, 5.0, 5.0, 0.0, 7.0, 1.0], &[2, 3]).unwrap(),
            step: b.zeros(&[1]).unwrap(),
            out: b.zeros(&[2, 3, 4]).unwrap(),
        }
    }

    fn run(&self) -> zgrad::Result<()> {
        let b = &self.b;
        b.fill(&self.table_grad, 0.0)?;
        b.fill(&self.w_grad, 0.0)?;
        let table = Var::parameter_view(self.table.clone(), self.table_grad.clone())?;
        let w = Var::parameter_view(self.w.clone(), self.w_grad.clone())?;
        let tape = Tape::new(b);
        let e = tape.embedding(&table, &self.index)?;
        let h = tape.matmul(&e, &w, Default::default())?;
        let y = tape.dropout(&h, P, SEED, 7, &self.step)?;
        let loss = tape.sum_all(&tape.mul(&y, &y)?)?;
        tape.backward(&loss)?;
        b.copy_into(y.value(), &self.out)?;
        Ok(b.advance_step(&self.step)?)
    }

    fn read(&self) -> [Vec<u32>; 3] {
        let d = |t: &BTensor<B, f32>| bits(&self.b.download(t).unwrap());
        [d(&self.out), d(&self.table_grad), d(&self.w_grad)]
    }
}

fn captured_equals_eager<B: Capture<f32> + Clone + 'static>(b: &B) {
    // A device backend's backward allocates scratch: one step open for the whole check.
    b.begin_step().unwrap();
    let eager = Step::new(b);
    let want: Vec<[Vec<u32>; 3]> = (0..3)
        .map(|_| {
            eager.run().unwrap();
            eager.read()
        })
        .collect();
    assert_ne!(want[0][0], want[1][0], "each step draws a new mask");

    let s = std::rc::Rc::new(Step::new(b));
    let body = {
        let s = s.clone();
        move || s.run().map_err(to_compute)
    };
    // Capturing runs the body once for real (step 0), as the first eager step.
    let mut graph = b.capture(Box::new(body)).unwrap();
    assert_eq!(s.read(), want[0], "the capture's own run is step 0");
    for (i, w) in want.iter().enumerate().skip(1) {
        b.replay(&mut graph).unwrap();
        assert_eq!(&s.read(), w, "replay {i} is eager step {i}, bit for bit");
    }
    assert_eq!(b.download(&s.step).unwrap(), vec![3.0]);
}

#[test]
fn dropout_and_embedding_captured_equal_eager_on_the_cpu() {
    captured_equals_eager(&CpuBackend);
}

#[test]
fn dropout_and_embedding_captured_equal_eager_on_the_simulated_device() {
    captured_equals_eager(&super::sim());
}

#[cfg(feature = "gpu")]
#[test]
fn dropout_and_embedding_captured_equal_eager_on_the_gpu() {
    captured_equals_eager(&super::gpu());
}

/// The mask is a pure function of (seed, step, stream, element): the same bits on the CPU and
/// the device; about `1 - p` of the elements kept, each `1 / (1 - p)`; other steps, streams
/// and seeds draw other masks; the backward multiplies by the same mask.
#[test]
fn the_dropout_mask_is_the_same_on_every_backend_and_keeps_one_minus_p() {
    let cpu = CpuBackend;
    let sim = super::sim();
    let n = 1 << 16;
    let mask = |b: &dyn Fn(u64, u32, f32) -> Vec<f32>, seed, stream, step| b(seed, stream, step);
    let on_cpu = |seed, stream, step: f32| {
        let s = cpu.upload(&[step], &[1]).unwrap();
        cpu.download(&cpu.dropout_mask(&[n], P, seed, stream, &s).unwrap())
            .unwrap()
    };
    let on_sim = |seed, stream, step: f32| {
        let s = sim.upload(&[step], &[1]).unwrap();
        sim.download(&sim.dropout_mask(&[n], P, seed, stream, &s).unwrap())
            .unwrap()
    };
    let m = mask(&on_cpu, SEED, 0, 4.0);
    assert_eq!(
        bits(&m),
        bits(&mask(&on_sim, SEED, 0, 4.0)),
        "CPU and device agree"
    );
    let scale = (1.0 / (1.0 - P)) as f32;
    assert!(m.iter().all(|&v| v == 0.0 || v == scale));
    let kept = m.iter().filter(|&&v| v != 0.0).count() as f64 / n as f64;
    // Binomial: 4.5 standard deviations of a fraction over 65536 draws is about 0.008.
    assert!((kept - (1.0 - P)).abs() < 0.008, "kept {kept}");
    for other in [
        mask(&on_cpu, SEED, 0, 5.0),
        mask(&on_cpu, SEED, 1, 4.0),
        mask(&on_cpu, SEED + 1, 0, 4.0),
    ] {
        let same = m.iter().zip(&other).filter(|(a, b)| a == b).count() as f64 / n as f64;
        // Independent masks agree on p² + (1-p)² = 0.58 of the elements.
        assert!((same - 0.58).abs() < 0.01, "agreement {same}");
    }
    // A step that is not a whole number in [0, 2^24] gives NaN, never a silent mask.
    assert!(mask(&on_sim, SEED, 0, 0.5).iter().all(|v| v.is_nan()));
    assert!(mask(&on_cpu, SEED, 0, -1.0).iter().all(|v| v.is_nan()));

    let x = Var::parameter(&cpu, cpu.full(&[n], 2.0f32).unwrap()).unwrap();
    let step = cpu.upload(&[4.0f32], &[1]).unwrap();
    let tape = Tape::new(&cpu);
    let y = tape.dropout(&x, P, SEED, 0, &step).unwrap();
    tape.backward(&tape.sum_all(&y).unwrap()).unwrap();
    assert_eq!(
        bits(&cpu.download(x.grad().unwrap()).unwrap()),
        bits(&m),
        "d y / d x is the mask"
    );
    let e = cpu.dropout_mask(&[4], 1.0, SEED, 0, &step).unwrap_err();
    assert!(
        matches!(e, zcompute::ComputeError::InvalidScalar { arg: "p", .. }),
        "{e}"
    );
}

/// A step that is no whole number in [0, 2^24] makes the mask NaN with the CPU's bits
/// (0x7fc00000, Rust's `f32::NAN`) on the device too: `zc_dropout_mask_f32` wrote 0x7fffffff.
fn invalid_step_nan_bits<B: Ops<f32>>(b: &B) {
    let n = 300;
    for step in [0.5f32, -1.0, 2e7, f32::NAN] {
        let cpu = CpuBackend;
        let s = cpu.upload(&[step], &[1]).unwrap();
        let want = cpu
            .download(&cpu.dropout_mask(&[n], P, SEED, 0, &s).unwrap())
            .unwrap();
        let s = b.upload(&[step], &[1]).unwrap();
        let got = b
            .download(&b.dropout_mask(&[n], P, SEED, 0, &s).unwrap())
            .unwrap();
        assert_eq!(bits(&want), vec![f32::NAN.to_bits(); n], "step {step}: CPU");
        assert_eq!(bits(&got), bits(&want), "step {step}: device");
    }
}

#[test]
fn an_invalid_steps_mask_has_the_cpus_nan_bits_on_the_simulated_device() {
    invalid_step_nan_bits(&super::sim());
}

#[cfg(feature = "gpu")]
#[test]
fn an_invalid_steps_mask_has_the_cpus_nan_bits_on_the_gpu() {
    invalid_step_nan_bits(&super::gpu());
}
