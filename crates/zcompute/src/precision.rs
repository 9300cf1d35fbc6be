//! The precision family (issue 42): [`PrecisionOps`], matrix products under a [`MathMode`]
//! (float32, TF32 or bf16 operands, float32 accumulation and output), the Linear layer's
//! forward and backward built on them, and the bf16 rounding of a tensor.
//!
//! A mode is what the product computes, never a hint: a backend that cannot run a mode as it
//! says refuses it with [`ComputeError::MathModeUnsupported`], never running float32 under
//! the mode's name. The provided methods run [`MathMode::F32`] through
//! [`Backend::matmul`](crate::Backend::matmul) and refuse the others; the CPU backend emulates
//! TF32 and bf16 in f32 (operands rounded to nearest-even with `zdevice::rounding`, then its
//! own float32 product), the CUDA backend runs them on tensor cores (`cublasGemmStridedBatchedEx`; bf16 operands converted by
//! `kernels/convert.cu`), except bf16 products with few rows (one sample's: at most
//! `cuda::LINEAR_ROW_LIMIT`), which the small-row kernels' bf16 forms run in one launch
//! (`kernels/linear_bf16.cu`: each operand rounded as it is read, or read from its copy, and a
//! Linear forward's epilogue inside), the simulated device emulates them as the CPU does.
//!
//! Comparing backends: the roundings of the operands are bit-exact everywhere (bf16: the
//! conversion kernel, its twin and the CPU share one integer formula); the accumulation order
//! is each backend's own (cuBLAS's tiles and split-K, the CPU's blocked kernels, the simulated
//! device's sequential sum over `k`), so products agree within float32 accumulation error, not
//! bit for bit. TF32 on the GPU reads float32 operands as the tensor cores do (not specified
//! bit for bit; the emulation rounds to nearest-even), so TF32 products are compared within
//! TF32 operand error.

use crate::backend::{BTensor, MatmulOpts};
use crate::element::{DType, Element};
use crate::error::{ComputeError, Result};
use crate::layout::{Dims, Layout};
use crate::linear::{Activation, LinearOps};
use crate::storage::Storage;
use crate::tensor::Tensor;
use crate::validate;
use zmem::AllocClass;

/// The arithmetic of a matrix product. Every mode accumulates in float32 and returns float32.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MathMode {
    /// float32 operands and products: [`Backend::matmul`](crate::Backend::matmul) itself (on
    /// the CUDA backend after `set_tf32(true)` that product is TF32, as the backend was told;
    /// the reduced modes do not depend on that switch).
    #[default]
    F32,
    /// float32 operands read with 10 significand bits (TF32 tensor cores): at most TF32's
    /// operand error. cuBLAS's `CUBLAS_COMPUTE_32F_FAST_TF32` allows TF32 rather than forcing
    /// it, so a shape it runs without tensor cores comes out in float32 (more accurate, never
    /// less); the CPU and the simulated device always round.
    Tf32,
    /// Operands rounded to bf16 (8 significand bits, nearest-even); a product of two bf16
    /// values is exact in float32, so only the float32 accumulation rounds.
    Bf16,
}

impl MathMode {
    /// The mode's name (`f32`, `tf32`, `bf16`), as errors and logs write it.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            MathMode::F32 => "f32",
            MathMode::Tf32 => "tf32",
            MathMode::Bf16 => "bf16",
        }
    }

    /// An operand element as the mode's product reads it (float32 in, float32 out): unchanged,
    /// rounded to TF32, or rounded to bf16, each to nearest-even (the emulation's rounding).
    #[must_use]
    pub fn round_operand(self, v: f32) -> f32 {
        match self {
            MathMode::F32 => v,
            MathMode::Tf32 => zdevice::rounding::round_to_tf32(v),
            MathMode::Bf16 => zdevice::rounding::round_to_bf16(v),
        }
    }

    /// The driver's mode for the same arithmetic.
    pub(crate) fn gemm_math(self) -> zdevice::GemmMath {
        match self {
            MathMode::F32 => zdevice::GemmMath::F32,
            MathMode::Tf32 => zdevice::GemmMath::Tf32,
            MathMode::Bf16 => zdevice::GemmMath::Bf16,
        }
    }
}

