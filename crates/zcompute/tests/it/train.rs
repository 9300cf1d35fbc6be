//! BCE-with-logits and the fused AdamW step.

use crate::common::{
    assert_f32_matches, assert_matches_formula, cpu32, cpu64, numel, pair, uniform,
};
use rstest::rstest;
use zcompute::{AdamWConfig, Backend, CpuTensor};

#[rstest]
fn bce_matches(
    #[values(&[1][..], &[7][..], &[256][..], &[1025][..], &[4, 193][..])] shape: &[usize],
) {
    let n = numel(shape);
    let mut x = uniform(n, 81, -8.0, 8.0);
    // Large logits, where the naive log(sigmoid) form overflows or loses everything.
    for (i, v) in x.iter_mut().enumerate().filter(|(i, _)| i % 5 == 0) {
        *v = if i % 2 == 0 { 40.0 } else { -40.0 };
    }
    let y: Vec<f64> = uniform(n, 82, 0.0, 1.0)
        .into_iter()
        .map(|u| (u > 0.5) as u8 as f64)
        .collect();
    let (x32, x64) = pair(&x, shape);
    let (y32, y64) = pair(&y, shape);
    let l32 = cpu32().bce_with_logits_mean(&x32, &y32).unwrap();
    let l64 = cpu64().bce_with_logits_mean(&x64, &y64).unwrap();
    assert_eq!(l32.shape(), &[] as &[usize]);
    assert_f32_matches("bce", &l32, &l64);
    // Direct formula: -(y log σ(x) + (1-y) log(1-σ(x))), with log σ(x) = -log(1+e^-x) written
    // per sign so f64 never overflows.
    let log_sigmoid = |x: f64| {
        if x >= 0.0 {
            -(-x).exp().ln_1p()
        } else {
            x - x.exp().ln_1p()
        }
    };
    let xs = x64.to_vec();
    let total: f64 = xs
        .iter()
        .zip(y64.to_vec())
        .map(|(&x, y)| -(y * log_sigmoid(x) + (1.0 - y) * log_sigmoid(-x)))
        .sum();
    assert_matches_formula("bce", &l32, &l64, &[total / n as f64]);
}

/// AdamW by the formula in docs/xasset.md, one element at a time, in f64.
fn adamw_formula(
    p: &mut [f64],
    m: &mut [f64],
    v: &mut [f64],
    g: &[f64],
    lr: f64,
    t: f64,
    c: &AdamWConfig<f64>,
) {
    for i in 0..p.len() {
        p[i] *= 1.0 - lr * c.weight_decay;
        m[i] = c.beta1 * m[i] + (1.0 - c.beta1) * g[i];
        v[i] = c.beta2 * v[i] + (1.0 - c.beta2) * g[i] * g[i];
        let mh = m[i] / (1.0 - c.beta1.powf(t));
        let vh = v[i] / (1.0 - c.beta2.powf(t));
        p[i] -= lr * mh / (vh.sqrt() + c.eps);
    }
}

#[rstest]
fn adamw_matches(#[values(&[1][..], &[7][..], &[193, 7][..], &[1025][..])] shape: &[usize]) {
    let n = numel(shape);
    let cfg64 = AdamWConfig {
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
    };
    let cfg32 = AdamWConfig {
        beta1: 0.9f32,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
    };
    let (p32, p64) = pair(&uniform(n, 91, -1.0, 1.0), shape);
    let (m32, m64) = pair(&uniform(n, 92, -0.1, 0.1), shape);
    let (v32, v64) = pair(&uniform(n, 93, 0.0, 0.01), shape);
    let (mut fp, mut fm, mut fv) = (p64.to_vec(), m64.to_vec(), v64.to_vec());
    let slot32 = CpuTensor::from_vec(vec![0.0f32; 2], &[2]).unwrap();
    let slot64 = CpuTensor::from_vec(vec![0.0f64; 2], &[2]).unwrap();
    for step in 1..=3u64 {
        let (g32, g64) = pair(&uniform(n, 100 + step, -1.0, 1.0), shape);
        let lr = 1e-3 * step as f64;
        // The slot is written in place, as a captured step's host-side update would.
        cpu32()
            .copy_into(
                &CpuTensor::from_vec(vec![lr as f32, step as f32], &[2]).unwrap(),
                &slot32,
            )
            .unwrap();
        cpu64()
            .copy_into(
                &CpuTensor::from_vec(vec![lr, step as f64], &[2]).unwrap(),
                &slot64,
            )
            .unwrap();
        cpu32()
            .adamw_step(&p32, &m32, &v32, &g32, &slot32, &cfg32)
            .unwrap();
        cpu64()
            .adamw_step(&p64, &m64, &v64, &g64, &slot64, &cfg64)
            .unwrap();
        adamw_formula(
            &mut fp,
            &mut fm,
            &mut fv,
            &g64.to_vec(),
            lr,
            step as f64,
            &cfg64,
        );
    }
    for (name, t32, t64, f) in [
        ("p", &p32, &p64, &fp),
        ("m", &m32, &m64, &fm),
        ("v", &v32, &v64, &fv),
    ] {
        assert_f32_matches(name, t32, t64);
        assert_matches_formula(name, t32, t64, f);
    }
}

