//! Attention's core on a tape under a math mode (`Tape::with_math_mode`, the trainer's
//! precision policy; issue 42): under bf16 the fused node runs the backend's bf16 core
//! (`AttentionOps::qk_norm_attention_mode`: bf16 operands, float32 accumulation) forward and
//! backward, bit for bit, and not float32's; under float32 the float32 core as before. On the
//! CPU backend and the simulated device.

use zcompute::{BTensor, CpuBackend, MathMode, QkNorm, prelude::*};
use zgrad::{Tape, Var};

const SHAPE: [usize; 3] = [2, 12, 3 * 4 * 16];
const HEADS: usize = 4;
const DH: usize = 16;

fn values(n: usize, seed: u64, lo: f64) -> Vec<f32> {
    let mut rng = zgrad::rng::SplitMix64::new(seed);
    rng.uniform_vec(n, lo, lo + 1.0)
        .into_iter()
        .map(|v| v as f32)
        .collect()
}

/// The output and the gradients of qkv and the four QK-norm parameters, as bits.
type Bits = Vec<Vec<u32>>;

/// The core as a tape node under `mode` (forward, then backward from a fixed output gradient).
fn on_tape<B: Ops<f32>>(b: &B, mode: MathMode) -> Bits {
    let qkv = Var::parameter_from(b, &values(SHAPE.iter().product(), 1, -1.0), &SHAPE).unwrap();
    let params: Vec<Var<B, f32>> = (0..4)
        .map(|i| Var::parameter_from(b, &values(DH, 2 + i, 0.25), &[DH]).unwrap())
        .collect();
    let tape = Tape::new(b).with_math_mode(mode);
    let out = tape
        .qk_norm_attention(
            &qkv, &params[0], &params[1], &params[2], &params[3], HEADS, 1e-5,
        )
        .unwrap();
    let g = b
        .upload(&values(out.value().numel(), 9, -0.5), out.shape())
        .unwrap();
    tape.backward_with(&out, g).unwrap();
    let down = |t: &BTensor<B, f32>| -> Vec<u32> {
        b.download(t).unwrap().iter().map(|x| x.to_bits()).collect()
    };
    std::iter::once(down(out.value()))
        .chain(
            std::iter::once(&qkv)
                .chain(&params)
                .map(|p| down(p.grad().unwrap())),
        )
        .collect()
}

/// The backend's own core under `mode` on the same inputs.
fn direct<B: Ops<f32>>(b: &B, mode: MathMode) -> Bits {
    let up = |v: Vec<f32>, shape: &[usize]| b.upload(&v, shape).unwrap();
    let qkv = up(values(SHAPE.iter().product(), 1, -1.0), &SHAPE);
    let p: Vec<BTensor<B, f32>> = (0..4).map(|i| up(values(DH, 2 + i, 0.25), &[DH])).collect();
    let norm = QkNorm {
        q_weight: &p[0],
        q_bias: &p[1],
        k_weight: &p[2],
        k_bias: &p[3],
        heads: HEADS,
        eps: 1e-5,
    };
    let out = b.qk_norm_attention_mode(&qkv, &norm, mode).unwrap();
    let g = up(values(out.numel(), 9, -0.5), out.shape());
    let r = b
        .qk_norm_attention_backward_into_mode(&g, &qkv, &norm, [None; 4], mode)
        .unwrap();
    let down = |t: &BTensor<B, f32>| -> Vec<u32> {
        b.download(t).unwrap().iter().map(|x| x.to_bits()).collect()
    };
    let mut all = vec![down(&out), down(&r.qkv)];
    all.extend(r.params.iter().map(|t| down(t.as_ref().unwrap())));
    all
}

fn check<B: Ops<f32>>(b: &B) {
    // The device's backward takes step temporaries, as in a training step.
    b.begin_step().unwrap();
    let bf16 = on_tape(b, MathMode::Bf16);
    assert_eq!(bf16, direct(b, MathMode::Bf16), "the tape's bf16 core");
    let f32 = on_tape(b, MathMode::F32);
    assert_eq!(f32, direct(b, MathMode::F32), "the tape's float32 core");
    // Every tensor but the k bias's gradient (rounding noise around zero) moves under bf16.
    for (i, (x, y)) in bf16.iter().zip(&f32).take(5).enumerate() {
        assert_ne!(x, y, "tensor {i} is float32's under bf16");
    }
    b.end_step().unwrap();
}

#[test]
fn the_tapes_attention_core_runs_under_its_math_mode_on_the_cpu() {
    check(&CpuBackend);
}

#[test]
fn the_tapes_attention_core_runs_under_its_math_mode_on_the_simulated_device() {
    check(&zcompute::Engine::sim(256 << 20).unwrap());
}
