//! Parameter files and checkpoints: save/load round trips, and training resumed from a
//! checkpoint continuing exactly as the uninterrupted run.

use std::collections::HashMap;
use zcompute::CpuBackend;
use zgrad::{
    GradError, PARAMETER_NAMES, STEP_KEY, StepSource, TrainSchedule, Trainer, TrainerConfig,
    XAsset, XAssetConfig, read_tensors,
};

const B: CpuBackend = CpuBackend;

fn small() -> XAssetConfig {
    XAssetConfig {
        features: 5,
        scales: 3,
        width: 8,
        heads: 2,
        ff: 6,
        layers: 1,
    }
}

fn data(step: u64) -> (Vec<f32>, Vec<f32>) {
    let mut rng = zgrad::rng::SplitMix64::new(100 + step);
    let x = rng
        .normal_vec(4 * 3 * 5)
        .into_iter()
        .map(|v| v as f32)
        .collect();
    let y = (0..4).map(|i| ((i + step as usize) % 2) as f32).collect();
    (x, y)
}

#[test]
fn default_size_has_the_documented_parameter_count() {
    assert_eq!(XAssetConfig::default().parameter_count(), 839_937);
    let m = XAsset::<CpuBackend, f32>::init(&B, small(), 1).unwrap();
    let n: usize = m.parameters().iter().map(|p| p.value().numel()).sum();
    assert_eq!(n, small().parameter_count());
}

#[test]
fn init_follows_pytorch_defaults() {
    let m = XAsset::<CpuBackend, f64>::init(&B, small(), 7).unwrap();
    for (name, p) in m.named_parameters() {
        let v = p.to_vec(&B).unwrap();
        if ["ln", "qn", "kn"].iter().any(|p| name.starts_with(p)) {
            let want = if name.ends_with("weight") { 1.0 } else { 0.0 };
            assert!(v.iter().all(|&x| x == want), "{name}");
        } else {
            let fan_in = match name.split('.').next().unwrap() {
                "emb" => 5.0,
                "f2" => 6.0,
                _ => 8.0,
            };
            let bound = 1.0 / f64::sqrt(fan_in);
            assert!(v.iter().all(|x| x.abs() <= bound), "{name}");
            assert!(
                v.iter().any(|x| x.abs() > bound / 2.0),
                "{name} spreads over its range"
            );
        }
    }
    let again = XAsset::<CpuBackend, f64>::init(&B, small(), 7).unwrap();
    assert_eq!(
        m.parameters()[4].to_vec(&B).unwrap(),
        again.parameters()[4].to_vec(&B).unwrap(),
        "same seed, same parameters"
    );
}

#[test]
fn bad_configurations_are_refused() {
    let bad = XAssetConfig {
        heads: 3,
        ..small()
    };
    assert!(matches!(
        XAsset::<CpuBackend, f32>::init(&B, bad, 0),
        Err(GradError::Config(_))
    ));
}

#[test]
fn parameters_round_trip_through_safetensors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.safetensors");
    let m = XAsset::<CpuBackend, f32>::init(&B, small(), 3).unwrap();
    m.save(&B, &path, None).unwrap();
    let file = read_tensors::<f32>(&path).unwrap();
    assert_eq!(file.tensors.keys().len(), 20);
    for name in PARAMETER_NAMES {
        assert!(file.tensors.contains_key(name), "{name}");
    }
    let back = XAsset::<CpuBackend, f32>::load(&B, &path).unwrap();
    assert_eq!(back.config.width, 8);
    assert_eq!(back.config.heads, 2);
    for (a, b) in m.parameters().iter().zip(back.parameters()) {
        assert_eq!(a.to_vec(&B).unwrap(), b.to_vec(&B).unwrap());
    }
}

#[test]
fn a_missing_tensor_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.safetensors");
    let m = XAsset::<CpuBackend, f32>::init(&B, small(), 3).unwrap();
    let mut tensors = m.to_host(&B).unwrap();
    tensors.retain(|(n, _)| n != "o.bias");
    zgrad::write_tensors(&path, &tensors, None).unwrap();
    let err = XAsset::<CpuBackend, f32>::load(&B, &path).unwrap_err();
    assert!(err.to_string().contains("o.bias"), "{err}");
}

