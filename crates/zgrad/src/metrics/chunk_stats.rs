//! The evaluation's reductions on the device (issue 40 item 2): each chunk's outputs and
//! targets reduced, inside the chunk's (captured) work, to a short row of statistics; the
//! rows of a pass read back once and combined on the host in `f64`.
//!
//! A row holds what the task's report needs (`Task`):
//! - classification (binary, class index, distribution), [`CLASS_STATS`] values: the chunk's
//!   loss sum (`Tape::task_loss`, the training formula with its weights, times the values it
//!   averaged), the weighted count of right predictions and the weights' sum;
//! - regression, [`REGRESSION_STATS`] values: the loss sum, `Σ w d²`, `Σ w |d|` (`d` = output
//!   − target), the weights' sum `W`, the chunk's value count, and what Pearson needs as
//!   *centred* statistics: the shifts `mp`, `mt` (the chunk's weighted means in the element
//!   type) and `Σ w (p − mp)`, `Σ w (t − mt)`, `Σ w (p − mp)²`, `Σ w (t − mt)²`,
//!   `Σ w (p − mp)(t − mt)`.
//!
//! Numerics. Raw moments (`Σ p²` against `(Σ p)²/W`) in f32 over a large set lose every digit
//! to cancellation when the values sit far from 0 relative to their spread. Here the device
//! sums at most one chunk (`eval_batch` values) and only deviations from a shift near the
//! chunk's mean, so each sum is of small, mixed-sign terms (relative error about
//! `chunk · ε_f32` of the deviations' own size, not of the raw values'). The host turns a row
//! into the chunk's exact-algebra mean and centred moments (the shifted-data formulas: mean =
//! `mp + Σ w (p − mp) / W`, `M2 = Σ w (p − mp)² − (Σ w (p − mp))² / W`, valid for any shift and
//! stable when the shift is near the mean) and merges the chunks in `f64` with Chan, Golub and
//! LeVeque's pairwise update (`δ² W_a W_b / W` terms), in chunk order. Data-parallel ranks
//! contribute their chunks' rows in rank order ([`global_chunks`]), so every rank merges the
//! same rows the same way.

use super::report::{EvalReport, RegressionMetrics};
use crate::error::Result;
use crate::tape::Tape;
use crate::task::{Target, Task};
use crate::var::Var;
use zcompute::{BTensor, BinaryOp, Element, ScalarSide, UnaryOp, prelude::*};

/// Values of a classification chunk's row: loss sum, weighted right count, weight sum.
pub(crate) const CLASS_STATS: usize = 3;
/// Values of a regression chunk's row (see the module docs for their order).
pub(crate) const REGRESSION_STATS: usize = 12;

/// How a pass reports `task`: `None` for the unweighted binary task (XAsset's), whose report stays
/// the one it always was (the logits read back once, one per sample, the loss and accuracy
/// summed in `f64` on the host, bitwise what the ztrain runs and their checkpoints pin);
/// otherwise the length of each chunk's statistics row.
pub(crate) fn stats_len(task: &Task) -> Option<usize> {
    match task.target {
        Target::Binary if !task.weighted => None,
        Target::Regression { .. } => Some(REGRESSION_STATS),
        _ => Some(CLASS_STATS),
    }
}

/// Chunks of `chunk` samples rank `rank` of `world` evaluates of a set of `total` (its shard,
/// `shard`), the chunks before its own (every lower rank's), and all ranks' chunks together.
pub(crate) fn global_chunks(
    rank: usize,
    world: usize,
    total: usize,
    chunk: usize,
) -> (usize, usize, usize) {
    let chunk = chunk.max(1);
    let of = |r: usize| crate::shard(r, world, total).len().div_ceil(chunk);
    let before = (0..rank).map(of).sum();
    let all = (0..world.max(1)).map(of).sum();
    (of(rank), before, all)
}

/// A dense copy of `x` (a view the model returned may be strided).
fn dense<B: Ops<T>, T: Element>(b: &B, x: &BTensor<B, T>) -> Result<BTensor<B, T>> {
    Ok(if x.is_contiguous() {
        x.clone()
    } else {
        b.contiguous(x)?
    })
}

