//! Attention's core on the device: the fused kernels of `kernels/attention_short.cu` (S <= 16,
//! heads of 32 or 64) or else `kernels/attention.cu` (one block per (batch, head), q, k, v read
//! in the projection's layout) for the short sequences they are built for, and the composite of the op set (`crate::attention`) for every other shape. The
//! backward kernel writes per-(batch, head) rows of LayerNorm parameter partials that one
//! column reduction sums in a fixed order (adding into the parameters' gradient buffers for
//! `qk_norm_attention_backward_into`): no atomics, two runs give the same bits. Under
//! `MathMode::Bf16` the same launches take each kernel's bf16 form (its products' operands
//! rounded to bf16, float32 accumulation; softmax and LayerNorm in float32), and the
//! composite fallback runs its products under the mode.

use super::kernels::{Args, Kernel, ptr};
use super::rows::ColumnReduction;
use super::{CudaBackend, CudaStorage, CudaTensor};
use crate::attention::AttentionOps;
use crate::attention::{
    KeyPaddingAttention, KeyPaddingAttentionGrads, QkNorm, QkNormAttentionGrads,
    QkNormAttentionGradsInto, composite_backward, composite_forward,
};
use crate::attention::{composite_backward_mode, composite_forward_mode};
use crate::backend::{Backend, ReduceOp};
use crate::error::Result;
use crate::layout::Layout;
use crate::precision::MathMode;
use crate::tensor::Tensor;
use crate::validate::{self, Attention};
use zdevice::{Driver, KernelArg, LaunchConfig};

/// Longest sequence the fused kernels take (their per-row loops are sized for short ones).
pub(crate) const FUSED_MAX_SEQ: usize = 64;
/// Widest head the fused kernels take.
pub(crate) const FUSED_MAX_DH: usize = 256;
/// Dynamic shared memory a launch may use without the per-function opt-in (48 KiB on every
/// GPU since compute 2.0); larger heads go to the composite.
pub(crate) const FUSED_MAX_SHARED: usize = 48 * 1024;
/// Warps per block (`ATTN_WARPS` in attention.cu).
pub(crate) const WARPS: usize = 16;

/// Longest sequence the short kernels of `kernels/attention_short.cu` take
/// (`ATTN_SHORT_MAX_SEQ`).
pub(crate) const SHORT_MAX_SEQ: usize = 16;
/// (batch, head) blocks from which the short kernels run 4 warps a block (each warp several
/// rows: more blocks resident at once); below it one warp a row. Measured on an H100 at S = 12,
/// dh = 64: 1024 blocks took 10.1 us forward and 19.5 backward with 4 warps against 10.1 and
/// 23.5 with 12; 256 blocks 7.0 and 10.8 with 4 against 4.0 and 6.8 with 12.
const SHORT_MANY_BLOCKS: usize = 512;

/// Shared memory of the short forward kernel: kn and v `[S, dh]`.
pub(crate) fn short_forward_shared_bytes(a: Attention) -> usize {
    4 * 2 * a.seq * a.dh
}

/// Shared memory of the short backward kernel: qn, go, qhat, dqn, khat, dkn, kn, v `[S, dh]`,
/// P and dS `[S, S]`, k's rstd.
pub(crate) fn short_backward_shared_bytes(a: Attention) -> usize {
    4 * (8 * a.seq * a.dh + 2 * a.seq * a.seq + a.seq)
}

/// A kernel's bf16 form (the same launch and parameters; its products' operands rounded to
/// bf16) where `bf16`, else the kernel itself.
fn form(kernel: Kernel, bf16: bool) -> Kernel {
    if !bf16 {
        return kernel;
    }
    match kernel {
        Kernel::QkNormAttention => Kernel::QkNormAttentionBf16,
        Kernel::QkNormAttentionBackward => Kernel::QkNormAttentionBackwardBf16,
        Kernel::QkNormAttentionDh32 => Kernel::QkNormAttentionDh32Bf16,
        Kernel::QkNormAttentionDh64 => Kernel::QkNormAttentionDh64Bf16,
        Kernel::QkNormAttentionBackwardDh32 => Kernel::QkNormAttentionBackwardDh32Bf16,
        Kernel::QkNormAttentionBackwardDh64 => Kernel::QkNormAttentionBackwardDh64Bf16,
        other => other,
    }
}

/// Whether attention's core runs its bf16 forms under `mode`: float32 and TF32 run the
/// float32 kernels (`AttentionOps::qk_norm_attention_mode` says why TF32 may).
fn is_bf16(mode: MathMode) -> bool {
    mode == MathMode::Bf16
}

