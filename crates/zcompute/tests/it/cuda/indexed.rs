//! The row ops indexed from device memory (`gather_row`, `scatter_row`) against the CPU
//! backend, eagerly and as a captured graph whose replays walk a table through an index the
//! graph advances itself. Bodies generic over the driver: the simulated device here, CUDA
//! device 0 under `gpu`. Poison is on, so an element a kernel forgets to write reads NaN.

use crate::common::uniform;
use zcompute::{BTensor, Backend, Capture, CpuBackend, CudaBackend, SelectOps, StepOps};
use zdevice::Driver;

const CPU: CpuBackend = CpuBackend;

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Gathers and scatters at `at` on backend `be`: (gathered row, table after the scatter,
/// index after the advancing scatter).
fn rows_at<B: Backend<f32>>(be: &B, at: f32) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let table = be
        .upload(
            &uniform(5 * 3 * 2, 7, -1.0, 1.0)
                .iter()
                .map(|&v| v as f32)
                .collect::<Vec<_>>(),
            &[5, 3, 2],
        )
        .expect("table");
    let index = be.upload(&[at], &[]).expect("index");
    let row = be.full(&[1, 3, 2], -9.0).expect("row");
    be.gather_row(&table, &index, &row).expect("gather_row");
    let src = be
        .upload(&[10.0, 11.0, 12.0, 13.0, 14.0, 15.0], &[3, 2])
        .expect("src");
    be.scatter_row(&src, &index, &table, true)
        .expect("scatter_row");
    (
        be.download(&row).expect("row"),
        be.download(&table).expect("table"),
        be.download(&index).expect("index"),
    )
}

/// Every index value, a row or none, gives the CPU's bits (for no row the CPU's NaN,
/// 0x7fc00000: the kernels wrote 0x7fffffff before); a valid one reads and writes its row, an
/// invalid one gathers NaN and scatters nothing, and the index advances either way.
pub fn gather_and_scatter_match_the_cpu<D: Driver>(b: &CudaBackend<D>) {
    let table: Vec<f32> = uniform(30, 7, -1.0, 1.0)
        .iter()
        .map(|&v| v as f32)
        .collect();
    for at in [0.0f32, 3.0, 4.0, 5.0, -1.0, 0.5, f32::NAN, f32::INFINITY] {
        let (row, written, index) = rows_at(b, at);
        let (row_cpu, written_cpu, index_cpu) = rows_at(&CPU, at);
        assert_eq!(bits(&row), bits(&row_cpu), "gathered row at {at}");
        assert_eq!(bits(&written), bits(&written_cpu), "table at {at}");
        assert_eq!(bits(&index), bits(&index_cpu), "index at {at}");
        let valid = (0.0..5.0).contains(&at) && at.fract() == 0.0;
        if valid {
            let r = at as usize;
            assert_eq!(row, table[r * 6..(r + 1) * 6], "row {r}");
            assert_eq!(
                written[r * 6..(r + 1) * 6],
                [10.0, 11.0, 12.0, 13.0, 14.0, 15.0]
            );
            assert_eq!(index, [at + 1.0]);
        } else {
            assert!(row.iter().all(|v| v.is_nan()), "no row at {at}: NaN");
            assert_eq!(written, table, "no row at {at}: nothing written");
        }
    }
}

/// `out[i] = 2 * table[i] + 1` for every row, one row per run of a captured body that
/// gathers at the index, computes, and scatters advancing it: the warm-up does row 0 and each
/// replay the next. Returns (out, index).
fn captured_walk<B: Capture<f32> + Clone + 'static>(be: &B, rows: usize) -> (Vec<f32>, Vec<f32>)
where
    BTensor<B, f32>: 'static,
{
    let n = 5;
    let values: Vec<f32> = uniform(rows * n, 11, -1.0, 1.0)
        .iter()
        .map(|&v| v as f32)
        .collect();
    let table = be.upload(&values, &[rows, n]).expect("table");
    let out = be.zeros(&[rows, n]).expect("out");
    let index = be.zeros(&[1]).expect("index");
    let slot = be.zeros(&[n]).expect("slot");
    let body = {
        let (be, table, out, index, slot) = (
            be.clone(),
            table.clone(),
            out.clone(),
            index.clone(),
            slot.clone(),
        );
        Box::new(move || {
            be.gather_row(&table, &index, &slot)?;
            let y = be.binary_scalar(
                zcompute::BinaryOp::Mul,
                &slot,
                2.0,
                zcompute::ScalarSide::Rhs,
            )?;
            let y =
                be.binary_scalar(zcompute::BinaryOp::Add, &y, 1.0, zcompute::ScalarSide::Rhs)?;
            be.scatter_row(&y, &index, &out, true)
        })
    };
    let mut graph = be.capture(body).expect("capture");
    for _ in 1..rows {
        be.replay(&mut graph).expect("replay");
    }
    (
        be.download(&out).expect("out"),
        be.download(&index).expect("index"),
    )
}