/// The typed refusal of `mode` for `op` on `backend`.
pub(crate) fn unsupported<T: Element>(
    op: &'static str,
    mode: MathMode,
    backend: &'static str,
) -> ComputeError {
    let reason = if T::DTYPE == DType::F32 {
        "this backend has no reduced-precision products".to_string()
    } else {
        format!(
            "reduced-precision products accumulate in float32; these elements are {:?}",
            T::DTYPE
        )
    };
    ComputeError::MathModeUnsupported {
        op,
        mode: mode.name(),
        backend,
        reason,
    }
}

/// A float32 tensor's bf16 copy in a backend's own form, made by
/// [`PrecisionOps::bf16_copy_into`]: a bf16 product takes it as its right-hand operand
/// ([`PrecisionOps::matmul_bf16_rhs`]) instead of converting that operand on every call, with
/// the same bits as [`PrecisionOps::matmul_mode`] under [`MathMode::Bf16`] on the float32
/// tensor (the rounding is one deterministic formula). The CPU backend keeps each value
/// rounded and widened (one element a value); the CUDA backend packs two bf16 values in a
/// float, as cuBLAS reads them. A trainer keeps one of its weights, refreshed once a step.
#[derive(Clone, Debug)]
pub struct Bf16Copy<S: Storage> {
    /// The backing elements, dense and 1-D: `numel.div_ceil(per_element)` of them.
    backing: Tensor<S>,
    shape: Dims,
    /// bf16 values a backing element holds (1 on the CPU, 2 on the CUDA backend).
    per_element: usize,
}

impl<S: Storage> Bf16Copy<S> {
    /// A copy of `shape` over `backing` (dense, 1-D, of exactly the elements it needs).
    pub(crate) fn new(backing: Tensor<S>, shape: &[usize], per_element: usize) -> Result<Self> {
        let numel: usize = shape.iter().product();
        let expected = numel.div_ceil(per_element);
        if backing.rank() != 1 || !backing.is_contiguous() || backing.numel() != expected {
            return Err(ComputeError::LengthMismatch {
                op: "bf16_copy",
                expected,
                got: backing.numel(),
            });
        }
        Ok(Bf16Copy {
            backing,
            shape: shape.into(),
            per_element,
        })
    }

    /// The shape of the tensor this is a copy of.
    #[must_use]
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The values the copy holds.
    #[must_use]
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The backend's elements holding the values (what the memory accounting sees).
    #[must_use]
    pub fn backing(&self) -> &Tensor<S> {
        &self.backing
    }

    /// bf16 values one backing element holds (1 on the CPU, 2 on the CUDA backend).
    #[must_use]
    pub fn per_element(&self) -> usize {
        self.per_element
    }

    /// The copy's values `offset .. offset + numel(shape)` (row-major) as a copy of `shape`: a
    /// view, no data moves. `offset` must be a multiple of [`Bf16Copy::per_element`] (a packed
    /// pair is never split; a flat parameter buffer's offsets are multiples of 64).
    pub fn view(&self, offset: usize, shape: &[usize]) -> Result<Self> {
        let numel: usize = shape.iter().product();
        let whole = self.numel();
        if !offset.is_multiple_of(self.per_element) || offset.saturating_add(numel) > whole {
            return Err(ComputeError::NarrowOutOfRange {
                axis: 0,
                start: offset,
                len: numel,
                size: whole,
            });
        }
        let start = offset / self.per_element;
        // `offset` is a multiple of `per_element`, so the values end within the backing.
        let len = numel.div_ceil(self.per_element);
        Bf16Copy::new(self.backing.narrow(0, start, len)?, shape, self.per_element)
    }