/// The sum of every element of `x`, shape `[1]`.
fn total<B: Ops<T>, T: Element>(b: &B, x: &BTensor<B, T>) -> Result<BTensor<B, T>> {
    let x = dense(b, x)?;
    Ok(b.sum(&x.reshape(&[x.numel()])?, 0, true)?)
}

/// `x`, weighted by `w` when there are weights.
fn weighted<B: Ops<T>, T: Element>(
    b: &B,
    x: &BTensor<B, T>,
    w: Option<&BTensor<B, T>>,
) -> Result<BTensor<B, T>> {
    Ok(match w {
        Some(w) => b.mul(x, w)?,
        None => x.clone(),
    })
}

/// One chunk's statistics row (`stats_len(task)` values, shape `[len]`) of the model's
/// `outputs` (`[rows, ..output_shape]`, checked against the task) against `targets`
/// (`[rows, ..target_shape]`). Device ops only: legal inside a capture, the same ops eager.
pub(crate) fn chunk_stats<B: Ops<T>, T: Element>(
    b: &B,
    task: &Task,
    outputs: &BTensor<B, T>,
    targets: &BTensor<B, T>,
) -> Result<BTensor<B, T>> {
    let rows = outputs.shape().first().copied().unwrap_or(0);
    let tape = Tape::no_grad(b);
    let (out, y) = (
        Var::constant(dense(b, outputs)?),
        Var::constant(dense(b, targets)?),
    );
    // The task's own loss (the training formula, weights and all): a mean over `averaged`
    // values (per sample for classification, per value for regression), back to a sum.
    let mean = tape.task_loss(task, &out, &y)?;
    let (values, weights) = task.split(b, &y)?;
    let (values, weights) = (values.value().clone(), weights.map(|w| w.value().clone()));
    let averaged = match task.target {
        Target::Regression { outputs } => rows * outputs,
        _ => rows,
    };
    let loss = b.binary_scalar(
        BinaryOp::Mul,
        &mean.value().reshape(&[1])?,
        T::from_f64(averaged as f64),
        ScalarSide::Rhs,
    )?;
    let parts = match task.target {
        Target::Regression { .. } => {
            regression(b, loss, out.value(), &values, weights.as_ref(), averaged)?
        }
        _ => classification(b, task, loss, out.value(), &values, weights.as_ref(), rows)?,
    };
    let refs: Vec<&BTensor<B, T>> = parts.iter().collect();
    Ok(b.concat(&refs, 0)?)
}

/// `[len, 1]` columns `[left, x]`: its argmax is 1 exactly where `x > left` (the first
/// maximum wins a tie), so `x > 0` and `t > 0.5` as a whole number.
fn above<B: Ops<T>, T: Element>(b: &B, x: &BTensor<B, T>, left: T) -> Result<BTensor<B, T>> {
    let len = x.numel();
    let col = b.full(&[len, 1], left)?;
    let joined = b.concat(&[&col, &x.reshape(&[len, 1])?], 1)?;
    Ok(b.argmax(&joined)?)
}

