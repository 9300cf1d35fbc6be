//! `Backend::linear_backward_into` (a Linear layer's backward: tanh's backward, the input's
//! gradient, the weight's and bias's gradients added into views of one flat buffer) on a CUDA
//! backend against the CPU backend in f64, poison on: rows 1, 5, 12, the small-row limit and
//! one past it (the composite), odd and one-wide widths and the model's, identity and tanh,
//! with or without the bias buffer and the input's gradient, dense and transposed (strided)
//! gradients, the flat buffer 16-byte aligned or one float off (the kernel's scalar path). Per
//! tensor ||ours - f64|| / ||f64|| within 1e-5, the whole flat buffer compared (nothing outside
//! dw and db is written); the fused launch equals the three-launch composite (bitwise on
//! the simulated device) and two runs are bitwise equal. Bad arguments get the CPU's typed error before anything is
//! written. The `mock` suite runs on the simulated device, the `gpu` suite (feature `gpu`) on
//! CUDA device 0. Which launches ran is pinned by `linear_launch.rs`.

use super::fused::{close, pair};
use zcompute::{Activation, Backend, CpuBackend, CudaBackend, CudaTensor, MatmulOpts};
use zdevice::Driver;

const CPU: CpuBackend = CpuBackend;

/// Which outputs a case asks for.
#[derive(Clone, Copy, Debug)]
pub enum Wants {
    /// The input's gradient and both parameter gradients.
    All,
    /// No bias buffer.
    NoBias,
    /// No input gradient (the first layer of a model).
    NoDx,
}

/// A case's inputs on the device.
struct Inputs {
    gy: CudaTensor,
    x: CudaTensor,
    w: CudaTensor,
    y: Option<CudaTensor>,
}

/// The flat gradient buffer's layout: `dw [outs, ins]` at `offset`, then `db [outs]` right
/// after it, then 3 spare floats that must keep their values.
fn flat_views(flat: &CudaTensor, offset: usize, (ins, outs): (usize, usize)) -> [CudaTensor; 2] {
    let dw = flat.narrow(0, offset, outs * ins).unwrap();
    [
        dw.reshape(&[outs, ins]).unwrap(),
        flat.narrow(0, offset + outs * ins, outs).unwrap(),
    ]
}

/// The three launches the fused op replaces, on the same device.
fn composite<D: Driver>(
    gpu: &CudaBackend<D>,
    i: &Inputs,
    wants: Wants,
    (dw, db): (&CudaTensor, Option<&CudaTensor>),
) -> Option<CudaTensor> {
    let gz = match &i.y {
        Some(y) => gpu.tanh_backward(&i.gy, y).unwrap(),
        None => i.gy.clone(),
    };
    let gx = (!matches!(wants, Wants::NoDx))
        .then(|| gpu.matmul(&gz, &i.w, MatmulOpts::default()).unwrap());
    gpu.linear_param_grads_into(&gz, &i.x, dw, db).unwrap();
    gx
}

