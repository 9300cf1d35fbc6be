//! Every `ComputeError` variant is reachable from public calls, and none of them panics.

use crate::common::{cpu32, rand_pair};
use zcompute::{
    AdamWConfig, Backend, ComputeError, CpuStorage, CpuTensor, Layout, MatmulOpts, ReduceOp, Tensor,
};

fn t(shape: &[usize]) -> CpuTensor<f32> {
    rand_pair(shape, 1).0
}

#[test]
fn shape_mismatch() {
    let e = cpu32().copy_into(&t(&[2, 3]), &t(&[3, 2])).unwrap_err();
    assert!(
        matches!(
            e,
            ComputeError::ShapeMismatch {
                op: "copy_into",
                ..
            }
        ),
        "{e}"
    );
    let e = cpu32()
        .matmul(&t(&[2, 3]), &t(&[4, 5]), MatmulOpts::default())
        .unwrap_err();
    assert!(
        matches!(e, ComputeError::ShapeMismatch { op: "matmul", .. }),
        "{e}"
    );
    let e = cpu32()
        .layer_norm(&t(&[2, 3]), Some(&t(&[4])), None, 1e-5)
        .unwrap_err();
    assert!(matches!(e, ComputeError::ShapeMismatch { .. }), "{e}");
    let e = cpu32()
        .bce_with_logits_mean(&t(&[3]), &t(&[4]))
        .unwrap_err();
    assert!(matches!(e, ComputeError::ShapeMismatch { .. }), "{e}");
    let e = Layout::new(&[2, 3], &[1], 0).unwrap_err();
    assert!(
        matches!(e, ComputeError::ShapeMismatch { op: "layout", .. }),
        "{e}"
    );
}

#[test]
fn not_broadcastable() {
    let e = cpu32().add(&t(&[3]), &t(&[4])).unwrap_err();
    assert_eq!(
        e,
        ComputeError::NotBroadcastable {
            op: "add",
            lhs: [3][..].into(),
            rhs: [4][..].into()
        }
    );
    assert!(matches!(
        t(&[2, 3]).broadcast_to(&[3]),
        Err(ComputeError::NotBroadcastable { .. })
    ));
    let e = cpu32()
        .matmul(&t(&[2, 2, 3]), &t(&[3, 3, 4]), MatmulOpts::default())
        .unwrap_err();
    assert!(
        matches!(e, ComputeError::NotBroadcastable { op: "matmul", .. }),
        "{e}"
    );
}

#[test]
fn axis_out_of_range() {
    let e = cpu32()
        .reduce(ReduceOp::Sum, &t(&[2, 3]), 2, false)
        .unwrap_err();
    assert_eq!(
        e,
        ComputeError::AxisOutOfRange {
            op: "sum",
            axis: 2,
            rank: 2
        }
    );
    assert!(matches!(
        t(&[2]).narrow(1, 0, 1),
        Err(ComputeError::AxisOutOfRange { .. })
    ));
    assert!(matches!(
        t(&[2]).transpose(0, 1),
        Err(ComputeError::AxisOutOfRange { .. })
    ));
    assert!(matches!(
        t(&[2]).unsqueeze(2),
        Err(ComputeError::AxisOutOfRange { .. })
    ));
    assert!(matches!(
        t(&[2]).split(3, &[2]),
        Err(ComputeError::AxisOutOfRange { .. })
    ));
}

#[test]
fn not_contiguous() {
    let e = t(&[2, 3])
        .transpose(0, 1)
        .unwrap()
        .reshape(&[6])
        .unwrap_err();
    assert!(
        matches!(e, ComputeError::NotContiguous { op: "reshape", .. }),
        "{e}"
    );
}

#[test]
fn invalid_permutation() {
    for perm in [&[0, 0][..], &[0][..], &[0, 2][..], &[1, 0, 2][..]] {
        let e = t(&[2, 3]).permute(perm).unwrap_err();
        assert!(
            matches!(e, ComputeError::InvalidPermutation { rank: 2, .. }),
            "{e}"
        );
    }
}

#[test]
fn narrow_out_of_range() {
    let e = t(&[2, 3]).narrow(1, 2, 2).unwrap_err();
    assert_eq!(
        e,
        ComputeError::NarrowOutOfRange {
            axis: 1,
            start: 2,
            len: 2,
            size: 3
        }
    );
    assert!(t(&[2, 3]).narrow(1, usize::MAX, 2).is_err());
}

#[test]
fn reshape_numel() {
    assert!(matches!(
        t(&[2, 3]).reshape(&[7]),
        Err(ComputeError::ReshapeNumel { .. })
    ));
}

#[test]
fn rank_too_low() {
    let e = cpu32()
        .matmul(&t(&[3]), &t(&[3, 2]), MatmulOpts::default())
        .unwrap_err();
    assert!(
        matches!(
            e,
            ComputeError::RankTooLow {
                op: "matmul",
                min: 2,
                ..
            }
        ),
        "{e}"
    );
    let s = CpuTensor::scalar(1.0f32);
    assert!(matches!(
        cpu32().softmax_last(&s),
        Err(ComputeError::RankTooLow { .. })
    ));
    assert!(matches!(
        cpu32().layer_norm(&s, None, None, 1e-5),
        Err(ComputeError::RankTooLow { .. })
    ));
}

