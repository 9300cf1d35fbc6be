//! `Tape::linear` (one node for a Linear layer) by finite differences in float64 on the CPU,
//! as `gradcheck.rs` does for every op: identity and tanh, one row and several, with the bias
//! needing a gradient or not, the weight a leaf (its gradient and the bias's added into their
//! buffers by one `linear_param_grads_into`) or computed (gradients returned), and a layer
//! applied twice with the same parameters (the buffers accumulate), and `Tape::linear_add`
//! (a residual added after the product: its gradient is the output's).

use rstest::rstest;
use zcompute::{Activation, Backend, CpuBackend, CpuTensor, LinearOps};
use zgrad::rng::SplitMix64;
use zgrad::{Tape, Var};

type V = Var<CpuBackend, f64>;
type Tp<'a> = Tape<'a, CpuBackend, f64>;

const BE: CpuBackend = CpuBackend;
const IN: usize = 4;
const OUT: usize = 3;

/// How the layer is applied to its inputs `[x, w, bias]`.
#[derive(Clone, Copy, Debug)]
enum Use {
    /// `linear(x, w, bias)`.
    Once,
    /// `linear(x, 1.5 * w, bias)`: the weight is no leaf, its gradient is returned.
    ScaledWeight,
    /// `linear(linear(x, w, bias), w, bias)` with a square weight.
    Twice,
    /// `linear_add(x, w, bias, r)` (then tanh for the tanh cases): a fourth input, the
    /// residual, added after the product (`Tape::linear_add`).
    Residual,
}

fn apply(t: &Tp<'_>, v: &[V], act: Activation, how: Use) -> zgrad::Result<V> {
    match how {
        Use::Once => t.linear(&v[0], &v[1], &v[2], act),
        Use::ScaledWeight => t.linear(&v[0], &t.scale(&v[1], 1.5)?, &v[2], act),
        Use::Twice => {
            let h = t.linear(&v[0], &v[1], &v[2], act)?;
            t.linear(&h, &v[1], &v[2], act)
        }
        Use::Residual => {
            let y = t.linear_add(&v[0], &v[1], &v[2], &v[3])?;
            match act {
                Activation::Tanh => t.tanh(&y),
                Activation::Identity => Ok(y),
            }
        }
    }
}

fn var(data: &[f64], shape: &[usize], param: bool) -> V {
    if param {
        Var::parameter_from(&BE, data, shape).unwrap()
    } else {
        Var::constant(CpuTensor::from_vec(data.to_vec(), shape).unwrap())
    }
}

fn loss(inputs: &[(Vec<f64>, Vec<usize>)], act: Activation, how: Use, w: &[f64]) -> f64 {
    let tape = Tape::no_grad(&BE);
    let v: Vec<V> = inputs.iter().map(|(d, s)| var(d, s, false)).collect();
    let out = apply(&tape, &v, act, how).unwrap().to_vec(&BE).unwrap();
    out.iter().zip(w).map(|(a, b)| a * b).sum()
}

fn rel_err(got: &[f64], want: &[f64]) -> f64 {
    let diff: f64 = got.iter().zip(want).map(|(a, b)| (a - b) * (a - b)).sum();
    let norm: f64 = want.iter().map(|b| b * b).sum();
    diff.sqrt() / norm.sqrt().max(1e-12)
}

#[rstest]
fn linear_matches_finite_differences(
    #[values(Activation::Identity, Activation::Tanh)] act: Activation,
    #[values(1, 5)] rows: usize,
    #[values(true, false)] bias_needs_grad: bool,
    #[values(Use::Once, Use::ScaledWeight, Use::Twice, Use::Residual)] how: Use,
) {
    let inputs_width = if matches!(how, Use::Twice) { OUT } else { IN };
    let mut shapes = vec![vec![rows, inputs_width], vec![OUT, inputs_width], vec![OUT]];
    if matches!(how, Use::Residual) {
        shapes.push(vec![rows, OUT]);
    }
    let mut rng = SplitMix64::new(0x11ea);
    let inputs: Vec<(Vec<f64>, Vec<usize>)> = shapes
        .iter()
        .map(|s| (rng.normal_vec(s.iter().product()), s.clone()))
        .collect();
    let params = [true, true, bias_needs_grad, true];

    let tape = Tape::new(&BE);
    let v: Vec<V> = inputs
        .iter()
        .zip(params)
        .map(|((d, s), p)| var(d, s, p))
        .collect();
    let out = apply(&tape, &v, act, how).unwrap();
    let w_data = rng.normal_vec(out.value().numel());
    let w = Var::constant(CpuTensor::from_vec(w_data.clone(), out.shape()).unwrap());
    let l = tape.sum_all(&tape.mul(&out, &w).unwrap()).unwrap();
    tape.backward(&l).unwrap();
    assert_eq!(tape.pending_nodes(), 0, "backward consumed every node");

    let h = 1e-6;
    for (i, p) in v.iter().enumerate() {
        let Some(grad) = p.grad() else {
            assert!(
                !params[i],
                "input {i} is a parameter without a gradient buffer"
            );
            continue;
        };
        let analytic = BE.download(grad).unwrap();
        let numeric: Vec<f64> = (0..inputs[i].0.len())
            .map(|j| {
                let (mut plus, mut minus) = (inputs.clone(), inputs.clone());
                plus[i].0[j] += h;
                minus[i].0[j] -= h;
                (loss(&plus, act, how, &w_data) - loss(&minus, act, how, &w_data)) / (2.0 * h)
            })
            .collect();
        let err = rel_err(&analytic, &numeric);
        assert!(
            err < 1e-6,
            "input {i}: relative error {err:e}\n analytic {analytic:?}\n numeric {numeric:?}"
        );
    }
}

