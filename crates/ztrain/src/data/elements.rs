//! Typed arrays from NumPy and safetensors files: their element types, read as `f64` in C
//! order whatever order they are stored in, and the samples of an `x` `[N, S, F]` and a `y`
//! `[N]` or `[N, 1]` (one label a sample), or `[N, K]` (a task of `K` target values), checked
//! as [`super::table`] checks a table's.

use super::labels::Labels;
use super::table::{self, Fault};
use crate::error::{DataPlace, DataProblem};

/// A numeric element type and its byte order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    Float { size: usize, big: bool },
    Int { size: usize, big: bool },
    Uint { size: usize, big: bool },
    Bool,
}

impl Elem {
    /// A NumPy `descr` (`<f4`, `>i8`, `|u1`, `|b1`); `None` for any other (strings,
    /// structured, complex, half).
    #[must_use]
    pub fn from_numpy(descr: &str) -> Option<Elem> {
        let (big, rest) = match descr.as_bytes().first()? {
            b'>' => (true, &descr[1..]),
            b'<' | b'|' | b'=' => (false, &descr[1..]),
            _ => (false, descr),
        };
        let kind = rest.chars().next()?;
        let size: usize = rest[1..].parse().ok()?;
        match (kind, size) {
            ('f', 4 | 8) => Some(Elem::Float { size, big }),
            ('i', 1 | 2 | 4 | 8) => Some(Elem::Int { size, big }),
            ('u', 1 | 2 | 4 | 8) => Some(Elem::Uint { size, big }),
            ('b', 1) => Some(Elem::Bool),
            _ => None,
        }
    }

    /// A safetensors dtype (little-endian); `None` for the ones not read (f16, bf16, f8).
    #[must_use]
    pub fn from_safetensors(dtype: safetensors::Dtype) -> Option<Elem> {
        use safetensors::Dtype as D;
        let big = false;
        Some(match dtype {
            D::F32 => Elem::Float { size: 4, big },
            D::F64 => Elem::Float { size: 8, big },
            D::I8 => Elem::Int { size: 1, big },
            D::I16 => Elem::Int { size: 2, big },
            D::I32 => Elem::Int { size: 4, big },
            D::I64 => Elem::Int { size: 8, big },
            D::U8 => Elem::Uint { size: 1, big },
            D::U16 => Elem::Uint { size: 2, big },
            D::U32 => Elem::Uint { size: 4, big },
            D::U64 => Elem::Uint { size: 8, big },
            D::BOOL => Elem::Bool,
            _ => return None,
        })
    }

    /// Bytes per element.
    #[must_use]
    pub fn size(self) -> usize {
        match self {
            Elem::Float { size, .. } | Elem::Int { size, .. } | Elem::Uint { size, .. } => size,
            Elem::Bool => 1,
        }
    }

    /// The element in `b` (exactly `size()` bytes) as `f64` (exact for every float32, and
    /// for integers up to 2^53).
    pub(crate) fn read(self, b: &[u8]) -> f64 {
        let mut w = [0u8; 8];
        let big = matches!(
            self,
            Elem::Float { big: true, .. }
                | Elem::Int { big: true, .. }
                | Elem::Uint { big: true, .. }
        );
        let n = b.len();
        if big {
            for (i, v) in b.iter().rev().enumerate() {
                w[i] = *v;
            }
        } else {
            w[..n].copy_from_slice(b);
        }
        let u = u64::from_le_bytes(w);
        match self {
            Elem::Float { size: 4, .. } => f64::from(f32::from_bits(u as u32)),
            Elem::Float { .. } => f64::from_bits(u),
            // Sign-extend from the element's width.
            Elem::Int { size, .. } => ((u << (64 - 8 * size)) as i64 >> (64 - 8 * size)) as f64,
            Elem::Uint { .. } => u as f64,
            Elem::Bool => f64::from(u8::from(u != 0)),
        }
    }
}

/// An array as stored: element type, shape, storage order and bytes (exactly the shape's).
#[derive(Clone, Debug, PartialEq)]
pub struct Array {
    pub elem: Elem,
    pub shape: Vec<usize>,
    /// Column-major (`fortran_order` in NumPy).
    pub fortran: bool,
    pub data: Vec<u8>,
}

