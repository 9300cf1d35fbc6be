//! The small-row products (`kernels/linear.cu`) on a CUDA backend against the CPU backend in
//! f64, poison on: `linear` (identity and tanh) and `linear_add` (a residual added in the
//! epilogue; a strided residual takes the composite), `linear_param_grads_into` (db given or not,
//! dw dense, a strided-row view, or a transposed view that takes the fallback) and plain
//! `matmul`/`matmul_into` with few rows in every operand order, at rows 1, 5, 12, the limit
//! and the limit + 1 (the cuBLAS fallback), odd widths, a transposed `x` view. Per tensor
//! ||ours - f64|| / ||f64|| within 1e-5; two runs bitwise equal; a captured step replayed
//! equals the same ops run eagerly. The `mock` suite runs on the simulated device, the `gpu`
//! suite (feature `gpu`) on CUDA device 0. Which path ran is pinned by `linear_launch.rs`.

use super::fused::{close, pair};
use zcompute::cuda::LINEAR_ROW_LIMIT;
use zcompute::prelude::*;
use zcompute::{Activation, Backend, Capture, CpuBackend, CudaBackend, CudaTensor, MatmulOpts};
use zdevice::Driver;

const CPU: CpuBackend = CpuBackend;

fn bits<D: Driver>(gpu: &CudaBackend<D>, t: &CudaTensor) -> Vec<u32> {
    let v = gpu.download(t).expect("download");
    v.into_iter().map(f32::to_bits).collect()
}

/// Rows of every parity case: 1, 5, 12, the limit, and one past it (the fallback).
pub const ROWS: [usize; 5] = [1, 5, 12, LINEAR_ROW_LIMIT, LINEAR_ROW_LIMIT + 1];

pub fn linear<D: Driver>(
    gpu: &CudaBackend<D>,
    rows: usize,
    (ins, outs): (usize, usize),
    act: Activation,
    x_view: bool,
) {
    let what = format!("linear rows {rows} in {ins} out {outs} {act:?} x view {x_view}");
    let (x, xc) = pair(gpu, &[rows, ins], 1, (-2.0, 2.0), x_view);
    let (w, wc) = pair(gpu, &[outs, ins], 2, (-0.5, 0.5), false);
    let (b, bc) = pair(gpu, &[outs], 3, (-1.0, 1.0), false);
    let ours = gpu.linear(&x, &w, &b, act).expect("linear");
    let want = CPU.linear(&xc, &wc, &bc, act).expect("cpu");
    close(&what, gpu, &ours, &want);
    let again = gpu.linear(&x, &w, &b, act).expect("again");
    assert_eq!(bits(gpu, &ours), bits(gpu, &again), "{what}: rerun");
}

/// `linear_add`: the residual dense, or a transposed view (the composite: linear, then add);
/// the fused kernel equals the composite's two launches bitwise where `exact`.
pub fn linear_add<D: Driver>(
    gpu: &CudaBackend<D>,
    rows: usize,
    (ins, outs): (usize, usize),
    act: Activation,
    residual_view: bool,
    exact: bool,
) {
    let what = format!("linear_add rows {rows} in {ins} out {outs} {act:?} view {residual_view}");
    let (x, xc) = pair(gpu, &[rows, ins], 1, (-2.0, 2.0), false);
    let (w, wc) = pair(gpu, &[outs, ins], 2, (-0.5, 0.5), false);
    let (b, bc) = pair(gpu, &[outs], 3, (-1.0, 1.0), false);
    let (r, rc) = pair(gpu, &[rows, outs], 14, (-3.0, 3.0), residual_view);
    let ours = gpu.linear_add(&x, &w, &b, act, &r).expect("linear_add");
    let want = CPU.linear_add(&xc, &wc, &bc, act, &rc).expect("cpu");
    close(&what, gpu, &ours, &want);
    let again = gpu.linear_add(&x, &w, &b, act, &r).expect("again");
    assert_eq!(bits(gpu, &ours), bits(gpu, &again), "{what}: rerun");
    let composite = gpu.add(&gpu.linear(&x, &w, &b, act).unwrap(), &r).unwrap();
    if exact {
        assert_eq!(bits(gpu, &ours), bits(gpu, &composite), "{what}: composite");
    } else {
        close(&format!("{what} composite"), gpu, &composite, &want);
    }
}

/// How the weight gradient buffer is laid out.
#[derive(Clone, Copy, Debug)]
pub enum DwLayout {
    Dense,
    /// Rows further apart than the inputs (a view of a wider matrix): the kernel's `ldw`.
    Padded,
    /// A transposed view: last axis not dense, so the composite runs.
    Transposed,
}

