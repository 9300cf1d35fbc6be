//! `--precision` (issue 42): the tiny run under bf16 and TF32 on the CPU and the simulated
//! device trains, differs from float32 (the policy really ran) and resumes bit for bit under
//! its own policy; a checkpoint resumed under another policy is refused naming it.

use super::common::{assert_fails_with, path_str, resume_matches_uninterrupted, text, tiny};
use ztrain::checkpoint::Checkpoint;

/// Every loss and accuracy a run printed (the number after each `loss` and `acc`), in order:
/// the epoch lines and the summary, without the timings.
fn epoch_lines(stdout: &str) -> Vec<String> {
    let words: Vec<&str> = stdout.split_whitespace().collect();
    words
        .windows(2)
        .filter(|w| w[0] == "loss" || w[0] == "acc")
        .map(|w| format!("{} {}", w[0], w[1].trim_end_matches(';')))
        .collect()
}

#[test]
fn bf16_and_tf32_train_and_differ_from_float32_on_the_cpu_and_the_simulated_device() {
    for device in [
        &["--device", "cpu"][..],
        &["--device", "sim", "--sim-memory", "256M"],
    ] {
        let run = |precision: &str| {
            let o = tiny(&[device, &["--precision", precision]].concat());
            assert!(o.status.success(), "{precision}: {:?}", text(&o));
            epoch_lines(&text(&o).0)
        };
        let f32_lines = run("f32");
        assert!(!f32_lines.is_empty(), "{device:?}: no epoch lines");
        for reduced in ["bf16", "tf32"] {
            let lines = run(reduced);
            assert_eq!(lines.len(), f32_lines.len(), "{device:?} {reduced}");
            assert_ne!(
                lines, f32_lines,
                "{device:?}: {reduced} printed float32's losses"
            );
        }
    }
}

#[test]
fn f32_is_the_default_bit_for_bit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (a, b) = (dir.path().join("a.st"), dir.path().join("b.st"));
    let o = tiny(&["--device", "cpu", "--checkpoint", path_str(&a)]);
    assert!(o.status.success(), "{:?}", text(&o));
    let default_out = text(&o).0;
    let o = tiny(&[
        "--device",
        "cpu",
        "--precision",
        "f32",
        "--checkpoint",
        path_str(&b),
    ]);
    assert!(o.status.success(), "{:?}", text(&o));
    assert_eq!(epoch_lines(&default_out), epoch_lines(&text(&o).0));
    // The same configuration record (no `precision` key under f32) and the same tensors.
    let (a, b) = (Checkpoint::load(&a).unwrap(), Checkpoint::load(&b).unwrap());
    assert_eq!(a.config, b.config);
    assert!(a.config.get("precision").is_none(), "{}", a.config);
    assert_eq!(a.progress, b.progress);
    assert_eq!(a.params, b.params);
    assert_eq!(a.optim, b.optim);
}

#[test]
fn a_bf16_run_resumes_bit_for_bit_under_bf16() {
    resume_matches_uninterrupted(&["--device", "cpu", "--precision", "bf16"], "13");
}

#[test]
fn a_checkpoint_resumed_under_another_precision_is_refused_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ck = dir.path().join("ck.safetensors");
    let o = tiny(&[
        "--device",
        "cpu",
        "--epochs",
        "1",
        "--precision",
        "bf16",
        "--checkpoint",
        path_str(&ck),
    ]);
    assert!(o.status.success(), "{:?}", text(&o));
    let o = tiny(&["--device", "cpu", "--resume", path_str(&ck)]);
    assert_fails_with(
        &o,
        &["different configuration", "precision: checkpoint \"bf16\""],
    );
}

#[test]
fn an_unknown_precision_is_refused_listing_the_choices() {
    let o = tiny(&["--device", "cpu", "--precision", "fp8"]);
    let (_, stderr) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    for v in ["f32", "tf32", "bf16"] {
        assert!(stderr.contains(v), "`{v}` not in:\n{stderr}");
    }
}
