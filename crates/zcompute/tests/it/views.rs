//! Views, explicit copies and writes through strided destinations.

use crate::common::{cpu32, cpu64};
use rstest::rstest;
use zcompute::{Backend, CpuTensor};

fn iota(shape: &[usize]) -> CpuTensor<f64> {
    let n: usize = shape.iter().product();
    CpuTensor::from_vec((0..n).map(|i| i as f64).collect(), shape).unwrap()
}

#[test]
fn contiguous_is_a_fresh_dense_copy() {
    let x = iota(&[2, 3, 4]);
    let v = x.permute(&[2, 0, 1]).unwrap().narrow(0, 1, 2).unwrap();
    assert!(!v.is_contiguous());
    let c = cpu64().contiguous(&v).unwrap();
    assert!(c.is_contiguous());
    assert!(!c.shares_storage(&x));
    assert_eq!(c.shape(), &[2, 2, 3]);
    // c[a][b][d] = x[b][d][a + 1]
    let mut expect = Vec::new();
    for a in 0..2 {
        for b in 0..2 {
            for d in 0..3 {
                expect.push((b * 12 + d * 4 + a + 1) as f64);
            }
        }
    }
    assert_eq!(c.to_vec(), expect);
    // Even a dense input is copied, so writing the copy leaves the original alone.
    let d = cpu64().contiguous(&x).unwrap();
    cpu64().fill(&d, -1.0).unwrap();
    assert_eq!(x.to_vec()[0], 0.0);
}

/// The backward of split: each piece's gradient is copied into its window of a zero gradient.
#[rstest]
#[case(&[7, 193], 1, &[64, 64, 65])]
#[case(&[7, 193], 0, &[1, 6])]
#[case(&[2, 12, 768], 2, &[256, 256, 256])]
#[case(&[1, 1025], 1, &[1025])]
fn split_backward_via_copy_into(
    #[case] shape: &[usize],
    #[case] axis: usize,
    #[case] sizes: &[usize],
) {
    let x = iota(shape);
    let pieces = x.split(axis, sizes).unwrap();
    let grad = cpu64().zeros(shape).unwrap();
    let windows = grad.split(axis, sizes).unwrap();
    for (p, w) in pieces.iter().zip(&windows) {
        cpu64().copy_into(p, w).unwrap();
    }
    assert_eq!(grad.to_vec(), x.to_vec());
}

#[test]
fn copy_into_a_narrow_leaves_the_rest() {
    let dst = cpu32().zeros(&[3, 5]).unwrap();
    let src = CpuTensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2]).unwrap();
    cpu32()
        .copy_into(&src, &dst.narrow(1, 2, 2).unwrap())
        .unwrap();
    assert_eq!(
        dst.to_vec(),
        vec![
            0.0, 0.0, 1.0, 2.0, 0.0, 0.0, 0.0, 3.0, 4.0, 0.0, 0.0, 0.0, 5.0, 6.0, 0.0
        ]
    );
    // Source and destination may overlap in one storage: a shifted copy reads the old values.
    let x = CpuTensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[4]).unwrap();
    cpu32()
        .copy_into(&x.narrow(0, 0, 3).unwrap(), &x.narrow(0, 1, 3).unwrap())
        .unwrap();
    assert_eq!(x.to_vec(), vec![1.0, 1.0, 2.0, 3.0]);
}

#[test]
fn fill_a_transposed_window() {
    let x = cpu64().zeros(&[3, 4]).unwrap();
    let w = x.transpose(0, 1).unwrap().narrow(0, 1, 2).unwrap();
    cpu64().fill(&w, 7.0).unwrap();
    let v = x.to_vec();
    for r in 0..3 {
        assert_eq!(&v[r * 4..r * 4 + 4], &[0.0, 7.0, 7.0, 0.0]);
    }
}

#[test]
fn full_zeros_scalar_and_from_slice() {
    assert_eq!(cpu32().full(&[2, 2], 1.5).unwrap().to_vec(), vec![1.5; 4]);
    assert_eq!(cpu32().zeros(&[]).unwrap().to_vec(), vec![0.0]);
    assert_eq!(CpuTensor::scalar(2.0f32).shape(), &[] as &[usize]);
    let t = cpu64().upload(&[1.0, 2.0, 3.0], &[3, 1]).unwrap();
    assert_eq!(cpu64().download(&t).unwrap(), vec![1.0, 2.0, 3.0]);
    assert_eq!(t.dtype(), zcompute::DType::F64);
    assert_eq!(
        <zcompute::CpuBackend as Backend<f32>>::name(&zcompute::CpuBackend),
        "cpu"
    );
}
