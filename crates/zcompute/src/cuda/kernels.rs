//! The kernel-id table: every kernel of `kernels/*.cu` by id, with its PTX module, its entry
//! name and its parameter list, plus the op codes the kernels share with the host. The
//! argument encoding and checking live in `kernels/args.rs`, the launch shapes and the
//! width/tiling dispatch in `kernels/config.rs`; both are re-exported here so callers name
//! everything as `kernels::…`.

mod args;
mod config;

pub(crate) use args::{Args, Param, coalesce, ptr, push_strided, read_strided, u64a};
pub(crate) use config::{
    COLS_FINISH_MAX_ROWS, TICKETS, cols_chunking, cols_config, elementwise_config, row_tiles,
    rows_config, rows_split, rows_split_config, rows_vec_config, single_block, vec_aligned,
    vec_lanes,
};

use crate::backend::{BinaryOp, ReduceOp, UnaryOp};
use zdevice::KernelArg;

/// The PTX modules, embedded at compile time and loaded once per backend.
pub(crate) const MODULES: [(&str, &str); 14] = [
    (
        "elementwise",
        include_str!("../../../../kernels/ptx/elementwise.ptx"),
    ),
    ("rows", include_str!("../../../../kernels/ptx/rows.ptx")),
    ("train", include_str!("../../../../kernels/ptx/train.ptx")),
    ("flat", include_str!("../../../../kernels/ptx/flat.ptx")),
    (
        "attention",
        include_str!("../../../../kernels/ptx/attention.ptx"),
    ),
    ("fused", include_str!("../../../../kernels/ptx/fused.ptx")),
    (
        "indexed",
        include_str!("../../../../kernels/ptx/indexed.ptx"),
    ),
    ("linear", include_str!("../../../../kernels/ptx/linear.ptx")),
    (
        "norm_params",
        include_str!("../../../../kernels/ptx/norm_params.ptx"),
    ),
    (
        "linear_backward",
        include_str!("../../../../kernels/ptx/linear_backward.ptx"),
    ),
    (
        "attention_short",
        include_str!("../../../../kernels/ptx/attention_short.ptx"),
    ),
    ("select", include_str!("../../../../kernels/ptx/select.ptx")),
    (
        "convert",
        include_str!("../../../../kernels/ptx/convert.ptx"),
    ),
    (
        "linear_bf16",
        include_str!("../../../../kernels/ptx/linear_bf16.ptx"),
    ),
];

