//! Capture bodies: a captured sequence replayed with fresh inputs equals eager execution, and
//! failures inside `capture` leave the backend eager.

use super::bodies::{TOL, View, assert_close, input};
use crate::common::uniform;
use zcompute::{
    AdamWConfig, Backend, Capture, ComputeError, CpuBackend, CpuTensor, CudaBackend, CudaTensor,
    MatmulOpts, UnaryOp,
};
use zdevice::Driver;

const CPU: CpuBackend = CpuBackend;

/// The sequence under test: `out = layer_norm(softmax(gelu(x · wᵀ + b)) + x)` summed over
/// axis 0 next to it, written into preallocated outputs. Generic over the backend so the
/// CPU computes the same thing eagerly.
fn sequence<B: Backend<f32>>(
    be: &B,
    x: &zcompute::BTensor<B, f32>,
    w: &zcompute::BTensor<B, f32>,
    bias: &zcompute::BTensor<B, f32>,
    out: &zcompute::BTensor<B, f32>,
    col: &zcompute::BTensor<B, f32>,
) -> zcompute::Result<()> {
    let opts = MatmulOpts {
        trans_a: false,
        trans_b: true,
    };
    let h = be.add(&be.matmul(x, w, opts)?, bias)?;
    let s = be.softmax_last(&be.unary(UnaryOp::Gelu, &h)?)?;
    let y = be.layer_norm(&be.add(&s, x)?, None, None, 1e-5)?.out;
    be.copy_into(&y, out)?;
    be.copy_into(&be.sum(&y.transpose(0, 1)?, 1, false)?, col)
}

pub fn replay_matches_eager<D: Driver>(gpu: &CudaBackend<D>, replays: u64) {
    let (rows, n) = (7, 33);
    let x = input(gpu, &[rows, n], View::Dense, 40, -1.0, 1.0);
    let w = input(gpu, &[n, n], View::Dense, 41, -0.5, 0.5);
    let bias = input(gpu, &[n], View::Dense, 42, -0.5, 0.5);
    let out = gpu.zeros(&[rows, n]).expect("out");
    let col = gpu.zeros(&[n]).expect("col");
    let wc = input(&CPU, &[n, n], View::Dense, 41, -0.5, 0.5);
    let bc = input(&CPU, &[n], View::Dense, 42, -0.5, 0.5);

    let body = {
        let (be, x, w, bias, out, col) = (
            gpu.clone(),
            x.clone(),
            w.clone(),
            bias.clone(),
            out.clone(),
            col.clone(),
        );
        Box::new(move || sequence(&be, &x, &w, &bias, &out, &col))
    };
    let mut graph = gpu.capture(body).expect("capture");
    assert!(graph.nodes() > 0, "the graph captured nothing");
    for r in 0..replays {
        let fresh: Vec<f32> = uniform(rows * n, 100 + r, -1.0, 1.0)
            .iter()
            .map(|&v| v as f32)
            .collect();
        gpu.upload_into(&fresh, &x).expect("refill the input");
        gpu.fill(&out, f32::NAN).expect("poison the output");
        gpu.replay(&mut graph).expect("replay");
        let xc = CpuTensor::from_vec(fresh, &[rows, n]).expect("x");
        let (oc, cc) = (
            Backend::<f32>::zeros(&CPU, &[rows, n]).expect("o"),
            Backend::<f32>::zeros(&CPU, &[n]).expect("c"),
        );
        sequence(&CPU, &xc, &wc, &bc, &oc, &cc).expect("cpu");
        assert_close(&format!("replay {r} out"), gpu, &out, &oc, TOL);
        assert_close(&format!("replay {r} col"), gpu, &col, &cc, TOL);
    }
    assert_eq!(graph.replays(), replays);
    drop(graph);
    // Eager still works after the graph is gone.
    let eager = gpu.unary(UnaryOp::Neg, &x).expect("eager after drop");
    assert_eq!(eager.numel(), rows * n);
}

pub fn failures_leave_eager_working<D: Driver>(gpu: &CudaBackend<D>) {
    let x = input(gpu, &[5, 5], View::Dense, 50, -1.0, 1.0);
    // An upload inside the body is refused by name.
    let (be, xx) = (gpu.clone(), x.clone());
    let err = gpu
        .capture(Box::new(move || {
            let _ = be.unary(UnaryOp::Tanh, &xx)?;
            be.upload(&[1.0; 4], &[4]).map(|_| ())
        }))
        .expect_err("an upload inside capture");
    assert!(
        matches!(err, ComputeError::CaptureIllegal { op: "upload", .. }),
        "{err}"
    );
    // A download and a sync likewise.
    let (be, xx) = (gpu.clone(), x.clone());
    let err = gpu
        .capture(Box::new(move || be.download(&xx).map(|_| ())))
        .expect_err("a download inside capture");
    assert!(matches!(err, ComputeError::CaptureIllegal { .. }), "{err}");
    // A body that allocates more under capture than in its warm-up exhausts the reservation.
    let (be, xx) = (gpu.clone(), x.clone());
    let mut runs = 0;
    let err = gpu
        .capture(Box::new(move || {
            runs += 1;
            let mut y = be.unary(UnaryOp::Exp, &xx)?;
            for _ in 1..runs * 3 {
                y = be.unary(UnaryOp::Exp, &y)?;
            }
            Ok(())
        }))
        .expect_err("a body that grows under capture");
    assert!(
        matches!(err, ComputeError::CaptureReservationExhausted { .. }),
        "{err:?}"
    );
    assert!(!err.is_out_of_memory(), "{err:?}");
    // Nothing is left half-captured: eager work, uploads and downloads all run.
    let y = gpu.unary(UnaryOp::Neg, &x).expect("eager after failures");
    let back = gpu.download(&y).expect("download after failures");
    let want: Vec<f32> = gpu.download(&x).expect("x").iter().map(|v| -v).collect();
    assert_eq!(back, want);
    let t = gpu
        .upload(&[1.0, 2.0], &[2])
        .expect("upload after failures");
    assert_eq!(gpu.download(&t).expect("download"), vec![1.0, 2.0]);
    gpu.synchronize().expect("sync after failures");
}

