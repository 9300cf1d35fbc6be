//! Products with few rows (one short sequence's, e.g. m = 12) as one kernel each from
//! `kernels/linear.cu`: a Linear layer's forward with its bias epilogue inside, plain
//! `matmul`/`matmul_into` products, and a Linear layer's weight and bias gradients. cuBLAS
//! runs these on a handful of big tiles (5-10 us each, sometimes with a split-K reduce
//! node); the weights are what is read, so these kernels spread them over many CTAs and the
//! floor is one pass over the weights. Anything else (more rows than [`LINEAR_ROW_LIMIT`], an
//! operand order the kernels do not read, empty sizes, grids past 65 535 blocks) takes the
//! cuBLAS path unchanged. Every choice is traced at `zcompute.cuda.linear`.
//!
//! Under bf16 (issue 42) the same products run the kernels' bf16 forms: each operand element
//! rounded to bf16 as it is read, or read from a bf16 copy (`PrecisionOps::matmul_bf16` and
//! friends), float32 sums in the float32 forms' order, and the Linear forward's epilogue inside
//! (`PrecisionOps::linear_mode`): one launch where the composite ran a conversion per operand,
//! cuBLAS and the epilogue (`kernels/linear_bf16.cu`). A weight's gradient from one sample's
//! rows added into its buffer (`dw += gzᵀ · x`, more outputs than the row limit) runs the
//! parameter-gradient kernel's bf16 form. TF32 keeps cuBLAS.

use super::kernels::{Args, Kernel, ptr, u64a};
use super::matmul::Operand;
use super::{CudaBackend, CudaTensor};
use crate::backend::{Backend, MatmulOpts};
use crate::error::Result;
use crate::linear::{Activation, LinearOps};
use crate::precision::MathMode;
use crate::validate::{self, LinearShape};
use zdevice::{DevicePtr, Driver, KernelArg, LaunchConfig};

/// Most rows a product takes through the small-row kernels (`ZC_LINEAR_ROWS` in linear.cu:
/// each thread keeps this many partial sums in registers).
pub const LINEAR_ROW_LIMIT: usize = 32;
/// k-contiguous `op(B)`: output columns per block (`KMAJOR_COLS`), and warps per column
/// (`KMAJOR_SPLIT`: a column's k is spread over that many warps, so an SM has warps enough
/// to hide latency).
pub(crate) const KMAJOR_COLS: u32 = 8;
pub(crate) const KMAJOR_SPLIT: u32 = 2;
/// n-contiguous `op(B)`: columns per block and k slices (`NMAJOR_COLS`, `NMAJOR_SLICES`).
pub(crate) const NMAJOR_COLS: u32 = 8;
pub(crate) const NMAJOR_SLICES: u32 = 64;
/// The parameter-gradient kernels' blocks: x along the inputs, y along the outputs.
pub(crate) const GRADS_BLOCK: (u32, u32) = (64, 4);
/// Most blocks along a grid axis these launches use.
pub(super) const MAX_GRID: u64 = 65_535;

/// Whether the parameter-gradient kernel takes its float4 path: the kernel makes the same
/// test.
pub(crate) fn linear_grads_vec4(
    ins: usize,
    ldw: u64,
    x_rs: u64,
    x_cs: u64,
    ptrs: [DevicePtr; 2],
) -> bool {
    ins.is_multiple_of(4)
        && ldw.is_multiple_of(4)
        && x_cs == 1
        && x_rs.is_multiple_of(4)
        && ptrs.iter().all(|p| p.0.is_multiple_of(16))
}