/// Every kernel the backend launches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    Unary,
    UnaryStrided,
    Binary,
    BinaryStrided,
    /// Row-tiled `BinaryStrided` / `CopyStrided` (same parameters; see [`row_tiles`]).
    BinaryRowsStrided,
    BinaryScalar,
    CopyStrided,
    CopyRowsStrided,
    FillStrided,
    ReduceRows,
    /// A reduction over a middle axis of `[outer, n, inner]`, in row chunks (see
    /// [`cols_chunking`]).
    ReduceCols,
    /// First pass of a reduction over few long rows (see [`rows_split`]).
    ReduceRowsSplit,
    SoftmaxRows,
    LayerNormRows,
    /// Fused backward of softmax and LayerNorm rows.
    SoftmaxBackwardRows,
    LayerNormBackwardRows,
    BceMean,
    AdamW,
    /// Register-resident softmax rows, 1/2/4/8 float4s per lane (see [`vec_lanes`]).
    SoftmaxRowsV1,
    SoftmaxRowsV2,
    SoftmaxRowsV4,
    SoftmaxRowsV8,
    /// Register-resident LayerNorm rows, 1/2/4/8 float4s per lane.
    LayerNormRowsV1,
    LayerNormRowsV2,
    LayerNormRowsV4,
    LayerNormRowsV8,
    /// Over flat buffers (`flat.cu`): the norm's per-block sums of squares and its finishing
    /// pass, clipping by a norm in device memory, and AdamW's finiteness gate.
    SumSquaresPartial,
    NormFinish,
    ClipScale,
    FiniteGate,
    /// Attention's core, fused per (batch, head) (`attention.cu`; see `cuda/attention.rs`).
    QkNormAttention,
    QkNormAttentionBackward,
    /// The same for short sequences and heads of 32 or 64 (`attention_short.cu`).
    QkNormAttentionDh32,
    QkNormAttentionDh64,
    QkNormAttentionBackwardDh32,
    QkNormAttentionBackwardDh64,
    /// The six above with their products' operands rounded to bf16, float32 accumulation
    /// (issue 42's bf16 policy; the same parameters).
    QkNormAttentionBf16,
    QkNormAttentionBackwardBf16,
    QkNormAttentionDh32Bf16,
    QkNormAttentionDh64Bf16,
    QkNormAttentionBackwardDh32Bf16,
    QkNormAttentionBackwardDh64Bf16,
    /// Scaled dot-product attention with a key-padding mask (`attention.cu`; see
    /// `cuda/key_padding.rs`): the forward and the backward's query and key/value passes.
    KeyPaddingAttention,
    KeyPaddingAttentionBackwardQ,
    KeyPaddingAttentionBackwardKv,
    /// Fused epilogues and tail (`fused.cu`, launched from `cuda/fused.rs`).
    BiasAct,
    TanhBackward,
    AddLayerNormRows,
    LayerNormBackwardAddRows,
    PoolHeadBce,
    PoolHeadBceBackward,
    /// The second launches of the pooled head: the loss from the per-sample terms, and the
    /// head's weight and bias gradients from the per-block partials (fixed-order sums).
    PoolHeadBceFinish,
    PoolHeadBceBackwardFinish,
    /// A row of a dense table, picked by an index in device memory (`indexed.cu`).
    GatherRow,
    /// A row written at an index in device memory, which it may then advance.
    ScatterRow,
    /// Rows of a dense table, picked by indices in device memory (`indexed.cu`).
    GatherRows,
    /// The same, the indices a row of a step table picked by a cursor in device memory.
    GatherRowsAt,
    /// Products with few rows (`linear.cu`, launched from `cuda/linear.rs`), by the order of
    /// `op(B)`: k-contiguous (a Linear weight read transposed) or n-contiguous.
    LinearRowsKMajor,
    LinearRowsNMajor,
    /// A Linear layer's weight and bias gradients from few rows, added into their buffers.
    LinearParamGrads,
    /// LayerNorm's backward for few rows with its weight and bias gradients added into their
    /// buffers (`cuda/norm_params.rs`).
    LayerNormBackwardParams,
    /// A batch's LayerNorm backward, one warp a row, leaving each block's parameter-gradient
    /// sums as partials (rows up to 512 wide; `cuda/norm_params.rs`).
    LayerNormBackwardPartials,
    /// A Linear layer's whole backward from few rows in one launch (`linear_backward.cu`,
    /// launched from `cuda/linear_backward.rs`): tanh's backward, the input's gradient and the
    /// parameter gradients.
    LinearBackward,
    /// `ReduceCols`' two passes in one launch: each block's chunk into the partials, the last
    /// block of each column tile (a ticket per tile) adding them (`rows.cu`).
    ReduceColsLast,
    /// `SumSquaresPartial` and `NormFinish` in one launch, the last block (one ticket) adding
    /// the partials (`flat.cu`).
    SumSquaresNorm,
    /// The pooled head's forward and its finish in one launch, the last block (one ticket)
    /// taking the mean of the terms (`fused.cu`).
    PoolHeadBceLast,
    /// The pooled head's backward and its finish in one launch, the last block (one ticket)
    /// adding the weight gradient's partials and summing the bias gradient (`fused.cu`).
    PoolHeadBceBackwardLast,
    /// Tanh's backward and the column sums of its result added into a bias gradient, in one
    /// launch with a last-block finish per column tile (`rows.cu`).
    TanhBackwardCols,
    /// `BiasAct` with the residual stream added after the activation (`fused.cu`).
    BiasActAdd,
    /// A training step's tail (stats, gate, sticky gate, history row) in one thread
    /// (`indexed.cu`).
    StepTail,
    /// The data-parallel step's last bucket summed over the ranks' peer memory and the norm of
    /// the whole gradient, in one launch (`flat.cu`; launched from `cuda/exchange.rs`).
    ExchangeSumNorm,
    /// The selection family and the dropout mask (`select.cu`, launched from
    /// `cuda/select.rs`): `cond ? a : b`, each row's argmax, the deterministic scatter-add of
    /// rows by index, and the Philox mask at a step read from device memory.
    Select,
    ArgmaxRows,
    IndexAddRows,
    DropoutMask,
    /// SGD with momentum and Nesterov, its rate, step and gate read from a slot (`train.cu`,
    /// launched from `cuda/optim.rs`).
    Sgd,
    /// float32 to bf16 (nearest, ties to even) and back, dense (`convert.cu`, launched from
    /// `cuda/precision.rs`): the operands of a bf16 matrix product (issue 42).
    F32ToBf16,
    Bf16ToF32,
    /// The small-row products' bf16 forms (`linear_bf16.cu`, issue 42): every operand element
    /// rounded to bf16 as it is read, or read from a bf16 copy (`LINEAR_ROWS_BF16`'s `packed`),
    /// float32 sums in the float32 forms' order and the same epilogue.
    LinearRowsKMajorBf16,
    LinearRowsNMajorBf16,
    /// The parameter-gradient kernel's weight gradient in bf16 (`linear_bf16.cu`): a product
    /// `dw += op(a) · op(b)` of few rows `k` and many columns of `op(a)`, its operands rounded
    /// (or copies), float32 sums in row order; and, when asked, the bias gradient from the
    /// float32 `op(a)` the copy was made from.
    LinearParamGradsBf16,
    /// Tanh's backward and its result's bf16 copy in one pass (`convert.cu`): a Linear
    /// layer's backward under bf16 (`PrecisionOps::tanh_backward_bf16`).
    TanhBackwardBf16,
    /// A Linear layer's backward in one launch on the trainer's bf16 copies
    /// (`linear_bf16.cu`: `zc_linear_backward_f32`'s parameters, then `packed`).
    LinearBackwardBf16,
}

