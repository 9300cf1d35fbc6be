//! The PyTorch oracle (tests/fixtures, made by `crates/zgrad/benches/xasset_torch.py`): loss and
//! every gradient of the XAsset model, and one AdamW step fed the oracle's gradients, on the CPU
//! backend in float64 and float32, for every fixture configuration (one block: tiny, small; two and
//! three blocks: deep2, deep3). With two and three blocks also one trainer step in both schedules,
//! eager and captured, on the CPU backend (device.rs runs the same check, `support/oracle_step.rs`,
//! on the simulated device and the GPU). Measured per tensor as ‖ours − oracle‖ / ‖oracle‖
//! (docs/xasset.md); each block's kn.bias gradient, zero in exact arithmetic, by its norm.

use rstest::rstest;
use std::path::PathBuf;
use zcompute::{Backend, CpuBackend, Element};
use zgrad::{AdamW, AdamWHyper, PARAMETER_NAMES, Tape, TensorFile, Var, XAsset, read_tensors};

use crate::support::fixtures;
use crate::support::oracle_step;
use fixtures::fixture;
use oracle_step::trainer_step_matches_the_oracle;

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
        if name.ends_with("kn.bias") {
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
#[case::deep2("deep2")]
#[case::deep3("deep3")]
fn gradients_f64(#[case] config: &str) {
    check_gradients::<f64>(config, 1e-10);
}

#[rstest]
#[case::tiny("tiny")]
#[case::small("small")]
#[case::deep2("deep2")]
#[case::deep3("deep3")]
fn gradients_f32(#[case] config: &str) {
    check_gradients::<f32>(config, 1e-5);
}

#[rstest]
#[case::tiny("tiny")]
#[case::small("small")]
#[case::deep2("deep2")]
#[case::deep3("deep3")]
fn adamw_f64(#[case] config: &str) {
    check_adamw::<f64>(config, 1e-12);
}

#[rstest]
#[case::tiny("tiny")]
#[case::small("small")]
#[case::deep2("deep2")]
#[case::deep3("deep3")]
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

/// The deeper fixtures hold the names docs/xasset.md "Depth" gives (`blocks.{i}.<name>`), the
/// model reads its depth from them, and its names and shapes are the file's.
#[rstest]
#[case::deep2("deep2", 2, 36)]
#[case::deep3("deep3", 3, 52)]
fn deep_fixtures_load_with_their_depth(
    #[case] config: &str,
    #[case] layers: usize,
    #[case] tensors: usize,
) {
    let f = load::<f64>(config);
    let model =
        XAsset::<CpuBackend, f64>::from_tensors(&CpuBackend, &f.input, &f.input_path).unwrap();
    assert_eq!(model.config.layers, layers);
    assert_eq!(model.blocks.len(), layers);
    let named = model.named_parameters();
    assert_eq!(named.len(), tensors);
    assert_eq!(named[2].0, "blocks.0.ln1.weight");
    assert_eq!(
        named[tensors - 3].0,
        format!("blocks.{}.f2.bias", layers - 1)
    );
    for (name, p) in &named {
        assert_eq!(p.shape(), f.input.tensors[name].shape.as_slice(), "{name}");
        assert!(
            f.oracle.tensors.contains_key(&format!("adamw.{name}")),
            "{name}"
        );
    }
    assert_eq!(
        f.input.tensors.len(),
        tensors + 2,
        "the parameters, x and y"
    );
}

#[rstest]
#[case::deep2("deep2")]
#[case::deep3("deep3")]
fn trainer_step_matches_the_oracle_on_the_cpu(#[case] config: &str) {
    trainer_step_matches_the_oracle(&CpuBackend, config);
}
