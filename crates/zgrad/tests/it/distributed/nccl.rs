//! Data-parallel training on the machine's GPUs through NCCL, one process per rank (`--features
//! gpu`; the simulated twin is `tests/distributed.rs`): N ranks (every GPU present, at most 4;
//! fewer than 2 GPUs fails the test) at global batch B give the gradients of one GPU at B within
//! 1e-5 per tensor (kn.bias by its norm, docs/xasset.md) at steps 1 and 10, every rank the same
//! bits, and parameters equal by docs/xasset.md's rule; both schedules, eager and captured.
//!
//! The test re-runs its own binary once per rank with `ZGRAD_TEST_RANK` set; each rank joins the
//! communicator from the id in `ZGRAD_TEST_ID`, trains every case and writes what it saw to
//! `ZGRAD_TEST_OUT`; the parent trains the one-GPU reference on GPU 0, waits for the ranks with
//! a deadline and compares.
#![cfg(feature = "gpu")]
#![allow(clippy::print_stderr)] // which cases matched belongs in the GPU log

mod gpu {
    use std::path::{Path, PathBuf};
    use std::process::{Child, Command};
    use std::rc::Rc;
    use std::time::{Duration, Instant};

    use zcomm::{NcclCollective, RankInfo};
    use zcompute::{Backend, CudaBackend, CudaDriver, EngineConfig};
    use zdevice::{Device, DeviceConfig, Driver};
    use zgrad::{
        GradSync, PARAMETER_NAMES, StepSource, TrainSchedule, Trainer, TrainerConfig, XAsset,
        XAssetConfig,
    };

    const RANK_VAR: &str = "ZGRAD_TEST_RANK";
    const WORLD_VAR: &str = "ZGRAD_TEST_WORLD";
    const ID_VAR: &str = "ZGRAD_TEST_ID";
    const OUT_VAR: &str = "ZGRAD_TEST_OUT";
    const DEADLINE: Duration = Duration::from_secs(30);
    const RANK_LIFETIME: Duration = Duration::from_secs(300);
    const CFG: XAssetConfig = XAssetConfig {
        features: 19,
        scales: 12,
        width: 64,
        heads: 4,
        ff: 96,
        layers: 1,
    };
    /// Global batches of the 10 steps: unequal shards at N = 3, a short batch at step 5.
    const BATCHES: [usize; 10] = [29, 29, 29, 29, 3, 29, 29, 29, 29, 29];
    /// Buckets of 4 KiB: several for this model's gradients (one at the default 1 MiB).
    const SMALL_BUCKETS: GradSync = GradSync::Overlapped { bucket_bytes: 4096 };
    const DEFAULT_SYNC: GradSync = GradSync::Overlapped {
        bucket_bytes: zgrad::DEFAULT_BUCKET_BYTES,
    };
    const CASES: [(TrainSchedule, bool, GradSync); 7] = [
        (TrainSchedule::Batched, false, DEFAULT_SYNC),
        (TrainSchedule::Batched, true, DEFAULT_SYNC),
        (TrainSchedule::PerSample, false, DEFAULT_SYNC),
        (TrainSchedule::PerSample, true, DEFAULT_SYNC),
        (TrainSchedule::Batched, false, SMALL_BUCKETS),
        (TrainSchedule::Batched, true, SMALL_BUCKETS),
        (TrainSchedule::Batched, true, GradSync::AfterBackward),
    ];

    type Gpu = CudaBackend<CudaDriver>;

    fn open(ordinal: usize) -> Gpu {
        let config = DeviceConfig {
            ordinal: u32::try_from(ordinal).expect("ordinal"),
            sync_deadline: DEADLINE,
            ..DeviceConfig::default()
        };
        let driver = CudaDriver::load().expect("the CUDA driver loads");
        let device = Device::open(driver, config).expect("the rank's GPU opens");
        EngineConfig::new()
            .arena_bytes(256 << 20)
            .on_device(device)
            .expect("the engine opens")
    }

    fn data(step: usize, n: usize) -> (Vec<f32>, Vec<f32>) {
        let per = CFG.scales * CFG.features;
        let x = (0..n * per)
            .map(|i| ((i * 7919 + step * 104_729) % 2003) as f32 / 1001.5 - 1.0)
            .collect();
        let y = (0..n).map(|i| ((i + step) % 2) as f32).collect();
        (x, y)
    }

