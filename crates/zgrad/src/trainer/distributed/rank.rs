//! This rank's side of data parallelism: the step bodies' shard forward and backward and the
//! per-sample loss reduction (on `StepParts`), and the trainer's rank-level calls (joining a
//! collective, the gradient sync, the sharded evaluation's all-reduces, the errors every rank
//! reports alike). The collective and what it reduces are `distributed.rs`'s (`Dist`).

use super::super::Trainer;
use super::super::body::StepParts;
use super::{GradSync, NormIfTaken};
use crate::error::{GradError, Result};
use crate::metrics::EvalReport;
use crate::model::Model;
use crate::optim::ParameterSet;
use crate::shard;
use crate::var::Var;
use std::rc::Rc;
use zcomm::Collective;
use zcompute::{BTensor, BinaryOp, Capture, Element, prelude::*};

impl<B: Ops<T>, T: Element, M: Model<B, T>> StepParts<B, T, M> {
    /// This rank's forward and backward with the loss scaled by its share of the global batch
    /// (none for an empty shard: zero gradients, zero loss), then the gradients and the scaled
    /// loss summed over the ranks. Returns the global mean loss (rank 0 tensor): a view of the
    /// loss slot, valid until the next step writes it; and the gradients' global norm when the
    /// collective took it with the last bucket (`Collective::all_reduce_last_and_norm`).
    pub(crate) fn shard_forward_backward(
        &self,
        b: &B,
        x: &Var<B, T>,
        y: &Var<B, T>,
    ) -> Result<(BTensor<B, T>, NormIfTaken<B, T>)> {
        let d = &self.dist;
        let empty = x.value().shape().first() == Some(&0);
        let Some(set) = ParameterSet::of(&self.params) else {
            // Parameters of no flat buffer: one collective per gradient, then the loss.
            let loss = if empty {
                b.zeros(&[])?
            } else {
                let local = self.forward_backward(b, x, y, Some(&d.share))?;
                b.mul(&local, &d.share)?
            };
            d.reduce_grads(b, &self.params)?;
            d.reduce(b, &loss)?;
            return Ok((loss, None));
        };
        let slot = set.loss_slot()?;
        let tape = self.tape(b);
        let forward = if empty {
            None
        } else {
            Some(self.model.loss(&tape, x, y)?.0)
        };
        // Before backward: the first bucket to go (the buffer's end) holds the slot. The
        // product goes straight into it (one launch).
        let loss = slot.reshape(&[])?;
        match &forward {
            Some(local) => b.binary_into(BinaryOp::Mul, local.value(), &d.share, &loss)?,
            None => b.fill(&loss, T::ZERO)?,
        }
        let norm = d.backward_and_reduce(b, &set, &tape, forward.as_ref())?;
        Ok((loss, norm))
    }

    /// The per-sample step's sum over the ranks, after its last sample: this rank's
    /// `sum(losses) * scale` (`scale` = 1/global; 0 for an empty shard) written into the
    /// loss slot after the flat gradient buffer, the buffer and the slot all-reduced once.
    /// Without a flat buffer, the gradients and the loss are summed by collectives of their
    /// own. Returns the global mean loss (rank 0, on the device: nothing is read back), a view
    /// of the loss slot when there is one.
    pub(crate) fn reduce_samples(
        &self,
        b: &B,
        losses: &BTensor<B, T>,
        scale: &BTensor<B, T>,
    ) -> Result<BTensor<B, T>> {
        let d = &self.dist;
        let Some(set) = ParameterSet::of(&self.params) else {
            let scaled = if losses.numel() == 0 {
                b.zeros(&[])?
            } else {
                b.mul(&b.sum(losses, 0, false)?, scale)?
            };
            d.reduce_grads(b, &self.params)?;
            d.reduce(b, &scaled)?;
            return Ok(scaled);
        };
        let loss = set.loss_slot()?.reshape(&[])?;
        if losses.numel() == 0 {
            b.fill(&loss, T::ZERO)?;
        } else {
            b.binary_into(BinaryOp::Mul, &b.sum(losses, 0, false)?, scale, &loss)?;
        }
        d.comm.all_reduce_sum(b, &set.reduced()?, d.step.get())?;
        Ok(loss)
    }
}

