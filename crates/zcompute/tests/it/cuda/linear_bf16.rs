//! The small-row products' bf16 forms (issue 42, `kernels/linear_bf16.cu`): under
//! `MathMode::Bf16` a product with few rows (one sample's) is one launch of
//! `zc_linear_rows_kmajor_bf16` or `zc_linear_rows_nmajor_bf16`, as float32's is one of its
//! float32 form, and a Linear forward takes its bias epilogue inside, where before each
//! operand was converted, cuBLAS ran and the epilogue followed. The `mock` suite runs the
//! bodies on the simulated device, the `gpu` suite (feature `gpu`) on CUDA device 0: products
//! within the float32 accumulation budget of `precision.rs` (`2·k·2⁻²⁴·Σ|a'||b'|` of the
//! float64 product of the rounded operands) as the CPU backend's emulation is, never the
//! float32 product, and bit for bit the same whether an operand is read as float32 (rounded
//! as it is read) or from its bf16 copy, which the trainer's copies rely on
//! (`PrecisionOps::matmul_bf16_rhs` and friends promise the bits of `matmul_mode`). Which
//! kernel runs, and that nothing else does, is pinned on the simulated device.

use super::precision::{budget, reference, values, within};
use zcompute::prelude::*;
use zcompute::{Activation, CpuBackend, CpuTensor, CudaBackend, CudaTensor, MathMode, MatmulOpts};
use zdevice::Driver;

const CPU: CpuBackend = CpuBackend;
const BF16: MathMode = MathMode::Bf16;
const U: f64 = 1.0 / (1u64 << 24) as f64;

const fn opts(trans_a: bool, trans_b: bool) -> MatmulOpts {
    MatmulOpts { trans_a, trans_b }
}

/// `x · wᵀ`: a Linear layer's forward.
const NT: MatmulOpts = opts(false, true);

/// Few-row products by the order of `op(B)`: k-contiguous (a Linear weight read transposed;
/// k a multiple of 4, the float4 runs, and not, one element a lane), n-contiguous (`dX = g ·
/// W`), a transposed, strided `op(A)`, and a weight gradient `gᵀ · x` of one sample's rows
/// (added into a buffer: the parameter-gradient kernel's bf16 form, four inputs a thread at
/// 256 inputs, one at 193).
const CASES: [(&[usize], &[usize], MatmulOpts); 7] = [
    (&[12, 256], &[96, 256], NT),
    (&[12, 193], &[40, 193], NT),
    (&[1, 64], &[24, 64], NT),
    (&[12, 96], &[96, 70], opts(false, false)),
    (&[40, 7], &[40, 33], opts(true, false)),
    (&[12, 96], &[12, 256], TN),
    (&[12, 96], &[12, 193], TN),
];

