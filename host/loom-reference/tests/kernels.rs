//! Kernels built by hand and checked against direct Rust computation.

mod common;

use common::*;
use loom_ir::kernel::{BinOp, CmpOp, DType, ReduceOp, UnOp};
use loom_reference::{Error, POISON_BYTE, run_kernel};

const POISON_F32: u32 = u32::from_le_bytes([POISON_BYTE; 4]);

#[test]
fn masked_copy_where_sizes_are_not_multiples_of_the_tile() {
    const R: u64 = 37;
    const C: u64 = 53;
    const BR: u32 = 8;
    const BC: u32 = 16;
    let mut rng = Rng::new(1);
    let x = rng.f32s((R * C) as usize, -4.0, 4.0);

    // y[i + 2, j - 3] = x[i, j]: rows 0 and 1 of y are never stored (untouched poison), and y's last three
    // columns come from x columns past the end (masked loads: the fill 0.5). Stores at column -3..0 and rows
    // >= R are skipped.
    let mut kb = KB::new("shift_copy", [cdiv(R, BR as u64), cdiv(C, BC as u64), 1]);
    let px = kb.param("x", DType::F32, &[R, C], READ);
    let py = kb.param("y", DType::F32, &[R, C], WRITE);
    let p0 = kb.pid(0);
    let p1 = kb.pid(1);
    let r0 = kb.mul(p0, i(BR as i64));
    let rr = kb.range(r0, BR);
    let c0 = kb.mul(p1, i(BC as i64));
    let rc = kb.range(c0, BC);
    let t = kb.load(px, vec![rr.clone(), rc.clone()], Some(f(0.5)));
    let rr2 = kb.add(rr, i(2));
    let rc2 = kb.sub(rc, i(3));
    kb.store(py, vec![rr2, rc2], t);
    let k = kb.finish();

    let mut bufs = vec![f32_bytes(&x), vec![POISON_BYTE; (R * C * 4) as usize]];
    run_kernel(&k, &mut bufs).unwrap();
    let y = f32s(&bufs[1]);
    for r in 0..R as usize {
        for c in 0..C as usize {
            let got = y[r * C as usize + c];
            if r < 2 {
                assert_eq!(got.to_bits(), POISON_F32, "y[{r}][{c}] must be untouched");
            } else if c + 3 < C as usize {
                assert_eq!(got, x[(r - 2) * C as usize + c + 3], "y[{r}][{c}]");
            } else {
                assert_eq!(got, 0.5, "y[{r}][{c}] reads past x's end: the fill");
            }
        }
    }

    // Padded copy: z is bigger than x; every z element is written, with the fill outside x.
    let (zr, zc) = (R + 2, C + 5);
    let mut kb = KB::new("pad_copy", [cdiv(zr, BR as u64), cdiv(zc, BC as u64), 1]);
    let px = kb.param("x", DType::F32, &[R, C], READ);
    let pz = kb.param("z", DType::F32, &[zr, zc], WRITE);
    let p0 = kb.pid(0);
    let p1 = kb.pid(1);
    let r0 = kb.mul(p0, i(BR as i64));
    let rr = kb.range(r0, BR);
    let c0 = kb.mul(p1, i(BC as i64));
    let rc = kb.range(c0, BC);
    let t = kb.load(px, vec![rr.clone(), rc.clone()], Some(f(7.0)));
    kb.store(pz, vec![rr, rc], t);
    let k = kb.finish();
    let mut bufs = vec![f32_bytes(&x), vec![POISON_BYTE; (zr * zc * 4) as usize]];
    run_kernel(&k, &mut bufs).unwrap();
    let z = f32s(&bufs[1]);
    for r in 0..zr as usize {
        for c in 0..zc as usize {
            let want = if r < R as usize && c < C as usize {
                x[r * C as usize + c]
            } else {
                7.0
            };
            assert_eq!(z[r * zc as usize + c], want, "z[{r}][{c}]");
        }
    }
}

