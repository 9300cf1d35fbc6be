//! A Linear layer's backward under bf16 in one launch (`zc_linear_backward_bf16`, issue 42):
//! on the trainer's copies (`PrecisionOps::linear_backward_into_bf16`) one sample's backward
//! is one launch where its composite ran tanh's backward with the copy, the input's gradient,
//! and the parameter gradients. It promises the composite's bits (its halves sum in the order
//! of the kernels it replaces), and converting per call (`linear_backward_into_mode` under
//! bf16, the reference the trainer's copies are held to) gives the same bits, the bias's
//! sum included. The `mock` suite runs the bodies on the simulated device, the `gpu` suite
//! (feature `gpu`) on CUDA device 0, where the order of the sums is real; which kernels run is
//! pinned on the simulated device.

use super::precision::values;
use zcompute::prelude::*;
use zcompute::{Activation, BBf16, BTensor, Bf16Copy, CpuBackend, CudaBackend, CudaStorage};
use zcompute::{CudaTensor, MathMode, MatmulOpts, PrecisionOps};
use zdevice::Driver;

/// (rows, inputs, outputs): one sample's rows at the model's widths (four inputs a thread at
/// 256, one at 193), a single row, the row limit, and outputs the row kernels take (24: the
/// composite on every path).
const SHAPES: [(usize, usize, usize); 5] = [
    (12, 256, 96),
    (12, 193, 1024),
    (1, 64, 40),
    (32, 96, 256),
    (12, 256, 24),
];

/// What one backward wrote: gx (when asked for), dw and db, as bits.
#[derive(Debug, PartialEq, Eq)]
struct Written {
    gx: Option<Vec<u32>>,
    dw: Vec<u32>,
    db: Vec<u32>,
}

/// One case's inputs on a backend, and the buffers its gradients are added into (not zero:
/// the step's accumulated gradients).
struct Case<B: Backend<f32>> {
    gy: BTensor<B, f32>,
    y: BTensor<B, f32>,
    x: BTensor<B, f32>,
    w: BTensor<B, f32>,
    dw: BTensor<B, f32>,
    db: BTensor<B, f32>,
}

/// `unaligned`: gy and y are views one element into their buffers (as a slice of a wider
/// gradient is), so the device stages them on its scalar path.
fn case<B: Backend<f32>>(
    b: &B,
    (rows, ins, outs): (usize, usize, usize),
    seed: u64,
    unaligned: bool,
) -> Case<B> {
    let up = |n: usize, s: u64, lo, hi, shape: &[usize]| {
        b.upload(&values(n, seed + s, lo, hi), shape).unwrap()
    };
    let view = |s: u64, lo, hi| {
        let skip = usize::from(unaligned);
        up(skip + rows * outs, s, lo, hi, &[skip + rows * outs])
            .narrow(0, skip, rows * outs)
            .unwrap()
            .reshape(&[rows, outs])
            .unwrap()
    };
    Case {
        gy: view(1, -2.0, 2.0),
        y: view(2, -0.99, 0.99),
        x: up(rows * ins, 3, -1.0, 1.0, &[rows, ins]),
        w: up(outs * ins, 4, -0.3, 0.3, &[outs, ins]),
        dw: up(outs * ins, 5, -1.0, 1.0, &[outs, ins]),
        db: up(outs, 6, -1.0, 1.0, &[outs]),
    }
}

fn bits<B: Backend<f32>>(b: &B, t: &BTensor<B, f32>) -> Vec<u32> {
    b.download(t).unwrap().iter().map(|v| v.to_bits()).collect()
}

/// The three ways to run the backward on one backend: the copies' one call, the copies'
/// composite step by step (the provided body's steps), and converting per call.
#[derive(Clone, Copy, Debug)]
enum Path {
    Copies,
    CopiesStepwise,
    PerCall,
}

