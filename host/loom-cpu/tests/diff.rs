//! Differential tests: the CPU backend against `loom_reference` on fresh deterministic random inputs, at shapes
//! that are and are not multiples of the tile, with poisoned outputs, on 1 and 2 threads, with and without the
//! whole-kernel GEMM match. Tolerances are stated at each check:
//! * bit-exact where the rounding model makes the backend's arithmetic identical (copies, gathers, casts,
//!   `+ - * /`, `neg abs sqrt`, max/min, integer ops, dequantisation);
//! * relative 1e-5 for f32 dot products of length <= 4096 (positive inputs: no cancellation);
//! * relative 1e-6 for f32 sums (the backend sums in f64 in eight lanes and rounds once);
//! * 2 ulp for transcendental functions (f64 functions rounded once; `erf` is this crate's own series).

mod common;

use common::*;
use loom_ir::kernel::{BinOp, BufRef, CmpOp, DType, ReduceOp, UnOp};

use DType::{F32, I32, I64};

fn masked_copy(r: u64, c: u64, br: u32, bc: u32) -> loom_ir::kernel::Kernel {
    let mut kb = KB::new("copy", [cdiv(r, br as u64), cdiv(c, bc as u64), 1]);
    let x = kb.param("x", F32, &[r, c], READ);
    let y = kb.param("y", F32, &[r, c], WRITE);
    let (p0, p1) = (kb.pid(0), kb.pid(1));
    let r0 = kb.mul(p0, i(br as i64));
    let rr = kb.range(r0, br);
    let c0 = kb.mul(p1, i(bc as i64));
    let rc = kb.range(c0, bc);
    let t = kb.load(x, vec![rr.clone(), rc.clone()], Some(f(0.0)));
    kb.store(y, vec![rr, rc], t);
    kb.finish()
}

#[test]
fn masked_copy_is_exact_at_ragged_shapes() {
    let mut rng = Rng::new(1);
    for (r, c, br, bc) in [
        (5, 7, 4, 4),
        (64, 64, 16, 32),
        (33, 130, 8, 64),
        (1, 1, 4, 8),
    ] {
        let st = one_kernel_stage(masked_copy(r, c, br, bc));
        // Exact: a copy.
        diff(
            &st,
            &[rand_f32(&mut rng, (r * c) as usize, -10.0, 10.0)],
            Tol::Exact,
        );
    }
}

/// Workspace buffers whose live dispatches do not meet share bytes on the CPU backend; a buffer read before
/// it is written must still read poison (0xff), never an earlier buffer's data or an earlier run's.
#[test]
fn shared_workspace_bytes_are_poisoned_before_reuse() {
    let (r, c) = (64u64, 48u64);
    let copy = masked_copy(r, c, 8, 16);
    // Writes only the first half of its output's rows.
    let mut half = masked_copy(r, c, 8, 16);
    half.name = "copy_half".into();
    half.grid[0] = cdiv(r / 2, 8);
    let st = stage(
        "reuse",
        vec![buf("x", F32, &[r, c])],
        vec![buf("y1", F32, &[r, c]), buf("y2", F32, &[r, c])],
        vec![buf("a", F32, &[r, c]), buf("b", F32, &[r, c])],
        vec![copy, half],
        vec![
            (0, vec![BufRef::Input(0), BufRef::Workspace(0)]),
            (0, vec![BufRef::Workspace(0), BufRef::Output(0)]),
            (1, vec![BufRef::Input(0), BufRef::Workspace(1)]),
            (0, vec![BufRef::Workspace(1), BufRef::Output(1)]),
        ],
    );
    let p = st.workspace_placement();
    assert_eq!(p.offsets[0], p.offsets[1], "a and b share bytes");
    let mut rng = Rng::new(17);
    let x = rand_f32(&mut rng, (r * c) as usize, -4.0, 4.0);
    let ins: Vec<&[u8]> = vec![&x];
    let mut want = loom_reference::alloc_outputs(&st).unwrap();
    loom_reference::run_stage(&st, &ins, &[], &mut want).unwrap();
    let half_bytes = (r / 2 * c * 4) as usize;
    assert_eq!(&want[1][..half_bytes], &x[..half_bytes]);
    assert!(want[1][half_bytes..].iter().all(|&b| b == 0xff));
    let cs = loom_cpu::compile_stage(&st).unwrap();
    // Several runs: the second reuses the first run's region, full of its data.
    for run in 0..3 {
        for threads in [1, 2] {
            let mut got = loom_reference::alloc_outputs(&st).unwrap();
            cs.run(&ins, &[], &mut got, threads).unwrap();
            assert!(got == want, "run {run}, {threads} threads");
        }
    }
}

fn gather(v: u64, h: u64, rows: u64) -> loom_ir::kernel::Kernel {
    let mut kb = KB::new("gather_rows", [rows, 1, 1]);
    let emb = kb.param("emb", F32, &[v, h], READ);
    let ids = kb.param("ids", I32, &[rows], READ);
    let out = kb.param("out", F32, &[rows, h], WRITE);
    let p = kb.pid(0);
    let id = kb.load(ids, vec![p.clone()], None);
    let id = kb.cast(id, I64);
    let rc = kb.range(i(0), h as u32);
    let row = kb.load(emb, vec![id, rc.clone()], None);
    kb.store(out, vec![p, rc], row);
    kb.finish()
}

#[test]
fn row_gather_and_out_of_range_id() {
    let mut rng = Rng::new(2);
    let (v, h, rows) = (50u64, 37u64, 9u64);
    let st = one_kernel_stage(gather(v, h, rows));
    let emb = rand_f32(&mut rng, (v * h) as usize, -1.0, 1.0);
    let ids: Vec<i32> = (0..rows).map(|_| rng.below(v) as i32).collect();
    // Exact: a gather.
    diff(&st, &[emb.clone(), i32_bytes(&ids)], Tol::Exact);

    let mut bad = ids.clone();
    bad[3] = v as i32; // id == vocabulary size
    bad[6] = -1;
    let bad_ids = i32_bytes(&bad);
    let ins = [&emb[..], &bad_ids[..]];
    let mut want = loom_reference::alloc_outputs(&st).unwrap();
    let we = loom_reference::run_stage(&st, &ins, &[], &mut want).unwrap_err();
    let cs = loom_cpu::compile_stage(&st).unwrap();
    for threads in [1, 2] {
        let mut got = loom_reference::alloc_outputs(&st).unwrap();
        let ge = cs.run(&ins, &[], &mut got, threads).unwrap_err();
        assert!(
            matches!(
                ge,
                loom_cpu::Error::IndexOutOfRange {
                    index: 50,
                    dim: 0,
                    extent: 50,
                    ..
                }
            ),
            "{ge}"
        );
        assert_eq!(ge.to_string(), we.to_string());
        assert_eq!(got[0].len(), want[0].len());
        let row = (h * 4) as usize;
        for (r, chunk) in got[0].chunks(row).enumerate() {
            if threads == 1 {
                assert_eq!(chunk, &want[0][r * row..(r + 1) * row], "row {r}");
            }
            // Rows of failed instances are untouched (still poison); others hold their embedding row.
            if r == 3 || r == 6 {
                assert!(chunk.iter().all(|&b| b == 0xff), "row {r} was written");
            } else if chunk[0] != 0xff || threads == 1 && r < 3 {
                let id = bad[r] as usize;
                assert_eq!(chunk, &emb[id * row..(id + 1) * row], "row {r}");
            }
        }
    }
}

/// Rows `pid * b ..` of a `[r, c]` matrix, columns `c0 .. c0 + w`, loaded without a fill (a checked access
/// whose indices are all ranges: one bounds test, then whole rows) and stored to `y`.
fn ranged_copy(r: u64, c: u64, b: u32, c0: i64, w: u32, programs: u64) -> loom_ir::kernel::Kernel {
    let mut kb = KB::new("ranged_copy", [programs, 1, 1]);
    let x = kb.param("x", F32, &[r, c], READ);
    let y = kb.param("y", F32, &[programs * b as u64, w as u64], WRITE);
    let p = kb.pid(0);
    let r0 = kb.mul(p, i(b as i64));
    let rr = kb.range(r0, b);
    let rc = kb.range(i(c0), w);
    let t = kb.load(x, vec![rr.clone(), rc], None);
    let ry = kb.range(i(0), w);
    kb.store(y, vec![rr, ry], t);
    kb.finish()
}

#[test]
fn checked_ranged_loads_copy_rows_and_report_the_first_index_out_of_range() {
    let mut rng = Rng::new(29);
    // In range: exact. Rows of 16 or more elements move by one call each (30 of 37 columns), whole rows as
    // one block (every column, and the stores into y's whole rows), shorter ones by the inline lanes (8).
    for (c0, w) in [(3i64, 30u32), (0, 37), (5, 8), (21, 16)] {
        let st = one_kernel_stage(ranged_copy(12, 37, 4, c0, w, 3));
        diff(&st, &[rand_f32(&mut rng, 12 * 37, -1.0, 1.0)], Tol::Exact);
    }
    // The last program's rows run past the end (rows 8..12 of 10), or every program's columns do (34..38 of
    // 37): the error names the first index outside, like the reference's, and the other programs' rows are
    // stored.
    for (r, c0, w, index, dim, extent) in [
        (10u64, 3i64, 30u32, 10i64, 0usize, 10u64),
        (12, 34, 4, 37, 1, 37),
    ] {
        let st = one_kernel_stage(ranged_copy(r, 37, 4, c0, w, 3));
        let x = rand_f32(&mut rng, (r * 37) as usize, -1.0, 1.0);
        for ge in fails_like_the_reference(&st, &[&x]) {
            assert!(
                matches!(ge, loom_cpu::Error::IndexOutOfRange { index: ix, dim: d, extent: e, .. }
                    if ix == index && d == dim && e == extent),
                "{ge}"
            );
        }
    }
}

