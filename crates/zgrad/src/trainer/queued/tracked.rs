//! The queued step's body (gather, step, gate, history row, gated update), through the
//! executor's door (`executor.rs`): replayed when a graph of its shape exists, captured when
//! capture is on and none exists yet, else eagerly.

use super::super::body::StepParts;
use super::super::executor::{GraphKey, Recording, Request, StaticInputs};
use super::super::{Trainer, in_step_split};
use super::{Queued, Rows, Track, no_data};
use crate::error::{Applied, Result};
use crate::memory::ClassGuard;
use crate::model::Model;
use crate::optim::{Optimizer, OptimizerTensors};
use crate::var::Var;
use std::cell::Cell;
use std::rc::Rc;
use zcompute::{AllocClass, BTensor, Capture, Element, prelude::*};

/// What a queued step gathers: the resident features and labels by the indices in the
/// window's step table, and its `[lr, t]` there into the optimiser's slot.
pub(super) struct Gather<B: Ops<T>, T: Element> {
    xs: BTensor<B, T>,
    ys: BTensor<B, T>,
    table: BTensor<B, T>,
    lr_t: BTensor<B, T>,
}

impl<B: Ops<T>, T: Element> Clone for Gather<B, T> {
    fn clone(&self) -> Self {
        Gather {
            xs: self.xs.clone(),
            ys: self.ys.clone(),
            table: self.table.clone(),
            lr_t: self.lr_t.clone(),
        }
    }
}

impl<B: Ops<T>, T: Element, M: Model<B, T>> StepParts<B, T, M> {
    /// The queued step's body: the step's rows gathered into `x` and `y`, `batched`, the gate
    /// (folded into the sticky one), the stats into the history, the gated update. Every call
    /// is legal inside a capture.
    #[allow(clippy::too_many_arguments)]
    fn tracked(
        &self,
        b: &B,
        data: Option<&Gather<B, T>>,
        x: &Var<B, T>,
        y: &Var<B, T>,
        optim: &OptimizerTensors<B, T>,
        track: &Track<B, T>,
        started: &Cell<bool>,
    ) -> Result<()> {
        if let Some(data) = data {
            // The step's row of the table (indices, lr, t), picked by the history cursor the
            // tail advances: the host uploads nothing for a planned step.
            let (table, cursor) = (&data.table, &track.cursor);
            b.gather_rows_at_cursor(&data.xs, table, cursor, x.value(), Some(&data.lr_t))?;
            b.gather_rows_at_cursor(&data.ys, table, cursor, y.value(), None)?;
            x.bump_version();
            y.bump_version();
        }
        let (loss, norm) = self.loss_and_norm(b, x, y)?;
        // The stats, the gate, the sticky gate and the history row in one launch on the device.
        track.record_step(b, optim, [&loss, &norm], &self.stats)?;
        started.set(true);
        optim.apply(b, &self.params)
    }
}