/// A captured graph walks the table through the index it advances: equal to the CPU's
/// recorded body, bit for bit, every row visited once.
pub fn a_captured_graph_walks_the_rows<D: Driver>(b: &CudaBackend<D>) {
    let rows = 4;
    let (out, index) = captured_walk(b, rows);
    let (out_cpu, index_cpu) = captured_walk(&CPU, rows);
    assert_eq!(bits(&out), bits(&out_cpu));
    assert_eq!(index, [rows as f32]);
    assert_eq!(index_cpu, [rows as f32]);
    let values: Vec<f32> = uniform(rows * 5, 11, -1.0, 1.0)
        .iter()
        .map(|&v| v as f32)
        .collect();
    let want: Vec<f32> = values.iter().map(|v| v * 2.0 + 1.0).collect();
    assert_eq!(out, want);
}

/// Bad operands get the same typed error as on the CPU.
pub fn bad_operands_are_refused<D: Driver>(b: &CudaBackend<D>) {
    fn errors<B: Backend<f32>>(be: &B) -> Vec<String> {
        let table = be.zeros(&[4, 3]).expect("table");
        let index = be.zeros(&[]).expect("index");
        let row = be.zeros(&[3]).expect("row");
        let scalar = be.zeros(&[]).expect("scalar");
        let short = be.zeros(&[2]).expect("short");
        let two = be.zeros(&[2]).expect("two");
        let strided = be.zeros(&[3, 4]).expect("wide");
        let strided = strided.transpose(0, 1).expect("transpose");
        [
            be.gather_row(&scalar, &index, &row),
            be.gather_row(&table, &two, &row),
            be.gather_row(&table, &index, &short),
            be.gather_row(&strided, &index, &row),
            be.gather_row(&table, &index, &table.narrow(0, 1, 1).expect("narrow")),
            be.scatter_row(&row, &index, &strided, false),
            be.scatter_row(&row, &row.narrow(0, 0, 1).expect("narrow"), &table, true),
        ]
        .into_iter()
        .map(|r| r.expect_err("refused").to_string())
        .collect()
    }
    let ours = errors(b);
    assert_eq!(ours, errors(&CPU));
    assert!(ours[0].contains("rank >= 1"), "{}", ours[0]);
    assert!(
        ours[2].contains("expected 3 elements, got 2"),
        "{}",
        ours[2]
    );
    assert!(ours[3].contains("not contiguous"), "{}", ours[3]);
    assert!(ours[4].contains("share storage"), "{}", ours[4]);
}

/// Gathers rows `at` of a `[5, 3, 2]` table into `[at.len(), 3, 2]` on backend `be`, and
/// once more inside a captured graph whose replay reads the indices rewritten after the
/// capture (`then`): (eager rows, replayed rows).
fn gathered<B: Capture<f32> + Clone + 'static>(
    be: &B,
    at: &[f32],
    then: &[f32],
) -> (Vec<f32>, Vec<f32>)
where
    BTensor<B, f32>: 'static,
{
    let values: Vec<f32> = uniform(30, 7, -1.0, 1.0)
        .iter()
        .map(|&v| v as f32)
        .collect();
    let table = be.upload(&values, &[5, 3, 2]).expect("table");
    let index = be.upload(at, &[at.len()]).expect("index");
    let rows = be.full(&[at.len(), 3, 2], -9.0).expect("rows");
    be.gather_rows(&table, &index, &rows).expect("gather_rows");
    let eager = be.download(&rows).expect("rows");
    let body = {
        let (be, table, index, rows) = (be.clone(), table.clone(), index.clone(), rows.clone());
        Box::new(move || be.gather_rows(&table, &index, &rows))
    };
    let mut graph = be.capture(body).expect("capture");
    be.upload_into(then, &index).expect("new indices");
    be.replay(&mut graph).expect("replay");
    (eager, be.download(&rows).expect("replayed"))
}

