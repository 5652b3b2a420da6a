//! Hand-built kernels covering every op, dtype family and access kind, shared by the emitter's tests
//! (`loom-emit/tests/ops.rs`: WGSL validated by naga, CUDA C emitted) and `hal-cuda`'s NVRTC test (the CUDA C
//! compiled and assembled).

use loom_ir::kernel::{Access, BinOp, CmpOp, DType, KOperand, KType, Kernel, ReduceOp, UnOp};

use crate::{KB, f, i, imm_f, imm_i, tile};

pub const INTS: &[DType] = &[
    DType::I64,
    DType::I32,
    DType::U32,
    DType::I16,
    DType::U16,
    DType::I8,
    DType::U8,
];
pub const FLOATS: &[DType] = &[DType::F32, DType::F16, DType::BF16];

/// Every value dtype: the integers, the floats and i1.
pub fn value_dtypes() -> Vec<DType> {
    INTS.iter()
        .chain(FLOATS)
        .copied()
        .chain([DType::I1])
        .collect()
}

fn one(d: DType) -> KOperand {
    if d.is_float() {
        imm_f(1.0, d)
    } else {
        imm_i(1, d)
    }
}

/// Elementwise math of one dtype over a [4, 16] tile loaded from and stored to a buffer of that dtype, plus
/// the same ops on scalars.
pub fn elementwise(d: DType) -> Kernel {
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

/// A [32] tile of `from` cast to every value dtype, one output buffer each (12 buffers).
pub fn casts_from(from: DType) -> Kernel {
    let all = value_dtypes();
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
    kb.finish()
}

/// Broadcast, transpose, reshape, expand_dims, the three float reductions and a bf16 dot in a K loop.
pub fn data_movement_reductions_and_dot() -> Kernel {
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
    kb.finish()
}

/// A [8, 4096] i32 tile (32768 elements) reduced along both axes; the index tile is a computed (not range)
/// tile, so it is staged through scratch in chunks.
pub fn big_integer_reductions() -> Kernel {
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
    kb.finish()
}

/// A masked tile load and store of buffer dtype `d` (rows -1..7 of a [7, 5] buffer), then a scalar checked
/// load and store.
pub fn loads_and_stores(d: DType) -> Kernel {
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
    kb.finish()
}

/// Checked loads of a quantised `d` buffer into f32: [3, 64] for the 32-element blocks, [1, 256] for the
/// K-quants.
pub fn quantised_load(d: DType) -> Kernel {
    let (per, _) = d.block().unwrap_or((32, 0));
    if per >= 256 {
        let mut kb = KB::new(&format!("q_{d}"), [1, 1, 1]);
        let w = kb.param("w", d, &[1, 256], Access::Read);
        let y = kb.param("y", DType::F32, &[1, 256], Access::Write);
        let c = kb.range(i(0), 256);
        let t = kb.load(w, vec![i(0), c.clone()], None);
        kb.store(y, vec![i(0), c], t);
        return kb.finish();
    }
    let mut kb = KB::new(&format!("q_{d}"), [2, 1, 1]);
    let w = kb.param("w", d, &[3, 64], Access::Read);
    let y = kb.param("y", DType::F32, &[3, 64], Access::Write);
    let pid = kb.pid(0);
    let c = kb.range(i(0), 64);
    let t = kb.load(w, vec![pid.clone(), c.clone()], None);
    kb.store(y, vec![pid, c], t);
    kb.finish()
}

/// `if` with tile and scalar results inside nested `for` loops with a loaded trip count.
pub fn control_flow() -> Kernel {
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
    kb.finish()
}

/// f64 buffers, `exp` and a sum (CUDA only: WGSL has no f64).
pub fn f64_math() -> Kernel {
    let mut kb = KB::new("f64", [1, 1, 1]);
    let x = kb.param("x", DType::F64, &[16], Access::Read);
    let y = kb.param("y", DType::F64, &[16], Access::Write);
    let r = kb.range(i(0), 16);
    let t = kb.load(x, vec![r.clone()], Some(imm_f(0.0, DType::F64)));
    let t = kb.un(UnOp::Exp, t);
    let t = kb.reduce(ReduceOp::Sum, t, 0);
    let t = kb.broadcast(t, &[16]);
    kb.store(y, vec![r], t);
    kb.finish()
}

/// (name, kernel): the whole corpus.
pub fn all() -> Vec<(String, Kernel)> {
    let mut v: Vec<Kernel> = Vec::new();
    v.extend(INTS.iter().chain(FLOATS).map(|&d| elementwise(d)));
    v.extend(value_dtypes().into_iter().map(casts_from));
    v.push(data_movement_reductions_and_dot());
    v.push(big_integer_reductions());
    v.extend(value_dtypes().into_iter().map(loads_and_stores));
    v.extend(
        [
            DType::Q8_0,
            DType::Q4_0,
            DType::Q4_1,
            DType::Q4K,
            DType::Q6K,
        ]
        .into_iter()
        .map(quantised_load),
    );
    v.push(control_flow());
    v.push(f64_math());
    v.into_iter().map(|k| (k.name.clone(), k)).collect()
}

/// The run-time bounds kernel (issue 14): `grid` instances, each counting to `n[0]` (read from a buffer, so
/// nothing can fold the loop away) in a `for` loop and storing the count in `y[pid]` as f32. With a large `n`
/// it is the runaway kernel the step budget and cancellation stop.
pub fn counted_loop(grid: u64) -> Kernel {
    let mut kb = KB::new("count", [grid, 1, 1]);
    let n = kb.param("n", DType::I64, &[1], Access::Read);
    let y = kb.param("y", DType::F32, &[grid], Access::Write);
    let trips = kb.load(n, vec![i(0)], None);
    let out = kb.for_(i(0), trips, i(1), vec![f(0.0)], |kb, _iv, it| {
        vec![kb.add(it[0].clone(), f(1.0))]
    });
    let pid = kb.pid(0);
    kb.store(y, vec![pid], out[0].clone());
    kb.finish()
}
