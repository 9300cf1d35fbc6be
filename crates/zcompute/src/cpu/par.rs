//! The CPU backend's threads: one rayon pool for every op, sized from the machine
//! (`std::thread::available_parallelism`), from `ZGPU_CPU_THREADS`, or by [`set_threads`].
//!
//! Determinism: work is only ever split over independent outputs (rows, columns, output
//! blocks of a product, (batch, head) pairs), never inside one output element's sum, and every
//! output element is computed by the same code whichever task holds it. So the results are
//! bitwise the same for every thread count, and small ops, which run on the calling thread
//! alone (below [`MIN_PARALLEL`] elements), give the same bits as when they run split.

use rayon::prelude::*;
use std::sync::{Arc, PoisonError, RwLock};

/// The environment variable that sets the thread count (a whole number >= 1); unset, the
/// pool has one thread per processor the process may use.
pub const THREADS_VAR: &str = "ZGPU_CPU_THREADS";

/// Below this many elements of output an op runs on the calling thread: waking the pool costs
/// more than the work (a few microseconds a call).
pub(crate) const MIN_PARALLEL: usize = 1 << 15;

/// Errors of the thread settings.
#[derive(Debug, thiserror::Error)]
pub enum ThreadsError {
    /// `ZGPU_CPU_THREADS` or a requested count is not a whole number >= 1.
    #[error("bad CPU thread count {value:?}: give a whole number >= 1 (ZGPU_CPU_THREADS)")]
    BadCount { value: String },
    /// The operating system refused to start the pool's threads.
    #[error("could not start {threads} CPU worker threads")]
    Spawn {
        threads: usize,
        #[source]
        source: rayon::ThreadPoolBuildError,
    },
}

static POOL: RwLock<Option<Arc<rayon::ThreadPool>>> = RwLock::new(None);

fn build(threads: usize) -> Result<Arc<rayon::ThreadPool>, ThreadsError> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("zgpu-cpu-{i}"))
        .build()
        .map(Arc::new)
        .map_err(|source| ThreadsError::Spawn { threads, source })
}

/// Parses a thread count as `ZGPU_CPU_THREADS` holds it.
pub fn parse_threads(value: &str) -> Result<usize, ThreadsError> {
    match value.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(ThreadsError::BadCount {
            value: value.to_owned(),
        }),
    }
}

/// The thread count the pool starts with: `ZGPU_CPU_THREADS` when set, else the processors
/// this process may run on.
pub fn default_threads() -> Result<usize, ThreadsError> {
    match std::env::var(THREADS_VAR) {
        Ok(v) => parse_threads(&v),
        Err(_) => Ok(std::thread::available_parallelism().map_or(1, usize::from)),
    }
}

/// Sets the number of threads the CPU backend's ops use from now on (a new pool; ops running
/// now finish on the old one). Results do not depend on it (see the module docs).
pub fn set_threads(threads: usize) -> Result<(), ThreadsError> {
    if threads == 0 {
        return Err(ThreadsError::BadCount { value: "0".into() });
    }
    let pool = build(threads)?;
    *POOL.write().unwrap_or_else(PoisonError::into_inner) = Some(pool);
    tracing::debug!(threads, "zcompute.cpu.threads.set");
    Ok(())
}

fn pool() -> Option<Arc<rayon::ThreadPool>> {
    if let Some(p) = POOL.read().unwrap_or_else(PoisonError::into_inner).as_ref() {
        return Some(Arc::clone(p));
    }
    let mut slot = POOL.write().unwrap_or_else(PoisonError::into_inner);
    if slot.is_none() {
        // A bad ZGPU_CPU_THREADS is reported and the machine's count used: an op has no way
        // to return a configuration error, and ztrain checks the variable up front.
        let threads = default_threads().unwrap_or_else(|e| {
            tracing::warn!(error = %e, "zcompute.cpu.threads.bad_variable");
            std::thread::available_parallelism().map_or(1, usize::from)
        });
        match build(threads) {
            Ok(p) => *slot = Some(p),
            Err(e) => tracing::warn!(error = %e, "zcompute.cpu.threads.spawn_failed"),
        }
    }
    slot.as_ref().map(Arc::clone)
}