/// Columns `off + step * (c0 + j)` of rows `pid * b ..` of a `[r, c]` matrix (a range scaled and moved:
/// strided), loaded with or without a fill, stored into the odd columns of `y` (also a strided range). With
/// `scalar_first` the offset is added as `off + range`, the other order.
#[allow(clippy::too_many_arguments)]
fn strided_copy(
    r: u64,
    c: u64,
    b: u32,
    c0: i64,
    w: u32,
    step: i64,
    off: i64,
    programs: u64,
    fill: bool,
    scalar_first: bool,
) -> loom_ir::kernel::Kernel {
    let mut kb = KB::new("strided_copy", [programs, 1, 1]);
    let x = kb.param("x", F32, &[r, c], READ);
    let y = kb.param("y", F32, &[programs * b as u64, 2 * w as u64], WRITE);
    let p = kb.pid(0);
    let r0 = kb.mul(p, i(b as i64));
    let rr = kb.range(r0, b);
    let rc = kb.range(i(c0), w);
    let rc = kb.mul(rc, i(step));
    let rc = if scalar_first {
        kb.add(i(off), rc)
    } else if off < 0 {
        kb.sub(rc, i(-off))
    } else {
        kb.add(rc, i(off))
    };
    let t = kb.load(x, vec![rr.clone(), rc], fill.then(|| f(7.5)));
    let ry = kb.range(i(0), w);
    let ry = kb.mul(ry, i(2));
    let ry = kb.add(ry, i(1));
    kb.store(y, vec![rr, ry], t);
    kb.finish()
}

#[test]
fn strided_ranges_load_and_store_like_the_reference() {
    let mut rng = Rng::new(37);
    let (r, c, b, programs) = (12u64, 40u64, 4u32, 3u64);
    let x = rand_f32(&mut rng, (r * c) as usize, -1.0, 1.0);
    // Inside: every column and row in range (odd and even columns, a step of 3, a moved start).
    for (c0, w, step, off, first) in [
        (0i64, 20u32, 2i64, 0i64, false),
        (0, 20, 2, 1, true),
        (1, 12, 3, -2, false),
        (0, 5, 8, 3, false),
        (0, 1, 39, 0, false),
    ] {
        for fill in [true, false] {
            let st = one_kernel_stage(strided_copy(
                r, c, b, c0, w, step, off, programs, fill, first,
            ));
            same_bytes_as_reference(&st, &[&x]);
        }
    }
    // Partly outside: the last columns past the end (20 of step 2 from 1 reach 39; from 2, 41), or the first
    // before the start (-1): masked with a fill, the element outside reads 7.5; without one, the error names
    // the first index outside, as the reference does.
    for (c0, w, step, off) in [(1i64, 20u32, 2i64, 1i64), (0, 7, 3, -1), (0, 3, 1 << 40, 0)] {
        let st = one_kernel_stage(strided_copy(
            r, c, b, c0, w, step, off, programs, true, false,
        ));
        same_bytes_as_reference(&st, &[&x]);
        let st = one_kernel_stage(strided_copy(
            r, c, b, c0, w, step, off, programs, false, false,
        ));
        fails_like_the_reference(&st, &[&x]);
    }
}

/// Runs `st` on the reference and on the CPU backend (one and two threads), all expected to fail: each CPU
/// error reads like the reference's, and on one thread the outputs (starting as the same poison) equal the
/// reference's, the rows stored before the failing program included. Returns the CPU's errors.
fn fails_like_the_reference(st: &loom_ir::kernel::Stage, ins: &[&[u8]]) -> Vec<loom_cpu::Error> {
    let mut want = loom_reference::alloc_outputs(st).unwrap();
    let we = loom_reference::run_stage(st, ins, &[], &mut want).unwrap_err();
    let cs = loom_cpu::compile_stage(st).unwrap();
    [1, 2]
        .into_iter()
        .map(|threads| {
            let mut got = loom_reference::alloc_outputs(st).unwrap();
            let ge = cs.run(ins, &[], &mut got, threads).unwrap_err();
            assert_eq!(ge.to_string(), we.to_string());
            if threads == 1 {
                assert!(got == want, "rows stored before the failing program");
            }
            ge
        })
        .collect()
}

/// Rows gathered by an id tile (`ids[pid * b ..]`): `x[ids, c0 .. c0 + w]` loaded (with a fill of 7.5, or
/// checked without one) and stored to `y[ids2, ..]` with `ids2 = ids + shift` (rows past `y`'s end are
/// dropped).
fn gathered_rows(
    v: u64,
    c: u64,
    b: u32,
    c0: i64,
    w: u32,
    programs: u64,
    fill: bool,
    shift: i64,
) -> loom_ir::kernel::Kernel {
    let mut kb = KB::new("gathered_rows", [programs, 1, 1]);
    let x = kb.param("x", F32, &[v, c], READ);
    let ids = kb.param("ids", I32, &[programs * b as u64], READ);
    let y = kb.param("y", F32, &[v, w as u64], WRITE);
    let p = kb.pid(0);
    let r0 = kb.mul(p, i(b as i64));
    let rr = kb.range(r0, b);
    let id = kb.load(ids, vec![rr], None);
    let id = kb.cast(id, I64);
    let rc = kb.range(i(c0), w);
    let t = kb.load(x, vec![id.clone(), rc], fill.then(|| f(7.5)));
    let id2 = kb.add(id, i(shift));
    let ry = kb.range(i(0), w);
    kb.store(y, vec![id2, ry], t);
    kb.finish()
}

/// The stage's outputs (starting as the same poison, so untouched bytes count too) equal the reference's
/// byte for byte, on one and two threads.
fn same_bytes_as_reference(st: &loom_ir::kernel::Stage, ins: &[&[u8]]) {
    let mut want = loom_reference::alloc_outputs(st).unwrap();
    loom_reference::run_stage(st, ins, &[], &mut want).unwrap();
    let cs = loom_cpu::compile_stage(st).unwrap();
    for threads in [1, 2] {
        let mut got = loom_reference::alloc_outputs(st).unwrap();
        cs.run(ins, &[], &mut got, threads).unwrap();
        assert!(got == want, "{threads} threads");
    }
}

#[test]
fn gathered_rows_are_copied_whole_with_the_references_masks_and_errors() {
    let mut rng = Rng::new(31);
    let (v, c, b, programs) = (40u64, 37u64, 6u32, 3u64);
    let n = (b as u64 * programs) as usize;
    let x = rand_f32(&mut rng, (v * c) as usize, -1.0, 1.0);
    // Ids inside, below and past the rows; stores shifted so that some land past y's end (dropped).
    let mut ids: Vec<i32> = (0..n).map(|_| rng.below(v) as i32).collect();
    ids[2] = -3;
    ids[7] = v as i32 + 5;
    ids[11] = v as i32;
    let idb = i32_bytes(&ids);
    for (c0, w) in [(0i64, 37u32), (3, 30), (5, 3), (34, 4)] {
        for shift in [0i64, 6] {
            // Masked (fill): equal to the reference (columns 34..38 of 37 take the per-element path).
            let st = one_kernel_stage(gathered_rows(v, c, b, c0, w, programs, true, shift));
            same_bytes_as_reference(&st, &[&x, &idb]);
        }
        // Checked (no fill): the first id out of range is the error, as the reference reports it.
        let st = one_kernel_stage(gathered_rows(v, c, b, c0, w, programs, false, 0));
        fails_like_the_reference(&st, &[&x, &idb]);
        // Every id in range (and the columns too): equal.
        if c0 + i64::from(w) <= c as i64 {
            let ok: Vec<i32> = ids.iter().map(|&i| i.rem_euclid(v as i32)).collect();
            same_bytes_as_reference(&st, &[&x, &i32_bytes(&ok)]);
        }
    }
}

#[test]
fn tiled_gemm_with_and_without_epilogue() {
    let mut rng = Rng::new(3);
    for (m, n, k, bm, bn, bk, epi) in [
        (64, 64, 64, 32, 32, 16, false),
        (37, 50, 29, 16, 16, 8, false),
        (37, 50, 29, 16, 16, 8, true),
        (128, 96, 200, 64, 32, 32, true),
        (5, 3, 300, 4, 4, 64, false),
    ] {
        let st = one_kernel_stage(gemm_kernel(m, n, k, bm, bn, bk, epi));
        let mut ins = vec![
            rand_f32(&mut rng, (m * k) as usize, 0.5, 1.5),
            rand_f32(&mut rng, (k * n) as usize, 0.5, 1.5),
        ];
        if epi {
            ins.push(rand_f32(&mut rng, n as usize, -1.0, 1.0));
        }
        // Relative 1e-5: f32 dot products of length <= 4096 over positive values.
        diff(&st, &ins, Tol::Rel(1e-5, 1e-6));
        let rep = loom_cpu::compile_stage(&st).unwrap();
        let path = rep.compile_report().kernels[0].path;
        assert_eq!(path, if epi { "gemm+native-epilogue" } else { "gemm" });
    }
}

/// One program: `y = a @ b (+ c)` on whole tiles, `b` loaded as `[k, n]` or as `[n, k]` and transposed (a
/// transpose only the dot reads), the accumulator zeros or loaded.
fn whole_tile_dot(m: u64, n: u64, k: u64, bt: bool, acc: bool) -> loom_ir::kernel::Kernel {
    let mut kb = KB::new("whole_tile_dot", [1, 1, 1]);
    let a = kb.param("a", F32, &[m, k], READ);
    let b = kb.param("b", F32, if bt { [n, k] } else { [k, n] }.as_slice(), READ);
    let c = kb.param("c", F32, &[m, n], READ);
    let y = kb.param("y", F32, &[m, n], WRITE);
    let (rm, rn, rk) = (
        kb.range(i(0), m as u32),
        kb.range(i(0), n as u32),
        kb.range(i(0), k as u32),
    );
    let at = kb.load(a, vec![rm.clone(), rk.clone()], None);
    let bt_ = if bt {
        let t = kb.load(b, vec![rn.clone(), rk], None);
        kb.transpose(t)
    } else {
        kb.load(b, vec![rk, rn.clone()], None)
    };
    let ct = if acc {
        kb.load(c, vec![rm.clone(), rn.clone()], None)
    } else {
        kb.full(f(0.0), &[m as u32, n as u32], F32)
    };
    let d = kb.dot(at, bt_, ct);
    kb.store(y, vec![rm, rn], d);
    kb.finish()
}

