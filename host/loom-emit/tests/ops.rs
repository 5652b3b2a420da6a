//! Hand-built kernels (the shared `KB` builder) covering every op, dtype family and access kind: each must emit
//! WGSL that naga validates and CUDA C, or fail with the documented error. Malformed IR must be an error,
//! never a panic.

use loom_emit::{Error, WgslLimits, cuda_kernel, wgsl_kernel};
use loom_ir::kernel::{
    Access, BinOp, CmpOp, DType, KOpKind, KType, KValue, Kernel, ReduceOp, UnOp,
};
use loom_testkit::{KB, f, i, imm_f, imm_i, tile, v};

fn both(k: &Kernel) {
    if let Err(e) = wgsl_kernel(k, &WgslLimits::default()) {
        panic!("WGSL for `{}`: {e}", k.name);
    }
    if let Err(e) = cuda_kernel(k) {
        panic!("CUDA for `{}`: {e}", k.name);
    }
}

const INTS: &[DType] = &[
    DType::I64,
    DType::I32,
    DType::U32,
    DType::I16,
    DType::U16,
    DType::I8,
    DType::U8,
];
const FLOATS: &[DType] = &[DType::F32, DType::F16, DType::BF16];

fn one(d: DType) -> loom_ir::kernel::KOperand {
    if d.is_float() {
        imm_f(1.0, d)
    } else {
        imm_i(1, d)
    }
}

/// Elementwise math of one dtype over a [4, 16] tile loaded from and stored to a buffer of that dtype, plus
/// the same ops on scalars.
fn elementwise(d: DType) -> Kernel {
    let mut kb = KB::new(&format!("ew_{d}"), [3, 1, 1]);
    let x = kb.param("x", d, &[10, 16], Access::Read);
    let y = kb.param("y", d, &[10, 16], Access::Write);
    let pid = kb.pid(0);
    let r0 = kb.mul(pid, i(4));
    let rr = kb.range(r0.clone(), 4);
    let rc = kb.range(i(0), 16);
    let fill = if d.is_float() {
        imm_f(0.0, d)
    } else {
        imm_i(0, d)
    };
    let t = kb.load(x, vec![rr.clone(), rc.clone()], Some(fill));
    let mut acc = t.clone();
    let ops: Vec<BinOp> = if d.is_float() {
        vec![
            BinOp::Add,
            BinOp::Sub,
            BinOp::Mul,
            BinOp::Div,
            BinOp::Rem,
            BinOp::Min,
            BinOp::Max,
        ]
    } else {
        vec![
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
        ]
    };
    for op in ops {
        acc = kb.bin(op, acc, t.clone());
        acc = kb.bin(op, acc, one(d));
    }
    let uns: Vec<UnOp> = if d.is_float() {
        vec![
            UnOp::Neg,
            UnOp::Abs,
            UnOp::Exp,
            UnOp::Log,
            UnOp::Tanh,
            UnOp::Erf,
            UnOp::Sqrt,
            UnOp::Rsqrt,
            UnOp::Sigmoid,
        ]
    } else {
        vec![UnOp::Neg, UnOp::Abs, UnOp::Not]
    };
    for op in uns {
        acc = kb.un(op, acc);
    }
    let mut c = kb.cmp(CmpOp::Lt, acc.clone(), t.clone());
    for op in [CmpOp::Eq, CmpOp::Ne, CmpOp::Le, CmpOp::Gt, CmpOp::Ge] {
        let c2 = kb.cmp(op, acc.clone(), one(d));
        c = kb.bin(BinOp::Xor, c, c2);
    }
    let c = kb.bin(BinOp::And, c, imm_i(1, DType::I1));
    let c = kb.un(UnOp::Not, c);
    let sel = kb.select(c, acc, t);
    // Scalar versions of a few ops (uniform computation).
    let s = kb.cast(r0, d);
    let s = kb.add(s, one(d));
    let s = kb.bin(BinOp::Max, s, one(d));
    let out = kb.add(sel, s);
    kb.store(y, vec![rr, rc], out);
    kb.finish()
}