/// `out[t, :] = emb[ids[t], :]` with a checked load of the row.
fn gather_kernel(v: u64, h: u64, t: u64, checked: bool) -> loom_ir::kernel::Kernel {
    let mut kb = KB::new("gather_rows", [t, 1, 1]);
    let emb = kb.param("emb", DType::F32, &[v, h], READ);
    let ids = kb.param("ids", DType::I32, &[t], READ);
    let out = kb.param("out", DType::F32, &[t, h], WRITE);
    let p = kb.pid(0);
    let id32 = kb.load(ids, vec![p.clone()], None);
    let id = kb.cast(id32, DType::I64);
    let rh = kb.range(i(0), h as u32);
    let row = kb.load(
        emb,
        vec![id, rh.clone()],
        if checked { None } else { Some(f(0.0)) },
    );
    kb.store(out, vec![p, rh], row);
    kb.finish()
}

#[test]
fn row_gather_with_a_checked_load() {
    let (v, h, t) = (10u64, 24u64, 6u64);
    let mut rng = Rng::new(2);
    let emb = rng.f32s((v * h) as usize, -1.0, 1.0);
    let k = gather_kernel(v, h, t, true);

    let ids = [3, 0, 9, 9, 1, 5];
    let mut bufs = vec![
        f32_bytes(&emb),
        i32_bytes(&ids),
        vec![0; (t * h * 4) as usize],
    ];
    run_kernel(&k, &mut bufs).unwrap();
    let out = f32s(&bufs[2]);
    for (r, &id) in ids.iter().enumerate() {
        let h = h as usize;
        assert_eq!(
            &out[r * h..(r + 1) * h],
            &emb[id as usize * h..(id as usize + 1) * h]
        );
    }

    // A token id >= vocabulary size is an error of the dispatch, never a wild read.
    let ids = [3, 0, 10, 9, 1, 5];
    let mut bufs = vec![
        f32_bytes(&emb),
        i32_bytes(&ids),
        vec![0; (t * h * 4) as usize],
    ];
    let err = run_kernel(&k, &mut bufs).unwrap_err();
    assert_eq!(
        err,
        Error::IndexOutOfRange {
            kernel: "gather_rows".into(),
            param: "emb".into(),
            index: 10,
            dim: 0,
            extent: 10,
            program_id: [2, 0, 0]
        }
    );
    assert!(err.to_string().contains("index 10"), "{err}");

    let ids = [3, -1, 1, 1, 1, 1];
    let mut bufs = vec![
        f32_bytes(&emb),
        i32_bytes(&ids),
        vec![0; (t * h * 4) as usize],
    ];
    let err = run_kernel(&k, &mut bufs).unwrap_err();
    assert!(
        matches!(
            err,
            Error::IndexOutOfRange {
                index: -1,
                program_id: [1, 0, 0],
                ..
            }
        ),
        "{err:?}"
    );

    // The masked variant reads the fill instead.
    let k = gather_kernel(v, h, t, false);
    let ids = [3, 0, 10, 9, 1, 5];
    let mut bufs = vec![
        f32_bytes(&emb),
        i32_bytes(&ids),
        vec![0xab; (t * h * 4) as usize],
    ];
    run_kernel(&k, &mut bufs).unwrap();
    let out = f32s(&bufs[2]);
    assert!(
        out[2 * h as usize..3 * h as usize]
            .iter()
            .all(|&x| x == 0.0)
    );
}

fn gemm_f64(a: &[f32], b: &[f32], m: usize, n: usize, k: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for r in 0..m {
        for col in 0..n {
            c[r * n + col] = (0..k)
                .map(|x| a[r * k + x] as f64 * b[x * n + col] as f64)
                .sum();
        }
    }
    c
}

