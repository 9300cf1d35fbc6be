//! Launch shapes of every kernel (threads per block, grids) and the host-side dispatch that
//! picks a kernel variant from the operand shapes: row tiling of strided ops, row chunking of
//! column reductions, splitting of few long rows, and the register-resident row width. Split
//! from the kernel-id table because these are tuning decisions (measured thresholds), not
//! kernel contracts.

use super::args::coalesce;
use zdevice::{DevicePtr, LaunchConfig};

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

/// Most rows of partials that a column reduction's finishing pass takes in one chunk (32 per
/// row lane of a block): `[3072, n]` makes 96 chunks, whose partials were reduced in two more
/// passes (3 chunks, then 1), each a dependent launch of about 3 us on an H100.
pub(crate) const COLS_FINISH_MAX_ROWS: usize = 256;

/// Tickets of the single-launch reductions (`CudaBackend::tickets`): at most this many column
/// tiles take the one-launch path (a [`TICKETS`] x 32-column tensor of partials' worth).
pub const TICKETS: usize = 4096;

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
}
