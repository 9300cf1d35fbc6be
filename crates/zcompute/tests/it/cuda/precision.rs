//! `PrecisionOps` (issue 42) on a CUDA backend against the CPU backend's emulation. The `mock`
//! suite runs on the simulated device, the `gpu` suite (feature `gpu`) on CUDA device 0, the
//! same bodies, poison on.
//!
//! Tolerances, per element, relative to `Σ|a'||b'|` (the absolute products of the rounded
//! operands `a'`, `b'`, summed in f64) against the f64 product of the rounded operands:
//! - bf16: `2·k·2⁻²⁴`: float32 accumulation in any order, rounding or truncating (the operands'
//!   rounding is bit-exact: the conversion kernel's, the same as the emulation's).
//! - TF32: `3·2⁻¹⁰ + 2·k·2⁻²⁴`: the tensor cores read a float32 operand with 10 significand
//!   bits, rounded or truncated (not specified bit for bit), against the emulation's
//!   nearest-even: up to 1.5 TF32 ulps apart per operand. Whether TF32 (and bf16) is really in
//!   effect is pinned exactly by [`reduced_modes_round_their_operands`], which a float32
//!   product fails.

use crate::common::uniform;
use zcompute::prelude::*;
use zcompute::{CpuBackend, CpuTensor, CudaBackend, CudaTensor, MathMode, MatmulOpts};
use zdevice::Driver;

const CPU: CpuBackend = CpuBackend;
const U: f64 = 1.0 / (1u64 << 24) as f64;

/// The per-element budget of `mode` for an inner dimension `k`, relative to `Σ|a'||b'|`.
pub fn budget(mode: MathMode, k: usize) -> f64 {
    let accumulation = 2.0 * k as f64 * U;
    match mode {
        MathMode::Tf32 => 3.0 / 1024.0 + accumulation,
        MathMode::F32 | MathMode::Bf16 => accumulation,
    }
}

/// Deterministic float32 values in `[lo, hi)`.
pub fn values(n: usize, seed: u64, lo: f64, hi: f64) -> Vec<f32> {
    uniform(n, seed, lo, hi).iter().map(|&v| v as f32).collect()
}

/// `op(a') · op(b')` in f64 and `Σ|a'||b'|`, for the rounded operands `a'`, `b'`.
pub fn reference(
    (a, a_shape): (&[f32], &[usize]),
    (b, b_shape): (&[f32], &[usize]),
    opts: MatmulOpts,
    mode: MathMode,
) -> (Vec<f64>, Vec<f64>) {
    let up = |v: &[f32], abs: bool, shape: &[usize]| {
        let v: Vec<f64> = v
            .iter()
            .map(|&x| f64::from(mode.round_operand(x)))
            .map(|x| if abs { x.abs() } else { x })
            .collect();
        CpuTensor::from_vec(v, shape).expect("f64")
    };
    let product = |abs| {
        CPU.matmul(&up(a, abs, a_shape), &up(b, abs, b_shape), opts)
            .expect("f64 product")
            .to_vec()
    };
    (product(false), product(true))
}

/// Every element of `got` within `budget · Σ|a'||b'|` of the f64 product.
pub fn within(what: &str, got: &[f32], (want, scale): (&[f64], &[f64]), budget: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, ((&g, &w), &s)) in got.iter().zip(want).zip(scale).enumerate() {
        let err = (f64::from(g) - w).abs();
        assert!(
            err <= budget * s,
            "{what}: element {i}: {g:e} against {w:e}, error {err:e} over {:e}",
            budget * s
        );
    }
}

/// A shape's operands: `a`, `b` (shapes), the options.
pub type Case = (&'static [usize], &'static [usize], MatmulOpts);

const fn opts(trans_a: bool, trans_b: bool) -> MatmulOpts {
    MatmulOpts { trans_a, trans_b }
}

/// Products of every operand arrangement the bf16 path converts differently: plain, few rows
/// (the float32 small-row kernel's shapes), transposed, a single matrix broadcast over the
/// batch, a full batch, a mixed broadcast, a Linear layer's `x · wᵀ`, and `gᵀ · x`.
pub const CASES: [Case; 8] = [
    (&[1, 5], &[5, 3], opts(false, false)),
    (&[12, 193], &[256, 193], opts(false, true)),
    (&[33, 64], &[64, 70], opts(false, false)),
    (&[64, 40], &[64, 24], opts(true, false)),
    (&[3, 12, 64], &[64, 48], opts(false, false)),
    (&[3, 12, 64], &[3, 48, 64], opts(false, true)),
    (&[2, 1, 5, 8], &[1, 3, 8, 4], opts(false, false)),
    (&[17, 256], &[17, 96], opts(true, false)),
];

