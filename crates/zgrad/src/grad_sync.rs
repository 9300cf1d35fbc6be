//! The overlapped gradient all-reduce of the data-parallel step: the flat gradient buffer cut
//! into buckets of whole parameters, issued one after the other from the buffer's end (the last
//! parameters, whose gradients backward finishes first) to its start, each as soon as backward
//! has finished every gradient in it and every bucket before it was issued. Every rank issues
//! the same buckets in the same order whatever its timing (or with an empty shard), as the
//! collectives require; the engine stream joins them all before the norm.
//!
//! What the step waits for after backward is the all-reduce of whatever backward finished
//! last. So by default the buckets taper toward the buffer's start ([`GradSync::Overlapped`]):
//! a bucket holds `bucket_bytes`, or a fifth of the gradient not issued yet where that is less
//! (never below a sixteenth of `bucket_bytes`). Each bucket then has about four times its size
//! of backward still to run after it is issued (an all-reduce moves a gradient element several
//! times faster than backward produces one), and the last ones, issued during backward's final
//! nodes, are small. The plan depends only on the layout (offsets, length, bucket size), the
//! same on every rank and every step.

use std::ops::Range;

/// Bytes of a bucket by default: a few buckets for the models ztrain trains (XAsset's
/// gradients are 3.4 MB), each large enough for NCCL's bandwidth, small enough that the first
/// ones overlap most of backward.
pub const DEFAULT_BUCKET_BYTES: usize = 1 << 20;

/// A tapered bucket holds at least 1/`TAPER` of the gradient not issued yet (when that is less
/// than `bucket_bytes`): about (`TAPER` - 1) times its size of backward runs after it is issued.
const TAPER: usize = 5;

/// Tapered buckets hold at least `bucket_bytes` / `TAPER_FLOOR`: below that an all-reduce
/// costs its latency whatever its size, so smaller buckets would only add launches to the tail.
const TAPER_FLOOR: usize = 16;

/// How a data-parallel step sums the gradients over the ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GradSync {
    /// One all-reduce of the whole flat gradient buffer after backward, on the engine stream.
    AfterBackward,
    /// Buckets of the flat gradient buffer (whole parameters), each all-reduced on a second
    /// stream while backward goes on, tapering toward the buffer's start (see the module docs):
    /// a bucket holds at least `bucket_bytes`, or a fifth of the gradient not issued yet where
    /// that is less (but at least `bucket_bytes / 16`); the buffer's first parameters' remainder
    /// may be smaller.
    Overlapped {
        /// Bytes of gradient a bucket holds at least, away from the buffer's start.
        bucket_bytes: usize,
    },
    /// As `Overlapped`, without the taper: every bucket at least `bucket_bytes` (the first
    /// parameters' remainder may be smaller). The plan before the taper, kept to compare with.
    OverlappedUniform {
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

impl GradSync {
    /// The bucket plan's sizing and bytes when the gradients are summed in buckets.
    pub(crate) fn buckets(self) -> Option<(Sizing, usize)> {
        match self {
            GradSync::AfterBackward => None,
            GradSync::Overlapped { bucket_bytes } => Some((Sizing::Tapered, bucket_bytes)),
            GradSync::OverlappedUniform { bucket_bytes } => Some((Sizing::Uniform, bucket_bytes)),
        }
    }
}

/// How a plan sizes its buckets (see [`GradSync`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sizing {
    Tapered,
    Uniform,
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
    /// Buckets of at least `bucket_elems` elements (whole parameters, from the last one;
    /// tapered toward the start as `sizing` says) of a flat buffer of `len` elements whose
    /// parameters start at `offsets` (ascending, the first at 0).
    pub(crate) fn new(offsets: &[usize], len: usize, bucket_elems: usize, sizing: Sizing) -> Self {
        let bucket_elems = bucket_elems.max(1);
        let floor = (bucket_elems / TAPER_FLOOR).max(1);
        let mut ranges = Vec::new();
        let mut bucket_of = vec![0; offsets.len()];
        let mut end = len;
        for (i, &start) in offsets.iter().enumerate().rev() {
            bucket_of[i] = ranges.len();
            // `end` elements are not issued yet: backward still has all of them to finish.
            let want = match sizing {
                Sizing::Uniform => bucket_elems,
                Sizing::Tapered => (end / TAPER).clamp(floor, bucket_elems),
            };
            if end - start >= want || i == 0 {
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

    /// What a plan's bucket ending at `end` holds at least (the last one excepted).
    fn wanted(sizing: Sizing, bucket: usize, end: usize) -> usize {
        match sizing {
            Sizing::Uniform => bucket,
            Sizing::Tapered => (end / TAPER).clamp((bucket / TAPER_FLOOR).max(1), bucket),
        }
    }

    proptest! {
        /// The buckets cover the buffer exactly (every gradient element in one bucket), from
        /// its end down, each of whole parameters, holding at least what its sizing wants but
        /// the last, and no more than that plus its first parameter; and whatever order
        /// backward finishes the parameters in, every bucket is issued once, in plan order, and
        /// only once all its parameters are final.
        #[test]
        fn buckets_cover_the_buffer_and_issue_in_order(
            sizes in prop::collection::vec(1usize..500, 1..12),
            bucket in 1usize..1500,
            tapered in any::<bool>(),
            order in prop::collection::vec(any::<prop::sample::Index>(), 12),
        ) {
            let (offsets, len) = layout(&sizes);
            let sizing = if tapered { Sizing::Tapered } else { Sizing::Uniform };
            let plan = BucketPlan::new(&offsets, len, bucket, sizing);
            let mut end = len;
            for (k, r) in plan.ranges().iter().enumerate() {
                prop_assert_eq!(r.end, end);
                prop_assert!(offsets.contains(&r.start));
                let want = wanted(sizing, bucket, r.end);
                prop_assert!(r.len() >= want || k + 1 == plan.ranges().len());
                let first = offsets.iter().find(|&&o| o > r.start).map_or(r.end, |&o| o.min(r.end));
                prop_assert!(r.end - first < want, "{:?}: closed late", r);
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

    #[rstest::rstest]
    fn one_bucket_when_the_size_exceeds_the_buffer(
        #[values(Sizing::Tapered, Sizing::Uniform)] sizing: Sizing,
    ) {
        let (offsets, len) = layout(&[100, 3, 70]);
        let plan = BucketPlan::new(&offsets, len, 1 << 20, sizing);
        assert_eq!(plan.ranges().len(), 1);
        assert_eq!(plan.ranges()[0], 0..len);
        let plan = BucketPlan::new(&offsets, len, 64, sizing);
        assert_eq!(plan.ranges(), &[192..320, 128..192, 0..128]);
    }
}