    /// A tensor of the copy's shape for `op`'s shape checks only: every element the
    /// backing's first (zero strides), never read as data. Refused unless the copy is a
    /// matrix (what `op`'s product reads).
    pub(crate) fn shape_stand_in(&self, op: &'static str) -> Result<Tensor<S>> {
        if self.shape.len() != 2 {
            return Err(ComputeError::ShapeMismatch {
                op,
                lhs: self.shape.as_slice().into(),
                rhs: [0, 0][..].into(),
            });
        }
        let strides = vec![0; self.shape.len()];
        let offset = self.backing.layout().offset();
        Tensor::from_parts(
            self.backing.storage().clone(),
            Layout::new(&self.shape, &strides, offset)?,
        )
    }
}

/// A backend's [`Bf16Copy`] of `T` elements.
pub type BBf16<B, T> = Bf16Copy<<B as crate::backend::Backend<T>>::Storage>;

/// A Linear layer's product `x · wᵀ` (the weight stored `[out, in]`).
pub(crate) const LINEAR_NT: MatmulOpts = MatmulOpts {
    trans_a: false,
    trans_b: true,
};

/// A Linear layer's float32 epilogue on its product `z`: `act(z + bias)`, plus `residual`
/// when given (the provided bodies of [`PrecisionOps::linear_bf16`] and `linear_bf16_rhs`, and
/// the CUDA backend's steps where its one-launch form does not take the product).
pub(crate) fn linear_epilogue<B: LinearOps<T> + ?Sized, T: Element>(
    b: &B,
    z: &BTensor<B, T>,
    bias: &BTensor<B, T>,
    act: Activation,
    residual: Option<&BTensor<B, T>>,
) -> Result<BTensor<B, T>> {
    let z = b.bias_act(z, bias, act)?;
    match residual {
        Some(r) => b.add(&z, r),
        None => Ok(z),
    }
}

/// Matrix products under a [`MathMode`] and the Linear layer on them. Implemented by the CPU
/// backend (f32: every mode, emulated; f64: [`MathMode::F32`] only) and the CUDA backend
/// (every mode). A backend of your own gets float32 and a typed refusal of the other modes
/// from an empty `impl` block.
pub trait PrecisionOps<T: Element>: LinearOps<T> {
    /// `op(a) · op(b)` under `mode` (shapes and broadcasting as
    /// [`Backend::matmul`](crate::Backend::matmul)), float32 out. The provided body runs
    /// [`MathMode::F32`] as that product and refuses the others
    /// ([`ComputeError::MathModeUnsupported`]).
    fn matmul_mode(
        &self,
        a: &BTensor<Self, T>,
        b: &BTensor<Self, T>,
        opts: MatmulOpts,
        mode: MathMode,
    ) -> Result<BTensor<Self, T>> {
        match mode {
            MathMode::F32 => self.matmul(a, b, opts),
            _ => Err(unsupported::<T>("matmul_mode", mode, self.name())),
        }
    }

    /// `dst += op(a) · op(b)` under `mode` (as
    /// [`Backend::matmul_into`](crate::Backend::matmul_into)). The provided body runs
    /// [`MathMode::F32`] as that product and refuses the others.
    fn matmul_into_mode(
        &self,
        a: &BTensor<Self, T>,
        b: &BTensor<Self, T>,
        opts: MatmulOpts,
        dst: &BTensor<Self, T>,
        mode: MathMode,
    ) -> Result<()> {
        match mode {
            MathMode::F32 => self.matmul_into(a, b, opts, dst),
            _ => Err(unsupported::<T>("matmul_into_mode", mode, self.name())),
        }
    }

    /// `x` rounded element by element to bf16 (nearest-even; a NaN stays a NaN of its sign, an
    /// overflow becomes an infinity) and widened back: a fresh dense tensor of `x`'s shape.
    /// Bit-identical on every backend that has it (the provided body refuses).
    fn round_to_bf16(&self, x: &BTensor<Self, T>) -> Result<BTensor<Self, T>> {
        let _ = x;
        Err(unsupported::<T>(
            "round_to_bf16",
            MathMode::Bf16,
            self.name(),
        ))
    }

