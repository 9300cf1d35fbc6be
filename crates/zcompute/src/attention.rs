//! QK-normalised attention's core as one op pair: from the qkv projection `[B, S, 3D]` (laid
//! out `[B, S, 3, H, dh]`, q first) to the heads' outputs concatenated `[B, S, D]`, with
//! LayerNorm of q and k over `dh`, scores scaled by `1/sqrt(dh)`, softmax over keys and `A·v`.
//! The backward recomputes the forward from `qkv` (cheap at the short sequences it is built
//! for), so the forward saves nothing but its input.
//!
//! The attention family: [`AttentionOps`] (the op pair and the backward that adds the QK-norm
//! parameters' gradients into their buffers), the op's argument types, and the composite over
//! the primitives (reshape and permute copies, two LayerNorms, batched products, softmax) that
//! every backend gets as the provided bodies and that a device backend falls back to for shapes
//! its fused kernels do not take.

use crate::backend::{BTensor, Backend, MatmulOpts};
pub use crate::descriptors::QkNorm;
use crate::descriptors::{NT, TN};
use crate::element::Element;
use crate::error::Result;
use crate::precision::{MathMode, unsupported};
use crate::storage::Storage;
use crate::tensor::Tensor;
use crate::validate;

mod key_padding;
pub use key_padding::{
    KeyPaddingAttention, KeyPaddingAttentionGrads, key_padding_composite_backward,
    key_padding_composite_forward,
};

/// What [`AttentionOps::qk_norm_attention_backward`] returns: the gradient of `qkv` (`[B, S, 3D]`)
/// and of the four LayerNorm parameters (each `[dh]`).
#[derive(Clone, Debug)]
pub struct QkNormAttentionGrads<S: Storage> {
    pub qkv: Tensor<S>,
    pub q_weight: Tensor<S>,
    pub q_bias: Tensor<S>,
    pub k_weight: Tensor<S>,
    pub k_bias: Tensor<S>,
}

/// Multi-head self-attention's core with QK-norm, fused. Every method is provided as the
/// composite of [`Backend`]'s primitives; a backend overrides a method with its fused kernel
/// (the CPU backend runs each head as plain loops, the CUDA backend one launch per direction
/// for the shapes `attention.cu` takes).
pub trait AttentionOps<T: Element>: Backend<T> {
    /// Attention's core after the qkv product: `qkv [B, S, 3D]` laid out `[B, S, 3, H, dh]`
    /// (q first) to `softmax(LN(q)·LN(k)ᵀ/sqrt(dh))·v` per batch and head, heads
    /// concatenated `[B, S, D]`.
    fn qk_norm_attention(
        &self,
        qkv: &BTensor<Self, T>,
        norm: &QkNorm<'_, Self::Storage>,
    ) -> Result<BTensor<Self, T>> {
        composite_forward(self, qkv, norm)
    }

    /// The backward of [`AttentionOps::qk_norm_attention`] from the output gradient
    /// `g [B, S, D]`: the gradient of `qkv` and of the four LayerNorm parameters, recomputing
    /// the forward from `qkv`. Deterministic on every backend (fixed-order sums, no atomics).
    fn qk_norm_attention_backward(
        &self,
        g: &BTensor<Self, T>,
        qkv: &BTensor<Self, T>,
        norm: &QkNorm<'_, Self::Storage>,
    ) -> Result<QkNormAttentionGrads<Self::Storage>> {
        composite_backward(self, g, qkv, norm)
    }

    /// [`AttentionOps::qk_norm_attention_backward`] with the LayerNorm parameters' gradients
    /// added into `param_grads` where given (q weight, q bias, k weight, k bias; each `[dh]`:
    /// `+=`), the others returned. The provided body adds after the backward; a device backend
    /// may add its column sums straight into the buffers. Deterministic on every backend.
    fn qk_norm_attention_backward_into(
        &self,
        g: &BTensor<Self, T>,
        qkv: &BTensor<Self, T>,
        norm: &QkNorm<'_, Self::Storage>,
        param_grads: [Option<&BTensor<Self, T>>; 4],
    ) -> Result<QkNormAttentionGradsInto<Self::Storage>> {
        backward_into(self, g, qkv, norm, param_grads)
    }

