//! Scalar formulas shared by the f32 path and its f64 reference (and the spec the CUDA kernels
//! must match). Kept in one place so "the same op in f64" really is the same formula.

use crate::backend::{BinaryOp, UnaryOp};
use crate::element::Element;

#[inline]
pub(crate) fn unary<T: Element>(op: UnaryOp, x: T) -> T {
    match op {
        UnaryOp::Neg => -x,
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Rsqrt => T::ONE / x.sqrt(),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Sigmoid => sigmoid(x),
        UnaryOp::Relu => {
            // NaN stays NaN (x > 0 is false for NaN, so test the other way round).
            if x < T::ZERO { T::ZERO } else { x }
        }
        UnaryOp::Gelu => {
            let half = T::from_f64(0.5);
            let inv_sqrt2 = T::from_f64(std::f64::consts::FRAC_1_SQRT_2);
            half * x * (T::ONE + (x * inv_sqrt2).erf())
        }
    }
}

/// `out[i] = unary(op, x[i])`, the op chosen once outside the loop so each loop is
/// straight-line code.
pub(crate) fn unary_slice<T: Element>(op: UnaryOp, x: &[T], out: &mut [T]) {
    fn map<T: Element>(x: &[T], out: &mut [T], f: impl Fn(T) -> T) {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = f(v);
        }
    }
    match op {
        UnaryOp::Neg => map(x, out, |v| -v),
        UnaryOp::Exp => map(x, out, T::exp),
        UnaryOp::Log => map(x, out, T::ln),
        UnaryOp::Sqrt => map(x, out, T::sqrt),
        UnaryOp::Rsqrt => map(x, out, |v| T::ONE / v.sqrt()),
        UnaryOp::Tanh => {
            out.copy_from_slice(&x[..out.len()]);
            T::tanh_slice(out);
        }
        UnaryOp::Sigmoid => map(x, out, sigmoid),
        UnaryOp::Relu => map(x, out, |v| unary(UnaryOp::Relu, v)),
        UnaryOp::Gelu => map(x, out, |v| unary(UnaryOp::Gelu, v)),
    }
}

/// `unary_slice` in place.
pub(crate) fn unary_in_place<T: Element>(op: UnaryOp, xs: &mut [T]) {
    match op {
        UnaryOp::Tanh => T::tanh_slice(xs),
        _ => xs.iter_mut().for_each(|v| *v = unary(op, *v)),
    }
}

/// Sigmoid through `exp(-|x|)`, which never overflows: for x < 0, `e/(1+e)` with `e = exp(x)`.
#[inline]
pub(crate) fn sigmoid<T: Element>(x: T) -> T {
    if x >= T::ZERO {
        T::ONE / (T::ONE + (-x).exp())
    } else {
        let e = x.exp();
        e / (T::ONE + e)
    }
}

#[inline]
pub(crate) fn binary<T: Element>(op: BinaryOp, a: T, b: T) -> T {
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        BinaryOp::Maximum => maximum(a, b),
    }
}

/// NaN-propagating maximum (`f32::max` would drop the NaN).
#[inline]
pub(crate) fn maximum<T: Element>(a: T, b: T) -> T {
    if a.is_nan() || a >= b { a } else { b }
}

/// One BCE-with-logits term: `max(x,0) - x*y + log1p(exp(-|x|))`.
#[inline]
pub(crate) fn bce_with_logits<T: Element>(x: T, y: T) -> T {
    let pos = if x > T::ZERO { x } else { T::ZERO };
    pos - x * y + (-x.abs()).exp().ln_1p()
}

/// Rows of at most this many elements are a leaf of [`pairwise_sum`]'s tree.
pub(crate) const LEAF: usize = 32;
/// A leaf's running sums: element `i` of a leaf goes into sum `i % LANES`.
pub(crate) const LANES: usize = 8;