#[test]
fn dots_of_a_few_rows_at_ragged_shapes() {
    // Up to 8 rows (32 with b as it is, any number by a b of at most 8 x 32) take the crate's own AVX-512
    // loops where the CPU has them (attention: a token's query heads against a page of keys, then against its
    // values; MiniLM's 32-row weights against a block of values), the gemm crate otherwise: columns and
    // depths that are and are not multiples of 16, column spans past 32, row blocks past 12 with ragged
    // tails, both layouts of b, with and without an accumulator.
    let mut rng = Rng::new(41);
    for (m, n, k) in [
        (1u64, 16u64, 64u64),
        (3, 16, 64),
        (3, 64, 16),
        (8, 17, 33),
        (5, 70, 3),
        (2, 1, 1),
        (8, 48, 100),
        (9, 20, 20),
        (13, 40, 33),
        (32, 32, 32),
        (25, 70, 7),
        (33, 20, 5),
        // Many rows by a tiny b (RoPE's pair swap, [288, 2] @ [2, 2]): the crate's loops for b as it is.
        (288, 2, 2),
        (97, 32, 8),
        (50, 33, 8),
        (40, 5, 9),
    ] {
        for bt in [false, true] {
            for acc in [false, true] {
                let st = one_kernel_stage(whole_tile_dot(m, n, k, bt, acc));
                let ins = vec![
                    rand_f32(&mut rng, (m * k) as usize, 0.5, 1.5),
                    rand_f32(&mut rng, (k * n) as usize, 0.5, 1.5),
                    rand_f32(&mut rng, (m * n) as usize, 0.5, 1.5),
                ];
                // Relative 1e-5: f32 dot products of length <= 4096 over positive values.
                diff(&st, &ins, Tol::Rel(1e-5, 1e-6));
            }
        }
    }
}

/// Attention's shape: `y = sum over g of a @ w[g * kb .. + kb, c0 .. + n]` (or, with `bt`, of `a @
/// transpose(w[g * n .. + n, c0 .. + k])`), each block loaded in the loop and read only by the loop's dot:
/// loads the backend may hand to the dot in place (a view) where they are inside `w`.
/// `a` and `w` are of `dt`: f16/bf16 tiles are cast to f32 (`conv.f32`) before the dots, which then read the
/// halves in place where the block is inside `w`.
#[allow(clippy::too_many_arguments)]
fn blocks_dot(
    dt: DType,
    m: u32,
    n: u32,
    k: u32,
    blocks: i64,
    w_rows: u64,
    w_cols: u64,
    c0: i64,
    bt: bool,
    fill: bool,
) -> loom_ir::kernel::Kernel {
    let mut kb = KB::new("blocks_dot", [1, 1, 1]);
    let a = kb.param("a", dt, &[m as u64, k as u64], READ);
    let w = kb.param("w", dt, &[w_rows, w_cols], READ);
    let y = kb.param("y", F32, &[m as u64, n as u64], WRITE);
    let (rm, rk) = (kb.range(i(0), m), kb.range(i(0), k));
    let at = kb.load(a, vec![rm.clone(), rk], None);
    let at = if dt == F32 { at } else { kb.cast(at, F32) };
    let z = kb.full(f(0.0), &[m, n], F32);
    let acc = kb
        .for_(i(0), i(blocks), i(1), vec![z], |kb, g, it| {
            let (rows, cols) = if bt { (n, k) } else { (k, n) };
            let r0 = kb.mul(g, i(i64::from(rows)));
            let rr = kb.range(r0, rows);
            let rc = kb.range(i(c0), cols);
            let wt = kb.load(w, vec![rr, rc], fill.then(|| imm_f(0.25, dt)));
            let wt = if dt == F32 { wt } else { kb.cast(wt, F32) };
            let b = if bt { kb.transpose(wt) } else { wt };
            vec![kb.dot(at.clone(), b, it[0].clone())]
        })
        .remove(0);
    let rn = kb.range(i(0), n);
    kb.store(y, vec![rm, rn], acc);
    kb.finish()
}

#[test]
fn blocks_read_only_by_dots_match_the_reference_inside_and_outside_the_buffer() {
    let mut rng = Rng::new(43);
    for bt in [false, true] {
        for (m, n, k) in [(3u32, 16u32, 8u32), (3, 8, 16), (40, 24, 16)] {
            let per = u64::from(if bt { n } else { k });
            let cols = u64::from(if bt { k } else { n });
            // Inside: blocks of rows in place (the buffer wider than a block, so its rows are strided).
            let (wr, wc) = (4 * per, cols + 5);
            let w = rand_f32(&mut rng, (wr * wc) as usize, 0.5, 1.5);
            let a = rand_f32(&mut rng, (m * k) as usize, 0.5, 1.5);
            for fill in [false, true] {
                let st = one_kernel_stage(blocks_dot(F32, m, n, k, 4, wr, wc, 3, bt, fill));
                diff(&st, &[a.clone(), w.clone()], Tol::Rel(1e-5, 1e-6));
            }
            // The last block half past the end of w: with a fill the rows outside read 0.25 (masked copy),
            // without one the error names the first index outside, like the reference's.
            let wr = 4 * per - per / 2;
            let w = rand_f32(&mut rng, (wr * wc) as usize, 0.5, 1.5);
            let st = one_kernel_stage(blocks_dot(F32, m, n, k, 4, wr, wc, 3, bt, true));
            diff(&st, &[a.clone(), w.clone()], Tol::Rel(1e-5, 1e-6));
            let st = one_kernel_stage(blocks_dot(F32, m, n, k, 4, wr, wc, 3, bt, false));
            fails_like_the_reference(&st, &[&a, &w]);
        }
    }
}

#[test]
fn half_blocks_read_only_by_dots_match_the_reference_inside_and_outside_the_buffer() {
    // f16/bf16 blocks cast to f32 and read only by dots (a KV cache in halves): in place where inside the
    // buffer (the dot converts the rows), copied into scratch otherwise, the same numbers either way.
    let mut rng = Rng::new(47);
    let halves = |rng: &mut Rng, n: u64, dt: DType| -> Vec<u8> {
        (0..n)
            .flat_map(|_| {
                let r = rng.next_u64();
                // Values in [0.5, 2): exponent 2^-1 or 2^0, a random mantissa.
                let h = if dt == DType::F16 {
                    ((14 + (r & 1)) << 10) | ((r >> 1) & 0x3ff)
                } else {
                    ((126 + (r & 1)) << 7) | ((r >> 1) & 0x7f)
                };
                (h as u16).to_le_bytes()
            })
            .collect()
    };
    for dt in [DType::F16, DType::BF16] {
        for bt in [false, true] {
            for (m, n, k) in [(3u32, 16u32, 64u32), (3, 64, 16), (40, 24, 16)] {
                let per = u64::from(if bt { n } else { k });
                let cols = u64::from(if bt { k } else { n });
                let (wr, wc) = (4 * per, cols + 5);
                let w = halves(&mut rng, wr * wc, dt);
                let a = halves(&mut rng, u64::from(m * k), dt);
                for fill in [false, true] {
                    let st = one_kernel_stage(blocks_dot(dt, m, n, k, 4, wr, wc, 3, bt, fill));
                    diff(&st, &[a.clone(), w.clone()], Tol::Rel(1e-5, 1e-6));
                }
                let wr = 4 * per - per / 2;
                let w = halves(&mut rng, wr * wc, dt);
                let st = one_kernel_stage(blocks_dot(dt, m, n, k, 4, wr, wc, 3, bt, true));
                diff(&st, &[a.clone(), w.clone()], Tol::Rel(1e-5, 1e-6));
            }
        }
    }
}

/// Row-wise softmax: one program per `br` rows, the full row in one tile (masked to -inf past `c`).
fn softmax(r: u64, c: u64, br: u32, bc: u32) -> loom_ir::kernel::Kernel {
    let mut kb = KB::new("softmax", [cdiv(r, br as u64), 1, 1]);
    let x = kb.param("x", F32, &[r, c], READ);
    let y = kb.param("y", F32, &[r, c], WRITE);
    let p = kb.pid(0);
    let r0 = kb.mul(p, i(br as i64));
    let rr = kb.range(r0, br);
    let rc = kb.range(i(0), bc);
    let t = kb.load(x, vec![rr.clone(), rc.clone()], Some(f(f64::NEG_INFINITY)));
    let m = kb.reduce(ReduceOp::Max, t.clone(), 1);
    let m = kb.expand_dims(m, 1);
    let m = kb.broadcast(m, &[br, bc]);
    let d = kb.sub(t, m);
    let e = kb.un(UnOp::Exp, d);
    let s = kb.reduce(ReduceOp::Sum, e.clone(), 1);
    let s = kb.expand_dims(s, 1);
    let s = kb.broadcast(s, &[br, bc]);
    let o = kb.div(e, s);
    kb.store(y, vec![rr, rc], o);
    kb.finish()
}

#[test]
fn softmax_over_rows() {
    let mut rng = Rng::new(4);
    // bc == c (whole rows) takes the `rows` pattern (`rows.rs`); bc > c stays on the JIT.
    for (r, c, br, bc, lim) in [
        (7, 10, 4, 16, 5.0),
        (64, 128, 8, 128, 5.0),
        (3, 1000, 2, 1024, 5.0),
        (9, 1000, 4, 1000, 5.0),
        (6, 4096, 4, 4096, 5.0),
        (5, 333, 2, 333, 40.0),
    ] {
        let st = one_kernel_stage(softmax(r, c, br, bc));
        // Relative 1e-6: the JIT rounds the f64 exp once like the reference, the `rows` pattern uses an f32
        // polynomial within 1 ulp (`rows.rs`, unit-tested); row sums are f64 rounded once on both.
        diff(
            &st,
            &[rand_f32(&mut rng, (r * c) as usize, -lim, lim)],
            Tol::Rel(1e-6, 0.0),
        );
    }
}

