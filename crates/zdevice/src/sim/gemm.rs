//! The CPU matrix product behind `cublasSgemmStridedBatched`.
//!
//! cuBLAS semantics in column-major order, with transposes, leading dimensions, element strides
//! between batches and alpha/beta. Products are accumulated in f64 and rounded once to f32: the
//! result is then at least as accurate as the GPU's and sits within float32 rounding of an f64
//! reference, which is how the conformance suite compares. When `beta == 0`, C is not read (a NaN
//! already there is overwritten, as cuBLAS does); when `alpha == 0` or `k == 0`, A and B are not
//! read (`C = beta * C`), as the reference BLAS does.

use super::access::KernelFault;
use super::memory::Memory;
use crate::types::{DevicePtr, GemmF32, Transpose};

/// Why a gemm descriptor is rejected (`CUBLAS_STATUS_INVALID_VALUE`).
pub(crate) fn validate(g: &GemmF32) -> Result<(), String> {
    if g.m < 0 || g.n < 0 || g.k < 0 || g.batch < 0 {
        return Err(format!(
            "negative size m={} n={} k={} batch={}",
            g.m, g.n, g.k, g.batch
        ));
    }
    let rows_a = if g.transa == Transpose::No { g.m } else { g.k };
    let rows_b = if g.transb == Transpose::No { g.k } else { g.n };
    if g.lda < rows_a.max(1) {
        return Err(format!("lda {} < {}", g.lda, rows_a.max(1)));
    }
    if g.ldb < rows_b.max(1) {
        return Err(format!("ldb {} < {}", g.ldb, rows_b.max(1)));
    }
    if g.ldc < g.m.max(1) {
        return Err(format!("ldc {} < {}", g.ldc, g.m.max(1)));
    }
    Ok(())
}

/// Floating-point operations, for the virtual duration.
pub(crate) fn flops(g: &GemmF32) -> u64 {
    let dims = [g.m, g.n, g.k, g.batch].map(|d| u64::try_from(d).unwrap_or(0));
    dims.iter().fold(2u64, |acc, d| acc.saturating_mul(*d))
}

/// Rounds to TF32 (10 mantissa bits, round to nearest even), as tensor cores read operands.
fn tf32(x: f32) -> f32 {
    crate::rounding::round_to_tf32(x)
}

/// The address of element `index` (in floats) past `base`, or a fault if it leaves the address
/// space.
fn at(base: DevicePtr, index: i128) -> Result<DevicePtr, KernelFault> {
    let addr = i128::from(base.0) + index * 4;
    u64::try_from(addr)
        .map(DevicePtr)
        .map_err(|_| KernelFault::Unmapped { ptr: base })
}

/// Reads a column-major `rows x cols` operand stored with leading dimension `ld`.
fn read_matrix(
    mem: &Memory,
    base: DevicePtr,
    rows: usize,
    cols: usize,
    ld: usize,
    round: bool,
) -> Result<Vec<f32>, KernelFault> {
    if rows == 0 || cols == 0 {
        return Ok(Vec::new());
    }
    // One read covering every column: (cols - 1) * ld + rows elements.
    let too_big = KernelFault::OutOfBounds {
        ptr: base,
        len: u64::MAX,
        size: 0,
    };
    let n = (cols - 1).checked_mul(ld).and_then(|e| e.checked_add(rows));
    let len = n.and_then(|n| (n as u64).checked_mul(4)).ok_or(too_big)?;
    let bytes = mem.read(base, len)?;
    Ok(bytes
        .chunks_exact(4)
        .map(|c| {
            let v = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            if round { tf32(v) } else { v }
        })
        .collect())
}

/// A validated product's sizes in elements, its operands' stored shapes (rows x columns,
/// column-major) and where `op(A)[r, p]` and `op(B)[p, j]` sit in them: what the float32 gemm
/// and the mixed-precision one (`gemm_ex.rs`) share; only their accumulation differs.
#[derive(Debug, Clone, Copy)]
pub(super) struct Dims {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub batch: usize,
    pub lda: usize,
    pub ldb: usize,
    pub ldc: usize,
    pub stored_a: (usize, usize),
    pub stored_b: (usize, usize),
    transa: bool,
    transb: bool,
}

impl Dims {
    pub(super) fn of(g: &GemmF32) -> Dims {
        let [m, n, k, batch] = [g.m, g.n, g.k, g.batch].map(|d| usize::try_from(d).unwrap_or(0));
        let [lda, ldb, ldc] = [g.lda, g.ldb, g.ldc].map(|d| usize::try_from(d).unwrap_or(0));
        let (transa, transb) = (g.transa != Transpose::No, g.transb != Transpose::No);
        Dims {
            m,
            n,
            k,
            batch,
            lda,
            ldb,
            ldc,
            stored_a: if transa { (k, m) } else { (m, k) },
            stored_b: if transb { (n, k) } else { (k, n) },
            transa,
            transb,
        }
    }

    /// `(op(A)[r, p], op(B)[p, j])` from the stored operands.
    pub(super) fn pair(
        &self,
        a: &[f32],
        b: &[f32],
        (r, p, j): (usize, usize, usize),
    ) -> (f32, f32) {
        let av = if self.transa {
            a[p + r * self.lda]
        } else {
            a[r + p * self.lda]
        };
        let bv = if self.transb {
            b[j + p * self.ldb]
        } else {
            b[p + j * self.ldb]
        };
        (av, bv)
    }
}

