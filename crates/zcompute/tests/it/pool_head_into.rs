//! `PooledLossOps::pool_head_bce_backward_into`: the head weight's and bias's gradients added into
//! the caller's buffers (non-zero before) by the backward itself, on the CPU and on the CUDA
//! backend (poison on), against the f64 reference plus the buffers' old values: buffers
//! adjacent in one flat buffer (zgrad's layout), in buffers of their own, and a strided weight
//! buffer (the composite); one block row (small batches) and several (the finishing kernel
//! adds). Two runs are bitwise equal, and equal to the backward followed by `add_into`. Typed
//! errors for bad buffers. The launch count is pinned on the simulator.

use crate::common::{CPU, TOL, rel_err, uniform};
use zcompute::prelude::*;
use zcompute::{BTensor, Backend, CpuTensor, Layout, Tensor};

/// Where the weight's and bias's gradient buffers live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Buffers {
    /// Adjacent in one flat buffer after a prefix (zgrad's flat gradients).
    Adjacent,
    /// Buffers of their own.
    Separate,
    /// The weight's a strided view (every other element of a flat buffer, which also holds
    /// the bias's at its end): the device takes the composite.
    Strided,
}

const PREFIX: usize = 3;

/// The host inputs, f32-representable: h, weight, bias, targets, and the loss gradient.
struct Inputs {
    h: Vec<f64>,
    w: Vec<f64>,
    b: Vec<f64>,
    y: Vec<f64>,
    g: f64,
}

fn inputs(batch: usize, scales: usize, width: usize) -> Inputs {
    let round = |v: Vec<f64>| -> Vec<f64> { v.iter().map(|&x| f64::from(x as f32)).collect() };
    let seed = (batch * 1000 + scales * 10 + width) as u64;
    Inputs {
        h: round(uniform(batch * scales * width, seed, -2.0, 2.0)),
        w: round(uniform(width, seed + 1, -0.5, 0.5)),
        b: round(uniform(1, seed + 2, -0.5, 0.5)),
        y: (0..batch).map(|i| ((i * 7) % 3) as f64 / 2.0).collect(),
        g: 1.5,
    }
}

/// Non-zero starting values of the weight's and bias's buffers.
fn starting_values(width: usize) -> (Vec<f64>, f64) {
    let round = |v: Vec<f64>| -> Vec<f64> { v.iter().map(|&x| f64::from(x as f32)).collect() };
    (round(uniform(width, 77, -1.0, 1.0)), 0.25)
}

/// The weight's and bias's buffers laid out as `layout` says, holding the starting values.
fn buffers<B: Ops<f32>>(
    be: &B,
    width: usize,
    layout: Buffers,
) -> (BTensor<B, f32>, BTensor<B, f32>) {
    let (w0, b0) = starting_values(width);
    let f32s = |v: &[f64]| -> Vec<f32> { v.iter().map(|&x| x as f32).collect() };
    let view = |flat: &BTensor<B, f32>, shape: &[usize], strides: &[usize], at: usize| {
        let layout = Layout::new(shape, strides, at).expect("layout");
        Tensor::from_parts(flat.storage().clone(), layout).expect("view")
    };
    match layout {
        Buffers::Adjacent => {
            let mut flat = vec![9.0f32; PREFIX + width + 1 + 2];
            flat[PREFIX..PREFIX + width].copy_from_slice(&f32s(&w0));
            flat[PREFIX + width] = b0 as f32;
            let flat = be.upload(&flat, &[flat.len()]).expect("upload");
            (
                view(&flat, &[1, width], &[width, 1], PREFIX),
                view(&flat, &[1], &[1], PREFIX + width),
            )
        }
        Buffers::Separate => (
            be.upload(&f32s(&w0), &[1, width]).expect("upload"),
            be.upload(&[b0 as f32], &[1]).expect("upload"),
        ),
        Buffers::Strided => {
            let mut flat = vec![9.0f32; 2 * width];
            for (j, &v) in w0.iter().enumerate() {
                flat[2 * j] = v as f32;
            }
            flat[2 * width - 1] = b0 as f32;
            let flat = be.upload(&flat, &[flat.len()]).expect("upload");
            (
                view(&flat, &[1, width], &[2 * width, 2], 0),
                view(&flat, &[1], &[1], 2 * width - 1),
            )
        }
    }
}

