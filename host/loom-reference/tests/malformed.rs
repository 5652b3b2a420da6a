//! Malformed IR is an error, never a panic: hand-written defects, then random mutations of valid kernels.

mod common;

use std::panic::{AssertUnwindSafe, catch_unwind};

use common::*;
use loom_ir::Loc;
use loom_ir::kernel::{
    BinOp, CmpOp, DType, KImm, KOp, KOpKind, KOperand, KRegion, KType, KValue, Kernel, ReduceOp,
    UnOp,
};
use loom_reference::{Error, POISON_BYTE, run_kernel};

/// One-program kernel over `x: f32[16]` (read) and `y: f32[16]` (write), with `body` in between.
fn with_body(body: impl FnOnce(&mut KB, u32, u32)) -> Kernel {
    let mut kb = KB::new("bad", [1, 1, 1]);
    let x = kb.param("x", DType::F32, &[16], READ);
    let y = kb.param("y", DType::F32, &[16], WRITE);
    body(&mut kb, x, y);
    kb.finish()
}

fn bufs_for(k: &Kernel) -> Vec<Vec<u8>> {
    k.params
        .iter()
        .map(|p| vec![0u8; p.dtype.bytes_for(&p.shape).unwrap() as usize])
        .collect()
}

#[track_caller]
fn expect_malformed(k: &Kernel, needle: &str) {
    match run_kernel(k, &mut bufs_for(k)) {
        Err(Error::Malformed { at, message }) => {
            assert!(
                message.contains(needle),
                "`{message}` should mention `{needle}`"
            );
            assert!(at.starts_with("kernel `bad`"), "{at}");
        }
        other => panic!("expected a malformed-IR error mentioning `{needle}`, got {other:?}"),
    }
}

#[test]
fn operand_and_value_defects() {
    // A value used before it is defined.
    expect_malformed(
        &with_body(|kb, _, y| {
            let later = kb.value(tile(&[16], DType::F32));
            let r = kb.range(i(0), 16);
            kb.store(y, vec![r], v(later));
        }),
        "before it is defined",
    );
    // A value that does not exist.
    expect_malformed(
        &with_body(|kb, _, y| {
            let r = kb.range(i(0), 16);
            kb.store(y, vec![r], v(KValue(999)));
        }),
        "does not exist",
    );
    // Mixed dtypes in arithmetic.
    expect_malformed(
        &with_body(|kb, x, _| {
            let r = kb.range(i(0), 16);
            let t = kb.load(x, vec![r], None);
            kb.add(t, i(1));
        }),
        "differ",
    );
    // Tiles of different shapes.
    expect_malformed(
        &with_body(|kb, _, _| {
            let a = kb.range(i(0), 16);
            let b = kb.range(i(0), 8);
            kb.add(a, b);
        }),
        "one shape",
    );
    // The declared result type disagrees with what the op computes.
    expect_malformed(
        &with_body(|kb, _, _| {
            kb.push(
                KOpKind::Range {
                    start: i(0),
                    len: 4,
                },
                tile(&[8], DType::I64),
            );
        }),
        "is declared tile<[8], i64>",
    );
    // Immediates must be values of their tagged type.
    expect_malformed(
        &with_body(|kb, _, _| {
            let _ = kb.add(imm_f(0.5, DType::I32), imm_i(1, DType::I32));
        }),
        "immediate",
    );
    expect_malformed(
        &with_body(|kb, _, _| {
            let _ = kb.add(imm_i(300, DType::U8), imm_i(1, DType::U8));
        }),
        "immediate",
    );
    // An op with the wrong number of results.
    expect_malformed(
        &with_body(|kb, _, _| kb.emit(KOpKind::ProgramId { axis: 0 }, vec![])),
        "0 results",
    );
    expect_malformed(
        &with_body(|kb, _, _| {
            let _ = kb.pid(3);
        }),
        "axis 3",
    );
    expect_malformed(
        &with_body(|kb, _, _| {
            let _ = kb.un(UnOp::Exp, i(1));
        }),
        "not defined on i64",
    );
    expect_malformed(
        &with_body(|kb, _, _| {
            let _ = kb.bin(BinOp::Shl, f(1.0), f(1.0));
        }),
        "not defined on f32",
    );
    expect_malformed(
        &with_body(|kb, _, _| {
            let _ = kb.cast(f(1.0), DType::Q4_0);
        }),
        "quantised",
    );
    expect_malformed(
        &with_body(|kb, _, _| {
            let _ = kb.select(i(1), f(1.0), f(2.0));
        }),
        "condition must be i1",
    );
}

