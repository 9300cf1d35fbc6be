//! A set evaluated on the device ([`EvalSet`]): its chunk groups (features, inputs, results
//! rows and device cursors), one chunk's work, and one pass over the set through the
//! executor's door; a leaf below `eval_device.rs`, which loads and reports the sets on the
//! trainer.

use crate::error::{GradError, Result};
use crate::memory::ClassGuard;
use crate::memory::in_step;
use crate::metrics::{chunk_stats, global_chunks, stats_len};
use crate::model::Model;
use crate::tape::Tape;
use crate::task::Task;
use crate::trainer::body::StepParts;
use crate::trainer::executor::{Executor, GraphKey, Recording, Request};
use crate::var::Var;
use std::rc::Rc;
use zcompute::{AllocClass, BTensor, Capture, Element, prelude::*};

/// Chunks of one shape: the features they read (`[chunks, len · sample]`), their input
/// (`[len, ..sample]`), where their results go (`[chunks, ..]`: logits or statistics rows)
/// and the device cursor naming the chunk the next run works on (its graph is the
/// executor's, [`GraphKey::EvalChunk`] of its place in the set).
struct ChunkGroup<B: Capture<T>, T: Element> {
    io: ChunkIo<B, T>,
    chunks: usize,
}

/// The tensors one chunk's work reads and writes (clones share them). With `targets` (the
/// chunked targets `[chunks, len · target]` and their input `[len, ..target]`) a chunk
/// writes its statistics row (`metrics::chunk_stats`) into `out`; without, its logits.
struct ChunkIo<B: Ops<T>, T: Element> {
    table: BTensor<B, T>,
    input: BTensor<B, T>,
    targets: Option<(BTensor<B, T>, BTensor<B, T>)>,
    out: BTensor<B, T>,
    cursor: BTensor<B, T>,
}

impl<B: Ops<T>, T: Element> Clone for ChunkIo<B, T> {
    fn clone(&self) -> Self {
        ChunkIo {
            table: self.table.clone(),
            input: self.input.clone(),
            targets: self.targets.clone(),
            out: self.out.clone(),
            cursor: self.cursor.clone(),
        }
    }
}

impl<B: Ops<T>, T: Element> ChunkIo<B, T> {
    /// One chunk: gather row `cursor` (and its targets'), the outputs (checked against the
    /// model's task), their statistics or the outputs themselves scattered into row `cursor`
    /// (advancing it). Legal inside a capture.
    fn run<M: Model<B, T>>(&self, b: &B, model: &M, mode: zcompute::MathMode) -> Result<()> {
        b.gather_row(&self.table, &self.cursor, &self.input)?;
        // The products under the trainer's policy (`Trainer::eval_tape`'s rule).
        let tape = Tape::no_grad(b).with_math_mode(mode);
        let logits = model.logits(&tape, &Var::constant(self.input.clone()))?;
        let len = self.input.shape()[0];
        let task = model.task();
        task.check_output(logits.shape(), len)?;
        let row = match &self.targets {
            Some((table, input)) => {
                b.gather_row(table, &self.cursor, input)?;
                chunk_stats(b, &task, logits.value(), input)?
            }
            None => logits.value().reshape(&[len * task.output_len()])?,
        };
        b.scatter_row(&row, &self.cursor, &self.out, true)?;
        Ok(())
    }
}

/// A set evaluated on the device: the rank's rows of it, the pass's results buffer and its
/// chunk groups. Two ways to report (`metrics::stats_len`): XAsset's unweighted binary
/// task reads back the logits (`[rows]`) and sums against `labels` kept on the host; every
/// other task keeps its targets on the device and reads back a statistics row per chunk
/// (`[all chunks, stats]`: every rank's chunks, this rank's rows written, the others' zero
/// until the rows are all-reduced).
pub(in crate::trainer) struct EvalSet<B: Capture<T>, T: Element> {
    pub(in crate::trainer) labels: Vec<T>,
    /// Samples of the whole set (every rank's).
    pub(in crate::trainer) total: usize,
    /// The ranks it was sharded over (the shard is this rank's of so many).
    pub(in crate::trainer) world: usize,
    results: Option<BTensor<B, T>>,
    groups: Vec<ChunkGroup<B, T>>,
}

/// Where a set's rows come from: this rank's features (`None`: an empty shard) and, for a
/// task reported from statistics, its targets `[rows, ..target]` on the device.
pub(in crate::trainer) struct Rows<B: Ops<T>, T: Element> {
    pub(in crate::trainer) x: Option<BTensor<B, T>>,
    pub(in crate::trainer) targets: Option<BTensor<B, T>>,
}

impl<B: Capture<T>, T: Element> EvalSet<B, T> {
    /// Samples of the whole set (every rank's).
    pub(in crate::trainer) fn total(&self) -> usize {
        self.total
    }

