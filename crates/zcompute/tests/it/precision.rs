//! `PrecisionOps` on the CPU backend (issue 42): the emulation of bf16 and TF32 products in f32,
//! and the typed refusal where a mode cannot run as it says (f64 elements). The device suites
//! (`cuda/precision.rs`) compare the simulated device and the GPU with this emulation.

use crate::cuda::precision::{budget, within};
use proptest::prelude::*;
use zcompute::prelude::*;
use zcompute::{ComputeError, CpuBackend, CpuTensor, MathMode, MatmulOpts};

const CPU: CpuBackend = CpuBackend;

#[test]
fn f64_elements_refuse_the_reduced_modes_and_run_f32() {
    let a = CpuTensor::from_vec(vec![1.0f64, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
    for mode in [MathMode::Tf32, MathMode::Bf16] {
        match CPU.matmul_mode(&a, &a, MatmulOpts::default(), mode) {
            Err(ComputeError::MathModeUnsupported {
                mode: m, backend, ..
            }) => {
                assert_eq!((m, backend), (mode.name(), "cpu"));
            }
            other => panic!("{}: {other:?}", mode.name()),
        }
        let dst = CPU.zeros(&[2, 2]).unwrap();
        let into = CPU.matmul_into_mode(&a, &a, MatmulOpts::default(), &dst, mode);
        assert!(
            matches!(into, Err(ComputeError::MathModeUnsupported { .. })),
            "{into:?}"
        );
        assert_eq!(dst.to_vec(), [0.0; 4], "nothing ran");
    }
    assert!(matches!(
        CPU.round_to_bf16(&a),
        Err(ComputeError::MathModeUnsupported { .. })
    ));
    let f32_mode = CPU
        .matmul_mode(&a, &a, MatmulOpts::default(), MathMode::F32)
        .unwrap();
    assert_eq!(f32_mode.to_vec(), [7.0, 10.0, 15.0, 22.0]);
    let message = CPU
        .matmul_mode(&a, &a, MatmulOpts::default(), MathMode::Bf16)
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("bf16") && message.contains("float32"),
        "{message}"
    );
}

#[test]
fn bad_shapes_are_refused_before_any_rounding() {
    let a = CpuTensor::from_vec(vec![1.0f32; 6], &[2, 3]).unwrap();
    let err = CPU.matmul_mode(&a, &a, MatmulOpts::default(), MathMode::Bf16);
    assert!(
        matches!(err, Err(ComputeError::ShapeMismatch { .. })),
        "{err:?}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Any shape and transposes: the emulated bf16 and TF32 products are within float32
    /// accumulation error (`2·k·2⁻²⁴ Σ|a'||b'|`; TF32's budget is the device's, wider) of
    /// the f64 product of the rounded operands.
    #[test]
    fn emulated_products_are_the_rounded_operands_product(
        m in 1usize..9, k in 1usize..70, n in 1usize..9,
        ta: bool, tb: bool, bf16: bool,
        seed in 0u64..1000,
    ) {
        let mode = if bf16 { MathMode::Bf16 } else { MathMode::Tf32 };
        let a_shape = if ta { [k, m] } else { [m, k] };
        let b_shape = if tb { [n, k] } else { [k, n] };
        let a: Vec<f32> = crate::common::uniform(m * k, seed, -3.0, 3.0).iter().map(|&v| v as f32).collect();
        let b: Vec<f32> = crate::common::uniform(k * n, seed + 1, -3.0, 3.0).iter().map(|&v| v as f32).collect();
        let opts = MatmulOpts { trans_a: ta, trans_b: tb };
        let ours = CPU
            .matmul_mode(
                &CpuTensor::from_vec(a.clone(), &a_shape).unwrap(),
                &CpuTensor::from_vec(b.clone(), &b_shape).unwrap(),
                opts,
                mode,
            )
            .unwrap();
        let up = |v: &[f32], shape: &[usize], abs: bool| {
            let v = v.iter().map(|&x| f64::from(mode.round_operand(x))).map(|x| if abs { x.abs() } else { x });
            CpuTensor::from_vec(v.collect::<Vec<f64>>(), shape).unwrap()
        };
        let want = CPU.matmul(&up(&a, &a_shape, false), &up(&b, &b_shape, false), opts).unwrap().to_vec();
        let scale = CPU.matmul(&up(&a, &a_shape, true), &up(&b, &b_shape, true), opts).unwrap().to_vec();
        // The TF32 emulation is exactly nearest-even here: the accumulation budget alone.
        within("cpu", &ours.to_vec(), (&want, &scale), budget(MathMode::Bf16, k));
    }
}
