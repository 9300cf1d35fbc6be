//! Batched matrix products with transposes and broadcast batch axes.

use crate::common::{assert_f32_matches, assert_matches_formula, cpu32, cpu64, rand_pair};
use rstest::rstest;
use zcompute::{Backend, MatmulOpts};

/// Stored shape of an operand: `[batch.., r, c]`, with `(r, c)` swapped when transposed.
fn stored(batch: &[usize], r: usize, c: usize, trans: bool) -> Vec<usize> {
    let mut s = batch.to_vec();
    s.extend(if trans { [c, r] } else { [r, c] });
    s
}

#[rstest]
#[case(1, 1, 1, &[], &[])]
#[case(7, 193, 5, &[], &[])]
#[case(33, 1025, 7, &[2], &[])]
#[case(12, 64, 12, &[1], &[3])]
#[case(5, 7, 193, &[2, 1], &[1, 3])]
#[case(1, 256, 1, &[4], &[4])]
fn matmul_matches(
    #[case] m: usize,
    #[case] k: usize,
    #[case] n: usize,
    #[case] batch_a: &[usize],
    #[case] batch_b: &[usize],
    #[values(false, true)] trans_a: bool,
    #[values(false, true)] trans_b: bool,
) {
    let sa = stored(batch_a, m, k, trans_a);
    let sb = stored(batch_b, k, n, trans_b);
    let (a32, a64) = rand_pair(&sa, 61);
    let (b32, b64) = rand_pair(&sb, 62);
    let opts = MatmulOpts { trans_a, trans_b };
    let y32 = cpu32().matmul(&a32, &b32, opts).unwrap();
    let y64 = cpu64().matmul(&a64, &b64, opts).unwrap();
    let batch = zcompute::broadcast_shapes("t", batch_a, batch_b).unwrap();
    let mut out_shape = batch.to_vec();
    out_shape.extend([m, n]);
    assert_eq!(y32.shape(), out_shape.as_slice());
    assert_f32_matches("matmul", &y32, &y64);

    // Triple loop; batch index mapped by hand for the cases above (batch rank <= 2).
    let (av, bv) = (a64.to_vec(), b64.to_vec());
    let nb: usize = batch.iter().product();
    let bidx = |own: &[usize], flat: usize| -> usize {
        // Unravel `flat` over `batch`, then ravel over `own` with size-1 axes pinned to 0.
        let mut rem = flat;
        let mut coords = vec![0; batch.len()];
        for ax in (0..batch.len()).rev() {
            coords[ax] = rem % batch[ax];
            rem /= batch[ax];
        }
        let lead = batch.len() - own.len();
        own.iter().enumerate().fold(0, |acc, (i, &d)| {
            acc * d + if d == 1 { 0 } else { coords[lead + i] }
        })
    };
    let mut formula = Vec::new();
    for bi in 0..nb {
        let (oa, ob) = (bidx(batch_a, bi) * m * k, bidx(batch_b, bi) * k * n);
        for i in 0..m {
            for j in 0..n {
                let mut s = 0.0;
                for p in 0..k {
                    let x = if trans_a {
                        av[oa + p * m + i]
                    } else {
                        av[oa + i * k + p]
                    };
                    let y = if trans_b {
                        bv[ob + j * k + p]
                    } else {
                        bv[ob + p * n + j]
                    };
                    s += x * y;
                }
                formula.push(s);
            }
        }
    }
    assert_matches_formula("matmul", &y32, &y64, &formula);
}

#[test]
fn matmul_of_views_and_empty_k() {
    // A transposed view as operand equals the trans flag on the stored tensor.
    let (a32, _) = rand_pair(&[7, 5], 71);
    let (b32, _) = rand_pair(&[7, 3], 72);
    let via_view = cpu32()
        .matmul(&a32.transpose(0, 1).unwrap(), &b32, MatmulOpts::default())
        .unwrap();
    let via_flag = cpu32()
        .matmul(
            &a32,
            &b32,
            MatmulOpts {
                trans_a: true,
                trans_b: false,
            },
        )
        .unwrap();
    assert_eq!(via_view.to_vec(), via_flag.to_vec());
    // k = 0 gives zeros, as the empty sum.
    let a = zcompute::CpuTensor::<f32>::from_vec(vec![], &[2, 0]).unwrap();
    let b = zcompute::CpuTensor::<f32>::from_vec(vec![], &[0, 3]).unwrap();
    let y = cpu32().matmul(&a, &b, MatmulOpts::default()).unwrap();
    assert_eq!(y.to_vec(), vec![0.0; 6]);
}
