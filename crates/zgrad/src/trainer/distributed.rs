//! Data parallelism: the trainer's collective and what the schedules do with it.
//!
//! Every rank holds the same parameters (broadcast from rank 0 when the collective is set) and
//! takes a disjoint contiguous shard of every global batch (`shard`; sizes differ by at most
//! one, a rank may get none and still joins with zero gradients). Each rank scales its loss by
//! its share of the global batch (local / global), so the all-reduce SUM of the gradients is
//! the gradient of the global mean loss, exactly for unequal shards; the loss is all-reduced
//! the same way. Norm, clipping and the finiteness checks then see global values, identical on
//! every rank, so a non-finite value anywhere stops every rank with the same error.
//!
//! With one rank ([`zcomm::SingleProcess`], the default) none of this runs: the single-process
//! step is the one it always was.
//!
//! One collective carries a step's gradients and its loss: the scaled loss is written into the
//! loss slot after the flat gradient buffer before backward (the per-sample step: the sum of
//! its samples' losses, after the last one), summed with the gradients and read in place after
//! the sum (the norm, clipping and AdamW never read the slot: `ParameterSet::loss_slot`). By
//! default ([`GradSync::Overlapped`]) a batched step's buffer is
//! all-reduced in buckets, tapering toward the buffer's start (what backward finishes last),
//! on a second stream while backward goes on (`crate::grad_sync`);
//! [`GradSync::AfterBackward`] is one all-reduce after backward on the engine stream, as the
//! per-sample step always does (after its last sample).

mod rank;

pub use crate::grad_sync::{DEFAULT_BUCKET_BYTES, GradSync};

use crate::error::Result;
use crate::grad_sync::{BucketCursor, BucketPlan};
use crate::memory::ClassGuard;
use crate::optim::ParameterSet;
use crate::tape::Tape;
use crate::var::Var;
use std::cell::Cell;
use std::ops::Range;
use std::rc::Rc;
use zcomm::{Collective, RankInfo, SingleProcess};
use zcompute::{AllocClass, BTensor, Element, prelude::*};

/// The collective and the per-step values the step bodies read (cloning shares them).
pub(crate) struct Dist<B: Ops<T>, T: Element> {
    pub comm: Rc<dyn Collective<B, T>>,
    /// Persistent rank-0 tensor: this rank's share of the global batch (local / global),
    /// written before every step (a captured step reads it on every replay).
    pub share: BTensor<B, T>,
    /// Rows of this rank's shard in the current step (0: joins with zero gradients).
    pub local: Rc<Cell<usize>>,
    /// Rows of the current step's global batch.
    pub global: Rc<Cell<usize>>,
    /// The optimiser step under way, for the collectives' errors.
    pub step: Rc<Cell<u64>>,
    /// How the batched step sums the gradients (read when a step body runs or is captured).
    pub sync: GradSync,
    /// The `(local, global)` the share tensor holds (it is uploaded only when they change).
    pub uploaded: Rc<Cell<Option<(usize, usize)>>>,
    /// The flat buffer's length and last bucket the collective was asked to fuse with the norm
    /// (`Collective::prepare_last_and_norm`), and its answer.
    pub tail: Rc<Cell<Option<(usize, usize, bool)>>>,
}

impl<B: Ops<T>, T: Element> Clone for Dist<B, T> {
    fn clone(&self) -> Self {
        Dist {
            comm: Rc::clone(&self.comm),
            share: self.share.clone(),
            local: Rc::clone(&self.local),
            global: Rc::clone(&self.global),
            step: Rc::clone(&self.step),
            sync: self.sync,
            uploaded: Rc::clone(&self.uploaded),
            tail: Rc::clone(&self.tail),
        }
    }
}

impl<B: Ops<T>, T: Element> Dist<B, T> {
    /// A single process's: `SingleProcess`, the share tensor persistent.
    pub(crate) fn single_process(b: &B) -> Result<Self> {
        let _class = ClassGuard::new(b, AllocClass::Persistent);
        Ok(Dist {
            comm: Rc::new(SingleProcess),
            share: b.zeros(&[])?,
            local: Rc::default(),
            global: Rc::default(),
            step: Rc::default(),
            sync: GradSync::default(),
            uploaded: Rc::default(),
            tail: Rc::default(),
        })
    }

