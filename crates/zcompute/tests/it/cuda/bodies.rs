//! Op bodies generic over the driver: the same inputs (and the same views) on the CPU backend
//! and on a CUDA backend, compared per tensor as ||ours - cpu|| / ||cpu||.

use crate::common::{rel_err, uniform};
use zcompute::{
    AdamWConfig, Backend, BinaryOp, CpuBackend, CpuTensor, CudaBackend, CudaTensor, MatmulOpts,
    ReduceOp, ScalarSide, UnaryOp,
};
use zdevice::Driver;

/// Per-tensor budget, float32 against float32 on the CPU.
pub const TOL: f64 = 1e-5;
/// With TF32 matrix products.
pub const TOL_TF32: f64 = 1e-3;

const CPU: CpuBackend = CpuBackend;

/// How an input reaches the op: dense, or as a view over a larger or reordered buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum View {
    Dense,
    /// The last two axes stored swapped, then transposed back (strides not row-major).
    Transposed,
    /// Stored with 3 extra entries on the last axis, narrowed to the middle.
    Narrowed,
}

/// Values in `[lo, hi)` for `shape` seen through `view`, built the same way on any backend.
pub fn input<B: Backend<f32>>(
    b: &B,
    shape: &[usize],
    view: View,
    seed: u64,
    lo: f64,
    hi: f64,
) -> zcompute::BTensor<B, f32> {
    let rank = shape.len();
    let mut stored = shape.to_vec();
    match view {
        View::Transposed if rank >= 2 => stored.swap(rank - 1, rank - 2),
        View::Narrowed if rank >= 1 => stored[rank - 1] += 3,
        _ => {}
    }
    let n: usize = stored.iter().product();
    let data: Vec<f32> = uniform(n, seed, lo, hi).iter().map(|&v| v as f32).collect();
    let t = b.upload(&data, &stored).expect("upload");
    match view {
        View::Transposed if rank >= 2 => t.transpose(rank - 1, rank - 2).expect("transpose"),
        View::Narrowed if rank >= 1 => t.narrow(rank - 1, 1, shape[rank - 1]).expect("narrow"),
        _ => t,
    }
}

/// Asserts the device result matches the CPU's (shape and values).
pub fn assert_close<D: Driver>(
    what: &str,
    gpu: &CudaBackend<D>,
    ours: &CudaTensor,
    cpu: &CpuTensor<f32>,
    tol: f64,
) {
    assert_eq!(ours.shape(), cpu.shape(), "{what}: shape");
    let got = gpu.download(ours).expect("download");
    let want: Vec<f64> = cpu.to_vec().iter().map(|&v| f64::from(v)).collect();
    let err = rel_err(&got, &want);
    assert!(
        err <= tol,
        "{what}: relative error {err:e} (budget {tol:e})"
    );
}

fn range(op: UnaryOp) -> (f64, f64) {
    match op {
        UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt => (0.1, 4.0),
        UnaryOp::Exp => (-4.0, 4.0),
        _ => (-3.0, 3.0),
    }
}

pub fn unary<D: Driver>(gpu: &CudaBackend<D>, op: UnaryOp, shape: &[usize], view: View) {
    let (lo, hi) = range(op);
    let x = input(gpu, shape, view, 1, lo, hi);
    let xc = input(&CPU, shape, view, 1, lo, hi);
    let ours = gpu.unary(op, &x).expect("unary");
    let want = Backend::<f32>::unary(&CPU, op, &xc).expect("cpu unary");
    assert_close(
        &format!("{op:?} {shape:?} {view:?}"),
        gpu,
        &ours,
        &want,
        TOL,
    );
}

pub fn binary<D: Driver>(gpu: &CudaBackend<D>, op: BinaryOp, a: &[usize], b: &[usize], view: View) {
    let (lo, hi) = if op == BinaryOp::Div {
        (0.5, 2.0)
    } else {
        (-2.0, 2.0)
    };
    let (xa, xb) = (
        input(gpu, a, view, 2, -2.0, 2.0),
        input(gpu, b, View::Dense, 3, lo, hi),
    );
    let (ca, cb) = (
        input(&CPU, a, view, 2, -2.0, 2.0),
        input(&CPU, b, View::Dense, 3, lo, hi),
    );
    let ours = gpu.binary(op, &xa, &xb).expect("binary");
    let want = Backend::<f32>::binary(&CPU, op, &ca, &cb).expect("cpu binary");
    assert_close(
        &format!("{op:?} {a:?} {b:?} {view:?}"),
        gpu,
        &ours,
        &want,
        TOL,
    );
    // Operands swapped: the broadcast on the other side.
    let ours = gpu.binary(op, &xb, &xa).expect("binary");
    let want = Backend::<f32>::binary(&CPU, op, &cb, &ca).expect("cpu binary");
    assert_close(
        &format!("{op:?} {b:?} {a:?} {view:?}"),
        gpu,
        &ours,
        &want,
        TOL,
    );
}