pub fn param_grads<D: Driver>(
    gpu: &CudaBackend<D>,
    rows: usize,
    (ins, outs): (usize, usize),
    with_db: bool,
    dw_layout: DwLayout,
) {
    let what = format!("param grads rows {rows} in {ins} out {outs} db {with_db} dw {dw_layout:?}");
    let (g, gc) = pair(gpu, &[rows, outs], 4, (-1.0, 1.0), false);
    let (x, xc) = pair(gpu, &[rows, ins], 5, (-2.0, 2.0), false);
    let (dw0, dwc) = pair(gpu, &[outs, ins], 6, (-0.5, 0.5), false);
    let (db0, dbc) = pair(gpu, &[outs], 7, (-0.5, 0.5), false);
    let init = gpu.download(&dw0).expect("dw0");
    // A fresh buffer holding the initial dw in the layout under test.
    let fresh_dw = || match dw_layout {
        DwLayout::Dense => gpu.upload(&init, &[outs, ins]).expect("dw"),
        DwLayout::Padded => {
            let wide = gpu.zeros(&[outs, ins + 3]).expect("wide");
            let view = wide.narrow(1, 1, ins).expect("narrow");
            gpu.copy_into(&dw0, &view).expect("fill");
            view
        }
        DwLayout::Transposed => {
            let stored = gpu.zeros(&[ins, outs]).expect("stored");
            let view = stored.transpose(0, 1).expect("view");
            gpu.copy_into(&dw0, &view).expect("fill");
            view
        }
    };
    let run = || {
        let (dw, db) = (fresh_dw(), gpu.contiguous(&db0).expect("db"));
        gpu.linear_param_grads_into(&g, &x, &dw, with_db.then_some(&db))
            .expect("param grads");
        (dw, db)
    };
    let (dw, db) = run();
    CPU.linear_param_grads_into(&gc, &xc, &dwc, with_db.then_some(&dbc))
        .expect("cpu");
    close(&format!("{what} dw"), gpu, &dw, &dwc);
    close(&format!("{what} db"), gpu, &db, &dbc);
    let (dw2, db2) = run();
    assert_eq!(bits(gpu, &dw), bits(gpu, &dw2), "{what}: dw rerun");
    assert_eq!(bits(gpu, &db), bits(gpu, &db2), "{what}: db rerun");
}

/// `op(a)[m,k] · op(b)[k,n]` with each operand stored as the flags say, and transposed views
/// of it (`b_view`: the other order of `op(b)`); then `matmul_into` a dense destination.
pub fn small_matmul<D: Driver>(
    gpu: &CudaBackend<D>,
    (m, k, n): (usize, usize, usize),
    (trans_a, trans_b): (bool, bool),
    b_view: bool,
) {
    let what = format!("matmul {m}x{k}x{n} trans ({trans_a}, {trans_b}) b view {b_view}");
    let a_shape = if trans_a { [k, m] } else { [m, k] };
    let b_shape = if trans_b { [n, k] } else { [k, n] };
    let (a, ac) = pair(gpu, &a_shape, 8, (-1.0, 1.0), trans_a);
    let (b, bc) = pair(gpu, &b_shape, 9, (-1.0, 1.0), b_view);
    let opts = MatmulOpts { trans_a, trans_b };
    let ours = gpu.matmul(&a, &b, opts).expect("matmul");
    let want = CPU.matmul(&ac, &bc, opts).expect("cpu");
    close(&what, gpu, &ours, &want);
    let again = gpu.matmul(&a, &b, opts).expect("again");
    assert_eq!(bits(gpu, &ours), bits(gpu, &again), "{what}: rerun");

    let (dst, dstc) = pair(gpu, &[m, n], 10, (-1.0, 1.0), false);
    gpu.matmul_into(&a, &b, opts, &dst).expect("matmul_into");
    CPU.matmul_into(&ac, &bc, opts, &dstc).expect("cpu into");
    close(&format!("{what} into"), gpu, &dst, &dstc);
}

/// One sample's Linear forward (tanh), a dX product and the parameter gradients, written into
/// `[y, gx, dw, db]`.
fn step<D: Driver>(
    be: &CudaBackend<D>,
    [x, w, b]: [&CudaTensor; 3],
    [y, gx, dw, db]: [&CudaTensor; 4],
) -> zcompute::Result<()> {
    let h = be.linear(x, w, b, Activation::Tanh)?;
    be.copy_into(&h, y)?;
    let plain = MatmulOpts {
        trans_a: false,
        trans_b: false,
    };
    be.copy_into(&be.matmul(&h, w, plain)?, gx)?;
    be.linear_param_grads_into(&h, x, dw, Some(db))
}

