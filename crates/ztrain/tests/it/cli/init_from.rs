//! `--init-from`: one step from the oracle's input lands on the oracle's update; files that
//! cannot be the model are refused.

use crate::common;

use common::{assert_fails_with, path_str, text, ztrain};

/// An oracle fixture (tests/fixtures): its parameter file, and its x and y as a CSV file
/// in `dir` (S·F feature columns, then the label).
fn oracle_run_files(dir: &std::path::Path, name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
    let input = fixtures.join(format!("xasset_{name}_in.safetensors"));
    let file = zgrad::read_tensors::<f64>(&input).expect("fixture");
    let (x, y) = (&file.tensors["x"], &file.tensors["y"]);
    let per = x.shape[1] * x.shape[2];
    let mut csv = (0..per)
        .map(|i| format!("c{i}"))
        .collect::<Vec<_>>()
        .join(",")
        + ",label\n";
    for (i, label) in y.data.iter().enumerate() {
        let row: Vec<String> = x.data[i * per..(i + 1) * per]
            .iter()
            .map(|v| format!("{}", *v as f32))
            .collect();
        csv += &format!("{},{}\n", row.join(","), *label as u8);
    }
    let data = dir.join(format!("{name}.csv"));
    std::fs::write(&data, csv).expect("csv");
    (input, data)
}

/// Issue 19: `--init-from` an oracle input, one batched step over the fixture's batch with
/// the oracle's AdamW settings (ztrain's defaults: lr 1e-3, betas 0.9/0.999, eps 1e-8, weight
/// decay 0.01): the checkpoint's parameters are the oracle's `adamw.*` within 1e-5 per tensor
/// (kn.bias, whose update is the sign of rounding noise, within 2·lr per element).
#[test]
fn init_from_an_oracle_input_steps_to_the_oracle_update() {
    for (name, sizes) in [
        ("tiny", ["7", "3", "8", "2", "16", "1", "4"]),
        ("deep2", ["7", "3", "8", "2", "16", "2", "4"]),
        ("deep3", ["5", "4", "12", "3", "8", "3", "5"]),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let (input, data) = oracle_run_files(dir.path(), name);
        let ck = dir.path().join("ck.safetensors");
        let [f, s, d, h, ff, l, b] = sizes;
        let o = ztrain(&[
            "--device",
            "cpu",
            "--init-from",
            path_str(&input),
            "--data",
            path_str(&data),
            "--validate-fraction",
            "0",
            "--features",
            f,
            "--scales",
            s,
            "--width",
            d,
            "--heads",
            h,
            "--ff",
            ff,
            "--layers",
            l,
            "--batch",
            b,
            "--epochs",
            "1",
            "--checkpoint",
            path_str(&ck),
        ]);
        let (stdout, stderr) = text(&o);
        assert!(o.status.success(), "{name}:\n{stdout}\n{stderr}");
        assert!(
            stdout.contains("optimiser moments zero, step 0"),
            "{stdout}"
        );
        let c = ztrain::checkpoint::Checkpoint::load(&ck).expect("checkpoint");
        assert_eq!(c.progress.step, 1);
        let fixtures = input.parent().expect("folder").to_path_buf();
        let oracle =
            zgrad::read_tensors::<f64>(&fixtures.join(format!("xasset_{name}_oracle.safetensors")))
                .expect("oracle");
        let params = oracle
            .tensors
            .keys()
            .filter_map(|k| k.strip_prefix("adamw."))
            .count();
        assert_eq!(c.params.len(), params, "{name}: every parameter, no other");
        for (pname, t) in &c.params {
            let want = &oracle.tensors[&format!("adamw.{pname}")].data;
            let got: Vec<f64> = t.data.iter().map(|&v| f64::from(v)).collect();
            if pname.ends_with("kn.bias") {
                let apart = got
                    .iter()
                    .zip(want)
                    .map(|(a, w)| (a - w).abs())
                    .fold(0.0, f64::max);
                assert!(apart <= 2e-3, "{name} {pname}: {apart:e}");
                continue;
            }
            let diff: f64 = got.iter().zip(want).map(|(a, w)| (a - w).powi(2)).sum();
            let norm: f64 = want.iter().map(|w| w * w).sum();
            let e = (diff / norm).sqrt();
            assert!(e <= 1e-5, "{name} adamw.{pname}: relative error {e:e}");
        }
    }
}

