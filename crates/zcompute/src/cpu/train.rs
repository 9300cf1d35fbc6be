//! The loss and the optimiser step.

use super::common::gather;
use super::{math, par};
use crate::backend::{ADAMW_SLOT_GATE, ADAMW_SLOT_LR, ADAMW_SLOT_STEP, AdamWConfig};
use crate::element::Element;
use crate::error::Result;
use crate::optim::SgdConfig;
use crate::tensor::CpuTensor;
use crate::validate;

pub(crate) fn bce_with_logits_mean<T: Element>(
    logits: &CpuTensor<T>,
    targets: &CpuTensor<T>,
) -> Result<CpuTensor<T>> {
    let n = validate::bce(logits, targets)?;
    let terms: Vec<T> = gather(logits)
        .into_iter()
        .zip(gather(targets))
        .map(|(x, y)| math::bce_with_logits(x, y))
        .collect();
    let mean = math::pairwise_sum(&terms) / T::from_f64(n as f64);
    Ok(CpuTensor::scalar(mean))
}

pub(crate) fn adamw_step<T: Element>(
    p: &CpuTensor<T>,
    m: &CpuTensor<T>,
    v: &CpuTensor<T>,
    g: &CpuTensor<T>,
    slot: &CpuTensor<T>,
    cfg: &AdamWConfig<T>,
) -> Result<()> {
    validate::adamw(p, m, v, g, slot, cfg)?;

    // Read lr and t from memory at the time of the call, as the device kernel will on replay.
    let s = gather(slot);
    if s.get(ADAMW_SLOT_GATE).is_some_and(|&gate| gate != T::ZERO) {
        tracing::trace!(numel = p.numel(), "cpu adamw skipped by its gate");
        return Ok(());
    }
    let (lr, t) = (s[ADAMW_SLOT_LR], s[ADAMW_SLOT_STEP]);
    let AdamWConfig {
        beta1: b1,
        beta2: b2,
        eps,
        weight_decay: wd,
    } = *cfg;
    tracing::trace!(
        lr = lr.to_f64(),
        t = t.to_f64(),
        numel = p.numel(),
        "cpu adamw"
    );
    let bc1 = T::ONE - b1.powf(t);
    let bc2 = T::ONE - b2.powf(t);
    let decay = T::ONE - lr * wd;

    let grads = gather(g);
    let update = |p: &mut T, m: &mut T, v: &mut T, gi: T| {
        let mi = b1 * *m + (T::ONE - b1) * gi;
        let vi = b2 * *v + (T::ONE - b2) * gi * gi;
        let m_hat = mi / bc1;
        let v_hat = vi / bc2;
        *p = *p * decay - lr * m_hat / (v_hat.sqrt() + eps);
        *m = mi;
        *v = vi;
    };
    let mut pd = p.storage().write();
    let mut md = m.storage().write();
    let mut vd = v.storage().write();
    if p.is_contiguous() && m.is_contiguous() && v.is_contiguous() {
        let n = p.numel();
        let window = |t: &CpuTensor<T>| t.layout().offset()..t.layout().offset() + n;
        let (ps, ms, vs) = (&mut pd[window(p)], &mut md[window(m)], &mut vd[window(v)]);
        par::chunks_mut3(ps, ms, vs, |first, ps, ms, vs| {
            let gs = &grads[first..first + ps.len()];
            for (((p, m), v), &gi) in ps.iter_mut().zip(ms.iter_mut()).zip(vs.iter_mut()).zip(gs) {
                update(p, m, v, gi);
            }
        });
        return Ok(());
    }
    let offsets = p
        .layout()
        .offsets()
        .zip(m.layout().offsets())
        .zip(v.layout().offsets());
    for (((po, mo), vo), &gi) in offsets.zip(&grads) {
        let (mut pi, mut mi, mut vi) = (pd[po], md[mo], vd[vo]);
        update(&mut pi, &mut mi, &mut vi, gi);
        pd[po] = pi;
        md[mo] = mi;
        vd[vo] = vi;
    }
    Ok(())
}

/// `OptimOps::sgd_step` as a loop (the reference; the device twin runs it too). The roundings
/// are the kernel's: `d = g + wd·p`, `buf = m·buf + (1 - dampening)·d`, `d + m·buf`,
/// `p - lr·d`, each product and sum rounded on its own (no fused multiply-add).
pub(crate) fn sgd_step<T: Element>(
    p: &CpuTensor<T>,
    buf: Option<&CpuTensor<T>>,
    g: &CpuTensor<T>,
    slot: &CpuTensor<T>,
    cfg: &SgdConfig<T>,
) -> Result<()> {
    validate::sgd(p, buf, g, slot, cfg)?;
    let s = gather(slot);
    if s.get(ADAMW_SLOT_GATE).is_some_and(|&gate| gate != T::ZERO) {
        tracing::trace!(numel = p.numel(), "cpu sgd skipped by its gate");
        return Ok(());
    }
    let (lr, t) = (s[ADAMW_SLOT_LR], s[ADAMW_SLOT_STEP]);
    let SgdConfig {
        momentum,
        dampening,
        weight_decay: wd,
        nesterov,
    } = *cfg;
    tracing::trace!(
        lr = lr.to_f64(),
        t = t.to_f64(),
        numel = p.numel(),
        "cpu sgd"
    );
    // PyTorch makes the buffer a copy of the first step's direction (no dampening on it).
    let first = t <= T::ONE;
    let keep = T::ONE - dampening;
    let direction = |pi: T, gi: T| if wd == T::ZERO { gi } else { gi + wd * pi };
    let grads = gather(g);
    let mut pd = p.storage().write();
    match buf.filter(|_| momentum != T::ZERO) {
        Some(buf) => {
            let mut bd = buf.storage().write();
            let offsets = p.layout().offsets().zip(buf.layout().offsets());
            for ((po, bo), &gi) in offsets.zip(&grads) {
                let d = direction(pd[po], gi);
                let b = if first {
                    d
                } else {
                    momentum * bd[bo] + keep * d
                };
                bd[bo] = b;
                let step = if nesterov { d + momentum * b } else { b };
                pd[po] = pd[po] - lr * step;
            }
        }
        None => {
            for (po, &gi) in p.layout().offsets().zip(&grads) {
                let d = direction(pd[po], gi);
                pd[po] = pd[po] - lr * d;
            }
        }
    }
    Ok(())
}
