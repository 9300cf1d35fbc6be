//! Queued downloads (`ReadbackOps::queue_download`): each reads its source as the stream left it
//! at the copy, in logical order (a strided view too), whatever is queued after it, and is
//! ready once waited for. Bodies generic over the driver: the simulated device here, CUDA
//! device 0 under `gpu`.

use zcompute::{Backend, CudaBackend, ReadbackOps};
use zdevice::Driver;

fn queued_downloads_read_their_copy<D: Driver>(b: &CudaBackend<D>) {
    let values: Vec<f32> = (0..4096).map(|i| i as f32 * 0.25).collect();
    let x = b.upload(&values, &[64, 64]).expect("upload");
    let whole = b.queue_download(&x).expect("queued");
    let column = b
        .queue_download(&x.narrow(1, 3, 1).expect("narrow"))
        .expect("queued");
    // Work after the copies writes their source many times over.
    for k in 0..32 {
        b.fill(&x, k as f32).expect("fill");
    }
    let last = b
        .queue_download(&x.narrow(0, 63, 1).expect("narrow"))
        .expect("queued");
    assert_eq!(whole.wait().expect("read"), values);
    let want: Vec<f32> = (0..64).map(|r| values[r * 64 + 3]).collect();
    assert_eq!(column.wait().expect("read"), want);
    let v = last.wait().expect("read");
    assert_eq!(v, vec![31.0; 64]);
    let again = b.queue_download(&x).expect("queued");
    let _ = again.is_ready().expect("polled");
    assert_eq!(again.wait().expect("read"), vec![31.0; 4096]);
}

#[test]
fn queued_downloads_read_their_copy_on_the_simulated_device() {
    queued_downloads_read_their_copy(&super::mock());
}

#[cfg(feature = "gpu")]
#[test]
fn queued_downloads_read_their_copy_on_the_gpu() {
    queued_downloads_read_their_copy(&super::gpu());
}
