//! GPU benchmark of the CUDA backend, one run: elementwise ops over 1 GiB against a
//! device-to-device copy, softmax and LayerNorm over [65536, 256] against a copy of the same
//! size, and matrix products at the XAsset shapes and at 8192³ (TF32 off). Prints one JSON
//! object per line, then a table. `benches/torch_ref.py` times the same with PyTorch; run both
//! in one device session and compare ratios.
//!
//! `cargo run --release -p zcompute --features gpu --example gpu_bench`
//!
//! With `--modes` (issue 42), only the products, each under `MathMode::F32`, `Tf32` and `Bf16`
//! (`PrecisionOps::matmul_mode`; the `_tf32` and `_bf16` rows): a bf16 row includes converting
//! both float32 operands to bf16 (`kernels/convert.cu`) on every call, as the op does today.
//!
//! `cargo run --release -p zcompute --features gpu --example gpu_bench -- --modes`
#![allow(clippy::print_stdout)]

use std::time::Duration;
use zcompute::{
    Backend, CudaBackend, CudaTensor, MathMode, MatmulOpts, PrecisionOps, Result, UnaryOp,
};
use zdevice::{CudaDriver, Device, DeviceConfig};
use zmem::{Arena, ArenaConfig};

type Gpu = CudaBackend<CudaDriver>;

/// Median milliseconds per call of `f` (5 timed rounds of `iters` calls after 3 warm-ups),
/// timed with CUDA events on the backend's stream.
fn time(gpu: &Gpu, iters: u32, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let dev = gpu.device();
    let err = |source: zdevice::DeviceError| zcompute::ComputeError::Device {
        op: "bench",
        source,
    };
    for _ in 0..3 {
        f()?;
    }
    let (start, end) = (
        dev.create_event(true).map_err(err)?,
        dev.create_event(true).map_err(err)?,
    );
    let mut rounds = Vec::new();
    for _ in 0..5 {
        dev.record_event(start, dev.stream()).map_err(err)?;
        for _ in 0..iters {
            f()?;
        }
        dev.record_event(end, dev.stream()).map_err(err)?;
        dev.wait_event(end).map_err(err)?;
        rounds.push(f64::from(dev.elapsed_ms(start, end).map_err(err)?) / f64::from(iters));
    }
    dev.destroy_event(start).map_err(err)?;
    dev.destroy_event(end).map_err(err)?;
    rounds.sort_by(f64::total_cmp);
    Ok(rounds[2])
}

struct Row {
    name: String,
    ms: f64,
    /// GB/s for memory-bound ops, TFLOP/s for products.
    rate: f64,
    unit: &'static str,
    /// Fraction of the matching copy's bandwidth (memory-bound ops).
    of_copy: Option<f64>,
}

fn print(row: &Row) {
    let of_copy = row
        .of_copy
        .map_or("null".to_string(), |r| format!("{r:.3}"));
    println!(
        "{{\"name\":\"{}\",\"ms\":{:.4},\"rate\":{:.2},\"unit\":\"{}\",\"of_copy\":{}}}",
        row.name, row.ms, row.rate, row.unit, of_copy
    );
}

fn copy_ms(gpu: &Gpu, x: &CudaTensor, y: &CudaTensor, iters: u32) -> Result<f64> {
    let dev = gpu.device();
    let (src, dst) = (x.storage().block().raw_ptr(), y.storage().block().raw_ptr());
    let bytes = x.numel() as u64 * 4;
    time(gpu, iters, || {
        dev.copy_dtod_async(dst, src, bytes, dev.stream())
            .map_err(|source| zcompute::ComputeError::Device { op: "copy", source })
    })
}

fn memory_bound(gpu: &Gpu, rows: &mut Vec<Row>) -> Result<()> {
    let n = 1usize << 28; // 1 GiB of f32
    let gib = (n * 4) as f64;
    let a = gpu.full(&[n], 0.5)?;
    let b = gpu.full(&[n], 0.25)?;
    let c = gpu.zeros(&[n])?;
    let copy = copy_ms(gpu, &a, &c, 10)?;
    let copy_bw = 2.0 * gib / copy / 1e6;
    let mut add_row = |name: &str, ms: f64, bytes: f64, base: f64| {
        let bw = bytes / ms / 1e6;
        rows.push(Row {
            name: name.into(),
            ms,
            rate: bw,
            unit: "GB/s",
            of_copy: Some(bw / base),
        });
    };
    add_row("copy_dtod_1GiB", copy, 2.0 * gib, copy_bw);
    let tanh = time(gpu, 10, || gpu.unary(UnaryOp::Tanh, &a).map(drop))?;
    add_row("tanh_1GiB", tanh, 2.0 * gib, copy_bw);
    let add = time(gpu, 10, || gpu.add(&a, &b).map(drop))?;
    add_row("add_1GiB", add, 3.0 * gib, copy_bw);
    drop((a, b, c));

    let shape = [65536usize, 256];
    let m = shape[0] * shape[1];
    let bytes = (m * 4) as f64;
    let x = gpu.upload(
        &(0..m)
            .map(|i| ((i % 251) as f32) * 0.01 - 1.0)
            .collect::<Vec<_>>(),
        &shape,
    )?;
    let y = gpu.zeros(&shape)?;
    let copy = copy_ms(gpu, &x, &y, 50)?;
    let copy_bw = 2.0 * bytes / copy / 1e6;
    add_row("copy_dtod_64MiB", copy, 2.0 * bytes, copy_bw);
    let sm = time(gpu, 50, || gpu.softmax_last(&x).map(drop))?;
    add_row("softmax_65536x256", sm, 2.0 * bytes, copy_bw);
    let w = gpu.full(&[256], 1.0)?;
    let bias = gpu.zeros(&[256])?;
    let ln = time(gpu, 50, || {
        gpu.layer_norm(&x, Some(&w), Some(&bias), 1e-5).map(drop)
    })?;
    add_row("layer_norm_65536x256", ln, 2.0 * bytes, copy_bw);
    Ok(())
}

