//! Bad inputs get the same typed error from the CUDA backend as from the CPU backend.

use super::bodies::{View, input};
use zcompute::{AdamWConfig, Backend, CpuBackend, CpuTensor, CudaBackend, CudaTensor, MatmulOpts};
use zdevice::Driver;

const CPU: CpuBackend = CpuBackend;

/// Bad inputs get the same typed error from the device backend as from the CPU.
pub fn errors<D: Driver>(gpu: &CudaBackend<D>) {
    let g = |shape: &[usize]| input(gpu, shape, View::Dense, 30, -1.0, 1.0);
    let c = |shape: &[usize]| input(&CPU, shape, View::Dense, 30, -1.0, 1.0);
    let cpu = |r: zcompute::Result<CpuTensor<f32>>| r.expect_err("cpu accepts a bad input");
    let dev = |r: zcompute::Result<CudaTensor>| r.expect_err("cuda accepts a bad input");

    assert_eq!(
        dev(gpu.add(&g(&[3]), &g(&[4]))),
        cpu(Backend::<f32>::add(&CPU, &c(&[3]), &c(&[4])))
    );
    let nt = MatmulOpts::default();
    assert_eq!(
        dev(gpu.matmul(&g(&[2, 3]), &g(&[4, 5]), nt)),
        cpu(Backend::<f32>::matmul(&CPU, &c(&[2, 3]), &c(&[4, 5]), nt))
    );
    assert_eq!(
        dev(gpu.matmul(&g(&[3]), &g(&[3, 3]), nt)),
        cpu(Backend::<f32>::matmul(&CPU, &c(&[3]), &c(&[3, 3]), nt))
    );
    assert_eq!(
        dev(gpu.matmul(&g(&[2, 3, 4]), &g(&[3, 4, 2]), nt)),
        cpu(Backend::<f32>::matmul(
            &CPU,
            &c(&[2, 3, 4]),
            &c(&[3, 4, 2]),
            nt
        ))
    );
    assert_eq!(
        dev(gpu.sum(&g(&[3, 4]), 2, false)),
        cpu(Backend::<f32>::sum(&CPU, &c(&[3, 4]), 2, false))
    );
    assert_eq!(
        dev(gpu.max(&g(&[3, 0]), 1, false)),
        cpu(Backend::<f32>::max(&CPU, &c(&[3, 0]), 1, false))
    );
    assert_eq!(
        dev(gpu.softmax_last(&g(&[]))),
        cpu(Backend::<f32>::softmax_last(&CPU, &c(&[])))
    );
    assert_eq!(
        gpu.layer_norm(&g(&[2, 3]), Some(&g(&[4])), None, 1e-5)
            .expect_err("bad weight")
            .to_string(),
        Backend::<f32>::layer_norm(&CPU, &c(&[2, 3]), Some(&c(&[4])), None, 1e-5)
            .expect_err("bad weight")
            .to_string()
    );
    assert_eq!(
        dev(gpu.bce_with_logits_mean(&g(&[3]), &g(&[4]))),
        cpu(Backend::<f32>::bce_with_logits_mean(
            &CPU,
            &c(&[3]),
            &c(&[4])
        ))
    );
    assert_eq!(
        dev(gpu.bce_with_logits_mean(&g(&[0]), &g(&[0]))),
        cpu(Backend::<f32>::bce_with_logits_mean(
            &CPU,
            &c(&[0]),
            &c(&[0])
        ))
    );
    assert!(matches!(
        dev(gpu.upload(&[1.0, 2.0], &[3])),
        zcompute::ComputeError::LengthMismatch {
            expected: 3,
            got: 2,
            ..
        }
    ));
    // Writing into a broadcast view, copying between shapes, aliased optimiser state.
    let bg = g(&[4]).broadcast_to(&[2, 4]).expect("broadcast");
    let bc = c(&[4]).broadcast_to(&[2, 4]).expect("broadcast");
    assert_eq!(
        gpu.fill(&bg, 1.0).expect_err("fill"),
        Backend::<f32>::fill(&CPU, &bc, 1.0).expect_err("fill")
    );
    assert_eq!(
        gpu.copy_into(&g(&[3]), &g(&[4])).expect_err("copy"),
        Backend::<f32>::copy_into(&CPU, &c(&[3]), &c(&[4])).expect_err("copy")
    );
    let cfg = AdamWConfig {
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
    };
    let (p, s) = (g(&[4]), g(&[2]));
    let (pc, sc) = (c(&[4]), c(&[2]));
    assert_eq!(
        gpu.adamw_step(&p, &g(&[4]), &g(&[4]), &p, &s, &cfg)
            .expect_err("aliased"),
        Backend::<f32>::adamw_step(&CPU, &pc, &c(&[4]), &c(&[4]), &pc, &sc, &cfg)
            .expect_err("aliased")
    );
}
