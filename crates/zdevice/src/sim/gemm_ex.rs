//! `cublasGemmStridedBatchedEx` on the simulated device (issue 42): the mixed-precision product.
//!
//! The emulation of each mode: A and B are read as the mode says (float32; float32 rounded to
//! TF32, 10 significand bits, ties to even; or bf16 elements widened exactly), each product
//! `a·b` is formed and added to a float32 accumulator in order of `k`, and
//! `C = alpha·acc + beta·C` is rounded to float32. Under TF32 and bf16 every product of two
//! operands is exact in float32 (11- or 8-bit significands), so only the additions round, as on
//! tensor cores. cuBLAS accumulates in an order of its own (tiles, split-K, fused
//! multiply-adds), so a device product agrees with this one within float32 accumulation error,
//! not bit for bit: tests compare the two with a tolerance. When `beta == 0`, C is not read;
//! when `alpha == 0` or `k == 0`, A and B are not read (as the float32 gemm, `gemm.rs`).
//!
//! Capture: as `cublasSgemmStridedBatched` (`blas.rs`): the product's node plus cuBLAS's
//! auxiliary ones, 2 with a workspace set and 4 without.

use super::access::KernelFault;
use super::blas::INVALID_VALUE;
use super::gemm::{self, Dims};
use super::memory::Memory;
use super::ops::Op;
use super::state::{Cx, State};
use crate::driver::DriverResult;
use crate::rounding::{f32_from_bf16_bits, round_to_tf32};
use crate::types::{BlasHandle, DevicePtr, GemmEx, GemmMath};

impl State {
    /// Operands are not checked here (cuBLAS does not either): a bad address faults when the
    /// product runs, as a sticky 700.
    pub(crate) fn gemm_ex(&mut self, cx: &mut Cx, h: BlasHandle, g: &GemmEx) -> DriverResult<()> {
        let handle = self
            .blas
            .get(&h.0)
            .ok_or(cx.blas(super::blas::NOT_INITIALIZED))?;
        let (stream, workspace) = (handle.stream, handle.workspace.is_some());
        cx.stream = Some(stream);
        if let Err(reason) = gemm::validate(&g.gemm) {
            tracing::debug!(reason, "gemm ex rejected");
            return Err(cx.blas(INVALID_VALUE));
        }
        self.capture_or_queue_product(cx, stream, workspace, Op::GemmEx { gemm: *g })
    }
}

/// The address of element `index` of `bytes` bytes past `base`, or a fault if it leaves the
/// address space.
fn at(base: DevicePtr, index: i128, bytes: u64) -> Result<DevicePtr, KernelFault> {
    let addr = i128::from(base.0) + index * i128::from(bytes);
    u64::try_from(addr)
        .map(DevicePtr)
        .map_err(|_| KernelFault::Unmapped { ptr: base })
}

