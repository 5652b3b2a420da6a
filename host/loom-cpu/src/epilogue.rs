//! Native GEMM epilogues: the elementwise tail of a matched GEMM kernel (`pattern::match_gemm`), run row by
//! row over the whole output instead of as a JIT kernel over `BM x BN` tiles.
//!
//! An epilogue kernel is the GEMM kernel with its `for` replaced by a load of `C[rm, rn]`. When everything
//! between that load and the one store `C[rm, rn] = v` is
//!
//! * loads `P[rm, rn]` of `[M, N]` f32 buffers (C itself, a residual) and `P[rn]` of `[N]` f32 buffers (a bias),
//! * `expand_dims(bias, 0)`, `broadcast` of such a row or of a scalar, `full` of an f32 constant,
//! * `add`, `sub`, `mul`, `div` of those and f32 constants,
//! * unary `exp`, `log`, `tanh`, `erf`, `sqrt`, `rsqrt`, `sigmoid`, `neg`, `abs`,
//!
//! ([`match_epilogue`]) the same operations run over one output row at a time, each a tight loop over `N`
//! elements through the JIT's own loops (`rt::bin_best`, `rt::loom_unary_tile`): the results are **bitwise**
//! those of the JIT epilogue (same operations, same order, same functions; checked by the tests). Anything else
//! (selects, reductions, casts, other index forms) keeps the JIT epilogue. Rows are split between threads.

use crate::pattern::GemmMatch;
use crate::rt;
use loom_ir::kernel::{BinOp, DType, KImm, KOpKind, KOperand, KValue, Kernel, UnOp};
use std::collections::HashMap;

/// Where an operand's row comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Src {
    /// Row `m` of an `[M, N]` parameter (C itself or another output-shaped buffer).
    Mat(u32),
    /// The whole of an `[N]` parameter (the same row for every `m`).
    Row(u32),
    /// The result of op `i`.
    Reg(usize),
    /// An f32 constant.
    Const(f32),
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum EOp {
    Bin { op: BinOp, a: Src, b: Src },
    Un { op: UnOp, a: Src },
}

/// A matched epilogue: `ops[i]` writes register `i`; the stored value is `out`, into parameter `store`.
#[derive(Debug, Clone)]
pub(crate) struct Epilogue {
    pub(crate) ops: Vec<EOp>,
    pub(crate) out: Src,
    pub(crate) store: u32,
    pub(crate) m: usize,
    pub(crate) n: usize,
}

impl Epilogue {
    /// Every parameter the epilogue reads or writes.
    pub(crate) fn params(&self) -> impl Iterator<Item = u32> + '_ {
        self.ops
            .iter()
            .flat_map(|op| match *op {
                EOp::Bin { a, b, .. } => [Some(a), Some(b)],
                EOp::Un { a, .. } => [Some(a), None],
            })
            .flatten()
            .chain([self.out])
            .filter_map(|s| match s {
                Src::Mat(p) | Src::Row(p) => Some(p),
                _ => None,
            })
            .chain([self.store])
    }
}

/// What a kernel value is, for the matcher.
#[derive(Debug, Clone, Copy, PartialEq)]
enum V {
    /// An index computation (program ids, range starts): allowed only where indices are.
    Index,
    /// `range(pid(0) * BM, BM)` / `range(pid(1) * BN, BN)`.
    Rm,
    Rn,
    Data(Src),
}

