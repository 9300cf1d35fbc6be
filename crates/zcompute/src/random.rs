//! The random family: [`RandomOps`], a dropout mask from a counter-based generator,
//! Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11; the
//! generator of cuRAND and of PyTorch's CUDA dropout): each element's number is a pure
//! function of `(seed, step, stream, element index)`, so a mask is the same bits on every
//! backend and every run, and needs no generator state beyond the step.
//!
//! The step lives in device memory (one element) and is read when the op runs, so a captured
//! graph that advances it ([`RandomOps::advance_step`]) draws new numbers on each replay, the
//! same numbers an eager run draws at that step.

use crate::backend::{BTensor, Backend, BinaryOp, ScalarSide};
use crate::element::Element;
use crate::error::Result;
use crate::validate;

/// Philox4x32-10 of `counter` under `key`: four 32-bit words.
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    const M0: u64 = 0xD251_1F53;
    const M1: u64 = 0xCD9E_8D57;
    let (mut c, mut k) = (counter, key);
    for _ in 0..10 {
        let p0 = M0 * u64::from(c[0]);
        let p1 = M1 * u64::from(c[2]);
        c = [
            (p1 >> 32) as u32 ^ c[1] ^ k[0],
            p1 as u32,
            (p0 >> 32) as u32 ^ c[3] ^ k[1],
            p0 as u32,
        ];
        k = [
            k[0].wrapping_add(0x9E37_79B9),
            k[1].wrapping_add(0xBB67_AE85),
        ];
    }
    c
}

/// Largest step a mask accepts: steps are elements of the tensor type, exact in f32 up to
/// 2^24.
pub const DROPOUT_MAX_STEP: f64 = 16_777_216.0;

/// The keep threshold on a draw's top 24 bits for drop probability `p` in `[0, 1)`:
/// `ceil(p * 2^24)`, so an element is kept with probability `1 - threshold / 2^24`, the
/// nearest multiple of 2^-24 at or below `1 - p`. An integer test, the same on every backend.
pub fn dropout_threshold(p: f64) -> u32 {
    (p * DROPOUT_MAX_STEP).ceil() as u32
}

/// Whether element `i` is kept at `(seed, step, stream)` under `threshold`.
pub fn dropout_keeps(seed: u64, step: u32, stream: u32, i: u64, threshold: u32) -> bool {
    let r = philox4x32_10(
        [i as u32, (i >> 32) as u32, step, stream],
        [seed as u32, (seed >> 32) as u32],
    );
    (r[0] >> 8) >= threshold
}

/// The step a one-element step tensor holds, if it is a whole number in `[0, 2^24]`.
pub fn dropout_step(value: f64) -> Option<u32> {
    (value.is_finite() && value >= 0.0 && value.fract() == 0.0 && value <= DROPOUT_MAX_STEP)
        .then_some(value as u32)
}

/// A dropout mask drawn on the backend. A backend implements `dropout_mask`; `advance_step`
/// is provided.
pub trait RandomOps<T: Element>: Backend<T> {
    /// A dense mask of `shape` whose elements are `1 / (1 - p)` where kept and 0 where dropped
    /// (multiply the input by it: inverted dropout, as `torch.nn.functional.dropout`); element
    /// `i` (row-major) is kept when [`dropout_keeps`]`(seed, step, stream, i, threshold)`.
    /// `step` holds one element, read when the op runs; a value that is not a whole number in
    /// `[0, 2^24]` makes every element NaN. `stream` tells apart the masks of one step (a
    /// model gives each dropout site its own). `p` must be in `[0, 1)`.
    fn dropout_mask(
        &self,
        shape: &[usize],
        p: f64,
        seed: u64,
        stream: u32,
        step: &BTensor<Self, T>,
    ) -> Result<BTensor<Self, T>>;

    /// `step += 1` in place, on the backend's stream (inside a captured graph it runs on each
    /// replay, so the next replay's masks are the next step's).
    fn advance_step(&self, step: &BTensor<Self, T>) -> Result<()> {
        validate::dropout_step_tensor("advance_step", step)?;
        let next = self.binary_scalar(BinaryOp::Add, step, T::ONE, ScalarSide::Rhs)?;
        self.copy_into(&next, step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random123's known-answer vectors for Philox4x32-10 (`kat_vectors`).
    #[test]
    fn philox_matches_the_random123_known_answers() {
        assert_eq!(
            philox4x32_10([0; 4], [0; 2]),
            [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
        );
        assert_eq!(
            philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]
        );
        assert_eq!(
            philox4x32_10(
                [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
                [0xa409_3822, 0x299f_31d0]
            ),
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
        );
    }

    #[test]
    fn thresholds_and_steps() {
        assert_eq!(dropout_threshold(0.0), 0);
        assert_eq!(dropout_threshold(0.5), 1 << 23);
        assert_eq!(dropout_step(3.0), Some(3));
        for bad in [-1.0, 0.5, f64::NAN, DROPOUT_MAX_STEP + 1.0] {
            assert_eq!(dropout_step(bad), None, "{bad}");
        }
        // p = 0 keeps everything.
        assert!((0..1000).all(|i| dropout_keeps(1, 2, 3, i, dropout_threshold(0.0))));
    }
}
