//! Simulated twins of the training kernels (`train.cu`): the mean BCE-with-logits loss and
//! the fused AdamW step, which reads its learning rate, step count and gate from a device slot.

use super::common::{checked, cpu_err, rows_tensor};
use crate::backend::AdamWConfig;
use crate::cpu;
use crate::cuda::kernels::Kernel;
use crate::optim::SgdConfig;
use crate::tensor::CpuTensor;
use zdevice::sim::{KernelFault, SimMemory};
use zdevice::{KernelArg, LaunchConfig};

pub(super) fn bce_mean(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(Kernel::BceMean, args)?;
    let (out, x, y, n) = (k.ptr(0)?, k.ptr(1)?, k.ptr(2)?, k.u64(3)?);
    let (tx, ty) = (rows_tensor(mem, x, 1, n)?, rows_tensor(mem, y, 1, n)?);
    let r = cpu::train::bce_with_logits_mean(&tx, &ty).map_err(cpu_err)?;
    mem.write_f32(out, &r.to_vec())
}

pub(super) fn adamw(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(Kernel::AdamW, args)?;
    let [p, m, v, g, slot] = [0, 1, 2, 3, 4].map(|i| k.ptr(i));
    let (p, m, v, g, slot) = (p?, m?, v?, g?, slot?);
    let n = k.u64(5)?;
    let cfg = AdamWConfig {
        beta1: k.f32(6)?,
        beta2: k.f32(7)?,
        eps: k.f32(8)?,
        weight_decay: k.f32(9)?,
    };
    let t = |mem: &SimMemory<'_>, ptr| rows_tensor(mem, ptr, 1, n);
    let (tp, tm, tv, tg) = (t(mem, p)?, t(mem, m)?, t(mem, v)?, t(mem, g)?);
    let slot_len = k.u64(10)?;
    // As the kernel: a 3-element slot carries a gate, and only a gate of exactly 0 updates.
    let s = mem.read_f32(slot, slot_len.min(3))?;
    let ts = CpuTensor::from_vec(s, &[slot_len.min(3) as usize]).map_err(cpu_err)?;
    cpu::train::adamw_step(&tp, &tm, &tv, &tg, &ts, &cfg).map_err(cpu_err)?;
    mem.write_f32(p, &tp.to_vec())?;
    mem.write_f32(m, &tm.to_vec())?;
    mem.write_f32(v, &tv.to_vec())
}

pub(super) fn sgd(
    _: &LaunchConfig,
    args: &[KernelArg],
    mem: &mut SimMemory<'_>,
) -> Result<(), KernelFault> {
    let k = checked(Kernel::Sgd, args)?;
    let (p, buf, g, slot, n) = (k.ptr(0)?, k.ptr(1)?, k.ptr(2)?, k.ptr(3)?, k.u64(4)?);
    let cfg = SgdConfig {
        momentum: k.f32(5)?,
        dampening: k.f32(6)?,
        weight_decay: k.f32(7)?,
        nesterov: k.u32(8)? != 0,
    };
    let slot_len = k.u64(9)?;
    let t = |mem: &SimMemory<'_>, ptr| rows_tensor(mem, ptr, 1, n);
    let (tp, tg) = (t(mem, p)?, t(mem, g)?);
    // As the kernel: the buffer is read only with momentum (`p` stands in for it otherwise).
    let tb = if cfg.momentum != 0.0 {
        Some(t(mem, buf)?)
    } else {
        None
    };
    let s = mem.read_f32(slot, slot_len.min(3))?;
    let ts = CpuTensor::from_vec(s, &[slot_len.min(3) as usize]).map_err(cpu_err)?;
    cpu::train::sgd_step(&tp, tb.as_ref(), &tg, &ts, &cfg).map_err(cpu_err)?;
    mem.write_f32(p, &tp.to_vec())?;
    if let Some(tb) = tb {
        mem.write_f32(buf, &tb.to_vec())?;
    }
    Ok(())
}