#[test]
fn tiled_gemm_with_for_loop_and_dot() {
    let (m, n, k) = (37usize, 29usize, 45usize);
    let (bm, bn, bk) = (16u32, 16u32, 8u32);
    let mut rng = Rng::new(3);
    let a = rng.f32s(m * k, -1.0, 1.0);
    let b = rng.f32s(k * n, -1.0, 1.0);
    let kern = gemm_kernel(m as u64, n as u64, k as u64, bm, bn, bk, false);
    let mut bufs = vec![f32_bytes(&a), f32_bytes(&b), vec![POISON_BYTE; m * n * 4]];
    run_kernel(&kern, &mut bufs).unwrap();
    let c = f32s(&bufs[2]);
    let want = gemm_f64(&a, &b, m, n, k);
    for x in 0..m * n {
        let scale: f64 = (0..k)
            .map(|kk| (a[x / n * k + kk] as f64 * b[kk * n + x % n] as f64).abs())
            .sum();
        assert!(
            (c[x] as f64 - want[x]).abs() <= 1e-5 * scale.max(1e-30),
            "c[{x}] = {} vs {}",
            c[x],
            want[x]
        );
    }

    // The rounding model exactly: each `dot` adds its k-block in f64 to the f32 accumulator and rounds once.
    for r in 0..m {
        for col in 0..n {
            let mut acc = 0f32;
            for k0 in (0..k).step_by(bk as usize) {
                let blk: f64 = (k0..(k0 + bk as usize).min(k))
                    .map(|x| a[r * k + x] as f64 * b[x * n + col] as f64)
                    .sum();
                acc = (acc as f64 + blk) as f32;
            }
            assert_eq!(c[r * n + col].to_bits(), acc.to_bits(), "c[{r}][{col}]");
        }
    }
}

#[test]
fn softmax_over_rows() {
    let (r, c) = (13u64, 50u64);
    let bc = 64u32;
    let mut rng = Rng::new(4);
    let x = rng.f32s((r * c) as usize, -6.0, 6.0);
    let mut kb = KB::new("softmax", [r, 1, 1]);
    let px = kb.param("x", DType::F32, &[r, c], READ);
    let py = kb.param("y", DType::F32, &[r, c], WRITE);
    let row = kb.pid(0);
    let rc = kb.range(i(0), bc);
    let xv = kb.load(
        px,
        vec![row.clone(), rc.clone()],
        Some(f(f64::NEG_INFINITY)),
    );
    let mx = kb.reduce(ReduceOp::Max, xv.clone(), 0);
    let mb = kb.broadcast(mx, &[bc]);
    let d = kb.sub(xv, mb);
    let e = kb.un(UnOp::Exp, d);
    let s = kb.reduce(ReduceOp::Sum, e.clone(), 0);
    let sb = kb.broadcast(s, &[bc]);
    let y = kb.div(e, sb);
    kb.store(py, vec![row, rc], y);
    let k = kb.finish();
    let mut bufs = vec![f32_bytes(&x), vec![POISON_BYTE; (r * c * 4) as usize]];
    run_kernel(&k, &mut bufs).unwrap();
    let y = f32s(&bufs[1]);
    let c = c as usize;
    for row in 0..r as usize {
        let xs = &x[row * c..(row + 1) * c];
        let m = xs.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
        let s: f64 = xs.iter().map(|&v| (v as f64 - m).exp()).sum();
        for j in 0..c {
            let want = (xs[j] as f64 - m).exp() / s;
            assert!(
                rel_close(y[row * c + j] as f64, want, 1e-6, 1e-9),
                "y[{row}][{j}] {} vs {want}",
                y[row * c + j]
            );
        }
    }
}

