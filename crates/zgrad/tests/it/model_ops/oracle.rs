//! Every op's output and gradients against PyTorch in float64 (`ops_oracle.safetensors`), by
//! the relative error of each tensor (‖ours − oracle‖ / ‖oracle‖).

use crate::support::fixtures::fixture;
use zcompute::{BTensor, Element, prelude::*};
use zgrad::{GradError, Tape, TensorFile, Var, read_tensors};

pub(crate) struct Oracle<'b, B: Ops<T>, T: Element> {
    pub b: &'b B,
    pub f: TensorFile<f64>,
    pub tol: f64,
    _t: std::marker::PhantomData<T>,
}

fn rel(got: &[f64], want: &[f64]) -> f64 {
    let d: f64 = got.iter().zip(want).map(|(a, b)| (a - b) * (a - b)).sum();
    let n: f64 = want.iter().map(|b| b * b).sum();
    d.sqrt() / n.sqrt().max(f64::MIN_POSITIVE)
}

impl<'b, B: Ops<T>, T: Element> Oracle<'b, B, T> {
    pub fn new(b: &'b B, tol: f64) -> Self {
        Oracle {
            b,
            f: read_tensors(&fixture("ops_oracle.safetensors")).expect("ops_oracle.safetensors"),
            tol,
            _t: std::marker::PhantomData,
        }
    }

    pub fn tensor(&self, name: &str) -> BTensor<B, T> {
        let t = &self.f.tensors[name];
        let data: Vec<T> = t.data.iter().map(|&v| T::from_f64(v)).collect();
        self.b.upload(&data, &t.shape).unwrap()
    }

    pub fn constant(&self, name: &str) -> Var<B, T> {
        Var::constant(self.tensor(name))
    }

    pub fn param(&self, name: &str) -> Var<B, T> {
        Var::parameter(self.b, self.tensor(name)).unwrap()
    }

    /// `got` against the oracle's `name`, shape and values.
    pub fn check(&self, got: &BTensor<B, T>, name: &str) {
        let want = &self.f.tensors[name];
        assert_eq!(got.shape(), &want.shape[..], "{name}: shape");
        let got: Vec<f64> = self
            .b
            .download(got)
            .unwrap()
            .iter()
            .map(|v| v.to_f64())
            .collect();
        let e = rel(&got, &want.data);
        assert!(
            e <= self.tol,
            "{name}: relative error {e:e} > {:e}",
            self.tol
        );
    }

    /// `sum(out * w)` backward, then `out` and each named gradient against the oracle.
    pub fn backward_and_check(
        &self,
        tape: &Tape<'_, B, T>,
        prefix: &str,
        out: &Var<B, T>,
        grads: &[(&str, &Var<B, T>)],
    ) {
        let w = self.constant(&format!("{prefix}.w"));
        let loss = tape.sum_all(&tape.mul(out, &w).unwrap()).unwrap();
        tape.backward(&loss).unwrap();
        self.check(out.value(), &format!("{prefix}.out"));
        for (name, v) in grads {
            self.check(
                v.grad().expect("a gradient"),
                &format!("{prefix}.grad.{name}"),
            );
        }
    }
}

