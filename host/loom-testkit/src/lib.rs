//! `loom-testkit`: support code for tests of the kernel crates (never a dependency of production code).
//!
//! A small builder for hand-written kernels and stages, a [`corpus`] of kernels built with it (every op, dtype
//! and access kind), plus byte and random-number helpers. The builder infers
//! result types the way the documented semantics define them (so tests read like the text syntax); it is
//! deliberately naive and checks nothing — checking is the job of the code under test.

pub mod corpus;
pub mod motifs;
pub use motifs::{dequant_stage, motif_catalog, package_catalog};

use loom_ir::Loc;
use loom_ir::kernel::{
    Access, BinOp, BufRef, CmpOp, DType, Dispatch, KImm, KOp, KOpKind, KOperand, KParam, KRegion,
    KType, KValue, KValueDef, Kernel, ReduceOp, Stage, StageBuffer, UnOp,
};

pub fn v(x: KValue) -> KOperand {
    KOperand::Value(x)
}
/// An i64 immediate.
pub fn i(x: i64) -> KOperand {
    KOperand::Imm(KImm::I64(x), DType::I64)
}
/// An f32 immediate.
pub fn f(x: f64) -> KOperand {
    KOperand::Imm(KImm::F64(x), DType::F32)
}
pub fn imm_f(x: f64, d: DType) -> KOperand {
    KOperand::Imm(KImm::F64(x), d)
}
pub fn imm_i(x: i64, d: DType) -> KOperand {
    KOperand::Imm(KImm::I64(x), d)
}
pub fn tile(shape: &[u32], dtype: DType) -> KType {
    KType::Tile {
        shape: shape.to_vec(),
        dtype,
    }
}

#[derive(Debug)]
pub struct KB {
    pub name: String,
    pub params: Vec<KParam>,
    pub grid: [u64; 3],
    pub values: Vec<KValueDef>,
    blocks: Vec<Vec<KOp>>,
    line: u32,
}

impl KB {
    pub fn new(name: &str, grid: [u64; 3]) -> KB {
        KB {
            name: name.into(),
            params: vec![],
            grid,
            values: vec![],
            blocks: vec![vec![]],
            line: 0,
        }
    }

    pub fn param(&mut self, name: &str, dtype: DType, shape: &[u64], access: Access) -> u32 {
        self.params.push(KParam {
            name: name.into(),
            dtype,
            shape: shape.to_vec(),
            access,
        });
        (self.params.len() - 1) as u32
    }

    pub fn ty(&self, o: &KOperand) -> KType {
        match o {
            KOperand::Value(x) => self.values[x.0 as usize].ty.clone(),
            KOperand::Imm(_, d) => KType::Scalar(*d),
        }
    }

    fn shape(&self, o: &KOperand) -> Vec<u32> {
        match self.ty(o) {
            KType::Scalar(_) => vec![],
            KType::Tile { shape, .. } => shape,
        }
    }

    pub fn value(&mut self, ty: KType) -> KValue {
        self.values.push(KValueDef {
            name: format!("v{}", self.values.len()),
            ty,
        });
        KValue((self.values.len() - 1) as u32)
    }

    pub fn emit(&mut self, kind: KOpKind, results: Vec<KValue>) {
        self.line += 1;
        self.blocks.last_mut().unwrap().push(KOp {
            kind,
            results,
            loc: Loc {
                line: self.line,
                col: 3,
            },
        });
    }

    /// Emits an op with one result of type `ty`.
    pub fn push(&mut self, kind: KOpKind, ty: KType) -> KOperand {
        let r = self.value(ty);
        self.emit(kind, vec![r]);
        v(r)
    }

    /// The type of an elementwise result of `dtype` over these operands: the first tile's shape, else scalar.
    fn elementwise(&self, ops: &[&KOperand], dtype: DType) -> KType {
        for o in ops {
            if let KType::Tile { shape, .. } = self.ty(o) {
                return KType::Tile { shape, dtype };
            }
        }
        KType::Scalar(dtype)
    }