pub fn layernorm(r: u64, c: u64, br: u32) -> loom_ir::kernel::Kernel {
    let mut kb = KB::new("layernorm", [cdiv(r, br as u64), 1, 1]);
    let x = kb.param("x", F32, &[r, c], READ);
    let g = kb.param("gamma", F32, &[c], READ);
    let b = kb.param("beta", F32, &[c], READ);
    let y = kb.param("y", F32, &[r, c], WRITE);
    let c32 = c as u32;
    let p = kb.pid(0);
    let r0 = kb.mul(p, i(br as i64));
    let rr = kb.range(r0, br);
    let rc = kb.range(i(0), c32);
    let t = kb.load(x, vec![rr.clone(), rc.clone()], Some(f(0.0)));
    let s = kb.reduce(ReduceOp::Sum, t.clone(), 1);
    let mean = kb.div(s, f(c as f64));
    let mean = kb.expand_dims(mean, 1);
    let mean = kb.broadcast(mean, &[br, c32]);
    let xc = kb.sub(t, mean);
    let sq = kb.mul(xc.clone(), xc.clone());
    let v = kb.reduce(ReduceOp::Sum, sq, 1);
    let v = kb.div(v, f(c as f64));
    let v = kb.add(v, f(1e-5));
    let inv = kb.un(UnOp::Rsqrt, v);
    let inv = kb.expand_dims(inv, 1);
    let inv = kb.broadcast(inv, &[br, c32]);
    let n = kb.mul(xc, inv);
    let gv = kb.load(g, vec![rc.clone()], None);
    let gv = kb.expand_dims(gv, 0);
    let gv = kb.broadcast(gv, &[br, c32]);
    let bv = kb.load(b, vec![rc.clone()], None);
    let bv = kb.expand_dims(bv, 0);
    let bv = kb.broadcast(bv, &[br, c32]);
    let o = kb.mul(n, gv);
    let o = kb.add(o, bv);
    kb.store(y, vec![rr, rc], o);
    kb.finish()
}

#[test]
fn layernorm_over_rows() {
    let mut rng = Rng::new(5);
    for (r, c, br) in [(5, 12, 4), (64, 384, 8), (9, 1000, 2), (7, 4096, 4)] {
        let st = one_kernel_stage(layernorm(r, c, br));
        let ins = [
            rand_f32(&mut rng, (r * c) as usize, -3.0, 3.0),
            rand_f32(&mut rng, c as usize, 0.5, 1.5),
            rand_f32(&mut rng, c as usize, -1.0, 1.0),
        ];
        // Relative 1e-5 (absolute 1e-6 near zero): sums of <= 1000 terms and a handful of f32 ops.
        diff(&st, &ins, Tol::Rel(1e-5, 1e-6));
    }
}

/// A one-program kernel: load all of `x`, apply `body`, store to `y`.
fn tile_fn(
    in_dtype: DType,
    in_shape: &[u64],
    out_dtype: DType,
    out_shape: &[u64],
    body: impl FnOnce(&mut KB, KOperand) -> KOperand,
) -> loom_ir::kernel::Stage {
    let mut kb = KB::new("tile_fn", [1, 1, 1]);
    let x = kb.param("x", in_dtype, in_shape, READ);
    let y = kb.param("y", out_dtype, out_shape, WRITE);
    let idx: Vec<KOperand> = in_shape.iter().map(|&d| kb.range(i(0), d as u32)).collect();
    let t = kb.load(x, idx, None);
    let r = body(&mut kb, t);
    let idx: Vec<KOperand> = out_shape
        .iter()
        .map(|&d| kb.range(i(0), d as u32))
        .collect();
    kb.store(y, idx, r);
    one_kernel_stage(kb.finish())
}

use loom_ir::kernel::KOperand;

/// f32 `+ - * /` of a tile with a tile, a tile with a scalar and a scalar with a tile, at lengths under, at
/// and past the length from which the JIT calls its sixteen-lane helper (ragged tails included), over special
/// values (zeros of both signs, infinities, NaN, subnormals, the f16 range's edges): the reference's bits.
#[test]
fn f32_arithmetic_on_long_tiles_is_the_references() {
    let mut rng = Rng::new(29);
    for n in [100u64, 127, 128, 129, 1000] {
        for op in [BinOp::Add, BinOp::Sub, BinOp::Mul, BinOp::Div] {
            for form in 0..3 {
                // Two tiles of n from the input's two rows (their elementwise max and min).
                let st = tile_fn(F32, &[2, n], F32, &[n], |kb, t| {
                    let x = kb.reduce(ReduceOp::Max, t.clone(), 0);
                    let y = kb.reduce(ReduceOp::Min, t, 0);
                    match form {
                        0 => kb.bin(op, x, y),
                        1 => kb.bin(op, x, f(0.375)),
                        _ => kb.bin(op, f(-3.0e38), y),
                    }
                });
                let x: Vec<f32> = special_f32s(&mut rng, (2 * n) as usize);
                diff(&st, &[f32_bytes(&x)], Tol::Exact);
            }
        }
    }
}

#[test]
fn reductions() {
    let mut rng = Rng::new(6);
    for (r, c) in [(3u64, 5u64), (16, 33), (1, 200)] {
        for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min] {
            for axis in [0u8, 1] {
                let out = if axis == 0 { c } else { r };
                let st = tile_fn(F32, &[r, c], F32, &[out], |kb, t| kb.reduce(op, t, axis));
                // Sum: relative 1e-6 (f64 accumulation rounded once); max/min: exact.
                let tol = if op == ReduceOp::Sum {
                    Tol::Rel(1e-6, 0.0)
                } else {
                    Tol::Exact
                };
                diff(
                    &st,
                    &[rand_f32(&mut rng, (r * c) as usize, -10.0, 10.0)],
                    tol,
                );
                let st = tile_fn(I32, &[r, c], I32, &[out], |kb, t| kb.reduce(op, t, axis));
                let v: Vec<i32> = (0..r * c).map(|_| rng.next_u64() as i32).collect();
                // Integer reductions wrap: exact.
                diff(&st, &[i32_bytes(&v)], Tol::Exact);
            }
        }
    }
}

fn special_f32s(rng: &mut Rng, n: usize) -> Vec<f32> {
    let mut v = rng.f32s(n, -70000.0, 70000.0);
    let specials = [
        0.0,
        -0.0,
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        1e-8,
        -3e-6,
        65519.0,
        65520.0,
        2.5,
        -2.5,
        3.0e38,
        1.0e-40,
        0.5,
        1.5,
    ];
    for (i, s) in specials.iter().enumerate() {
        v[i] = *s;
    }
    for x in v.iter_mut().skip(specials.len()).step_by(3) {
        *x = rng.uniform(-4.0, 4.0) as f32;
    }
    v
}

#[test]
fn casts_including_f16_and_bf16() {
    let mut rng = Rng::new(7);
    let n = 257u64;
    let x = f32_bytes(&special_f32s(&mut rng, n as usize));
    // Every cast is exact (one rounding, as the reference).
    for to in [
        DType::F16,
        DType::BF16,
        DType::F64,
        I32,
        DType::U8,
        DType::I1,
        DType::I16,
        I64,
    ] {
        let st = tile_fn(F32, &[n], to, &[n], |kb, t| kb.cast(t, to));
        diff(&st, std::slice::from_ref(&x), Tol::Exact);
    }
    // Back from the narrow types, and integer to narrow floats.
    for from in [DType::F16, DType::BF16] {
        let st = tile_fn(F32, &[n], F32, &[n], |kb, t| {
            let h = kb.cast(t, from);
            let h2 = kb.add(h.clone(), h);
            kb.cast(h2, F32)
        });
        diff(&st, std::slice::from_ref(&x), Tol::Exact);
    }
    let ints: Vec<i32> = (0..n)
        .map(|_| (rng.next_u64() as i32) >> (rng.below(31) as u32))
        .collect();
    for to in [F32, DType::F16, DType::BF16, DType::U8, DType::I1] {
        let st = tile_fn(I32, &[n], to, &[n], |kb, t| kb.cast(t, to));
        diff(&st, &[i32_bytes(&ints)], Tol::Exact);
    }
}

#[test]
fn f16_and_bf16_rows_load_and_store_whole() {
    // Rows of 16 or more halves move by one converting call per row or block (`rt::loom_copy_half`): every
    // half bit pattern loaded into f32 (NaN payloads, infinities, subnormals; also one scalar at a time), and
    // f32 values (specials, ties, overflow) stored back into halves, in 2-D blocks of whole rows and in one
    // long row, against the reference.
    let mut rng = Rng::new(71);
    for dt in [DType::F16, DType::BF16] {
        let halves: Vec<u8> = (0..=u16::MAX).flat_map(|h| h.to_le_bytes()).collect();
        let st = tile_fn(dt, &[1024, 64], F32, &[1024, 64], |kb, t| kb.cast(t, F32));
        diff(&st, std::slice::from_ref(&halves), Tol::Exact);
        // The same values one scalar at a time (the per-element reads).
        let st = scalar_fn(dt, 65536, F32, |kb, t| kb.cast(t, F32));
        diff(&st, std::slice::from_ref(&halves), Tol::Exact);
        let st = tile_fn(dt, &[65536], dt, &[65536], |kb, t| {
            let x = kb.cast(t, F32);
            let y = kb.mul(x, f(1.375));
            kb.cast(y, dt)
        });
        diff(&st, std::slice::from_ref(&halves), Tol::Exact);
        let x = f32_bytes(&special_f32s(&mut rng, 48 * 17));
        let st = tile_fn(F32, &[48, 17], dt, &[48, 17], |kb, t| kb.cast(t, dt));
        diff(&st, std::slice::from_ref(&x), Tol::Exact);
    }
}

