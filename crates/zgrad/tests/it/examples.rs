//! The examples a user copies (`cargo run --release -p zgrad --example NAME`), run here with
//! small sizes on the CPU and the simulated device: each trains and its metrics improve.

#[allow(dead_code)]
#[path = "../../examples/classifier.rs"]
mod classifier;
#[allow(dead_code)]
#[path = "../../examples/masked_regression.rs"]
mod masked_regression;

use classifier::common::{Device, on_device};

#[test]
fn the_classifier_example_learns_on_the_cpu_and_the_simulated_device() {
    let ex = classifier::Classifier {
        train: 512,
        batch: 32,
        epochs: 4,
        hidden: 32,
        quiet: true,
        ..classifier::Classifier::default()
    };
    for device in [Device::Cpu, Device::Sim] {
        let out = on_device(device, &ex).expect("classifier");
        assert!(out.last_loss < out.first_loss, "{device:?}: {out:?}");
        assert!(out.after.loss < out.before.loss, "{device:?}: {out:?}");
        assert!(
            out.after.accuracy > out.before.accuracy + 0.1,
            "{device:?}: {out:?}"
        );
        assert!(out.after.regression.is_none());
    }
}

#[test]
fn the_masked_regression_example_learns_on_the_cpu_and_the_simulated_device() {
    let ex = masked_regression::MaskedRegression {
        train: 256,
        batch: 16,
        epochs: 3,
        quiet: true,
        ..masked_regression::MaskedRegression::default()
    };
    use masked_regression::common::Device as D;
    for device in [D::Cpu, D::Sim] {
        let out = masked_regression::common::on_device(device, &ex).expect("regression");
        // Missing targets hold 1e6: a loss that read one would be astronomical.
        assert!(out.first_loss < 10.0, "{device:?}: {out:?}");
        assert!(out.missing > 0.2, "{device:?}: {out:?}");
        let (m0, m1) = (
            out.before.regression.expect("metrics"),
            out.after.regression.expect("metrics"),
        );
        assert!(
            m1.mse < m0.mse && m1.pearson > m0.pearson,
            "{device:?}: {out:?}"
        );
        assert!(out.after.accuracy.is_nan());
    }
}

#[allow(dead_code)]
#[path = "../../examples/own_model.rs"]
mod own_model;

/// The guide's "A model of your own" is `examples/own_model.rs` as written (from its first
/// `use` on), so the guide's code compiles; and it runs, on the CPU and the simulated device.
#[test]
fn the_guides_own_model_is_the_example_and_runs() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let guide = std::fs::read_to_string(root.join("../../docs/guide.md")).expect("guide");
    let file = std::fs::read_to_string(root.join("examples/own_model.rs")).expect("example");
    let section = &guide[guide.find("## A model of your own").expect("section")..];
    let block = &section[section.find("```rust\n").expect("code block") + 8..];
    let block = &block[..block.find("```\n").expect("block end")];
    let code = &file[file.find("use std::collections").expect("first use")..];
    assert_eq!(
        block, code,
        "docs/guide.md's block differs from examples/own_model.rs"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let cpu = own_model::train(zcompute::CpuBackend, dir.path()).expect("cpu");
    let sim =
        own_model::train(zcompute::Engine::sim(256 << 20).expect("sim"), dir.path()).expect("sim");
    assert!(cpu.is_finite() && (cpu - sim).abs() < 1e-4, "{cpu} {sim}");
    assert!(dir.path().join("mlp.safetensors").is_file());
}

#[allow(dead_code)]
#[path = "../../examples/sequence.rs"]
pub(crate) mod sequence;

/// The sequence model (embedding, variable lengths under a key-padding mask, attention,
/// pooling over the unpadded positions) learns the majority class of its tokens: accuracy
/// well above chance (1 / 4) on held-out sequences, on the CPU and the simulated device, in
/// both schedules.
#[test]
fn the_sequence_example_learns_on_the_cpu_and_the_simulated_device() {
    let ex = sequence::Sequence {
        train: 512,
        batch: 32,
        epochs: 4,
        quiet: true,
        ..sequence::Sequence::default()
    };
    use sequence::common::Device as D;
    use zgrad::TrainSchedule::{Batched, PerSample};
    for (device, schedule) in [(D::Cpu, Batched), (D::Sim, Batched), (D::Cpu, PerSample)] {
        let ex = sequence::Sequence { schedule, ..ex };
        let out = sequence::common::on_device(device, &ex).expect("sequence");
        let device = (device, schedule);
        // Lengths 2..=12 padded to 12: padding is a real share of every batch.
        assert!(out.mean_length < 8.0, "{device:?}: {out:?}");
        assert!(out.last_loss < out.first_loss, "{device:?}: {out:?}");
        assert!(out.after.loss < out.before.loss, "{device:?}: {out:?}");
        assert!(out.after.accuracy > 0.6, "{device:?}: {out:?}");
    }
}
