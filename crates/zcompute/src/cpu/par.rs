//! The CPU backend's threads: a team of `threads` for every op, sized from the machine
//! (`std::thread::available_parallelism`), from `ZGPU_CPU_THREADS`, or by [`set_threads`]. The
//! calling thread is one of the team: an op cut into pieces puts them in a queue, wakes the
//! `threads - 1` helpers of a rayon pool and takes pieces from the queue itself until it is
//! empty ([`drain`]). So the caller never sleeps while the helpers work (it did, once and a
//! wake-up per op, when every op was handed to a pool of `threads` workers), and when a helper
//! wakes late the caller has already taken its pieces.
//!
//! Determinism: work is only ever split over independent outputs (rows, columns, output
//! blocks of a product, (batch, head) pairs), never inside one output element's sum, and every
//! output element is computed by the same code whichever piece and thread hold it (the queue
//! decides only who computes a piece, never what it computes). So the results are bitwise the
//! same for every thread count, and small ops, which run on the calling thread alone (below
//! [`MIN_PARALLEL`] elements), give the same bits as when they run split.

use std::cell::{Cell, RefCell};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

/// The environment variable that sets the thread count (a whole number >= 1); unset, the
/// team has one thread per processor the process may use.
pub const THREADS_VAR: &str = "ZGPU_CPU_THREADS";

/// Below this many elements of output an op runs on the calling thread: waking a helper costs
/// more than the work (a few microseconds a call).
pub(crate) const MIN_PARALLEL: usize = 1 << 15;

/// Pieces an element-wise or row-wise op is cut into per thread (when large enough): a helper
/// that starts late, or a core another process holds for a while, leaves the others at most a
/// piece to finish.
const PIECES_PER_THREAD: usize = 4;

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

/// The threads ops run on: the calling thread and, with more than one, a pool of the others.
#[derive(Clone)]
struct Team {
    threads: usize,
    helpers: Option<Arc<rayon::ThreadPool>>,
}

static TEAM: RwLock<Option<Team>> = RwLock::new(None);

thread_local! {
    /// The team of [`with_threads`] while it runs on this thread.
    static SCOPED: RefCell<Option<Team>> = const { RefCell::new(None) };
    /// Set while this thread runs a piece: ops inside it run on this thread alone.
    static IN_PIECE: Cell<bool> = const { Cell::new(false) };
}

fn build(threads: usize) -> Result<Team, ThreadsError> {
    if threads == 0 {
        return Err(ThreadsError::BadCount { value: "0".into() });
    }
    let helpers = if threads == 1 {
        None
    } else {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads - 1)
            .thread_name(|i| format!("zgpu-cpu-{}", i + 1))
            .build()
            .map_err(|source| ThreadsError::Spawn { threads, source })?;
        Some(Arc::new(pool))
    };
    Ok(Team { threads, helpers })
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

/// The thread count the team starts with: `ZGPU_CPU_THREADS` when set, else the processors
/// this process may run on.
pub fn default_threads() -> Result<usize, ThreadsError> {
    match std::env::var_os(THREADS_VAR).map(std::ffi::OsString::into_string) {
        Some(Ok(v)) => parse_threads(&v),
        // Named, never shown nor taken as unset.
        Some(Err(_)) => Err(ThreadsError::BadCount {
            value: "(not UTF-8)".into(),
        }),
        None => Ok(std::thread::available_parallelism().map_or(1, usize::from)),
    }
}

/// Sets the number of threads the CPU backend's ops use from now on, the calling thread
/// included (a new pool of helpers; ops running now finish on the old one). Results do not
/// depend on it (see the module docs).
pub fn set_threads(threads: usize) -> Result<(), ThreadsError> {
    let team = build(threads)?;
    *TEAM.write().unwrap_or_else(PoisonError::into_inner) = Some(team);
    tracing::debug!(threads, "zcompute.cpu.threads.set");
    Ok(())
}

/// The process-wide team, started on first use.
fn global() -> Team {
    if let Some(t) = TEAM.read().unwrap_or_else(PoisonError::into_inner).as_ref() {
        return t.clone();
    }
    let mut slot = TEAM.write().unwrap_or_else(PoisonError::into_inner);
    slot.get_or_insert_with(|| {
        // A bad ZGPU_CPU_THREADS is reported and the machine's count used: an op has no way
        // to return a configuration error, and ztrain checks the variable up front.
        let threads = default_threads().unwrap_or_else(|e| {
            tracing::warn!(error = %e, "zcompute.cpu.threads.bad_variable");
            std::thread::available_parallelism().map_or(1, usize::from)
        });
        build(threads).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "zcompute.cpu.threads.spawn_failed");
            Team {
                threads: 1,
                helpers: None,
            }
        })
    })
    .clone()
}