#[test]
fn length_mismatch() {
    let e = CpuTensor::from_vec(vec![1.0f32; 5], &[2, 3]).unwrap_err();
    assert_eq!(
        e,
        ComputeError::LengthMismatch {
            op: "from_vec",
            expected: 6,
            got: 5
        }
    );
    assert!(matches!(
        t(&[5]).split(0, &[2, 2]),
        Err(ComputeError::LengthMismatch { .. })
    ));
    assert!(cpu32().upload(&[1.0], &[2]).is_err());
}

#[test]
fn out_of_storage() {
    let s = CpuStorage::from_vec(vec![0.0f32; 6]);
    let e = Tensor::from_parts(s.clone(), Layout::new(&[2, 3], &[3, 1], 1).unwrap()).unwrap_err();
    assert_eq!(e, ComputeError::OutOfStorage { needed: 7, len: 6 });
    assert!(Tensor::from_parts(s, Layout::new(&[2, 3], &[3, 1], 0).unwrap()).is_ok());
}

#[test]
fn overlapping_destination() {
    let b = t(&[3]).broadcast_to(&[2, 3]).unwrap();
    assert!(matches!(
        cpu32().fill(&b, 0.0),
        Err(ComputeError::OverlappingDestination { .. })
    ));
    let e = cpu32().copy_into(&t(&[2, 3]), &b).unwrap_err();
    assert!(
        matches!(
            e,
            ComputeError::OverlappingDestination {
                op: "copy_into",
                ..
            }
        ),
        "{e}"
    );
    // A hand-made layout whose rows overlap (stride 1 under a row of 3).
    let s = CpuStorage::from_vec(vec![0.0f32; 8]);
    let o = Tensor::from_parts(s, Layout::new(&[2, 3], &[1, 1], 0).unwrap()).unwrap();
    assert!(matches!(
        cpu32().fill(&o, 0.0),
        Err(ComputeError::OverlappingDestination { .. })
    ));
}

#[test]
fn aliased() {
    let cfg = AdamWConfig {
        beta1: 0.9f32,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
    };
    let p = t(&[4]);
    let g = t(&[4]);
    let v = t(&[4]);
    let slot = CpuTensor::from_vec(vec![1e-3f32, 1.0], &[2]).unwrap();
    let e = cpu32().adamw_step(&p, &p, &v, &g, &slot, &cfg).unwrap_err();
    assert_eq!(
        e,
        ComputeError::Aliased {
            op: "adamw",
            lhs: "p",
            rhs: "m"
        }
    );
    // Two disjoint views of one buffer still alias as far as the op is concerned.
    let both = t(&[8]);
    let e = cpu32()
        .adamw_step(
            &p,
            &both.narrow(0, 0, 4).unwrap(),
            &both.narrow(0, 4, 4).unwrap(),
            &g,
            &slot,
            &cfg,
        )
        .unwrap_err();
    assert!(
        matches!(
            e,
            ComputeError::Aliased {
                lhs: "m",
                rhs: "v",
                ..
            }
        ),
        "{e}"
    );
    // A slot is [lr, t] or [lr, t, gate]: any other length is refused.
    let e = cpu32()
        .adamw_step(&p, &t(&[4]), &v, &g, &t(&[4]), &cfg)
        .unwrap_err();
    assert!(
        matches!(e, ComputeError::ShapeMismatch { op: "adamw", .. }),
        "{e}"
    );
}

#[test]
fn empty_reduction() {
    let e = cpu32().max(&t(&[3, 0]), 1, false).unwrap_err();
    assert_eq!(e, ComputeError::EmptyReduction { op: "max", axis: 1 });
    assert!(matches!(
        cpu32().mean(&t(&[0]), 0, true),
        Err(ComputeError::EmptyReduction { .. })
    ));
    assert!(matches!(
        cpu32().bce_with_logits_mean(&t(&[0]), &t(&[0])),
        Err(ComputeError::EmptyReduction { .. })
    ));
    assert!(matches!(
        cpu32().layer_norm(&t(&[2, 0]), None, None, 1e-5),
        Err(ComputeError::EmptyReduction { .. })
    ));
}

#[test]
fn size_overflow() {
    let e = cpu32().full(&[usize::MAX, 2], 0.0).unwrap_err();
    assert!(
        matches!(e, ComputeError::SizeOverflow { op: "full", .. }),
        "{e}"
    );
    assert!(matches!(
        t(&[2]).reshape(&[usize::MAX, 3]),
        Err(ComputeError::SizeOverflow { .. })
    ));
}

#[test]
fn errors_display_name_the_op() {
    let e = cpu32().add(&t(&[3]), &t(&[4])).unwrap_err();
    assert_eq!(
        e.to_string(),
        "add: shapes [3] and [4] are not broadcastable"
    );
}
