//! Row ops indexed from memory (`Backend::gather_row`, `Backend::scatter_row`): the index is
//! read when the op runs, as the device kernels (`kernels/indexed.cu`) read it on each replay
//! of a captured graph, so the CPU backend's recorded graphs behave alike.

use super::common::{gather, scatter};
use crate::element::Element;
use crate::error::Result;
use crate::tensor::CpuTensor;
use crate::validate;

/// The index rule lives with the validation that shares it (`validate::indexed`).
pub(crate) use crate::validate::row_of;

pub(crate) fn gather_row<T: Element>(
    src: &CpuTensor<T>,
    index: &CpuTensor<T>,
    dst: &CpuTensor<T>,
) -> Result<()> {
    let table = validate::indexed_row("gather_row", src, dst, index)?;
    let values = match row_of(gather(index)[0].to_f64(), table.rows) {
        Some(row) => gather(&src.narrow(0, row, 1)?),
        None => vec![T::from_f64(f64::NAN); table.row_len],
    };
    scatter(&values, dst);
    Ok(())
}

pub(crate) fn scatter_row<T: Element>(
    src: &CpuTensor<T>,
    index: &CpuTensor<T>,
    dst: &CpuTensor<T>,
    advance: bool,
) -> Result<()> {
    let table = validate::indexed_row("scatter_row", dst, src, index)?;
    let at = gather(index)[0];
    if let Some(row) = row_of(at.to_f64(), table.rows) {
        scatter(&gather(src), &dst.narrow(0, row, 1)?);
    }
    if advance {
        scatter(&[at + T::ONE], index);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::row_of;

    #[test]
    fn only_whole_numbers_in_range_name_a_row() {
        assert_eq!(row_of(0.0, 3), Some(0));
        assert_eq!(row_of(2.0, 3), Some(2));
        for bad in [3.0, -1.0, 0.5, f64::NAN, f64::INFINITY, -0.5, 1e300] {
            assert_eq!(row_of(bad, 3), None, "{bad}");
        }
        assert_eq!(row_of(0.0, 0), None);
    }
}
