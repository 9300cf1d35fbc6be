//! The CPU backend's threads (`zcompute::cpu::with_threads`): every op gives bitwise the same
//! result at 1, 2 and 3 threads, and twice in a row at the same count (work is split over
//! independent outputs only; see `cpu/par.rs`). The shapes are large enough for every op to
//! split (above 32K elements, a product above 2^18 multiply-adds), with odd sizes so blocks
//! end mid-tile.

use zcompute::cpu::with_threads;
use zcompute::prelude::*;
use zcompute::{
    Activation, AdamWConfig, Backend, BinaryOp, CpuBackend, CpuTensor, LayerNormBackward,
    MatmulOpts, QkNorm, UnaryOp,
};

type R<T> = zcompute::Result<T>;

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0
        })
        .collect()
}

fn t(shape: &[usize], seed: u64) -> CpuTensor<f32> {
    let n = shape.iter().product();
    CpuTensor::from_vec(values(n, seed), shape).unwrap()
}

/// Bits of every output of `ops` at `threads`.
fn bits_at(threads: usize, ops: fn() -> R<Vec<CpuTensor<f32>>>) -> Vec<Vec<u32>> {
    with_threads(threads, || {
        ops()
            .expect("ops run")
            .iter()
            .map(|x| x.to_vec().iter().map(|v| v.to_bits()).collect())
            .collect()
    })
    .expect("pool starts")
}

fn assert_same_bits_at_every_thread_count(ops: fn() -> R<Vec<CpuTensor<f32>>>) {
    let one = bits_at(1, ops);
    assert_eq!(one, bits_at(1, ops), "two runs at 1 thread differ");
    for threads in [2, 3] {
        let many = bits_at(threads, ops);
        assert_eq!(
            many,
            bits_at(threads, ops),
            "two runs at {threads} threads differ"
        );
        for (i, (a, b)) in one.iter().zip(&many).enumerate() {
            let diff = a.iter().zip(b).filter(|(x, y)| x != y).count();
            assert_eq!(
                diff, 0,
                "output {i}: {diff} elements differ at {threads} threads"
            );
        }
    }
}

#[test]
fn products_are_bitwise_the_same_at_any_thread_count() {
    assert_same_bits_at_every_thread_count(|| {
        let b = CpuBackend;
        let x = t(&[301, 193], 1);
        let w = t(&[257, 193], 2);
        let row = t(&[12, 256], 3);
        let w2 = t(&[1000, 256], 4);
        let nt = MatmulOpts {
            trans_a: false,
            trans_b: true,
        };
        let tn = MatmulOpts {
            trans_a: true,
            trans_b: false,
        };
        let acc = t(&[257, 193], 5);
        b.matmul_into(&b.matmul(&x, &w, nt)?, &x, tn, &acc)?;
        // A weight gradient wider than tall: columns split (each block packs gᵀ, the smaller).
        let (g, wide) = (t(&[301, 160], 12), t(&[301, 500], 13));
        Ok(vec![
            b.matmul(&x, &w, nt)?,    // rows split
            b.matmul(&row, &w2, nt)?, // 12 rows: columns split
            b.matmul(&g, &wide, tn)?,
            b.matmul(&b.matmul(&x, &w, nt)?, &w, MatmulOpts::default())?,
            acc,
        ])
    });
}

#[test]
fn elementwise_and_reductions_are_bitwise_the_same_at_any_thread_count() {
    assert_same_bits_at_every_thread_count(|| {
        let b = CpuBackend;
        let x = t(&[301, 257], 6);
        let y = t(&[301, 257], 7);
        let row = t(&[257], 8);
        let col = t(&[301, 1], 9);
        let acc = t(&[257], 10);
        b.sum_rows_into(&x, &acc)?;
        let into = t(&[301, 257], 11);
        b.add_into(&y, &into)?;
        Ok(vec![
            b.binary(BinaryOp::Mul, &x, &y)?,
            b.binary(BinaryOp::Add, &x, &row)?,
            b.binary(BinaryOp::Div, &x, &col)?,
            b.binary(BinaryOp::Maximum, &x.transpose(0, 1)?, &y.transpose(0, 1)?)?,
            b.unary(UnaryOp::Tanh, &x)?,
            b.unary(UnaryOp::Gelu, &x)?,
            b.sum(&x, 0, false)?,
            b.mean(&x, 1, true)?,
            b.max(&x, 0, false)?,
            acc,
            into,
        ])
    });
}

#[test]
fn rows_and_fused_ops_are_bitwise_the_same_at_any_thread_count() {
    assert_same_bits_at_every_thread_count(|| {
        let b = CpuBackend;
        let x = t(&[301, 257], 12);
        let g = t(&[301, 257], 13);
        let w = t(&[257], 14);
        let bias = t(&[257], 15);
        let ln = b.layer_norm(&x, Some(&w), Some(&bias), 1e-5)?;
        let back = b.layer_norm_backward_add(
            &LayerNormBackward {
                g: &g,
                residual: Some(&x),
                x: &x,
                mean: &ln.mean,
                rstd: &ln.rstd,
                weight: Some(&w),
            },
            [true, true],
        )?;
        let sm = b.softmax_last(&x)?;
        let (p, m, v) = (t(&[40_000], 16), t(&[40_000], 17), t(&[40_000], 18));
        let v = b.mul(&v, &v)?; // second moments are non-negative
        let slot = CpuTensor::from_vec(vec![1e-3, 3.0], &[2])?;
        let cfg = AdamWConfig {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        };
        b.adamw_step(&p, &m, &v, &t(&[40_000], 19), &slot, &cfg)?;
        Ok(vec![
            ln.out,
            ln.mean,
            ln.rstd,
            back.input.expect("asked"),
            back.g_xhat.expect("asked"),
            sm.clone(),
            b.softmax_backward(&g, &sm)?,
            b.bias_act(&x, &bias, Activation::Tanh)?,
            b.tanh_backward(&g, &x)?,
            p,
            m,
            v,
        ])
    });
}

#[test]
fn attention_is_bitwise_the_same_at_any_thread_count() {
    assert_same_bits_at_every_thread_count(|| {
        let b = CpuBackend;
        let (batch, s, heads, dh) = (37, 12, 4, 64);
        let qkv = t(&[batch, s, 3 * heads * dh], 20);
        let g = t(&[batch, s, heads * dh], 21);
        let (qw, qb, kw, kb) = (t(&[dh], 22), t(&[dh], 23), t(&[dh], 24), t(&[dh], 25));
        let norm = QkNorm {
            q_weight: &qw,
            q_bias: &qb,
            k_weight: &kw,
            k_bias: &kb,
            heads,
            eps: 1e-5,
        };
        let out = b.qk_norm_attention(&qkv, &norm)?;
        let gr = b.qk_norm_attention_backward(&g, &qkv, &norm)?;
        Ok(vec![
            out,
            gr.qkv,
            gr.q_weight,
            gr.q_bias,
            gr.k_weight,
            gr.k_bias,
        ])
    });
}

#[test]
fn thread_counts_are_set_and_refused_by_name() {
    assert_eq!(with_threads(2, zcompute::cpu::threads).unwrap(), 2);
    assert!(matches!(
        zcompute::cpu::parse_threads("0"),
        Err(zcompute::cpu::ThreadsError::BadCount { .. })
    ));
    assert!(zcompute::cpu::set_threads(0).is_err());
}
