//! The PyTorch oracle (tests/fixtures, made by `reference/xasset_torch.py`): loss and every
//! gradient of the XAsset model, and one AdamW step fed the oracle's gradients, on the CPU
//! backend in float64 and float32, for both fixture configurations. Measured per tensor as
//! ‖ours − oracle‖ / ‖oracle‖ (XASSET.md); kn.bias's gradient, zero in exact arithmetic, by
//! its norm.

use rstest::rstest;
use std::path::PathBuf;
use zcompute::{Backend, CpuBackend, Element};
use zgrad::{AdamW, AdamWHyper, PARAMETER_NAMES, Tape, TensorFile, Var, XAsset, read_tensors};

#[path = "support/fixtures.rs"]
mod fixtures;
use fixtures::fixture;

fn rel(got: &[f64], want: &[f64]) -> f64 {
    let d: f64 = got.iter().zip(want).map(|(a, b)| (a - b) * (a - b)).sum();
    let n: f64 = want.iter().map(|b| b * b).sum();
    d.sqrt() / n.sqrt()
}

fn norm(v: &[f64]) -> f64 {
    v.iter().map(|x| x * x).sum::<f64>().sqrt()
}

fn to_f64<T: Element>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

struct Fixture<T> {
    input: TensorFile<T>,
    oracle: TensorFile<f64>,
    input_path: PathBuf,
}

fn load<T: Element>(config: &str) -> Fixture<T> {
    let input_path = fixture(&format!("xasset_{config}_in.safetensors"));
    Fixture {
        input: read_tensors(&input_path).unwrap(),
        oracle: read_tensors(&fixture(&format!("xasset_{config}_oracle.safetensors"))).unwrap(),
        input_path,
    }
}

fn batch<T: Element>(b: &CpuBackend, f: &Fixture<T>) -> (Var<CpuBackend, T>, Var<CpuBackend, T>)
where
    CpuBackend: Backend<T>,
{
    let x = &f.input.tensors["x"];
    let y = &f.input.tensors["y"];
    (
        Var::constant(b.upload(&x.data, &x.shape).unwrap()),
        Var::constant(b.upload(&y.data, &y.shape).unwrap()),
    )
}

fn check_gradients<T: Element>(config: &str, tol: f64)
where
    CpuBackend: Backend<T>,
{
    let b = CpuBackend;
    let f = load::<T>(config);
    let model = XAsset::<CpuBackend, T>::from_tensors(&b, &f.input, &f.input_path).unwrap();
    let (x, y) = batch(&b, &f);
    let tape = Tape::new(&b);
    let (loss, _) = model.loss(&tape, &x, &y).unwrap();
    tape.backward(&loss).unwrap();
    assert_eq!(tape.pending_nodes(), 0);

    let ours = to_f64(&loss.to_vec(&b).unwrap());
    let want = &f.oracle.tensors["loss"].data;
    assert!(
        rel(&ours, want) <= tol,
        "{config} loss {ours:?} vs {want:?}"
    );
    for (name, p) in model.named_parameters() {
        let g = to_f64(&b.download(p.grad().unwrap()).unwrap());
        let want = &f.oracle.tensors[&format!("grad.{name}")];
        assert_eq!(p.shape(), want.shape.as_slice(), "{name}");
        if name == "kn.bias" {
            assert!(
                norm(&g) < 1e-6,
                "{config} kn.bias gradient norm {:e}",
                norm(&g)
            );
        } else {
            let e = rel(&g, &want.data);
            assert!(e <= tol, "{config} grad.{name}: relative error {e:e}");
        }
    }
}

fn check_adamw<T: Element>(config: &str, tol: f64)
where
    CpuBackend: Backend<T>,
{
    let b = CpuBackend;
    let f = load::<T>(config);
    let model = XAsset::<CpuBackend, T>::from_tensors(&b, &f.input, &f.input_path).unwrap();
    let params = model.parameters();
    for (name, p) in model.named_parameters() {
        let g = &f.oracle.tensors[&format!("grad.{name}")];
        let data: Vec<T> = g.data.iter().map(|&v| T::from_f64(v)).collect();
        b.upload_into(&data, p.grad().unwrap()).unwrap();
    }
    let mut opt = AdamW::new(&b, &params, AdamWHyper::default()).unwrap();
    opt.step(&b, &params, 1e-3).unwrap();
    assert_eq!(opt.step_count(), 1);
    for (name, p) in model.named_parameters() {
        let got = to_f64(&p.to_vec(&b).unwrap());
        let want = &f.oracle.tensors[&format!("adamw.{name}")].data;
        let e = rel(&got, want);
        assert!(e <= tol, "{config} adamw.{name}: relative error {e:e}");
        assert_eq!(p.version(), 1, "the step counts as an in-place write");
    }
}

#[rstest]
#[case::tiny("tiny")]
#[case::small("small")]
fn gradients_f64(#[case] config: &str) {
    check_gradients::<f64>(config, 1e-10);
}

#[rstest]
#[case::tiny("tiny")]
#[case::small("small")]
fn gradients_f32(#[case] config: &str) {
    check_gradients::<f32>(config, 1e-5);
}

#[rstest]
#[case::tiny("tiny")]
#[case::small("small")]
fn adamw_f64(#[case] config: &str) {
    check_adamw::<f64>(config, 1e-12);
}

#[rstest]
#[case::tiny("tiny")]
#[case::small("small")]
fn adamw_f32(#[case] config: &str) {
    check_adamw::<f32>(config, 1e-6);
}

#[test]
fn fixture_names_are_xasset_names() {
    let f = load::<f64>("tiny");
    for name in PARAMETER_NAMES {
        assert!(f.input.tensors.contains_key(name), "{name}");
        assert!(
            f.oracle.tensors.contains_key(&format!("grad.{name}")),
            "{name}"
        );
    }
    assert_eq!(f.input.tensors.len(), PARAMETER_NAMES.len() + 2);
}