pub fn binary_scalar<D: Driver>(gpu: &CudaBackend<D>, op: BinaryOp, shape: &[usize], view: View) {
    let x = input(gpu, shape, view, 4, 0.5, 2.0);
    let xc = input(&CPU, shape, view, 4, 0.5, 2.0);
    for side in [ScalarSide::Lhs, ScalarSide::Rhs] {
        let ours = gpu.binary_scalar(op, &x, 1.75, side).expect("scalar");
        let want = Backend::<f32>::binary_scalar(&CPU, op, &xc, 1.75, side).expect("cpu");
        assert_close(
            &format!("{op:?} {side:?} {shape:?}"),
            gpu,
            &ours,
            &want,
            TOL,
        );
    }
}

pub fn reduce<D: Driver>(gpu: &CudaBackend<D>, op: ReduceOp, shape: &[usize], view: View) {
    let x = input(gpu, shape, view, 5, -2.0, 2.0);
    let xc = input(&CPU, shape, view, 5, -2.0, 2.0);
    for axis in 0..shape.len() {
        for keepdim in [false, true] {
            let ours = gpu.reduce(op, &x, axis, keepdim).expect("reduce");
            let want = Backend::<f32>::reduce(&CPU, op, &xc, axis, keepdim).expect("cpu");
            let what = format!("{op:?} {shape:?} axis {axis} keepdim {keepdim} {view:?}");
            assert_close(&what, gpu, &ours, &want, TOL);
        }
    }
}

pub fn softmax<D: Driver>(gpu: &CudaBackend<D>, shape: &[usize], view: View) {
    // Wide range: the row-max shift must keep exp from overflowing.
    let x = input(gpu, shape, view, 6, -60.0, 60.0);
    let xc = input(&CPU, shape, view, 6, -60.0, 60.0);
    let ours = gpu.softmax_last(&x).expect("softmax");
    let want = Backend::<f32>::softmax_last(&CPU, &xc).expect("cpu");
    assert_close(
        &format!("softmax {shape:?} {view:?}"),
        gpu,
        &ours,
        &want,
        TOL,
    );
}

pub fn layer_norm<D: Driver>(gpu: &CudaBackend<D>, shape: &[usize], view: View, affine: bool) {
    let x = input(gpu, shape, view, 7, -3.0, 5.0);
    let xc = input(&CPU, shape, view, 7, -3.0, 5.0);
    let n = shape[shape.len() - 1];
    let (w, b) = (
        input(gpu, &[n], View::Dense, 8, 0.5, 1.5),
        input(gpu, &[n], View::Dense, 9, -1.0, 1.0),
    );
    let (wc, bc) = (
        input(&CPU, &[n], View::Dense, 8, 0.5, 1.5),
        input(&CPU, &[n], View::Dense, 9, -1.0, 1.0),
    );
    let (ours, want) = if affine {
        (
            gpu.layer_norm(&x, Some(&w), Some(&b), 1e-5).expect("ln"),
            Backend::<f32>::layer_norm(&CPU, &xc, Some(&wc), Some(&bc), 1e-5).expect("cpu"),
        )
    } else {
        (
            gpu.layer_norm(&x, None, None, 1e-5).expect("ln"),
            Backend::<f32>::layer_norm(&CPU, &xc, None, None, 1e-5).expect("cpu"),
        )
    };
    let what = format!("layer_norm {shape:?} {view:?} affine {affine}");
    assert_close(&format!("{what} out"), gpu, &ours.out, &want.out, TOL);
    assert_close(&format!("{what} mean"), gpu, &ours.mean, &want.mean, TOL);
    assert_close(&format!("{what} rstd"), gpu, &ours.rstd, &want.rstd, TOL);
}