#[test]
fn elementwise_ops_of_every_dtype() {
    for &d in INTS.iter().chain(FLOATS) {
        both(&elementwise(d));
    }
}

#[test]
fn casts_between_every_pair_of_value_dtypes() {
    let all: Vec<DType> = INTS
        .iter()
        .chain(FLOATS)
        .copied()
        .chain([DType::I1])
        .collect();
    for &from in &all {
        let mut kb = KB::new(&format!("cast_{from}"), [1, 1, 1]);
        let x = kb.param("x", from, &[32], Access::Read);
        let outs: Vec<u32> = all
            .iter()
            .map(|&to| kb.param(&format!("y_{to}"), to, &[32], Access::Write))
            .collect();
        let r = kb.range(i(0), 32);
        let t = kb.load(x, vec![r.clone()], None);
        for (&to, &p) in all.iter().zip(&outs) {
            let c = kb.cast(t.clone(), to);
            kb.store(p, vec![r.clone()], c);
        }
        let k = kb.finish();
        // 12 buffers exceed the 8 storage bindings of the default limits: WGSL says so, CUDA does not care.
        match wgsl_kernel(&k, &WgslLimits::default()) {
            Err(Error::Unsupported(m)) => assert!(m.contains("storage buffers"), "{m}"),
            other => panic!("{other:?}"),
        }
        let lim = WgslLimits {
            max_storage_buffers_per_shader_stage: 16,
            ..WgslLimits::default()
        };
        wgsl_kernel(&k, &lim).unwrap_or_else(|e| panic!("cast from {from}: {e}"));
        cuda_kernel(&k).unwrap();
    }
}

#[test]
fn data_movement_reductions_and_dot() {
    let mut kb = KB::new("shapes", [2, 3, 1]);
    let a = kb.param("a", DType::F32, &[50, 40], Access::Read);
    let b = kb.param("b", DType::BF16, &[40, 30], Access::Read);
    let y = kb.param("y", DType::F32, &[50, 30], Access::ReadWrite);
    let s = kb.param("s", DType::F16, &[50], Access::Write);
    let p0 = kb.pid(0);
    let p1 = kb.pid(1);
    let m0 = kb.mul(p0, i(32));
    let n0 = kb.mul(p1, i(16));
    let rm = kb.range(m0, 32);
    let rn = kb.range(n0, 16);
    let z = kb.full(f(0.0), &[32, 16], DType::F32);
    let res = kb.for_(i(0), i(40), i(8), vec![z], |kb, k0, it| {
        let rk = kb.range(k0, 8);
        let at = kb.load(a, vec![rm.clone(), rk.clone()], Some(f(0.0)));
        let bt = kb.load(
            b,
            vec![rk.clone(), rn.clone()],
            Some(imm_f(0.0, DType::BF16)),
        );
        let at16 = kb.cast(at, DType::BF16);
        vec![kb.dot(at16, bt, it[0].clone())]
    });
    let acc = res[0].clone();
    // Broadcast a row vector, transpose twice, reshape and expand.
    let rowsum = kb.reduce(ReduceOp::Sum, acc.clone(), 1);
    let colmax = kb.reduce(ReduceOp::Max, acc.clone(), 0);
    let all_min = kb.reduce(ReduceOp::Min, rowsum.clone(), 0);
    let e = kb.expand_dims(colmax, 0);
    let bc = kb.broadcast(e, &[32, 16]);
    let t1 = kb.transpose(bc);
    let t2 = kb.transpose(t1);
    let r1 = kb.reshape(t2, &[16, 32]);
    let r2 = kb.reshape(r1, &[32, 16]);
    let m = kb.add(acc, r2);
    let mn = kb.broadcast(all_min, &[32, 16]);
    let m = kb.sub(m, mn);
    let old = kb.load(y, vec![rm.clone(), rn.clone()], Some(f(0.0)));
    let m = kb.add(m, old);
    kb.store(y, vec![rm.clone(), rn], m);
    let h = kb.cast(rowsum, DType::F16);
    kb.store(s, vec![rm], h);
    both(&kb.finish());
}