/// The device's `matmul_mode` and `matmul_into_mode` (into zeros and into a strided view)
/// against the f64 product of the rounded operands; the CPU emulation against the same.
pub fn matmul_mode<D: Driver>(gpu: &CudaBackend<D>, case: usize, mode: MathMode) {
    let (a_shape, b_shape, o) = CASES[case];
    let what = format!("{} {a_shape:?} x {b_shape:?} {o:?}", mode.name());
    let a = values(a_shape.iter().product(), 7 + case as u64, -2.0, 2.0);
    let b = values(b_shape.iter().product(), 70 + case as u64, -1.0, 1.0);
    let k = if o.trans_a {
        a_shape[a_shape.len() - 2]
    } else {
        a_shape[a_shape.len() - 1]
    };
    let want = reference((&a, a_shape), (&b, b_shape), o, mode);
    let want = (&want.0[..], &want.1[..]);
    let (da, db) = (
        gpu.upload(&a, a_shape).expect("a"),
        gpu.upload(&b, b_shape).expect("b"),
    );
    let ours = gpu.matmul_mode(&da, &db, o, mode).expect("device");
    within(&what, &gpu.download(&ours).unwrap(), want, budget(mode, k));
    let (ca, cb) = (
        CpuTensor::from_vec(a.clone(), a_shape).unwrap(),
        CpuTensor::from_vec(b.clone(), b_shape).unwrap(),
    );
    let cpu = CPU.matmul_mode(&ca, &cb, o, mode).expect("cpu");
    within(&format!("{what} cpu"), &cpu.to_vec(), want, budget(mode, k));
    // Into zeros: the same product (beta = 1 over zeros).
    let dst = gpu.zeros(ours.shape()).unwrap();
    gpu.matmul_into_mode(&da, &db, o, &dst, mode).expect("into");
    within(
        &format!("{what} into"),
        &gpu.download(&dst).unwrap(),
        want,
        budget(mode, k),
    );
    // Into a transposed view (not dense: the product, then the add).
    let shape = ours.shape().to_vec();
    let r = shape.len();
    let mut stored = shape.clone();
    stored.swap(r - 1, r - 2);
    let view = gpu.zeros(&stored).unwrap().transpose(r - 1, r - 2).unwrap();
    gpu.matmul_into_mode(&da, &db, o, &view, mode)
        .expect("into view");
    within(
        &format!("{what} into view"),
        &gpu.download(&view).unwrap(),
        want,
        budget(mode, k),
    );
}

/// Exact pins of each mode's operand rounding, on every backend, in a 64³ product (a shape
/// cuBLAS runs on tensor cores: `CUBLAS_COMPUTE_32F_FAST_TF32` allows TF32 rather than forcing
/// it, so this pins that it is taken there): `(1 + 2⁻¹²)·1` summed over `k = 64` is
/// `64·(1 + 2⁻¹²)` in float32 and exactly 64 under TF32 and bf16 (2⁻¹² is below half a TF32
/// ulp, so the operand reads as 1 whether the tensor cores round or truncate); bf16 rounds the
/// tie `1 + 3·2⁻⁸` to `1 + 2⁻⁶` (even), by the conversion kernel on every backend. A mode that
/// ran in float32 fails the first pins.
pub fn reduced_modes_round_their_operands<D: Driver>(gpu: &CudaBackend<D>) {
    let k = 64usize;
    let run = |x: f32, mode| {
        let a = gpu.upload(&vec![x; k * k], &[k, k]).unwrap();
        let b = gpu.upload(&vec![1.0f32; k * k], &[k, k]).unwrap();
        let c = gpu
            .matmul_mode(&a, &b, MatmulOpts::default(), mode)
            .unwrap();
        let c = gpu.download(&c).unwrap();
        assert!(
            c.iter().all(|v| v.to_bits() == c[0].to_bits()),
            "{}",
            mode.name()
        );
        c[0]
    };
    let x = 1.0 + 2f32.powi(-12);
    assert_eq!(run(x, MathMode::F32), k as f32 * x, "f32 keeps 2^-12");
    assert_eq!(run(x, MathMode::Tf32), k as f32, "tf32 drops 2^-12");
    assert_eq!(run(x, MathMode::Bf16), k as f32, "bf16 drops 2^-12");
    let tie = 1.0 + 3.0 * 2f32.powi(-8);
    assert_eq!(
        run(tie, MathMode::Bf16),
        k as f32 * (1.0 + 2f32.powi(-6)),
        "bf16 tie to even"
    );
}