/// The short kernel for this shape and its launch (one block per (batch, head), the warps as
/// `SHORT_MANY_BLOCKS` says), or `None` where the shape is not one it takes.
pub(crate) fn short_launch(a: Attention, backward: bool) -> Option<(Kernel, LaunchConfig)> {
    let kernel = match (a.dh, backward) {
        (32, false) => Kernel::QkNormAttentionDh32,
        (64, false) => Kernel::QkNormAttentionDh64,
        (32, true) => Kernel::QkNormAttentionBackwardDh32,
        (64, true) => Kernel::QkNormAttentionBackwardDh64,
        _ => return None,
    };
    let blocks = a.batch.checked_mul(a.heads)?;
    if a.is_empty() || a.seq > SHORT_MAX_SEQ || blocks >= i32::MAX as usize {
        return None;
    }
    let warps = if blocks >= SHORT_MANY_BLOCKS {
        4
    } else {
        a.seq
    };
    let shared = if backward {
        short_backward_shared_bytes(a)
    } else {
        short_forward_shared_bytes(a)
    };
    Some((
        kernel,
        LaunchConfig {
            grid: (blocks as u32, 1, 1),
            block: (warps as u32 * 32, 1, 1),
            shared_mem_bytes: shared as u32,
        },
    ))
}

/// The kernel and launch for a shape: the short kernel where it applies, else attention.cu's
/// where the shape fits it, else `None` (the caller runs the composite); in its bf16 form
/// where `bf16`.
fn pick(a: Attention, backward: bool, bf16: bool) -> Option<(Kernel, LaunchConfig)> {
    short_launch(a, backward)
        .or_else(|| {
            let (kernel, shared) = if backward {
                (Kernel::QkNormAttentionBackward, backward_shared_bytes(a))
            } else {
                (Kernel::QkNormAttention, forward_shared_bytes(a))
            };
            fused_config(a, shared).map(|c| (kernel, c))
        })
        .map(|(kernel, config)| (form(kernel, bf16), config))
}

/// Floats between rows of a `[S, dh]` array in the kernels' shared memory (`ld` in
/// attention.cu): odd, so a warp reading one column of different rows has no bank conflicts.
fn row_pitch(a: Attention) -> usize {
    a.dh | 1
}

/// Shared memory of the forward kernel: kn and v, one q row and one probability row per warp.
pub(crate) fn forward_shared_bytes(a: Attention) -> usize {
    4 * (2 * a.seq * row_pitch(a) + WARPS * (a.dh + a.seq))
}

/// Shared memory of the backward kernel: qhat, khat, v, go, and qn, kn (the normalised q and k
/// with their weights applied) `[S, dh]`, P and dS `[S, S]`, two rstd rows.
pub(crate) fn backward_shared_bytes(a: Attention) -> usize {
    4 * (6 * a.seq * row_pitch(a) + 2 * a.seq * a.seq + 2 * a.seq)
}

/// The launch of a fused kernel needing `shared` bytes, or `None` where the shape is outside
/// what the kernels take (the caller runs the composite).
pub(crate) fn fused_config(a: Attention, shared: usize) -> Option<LaunchConfig> {
    let blocks = u32::try_from(a.batch.checked_mul(a.heads)?).ok()?;
    let fits = !a.is_empty()
        && a.seq <= FUSED_MAX_SEQ
        && a.dh <= FUSED_MAX_DH
        && shared <= FUSED_MAX_SHARED
        && blocks < i32::MAX as u32;
    fits.then(|| LaunchConfig {
        grid: (blocks, 1, 1),
        block: (WARPS as u32 * 32, 1, 1),
        shared_mem_bytes: shared as u32,
    })
}

fn sizes(a: Attention) -> [KernelArg; 4] {
    // The fused shapes are small (checked by `fused_config`), so each size fits in 32 bits.
    [a.batch, a.seq, a.heads, a.dh].map(|v| KernelArg::U32(v as u32))
}

impl<D: Driver> CudaBackend<D> {
    /// Dense copies (or the tensors themselves) of the LayerNorm parameters, as kernel
    /// arguments in the kernels' order.
    fn norm_args(&self, op: &'static str, norm: &QkNorm<'_, CudaStorage>) -> Result<Args> {
        let mut args = Args::new();
        for t in [norm.q_weight, norm.q_bias, norm.k_weight, norm.k_bias] {
            let t = self.dense(op, t)?;
            args.push(ptr(self.ptr(op, &t)?));
        }
        Ok(args)
    }