/// h's gradient and the two buffers' contents after `pool_head_bce_backward_into` on `be`.
fn run_into<B: Ops<f32>>(
    be: &B,
    (batch, scales, width): (usize, usize, usize),
    layout: Buffers,
) -> [Vec<f32>; 3] {
    let i = inputs(batch, scales, width);
    let f32s = |v: &[f64]| -> Vec<f32> { v.iter().map(|&x| x as f32).collect() };
    let h = be.upload(&f32s(&i.h), &[batch, scales, width]).unwrap();
    let w = be.upload(&f32s(&i.w), &[1, width]).unwrap();
    let b = be.upload(&f32s(&i.b), &[1]).unwrap();
    let y = be.upload(&f32s(&i.y), &[batch]).unwrap();
    let g = be.upload(&[i.g as f32], &[]).unwrap();
    let logits = be.pool_head_bce(&h, &w, &b, &y).expect("forward").logits;
    let (dw, db) = buffers(be, width, layout);
    let gh = be
        .pool_head_bce_backward_into(&g, &h, &w, &logits, &y, [&dw, &db])
        .expect("backward_into");
    assert_eq!(gh.shape(), &[batch, scales, width], "gh shape");
    let down = |t: &BTensor<B, f32>| be.download(t).expect("download");
    [down(&gh), down(&dw), down(&db)]
}

/// f32 results on `be` against the f64 reference plus the starting values.
pub fn parity<B: Ops<f32>>(be: &B, shape: (usize, usize, usize), layout: Buffers) {
    let (batch, scales, width) = shape;
    let what = format!("pool_head_bce_backward_into {shape:?} {layout:?}");
    let i = inputs(batch, scales, width);
    let host = |v: &[f64], s: &[usize]| CpuTensor::from_vec(v.to_vec(), s).unwrap();
    let (h, w, b, y) = (
        host(&i.h, &[batch, scales, width]),
        host(&i.w, &[1, width]),
        host(&i.b, &[1]),
        host(&i.y, &[batch]),
    );
    let logits = CPU.pool_head_bce(&h, &w, &b, &y).unwrap().logits;
    let want = CPU
        .pool_head_bce_backward(&host(&[i.g], &[]), &h, &w, &logits, &y)
        .unwrap();
    let (w0, b0) = starting_values(width);
    let dw: Vec<f64> = want
        .weight
        .to_vec()
        .iter()
        .zip(&w0)
        .map(|(a, s)| a + s)
        .collect();
    let db = vec![want.bias.to_vec()[0] + b0];
    let ours = run_into(be, shape, layout);
    for (name, o, r) in [
        ("gh", &ours[0], &want.h.to_vec()),
        ("dw", &ours[1], &dw),
        ("db", &ours[2], &db),
    ] {
        let err = rel_err(o, r);
        assert!(err <= TOL, "{what} {name}: relative error {err:e}");
    }
}

/// Two runs bitwise equal, and equal to the backward then `add_into`.
pub fn bitwise<B: Ops<f32>>(be: &B, shape: (usize, usize, usize), layout: Buffers) {
    let (batch, scales, width) = shape;
    let what = format!("pool_head_bce_backward_into {shape:?} {layout:?}");
    let bits = |r: &[Vec<f32>]| -> Vec<u32> { r.iter().flatten().map(|x| x.to_bits()).collect() };
    let first = run_into(be, shape, layout);
    assert_eq!(
        bits(&first),
        bits(&run_into(be, shape, layout)),
        "{what}: rerun"
    );
    let i = inputs(batch, scales, width);
    let f32s = |v: &[f64]| -> Vec<f32> { v.iter().map(|&x| x as f32).collect() };
    let h = be.upload(&f32s(&i.h), &[batch, scales, width]).unwrap();
    let w = be.upload(&f32s(&i.w), &[1, width]).unwrap();
    let b = be.upload(&f32s(&i.b), &[1]).unwrap();
    let y = be.upload(&f32s(&i.y), &[batch]).unwrap();
    let g = be.upload(&[i.g as f32], &[]).unwrap();
    let logits = be.pool_head_bce(&h, &w, &b, &y).unwrap().logits;
    let r = be.pool_head_bce_backward(&g, &h, &w, &logits, &y).unwrap();
    let (dw, db) = buffers(be, width, Buffers::Separate);
    be.add_into(&r.weight, &dw).unwrap();
    be.add_into(&r.bias, &db).unwrap();
    let then_added = [
        be.download(&r.h).unwrap(),
        be.download(&dw).unwrap(),
        be.download(&db).unwrap(),
    ];
    assert_eq!(
        bits(&first),
        bits(&then_added),
        "{what}: not the backward + add_into"
    );
}

