//! The fused ops (`zcompute::fused`) on a CUDA backend against the CPU backend in f64, poison
//! on (an element a kernel forgets to write reads NaN): the same f32-rounded inputs on both, per
//! tensor ||ours - f64|| / ||f64|| within 1e-5, at odd widths (1, 3, 5, 24, 37, 256, 1025), S
//! in {1, 12, 17}, batches of one to several blocks (1, 3, 33, 256, 301 samples; 3072 and more
//! rows of h), through views and off 16-byte alignment (the bias epilogue's scalar path). The
//! `mock` suite runs on the simulated device, the `gpu` suite (feature `gpu`) on CUDA device 0.
//! Two runs on one backend are bitwise equal.

use crate::common::{rel_err, uniform};
use zcompute::prelude::*;
use zcompute::{
    Activation, Backend, CpuBackend, CpuTensor, CudaBackend, CudaTensor, LayerNormBackward,
};
use zdevice::Driver;

const TOL: f64 = 1e-5;
const CPU: CpuBackend = CpuBackend;

/// The same values on the device (f32) and on the host (f64, the f32-rounded values); with
/// `transposed`, stored with the last two axes swapped and viewed back.
pub fn pair<D: Driver>(
    gpu: &CudaBackend<D>,
    shape: &[usize],
    seed: u64,
    (lo, hi): (f64, f64),
    transposed: bool,
) -> (CudaTensor, CpuTensor<f64>) {
    let n: usize = shape.iter().product();
    let v32: Vec<f32> = uniform(n, seed, lo, hi).iter().map(|&v| v as f32).collect();
    let v64: Vec<f64> = v32.iter().map(|&v| f64::from(v)).collect();
    let host = CpuTensor::from_vec(v64, shape).expect("host tensor");
    let rank = shape.len();
    if !transposed || rank < 2 {
        return (gpu.upload(&v32, shape).expect("upload"), host);
    }
    // Store the transpose, then view it back: the device sees a strided operand.
    let mut stored = shape.to_vec();
    stored.swap(rank - 1, rank - 2);
    let t = CpuTensor::from_vec(v32, shape).expect("f32");
    let t = CPU
        .contiguous(&t.transpose(rank - 1, rank - 2).expect("t"))
        .expect("dense");
    let dev = gpu.upload(&t.to_vec(), &stored).expect("upload");
    (dev.transpose(rank - 1, rank - 2).expect("view"), host)
}

pub fn close<D: Driver>(
    what: &str,
    gpu: &CudaBackend<D>,
    ours: &CudaTensor,
    want: &CpuTensor<f64>,
) {
    assert_eq!(ours.shape(), want.shape(), "{what}: shape");
    let got = gpu.download(ours).expect("download");
    let err = rel_err(&got, &want.to_vec());
    assert!(
        err <= TOL,
        "{what}: relative error {err:e} (budget {TOL:e})"
    );
}

pub fn bias_act<D: Driver>(gpu: &CudaBackend<D>, shape: &[usize], act: Activation, view: bool) {
    let n = shape[shape.len() - 1];
    let (x, xc) = pair(gpu, shape, 1, (-3.0, 3.0), view);
    let (b, bc) = pair(gpu, &[n], 2, (-1.0, 1.0), false);
    let ours = gpu.bias_act(&x, &b, act).expect("bias_act");
    let want = CPU.bias_act(&xc, &bc, act).expect("cpu");
    close(
        &format!("bias_act {shape:?} {act:?} view {view}"),
        gpu,
        &ours,
        &want,
    );
    let again = gpu.bias_act(&x, &b, act).expect("again");
    assert_eq!(gpu.download(&ours).unwrap(), gpu.download(&again).unwrap());
    if !view {
        // x one float past a 16-byte boundary: the kernel's scalar path at any width.
        let mut flat = vec![0.0f32];
        flat.extend(gpu.download(&x).unwrap());
        let numel = flat.len() - 1;
        let flat = gpu.upload(&flat, &[numel + 1]).expect("upload");
        let shifted = flat.narrow(0, 1, numel).unwrap().reshape(shape).unwrap();
        let ours = gpu.bias_act(&shifted, &b, act).expect("shifted");
        close(
            &format!("bias_act {shape:?} {act:?} shifted"),
            gpu,
            &ours,
            &want,
        );
    }

    let (g, gc) = pair(gpu, shape, 3, (-1.0, 1.0), view);
    let y = gpu.bias_act(&x, &b, Activation::Tanh).expect("tanh");
    let yc = CPU.bias_act(&xc, &bc, Activation::Tanh).expect("cpu");
    let ours = gpu.tanh_backward(&g, &y).expect("tanh_backward");
    let want = CPU.tanh_backward(&gc, &yc).expect("cpu");
    close(
        &format!("tanh_backward {shape:?} view {view}"),
        gpu,
        &ours,
        &want,
    );
}