/// `gather_rows` (one launch on the device) gives the CPU's bits for every index, valid or
/// not (a row of NaN), repeated indices included; a captured graph reads the indices written
/// after its capture, so a step's shuffled samples need only an upload of their indices.
pub fn gather_rows_matches_the_cpu<D: Driver>(b: &CudaBackend<D>) {
    let values: Vec<f32> = uniform(30, 7, -1.0, 1.0)
        .iter()
        .map(|&v| v as f32)
        .collect();
    let at = [4.0f32, 0.0, 4.0, -1.0, 2.5, f32::NAN, 5.0, 1.0];
    let then = [3.0f32, 3.0, 0.0, 1.0, 2.0, 4.0, 0.0, 7.0];
    let (eager, replayed) = gathered(b, &at, &then);
    let (eager_cpu, replayed_cpu) = gathered(&CPU, &at, &then);
    assert_eq!(bits(&eager), bits(&eager_cpu));
    assert_eq!(bits(&replayed), bits(&replayed_cpu));
    for (i, &a) in at.iter().enumerate() {
        let got = &eager[i * 6..(i + 1) * 6];
        if (0.0..5.0).contains(&a) && a.fract() == 0.0 {
            let r = a as usize;
            assert_eq!(
                bits(got),
                bits(&values[r * 6..(r + 1) * 6]),
                "row {i} at {a}"
            );
        } else {
            assert!(got.iter().all(|v| v.is_nan()), "row {i} at {a}: NaN");
        }
    }
    for (i, &a) in then.iter().enumerate().take(7) {
        let r = a as usize;
        assert_eq!(
            bits(&replayed[i * 6..(i + 1) * 6]),
            bits(&values[r * 6..(r + 1) * 6])
        );
    }
    assert!(
        replayed[42..].iter().all(|v| v.is_nan()),
        "index 7 names no row"
    );
}

/// Bad operands of `gather_rows` get the CPU's typed errors.
pub fn gather_rows_refuses_bad_operands<D: Driver>(b: &CudaBackend<D>) {
    fn errors<B: SelectOps<f32>>(be: &B) -> Vec<String> {
        let table = be.zeros(&[4, 3]).expect("table");
        let index = be.zeros(&[2]).expect("index");
        let rows = be.zeros(&[2, 3]).expect("rows");
        let scalar = be.zeros(&[]).expect("scalar");
        let wide = be.zeros(&[3, 4]).expect("wide");
        let strided = wide.transpose(0, 1).expect("transpose");
        [
            be.gather_rows(&scalar, &index, &rows),
            be.gather_rows(&table, &index, &be.zeros(&[5]).expect("short")),
            be.gather_rows(&strided, &index, &rows),
            be.gather_rows(&table, &rows.narrow(1, 0, 1).expect("n"), &rows),
        ]
        .into_iter()
        .map(|r| r.expect_err("refused").to_string())
        .collect()
    }
    let ours = errors(b);
    assert_eq!(ours, errors(&CPU));
    assert!(ours[0].contains("rank >= 1"), "{}", ours[0]);
    assert!(
        ours[1].contains("expected 6 elements, got 5"),
        "{}",
        ours[1]
    );
    assert!(ours[2].contains("not contiguous"), "{}", ours[2]);
}

/// A step table of four rows of `[i0, i1, i2, lr, t]`: row 3's second index names no row.
const STEPS: [f32; 20] = [
    4.0, 0.0, 2.0, 0.5, 1.0, //
    1.0, 1.0, 3.0, 0.25, 2.0, //
    0.0, 4.0, 4.0, 0.125, 3.0, //
    2.0, 9.0, 1.0, 0.0625, 4.0,
];

