//! Plain scaled dot-product attention with a key-padding mask: `q [B, Sq, dk]`,
//! `k [B, Sk, dk]`, `v [B, Sk, dv]` and a key mask `[B, Sk]` (1 keep, 0 padding; none: every
//! key kept) to `softmax(q·kᵀ·scale over the kept keys)·v`, `[B, Sq, dv]`. A query whose keys
//! are all padding (or that has no key) gets zeros, and zero gradients: never NaN (PyTorch's
//! math path gives NaN there). The mask holds 0 or 1; it gets no gradient.
//!
//! The composite here (the batched products, the mask as `(keep - 1)·1e30` added to the
//! scores, softmax, the probabilities times the mask) is every backend's provided body and
//! the reference the fused kernels are checked against; the CPU backend and the CUDA backend
//! override it with one pass per query row (`cpu::key_padding`, `kernels/attention.cu`).

use crate::backend::{BTensor, Backend, BinaryOp, MatmulOpts, ScalarSide};
use crate::descriptors::{NT, TN};
use crate::element::Element;
use crate::error::Result;
use crate::storage::Storage;
use crate::tensor::Tensor;
use crate::validate::{self, KeyPadding};

/// Key-padding attention's operands by name ([`super::AttentionOps::key_padding_attention`]
/// and its backward): `q [B, Sq, dk]`, `k [B, Sk, dk]`, `v [B, Sk, dv]`, the key mask
/// `key_keep [B, Sk]` (1 keep, 0 padding; `None`: every key kept) and the scores' scale.
#[derive(Debug)]
pub struct KeyPaddingAttention<'a, S: Storage> {
    pub q: &'a Tensor<S>,
    pub k: &'a Tensor<S>,
    pub v: &'a Tensor<S>,
    pub key_keep: Option<&'a Tensor<S>>,
    pub scale: S::Elem,
}

// Borrows and a number: copied whatever the storage (a derive would ask `S: Copy`).
impl<S: Storage> Clone for KeyPaddingAttention<'_, S> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<S: Storage> Copy for KeyPaddingAttention<'_, S> {}

/// What [`super::AttentionOps::key_padding_attention_backward`] returns: the gradients of q, k
/// and v, each of its input's shape.
#[derive(Clone, Debug)]
pub struct KeyPaddingAttentionGrads<S: Storage> {
    pub q: Tensor<S>,
    pub k: Tensor<S>,
    pub v: Tensor<S>,
}

/// The mask as `[B, 1, Sk]`, dense (it broadcasts over the queries).
fn keep_rows<B: Backend<T> + ?Sized, T: Element>(
    b: &B,
    keep: &BTensor<B, T>,
    a: KeyPadding,
) -> Result<BTensor<B, T>> {
    b.contiguous(keep)?.reshape(&[a.batch, 1, a.k_len])
}

/// The softmax probabilities `[B, Sq, Sk]` before the mask's product, and after it (the same
/// tensor when there is no mask).
fn probs<B: Backend<T> + ?Sized, T: Element>(
    b: &B,
    q: &BTensor<B, T>,
    k: &BTensor<B, T>,
    keep: Option<&BTensor<B, T>>,
    scale: T,
    a: KeyPadding,
) -> Result<(BTensor<B, T>, BTensor<B, T>)> {
    let scores = b.matmul(q, k, NT)?;
    let scores = b.binary_scalar(BinaryOp::Mul, &scores, scale, ScalarSide::Rhs)?;
    let Some(keep) = keep else {
        let p = b.softmax_last(&scores)?;
        return Ok((p.clone(), p));
    };
    let keep = keep_rows(b, keep, a)?;
    // (keep - 1)·1e30: 0 on a kept key (the score unchanged, exactly), -1e30 on padding (the
    // score + -1e30 rounds to -1e30: finite in f32 and f64, its exp after the max shift is 0).
    let bias = b.binary_scalar(BinaryOp::Sub, &keep, T::ONE, ScalarSide::Rhs)?;
    let bias = b.binary_scalar(BinaryOp::Mul, &bias, T::from_f64(1e30), ScalarSide::Rhs)?;
    let p = b.softmax_last(&b.add(&scores, &bias)?)?;
    // An all-padding row's softmax is uniform over padding; the product makes it 0.
    let kept = b.mul(&p, &keep)?;
    Ok((p, kept))
}

/// The forward as a composite of the op set.
pub fn key_padding_composite_forward<B: Backend<T> + ?Sized, T: Element>(
    b: &B,
    q: &BTensor<B, T>,
    k: &BTensor<B, T>,
    v: &BTensor<B, T>,
    key_keep: Option<&BTensor<B, T>>,
    scale: T,
) -> Result<BTensor<B, T>> {
    let a = validate::key_padding_attention("key_padding_attention", q, k, v, key_keep, scale)?;
    if a.is_empty() {
        return b.zeros(&[a.batch, a.q_len, a.dv]);
    }
    let (_, p) = probs(b, q, k, key_keep, scale, a)?;
    b.matmul(&p, v, MatmulOpts::default())
}

/// The backward as a composite of the op set: the probabilities recomputed, then the chain
/// rule through `P·v`, the mask's product, softmax and the scaled `q·kᵀ`.
pub fn key_padding_composite_backward<B: Backend<T> + ?Sized, T: Element>(
    b: &B,
    g: &BTensor<B, T>,
    q: &BTensor<B, T>,
    k: &BTensor<B, T>,
    v: &BTensor<B, T>,
    key_keep: Option<&BTensor<B, T>>,
    scale: T,
) -> Result<KeyPaddingAttentionGrads<B::Storage>> {
    let a = validate::key_padding_attention_backward(g, q, k, v, key_keep, scale)?;
    if a.is_empty() {
        return Ok(KeyPaddingAttentionGrads {
            q: b.zeros(q.shape())?,
            k: b.zeros(k.shape())?,
            v: b.zeros(v.shape())?,
        });
    }
    let (p, kept) = probs(b, q, k, key_keep, scale, a)?;
    let dv = b.matmul(&kept, g, TN)?;
    let dkept = b.matmul(g, v, NT)?;
    let dp = match key_keep {
        Some(keep) => b.mul(&dkept, &keep_rows(b, keep, a)?)?,
        None => dkept,
    };
    let ds = b.softmax_backward(&dp, &p)?;
    let ds = b.binary_scalar(BinaryOp::Mul, &ds, scale, ScalarSide::Rhs)?;
    Ok(KeyPaddingAttentionGrads {
        q: b.matmul(&ds, k, MatmulOpts::default())?,
        k: b.matmul(&ds, q, TN)?,
        v: dv,
    })
}
