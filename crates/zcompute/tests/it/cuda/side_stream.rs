//! The side stream (`zcompute::cuda::SideStream`): work queued on it after a fork sees what the
//! engine stream queued before, and the engine after a join sees what the side queued, eagerly
//! and inside a captured graph on every replay; a capture whose body forks without joining
//! fails (904) and leaves the backend eager. Generic over the driver: the mock suite runs every
//! body, the gpu suite the first two on CUDA device 0.

use zcompute::cuda::SideStream;
use zcompute::{Backend, BinaryOp, Capture, ComputeError, CudaBackend, CudaTensor};
use zdevice::{Driver, StreamPriority};

const N: usize = 1000;

/// Fills `y` with 2.0 on the side stream (a 32-bit memset: one node, any driver).
fn twos_on_side<D: Driver>(b: &CudaBackend<D>, side: &SideStream<D>, y: &CudaTensor) {
    let ptr = b.device_ptr("test", y).expect("y's address");
    side.device()
        .memset_d32_async(ptr, 2.0f32.to_bits(), N as u64, side.stream())
        .expect("memset on the side stream");
}

fn xs() -> Vec<f32> {
    (0..N).map(|i| i as f32 * 0.5).collect()
}

/// Engine: y := 5; side (after the fork): y := 2; engine (after the join): out := x + y. Without
/// the fork and join the side's memset would not be ordered with either engine op.
pub fn fork_and_join_order_both_streams<D: Driver>(b: &CudaBackend<D>) {
    let side = SideStream::new(b).expect("side stream");
    let x = b.upload(&xs(), &[N]).expect("x");
    let y = b.zeros(&[N]).expect("y");
    b.fill(&y, 5.0).expect("fill on the engine stream");
    side.fork().expect("fork");
    twos_on_side(b, &side, &y);
    side.join().expect("join");
    let out = b.add(&x, &y).expect("add on the engine stream");
    let got = b.download(&out).expect("download");
    let want: Vec<f32> = xs().iter().map(|v| v + 2.0).collect();
    assert_eq!(got, want);
    side.synchronize().expect("the side stream drains");
}

/// The same body captured: both streams' work is in the graph, and every replay runs it again
/// (y is reset and x refilled between replays). The side stream of priority `priority`.
pub fn captured_fork_and_join_replay<D: Driver>(b: &CudaBackend<D>, priority: StreamPriority) {
    let side = std::rc::Rc::new(SideStream::with_priority(b, priority).expect("side stream"));
    let x = b.upload(&xs(), &[N]).expect("x");
    let y = b.zeros(&[N]).expect("y");
    let out = b.zeros(&[N]).expect("out");
    let body = {
        let (b, side, x, y, out) = (b.clone(), side.clone(), x.clone(), y.clone(), out.clone());
        Box::new(move || {
            b.fill(&y, 5.0)?;
            side.fork()?;
            twos_on_side(&b, &side, &y);
            side.join()?;
            b.copy_into(&b.add(&x, &y)?, &out)
        })
    };
    let mut graph = b.capture(body).expect("capture with a side stream");
    for r in 1..=3 {
        let fresh: Vec<f32> = xs().iter().map(|v| v * r as f32).collect();
        b.upload_into(&fresh, &x).expect("refill x");
        b.upload_into(&vec![0.0; N], &y).expect("reset y");
        b.replay(&mut graph).expect("replay");
        let got = b.download(&out).expect("download");
        let want: Vec<f32> = fresh.iter().map(|v| v + 2.0).collect();
        assert_eq!(got, want, "replay {r}");
    }
}

/// On the simulator: the side stream has the priority asked for, and the captured graph is
/// instantiated to keep each kernel's (the side's against the engine's).
fn side_priority_is_kept_in_the_graph(priority: StreamPriority, want: i32) {
    let b = super::mock();
    let side = SideStream::with_priority(&b, priority).expect("side stream");
    let sim = b.device().driver();
    assert_eq!(sim.stream_priority(side.stream()), Some(want));
    assert_eq!(sim.stream_priority(b.device().stream()), Some(0));
    let before = sim.live_execs().len();
    let y = b.zeros(&[N]).expect("y");
    let body = {
        let (b2, y) = (b.clone(), y.clone());
        Box::new(move || b2.fill(&y, 3.0))
    };
    let graph = b.capture(body).expect("capture");
    let execs = sim.live_execs();
    assert_eq!(execs.len(), before + 1);
    let flags = sim.exec_flags(execs[before]).expect("the graph's flags");
    assert!(flags.use_node_priority, "{flags:?}");
    drop(graph);
}