/// `gather_rows_at_cursor` on `be`: rows of a `[5, 3, 2]` table named by the first three
/// indices of the step table's row at the cursor, and that row's `[lr, t]`, eagerly at each
/// cursor of `cursors` and by a captured graph replayed at each again (the cursor rewritten
/// between replays): (eager rows and tails, replayed rows and tails).
fn at_cursor<B: Capture<f32> + Clone + 'static>(be: &B, cursors: &[f32]) -> (Vec<f32>, Vec<f32>)
where
    BTensor<B, f32>: 'static,
{
    let values: Vec<f32> = uniform(30, 7, -1.0, 1.0)
        .iter()
        .map(|&v| v as f32)
        .collect();
    let table = be.upload(&values, &[5, 3, 2]).expect("table");
    let steps = be.upload(&STEPS, &[4, 5]).expect("steps");
    let cursor = be.upload(&[0.0], &[1]).expect("cursor");
    let rows = be.full(&[3, 3, 2], -9.0).expect("rows");
    let tail = be.full(&[2], -9.0).expect("tail");
    let mut eager = Vec::new();
    for &c in cursors {
        be.upload_into(&[c], &cursor).expect("cursor");
        be.gather_rows_at_cursor(&table, &steps, &cursor, &rows, Some(&tail))
            .expect("gather_rows_at_cursor");
        eager.extend(be.download(&rows).expect("rows"));
        eager.extend(be.download(&tail).expect("tail"));
    }
    let body = {
        let (be, table, steps, cursor) = (be.clone(), table.clone(), steps.clone(), cursor.clone());
        let (rows, tail) = (rows.clone(), tail.clone());
        Box::new(move || be.gather_rows_at_cursor(&table, &steps, &cursor, &rows, Some(&tail)))
    };
    let mut graph = be.capture(body).expect("capture");
    let mut replayed = Vec::new();
    for &c in cursors {
        be.upload_into(&[c], &cursor).expect("cursor");
        be.replay(&mut graph).expect("replay");
        replayed.extend(be.download(&rows).expect("rows"));
        replayed.extend(be.download(&tail).expect("tail"));
    }
    (eager, replayed)
}

/// `gather_rows_at_cursor` (one launch on the device) gives the CPU's bits at every cursor,
/// valid or not (NaN rows and tail), an index naming no row included; a captured graph reads
/// the cursor when it runs, so the same graph walks the step table.
pub fn gather_rows_at_cursor_matches_the_cpu<D: Driver>(b: &CudaBackend<D>) {
    let cursors = [0.0f32, 2.0, 1.0, 3.0, 4.0, -1.0, 0.5];
    let (eager, replayed) = at_cursor(b, &cursors);
    let (eager_cpu, replayed_cpu) = at_cursor(&CPU, &cursors);
    assert_eq!(bits(&eager), bits(&eager_cpu));
    assert_eq!(bits(&replayed), bits(&replayed_cpu));
    assert_eq!(bits(&eager), bits(&replayed));
    let values: Vec<f32> = uniform(30, 7, -1.0, 1.0)
        .iter()
        .map(|&v| v as f32)
        .collect();
    // Cursor 2: rows 0, 4, 4 and [0.125, 3].
    let at2 = &eager[20..40];
    let want: Vec<f32> = [0usize, 4, 4]
        .iter()
        .flat_map(|&r| values[r * 6..(r + 1) * 6].to_vec())
        .chain([0.125, 3.0])
        .collect();
    assert_eq!(bits(at2), bits(&want));
    // Cursor 3: its second index names no row; cursors 4, -1 and 0.5 name no row of steps.
    assert!(eager[66..72].iter().all(|v| v.is_nan()), "index 9: NaN");
    assert!(eager[80..].iter().all(|v| v.is_nan()), "no step row: NaN");
}

