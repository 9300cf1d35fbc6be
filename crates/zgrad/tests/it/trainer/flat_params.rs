//! The flat parameter and gradient buffers (issue 12): every parameter of an `XAsset` is a view
//! of one flat buffer and its gradient a view of another, at 64-element-aligned offsets with
//! zero padding; training over them matches training over separately allocated parameters; the
//! values are those the `nn` blocks' own `init` draws; two captured runs are bitwise identical.

use zcompute::{Backend, CpuBackend, CudaBackend};
use zdevice::{Device, DeviceConfig, SimConfig, SimDriver};
use zgrad::nn::{FeedForward, LayerNorm, Linear, QkNormAttention};
use zgrad::optim::{FLAT_ALIGN, padded};
use zgrad::rng::SplitMix64;
use zgrad::{
    GradError, StepSource, TrainSchedule, Trainer, TrainerConfig, Var, XAsset, XAssetConfig,
};
use zmem::{Arena, ArenaConfig};

const CPU: CpuBackend = CpuBackend;

fn small() -> XAssetConfig {
    XAssetConfig {
        features: 7,
        scales: 3,
        width: 8,
        heads: 2,
        ff: 12,
        layers: 1,
    }
}

fn mock() -> CudaBackend<SimDriver> {
    let sim = SimDriver::new(SimConfig {
        poison_on_free: true,
        ..SimConfig::with_capacity(256 << 20)
    });
    zcompute::cuda::twins::register(&sim);
    let dev = Device::open(
        sim,
        DeviceConfig {
            blas_workspace_bytes: 0,
            ..DeviceConfig::default()
        },
    )
    .expect("the simulated device opens");
    let arena = Arena::new(
        dev,
        ArenaConfig {
            poison: true,
            ..ArenaConfig::default()
        },
    )
    .expect("arena");
    let b = CudaBackend::new(arena).expect("backend");
    b.set_poison(true);
    b
}

fn batch(c: &XAssetConfig, n: usize, step: usize) -> (Vec<f64>, Vec<f64>) {
    let x = (0..n * c.scales * c.features)
        .map(|i| (((i + 13 * step) * 37 % 101) as f64 / 50.0) - 1.0)
        .collect();
    let y = (0..n).map(|i| ((i + step) % 2) as f64).collect();
    (x, y)
}

#[test]
fn init_draws_what_the_nn_blocks_draw() {
    let c = small();
    let model = XAsset::<CpuBackend, f64>::init(&CPU, c, 11).expect("model");
    let mut rng = SplitMix64::new(11);
    let d = c.width;
    let emb = Linear::<CpuBackend, f64>::init(&CPU, c.features, d, &mut rng).unwrap();
    let ln1 = LayerNorm::<CpuBackend, f64>::init(&CPU, d).unwrap();
    let attn = QkNormAttention::<CpuBackend, f64>::init(&CPU, d, c.heads, &mut rng).unwrap();
    let ln2 = LayerNorm::<CpuBackend, f64>::init(&CPU, d).unwrap();
    let ff = FeedForward::<CpuBackend, f64>::init(&CPU, d, c.ff, &mut rng).unwrap();
    let head = Linear::<CpuBackend, f64>::init(&CPU, d, 1, &mut rng).unwrap();
    let composed = [
        &emb.weight,
        &emb.bias,
        &ln1.weight,
        &ln1.bias,
        &attn.qkv.weight,
        &attn.qkv.bias,
        &attn.qn.weight,
        &attn.qn.bias,
        &attn.kn.weight,
        &attn.kn.bias,
        &attn.o.weight,
        &attn.o.bias,
        &ln2.weight,
        &ln2.bias,
        &ff.f1.weight,
        &ff.f1.bias,
        &ff.f2.weight,
        &ff.f2.bias,
        &head.weight,
        &head.bias,
    ];
    for ((name, p), want) in model.named_parameters().into_iter().zip(composed) {
        assert_eq!(p.shape(), want.shape(), "{name}");
        assert_eq!(
            p.to_vec(&CPU).unwrap(),
            want.to_vec(&CPU).unwrap(),
            "{name}"
        );
    }
}