/// Bad buffers give the same typed error on the CPU and on `be`.
pub fn errors<B: Ops<f32>>(be: &B) {
    fn first_error<B: Ops<f32>>(be: &B, case: usize) -> String {
        let t = |shape: &[usize]| be.zeros(shape).expect("zeros");
        let (h, w, l, g) = (t(&[2, 3, 8]), t(&[1, 8]), t(&[2]), t(&[]));
        let y = t(&[2]);
        let flat = t(&[12]);
        let at = |shape: &[usize], o: usize| {
            let strides = zcompute::contiguous_strides(shape);
            let layout = Layout::new(shape, &strides, o).unwrap();
            Tensor::from_parts(flat.storage().clone(), layout).unwrap()
        };
        let (dw, db) = (at(&[1, 8], 0), at(&[1], 8));
        let of_h = h.reshape(&[48]).unwrap().narrow(0, 0, 1).unwrap();
        let broadcast = t(&[1, 1]).broadcast_to(&[1, 8]).unwrap();
        let bufs: [&BTensor<B, f32>; 2] = match case {
            0 => [&dw, &db],
            1 => [&at(&[8], 0), &db],
            2 => [&dw, &at(&[2], 8)],
            3 => [&dw, &at(&[1], 7)],
            4 => [&dw, &of_h],
            5 => [&broadcast, &db],
            _ => [&w, &db],
        };
        match be.pool_head_bce_backward_into(&g, &h, &w, &l, &y, bufs) {
            Ok(_) => "ok".into(),
            Err(e) => format!("{e:?}"),
        }
    }
    let want = [
        "ok",
        "ShapeMismatch",
        "ShapeMismatch",
        "Aliased",
        "Aliased",
        "OverlappingDestination",
        "Aliased",
    ];
    for (case, want) in want.iter().enumerate() {
        let cpu = first_error(&CPU, case);
        let dev = first_error(be, case);
        assert_eq!(cpu, dev, "case {case}: CPU and device differ");
        assert!(cpu.contains(want), "case {case}: {cpu}");
    }
}

/// The body a capture records: the buffers reset to their starting values, the backward
/// adding into them, `h`'s gradient copied into `gh_out`.
fn into_body<B: Ops<f32>>(
    be: &B,
    inputs: &[BTensor<B, f32>; 5],
    start: &(BTensor<B, f32>, BTensor<B, f32>),
    bufs: &(BTensor<B, f32>, BTensor<B, f32>),
    gh_out: &BTensor<B, f32>,
) -> zcompute::Result<()> {
    let [g, h, w, logits, y] = inputs;
    be.copy_into(&start.0, &bufs.0)?;
    be.copy_into(&start.1, &bufs.1)?;
    let gh = be.pool_head_bce_backward_into(g, h, w, logits, y, [&bufs.0, &bufs.1])?;
    be.copy_into(&gh, gh_out)
}

/// A captured backward_into, replayed with a fresh `h` and loss gradient, equals the same body
/// run eagerly bit for bit.
pub fn captured_equals_eager<B>(be: &B, shape: (usize, usize, usize), layout: Buffers)
where
    B: zcompute::Capture<f32> + Clone + 'static,
{
    let (batch, scales, width) = shape;
    let i = inputs(batch, scales, width);
    let f32s = |v: &[f64]| -> Vec<f32> { v.iter().map(|&x| x as f32).collect() };
    let h = be.upload(&f32s(&i.h), &[batch, scales, width]).unwrap();
    let w = be.upload(&f32s(&i.w), &[1, width]).unwrap();
    let b = be.upload(&f32s(&i.b), &[1]).unwrap();
    let y = be.upload(&f32s(&i.y), &[batch]).unwrap();
    let g = be.upload(&[1.5], &[]).unwrap();
    let logits = be.pool_head_bce(&h, &w, &b, &y).unwrap().logits;
    let operands = [g, h, w, logits, y];
    let start = buffers(be, width, layout);
    let (cap_bufs, cap_gh) = (
        buffers(be, width, layout),
        be.zeros(&[batch, scales, width]).unwrap(),
    );
    let (eager_bufs, eager_gh) = (
        buffers(be, width, layout),
        be.zeros(&[batch, scales, width]).unwrap(),
    );
    let body = {
        let (be, operands) = (be.clone(), operands.clone());
        let (start, bufs, gh) = (start.clone(), cap_bufs.clone(), cap_gh.clone());
        Box::new(move || into_body(&be, &operands, &start, &bufs, &gh))
    };
    let mut graph = be.capture(body).expect("capture");
    for r in 0..2u64 {
        let fresh: Vec<f32> = f32s(&uniform(i.h.len(), 700 + r, -2.0, 2.0));
        be.upload_into(&fresh, &operands[1]).unwrap();
        be.upload_into(&[0.5 + r as f32], &operands[0]).unwrap();
        be.replay(&mut graph).expect("replay");
        into_body(be, &operands, &start, &eager_bufs, &eager_gh).expect("eager");
        let pairs = [
            (&cap_gh, &eager_gh),
            (&cap_bufs.0, &eager_bufs.0),
            (&cap_bufs.1, &eager_bufs.1),
        ];
        for (k, (cap, eager)) in pairs.into_iter().enumerate() {
            let (cap, eager) = (be.download(cap).unwrap(), be.download(eager).unwrap());
            assert!(
                cap.iter().all(|v| v.is_finite()),
                "{shape:?} output {k}: not finite"
            );
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&cap),
                bits(&eager),
                "{shape:?} {layout:?} replay {r} output {k}"
            );
        }
    }
}

