//! Whole-kernel pattern match: a kernel that is exactly a tiled GEMM over full buffers,
//!
//! ```text
//! rm = range(pid(0) * BM, BM); rn = range(pid(1) * BN, BN)
//! acc = for k0 = 0 to K step BK iter(c = full(0.0, [BM, BN])) {
//!     rk = range(k0, BK); yield dot(load(A[rm, rk], 0.0), load(B[rk, rn], 0.0), c) }
//! ... epilogue on acc (bias, activation: anything) ...
//! store C[rm, rn], out
//! ```
//!
//! over a `cdiv(M, BM) x cdiv(N, BN)` grid, is executed as **one** `gemm` call `C = A @ B` over the whole
//! matrices (this is where peak performance comes from) plus, when the stored value is not the loop result
//! itself, an *epilogue kernel*: the original kernel with the `for` replaced by a masked load of `C[rm, rn]`,
//! lowered by the ordinary JIT (so masks, bias loads and activations keep their exact semantics).
//!
//! The masked loads read 0 outside the matrices, so the tiled sum over `k` equals the full contraction, and
//! the grid covers every element of `C` exactly once: the match is semantics-preserving up to the f32
//! summation order (within the documented dot tolerance).

use loom_ir::kernel::{Access, DType, KImm, KOp, KOpKind, KOperand, KRegion, KValue, Kernel};

/// A matched GEMM: `C[m, n] = A[m, k] @ B[k, n]` with parameter indices, plus the epilogue kernel if any.
#[derive(Debug, Clone)]
pub(crate) struct GemmMatch {
    pub(crate) m: usize,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) a: u32,
    pub(crate) b: u32,
    pub(crate) c: u32,
    /// `B` is stored transposed, as `[N, K]` (PyTorch's `Linear` layout), and loaded as `transpose(load(B[rn,
    /// rk], 0.0))`.
    pub(crate) trans_b: bool,
    pub(crate) epilogue: Option<Kernel>,
    /// The kernel's tile (`BM x BN` programs over C).
    pub(crate) bm: u32,
    pub(crate) bn: u32,
}

fn imm_i(o: &KOperand) -> Option<i64> {
    match o {
        KOperand::Imm(KImm::I64(x), DType::I64) => Some(*x),
        _ => None,
    }
}

fn val(o: &KOperand) -> Option<KValue> {
    match o {
        KOperand::Value(v) => Some(*v),
        _ => None,
    }
}

fn def(ops: &[KOp], v: KValue) -> Option<&KOp> {
    ops.iter().find(|op| op.results.contains(&v))
}

/// `range(pid(axis) * B, B)` defined among `ops`: returns B.
pub(crate) fn pid_range(ops: &[KOp], o: &KOperand, axis: u8) -> Option<u32> {
    let KOpKind::Range { start, len } = &def(ops, val(o)?)?.kind else {
        return None;
    };
    let KOpKind::Binary {
        op: loom_ir::kernel::BinOp::Mul,
        a,
        b,
    } = &def(ops, val(start)?)?.kind
    else {
        return None;
    };
    let (p, s) = if imm_i(b).is_some() { (a, b) } else { (b, a) };
    let KOpKind::ProgramId { axis: ax } = def(ops, val(p)?)?.kind else {
        return None;
    };
    (ax == axis && imm_i(s)? == i64::from(*len)).then_some(*len)
}

fn is_zero_f32(o: &KOperand) -> bool {
    matches!(o, KOperand::Imm(KImm::F64(x), DType::F32) if *x == 0.0)
        || matches!(o, KOperand::Imm(KImm::I64(0), DType::F32))
}

/// Does any op (recursively) store to or load from `param`?
fn touches(r: &KRegion, param: u32, load: bool, store: bool) -> usize {
    let mut n = 0;
    for op in &r.ops {
        match &op.kind {
            KOpKind::Load { param: p, .. } if load && *p == param => n += 1,
            KOpKind::Store { param: p, .. } if store && *p == param => n += 1,
            KOpKind::For { body, .. } => n += touches(body, param, load, store),
            KOpKind::If {
                then_region,
                else_region,
                ..
            } => {
                n += touches(then_region, param, load, store)
                    + touches(else_region, param, load, store)
            }
            _ => {}
        }
    }
    n
}

