//! NCCL's errors as [`CommError`]s naming the rank, the operation and the step.

use zdevice::cuda::nccl::NcclError;

use super::is_capture_refusal;
use crate::{CommError, RankInfo, Silent};

/// Converts a zdevice NCCL error met by rank `info.rank` in `op` of `step`.
pub(super) fn convert(e: NcclError, info: RankInfo, op: &'static str, step: u64) -> CommError {
    let rank = info.rank;
    if let Some(call) = is_capture_refusal(&e) {
        return CommError::CaptureIllegal { call };
    }
    match e {
        NcclError::Library(source) => CommError::Library(source),
        NcclError::VersionTooOld { found, needed } => CommError::VersionTooOld { found, needed },
        NcclError::Timeout { deadline, .. } => CommError::Timeout {
            rank,
            op,
            step,
            waited_for: deadline,
            silent: Silent::of(
                info,
                None,
                "NCCL does not say which peer its kernel waits for",
            ),
        },
        NcclError::Async {
            call,
            code,
            name,
            detail,
        } => {
            // A remote or system error is how NCCL reports a peer that failed or vanished.
            let peer = matches!(
                name,
                "ncclRemoteError" | "ncclSystemError" | "ncclUnhandledCudaError"
            );
            if peer {
                // NCCL does not say which peer: the candidates (of two ranks, the other one). A
                // remote error is a peer's; a system error may be this rank's own as well.
                let silent = Silent::of(info, None, "NCCL does not say which peer");
                let who = match name {
                    "ncclRemoteError" => format!("{silent} vanished or failed"),
                    _ => format!("{silent} may have vanished or failed (or this rank's system)"),
                };
                CommError::PeerFailed {
                    rank,
                    op,
                    step,
                    detail: with_detail(&format!("{who}: {call}: {name} ({code})"), &detail),
                }
            } else {
                CommError::Nccl {
                    rank,
                    op,
                    step,
                    code: i32::try_from(code).unwrap_or(i32::MAX),
                    name: with_detail(name, &detail),
                }
            }
        }
        NcclError::Call {
            call,
            code,
            name,
            detail,
        } => CommError::Nccl {
            rank,
            op,
            step,
            code: i32::try_from(code).unwrap_or(i32::MAX),
            name: with_detail(&format!("{name} from {call}"), &detail),
        },
        NcclError::Aborted { call } => CommError::PeerFailed {
            rank,
            op,
            step,
            detail: format!(
                "{call}: the communicator was aborted after an earlier failure; the job cannot go on"
            ),
        },
        NcclError::NotNative { driver } => CommError::NotCuda { driver },
        NcclError::InvalidArgument { call, reason } => CommError::InvalidArgument {
            op,
            reason: format!("{call}: {reason}"),
        },
        NcclError::Device(source) => CommError::Device { op, source },
        other => CommError::Nccl {
            rank,
            op,
            step,
            code: -1,
            name: other.to_string(),
        },
    }
}

fn with_detail(head: &str, detail: &str) -> String {
    if detail.is_empty() {
        head.to_string()
    } else {
        format!("{head}: {detail}")
    }
}
