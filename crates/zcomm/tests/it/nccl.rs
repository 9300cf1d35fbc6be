//! NCCL on the machine's GPUs, one process per rank (`--features gpu`).
//!
//! Each multi-rank test re-runs this test binary once per rank, filtered to itself, with
//! `ZCOMM_TEST_RANK` set: the copy with the variable is a rank (it opens the GPU its rank
//! names and joins the communicator from the id in `ZCOMM_TEST_ID`), the copy without it is
//! the parent, which makes the unique id, starts the ranks, waits for them with a deadline
//! (killing them at it) and checks their exit codes. World: the GPUs present, at most 4 (one
//! GPU still runs every collective at world 1).
//!
//! Simulated twins: the checks `join` makes on any driver, and the error conversion, are the
//! unit tests of `zcomm::nccl`; the multi-rank semantics over simulated devices are the
//! simulated communicator's (DIST), which share the expected values computed here.
#![cfg(feature = "gpu")]
#![allow(clippy::print_stderr)] // what ran (world size, a case not run) belongs in the GPU log

mod gpu {
    use std::process::{Child, Command};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use zcomm::{Collective, CommError, JoinOptions, NcclCollective, RankInfo};
    use zcompute::{Backend, Capture, ComputeError, CudaBackend, CudaDriver, EngineConfig};
    use zdevice::{Device, DeviceConfig, Driver, StreamPriority};

    const RANK_VAR: &str = "ZCOMM_TEST_RANK";
    const WORLD_VAR: &str = "ZCOMM_TEST_WORLD";
    const ID_VAR: &str = "ZCOMM_TEST_ID";
    /// A directory the ranks of one run share, for file barriers.
    const DIR_VAR: &str = "ZCOMM_TEST_DIR";
    /// Each rank's device deadline: every wait of the communicator ends by it.
    const DEADLINE: Duration = Duration::from_secs(10);
    /// The parent's bound on a rank's whole life (init, collectives, a timeout, teardown).
    const RANK_LIFETIME: Duration = Duration::from_secs(120);

    fn gpu_count() -> usize {
        let driver = zdevice::CudaDriver::load().expect("the CUDA driver loads on a GPU machine");
        driver.init().expect("cuInit");
        driver.device_count().expect("cuDeviceGetCount") as usize
    }