    pub(crate) fn qk_norm_attention_fused(
        &self,
        qkv: &CudaTensor,
        norm: &QkNorm<'_, CudaStorage>,
        mode: MathMode,
    ) -> Result<CudaTensor> {
        const OP: &str = "qk_norm_attention";
        let a = validate::qk_norm_attention(qkv, norm)?;
        let Some((kernel, config)) = pick(a, false, is_bf16(mode)) else {
            return if is_bf16(mode) {
                composite_forward_mode(self, qkv, norm, mode)
            } else {
                composite_forward(self, qkv, norm)
            };
        };
        let out = self.alloc(OP, &[a.batch, a.seq, a.heads * a.dh])?;
        let src = self.dense(OP, qkv)?;
        let mut args: Args = [ptr(self.ptr(OP, &out)?), ptr(self.ptr(OP, &src)?)]
            .into_iter()
            .collect();
        args.extend(self.norm_args(OP, norm)?);
        args.extend(sizes(a));
        args.push(KernelArg::F32(norm.eps));
        self.launch(OP, kernel, config, &args)?;
        Ok(out)
    }

    /// The backward kernel's launch, or `None` where the shape is outside what it takes:
    /// `qkv`'s gradient and the parameter partials `[4, B*H, dh]` (q weight, q bias, k weight,
    /// k bias; each parameter's rows one dense block).
    fn attention_backward_kernel(
        &self,
        op: &'static str,
        g: &CudaTensor,
        qkv: &CudaTensor,
        norm: &QkNorm<'_, CudaStorage>,
        a: Attention,
        mode: MathMode,
    ) -> Result<Option<(CudaTensor, CudaTensor)>> {
        let Some((kernel, config)) = pick(a, true, is_bf16(mode)) else {
            return Ok(None);
        };
        let g_qkv = self.alloc(op, qkv.shape())?;
        let partials = self.alloc_temp(op, &[4, a.batch * a.heads, a.dh])?;
        let (gc, src) = (self.dense(op, g)?, self.dense(op, qkv)?);
        let mut args: Args = [&g_qkv, &partials, &gc, &src]
            .into_iter()
            .map(|t| self.ptr(op, t).map(ptr))
            .collect::<Result<_>>()?;
        args.extend(self.norm_args(op, norm)?);
        args.extend(sizes(a));
        args.push(KernelArg::F32(norm.eps));
        self.launch(op, kernel, config, &args)?;
        Ok(Some((g_qkv, partials)))
    }

    pub(crate) fn qk_norm_attention_backward_fused(
        &self,
        g: &CudaTensor,
        qkv: &CudaTensor,
        norm: &QkNorm<'_, CudaStorage>,
        mode: MathMode,
    ) -> Result<QkNormAttentionGrads<CudaStorage>> {
        const OP: &str = "qk_norm_attention_backward";
        let a = validate::qk_norm_attention_backward(g, qkv, norm)?;
        let kernel = self.attention_backward_kernel(OP, g, qkv, norm, a, mode)?;
        let Some((g_qkv, partials)) = kernel else {
            return if is_bf16(mode) {
                composite_backward_mode(self, g, qkv, norm, mode)
            } else {
                composite_backward(self, g, qkv, norm)
            };
        };
        // One fixed-order column reduction over the (batch, head) rows of each parameter:
        // [4, dh], then a view per parameter.
        let rows = a.batch * a.heads;
        let sums = self.alloc(OP, &[4, a.dh])?;
        self.reduce_cols(ColumnReduction {
            name: OP,
            op: ReduceOp::Sum,
            out: &sums,
            src: &partials,
            shape: (4, rows, a.dh),
            count: rows,
            accumulate: false,
        })?;
        let part = |k: usize| sums.narrow(0, k, 1)?.reshape(&[a.dh]);
        Ok(QkNormAttentionGrads {
            qkv: g_qkv,
            q_weight: part(0)?,
            q_bias: part(1)?,
            k_weight: part(2)?,
            k_bias: part(3)?,
        })
    }

