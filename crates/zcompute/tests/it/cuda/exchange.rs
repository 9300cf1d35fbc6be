//! The data-parallel tail's exchange (`zcompute::cuda::PeerExchange`, `zc_exchange_sum_norm_f32`):
//! the last bucket `x[..last]` summed over the ranks in rank order and the norm of all of `x` in
//! one launch; a peer that never comes leaves the norm NaN and the exchange failed; bad
//! arguments are typed errors; a launch waiting for a peer that stopped ends only when given up
//! from the host, and then at once. The mock suite runs the bodies on the simulated device
//! (which runs one kernel at a time, and keeps a launch whose peer's words are missing waiting,
//! as a GPU does, until they come or it is given up); the gpu suite runs two ranks on two
//! streams of CUDA device 0, concurrently, three rounds.

use std::time::Duration;
use zcompute::cuda::PeerExchange;
use zcompute::{Backend, ComputeError, CudaBackend, CudaTensor};
use zdevice::Driver;

const N: usize = 5000;
const LAST: usize = 1300;
const WAIT: Duration = Duration::from_secs(10);

fn grads(rank: usize, round: usize) -> Vec<f32> {
    (0..N)
        .map(|i| ((i * 31 + rank * 977 + round * 13) % 1009) as f32 / 503.0 - 1.0)
        .collect()
}

/// What rank `rank` holds after the exchange of `all`: its bucket summed in rank order (f32,
/// as the kernel), its rest as it was; and the norm of that, in f64.
fn expected(all: &[Vec<f32>], rank: usize) -> (Vec<f32>, f64) {
    let mut x = all[rank].clone();
    for (i, v) in x.iter_mut().enumerate().take(LAST) {
        let mut s = all[0][i];
        for r in &all[1..] {
            s += r[i];
        }
        *v = s;
    }
    let norm = x
        .iter()
        .map(|&v| f64::from(v) * f64::from(v))
        .sum::<f64>()
        .sqrt();
    (x, norm)
}

fn check<D: Driver>(b: &CudaBackend<D>, x: &CudaTensor, norm: &CudaTensor, want: &(Vec<f32>, f64)) {
    let got = b.download(x).expect("x");
    assert!(
        got.iter()
            .zip(&want.0)
            .all(|(g, w)| g.to_bits() == w.to_bits()),
        "the bucket summed in rank order, the rest untouched"
    );
    let n = f64::from(b.download(norm).expect("norm")[0]);
    assert!(
        (n - want.1).abs() <= 1e-5 * want.1,
        "norm {n} against {}",
        want.1
    );
}

/// One rank: nothing to exchange; the launch is the norm, three times (the epochs advance).
pub fn one_rank_is_the_norm<D: Driver>(b: &CudaBackend<D>) {
    let mut e = PeerExchange::new(b, 0, 1, LAST).expect("exchange");
    e.connect_addressable(&[e.receive_words()])
        .expect("connect");
    for round in 0..3 {
        let data = grads(0, round);
        let x = b.upload(&data, &[N]).expect("x");
        let norm = e.sum_and_norm(b, &x, WAIT).expect("launch");
        check(b, &x, &norm, &expected(&[data], 0));
    }
    assert!(!e.failed().expect("flag"));
}

/// Every refusal is typed, before anything is launched.
pub fn bad_arguments_are_refused<D: Driver>(b: &CudaBackend<D>) {
    for (rank, world, last) in [(0, 0, 10), (2, 2, 10), (0, 9, 10), (0, 2, 0)] {
        let e = PeerExchange::new(b, rank, world, last);
        assert!(
            matches!(e, Err(ComputeError::Unsupported { .. })),
            "rank {rank} of {world}, {last}: {e:?}"
        );
    }
    let mut e = PeerExchange::new(b, 0, 2, LAST).expect("exchange");
    let other = PeerExchange::new(b, 1, 2, LAST).expect("other");
    let x = b.upload(&grads(0, 0), &[N]).expect("x");
    let unconnected = e.sum_and_norm(b, &x, WAIT);
    assert!(
        matches!(unconnected, Err(ComputeError::Unsupported { .. })),
        "{unconnected:?}"
    );
    let one = e.connect_addressable(&[e.receive_words()]);
    assert!(
        matches!(one, Err(ComputeError::Unsupported { .. })),
        "{one:?}"
    );
    let not_own = e.connect_addressable(&[other.receive_words(), other.receive_words()]);
    assert!(
        matches!(not_own, Err(ComputeError::Unsupported { .. })),
        "{not_own:?}"
    );
    e.connect_addressable(&[e.receive_words(), other.receive_words()])
        .expect("connect");
    let again = e.connect_addressable(&[e.receive_words(), other.receive_words()]);
    assert!(
        matches!(again, Err(ComputeError::Unsupported { .. })),
        "{again:?}"
    );
    let short = b
        .upload(&grads(0, 0)[..LAST - 1], &[LAST - 1])
        .expect("short");
    let short = e.sum_and_norm(b, &short, WAIT);
    assert!(
        matches!(short, Err(ComputeError::Unsupported { .. })),
        "{short:?}"
    );
    let square = b
        .upload(&grads(0, 0)[..100 * 50], &[100, 50])
        .expect("square");
    let view = e.sum_and_norm(b, &square.transpose(0, 1).expect("view"), WAIT);
    assert!(
        matches!(view, Err(ComputeError::NotContiguous { .. })),
        "{view:?}"
    );
}

