//! The simulated twins of `kernels/*.cu`: one Rust closure per kernel-id entry, registered on a
//! `SimDriver` under the PTX entry name, so `CudaBackend<SimDriver>` runs the whole op suite in
//! CI. Nothing in the production path calls this: `Engine::sim` (and a test building its own
//! simulator, e.g. one wrapped in a `FaultyDriver`) registers them explicitly before the
//! backend resolves its kernels. Each twin implements its kernel's contract (arguments in, memory out) with the CPU
//! backend's formulas; the host code around it (layouts, strides, launches, gemm descriptors,
//! allocation, capture) is the same code that drives the GPU.
//!
//! This file holds the twin table (the registry that names every twin); the twins live by
//! kernel family in `twins/elementwise.rs`, `twins/reductions.rs`, `twins/rows.rs`,
//! `twins/train.rs`, `twins/flat.rs` and their siblings (one per group of `kernels/*.cu`
//! entries), and the argument helpers they share in `twins/common.rs`, below them all.

mod attention;
mod common;
mod convert;
mod elementwise;
mod flat;
mod fused;
mod indexed;
mod key_padding;
mod linear;
mod norm_params;
mod reductions;
mod rows;
mod select;
mod train;

use super::kernels::Kernel;
use zdevice::sim::{KernelFault, SimMemory};
use zdevice::{KernelArg, LaunchConfig, SimDriver};

/// Launches `function`, a simulated kernel that a caller outside this crate registered on the
/// simulator and resolved from a module it loaded (zcomm's simulated collectives), on
/// `backend`'s stream: its arguments are `tensors`' addresses (generation-checked, and kept by
/// the graph while capturing, as for the backend's own kernels) followed by `scalars`. Legal
/// inside a capture: the launch becomes a node of the graph.
///
/// A simulator-only entry point, so it lives here and not on the backend type, whose public
/// API is the production one:
///
/// ```compile_fail,E0599
/// fn launch(b: &zcompute::CudaBackend<zcompute::SimDriver>, f: zdevice::Function) {
///     let config = zdevice::LaunchConfig { grid: (1, 1, 1), block: (1, 1, 1), shared_mem_bytes: 0 };
///     let _ = b.launch_simulated("op", f, config, &[], &[]); // no such method
/// }
/// ```
pub fn launch_simulated(
    backend: &super::CudaBackend<SimDriver>,
    op: &'static str,
    function: zdevice::Function,
    config: LaunchConfig,
    tensors: &[&super::CudaTensor],
    scalars: &[KernelArg],
) -> crate::error::Result<()> {
    let mut args = Vec::with_capacity(tensors.len() + scalars.len());
    for t in tensors {
        args.push(KernelArg::Ptr(backend.ptr(op, t)?));
    }
    args.extend_from_slice(scalars);
    backend.launch_on_simulator(op, function, config, &args)
}