/// Pairwise summation: error grows with log(n) instead of n, so f32 sums over the 1025-wide
/// rows the tests use stay within float32 rounding of the f64 reference. A GPU tree reduction
/// has the same error profile. A leaf (at most [`LEAF`] elements) keeps [`LANES`] running sums
/// ([`leaf_sum`]): one running sum would chain every add on the one before (a few cycles
/// each), where eight independent ones fill a vector register.
///
/// Rows of up to two leaves (attention's 64-wide heads) take no call, so the caller's
/// vector instructions (`par::simd`) reach them; longer rows recurse.
#[inline(always)]
pub(crate) fn pairwise_sum<T: Element>(xs: &[T]) -> T {
    if xs.len() <= LEAF {
        leaf_sum(xs)
    } else if xs.len() <= 2 * LEAF {
        let (lo, hi) = xs.split_at(xs.len() / 2);
        leaf_sum(lo) + leaf_sum(hi)
    } else {
        pairwise_halves(xs)
    }
}

/// [`pairwise_sum`] of the two halves of a row longer than two leaves.
fn pairwise_halves<T: Element>(xs: &[T]) -> T {
    let (lo, hi) = xs.split_at(xs.len() / 2);
    pairwise_sum(lo) + pairwise_sum(hi)
}

/// A leaf's sum: element `i` added into running sum `i % LANES` (each from zero, in order),
/// then the running sums added as [`lanes_total`] does.
#[inline(always)]
fn leaf_sum<T: Element>(xs: &[T]) -> T {
    let mut acc = [T::ZERO; LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(chunk) {
            *a = *a + x;
        }
    }
    for (a, &x) in acc.iter_mut().zip(chunks.remainder()) {
        *a = *a + x;
    }
    lanes_total(&acc)
}

/// The [`LANES`] running sums of a leaf added as a fixed tree,
/// `((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))`.
#[inline]
pub(crate) fn lanes_total<T: Element>(s: &[T; LANES]) -> T {
    ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]))
}

/// Maximum of a non-empty row, NaN-propagating.
pub(crate) fn row_max<T: Element>(xs: &[T]) -> T {
    xs.iter().fold(T::NEG_INFINITY, |acc, &x| maximum(acc, x))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairwise_sum_is_exact_on_integers_and_accurate_on_f32() {
        let ints: Vec<f64> = (1..=1025).map(f64::from).collect();
        assert_eq!(pairwise_sum(&ints), 1025.0 * 1026.0 / 2.0);
        // 1e5 values of 0.1f32: a naive f32 loop drifts by ~1e-3 relative; pairwise does not.
        let xs = vec![0.1f32; 100_000];
        let exact = 100_000.0 * f64::from(0.1f32);
        let rel = (f64::from(pairwise_sum(&xs)) - exact).abs() / exact;
        assert!(rel < 1e-6, "{rel}");
    }

    #[test]
    fn stable_formulas_at_extremes() {
        assert_eq!(sigmoid(-200.0f32), 0.0);
        assert_eq!(sigmoid(200.0f32), 1.0);
        // BCE of a confident right answer is ~0, of a confident wrong one is ~|x|; never inf.
        assert!(bce_with_logits(100.0f32, 1.0) < 1e-30);
        assert_eq!(bce_with_logits(100.0f32, 0.0), 100.0);
        assert_eq!(bce_with_logits(-100.0f32, 1.0), 100.0);
        assert!((bce_with_logits(0.0f64, 1.0) - std::f64::consts::LN_2).abs() < 1e-15);
        assert!(maximum(f64::NAN, 1.0).is_nan() && maximum(1.0, f64::NAN).is_nan());
        assert!(row_max(&[1.0f32, f32::NAN, 3.0]).is_nan());
    }

    #[test]
    fn gelu_at_known_points() {
        assert_eq!(unary(UnaryOp::Gelu, 0.0f64), 0.0);
        // gelu(1) = 0.5 (1 + erf(1/sqrt 2)) = 0.8413447460685429...
        assert!((unary(UnaryOp::Gelu, 1.0f64) - 0.841_344_746_068_542_9).abs() < 1e-15);
        assert!((unary(UnaryOp::Gelu, -1.0f32) + 0.158_655_26).abs() < 1e-7);
    }
}