/// Ranks 0 and 1 of an exchange on `b`'s device, connected by their addresses, and each one's
/// round-0 gradients, on the host and uploaded.
fn two_ranks_on_one_device<D: Driver>(
    b: &CudaBackend<D>,
) -> ([PeerExchange<D>; 2], [Vec<f32>; 2], [CudaTensor; 2]) {
    let mut es = [0, 1].map(|r| PeerExchange::new(b, r, 2, LAST).expect("exchange"));
    let words = [es[0].receive_words(), es[1].receive_words()];
    for e in &mut es {
        e.connect_addressable(&words).expect("connect");
    }
    let all = [grads(0, 0), grads(1, 0)];
    let xs = [0, 1].map(|r| b.upload(&all[r], &[N]).expect("x"));
    (es, all, xs)
}

/// Writes into `to`'s receive words what rank `from`'s launch of epoch `epoch` stores there:
/// each of `values` with the epoch, in that epoch's half (a peer whose launch ran beside this
/// rank's, which one stream of the simulator cannot run).
fn place_words<D: Driver>(
    b: &CudaBackend<D>,
    to: &PeerExchange<D>,
    from: usize,
    values: &[f32],
    epoch: u32,
) {
    const WORLD: u64 = 2;
    let bytes: Vec<u8> = values
        .iter()
        .flat_map(|v| (u64::from(v.to_bits()) | (u64::from(epoch) << 32)).to_le_bytes())
        .collect();
    let at = (u64::from(epoch & 1) * WORLD + from as u64) * LAST as u64 * 8;
    let d = b.device();
    let staging = d.alloc_pinned(bytes.len() as u64).expect("staging");
    d.write_pinned(&staging, &bytes).expect("write");
    d.upload_async(
        to.receive_words().offset(at),
        &staging,
        bytes.len() as u64,
        d.stream(),
    )
    .expect("upload");
    d.synchronize(d.stream()).expect("placed");
    d.free_pinned(staging).expect("free");
}

/// Two ranks on one simulated device, one stream: rank 0's launch finds rank 1's words there
/// (placed as rank 1's launch beside it would store them) and sums both; it leaves its own in
/// rank 1's, so rank 1's launch after it sums both too. Neither failed.
pub fn simulated_ranks_see_the_ranks_launched_before<D: Driver>(b: &CudaBackend<D>) {
    let ([e0, e1], all, [x0, x1]) = two_ranks_on_one_device(b);
    place_words(b, &e0, 1, &all[1][..LAST], 1);
    let n0 = e0.sum_and_norm(b, &x0, WAIT).expect("rank 0");
    let n1 = e1.sum_and_norm(b, &x1, WAIT).expect("rank 1");
    check(b, &x0, &n0, &expected(&all, 0));
    check(b, &x1, &n1, &expected(&all, 1));
    assert!(!e0.failed().expect("flag 0"));
    assert!(!e1.failed().expect("flag 1"));
}