fn classification<B: Ops<T>, T: Element>(
    b: &B,
    task: &Task,
    loss: BTensor<B, T>,
    out: &BTensor<B, T>,
    values: &BTensor<B, T>,
    weights: Option<&BTensor<B, T>>,
    rows: usize,
) -> Result<Vec<BTensor<B, T>>> {
    // The predicted class and the target's, as whole numbers of the element type (the host
    // report's rules: `logit > 0` against `label > 0.5`; the first largest logit against the
    // class index or the distribution's first largest value).
    let (predicted, truth) = match task.target {
        Target::Binary => (above(b, out, T::ZERO)?, above(b, values, T::from_f64(0.5))?),
        Target::ClassIndex { .. } => (b.argmax(out)?, values.clone()),
        _ => (b.argmax(out)?, b.argmax(values)?),
    };
    // Right where the two are equal: relu(1 - d²), exact for whole numbers.
    let d = b.sub(&predicted, &truth.reshape(&[rows])?)?;
    let near = b.binary_scalar(BinaryOp::Sub, &b.mul(&d, &d)?, T::ONE, ScalarSide::Lhs)?;
    let right = b.binary_scalar(BinaryOp::Maximum, &near, T::ZERO, ScalarSide::Rhs)?;
    // A sample counts by its (first) weight, as in the host report.
    let w = match weights {
        Some(w) if w.shape().len() > 1 => {
            Some(b.contiguous(&w.narrow(1, 0, 1)?)?.reshape(&[rows])?)
        }
        Some(w) => Some(w.clone()),
        None => None,
    };
    let right = total(b, &weighted(b, &right, w.as_ref())?)?;
    let weight = match &w {
        Some(w) => total(b, w)?,
        None => b.full(&[1], T::from_f64(rows as f64))?,
    };
    Ok(vec![loss, right, weight])
}

fn regression<B: Ops<T>, T: Element>(
    b: &B,
    loss: BTensor<B, T>,
    p: &BTensor<B, T>,
    t: &BTensor<B, T>,
    w: Option<&BTensor<B, T>>,
    count: usize,
) -> Result<Vec<BTensor<B, T>>> {
    let d = b.sub(p, t)?;
    let sq = total(b, &weighted(b, &b.mul(&d, &d)?, w)?)?;
    let abs = total(
        b,
        &weighted(b, &b.maximum(&d, &b.unary(UnaryOp::Neg, &d)?)?, w)?,
    )?;
    let (sum_w, count) = (
        match w {
            Some(w) => total(b, w)?,
            None => b.full(&[1], T::from_f64(count as f64))?,
        },
        b.full(&[1], T::from_f64(count as f64))?,
    );
    // The shifts: the weighted means (0 for a chunk of no weight: every term is then 0).
    let floor = b.binary_scalar(
        BinaryOp::Maximum,
        &sum_w,
        T::from_f64(1e-30),
        ScalarSide::Rhs,
    )?;
    let mp = b.div(&total(b, &weighted(b, p, w)?)?, &floor)?;
    let mt = b.div(&total(b, &weighted(b, t, w)?)?, &floor)?;
    let dp = b.sub(p, &mp)?;
    let dt = b.sub(t, &mt)?;
    let s_dp = total(b, &weighted(b, &dp, w)?)?;
    let s_dt = total(b, &weighted(b, &dt, w)?)?;
    let q_pp = total(b, &weighted(b, &b.mul(&dp, &dp)?, w)?)?;
    let q_tt = total(b, &weighted(b, &b.mul(&dt, &dt)?, w)?)?;
    let q_pt = total(b, &weighted(b, &b.mul(&dp, &dt)?, w)?)?;
    Ok(vec![
        loss, sq, abs, sum_w, count, mp, mt, s_dp, s_dt, q_pp, q_tt, q_pt,
    ])
}

/// The report of `samples` samples from the statistics rows of every chunk (`rows`: chunks ×
/// `stats_len(task)` values, in chunk order; in data parallel every rank's, in rank order).
pub(crate) fn report_of_stats<T: Element>(task: &Task, rows: &[T], samples: usize) -> EvalReport {
    let len = stats_len(task).unwrap_or(CLASS_STATS);
    let rows = rows.chunks_exact(len).map(|r| r.iter().map(|v| v.to_f64()));
    match task.target {
        Target::Regression { outputs } => {
            let mut m = Moments::default();
            for r in rows {
                m.merge(&Moments::of_row(&r.collect::<Vec<_>>()));
            }
            let slots = (samples * outputs).max(1) as f64;
            EvalReport {
                loss: m.loss / slots,
                accuracy: f64::NAN,
                samples,
                regression: Some(RegressionMetrics {
                    mse: m.sq / m.w,
                    mae: m.abs / m.w,
                    pearson: m.pearson(T::DTYPE.size() <= 4),
                }),
            }
        }
        _ => {
            let (mut loss, mut right, mut weight) = (0.0, 0.0, 0.0);
            for mut r in rows {
                loss += r.next().unwrap_or(f64::NAN);
                right += r.next().unwrap_or(f64::NAN);
                weight += r.next().unwrap_or(f64::NAN);
            }
            EvalReport {
                loss: loss / samples.max(1) as f64,
                accuracy: right / weight,
                samples,
                regression: None,
            }
        }
    }
}