#[test]
fn integer_reductions_and_big_tiles_chunk_through_scratch() {
    // A [8, 4096] i32 tile: 32768 elements, reduced along both axes; the index tile is a computed (not range)
    // tile, so it is staged through scratch in chunks.
    let mut kb = KB::new("big", [1, 1, 1]);
    let x = kb.param("x", DType::I32, &[8, 4096], Access::Read);
    let y = kb.param("y", DType::I32, &[4096], Access::Write);
    let z = kb.param("z", DType::I64, &[8], Access::Write);
    let rr = kb.range(i(0), 8);
    let rc0 = kb.range(i(0), 4096);
    let rc = kb.mul(rc0, i(1));
    let t = kb.load(x, vec![rr.clone(), rc.clone()], None);
    let c = kb.reduce(ReduceOp::Max, t.clone(), 0);
    kb.store(y, vec![rc], c);
    let r = kb.reduce(ReduceOp::Sum, t, 1);
    let r = kb.cast(r, DType::I64);
    kb.store(z, vec![rr], r);
    let k = kb.finish();
    let m = wgsl_kernel(&k, &WgslLimits::default()).unwrap();
    assert_eq!(m.workgroup_size, 128);
    cuda_kernel(&k).unwrap();
}

#[test]
fn loads_and_stores_of_every_buffer_dtype() {
    let all: Vec<DType> = INTS
        .iter()
        .chain(FLOATS)
        .copied()
        .chain([DType::I1])
        .collect();
    for &d in &all {
        let mut kb = KB::new(&format!("ls_{d}"), [4, 1, 1]);
        let x = kb.param("x", d, &[7, 5], Access::Read);
        let y = kb.param("y", d, &[7, 5], Access::ReadWrite);
        let pid = kb.pid(0);
        let r = kb.range(i(-1), 8);
        let c = kb.range(i(0), 5);
        let fill = match d {
            DType::I1 => imm_i(0, d),
            d if d.is_float() => imm_f(-1.5, d),
            d => imm_i(3, d),
        };
        let t = kb.load(x, vec![r.clone(), c.clone()], Some(fill));
        kb.store(y, vec![r, c], t);
        // Scalar checked load and store.
        let s = kb.load(y, vec![pid.clone(), i(2)], None);
        kb.store(y, vec![pid, i(4)], s);
        both(&kb.finish());
    }
}

#[test]
fn quantised_loads_dequantise_and_k_quants_are_unsupported_in_cuda() {
    for d in [DType::Q8_0, DType::Q4_0, DType::Q4_1] {
        let mut kb = KB::new(&format!("q_{d}"), [2, 1, 1]);
        let w = kb.param("w", d, &[3, 64], Access::Read);
        let y = kb.param("y", DType::F32, &[3, 64], Access::Write);
        let pid = kb.pid(0);
        let c = kb.range(i(0), 64);
        let t = kb.load(w, vec![pid.clone(), c.clone()], None);
        kb.store(y, vec![pid, c], t);
        both(&kb.finish());
    }
    for d in [DType::Q4K, DType::Q6K] {
        let mut kb = KB::new(&format!("q_{d}"), [1, 1, 1]);
        let w = kb.param("w", d, &[1, 256], Access::Read);
        let y = kb.param("y", DType::F32, &[1, 256], Access::Write);
        let c = kb.range(i(0), 256);
        let t = kb.load(w, vec![i(0), c.clone()], None);
        kb.store(y, vec![i(0), c], t);
        let k = kb.finish();
        // Validated by naga inside wgsl_kernel; executed against the reference in hal_conformance.rs.
        let m = wgsl_kernel(&k, &WgslLimits::default())
            .unwrap_or_else(|e| panic!("WGSL for `{}`: {e}", k.name));
        assert!(m.source.contains("fn rd0("), "{}", m.source);
        assert!(matches!(cuda_kernel(&k), Err(Error::Unsupported(_))));
    }
}

