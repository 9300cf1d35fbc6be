//! The attention block with its core as one fused tape node against the composite it replaced
//! (`QkNormAttention::forward_composite`): same output and parameter gradients on the CPU in
//! f64 and on the CUDA backend over the simulated device (poison on), at the XAsset shape and
//! at shapes the fused kernels fall back from; and the launches of one forward+backward of the
//! block before and after on the simulator.

use rstest::rstest;
use zcompute::{CpuBackend, CudaBackend, Element, prelude::*};
use zdevice::{Device, DeviceConfig, SimConfig, SimDriver, sim::calls};
use zgrad::nn::QkNormAttention;
use zgrad::rng::SplitMix64;
use zgrad::{Tape, Var};
use zmem::{Arena, ArenaConfig};

fn mock() -> CudaBackend<SimDriver> {
    let sim = SimDriver::new(SimConfig {
        poison_on_free: true,
        ..SimConfig::with_capacity(256 << 20)
    });
    zcompute::cuda::twins::register(&sim);
    let dev = Device::open(
        sim,
        DeviceConfig {
            blas_workspace_bytes: 0,
            ..DeviceConfig::default()
        },
    )
    .expect("the simulated device opens");
    let arena = Arena::new(
        dev,
        ArenaConfig {
            poison: true,
            ..ArenaConfig::default()
        },
    )
    .expect("arena");
    let b = CudaBackend::new(arena).expect("backend");
    b.set_poison(true);
    b
}

/// Output, then every parameter's gradient (qkv, qn, kn, o; weight then bias), as f64.
fn run<B: Ops<T>, T: Element>(
    b: &B,
    shape: [usize; 3],
    heads: usize,
    composite: bool,
) -> Vec<Vec<f64>> {
    let mut rng = SplitMix64::new(0xa77e);
    let block = QkNormAttention::<B, T>::init(b, shape[2], heads, &mut rng).expect("init");
    // Non-trivial QK-norm parameters (init gives ones and zeros).
    for ln in [&block.qn, &block.kn] {
        for (p, lo) in [(&ln.weight, 0.5), (&ln.bias, -0.5)] {
            let v: Vec<T> = rng
                .uniform_vec(p.value().numel(), lo, lo + 1.0)
                .into_iter()
                .map(T::from_f64)
                .collect();
            b.upload_into(&v, p.value()).expect("parameter");
        }
    }
    let n: usize = shape.iter().product();
    let data = |v: Vec<f64>| -> Vec<T> {
        v.into_iter()
            .map(|x| T::from_f64(f64::from(x as f32)))
            .collect()
    };
    let x = Var::constant(b.upload(&data(rng.normal_vec(n)), &shape).expect("x"));
    let w = Var::constant(b.upload(&data(rng.normal_vec(n)), &shape).expect("w"));
    b.begin_step().expect("step");
    let tape = Tape::new(b);
    let out = if composite {
        block.forward_composite(&tape, &x)
    } else {
        block.forward(&tape, &x)
    }
    .expect("forward");
    let loss = tape.sum_all(&tape.mul(&out, &w).unwrap()).unwrap();
    tape.backward(&loss).expect("backward");
    let to64 = |t: &zcompute::BTensor<B, T>| -> Vec<f64> {
        b.download(t)
            .unwrap()
            .into_iter()
            .map(Element::to_f64)
            .collect()
    };
    let mut all = vec![to64(out.value())];
    all.push(to64(block.qkv.weight.grad().unwrap()));
    all.push(to64(block.qkv.bias.grad().unwrap()));
    for ln in [&block.qn, &block.kn] {
        all.push(to64(ln.weight.grad().unwrap()));
        all.push(to64(ln.bias.grad().unwrap()));
    }
    all.push(to64(block.o.weight.grad().unwrap()));
    all.push(to64(block.o.bias.grad().unwrap()));
    drop(tape);
    b.end_step().expect("end step");
    all
}

const NAMES: [&str; 9] = [
    "out",
    "qkv.weight",
    "qkv.bias",
    "qn.weight",
    "qn.bias",
    "kn.weight",
    "kn.bias",
    "o.weight",
    "o.bias",
];

fn assert_close(what: &str, got: &[Vec<f64>], want: &[Vec<f64>], tol: f64) {
    for ((name, g), w) in NAMES.iter().zip(got).zip(want) {
        let diff: f64 = g
            .iter()
            .zip(w)
            .map(|(a, b)| (a - b).powi(2))
            .sum::<f64>()
            .sqrt();
        let norm: f64 = w.iter().map(|b| b * b).sum::<f64>().sqrt();
        // kn.bias's gradient is zero up to rounding: compared absolutely.
        let err = if *name == "kn.bias" {
            diff
        } else {
            diff / norm.max(1e-30)
        };
        assert!(err <= tol, "{what} {name}: {err:e}");
    }
}

#[rstest]
#[case::xasset([3, 12, 256], 4)]
#[case::odd_heads([2, 17, 20], 4)]
#[case::long_sequence([1, 70, 16], 2)]
fn fused_block_matches_the_composite(#[case] shape: [usize; 3], #[case] heads: usize) {
    let composite = run::<_, f64>(&CpuBackend, shape, heads, true);
    let fused_cpu = run::<_, f64>(&CpuBackend, shape, heads, false);
    assert_close("cpu f64", &fused_cpu, &composite, 1e-12);
    let sim = mock();
    let fused_sim = run::<_, f32>(&sim, shape, heads, false);
    assert_close("sim f32", &fused_sim, &composite, 1e-5);
    let composite_sim = run::<_, f32>(&sim, shape, heads, true);
    assert_close("sim f32 composite", &composite_sim, &composite, 1e-5);
}

/// Kernel launches and gemms of one forward+backward of the block (qkv and o products
/// included) on the simulator, composite then fused; printed for the record.
#[test]
#[allow(clippy::print_stdout)] // the counts belong in the test's output (reported)
fn launches_of_one_forward_backward() {
    let sim = mock();
    let count = |composite: bool| -> (usize, usize) {
        let driver = sim.device().driver();
        driver.clear_op_log();
        let _ = run::<_, f32>(&sim, [3, 12, 256], 4, composite);
        let log = driver.op_log();
        let n = |call: &str| log.iter().filter(|r| r.call == call).count();
        (n(calls::LAUNCH_KERNEL), n(calls::GEMM_STRIDED_BATCHED))
    };
    // Warm both paths once (first-use allocations), then count.
    let _ = (count(true), count(false));
    let (before, after) = (count(true), count(false));
    println!(
        "attention block forward+backward on the simulator [3, 12, 256], 4 heads: \
         composite {} kernels + {} gemms = {}, fused {} kernels + {} gemms = {}",
        before.0,
        before.1,
        before.0 + before.1,
        after.0,
        after.1,
        after.0 + after.1
    );
    assert!(after.0 + after.1 < before.0 + before.1);
}