/// The native form of `g`'s epilogue kernel, when every op of it is one the row form runs (see the module
/// doc); `None` keeps the JIT epilogue.
pub(crate) fn match_epilogue(g: &GemmMatch, e: &Kernel) -> Option<Epilogue> {
    let (m, n) = (g.m as u64, g.n as u64);
    let mut vals: HashMap<KValue, V> = HashMap::new();
    let mut ops: Vec<EOp> = Vec::new();
    let mut store: Option<(u32, Src)> = None;
    let data = |vals: &HashMap<KValue, V>, o: &KOperand| -> Option<Src> {
        match o {
            KOperand::Value(v) => match vals.get(v)? {
                V::Data(s) => Some(*s),
                _ => None,
            },
            KOperand::Imm(KImm::F64(x), DType::F32) => Some(Src::Const(*x as f32)),
            KOperand::Imm(KImm::I64(x), DType::F32) => Some(Src::Const(*x as f32)),
            _ => None,
        }
    };
    let index = |vals: &HashMap<KValue, V>, o: &KOperand| -> Option<V> {
        match o {
            KOperand::Value(v) => vals.get(v).copied(),
            KOperand::Imm(..) => Some(V::Index),
        }
    };
    let param_f32 = |p: u32, shape: &[u64]| {
        e.params
            .get(p as usize)
            .is_some_and(|kp| kp.dtype == DType::F32 && kp.shape == shape)
    };
    for op in &e.body.ops {
        if store.is_some() {
            // The store is the last op (before the body's empty yield).
            if matches!(&op.kind, KOpKind::Yield(ys) if ys.is_empty()) {
                continue;
            }
            return None;
        }
        let one = || op.results.first().copied();
        let v = match &op.kind {
            KOpKind::ProgramId { .. } => V::Index,
            KOpKind::Binary { op: bop, a, b } => {
                match (index(&vals, a), index(&vals, b)) {
                    // Scalar index arithmetic (range starts).
                    (Some(V::Index), Some(V::Index))
                        if !matches!(a, KOperand::Imm(_, DType::F32))
                            && !matches!(b, KOperand::Imm(_, DType::F32)) =>
                    {
                        V::Index
                    }
                    _ => {
                        if !matches!(bop, BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div) {
                            return None;
                        }
                        let (a, b) = (data(&vals, a)?, data(&vals, b)?);
                        if matches!((a, b), (Src::Const(_), Src::Const(_))) {
                            return None;
                        }
                        ops.push(EOp::Bin { op: *bop, a, b });
                        V::Data(Src::Reg(ops.len() - 1))
                    }
                }
            }
            KOpKind::Range { .. } => {
                let r = KOperand::Value(one()?);
                if crate::pattern::pid_range(&e.body.ops, &r, 0) == Some(g.bm) {
                    V::Rm
                } else if crate::pattern::pid_range(&e.body.ops, &r, 1) == Some(g.bn) {
                    V::Rn
                } else {
                    return None;
                }
            }
            KOpKind::Load {
                param,
                indices,
                fill: Some(_),
            } => {
                let ix: Vec<V> = indices
                    .iter()
                    .map(|i| index(&vals, i))
                    .collect::<Option<_>>()?;
                match ix[..] {
                    [V::Rm, V::Rn] if param_f32(*param, &[m, n]) => V::Data(Src::Mat(*param)),
                    [V::Rn] if param_f32(*param, &[n]) => V::Data(Src::Row(*param)),
                    _ => return None,
                }
            }
            KOpKind::ExpandDims { a, axis: 0 } => match data(&vals, a)? {
                s @ Src::Row(_) => V::Data(s),
                _ => return None,
            },
            KOpKind::Broadcast { a, shape } if shape[..] == [g.bm, g.bn] => match data(&vals, a)? {
                s @ (Src::Row(_) | Src::Const(_)) => V::Data(s),
                _ => return None,
            },
            KOpKind::Full {
                value,
                dtype: DType::F32,
                ..
            } => match data(&vals, value)? {
                s @ Src::Const(_) => V::Data(s),
                _ => return None,
            },
            KOpKind::Unary { op: uop, a } => {
                if matches!(uop, UnOp::Not) {
                    return None;
                }
                let a = data(&vals, a)?;
                if matches!(a, Src::Const(_)) {
                    return None;
                }
                ops.push(EOp::Un { op: *uop, a });
                V::Data(Src::Reg(ops.len() - 1))
            }
            KOpKind::Store {
                param,
                indices,
                value,
            } => {
                let ix: Vec<V> = indices
                    .iter()
                    .map(|i| index(&vals, i))
                    .collect::<Option<_>>()?;
                if ix[..] != [V::Rm, V::Rn] || !param_f32(*param, &[m, n]) {
                    return None;
                }
                let out = data(&vals, value)?;
                if !matches!(out, Src::Reg(_) | Src::Mat(_)) {
                    return None;
                }
                store = Some((*param, out));
                continue;
            }
            _ => return None,
        };
        vals.insert(one()?, v);
    }
    let (store, out) = store?;
    // Every f32 value must be f32 data: a Row or Mat used where the kernel had [BM, BN] tiles is what the
    // lowering checked (shapes line up or the JIT would have refused the kernel).
    Some(Epilogue {
        ops,
        out,
        store,
        m: g.m,
        n: g.n,
    })
}

/// Rows per thread below which the second thread is not worth its wake-up (see `rows::run`).
const MIN_ELEMS_PER_THREAD: usize = 16_384;

