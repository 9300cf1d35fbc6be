//! One trainer step against the PyTorch oracle, on any backend: the check the CPU (oracle.rs),
//! the simulated device and the GPU (device.rs) share. Needs the binary's `fixtures` module.

use zcompute::Capture;
use zgrad::{StepSource, TensorFile, TrainSchedule, Trainer, TrainerConfig, XAsset, read_tensors};

fn rel(got: &[f64], want: &[f64]) -> f64 {
    let d: f64 = got.iter().zip(want).map(|(a, b)| (a - b) * (a - b)).sum();
    let n: f64 = want.iter().map(|b| b * b).sum();
    d.sqrt() / n.sqrt()
}

fn norm(v: &[f64]) -> f64 {
    v.iter().map(|x| x * x).sum::<f64>().sqrt()
}

/// One trainer step on `b` from the oracle fixture `config`'s parameters (tiny: one block;
/// deep2, deep3: two and three blocks), in each schedule, eager and captured: the loss, every
/// gradient (each block's kn.bias by its norm) and every parameter after the AdamW update
/// within 1e-5 of the oracle (kn.bias, whose update is the sign of rounding noise, within
/// 2·lr per element: docs/xasset.md).
pub fn trainer_step_matches_the_oracle<B: Capture<f32> + Clone + 'static>(b: &B, config: &str) {
    let path = crate::support::fixtures::fixture(&format!("xasset_{config}_in.safetensors"));
    let input: TensorFile<f32> = read_tensors(&path).unwrap();
    let oracle_path =
        crate::support::fixtures::fixture(&format!("xasset_{config}_oracle.safetensors"));
    let oracle: TensorFile<f64> = read_tensors(&oracle_path).unwrap();
    let x = &input.tensors["x"];
    let (xs, ys) = (&x.data, &input.tensors["y"].data);
    let batch = x.shape[0];
    let to_f64 = |v: Vec<f32>| -> Vec<f64> { v.into_iter().map(f64::from).collect() };
    for schedule in [TrainSchedule::Batched, TrainSchedule::PerSample] {
        for capture in [false, true] {
            let what = format!("{config} {schedule:?} capture {capture}");
            let model = XAsset::from_tensors(b, &input, &path).unwrap();
            let cfg = TrainerConfig {
                schedule,
                capture,
                ..TrainerConfig::default()
            };
            let mut t = Trainer::new(b.clone(), model, cfg).unwrap();
            let r = t.step(StepSource::host(xs, ys, batch)).unwrap();
            assert_eq!(r.captured, capture, "{what}: capture works on this backend");
            let want = oracle.tensors["loss"].data[0];
            assert!(
                ((r.loss - want) / want).abs() < 1e-5,
                "{what}: loss {} vs {want}",
                r.loss
            );
            let lr = TrainerConfig::default().lr;
            for (name, p) in t.model().named_parameters() {
                let g = to_f64(b.download(p.grad().unwrap()).unwrap());
                let after = to_f64(p.to_vec(b).unwrap());
                let want_after = &oracle.tensors[&format!("adamw.{name}")].data;
                if name.ends_with("kn.bias") {
                    assert!(
                        norm(&g) < 1e-6,
                        "{what}: {name} gradient norm {:e}",
                        norm(&g)
                    );
                    let apart = after
                        .iter()
                        .zip(want_after)
                        .map(|(a, w)| (a - w).abs())
                        .fold(0.0, f64::max);
                    assert!(
                        apart <= 2.0 * lr,
                        "{what}: {name} after the step {apart:e} apart"
                    );
                    continue;
                }
                let e = rel(&g, &oracle.tensors[&format!("grad.{name}")].data);
                assert!(e <= 1e-5, "{what}: grad.{name}: {e:e}");
                let e = rel(&after, want_after);
                assert!(e <= 1e-5, "{what}: adamw.{name}: {e:e}");
            }
        }
    }
}
