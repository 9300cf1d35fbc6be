//! The losses of issue 40 (BCE with logits, softmax cross-entropy with class indices and with
//! soft targets, MSE, Huber; each unweighted and weighted) against the float64 oracle
//! `tests/fixtures/losses_oracle.safetensors` (`tests/fixtures/make_losses.py`): the loss
//! and its gradient, on the CPU backend in f64 and f32 and on the simulated device (f32).

use crate::support::fixtures::fixture;
use zcompute::{CpuBackend, Element, Engine, prelude::*};
use zgrad::{HostTensor, Tape, Var, in_step, read_tensors};

type Oracle = std::collections::HashMap<String, HostTensor<f64>>;

fn oracle() -> Oracle {
    read_tensors::<f64>(&fixture("losses_oracle.safetensors"))
        .expect("losses oracle (make_losses.py)")
        .tensors
        .into_iter()
        .collect()
}

/// Which loss a case runs on (prediction, target, weights).
#[derive(Clone, Copy, Debug)]
enum Loss {
    Bce,
    CeIndices,
    CeSoft,
    Mse,
    Huber,
}

const CASES: [(Loss, &str, &str, &str, &str); 5] = [
    (Loss::Bce, "bce", "bce.logits", "bce.targets", "bce.weights"),
    (
        Loss::CeIndices,
        "ce_indices",
        "ce.logits",
        "ce.indices",
        "ce.weights",
    ),
    (
        Loss::CeSoft,
        "ce_soft",
        "ce.logits",
        "ce.soft",
        "ce.weights",
    ),
    (Loss::Mse, "mse", "reg.pred", "reg.target", "reg.weights"),
    (
        Loss::Huber,
        "huber",
        "reg.pred",
        "reg.target",
        "reg.weights",
    ),
];

fn run<B: Ops<T>, T: Element>(b: &B, tol: f64) {
    let o = oracle();
    let host = |name: &str| -> (&[usize], Vec<T>) {
        let t = &o[name];
        (&t.shape, t.data.iter().map(|&v| T::from_f64(v)).collect())
    };
    for (loss, tag, pred, target, weights) in CASES {
        for weighted in [false, true] {
            let (ps, pv) = host(pred);
            let p = Var::parameter_from(b, &pv, ps).expect("prediction");
            let (ts, tv) = host(target);
            let t = Var::constant(b.upload(&tv, ts).expect("target"));
            let (ws, wv) = host(weights);
            let w = Var::constant(b.upload(&wv, ws).expect("weights"));
            let w = weighted.then_some(&w);
            // In a step scope: the device backend refuses scratch memory outside one.
            let (got, rank) = in_step(b, || {
                let tape = Tape::new(b);
                let l = match loss {
                    Loss::Bce => tape.bce_weighted(&p, &t, w),
                    Loss::CeIndices => tape.cross_entropy_indices(&p, &t, w),
                    Loss::CeSoft => tape.cross_entropy_weighted(&p, &t, w),
                    Loss::Mse => tape.mse_weighted(&p, &t, w),
                    Loss::Huber => tape.huber(&p, &t, 1.0, w),
                }?;
                tape.backward(&l)?;
                Ok((l.to_vec(b)?[0].to_f64(), l.shape().len()))
            })
            .expect("loss and backward");
            assert_eq!(rank, 0, "{tag}: a loss is rank 0");
            let prefix = if weighted { "weighted_" } else { "" };
            let want = o[&format!("{prefix}{tag}.loss")].data[0];
            assert!(
                (got - want).abs() <= tol * want.abs().max(1.0),
                "{prefix}{tag}: loss {got} vs {want}"
            );
            let want = &o[&format!("{prefix}{tag}.grad")].data;
            let grad = b.download(p.grad().expect("gradient")).expect("download");
            assert_eq!(grad.len(), want.len());
            for (i, (g, w)) in grad.iter().zip(want).enumerate() {
                let g = g.to_f64();
                assert!(
                    (g - w).abs() <= tol * w.abs().max(1e-3),
                    "{prefix}{tag}: grad[{i}] {g} vs {w}"
                );
            }
        }
    }
}

#[test]
fn losses_match_the_float64_oracle_on_the_cpu_in_f64() {
    run::<_, f64>(&CpuBackend, 1e-12);
}

#[test]
fn losses_match_the_float64_oracle_on_the_cpu_in_f32() {
    run::<_, f32>(&CpuBackend, 2e-5);
}

#[test]
fn losses_match_the_float64_oracle_on_the_simulated_device() {
    run::<_, f32>(&Engine::sim(256 << 20).expect("sim"), 2e-5);
}
