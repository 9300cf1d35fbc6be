//! Item 8 (no output destroys data), item 9 (inputs read once, bounded), item 13 (resuming a
//! finished run, fewer epochs).

use std::io::Write as _;
use std::process::{Command, Stdio};

use crate::common::{assert_fails_with, path_str, text, tiny, ztrain_binary};
use ztrain::checkpoint::Checkpoint;
use ztrain::data::{csv, synthetic};

fn data_file(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("data.csv");
    std::fs::write(&path, csv::to_csv(&synthetic::generate(60, 3, 6, 5))).expect("write");
    path
}

#[test]
fn an_output_onto_the_data_file_is_refused_and_the_data_kept() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = data_file(dir.path());
    let before = std::fs::read(&data).expect("read");
    let cases: [&[&str]; 2] = [
        &["--device", "cpu", "--checkpoint"],
        &["--device", "sim", "--sim-memory", "256M", "--memory-report"],
    ];
    for case in cases {
        let args = [case, &[path_str(&data), "--data", path_str(&data)]].concat();
        let o = tiny(&args);
        assert_fails_with(&o, &["is the --data file", "would destroy that input"]);
        assert_eq!(std::fs::read(&data).expect("read"), before, "{case:?}");
    }
}

#[test]
fn symlinks_and_devices_are_never_replaced() {
    let dir = tempfile::tempdir().expect("tempdir");
    let target = dir.path().join("elsewhere.st");
    std::fs::write(&target, "keep me").expect("write");
    let link = dir.path().join("ck.st");
    std::os::unix::fs::symlink(&target, &link).expect("symlink");
    for out in [path_str(&link), "/dev/null"] {
        let o = tiny(&["--device", "cpu", "--checkpoint", out]);
        assert_fails_with(&o, &["--checkpoint", "not a regular file"]);
    }
    assert!(std::fs::symlink_metadata(&link).expect("link").is_symlink());
    assert_eq!(std::fs::read(&target).expect("read"), b"keep me");
}

#[test]
fn two_outputs_on_one_path_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("out");
    let o = tiny(&[
        "--device",
        "sim",
        "--sim-memory",
        "256M",
        "--checkpoint",
        path_str(&p),
        "--memory-report",
        path_str(&p),
    ]);
    assert_fails_with(&o, &["--memory-report", "also the --checkpoint file"]);
}

#[test]
fn an_unwritable_output_fails_before_any_training() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("no-such-folder");
    for (option, extra) in [
        ("--checkpoint", &["--device", "cpu"][..]),
        (
            "--memory-report",
            &["--device", "sim", "--sim-memory", "256M"][..],
        ),
        ("--soak-report", &["--device", "cpu"][..]),
    ] {
        let out = missing.join("out");
        let o = tiny(&[extra, &[option, path_str(&out)]].concat());
        assert_fails_with(&o, &[option, "nothing was trained"]);
        assert!(!text(&o).0.contains("epoch 1/"), "{option}: trained first");
    }
}

#[test]
fn data_from_a_fifo_or_stdin_is_read_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let content = std::fs::read(data_file(dir.path())).expect("read");
    let fifo = dir.path().join("fifo.csv");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    let writer = {
        let (fifo, content) = (fifo.clone(), content.clone());
        std::thread::spawn(move || std::fs::write(fifo, content).expect("write the fifo"))
    };
    let o = tiny(&[
        "--device",
        "cpu",
        "--epochs",
        "1",
        "--data",
        path_str(&fifo),
    ]);
    writer.join().expect("writer");
    assert!(o.status.success(), "{:?}", text(&o));
    assert!(
        text(&o).0.contains("48 train / 12 validation"),
        "{:?}",
        text(&o)
    );

    let args: Vec<&str> = crate::common::TINY
        .iter()
        .copied()
        .chain(["--device", "cpu", "--epochs", "1", "--data", "/dev/stdin"])
        .collect();
    let mut child = Command::new(ztrain_binary())
        .args(&args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(&content)
        .expect("feed");
    let o = child.wait_with_output().expect("wait");
    assert!(o.status.success(), "{:?}", text(&o));
}

#[test]
fn resume_from_an_endless_device_is_an_error_not_a_hang() {
    let o = tiny(&["--device", "cpu", "--resume", "/dev/zero"]);
    assert_fails_with(&o, &["/dev/zero is corrupt", "header length 0"]);
}

fn finished_run(dir: &std::path::Path, epochs: &str) -> std::path::PathBuf {
    let ck = dir.join("ck.st");
    let o = tiny(&[
        "--device",
        "cpu",
        "--epochs",
        epochs,
        "--checkpoint",
        path_str(&ck),
    ]);
    assert!(o.status.success(), "{:?}", text(&o));
    ck
}

#[test]
fn resuming_a_finished_run_says_so() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ck = finished_run(dir.path(), "2");
    let before = Checkpoint::load(&ck).expect("checkpoint");
    let o = tiny(&[
        "--device",
        "cpu",
        "--resume",
        path_str(&ck),
        "--checkpoint",
        path_str(&ck),
    ]);
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("is already finished (2 of 2 epochs"),
        "{stdout}"
    );
    assert!(stdout.contains("summary: 20 steps"), "{stdout}");
    assert_eq!(Checkpoint::load(&ck).expect("checkpoint"), before);
}

#[test]
fn fewer_epochs_than_the_checkpoint_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ck = finished_run(dir.path(), "2");
    let o = tiny(&[
        "--device",
        "cpu",
        "--epochs",
        "1",
        "--resume",
        path_str(&ck),
    ]);
    assert_fails_with(
        &o,
        &["--epochs 1 is below the checkpoint's 2 epochs (2 already trained)"],
    );
}