#[test]
fn every_parameter_is_a_view_of_the_flat_buffers_at_an_aligned_offset() {
    let b = mock();
    let model = XAsset::<_, f32>::init(&b, small(), 5).expect("model");
    let set = model.parameter_set().expect("flat");
    let params = model.parameters();
    let total: usize = params.iter().map(|p| padded(p.value().numel())).sum();
    assert_eq!(set.len(), total);
    assert_eq!(set.offsets().len(), params.len());
    let flat = b.download(set.values()).unwrap();
    for (p, &off) in params.iter().zip(set.offsets()) {
        assert_eq!(off % FLAT_ALIGN, 0, "offset {off} is 256-byte aligned");
        assert!(p.value().shares_storage(set.values()));
        assert!(p.grad().unwrap().shares_storage(set.grads()));
        let n = p.value().numel();
        assert_eq!(&flat[off..off + n], &p.to_vec(&b).unwrap()[..]);
    }
    assert!(
        model.flat_gradients().unwrap().shares_storage(set.grads()),
        "flat_gradients is the set's buffer"
    );
}

/// The loss slot is the first element after the flat gradient buffer, in the same
/// allocation (`reduced` covers both), and nothing of the set reads it: with a NaN in the slot,
/// zero_grad, the norm and clipping give what they give without it, and leave it as it was.
#[test]
fn the_loss_slot_follows_the_gradients_and_no_optimiser_utility_reads_it() {
    let b = mock();
    let model = XAsset::<_, f32>::init(&b, small(), 5).expect("model");
    let set = model.parameter_set().expect("flat");
    let params = model.parameters();
    let (slot, reduced) = (set.loss_slot().unwrap(), set.reduced().unwrap());
    assert_eq!(reduced.shape(), [set.len() + 1]);
    assert_eq!(slot.layout().offset(), set.len());
    assert!(slot.shares_storage(set.grads()) && reduced.shares_storage(set.grads()));
    let grads: Vec<f32> = (0..set.len())
        .map(|i| {
            if i % 3 == 0 {
                (i % 7) as f32 * 0.25
            } else {
                0.0
            }
        })
        .collect();
    let norm_of = |with_nan: bool| {
        b.upload_into(&grads, set.grads()).unwrap();
        b.upload_into(&[if with_nan { f32::NAN } else { 0.0 }], &slot)
            .unwrap();
        let norm = zgrad::optim::clip_grad_norm(&b, &params, 0.5).unwrap();
        let clipped = b.download(set.grads()).unwrap();
        let left = b.download(&slot).unwrap()[0];
        zgrad::optim::zero_grad(&b, &params).unwrap();
        let after_zero = b.download(&slot).unwrap()[0];
        (
            b.download(&norm).unwrap()[0].to_bits(),
            clipped,
            left,
            after_zero,
        )
    };
    let (norm, clipped, _, _) = norm_of(false);
    let (norm_nan, clipped_nan, left, after_zero) = norm_of(true);
    assert!(
        f32::from_bits(norm).is_finite() && norm == norm_nan,
        "the norm reads no slot"
    );
    assert_eq!(clipped, clipped_nan, "clipping reads no slot");
    assert!(
        left.is_nan() && after_zero.is_nan(),
        "clipping and zero_grad leave the slot"
    );
}

/// Zeros outside every parameter's view of `flat`.
fn padding_is_zero(flat: &[f32], params: &[Var<CudaBackend<SimDriver>, f32>], offsets: &[usize]) {
    let mut inside = vec![false; flat.len()];
    for (p, &off) in params.iter().zip(offsets) {
        inside[off..off + p.value().numel()].fill(true);
    }
    for (i, (v, used)) in flat.iter().zip(inside).enumerate() {
        assert!(used || *v == 0.0, "padding element {i} is {v}");
    }
}

/// Three captured, clipped steps twice from the same start: the flat buffers have the same bits,
/// the padding stays zero, and `Trainer::gradients` is the buffer the gradients are views of.
#[test]
fn captured_runs_are_bitwise_identical_and_keep_the_padding_zero() {
    let c = small();
    let run = || {
        let b = mock();
        let model = XAsset::<_, f32>::init(&b, c, 9).expect("model");
        let cfg = TrainerConfig {
            schedule: TrainSchedule::Batched,
            capture: true,
            clip_grad: Some(0.05),
            ..TrainerConfig::default()
        };
        let mut t = Trainer::new(b.clone(), model, cfg).expect("trainer");
        for step in 0..3 {
            let (x, y) = batch(&c, 4, step);
            let x: Vec<f32> = x.iter().map(|&v| v as f32).collect();
            let y: Vec<f32> = y.iter().map(|&v| v as f32).collect();
            let r = t.step(StepSource::host(&x, &y, 4)).expect("step");
            assert!(r.captured || step == 0, "step {step} replayed a graph");
        }
        let set = t.model().parameter_set().expect("flat");
        let params = t.model().parameters();
        let values = b.download(&t.model().flat_parameters().unwrap()).unwrap();
        let grads = b.download(&t.model().flat_gradients().unwrap()).unwrap();
        padding_is_zero(&values, &params, set.offsets());
        padding_is_zero(&grads, &params, set.offsets());
        for (p, &off) in params.iter().zip(set.offsets()) {
            let g = b.download(p.grad().unwrap()).unwrap();
            assert_eq!(&grads[off..off + g.len()], &g[..], "gradient views");
        }
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        (bits(&values), bits(&grads))
    };
    assert_eq!(run(), run(), "two runs differ");
}