/// (name, a shape, b shape, opts, iterations).
type Case = (&'static str, Vec<usize>, Vec<usize>, MatmulOpts, u32);

/// The products timed: XAsset with B=256, S=12 (3072 rows), forward and the weight-gradient
/// forms of backward, then the large square product.
fn product_cases() -> [Case; 10] {
    let nt = MatmulOpts::default();
    let tb = MatmulOpts {
        trans_a: false,
        trans_b: true,
    };
    let ta = MatmulOpts {
        trans_a: true,
        trans_b: false,
    };
    [
        (
            "emb_3072x193_x_256x193T",
            vec![3072, 193],
            vec![256, 193],
            tb,
            50,
        ),
        (
            "qkv_3072x256_x_768x256T",
            vec![3072, 256],
            vec![768, 256],
            tb,
            50,
        ),
        (
            "o_3072x256_x_256x256T",
            vec![3072, 256],
            vec![256, 256],
            tb,
            50,
        ),
        (
            "f1_3072x256_x_1024x256T",
            vec![3072, 256],
            vec![1024, 256],
            tb,
            50,
        ),
        (
            "f2_3072x1024_x_256x1024T",
            vec![3072, 1024],
            vec![256, 1024],
            tb,
            50,
        ),
        (
            "f1_dw_3072x1024T_x_3072x256",
            vec![3072, 1024],
            vec![3072, 256],
            ta,
            50,
        ),
        (
            "attn_qk_1024x12x64_x_1024x12x64T",
            vec![1024, 12, 64],
            vec![1024, 12, 64],
            tb,
            50,
        ),
        (
            "attn_av_1024x12x12_x_1024x12x64",
            vec![1024, 12, 12],
            vec![1024, 12, 64],
            nt,
            50,
        ),
        (
            "emb_dw_3072x256T_x_3072x193",
            vec![3072, 256],
            vec![3072, 193],
            ta,
            50,
        ),
        (
            "mm_8192x8192x8192",
            vec![8192, 8192],
            vec![8192, 8192],
            nt,
            3,
        ),
    ]
}

fn products(gpu: &Gpu, rows: &mut Vec<Row>, modes: &[MathMode]) -> Result<()> {
    for ((name, sa, sb, opts, iters), mode) in product_cases()
        .into_iter()
        .flat_map(|case| modes.iter().map(move |m| (case.clone(), *m)))
    {
        let fill = |shape: &[usize], seed: usize| -> Result<CudaTensor> {
            let n: usize = shape.iter().product();
            let data: Vec<f32> = (0..n)
                .map(|i| (((i * 7 + seed) % 97) as f32) * 0.01 - 0.48)
                .collect();
            gpu.upload(&data, shape)
        };
        let (a, b) = (fill(&sa, 1)?, fill(&sb, 2)?);
        let ms = time(gpu, iters, || gpu.matmul_mode(&a, &b, opts, mode).map(drop))?;
        let (_, m, k) = dims(&sa, opts.trans_a);
        let n = if opts.trans_b {
            sb[sb.len() - 2]
        } else {
            sb[sb.len() - 1]
        };
        let batch: usize = sa[..sa.len() - 2].iter().product();
        let flops = 2.0 * (batch * m * n * k) as f64;
        let name = match mode {
            MathMode::F32 => name.to_string(),
            other => format!("{name}_{}", other.name()),
        };
        rows.push(Row {
            name,
            ms,
            rate: flops / ms / 1e9,
            unit: "TFLOP/s",
            of_copy: None,
        });
    }
    Ok(())
}

/// (batch dims, m, k) of `a` read with `trans`.
fn dims(a: &[usize], trans: bool) -> (&[usize], usize, usize) {
    let (batch, rc) = a.split_at(a.len() - 2);
    if trans {
        (batch, rc[1], rc[0])
    } else {
        (batch, rc[0], rc[1])
    }
}

fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let driver = CudaDriver::load()?;
    let dev = Device::open(
        driver,
        DeviceConfig {
            sync_deadline: Duration::from_secs(120),
            ..DeviceConfig::default()
        },
    )?;
    println!("# device: {}", dev.info().name);
    let arena = Arena::new(
        dev,
        ArenaConfig {
            initial_bytes: 64 << 20,
            segment_bytes: 64 << 20,
            cap_bytes: None,
            overflow_reserve_bytes: 64 << 20,
            poison: false,
            timeline_events: 0,
            sanitize: false,
            from_env: Vec::new(),
        },
    )?;
    let gpu = CudaBackend::new(arena)?;
    let mut rows = Vec::new();
    if std::env::args().any(|a| a == "--modes") {
        products(
            &gpu,
            &mut rows,
            &[MathMode::F32, MathMode::Tf32, MathMode::Bf16],
        )?;
    } else {
        memory_bound(&gpu, &mut rows)?;
        products(&gpu, &mut rows, &[MathMode::F32])?;
    }
    for r in &rows {
        print(r);
    }
    println!("| op | ms | rate | of copy |");
    println!("|---|---:|---:|---:|");
    for r in &rows {
        let of_copy = r
            .of_copy
            .map_or(String::new(), |x| format!("{:.0}%", x * 100.0));
        println!(
            "| {} | {:.4} | {:.1} {} | {} |",
            r.name, r.ms, r.rate, r.unit, of_copy
        );
    }
    Ok(())
}
