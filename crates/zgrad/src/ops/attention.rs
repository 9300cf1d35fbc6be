//! Attention's core as one tape node: the backend's `qk_norm_attention` forward, and its
//! backward op for the gradients of qkv and the four QK-norm LayerNorm parameters. Both run
//! their products under the tape's math mode (`Tape::with_math_mode`, the trainer's precision
//! policy: under bf16 the core's products take bf16 operands with float32 accumulation, its
//! LayerNorms and softmax stay float32; under float32 the float32 op, bit for bit).

use super::fused::into_at;
use super::only;
use crate::error::Result;
use crate::tape::{BackwardOp, Saved, Tape};
use crate::var::Var;
use zcompute::{BTensor, Element, MathMode, QkNorm, prelude::*};

struct QkNormAttentionBackward<B: Ops<T>, T: Element> {
    /// qkv, then q weight, q bias, k weight, k bias (the node's inputs, in order).
    saved: [Saved<B, T>; 5],
    heads: usize,
    eps: T,
    needs: [bool; 5],
    /// The products' arithmetic, as the forward ran.
    mode: MathMode,
}

const NAME: &str = "qk_norm_attention";

impl<B: Ops<T>, T: Element> BackwardOp<B, T> for QkNormAttentionBackward<B, T> {
    fn name(&self) -> &'static str {
        NAME
    }

    fn backward(
        &self,
        b: &B,
        grads: &[Option<BTensor<B, T>>],
    ) -> Result<Vec<Option<BTensor<B, T>>>> {
        self.backward_into(b, grads, &[])
    }

    /// The four QK-norm parameters' gradients go straight into their buffers where the tape
    /// gives them (on the device, the column reduction adds into them: no separate add).
    fn backward_into(
        &self,
        b: &B,
        grads: &[Option<BTensor<B, T>>],
        into: &[Option<&BTensor<B, T>>],
    ) -> Result<Vec<Option<BTensor<B, T>>>> {
        let g = only(grads)?;
        let [qkv, qw, qb, kw, kb] = [0, 1, 2, 3, 4].map(|i| self.saved[i].get(NAME));
        let norm = QkNorm {
            q_weight: qw?,
            q_bias: qb?,
            k_weight: kw?,
            k_bias: kb?,
            heads: self.heads,
            eps: self.eps,
        };
        let param_grads = [1, 2, 3, 4].map(|i| into_at(into, i).filter(|_| self.needs[i]));
        let r = b.qk_norm_attention_backward_into_mode(g, qkv?, &norm, param_grads, self.mode)?;
        let [gqw, gqb, gkw, gkb] = r.params;
        let all = [Some(r.qkv), gqw, gqb, gkw, gkb];
        Ok(all
            .into_iter()
            .zip(self.needs)
            .map(|(t, need)| t.filter(|_| need))
            .collect())
    }
}

impl<B: Ops<T>, T: Element> Tape<'_, B, T> {
    /// Attention's core after the qkv product (`zcompute::AttentionOps::qk_norm_attention`):
    /// `qkv [B, S, 3D]` laid out `[B, S, 3, H, dh]` to `[B, S, D]`, with q and k
    /// LayerNorm-ed over `dh` by `(q_weight, q_bias)` and `(k_weight, k_bias)`. One node; its
    /// backward recomputes the forward from the saved qkv.
    #[allow(clippy::too_many_arguments)]
    pub fn qk_norm_attention(
        &self,
        qkv: &Var<B, T>,
        q_weight: &Var<B, T>,
        q_bias: &Var<B, T>,
        k_weight: &Var<B, T>,
        k_bias: &Var<B, T>,
        heads: usize,
        eps: T,
    ) -> Result<Var<B, T>> {
        let inputs = [qkv, q_weight, q_bias, k_weight, k_bias];
        let tracked = self.tracks(NAME, &inputs)?;
        let norm = QkNorm {
            q_weight: &q_weight.value,
            q_bias: &q_bias.value,
            k_weight: &k_weight.value,
            k_bias: &k_bias.value,
            heads,
            eps,
        };
        let mode = self.math_mode();
        let out = self.run(tracked, |b| {
            b.qk_norm_attention_mode(&qkv.value, &norm, mode)
        })?;
        if !tracked {
            return Ok(self.constant(out));
        }
        let saved = [
            self.save(qkv, "qkv")?,
            self.save(q_weight, "q_weight")?,
            self.save(q_bias, "q_bias")?,
            self.save(k_weight, "k_weight")?,
            self.save(k_bias, "k_bias")?,
        ];
        let node = QkNormAttentionBackward {
            saved,
            heads,
            eps,
            needs: inputs.map(Var::requires_grad),
            mode,
        };
        Ok(self.push1(Box::new(node), &inputs, out, self.new_version()))
    }
}

