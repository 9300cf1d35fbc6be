//! The conformance suite: one body per behaviour, run against every driver (the mock always,
//! the CUDA device under the `gpu` feature). Bodies return `Result<(), String>` so a negative
//! control can assert that a body fails.

use zdevice::*;

use crate::util::*;

/// Alloc, upload, download and free `bytes` bytes (odd sizes included).
pub fn alloc_copy_round_trip<D: Driver>(dev: &Device<D>, bytes: usize) -> Check {
    let data: Vec<u8> = (0..bytes).map(|i| (i * 31 + 7) as u8).collect();
    let a = dev.alloc(bytes as u64).map_err(s)?;
    let b = dev.alloc(bytes as u64).map_err(s)?;
    dev.copy_htod(a, &data).map_err(s)?;
    dev.copy_dtod(b, a, bytes as u64).map_err(s)?;
    let mut back = vec![0u8; bytes];
    dev.copy_dtoh(&mut back, b).map_err(s)?;
    dev.free(a).map_err(s)?;
    dev.free(b).map_err(s)?;
    ensure(
        back == data,
        format!("round trip of {bytes} bytes changed the data"),
    )
}

/// Work queued on one stream runs in order; a second stream ordered by an event sees it.
pub fn stream_ordering<D: Driver>(dev: &Device<D>) -> Check {
    let n = 4099u64;
    let s1 = dev.stream();
    let s2 = dev.create_stream().map_err(s)?;
    let [a, b, c, d] = [0; 4].map(|_| dev.alloc(n * 4));
    let (a, b, c, d) = (a.map_err(s)?, b.map_err(s)?, c.map_err(s)?, d.map_err(s)?);
    dev.memset_d32_async(a, 1.0f32.to_bits(), n, s1)
        .map_err(s)?;
    dev.copy_dtod_async(b, a, n * 4, s1).map_err(s)?;
    dev.memset_d32_async(a, 2.0f32.to_bits(), n, s1)
        .map_err(s)?;
    dev.copy_dtod_async(c, a, n * 4, s1).map_err(s)?;
    let done = dev.create_event(false).map_err(s)?;
    dev.record_event(done, s1).map_err(s)?;
    dev.stream_wait_event(s2, done).map_err(s)?;
    dev.copy_dtod_async(d, c, n * 4, s2).map_err(s)?;
    dev.synchronize(s2).map_err(s)?;
    dev.synchronize(s1).map_err(s)?;
    ensure(
        read_f32(dev, b, n as usize)?.iter().all(|&x| x == 1.0),
        "first copy saw later work",
    )?;
    ensure(
        read_f32(dev, c, n as usize)?.iter().all(|&x| x == 2.0),
        "second copy missed work",
    )?;
    ensure(
        read_f32(dev, d, n as usize)?.iter().all(|&x| x == 2.0),
        "event did not order s2",
    )?;
    dev.destroy_event(done).map_err(s)?;
    for p in [a, b, c, d] {
        dev.free(p).map_err(s)?;
    }
    Ok(())
}

/// Events complete, can be waited on with a deadline, and time work.
pub fn events<D: Driver>(dev: &Device<D>) -> Check {
    let n = 1 << 20;
    let p = dev.alloc(n).map_err(s)?;
    let start = dev.create_event(true).map_err(s)?;
    let end = dev.create_event(true).map_err(s)?;
    dev.record_event(start, dev.stream()).map_err(s)?;
    dev.memset_d8_async(p, 3, n, dev.stream()).map_err(s)?;
    dev.record_event(end, dev.stream()).map_err(s)?;
    dev.wait_event(end).map_err(s)?;
    let ms = dev.elapsed_ms(start, end).map_err(s)?;
    ensure(ms >= 0.0 && ms.is_finite(), format!("elapsed {ms} ms"))?;
    let mut back = vec![0u8; n as usize];
    dev.copy_dtoh(&mut back, p).map_err(s)?;
    ensure(
        back.iter().all(|&x| x == 3),
        "memset before the event did not land",
    )?;
    dev.destroy_event(start).map_err(s)?;
    dev.destroy_event(end).map_err(s)?;
    dev.free(p).map_err(s)
}

/// One strided batched gemm against a float64 reference (row-major view, see `util::Gemm`).
pub fn gemm_against_f64<D: Driver>(dev: &Device<D>, g: Gemm) -> Check {
    let (a, b) = (g.random_a(1), g.random_b(2));
    let c0 = vec![f32::NAN; g.c_len()]; // beta = 0 must not read C
    let (da, db, dc) = (upload(dev, &a)?, upload(dev, &b)?, upload(dev, &c0)?);
    // SAFETY: the operands were allocated above with the sizes `Gemm` describes and are freed
    // only after the synchronize below.
    unsafe { dev.gemm_f32(&g.desc(da, db, dc, 0.0), dev.stream()) }.map_err(s)?;
    dev.synchronize(dev.stream()).map_err(s)?;
    let got = read_f32(dev, dc, g.c_len())?;
    let want = g.reference(&a, &b);
    for p in [da, db, dc] {
        dev.free(p).map_err(s)?;
    }
    let err = rel_err(&got, &want);
    ensure(err <= 1e-5, format!("{g:?}: relative error {err:e}"))
}