/// Runs the whole batched product against `mem`. `g` has been validated.
pub(crate) fn run(mem: &mut Memory, g: &GemmF32, tf32_math: bool) -> Result<(), KernelFault> {
    let d = Dims::of(g);
    let Dims {
        m,
        n,
        k,
        batch,
        lda,
        ldb,
        ldc,
        ..
    } = d;
    let ((ra, ca), (rb, cb)) = (d.stored_a, d.stored_b);
    if m == 0 || n == 0 {
        return Ok(());
    }
    let skip_ab = g.alpha == 0.0 || k == 0;
    for i in 0..batch as i128 {
        // i128: batch (< 2^31) times a stride (< 2^63) cannot overflow.
        let a0 = at(g.a, i * i128::from(g.stride_a))?;
        let b0 = at(g.b, i * i128::from(g.stride_b))?;
        let c0 = at(g.c, i * i128::from(g.stride_c))?;
        let (a, b) = if skip_ab {
            (Vec::new(), Vec::new())
        } else {
            (
                read_matrix(mem, a0, ra, ca, lda, tf32_math)?,
                read_matrix(mem, b0, rb, cb, ldb, tf32_math)?,
            )
        };
        let old_c = if g.beta == 0.0 {
            None
        } else {
            Some(read_matrix(mem, c0, m, n, ldc, false)?)
        };
        for j in 0..n {
            let mut col = Vec::with_capacity(m);
            for r in 0..m {
                let mut acc = 0.0f64;
                if !skip_ab {
                    for p in 0..k {
                        let (av, bv) = d.pair(&a, &b, (r, p, j));
                        acc += f64::from(av) * f64::from(bv);
                    }
                }
                let mut v = f64::from(g.alpha) * acc;
                if let Some(c) = &old_c {
                    v += f64::from(g.beta) * f64::from(c[r + j * ldc]);
                }
                col.push(v as f32);
            }
            let bytes: Vec<u8> = col.iter().flat_map(|v| v.to_le_bytes()).collect();
            mem.write(at(c0, (j * ldc) as i128)?, &bytes)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::memory::AllocKind;

    fn put(mem: &mut Memory, v: &[f32]) -> DevicePtr {
        let p = mem
            .alloc(v.len() as u64 * 4, AllocKind::Device)
            .expect("alloc");
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        mem.write(p, &bytes).expect("write");
        p
    }

    fn get(mem: &Memory, p: DevicePtr, n: usize) -> Vec<f32> {
        let b = mem.read(p, n as u64 * 4).expect("read");
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    fn desc(a: DevicePtr, b: DevicePtr, c: DevicePtr) -> GemmF32 {
        GemmF32 {
            transa: Transpose::No,
            transb: Transpose::No,
            m: 2,
            n: 2,
            k: 2,
            alpha: 1.0,
            a,
            lda: 2,
            stride_a: 4,
            b,
            ldb: 2,
            stride_b: 4,
            beta: 0.0,
            c,
            ldc: 2,
            stride_c: 4,
            batch: 1,
        }
    }

    #[test]
    fn column_major_product_with_transposes_and_nan_c() {
        let mut mem = Memory::new(1 << 20, true);
        // A = [[1,2],[3,4]] column-major: [1,3,2,4]; B = [[5,6],[7,8]]: [5,7,6,8].
        let a = put(&mut mem, &[1.0, 3.0, 2.0, 4.0]);
        let b = put(&mut mem, &[5.0, 7.0, 6.0, 8.0]);
        let c = put(&mut mem, &[f32::NAN; 4]);
        let g = desc(a, b, c);
        run(&mut mem, &g, false).expect("gemm");
        // A*B = [[19,22],[43,50]] -> column-major [19,43,22,50].
        assert_eq!(get(&mem, c, 4), [19.0, 43.0, 22.0, 50.0]);
        // A^T * B = [[1,3],[2,4]] * B = [[26,30],[38,44]].
        let g = GemmF32 {
            transa: Transpose::Yes,
            beta: 1.0,
            ..g
        };
        run(&mut mem, &g, false).expect("gemm");
        assert_eq!(get(&mem, c, 4), [45.0, 81.0, 52.0, 94.0]);
    }

    #[test]
    fn validation_rejects_small_leading_dimensions() {
        let g = desc(DevicePtr(0), DevicePtr(0), DevicePtr(0));
        assert!(validate(&g).is_ok());
        assert!(validate(&GemmF32 { lda: 1, ..g }).is_err());
        assert!(validate(&GemmF32 { m: -1, ..g }).is_err());
        assert!(validate(&GemmF32 { batch: -1, ..g }).is_err());
    }

    #[test]
    fn out_of_bounds_operand_faults() {
        let mut mem = Memory::new(1 << 20, true);
        let a = put(&mut mem, &[1.0; 3]);
        let b = put(&mut mem, &[1.0; 4]);
        let c = put(&mut mem, &[0.0; 4]);
        let err = run(&mut mem, &desc(a, b, c), false).expect_err("A is one float short");
        assert!(matches!(err, KernelFault::OutOfBounds { .. }), "{err:?}");
    }
}