pub(crate) fn match_gemm(k: &Kernel) -> Option<GemmMatch> {
    let ops = &k.body.ops;
    // The store C[rm, rn] and the single for loop.
    let (si, store) = ops
        .iter()
        .enumerate()
        .find(|(_, op)| matches!(op.kind, KOpKind::Store { .. }))?;
    let KOpKind::Store {
        param: c,
        indices: sidx,
        value,
    } = &store.kind
    else {
        return None;
    };
    let [srm, srn] = &sidx[..] else { return None };
    let bm = pid_range(ops, srm, 0)?;
    let bn = pid_range(ops, srn, 1)?;
    let fors: Vec<(usize, &KOp)> = ops
        .iter()
        .enumerate()
        .filter(|(_, op)| matches!(op.kind, KOpKind::For { .. }))
        .collect();
    let [(fi, fop)] = fors[..] else { return None };
    if fi > si {
        return None;
    }
    let KOpKind::For {
        lo,
        hi,
        step,
        iv,
        iters,
        inits,
        body,
    } = &fop.kind
    else {
        return None;
    };
    let ([acc], [init], [res]) = (&iters[..], &inits[..], &fop.results[..]) else {
        return None;
    };
    let (kk, bk) = (imm_i(hi)?, imm_i(step)?);
    if imm_i(lo)? != 0 || bk <= 0 || kk <= 0 {
        return None;
    }
    let KOpKind::Full {
        value: z,
        shape,
        dtype: DType::F32,
    } = &def(ops, val(init)?)?.kind
    else {
        return None;
    };
    if !is_zero_f32(z) || shape[..] != [bm, bn] {
        return None;
    }
    // Body: rk = range(iv, BK); ta = load(A[rm, rk], 0); tb = load(B[rk, rn], 0); d = dot(ta, tb, acc); yield d,
    // or with B: [N, K] stored transposed: tb = load(B[rn, rk], 0); tt = transpose(tb); d = dot(ta, tt, acc).
    let bops = &body.ops;
    let (r_op, la, lb, tr, dop, y) = match &bops[..] {
        [r_op, la, lb, dop, y] => (r_op, la, lb, None, dop, y),
        [r_op, la, lb, tr, dop, y] => (r_op, la, lb, Some(tr), dop, y),
        _ => return None,
    };
    let KOpKind::Range { start, len } = &r_op.kind else {
        return None;
    };
    if val(start)? != *iv || i64::from(*len) != bk {
        return None;
    }
    let rk = r_op.results.first().copied()?;
    let KOpKind::Dot {
        a: da,
        b: db,
        acc: dacc,
    } = &dop.kind
    else {
        return None;
    };
    if val(dacc)? != *acc {
        return None;
    }
    let KOpKind::Yield(ys) = &y.kind else {
        return None;
    };
    if ys.len() != 1 || val(&ys[0])? != *dop.results.first()? {
        return None;
    }
    let load = |op: &KOp, want: KValue| -> Option<(u32, Vec<KOperand>)> {
        if op.results.first() != Some(&want) {
            return None;
        }
        match &op.kind {
            KOpKind::Load {
                param,
                indices,
                fill: Some(f),
            } if is_zero_f32(f) => Some((*param, indices.clone())),
            _ => None,
        }
    };
    // With a transpose, the dot's B operand is the transpose of one of the two loads.
    let db = match tr {
        None => val(db)?,
        Some(t) => {
            let KOpKind::Transpose { a } = &t.kind else {
                return None;
            };
            if t.results.first() != Some(&val(db)?) {
                return None;
            }
            val(a)?
        }
    };
    let (pa, ia) = load(la, val(da)?).or_else(|| load(lb, val(da)?))?;
    let (pb, ib) = load(lb, db).or_else(|| load(la, db))?;
    let [arm, ark] = &ia[..] else { return None };
    let (brk, brn) = match (&ib[..], tr) {
        ([brk, brn], None) => (brk, brn),
        ([brn, brk], Some(_)) => (brk, brn),
        _ => return None,
    };
    if val(arm)? != val(srm)? || val(brn)? != val(srn)? || val(ark)? != rk || val(brk)? != rk {
        return None;
    }
    let (pa_, pb_, pc_) = (
        k.params.get(pa as usize)?,
        k.params.get(pb as usize)?,
        k.params.get(*c as usize)?,
    );
    let f32_2d = |p: &loom_ir::kernel::KParam| p.dtype == DType::F32 && p.shape.len() == 2;
    if !f32_2d(pa_)
        || !f32_2d(pb_)
        || !f32_2d(pc_)
        || pa_.access == Access::Write
        || pb_.access == Access::Write
    {
        return None;
    }
    let trans_b = tr.is_some();
    let (m, kdim) = (pa_.shape[0], pa_.shape[1]);
    let (bk_dim, n) = if trans_b {
        (pb_.shape[1], pb_.shape[0])
    } else {
        (pb_.shape[0], pb_.shape[1])
    };
    if bk_dim != kdim || pc_.shape[..] != [m, n] || kdim as i64 != kk || pc_.access == Access::Read
    {
        return None;
    }
    if k.grid != [m.div_ceil(u64::from(bm)), n.div_ceil(u64::from(bn)), 1] {
        return None;
    }
    // C is written by this one store only and never read.
    if touches(&k.body, *c, true, true) != 1 || pa == *c || pb == *c {
        return None;
    }
    let epilogue = if val(value) == Some(*res) {
        None
    } else {
        let mut e = k.clone();
        e.name = format!("{}#epilogue", k.name);
        e.body.ops[fi] = KOp {
            kind: KOpKind::Load {
                param: *c,
                indices: vec![srm.clone(), srn.clone()],
                fill: Some(KOperand::Imm(KImm::F64(0.0), DType::F32)),
            },
            results: vec![*res],
            loc: fop.loc,
        };
        Some(e)
    };
    Some(GemmMatch {
        m: m as usize,
        n: n as usize,
        k: kdim as usize,
        a: pa,
        b: pb,
        c: *c,
        trans_b,
        epilogue,
        bm,
        bn,
    })
}