/// `gᵀ · x`: a Linear weight's gradient.
const TN: MatmulOpts = opts(true, false);

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Every few-row case under bf16 on the device, `matmul_mode` and `matmul_into_mode` (beta =
/// 1, onto values already there), against the float64 product of the rounded operands within
/// the accumulation budget, as the CPU's emulation is; and not the float32 product.
pub fn few_row_products_are_bf16_products<D: Driver>(gpu: &CudaBackend<D>) {
    for (case, &(a_shape, b_shape, o)) in CASES.iter().enumerate() {
        let what = format!("{a_shape:?} x {b_shape:?} {o:?}");
        let a = values(a_shape.iter().product(), 100 + case as u64, -2.0, 2.0);
        let b = values(b_shape.iter().product(), 200 + case as u64, -1.0, 1.0);
        let k = if o.trans_a { a_shape[0] } else { a_shape[1] };
        let (want, scale) = reference((&a, a_shape), (&b, b_shape), o, BF16);
        let (da, db) = (
            gpu.upload(&a, a_shape).unwrap(),
            gpu.upload(&b, b_shape).unwrap(),
        );
        let ours = gpu
            .download(&gpu.matmul_mode(&da, &db, o, BF16).unwrap())
            .unwrap();
        within(&what, &ours, (&want, &scale), budget(BF16, k));
        let (ca, cb) = (
            CpuTensor::from_vec(a.clone(), a_shape).unwrap(),
            CpuTensor::from_vec(b.clone(), b_shape).unwrap(),
        );
        let cpu = CPU.matmul_mode(&ca, &cb, o, BF16).unwrap().to_vec();
        within(
            &format!("{what} cpu"),
            &cpu,
            (&want, &scale),
            budget(BF16, k),
        );
        let f32_product = gpu.download(&gpu.matmul(&da, &db, o).unwrap()).unwrap();
        assert_ne!(
            bits(&ours),
            bits(&f32_product),
            "{what}: the float32 product"
        );
        // beta = 1: onto c, the sum rounded once more.
        let n = if o.trans_b { b_shape[0] } else { b_shape[1] };
        let c = values(want.len(), 300 + case as u64, -1.0, 1.0);
        let dst = gpu.upload(&c, &[want.len() / n, n]).unwrap();
        gpu.matmul_into_mode(&da, &db, o, &dst, BF16).unwrap();
        let into = gpu.download(&dst).unwrap();
        for (i, (&got, (&w, (&s, &c0)))) in into
            .iter()
            .zip(want.iter().zip(scale.iter().zip(&c)))
            .enumerate()
        {
            let exact = w + f64::from(c0);
            let bound = budget(BF16, k) * s + 2.0 * U * exact.abs();
            let err = (f64::from(got) - exact).abs();
            assert!(
                err <= bound,
                "{what} into: element {i}: {got:e} against {exact:e}"
            );
        }
    }
}

/// A Linear layer's forward under bf16 for one sample's rows (tanh and the identity), one
/// launch on the device, against the CPU's `linear_mode`: each side within the product's
/// budget of the float64 product of the rounded operands, so within twice it of each other
/// (the bias add and tanh, 1-Lipschitz, add a few float32 roundings); not float32's forward.
pub fn linear_forward_is_a_bf16_product<D: Driver>(gpu: &CudaBackend<D>) {
    let (rows, ins, outs) = (12, 256, 96);
    let x = values(rows * ins, 11, -1.0, 1.0);
    let w = values(outs * ins, 12, -0.3, 0.3);
    let bias = values(outs, 13, -0.5, 0.5);
    let (_, scale) = reference((&x, &[rows, ins]), (&w, &[outs, ins]), NT, BF16);
    let dev = |v: &[f32], s: &[usize]| gpu.upload(v, s).unwrap();
    let host = |v: &[f32], s: &[usize]| CpuTensor::from_vec(v.to_vec(), s).unwrap();
    let (dx, dw, db) = (
        dev(&x, &[rows, ins]),
        dev(&w, &[outs, ins]),
        dev(&bias, &[outs]),
    );
    let (hx, hw, hb) = (
        host(&x, &[rows, ins]),
        host(&w, &[outs, ins]),
        host(&bias, &[outs]),
    );
    for act in [Activation::Tanh, Activation::Identity] {
        let ours = gpu.linear_mode(&dx, &dw, &db, act, BF16).unwrap();
        let ours = gpu.download(&ours).unwrap();
        let cpu = CPU.linear_mode(&hx, &hw, &hb, act, BF16).unwrap().to_vec();
        for (i, ((&g, &c), &s)) in ours.iter().zip(&cpu).zip(&scale).enumerate() {
            let bound = 2.0 * budget(BF16, ins) * s + 4.0 * U * (f64::from(c).abs() + 1.0);
            let err = (f64::from(g) - f64::from(c)).abs();
            assert!(err <= bound, "{act:?}: element {i}: {g:e} against {c:e}");
        }
        let f32_forward = gpu
            .download(&gpu.linear(&dx, &dw, &db, act).unwrap())
            .unwrap();
        assert_ne!(
            bits(&ours),
            bits(&f32_forward),
            "{act:?}: float32's forward"
        );
    }
}

/// A Linear layer's backward under bf16 for one sample's rows (`linear_backward_into_mode`:
/// `gx = gz · w` on the n-contiguous bf16 form, `dw += gzᵀ · x` on the parameter-gradient
/// kernel's, `db` a float32 sum), identity and tanh, each backend against the float64
/// products of its own rounded operands within twice the accumulation budget, `db` within
/// float32 rounding of the CPU's.
pub fn linear_backward_is_a_bf16_product<D: Driver>(gpu: &CudaBackend<D>) {
    let (rows, ins, outs) = (12, 256, 96);
    let x = values(rows * ins, 41, -1.0, 1.0);
    let w = values(outs * ins, 42, -0.3, 0.3);
    let gy = values(rows * outs, 43, -1.0, 1.0);
    let y = values(rows * outs, 44, -0.9, 0.9);
    let dev = |v: &[f32], s: &[usize]| gpu.upload(v, s).unwrap();
    let host = |v: &[f32], s: &[usize]| CpuTensor::from_vec(v.to_vec(), s).unwrap();
    for act in [Activation::Identity, Activation::Tanh] {
        let tanh = act == Activation::Tanh;
        // The gradient before the activation as each backend forms it (tanh's backward in
        // float32; the GPU may contract `1 - y²` into a fused multiply-add, and a gradient one
        // float32 ulp apart can round to another bf16 value).
        let (yd, yh) = (dev(&y, &[rows, outs]), host(&y, &[rows, outs]));
        let (gz, gz_cpu) = if tanh {
            let d = gpu.tanh_backward(&dev(&gy, &[rows, outs]), &yd).unwrap();
            let h = CPU.tanh_backward(&host(&gy, &[rows, outs]), &yh).unwrap();
            (gpu.download(&d).unwrap(), h.to_vec())
        } else {
            (gy.clone(), gy.clone())
        };
        let plain = MatmulOpts::default();
        let (gx_want, gx_scale) = reference((&gz, &[rows, outs]), (&w, &[outs, ins]), plain, BF16);
        let (dw_want, dw_scale) = reference((&gz, &[rows, outs]), (&x, &[rows, ins]), TN, BF16);
        let cpu_want = reference((&gz_cpu, &[rows, outs]), (&x, &[rows, ins]), TN, BF16);
        let (dw, db) = (
            gpu.zeros(&[outs, ins]).unwrap(),
            gpu.zeros(&[outs]).unwrap(),
        );
        let gx = gpu
            .linear_backward_into_mode(
                &dev(&gy, &[rows, outs]),
                &dev(&x, &[rows, ins]),
                Some(&dev(&w, &[outs, ins])),
                (act, tanh.then_some(&yd)),
                (&dw, Some(&db)),
                BF16,
            )
            .unwrap()
            .expect("gx");
        let what = format!("{act:?}");
        let loose = |v: f64| 2.0 * v;
        within(
            &format!("{what} gx"),
            &gpu.download(&gx).unwrap(),
            (&gx_want, &gx_scale),
            loose(budget(BF16, outs)),
        );
        within(
            &format!("{what} dw"),
            &gpu.download(&dw).unwrap(),
            (&dw_want, &dw_scale),
            loose(budget(BF16, rows)),
        );
        let (dwc, dbc) = (
            CPU.zeros(&[outs, ins]).unwrap(),
            CPU.zeros(&[outs]).unwrap(),
        );
        CPU.linear_backward_into_mode(
            &host(&gy, &[rows, outs]),
            &host(&x, &[rows, ins]),
            Some(&host(&w, &[outs, ins])),
            (act, tanh.then_some(&yh)),
            (&dwc, Some(&dbc)),
            BF16,
        )
        .unwrap();
        within(
            &format!("{what} dw cpu"),
            &dwc.to_vec(),
            (&cpu_want.0, &cpu_want.1),
            loose(budget(BF16, rows)),
        );
        for (i, (g, c)) in gpu
            .download(&db)
            .unwrap()
            .iter()
            .zip(dbc.to_vec())
            .enumerate()
        {
            let err = (f64::from(*g) - f64::from(c)).abs();
            assert!(err <= 1e-4, "{what} db: element {i}: {g:e} against {c:e}");
        }
    }
}

/// The same few-row products on bf16 copies (`matmul_bf16_rhs`, `matmul_bf16`,
/// `matmul_into_bf16`, and the forward as the trainer runs it: the product on copies, then
/// `bias_act`) equal the products on the float32 operands (`matmul_mode`,
/// `matmul_into_mode`, `linear_mode`) bit for bit: the same kernel, the same values, the
/// same order. One weight is a view one element into its buffer, so on the device the
/// float32 form reads it unaligned while its copy is aligned: the order may not depend on
/// that.
pub fn products_on_copies_equal_rounding_as_read_bitwise<D: Driver>(gpu: &CudaBackend<D>) {
    let (rows, ins, outs) = (12, 256, 96);
    let x = gpu
        .upload(&values(rows * ins, 21, -1.0, 1.0), &[rows, ins])
        .unwrap();
    let g = gpu
        .upload(&values(rows * outs, 22, -1.0, 1.0), &[rows, outs])
        .unwrap();
    let bias = gpu.upload(&values(outs, 23, -0.5, 0.5), &[outs]).unwrap();
    let flat = gpu
        .upload(&values(1 + outs * ins, 24, -0.3, 0.3), &[1 + outs * ins])
        .unwrap();
    let offset = flat
        .narrow(0, 1, outs * ins)
        .unwrap()
        .reshape(&[outs, ins])
        .unwrap();
    let dense = gpu
        .upload(&values(outs * ins, 25, -0.3, 0.3), &[outs, ins])
        .unwrap();
    let down = |t: &CudaTensor| bits(&gpu.download(t).unwrap());
    let (cx, cg) = (gpu.bf16_copy_of(&x).unwrap(), gpu.bf16_copy_of(&g).unwrap());
    for (name, w) in [("dense", &dense), ("one element in", &offset)] {
        let cw = gpu.bf16_copy_of(w).unwrap();
        // Forward, k-contiguous.
        let per_call = down(&gpu.matmul_mode(&x, w, NT, BF16).unwrap());
        assert_eq!(
            down(&gpu.matmul_bf16_rhs(&x, &cw, NT).unwrap()),
            per_call,
            "{name} rhs"
        );
        assert_eq!(
            down(&gpu.matmul_bf16(&cx, &cw, NT).unwrap()),
            per_call,
            "{name} copies"
        );
        for act in [Activation::Tanh, Activation::Identity] {
            let fused = down(&gpu.linear_mode(&x, w, &bias, act, BF16).unwrap());
            let product = gpu.matmul_bf16(&cx, &cw, NT).unwrap();
            let composite = down(&gpu.bias_act(&product, &bias, act).unwrap());
            assert_eq!(fused, composite, "{name} {act:?} forward");
            // The forward on copies with the epilogue inside (the trainer's).
            assert_eq!(
                down(&gpu.linear_bf16(&cx, &cw, &bias, act, None).unwrap()),
                fused,
                "{name} {act:?} forward on copies"
            );
            assert_eq!(
                down(&gpu.linear_bf16_rhs(&x, &cw, &bias, act, None).unwrap()),
                fused,
                "{name} {act:?} forward on the weight's copy"
            );
        }
        // A skip connection: the residual added after the epilogue, in the same launch.
        let r = gpu
            .upload(&values(rows * outs, 30, -1.0, 1.0), &[rows, outs])
            .unwrap();
        let z = gpu
            .linear_mode(&x, w, &bias, Activation::Identity, BF16)
            .unwrap();
        let want = down(&gpu.add(&z, &r).unwrap());
        let id = Activation::Identity;
        assert_eq!(
            down(&gpu.linear_bf16(&cx, &cw, &bias, id, Some(&r)).unwrap()),
            want,
            "{name} forward on copies with a residual"
        );
        assert_eq!(
            down(&gpu.linear_bf16_rhs(&x, &cw, &bias, id, Some(&r)).unwrap()),
            want,
            "{name} forward on the weight's copy with a residual"
        );
        // dX = g · W, n-contiguous.
        let plain = MatmulOpts::default();
        let per_call = down(&gpu.matmul_mode(&g, w, plain, BF16).unwrap());
        assert_eq!(
            down(&gpu.matmul_bf16_rhs(&g, &cw, plain).unwrap()),
            per_call,
            "{name} dX rhs"
        );
        assert_eq!(
            down(&gpu.matmul_bf16(&cg, &cw, plain).unwrap()),
            per_call,
            "{name} dX"
        );
        // Into values already there (beta = 1).
        let start = values(rows * outs, 26, -1.0, 1.0);
        let (a, b) = (
            gpu.upload(&start, &[rows, outs]).unwrap(),
            gpu.upload(&start, &[rows, outs]).unwrap(),
        );
        gpu.matmul_into_mode(&x, w, NT, &a, BF16).unwrap();
        gpu.matmul_into_bf16(&cx, &cw, NT, &b).unwrap();
        assert_eq!(down(&a), down(&b), "{name} into");
    }
    // The weight's gradient added into its buffer, dw += gᵀ · x.
    let start = values(outs * ins, 27, -1.0, 1.0);
    let (a, b) = (
        gpu.upload(&start, &[outs, ins]).unwrap(),
        gpu.upload(&start, &[outs, ins]).unwrap(),
    );
    gpu.matmul_into_mode(&g, &x, TN, &a, BF16).unwrap();
    gpu.matmul_into_bf16(&cg, &cx, TN, &b).unwrap();
    assert_eq!(down(&a), down(&b), "dw += gᵀ · x");
    // 193 inputs: one element of dw a thread.
    let x193 = gpu
        .upload(&values(rows * 193, 28, -1.0, 1.0), &[rows, 193])
        .unwrap();
    let start = values(outs * 193, 29, -1.0, 1.0);
    let (a, b) = (
        gpu.upload(&start, &[outs, 193]).unwrap(),
        gpu.upload(&start, &[outs, 193]).unwrap(),
    );
    gpu.matmul_into_mode(&g, &x193, TN, &a, BF16).unwrap();
    let c193 = gpu.bf16_copy_of(&x193).unwrap();
    gpu.matmul_into_bf16(&cg, &c193, TN, &b).unwrap();
    assert_eq!(down(&a), down(&b), "dw += gᵀ · x, 193 inputs");
    // Both parameter gradients at once: dw as above, db the float32 column sum of g in row
    // order (the weight-gradient kernel's, at 96 outputs).
    let c = gpu.upload(&start, &[outs, 193]).unwrap();
    let db0 = values(outs, 31, -1.0, 1.0);
    let db = gpu.upload(&db0, &[outs]).unwrap();
    gpu.linear_param_grads_into_bf16(&g, &cg, &c193, &c, Some(&db))
        .unwrap();
    assert_eq!(down(&c), down(&b), "linear_param_grads_into_bf16's dw");
    let gv = gpu.download(&g).unwrap();
    let want: Vec<u32> = (0..outs)
        .map(|o| (db0[o] + (0..rows).fold(0.0f32, |s, r| s + gv[r * outs + o])).to_bits())
        .collect();
    assert_eq!(down(&db), want, "linear_param_grads_into_bf16's db");
}

/// Tanh's backward with its bf16 copy in one launch equals `tanh_backward` then
/// `bf16_copy_of`, bit for bit (the result and every bf16 of the copy).
pub fn tanh_backward_bf16_is_tanh_backward_then_its_copy<D: Driver>(gpu: &CudaBackend<D>) {
    let (rows, outs) = (12, 96);
    let g = gpu
        .upload(&values(rows * outs, 40, -2.0, 2.0), &[rows, outs])
        .unwrap();
    let y = gpu
        .upload(&values(rows * outs, 41, -1.0, 1.0), &[rows, outs])
        .unwrap();
    let down = |t: &CudaTensor| bits(&gpu.download(t).unwrap());
    let (gz, copy) = gpu.tanh_backward_bf16(&g, &y).unwrap();
    let want = gpu.tanh_backward(&g, &y).unwrap();
    assert_eq!(down(&gz), down(&want), "tanh's backward");
    let want_copy = gpu.bf16_copy_of(&want).unwrap();
    assert_eq!(copy.shape(), want_copy.shape());
    assert_eq!(down(copy.backing()), down(want_copy.backing()), "the copy");
}

macro_rules! linear_bf16_suite {
    ($backend:path) => {
        #[test]
        fn few_row_products_are_bf16_products() {
            super::few_row_products_are_bf16_products(&$backend());
        }

        #[test]
        fn linear_forward_is_a_bf16_product() {
            super::linear_forward_is_a_bf16_product(&$backend());
        }

        #[test]
        fn linear_backward_is_a_bf16_product() {
            super::linear_backward_is_a_bf16_product(&$backend());
        }

        #[test]
        fn tanh_backward_bf16_is_tanh_backward_then_its_copy() {
            super::tanh_backward_bf16_is_tanh_backward_then_its_copy(&$backend());
        }

        #[test]
        fn products_on_copies_equal_rounding_as_read_bitwise() {
            super::products_on_copies_equal_rounding_as_read_bitwise(&$backend());
        }
    };
}

mod mock_suite {
    linear_bf16_suite!(super::super::mock);
}

#[cfg(feature = "gpu")]
mod gpu {
    linear_bf16_suite!(super::super::gpu);
}

/// Which kernels run, on the simulated device: under bf16 one sample's products are one
/// launch each of the bf16 form (the forward with its epilogue, a product on copies too),
/// with no conversion and no cuBLAS call; more rows keep the conversions and cuBLAS, TF32
/// keeps cuBLAS, float32 its own form.
mod launches {
    use super::{BF16, NT, TN, values};
    use std::sync::{Arc, Mutex};
    use zcompute::cuda::Kernel;
    use zcompute::prelude::*;
    use zcompute::{Activation, CudaBackend, CudaTensor, MathMode, MatmulOpts};
    use zdevice::sim::calls::{GEMM_STRIDED_BATCHED, GEMM_STRIDED_BATCHED_EX};
    use zdevice::{SimConfig, SimDriver};

    use super::super::{KernelLog as Log, observed};
    type Grid = (u32, u32, u32);

    /// The kernels run and the cuBLAS calls made (float32, mixed) since the last call
    /// (`seen`: the call counts then), after `settle` (a download: the simulator runs queued
    /// work then).
    fn ran(
        gpu: &CudaBackend<SimDriver>,
        settle: &CudaTensor,
        log: &Log,
        seen: &mut (u64, u64),
    ) -> (Vec<Kernel>, u64, u64) {
        gpu.download(settle).expect("the stream runs");
        let sim = gpu.device().driver();
        let now = (
            sim.call_count(GEMM_STRIDED_BATCHED),
            sim.call_count(GEMM_STRIDED_BATCHED_EX),
        );
        let new = (now.0 - seen.0, now.1 - seen.1);
        *seen = now;
        let kernels = log.lock().unwrap().drain(..).collect();
        (kernels, new.0, new.1)
    }

    #[test]
    fn a_bf16_few_row_product_is_one_launch_of_its_bf16_form() {
        let (gpu, log) = observed();
        let up = |n: usize, seed, shape: &[usize]| {
            gpu.upload(&values(n, seed, -1.0, 1.0), shape).unwrap()
        };
        let (x, w, b) = (
            up(12 * 256, 1, &[12, 256]),
            up(96 * 256, 2, &[96, 256]),
            up(96, 3, &[96]),
        );
        let g = up(12 * 96, 4, &[12, 96]);
        let (cx, cw, cg) = (
            gpu.bf16_copy_of(&x).unwrap(),
            gpu.bf16_copy_of(&w).unwrap(),
            gpu.bf16_copy_of(&g).unwrap(),
        );
        let mut seen = (0, 0);
        ran(&gpu, &x, &log, &mut seen);
        let y = up(12 * 96, 8, &[12, 96]);
        let (gz, _copy) = gpu.tanh_backward_bf16(&g, &y).unwrap();
        assert_eq!(
            ran(&gpu, &gz, &log, &mut seen),
            (vec![Kernel::TanhBackwardBf16], 0, 0),
            "tanh's backward and its copy"
        );
        let kmajor = (vec![Kernel::LinearRowsKMajorBf16], 0, 0);
        let nmajor = (vec![Kernel::LinearRowsNMajorBf16], 0, 0);
        let y = gpu.matmul_mode(&x, &w, NT, BF16).unwrap();
        assert_eq!(ran(&gpu, &y, &log, &mut seen), kmajor, "x · wᵀ");
        let y = gpu.linear_mode(&x, &w, &b, Activation::Tanh, BF16).unwrap();
        assert_eq!(
            ran(&gpu, &y, &log, &mut seen),
            kmajor,
            "the forward, its epilogue inside"
        );
        let y = gpu.matmul_bf16_rhs(&x, &cw, NT).unwrap();
        assert_eq!(
            ran(&gpu, &y, &log, &mut seen),
            kmajor,
            "x · wᵀ on the weight's copy"
        );
        let y = gpu.matmul_bf16(&cx, &cw, NT).unwrap();
        assert_eq!(ran(&gpu, &y, &log, &mut seen), kmajor, "x · wᵀ on copies");
        let y = gpu
            .linear_bf16(&cx, &cw, &b, Activation::Tanh, None)
            .unwrap();
        assert_eq!(
            ran(&gpu, &y, &log, &mut seen),
            kmajor,
            "the forward on copies, its epilogue inside"
        );
        let y = gpu
            .linear_bf16_rhs(&x, &cw, &b, Activation::Identity, None)
            .unwrap();
        assert_eq!(
            ran(&gpu, &y, &log, &mut seen),
            kmajor,
            "the forward on the weight's copy, its epilogue inside"
        );
        let r = up(12 * 96, 7, &[12, 96]);
        let y = gpu
            .linear_bf16(&cx, &cw, &b, Activation::Identity, Some(&r))
            .unwrap();
        assert_eq!(
            ran(&gpu, &y, &log, &mut seen),
            kmajor,
            "the forward on copies with a residual, the add inside"
        );
        let plain = MatmulOpts::default();
        let y = gpu.matmul_mode(&g, &w, plain, BF16).unwrap();
        assert_eq!(ran(&gpu, &y, &log, &mut seen), nmajor, "g · w");
        let y = gpu.matmul_bf16(&cg, &cw, plain).unwrap();
        assert_eq!(ran(&gpu, &y, &log, &mut seen), nmajor, "g · w on copies");
        gpu.matmul_into_mode(&g, &w, plain, &y, BF16).unwrap();
        assert_eq!(
            ran(&gpu, &y, &log, &mut seen),
            nmajor,
            "g · w added (beta = 1)"
        );
        let dw = up(96 * 256, 6, &[96, 256]);
        let grads = (vec![Kernel::LinearParamGradsBf16], 0, 0);
        gpu.matmul_into_mode(&g, &x, TN, &dw, BF16).unwrap();
        assert_eq!(ran(&gpu, &dw, &log, &mut seen), grads, "dw += gᵀ · x");
        gpu.matmul_into_bf16(&cg, &cx, TN, &dw).unwrap();
        assert_eq!(
            ran(&gpu, &dw, &log, &mut seen),
            grads,
            "dw += gᵀ · x on copies"
        );
        // Unchanged: the weight's gradient into a fresh tensor, more rows than the limit (a conversion per operand, then cuBLAS), TF32
        // (cuBLAS on the operands in place), float32 (its own form).
        let y = gpu.matmul_mode(&g, &x, TN, BF16).unwrap();
        assert_eq!(
            ran(&gpu, &y, &log, &mut seen),
            (vec![Kernel::F32ToBf16, Kernel::F32ToBf16], 0, 1),
            "gᵀ · x"
        );
        let many = up(33 * 256, 5, &[33, 256]);
        let y = gpu.matmul_mode(&many, &w, NT, BF16).unwrap();
        assert_eq!(
            ran(&gpu, &y, &log, &mut seen),
            (vec![Kernel::F32ToBf16, Kernel::F32ToBf16], 0, 1),
            "33 rows"
        );
        let y = gpu.matmul_mode(&x, &w, NT, MathMode::Tf32).unwrap();
        assert_eq!(ran(&gpu, &y, &log, &mut seen), (vec![], 0, 1), "tf32");
        let y = gpu.matmul_mode(&x, &w, NT, MathMode::F32).unwrap();
        assert_eq!(
            ran(&gpu, &y, &log, &mut seen),
            (vec![Kernel::LinearRowsKMajor], 0, 0),
            "f32"
        );
    }

    /// The bf16 weight gradient takes a float4 of dw a thread where the float32 kernel does
    /// (its grid a quarter as wide; x's copy needs 8-byte alignment only), and one element a
    /// thread where the inputs are not a multiple of 4; on copies and on float32 operands.
    #[test]
    fn the_bf16_weight_gradient_takes_four_inputs_a_thread() {
        use zcompute::cuda::twins::register_observed_launches;
        let sim = SimDriver::new(SimConfig::with_capacity(512 << 20));
        let grids: Arc<Mutex<Vec<(Kernel, Grid)>>> = Arc::default();
        let seen = Arc::clone(&grids);
        register_observed_launches(&sim, move |k, c| seen.lock().unwrap().push((k, c.grid)));
        let gpu = super::super::on_sim(sim);
        for (ins, blocks_x) in [(256, 1), (1024, 4), (193, 4)] {
            let up = |n: usize, seed, shape: &[usize]| {
                gpu.upload(&values(n, seed, -1.0, 1.0), shape).unwrap()
            };
            let (g, x) = (up(12 * 96, 1, &[12, 96]), up(12 * ins, 2, &[12, ins]));
            let dw = up(96 * ins, 3, &[96, ins]);
            let (cg, cx) = (gpu.bf16_copy_of(&g).unwrap(), gpu.bf16_copy_of(&x).unwrap());
            gpu.download(&cx.backing().clone()).unwrap();
            grids.lock().unwrap().clear();
            gpu.matmul_into_bf16(&cg, &cx, TN, &dw).unwrap();
            gpu.matmul_into_mode(&g, &x, TN, &dw, BF16).unwrap();
            gpu.download(&dw).unwrap();
            let want = (Kernel::LinearParamGradsBf16, (blocks_x, 96 / 4, 1));
            assert_eq!(*grids.lock().unwrap(), [want, want], "{ins} inputs");
        }
    }

    /// A Linear layer's parameter gradients under bf16 from one sample's rows: one launch of
    /// the weight-gradient kernel with the bias's column sum inside (float32, row order, on
    /// the unrounded gradient) where the product takes that kernel (more outputs than the row
    /// kernels' limit), dw bit for bit `matmul_into_bf16`'s; the product and the column sum
    /// otherwise.
    #[test]
    fn bf16_parameter_gradients_are_one_launch() {
        let (gpu, log) = observed();
        let mut seen = (0, 0);
        for (outs, one_launch) in [(96, true), (24, false)] {
            let ins = 256;
            let up = |n: usize, seed, shape: &[usize]| {
                gpu.upload(&values(n, seed, -1.0, 1.0), shape).unwrap()
            };
            let (g, x) = (up(12 * outs, 1, &[12, outs]), up(12 * ins, 2, &[12, ins]));
            let (cg, cx) = (gpu.bf16_copy_of(&g).unwrap(), gpu.bf16_copy_of(&x).unwrap());
            let start = values(outs * ins, 3, -1.0, 1.0);
            let (dw, want_dw) = (
                gpu.upload(&start, &[outs, ins]).unwrap(),
                gpu.upload(&start, &[outs, ins]).unwrap(),
            );
            let db0 = values(outs, 4, -1.0, 1.0);
            let db = gpu.upload(&db0, &[outs]).unwrap();
            ran(&gpu, &db, &log, &mut seen);
            gpu.linear_param_grads_into_bf16(&g, &cg, &cx, &dw, Some(&db))
                .unwrap();
            let (kernels, _, _) = ran(&gpu, &db, &log, &mut seen);
            let want = if one_launch {
                vec![Kernel::LinearParamGradsBf16]
            } else {
                vec![Kernel::LinearRowsNMajorBf16, Kernel::ReduceCols]
            };
            assert_eq!(kernels, want, "{outs} outputs");
            gpu.matmul_into_bf16(&cg, &cx, TN, &want_dw).unwrap();
            let bits = |t: &CudaTensor| {
                gpu.download(t)
                    .unwrap()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect::<Vec<_>>()
            };
            assert_eq!(bits(&dw), bits(&want_dw), "{outs} outputs: dw");
            if one_launch {
                // The kernel's sum: row order, from 0, then added.
                let gv = gpu.download(&g).unwrap();
                let want: Vec<u32> = (0..outs)
                    .map(|o| {
                        let s = (0..12).fold(0.0f32, |s, r| s + gv[r * outs + o]);
                        (db0[o] + s).to_bits()
                    })
                    .collect();
                assert_eq!(bits(&db), want, "{outs} outputs: db");
            }
        }
    }
}