/// A kernel's module, entry and parameters: `params`, then (if `strided > 0`) the rank, six
/// sizes and six strides per strided operand.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Spec {
    pub module: usize,
    pub name: &'static str,
    pub params: &'static [Param],
    pub strided: usize,
}

use Param::{F32, Ptr, U32, U64};

/// The exchange's parameters: out, partial, tickets, epochs, failed, x, n, last, rank, ranks,
/// timeout in ns, the ranks' receive words (an array of pointers in device memory), the give-up
/// flag (page-locked host memory mapped into the device), the grid's next time to read it (a
/// u64 in device memory).
const EXCHANGE: &[Param] = &[
    Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U64, U64, U32, U32, U64, Ptr, Ptr, Ptr,
];

/// Parameters of every softmax row kernel: out, in, rows, n.
const SOFTMAX: &[Param] = &[Ptr, Ptr, U64, U64];
/// Parameters of every LayerNorm row kernel: out, mean, rstd, in, weight, bias, has_weight,
/// has_bias, rows, n, eps.
const LAYER_NORM: &[Param] = &[Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U64, U64, F32];

/// Attention's forward: out, qkv, q weight, q bias, k weight, k bias, batch, seq, heads, dh,
/// eps.
const ATTENTION: &[Param] = &[Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U32, F32];
/// Attention's backward: g_qkv, partials, g, qkv, then the forward's parameters after qkv.
const ATTENTION_BACKWARD: &[Param] = &[
    Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U32, F32,
];

/// Every small-row product kernel: out, a, b, bias, m, k, n, a's row and column strides, b's
/// leading dimension, beta, has_bias, act.
const LINEAR_ROWS: &[Param] = &[
    Ptr, Ptr, Ptr, Ptr, U32, U64, U64, U64, U64, U64, F32, U32, U32, Ptr,
];
/// The bf16 forms' parameters: `LINEAR_ROWS`, then which operands are bf16 copies (bit 0: a,
/// bit 1: b).
const LINEAR_ROWS_BF16: &[Param] = &[
    Ptr, Ptr, Ptr, Ptr, U32, U64, U64, U64, U64, U64, F32, U32, U32, Ptr, U32,
];

/// The fused Linear backward's parameters (`zc_linear_backward_bf16`): the float32 form's 23
/// (`zc_linear_backward_f32`), then `packed` (3: w and x are bf16 copies).
const LINEAR_BACKWARD: &[Param] = &[
    Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U64, U64, U64, U64, U64, U64, U64, U64, U64, U64, U64,
    U32, U32, U32, U32, U32,
];

impl Kernel {
    /// Whether `args` match the parameter list exactly (count and kinds).
    pub(crate) fn accepts(self, args: &[KernelArg]) -> bool {
        let spec = self.spec();
        args::accepts(spec.params, spec.strided, args)
    }