    /// [`AttentionOps::qk_norm_attention`] with its two products (`Q·Kᵀ`, `P·V`) under `mode`
    /// (the trainer's precision policy, `zgrad::Precision::math_mode`): under
    /// [`MathMode::Bf16`] their operands rounded to bf16 (nearest-even) with float32
    /// accumulation, the LayerNorms and the softmax in float32; under [`MathMode::F32`] and
    /// [`MathMode::Tf32`] the float32 op itself, bit for bit (no backend has a TF32 form of
    /// the fused core; float32 products are within TF32's error, which the mode allows, as
    /// cuBLAS's `FAST_TF32` does). The provided body refuses bf16
    /// ([`crate::ComputeError::MathModeUnsupported`]): never float32 under its name. The CPU
    /// backend (f32) emulates it; the CUDA backend runs the bf16 kernels (the simulated
    /// device: the CPU's code, bit for bit).
    fn qk_norm_attention_mode(
        &self,
        qkv: &BTensor<Self, T>,
        norm: &QkNorm<'_, Self::Storage>,
        mode: MathMode,
    ) -> Result<BTensor<Self, T>> {
        match mode {
            MathMode::F32 | MathMode::Tf32 => self.qk_norm_attention(qkv, norm),
            MathMode::Bf16 => Err(unsupported::<T>(
                "qk_norm_attention_mode",
                mode,
                self.name(),
            )),
        }
    }

    /// [`AttentionOps::qk_norm_attention_backward`] with its four products (`dP = dO·Vᵀ`,
    /// `dV = Pᵀ·dO`, `dQ = dS·K`, `dK = dSᵀ·Q`) and the recomputed forward's under `mode`,
    /// as [`AttentionOps::qk_norm_attention_mode`] says (the softmax backward reads the float32
    /// `P`). The provided body refuses bf16.
    fn qk_norm_attention_backward_mode(
        &self,
        g: &BTensor<Self, T>,
        qkv: &BTensor<Self, T>,
        norm: &QkNorm<'_, Self::Storage>,
        mode: MathMode,
    ) -> Result<QkNormAttentionGrads<Self::Storage>> {
        match mode {
            MathMode::F32 | MathMode::Tf32 => self.qk_norm_attention_backward(g, qkv, norm),
            MathMode::Bf16 => Err(unsupported::<T>(
                "qk_norm_attention_backward_mode",
                mode,
                self.name(),
            )),
        }
    }

    /// [`AttentionOps::qk_norm_attention_backward_into`] under `mode`
    /// ([`AttentionOps::qk_norm_attention_backward_mode`]). The provided body: float32 and
    /// TF32 as `qk_norm_attention_backward_into`; bf16 the backward under the mode, then each
    /// parameter's gradient added into its buffer.
    fn qk_norm_attention_backward_into_mode(
        &self,
        g: &BTensor<Self, T>,
        qkv: &BTensor<Self, T>,
        norm: &QkNorm<'_, Self::Storage>,
        param_grads: [Option<&BTensor<Self, T>>; 4],
        mode: MathMode,
    ) -> Result<QkNormAttentionGradsInto<Self::Storage>> {
        match mode {
            MathMode::F32 | MathMode::Tf32 => {
                self.qk_norm_attention_backward_into(g, qkv, norm, param_grads)
            }
            MathMode::Bf16 => backward_into_mode(self, g, qkv, norm, param_grads, mode),
        }
    }

    /// Scaled dot-product attention with a key-padding mask: `q [B, Sq, dk]`, `k [B, Sk, dk]`,
    /// `v [B, Sk, dv]` and `key_keep [B, Sk]` (1 keep, 0 padding; `None`: every key kept) to
    /// `softmax(q·kᵀ·scale over the kept keys)·v`, `[B, Sq, dv]`. A query whose keys are all
    /// padding gets zeros (never NaN). The CPU and CUDA backends run one fused pass per query
    /// row; the provided body is the composite of the op set.
    fn key_padding_attention(
        &self,
        att: &KeyPaddingAttention<'_, Self::Storage>,
    ) -> Result<BTensor<Self, T>> {
        let KeyPaddingAttention {
            q,
            k,
            v,
            key_keep,
            scale,
        } = *att;
        key_padding_composite_forward(self, q, k, v, key_keep, scale)
    }