/// Whether the bf16 parameter-gradient kernel takes its float4 path (four `i` a thread, x
/// read four elements a load): `linear_grads_vec4`'s test with x's alignment that of its form
/// (8 bytes for a bf16 copy, 16 for float32). The kernel makes the same test.
pub(crate) fn linear_grads_bf16_vec4(
    ins: usize,
    ldw: u64,
    (x_rs, x_cs): (u64, u64),
    (dw, x): (DevicePtr, DevicePtr),
    x_copy: bool,
) -> bool {
    ins.is_multiple_of(4)
        && ldw.is_multiple_of(4)
        && x_cs == 1
        && x_rs.is_multiple_of(4)
        && dw.0.is_multiple_of(16)
        && x.0.is_multiple_of(if x_copy { 8 } else { 16 })
}

/// The operand forms the bf16 row kernels are built for (`packed`: bit 0, a is a bf16 copy;
/// bit 1, b is): float32 both, b's copy only, both copies (`ZC_BF16_FORMS` in
/// kernels/linear_bf16.cu). Another combination takes cuBLAS.
pub(crate) const ROWS_BF16_FORMS: [u32; 3] = [0, 2, 3];
/// The forms the bf16 parameter-gradient kernel is built for: float32 both, both copies.
pub(crate) const GRADS_BF16_FORMS: [u32; 2] = [0, 3];

/// An operand as a kernel reads it: its first element and two strides (which two, each use
/// says).
pub(super) type StridedRead = (DevicePtr, (usize, usize));

/// Why a Linear layer's bf16 weight gradient `dw += round(g)ᵀ · x'` of `shape` is not the
/// bf16 parameter-gradient kernel's (with the bias's row-order sum beside it), or `None` where
/// it is: few rows, more outputs than the row kernels take (they take dw's product below that,
/// as `matmul_into_bf16` chooses), a dense dw. One test for every path that sums dw and db
/// (the copies' `linear_param_grads_into_bf16`, the per-call `linear_backward_into_mode`, the
/// fused `zc_linear_backward_bf16`), so they keep one set of bits.
pub(super) fn bf16_grads_refused(shape: LinearShape, dw: &CudaTensor) -> Option<&'static str> {
    if !(1..=LINEAR_ROW_LIMIT).contains(&shape.rows) || shape.inputs == 0 {
        Some("sizes outside the small-row kernel")
    } else if shape.outputs <= LINEAR_ROW_LIMIT {
        Some("the row kernels take dw")
    } else if !dw.is_contiguous() {
        Some("dw is not dense")
    } else {
        None
    }
}

/// The bias gradient the bf16 weight-gradient kernel sums alongside
/// ([`CudaBackend::grads_bf16`]): `db[o * db_stride] += Σ_r gf[r * gf_strides.0 + o *
/// gf_strides.1]`.
#[derive(Clone, Copy, Debug)]
pub(super) struct BiasGrad<'a> {
    pub(super) db: &'a CudaTensor,
    pub(super) db_stride: usize,
    pub(super) gf: DevicePtr,
    pub(super) gf_strides: (usize, usize),
}

/// How the small-row kernel reads one product `op(A)[m,k] · op(B)[k,n]`.
#[derive(Clone, Copy, Debug)]
pub(super) struct RowsPlan {
    pub(super) kernel: Kernel,
    pub(super) config: LaunchConfig,
    /// `op(A)`'s row and column strides.
    a: (u64, u64),
    /// `op(B)`'s leading dimension: the stride of its non-contiguous axis.
    pub(super) ldb: u64,
}

