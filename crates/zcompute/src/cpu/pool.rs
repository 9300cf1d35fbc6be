//! Large host buffers kept for reuse. A training step allocates and frees the same large
//! tensors every step; given back to the system allocator they are returned to the operating
//! system (glibc trims the heap) and the next step pays a page fault and a zeroing per 4 KiB
//! page, about a tenth of a CPU step. Buffers of at least [`MIN_POOLED`] bytes freed by their
//! last tensor handle come here instead, up to [`CAP_BYTES`] in all, and [`zeroed`] and
//! [`copied`] hand them out again by exact length, cleared or overwritten: a pooled buffer is
//! never seen with old contents.

use crate::element::Element;
use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

/// Buffers below this many bytes go back to the allocator (cheap to get again).
pub(crate) const MIN_POOLED: usize = 256 << 10;
/// Bytes the pool holds at most; beyond it freed buffers go back to the allocator.
pub(crate) const CAP_BYTES: usize = 1 << 30;

#[derive(Default)]
struct Pool {
    free: HashMap<(TypeId, usize), Vec<Box<dyn Any + Send>>>,
    bytes: usize,
}

static POOL: Mutex<Option<Pool>> = Mutex::new(None);

fn bytes_of<T>(len: usize) -> usize {
    len.saturating_mul(size_of::<T>())
}

/// A pooled buffer of exactly `len` elements, if one is free.
fn take<T: Element>(len: usize) -> Option<Vec<T>> {
    if bytes_of::<T>(len) < MIN_POOLED {
        return None;
    }
    let mut guard = POOL.lock().unwrap_or_else(PoisonError::into_inner);
    let pool = guard.as_mut()?;
    let boxed = pool.free.get_mut(&(TypeId::of::<T>(), len))?.pop()?;
    let v = *boxed.downcast::<Vec<T>>().ok()?;
    pool.bytes -= bytes_of::<T>(v.capacity());
    Some(v)
}

/// Keeps `v` for reuse when it is large and the pool has room (else drops it).
pub(crate) fn give<T: Element>(v: Vec<T>) {
    let bytes = bytes_of::<T>(v.capacity());
    if bytes < MIN_POOLED || v.len() != v.capacity() {
        return;
    }
    let mut guard = POOL.lock().unwrap_or_else(PoisonError::into_inner);
    let pool = guard.get_or_insert_with(Pool::default);
    if pool.bytes + bytes > CAP_BYTES {
        return;
    }
    pool.bytes += bytes;
    let key = (TypeId::of::<T>(), v.len());
    pool.free.entry(key).or_default().push(Box::new(v));
}

/// `len` zeros, in a pooled buffer when one is free.
pub(crate) fn zeroed<T: Element>(len: usize) -> Vec<T> {
    match take(len) {
        Some(mut v) => {
            v.fill(T::ZERO);
            v
        }
        None => vec![T::ZERO; len],
    }
}

/// `len` elements for an op that writes every one of them before anything reads it: a pooled
/// buffer as it is (no clearing pass), else fresh zeros.
pub(crate) fn overwritten<T: Element>(len: usize) -> Vec<T> {
    take(len).unwrap_or_else(|| vec![T::ZERO; len])
}

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
