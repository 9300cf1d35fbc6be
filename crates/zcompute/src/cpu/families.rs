//! The fusion families on the host: the CPU backend's own loops where it has them
//! (`attention.rs`, `fused.rs`), the provided composites for the rest.

use super::{CpuBackend, accumulate, attention, fused, key_padding};
use crate::attention::{
    AttentionOps, KeyPaddingAttention, KeyPaddingAttentionGrads, QkNorm, QkNormAttentionGrads,
};
use crate::backend::{BTensor, Backend, LayerNormBackward, LayerNormGrads};
use crate::element::{DType, Element};
use crate::error::Result;
use crate::linear::{Activation, LinearOps};
use crate::norm::{AddLayerNormOut, NormOps};
use crate::optim::{OptimOps, SgdConfig};
use crate::pinned::{HostVec, PinnedHost, pinned_range};
use crate::pooled_loss::{PoolHeadBceGrads, PoolHeadBceOut, PooledLossOps};
use crate::precision::{MathMode, unsupported};
use crate::readback::ReadbackOps;
use crate::step::StepOps;
use crate::storage::CpuStorage;
use crate::tensor::CpuTensor;

impl<T: Element> LinearOps<T> for CpuBackend {
    fn bias_act(
        &self,
        x: &CpuTensor<T>,
        bias: &CpuTensor<T>,
        act: Activation,
    ) -> Result<CpuTensor<T>> {
        fused::bias_act(x, bias, act)
    }

    fn linear(
        &self,
        x: &CpuTensor<T>,
        w: &CpuTensor<T>,
        bias: &CpuTensor<T>,
        act: Activation,
    ) -> Result<CpuTensor<T>> {
        fused::linear(x, w, bias, act, None)
    }

    fn linear_add(
        &self,
        x: &CpuTensor<T>,
        w: &CpuTensor<T>,
        bias: &CpuTensor<T>,
        act: Activation,
        residual: &CpuTensor<T>,
    ) -> Result<CpuTensor<T>> {
        fused::linear(x, w, bias, act, Some(residual))
    }

    fn tanh_backward(&self, g: &CpuTensor<T>, y: &CpuTensor<T>) -> Result<CpuTensor<T>> {
        fused::tanh_backward(g, y)
    }
}

impl<T: Element> NormOps<T> for CpuBackend {
    fn add_layer_norm(
        &self,
        a: &CpuTensor<T>,
        b: &CpuTensor<T>,
        weight: Option<&CpuTensor<T>>,
        bias: Option<&CpuTensor<T>>,
        eps: T,
    ) -> Result<AddLayerNormOut<CpuStorage<T>>> {
        fused::add_layer_norm(a, b, weight, bias, eps)
    }

    fn layer_norm_backward_add(
        &self,
        ln: &LayerNormBackward<'_, CpuStorage<T>>,
        want: [bool; 2],
    ) -> Result<LayerNormGrads<CpuStorage<T>>> {
        accumulate::layer_norm_backward_add(ln, want)
    }
}

/// Whether attention's core runs its products' operands rounded to bf16 under `mode`: float32
/// and TF32 run the float32 core (see `AttentionOps::qk_norm_attention_mode`), bf16 the
/// emulation, on f32 elements only (f64 refuses it, as its other bf16 products).
fn attention_bf16<T: Element>(cpu: &CpuBackend, op: &'static str, mode: MathMode) -> Result<bool> {
    match mode {
        MathMode::F32 | MathMode::Tf32 => Ok(false),
        MathMode::Bf16 if T::DTYPE == DType::F32 => Ok(true),
        MathMode::Bf16 => Err(unsupported::<T>(op, mode, Backend::<T>::name(cpu))),
    }
}

impl<T: Element> AttentionOps<T> for CpuBackend {
    fn qk_norm_attention(
        &self,
        qkv: &CpuTensor<T>,
        norm: &QkNorm<'_, CpuStorage<T>>,
    ) -> Result<CpuTensor<T>> {
        attention::forward(qkv, norm, false)
    }