    /// The set of `rows` (`[rows, ..sample]` features on the device, this rank's) with
    /// `labels` (the logits way) in chunks of `chunk`, a shard of `total` samples of rank
    /// `rank` of `world`: its results buffer, inputs and cursors allocated (persistent memory).
    pub(in crate::trainer) fn over(
        b: &B,
        rows: Rows<B, T>,
        labels: Vec<T>,
        (total, rank, world): (usize, usize, usize),
        (chunk, task): (usize, Task),
    ) -> Result<Self> {
        let _class = ClassGuard::new(b, AllocClass::Persistent);
        let chunk = chunk.max(1);
        let stats = stats_len(&task);
        let (_, before, all) = global_chunks(rank, world, total, chunk);
        // Every rank holds the rows of all chunks (zero where others write) for the sum.
        let results = match (stats, &rows.x) {
            (Some(s), _) => Some(b.zeros(&[all.max(1) * s])?),
            (None, Some(x)) => Some(b.zeros(&[x.shape()[0] * task.output_len()])?),
            (None, None) => None,
        };
        let mut set = EvalSet {
            labels,
            total,
            world,
            results,
            groups: Vec::new(),
        };
        let (Some(x), Some(results)) = (rows.x, set.results.clone()) else {
            return Ok(set);
        };
        let (n, sample) = (x.shape()[0], x.shape()[1..].to_vec());
        let per: usize = sample.iter().product();
        let target_shape = task.target_shape();
        let per_target = task.target_len();
        let (full, tail) = (n / chunk, n % chunk);
        for (start, len, chunks) in [(0, chunk, full), (full * chunk, tail, 1)] {
            if chunks == 0 || len == 0 {
                continue;
            }
            let span = chunks * len;
            let first = start / chunk;
            let (targets, out) = match (stats, &rows.targets) {
                (Some(s), Some(t)) => (
                    Some((
                        t.narrow(0, start, span)?
                            .reshape(&[chunks, len * per_target])?,
                        b.zeros(&Task::batched(len, &target_shape))?,
                    )),
                    results
                        .narrow(0, (before + first) * s, chunks * s)?
                        .reshape(&[chunks, s])?,
                ),
                (None, _) => {
                    let o = task.output_len();
                    (
                        None,
                        results
                            .narrow(0, start * o, span * o)?
                            .reshape(&[chunks, len * o])?,
                    )
                }
                (Some(_), None) => {
                    return Err(GradError::BadInput(
                        "an evaluation set of this task needs its targets on the device".into(),
                    ));
                }
            };
            set.groups.push(ChunkGroup {
                io: ChunkIo {
                    table: x.narrow(0, start, span)?.reshape(&[chunks, len * per])?,
                    input: b.zeros(&Task::batched(len, &sample))?,
                    targets,
                    out,
                    cursor: b.zeros(&[1])?,
                },
                chunks,
            });
        }
        Ok(set)
    }
}

/// One pass over `set`: every group's cursor reset, its chunks run through `exec`'s door
/// (replayed, captured or eager; every chunk eagerly without `exec`), the results read back
/// (statistics rows: summed over the ranks first, on the device).
pub(in crate::trainer) fn eval_pass<B: Capture<T> + 'static, T: Element, M: Model<B, T>>(
    b: &Rc<B>,
    parts: &StepParts<B, T, M>,
    mut exec: Option<&mut Executor<B, T>>,
    set: &mut EvalSet<B, T>,
) -> Result<Vec<T>> {
    let Some(results) = set.results.clone() else {
        return Ok(Vec::new());
    };
    let stats = stats_len(&parts.model.task()).is_some();
    if stats {
        // The other ranks' rows are summed in: zero here.
        b.fill(&results, T::ZERO)?;
    }
    for (n, group) in set.groups.iter().enumerate() {
        b.fill(&group.io.cursor, T::ZERO)?;
        for _ in 0..group.chunks {
            in_step(&**b, || match exec.as_deref_mut() {
                Some(exec) => eval_chunk(b, parts, exec, n, group),
                None => group.io.run(&**b, &parts.model, parts.math_mode),
            })?;
        }
    }
    if stats && !parts.dist.single() {
        let dist = &parts.dist;
        dist.reduce(&**b, &results)?;
        dist.comm.synchronize(&**b)?;
    }
    Ok(b.download(&results)?)
}

/// Runs group `n`'s next chunk through the executor's door: its graph replayed, captured
/// (capture on and none yet; the capture's one real run does the chunk), or the body eagerly
/// (also after a failed capture that did nothing).
fn eval_chunk<B: Capture<T> + 'static, T: Element, M: Model<B, T>>(
    b: &Rc<B>,
    parts: &StepParts<B, T, M>,
    exec: &mut Executor<B, T>,
    n: usize,
    group: &ChunkGroup<B, T>,
) -> Result<()> {
    let req = Request::new(
        GraphKey::EvalChunk(n),
        group.io.input.shape(),
        "evaluation chunk",
        None,
    );
    exec.run(
        &**b,
        &mut (),
        req,
        |_, _| Ok(()),
        |_, _| {
            let (b, model, io) = (Rc::clone(b), parts.model.clone(), group.io.clone());
            let mode = parts.math_mode;
            Ok(Recording {
                body: Box::new(move || io.run(&*b, &model, mode)),
                inputs: None,
            })
        },
        |_, _, _| group.io.run(&**b, &parts.model, parts.math_mode),
    )
    .map(|_| ())
    .map_err(|e| e.into_error())
}
