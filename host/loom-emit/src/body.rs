//! The shared kernel body generator: one walk over the IR that prints WGSL or CUDA C.
//!
//! Both targets use the same thread mapping (see the crate doc): a tile of `n` elements is distributed
//! cyclically, element `e` living in invocation `e % WG`, slot `e / WG` of a private array, so tiles of equal
//! element count (every elementwise operand pair) are distributed identically and elementwise ops are purely
//! local. Scalars are computed redundantly by every invocation (so they are uniform by construction). Ops that
//! read elements another invocation owns (broadcast, transpose, reductions, dot, the index tiles of a
//! load/store) go through one workgroup scratch array in chunks, between barriers.
//!
//! The differences between the targets are confined to small helpers (`ty`, `lit`, `conv`, buffer access,
//! barriers, the uniform-condition trick); everything else is printed from one code path, so both backends
//! share their structure and their tests.

use std::collections::HashMap;
use std::fmt::Write as _;

use loom_ir::kernel::{
    Access, BinOp, CmpOp, DType, KImm, KIndex, KOp, KOpKind, KOperand, KRegion, KType, KValue,
    Kernel, ReduceOp, UnOp,
};

use crate::Error;

/// Which language to print.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Target {
    Wgsl,
    Cuda,
}

/// Error codes written to the status buffer (documented in the crate doc).
pub(crate) const ERR_INDEX: u32 = 1;
pub(crate) const ERR_LOOP_STEP: u32 = 3;
pub(crate) const ERR_I64_RANGE: u32 = 4;
pub(crate) const ERR_BUDGET: u32 = 5;
pub(crate) const ERR_CANCELLED: u32 = 6;
/// Loop iterations between two looks at the cancellation word (at most).
pub(crate) const CANCEL_EVERY: u32 = 1024;

/// Regions nested deeper than this are refused (the generator recurses on regions).
const MAX_DEPTH: u32 = 64;

/// What is statically known about a tile value: lets gathers recompute elements instead of staging them.
#[derive(Clone, Debug)]
enum Known {
    /// `start + i`, with `start` an expression valid wherever the value is.
    Range(String),
    /// Every element is this scalar expression.
    Full(String),
}

/// The result of generating one kernel body.
#[derive(Debug)]
pub(crate) struct Body {
    /// Declarations of every SSA value (function scope).
    pub decls: String,
    pub code: String,
    /// Parameters that are loaded / stored (their helper functions are emitted).
    pub loaded: Vec<bool>,
    pub stored: Vec<bool>,
}

pub(crate) struct Gen<'k> {
    pub k: &'k Kernel,
    pub t: Target,
    /// Invocations (threads) per workgroup (block).
    pub wg: u32,
    /// Words of workgroup scratch.
    pub scratch: u32,
    decls: String,
    out: String,
    indent: usize,
    known: HashMap<u32, Known>,
    declared: Vec<bool>,
    tmp: u32,
    depth: u32,
    loaded: Vec<bool>,
    stored: Vec<bool>,
    /// Source location (line, col) of the op being emitted: reported with division-by-zero errors.
    loc: (u32, u32),
    /// WGSL: values computed through f64 that are the same in every program instance (see [`substitutes`]):
    /// `Some` = written as literals, `None` = not emitted at all (only other substituted values use them).
    subst: HashMap<u32, Option<loom_reference::Folded>>,
}

/// The values WGSL gets as constants instead of computing them: those `loom_reference::fold` can evaluate
/// (the same in every program instance) that are f64 or computed from an f64 value, because WGSL has no
/// f64. Such a value that some other operation uses is written as literals (`Some`); one used only by other
/// substituted values is not emitted (`None`). An f64 value an instance-dependent operation uses is not
/// substituted (and so refused as f64). Values that need no f64 are emitted as usual, so kernels without
/// f64 print exactly as before.
fn substitutes(k: &Kernel) -> HashMap<u32, Option<loom_reference::Folded>> {
    // Every substituted value goes back to an f64 one: without f64 there is nothing to fold.
    if !k.values.iter().any(|v| v.ty.dtype() == DType::F64) {
        return HashMap::new();
    }
    let folded = loom_reference::fold(k);
    let mut derived: HashMap<u32, loom_reference::Folded> = HashMap::new();
    for op in &k.body.ops {
        let [r] = op.results[..] else { continue };
        let Some(f) = folded.get(&r.0) else { continue };
        let mut through_f64 = f.dtype == DType::F64;
        operands(&op.kind, &mut |o| {
            if let KOperand::Value(v) = o {
                through_f64 |= derived.contains_key(&v.0);
            }
        });
        if through_f64 {
            derived.insert(r.0, f.clone());
        }
    }
    if derived.is_empty() {
        return HashMap::new();
    }
    // Which derived values operations outside the derived set use (anywhere in the kernel).
    let mut used = std::collections::HashSet::new();
    fn walk(
        r: &KRegion,
        derived: &HashMap<u32, loom_reference::Folded>,
        used: &mut std::collections::HashSet<u32>,
    ) {
        for op in &r.ops {
            if let [res] = op.results[..]
                && derived.contains_key(&res.0)
            {
                continue;
            }
            operands(&op.kind, &mut |o| {
                if let KOperand::Value(v) = o {
                    used.insert(v.0);
                }
            });
            match &op.kind {
                KOpKind::For { body, .. } => walk(body, derived, used),
                KOpKind::If {
                    then_region,
                    else_region,
                    ..
                } => {
                    walk(then_region, derived, used);
                    walk(else_region, derived, used);
                }
                _ => {}
            }
        }
    }
    walk(&k.body, &derived, &mut used);
    derived
        .into_iter()
        .filter_map(|(v, f)| match (used.contains(&v), f.dtype) {
            (false, _) => Some((v, None)),
            (true, DType::F64) => None,
            (true, _) => Some((v, Some(f))),
        })
        .collect()
}

/// Calls `f` on every operand of an operation (not those of nested regions' operations).
fn operands(kind: &KOpKind, f: &mut impl FnMut(&KOperand)) {
    use KOpKind as K;
    match kind {
        K::ProgramId { .. } => {}
        K::Binary { a, b, .. } | K::Cmp { a, b, .. } => {
            f(a);
            f(b);
        }
        K::Select { cond, a, b } => {
            f(cond);
            f(a);
            f(b);
        }
        K::Unary { a, .. }
        | K::Cast { a, .. }
        | K::Broadcast { a, .. }
        | K::ExpandDims { a, .. }
        | K::Reshape { a, .. }
        | K::Transpose { a }
        | K::Reduce { a, .. } => f(a),
        K::Range { start, .. } => f(start),
        K::Full { value, .. } => f(value),
        K::Dot { a, b, acc } => {
            f(a);
            f(b);
            f(acc);
        }
        K::Load { indices, fill, .. } => {
            indices.iter().for_each(&mut *f);
            if let Some(x) = fill {
                f(x);
            }
        }
        K::Store { indices, value, .. } => {
            indices.iter().for_each(&mut *f);
            f(value);
        }
        K::For {
            lo,
            hi,
            step,
            inits,
            ..
        } => {
            f(lo);
            f(hi);
            f(step);
            inits.iter().for_each(&mut *f);
        }
        K::If { cond, .. } => f(cond),
        K::Yield(v) => v.iter().for_each(f),
    }
}

fn bad(msg: impl Into<String>) -> Error {
    Error::Malformed(msg.into())
}

/// Number of private slots a tile of `n` elements needs per invocation (at least 1: WGSL has no empty arrays).
fn slots(n: u64, wg: u32) -> u64 {
    n.div_ceil(u64::from(wg)).max(1)
}

impl<'k> Gen<'k> {
    pub(crate) fn new(k: &'k Kernel, t: Target, wg: u32, scratch: u32) -> Gen<'k> {
        Gen {
            k,
            t,
            wg,
            scratch,
            decls: String::new(),
            out: String::new(),
            indent: 1,
            known: HashMap::new(),
            declared: vec![false; k.values.len()],
            tmp: 0,
            depth: 0,
            loaded: vec![false; k.params.len()],
            stored: vec![false; k.params.len()],
            loc: (0, 0),
            subst: if t == Target::Wgsl {
                substitutes(k)
            } else {
                HashMap::new()
            },
        }
    }

    pub(crate) fn run(mut self) -> Result<Body, Error> {
        let body = &self.k.body;
        let ys = self.region(body)?;
        if !ys.is_empty() {
            return Err(bad("the kernel body must end in an empty `yield`"));
        }
        Ok(Body {
            decls: self.decls,
            code: self.out,
            loaded: self.loaded,
            stored: self.stored,
        })
    }

    // ---- printing helpers ------------------------------------------------------------------------------

    fn line(&mut self, s: &str) {
        for _ in 0..self.indent {
            self.out.push_str("    ");
        }
        self.out.push_str(s);
        self.out.push('\n');
    }

    fn open(&mut self, s: &str) {
        self.line(s);
        self.indent += 1;
    }

    fn close(&mut self) {
        self.indent = self.indent.saturating_sub(1);
        self.line("}");
    }

    fn fresh(&mut self, base: &str) -> String {
        self.tmp += 1;
        format!("{base}{}", self.tmp)
    }

    fn wgsl(&self) -> bool {
        self.t == Target::Wgsl
    }

    /// `u32` / `unsigned` literal.
    fn u(&self, n: u64) -> String {
        format!("{n}u")
    }

    fn u32_t(&self) -> &'static str {
        if self.wgsl() { "u32" } else { "unsigned" }
    }