/// The team this thread's ops use now.
fn team() -> Team {
    SCOPED.with(|s| s.borrow().clone()).unwrap_or_else(global)
}

/// The number of threads the CPU backend's ops use now, the calling thread included (inside
/// [`with_threads`], its count).
#[must_use]
pub fn threads() -> usize {
    team().threads
}

/// Runs `f` on the calling thread with the CPU backend's ops on a team of `threads` of its own
/// (for tests and benchmarks comparing thread counts within one process).
pub fn with_threads<R>(threads: usize, f: impl FnOnce() -> R) -> Result<R, ThreadsError> {
    let team = build(threads)?;
    /// Puts back the team that was scoped before, also when `f` panics.
    struct Restore(Option<Team>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let before = self.0.take();
            SCOPED.with(|s| *s.borrow_mut() = before);
        }
    }
    let _restore = Restore(SCOPED.with(|s| s.borrow_mut().replace(team)));
    Ok(f())
}

/// Marks this thread as running a piece until dropped (restoring what it was).
struct InPiece(bool);

impl InPiece {
    fn enter() -> Self {
        InPiece(IN_PIECE.with(|p| p.replace(true)))
    }
}

impl Drop for InPiece {
    fn drop(&mut self) {
        IN_PIECE.with(|p| p.set(self.0));
    }
}

/// The pieces' queue: what is left, how many pieces are done, and how many helpers are
/// inside their task.
struct Queue<I> {
    left: I,
    done: usize,
    running: usize,
}

/// Locks the queue (a panic elsewhere leaves it consistent: its counts change under the lock
/// only).
fn lock<I>(queue: &Mutex<Queue<I>>) -> std::sync::MutexGuard<'_, Queue<I>> {
    queue.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Counts a piece done when dropped, so a piece that panics is counted too (the panic then
/// goes on to the caller through the scope).
struct Done<'a, I>(&'a Mutex<Queue<I>>);

impl<I> Drop for Done<'_, I> {
    fn drop(&mut self) {
        lock(self.0).done += 1;
    }
}

/// Counts a helper inside its task until dropped (also when a piece panics).
struct Running<'a, I>(&'a Mutex<Queue<I>>);

impl<'a, I> Running<'a, I> {
    fn enter(queue: &'a Mutex<Queue<I>>) -> Self {
        lock(queue).running += 1;
        Running(queue)
    }
}

impl<I> Drop for Running<'_, I> {
    fn drop(&mut self) {
        lock(self.0).running -= 1;
    }
}

