//! `--data` in every format: the same synthetic samples as CSV, Parquet, Arrow IPC, `.npz`, a
//! pair of `.npy` files and safetensors train to the same parameters and validation losses,
//! bit for bit; hostile files stop the run with the file, the place and what was expected,
//! before anything is written. `--window`: bars cut on the fly equal the pre-cut windows.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{ArrayRef, Float32Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use parquet::data_type::FloatType;
use parquet::file::writer::SerializedFileWriter;

use super::{assert_fails_with, path_str, text, tiny};
use ztrain::data::{Dataset, csv, npy, synthetic};

/// Column names of a data set's table (the CSV's header): the features, then `label` or
/// `y_0 .. y_{K-1}` for `K` target values a sample.
fn names(d: &Dataset) -> Vec<String> {
    let mut n: Vec<String> = (0..d.sample_width()).map(|i| format!("x{i}")).collect();
    match d.targets() {
        1 => n.push("label".into()),
        t => n.extend((0..t).map(|k| format!("y_{k}"))),
    }
    n
}

/// The table's columns: each feature column, then each label column.
fn columns(d: &Dataset) -> Vec<Vec<f32>> {
    let (w, t) = (d.sample_width(), d.targets());
    let mut cols: Vec<Vec<f32>> = (0..w)
        .map(|c| (0..d.len()).map(|r| d.x[r * w + c]).collect())
        .collect();
    cols.extend((0..t).map(|k| (0..d.len()).map(|r| d.y[r * t + k]).collect()));
    cols
}

/// The shape of `y` for `d`: `[N]`, or `[N, K]` for `K` target values a sample.
fn y_shape(d: &Dataset) -> Vec<usize> {
    match d.targets() {
        1 => vec![d.len()],
        t => vec![d.len(), t],
    }
}

/// Writes `d` as a Parquet table of float columns in row groups of `group` rows.
pub fn write_parquet(d: &Dataset, path: &Path, group: usize) {
    let fields: String = names(d)
        .iter()
        .map(|n| format!("required float {n};"))
        .collect();
    let schema = parquet::schema::parser::parse_message_type(&format!("message m {{ {fields} }}"))
        .expect("schema");
    let file = std::fs::File::create(path).expect("create");
    let mut w =
        SerializedFileWriter::new(file, Arc::new(schema), Default::default()).expect("writer");
    let cols = columns(d);
    for start in (0..d.len()).step_by(group) {
        let end = (start + group).min(d.len());
        let mut rg = w.next_row_group().expect("row group");
        let mut c = 0;
        while let Some(mut col) = rg.next_column().expect("column") {
            col.typed::<FloatType>()
                .write_batch(&cols[c][start..end], None, None)
                .expect("values");
            col.close().expect("close column");
            c += 1;
        }
        rg.close().expect("close row group");
    }
    w.close().expect("close");
}

/// Writes `d` as an Arrow IPC file of float32 columns.
pub(crate) fn write_arrow(d: &Dataset, path: &Path) {
    let fields: Vec<Field> = names(d)
        .iter()
        .map(|n| Field::new(n, DataType::Float32, false))
        .collect();
    let schema = Arc::new(Schema::new(fields));
    let arrays: Vec<ArrayRef> = columns(d)
        .into_iter()
        .map(|c| Arc::new(Float32Array::from(c)) as ArrayRef)
        .collect();
    let batch = RecordBatch::try_new(Arc::clone(&schema), arrays).expect("batch");
    let file = std::fs::File::create(path).expect("create");
    let mut w = arrow_ipc::writer::FileWriter::try_new(file, &schema).expect("writer");
    w.write(&batch).expect("batch");
    w.finish().expect("finish");
}

pub(crate) fn npy_x(d: &Dataset) -> Vec<u8> {
    npy::npy_f32(&[d.len(), d.scales, d.features], &d.x)
}

pub(crate) fn npy_y(d: &Dataset) -> Vec<u8> {
    npy::npy_f32(&y_shape(d), &d.y)
}

/// Writes `d` as `np.savez_compressed` would: `x.npy` and `y.npy`, deflated, in a zip.
fn write_npz(d: &Dataset, path: &Path) {
    write_npz_as(d, path, zip::CompressionMethod::Deflated);
}