#[test]
fn layernorm() {
    let (r, c) = (7u64, 40u64);
    let bc = 64u32;
    let eps = 1e-5;
    let mut rng = Rng::new(5);
    let x = rng.f32s((r * c) as usize, -3.0, 5.0);
    let gamma = rng.f32s(c as usize, 0.5, 1.5);
    let beta = rng.f32s(c as usize, -0.5, 0.5);
    let mut kb = KB::new("layernorm", [r, 1, 1]);
    let px = kb.param("x", DType::F32, &[r, c], READ);
    let pg = kb.param("gamma", DType::F32, &[c], READ);
    let pb = kb.param("beta", DType::F32, &[c], READ);
    let py = kb.param("y", DType::F32, &[r, c], WRITE);
    let row = kb.pid(0);
    let rc = kb.range(i(0), bc);
    let xv = kb.load(px, vec![row.clone(), rc.clone()], Some(f(0.0)));
    let s = kb.reduce(ReduceOp::Sum, xv.clone(), 0);
    let mean = kb.div(s, f(c as f64));
    let mb = kb.broadcast(mean, &[bc]);
    let d = kb.sub(xv, mb);
    let mask = kb.cmp(CmpOp::Lt, rc.clone(), i(c as i64));
    let d = kb.select(mask, d, f(0.0));
    let sq = kb.mul(d.clone(), d.clone());
    let ss = kb.reduce(ReduceOp::Sum, sq, 0);
    let var = kb.div(ss, f(c as f64));
    let ve = kb.add(var, f(eps));
    let rstd = kb.un(UnOp::Rsqrt, ve);
    let rb = kb.broadcast(rstd, &[bc]);
    let g = kb.load(pg, vec![rc.clone()], Some(f(0.0)));
    let b = kb.load(pb, vec![rc.clone()], Some(f(0.0)));
    let n = kb.mul(d, rb);
    let ng = kb.mul(n, g);
    let y = kb.add(ng, b);
    kb.store(py, vec![row, rc], y);
    let k = kb.finish();
    let mut bufs = vec![
        f32_bytes(&x),
        f32_bytes(&gamma),
        f32_bytes(&beta),
        vec![POISON_BYTE; (r * c * 4) as usize],
    ];
    run_kernel(&k, &mut bufs).unwrap();
    let y = f32s(&bufs[3]);
    let c = c as usize;
    for row in 0..r as usize {
        let xs: Vec<f64> = x[row * c..(row + 1) * c]
            .iter()
            .map(|&v| v as f64)
            .collect();
        let mean = xs.iter().sum::<f64>() / c as f64;
        let var = xs.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / c as f64;
        for j in 0..c {
            let want = (xs[j] - mean) / (var + eps as f32 as f64).sqrt() * gamma[j] as f64
                + beta[j] as f64;
            assert!(
                rel_close(y[row * c + j] as f64, want, 1e-5, 1e-6),
                "y[{row}][{j}] {} vs {want}",
                y[row * c + j]
            );
        }
    }
}

#[test]
fn unary_float_ops_round_the_f64_function_once() {
    let mut rng = Rng::new(6);
    let x = rng.f32s(64, 0.05, 4.0);
    type F = fn(f64) -> f64;
    let cases: &[(UnOp, F)] = &[
        (UnOp::Exp, f64::exp),
        (UnOp::Log, f64::ln),
        (UnOp::Tanh, f64::tanh),
        (UnOp::Erf, loom_reference::float::erf),
        (UnOp::Sqrt, f64::sqrt),
        (UnOp::Rsqrt, |x| 1.0 / x.sqrt()),
        (UnOp::Sigmoid, |x| 1.0 / (1.0 + (-x).exp())),
        (UnOp::Neg, |x| -x),
        (UnOp::Abs, f64::abs),
    ];
    for &(op, reference) in cases {
        let out = run_tile_fn(
            DType::F32,
            &[64],
            f32_bytes(&x),
            DType::F32,
            &[64],
            |kb, t| {
                let t = kb.sub(t, f(1.0)); // include negative inputs for the odd functions
                let t = if matches!(op, UnOp::Log | UnOp::Sqrt | UnOp::Rsqrt) {
                    kb.un(UnOp::Abs, t)
                } else {
                    t
                };
                kb.un(op, t)
            },
        )
        .unwrap();
        for (j, got) in f32s(&out).into_iter().enumerate() {
            let mut arg = (x[j] - 1.0) as f64;
            if matches!(op, UnOp::Log | UnOp::Sqrt | UnOp::Rsqrt) {
                arg = arg.abs();
            }
            assert_eq!(
                got.to_bits(),
                (reference(arg) as f32).to_bits(),
                "{op:?}({arg})"
            );
        }
    }
    // `not` is integer-only; on floats it is malformed.
    assert!(matches!(
        run_tile_fn(
            DType::F32,
            &[4],
            f32_bytes(&[0.0; 4]),
            DType::F32,
            &[4],
            |kb, t| kb.un(UnOp::Not, t)
        ),
        Err(Error::Malformed { .. })
    ));
}

