//! The selection and random families (`SelectOps`, `RandomOps`; `kernels/select.cu`) against
//! the CPU backend, bit for bit: NaN masks, infinities, ties and NaN in argmax, repeated
//! indices in the scatter-add, the dropout mask at a step read from device memory. Bodies
//! generic over the driver: the simulated device here, CUDA device 0 under `gpu`.

use crate::common::uniform;
use zcompute::{Backend, CpuBackend, CudaBackend, RandomOps, SelectOps};
use zdevice::Driver;

const CPU: CpuBackend = CpuBackend;

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn vals(n: usize, seed: u64) -> Vec<f32> {
    uniform(n, seed, -2.0, 2.0)
        .iter()
        .map(|&v| v as f32)
        .collect()
}

/// Runs `f` on the CPU and on `dev` over the same uploaded inputs and compares the bits.
fn same<D: Driver>(
    dev: &CudaBackend<D>,
    inputs: &[(Vec<f32>, Vec<usize>)],
    what: &str,
    f_cpu: impl Fn(&[zcompute::CpuTensor<f32>]) -> zcompute::Result<zcompute::CpuTensor<f32>>,
    f_dev: impl Fn(&[zcompute::CudaTensor]) -> zcompute::Result<zcompute::CudaTensor>,
) {
    let c: Vec<_> = inputs
        .iter()
        .map(|(d, s)| CPU.upload(d, s).unwrap())
        .collect();
    let g: Vec<_> = inputs
        .iter()
        .map(|(d, s)| dev.upload(d, s).unwrap())
        .collect();
    let want = CPU.download(&f_cpu(&c).unwrap()).unwrap();
    let got = dev.download(&f_dev(&g).unwrap()).unwrap();
    assert_eq!(bits(&got), bits(&want), "{what}");
}

pub fn select_family_matches_the_cpu<D: Driver>(dev: &CudaBackend<D>) {
    let mut cond = vec![1.0, 0.0, f32::NAN, -3.0];
    cond.truncate(4);
    let a = vec![f32::NEG_INFINITY, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5];
    let b = vals(4, 3);
    // cond [4, 1], a [4, 2], b [1, ... ] broadcast to [4, 2] (b [2, ...] would not fit: [1, 2]).
    same(
        dev,
        &[
            (cond, vec![4, 1]),
            (a, vec![4, 2]),
            (b[..2].to_vec(), vec![1, 2]),
        ],
        "select",
        |t| CPU.select(&t[0], &t[1], &t[2]),
        |t| dev.select(&t[0], &t[1], &t[2]),
    );

    let mut x = vals(5 * 7, 4);
    x[7 + 2] = 9.0;
    x[7 + 5] = 9.0; // a tie: the first wins
    x[14 + 3] = f32::NAN; // NaN counts as the maximum
    same(
        dev,
        &[(x.clone(), vec![5, 7])],
        "argmax",
        |t| CPU.argmax(&t[0]),
        |t| dev.argmax(&t[0]),
    );
    // A strided input.
    same(
        dev,
        &[(x, vec![5, 7])],
        "argmax of a transposed view",
        |t| CPU.argmax(&t[0].transpose(0, 1)?),
        |t| dev.argmax(&t[0].transpose(0, 1)?),
    );

    let parts = [
        (vals(6, 5), vec![2, 3]),
        (vals(2, 6), vec![2, 1]),
        (vals(8, 7), vec![2, 4]),
    ];
    same(
        dev,
        &parts,
        "concat",
        |t| CPU.concat(&[&t[0], &t[1], &t[2]], 1),
        |t| dev.concat(&[&t[0], &t[1], &t[2]], 1),
    );

    let table = (vals(6 * 3, 8), vec![6, 3]);
    let index = (vec![5.0, 0.0, 5.0, 2.0], vec![2, 2]);
    same(
        dev,
        &[table.clone(), index.clone()],
        "embedding",
        |t| CPU.embedding(&t[0], &t[1]),
        |t| dev.embedding(&t[0], &t[1]),
    );

    // dst starts non-zero; repeated indices add in index order on both.
    let src = (vals(5 * 3, 9), vec![5, 3]);
    let idx = (vec![4.0, 1.0, 4.0, 4.0, 0.0], vec![5]);
    same(
        dev,
        &[table.clone(), src.clone(), idx],
        "index_add_rows",
        |t| {
            CPU.index_add_rows(&t[1], &t[2], &t[0])?;
            Ok(t[0].clone())
        },
        |t| {
            dev.index_add_rows(&t[1], &t[2], &t[0])?;
            Ok(t[0].clone())
        },
    );

    // On the device an index naming no row adds nothing (the CPU refuses it: see errors).
    let t = dev.upload(&table.0, &table.1).unwrap();
    let s = dev.upload(&src.0[..6], &[2, 3]).unwrap();
    let i = dev.upload(&[1.0, 6.0], &[2]).unwrap();
    dev.index_add_rows(&s, &i, &t).unwrap();
    let got = dev.download(&t).unwrap();
    let mut want = table.0.clone();
    for j in 0..3 {
        want[3 + j] += src.0[j];
    }
    assert_eq!(
        bits(&got),
        bits(&want),
        "out-of-range index skipped on the device"
    );

    for (step, p) in [(0.0f32, 0.1), (41.0, 0.5), (16_777_216.0, 0.9), (2.5, 0.5)] {
        same(
            dev,
            &[(vec![step], vec![1])],
            "dropout_mask",
            |t| CPU.dropout_mask(&[3, 1000], p, 0xABCD_EF01_2345, 9, &t[0]),
            |t| dev.dropout_mask(&[3, 1000], p, 0xABCD_EF01_2345, 9, &t[0]),
        );
    }
    // The step is read when the op runs: advanced on the device, the next mask differs.
    let step = dev.zeros(&[1]).unwrap();
    let m0 = dev
        .download(&dev.dropout_mask(&[64], 0.5, 1, 0, &step).unwrap())
        .unwrap();
    dev.advance_step(&step).unwrap();
    let m1 = dev
        .download(&dev.dropout_mask(&[64], 0.5, 1, 0, &step).unwrap())
        .unwrap();
    assert_ne!(bits(&m0), bits(&m1));
    assert_eq!(dev.download(&step).unwrap(), vec![1.0]);
}