/// [`step`] captured, then replayed with fresh inputs: each replay equals the same ops run
/// eagerly, bitwise.
pub fn replay_matches_eager<D: Driver>(gpu: &CudaBackend<D>) {
    let (rows, ins, outs) = (12, 193, 256);
    let (x, _) = pair(gpu, &[rows, ins], 11, (-1.0, 1.0), false);
    let (w, _) = pair(gpu, &[outs, ins], 12, (-0.5, 0.5), false);
    let (b, _) = pair(gpu, &[outs], 13, (-0.5, 0.5), false);
    let bufs =
        || [&[rows, outs][..], &[rows, ins], &[outs, ins], &[outs]].map(|s| gpu.zeros(s).unwrap());
    let captured = bufs();
    let body = {
        let (be, x, w, b, c) = (
            gpu.clone(),
            x.clone(),
            w.clone(),
            b.clone(),
            captured.clone(),
        );
        Box::new(move || step(&be, [&x, &w, &b], [&c[0], &c[1], &c[2], &c[3]]))
    };
    let mut graph = gpu.capture(body).expect("capture");
    for r in 0..3u64 {
        let (fresh, _) = pair(gpu, &[rows, ins], 20 + r, (-1.0, 1.0), false);
        let fresh = gpu.download(&fresh).unwrap();
        gpu.upload_into(&fresh, &x).expect("refill");
        for t in &captured {
            gpu.fill(t, 0.0).expect("reset");
        }
        gpu.replay(&mut graph).expect("replay");
        let eager = bufs();
        step(
            gpu,
            [&x, &w, &b],
            [&eager[0], &eager[1], &eager[2], &eager[3]],
        )
        .expect("eager");
        for (i, (c, e)) in captured.iter().zip(&eager).enumerate() {
            assert_eq!(bits(gpu, c), bits(gpu, e), "replay {r} output {i}");
        }
    }
}

/// `$exact`: fused kernels must equal their composites bitwise (the simulated twins run the
/// same f32 operations in the same order).
macro_rules! linear_suite {
    ($backend:path, $exact:expr) => {
        use super::super::linear::{DwLayout, ROWS};
        use rstest::rstest;
        use zcompute::Activation;

        /// (in, out) pairs: odd, one-wide, and the model's shapes.
        const WIDTHS: [(usize, usize); 6] = [
            (1, 1),
            (3, 7),
            (193, 256),
            (256, 1000),
            (1024, 256),
            (1024, 1),
        ];

        #[rstest]
        fn linear(
            #[values(0, 1, 2, 3, 4)] rows: usize,
            #[values(0, 1, 2, 3, 4, 5)] width: usize,
            #[values(Activation::Identity, Activation::Tanh)] act: Activation,
            #[values(false, true)] x_view: bool,
        ) {
            super::super::linear::linear(&$backend(), ROWS[rows], WIDTHS[width], act, x_view);
        }

        #[rstest]
        fn linear_add(
            #[values(0, 1, 2, 3, 4)] rows: usize,
            #[values(0, 1, 2, 4)] width: usize,
            #[values(Activation::Identity, Activation::Tanh)] act: Activation,
            #[values(false, true)] residual_view: bool,
        ) {
            super::super::linear::linear_add(
                &$backend(),
                ROWS[rows],
                WIDTHS[width],
                act,
                residual_view,
                $exact,
            );
        }

        #[rstest]
        fn param_grads(
            #[values(0, 1, 2, 3, 4)] rows: usize,
            #[values(0, 1, 2, 3, 4, 5)] width: usize,
            #[values(false, true)] with_db: bool,
            #[values(DwLayout::Dense, DwLayout::Padded, DwLayout::Transposed)] dw: DwLayout,
        ) {
            super::super::linear::param_grads(&$backend(), ROWS[rows], WIDTHS[width], with_db, dw);
        }

        #[rstest]
        fn small_matmul(
            #[values((1, 5, 3), (12, 1024, 256), (12, 256, 1024), (32, 193, 7), (33, 64, 9))] mkn: (
                usize,
                usize,
                usize,
            ),
            #[values((false, false), (false, true), (true, false), (true, true))] trans: (
                bool,
                bool,
            ),
            #[values(false, true)] b_view: bool,
        ) {
            super::super::linear::small_matmul(&$backend(), mkn, trans, b_view);
        }

        #[test]
        fn replay_matches_eager() {
            super::super::linear::replay_matches_eager(&$backend());
        }
    };
}

mod mock_suite {
    linear_suite!(super::super::mock, true);
}

#[cfg(feature = "gpu")]
mod gpu {
    linear_suite!(super::super::gpu, false);
}

/// The weight's and bias's gradients may be adjacent views of one flat buffer (the flat
/// gradient buffer) on both backends. Bad arguments, overlapping views included, are rows of
/// the validation table (`validation_table.rs`).
#[test]
fn param_grads_into_adjacent_views_of_one_buffer() {
    let gpu = super::mock();
    let dev = |shape: &[usize]| gpu.zeros(shape).unwrap();
    let host = |shape: &[usize]| Backend::<f32>::zeros(&CPU, shape).unwrap();
    let (flat, hflat) = (dev(&[40]), host(&[40]));
    let dw = flat.narrow(0, 0, 28).unwrap().reshape(&[7, 4]).unwrap();
    let db = flat.narrow(0, 28, 7).unwrap();
    let hdw = hflat.narrow(0, 0, 28).unwrap().reshape(&[7, 4]).unwrap();
    let hdb = hflat.narrow(0, 28, 7).unwrap();
    let d = gpu.linear_param_grads_into(&dev(&[3, 7]), &dev(&[3, 4]), &dw, Some(&db));
    let c = CPU.linear_param_grads_into(&host(&[3, 7]), &host(&[3, 4]), &hdw, Some(&hdb));
    assert_eq!(d, Ok(()));
    assert_eq!(c, Ok(()));
}