/// The plan for `m x k x n` with `op(A)` strides `a` and `op(B)` strides `(sk, sj)`, or
/// `None` where the cuBLAS path stays: `m` outside `1..=LINEAR_ROW_LIMIT`, an empty `k` or
/// `n`, an `op(B)` contiguous along neither axis, or too many blocks.
pub(super) fn rows_plan(
    m: usize,
    k: usize,
    n: usize,
    a: (usize, usize),
    b: (usize, usize),
) -> Option<RowsPlan> {
    if m == 0 || m > LINEAR_ROW_LIMIT || k == 0 || n == 0 {
        return None;
    }
    let (sk, sj) = b;
    let (kernel, ldb, per_block, threads) = if sk == 1 && k > 1 {
        (
            Kernel::LinearRowsKMajor,
            sj,
            KMAJOR_COLS,
            KMAJOR_COLS * KMAJOR_SPLIT * 32,
        )
    } else if sj == 1 || n == 1 {
        (
            Kernel::LinearRowsNMajor,
            sk,
            NMAJOR_COLS,
            NMAJOR_COLS * NMAJOR_SLICES,
        )
    } else if k == 1 {
        (
            Kernel::LinearRowsKMajor,
            sj,
            KMAJOR_COLS,
            KMAJOR_COLS * KMAJOR_SPLIT * 32,
        )
    } else {
        return None;
    };
    let blocks = (n as u64).div_ceil(u64::from(per_block));
    (blocks <= MAX_GRID).then_some(RowsPlan {
        kernel,
        config: LaunchConfig {
            grid: (blocks as u32, 1, 1),
            block: (threads, 1, 1),
            shared_mem_bytes: 0,
        },
        a: (a.0 as u64, a.1 as u64),
        ldb: ldb as u64,
    })
}

impl RowsPlan {
    /// The same plan on the kernel's bf16 form (same launch shape and strides).
    pub(super) fn bf16(self) -> RowsPlan {
        let kernel = match self.kernel {
            Kernel::LinearRowsKMajor => Kernel::LinearRowsKMajorBf16,
            Kernel::LinearRowsNMajor => Kernel::LinearRowsNMajorBf16,
            other => other,
        };
        RowsPlan { kernel, ..self }
    }

    /// Whether the plan runs a bf16 form.
    fn is_bf16(&self) -> bool {
        matches!(
            self.kernel,
            Kernel::LinearRowsKMajorBf16 | Kernel::LinearRowsNMajorBf16
        )
    }
}

/// Strides of a matrix view's last two axes, swapped when it is read transposed.
pub(super) fn op_strides(t: &CudaTensor, trans: bool) -> (usize, usize) {
    let s = t.layout().strides();
    let (r, c) = (s[s.len() - 2], s[s.len() - 1]);
    if trans { (c, r) } else { (r, c) }
}

fn act_code(act: Activation) -> u32 {
    match act {
        Activation::Identity => 0,
        Activation::Tanh => 1,
    }
}

/// One small-row launch by name ([`CudaBackend::launch_rows`]): `plan` for
/// `out = act(op(a) · op(b) + bias) + residual + beta * out` at sizes `(m, k, n)`, `out` and
/// `residual` dense `[m, n]`, `a` and `b` the operands' first elements (read through the plan's
/// strides); `packed`, for a bf16 form only, says which are bf16 copies (bit 0: a, bit 1: b);
/// `op` is the op the launch is logged and refused under.
#[derive(Clone, Copy, Debug)]
struct RowsLaunch<'a> {
    op: &'static str,
    plan: &'a RowsPlan,
    dims: (usize, usize, usize),
    a: DevicePtr,
    b: DevicePtr,
    packed: u32,
    bias: Option<&'a CudaTensor>,
    act: Activation,
    residual: Option<&'a CudaTensor>,
    out: &'a CudaTensor,
    beta: f32,
}

impl<D: Driver> CudaBackend<D> {
    /// Launches the small-row kernel `l.plan` names (see [`RowsLaunch`]).
    fn launch_rows(&self, l: RowsLaunch<'_>) -> Result<()> {
        let RowsLaunch {
            op,
            plan,
            dims: (m, k, n),
            a,
            b,
            bias,
            act,
            residual,
            out,
            beta,
            packed,
        } = l;
        tracing::trace!(
            target: "zcompute.cuda.linear",
            op, m, k, n, beta, kernel = plan.kernel.spec().name, blocks = plan.config.grid.0,
            packed, "small-row kernel"
        );
        let bias_ptr = bias.map_or(Ok(DevicePtr::NULL), |t| self.ptr(op, t))?;
        let residual_ptr = residual.map_or(Ok(DevicePtr::NULL), |t| self.ptr(op, t))?;
        let mut args: Args = [
            ptr(self.ptr(op, out)?),
            ptr(a),
            ptr(b),
            ptr(bias_ptr),
            KernelArg::U32(m as u32),
            u64a(k),
            u64a(n),
            KernelArg::U64(plan.a.0),
            KernelArg::U64(plan.a.1),
            KernelArg::U64(plan.ldb),
            KernelArg::F32(beta),
            KernelArg::U32(u32::from(bias.is_some())),
            KernelArg::U32(act_code(act)),
            ptr(residual_ptr),
        ]
        .into_iter()
        .collect();
        if plan.is_bf16() {
            args.push(KernelArg::U32(packed));
        }
        self.launch(op, plan.kernel, plan.config, &args)
    }

