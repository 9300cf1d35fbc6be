//! The optimiser family (`OptimOps::sgd_step`, `zc_sgd_f32` in `kernels/train.cu`) against
//! the CPU backend, bit for bit (the kernel spells out the CPU's roundings): plain, momentum,
//! dampening, Nesterov and weight decay over four steps whose rate and step count change in
//! the slot, through dense and strided views; the gate; a captured step replayed with new
//! slot values; the refusals. Bodies generic over the driver: the simulated device here,
//! CUDA device 0 under `gpu`.

use super::bodies::{View, input};
use zcompute::{Backend, Capture, CpuBackend, CudaBackend, OptimOps, SgdConfig};
use zdevice::Driver;

const CPU: CpuBackend = CpuBackend;

fn bits<B: Backend<f32>>(b: &B, t: &zcompute::BTensor<B, f32>) -> Vec<u32> {
    let v: Vec<f32> = b.download(t).expect("download");
    v.iter().map(|x| x.to_bits()).collect()
}

/// The configurations PyTorch users reach for (torch.optim.SGD's arguments).
fn configs() -> [SgdConfig<f32>; 5] {
    let c = |momentum, dampening, weight_decay, nesterov| SgdConfig {
        momentum,
        dampening,
        weight_decay,
        nesterov,
    };
    [
        c(0.0, 0.0, 0.0, false),
        c(0.0, 0.0, 0.1, false),
        c(0.9, 0.0, 0.0, false),
        c(0.9, 0.25, 0.01, false),
        c(0.9, 0.0, 0.05, true),
    ]
}

pub fn sgd_matches_the_cpu<D: Driver>(dev: &CudaBackend<D>) {
    for cfg in configs() {
        for (shape, view) in [
            (&[1][..], View::Dense),
            (&[1025][..], View::Dense),
            (&[7, 193][..], View::Transposed),
        ] {
            let what = format!("{cfg:?} {shape:?} {view:?}");
            let p = input(dev, shape, view, 70, -1.0, 1.0);
            let pc = input(&CPU, shape, view, 70, -1.0, 1.0);
            let buf = input(dev, shape, view, 71, -9.0, 9.0);
            let bufc = input(&CPU, shape, view, 71, -9.0, 9.0);
            let slot = dev.upload(&[0.0, 0.0, 0.0], &[3]).expect("slot");
            let slot_c = CPU.upload(&[0.0f32, 0.0, 0.0], &[3]).expect("slot");
            for t in 1..=4u64 {
                let g = input(dev, shape, View::Dense, 71 + t, -1.0, 1.0);
                let gc = input(&CPU, shape, View::Dense, 71 + t, -1.0, 1.0);
                let lr = 0.1 / t as f32;
                dev.upload_into(&[lr, t as f32, 0.0], &slot).expect("slot");
                CPU.upload_into(&[lr, t as f32, 0.0], &slot_c)
                    .expect("slot");
                let b = (cfg.momentum != 0.0).then_some(&buf);
                let bc = (cfg.momentum != 0.0).then_some(&bufc);
                dev.sgd_step(&p, b, &g, &slot, &cfg).expect("sgd");
                CPU.sgd_step(&pc, bc, &gc, &slot_c, &cfg).expect("cpu");
            }
            assert_eq!(bits(dev, &p), bits(&CPU, &pc), "p {what}");
            assert_eq!(bits(dev, &buf), bits(&CPU, &bufc), "buf {what}");
        }
    }
}

/// A closed gate (NaN, infinity, 1) leaves `p` and the buffer untouched; 0 updates as a
/// two-element slot does.
pub fn sgd_gate<D: Driver>(dev: &CudaBackend<D>) {
    let cfg = configs()[3];
    let state = || {
        (
            input(dev, &[1025], View::Dense, 80, -1.0, 1.0),
            input(dev, &[1025], View::Dense, 81, -1.0, 1.0),
        )
    };
    let g = input(dev, &[1025], View::Dense, 82, -1.0, 1.0);
    for gate in [f32::NAN, f32::INFINITY, 1.0] {
        let (p, buf) = state();
        let before = [bits(dev, &p), bits(dev, &buf)];
        let slot = dev.upload(&[0.1, 2.0, gate], &[3]).expect("slot");
        dev.sgd_step(&p, Some(&buf), &g, &slot, &cfg).expect("sgd");
        assert_eq!([bits(dev, &p), bits(dev, &buf)], before, "gate {gate}");
    }
    let ((p, buf), (p2, buf2)) = (state(), state());
    let open = dev.upload(&[0.1, 2.0, 0.0], &[3]).expect("slot");
    let plain = dev.upload(&[0.1, 2.0], &[2]).expect("slot");
    dev.sgd_step(&p, Some(&buf), &g, &open, &cfg).expect("sgd");
    dev.sgd_step(&p2, Some(&buf2), &g, &plain, &cfg)
        .expect("sgd");
    assert_eq!(bits(dev, &p), bits(dev, &p2));
    assert_eq!(bits(dev, &buf), bits(dev, &buf2));
    assert_ne!(bits(dev, &p), bits(dev, &state().0), "a zero gate updates");
}