macro_rules! pool_head_into_suite {
    ($backend:path) => {
        use super::Buffers;
        use rstest::rstest;

        #[rstest]
        fn parity(
            #[values(1, 3, 8, 9, 40)] batch: usize,
            #[values(12, 17)] scales: usize,
            #[values(5, 37, 256)] width: usize,
            #[values(Buffers::Adjacent, Buffers::Separate, Buffers::Strided)] layout: Buffers,
        ) {
            super::parity(&$backend(), (batch, scales, width), layout);
        }

        #[rstest]
        fn bitwise(
            #[values((1, 12, 256), (3, 17, 37), (40, 12, 5))] shape: (usize, usize, usize),
            #[values(Buffers::Adjacent, Buffers::Strided)] layout: Buffers,
        ) {
            super::bitwise(&$backend(), shape, layout);
        }

        #[rstest]
        fn captured_equals_eager(
            #[values((1, 12, 256), (3, 17, 37), (40, 12, 5))] shape: (usize, usize, usize),
            #[values(Buffers::Adjacent, Buffers::Strided)] layout: Buffers,
        ) {
            super::captured_equals_eager(&$backend(), shape, layout);
        }

        #[test]
        fn typed_errors() {
            super::errors(&$backend());
        }
    };
}

mod cpu_suite {
    fn cpu() -> zcompute::CpuBackend {
        zcompute::CpuBackend
    }
    pool_head_into_suite!(cpu);
}

mod mock_suite {
    pool_head_into_suite!(super::super::cuda::mock);
}

#[cfg(feature = "gpu")]
mod gpu_suite {
    pool_head_into_suite!(super::super::cuda::gpu);
}

/// On the simulator a small batch's backward into adjacent buffers is one launch (the kernel
/// adds into them: no separate add), a large batch's two (the finishing kernel adds); the
/// backward then `add_into` took one more each.
#[test]
#[allow(clippy::print_stdout)] // the counts belong in the test's output (reported)
fn launches_on_the_simulator() {
    let gpu = crate::cuda::mock();
    for (batch, want) in [(1, 1), (40, 1)] {
        let (scales, width) = (12, 256);
        let i = inputs(batch, scales, width);
        let f32s = |v: &[f64]| -> Vec<f32> { v.iter().map(|&x| x as f32).collect() };
        let h = gpu.upload(&f32s(&i.h), &[batch, scales, width]).unwrap();
        let w = gpu.upload(&f32s(&i.w), &[1, width]).unwrap();
        let b = gpu.upload(&f32s(&i.b), &[1]).unwrap();
        let y = gpu.upload(&f32s(&i.y), &[batch]).unwrap();
        let g = gpu.upload(&[1.0], &[]).unwrap();
        let logits = gpu.pool_head_bce(&h, &w, &b, &y).unwrap().logits;
        let (dw, db) = buffers(&gpu, width, Buffers::Adjacent);
        let sim = gpu.device().driver();
        sim.clear_op_log();
        gpu.pool_head_bce_backward_into(&g, &h, &w, &logits, &y, [&dw, &db])
            .unwrap();
        let n = sim
            .op_log()
            .iter()
            .filter(|r| r.call == zdevice::sim::calls::LAUNCH_KERNEL)
            .count();
        println!("pool_head_bce_backward_into batch {batch}: {n} launches");
        assert_eq!(n, want, "batch {batch}");
    }
}
