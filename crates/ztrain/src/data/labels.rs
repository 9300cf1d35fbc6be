//! What a sample's labels may be: the target values of the model's task ([`zgrad::Task`]).
//! A binary model's label is 0 or 1 (XAsset's), a classifier's a class index (an integer in
//! `0..C`), a regression's `K` values any finite float32 (`K` label columns in a table, `y`
//! `[N, K]` in an array file). A weighted task (`Task::weighted`) takes a missing label (null
//! or NaN) as a masked target: value 0 with weight 0, left out of its loss and metrics; every
//! other task refuses it. Every loader (whole or `--stream`, every format) checks each label
//! by the run's [`Labels`], so a label the model cannot train on is an error naming its file
//! and row, never a wrong number.

use crate::error::{Result, TrainError};
use zgrad::{Target, Task};

/// What one label value may be.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Label {
    /// 0 or 1 (`Task::binary()`, XAsset's).
    #[default]
    Binary,
    /// A class index, an integer in `0..classes` (`Task::class_index(classes)`).
    ClassIndex { classes: usize },
    /// Any finite float32 (`Task::regression(K)`).
    Real,
}

/// The labels a run's model takes: `values` label values a sample (a table's last `values`
/// columns, `y` `[N, values]`), each a [`Label`], and whether a missing one is masked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Labels {
    pub label: Label,
    /// Label values a sample (`K`; 1 for a binary label or a class index).
    pub values: usize,
    /// A weighted task: each value followed by its weight in the targets, a missing value
    /// (null, NaN) masked (value 0, weight 0) rather than refused.
    pub masked: bool,
}

impl Default for Labels {
    fn default() -> Self {
        Labels::BINARY
    }
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
    /// One 0/1 label a sample (XAsset's, and the synthetic data's).
    pub const BINARY: Labels = Labels::one(Label::Binary);

    /// One label of `label` a sample, unweighted.
    #[must_use]
    pub const fn one(label: Label) -> Labels {
        Labels {
            label,
            values: 1,
            masked: false,
        }
    }

    /// The labels of `task`: a binary label, a class index or `K` regression values a sample,
    /// weighted or not. A distribution over classes is not read from data files.
    pub fn of(task: &Task) -> Result<Labels> {
        let (label, values) = match task.target {
            Target::Binary => (Label::Binary, 1),
            Target::ClassIndex { classes } => (Label::ClassIndex { classes }, 1),
            Target::Regression { outputs } if outputs > 0 => (Label::Real, outputs),
            _ => {
                return Err(TrainError::Options(format!(
                    "the model's task is {task}; a data file holds a binary label, a class index or K regression values a sample (a distribution over classes is not read from data files)"
                )));
            }
        };
        Ok(Labels {
            label,
            values,
            masked: task.weighted,
        })
    }

    /// Target values a sample as the model's loss takes them (`Task::target_len`): the label
    /// values, then (masked) their weights.
    #[must_use]
    pub fn targets(self) -> usize {
        if self.masked {
            2 * self.values
        } else {
            self.values
        }
    }

    /// The finite label `v` as the model takes it, or why not.
    pub fn check(self, v: f64) -> std::result::Result<f32, LabelFault> {
        match self.label {
            Label::Binary if v == 0.0 || v == 1.0 => Ok(v as f32),
            Label::Binary => Err(LabelFault::NotBinary),
            Label::ClassIndex { classes } if v >= 0.0 && v.fract() == 0.0 && v < classes as f64 => {
                Ok(v as f32)
            }
            Label::ClassIndex { classes } => Err(LabelFault::NotAClass { classes }),
            Label::Real => Ok(v as f32),
        }
    }