#[test]
fn control_flow_if_and_nested_for() {
    let mut kb = KB::new("cf", [2, 1, 1]);
    let n = kb.param("n", DType::I32, &[2], Access::Read);
    let y = kb.param("y", DType::F32, &[2, 16], Access::Write);
    let pid = kb.pid(0);
    let cnt = kb.load(n, vec![pid.clone()], None);
    let cnt = kb.cast(cnt, DType::I64);
    let z = kb.full(f(0.0), &[16], DType::F32);
    let out = kb.for_(i(0), cnt.clone(), i(1), vec![z, f(1.0)], |kb, iv, it| {
        let inner = kb.for_(
            i(0),
            iv.clone(),
            i(2),
            vec![it[0].clone()],
            |kb, _j, it2| vec![kb.add(it2[0].clone(), f(1.0))],
        );
        let big = kb.cmp(CmpOp::Gt, iv, i(3));
        let r = kb.if_(
            big,
            vec![tile(&[16], DType::F32), KType::Scalar(DType::F32)],
            |kb| vec![kb.mul(inner[0].clone(), f(0.5)), it[1].clone()],
            |kb| vec![inner[0].clone(), kb.mul(it[1].clone(), f(2.0))],
        );
        // Swap-free, but the scalar iteration value feeds the tile.
        vec![kb.add(r[0].clone(), r[1].clone()), r[1].clone()]
    });
    let c = kb.range(i(0), 16);
    kb.store(y, vec![pid, c], out[0].clone());
    both(&kb.finish());
}

#[test]
fn f64_is_unsupported_in_wgsl_but_emitted_for_cuda() {
    let mut kb = KB::new("f64", [1, 1, 1]);
    let x = kb.param("x", DType::F64, &[16], Access::Read);
    let y = kb.param("y", DType::F64, &[16], Access::Write);
    let r = kb.range(i(0), 16);
    let t = kb.load(x, vec![r.clone()], Some(imm_f(0.0, DType::F64)));
    let t = kb.un(UnOp::Exp, t);
    let t = kb.reduce(ReduceOp::Sum, t, 0);
    let t = kb.broadcast(t, &[16]);
    kb.store(y, vec![r], t);
    let k = kb.finish();
    match wgsl_kernel(&k, &WgslLimits::default()) {
        Err(Error::Unsupported(m)) => assert!(m.contains("f64"), "{m}"),
        other => panic!("{other:?}"),
    }
    cuda_kernel(&k).unwrap();
}

/// f64 computed from template values only (RoPE's frequency table) is folded by `loom_reference::fold` and
/// written as literals in WGSL; the f64 values themselves are not emitted. CUDA computes them natively.
#[test]
fn f64_constants_are_folded_to_literals_in_wgsl() {
    let mut kb = KB::new("f64_table", [2, 1, 1]);
    let x = kb.param("x", DType::I32, &[2, 16], Access::Read);
    let y = kb.param("y", DType::I32, &[2, 16], Access::Write);
    let n = kb.pid(0);
    let r = kb.range(i(0), 16);
    let e = kb.cast(r.clone(), DType::F64);
    let e = kb.mul(e, imm_f(-0.1, DType::F64));
    let e = kb.un(UnOp::Exp, e);
    let e = kb.mul(e, imm_f(1000.0, DType::F64));
    let table = kb.cast(e, DType::I32);
    let t = kb.load(x, vec![n.clone(), r.clone()], Some(imm_i(0, DType::I32)));
    let t = kb.bin(BinOp::Add, t, table);
    kb.store(y, vec![n, r], t);
    let k = kb.finish();
    let m = wgsl_kernel(&k, &WgslLimits::default()).unwrap_or_else(|e| panic!("{e}"));
    // trunc(1000 exp(-0.1 i)) for i = 0, 1, 2: 1000, 904, 818.
    assert!(
        m.source.contains("array<i32, 16>(1000i, 904i, 818i"),
        "{}",
        m.source
    );
    let main = m.source.split("@compute").nth(1).expect("an entry point");
    assert!(!main.contains("exp("), "{}", m.source);
    cuda_kernel(&k).unwrap();
}