    pub(crate) fn info(&self) -> RankInfo {
        self.comm.info()
    }

    /// Whether this is a job of one rank (nothing to exchange).
    pub(crate) fn single(&self) -> bool {
        self.comm.info().world <= 1
    }

    /// Sums every rank's gradients into every rank's: THE one place gradients are
    /// all-reduced. Parameters that are views of one flat buffer (every model `XAsset` makes)
    /// take one collective over the flat gradient buffer (its zero padding sums to zero);
    /// others one collective per parameter, in order.
    pub(crate) fn reduce_grads(&self, b: &B, params: &[Var<B, T>]) -> Result<()> {
        if self.single() {
            return Ok(());
        }
        if let Some(set) = ParameterSet::of(params) {
            return Ok(self.comm.all_reduce_sum(b, set.grads(), self.step.get())?);
        }
        for g in params.iter().filter_map(Var::grad) {
            self.comm.all_reduce_sum(b, g, self.step.get())?;
        }
        Ok(())
    }

    /// Sums a small tensor (a loss, a count) over the ranks.
    pub(crate) fn reduce(&self, b: &B, x: &BTensor<B, T>) -> Result<()> {
        if self.single() {
            return Ok(());
        }
        Ok(self.comm.all_reduce_sum(b, x, self.step.get())?)
    }

    /// Before a step on a global batch of `global` rows with `local` of them here: the share
    /// and the step number, read by eager and captured bodies alike; and, once for the flat
    /// buffer of `batched` (a batched step's parameters; `None` for the per-sample step, whose
    /// sum is one all-reduce after its last sample), the collective's fused tail (the last
    /// bucket and the norm in one launch) asked for when the gradients go in buckets.
    pub(crate) fn prepare(
        &self,
        b: &B,
        batched: Option<&[Var<B, T>]>,
        local: usize,
        global: usize,
        step: u64,
    ) -> Result<()> {
        if let Some(params) = batched {
            self.prepare_tail(b, params, step)?;
        }
        self.local.set(local);
        self.global.set(global);
        self.step.set(step);
        self.comm.set_step(step);
        if !self.single() && self.uploaded.get() != Some((local, global)) {
            self.uploaded.set(None);
            b.upload_into(&[T::from_f64(local as f64 / global as f64)], &self.share)?;
            self.uploaded.set(Some((local, global)));
        }
        Ok(())
    }

    /// Asks the collective, once per flat layout, to fuse the last bucket's all-reduce with
    /// the norm (`Collective::prepare_last_and_norm`: every rank asks at the same step, with
    /// the same sizes). Only for bucketed sums whose last bucket holds gradients alone (the
    /// loss slot goes with the first one).
    fn prepare_tail(&self, b: &B, params: &[Var<B, T>], step: u64) -> Result<()> {
        // Asked once: a trainer's parameters keep their buffer, and a new `GradSync` forgets
        // the answer (`with_grad_sync`). Every step comes here, so the steps after the first
        // pay nothing (no layout walk, no plan).
        if self.single() || self.tail.get().is_some() {
            return Ok(());
        }
        let Some(set) = ParameterSet::of(params) else {
            self.tail.set(Some((0, 0, false)));
            return Ok(());
        };
        let Some(last) = self.fusable_last(&set) else {
            self.tail.set(Some((set.len(), 0, false)));
            return Ok(());
        };
        let on = self.comm.prepare_last_and_norm(b, set.len(), last, step)?;
        self.tail.set(Some((set.len(), last, on)));
        Ok(())
    }

    /// The elements of the last bucket of `set` when the gradients go in buckets and that
    /// bucket could be fused with the norm: more than one bucket, the last one the buffer's
    /// start, gradients only.
    fn fusable_last(&self, set: &ParameterSet<B, T>) -> Option<usize> {
        match self.bucket_plan(set)?.ranges() {
            [_, .., last] if last.start == 0 && last.end <= set.len() => Some(last.end),
            _ => None,
        }
    }