#[test]
fn integer_ops_wrap_and_division_by_zero_is_an_error() {
    let a: [i32; 6] = [i32::MAX, -7, 7, i32::MIN, 5, -1];
    let b: [i32; 6] = [1, 2, -2, -1, 33, 31];
    let run = |op: BinOp| {
        let mut kb = KB::new("binary", [1, 1, 1]);
        let pa = kb.param("a", DType::I32, &[6], READ);
        let pb = kb.param("b", DType::I32, &[6], READ);
        let po = kb.param("o", DType::I32, &[6], WRITE);
        let r = kb.range(i(0), 6);
        let va = kb.load(pa, vec![r.clone()], None);
        let vb = kb.load(pb, vec![r.clone()], None);
        let o = kb.bin(op, va, vb);
        kb.store(po, vec![r], o);
        let k = kb.finish();
        let mut bufs = vec![i32_bytes(&a), i32_bytes(&b), vec![0; 24]];
        run_kernel(&k, &mut bufs).map(|()| {
            bufs[2]
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
                .collect::<Vec<_>>()
        })
    };
    let zip = |f: fn(i32, i32) -> i32| a.iter().zip(&b).map(|(&x, &y)| f(x, y)).collect::<Vec<_>>();
    assert_eq!(run(BinOp::Add).unwrap(), zip(i32::wrapping_add));
    assert_eq!(run(BinOp::Sub).unwrap(), zip(i32::wrapping_sub));
    assert_eq!(run(BinOp::Mul).unwrap(), zip(i32::wrapping_mul));
    assert_eq!(run(BinOp::Div).unwrap(), zip(i32::wrapping_div));
    assert_eq!(run(BinOp::Rem).unwrap(), zip(i32::wrapping_rem));
    assert_eq!(
        run(BinOp::Shl).unwrap(),
        zip(|x, y| x.wrapping_shl(y as u32))
    );
    assert_eq!(
        run(BinOp::Shr).unwrap(),
        zip(|x, y| x.wrapping_shr(y as u32))
    );
    assert_eq!(run(BinOp::Min).unwrap(), zip(std::cmp::min));
    assert_eq!(run(BinOp::Xor).unwrap(), zip(|x, y| x ^ y));

    let err = run_tile_fn(
        DType::I32,
        &[3],
        i32_bytes(&[1, 2, 3]),
        DType::I32,
        &[3],
        |kb, t| {
            let z = kb.sub(t.clone(), t.clone());
            kb.bin(BinOp::Div, t, z)
        },
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            Error::DivisionByZero {
                program_id: [0, 0, 0],
                ..
            }
        ),
        "{err:?}"
    );

    // u32 wraps modulo 2^32 and shifts right logically.
    let out = run_tile_fn(
        DType::U32,
        &[2],
        i32_bytes(&[-1, 5]),
        DType::U32,
        &[2],
        |kb, t| {
            let s = kb.add(t, imm_i(1, DType::U32));
            kb.bin(BinOp::Shr, s, imm_i(1, DType::U32))
        },
    )
    .unwrap();
    assert_eq!(out, i32_bytes(&[0, 3]));
}