/// Every op of this module against the oracle on `b`.
pub(crate) fn every_op_matches_pytorch<B: Ops<T>, T: Element>(b: &B, tol: f64) {
    // A device backend's backward allocates scratch: one step open for the whole check.
    b.begin_step().unwrap();
    let o = Oracle::new(b, tol);
    let tape = Tape::new(b);

    let (a, bb, c) = (
        o.param("concat.a"),
        o.param("concat.b"),
        o.param("concat.c"),
    );
    let y = tape.concat(&[&a, &bb, &c], 1).unwrap();
    o.backward_and_check(&tape, "concat", &y, &[("a", &a), ("b", &bb), ("c", &c)]);

    let tape = Tape::new(b);
    let (a, bb) = (o.param("select.a"), o.param("select.b"));
    let y = tape.select(&o.constant("select.cond"), &a, &bb).unwrap();
    o.backward_and_check(&tape, "select", &y, &[("a", &a), ("b", &bb)]);

    let tape = Tape::new(b);
    let x = o.param("masked_fill.x");
    let mask = o.constant("masked_fill.mask");
    let filled = tape
        .masked_fill(&x, &mask, T::from_f64(f64::NEG_INFINITY))
        .unwrap();
    let want = &o.f.tensors["masked_fill.filled"].data;
    let got = b.download(filled.value()).unwrap();
    for (g, w) in got.iter().zip(want) {
        // -inf exactly where masked, the input elsewhere.
        assert!(
            g.to_f64() == *w || (w.is_finite() && (g.to_f64() - w).abs() <= tol * w.abs().max(1.0)),
            "{g:?} vs {w}"
        );
    }
    let y = tape.softmax_last(&filled).unwrap();
    o.backward_and_check(&tape, "masked_fill", &y, &[("x", &x)]);

    let tape = Tape::new(b);
    let x = o.param("abs.x");
    let y = tape.abs(&x).unwrap();
    o.backward_and_check(&tape, "abs", &y, &[("x", &x)]);

    let tape = Tape::new(b);
    let (a, bb) = (o.param("minimum.a"), o.param("minimum.b"));
    let y = tape.minimum(&a, &bb).unwrap();
    o.backward_and_check(&tape, "minimum", &y, &[("a", &a), ("b", &bb)]);

    let tape = Tape::new(b);
    let x = o.param("min.x");
    let y = tape.min(&x, 1, false).unwrap();
    o.backward_and_check(&tape, "min", &y, &[("x", &x)]);

    let tape = Tape::new(b);
    let idx = tape.argmax(&o.constant("argmax.x")).unwrap();
    assert!(!idx.requires_grad());
    let got: Vec<f64> = b
        .download(idx.value())
        .unwrap()
        .iter()
        .map(|v| v.to_f64())
        .collect();
    assert_eq!(
        got, o.f.tensors["argmax.out"].data,
        "argmax: exact indices, first of a tie"
    );

    let tape = Tape::new(b);
    let x = o.param("silu.x");
    let y = tape.silu(&x).unwrap();
    o.backward_and_check(&tape, "silu", &y, &[("x", &x)]);

    for corr in [0, 1] {
        let p = format!("var_mean{corr}");
        let tape = Tape::new(b);
        let x = o.param(&format!("{p}.x"));
        let (v, m) = tape.var_mean(&x, 1, false, corr == 1).unwrap();
        let lv = tape.mul(&v, &o.constant(&format!("{p}.wv"))).unwrap();
        let lm = tape.mul(&m, &o.constant(&format!("{p}.wm"))).unwrap();
        let loss = tape
            .add(&tape.sum_all(&lv).unwrap(), &tape.sum_all(&lm).unwrap())
            .unwrap();
        tape.backward(&loss).unwrap();
        o.check(v.value(), &format!("{p}.var"));
        o.check(m.value(), &format!("{p}.mean"));
        o.check(x.grad().unwrap(), &format!("{p}.grad.x"));
    }

    let tape = Tape::new(b);
    let (x, w) = (o.param("rms_norm.x"), o.param("rms_norm.weight"));
    let y = tape.rms_norm(&x, Some(&w), T::from_f64(1e-6)).unwrap();
    o.backward_and_check(&tape, "rms_norm", &y, &[("x", &x), ("weight", &w)]);

    let tape = Tape::new(b);
    let table = o.param("embedding.table");
    let y = tape
        .embedding(&table, &o.tensor("embedding.index"))
        .unwrap();
    o.backward_and_check(&tape, "embedding", &y, &[("table", &table)]);

    let tape = Tape::new(b);
    let (q, k, v) = (
        o.param("attention.q"),
        o.param("attention.k"),
        o.param("attention.v"),
    );
    let keep = o.constant("attention.keep");
    let scale = T::from_f64(8f64.powf(-0.5));
    let y = tape.masked_attention(&q, &k, &v, &keep, scale).unwrap();
    o.backward_and_check(&tape, "attention", &y, &[("q", &q), ("k", &k), ("v", &v)]);
    // Sample 1 has every key padded: zeros, not NaN.
    let out = b.download(&y.value().narrow(0, 1, 1).unwrap()).unwrap();
    assert!(
        out.iter().all(|v| *v == T::ZERO),
        "an all-padding row is zeros"
    );

    let tape = Tape::new(b);
    let x = o.param("softplus.x");
    let y = tape.custom(super::custom::Softplus, &[&x]).unwrap();
    o.backward_and_check(&tape, "softplus", &y, &[("x", &x)]);
    b.end_step().unwrap();
}