#[test]
fn select_family_matches_the_cpu_on_the_simulated_device() {
    select_family_matches_the_cpu(&super::mock());
}

#[test]
fn select_family_refuses_bad_arguments_alike() {
    let dev = super::mock();
    let c = |s: &[usize]| -> zcompute::CpuTensor<f32> { CPU.zeros(s).unwrap() };
    let d = |s: &[usize]| dev.zeros(s).unwrap();
    let e1 = CPU.select(&c(&[3]), &c(&[2]), &c(&[2])).unwrap_err();
    let e2 = dev.select(&d(&[3]), &d(&[2]), &d(&[2])).unwrap_err();
    assert_eq!(e1, e2);
    assert_eq!(
        CPU.argmax(&c(&[2, 0])).unwrap_err(),
        dev.argmax(&d(&[2, 0])).unwrap_err()
    );
    assert_eq!(
        CPU.concat(&[&c(&[2, 3]), &c(&[3, 3])], 1).unwrap_err(),
        dev.concat(&[&d(&[2, 3]), &d(&[3, 3])], 1).unwrap_err()
    );
    assert_eq!(
        CPU.index_add_rows(&c(&[3, 2]), &c(&[2]), &c(&[4, 2]))
            .unwrap_err(),
        dev.index_add_rows(&d(&[3, 2]), &d(&[2]), &d(&[4, 2]))
            .unwrap_err()
    );
    assert_eq!(
        CPU.dropout_mask(&[2], 1.0, 0, 0, &c(&[1])).unwrap_err(),
        dev.dropout_mask(&[2], 1.0, 0, 0, &d(&[1])).unwrap_err()
    );
}

#[cfg(feature = "gpu")]
mod gpu {
    #[test]
    fn select_family_matches_the_cpu() {
        super::select_family_matches_the_cpu(&super::super::gpu());
    }
}