#[test]
fn memory_access_defects() {
    expect_malformed(
        &with_body(|kb, x, _| {
            let r = kb.range(i(0), 16);
            kb.load(x, vec![r, i(0)], None);
        }),
        "1 dimensions but 2 indices",
    );
    expect_malformed(
        &with_body(|kb, x, _| {
            let _ = kb.load(x, vec![f(0.0)], None);
        }),
        "must be an i64 scalar or 1-D",
    );
    expect_malformed(
        &with_body(|kb, x, _| {
            let _ = kb.load(x, vec![imm_i(0, DType::I32)], None);
        }),
        "must be an i64 scalar or 1-D",
    );
    expect_malformed(
        &with_body(|kb, x, _| {
            let r = kb.range(i(0), 4);
            let e = kb.expand_dims(r, 0);
            let b = kb.broadcast(e, &[2, 4]);
            kb.load(x, vec![b], None);
        }),
        "must be an i64 scalar or 1-D",
    );
    expect_malformed(
        &with_body(|kb, x, _| {
            let r = kb.range(i(0), 16);
            kb.load(x, vec![r], Some(imm_f(0.0, DType::F64)));
        }),
        "fill must be a f32 scalar",
    );
    expect_malformed(
        &with_body(|kb, x, _| {
            let r = kb.range(i(0), 16);
            let t = kb.load(x, vec![r.clone()], None);
            kb.store(x, vec![r], t);
        }),
        "read-only parameter",
    );
    expect_malformed(
        &with_body(|kb, _, y| {
            let _ = kb.load(y, vec![i(0)], None);
        }),
        "write-only",
    );
    expect_malformed(
        &with_body(|kb, _, _| {
            kb.push(
                KOpKind::Load {
                    param: 9,
                    indices: vec![i(0)],
                    fill: None,
                },
                KType::Scalar(DType::F32),
            );
        }),
        "parameter #9",
    );
    expect_malformed(
        &with_body(|kb, _, y| {
            let r = kb.range(i(0), 8);
            let t = kb.full(f(1.0), &[16], DType::F32);
            kb.store(y, vec![r], t);
        }),
        "needs a tile<[8], f32> value",
    );
}

#[test]
fn shape_op_defects() {
    let t16 = |kb: &mut KB| kb.full(f(1.0), &[4, 4], DType::F32);
    expect_malformed(
        &with_body(|kb, _, _| {
            let t = t16(kb);
            kb.broadcast(t, &[3, 4]);
        }),
        "cannot broadcast",
    );
    expect_malformed(
        &with_body(|kb, _, _| {
            let t = t16(kb);
            kb.broadcast(t, &[16]);
        }),
        "lower rank",
    );
    expect_malformed(
        &with_body(|kb, _, _| {
            let t = t16(kb);
            kb.reshape(t, &[5, 3]);
        }),
        "cannot reshape",
    );
    expect_malformed(
        &with_body(|kb, _, _| {
            let t = t16(kb);
            kb.push(
                KOpKind::ExpandDims { a: t, axis: 3 },
                tile(&[4, 4, 1], DType::F32),
            );
        }),
        "expand_dims axis 3",
    );
    expect_malformed(
        &with_body(|kb, _, _| {
            let r = kb.range(i(0), 4);
            kb.push(KOpKind::Transpose { a: r }, tile(&[4], DType::I64));
        }),
        "2-D",
    );
    expect_malformed(
        &with_body(|kb, _, _| {
            let t = t16(kb);
            kb.push(
                KOpKind::Reduce {
                    op: ReduceOp::Sum,
                    a: t,
                    axis: 2,
                },
                tile(&[4], DType::F32),
            );
        }),
        "reduce axis 2",
    );
    expect_malformed(
        &with_body(|kb, _, _| {
            let a = kb.full(f(1.0), &[4, 3], DType::F32);
            let b = kb.full(f(1.0), &[4, 4], DType::F32);
            let c = kb.full(f(0.0), &[4, 4], DType::F32);
            kb.dot(a, b, c);
        }),
        "do not line up",
    );
    expect_malformed(
        &with_body(|kb, _, _| {
            let a = kb.full(f(1.0), &[4, 4], DType::F32);
            let c = kb.full(imm_f(0.0, DType::F16), &[4, 4], DType::F16);
            kb.dot(a.clone(), a, c);
        }),
        "accumulator must be f32",
    );
    expect_malformed(
        &with_body(|kb, _, _| {
            let _ = kb.full(i(1), &[4], DType::F32);
        }),
        "full value must be a f32",
    );
}