    /// The register type of the index type (`i64`): i32 in WGSL (emulated, see the crate doc), `long long` in
    /// CUDA.
    fn idx_t(&self) -> &'static str {
        if self.wgsl() { "i32" } else { "long long" }
    }

    /// A function-scope `let`.
    fn let_(&mut self, name: &str, ty: &str, expr: &str) {
        let s = if self.wgsl() {
            format!("let {name}: {ty} = {expr};")
        } else {
            format!("const {ty} {name} = {expr};")
        };
        self.line(&s);
    }

    /// A mutable local.
    fn var_(&mut self, name: &str, ty: &str, expr: &str) {
        let s = if self.wgsl() {
            format!("var {name}: {ty} = {expr};")
        } else {
            format!("{ty} {name} = {expr};")
        };
        self.line(&s);
    }

    /// `for (var i = from; i < to; i += step)` over u32.
    fn for_u(&mut self, i: &str, from: &str, to: &str, step: &str) {
        let s = if self.wgsl() {
            format!("for (var {i}: u32 = {from}; {i} < {to}; {i} = {i} + {step}) {{")
        } else {
            format!("for (unsigned {i} = {from}; {i} < {to}; {i} += {step}) {{")
        };
        self.open(&s);
    }

    fn barrier(&mut self) {
        let s = if self.wgsl() {
            "workgroupBarrier();"
        } else {
            "__syncthreads();"
        };
        self.line(s);
    }

    /// Opens the per-element loop over the `n` elements of a distributed tile: inside, `k` is the slot and `e`
    /// the flat element index (u32), and `e < n` holds.
    fn each(&mut self, n: u64) {
        let p = slots(n, self.wg);
        let (pu, wgu, nu) = (self.u(p), self.u(u64::from(self.wg)), self.u(n));
        self.for_u("k", "0u", &pu, "1u");
        let u = self.u32_t();
        self.let_("e", u, &format!("k * {wgu} + lid"));
        self.open(&format!("if (e < {nu}) {{"));
    }

    fn end_each(&mut self) {
        self.close();
        self.close();
    }

    /// Register type of a value dtype.
    pub(crate) fn ty(&self, d: DType) -> Result<&'static str, Error> {
        let wg = self.wgsl();
        Ok(match d {
            DType::F32 | DType::F16 | DType::BF16 => {
                if wg {
                    "f32"
                } else {
                    "float"
                }
            }
            DType::F64 => {
                if wg {
                    return Err(Error::Unsupported(
                        "f64 values: WGSL (downlevel, no SHADER_FLOAT64) has no f64".into(),
                    ));
                }
                "double"
            }
            DType::I64 => self.idx_t(),
            DType::I32 | DType::I16 | DType::I8 | DType::U16 | DType::U8 => {
                if wg {
                    "i32"
                } else {
                    "int"
                }
            }
            DType::U32 => self.u32_t(),
            DType::I1 => "bool",
            q => return Err(bad(format!("{q} is a buffer layout, not a value type"))),
        })
    }

    fn conv(&self, ty: &str, e: &str) -> String {
        if self.wgsl() {
            format!("{ty}({e})")
        } else {
            format!("(({ty})({e}))")
        }
    }

    fn select(&self, c: &str, a: &str, b: &str) -> String {
        if self.wgsl() {
            format!("select({b}, {a}, {c})")
        } else {
            format!("(({c}) ? ({a}) : ({b}))")
        }
    }

    /// A literal of dtype `d` holding `x`.
    fn lit(&self, imm: KImm, d: DType) -> Result<String, Error> {
        let float = |x: f64| -> Result<String, Error> {
            if d == DType::F64 {
                self.ty(d)?;
                if x.is_finite() {
                    return Ok(format!("{x:?}"));
                }
                return Ok(if x.is_nan() {
                    "__longlong_as_double(0x7ff8000000000000LL)".into()
                } else if x > 0.0 {
                    "__longlong_as_double(0x7ff0000000000000LL)".into()
                } else {
                    "__longlong_as_double((long long)0xfff0000000000000ULL)".into()
                });
            }
            let f = x as f32;
            let s = if f.is_finite() {
                format!("{f:?}f")
            } else {
                let bits = f.to_bits();
                if self.wgsl() {
                    format!("bitcast<f32>({bits}u)")
                } else {
                    format!("__uint_as_float({bits}u)")
                }
            };
            // Narrow float immediates are rounded to their type like every other value.
            Ok(match d {
                DType::F16 => format!("rf16({s})"),
                DType::BF16 => format!("rbf16({s})"),
                _ => s,
            })
        };
        match imm {
            KImm::F64(x) if d.is_float() => float(x),
            KImm::I64(x) if d.is_float() => float(x as f64),
            KImm::I1(b) if d == DType::I1 => Ok(b.to_string()),
            KImm::I64(x) if d == DType::I1 && (x == 0 || x == 1) => Ok((x == 1).to_string()),
            KImm::I64(x) => self.int_lit(x, d),
            _ => Err(bad(format!("immediate {imm:?} is not a {d} value"))),
        }
    }

    fn int_lit(&self, x: i64, d: DType) -> Result<String, Error> {
        let (lo, hi): (i64, i64) = match d {
            DType::I64 => (i64::MIN, i64::MAX),
            DType::I32 => (i32::MIN.into(), i32::MAX.into()),
            DType::U32 => (0, u32::MAX.into()),
            DType::I16 => (i16::MIN.into(), i16::MAX.into()),
            DType::U16 => (0, u16::MAX.into()),
            DType::I8 => (i8::MIN.into(), i8::MAX.into()),
            DType::U8 => (0, u8::MAX.into()),
            _ => return Err(bad(format!("immediate {x} is not a {d} value"))),
        };
        if x < lo || x > hi {
            return Err(bad(format!("immediate {x} does not fit {d}")));
        }
        if d == DType::U32 {
            return Ok(format!("{x}u"));
        }
        if self.wgsl() {
            if i32::try_from(x).is_err() {
                return Err(Error::Unsupported(format!(
                    "i64 immediate {x} is outside the i32 range WGSL emulates i64 with"
                )));
            }
            return Ok(if x == i64::from(i32::MIN) {
                "(-2147483647i - 1i)".into()
            } else {
                format!("{x}i")
            });
        }
        Ok(match d {
            DType::I64 if x == i64::MIN => "(-9223372036854775807LL - 1LL)".into(),
            DType::I64 => format!("{x}LL"),
            _ if x == i64::from(i32::MIN) => "(-2147483647 - 1)".into(),
            _ => format!("{x}"),
        })
    }

    /// Rounds / wraps a freshly computed register value to its dtype.
    fn norm(&self, d: DType, e: String) -> String {
        let wg = self.wgsl();
        match d {
            DType::F16 => format!("rf16({e})"),
            DType::BF16 => format!("rbf16({e})"),
            DType::I16 if wg => format!("((({e}) << 16u) >> 16u)"),
            DType::I8 if wg => format!("((({e}) << 24u) >> 24u)"),
            DType::I16 => format!("((int)(short)({e}))"),
            DType::I8 => format!("((int)(signed char)({e}))"),
            DType::U16 => format!("(({e}) & 65535)"),
            DType::U8 => format!("(({e}) & 255)"),
            _ => e,
        }
    }

    // ---- values and operands ----------------------------------------------------------------------------

    fn vty(&self, v: KValue) -> Result<&'k KType, Error> {
        self.k
            .values
            .get(v.0 as usize)
            .map(|d| &d.ty)
            .ok_or_else(|| bad(format!("value #{} does not exist", v.0)))
    }

    /// (shape if a tile, dtype) of an operand.
    fn oty(&self, o: &KOperand) -> Result<(Option<Vec<u32>>, DType), Error> {
        Ok(match o {
            KOperand::Value(v) => match self.vty(*v)? {
                KType::Scalar(d) => (None, *d),
                KType::Tile { shape, dtype } => (Some(shape.clone()), *dtype),
            },
            KOperand::Imm(_, d) => (None, *d),
        })
    }

    fn name(v: KValue) -> String {
        format!("v{}", v.0)
    }

    /// Declares a value's register(s) once (function scope, so regions may define and later ops read them).
    fn declare(&mut self, v: KValue) -> Result<(), Error> {
        let ty = self.vty(v)?.clone();
        if self.declared.get(v.0 as usize).copied().unwrap_or(true) {
            return Ok(());
        }
        self.declared[v.0 as usize] = true;
        let n = Self::name(v);
        let rt = self.ty(ty.dtype())?;
        if let KType::Tile { shape, .. } = &ty {
            let elems = shape
                .iter()
                .try_fold(1u64, |a, &d| a.checked_mul(u64::from(d)));
            if elems.is_none_or(|e| e > loom_ir::kernel::MAX_TILE_ELEMENTS) {
                return Err(bad(format!(
                    "%{} is a tile over the limit of {} elements",
                    self.k.values[v.0 as usize].name,
                    loom_ir::kernel::MAX_TILE_ELEMENTS
                )));
            }
        }
        let s = match &ty {
            KType::Scalar(_) if self.wgsl() => format!("    var {n}: {rt};\n"),
            KType::Scalar(_) => format!("    {rt} {n} = {};\n", self.zero(rt)),
            KType::Tile { .. } => {
                let p = slots(ty.elements(), self.wg);
                if self.wgsl() {
                    format!("    var {n}: array<{rt}, {p}>;\n")
                } else {
                    format!("    {rt} {n}[{p}];\n")
                }
            }
        };
        self.decls.push_str(&s);
        Ok(())
    }

    fn zero(&self, rt: &str) -> &'static str {
        match rt {
            "bool" => "false",
            "float" => "0.0f",
            "double" => "0.0",
            _ => "0",
        }
    }

    /// An operand as an expression: a scalar as is, a tile at slot `k` (only valid inside [`Self::each`]).
    fn at(&self, o: &KOperand) -> Result<String, Error> {
        match o {
            KOperand::Imm(x, d) => self.lit(*x, *d),
            KOperand::Value(v) => match self.vty(*v)? {
                KType::Scalar(_) => Ok(Self::name(*v)),
                KType::Tile { .. } => Ok(format!("{}[k]", Self::name(*v))),
            },
        }
    }

    fn scalar(&self, o: &KOperand) -> Result<String, Error> {
        if let (Some(_), _) = self.oty(o)? {
            return Err(bad("a tile where a scalar is expected"));
        }
        self.at(o)
    }

    /// The common shape of elementwise operands (scalars broadcast), or `None` if all are scalars.
    fn common(&self, ops: &[&KOperand]) -> Result<Option<Vec<u32>>, Error> {
        let mut shape: Option<Vec<u32>> = None;
        for o in ops {
            if let (Some(s), _) = self.oty(o)? {
                match &shape {
                    None => shape = Some(s),
                    Some(x) if *x == s => {}
                    Some(x) => {
                        return Err(bad(format!(
                            "elementwise operands of shapes {x:?} and {s:?} (broadcast explicitly)"
                        )));
                    }
                }
            }
        }
        Ok(shape)
    }

    /// Checks a result value's declared type against the computed one.
    fn check_result(&self, v: KValue, shape: &Option<Vec<u32>>, d: DType) -> Result<(), Error> {
        let ok = match (self.vty(v)?, shape) {
            (KType::Scalar(x), None) => *x == d,
            (KType::Tile { shape: s, dtype }, Some(w)) => *dtype == d && s == w,
            _ => false,
        };
        if !ok {
            return Err(bad(format!(
                "%{} is declared {} but its operation produces {d} {shape:?}",
                self.k.values[v.0 as usize].name,
                self.vty(v)?
            )));
        }
        Ok(())
    }

    /// Defines result `r` elementwise from `f(slot)` (called inside a per-element loop for tiles).
    fn define_elementwise(
        &mut self,
        r: KValue,
        shape: &Option<Vec<u32>>,
        expr: impl Fn(&Self) -> Result<String, Error>,
    ) -> Result<(), Error> {
        self.declare(r)?;
        let n = Self::name(r);
        match shape {
            None => {
                let e = expr(self)?;
                self.line(&format!("{n} = {e};"));
            }
            Some(s) => {
                let cnt = s.iter().map(|&d| u64::from(d)).product();
                self.each(cnt);
                let e = expr(self)?;
                self.line(&format!("{n}[k] = {e};"));
                self.end_each();
            }
        }
        Ok(())
    }

    /// Defines `r` from its folded elements (see [`substitutes`]): one literal when they are all equal,
    /// otherwise a function-scope array of literals indexed by element.
    fn constant(&mut self, r: KValue, c: &loom_reference::Folded) -> Result<(), Error> {
        let lits = match &c.elements {
            loom_reference::Elements::Float(x) => x
                .iter()
                .map(|&x| self.lit(KImm::F64(x), c.dtype))
                .collect::<Result<Vec<_>, _>>()?,
            loom_reference::Elements::Int(x) => x
                .iter()
                .map(|&x| self.int_lit(x, c.dtype))
                .collect::<Result<Vec<_>, _>>()?,
        };
        let shape = match self.vty(r)? {
            KType::Scalar(_) => None,
            KType::Tile { shape, .. } => Some(shape.clone()),
        };
        if lits.iter().all(|l| *l == lits[0]) {
            let l = lits[0].clone();
            return self.define_elementwise(r, &shape, |_| Ok(l.clone()));
        }
        let rt = self.ty(c.dtype)?;
        let table = format!("c{}", r.0);
        let s = if self.wgsl() {
            format!(
                "    var {table} = array<{rt}, {}>({});\n",
                lits.len(),
                lits.join(", ")
            )
        } else {
            format!(
                "    const {rt} {table}[{}] = {{{}}};\n",
                lits.len(),
                lits.join(", ")
            )
        };
        self.decls.push_str(&s);
        self.define_elementwise(r, &shape, |_| Ok(format!("{table}[e]")))
    }

    /// `dst := src` for loop-carried and `if` results: whole-array copy for tiles, a fill from a scalar.
    fn assign(&mut self, dst: KValue, src: &KOperand) -> Result<(), Error> {
        self.declare(dst)?;
        let dty = self.vty(dst)?.clone();
        let (ss, sd) = self.oty(src)?;
        if sd != dty.dtype() {
            return Err(bad(format!("cannot assign a {sd} value to {dty}")));
        }
        let n = Self::name(dst);
        match (&dty, ss) {
            (KType::Scalar(_), None) => {
                let e = self.at(src)?;
                self.line(&format!("{n} = {e};"));
            }
            (KType::Tile { shape, .. }, Some(s)) if *shape == s => {
                let e = self.at(src)?;
                // A whole-array copy: both are private arrays of the same length and element type.
                let e = e.trim_end_matches("[k]").to_string();
                if e != n {
                    if self.wgsl() {
                        self.line(&format!("{n} = {e};"));
                    } else {
                        let p = slots(dty.elements(), self.wg);
                        self.line(&format!(
                            "for (unsigned k = 0u; k < {p}u; ++k) {{ {n}[k] = {e}[k]; }}"
                        ));
                    }
                }
            }
            (KType::Tile { .. }, None) => {
                let e = self.at(src)?;
                self.each(dty.elements());
                self.line(&format!("{n}[k] = {e};"));
                self.end_each();
            }
            _ => {
                return Err(bad(format!(
                    "cannot assign {src:?} to a value of type {dty}"
                )));
            }
        }
        self.known.remove(&dst.0);
        Ok(())
    }

    /// Reports an error to the status buffer (first error wins the details).
    fn fail(&self, code: u32, a: &str, b: &str, c: &str) -> String {
        if self.wgsl() {
            format!("fail({code}u, {a}, {b}, {c})")
        } else {
            format!("loom_fail(status, {code}u, {a}, {b}, {c})")
        }
    }

    // ---- regions ----------------------------------------------------------------------------------------

    /// Emits a region's ops and returns its yield operands.
    fn region(&mut self, r: &'k KRegion) -> Result<&'k [KOperand], Error> {
        if self.depth >= MAX_DEPTH {
            return Err(bad(format!("regions nested deeper than {MAX_DEPTH}")));
        }
        self.depth += 1;
        let Some((last, body)) = r.ops.split_last() else {
            return Err(bad("empty region (every region ends in `yield`)"));
        };
        for op in body {
            self.op(op).map_err(|e| match e {
                Error::Malformed(m) => Error::Malformed(format!(
                    "kernel `{}` at {}:{}: {m}",
                    self.k.name, op.loc.line, op.loc.col
                )),
                e => e,
            })?;
        }
        self.depth -= 1;
        match &last.kind {
            KOpKind::Yield(v) if last.results.is_empty() => Ok(v),
            _ => Err(bad("region does not end in `yield`")),
        }
    }

    /// A uniform boolean for control flow: in WGSL the condition is passed through workgroup memory with
    /// `workgroupUniformLoad`, so the branch is uniform by the WGSL uniformity rules (function-scope variables
    /// and `read_write` storage loads are not, although every invocation computed the same value) and barriers
    /// inside the branch stay valid on every compiler, not just naga.
    fn uniform(&mut self, cond: &str) -> String {
        if !self.wgsl() {
            return format!("({cond})");
        }
        let g = self.fresh("go");
        self.line(&format!(
            "if (lid == 0u) {{ wg_flag = select(0u, 1u, {cond}); }}"
        ));
        self.line(&format!("let {g}: u32 = workgroupUniformLoad(&wg_flag);"));
        // Nobody may overwrite wg_flag before every invocation has read it.
        self.barrier();
        format!("({g} != 0u)")
    }

    /// A `u32` code computed by invocation 0 and seen by every invocation (WGSL: through `wg_flag`, as
    /// [`Self::uniform`]; CUDA: every thread computes the same value).
    fn uniform_code(&mut self, code: &str) -> String {
        if !self.wgsl() {
            let g = self.fresh("code");
            self.line(&format!("const unsigned {g} = {code};"));
            return g;
        }
        let g = self.fresh("code");
        self.line(&format!("if (lid == 0u) {{ wg_flag = {code}; }}"));
        self.line(&format!("let {g}: u32 = workgroupUniformLoad(&wg_flag);"));
        self.barrier();
        g
    }

    fn op(&mut self, op: &'k KOp) -> Result<(), Error> {
        use KOpKind as K;
        self.loc = (op.loc.line, op.loc.col);
        let one = || -> Result<KValue, Error> {
            match op.results[..] {
                [r] => Ok(r),
                _ => Err(bad(format!(
                    "operation has {} results, expected 1",
                    op.results.len()
                ))),
            }
        };
        if let [r] = op.results[..]
            && let Some(c) = self.subst.get(&r.0)
        {
            return match c.clone() {
                Some(c) => self.constant(r, &c),
                None => Ok(()),
            };
        }
        match &op.kind {
            K::Yield(_) => Err(bad("`yield` before the end of its region")),
            K::ProgramId { axis } => {
                let r = one()?;
                let ax = ["x", "y", "z"]
                    .get(usize::from(*axis))
                    .ok_or_else(|| bad(format!("program_id axis {axis} (0..3)")))?;
                self.check_result(r, &None, DType::I64)?;
                let e = if self.wgsl() {
                    format!("i32(wid.{ax})")
                } else {
                    format!("((long long)blockIdx.{ax})")
                };
                self.define_elementwise(r, &None, |_| Ok(e.clone()))
            }
            K::Binary { op: bop, a, b } => {
                let r = one()?;
                let shape = self.common(&[a, b])?;
                let (da, db) = (self.oty(a)?.1, self.oty(b)?.1);
                if da != db {
                    return Err(bad(format!("{bop:?}: operand types {da} and {db} differ")));
                }
                self.check_result(r, &shape, da)?;
                self.define_elementwise(r, &shape, |g| g.binary(*bop, da, a, b))
            }
            K::Unary { op: uop, a } => {
                let r = one()?;
                let (shape, d) = self.oty(a)?;
                self.check_result(r, &shape, d)?;
                self.define_elementwise(r, &shape, |g| g.unary(*uop, d, a))
            }
            K::Cmp { op: cop, a, b } => {
                let r = one()?;
                let shape = self.common(&[a, b])?;
                let (da, db) = (self.oty(a)?.1, self.oty(b)?.1);
                if da != db {
                    return Err(bad(format!("comparison of {da} and {db}")));
                }
                self.check_result(r, &shape, DType::I1)?;
                self.define_elementwise(r, &shape, |g| {
                    let (mut x, mut y) = (g.at(a)?, g.at(b)?);
                    if da == DType::I1 {
                        x = g.select(&x, "1", "0");
                        y = g.select(&y, "1", "0");
                    }
                    let o = match cop {
                        CmpOp::Eq => "==",
                        CmpOp::Ne => "!=",
                        CmpOp::Lt => "<",
                        CmpOp::Le => "<=",
                        CmpOp::Gt => ">",
                        CmpOp::Ge => ">=",
                    };
                    Ok(format!("({x} {o} {y})"))
                })
            }
            K::Select { cond, a, b } => {
                let r = one()?;
                let shape = self.common(&[cond, a, b])?;
                let (dc, da, db) = (self.oty(cond)?.1, self.oty(a)?.1, self.oty(b)?.1);
                if dc != DType::I1 || da != db {
                    return Err(bad(format!("select({dc}, {da}, {db})")));
                }
                self.check_result(r, &shape, da)?;
                self.define_elementwise(r, &shape, |g| {
                    Ok(g.select(&g.at(cond)?, &g.at(a)?, &g.at(b)?))
                })
            }
            K::Cast { a, to } => {
                let r = one()?;
                let (shape, from) = self.oty(a)?;
                self.check_result(r, &shape, *to)?;
                self.define_elementwise(r, &shape, |g| g.cast(from, *to, &g.at(a)?))
            }
            K::Range { start, len } => {
                let r = one()?;
                let shape = Some(vec![*len]);
                if self.oty(start)?.1 != DType::I64 {
                    return Err(bad("range start must be i64"));
                }
                self.check_result(r, &shape, DType::I64)?;
                let s = self.scalar(start)?;
                let it = self.idx_t();
                self.define_elementwise(r, &shape, |g| Ok(format!("({s} + {})", g.conv(it, "e"))))?;
                self.known.insert(r.0, Known::Range(s));
                Ok(())
            }
            K::Full {
                value,
                shape,
                dtype,
            } => {
                let r = one()?;
                if self.oty(value)?.1 != *dtype {
                    return Err(bad(format!("full value must be a {dtype} scalar")));
                }
                let sh = Some(shape.clone());
                self.check_result(r, &sh, *dtype)?;
                let s = self.scalar(value)?;
                self.define_elementwise(r, &sh, |_| Ok(s.clone()))?;
                // Only a scalar *value* (not an immediate expression with calls) is cheap to repeat; both are.
                self.known.insert(r.0, Known::Full(s));
                Ok(())
            }
            K::ExpandDims { a, axis } => {
                let r = one()?;
                let (s, d) = self.oty(a)?;
                let mut s = s.unwrap_or_default();
                if usize::from(*axis) > s.len() {
                    return Err(bad(format!("expand_dims axis {axis} of rank {}", s.len())));
                }
                s.insert(usize::from(*axis), 1);
                self.check_result(r, &Some(s), d)?;
                self.copy_same_order(r, a)
            }
            K::Reshape { a, shape } => {
                let r = one()?;
                let (s, d) = self.oty(a)?;
                let n0: u64 = s
                    .unwrap_or_default()
                    .iter()
                    .map(|&x| u64::from(x))
                    .product();
                let n1: u64 = shape.iter().map(|&x| u64::from(x)).product();
                if n0 != n1 {
                    return Err(bad(format!("reshape of {n0} elements to {shape:?}")));
                }
                self.check_result(r, &Some(shape.clone()), d)?;
                self.copy_same_order(r, a)
            }
            K::Broadcast { a, shape } => {
                let r = one()?;
                let (s, d) = self.oty(a)?;
                self.check_result(r, &Some(shape.clone()), d)?;
                self.broadcast(r, a, s, shape)
            }
            K::Transpose { a } => {
                let r = one()?;
                let (s, d) = self.oty(a)?;
                let Some([ra, cb]) = s.as_deref().and_then(|s| <[u32; 2]>::try_from(s).ok()) else {
                    return Err(bad("transpose needs a 2-D tile"));
                };
                self.check_result(r, &Some(vec![cb, ra]), d)?;
                self.declare(r)?;
                let n = Self::name(r);
                let total = u64::from(ra) * u64::from(cb);
                // Output element e = (j, i) of [cb, ra] reads source (i, j) = i * cb + j.
                let src = format!(
                    "((e % {}) * {} + e / {})",
                    self.u(ra.into()),
                    self.u(cb.into()),
                    self.u(ra.into())
                );
                self.gather(a, total, total, &src, &mut |g, val| {
                    g.line(&format!("{n}[k] = {val};"));
                    Ok(())
                })
            }
            K::Reduce { op: rop, a, axis } => {
                let r = one()?;
                self.reduce(r, *rop, a, *axis)
            }
            K::Dot { a, b, acc } => {
                let r = one()?;
                self.dot(r, a, b, acc)
            }
            K::Load {
                param,
                indices,
                fill,
            } => {
                let r = one()?;
                self.load(r, *param, indices, fill.as_ref())
            }
            K::Store {
                param,
                indices,
                value,
            } => {
                if !op.results.is_empty() {
                    return Err(bad("a store has no results"));
                }
                self.store(*param, indices, value)
            }
            K::For {
                lo,
                hi,
                step,
                iv,
                iters,
                inits,
                body,
            } => self.for_(op, lo, hi, step, *iv, iters, inits, body),
            K::If {
                cond,
                then_region,
                else_region,
            } => {
                if self.oty(cond)? != (None, DType::I1) {
                    return Err(bad("`if` condition must be an i1 scalar"));
                }
                let c = self.scalar(cond)?;
                let u = self.uniform(&c);
                for r in &op.results {
                    self.declare(*r)?;
                }
                self.open(&format!("if {u} {{"));
                let ys = self.region(then_region)?;
                self.yield_into(&op.results, ys)?;
                self.indent -= 1;
                self.line("} else {");
                self.indent += 1;
                let ys = self.region(else_region)?;
                self.yield_into(&op.results, ys)?;
                self.close();
                Ok(())
            }
        }
    }

    fn yield_into(&mut self, results: &[KValue], ys: &[KOperand]) -> Result<(), Error> {
        if ys.len() != results.len() {
            return Err(bad(format!(
                "region yields {} values for {} results",
                ys.len(),
                results.len()
            )));
        }
        for (r, y) in results.iter().zip(ys) {
            self.assign(*r, y)?;
        }
        Ok(())
    }

    fn for_(
        &mut self,
        op: &'k KOp,
        lo: &KOperand,
        hi: &KOperand,
        step: &KOperand,
        iv: KValue,
        iters: &[KValue],
        inits: &[KOperand],
        body: &'k KRegion,
    ) -> Result<(), Error> {
        for o in [lo, hi, step] {
            if self.oty(o)? != (None, DType::I64) {
                return Err(bad("loop bounds and step must be i64 scalars"));
            }
        }
        if self.vty(iv)? != &KType::Scalar(DType::I64) {
            return Err(bad("the induction variable must be an i64 scalar"));
        }
        if inits.len() != iters.len() || op.results.len() != iters.len() {
            return Err(bad(format!(
                "loop has {} iteration values, {} initial values and {} results",
                iters.len(),
                inits.len(),
                op.results.len()
            )));
        }
        for (it, init) in iters.iter().zip(inits) {
            self.assign(*it, init)?;
        }
        for r in &op.results {
            self.declare(*r)?;
        }
        self.declare(iv)?;
        let (lo, hi, step) = (self.scalar(lo)?, self.scalar(hi)?, self.scalar(step)?);
        let cur = self.fresh("it");
        let it = self.idx_t();
        self.open("{");
        self.var_(&cur, it, &lo);
        self.open(&format!("if ({step} <= {}) {{", self.zero(it)));
        // The op's location and the step go to the status words, for the contract's error text.
        let (line, col) = self.loc;
        let step_i32 = if self.wgsl() {
            format!("i32({step})")
        } else {
            format!("(int)({step})")
        };
        let f = self.fail(
            ERR_LOOP_STEP,
            &format!("{line}u"),
            &format!("{col}u"),
            &step_i32,
        );
        self.line(&format!("{f};"));
        self.close();
        self.open(if self.wgsl() { "loop {" } else { "for (;;) {" });
        // One uniform decision per iteration: 1 = the loop is done, 2 = the instance's step allowance
        // (status word 8) is used up, 3 = the cancellation word (status word 9, looked at every
        // CANCEL_EVERY steps) is set, 0 = run the body. `loom_steps` counts this instance's iterations.
        let more = format!("{cur} < {hi} && {step} > {}", self.zero(it));
        let over = "loom_steps >= loom_allow";
        let cancel = if self.wgsl() {
            format!(
                "(loom_steps % {CANCEL_EVERY}u) == {}u && atomicLoad(&status[9]) != 0u",
                CANCEL_EVERY - 1
            )
        } else {
            format!(
                // `__syncthreads_or`: one answer for the block (threads may see the host's write at
                // different times, and a thread that returned alone would leave the others at a barrier).
                "(loom_steps % {CANCEL_EVERY}u) == {}u && __syncthreads_or(*(volatile unsigned*)&status[9] != 0u)",
                CANCEL_EVERY - 1
            )
        };
        let code = self.uniform_code(&if self.wgsl() {
            format!("select(select(select(0u, 3u, {cancel}), 2u, {over}), 1u, !({more}))")
        } else {
            format!("(!({more}) ? 1u : (({over}) ? 2u : (({cancel}) ? 3u : 0u)))")
        });
        self.line(&format!("if ({code} == 1u) {{ break; }}"));
        let (line, col) = self.loc;
        let f = self.fail(ERR_BUDGET, &format!("{line}u"), &format!("{col}u"), "0");
        self.line(&format!("if ({code} == 2u) {{ {f}; return; }}"));
        let f = self.fail(ERR_CANCELLED, &format!("{line}u"), &format!("{col}u"), "0");
        self.line(&format!("if ({code} == 3u) {{ {f}; return; }}"));
        self.line(&format!("{} = {cur};", Self::name(iv)));
        let ys = self.region(body)?;
        self.line("loom_steps = loom_steps + 1u;");
        // Yields may read the iteration values (`yield %b, %a`), so they go to the results first.
        self.yield_into(&op.results, ys)?;
        for (it_v, r) in iters.iter().zip(&op.results) {
            self.assign(*it_v, &KOperand::Value(*r))?;
        }
        // i64 overflow of the induction variable ends the loop (the reference stops there too).
        let nx = self.fresh("nx");
        self.let_(&nx, it, &self.wrap_add(&cur, &step));
        self.line(&format!(
            "{cur} = {};",
            self.select(&format!("{nx} < {cur}"), &hi, &nx)
        ));
        self.close();
        self.close();
        for (r, it_v) in op.results.iter().zip(iters) {
            self.assign(*r, &KOperand::Value(*it_v))?;
        }
        Ok(())
    }

    /// Wrapping add of two index registers (CUDA: via unsigned, signed overflow being undefined in C).
    fn wrap_add(&self, a: &str, b: &str) -> String {
        if self.wgsl() {
            format!("({a} + {b})")
        } else {
            format!("((long long)((unsigned long long)({a}) + (unsigned long long)({b})))")
        }
    }

    /// ExpandDims / Reshape: row-major order is unchanged, so the distribution is too: a private copy.
    fn copy_same_order(&mut self, r: KValue, a: &KOperand) -> Result<(), Error> {
        let (s, _) = self.oty(a)?;
        let n = Self::name(r);
        self.declare(r)?;
        match s {
            None => {
                let e = self.at(a)?;
                let cnt = self.vty(r)?.elements();
                self.each(cnt);
                self.line(&format!("{n}[k] = {e};"));
                self.end_each();
                self.known.insert(r.0, Known::Full(e));
            }
            Some(_) => {
                let e = self.at(a)?;
                let cnt = self.vty(r)?.elements();
                self.each(cnt);
                self.line(&format!("{n}[k] = {e};"));
                self.end_each();
                if let KOperand::Value(v) = a {
                    if let Some(kn) = self.known.get(&v.0).cloned() {
                        self.known.insert(r.0, kn);
                    }
                }
            }
        }
        Ok(())
    }

    fn broadcast(
        &mut self,
        r: KValue,
        a: &KOperand,
        src: Option<Vec<u32>>,
        target: &[u32],
    ) -> Result<(), Error> {
        self.declare(r)?;
        let n = Self::name(r);
        let total: u64 = target.iter().map(|&d| u64::from(d)).product();
        let Some(src) = src else {
            let e = self.at(a)?;
            self.each(total);
            self.line(&format!("{n}[k] = {e};"));
            self.end_each();
            return Ok(());
        };
        if src.len() > target.len() {
            return Err(bad(format!("cannot broadcast {src:?} to {target:?}")));
        }
        let off = target.len() - src.len();
        // Source flat index of output element e: sum over kept dims of coordinate * source stride.
        let mut terms = Vec::new();
        let mut src_stride = 1u64;
        let mut out_inner = 1u64;
        for d in (0..target.len()).rev() {
            let t = u64::from(target[d]);
            if d >= off {
                let s = u64::from(src[d - off]);
                if s == t {
                    terms.push(format!(
                        "((e / {}) % {}) * {}",
                        self.u(out_inner),
                        self.u(t.max(1)),
                        self.u(src_stride)
                    ));
                } else if s != 1 {
                    return Err(bad(format!("cannot broadcast {src:?} to {target:?}")));
                }
                src_stride *= s;
            }
            out_inner *= t;
        }
        let idx = if terms.is_empty() {
            "0u".to_string()
        } else {
            format!("({})", terms.join(" + "))
        };
        let n_src = src.iter().map(|&d| u64::from(d)).product();
        self.gather(a, n_src, total, &idx, &mut |g, val| {
            g.line(&format!("{n}[k] = {val};"));
            Ok(())
        })
    }

    fn to_word(&self, d: DType, e: &str) -> Result<String, Error> {
        let rt = self.ty(d)?;
        Ok(match (self.t, rt) {
            (Target::Wgsl, "f32" | "i32") => format!("bitcast<u32>({e})"),
            (Target::Wgsl, "u32") => e.to_string(),
            (Target::Wgsl, _) => format!("select(0u, 1u, {e})"),
            (Target::Cuda, "float") => format!("(unsigned long long)__float_as_uint({e})"),
            (Target::Cuda, "double") => format!("(unsigned long long)__double_as_longlong({e})"),
            (Target::Cuda, "bool") => format!("(unsigned long long)(({e}) ? 1 : 0)"),
            (Target::Cuda, "int") => format!("(unsigned long long)(unsigned)({e})"),
            (Target::Cuda, _) => format!("(unsigned long long)({e})"),
        })
    }

    fn word_to(&self, d: DType, w: &str) -> Result<String, Error> {
        let rt = self.ty(d)?;
        Ok(match (self.t, rt) {
            (Target::Wgsl, "f32" | "i32") => format!("bitcast<{rt}>({w})"),
            (Target::Wgsl, "u32") => w.to_string(),
            (Target::Wgsl, _) => format!("({w} != 0u)"),
            (Target::Cuda, "float") => format!("__uint_as_float((unsigned)({w}))"),
            (Target::Cuda, "double") => format!("__longlong_as_double((long long)({w}))"),
            (Target::Cuda, "bool") => format!("(({w}) != 0ull)"),
            (Target::Cuda, "int") => format!("(int)(unsigned)({w})"),
            (Target::Cuda, "unsigned") => format!("(unsigned)({w})"),
            (Target::Cuda, _) => format!("(long long)({w})"),
        })
    }

    /// Reads element `src_idx(e)` (a u32 expression over `e`, < `n_src`) of a tile for every owned element of
    /// a result of `n_dst` elements, calling `sink(value)` inside the per-element loop. Known ranges and fills
    /// are recomputed; anything else is staged through workgroup scratch in chunks.
    fn gather(
        &mut self,
        src: &KOperand,
        n_src: u64,
        n_dst: u64,
        src_idx: &str,
        sink: &mut dyn FnMut(&mut Self, &str) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let (shape, d) = self.oty(src)?;
        let known = match src {
            KOperand::Value(v) if shape.is_some() => self.known.get(&v.0).cloned(),
            _ => Some(Known::Full(self.at(src)?)),
        };
        match known {
            Some(Known::Full(e)) => {
                self.each(n_dst);
                sink(self, &e)?;
                self.end_each();
                return Ok(());
            }
            Some(Known::Range(s)) => {
                self.each(n_dst);
                let it = self.idx_t();
                let e = format!("({s} + {})", self.conv(it, src_idx));
                sink(self, &e)?;
                self.end_each();
                return Ok(());
            }
            None => {}
        }
        let name = self.at(src)?;
        let c = u64::from(self.scratch);
        let (cu, nu) = (self.u(c), self.u(n_src));
        let c0 = self.fresh("c");
        self.for_u(&c0, "0u", &nu, &cu);
        self.barrier();
        self.each(n_src);
        let w = self.to_word(d, &name)?;
        self.line(&format!(
            "if (e >= {c0} && e < {c0} + {cu}) {{ scratch[e - {c0}] = {w}; }}"
        ));
        self.end_each();
        self.barrier();
        self.each(n_dst);
        let u = self.u32_t();
        self.let_("j", u, src_idx);
        self.open(&format!("if (j >= {c0} && j < {c0} + {cu}) {{"));
        let val = self.word_to(d, &format!("scratch[j - {c0}]"))?;
        sink(self, &val)?;
        self.close();
        self.end_each();
        self.close();
        Ok(())
    }

    fn reduce(&mut self, r: KValue, op: ReduceOp, a: &KOperand, axis: u8) -> Result<(), Error> {
        let (Some(s), d) = self.oty(a)? else {
            return Err(bad("reduce needs a tile"));
        };
        let axis = usize::from(axis);
        if axis >= s.len() {
            return Err(bad(format!("reduce axis {axis} of rank {}", s.len())));
        }
        if d == DType::I1 {
            return Err(bad("reduction of i1"));
        }
        let outer: u64 = s[..axis].iter().map(|&x| u64::from(x)).product();
        let len = u64::from(s[axis]);
        let inner: u64 = s[axis + 1..].iter().map(|&x| u64::from(x)).product();
        let mut rs = s.clone();
        rs.remove(axis);
        if rs.is_empty() {
            rs.push(1);
        }
        self.check_result(r, &Some(rs), d)?;
        self.declare(r)?;
        let n = Self::name(r);
        let res = outer * inner;
        let c = u64::from(self.scratch);
        // Result elements are processed in chunks of RC (all of them when they fit the scratch), and for each
        // chunk the reduced axis in slabs of L positions: scratch[(ri - r0) * L + (p - l0)].
        let rc = res.clamp(1, c);
        let l = (c / rc).min(len).max(1);
        let rt = self.ty(d)?;
        let float = d.is_float();
        let ident = match (op, d) {
            (ReduceOp::Sum, DType::F64) => "0.0".to_string(),
            (ReduceOp::Max, DType::F64) => self.lit(KImm::F64(f64::NEG_INFINITY), DType::F64)?,
            (ReduceOp::Min, DType::F64) => self.lit(KImm::F64(f64::INFINITY), DType::F64)?,
            (ReduceOp::Sum, _) if float => self.lit(KImm::F64(0.0), DType::F32)?,
            (ReduceOp::Max, _) if float => self.lit(KImm::F64(f64::NEG_INFINITY), DType::F32)?,
            (ReduceOp::Min, _) if float => self.lit(KImm::F64(f64::INFINITY), DType::F32)?,
            (ReduceOp::Sum, _) => self.zero_of(d)?,
            (ReduceOp::Max, _) => self.int_extreme(d, false)?,
            (ReduceOp::Min, _) => self.int_extreme(d, true)?,
        };
        self.each(res);
        self.line(&format!("{n}[k] = {ident};"));
        self.end_each();
        let src = self.at(a)?;
        let (lu, lenu, inu, rcu, resu) = (
            self.u(l),
            self.u(len),
            self.u(inner),
            self.u(rc),
            self.u(res),
        );
        let r0 = self.fresh("r");
        let l0 = self.fresh("l");
        self.for_u(&r0, "0u", &resu, &rcu);
        self.for_u(&l0, "0u", &lenu, &lu);
        self.barrier();
        self.each(outer * len * inner);
        let u = self.u32_t();
        self.let_("p", u, &format!("(e / {inu}) % {lenu}"));
        self.let_(
            "ri",
            u,
            &format!("(e / ({lenu} * {inu})) * {inu} + e % {inu}"),
        );
        let w = self.to_word(d, &src)?;
        self.line(&format!(
            "if (ri >= {r0} && ri < {r0} + {rcu} && p >= {l0} && p < {l0} + {lu}) {{ scratch[(ri - {r0}) * {lu} + (p - {l0})] = {w}; }}"
        ));
        self.end_each();
        self.barrier();
        self.each(res);
        self.open(&format!("if (e >= {r0} && e < {r0} + {rcu}) {{"));
        self.var_("acc", rt, &format!("{n}[k]"));
        let hi = format!("min({l0} + {lu}, {lenu})");
        self.for_u("p", &l0, &hi, "1u");
        let x = self.word_to(d, &format!("scratch[(e - {r0}) * {lu} + (p - {l0})]"))?;
        let comb = match (op, float) {
            // Float sums accumulate in the f32 (f64) register and are rounded to f16/bf16 once at the end.
            (ReduceOp::Sum, true) => format!("(acc + {x})"),
            (ReduceOp::Sum, false) => self.wrapping(BinOp::Add, d, "acc", &x),
            (ReduceOp::Max, true) => format!("fmax_nan(acc, {x})"),
            (ReduceOp::Min, true) => format!("fmin_nan(acc, {x})"),
            (ReduceOp::Max, false) => format!("max(acc, {x})"),
            (ReduceOp::Min, false) => format!("min(acc, {x})"),
        };
        self.line(&format!("acc = {comb};"));
        self.close();
        self.line(&format!("{n}[k] = acc;"));
        self.close();
        self.end_each();
        self.close();
        self.close();
        // Sums accumulate in the register type and are rounded/wrapped to the dtype once at the end.
        if matches!(
            d,
            DType::F16 | DType::BF16 | DType::I16 | DType::I8 | DType::U16 | DType::U8
        ) {
            self.each(res);
            let e = self.norm(d, format!("{n}[k]"));
            self.line(&format!("{n}[k] = {e};"));
            self.end_each();
        }
        Ok(())
    }

    fn zero_of(&self, d: DType) -> Result<String, Error> {
        self.int_lit(0, d)
    }

    /// The smallest (`min` = false -> identity of max) or largest value of an integer dtype's register.
    fn int_extreme(&self, d: DType, largest: bool) -> Result<String, Error> {
        let v: i64 = match (d, largest) {
            (DType::I64, false) if self.wgsl() => i32::MIN.into(),
            (DType::I64, true) if self.wgsl() => i32::MAX.into(),
            (DType::I64, false) => i64::MIN,
            (DType::I64, true) => i64::MAX,
            (DType::I32, false) => i32::MIN.into(),
            (DType::I32, true) => i32::MAX.into(),
            (DType::U32, false) => 0,
            (DType::U32, true) => u32::MAX.into(),
            (DType::I16, false) => i16::MIN.into(),
            (DType::I16, true) => i16::MAX.into(),
            (DType::U16, false) => 0,
            (DType::U16, true) => u16::MAX.into(),
            (DType::I8, false) => i8::MIN.into(),
            (DType::I8, true) => i8::MAX.into(),
            (DType::U8, false) => 0,
            (DType::U8, true) => u8::MAX.into(),
            _ => return Err(bad(format!("no integer range for {d}"))),
        };
        let d = if d == DType::I64 && self.wgsl() {
            DType::I32
        } else {
            d
        };
        self.int_lit(v, d)
    }

    fn dot(&mut self, r: KValue, a: &KOperand, b: &KOperand, acc: &KOperand) -> Result<(), Error> {
        let (sa, da) = self.oty(a)?;
        let (sb, db) = self.oty(b)?;
        let (sc, dc) = self.oty(acc)?;
        let (Some([m, ka]), Some([kb, nn])) = (
            sa.as_deref().map(<[u32; 2]>::try_from).and_then(Result::ok),
            sb.as_deref().map(<[u32; 2]>::try_from).and_then(Result::ok),
        ) else {
            return Err(bad("dot operands must be 2-D tiles"));
        };
        if ka != kb || sc.as_deref() != Some(&[m, nn][..]) || dc != DType::F32 {
            return Err(bad(
                "dot shapes do not line up (a [M, K] @ b [K, N] + f32 acc [M, N])",
            ));
        }
        if !da.is_float() || da != db {
            return Err(bad("dot operands must be floats of one type"));
        }
        self.check_result(r, &Some(vec![m, nn]), DType::F32)?;
        self.ty(da)?;
        let (m, k, n) = (u64::from(m), u64::from(ka), u64::from(nn));
        let c = u64::from(self.scratch);
        let kc = (c / (m + n).max(1)).min(k);
        if kc == 0 {
            return Err(Error::Unsupported(format!(
                "a dot with M + N = {} exceeds the {c} words of workgroup scratch",
                m + n
            )));
        }
        self.assign(r, acc)?;
        let out = Self::name(r);
        let (an, bn) = (self.at(a)?, self.at(b)?);
        let (mu, ku, nu, kcu) = (self.u(m), self.u(k), self.u(n), self.u(kc));
        let k0 = self.fresh("k");
        self.for_u(&k0, "0u", &ku, &kcu);
        self.barrier();
        // Stage a[:, k0..k0+KC] at scratch[m * KC + kk] and b[k0..k0+KC, :] after it.
        self.each(m * k);
        let wa = self.to_word(da, &an)?;
        self.line(&format!(
            "if (e % {ku} >= {k0} && e % {ku} < {k0} + {kcu}) {{ scratch[(e / {ku}) * {kcu} + e % {ku} - {k0}] = {wa}; }}"
        ));
        self.end_each();
        self.each(k * n);
        let wb = self.to_word(db, &bn)?;
        self.line(&format!(
            "if (e / {nu} >= {k0} && e / {nu} < {k0} + {kcu}) {{ scratch[{mu} * {kcu} + (e / {nu} - {k0}) * {nu} + e % {nu}] = {wb}; }}"
        ));
        self.end_each();
        self.barrier();
        self.each(m * n);
        let ft = self.ty(DType::F32)?;
        self.var_("s", ft, &format!("{out}[k]"));
        let u = self.u32_t();
        self.let_("mm", u, &format!("e / {nu}"));
        self.let_("nn", u, &format!("e % {nu}"));
        self.for_u("q", "0u", &format!("min({kcu}, {ku} - {k0})"), "1u");
        let x = self.word_to(da, &format!("scratch[mm * {kcu} + q]"))?;
        let y = self.word_to(db, &format!("scratch[{mu} * {kcu} + q * {nu} + nn]"))?;
        let prod = if da == DType::F64 {
            format!("(float)({x} * {y})")
        } else {
            format!("{x} * {y}")
        };
        self.line(&format!("s = s + {prod};"));
        self.close();
        self.line(&format!("{out}[k] = s;"));
        self.end_each();
        self.close();
        self.known.remove(&r.0);
        Ok(())
    }

    /// Resolves a load/store's indices: for a scalar access, declares `off` (index register) and `ok` (bool)
    /// scalars; for a tile access, private arrays `offN[k]`, `okN[k]`. Returns (result shape, off name, ok
    /// name). Checked accesses report the first out-of-range index.
    fn addresses(
        &mut self,
        param: u32,
        indices: &[KIndex],
        checked: bool,
    ) -> Result<(Vec<u32>, String, String), Error> {
        let p = self
            .k
            .params
            .get(param as usize)
            .ok_or_else(|| bad(format!("parameter #{param} does not exist")))?;
        if indices.len() != p.shape.len() {
            return Err(bad(format!(
                "`{}` has {} dimensions but {} indices are given",
                p.name,
                p.shape.len(),
                indices.len()
            )));
        }
        let mut shape = Vec::new();
        for ix in indices {
            match self.oty(ix)? {
                (None, DType::I64) => {}
                (Some(s), DType::I64) if s.len() == 1 => shape.push(s[0]),
                _ => {
                    return Err(bad(format!(
                        "indices of `{}` must be i64 scalars or 1-D i64 tiles",
                        p.name
                    )));
                }
            }
        }
        let total: u64 = shape.iter().map(|&d| u64::from(d)).product();
        if total > loom_ir::kernel::MAX_TILE_ELEMENTS {
            return Err(bad("access tile over the element limit"));
        }
        // Element strides of the buffer (its size was checked against the index range at entry).
        let mut strides = vec![1u64; p.shape.len()];
        for d in (0..p.shape.len().saturating_sub(1)).rev() {
            strides[d] = strides[d + 1].saturating_mul(p.shape[d + 1]);
        }
        let it = self.idx_t();
        let (off, ok) = (self.fresh("off"), self.fresh("ok"));
        let tile = !shape.is_empty();
        if tile {
            let pn = slots(total, self.wg);
            if self.wgsl() {
                let _ = writeln!(self.decls, "    var {off}: array<i32, {pn}>;");
                let _ = writeln!(self.decls, "    var {ok}: array<bool, {pn}>;");
            } else {
                let _ = writeln!(self.decls, "    long long {off}[{pn}];");
                let _ = writeln!(self.decls, "    bool {ok}[{pn}];");
            }
            self.each(total);
            self.line(&format!("{off}[k] = 0; {ok}[k] = true;"));
            self.end_each();
        } else {
            self.var_(&off, it, "0");
            self.var_(&ok, "bool", "true");
        }
        let (o_at, k_at) = if tile {
            (format!("{off}[k]"), format!("{ok}[k]"))
        } else {
            (off.clone(), ok.clone())
        };
        // Result dim of each tile index, for the coordinate of an element.
        let mut rdim = 0usize;
        for (d, ix) in indices.iter().enumerate() {
            let extent = p.shape[d];
            let ext = self.int_lit_idx(extent)?;
            let stride = self.int_lit_idx(strides[d])?;
            let fail = if checked {
                Some((ERR_INDEX, param, d))
            } else {
                None
            };
            let upd = |g: &mut Self, val: &str| -> Result<(), Error> {
                let x = g.fresh("x");
                let it = g.idx_t();
                g.let_(&x, it, val);
                g.let_("inr", "bool", &format!("{x} >= 0 && {x} < {ext}"));
                g.line(&format!(
                    "{o_at} = {o_at} + {};",
                    g.select("inr", &format!("{x} * {stride}"), "0")
                ));
                g.line(&format!("{k_at} = {k_at} && inr;"));
                if let Some((code, p, d)) = fail {
                    let xi = if g.wgsl() {
                        x.to_string()
                    } else {
                        format!("(int){x}")
                    };
                    let f = g.fail(code, &g.u(p.into()), &g.u(d as u64), &xi);
                    g.line(&format!("if (!inr) {{ {f}; }}"));
                }
                Ok(())
            };
            match self.oty(ix)? {
                (None, _) => {
                    let s = self.scalar(ix)?;
                    if tile {
                        self.each(total);
                        upd(self, &s)?;
                        self.end_each();
                    } else {
                        self.open("{");
                        upd(self, &s)?;
                        self.close();
                    }
                }
                (Some(s), _) => {
                    let len = u64::from(s[0]);
                    let inner: u64 = shape[rdim + 1..].iter().map(|&x| u64::from(x)).product();
                    let coord = format!("((e / {}) % {})", self.u(inner), self.u(len.max(1)));
                    self.gather(ix, len, total, &coord, &mut |g, v| upd(g, v))?;
                    rdim += 1;
                }
            }
        }
        Ok((shape, off, ok))
    }

    /// An index-typed literal for a compile-time extent or stride (checked against the WGSL i32 emulation).
    fn int_lit_idx(&self, x: u64) -> Result<String, Error> {
        let x = i64::try_from(x).map_err(|_| bad(format!("extent {x} exceeds i64")))?;
        if self.wgsl() && i32::try_from(x).is_err() {
            return Err(Error::Unsupported(format!(
                "extent {x} exceeds the i32 range WGSL emulates i64 index math with"
            )));
        }
        self.int_lit(x, if self.wgsl() { DType::I32 } else { DType::I64 })
    }

    fn load(
        &mut self,
        r: KValue,
        param: u32,
        indices: &[KIndex],
        fill: Option<&KOperand>,
    ) -> Result<(), Error> {
        let p = self
            .k
            .params
            .get(param as usize)
            .ok_or_else(|| bad(format!("parameter #{param} does not exist")))?;
        if p.access == Access::Write {
            return Err(bad(format!("load from write-only parameter `{}`", p.name)));
        }
        let d = if p.dtype.is_quantized() {
            DType::F32
        } else {
            p.dtype
        };
        if let Some(f) = fill {
            if self.oty(f)? != (None, d) {
                return Err(bad(format!("load fill must be a {d} scalar")));
            }
        }
        self.ty(p.dtype).or_else(|e| {
            if p.dtype.is_quantized() {
                Ok("")
            } else {
                Err(e)
            }
        })?;
        let (shape, off, ok) = self.addresses(param, indices, fill.is_none())?;
        let sh = if shape.is_empty() {
            None
        } else {
            Some(shape.clone())
        };
        self.check_result(r, &sh, d)?;
        self.declare(r)?;
        self.loaded[param as usize] = true;
        let n = Self::name(r);
        // A checked load's failing element reads zero (never memory); a masked one reads the fill.
        let fillv = match fill {
            Some(f) => self.at(f)?,
            None => self.default_of(d)?,
        };
        let rd = |g: &Self, o: &str| {
            if g.wgsl() {
                format!("rd{param}({o})")
            } else {
                format!("rd{param}(b{param}, {o})")
            }
        };
        if sh.is_none() {
            let v = rd(self, &off);
            self.line(&format!("{n} = {fillv};"));
            self.line(&format!("if ({ok}) {{ {n} = {v}; }}"));
        } else {
            self.each(shape.iter().map(|&x| u64::from(x)).product::<u64>());
            let v = rd(self, &format!("{off}[k]"));
            self.line(&format!("{n}[k] = {fillv};"));
            self.line(&format!("if ({ok}[k]) {{ {n}[k] = {v}; }}"));
            self.end_each();
        }
        self.known.remove(&r.0);
        Ok(())
    }

    fn default_of(&self, d: DType) -> Result<String, Error> {
        if d.is_float() {
            self.lit(KImm::F64(0.0), d)
        } else if d == DType::I1 {
            Ok("false".into())
        } else {
            self.int_lit(0, d)
        }
    }

    fn store(&mut self, param: u32, indices: &[KIndex], value: &KOperand) -> Result<(), Error> {
        let p = self
            .k
            .params
            .get(param as usize)
            .ok_or_else(|| bad(format!("parameter #{param} does not exist")))?;
        if p.access == Access::Read {
            return Err(bad(format!("store to read-only parameter `{}`", p.name)));
        }
        if p.dtype.is_quantized() {
            return Err(bad(format!("store to quantised `{}`", p.name)));
        }
        let (pd, pname) = (p.dtype, p.name.clone());
        let (shape, off, ok) = self.addresses(param, indices, false)?;
        let (vs, vd) = self.oty(value)?;
        let want = if shape.is_empty() {
            None
        } else {
            Some(shape.clone())
        };
        if vd != pd || vs != want {
            return Err(bad(format!(
                "store to `{pname}` needs a {pd} {want:?} value, got {vd} {vs:?}"
            )));
        }
        self.stored[param as usize] = true;
        let wr = |g: &Self, o: &str, v: &str| {
            if g.wgsl() {
                format!("wr{param}({o}, {v});")
            } else {
                format!("wr{param}(b{param}, {o}, {v});")
            }
        };
        if want.is_none() {
            // One invocation writes a scalar (all computed the same value).
            let v = self.at(value)?;
            let w = wr(self, &off, &v);
            self.line(&format!("if (lid == 0u && {ok}) {{ {w} }}"));
        } else {
            let total = shape.iter().map(|&x| u64::from(x)).product();
            self.each(total);
            let v = self.at(value)?;
            let w = wr(self, &format!("{off}[k]"), &v);
            self.line(&format!("if ({ok}[k]) {{ {w} }}"));
            self.end_each();
        }
        Ok(())
    }

    // ---- elementwise math ---------------------------------------------------------------------------------

    /// `a op b` with integer wrapping at the dtype's width (CUDA: signed arithmetic via unsigned).
    fn wrapping(&self, op: BinOp, d: DType, x: &str, y: &str) -> String {
        let o = match op {
            BinOp::Add => "+",
            BinOp::Sub => "-",
            _ => "*",
        };
        if d.is_float() || self.wgsl() || d == DType::U32 {
            return self.norm(d, format!("({x} {o} {y})"));
        }
        let (s, u) = if d == DType::I64 {
            ("long long", "unsigned long long")
        } else {
            ("int", "unsigned")
        };
        self.norm(d, format!("(({s})(({u})({x}) {o} ({u})({y})))"))
    }

    fn binary(&self, op: BinOp, d: DType, a: &KOperand, b: &KOperand) -> Result<String, Error> {
        let (x, y) = (self.at(a)?, self.at(b)?);
        let float = d.is_float();
        let bits: u32 = match d {
            DType::I64 if !self.wgsl() => 64,
            DType::I16 | DType::U16 => 16,
            DType::I8 | DType::U8 => 8,
            _ => 32,
        };
        let ty = self.ty(d)?;
        let suffix = if self.wgsl() { ty } else { "" };
        Ok(match op {
            BinOp::Add | BinOp::Sub | BinOp::Mul if d != DType::I1 => self.wrapping(op, d, &x, &y),
            BinOp::Div if float => self.norm(d, format!("({x} / {y})")),
            BinOp::Rem if float => {
                let f = if d == DType::F64 {
                    "fmod"
                } else if self.wgsl() {
                    "frem"
                } else {
                    "fmodf"
                };
                self.norm(d, format!("{f}({x}, {y})"))
            }
            BinOp::Min if float => self.norm(d, format!("fmin_nan({x}, {y})")),
            BinOp::Max if float => self.norm(d, format!("fmax_nan({x}, {y})")),
            BinOp::Div | BinOp::Rem if d != DType::I1 => {
                let f = if op == BinOp::Div { "idiv" } else { "irem" };
                // The op's location goes to the status words, for the contract's `DivisionByZero` error.
                let (line, col) = self.loc;
                let h = if self.wgsl() {
                    format!("{f}_{suffix}({x}, {y}, {line}u, {col}u)")
                } else {
                    format!("{f}({x}, {y}, status, {line}u, {col}u)")
                };
                self.norm(d, h)
            }
            BinOp::Min | BinOp::Max if d != DType::I1 => {
                let f = if op == BinOp::Min { "min" } else { "max" };
                format!("{f}({x}, {y})")
            }
            BinOp::And if d == DType::I1 => format!("({x} && {y})"),
            BinOp::Or if d == DType::I1 => format!("({x} || {y})"),
            BinOp::Xor if d == DType::I1 => format!("({x} != {y})"),
            BinOp::And if !float => format!("({x} & {y})"),
            BinOp::Or if !float => format!("({x} | {y})"),
            BinOp::Xor if !float => format!("({x} ^ {y})"),
            BinOp::Shl | BinOp::Shr if !float && d != DType::I1 => {
                // The amount is taken modulo the width, as the reference does.
                let amt = if self.wgsl() {
                    format!("(bitcast<u32>({y}) % {bits}u)")
                } else {
                    format!("((unsigned)({y}) % {bits}u)")
                };
                if op == BinOp::Shl {
                    if self.wgsl() || d == DType::U32 {
                        self.norm(d, format!("({x} << {amt})"))
                    } else {
                        let (s, u) = if d == DType::I64 {
                            ("long long", "unsigned long long")
                        } else {
                            ("int", "unsigned")
                        };
                        self.norm(d, format!("(({s})(({u})({x}) << {amt}))"))
                    }
                } else {
                    format!("({x} >> {amt})")
                }
            }
            _ => return Err(bad(format!("`{op:?}` is not defined on {d}"))),
        })
    }

    fn unary(&self, op: UnOp, d: DType, a: &KOperand) -> Result<String, Error> {
        let x = self.at(a)?;
        let float = d.is_float();
        let cuda_f = |f32n: &'static str, f64n: &'static str| -> &'static str {
            if d == DType::F64 { f64n } else { f32n }
        };
        let w = self.wgsl();
        Ok(match op {
            UnOp::Neg if float => format!("(-{x})"),
            UnOp::Abs if float => {
                let f = if w { "abs" } else { cuda_f("fabsf", "fabs") };
                format!("{f}({x})")
            }
            UnOp::Not if d == DType::I1 => format!("(!{x})"),
            UnOp::Not if !float => self.norm(d, format!("(~{x})")),
            UnOp::Neg if d == DType::U32 => format!("(0u - {x})"),
            UnOp::Neg if !float && d != DType::I1 => {
                self.wrapping(BinOp::Sub, d, &self.zero_of(d)?, &x)
            }
            UnOp::Abs if !float && d != DType::I1 => {
                if d == DType::U32 {
                    x
                } else {
                    let neg = self.wrapping(BinOp::Sub, d, &self.zero_of(d)?, &x);
                    let z = self.zero_of(d)?;
                    self.norm(d, self.select(&format!("{x} < {z}"), &neg, &x))
                }
            }
            UnOp::Exp if float => self.norm(
                d,
                format!("{}({x})", if w { "exp" } else { cuda_f("expf", "exp") }),
            ),
            UnOp::Log if float => self.norm(
                d,
                format!("{}({x})", if w { "log" } else { cuda_f("logf", "log") }),
            ),
            UnOp::Tanh if float => self.norm(
                d,
                format!(
                    "{}({x})",
                    if w { "tanh_s" } else { cuda_f("tanhf", "tanh") }
                ),
            ),
            UnOp::Erf if float => self.norm(
                d,
                format!("{}({x})", if w { "erf_s" } else { cuda_f("erff", "erf") }),
            ),
            UnOp::Sqrt if float => self.norm(
                d,
                format!("{}({x})", if w { "sqrt" } else { cuda_f("sqrtf", "sqrt") }),
            ),
            UnOp::Rsqrt if float => {
                if w {
                    self.norm(d, format!("(1.0f / sqrt({x}))"))
                } else if d == DType::F64 {
                    format!("(1.0 / sqrt({x}))")
                } else {
                    self.norm(d, format!("(1.0f / sqrtf({x}))"))
                }
            }
            UnOp::Sigmoid if float => {
                if d == DType::F64 {
                    format!("(1.0 / (1.0 + exp(-{x})))")
                } else if w {
                    self.norm(d, format!("(1.0f / (1.0f + exp(-{x})))"))
                } else {
                    self.norm(d, format!("(1.0f / (1.0f + expf(-{x})))"))
                }
            }
            _ => return Err(bad(format!("`{op:?}` is not defined on {d}"))),
        })
    }

    fn cast(&self, from: DType, to: DType, x: &str) -> Result<String, Error> {
        if to.is_quantized() || from.is_quantized() {
            return Err(bad(format!("cast between {from} and {to}")));
        }
        let tt = self.ty(to)?;
        self.ty(from)?;
        if to == DType::I1 {
            return Ok(if from == DType::I1 {
                x.to_string()
            } else if from.is_float() {
                format!("({x} != {})", self.lit(KImm::F64(0.0), from)?)
            } else {
                format!("({x} != {})", self.zero_of(from)?)
            });
        }
        if from == DType::I1 {
            let one = self.default_of(to)?.replace('0', "1");
            let (one, zero) = if to.is_float() {
                (self.lit(KImm::F64(1.0), to)?, self.lit(KImm::F64(0.0), to)?)
            } else {
                let _ = one;
                (self.int_lit(1, to)?, self.int_lit(0, to)?)
            };
            return Ok(self.select(x, &one, &zero));
        }
        if from.is_float() && to.is_float() {
            return Ok(self.norm(to, self.conv(tt, x)));
        }
        if !from.is_float() && to.is_float() {
            return Ok(self.norm(to, self.conv(tt, x)));
        }
        if from.is_float() {
            // Truncate toward zero, saturate, NaN -> 0.
            let (lo, hi): (i64, i64) = match to {
                DType::I64 if self.wgsl() => (i32::MIN.into(), i32::MAX.into()),
                DType::I64 => (i64::MIN, i64::MAX),
                DType::I32 => (i32::MIN.into(), i32::MAX.into()),
                DType::U32 => (0, u32::MAX.into()),
                DType::I16 => (i16::MIN.into(), i16::MAX.into()),
                DType::U16 => (0, u16::MAX.into()),
                DType::I8 => (i8::MIN.into(), i8::MAX.into()),
                _ => (0, u8::MAX.into()),
            };
            let lod = if to == DType::I64 && self.wgsl() {
                DType::I32
            } else {
                to
            };
            let (lol, hil) = (self.int_lit(lo, lod)?, self.int_lit(hi, lod)?);
            let fl = |v: i64| -> Result<String, Error> {
                // The float bounds: lo is exact (a power of two or 0); hi + 1 is a power of two.
                if from == DType::F64 {
                    Ok(format!("{:?}", v as f64))
                } else {
                    self.lit(KImm::F64(v as f64), DType::F32)
                }
            };
            let (lof, hif) = (fl(lo)?, fl(hi.saturating_add(1))?);
            let conv = self.conv(tt, x);
            let sat = self.select(&format!("{x} >= {hif}"), &hil, &conv);
            let sat = self.select(&format!("{x} <= {lof}"), &lol, &sat);
            let zero = self.int_lit(0, lod)?;
            return Ok(self.select(&format!("{x} != {x}"), &zero, &sat));
        }
        // Integer to integer: two's complement wrap.
        let ft = self.ty(from)?;
        let e = if ft == tt {
            x.to_string()
        } else if self.wgsl() {
            format!("bitcast<{tt}>({x})")
        } else {
            self.conv(tt, x)
        };
        Ok(self.norm(to, e))
    }
}