fn run<B: PrecisionOps<f32>>(
    b: &B,
    c: &Case<B>,
    act: Activation,
    with_gx: bool,
    path: Path,
) -> Written {
    let y = (act == Activation::Tanh).then_some(&c.y);
    let (xc, wc) = (b.bf16_copy_of(&c.x).unwrap(), b.bf16_copy_of(&c.w).unwrap());
    let wc: Option<&BBf16<B, f32>> = with_gx.then_some(&wc);
    let gx = match path {
        Path::Copies => b
            .linear_backward_into_bf16(&c.gy, &xc, wc, (act, y), (&c.dw, Some(&c.db)))
            .unwrap(),
        Path::CopiesStepwise => {
            let (gz, gz_copy) = match y {
                Some(y) => b.tanh_backward_bf16(&c.gy, y).unwrap(),
                None => (c.gy.clone(), b.bf16_copy_of(&c.gy).unwrap()),
            };
            let gx = wc.map(|w| b.matmul_bf16(&gz_copy, w, MatmulOpts::default()).unwrap());
            b.linear_param_grads_into_bf16(&gz, &gz_copy, &xc, &c.dw, Some(&c.db))
                .unwrap();
            gx
        }
        Path::PerCall => b
            .linear_backward_into_mode(
                &c.gy,
                &c.x,
                with_gx.then_some(&c.w),
                (act, y),
                (&c.dw, Some(&c.db)),
                MathMode::Bf16,
            )
            .unwrap(),
    };
    assert_eq!(
        gx.is_some(),
        with_gx,
        "{path:?}: gx returned when asked for"
    );
    Written {
        gx: gx.map(|g| bits(b, &g)),
        dw: bits(b, &c.dw),
        db: bits(b, &c.db),
    }
}

/// Every shape, identity and tanh, with and without the input's gradient: the one call on
/// copies, its steps one by one, and the per-call conversion write the same bits (gx, dw
/// and db, onto buffers that already hold gradients), on the device and on the CPU; and the
/// device's are bf16 products (not float32's: the CPU's float32 backward differs).
pub fn the_bf16_backward_on_copies_equals_its_steps_and_per_call_bitwise<D: Driver>(
    gpu: &CudaBackend<D>,
) {
    let cases = SHAPES
        .iter()
        .enumerate()
        .flat_map(|c| [(c, false), (c, true)]);
    for ((s, &shape), unaligned) in cases {
        for act in [Activation::Identity, Activation::Tanh] {
            for with_gx in [true, false] {
                let what = format!("{shape:?} {act:?} gx {with_gx} unaligned {unaligned}");
                let seed = 10 * s as u64;
                let on_device =
                    |path| run(gpu, &case(gpu, shape, seed, unaligned), act, with_gx, path);
                let copies = on_device(Path::Copies);
                assert_eq!(
                    copies,
                    on_device(Path::CopiesStepwise),
                    "{what}: device, stepwise"
                );
                assert_eq!(copies, on_device(Path::PerCall), "{what}: device, per call");
                let cpu = CpuBackend;
                let on_cpu = |path| {
                    run(
                        &cpu,
                        &case(&cpu, shape, seed, unaligned),
                        act,
                        with_gx,
                        path,
                    )
                };
                let cpu_copies = on_cpu(Path::Copies);
                assert_eq!(
                    cpu_copies,
                    on_cpu(Path::CopiesStepwise),
                    "{what}: cpu, stepwise"
                );
                assert_eq!(cpu_copies, on_cpu(Path::PerCall), "{what}: cpu, per call");
                // The device's bf16 dw is near the CPU's bf16 emulation and far from float32's.
                let dw_dev: Vec<f32> = copies.dw.iter().map(|b| f32::from_bits(*b)).collect();
                let dw_cpu: Vec<f32> = cpu_copies.dw.iter().map(|b| f32::from_bits(*b)).collect();
                let c = case(&cpu, shape, seed, unaligned);
                let y = (act == Activation::Tanh).then_some(&c.y);
                cpu.linear_backward_into(&c.gy, &c.x, None, (act, y), (&c.dw, None))
                    .unwrap();
                let dw_f32 = cpu.download(&c.dw).unwrap();
                let largest = |a: &[f32], b: &[f32]| {
                    a.iter()
                        .zip(b)
                        .map(|(p, q)| (f64::from(*p) - f64::from(*q)).abs())
                        .fold(0.0, f64::max)
                };
                let (near, far) = (largest(&dw_dev, &dw_cpu), largest(&dw_dev, &dw_f32));
                assert!(
                    near < 1e-4 && far > 1e-3,
                    "{what}: device dw {near:e} from the CPU's bf16, {far:e} from float32"
                );
            }
        }
    }
}