    /// Writes label value `k` of a sample, `v` checked (`check`), into the sample's targets
    /// `out` (`targets()` values): the value at `k` and, masked, its weight 1 at `values + k`.
    /// A missing value (`None`: null or NaN) of a masked task is written as value 0, weight 0;
    /// any other task's is `Err(None)`, as is an infinite value for every task.
    pub fn put(
        self,
        k: usize,
        v: Option<f64>,
        out: &mut [f32],
    ) -> std::result::Result<(), Option<LabelFault>> {
        let (value, weight) = match v {
            Some(v) if v.is_finite() => (self.check(v).map_err(Some)?, 1.0),
            Some(v) if v.is_nan() && self.masked => (0.0, 0.0),
            None if self.masked => (0.0, 0.0),
            _ => return Err(None),
        };
        if !value.is_finite() {
            // A regression value beyond float32.
            return Err(None);
        }
        out[k] = value;
        if self.masked {
            out[self.values + k] = weight;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case::binary_zero(Label::Binary, 0.0, Ok(0.0))]
    #[case::binary_one(Label::Binary, 1.0, Ok(1.0))]
    #[case::binary_two(Label::Binary, 2.0, Err(LabelFault::NotBinary))]
    #[case::class_nine(Label::ClassIndex { classes: 10 }, 9.0, Ok(9.0))]
    #[case::class_ten(Label::ClassIndex { classes: 10 }, 10.0, Err(LabelFault::NotAClass { classes: 10 }))]
    #[case::class_half(Label::ClassIndex { classes: 10 }, 2.5, Err(LabelFault::NotAClass { classes: 10 }))]
    #[case::class_negative(Label::ClassIndex { classes: 10 }, -1.0, Err(LabelFault::NotAClass { classes: 10 }))]
    #[case::class_near_an_integer(Label::ClassIndex { classes: 10 }, 2.000_000_1, Err(LabelFault::NotAClass { classes: 10 }))]
    #[case::real(Label::Real, -3.25, Ok(-3.25))]
    fn labels_are_checked_by_the_task(
        #[case] label: Label,
        #[case] v: f64,
        #[case] want: std::result::Result<f32, LabelFault>,
    ) {
        assert_eq!(Labels::one(label).check(v), want);
    }

    #[rstest]
    #[case(Task::binary(), Labels::BINARY)]
    #[case(Task::class_index(10), Labels::one(Label::ClassIndex { classes: 10 }))]
    #[case(Task::regression(1), Labels::one(Label::Real))]
    #[case(Task::regression(3), Labels { label: Label::Real, values: 3, masked: false })]
    #[case(Task::regression(3).weighted(), Labels { label: Label::Real, values: 3, masked: true })]
    #[case(Task::binary().weighted(), Labels { masked: true, ..Labels::BINARY })]
    fn tasks_have_labels(#[case] task: Task, #[case] want: Labels) {
        let labels = Labels::of(&task).expect("labels");
        assert_eq!(labels, want);
        assert_eq!(labels.targets(), task.target_len(), "{task}");
    }

    #[test]
    fn a_distribution_is_not_read_from_files() {
        assert!(Labels::of(&Task::distribution(4)).is_err());
    }

    /// A masked task's missing value is value 0, weight 0; present ones weigh 1; an
    /// unmasked task refuses a missing value, and every task an infinite one.
    #[test]
    fn missing_values_are_masked_only_for_a_weighted_task() {
        let masked = Labels::of(&Task::regression(2).weighted()).expect("labels");
        let mut out = [9.0; 4];
        masked.put(0, Some(f64::NAN), &mut out).expect("masked");
        masked.put(1, Some(-1.5), &mut out).expect("value");
        assert_eq!(out, [0.0, -1.5, 0.0, 1.0]);
        masked.put(0, None, &mut out).expect("null masked");
        assert_eq!(masked.put(0, Some(f64::INFINITY), &mut out), Err(None));
        let plain = Labels::of(&Task::regression(2)).expect("labels");
        assert_eq!(plain.put(0, Some(f64::NAN), &mut out), Err(None));
        assert_eq!(plain.put(1, None, &mut out), Err(None));
        assert_eq!(plain.put(1, Some(1e39), &mut out), Err(None));
    }
}
