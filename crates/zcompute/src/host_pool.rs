//! Large host buffers kept for reuse. A training step allocates and frees the same large
//! tensors every step; given back to the system allocator they are returned to the operating
//! system (glibc trims the heap) and the next step pays a page fault and a zeroing per 4 KiB
//! page, about a tenth of a CPU step. Buffers of at least [`MIN_POOLED`] bytes freed by their
//! last tensor handle come here instead, up to [`CAP_BYTES`] in all, and [`zeroed`],
//! [`overwritten`] and `cpu::pool::copied` hand them out again by exact length, cleared or
//! overwritten: a pooled buffer is never seen with old contents.
//!
//! A ground module beside `storage`: `CpuStorage`'s drop gives buffers here, the CPU backend
//! takes them (`cpu::pool` adds the parallel copy), so storage never calls up into `cpu::`.

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
pub(crate) fn take<T: Element>(len: usize) -> Option<Vec<T>> {
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
