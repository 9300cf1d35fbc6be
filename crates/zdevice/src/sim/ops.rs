//! Operations that sit in stream queues and in graphs, and how the data-moving ones run.
//!
//! One type serves both, so a graph replays exactly what capture recorded: launching a graph
//! copies its nodes into the stream's queue. Nodes keep addresses and arguments, never data,
//! so a replay reads memory as it is when the node runs (new input copied in before the launch
//! is used).

use std::sync::Arc;
use std::time::Duration;

use super::access::{KernelFault, SimMemory};
use super::config::SimConfig;
use super::gemm;
use super::gemm_ex;
use super::kernels::KernelFn;
use super::memory::Memory;
use crate::types::{DevicePtr, Event, GemmEx, GemmF32, HostPtr, KernelArg, LaunchConfig, Stream};

#[derive(Clone)]
pub(crate) enum Op {
    CopyDtoD {
        dst: DevicePtr,
        src: DevicePtr,
        bytes: u64,
    },
    CopyHtoD {
        dst: DevicePtr,
        src: HostPtr,
        bytes: u64,
    },
    /// A pageable host copy. The real driver's node keeps the host address and reads it at
    /// every launch; the simulator cannot read a borrowed host address later without `unsafe`,
    /// so it keeps the bytes as they were at call (or capture) time.
    CopyBytesHtoD {
        dst: DevicePtr,
        data: Arc<[u8]>,
    },
    CopyDtoH {
        dst: HostPtr,
        src: DevicePtr,
        bytes: u64,
    },
    Set8 {
        dst: DevicePtr,
        value: u8,
        bytes: u64,
    },
    Set32 {
        dst: DevicePtr,
        value: u32,
        count: u64,
    },
    Kernel {
        name: Arc<str>,
        kernel: Arc<KernelFn>,
        config: LaunchConfig,
        args: Arc<[KernelArg]>,
    },
    Gemm {
        gemm: GemmF32,
        tf32: bool,
    },
    /// `cublasGemmStridedBatchedEx` (issue 42).
    GemmEx {
        gemm: GemmEx,
    },
    /// One of cuBLAS's auxiliary graph nodes: counted, does nothing.
    Noop,
    EventRecord {
        event: Event,
    },
    /// Run `stream` up to and including the operation numbered `seq` first.
    Wait {
        stream: Stream,
        seq: u64,
    },
    /// A stream-ordered free (`cuMemFreeAsync`).
    Free {
        ptr: DevicePtr,
    },
    /// A graph's memory-allocation node (the address was fixed at capture).
    AllocNode {
        ptr: DevicePtr,
    },
    /// A graph's memory-free node.
    FreeNode {
        ptr: DevicePtr,
    },
}

impl std::fmt::Debug for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Op::CopyDtoD { dst, src, bytes } => write!(f, "CopyDtoD({dst:?} <- {src:?}, {bytes})"),
            Op::CopyHtoD { dst, src, bytes } => write!(f, "CopyHtoD({dst:?} <- {src:?}, {bytes})"),
            Op::CopyBytesHtoD { dst, data } => write!(f, "CopyBytesHtoD({dst:?}, {})", data.len()),
            Op::CopyDtoH { dst, src, bytes } => write!(f, "CopyDtoH({dst:?} <- {src:?}, {bytes})"),
            Op::Set8 { dst, value, bytes } => write!(f, "Set8({dst:?}, {value:#x}, {bytes})"),
            Op::Set32 { dst, value, count } => write!(f, "Set32({dst:?}, {value:#x}, {count})"),
            Op::Kernel {
                name, config, args, ..
            } => write!(f, "Kernel({name}, {config:?}, {args:?})"),
            Op::Gemm { gemm, tf32 } => write!(f, "Gemm({gemm:?}, tf32={tf32})"),
            Op::GemmEx { gemm } => write!(f, "GemmEx({gemm:?})"),
            Op::Noop => write!(f, "Noop"),
            Op::EventRecord { event } => write!(f, "EventRecord({event:?})"),
            Op::Wait { stream, seq } => write!(f, "Wait({stream:?}, {seq})"),
            Op::Free { ptr } => write!(f, "Free({ptr:?})"),
            Op::AllocNode { ptr } => write!(f, "AllocNode({ptr:?})"),
            Op::FreeNode { ptr } => write!(f, "FreeNode({ptr:?})"),
        }
    }
}