/// A body that forks and never joins: the capture fails, naming the unjoined stream's code,
/// and the backend is eager again (a plain op runs).
pub fn capture_without_the_join_fails<D: Driver>(b: &CudaBackend<D>) {
    let side = std::rc::Rc::new(SideStream::new(b).expect("side stream"));
    let y = b.zeros(&[N]).expect("y");
    let body = {
        let (b, side, y) = (b.clone(), side.clone(), y.clone());
        Box::new(move || {
            side.fork()?;
            twos_on_side(&b, &side, &y);
            Ok(())
        })
    };
    let err = b
        .capture(body)
        .map(drop)
        .expect_err("an unjoined capture fails");
    assert!(
        format!("{err:?}").contains("UNJOINED"),
        "the error names the unjoined capture: {err:?}"
    );
    side.synchronize().expect("the side stream drains");
    b.fill(&y, 1.0).expect("eager again");
    assert_eq!(b.download(&y).expect("download"), vec![1.0; N]);
}

/// The kernels the side stream runs itself: after a fork, the product of what the engine
/// stream wrote (a rank-0 loss times a share, into a slot of a larger buffer) and a range's
/// partial sums of squares; after the join the engine stream finishes the norm with the last
/// range: the engine-only results, bit for bit. The tensors the side kernels touch stay
/// allocated until the join, though their handles are dropped right after the launches.
pub fn side_kernels_run_beside_the_engine<D: Driver>(b: &CudaBackend<D>) {
    let side = SideStream::new(b).expect("side stream");
    let data: Vec<f32> = (0..3 * N).map(|i| ((i as f32) * 0.37).sin()).collect();
    let x = b.upload(&data, &[3 * N]).expect("x");
    let (head, tail) = (2 * N, N);
    // Beside the engine, fewer partials than the backend prefers (fewer blocks, longer).
    let counts = [b.norm_parts(head).min(4), b.norm_parts(tail)];
    let slot_buffer = b.zeros(&[4]).expect("slot buffer");
    let slot = slot_buffer
        .narrow(0, 2, 1)
        .expect("slot")
        .reshape(&[])
        .expect("rank 0");
    // Engine-only, for the bits.
    let want_parts = b.zeros(&[counts[0] + counts[1]]).expect("parts");
    let range = |at, n| x.narrow(0, at, n).expect("range");
    b.sum_squares_into(
        &range(0, head),
        &want_parts.narrow(0, 0, counts[0]).expect("head"),
    )
    .expect("engine partials");
    let want_norm = b
        .norm_of_parts(&range(head, tail), &want_parts, counts[0])
        .expect("engine norm");
    let live = || b.arena().diagnostics().bytes_by_class.total();
    let parts = b.zeros(&[counts[0] + counts[1]]).expect("parts");
    let before = live();
    {
        let loss = b.upload(&[1.5], &[]).expect("loss");
        let share = b.upload(&[0.25], &[]).expect("share");
        let head_parts = parts.narrow(0, 0, counts[0]).expect("head partials");
        side.fork().expect("fork");
        side.binary_into(b, BinaryOp::Mul, &loss, &share, &slot)
            .expect("product beside");
        side.sum_squares_into(b, &range(0, head), &head_parts)
            .expect("partials beside");
    }
    assert!(
        live() > before,
        "the side kernels' tensors are held until the join"
    );
    side.join().expect("join");
    assert_eq!(live(), before, "the join lets them go");
    let norm = b
        .norm_of_parts(&range(head, tail), &parts, counts[0])
        .expect("norm after the join");
    let bits = |t: &CudaTensor| {
        b.download(t)
            .expect("download")
            .iter()
            .map(|v| v.to_bits())
            .collect::<Vec<_>>()
    };
    assert_eq!(bits(&norm), bits(&want_norm), "the norm's bits");
    assert_eq!(bits(&parts), bits(&want_parts), "the partials' bits");
    assert_eq!(
        b.download(&slot_buffer).expect("slot"),
        [0.0, 0.0, 0.375, 0.0]
    );
}

/// What the side stream's kernels refuse, before launching anything: views (their kernels
/// address dense memory), operands of other shapes, partials of the wrong count.
pub fn side_kernels_refuse_what_they_cannot_address<D: Driver>(b: &CudaBackend<D>) {
    let side = SideStream::new(b).expect("side stream");
    let m = b.zeros(&[4, 6]).expect("m");
    let view = m.transpose(0, 1).expect("view");
    let dense = b.zeros(&[6, 4]).expect("dense");
    let out = b.zeros(&[6, 4]).expect("out");
    let err = side
        .binary_into(b, BinaryOp::Mul, &view, &dense, &out)
        .expect_err("a view");
    assert!(matches!(err, ComputeError::NotContiguous { .. }), "{err:?}");
    let row = b.zeros(&[4]).expect("row");
    let err = side
        .binary_into(b, BinaryOp::Mul, &row, &dense, &out)
        .expect_err("a broadcast");
    assert!(matches!(err, ComputeError::ShapeMismatch { .. }), "{err:?}");
    let parts = b.zeros(&[zcompute::MAX_NORM_PARTS + 1]).expect("parts");
    let err = side
        .sum_squares_into(b, &dense.reshape(&[24]).expect("flat"), &parts)
        .expect_err("too many partials");
    assert!(
        matches!(err, ComputeError::LengthMismatch { .. }),
        "{err:?}"
    );
    side.join().expect("nothing to join but the events");
}