    pub const ALL: [Kernel; 83] = [
        Kernel::Unary,
        Kernel::UnaryStrided,
        Kernel::Binary,
        Kernel::BinaryStrided,
        Kernel::BinaryRowsStrided,
        Kernel::BinaryScalar,
        Kernel::CopyStrided,
        Kernel::CopyRowsStrided,
        Kernel::FillStrided,
        Kernel::ReduceRows,
        Kernel::ReduceCols,
        Kernel::ReduceRowsSplit,
        Kernel::SoftmaxRows,
        Kernel::LayerNormRows,
        Kernel::SoftmaxBackwardRows,
        Kernel::LayerNormBackwardRows,
        Kernel::BceMean,
        Kernel::AdamW,
        Kernel::SoftmaxRowsV1,
        Kernel::SoftmaxRowsV2,
        Kernel::SoftmaxRowsV4,
        Kernel::SoftmaxRowsV8,
        Kernel::LayerNormRowsV1,
        Kernel::LayerNormRowsV2,
        Kernel::LayerNormRowsV4,
        Kernel::LayerNormRowsV8,
        Kernel::SumSquaresPartial,
        Kernel::NormFinish,
        Kernel::ClipScale,
        Kernel::FiniteGate,
        Kernel::QkNormAttention,
        Kernel::QkNormAttentionBackward,
        Kernel::QkNormAttentionDh32,
        Kernel::QkNormAttentionDh64,
        Kernel::QkNormAttentionBackwardDh32,
        Kernel::QkNormAttentionBackwardDh64,
        Kernel::QkNormAttentionBf16,
        Kernel::QkNormAttentionBackwardBf16,
        Kernel::QkNormAttentionDh32Bf16,
        Kernel::QkNormAttentionDh64Bf16,
        Kernel::QkNormAttentionBackwardDh32Bf16,
        Kernel::QkNormAttentionBackwardDh64Bf16,
        Kernel::KeyPaddingAttention,
        Kernel::KeyPaddingAttentionBackwardQ,
        Kernel::KeyPaddingAttentionBackwardKv,
        Kernel::BiasAct,
        Kernel::TanhBackward,
        Kernel::AddLayerNormRows,
        Kernel::LayerNormBackwardAddRows,
        Kernel::PoolHeadBce,
        Kernel::PoolHeadBceBackward,
        Kernel::PoolHeadBceFinish,
        Kernel::PoolHeadBceBackwardFinish,
        Kernel::GatherRow,
        Kernel::ScatterRow,
        Kernel::GatherRows,
        Kernel::GatherRowsAt,
        Kernel::LinearRowsKMajor,
        Kernel::LinearRowsNMajor,
        Kernel::LinearParamGrads,
        Kernel::LayerNormBackwardParams,
        Kernel::LayerNormBackwardPartials,
        Kernel::LinearBackward,
        Kernel::ReduceColsLast,
        Kernel::SumSquaresNorm,
        Kernel::PoolHeadBceLast,
        Kernel::PoolHeadBceBackwardLast,
        Kernel::TanhBackwardCols,
        Kernel::BiasActAdd,
        Kernel::StepTail,
        Kernel::ExchangeSumNorm,
        Kernel::Select,
        Kernel::ArgmaxRows,
        Kernel::IndexAddRows,
        Kernel::DropoutMask,
        Kernel::Sgd,
        Kernel::F32ToBf16,
        Kernel::Bf16ToF32,
        Kernel::LinearRowsKMajorBf16,
        Kernel::LinearRowsNMajorBf16,
        Kernel::LinearParamGradsBf16,
        Kernel::TanhBackwardBf16,
        Kernel::LinearBackwardBf16,
    ];

    pub(crate) fn index(self) -> usize {
        self as usize
    }

    /// The register-resident softmax kernel holding `lanes` float4s per lane (1, 2, 4 or 8).
    pub(crate) fn softmax_vec(lanes: u32) -> Option<Kernel> {
        match lanes {
            1 => Some(Kernel::SoftmaxRowsV1),
            2 => Some(Kernel::SoftmaxRowsV2),
            4 => Some(Kernel::SoftmaxRowsV4),
            8 => Some(Kernel::SoftmaxRowsV8),
            _ => None,
        }
    }

    /// The register-resident LayerNorm kernel holding `lanes` float4s per lane.
    pub(crate) fn layer_norm_vec(lanes: u32) -> Option<Kernel> {
        match lanes {
            1 => Some(Kernel::LayerNormRowsV1),
            2 => Some(Kernel::LayerNormRowsV2),
            4 => Some(Kernel::LayerNormRowsV4),
            8 => Some(Kernel::LayerNormRowsV8),
            _ => None,
        }
    }

