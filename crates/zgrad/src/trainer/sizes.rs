//! The memory a caller plans with before building a trainer: the most rows a resident data
//! set may hold, and the device bytes of a resident data set (`device_data.rs`) and of a
//! validation set on the device (`eval_device.rs`). Plain functions of sizes, below the
//! trainer that uses them; re-exported as `crate::trainer::*` (and at the crate root).

use zcompute::Element;

/// The most rows a resident data set of element `T` may hold: indices travel as `T` values,
/// exact up to 2^24 in `f32` (2^53 in `f64`).
#[must_use]
pub fn max_device_rows<T: Element>() -> usize {
    let probe = f64::from((1u32 << 24) + 1);
    if T::from_f64(probe).to_f64() == probe {
        1usize << 53.min(usize::BITS - 1)
    } else {
        1 << 24
    }
}

/// Device bytes a resident data set of `n` samples of `per` values and `targets` target values
/// each (`Task::target_len`) takes in elements of `elem_bytes` bytes: features, targets and the
/// index buffer (`n` slots, the largest batch).
#[must_use]
pub fn device_data_bytes(n: usize, per: usize, targets: usize, elem_bytes: usize) -> u64 {
    let values = (n as u64).saturating_mul(per as u64 + targets as u64 + 1);
    values.saturating_mul(elem_bytes as u64)
}

/// Device bytes a validation set of `n` samples of `per` values takes on one device, with
/// chunks of `chunk` samples, in elements of `elem_bytes` bytes: features, the logits buffer,
/// and the input of each chunk shape (a full chunk's and the last one's). This is XAsset's
/// binary task (one logit per sample read back); another task holds its targets and a
/// statistics row per chunk instead of the logits (`metrics::chunk_stats`), not counted here.
#[must_use]
pub fn validation_data_bytes(n: usize, per: usize, chunk: usize, elem_bytes: usize) -> u64 {
    let chunk = chunk.max(1) as u64;
    let (n, per) = (n as u64, per as u64);
    let inputs = n.min(chunk) + if n > chunk { n % chunk } else { 0 };
    let values = n
        .saturating_mul(per + 1)
        .saturating_add(inputs.saturating_mul(per));
    values.saturating_mul(elem_bytes as u64)
}