impl<B: Capture<T> + 'static, T: Element, M: Model<B, T>> Trainer<B, T, M> {
    /// Makes this trainer one rank of a data-parallel job over `comm`: rank 0's parameters
    /// are broadcast to every rank (so all start equal), then every a host `step` takes this
    /// rank's shard of the global batch it is given and all-reduces the gradients. Set it
    /// before training (and after loading a checkpoint on every rank, if resuming).
    pub fn with_collective(mut self, comm: Rc<dyn Collective<B, T>>) -> Result<Self> {
        let b = Rc::clone(&self.backend);
        // One collective over the flat parameter buffer when the parameters are views of one.
        match ParameterSet::of(&self.parts.params) {
            Some(set) => comm.broadcast(&*b, set.values(), 0, self.optim.step_count())?,
            None => {
                for p in &self.parts.params {
                    comm.broadcast(&*b, p.value(), 0, self.optim.step_count())?;
                }
            }
        }
        for p in &self.parts.params {
            p.bump_version();
        }
        comm.synchronize(&*b)?;
        tracing::debug!(target: "zgrad.trainer.dist", rank = comm.info().rank, world = comm.info().world, "parameters broadcast from rank 0");
        self.parts.dist.comm = comm;
        Ok(self)
    }

    /// How the batched step sums the gradients over the ranks: by default
    /// [`GradSync::Overlapped`] with [`DEFAULT_BUCKET_BYTES`](super::DEFAULT_BUCKET_BYTES).
    /// Set it before the first step (a captured step keeps the way it was captured with).
    /// Refuses a bucket of 0 bytes (`BadInput`).
    pub fn with_grad_sync(mut self, sync: GradSync) -> Result<Self> {
        if matches!(sync.buckets(), Some((_, 0))) {
            return Err(GradError::BadInput(
                "a gradient bucket of 0 bytes (give at least one byte, or sum after backward)"
                    .into(),
            ));
        }
        self.parts.dist.sync = sync;
        // The fused tail was asked for the old plan's last bucket: ask again at the next step.
        self.parts.dist.tail.set(None);
        Ok(self)
    }

    /// The parameters a batched step may fuse its last bucket for (`Dist::prepare`); `None`
    /// under the per-sample schedule.
    pub(in crate::trainer) fn batched_params(&self) -> Option<&[Var<B, T>]> {
        (self.config.schedule == super::super::TrainSchedule::Batched)
            .then_some(&self.parts.params[..])
    }

    /// The error to report for a failed step: a collective's own failure (a peer stalled,
    /// gave up or vanished) rather than the device error it caused; and the other ranks are
    /// told this one gives up, so they stop at their next collective.
    pub(in crate::trainer) fn distributed_error(&self, e: GradError) -> GradError {
        let dist = &self.parts.dist;
        if dist.single() {
            return e;
        }
        if let Some(c) = dist.comm.take_failure() {
            // Aborted here too: over NCCL a collective whose peer stopped waits on the device
            // until its communicator is aborted, and the simulator's as well (issue 44); a
            // failure that did not abort would leave the teardown waiting behind it.
            dist.comm.abort(&c.to_string());
            return match e {
                GradError::Step { step, applied, .. } => GradError::Step {
                    step,
                    applied,
                    source: Box::new(GradError::from(c)),
                },
                _ => GradError::from(c),
            };
        }
        // A collective's error too (a wait past its deadline did not always abort): aborting
        // is idempotent. A non-finite step is every rank's alike; they stop together.
        if !matches!(e.cause(), GradError::NonFinite { .. }) {
            dist.comm.abort(&e.to_string());
        }
        e
    }

    /// Gives up the job's collective, if any (idempotent): the communicator is aborted, so
    /// work of it that waits on the device for a peer ends and the device's stream is not
    /// waited for again; the peers stop at their next collective. The caller does this when
    /// it stops on an error outside a step (evaluation, a checkpoint, an agreement), before
    /// the trainer is dropped, so the teardown does not wait behind a collective whose peer
    /// stopped (issue 44). A single process has nothing to give up.
    pub fn give_up(&self, why: &str) {
        let dist = &self.parts.dist;
        if !dist.single() {
            dist.comm.abort(why);
        }
    }

    /// The unweighted binary evaluation (XAsset's) sharded over the ranks (the logits way,
    /// `metrics::stats_len`; other tasks sum their chunks' statistics,
    /// `evaluate_by_stats`): each evaluates its shard, the sums are all-reduced.
    pub(in crate::trainer) fn evaluate_sharded(&self, x: &[T], y: &[T]) -> Result<EvalReport> {
        let n = y.len();
        let info = self.parts.dist.info();
        let rows = shard(info.rank, info.world, n);
        let per = x.len().checked_div(n).unwrap_or(0);
        let logits = if rows.is_empty() {
            Vec::new()
        } else {
            self.predict(&x[rows.start * per..rows.end * per], rows.len())?
        };
        self.all_reduce_report(&logits, &y[rows], n)
    }

    /// `evaluate`'s binary report in data parallel: this rank's loss and correct count over its
    /// `logits` against `labels`, summed in sample order in `f64`, all-reduced over the ranks
    /// and divided by the set's `total` samples (the host and the device evaluation alike).
    pub(in crate::trainer) fn all_reduce_report(
        &self,
        logits: &[T],
        labels: &[T],
        total: usize,
    ) -> Result<EvalReport> {
        let mut sums = crate::metrics::BinarySums::default();
        sums.add(logits, labels);
        self.all_reduce_binary(&sums, total)
    }

    /// The binary report of a set of `total` samples from this rank's sums over its shard
    /// (`all_reduce_report`), all-reduced over the ranks.
    pub(in crate::trainer) fn all_reduce_binary(
        &self,
        sums: &crate::metrics::BinarySums,
        total: usize,
    ) -> Result<EvalReport> {
        let dist = &self.parts.dist;
        let (loss, correct) = (sums.loss, sums.correct as f64);
        let b = &*self.backend;
        let sums = b.upload(&[T::from_f64(loss), T::from_f64(correct)], &[2])?;
        dist.comm
            .all_reduce_sum(b, &sums, self.optim.step_count())?;
        dist.comm.synchronize(b)?;
        let s = b.download(&sums)?;
        let denom = total.max(1) as f64;
        Ok(EvalReport {
            loss: s[0].to_f64() / denom,
            accuracy: s[1].to_f64() / denom,
            samples: total,
            regression: None,
        })
    }
}