    /// The backward of [`AttentionOps::key_padding_attention`] from the output gradient
    /// `g [B, Sq, dv]`: the gradients of q, k and v (zero for padded keys and for queries whose
    /// keys are all padding), recomputing the forward. Deterministic on every backend.
    fn key_padding_attention_backward(
        &self,
        g: &BTensor<Self, T>,
        att: &KeyPaddingAttention<'_, Self::Storage>,
    ) -> Result<KeyPaddingAttentionGrads<Self::Storage>> {
        let KeyPaddingAttention {
            q,
            k,
            v,
            key_keep,
            scale,
        } = *att;
        key_padding_composite_backward(self, g, q, k, v, key_keep, scale)
    }
}

/// The forward's intermediates in the head-major layout `[B, H, S, dh]` (`probs` `[B, H, S, S]`).
struct Heads<S: Storage> {
    /// q and k before their LayerNorm, and v (dense copies out of `qkv`).
    q: Tensor<S>,
    k: Tensor<S>,
    v: Tensor<S>,
    qn: crate::backend::LayerNormOut<S>,
    kn: crate::backend::LayerNormOut<S>,
    probs: Tensor<S>,
}

/// A batched matrix product of the composite: the float32 [`Backend::matmul`], or a product
/// under a [`MathMode`] ([`PrecisionOps::matmul_mode`](crate::PrecisionOps::matmul_mode)).
type Product<'a, S> = &'a dyn Fn(&Tensor<S>, &Tensor<S>, MatmulOpts) -> Result<Tensor<S>>;

fn heads_forward<B: Backend<T> + ?Sized, T: Element>(
    b: &B,
    qkv: &Tensor<B::Storage>,
    norm: &QkNorm<'_, B::Storage>,
    a: validate::Attention,
    mm: Product<'_, B::Storage>,
) -> Result<Heads<B::Storage>> {
    // [B, S, 3, H, dh] -> [3, B, H, S, dh]; a narrow of the first axis gives q, k, v.
    let split = qkv
        .reshape(&[a.batch, a.seq, 3, a.heads, a.dh])?
        .permute(&[2, 0, 3, 1, 4])?;
    let heads_shape = [a.batch, a.heads, a.seq, a.dh];
    let part = |i: usize| -> Result<Tensor<B::Storage>> {
        b.contiguous(&split.narrow(0, i, 1)?)?.reshape(&heads_shape)
    };
    let (q, k, v) = (part(0)?, part(1)?, part(2)?);
    let qn = b.layer_norm(&q, Some(norm.q_weight), Some(norm.q_bias), norm.eps)?;
    let kn = b.layer_norm(&k, Some(norm.k_weight), Some(norm.k_bias), norm.eps)?;
    let scores = mm(&qn.out, &kn.out, NT)?;
    let scores = b.binary_scalar(
        crate::backend::BinaryOp::Mul,
        &scores,
        a.scale::<T>(),
        crate::backend::ScalarSide::Rhs,
    )?;
    let probs = b.softmax_last(&scores)?;
    Ok(Heads {
        q,
        k,
        v,
        qn,
        kn,
        probs,
    })
}

/// `[B, H, S, dh]` -> `[B, S, H, dh]` dense -> `[B, S, D]`.
fn concat_heads<B: Backend<T> + ?Sized, T: Element>(
    b: &B,
    x: &Tensor<B::Storage>,
    a: validate::Attention,
) -> Result<Tensor<B::Storage>> {
    b.contiguous(&x.permute(&[0, 2, 1, 3])?)?
        .reshape(&[a.batch, a.seq, a.heads * a.dh])
}

/// The forward as today's composite of the op set (the reference the fused kernels replace).
pub fn composite_forward<B: Backend<T> + ?Sized, T: Element>(
    b: &B,
    qkv: &Tensor<B::Storage>,
    norm: &QkNorm<'_, B::Storage>,
) -> Result<Tensor<B::Storage>> {
    forward_with(b, qkv, norm, &|x, y, o| b.matmul(x, y, o))
}