fn trainer(seed: u64) -> Trainer<CpuBackend, f32, XAsset<CpuBackend>> {
    let m = XAsset::init(&B, small(), seed).unwrap();
    let cfg = TrainerConfig {
        schedule: TrainSchedule::PerSample,
        ..TrainerConfig::default()
    };
    Trainer::new(B, m, cfg).unwrap()
}

#[test]
fn resuming_from_a_checkpoint_continues_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ckpt.safetensors");
    let mut straight = trainer(5);
    let mut first = trainer(5);
    for step in 0..2 {
        let (x, y) = data(step);
        straight.step(StepSource::host(&x, &y, 4)).unwrap();
        first.step(StepSource::host(&x, &y, 4)).unwrap();
    }
    let meta = HashMap::from([("run".to_string(), "test".to_string())]);
    first.save_checkpoint(&path, meta).unwrap();

    let mut resumed = trainer(99); // different initial values, all overwritten
    let meta = resumed.load_checkpoint(&path).unwrap();
    assert_eq!(meta.get("run").map(String::as_str), Some("test"));
    assert_eq!(meta.get(STEP_KEY).map(String::as_str), Some("2"));
    assert_eq!(resumed.status().step, 2);
    for step in 2..4 {
        let (x, y) = data(step);
        let a = straight.step(StepSource::host(&x, &y, 4)).unwrap();
        let b = resumed.step(StepSource::host(&x, &y, 4)).unwrap();
        assert_eq!((a.step, a.loss, a.grad_norm), (b.step, b.loss, b.grad_norm));
    }
    for (a, b) in straight
        .model()
        .parameters()
        .iter()
        .zip(resumed.model().parameters())
    {
        assert_eq!(a.to_vec(&B).unwrap(), b.to_vec(&B).unwrap());
    }
}

fn deep() -> XAssetConfig {
    XAssetConfig {
        layers: 3,
        ..small()
    }
}

/// docs/xasset.md "Depth": 52 tensors and 2,419,969 parameters at the default size with three
/// blocks, named emb.*, blocks.{i}.*, head.*.
#[test]
fn three_blocks_have_the_documented_names_and_count() {
    let c = XAssetConfig {
        layers: 3,
        ..XAssetConfig::default()
    };
    assert_eq!(c.parameter_count(), 2_419_969);
    let names = c.parameter_names();
    assert_eq!(names.len(), 52);
    assert_eq!(
        &names[..3],
        ["emb.weight", "emb.bias", "blocks.0.ln1.weight"]
    );
    assert_eq!(names[17], "blocks.0.f2.bias");
    assert_eq!(names[49], "blocks.2.f2.bias");
    assert_eq!(&names[50..], ["head.weight", "head.bias"]);
    assert_eq!(XAssetConfig::default().parameter_names(), PARAMETER_NAMES);
    let m = XAsset::<CpuBackend, f32>::init(&B, deep(), 1).unwrap();
    assert_eq!(m.parameters().len(), 52);
    let n: usize = m.parameters().iter().map(|p| p.value().numel()).sum();
    assert_eq!(n, deep().parameter_count());
}

/// The model's init is its modules' init composed over one stream (emb, each block, head):
/// at one block the stream the model always drew, at three the same continued.
#[test]
fn init_is_the_composition_of_the_modules_init() {
    use zgrad::nn::{EncoderBlock, Linear, PoolHead};
    for c in [small(), deep()] {
        let model = XAsset::<CpuBackend, f64>::init(&B, c, 11).unwrap();
        let mut rng = zgrad::rng::SplitMix64::new(11);
        let emb = Linear::<CpuBackend, f64>::init(&B, c.features, c.width, &mut rng).unwrap();
        let mut want = vec![emb.weight, emb.bias];
        for _ in 0..c.layers {
            let block = EncoderBlock::init(&B, c.width, c.heads, c.ff, &mut rng).unwrap();
            want.extend(block.parameters());
        }
        let head = PoolHead::init(&B, c.width, &mut rng).unwrap();
        want.extend([head.linear.weight, head.linear.bias]);
        for ((name, got), want) in model.named_parameters().iter().zip(&want) {
            assert_eq!(got.to_vec(&B).unwrap(), want.to_vec(&B).unwrap(), "{name}");
        }
    }
}