    /// `out = op(a) · op(b) + beta * out` through the small-row kernel when one batch of
    /// `m <= LINEAR_ROW_LIMIT` rows in an order it reads; `false` (nothing queued) otherwise.
    /// Called by `gemm_to` before cuBLAS, under float32 or (the kernel's bf16 form) bf16;
    /// `given`, under bf16: an operand's bf16 copy, read in place of the tensor (a shape
    /// stand-in then), so a product on copies runs the kernel a product on the float32
    /// operands runs, on the same values in the same order.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn small_rows_gemm(
        &self,
        (a, b): (&CudaTensor, &CudaTensor),
        (trans_a, trans_b): (bool, bool),
        (m, k, n): (usize, usize, usize),
        count: usize,
        out: &CudaTensor,
        beta: f32,
        mode: MathMode,
        given: (Option<&Operand>, Option<&Operand>),
    ) -> Result<bool> {
        const OP: &str = "matmul";
        // A copy is one dense row-major matrix (`copy_operand`).
        let strides = |t: &CudaTensor, copy: Option<&Operand>, trans: bool| match copy {
            Some(c) => {
                let s = if c.col_major { (1, c.ld) } else { (c.ld, 1) };
                if trans { (s.1, s.0) } else { s }
            }
            None => op_strides(t, trans),
        };
        let bf16 = match mode {
            MathMode::F32 => false,
            MathMode::Bf16 => true,
            MathMode::Tf32 => return Ok(false),
        };
        let plan = (count == 1)
            .then(|| {
                rows_plan(
                    m,
                    k,
                    n,
                    strides(a, given.0, trans_a),
                    strides(b, given.1, trans_b),
                )
            })
            .flatten()
            .map(|p| if bf16 { p.bf16() } else { p });
        let operand = |t: &CudaTensor, copy: Option<&Operand>| match copy {
            Some(c) => Ok(c.ptr),
            None => self.ptr(OP, t),
        };
        let packed = u32::from(given.0.is_some()) | (u32::from(given.1.is_some()) << 1);
        // A form the kernels are not built for (never asked for today) takes cuBLAS.
        let plan = plan.filter(|_| !bf16 || ROWS_BF16_FORMS.contains(&packed));
        let Some(plan) = plan else {
            if bf16 && count == 1 && beta == 1.0 {
                let g = (operand(a, given.0)?, strides(a, given.0, trans_a));
                let x = (operand(b, given.1)?, strides(b, given.1, trans_b));
                return self.grads_bf16((m, k, n), g, x, (out, None), packed);
            }
            tracing::trace!(target: "zcompute.cuda.linear", op = OP, count, m, k, n, "cublas");
            return Ok(false);
        };
        self.launch_rows(RowsLaunch {
            op: OP,
            plan: &plan,
            dims: (m, k, n),
            a: operand(a, given.0)?,
            b: operand(b, given.1)?,
            packed,
            bias: None,
            act: Activation::Identity,
            residual: None,
            out,
            beta,
        })?;
        Ok(true)
    }

    /// Under bf16, `out += op(g) · op(x)` of few rows `k` (at most `LINEAR_ROW_LIMIT`: a
    /// weight's gradient `dw += gzᵀ · x` from one sample's rows, `m` the layer's outputs, past
    /// the row kernels' limit) through `zc_linear_param_grads_bf16`, where float32's Linear
    /// backward runs the float32 parameter-gradient kernel: one launch where cuBLAS needed a
    /// conversion per operand. `g` and `x`: first element and `op()`'s strides; `packed` says
    /// which are bf16 copies. A float4 of dw a thread where `linear_grads_bf16_vec4` holds
    /// (the grid sized to it), else one element. `false` (nothing queued) for other sizes and
    /// for forms the kernel is not built for (`GRADS_BF16_FORMS`).
    ///
    /// `db`: the bias gradient `db[o] += Σ_r gf[r, o]` in the same launch, from the float32
    /// gradient `gf` (first element, `[rows, outputs]` strides) the copy `g` was made from.
    pub(super) fn grads_bf16(
        &self,
        (m, k, n): (usize, usize, usize),
        (g, (g_cs, g_rs)): StridedRead,
        (x, (x_rs, x_cs)): StridedRead,
        (out, db): (&CudaTensor, Option<BiasGrad<'_>>),
        packed: u32,
    ) -> Result<bool> {
        const OP: &str = "matmul";
        let out_ptr = self.ptr(OP, out)?;
        let vec4 = linear_grads_bf16_vec4(
            n,
            n as u64,
            (x_rs as u64, x_cs as u64),
            (out_ptr, x),
            packed & 2 != 0,
        );
        let cols = if vec4 { n / 4 } else { n } as u64;
        let grid = (
            cols.div_ceil(u64::from(GRADS_BLOCK.0)),
            (m as u64).div_ceil(u64::from(GRADS_BLOCK.1)),
        );
        if !GRADS_BF16_FORMS.contains(&packed)
            || !(1..=LINEAR_ROW_LIMIT).contains(&k)
            || m == 0
            || n == 0
            || grid.0 > MAX_GRID
            || grid.1 > MAX_GRID
        {
            tracing::trace!(target: "zcompute.cuda.linear", op = OP, m, k, n, "cublas");
            return Ok(false);
        }
        tracing::trace!(
            target: "zcompute.cuda.linear",
            op = OP, m, k, n, packed, vec4, blocks = grid.0 * grid.1, "bf16 parameter-gradient kernel"
        );
        let args: Args = [
            ptr(out_ptr),
            ptr(g),
            ptr(x),
            KernelArg::U32(k as u32),
            u64a(m),
            u64a(n),
            u64a(g_rs),
            u64a(g_cs),
            u64a(x_rs),
            u64a(x_cs),
            // `out` is dense [m, n].
            u64a(n),
            KernelArg::U32(packed),
            ptr(db.map_or(Ok(DevicePtr::NULL), |d| self.ptr(OP, d.db))?),
            ptr(db.map_or(DevicePtr::NULL, |d| d.gf)),
            u64a(db.map_or(0, |d| d.gf_strides.0)),
            u64a(db.map_or(0, |d| d.gf_strides.1)),
            u64a(db.map_or(0, |d| d.db_stride)),
            KernelArg::U32(u32::from(db.is_some())),
        ]
        .into_iter()
        .collect();
        let config = LaunchConfig {
            grid: (grid.0 as u32, grid.1 as u32, 1),
            block: (GRADS_BLOCK.0, GRADS_BLOCK.1, 1),
            shared_mem_bytes: 0,
        };
        self.launch(OP, Kernel::LinearParamGradsBf16, config, &args)?;
        Ok(true)
    }

    /// `LinearOps::linear` (no `residual`) and `LinearOps::linear_add`: one small-row kernel
    /// with the bias, activation and residual epilogue for few rows (a residual that is not
    /// dense takes the composite), else the provided composite (cuBLAS, then the bias epilogue,
    /// then the add). Under bf16 (`PrecisionOps::linear_mode`, no residual) the kernel's bf16
    /// form, else the composite under the mode: the product, then the bias epilogue.
    pub(crate) fn linear_fused(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        bias: &CudaTensor,
        act: Activation,
        residual: Option<&CudaTensor>,
        mode: MathMode,
    ) -> Result<CudaTensor> {
        let op = if residual.is_some() {
            "linear_add"
        } else {
            "linear"
        };
        let LinearShape {
            rows,
            inputs,
            outputs,
        } = match residual {
            Some(r) => validate::linear_add(x, w, bias, r)?,
            None => validate::linear(x, w, bias)?,
        };
        let plan = rows_plan(
            rows,
            inputs,
            outputs,
            op_strides(x, false),
            op_strides(w, true),
        );
        let tb = MatmulOpts {
            trans_a: false,
            trans_b: true,
        };
        let plan = match mode {
            MathMode::F32 => plan,
            MathMode::Bf16 => plan.map(RowsPlan::bf16),
            MathMode::Tf32 => None,
        };
        let Some(plan) = plan else {
            tracing::trace!(target: "zcompute.cuda.linear", op, rows, inputs, outputs, mode = mode.name(), "cublas + bias_act");
            return match (mode, residual) {
                // The product, then the epilogue with the residual added in the same launch
                // (where the bias epilogue and an add were two).
                (MathMode::F32, Some(r)) => {
                    self.bias_act_add_fused(&self.matmul(x, w, tb)?, bias, act, r)
                }
                (MathMode::F32, None) => crate::linear::linear(self, x, w, bias, act),
                // `PrecisionOps::linear_mode`'s provided steps: the product under the mode,
                // then the bias epilogue in float32 (then the add).
                (mode, residual) => {
                    let z = self.bias_act(&self.matmul_gemm_mode(x, w, tb, mode)?, bias, act)?;
                    match residual {
                        Some(r) => self.add(&z, r),
                        None => Ok(z),
                    }
                }
            };
        };
        if let Some(r) = residual.filter(|r| !r.is_contiguous()) {
            // The small-row kernel adds a dense residual only: its product, then the add.
            return match mode {
                MathMode::F32 => crate::linear::linear_add(self, x, w, bias, act, r),
                mode => self.add(&self.linear_fused(x, w, bias, act, None, mode)?, r),
            };
        }
        let out = self.alloc(op, &[rows, outputs])?;
        let bias = self.dense(op, bias)?;
        self.launch_rows(RowsLaunch {
            op,
            plan: &plan,
            dims: (rows, inputs, outputs),
            a: self.ptr(op, x)?,
            b: self.ptr(op, w)?,
            packed: 0,
            bias: Some(&bias),
            act,
            residual,
            out: &out,
            beta: 0.0,
        })?;
        Ok(out)
    }

    /// Under bf16, a Linear forward `act(x · wᵀ + bias)` (+ `residual`) with the operands
    /// given as bf16 copies (`given`: x's, w's; `x` and `w` shape stand-ins where given): one
    /// launch of the row kernel's bf16 form with the epilogue inside, the bits of the product
    /// on the copies then `bias_act` (then `add`) (`PrecisionOps::linear_bf16`,
    /// `linear_bf16_rhs`). `None` (nothing queued) where the row kernel does not take the
    /// product or the residual is not dense.
    pub(super) fn linear_rows_bf16(
        &self,
        (x, w): (&CudaTensor, &CudaTensor),
        bias: &CudaTensor,
        act: Activation,
        residual: Option<&CudaTensor>,
        given: (Option<&Operand>, Option<&Operand>),
    ) -> Result<Option<CudaTensor>> {
        const OP: &str = "linear";
        let LinearShape {
            rows,
            inputs,
            outputs,
        } = match residual {
            Some(r) => validate::linear_add(x, w, bias, r)?,
            None => validate::linear(x, w, bias)?,
        };
        // A copy is one dense row-major matrix (`copy_operand`); w is read transposed.
        let x_strides = given.0.map_or_else(|| op_strides(x, false), |c| (c.ld, 1));
        let w_strides = given.1.map_or_else(|| op_strides(w, true), |c| (1, c.ld));
        let packed = u32::from(given.0.is_some()) | (u32::from(given.1.is_some()) << 1);
        let plan = rows_plan(rows, inputs, outputs, x_strides, w_strides)
            .map(RowsPlan::bf16)
            .filter(|_| ROWS_BF16_FORMS.contains(&packed))
            .filter(|_| residual.is_none_or(CudaTensor::is_contiguous));
        let Some(plan) = plan else {
            tracing::trace!(target: "zcompute.cuda.linear", op = OP, rows, inputs, outputs, packed, "bf16 product + bias_act");
            return Ok(None);
        };
        let operand = |t: &CudaTensor, copy: Option<&Operand>| match copy {
            Some(c) => Ok(c.ptr),
            None => self.ptr(OP, t),
        };
        let out = self.alloc(OP, &[rows, outputs])?;
        let bias = self.dense(OP, bias)?;
        self.launch_rows(RowsLaunch {
            op: OP,
            plan: &plan,
            dims: (rows, inputs, outputs),
            a: operand(x, given.0)?,
            b: operand(w, given.1)?,
            packed,
            bias: Some(&bias),
            act,
            residual,
            out: &out,
            beta: 0.0,
        })?;
        Ok(Some(out))
    }

    /// `LinearOps::linear_param_grads_into`: one kernel for few rows when `dw`'s last axis is
    /// dense (a per-tensor view of a flat gradient buffer is), else the provided composite
    /// (`matmul_into`, then `sum_rows_into`).
    pub(crate) fn linear_param_grads_fused(
        &self,
        g: &CudaTensor,
        x: &CudaTensor,
        dw: &CudaTensor,
        db: Option<&CudaTensor>,
    ) -> Result<()> {
        const OP: &str = "linear_param_grads_into";
        let LinearShape {
            rows,
            inputs,
            outputs,
        } = validate::linear_param_grads_into(g, x, dw, db)?;
        let (ldw, dw_cs) = op_strides(dw, false);
        let (x_rs, x_cs) = op_strides(x, false);
        let (dw_ptr, x_ptr) = (self.ptr(OP, dw)?, self.ptr(OP, x)?);
        let vec4 = linear_grads_vec4(
            inputs,
            ldw as u64,
            x_rs as u64,
            x_cs as u64,
            [dw_ptr, x_ptr],
        );
        let cols = if vec4 { inputs / 4 } else { inputs } as u64;
        let grid = (
            cols.div_ceil(u64::from(GRADS_BLOCK.0)),
            (outputs as u64).div_ceil(u64::from(GRADS_BLOCK.1)),
        );
        let fits = (1..=LINEAR_ROW_LIMIT).contains(&rows)
            && inputs > 0
            && outputs > 0
            && (dw_cs == 1 || inputs == 1)
            && grid.0 <= MAX_GRID
            && grid.1 <= MAX_GRID;
        if !fits {
            tracing::trace!(target: "zcompute.cuda.linear", op = OP, rows, inputs, outputs, dw_cs, "cublas + sum_rows_into");
            return crate::linear::linear_param_grads_into(self, g, x, dw, db);
        }
        tracing::trace!(
            target: "zcompute.cuda.linear",
            op = OP, rows, inputs, outputs, vec4, blocks = grid.0 * grid.1, "small-row kernel"
        );
        let (g_rs, g_cs) = op_strides(g, false);
        let db_ptr = db.map_or(Ok(DevicePtr::NULL), |t| self.ptr(OP, t))?;
        let db_stride = db.map_or(0, |t| t.layout().strides()[0]);
        let args: Args = [
            ptr(dw_ptr),
            ptr(db_ptr),
            ptr(self.ptr(OP, g)?),
            ptr(x_ptr),
            KernelArg::U32(rows as u32),
            u64a(outputs),
            u64a(inputs),
            u64a(g_rs),
            u64a(g_cs),
            u64a(x_rs),
            u64a(x_cs),
            u64a(ldw),
            u64a(db_stride),
            KernelArg::U32(u32::from(db.is_some())),
        ]
        .into_iter()
        .collect();
        let config = LaunchConfig {
            grid: (grid.0 as u32, grid.1 as u32, 1),
            block: (GRADS_BLOCK.0, GRADS_BLOCK.1, 1),
            shared_mem_bytes: 0,
        };
        self.launch(OP, Kernel::LinearParamGrads, config, &args)
    }
}