/// A captured optimiser step replays with the learning rate and step count current in the slot.
pub fn adamw_replay_reads_slot<D: Driver>(gpu: &CudaBackend<D>) {
    let cfg = AdamWConfig {
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.1,
    };
    let n = 37;
    let p = input(gpu, &[n], View::Dense, 60, -1.0, 1.0);
    let m = gpu.zeros(&[n]).expect("m");
    let v = gpu.zeros(&[n]).expect("v");
    let g = input(gpu, &[n], View::Dense, 61, -1.0, 1.0);
    let slot = gpu.upload(&[0.01, 1.0], &[2]).expect("slot");
    let (pc, mc, vc) = (
        input(&CPU, &[n], View::Dense, 60, -1.0, 1.0),
        Backend::<f32>::zeros(&CPU, &[n]).expect("m"),
        Backend::<f32>::zeros(&CPU, &[n]).expect("v"),
    );
    let gc = input(&CPU, &[n], View::Dense, 61, -1.0, 1.0);
    let slot_c = Backend::<f32>::upload(&CPU, &[0.01, 1.0], &[2]).expect("slot");
    let body: Box<dyn FnMut() -> zcompute::Result<()>> = {
        let (be, p, m, v, g, s) = (
            gpu.clone(),
            p.clone(),
            m.clone(),
            v.clone(),
            g.clone(),
            slot.clone(),
        );
        Box::new(move || be.adamw_step(&p, &m, &v, &g, &s, &cfg))
    };
    let mut graph = gpu.capture(body).expect("capture adamw");
    Backend::<f32>::adamw_step(&CPU, &pc, &mc, &vc, &gc, &slot_c, &cfg).expect("cpu step 1");
    for t in 2..=6u32 {
        let lr = 0.01 / t as f32;
        gpu.upload_into(&[lr, t as f32], &slot).expect("slot");
        Backend::<f32>::upload_into(&CPU, &[lr, t as f32], &slot_c).expect("slot");
        gpu.replay(&mut graph).expect("replay");
        Backend::<f32>::adamw_step(&CPU, &pc, &mc, &vc, &gc, &slot_c, &cfg).expect("cpu");
    }
    let check = |what: &str, t: &CudaTensor, c: &CpuTensor<f32>| assert_close(what, gpu, t, c, TOL);
    check("p", &p, &pc);
    check("m", &m, &mc);
    check("v", &v, &vc);
}

/// The backend reads where a capture is from the device's capture session, the one owner of
/// capture state: its body sees `WarmUp`, then `Capturing`; the session is closed after a
/// capture, failed or not; and a session already open on the device refuses a capture.
pub fn phases_come_from_the_device_session<D: Driver>(gpu: &CudaBackend<D>) {
    use std::sync::{Arc, Mutex};
    use zdevice::CapturePhase;
    let x = input(gpu, &[5, 5], View::Dense, 60, -1.0, 1.0);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (be, xx, log) = (gpu.clone(), x.clone(), Arc::clone(&seen));
    let _graph = gpu
        .capture(Box::new(move || {
            log.lock().unwrap().push(be.device().capture_phase());
            be.unary(UnaryOp::Exp, &xx).map(drop)
        }))
        .expect("capture");
    assert_eq!(
        *seen.lock().unwrap(),
        [CapturePhase::WarmUp, CapturePhase::Capturing]
    );
    assert_eq!(gpu.device().capture_phase(), CapturePhase::Idle);
    let be = gpu.clone();
    let err = gpu
        .capture(Box::new(move || be.synchronize()))
        .expect_err("a sync inside capture");
    assert!(matches!(err, ComputeError::CaptureIllegal { .. }), "{err}");
    assert_eq!(gpu.device().capture_phase(), CapturePhase::Idle);
    let session = gpu.device().open_capture_session().expect("a session");
    let err = gpu
        .capture(Box::new(|| Ok(())))
        .expect_err("a capture while a session is open");
    assert!(matches!(err, ComputeError::CaptureIllegal { .. }), "{err}");
    drop(session);
    gpu.unary(UnaryOp::Neg, &x).expect("eager after");
}