/// Writes `d` as `x.npy` and `y.npy` in a zip, each member `method` (`Stored`: `np.savez`;
/// `Deflated`: `np.savez_compressed`).
pub(crate) fn write_npz_as(d: &Dataset, path: &Path, method: zip::CompressionMethod) {
    use std::io::Write as _;
    let mut z = zip::ZipWriter::new(std::fs::File::create(path).expect("create"));
    let options = zip::write::SimpleFileOptions::default().compression_method(method);
    for (name, bytes) in [("x.npy", npy_x(d)), ("y.npy", npy_y(d))] {
        z.start_file(name, options).expect("entry");
        z.write_all(&bytes).expect("bytes");
    }
    z.finish().expect("finish");
}

pub(crate) fn safetensors_bytes(d: &Dataset) -> Vec<u8> {
    let xb: Vec<u8> = d.x.iter().flat_map(|v| v.to_le_bytes()).collect();
    let yb: Vec<u8> = d.y.iter().flat_map(|v| v.to_le_bytes()).collect();
    let x = safetensors::tensor::TensorView::new(
        safetensors::Dtype::F32,
        vec![d.len(), d.scales, d.features],
        &xb,
    )
    .expect("x");
    let y =
        safetensors::tensor::TensorView::new(safetensors::Dtype::F32, y_shape(d), &yb).expect("y");
    safetensors::serialize([("x", x), ("y", y)], None).expect("serialise")
}

fn tv(shape: Vec<usize>, b: &[u8]) -> safetensors::tensor::TensorView<'_> {
    safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape, b).expect("view")
}

/// The same data set in every format, in `dir`: the `--data` arguments of each.
pub(crate) fn every_format(d: &Dataset, dir: &Path) -> Vec<Vec<String>> {
    let p = |n: &str| dir.join(n);
    std::fs::write(p("d.csv"), csv::to_csv(d)).expect("csv");
    write_parquet(d, &p("d.parquet"), 50);
    write_arrow(d, &p("d.arrow"));
    write_npz(d, &p("d.npz"));
    std::fs::write(p("x.npy"), npy_x(d)).expect("x.npy");
    std::fs::write(p("y.npy"), npy_y(d)).expect("y.npy");
    std::fs::write(p("d.safetensors"), safetensors_bytes(d)).expect("safetensors");
    let s = |path: PathBuf| path_str(&path).to_string();
    vec![
        vec!["--data".into(), s(p("d.csv"))],
        vec!["--data".into(), s(p("d.parquet"))],
        vec!["--data".into(), s(p("d.arrow"))],
        vec!["--data".into(), s(p("d.npz"))],
        vec![
            "--data".into(),
            s(p("x.npy")),
            "--labels".into(),
            s(p("y.npy")),
        ],
        vec!["--data".into(), s(p("d.safetensors"))],
    ]
}

/// A run's epoch rows of `--metrics` without the timing columns (exact losses), and its
/// final parameters' bits.
fn run_result(extra: &[&str]) -> (Vec<String>, Vec<(String, Vec<u32>)>) {
    run_result_on(&["--device", "cpu"], extra)
}

/// `run_result` on the device `device` names (`--device` and its options).
pub(super) fn run_result_on(
    device: &[&str],
    extra: &[&str],
) -> (Vec<String>, Vec<(String, Vec<u32>)>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (metrics, ck) = (dir.path().join("m.csv"), dir.path().join("ck.st"));
    let o = tiny(
        &[
            extra,
            device,
            &[
                "--metrics",
                path_str(&metrics),
                "--checkpoint",
                path_str(&ck),
            ],
        ]
        .concat(),
    );
    assert!(o.status.success(), "{:?}", text(&o));
    let rows = std::fs::read_to_string(&metrics)
        .expect("metrics")
        .lines()
        .map(|l| {
            let cells: Vec<&str> = l.split(',').collect();
            // kind .. val_accuracy: leave out samples/s and elapsed time.
            cells[..8].join(",")
        })
        .collect();
    let params = ztrain::checkpoint::Checkpoint::load(&ck)
        .expect("checkpoint")
        .params
        .into_iter()
        .map(|(n, t)| (n, t.data.iter().map(|v| v.to_bits()).collect()))
        .collect();
    (rows, params)
}

