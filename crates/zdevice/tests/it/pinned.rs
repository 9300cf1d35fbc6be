//! Pinned host memory lent in place (`Device::pinned_f32_mut`): what is written through the
//! loan is what the next upload carries, and a loan waits for the upload that last read the
//! buffer, so refilling a batch while its previous upload is in flight cannot change it.

use crate::util::{Check, ensure, read_f32, s};
use zdevice::{Device, DeviceConfig, Driver, SimDriver};

/// Fills a pinned buffer in place, uploads it, refills it at once (the first upload may still
/// be queued), uploads that into a second range, and reads both back.
pub fn lend_fill_upload_refill<D: Driver>(dev: &Device<D>, words: usize) -> Check {
    let bytes = (words * 4) as u64;
    let mut buf = dev.alloc_pinned(bytes).map_err(s)?;
    let (a, b) = (dev.alloc(bytes).map_err(s)?, dev.alloc(bytes).map_err(s)?);
    let first: Vec<f32> = (0..words).map(|i| i as f32 * 0.5 - 3.0).collect();
    let lent = dev
        .pinned_f32_mut(&mut buf, |v| {
            v.copy_from_slice(&first);
            v.len()
        })
        .map_err(s)?;
    ensure(lent == words, format!("lent {lent} f32, want {words}"))?;
    dev.upload_async(a, &buf, bytes, dev.stream()).map_err(s)?;
    let second: Vec<f32> = first.iter().map(|v| -v).collect();
    dev.pinned_f32_mut(&mut buf, |v| v.copy_from_slice(&second))
        .map_err(s)?;
    dev.upload_async(b, &buf, bytes, dev.stream()).map_err(s)?;
    dev.synchronize(dev.stream()).map_err(s)?;
    ensure(
        read_f32(dev, a, words)? == first,
        "the first upload changed",
    )?;
    ensure(
        read_f32(dev, b, words)? == second,
        "the refill did not arrive",
    )?;
    // The loan also reads what a download left there.
    dev.download_async(&buf, a, bytes, dev.stream())
        .map_err(s)?;
    let back = dev.pinned_f32_mut(&mut buf, |v| v.to_vec()).map_err(s)?;
    ensure(back == first, "the loan did not wait for the download")?;
    dev.free_pinned(buf).map_err(s)?;
    dev.free(a).map_err(s)?;
    dev.free(b).map_err(s)
}

fn sim() -> Device<SimDriver> {
    Device::open(SimDriver::default(), DeviceConfig::default()).expect("the simulated device")
}

#[test]
fn lend_fill_upload_refill_on_the_simulator() {
    for words in [1, 7, 1024, 300_001] {
        lend_fill_upload_refill(&sim(), words).unwrap();
    }
}

/// The upload is still queued when the buffer is refilled (the simulator runs copies when
/// the stream is waited on, reading host memory then): the loan must wait for it first.
/// Without the wait the device got the refill (checked by reverting `settle` in the loan).
#[test]
fn a_refill_waits_for_the_upload_in_flight() {
    let dev = sim();
    let mut buf = dev.alloc_pinned(64).unwrap();
    let dst = dev.alloc(64).unwrap();
    dev.pinned_f32_mut(&mut buf, |v| v.fill(1.0)).unwrap();
    dev.upload_async(dst, &buf, 64, dev.stream()).unwrap();
    assert!(
        dev.driver().pending_ops(dev.stream()) > 0,
        "the upload is in flight"
    );
    dev.pinned_f32_mut(&mut buf, |v| v.fill(2.0)).unwrap();
    assert_eq!(dev.driver().pending_ops(dev.stream()), 0, "the loan waited");
    dev.synchronize(dev.stream()).unwrap();
    assert_eq!(read_f32(&dev, dst, 16).unwrap(), vec![1.0; 16]);
    dev.free_pinned(buf).unwrap();
    dev.free(dst).unwrap();
}