#[test]
fn region_defects() {
    expect_malformed(
        &with_body(|kb, _, _| {
            kb.for_(i(0), i(4), i(0), vec![], |_, _, _| vec![]);
        }),
        "step must be positive",
    );
    expect_malformed(
        &with_body(|kb, _, _| {
            kb.for_(imm_i(0, DType::I32), i(4), i(1), vec![], |_, _, _| vec![]);
        }),
        "lower bound must be an i64 scalar",
    );
    expect_malformed(
        &with_body(|kb, _, _| {
            kb.for_(i(0), i(4), i(1), vec![i(0)], |_, _, _| vec![]);
        }),
        "yields 0 values for 1",
    );
    expect_malformed(
        &with_body(|kb, _, _| {
            kb.if_(i(1), vec![], |_| vec![], |_| vec![]);
        }),
        "`if` condition must be an i1 scalar",
    );
    expect_malformed(
        &with_body(|kb, _, _| {
            let c = kb.cmp(CmpOp::Eq, i(0), i(0));
            kb.if_(
                c,
                vec![scalar(DType::I64)],
                |_| vec![f(1.0)],
                |_| vec![i(2)],
            );
        }),
        "is declared i64 but its operation produces f32",
    );
    // A yield in the middle of a region; a region that does not end in yield; an empty body.
    let mut k = with_body(|kb, _, _| kb.emit(KOpKind::Yield(vec![]), vec![]));
    expect_malformed(&k, "before the end");
    k.body.ops.clear();
    expect_malformed(&k, "empty region");
    k.body.ops.push(KOp {
        kind: KOpKind::ProgramId { axis: 0 },
        results: vec![KValue(0)],
        loc: Loc::default(),
    });
    k.values = vec![loom_ir::kernel::KValueDef {
        name: "p".into(),
        ty: KType::Scalar(DType::I64),
    }];
    expect_malformed(&k, "does not end in `yield`");
    let k = with_body(|kb, _, _| kb.emit(KOpKind::Yield(vec![]), vec![]));
    let mut k2 = k.clone();
    k2.body.ops.pop();
    k2.body.ops[0].kind = KOpKind::Yield(vec![i(1)]);
    expect_malformed(&k2, "empty `yield`");

    // Deep nesting is refused rather than overflowing the stack.
    fn nest(kb: &mut KB, depth: u32) -> Vec<KOperand> {
        if depth == 0 {
            return vec![];
        }
        let c = kb.cmp(CmpOp::Eq, i(0), i(0));
        kb.if_(c, vec![], |kb| nest(kb, depth - 1), |_| vec![]);
        vec![]
    }
    expect_malformed(
        &with_body(|kb, _, _| {
            let _ = nest(kb, 100);
        }),
        "nested deeper",
    );
}