/// The Linear family on the device: few rows take `linear.cu` / `linear_backward.cu`, the
/// epilogues `fused.cu`; other shapes the composites (cuBLAS and the epilogue kernel).
impl<D: Driver> LinearOps<f32> for CudaBackend<D> {
    fn bias_act(&self, x: &CudaTensor, bias: &CudaTensor, act: Activation) -> Result<CudaTensor> {
        self.bias_act_fused(x, bias, act)
    }

    fn linear(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        bias: &CudaTensor,
        act: Activation,
    ) -> Result<CudaTensor> {
        self.linear_fused(x, w, bias, act, None, MathMode::F32)
    }

    fn linear_add(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        bias: &CudaTensor,
        act: Activation,
        residual: &CudaTensor,
    ) -> Result<CudaTensor> {
        self.linear_fused(x, w, bias, act, Some(residual), MathMode::F32)
    }

    fn linear_param_grads_into(
        &self,
        g: &CudaTensor,
        x: &CudaTensor,
        dw: &CudaTensor,
        db: Option<&CudaTensor>,
    ) -> Result<()> {
        self.linear_param_grads_fused(g, x, dw, db)
    }

    fn linear_backward_into(
        &self,
        gy: &CudaTensor,
        x: &CudaTensor,
        w: Option<&CudaTensor>,
        act_y: (Activation, Option<&CudaTensor>),
        grads: (&CudaTensor, Option<&CudaTensor>),
    ) -> Result<Option<CudaTensor>> {
        self.linear_backward_fused(gy, x, w, act_y, grads)
    }