/// The side kernels inside a captured body, replayed: every replay writes the product and the
/// partials again from the inputs of that replay, and the norm after the join is the
/// engine-only one.
pub fn captured_side_kernels_replay<D: Driver>(b: &CudaBackend<D>) {
    let side = std::rc::Rc::new(SideStream::new(b).expect("side stream"));
    let x = b.zeros(&[2 * N]).expect("x");
    let counts = [b.norm_parts(N), b.norm_parts(N)];
    let parts = b.zeros(&[counts[0] + counts[1]]).expect("parts");
    let loss = b.zeros(&[]).expect("loss");
    let share = b.upload(&[0.5], &[]).expect("share");
    let slot = b.zeros(&[]).expect("slot");
    let norm = b.zeros(&[]).expect("norm");
    let body = {
        let (b, side) = (b.clone(), side.clone());
        let (x, parts, loss, share, slot, norm) = (
            x.clone(),
            parts.clone(),
            loss.clone(),
            share.clone(),
            slot.clone(),
            norm.clone(),
        );
        Box::new(move || {
            side.fork()?;
            side.binary_into(&b, BinaryOp::Mul, &loss, &share, &slot)?;
            side.sum_squares_into(&b, &x.narrow(0, 0, N)?, &parts.narrow(0, 0, counts[0])?)?;
            side.join()?;
            let n = b.norm_of_parts(&x.narrow(0, N, N)?, &parts, counts[0])?;
            b.copy_into(&n, &norm)
        })
    };
    let mut graph = b.capture(body).expect("capture with side kernels");
    for r in 1..=3 {
        let data: Vec<f32> = (0..2 * N).map(|i| ((i * r) as f32 * 0.01).cos()).collect();
        b.upload_into(&data, &x).expect("x");
        b.upload_into(&[r as f32], &loss).expect("loss");
        b.replay(&mut graph).expect("replay");
        assert_eq!(
            b.download(&slot).expect("slot"),
            [r as f32 * 0.5],
            "replay {r}"
        );
        let want = b.norm2(&x).expect("norm2");
        let (got, want) = (
            b.download(&norm).expect("norm")[0],
            b.download(&want).expect("want")[0],
        );
        assert!(
            (got - want).abs() <= 1e-5 * want,
            "replay {r}: {got} vs {want}"
        );
    }
}

mod mock {
    #[test]
    fn fork_and_join_order_both_streams() {
        super::fork_and_join_order_both_streams(&super::super::mock());
    }

    use zdevice::StreamPriority;

    #[test]
    fn captured_fork_and_join_replay() {
        super::captured_fork_and_join_replay(&super::super::mock(), StreamPriority::Normal);
    }

    #[test]
    fn captured_fork_and_join_replay_on_a_high_priority_side_stream() {
        super::captured_fork_and_join_replay(&super::super::mock(), StreamPriority::High);
    }

    #[test]
    fn side_priority_is_kept_in_the_graph() {
        super::side_priority_is_kept_in_the_graph(StreamPriority::High, -5);
        super::side_priority_is_kept_in_the_graph(StreamPriority::Normal, 0);
    }

    #[test]
    fn capture_without_the_join_fails() {
        super::capture_without_the_join_fails(&super::super::mock());
    }

    #[test]
    fn side_kernels_run_beside_the_engine() {
        super::side_kernels_run_beside_the_engine(&super::super::mock());
    }

    #[test]
    fn side_kernels_refuse_what_they_cannot_address() {
        super::side_kernels_refuse_what_they_cannot_address(&super::super::mock());
    }

    #[test]
    fn captured_side_kernels_replay() {
        super::captured_side_kernels_replay(&super::super::mock());
    }
}

#[cfg(feature = "gpu")]
mod gpu {
    #[test]
    fn gpu_fork_and_join_order_both_streams() {
        super::fork_and_join_order_both_streams(&super::super::gpu());
    }

    use zdevice::StreamPriority;

    #[test]
    fn gpu_captured_fork_and_join_replay() {
        super::captured_fork_and_join_replay(&super::super::gpu(), StreamPriority::Normal);
    }

    #[test]
    fn gpu_captured_fork_and_join_replay_on_a_high_priority_side_stream() {
        super::captured_fork_and_join_replay(&super::super::gpu(), StreamPriority::High);
    }

    #[test]
    fn gpu_side_kernels_run_beside_the_engine() {
        super::side_kernels_run_beside_the_engine(&super::super::gpu());
    }

    #[test]
    fn gpu_captured_side_kernels_replay() {
        super::captured_side_kernels_replay(&super::super::gpu());
    }
}
