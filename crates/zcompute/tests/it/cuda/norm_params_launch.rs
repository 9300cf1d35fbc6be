//! How many launches `layer_norm_backward_into` takes, counted on the simulated device: one
//! (`zc_layer_norm_backward_params_f32`) for a sample's rows where the unfused sequence
//! (LayerNorm's backward kernel, then a column reduction per parameter) took three; the
//! composite past the row limit or into a strided buffer. And its bad arguments: the same
//! typed error on the CPU and the device, before anything is written. Results are checked by
//! `norm_params.rs`.

use super::norm_params::operands;
use zcompute::prelude::*;
use zcompute::{Backend, CpuBackend, CudaBackend, CudaTensor, LayerNormBackward, SimDriver};
use zdevice::sim::calls::LAUNCH_KERNEL;

const CPU: CpuBackend = CpuBackend;
const PARAMS_KERNEL: &str = "zc_layer_norm_backward_params_f32";

/// Kernel launches `f` queues, counted in the simulator's op log (`settle`, a download, runs
/// the stream first).
fn launches(gpu: &CudaBackend<SimDriver>, settle: &CudaTensor, f: impl FnOnce()) -> usize {
    let sim = gpu.device().driver();
    gpu.download(settle).expect("settle");
    sim.clear_op_log();
    f();
    gpu.download(settle).expect("settle");
    assert_eq!(sim.op_log_dropped(), 0, "the op log kept every call");
    sim.op_log()
        .iter()
        .filter(|r| r.call == LAUNCH_KERNEL)
        .count()
}

/// `(fused, unfused)` launch counts of one backward with the residual and weight, into dw and
/// db as adjacent views, or (`strided_db`) db every other element of a buffer.
fn counts(rows: usize, n: usize, strided_db: bool) -> (usize, usize) {
    let gpu = super::mock();
    let o = operands(&gpu, (rows, n), true, true);
    let [g, res, x, mean, rstd, w] = o.device();
    let flat = gpu.zeros(&[4 * n]).unwrap();
    let dw = flat.narrow(0, 0, n).unwrap();
    let db = if strided_db {
        // Every other element of the buffer's second half: stride 2.
        let layout = zcompute::Layout::new(&[n], &[2], n).unwrap();
        CudaTensor::from_parts(flat.storage().clone(), layout).unwrap()
    } else {
        flat.narrow(0, n, n).unwrap()
    };
    let fused = launches(&gpu, &flat, || {
        gpu.layer_norm_backward_into(
            &LayerNormBackward {
                g: &g,
                residual: Some(&res),
                x: &x,
                mean: &mean,
                rstd: &rstd,
                weight: Some(&w),
            },
            true,
            Some(&dw),
            Some(&db),
        )
        .expect("backward into")
        .expect("input");
    });
    // What zgrad ran before: the backward kernel writing g * xhat, then a column sum each.
    let unfused = launches(&gpu, &flat, || {
        let r = gpu
            .layer_norm_backward_add(
                &LayerNormBackward {
                    g: &g,
                    residual: Some(&res),
                    x: &x,
                    mean: &mean,
                    rstd: &rstd,
                    weight: Some(&w),
                },
                [true, true],
            )
            .expect("backward");
        gpu.sum_rows_into(r.g_xhat.as_ref().unwrap(), &dw)
            .expect("dw");
        gpu.sum_rows_into(&g, &db).expect("db");
    });
    (fused, unfused)
}

/// Past one launch's rows, chunks of 32 and one column reduction over their sums into the
/// adjacent dw and db: two launches, where the unfused sequence takes three (each column sum
/// one launch: a single pass over 33 rows, partials and their finish over 100 or 3072).
#[test]
fn a_batchs_layer_norm_backward_and_its_parameter_grads_are_two_launches() {
    for (rows, unfused_launches) in [(33, 3), (100, 3), (3072, 3)] {
        let (fused, unfused) = counts(rows, 256, false);
        assert_eq!((fused, unfused), (2, unfused_launches), "{rows} rows");
    }
    // Wider than the one-warp-a-row kernel takes: the block-row chunks, also two launches.
    let (fused, _) = counts(3072, 600, false);
    assert_eq!(fused, 2, "3072 rows of 600");
}

