//! Precision policies (issue 42): which format each op of a training step computes in. The
//! per-op table is docs/precision.md. What exists so far is the policy type and, on the CPU
//! backend, a matrix product under it with the rounding emulated ([`Precision::matmul_cpu`]):
//! the reference a bf16 device product is checked against. The trainer takes a policy
//! (`TrainerConfig::precision`) and runs its tapes' matrix products under
//! [`Precision::math_mode`] (`Tape::with_math_mode`).

use crate::error::{GradError, Result};
use zcompute::{BTensor, Backend, CpuBackend, MatmulOpts};

/// A training step's precision policy. Under every policy the master parameters, the AdamW
/// moments and the accumulated gradients stay float32 (docs/precision.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Precision {
    /// Everything in float32 (the products too: TF32 off).
    #[default]
    F32,
    /// float32 storage; matrix products on TF32 tensor cores (inputs with 10 significand bits,
    /// float32 accumulation).
    Tf32,
    /// Matrix products with bf16 inputs (8 significand bits, rounded to nearest-even) and
    /// float32 accumulation; norms, softmax, losses and reductions in float32.
    Bf16,
}

impl Precision {
    /// The policy's name as the docs and a command line write it.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Tf32 => "tf32",
            Precision::Bf16 => "bf16",
        }
    }

    /// The policy of a name as [`Precision::name`] writes it (`f32`, `tf32`, `bf16`).
    #[must_use]
    pub fn from_name(name: &str) -> Option<Precision> {
        [Precision::F32, Precision::Tf32, Precision::Bf16]
            .into_iter()
            .find(|p| p.name() == name)
    }

    /// The arithmetic of this policy's matrix products on a backend
    /// (`zcompute::PrecisionOps::matmul_mode` and the Linear forms beside it): the door the
    /// trainer takes to run its products under the policy, attention's fused core's included
    /// (`zcompute::AttentionOps::qk_norm_attention_mode`). Every other op stays float32.
    #[must_use]
    pub fn math_mode(self) -> zcompute::MathMode {
        match self {
            Precision::F32 => zcompute::MathMode::F32,
            Precision::Tf32 => zcompute::MathMode::Tf32,
            Precision::Bf16 => zcompute::MathMode::Bf16,
        }
    }

    /// A matrix product's input element as the product reads it: unchanged in float32, rounded
    /// to the nearest bf16 (ties to even, as PyTorch's `.to(torch.bfloat16)`) under bf16.
    /// `None` under TF32, whose input rounding is the tensor cores' own and not emulated.
    #[must_use]
    pub fn product_input(self, v: f32) -> Option<f32> {
        match self {
            Precision::F32 => Some(v),
            Precision::Bf16 => Some(half::bf16::from_f32(v).to_f32()),
            Precision::Tf32 => None,
        }
    }

    /// `a · b` (operands read transposed per `opts`) on the CPU backend under this policy:
    /// under bf16 both inputs are rounded to bf16 first and the product accumulates in float32
    /// (a product of two bf16 values is exact in float32, so only the accumulation rounds, as
    /// on tensor cores); under float32 the backend's own product. TF32 is refused
    /// (`PrecisionNotEmulated`): its input rounding is not specified bit-exactly, and running
    /// it in float32 instead would pass a float32 result off as a TF32 one.
    pub fn matmul_cpu(
        self,
        cpu: &CpuBackend,
        a: &BTensor<CpuBackend, f32>,
        b: &BTensor<CpuBackend, f32>,
        opts: MatmulOpts,
    ) -> Result<BTensor<CpuBackend, f32>> {
        if self == Precision::F32 {
            return Ok(cpu.matmul(a, b, opts)?);
        }
        let round = |t: &BTensor<CpuBackend, f32>| -> Result<BTensor<CpuBackend, f32>> {
            let values = cpu
                .download(t)?
                .into_iter()
                .map(|v| self.product_input(v))
                .collect::<Option<Vec<f32>>>()
                .ok_or(GradError::PrecisionNotEmulated {
                    precision: self.name(),
                    what: "a matrix product on the CPU backend",
                })?;
            Ok(cpu.upload(&values, t.shape())?)
        };
        Ok(cpu.matmul(&round(a)?, &round(b)?, opts)?)
    }
}
