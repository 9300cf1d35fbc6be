//! The CPU backend's side of the host pool (`crate::host_pool`, beside `storage`): its buffers
//! handed out again, and a pooled copy split over the backend's threads.

use crate::element::Element;
use crate::host_pool::take;
pub(crate) use crate::host_pool::{give, overwritten, zeroed};

/// A copy of `src`, in a pooled buffer when one is free (copied by the pool's threads: a
/// step copies tens of megabytes, which one thread alone would spend a tenth of the step on).
pub(crate) fn copied<T: Element>(src: &[T]) -> Vec<T> {
    match take(src.len()) {
        Some(mut v) => {
            super::par::copy(src, &mut v);
            v
        }
        None => src.to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host_pool::MIN_POOLED;

    #[test]
    fn reused_buffers_come_back_cleared_or_overwritten() {
        let len = MIN_POOLED / 4 + 17;
        give(vec![7.0f32; len]);
        assert!(zeroed::<f32>(len).iter().all(|&v| v == 0.0));
        give(vec![7.0f32; len]);
        let src: Vec<f32> = (0..len).map(|i| i as f32).collect();
        assert_eq!(copied(&src), src);
        // Other types and lengths never get this buffer.
        give(vec![7.0f32; len]);
        assert!(zeroed::<f64>(len).iter().all(|&v| v == 0.0));
        assert!(zeroed::<f32>(len + 1).iter().all(|&v| v == 0.0));
    }
}