/// Softmax's and LayerNorm's backward (every `want` combination) against the CPU backend's
/// composite formulas, from the outputs of the forward ops.
pub fn row_backward<D: Driver>(gpu: &CudaBackend<D>, shape: &[usize], view: View, affine: bool) {
    let (x, xc) = (
        input(gpu, shape, view, 10, -3.0, 5.0),
        input(&CPU, shape, view, 10, -3.0, 5.0),
    );
    let (g, gc) = (
        input(gpu, shape, view, 11, -1.0, 1.0),
        input(&CPU, shape, view, 11, -1.0, 1.0),
    );
    let what = format!("{shape:?} {view:?}");
    let y = gpu.softmax_last(&x).expect("softmax");
    let yc = Backend::<f32>::softmax_last(&CPU, &xc).expect("cpu");
    let ours = gpu.softmax_backward(&g, &y).expect("softmax backward");
    let want = Backend::<f32>::softmax_backward(&CPU, &gc, &yc).expect("cpu");
    assert_close(&format!("softmax backward {what}"), gpu, &ours, &want, TOL);

    let n = shape[shape.len() - 1];
    let w = input(gpu, &[n], View::Dense, 12, 0.5, 1.5);
    let wc = input(&CPU, &[n], View::Dense, 12, 0.5, 1.5);
    let (w, wc) = if affine {
        (Some(&w), Some(&wc))
    } else {
        (None, None)
    };
    let f = gpu.layer_norm(&x, w, None, 1e-5).expect("ln");
    let fc = Backend::<f32>::layer_norm(&CPU, &xc, wc, None, 1e-5).expect("cpu");
    for want in [[true, true], [true, false], [false, true], [false, false]] {
        let ours = gpu
            .layer_norm_backward(&g, &x, &f.mean, &f.rstd, w, want)
            .expect("ln backward");
        let cpu = Backend::<f32>::layer_norm_backward(&CPU, &gc, &xc, &fc.mean, &fc.rstd, wc, want)
            .expect("cpu");
        let what = format!("layer_norm backward {what} affine {affine} want {want:?}");
        for (name, o, c) in [
            ("input", ours.input, cpu.input),
            ("g_xhat", ours.g_xhat, cpu.g_xhat),
        ] {
            match (o, c) {
                (Some(o), Some(c)) => assert_close(&format!("{what} {name}"), gpu, &o, &c, TOL),
                (None, None) => {}
                _ => panic!("{what} {name}: present on one backend only"),
            }
        }
    }
}

/// `a` and `b` are the stored shapes; `opts` say how they are read. `view` transposes the
/// stored operands (the transposed view is then read with the flag flipped, same product).
pub fn matmul<D: Driver>(
    gpu: &CudaBackend<D>,
    a: &[usize],
    b: &[usize],
    opts: MatmulOpts,
    view: View,
    tol: f64,
) {
    let xa = input(gpu, a, view, 10, -1.0, 1.0);
    let xb = input(gpu, b, view, 11, -1.0, 1.0);
    let ca = input(&CPU, a, view, 10, -1.0, 1.0);
    let cb = input(&CPU, b, view, 11, -1.0, 1.0);
    let ours = gpu.matmul(&xa, &xb, opts).expect("matmul");
    let want = Backend::<f32>::matmul(&CPU, &ca, &cb, opts).expect("cpu");
    assert_close(
        &format!("matmul {a:?} {b:?} {opts:?} {view:?}"),
        gpu,
        &ours,
        &want,
        tol,
    );
}

pub fn bce<D: Driver>(gpu: &CudaBackend<D>, shape: &[usize], view: View) {
    let x = input(gpu, shape, view, 12, -30.0, 30.0);
    let y = input(gpu, shape, View::Dense, 13, 0.0, 1.0);
    let xc = input(&CPU, shape, view, 12, -30.0, 30.0);
    let yc = input(&CPU, shape, View::Dense, 13, 0.0, 1.0);
    let ours = gpu.bce_with_logits_mean(&x, &y).expect("bce");
    let want = Backend::<f32>::bce_with_logits_mean(&CPU, &xc, &yc).expect("cpu");
    assert_close(&format!("bce {shape:?} {view:?}"), gpu, &ours, &want, TOL);
}