/// The number of threads the CPU backend's ops use now (inside [`with_threads`], its count).
#[must_use]
pub fn threads() -> usize {
    if rayon::current_thread_index().is_some() {
        rayon::current_num_threads()
    } else {
        pool().map_or(1, |p| p.current_num_threads())
    }
}

/// Runs `f` with the CPU backend's ops on a pool of `threads` threads of its own (for tests
/// and benchmarks comparing thread counts within one process).
pub fn with_threads<R: Send>(
    threads: usize,
    f: impl FnOnce() -> R + Send,
) -> Result<R, ThreadsError> {
    if threads == 0 {
        return Err(ThreadsError::BadCount { value: "0".into() });
    }
    Ok(build(threads)?.install(f))
}

/// Runs `f` on the pool (at once when already on a pool thread; on the calling thread when
/// the pool has one thread or could not start).
pub(crate) fn install<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if rayon::current_thread_index().is_some() {
        return f();
    }
    match pool() {
        Some(p) if p.current_num_threads() > 1 => p.install(f),
        _ => f(),
    }
}

/// Runs `f` compiled for the widest vector instructions this processor has (AVX2 with FMA on
/// x86-64, through `pulp`'s run-time dispatch; the plain build targets SSE2 only). `f` is
/// inlined there, so its loops vectorise eight f32 wide instead of four. The results are
/// bitwise the same as without: the compiler does not reorder or fuse floating-point
/// arithmetic (no `mul_add` contraction), it only widens the lanes.
#[inline(always)]
pub(crate) fn simd<R>(f: impl FnOnce() -> R) -> R {
    pulp::Arch::new().dispatch(f)
}

/// Splits `0..n` into about `threads` contiguous ranges of at least `min` (so `tasks` >= 1),
/// returning the range length.
fn span(n: usize, min: usize, threads: usize) -> usize {
    let tasks = (n / min.max(1)).clamp(1, threads.max(1));
    n.div_ceil(tasks).max(1)
}

/// Whether `work` elements are worth the pool.
fn parallel(work: usize) -> bool {
    work >= MIN_PARALLEL && threads() > 1
}

/// Calls `f(first_row, rows)` for consecutive blocks of `rows_of` elements each `row_len`
/// long in `out`, in parallel when `out` is large. `f` sees the block's first row index.
pub(crate) fn rows_mut<T: Send>(
    out: &mut [T],
    row_len: usize,
    f: impl Fn(usize, &mut [T]) + Send + Sync,
) {
    if row_len == 0 || out.is_empty() {
        return;
    }
    let rows = out.len() / row_len;
    if !parallel(out.len()) || rows < 2 {
        simd(|| f(0, out));
        return;
    }
    install(|| {
        let per = span(
            rows,
            (MIN_PARALLEL / row_len).max(1),
            rayon::current_num_threads(),
        );
        out.par_chunks_mut(per * row_len)
            .enumerate()
            .for_each(|(i, block)| simd(|| f(i * per, block)));
    });
}

/// [`rows_mut`] over two outputs with the same rows: `a` rows of `a_len`, `b` rows of
/// `b_len`; `f(first_row, a_rows, b_rows)`.
pub(crate) fn rows_mut2<T: Send, U: Send>(
    a: &mut [T],
    a_len: usize,
    b: &mut [U],
    b_len: usize,
    f: impl Fn(usize, &mut [T], &mut [U]) + Send + Sync,
) {
    if a_len == 0 || b_len == 0 || a.is_empty() {
        return;
    }
    let rows = a.len() / a_len;
    if !parallel(a.len()) || rows < 2 {
        simd(|| f(0, a, b));
        return;
    }
    install(|| {
        let per = span(
            rows,
            (MIN_PARALLEL / a_len).max(1),
            rayon::current_num_threads(),
        );
        a.par_chunks_mut(per * a_len)
            .zip(b.par_chunks_mut(per * b_len))
            .enumerate()
            .for_each(|(i, (x, y))| simd(|| f(i * per, x, y)));
    });
}