/// A kernel of `n` programs, each loading one scalar `x[pid]`, applying `body` and storing `y[pid]` (the
/// scalar lowering path, where `tile_fn` exercises the tile path).
fn scalar_fn(
    in_dtype: DType,
    n: u64,
    out_dtype: DType,
    body: impl FnOnce(&mut KB, KOperand) -> KOperand,
) -> loom_ir::kernel::Stage {
    let mut kb = KB::new("scalar_fn", [n, 1, 1]);
    let x = kb.param("x", in_dtype, &[n], READ);
    let y = kb.param("y", out_dtype, &[n], WRITE);
    let p = kb.pid(0);
    let t = kb.load(x, vec![p.clone()], None);
    let r = body(&mut kb, t);
    kb.store(y, vec![p], r);
    one_kernel_stage(kb.finish())
}

/// Float values at and around every integer type's bounds (where a saturating conversion and a plain
/// truncation differ), the f32 rounding and overflow boundaries, NaN, infinities and signed zeros.
fn cast_edge_f64s(rng: &mut Rng, n: usize) -> Vec<f64> {
    let p63 = 2f64.powi(63);
    let mut v: Vec<f64> = vec![
        f64::NAN,
        -f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        0.0,
        -0.0,
        0.5,
        -0.5,
        0.9999,
        -0.9999,
        1.5,
        -1.5,
        2.5,
        -2.5,
        127.5,
        128.0,
        -128.5,
        -129.0,
        255.5,
        256.0,
        32767.9,
        32768.0,
        -32768.9,
        -32769.0,
        65535.5,
        65536.0,
        2147483647.0,
        2147483647.5,
        2147483648.0,
        -2147483648.0,
        -2147483648.9,
        -2147483649.0,
        4294967295.5,
        4294967296.0,
        p63 - 1024.0, // the largest f64 below 2^63
        p63,
        -p63,
        -p63 - 2048.0, // the next f64 below -2^63
        1e300,
        -1e300,
        1e-310,
        f64::from(f32::MAX),
        3.402_823_567_797_337e38, // above f32::MAX, below the rounding boundary
        3.5e38,
        1e-45,
        7e-46,
        16777217.0,
        -16777219.0,
        0.1,
    ];
    while v.len() < n {
        let e = rng.below(70) as i32;
        v.push(rng.uniform(-1.0, 1.0) * 2f64.powi(e));
    }
    v
}

fn cast_edge_i64s(rng: &mut Rng, n: usize) -> Vec<i64> {
    let mut v: Vec<i64> = vec![
        i64::MIN,
        i64::MAX,
        i64::MIN + 1,
        0,
        1,
        -1,
        (1 << 24) + 1,
        (1 << 24) + 3,
        -(1 << 24) - 1,
        (1 << 53) + 1,
        (1 << 53) + 3,
        -(1 << 53) - 1,
        (1 << 62) + (1 << 38) + 1,
        (1 << 62) + (1 << 38),
        i32::MAX.into(),
        i64::from(i32::MAX) + 1,
        i32::MIN.into(),
        i64::from(i32::MIN) - 1,
        u32::MAX.into(),
        i64::from(u32::MAX) + 1,
        255,
        256,
        -128,
        -129,
        65535,
        65536,
        -32769,
    ];
    while v.len() < n {
        v.push((rng.next_u64() as i64) >> rng.below(63));
    }
    v
}

/// The casts the CPU JIT lowers inline (f32/f64/integers in every direction) against the reference at the
/// values where the semantics matter: out-of-range and NaN float-to-integer conversions (the reference
/// saturates, NaN gives 0), integer-to-float rounding (one rounding from the i64), f64-to-f32 overflow and
/// subnormals, two's-complement narrowing. Tile and scalar paths; bit-exact.
#[test]
fn native_casts_at_edge_values() {
    let mut rng = Rng::new(77);
    let n = 96u64;
    let f64s = cast_edge_f64s(&mut rng, n as usize);
    let f32s: Vec<f32> = f64s[..n as usize - 7]
        .iter()
        .map(|&x| x as f32)
        .chain([
            2147483520.0,                     // the largest f32 below 2^31
            -2147483904.0,                    // the next f32 below -2^31
            4294967040.0,                     // the largest f32 below 2^32
            2f32.powi(63) - 2f32.powi(39),    // the largest f32 below 2^63
            -(2f32.powi(63) + 2f32.powi(40)), // the next f32 below -2^63
            f32::from_bits(1),                // the smallest subnormal
            f32::MIN_POSITIVE,
        ])
        .collect();
    assert_eq!(f32s.len(), n as usize);
    let i64s = cast_edge_i64s(&mut rng, n as usize);
    let i32s: Vec<i32> = i64s.iter().map(|&x| x as i32).collect();
    let to_all = [
        F32,
        DType::F64,
        I64,
        I32,
        DType::U32,
        DType::I16,
        DType::U16,
        DType::I8,
        DType::U8,
        DType::I1,
    ];
    let f64_bytes: Vec<u8> = f64s.iter().flat_map(|x| x.to_le_bytes()).collect();
    let inputs: [(DType, Vec<u8>); 4] = [
        (DType::F64, f64_bytes),
        (F32, f32_bytes(&f32s)),
        (I64, i64_bytes(&i64s)),
        (I32, i32_bytes(&i32s)),
    ];
    for (from, x) in &inputs {
        for &to in &to_all {
            let st = tile_fn(*from, &[n], to, &[n], |kb, t| kb.cast(t, to));
            diff(&st, std::slice::from_ref(x), Tol::Exact);
            let st = scalar_fn(*from, n, to, |kb, t| kb.cast(t, to));
            diff(&st, std::slice::from_ref(x), Tol::Exact);
        }
    }
    // Chains through a narrow type and back (the i64 storage of i8 / u32 must be the wrapped value).
    let st = tile_fn(I64, &[n], DType::F64, &[n], |kb, t| {
        let a = kb.cast(t, DType::I8);
        let b = kb.cast(a, DType::U32);
        kb.cast(b, DType::F64)
    });
    diff(&st, &[i64_bytes(&i64s)], Tol::Exact);
}

#[test]
fn every_unary_op() {
    let mut rng = Rng::new(8);
    let n = 300u64;
    let x = rng.f32s(n as usize, -6.0, 6.0);
    let pos: Vec<f32> = x.iter().map(|v| v.abs() + 1e-3).collect();
    for op in [
        UnOp::Neg,
        UnOp::Abs,
        UnOp::Exp,
        UnOp::Log,
        UnOp::Tanh,
        UnOp::Erf,
        UnOp::Sqrt,
        UnOp::Rsqrt,
        UnOp::Sigmoid,
    ] {
        let input = if matches!(op, UnOp::Log | UnOp::Sqrt | UnOp::Rsqrt) {
            &pos
        } else {
            &x
        };
        let st = tile_fn(F32, &[n], F32, &[n], |kb, t| kb.un(op, t));
        // neg/abs/sqrt: exact (IEEE); the others: 2 ulp (f64 function rounded once; erf is our own series).
        let tol = if matches!(op, UnOp::Neg | UnOp::Abs | UnOp::Sqrt) {
            Tol::Exact
        } else {
            Tol::Ulp(2)
        };
        diff(&st, &[f32_bytes(input)], tol);
    }
    // f16 arithmetic: computed in f32 and rounded once to f16 is exact for + and sqrt.
    let st = tile_fn(F32, &[n], F32, &[n], |kb, t| {
        let h = kb.cast(t, DType::F16);
        let a = kb.un(UnOp::Abs, h);
        let s = kb.un(UnOp::Sqrt, a);
        let e = kb.un(UnOp::Exp, s);
        kb.cast(e, F32)
    });
    diff(&st, &[f32_bytes(&x)], Tol::Exact);
}

#[test]
fn integer_ops_and_division_by_zero() {
    let mut rng = Rng::new(9);
    let n = 64u64;
    let v: Vec<i32> = (0..2 * n)
        .map(|i| {
            if i == 5 {
                i32::MIN
            } else {
                (rng.next_u64() as i32) >> rng.below(28)
            }
        })
        .collect();
    let mut w = v.clone();
    w[n as usize + 5] = -1;
    for k in 0..n as usize {
        if w[n as usize + k] == 0 {
            w[n as usize + k] = 3;
        }
    }
    for op in [
        BinOp::Add,
        BinOp::Sub,
        BinOp::Mul,
        BinOp::Div,
        BinOp::Rem,
        BinOp::Min,
        BinOp::Max,
        BinOp::And,
        BinOp::Or,
        BinOp::Xor,
        BinOp::Shl,
        BinOp::Shr,
    ] {
        let st = tile_fn(I32, &[2, n], I32, &[n], |kb, t| {
            let a = kb.reshape(t, &[2 * n as u32]);
            let lo = kb.range(i(0), n as u32);
            let _ = lo;
            let t2 = kb.reshape(a, &[2, n as u32]);
            let tt = kb.transpose(t2);
            let x = kb.reduce(ReduceOp::Max, tt.clone(), 1);
            let y = kb.reduce(ReduceOp::Min, tt, 1);
            kb.bin(op, x, y)
        });
        // Integer arithmetic wraps: exact.
        diff(&st, &[i32_bytes(&w)], Tol::Exact);
    }
    // Division by a zero element is an error naming the op, as in the reference.
    let st = tile_fn(I32, &[n], I32, &[n], |kb, t| {
        let z = kb.full(imm_i(0, I32), &[n as u32], I32);
        let c = kb.cmp(CmpOp::Gt, t.clone(), z.clone());
        let d = kb.select(c, t.clone(), z);
        kb.div(t, d)
    });
    let ins = i32_bytes(&v[..n as usize]);
    let mut want = loom_reference::alloc_outputs(&st).unwrap();
    let we = loom_reference::run_stage(&st, &[&ins], &[], &mut want).unwrap_err();
    let mut got = loom_reference::alloc_outputs(&st).unwrap();
    let ge = loom_cpu::compile_stage(&st)
        .unwrap()
        .run(&[&ins], &[], &mut got, 1)
        .unwrap_err();
    assert_eq!(ge.to_string(), we.to_string());
}