/// A file with tensors missing, extra and of the wrong shape: one typed error naming every
/// one of them.
#[test]
fn every_mismatched_tensor_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.safetensors");
    let m = XAsset::<CpuBackend, f32>::init(&B, deep(), 3).unwrap();
    let mut tensors = m.to_host(&B).unwrap();
    tensors.retain(|(n, _)| n != "blocks.1.o.bias" && n != "blocks.2.kn.weight");
    for (n, t) in &mut tensors {
        if n == "blocks.0.f1.bias" {
            t.shape = vec![2, 3];
        }
    }
    let stray = zgrad::HostTensor {
        shape: vec![1],
        data: vec![0.0f32],
    };
    tensors.push(("blocks.1.extra.weight".into(), stray.clone()));
    tensors.push(("ln1.weight".into(), stray));
    zgrad::write_tensors(&path, &tensors, None).unwrap();
    let err = XAsset::<CpuBackend, f32>::load(&B, &path).unwrap_err();
    let GradError::ParameterMismatch {
        missing,
        extra,
        misshapen,
        ..
    } = &err
    else {
        panic!("expected ParameterMismatch, got {err}");
    };
    assert_eq!(missing, &["blocks.1.o.bias", "blocks.2.kn.weight"]);
    assert_eq!(extra, &["blocks.1.extra.weight", "ln1.weight"]);
    assert_eq!(misshapen.len(), 1, "{misshapen:?}");
    assert!(misshapen[0].starts_with("blocks.0.f1.bias [2, 3]"), "{err}");
    for name in [
        "blocks.1.o.bias",
        "blocks.2.kn.weight",
        "ln1.weight",
        "blocks.0.f1.bias",
    ] {
        assert!(err.to_string().contains(name), "{err}");
    }
}

/// A parameter file of other sizes than asked: each difference named.
#[test]
fn a_file_of_other_sizes_is_refused_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.safetensors");
    XAsset::<CpuBackend, f32>::init(&B, deep(), 3)
        .unwrap()
        .save(&B, &path, None)
        .unwrap();
    let asked = XAssetConfig {
        layers: 2,
        width: 12,
        ..small()
    };
    let err = XAsset::<CpuBackend, f32>::load_checked(&B, &path, &asked).unwrap_err();
    let GradError::ModelMismatch { differences, .. } = &err else {
        panic!("expected ModelMismatch, got {err}");
    };
    assert_eq!(
        differences,
        &["layers: file 3, asked 2", "width: file 8, asked 12"]
    );
    let ok = XAsset::<CpuBackend, f32>::load_checked(&B, &path, &deep()).unwrap();
    assert_eq!(ok.config, deep());
}

/// Missing files, directories and files that are not safetensors: typed errors naming them.
#[test]
fn hostile_parameter_files_are_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("none.safetensors");
    let err = XAsset::<CpuBackend, f32>::load(&B, &missing).unwrap_err();
    assert!(matches!(err, GradError::Io { .. }), "{err}");
    let err = XAsset::<CpuBackend, f32>::load(&B, dir.path()).unwrap_err();
    assert!(matches!(err, GradError::Io { .. }), "{err}");
    let junk = dir.path().join("junk.safetensors");
    std::fs::write(&junk, b"\x10\0\0\0\0\0\0\0{not json at all").unwrap();
    let err = XAsset::<CpuBackend, f32>::load(&B, &junk).unwrap_err();
    assert!(matches!(err, GradError::SafeTensors { .. }), "{err}");
    assert!(err.to_string().contains("junk.safetensors"), "{err}");
}

