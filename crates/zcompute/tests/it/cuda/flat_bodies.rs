//! Bodies of the flat-buffer ops (`norm2`, `clip_scale`, `finite_gate`), generic over the
//! driver: the CUDA backend's fused kernels against the CPU backend's composed ops.

use super::bodies::{TOL, View, assert_close, input};
use zcompute::{Backend, BinaryOp, CpuBackend, CpuTensor, CudaBackend, StepOps};
use zdevice::Driver;

const CPU: CpuBackend = CpuBackend;

/// `sqrt(sum x²)` matches the CPU and has the same bits when computed twice (fixed summation
/// order: no atomics).
pub fn norm2<D: Driver>(gpu: &CudaBackend<D>, shape: &[usize], view: View) {
    let x = input(gpu, shape, view, 41, -1.0, 1.0);
    let xc = input(&CPU, shape, view, 41, -1.0, 1.0);
    let ours = gpu.norm2(&x).expect("norm2");
    let want = Backend::<f32>::norm2(&CPU, &xc).expect("cpu norm2");
    assert_close(&format!("norm2 {shape:?} {view:?}"), gpu, &ours, &want, TOL);
    let again = gpu.norm2(&x).expect("norm2 again");
    let bits = |t| {
        gpu.download(t)
            .expect("download")
            .iter()
            .map(|v: &f32| v.to_bits())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        bits(&ours),
        bits(&again),
        "norm2 {shape:?}: two runs differ"
    );
}

/// Clipping by a norm in device memory: scaled to `max_norm` above it, untouched below, NaN
/// everywhere for a NaN norm; the same as the CPU's composed ops.
pub fn clip_scale<D: Driver>(gpu: &CudaBackend<D>, shape: &[usize], view: View) {
    for (max_norm, norm) in [(0.5f32, 2.0f32), (10.0, 2.0), (1.0, f32::NAN)] {
        let x = input(gpu, shape, view, 42, -1.0, 1.0);
        let xc = input(&CPU, shape, view, 42, -1.0, 1.0);
        let n = gpu.upload(&[norm], &[]).expect("norm");
        let nc = CpuTensor::from_vec(vec![norm], &[]).expect("norm");
        gpu.clip_scale(&x, &n, max_norm).expect("clip_scale");
        Backend::<f32>::clip_scale(&CPU, &xc, &nc, max_norm).expect("cpu clip_scale");
        let what = format!("clip_scale {shape:?} {view:?} max {max_norm} norm {norm}");
        if norm.is_nan() {
            let got = gpu.download(&x).expect("download");
            assert!(got.iter().all(|v| v.is_nan()), "{what}: {got:?}");
            assert!(xc.to_vec().iter().all(|v| v.is_nan()), "{what}: cpu");
        } else {
            assert_close(&what, gpu, &x, &xc, TOL);
        }
    }
}

/// The gate is 0 for finite operands, NaN when either is NaN or infinite, on both backends.
pub fn finite_gate<D: Driver>(gpu: &CudaBackend<D>) {
    let cases = [
        (1.5f32, -2.0f32, Some(0.0f32)),
        (f32::NAN, 1.0, None),
        (1.0, f32::INFINITY, None),
        (f32::NEG_INFINITY, f32::NAN, None),
    ];
    for (a, b, want) in cases {
        let (ta, tb) = (
            gpu.upload(&[a], &[]).expect("a"),
            gpu.upload(&[b], &[1]).expect("b"),
        );
        let dst = gpu.upload(&[7.0, 7.0, 7.0], &[3]).expect("dst");
        let slot = dst.narrow(0, 2, 1).expect("narrow");
        gpu.finite_gate(&ta, &tb, &slot).expect("finite_gate");
        let got = gpu.download(&dst).expect("download");
        let (ca, cb) = (
            CpuTensor::from_vec(vec![a], &[]).expect("a"),
            CpuTensor::from_vec(vec![b], &[1]).expect("b"),
        );
        let cdst = CpuTensor::from_vec(vec![7.0f32; 3], &[3]).expect("dst");
        Backend::<f32>::finite_gate(&CPU, &ca, &cb, &cdst.narrow(0, 2, 1).expect("narrow"))
            .expect("cpu finite_gate");
        let cpu = cdst.to_vec();
        assert_eq!(
            &got[..2],
            &[7.0, 7.0],
            "finite_gate({a}, {b}) wrote outside dst"
        );
        match want {
            Some(w) => assert!(got[2] == w && cpu[2] == w, "finite_gate({a}, {b}): {got:?}"),
            None => assert!(
                got[2].is_nan() && cpu[2].is_nan(),
                "finite_gate({a}, {b}): {got:?} cpu {cpu:?}"
            ),
        }
    }
}

