//! Property tests of the view algebra: a chain of views equals the same chain applied with a
//! dense copy after every step (so composed layouts are right), and `contiguous` of any view is
//! the element-by-element gather through `offset_of`.

use crate::common::cpu64;
use proptest::prelude::*;
use zcompute::{Backend, CpuTensor};

#[derive(Clone, Debug)]
enum ViewOp {
    Permute(u64),
    Transpose(usize, usize),
    Narrow(usize, usize, usize),
    /// Merge the first two axes (only applied when the current view is contiguous).
    Flatten2,
    /// Insert an axis at `.0` and broadcast it to `.1`.
    Expand(usize, usize),
}

fn view_op() -> impl Strategy<Value = ViewOp> {
    prop_oneof![
        any::<u64>().prop_map(ViewOp::Permute),
        (0..8usize, 0..8usize).prop_map(|(a, b)| ViewOp::Transpose(a, b)),
        (0..8usize, 0..8usize, 0..8usize).prop_map(|(a, s, l)| ViewOp::Narrow(a, s, l)),
        Just(ViewOp::Flatten2),
        (0..8usize, 1..4usize).prop_map(|(a, k)| ViewOp::Expand(a, k)),
    ]
}

/// Applies `op` to `x`, choosing parameters valid for `x`'s shape. `view_contiguous` decides
/// whether a reshape is applied, so both chains take the same decisions.
fn apply(x: &CpuTensor<f64>, op: &ViewOp, view_contiguous: bool) -> Option<CpuTensor<f64>> {
    let rank = x.rank();
    let shape = x.shape().to_vec();
    Some(match *op {
        ViewOp::Permute(seed) => {
            let mut perm: Vec<usize> = (0..rank).collect();
            let mut s = seed;
            for i in (1..rank).rev() {
                s = s.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                perm.swap(i, (s >> 33) as usize % (i + 1));
            }
            x.permute(&perm).unwrap()
        }
        ViewOp::Transpose(a, b) => x.transpose(a % rank, b % rank).unwrap(),
        ViewOp::Narrow(a, s, l) => {
            let axis = a % rank;
            let size = shape[axis];
            let start = s % (size + 1);
            let len = l % (size - start + 1);
            x.narrow(axis, start, len).unwrap()
        }
        ViewOp::Flatten2 => {
            if rank < 2 || !view_contiguous {
                return None;
            }
            let mut to = vec![shape[0] * shape[1]];
            to.extend_from_slice(&shape[2..]);
            x.reshape(&to).unwrap()
        }
        ViewOp::Expand(a, k) => {
            if rank >= 5 {
                return None;
            }
            let axis = a % (rank + 1);
            let u = x.unsqueeze(axis).unwrap();
            let mut to = u.shape().to_vec();
            to[axis] = k;
            u.broadcast_to(&to).unwrap()
        }
    })
}

fn base(shape: &[usize]) -> CpuTensor<f64> {
    let n: usize = shape.iter().product();
    CpuTensor::from_vec((0..n).map(|i| i as f64).collect(), shape).unwrap()
}

/// Every multi-index of `shape`, row-major.
fn indices(shape: &[usize]) -> Vec<Vec<usize>> {
    let n: usize = shape.iter().product();
    let mut out = Vec::with_capacity(n);
    let mut idx = vec![0usize; shape.len()];
    for _ in 0..n {
        out.push(idx.clone());
        for ax in (0..shape.len()).rev() {
            idx[ax] += 1;
            if idx[ax] < shape[ax] {
                break;
            }
            idx[ax] = 0;
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn view_of_view_equals_composed_view(
        shape in prop::collection::vec(0..5usize, 1..4),
        ops in prop::collection::vec(view_op(), 0..6),
    ) {
        let mut view = base(&shape);
        let mut dense = base(&shape);
        for op in &ops {
            let Some(v) = apply(&view, op, view.is_contiguous()) else { continue };
            let d = apply(&dense, op, view.is_contiguous()).expect("same decision");
            view = v;
            dense = cpu64().contiguous(&d).unwrap();
            prop_assert_eq!(view.shape(), dense.shape());
        }
        prop_assert_eq!(view.to_vec(), dense.to_vec());
        if let Some(max) = view.layout().max_offset() {
            prop_assert!(max < shape.iter().product::<usize>());
        }
    }

    #[test]
    fn contiguous_equals_gather(
        shape in prop::collection::vec(0..5usize, 1..4),
        ops in prop::collection::vec(view_op(), 0..6),
    ) {
        let x = base(&shape);
        let mut view = x.clone();
        for op in &ops {
            if let Some(v) = apply(&view, op, view.is_contiguous()) {
                view = v;
            }
        }
        let storage = x.to_vec();
        let gathered: Vec<f64> = indices(view.shape())
            .iter()
            .map(|i| storage[view.layout().offset_of(i).unwrap()])
            .collect();
        let c = cpu64().contiguous(&view).unwrap();
        prop_assert!(c.is_contiguous());
        prop_assert_eq!(c.to_vec(), gathered.clone());
        prop_assert_eq!(view.layout().offsets().len(), gathered.len());
    }

    #[test]
    fn copy_into_writes_exactly_the_view(
        shape in prop::collection::vec(1..5usize, 1..4),
        ops in prop::collection::vec(view_op(), 0..5),
    ) {
        let dst = cpu64().zeros(&shape).unwrap();
        let mut view = dst.clone();
        for op in &ops {
            // Broadcast views cannot be written; keep the rest.
            if matches!(op, ViewOp::Expand(..)) { continue; }
            if let Some(v) = apply(&view, op, view.is_contiguous()) {
                view = v;
            }
        }
        let n = view.numel();
        let src = CpuTensor::from_vec((1..=n).map(|i| i as f64).collect(), view.shape()).unwrap();
        cpu64().copy_into(&src, &view).unwrap();
        prop_assert_eq!(view.to_vec(), src.to_vec());
        let written = dst.to_vec().iter().filter(|&&v| v != 0.0).count();
        prop_assert_eq!(written, n);
    }
}