/// Bad input to the one call leaves the buffers untouched: a copy of another shape, a tanh
/// without its saved output.
pub fn a_refused_bf16_backward_writes_nothing<D: Driver>(gpu: &CudaBackend<D>) {
    let c = case(gpu, (12, 256, 96), 70, false);
    let (dw0, db0) = (bits(gpu, &c.dw), bits(gpu, &c.db));
    let wrong_x = gpu
        .bf16_copy_of(
            &gpu.upload(&values(12 * 255, 1, -1.0, 1.0), &[12, 255])
                .unwrap(),
        )
        .unwrap();
    let w = gpu.bf16_copy_of(&c.w).unwrap();
    let x = gpu.bf16_copy_of(&c.x).unwrap();
    let refused: [(
        &str,
        &Bf16Copy<CudaStorage>,
        Option<&CudaTensor>,
        Activation,
    ); 2] = [
        (
            "a copy of x of another width",
            &wrong_x,
            None,
            Activation::Identity,
        ),
        ("tanh without y", &x, None, Activation::Tanh),
    ];
    for (what, x, y, act) in refused {
        let r = gpu.linear_backward_into_bf16(&c.gy, x, Some(&w), (act, y), (&c.dw, Some(&c.db)));
        assert!(r.is_err(), "{what}: refused");
        assert_eq!(bits(gpu, &c.dw), dw0, "{what}: dw untouched");
        assert_eq!(bits(gpu, &c.db), db0, "{what}: db untouched");
    }
}

macro_rules! linear_backward_bf16_suite {
    ($backend:path) => {
        #[test]
        fn the_bf16_backward_on_copies_equals_its_steps_and_per_call_bitwise() {
            super::the_bf16_backward_on_copies_equals_its_steps_and_per_call_bitwise(&$backend());
        }

        #[test]
        fn a_refused_bf16_backward_writes_nothing() {
            super::a_refused_bf16_backward_writes_nothing(&$backend());
        }
    };
}

mod mock_suite {
    linear_backward_bf16_suite!(super::super::mock);
}

#[cfg(feature = "gpu")]
mod gpu {
    linear_backward_bf16_suite!(super::super::gpu);
}

/// Which kernels run, on the simulated device: one sample's backward on copies is one launch
/// of `zc_linear_backward_bf16`; outputs the row kernels take keep the composite; converting
/// per call runs tanh's backward, the input's gradient, and the parameter gradients with the
/// bias's sum inside (the sum the one launch makes).
mod launches {
    use super::{Case, case};
    use zcompute::cuda::Kernel;
    use zcompute::prelude::*;
    use zcompute::{Activation, CudaBackend, MathMode};
    use zdevice::SimDriver;

    use super::super::{KernelLog as Log, observed};

    fn ran(
        gpu: &CudaBackend<SimDriver>,
        c: &Case<CudaBackend<SimDriver>>,
        log: &Log,
    ) -> Vec<Kernel> {
        gpu.download(&c.db).expect("the stream runs");
        log.lock().unwrap().drain(..).collect()
    }

    #[test]
    fn a_bf16_backward_on_copies_is_one_launch() {
        let (gpu, log) = observed();
        let tanh = Activation::Tanh;
        for (outs, want) in [
            (96, vec![Kernel::LinearBackwardBf16]),
            (
                24,
                vec![
                    Kernel::TanhBackwardBf16,
                    Kernel::LinearRowsNMajorBf16,
                    Kernel::LinearRowsNMajorBf16,
                    Kernel::ReduceCols,
                ],
            ),
        ] {
            let c = case(&gpu, (12, 256, outs), 1, false);
            let (x, w) = (
                gpu.bf16_copy_of(&c.x).unwrap(),
                gpu.bf16_copy_of(&c.w).unwrap(),
            );
            ran(&gpu, &c, &log);
            gpu.linear_backward_into_bf16(
                &c.gy,
                &x,
                Some(&w),
                (tanh, Some(&c.y)),
                (&c.dw, Some(&c.db)),
            )
            .unwrap();
            assert_eq!(ran(&gpu, &c, &log), want, "{outs} outputs");
        }
    }

    #[test]
    fn a_bf16_backward_per_call_sums_the_bias_with_the_weight() {
        let (gpu, log) = observed();
        let c = case(&gpu, (12, 256, 96), 2, false);
        ran(&gpu, &c, &log);
        gpu.linear_backward_into_mode(
            &c.gy,
            &c.x,
            Some(&c.w),
            (Activation::Tanh, Some(&c.y)),
            (&c.dw, Some(&c.db)),
            MathMode::Bf16,
        )
        .unwrap();
        assert_eq!(
            ran(&gpu, &c, &log),
            vec![
                Kernel::TanhBackward,
                Kernel::LinearRowsNMajorBf16,
                Kernel::LinearParamGradsBf16
            ]
        );
    }
}