#[allow(clippy::too_many_arguments)]
pub fn backward<D: Driver>(
    gpu: &CudaBackend<D>,
    rows: usize,
    (ins, outs): (usize, usize),
    act: Activation,
    wants: Wants,
    strided: bool,
    offset: usize,
    exact: bool,
) {
    let what = format!(
        "linear backward rows {rows} in {ins} out {outs} {act:?} {wants:?} strided {strided} offset {offset}"
    );
    let tanh = act == Activation::Tanh;
    let (gy, gyc) = pair(gpu, &[rows, outs], 31, (-1.0, 1.0), strided);
    let (x, xc) = pair(gpu, &[rows, ins], 32, (-2.0, 2.0), false);
    let (w, wc) = pair(gpu, &[outs, ins], 33, (-0.5, 0.5), false);
    let (y, yc) = pair(gpu, &[rows, outs], 34, (-0.95, 0.95), strided);
    let len = offset + outs * ins + outs + 3;
    let (flat0, flatc) = pair(gpu, &[len], 35, (-0.5, 0.5), false);
    let init = gpu.download(&flat0).unwrap();
    let inputs = Inputs {
        gy,
        x,
        w,
        y: tanh.then_some(y),
    };
    let with_db = !matches!(wants, Wants::NoBias);
    let with_dx = !matches!(wants, Wants::NoDx);
    let run = || {
        let flat = gpu.upload(&init, &[len]).unwrap();
        let [dw, db] = flat_views(&flat, offset, (ins, outs));
        let gx = gpu
            .linear_backward_into(
                &inputs.gy,
                &inputs.x,
                with_dx.then_some(&inputs.w),
                (act, inputs.y.as_ref()),
                (&dw, with_db.then_some(&db)),
            )
            .expect("linear_backward_into");
        assert_eq!(
            gx.is_some(),
            with_dx,
            "{what}: gx given exactly when wanted"
        );
        (gx, flat)
    };
    let (gx, flat) = run();
    // The f64 reference: the CPU backend's composite.
    let hdw = flatc.narrow(0, offset, outs * ins).unwrap();
    let hdw = hdw.reshape(&[outs, ins]).unwrap();
    let hdb = flatc.narrow(0, offset + outs * ins, outs).unwrap();
    let want_gx = CPU
        .linear_backward_into(
            &gyc,
            &xc,
            with_dx.then_some(&wc),
            (act, tanh.then_some(&yc)),
            (&hdw, with_db.then_some(&hdb)),
        )
        .expect("cpu");
    if let (Some(gx), Some(want)) = (&gx, &want_gx) {
        close(&format!("{what} gx"), gpu, gx, want);
    }
    let [dw, db] = flat_views(&flat, offset, (ins, outs));
    close(&format!("{what} dw"), gpu, &dw, &hdw);
    close(&format!("{what} db"), gpu, &db, &hdb);
    close(&format!("{what} flat"), gpu, &flat, &flatc);
    // Reruns are bitwise equal, and so is the composite the fused launch replaces (`exact`).
    let bits = |t: &CudaTensor| -> Vec<u32> {
        gpu.download(t)
            .unwrap()
            .into_iter()
            .map(f32::to_bits)
            .collect()
    };
    let (gx2, flat2) = run();
    assert_eq!(bits(&flat), bits(&flat2), "{what}: rerun");
    assert_eq!(
        gx.as_ref().map(bits),
        gx2.as_ref().map(bits),
        "{what}: gx rerun"
    );
    let flat3 = gpu.upload(&init, &[len]).unwrap();
    let [dw3, db3] = flat_views(&flat3, offset, (ins, outs));
    let gx3 = composite(gpu, &inputs, wants, (&dw3, with_db.then_some(&db3)));
    if exact {
        assert_eq!(bits(&flat), bits(&flat3), "{what}: composite's dw, db");
        assert_eq!(
            gx.as_ref().map(bits),
            gx3.as_ref().map(bits),
            "{what}: composite's gx"
        );
    } else {
        // Same sums in the same order; on the GPU ptxas may contract tanh's derivative
        // differently in the two kernels, so the composite is held to the f64 budget.
        close(&format!("{what} composite flat"), gpu, &flat3, &flatc);
        if let (Some(gx3), Some(want)) = (&gx3, &want_gx) {
            close(&format!("{what} composite gx"), gpu, gx3, want);
        }
    }
}

/// `$exact`: the fused launch must equal the composite bitwise (the simulated twins run the
/// same f32 operations in the same order).
macro_rules! linear_backward_suite {
    ($backend:path, $exact:expr) => {
        use super::super::linear::ROWS;
        use super::super::linear_backward::Wants;
        use rstest::rstest;
        use zcompute::Activation;

        /// (in, out): one-wide, odd, the feed-forward block's shapes.
        const WIDTHS: [(usize, usize); 5] = [(1, 1), (37, 5), (193, 256), (256, 1024), (1024, 256)];

        #[rstest]
        fn backward(
            #[values(0, 1, 2, 3, 4)] rows: usize,
            #[values(0, 1, 2, 3, 4)] width: usize,
            #[values(Activation::Identity, Activation::Tanh)] act: Activation,
            #[values(Wants::All, Wants::NoBias, Wants::NoDx)] wants: Wants,
        ) {
            super::super::linear_backward::backward(
                &$backend(),
                ROWS[rows],
                WIDTHS[width],
                act,
                wants,
                false,
                0,
                $exact,
            );
        }

        /// Strided (transposed) gradient and output, and a flat buffer one float off 16 bytes.
        #[rstest]
        fn backward_strided_or_unaligned(
            #[values(0, 2, 4)] rows: usize,
            #[values((37, 5), (256, 64))] width: (usize, usize),
            #[values(Activation::Identity, Activation::Tanh)] act: Activation,
            #[values((true, 0), (false, 1), (true, 1))] layout: (bool, usize),
        ) {
            super::super::linear_backward::backward(
                &$backend(),
                ROWS[rows],
                width,
                act,
                Wants::All,
                layout.0,
                layout.1,
                $exact,
            );
        }
    };
}

mod mock_suite {
    linear_backward_suite!(super::super::mock, true);
}

#[cfg(feature = "gpu")]
mod gpu {
    linear_backward_suite!(super::super::gpu, false);
}

