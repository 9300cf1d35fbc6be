//! The element types: `f32` everywhere, `f64` on the CPU backend for references. Ops are written
//! once, generically over `Element`, so the f32 path and its f64 reference compute the same
//! formula and differ only in rounding.

use std::fmt::Debug;
use std::ops::{Add, Div, Mul, Neg, Sub};

/// Runtime tag of an element type (for logs, errors and a device backend's kernel choice).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F64,
}

impl DType {
    /// Size of one element in bytes.
    #[must_use]
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F64 => 8,
        }
    }
}

/// A floating-point element. The math functions are the ones the op set needs; each maps to the
/// type's own precision (erf through libm, accurate to about one ulp). `LinalgScalar` is there
/// because the CPU backend multiplies matrices through ndarray (matrixmultiply underneath).
pub trait Element:
    ndarray::LinalgScalar
    + Copy
    + Debug
    + Default
    + PartialOrd
    + Send
    + Sync
    + 'static
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
{
    const DTYPE: DType;
    const ZERO: Self;
    const ONE: Self;
    const NEG_INFINITY: Self;

    /// Rounds an f64 constant into this type (hyper-parameters, 0.5, sqrt(1/2), ...).
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    fn ln_1p(self) -> Self;
    fn sqrt(self) -> Self;
    fn tanh(self) -> Self;
    fn abs(self) -> Self;
    fn erf(self) -> Self;
    fn powf(self, e: Self) -> Self;
    fn is_nan(self) -> bool;
    /// `tanh` of every element in place: the CPU backend's bulk form (f32: a vectorised tanh
    /// within 2 ulp, `fastmath`; f64: `tanh` element by element, unchanged).
    fn tanh_slice(xs: &mut [Self]);
}

/// `tanh` element by element (f64's bulk tanh).
fn tanh_each<T: Element>(xs: &mut [T]) {
    for v in xs {
        *v = v.tanh();
    }
}

macro_rules! impl_element {
    ($t:ty, $dtype:expr, $erf:path, $tanh_slice:path) => {
        impl Element for $t {
            const DTYPE: DType = $dtype;
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const NEG_INFINITY: Self = <$t>::NEG_INFINITY;

            #[inline]
            #[allow(clippy::cast_possible_truncation)]
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            #[inline]
            fn to_f64(self) -> f64 {
                f64::from(self)
            }
            #[inline]
            fn exp(self) -> Self {
                <$t>::exp(self)
            }
            #[inline]
            fn ln(self) -> Self {
                <$t>::ln(self)
            }
            #[inline]
            fn ln_1p(self) -> Self {
                <$t>::ln_1p(self)
            }
            #[inline]
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            #[inline]
            fn tanh(self) -> Self {
                <$t>::tanh(self)
            }
            #[inline]
            fn abs(self) -> Self {
                <$t>::abs(self)
            }
            #[inline]
            fn erf(self) -> Self {
                $erf(self)
            }
            #[inline]
            fn powf(self, e: Self) -> Self {
                <$t>::powf(self, e)
            }
            #[inline]
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
            fn tanh_slice(xs: &mut [Self]) {
                $tanh_slice(xs)
            }
        }
    };
}

impl_element!(f32, DType::F32, libm::erff, crate::fastmath::tanh_in_place);
impl_element!(f64, DType::F64, libm::erf, tanh_each);
