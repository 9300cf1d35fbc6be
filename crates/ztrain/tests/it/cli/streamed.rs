//! `--stream`: a `.npy` pair or a safetensors file left on disk, each batch's rows read by
//! position into the one pinned staging batch: the run equals the one that reads the file
//! whole, bit for bit, and holds one batch of samples, not the file.

use super::data_files::{held_by, npy_x, npy_y, run_result_on, safetensors_bytes};
use super::{assert_fails_with, path_str, tiny};
use ztrain::data::synthetic;

/// The `--data` arguments of the same samples as a `.npy` pair and as safetensors, in `dir`.
fn files(dir: &std::path::Path) -> [Vec<String>; 2] {
    let d = synthetic::generate(120, 3, 6, 5);
    let p = |n: &str| path_str(&dir.join(n)).to_string();
    std::fs::write(dir.join("x.npy"), npy_x(&d)).expect("x.npy");
    std::fs::write(dir.join("y.npy"), npy_y(&d)).expect("y.npy");
    std::fs::write(dir.join("d.safetensors"), safetensors_bytes(&d)).expect("safetensors");
    [
        vec!["--data".into(), p("x.npy"), "--labels".into(), p("y.npy")],
        vec!["--data".into(), p("d.safetensors")],
    ]
}

#[rstest::rstest]
#[case::cpu(&["--device", "cpu"])]
#[case::sim(&["--device", "sim", "--sim-memory", "256M"])]
fn a_streamed_file_trains_bitwise_as_the_file_read_whole(#[case] device: &[&str]) {
    let dir = tempfile::tempdir().expect("tempdir");
    for data in files(dir.path()) {
        let data: Vec<&str> = data.iter().map(String::as_str).collect();
        let args = [&data[..], &["--epochs", "2", "--batch", "16"]].concat();
        let whole = run_result_on(device, &args);
        let streamed = run_result_on(device, &[&args[..], &["--stream"]].concat());
        assert_eq!(whole.0, streamed.0, "{data:?}: the epochs' losses");
        assert!(whole.1 == streamed.1, "{data:?}: parameters differ");
    }
}

#[test]
fn a_streamed_run_holds_one_batch_not_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (batch, width) = (8u64, 3 * 6u64);
    // A batch of samples with a label each (the pinned staging), and one chunk's logits.
    let one_batch = batch * (width + 1) * 4 + batch * 4;
    for data in files(dir.path()) {
        let data: Vec<&str> = data.iter().map(String::as_str).collect();
        let whole = held_by(&data);
        let streamed = held_by(&[&data[..], &["--stream"]].concat());
        let [held, samples, staging, evaluation] = streamed;
        assert_eq!(
            samples, 0,
            "{data:?}: nothing of the file in memory: {streamed:?}"
        );
        assert_eq!(
            staging,
            batch * (width + 1) * 4,
            "one pinned batch: {streamed:?}"
        );
        assert_eq!(evaluation, batch * 4, "a chunk's logits: {streamed:?}");
        assert_eq!(held, one_batch);
        assert!(
            whole[1] >= 120 * (width + 1) * 4,
            "the file read whole: {whole:?}"
        );
    }
}

#[test]
fn stream_refuses_what_it_cannot_read_by_position() {
    let dir = tempfile::tempdir().expect("tempdir");
    let [_, tensors] = files(dir.path());
    let csv = dir.path().join("d.csv");
    std::fs::write(
        &csv,
        ztrain::data::csv::to_csv(&synthetic::generate(20, 3, 6, 5)),
    )
    .expect("csv");
    let o = tiny(&["--device", "cpu", "--data", path_str(&csv), "--stream"]);
    assert_fails_with(&o, &["--stream reads rows by position", "d.csv"]);
    let o = tiny(&[
        "--device",
        "cpu",
        "--data",
        &tensors[1],
        "--stream",
        "--normalize",
    ]);
    assert_fails_with(&o, &["--stream with --normalize"]);
    // A safetensors file cut short: refused at the start, naming the file and the array.
    let bytes = std::fs::read(&tensors[1]).expect("read");
    let cut = dir.path().join("cut.safetensors");
    std::fs::write(&cut, &bytes[..bytes.len() - 9]).expect("write");
    let metrics = dir.path().join("m.csv");
    let o = tiny(&[
        "--device",
        "cpu",
        "--data",
        path_str(&cut),
        "--stream",
        "--metrics",
        path_str(&metrics),
    ]);
    assert_fails_with(&o, &["cut.safetensors", "array `y`", "truncated"]);
    assert!(!metrics.exists(), "nothing written");
}
