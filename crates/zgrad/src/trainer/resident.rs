//! The captured steps as a benchmark (or a loop whose data already lives on the device) sees
//! them: the graphs themselves (for their node counts), and one optimiser step replayed on
//! the batch already on the device, with hooks just before and after the replay is queued so
//! that CUDA events enclose exactly the graph's work (as PyTorch's `g.replay()` is timed).

use super::executor::GraphKey;
use super::gated::GatedRows;
use super::source::ReplayMark;
use super::{StepReport, Trainer};
use crate::error::{GradError, Result};
use crate::model::Model;
use zcompute::{Capture, Element};

impl<B: Capture<T> + 'static, T: Element, M: Model<B, T>> Trainer<B, T, M> {
    /// `step` from the held batch (`StepSource::held`): the captured batched step replayed
    /// on the static inputs as the last step filled them, the stats read back and the step
    /// counted as for any step, with the same errors (`NonFinite` names the sample, read from
    /// the device's copy of the batch). Errors come back settled for step `step`.
    pub(super) fn replay_held(
        &mut self,
        step: u64,
        mark: Box<dyn FnMut(ReplayMark) + '_>,
    ) -> Result<StepReport> {
        self.replay_held_inner(step, mark)
            .map_err(|e| self.settle(step, e))
    }

    fn replay_held_inner(
        &mut self,
        step: u64,
        mut mark: Box<dyn FnMut(ReplayMark) + '_>,
    ) -> Result<StepReport> {
        self.optim.check_state()?;
        let lr = self.config.lr_schedule.lr_at(self.config.lr, step);
        let Some((_, shape)) = self.exec.inputs(GraphKey::Batched) else {
            return Err(GradError::BadInput(
                "a step from the held batch: no captured batched step yet (a host or pinned step with capture on captures it)"
                    .into(),
            ));
        };
        let shape = shape.to_vec();
        // A non-finite step: the gate skipped the update; the sample is looked for on the
        // host copy of the device's batch.
        let held = (
            GatedRows::Held,
            Some(&mut *mark as &mut dyn FnMut(ReplayMark)),
        );
        self.batched_step(held, &shape, lr, |t, k| {
            let Some((i, _)) = t.exec.inputs(GraphKey::Batched) else {
                return Ok(None);
            };
            let (x, y) = (i.x.to_vec(&t.backend)?, i.y.to_vec(&t.backend)?);
            t.find_sample(&x, &y, &shape, k)
        })
    }
}