#[test]
fn casts_truncate_saturate_and_round_once() {
    let x = [1.7f32, -1.7, 3e9, -3e9, f32::NAN, 0.0];
    let i32s = |b: Vec<u8>| {
        b.chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
            .collect::<Vec<_>>()
    };
    let out = run_tile_fn(
        DType::F32,
        &[6],
        f32_bytes(&x),
        DType::I32,
        &[6],
        |kb, t| kb.cast(t, DType::I32),
    );
    assert_eq!(i32s(out.unwrap()), vec![1, -1, i32::MAX, i32::MIN, 0, 0]);
    let out = run_tile_fn(DType::F32, &[6], f32_bytes(&x), DType::U8, &[6], |kb, t| {
        kb.cast(t, DType::U8)
    });
    assert_eq!(out.unwrap(), vec![1, 0, 255, 0, 0, 0]);
    let out = run_tile_fn(DType::F32, &[6], f32_bytes(&x), DType::I1, &[6], |kb, t| {
        kb.cast(t, DType::I1)
    });
    assert_eq!(out.unwrap(), vec![1, 1, 1, 1, 1, 0]);

    // f32 -> f16 -> f32: ties to even, overflow to infinity, and the value stays an f16 value.
    let tie = 1.0 + 2f32.powi(-11); // halfway between 1 and 1 + 2^-10
    let above = 1.0 + 3.0 * 2f32.powi(-11); // halfway between 1 + 2^-10 and 1 + 2^-9: to even (1 + 2^-9)
    let y = [tie, above, 65519.0, 65520.0, 1e-8, 0.1];
    for (dt, want) in [
        // 1e-8 is below half the smallest f16 subnormal (2^-25); 0.1 rounds to 0x2e66 = 1638 * 2^-14.
        (
            DType::F16,
            [
                1.0,
                1.0 + 2f32.powi(-9),
                65504.0,
                f32::INFINITY,
                0.0,
                1638.0 / 16384.0,
            ],
        ),
        // 1e-8 = 0x322bcc77 and 0.1 = 0x3dcccccd as f32: the low halves are above the tie, so round up.
        (
            DType::BF16,
            [
                1.0,
                1.0,
                65536.0,
                65536.0,
                f32::from_bits(0x322c_0000),
                f32::from_bits(0x3dcd_0000),
            ],
        ),
    ] {
        let out = run_tile_fn(
            DType::F32,
            &[6],
            f32_bytes(&y),
            DType::F32,
            &[6],
            |kb, t| {
                let h = kb.cast(t, dt);
                kb.cast(h, DType::F32)
            },
        )
        .unwrap();
        assert_eq!(f32s(&out), want, "{dt}");
    }

    // i64 -> i32 wraps; i32 -> i1 is `!= 0`; i32 -> f32 rounds to nearest.
    let out = run_tile_fn(
        DType::I64,
        &[3],
        i64_bytes(&[(1 << 32) + 5, -1, 16777217]),
        DType::I32,
        &[3],
        |kb, t| kb.cast(t, DType::I32),
    );
    assert_eq!(i32s(out.unwrap()), vec![5, -1, 16777217]);
    let out = run_tile_fn(
        DType::I32,
        &[3],
        i32_bytes(&[2, 0, 16777217]),
        DType::F32,
        &[3],
        |kb, t| kb.cast(t, DType::F32),
    );
    assert_eq!(f32s(&out.unwrap()), vec![2.0, 0.0, 16777216.0]);
    let out = run_tile_fn(
        DType::I32,
        &[3],
        i32_bytes(&[2, 0, -4]),
        DType::I1,
        &[3],
        |kb, t| kb.cast(t, DType::I1),
    );
    assert_eq!(out.unwrap(), vec![1, 0, 1]);
}

