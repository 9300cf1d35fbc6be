//! Bodies of the accumulating ops (`matmul_into`, `sum_rows_into`), generic over the driver:
//! the CUDA backend's in-place paths (a gemm with `beta = 1`, a column reduction that adds
//! into its output) against the CPU backend's provided bodies (the op, then `add_into`).

use super::bodies::{TOL, View, assert_close, input};
use zcompute::{Backend, CpuBackend, CudaBackend, MatmulOpts};
use zdevice::Driver;

const CPU: CpuBackend = CpuBackend;

/// `dst += op(a) · op(b)` twice into a destination seen through `view` (dense: the one-gemm
/// path; a view: the product and `add_into`), the same as the CPU; the second call shows the
/// first was added to, not overwritten. Memory beside a narrowed destination is left alone.
pub fn matmul_into<D: Driver>(
    gpu: &CudaBackend<D>,
    a: &[usize],
    b: &[usize],
    opts: MatmulOpts,
    view: View,
) {
    let out = {
        let (ta, tc) = (
            input(&CPU, a, View::Dense, 51, -1.0, 1.0),
            input(&CPU, b, View::Dense, 52, -1.0, 1.0),
        );
        Backend::<f32>::matmul(&CPU, &ta, &tc, opts)
            .expect("cpu matmul")
            .shape()
            .to_vec()
    };
    let (ga, gb) = (
        input(gpu, a, View::Dense, 51, -1.0, 1.0),
        input(gpu, b, View::Dense, 52, -1.0, 1.0),
    );
    let (ca, cb) = (
        input(&CPU, a, View::Dense, 51, -1.0, 1.0),
        input(&CPU, b, View::Dense, 52, -1.0, 1.0),
    );
    let dst = input(gpu, &out, view, 53, -1.0, 1.0);
    let dst_c = input(&CPU, &out, view, 53, -1.0, 1.0);
    for _ in 0..2 {
        gpu.matmul_into(&ga, &gb, opts, &dst).expect("matmul_into");
        Backend::<f32>::matmul_into(&CPU, &ca, &cb, opts, &dst_c).expect("cpu matmul_into");
    }
    let what = format!("matmul_into {a:?} x {b:?} {opts:?} into {out:?} {view:?}");
    assert_close(&what, gpu, &dst, &dst_c, TOL);
    // Into the first half of a larger buffer: the second half keeps its values.
    let numel: usize = out.iter().product();
    let stored = gpu.upload(&vec![3.0f32; 2 * numel], &[2 * numel]);
    let half = stored.expect("stored").narrow(0, 0, numel).expect("narrow");
    let half = half.reshape(&out).expect("reshape");
    gpu.matmul_into(&ga, &gb, opts, &half)
        .expect("matmul_into a view");
    let got = gpu
        .download(&half.reshape(&[numel]).expect("flat"))
        .expect("download");
    let want = Backend::<f32>::matmul(&CPU, &ca, &cb, opts)
        .expect("cpu matmul")
        .to_vec();
    for (g, w) in got.iter().zip(&want) {
        assert!(
            (g - (w + 3.0)).abs() <= 1e-4 * (1.0 + w.abs()),
            "{what}: {g} vs {w} + 3"
        );
    }
}

/// A destination sharing memory with an operand, or shaped otherwise than the product, is
/// refused before anything is written.
pub fn matmul_into_refuses<D: Driver>(gpu: &CudaBackend<D>) {
    let a = gpu.upload(&[1.0f32; 6], &[2, 3]).expect("a");
    let b = gpu.upload(&[1.0f32; 12], &[3, 4]).expect("b");
    let wrong = gpu.upload(&[0.0f32; 6], &[2, 3]).expect("wrong");
    assert!(
        gpu.matmul_into(&a, &b, MatmulOpts::default(), &wrong)
            .is_err()
    );
    let square = gpu.upload(&[1.0f32; 4], &[2, 2]).expect("square");
    assert!(
        gpu.matmul_into(&square, &square, MatmulOpts::default(), &square)
            .is_err()
    );
    assert_eq!(gpu.download(&square).expect("download"), vec![1.0; 4]);
}

/// `dst[n] += sum over rows of x [..., n]` twice, `x` seen through `view`, the same as the CPU;
/// the same bits on a second run (no atomics).
pub fn sum_rows_into<D: Driver>(gpu: &CudaBackend<D>, shape: &[usize], view: View) {
    let n = *shape.last().expect("rank >= 1");
    let x = input(gpu, shape, view, 61, -1.0, 1.0);
    let xc = input(&CPU, shape, view, 61, -1.0, 1.0);
    let run = || {
        let dst = input(gpu, &[n], View::Dense, 62, -1.0, 1.0);
        let dst_c = input(&CPU, &[n], View::Dense, 62, -1.0, 1.0);
        for _ in 0..2 {
            gpu.sum_rows_into(&x, &dst).expect("sum_rows_into");
            Backend::<f32>::sum_rows_into(&CPU, &xc, &dst_c).expect("cpu sum_rows_into");
        }
        assert_close(
            &format!("sum_rows_into {shape:?} {view:?}"),
            gpu,
            &dst,
            &dst_c,
            TOL,
        );
        gpu.download(&dst).expect("download")
    };
    let bits = |v: Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(
        bits(run()),
        bits(run()),
        "sum_rows_into {shape:?}: two runs differ"
    );
    let wrong = gpu.upload(&vec![0.0f32; n + 1], &[n + 1]).expect("wrong");
    assert!(
        gpu.sum_rows_into(&x, &wrong).is_err(),
        "a [n + 1] destination"
    );
}