/// Capture copies, memsets, a gemm and a kernel launch; replay with new input data.
pub fn capture_and_replay<D: Driver>(dev: &Device<D>, fill: &LoadedModule<D>) -> Check {
    let g = Gemm {
        batch: 2,
        m: 5,
        n: 3,
        k: 4,
        ta: false,
        tb: true,
    };
    let input = dev.alloc((g.a_len() * 4) as u64).map_err(s)?;
    let work_a = upload(dev, &vec![0.0; g.a_len()])?;
    let b = upload(dev, &g.random_b(9))?;
    let c = upload(dev, &vec![0.0; g.c_len()])?;
    let marker = dev.alloc(256).map_err(s)?;
    let axpy = fill.function("axpy_f32").map_err(s)?;
    let stream = dev.stream();
    let graph = {
        let cap = dev.begin_capture(stream).map_err(s)?;
        dev.copy_dtod_async(work_a, input, (g.a_len() * 4) as u64, stream)
            .map_err(s)?;
        let n = g.a_len() as u64;
        let args = [
            KernelArg::Ptr(work_a),
            KernelArg::Ptr(input),
            KernelArg::F32(0.5),
            KernelArg::U64(n),
        ];
        // SAFETY: axpy_f32(float* y, const float* x, float a, unsigned long long n) with y and x
        // holding n floats each, live until the graph is dropped below.
        unsafe { dev.launch(axpy, LaunchConfig::linear(n, 128, 1), &args, stream) }.map_err(s)?;
        // SAFETY: operands sized by `g`, live until after the last replay.
        unsafe { dev.gemm_f32(&g.desc(work_a, b, c, 0.0), stream) }.map_err(s)?;
        dev.memset_d8_async(marker, 0x5a, 256, stream).map_err(s)?;
        cap.end().map_err(s)?
    };
    let nodes = graph.node_count().map_err(s)?;
    ensure(
        nodes >= 4,
        format!("graph has {nodes} nodes, expected at least 4"),
    )?;
    let exec = graph.instantiate(InstantiateFlags::default()).map_err(s)?;
    let bh = read_f32(dev, b, g.b_len())?;
    for round in 0..3u64 {
        let x = g.random_a(100 + round);
        dev.copy_htod(input, &f32_bytes(&x)).map_err(s)?;
        dev.memset_d8(marker, 0, 256).map_err(s)?;
        exec.launch(stream).map_err(s)?;
        dev.synchronize(stream).map_err(s)?;
        let scaled: Vec<f32> = x.iter().map(|v| v * 1.5).collect();
        let err = rel_err(&read_f32(dev, c, g.c_len())?, &g.reference(&scaled, &bh));
        ensure(
            err <= 1e-5,
            format!("replay {round}: relative error {err:e}"),
        )?;
        let mut m = vec![0u8; 256];
        dev.copy_dtoh(&mut m, marker).map_err(s)?;
        ensure(
            m.iter().all(|&v| v == 0x5a),
            format!("replay {round}: memset node did not run"),
        )?;
    }
    drop(exec);
    drop(graph);
    for p in [input, work_a, b, c, marker] {
        dev.free(p).map_err(s)?;
    }
    still_usable(dev)
}

/// The guard refuses the silent rows: during capture, synchronous memset/copies fail with
/// `CaptureIllegal`; the graph holds only the async memset, and a replay writes only it.
pub fn guard_refuses_silent_rows<D: Driver>(dev: &Device<D>) -> Check {
    let a = dev.alloc(1024).map_err(s)?;
    let b = dev.alloc(1024).map_err(s)?;
    let host = vec![7u8; 1024];
    let stream = dev.stream();
    let mut refusals = Vec::new();
    let graph = {
        let cap = dev.begin_capture(stream).map_err(s)?;
        refusals.push(dev.memset_d8(a, 0, 1024));
        refusals.push(dev.copy_htod(a, &host));
        refusals.push(dev.copy_dtod(a, b, 1024));
        dev.memset_d8_async(b, 5, 1024, stream).map_err(s)?;
        cap.end().map_err(s)?
    };
    let nodes = graph.node_count().map_err(s)?;
    let exec = graph.instantiate(InstantiateFlags::default()).map_err(s)?;
    dev.memset_d8(a, 9, 1024).map_err(s)?;
    exec.launch(stream).map_err(s)?;
    dev.synchronize(stream).map_err(s)?;
    let (mut ha, mut hb) = (vec![0u8; 1024], vec![0u8; 1024]);
    dev.copy_dtoh(&mut ha, a).map_err(s)?;
    dev.copy_dtoh(&mut hb, b).map_err(s)?;
    drop(exec);
    drop(graph);
    dev.free(a).map_err(s)?;
    dev.free(b).map_err(s)?;
    still_usable(dev)?;
    for r in refusals {
        match r {
            Err(DeviceError::CaptureIllegal { .. }) => {}
            other => {
                return Err(format!(
                    "a synchronous call during capture was not refused: {other:?}"
                ));
            }
        }
    }
    ensure(nodes == 1, format!("graph has {nodes} nodes, expected 1"))?;
    ensure(
        ha.iter().all(|&v| v == 9),
        "replay wrote buffer a, which no node should touch",
    )?;
    ensure(
        hb.iter().all(|&v| v == 5),
        "replay did not run the async memset",
    )
}