#[test]
fn shape_ops_and_reductions() {
    let x: Vec<f32> = (0..12).map(|v| v as f32).collect(); // [3, 4]
    let bytes = f32_bytes(&x);
    // transpose: [4, 3]
    let out = run_tile_fn(
        DType::F32,
        &[3, 4],
        bytes.clone(),
        DType::F32,
        &[4, 3],
        |kb, t| kb.transpose(t),
    )
    .unwrap();
    let want: Vec<f32> = (0..4)
        .flat_map(|c| (0..3).map(move |r| (r * 4 + c) as f32))
        .collect();
    assert_eq!(f32s(&out), want);
    // reshape [3, 4] -> [2, 6] keeps row-major order.
    let out = run_tile_fn(
        DType::F32,
        &[3, 4],
        bytes.clone(),
        DType::F32,
        &[2, 6],
        |kb, t| kb.reshape(t, &[2, 6]),
    );
    assert_eq!(f32s(&out.unwrap()), x);
    // broadcast [3, 4] -> expand to [3, 1, 4] -> [3, 2, 4].
    let out = run_tile_fn(
        DType::F32,
        &[3, 4],
        bytes.clone(),
        DType::F32,
        &[3, 2, 4],
        |kb, t| {
            let e = kb.expand_dims(t, 1);
            kb.broadcast(e, &[3, 2, 4])
        },
    );
    let want: Vec<f32> = (0..3)
        .flat_map(|r| (0..2).flat_map(move |_| (0..4).map(move |c| (r * 4 + c) as f32)))
        .collect();
    assert_eq!(f32s(&out.unwrap()), want);
    // numpy broadcasting of a rank-1 tile adds leading dims.
    let out = run_tile_fn(
        DType::F32,
        &[4],
        f32_bytes(&[1.0, 2.0, 3.0, 4.0]),
        DType::F32,
        &[2, 4],
        |kb, t| kb.broadcast(t, &[2, 4]),
    );
    assert_eq!(
        f32s(&out.unwrap()),
        vec![1.0, 2.0, 3.0, 4.0, 1.0, 2.0, 3.0, 4.0]
    );

    // reductions along each axis
    for (op, axis, want) in [
        (ReduceOp::Sum, 0u8, vec![12.0, 15.0, 18.0, 21.0]),
        (ReduceOp::Max, 0, vec![8.0, 9.0, 10.0, 11.0]),
        (ReduceOp::Min, 0, vec![0.0, 1.0, 2.0, 3.0]),
    ] {
        let out = run_tile_fn(
            DType::F32,
            &[3, 4],
            bytes.clone(),
            DType::F32,
            &[4],
            |kb, t| kb.reduce(op, t, axis),
        );
        assert_eq!(f32s(&out.unwrap()), want, "{op:?}");
    }
    let out = run_tile_fn(
        DType::F32,
        &[3, 4],
        bytes.clone(),
        DType::F32,
        &[3],
        |kb, t| kb.reduce(ReduceOp::Sum, t, 1),
    );
    assert_eq!(f32s(&out.unwrap()), vec![6.0, 22.0, 38.0]);
    // integer sums wrap at the dtype's width
    let out = run_tile_fn(
        DType::I32,
        &[2],
        i32_bytes(&[i32::MAX, 2]),
        DType::I32,
        &[1],
        |kb, t| kb.reduce(ReduceOp::Sum, t, 0),
    );
    assert_eq!(out.unwrap(), i32_bytes(&[i32::MIN + 1]));
    // f32 sums accumulate in f64 and round once: 2^24 + 1 + 1 is exact, not 2^24.
    let out = run_tile_fn(
        DType::F32,
        &[3],
        f32_bytes(&[16777216.0, 1.0, 1.0]),
        DType::F32,
        &[1],
        |kb, t| kb.reduce(ReduceOp::Sum, t, 0),
    );
    assert_eq!(f32s(&out.unwrap()), vec![16777218.0]);
}