#[test]
fn every_format_trains_to_the_same_validation_loss_bitwise() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = synthetic::generate(120, 3, 6, 5);
    let mut results = Vec::new();
    for args in every_format(&d, dir.path()) {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        results.push((
            args.join(" "),
            run_result(&[&args[..], &["--epochs", "2"]].concat()),
        ));
    }
    let (first, (rows, params)) = &results[0];
    assert_eq!(rows.len(), 3, "header and two epochs: {rows:?}");
    assert!(rows[2].starts_with("epoch,2,"), "{rows:?}");
    for (name, (r, p)) in &results[1..] {
        assert_eq!(r, rows, "{name} against {first}");
        assert!(p == params, "{name}: parameters differ from {first}");
    }
}

/// A list of owned arguments from literals and paths.
macro_rules! owned {
    ($($a:expr),* $(,)?) => { vec![$(String::from($a)),*] };
}

/// One bad file of each kind: the run fails naming the file, the place and what was
/// expected, and writes neither its checkpoint nor its metrics.
#[test]
fn hostile_files_are_refused_by_name_and_place_and_nothing_is_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = |n: &str| dir.path().join(n);
    let d = synthetic::generate(20, 3, 6, 5);
    // A CSV under a Parquet name; a Parquet file under an .npz name.
    std::fs::write(p("csv.parquet"), csv::to_csv(&d)).expect("write");
    write_parquet(&d, &p("real.parquet"), 10);
    std::fs::copy(p("real.parquet"), p("parquet.npz")).expect("copy");
    // A table of 18 columns: all features for 3 × 6, no label.
    let short = Dataset {
        scales: 1,
        features: 17,
        x: (0..20 * 17).map(|v| (v % 7) as f32).collect(),
        y: vec![0.0; 20],
    };
    write_arrow(&short, &p("short.arrow"));
    // NaN in the Parquet table at row 4, column 7.
    let mut nan = d.clone();
    nan.x[3 * 18 + 6] = f32::NAN;
    write_parquet(&nan, &p("nan.parquet"), 10);
    // A corrupt page: the middle of a row group's data overwritten.
    let mut bytes = std::fs::read(p("real.parquet")).expect("read");
    for b in &mut bytes[40..200] {
        *b = 0xAB;
    }
    std::fs::write(p("corrupt.parquet"), bytes).expect("write");
    // A truncated .npy; an .npz without y.
    let x = npy_x(&d);
    std::fs::write(p("cut.npy"), &x[..x.len() - 7]).expect("write");
    std::fs::write(p("y.npy"), npy_y(&d)).expect("write");
    {
        use std::io::Write as _;
        let mut z = zip::ZipWriter::new(std::fs::File::create(p("noy.npz")).expect("create"));
        z.start_file("x.npy", zip::write::SimpleFileOptions::default())
            .expect("entry");
        z.write_all(&x).expect("x");
        z.finish().expect("finish");
    }
    // Labels of 2 columns in safetensors.
    let xb: Vec<u8> = d.x.iter().flat_map(|v| v.to_le_bytes()).collect();
    let yb: Vec<u8> = [0.0f32; 40].iter().flat_map(|v| v.to_le_bytes()).collect();
    let two = safetensors::serialize(
        [("x", tv(vec![20, 3, 6], &xb)), ("y", tv(vec![20, 2], &yb))],
        None,
    )
    .expect("serialise");
    std::fs::write(p("k2.safetensors"), two).expect("write");
    let s = |n: &str| path_str(&p(n)).to_string();
    let cases: Vec<(Vec<String>, Vec<&str>)> = vec![
        (
            owned!["--data", s("csv.parquet")],
            vec!["csv.parquet: Parquet", "not a Parquet file"],
        ),
        (
            owned!["--data", s("parquet.npz")],
            vec!["parquet.npz: NumPy .npz", "not a NumPy .npz file"],
        ),
        (
            owned![
                "--data",
                s("short.arrow"),
                "--scales",
                "3",
                "--features",
                "5",
            ],
            vec!["short.arrow: Arrow IPC", "expected 16 columns", "found 18"],
        ),
        (
            owned![
                "--data",
                s("short.arrow"),
                "--scales",
                "3",
                "--features",
                "6",
            ],
            vec!["short.arrow: Arrow IPC", "the label column is missing"],
        ),
        (
            owned!["--data", s("nan.parquet")],
            vec![
                "nan.parquet: Parquet, row 4, column 7 (`x6`)",
                "NaN where a finite number",
            ],
        ),
        (
            owned!["--data", s("corrupt.parquet")],
            vec!["corrupt.parquet: Parquet", "corrupt"],
        ),
        (
            owned!["--data", s("cut.npy"), "--labels", s("y.npy"),],
            vec!["cut.npy: NumPy .npy, array `x`", "truncated", "1440 bytes"],
        ),
        (
            owned!["--data", s("noy.npz")],
            vec!["noy.npz: NumPy .npz", "no array `y`"],
        ),
        (
            owned!["--data", s("k2.safetensors")],
            vec![
                "k2.safetensors: safetensors, array `y`",
                "[N] or [N, 1]",
                "[20, 2]",
            ],
        ),
        (
            owned![
                "--data",
                s("real.parquet"),
                "--window",
                "30",
                "--features",
                "18",
            ],
            vec![
                "real.parquet: Parquet",
                "--window 30 is longer than the series (20 rows)",
            ],
        ),
    ];
    for (args, needles) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (ck, metrics) = (p("ck.st"), p("m.csv"));
        let o = tiny(
            &[
                &args[..],
                &[
                    "--device",
                    "cpu",
                    "--checkpoint",
                    path_str(&ck),
                    "--metrics",
                    path_str(&metrics),
                ],
            ]
            .concat(),
        );
        assert_fails_with(&o, &needles);
        assert!(
            !ck.exists() && !metrics.exists(),
            "{args:?} wrote an output"
        );
    }
}