    pub fn pid(&mut self, axis: u8) -> KOperand {
        self.push(KOpKind::ProgramId { axis }, KType::Scalar(DType::I64))
    }
    pub fn range(&mut self, start: KOperand, len: u32) -> KOperand {
        self.push(KOpKind::Range { start, len }, tile(&[len], DType::I64))
    }
    pub fn full(&mut self, value: KOperand, shape: &[u32], dtype: DType) -> KOperand {
        self.push(
            KOpKind::Full {
                value,
                shape: shape.to_vec(),
                dtype,
            },
            tile(shape, dtype),
        )
    }
    pub fn bin(&mut self, op: BinOp, a: KOperand, b: KOperand) -> KOperand {
        let ty = self.elementwise(&[&a, &b], self.ty(&a).dtype());
        self.push(KOpKind::Binary { op, a, b }, ty)
    }
    pub fn add(&mut self, a: KOperand, b: KOperand) -> KOperand {
        self.bin(BinOp::Add, a, b)
    }
    pub fn sub(&mut self, a: KOperand, b: KOperand) -> KOperand {
        self.bin(BinOp::Sub, a, b)
    }
    pub fn mul(&mut self, a: KOperand, b: KOperand) -> KOperand {
        self.bin(BinOp::Mul, a, b)
    }
    pub fn div(&mut self, a: KOperand, b: KOperand) -> KOperand {
        self.bin(BinOp::Div, a, b)
    }
    pub fn un(&mut self, op: UnOp, a: KOperand) -> KOperand {
        let ty = self.ty(&a);
        self.push(KOpKind::Unary { op, a }, ty)
    }
    pub fn cmp(&mut self, op: CmpOp, a: KOperand, b: KOperand) -> KOperand {
        let ty = self.elementwise(&[&a, &b], DType::I1);
        self.push(KOpKind::Cmp { op, a, b }, ty)
    }
    pub fn select(&mut self, cond: KOperand, a: KOperand, b: KOperand) -> KOperand {
        let ty = self.elementwise(&[&cond, &a, &b], self.ty(&a).dtype());
        self.push(KOpKind::Select { cond, a, b }, ty)
    }
    pub fn cast(&mut self, a: KOperand, to: DType) -> KOperand {
        let ty = self.elementwise(&[&a], to);
        self.push(KOpKind::Cast { a, to }, ty)
    }
    pub fn broadcast(&mut self, a: KOperand, shape: &[u32]) -> KOperand {
        let ty = tile(shape, self.ty(&a).dtype());
        self.push(
            KOpKind::Broadcast {
                a,
                shape: shape.to_vec(),
            },
            ty,
        )
    }
    pub fn expand_dims(&mut self, a: KOperand, axis: u8) -> KOperand {
        let mut shape = self.shape(&a);
        shape.insert(axis as usize, 1);
        let ty = tile(&shape, self.ty(&a).dtype());
        self.push(KOpKind::ExpandDims { a, axis }, ty)
    }
    pub fn reshape(&mut self, a: KOperand, shape: &[u32]) -> KOperand {
        let ty = tile(shape, self.ty(&a).dtype());
        self.push(
            KOpKind::Reshape {
                a,
                shape: shape.to_vec(),
            },
            ty,
        )
    }
    pub fn transpose(&mut self, a: KOperand) -> KOperand {
        let s = self.shape(&a);
        let ty = tile(&[s[1], s[0]], self.ty(&a).dtype());
        self.push(KOpKind::Transpose { a }, ty)
    }
    pub fn reduce(&mut self, op: ReduceOp, a: KOperand, axis: u8) -> KOperand {
        let mut shape = self.shape(&a);
        shape.remove(axis as usize);
        if shape.is_empty() {
            shape.push(1);
        }
        let ty = tile(&shape, self.ty(&a).dtype());
        self.push(KOpKind::Reduce { op, a, axis }, ty)
    }
    pub fn dot(&mut self, a: KOperand, b: KOperand, acc: KOperand) -> KOperand {
        let ty = self.ty(&acc);
        self.push(KOpKind::Dot { a, b, acc }, ty)
    }
    pub fn load(&mut self, param: u32, indices: Vec<KOperand>, fill: Option<KOperand>) -> KOperand {
        let p = &self.params[param as usize];
        let dtype = if p.dtype.is_quantized() {
            DType::F32
        } else {
            p.dtype
        };
        let shape: Vec<u32> = indices.iter().flat_map(|ix| self.shape(ix)).collect();
        let ty = if shape.is_empty() {
            KType::Scalar(dtype)
        } else {
            tile(&shape, dtype)
        };
        self.push(
            KOpKind::Load {
                param,
                indices,
                fill,
            },
            ty,
        )
    }
    pub fn store(&mut self, param: u32, indices: Vec<KOperand>, value: KOperand) {
        self.emit(
            KOpKind::Store {
                param,
                indices,
                value,
            },
            vec![],
        );
    }