    /// This process's role: `Some((info, id))` in a rank, `None` in the parent.
    fn role() -> Option<(RankInfo, Vec<u8>)> {
        let rank: usize = std::env::var(RANK_VAR).ok()?.parse().expect("rank");
        let world: usize = std::env::var(WORLD_VAR)
            .expect("world")
            .parse()
            .expect("world");
        let id = std::env::var(ID_VAR).expect("id");
        let id = (0..id.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&id[i..i + 2], 16).expect("hex id"))
            .collect();
        let info = RankInfo {
            rank,
            world,
            local_rank: rank,
        };
        Some((info, id))
    }

    /// Starts `world` ranks of test `name` and returns each one's exit code, in rank order.
    fn run_ranks(name: &str, world: usize) -> Vec<Option<i32>> {
        let id = NcclCollective::unique_id().expect("NCCL loads and makes an id");
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        let exe = std::env::current_exe().expect("the test binary");
        // libtest names a test by its module path without the crate's name.
        let name = name.split_once("::").map_or(name, |(_, test)| test);
        let dir = tempfile::tempdir().expect("a directory for the ranks' barriers");
        let mut children: Vec<Child> = (0..world)
            .map(|rank| {
                Command::new(&exe)
                    .args([name, "--exact", "--nocapture", "--test-threads=1"])
                    .env(RANK_VAR, rank.to_string())
                    .env(WORLD_VAR, world.to_string())
                    .env(ID_VAR, &hex)
                    .env(DIR_VAR, dir.path())
                    .env("NCCL_NVLS_ENABLE", "0")
                    .spawn()
                    .expect("a rank starts")
            })
            .collect();
        let until = Instant::now() + RANK_LIFETIME;
        let mut codes = vec![None; world];
        let mut done = vec![false; world];
        while done.iter().any(|d| !d) {
            for (r, child) in children.iter_mut().enumerate() {
                if !done[r]
                    && let Some(status) = child.try_wait().expect("try_wait")
                {
                    codes[r] = status.code();
                    done[r] = true;
                }
            }
            if Instant::now() >= until {
                for (r, child) in children.iter_mut().enumerate() {
                    if !done[r] {
                        let _ = child.kill();
                        let _ = child.wait();
                    }
                }
                panic!("ranks of {name} still running after {RANK_LIFETIME:?}: {done:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        codes
    }

    /// The rank's backend on GPU `local_rank`, with the test's deadline.
    fn open(info: RankInfo) -> CudaBackend<CudaDriver> {
        open_with(info, StreamPriority::Normal)
    }

    /// As `open`, the engine stream of priority `engine_priority`.
    fn open_with(info: RankInfo, engine_priority: StreamPriority) -> CudaBackend<CudaDriver> {
        let driver = zdevice::CudaDriver::load().expect("the CUDA driver loads");
        let config = DeviceConfig {
            ordinal: u32::try_from(info.local_rank).expect("ordinal"),
            sync_deadline: DEADLINE,
            engine_priority,
            ..DeviceConfig::default()
        };
        let device = Device::open(driver, config).expect("the rank's GPU opens");
        EngineConfig::new()
            .arena_bytes(64 << 20)
            .on_device(device)
            .expect("the rank's engine opens")
    }

    fn world() -> usize {
        gpu_count().clamp(1, 4)
    }

    /// In a rank, its role (`Some`); in the parent, runs every rank of test `name` on the
    /// machine's GPUs, asserts that each exited with 0, says in the log how many ran, and
    /// returns `None` (the test is over).
    fn rank_or_run_all(name: &str) -> Option<(RankInfo, Vec<u8>)> {
        if let Some(role) = role() {
            return Some(role);
        }
        let world = world();
        let codes = run_ranks(name, world);
        assert!(
            codes.iter().all(|c| *c == Some(0)),
            "rank exit codes {codes:?}"
        );
        eprintln!("{name}: {world} rank(s) passed");
        None
    }

    /// Rank r holds (r + 1) * (i % 7 + 1): the sum over ranks is W(W+1)/2 * (i % 7 + 1), exact.
    fn contribution(rank: usize, n: usize) -> Vec<f32> {
        (0..n).map(|i| ((rank + 1) * (i % 7 + 1)) as f32).collect()
    }

    #[test]
    fn gpu_all_reduce_and_broadcast_agree_across_ranks() {
        const NAME: &str = concat!(
            module_path!(),
            "::gpu_all_reduce_and_broadcast_agree_across_ranks"
        );
        let Some((info, id)) = rank_or_run_all(NAME) else {
            return;
        };
        let b = open(info);
        let comm = NcclCollective::join(&b, info, &id).expect("join");
        let (w, n) = (info.world, 1003);
        // All-reduce, odd length.
        let x = b.upload(&contribution(info.rank, n), &[n]).unwrap();
        comm.all_reduce_sum(&b, &x, 1).expect("all-reduce");
        comm.synchronize(&b).expect("synchronize");
        let got = b.download(&x).unwrap();
        let want: Vec<f32> = (0..n)
            .map(|i| (w * (w + 1) / 2 * (i % 7 + 1)) as f32)
            .collect();
        assert_eq!(got, want, "rank {}", info.rank);
        // Broadcast from the last rank.
        let root = w - 1;
        let mine: Vec<f32> = (0..n).map(|i| (info.rank * 10_000 + i) as f32).collect();
        let y = b.upload(&mine, &[n]).unwrap();
        comm.broadcast(&b, &y, root, 2).expect("broadcast");
        comm.synchronize(&b).expect("synchronize");
        let want: Vec<f32> = (0..n).map(|i| (root * 10_000 + i) as f32).collect();
        assert_eq!(b.download(&y).unwrap(), want, "rank {}", info.rank);
        // Argument checks on the GPU as on the simulator: a strided view, a root outside.
        let m = b.upload(&contribution(info.rank, 12), &[3, 4]).unwrap();
        let view = m.transpose(0, 1).unwrap();
        let err = comm.all_reduce_sum(&b, &view, 3).unwrap_err();
        assert!(
            matches!(
                err,
                CommError::InvalidArgument {
                    op: "all_reduce",
                    ..
                }
            ),
            "{err:?}"
        );
        let err = comm.broadcast(&b, &y, w, 3).unwrap_err();
        assert!(
            matches!(
                err,
                CommError::BadRank {
                    op: "broadcast",
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(
            !comm.is_aborted(),
            "argument errors leave the communicator usable"
        );
    }

    /// The overlapped all-reduce captured with the two streams at different priorities, one
    /// way round on even ranks and the other on odd ones, on a communicator split off with at
    /// most 2 thread blocks, then the rest on the engine stream: every replay sums as one
    /// all-reduce does.
    #[test]
    fn gpu_captured_overlapped_all_reduce_on_prioritized_streams_replays() {
        const NAME: &str = concat!(
            module_path!(),
            "::gpu_captured_overlapped_all_reduce_on_prioritized_streams_replays"
        );
        let Some((info, id)) = rank_or_run_all(NAME) else {
            return;
        };
        // Even ranks put the engine first, odd ranks the collectives (priorities are each
        // process's own; the ranks need not agree).
        let (engine, side) = if info.rank % 2 == 0 {
            (StreamPriority::High, StreamPriority::Normal)
        } else {
            (StreamPriority::Normal, StreamPriority::High)
        };
        let b = open_with(info, engine);
        let options = JoinOptions {
            side_priority: side,
            overlap_ctas: Some(2),
            ..JoinOptions::default()
        };
        let comm = Arc::new(NcclCollective::join_with(&b, info, &id, options).expect("join"));
        let (w, n) = (info.world, 4099);
        let z = b.upload(&contribution(info.rank, n), &[n]).unwrap();
        let body = {
            let (b, comm, z) = (b.clone(), Arc::clone(&comm), z.clone());
            Box::new(move || {
                let failed = |e: CommError| ComputeError::BodyFailed {
                    detail: e.to_string(),
                };
                // The first half overlapped (the split communicator, at most 2 blocks), the
                // second after the join on the engine stream (the first communicator).
                let half = z.numel() / 2;
                let first = z.narrow(0, 0, half)?;
                let second = z.narrow(0, half, z.numel() - half)?;
                comm.all_reduce_sum_overlapped(&b, &first, 7)
                    .map_err(failed)?;
                comm.join_overlapped(&b).map_err(failed)?;
                comm.all_reduce_sum(&b, &second, 7).map_err(failed)
            })
        };
        let mut graph = b
            .capture(body)
            .expect("an overlapped all-reduce can be captured");
        b.synchronize().unwrap();
        let s = w * (w + 1) / 2;
        let want: Vec<f32> = (0..n).map(|i| (s * (i % 7 + 1)) as f32).collect();
        assert_eq!(
            b.download(&z).unwrap(),
            want,
            "rank {}: the warm-up's sum",
            info.rank
        );
        replays_multiply_by_the_world(&b, &comm, &mut graph, &z, info);
    }

    /// After a warm-up that left the sum of `contribution`s in `z` on every rank, each of
    /// three replays of `graph` (an in-place sum of `z`) multiplies it by the world size.
    fn replays_multiply_by_the_world(
        b: &CudaBackend<CudaDriver>,
        comm: &NcclCollective,
        graph: &mut zcompute::cuda::CudaGraph<CudaDriver>,
        z: &zcompute::CudaTensor,
        info: RankInfo,
    ) {
        let (w, n) = (info.world, z.numel());
        let s = w * (w + 1) / 2;
        for replay in 1..=3u32 {
            b.replay(graph).expect("replay");
            comm.synchronize(b).expect("synchronize after replay");
            let got = b.download(z).unwrap();
            let scale = (w as u64).pow(replay);
            let want: Vec<f32> = (0..n)
                .map(|i| (s as u64 * scale * (i % 7 + 1) as u64) as f32)
                .collect();
            assert_eq!(got, want, "rank {}, replay {replay}", info.rank);
        }
    }

    #[test]
    fn gpu_captured_all_reduce_replays() {
        const NAME: &str = concat!(module_path!(), "::gpu_captured_all_reduce_replays");
        let Some((info, id)) = rank_or_run_all(NAME) else {
            return;
        };
        let b = open(info);
        let comm = Arc::new(NcclCollective::join(&b, info, &id).expect("join"));
        let (w, n) = (info.world, 4099);
        let z = b.upload(&contribution(info.rank, n), &[n]).unwrap();
        let body = {
            let (b, comm, z) = (b.clone(), Arc::clone(&comm), z.clone());
            Box::new(move || {
                comm.all_reduce_sum(&b, &z, 7)
                    .map_err(|e| ComputeError::BodyFailed {
                        detail: e.to_string(),
                    })
            })
        };
        // The warm-up runs the body once for real (the sum), then the graph is captured.
        let mut graph = b.capture(body).expect("an all-reduce can be captured");
        b.synchronize().unwrap();
        let after_warm_up = b.download(&z).unwrap();
        let s = w * (w + 1) / 2;
        let want: Vec<f32> = (0..n).map(|i| (s * (i % 7 + 1)) as f32).collect();
        assert_eq!(after_warm_up, want, "rank {}: the warm-up's sum", info.rank);
        // Every rank then holds the same values, so each replay multiplies them by W.
        replays_multiply_by_the_world(&b, &comm, &mut graph, &z, info);
    }

    #[test]
    fn gpu_a_peer_that_dies_mid_collective_fails_the_others_in_time() {
        const NAME: &str = concat!(
            module_path!(),
            "::gpu_a_peer_that_dies_mid_collective_fails_the_others_in_time"
        );
        let Some((info, id)) = role() else {
            let world = gpu_count().min(4);
            // A peer needs a second GPU: on one GPU this fails rather than passing unrun (the
            // one-GPU stalled-peer case is `gpu_a_rank_whose_peer_never_joins_...`).
            assert!(world >= 2, "{NAME}: needs 2 GPUs, found {world}");
            let codes = run_ranks(NAME, world);
            assert_ne!(codes[world - 1], Some(0), "the last rank dies");
            for (r, code) in codes.iter().enumerate().take(world - 1) {
                assert_eq!(*code, Some(0), "rank {r} returned a typed error in time");
            }
            return;
        };
        let b = open(info);
        let comm = NcclCollective::join(&b, info, &id).expect("join");
        let n = 1 << 20;
        let x = b.upload(&contribution(info.rank, n), &[n]).unwrap();
        comm.all_reduce_sum(&b, &x, 1).expect("a first all-reduce");
        comm.synchronize(&b).expect("synchronize");
        let last = info.world - 1;
        let dir = std::path::PathBuf::from(std::env::var(DIR_VAR).expect("the barrier directory"));
        let queued = |r: usize| dir.join(format!("queued-step-2-rank-{r}"));
        if info.rank == last {
            // Die, as SIGKILL would, once every other rank is inside its step-2 all-reduce,
            // without contributing to it: had this rank queued its own, the collective could
            // complete before the abort and the others would see no failure at all.
            let until = Instant::now() + RANK_LIFETIME / 2;
            while !(0..last).all(|r| queued(r).exists()) {
                assert!(
                    Instant::now() < until,
                    "the other ranks never queued step 2"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            std::process::abort();
        }
        let queued_step_2 = comm.all_reduce_sum(&b, &x, 2);
        std::fs::write(queued(info.rank), b"").expect("the barrier file");
        let outcome = queued_step_2.and_then(|()| comm.synchronize(&b));
        match outcome {
            Err(CommError::Timeout { rank, step: 2, .. })
            | Err(CommError::PeerFailed { rank, step: 2, .. }) => assert_eq!(rank, info.rank),
            other => panic!(
                "rank {}: expected a typed peer failure, got {other:?}",
                info.rank
            ),
        }
        assert!(comm.is_aborted(), "a failed wait aborts the communicator");
        let later = comm.all_reduce_sum(&b, &x, 3).unwrap_err();
        assert!(
            matches!(later, CommError::PeerFailed { step: 3, .. }),
            "{later:?}"
        );
    }

    #[test]
    fn gpu_a_rank_whose_peer_never_joins_times_out() {
        let id = NcclCollective::unique_id().expect("NCCL loads and makes an id");
        let info = RankInfo {
            rank: 0,
            world: 2,
            local_rank: 0,
        };
        let b = open(info);
        let err = NcclCollective::join(&b, info, &id).unwrap_err();
        assert!(
            matches!(err, CommError::Timeout { rank: 0, op: "init", step: 0, waited_for, .. } if waited_for == DEADLINE),
            "{err:?}"
        );
    }

    /// The last bucket and the norm over peer memory (`prepare_last_and_norm`,
    /// `all_reduce_last_and_norm`): with two ranks or more on this host every rank says yes,
    /// and three calls (both halves of the receive words) leave the bucket summed over the
    /// ranks (exact: small integers), the rest as it was, and the norm of it all; a rank asked
    /// to keep the last bucket on NCCL says no, and so does a world of one.
    #[test]
    fn gpu_the_last_bucket_and_the_norm_go_over_peer_memory() {
        const NAME: &str = concat!(
            module_path!(),
            "::gpu_the_last_bucket_and_the_norm_go_over_peer_memory"
        );
        let Some((info, id)) = rank_or_run_all(NAME) else {
            return;
        };
        let b = open(info);
        let comm = NcclCollective::join(&b, info, &id).expect("join");
        let (w, n, last) = (info.world, 20_011, 3_001);
        let on = comm.prepare_last_and_norm(&b, n, last, 0).expect("prepare");
        assert_eq!(
            on,
            w > 1,
            "rank {}: every rank of one host maps every other's",
            info.rank
        );
        let s = (w * (w + 1) / 2) as f32;
        for round in 0..3 {
            // The rest is already summed (the same on every rank); the bucket is this rank's.
            let mut grads: Vec<f32> = (0..n).map(|i| s * ((i + round) % 7 + 1) as f32).collect();
            grads[..last].copy_from_slice(&contribution(info.rank, last));
            let g = b.upload(&grads, &[n]).expect("grads");
            let norm = comm
                .all_reduce_last_and_norm(&b, &g, last, round as u64)
                .expect("launch");
            if w == 1 {
                assert!(norm.is_none(), "a world of one has no exchange");
                return;
            }
            let norm = norm.expect("prepared: the norm comes with the bucket");
            comm.synchronize(&b).expect("no peer gave up");
            let got = b.download(&g).expect("grads");
            let want: Vec<f32> = (0..n)
                .map(|i| {
                    if i < last {
                        s * (i % 7 + 1) as f32
                    } else {
                        grads[i]
                    }
                })
                .collect();
            assert_eq!(got, want, "rank {}, round {round}", info.rank);
            let want_norm = want
                .iter()
                .map(|&v| f64::from(v).powi(2))
                .sum::<f64>()
                .sqrt();
            let got_norm = f64::from(b.download(&norm).expect("norm")[0]);
            assert!(
                (got_norm - want_norm).abs() <= 1e-6 * want_norm,
                "rank {}: norm {got_norm} against {want_norm}",
                info.rank
            );
        }
        let kept = NcclCollective::join_with(
            &b,
            info,
            &id_again(&comm, &b, info),
            JoinOptions {
                last_bucket_on_nccl: true,
                ..JoinOptions::default()
            },
        )
        .expect("a second communicator");
        assert!(!kept.prepare_last_and_norm(&b, n, last, 0).expect("prepare"));
        let g = b.upload(&vec![1.0; n], &[n]).expect("grads");
        assert!(
            kept.all_reduce_last_and_norm(&b, &g, last, 0)
                .expect("call")
                .is_none()
        );
    }

    /// A fresh unique id made by rank 0 and broadcast over `comm` (bit for bit: a broadcast
    /// copies bytes), for a second communicator of the same ranks.
    fn id_again(comm: &NcclCollective, b: &CudaBackend<CudaDriver>, info: RankInfo) -> Vec<u8> {
        let mut words = vec![0.0f32; 32];
        if info.rank == 0 {
            let id = NcclCollective::unique_id().expect("an id");
            for (w, c) in words.iter_mut().zip(id.chunks(4)) {
                let mut bytes = [0u8; 4];
                bytes[..c.len()].copy_from_slice(c);
                *w = f32::from_bits(u32::from_le_bytes(bytes));
            }
        }
        let t = b.upload(&words, &[32]).expect("id words");
        comm.broadcast(b, &t, 0, 0).expect("broadcast");
        comm.synchronize(b).expect("sync");
        b.download(&t)
            .expect("id words")
            .iter()
            .flat_map(|w| w.to_bits().to_le_bytes())
            .take(zcomm::nccl::UNIQUE_ID_BYTES)
            .collect()
    }
}
