//! The overlapped gradient all-reduce of the data-parallel step: the flat gradient buffer cut
//! into buckets of whole parameters, issued one after the other from the buffer's end (the last
//! parameters, whose gradients backward finishes first) to its start, each as soon as backward
//! has finished every gradient in it and every bucket before it was issued. Every rank issues
//! the same buckets in the same order whatever its timing (or with an empty shard), as the
//! collectives require; the engine stream joins them all before the norm.

use std::ops::Range;

/// Bytes of a bucket by default: a few buckets for the models ztrain trains (XAsset's
/// gradients are 3.4 MB), each large enough for NCCL's bandwidth, small enough that the first
/// ones overlap most of backward.
pub const DEFAULT_BUCKET_BYTES: usize = 1 << 20;

/// How a data-parallel step sums the gradients over the ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GradSync {
    /// One all-reduce of the whole flat gradient buffer after backward, on the engine stream.
    AfterBackward,
    /// Buckets of the flat gradient buffer of at least `bucket_bytes` (whole parameters; the
    /// first parameters' remainder may be smaller), each all-reduced on a second stream while
    /// backward goes on (see the module docs).
    Overlapped {
        /// Bytes of gradient a bucket holds at least.
        bucket_bytes: usize,
    },
}

impl Default for GradSync {
    fn default() -> Self {
        GradSync::Overlapped {
            bucket_bytes: DEFAULT_BUCKET_BYTES,
        }
    }
}

/// The buckets of one flat layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BucketPlan {
    /// Element ranges of the flat buffer, in issue order (descending, covering it exactly).
    ranges: Vec<Range<usize>>,
    /// The parameters' offsets (ascending) and each one's bucket.
    offsets: Vec<usize>,
    bucket_of: Vec<usize>,
}

impl BucketPlan {
    /// Buckets of at least `bucket_elems` elements (whole parameters, from the last one) of a
    /// flat buffer of `len` elements whose parameters start at `offsets` (ascending, the first
    /// at 0).
    pub(crate) fn new(offsets: &[usize], len: usize, bucket_elems: usize) -> Self {
        let bucket_elems = bucket_elems.max(1);
        let mut ranges = Vec::new();
        let mut bucket_of = vec![0; offsets.len()];
        let mut end = len;
        for (i, &start) in offsets.iter().enumerate().rev() {
            bucket_of[i] = ranges.len();
            if end - start >= bucket_elems || i == 0 {
                ranges.push(start..end);
                end = start;
            }
        }
        if ranges.is_empty() && len > 0 {
            ranges.push(0..len);
        }
        BucketPlan {
            ranges,
            offsets: offsets.to_vec(),
            bucket_of,
        }
    }

    /// The buckets' element ranges, in issue order.
    pub(crate) fn ranges(&self) -> &[Range<usize>] {
        &self.ranges
    }
}

/// One backward's progress through a plan's buckets.
#[derive(Debug)]
pub(crate) struct BucketCursor<'p> {
    plan: &'p BucketPlan,
    /// Parameters of each bucket whose gradient is not final yet.
    pending: Vec<usize>,
    done: Vec<bool>,
    next: usize,
}

impl<'p> BucketCursor<'p> {
    pub(crate) fn new(plan: &'p BucketPlan) -> Self {
        let mut pending = vec![0; plan.ranges.len()];
        for &k in &plan.bucket_of {
            pending[k] += 1;
        }
        BucketCursor {
            plan,
            pending,
            done: vec![false; plan.offsets.len()],
            next: 0,
        }
    }

    /// The gradient of the parameter at flat offset `offset` is final: the buckets (indices
    /// into `ranges`, in order) to issue now. Offsets of no parameter, and repeats, change
    /// nothing.
    pub(crate) fn finish(&mut self, offset: usize) -> Range<usize> {
        if let Ok(i) = self.plan.offsets.binary_search(&offset)
            && !self.done[i]
        {
            self.done[i] = true;
            self.pending[self.plan.bucket_of[i]] -= 1;
        }
        let from = self.next;
        while self.pending.get(self.next) == Some(&0) {
            self.next += 1;
        }
        from..self.next
    }

    /// Every bucket not issued yet, in order (after backward: gradients no node reached are
    /// final too).
    pub(crate) fn rest(&mut self) -> Range<usize> {
        let from = self.next;
        self.next = self.plan.ranges.len();
        from..self.next
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn layout(sizes: &[usize]) -> (Vec<usize>, usize) {
        let mut offsets = Vec::new();
        let mut next = 0;
        for &n in sizes {
            offsets.push(next);
            next += n.div_ceil(64) * 64;
        }
        (offsets, next)
    }

    proptest! {
        /// The buckets cover the buffer exactly, from its end down, each of whole parameters
        /// and at least the bucket size but the last; and whatever order backward finishes the
        /// parameters in, every bucket is issued once, in plan order, and only once all its
        /// parameters are final.
        #[test]
        fn buckets_cover_the_buffer_and_issue_in_order(
            sizes in prop::collection::vec(1usize..500, 1..12),
            bucket in 1usize..1500,
            order in prop::collection::vec(any::<prop::sample::Index>(), 12),
        ) {
            let (offsets, len) = layout(&sizes);
            let plan = BucketPlan::new(&offsets, len, bucket);
            let mut end = len;
            for (k, r) in plan.ranges().iter().enumerate() {
                prop_assert_eq!(r.end, end);
                prop_assert!(offsets.contains(&r.start));
                prop_assert!(r.len() >= bucket || k + 1 == plan.ranges().len());
                end = r.start;
            }
            prop_assert_eq!(end, 0);
            let mut left: Vec<usize> = (0..offsets.len()).collect();
            let mut finished = Vec::new();
            let mut issued = Vec::new();
            let mut cursor = BucketCursor::new(&plan);
            for ix in &order {
                if left.is_empty() { break; }
                let i = left.remove(ix.index(left.len()));
                finished.push(offsets[i]);
                for k in cursor.finish(offsets[i]) {
                    let r = &plan.ranges()[k];
                    prop_assert!(offsets.iter().filter(|o| r.contains(o)).all(|o| finished.contains(o)));
                    issued.push(k);
                }
            }
            issued.extend(cursor.rest());
            prop_assert_eq!(issued, (0..plan.ranges().len()).collect::<Vec<_>>());
        }
    }

    #[test]
    fn one_bucket_when_the_size_exceeds_the_buffer() {
        let (offsets, len) = layout(&[100, 3, 70]);
        let plan = BucketPlan::new(&offsets, len, 1 << 20);
        assert_eq!(plan.ranges().len(), 1);
        assert_eq!(plan.ranges()[0], 0..len);
        let plan = BucketPlan::new(&offsets, len, 64);
        assert_eq!(plan.ranges(), &[192..320, 128..192, 0..128]);
    }
}