#[test]
fn loops_and_branches() {
    // Per row block: sum over column blocks in a `for`, doubled in odd programs by an `if`.
    let mut rng = Rng::new(10);
    let (r, c, br, bc) = (13u64, 70u64, 4u32, 16u32);
    let mut kb = KB::new("rowsum", [cdiv(r, br as u64), 1, 1]);
    let x = kb.param("x", F32, &[r, c], READ);
    let y = kb.param("y", F32, &[r], WRITE);
    let p = kb.pid(0);
    let r0 = kb.mul(p.clone(), i(br as i64));
    let rr = kb.range(r0, br);
    let z = kb.full(f(0.0), &[br], F32);
    let rr2 = rr.clone();
    let res = kb.for_(
        i(0),
        i(c as i64),
        i(bc as i64),
        vec![z],
        move |kb, k0, it| {
            let rc = kb.range(k0, bc);
            let t = kb.load(x, vec![rr2, rc], Some(f(0.0)));
            let s = kb.reduce(ReduceOp::Sum, t, 1);
            vec![kb.add(it[0].clone(), s)]
        },
    );
    let odd = kb.bin(BinOp::And, p, i(1));
    let c1 = kb.cmp(CmpOp::Eq, odd, i(1));
    let ty = tile(&[br], F32);
    let acc = res[0].clone();
    let (a1, a2) = (acc.clone(), acc);
    let out = kb.if_(
        c1,
        vec![ty],
        move |kb| vec![kb.mul(a1, f(2.0))],
        move |_| vec![a2],
    );
    kb.store(y, vec![rr], out[0].clone());
    let st = one_kernel_stage(kb.finish());
    // Relative 1e-6: per-block f64 sums rounded to f32, then f32 adds (identical order on both sides).
    diff(
        &st,
        &[rand_f32(&mut rng, (r * c) as usize, -1.0, 1.0)],
        Tol::Rel(1e-6, 0.0),
    );
}

/// Range tiles are lazy in the JIT (their elements written only where an operation reads them): ranges and
/// moved ranges (`+`/`-` a scalar, `*` a positive constant) used as indices (masked, strided and whole-row
/// accesses), as values at the top level, inside a loop and in one branch of an `if`, must give the
/// reference's bytes, rows past the buffer included.
#[test]
fn lazy_ranges_index_and_read_like_the_reference() {
    let mut rng = Rng::new(17);
    let (r, c, br, bc) = (11u64, 40u64, 4u32, 16u32);
    let mut kb = KB::new("lazy", [cdiv(r, br as u64), cdiv(c, bc as u64), 1]);
    let x = kb.param("x", F32, &[r, 2 * c], READ);
    let y = kb.param("y", F32, &[r, c], WRITE);
    let z = kb.param("z", I64, &[r, c], WRITE);
    let (p0, p1) = (kb.pid(0), kb.pid(1));
    let r0 = kb.mul(p0.clone(), i(br as i64));
    let rr = kb.range(r0, br);
    let c0 = kb.mul(p1, i(bc as i64));
    let rc = kb.range(c0, bc);
    // Strided (every other column, then the odd ones) and masked.
    let e = kb.mul(rc.clone(), i(2));
    let o = kb.add(e.clone(), i(1));
    let xe = kb.load(x, vec![rr.clone(), e], Some(f(-1.0)));
    let xo = kb.load(x, vec![rr.clone(), o.clone()], Some(f(-2.0)));
    // The moved range read as values at the top level: [br, bc] of o's elements.
    let ov = kb.cast(o, F32);
    let ov = kb.expand_dims(ov, 0);
    let ov = kb.broadcast(ov, &[br, bc]);
    let s = kb.add(xe, xo);
    let s = kb.add(s, ov);
    // Read inside a loop (a range moved by the loop's counter, then read).
    let rc2 = rc.clone();
    let res = kb.for_(i(0), i(3), i(1), vec![s], move |kb, k, it| {
        let m = kb.sub(rc2, k);
        let mv = kb.cast(m, F32);
        let mv = kb.expand_dims(mv, 0);
        let mv = kb.broadcast(mv, &[br, bc]);
        vec![kb.add(it[0].clone(), mv)]
    });
    // Read in one branch only (odd row blocks), as an index in both.
    let odd = kb.bin(BinOp::And, p0, i(1));
    let c1 = kb.cmp(CmpOp::Eq, odd, i(1));
    let ty = tile(&[br, bc], F32);
    let (a1, a2) = (res[0].clone(), res[0].clone());
    let rr1 = rr.clone();
    let out = kb.if_(
        c1,
        vec![ty],
        move |kb| {
            let rv = kb.cast(rr1, F32);
            let rv = kb.expand_dims(rv, 1);
            let rv = kb.broadcast(rv, &[br, bc]);
            vec![kb.mul(a1, rv)]
        },
        move |_| vec![a2],
    );
    kb.store(y, vec![rr.clone(), rc.clone()], out[0].clone());
    // A range stored as values.
    let rcv = kb.expand_dims(rc.clone(), 0);
    let rcv = kb.broadcast(rcv, &[br, bc]);
    kb.store(z, vec![rr, rc], rcv);
    let st = one_kernel_stage(kb.finish());
    // Exact: the same adds and multiplies of the same values in the same order.
    diff(
        &st,
        &[rand_f32(&mut rng, (r * 2 * c) as usize, -10.0, 10.0)],
        Tol::Exact,
    );
}

#[test]
fn quantised_loads_dequantise_exactly() {
    let mut rng = Rng::new(11);
    for dtype in [
        DType::Q8_0,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q4K,
        DType::Q6K,
    ] {
        let per = dtype.block().unwrap().0;
        let (rows, cols) = (3u64, per * 2);
        let data = random_blocks(&mut rng, dtype, (rows * cols / per) as usize);
        let mut kb = KB::new("deq", [rows, 1, 1]);
        let w = kb.param("w", dtype, &[rows, cols], READ);
        let y = kb.param("y", F32, &[rows, cols], WRITE);
        let p = kb.pid(0);
        let rc = kb.range(i(0), 64);
        // Column blocks of 64 through a loop, masked: checks fast and masked paths of quantised reads.
        let p2 = p.clone();
        kb.for_(i(0), i(cols as i64), i(64), vec![], move |kb, k0, _| {
            let rc2 = kb.range(k0, 64);
            let t = kb.load(w, vec![p2.clone(), rc2.clone()], Some(f(0.0)));
            kb.store(y, vec![p2, rc2], t);
            vec![]
        });
        let _ = rc;
        let st = one_kernel_stage(kb.finish());
        // Exact: the same f32 operations as ggml's dequantize_row_*.
        diff(&st, &[data], Tol::Exact);
    }
}

#[test]
fn stage_contract_checks_buffers() {
    let st = one_kernel_stage(masked_copy(4, 4, 4, 4));
    let cs = loom_cpu::compile_stage(&st).unwrap();
    let mut out = loom_reference::alloc_outputs(&st).unwrap();
    let e = cs.run(&[&[0u8; 60]], &[], &mut out, 1).unwrap_err();
    assert!(
        matches!(
            e,
            loom_cpu::Error::SizeMismatch {
                expected: 64,
                actual: 60,
                ..
            }
        ),
        "{e}"
    );
    let e = cs.run(&[], &[], &mut out, 1).unwrap_err();
    assert!(matches!(e, loom_cpu::Error::BufferCount { .. }), "{e}");
    // A write parameter bound to an input is refused at compile time.
    let mut bad = st.clone();
    bad.dispatches[0].args[1] = BufRef::Input(0);
    assert!(matches!(
        loom_cpu::compile_stage(&bad),
        Err(loom_cpu::Error::Malformed { .. })
    ));
    // Report: one kernel, timed.
    assert_eq!(cs.compile_report().kernels.len(), 1);
}

/// `y = W x` with a quantised `W: [n, k]` (GGUF layout, blocks along k): the JIT (dequantise, f32 `tile.dot`)
/// and the whole-kernel `qmatvec` path (activation quantised to Q8 blocks, integer block dots) against the
/// reference (dequantise bit for bit, f64 dot). Per output, with `S = sum_k |w_k x_k|`:
/// * JIT: `|got - want| <= 1e-5 * S` (f32 accumulation over `k`);
/// * qmatvec: `|got - want| <= sum_b dx_b / 2 * sum_{k in b} |w_k| + 1e-5 * (S + sum_k |w_k| dx_b)`, where
///   `dx_b = max_{k in b} |x_k| / 127` is the activation block's quantisation step (each `x_k` moves by at most
///   `dx_b / 2`), the rest f32 rounding; the bound the `qdot` unit tests also check.
#[test]
fn quantised_matvec_jit_and_pattern_agree_with_the_reference() {
    let mut rng = Rng::new(23);
    for dtype in [DType::Q8_0, DType::Q4_0, DType::Q4_1] {
        for (n, k, bn, bk) in [
            (70u64, 96u64, 16u32, 32u32),
            (64, 128, 32, 64),
            (96, 320, 32, 96),
            // Whole groups of 16 blocks plus a tail (one and two groups), and row counts off the
            // AVX-512 Q4_1 kernel's batch of 8.
            (37, 576, 16, 64),
            (21, 1056, 16, 96),
        ] {
            let st = one_kernel_stage(matvec_kernel(dtype, n, k, bn, bk));
            let w = random_blocks(&mut rng, dtype, (n * k / 32) as usize);
            let xs = rng.f32s(k as usize, -2.0, 2.0);
            let ins = [w.clone(), f32_bytes(&xs)];
            let ins_ref: Vec<&[u8]> = ins.iter().map(|v| v.as_slice()).collect();
            let mut want = loom_reference::alloc_outputs(&st).unwrap();
            loom_reference::run_stage(&st, &ins_ref, &[], &mut want).expect("reference run");
            let want = f32s(&want[0]);
            let wd = loom_reference::dequantize(dtype, &w).unwrap();
            let dx: Vec<f64> = xs
                .chunks(32)
                .map(|b| b.iter().fold(0f64, |m, v| m.max(f64::from(v.abs()))) / 127.0)
                .collect();
            for (match_gemm, path) in [(false, "jit"), (true, "qmatvec")] {
                let cs = loom_cpu::compile_stage_with(
                    &st,
                    loom_cpu::Options {
                        match_gemm,
                        ..Default::default()
                    },
                )
                .unwrap();
                assert_eq!(cs.compile_report().kernels[0].path, path);
                for threads in [1, 2] {
                    let mut got = loom_reference::alloc_outputs(&st).unwrap();
                    cs.run(&ins_ref, &[], &mut got, threads).expect("cpu run");
                    for (r, g) in f32s(&got[0]).iter().enumerate() {
                        let row = &wd[r * k as usize..(r + 1) * k as usize];
                        let s: f64 = row
                            .iter()
                            .zip(&xs)
                            .map(|(a, b)| f64::from(a * b).abs())
                            .sum();
                        let wq: f64 = row
                            .iter()
                            .enumerate()
                            .map(|(j, a)| f64::from(a.abs()) * dx[j / 32])
                            .sum();
                        let bound = if path == "jit" {
                            1e-5 * s
                        } else {
                            wq / 2.0 + 1e-5 * (s + wq)
                        };
                        let err = (f64::from(*g) - f64::from(want[r])).abs();
                        assert!(
                            err <= bound,
                            "{dtype} {n}x{k} {path} {threads} threads: y[{r}] = {g}, want {} (error {err:e} > {bound:e})",
                            want[r]
                        );
                    }
                }
            }
        }
    }
}

