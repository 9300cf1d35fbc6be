//! Graphs captured into one `GraphPool`: two shapes of the same sequence share one
//! reservation (counted once, at the larger), and replayed alternately with fresh inputs each
//! equals the CPU, since each writes its outputs outside the pool.

use super::bodies::{TOL, View, assert_close, input};
use crate::common::uniform;
use zcompute::{
    BTensor, Backend, Capture, CpuBackend, CpuTensor, CudaBackend, CudaGraph, GraphPool,
    MatmulOpts, UnaryOp,
};
use zdevice::Driver;

const CPU: CpuBackend = CpuBackend;

/// `out = tanh(x · wᵀ) + x`, written into `out` (allocated outside the capture).
fn sequence<B: Backend<f32>>(
    be: &B,
    x: &BTensor<B, f32>,
    w: &BTensor<B, f32>,
    out: &BTensor<B, f32>,
) -> zcompute::Result<()> {
    let opts = MatmulOpts {
        trans_a: false,
        trans_b: true,
    };
    let h = be.unary(UnaryOp::Tanh, &be.matmul(x, w, opts)?)?;
    be.copy_into(&be.add(&h, x)?, out)
}

/// One member: its input and output (outside the pool) and its graph.
struct Member<D: Driver> {
    rows: usize,
    x: BTensor<CudaBackend<D>, f32>,
    out: BTensor<CudaBackend<D>, f32>,
    graph: CudaGraph<D>,
}

fn member<D: Driver>(
    gpu: &CudaBackend<D>,
    pool: Option<&GraphPool>,
    w: &BTensor<CudaBackend<D>, f32>,
    rows: usize,
    n: usize,
) -> Member<D> {
    let x = input(gpu, &[rows, n], View::Dense, 50 + rows as u64, -1.0, 1.0);
    let out = gpu.zeros(&[rows, n]).expect("out");
    let body = {
        let (be, x, w, out) = (gpu.clone(), x.clone(), w.clone(), out.clone());
        Box::new(move || sequence(&be, &x, &w, &out))
    };
    let graph = match pool {
        Some(pool) => gpu.capture_in_pool(pool, body),
        None => gpu.capture(body),
    }
    .expect("capture");
    Member {
        rows,
        x,
        out,
        graph,
    }
}

/// Bytes of capture reservation each of two members of 64 and 24 rows holds, captured into
/// one pool or each alone; replayed alternately they equal the CPU either way. (Read from the
/// graphs, not the arena: the GPU suite's backend is shared by tests running beside this one.)
pub fn pooled_graphs_replay_alternately<D: Driver>(gpu: &CudaBackend<D>, pooled: bool) -> [u64; 2] {
    let n = 48;
    let w = input(gpu, &[n, n], View::Dense, 49, -0.5, 0.5);
    let wc = input(&CPU, &[n, n], View::Dense, 49, -0.5, 0.5);
    let pool = GraphPool::new();
    let mut members = [
        member(gpu, pooled.then_some(&pool), &w, 64, n),
        member(gpu, pooled.then_some(&pool), &w, 24, n),
    ];
    for round in 0..4u64 {
        for m in &mut members {
            let fresh: Vec<f32> = uniform(m.rows * n, 200 + round, -1.0, 1.0)
                .iter()
                .map(|&v| v as f32)
                .collect();
            gpu.upload_into(&fresh, &m.x).expect("refill the input");
            gpu.fill(&m.out, f32::NAN).expect("poison the output");
            gpu.replay(&mut m.graph).expect("replay");
        }
        // Both replays queued before either is read: the second ran through the memory the
        // first used, and the first's output is intact.
        for m in &members {
            let fresh: Vec<f32> = uniform(m.rows * n, 200 + round, -1.0, 1.0)
                .iter()
                .map(|&v| v as f32)
                .collect();
            let xc = CpuTensor::from_vec(fresh, &[m.rows, n]).expect("x");
            let oc = Backend::<f32>::zeros(&CPU, &[m.rows, n]).expect("o");
            sequence(&CPU, &xc, &wc, &oc).expect("cpu");
            assert_close(
                &format!("round {round}, {} rows", m.rows),
                gpu,
                &m.out,
                &oc,
                TOL,
            );
        }
    }
    if pooled {
        assert_eq!(
            (pool.members(), pool.bytes()),
            (2, members[0].graph.reserved_bytes())
        );
    }
    [
        members[0].graph.reserved_bytes(),
        members[1].graph.reserved_bytes(),
    ]
}

/// Pooled, both members hold the one reservation of the larger member alone; apart they hold
/// more between them.
pub fn a_pool_holds_the_larger_member<D: Driver>(gpu: &CudaBackend<D>) {
    let pooled = pooled_graphs_replay_alternately(gpu, true);
    let [large, small] = pooled_graphs_replay_alternately(gpu, false);
    assert!(small > 0 && small < large, "{small} {large}");
    assert_eq!(
        pooled,
        [large, large],
        "one reservation, the larger member's"
    );
}

/// A pooled body that stores a tensor it allocated (which would live in the shared memory) is
/// refused after its warm-up, with the backend eager and the pool untouched.
pub fn a_pooled_body_keeping_a_tensor_is_refused<D: Driver>(gpu: &CudaBackend<D>) {
    let x = input(gpu, &[4, 8], View::Dense, 60, -1.0, 1.0);
    let kept = std::rc::Rc::new(std::cell::RefCell::new(None));
    let body = {
        let (be, x, kept) = (gpu.clone(), x.clone(), kept.clone());
        Box::new(move || {
            *kept.borrow_mut() = Some(be.unary(UnaryOp::Neg, &x)?);
            Ok(())
        })
    };
    let pool = GraphPool::new();
    let err = gpu.capture_in_pool(&pool, body).expect_err("refused");
    assert!(
        matches!(
            err.cause(),
            zcompute::ComputeError::CaptureOutputInPool { tensors: 1 }
        ),
        "{err:?}"
    );
    assert_eq!((pool.members(), pool.bytes()), (0, 0));
    let eager = gpu
        .unary(UnaryOp::Neg, &x)
        .expect("eager after the refusal");
    assert_eq!(eager.numel(), 32);
}