/// Reads a column-major `rows x cols` operand (leading dimension `ld`) as the mode's products
/// read it, as float32.
fn read_operand(
    mem: &Memory,
    base: DevicePtr,
    (rows, cols, ld): (usize, usize, usize),
    math: GemmMath,
) -> Result<Vec<f32>, KernelFault> {
    if rows == 0 || cols == 0 {
        return Ok(Vec::new());
    }
    let size = math.operand_bytes();
    let too_big = KernelFault::OutOfBounds {
        ptr: base,
        len: u64::MAX,
        size: 0,
    };
    let n = (cols - 1).checked_mul(ld).and_then(|e| e.checked_add(rows));
    let len = n
        .and_then(|n| (n as u64).checked_mul(size))
        .ok_or(too_big)?;
    let bytes = mem.read(base, len)?;
    Ok(match math {
        GemmMath::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        GemmMath::Tf32 => bytes
            .chunks_exact(4)
            .map(|c| round_to_tf32(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            .collect(),
        GemmMath::Bf16 => bytes
            .chunks_exact(2)
            .map(|c| f32_from_bf16_bits(u16::from_le_bytes([c[0], c[1]])))
            .collect(),
    })
}

fn read_c(
    mem: &Memory,
    base: DevicePtr,
    m: usize,
    n: usize,
    ld: usize,
) -> Result<Vec<f32>, KernelFault> {
    read_operand(mem, base, (m, n, ld), GemmMath::F32)
}

/// Runs the whole batched product against `mem`. `ex.gemm` has been validated.
pub(crate) fn run(mem: &mut Memory, ex: &GemmEx) -> Result<(), KernelFault> {
    let g = &ex.gemm;
    let size = ex.math.operand_bytes();
    let d = Dims::of(g);
    let Dims {
        m,
        n,
        k,
        batch,
        lda,
        ldb,
        ldc,
        ..
    } = d;
    let ((ra, ca), (rb, cb)) = (d.stored_a, d.stored_b);
    if m == 0 || n == 0 {
        return Ok(());
    }
    let skip_ab = g.alpha == 0.0 || k == 0;
    for i in 0..batch as i128 {
        // i128: batch (< 2^31) times a stride (< 2^63) cannot overflow.
        let a0 = at(g.a, i * i128::from(g.stride_a), size)?;
        let b0 = at(g.b, i * i128::from(g.stride_b), size)?;
        let c0 = at(g.c, i * i128::from(g.stride_c), 4)?;
        let (a, b) = if skip_ab {
            (Vec::new(), Vec::new())
        } else {
            (
                read_operand(mem, a0, (ra, ca, lda), ex.math)?,
                read_operand(mem, b0, (rb, cb, ldb), ex.math)?,
            )
        };
        let old_c = if g.beta == 0.0 {
            None
        } else {
            Some(read_c(mem, c0, m, n, ldc)?)
        };
        for j in 0..n {
            let mut col = Vec::with_capacity(m);
            for r in 0..m {
                let mut acc = 0.0f32;
                if !skip_ab {
                    for p in 0..k {
                        let (av, bv) = d.pair(&a, &b, (r, p, j));
                        acc += av * bv;
                    }
                }
                let mut v = g.alpha * acc;
                if let Some(c) = &old_c {
                    v += g.beta * c[r + j * ldc];
                }
                col.push(v);
            }
            let bytes: Vec<u8> = col.iter().flat_map(|v| v.to_le_bytes()).collect();
            mem.write(at(c0, (j * ldc) as i128, 4)?, &bytes)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::Driver;
    use crate::rounding::bf16_bits;
    use crate::sim::memory::AllocKind;
    use crate::types::{GemmF32, Transpose};

    fn put(mem: &mut Memory, bytes: &[u8]) -> DevicePtr {
        let p = mem
            .alloc(bytes.len() as u64, AllocKind::Device)
            .expect("alloc");
        mem.write(p, bytes).expect("write");
        p
    }

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn bf16_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| bf16_bits(*x).to_le_bytes()).collect()
    }

    fn get(mem: &Memory, p: DevicePtr, n: usize) -> Vec<f32> {
        let b = mem.read(p, n as u64 * 4).expect("read");
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    /// A 1x1 product over `k`: `a` (1 x k, ld 1) times `b` (k x 1).
    fn dot(math: GemmMath, a: DevicePtr, b: DevicePtr, c: DevicePtr, k: i32) -> GemmEx {
        GemmEx {
            math,
            gemm: GemmF32 {
                transa: Transpose::No,
                transb: Transpose::No,
                m: 1,
                n: 1,
                k,
                alpha: 1.0,
                a,
                lda: 1,
                stride_a: 0,
                b,
                ldb: k,
                stride_b: 0,
                beta: 0.0,
                c,
                ldc: 1,
                stride_c: 0,
                batch: 1,
            },
        }
    }

    #[test]
    fn each_mode_reads_its_operands_as_it_says() {
        // 1 + 2^-12 survives float32, rounds to 1 in TF32 and in bf16: the three modes give
        // three different sums of (1 + 2^-12)·1 + (1 + 2^-9)·1.
        let x = [1.0 + 2f32.powi(-12), 1.0 + 2f32.powi(-9)];
        let ones = [1.0f32; 2];
        let mut mem = Memory::new(1 << 20, true);
        let c = put(&mut mem, &f32_bytes(&[f32::NAN]));
        let (a32, b32) = (
            put(&mut mem, &f32_bytes(&x)),
            put(&mut mem, &f32_bytes(&ones)),
        );
        let (a16, b16) = (
            put(&mut mem, &bf16_bytes(&x)),
            put(&mut mem, &bf16_bytes(&ones)),
        );
        run(&mut mem, &dot(GemmMath::F32, a32, b32, c, 2)).expect("f32");
        assert_eq!(get(&mem, c, 1), [2.0 + 2f32.powi(-12) + 2f32.powi(-9)]);
        run(&mut mem, &dot(GemmMath::Tf32, a32, b32, c, 2)).expect("tf32");
        assert_eq!(get(&mem, c, 1), [2.0 + 2f32.powi(-9)]);
        // bf16's steps at 1 are 2^-7: both round to 1.
        run(&mut mem, &dot(GemmMath::Bf16, a16, b16, c, 2)).expect("bf16");
        assert_eq!(get(&mem, c, 1), [2.0]);
    }

    #[test]
    fn beta_adds_the_old_c_and_a_short_bf16_operand_faults() {
        let mut mem = Memory::new(1 << 20, true);
        let a = put(&mut mem, &bf16_bytes(&[2.0, 3.0]));
        let b = put(&mut mem, &bf16_bytes(&[4.0, 5.0]));
        let c = put(&mut mem, &f32_bytes(&[1.5]));
        let mut g = dot(GemmMath::Bf16, a, b, c, 2);
        g.gemm.beta = 1.0;
        run(&mut mem, &g).expect("bf16");
        assert_eq!(get(&mem, c, 1), [24.5]);
        // Three bf16 elements are 6 bytes: past the 4-byte operand.
        let err = run(&mut mem, &dot(GemmMath::Bf16, a, b, c, 3)).expect_err("A is short");
        assert!(matches!(err, KernelFault::OutOfBounds { .. }), "{err:?}");
    }

    /// Through the `Driver` trait, on the simulator and behind the fault-injecting wrapper:
    /// captured as the float32 gemm is (2 nodes with a workspace set), replayed to the eager
    /// result, and a planned cuBLAS failure of the call surfaces as the Ex call's error.
    fn captured_and_replayed_and_faulted<D: Driver>(d: &D, fault: impl FnOnce(&D)) {
        use crate::driver::DriverError;
        use crate::types::{CaptureMode, InstantiateFlags, StreamKind};
        d.init().unwrap();
        let s = d.stream_create(StreamKind::NonBlocking).unwrap();
        let h = d.blas_create().unwrap();
        d.blas_set_stream(h, s).unwrap();
        let ws = d.mem_alloc(1 << 20).unwrap();
        d.blas_set_workspace(h, ws, 1 << 20).unwrap();
        let (a, b, c) = (
            d.mem_alloc(8).unwrap(),
            d.mem_alloc(8).unwrap(),
            d.mem_alloc(4).unwrap(),
        );
        d.memcpy_htod(a, &bf16_bytes(&[2.0, 3.0])).unwrap();
        d.memcpy_htod(b, &bf16_bytes(&[4.0, 5.0])).unwrap();
        let g = dot(GemmMath::Bf16, a, b, c, 2);
        d.stream_begin_capture(s, CaptureMode::Global).unwrap();
        // SAFETY: the simulator checks every operand access.
        unsafe { d.gemm_strided_batched_ex(h, &g) }.unwrap();
        let graph = d.stream_end_capture(s).unwrap();
        assert_eq!(
            d.graph_node_count(graph).unwrap(),
            super::super::blas::NODES_WITH_WORKSPACE
        );
        let exec = d
            .graph_instantiate(graph, InstantiateFlags::default())
            .unwrap();
        d.memset_d8(c, 0, 4).unwrap();
        d.graph_launch(exec, s).unwrap();
        d.stream_synchronize(s).unwrap();
        let mut out = [0u8; 4];
        d.memcpy_dtoh(&mut out, c).unwrap();
        assert_eq!(f32::from_le_bytes(out), 23.0);
        fault(d);
        // SAFETY: as above.
        let err = unsafe { d.gemm_strided_batched_ex(h, &g) }.unwrap_err();
        assert!(
            matches!(
                err,
                DriverError::Cublas {
                    call: "cublasGemmStridedBatchedEx",
                    status: 13,
                    ..
                }
            ),
            "{err:?}"
        );
    }

    #[test]
    fn the_simulator_captures_replays_and_fails_the_ex_call() {
        use crate::sim::{SimDriver, calls};
        captured_and_replayed_and_faulted(&SimDriver::default(), |d| {
            d.fail_nth(calls::GEMM_STRIDED_BATCHED_EX, 1, crate::driver::CuCode(13));
        });
    }

    #[test]
    fn the_fault_wrapper_forwards_and_fails_the_ex_call() {
        use crate::faulty::FaultyDriver;
        use crate::sim::{SimDriver, calls};
        captured_and_replayed_and_faulted(&FaultyDriver::new(SimDriver::default()), |d| {
            d.controller()
                .fail_nth(calls::GEMM_STRIDED_BATCHED_EX, 1, crate::driver::CuCode(13));
        });
    }
}
