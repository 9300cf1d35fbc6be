//! Attention's core as one tape node: the backend's `qk_norm_attention` forward, and its
//! backward op for the gradients of qkv and the four QK-norm LayerNorm parameters.

use super::fused::into_at;
use super::only;
use crate::error::Result;
use crate::tape::{BackwardOp, Saved, Tape};
use crate::var::Var;
use zcompute::{BTensor, Element, QkNorm, prelude::*};

struct QkNormAttentionBackward<B: Ops<T>, T: Element> {
    /// qkv, then q weight, q bias, k weight, k bias (the node's inputs, in order).
    saved: [Saved<B, T>; 5],
    heads: usize,
    eps: T,
    needs: [bool; 5],
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
        let r = b.qk_norm_attention_backward_into(g, qkv?, &norm, param_grads)?;
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
        let out = self.run(tracked, |b| b.qk_norm_attention(&qkv.value, &norm))?;
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
        };
        Ok(self.push1(Box::new(node), &inputs, out, self.new_version()))
    }
}