const KEY_PADDING: &str = "key_padding_attention";

struct KeyPaddingAttentionBackward<B: Ops<T>, T: Element> {
    /// q, k, v (the node's inputs, in order), then the mask when there is one.
    saved: [Saved<B, T>; 3],
    keep: Option<Saved<B, T>>,
    scale: T,
    needs: [bool; 3],
}

impl<B: Ops<T>, T: Element> BackwardOp<B, T> for KeyPaddingAttentionBackward<B, T> {
    fn name(&self) -> &'static str {
        KEY_PADDING
    }

    fn backward(
        &self,
        b: &B,
        grads: &[Option<BTensor<B, T>>],
    ) -> Result<Vec<Option<BTensor<B, T>>>> {
        let g = only(grads)?;
        let [q, k, v] = [0, 1, 2].map(|i| self.saved[i].get(KEY_PADDING));
        let keep = self.keep.as_ref().map(|m| m.get(KEY_PADDING)).transpose()?;
        let r = b.key_padding_attention_backward(
            g,
            &zcompute::KeyPaddingAttention {
                q: q?,
                k: k?,
                v: v?,
                key_keep: keep,
                scale: self.scale,
            },
        )?;
        Ok([r.q, r.k, r.v]
            .into_iter()
            .zip(self.needs)
            .map(|(t, need)| need.then_some(t))
            .collect())
    }
}

impl<B: Ops<T>, T: Element> Tape<'_, B, T> {
    /// Scaled dot-product attention with a key-padding mask as one node
    /// (`zcompute::AttentionOps::key_padding_attention`: fused on the CPU and CUDA backends):
    /// `q [B, Sq, dk]`, `k [B, Sk, dk]`, `v [B, Sk, dv]`, `key_keep [B, Sk]` (1 keep, 0
    /// padding; `None`: every key kept; it gets no gradient) to `[B, Sq, dv]`. A query whose keys
    /// are all padding gets zeros and zero gradients. Its backward recomputes the forward from
    /// the saved q, k, v. [`Tape::masked_attention`] takes it where its shapes fold to these.
    pub fn key_padding_attention(
        &self,
        q: &Var<B, T>,
        k: &Var<B, T>,
        v: &Var<B, T>,
        key_keep: Option<&BTensor<B, T>>,
        scale: T,
    ) -> Result<Var<B, T>> {
        let inputs = [q, k, v];
        let tracked = self.tracks(KEY_PADDING, &inputs)?;
        let out = self.run(tracked, |b| {
            b.key_padding_attention(&zcompute::KeyPaddingAttention {
                q: &q.value,
                k: &k.value,
                v: &v.value,
                key_keep,
                scale,
            })
        })?;
        if !tracked {
            return Ok(self.constant(out));
        }
        let keep = key_keep
            .map(|m| self.save(&Var::constant(m.clone()), "key_keep"))
            .transpose()?;
        let node = KeyPaddingAttentionBackward {
            saved: [self.save(q, "q")?, self.save(k, "k")?, self.save(v, "v")?],
            keep,
            scale,
            needs: inputs.map(Var::requires_grad),
        };
        Ok(self.push1(Box::new(node), &inputs, out, self.new_version()))
    }
}
