//! Checkpoints: resume equals an uninterrupted run (CPU, simulated device, two blocks); a corrupt
//! checkpoint, or one of another configuration or depth, is refused naming why.

use crate::common;

use common::{assert_fails_with, path_str, resume_matches_uninterrupted, text, tiny};

#[test]
fn a_corrupt_checkpoint_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("ck.safetensors");
    std::fs::write(&path, b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":").expect("write");
    let o = tiny(&["--device", "cpu", "--resume", path_str(&path)]);
    assert_fails_with(
        &o,
        &["ck.safetensors is corrupt or not a ztrain checkpoint"],
    );
}

#[test]
fn a_checkpoint_of_another_configuration_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ck = dir.path().join("ck.safetensors");
    let o = tiny(&[
        "--device",
        "cpu",
        "--epochs",
        "1",
        "--checkpoint",
        path_str(&ck),
    ]);
    assert!(o.status.success(), "{:?}", text(&o));
    let o = tiny(&["--device", "cpu", "--batch", "8", "--resume", path_str(&ck)]);
    assert_fails_with(
        &o,
        &["different configuration", "batch: checkpoint 16, now 8"],
    );
}

#[test]
fn resume_mid_epoch_equals_an_uninterrupted_run_on_the_cpu() {
    // 160 training samples in batches of 16: step 13 is in the middle of the second epoch.
    resume_matches_uninterrupted(&["--device", "cpu"], "13");
}

#[test]
fn resume_at_an_epoch_end_equals_an_uninterrupted_run_on_the_cpu() {
    resume_matches_uninterrupted(&["--device", "cpu", "--lr-schedule", "cosine"], "10");
}

#[test]
fn resume_equals_an_uninterrupted_run_on_the_simulated_device_per_sample() {
    resume_matches_uninterrupted(
        &[
            "--device",
            "sim",
            "--sim-memory",
            "256M",
            "--schedule",
            "per-sample",
            "--samples",
            "60",
        ],
        "2",
    );
}

/// A checkpoint of another depth or width is refused naming the difference.
#[test]
fn a_checkpoint_of_another_depth_is_refused_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ck = dir.path().join("ck.safetensors");
    let o = tiny(&[
        "--device",
        "cpu",
        "--epochs",
        "1",
        "--layers",
        "2",
        "--checkpoint",
        path_str(&ck),
    ]);
    assert!(o.status.success(), "{:?}", text(&o));
    let c = ztrain::checkpoint::Checkpoint::load(&ck).expect("checkpoint");
    assert!(
        c.params.contains_key("blocks.1.f2.bias"),
        "{:?}",
        c.params.keys()
    );
    let o = tiny(&[
        "--device",
        "cpu",
        "--layers",
        "3",
        "--resume",
        path_str(&ck),
    ]);
    assert_fails_with(&o, &["checkpoint has 2 layers, the options 3"]);
    let o = tiny(&[
        "--device",
        "cpu",
        "--layers",
        "2",
        "--width",
        "32",
        "--resume",
        path_str(&ck),
    ]);
    assert_fails_with(&o, &["width 16 vs 32"]);
    // The same depth resumes, and its parameters start the run from the checkpoint's.
    let o = tiny(&[
        "--device",
        "cpu",
        "--layers",
        "2",
        "--epochs",
        "2",
        "--resume",
        path_str(&ck),
    ]);
    assert!(o.status.success(), "{:?}", text(&o));
}

/// Resuming with two blocks continues exactly as an uninterrupted two-block run.
#[test]
fn resume_of_a_two_block_run_equals_an_uninterrupted_run() {
    resume_matches_uninterrupted(&["--device", "cpu", "--layers", "2"], "13");
}