    /// The buckets `self.sync` cuts `set`'s gradients and loss slot into (`None`: one
    /// all-reduce after backward).
    fn bucket_plan(&self, set: &ParameterSet<B, T>) -> Option<BucketPlan> {
        let (sizing, bucket_bytes) = self.sync.buckets()?;
        let elems = (bucket_bytes / std::mem::size_of::<T>()).max(1);
        Some(BucketPlan::new(set.offsets(), set.len() + 1, elems, sizing))
    }

    /// Backward from `root` (an empty shard has none) seeded by the share, and the all-reduce
    /// of `set`'s gradients and loss slot (`ParameterSet::reduced`) as `self.sync` says: after
    /// it, or in buckets during it. The last bucket goes on the engine stream after the join:
    /// nothing overlaps it anyway (backward has finished), and there it starts right after
    /// backward's last kernel and the norm right after it, where a second stream would put
    /// a hop between streams before it and another after it.
    fn backward_and_reduce(
        &self,
        b: &B,
        set: &ParameterSet<B, T>,
        tape: &Tape<'_, B, T>,
        root: Option<&Var<B, T>>,
    ) -> Result<Option<BTensor<B, T>>> {
        let reduced = set.reduced()?;
        // d(loss * share)/d loss = share: the share is backward's seed (as `forward_backward`).
        let Some(plan) = self.bucket_plan(set) else {
            if let Some(root) = root {
                tape.backward_with(root, self.share.clone())?;
            }
            self.comm.all_reduce_sum(b, &reduced, self.step.get())?;
            return Ok(None);
        };
        // The last bucket and the norm in one launch, where the ranks agreed on it.
        let fused = match self.tail.get() {
            Some((len, last, true)) if len == set.len() => Some(last),
            _ => None,
        };
        let norm = std::cell::RefCell::new(None);
        let last = plan.ranges().len().saturating_sub(1);
        let mut cursor = BucketCursor::new(&plan);
        let grads = set.grads();
        // Whether the second stream holds buckets not joined yet. A join waits for them: with
        // none queued (one bucket) there is nothing to join, and inside a capture a wait on a
        // stream outside it is refused.
        let unjoined = Cell::new(false);
        let issue = |ready: Range<usize>| -> Result<()> {
            for k in ready {
                let r = &plan.ranges()[k];
                let bucket = reduced.narrow(0, r.start, r.len())?;
                if k == last {
                    if unjoined.replace(false) {
                        self.comm.join_overlapped(b)?;
                    }
                    let step = self.step.get();
                    let tail = match fused {
                        Some(n) if r.start == 0 && r.end == n => self
                            .comm
                            .all_reduce_last_and_norm(b, set.grads(), n, step)?,
                        _ => None,
                    };
                    match tail {
                        Some(t) => *norm.borrow_mut() = Some(t),
                        None => self.comm.all_reduce_sum(b, &bucket, step)?,
                    }
                } else {
                    unjoined.set(true);
                    self.comm
                        .all_reduce_sum_overlapped(b, &bucket, self.step.get())?;
                }
            }
            Ok(())
        };
        let issued = (|| {
            if let Some(root) = root {
                tape.backward_hooked(root, self.share.clone(), &mut |g| {
                    if g.shares_storage(grads) {
                        issue(cursor.finish(g.layout().offset()))?;
                    }
                    Ok(())
                })?;
            }
            issue(cursor.rest())
        })()
        .map(|()| norm.take());
        if issued.is_err() && unjoined.get() {
            // A step that fails between its buckets still leaves no collective on the second
            // stream unordered with the engine stream: the next work on the communicator (an
            // eager step, or a captured one, which NCCL does not order by itself here, since
            // zcomm's launcher turns its graph ordering off) comes after it. Best effort: the
            // step's own error is the one to report.
            if let Err(e) = self.comm.join_overlapped(b) {
                tracing::warn!(target: "zgrad.distributed.join", error = %e, "joining the overlapped all-reduces of a failed step");
            }
        }
        issued
    }
}

/// The gradients' global norm when the collective took it with the last bucket.
pub(crate) type NormIfTaken<B, T> = Option<BTensor<B, T>>;
