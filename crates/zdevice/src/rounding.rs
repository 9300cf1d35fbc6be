//! The reduced-precision roundings of a matrix product (issue 42), bit for bit: float32 to bf16
//! and to TF32, both round to nearest, ties to even. One definition shared by the simulated
//! driver's mixed-precision gemm, zcompute's conversion kernel (`kernels/convert.cu` does the
//! same integer arithmetic) and its twin, and the CPU backend's emulation, so the three agree
//! on every input.

/// The bf16 bits nearest to `x` (ties to even). A NaN stays a NaN of the same sign, made quiet
/// (its top payload bits kept, as `half::bf16::from_f32` and PyTorch do); a float32 above
/// bf16's largest finite value by half an ulp or more becomes an infinity, as IEEE rounding
/// says.
#[must_use]
pub fn bf16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) | 0x0040) as u16;
    }
    // Adding 0x7FFF plus the lowest kept bit carries into the kept half exactly when the
    // dropped half is above the tie, or at the tie with an odd kept half. It cannot overflow:
    // the largest non-NaN pattern is 0xFF80_0000 (minus infinity).
    ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) as u16
}

/// The float32 value of bf16 `bits` (exact: bf16 is float32's top half).
#[must_use]
pub fn f32_from_bf16_bits(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// `x` rounded to bf16 (ties to even), as float32.
#[must_use]
pub fn round_to_bf16(x: f32) -> f32 {
    f32_from_bf16_bits(bf16_bits(x))
}

/// `x` rounded to TF32 (10 stored significand bits, ties to even), as float32. NaN and the
/// infinities are returned unchanged. The tensor cores' own reading of a float32 operand under
/// `CUBLAS_COMPUTE_32F_FAST_TF32` is not specified bit for bit (it may truncate), so a device
/// product is compared with this emulation within a tolerance, never bitwise.
#[must_use]
pub fn round_to_tf32(x: f32) -> f32 {
    if !x.is_finite() {
        return x;
    }
    let b = x.to_bits();
    // A finite value rounds to at most infinity (0x7F80_0000): no overflow of the u32.
    f32::from_bits(b.wrapping_add(0xFFF + ((b >> 13) & 1)) & !0x1FFF)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    // 1 + 2^-8 is the tie between 1 and 1 + 2^-7: to even (1).
    #[case(1.0 + 2f32.powi(-8), 0x3F80)]
    // 1 + 3·2^-8 is the tie between 1 + 2^-7 (odd) and 1 + 2^-6: to even (up).
    #[case(1.0 + 3.0 * 2f32.powi(-8), 0x3F82)]
    // Just above the tie rounds up.
    #[case(1.0 + 2f32.powi(-8) + 2f32.powi(-20), 0x3F81)]
    #[case(-1.0 - 2f32.powi(-8), 0xBF80)]
    #[case(f32::INFINITY, 0x7F80)]
    #[case(f32::NEG_INFINITY, 0xFF80)]
    // float32's largest finite value is past bf16's largest by more than half an ulp.
    #[case(f32::MAX, 0x7F80)]
    #[case(0.0, 0x0000)]
    #[case(-0.0, 0x8000)]
    // The smallest float32 subnormal is below half of bf16's smallest subnormal: zero.
    #[case(f32::from_bits(1), 0x0000)]
    fn bf16_rounds_to_nearest_even(#[case] x: f32, #[case] bits: u16) {
        assert_eq!(bf16_bits(x), bits, "{x:e}");
    }

    #[test]
    fn a_nan_stays_a_nan_of_its_sign() {
        for nan in [
            f32::NAN,
            -f32::NAN,
            f32::from_bits(0x7F80_0001),
            f32::from_bits(0xFFC1_2345),
        ] {
            let b = bf16_bits(nan);
            assert!(
                f32_from_bf16_bits(b).is_nan(),
                "{:#x} -> {b:#x}",
                nan.to_bits()
            );
            assert_eq!(b & 0x8000 != 0, nan.is_sign_negative());
        }
    }

    #[rstest]
    // 1 + 2^-11 is the tie between 1 and 1 + 2^-10: to even (1).
    #[case(1.0 + 2f32.powi(-11), 1.0)]
    #[case(1.0 + 3.0 * 2f32.powi(-11), 1.0 + 2f32.powi(-9))]
    #[case(1.0 + 2f32.powi(-12), 1.0)]
    #[case(f32::INFINITY, f32::INFINITY)]
    fn tf32_rounds_to_nearest_even(#[case] x: f32, #[case] want: f32) {
        assert_eq!(round_to_tf32(x), want);
    }

    proptest::proptest! {
        /// `half` (PyTorch's conversion too) on every pattern proptest draws, NaNs included.
        #[test]
        fn bf16_is_half_bit_for_bit(bits: u32) {
            let x = f32::from_bits(bits);
            proptest::prop_assert_eq!(bf16_bits(x), half::bf16::from_f32(x).to_bits());
        }

        #[test]
        fn bf16_is_the_nearest_and_idempotent(bits: u32) {
            let x = f32::from_bits(bits);
            proptest::prop_assume!(x.is_finite());
            let r = round_to_bf16(x);
            proptest::prop_assert_eq!(round_to_bf16(r), r);
            if r.is_finite() {
                // No bf16 neighbour of r is nearer to x.
                let up = f32_from_bf16_bits(bf16_bits(r).wrapping_add(1));
                let down = f32_from_bf16_bits(bf16_bits(r).wrapping_sub(1));
                let d = (f64::from(x) - f64::from(r)).abs();
                for n in [up, down].into_iter().filter(|n| n.is_finite()) {
                    proptest::prop_assert!(d <= (f64::from(x) - f64::from(n)).abs());
                }
            }
        }
    }
}
