//! The float formats a safetensors file may hold parameters in: float32 and float64, and the
//! 16-bit bf16 (a PyTorch bf16 `state_dict`) and f16. Training always keeps float32 (or float64)
//! masters: a 16-bit file is widened on load, which is exact (every bf16 and f16 value is a
//! float32), and written only when asked for ([`FileDtype`] in `io::write_tensors_as`), rounded
//! to nearest, ties to even, by the `half` crate.
//!
//! A 16-bit file must hold finite values only: bf16 has float32's range, so an infinity there is
//! a value that was already infinite, and f16's range ends at 65,504, so an infinity there is
//! usually a float32 that overflowed when the file was written. Either way the model would start
//! from garbage, so reading refuses it, and writing refuses a value that would become one.

use half::{bf16, f16};
use safetensors::Dtype;

/// The element format of a tensor in a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileDtype {
    F32,
    F64,
    /// bfloat16: float32's 8-bit exponent, 8 significant bits.
    Bf16,
    /// IEEE half: 5-bit exponent (largest finite value 65,504), 11 significant bits.
    F16,
}

impl FileDtype {
    /// The safetensors dtype of this format.
    #[must_use]
    pub fn safetensors(self) -> Dtype {
        match self {
            FileDtype::F32 => Dtype::F32,
            FileDtype::F64 => Dtype::F64,
            FileDtype::Bf16 => Dtype::BF16,
            FileDtype::F16 => Dtype::F16,
        }
    }

    /// The format of a safetensors dtype zgrad reads as floats (`None` for any other: integers,
    /// booleans, 8-bit floats).
    #[must_use]
    pub fn of(dtype: Dtype) -> Option<FileDtype> {
        match dtype {
            Dtype::F32 => Some(FileDtype::F32),
            Dtype::F64 => Some(FileDtype::F64),
            Dtype::BF16 => Some(FileDtype::Bf16),
            Dtype::F16 => Some(FileDtype::F16),
            _ => None,
        }
    }

    /// Whether the format is narrower than float32 (and so cannot hold training masters).
    #[must_use]
    pub fn is_reduced(self) -> bool {
        matches!(self, FileDtype::Bf16 | FileDtype::F16)
    }
}

/// The value of the 16-bit pattern `bits` of a reduced format (exact in float32).
pub(crate) fn widen(dtype: FileDtype, bits: u16) -> f32 {
    match dtype {
        FileDtype::F16 => f16::from_bits(bits).to_f32(),
        _ => bf16::from_bits(bits).to_f32(),
    }
}

/// `value` rounded to nearest, ties to even, in the reduced format `dtype`, as its bit pattern
/// (an infinity where it overflows, a NaN stays a NaN).
///
/// `half` rounds a float32 exactly, but its float64 conversions drop the low 32 bits first,
/// which can round wrongly. So a float64 is first rounded to float32 *to odd* (an inexact result
/// takes the neighbour with an odd last bit): rounding that to nearest-even in a format at
/// least two bits narrower gives the correctly rounded result (Boldo and Melquiond, "When
/// double rounding is odd", 2005), and bf16 and f16 are 13 and more bits narrower.
pub(crate) fn narrow(dtype: FileDtype, value: f64) -> u16 {
    let v = f32_round_to_odd(value);
    match dtype {
        FileDtype::F16 => f16::from_f32(v).to_bits(),
        _ => bf16::from_f32(v).to_bits(),
    }
}

/// `value` rounded to float32 to odd: exact values stay, an inexact one becomes whichever of
/// its two float32 neighbours has an odd significand.
fn f32_round_to_odd(value: f64) -> f32 {
    // Rounding to float32 is the point here.
    #[allow(clippy::cast_possible_truncation)]
    let nearest = value as f32;
    if !nearest.is_finite() || f64::from(nearest) == value || nearest.to_bits() & 1 == 1 {
        return nearest;
    }
    // `nearest` is even and inexact: its neighbour on `value`'s side is odd.
    if f64::from(nearest) < value {
        nearest.next_up()
    } else {
        nearest.next_down()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The correctly rounded bf16 of a finite `value` in bf16's normal range, found by
    /// comparing the distances to the two bf16 neighbours (exact in float64 there).
    fn nearest_bf16(value: f64) -> u16 {
        #[allow(clippy::cast_possible_truncation)]
        let single = value as f32;
        // Truncating a float32 to its top 16 bits rounds bf16 toward zero.
        let toward_zero = bf16::from_bits((single.to_bits() >> 16) as u16);
        // `value as f32` may have rounded up across a bf16 boundary: step back if so.
        let mut lo = toward_zero;
        if f64::from(lo.to_f32()).abs() > value.abs() {
            lo = bf16::from_bits(lo.to_bits() - 1);
        }
        let hi = bf16::from_bits(lo.to_bits() + 1);
        let (dl, dh) = (
            (value - f64::from(lo.to_f32())).abs(),
            (f64::from(hi.to_f32()) - value).abs(),
        );
        if dl < dh || (dl == dh && lo.to_bits() & 1 == 0) {
            lo.to_bits()
        } else {
            hi.to_bits()
        }
    }

    #[test]
    fn a_float64_just_past_a_tie_rounds_up_where_two_roundings_would_not() {
        // 1 + 2^-8 is the tie between bf16's 1 and 1 + 2^-7; a hair above it rounds up. Through
        // float32 to nearest the hair is lost and the tie rounds to even (down).
        let value = 1.0 + 2f64.powi(-8) + 2f64.powi(-40);
        #[allow(clippy::cast_possible_truncation)]
        let twice = bf16::from_f32(value as f32).to_bits();
        assert_eq!(twice, bf16::from_f32(1.0).to_bits());
        assert_eq!(
            narrow(FileDtype::Bf16, value),
            bf16::from_f32(1.0 + 2f32.powi(-7)).to_bits()
        );
    }

    #[test]
    fn overflow_becomes_an_infinity_and_nan_stays_nan() {
        assert!(widen(FileDtype::F16, narrow(FileDtype::F16, 65_520.0)).is_infinite());
        assert_eq!(
            widen(FileDtype::F16, narrow(FileDtype::F16, 65_504.0)),
            65_504.0
        );
        assert!(widen(FileDtype::Bf16, narrow(FileDtype::Bf16, f64::NAN)).is_nan());
        assert!(widen(FileDtype::Bf16, narrow(FileDtype::Bf16, 1e39)).is_infinite());
    }

    proptest! {
        #[test]
        fn float64_rounds_to_the_nearest_bf16(
            mantissa in 1.0f64..2.0,
            exponent in -120i32..120,
            negative: bool,
        ) {
            let value = if negative { -1.0 } else { 1.0 } * mantissa * 2f64.powi(exponent);
            prop_assert_eq!(narrow(FileDtype::Bf16, value), nearest_bf16(value));
        }

        #[test]
        fn float32_rounds_as_half_does(bits: u32) {
            let v = f32::from_bits(bits);
            prop_assume!(v.is_finite());
            prop_assert_eq!(narrow(FileDtype::Bf16, f64::from(v)), bf16::from_f32(v).to_bits());
            prop_assert_eq!(narrow(FileDtype::F16, f64::from(v)), f16::from_f32(v).to_bits());
        }

        #[test]
        fn every_finite_bf16_and_f16_survives_widening_and_narrowing(bits: u16) {
            for dtype in [FileDtype::Bf16, FileDtype::F16] {
                let v = widen(dtype, bits);
                if v.is_finite() {
                    prop_assert_eq!(narrow(dtype, f64::from(v)), bits);
                }
            }
        }
    }
}
