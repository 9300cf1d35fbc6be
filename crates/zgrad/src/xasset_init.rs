//! XAsset's initial parameter values on the host, in parameter order: PyTorch's defaults drawn
//! from one `SplitMix64` stream in the order the `nn` modules' `init` draws them (emb, then per
//! block qkv, o, f1, f2, then head: each Linear's weight then its bias, uniform in
//! ±1/sqrt(in); LayerNorm weights 1 and biases 0), so the model is built in one upload into its
//! flat buffer with the same values as composing the modules' own `init`. With one block the
//! stream is the one the model has always drawn (bit for bit).

use crate::rng::SplitMix64;
use crate::xasset::XAssetConfig;

/// Every parameter's values, in `XAssetConfig::parameter_names` order.
pub(crate) fn init_values(c: &XAssetConfig, seed: u64) -> Vec<Vec<f64>> {
    let mut rng = SplitMix64::new(seed);
    let (f, d, ff) = (c.features, c.width, c.ff);
    let dh = d / c.heads.max(1);
    let mut out = Vec::with_capacity(4 + 16 * c.layers);
    let mut linear = |out: &mut Vec<Vec<f64>>, inputs: usize, outputs: usize| {
        let bound = 1.0 / (inputs as f64).sqrt();
        out.push(rng.uniform_vec(inputs * outputs, -bound, bound));
        out.push(rng.uniform_vec(outputs, -bound, bound));
    };
    let ln = |out: &mut Vec<Vec<f64>>, n: usize| {
        out.push(vec![1.0; n]);
        out.push(vec![0.0; n]);
    };
    linear(&mut out, f, d); // emb
    for _ in 0..c.layers {
        ln(&mut out, d); // ln1
        linear(&mut out, d, 3 * d); // qkv
        ln(&mut out, dh); // qn
        ln(&mut out, dh); // kn
        linear(&mut out, d, d); // o
        ln(&mut out, d); // ln2
        linear(&mut out, d, ff); // f1
        linear(&mut out, ff, d); // f2
    }
    linear(&mut out, d, 1); // head
    out
}
