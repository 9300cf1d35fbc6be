//! `--stream`: a `.npy` pair, an `.npz` of stored members or a safetensors file left on disk,
//! each batch's rows read by position into the one pinned staging batch; a Parquet file read
//! by row group, a column chunk's pages at a time; an Arrow IPC file by record batch; a CSV
//! file by a row index built in one pass: the run equals the one that reads the file whole,
//! bit for bit, and holds one batch of samples (and the table reader's bound), not the file.

use super::data_files::{
    held_by, host_data_numbers, npy_x, npy_y, run_result_on, safetensors_bytes, write_arrow,
    write_npz_as, write_parquet,
};
use super::{assert_fails_with, path_str, tiny};
use ztrain::data::synthetic;

/// The `--data` arguments of the same samples as a `.npy` pair, as safetensors, as Parquet
/// (row groups of 50 rows: 50, 50, 20), as Arrow IPC, as an `.npz` of stored members and as
/// CSV, in `dir`.
pub(crate) fn files(dir: &std::path::Path) -> [Vec<String>; 6] {
    let d = synthetic::generate(120, 3, 6, 5);
    let p = |n: &str| path_str(&dir.join(n)).to_string();
    std::fs::write(dir.join("x.npy"), npy_x(&d)).expect("x.npy");
    std::fs::write(dir.join("y.npy"), npy_y(&d)).expect("y.npy");
    std::fs::write(dir.join("d.safetensors"), safetensors_bytes(&d)).expect("safetensors");
    write_parquet(&d, &dir.join("d.parquet"), 50);
    write_arrow(&d, &dir.join("d.arrow"));
    write_npz_as(&d, &dir.join("d.npz"), zip::CompressionMethod::Stored);
    std::fs::write(dir.join("d.csv"), ztrain::data::csv::to_csv(&d)).expect("csv");
    [
        vec!["--data".into(), p("x.npy"), "--labels".into(), p("y.npy")],
        vec!["--data".into(), p("d.safetensors")],
        vec!["--data".into(), p("d.parquet")],
        vec!["--data".into(), p("d.arrow")],
        vec!["--data".into(), p("d.npz")],
        vec!["--data".into(), p("d.csv")],
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

/// `--normalize` with `--stream`: the statistics from a first pass over the training rows in
/// the file, bit for bit the ones the run that reads the file whole computes (the checkpoint
/// stores them as exact text), and the run then the same, bit for bit.
#[test]
fn a_streamed_run_normalises_by_the_statistics_of_the_file_read_whole() {
    let dir = tempfile::tempdir().expect("tempdir");
    for data in files(dir.path()) {
        let data: Vec<&str> = data.iter().map(String::as_str).collect();
        let args = [
            &data[..],
            &["--epochs", "1", "--batch", "16", "--normalize"],
        ]
        .concat();
        let statistics = |extra: &[&str]| {
            let ck = dir.path().join("norm.st");
            let o = tiny(
                &[
                    &args[..],
                    extra,
                    &["--device", "cpu", "--checkpoint", path_str(&ck)],
                ]
                .concat(),
            );
            assert!(o.status.success(), "{:?}", super::text(&o));
            let ck = ztrain::checkpoint::Checkpoint::load(&ck).expect("checkpoint");
            ck.config["normalization"].clone()
        };
        let whole = statistics(&[]);
        assert!(
            whole["mean"].as_array().is_some_and(|m| m.len() == 6),
            "{whole}"
        );
        assert_eq!(statistics(&["--stream"]), whole, "{data:?}");
        let whole = run_result_on(&["--device", "cpu"], &args);
        let streamed = run_result_on(&["--device", "cpu"], &[&args[..], &["--stream"]].concat());
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
        assert!(
            whole[1] >= 120 * (width + 1) * 4,
            "the file read whole: {whole:?}"
        );
        if [".parquet", ".arrow", ".csv"]
            .iter()
            .any(|e| data[1].ends_with(e))
        {
            // A table's reader holds a bound of its own: Parquet's pages of one column chunk
            // (the largest chunk, compressed and decoded, and its read buffer), Arrow's one
            // record batch, CSV's row index and one row; counted in the total.
            let line = parquet_line(&data);
            let numbers = host_data_numbers(&line);
            let [held, samples, staging, evaluation, reader] = numbers[..] else {
                panic!("five numbers in `{line}`")
            };
            assert_eq!(
                (samples, staging, evaluation),
                (0, batch * (width + 1) * 4, batch * 4)
            );
            assert_eq!(held, one_batch + reader, "{line}");
            if data[1].ends_with(".arrow") {
                // One record batch of 120 rows of 19 float columns, and its buffers' padding.
                assert!(line.contains("Arrow IPC reader at most"), "{line}");
                assert!(
                    (120 * 19 * 4..120 * 19 * 4 + 19 * 256).contains(&reader),
                    "{line}"
                );
                continue;
            }
            if data[1].ends_with(".csv") {
                // An 8-byte start a row (121 with the file's end) and the longest row.
                assert!(line.contains("CSV reader at most"), "{line}");
                assert!(reader > 121 * 8 && reader < 121 * 8 + 1024, "{line}");
                continue;
            }
            assert!(line.contains("Parquet reader at most"), "{line}");
            // The 8 KiB read buffer and a column chunk of at most 50 float rows (a few hundred
            // bytes each way, headers and dictionary included).
            assert!(
                reader > 8 * 1024 + 2 * 50 && reader < 8 * 1024 + 2 * 1024,
                "{line}"
            );
            continue;
        }
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
    }
}

/// The `host data held` line of a streamed one-epoch run of `data`.
fn parquet_line(data: &[&str]) -> String {
    let o = super::tiny(
        &[
            &[
                "--device", "cpu", "--epochs", "1", "--batch", "8", "--stream",
            ][..],
            data,
        ]
        .concat(),
    );
    let (stdout, stderr) = super::text(&o);
    assert!(o.status.success(), "{stdout}\n{stderr}");
    stdout
        .lines()
        .find(|l| l.starts_with("ztrain: host data held:"))
        .unwrap_or_else(|| panic!("no host data line in\n{stdout}"))
        .to_string()
}

#[test]
fn stream_refuses_what_it_cannot_read_by_position() {
    let dir = tempfile::tempdir().expect("tempdir");
    let [_, tensors, ..] = files(dir.path());
    // An .npz of deflated members (np.savez_compressed) has no row at a known offset.
    let packed = dir.path().join("packed.npz");
    let d = synthetic::generate(20, 3, 6, 5);
    super::data_files::write_npz_as(&d, &packed, zip::CompressionMethod::Deflated);
    let o = tiny(&["--device", "cpu", "--data", path_str(&packed), "--stream"]);
    assert_fails_with(
        &o,
        &["packed.npz", "compressed", "np.savez", "drop --stream"],
    );
    let o = tiny(&[
        "--device",
        "cpu",
        "--data",
        path_str(&dir.path().join("d.parquet")),
        "--stream",
        "--window",
        "4",
    ]);
    assert_eq!(o.status.code(), Some(2), "--window and --stream: {:?}", o);
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