type Twin = fn(&LaunchConfig, &[KernelArg], &mut SimMemory<'_>) -> Result<(), KernelFault>;

/// Registers every twin on `sim` (idempotent). Call it before `CudaBackend::new` resolves the
/// kernels: functions already resolved keep what they were resolved with.
pub fn register(sim: &SimDriver) {
    for k in Kernel::ALL {
        sim.register_kernel(k.spec().name, twin(k));
    }
}

/// Registers every twin as [`register`] does, each run of a kernel (an eager launch, or a
/// graph node replayed) first told to `observe`: a test counts the launches of one kernel
/// through a whole training step, e.g. the bf16 conversions (`Kernel::F32ToBf16`) a step
/// makes.
pub fn register_observed(sim: &SimDriver, observe: impl Fn(Kernel) + Send + Sync + 'static) {
    register_observed_launches(sim, move |k, _| observe(k));
}

/// [`register_observed`] with each run's launch shape: a test checks the grid a host sized.
pub fn register_observed_launches(
    sim: &SimDriver,
    observe: impl Fn(Kernel, &LaunchConfig) + Send + Sync + 'static,
) {
    let observe = std::sync::Arc::new(observe);
    for k in Kernel::ALL {
        let (run, observe) = (twin(k), observe.clone());
        sim.register_kernel(k.spec().name, move |config, args, mem| {
            observe(k, config);
            run(config, args, mem)
        });
    }
}

fn twin(k: Kernel) -> Twin {
    match k {
        Kernel::Unary => elementwise::unary,
        Kernel::UnaryStrided => elementwise::unary_strided,
        Kernel::Binary => elementwise::binary,
        Kernel::BinaryStrided => elementwise::binary_strided,
        Kernel::BinaryRowsStrided => elementwise::binary_rows_strided,
        Kernel::BinaryScalar => elementwise::binary_scalar,
        Kernel::CopyStrided => elementwise::copy_strided,
        Kernel::CopyRowsStrided => elementwise::copy_rows_strided,
        Kernel::FillStrided => elementwise::fill_strided,
        Kernel::ReduceRows => reductions::reduce_rows,
        Kernel::ReduceCols => reductions::reduce_cols,
        Kernel::ReduceRowsSplit => reductions::reduce_rows_split,
        Kernel::SoftmaxRows => rows::softmax_rows,
        Kernel::LayerNormRows => rows::layer_norm_rows,
        Kernel::SoftmaxBackwardRows => rows::softmax_backward,
        Kernel::LayerNormBackwardRows => rows::layer_norm_backward,
        Kernel::BceMean => train::bce_mean,
        Kernel::AdamW => train::adamw,
        Kernel::SoftmaxRowsV1 => rows::softmax_rows_vec::<1>,
        Kernel::SoftmaxRowsV2 => rows::softmax_rows_vec::<2>,
        Kernel::SoftmaxRowsV4 => rows::softmax_rows_vec::<4>,
        Kernel::SoftmaxRowsV8 => rows::softmax_rows_vec::<8>,
        Kernel::LayerNormRowsV1 => rows::layer_norm_rows_vec::<1>,
        Kernel::LayerNormRowsV2 => rows::layer_norm_rows_vec::<2>,
        Kernel::LayerNormRowsV4 => rows::layer_norm_rows_vec::<4>,
        Kernel::LayerNormRowsV8 => rows::layer_norm_rows_vec::<8>,
        Kernel::SumSquaresPartial => flat::sum_squares_partial,
        Kernel::NormFinish => flat::norm_finish,
        Kernel::ClipScale => flat::clip_scale,
        Kernel::FiniteGate => flat::finite_gate,
        Kernel::QkNormAttention => attention::forward::<false>,
        Kernel::QkNormAttentionBackward => attention::backward::<false>,
        Kernel::QkNormAttentionDh32 => attention::short_forward::<32, false>,
        Kernel::QkNormAttentionDh64 => attention::short_forward::<64, false>,
        Kernel::QkNormAttentionBackwardDh32 => attention::short_backward::<32, false>,
        Kernel::QkNormAttentionBackwardDh64 => attention::short_backward::<64, false>,
        Kernel::QkNormAttentionBf16 => attention::forward::<true>,
        Kernel::QkNormAttentionBackwardBf16 => attention::backward::<true>,
        Kernel::QkNormAttentionDh32Bf16 => attention::short_forward::<32, true>,
        Kernel::QkNormAttentionDh64Bf16 => attention::short_forward::<64, true>,
        Kernel::QkNormAttentionBackwardDh32Bf16 => attention::short_backward::<32, true>,
        Kernel::QkNormAttentionBackwardDh64Bf16 => attention::short_backward::<64, true>,
        Kernel::KeyPaddingAttention => key_padding::forward,
        Kernel::KeyPaddingAttentionBackwardQ => key_padding::backward_q,
        Kernel::KeyPaddingAttentionBackwardKv => key_padding::backward_kv,
        Kernel::BiasAct => fused::bias_act,
        Kernel::TanhBackward => fused::tanh_backward,
        Kernel::AddLayerNormRows => fused::add_layer_norm,
        Kernel::LayerNormBackwardAddRows => fused::layer_norm_backward_add,
        Kernel::PoolHeadBce => fused::pool_head_bce,
        Kernel::PoolHeadBceBackward => fused::pool_head_bce_backward,
        Kernel::PoolHeadBceFinish => fused::pool_head_bce_finish,
        Kernel::PoolHeadBceBackwardFinish => fused::pool_head_bce_backward_finish,
        Kernel::GatherRow => indexed::gather_row,
        Kernel::ScatterRow => indexed::scatter_row,
        Kernel::GatherRows => indexed::gather_rows,
        Kernel::GatherRowsAt => indexed::gather_rows_at,
        Kernel::LinearRowsKMajor => linear::rows_kmajor::<false>,
        Kernel::LinearRowsNMajor => linear::rows_nmajor::<false>,
        Kernel::LinearParamGrads => linear::param_grads,
        Kernel::LayerNormBackwardParams => norm_params::layer_norm_backward_params,
        Kernel::LayerNormBackwardPartials => norm_params::layer_norm_backward_partials,
        Kernel::LinearBackward => linear::backward,
        Kernel::ReduceColsLast => reductions::reduce_cols_last,
        Kernel::TanhBackwardCols => reductions::tanh_backward_cols,
        Kernel::BiasActAdd => fused::bias_act_add,
        Kernel::StepTail => flat::step_tail,
        Kernel::SumSquaresNorm => flat::sum_squares_norm,
        Kernel::ExchangeSumNorm => flat::exchange_sum_norm,
        Kernel::PoolHeadBceLast => fused::pool_head_bce_last,
        Kernel::PoolHeadBceBackwardLast => fused::pool_head_bce_backward_last,
        Kernel::Select => select::select,
        Kernel::ArgmaxRows => select::argmax_rows,
        Kernel::IndexAddRows => select::index_add_rows,
        Kernel::DropoutMask => select::dropout_mask,
        Kernel::Sgd => train::sgd,
        Kernel::F32ToBf16 => convert::f32_to_bf16,
        Kernel::Bf16ToF32 => convert::bf16_to_f32,
        Kernel::TanhBackwardBf16 => convert::tanh_backward_bf16,
        Kernel::LinearRowsKMajorBf16 => linear::rows_kmajor::<true>,
        Kernel::LinearRowsNMajorBf16 => linear::rows_nmajor::<true>,
        Kernel::LinearParamGradsBf16 => linear::param_grads_bf16,
        Kernel::LinearBackwardBf16 => linear::backward_bf16,
    }
}