/// An exchange given up (`give_up`, what aborting the communicator does) fails every launch at
/// once, even one whose peer's words are there: the norm NaN, failed, and no peer named (none
/// was missing). Rank 1's words are placed in rank 0's, as in the test above, where rank 0 then
/// sums them. Only block 0 reads the host's flag at the start (a read of host memory a block
/// made the H200's launch 8.8 -> 422 us), so only its elements of the bucket are NaN; the other
/// blocks sum theirs, which nobody reads once the norm is NaN.
pub fn an_exchange_given_up_fails_its_launches<D: Driver>(b: &CudaBackend<D>) {
    let ([e0, _e1], all, [x0, _x1]) = two_ranks_on_one_device(b);
    place_words(b, &e0, 1, &all[1][..LAST], 1);
    e0.give_up().expect("give up");
    assert!(e0.failed().expect("flag"), "given up before any launch");
    let n0 = e0.sum_and_norm(b, &x0, WAIT).expect("rank 0");
    assert!(b.download(&n0).expect("n0")[0].is_nan());
    assert!(e0.failed().expect("flag"));
    assert_eq!(e0.silent_peer().expect("flag"), None);
    // N = 5000 is 3 blocks of 256 threads (stride 768): element 0 is block 0's, 300 block 1's.
    let x = b.download(&x0).expect("x0");
    let (want, _) = expected(&all, 0);
    assert!(x[0].is_nan(), "block 0 gave its values up: {}", x[0]);
    assert_eq!(x[300].to_bits(), want[300].to_bits(), "block 1 summed");
}

/// Issue 44: an exchange is given up also after its device was marked lost (what aborting a
/// communicator does first), and its next launch then fails at once. Before, `give_up` was
/// refused as "device lost" and the kernel spun on for a peer that had stopped.
pub fn an_exchange_is_given_up_after_its_device_was_abandoned<D: Driver>(b: &CudaBackend<D>) {
    let ([e0, _e1], _, _) = two_ranks_on_one_device(b);
    b.device()
        .abandon("the communicator was aborted; its collectives may never complete");
    e0.give_up()
        .expect("give up although the device is marked lost");
}

/// A wait as long as an hour: only giving up ends it before the device's deadline.
const FOREVER: Duration = Duration::from_secs(3600);

/// Rank 0 of two, connected to a rank 1 that never launches (its receive words on the same
/// device, which nobody writes: a peer that stopped), and rank 0's gradients uploaded.
fn rank_with_a_stopped_peer<D: Driver>(
    b: &CudaBackend<D>,
) -> (PeerExchange<D>, PeerExchange<D>, CudaTensor) {
    let mut e = PeerExchange::new(b, 0, 2, LAST).expect("exchange");
    let stopped = PeerExchange::new(b, 1, 2, LAST).expect("the stopped peer's side");
    e.connect_addressable(&[e.receive_words(), stopped.receive_words()])
        .expect("connect");
    let x = b.upload(&grads(0, 0), &[N]).expect("x");
    (e, stopped, x)
}

/// Issue 44: a launch waiting on a peer that stopped does not end by itself (its wait is longer
/// than the device's deadline), so the stream behind it cannot drain and the host's wait ends
/// at its deadline with a typed `Timeout`. `give_up`, a store from the host that goes through no
/// stream, ends the launch: the stream drains at once, the norm is NaN, and the exchange failed
/// waiting for rank 1.
pub fn a_peer_wait_gives_up_from_the_host<D: Driver>(b: &CudaBackend<D>) {
    let (e, _stopped, x) = rank_with_a_stopped_peer(b);
    let norm = e.sum_and_norm(b, &x, FOREVER).expect("launch");
    let dev = b.device();
    let r = dev.synchronize(dev.stream());
    assert!(
        matches!(
            r,
            Err(zdevice::DeviceError::Timeout {
                device_lost: false,
                ..
            })
        ),
        "the launch waits for its peer, and the stream behind it: {r:?}"
    );
    let start = dev.driver().now();
    e.give_up().expect("give up");
    dev.synchronize(dev.stream())
        .expect("the launch gave up: the stream drains");
    let took = dev.driver().now().saturating_sub(start);
    assert!(
        took < dev.config().sync_deadline / 10,
        "giving up took {took:?} on the device's clock"
    );
    assert!(b.download(&norm).expect("norm")[0].is_nan());
    assert!(e.failed().expect("flag"));
    assert_eq!(
        e.silent_peer().expect("flag"),
        Some(1),
        "the peer that did not answer"
    );
}

