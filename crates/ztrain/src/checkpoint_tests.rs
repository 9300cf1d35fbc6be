use super::*;
use crate::files::temp_path;
use safetensors::{SafeTensors, tensor::TensorView};
use serde_json::json;

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn sample() -> Checkpoint {
    let t = |shape: Vec<usize>, base: f32| HostTensor {
        data: (0..shape.iter().product::<usize>())
            .map(|i| base + i as f32 * 0.25)
            .collect(),
        shape,
    };
    Checkpoint {
        config: json!({"batch": 4, "lr": 0.001}),
        backend: "cpu".into(),
        progress: Progress {
            step: 7,
            epoch: 1,
            position: 12,
            rng: [1, 2, 3, u64::MAX],
            order: vec![3, 0, 2, 1],
        },
        params: BTreeMap::from([
            ("emb.weight".to_string(), t(vec![2, 3], 1.0)),
            ("head.bias".to_string(), t(vec![1], -0.5)),
        ]),
        optim: BTreeMap::from([
            ("m.emb.weight".to_string(), t(vec![2, 3], 0.0)),
            ("v.emb.weight".to_string(), t(vec![2, 3], 9.0)),
        ]),
    }
}

#[test]
fn round_trips_exactly_through_a_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("run.safetensors");
    let c = sample();
    c.save(&path).expect("save");
    assert!(!temp_path(&path).exists(), "temporary file renamed away");
    assert_eq!(Checkpoint::load(&path).expect("load"), c);
}

#[test]
fn parameters_are_readable_under_their_plain_names() {
    let bytes = sample().to_bytes().expect("bytes");
    let st = SafeTensors::deserialize(&bytes).expect("safetensors");
    let w = st.tensor("emb.weight").expect("plain name");
    assert_eq!((w.dtype(), w.shape()), (Dtype::F32, &[2usize, 3][..]));
}

#[test]
fn save_replaces_an_existing_checkpoint() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("run.safetensors");
    std::fs::write(&path, b"old").expect("write");
    sample().save(&path).expect("save");
    assert_eq!(Checkpoint::load(&path).expect("load").progress.step, 7);
}

fn corrupt_reason(bytes: &[u8]) -> String {
    match Checkpoint::from_bytes(bytes, Path::new("ck.safetensors")) {
        Err(TrainError::CheckpointCorrupt { reason, .. }) => reason,
        other => panic!("expected CheckpointCorrupt, got {other:?}"),
    }
}

#[test]
fn empty_truncated_and_garbage_files_are_corrupt() {
    let good = sample().to_bytes().expect("bytes");
    assert!(corrupt_reason(&[]).contains("safetensors"));
    assert!(corrupt_reason(&good[..good.len() - 5]).contains("safetensors"));
    assert!(corrupt_reason(b"this is not a checkpoint at all").contains("safetensors"));
}

#[test]
fn a_flipped_data_bit_is_caught_by_the_checksum() {
    let mut bytes = sample().to_bytes().expect("bytes");
    let last = bytes.len() - 1;
    bytes[last] ^= 0x10;
    assert!(corrupt_reason(&bytes).contains("checksum"));
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

    /// Any single flipped bit, in the header, the metadata or the data, is an error: never a
    /// checkpoint that loads with different contents.
    #[test]
    fn any_flipped_bit_is_refused(at in 0.0f64..1.0, bit in 0u8..8) {
        let mut bytes = sample().to_bytes().expect("bytes");
        let i = ((bytes.len() as f64 * at) as usize).min(bytes.len() - 1);
        bytes[i] ^= 1 << bit;
        match Checkpoint::from_bytes(&bytes, Path::new("ck")) {
            Err(TrainError::CheckpointCorrupt { .. }) => {}
            Ok(c) => proptest::prop_assert_eq!(c, sample(), "byte {} bit {} loaded differently", i, bit),
            Err(e) => proptest::prop_assert!(false, "byte {} bit {}: {}", i, bit, e),
        }
    }
}

