//! Softmax and LayerNorm over the last axis, against the f64 run and direct formulas.

use crate::common::{
    assert_f32_matches, assert_matches_formula, cpu32, cpu64, numel, pair, rand_pair,
};
use rstest::rstest;
use zcompute::Backend;

fn softmax_formula(v: &[f64], n: usize) -> Vec<f64> {
    v.chunks(n)
        .flat_map(|row| {
            let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = row.iter().map(|x| (x - max).exp()).collect();
            let s: f64 = e.iter().sum();
            e.into_iter().map(move |x| x / s)
        })
        .collect()
}

#[rstest]
#[case(&[1])]
#[case(&[7])]
#[case(&[1, 1025])]
#[case(&[7, 193])]
#[case(&[3, 4, 12])]
#[case(&[5, 1])]
fn softmax_matches(#[case] shape: &[usize], #[values(1.0, 60.0)] scale: f64) {
    // scale 60 puts logits up to ±120: exp would overflow f32 without the max shift.
    let v: Vec<f64> = crate::common::uniform(numel(shape), 41, -2.0, 2.0)
        .into_iter()
        .map(|x| x * scale)
        .collect();
    let (x32, x64) = pair(&v, shape);
    let y32 = cpu32().softmax_last(&x32).unwrap();
    let y64 = cpu64().softmax_last(&x64).unwrap();
    assert!(y32.to_vec().iter().all(|v| v.is_finite()));
    assert_f32_matches("softmax", &y32, &y64);
    let formula = softmax_formula(&x64.to_vec(), shape[shape.len() - 1]);
    assert_matches_formula("softmax", &y32, &y64, &formula);
}

#[rstest]
#[case(&[1], false)]
#[case(&[7], true)]
#[case(&[1, 193], true)]
#[case(&[7, 193], false)]
#[case(&[2, 1025], true)]
#[case(&[4, 12, 64], true)]
fn layer_norm_matches(#[case] shape: &[usize], #[case] affine: bool) {
    let n = shape[shape.len() - 1];
    // An offset mean (x + 3) exercises the two-pass variance.
    let v: Vec<f64> = crate::common::uniform(numel(shape), 51, 1.0, 5.0);
    let (x32, x64) = pair(&v, shape);
    let (w32, w64) = rand_pair(&[n], 52);
    let (b32, b64) = rand_pair(&[n], 53);
    let eps = 1e-5;
    let (wo32, bo32) = if affine {
        (Some(&w32), Some(&b32))
    } else {
        (None, None)
    };
    let (wo64, bo64) = if affine {
        (Some(&w64), Some(&b64))
    } else {
        (None, None)
    };
    let r32 = cpu32().layer_norm(&x32, wo32, bo32, eps as f32).unwrap();
    let r64 = cpu64().layer_norm(&x64, wo64, bo64, eps).unwrap();
    let mut stat_shape = shape.to_vec();
    stat_shape[shape.len() - 1] = 1;
    assert_eq!(r32.mean.shape(), stat_shape.as_slice());
    assert_eq!(r32.rstd.shape(), stat_shape.as_slice());
    assert_f32_matches("ln out", &r32.out, &r64.out);
    assert_f32_matches("ln mean", &r32.mean, &r64.mean);
    assert_f32_matches("ln rstd", &r32.rstd, &r64.rstd);

    let (xv, wv, bv) = (x64.to_vec(), w64.to_vec(), b64.to_vec());
    let (mut out, mut means, mut rstds) = (Vec::new(), Vec::new(), Vec::new());
    for row in xv.chunks(n) {
        let mean = row.iter().sum::<f64>() / n as f64;
        let var = row.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        let rstd = 1.0 / (var + eps).sqrt();
        for (j, x) in row.iter().enumerate() {
            let y = (x - mean) * rstd;
            out.push(if affine { y * wv[j] + bv[j] } else { y });
        }
        means.push(mean);
        rstds.push(rstd);
    }
    assert_matches_formula("ln out", &r32.out, &r64.out, &out);
    assert_matches_formula("ln mean", &r32.mean, &r64.mean, &means);
    assert_matches_formula("ln rstd", &r32.rstd, &r64.rstd, &rstds);
}