/// A constant input needs no gradient: the node saves no weight for it, and the parameters'
/// gradients are still right (compared with the composite `matmul` + `bias_act`).
#[rstest]
fn a_constant_input_gets_no_gradient_and_the_parameters_theirs(
    #[values(Activation::Identity, Activation::Tanh)] act: Activation,
) {
    let mut rng = SplitMix64::new(7);
    let (x, w, b) = (
        rng.normal_vec(5 * IN),
        rng.normal_vec(OUT * IN),
        rng.normal_vec(OUT),
    );
    let grads = |fused: bool| {
        let tape = Tape::new(&BE);
        let xv = var(&x, &[5, IN], false);
        let (wv, bv) = (var(&w, &[OUT, IN], true), var(&b, &[OUT], true));
        let y = if fused {
            tape.linear(&xv, &wv, &bv, act).unwrap()
        } else {
            let nt = zcompute::MatmulOpts {
                trans_a: false,
                trans_b: true,
            };
            tape.bias_act(&tape.matmul(&xv, &wv, nt).unwrap(), &bv, act)
                .unwrap()
        };
        tape.backward(&tape.sum_all(&y).unwrap()).unwrap();
        assert!(xv.grad().is_none());
        [wv, bv].map(|p| BE.download(p.grad().unwrap()).unwrap())
    };
    let (fused, composite) = (grads(true), grads(false));
    for (f, c) in fused.iter().zip(&composite) {
        assert!(rel_err(f, c) < 1e-12, "{f:?} vs {c:?}");
    }
}

/// A model's parameters are views of one flat buffer and their gradients of another, so the
/// weight's and bias's gradient buffers share storage (disjoint ranges): they still take
/// their gradients in place, equal to those of separate parameters (the aliasing check of
/// `linear_param_grads_into` refused such buffers before).
#[rstest]
fn parameters_of_one_flat_buffer_take_their_gradients_in_place(
    #[values(Activation::Identity, Activation::Tanh)] act: Activation,
) {
    let mut rng = SplitMix64::new(9);
    let (x, w, b) = (
        rng.normal_vec(5 * IN),
        rng.normal_vec(OUT * IN),
        rng.normal_vec(OUT),
    );
    let run = |params: [V; 2]| {
        let tape = Tape::new(&BE);
        let xv = var(&x, &[5, IN], true);
        let y = tape.linear(&xv, &params[0], &params[1], act).unwrap();
        tape.backward(&tape.sum_all(&y).unwrap()).unwrap();
        let mut out: Vec<Vec<f64>> = params
            .iter()
            .map(|p| BE.download(p.grad().unwrap()).unwrap())
            .collect();
        out.push(BE.download(xv.grad().unwrap()).unwrap());
        out
    };
    let separate = run([var(&w, &[OUT, IN], true), var(&b, &[OUT], true)]);
    let shapes = [vec![OUT, IN], vec![OUT]];
    let (_set, flat) = zgrad::ParameterSet::allocate(&BE, &shapes, Some(&[w.clone(), b.clone()]))
        .expect("flat parameters");
    assert!(
        flat[0]
            .grad()
            .unwrap()
            .shares_storage(flat[1].grad().unwrap())
    );
    let flat = run([flat[0].clone(), flat[1].clone()]);
    assert_eq!(flat, separate);
}

/// Views of one buffer that overlap are still refused as the weight's and bias's gradient
/// buffers (a write to one would change the other), with the buffers untouched.
#[test]
fn overlapping_gradient_buffers_are_refused() {
    let buf = CpuTensor::from_vec(vec![0.0f64; OUT * IN + OUT], &[OUT * IN + OUT]).unwrap();
    let dw = buf
        .narrow(0, 0, OUT * IN)
        .unwrap()
        .reshape(&[OUT, IN])
        .unwrap();
    let db = buf.narrow(0, OUT * IN - 1, OUT).unwrap();
    let g = CpuTensor::from_vec(vec![1.0; 2 * OUT], &[2, OUT]).unwrap();
    let x = CpuTensor::from_vec(vec![1.0; 2 * IN], &[2, IN]).unwrap();
    let err = BE
        .linear_param_grads_into(&g, &x, &dw, Some(&db))
        .unwrap_err();
    assert!(
        matches!(err, zcompute::ComputeError::Aliased { .. }),
        "{err:?}"
    );
    assert!(BE.download(&buf).unwrap().iter().all(|&v| v == 0.0));
}