/// Bad operands of `gather_rows_at_cursor` get the CPU's typed errors.
pub fn gather_rows_at_cursor_refuses_bad_operands<D: Driver>(b: &CudaBackend<D>) {
    fn errors<B: StepOps<f32>>(be: &B) -> Vec<String> {
        let table = be.zeros(&[4, 3]).expect("table");
        let steps = be.zeros(&[2, 5]).expect("steps");
        let cursor = be.zeros(&[1]).expect("cursor");
        let rows = be.zeros(&[2, 3]).expect("rows");
        let tail = be.zeros(&[2]).expect("tail");
        let flat = be.zeros(&[10]).expect("flat");
        [
            be.gather_rows_at_cursor(&table, &flat, &cursor, &rows, None),
            be.gather_rows_at_cursor(&table, &steps, &rows, &rows, None),
            be.gather_rows_at_cursor(
                &table,
                &steps,
                &cursor,
                &be.zeros(&[2, 2]).expect("d"),
                None,
            ),
            be.gather_rows_at_cursor(
                &table,
                &steps,
                &cursor,
                &be.zeros(&[4, 3]).expect("d"),
                Some(&tail),
            ),
            be.gather_rows_at_cursor(
                &table,
                &steps,
                &cursor,
                &rows,
                Some(&rows.narrow(0, 0, 1).expect("one row")),
            ),
            be.gather_rows_at_cursor(
                &table,
                &steps,
                &steps
                    .narrow(0, 0, 1)
                    .expect("c")
                    .narrow(1, 0, 1)
                    .expect("c"),
                &rows,
                None,
            ),
        ]
        .into_iter()
        .map(|r| r.expect_err("refused").to_string())
        .collect()
    }
    let ours = errors(b);
    assert_eq!(ours, errors(&CPU));
    assert!(
        ours[2].contains("expected 6 elements, got 4"),
        "{}",
        ours[2]
    );
    assert!(
        ours[3].contains("expected 5 elements, got 6"),
        "{}",
        ours[3]
    );
    assert!(ours[4].contains("share storage"), "{}", ours[4]);
    assert!(ours[5].contains("share storage"), "{}", ours[5]);
}

mod mock {
    #[test]
    fn gather_rows_at_cursor_matches_the_cpu() {
        super::gather_rows_at_cursor_matches_the_cpu(&super::super::mock());
    }

    #[test]
    fn gather_rows_at_cursor_refuses_bad_operands() {
        super::gather_rows_at_cursor_refuses_bad_operands(&super::super::mock());
    }

    #[test]
    fn gather_rows_matches_the_cpu() {
        super::gather_rows_matches_the_cpu(&super::super::mock());
    }

    #[test]
    fn gather_rows_refuses_bad_operands() {
        super::gather_rows_refuses_bad_operands(&super::super::mock());
    }

    #[test]
    fn gather_and_scatter_match_the_cpu() {
        super::gather_and_scatter_match_the_cpu(&super::super::mock());
    }

    #[test]
    fn a_captured_graph_walks_the_rows() {
        super::a_captured_graph_walks_the_rows(&super::super::mock());
    }

    #[test]
    fn bad_operands_are_refused() {
        super::bad_operands_are_refused(&super::super::mock());
    }
}

#[cfg(feature = "gpu")]
mod gpu {
    #[test]
    fn gather_rows_at_cursor_matches_the_cpu() {
        super::gather_rows_at_cursor_matches_the_cpu(&super::super::gpu());
    }

    #[test]
    fn gather_rows_at_cursor_refuses_bad_operands() {
        super::gather_rows_at_cursor_refuses_bad_operands(&super::super::gpu());
    }

    #[test]
    fn gather_rows_matches_the_cpu() {
        super::gather_rows_matches_the_cpu(&super::super::gpu());
    }

    #[test]
    fn gather_rows_refuses_bad_operands() {
        super::gather_rows_refuses_bad_operands(&super::super::gpu());
    }

    #[test]
    fn gather_and_scatter_match_the_cpu() {
        super::gather_and_scatter_match_the_cpu(&super::super::gpu());
    }

    #[test]
    fn a_captured_graph_walks_the_rows() {
        super::a_captured_graph_walks_the_rows(&super::super::gpu());
    }

    #[test]
    fn bad_operands_are_refused() {
        super::bad_operands_are_refused(&super::super::gpu());
    }
}
