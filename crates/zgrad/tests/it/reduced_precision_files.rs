//! bf16 and f16 parameter files (issue 42, item 4): read into float32 masters exactly, written
//! on request rounded to nearest-even, refused with a typed error naming the tensor when they
//! hold a NaN or an infinity, a dtype zgrad does not read, or are asked to resume a run.

use half::{bf16, f16};
use safetensors::{Dtype, tensor::TensorView};
use std::path::Path;
use zcompute::CpuBackend;
use zgrad::{
    FileDtype, GradError, HostTensor, StepSource, Trainer, TrainerConfig, XAsset, XAssetConfig,
    read_tensors, write_tensors_as,
};

const B: CpuBackend = CpuBackend;

fn small() -> XAssetConfig {
    XAssetConfig {
        features: 5,
        scales: 3,
        width: 8,
        heads: 2,
        ff: 6,
        layers: 2,
    }
}

fn trainer(seed: u64) -> Trainer<CpuBackend, f32, XAsset<CpuBackend>> {
    let model = XAsset::<CpuBackend, f32>::init(&B, small(), seed).unwrap();
    Trainer::new(B, model, TrainerConfig::default()).unwrap()
}

/// One step on a fixed batch, so parameters and moments are not their initial values.
fn step(t: &mut Trainer<CpuBackend, f32, XAsset<CpuBackend>>) {
    let mut rng = zgrad::rng::SplitMix64::new(5);
    let x: Vec<f32> = rng
        .normal_vec(4 * 3 * 5)
        .into_iter()
        .map(|v| v as f32)
        .collect();
    t.step(StepSource::host(&x, &[0.0, 1.0, 1.0, 0.0], 4))
        .unwrap();
}

/// A safetensors file of raw tensors (name, dtype, shape, bytes) as PyTorch would write them.
fn write_raw(path: &Path, tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) {
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.to_string(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

fn stored_dtypes(path: &Path) -> Vec<Dtype> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors().iter().map(|(_, v)| v.dtype()).collect()
}

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = zgrad::rng::SplitMix64::new(seed);
    rng.normal_vec(n)
        .into_iter()
        .map(|v| (v * 3.0) as f32)
        .collect()
}

#[test]
fn bf16_and_f16_files_round_trip_representable_values_bitwise() {
    let dir = tempfile::tempdir().unwrap();
    for (dtype, st, to_reduced) in [
        (
            FileDtype::Bf16,
            Dtype::BF16,
            (|v| bf16::from_f32(v).to_f32()) as fn(f32) -> f32,
        ),
        (FileDtype::F16, Dtype::F16, |v| f16::from_f32(v).to_f32()),
    ] {
        // Values bf16 (f16) holds exactly, plus signed zero and the extremes of the format.
        let mut exact: Vec<f32> = values(300, 1).into_iter().map(to_reduced).collect();
        exact.extend([0.0, -0.0, to_reduced(1e-30), to_reduced(60_000.0)]);
        let tensors = vec![(
            "w".to_string(),
            HostTensor {
                shape: vec![exact.len()],
                data: exact.clone(),
            },
        )];
        let path = dir.path().join(format!("{dtype:?}.safetensors"));
        write_tensors_as(&path, &tensors, None, dtype).unwrap();
        assert_eq!(stored_dtypes(&path), vec![st]);
        let back = read_tensors::<f32>(&path).unwrap();
        let got: Vec<u32> = back.tensors["w"].data.iter().map(|v| v.to_bits()).collect();
        let want: Vec<u32> = exact.iter().map(|v| v.to_bits()).collect();
        assert_eq!(got, want, "{dtype:?}");
        assert_eq!(back.tensors["w"].shape, vec![exact.len()]);
    }
}

#[test]
fn export_rounds_to_nearest_even_and_the_model_loads_the_rounded_values() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = trainer(3);
    step(&mut t);
    let ours = t.model().to_host(&B).unwrap();
    for (dtype, round) in [
        (
            FileDtype::Bf16,
            (|v| bf16::from_f32(v).to_f32()) as fn(f32) -> f32,
        ),
        (FileDtype::F16, |v| f16::from_f32(v).to_f32()),
        (FileDtype::F32, |v| v),
    ] {
        let path = dir.path().join(format!("{dtype:?}.safetensors"));
        t.export_parameters(&path, dtype).unwrap();
        assert!(
            stored_dtypes(&path)
                .iter()
                .all(|d| *d == dtype.safetensors())
        );
        let loaded = XAsset::<CpuBackend, f32>::load(&B, &path).unwrap();
        let back = loaded.to_host(&B).unwrap();
        assert_eq!(back.len(), ours.len());
        for ((name, want), (back_name, got)) in ours.iter().zip(&back) {
            assert_eq!(name, back_name);
            assert_eq!(got.shape, want.shape, "{name}");
            let want: Vec<u32> = want.data.iter().map(|v| round(*v).to_bits()).collect();
            let got: Vec<u32> = got.data.iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, want, "{dtype:?} {name}");
        }
    }
}