/// Bad arguments get the same typed error on the CPU and on the device, and leave the
/// gradient buffers as they were.
#[test]
fn bad_arguments_get_the_same_typed_error_on_both_backends() {
    use zcompute::ComputeError as E;
    let gpu = super::mock();
    let dev = |shape: &[usize]| gpu.zeros(shape).unwrap();
    let host = |shape: &[usize]| Backend::<f32>::zeros(&CPU, shape).unwrap();
    type Shapes<'a> = (
        &'a [usize],
        &'a [usize],
        &'a [usize],
        Activation,
        Option<&'a [usize]>,
    );
    type Case<'a> = (Shapes<'a>, fn(&E) -> bool);
    // (g, x, w, act, y) against dw [7, 5] and db [7].
    let cases: [Case<'_>; 6] = [
        (
            (&[3, 7], &[3, 5], &[7, 6], Activation::Identity, None),
            |e| matches!(e, E::ShapeMismatch { .. }),
        ),
        (
            (&[3, 7], &[4, 5], &[7, 5], Activation::Identity, None),
            |e| matches!(e, E::ShapeMismatch { .. }),
        ),
        (
            (&[3, 7], &[3, 5], &[7, 5], Activation::Tanh, Some(&[3, 6])),
            |e| matches!(e, E::ShapeMismatch { .. }),
        ),
        ((&[3, 7], &[3, 5], &[7, 5], Activation::Tanh, None), |e| {
            matches!(e, E::Unsupported { .. })
        }),
        (
            (
                &[3, 7],
                &[3, 5],
                &[7, 5],
                Activation::Identity,
                Some(&[3, 7]),
            ),
            |e| matches!(e, E::Unsupported { .. }),
        ),
        (
            (&[2, 3, 7], &[3, 5], &[7, 5], Activation::Identity, None),
            |e| matches!(e, E::Unsupported { .. }),
        ),
    ];
    for ((g, x, w, act, y), kind) in cases {
        let (dw, db) = (dev(&[7, 5]), dev(&[7]));
        gpu.fill(&dw, 1.0).unwrap();
        let d = gpu
            .linear_backward_into(
                &dev(g),
                &dev(x),
                Some(&dev(w)),
                (act, y.map(dev).as_ref()),
                (&dw, Some(&db)),
            )
            .unwrap_err();
        let c = CPU
            .linear_backward_into(
                &host(g),
                &host(x),
                Some(&host(w)),
                (act, y.map(host).as_ref()),
                (&host(&[7, 5]), Some(&host(&[7]))),
            )
            .unwrap_err();
        assert_eq!(d, c, "{g:?} {x:?} {w:?} {act:?} {y:?}");
        assert!(kind(&d), "{d}");
        assert_eq!(gpu.download(&dw).unwrap(), vec![1.0; 35], "dw untouched");
    }
    // dw and db as views of one flat buffer: adjacent is fine, overlapping is refused on both
    // backends; dw in the memory of an input (the weight, tanh's output) is refused.
    let check_flat = |db_start: usize| {
        let (flat, hflat) = (dev(&[40]), host(&[40]));
        let dw = flat.narrow(0, 0, 28).unwrap().reshape(&[7, 4]).unwrap();
        let db = flat.narrow(0, db_start, 7).unwrap();
        let hdw = hflat.narrow(0, 0, 28).unwrap().reshape(&[7, 4]).unwrap();
        let hdb = hflat.narrow(0, db_start, 7).unwrap();
        let (g, x, w, y) = (dev(&[3, 7]), dev(&[3, 4]), dev(&[7, 4]), dev(&[3, 7]));
        let d = gpu
            .linear_backward_into(
                &g,
                &x,
                Some(&w),
                (Activation::Tanh, Some(&y)),
                (&dw, Some(&db)),
            )
            .map(|gx| gx.map(|t| t.shape().to_vec()));
        let (hg, hx, hw, hy) = (host(&[3, 7]), host(&[3, 4]), host(&[7, 4]), host(&[3, 7]));
        let c = CPU
            .linear_backward_into(
                &hg,
                &hx,
                Some(&hw),
                (Activation::Tanh, Some(&hy)),
                (&hdw, Some(&hdb)),
            )
            .map(|gx| gx.map(|t| t.shape().to_vec()));
        assert_eq!(d, c, "db at {db_start}");
        d
    };
    assert_eq!(check_flat(28), Ok(Some(vec![3, 4])));
    assert!(matches!(
        check_flat(27),
        Err(E::Aliased {
            lhs: "dw",
            rhs: "db",
            ..
        })
    ));
    let w = dev(&[7, 4]);
    let (g, x) = (dev(&[3, 7]), dev(&[3, 4]));
    let e = gpu
        .linear_backward_into(&g, &x, Some(&w), (Activation::Identity, None), (&w, None))
        .unwrap_err();
    assert!(
        matches!(
            e,
            E::Aliased {
                lhs: "w",
                rhs: "dw",
                ..
            }
        ),
        "{e}"
    );
    let flat = dev(&[21 + 28]);
    let y_in_flat = flat.narrow(0, 0, 21).unwrap().reshape(&[3, 7]).unwrap();
    let dw = flat.narrow(0, 21, 28).unwrap().reshape(&[7, 4]).unwrap();
    let e = gpu
        .linear_backward_into(
            &g,
            &x,
            None,
            (Activation::Tanh, Some(&y_in_flat)),
            (&dw, None),
        )
        .unwrap_err();
    assert!(
        matches!(
            e,
            E::Aliased {
                lhs: "y",
                rhs: "dw",
                ..
            }
        ),
        "{e}"
    );
}