/// Three AdamW steps with the learning rate and step count changed in the slot between them.
pub fn adamw<D: Driver>(gpu: &CudaBackend<D>, shape: &[usize], view: View) {
    let cfg = AdamWConfig {
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
    };
    let (p, m, v) = (
        input(gpu, shape, view, 14, -1.0, 1.0),
        input(gpu, shape, view, 15, -0.1, 0.1),
        input(gpu, shape, view, 16, 0.0, 0.01),
    );
    let (pc, mc, vc) = (
        input(&CPU, shape, view, 14, -1.0, 1.0),
        input(&CPU, shape, view, 15, -0.1, 0.1),
        input(&CPU, shape, view, 16, 0.0, 0.01),
    );
    let slot = gpu.upload(&[0.0, 0.0], &[2]).expect("slot");
    let slot_c = CpuTensor::from_vec(vec![0.0f32, 0.0], &[2]).expect("slot");
    for t in 1..=3u64 {
        let g = input(gpu, shape, View::Dense, 16 + t, -1.0, 1.0);
        let gc = input(&CPU, shape, View::Dense, 16 + t, -1.0, 1.0);
        let lr = 1e-2 / t as f32;
        gpu.upload_into(&[lr, t as f32], &slot).expect("slot");
        Backend::<f32>::upload_into(&CPU, &[lr, t as f32], &slot_c).expect("slot");
        gpu.adamw_step(&p, &m, &v, &g, &slot, &cfg).expect("adamw");
        Backend::<f32>::adamw_step(&CPU, &pc, &mc, &vc, &gc, &slot_c, &cfg).expect("cpu");
    }
    for (name, ours, want) in [("p", &p, &pc), ("m", &m, &mc), ("v", &v, &vc)] {
        assert_close(
            &format!("adamw {name} {shape:?} {view:?}"),
            gpu,
            ours,
            want,
            TOL,
        );
    }
}

/// The kernel's two paths compute the same bits: four elements a thread where the operands are
/// 16-byte aligned (and the scalar loop for the last `n % 4`), one where they are not (views
/// one element into their buffers). Three steps, `p`, `m` and `v` compared bit for bit.
pub fn adamw_aligned_and_unaligned_agree<D: Driver>(gpu: &CudaBackend<D>) {
    const N: usize = 4099;
    let cfg = AdamWConfig {
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
    };
    let values = |seed: u64, lo: f64, hi: f64| -> Vec<f32> {
        let t = input(&CPU, &[N], View::Dense, seed, lo, hi);
        Backend::<f32>::download(&CPU, &t).expect("values")
    };
    let (p0, m0, v0) = (
        values(34, -1.0, 1.0),
        values(35, -0.1, 0.1),
        values(36, 0.0, 0.01),
    );
    let aligned = |x: &[f32]| gpu.upload(x, &[N]).expect("aligned");
    let shifted = |x: &[f32]| {
        let mut b = vec![f32::NAN];
        b.extend_from_slice(x);
        let whole = gpu.upload(&b, &[N + 1]).expect("buffer");
        whole.narrow(0, 1, N).expect("one element in")
    };
    let a = [aligned(&p0), aligned(&m0), aligned(&v0)];
    let u = [shifted(&p0), shifted(&m0), shifted(&v0)];
    let slot = gpu.upload(&[0.0, 0.0], &[2]).expect("slot");
    for t in 1..=3u64 {
        let g = values(36 + t, -1.0, 1.0);
        gpu.upload_into(&[1e-2 / t as f32, t as f32], &slot)
            .expect("slot");
        gpu.adamw_step(&a[0], &a[1], &a[2], &aligned(&g), &slot, &cfg)
            .expect("aligned");
        gpu.adamw_step(&u[0], &u[1], &u[2], &shifted(&g), &slot, &cfg)
            .expect("unaligned");
    }
    for (name, x, y) in [
        ("p", &a[0], &u[0]),
        ("m", &a[1], &u[1]),
        ("v", &a[2], &u[2]),
    ] {
        let (x, y) = (gpu.download(x).expect("x"), gpu.download(y).expect("y"));
        let differ = x
            .iter()
            .zip(&y)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(differ, 0, "adamw {name}: {differ} of {N} elements differ");
        assert_ne!(x, p0, "nothing was updated");
    }
}