    /// `for %iv = lo to hi step s iter(inits)`: `body` gets the induction variable and the iteration values
    /// and returns what to yield. Returns the loop's results.
    pub fn for_(
        &mut self,
        lo: KOperand,
        hi: KOperand,
        step: KOperand,
        inits: Vec<KOperand>,
        body: impl FnOnce(&mut KB, KOperand, &[KOperand]) -> Vec<KOperand>,
    ) -> Vec<KOperand> {
        let iv = self.value(KType::Scalar(DType::I64));
        let tys: Vec<KType> = inits.iter().map(|o| self.ty(o)).collect();
        let iters: Vec<KValue> = tys.iter().map(|t| self.value(t.clone())).collect();
        self.blocks.push(vec![]);
        let iter_ops: Vec<KOperand> = iters.iter().map(|&x| v(x)).collect();
        let yields = body(self, v(iv), &iter_ops);
        self.emit(KOpKind::Yield(yields), vec![]);
        let ops = self.blocks.pop().unwrap();
        let results: Vec<KValue> = tys.iter().map(|t| self.value(t.clone())).collect();
        let kind = KOpKind::For {
            lo,
            hi,
            step,
            iv,
            iters,
            inits,
            body: KRegion { ops },
        };
        self.emit(kind, results.clone());
        results.into_iter().map(v).collect()
    }

    pub fn if_(
        &mut self,
        cond: KOperand,
        tys: Vec<KType>,
        then: impl FnOnce(&mut KB) -> Vec<KOperand>,
        els: impl FnOnce(&mut KB) -> Vec<KOperand>,
    ) -> Vec<KOperand> {
        self.blocks.push(vec![]);
        let y = then(self);
        self.emit(KOpKind::Yield(y), vec![]);
        let then_region = KRegion {
            ops: self.blocks.pop().unwrap(),
        };
        self.blocks.push(vec![]);
        let y = els(self);
        self.emit(KOpKind::Yield(y), vec![]);
        let else_region = KRegion {
            ops: self.blocks.pop().unwrap(),
        };
        let results: Vec<KValue> = tys.into_iter().map(|t| self.value(t)).collect();
        self.emit(
            KOpKind::If {
                cond,
                then_region,
                else_region,
            },
            results.clone(),
        );
        results.into_iter().map(v).collect()
    }

    pub fn finish(mut self) -> Kernel {
        self.emit(KOpKind::Yield(vec![]), vec![]);
        Kernel {
            name: self.name,
            params: self.params,
            grid: self.grid,
            values: self.values,
            body: KRegion {
                ops: self.blocks.pop().unwrap(),
            },
            file: "tests.loom".into(),
        }
    }
}

pub fn cdiv(a: u64, b: u64) -> u64 {
    a.div_ceil(b)
}

pub fn buf(name: &str, dtype: DType, shape: &[u64]) -> StageBuffer {
    StageBuffer {
        name: name.into(),
        dtype,
        shape: shape.to_vec(),
    }
}

pub fn stage(
    name: &str,
    inputs: Vec<StageBuffer>,
    outputs: Vec<StageBuffer>,
    workspace: Vec<StageBuffer>,
    kernels: Vec<Kernel>,
    dispatches: Vec<(u32, Vec<BufRef>)>,
) -> Stage {
    Stage {
        name: name.into(),
        inputs,
        outputs,
        workspace,
        param_domain: None,
        params: vec![],
        kernels,
        dispatches: dispatches
            .into_iter()
            .map(|(kernel, args)| Dispatch { kernel, args })
            .collect(),
    }
}

// ---- bytes ----

pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
pub fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}
pub fn i32_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
pub fn i64_bytes(v: &[i64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
pub fn i64s(b: &[u8]) -> Vec<i64> {
    b.chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

// ---- random numbers (splitmix64: deterministic, no dependency) ----

#[derive(Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
    pub fn f32s(&mut self, n: usize, lo: f64, hi: f64) -> Vec<f32> {
        (0..n).map(|_| self.uniform(lo, hi) as f32).collect()
    }
}

pub fn rel_close(got: f64, want: f64, rel: f64, abs: f64) -> bool {
    (got - want).abs() <= rel * want.abs() + abs
}

/// A name for the operand-building closures' `KType` use in tests.
pub fn scalar(d: DType) -> KType {
    KType::Scalar(d)
}

pub const READ: Access = Access::Read;
pub const WRITE: Access = Access::Write;
pub const RW: Access = Access::ReadWrite;

/// `c = a @ b` (f32, `a: [m, k]`, `b: [k, n]`) tiled `bm x bn` per program with a `for` over `k` in steps of
/// `bk` accumulating with `tile.dot`; with `bias_gelu`, the epilogue adds `bias: [n]` and applies the exact
/// (erf) GELU. Parameters: `a, b, [bias,] c`.
pub fn gemm_kernel(m: u64, n: u64, k: u64, bm: u32, bn: u32, bk: u32, bias_gelu: bool) -> Kernel {
    use DType::F32;
    let mut kb = KB::new("gemm", [cdiv(m, bm as u64), cdiv(n, bn as u64), 1]);
    let a = kb.param("a", F32, &[m, k], READ);
    let b = kb.param("b", F32, &[k, n], READ);
    let bias = bias_gelu.then(|| kb.param("bias", F32, &[n], READ));
    let c = kb.param("c", F32, &[m, n], WRITE);
    let pm = kb.pid(0);
    let pn = kb.pid(1);
    let m0 = kb.mul(pm, i(bm as i64));
    let rm = kb.range(m0, bm);
    let n0 = kb.mul(pn, i(bn as i64));
    let rn = kb.range(n0, bn);
    let acc0 = kb.full(f(0.0), &[bm, bn], F32);
    let (rm2, rn2) = (rm.clone(), rn.clone());
    let res = kb.for_(
        i(0),
        i(k as i64),
        i(bk as i64),
        vec![acc0],
        move |kb, kv, it| {
            let rk = kb.range(kv, bk);
            let ta = kb.load(a, vec![rm2, rk.clone()], Some(f(0.0)));
            let tb = kb.load(b, vec![rk, rn2], Some(f(0.0)));
            vec![kb.dot(ta, tb, it[0].clone())]
        },
    );
    let mut out = res[0].clone();
    if let Some(bias) = bias {
        let bv = kb.load(bias, vec![rn.clone()], Some(f(0.0)));
        let be = kb.expand_dims(bv, 0);
        let bb = kb.broadcast(be, &[bm, bn]);
        out = kb.add(out, bb);
        let t = kb.mul(out.clone(), f(std::f64::consts::FRAC_1_SQRT_2));
        let e = kb.un(UnOp::Erf, t);
        let e1 = kb.add(e, f(1.0));
        let h = kb.mul(out, f(0.5));
        out = kb.mul(h, e1);
    }
    kb.store(c, vec![rm, rn], out);
    kb.finish()
}

/// The row form of a quantised matrix-vector product (the CPU backend's `qmatvec` pattern): `y[m, :] = W x[m, :]` for each of `m` rows of `x: [m, k]`, over an
/// `(m, cdiv(n, bn))` grid (`pid(0)` the row).
pub fn matvec_rows_kernel(wdt: DType, m: u64, n: u64, k: u64, bn: u32, bk: u32) -> Kernel {
    let mut kb = KB::new("matvec_rows", [m, cdiv(n, bn as u64), 1]);
    let w = kb.param("w", wdt, &[n, k], READ);
    let x = kb.param("x", DType::F32, &[m, k], READ);
    let y = kb.param("y", DType::F32, &[m, n], WRITE);
    let row = kb.pid(0);
    let p = kb.pid(1);
    let n0 = kb.mul(p, i(bn as i64));
    let rn = kb.range(n0, bn);
    let acc0 = kb.full(f(0.0), &[1, bn], DType::F32);
    let (rn2, row2) = (rn.clone(), row.clone());
    let res = kb.for_(
        i(0),
        i(k as i64),
        i(bk as i64),
        vec![acc0],
        move |kb, k0, it| {
            let rk = kb.range(k0, bk);
            let xt = kb.load(x, vec![row2, rk.clone()], Some(f(0.0)));
            let xa = kb.expand_dims(xt, 0);
            let wt = kb.load(w, vec![rn2, rk], Some(f(0.0)));
            let wt = kb.transpose(wt);
            vec![kb.dot(xa, wt, it[0].clone())]
        },
    );
    let out = kb.reshape(res[0].clone(), &[bn]);
    kb.store(y, vec![row, rn], out);
    kb.finish()
}

/// A stage of one [`matvec_rows_kernel`] dispatch whose weights `w: [n, k]` of `wdt` are the stage's parameter 0
/// (as a model's weights are), `x: [m, k]` input 0 and `y: [m, n]` output 0.
pub fn matvec_rows_param_stage(wdt: DType, m: u64, n: u64, k: u64) -> Stage {
    Stage {
        name: "rows".into(),
        inputs: vec![buf("x", DType::F32, &[m, k])],
        outputs: vec![buf("y", DType::F32, &[m, n])],
        workspace: vec![],
        param_domain: None,
        params: vec![loom_ir::kernel::ParamBinding {
            name: "w".into(),
            dtype: wdt,
            shape: vec![n, k],
            input: 0,
            key: "w".into(),
            layout: None,
        }],
        kernels: vec![matvec_rows_kernel(wdt, m, n, k, 16, 64)],
        dispatches: vec![Dispatch {
            kernel: 0,
            args: vec![BufRef::Param(0), BufRef::Input(0), BufRef::Output(0)],
        }],
    }
}