#[test]
fn for_and_if_regions() {
    // out[p] = (p even ? sum_{i<p} i : -1), via a loop carrying an i64 and an if with a result.
    let n = 7u64;
    let mut kb = KB::new("regions", [n, 1, 1]);
    let out = kb.param("out", DType::I64, &[n], WRITE);
    let p = kb.pid(0);
    let s = kb.for_(i(0), p.clone(), i(1), vec![i(0)], |kb, iv, it| {
        vec![kb.add(it[0].clone(), iv)]
    });
    let two = kb.bin(BinOp::Rem, p.clone(), i(2));
    let even = kb.cmp(CmpOp::Eq, two, i(0));
    let r = kb.if_(
        even,
        vec![scalar(DType::I64)],
        |_| vec![s[0].clone()],
        |_| vec![i(-1)],
    );
    kb.store(out, vec![p], r[0].clone());
    let k = kb.finish();
    let mut bufs = vec![vec![0; 8 * n as usize]];
    run_kernel(&k, &mut bufs).unwrap();
    assert_eq!(i64s(&bufs[0]), vec![0, -1, 1, -1, 6, -1, 15]);
}

#[test]
fn zero_trip_loops_and_strided_loops() {
    let mut kb = KB::new("loops", [1, 1, 1]);
    let out = kb.param("out", DType::I64, &[2], WRITE);
    let a = kb.for_(i(5), i(5), i(1), vec![i(42)], |kb, iv, it| {
        vec![kb.add(it[0].clone(), iv)]
    });
    let b = kb.for_(i(0), i(10), i(3), vec![i(0)], |kb, iv, it| {
        vec![kb.add(it[0].clone(), iv)]
    });
    let z = kb.range(i(0), 2);
    let first = kb.cmp(CmpOp::Eq, z.clone(), i(0));
    let both = kb.select(first, a[0].clone(), b[0].clone());
    kb.store(out, vec![z], both);
    let k = kb.finish();
    let mut bufs = vec![vec![0; 16]];
    run_kernel(&k, &mut bufs).unwrap();
    assert_eq!(i64s(&bufs[0]), vec![42, 18]);
}

/// The realistic size from the brief: a 128x384x1536 GEMM stage with small (16x16x8) tiles, i.e. ~37k `dot`
/// ops. The time bound applies to optimised builds (`cargo test --release`: ~0.15 s); unoptimised it takes
/// a few seconds.
#[test]
fn large_gemm_runs_fast_enough() {
    let (m, n, k) = (128usize, 384usize, 1536usize);
    let mut rng = Rng::new(7);
    let a = rng.f32s(m * k, -1.0, 1.0);
    let b = rng.f32s(k * n, -1.0, 1.0);
    let kern = gemm_kernel(m as u64, n as u64, k as u64, 16, 16, 8, false);
    let st = stage(
        "gemm_stage",
        vec![
            buf("a", DType::F32, &[m as u64, k as u64]),
            buf("b", DType::F32, &[k as u64, n as u64]),
        ],
        vec![buf("c", DType::F32, &[m as u64, n as u64])],
        vec![],
        vec![kern],
        vec![(
            0,
            vec![
                loom_ir::kernel::BufRef::Input(0),
                loom_ir::kernel::BufRef::Input(1),
                loom_ir::kernel::BufRef::Output(0),
            ],
        )],
    );
    let (ab, bb) = (f32_bytes(&a), f32_bytes(&b));
    let mut outs = loom_reference::alloc_outputs(&st).unwrap();
    let t = std::time::Instant::now();
    loom_reference::run_stage(&st, &[&ab, &bb], &[], &mut outs).unwrap();
    let secs = t.elapsed().as_secs_f64();
    eprintln!("128x384x1536 GEMM stage: {secs:.3} s");
    if !cfg!(debug_assertions) {
        assert!(secs < 2.0, "took {secs} s");
    }
    let c = f32s(&outs[0]);
    let mut rng = Rng::new(8);
    for _ in 0..200 {
        let (r, col) = (rng.below(m as u64) as usize, rng.below(n as u64) as usize);
        let want: f64 = (0..k)
            .map(|x| a[r * k + x] as f64 * b[x * n + col] as f64)
            .sum();
        assert!((c[r * n + col] as f64 - want).abs() < 1e-4, "c[{r}][{col}]");
    }
}