#[test]
fn tiles_over_the_limit_are_refused_before_allocation() {
    let k = with_body(|kb, _, _| {
        let _ = kb.full(f(0.0), &[1024, 1024], DType::F32);
    });
    assert!(matches!(
        run_kernel(&k, &mut bufs_for(&k)),
        Err(Error::TileTooLarge {
            elements: 1048576,
            ..
        })
    ));
    let k = with_body(|kb, _, _| {
        let _ = kb.full(f(0.0), &[u32::MAX, u32::MAX, u32::MAX], DType::F32);
    });
    assert!(matches!(
        run_kernel(&k, &mut bufs_for(&k)),
        Err(Error::TileTooLarge { .. })
    ));
    let k = with_body(|kb, _, _| {
        let _ = kb.range(i(0), 1 << 17);
    });
    assert!(matches!(
        run_kernel(&k, &mut bufs_for(&k)),
        Err(Error::TileTooLarge { .. })
    ));
    // Three 64-long index tiles select 2^18 elements.
    let mut kb = KB::new("big_load", [1, 1, 1]);
    let x = kb.param("x", DType::F32, &[64, 64, 64], READ);
    let r = kb.range(i(0), 64);
    kb.load(x, vec![r.clone(), r.clone(), r], Some(f(0.0)));
    let k = kb.finish();
    let err = run_kernel(&k, &mut bufs_for(&k)).unwrap_err();
    assert!(
        matches!(
            err,
            Error::TileTooLarge {
                elements: 262144,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("65536"), "{err}");
}

// ---- random mutations ----

fn operands_mut(kind: &mut KOpKind) -> Vec<&mut KOperand> {
    use KOpKind as K;
    match kind {
        K::ProgramId { .. } => vec![],
        K::Binary { a, b, .. } | K::Cmp { a, b, .. } => vec![a, b],
        K::Unary { a, .. }
        | K::Cast { a, .. }
        | K::Broadcast { a, .. }
        | K::ExpandDims { a, .. }
        | K::Reshape { a, .. }
        | K::Transpose { a }
        | K::Reduce { a, .. } => vec![a],
        K::Select { cond, a, b } => vec![cond, a, b],
        K::Range { start, .. } => vec![start],
        K::Full { value, .. } => vec![value],
        K::Dot { a, b, acc } => vec![a, b, acc],
        K::Load { indices, fill, .. } => indices.iter_mut().chain(fill.iter_mut()).collect(),
        K::Store { indices, value, .. } => {
            indices.iter_mut().chain(std::iter::once(value)).collect()
        }
        K::For {
            lo,
            hi,
            step,
            inits,
            ..
        } => [lo, hi, step].into_iter().chain(inits.iter_mut()).collect(),
        K::If { cond, .. } => vec![cond],
        K::Yield(vals) => vals.iter_mut().collect(),
    }
}

fn count_ops(r: &KRegion) -> usize {
    r.ops
        .iter()
        .map(|op| {
            1 + match &op.kind {
                KOpKind::For { body, .. } => count_ops(body),
                KOpKind::If {
                    then_region,
                    else_region,
                    ..
                } => count_ops(then_region) + count_ops(else_region),
                _ => 0,
            }
        })
        .sum()
}

fn nth_op<'a>(r: &'a mut KRegion, n: &mut usize) -> Option<&'a mut KOp> {
    for op in r.ops.iter_mut() {
        if *n == 0 {
            return Some(op);
        }
        *n -= 1;
        match &mut op.kind {
            KOpKind::For { body, .. } => {
                if let Some(o) = nth_op(body, n) {
                    return Some(o);
                }
            }
            KOpKind::If {
                then_region,
                else_region,
                ..
            } => {
                if let Some(o) = nth_op(then_region, n) {
                    return Some(o);
                }
                if let Some(o) = nth_op(else_region, n) {
                    return Some(o);
                }
            }
            _ => {}
        }
    }
    None
}

fn nth_region<'a>(r: &'a mut KRegion, n: &mut usize) -> Option<&'a mut KRegion> {
    if *n == 0 {
        return Some(r);
    }
    *n -= 1;
    for op in r.ops.iter_mut() {
        match &mut op.kind {
            KOpKind::For { body, .. } => {
                if let Some(x) = nth_region(body, n) {
                    return Some(x);
                }
            }
            KOpKind::If {
                then_region,
                else_region,
                ..
            } => {
                if let Some(x) = nth_region(then_region, n) {
                    return Some(x);
                }
                if let Some(x) = nth_region(else_region, n) {
                    return Some(x);
                }
            }
            _ => {}
        }
    }
    None
}

fn random_shape(rng: &mut Rng) -> Vec<u32> {
    let shapes: [&[u32]; 8] = [&[], &[1], &[4], &[8], &[8, 8], &[4, 8], &[3], &[2, 2, 2]];
    shapes[rng.below(shapes.len() as u64) as usize].to_vec()
}

fn random_dtype(rng: &mut Rng) -> DType {
    DType::ALL[rng.below(DType::ALL.len() as u64) as usize]
}

fn random_operand(rng: &mut Rng, n_values: usize) -> KOperand {
    match rng.below(4) {
        0 | 1 => KOperand::Value(KValue(rng.below(n_values as u64 + 2) as u32)),
        2 => KOperand::Imm(KImm::I64(rng.below(40) as i64 - 8), random_dtype(rng)),
        _ => KOperand::Imm(
            if rng.below(2) == 0 {
                KImm::F64(rng.uniform(-2.0, 2.0))
            } else {
                KImm::I1(true)
            },
            random_dtype(rng),
        ),
    }
}