/// `--init-from` of a file that cannot be the options' model: typed errors naming the
/// problem (other depth and width, a missing file, a directory, a corrupt file), exit 1.
#[test]
fn init_from_refuses_files_that_are_not_the_model() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (input, data) = oracle_run_files(dir.path(), "deep2");
    let run = |file: &str, layers: &str, width: &str| {
        ztrain(&[
            "--device",
            "cpu",
            "--init-from",
            file,
            "--data",
            path_str(&data),
            "--validate-fraction",
            "0",
            "--features",
            "7",
            "--scales",
            "3",
            "--width",
            width,
            "--heads",
            "2",
            "--ff",
            "16",
            "--layers",
            layers,
            "--batch",
            "4",
            "--epochs",
            "1",
        ])
    };
    assert_fails_with(
        &run(path_str(&input), "3", "16"),
        &[
            "--init-from",
            "layers: file 2, asked 3",
            "width: file 8, asked 16",
        ],
    );
    let missing = dir.path().join("none.safetensors");
    assert_fails_with(
        &run(path_str(&missing), "2", "8"),
        &["none.safetensors", "No such file"],
    );
    assert_fails_with(
        &run(path_str(dir.path()), "2", "8"),
        &["--init-from", "directory"],
    );
    let corrupt = dir.path().join("corrupt.safetensors");
    std::fs::write(&corrupt, b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":").expect("write");
    assert_fails_with(
        &run(path_str(&corrupt), "2", "8"),
        &["--init-from", "corrupt.safetensors"],
    );
    let o = ztrain(&[
        "--init-from",
        path_str(&input),
        "--resume",
        path_str(&input),
    ]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "--init-from and --resume exclude each other"
    );
}

/// Issue 42: a bf16 parameter file (a PyTorch bf16 `state_dict`) starts a run from float32
/// masters of its values: one step from the bf16 oracle input ends bitwise where one step from
/// a float32 file of the same (bf16-rounded) values ends. The same file given to `--resume` is
/// refused (resuming needs float32 masters and moments), naming a tensor and its dtype.
#[test]
fn a_bf16_file_starts_a_run_as_its_float32_values_and_never_resumes_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (input, data) = oracle_run_files(dir.path(), "tiny");
    let file = zgrad::read_tensors::<f32>(&input).expect("fixture");
    let tensors: Vec<(String, zgrad::HostTensor<f32>)> = file.tensors.into_iter().collect();
    let bf16_file = dir.path().join("bf16.safetensors");
    zgrad::write_tensors_as(&bf16_file, &tensors, None, zgrad::FileDtype::Bf16).expect("bf16");
    // The float32 file of the values the bf16 file holds (their rounding is zgrad's test).
    let rounded: Vec<(String, zgrad::HostTensor<f32>)> = zgrad::read_tensors::<f32>(&bf16_file)
        .expect("bf16 read")
        .tensors
        .into_iter()
        .collect();
    assert_ne!(rounded, tensors, "the fixture is not already bf16");
    let f32_file = dir.path().join("f32.safetensors");
    zgrad::write_tensors(&f32_file, &rounded, None).expect("f32");
    let run = |init: &std::path::Path, ck: &std::path::Path, how: &str| {
        ztrain(&[
            "--device",
            "cpu",
            how,
            path_str(init),
            "--data",
            path_str(&data),
            "--validate-fraction",
            "0",
            "--features",
            "7",
            "--scales",
            "3",
            "--width",
            "8",
            "--heads",
            "2",
            "--ff",
            "16",
            "--batch",
            "4",
            "--epochs",
            "1",
            "--checkpoint",
            path_str(ck),
        ])
    };
    let mut params = Vec::new();
    for (init, name) in [(&bf16_file, "bf16"), (&f32_file, "f32")] {
        let ck = dir.path().join(format!("ck_{name}.safetensors"));
        let o = run(init, &ck, "--init-from");
        let (stdout, stderr) = text(&o);
        assert!(o.status.success(), "{name}:\n{stdout}\n{stderr}");
        let c = ztrain::checkpoint::Checkpoint::load(&ck).expect("checkpoint");
        assert_eq!(c.progress.step, 1);
        params.push(c.params);
    }
    assert_eq!(
        params[0], params[1],
        "bitwise the run from the float32 values"
    );
    assert_fails_with(
        &run(&bf16_file, &dir.path().join("ck.safetensors"), "--resume"),
        &[
            "--resume",
            "bf16.safetensors",
            "cannot resume a run",
            "is BF16",
            "--init-from",
        ],
    );
}