    /// Float4s per lane of a register-resident row kernel (`V` in rows.cu), or `None` for the
    /// other kernels.
    pub(crate) fn vec_lanes(self) -> Option<u32> {
        match self {
            Kernel::SoftmaxRowsV1 | Kernel::LayerNormRowsV1 => Some(1),
            Kernel::SoftmaxRowsV2 | Kernel::LayerNormRowsV2 => Some(2),
            Kernel::SoftmaxRowsV4 | Kernel::LayerNormRowsV4 => Some(4),
            Kernel::SoftmaxRowsV8 | Kernel::LayerNormRowsV8 => Some(8),
            _ => None,
        }
    }

    pub(crate) fn spec(self) -> Spec {
        let s = |module, name, params, strided| Spec {
            module,
            name,
            params,
            strided,
        };
        match self {
            Kernel::Unary => s(0, "zc_unary_f32", &[Ptr, Ptr, U32, U64], 0),
            Kernel::UnaryStrided => s(0, "zc_unary_strided_f32", &[Ptr, Ptr, U32, U64], 1),
            Kernel::Binary => s(0, "zc_binary_f32", &[Ptr, Ptr, Ptr, U32, U64], 0),
            Kernel::BinaryStrided => s(0, "zc_binary_strided_f32", &[Ptr, Ptr, Ptr, U32, U64], 2),
            Kernel::BinaryRowsStrided => s(
                0,
                "zc_binary_rows_strided_f32",
                &[Ptr, Ptr, Ptr, U32, U64],
                2,
            ),
            Kernel::BinaryScalar => s(
                0,
                "zc_binary_scalar_f32",
                &[Ptr, Ptr, F32, U32, U32, U64],
                0,
            ),
            Kernel::CopyStrided => s(0, "zc_copy_strided_f32", &[Ptr, Ptr, U64], 2),
            Kernel::CopyRowsStrided => s(0, "zc_copy_rows_strided_f32", &[Ptr, Ptr, U64], 2),
            Kernel::FillStrided => s(0, "zc_fill_strided_f32", &[Ptr, F32, U64], 1),
            Kernel::ReduceRows => s(1, "zc_reduce_rows_f32", &[Ptr, Ptr, U64, U64, U32], 0),
            Kernel::ReduceCols => s(
                1,
                "zc_reduce_cols_f32",
                &[Ptr, Ptr, U64, U64, U64, U64, U32, F32],
                0,
            ),
            Kernel::ReduceColsLast => s(
                1,
                "zc_reduce_cols_last_f32",
                &[Ptr, Ptr, Ptr, Ptr, U64, U64, U64, U64, U32, F32],
                0,
            ),
            Kernel::TanhBackwardCols => s(
                1,
                "zc_tanh_backward_cols_f32",
                &[Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U64, U64, U64],
                0,
            ),
            Kernel::ReduceRowsSplit => s(
                1,
                "zc_reduce_rows_split_f32",
                &[Ptr, Ptr, U64, U64, U64, U32],
                0,
            ),
            Kernel::SoftmaxRows => s(1, "zc_softmax_rows_f32", SOFTMAX, 0),
            Kernel::LayerNormRows => s(1, "zc_layer_norm_rows_f32", LAYER_NORM, 0),
            Kernel::SoftmaxBackwardRows => s(
                1,
                "zc_softmax_backward_rows_f32",
                &[Ptr, Ptr, Ptr, U64, U64],
                0,
            ),
            Kernel::LayerNormBackwardRows => s(
                1,
                "zc_layer_norm_backward_rows_f32",
                &[Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U64, U64],
                0,
            ),
            Kernel::SoftmaxRowsV1 => s(1, "zc_softmax_rows_v1_f32", SOFTMAX, 0),
            Kernel::SoftmaxRowsV2 => s(1, "zc_softmax_rows_v2_f32", SOFTMAX, 0),
            Kernel::SoftmaxRowsV4 => s(1, "zc_softmax_rows_v4_f32", SOFTMAX, 0),
            Kernel::SoftmaxRowsV8 => s(1, "zc_softmax_rows_v8_f32", SOFTMAX, 0),
            Kernel::LayerNormRowsV1 => s(1, "zc_layer_norm_rows_v1_f32", LAYER_NORM, 0),
            Kernel::LayerNormRowsV2 => s(1, "zc_layer_norm_rows_v2_f32", LAYER_NORM, 0),
            Kernel::LayerNormRowsV4 => s(1, "zc_layer_norm_rows_v4_f32", LAYER_NORM, 0),
            Kernel::LayerNormRowsV8 => s(1, "zc_layer_norm_rows_v8_f32", LAYER_NORM, 0),
            Kernel::BiasAct => s(5, "zc_bias_act_f32", &[Ptr, Ptr, Ptr, U64, U64, U32], 0),
            Kernel::BiasActAdd => s(
                5,
                "zc_bias_act_add_f32",
                &[Ptr, Ptr, Ptr, Ptr, U64, U64, U32],
                0,
            ),
            Kernel::TanhBackward => s(5, "zc_tanh_backward_f32", &[Ptr, Ptr, Ptr, U64], 0),
            Kernel::AddLayerNormRows => s(
                5,
                "zc_add_layer_norm_rows_f32",
                &[
                    Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U64, U64, F32,
                ],
                0,
            ),
            Kernel::LayerNormBackwardAddRows => s(
                5,
                "zc_layer_norm_backward_add_rows_f32",
                &[
                    Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U32, U64, U64,
                ],
                0,
            ),
            Kernel::PoolHeadBce => s(
                5,
                "zc_pool_head_bce_f32",
                &[Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U64, U64, U64],
                0,
            ),
            Kernel::PoolHeadBceBackward => s(
                5,
                "zc_pool_head_bce_backward_f32",
                &[Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U64, U64, U64, U32],
                0,
            ),
            Kernel::PoolHeadBceFinish => s(5, "zc_pool_head_bce_finish_f32", &[Ptr, Ptr, U64], 0),
            Kernel::PoolHeadBceLast => s(
                5,
                "zc_pool_head_bce_last_f32",
                &[Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U64, U64, U64],
                0,
            ),
            Kernel::PoolHeadBceBackwardLast => s(
                5,
                "zc_pool_head_bce_backward_last_f32",
                &[
                    Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U64, U64, U64, U32,
                ],
                0,
            ),
            Kernel::PoolHeadBceBackwardFinish => s(
                5,
                "zc_pool_head_bce_backward_finish_f32",
                &[Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U64, U64, U64, U32],
                0,
            ),
            Kernel::BceMean => s(2, "zc_bce_mean_f32", &[Ptr, Ptr, Ptr, U64], 0),
            Kernel::AdamW => s(
                2,
                "zc_adamw_f32",
                &[Ptr, Ptr, Ptr, Ptr, Ptr, U64, F32, F32, F32, F32, U64],
                0,
            ),
            Kernel::Sgd => s(
                2,
                "zc_sgd_f32",
                &[Ptr, Ptr, Ptr, Ptr, U64, F32, F32, F32, U32, U64],
                0,
            ),
            Kernel::SumSquaresPartial => s(3, "zc_sum_squares_partial_f32", &[Ptr, Ptr, U64], 0),
            Kernel::NormFinish => s(3, "zc_norm_finish_f32", &[Ptr, Ptr, U64], 0),
            Kernel::SumSquaresNorm => {
                s(3, "zc_sum_squares_norm_f32", &[Ptr, Ptr, Ptr, Ptr, U64], 0)
            }
            Kernel::ExchangeSumNorm => s(3, "zc_exchange_sum_norm_f32", EXCHANGE, 0),
            Kernel::ClipScale => s(3, "zc_clip_scale_f32", &[Ptr, Ptr, F32, U64], 0),
            Kernel::FiniteGate => s(3, "zc_finite_gate_f32", &[Ptr, Ptr, Ptr], 0),
            Kernel::QkNormAttention => s(4, "zc_qk_norm_attention_f32", ATTENTION, 0),
            Kernel::KeyPaddingAttention => s(
                4,
                "zc_key_padding_attention_f32",
                &[Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U32, U32, F32],
                0,
            ),
            Kernel::KeyPaddingAttentionBackwardQ => s(
                4,
                "zc_key_padding_attention_backward_q_f32",
                &[
                    Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U32, U32, F32,
                ],
                0,
            ),
            Kernel::KeyPaddingAttentionBackwardKv => s(
                4,
                "zc_key_padding_attention_backward_kv_f32",
                &[
                    Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U32, U32, F32,
                ],
                0,
            ),
            Kernel::QkNormAttentionDh32 => s(10, "zc_qk_norm_attention_dh32_f32", ATTENTION, 0),
            Kernel::QkNormAttentionDh64 => s(10, "zc_qk_norm_attention_dh64_f32", ATTENTION, 0),
            Kernel::QkNormAttentionBackwardDh32 => s(
                10,
                "zc_qk_norm_attention_backward_dh32_f32",
                ATTENTION_BACKWARD,
                0,
            ),
            Kernel::QkNormAttentionBackwardDh64 => s(
                10,
                "zc_qk_norm_attention_backward_dh64_f32",
                ATTENTION_BACKWARD,
                0,
            ),
            Kernel::QkNormAttentionBackward => s(
                4,
                "zc_qk_norm_attention_backward_f32",
                ATTENTION_BACKWARD,
                0,
            ),
            Kernel::QkNormAttentionBf16 => s(4, "zc_qk_norm_attention_bf16", ATTENTION, 0),
            Kernel::QkNormAttentionBackwardBf16 => s(
                4,
                "zc_qk_norm_attention_backward_bf16",
                ATTENTION_BACKWARD,
                0,
            ),
            Kernel::QkNormAttentionDh32Bf16 => {
                s(10, "zc_qk_norm_attention_dh32_bf16", ATTENTION, 0)
            }
            Kernel::QkNormAttentionDh64Bf16 => {
                s(10, "zc_qk_norm_attention_dh64_bf16", ATTENTION, 0)
            }
            Kernel::QkNormAttentionBackwardDh32Bf16 => s(
                10,
                "zc_qk_norm_attention_backward_dh32_bf16",
                ATTENTION_BACKWARD,
                0,
            ),
            Kernel::QkNormAttentionBackwardDh64Bf16 => s(
                10,
                "zc_qk_norm_attention_backward_dh64_bf16",
                ATTENTION_BACKWARD,
                0,
            ),
            Kernel::GatherRow => s(6, "zc_gather_row_f32", &[Ptr, Ptr, Ptr, U64, U64], 0),
            Kernel::ScatterRow => s(6, "zc_scatter_row_f32", &[Ptr, Ptr, Ptr, U64, U64, U32], 0),
            Kernel::GatherRows => s(6, "zc_gather_rows_f32", &[Ptr, Ptr, Ptr, U64, U64, U64], 0),
            Kernel::GatherRowsAt => s(
                6,
                "zc_gather_rows_at_f32",
                &[Ptr, Ptr, Ptr, Ptr, Ptr, U64, U64, U64, U64, U64, U64],
                0,
            ),
            Kernel::StepTail => s(
                6,
                "zc_step_tail_f32",
                &[Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U64],
                0,
            ),
            Kernel::Select => s(11, "zc_select_f32", &[Ptr, Ptr, Ptr, Ptr, U64], 0),
            Kernel::ArgmaxRows => s(11, "zc_argmax_rows_f32", &[Ptr, Ptr, U64, U64], 0),
            Kernel::IndexAddRows => s(
                11,
                "zc_index_add_rows_f32",
                &[Ptr, Ptr, Ptr, U64, U64, U64],
                0,
            ),
            Kernel::DropoutMask => s(
                11,
                "zc_dropout_mask_f32",
                &[Ptr, Ptr, U64, U32, U32, U32, U32, F32],
                0,
            ),
            Kernel::F32ToBf16 => s(12, "zc_f32_to_bf16", &[Ptr, Ptr, U64], 0),
            Kernel::Bf16ToF32 => s(12, "zc_bf16_to_f32", &[Ptr, Ptr, U64], 0),
            Kernel::TanhBackwardBf16 => {
                s(12, "zc_tanh_backward_bf16", &[Ptr, Ptr, Ptr, Ptr, U64], 0)
            }
            Kernel::LinearRowsKMajor => s(7, "zc_linear_rows_kmajor_f32", LINEAR_ROWS, 0),
            Kernel::LinearRowsNMajor => s(7, "zc_linear_rows_nmajor_f32", LINEAR_ROWS, 0),
            Kernel::LinearRowsKMajorBf16 => {
                s(13, "zc_linear_rows_kmajor_bf16", LINEAR_ROWS_BF16, 0)
            }
            Kernel::LinearRowsNMajorBf16 => {
                s(13, "zc_linear_rows_nmajor_bf16", LINEAR_ROWS_BF16, 0)
            }
            Kernel::LinearParamGradsBf16 => s(
                13,
                "zc_linear_param_grads_bf16",
                &[
                    Ptr, Ptr, Ptr, U32, U64, U64, U64, U64, U64, U64, U64, U32, Ptr, Ptr, U64, U64,
                    U64, U32,
                ],
                0,
            ),
            Kernel::LinearParamGrads => s(
                7,
                "zc_linear_param_grads_f32",
                &[
                    Ptr, Ptr, Ptr, Ptr, U32, U64, U64, U64, U64, U64, U64, U64, U64, U32,
                ],
                0,
            ),
            Kernel::LayerNormBackwardParams => s(
                8,
                "zc_layer_norm_backward_params_f32",
                &[
                    Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U32, U32, U64, U64,
                    Ptr,
                ],
                0,
            ),
            Kernel::LayerNormBackwardPartials => s(
                8,
                "zc_layer_norm_backward_partials_f32",
                &[
                    Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U32, U64, U64, U64,
                ],
                0,
            ),
            Kernel::LinearBackward => s(9, "zc_linear_backward_f32", &LINEAR_BACKWARD[..23], 0),
            Kernel::LinearBackwardBf16 => s(13, "zc_linear_backward_bf16", LINEAR_BACKWARD, 0),
        }
    }
}