#[test]
fn extents_beyond_the_i32_emulation_are_rejected() {
    let mut kb = KB::new("huge", [1, 1, 1]);
    let x = kb.param("x", DType::U8, &[1 << 16, 1 << 16], Access::Read);
    let y = kb.param("y", DType::U8, &[4], Access::Write);
    let r = kb.range(i(0), 4);
    let t = kb.load(x, vec![i(0), r.clone()], None);
    kb.store(y, vec![r], t);
    let k = kb.finish();
    match wgsl_kernel(&k, &WgslLimits::default()) {
        Err(Error::Unsupported(m)) => assert!(m.contains("i32"), "{m}"),
        other => panic!("{other:?}"),
    }
    cuda_kernel(&k).unwrap();
    // An i64 immediate outside i32.
    let mut kb = KB::new("bigimm", [1, 1, 1]);
    let y = kb.param("y", DType::I64, &[1], Access::Write);
    let s = kb.add(i(1 << 40), i(1));
    kb.store(y, vec![i(0)], s);
    let k = kb.finish();
    assert!(matches!(
        wgsl_kernel(&k, &WgslLimits::default()),
        Err(Error::Unsupported(_))
    ));
    cuda_kernel(&k).unwrap();
}

#[test]
fn malformed_ir_is_an_error_not_a_panic() {
    let base = || {
        let mut kb = KB::new("bad", [1, 1, 1]);
        let y = kb.param("y", DType::F32, &[4], Access::Write);
        let r = kb.range(i(0), 4);
        let t = kb.full(f(1.0), &[4], DType::F32);
        kb.store(y, vec![r], t);
        kb.finish()
    };
    let mut cases: Vec<Kernel> = vec![];
    // A use of a value that does not exist.
    let mut k = base();
    if let KOpKind::Store { value, .. } = &mut k.body.ops[2].kind {
        *value = v(KValue(99));
    }
    cases.push(k);
    // A store to a parameter that does not exist.
    let mut k = base();
    if let KOpKind::Store { param, .. } = &mut k.body.ops[2].kind {
        *param = 7;
    }
    cases.push(k);
    // No final yield.
    let mut k = base();
    k.body.ops.pop();
    cases.push(k);
    // Empty body.
    let mut k = base();
    k.body.ops.clear();
    cases.push(k);
    // A declared type that disagrees with the op.
    let mut k = base();
    k.values[0].ty = KType::Scalar(DType::F32);
    cases.push(k);
    // Wrong number of indices, and a store to a read-only parameter.
    let mut k = base();
    if let KOpKind::Store { indices, .. } = &mut k.body.ops[2].kind {
        indices.push(i(0));
    }
    cases.push(k);
    let mut k = base();
    k.params[0].access = Access::Read;
    cases.push(k);
    // Shapes that do not line up.
    let mut k = base();
    k.values[1].ty = tile(&[5], DType::F32);
    cases.push(k);
    for (n, k) in cases.iter().enumerate() {
        let w = wgsl_kernel(k, &WgslLimits::default());
        assert!(matches!(w, Err(Error::Malformed(_))), "case {n}: {w:?}");
        let c = cuda_kernel(k);
        assert!(matches!(c, Err(Error::Malformed(_))), "case {n}: {c:?}");
    }
}
