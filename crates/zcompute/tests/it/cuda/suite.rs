//! The op suite as a macro over a backend constructor, so the same rstest tables run on the
//! simulated device (`mock_suite`) and on the GPU (`gpu_suite`). Shapes are odd on purpose:
//! 1, 7, 193, 1025, broadcasting in each position, batches of 1.

macro_rules! op_suite {
    ($backend:path) => {
        use super::bodies::{self, View};
        use rstest::rstest;
        use zcompute::{BinaryOp, MatmulOpts, ReduceOp, UnaryOp};

        const N: MatmulOpts = MatmulOpts {
            trans_a: false,
            trans_b: false,
        };
        const TA: MatmulOpts = MatmulOpts {
            trans_a: true,
            trans_b: false,
        };
        const TB: MatmulOpts = MatmulOpts {
            trans_a: false,
            trans_b: true,
        };
        const TT: MatmulOpts = MatmulOpts {
            trans_a: true,
            trans_b: true,
        };

        #[rstest]
        fn unary(
            #[values(
                UnaryOp::Neg,
                UnaryOp::Exp,
                UnaryOp::Log,
                UnaryOp::Sqrt,
                UnaryOp::Rsqrt,
                UnaryOp::Tanh,
                UnaryOp::Sigmoid,
                UnaryOp::Relu,
                UnaryOp::Gelu
            )]
            op: UnaryOp,
            #[values(&[1][..], &[7], &[1025], &[7, 193], &[3, 5, 7])] shape: &[usize],
            #[values(View::Dense, View::Transposed, View::Narrowed)] view: View,
        ) {
            bodies::unary(&$backend(), op, shape, view);
        }

        #[rstest]
        #[case::same(&[7, 193], &[7, 193])]
        #[case::row(&[7, 193], &[193])]
        #[case::column(&[7, 193], &[7, 1])]
        #[case::both(&[1, 193], &[7, 1])]
        #[case::middle(&[3, 1, 5], &[3, 4, 5])]
        #[case::outer(&[2, 3, 5], &[1, 3, 5])]
        #[case::scalar(&[1025], &[1])]
        #[case::rank0(&[7], &[])]
        #[case::long(&[1025], &[1025])]
        #[case::bias(&[33, 2, 160], &[160])]
        fn binary(
            #[case] a: &[usize],
            #[case] b: &[usize],
            #[values(
                BinaryOp::Add,
                BinaryOp::Sub,
                BinaryOp::Mul,
                BinaryOp::Div,
                BinaryOp::Maximum
            )]
            op: BinaryOp,
            #[values(View::Dense, View::Transposed, View::Narrowed)] view: View,
        ) {
            bodies::binary(&$backend(), op, a, b, view);
        }

        #[rstest]
        fn binary_scalar(
            #[values(
                BinaryOp::Add,
                BinaryOp::Sub,
                BinaryOp::Mul,
                BinaryOp::Div,
                BinaryOp::Maximum
            )]
            op: BinaryOp,
            #[values(&[1][..], &[1025], &[7, 193])] shape: &[usize],
            #[values(View::Dense, View::Transposed)] view: View,
        ) {
            bodies::binary_scalar(&$backend(), op, shape, view);
        }

        #[rstest]
        fn reduce(
            #[values(ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max)] op: ReduceOp,
            // [1025, 33] and [4100, 7] reduce their first axis in row chunks (two and three
            // column-reduction passes); [20000] and [3, 9000] split their long rows.
            #[values(
                                &[1][..], &[1025], &[7, 193], &[1, 1025], &[3, 5, 7],
                                &[1025, 33], &[4100, 7], &[20000], &[3, 9000]
                            )]
            shape: &[usize],
            #[values(View::Dense, View::Transposed)] view: View,
        ) {
            bodies::reduce(&$backend(), op, shape, view);
        }

        #[rstest]
        fn softmax(
            // [256] narrowed starts 4 bytes into its storage (the general kernel); the
            // multiples of 4 up to 1024 take the register-resident kernels (all four widths).
            #[values(
                                &[1][..], &[7], &[7, 193], &[3, 1025], &[2, 3, 7],
                                &[256], &[33, 256], &[2, 3, 36], &[4, 300], &[5, 516], &[3, 1024]
                            )]
            shape: &[usize],
            #[values(View::Dense, View::Transposed, View::Narrowed)] view: View,
        ) {
            bodies::softmax(&$backend(), shape, view);
        }

        #[rstest]
        fn layer_norm(
            #[values(
                                &[1][..], &[7, 193], &[1, 1025], &[2, 3, 7],
                                &[33, 256], &[2, 3, 36], &[4, 300], &[5, 516], &[3, 1024]
                            )]
            shape: &[usize],
            #[values(View::Dense, View::Transposed)] view: View,
            #[values(false, true)] affine: bool,
        ) {
            bodies::layer_norm(&$backend(), shape, view, affine);
        }

        #[rstest]
        fn row_backward(
            #[values(&[1][..], &[7, 193], &[2, 3, 7], &[33, 256], &[3, 1025])] shape: &[usize],
            #[values(View::Dense, View::Transposed)] view: View,
            #[values(false, true)] affine: bool,
        ) {
            bodies::row_backward(&$backend(), shape, view, affine);
        }

        #[rstest]
        #[case::vector_out(&[7, 193], &[193, 1], N)]
        #[case::odd(&[193, 7], &[7, 1025], N)]
        #[case::trans_a(&[7, 193], &[7, 5], TA)]
        #[case::trans_b(&[5, 193], &[7, 193], TB)]
        #[case::trans_both(&[193, 5], &[7, 193], TT)]
        #[case::batch_of_one(&[1, 7, 5], &[1, 5, 3], N)]
        #[case::batch_broadcast_b(&[4, 7, 5], &[5, 3], N)]
        #[case::batch_broadcast_a(&[7, 5], &[4, 3, 5], TB)]
        #[case::batch_both(&[2, 1, 7, 5], &[3, 5, 4], N)]
        #[case::attention(&[24, 12, 64], &[24, 12, 64], TB)]
        #[case::k_zero(&[3, 0], &[0, 4], N)]
        fn matmul(
            #[case] a: &[usize],
            #[case] b: &[usize],
            #[case] opts: MatmulOpts,
            #[values(View::Dense, View::Transposed, View::Narrowed)] view: View,
        ) {
            bodies::matmul(&$backend(), a, b, opts, view, bodies::TOL);
        }

        #[rstest]
        #[case::qkv(&[96, 256], &[768, 256], TB)]
        #[case::odd(&[193, 65], &[65, 7], N)]
        fn matmul_tf32(#[case] a: &[usize], #[case] b: &[usize], #[case] opts: MatmulOpts) {
            let gpu = $backend();
            gpu.set_tf32(true).expect("tf32 on");
            bodies::matmul(&gpu, a, b, opts, View::Dense, bodies::TOL_TF32);
            gpu.set_tf32(false).expect("tf32 off");
        }

        #[rstest]
        fn bce(
            #[values(&[1][..], &[7], &[193, 7], &[1025])] shape: &[usize],
            #[values(View::Dense, View::Transposed)] view: View,
        ) {
            bodies::bce(&$backend(), shape, view);
        }

        #[rstest]
        fn adamw(
            #[values(&[1][..], &[7], &[1025], &[7, 193])] shape: &[usize],
            #[values(View::Dense, View::Transposed)] view: View,
        ) {
            bodies::adamw(&$backend(), shape, view);
        }

        #[test]
        fn adamw_aligned_and_unaligned_agree() {
            bodies::adamw_aligned_and_unaligned_agree(&$backend());
        }

        #[rstest]
        fn adamw_gate(
            #[values(&[1][..], &[1025], &[7, 193])] shape: &[usize],
            #[values(View::Dense, View::Transposed)] view: View,
        ) {
            bodies::adamw_gate(&$backend(), shape, view);
        }

        #[rstest]
        fn flat_norm2(
            #[values(&[0][..], &[1], &[7], &[1025], &[7, 193], &[300_001])] shape: &[usize],
            #[values(View::Dense, View::Transposed)] view: View,
        ) {
            super::flat_bodies::norm2(&$backend(), shape, view);
        }

        #[rstest]
        fn flat_clip_scale(
            #[values(&[1][..], &[1025], &[7, 193])] shape: &[usize],
            #[values(View::Dense, View::Transposed)] view: View,
        ) {
            super::flat_bodies::clip_scale(&$backend(), shape, view);
        }

        #[rstest]
        fn flat_add_into(
            #[values(&[1][..], &[1025], &[7, 193])] shape: &[usize],
            #[values(View::Dense, View::Transposed, View::Narrowed)] view: View,
        ) {
            super::flat_bodies::add_into(&$backend(), shape, view);
        }

        #[rstest]
        fn flat_binary_into(
            #[values(&[1][..], &[1025], &[7, 193])] shape: &[usize],
            #[values(View::Dense, View::Transposed, View::Narrowed)] view: View,
        ) {
            super::flat_bodies::binary_into(&$backend(), shape, view);
        }

        #[rstest]
        #[case::row_major(&[7, 5][..], &[5, 3][..], MatmulOpts::default())]
        #[case::weight_grad(&[9, 5], &[9, 4], MatmulOpts { trans_a: true, trans_b: false })]
        #[case::both_transposed(&[5, 7], &[3, 5], MatmulOpts { trans_a: true, trans_b: true })]
        #[case::batched(&[2, 3, 4], &[2, 4, 5], MatmulOpts::default())]
        #[case::broadcast(&[2, 3, 4], &[4, 5], MatmulOpts::default())]
        #[case::empty_k(&[3, 0], &[0, 4], MatmulOpts::default())]
        fn accumulate_matmul_into(
            #[case] a: &[usize],
            #[case] b: &[usize],
            #[case] opts: MatmulOpts,
            #[values(View::Dense, View::Transposed, View::Narrowed)] view: View,
        ) {
            super::accumulate_bodies::matmul_into(&$backend(), a, b, opts, view);
        }

        #[test]
        fn accumulate_matmul_into_refuses_bad_destinations() {
            super::accumulate_bodies::matmul_into_refuses(&$backend());
        }

        #[rstest]
        fn accumulate_sum_rows_into(
            #[values(&[1][..], &[7], &[7, 193], &[3, 5, 33], &[4097, 3], &[2, 20_000, 2])]
            shape: &[usize],
            #[values(View::Dense, View::Transposed, View::Narrowed)] view: View,
        ) {
            super::accumulate_bodies::sum_rows_into(&$backend(), shape, view);
        }

        #[test]
        fn flat_finite_gate() {
            super::flat_bodies::finite_gate(&$backend());
        }

        #[test]
        fn flat_step_tail() {
            super::flat_bodies::step_tail(&$backend());
        }

        #[rstest]
        fn data_movement(
            #[values(&[1][..], &[7], &[1025], &[7, 193], &[5, 5], &[3, 5, 7])] shape: &[usize],
            #[values(View::Dense, View::Transposed, View::Narrowed)] view: View,
        ) {
            bodies::data_movement(&$backend(), shape, view);
        }

        #[test]
        fn errors_match_the_cpu() {
            super::errors::errors(&$backend());
        }

        #[test]
        fn capture_replays_100_times_like_eager() {
            super::capture::replay_matches_eager(&$backend(), 100);
        }

        #[test]
        fn capture_refuses_uploads_and_stays_eager_after_failures() {
            super::capture::failures_leave_eager_working(&$backend());
        }

        #[test]
        fn capture_phases_come_from_the_device_session() {
            super::capture::phases_come_from_the_device_session(&$backend());
        }

        #[test]
        fn adamw_captured_reads_lr_and_step_from_memory() {
            super::capture::adamw_replay_reads_slot(&$backend());
        }

        #[test]
        fn capture_pool_members_share_one_reservation_and_replay_alternately() {
            super::capture_pool::a_pool_holds_the_larger_member(&$backend());
        }

        #[test]
        fn capture_pool_refuses_a_body_that_keeps_a_tensor() {
            super::capture_pool::a_pooled_body_keeping_a_tensor_is_refused(&$backend());
        }

        /// The device twin of `capture_end::cpu_stored_tensor_holds_one_completed_run`.
        #[test]
        fn capture_stored_tensor_holds_one_completed_run() {
            super::capture_end::stored_tensor_holds_one_completed_run(&$backend());
        }
    };
}
