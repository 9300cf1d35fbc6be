//! The side stream (`zcompute::cuda::SideStream`): work queued on it after a fork sees what the
//! engine stream queued before, and the engine after a join sees what the side queued, eagerly
//! and inside a captured graph on every replay; a capture whose body forks without joining
//! fails (904) and leaves the backend eager. Generic over the driver: the mock suite runs every
//! body, the gpu suite the first two on CUDA device 0.

use zcompute::cuda::SideStream;
use zcompute::{Backend, Capture, CudaBackend, CudaTensor};
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
}
