//! The queued step's body (gather, step, gate, history row, gated update): replayed when a
//! graph of its shape exists, captured when capture is on and none exists yet, else eagerly.

use super::super::body::{ErrorSlot, StepParts, into_body_error, take_body_error};
use super::super::captured::{BatchedGraph, Runs, persistent_zeros, warn_fallback};
use super::super::{Trainer, in_step_split};
use super::{Queued, Rows, Track, no_data};
use crate::error::{Applied, Result};
use crate::memory::ClassGuard;
use crate::model::Model;
use crate::optim::OptimizerTensors;
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
    /// The graph slot of rows from `from`.
    fn tracked_slot(&mut self, from: Rows<'_, B, T>) -> &mut Option<BatchedGraph<B, T>> {
        match from {
            Rows::Device => &mut self.graphs.tracked,
            Rows::Pinned(_) => &mut self.graphs.tracked_pinned,
        }
    }

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

    /// Queues the step's body: replayed when a graph of this shape exists, captured when
    /// capture is on and none exists yet, else run eagerly.
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
        let want = self.config.capture && !self.graphs.disabled;
        let graph_shape = self.tracked_slot(from).as_ref().map(|g| g.shape.clone());
        let (queued, ended) = in_step_split(&*b, || {
            if let Rows::Pinned(_) = from {
                // Rows of the device data set: `[lr, t]` is in the step table's row.
                self.optim.prepare(&*b, lr)?;
            }
            match (want, graph_shape) {
                (true, Some(s)) if s == shape => {
                    let Some(g) = self.tracked_slot(from).as_mut() else {
                        return Err(no_data());
                    };
                    if let Rows::Pinned(src) = from {
                        src.upload(&*b, local, g.x.value(), g.y.value())?;
                        g.x.bump_version();
                        g.y.bump_version();
                    }
                    let (graph, errors) = (&mut g.graph, g.errors.clone());
                    b.replay(graph).map_err(|e| {
                        // The graph may have run in part, its update included.
                        self.optim.mark_unknown();
                        take_body_error(e, &errors).at_step(step, Applied::Maybe)
                    })?;
                    Ok(true)
                }
                (true, None) => self.tracked_capture(from, track, local, shape, step),
                // Capture off, or a batch of another shape (an epoch's last): eagerly.
                _ => {
                    self.tracked_eager(from, track, local, shape)?;
                    Ok(false)
                }
            }
        });
        let captured = queued?;
        Ok((captured, ended.map_err(|e| e.at_step(step, Applied::Yes))))
    }

    /// The body run eagerly on fresh inputs (saved class: the first product keeps `x`).
    fn tracked_eager(
        &mut self,
        from: Rows<'_, B, T>,
        track: &Track<B, T>,
        local: std::ops::Range<usize>,
        shape: &[usize],
    ) -> Result<()> {
        let b = &*self.backend;
        let gather = self.gather_of(from)?;
        let (x, y) = {
            let _class = ClassGuard::new(b, AllocClass::Saved);
            (
                Var::constant(b.zeros(shape)?),
                Var::constant(b.zeros(&shape[..1])?),
            )
        };
        if let Rows::Pinned(src) = from {
            src.upload(b, local.clone(), x.value(), y.value())?;
        }
        let started = Cell::new(false);
        let optim = self.optim_for(from)?;
        self.parts
            .tracked(b, gather.as_ref(), &x, &y, &optim, track, &started)
            .inspect_err(|_| {
                if started.get() {
                    self.optim.mark_unknown();
                }
            })
    }

    /// Captures the body (its warm-up, or the CPU backend's recording, runs it for real).
    fn tracked_capture(
        &mut self,
        from: Rows<'_, B, T>,
        track: &Track<B, T>,
        local: std::ops::Range<usize>,
        shape: &[usize],
        step: u64,
    ) -> Result<bool> {
        let b = Rc::clone(&self.backend);
        let gather = self.gather_of(from)?;
        let (xv, yv) = (
            Var::constant(persistent_zeros(&*b, shape)?),
            Var::constant(persistent_zeros(&*b, &shape[..1])?),
        );
        if let Rows::Pinned(src) = from {
            src.upload(&*b, local.clone(), xv.value(), yv.value())?;
        }
        let (errors, runs, started) = (ErrorSlot::default(), Runs::default(), Rc::default());
        let body = tracked_body(
            &b,
            &self.parts,
            gather,
            (xv.clone(), yv.clone()),
            self.optim_for(from)?,
            track.clone(),
            (errors.clone(), runs.clone(), Rc::clone(&started)),
        );
        match b.capture_in_pool(&self.graphs.pool, Box::new(body)) {
            Ok(graph) => {
                *self.tracked_slot(from) = Some(BatchedGraph {
                    graph,
                    x: xv,
                    y: yv,
                    shape: shape.to_vec(),
                    errors,
                });
                Ok(true)
            }
            Err(e) => {
                let e = take_body_error(e, &errors);
                if runs.get() == 0 && started.get() {
                    self.optim.mark_unknown();
                    return Err(e.at_step(step, Applied::Maybe));
                }
                warn_fallback("queued batched step", &e);
                self.graphs.disabled = true;
                if runs.get() == 0 {
                    // Nothing ran: the step eagerly (its slot was prepared, its gate unused).
                    self.tracked_eager(from, track, local, shape)?;
                }
                Ok(false)
            }
        }
    }
}

/// The capture body of `StepParts::tracked`, a `'static` closure over clones.
fn tracked_body<B: Capture<T> + 'static, T: Element, M: Model<B, T>>(
    b: &Rc<B>,
    parts: &StepParts<B, T, M>,
    data: Option<Gather<B, T>>,
    inputs: (Var<B, T>, Var<B, T>),
    optim: OptimizerTensors<B, T>,
    track: Track<B, T>,
    slots: (ErrorSlot, Runs, Rc<Cell<bool>>),
) -> impl FnMut() -> zcompute::Result<()> + 'static {
    let (b, parts) = (Rc::clone(b), parts.clone());
    let (errors, runs, started) = slots;
    move || {
        parts
            .tracked(
                &*b,
                data.as_ref(),
                &inputs.0,
                &inputs.1,
                &optim,
                &track,
                &started,
            )
            .map_err(|e| into_body_error(e, &errors))?;
        runs.set(runs.get() + 1);
        Ok(())
    }
}
