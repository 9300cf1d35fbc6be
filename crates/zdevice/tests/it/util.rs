//! Helpers shared by the suites.

use zdevice::*;

/// A conformance check: `Err` says what did not hold.
pub type Check = Result<(), String>;

/// Formats any error for a check.
pub fn s(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Fails with `msg` unless `cond`.
pub fn ensure(cond: bool, msg: impl Into<String>) -> Check {
    if cond { Ok(()) } else { Err(msg.into()) }
}

/// Little-endian bytes of `v`.
pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Allocates and uploads `v`.
pub fn upload<D: Driver>(dev: &Device<D>, v: &[f32]) -> Result<DevicePtr, String> {
    let p = dev.alloc((v.len().max(1) * 4) as u64).map_err(s)?;
    dev.copy_htod(p, &f32_bytes(v)).map_err(s)?;
    Ok(p)
}

/// Downloads `n` floats.
pub fn read_f32<D: Driver>(dev: &Device<D>, p: DevicePtr, n: usize) -> Result<Vec<f32>, String> {
    let mut b = vec![0u8; n * 4];
    dev.copy_dtoh(&mut b, p).map_err(s)?;
    Ok(b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// ‖got − want‖ / ‖want‖ in float64 (NaN if any element is not finite).
pub fn rel_err(got: &[f32], want: &[f64]) -> f64 {
    if got.len() != want.len() || got.iter().any(|x| !x.is_finite()) {
        return f64::NAN;
    }
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(g, w)| (f64::from(*g) - w).powi(2))
        .sum();
    let den: f64 = want.iter().map(|w| w * w).sum();
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

/// Deterministic values in [-1, 1).
pub fn pseudo_random(seed: u64, n: usize) -> Vec<f32> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// A row-major batched product `C[b] = op(A[b]) · op(B[b])`, `op(A)` m×k, `op(B)` k×n. A is
/// stored [m,k] (or [k,m] when `ta`), B [k,n] (or [n,k] when `tb`), C [m,n].
#[derive(Clone, Copy, Debug)]
pub struct Gemm {
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub ta: bool,
    pub tb: bool,
}

impl Gemm {
    pub fn a_len(&self) -> usize {
        self.batch * self.m * self.k
    }
    pub fn b_len(&self) -> usize {
        self.batch * self.k * self.n
    }
    pub fn c_len(&self) -> usize {
        self.batch * self.m * self.n
    }
    pub fn random_a(&self, seed: u64) -> Vec<f32> {
        pseudo_random(seed, self.a_len())
    }
    pub fn random_b(&self, seed: u64) -> Vec<f32> {
        pseudo_random(seed, self.b_len())
    }

    /// The cuBLAS (column-major) call computing this row-major product: C^T = op(B)^T op(A)^T.
    pub fn desc(&self, a: DevicePtr, b: DevicePtr, c: DevicePtr, beta: f32) -> GemmF32 {
        let (m, n, k) = (self.m as i32, self.n as i32, self.k as i32);
        let t = |y| if y { Transpose::Yes } else { Transpose::No };
        GemmF32 {
            transa: t(self.tb),
            transb: t(self.ta),
            m: n,
            n: m,
            k,
            alpha: 1.0,
            a: b,
            lda: if self.tb { k } else { n },
            stride_a: (self.k * self.n) as i64,
            b: a,
            ldb: if self.ta { m } else { k },
            stride_b: (self.m * self.k) as i64,
            beta,
            c,
            ldc: n,
            stride_c: (self.m * self.n) as i64,
            batch: self.batch as i32,
        }
    }

    /// The product in float64.
    pub fn reference(&self, a: &[f32], b: &[f32]) -> Vec<f64> {
        let (m, n, k) = (self.m, self.n, self.k);
        let mut c = vec![0.0f64; self.c_len()];
        for bi in 0..self.batch {
            let (ao, bo, co) = (bi * m * k, bi * k * n, bi * m * n);
            for i in 0..m {
                for j in 0..n {
                    let mut acc = 0.0f64;
                    for p in 0..k {
                        let av = if self.ta {
                            a[ao + p * m + i]
                        } else {
                            a[ao + i * k + p]
                        };
                        let bv = if self.tb {
                            b[bo + j * k + p]
                        } else {
                            b[bo + p * n + j]
                        };
                        acc += f64::from(av) * f64::from(bv);
                    }
                    c[co + i * n + j] = acc;
                }
            }
        }
        c
    }
}