/// Small integers are exact in bf16 and TF32 and their sums exact in float32: every mode's
/// product equals the float32 product bitwise, on the device and on the CPU.
pub fn exact_operands_give_the_f32_product<D: Driver>(gpu: &CudaBackend<D>) {
    let (m, k, n) = (24, 512, 40);
    let ints = |len, seed| -> Vec<f32> {
        values(len, seed, -8.0, 9.0)
            .iter()
            .map(|v| v.floor())
            .collect()
    };
    let (a, b) = (ints(m * k, 1), ints(k * n, 2));
    let (da, db) = (
        gpu.upload(&a, &[m, k]).unwrap(),
        gpu.upload(&b, &[k, n]).unwrap(),
    );
    let (ca, cb) = (
        CpuTensor::from_vec(a, &[m, k]).unwrap(),
        CpuTensor::from_vec(b, &[k, n]).unwrap(),
    );
    let f32_product = CPU
        .matmul(&ca, &cb, MatmulOpts::default())
        .unwrap()
        .to_vec();
    for mode in [MathMode::F32, MathMode::Tf32, MathMode::Bf16] {
        let dev = gpu
            .matmul_mode(&da, &db, MatmulOpts::default(), mode)
            .unwrap();
        let dev = gpu.download(&dev).unwrap();
        let cpu = CPU
            .matmul_mode(&ca, &cb, MatmulOpts::default(), mode)
            .unwrap()
            .to_vec();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&dev), bits(&f32_product), "{} device", mode.name());
        assert_eq!(bits(&cpu), bits(&f32_product), "{} cpu", mode.name());
    }
}

/// Inputs of `round_to_bf16`: ties both ways, just past a tie, both zeros, the infinities,
/// NaNs of both signs and a signalling payload, float32's largest (rounds to infinity) and
/// bf16's largest finite, subnormals, then 4,096 random values over many binades.
fn conversion_inputs() -> Vec<f32> {
    let mut v = vec![
        1.0 + 2f32.powi(-8),
        1.0 + 3.0 * 2f32.powi(-8),
        -(1.0 + 2f32.powi(-8)),
        1.0 + 2f32.powi(-8) + 2f32.powi(-20),
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        f32::from_bits(0x7F80_0001),
        f32::MAX,
        f32::from_bits(0x7F7F_0000),
        f32::from_bits(0x7F7F_7FFF),
        f32::from_bits(0x7F7F_8000),
        f32::from_bits(1),
        f32::from_bits(0x0000_8000),
        f32::from_bits(0x0001_8000),
        f32::MIN_POSITIVE,
    ];
    let exps = uniform(4096, 5, -120.0, 120.0);
    let mant = uniform(4096, 6, -2.0, 2.0);
    v.extend(exps.iter().zip(&mant).map(|(e, m)| (m * e.exp2()) as f32));
    v
}

/// The device's `round_to_bf16` equals the CPU's bit for bit, and the CPU's is zdevice's
/// formula (checked against `half` in `precision.rs`); a strided view is rounded in logical
/// order.
pub fn round_to_bf16_matches_the_cpu_bitwise<D: Driver>(gpu: &CudaBackend<D>) {
    let v = conversion_inputs();
    let n = v.len();
    let dev = gpu.round_to_bf16(&gpu.upload(&v, &[n]).unwrap()).unwrap();
    let cpu = CPU
        .round_to_bf16(&CpuTensor::from_vec(v.clone(), &[n]).unwrap())
        .unwrap();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&gpu.download(&dev).unwrap()), bits(&cpu.to_vec()));
    let m = values(6 * 10, 9, -3.0, 3.0);
    let t = gpu.upload(&m, &[6, 10]).unwrap().transpose(0, 1).unwrap();
    let ct = CpuTensor::from_vec(m, &[6, 10])
        .unwrap()
        .transpose(0, 1)
        .unwrap();
    assert_eq!(
        bits(&gpu.download(&gpu.round_to_bf16(&t).unwrap()).unwrap()),
        bits(&CPU.round_to_bf16(&ct).unwrap().to_vec())
    );
}