impl Array {
    /// The element at flat C-order index `i`, whatever the storage order.
    #[must_use]
    pub fn get_c(&self, i: usize) -> Option<f64> {
        let at = if self.fortran {
            // Unravel in C order, re-ravel in Fortran order.
            let (mut rest, mut at, mut stride) = (i, 0, 1);
            let strides: Vec<usize> = self
                .shape
                .iter()
                .map(|&d| {
                    let s = stride;
                    stride *= d;
                    s
                })
                .collect();
            for (d, s) in self.shape.iter().zip(&strides).rev() {
                at += (rest % d) * s;
                rest /= d;
            }
            at
        } else {
            i
        };
        let size = self.elem.size();
        self.data
            .get(at * size..(at + 1) * size)
            .map(|b| self.elem.read(b))
    }

    /// The C-order index of flat position `i`, for messages.
    fn index_of(&self, mut i: usize) -> Vec<usize> {
        let mut index = vec![0; self.shape.len()];
        for (k, &d) in self.shape.iter().enumerate().rev() {
            index[k] = i % d.max(1);
            i /= d.max(1);
        }
        index
    }
}

/// Features row-major and their targets (`Labels::targets` a sample).
pub type Features = (Vec<f32>, Vec<f32>);

/// A fault and the array it is in (`"x"` or `"y"`).
pub type InArray = (Fault, &'static str);

/// The samples of features `x` `[N, S, F]` and labels `y` (`sample_count`'s shapes): row-major
/// features and the targets of labels `labels` takes, checked as the CSV's. The error says
/// which array (`"x"` or `"y"`).
pub fn samples(
    x: &Array,
    y: &Array,
    scales: usize,
    features: usize,
    labels: Labels,
) -> Result<Features, InArray> {
    let n = sample_count(&x.shape, &y.shape, (scales, features), labels)?;
    let total = n * scales * features;
    let mut xs = Vec::with_capacity(total);
    for i in 0..total {
        let v = x.get_c(i);
        xs.push(
            table::feature(v, || DataPlace::Element {
                array: "x".into(),
                index: x.index_of(i),
            })
            .map_err(|f| (f, "x"))?,
        );
    }
    let (k, t) = (labels.values, labels.targets());
    let mut ys = vec![0.0; n * t];
    for (i, out) in ys.chunks_exact_mut(t).enumerate() {
        let values = (0..k).map(|j| y.get_c(i * k + j));
        table::targets(labels, values, out, |j| DataPlace::Element {
            array: "y".into(),
            index: y.index_of(i * k + j),
        })
        .map_err(|f| (f, "y"))?;
    }
    Ok((xs, ys))
}

/// The samples `N` of features of shape `x` `[N, S, F]` and labels of shape `y` `[N]` or
/// `[N, 1]` (one label a sample) or `[N, K]` (`labels.values` = `K` > 1: the model's task's
/// `K` target values), checked against `--scales`, `--features` and the model's task; none is
/// a fault.
pub fn sample_count(
    x: &[usize],
    y: &[usize],
    (scales, features): (usize, usize),
    labels: Labels,
) -> Result<usize, InArray> {
    let shape_fault = |name: &'static str, expected: String, found: &[usize]| {
        (
            Fault::new(
                DataPlace::Array(name.into()),
                DataProblem::Shape {
                    expected,
                    found: found.to_vec(),
                },
            ),
            name,
        )
    };
    if x.len() != 3 || x[1] != scales || x[2] != features {
        return Err(shape_fault(
            "x",
            format!("[N, S, F] = [N, {scales}, {features}] (--scales, --features)"),
            x,
        ));
    }
    let n = x[0];
    let k = labels.values;
    let labels_ok = match y {
        [_] => k == 1,
        [_, c] => *c == k,
        _ => false,
    };
    if !labels_ok {
        let expected = if k == 1 {
            "[N] or [N, 1]: one label a sample (the model's task has one target value)".into()
        } else {
            format!("[N, {k}]: the model's task has {k} target values a sample")
        };
        return Err(shape_fault("y", expected, y));
    }
    if y[0] != n {
        return Err((
            Fault::new(DataPlace::File, DataProblem::SampleCounts { x: n, y: y[0] }),
            "y",
        ));
    }
    if n == 0 {
        return Err((Fault::new(DataPlace::File, DataProblem::NoSamples), "x"));
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case("<f4", &1.5f32.to_le_bytes(), 1.5)]
    #[case(">f4", &1.5f32.to_be_bytes(), 1.5)]
    #[case("<f8", &(-2.25f64).to_le_bytes(), -2.25)]
    #[case("<i2", &(-3i16).to_le_bytes(), -3.0)]
    #[case(">i4", &(-7i32).to_be_bytes(), -7.0)]
    #[case("|i1", &(-1i8).to_le_bytes(), -1.0)]
    #[case("|u1", &[200u8], 200.0)]
    #[case("<u8", &(1u64 << 40).to_le_bytes(), (1u64 << 40) as f64)]
    #[case("|b1", &[1u8], 1.0)]
    fn elements_of_every_numeric_dtype_read_exactly(
        #[case] descr: &str,
        #[case] bytes: &[u8],
        #[case] want: f64,
    ) {
        let e = Elem::from_numpy(descr).expect("numeric");
        assert_eq!(e.size(), bytes.len());
        assert_eq!(e.read(bytes), want);
    }

    #[test]
    fn other_dtypes_are_not_numbers_here() {
        for d in ["<U8", "|O", "<c8", "<f2", "|S4", "<M8[ns]"] {
            assert_eq!(Elem::from_numpy(d), None, "{d}");
        }
    }

    fn f32_array(shape: &[usize], values: &[f32]) -> Array {
        Array {
            elem: Elem::Float {
                size: 4,
                big: false,
            },
            shape: shape.to_vec(),
            fortran: false,
            data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }

    #[test]
    fn shapes_are_checked_against_the_options() {
        let x = f32_array(&[2, 3, 2], &[0.0; 12]);
        let y = f32_array(&[2, 2], &[0.0; 4]);
        let (f, which) = samples(&x, &y, 3, 2, crate::data::labels::Labels::BINARY).unwrap_err();
        assert_eq!(which, "y");
        assert!(f.problem.to_string().contains("[N] or [N, 1]"));
        let (f, which) = samples(
            &x,
            &f32_array(&[2], &[0.0; 2]),
            2,
            3,
            crate::data::labels::Labels::BINARY,
        )
        .unwrap_err();
        assert_eq!(which, "x");
        assert!(f.problem.to_string().contains("[N, 2, 3]"), "{}", f.problem);
        let (f, _) = samples(
            &x,
            &f32_array(&[3], &[0.0; 3]),
            3,
            2,
            crate::data::labels::Labels::BINARY,
        )
        .unwrap_err();
        assert_eq!(f.problem, DataProblem::SampleCounts { x: 2, y: 3 });
    }

    /// `y` `[N, K]` for a task of `K` target values: row-major targets, masked where a weighted
    /// task's value is NaN; `[N]` or `[N, 2]` for `K = 3`, and `[N, 3]` for a binary task, are
    /// shape faults saying what was expected.
    #[test]
    fn k_targets_come_from_y_of_n_by_k() {
        use zgrad::Task;
        let x = f32_array(&[2, 1, 2], &[0.0; 4]);
        let k3 = Labels::of(&Task::regression(3)).expect("labels");
        let y = f32_array(&[2, 3], &[1.0, 2.0, 3.0, 4.0, f32::NAN, 6.0]);
        let e = samples(&x, &y, 1, 2, k3).unwrap_err();
        assert_eq!(
            e.0.place,
            DataPlace::Element {
                array: "y".into(),
                index: vec![1, 1]
            }
        );
        let masked = Labels::of(&Task::regression(3).weighted()).expect("labels");
        let (_, ys) = samples(&x, &y, 1, 2, masked).expect("masked");
        assert_eq!(
            ys,
            [1.0, 2.0, 3.0, 1.0, 1.0, 1.0, 4.0, 0.0, 6.0, 1.0, 0.0, 1.0]
        );
        for (shape, labels, expected) in [
            (vec![2], k3, "[N, 3]"),
            (vec![2, 2], k3, "[N, 3]"),
            (vec![2, 3], Labels::BINARY, "[N] or [N, 1]"),
        ] {
            let n: usize = shape.iter().product();
            let (f, which) = samples(&x, &f32_array(&shape, &vec![0.0; n]), 1, 2, labels)
                .expect_err("another shape");
            assert_eq!(which, "y");
            let text = f.problem.to_string();
            assert!(
                text.contains(expected) && text.contains(&format!("{shape:?}")),
                "{text}"
            );
        }
    }

    #[test]
    fn a_nan_names_its_element() {
        let mut v = [0.0f32; 12];
        v[7] = f32::NAN;
        let x = f32_array(&[2, 3, 2], &v);
        let (f, _) = samples(
            &x,
            &f32_array(&[2, 1], &[0.0, 1.0]),
            3,
            2,
            crate::data::labels::Labels::BINARY,
        )
        .unwrap_err();
        assert_eq!(
            f.place,
            DataPlace::Element {
                array: "x".into(),
                index: vec![1, 0, 1]
            }
        );
    }
}
