//! The launch shapes of the fused tail's kernels, recorded on the simulated device: the mean
//! pool + head + BCE forward runs one block per sample (not one block for the whole batch),
//! its backward writes gh with enough threads for a few elements each and reduces the head's
//! weight gradient over several block rows (batches up to 8: one launch each way, no
//! finishing launch), and the bias epilogue gives every float4 (or
//! float, off the vector path) of its matrix a thread. The H100 profile (issue 12) found these
//! kernels at 100, 64 and 10 us when each ran on a handful of blocks; the simulator cannot time
//! them, so these tests pin the parallelism instead. Results are checked by `fused.rs`.

use std::sync::{Arc, Mutex};
use zcompute::prelude::*;
use zcompute::{Activation, Backend, CudaBackend};
use zdevice::{Device, DeviceConfig, LaunchConfig, SimConfig, SimDriver};

type Log = Arc<Mutex<Vec<(&'static str, LaunchConfig)>>>;

const RECORDED: [&str; 7] = [
    "zc_bias_act_f32",
    "zc_pool_head_bce_f32",
    "zc_pool_head_bce_finish_f32",
    "zc_pool_head_bce_last_f32",
    "zc_pool_head_bce_backward_f32",
    "zc_pool_head_bce_backward_finish_f32",
    "zc_pool_head_bce_backward_last_f32",
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

fn threads(c: &LaunchConfig) -> u64 {
    let (g, b) = (c.grid, c.block);
    [g.0, g.1, g.2, b.0, b.1, b.2]
        .into_iter()
        .map(u64::from)
        .product()
}

fn blocks(c: &LaunchConfig) -> u64 {
    u64::from(c.grid.0) * u64::from(c.grid.1) * u64::from(c.grid.2)
}

/// The configurations `name` was launched with since the log was last drained (`drain`: and
/// drains it). The simulator runs kernels when their stream does: `settle` (a download) makes
/// it run them first.
fn launches<D: zdevice::Driver>(
    gpu: &CudaBackend<D>,
    settle: &zcompute::CudaTensor,
    log: &Log,
    name: &str,
    drain: bool,
) -> Vec<LaunchConfig> {
    gpu.download(settle).expect("the stream runs");
    let mut log = log.lock().unwrap();
    let out = log
        .iter()
        .filter(|(n, _)| *n == name)
        .map(|(_, c)| *c)
        .collect();
    if drain {
        log.clear();
    }
    out
}

#[rstest::rstest]
fn pool_head_bce_spreads_over_samples_and_rows(
    #[values(1, 7, 8, 9, 256, 301)] batch: usize,
    #[values(1, 12)] scales: usize,
    #[values(5, 256)] width: usize,
) {
    let (gpu, log) = recording_backend();
    let h = gpu.zeros(&[batch, scales, width]).unwrap();
    let (w, b, y) = (
        gpu.zeros(&[1, width]).unwrap(),
        gpu.zeros(&[1]).unwrap(),
        gpu.zeros(&[batch]).unwrap(),
    );
    let what = format!("B {batch} S {scales} D {width}");
    // Up to 8 samples run in one launch each way (one graph node); larger batches one block
    // per sample, resp. several block rows, whose last block to finish (a ticket) does what a
    // second, finishing launch did: still one launch (one graph node) each way.
    let small = batch <= 8;
    let out = gpu.pool_head_bce(&h, &w, &b, &y).unwrap();
    let name = if small {
        "zc_pool_head_bce_f32"
    } else {
        "zc_pool_head_bce_last_f32"
    };
    let forward = launches(&gpu, &out.loss, &log, name, false);
    assert_eq!(forward.len(), 1, "{what}: one forward launch");
    let want_blocks = if small { 1 } else { batch as u64 };
    assert_eq!(blocks(&forward[0]), want_blocks, "{what}: blocks");
    let finish = launches(&gpu, &out.loss, &log, "zc_pool_head_bce_finish_f32", true);
    assert!(finish.is_empty(), "{what}: no finishing launch");

    let g = gpu.zeros(&[]).unwrap();
    let grads = gpu
        .pool_head_bce_backward(&g, &h, &w, &out.logits, &y)
        .unwrap();
    let one_row = launches(
        &gpu,
        &grads.bias,
        &log,
        "zc_pool_head_bce_backward_f32",
        false,
    );
    let ticketed = launches(
        &gpu,
        &grads.bias,
        &log,
        "zc_pool_head_bce_backward_last_f32",
        false,
    );
    let name = "zc_pool_head_bce_backward_finish_f32";
    let finish = launches(&gpu, &grads.bias, &log, name, true);
    // One block row writes gw and gb itself; several leave partials to their last block.
    assert_eq!(
        one_row.len() + ticketed.len(),
        1,
        "{what}: one backward launch"
    );
    assert!(finish.is_empty(), "{what}: no finishing launch");
    let backward = if one_row.is_empty() {
        ticketed
    } else {
        one_row.clone()
    };
    assert_eq!(
        one_row.len(),
        usize::from(backward[0].grid.1 == 1),
        "{what}: {:?}: the one-row kernel exactly when there is one block row",
        backward[0]
    );
    assert!(!small || !one_row.is_empty(), "{what}: one block row");
    if small {
        return;
    }
    let elements = (batch * scales * width) as u64;
    assert!(
        threads(&backward[0]) * 8 >= elements,
        "{what}: {:?} leaves more than 8 elements of gh to a thread",
        backward[0]
    );
    let rows = (batch * scales) as u64;
    assert!(
        u64::from(backward[0].grid.1) * 8 * 8 >= rows,
        "{what}: {:?} leaves more than 8 rows of h to a thread",
        backward[0]
    );
}

#[rstest::rstest]
#[case(&[12, 1024], true)]
#[case(&[3072, 1024], true)]
#[case(&[7, 1025], false)]
#[case(&[300, 3], false)]
#[case(&[1000, 1], false)]
fn bias_act_gives_every_column_and_row_a_thread(#[case] shape: &[usize], #[case] vec4: bool) {
    let (gpu, log) = recording_backend();
    let (rows, n) = (shape[0], shape[1]);
    let x = gpu.zeros(shape).unwrap();
    let bias = gpu.zeros(&[n]).unwrap();
    let out = gpu.bias_act(&x, &bias, Activation::Tanh).unwrap();
    let cols = if vec4 { n / 4 } else { n } as u64;
    let config = launches(&gpu, &out, &log, "zc_bias_act_f32", true)[0];
    assert!(
        u64::from(config.grid.0) * u64::from(config.block.0) >= cols,
        "{shape:?}: {config:?} does not give each of {cols} columns a thread"
    );
    assert!(
        u64::from(config.grid.1) * u64::from(config.block.1) >= rows as u64,
        "{shape:?}: {config:?} does not give each row a thread"
    );
    // ... and not many more: narrow matrices do not idle most of each block.
    assert!(
        threads(&config) < 2 * (rows as u64 * cols).max(128),
        "{shape:?}: {config:?} idles more threads than it uses"
    );

    // Off the vector path when x starts off a 16-byte boundary: a column per float.
    if vec4 {
        let flat = gpu.zeros(&[rows * n + 1]).unwrap();
        let shifted = flat.narrow(0, 1, rows * n).unwrap().reshape(shape).unwrap();
        let out = gpu.bias_act(&shifted, &bias, Activation::Tanh).unwrap();
        let config = launches(&gpu, &out, &log, "zc_bias_act_f32", true)[0];
        assert!(
            u64::from(config.grid.0) * u64::from(config.block.0) >= n as u64,
            "{shape:?} off 16 bytes: {config:?} does not give each float a thread"
        );
    }
}
