//! Labels as the model's task takes them (`FitModel::task`): a 10-class model's class
//! indices 0..9 and a one-value regression's real-valued targets, from CSV and a `.npy` pair,
//! train through `ztrain::fit` read whole and streamed (`--stream`) to the same numbers, bit
//! for bit; a label the task cannot take (a class index out of range or not an integer, NaN)
//! is an error naming the file, the row and the value's problem, read whole or streamed.

use super::model::MlpFit;
use super::{MLP, assert_same_checkpoint, bits, options};
use crate::cli::data_files::{npy_x, npy_y};
use crate::common::path_str;
use rstest::rstest;
use zgrad::Task;
use ztrain::config::RunConfig;
use ztrain::data::{Dataset, csv, synthetic};
use ztrain::fit::{self, FitModel, Outcome};
use ztrain::signals::StopSignal;
use ztrain::step::TrainBackend;

/// 120 samples of 3 x 6 features whose labels are `label(i, first feature)`.
fn data(label: impl Fn(usize, f32) -> f32) -> Dataset {
    let mut d = synthetic::generate(120, 3, 6, 5);
    let w = d.sample_width();
    d.y = (0..d.len()).map(|i| label(i, d.x[i * w])).collect();
    d
}

/// `d` written in `dir` as CSV and as a `.npy` pair: the `--data` arguments of each.
fn write(d: &Dataset, dir: &std::path::Path) -> [Vec<String>; 2] {
    let p = |n: &str| path_str(&dir.join(n)).to_string();
    std::fs::write(dir.join("d.csv"), csv::to_csv(d)).expect("csv");
    std::fs::write(dir.join("x.npy"), npy_x(d)).expect("x.npy");
    std::fs::write(dir.join("y.npy"), npy_y(d)).expect("y.npy");
    [
        vec!["--data".into(), p("d.csv")],
        vec!["--data".into(), p("x.npy"), "--labels".into(), p("y.npy")],
    ]
}

/// `model` trained through `ztrain::fit` as `args` say, its checkpoint at `ck`.
fn fit_result(model: &MlpFit, args: &[&str], ck: &std::path::Path) -> ztrain::Result<Outcome> {
    let args = [args, &["--checkpoint", path_str(ck)]].concat();
    let mut out = Vec::new();
    fit::run(
        model,
        &options(&args),
        &mut out,
        false,
        &StopSignal::never(),
    )
}

#[rstest]
#[case::ten_classes(Task::class_index(10), |i: usize, _| (i % 10) as f32)]
#[case::real_values(Task::regression(1), |i: usize, x: f32| 2.5 * x - 0.125 * (i % 7) as f32)]
fn labels_of_the_task_train_whole_and_streamed_bitwise(
    #[case] task: Task,
    #[case] label: fn(usize, f32) -> f32,
) {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = MlpFit { task, ..MLP };
    let mut first = None;
    for data in write(&data(label), dir.path()) {
        let data: Vec<&str> = data.iter().map(String::as_str).collect();
        let args = [
            &data[..],
            &["--device", "sim", "--epochs", "2", "--batch", "16"],
        ]
        .concat();
        let (a, b) = (dir.path().join("whole.st"), dir.path().join("streamed.st"));
        let whole = fit_result(&model, &args, &a).expect("read whole");
        let streamed =
            fit_result(&model, &[&args[..], &["--stream"]].concat(), &b).expect("streamed");
        let at = format!("{task}, {data:?}");
        assert!(whole.validation.is_some(), "{at}");
        assert_eq!(bits(whole.validation), bits(streamed.validation), "{at}");
        assert_eq!(bits(whole.train), bits(streamed.train), "{at}");
        assert_same_checkpoint(&a, &b);
        // CSV and the `.npy` pair hold the same numbers: the same run.
        let first = first.get_or_insert(bits(whole.validation));
        assert_eq!(*first, bits(whole.validation), "{at}: CSV and .npy differ");
    }
}

#[rstest]
#[case::class_ten(Task::class_index(10), 10.0, "a class index of the model's 10 classes")]
#[case::class_half(Task::class_index(10), 2.5, "a class index of the model's 10 classes")]
#[case::class_negative(Task::class_index(10), -1.0, "a class index of the model's 10 classes")]
#[case::real_nan(Task::regression(1), f32::NAN, "NaN")]
#[case::binary_two(Task::binary(), 2.0, "must be 0 or 1")]
fn a_label_the_task_cannot_take_names_file_row_and_problem(
    #[case] task: Task,
    #[case] bad: f32,
    #[case] problem: &str,
) {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = MlpFit { task, ..MLP };
    // Sample 7 (CSV line 9, `.npy` element [7]) is bad; the others are 0 or 1.
    let d = data(|i, _| if i == 7 { bad } else { (i % 2) as f32 });
    let [csv_args, npy_args] = write(&d, dir.path());
    for (data, file, row) in [(csv_args, "d.csv", "line 9"), (npy_args, "y.npy", "[7]")] {
        let data: Vec<&str> = data.iter().map(String::as_str).collect();
        for stream in [&[][..], &["--stream"]] {
            let args = [&data[..], &["--device", "sim", "--epochs", "1"], stream].concat();
            let e = fit_result(&model, &args, &dir.path().join("ck.st"))
                .expect_err("a bad label is refused")
                .to_string();
            for part in [file, row, problem] {
                assert!(e.contains(part), "{task} {args:?}: `{part}` not in: {e}");
            }
        }
    }
}

/// A program whose `FitModel::task` is left at its default (binary) while its model is a
/// 10-class classifier: its labels would be checked by the wrong task.
struct Undeclared(MlpFit);

impl FitModel for Undeclared {
    type Model<B: TrainBackend> = super::model::WindowMlp<B>;

    fn describe(&self, config: &RunConfig) -> String {
        self.0.describe(config)
    }

    fn parameters(&self, config: &RunConfig) -> ztrain::Result<u64> {
        self.0.parameters(config)
    }

    fn config_json(&self, config: &RunConfig) -> serde_json::Value {
        self.0.config_json(config)
    }

    fn init<B: TrainBackend>(&self, b: &B, config: &RunConfig) -> zgrad::Result<Self::Model<B>> {
        self.0.init(b, config)
    }
}

#[test]
fn a_model_whose_task_is_not_the_declared_one_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = Undeclared(MlpFit {
        task: Task::class_index(10),
        ..MLP
    });
    let [csv_args, _] = write(&data(|i, _| (i % 2) as f32), dir.path());
    let data: Vec<&str> = csv_args.iter().map(String::as_str).collect();
    let args = [&data[..], &["--device", "sim", "--epochs", "1"]].concat();
    let ck = dir.path().join("ck.st");
    let args = [&args[..], &["--checkpoint", path_str(&ck)]].concat();
    let mut out = Vec::new();
    let e = fit::run(
        &model,
        &options(&args),
        &mut out,
        false,
        &StopSignal::never(),
    )
    .expect_err("the declared task is not the model's")
    .to_string();
    assert!(e.contains("FitModel::task"), "{e}");
}