#[test]
fn every_op_matches_pytorch_on_the_cpu_in_f64() {
    // The composites (softplus's log(1 + exp(-|x|)), RMSNorm's rsqrt) cost a few ulps.
    every_op_matches_pytorch::<_, f64>(&zcompute::CpuBackend, 1e-11);
}

#[test]
fn every_op_matches_pytorch_on_the_cpu_in_f32() {
    every_op_matches_pytorch::<_, f32>(&zcompute::CpuBackend, 2e-6);
}

#[test]
fn every_op_matches_pytorch_on_the_simulated_device() {
    every_op_matches_pytorch::<_, f32>(&super::sim(), 2e-6);
}

#[cfg(feature = "gpu")]
#[test]
fn every_op_matches_pytorch_on_the_gpu() {
    every_op_matches_pytorch::<_, f32>(&super::gpu(), 2e-6);
}

/// An index naming no row of the table: a typed error on the CPU, forward and backward.
#[test]
fn an_embedding_index_out_of_range_is_a_typed_error_on_the_cpu() {
    let b = zcompute::CpuBackend;
    let table = Var::parameter(&b, b.upload(&[1.0f32; 8], &[4, 2]).unwrap()).unwrap();
    for bad in [4.0f32, -1.0, 0.5, f32::NAN] {
        let tape = Tape::new(&b);
        let index = b.upload(&[0.0, bad], &[2]).unwrap();
        let e = tape.embedding(&table, &index).unwrap_err();
        assert!(
            matches!(
                e,
                GradError::Compute(zcompute::ComputeError::IndexOutOfRange {
                    position: 1,
                    rows: 4,
                    ..
                })
            ),
            "{e}"
        );
    }
    let src = b.upload(&[1.0f32; 4], &[2, 2]).unwrap();
    let dst = b.zeros(&[4, 2]).unwrap();
    let index = b.upload(&[1.0f32, 9.0], &[2]).unwrap();
    let e = b.index_add_rows(&src, &index, &dst).unwrap_err();
    assert!(
        matches!(
            e,
            zcompute::ComputeError::IndexOutOfRange { position: 1, .. }
        ),
        "{e}"
    );
    assert_eq!(b.download(&dst).unwrap(), vec![0.0; 8], "nothing written");
}

/// On the device an index naming no row reads no other row: the gathered row is NaN.
#[test]
fn an_embedding_index_out_of_range_is_nan_on_the_simulated_device() {
    let b = super::sim();
    let table = Var::parameter(&b, b.upload(&[1.0f32; 8], &[4, 2]).unwrap()).unwrap();
    b.begin_step().unwrap();
    let tape = Tape::new(&b);
    let y = tape
        .embedding(&table, &b.upload(&[2.0, 4.0], &[2]).unwrap())
        .unwrap();
    let got = b.download(y.value()).unwrap();
    assert_eq!(&got[..2], &[1.0, 1.0]);
    assert!(got[2..].iter().all(|v| v.is_nan()), "{got:?}");
}