    /// Step-1 gradients, step-10 gradients, final parameters and the losses, flattened in
    /// docs/xasset.md's parameter order.
    #[derive(Debug, PartialEq)]
    struct Seen(Vec<Vec<f32>>);

    fn train(b: &Gpu, comm: Option<Rc<NcclCollective>>, rank: usize, case: usize) -> Seen {
        let (schedule, capture, sync) = CASES[case];
        let model = XAsset::init(b, CFG, 7 + rank as u64).expect("model");
        let config = TrainerConfig {
            schedule,
            capture,
            clip_grad: Some(1.0),
            ..TrainerConfig::default()
        };
        let mut t = Trainer::new(b.clone(), model, config).expect("trainer");
        if let Some(c) = comm {
            t = t
                .with_collective(c)
                .and_then(|t| t.with_grad_sync(sync))
                .expect("broadcast from rank 0");
        }
        let tensors = |t: &Trainer<Gpu, f32, XAsset<Gpu>>, grads: bool| -> Vec<Vec<f32>> {
            t.model()
                .parameters()
                .iter()
                .map(|p| {
                    let x = if grads {
                        p.grad().expect("grad")
                    } else {
                        p.value()
                    };
                    b.download(x).expect("download")
                })
                .collect()
        };
        let mut seen = Vec::new();
        let mut losses = Vec::new();
        for (i, &n) in BATCHES.iter().enumerate() {
            let (x, y) = data(i, n);
            let r = t.step(StepSource::host(&x, &y, n)).expect("step");
            if i == 0 {
                // The first step is captured when asked (a later batch of another size runs
                // eager; the replays of the batch-29 graph carry the all-reduce).
                assert_eq!(r.captured, capture, "case {case} step 1");
            }
            losses.push(r.loss as f32);
            if i == 0 {
                seen.extend(tensors(&t, true));
            }
        }
        seen.extend(tensors(&t, true));
        seen.extend(tensors(&t, false));
        seen.push(losses);
        Seen(seen)
    }

    fn write(path: &Path, seen: &Seen) {
        let mut bytes = Vec::new();
        for t in &seen.0 {
            bytes.extend_from_slice(&(t.len() as u64).to_le_bytes());
            for v in t {
                bytes.extend_from_slice(&v.to_le_bytes());
            }
        }
        std::fs::write(path, bytes).expect("write what the rank saw");
    }

