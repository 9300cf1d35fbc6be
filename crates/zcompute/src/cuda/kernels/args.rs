//! Kernel arguments: the argument list type, the strided-operand encoding (axes merged by
//! [`coalesce`], then rank, sizes and strides per operand, decoded again by the simulated
//! kernels) and the check that a launch's arguments match its kernel's parameter list. Split
//! from the kernel-id table so the encoding and its tests read on their own.

use crate::error::{ComputeError, Result};
use smallvec::SmallVec;
use zdevice::{DevicePtr, KernelArg};

use Param::{F32, Ptr, U32, U64};

/// Kinds of kernel parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Param {
    Ptr,
    U32,
    U64,
    F32,
}

/// Most axes a strided kernel takes (`ZC_MAX_RANK` in `kernels/common.cuh`).
pub(crate) const MAX_RANK: usize = 6;

/// Whether `args` match a kernel's parameter list `params` (count and kinds), with the
/// strided tail of `strided` operands after them.
pub(crate) fn accepts(params: &[Param], strided: usize, args: &[KernelArg]) -> bool {
    let tail = if strided > 0 {
        1 + MAX_RANK * (1 + strided)
    } else {
        0
    };
    if args.len() != params.len() + tail {
        return false;
    }
    let kind = |a: &KernelArg| match a {
        KernelArg::Ptr(_) => Some(Ptr),
        KernelArg::U32(_) => Some(U32),
        KernelArg::U64(_) => Some(U64),
        KernelArg::F32(_) => Some(F32),
        _ => None,
    };
    let (head, rest) = args.split_at(params.len());
    head.iter().zip(params).all(|(a, p)| kind(a) == Some(*p))
        && rest
            .iter()
            .enumerate()
            .all(|(i, a)| kind(a) == Some(if i == 0 { U32 } else { U64 }))
}

/// A kernel argument list (strided kernels take up to 28).
pub(crate) type Args = SmallVec<[KernelArg; 32]>;

/// Merges axes that every operand walks as one (outer stride = inner stride * inner size) and
/// drops size-1 axes, so most views reach the kernels with rank 1-3. Returns the merged shape
/// and one stride vector per operand.
pub(crate) fn coalesce(shape: &[usize], strides: &[&[usize]]) -> (Vec<usize>, Vec<Vec<usize>>) {
    let mut out_shape: Vec<usize> = Vec::with_capacity(shape.len());
    let mut out_strides: Vec<Vec<usize>> = vec![Vec::with_capacity(shape.len()); strides.len()];
    for (ax, &d) in shape.iter().enumerate() {
        if d == 1 {
            continue;
        }
        let mergeable = !out_shape.is_empty()
            && strides.iter().zip(&out_strides).all(|(s, o)| {
                o.last()
                    .is_some_and(|&outer| Some(outer) == s[ax].checked_mul(d))
            });
        if mergeable {
            if let Some(last) = out_shape.last_mut() {
                *last *= d;
            }
            for (s, o) in strides.iter().zip(out_strides.iter_mut()) {
                if let Some(last) = o.last_mut() {
                    *last = s[ax];
                }
            }
        } else {
            out_shape.push(d);
            for (s, o) in strides.iter().zip(out_strides.iter_mut()) {
                o.push(s[ax]);
            }
        }
    }
    if out_shape.is_empty() {
        out_shape.push(1);
        for o in &mut out_strides {
            o.push(0);
        }
    }
    (out_shape, out_strides)
}

/// Appends the strided tail (rank, sizes, strides per operand) for `shape` and `strides`.
pub(crate) fn push_strided(
    op: &'static str,
    args: &mut Args,
    shape: &[usize],
    strides: &[&[usize]],
) -> Result<()> {
    let (shape, strides) = coalesce(shape, strides);
    if shape.len() > MAX_RANK {
        return Err(ComputeError::Unsupported {
            op,
            reason: format!(
                "a view of {} axes that cannot be merged (at most {MAX_RANK}); make it contiguous in steps",
                shape.len()
            ),
        });
    }
    let padded = |v: &[usize]| {
        let mut a = [0u64; MAX_RANK];
        for (x, &y) in a.iter_mut().zip(v) {
            *x = y as u64;
        }
        a
    };
    args.push(KernelArg::U32(shape.len() as u32));
    let dims = padded(&shape);
    // Unused axes have size 1 so the kernel's index arithmetic never divides by zero.
    for (i, d) in dims.iter().enumerate() {
        args.push(KernelArg::U64(if i < shape.len() { *d } else { 1 }));
    }
    for s in &strides {
        args.extend(padded(s).iter().map(|&x| KernelArg::U64(x)));
    }
    Ok(())
}

/// Decodes a strided tail (for the simulated kernels): shape and the per-operand strides.
pub(crate) fn read_strided(
    rest: &[KernelArg],
    operands: usize,
) -> Option<(Vec<u64>, Vec<Vec<u64>>)> {
    let u = |a: &KernelArg| match a {
        KernelArg::U64(v) => Some(*v),
        KernelArg::U32(v) => Some(u64::from(*v)),
        _ => None,
    };
    if rest.len() != 1 + MAX_RANK * (1 + operands) {
        return None;
    }
    let rank = usize::try_from(u(&rest[0])?).ok()?.min(MAX_RANK);
    let shape = rest[1..=rank].iter().map(u).collect::<Option<Vec<_>>>()?;
    let mut strides = Vec::with_capacity(operands);
    for k in 0..operands {
        let start = 1 + MAX_RANK * (1 + k);
        strides.push(
            rest[start..start + rank]
                .iter()
                .map(u)
                .collect::<Option<Vec<_>>>()?,
        );
    }
    Some((shape, strides))
}

pub(crate) fn ptr(p: DevicePtr) -> KernelArg {
    KernelArg::Ptr(p)
}

pub(crate) fn u64a(n: usize) -> KernelArg {
    KernelArg::U64(n as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coalesce_merges_dense_axes_and_drops_ones() {
        let (s, st) = coalesce(&[2, 3, 4], &[&[12, 4, 1]]);
        assert_eq!((s, st), (vec![24], vec![vec![1]]));
        // A transposed view does not merge.
        let (s, st) = coalesce(&[4, 3], &[&[1, 4]]);
        assert_eq!((s, st), (vec![4, 3], vec![vec![1, 4]]));
        // Broadcast operand: the stride-0 axis stays separate for it, so nothing merges.
        let (s, st) = coalesce(&[2, 1, 3], &[&[3, 3, 1], &[0, 0, 1]]);
        assert_eq!((s, st), (vec![2, 3], vec![vec![3, 1], vec![0, 1]]));
        let (s, st) = coalesce(&[], &[&[]]);
        assert_eq!((s, st), (vec![1], vec![vec![0]]));
    }
}