    /// A bf16 copy of a tensor of `shape`, uninitialised as far as the caller is concerned
    /// (fill it with [`PrecisionOps::bf16_copy_into`]), allocated in the backend's current
    /// allocation class. The provided body refuses (no bf16 products here).
    fn bf16_copy_alloc(&self, shape: &[usize]) -> Result<BBf16<Self, T>> {
        let _ = shape;
        Err(unsupported::<T>(
            "bf16_copy_alloc",
            MathMode::Bf16,
            self.name(),
        ))
    }

    /// Writes `src` rounded to bf16 (nearest-even, as every bf16 product reads an operand)
    /// into `dst`, of `src`'s element count. Allocates nothing: legal in a captured graph. The
    /// provided body refuses.
    fn bf16_copy_into(&self, src: &BTensor<Self, T>, dst: &BBf16<Self, T>) -> Result<()> {
        let _ = (src, dst);
        Err(unsupported::<T>(
            "bf16_copy_into",
            MathMode::Bf16,
            self.name(),
        ))
    }

    /// `op(a) · op(w)` under [`MathMode::Bf16`] with the right-hand operand given as its bf16
    /// copy (one matrix, broadcast over `a`'s batch axes): bit for bit
    /// `matmul_mode(a, w32, opts, MathMode::Bf16)` for the float32 `w32` the copy was made
    /// from, without converting `w32` again. The provided body refuses.
    fn matmul_bf16_rhs(
        &self,
        a: &BTensor<Self, T>,
        w: &BBf16<Self, T>,
        opts: MatmulOpts,
    ) -> Result<BTensor<Self, T>> {
        let _ = (a, w, opts);
        Err(unsupported::<T>(
            "matmul_bf16_rhs",
            MathMode::Bf16,
            self.name(),
        ))
    }

    /// `x`'s bf16 copy, allocated in the backend's current allocation class
    /// ([`PrecisionOps::bf16_copy_alloc`]) and filled ([`PrecisionOps::bf16_copy_into`]): one
    /// conversion, which every product that then reads the copy
    /// ([`PrecisionOps::matmul_bf16`], [`PrecisionOps::matmul_into_bf16`]) skips. A Linear
    /// layer under bf16 keeps its input's copy for its backward and converts its output's
    /// gradient once for both of its products. The provided body is those two calls.
    fn bf16_copy_of(&self, x: &BTensor<Self, T>) -> Result<BBf16<Self, T>> {
        let copy = self.bf16_copy_alloc(x.shape())?;
        self.bf16_copy_into(x, &copy)?;
        Ok(copy)
    }

    /// `op(a) · op(b)` under [`MathMode::Bf16`] with both operands given as their bf16 copies
    /// (matrices): bit for bit `matmul_mode(a32, b32, opts, MathMode::Bf16)` for the float32
    /// tensors the copies were made from, converting nothing. The provided body refuses.
    fn matmul_bf16(
        &self,
        a: &BBf16<Self, T>,
        b: &BBf16<Self, T>,
        opts: MatmulOpts,
    ) -> Result<BTensor<Self, T>> {
        let _ = (a, b, opts);
        Err(unsupported::<T>("matmul_bf16", MathMode::Bf16, self.name()))
    }

    /// `dst += op(a) · op(b)` under [`MathMode::Bf16`] on two bf16 copies (as
    /// [`PrecisionOps::matmul_bf16`]): bit for bit
    /// `matmul_into_mode(a32, b32, opts, dst, MathMode::Bf16)`. Validated first, so bad
    /// input leaves `dst` untouched. The provided body refuses.
    fn matmul_into_bf16(
        &self,
        a: &BBf16<Self, T>,
        b: &BBf16<Self, T>,
        opts: MatmulOpts,
        dst: &BTensor<Self, T>,
    ) -> Result<()> {
        let _ = (a, b, opts, dst);
        Err(unsupported::<T>(
            "matmul_into_bf16",
            MathMode::Bf16,
            self.name(),
        ))
    }

