//! Parameter gradients added straight into their buffers (`matmul_into`, `sum_rows_into`) on
//! the simulated device, poison on, against the CPU backend's provided bodies (the op, then
//! `add_into`): a weight used as both operands of one product and again in a second product,
//! a bias and LayerNorm parameters, two backwards without zeroing (accumulation stays `+=`).

use zcompute::{Activation, CpuBackend, CudaBackend, MatmulOpts, prelude::*};
use zdevice::{Device, DeviceConfig, SimConfig, SimDriver};
use zgrad::{Tape, Var};
use zmem::{Arena, ArenaConfig};

fn mock() -> CudaBackend<SimDriver> {
    let sim = SimDriver::new(SimConfig {
        poison_on_free: true,
        ..SimConfig::with_capacity(64 << 20)
    });
    zcompute::cuda::twins::register(&sim);
    let config = DeviceConfig {
        blas_workspace_bytes: 0,
        ..DeviceConfig::default()
    };
    let dev = Device::open(sim, config).expect("the simulated device opens");
    let arena = Arena::new(
        dev,
        ArenaConfig {
            initial_bytes: 16 << 20,
            segment_bytes: 16 << 20,
            cap_bytes: Some(48 << 20),
            overflow_reserve_bytes: 4 << 20,
            poison: true,
            timeline_events: 256,
            sanitize: false,
            from_env: Vec::new(),
        },
    )
    .expect("arena");
    let b = CudaBackend::new(arena).expect("backend");
    b.set_poison(true);
    b
}

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| (((i as u32).wrapping_mul(2_654_435_761) ^ seed) % 1000) as f32 / 500.0 - 1.0)
        .collect()
}

/// Gradients of `w`, `bias`, LayerNorm weight and bias after two backwards of
/// `sum(LN(tanh(x·w + bias) · w) * c) + sum(w · w)`.
fn grads<B: Ops<f32>>(b: &B) -> Vec<Vec<f32>> {
    let w = Var::parameter_from(b, &values(25, 1), &[5, 5]).expect("w");
    let bias = Var::parameter_from(b, &values(5, 2), &[5]).expect("bias");
    let ln_w = Var::parameter_from(b, &values(5, 3), &[5]).expect("ln weight");
    let ln_b = Var::parameter_from(b, &values(5, 4), &[5]).expect("ln bias");
    let x = Var::constant(b.upload(&values(35, 5), &[7, 5]).expect("x"));
    let c = Var::constant(b.upload(&values(35, 6), &[7, 5]).expect("c"));
    for _ in 0..2 {
        b.begin_step().expect("step");
        let tape = Tape::new(b);
        let n = MatmulOpts::default();
        let h = tape.matmul(&x, &w, n).expect("x·w");
        let h = tape
            .bias_act(&h, &bias, Activation::Tanh)
            .expect("bias_act");
        let h = tape.matmul(&h, &w, n).expect("h·w");
        let y = tape
            .layer_norm(&h, Some(&ln_w), Some(&ln_b), 1e-5)
            .expect("layer_norm");
        let y = tape.mul(&y, &c).expect("mul");
        let ww = tape.matmul(&w, &w, n).expect("w·w");
        let loss = tape
            .add(
                &tape.sum_all(&y).expect("sum"),
                &tape.sum_all(&ww).expect("sum"),
            )
            .expect("loss");
        tape.backward(&loss).expect("backward");
        drop(tape);
        b.end_step().expect("end step");
    }
    [&w, &bias, &ln_w, &ln_b]
        .iter()
        .map(|p| {
            b.download(p.grad().expect("a parameter"))
                .expect("download")
        })
        .collect()
}

#[test]
fn gradients_added_in_place_match_the_cpu_and_accumulate() {
    let ours = grads(&mock());
    let cpu = grads(&CpuBackend);
    for (i, (g, c)) in ours.iter().zip(&cpu).enumerate() {
        let scale = c.iter().fold(1.0f32, |m, v| m.max(v.abs()));
        for (a, e) in g.iter().zip(c) {
            assert!(
                (a - e).abs() <= 1e-5 * scale,
                "parameter {i}: {g:?} vs cpu {c:?}"
            );
        }
        assert!(c.iter().any(|v| *v != 0.0), "parameter {i} got a gradient");
    }
}

/// Gradients of LayerNorm's parameters after two backwards of `layer_norm_stream` (the stream
/// used again), `add_layer_norm` (with and without the sum `h` used again) and a LayerNorm
/// whose weight and bias are one parameter (one buffer for both: the device takes the unfused
/// path, which adds into it twice): `[ln1 w, ln1 b, ln2 w, ln2 b, shared]`.
fn layer_norm_grads<B: Ops<f32>>(b: &B, use_h: bool) -> Vec<Vec<f32>> {
    let n = 37;
    let p = |len, seed| Var::parameter_from(b, &values(len, seed), &[len]).expect("param");
    let (w1, b1, w2, b2, shared) = (p(n, 11), p(n, 12), p(n, 13), p(n, 14), p(n, 15));
    let x = Var::constant(b.upload(&values(12 * n, 16), &[12, n]).expect("x"));
    let c = Var::constant(b.upload(&values(12 * n, 17), &[12, n]).expect("c"));
    for _ in 0..2 {
        b.begin_step().expect("step");
        let tape = Tape::new(b);
        let (stream, y1) = tape
            .layer_norm_stream(&x, Some(&w1), Some(&b1), 1e-5)
            .expect("ln1");
        let (h, y2) = tape
            .add_layer_norm(&stream, &y1, &w2, &b2, 1e-5)
            .expect("ln2");
        let y3 = tape
            .layer_norm(&y2, Some(&shared), Some(&shared), 1e-5)
            .expect("ln3");
        let mut loss = tape.sum_all(&tape.mul(&y3, &c).expect("mul")).expect("sum");
        if use_h {
            let hh = tape.sum_all(&tape.mul(&h, &h).expect("h·h")).expect("sum");
            loss = tape.add(&loss, &hh).expect("loss");
        }
        tape.backward(&loss).expect("backward");
        drop(tape);
        b.end_step().expect("end step");
    }
    [&w1, &b1, &w2, &b2, &shared]
        .iter()
        .map(|p| {
            b.download(p.grad().expect("a parameter"))
                .expect("download")
        })
        .collect()
}

#[test]
fn layer_norm_parameter_gradients_added_by_the_backward_match_the_cpu() {
    for use_h in [false, true] {
        let ours = layer_norm_grads(&mock(), use_h);
        let cpu = layer_norm_grads(&CpuBackend, use_h);
        for (i, (g, c)) in ours.iter().zip(&cpu).enumerate() {
            let scale = c.iter().fold(1.0f32, |m, v| m.max(v.abs()));
            for (a, e) in g.iter().zip(c) {
                assert!(
                    (a - e).abs() <= 1e-5 * scale,
                    "h used {use_h}, parameter {i}: {g:?} vs cpu {c:?}"
                );
            }
            assert!(c.iter().any(|v| *v != 0.0), "parameter {i} got a gradient");
        }
    }
}