pub(crate) fn unary_code(op: UnaryOp) -> u32 {
    match op {
        UnaryOp::Neg => 0,
        UnaryOp::Exp => 1,
        UnaryOp::Log => 2,
        UnaryOp::Sqrt => 3,
        UnaryOp::Rsqrt => 4,
        UnaryOp::Tanh => 5,
        UnaryOp::Sigmoid => 6,
        UnaryOp::Relu => 7,
        UnaryOp::Gelu => 8,
    }
}

pub(crate) fn binary_code(op: BinaryOp) -> u32 {
    match op {
        BinaryOp::Add => 0,
        BinaryOp::Sub => 1,
        BinaryOp::Mul => 2,
        BinaryOp::Div => 3,
        BinaryOp::Maximum => 4,
    }
}

pub(crate) fn reduce_code(op: ReduceOp) -> u32 {
    match op {
        ReduceOp::Sum => 0,
        ReduceOp::Mean => 1,
        ReduceOp::Max => 2,
    }
}

#[cfg(test)]
mod tests {
    use super::{Args, Kernel, MODULES, ptr, push_strided, read_strided, u64a};
    use crate::error::ComputeError;
    use zdevice::{DevicePtr, KernelArg};

    /// Every kernel names an entry of the module it is looked up in. Module indices are
    /// positions in `MODULES`; a kernel family added beside another once pointed at the wrong
    /// module, and the simulator answered `cuModuleGetFunction` 500 at `CudaBackend::new`.
    #[test]
    fn every_kernel_is_an_entry_of_its_own_module() {
        for k in Kernel::ALL {
            let spec = k.spec();
            let (module, ptx) = MODULES[spec.module];
            assert!(
                ptx.contains(&format!(".entry {}(", spec.name)),
                "{k:?}: {} is not an entry of {module}.ptx",
                spec.name
            );
        }
    }

