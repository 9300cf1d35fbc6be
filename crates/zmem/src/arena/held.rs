//! The held region: saved and persistent blocks, each returned when its last handle drops.
//!
//! First-fit over free lists with coalescing. Step reclaim never looks here, which is what
//! makes a saved tensor own its memory by construction.

use std::collections::BTreeMap;

use zdevice::DevicePtr;

#[derive(Debug)]
pub(crate) struct HeldSegment {
    pub(crate) base: DevicePtr,
    pub(crate) size: u64,
    /// Free ranges: offset → length, never adjacent (coalesced).
    free: BTreeMap<u64, u64>,
    /// Highest offset ever handed out (to count reuses).
    used_ever: u64,
}

impl HeldSegment {
    pub(crate) fn new(base: DevicePtr, size: u64) -> HeldSegment {
        HeldSegment {
            base,
            size,
            free: BTreeMap::from([(0, size)]),
            used_ever: 0,
        }
    }

    /// First fit of an aligned `size`; returns (offset, whether it reuses freed memory).
    pub(crate) fn alloc(&mut self, size: u64) -> Option<(u64, bool)> {
        let (&off, &len) = self.free.iter().find(|&(_, &len)| len >= size)?;
        self.free.remove(&off);
        if len > size {
            self.free.insert(off + size, len - size);
        }
        let reused = off < self.used_ever;
        self.used_ever = self.used_ever.max(off + size);
        Some((off, reused))
    }

    /// Whether `ptr` lies in this segment.
    pub(crate) fn contains(&self, ptr: DevicePtr) -> bool {
        ptr.0 >= self.base.0 && ptr.0 < self.base.0 + self.size
    }

    /// Returns `[off, off + size)`, merging with free neighbours.
    pub(crate) fn free(&mut self, off: u64, size: u64) {
        let mut start = off;
        let mut len = size;
        if let Some((&prev, &plen)) = self.free.range(..off).next_back()
            && prev + plen == off
        {
            self.free.remove(&prev);
            start = prev;
            len += plen;
        }
        if let Some(&nlen) = self.free.get(&(off + size)) {
            self.free.remove(&(off + size));
            len += nlen;
        }
        self.free.insert(start, len);
    }

    /// Bytes free.
    pub(crate) fn free_bytes(&self) -> u64 {
        self.free.values().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn frees_coalesce_and_are_reused() {
        let mut s = HeldSegment::new(DevicePtr(0), 1024);
        assert_eq!(s.alloc(256), Some((0, false)));
        assert_eq!(s.alloc(256), Some((256, false)));
        assert_eq!(s.alloc(256), Some((512, false)));
        s.free(0, 256);
        s.free(256, 256);
        assert_eq!(s.alloc(512), Some((0, true)));
        s.free(512, 256);
        s.free(0, 512);
        assert_eq!(s.free_bytes(), 1024);
        assert_eq!(s.alloc(1024), Some((0, true)));
    }

    proptest! {
        #[test]
        fn never_overlaps(ops in prop::collection::vec((1u64..8, any::<bool>()), 1..200)) {
            let mut s = HeldSegment::new(DevicePtr(0), 64 * 256);
            let mut live: Vec<(u64, u64)> = Vec::new();
            for (units, free) in ops {
                if free && !live.is_empty() {
                    let (o, l) = live.remove(units as usize % live.len());
                    s.free(o, l);
                } else if let Some((o, _)) = s.alloc(units * 256) {
                    for &(a, l) in &live {
                        prop_assert!(o + units * 256 <= a || a + l <= o);
                    }
                    live.push((o, units * 256));
                }
                let used: u64 = live.iter().map(|l| l.1).sum();
                prop_assert_eq!(used + s.free_bytes(), 64 * 256);
            }
        }
    }
}
