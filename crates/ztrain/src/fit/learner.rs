//! The run loop's one door into zgrad's `Trainer`: every call the loop makes into it (make,
//! join a job, queue and read back steps, evaluate, the optimiser for checkpoints) is a method
//! here, so a change of the trainer's surface is met in this file alone.

use std::rc::Rc;

use zcomm::Collective;
use zgrad::{
    ChunkedEval, EvalReport, EvalSource, GradSync, HostPhases, Load, Model, Optimizer,
    OptimizerState, PinnedBatch, StepReport, StepSource, Trainer, TrainerConfig,
};

use crate::step::TrainBackend;

/// zgrad's trainer of a model `M` on `B`, as the run loop drives it.
pub struct Learner<B: TrainBackend, M: Model<B, f32>> {
    trainer: Trainer<B, f32, M>,
    /// The trainer's host phase sums at the last `take_host_phases`.
    phases_taken: HostPhases,
}

impl<B: TrainBackend, M: Model<B, f32>> std::fmt::Debug for Learner<B, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Learner")
            .field("trainer", &self.trainer)
            .finish()
    }
}

impl<B: TrainBackend, M: Model<B, f32>> Learner<B, M> {
    /// A trainer of `model` on `b` (zgrad's checks of the model and the configuration).
    pub fn new(b: &B, model: M, config: TrainerConfig) -> zgrad::Result<Self> {
        Ok(Learner {
            trainer: Trainer::new(b.clone(), model, config)?,
            phases_taken: HostPhases::default(),
        })
    }

    /// The same trainer as a rank of `comm`'s job, its gradients synchronised as `sync` says
    /// (every rank starts from rank 0's parameters).
    pub fn join(self, comm: Rc<dyn Collective<B, f32>>, sync: GradSync) -> zgrad::Result<Self> {
        Ok(Learner {
            trainer: self.trainer.with_collective(comm)?.with_grad_sync(sync)?,
            phases_taken: self.phases_taken,
        })
    }

    #[must_use]
    pub fn backend(&self) -> &B {
        self.trainer.backend()
    }

    #[must_use]
    pub fn model(&self) -> &M {
        self.trainer.model()
    }

    #[must_use]
    pub fn config(&self) -> &TrainerConfig {
        self.trainer.config()
    }

    /// Ranks of the job (1: a process of its own).
    #[must_use]
    pub fn world(&self) -> usize {
        self.trainer.status().rank.world
    }

    /// This process's rank in its job (0: a process of its own).
    #[must_use]
    pub fn rank(&self) -> usize {
        self.trainer.status().rank.rank
    }

    /// Optimiser steps taken so far.
    #[must_use]
    pub fn steps(&self) -> u64 {
        self.trainer.status().step
    }

    #[must_use]
    pub fn optimizer(&self) -> &Optimizer<B, f32> {
        self.trainer.optimizer()
    }

    /// Restores a checkpoint: the parameters' `values` (in `Model::named_parameters`'
    /// order) and the optimiser's `state`.
    pub fn restore(
        &mut self,
        values: &[Vec<f32>],
        state: &OptimizerState<f32>,
    ) -> zgrad::Result<()> {
        self.trainer.restore(values, state)
    }

    /// Host time of each phase of the queued steps since the last call.
    pub fn take_host_phases(&mut self) -> HostPhases {
        let now = self.trainer.status().host_phases;
        now.since(&std::mem::replace(&mut self.phases_taken, now))
    }

    /// Puts the training set on the device (`n` samples).
    pub fn load_training(&mut self, x: &[f32], y: &[f32], n: usize) -> zgrad::Result<()> {
        self.trainer.load(Load::Training { x, y, n })
    }

    /// The rows the next steps on the device take, in steps of `batch`.
    pub fn plan_rows(&mut self, order: &[usize], batch: usize) -> zgrad::Result<()> {
        self.trainer.load(Load::Order { order, batch })
    }

    /// One step on rows of the training set on the device, read back every `every` steps.
    pub fn queue_rows(&mut self, rows: &[usize], every: usize) -> zgrad::Result<Vec<StepReport>> {
        self.trainer.queue(StepSource::loaded(rows), every)
    }

    /// One step on the first `n` samples of a pinned batch, read back every `every` steps.
    pub fn queue_pinned(
        &mut self,
        batch: &PinnedBatch<B>,
        n: usize,
        every: usize,
    ) -> zgrad::Result<Vec<StepReport>> {
        self.trainer.queue(StepSource::pinned(batch, n), every)
    }

    /// Reads back every step queued and not read back yet.
    pub fn drain(&mut self) -> zgrad::Result<Vec<StepReport>> {
        self.trainer.drain()
    }

    /// Steps queued in the read-back window being filled (0: none).
    #[must_use]
    pub fn filling(&self) -> usize {
        self.trainer.status().filling
    }

    /// Puts the validation set on the device (`n` samples).
    pub fn load_validation(&mut self, x: &[f32], y: &[f32], n: usize) -> zgrad::Result<()> {
        self.trainer.load(Load::Validation { x, y, n })
    }

    /// Whether the validation set is on the device.
    #[must_use]
    pub fn validation_on_device(&self) -> bool {
        self.trainer.status().validation_rows.is_some()
    }

    /// The model's loss and metrics over the validation set on the device.
    pub fn evaluate_validation(&mut self) -> zgrad::Result<EvalReport> {
        self.trainer.evaluate(EvalSource::Validation)
    }

    /// The model's loss and metrics over the training set on the device.
    pub fn evaluate_loaded(&mut self) -> zgrad::Result<EvalReport> {
        self.trainer.evaluate(EvalSource::Loaded)
    }

    /// The model's loss and metrics over samples on the host.
    pub fn evaluate(&mut self, x: &[f32], y: &[f32]) -> zgrad::Result<EvalReport> {
        self.trainer.evaluate(EvalSource::Host(x, y))
    }

    /// Starts the model's evaluation of a set of `total` samples that the loop gives a chunk
    /// at a time (this rank's shard of them: `ChunkedEval::next_chunk`).
    pub fn chunked_evaluation(&self, total: usize) -> zgrad::Result<ChunkedEval<f32>> {
        ChunkedEval::new(&self.trainer, total)
    }

    /// Evaluates the next chunk of `eval` (its samples' inputs `x` and targets `y`).
    pub fn evaluate_chunk(
        &self,
        eval: &mut ChunkedEval<f32>,
        x: &[f32],
        y: &[f32],
    ) -> zgrad::Result<()> {
        eval.add(&self.trainer, x, y)
    }

    /// The loss and metrics of `eval`'s set once every chunk is given (`evaluate`'s of the
    /// set, bit for bit; every rank of a job calls it).
    pub fn finish_evaluation(&self, eval: ChunkedEval<f32>) -> zgrad::Result<EvalReport> {
        eval.finish(&self.trainer)
    }

    /// The outputs of `n` samples on the host.
    pub fn predict(&self, x: &[f32], n: usize) -> zgrad::Result<Vec<f32>> {
        self.trainer.predict(x, n)
    }

    /// Gives the job's collective up after an error (before the trainer is dropped).
    pub fn give_up(&self, why: &str) {
        self.trainer.give_up(why);
    }
}
