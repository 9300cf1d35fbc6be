//! Optimiser utilities: zero_grad, the global norm and clipping by it, SGD, and AdamW's
//! [lr, t] slot (a schedule's rate reaches the kernel through device memory).

use zcompute::{Backend, CpuBackend};
use zgrad::{AdamW, AdamWHyper, Sgd, Var, clip_grad_norm, grad_norm, zero_grad};

const B: CpuBackend = CpuBackend;

fn params() -> Vec<Var<CpuBackend, f64>> {
    let a = Var::parameter_from(&B, &[1.0, 2.0], &[2]).unwrap();
    let b = Var::parameter_from(&B, &[3.0], &[1]).unwrap();
    B.upload_into(&[3.0, 4.0], a.grad().unwrap()).unwrap();
    B.upload_into(&[12.0], b.grad().unwrap()).unwrap();
    vec![a, b]
}

fn grads(ps: &[Var<CpuBackend, f64>]) -> Vec<f64> {
    ps.iter()
        .flat_map(|p| B.download(p.grad().unwrap()).unwrap())
        .collect()
}

#[test]
fn global_norm_over_every_gradient() {
    let ps = params();
    assert_eq!(
        B.download(&grad_norm(&B, &ps).unwrap()).unwrap(),
        vec![13.0]
    );
}

#[test]
fn clipping_scales_to_the_max_norm_and_returns_the_old_norm() {
    let ps = params();
    let norm = clip_grad_norm(&B, &ps, 6.5).unwrap();
    assert_eq!(B.download(&norm).unwrap(), vec![13.0]);
    let g = grads(&ps);
    let scale = 6.5 / (13.0 + 1e-6);
    for (got, want) in g.iter().zip([3.0, 4.0, 12.0]) {
        assert!((got - want * scale).abs() < 1e-12);
    }
    // Below the limit nothing changes.
    let ps = params();
    clip_grad_norm(&B, &ps, 100.0).unwrap();
    assert_eq!(grads(&ps), vec![3.0, 4.0, 12.0]);
}

#[test]
fn zero_grad_zeroes() {
    let ps = params();
    zero_grad(&B, &ps).unwrap();
    assert_eq!(grads(&ps), vec![0.0; 3]);
}

#[test]
fn sgd_with_weight_decay() {
    let ps = params();
    Sgd { weight_decay: 0.5 }.step(&B, &ps, 0.1).unwrap();
    // p - lr (g + wd p)
    assert_eq!(
        ps[0].to_vec(&B).unwrap(),
        vec![1.0 - 0.1 * 3.5, 2.0 - 0.1 * 5.0]
    );
    assert_eq!(ps[1].to_vec(&B).unwrap(), vec![3.0 - 0.1 * 13.5]);
    assert_eq!(ps[0].version(), 1);
}

#[test]
fn adamw_reads_rate_and_step_from_its_slot() {
    let ps = params();
    let mut opt = AdamW::new(
        &B,
        &ps,
        AdamWHyper {
            weight_decay: 0.0,
            ..AdamWHyper::default()
        },
    )
    .unwrap();
    opt.step(&B, &ps, 0.1).unwrap();
    // Step 1 from zero moments moves each parameter by lr * g / (|g| + eps): about lr.
    let p = ps[0].to_vec(&B).unwrap();
    assert!(
        (p[0] - 0.9).abs() < 1e-6 && (p[1] - 1.9).abs() < 1e-6,
        "{p:?}"
    );
    let slot = B.download(&opt.tensors().slot).unwrap();
    assert_eq!(slot, vec![0.1, 1.0, 0.0], "[lr, t, gate]");
    opt.step(&B, &ps, 0.05).unwrap();
    assert_eq!(
        B.download(&opt.tensors().slot).unwrap(),
        vec![0.05, 2.0, 0.0]
    );
    assert_eq!(opt.step_count(), 2);
    let state = opt.export(&B, &["a".into(), "b".into()]).unwrap();
    assert_eq!(state.step, 2);
    assert_eq!(state.moments[1].name, "b");
    let mut fresh = AdamW::new(&B, &ps, AdamWHyper::default()).unwrap();
    fresh.import(&B, &state).unwrap();
    assert_eq!(fresh.export(&B, &["a".into(), "b".into()]).unwrap(), state);
}