/// A matched quantised matrix-vector product `y[n] = sum_k W[n, k] * x[k]` (parameter indices).
#[derive(Debug, Clone)]
pub(crate) struct MatvecMatch {
    /// Rows of `X: [M, K]` and `Y: [M, N]` (the row form); 1 for the vector form (`X: [K]`, `Y: [N]`).
    pub(crate) m: usize,
    /// The row form (run by `qdotf::matmul_rows`, activations kept in f32).
    pub(crate) row_form: bool,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) dtype: DType,
    pub(crate) w: u32,
    pub(crate) x: u32,
    pub(crate) y: u32,
}

/// A kernel that is exactly a tiled matrix-vector product with a GGUF weight `W: [N, K]` (blocks along K):
///
/// ```text
/// rn = range(pid(0) * BN, BN)
/// acc = for k0 = 0 to K step BK iter(c = full(0.0, [1, BN])) {
///     rk = range(k0, BK)
///     xa = expand_dims(load(X[rk], 0.0), 0)        (or reshape to [1, BK])
///     wt = transpose(load(W[rn, rk], 0.0))         ([BK, BN])
///     yield dot(xa, wt, c) }
/// store Y[rn], reshape(acc, [BN])
/// ```
///
/// over a `cdiv(N, BN)` grid and nothing else (a load without fill is accepted where its ranges divide the
/// extents, so it can never be out of range). The kernel computes every `y[n]` exactly once from the whole
/// contraction, which `qdot::matvec` computes directly.
///
/// The **row form** is the same product for each row of `X: [M, K]` into `Y: [M, N]`, over an
/// `(M, cdiv(N, BN))` grid: `m = pid(0)`, `rn = range(pid(1) * BN, BN)`, `load(X[m, rk], 0.0)` and
/// `store Y[m, rn], ...` (`m` is always in range). It runs on `qdotf::matmul_rows`, which keeps the activations
/// in f32 (each weight row dequantised once for all M rows): the JIT's and the reference's numbers up to f32
/// rounding, where the vector form's `qdot::matvec` quantises the activation to Q8 blocks as ggml does.
pub(crate) fn match_matvec(k: &Kernel) -> Option<MatvecMatch> {
    let ops = match &k.body.ops[..] {
        [
            rest @ ..,
            KOp {
                kind: KOpKind::Yield(ys),
                ..
            },
        ] if ys.is_empty() => rest,
        all => all,
    };
    // The row form has one more op: `m = pid(0)`.
    if ops.len() != 7 && ops.len() != 8 {
        return None;
    }
    let row_form = ops.len() == 8;
    let [store] = &ops
        .iter()
        .filter(|op| matches!(op.kind, KOpKind::Store { .. }))
        .collect::<Vec<_>>()[..]
    else {
        return None;
    };
    let KOpKind::Store {
        param: y,
        indices: sidx,
        value,
    } = &store.kind
    else {
        return None;
    };
    // The row form's row index `m = pid(0)`, on the store and on X's load alike.
    let row_pid = |o: &KOperand| -> Option<KValue> {
        let v = val(o)?;
        matches!(def(ops, v)?.kind, KOpKind::ProgramId { axis: 0 }).then_some(v)
    };
    let (srow, srn) = match (&sidx[..], row_form) {
        ([srn], false) => (None, srn),
        ([sm, srn], true) => (Some(row_pid(sm)?), srn),
        _ => return None,
    };
    let bn = pid_range(ops, srn, u8::from(row_form))?;
    let KOpKind::Reshape { a: racc, shape } = &def(ops, val(value)?)?.kind else {
        return None;
    };
    if shape[..] != [bn] {
        return None;
    }
    let fop = def(ops, val(racc)?)?;
    let KOpKind::For {
        lo,
        hi,
        step,
        iv,
        iters,
        inits,
        body,
    } = &fop.kind
    else {
        return None;
    };
    let ([acc], [init], [res]) = (&iters[..], &inits[..], &fop.results[..]) else {
        return None;
    };
    if val(racc)? != *res {
        return None;
    }
    let (kk, bk) = (imm_i(hi)?, imm_i(step)?);
    if imm_i(lo)? != 0 || bk <= 0 || kk <= 0 {
        return None;
    }
    let KOpKind::Full {
        value: z,
        shape,
        dtype: DType::F32,
    } = &def(ops, val(init)?)?.kind
    else {
        return None;
    };
    if !is_zero_f32(z) || shape[..] != [1, bn] {
        return None;
    }
    let bops = &body.ops;
    if bops.len() != 7 {
        return None;
    }
    let Some(KOp {
        kind: KOpKind::Yield(ys),
        ..
    }) = bops.last()
    else {
        return None;
    };
    let [yv] = &ys[..] else { return None };
    let dop = def(bops, val(yv)?)?;
    let KOpKind::Dot {
        a: da,
        b: db,
        acc: dacc,
    } = &dop.kind
    else {
        return None;
    };
    if val(dacc)? != *acc {
        return None;
    }
    let xl = match &def(bops, val(da)?)?.kind {
        KOpKind::ExpandDims { a, axis: 0 } => a,
        KOpKind::Reshape { a, shape } if shape[..] == [1, bk as u32] => a,
        _ => return None,
    };
    let KOpKind::Transpose { a: wl } = &def(bops, val(db)?)?.kind else {
        return None;
    };
    let load = |o: &KOperand| -> Option<(u32, Vec<KOperand>, bool)> {
        match &def(bops, val(o)?)?.kind {
            KOpKind::Load {
                param,
                indices,
                fill,
            } => match fill {
                None => Some((*param, indices.clone(), false)),
                Some(f) if is_zero_f32(f) => Some((*param, indices.clone(), true)),
                _ => None,
            },
            _ => None,
        }
    };
    let (px, ix, fx) = load(xl)?;
    let (pw, iw, fw) = load(wl)?;
    let xrk = match (&ix[..], srow) {
        ([xrk], None) => xrk,
        ([xm, xrk], Some(m)) if val(xm)? == m => xrk,
        _ => return None,
    };
    let [wrn, wrk] = &iw[..] else { return None };
    let r_op = def(bops, val(xrk)?)?;
    let KOpKind::Range { start, len } = &r_op.kind else {
        return None;
    };
    if val(start)? != *iv
        || i64::from(*len) != bk
        || val(wrk)? != val(xrk)?
        || val(wrn)? != val(srn)?
    {
        return None;
    }
    let (pw_, px_, py_) = (
        k.params.get(pw as usize)?,
        k.params.get(px as usize)?,
        k.params.get(*y as usize)?,
    );
    if !crate::qdot::supported(pw_.dtype)
        || px_.dtype != DType::F32
        || py_.dtype != DType::F32
        || pw_.access == Access::Write
        || px_.access == Access::Write
        || py_.access == Access::Read
    {
        return None;
    }
    let [n, kdim] = pw_.shape[..] else {
        return None;
    };
    let m = if row_form {
        let [m, xk] = px_.shape[..] else { return None };
        if xk != kdim || py_.shape[..] != [m, n] || m == 0 {
            return None;
        }
        m
    } else {
        if px_.shape[..] != [kdim] || py_.shape[..] != [n] {
            return None;
        }
        1
    };
    if kdim as i64 != kk || kdim % 32 != 0 {
        return None;
    }
    let (n_div, k_div) = (n % u64::from(bn) == 0, kdim % bk as u64 == 0);
    let (x_safe, w_safe) = (fx || k_div, fw || (k_div && n_div));
    if !x_safe || !w_safe {
        return None;
    }
    let grid = if row_form {
        [m, n.div_ceil(u64::from(bn)), 1]
    } else {
        [n.div_ceil(u64::from(bn)), 1, 1]
    };
    if k.grid != grid || *y == pw || *y == px {
        return None;
    }
    Some(MatvecMatch {
        m: m as usize,
        row_form,
        n: n as usize,
        k: kdim as usize,
        dtype: pw_.dtype,
        w: pw,
        x: px,
        y: *y,
    })
}