    fn read(path: &Path) -> Seen {
        let bytes = std::fs::read(path).expect("a rank wrote its results");
        let mut out = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            let n = u64::from_le_bytes(bytes[at..at + 8].try_into().expect("len")) as usize;
            at += 8;
            out.push(
                bytes[at..at + 4 * n]
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().expect("f32")))
                    .collect(),
            );
            at += 4 * n;
        }
        Seen(out)
    }

    fn rel(a: &[f32], b: &[f32]) -> f64 {
        let d: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
        let n: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
        (d / n.max(1e-30)).sqrt()
    }

    /// docs/xasset.md's rule, as the simulated twin applies it.
    fn assert_close(what: &str, got: &[Vec<f32>], want: &[Vec<f32>], grads: bool) {
        for ((name, g), w) in PARAMETER_NAMES.iter().zip(got).zip(want) {
            if *name == "kn.bias" {
                let norm = g.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
                let worst = g
                    .iter()
                    .zip(w)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f32::max);
                assert!(
                    if grads {
                        norm < 1e-5
                    } else {
                        worst <= 2e-3 * 10.0
                    },
                    "{what} {name}: |g| {norm}, worst {worst}"
                );
                continue;
            }
            let r = rel(g, w);
            assert!(r <= 1e-5, "{what} {name}: relative difference {r:e}");
        }
    }

    fn rank_main(rank: usize) {
        let world: usize = std::env::var(WORLD_VAR)
            .expect("world")
            .parse()
            .expect("world");
        let hex = std::env::var(ID_VAR).expect("id");
        let id: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex id"))
            .collect();
        let out = PathBuf::from(std::env::var(OUT_VAR).expect("out"));
        let b = open(rank);
        let info = RankInfo {
            rank,
            world,
            local_rank: rank,
        };
        let comm = Rc::new(NcclCollective::join(&b, info, &id).expect("the rank joins"));
        for case in 0..CASES.len() {
            let seen = train(&b, Some(Rc::clone(&comm)), rank, case);
            write(&out.join(format!("rank{rank}_case{case}")), &seen);
        }
    }

    fn run_ranks(name: &str, world: usize, out: &Path) {
        let id = NcclCollective::unique_id().expect("NCCL loads and makes an id");
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        let exe = std::env::current_exe().expect("the test binary");
        // libtest names a test by its module path without the crate's name.
        let name = name.split_once("::").map_or(name, |(_, test)| test);
        let mut children: Vec<Child> = (0..world)
            .map(|rank| {
                Command::new(&exe)
                    .args([name, "--exact", "--nocapture", "--test-threads=1"])
                    .env(RANK_VAR, rank.to_string())
                    .env(WORLD_VAR, world.to_string())
                    .env(ID_VAR, &hex)
                    .env(OUT_VAR, out)
                    .env("NCCL_NVLS_ENABLE", "0")
                    .spawn()
                    .expect("a rank starts")
            })
            .collect();
        let until = Instant::now() + RANK_LIFETIME;
        let mut codes: Vec<Option<Option<i32>>> = vec![None; world];
        while codes.iter().any(Option::is_none) {
            for (r, child) in children.iter_mut().enumerate() {
                if codes[r].is_none()
                    && let Some(status) = child.try_wait().expect("try_wait")
                {
                    codes[r] = Some(status.code());
                }
            }
            if Instant::now() >= until {
                for child in &mut children {
                    let _ = child.kill();
                    let _ = child.wait();
                }
                panic!("ranks still running after {RANK_LIFETIME:?}: {codes:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            codes.iter().all(|c| *c == Some(Some(0))),
            "rank exit codes {codes:?}"
        );
    }

    #[test]
    fn gpu_n_ranks_match_one_gpu() {
        const NAME: &str = concat!(module_path!(), "::gpu_n_ranks_match_one_gpu");
        if let Ok(rank) = std::env::var(RANK_VAR) {
            rank_main(rank.parse().expect("rank"));
            return;
        }
        let driver = CudaDriver::load().expect("the CUDA driver loads on a GPU machine");
        driver.init().expect("cuInit");
        let gpus = driver.device_count().expect("cuDeviceGetCount") as usize;
        assert!(
            gpus >= 2,
            "data-parallel needs 2 GPUs or more; this machine has {gpus}"
        );
        let world = gpus.min(4);
        let dir = tempfile::tempdir().expect("a folder for the ranks' results");
        run_ranks(NAME, world, dir.path());
        let b = open(0);
        for (case, &(schedule, capture, sync)) in CASES.iter().enumerate() {
            let one = train(&b, None, 0, case);
            let n = PARAMETER_NAMES.len();
            let rank0 = read(&dir.path().join(format!("rank0_case{case}")));
            for r in 0..world {
                let seen = read(&dir.path().join(format!("rank{r}_case{case}")));
                let at = format!("{schedule:?} capture={capture} {sync:?} N={world} rank {r}");
                assert_close(
                    &format!("{at} step 1 grads"),
                    &seen.0[..n],
                    &one.0[..n],
                    true,
                );
                assert_close(
                    &format!("{at} step 10 grads"),
                    &seen.0[n..2 * n],
                    &one.0[n..2 * n],
                    true,
                );
                assert_close(
                    &format!("{at} params"),
                    &seen.0[2 * n..3 * n],
                    &one.0[2 * n..3 * n],
                    false,
                );
                for (l, w) in seen.0[3 * n].iter().zip(&one.0[3 * n]) {
                    assert!(
                        (l - w).abs() <= 1e-5 * w.abs().max(1.0),
                        "{at}: loss {l} vs {w}"
                    );
                }
                assert_eq!(seen, rank0, "{at}: every rank holds the same bits");
            }
            eprintln!("{schedule:?} capture={capture} {sync:?}: {world} GPUs match one GPU");
        }
    }
}
