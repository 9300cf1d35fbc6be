//! `LinearOps::linear_backward_into`'s checks: bad arguments get the CPU backend's typed error
//! on the device too, before anything is written; the weight's and bias's gradient buffers
//! may be adjacent views of one flat buffer, not overlapping ones, nor in an input's memory.
//! Its results are checked by `linear_backward.rs`.

use zcompute::prelude::*;
use zcompute::{Activation, Backend, CpuBackend};

const CPU: CpuBackend = CpuBackend;

/// Bad arguments get the same typed error on the CPU and on the device, and leave the
/// gradient buffers as they were.
#[test]
fn bad_arguments_get_the_same_typed_error_on_both_backends() {
    use zcompute::ComputeError as E;
    let gpu = super::mock();
    let dev = |shape: &[usize]| gpu.zeros(shape).unwrap();
    let host = |shape: &[usize]| Backend::<f32>::zeros(&CPU, shape).unwrap();
    type Shapes<'a> = (
        &'a [usize],
        &'a [usize],
        &'a [usize],
        Activation,
        Option<&'a [usize]>,
    );
    type Case<'a> = (Shapes<'a>, fn(&E) -> bool);
    // (g, x, w, act, y) against dw [7, 5] and db [7].
    let cases: [Case<'_>; 6] = [
        (
            (&[3, 7], &[3, 5], &[7, 6], Activation::Identity, None),
            |e| matches!(e, E::ShapeMismatch { .. }),
        ),
        (
            (&[3, 7], &[4, 5], &[7, 5], Activation::Identity, None),
            |e| matches!(e, E::ShapeMismatch { .. }),
        ),
        (
            (&[3, 7], &[3, 5], &[7, 5], Activation::Tanh, Some(&[3, 6])),
            |e| matches!(e, E::ShapeMismatch { .. }),
        ),
        ((&[3, 7], &[3, 5], &[7, 5], Activation::Tanh, None), |e| {
            matches!(e, E::Unsupported { .. })
        }),
        (
            (
                &[3, 7],
                &[3, 5],
                &[7, 5],
                Activation::Identity,
                Some(&[3, 7]),
            ),
            |e| matches!(e, E::Unsupported { .. }),
        ),
        (
            (&[2, 3, 7], &[3, 5], &[7, 5], Activation::Identity, None),
            |e| matches!(e, E::Unsupported { .. }),
        ),
    ];
    for ((g, x, w, act, y), kind) in cases {
        let (dw, db) = (dev(&[7, 5]), dev(&[7]));
        gpu.fill(&dw, 1.0).unwrap();
        let d = gpu
            .linear_backward_into(
                &dev(g),
                &dev(x),
                Some(&dev(w)),
                (act, y.map(dev).as_ref()),
                (&dw, Some(&db)),
            )
            .unwrap_err();
        let c = CPU
            .linear_backward_into(
                &host(g),
                &host(x),
                Some(&host(w)),
                (act, y.map(host).as_ref()),
                (&host(&[7, 5]), Some(&host(&[7]))),
            )
            .unwrap_err();
        assert_eq!(d, c, "{g:?} {x:?} {w:?} {act:?} {y:?}");
        assert!(kind(&d), "{d}");
        assert_eq!(gpu.download(&dw).unwrap(), vec![1.0; 35], "dw untouched");
    }
    // dw and db as views of one flat buffer: adjacent is fine, overlapping is refused on both
    // backends; dw in the memory of an input (the weight, tanh's output) is refused.
    let check_flat = |db_start: usize| {
        let (flat, hflat) = (dev(&[40]), host(&[40]));
        let dw = flat.narrow(0, 0, 28).unwrap().reshape(&[7, 4]).unwrap();
        let db = flat.narrow(0, db_start, 7).unwrap();
        let hdw = hflat.narrow(0, 0, 28).unwrap().reshape(&[7, 4]).unwrap();
        let hdb = hflat.narrow(0, db_start, 7).unwrap();
        let (g, x, w, y) = (dev(&[3, 7]), dev(&[3, 4]), dev(&[7, 4]), dev(&[3, 7]));
        let d = gpu
            .linear_backward_into(
                &g,
                &x,
                Some(&w),
                (Activation::Tanh, Some(&y)),
                (&dw, Some(&db)),
            )
            .map(|gx| gx.map(|t| t.shape().to_vec()));
        let (hg, hx, hw, hy) = (host(&[3, 7]), host(&[3, 4]), host(&[7, 4]), host(&[3, 7]));
        let c = CPU
            .linear_backward_into(
                &hg,
                &hx,
                Some(&hw),
                (Activation::Tanh, Some(&hy)),
                (&hdw, Some(&hdb)),
            )
            .map(|gx| gx.map(|t| t.shape().to_vec()));
        assert_eq!(d, c, "db at {db_start}");
        d
    };
    assert_eq!(check_flat(28), Ok(Some(vec![3, 4])));
    assert!(matches!(
        check_flat(27),
        Err(E::Aliased {
            lhs: "dw",
            rhs: "db",
            ..
        })
    ));
    let w = dev(&[7, 4]);
    let (g, x) = (dev(&[3, 7]), dev(&[3, 4]));
    let e = gpu
        .linear_backward_into(&g, &x, Some(&w), (Activation::Identity, None), (&w, None))
        .unwrap_err();
    assert!(
        matches!(
            e,
            E::Aliased {
                lhs: "w",
                rhs: "dw",
                ..
            }
        ),
        "{e}"
    );
    let flat = dev(&[21 + 28]);
    let y_in_flat = flat.narrow(0, 0, 21).unwrap().reshape(&[3, 7]).unwrap();
    let dw = flat.narrow(0, 21, 28).unwrap().reshape(&[7, 4]).unwrap();
    let e = gpu
        .linear_backward_into(
            &g,
            &x,
            None,
            (Activation::Tanh, Some(&y_in_flat)),
            (&dw, None),
        )
        .unwrap_err();
    assert!(
        matches!(
            e,
            E::Aliased {
                lhs: "y",
                rhs: "dw",
                ..
            }
        ),
        "{e}"
    );
}
