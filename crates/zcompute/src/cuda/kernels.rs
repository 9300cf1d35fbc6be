//! The kernel-id table: every kernel of `kernels/*.cu` by id, with its PTX module, its entry
//! name and its parameter list (checked against the arguments of every launch), plus the op
//! codes and the strided-operand encoding the kernels share with the host.

use crate::backend::{BinaryOp, ReduceOp, UnaryOp};
use crate::error::{ComputeError, Result};
use smallvec::SmallVec;
use zdevice::{DevicePtr, KernelArg, LaunchConfig};

/// Most axes a strided kernel takes (`ZC_MAX_RANK` in `kernels/common.cuh`).
pub(crate) const MAX_RANK: usize = 6;

/// The PTX modules, embedded at compile time and loaded once per backend.
pub(crate) const MODULES: [(&str, &str); 3] = [
    (
        "elementwise",
        include_str!("../../../../kernels/ptx/elementwise.ptx"),
    ),
    ("rows", include_str!("../../../../kernels/ptx/rows.ptx")),
    ("train", include_str!("../../../../kernels/ptx/train.ptx")),
];

/// Kinds of kernel parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Param {
    Ptr,
    U32,
    U64,
    F32,
}

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

/// Parameters of every softmax row kernel: out, in, rows, n.
const SOFTMAX: &[Param] = &[Ptr, Ptr, U64, U64];
/// Parameters of every LayerNorm row kernel: out, mean, rstd, in, weight, bias, has_weight,
/// has_bias, rows, n, eps.
const LAYER_NORM: &[Param] = &[Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, U32, U32, U64, U64, F32];

