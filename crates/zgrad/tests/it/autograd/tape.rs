//! The tape's contract: versions on saved tensors, one backward per recording, no-grad mode,
//! and the memory classes of what it allocates (on the host backend with device-like memory
//! rules from tests/common), including the CPU twin of scenario C and its negative control.

use crate::common;

use common::SimBackend;
use rstest::rstest;
use zcompute::{AllocClass, Backend, CpuBackend, MatmulOpts};
use zgrad::{GradError, Tape, Var};

const BE: CpuBackend = CpuBackend;

fn param(data: &[f64], shape: &[usize]) -> Var<CpuBackend, f64> {
    Var::parameter_from(&BE, data, shape).unwrap()
}

#[rstest]
#[case::output_saved("tanh")]
#[case::input_saved("log")]
#[case::view_of_saved_input("matmul")]
fn an_in_place_write_to_a_saved_tensor_fails_backward_naming_the_op(#[case] op: &str) {
    let tape = Tape::new(&BE);
    let x = param(&[0.5, 1.5, 2.5, 3.5], &[2, 2]);
    let h = tape.scale(&x, 1.0).unwrap(); // a recorded intermediate we can write into
    let (y, victim) = match op {
        "tanh" => {
            let y = tape.tanh(&h).unwrap();
            (y.clone(), y)
        }
        "log" => (tape.log(&h).unwrap(), h.clone()),
        _ => {
            let y = tape.matmul(&h, &x, MatmulOpts::default()).unwrap();
            // Writing through a view of `h` bumps `h`'s version too.
            (y, tape.narrow(&h, 0, 1, 1).unwrap())
        }
    };
    let loss = tape.sum_all(&y).unwrap();
    victim.fill(&BE, 7.0).unwrap();
    let err = tape.backward(&loss).unwrap_err();
    match &err {
        GradError::ModifiedInPlace {
            op: named,
            then,
            now,
            ..
        } => {
            assert_eq!(*named, op);
            assert_eq!((*then, *now), (0, 1));
        }
        other => panic!("expected ModifiedInPlace, got {other}"),
    }
    assert!(
        err.to_string()
            .contains("modified by an in-place operation"),
        "{err}"
    );
}

#[test]
fn writes_before_saving_are_fine() {
    let tape = Tape::new(&BE);
    let x = param(&[0.5, 1.5], &[2]);
    x.fill(&BE, 0.25).unwrap();
    let loss = tape.sum_all(&tape.exp(&x).unwrap()).unwrap();
    tape.backward(&loss).unwrap();
    let g = BE.download(x.grad().unwrap()).unwrap();
    assert_eq!(g, vec![0.25f64.exp(); 2]);
}

#[test]
fn backward_consumes_the_nodes_and_a_second_backward_is_refused() {
    let tape = Tape::new(&BE);
    let x = param(&[1.0, 2.0], &[2]);
    let loss = tape.sum_all(&tape.mul(&x, &x).unwrap()).unwrap();
    assert!(tape.pending_nodes() > 0);
    tape.backward(&loss).unwrap();
    assert_eq!(
        tape.pending_nodes(),
        0,
        "saved tensors are dropped once consumed"
    );
    assert!(matches!(
        tape.backward(&loss),
        Err(GradError::BackwardTwice { op: "sum" })
    ));
}

#[test]
fn gradients_accumulate_until_zeroed() {
    let x = param(&[1.0, 2.0], &[2]);
    for _ in 0..2 {
        let tape = Tape::new(&BE);
        let loss = tape.sum_all(&tape.scale(&x, 3.0).unwrap()).unwrap();
        tape.backward(&loss).unwrap();
    }
    assert_eq!(BE.download(x.grad().unwrap()).unwrap(), vec![6.0, 6.0]);
    x.zero_grad(&BE).unwrap();
    assert_eq!(BE.download(x.grad().unwrap()).unwrap(), vec![0.0, 0.0]);
}

#[test]
fn no_grad_records_nothing() {
    let tape = Tape::no_grad(&BE);
    let x = param(&[1.0, 2.0], &[2]);
    let y = tape.sum_all(&tape.tanh(&x).unwrap()).unwrap();
    assert!(!y.requires_grad());
    assert_eq!(tape.pending_nodes(), 0);
    assert!(matches!(tape.backward(&y), Err(GradError::RootNotRecorded)));
}

#[test]
fn variables_of_another_tape_are_refused() {
    let a = Tape::new(&BE);
    let b = Tape::new(&BE);
    let x = param(&[1.0], &[1]);
    let y = a.exp(&x).unwrap();
    assert!(matches!(
        b.exp(&y),
        Err(GradError::ForeignVar { op: "exp", .. })
    ));
    assert!(matches!(b.backward(&y), Err(GradError::ForeignVar { .. })));
}

#[test]
fn seed_shape_must_match_the_root() {
    let tape = Tape::new(&BE);
    let x = param(&[1.0, 2.0], &[2]);
    let y = tape.exp(&x).unwrap();
    let seed = BE.full(&[3], 1.0).unwrap();
    assert!(matches!(
        tape.backward_with(&y, seed),
        Err(GradError::SeedShape { .. })
    ));
}

#[test]
fn maximum_splits_ties_like_pytorch() {
    let tape = Tape::new(&BE);
    let a = param(&[1.0, 2.0, 3.0], &[3]);
    let b = param(&[1.0, 5.0, 0.0], &[3]);
    let loss = tape.sum_all(&tape.maximum(&a, &b).unwrap()).unwrap();
    tape.backward(&loss).unwrap();
    assert_eq!(BE.download(a.grad().unwrap()).unwrap(), vec![0.5, 0.0, 1.0]);
    assert_eq!(BE.download(b.grad().unwrap()).unwrap(), vec![0.5, 1.0, 0.0]);
}

