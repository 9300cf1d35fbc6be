//! A user's own op through `CustomOp`: softplus, `log(1 + exp(x))`, written once over any
//! backend's ops (it runs on the CPU, the simulated device and the GPU, eagerly and captured),
//! and once more for the CPU alone with host loops (the per-backend form). Its gradient against
//! PyTorch is in `oracle.rs`; here: the two forms agree, per-sample equals batched, and captured
//! equals eager bitwise.

use zcompute::{
    BTensor, BinaryOp, Capture, CpuBackend, CpuTensor, Element, ScalarSide, UnaryOp, prelude::*,
};
use zgrad::{CustomOp, Tape, Var};

// guide: begin custom-op
/// Softplus from the op set: `relu(x) + log(1 + exp(-|x|))`, stable for any `x`; its
/// derivative is `sigmoid(x)`.
pub struct Softplus;

impl<B: Ops<T>, T: Element> CustomOp<B, T> for Softplus {
    fn name(&self) -> &'static str {
        "softplus"
    }

    fn forward(&self, b: &B, inputs: &[&BTensor<B, T>]) -> zcompute::Result<BTensor<B, T>> {
        let x = inputs[0];
        let abs = b.maximum(x, &b.unary(UnaryOp::Neg, x)?)?;
        let e = b.unary(UnaryOp::Exp, &b.unary(UnaryOp::Neg, &abs)?)?;
        let l = b.unary(
            UnaryOp::Log,
            &b.binary_scalar(BinaryOp::Add, &e, T::ONE, ScalarSide::Rhs)?,
        )?;
        b.add(&b.unary(UnaryOp::Relu, x)?, &l)
    }

    fn backward(
        &self,
        b: &B,
        inputs: &[&BTensor<B, T>],
        _output: &BTensor<B, T>,
        grad: &BTensor<B, T>,
    ) -> zcompute::Result<Vec<Option<BTensor<B, T>>>> {
        Ok(vec![Some(
            b.mul(grad, &b.unary(UnaryOp::Sigmoid, inputs[0])?)?,
        )])
    }
}
// guide: end custom-op

/// The same op for the CPU backend only, as host loops (`ln_1p`): a backend-specific form.
pub struct HostSoftplus;

impl CustomOp<CpuBackend, f64> for HostSoftplus {
    fn name(&self) -> &'static str {
        "host_softplus"
    }

    fn forward(
        &self,
        _: &CpuBackend,
        inputs: &[&CpuTensor<f64>],
    ) -> zcompute::Result<CpuTensor<f64>> {
        let x = inputs[0];
        let y = x
            .to_vec()
            .iter()
            .map(|v| v.max(0.0) + (-v.abs()).exp().ln_1p())
            .collect();
        CpuTensor::from_vec(y, x.shape())
    }

    fn backward(
        &self,
        _: &CpuBackend,
        inputs: &[&CpuTensor<f64>],
        _output: &CpuTensor<f64>,
        grad: &CpuTensor<f64>,
    ) -> zcompute::Result<Vec<Option<CpuTensor<f64>>>> {
        let g = grad.to_vec();
        let d = inputs[0]
            .to_vec()
            .iter()
            .zip(&g)
            .map(|(v, g)| g / (1.0 + (-v).exp()))
            .collect();
        Ok(vec![Some(CpuTensor::from_vec(d, grad.shape())?)])
    }
}

fn xs() -> Vec<f64> {
    vec![-30.0, -2.0, -0.5, 0.0, 0.7, 3.0, 25.0, 50.0, -1.0, 1.5]
}

#[test]
fn the_generic_and_the_host_forms_agree() {
    let b = CpuBackend;
    let run = |host: bool| {
        let x = Var::parameter(&b, b.upload(&xs(), &[2, 5]).unwrap()).unwrap();
        let tape = Tape::new(&b);
        let y = if host {
            tape.custom(HostSoftplus, &[&x]).unwrap()
        } else {
            tape.custom(Softplus, &[&x]).unwrap()
        };
        tape.backward(&tape.sum_all(&y).unwrap()).unwrap();
        (
            y.to_vec(&b).unwrap(),
            b.download(x.grad().unwrap()).unwrap(),
        )
    };
    let (host, generic) = (run(true), run(false));
    for (h, g) in host
        .0
        .iter()
        .chain(&host.1)
        .zip(generic.0.iter().chain(&generic.1))
    {
        assert!((h - g).abs() <= 1e-13 * h.abs().max(1.0), "{h} vs {g}");
    }
}

/// A backward that returns a gradient of the wrong shape is a typed error, not a broadcast.
#[test]
fn a_gradient_of_the_wrong_shape_is_refused() {
    struct Bad;
    impl CustomOp<CpuBackend, f32> for Bad {
        fn name(&self) -> &'static str {
            "bad"
        }
        fn forward(
            &self,
            b: &CpuBackend,
            i: &[&CpuTensor<f32>],
        ) -> zcompute::Result<CpuTensor<f32>> {
            b.contiguous(i[0])
        }
        fn backward(
            &self,
            b: &CpuBackend,
            _: &[&CpuTensor<f32>],
            _: &CpuTensor<f32>,
            _: &CpuTensor<f32>,
        ) -> zcompute::Result<Vec<Option<CpuTensor<f32>>>> {
            Ok(vec![Some(b.zeros(&[1])?)])
        }
    }
    let b = CpuBackend;
    let x = Var::parameter(&b, b.zeros(&[3]).unwrap()).unwrap();
    let tape = Tape::new(&b);
    let y = tape.custom(Bad, &[&x]).unwrap();
    let e = tape.backward(&tape.sum_all(&y).unwrap()).unwrap_err();
    assert!(e.to_string().contains("bad"), "{e}");
}

