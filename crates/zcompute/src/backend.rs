//! The op set's primitives as a trait. `CpuBackend` implements it for f32 and f64, `CudaBackend`
//! for f32, so the type system keeps f64 (references only) off the GPU. Ops are grouped by kind
//! behind small enums (one method per kernel family) so a device backend maps each family to
//! one kernel with an op code; the per-op methods are provided on top.
//!
//! `Backend` holds what any model's step is made of: transfers, fills and copies, elementwise
//! ops, reductions, softmax, LayerNorm and their plain backwards, matrix products, the loss,
//! AdamW and the ops over a flat gradient buffer, row gather/scatter, memory classes, steps and
//! sync. Fusions of several of these into one kernel for a layer live in the family traits
//! ([`crate::LinearOps`], [`crate::NormOps`], [`crate::AttentionOps`],
//! [`crate::PooledLossOps`]), a training step's own ops in [`crate::StepOps`] and queued
//! downloads in [`crate::ReadbackOps`], each method provided as the composite of these
//! primitives; [`crate::Ops`] is all of them in one bound. A new fused op joins its family,
//! not this trait.

pub use crate::descriptors::{
    ADAMW_SLOT_GATE, ADAMW_SLOT_LR, ADAMW_SLOT_STEP, AdamWConfig, BinaryOp, LayerNormBackward,
    MatmulOpts, ReduceOp, ScalarSide, UnaryOp,
};
use crate::element::Element;
use crate::error::Result;
use crate::storage::Storage;
use crate::tensor::Tensor;
pub use zmem::AllocClass;

/// LayerNorm's forward results. `mean` and `rstd` have the input's shape with the last axis
/// kept as 1, ready to broadcast against the input in backward.
#[derive(Clone, Debug)]
pub struct LayerNormOut<S: Storage> {
    pub out: Tensor<S>,
    pub mean: Tensor<S>,
    pub rstd: Tensor<S>,
}

/// The gradients [`Backend::layer_norm_backward`] returns, each only where asked for.
#[derive(Clone, Debug)]
pub struct LayerNormGrads<S: Storage> {
    /// The input's gradient.
    pub input: Option<Tensor<S>>,
    /// `g * xhat`, the output gradient times the normalised input: summed over every axis but
    /// the last it is the weight's gradient (the bias's is the same sum of `g`).
    pub g_xhat: Option<Tensor<S>>,
}

/// A tensor of backend `B` with elements `T`.
pub type BTensor<B, T> = Tensor<<B as Backend<T>>::Storage>;

/// The op set. Every method checks shapes and returns `ComputeError` on bad input; outputs are
/// fresh dense (row-major) tensors; the in-place ops (`fill`, `copy_into`, `adamw_step`) write
/// through their destination views.
pub trait Backend<T: Element> {
    type Storage: Storage<Elem = T>;

    /// Short name for logs (`"cpu"`, `"cuda"`).
    fn name(&self) -> &'static str;

    /// Uploads `data` (row-major) as a dense tensor of `shape`.
    fn upload(&self, data: &[T], shape: &[usize]) -> Result<BTensor<Self, T>>;

    /// Writes `data` (logical row-major order) into the existing view `dst` (the static input
    /// tensors of a captured graph are refilled this way before each replay). On a device this
    /// is an asynchronous upload on the backend's stream, staged through pinned memory; it is
    /// refused while the backend is capturing.
    fn upload_into(&self, data: &[T], dst: &BTensor<Self, T>) -> Result<()>;

    /// Downloads `x` in logical row-major order.
    fn download(&self, x: &BTensor<Self, T>) -> Result<Vec<T>>;

    /// A dense tensor with every element `value`.
    fn full(&self, shape: &[usize], value: T) -> Result<BTensor<Self, T>>;

    /// Writes `value` into every element of the view `dst`.
    fn fill(&self, dst: &BTensor<Self, T>, value: T) -> Result<()>;

    /// An explicit dense copy of `x` in fresh storage (always a copy, even if `x` is dense, so
    /// the result never aliases its input).
    fn contiguous(&self, x: &BTensor<Self, T>) -> Result<BTensor<Self, T>>;

    /// Copies `src` into the view `dst` of the same shape (the backward of narrow and split
    /// writes a gradient into a strided window of a larger one). `src` may alias `dst`.
    fn copy_into(&self, src: &BTensor<Self, T>, dst: &BTensor<Self, T>) -> Result<()>;

    fn unary(&self, op: UnaryOp, x: &BTensor<Self, T>) -> Result<BTensor<Self, T>>;

    fn binary(
        &self,
        op: BinaryOp,
        a: &BTensor<Self, T>,
        b: &BTensor<Self, T>,
    ) -> Result<BTensor<Self, T>>;