fn mutate(k: &mut Kernel, rng: &mut Rng) {
    let n_values = k.values.len();
    let n_ops = count_ops(&k.body);
    match rng.below(7) {
        0 => {
            let vi = rng.below(n_values as u64) as usize;
            let shape = random_shape(rng);
            let dtype = random_dtype(rng);
            k.values[vi].ty = if shape.is_empty() {
                KType::Scalar(dtype)
            } else {
                KType::Tile { shape, dtype }
            };
        }
        1 | 2 => {
            let mut n = rng.below(n_ops as u64) as usize;
            if let Some(op) = nth_op(&mut k.body, &mut n) {
                let mut ops = operands_mut(&mut op.kind);
                if !ops.is_empty() {
                    let j = rng.below(ops.len() as u64) as usize;
                    *ops[j] = random_operand(rng, n_values);
                }
            }
        }
        3 => {
            // Delete or swap ops in some region.
            let mut n = rng.below(n_ops as u64 + 1) as usize;
            if let Some(r) = nth_region(&mut k.body, &mut n) {
                if !r.ops.is_empty() {
                    let a = rng.below(r.ops.len() as u64) as usize;
                    if rng.below(2) == 0 {
                        r.ops.remove(a);
                    } else {
                        let b = rng.below(r.ops.len() as u64) as usize;
                        r.ops.swap(a, b);
                    }
                }
            }
        }
        4 => {
            // Change an op's attributes.
            let mut n = rng.below(n_ops as u64) as usize;
            if let Some(op) = nth_op(&mut k.body, &mut n) {
                let small = rng.below(5);
                let shape = random_shape(rng);
                let dtype = random_dtype(rng);
                match &mut op.kind {
                    KOpKind::ProgramId { axis }
                    | KOpKind::ExpandDims { axis, .. }
                    | KOpKind::Reduce { axis, .. } => *axis = small as u8,
                    KOpKind::Range { len, .. } => *len = [0, 1, 3, 8, 70000][small as usize],
                    KOpKind::Full {
                        shape: s, dtype: d, ..
                    } => {
                        *s = shape;
                        *d = dtype;
                    }
                    KOpKind::Broadcast { shape: s, .. } | KOpKind::Reshape { shape: s, .. } => {
                        *s = shape
                    }
                    KOpKind::Cast { to, .. } => *to = dtype,
                    KOpKind::Load { param, fill, .. } => {
                        if small < 2 {
                            *param = small as u32 * 7;
                        } else {
                            *fill = if fill.is_some() { None } else { Some(f(0.0)) };
                        }
                    }
                    KOpKind::Store { param, .. } => *param = small as u32,
                    _ => {}
                }
            }
        }
        5 => {
            // Drop or add a result.
            let mut n = rng.below(n_ops as u64) as usize;
            if let Some(op) = nth_op(&mut k.body, &mut n) {
                if op.results.pop().is_none() {
                    op.results
                        .push(KValue(rng.below(n_values as u64 + 1) as u32));
                }
            }
        }
        _ => {
            let mut n = rng.below(n_ops as u64) as usize;
            if let Some(op) = nth_op(&mut k.body, &mut n) {
                if let Some(r) = op.results.first_mut() {
                    *r = KValue(rng.below(n_values as u64 + 1) as u32);
                }
            }
        }
    }
}

#[test]
fn random_mutations_of_valid_kernels_never_panic() {
    let mut quant = KB::new("q", [2, 1, 1]);
    let q = quant.param("q", DType::Q4K, &[2, 256], READ);
    let o = quant.param("o", DType::F32, &[2, 256], WRITE);
    let p = quant.pid(0);
    let c = quant.range(i(0), 256);
    let t = quant.load(q, vec![p.clone(), c.clone()], None);
    quant.store(o, vec![p, c], t);
    let seeds: Vec<Kernel> = vec![
        gemm_kernel(20, 18, 12, 8, 8, 4, true),
        gemm_kernel(9, 9, 9, 4, 4, 4, false),
        quant.finish(),
    ];
    let mut rng = Rng::new(99);
    let (mut ok, mut errors) = (0, 0);
    for round in 0..3000 {
        let mut k = seeds[round % seeds.len()].clone();
        for _ in 0..=rng.below(3) {
            mutate(&mut k, &mut rng);
        }
        let mut bufs = bufs_for(&k);
        for b in &mut bufs {
            b.iter_mut().enumerate().for_each(|(j, x)| {
                *x = if j % 7 == 0 {
                    POISON_BYTE
                } else {
                    (j * 31) as u8
                }
            });
        }
        let result = catch_unwind(AssertUnwindSafe(|| run_kernel(&k, &mut bufs)));
        match result {
            Ok(Ok(())) => ok += 1,
            Ok(Err(e)) => {
                errors += 1;
                assert!(!e.to_string().is_empty());
            }
            Err(_) => panic!("round {round}: the interpreter panicked on\n{k:#?}"),
        }
    }
    eprintln!("mutated kernels: {ok} ran, {errors} were refused");
    assert!(errors > 1000, "most mutations should be caught ({errors})");
}