/// [`composite_forward`] with its two products under `mode`
/// ([`PrecisionOps::matmul_mode`](crate::PrecisionOps::matmul_mode)): a device backend's
/// fallback for the shapes its fused kernels do not take.
pub fn composite_forward_mode<B: crate::PrecisionOps<T> + ?Sized, T: Element>(
    b: &B,
    qkv: &Tensor<B::Storage>,
    norm: &QkNorm<'_, B::Storage>,
    mode: MathMode,
) -> Result<Tensor<B::Storage>> {
    forward_with(b, qkv, norm, &|x, y, o| b.matmul_mode(x, y, o, mode))
}

fn forward_with<B: Backend<T> + ?Sized, T: Element>(
    b: &B,
    qkv: &Tensor<B::Storage>,
    norm: &QkNorm<'_, B::Storage>,
    mm: Product<'_, B::Storage>,
) -> Result<Tensor<B::Storage>> {
    let a = validate::qk_norm_attention(qkv, norm)?;
    if a.is_empty() {
        return b.zeros(&[a.batch, a.seq, a.heads * a.dh]);
    }
    let h = heads_forward(b, qkv, norm, a, mm)?;
    let out = mm(&h.probs, &h.v, MatmulOpts::default())?;
    concat_heads(b, &out, a)
}

/// The backward as a composite of the op set: the forward recomputed, then the chain rule
/// through `A·v`, softmax, the scaled `q·kᵀ` and both LayerNorms.
pub fn composite_backward<B: Backend<T> + ?Sized, T: Element>(
    b: &B,
    g: &Tensor<B::Storage>,
    qkv: &Tensor<B::Storage>,
    norm: &QkNorm<'_, B::Storage>,
) -> Result<QkNormAttentionGrads<B::Storage>> {
    backward_with(b, g, qkv, norm, &|x, y, o| b.matmul(x, y, o))
}

/// [`composite_backward`] with every product (the recomputed forward's and the four of the
/// backward) under `mode`, as [`composite_forward_mode`].
pub fn composite_backward_mode<B: crate::PrecisionOps<T> + ?Sized, T: Element>(
    b: &B,
    g: &Tensor<B::Storage>,
    qkv: &Tensor<B::Storage>,
    norm: &QkNorm<'_, B::Storage>,
    mode: MathMode,
) -> Result<QkNormAttentionGrads<B::Storage>> {
    backward_with(b, g, qkv, norm, &|x, y, o| b.matmul_mode(x, y, o, mode))
}

fn backward_with<B: Backend<T> + ?Sized, T: Element>(
    b: &B,
    g: &Tensor<B::Storage>,
    qkv: &Tensor<B::Storage>,
    norm: &QkNorm<'_, B::Storage>,
    mm: Product<'_, B::Storage>,
) -> Result<QkNormAttentionGrads<B::Storage>> {
    let a = validate::qk_norm_attention_backward(g, qkv, norm)?;
    if a.is_empty() {
        let dh = [a.dh];
        return Ok(QkNormAttentionGrads {
            qkv: b.zeros(qkv.shape())?,
            q_weight: b.zeros(&dh)?,
            q_bias: b.zeros(&dh)?,
            k_weight: b.zeros(&dh)?,
            k_bias: b.zeros(&dh)?,
        });
    }
    let h = heads_forward(b, qkv, norm, a, mm)?;
    // g [B, S, D] -> [B, H, S, dh]
    let go = b.contiguous(
        &g.reshape(&[a.batch, a.seq, a.heads, a.dh])?
            .permute(&[0, 2, 1, 3])?,
    )?;
    let dv = mm(&h.probs, &go, TN)?;
    let dp = mm(&go, &h.v, NT)?;
    let ds = b.softmax_backward(&dp, &h.probs)?;
    let ds = b.binary_scalar(
        crate::backend::BinaryOp::Mul,
        &ds,
        a.scale::<T>(),
        crate::backend::ScalarSide::Rhs,
    )?;
    let dqn = mm(&ds, &h.kn.out, MatmulOpts::default())?;
    let dkn = mm(&ds, &h.qn.out, TN)?;
    let rows = [a.batch * a.heads * a.seq, a.dh];
    let ln = |g: &Tensor<B::Storage>,
              x: &Tensor<B::Storage>,
              stats: &crate::backend::LayerNormOut<B::Storage>,
              w: &Tensor<B::Storage>|
     -> Result<[Tensor<B::Storage>; 3]> {
        let r = b.layer_norm_backward(g, x, &stats.mean, &stats.rstd, Some(w), [true, true])?;
        let missing = || crate::error::ComputeError::LengthMismatch {
            op: "qk_norm_attention_backward (layer_norm_backward results)",
            expected: 2,
            got: 1,
        };
        let gx = r.input.ok_or_else(missing)?;
        let gw = b.sum(&r.g_xhat.ok_or_else(missing)?.reshape(&rows)?, 0, false)?;
        let gb = b.sum(&g.reshape(&rows)?, 0, false)?;
        Ok([gx, gw, gb])
    };
    let [dq, dqw, dqb] = ln(&dqn, &h.q, &h.qn, norm.q_weight)?;
    let [dk, dkw, dkb] = ln(&dkn, &h.k, &h.kn, norm.k_weight)?;
    // Written back through [3, B, H, S, dh] views of a [B, S, 3, H, dh] gradient.
    let g_qkv = b.zeros(&[a.batch, a.seq, 3 * a.heads * a.dh])?;
    let dst = g_qkv
        .reshape(&[a.batch, a.seq, 3, a.heads, a.dh])?
        .permute(&[2, 0, 3, 1, 4])?;
    for (i, part) in [dq, dk, dv].iter().enumerate() {
        let view = dst.narrow(0, i, 1)?;
        b.copy_into(&part.reshape(view.shape())?, &view)?;
    }
    Ok(QkNormAttentionGrads {
        qkv: g_qkv,
        q_weight: dqw,
        q_bias: dqb,
        k_weight: dkw,
        k_bias: dkb,
    })
}