    /// The backward with the parameter gradients added into the given buffers by the column
    /// reduction itself: one reduction over all four where the buffers are adjacent and in
    /// order in one dense buffer (zgrad's flat gradients), else one per parameter.
    pub(crate) fn qk_norm_attention_backward_into_fused(
        &self,
        g: &CudaTensor,
        qkv: &CudaTensor,
        norm: &QkNorm<'_, CudaStorage>,
        param_grads: [Option<&CudaTensor>; 4],
        mode: MathMode,
    ) -> Result<QkNormAttentionGradsInto<CudaStorage>> {
        const OP: &str = "qk_norm_attention_backward_into";
        let a = validate::qk_norm_attention_backward_into(g, qkv, norm, param_grads)?;
        let kernel = self.attention_backward_kernel(OP, g, qkv, norm, a, mode)?;
        let Some((g_qkv, partials)) = kernel else {
            return crate::attention::backward_into_mode(self, g, qkv, norm, param_grads, mode);
        };
        let rows = a.batch * a.heads;
        if let Some(span) = adjacent_span(&param_grads, a.dh)? {
            self.reduce_cols(ColumnReduction {
                name: OP,
                op: ReduceOp::Sum,
                out: &span,
                src: &partials,
                shape: (4, rows, a.dh),
                count: rows,
                accumulate: true,
            })?;
            return Ok(QkNormAttentionGradsInto {
                qkv: g_qkv,
                params: [None, None, None, None],
            });
        }
        let mut params = [None, None, None, None];
        for (k, (dst, out)) in param_grads.into_iter().zip(&mut params).enumerate() {
            let part = partials.narrow(0, k, 1)?.reshape(&[rows, a.dh])?;
            match dst {
                Some(dst) => self.sum_rows_into_cols(&part, dst)?,
                None => *out = Some(self.sum(&part, 0, false)?),
            }
        }
        Ok(QkNormAttentionGradsInto { qkv: g_qkv, params })
    }
}

/// One dense `[k * dh]` view over the `k` buffers when all are given, dense and adjacent in
/// order in one storage (as zgrad's flat gradient buffer lays them out when `dh` is a multiple
/// of its alignment); `None` otherwise.
pub(super) fn adjacent_span(bufs: &[Option<&CudaTensor>], dh: usize) -> Result<Option<CudaTensor>> {
    let Some(Some(first)) = bufs.first() else {
        return Ok(None);
    };
    let start = first.layout().offset();
    let adjacent = bufs.iter().enumerate().all(|(k, t)| {
        t.is_some_and(|t| {
            t.is_contiguous() && t.shares_storage(first) && t.layout().offset() == start + k * dh
        })
    });
    if !adjacent {
        return Ok(None);
    }
    let layout = Layout::new(&[bufs.len() * dh], &[1], start)?;
    Ok(Some(Tensor::from_parts(first.storage().clone(), layout)?))
}

/// The attention family on the device: `attention.cu` for the shapes it takes (see above and
/// `cuda/key_padding.rs`), the composite otherwise.
impl<D: Driver> AttentionOps<f32> for CudaBackend<D> {
    fn qk_norm_attention(
        &self,
        qkv: &CudaTensor,
        norm: &QkNorm<'_, CudaStorage>,
    ) -> Result<CudaTensor> {
        self.qk_norm_attention_fused(qkv, norm, MathMode::F32)
    }

    fn qk_norm_attention_mode(
        &self,
        qkv: &CudaTensor,
        norm: &QkNorm<'_, CudaStorage>,
        mode: MathMode,
    ) -> Result<CudaTensor> {
        self.qk_norm_attention_fused(qkv, norm, mode)
    }

    fn qk_norm_attention_backward_mode(
        &self,
        g: &CudaTensor,
        qkv: &CudaTensor,
        norm: &QkNorm<'_, CudaStorage>,
        mode: MathMode,
    ) -> Result<QkNormAttentionGrads<CudaStorage>> {
        self.qk_norm_attention_backward_fused(g, qkv, norm, mode)
    }

    fn qk_norm_attention_backward_into_mode(
        &self,
        g: &CudaTensor,
        qkv: &CudaTensor,
        norm: &QkNorm<'_, CudaStorage>,
        param_grads: [Option<&CudaTensor>; 4],
        mode: MathMode,
    ) -> Result<QkNormAttentionGradsInto<CudaStorage>> {
        self.qk_norm_attention_backward_into_fused(g, qkv, norm, param_grads, mode)
    }

    fn qk_norm_attention_backward(
        &self,
        g: &CudaTensor,
        qkv: &CudaTensor,
        norm: &QkNorm<'_, CudaStorage>,
    ) -> Result<QkNormAttentionGrads<CudaStorage>> {
        self.qk_norm_attention_backward_fused(g, qkv, norm, MathMode::F32)
    }

    fn qk_norm_attention_backward_into(
        &self,
        g: &CudaTensor,
        qkv: &CudaTensor,
        norm: &QkNorm<'_, CudaStorage>,
        param_grads: [Option<&CudaTensor>; 4],
    ) -> Result<QkNormAttentionGradsInto<CudaStorage>> {
        self.qk_norm_attention_backward_into_fused(g, qkv, norm, param_grads, MathMode::F32)
    }