impl Kernel {
    pub const ALL: [Kernel; 26] = [
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
            Kernel::BceMean => s(2, "zc_bce_mean_f32", &[Ptr, Ptr, Ptr, U64], 0),
            Kernel::AdamW => s(
                2,
                "zc_adamw_f32",
                &[Ptr, Ptr, Ptr, Ptr, Ptr, U64, F32, F32, F32, F32],
                0,
            ),
        }
    }

    /// Whether `args` match the parameter list exactly (count and kinds).
    pub(crate) fn accepts(self, args: &[KernelArg]) -> bool {
        let spec = self.spec();
        let tail = if spec.strided > 0 {
            1 + MAX_RANK * (1 + spec.strided)
        } else {
            0
        };
        if args.len() != spec.params.len() + tail {
            return false;
        }
        let kind = |a: &KernelArg| match a {
            KernelArg::Ptr(_) => Some(Ptr),
            KernelArg::U32(_) => Some(U32),
            KernelArg::U64(_) => Some(U64),
            KernelArg::F32(_) => Some(F32),
            _ => None,
        };
        let (head, rest) = args.split_at(spec.params.len());
        head.iter()
            .zip(spec.params)
            .all(|(a, p)| kind(a) == Some(*p))
            && rest
                .iter()
                .enumerate()
                .all(|(i, a)| kind(a) == Some(if i == 0 { U32 } else { U64 }))
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

/// A kernel argument list (strided kernels take up to 28).
pub(crate) type Args = SmallVec<[KernelArg; 32]>;

/// Merges axes that every operand walks as one (outer stride = inner stride * inner size) and
/// drops size-1 axes, so most views reach the kernels with rank 1-3. Returns the merged shape
/// and one stride vector per operand.
pub(crate) fn coalesce(shape: &[usize], strides: &[&[usize]]) -> (Vec<usize>, Vec<Vec<usize>>) {
    let mut out_shape: Vec<usize> = Vec::with_capacity(shape.len());
    let mut out_strides: Vec<Vec<usize>> = vec![Vec::with_capacity(shape.len()); strides.len()];
    for (ax, &d) in shape.iter().enumerate() {
        if d == 1 {
            continue;
        }
        let mergeable = !out_shape.is_empty()
            && strides.iter().zip(&out_strides).all(|(s, o)| {
                o.last()
                    .is_some_and(|&outer| Some(outer) == s[ax].checked_mul(d))
            });
        if mergeable {
            if let Some(last) = out_shape.last_mut() {
                *last *= d;
            }
            for (s, o) in strides.iter().zip(out_strides.iter_mut()) {
                if let Some(last) = o.last_mut() {
                    *last = s[ax];
                }
            }
        } else {
            out_shape.push(d);
            for (s, o) in strides.iter().zip(out_strides.iter_mut()) {
                o.push(s[ax]);
            }
        }
    }
    if out_shape.is_empty() {
        out_shape.push(1);
        for o in &mut out_strides {
            o.push(0);
        }
    }
    (out_shape, out_strides)
}

/// Appends the strided tail (rank, sizes, strides per operand) for `shape` and `strides`.
pub(crate) fn push_strided(
    op: &'static str,
    args: &mut Args,
    shape: &[usize],
    strides: &[&[usize]],
) -> Result<()> {
    let (shape, strides) = coalesce(shape, strides);
    if shape.len() > MAX_RANK {
        return Err(ComputeError::Unsupported {
            op,
            reason: format!(
                "a view of {} axes that cannot be merged (at most {MAX_RANK}); make it contiguous in steps",
                shape.len()
            ),
        });
    }
    let padded = |v: &[usize]| {
        let mut a = [0u64; MAX_RANK];
        for (x, &y) in a.iter_mut().zip(v) {
            *x = y as u64;
        }
        a
    };
    args.push(KernelArg::U32(shape.len() as u32));
    let dims = padded(&shape);
    // Unused axes have size 1 so the kernel's index arithmetic never divides by zero.
    for (i, d) in dims.iter().enumerate() {
        args.push(KernelArg::U64(if i < shape.len() { *d } else { 1 }));
    }
    for s in &strides {
        args.extend(padded(s).iter().map(|&x| KernelArg::U64(x)));
    }
    Ok(())
}

/// Decodes a strided tail (for the simulated kernels): shape and the per-operand strides.
pub(crate) fn read_strided(
    rest: &[KernelArg],
    operands: usize,
) -> Option<(Vec<u64>, Vec<Vec<u64>>)> {
    let u = |a: &KernelArg| match a {
        KernelArg::U64(v) => Some(*v),
        KernelArg::U32(v) => Some(u64::from(*v)),
        _ => None,
    };
    if rest.len() != 1 + MAX_RANK * (1 + operands) {
        return None;
    }
    let rank = usize::try_from(u(&rest[0])?).ok()?.min(MAX_RANK);
    let shape = rest[1..=rank].iter().map(u).collect::<Option<Vec<_>>>()?;
    let mut strides = Vec::with_capacity(operands);
    for k in 0..operands {
        let start = 1 + MAX_RANK * (1 + k);
        strides.push(
            rest[start..start + rank]
                .iter()
                .map(u)
                .collect::<Option<Vec<_>>>()?,
        );
    }
    Some((shape, strides))
}

/// Shortest last merged axis that the row-tiled strided kernels take. Measured on H200 in the
/// XAsset step: bias adds over rows of 256-1024 gain (5 adds 139 -> 84 us), while 64-wide rows
/// (attention's head permutes) were slower tiled (27.9 vs 21.6 us per [12288, 64] copy): eight
/// threads computing the tile's offsets in 64-bit arithmetic is latency the short rows cannot hide.
const ROW_TILED_MIN_LEN: usize = 128;

/// For a strided op over `shape` with these operand strides: the launch of the row-tiled kernel
/// (8 rows per block, offsets computed once per row) when the merged view has rank >= 2 and a
/// last axis at least 128 long, else `None` (the per-element kernel).
pub(crate) fn row_tiles(shape: &[usize], strides: &[&[usize]]) -> Option<LaunchConfig> {
    let (merged, _) = coalesce(shape, strides);
    let len = *merged.last()?;
    if merged.len() < 2 || len < ROW_TILED_MIN_LEN {
        return None;
    }
    let rows: usize = merged[..merged.len() - 1].iter().product();
    let blocks = (rows as u64).div_ceil(8).clamp(1, 65_535) as u32;
    Some(LaunchConfig {
        grid: (blocks, 1, 1),
        block: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// Threads per block of every kernel.
pub(crate) const BLOCK: u32 = 256;

/// An elementwise launch: 4 elements per thread, grid capped (the loops are grid-stride).
pub(crate) fn elementwise_config(n: usize) -> LaunchConfig {
    let blocks = (n as u64).div_ceil(u64::from(BLOCK) * 4).clamp(1, 16_384) as u32;
    LaunchConfig {
        grid: (blocks, 1, 1),
        block: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// A row launch: one warp per row, 8 rows per block.
pub(crate) fn rows_config(rows: usize) -> LaunchConfig {
    let blocks = (rows as u64).div_ceil(8).clamp(1, 65_535) as u32;
    LaunchConfig {
        grid: (blocks, 1, 1),
        block: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Blocks a column reduction aims to keep busy (about 8 resident 256-thread blocks on each of
/// an H100/H200's 132 SMs).
const COLS_TARGET_BLOCKS: u64 = 1024;
/// Fewest rows per chunk of a column reduction (4 per row lane), so a chunk's partial is worth
/// the second pass that reads it.
const COLS_MIN_CHUNK: u64 = 32;

/// Row chunking of a column reduction over `[outer, n, inner]`: `(chunk, chunks)`, rows per
/// chunk and chunk count, enough chunks that the grid fills the GPU when there are few columns.
pub(crate) fn cols_chunking(outer: usize, n: usize, inner: usize) -> (u64, u64) {
    let tiles = (outer as u64)
        .saturating_mul((inner as u64).div_ceil(32))
        .max(1);
    let n = (n as u64).max(1);
    let wanted = (COLS_TARGET_BLOCKS / tiles).clamp(1, (n / COLS_MIN_CHUNK).max(1));
    let chunk = n.div_ceil(wanted);
    (chunk, n.div_ceil(chunk))
}

/// Rows at least this long are split across blocks when there are too few rows to fill the GPU.
const SPLIT_MIN_ROW: u64 = 8192;
/// Fewest elements per block of a split row (8 per thread).
const SPLIT_MIN_SEG: u64 = 2048;

/// Segmenting of a reduction over `rows` rows of `n`: `Some((seg, parts))` when the rows are
/// long and too few for one warp each to fill the GPU (one warp would walk a million-element
/// gradient alone), else `None` (the one-warp-per-row kernel).
pub(crate) fn rows_split(rows: usize, n: usize) -> Option<(u64, u64)> {
    let (rows, n) = (rows as u64, n as u64);
    if n < SPLIT_MIN_ROW || rows >= COLS_TARGET_BLOCKS * 8 {
        return None;
    }
    let wanted = (COLS_TARGET_BLOCKS / rows.max(1)).clamp(1, n.div_ceil(SPLIT_MIN_SEG));
    if wanted < 2 {
        return None;
    }
    let seg = n.div_ceil(wanted);
    Some((seg, n.div_ceil(seg)))
}

/// A split-row launch: x over the segments, y over the rows.
pub(crate) fn rows_split_config(rows: usize, parts: u64) -> LaunchConfig {
    LaunchConfig {
        grid: (
            parts.clamp(1, 65_535) as u32,
            (rows as u64).clamp(1, 65_535) as u32,
            1,
        ),
        block: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// A column-reduction launch: x over (outer, 32-column tiles), y over the `chunks` row chunks.
pub(crate) fn cols_config(outer: usize, inner: usize, chunks: u64) -> LaunchConfig {
    let tiles = (outer as u64).saturating_mul((inner as u64).div_ceil(32));
    LaunchConfig {
        grid: (
            tiles.clamp(1, 65_535) as u32,
            chunks.clamp(1, 65_535) as u32,
            1,
        ),
        block: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Widest row the register-resident kernels take: 32 lanes × 8 float4s.
pub(crate) const VEC_MAX_WIDTH: usize = 1024;

/// Float4s per lane (1, 2, 4 or 8) of the register-resident kernel for rows `n` wide, or `None`
/// where it does not apply (`n` not a multiple of 4, or wider than [`VEC_MAX_WIDTH`]). The
/// caller must also check that every row pointer is 16-byte aligned ([`vec_aligned`]).
pub(crate) fn vec_lanes(n: usize) -> Option<u32> {
    if n == 0 || !n.is_multiple_of(4) || n > VEC_MAX_WIDTH {
        return None;
    }
    u32::try_from((n / 4).div_ceil(32).next_power_of_two()).ok()
}

/// Whether `p` meets the register-resident kernels' 16-byte (float4) alignment.
pub(crate) fn vec_aligned(p: DevicePtr) -> bool {
    p.0.is_multiple_of(16)
}

/// Rows one warp handles at a time in the register-resident kernels (`ROWS_PER_WARP` in
/// rows.cu): rows up to 128 wide go two at a time, so each warp keeps more loads in flight.
pub(crate) fn vec_rows_per_warp(lanes: u32) -> u64 {
    if lanes == 1 { 2 } else { 1 }
}

/// A register-resident row launch: 8 warps per block, `vec_rows_per_warp` rows per warp.
pub(crate) fn rows_vec_config(rows: usize, lanes: u32) -> LaunchConfig {
    let per_block = 8 * vec_rows_per_warp(lanes);
    let blocks = (rows as u64).div_ceil(per_block).clamp(1, 65_535) as u32;
    LaunchConfig {
        grid: (blocks, 1, 1),
        block: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One block (the loss reduction).
pub(crate) fn single_block() -> LaunchConfig {
    LaunchConfig {
        grid: (1, 1, 1),
        block: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

pub(crate) fn ptr(p: DevicePtr) -> KernelArg {
    KernelArg::Ptr(p)
}

pub(crate) fn u64a(n: usize) -> KernelArg {
    KernelArg::U64(n as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_resident_rows_pick_the_narrowest_kernel_that_holds_the_row() {
        let cases = [
            (4, Some(1)),
            (128, Some(1)),
            (132, Some(2)),
            (256, Some(2)),
            (260, Some(4)),
            (512, Some(4)),
            (516, Some(8)),
            (1024, Some(8)),
            (1028, None),
            (0, None),
            (6, None),
            (1025, None),
        ];
        for (n, lanes) in cases {
            assert_eq!(vec_lanes(n), lanes, "n = {n}");
            if let Some(l) = lanes {
                assert!(n <= 128 * l as usize);
                assert!(Kernel::softmax_vec(l).and_then(Kernel::vec_lanes) == Some(l));
                assert!(Kernel::layer_norm_vec(l).and_then(Kernel::vec_lanes) == Some(l));
            }
        }
        assert!(vec_aligned(DevicePtr(256)) && !vec_aligned(DevicePtr(260)));
        assert_eq!(rows_vec_config(65_536, 1).grid.0, 4096);
        assert_eq!(rows_vec_config(65_536, 2).grid.0, 8192);
        assert_eq!(rows_vec_config(65_536, 8).grid.0, 8192);
    }

    #[test]
    fn column_reductions_split_rows_only_when_columns_are_few() {
        // [3072, 1024]: 32 column tiles, so 32 chunks of 96 rows fill ~1024 blocks.
        assert_eq!(cols_chunking(1, 3072, 1024), (96, 32));
        // Their [32, 1024] partials: one chunk, no further pass.
        assert_eq!(cols_chunking(1, 32, 1024), (32, 1));
        // Plenty of columns: one chunk.
        assert_eq!(cols_chunking(256, 12, 256), (12, 1));
        // Few rows: never below 32 rows per chunk.
        assert_eq!(cols_chunking(1, 40, 64), (40, 1));
        assert_eq!(cols_chunking(1, 12_288, 64), (32, 384));
        // A 262144-element gradient's squared norm: 128 segments of 2048.
        assert_eq!(rows_split(1, 262_144), Some((2048, 128)));
        assert_eq!(rows_split(1, 8191), None);
        assert_eq!(rows_split(4096, 65_536), None);
        assert_eq!(rows_split(3, 20_000), Some((2000, 10)));
        // [3072, 256] + [256] (a bias add): row-tiled, 384 blocks of 8 rows.
        let tiled = row_tiles(&[3072, 256], &[&[256, 1], &[0, 1]]).map(|c| c.grid.0);
        assert_eq!(tiled, Some(384));
        assert!(row_tiles(&[3072, 256], &[&[256, 1], &[256, 1]]).is_none());
        assert!(row_tiles(&[64, 12], &[&[1, 64], &[12, 1]]).is_none());
        assert!(row_tiles(&[12_288, 64], &[&[64, 1], &[1, 12_288]]).is_none());
        let cfg = cols_config(1, 1024, 32);
        assert_eq!((cfg.grid.0, cfg.grid.1), (32, 32));
    }

    #[test]
    fn coalesce_merges_dense_axes_and_drops_ones() {
        let (s, st) = coalesce(&[2, 3, 4], &[&[12, 4, 1]]);
        assert_eq!((s, st), (vec![24], vec![vec![1]]));
        // A transposed view does not merge.
        let (s, st) = coalesce(&[4, 3], &[&[1, 4]]);
        assert_eq!((s, st), (vec![4, 3], vec![vec![1, 4]]));
        // Broadcast operand: the stride-0 axis stays separate for it, so nothing merges.
        let (s, st) = coalesce(&[2, 1, 3], &[&[3, 3, 1], &[0, 0, 1]]);
        assert_eq!((s, st), (vec![2, 3], vec![vec![3, 1], vec![0, 1]]));
        let (s, st) = coalesce(&[], &[&[]]);
        assert_eq!((s, st), (vec![1], vec![vec![0]]));
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
}