#[test]
fn adamw_updates_through_strided_views() {
    // p is a transposed view; the update lands in the parent's storage.
    let cfg = AdamWConfig {
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
    };
    let parent = CpuTensor::from_vec(vec![1.0f64; 6], &[2, 3]).unwrap();
    let p = parent.transpose(0, 1).unwrap();
    let m = cpu64().zeros(&[3, 2]).unwrap();
    let v = cpu64().zeros(&[3, 2]).unwrap();
    let g = CpuTensor::from_vec(vec![1.0, -1.0, 1.0, -1.0, 1.0, -1.0], &[3, 2]).unwrap();
    let slot = CpuTensor::from_vec(vec![0.1, 1.0], &[2]).unwrap();
    cpu64().adamw_step(&p, &m, &v, &g, &slot, &cfg).unwrap();
    // Step 1 with bias correction moves each p by lr * sign(g) (up to eps).
    let got = parent.to_vec();
    let expect = [0.9, 0.9, 0.9, 1.1, 1.1, 1.1];
    for (a, b) in got.iter().zip(expect) {
        assert!((a - b).abs() < 1e-6, "{got:?}");
    }
}

#[test]
fn adamw_skips_the_update_unless_the_gate_is_zero() {
    let cfg = AdamWConfig {
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
    };
    let run = |slot: &[f64]| {
        let p = CpuTensor::from_vec(vec![1.0f64, -2.0, 0.5], &[3]).unwrap();
        let m = CpuTensor::from_vec(vec![0.1, 0.0, -0.1], &[3]).unwrap();
        let v = CpuTensor::from_vec(vec![0.01, 0.02, 0.0], &[3]).unwrap();
        let g = CpuTensor::from_vec(vec![0.5, -1.0, 2.0], &[3]).unwrap();
        let slot = CpuTensor::from_vec(slot.to_vec(), &[slot.len()]).unwrap();
        cpu64().adamw_step(&p, &m, &v, &g, &slot, &cfg).unwrap();
        [p.to_vec(), m.to_vec(), v.to_vec()]
    };
    let untouched = [
        vec![1.0, -2.0, 0.5],
        vec![0.1, 0.0, -0.1],
        vec![0.01, 0.02, 0.0],
    ];
    for gate in [f64::NAN, f64::INFINITY, -1.0, 1e-30] {
        assert_eq!(run(&[0.1, 2.0, gate]), untouched, "gate {gate}");
    }
    assert_eq!(run(&[0.1, 2.0, 0.0]), run(&[0.1, 2.0]));
    assert_ne!(run(&[0.1, 2.0, 0.0]), untouched);
    // Any other slot length is refused.
    let one = || CpuTensor::from_vec(vec![1.0f64], &[1]).unwrap();
    let (p, m, v, g) = (one(), one(), one(), one());
    let slot = CpuTensor::from_vec(vec![0.1, 1.0, 0.0, 0.0], &[4]).unwrap();
    assert!(cpu64().adamw_step(&p, &m, &v, &g, &slot, &cfg).is_err());
}