fn micros(n: u64) -> Duration {
    Duration::from_micros(n)
}

/// Virtual time to move `bytes` (one operation's fixed cost plus bandwidth).
pub(crate) fn transfer_time(cfg: &SimConfig, bytes: u64) -> Duration {
    cfg.op_time + micros(bytes / cfg.bytes_per_us.max(1))
}

impl Op {
    /// Virtual time the operation keeps its stream busy.
    pub(crate) fn duration(&self, cfg: &SimConfig) -> Duration {
        let moved = match self {
            Op::CopyDtoD { bytes, .. } => bytes.saturating_mul(2),
            Op::CopyHtoD { bytes, .. } | Op::CopyDtoH { bytes, .. } | Op::Set8 { bytes, .. } => {
                *bytes
            }
            Op::CopyBytesHtoD { data, .. } => data.len() as u64,
            Op::Set32 { count, .. } => count.saturating_mul(4),
            Op::Gemm { gemm, .. }
            | Op::GemmEx {
                gemm: GemmEx { gemm, .. },
            } => {
                return cfg.op_time + micros(gemm::flops(gemm) / cfg.flops_per_us.max(1));
            }
            Op::Kernel { .. } => 0,
            Op::Noop | Op::EventRecord { .. } | Op::Wait { .. } => return Duration::ZERO,
            Op::Free { .. } | Op::AllocNode { .. } | Op::FreeNode { .. } => return cfg.op_time / 5,
        };
        transfer_time(cfg, moved)
    }

    /// Runs a data operation (copy, memset, kernel, gemm) against memory. Returns None for the
    /// operations the stream machinery handles itself (events, waits, frees, memory nodes).
    /// With `accounting_only`, only device-to-host copies run (reading zeros, the memory never
    /// having been written): everything else is bookkeeping without data.
    pub(crate) fn run_data(
        &self,
        mem: &mut Memory,
        accounting_only: bool,
    ) -> Option<Result<(), KernelFault>> {
        if accounting_only && !matches!(self, Op::CopyDtoH { .. }) {
            return match self {
                Op::EventRecord { .. } | Op::Wait { .. } | Op::Free { .. } => None,
                Op::AllocNode { .. } | Op::FreeNode { .. } => None,
                _ => Some(Ok(())),
            };
        }
        let result = match self {
            Op::CopyDtoD { dst, src, bytes } => {
                mem.read(*src, *bytes).and_then(|d| mem.write(*dst, &d))
            }
            Op::CopyHtoD { dst, src, bytes } => match mem.host_read(*src, *bytes) {
                Some(d) => mem.write(*dst, &d),
                None => Err(KernelFault::HostUnmapped(src.0)),
            },
            Op::CopyBytesHtoD { dst, data } => mem.write(*dst, data),
            Op::CopyDtoH { dst, src, bytes } => mem.read(*src, *bytes).and_then(|d| {
                mem.host_write(*dst, &d)
                    .ok_or(KernelFault::HostUnmapped(dst.0))
            }),
            Op::Set8 { dst, value, bytes } => mem.fill(*dst, *bytes, &[*value]),
            Op::Set32 { dst, value, count } => match count.checked_mul(4) {
                Some(len) => mem.fill(*dst, len, &value.to_le_bytes()),
                None => Err(KernelFault::OutOfBounds {
                    ptr: *dst,
                    len: u64::MAX,
                    size: 0,
                }),
            },
            Op::Kernel {
                kernel,
                config,
                args,
                ..
            } => kernel(config, args, &mut SimMemory::new(mem)),
            Op::Gemm { gemm, tf32 } => gemm::run(mem, gemm, *tf32),
            Op::GemmEx { gemm } => gemm_ex::run(mem, gemm),
            Op::Noop => Ok(()),
            Op::EventRecord { .. } | Op::Wait { .. } | Op::Free { .. } => return None,
            Op::AllocNode { .. } | Op::FreeNode { .. } => return None,
        };
        Some(result)
    }
}