/// `dst += src` in place, dense (one launch) and through views, the same as the CPU; memory
/// next to a narrowed destination is left alone.
pub fn add_into<D: Driver>(gpu: &CudaBackend<D>, shape: &[usize], view: View) {
    let dst = input(gpu, shape, view, 43, -1.0, 1.0);
    let dst_c = input(&CPU, shape, view, 43, -1.0, 1.0);
    let src = input(gpu, shape, View::Dense, 44, -1.0, 1.0);
    let src_c = input(&CPU, shape, View::Dense, 44, -1.0, 1.0);
    for _ in 0..2 {
        gpu.add_into(&src, &dst).expect("add_into");
        Backend::<f32>::add_into(&CPU, &src_c, &dst_c).expect("cpu add_into");
    }
    assert_close(
        &format!("add_into {shape:?} {view:?}"),
        gpu,
        &dst,
        &dst_c,
        TOL,
    );
    let stored = gpu.upload(&vec![3.0f32; 2 * dst.numel()], &[2 * dst.numel()]);
    let stored = stored.expect("stored");
    let half = stored.narrow(0, 0, dst.numel()).expect("narrow");
    let flat_src = src.reshape(&[src.numel()]).expect("reshape");
    gpu.add_into(&flat_src, &half).expect("add_into a view");
    let got = gpu.download(&stored).expect("download");
    assert!(
        got[dst.numel()..].iter().all(|&v| v == 3.0),
        "add_into wrote past its view"
    );
}

/// `dst = a op b` straight into a view: the same bits as `binary` on this backend and the
/// CPU's result, for a destination dense, transposed or narrowed, `b` broadcast along the last
/// axis or not; memory next to a narrowed destination is left alone; a destination of another
/// shape or one overlapping an operand is refused.
pub fn binary_into<D: Driver>(gpu: &CudaBackend<D>, shape: &[usize], view: View) {
    let last = shape[shape.len() - 1];
    for op in [BinaryOp::Mul, BinaryOp::Add] {
        for b_shape in [shape.to_vec(), vec![last]] {
            let a = input(gpu, shape, View::Dense, 45, -1.0, 1.0);
            let a_c = input(&CPU, shape, View::Dense, 45, -1.0, 1.0);
            let b = input(gpu, &b_shape, View::Dense, 46, -1.0, 1.0);
            let b_c = input(&CPU, &b_shape, View::Dense, 46, -1.0, 1.0);
            let dst = input(gpu, shape, view, 47, -1.0, 1.0);
            let dst_c = input(&CPU, shape, view, 47, -1.0, 1.0);
            gpu.binary_into(op, &a, &b, &dst).expect("binary_into");
            StepOps::<f32>::binary_into(&CPU, op, &a_c, &b_c, &dst_c).expect("cpu binary_into");
            let what = format!("binary_into {op:?} {shape:?} by {b_shape:?} into {view:?}");
            assert_close(&what, gpu, &dst, &dst_c, TOL);
            let fresh = gpu.binary(op, &a, &b).expect("binary");
            let bits = |t: &zcompute::CudaTensor| {
                let dense = gpu.contiguous(t).expect("contiguous");
                gpu.download(&dense)
                    .expect("download")
                    .iter()
                    .map(|v| v.to_bits())
                    .collect::<Vec<_>>()
            };
            assert_eq!(bits(&dst), bits(&fresh), "{what}: not binary's bits");
        }
    }
    let n = shape.iter().product::<usize>();
    let stored = gpu.upload(&vec![3.0f32; 2 * n], &[2 * n]).expect("stored");
    let half = stored.narrow(0, 0, n).expect("narrow");
    let a = input(gpu, &[n], View::Dense, 48, -1.0, 1.0);
    gpu.binary_into(BinaryOp::Mul, &a, &a, &half)
        .expect("binary_into a view");
    let got = gpu.download(&stored).expect("download");
    assert!(
        got[n..].iter().all(|&v| v == 3.0),
        "binary_into wrote past its view"
    );
    let wrong = gpu.zeros(&[n + 1]).expect("zeros");
    assert!(
        gpu.binary_into(BinaryOp::Mul, &a, &a, &wrong).is_err(),
        "a destination of another shape is refused"
    );
    assert!(
        gpu.binary_into(BinaryOp::Mul, &a, &half, &a).is_err(),
        "a destination overlapping an operand is refused"
    );
    let (a_c, w_c) = (
        input(&CPU, &[n], View::Dense, 48, -1.0, 1.0),
        CpuTensor::from_vec(vec![0.0f32; n + 1], &[n + 1]).expect("zeros"),
    );
    assert!(
        StepOps::<f32>::binary_into(&CPU, BinaryOp::Mul, &a_c, &a_c, &w_c).is_err(),
        "the CPU refuses it too"
    );
}

