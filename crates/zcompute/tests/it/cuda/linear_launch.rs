//! Which path each product takes, and over how many CTAs, recorded on the simulated device:
//! one sample's Linear products (12 rows, issue 12's per-sample schedule) run as one
//! small-row kernel each, spread over 32 to 256 blocks, with no cuBLAS call and no separate
//! bias epilogue; more rows than the limit, a batch of products, or a weight-gradient buffer
//! whose last axis is not dense keep the cuBLAS path. The H100 profile found cuBLAS at 5-10
//! us on a handful of CTAs for these; the simulator cannot time them, so these tests pin the
//! parallelism instead. Results are checked by `linear.rs`.

use std::sync::{Arc, Mutex};
use zcompute::cuda::LINEAR_ROW_LIMIT;
use zcompute::prelude::*;
use zcompute::{Activation, Backend, CudaBackend, CudaTensor, MatmulOpts};
use zdevice::sim::calls::GEMM_STRIDED_BATCHED;
use zdevice::{Device, DeviceConfig, LaunchConfig, SimConfig, SimDriver};

type Log = Arc<Mutex<Vec<(&'static str, LaunchConfig)>>>;

const KMAJOR: &str = "zc_linear_rows_kmajor_f32";
const NMAJOR: &str = "zc_linear_rows_nmajor_f32";
const GRADS: &str = "zc_linear_param_grads_f32";
const BIAS_ACT: &str = "zc_bias_act_f32";
const BACKWARD: &str = "zc_linear_backward_f32";
const TANH_BACKWARD: &str = "zc_tanh_backward_f32";
const BINARY: &str = "zc_binary_f32";
const BIAS_ACT_ADD: &str = "zc_bias_act_add_f32";
const RECORDED: [&str; 8] = [
    KMAJOR,
    NMAJOR,
    GRADS,
    BIAS_ACT,
    BACKWARD,
    TANH_BACKWARD,
    BINARY,
    BIAS_ACT_ADD,
];

/// A backend whose recorded kernels log their launch configuration and write nothing.
fn recording_backend() -> (CudaBackend<SimDriver>, Log) {
    let sim = SimDriver::new(SimConfig::with_capacity(512 << 20));
    zcompute::cuda::twins::register(&sim);
    let log: Log = Arc::default();
    for name in RECORDED {
        let log = Arc::clone(&log);
        sim.register_kernel(name, move |config, _, _| {
            log.lock().unwrap().push((name, *config));
            Ok(())
        });
    }
    let config = DeviceConfig {
        blas_workspace_bytes: 0,
        ..DeviceConfig::default()
    };
    let dev = Device::open(sim, config).expect("the simulated device opens");
    (super::backend_on(dev), log)
}

/// What ran since the last call: (kernel, blocks) of each recorded launch, and the number of
/// cuBLAS gemms. `settle` (a download) makes the simulator run the queued work first.
fn ran(
    gpu: &CudaBackend<SimDriver>,
    settle: &CudaTensor,
    log: &Log,
    gemms: &mut u64,
) -> (Vec<(&'static str, u64)>, u64) {
    gpu.download(settle).expect("the stream runs");
    let launches = log
        .lock()
        .unwrap()
        .drain(..)
        .map(|(n, c)| {
            (
                n,
                u64::from(c.grid.0) * u64::from(c.grid.1) * u64::from(c.grid.2),
            )
        })
        .collect();
    let now = gpu.device().driver().call_count(GEMM_STRIDED_BATCHED);
    let new = now - *gemms;
    *gemms = now;
    (launches, new)
}

#[test]
fn one_samples_products_run_one_small_row_kernel_each_over_many_blocks() {
    let (gpu, log) = recording_backend();
    let mut gemms = 0;
    let t = |shape: &[usize]| gpu.zeros(shape).unwrap();
    // Forward: x [12, in] · W[out, in]ᵀ + b, k-contiguous: two warps per column, 8 columns a
    // block.
    for (k, n, blocks) in [
        (193, 256, 32),
        (256, 768, 96),
        (256, 256, 32),
        (256, 1024, 128),
        (1024, 256, 32),
    ] {
        let y = gpu
            .linear(&t(&[12, k]), &t(&[n, k]), &t(&[n]), Activation::Tanh)
            .unwrap();
        let got = ran(&gpu, &y, &log, &mut gemms);
        assert_eq!(got, (vec![(KMAJOR, blocks)], 0), "linear k {k} n {n}");
    }
    // dX = g [12, out] · W [out, in], n-contiguous: 8 columns x 64 k slices a block.
    let plain = MatmulOpts {
        trans_a: false,
        trans_b: false,
    };
    for (k, n, blocks) in [
        (1024, 256, 32),
        (256, 1024, 128),
        (256, 256, 32),
        (768, 256, 32),
    ] {
        let gx = gpu.matmul(&t(&[12, k]), &t(&[k, n]), plain).unwrap();
        let got = ran(&gpu, &gx, &log, &mut gemms);
        assert_eq!(got, (vec![(NMAJOR, blocks)], 0), "dX k {k} n {n}");
    }
    // dW += gᵀ x, db += Σ g into views of one flat gradient buffer: 64 x 4 blocks, a float4
    // of dw per thread where aligned (193 inputs: a float).
    let flat = t(&[1 << 20]);
    for (out, inp, blocks) in [
        (256, 1024, 256),
        (1024, 256, 256),
        (256, 256, 64),
        (768, 256, 192),
        (256, 193, 256),
    ] {
        let dw = flat
            .narrow(0, 0, out * inp)
            .unwrap()
            .reshape(&[out, inp])
            .unwrap();
        let db = flat.narrow(0, out * inp, out).unwrap();
        gpu.linear_param_grads_into(&t(&[12, out]), &t(&[12, inp]), &dw, Some(&db))
            .unwrap();
        let got = ran(&gpu, &flat, &log, &mut gemms);
        assert_eq!(got, (vec![(GRADS, blocks)], 0), "dW out {out} in {inp}");
    }
}

#[test]
fn more_rows_batches_and_strided_gradient_buffers_keep_the_cublas_path() {
    let (gpu, log) = recording_backend();
    let mut gemms = 0;
    let t = |shape: &[usize]| gpu.zeros(shape).unwrap();
    let blocks_of_bias_act = |launches: &[(&str, u64)]| {
        launches.iter().all(|(n, _)| *n == BIAS_ACT) && launches.len() == 1
    };
    for rows in [LINEAR_ROW_LIMIT + 1, 3072] {
        let y = gpu
            .linear(
                &t(&[rows, 256]),
                &t(&[768, 256]),
                &t(&[768]),
                Activation::Identity,
            )
            .unwrap();
        let (launches, g) = ran(&gpu, &y, &log, &mut gemms);
        assert!(
            blocks_of_bias_act(&launches) && g == 1,
            "rows {rows}: {launches:?} {g}"
        );
    }
    // At the limit it is still one kernel.
    let y = gpu
        .linear(
            &t(&[LINEAR_ROW_LIMIT, 256]),
            &t(&[768, 256]),
            &t(&[768]),
            Activation::Identity,
        )
        .unwrap();
    assert_eq!(ran(&gpu, &y, &log, &mut gemms), (vec![(KMAJOR, 96)], 0));
    // A batch of two products of 12 rows: one batched gemm.
    let opts = MatmulOpts {
        trans_a: false,
        trans_b: true,
    };
    let y = gpu
        .matmul(&t(&[2, 12, 256]), &t(&[2, 64, 256]), opts)
        .unwrap();
    assert_eq!(ran(&gpu, &y, &log, &mut gemms), (vec![], 1));
    // dw transposed (last axis not dense): matmul_into through cuBLAS (128 outputs > the row
    // limit), then the bias column sums.
    let dw = t(&[256, 128]).transpose(0, 1).unwrap();
    let db = t(&[128]);
    gpu.linear_param_grads_into(&t(&[12, 128]), &t(&[12, 256]), &dw, Some(&db))
        .unwrap();
    let (launches, g) = ran(&gpu, &db, &log, &mut gemms);
    assert!(
        launches.iter().all(|(n, _)| *n != GRADS) && g == 1,
        "{launches:?} {g}"
    );
    // More rows than the limit: cuBLAS, then the column sums.
    let (dw, db) = (t(&[128, 256]), t(&[128]));
    gpu.linear_param_grads_into(&t(&[3072, 128]), &t(&[3072, 256]), &dw, Some(&db))
        .unwrap();
    let (launches, g) = ran(&gpu, &db, &log, &mut gemms);
    assert!(launches.is_empty() && g == 1, "{launches:?} {g}");
}

/// A Linear layer's backward (tanh's backward, dX, dW and db into views of the flat gradient
/// buffer) is one launch for one sample's rows, where the composite queues three: the
/// product's blocks (8 columns each) and the gradient blocks (64 x 8 threads, a float4 of dw
/// each where aligned) side by side. Past the row limit it is the composite: tanh's backward
/// and two cuBLAS gemms (then the bias's column sums, not recorded here).
#[test]
fn a_linear_layers_backward_is_one_launch_over_its_product_and_gradient_blocks() {
    let (gpu, log) = recording_backend();
    let mut gemms = 0;
    let t = |shape: &[usize]| gpu.zeros(shape).unwrap();
    let flat = t(&[1 << 20]);
    // (act, in, out, dX wanted, blocks): f1, f2, qkv, the embedding (193 inputs: a float of
    // dw per thread, no dX).
    for (act, inp, out, dx, blocks) in [
        (Activation::Tanh, 256, 1024, true, 32 + 128),
        (Activation::Identity, 1024, 256, true, 128 + 4 * 32),
        (Activation::Identity, 256, 768, true, 32 + 96),
        (Activation::Identity, 193, 256, false, 4 * 32),
    ] {
        let dw = flat
            .narrow(0, 0, out * inp)
            .unwrap()
            .reshape(&[out, inp])
            .unwrap();
        let db = flat.narrow(0, out * inp, out).unwrap();
        let (w, y) = (t(&[out, inp]), t(&[12, out]));
        let tanh_y = (act == Activation::Tanh).then_some(&y);
        let gx = gpu
            .linear_backward_into(
                &t(&[12, out]),
                &t(&[12, inp]),
                dx.then_some(&w),
                (act, tanh_y),
                (&dw, Some(&db)),
            )
            .unwrap();
        assert_eq!(gx.is_some(), dx);
        let got = ran(&gpu, &flat, &log, &mut gemms);
        assert_eq!(
            got,
            (vec![(BACKWARD, blocks)], 0),
            "{act:?} in {inp} out {out}"
        );
    }
    let rows = LINEAR_ROW_LIMIT + 1;
    let (dw, db, w, y) = (t(&[64, 32]), t(&[64]), t(&[64, 32]), t(&[rows, 64]));
    gpu.linear_backward_into(
        &t(&[rows, 64]),
        &t(&[rows, 32]),
        Some(&w),
        (Activation::Tanh, Some(&y)),
        (&dw, Some(&db)),
    )
    .unwrap();
    let (launches, g) = ran(&gpu, &db, &log, &mut gemms);
    assert_eq!((launches.len(), launches[0].0, g), (1, TANH_BACKWARD, 2));
}

/// The feed-forward block's second product with its residual, `h + (u · W2ᵀ + b2)`: one
/// small-row kernel with the add in its epilogue for one sample's rows (the composite queues
/// the product and a binary add); past the row limit, cuBLAS and the bias epilogue with the
/// add (one launch where the bias epilogue and a binary add were two).
#[test]
fn a_products_residual_add_is_its_epilogue() {
    let (gpu, log) = recording_backend();
    let mut gemms = 0;
    let t = |shape: &[usize]| gpu.zeros(shape).unwrap();
    let (w, b) = (t(&[256, 1024]), t(&[256]));
    let act = Activation::Identity;
    let y = gpu
        .linear_add(&t(&[12, 1024]), &w, &b, act, &t(&[12, 256]))
        .unwrap();
    assert_eq!(ran(&gpu, &y, &log, &mut gemms), (vec![(KMAJOR, 32)], 0));
    let rows = LINEAR_ROW_LIMIT + 1;
    let y = gpu
        .linear_add(&t(&[rows, 1024]), &w, &b, act, &t(&[rows, 256]))
        .unwrap();
    let (launches, g) = ran(&gpu, &y, &log, &mut gemms);
    let names: Vec<_> = launches.iter().map(|(n, _)| *n).collect();
    assert_eq!((names, g), (vec![BIAS_ACT_ADD], 1));
}