pub fn add_layer_norm<D: Driver>(gpu: &CudaBackend<D>, shape: &[usize], view: bool) {
    let n = shape[shape.len() - 1];
    let (a, ac) = pair(gpu, shape, 4, (-3.0, 5.0), view);
    let (b, bc) = pair(gpu, shape, 5, (-2.0, 2.0), false);
    let (w, wc) = pair(gpu, &[n], 6, (0.5, 1.5), false);
    let (bias, biasc) = pair(gpu, &[n], 7, (-1.0, 1.0), false);
    let what = format!("add_layer_norm {shape:?} view {view}");
    let ours = gpu
        .add_layer_norm(&a, &b, Some(&w), Some(&bias), 1e-5)
        .expect("fused");
    let want = CPU
        .add_layer_norm(&ac, &bc, Some(&wc), Some(&biasc), 1e-5)
        .expect("cpu");
    close(&format!("{what} sum"), gpu, &ours.sum, &want.sum);
    close(&format!("{what} out"), gpu, &ours.norm.out, &want.norm.out);
    close(
        &format!("{what} mean"),
        gpu,
        &ours.norm.mean,
        &want.norm.mean,
    );
    close(
        &format!("{what} rstd"),
        gpu,
        &ours.norm.rstd,
        &want.norm.rstd,
    );

    let (g, gc) = pair(gpu, shape, 8, (-1.0, 1.0), view);
    let (r, rc) = pair(gpu, shape, 9, (-1.0, 1.0), false);
    for residual in [true, false] {
        for want_flags in [[true, true], [true, false], [false, true]] {
            let ours = gpu
                .layer_norm_backward_add(
                    &LayerNormBackward {
                        g: &g,
                        residual: residual.then_some(&r),
                        x: &ours.sum,
                        mean: &ours.norm.mean,
                        rstd: &ours.norm.rstd,
                        weight: Some(&w),
                    },
                    want_flags,
                )
                .expect("fused backward");
            let cpu = CPU
                .layer_norm_backward_add(
                    &LayerNormBackward {
                        g: &gc,
                        residual: residual.then_some(&rc),
                        x: &want.sum,
                        mean: &want.norm.mean,
                        rstd: &want.norm.rstd,
                        weight: Some(&wc),
                    },
                    want_flags,
                )
                .expect("cpu");
            let what = format!("{what} backward residual {residual} want {want_flags:?}");
            for (name, o, c) in [
                ("input", ours.input, cpu.input),
                ("g_xhat", ours.g_xhat, cpu.g_xhat),
            ] {
                match (o, c) {
                    (Some(o), Some(c)) => close(&format!("{what} {name}"), gpu, &o, &c),
                    (None, None) => {}
                    _ => panic!("{what} {name}: present on one backend only"),
                }
            }
        }
    }
}

pub fn pool_head_bce<D: Driver>(gpu: &CudaBackend<D>, batch: usize, scales: usize, width: usize) {
    let what = format!("pool_head_bce B {batch} S {scales} D {width}");
    let (h, hc) = pair(gpu, &[batch, scales, width], 10, (-2.0, 2.0), false);
    let (w, wc) = pair(gpu, &[1, width], 11, (-0.5, 0.5), false);
    let (b, bc) = pair(gpu, &[1], 12, (-0.5, 0.5), false);
    let y32: Vec<f32> = (0..batch).map(|i| ((i * 7) % 3) as f32 / 2.0).collect();
    let y64: Vec<f64> = y32.iter().map(|&v| f64::from(v)).collect();
    let y = gpu.upload(&y32, &[batch]).expect("targets");
    let yc = CpuTensor::from_vec(y64, &[batch]).expect("targets");
    let ours = gpu.pool_head_bce(&h, &w, &b, &y).expect("fused");
    let want = CPU.pool_head_bce(&hc, &wc, &bc, &yc).expect("cpu");
    close(&format!("{what} loss"), gpu, &ours.loss, &want.loss);
    close(&format!("{what} logits"), gpu, &ours.logits, &want.logits);

    let g = gpu.upload(&[1.5], &[]).expect("g");
    let gc = CpuTensor::from_vec(vec![1.5f64], &[]).expect("g");
    let grads = gpu
        .pool_head_bce_backward(&g, &h, &w, &ours.logits, &y)
        .expect("fused backward");
    let cpu = CPU
        .pool_head_bce_backward(&gc, &hc, &wc, &want.logits, &yc)
        .expect("cpu");
    close(&format!("{what} grad h"), gpu, &grads.h, &cpu.h);
    close(
        &format!("{what} grad weight"),
        gpu,
        &grads.weight,
        &cpu.weight,
    );
    close(&format!("{what} grad bias"), gpu, &grads.bias, &cpu.bias);
    // The weight's and bias's gradients are adjacent views of one buffer (zgrad adds them into
    // adjacent gradient buffers with one launch).
    assert!(
        grads.weight.shares_storage(&grads.bias)
            && grads.bias.layout().offset() == grads.weight.layout().offset() + width,
        "{what}: weight and bias gradients are not adjacent"
    );
    let again = gpu
        .pool_head_bce_backward(&g, &h, &w, &ours.logits, &y)
        .expect("again");
    for (a, b) in [(&grads.h, &again.h), (&grads.weight, &again.weight)] {
        let (a, b) = (gpu.download(a).unwrap(), gpu.download(b).unwrap());
        let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
        assert_eq!(bits(a), bits(b), "{what}: rerun not bitwise equal");
    }
}