    fn binary_scalar(
        &self,
        op: BinaryOp,
        x: &BTensor<Self, T>,
        s: T,
        side: ScalarSide,
    ) -> Result<BTensor<Self, T>>;

    /// Reduces `axis`; with `keepdim` the axis stays with size 1.
    fn reduce(
        &self,
        op: ReduceOp,
        x: &BTensor<Self, T>,
        axis: usize,
        keepdim: bool,
    ) -> Result<BTensor<Self, T>>;

    /// Softmax over the last axis, shifted by the row maximum so it never overflows.
    fn softmax_last(&self, x: &BTensor<Self, T>) -> Result<BTensor<Self, T>>;

    /// LayerNorm over the last axis with the biased variance (as PyTorch):
    /// `(x - mean) * rstd * weight + bias`, `rstd = 1 / sqrt(var + eps)`.
    fn layer_norm(
        &self,
        x: &BTensor<Self, T>,
        weight: Option<&BTensor<Self, T>>,
        bias: Option<&BTensor<Self, T>>,
        eps: T,
    ) -> Result<LayerNormOut<Self::Storage>>;

    /// Batched matrix product `[..., m, k] x [..., k, n] -> [..., m, n]` (operands read
    /// transposed per `opts`); batch axes broadcast as NumPy does.
    fn matmul(
        &self,
        a: &BTensor<Self, T>,
        b: &BTensor<Self, T>,
        opts: MatmulOpts,
    ) -> Result<BTensor<Self, T>>;

    /// Mean over all elements of `max(x,0) - x*y + log1p(exp(-|x|))`: BCE on logits, stable for
    /// any `x`. Returns a rank-0 tensor.
    fn bce_with_logits_mean(
        &self,
        logits: &BTensor<Self, T>,
        targets: &BTensor<Self, T>,
    ) -> Result<BTensor<Self, T>>;

    /// One fused AdamW update of `p`, `m`, `v` in place from gradient `g`; `slot` is `[lr, t]`
    /// or `[lr, t, gate]` (see `ADAMW_SLOT_LR`, `ADAMW_SLOT_STEP`, `ADAMW_SLOT_GATE`: a
    /// non-zero gate skips the update). `p`, `m`, `v`, `g` and `slot` must not share
    /// storage.
    fn adamw_step(
        &self,
        p: &BTensor<Self, T>,
        m: &BTensor<Self, T>,
        v: &BTensor<Self, T>,
        g: &BTensor<Self, T>,
        slot: &BTensor<Self, T>,
        cfg: &AdamWConfig<T>,
    ) -> Result<()>;

    /// Copies row `index` of `src` (dense `[rows, ...]`) into `dst` (dense, one row's
    /// elements, any shape), the index read from memory when the op runs (on every replay of
    /// a captured graph): so a graph can walk a device-resident batch with no host upload.
    /// `index` holds one element, naming a row only if it is a whole number in `[0, rows)`;
    /// any other value fills `dst` with NaN. No two operands may share storage.
    fn gather_row(
        &self,
        src: &BTensor<Self, T>,
        index: &BTensor<Self, T>,
        dst: &BTensor<Self, T>,
    ) -> Result<()>;

    /// Copies `src` (dense, one row's elements) into row `index` of `dst` (dense
    /// `[rows, ...]`), the index read from memory when the op runs; an index naming no row
    /// (see [`Backend::gather_row`]) writes nothing. With `advance`, the op then adds 1 to the
    /// index in memory, so the next replay of a captured graph works on the next row. No two
    /// operands may share storage.
    fn scatter_row(
        &self,
        src: &BTensor<Self, T>,
        index: &BTensor<Self, T>,
        dst: &BTensor<Self, T>,
        advance: bool,
    ) -> Result<()>;

    // Memory lifetimes and step scopes. Host storage is plain reference-counted memory, so the
    // CPU backend keeps the provided no-op versions; device backends map them onto zmem.

    /// Sets the allocation class of the outputs of later ops on this backend and returns the
    /// previous one. Device backends allocate `Scratch` in the open step (reclaimed at its end
    /// unless still referenced), `Saved` and `Persistent` in zmem's held region.
    fn set_alloc_class(&self, class: AllocClass) -> AllocClass {
        let _ = class;
        AllocClass::Persistent
    }

    /// The allocation class outputs are allocated in now.
    fn alloc_class(&self) -> AllocClass {
        AllocClass::Persistent
    }

    /// The allocation class of the memory behind `x` (`None` for host memory).
    fn storage_class(&self, x: &BTensor<Self, T>) -> Option<AllocClass> {
        let _ = x;
        None
    }

    /// Opens a step scope: scratch outputs of later ops are reclaimed when it ends.
    fn begin_step(&self) -> Result<()> {
        Ok(())
    }