/// Runs `e` over every row. `slot(p)` is the address of parameter `p`'s buffer (sizes were checked by the
/// caller: `[M, N]` or `[N]` f32, 4-byte aligned).
pub(crate) fn run(e: &Epilogue, slot: &dyn Fn(u32) -> *mut f32, threads: usize) {
    let (m, n) = (e.m, e.n);
    if m == 0 || n == 0 {
        return;
    }
    let per_thread_min = (MIN_ELEMS_PER_THREAD / n).max(1);
    let threads = threads.clamp(1, m.div_ceil(per_thread_min).max(1));
    let mut ptrs: Vec<(u32, usize)> = Vec::new();
    for p in e.params() {
        if !ptrs.iter().any(|(q, _)| *q == p) {
            ptrs.push((p, slot(p) as usize));
        }
    }
    let addr = |p: u32| {
        ptrs.iter()
            .find(|(q, _)| *q == p)
            .map_or(std::ptr::null_mut(), |(_, a)| *a as *mut f32)
    };
    let per = m.div_ceil(threads);
    let work = |t: usize| {
        let (lo, hi) = (t * per, ((t + 1) * per).min(m));
        let mut regs = vec![0f32; e.ops.len().max(1) * CHUNK];
        for row in lo..hi {
            let mut c0 = 0;
            while c0 < n {
                let c1 = (c0 + CHUNK).min(n);
                // SAFETY: every Mat parameter is [M, N] f32 and every Row parameter [N] f32 (checked by the
                // matcher against the kernel's parameters, and by `run` against the buffers), row < M,
                // c0 < c1 <= N.
                unsafe { run_row(e, &addr, row, c0, c1, &mut regs) };
                c0 = c1;
            }
        }
    };
    if threads == 1 {
        work(0);
    } else {
        crate::pool::run(threads, threads - 1, &work);
    }
}

/// Columns an epilogue runs all its ops over before the next columns of the row: the registers stay in L1
/// and the row of C is read once (the ops are elementwise, so the bits do not depend on it).
const CHUNK: usize = 256;

/// Columns `c0..c1` of one output row: each op over them into its register, then the store.
///
/// # Safety
/// `addr(p)` points to `[M, N]` f32 for Mat parameters and to `[N]` f32 for Row parameters; `row < M`,
/// `c0 < c1 <= N`, `c1 - c0 <= CHUNK`; the stored parameter's row is written by this call only (threads own
/// disjoint rows).
unsafe fn run_row(
    e: &Epilogue,
    addr: &dyn Fn(u32) -> *mut f32,
    row: usize,
    c0: usize,
    c1: usize,
    regs: &mut [f32],
) {
    let (n, w) = (e.n, c1 - c0);
    let (regs_ptr, regs_len) = (regs.as_mut_ptr(), regs.len());
    // A source as a pointer to its w elements (or a constant).
    let src = |s: Src| -> Result<*const f32, f32> {
        match s {
            // SAFETY: row < M and c1 <= n, so row * n + c1 <= M * n elements.
            Src::Mat(p) => Ok(unsafe { addr(p).add(row * n + c0) } as *const f32),
            // SAFETY: c1 <= n.
            Src::Row(p) => Ok(unsafe { addr(p).add(c0) } as *const f32),
            // SAFETY: i < ops.len(), regs holds ops.len() * CHUNK elements.
            Src::Reg(i) => Ok(unsafe { regs_ptr.add(i * CHUNK) } as *const f32),
            Src::Const(c) => Err(c),
        }
    };
    for (i, op) in e.ops.iter().enumerate() {
        debug_assert!(i * CHUNK + w <= regs_len);
        // SAFETY: register i is w elements inside regs, written only by op i; sources are other registers
        // (earlier ops) or parameter rows, never register i.
        let dst = unsafe { std::slice::from_raw_parts_mut(regs_ptr.add(i * CHUNK), w) };
        match *op {
            EOp::Bin { op, a, b } => {
                // SAFETY: each Ok pointer addresses w readable f32 (see `src`).
                let sl = |p: *const f32| unsafe { std::slice::from_raw_parts(p, w) };
                let (a, b) = (src(a), src(b));
                // The same IEEE operations on each element on any lane count (`rt::bin_best`).
                let args = match (a, b) {
                    (Ok(x), Ok(y)) => rt::BinArgs::VV(sl(x), sl(y)),
                    (Ok(x), Err(c)) => rt::BinArgs::VS(sl(x), c),
                    (Err(c), Ok(y)) => rt::BinArgs::SV(c, sl(y)),
                    (Err(_), Err(_)) => unreachable!("constant folding is refused by the matcher"),
                };
                rt::bin_best(op, args, dst);
            }
            EOp::Un { op, a } => {
                let Ok(x) = src(a) else {
                    unreachable!("unary of a constant is refused by the matcher")
                };
                crate::rt::loom_unary_tile(
                    crate::rt::unop_code(op),
                    crate::rt::dtype_code(DType::F32),
                    x as *const u8,
                    dst.as_mut_ptr() as *mut u8,
                    w as u64,
                );
            }
        }
    }
    let out = match src(e.out) {
        Ok(p) => p,
        Err(_) => return,
    };
    // SAFETY: the stored parameter is [M, N]; `out` may be that very span (an in-place store), so copy
    // through pointers.
    unsafe { std::ptr::copy(out, addr(e.store).add(row * n + c0), w) };
}
