//! What a sample's label may be: the one target value of the model's task
//! ([`zgrad::Task`]). A binary model's label is 0 or 1 (XAsset's), a classifier's a class
//! index (an integer in `0..C`), a one-value regression's any finite float32. Every loader
//! (whole or `--stream`, every format) checks each label by the run's [`Labels`], so a label
//! the model cannot train on is an error naming its file and row, never a wrong number.

use crate::error::{Result, TrainError};
use zgrad::{Target, Task};

/// The labels a run's model takes (one value a sample).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Labels {
    /// 0 or 1 (`Task::binary()`, XAsset's).
    #[default]
    Binary,
    /// A class index, an integer in `0..classes` (`Task::class_index(classes)`).
    ClassIndex { classes: usize },
    /// Any finite float32 (`Task::regression(1)`).
    Real,
}

/// Why a finite label is not one the model takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LabelFault {
    /// Not 0 or 1 (a binary model).
    NotBinary,
    /// Not an integer in `0..classes`.
    NotAClass { classes: usize },
}

impl Labels {
    /// The labels of `task`: a data file holds one label a sample, so the task's targets must
    /// be one value (a binary label, a class index or one regression value), unweighted.
    pub fn of(task: &Task) -> Result<Labels> {
        match (task.target, task.weighted) {
            (Target::Binary, false) => Ok(Labels::Binary),
            (Target::ClassIndex { classes }, false) => Ok(Labels::ClassIndex { classes }),
            (Target::Regression { outputs: 1 }, false) => Ok(Labels::Real),
            _ => Err(TrainError::Options(format!(
                "the model's task is {task} ({} target values a sample); a data file holds one label a sample (a binary label, a class index or one regression value)",
                task.target_len()
            ))),
        }
    }

    /// The finite label `v` as the model takes it, or why not.
    pub fn check(self, v: f64) -> std::result::Result<f32, LabelFault> {
        match self {
            Labels::Binary if v == 0.0 || v == 1.0 => Ok(v as f32),
            Labels::Binary => Err(LabelFault::NotBinary),
            Labels::ClassIndex { classes }
                if v >= 0.0 && v.fract() == 0.0 && v < classes as f64 =>
            {
                Ok(v as f32)
            }
            Labels::ClassIndex { classes } => Err(LabelFault::NotAClass { classes }),
            Labels::Real => Ok(v as f32),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case::binary_zero(Labels::Binary, 0.0, Ok(0.0))]
    #[case::binary_one(Labels::Binary, 1.0, Ok(1.0))]
    #[case::binary_two(Labels::Binary, 2.0, Err(LabelFault::NotBinary))]
    #[case::class_nine(Labels::ClassIndex { classes: 10 }, 9.0, Ok(9.0))]
    #[case::class_ten(Labels::ClassIndex { classes: 10 }, 10.0, Err(LabelFault::NotAClass { classes: 10 }))]
    #[case::class_half(Labels::ClassIndex { classes: 10 }, 2.5, Err(LabelFault::NotAClass { classes: 10 }))]
    #[case::class_negative(Labels::ClassIndex { classes: 10 }, -1.0, Err(LabelFault::NotAClass { classes: 10 }))]
    #[case::real(Labels::Real, -3.25, Ok(-3.25))]
    fn labels_are_checked_by_the_task(
        #[case] labels: Labels,
        #[case] v: f64,
        #[case] want: std::result::Result<f32, LabelFault>,
    ) {
        assert_eq!(labels.check(v), want);
    }

    #[rstest]
    #[case(Task::binary(), Labels::Binary)]
    #[case(Task::class_index(10), Labels::ClassIndex { classes: 10 })]
    #[case(Task::regression(1), Labels::Real)]
    fn one_value_tasks_have_labels(#[case] task: Task, #[case] want: Labels) {
        assert_eq!(Labels::of(&task).expect("one value"), want);
    }

    #[rstest]
    #[case(Task::regression(3))]
    #[case(Task::distribution(4))]
    #[case(Task::binary().weighted())]
    fn tasks_of_several_values_are_refused(#[case] task: Task) {
        assert!(Labels::of(&task).is_err());
    }
}