    fn qk_norm_attention_mode(
        &self,
        qkv: &CpuTensor<T>,
        norm: &QkNorm<'_, CpuStorage<T>>,
        mode: MathMode,
    ) -> Result<CpuTensor<T>> {
        let bf16 = attention_bf16::<T>(self, "qk_norm_attention_mode", mode)?;
        attention::forward(qkv, norm, bf16)
    }

    fn qk_norm_attention_backward_mode(
        &self,
        g: &CpuTensor<T>,
        qkv: &CpuTensor<T>,
        norm: &QkNorm<'_, CpuStorage<T>>,
        mode: MathMode,
    ) -> Result<QkNormAttentionGrads<CpuStorage<T>>> {
        let bf16 = attention_bf16::<T>(self, "qk_norm_attention_backward_mode", mode)?;
        attention::backward(g, qkv, norm, bf16)
    }

    fn qk_norm_attention_backward(
        &self,
        g: &CpuTensor<T>,
        qkv: &CpuTensor<T>,
        norm: &QkNorm<'_, CpuStorage<T>>,
    ) -> Result<QkNormAttentionGrads<CpuStorage<T>>> {
        attention::backward(g, qkv, norm, false)
    }

    fn key_padding_attention(
        &self,
        att: &KeyPaddingAttention<'_, CpuStorage<T>>,
    ) -> Result<CpuTensor<T>> {
        let KeyPaddingAttention {
            q,
            k,
            v,
            key_keep,
            scale,
        } = *att;
        key_padding::forward(q, k, v, key_keep, scale)
    }

    fn key_padding_attention_backward(
        &self,
        g: &CpuTensor<T>,
        att: &KeyPaddingAttention<'_, CpuStorage<T>>,
    ) -> Result<KeyPaddingAttentionGrads<CpuStorage<T>>> {
        let KeyPaddingAttention {
            q,
            k,
            v,
            key_keep,
            scale,
        } = *att;
        key_padding::backward(g, q, k, v, key_keep, scale)
    }
}

impl<T: Element> PooledLossOps<T> for CpuBackend {
    fn pool_head_bce(
        &self,
        h: &CpuTensor<T>,
        weight: &CpuTensor<T>,
        bias: &CpuTensor<T>,
        targets: &CpuTensor<T>,
    ) -> Result<PoolHeadBceOut<CpuStorage<T>>> {
        fused::pool_head_bce(h, weight, bias, targets)
    }

    fn pool_head_bce_backward(
        &self,
        g: &CpuTensor<T>,
        h: &CpuTensor<T>,
        weight: &CpuTensor<T>,
        logits: &CpuTensor<T>,
        targets: &CpuTensor<T>,
    ) -> Result<PoolHeadBceGrads<CpuStorage<T>>> {
        fused::pool_head_bce_backward(g, h, weight, logits, targets)
    }
}

impl<T: Element> OptimOps<T> for CpuBackend {
    fn sgd_step(
        &self,
        p: &CpuTensor<T>,
        buf: Option<&CpuTensor<T>>,
        g: &CpuTensor<T>,
        slot: &CpuTensor<T>,
        cfg: &SgdConfig<T>,
    ) -> Result<()> {
        super::train::sgd_step(p, buf, g, slot, cfg)
    }
}

// The step's ops and the read-back run as their composites: the CPU's work runs in call order,
// so a download queued is a download done.
impl<T: Element> StepOps<T> for CpuBackend {}
impl<T: Element> ReadbackOps<T> for CpuBackend {}

// Host memory is its own staging: a plain vector, uploaded through `upload_into`.
impl<T: Element> PinnedHost<T> for CpuBackend {
    type Pinned = HostVec<T>;

    fn alloc_pinned(&self, len: usize) -> Result<HostVec<T>> {
        Ok(HostVec(vec![T::ZERO; len]))
    }

    fn upload_pinned(&self, src: &HostVec<T>, start: usize, dst: &BTensor<Self, T>) -> Result<()> {
        let r = pinned_range("upload_pinned", src.0.len(), start, dst.numel())?;
        self.upload_into(&src.0[r], dst)
    }
}