/// Runs `work` on every item of `items` (an op's pieces), each exactly once, on the calling
/// thread and the team's helpers: each takes the next item from a shared queue until it is
/// empty. On the calling thread alone when the team has one thread, there is one item, or
/// this thread is already running a piece (no nested splitting).
pub(crate) fn drain<I: Send>(
    items: impl ExactSizeIterator<Item = I> + Send,
    work: impl Fn(I) + Sync,
) {
    let n = items.len();
    let team = team();
    let helpers = match &team.helpers {
        Some(pool) if n > 1 && !IN_PIECE.with(Cell::get) => pool,
        _ => {
            items.for_each(|item| simd(|| work(item)));
            return;
        }
    };
    let queue = Mutex::new(Queue {
        left: items,
        done: 0,
        running: 0,
    });
    let run = || {
        let _piece = InPiece::enter();
        loop {
            let next = lock(&queue).left.next();
            let Some(item) = next else { break };
            let _done = Done(&queue);
            simd(|| work(item));
        }
    };
    helpers.in_place_scope(|scope| {
        for _ in 1..team.threads.min(n) {
            scope.spawn(|_| {
                let _running = Running::enter(&queue);
                run();
            });
        }
        run();
        // The queue is empty; a helper may still be on its last piece, or on its way out.
        // Wait for it awake (yielding the core to anyone else) rather than asleep in the
        // scope's end, which would add a wake-up to the op. A helper that has not started
        // yet finds nothing to do; the scope's end waits for it asleep.
        loop {
            let q = lock(&queue);
            if q.done == n && q.running == 0 {
                break;
            }
            drop(q);
            std::thread::yield_now();
        }
    });
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

/// [`simd`] for a large body: `op.with_simd` marked `#[inline(always)]` and calling
/// `#[inline(always)]` functions is compiled into the AVX2 code itself. A closure's body is
/// not: the dispatch calls it from two places (the AVX2 code and the plain one), so the
/// compiler keeps a large closure out of line, compiled for SSE2.
#[inline(always)]
pub(crate) fn simd_op<Op: pulp::WithSimd>(op: Op) -> Op::Output {
    pulp::Arch::new().dispatch(op)
}

/// The length of the pieces `0..n` is cut into: about [`PIECES_PER_THREAD`] per thread, each
/// at least `min` long (so there is at least one).
fn span(n: usize, min: usize) -> usize {
    let pieces = (n / min.max(1)).clamp(1, threads() * PIECES_PER_THREAD);
    n.div_ceil(pieces).max(1)
}

/// Whether `work` elements are worth the helpers.
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
    let per = span(rows, (MIN_PARALLEL / row_len).max(1));
    drain(out.chunks_mut(per * row_len).enumerate(), |(i, block)| {
        f(i * per, block);
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
    let per = span(rows, (MIN_PARALLEL / a_len).max(1));
    let pieces = a.chunks_mut(per * a_len).zip(b.chunks_mut(per * b_len));
    drain(pieces.enumerate(), |(i, (x, y))| f(i * per, x, y));
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
    let per = span(n, MIN_PARALLEL);
    let pieces = a
        .chunks_mut(per)
        .zip(b.chunks_mut(per))
        .zip(c.chunks_mut(per));
    drain(pieces.enumerate(), |(i, ((a, b), c))| f(i * per, a, b, c));
}

/// Calls `f(first, chunk)` over consecutive chunks of `out` (any element-wise work), in
/// parallel when `out` is large.
pub(crate) fn chunks_mut<T: Send>(out: &mut [T], f: impl Fn(usize, &mut [T]) + Send + Sync) {
    rows_mut(out, 1, f);
}

/// `dst.copy_from_slice(src)`, split over the team when large.
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
    let per = span(n, (MIN_PARALLEL / cost.max(1)).max(1));
    let mut results: Vec<Option<R>> = (0..n.div_ceil(per)).map(|_| None).collect();
    drain(results.iter_mut().enumerate(), |(i, slot)| {
        let start = i * per;
        *slot = Some(f(start, per.min(n - start)));
    });
    results.into_iter().flatten().collect()
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
    fn drain_runs_every_piece_once_with_the_caller_among_the_threads() {
        let caller = std::thread::current().id();
        for threads in [1, 2, 3] {
            for pieces in [0, 1, 2, 7, 64] {
                let runs: Vec<Mutex<Vec<std::thread::ThreadId>>> =
                    (0..pieces).map(|_| Mutex::new(Vec::new())).collect();
                with_threads(threads, || {
                    drain(runs.iter(), |who| {
                        who.lock().unwrap().push(std::thread::current().id());
                        // A piece's own ops run on the piece's thread alone.
                        let here = std::thread::current().id();
                        drain(0..4, |_| assert_eq!(std::thread::current().id(), here));
                    });
                })
                .unwrap();
                let runs: Vec<_> = runs.into_iter().map(|m| m.into_inner().unwrap()).collect();
                assert!(
                    runs.iter().all(|r| r.len() == 1),
                    "{threads} threads, {runs:?}"
                );
                if threads == 1 || pieces == 1 {
                    assert!(runs.iter().flatten().all(|&t| t == caller));
                }
            }
        }
    }

    #[test]
    fn a_panicking_piece_reaches_the_caller_and_the_team_still_works() {
        with_threads(2, || {
            let caught = std::panic::catch_unwind(|| {
                drain(0..8, |i| assert!(i != 5, "piece five fails"));
            });
            assert!(caught.is_err());
            assert!(!IN_PIECE.with(Cell::get));
            let mut out = vec![0usize; 4 * MIN_PARALLEL];
            chunks_mut(&mut out, |first, chunk| {
                for (i, v) in chunk.iter_mut().enumerate() {
                    *v = first + i;
                }
            });
            assert!(out.iter().enumerate().all(|(i, &v)| i == v));
        })
        .unwrap();
    }

    #[test]
    fn with_threads_runs_on_the_calling_thread_and_restores_the_count() {
        let caller = std::thread::current().id();
        let outer = threads();
        let seen = with_threads(3, || {
            let inner = with_threads(2, threads).unwrap();
            (std::thread::current().id(), inner, threads())
        })
        .unwrap();
        assert_eq!(seen, (caller, 2, 3));
        assert_eq!(threads(), outer);
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