macro_rules! fused_suite {
    ($backend:path) => {
        use rstest::rstest;
        use zcompute::Activation;

        #[rstest]
        fn bias_act(
            #[values(
                        &[1, 1][..], &[12, 5], &[17, 24], &[3, 12, 37], &[12, 256], &[7, 1025],
                        &[12, 1024], &[257, 1028], &[300, 3]
                    )]
            shape: &[usize],
            #[values(Activation::Identity, Activation::Tanh)] act: Activation,
            #[values(false, true)] view: bool,
        ) {
            super::bias_act(&$backend(), shape, act, view);
        }

        #[rstest]
        fn add_layer_norm(
            #[values(&[1, 1][..], &[12, 5], &[17, 24], &[2, 12, 256], &[3, 1025])]
            shape: &[usize],
            #[values(false, true)] view: bool,
        ) {
            super::add_layer_norm(&$backend(), shape, view);
        }

        #[rstest]
        fn pool_head_bce(
            #[values(1, 3, 33, 256, 301)] batch: usize,
            #[values(1, 12, 17)] scales: usize,
            #[values(5, 24, 256)] width: usize,
        ) {
            super::pool_head_bce(&$backend(), batch, scales, width);
        }
    };
}

mod mock_suite {
    fused_suite!(super::super::mock);
}

#[cfg(feature = "gpu")]
mod gpu_suite {
    fused_suite!(super::super::gpu);
}

/// The CPU backend's fused ops compute what their composites of the op set do (f64).
#[test]
fn cpu_fused_ops_equal_their_unfused_composition() {
    let t = |shape: &[usize], seed| {
        let n: usize = shape.iter().product();
        CpuTensor::from_vec(uniform(n, seed, -2.0, 2.0), shape).unwrap()
    };
    let (a, b, w, bias) = (t(&[3, 4, 7], 1), t(&[3, 4, 7], 2), t(&[7], 3), t(&[7], 4));
    let fused = CPU
        .add_layer_norm(&a, &b, Some(&w), Some(&bias), 1e-5)
        .unwrap();
    let sum = CPU.add(&a, &b).unwrap();
    let plain = CPU.layer_norm(&sum, Some(&w), Some(&bias), 1e-5).unwrap();
    assert_eq!(fused.sum.to_vec(), sum.to_vec());
    assert_eq!(fused.norm.out.to_vec(), plain.out.to_vec());

    let y = CPU.bias_act(&a, &w, Activation::Tanh).unwrap();
    let plain = CPU
        .unary(zcompute::UnaryOp::Tanh, &CPU.add(&a, &w).unwrap())
        .unwrap();
    assert_eq!(y.to_vec(), plain.to_vec());

    let (hw, hb) = (t(&[1, 7], 5), t(&[1], 6));
    let targets = CpuTensor::from_vec(vec![0.0, 1.0, 0.5], &[3]).unwrap();
    let out = CPU.pool_head_bce(&a, &hw, &hb, &targets).unwrap();
    let pooled = CPU.mean(&a, 1, false).unwrap();
    let opts = zcompute::MatmulOpts {
        trans_a: false,
        trans_b: true,
    };
    let logits = CPU
        .add(&CPU.matmul(&pooled, &hw, opts).unwrap(), &hb)
        .unwrap();
    let loss = CPU
        .bce_with_logits_mean(&logits.reshape(&[3]).unwrap(), &targets)
        .unwrap();
    let close = |x: Vec<f64>, y: Vec<f64>| {
        x.iter()
            .zip(&y)
            .all(|(p, q)| (p - q).abs() <= 1e-12 * q.abs().max(1.0))
    };
    assert!(close(out.logits.to_vec(), logits.to_vec()));
    assert!(close(out.loss.to_vec(), loss.to_vec()));
}