/// The gate of a 3-element slot `[lr, t, gate]`: 0 updates exactly as the 2-element slot does;
/// NaN, infinity or 1 leave `p`, `m` and `v` bitwise untouched (the kernel and its sim twin).
pub fn adamw_gate<D: Driver>(gpu: &CudaBackend<D>, shape: &[usize], view: View) {
    let cfg = AdamWConfig {
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
    };
    let state = || {
        (
            input(gpu, shape, view, 24, -1.0, 1.0),
            input(gpu, shape, view, 25, -0.1, 0.1),
            input(gpu, shape, view, 26, 0.0, 0.01),
        )
    };
    let g = input(gpu, shape, View::Dense, 27, -1.0, 1.0);
    let bits = |t: &CudaTensor| -> Vec<u32> {
        let v: Vec<f32> = gpu.download(t).expect("download");
        v.iter().map(|x| x.to_bits()).collect()
    };
    for gate in [f32::NAN, f32::INFINITY, 1.0] {
        let (p, m, v) = state();
        let before = [bits(&p), bits(&m), bits(&v)];
        let slot = gpu.upload(&[1e-2, 2.0, gate], &[3]).expect("slot");
        gpu.adamw_step(&p, &m, &v, &g, &slot, &cfg).expect("adamw");
        assert_eq!([bits(&p), bits(&m), bits(&v)], before, "gate {gate}");
    }
    let (p, m, v) = state();
    let (p2, m2, v2) = state();
    let open = gpu.upload(&[1e-2, 2.0, 0.0], &[3]).expect("slot");
    let plain = gpu.upload(&[1e-2, 2.0], &[2]).expect("slot");
    gpu.adamw_step(&p, &m, &v, &g, &open, &cfg).expect("adamw");
    gpu.adamw_step(&p2, &m2, &v2, &g, &plain, &cfg)
        .expect("adamw");
    assert_eq!(
        [bits(&p), bits(&m), bits(&v)],
        [bits(&p2), bits(&m2), bits(&v2)]
    );
    let (fresh, _, _) = state();
    assert_ne!(bits(&p), bits(&fresh), "a zero gate updates");
}

/// fill, full/zeros, contiguous, copy_into (also aliased) and upload_into through views.
pub fn data_movement<D: Driver>(gpu: &CudaBackend<D>, shape: &[usize], view: View) {
    let x = input(gpu, shape, view, 20, -1.0, 1.0);
    let xc = input(&CPU, shape, view, 20, -1.0, 1.0);
    let ours = gpu.contiguous(&x).expect("contiguous");
    assert!(ours.is_contiguous());
    assert_close(
        "contiguous",
        gpu,
        &ours,
        &Backend::<f32>::contiguous(&CPU, &xc).expect("cpu"),
        0.0,
    );

    let z = gpu.zeros(shape).expect("zeros");
    assert_close(
        "zeros",
        gpu,
        &z,
        &Backend::<f32>::zeros(&CPU, shape).expect("cpu"),
        0.0,
    );
    let f = gpu.full(shape, -2.5).expect("full");
    assert_close(
        "full",
        gpu,
        &f,
        &Backend::<f32>::full(&CPU, shape, -2.5).expect("cpu"),
        0.0,
    );

    // Writes through a view into a larger destination.
    let dst = input(gpu, shape, view, 21, -1.0, 1.0);
    let dst_c = input(&CPU, shape, view, 21, -1.0, 1.0);
    gpu.fill(&dst, 3.0).expect("fill");
    Backend::<f32>::fill(&CPU, &dst_c, 3.0).expect("cpu");
    assert_close("fill", gpu, &dst, &dst_c, 0.0);
    gpu.copy_into(&ours, &dst).expect("copy_into");
    Backend::<f32>::copy_into(&CPU, &xc, &dst_c).expect("cpu");
    assert_close("copy_into", gpu, &dst, &dst_c, 0.0);
    let n: usize = shape.iter().product();
    let fresh: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    gpu.upload_into(&fresh, &dst).expect("upload_into");
    Backend::<f32>::upload_into(&CPU, &fresh, &dst_c).expect("cpu");
    assert_close("upload_into", gpu, &dst, &dst_c, 0.0);
    // Aliased copy: a tensor into its own reversed-axis view of the same shape (square).
    if shape.len() == 2 && shape[0] == shape[1] {
        let t = gpu.contiguous(&x).expect("c");
        let tc = Backend::<f32>::contiguous(&CPU, &xc).expect("c");
        gpu.copy_into(&t.transpose(0, 1).expect("t"), &t)
            .expect("aliased copy");
        Backend::<f32>::copy_into(&CPU, &tc.transpose(0, 1).expect("t"), &tc).expect("cpu");
        assert_close("aliased copy_into", gpu, &t, &tc, 0.0);
    }
}