/// Issue 44: dropping an exchange whose launch waits on a peer that stopped (a rank's
/// teardown) gives the launch up first and does not wait behind it: the drop returns within a
/// tenth of the device's deadline on its clock, and the stream then drains.
pub fn dropping_an_exchange_waiting_on_a_stopped_peer_does_not_wait_for_it<D: Driver>(
    b: &CudaBackend<D>,
) {
    let (e, stopped, x) = rank_with_a_stopped_peer(b);
    let _norm = e.sum_and_norm(b, &x, FOREVER).expect("launch");
    let dev = b.device();
    let start = dev.driver().now();
    drop(e);
    let took = dev.driver().now().saturating_sub(start);
    assert!(
        took < dev.config().sync_deadline / 10,
        "dropping the exchange waited {took:?} on the device's clock"
    );
    dev.synchronize(dev.stream())
        .expect("the launch gave up: the stream drains");
    assert!(dev.lost_reason().is_none(), "{:?}", dev.lost_reason());
    drop(stopped);
}

/// Issue 44: freeing pinned memory on one thread while a launch waits on a peer that stopped
/// (`cuMemFreeHost` may wait for the device, which waits for the launch) does not hold up the
/// give-up another thread stores, which is what ends that launch: both return. Before the fix
/// the driver held its pinned-memory map locked across `cuMemFreeHost` and the store waited
/// for the lock: a deadlock, reported here after a minute (the process aborts, since the
/// threads cannot be joined). On the simulator the free does not wait for the device.
pub fn a_pinned_free_waiting_for_the_device_does_not_hold_up_giving_up<D: Driver>(
    b: &CudaBackend<D>,
) {
    let (e, _stopped, x) = rank_with_a_stopped_peer(b);
    let dev = b.device();
    let other = dev.alloc_pinned(64).expect("another pinned buffer");
    let _norm = e.sum_and_norm(b, &x, FOREVER).expect("launch");
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        let freeing = done.clone();
        s.spawn(move || {
            dev.free_pinned(other).expect("free");
            freeing.send("free").ok();
        });
        // Lets the free start first where it can (if it has not, the give-up below is merely
        // not behind it: the test cannot fail for that reason).
        std::thread::sleep(Duration::from_millis(200));
        let e = &e;
        s.spawn(move || {
            e.give_up().expect("give up");
            done.send("give up").ok();
        });
        for _ in 0..2 {
            if finished.recv_timeout(Duration::from_secs(60)).is_err() {
                // A panic here would wait for the deadlocked threads (the scope joins them):
                // the message, then the process ends.
                #[allow(clippy::print_stderr)]
                {
                    eprintln!(
                        "a pinned free and a give-up from another thread did not both return in 60 s: \
                         the give-up's store waits behind the free (a deadlock)"
                    );
                }
                std::process::abort();
            }
        }
    });
    dev.synchronize(dev.stream())
        .expect("the launch gave up: the stream drains");
    assert!(e.failed().expect("flag"));
}

/// CUDA IPC needs a second process; the simulator has none: connecting by handles is a typed
/// error and leaves the exchange unconnected.
pub fn handles_do_not_connect_on_the_simulator<D: Driver>(b: &CudaBackend<D>) {
    let mut e = PeerExchange::new(b, 0, 2, LAST).expect("exchange");
    let other = PeerExchange::new(b, 1, 2, LAST).expect("other");
    let handles = [
        e.handle().expect("handle"),
        other.handle().expect("other's handle"),
    ];
    assert_ne!(handles[0], handles[1]);
    let r = e.connect(&handles);
    assert!(matches!(r, Err(ComputeError::Device { .. })), "{r:?}");
    let x = b.upload(&grads(0, 0), &[N]).expect("x");
    let r = e.sum_and_norm(b, &x, WAIT);
    assert!(matches!(r, Err(ComputeError::Unsupported { .. })), "{r:?}");
}

mod mock {
    #[test]
    fn one_rank_is_the_norm() {
        super::one_rank_is_the_norm(&super::super::mock());
    }

    #[test]
    fn bad_arguments_are_refused() {
        super::bad_arguments_are_refused(&super::super::mock());
    }

    #[test]
    fn simulated_ranks_see_the_ranks_launched_before() {
        super::simulated_ranks_see_the_ranks_launched_before(&super::super::mock());
    }

    #[test]
    fn an_exchange_given_up_fails_its_launches() {
        super::an_exchange_given_up_fails_its_launches(&super::super::mock());
    }

