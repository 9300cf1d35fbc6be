//! The rows of the validation table (`validation.rs`), as a macro over a backend constructor
//! so the same rows run on the simulated device (`mock_suite`) and on the GPU (`gpu_suite`).

macro_rules! validation_table {
    ($backend:path) => {
        mod validation_table {
            use super::super::validation::{check, dims, Arg, Arg::*, Op, ADAMW};
            use rstest::rstest;
            use zcompute::{
                Activation, AdamWConfig, BinaryOp, ComputeError as E, MatmulOpts, ReduceOp,
            };

            const N: MatmulOpts = MatmulOpts {
                trans_a: false,
                trans_b: false,
            };
            const TB: MatmulOpts = MatmulOpts {
                trans_a: false,
                trans_b: true,
            };
            const ID: Activation = Activation::Identity;
            const TANH: Activation = Activation::Tanh;
            const PG: &str = "linear_param_grads_into";
            const LB: &str = "linear_backward_into";
            const LNI: &str = "layer_norm_backward_into";
            /// 2^31: a broadcast view this long has 2^31 elements over one stored value.
            const HUGE: usize = 1 << 31;

            const fn adamw(beta1: f32, beta2: f32, eps: f32, weight_decay: f32) -> Op {
                Op::AdamW(AdamWConfig {
                    beta1,
                    beta2,
                    eps,
                    weight_decay,
                })
            }

            fn scalar(op: &'static str, arg: &'static str, value: &str, expected: &'static str) -> E {
                E::InvalidScalar { op, arg, value: value.into(), expected }
            }

            fn shapes(op: &'static str, lhs: &[usize], rhs: &[usize]) -> E {
                E::ShapeMismatch { op, lhs: dims(lhs), rhs: dims(rhs) }
            }

            fn overlapping(op: &'static str, shape: &[usize], strides: &[usize]) -> E {
                E::OverlappingDestination { op, shape: dims(shape), strides: dims(strides) }
            }

            fn rank(op: &'static str, min: usize, shape: &[usize]) -> E {
                E::RankTooLow { op, min, shape: dims(shape) }
            }

            fn overflow(op: &'static str, shape: &[usize]) -> E {
                E::SizeOverflow { op, shape: dims(shape) }
            }

            fn aliased(op: &'static str, lhs: &'static str, rhs: &'static str) -> E {
                E::Aliased { op, lhs, rhs }
            }

            fn unsupported(op: &'static str, reason: &str) -> E {
                E::Unsupported { op, reason: reason.into() }
            }

            /// A Linear op given more than a matrix of rows.
            fn not_a_matrix(op: &'static str, shape: &str) -> E {
                unsupported(op, &format!("takes a matrix [rows, features], got shape {shape}: fold the leading axes into the rows first (reshape)"))
            }

            #[rstest]
            // Transfers, fills and copies.
            #[case::upload_short(Op::Upload(2, &[3]), &[], E::LengthMismatch { op: "upload", expected: 3, got: 2 })]
            #[case::upload_size_overflow(Op::Upload(0, &[usize::MAX, 2]), &[], overflow("upload", &[usize::MAX, 2]))]
            #[case::upload_into_long(Op::UploadInto(5), &[T(&[2, 2])], E::LengthMismatch { op: "upload_into", expected: 4, got: 5 })]
            #[case::upload_into_broadcast(Op::UploadInto(8), &[Bcast(&[4], &[2, 4])], overlapping("upload_into", &[2, 4], &[0, 1]))]
            #[case::full_size_overflow(Op::Full(&[usize::MAX, 2]), &[], overflow("full", &[usize::MAX, 2]))]
            #[case::full_beyond_memory(Op::Full(&[1 << 62]), &[], overflow("full", &[1 << 62]))]
            #[case::fill_broadcast(Op::Fill, &[Bcast(&[4], &[2, 4])], overlapping("fill", &[2, 4], &[0, 1]))]
            #[case::copy_shapes(Op::CopyInto, &[T(&[3]), T(&[4])], shapes("copy_into", &[3], &[4]))]
            #[case::copy_transposed_shape(Op::CopyInto, &[T(&[2, 3]), T(&[3, 2])], shapes("copy_into", &[2, 3], &[3, 2]))]
            #[case::copy_into_broadcast(Op::CopyInto, &[T(&[2, 4]), Bcast(&[4], &[2, 4])], overlapping("copy_into", &[2, 4], &[0, 1]))]
            // Broadcasting.
            #[case::add_not_broadcastable(Op::Binary(BinaryOp::Add), &[T(&[3]), T(&[4])], E::NotBroadcastable { op: "add", lhs: dims(&[3]), rhs: dims(&[4]) })]
            #[case::maximum_not_broadcastable(Op::Binary(BinaryOp::Maximum), &[T(&[2, 3]), T(&[3, 2])], E::NotBroadcastable { op: "maximum", lhs: dims(&[2, 3]), rhs: dims(&[3, 2]) })]
            #[case::div_inner_axis(Op::Binary(BinaryOp::Div), &[T(&[2, 3, 4]), T(&[2, 4])], E::NotBroadcastable { op: "div", lhs: dims(&[2, 3, 4]), rhs: dims(&[2, 4]) })]
            #[case::mul_output_beyond_memory(Op::Binary(BinaryOp::Mul), &[Bcast(&[1, 1], &[HUGE, 1]), Bcast(&[1, 1], &[1, HUGE])], overflow("mul", &[HUGE, HUGE]))]
            // Reductions.
            #[case::sum_axis_out_of_range(Op::Reduce(ReduceOp::Sum, 2), &[T(&[3, 4])], E::AxisOutOfRange { op: "sum", axis: 2, rank: 2 })]
            #[case::mean_of_rank_0(Op::Reduce(ReduceOp::Mean, 0), &[T(&[])], E::AxisOutOfRange { op: "mean", axis: 0, rank: 0 })]
            #[case::max_of_empty_axis(Op::Reduce(ReduceOp::Max, 1), &[T(&[3, 0])], E::EmptyReduction { op: "max", axis: 1 })]
            #[case::mean_of_empty_axis(Op::Reduce(ReduceOp::Mean, 0), &[T(&[0])], E::EmptyReduction { op: "mean", axis: 0 })]
            // Softmax and its backward.
            #[case::softmax_rank_0(Op::Softmax, &[T(&[])], rank("softmax", 1, &[]))]
            #[case::softmax_backward_shapes(Op::SoftmaxBackward, &[T(&[2, 3]), T(&[3, 2])], shapes("softmax_backward", &[2, 3], &[3, 2]))]
            #[case::softmax_backward_rank_0(Op::SoftmaxBackward, &[T(&[]), T(&[])], rank("softmax_backward", 1, &[]))]
            // LayerNorm and its backward (g, x, mean, rstd, weight).
            #[case::layer_norm_rank_0(Op::LayerNorm(1e-5), &[T(&[])], rank("layer_norm", 1, &[]))]
            #[case::layer_norm_empty_rows(Op::LayerNorm(1e-5), &[T(&[2, 0])], E::EmptyReduction { op: "layer_norm", axis: 1 })]
            #[case::layer_norm_weight(Op::LayerNorm(1e-5), &[T(&[2, 3]), T(&[4])], shapes("layer_norm weight", &[4], &[3]))]
            #[case::layer_norm_bias(Op::LayerNorm(1e-5), &[T(&[2, 3]), Absent, T(&[2, 3])], shapes("layer_norm bias", &[2, 3], &[3]))]
            #[case::layer_norm_nan_eps(Op::LayerNorm(f32::NAN), &[T(&[2, 3])], scalar("layer_norm", "eps", "NaN", "a finite eps >= 0"))]
            #[case::layer_norm_negative_eps(Op::LayerNorm(-1.0), &[T(&[2, 3]), T(&[3])], scalar("layer_norm", "eps", "-1.0", "a finite eps >= 0"))]
            #[case::layer_norm_backward_g(Op::LayerNormBackward, &[T(&[2, 4]), T(&[2, 3]), T(&[2, 1]), T(&[2, 1])], shapes("layer_norm_backward", &[2, 4], &[2, 3]))]
            #[case::layer_norm_backward_rank_0(Op::LayerNormBackward, &[T(&[]), T(&[]), T(&[]), T(&[])], rank("layer_norm_backward", 1, &[]))]
            #[case::layer_norm_backward_empty_rows(Op::LayerNormBackward, &[T(&[2, 0]), T(&[2, 0]), T(&[2, 1]), T(&[2, 1])], E::EmptyReduction { op: "layer_norm_backward", axis: 1 })]
            #[case::layer_norm_backward_mean(Op::LayerNormBackward, &[T(&[2, 3]), T(&[2, 3]), T(&[2]), T(&[2, 1])], shapes("layer_norm_backward", &[2], &[2, 1]))]
            #[case::layer_norm_backward_rstd(Op::LayerNormBackward, &[T(&[2, 3]), T(&[2, 3]), T(&[2, 1]), T(&[2, 3])], shapes("layer_norm_backward", &[2, 3], &[2, 1]))]
            #[case::layer_norm_backward_weight(Op::LayerNormBackward, &[T(&[2, 3]), T(&[2, 3]), T(&[2, 1]), T(&[2, 1]), T(&[4])], shapes("layer_norm_backward weight", &[4], &[3]))]
            // Matrix products.
            #[case::matmul_inner(Op::Matmul(N), &[T(&[2, 3]), T(&[4, 5])], shapes("matmul", &[2, 3], &[4, 5]))]
            #[case::matmul_inner_trans_b(Op::Matmul(TB), &[T(&[2, 3]), T(&[3, 5])], shapes("matmul", &[2, 3], &[3, 5]))]
            #[case::matmul_a_rank_1(Op::Matmul(N), &[T(&[3]), T(&[3, 3])], rank("matmul", 2, &[3]))]
            #[case::matmul_b_rank_1(Op::Matmul(N), &[T(&[3, 3]), T(&[3])], rank("matmul", 2, &[3]))]
            #[case::matmul_batch(Op::Matmul(N), &[T(&[2, 3, 4]), T(&[3, 4, 2])], E::NotBroadcastable { op: "matmul", lhs: dims(&[2]), rhs: dims(&[3]) })]
            #[case::matmul_output_beyond_memory(Op::Matmul(N), &[Bcast(&[1, 1], &[HUGE, 1]), Bcast(&[1, 1], &[1, HUGE])], overflow("matmul", &[HUGE, HUGE]))]
            // The loss.
            #[case::bce_shapes(Op::Bce, &[T(&[3]), T(&[4])], shapes("bce_with_logits", &[3], &[4]))]
            #[case::bce_empty(Op::Bce, &[T(&[0]), T(&[0])], E::EmptyReduction { op: "bce_with_logits", axis: 0 })]
            // AdamW (p, m, v, g, slot).
            #[case::adamw_m_shape(Op::AdamW(ADAMW), &[T(&[4]), T(&[3]), T(&[4]), T(&[4]), T(&[2])], shapes("adamw", &[3], &[4]))]
            #[case::adamw_g_shape(Op::AdamW(ADAMW), &[T(&[4]), T(&[4]), T(&[4]), T(&[2, 2]), T(&[2])], shapes("adamw", &[2, 2], &[4]))]
            #[case::adamw_slot_length(Op::AdamW(ADAMW), &[T(&[4]), T(&[4]), T(&[4]), T(&[4]), T(&[4])], shapes("adamw", &[4], &[2]))]
            #[case::adamw_p_is_m(Op::AdamW(ADAMW), &[T(&[4]), Same(0), T(&[4]), T(&[4]), T(&[2])], E::Aliased { op: "adamw", lhs: "p", rhs: "m" })]
            #[case::adamw_g_is_p(Op::AdamW(ADAMW), &[T(&[4]), T(&[4]), T(&[4]), Same(0), T(&[3])], E::Aliased { op: "adamw", lhs: "p", rhs: "g" })]
            #[case::adamw_m_v_one_buffer(Op::AdamW(ADAMW), &[T(&[4]), Part(5, 0, 4), Part(5, 4, 4), T(&[4]), T(&[2]), T(&[8])], E::Aliased { op: "adamw", lhs: "m", rhs: "v" })]
            #[case::adamw_slot_in_g(Op::AdamW(ADAMW), &[T(&[2]), T(&[2]), T(&[2]), Part(5, 0, 2), Part(5, 2, 2), T(&[4])], E::Aliased { op: "adamw", lhs: "g", rhs: "slot" })]
            #[case::adamw_broadcast_p(Op::AdamW(ADAMW), &[Bcast(&[4], &[2, 4]), T(&[2, 4]), T(&[2, 4]), T(&[2, 4]), T(&[2])], overlapping("adamw", &[2, 4], &[0, 1]))]
            #[case::adamw_beta1_one(adamw(1.0, 0.999, 1e-8, 0.0), &[T(&[4]), T(&[4]), T(&[4]), T(&[4]), T(&[2])], scalar("adamw", "beta1", "1.0", "a beta1 in [0, 1)"))]
            #[case::adamw_beta2_nan(adamw(0.9, f32::NAN, 1e-8, 0.0), &[T(&[4]), T(&[4]), T(&[4]), T(&[4]), T(&[3])], scalar("adamw", "beta2", "NaN", "a beta2 in [0, 1)"))]
            #[case::adamw_negative_eps(adamw(0.9, 0.999, -1.0, 0.0), &[T(&[4]), T(&[4]), T(&[4]), T(&[4]), T(&[2])], scalar("adamw", "eps", "-1.0", "a finite eps >= 0"))]
            #[case::adamw_infinite_decay(adamw(0.9, 0.999, 1e-8, f32::INFINITY), &[T(&[4]), T(&[4]), T(&[4]), T(&[4]), T(&[2])], scalar("adamw", "weight_decay", "inf", "a finite weight decay >= 0"))]
            // Bias and activation.
            #[case::bias_act_bias(Op::BiasAct(TANH), &[T(&[3, 4]), T(&[5])], shapes("bias_act bias", &[5], &[4]))]
            #[case::bias_act_rank_0(Op::BiasAct(ID), &[T(&[]), T(&[1])], rank("bias_act", 1, &[]))]
            #[case::tanh_backward_shapes(Op::TanhBackward, &[T(&[3]), T(&[4])], shapes("tanh_backward", &[3], &[4]))]
            // A Linear layer (x, w, bias[, residual]).
            #[case::linear_inner(Op::Linear(ID), &[T(&[12, 5]), T(&[7, 6]), T(&[7])], shapes("linear", &[5], &[6]))]
            #[case::linear_bias(Op::Linear(ID), &[T(&[12, 5]), T(&[7, 5]), T(&[6])], shapes("linear bias", &[6], &[7]))]
            #[case::linear_rank_3(Op::Linear(ID), &[T(&[2, 12, 5]), T(&[7, 5]), T(&[7])], not_a_matrix("linear", "[2, 12, 5]"))]
            #[case::linear_rank_1(Op::Linear(ID), &[T(&[5]), T(&[7, 5]), T(&[7])], rank("linear", 2, &[5]))]
            #[case::linear_add_residual(Op::LinearAdd(ID), &[T(&[12, 5]), T(&[7, 5]), T(&[7]), T(&[12, 5])], shapes("linear_add residual", &[12, 5], &[12, 7]))]
            // Its parameters' gradients added into their buffers (g, x, dw, db).
            #[case::param_grads_rows(Op::LinearParamGradsInto, &[T(&[12, 7]), T(&[13, 5]), T(&[7, 5]), T(&[7])], shapes(PG, &[12], &[13]))]
            #[case::param_grads_dw(Op::LinearParamGradsInto, &[T(&[12, 7]), T(&[12, 5]), T(&[5, 7]), T(&[7])], shapes(PG, &[5, 7], &[7, 5]))]
            #[case::param_grads_db(Op::LinearParamGradsInto, &[T(&[12, 7]), T(&[12, 5]), T(&[7, 5]), T(&[5])], shapes(PG, &[5], &[7]))]
            #[case::param_grads_dw_is_g(Op::LinearParamGradsInto, &[T(&[4, 4]), T(&[4, 4]), Same(0), Absent], aliased(PG, "g", "dw"))]
            #[case::param_grads_dw_db_overlap(Op::LinearParamGradsInto, &[T(&[3, 7]), T(&[3, 4]), View(4, 0, &[7, 4]), Part(4, 27, 7), T(&[40])], aliased(PG, "dw", "db"))]
            // Its whole backward (g, x, w, y, dw, db).
            #[case::backward_weight(Op::LinearBackwardInto(ID), &[T(&[3, 7]), T(&[3, 5]), T(&[7, 6]), Absent, T(&[7, 5]), T(&[7])], shapes("linear_backward_into weight", &[7, 6], &[7, 5]))]
            #[case::backward_rows(Op::LinearBackwardInto(ID), &[T(&[3, 7]), T(&[4, 5]), T(&[7, 5]), Absent, T(&[7, 5]), T(&[7])], shapes(LB, &[3], &[4]))]
            #[case::backward_output(Op::LinearBackwardInto(TANH), &[T(&[3, 7]), T(&[3, 5]), T(&[7, 5]), T(&[3, 6]), T(&[7, 5]), T(&[7])], shapes("linear_backward_into output", &[3, 6], &[3, 7]))]
            #[case::backward_tanh_without_y(Op::LinearBackwardInto(TANH), &[T(&[3, 7]), T(&[3, 5]), T(&[7, 5]), Absent, T(&[7, 5]), T(&[7])], unsupported(LB, "tanh's backward needs the layer's saved output `y`"))]
            #[case::backward_identity_with_y(Op::LinearBackwardInto(ID), &[T(&[3, 7]), T(&[3, 5]), T(&[7, 5]), T(&[3, 7]), T(&[7, 5]), T(&[7])], unsupported(LB, "the identity has no saved output: pass `y` only with tanh"))]
            #[case::backward_rank_3(Op::LinearBackwardInto(ID), &[T(&[2, 3, 7]), T(&[3, 5]), T(&[7, 5]), Absent, T(&[7, 5]), T(&[7])], not_a_matrix(LB, "[2, 3, 7]"))]
            #[case::backward_dw_db_overlap(Op::LinearBackwardInto(TANH), &[T(&[3, 7]), T(&[3, 4]), T(&[7, 4]), T(&[3, 7]), View(6, 0, &[7, 4]), Part(6, 27, 7), T(&[40])], aliased(LB, "dw", "db"))]
            #[case::backward_dw_is_w(Op::LinearBackwardInto(ID), &[T(&[3, 7]), T(&[3, 4]), T(&[7, 4]), Absent, Same(2), Absent], aliased(LB, "w", "dw"))]
            #[case::backward_dw_in_y(Op::LinearBackwardInto(TANH), &[T(&[3, 7]), T(&[3, 4]), Absent, View(6, 0, &[3, 7]), View(6, 21, &[7, 4]), Absent, T(&[49])], aliased(LB, "y", "dw"))]
            // LayerNorm after a residual add, its backward adding the residual's gradient, and
            // the backward adding into the weight's and bias's gradient buffers (g, residual,
            // x, mean, rstd, weight, dw, db).
            #[case::add_layer_norm_shapes(Op::AddLayerNorm(1e-5), &[T(&[2, 4]), T(&[2, 3])], shapes("add_layer_norm", &[2, 4], &[2, 3]))]
            #[case::add_layer_norm_nan_eps(Op::AddLayerNorm(f32::NAN), &[T(&[2, 4]), T(&[2, 4])], scalar("layer_norm", "eps", "NaN", "a finite eps >= 0"))]
            #[case::layer_norm_backward_residual(Op::LayerNormBackwardAdd, &[T(&[2, 4]), T(&[2, 3]), T(&[2, 4]), T(&[2, 1]), Same(3)], shapes("layer_norm_backward residual", &[2, 3], &[2, 4]))]
            #[case::norm_params_dw(Op::LayerNormBackwardInto, &[T(&[3, 8]), Absent, T(&[3, 8]), T(&[3, 1]), Same(3), Absent, T(&[9]), T(&[8])], shapes(LNI, &[9], &[8]))]
            #[case::norm_params_db(Op::LayerNormBackwardInto, &[T(&[3, 8]), Absent, T(&[3, 8]), T(&[3, 1]), Same(3), Absent, T(&[8]), T(&[7])], shapes(LNI, &[7], &[8]))]
            #[case::norm_params_broadcast_dw(Op::LayerNormBackwardInto, &[T(&[3, 8]), Absent, T(&[3, 8]), T(&[3, 1]), Same(3), Absent, Bcast(&[1], &[8]), Absent], overlapping(LNI, &[8], &[0]))]
            #[case::norm_params_db_in_g(Op::LayerNormBackwardInto, &[View(8, 0, &[3, 8]), Absent, T(&[3, 8]), T(&[3, 1]), Same(3), Absent, Absent, Part(8, 0, 8), T(&[24])], aliased(LNI, "g", "db"))]
            #[case::norm_params_dw_db_overlap(Op::LayerNormBackwardInto, &[T(&[3, 8]), Absent, T(&[3, 8]), T(&[3, 1]), Same(3), Absent, Part(8, 0, 8), Part(8, 7, 8), T(&[24])], aliased(LNI, "dw", "db"))]
            // The pooled head and its loss (h, weight, bias, targets; backward: g, h, weight,
            // logits, targets).
            #[case::pool_head_rank_2(Op::PoolHeadBce, &[T(&[2, 8]), T(&[1, 8]), T(&[1]), T(&[2])], rank("pool_head_bce", 3, &[2, 8]))]
            #[case::pool_head_empty_scales(Op::PoolHeadBce, &[T(&[2, 0, 8]), T(&[1, 8]), T(&[1]), T(&[2])], E::EmptyReduction { op: "pool_head_bce", axis: 1 })]
            #[case::pool_head_weight(Op::PoolHeadBce, &[T(&[2, 3, 8]), T(&[8]), T(&[1]), T(&[2])], shapes("pool_head_bce", &[8], &[1, 8]))]
            #[case::pool_head_targets(Op::PoolHeadBce, &[T(&[2, 3, 8]), T(&[1, 8]), T(&[1]), T(&[2, 1])], shapes("pool_head_bce", &[2, 1], &[2]))]
            #[case::pool_head_bias(Op::PoolHeadBce, &[T(&[2, 3, 8]), T(&[1, 8]), T(&[2]), T(&[2])], shapes("pool_head_bce", &[2], &[1]))]
            #[case::pool_head_backward_g(Op::PoolHeadBceBackward, &[T(&[1]), T(&[2, 3, 8]), T(&[1, 8]), T(&[2]), Same(3)], shapes("pool_head_bce_backward", &[1], &[]))]
            fn bad_input_gives_the_same_error(
                #[case] op: Op,
                #[case] args: &[Arg],
                #[case] expected: E,
            ) {
                check(&$backend(), op, args, &expected);
            }
        }
    };
}