/// A matched row-wise normalisation over `X: [R, C]` (f32), one program per `BR` whole rows.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum RowOp {
    /// `y = exp(x - max(x)) / sum(exp(x - max(x)))` per row.
    Softmax,
    /// `xc = x - sum(x) / n1; y = xc * rsqrt(sum(xc * xc) / n2 + eps) * gamma + beta` per row (`n1`, `n2`,
    /// `eps` are the kernel's f32 immediates; gamma and beta `[C]` parameters).
    LayerNorm {
        n1: f32,
        n2: f32,
        eps: f32,
        gamma: u32,
        beta: u32,
    },
}

/// A kernel that is exactly a row softmax or layernorm (see [`match_rows`]).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RowsMatch {
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) x: u32,
    pub(crate) y: u32,
    pub(crate) op: RowOp,
}

/// Kernels that are exactly, over a `cdiv(R, BR)` grid with `rr = range(pid(0) * BR, BR)` and
/// `rc = range(0, C)` covering whole rows of `X, Y: [R, C]` (f32; `X` loaded once as `t = load(X[rr, rc],
/// fill)`, a fill-less load only when `BR` divides `R`), `store Y[rr, rc], o` with `o` one of
///
/// ```text
/// softmax:   e = exp(t - bc(reduce.max(t, 1))); o = e / bc(reduce.sum(e, 1))
/// layernorm: xc = t - bc(reduce.sum(t, 1) / N1); v = reduce.sum(xc * xc, 1) / N2 + EPS
///            o = xc * bc(rsqrt(v)) * col(load(G[rc])) + col(load(B[rc]))
/// ```
///
/// (`bc(s)` = `broadcast(expand_dims(s, 1), [BR, C])`, `col(g)` = `broadcast(expand_dims(g, 0), [BR, C])`,
/// commutative operands in either order) and **no other op** (an unused op could fail a checked load). Each
/// row's result depends on that row only and every row `< R` is stored exactly once, so `rows.rs` computes
/// the rows directly; the row sums there accumulate in f64 and round once, as the reference does.
pub(crate) fn match_rows(k: &Kernel) -> Option<RowsMatch> {
    use loom_ir::kernel::{BinOp, ReduceOp, UnOp};
    let ops = match &k.body.ops[..] {
        [
            rest @ ..,
            KOp {
                kind: KOpKind::Yield(ys),
                ..
            },
        ] if ys.is_empty() => rest,
        all => all,
    };
    let used = std::cell::RefCell::new(std::collections::BTreeSet::new());
    // The defining op of an operand, recorded as used.
    let d = |o: &KOperand| -> Option<&KOpKind> {
        let v = val(o)?;
        let op = def(ops, v)?;
        if op.results.len() != 1 {
            return None;
        }
        used.borrow_mut().insert(v);
        Some(&op.kind)
    };
    let stores: Vec<&KOp> = ops
        .iter()
        .filter(|op| matches!(op.kind, KOpKind::Store { .. }))
        .collect();
    let [store] = stores[..] else { return None };
    let KOpKind::Store {
        param: y,
        indices: sidx,
        value,
    } = &store.kind
    else {
        return None;
    };
    let [srr, src] = &sidx[..] else { return None };
    let br = pid_range(ops, srr, 0)?;
    let (rr, rc) = (val(srr)?, val(src)?);
    // Mark `range(pid(0) * BR, BR)` (checked by `pid_range`) as used.
    let KOpKind::Range { start, .. } = d(srr)? else {
        return None;
    };
    let KOpKind::Binary { a, b, .. } = d(start)? else {
        return None;
    };
    d(if imm_i(a).is_some() { b } else { a })?;
    let KOpKind::Range { start, len: c32 } = d(src)? else {
        return None;
    };
    if imm_i(start)? != 0 {
        return None;
    }
    let py = k.params.get(*y as usize)?;
    let [r, c] = py.shape[..] else { return None };
    if c != u64::from(*c32) || py.dtype != DType::F32 || py.access == Access::Read {
        return None;
    }
    let shape = [br, *c32];
    let fimm = |o: &KOperand| -> Option<f32> {
        match o {
            KOperand::Imm(KImm::F64(x), DType::F32) => Some(*x as f32),
            KOperand::Imm(KImm::I64(x), DType::F32) => Some(*x as f32),
            _ => None,
        }
    };
    // `bc(s)`: a per-row scalar broadcast along the row; returns `s`.
    let row_bc = |o: &KOperand| -> Option<KOperand> {
        let KOpKind::Broadcast { a, shape: s } = d(o)? else {
            return None;
        };
        let KOpKind::ExpandDims { a, axis: 1 } = d(a)? else {
            return None;
        };
        (s[..] == shape).then(|| a.clone())
    };
    // `col(load(G[rc]))`: returns G.
    let col = |o: &KOperand| -> Option<u32> {
        let KOpKind::Broadcast { a, shape: s } = d(o)? else {
            return None;
        };
        let KOpKind::ExpandDims { a, axis: 0 } = d(a)? else {
            return None;
        };
        let KOpKind::Load { param, indices, .. } = d(a)? else {
            return None;
        };
        let p = k.params.get(*param as usize)?;
        let ok = s[..] == shape
            && matches!(&indices[..], [i] if val(i) == Some(rc))
            && p.dtype == DType::F32
            && p.shape[..] == [c]
            && p.access != Access::Write
            && *param != *y;
        ok.then_some(*param)
    };
    let bin = |o: &KOperand, want: BinOp| -> Option<(KOperand, KOperand)> {
        match d(o)? {
            KOpKind::Binary { op, a, b } if *op == want => Some((a.clone(), b.clone())),
            _ => None,
        }
    };
    let reduce = |o: &KOperand, want: ReduceOp| -> Option<KOperand> {
        match d(o)? {
            KOpKind::Reduce { op, a, axis: 1 } if *op == want => Some(a.clone()),
            _ => None,
        }
    };
    // Either operand order of a commutative op, trying `f` on the first then the second.
    let either = |(a, b): (KOperand, KOperand)| [(a.clone(), b.clone()), (b, a)];
    let (op, t) = if let Some((e, s)) = bin(value, BinOp::Div) {
        // Softmax.
        let KOpKind::Unary { op: UnOp::Exp, a } = d(&e)? else {
            return None;
        };
        let (t, m) = bin(a, BinOp::Sub)?;
        let m = row_bc(&m)?;
        if val(&reduce(&m, ReduceOp::Max)?)? != val(&t)? {
            return None;
        }
        if val(&reduce(&row_bc(&s)?, ReduceOp::Sum)?)? != val(&e)? {
            return None;
        }
        (RowOp::Softmax, t)
    } else {
        // Layernorm.
        let (scaled, beta) = either(bin(value, BinOp::Add)?)
            .into_iter()
            .find_map(|(a, b)| Some((a, col(&b)?)))?;
        let (normed, gamma) = either(bin(&scaled, BinOp::Mul)?)
            .into_iter()
            .find_map(|(a, b)| Some((a, col(&b)?)))?;
        let (xc, inv) = either(bin(&normed, BinOp::Mul)?)
            .into_iter()
            .find_map(|(a, b)| Some((a, row_bc(&b)?)))?;
        let KOpKind::Unary {
            op: UnOp::Rsqrt,
            a: v,
        } = d(&inv)?
        else {
            return None;
        };
        let (v, eps) = either(bin(v, BinOp::Add)?)
            .into_iter()
            .find_map(|(a, b)| Some((a, fimm(&b)?)))?;
        let (ss, n2) = bin(&v, BinOp::Div)?;
        let n2 = fimm(&n2)?;
        let (q1, q2) = bin(&reduce(&ss, ReduceOp::Sum)?, BinOp::Mul)?;
        if val(&q1)? != val(&xc)? || val(&q2)? != val(&xc)? {
            return None;
        }
        let (t, mean) = bin(&xc, BinOp::Sub)?;
        let (s, n1) = bin(&row_bc(&mean)?, BinOp::Div)?;
        let n1 = fimm(&n1)?;
        if val(&reduce(&s, ReduceOp::Sum)?)? != val(&t)? {
            return None;
        }
        let op = RowOp::LayerNorm {
            n1,
            n2,
            eps,
            gamma,
            beta,
        };
        (op, t)
    };
    let KOpKind::Load {
        param: px,
        indices,
        fill,
    } = d(&t)?
    else {
        return None;
    };
    let pxp = k.params.get(*px as usize)?;
    let ok = matches!(&indices[..], [a, b] if val(a) == Some(rr) && val(b) == Some(rc))
        && pxp.dtype == DType::F32
        && pxp.shape[..] == [r, c]
        && pxp.access != Access::Write
        && *px != *y
        && (fill.is_some() || r % u64::from(br) == 0)
        && fill.as_ref().is_none_or(|f| fimm(f).is_some())
        && k.grid == [r.div_ceil(u64::from(br)), 1, 1]
        && c > 0;
    if !ok {
        return None;
    }
    // No op outside the matched expression (every result of every op was visited).
    let used = used.into_inner();
    let all_used = ops.iter().all(|op| {
        matches!(op.kind, KOpKind::Store { .. }) || op.results.iter().all(|v| used.contains(v))
    });
    if !all_used {
        return None;
    }
    Some(RowsMatch {
        rows: usize::try_from(r).ok()?,
        cols: usize::try_from(c).ok()?,
        x: *px,
        y: *y,
        op,
    })
}