/// A buffer of a length that is no whole number of f32 lends its whole words; an empty
/// one lends nothing. Neither is an error.
#[test]
fn partial_words_are_left_out_of_the_loan() {
    let dev = sim();
    let mut buf = dev.alloc_pinned(10).unwrap();
    assert_eq!(dev.pinned_f32_mut(&mut buf, |v| v.len()).unwrap(), 2);
    dev.free_pinned(buf).unwrap();
}

/// A range from inside the buffer (a rank's shard of a batch) lands whole; a range past the
/// end is refused before anything is queued.
#[test]
fn a_range_from_the_middle_uploads_and_one_past_the_end_is_refused() {
    let dev = sim();
    let mut buf = dev.alloc_pinned(40).unwrap();
    let dst = dev.alloc(16).unwrap();
    dev.pinned_f32_mut(&mut buf, |v| {
        for (i, x) in v.iter_mut().enumerate() {
            *x = i as f32;
        }
    })
    .unwrap();
    dev.upload_range_async(dst, &buf, 12, 16, dev.stream())
        .unwrap();
    dev.synchronize(dev.stream()).unwrap();
    assert_eq!(read_f32(&dev, dst, 4).unwrap(), vec![3.0, 4.0, 5.0, 6.0]);
    let err = dev.upload_range_async(dst, &buf, 28, 16, dev.stream());
    assert!(
        matches!(err, Err(zdevice::DeviceError::InvalidArgument { .. })),
        "{err:?}"
    );
    dev.free_pinned(buf).unwrap();
    dev.free(dst).unwrap();
}

/// A loan while the device's stream is being captured. Lending is host memory only, so a
/// buffer whose last transfer has finished is lent and the capture goes on, its graph without
/// a node for it; a buffer whose upload is still queued would have to wait on that upload's
/// event, which no capture allows (docs/capture-rules.md: cuEventQuery during a global capture
/// invalidates it), so the loan is refused with a typed error before the closure runs and the
/// buffer keeps what the upload reads.
pub fn lend_during_capture<D: Driver>(dev: &Device<D>) -> Check {
    let mut settled = dev.alloc_pinned(64).map_err(s)?;
    let mut queued = dev.alloc_pinned(64).map_err(s)?;
    let dst = dev.alloc(64).map_err(s)?;
    dev.pinned_f32_mut(&mut queued, |v| v.fill(1.0))
        .map_err(s)?;
    dev.upload_async(dst, &queued, 64, dev.stream())
        .map_err(s)?;
    let capture = dev.begin_capture(dev.stream()).map_err(s)?;
    let lent = dev.pinned_f32_mut(&mut settled, |v| {
        v.fill(3.0);
        v.len()
    });
    let mut ran = false;
    let refused = dev.pinned_f32_mut(&mut queued, |v| {
        ran = true;
        v.fill(2.0);
    });
    let graph = capture.end().map_err(|e| s(e.error()))?;
    let nodes = graph.node_count().map_err(s)?;
    drop(graph);
    ensure(
        matches!(lent, Ok(16)),
        format!("a settled buffer: {lent:?}"),
    )?;
    ensure(nodes == 0, format!("the loans left {nodes} graph nodes"))?;
    ensure(
        matches!(refused, Err(zdevice::DeviceError::CaptureIllegal { .. })),
        format!("a queued buffer during capture: {refused:?}"),
    )?;
    ensure(!ran, "the closure ran on a buffer still being uploaded")?;
    dev.synchronize(dev.stream()).map_err(s)?;
    ensure(
        read_f32(dev, dst, 16)? == vec![1.0; 16],
        "the upload changed",
    )?;
    let after = dev
        .pinned_f32_mut(&mut settled, |v| v.to_vec())
        .map_err(s)?;
    ensure(after == vec![3.0; 16], "the loan during capture was lost")?;
    dev.free_pinned(settled).map_err(s)?;
    dev.free_pinned(queued).map_err(s)?;
    dev.free(dst).map_err(s)
}

#[test]
fn lend_during_capture_on_the_simulator() {
    lend_during_capture(&sim()).unwrap();
}