/// The model with every parameter replaced by a separately allocated copy (the per-tensor
/// path of every optimiser utility).
fn separate(model: &XAsset<CpuBackend, f64>) -> XAsset<CpuBackend, f64> {
    let mut m = model.clone();
    let copy = |v: &mut Var<CpuBackend, f64>| {
        *v = Var::parameter_from(&CPU, &v.to_vec(&CPU).unwrap(), v.shape()).unwrap();
    };
    let lin = |l: &mut zgrad::nn::Linear<CpuBackend, f64>| {
        copy(&mut l.weight);
        copy(&mut l.bias);
    };
    let ln = |l: &mut zgrad::nn::LayerNorm<CpuBackend, f64>| {
        copy(&mut l.weight);
        copy(&mut l.bias);
    };
    lin(&mut m.emb);
    lin(&mut m.head.linear);
    for block in &mut m.blocks {
        lin(&mut block.attn.qkv);
        lin(&mut block.attn.o);
        lin(&mut block.ff.f1);
        lin(&mut block.ff.f2);
        ln(&mut block.ln1);
        ln(&mut block.attn.qn);
        ln(&mut block.attn.kn);
        ln(&mut block.ln2);
    }
    m
}

/// Training over the flat buffers (one AdamW launch, fused norm and clipping) matches training
/// over separate parameters (per tensor) in both schedules, with clipping on.
#[test]
fn flat_training_matches_per_tensor_training() {
    let c = small();
    for schedule in [TrainSchedule::Batched, TrainSchedule::PerSample] {
        let flat = XAsset::<CpuBackend, f64>::init(&CPU, c, 21).expect("model");
        let per_tensor = separate(&flat);
        assert!(matches!(
            per_tensor.parameter_set(),
            Err(GradError::Config(_))
        ));
        let cfg = TrainerConfig {
            schedule,
            capture: false,
            clip_grad: Some(0.05),
            ..TrainerConfig::default()
        };
        let mut a = Trainer::new(CPU, flat, cfg).expect("flat trainer");
        let mut b = Trainer::new(CPU, per_tensor, cfg).expect("per-tensor trainer");
        for step in 0..3 {
            let (x, y) = batch(&c, 4, step);
            let (ra, rb) = (
                a.step(StepSource::host(&x, &y, 4)).unwrap(),
                b.step(StepSource::host(&x, &y, 4)).unwrap(),
            );
            assert!((ra.grad_norm - rb.grad_norm).abs() <= 1e-12 * rb.grad_norm);
        }
        for ((name, pa), (_, pb)) in a
            .model()
            .named_parameters()
            .into_iter()
            .zip(b.model().named_parameters())
        {
            for (x, y) in pa
                .to_vec(&CPU)
                .unwrap()
                .iter()
                .zip(pb.to_vec(&CPU).unwrap())
            {
                assert!((x - y).abs() <= 1e-12, "{schedule:?} {name}: {x} vs {y}");
            }
        }
    }
}

#[test]
fn a_parameter_view_refuses_a_mismatched_or_aliased_gradient() {
    let v = CPU.upload(&[1.0f64, 2.0], &[2]).unwrap();
    let g = CPU.upload(&[0.0f64; 3], &[3]).unwrap();
    assert!(matches!(
        Var::<CpuBackend, f64>::parameter_view(v.clone(), g),
        Err(GradError::BadInput(_))
    ));
    let alias = v.clone();
    assert!(matches!(
        Var::<CpuBackend, f64>::parameter_view(v, alias),
        Err(GradError::BadInput(_))
    ));
}