    /// Neither the backend nor an exchange, made, connected, launched and asked whether it
    /// failed, queues work on the legacy default stream (synchronous memsets and copies):
    /// zeroing the exchange's fresh memory there made every node of ztrain's two-GPU step
    /// start about 0.3 us later. (`give_up` stores its flag from the host: no stream at all.)
    #[test]
    fn nothing_goes_on_the_legacy_default_stream() {
        use zdevice::sim::calls::{MEMCPY_DTOD, MEMCPY_DTOH, MEMCPY_HTOD, MEMSET_D8, MEMSET_D32};
        let (b, ctl) = super::super::counted_mock();
        let calls = [MEMSET_D8, MEMSET_D32, MEMCPY_HTOD, MEMCPY_DTOD, MEMCPY_DTOH];
        let legacy = || calls.map(|c| ctl.call_count(c));
        assert_eq!(legacy(), [0; 5], "the backend");
        // Made, connected, launched and asked whether it failed.
        super::simulated_ranks_see_the_ranks_launched_before(&b);
        assert_eq!(legacy(), [0; 5], "the exchanges");
    }

    #[test]
    fn an_exchange_is_given_up_after_its_device_was_abandoned() {
        super::an_exchange_is_given_up_after_its_device_was_abandoned(&super::super::mock());
    }

    #[test]
    fn a_peer_wait_gives_up_from_the_host() {
        super::a_peer_wait_gives_up_from_the_host(&super::super::mock());
    }

    #[test]
    fn dropping_an_exchange_waiting_on_a_stopped_peer_does_not_wait_for_it() {
        super::dropping_an_exchange_waiting_on_a_stopped_peer_does_not_wait_for_it(
            &super::super::mock(),
        );
    }

    #[test]
    fn a_pinned_free_waiting_for_the_device_does_not_hold_up_giving_up() {
        super::a_pinned_free_waiting_for_the_device_does_not_hold_up_giving_up(
            &super::super::mock(),
        );
    }

    #[test]
    fn handles_do_not_connect_on_the_simulator() {
        super::handles_do_not_connect_on_the_simulator(&super::super::mock());
    }
}

#[cfg(feature = "gpu")]
mod gpu {
    use super::{LAST, N, check, expected, grads};
    use std::time::Duration;
    use zcompute::CudaBackend;
    use zcompute::cuda::PeerExchange;
    use zcompute::prelude::*;
    use zdevice::{CudaDriver, Device, DeviceConfig};

    /// A backend of its own on CUDA device 0: its own engine stream, so two ranks' launches
    /// run side by side.
    fn rank_backend() -> CudaBackend<CudaDriver> {
        let driver = CudaDriver::load().expect("the CUDA driver loads on a GPU machine");
        let dev = Device::open(driver, DeviceConfig::default()).expect("CUDA device 0 opens");
        super::super::backend_on(dev)
    }

    /// Ranks 0 and 1, each on a backend of its own (two streams of device 0), connected.
    fn two_ranks() -> ([CudaBackend<CudaDriver>; 2], Vec<PeerExchange<CudaDriver>>) {
        let bs = [rank_backend(), rank_backend()];
        let mut es: Vec<_> = (0..2)
            .map(|r| PeerExchange::new(&bs[r], r, 2, LAST).expect("exchange"))
            .collect();
        let words = [es[0].receive_words(), es[1].receive_words()];
        for e in &mut es {
            e.connect_addressable(&words).expect("connect");
        }
        (bs, es)
    }

    #[test]
    fn gpu_one_rank_is_the_norm() {
        super::one_rank_is_the_norm(&super::super::gpu());
    }

    #[test]
    fn gpu_bad_arguments_are_refused() {
        super::bad_arguments_are_refused(&super::super::gpu());
    }

    /// The simulated twin's given-up launch on the GPU (one device, the words placed).
    #[test]
    fn gpu_an_exchange_given_up_on_one_device_fails_its_launches() {
        super::an_exchange_given_up_fails_its_launches(&super::super::gpu());
    }