/// A Linear layer's forward (tanh) and backward (identity, so both sides multiply the same
/// rounded operands) under `mode` on the device against the CPU's. Both sides are within the
/// product budget of the f64 product, so within twice it of each other; `Σ|a'||b'|` is bounded
/// by the inner size times the largest magnitudes (1.01 and 0.31 after rounding); the bias,
/// tanh (1-Lipschitz) and the bias-gradient sums add float32 roundings only.
pub fn linear_mode<D: Driver>(gpu: &CudaBackend<D>, mode: MathMode) {
    use zcompute::Activation;
    let (rows, ins, outs) = (40, 96, 64);
    let x = values(rows * ins, 31, -1.0, 1.0);
    let w = values(outs * ins, 32, -0.3, 0.3);
    let bias = values(outs, 33, -0.5, 0.5);
    let gy = values(rows * outs, 34, -1.0, 1.0);
    let dev = |v: &[f32], s: &[usize]| gpu.upload(v, s).unwrap();
    let host = |v: &[f32], s: &[usize]| CpuTensor::from_vec(v.to_vec(), s).unwrap();
    let (xs, ws, gs) = ([rows, ins], [outs, ins], [rows, outs]);
    let act = Activation::Tanh;
    let y = gpu.linear_mode(
        &dev(&x, &xs),
        &dev(&w, &ws),
        &dev(&bias, &[outs]),
        act,
        mode,
    );
    let yc = CPU.linear_mode(
        &host(&x, &xs),
        &host(&w, &ws),
        &host(&bias, &[outs]),
        act,
        mode,
    );
    let close = |what: &str, a: &[f32], b: &[f32], bound: f64| {
        assert_eq!(a.len(), b.len(), "{what}");
        for (i, (u, v)) in a.iter().zip(b).enumerate() {
            let err = (f64::from(*u) - f64::from(*v)).abs();
            assert!(
                err <= bound,
                "{what} {}: element {i}: {u:e} against {v:e}",
                mode.name()
            );
        }
    };
    let forward = 2.0 * budget(mode, ins) * ins as f64 * 1.01 * 0.31 + 1e-6;
    close(
        "forward",
        &gpu.download(&y.unwrap()).unwrap(),
        &yc.unwrap().to_vec(),
        forward,
    );
    let (dw, db) = (gpu.zeros(&ws).unwrap(), gpu.zeros(&[outs]).unwrap());
    let (dwc, dbc) = (CPU.zeros(&ws).unwrap(), CPU.zeros(&[outs]).unwrap());
    let none = (Activation::Identity, None);
    let (gyd, xd, wd) = (dev(&gy, &gs), dev(&x, &xs), dev(&w, &ws));
    let gx = gpu.linear_backward_into_mode(&gyd, &xd, Some(&wd), none, (&dw, Some(&db)), mode);
    let (gyc, xc, wc) = (host(&gy, &gs), host(&x, &xs), host(&w, &ws));
    let none = (Activation::Identity, None);
    let gxc = CPU.linear_backward_into_mode(&gyc, &xc, Some(&wc), none, (&dwc, Some(&dbc)), mode);
    let (gx, gxc) = (gx.unwrap().expect("gx"), gxc.unwrap().expect("gx"));
    let gx_bound = 2.0 * budget(mode, outs) * outs as f64 * 1.01 * 0.31;
    close("gx", &gpu.download(&gx).unwrap(), &gxc.to_vec(), gx_bound);
    let dw_bound = 2.0 * budget(mode, rows) * rows as f64 * 1.01 * 1.01;
    close("dw", &gpu.download(&dw).unwrap(), &dwc.to_vec(), dw_bound);
    close("db", &gpu.download(&db).unwrap(), &dbc.to_vec(), 1e-4);
}

