//! How many launches a column reduction takes, counted on the simulated device: a batch's bias
//! or LayerNorm gradient (`[3072, n]` summed into its buffer) is one launch whose last block of
//! each column tile finishes the tile's partials (each launch is a dependent graph node of
//! about 3 us on an H100). The sums themselves equal the CPU's.

use zcompute::{Backend, CpuBackend, CudaBackend, SimDriver, StepOps};
use zdevice::sim::calls::LAUNCH_KERNEL;

const CPU: CpuBackend = CpuBackend;

/// Kernel launches of one `sum_rows_into(x, dst)`, and dst's values after it.
fn sum_into(gpu: &CudaBackend<SimDriver>, rows: usize, n: usize) -> (usize, Vec<f32>, Vec<f32>) {
    let host: Vec<f32> = (0..rows * n)
        .map(|i| ((i * 7919 % 1009) as f32 - 504.0) / 256.0)
        .collect();
    let x = gpu.upload(&host, &[rows, n]).expect("upload x");
    let start: Vec<f32> = (0..n).map(|j| j as f32 * 0.5).collect();
    let dst = gpu.upload(&start, &[n]).expect("upload dst");
    let sim = gpu.device().driver();
    gpu.download(&dst).expect("settle");
    sim.clear_op_log();
    gpu.sum_rows_into(&x, &dst).expect("sum_rows_into");
    let launches = sim
        .op_log()
        .iter()
        .filter(|r| r.call == LAUNCH_KERNEL)
        .count();
    let ours = gpu.download(&dst).expect("download");
    let cx = CPU.upload(&host, &[rows, n]).expect("cpu x");
    let cd = CPU.upload(&start, &[n]).expect("cpu dst");
    CPU.sum_rows_into(&cx, &cd).expect("cpu sum");
    (launches, ours, CPU.download(&cd).expect("cpu download"))
}

fn assert_close(ours: &[f32], cpu: &[f32], what: &str) {
    for (j, (a, b)) in ours.iter().zip(cpu).enumerate() {
        assert!(
            (a - b).abs() <= 1e-3 * b.abs().max(1.0),
            "{what}: column {j}: {a} against the CPU's {b}"
        );
    }
}

#[test]
fn a_batch_column_sum_is_one_launch() {
    let gpu = super::mock();
    // XAsset's batched bias and LayerNorm gradients: 256 samples x 12 scales.
    for n in [256, 768, 1024] {
        let (launches, ours, cpu) = sum_into(&gpu, 3072, n);
        assert_eq!(
            launches, 1,
            "[3072, {n}]: partials and their finish in one launch"
        );
        assert_close(&ours, &cpu, &format!("[3072, {n}]"));
    }
}

#[test]
fn few_rows_stay_one_pass_and_many_partials_keep_their_chunks() {
    let gpu = super::mock();
    let (launches, ours, cpu) = sum_into(&gpu, 12, 256);
    assert_eq!(launches, 1, "a sample's 12 rows: one pass");
    assert_close(&ours, &cpu, "[12, 256]");
    // Two columns over many rows: more partials than one finishing pass takes (1024 chunks).
    let (launches, ours, cpu) = sum_into(&gpu, 1 << 16, 2);
    assert!(launches >= 3, "[65536, 2]: {launches} launches");
    assert_close(&ours, &cpu, "[65536, 2]");
}

#[test]
fn the_global_norm_is_one_launch() {
    let gpu = super::mock();
    for n in [1usize, 1000, 839_937] {
        let host: Vec<f32> = (0..n).map(|i| (i % 17) as f32 - 8.0).collect();
        let x = gpu.upload(&host, &[n]).expect("upload");
        let sim = gpu.device().driver();
        gpu.download(&x).expect("settle");
        sim.clear_op_log();
        let norm = gpu.norm2(&x).expect("norm");
        let launches = sim
            .op_log()
            .iter()
            .filter(|r| r.call == LAUNCH_KERNEL)
            .count();
        assert_eq!(
            launches, 1,
            "{n} elements: partials and their sum in one launch"
        );
        let want = host
            .iter()
            .map(|v| f64::from(*v).powi(2))
            .sum::<f64>()
            .sqrt();
        let got = f64::from(gpu.download(&norm).expect("download")[0]);
        assert!(
            (got - want).abs() <= 1e-5 * want.max(1.0),
            "{n}: {got} against {want}"
        );
    }
}