    /// Two ranks on two streams of one GPU, three rounds (both halves of the words, epochs 1
    /// to 3): each holds the bucket summed in rank order, bit for bit, and the norm.
    #[test]
    fn gpu_two_ranks_sum_in_rank_order() {
        let (bs, es) = two_ranks();
        for round in 0..3 {
            let all = [grads(0, round), grads(1, round)];
            let xs: Vec<_> = (0..2)
                .map(|r| bs[r].upload(&all[r], &[N]).expect("x"))
                .collect();
            let norms: Vec<_> = (0..2)
                .map(|r| {
                    es[r]
                        .sum_and_norm(&bs[r], &xs[r], super::WAIT)
                        .expect("launch")
                })
                .collect();
            for r in 0..2 {
                check(&bs[r], &xs[r], &norms[r], &expected(&all, r));
            }
        }
        assert!(!es[0].failed().expect("flag") && !es[1].failed().expect("flag"));
    }

    /// What aborting a communicator does: rank 1 launches and leaves its words in rank 0's
    /// (then gives up on rank 0 after 5 ms); rank 0, given up, fails its launch at once
    /// although its peer's words are there (without `give_up` it would sum them).
    #[test]
    fn gpu_an_exchange_given_up_fails_its_launches() {
        let (bs, es) = two_ranks();
        let xs: Vec<_> = (0..2)
            .map(|r| bs[r].upload(&grads(r, 0), &[N]).expect("x"))
            .collect();
        let n1 = es[1]
            .sum_and_norm(&bs[1], &xs[1], Duration::from_millis(5))
            .expect("rank 1");
        assert!(bs[1].download(&n1).expect("n1")[0].is_nan());
        es[0].give_up().expect("give up");
        let n0 = es[0]
            .sum_and_norm(&bs[0], &xs[0], super::WAIT)
            .expect("rank 0");
        assert!(bs[0].download(&n0).expect("n0")[0].is_nan());
        assert!(es[0].failed().expect("flag"));
    }

    /// A rank whose peer never launches gives up after its timeout: NaN, failed.
    #[test]
    fn gpu_a_peer_that_never_comes_times_out() {
        let b = rank_backend();
        let mut e = PeerExchange::new(&b, 0, 2, LAST).expect("exchange");
        let other = PeerExchange::new(&b, 1, 2, LAST).expect("other");
        e.connect_addressable(&[e.receive_words(), other.receive_words()])
            .expect("connect");
        let x = b.upload(&grads(0, 0), &[N]).expect("x");
        let norm = e
            .sum_and_norm(&b, &x, Duration::from_millis(5))
            .expect("launch");
        assert!(b.download(&norm).expect("norm")[0].is_nan());
        assert!(e.failed().expect("flag"));
        assert_eq!(e.silent_peer().expect("flag"), Some(1));
    }

    /// A backend of its own on CUDA device 0 whose waits end after 2 s.
    fn short_deadline_backend() -> CudaBackend<CudaDriver> {
        let driver = CudaDriver::load().expect("the CUDA driver loads on a GPU machine");
        let config = DeviceConfig {
            sync_deadline: Duration::from_secs(2),
            ..DeviceConfig::default()
        };
        let dev = Device::open(driver, config).expect("CUDA device 0 opens");
        super::super::backend_on(dev)
    }

    /// Issue 44 on one GPU: the launch spins on a peer whose words never arrive (rank 1's
    /// receive words on the same device, which nobody writes); the stream's wait ends at 2 s;
    /// the give-up flag, stored from the host into mapped memory, ends the launch within
    /// 0.2 s; NaN, failed, rank 1 named.
    #[test]
    fn gpu_a_peer_wait_gives_up_from_the_host() {
        super::a_peer_wait_gives_up_from_the_host(&short_deadline_backend());
    }

    /// Issue 44 on one GPU: dropping the exchange while its launch spins on a peer that never
    /// comes returns within 0.2 s, and the stream then drains.
    #[test]
    fn gpu_dropping_an_exchange_waiting_on_a_stopped_peer_does_not_wait_for_it() {
        super::dropping_an_exchange_waiting_on_a_stopped_peer_does_not_wait_for_it(
            &short_deadline_backend(),
        );
    }

    /// Issue 44 on one GPU: `cuMemFreeHost` on one thread while the launch spins on a peer
    /// that never comes, and the give-up stored from another thread: both return (the free
    /// once the launch gave up), no deadlock on the driver's pinned-memory map.
    #[test]
    fn gpu_a_pinned_free_waiting_for_the_device_does_not_hold_up_giving_up() {
        super::a_pinned_free_waiting_for_the_device_does_not_hold_up_giving_up(
            &short_deadline_backend(),
        );
    }
}