    /// A Linear layer's forward under `mode`, `act(x · wᵀ + bias)`: the product under `mode`,
    /// then the bias epilogue in float32 ([`LinearOps::bias_act`]), as docs/precision.md's
    /// table says.
    fn linear_mode(
        &self,
        x: &BTensor<Self, T>,
        w: &BTensor<Self, T>,
        bias: &BTensor<Self, T>,
        act: Activation,
        mode: MathMode,
    ) -> Result<BTensor<Self, T>> {
        validate::linear(x, w, bias)?;
        let opts = MatmulOpts {
            trans_a: false,
            trans_b: true,
        };
        self.bias_act(&self.matmul_mode(x, w, opts, mode)?, bias, act)
    }

    /// A Linear layer's forward under [`MathMode::Bf16`] on bf16 copies of its input and
    /// weight, `act(x · wᵀ + bias)`, plus `residual` when given (a skip connection, added in
    /// float32 after the activation): bit for bit `linear_mode(x32, w32, bias, act,
    /// MathMode::Bf16)` (then [`Backend::add`](crate::Backend::add)) for the float32 tensors
    /// the copies were made from. The provided body is that product on the copies
    /// ([`PrecisionOps::matmul_bf16`]), the bias epilogue, then the add; the device runs them
    /// in one launch for few rows.
    fn linear_bf16(
        &self,
        x: &BBf16<Self, T>,
        w: &BBf16<Self, T>,
        bias: &BTensor<Self, T>,
        act: Activation,
        residual: Option<&BTensor<Self, T>>,
    ) -> Result<BTensor<Self, T>> {
        let z = self.matmul_bf16(x, w, LINEAR_NT)?;
        linear_epilogue(self, &z, bias, act, residual)
    }

    /// As [`PrecisionOps::linear_bf16`] with the input in float32 (rounded to bf16 as the
    /// product reads it) and the weight's copy: bit for bit `linear_mode(x, w32, bias, act,
    /// MathMode::Bf16)` (then the add). The provided body is
    /// [`PrecisionOps::matmul_bf16_rhs`], the bias epilogue, then the add.
    fn linear_bf16_rhs(
        &self,
        x: &BTensor<Self, T>,
        w: &BBf16<Self, T>,
        bias: &BTensor<Self, T>,
        act: Activation,
        residual: Option<&BTensor<Self, T>>,
    ) -> Result<BTensor<Self, T>> {
        let z = self.matmul_bf16_rhs(x, w, LINEAR_NT)?;
        linear_epilogue(self, &z, bias, act, residual)
    }

    /// Tanh's backward `g · (1 - y²)` ([`LinearOps::tanh_backward`]) and its bf16 copy
    /// ([`PrecisionOps::bf16_copy_of`]), both allocated in the current allocation class: a
    /// Linear layer's backward under bf16 reads the copy in both products and the float32
    /// result in the bias gradient. The provided body is those two calls; the device runs them
    /// as one launch.
    fn tanh_backward_bf16(
        &self,
        g: &BTensor<Self, T>,
        y: &BTensor<Self, T>,
    ) -> Result<(BTensor<Self, T>, BBf16<Self, T>)> {
        let gz = self.tanh_backward(g, y)?;
        let copy = self.bf16_copy_of(&gz)?;
        Ok((gz, copy))
    }