    #[test]
    fn strided_tail_round_trips_and_specs_accept_their_arguments() {
        let mut args = Args::new();
        args.extend([
            ptr(DevicePtr(256)),
            ptr(DevicePtr(512)),
            KernelArg::U32(0),
            u64a(6),
        ]);
        push_strided("t", &mut args, &[3, 2], &[&[1, 3]]).unwrap();
        assert!(Kernel::UnaryStrided.accepts(&args));
        assert!(!Kernel::Unary.accepts(&args));
        let (shape, strides) = read_strided(&args[4..], 1).unwrap();
        assert_eq!((shape, strides), (vec![3, 2], vec![vec![1, 3]]));
        let err = push_strided("t", &mut Args::new(), &[2; 7], &[&[0, 1, 0, 1, 0, 1, 0]]);
        assert!(matches!(err, Err(ComputeError::Unsupported { .. })));
    }

    /// Every lane count `vec_lanes` picks has its softmax and LayerNorm kernels.
    #[test]
    fn every_vector_lane_count_has_its_row_kernels() {
        for l in [1, 2, 4, 8] {
            assert!(Kernel::softmax_vec(l).and_then(Kernel::vec_lanes) == Some(l));
            assert!(Kernel::layer_norm_vec(l).and_then(Kernel::vec_lanes) == Some(l));
        }
    }
}