/// A captured body of mode products (a Linear forward under the mode and a weight gradient
/// added under it) replays, with fresh inputs, to the same bits as the ops run eagerly.
pub fn captured_mode_products_replay_as_eager<D: Driver>(gpu: &CudaBackend<D>, mode: MathMode) {
    use zcompute::Activation;
    let (rows, ins, outs) = (48, 64, 80);
    let x = gpu
        .upload(&values(rows * ins, 41, -1.0, 1.0), &[rows, ins])
        .unwrap();
    let w = gpu
        .upload(&values(outs * ins, 42, -0.5, 0.5), &[outs, ins])
        .unwrap();
    let b = gpu.upload(&values(outs, 43, -0.5, 0.5), &[outs]).unwrap();
    let step = move |be: &CudaBackend<D>,
                     x: &CudaTensor,
                     w: &CudaTensor,
                     b: &CudaTensor,
                     [y, dw]: [&CudaTensor; 2]|
          -> zcompute::Result<()> {
        let h = be.linear_mode(x, w, b, Activation::Tanh, mode)?;
        be.copy_into(&h, y)?;
        be.matmul_into_mode(
            &h,
            x,
            MatmulOpts {
                trans_a: true,
                trans_b: false,
            },
            dw,
            mode,
        )
    };
    let bufs = || {
        [
            gpu.zeros(&[rows, outs]).unwrap(),
            gpu.zeros(&[outs, ins]).unwrap(),
        ]
    };
    let captured = bufs();
    let body = {
        let (be, x, w, b, c) = (
            gpu.clone(),
            x.clone(),
            w.clone(),
            b.clone(),
            captured.clone(),
        );
        Box::new(move || step(&be, &x, &w, &b, [&c[0], &c[1]]))
    };
    let mut graph = gpu.capture(body).expect("capture");
    let bits = |t: &CudaTensor| {
        gpu.download(t)
            .unwrap()
            .into_iter()
            .map(f32::to_bits)
            .collect::<Vec<_>>()
    };
    for r in 0..3u64 {
        gpu.upload_into(&values(rows * ins, 50 + r, -1.0, 1.0), &x)
            .expect("refill");
        for t in &captured {
            gpu.fill(t, 0.0).expect("reset");
        }
        gpu.replay(&mut graph).expect("replay");
        let eager = bufs();
        step(gpu, &x, &w, &b, [&eager[0], &eager[1]]).expect("eager");
        for (i, (c, e)) in captured.iter().zip(&eager).enumerate() {
            assert_eq!(bits(c), bits(e), "{} replay {r} output {i}", mode.name());
        }
    }
}

