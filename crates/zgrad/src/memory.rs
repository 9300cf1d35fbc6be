//! Allocation-class scoping: a guard that sets the backend's class for the ops issued while it
//! lives and puts the previous one back when dropped, so an early `?` return cannot leave the
//! backend allocating in the wrong class; and step scopes (`in_step`).

use crate::error::{GradError, Result};
use zcompute::{AllocClass, Element, prelude::*};

/// Runs `f` inside a step scope of the backend, with op outputs in the scratch class, and
/// closes the step even when `f` fails (`f`'s error wins). On a device backend every
/// temporary of a forward and backward is scratch memory, which exists only inside a step
/// (without one, ops fail with `NoOpenStep`); closing the step reclaims it all. Read back what
/// you need (a loss) inside `f`. On the CPU backend the scope costs nothing. The trainer opens
/// its own steps; a hand-written training loop wraps each iteration:
///
/// ```
/// use zcompute::{prelude::*, CpuBackend};
/// use zgrad::{Tape, Var, in_step};
///
/// fn square_sum<B: Ops<f32>>(b: &B) -> zgrad::Result<f32> {
///     let w = Var::parameter_from(b, &[1.0, 2.0], &[2])?; // outside: persistent by default
///     in_step(b, || {
///         let tape = Tape::new(b);
///         let loss = tape.sum_all(&tape.mul(&w, &w)?)?;
///         tape.backward(&loss)?;
///         Ok(loss.to_vec(b)?[0])
///     })
/// }
/// assert_eq!(square_sum(&CpuBackend)?, 5.0);
/// # Ok::<(), zgrad::GradError>(())
/// ```
pub fn in_step<B: Ops<T>, T: Element, R>(b: &B, f: impl FnOnce() -> Result<R>) -> Result<R> {
    let (out, ended) = in_step_split(b, f);
    let out = out?;
    ended?;
    Ok(out)
}

/// `in_step` returning `f`'s result and the closing of the step apart: closing the step can
/// fail after `f`'s work (an update included) was done, which the caller must report as such.
pub(crate) fn in_step_split<B: Ops<T>, T: Element, R>(
    b: &B,
    f: impl FnOnce() -> Result<R>,
) -> (Result<R>, Result<()>) {
    if let Err(e) = b.begin_step() {
        return (Err(e.into()), Ok(()));
    }
    let out = {
        let _class = ClassGuard::new(b, AllocClass::Scratch);
        f()
    };
    (out, b.end_step().map_err(GradError::from))
}

/// Sets the allocation class of later outputs until dropped.
pub(crate) struct ClassGuard<'b, B: Ops<T>, T: Element> {
    backend: &'b B,
    previous: AllocClass,
    _elem: std::marker::PhantomData<T>,
}

impl<'b, B: Ops<T>, T: Element> ClassGuard<'b, B, T> {
    pub(crate) fn new(backend: &'b B, class: AllocClass) -> Self {
        let previous = backend.set_alloc_class(class);
        ClassGuard {
            backend,
            previous,
            _elem: std::marker::PhantomData,
        }
    }
}

impl<B: Ops<T>, T: Element> Drop for ClassGuard<'_, B, T> {
    fn drop(&mut self) {
        self.backend.set_alloc_class(self.previous);
    }
}

/// A tensor of zeros of `shape` in persistent memory (made outside or inside a step alike):
/// the trainer's graph inputs, tables and landing buffers.
pub(crate) fn persistent_zeros<B: Ops<T>, T: Element>(
    b: &B,
    shape: &[usize],
) -> Result<zcompute::BTensor<B, T>> {
    let _class = ClassGuard::new(b, AllocClass::Persistent);
    Ok(b.zeros(shape)?)
}