/// The bars of a series: `rows` time steps of `features` values and a 0/1 label.
fn bars(rows: usize, features: usize) -> Dataset {
    let d = synthetic::generate(rows, 1, features, 11);
    Dataset { scales: 1, ..d }
}

/// The pre-cut windows of `bars` a walk-forward split keeps: training windows `0..n_train`,
/// then validation windows `val_first..`, one sample a row.
fn pre_cut(bars: &Dataset, window: usize, n_train: usize, val_first: usize) -> Dataset {
    let f = bars.features;
    let total = bars.len() - window + 1;
    let starts: Vec<usize> = (0..n_train).chain(val_first..total).collect();
    let mut x = Vec::new();
    let mut y = Vec::new();
    for s in starts {
        x.extend_from_slice(&bars.x[s * f..(s + window) * f]);
        y.push(bars.y[s + window - 1]);
    }
    Dataset {
        scales: window,
        features: f,
        x,
        y,
    }
}

/// On the simulated device too, whose copies from pinned memory run when the stream is
/// waited on: the one staging batch of a windowed run is refilled only after its copy.
#[rstest::rstest]
#[case::cpu(&["--device", "cpu"])]
#[case::sim(&["--device", "sim", "--sim-memory", "256M"])]
fn windows_cut_on_the_fly_equal_the_pre_cut_windows(#[case] device: &[&str]) {
    let dir = tempfile::tempdir().expect("tempdir");
    // 43 bars, windows of 4: 40 windows, the last 10 validate (a quarter), training windows
    // 0..27 end before bar 30. The pre-cut file holds those 37 windows: its last quarter,
    // rounded up, is the same 10.
    let series = bars(43, 6);
    write_parquet(&series, &dir.path().join("bars.parquet"), 16);
    std::fs::write(
        dir.path().join("windows.csv"),
        csv::to_csv(&pre_cut(&series, 4, 27, 30)),
    )
    .expect("write");
    let common = [
        "--validate-fraction",
        "0.25",
        "--batch",
        "8",
        "--epochs",
        "2",
    ];
    let on_the_fly = run_result_on(
        device,
        &[
            &common[..],
            &[
                "--data",
                path_str(&dir.path().join("bars.parquet")),
                "--window",
                "4",
            ],
        ]
        .concat(),
    );
    let cut = run_result_on(
        device,
        &[
            &common[..],
            &[
                "--data",
                path_str(&dir.path().join("windows.csv")),
                "--scales",
                "4",
            ],
        ]
        .concat(),
    );
    assert_eq!(on_the_fly.0, cut.0);
    assert!(on_the_fly.1 == cut.1, "parameters differ");
}