    /// Ends the open step scope (its scratch memory is reused by the next step).
    fn end_step(&self) -> Result<()> {
        Ok(())
    }

    /// Waits (with the device's deadline) until every op issued so far has finished.
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    /// Softmax's backward over the last axis from its output `y` and output gradient `g`:
    /// `y * (g - sum(g * y))`. The provided body checks the arguments as every backend does
    /// (`g` shaped as `y`, rank >= 1), then composes it from the op set; a device backend may
    /// fuse it.
    fn softmax_backward(
        &self,
        g: &BTensor<Self, T>,
        y: &BTensor<Self, T>,
    ) -> Result<BTensor<Self, T>> {
        crate::validate::softmax_backward(g, y)?;
        let last = y.rank().saturating_sub(1);
        let dot = self.sum(&self.mul(g, y)?, last, true)?;
        self.mul(y, &self.sub(g, &dot)?)
    }

    /// LayerNorm's backward over the last axis from the output gradient `g`, the input `x`,
    /// the forward's `mean` and `rstd` (last axis 1) and the weight: with
    /// `xhat = (x - mean) * rstd` and `gxhat = g * weight`, the input gradient
    /// `((gxhat - mean(gxhat)) - xhat * mean(gxhat * xhat)) * rstd` if `want[0]`, and `g * xhat`
    /// if `want[1]`. The provided body checks the arguments as every backend does (`g` shaped as
    /// `x`, a non-empty last axis, `mean`/`rstd` as the forward returns them, the weight `[n]`),
    /// then composes it from the op set; a device backend may fuse it.
    fn layer_norm_backward(
        &self,
        g: &BTensor<Self, T>,
        x: &BTensor<Self, T>,
        mean: &BTensor<Self, T>,
        rstd: &BTensor<Self, T>,
        weight: Option<&BTensor<Self, T>>,
        want: [bool; 2],
    ) -> Result<LayerNormGrads<Self::Storage>> {
        crate::validate::layer_norm_backward(g, x, mean, rstd, weight)?;
        let xhat = self.mul(&self.sub(x, mean)?, rstd)?;
        let input = if want[0] {
            let gxhat = match weight {
                Some(w) => self.mul(g, w)?,
                None => g.clone(),
            };
            let last = x.rank().saturating_sub(1);
            let m1 = self.mean(&gxhat, last, true)?;
            let m2 = self.mean(&self.mul(&gxhat, &xhat)?, last, true)?;
            let inner = self.sub(&self.sub(&gxhat, &m1)?, &self.mul(&xhat, &m2)?)?;
            Some(self.mul(&inner, rstd)?)
        } else {
            None
        };
        let g_xhat = if want[1] {
            Some(self.mul(g, &xhat)?)
        } else {
            None
        };
        Ok(LayerNormGrads { input, g_xhat })
    }

    /// The Euclidean norm of every element of `x`, `sqrt(sum of x²)`, as a rank-0 tensor (0 for
    /// an empty `x`). Stays on the device: a captured step computes a global gradient norm
    /// with it over a flat gradient buffer. The provided body composes it from the op set; a
    /// device backend may fuse it (the CUDA backend: two launches, a fixed grid of per-block
    /// partial sums then one block summing them in a fixed order, so no atomics and the same
    /// bits every run).
    fn norm2(&self, x: &BTensor<Self, T>) -> Result<BTensor<Self, T>> {
        let squares = self.mul(x, x)?;
        let flat = squares.reshape(&[squares.numel()])?;
        self.unary(UnaryOp::Sqrt, &self.sum(&flat, 0, false)?)
    }

    /// Scales `x` in place by `min(1, max_norm / (norm + 1e-6))`, PyTorch's `clip_grad_norm_`
    /// coefficient, with the one-element `norm` read from memory (no host round trip:
    /// capturable). A NaN norm makes every element NaN. The provided body composes it from the
    /// op set; a device backend may fuse it (one launch).
    fn clip_scale(&self, x: &BTensor<Self, T>, norm: &BTensor<Self, T>, max_norm: T) -> Result<()> {
        crate::validate::clip_scale(x, norm, max_norm)?;
        let rhs = ScalarSide::Rhs;
        let norm = norm.reshape(&[])?;
        let den = self.binary_scalar(BinaryOp::Add, &norm, T::from_f64(1e-6), rhs)?;
        let coef = self.binary_scalar(BinaryOp::Div, &den, max_norm, ScalarSide::Lhs)?;
        // min(coef, 1) = -max(-coef, -1), NaN-propagating.
        let neg = self.unary(UnaryOp::Neg, &coef)?;
        let clamped = self.binary_scalar(BinaryOp::Maximum, &neg, -T::ONE, rhs)?;
        let coef = self.unary(UnaryOp::Neg, &clamped)?;
        let scaled = self.mul(x, &coef)?;
        self.copy_into(&scaled, x)
    }