/// The row form (`x: [m, k]`, `y: [m, n]`, the row `pid(0)`) against the reference, per output with
/// `S = sum_k |w_k x_k|`:
/// * JIT, and `qmatvec` where it keeps f32 activations (`qdotf`: 8 or more rows, or no AVX-512 VNNI):
///   `|got - want| <= 1e-5 * S`;
/// * `qmatvec` on weight tiles (`qtile`: fewer than 8 rows with AVX-512 VNNI), whose activations are quantised
///   per block of 32 to 22 bits: `1e-5 * S + sum_b 1.5 * max_b |x| / (2 * 2097151) * sum_{k in b} |w_k|`
///   (each activation moves by at most 0.75 of its block's step).
#[test]
fn quantised_matvec_rows_agree_with_the_reference() {
    let mut rng = Rng::new(29);
    for dtype in [DType::Q8_0, DType::Q4_0, DType::Q4_1] {
        for (m, n, k, bn, bk) in [
            (1u64, 70u64, 96u64, 16u32, 32u32),
            (5, 37, 576, 16, 64),
            (3, 64, 128, 64, 64),
            // Enough weights for two threads (a split of the weight rows).
            (2, 600, 576, 16, 64),
            // Two weight rows by four activation rows, with remainders of both, on two threads.
            (6, 601, 576, 16, 64),
            // Eight and more rows: the f32 blocked dot.
            (9, 45, 256, 16, 64),
        ] {
            let st = one_kernel_stage(matvec_rows_kernel(dtype, m, n, k, bn, bk));
            let w = random_blocks(&mut rng, dtype, (n * k / 32) as usize);
            let xs = rng.f32s((m * k) as usize, -2.0, 2.0);
            let ins = [w.clone(), f32_bytes(&xs)];
            let ins_ref: Vec<&[u8]> = ins.iter().map(|v| v.as_slice()).collect();
            let mut want = loom_reference::alloc_outputs(&st).unwrap();
            loom_reference::run_stage(&st, &ins_ref, &[], &mut want).expect("reference run");
            let want = f32s(&want[0]);
            let wd = loom_reference::dequantize(dtype, &w).unwrap();
            for (match_gemm, path) in [(false, "jit"), (true, "qmatvec")] {
                let cs = loom_cpu::compile_stage_with(
                    &st,
                    loom_cpu::Options {
                        match_gemm,
                        ..Default::default()
                    },
                )
                .unwrap();
                assert_eq!(cs.compile_report().kernels[0].path, path);
                for threads in [1, 2] {
                    let mut got = loom_reference::alloc_outputs(&st).unwrap();
                    cs.run(&ins_ref, &[], &mut got, threads).expect("cpu run");
                    for (idx, g) in f32s(&got[0]).iter().enumerate() {
                        let (r, c) = (idx / n as usize, idx % n as usize);
                        let x = &xs[r * k as usize..(r + 1) * k as usize];
                        let row = &wd[c * k as usize..(c + 1) * k as usize];
                        let s: f64 = row.iter().zip(x).map(|(a, b)| f64::from(a * b).abs()).sum();
                        let q: f64 = row
                            .chunks(32)
                            .zip(x.chunks(32))
                            .map(|(wb, xb)| {
                                let amax = xb.iter().fold(0f64, |a, v| a.max(f64::from(v.abs())));
                                let sw: f64 = wb.iter().map(|v| f64::from(v.abs())).sum();
                                1.5 * amax / (2.0 * 2_097_151.0) * sw
                            })
                            .sum();
                        let bound = 1e-5 * s + if path == "qmatvec" && m < 8 { q } else { 0.0 };
                        let err = (f64::from(*g) - f64::from(want[idx])).abs();
                        assert!(
                            err <= bound,
                            "{dtype} {m}x{n}x{k} {path} {threads} threads: y[{r}, {c}] = {g}, want {} (error {err:e} > {bound:e})",
                            want[idx]
                        );
                    }
                }
            }
        }
    }
    // A row index that is not pid(0) on both sides (here: the store's row from pid(0), the load's a constant)
    // is not the row form.
    let mut kern = matvec_rows_kernel(DType::Q8_0, 2, 64, 64, 16, 32);
    for op in &mut kern.body.ops {
        if let loom_ir::kernel::KOpKind::For { body, .. } = &mut op.kind {
            for bop in &mut body.ops {
                // Parameter 1 is x.
                if let loom_ir::kernel::KOpKind::Load {
                    param: 1, indices, ..
                } = &mut bop.kind
                {
                    indices[0] = i(0);
                }
            }
        }
    }
    let cs = loom_cpu::compile_stage(&one_kernel_stage(kern)).unwrap();
    assert_eq!(cs.compile_report().kernels[0].path, "jit");
}

/// Consecutive tiled row products run as one group (`qtile::matmul_group`, `qamx::matmul_group`): two
/// products of the same activations give the bits each gives alone, and a third that reads the first one's
/// output is not grouped with it (it must see the finished output). Checked against one-dispatch stages of the
/// same kernels and against the reference.
#[test]
fn grouped_row_products_equal_the_products_alone() {
    // 2 rows: the VNNI tiles; 16 rows: AMX-INT8 tiles where the CPU has them (`qamx.rs`), else f32 (not
    // grouped).
    for rows in [2u64, 16] {
        let mut rng = Rng::new(37);
        let (m, k, n, n3) = (rows, 256u64, 64u64, 32u64);
        let ka = matvec_rows_kernel(DType::Q4_1, m, n, k, 16, 64);
        let mut kb = matvec_rows_kernel(DType::Q8_0, m, n3, n, 16, 64);
        kb.name = "second".into();
        let st = stage(
            "s",
            vec![
                buf("w1", DType::Q4_1, &[n, k]),
                buf("w2", DType::Q4_1, &[n, k]),
                buf("w3", DType::Q8_0, &[n3, n]),
                buf("x", DType::F32, &[m, k]),
            ],
            vec![
                buf("y1", DType::F32, &[m, n]),
                buf("y2", DType::F32, &[m, n]),
                buf("y3", DType::F32, &[m, n3]),
            ],
            vec![],
            vec![ka.clone(), kb.clone()],
            vec![
                (
                    0,
                    vec![BufRef::Input(0), BufRef::Input(3), BufRef::Output(0)],
                ),
                (
                    0,
                    vec![BufRef::Input(1), BufRef::Input(3), BufRef::Output(1)],
                ),
                (
                    1,
                    vec![BufRef::Input(2), BufRef::Output(0), BufRef::Output(2)],
                ),
            ],
        );
        let w1 = random_blocks(&mut rng, DType::Q4_1, (n * k / 32) as usize);
        let w2 = random_blocks(&mut rng, DType::Q4_1, (n * k / 32) as usize);
        let w3 = random_blocks(&mut rng, DType::Q8_0, (n3 * n / 32) as usize);
        let xs = f32_bytes(&rng.f32s((m * k) as usize, -2.0, 2.0));
        let cs = loom_cpu::compile_stage(&st).unwrap();
        for threads in [1, 2] {
            let mut got = loom_reference::alloc_outputs(&st).unwrap();
            cs.run(&[&w1, &w2, &w3, &xs], &[], &mut got, threads)
                .unwrap();
            let alone = |kern: &loom_ir::kernel::Kernel, w: &[u8], x: &[u8]| {
                let one = one_kernel_stage(kern.clone());
                let c = loom_cpu::compile_stage(&one).unwrap();
                let mut out = loom_reference::alloc_outputs(&one).unwrap();
                c.run(&[w, x], &[], &mut out, threads).unwrap();
                out.remove(0)
            };
            assert_eq!(got[0], alone(&ka, &w1, &xs), "{threads} threads: y1");
            assert_eq!(got[1], alone(&ka, &w2, &xs), "{threads} threads: y2");
            assert_eq!(got[2], alone(&kb, &w3, &got[0]), "{threads} threads: y3");
            let mut want = loom_reference::alloc_outputs(&st).unwrap();
            loom_reference::run_stage(&st, &[&w1, &w2, &w3, &xs], &[], &mut want).unwrap();
            for (o, (g, w)) in got.iter().zip(&want).enumerate() {
                for (a, b) in f32s(g).iter().zip(f32s(w)) {
                    assert!(
                        (a - b).abs() <= 1e-3 * (1.0 + b.abs()),
                        "output {o}: {a} vs {b}"
                    );
                }
            }
        }
    }
}