#[test]
fn a_window_run_says_its_split_and_resumes_with_its_statistics() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bars.csv");
    let series = bars(60, 6);
    std::fs::write(&path, csv::to_csv(&series)).expect("write");
    let o = tiny(&[
        "--device",
        "cpu",
        "--data",
        path_str(&path),
        "--window",
        "5",
        "--gap",
        "3",
        "--normalize",
        "--validate-fraction",
        "0.2",
    ]);
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stdout}\n{stderr}");
    // 56 windows: 12 validate (first bar 44); training windows end by bar 40: 37 of them.
    assert!(
        stdout.contains("S=5") && stdout.contains("37 train / 12 validation samples"),
        "{stdout}"
    );
    crate::common::resume_matches_uninterrupted(
        &[
            "--data",
            path_str(&path),
            "--window",
            "5",
            "--gap",
            "3",
            "--normalize",
        ],
        "3",
    );
}

/// The numbers of a run's `host data held:` line: held, samples, staging, evaluation chunk.
pub(super) fn host_data(stdout: &str) -> [u64; 4] {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("ztrain: host data held:"))
        .unwrap_or_else(|| panic!("no host data line in\n{stdout}"));
    host_data_numbers(line)
        .try_into()
        .unwrap_or_else(|n| panic!("{n:?} in `{line}`"))
}

/// The numbers of a `host data held` line, in order.
pub(super) fn host_data_numbers(line: &str) -> Vec<u64> {
    line.split(|c: char| !c.is_ascii_digit())
        .filter(|t| !t.is_empty())
        .map(|t| t.parse().expect("number"))
        .collect()
}

/// The host bytes `ztrain` says a run of `args` held for its data.
pub(super) fn held_by(args: &[&str]) -> [u64; 4] {
    let o = tiny(
        &[
            &["--device", "cpu", "--epochs", "1", "--batch", "8"][..],
            args,
        ]
        .concat(),
    );
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stdout}\n{stderr}");
    host_data(&stdout)
}

#[test]
fn a_window_run_holds_the_series_and_one_batch_of_windows_not_every_window() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (rows, features, window, batch) = (400usize, 6usize, 16usize, 8usize);
    let series = bars(rows, features);
    let bars_path = dir.path().join("bars.parquet");
    write_parquet(&series, &bars_path, 64);
    // 385 windows: 97 validate (first at 288), training windows 0..273.
    let cut = pre_cut(&series, window, 273, 288);
    let cut_path = dir.path().join("windows.parquet");
    write_parquet(&cut, &cut_path, 64);

    let f32_bytes = 4u64;
    let series_bytes = (rows * (features + 1)) as u64 * f32_bytes;
    // A batch of windows with a label and a logit each; the run holds one: the pinned batch
    // steps are staged in, which an evaluation also cuts its chunks into (the bound).
    let batch_bytes = (batch * (window * features + 2)) as u64 * f32_bytes;
    let bound = series_bytes + batch_bytes;
    let common = ["--validate-fraction", "0.25"];

    // On the simulated device, so that the memory report (which needs an arena) says it too.
    let report = dir.path().join("m.html");
    let on_the_fly = held_by(
        &[
            &common[..],
            &["--data", path_str(&bars_path), "--window", "16"],
            &["--device", "sim", "--sim-memory", "256M"],
            &["--memory-report", path_str(&report)],
        ]
        .concat(),
    );
    let html = std::fs::read_to_string(&report).expect("report");
    assert!(
        html.contains("host data") && html.contains("series of bars (once)"),
        "the memory report says the host's data bytes"
    );
    assert_eq!(
        on_the_fly[1], series_bytes,
        "the series, stored once: {on_the_fly:?}"
    );
    assert!(on_the_fly[0] <= bound, "{on_the_fly:?} > {bound}");

    // The same windows pre-cut: held as N windows of S·F values; the bound refuses it.
    let pre_cut_run = held_by(
        &[
            &common[..],
            &["--data", path_str(&cut_path), "--scales", "16"],
        ]
        .concat(),
    );
    let every_window = (cut.len() * window * features) as u64 * f32_bytes;
    assert!(pre_cut_run[0] >= every_window, "{pre_cut_run:?}");
    assert!(
        pre_cut_run[0] > bound,
        "the check would pass materialised windows"
    );
}