/// Products on bf16 copies (`bf16_copy_of` once, then `matmul_bf16`, `matmul_into_bf16`)
/// equal converting both operands per call (`matmul_mode`, `matmul_into_mode` under bf16) bit
/// for bit, on the device and on the CPU, for every matrix case (into zeros and into a
/// transposed view, which takes the product-then-add path); a copy that is not a matrix is
/// refused with the destination untouched.
pub fn products_of_copies_equal_converting_per_call_bitwise<D: Driver>(gpu: &CudaBackend<D>) {
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let matrices = CASES
        .iter()
        .enumerate()
        .filter(|(_, (a, b, _))| a.len() == 2 && b.len() == 2);
    for (case, &(a_shape, b_shape, o)) in matrices {
        let what = format!("{a_shape:?} x {b_shape:?} {o:?}");
        let a = values(a_shape.iter().product(), 7 + case as u64, -2.0, 2.0);
        let b = values(b_shape.iter().product(), 70 + case as u64, -1.0, 1.0);
        let (da, db) = (
            gpu.upload(&a, a_shape).unwrap(),
            gpu.upload(&b, b_shape).unwrap(),
        );
        let (ca, cb) = (
            gpu.bf16_copy_of(&da).unwrap(),
            gpu.bf16_copy_of(&db).unwrap(),
        );
        let per_call = gpu.matmul_mode(&da, &db, o, MathMode::Bf16).unwrap();
        let per_call = bits(&gpu.download(&per_call).unwrap());
        let copies = gpu.matmul_bf16(&ca, &cb, o).unwrap();
        assert_eq!(bits(&gpu.download(&copies).unwrap()), per_call, "{what}");
        let shape = copies.shape().to_vec();
        let (into_per_call, into_copies) = (gpu.zeros(&shape).unwrap(), gpu.zeros(&shape).unwrap());
        gpu.matmul_into_mode(&da, &db, o, &into_per_call, MathMode::Bf16)
            .unwrap();
        gpu.matmul_into_bf16(&ca, &cb, o, &into_copies).unwrap();
        assert_eq!(
            bits(&gpu.download(&into_copies).unwrap()),
            bits(&gpu.download(&into_per_call).unwrap()),
            "{what} into"
        );
        let stored = [shape[1], shape[0]];
        let views = [0, 1].map(|_| gpu.zeros(&stored).unwrap().transpose(0, 1).unwrap());
        gpu.matmul_into_mode(&da, &db, o, &views[0], MathMode::Bf16)
            .unwrap();
        gpu.matmul_into_bf16(&ca, &cb, o, &views[1]).unwrap();
        assert_eq!(
            bits(&gpu.download(&views[1]).unwrap()),
            bits(&gpu.download(&views[0]).unwrap()),
            "{what} into view"
        );
        let (ha, hb) = (
            CpuTensor::from_vec(a.clone(), a_shape).unwrap(),
            CpuTensor::from_vec(b.clone(), b_shape).unwrap(),
        );
        let (hca, hcb) = (
            CPU.bf16_copy_of(&ha).unwrap(),
            CPU.bf16_copy_of(&hb).unwrap(),
        );
        assert_eq!(
            bits(&CPU.matmul_bf16(&hca, &hcb, o).unwrap().to_vec()),
            bits(
                &CPU.matmul_mode(&ha, &hb, o, MathMode::Bf16)
                    .unwrap()
                    .to_vec()
            ),
            "{what} cpu"
        );
        let (h_per_call, h_copies) = (CPU.zeros(&shape).unwrap(), CPU.zeros(&shape).unwrap());
        CPU.matmul_into_mode(&ha, &hb, o, &h_per_call, MathMode::Bf16)
            .unwrap();
        CPU.matmul_into_bf16(&hca, &hcb, o, &h_copies).unwrap();
        assert_eq!(
            bits(&h_copies.to_vec()),
            bits(&h_per_call.to_vec()),
            "{what} cpu into"
        );
    }
    let batched = gpu
        .bf16_copy_of(&gpu.upload(&values(24, 3, -1.0, 1.0), &[2, 3, 4]).unwrap())
        .unwrap();
    let w = gpu
        .bf16_copy_of(&gpu.upload(&values(8, 4, -1.0, 1.0), &[4, 2]).unwrap())
        .unwrap();
    let dst = gpu.zeros(&[3, 2]).unwrap();
    for err in [
        gpu.matmul_bf16(&batched, &w, MatmulOpts::default())
            .map(|_| ()),
        gpu.matmul_into_bf16(&batched, &w, MatmulOpts::default(), &dst),
    ] {
        assert!(
            matches!(err, Err(zcompute::ComputeError::ShapeMismatch { .. })),
            "{err:?}"
        );
    }
    assert_eq!(gpu.download(&dst).unwrap(), [0.0; 6], "nothing ran");
}

macro_rules! precision_suite {
    ($backend:path) => {
        use rstest::rstest;
        use zcompute::MathMode;

        #[rstest]
        fn matmul_mode(
            #[values(0, 1, 2, 3, 4, 5, 6, 7)] case: usize,
            #[values(MathMode::F32, MathMode::Tf32, MathMode::Bf16)] mode: MathMode,
        ) {
            super::matmul_mode(&$backend(), case, mode);
        }

        #[test]
        fn reduced_modes_round_their_operands() {
            super::reduced_modes_round_their_operands(&$backend());
        }

        #[test]
        fn exact_operands_give_the_f32_product() {
            super::exact_operands_give_the_f32_product(&$backend());
        }

        #[test]
        fn products_of_copies_equal_converting_per_call_bitwise() {
            super::products_of_copies_equal_converting_per_call_bitwise(&$backend());
        }

        #[test]
        fn round_to_bf16_matches_the_cpu_bitwise() {
            super::round_to_bf16_matches_the_cpu_bitwise(&$backend());
        }

        #[rstest]
        fn linear_mode(#[values(MathMode::F32, MathMode::Tf32, MathMode::Bf16)] mode: MathMode) {
            super::linear_mode(&$backend(), mode);
        }

        #[rstest]
        fn captured_mode_products_replay_as_eager(
            #[values(MathMode::Tf32, MathMode::Bf16)] mode: MathMode,
        ) {
            super::captured_mode_products_replay_as_eager(&$backend(), mode);
        }
    };
}

mod mock_suite {
    precision_suite!(super::super::mock);
}

#[cfg(feature = "gpu")]
mod gpu {
    precision_suite!(super::super::gpu);
}