/// A batch's Linear backward with tanh and a bias: tanh's backward adds the bias gradient's
/// column sums in its own launch, so asking for the bias gradient adds no launch (it added
/// the column sum's before).
#[test]
fn a_batch_linear_backward_with_tanh_sums_its_bias_in_tanhs_launch() {
    use zcompute::{Activation, LinearOps};
    let gpu = super::mock();
    for (rows, ins, outs) in [(100, 64, 256), (3072, 37, 5)] {
        let fill = |len: usize, seed: usize| -> Vec<f32> {
            (0..len)
                .map(|i| (((i + seed) * 7919 % 1009) as f32 - 504.0) / 600.0)
                .collect()
        };
        let gy = gpu.upload(&fill(rows * outs, 1), &[rows, outs]).unwrap();
        let y = gpu.upload(&fill(rows * outs, 2), &[rows, outs]).unwrap();
        let x = gpu.upload(&fill(rows * ins, 3), &[rows, ins]).unwrap();
        let w = gpu.upload(&fill(outs * ins, 4), &[outs, ins]).unwrap();
        let (dw, db) = (
            gpu.zeros(&[outs, ins]).unwrap(),
            gpu.zeros(&[outs]).unwrap(),
        );
        let sim = gpu.device().driver();
        let launches = |bias: Option<&zcompute::CudaTensor>| {
            gpu.download(&db).expect("settle");
            sim.clear_op_log();
            gpu.linear_backward_into(&gy, &x, Some(&w), (Activation::Tanh, Some(&y)), (&dw, bias))
                .expect("backward");
            gpu.download(&db).expect("settle");
            sim.op_log()
                .iter()
                .filter(|r| r.call == LAUNCH_KERNEL)
                .count()
        };
        let (with_bias, without) = (launches(Some(&db)), launches(None));
        assert_eq!(
            with_bias, without,
            "[{rows}, {outs}]: the bias gradient's sums in tanh's launch"
        );
    }
}

/// A training step's tail (stats, gate, sticky gate, history row) is one launch, where the
/// ops it stands for were six (two copies, the gate, an add, a copy, the row's scatter).
#[test]
fn a_steps_tail_is_one_launch() {
    let gpu = super::mock();
    let (loss, norm) = (
        gpu.upload(&[0.5], &[]).unwrap(),
        gpu.upload(&[2.0], &[]).unwrap(),
    );
    let (stats, gate, sticky) = (
        gpu.zeros(&[2]).unwrap(),
        gpu.zeros(&[1]).unwrap(),
        gpu.zeros(&[1]).unwrap(),
    );
    let (history, cursor) = (gpu.zeros(&[32, 2]).unwrap(), gpu.zeros(&[1]).unwrap());
    let sim = gpu.device().driver();
    gpu.download(&stats).expect("settle");
    sim.clear_op_log();
    gpu.step_tail(
        [&loss, &norm],
        &stats,
        &gate,
        Some(&sticky),
        Some((&history, &cursor)),
    )
    .expect("step_tail");
    gpu.download(&stats).expect("settle");
    let launches = sim
        .op_log()
        .iter()
        .filter(|r| r.call == LAUNCH_KERNEL)
        .count();
    assert_eq!(launches, 1, "the step's tail in one launch");
    assert_eq!(gpu.download(&history).unwrap()[..2], [0.5, 2.0]);
    assert_eq!(gpu.download(&cursor).unwrap(), vec![1.0]);
}