/// A three-block trainer's checkpoint resumes exactly, loads as a parameter file (its
/// optimiser state left out), and refuses a trainer of another depth naming what is missing.
#[test]
fn a_deep_checkpoint_resumes_and_is_a_parameter_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ckpt.safetensors");
    let make = |seed, c| {
        let cfg = TrainerConfig::default();
        Trainer::new(B, XAsset::init(&B, c, seed).unwrap(), cfg).unwrap()
    };
    let mut first = make(5, deep());
    let (x, y) = data(0);
    first.step(StepSource::host(&x, &y, 4)).unwrap();
    first.save_checkpoint(&path, HashMap::new()).unwrap();
    let mut resumed = make(9, deep());
    resumed.load_checkpoint(&path).unwrap();
    assert_eq!(resumed.status().step, 1);
    let (x, y) = data(1);
    let a = first.step(StepSource::host(&x, &y, 4)).unwrap();
    let b = resumed.step(StepSource::host(&x, &y, 4)).unwrap();
    assert_eq!((a.loss, a.grad_norm), (b.loss, b.grad_norm));
    let params = XAsset::<CpuBackend, f32>::load(&B, &path).unwrap();
    assert_eq!(params.config.layers, 3);
    let mut shallow = make(
        1,
        XAssetConfig {
            layers: 2,
            ..small()
        },
    );
    let err = shallow.load_checkpoint(&path).unwrap_err();
    assert!(matches!(err, GradError::ParameterMismatch { .. }), "{err}");
}

use crate::support::mlp;

/// A model of the user's own: 2 steps, checkpoint, a fresh trainer of other initial values
/// loads it and takes 2 more steps, bit for bit as the uninterrupted run (losses, norms,
/// parameters); the file holds the model's names and their AdamW moments.
fn own_model_resumes<B: zcompute::Capture<f32> + Clone + 'static>(b: B, cfg: TrainerConfig) {
    use zgrad::Model;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("own.safetensors");
    let make = |seed| {
        let m = mlp::Mlp::<_, f32>::new(&b, 2, 3, 4, seed).unwrap();
        Trainer::new(b.clone(), m, cfg).unwrap()
    };
    let (mut straight, mut first) = (make(5), make(5));
    for step in 0..2 {
        let (x, y) = mlp::data(step, 5, 6);
        straight.step(StepSource::host(&x, &y, 5)).unwrap();
        first.step(StepSource::host(&x, &y, 5)).unwrap();
    }
    first.save_checkpoint(&path, HashMap::new()).unwrap();
    let file = read_tensors::<f32>(&path).unwrap();
    for name in ["l1.weight", "l1.bias", "l2.weight", "l2.bias"] {
        for key in [
            name.to_string(),
            format!("optim.m.{name}"),
            format!("optim.v.{name}"),
        ] {
            assert!(file.tensors.contains_key(&key), "{key}");
        }
    }
    assert_eq!(file.tensors.len(), 12);
    let mut resumed = make(99);
    resumed.load_checkpoint(&path).unwrap();
    assert_eq!(resumed.status().step, 2);
    for step in 2..4 {
        let (x, y) = mlp::data(step, 5, 6);
        let a = straight.step(StepSource::host(&x, &y, 5)).unwrap();
        let r = resumed.step(StepSource::host(&x, &y, 5)).unwrap();
        assert_eq!(
            (a.step, a.loss.to_bits(), a.grad_norm.to_bits()),
            (r.step, r.loss.to_bits(), r.grad_norm.to_bits())
        );
    }
    for (a, r) in straight
        .model()
        .parameters()
        .iter()
        .zip(resumed.model().parameters())
    {
        let (a, r) = (a.to_vec(&b).unwrap(), r.to_vec(&b).unwrap());
        assert_eq!(
            a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            r.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }
    // A checkpoint of another model (XAsset's names) is refused, naming what is missing.
    let other = dir.path().join("xasset.safetensors");
    trainer(1).save_checkpoint(&other, HashMap::new()).unwrap();
    let e = resumed.load_checkpoint(&other).unwrap_err();
    assert!(e.to_string().contains("l1.weight"), "{e}");
}

#[test]
fn own_model_resumes_from_a_checkpoint_bitwise_on_the_cpu() {
    own_model_resumes(
        B,
        TrainerConfig {
            schedule: TrainSchedule::PerSample,
            ..TrainerConfig::default()
        },
    );
}

#[test]
fn own_model_resumes_from_a_checkpoint_bitwise_captured_on_the_simulated_device() {
    own_model_resumes(
        zcompute::Engine::sim(256 << 20).unwrap(),
        TrainerConfig {
            schedule: TrainSchedule::Batched,
            capture: true,
            ..TrainerConfig::default()
        },
    );
}
