//! `LinearOps::linear_backward_into` (a Linear layer's backward: tanh's backward, the input's
//! gradient, the weight's and bias's gradients added into views of one flat buffer) on a CUDA
//! backend against the CPU backend in f64, poison on: rows 1, 5, 12, the small-row limit and
//! one past it (the composite), 100 and 3072 (tanh's backward adding the bias gradient), odd and one-wide widths and the model's, identity and tanh,
//! with or without the bias buffer and the input's gradient, dense and transposed (strided)
//! gradients, the flat buffer 16-byte aligned or one float off (the kernel's scalar path). Per
//! tensor ||ours - f64|| / ||f64|| within 1e-5, the whole flat buffer compared (nothing outside
//! dw and db is written); the fused launch equals the three-launch composite (bitwise on
//! the simulated device) and two runs are bitwise equal; one sample's feed-forward block
//! (forward with the residual epilogue, both layers' backward) captured and replayed equals it
//! run eagerly. The `mock` suite runs on the simulated device, the `gpu` suite (feature `gpu`)
//! on CUDA device 0. Which launches ran: `linear_launch.rs`; bad arguments:
//! `linear_backward_errors.rs`.

use super::fused::{close, pair};
use zcompute::prelude::*;
use zcompute::{Activation, Backend, Capture, CpuBackend, CudaBackend, CudaTensor, MatmulOpts};
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
/// One sample's feed-forward block, forward and backward, written into `[out, gx1, grads]`:
/// `f1` with tanh, `f2` with the residual in its epilogue, then both layers' backward into
/// views of one flat gradient buffer (`f1` without the input's gradient).
fn block_step<D: Driver>(
    be: &CudaBackend<D>,
    [u, h, w1, b1, w2, b2]: [&CudaTensor; 6],
    [out, gx1, grads]: [&CudaTensor; 3],
) -> zcompute::Result<()> {
    let (hidden, width) = (w1.shape()[0], w1.shape()[1]);
    let a = be.linear(u, w1, b1, Activation::Tanh)?;
    let y = be.linear_add(&a, w2, b2, Activation::Identity, h)?;
    be.copy_into(&y, out)?;
    let view = |at: usize, shape: &[usize]| -> zcompute::Result<CudaTensor> {
        grads.narrow(0, at, shape.iter().product())?.reshape(shape)
    };
    let (dw2, db2) = (view(0, &[width, hidden])?, view(width * hidden, &[width])?);
    let at = width * hidden + width;
    let (dw1, db1) = (
        view(at, &[hidden, width])?,
        view(at + hidden * width, &[hidden])?,
    );
    let ga = be
        .linear_backward_into(
            &y,
            &a,
            Some(w2),
            (Activation::Identity, None),
            (&dw2, Some(&db2)),
        )?
        .expect("dX asked for");
    be.copy_into(&ga, gx1)?;
    let none = be.linear_backward_into(
        &ga,
        u,
        None,
        (Activation::Tanh, Some(&a)),
        (&dw1, Some(&db1)),
    )?;
    assert!(none.is_none());
    Ok(())
}

/// [`block_step`] captured, then replayed with fresh inputs: each replay equals the same ops
/// run eagerly, bitwise.
pub fn replay_matches_eager<D: Driver>(gpu: &CudaBackend<D>) {
    let (rows, width, hidden) = (12, 37, 64);
    let (u, _) = pair(gpu, &[rows, width], 41, (-1.0, 1.0), false);
    let (h, _) = pair(gpu, &[rows, width], 42, (-1.0, 1.0), false);
    let (w1, _) = pair(gpu, &[hidden, width], 43, (-0.5, 0.5), false);
    let (b1, _) = pair(gpu, &[hidden], 44, (-0.5, 0.5), false);
    let (w2, _) = pair(gpu, &[width, hidden], 45, (-0.5, 0.5), false);
    let (b2, _) = pair(gpu, &[width], 46, (-0.5, 0.5), false);
    let len = 2 * width * hidden + width + hidden;
    let bufs = || [&[rows, width][..], &[rows, hidden], &[len]].map(|s| gpu.zeros(s).unwrap());
    let captured = bufs();
    let ins = [&u, &h, &w1, &b1, &w2, &b2];
    let body = {
        let (be, ins, c) = (gpu.clone(), ins.map(CudaTensor::clone), captured.clone());
        Box::new(move || {
            block_step(
                &be,
                [&ins[0], &ins[1], &ins[2], &ins[3], &ins[4], &ins[5]],
                [&c[0], &c[1], &c[2]],
            )
        })
    };
    let mut graph = gpu.capture(body).expect("capture");
    for r in 0..3u64 {
        let (fresh, _) = pair(gpu, &[rows, width], 50 + r, (-1.0, 1.0), false);
        gpu.copy_into(&fresh, &u).expect("refill");
        for t in &captured {
            gpu.fill(t, 0.0).expect("reset");
        }
        gpu.replay(&mut graph).expect("replay");
        let eager = bufs();
        block_step(gpu, ins, [&eager[0], &eager[1], &eager[2]]).expect("eager");
        for (i, (c, e)) in captured.iter().zip(&eager).enumerate() {
            let bits = |t: &CudaTensor| -> Vec<u32> {
                gpu.download(t)
                    .unwrap()
                    .into_iter()
                    .map(f32::to_bits)
                    .collect()
            };
            assert_eq!(bits(c), bits(e), "replay {r} output {i}");
        }
    }
}

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

        /// More rows than the small-row kernel takes (the composite, where tanh's backward
        /// adds the bias gradient's column sums in its own launch once the sums take several
        /// chunks: 100 rows make 3, a batch's 3072 up to 96).
        #[rstest]
        #[case(100, (256, 1024))]
        #[case(100, (1024, 256))]
        #[case(100, (37, 5))]
        #[case(3072, (37, 5))]
        #[case(3072, (256, 1024))]
        fn backward_batch(
            #[case] rows: usize,
            #[case] width: (usize, usize),
            #[values(Activation::Identity, Activation::Tanh)] act: Activation,
            #[values(Wants::All, Wants::NoBias)] wants: Wants,
        ) {
            super::super::linear_backward::backward(
                &$backend(),
                rows,
                width,
                act,
                wants,
                false,
                0,
                $exact,
            );
        }

        #[test]
        fn replay_matches_eager() {
            super::super::linear_backward::replay_matches_eager(&$backend());
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