/// What [`AttentionOps::qk_norm_attention_backward_into`] returns: the gradient of `qkv`, and the
/// gradient of each LayerNorm parameter (q weight, q bias, k weight, k bias, each `[dh]`) that
/// had no buffer to go into (`None` where it was added into the caller's buffer).
#[derive(Clone, Debug)]
pub struct QkNormAttentionGradsInto<S: Storage> {
    pub qkv: Tensor<S>,
    pub params: [Option<Tensor<S>>; 4],
}

/// The provided body of [`AttentionOps::qk_norm_attention_backward_into`]: the backward, then
/// each parameter's gradient added into its buffer (one `add_into` each).
pub(crate) fn backward_into<B: AttentionOps<T> + ?Sized, T: Element>(
    b: &B,
    g: &Tensor<B::Storage>,
    qkv: &Tensor<B::Storage>,
    norm: &QkNorm<'_, B::Storage>,
    param_grads: [Option<&Tensor<B::Storage>>; 4],
) -> Result<QkNormAttentionGradsInto<B::Storage>> {
    backward_into_mode(b, g, qkv, norm, param_grads, MathMode::F32)
}

/// [`backward_into`] with the backward under `mode`
/// ([`AttentionOps::qk_norm_attention_backward_mode`]; float32: the plain backward).
pub(crate) fn backward_into_mode<B: AttentionOps<T> + ?Sized, T: Element>(
    b: &B,
    g: &Tensor<B::Storage>,
    qkv: &Tensor<B::Storage>,
    norm: &QkNorm<'_, B::Storage>,
    param_grads: [Option<&Tensor<B::Storage>>; 4],
    mode: MathMode,
) -> Result<QkNormAttentionGradsInto<B::Storage>> {
    validate::qk_norm_attention_backward_into(g, qkv, norm, param_grads)?;
    let r = match mode {
        MathMode::F32 => b.qk_norm_attention_backward(g, qkv, norm)?,
        _ => b.qk_norm_attention_backward_mode(g, qkv, norm, mode)?,
    };
    let grads = [r.q_weight, r.q_bias, r.k_weight, r.k_bias];
    let mut params = [None, None, None, None];
    for ((grad, dst), out) in grads.into_iter().zip(param_grads).zip(&mut params) {
        match dst {
            Some(dst) => b.add_into(&grad, dst)?,
            None => *out = Some(grad),
        }
    }
    Ok(QkNormAttentionGradsInto { qkv: r.qkv, params })
}