#[test]
fn gelu_gradient_at_zero_is_one_half() {
    let tape = Tape::new(&BE);
    let x = param(&[0.0], &[1]);
    let loss = tape.sum_all(&tape.gelu(&x).unwrap()).unwrap();
    tape.backward(&loss).unwrap();
    assert_eq!(BE.download(x.grad().unwrap()).unwrap(), vec![0.5]);
}

/// A small two-layer computation on the sim backend; returns the gradient of `w`.
fn two_layers(b: &SimBackend<f64>, protected: bool, reset_between: bool) -> Vec<f64> {
    let prev = b.set_alloc_class(AllocClass::Persistent);
    let w = Var::parameter_from(b, &[0.3, -0.2, 0.5, 0.1, 0.7, -0.4], &[3, 2]).unwrap();
    b.set_alloc_class(prev);
    b.begin_step().unwrap();
    let x = Var::constant(b.upload(&[1.0, 2.0, -1.0, 0.5, 0.0, 3.0], &[2, 3]).unwrap());
    let tape = if protected {
        Tape::new(b)
    } else {
        Tape::unprotected(b)
    };
    let h = tape
        .tanh(&tape.matmul(&x, &w, MatmulOpts::default()).unwrap())
        .unwrap();
    let loss = tape.sum_all(&tape.mul(&h, &h).unwrap()).unwrap();
    if reset_between {
        // The engine this project replaces reclaimed the arena here: every scratch buffer of the
        // step is handed out again (poisoned by the sim backend).
        b.end_step().unwrap();
        b.begin_step().unwrap();
    }
    tape.backward(&loss).unwrap();
    b.end_step().unwrap();
    b.download(w.grad().unwrap()).unwrap()
}

#[test]
fn saved_tensors_survive_a_step_reset_between_forward_and_backward() {
    let reference = two_layers(&SimBackend::new(), true, false);
    let b = SimBackend::new();
    let got = two_layers(&b, true, true);
    assert_eq!(got, reference);
    assert!(b.log.poisoned.get() > 0, "the reset did reclaim scratch");
    assert!(b.allocs(AllocClass::Saved) > 0);
}

#[test]
fn negative_control_saved_tensors_in_scratch_are_corrupted_by_the_reset() {
    let reference = two_layers(&SimBackend::new(), false, false);
    let got = two_layers(&SimBackend::new(), false, true);
    assert!(reference.iter().all(|v| v.is_finite()));
    assert!(
        got.iter().any(|v| v.is_nan()),
        "unprotected saved tensors were reused: {got:?}"
    );
}

#[test]
fn backward_temporaries_are_scratch_and_forward_outputs_saved() {
    let b = SimBackend::<f64>::new();
    b.begin_step().unwrap();
    let prev = b.set_alloc_class(AllocClass::Persistent);
    let w = Var::parameter_from(&b, &[0.3, -0.2, 0.5, 0.1], &[2, 2]).unwrap();
    b.set_alloc_class(prev);
    let tape = Tape::new(&b);
    let y = tape.tanh(&w).unwrap();
    assert_eq!(b.storage_class(y.value()), Some(AllocClass::Saved));
    let loss = tape.sum_all(&y).unwrap();
    let scratch_before = b.allocs(AllocClass::Scratch);
    let saved_before = b.allocs(AllocClass::Saved);
    tape.backward(&loss).unwrap();
    assert!(b.allocs(AllocClass::Scratch) > scratch_before);
    assert_eq!(
        b.allocs(AllocClass::Saved),
        saved_before,
        "backward saves nothing"
    );
    assert_eq!(
        b.storage_class(w.grad().unwrap()),
        Some(AllocClass::Persistent)
    );
    assert_eq!(
        b.alloc_class(),
        AllocClass::Scratch,
        "the class is restored"
    );
    b.end_step().unwrap();
}

/// `backward_hooked` hands each parameter's gradient buffer over once, as soon as no node left
/// adds to it, holding its final value then: in `mean(x·w1·w2·w3 + x·w1)` backward finishes
/// w3, then w2, then w1 (w1's last contribution is the first product); a parameter the loss
/// does not use is never handed over.
#[test]
fn backward_hooked_hands_each_gradient_over_once_when_it_is_final() {
    let tape = Tape::new(&BE);
    let x = Var::constant(BE.upload(&[0.5, -1.0, 2.0], &[3]).unwrap());
    let ws: Vec<_> = (0..4)
        .map(|i| param(&[1.0 + f64::from(i), -0.5, 0.25 * f64::from(i)], &[3]))
        .collect();
    let h1 = tape.mul(&x, &ws[0]).unwrap();
    let h2 = tape.mul(&h1, &ws[1]).unwrap();
    let h3 = tape.mul(&h2, &ws[2]).unwrap();
    let loss = tape.mean_all(&tape.add(&h3, &h1).unwrap()).unwrap();
    let seed = BE.upload(&[1.0], &[]).unwrap();
    let mut handed: Vec<(usize, Vec<f64>)> = Vec::new();
    tape.backward_hooked(&loss, seed, &mut |g| {
        let which = ws
            .iter()
            .position(|w| w.grad().unwrap().shares_storage(g))
            .expect("a parameter's buffer");
        handed.push((which, BE.download(g)?));
        Ok(())
    })
    .unwrap();
    let order: Vec<usize> = handed.iter().map(|(i, _)| *i).collect();
    assert_eq!(order, [2, 1, 0]);
    for (i, at_hand_over) in &handed {
        let now = BE.download(ws[*i].grad().unwrap()).unwrap();
        assert_eq!(at_hand_over, &now, "w{}: final when handed over", i + 1);
    }
}