    /// Writes `0 * a + 0 * b` into the one-element `dst` (all three one-element tensors): 0
    /// when `a` and `b` are finite, NaN otherwise. AdamW's gate (`ADAMW_SLOT_GATE`) from a
    /// step's loss and gradient norm, on the device. The provided body composes it from the op
    /// set; a device backend may fuse it (one launch).
    fn finite_gate(
        &self,
        a: &BTensor<Self, T>,
        b: &BTensor<Self, T>,
        dst: &BTensor<Self, T>,
    ) -> Result<()> {
        crate::validate::finite_gate(a, b, dst)?;
        let zero = |t: &BTensor<Self, T>| {
            self.binary_scalar(BinaryOp::Mul, &t.reshape(&[])?, T::ZERO, ScalarSide::Rhs)
        };
        let gate = self.add(&zero(a)?, &zero(b)?)?;
        self.copy_into(&gate.reshape(dst.shape())?, dst)
    }

    /// `dst += src` in place (same shapes, other memory): how backward adds a parameter's
    /// gradient into its buffer. The provided body adds into a fresh tensor and copies it back;
    /// a device backend may do it in one launch.
    fn add_into(&self, src: &BTensor<Self, T>, dst: &BTensor<Self, T>) -> Result<()> {
        crate::validate::add_into(src, dst)?;
        let sum = self.add(dst, src)?;
        self.copy_into(&sum, dst)
    }

    /// `dst += op(a) · op(b)` in place (`dst` shaped as the product, other memory): how
    /// backward adds a weight's gradient into its buffer without a separate sum. The provided
    /// body is the product then [`Backend::add_into`]; a device backend may write the product
    /// straight into `dst` (cuBLAS with `beta = 1`).
    fn matmul_into(
        &self,
        a: &BTensor<Self, T>,
        b: &BTensor<Self, T>,
        opts: MatmulOpts,
        dst: &BTensor<Self, T>,
    ) -> Result<()> {
        crate::validate::matmul_into(a, b, opts, dst)?;
        let product = self.matmul(a, b, opts)?;
        self.add_into(&product, dst)
    }

    /// `dst += x` summed over every axis but the last (`x [..., n]`, `dst [n]`, other memory):
    /// how backward adds a bias or LayerNorm parameter's gradient into its buffer. The provided
    /// body is the sum then [`Backend::add_into`]; a device backend may add the column
    /// reduction's result straight into `dst` (deterministic: no atomics).
    fn sum_rows_into(&self, x: &BTensor<Self, T>, dst: &BTensor<Self, T>) -> Result<()> {
        let crate::validate::Rows { rows, n } = crate::validate::sum_rows_into(x, dst)?;
        let dense = if x.is_contiguous() {
            x.clone()
        } else {
            self.contiguous(x)?
        };
        let sum = self.sum(&dense.reshape(&[rows, n])?, 0, false)?;
        self.add_into(&sum, dst)
    }

    // Provided shorthands over the op families.

    fn zeros(&self, shape: &[usize]) -> Result<BTensor<Self, T>> {
        self.full(shape, T::ZERO)
    }

    fn add(&self, a: &BTensor<Self, T>, b: &BTensor<Self, T>) -> Result<BTensor<Self, T>> {
        self.binary(BinaryOp::Add, a, b)
    }

    fn sub(&self, a: &BTensor<Self, T>, b: &BTensor<Self, T>) -> Result<BTensor<Self, T>> {
        self.binary(BinaryOp::Sub, a, b)
    }

    fn mul(&self, a: &BTensor<Self, T>, b: &BTensor<Self, T>) -> Result<BTensor<Self, T>> {
        self.binary(BinaryOp::Mul, a, b)
    }

    fn div(&self, a: &BTensor<Self, T>, b: &BTensor<Self, T>) -> Result<BTensor<Self, T>> {
        self.binary(BinaryOp::Div, a, b)
    }

    fn maximum(&self, a: &BTensor<Self, T>, b: &BTensor<Self, T>) -> Result<BTensor<Self, T>> {
        self.binary(BinaryOp::Maximum, a, b)
    }

    fn sum(&self, x: &BTensor<Self, T>, axis: usize, keepdim: bool) -> Result<BTensor<Self, T>> {
        self.reduce(ReduceOp::Sum, x, axis, keepdim)
    }

    fn mean(&self, x: &BTensor<Self, T>, axis: usize, keepdim: bool) -> Result<BTensor<Self, T>> {
        self.reduce(ReduceOp::Mean, x, axis, keepdim)
    }

    fn max(&self, x: &BTensor<Self, T>, axis: usize, keepdim: bool) -> Result<BTensor<Self, T>> {
        self.reduce(ReduceOp::Max, x, axis, keepdim)
    }
}