/// `step_tail` on the device equals the CPU backend's composite bit for bit (any NaN as any
/// NaN; stats, gate, sticky gate, history rows and cursor) over a sequence of steps: finite ones, a NaN loss (every later
/// gate NaN through the sticky one), a cursor past the history (nothing written, the cursor
/// still advanced); and without the sticky gate and history (the stats and the gate only).
pub fn step_tail<D: Driver>(gpu: &CudaBackend<D>) {
    let steps = [
        (0.5f32, 2.0f32),
        (0.25, 1.5),
        (f32::NAN, 1.0),
        (0.125, 0.75),
        (1.0, 3.0),
    ];
    let rows = 4;
    let gpu_state = [
        gpu.zeros(&[2]).unwrap(),
        gpu.upload(&[7.0, 9.0], &[2]).unwrap(),
        gpu.zeros(&[1]).unwrap(),
        gpu.upload(&vec![-1.0; rows * 2], &[rows, 2]).unwrap(),
        gpu.zeros(&[1]).unwrap(),
    ];
    let cpu_state = [
        CPU.zeros(&[2]).unwrap(),
        CpuTensor::from_vec(vec![7.0f32, 9.0], &[2]).unwrap(),
        CPU.zeros(&[1]).unwrap(),
        CpuTensor::from_vec(vec![-1.0f32; rows * 2], &[rows, 2]).unwrap(),
        CPU.zeros(&[1]).unwrap(),
    ];
    // Bits, with every NaN as one pattern: the GPU's arithmetic gives its canonical NaN where
    // the CPU propagates the operand's payload (the gate only needs "not 0").
    let bits = |v: Vec<f32>| -> Vec<u32> {
        v.into_iter()
            .map(|x| if x.is_nan() { u32::MAX } else { x.to_bits() })
            .collect()
    };
    for (i, (l, n)) in steps.into_iter().enumerate() {
        let (gl, gn) = (
            gpu.upload(&[l], &[]).unwrap(),
            gpu.upload(&[n], &[1]).unwrap(),
        );
        let (cl, cn) = (
            CpuTensor::from_vec(vec![l], &[]).unwrap(),
            CpuTensor::from_vec(vec![n], &[1]).unwrap(),
        );
        let [stats, slot, sticky, history, cursor] = &gpu_state;
        let gate = slot.narrow(0, 1, 1).unwrap();
        gpu.step_tail(
            [&gl, &gn],
            stats,
            &gate,
            Some(sticky),
            Some((history, cursor)),
        )
        .expect("step_tail");
        let [stats_c, slot_c, sticky_c, history_c, cursor_c] = &cpu_state;
        let gate_c = slot_c.narrow(0, 1, 1).unwrap();
        StepOps::<f32>::step_tail(
            &CPU,
            [&cl, &cn],
            stats_c,
            &gate_c,
            Some(sticky_c),
            Some((history_c, cursor_c)),
        )
        .expect("cpu step_tail");
        for (t, c, what) in [
            (stats, stats_c, "stats"),
            (slot, slot_c, "slot"),
            (sticky, sticky_c, "sticky"),
            (history, history_c, "history"),
            (cursor, cursor_c, "cursor"),
        ] {
            assert_eq!(
                bits(gpu.download(t).unwrap()),
                bits(c.to_vec()),
                "step {i}: {what}"
            );
        }
        let gate_now = gpu.download(slot).unwrap()[1];
        assert_eq!(
            gate_now.is_nan(),
            i >= 2,
            "step {i}: the gate stays NaN from step 2"
        );
        assert_eq!(
            gpu.download(slot).unwrap()[0],
            7.0,
            "step {i}: the slot's other element"
        );
    }
    // Without a sticky gate or a history: the stats and this step's own gate.
    let [stats, slot, ..] = &gpu_state;
    let gate = slot.narrow(0, 1, 1).unwrap();
    let (gl, gn) = (
        gpu.upload(&[0.5], &[]).unwrap(),
        gpu.upload(&[2.0], &[1]).unwrap(),
    );
    gpu.step_tail([&gl, &gn], stats, &gate, None, None)
        .expect("bare step_tail");
    assert_eq!(gpu.download(stats).unwrap(), vec![0.5, 2.0]);
    assert_eq!(gpu.download(slot).unwrap(), vec![7.0, 0.0]);
}