/// The device is usable: a small round trip and a sync succeed, and no capture is active.
pub fn still_usable<D: Driver>(dev: &Device<D>) -> Check {
    ensure(!dev.is_capturing(), "a capture is still active")?;
    alloc_copy_round_trip(dev, 1000)?;
    dev.synchronize(dev.stream()).map_err(s)
}

/// A thread that waits on the device during another thread's capture holds off, and the
/// capture stays valid.
pub fn waiter_does_not_invalidate_capture<D: Driver>(dev: &Device<D>) -> Check {
    let a = dev.alloc(4096).map_err(s)?;
    let stream = dev.stream();
    let cap = dev.begin_capture(stream).map_err(s)?;
    let waiter = {
        let dev = dev.clone();
        std::thread::spawn(move || dev.synchronize(dev.stream()))
    };
    // Give the waiter time to reach its wait while we capture.
    std::thread::sleep(std::time::Duration::from_millis(50));
    dev.memset_d8_async(a, 1, 4096, stream).map_err(s)?;
    let graph = cap
        .end()
        .map_err(|e| format!("capture did not survive the waiter: {e}"))?;
    waiter
        .join()
        .map_err(|_| "waiter panicked".to_string())?
        .map_err(s)?;
    let nodes = graph.node_count().map_err(s)?;
    drop(graph);
    dev.free(a).map_err(s)?;
    ensure(nodes == 1, format!("graph has {nodes} nodes"))?;
    still_usable(dev)
}

/// A stream of the greatest priority forked from the engine stream inside a capture: its
/// kernel keeps that priority in the graph (instantiated with `use_node_priority`), and the
/// replays compute what the same work does on one stream.
pub fn prioritized_side_stream_in_a_graph<D: Driver>(
    dev: &Device<D>,
    fill: &LoadedModule<D>,
) -> Check {
    let range = dev.stream_priority_range().map_err(s)?;
    ensure(
        range.greatest <= range.least,
        format!("priority range {range:?}: the greatest is numerically the lowest"),
    )?;
    let side = dev
        .create_stream_with_priority(StreamPriority::High)
        .map_err(s)?;
    let n = 4099u64;
    let y = upload(dev, &vec![1.0; n as usize])?;
    let x = upload(dev, &vec![2.0; n as usize])?;
    let marker = dev.alloc(256).map_err(s)?;
    let (forked, joined) = (
        dev.create_event(false).map_err(s)?,
        dev.create_event(false).map_err(s)?,
    );
    let axpy = fill.function("axpy_f32").map_err(s)?;
    let engine = dev.stream();
    let graph = {
        let cap = dev.begin_capture(engine).map_err(s)?;
        dev.record_event(forked, engine).map_err(s)?;
        dev.stream_wait_event(side, forked).map_err(s)?;
        let args = [
            KernelArg::Ptr(y),
            KernelArg::Ptr(x),
            KernelArg::F32(0.5),
            KernelArg::U64(n),
        ];
        // SAFETY: axpy_f32(float* y, const float* x, float a, unsigned long long n) with y and x
        // holding n floats each, live until the graph is dropped below.
        unsafe { dev.launch(axpy, LaunchConfig::linear(n, 128, 1), &args, side) }.map_err(s)?;
        dev.record_event(joined, side).map_err(s)?;
        dev.stream_wait_event(engine, joined).map_err(s)?;
        dev.memset_d8_async(marker, 0x5a, 256, engine).map_err(s)?;
        cap.end().map_err(s)?
    };
    let exec = graph
        .instantiate(InstantiateFlags {
            use_node_priority: true,
            ..InstantiateFlags::default()
        })
        .map_err(s)?;
    for round in 1..=2u32 {
        dev.memset_d8(marker, 0, 256).map_err(s)?;
        exec.launch(engine).map_err(s)?;
        dev.synchronize(engine).map_err(s)?;
        let want = 1.0 + round as f32;
        ensure(
            read_f32(dev, y, n as usize)?.iter().all(|&v| v == want),
            format!("replay {round}: the side stream's kernel did not add once"),
        )?;
        let mut m = vec![0u8; 256];
        dev.copy_dtoh(&mut m, marker).map_err(s)?;
        ensure(
            m.iter().all(|&v| v == 0x5a),
            format!("replay {round}: the engine's node after the join did not run"),
        )?;
    }
    drop(exec);
    drop(graph);
    dev.destroy_event(forked).map_err(s)?;
    dev.destroy_event(joined).map_err(s)?;
    for p in [y, x, marker] {
        dev.free(p).map_err(s)?;
    }
    still_usable(dev)
}
