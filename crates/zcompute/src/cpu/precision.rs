//! `PrecisionOps` on the host: TF32 and bf16 emulated in f32. Each operand is rounded element
//! by element as the mode reads it (`MathMode::round_operand`, nearest-even), then the
//! backend's own float32 product runs on the rounded operands: products of TF32 or bf16 values
//! are exact in float32, so only its float32 accumulation rounds, as on tensor cores. In f64
//! only `MathMode::F32` runs (a reduced-precision product accumulates in float32, which an f64
//! reference would not): the others are refused with a typed error.

use super::CpuBackend;
use crate::backend::{Backend, MatmulOpts};
use crate::element::{DType, Element};
use crate::error::Result;
use crate::precision::{Bf16Copy, MathMode, PrecisionOps, unsupported};
use crate::storage::CpuStorage;
use crate::tensor::CpuTensor;

/// `x` with every element rounded as `round` says: a fresh dense tensor of its shape.
fn rounded<T: Element>(x: &CpuTensor<T>, round: impl Fn(f32) -> f32) -> Result<CpuTensor<T>> {
    let values: Vec<T> = x
        .to_vec()
        .into_iter()
        // Exact both ways: the elements are f32 (checked by the caller).
        .map(|v| T::from_f64(f64::from(round(v.to_f64() as f32))))
        .collect();
    CpuTensor::from_vec(values, x.shape())
}

impl CpuBackend {
    /// The operands as `mode`'s product reads them, or the typed refusal (f64 elements).
    fn mode_operands<T: Element>(
        &self,
        op: &'static str,
        (a, b): (&CpuTensor<T>, &CpuTensor<T>),
        mode: MathMode,
    ) -> Result<(CpuTensor<T>, CpuTensor<T>)> {
        if T::DTYPE != DType::F32 {
            return Err(unsupported::<T>(op, mode, Backend::<T>::name(self)));
        }
        let round = |v| mode.round_operand(v);
        Ok((rounded(a, round)?, rounded(b, round)?))
    }
}

impl CpuBackend {
    /// A bf16 copy's values (rounded, one element a value) as a dense matrix of its shape, or
    /// the typed refusal (not a matrix; f64 elements, which no copy is made of).
    fn widened<T: Element>(
        &self,
        op: &'static str,
        copy: &Bf16Copy<CpuStorage<T>>,
    ) -> Result<CpuTensor<T>> {
        if T::DTYPE != DType::F32 {
            return Err(unsupported::<T>(
                op,
                MathMode::Bf16,
                Backend::<T>::name(self),
            ));
        }
        copy.shape_stand_in(op)?;
        copy.backing().reshape(copy.shape())
    }
}

impl<T: Element> PrecisionOps<T> for CpuBackend {
    fn matmul_mode(
        &self,
        a: &CpuTensor<T>,
        b: &CpuTensor<T>,
        opts: MatmulOpts,
        mode: MathMode,
    ) -> Result<CpuTensor<T>> {
        if mode == MathMode::F32 {
            return self.matmul(a, b, opts);
        }
        crate::validate::matmul(a, b, opts)?;
        let (a, b) = self.mode_operands("matmul_mode", (a, b), mode)?;
        self.matmul(&a, &b, opts)
    }

    fn matmul_into_mode(
        &self,
        a: &CpuTensor<T>,
        b: &CpuTensor<T>,
        opts: MatmulOpts,
        dst: &CpuTensor<T>,
        mode: MathMode,
    ) -> Result<()> {
        if mode == MathMode::F32 {
            return self.matmul_into(a, b, opts, dst);
        }
        crate::validate::matmul_into(a, b, opts, dst)?;
        let (a, b) = self.mode_operands("matmul_into_mode", (a, b), mode)?;
        self.matmul_into(&a, &b, opts, dst)
    }

    /// One element a value: the values rounded to bf16 and widened back.
    fn bf16_copy_alloc(&self, shape: &[usize]) -> Result<Bf16Copy<CpuStorage<T>>> {
        if T::DTYPE != DType::F32 {
            return Err(unsupported::<T>(
                "bf16_copy_alloc",
                MathMode::Bf16,
                Backend::<T>::name(self),
            ));
        }
        let numel = crate::layout::checked_numel("bf16_copy_alloc", shape)?;
        Bf16Copy::new(self.zeros(&[numel])?, shape, 1)
    }

    fn bf16_copy_into(&self, src: &CpuTensor<T>, dst: &Bf16Copy<CpuStorage<T>>) -> Result<()> {
        if src.numel() != dst.numel() {
            return Err(crate::error::ComputeError::LengthMismatch {
                op: "bf16_copy_into",
                expected: dst.numel(),
                got: src.numel(),
            });
        }
        let rounded = self.round_to_bf16(src)?;
        self.copy_into(&rounded.reshape(&[src.numel()])?, dst.backing())
    }

    /// The left operand rounded as `matmul_mode` rounds it; the right one is the copy's
    /// values, already rounded (rounding them again would change nothing).
    fn matmul_bf16_rhs(
        &self,
        a: &CpuTensor<T>,
        w: &Bf16Copy<CpuStorage<T>>,
        opts: MatmulOpts,
    ) -> Result<CpuTensor<T>> {
        let w = w.backing().reshape(w.shape())?;
        crate::validate::matmul(a, &w, opts)?;
        if T::DTYPE != DType::F32 {
            return Err(unsupported::<T>(
                "matmul_bf16_rhs",
                MathMode::Bf16,
                Backend::<T>::name(self),
            ));
        }
        self.matmul(&rounded(a, zdevice::rounding::round_to_bf16)?, &w, opts)
    }

    /// The copies' values, already rounded, through the backend's own float32 product: the
    /// operands `matmul_mode` would have rounded, in the same dense layout.
    fn matmul_bf16(
        &self,
        a: &Bf16Copy<CpuStorage<T>>,
        b: &Bf16Copy<CpuStorage<T>>,
        opts: MatmulOpts,
    ) -> Result<CpuTensor<T>> {
        let (a, b) = (
            self.widened("matmul_bf16", a)?,
            self.widened("matmul_bf16", b)?,
        );
        crate::validate::matmul(&a, &b, opts)?;
        self.matmul(&a, &b, opts)
    }

    fn matmul_into_bf16(
        &self,
        a: &Bf16Copy<CpuStorage<T>>,
        b: &Bf16Copy<CpuStorage<T>>,
        opts: MatmulOpts,
        dst: &CpuTensor<T>,
    ) -> Result<()> {
        const OP: &str = "matmul_into_bf16";
        let (a, b) = (self.widened(OP, a)?, self.widened(OP, b)?);
        crate::validate::matmul_into(&a, &b, opts, dst)?;
        self.matmul_into(&a, &b, opts, dst)
    }

    fn round_to_bf16(&self, x: &CpuTensor<T>) -> Result<CpuTensor<T>> {
        if T::DTYPE != DType::F32 {
            return Err(unsupported::<T>(
                "round_to_bf16",
                MathMode::Bf16,
                Backend::<T>::name(self),
            ));
        }
        rounded(x, zdevice::rounding::round_to_bf16)
    }
}
