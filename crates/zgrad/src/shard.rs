//! Which rows of a global batch each data-parallel rank takes. A ground module: the
//! trainer's data-parallel step and the metrics' chunking read it, and it reads nothing of
//! theirs.

use std::ops::Range;

/// The rows of a global batch of `batch` that rank `rank` of `world` takes: contiguous,
/// disjoint, covering the batch, sizes differing by at most one (the first `batch % world`
/// ranks take one more).
#[must_use]
pub fn shard(rank: usize, world: usize, batch: usize) -> Range<usize> {
    let world = world.max(1);
    let (base, extra) = (batch / world, batch % world);
    let start = rank * base + rank.min(extra);
    let len = base + usize::from(rank < extra);
    start.min(batch)..(start + len).min(batch)
}

#[cfg(test)]
mod tests {
    use super::shard;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn shards_are_disjoint_contiguous_and_balanced(world in 1usize..9, batch in 0usize..100) {
            let mut next = 0;
            let mut sizes = Vec::new();
            for r in 0..world {
                let s = shard(r, world, batch);
                prop_assert_eq!(s.start, next);
                next = s.end;
                sizes.push(s.len());
            }
            prop_assert_eq!(next, batch);
            let (lo, hi) = (sizes.iter().min().copied().unwrap_or(0), sizes.iter().max().copied().unwrap_or(0));
            prop_assert!(hi - lo <= 1);
        }
    }

    #[test]
    fn three_ranks_of_seven() {
        assert_eq!([0, 1, 2].map(|r| shard(r, 3, 7)), [0..3, 3..5, 5..7]);
        assert_eq!([0, 1, 2].map(|r| shard(r, 3, 2)), [0..1, 1..2, 2..2]);
    }
}