    fn tanh_backward(&self, g: &CudaTensor, y: &CudaTensor) -> Result<CudaTensor> {
        self.tanh_backward_fused(g, y)
    }
}

#[cfg(test)]
mod tests {
    use super::{LINEAR_ROW_LIMIT, rows_plan};
    use crate::cuda::kernels::Kernel;

    #[test]
    fn plans_follow_the_order_of_b_and_the_row_limit() {
        // A Linear weight [256, 1024] read transposed: k-contiguous, 8 columns a block.
        let p = rows_plan(12, 1024, 256, (1024, 1), (1, 1024)).unwrap();
        assert_eq!(
            (p.kernel, p.config.grid.0, p.ldb),
            (Kernel::LinearRowsKMajor, 32, 1024)
        );
        // The same weight as stored ([k, n] = [1024, 256]): n-contiguous, 8 columns a block.
        let p = rows_plan(12, 1024, 256, (1024, 1), (256, 1)).unwrap();
        assert_eq!(
            (p.kernel, p.config.grid.0, p.ldb),
            (Kernel::LinearRowsNMajor, 32, 256)
        );
        assert!(rows_plan(LINEAR_ROW_LIMIT, 8, 8, (8, 1), (8, 1)).is_some());
        assert!(rows_plan(LINEAR_ROW_LIMIT + 1, 8, 8, (8, 1), (8, 1)).is_none());
        assert!(rows_plan(0, 8, 8, (8, 1), (8, 1)).is_none());
        assert!(rows_plan(4, 0, 8, (8, 1), (8, 1)).is_none());
        // Contiguous along neither axis.
        assert!(rows_plan(4, 8, 8, (8, 1), (16, 2)).is_none());
    }
}
