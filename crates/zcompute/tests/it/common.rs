//! Shared helpers: deterministic inputs, f32/f64 tensor pairs, and the per-tensor error measure.

use zcompute::{Backend, CpuBackend, CpuTensor};

/// Per-tensor relative error budget for f32 against an f64 reference.
pub const TOL: f64 = 1e-5;

pub const CPU: CpuBackend = CpuBackend;

/// Deterministic values uniform in `[lo, hi)` (splitmix64), so failures reproduce.
pub fn uniform(n: usize, seed: u64, lo: f64, hi: f64) -> Vec<f64> {
    let mut state = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    (0..n)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            let u = (z >> 11) as f64 / (1u64 << 53) as f64;
            lo + (hi - lo) * u
        })
        .collect()
}

/// The same values as an f32 tensor and an f64 tensor. The f64 copy holds the f32-rounded
/// values, so the reference sees exactly the f32 input.
pub fn pair(values: &[f64], shape: &[usize]) -> (CpuTensor<f32>, CpuTensor<f64>) {
    let v32: Vec<f32> = values.iter().map(|&v| v as f32).collect();
    let v64: Vec<f64> = v32.iter().map(|&v| f64::from(v)).collect();
    (
        CpuTensor::from_vec(v32, shape).expect("f32 tensor"),
        CpuTensor::from_vec(v64, shape).expect("f64 tensor"),
    )
}

pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// A random pair of the given shape.
pub fn rand_pair(shape: &[usize], seed: u64) -> (CpuTensor<f32>, CpuTensor<f64>) {
    pair(&uniform(numel(shape), seed, -2.0, 2.0), shape)
}

/// ||ours - reference|| / ||reference|| (||ours|| when the reference is exactly zero).
pub fn rel_err(ours: &[f32], reference: &[f64]) -> f64 {
    assert_eq!(ours.len(), reference.len(), "length differs");
    let diff: f64 = ours
        .iter()
        .zip(reference)
        .map(|(&a, &b)| (f64::from(a) - b).powi(2))
        .sum::<f64>()
        .sqrt();
    let norm: f64 = reference.iter().map(|b| b * b).sum::<f64>().sqrt();
    if norm == 0.0 { diff } else { diff / norm }
}

/// Same measure between two f64 vectors (f64 op vs direct formula).
pub fn rel_err64(ours: &[f64], reference: &[f64]) -> f64 {
    assert_eq!(ours.len(), reference.len(), "length differs");
    let diff: f64 = ours
        .iter()
        .zip(reference)
        .map(|(a, b)| (a - b).powi(2))
        .sum::<f64>()
        .sqrt();
    let norm: f64 = reference.iter().map(|b| b * b).sum::<f64>().sqrt();
    if norm == 0.0 { diff } else { diff / norm }
}

/// Asserts an f32 result is within `TOL` of its f64 twin, with shapes equal.
pub fn assert_f32_matches(what: &str, ours: &CpuTensor<f32>, reference: &CpuTensor<f64>) {
    assert_eq!(ours.shape(), reference.shape(), "{what}: shape");
    let err = rel_err(&ours.to_vec(), &reference.to_vec());
    assert!(err <= TOL, "{what}: f32 vs f64 relative error {err:e}");
}

/// Asserts the f32 and f64 results both match a direct f64 formula.
pub fn assert_matches_formula(
    what: &str,
    ours32: &CpuTensor<f32>,
    ours64: &CpuTensor<f64>,
    formula: &[f64],
) {
    let e32 = rel_err(&ours32.to_vec(), formula);
    assert!(e32 <= TOL, "{what}: f32 vs formula relative error {e32:e}");
    let e64 = rel_err64(&ours64.to_vec(), formula);
    assert!(
        e64 <= 1e-12,
        "{what}: f64 vs formula relative error {e64:e}"
    );
}

/// The CPU backend seen as its f32 (or f64) op set, so calls need no type annotations.
pub fn cpu32() -> impl Backend<f32, Storage = zcompute::CpuStorage<f32>> {
    CPU
}

pub fn cpu64() -> impl Backend<f64, Storage = zcompute::CpuStorage<f64>> {
    CPU
}