    /// A Linear layer's parameter gradients under [`MathMode::Bf16`] added into their buffers
    /// (as [`LinearOps::linear_param_grads_into`], whose checks apply): `dw += gᵀ · x` on
    /// the bf16 copies `g_copy` (of `g`) and `x`, bit for bit
    /// [`PrecisionOps::matmul_into_bf16`], and `db += Σ_rows g` in float32 on the unrounded
    /// `g`. Validated whole first, so bad input leaves `dw` and `db` untouched. The provided
    /// body is those two calls (the bias's [`Backend::sum_rows_into`](crate::Backend::sum_rows_into));
    /// the device runs both in one launch for few rows and more outputs than its row kernels
    /// take, dw with the bits of `matmul_into_bf16`, db summed in row order (which need not be
    /// `sum_rows_into`'s order: the bits of db may differ from the provided body's).
    fn linear_param_grads_into_bf16(
        &self,
        g: &BTensor<Self, T>,
        g_copy: &BBf16<Self, T>,
        x: &BBf16<Self, T>,
        dw: &BTensor<Self, T>,
        db: Option<&BTensor<Self, T>>,
    ) -> Result<()> {
        const OP: &str = "linear_param_grads_into_bf16";
        const TN: MatmulOpts = MatmulOpts {
            trans_a: true,
            trans_b: false,
        };
        validate::linear_param_grads_into_bf16(g, g_copy.shape(), &x.shape_stand_in(OP)?, dw, db)?;
        self.matmul_into_bf16(g_copy, x, TN, dw)?;
        match db {
            Some(db) => self.sum_rows_into(g, db),
            None => Ok(()),
        }
    }

    /// A Linear layer's backward under [`MathMode::Bf16`] on the trainer's copies, the
    /// parameter gradients added into their buffers (as [`LinearOps::linear_backward_into`],
    /// whose checks apply): `x` the input's bf16 copy (the forward's), `w` the weight's (when
    /// the input needs a gradient). `gz` is `gy`, or tanh's backward from `y`; `gx =
    /// round(gz) · w`, `dw += round(gz)ᵀ · x`, `db += Σ_rows gz` in float32. Validated whole
    /// first, so bad input leaves `dw` and `db` untouched. The provided body is
    /// [`PrecisionOps::tanh_backward_bf16`] (or `gy` and [`PrecisionOps::bf16_copy_of`]), with
    /// `gz` and its copy in the [`AllocClass::Saved`] class (temporaries of this call, freed
    /// when it returns, where a scratch block would live to the step's end), then
    /// [`PrecisionOps::matmul_bf16`] and [`PrecisionOps::linear_param_grads_into_bf16`]; the
    /// device runs them as one launch where that kernel applies, with the same bits.
    fn linear_backward_into_bf16(
        &self,
        gy: &BTensor<Self, T>,
        x: &BBf16<Self, T>,
        w: Option<&BBf16<Self, T>>,
        (act, y): (Activation, Option<&BTensor<Self, T>>),
        (dw, db): (&BTensor<Self, T>, Option<&BTensor<Self, T>>),
    ) -> Result<Option<BTensor<Self, T>>> {
        linear_backward_into_bf16(self, gy, x, w, (act, y), (dw, db))
    }

    /// A Linear layer's backward under `mode` (as [`LinearOps::linear_backward_into`], whose
    /// checks apply): tanh's backward and the bias gradient in float32, both products
    /// (`gz · w` and `dw += gzᵀ · x`) under `mode`. Validated whole first, so bad input leaves
    /// `dw` and `db` untouched.
    fn linear_backward_into_mode(
        &self,
        gy: &BTensor<Self, T>,
        x: &BTensor<Self, T>,
        w: Option<&BTensor<Self, T>>,
        (act, y): (Activation, Option<&BTensor<Self, T>>),
        (dw, db): (&BTensor<Self, T>, Option<&BTensor<Self, T>>),
        mode: MathMode,
    ) -> Result<Option<BTensor<Self, T>>> {
        linear_backward_into_mode(self, gy, x, w, (act, y), (dw, db), mode)
    }
}