/// One captured step replayed with the rate and the step written into the slot before each
/// replay equals the CPU's eager steps bit for bit (the first step's buffer included).
pub fn sgd_replay_reads_slot<D: Driver>(dev: &CudaBackend<D>) {
    let cfg = configs()[4];
    let n = 37;
    let p = input(dev, &[n], View::Dense, 90, -1.0, 1.0);
    let buf = dev.zeros(&[n]).expect("buf");
    let g = input(dev, &[n], View::Dense, 91, -1.0, 1.0);
    let slot = dev.upload(&[0.05, 1.0, 0.0], &[3]).expect("slot");
    let pc = input(&CPU, &[n], View::Dense, 90, -1.0, 1.0);
    let bufc = Backend::<f32>::zeros(&CPU, &[n]).expect("buf");
    let gc = input(&CPU, &[n], View::Dense, 91, -1.0, 1.0);
    let slot_c = CPU.upload(&[0.05f32, 1.0, 0.0], &[3]).expect("slot");
    let body: Box<dyn FnMut() -> zcompute::Result<()>> = {
        let (be, p, buf, g, s) = (dev.clone(), p.clone(), buf.clone(), g.clone(), slot.clone());
        Box::new(move || be.sgd_step(&p, Some(&buf), &g, &s, &cfg))
    };
    // The capture's warm-up runs the body once: step 1, the buffer made from `d`.
    let mut graph = dev.capture(body).expect("capture sgd");
    CPU.sgd_step(&pc, Some(&bufc), &gc, &slot_c, &cfg)
        .expect("cpu step 1");
    for t in 2..=6u32 {
        let lr = 0.05 / t as f32;
        dev.upload_into(&[lr, t as f32, 0.0], &slot).expect("slot");
        CPU.upload_into(&[lr, t as f32, 0.0], &slot_c)
            .expect("slot");
        dev.replay(&mut graph).expect("replay");
        CPU.sgd_step(&pc, Some(&bufc), &gc, &slot_c, &cfg)
            .expect("cpu");
    }
    assert_eq!(bits(dev, &p), bits(&CPU, &pc), "p");
    assert_eq!(bits(dev, &buf), bits(&CPU, &bufc), "buf");
}

#[test]
fn sgd_matches_the_cpu_on_the_simulated_device() {
    sgd_matches_the_cpu(&super::mock());
}

#[test]
fn sgd_gate_on_the_simulated_device() {
    sgd_gate(&super::mock());
}

#[test]
fn sgd_replay_reads_slot_on_the_simulated_device() {
    sgd_replay_reads_slot(&super::mock());
}

/// What `torch.optim.SGD` refuses, and operands that do not fit, are refused alike on both
/// backends before anything runs.
#[test]
fn sgd_refuses_bad_arguments_alike() {
    let dev = super::mock();
    let c = |s: &[usize]| -> zcompute::CpuTensor<f32> { CPU.zeros(s).unwrap() };
    let d = |s: &[usize]| dev.zeros(s).unwrap();
    let ok = configs()[4];
    let bad = [
        SgdConfig {
            dampening: 0.1,
            ..ok
        },
        SgdConfig {
            momentum: 0.0,
            ..ok
        },
        SgdConfig {
            momentum: -0.5,
            nesterov: false,
            ..ok
        },
        SgdConfig {
            weight_decay: f32::NAN,
            ..ok
        },
    ];
    for cfg in bad {
        let e1 = CPU
            .sgd_step(&c(&[4]), Some(&c(&[4])), &c(&[4]), &c(&[3]), &cfg)
            .unwrap_err();
        let e2 = dev
            .sgd_step(&d(&[4]), Some(&d(&[4])), &d(&[4]), &d(&[3]), &cfg)
            .unwrap_err();
        assert_eq!(e1, e2, "{cfg:?}");
        assert!(
            matches!(e1, zcompute::ComputeError::InvalidScalar { op: "sgd", .. }),
            "{e1}"
        );
    }
    // A momentum without its buffer, a misshapen gradient, a slot of 4.
    let e1 = CPU.sgd_step(&c(&[4]), None, &c(&[4]), &c(&[3]), &ok);
    let e2 = dev.sgd_step(&d(&[4]), None, &d(&[4]), &d(&[3]), &ok);
    assert_eq!(e1.unwrap_err(), e2.unwrap_err());
    let e1 = CPU.sgd_step(&c(&[4]), Some(&c(&[4])), &c(&[5]), &c(&[3]), &ok);
    let e2 = dev.sgd_step(&d(&[4]), Some(&d(&[4])), &d(&[5]), &d(&[3]), &ok);
    assert_eq!(e1.unwrap_err(), e2.unwrap_err());
    let e1 = CPU.sgd_step(&c(&[4]), Some(&c(&[4])), &c(&[4]), &c(&[4]), &ok);
    let e2 = dev.sgd_step(&d(&[4]), Some(&d(&[4])), &d(&[4]), &d(&[4]), &ok);
    assert_eq!(e1.unwrap_err(), e2.unwrap_err());
    // The parameter as its own buffer.
    let p = d(&[4]);
    assert!(matches!(
        dev.sgd_step(&p, Some(&p), &d(&[4]), &d(&[3]), &ok),
        Err(zcompute::ComputeError::Aliased { op: "sgd", .. })
    ));
}

#[cfg(feature = "gpu")]
mod gpu {
    #[test]
    fn sgd_matches_the_cpu() {
        super::sgd_matches_the_cpu(&super::super::gpu());
    }

    #[test]
    fn sgd_gate() {
        super::sgd_gate(&super::super::gpu());
    }

    #[test]
    fn sgd_replay_reads_slot() {
        super::sgd_replay_reads_slot(&super::super::gpu());
    }
}