    fn key_padding_attention(
        &self,
        att: &KeyPaddingAttention<'_, CudaStorage>,
    ) -> Result<CudaTensor> {
        self.key_padding_attention_fused(att)
    }

    fn key_padding_attention_backward(
        &self,
        g: &CudaTensor,
        att: &KeyPaddingAttention<'_, CudaStorage>,
    ) -> Result<KeyPaddingAttentionGrads<CudaStorage>> {
        self.key_padding_attention_backward_fused(g, att)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(batch: usize, seq: usize, heads: usize, dh: usize) -> Attention {
        Attention {
            batch,
            seq,
            heads,
            dh,
        }
    }

    /// Which kernel runs a shape, and with how many warps a block.
    #[rstest::rstest]
    #[case::xasset_batched(256, 12, 4, 64, Some((Kernel::QkNormAttentionDh64, 4)))]
    #[case::xasset_one_sample(1, 12, 4, 64, Some((Kernel::QkNormAttentionDh64, 12)))]
    #[case::below_many_blocks(127, 12, 4, 64, Some((Kernel::QkNormAttentionDh64, 12)))]
    #[case::at_many_blocks(128, 12, 4, 64, Some((Kernel::QkNormAttentionDh64, 4)))]
    #[case::narrow_heads(3, 5, 2, 32, Some((Kernel::QkNormAttentionDh32, 5)))]
    #[case::longest_short(1, 16, 1, 64, Some((Kernel::QkNormAttentionDh64, 16)))]
    #[case::too_long(1, 17, 1, 64, Some((Kernel::QkNormAttention, WARPS)))]
    #[case::other_width(2, 12, 4, 24, Some((Kernel::QkNormAttention, WARPS)))]
    #[case::composite(1, 70, 2, 8, None)]
    #[case::empty(0, 12, 4, 64, None)]
    fn forward_kernel_for_each_shape(
        #[case] batch: usize,
        #[case] seq: usize,
        #[case] heads: usize,
        #[case] dh: usize,
        #[case] want: Option<(Kernel, usize)>,
    ) {
        let a = shape(batch, seq, heads, dh);
        let got = pick(a, false, false).map(|(k, c)| {
            assert_eq!(
                c.grid.0 as usize,
                batch * heads,
                "one block per (batch, head)"
            );
            (k, c.block.0 as usize / 32)
        });
        assert_eq!(got, want);
    }

    /// Under bf16 every shape takes its float32 kernel's bf16 form with the same launch; the
    /// shapes of the composite stay the composite's.
    #[rstest::rstest]
    #[case::short_dh64(shape(256, 12, 4, 64), Kernel::QkNormAttentionDh64Bf16)]
    #[case::short_dh32(shape(3, 5, 2, 32), Kernel::QkNormAttentionDh32Bf16)]
    #[case::general(shape(2, 17, 4, 24), Kernel::QkNormAttentionBf16)]
    fn bf16_takes_the_bf16_form_with_the_same_launch(#[case] a: Attention, #[case] want: Kernel) {
        for backward in [false, true] {
            let (k32, c32) = pick(a, backward, false).expect("fused");
            let (k16, c16) = pick(a, backward, true).expect("fused");
            assert_eq!(k16, form(k32, true));
            assert_ne!(k16, k32);
            let launch = |c: LaunchConfig| (c.grid, c.block, c.shared_mem_bytes);
            assert_eq!(launch(c16), launch(c32));
            if !backward {
                assert_eq!(k16, want);
            }
        }
        assert!(pick(shape(1, 70, 2, 8), false, true).is_none());
        assert!(pick(shape(1, 70, 2, 8), true, true).is_none());
    }

    #[test]
    fn the_backward_takes_the_matching_short_kernel_and_its_shared_memory() {
        let a = shape(256, 12, 4, 64);
        let (k, c) = pick(a, true, false).expect("short backward");
        assert_eq!(k, Kernel::QkNormAttentionBackwardDh64);
        assert_eq!(c.shared_mem_bytes as usize, short_backward_shared_bytes(a));
        assert_eq!(short_backward_shared_bytes(a), 4 * (8 * 768 + 2 * 144 + 12));
        let (k, _) = pick(shape(2, 3, 1, 32), true, false).expect("short backward");
        assert_eq!(k, Kernel::QkNormAttentionBackwardDh32);
        // Every shape the short kernels take fits the 48 KiB a launch may use without opt-in.
        assert!(short_backward_shared_bytes(shape(1, SHORT_MAX_SEQ, 1, 64)) <= FUSED_MAX_SHARED);
    }
}