/// Per sample (one tape per row, gradients added) equals the batch within f32 rounding.
fn per_sample_equals_batched<B: Ops<f32>>(b: &B) {
    b.begin_step().unwrap();
    let data: Vec<f32> = xs().iter().map(|v| *v as f32).collect();
    let batched = {
        let x = Var::parameter(b, b.upload(&data, &[2, 5]).unwrap()).unwrap();
        let tape = Tape::new(b);
        let y = tape.custom(Softplus, &[&x]).unwrap();
        tape.backward(&tape.sum_all(&y).unwrap()).unwrap();
        b.download(x.grad().unwrap()).unwrap()
    };
    let x = Var::parameter(b, b.upload(&data, &[2, 5]).unwrap()).unwrap();
    for row in 0..2 {
        let tape = Tape::new(b);
        let xr = tape.narrow(&x, 0, row, 1).unwrap();
        let y = tape.custom(Softplus, &[&xr]).unwrap();
        tape.backward(&tape.sum_all(&y).unwrap()).unwrap();
    }
    let per_sample = b.download(x.grad().unwrap()).unwrap();
    for (p, q) in per_sample.iter().zip(&batched) {
        assert!(
            (p - q).abs() <= 2.0 * f32::EPSILON * q.abs().max(1.0),
            "{p} vs {q}"
        );
    }
}

#[test]
fn per_sample_equals_batched_on_the_cpu_and_the_simulated_device() {
    per_sample_equals_batched(&CpuBackend);
    per_sample_equals_batched(&super::sim());
}

/// The op's forward and backward inside a captured graph: each replay gives the eager bits.
pub(crate) fn captured_equals_eager<B: Capture<f32> + Clone + 'static>(b: &B) {
    b.begin_step().unwrap();
    let data: Vec<f32> = xs().iter().map(|v| *v as f32).collect();
    let x = b.upload(&data, &[2, 5]).unwrap();
    let out = b.zeros(&[2, 5]).unwrap();
    let grad = b.zeros(&[2, 5]).unwrap();
    let step = {
        let (b, x, out, grad) = (b.clone(), x.clone(), out.clone(), grad.clone());
        move || -> zcompute::Result<()> {
            let xv = Var::parameter_view(x.clone(), grad.clone()).map_err(to_compute)?;
            b.fill(&grad, 0.0)?;
            let tape = Tape::new(&b);
            let y = tape.custom(Softplus, &[&xv]).map_err(to_compute)?;
            let loss = tape
                .sum_all(&tape.mul(&y, &y).map_err(to_compute)?)
                .map_err(to_compute)?;
            tape.backward(&loss).map_err(to_compute)?;
            b.copy_into(y.value(), &out)
        }
    };
    let eager = step.clone();
    eager().unwrap();
    let want = (b.download(&out).unwrap(), b.download(&grad).unwrap());
    b.fill(&out, 0.0).unwrap();
    let mut graph = b.capture(Box::new(step)).unwrap();
    for _ in 0..2 {
        b.fill(&out, 0.0).unwrap();
        b.replay(&mut graph).unwrap();
        let got = (b.download(&out).unwrap(), b.download(&grad).unwrap());
        assert_eq!(bits(&got.0), bits(&want.0));
        assert_eq!(bits(&got.1), bits(&want.1));
    }
}

pub(crate) fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

pub(crate) fn to_compute(e: zgrad::GradError) -> zcompute::ComputeError {
    zcompute::ComputeError::BodyFailed {
        detail: e.to_string(),
    }
}

#[test]
fn captured_equals_eager_on_the_cpu_and_the_simulated_device() {
    captured_equals_eager(&CpuBackend);
    captured_equals_eager(&super::sim());
}

#[cfg(feature = "gpu")]
#[test]
fn captured_equals_eager_on_the_gpu() {
    captured_equals_eager(&super::gpu());
}

/// The guide's "An op of your own" code block is this file's `Softplus`, as written here.
#[test]
fn the_guide_shows_this_softplus_as_tested() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let guide = std::fs::read_to_string(root.join("docs/guide.md")).expect("docs/guide.md");
    let here = std::fs::read_to_string(root.join("crates/zgrad/tests/it/model_ops/custom.rs"))
        .expect("custom.rs");
    let between = |text: &str, begin: &str, end: &str| -> String {
        let start = text.find(begin).expect(begin) + begin.len();
        let len = text[start..].find(end).expect(end);
        text[start..start + len].trim().to_string()
    };
    let tested = between(
        &here,
        "// guide: begin custom-op\n",
        "// guide: end custom-op",
    );
    let marker = "<!-- guide: custom-op";
    let after = &guide[guide.find(marker).expect("the guide's custom-op block")..];
    let shown = between(after, "```rust\n", "```");
    assert_eq!(
        shown, tested,
        "docs/guide.md shows another Softplus than the tested one"
    );
}
