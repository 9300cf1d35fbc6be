//! The one-launch column reductions and norm (a "last block" per column tile, or per grid,
//! finishes the partials; its ticket is left at 0 for the next launch): sums, means, maxima
//! over a batch's rows and into a gradient buffer, and the global norm, against the CPU backend
//! in f64, poison on (an output the last block never writes stays NaN). Each is run many times
//! in a row and in a replayed graph: a ticket left set would pick the wrong last block (or
//! none) on the next launch, so every run must give the first run's bits. The `mock` suite runs
//! on the simulated device, the `gpu` suite (feature `gpu`) on CUDA device 0.

use zcompute::{Backend, Capture, CpuBackend, CudaBackend, CudaTensor, ReduceOp};
use zdevice::Driver;

const CPU: CpuBackend = CpuBackend;

/// `[rows, n]` shapes that take the one-launch path (several chunks, at most 256), with
/// widths that are and are not multiples of the 32-column tile.
pub const SHAPES: [(usize, usize); 5] = [
    (3072, 256),
    (3072, 1024),
    (3072, 193),
    (100, 64),
    (4096, 37),
];

fn values(rows: usize, n: usize, seed: usize) -> Vec<f32> {
    (0..rows * n)
        .map(|i| (((i + seed) * 7919 % 1009) as f32 - 504.0) / 256.0)
        .collect()
}

fn bits<D: Driver>(gpu: &CudaBackend<D>, t: &CudaTensor) -> Vec<u32> {
    gpu.download(t)
        .expect("download")
        .into_iter()
        .map(f32::to_bits)
        .collect()
}

fn assert_close(ours: &[f32], reference: &[f64], what: &str) {
    assert_eq!(ours.len(), reference.len(), "{what}: length");
    let (mut diff, mut norm) = (0.0f64, 0.0f64);
    for (a, b) in ours.iter().zip(reference) {
        assert!(a.is_finite(), "{what}: an element was not written ({a})");
        diff += (f64::from(*a) - b).powi(2);
        norm += b * b;
    }
    assert!(
        diff.sqrt() <= 1e-5 * norm.sqrt().max(1e-30),
        "{what}: relative error {}",
        diff.sqrt() / norm.sqrt()
    );
}

/// Sum, mean and max over the rows of `[rows, n]`, each run 5 times in a row with the same
/// bits every time, within 1e-5 of the CPU's f64.
pub fn reductions<D: Driver>(gpu: &CudaBackend<D>, (rows, n): (usize, usize)) {
    let host = values(rows, n, 0);
    let x = gpu.upload(&host, &[rows, n]).expect("upload");
    let wide: Vec<f64> = host.iter().map(|&v| f64::from(v)).collect();
    let cx = CPU.upload(&wide, &[rows, n]).expect("cpu upload");
    for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max] {
        let what = format!("{op:?} over [{rows}, {n}]");
        let first = gpu.reduce(op, &x, 0, false).expect("reduce");
        let reference = CPU
            .download(&CPU.reduce(op, &cx, 0, false).unwrap())
            .unwrap();
        assert_close(&gpu.download(&first).unwrap(), &reference, &what);
        for run in 1..5 {
            let again = gpu.reduce(op, &x, 0, false).expect("reduce again");
            assert_eq!(bits(gpu, &again), bits(gpu, &first), "{what}: run {run}");
        }
    }
}

/// `dst += x` summed over the rows into a buffer holding values, and the global norm, run
/// eagerly and as a graph replayed 4 times: each replay's bits equal the eager run's.
pub fn into_buffer_and_norm<D: Driver>(gpu: &CudaBackend<D>, (rows, n): (usize, usize)) {
    let host = values(rows, n, 3);
    let x = gpu.upload(&host, &[rows, n]).expect("upload");
    let start: Vec<f32> = (0..n).map(|j| j as f32 * 0.25).collect();
    let run = |dst: &CudaTensor, norm_out: &CudaTensor| {
        gpu.upload_into(&start, dst).expect("reset dst");
        gpu.sum_rows_into(&x, dst).expect("sum_rows_into");
        let norm = gpu.norm2(&x).expect("norm");
        gpu.copy_into(&norm, norm_out).expect("keep norm");
    };
    let (eager, eager_norm) = (gpu.zeros(&[n]).unwrap(), gpu.zeros(&[]).unwrap());
    run(&eager, &eager_norm);
    let wide: Vec<f64> = host.iter().map(|&v| f64::from(v)).collect();
    let sums: Vec<f64> = (0..n)
        .map(|j| f64::from(start[j]) + (0..rows).map(|r| wide[r * n + j]).sum::<f64>())
        .collect();
    let what = format!("[{rows}, {n}]");
    assert_close(
        &gpu.download(&eager).unwrap(),
        &sums,
        &format!("sum into {what}"),
    );
    let norm = wide.iter().map(|v| v * v).sum::<f64>().sqrt();
    assert_close(
        &gpu.download(&eager_norm).unwrap(),
        &[norm],
        &format!("norm of {what}"),
    );
    let (dst, norm_out) = (gpu.zeros(&[n]).unwrap(), gpu.zeros(&[]).unwrap());
    let body = {
        let (be, x, dst, norm_out) = (gpu.clone(), x.clone(), dst.clone(), norm_out.clone());
        Box::new(move || {
            be.sum_rows_into(&x, &dst)?;
            let norm = be.norm2(&x)?;
            be.copy_into(&norm, &norm_out)?;
            Ok(())
        })
    };
    gpu.upload_into(&start, &dst).expect("reset dst");
    let mut graph = gpu.capture(body).expect("capture");
    for r in 0..4 {
        gpu.upload_into(&start, &dst).expect("reset dst");
        gpu.replay(&mut graph).expect("replay");
        assert_eq!(
            bits(gpu, &dst),
            bits(gpu, &eager),
            "{what}: replay {r} sums"
        );
        assert_eq!(
            bits(gpu, &norm_out),
            bits(gpu, &eager_norm),
            "{what}: replay {r} norm"
        );
    }
}

macro_rules! cols_once_suite {
    ($backend:path) => {
        use super::super::cols_once::SHAPES;
        use rstest::rstest;

        #[rstest]
        fn column_reductions_in_one_launch(#[values(0, 1, 2, 3, 4)] shape: usize) {
            super::super::cols_once::reductions(&$backend(), SHAPES[shape]);
        }

        #[rstest]
        fn sums_into_a_buffer_and_the_norm_replayed(#[values(0, 1, 2, 3, 4)] shape: usize) {
            super::super::cols_once::into_buffer_and_norm(&$backend(), SHAPES[shape]);
        }
    };
}

mod mock_suite {
    cols_once_suite!(super::super::mock);
}

#[cfg(feature = "gpu")]
mod gpu {
    cols_once_suite!(super::super::gpu);
}