/// The provided body of [`PrecisionOps::linear_backward_into_bf16`] (the device's composite
/// too).
pub(crate) fn linear_backward_into_bf16<B: PrecisionOps<T> + ?Sized, T: Element>(
    b: &B,
    gy: &Tensor<B::Storage>,
    x: &BBf16<B, T>,
    w: Option<&BBf16<B, T>>,
    (act, y): (Activation, Option<&Tensor<B::Storage>>),
    (dw, db): (&Tensor<B::Storage>, Option<&Tensor<B::Storage>>),
) -> Result<Option<Tensor<B::Storage>>> {
    const OP: &str = "linear_backward_into_bf16";
    let sw = w.map(|w| w.shape_stand_in(OP)).transpose()?;
    validate::linear_backward_into(gy, &x.shape_stand_in(OP)?, sw.as_ref(), (act, y), dw, db)?;
    linear_backward_bf16_steps(b, gy, x, w, y, (dw, db))
}

/// [`linear_backward_into_bf16`]'s steps, its input validated already.
pub(crate) fn linear_backward_bf16_steps<B: PrecisionOps<T> + ?Sized, T: Element>(
    b: &B,
    gy: &Tensor<B::Storage>,
    x: &BBf16<B, T>,
    w: Option<&BBf16<B, T>>,
    y: Option<&Tensor<B::Storage>>,
    (dw, db): (&Tensor<B::Storage>, Option<&Tensor<B::Storage>>),
) -> Result<Option<Tensor<B::Storage>>> {
    let previous = b.set_alloc_class(AllocClass::Saved);
    let gz = match y {
        Some(y) => b.tanh_backward_bf16(gy, y),
        None => b.bf16_copy_of(gy).map(|copy| (gy.clone(), copy)),
    };
    b.set_alloc_class(previous);
    let (gz, gz_copy) = gz?;
    let gx = w
        .map(|w| b.matmul_bf16(&gz_copy, w, MatmulOpts::default()))
        .transpose()?;
    b.linear_param_grads_into_bf16(&gz, &gz_copy, x, dw, db)?;
    Ok(gx)
}

/// The gradient before a Linear layer's activation and its input's gradient, when asked for.
pub(crate) type GzAndGx<S> = (Tensor<S>, Option<Tensor<S>>);

/// The first steps of [`PrecisionOps::linear_backward_into_mode`] (validated already): the
/// gradient before the activation `gz` (tanh's backward from `y`, in float32, or `gy`) and the
/// input's gradient `gz · w` under `mode` when `w` is given.
pub(crate) fn gz_and_gx_mode<B: PrecisionOps<T> + ?Sized, T: Element>(
    b: &B,
    gy: &Tensor<B::Storage>,
    w: Option<&Tensor<B::Storage>>,
    y: Option<&Tensor<B::Storage>>,
    mode: MathMode,
) -> Result<GzAndGx<B::Storage>> {
    let gz = match y {
        Some(y) => b.tanh_backward(gy, y)?,
        None => gy.clone(),
    };
    let gx = w
        .map(|w| b.matmul_mode(&gz, w, MatmulOpts::default(), mode))
        .transpose()?;
    Ok((gz, gx))
}

/// The provided body of [`PrecisionOps::linear_backward_into_mode`].
pub(crate) fn linear_backward_into_mode<B: PrecisionOps<T> + ?Sized, T: Element>(
    b: &B,
    gy: &Tensor<B::Storage>,
    x: &Tensor<B::Storage>,
    w: Option<&Tensor<B::Storage>>,
    (act, y): (Activation, Option<&Tensor<B::Storage>>),
    (dw, db): (&Tensor<B::Storage>, Option<&Tensor<B::Storage>>),
    mode: MathMode,
) -> Result<Option<Tensor<B::Storage>>> {
    validate::linear_backward_into(gy, x, w, (act, y), dw, db)?;
    let (gz, gx) = gz_and_gx_mode(b, gy, w, y, mode)?;
    let opts = MatmulOpts {
        trans_a: true,
        trans_b: false,
    };
    b.matmul_into_mode(&gz, x, opts, dw, mode)?;
    if let Some(db) = db {
        b.sum_rows_into(&gz, db)?;
    }
    Ok(gx)
}