#[test]
fn a_samples_layer_norm_backward_and_its_parameter_grads_are_one_launch() {
    for n in [5, 193, 256] {
        let (fused, unfused) = counts(12, n, false);
        assert_eq!((fused, unfused), (1, 3), "12 rows, width {n}");
    }
    let (fused, _) = counts(32, 256, false);
    assert_eq!(fused, 1, "32 rows, the limit");
    // Into a strided buffer, the composite: what the unfused sequence runs.
    let (fused, unfused) = counts(12, 64, true);
    assert_eq!(fused, unfused, "strided db");
    assert!(fused > 1);
}

/// The one-launch kernel is the one that ran (its name in the launch log of a recording twin).
#[test]
fn the_one_launch_is_the_params_kernel() {
    use std::sync::{Arc, Mutex};
    use zdevice::{Device, DeviceConfig, SimConfig};
    let sim = SimDriver::new(SimConfig::with_capacity(512 << 20));
    zcompute::cuda::twins::register(&sim);
    let seen: Arc<Mutex<Vec<(u32, u32)>>> = Arc::default();
    let log = Arc::clone(&seen);
    sim.register_kernel(PARAMS_KERNEL, move |config, _, _| {
        log.lock().unwrap().push((config.grid.0, config.block.0));
        Ok(())
    });
    let config = DeviceConfig {
        blas_workspace_bytes: 0,
        ..DeviceConfig::default()
    };
    let gpu = super::backend_on(Device::open(sim, config).expect("device"));
    for (n, blocks) in [(5, 1), (256, 2), (1000, 8)] {
        let o = operands(&gpu, (12, n), true, true);
        let [g, _, x, mean, rstd, w] = o.device();
        let flat = gpu.zeros(&[2 * n]).unwrap();
        let (dw, db) = (flat.narrow(0, 0, n).unwrap(), flat.narrow(0, n, n).unwrap());
        gpu.layer_norm_backward_into(
            &LayerNormBackward {
                g: &g,
                residual: None,
                x: &x,
                mean: &mean,
                rstd: &rstd,
                weight: Some(&w),
            },
            true,
            Some(&dw),
            Some(&db),
        )
        .expect("backward into");
        gpu.download(&flat).expect("settle");
        let ran = std::mem::take(&mut *seen.lock().unwrap());
        assert_eq!(
            ran,
            [(blocks, 128)],
            "width {n}: one launch, a block per 128 columns"
        );
    }
}

/// The weight's and bias's gradients may be adjacent views of one flat buffer on both
/// backends. Bad arguments (wrong shapes, a broadcast or overlapping destination, a buffer in
/// an operand's memory) are rows of the validation table (`validation_table.rs`).
#[test]
fn adjacent_gradient_views_of_one_buffer_are_accepted_on_both_backends() {
    let gpu = super::mock();
    let dev = |shape: &[usize]| gpu.zeros(shape).unwrap();
    let host = |shape: &[usize]| Backend::<f32>::zeros(&CPU, shape).unwrap();
    let (rows, n) = (3, 8);
    let (g, x, m) = (dev(&[rows, n]), dev(&[rows, n]), dev(&[rows, 1]));
    let (gc, xc, mc) = (host(&[rows, n]), host(&[rows, n]), host(&[rows, 1]));
    let (flat, hflat) = (dev(&[3 * n]), host(&[3 * n]));
    let r = gpu.layer_norm_backward_into(
        &LayerNormBackward {
            g: &g,
            residual: None,
            x: &x,
            mean: &m,
            rstd: &m,
            weight: None,
        },
        true,
        Some(&flat.narrow(0, 0, n).unwrap()),
        Some(&flat.narrow(0, n, n).unwrap()),
    );
    let rc = CPU.layer_norm_backward_into(
        &LayerNormBackward {
            g: &gc,
            residual: None,
            x: &xc,
            mean: &mc,
            rstd: &mc,
            weight: None,
        },
        true,
        Some(&hflat.narrow(0, 0, n).unwrap()),
        Some(&hflat.narrow(0, n, n).unwrap()),
    );
    assert_eq!(r.map(|_| ()), Ok(()));
    assert_eq!(rc.map(|_| ()), Ok(()));
}
