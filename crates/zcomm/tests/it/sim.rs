//! The simulated communicator, ranks as threads each over its own simulated device: sums in a
//! fixed rank order (the same bits on every rank), broadcasts, works inside a captured graph
//! (every replay exchanges again), and a peer that vanishes or stalls gives every other rank a
//! typed error within the deadline. (`ztrain`'s tests run ranks as processes.)

use std::thread;
use std::time::{Duration, Instant};
use zcomm::rendezvous::Server;
use zcomm::{Collective, CommError, RankInfo, SimCollective};
use zcompute::{Backend, Capture, CudaBackend, Driver, Engine, SimDriver};

const T: Duration = Duration::from_secs(10);

fn info(rank: usize, world: usize) -> RankInfo {
    RankInfo {
        rank,
        world,
        local_rank: rank,
    }
}

/// Runs `body(rank, backend, collective)` on `world` threads, each with its own device.
fn ranks<R: Send + 'static>(
    world: usize,
    timeout: Duration,
    body: impl Fn(usize, &CudaBackend<SimDriver>, &SimCollective) -> R + Send + Sync + Copy + 'static,
) -> Vec<R> {
    let server = Server::bind("127.0.0.1:0").unwrap();
    let addr = server.local_addr().unwrap().to_string();
    let mut server = Some(server);
    let handles: Vec<_> = (0..world)
        .map(|r| {
            let addr = addr.clone();
            let server = if r == 0 { server.take() } else { None };
            thread::spawn(move || {
                let b = Engine::sim(256 << 20).unwrap();
                let c = match server {
                    Some(s) => SimCollective::serve(&b, s, world, timeout).unwrap(),
                    None => SimCollective::join(&b, &addr, info(r, world), timeout).unwrap(),
                };
                body(r, &b, &c)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

fn rank_data(r: usize, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| 0.1 * (i as f32 + 1.0) * (r as f32 + 1.0) + 1e-3 * r as f32)
        .collect()
}

#[test]
fn all_reduce_sums_in_rank_order_on_every_rank() {
    for world in [2, 3] {
        let got = ranks(world, T, |r, b, c| {
            let x = b.upload(&rank_data(r, 37), &[37]).unwrap();
            c.all_reduce_sum(b, &x, 1).unwrap();
            c.synchronize(b).unwrap();
            b.download(&x).unwrap()
        });
        let want: Vec<f32> = (0..37)
            .map(|i| (1..world).fold(rank_data(0, 37)[i], |a, r| a + rank_data(r, 37)[i]))
            .collect();
        for (r, g) in got.iter().enumerate() {
            let same = g.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "world {world} rank {r}: {g:?} != {want:?}");
        }
    }
}

#[test]
fn broadcast_copies_the_roots_buffer() {
    let got = ranks(3, T, |r, b, c| {
        let x = b.upload(&rank_data(r, 5), &[5]).unwrap();
        c.broadcast(b, &x, 1, 0).unwrap();
        c.synchronize(b).unwrap();
        b.download(&x).unwrap()
    });
    for g in got {
        assert_eq!(g, rank_data(1, 5));
    }
}

#[test]
fn broadcast_from_outside_the_world_is_refused() {
    let got = ranks(2, T, |_, b, c| {
        let x = b.upload(&[1.0], &[1]).unwrap();
        matches!(
            c.broadcast(b, &x, 2, 0),
            Err(CommError::BadRank {
                rank: 2,
                world: 2,
                ..
            })
        )
    });
    assert_eq!(got, [true, true]);
}

#[test]
fn a_captured_all_reduce_exchanges_on_every_replay() {
    let got = ranks(2, T, |r, b, c| {
        let x = b.upload(&[0.0; 4], &[4]).unwrap();
        let body = {
            let (b2, x2, c2) = (b.clone(), x.clone(), c.clone());
            move || {
                c2.all_reduce_sum(&b2, &x2, 1)
                    .map_err(|e| zcompute::ComputeError::BodyFailed {
                        detail: e.to_string(),
                    })
            }
        };
        b.upload_into(&[1.0 + r as f32; 4], &x).unwrap();
        let mut graph = b.capture(Box::new(body)).unwrap();
        let mut seen = vec![b.download(&x).unwrap()[0]];
        for k in 0..3 {
            b.upload_into(&[10.0 * k as f32 + r as f32; 4], &x).unwrap();
            b.replay(&mut graph).unwrap();
            seen.push(b.download(&x).unwrap()[0]);
        }
        seen
    });
    // Warm-up: 1 + 2; replays: (0+0)+(0+1), (10+11), (20+21).
    for g in got {
        assert_eq!(g, [3.0, 1.0, 21.0, 41.0]);
    }
}

#[test]
fn a_rank_that_vanishes_fails_the_others_by_name() {
    let start = Instant::now();
    let got = ranks(3, T, |r, b, c| {
        let x = b.upload(&[1.0; 8], &[8]).unwrap();
        if r == 2 {
            return None; // drops its device and its connection
        }
        c.all_reduce_sum(b, &x, 7).unwrap();
        let e = c.synchronize(b).unwrap_err();
        Some(e)
    });
    assert!(start.elapsed() < T, "took {:?}", start.elapsed());
    for (r, e) in got.into_iter().enumerate().take(2) {
        match e {
            Some(CommError::PeerFailed {
                rank,
                op,
                step,
                detail,
            }) => {
                assert_eq!((rank, op, step), (r, "all_reduce", 7));
                assert!(detail.contains("rank 2"), "{detail}");
            }
            other => panic!("rank {r}: {other:?}"),
        }
    }
}

/// Rank 1 dies, rank 0 finds it gone in step 9, tells rank 2 why (an abort frame) and exits
/// before rank 2 has begun step 9. Rank 2's buffer is larger than the connection holds, so its
/// write meets rank 0's closed socket (EPIPE or a reset) before it reads anything. Its error
/// still names rank 1, from rank 0's abort waiting in the connection, not "rank 0 vanished":
/// rank 0 only relayed the failure. (Seen under CI load with three ztrain ranks: rank 2
/// reported "rank 0 vanished: Broken pipe".)
#[test]
fn a_rank_whose_write_meets_the_exited_hub_still_names_the_rank_that_died() {
    use std::sync::mpsc;
    const BIG: usize = 8 << 20; // 32 MiB of f32: more than a loopback socket buffers
    let server = Server::bind("127.0.0.1:0").unwrap();
    let addr = server.local_addr().unwrap().to_string();
    let (hub_done, hub_gone) = mpsc::channel::<()>();
    let rank1 = {
        let addr = addr.clone();
        thread::spawn(move || {
            let b = Engine::sim(256 << 20).unwrap();
            let c = SimCollective::join(&b, &addr, info(1, 3), T).unwrap();
            drop(c); // dies: its connection closes
        })
    };
    let rank0 = thread::spawn(move || {
        let b = Engine::sim(256 << 20).unwrap();
        let c = SimCollective::serve(&b, server, 3, T).unwrap();
        let x = b.upload(&vec![1.0; BIG], &[BIG]).unwrap();
        rank1.join().unwrap();
        c.all_reduce_sum(&b, &x, 9).unwrap();
        let e = c.synchronize(&b).unwrap_err();
        drop((x, c, b)); // exits: its sockets close
        hub_done.send(()).unwrap();
        e
    });
    let b = Engine::sim(256 << 20).unwrap();
    let c = SimCollective::join(&b, &addr, info(2, 3), T).unwrap();
    let x = b.upload(&vec![1.0; BIG], &[BIG]).unwrap();
    hub_gone.recv_timeout(T).expect("rank 0 ended");
    c.all_reduce_sum(&b, &x, 9).unwrap();
    let e = c.synchronize(&b).unwrap_err();
    let hub = rank0.join().unwrap();
    assert!(hub.to_string().contains("rank 1"), "rank 0: {hub}");
    match &e {
        CommError::PeerFailed {
            rank: 2,
            op: "all_reduce",
            step: 9,
            detail,
        } => assert!(
            detail.contains("rank 0 gave up") && detail.contains("rank 1"),
            "rank 2: {detail}"
        ),
        other => panic!("rank 2: {other:?}"),
    }
}

#[test]
fn a_rank_that_stalls_times_the_others_out() {
    let deadline = Duration::from_millis(500);
    let start = Instant::now();
    let got = ranks(3, deadline, |r, b, c| {
        let x = b.upload(&[1.0; 8], &[8]).unwrap();
        if r == 1 {
            thread::sleep(Duration::from_secs(2));
            return None;
        }
        c.all_reduce_sum(b, &x, 3).unwrap();
        Some(c.synchronize(b).unwrap_err())
    });
    assert!(start.elapsed() < Duration::from_secs(5));
    match &got[0] {
        // Issue 44: rank 0 names the rank that did not answer.
        Some(
            e @ CommError::Timeout {
                rank: 0,
                op: "all_reduce",
                step: 3,
                silent: zcomm::Silent::Rank(1),
                ..
            },
        ) => assert!(
            e.to_string()
                .contains("rank 1 did not answer within 400ms in all_reduce at step 3"),
            "{e}"
        ),
        other => panic!("rank 0: {other:?}"),
    }
    match &got[2] {
        Some(CommError::PeerFailed {
            rank: 2,
            op: "all_reduce",
            step: 3,
            detail,
        }) => {
            assert!(detail.contains("rank 1"), "{detail}");
        }
        other => panic!("rank 2: {other:?}"),
    }
}

/// The GPU's shape of a dead peer: rank 0's step-2 collective never completes on its stream
/// (the fault plan keeps the kernel queued for an hour, as NCCL's kernel spins for a peer that
/// is gone), so its synchronize ends at the device's deadline. The error is the typed
/// `Timeout` naming the rank, the operation and the step; after the abort every later call is
/// refused at once, and the teardown (tensors, backend, arena, communicator) does not wait on
/// that stream again: no time passes on the device's clock (what the GPU would wait) and no
/// release is left waiting for a stream that will never drain. Before the abort marked the
/// device lost, dropping the backend waited one more full deadline (60 s on this clock).
#[test]
fn a_collective_stuck_on_the_stream_times_out_by_name_and_the_teardown_waits_no_more() {
    let start = Instant::now();
    let got = ranks(2, T, |r, b, c| {
        let x = b.upload(&rank_data(r, 8), &[8]).unwrap();
        c.all_reduce_sum(b, &x, 1).unwrap();
        c.synchronize(b).unwrap();
        if r == 1 {
            return None; // gone before step 2: drops its device and its connection
        }
        b.device()
            .driver()
            .stall("cuLaunchKernel", 1, Duration::from_secs(3600));
        c.all_reduce_sum(b, &x, 2).unwrap();
        let e = c.synchronize(b).unwrap_err();
        c.abort(&e.to_string());
        let later = c.all_reduce_sum(b, &x, 3).unwrap_err();
        let device = b.device().clone();
        let aborted_at = device.driver().now();
        Some((e, later, device, aborted_at))
    });
    // Rank 0's backend and communicator were dropped when its thread ended.
    let (e, later, device, aborted_at) = got.into_iter().next().flatten().unwrap();
    match e {
        CommError::Timeout {
            rank: 0,
            op: "synchronize",
            step: 2,
            waited_for,
            ..
        } => assert_eq!(waited_for, device.config().sync_deadline),
        other => panic!("rank 0: {other:?}"),
    }
    assert!(
        matches!(
            later,
            CommError::PeerFailed {
                rank: 0,
                step: 3,
                ..
            }
        ),
        "{later:?}"
    );
    assert!(
        device.lost_reason().is_some(),
        "the abort marks the device lost"
    );
    let teardown = device.driver().now().saturating_sub(aborted_at);
    assert!(
        teardown < device.config().sync_deadline / 10,
        "the teardown waited {teardown:?} on the device's clock"
    );
    assert_eq!(device.deferred_releases(), 0);
    assert!(start.elapsed() < T, "took {:?}", start.elapsed());
}

/// Ranks that have queued their step-2 all-reduce in
/// `a_peer_that_dies_while_the_others_are_in_a_collective_fails_them_by_name`.
static QUEUED_STEP_2: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The twin of the GPU test `gpu_a_peer_that_dies_mid_collective_fails_the_others_in_time`:
/// after a first all-reduce, the last rank dies once every other rank has queued its step-2
/// all-reduce, without contributing to it. Each other rank gets a typed failure naming itself
/// and step 2, its communicator is aborted, and later calls are refused.
#[test]
fn a_peer_that_dies_while_the_others_are_in_a_collective_fails_them_by_name() {
    use std::sync::atomic::Ordering;
    const WORLD: usize = 3;
    let start = Instant::now();
    let got = ranks(WORLD, T, |r, b, c| {
        let x = b.upload(&rank_data(r, 64), &[64]).unwrap();
        c.all_reduce_sum(b, &x, 1).unwrap();
        c.synchronize(b).unwrap();
        if r == WORLD - 1 {
            let until = Instant::now() + T;
            while QUEUED_STEP_2.load(Ordering::Acquire) < WORLD - 1 {
                assert!(Instant::now() < until, "the others never queued step 2");
                thread::sleep(Duration::from_millis(1));
            }
            return None; // dies: drops its device and its connection
        }
        let queued = c.all_reduce_sum(b, &x, 2);
        QUEUED_STEP_2.fetch_add(1, Ordering::AcqRel);
        let e = queued.and_then(|()| c.synchronize(b)).unwrap_err();
        let later = c.all_reduce_sum(b, &x, 3).unwrap_err();
        Some((e, c.is_aborted(), later))
    });
    assert!(start.elapsed() < T, "took {:?}", start.elapsed());
    for (r, got) in got.into_iter().enumerate().take(WORLD - 1) {
        let (e, aborted, later) = got.unwrap();
        match e {
            CommError::Timeout { rank, step: 2, .. } => assert_eq!(rank, r),
            CommError::PeerFailed {
                rank,
                step: 2,
                detail,
                ..
            } => {
                assert_eq!(rank, r);
                assert!(detail.contains("rank 2"), "{detail}");
            }
            other => panic!("rank {r}: expected a typed peer failure, got {other:?}"),
        }
        assert!(aborted, "rank {r}: a failed wait aborts the communicator");
        assert!(
            matches!(later, CommError::PeerFailed { rank, step: 3, .. } if rank == r),
            "rank {r}: {later:?}"
        );
    }
}

/// Three buckets of one buffer all-reduced on the side stream (last bucket first, as backward
/// finishes them), joined back, give the bits of one all-reduce of the whole buffer on the
/// engine stream, eagerly and in a captured graph on every replay.
#[test]
fn overlapped_buckets_equal_one_all_reduce_eager_and_captured() {
    const N: usize = 96;
    let buckets = |b: &CudaBackend<SimDriver>, c: &SimCollective, x: &zcompute::CudaTensor| {
        for (start, len) in [(64, 32), (32, 32), (0, 32)] {
            c.all_reduce_sum_overlapped(b, &x.narrow(0, start, len)?, 4)
                .map_err(|e| zcompute::ComputeError::BodyFailed {
                    detail: e.to_string(),
                })?;
        }
        c.join_overlapped(b)
            .map_err(|e| zcompute::ComputeError::BodyFailed {
                detail: e.to_string(),
            })
    };
    let got = ranks(3, T, move |r, b, c| {
        let whole = b.upload(&rank_data(r, N), &[N]).unwrap();
        c.all_reduce_sum(b, &whole, 4).unwrap();
        let x = b.upload(&rank_data(r, N), &[N]).unwrap();
        buckets(b, c, &x).unwrap();
        // Read on the engine stream after the join: the sums are there.
        let eager = b
            .download(&b.add(&x, &b.zeros(&[N]).unwrap()).unwrap())
            .unwrap();
        let body = {
            let (b2, c2, x2) = (b.clone(), c.clone(), x.clone());
            move || buckets(&b2, &c2, &x2)
        };
        let mut graph = b.capture(Box::new(body)).unwrap();
        let mut replays = Vec::new();
        for _ in 0..2 {
            b.upload_into(&rank_data(r, N), &x).unwrap();
            b.replay(&mut graph).unwrap();
            replays.push(b.download(&x).unwrap());
        }
        c.synchronize(b).unwrap();
        (b.download(&whole).unwrap(), eager, replays)
    });
    for (r, (whole, eager, replays)) in got.into_iter().enumerate() {
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&eager), bits(&whole), "rank {r}: eager buckets");
        for (k, rep) in replays.iter().enumerate() {
            assert_eq!(bits(rep), bits(&whole), "rank {r}: replay {k}");
        }
    }
}

/// The last rank dies after its first overlapped bucket of a step (the others queued all
/// three): every other rank gets a typed failure naming itself and the step, within the
/// deadline, never a hang.
#[test]
fn a_peer_that_dies_mid_bucket_fails_the_others_in_time() {
    const WORLD: usize = 3;
    let start = Instant::now();
    let got = ranks(WORLD, T, |r, b, c| {
        let x = b.upload(&rank_data(r, 96), &[96]).unwrap();
        let first = x.narrow(0, 64, 32).unwrap();
        c.all_reduce_sum_overlapped(b, &first, 5).unwrap();
        if r == WORLD - 1 {
            // Contributes to the first bucket, then dies.
            c.join_overlapped(b).unwrap();
            b.synchronize().unwrap();
            return None;
        }
        let queued = [(32, 32), (0, 32)]
            .into_iter()
            .try_for_each(|(s, n)| c.all_reduce_sum_overlapped(b, &x.narrow(0, s, n).unwrap(), 5));
        let e = queued
            .and_then(|()| c.join_overlapped(b))
            .and_then(|()| c.synchronize(b))
            .unwrap_err();
        Some(e)
    });
    assert!(start.elapsed() < T, "took {:?}", start.elapsed());
    for (r, e) in got.into_iter().enumerate().take(WORLD - 1) {
        match e {
            Some(
                CommError::PeerFailed { rank, step: 5, .. }
                | CommError::Timeout { rank, step: 5, .. },
            ) => {
                assert_eq!(rank, r);
            }
            other => panic!("rank {r}: expected a typed peer failure at step 5, got {other:?}"),
        }
    }
}

/// Rank 1 has stopped after `a_rank_blocked_in_a_device_wait_is_ended_by_its_watchdog`'s
/// first step; it leaves (drops its connection) once rank 0 is done.
static RANK_0_DONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Issue 44, the GPU's worst case: rank 1 stops (alive, connected, silent) after step 1, and
/// rank 0's training thread is blocked in a device wait that has no deadline of its own (the
/// fault plan holds its `cuStreamQuery`, as a GPU holds `cuGraphLaunch` behind a full queue or
/// a synchronize behind NCCL's kernel waiting for the stopped peer). Nothing on that thread can
/// abort; the watchdog, on a thread of its own, aborts the communicator after 0.5 s without
/// progress, which ends the wait (as `ncclCommAbort` ends NCCL's kernels), and the call
/// returns the typed `NoProgress` naming where the thread was and the peer (rank 0's step-2
/// collective never reached rank 1, so no exchange found it silent: of two ranks, the other
/// one). Without the watchdog the thread stays blocked: the test's guard releases it after
/// 60 s and fails.
#[test]
fn a_rank_blocked_in_a_device_wait_is_ended_by_its_watchdog() {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;
    use zcomm::Watched;
    use zdevice::FaultAction;
    let got = ranks(2, Duration::from_millis(300), |r, b, c| {
        let x = b.upload(&rank_data(r, 8), &[8]).unwrap();
        c.all_reduce_sum(b, &x, 1).unwrap();
        c.synchronize(b).unwrap();
        if r == 1 {
            let until = Instant::now() + Duration::from_secs(90);
            while !RANK_0_DONE.load(Ordering::SeqCst) && Instant::now() < until {
                thread::sleep(Duration::from_millis(10));
            }
            return None;
        }
        let watched = Watched::new_in(
            Arc::new(c.clone()),
            c.info(),
            Duration::from_millis(500),
            |c: &SimCollective, why: &str| c.abort(why),
        )
        .unwrap();
        // The guard: releases the held wait after 60 s if nothing else did (the test fails).
        let device = b.device().clone();
        let (done, finished) = std::sync::mpsc::channel::<()>();
        let guard = thread::spawn(move || {
            let released = finished.recv_timeout(Duration::from_secs(60)).is_err();
            if released {
                device.driver().release_hangs();
            }
            released
        });
        let start = Instant::now();
        watched.set_step(2);
        b.device()
            .driver()
            .fault("cuStreamQuery", 1, FaultAction::Hang);
        watched.all_reduce_sum(b, &x, 2).unwrap();
        let e = watched.synchronize(b).unwrap_err();
        let took = start.elapsed();
        done.send(()).ok();
        let released_by_the_guard = guard.join().unwrap();
        RANK_0_DONE.store(true, Ordering::SeqCst);
        Some((e, took, released_by_the_guard, watched.fired()))
    });
    let (e, took, released_by_the_guard, fired) = got.into_iter().next().flatten().unwrap();
    assert!(
        !released_by_the_guard,
        "rank 0 was still blocked in its device wait 60 s after its peer stopped: nothing aborted the communicator ({e})"
    );
    assert!(fired.is_some(), "the watchdog did not fire: {e}");
    match &e {
        CommError::NoProgress {
            rank: 0,
            op: "synchronize",
            step: 2,
            detail,
            ..
        } => assert!(detail.contains("aborted"), "{e}"),
        other => panic!("rank 0: {other:?}"),
    }
    assert!(
        e.to_string().contains("no progress for"),
        "{e} (after {took:?})"
    );
    assert!(
        e.to_string().contains("(rank 1 did not answer)"),
        "{e} (after {took:?})"
    );
}

/// Rank 1 of `an_abort_does_not_wait_for_an_exchange_blocked_on_a_silent_peer` stays silent
/// (connected, calling nothing) until rank 0 is done.
static SILENT_RANK_RELEASED: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Issue 44, the simulator's twin of an NCCL enqueue blocked behind a full queue: rank 0's
/// collective is blocked in its exchange with a silent rank 1, holding that connection, with
/// a deadline (0.8 of 120 s) far off. An abort from another thread (the watchdog's) does not
/// wait for the connection: it cuts it, and the blocked call returns. Before, the abort
/// waited for the exchange's deadline to write its abort frame.
#[test]
fn an_abort_does_not_wait_for_an_exchange_blocked_on_a_silent_peer() {
    use std::sync::atomic::Ordering;
    let got = ranks(2, Duration::from_secs(120), |r, b, c| {
        if r == 1 {
            let until = Instant::now() + Duration::from_secs(150);
            while !SILENT_RANK_RELEASED.load(Ordering::SeqCst) && Instant::now() < until {
                thread::sleep(Duration::from_millis(10));
            }
            return None;
        }
        let x = b.upload(&rank_data(r, 8), &[8]).unwrap();
        let watchdog = c.clone();
        let aborter = thread::spawn(move || {
            // Let the collective reach its exchange (were it not there yet, the abort comes
            // first and the call is refused at once: the test passes either way after the fix).
            thread::sleep(Duration::from_millis(300));
            let t = Instant::now();
            watchdog.abort("the watchdog: no progress");
            t.elapsed()
        });
        let start = Instant::now();
        let result = c.all_reduce_sum(b, &x, 1).and_then(|()| c.synchronize(b));
        let took = start.elapsed();
        let abort_took = aborter.join().unwrap();
        SILENT_RANK_RELEASED.store(true, Ordering::SeqCst);
        Some((result.is_err(), took, abort_took))
    });
    let (failed, took, abort_took) = got.into_iter().next().flatten().unwrap();
    assert!(
        abort_took < Duration::from_secs(30),
        "the abort waited {abort_took:?} for the blocked exchange"
    );
    assert!(
        took < Duration::from_secs(30),
        "the blocked call took {took:?}"
    );
    assert!(failed, "the aborted collective succeeded");
}