/// Calls `f(first, a, b, c)` over the same consecutive chunks of three equally long slices
/// (an optimiser's parameters and moments), in parallel when they are large.
pub(crate) fn chunks_mut3<T: Send>(
    a: &mut [T],
    b: &mut [T],
    c: &mut [T],
    f: impl Fn(usize, &mut [T], &mut [T], &mut [T]) + Send + Sync,
) {
    let n = a.len().min(b.len()).min(c.len());
    let (a, b, c) = (&mut a[..n], &mut b[..n], &mut c[..n]);
    if !parallel(n) {
        simd(|| f(0, a, b, c));
        return;
    }
    install(|| {
        let per = span(n, MIN_PARALLEL, rayon::current_num_threads());
        a.par_chunks_mut(per)
            .zip(b.par_chunks_mut(per))
            .zip(c.par_chunks_mut(per))
            .enumerate()
            .for_each(|(i, ((a, b), c))| simd(|| f(i * per, a, b, c)));
    });
}

/// Calls `f(first, chunk)` over consecutive chunks of `out` (any element-wise work), in
/// parallel when `out` is large.
pub(crate) fn chunks_mut<T: Send>(out: &mut [T], f: impl Fn(usize, &mut [T]) + Send + Sync) {
    rows_mut(out, 1, f);
}

/// `dst.copy_from_slice(src)`, split over the pool when large.
pub(crate) fn copy<T: Copy + Send + Sync>(src: &[T], dst: &mut [T]) {
    chunks_mut(dst, |start, chunk| {
        chunk.copy_from_slice(&src[start..start + chunk.len()]);
    });
}

/// Runs `f(start, len)` over `n` independent items split into contiguous ranges, in parallel
/// when `n * cost` (elements of work) is large, collecting each range's result in order.
pub(crate) fn ranges<R: Send>(
    n: usize,
    cost: usize,
    f: impl Fn(usize, usize) -> R + Send + Sync,
) -> Vec<R> {
    if n == 0 {
        return Vec::new();
    }
    if !parallel(n.saturating_mul(cost)) || n < 2 {
        return vec![simd(|| f(0, n))];
    }
    install(|| {
        let per = span(
            n,
            (MIN_PARALLEL / cost.max(1)).max(1),
            rayon::current_num_threads(),
        );
        (0..n.div_ceil(per))
            .into_par_iter()
            .map(|i| {
                let start = i * per;
                simd(|| f(start, per.min(n - start)))
            })
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_counts_parse_and_refuse_nonsense() {
        assert_eq!(parse_threads("3").unwrap(), 3);
        assert_eq!(parse_threads(" 1 ").unwrap(), 1);
        for bad in ["0", "-1", "two", "", "1.5"] {
            assert!(
                matches!(parse_threads(bad), Err(ThreadsError::BadCount { .. })),
                "{bad}"
            );
        }
        assert!(with_threads(0, || ()).is_err());
    }

    #[test]
    fn with_threads_sets_the_count_seen_by_ops() {
        assert_eq!(with_threads(3, threads).unwrap(), 3);
        assert_eq!(with_threads(1, threads).unwrap(), 1);
    }

    #[test]
    fn ranges_cover_every_item_once_in_order() {
        for threads in [1, 2, 5] {
            let got =
                with_threads(threads, || ranges(100_003, MIN_PARALLEL / 7, |s, n| (s, n))).unwrap();
            let mut next = 0;
            for (s, n) in got {
                assert_eq!(s, next);
                next += n;
            }
            assert_eq!(next, 100_003);
        }
    }

    #[test]
    fn rows_mut_hands_out_whole_rows_with_their_index() {
        for threads in [1, 2, 3] {
            let mut out = vec![0usize; 7 * 10_000];
            with_threads(threads, || {
                rows_mut(&mut out, 7, |first, block| {
                    assert_eq!(block.len() % 7, 0);
                    for (r, row) in block.chunks_exact_mut(7).enumerate() {
                        row.fill(first + r);
                    }
                });
            })
            .unwrap();
            assert!(
                out.chunks_exact(7)
                    .enumerate()
                    .all(|(r, row)| row.iter().all(|&v| v == r))
            );
        }
    }
}