/// The row form with its weights a stage parameter, run with a [`loom_cpu::ParamCache`]: the weight tiles made
/// on the first run are kept (the cache holds bytes) and used by the next runs, so new bytes in the parameter
/// are seen only once the owner clears the cache (the HAL does on every write); then the result is the new
/// weights' product again. Without a cache every run derives what it needs.
#[test]
fn quantised_row_products_keep_derived_weights_in_the_param_cache() {
    let mut rng = Rng::new(31);
    let (m, n, k) = (2u64, 48u64, 256u64);
    let st = matvec_rows_param_stage(DType::Q4_1, m, n, k);
    let cs = loom_cpu::compile_stage(&st).unwrap();
    assert_eq!(cs.compile_report().kernels[0].path, "qmatvec");
    let xs = f32_bytes(&rng.f32s((m * k) as usize, -2.0, 2.0));
    let w1 = random_blocks(&mut rng, DType::Q4_1, (n * k / 32) as usize);
    let w2 = random_blocks(&mut rng, DType::Q4_1, (n * k / 32) as usize);
    let run = |w: &[u8], cache: Option<&loom_cpu::ParamCache>| {
        let mut got = loom_reference::alloc_outputs(&st).unwrap();
        let caches: Vec<&loom_cpu::ParamCache> = cache.into_iter().collect();
        cs.run_cached(
            &[&xs],
            &[w],
            &caches,
            &mut got,
            2,
            &loom_ir::kernel::RunBounds::NONE,
        )
        .unwrap();
        got.remove(0)
    };
    let (y1, y2) = (run(&w1, None), run(&w2, None));
    assert_ne!(y1, y2);
    let cache = loom_cpu::ParamCache::new();
    assert_eq!(cache.bytes(), 0);
    assert_eq!(run(&w1, Some(&cache)), y1);
    if cache.bytes() == 0 {
        eprintln!("no AVX-512 VNNI here: the row products derive nothing; cache checks skipped");
        return;
    }
    // Still the tiles of w1: the cache was not told that the bytes changed.
    assert_eq!(run(&w2, Some(&cache)), y1);
    cache.clear();
    assert_eq!(cache.bytes(), 0);
    assert_eq!(run(&w2, Some(&cache)), y2);
}

#[test]
fn matvec_pattern_only_matches_the_exact_form() {
    // An f32 weight, or a weight shape whose K is not a multiple of 32 blocks, stays on the JIT.
    let st = one_kernel_stage(matvec_kernel(DType::F32, 64, 64, 16, 32));
    let cs = loom_cpu::compile_stage(&st).unwrap();
    assert_eq!(cs.compile_report().kernels[0].path, "jit");
    // Loop bound short of K: a partial contraction is not a matvec.
    let mut kern = matvec_kernel(DType::Q8_0, 64, 64, 16, 32);
    for op in &mut kern.body.ops {
        if let loom_ir::kernel::KOpKind::For { hi, .. } = &mut op.kind {
            *hi = i(32);
        }
    }
    let cs = loom_cpu::compile_stage(&one_kernel_stage(kern)).unwrap();
    assert_eq!(cs.compile_report().kernels[0].path, "jit");
}

#[test]
fn rows_pattern_only_matches_the_exact_form() {
    use loom_ir::kernel::{KOpKind, Kernel};
    let path = |k: Kernel| {
        let cs = loom_cpu::compile_stage(&one_kernel_stage(k)).unwrap();
        cs.compile_report().kernels[0].path
    };
    assert_eq!(path(softmax(64, 128, 8, 128)), "rows");
    assert_eq!(path(softmax(9, 100, 4, 100)), "rows");
    assert_eq!(path(layernorm(64, 384, 8)), "rows");
    // Masked columns (the tile is wider than the row): a layernorm would count them; stays on the JIT.
    assert_eq!(path(softmax(64, 100, 8, 128)), "jit");
    let edit = |mut k: Kernel, f: &dyn Fn(&mut KOpKind) -> bool| {
        assert!(
            k.body.ops.iter_mut().any(|op| f(&mut op.kind)),
            "no op edited"
        );
        k
    };
    // min instead of max.
    let k = edit(softmax(64, 128, 8, 128), &|op| match op {
        KOpKind::Reduce { op, .. } if *op == ReduceOp::Max => {
            *op = ReduceOp::Min;
            true
        }
        _ => false,
    });
    assert_eq!(path(k), "jit");
    // mean - x instead of x - mean (not commutative).
    let k = edit(layernorm(64, 384, 8), &|op| match op {
        KOpKind::Binary {
            op: BinOp::Sub,
            a,
            b,
        } => {
            std::mem::swap(a, b);
            true
        }
        _ => false,
    });
    assert_eq!(path(k), "jit");
    // exp -> tanh.
    let k = edit(softmax(64, 128, 8, 128), &|op| match op {
        KOpKind::Unary { op, .. } if *op == UnOp::Exp => {
            *op = UnOp::Tanh;
            true
        }
        _ => false,
    });
    assert_eq!(path(k), "jit");
    // sqrt instead of rsqrt.
    let k = edit(layernorm(64, 384, 8), &|op| match op {
        KOpKind::Unary { op, .. } if *op == UnOp::Rsqrt => {
            *op = UnOp::Sqrt;
            true
        }
        _ => false,
    });
    assert_eq!(path(k), "jit");
    // An extra op the pattern would not run (a second, unused checked load of x).
    let mut k = softmax(64, 128, 8, 128);
    let li = k
        .body
        .ops
        .iter()
        .position(|op| matches!(op.kind, KOpKind::Load { .. }))
        .unwrap();
    let mut extra = k.body.ops[li].clone();
    let v = loom_ir::kernel::KValue(k.values.len() as u32);
    k.values.push(k.values[extra.results[0].0 as usize].clone());
    extra.results = vec![v];
    if let KOpKind::Load { fill, .. } = &mut extra.kind {
        *fill = None;
    }
    k.body.ops.insert(li + 1, extra);
    assert_eq!(path(k.clone()), "jit");
    diff(
        &one_kernel_stage(k),
        &[rand_f32(&mut Rng::new(9), 64 * 128, -1.0, 1.0)],
        Tol::Rel(1e-6, 0.0),
    );
}

/// SmolLM2's paged attention (`@attend`, `packages/smollm2/kernel.loom`) writes every row of every span
/// whatever the block size BQ: the grid's third extent is one program per span and head below BQ = 16, and
/// each program takes all of its span's blocks. Two spans of 3 and 5 rows (one after 5 positions already in
/// its pages, one from position 0), pages of 4 tokens in a shuffled table, layer 1 of 2; BQ 1 and 2 (several
/// blocks a span, one program each span and head), 4 and 16. The harness requires the reference to write every
/// output element (the spans cover all 8 rows) and the JIT to match it; every BQ gives the same numbers.
#[test]
fn package_attention_writes_every_row_whatever_its_block_size() {
    let mut cat = package_catalog(&[
        "motifs/rope.loom",
        "motifs/attention.loom",
        "smollm2/kernel.loom",
    ]);
    let wrapper = "module @test.attend {
  export stage @s<X: i64, S: i64, T: i64, PT: i64, P: i64, L: i64, NH: i64, KV: i64, HD: i64, BQ: i64>
      (%x: buffer<i32, [X]> input, %q: buffer<f32, [T, NH * HD]> input, %li: buffer<i32, [1]> input,
       %pool: buffer<f16, [P, L * 2 * KV * PT, HD]> input, %o: buffer<f32, [T, NH * HD]> output)
  {
    dispatch @smollm2.kernel.attend<X = X, S = S, T = T, PT = PT, P = P, L = L, NH = NH, KV = KV, HD = HD,
                                    BQ = BQ>(%x, %q, %li, %pool, %o)
  }
}";
    cat.add_source("test.loom", wrapper).expect("wrapper");
    let (s, t, pt, p, l, nh, kv, hd) = (2i64, 8i64, 4i64, 4i64, 2i64, 4i64, 2i64, 16i64);
    // Span headers (position, count, first row, first page-table entry, pages, logit row, logits), then ids,
    // positions and rows' spans (unread here), then the page table.
    let mut x = vec![0i32; (7 * s + 3 * t + p) as usize];
    x[..7].copy_from_slice(&[5, 3, 0, 0, 2, -1, 0]);
    x[7..14].copy_from_slice(&[0, 5, 3, 2, 2, -1, 0]);
    let table = (7 * s + 3 * t) as usize;
    x[table..].copy_from_slice(&[3, 0, 1, 2]);
    let mut rng = Rng::new(53);
    let q = rng.f32s((t * nh * hd) as usize, -1.0, 1.0);
    // f16 keys and values in [-2, -0.5] and [0.5, 2].
    let pool: Vec<u8> = (0..p * l * 2 * kv * pt * hd)
        .flat_map(|_| {
            let r = rng.next_u64();
            let h = ((r & 1) << 15) | ((14 + ((r >> 1) & 1)) << 10) | ((r >> 2) & 0x3ff);
            (h as u16).to_le_bytes()
        })
        .collect();
    let inputs = vec![i32_bytes(&x), f32_bytes(&q), i32_bytes(&[1]), pool];
    let mut first: Option<Vec<u8>> = None;
    for bq in [1i64, 2, 4, 16] {
        let cfg: Vec<(String, loom_ir::TValue)> = [
            ("X", 7 * s + 3 * t + p),
            ("S", s),
            ("T", t),
            ("PT", pt),
            ("P", p),
            ("L", l),
            ("NH", nh),
            ("KV", kv),
            ("HD", hd),
            ("BQ", bq),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), loom_ir::TValue::I64(*v)))
        .collect();
        let mi = cat.find("test.attend").expect("module");
        let st = loom_kernel::specialize_stage(&cat, mi, "s", &cfg)
            .unwrap_or_else(|e| panic!("BQ {bq}: {}", e.join("")));
        let out = diff(&st, &inputs, Tol::Rel(1e-5, 1e-6)).remove(0);
        match &first {
            None => first = Some(out),
            Some(want) => {
                for (i, (a, b)) in f32s(&out).into_iter().zip(f32s(want)).enumerate() {
                    assert!(
                        (a - b).abs() <= 1e-5 * b.abs() + 1e-6,
                        "BQ {bq}: element {i} is {a}, BQ 1 gave {b}"
                    );
                }
            }
        }
    }
}