/// A regression's sums over the chunks merged so far, the moments centred at their means.
#[derive(Default)]
struct Moments {
    loss: f64,
    sq: f64,
    abs: f64,
    w: f64,
    mean_p: f64,
    mean_t: f64,
    m2_p: f64,
    m2_t: f64,
    c_pt: f64,
    /// What rounding in the device sums can leave in `m2_p` / `m2_t` of data that do not
    /// vary (per chunk `2 γ_n Σ w (x − shift)²`, summed): a variance at or below it is none.
    noise_p: f64,
    noise_t: f64,
    /// Values summed on the device per chunk, at most (for the rounding bound).
    chunk_values: f64,
}

impl Moments {
    /// One chunk's row (`REGRESSION_STATS` values, in the module docs' order).
    fn of_row(r: &[f64]) -> Self {
        let [
            loss,
            sq,
            abs,
            w,
            count,
            mp,
            mt,
            s_dp,
            s_dt,
            q_pp,
            q_tt,
            q_pt,
        ] = r[..]
        else {
            return Moments {
                loss: f64::NAN,
                ..Moments::default()
            };
        };
        if w == 0.0 {
            // Nothing weighed (every target missing): only the loss and error sums (0).
            return Moments {
                loss,
                sq,
                abs,
                chunk_values: count,
                ..Moments::default()
            };
        }
        Moments {
            loss,
            sq,
            abs,
            w,
            mean_p: mp + s_dp / w,
            mean_t: mt + s_dt / w,
            m2_p: q_pp - s_dp * s_dp / w,
            m2_t: q_tt - s_dt * s_dt / w,
            c_pt: q_pt - s_dp * s_dt / w,
            noise_p: q_pp,
            noise_t: q_tt,
            chunk_values: count,
        }
    }

    /// Chan et al.'s pairwise merge.
    fn merge(&mut self, o: &Moments) {
        self.loss += o.loss;
        self.sq += o.sq;
        self.abs += o.abs;
        self.noise_p += o.noise_p;
        self.noise_t += o.noise_t;
        self.chunk_values = self.chunk_values.max(o.chunk_values);
        if o.w == 0.0 {
            return;
        }
        let w = self.w + o.w;
        let (dp, dt) = (o.mean_p - self.mean_p, o.mean_t - self.mean_t);
        let f = self.w * o.w / w;
        self.m2_p += o.m2_p + dp * dp * f;
        self.m2_t += o.m2_t + dt * dt * f;
        self.c_pt += o.c_pt + dp * dt * f;
        self.mean_p += dp * o.w / w;
        self.mean_t += dt * o.w / w;
        self.w = w;
    }

    /// Pearson's r; `NaN` when the predictions or the targets do not vary beyond what the
    /// device's rounding can produce (`single`: the sums were in f32, else f64).
    fn pearson(&self, single: bool) -> f64 {
        let unit = if single {
            f64::from(f32::EPSILON) / 2.0
        } else {
            f64::EPSILON / 2.0
        };
        let n = self.chunk_values.max(1.0);
        // γ_n = n u / (1 - n u) bounds a sum's relative rounding (Higham, 2002, §3.1); the
        // two terms of M2 each carry it.
        let gamma = 2.0 * n * unit / (1.0 - n * unit).max(f64::MIN_POSITIVE);
        if !(self.m2_p > gamma * self.noise_p && self.m2_t > gamma * self.noise_t) {
            return f64::NAN;
        }
        self.c_pt / (self.m2_p * self.m2_t).sqrt()
    }
}

#[cfg(test)]
mod tests;