#[test]
fn a_nan_or_infinity_in_a_16_bit_file_is_refused_naming_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let one = bf16::from_f32(1.0).to_bits();
    for (dtype, bad) in [
        (Dtype::BF16, bf16::NAN.to_bits()),
        (Dtype::BF16, bf16::NEG_INFINITY.to_bits()),
        (Dtype::F16, f16::INFINITY.to_bits()),
    ] {
        let path = dir.path().join("bad.safetensors");
        let good: Vec<u8> = [one, one].iter().flat_map(|b| b.to_le_bytes()).collect();
        let bytes: Vec<u8> = [one, one, bad]
            .iter()
            .flat_map(|b| b.to_le_bytes())
            .collect();
        write_raw(
            &path,
            &[
                ("emb.bias", dtype, vec![2], good),
                ("emb.weight", dtype, vec![3], bytes),
            ],
        );
        let check = |e: GradError| match e {
            GradError::NonFiniteInFile {
                name,
                dtype: d,
                index,
                ..
            } => {
                assert_eq!((name.as_str(), d, index), ("emb.weight", dtype, 2));
            }
            other => panic!("{dtype:?}: {other}"),
        };
        check(read_tensors::<f32>(&path).unwrap_err());
        check(XAsset::<CpuBackend, f32>::load(&B, &path).unwrap_err());
        let message = read_tensors::<f32>(&path).unwrap_err().to_string();
        assert!(message.contains("`emb.weight`"), "{message}");
    }
}

#[test]
fn a_tensor_of_a_dtype_not_read_is_refused_naming_it_and_its_dtype() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("int.safetensors");
    let f32s: Vec<u8> = [1.0f32, 2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    let i64s: Vec<u8> = [1i64, 2].iter().flat_map(|v| v.to_le_bytes()).collect();
    write_raw(
        &path,
        &[
            ("emb.bias", Dtype::F32, vec![2], f32s),
            ("num_batches_tracked", Dtype::I64, vec![2], i64s),
        ],
    );
    let check = |e: GradError| {
        let message = e.to_string();
        match e {
            GradError::UnsupportedDtype { name, dtype, .. } => {
                assert_eq!((name.as_str(), dtype), ("num_batches_tracked", Dtype::I64));
                assert!(message.contains("I64"), "{message}");
            }
            other => panic!("{other}"),
        }
    };
    check(read_tensors::<f32>(&path).unwrap_err());
    check(XAsset::<CpuBackend, f32>::load(&B, &path).unwrap_err());
    check(trainer(1).load_checkpoint(&path).unwrap_err());
}

#[test]
fn export_refuses_a_value_that_is_not_finite_in_the_format_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.safetensors");
    let tensors = vec![(
        "head.weight".to_string(),
        HostTensor {
            shape: vec![3],
            data: vec![1.0f32, 70_000.0, 2.0],
        },
    )];
    match write_tensors_as(&path, &tensors, None, FileDtype::F16).unwrap_err() {
        GradError::NotRepresentable {
            name, dtype, index, ..
        } => assert_eq!(
            (name.as_str(), dtype, index),
            ("head.weight", Dtype::F16, 1)
        ),
        other => panic!("{other}"),
    }
    assert!(!path.exists());
    // bf16 has float32's range: the same value is fine there.
    write_tensors_as(&path, &tensors, None, FileDtype::Bf16).unwrap();
    assert_eq!(
        read_tensors::<f32>(&path).unwrap().tensors["head.weight"].data[1],
        70_144.0
    );
}

#[test]
fn a_16_bit_file_never_resumes_a_run_and_the_trainer_is_left_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let mut source = trainer(3);
    step(&mut source);
    let mut t = trainer(4);
    let before = t.model().to_host(&B).unwrap();

    // The exported bf16 parameters.
    let exported = dir.path().join("bf16.safetensors");
    source
        .export_parameters(&exported, FileDtype::Bf16)
        .unwrap();
    // A float32 checkpoint with one moment rewritten in bf16 (as a converter would).
    let saved = dir.path().join("ck.safetensors");
    source
        .save_checkpoint(&saved, std::collections::HashMap::new())
        .unwrap();
    let (mut entries, metadata) =
        zgrad::checkpoint::deserialize(&std::fs::read(&saved).unwrap(), &saved).unwrap();
    let moment = "optim.v.blocks.1.f2.weight";
    let raw = entries.get_mut(moment).unwrap();
    raw.bytes = raw
        .bytes
        .chunks_exact(4)
        .flat_map(|c| {
            bf16::from_f32(f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .to_bits()
                .to_le_bytes()
        })
        .collect();
    raw.dtype = Dtype::BF16;
    let mixed = dir.path().join("mixed.safetensors");
    std::fs::write(
        &mixed,
        zgrad::checkpoint::serialize(&entries, &metadata, &mixed).unwrap(),
    )
    .unwrap();

    for (path, tensor) in [(&exported, "blocks.0.f1.bias"), (&mixed, moment)] {
        match t.load_checkpoint(path).unwrap_err() {
            GradError::ReducedPrecisionResume { name, dtype, .. } => {
                assert_eq!(dtype, Dtype::BF16);
                if path == &mixed {
                    assert_eq!(name, tensor);
                }
            }
            other => panic!("{}: {other}", path.display()),
        }
        assert_eq!(
            t.model().to_host(&B).unwrap(),
            before,
            "nothing was written"
        );
        assert_eq!(t.optimizer().step_count(), 0);
    }
    // The same bf16 file starts a model.
    XAsset::<CpuBackend, f32>::load(&B, &exported).unwrap();
}