#[test]
fn a_plain_safetensors_file_is_not_a_checkpoint() {
    let data = f32_bytes(&[1.0, 2.0]);
    let view = TensorView::new(Dtype::F32, vec![2], &data).expect("view");
    let bytes = safetensors::serialize([("w", view)], None).expect("serialize");
    assert!(corrupt_reason(&bytes).contains("ztrain.format"));
}

#[test]
fn the_error_names_the_file() {
    let err = Checkpoint::from_bytes(b"", Path::new("runs/ck.safetensors")).expect_err("corrupt");
    assert!(err.to_string().contains("runs/ck.safetensors"), "{err}");
    let missing = Checkpoint::load(Path::new("/nonexistent/ck.safetensors")).expect_err("io");
    assert!(
        missing.to_string().contains("/nonexistent/ck.safetensors"),
        "{missing}"
    );
}

#[test]
fn reads_stop_at_the_sizes_the_format_gives() {
    // /dev/zero: a header length of 0, refused after 8 bytes instead of reading forever.
    let err = Checkpoint::load(Path::new("/dev/zero")).expect_err("not a checkpoint");
    assert!(err.to_string().contains("header length 0"), "{err}");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("run.safetensors");
    sample().save(&path).expect("save");
    let len = std::fs::metadata(&path).expect("meta").len();
    // A bound below the file's own size is a typed error, not a partial read.
    let err = Checkpoint::load_bounded(&path, len - 1).expect_err("too large");
    assert!(err.to_string().contains("more than"), "{err}");
    assert_eq!(
        Checkpoint::load_bounded(&path, len).expect("fits"),
        sample()
    );
    // Bytes after the data the header describes, and a file cut short, are corrupt.
    let mut bytes = std::fs::read(&path).expect("read");
    bytes.push(0);
    std::fs::write(&path, &bytes).expect("write");
    let err = Checkpoint::load(&path).expect_err("trailing byte");
    assert!(err.to_string().contains("bytes follow"), "{err}");
    bytes.truncate(bytes.len() - 10);
    std::fs::write(&path, &bytes).expect("write");
    let err = Checkpoint::load(&path).expect_err("cut short");
    assert!(err.to_string().contains("the file ends after"), "{err}");
}

/// A checkpoint written before the format moved onto zgrad's (no `zgrad.step` in its
/// metadata) loads as before: the checksum covers the tensors, the configuration and the
/// backend, which are byte for byte the same.
#[test]
fn a_checkpoint_without_the_zgrad_step_still_loads() {
    let bytes = sample().to_bytes().expect("bytes");
    let (entries, mut meta) =
        zgrad::checkpoint::deserialize(&bytes, Path::new("ck")).expect("safetensors");
    assert_eq!(meta.remove(STEP_KEY).as_deref(), Some("7"));
    let old = zgrad::checkpoint::serialize(&entries, &meta, Path::new("ck")).expect("bytes");
    assert_eq!(
        Checkpoint::from_bytes(&old, Path::new("ck")).expect("loads"),
        sample()
    );
}

/// One format: a ztrain checkpoint is a zgrad checkpoint (its step in `zgrad.step`, its
/// parameters and moments where zgrad's reader looks), with the run's counters beside.
#[test]
fn a_ztrain_checkpoint_is_a_zgrad_checkpoint() {
    let bytes = sample().to_bytes().expect("bytes");
    let path = Path::new("ck");
    let file = CheckpointFile::<f32>::from_bytes(&bytes, path).expect("zgrad reads it");
    assert_eq!(file.step(path).expect("step"), 7);
    assert_eq!(file.parameters, sample().params);
    assert_eq!(file.optimizer, sample().optim);
    assert_eq!(
        file.other[T_ORDER].to_u64s().expect("u64"),
        vec![3, 0, 2, 1]
    );
}
