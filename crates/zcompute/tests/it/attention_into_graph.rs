//! `AttentionOps::qk_norm_attention_backward_into` in captured graphs and counted launches: a
//! captured body (buffers reset, the backward adding into them) replayed with fresh inputs
//! equals the same body run eagerly bit for bit; on the simulator the backward into adjacent
//! buffers is two launches. Parity and errors: `attention_into.rs`.

use crate::attention::{Case, inputs};
use crate::attention_into::{Buffers, Uploaded, buffers, qk_norm, starting_values, upload};
use crate::common::uniform;
use zcompute::prelude::*;
use zcompute::{BTensor, QkNorm};

/// On the simulator the backward with adjacent buffers is two launches (the kernel, one
/// column reduction adding into all four buffers): the separate add is gone. Buffers apart
/// take one reduction each; a shape the kernels do not take, the composite.
#[test]
#[allow(clippy::print_stdout)] // the counts belong in the test's output (reported)
fn launches_on_the_simulator() {
    let gpu = crate::cuda::mock();
    let launches = |c: Case, layout: Buffers| -> usize {
        let sim = gpu.device().driver();
        let Uploaded { qkv, g, params } = upload::<_, f32>(&gpu, c);
        let norm = qk_norm(&params, c.heads);
        let bufs = buffers::<_, f32>(&gpu, c.dh, layout, &starting_values(c.dh));
        sim.clear_op_log();
        gpu.qk_norm_attention_backward_into(
            &g,
            &qkv,
            &norm,
            [0, 1, 2, 3].map(|k| bufs[k].as_ref()),
        )
        .expect("backward_into");
        sim.op_log()
            .iter()
            .filter(|r| {
                r.call == zdevice::sim::calls::LAUNCH_KERNEL
                    || r.call == zdevice::sim::calls::GEMM_STRIDED_BATCHED
            })
            .count()
    };
    let xasset = Case {
        batch: 1,
        seq: 12,
        heads: 4,
        dh: 64,
    };
    let adjacent = launches(xasset, Buffers::Adjacent);
    println!("attention backward_into {xasset:?}, adjacent buffers: {adjacent} launches");
    assert_eq!(adjacent, 2, "kernel + one accumulating column reduction");
    let apart = launches(xasset, Buffers::Apart);
    println!("attention backward_into {xasset:?}, buffers apart: {apart} launches");
    assert_eq!(apart, 1 + 4, "kernel + one reduction per buffer");
    let some = launches(xasset, Buffers::Some2);
    assert_eq!(some, 1 + 4, "kernel + one reduction per parameter");
    let long = Case {
        batch: 1,
        seq: 70,
        heads: 2,
        dh: 8,
    };
    let composite = launches(long, Buffers::Adjacent);
    assert!(composite > 10, "composite launches {composite}");
}

type Bufs<B> = [Option<BTensor<B, f32>>; 4];

/// The body a capture records: the buffers reset to their starting values, the backward
/// adding into them, then qkv's gradient and every parameter's gradient (buffer or returned)
/// copied into `outs`.
fn into_body<B: Ops<f32>>(
    b: &B,
    (qkv, g): (&BTensor<B, f32>, &BTensor<B, f32>),
    params: &[BTensor<B, f32>; 4],
    heads: usize,
    start: &Bufs<B>,
    bufs: &Bufs<B>,
    outs: &[BTensor<B, f32>; 5],
) -> zcompute::Result<()> {
    for (s, d) in start.iter().zip(bufs) {
        if let (Some(s), Some(d)) = (s, d) {
            b.copy_into(s, d)?;
        }
    }
    let norm = QkNorm {
        q_weight: &params[0],
        q_bias: &params[1],
        k_weight: &params[2],
        k_bias: &params[3],
        heads,
        eps: 1e-5,
    };
    let r =
        b.qk_norm_attention_backward_into(g, qkv, &norm, [0, 1, 2, 3].map(|k| bufs[k].as_ref()))?;
    b.copy_into(&r.qkv, &outs[0])?;
    for k in 0..4 {
        match (&bufs[k], &r.params[k]) {
            (Some(t), _) | (None, Some(t)) => b.copy_into(t, &outs[k + 1])?,
            (None, None) => {}
        }
    }
    Ok(())
}

/// A captured backward_into, replayed with fresh qkv and g, equals the same body run eagerly
/// bit for bit.
pub fn captured_equals_eager<B>(b: &B, c: Case, layout: Buffers)
where
    B: zcompute::Capture<f32> + Clone + 'static,
{
    let [qkv0, qw, qb, kw, kb, g0] = inputs(c);
    let f32s = |v: &[f64]| -> Vec<f32> { v.iter().map(|&x| x as f32).collect() };
    let (qkv_shape, g_shape) = (
        [c.batch, c.seq, 3 * c.heads * c.dh],
        [c.batch, c.seq, c.heads * c.dh],
    );
    let qkv = b.upload(&f32s(&qkv0), &qkv_shape).unwrap();
    let g = b.upload(&f32s(&g0), &g_shape).unwrap();
    let params = [&qw, &qb, &kw, &kb].map(|v| b.upload(&f32s(v), &[c.dh]).unwrap());
    let starting = starting_values(c.dh);
    let start = buffers::<_, f32>(b, c.dh, layout, &starting);
    let outs_of = || -> [BTensor<B, f32>; 5] {
        std::array::from_fn(|k| {
            let shape: &[usize] = if k == 0 { &qkv_shape } else { &[c.dh] };
            b.zeros(shape).unwrap()
        })
    };
    let (cap_bufs, cap_outs) = (buffers::<_, f32>(b, c.dh, layout, &starting), outs_of());
    let (eager_bufs, eager_outs) = (buffers::<_, f32>(b, c.dh, layout, &starting), outs_of());
    let body = {
        let (be, qkv, g, params) = (b.clone(), qkv.clone(), g.clone(), params.clone());
        let (start, bufs, outs) = (start.clone(), cap_bufs.clone(), cap_outs.clone());
        Box::new(move || into_body(&be, (&qkv, &g), &params, c.heads, &start, &bufs, &outs))
    };
    let mut graph = b.capture(body).expect("capture");
    for r in 0..2u64 {
        let fresh = |n: usize, seed: u64| f32s(&uniform(n, seed, -2.0, 2.0));
        b.upload_into(&fresh(qkv0.len(), 500 + r), &qkv).unwrap();
        b.upload_into(&fresh(g0.len(), 600 + r), &g).unwrap();
        b.replay(&mut graph).expect("replay");
        into_body(
            b,
            (&qkv, &g),
            &params,
            c.heads,
            &start,
            &eager_bufs,
            &eager_outs,
        )
        .expect("eager");
        for (i, (cap, eager)) in cap_outs.iter().zip(&eager_outs).enumerate() {
            let (cap, eager) = (b.download(cap).unwrap(), b.download(eager).unwrap());
            assert!(
                cap.iter().all(|v| v.is_finite()),
                "{c:?} output {i}: not finite"
            );
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&cap),
                bits(&eager),
                "{c:?} {layout:?} replay {r} output {i}"
            );
        }
    }
}