impl<B: Capture<T> + 'static, T: Element, M: Model<B, T>> Trainer<B, T, M> {
    /// What a step on rows of the device data set gathers from (none for other rows).
    fn gather_of(&self, from: Rows<'_, B, T>) -> Result<Option<Gather<B, T>>> {
        if let Rows::Pinned(_) = from {
            return Ok(None);
        }
        let data = self.data.as_ref().ok_or_else(no_data)?;
        let views = data.steps.as_ref().ok_or_else(no_data)?.views()?;
        Ok(Some(Gather {
            xs: data.x.clone(),
            ys: data.y.clone(),
            table: views.table,
            lr_t: views.lr_t,
        }))
    }

    /// The optimiser's tensors for a step on rows `from`: rows of the device data set read
    /// `[lr, t, gate]` from the step table's slot (`step_table.rs`).
    fn optim_for(&self, from: Rows<'_, B, T>) -> Result<OptimizerTensors<B, T>> {
        let optim = self.optim.tensors();
        match from {
            Rows::Pinned(_) => Ok(optim),
            Rows::Device => {
                let data = self.data.as_ref().ok_or_else(no_data)?;
                let views = data.steps.as_ref().ok_or_else(no_data)?.views()?;
                Ok(optim.with_slot(views.slot))
            }
        }
    }

    /// Queues the step's body through the executor's door: replayed when a graph of this
    /// shape exists, captured when capture is on and none exists yet, else run eagerly.
    pub(super) fn queue_step(
        &mut self,
        from: Rows<'_, B, T>,
        track: &Track<B, T>,
        local: std::ops::Range<usize>,
        shape: &[usize],
        lr: f64,
        step: u64,
    ) -> Result<Queued> {
        let b = Rc::clone(&self.backend);
        let key = match from {
            Rows::Device => GraphKey::QueuedDevice,
            Rows::Pinned(_) => GraphKey::QueuedPinned,
        };
        let req = Request::new(key, shape, "queued batched step", Some(step));
        let (gather, tensors) = (self.gather_of(from)?, self.optim_for(from)?);
        let (queued, ended) = in_step_split(&*b, || {
            if let Rows::Pinned(_) = from {
                // Rows of the device data set: `[lr, t]` is in the step table's row.
                self.optim.prepare(&*b, lr)?;
            }
            let parts = &self.parts;
            let eager = Eager {
                b: &*b,
                parts,
                gather: gather.as_ref(),
                tensors: &tensors,
                track,
            };
            self.exec
                .run(
                    &*b,
                    &mut self.optim,
                    req,
                    |_, inputs| match (from, inputs) {
                        (Rows::Pinned(src), Some(i)) => {
                            src.upload(&*b, local.clone(), i.x.value(), i.y.value())?;
                            i.x.bump_version();
                            i.y.bump_version();
                            Ok(())
                        }
                        _ => Ok(()),
                    },
                    |_, started| {
                        let inputs = StaticInputs::zeros(&*b, shape, &shape[..1])?;
                        if let Rows::Pinned(src) = from {
                            src.upload(&*b, local.clone(), inputs.x.value(), inputs.y.value())?;
                        }
                        let (bc, parts, gather) = (Rc::clone(&b), parts.clone(), gather.clone());
                        let (x, y) = (inputs.x.clone(), inputs.y.clone());
                        let (optim, track, started) =
                            (tensors.clone(), track.clone(), started.clone());
                        let body = move || {
                            parts.tracked(&*bc, gather.as_ref(), &x, &y, &optim, &track, &started)
                        };
                        Ok(Recording {
                            body: Box::new(body),
                            inputs: Some(inputs),
                        })
                    },
                    // Capture off, a batch of another shape (an epoch's last), or a capture
                    // that did nothing: the body eagerly on fresh inputs (its slot was
                    // prepared, its gate unused).
                    |optim, _| eager.run(optim, from, local.clone(), shape),
                )
                .map(|ran| ran.captured())
                .map_err(|e| e.settle(&mut self.optim))
        });
        let captured = queued?;
        Ok((captured, ended.map_err(|e| e.at_step(step, Applied::Yes))))
    }
}

/// What the queued step's body reads, for its eager form.
struct Eager<'a, B: Capture<T>, T: Element, M: Model<B, T>> {
    b: &'a B,
    parts: &'a StepParts<B, T, M>,
    gather: Option<&'a Gather<B, T>>,
    tensors: &'a OptimizerTensors<B, T>,
    track: &'a Track<B, T>,
}

impl<B: Capture<T>, T: Element, M: Model<B, T>> Eager<'_, B, T, M> {
    /// The body run eagerly on fresh inputs (saved class: the first product keeps `x`); a
    /// failure inside the update leaves the optimiser's state unknown.
    fn run(
        &self,
        optim: &mut Optimizer<B, T>,
        from: Rows<'_, B, T>,
        local: std::ops::Range<usize>,
        shape: &[usize],
    ) -> Result<()> {
        let b = self.b;
        let (x, y) = {
            let _class = ClassGuard::new(b, AllocClass::Saved);
            (
                Var::constant(b.zeros(shape)?),
                Var::constant(b.zeros(&shape[..1])?),
            )
        };
        if let Rows::Pinned(src) = from {
            src.upload(b, local, x.value(), y.value())?;
        }
        let started = Cell::new(false);
        self.parts
            .tracked(b, self.gather, &x, &y, self.tensors, self.track, &started)
            .inspect_err(|_| {
                if started.get() {
                    optim.mark_unknown();
                }
            })
    }
}
