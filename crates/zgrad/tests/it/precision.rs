//! Precision policies (issue 42): the CPU backend's matrix product under bf16 is the float32
//! product of the bf16-rounded inputs, bit for bit; float32 is the backend's own product; TF32,
//! which the CPU cannot emulate, is refused rather than run in float32.

use half::bf16;
use zcompute::{Backend, CpuBackend, MatmulOpts};
use zgrad::{GradError, Precision};

const B: CpuBackend = CpuBackend;

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = zgrad::rng::SplitMix64::new(seed);
    rng.normal_vec(n).into_iter().map(|v| v as f32).collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn a_bf16_product_is_the_float32_product_of_the_rounded_inputs_bitwise() {
    let (m, k, n) = (7, 33, 5);
    let (a, b) = (values(m * k, 1), values(k * n, 2));
    let round = |v: &[f32]| -> Vec<f32> { v.iter().map(|x| bf16::from_f32(*x).to_f32()).collect() };
    for (trans_a, trans_b) in [(false, false), (false, true), (true, false)] {
        let opts = MatmulOpts { trans_a, trans_b };
        let sa = if trans_a { [k, m] } else { [m, k] };
        let sb = if trans_b { [n, k] } else { [k, n] };
        let ta = B.upload(&a, &sa).unwrap();
        let tb = B.upload(&b, &sb).unwrap();
        let got = B
            .download(&Precision::Bf16.matmul_cpu(&B, &ta, &tb, opts).unwrap())
            .unwrap();
        let ra = B.upload(&round(&a), &sa).unwrap();
        let rb = B.upload(&round(&b), &sb).unwrap();
        let want = B.download(&B.matmul(&ra, &rb, opts).unwrap()).unwrap();
        assert_eq!(bits(&got), bits(&want), "{opts:?}");
        let plain = B.download(&B.matmul(&ta, &tb, opts).unwrap()).unwrap();
        assert_ne!(
            bits(&got),
            bits(&plain),
            "{opts:?}: the rounding changed something"
        );
        let f32_policy = B
            .download(&Precision::F32.matmul_cpu(&B, &ta, &tb, opts).unwrap())
            .unwrap();
        assert_eq!(
            bits(&f32_policy),
            bits(&plain),
            "{opts:?}: float32 is untouched"
        );
    }
}

/// Integers whose products and sums are exact in float32 but which bf16 cannot all hold
/// (257 has 9 significant bits): the bf16 product equals the exact product of the rounded
/// integers, computed independently in float64.
#[test]
fn a_bf16_product_of_integers_is_the_exact_product_of_their_bf16_roundings() {
    let (m, k, n) = (3, 8, 4);
    let a: Vec<f32> = (0..m * k)
        .map(|i| (257 + 37 * i as i32 - 300) as f32)
        .collect();
    let b: Vec<f32> = (0..k * n).map(|i| (511 - 29 * i as i32) as f32).collect();
    let r = |x: f32| f64::from(bf16::from_f32(x).to_f32());
    let mut want = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let s: f64 = (0..k).map(|p| r(a[i * k + p]) * r(b[p * n + j])).sum();
            want[i * n + j] = s as f32;
            assert_eq!(f64::from(want[i * n + j]), s, "exact in float32");
        }
    }
    let ta = B.upload(&a, &[m, k]).unwrap();
    let tb = B.upload(&b, &[k, n]).unwrap();
    let opts = MatmulOpts::default();
    let got = B
        .download(&Precision::Bf16.matmul_cpu(&B, &ta, &tb, opts).unwrap())
        .unwrap();
    assert_eq!(bits(&got), bits(&want));
    assert_ne!(bf16::from_f32(257.0).to_f32(), 257.0);
}

#[test]
fn tf32_is_refused_on_the_cpu_not_run_in_float32() {
    let t = B.upload(&values(4, 3), &[2, 2]).unwrap();
    match Precision::Tf32.matmul_cpu(&B, &t, &t, MatmulOpts::default()) {
        Err(GradError::PrecisionNotEmulated { precision, .. }) => assert_eq!(precision, "tf32"),
        other => panic!("{other:?}"),
    }
}

/// The policy's products on any backend: `PrecisionOps` under `Precision::math_mode`. Under bf16
/// on the CPU that is `matmul_cpu`'s product bit for bit (one rounding, zdevice's, equal to
/// `half`'s); float32 is the backend's own.
#[test]
fn the_policy_runs_its_products_through_precision_ops() {
    use zcompute::PrecisionOps;
    let (a, b) = (values(6 * 40, 4), values(40 * 3, 5));
    let ta = B.upload(&a, &[6, 40]).unwrap();
    let tb = B.upload(&b, &[40, 3]).unwrap();
    let opts = MatmulOpts::default();
    for p in [Precision::F32, Precision::Bf16] {
        let via_ops = B.matmul_mode(&ta, &tb, opts, p.math_mode()).unwrap();
        let via_cpu = p.matmul_cpu(&B, &ta, &tb, opts).unwrap();
        assert_eq!(
            bits(&B.download(&via_ops).unwrap()),
            bits(&B.download(&via_cpu).unwrap()),
            "{}",
            p.name()
        );
    }
    assert_eq!(Precision::Tf32.math_mode(), zcompute::MathMode::Tf32);
    assert_eq!(Precision::Tf32.math_mode().name(), Precision::Tf32.name());
}

/// Attention's fused core on a tape under a math mode.
mod attention;
/// The trainer under a policy on the CPU (the simulated device and the GPU: device.rs).
/// One bf16 step against the float64 oracle, judged by PyTorch autocast's own error.
mod autocast;
/// The bf16 conversions a step makes, counted on the simulated device.
mod conversions;
mod trainer;
