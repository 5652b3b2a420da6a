//! Specialization: a kernel or stage with bound template values -> the portable IR (`loom_ir::kernel`).
//!
//! Specialization and type checking are one pass: every expression evaluates either to a compile-time value
//! ([`CV`]: integers, floats, booleans, strings, dtypes, shapes, kfunc references) or to an IR value with a
//! concrete [`KType`]. Operations on compile-time values fold (`cdiv(M, BM)`, `str.eq(ACT, "gelu")`), `if` on a
//! compile-time condition keeps only the taken branch, kfunc calls are inlined, and everything else is emitted
//! as exactly typed IR (literals take the dtype of the other operand; tiles of different but compatible shapes
//! get explicit `Broadcast`s; nothing else converts implicitly).
//!
//! Kernel specializations are memoised by their specialized name (`module.kernel<P=V,...>`, every template
//! parameter in declaration order), which is also how a stage deduplicates its kernels.

use crate::ast::*;
use crate::parse::{ItemSource, parse_item};
use loom_compiler::Catalog;
use loom_ir::kernel::*;
use loom_ir::{Loc, TValue};
use loom_syntax::Span;
use loom_syntax::ast::{ConstExpr, TParamKind};
use std::collections::HashMap;
use std::rc::Rc;

mod index;

/// Deepest kfunc inlining (a kfunc calling itself is reported, not expanded forever).
pub const MAX_INLINE_DEPTH: usize = 32;
/// Most IR ops one kernel may have after inlining.
pub const MAX_KERNEL_OPS: usize = 1 << 16;

/// A compile-time value.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum CV {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    DType(DType),
    Shape(Vec<i64>),
    /// A kfunc: (catalog module, name).
    Func(usize, String),
}

impl CV {
    fn describe(&self) -> String {
        match self {
            CV::Int(v) => format!("the integer {v}"),
            CV::Float(v) => format!("the float {v:?}"),
            CV::Bool(b) => format!("{b}"),
            CV::Str(s) => format!("the string {s:?}"),
            CV::DType(d) => format!("the dtype {d}"),
            CV::Shape(s) => format!("the shape {s:?}"),
            CV::Func(_, n) => format!("the kfunc @{n}"),
        }
    }
}

/// A value during specialization.
#[derive(Clone, Debug)]
enum Val {
    C(CV),
    D(KOperand, KType),
    /// A kernel parameter (index into the kernel's params): only usable as `%buf[...]`.
    Buf(u32),
    /// A stage buffer.
    Stage(BufRef),
}

type R<T> = Result<T, String>;

/// A parsed device item with where it came from.
#[derive(Debug)]
pub(crate) struct Parsed {
    pub(crate) module: usize,
    pub(crate) item: Item,
    pub(crate) src: ItemSource,
}

/// State shared by one specialization request: the catalog, parsed items and memoised kernels.
pub(crate) struct Spec<'c> {
    pub(crate) catalog: &'c Catalog,
    parsed: HashMap<(usize, String), Rc<Parsed>>,
    kernels: HashMap<String, Kernel>,
}

impl<'c> Spec<'c> {
    pub(crate) fn new(catalog: &'c Catalog) -> Spec<'c> {
        Spec {
            catalog,
            parsed: HashMap::new(),
            kernels: HashMap::new(),
        }
    }

    fn module_name(&self, m: usize) -> String {
        self.catalog
            .entries()
            .get(m)
            .map_or_else(|| "?".into(), |e| e.module.name.clone())
    }

    /// Parses (once) item `name` of module `m`.
    pub(crate) fn item(&mut self, m: usize, name: &str) -> Result<Rc<Parsed>, Vec<String>> {
        if let Some(p) = self.parsed.get(&(m, name.to_string())) {
            return Ok(p.clone());
        }
        let Some(entry) = self.catalog.entries().get(m) else {
            return Err(vec![format!("error: no catalog module #{m}")]);
        };
        let Some(d) = entry.module.device.iter().find(|d| d.name == name) else {
            return Err(vec![format!(
                "{}: error: module @{} has no device item @{name}",
                entry.module.file, entry.module.name
            )]);
        };
        let file = entry
            .source
            .as_ref()
            .map_or(entry.module.file.as_str(), |s| s.name.as_str());
        let (item, src) = parse_item(file, d.loc.line, d.loc.col, &d.text)?;
        let p = Rc::new(Parsed {
            module: m,
            item,
            src,
        });
        self.parsed.insert((m, name.to_string()), p.clone());
        Ok(p)
    }

    /// Resolves `@sym` (kernel or kfunc) as seen from module `from`, with the host linker's rules: the same
    /// module first, then the one catalog module exporting it; `@m.name` names module `m`. Private items of
    /// other modules are not visible; two exporters are ambiguous.
    fn resolve(&self, from: usize, sym: &str, kind: DeviceKind) -> Result<(usize, String), String> {
        let what = kind.keyword();
        let has = |m: usize, n: &str| {
            self.catalog.entries()[m]
                .module
                .device
                .iter()
                .find(|d| d.name == n && d.kind == kind)
                .cloned()
        };
        if let Some(i) = sym.rfind('.') {
            let (prefix, name) = (&sym[..i], &sym[i + 1..]);
            if let Some(m) = self.catalog.find(prefix) {
                return match has(m, name) {
                    Some(d) if d.exported || m == from => Ok((m, name.to_string())),
                    Some(_) => Err(format!(
                        "{what} @{name} is private to module @{prefix} and not visible from module @{}; mark it `export`",
                        self.module_name(from)
                    )),
                    None => Err(format!("module @{prefix} has no {what} @{name}")),
                };
            }
        }
        if has(from, sym).is_some() {
            return Ok((from, sym.to_string()));
        }
        let mut exported = Vec::new();
        let mut private = Vec::new();
        for (m, e) in self.catalog.entries().iter().enumerate() {
            if m == from {
                continue;
            }
            if let Some(d) = e
                .module
                .device
                .iter()
                .find(|d| d.name == sym && d.kind == kind)
            {
                if d.exported {
                    exported.push(m)
                } else {
                    private.push(m)
                }
            }
        }
        match exported.as_slice() {
            [m] => Ok((*m, sym.to_string())),
            [] => match private.first() {
                Some(&m) => Err(format!(
                    "{what} @{sym} is private to module @{} and not visible from module @{}; mark it `export`",
                    self.module_name(m),
                    self.module_name(from)
                )),
                None => Err(format!(
                    "unknown {what} @{sym}: no such {what} in module @{} or exported by the catalog",
                    self.module_name(from)
                )),
            },
            ms => Err(format!(
                "{what} @{sym} is ambiguous: exported by {}; qualify it as @module.{sym}",
                ms.iter()
                    .map(|&m| format!("@{}", self.module_name(m)))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }
}

// ---- template parameters ------------------------------------------------------------------------------------

fn kind_name(k: &TParamKind) -> &'static str {
    match k {
        TParamKind::I64 => "i64",
        TParamKind::Bool => "bool",
        TParamKind::Str => "str",
        TParamKind::DType => "dtype",
        TParamKind::Shape => "shape",
        TParamKind::Func { .. } => "func",
    }
}

fn kind_ok(k: &TParamKind, v: &CV) -> bool {
    matches!(
        (k, v),
        (TParamKind::I64, CV::Int(_))
            | (TParamKind::Bool, CV::Bool(_))
            | (TParamKind::Str, CV::Str(_))
            | (TParamKind::DType, CV::DType(_))
            | (TParamKind::Shape, CV::Shape(_))
            | (TParamKind::Func { .. }, CV::Func(..))
    )
}

pub(crate) fn tvalue_to_cv(v: &TValue) -> Option<CV> {
    Some(match v {
        TValue::I64(i) => CV::Int(*i),
        TValue::Bool(b) => CV::Bool(*b),
        TValue::Str(s) => CV::Str(s.clone()),
        TValue::DType(d) => CV::DType(DType::from_name(d)?),
        TValue::Shape(s) => CV::Shape(s.clone()),
        TValue::Func(_) => return None,
    })
}

pub(crate) fn cv_text(v: &CV) -> String {
    match v {
        CV::Int(i) => i.to_string(),
        CV::Float(f) => format!("{f:?}"),
        CV::Bool(b) => b.to_string(),
        CV::Str(s) => format!("{s:?}"),
        CV::DType(d) => d.to_string(),
        CV::Shape(s) => format!(
            "[{}]",
            s.iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        CV::Func(_, n) => format!("@{n}"),
    }
}

/// Binds an item's template parameters: given values (by name) first, then defaults in order (which may use
/// earlier parameters). `given` names must all exist.
fn bind_tparams(
    sp: &mut Spec<'_>,
    p: &Parsed,
    given: Vec<(String, CV, Span)>,
    at: &dyn Fn(Span, String) -> String,
    call_span: Span,
) -> R<Vec<(String, CV)>> {
    let what = format!("{} @{}", p.item.kind.keyword(), p.item.name.text);
    for (n, _, s) in &given {
        if !p.item.tparams.iter().any(|t| t.name.text == *n) {
            let names: Vec<&str> = p
                .item
                .tparams
                .iter()
                .map(|t| t.name.text.as_str())
                .collect();
            return Err(at(
                *s,
                format!(
                    "{what} has no template parameter `{n}` (it has: {})",
                    names.join(", ")
                ),
            ));
        }
    }
    let mut out: Vec<(String, CV)> = Vec::new();
    let mut missing = Vec::new();
    for tp in &p.item.tparams {
        let v = if let Some((_, v, s)) = given.iter().find(|(n, _, _)| *n == tp.name.text) {
            if !kind_ok(&tp.kind, v) {
                return Err(at(
                    *s,
                    format!(
                        "template parameter `{}` of {what} is a {}, found {}",
                        tp.name.text,
                        kind_name(&tp.kind),
                        v.describe()
                    ),
                ));
            }
            v.clone()
        } else if let Some(d) = &tp.default {
            let env: HashMap<String, CV> = out.iter().cloned().collect();
            let v = const_eval(sp, p, d, &env).map_err(|m| p.src.error(d.span(), m))?;
            if !kind_ok(&tp.kind, &v) {
                return Err(p.src.error(
                    d.span(),
                    format!(
                        "the default of `{}` is {}, not a {}",
                        tp.name.text,
                        v.describe(),
                        kind_name(&tp.kind)
                    ),
                ));
            }
            v
        } else {
            missing.push(tp.name.text.clone());
            continue;
        };
        out.push((tp.name.text.clone(), v));
    }
    if !missing.is_empty() {
        return Err(at(
            call_span,
            format!(
                "missing template value{} for {}: {}",
                if missing.len() > 1 { "s" } else { "" },
                what,
                missing
                    .iter()
                    .map(|m| format!("`{m}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    Ok(out)
}

/// Evaluates a template default (host constant-expression syntax).
fn const_eval(
    sp: &Spec<'_>,
    p: &Parsed,
    e: &ConstExpr,
    env: &HashMap<String, CV>,
) -> Result<CV, String> {
    Ok(match e {
        ConstExpr::Int(v, _) => CV::Int(*v),
        ConstExpr::Float(v, _) => CV::Float(*v),
        ConstExpr::Bool(v, _) => CV::Bool(*v),
        ConstExpr::Str(s, _) => CV::Str(s.clone()),
        ConstExpr::List(items, _) => {
            let mut dims = Vec::new();
            for i in items {
                match const_eval(sp, p, i, env)? {
                    CV::Int(d) => dims.push(d),
                    other => {
                        return Err(format!(
                            "shape dims must be integers, found {}",
                            other.describe()
                        ));
                    }
                }
            }
            CV::Shape(dims)
        }
        ConstExpr::Word(n) => {
            word_value(&n.text, env).ok_or_else(|| format!("unknown name `{}`", n.text))?
        }
        ConstExpr::Symbol(n) => {
            let (m, name) = sp.resolve(p.module, &n.text, DeviceKind::Kfunc)?;
            CV::Func(m, name)
        }
        ConstExpr::Neg(inner, _) => match const_eval(sp, p, inner, env)? {
            CV::Int(v) => CV::Int(v.checked_neg().ok_or("integer overflow")?),
            CV::Float(v) => CV::Float(-v),
            other => return Err(format!("cannot negate {}", other.describe())),
        },
        ConstExpr::Binary { op, lhs, rhs, .. } => fold_arith(
            *op,
            &const_eval(sp, p, lhs, env)?,
            &const_eval(sp, p, rhs, env)?,
        )?,
        ConstExpr::Error(_) => return Err("invalid constant expression".into()),
    })
}

fn word_value(w: &str, env: &HashMap<String, CV>) -> Option<CV> {
    env.get(w)
        .cloned()
        .or_else(|| DType::from_name(w).map(CV::DType))
}

fn fold_arith(op: char, a: &CV, b: &CV) -> Result<CV, String> {
    match (a, b) {
        (CV::Int(a), CV::Int(b)) => {
            let r = match op {
                '+' => a.checked_add(*b),
                '-' => a.checked_sub(*b),
                '*' => a.checked_mul(*b),
                '/' | '%' if *b == 0 => {
                    return Err("division by zero in a constant expression".into());
                }
                '/' => a.checked_div(*b),
                '%' => a.checked_rem(*b),
                _ => None,
            };
            r.map(CV::Int)
                .ok_or_else(|| "integer overflow in a constant expression".into())
        }
        (CV::Float(_) | CV::Int(_), CV::Float(_) | CV::Int(_)) => {
            let f = |v: &CV| match v {
                CV::Int(i) => *i as f64,
                CV::Float(f) => *f,
                _ => 0.0,
            };
            let (a, b) = (f(a), f(b));
            Ok(CV::Float(match op {
                '+' => a + b,
                '-' => a - b,
                '*' => a * b,
                '/' => a / b,
                _ => return Err("`%` needs integers".into()),
            }))
        }
        _ => Err(format!(
            "arithmetic needs numbers, found {} and {}",
            a.describe(),
            b.describe()
        )),
    }
}

// ---- kernels ------------------------------------------------------------------------------------------------

/// Specializes kernel `name` of module `m` with template values `given` (`(name, value, span for errors)`).
/// Returns the memoised kernel.
pub(crate) fn kernel(
    sp: &mut Spec<'_>,
    m: usize,
    name: &str,
    given: Vec<(String, CV, Span)>,
    at: &dyn Fn(Span, String) -> String,
    call_span: Span,
) -> R<Kernel> {
    let p = sp.item(m, name).map_err(|e| e.join(""))?;
    if p.item.kind != DeviceKind::Kernel {
        return Err(at(
            call_span,
            format!("@{name} is a {}, not a kernel", p.item.kind.keyword()),
        ));
    }
    let tvals = bind_tparams(sp, &p, given, at, call_span)?;
    // The name is the memo key: a kfunc of another module is qualified (`F=@motifs.gemm.silu`), so that two
    // same-named kfuncs of different modules give two kernels.
    let spec_name = format!(
        "{}.{}<{}>",
        sp.module_name(m),
        name,
        tvals
            .iter()
            .map(|(n, v)| match v {
                CV::Func(fm, f) if *fm != m => format!("{n}=@{}.{f}", sp.module_name(*fm)),
                v => format!("{n}={}", cv_text(v)),
            })
            .collect::<Vec<_>>()
            .join(",")
    );
    if let Some(k) = sp.kernels.get(&spec_name) {
        return Ok(k.clone());
    }
    let Header::Kernel { grid, params } = &p.item.header else {
        return Err(at(call_span, format!("@{name} is not a kernel")));
    };
    let env: HashMap<String, CV> = tvals.iter().cloned().collect();
    let file = sp.catalog.entries()[m].module.file.clone();
    let mut cx = KCx::new(sp, p.clone(), env);
    let mut kparams = Vec::new();
    for (i, b) in params.iter().enumerate() {
        let access = match b.mode.text.as_str() {
            "read" => Access::Read,
            "write" => Access::Write,
            "readwrite" => Access::ReadWrite,
            other => {
                return Err(cx.err(
                    b.mode.span,
                    format!("unknown access mode `{other}`: expected read, write or readwrite"),
                ));
            }
        };
        let (dtype, shape) = cx.buffer_type(&b.dtype, &b.dims)?;
        if kparams.iter().any(|k: &KParam| k.name == b.name.text) {
            return Err(cx.err(
                b.name.span,
                format!("parameter %{} is declared twice", b.name.text),
            ));
        }
        kparams.push(KParam {
            name: b.name.text.clone(),
            dtype,
            shape,
            access,
        });
        cx.bind(&b.name, Val::Buf(i as u32))?;
    }
    let mut g = [1u64; 3];
    for (i, e) in grid.iter().enumerate() {
        match cx.const_of(e)? {
            CV::Int(v) if v >= 0 => g[i] = v as u64,
            other => {
                return Err(cx.err(
                    e.span(),
                    format!(
                        "a grid dimension must be a non-negative integer, found {}",
                        other.describe()
                    ),
                ));
            }
        }
    }
    cx.params = kparams.clone();
    // why: values and parameters print in one namespace (`%y`); keep value names distinct from parameters
    for k in &kparams {
        cx.names.insert(k.name.clone(), 1);
    }
    cx.regions.push(Vec::new());
    let body = p.item.body.clone();
    let y = cx.block(&body)?;
    if let Some((_, span)) = y {
        if !matches!(body.stmts.last(), Some(Stmt::Yield { values, .. }) if values.is_empty()) {
            return Err(cx.err(span, "a kernel body returns nothing"));
        }
    }
    let mut ops = cx.regions.pop().unwrap_or_default();
    ops.push(KOp {
        kind: KOpKind::Yield(Vec::new()),
        results: Vec::new(),
        loc: cx.loc(body.span),
    });
    let k = Kernel {
        name: spec_name.clone(),
        params: kparams,
        grid: g,
        values: cx.values,
        body: KRegion { ops },
        file,
    };
    sp.kernels.insert(spec_name, k.clone());
    Ok(k)
}

/// One kernel being built (kfunc bodies are inlined into it with their own frame).
struct KCx<'s, 'c> {
    sp: &'s mut Spec<'c>,
    /// The item whose text is being evaluated (the kernel, or an inlined kfunc).
    cur: Rc<Parsed>,
    env: HashMap<String, CV>,
    scopes: Vec<HashMap<String, Val>>,
    values: Vec<KValueDef>,
    names: HashMap<String, u32>,
    regions: Vec<Vec<KOp>>,
    params: Vec<KParam>,
    inline_depth: usize,
    nops: usize,
}

/// The elementwise binary operation named `opn`.
fn bin_op(opn: &str) -> Option<BinOp> {
    Some(match opn {
        "add" => BinOp::Add,
        "sub" => BinOp::Sub,
        "mul" => BinOp::Mul,
        "div" => BinOp::Div,
        "rem" => BinOp::Rem,
        "min" => BinOp::Min,
        "max" => BinOp::Max,
        "and" => BinOp::And,
        "or" => BinOp::Or,
        "xor" => BinOp::Xor,
        "shl" => BinOp::Shl,
        "shr" => BinOp::Shr,
        _ => return None,
    })
}

/// The elementwise unary operation named `opn`.
fn un_op(opn: &str) -> Option<UnOp> {
    Some(match opn {
        "neg" => UnOp::Neg,
        "abs" => UnOp::Abs,
        "not" => UnOp::Not,
        "exp" => UnOp::Exp,
        "log" => UnOp::Log,
        "tanh" => UnOp::Tanh,
        "erf" => UnOp::Erf,
        "sqrt" => UnOp::Sqrt,
        "rsqrt" => UnOp::Rsqrt,
        "sigmoid" => UnOp::Sigmoid,
        _ => return None,
    })
}

fn is_int(d: DType) -> bool {
    !d.is_float() && !d.is_quantized() && d != DType::I1
}

fn shape_u32(s: &[u32]) -> String {
    format!(
        "[{}]",
        s.iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

impl<'s, 'c> KCx<'s, 'c> {
    fn new(sp: &'s mut Spec<'c>, cur: Rc<Parsed>, env: HashMap<String, CV>) -> KCx<'s, 'c> {
        KCx {
            sp,
            cur,
            env,
            scopes: vec![HashMap::new()],
            values: Vec::new(),
            names: HashMap::new(),
            regions: Vec::new(),
            params: Vec::new(),
            inline_depth: 0,
            nops: 0,
        }
    }

    fn err(&self, span: Span, msg: impl Into<String>) -> String {
        self.cur.src.error(span, msg)
    }

    fn loc(&self, span: Span) -> Loc {
        // why the overlay location: it is the item's file position (the same one diagnostics show)
        let s = self.cur.src.location(span);
        let mut parts = s.rsplitn(3, ':');
        let col = parts.next().and_then(|c| c.parse().ok()).unwrap_or(0);
        let line = parts.next().and_then(|l| l.parse().ok()).unwrap_or(0);
        Loc { line, col }
    }

    fn bind(&mut self, n: &Name, v: Val) -> R<()> {
        let top = self.scopes.last_mut().ok_or("no scope")?;
        if top.contains_key(&n.text) {
            return Err(self.err(
                n.span,
                format!("%{} is defined twice (values are SSA)", n.text),
            ));
        }
        top.insert(n.text.clone(), v);
        Ok(())
    }

    fn lookup(&self, n: &Name) -> R<Val> {
        for s in self.scopes.iter().rev() {
            if let Some(v) = s.get(&n.text) {
                return Ok(v.clone());
            }
        }
        Err(self.err(n.span, format!("unknown value %{}", n.text)))
    }

    fn new_value(&mut self, name: &str, ty: KType, span: Span) -> R<KValue> {
        if let KType::Tile { shape, .. } = &ty {
            if ty.elements() > MAX_TILE_ELEMENTS || shape.is_empty() {
                return Err(self.err(
                    span,
                    format!(
                        "tile too large: {ty} has {} elements, the limit is {MAX_TILE_ELEMENTS}",
                        ty.elements()
                    ),
                ));
            }
        }
        let base = if name.is_empty() { "t" } else { name };
        let n = self.names.entry(base.to_string()).or_insert(0);
        let unique = if *n == 0 {
            base.to_string()
        } else {
            format!("{base}_{n}")
        };
        *n += 1;
        let id = KValue(self.values.len() as u32);
        self.values.push(KValueDef { name: unique, ty });
        Ok(id)
    }

    fn emit(&mut self, kind: KOpKind, results: Vec<KValue>, span: Span) -> R<()> {
        self.nops += 1;
        if self.nops > MAX_KERNEL_OPS {
            return Err(self.err(
                span,
                format!("the kernel has more than {MAX_KERNEL_OPS} operations after inlining"),
            ));
        }
        let loc = self.loc(span);
        match self.regions.last_mut() {
            Some(r) => {
                r.push(KOp { kind, results, loc });
                Ok(())
            }
            None => Err(self.err(span, "operations are not allowed here")),
        }
    }

    /// Emits an op with one result of type `ty`.
    fn emit1(&mut self, name: &str, kind: KOpKind, ty: KType, span: Span) -> R<Val> {
        let v = self.new_value(name, ty.clone(), span)?;
        self.emit(kind, vec![v], span)?;
        Ok(Val::D(KOperand::Value(v), ty))
    }

    fn const_of(&mut self, e: &Expr) -> R<CV> {
        match self.eval(e, "")? {
            Val::C(c) => Ok(c),
            _ => Err(self.err(e.span(), "expected a compile-time constant")),
        }
    }

    fn dtype_of(&mut self, e: &Expr) -> R<DType> {
        match self.eval(e, "")? {
            Val::C(CV::DType(d)) => Ok(d),
            Val::C(other) => Err(self.err(
                e.span(),
                format!("expected an element type, found {}", other.describe()),
            )),
            _ => Err(self.err(e.span(), "expected an element type")),
        }
    }

    fn dims_of(&mut self, dims: &[Expr]) -> R<Vec<u64>> {
        let mut out = Vec::new();
        for d in dims {
            match self.const_of(d)? {
                CV::Int(v) if v >= 0 => out.push(v as u64),
                other => {
                    return Err(self.err(
                        d.span(),
                        format!(
                            "a dimension must be a non-negative integer, found {}",
                            other.describe()
                        ),
                    ));
                }
            }
        }
        Ok(out)
    }

    fn buffer_type(&mut self, dtype: &Expr, dims: &[Expr]) -> R<(DType, Vec<u64>)> {
        let d = self.dtype_of(dtype)?;
        let shape = self.dims_of(dims)?;
        if d.bytes_for(&shape).is_none() {
            return Err(self.err(dtype.span(), format!("{d}{shape:?} is not a valid buffer (size overflow, or a quantized last dim that is not whole blocks)")));
        }
        Ok((d, shape))
    }

    fn shape_of(&mut self, e: &Expr) -> R<Vec<u32>> {
        match self.const_of(e)? {
            CV::Shape(s) => s
                .iter()
                .map(|&d| u32::try_from(d).ok().filter(|&d| d > 0))
                .collect::<Option<Vec<u32>>>()
                .ok_or_else(|| {
                    self.err(e.span(), format!("tile dims must be positive, found {s:?}"))
                }),
            CV::Int(v) if v > 0 && v <= u32::MAX as i64 => Ok(vec![v as u32]),
            other => Err(self.err(
                e.span(),
                format!(
                    "expected a shape such as [4, 8], found {}",
                    other.describe()
                ),
            )),
        }
    }

    fn ktype(&mut self, t: &TypeExpr) -> R<KType> {
        match t {
            TypeExpr::Scalar(d) => Ok(KType::Scalar(self.dtype_of(d)?)),
            TypeExpr::Tile { shape, dtype, span } => {
                let shape = self.shape_of(shape)?;
                let dtype = self.dtype_of(dtype)?;
                let ty = KType::Tile { shape, dtype };
                if ty.elements() > MAX_TILE_ELEMENTS {
                    return Err(self.err(*span, format!("tile too large: {ty} has {} elements, the limit is {MAX_TILE_ELEMENTS}", ty.elements())));
                }
                Ok(ty)
            }
        }
    }

    // ---- blocks and statements

    /// Runs a block's statements; returns the final `yield`/`return` values, if any.
    fn block(&mut self, b: &Block) -> R<Option<(Vec<Val>, Span)>> {
        let n = b.stmts.len();
        for (i, s) in b.stmts.iter().enumerate() {
            match s {
                Stmt::Yield { values, span } => {
                    if i + 1 != n {
                        return Err(self.err(
                            *span,
                            "`yield`/`return` must be the last statement of its block",
                        ));
                    }
                    let mut vals = Vec::new();
                    for v in values {
                        vals.push(self.eval(v, "")?);
                    }
                    return Ok(Some((vals, *span)));
                }
                Stmt::Let { results, op, span } => {
                    let names: Vec<String> = results.iter().map(|n| n.text.clone()).collect();
                    let vals = self.op(op, &names)?;
                    if vals.len() != results.len() {
                        return Err(self.err(
                            *span,
                            format!(
                                "the operation gives {} result(s), {} named",
                                vals.len(),
                                results.len()
                            ),
                        ));
                    }
                    for (n, v) in results.iter().zip(vals) {
                        self.bind(n, v)?;
                    }
                }
                Stmt::Index {
                    out,
                    indices,
                    expr,
                    span,
                } => {
                    let v = self.index_notation(out, indices, expr, *span)?;
                    self.bind(out, v)?;
                }
            }
        }
        Ok(None)
    }

    /// Evaluates one statement's operation; `names` are its result names (IR values take them).
    fn op(&mut self, op: &Op, names: &[String]) -> R<Vec<Val>> {
        let name = names.first().map_or("", |n| n.as_str());
        match op {
            Op::Simple {
                name: opn,
                operands,
                annotation,
                span,
            } => {
                let v = self.simple(&opn.text, operands, annotation.as_ref(), *span, name)?;
                Ok(v.into_iter().collect())
            }
            Op::Call {
                callee,
                targs,
                args,
                span,
            } => self.call(callee, targs, args, *span),
            Op::If {
                cond,
                results,
                then_block,
                else_block,
                span,
            } => self.if_op(cond, results, then_block, else_block.as_ref(), *span, names),
            Op::Match {
                scrutinee,
                results,
                cases,
                default,
                span,
            } => {
                let blk = self.static_case(scrutinee, cases, default.as_ref(), *span)?;
                self.if_op(&Expr::Bool(true, *span), results, blk, None, *span, names)
            }
            Op::For {
                var,
                lo,
                hi,
                step,
                iters,
                results,
                body,
                span,
            } => self.for_op(
                var,
                lo,
                hi,
                step.as_ref(),
                iters,
                results,
                body,
                *span,
                names,
            ),
            Op::Alloc { span, .. } | Op::Dispatch { span, .. } => Err(self.err(
                *span,
                "`alloc` and `dispatch` are stage statements, not kernel operations",
            )),
        }
    }

    /// The block `static.match` takes: the first case with a value equal to the scrutinee (both compile-time
    /// constants of one kind), else `default`; neither is an error naming the value and every case.
    fn static_case<'b>(
        &mut self,
        scrutinee: &Expr,
        cases: &'b [(Vec<Expr>, Block)],
        default: Option<&'b Block>,
        span: Span,
    ) -> R<&'b Block> {
        let x = self.const_of(scrutinee)?;
        let mut seen: Vec<CV> = Vec::new();
        let mut chosen = None;
        for (values, blk) in cases {
            for e in values {
                let v = self.const_of(e)?;
                if std::mem::discriminant(&v) != std::mem::discriminant(&x) {
                    return Err(self.err(
                        e.span(),
                        format!(
                            "`static.match` on {}: this case is {}",
                            x.describe(),
                            v.describe()
                        ),
                    ));
                }
                if seen.contains(&v) {
                    return Err(self.err(
                        e.span(),
                        format!("{} is matched by an earlier case", v.describe()),
                    ));
                }
                if chosen.is_none() && v == x {
                    chosen = Some(blk);
                }
                seen.push(v);
            }
        }
        match chosen.or(default) {
            Some(b) => Ok(b),
            None => Err(self.err(
                span,
                format!(
                    "`static.match`: {} matches no case (cases: {}) and there is no `default`",
                    x.describe(),
                    seen.iter().map(CV::describe).collect::<Vec<_>>().join(", ")
                ),
            )),
        }
    }

    fn if_op(
        &mut self,
        cond: &Expr,
        results: &[TypeExpr],
        then_b: &Block,
        else_b: Option<&Block>,
        span: Span,
        names: &[String],
    ) -> R<Vec<Val>> {
        let nresults = names.len();
        let c = self.eval(cond, "")?;
        let tys: Vec<KType> = results.iter().map(|t| self.ktype(t)).collect::<R<_>>()?;
        match c {
            Val::C(CV::Bool(b)) => {
                // folded: the taken branch runs in its own scope, its yield gives the results
                let chosen = if b { Some(then_b) } else { else_b };
                let Some(blk) = chosen else {
                    if nresults > 0 {
                        return Err(self.err(span, "an `if` with results needs an `else`"));
                    }
                    return Ok(Vec::new());
                };
                self.scopes.push(HashMap::new());
                let y = self.block(blk);
                self.scopes.pop();
                let vals = y?.map(|(v, _)| v).unwrap_or_default();
                if !tys.is_empty() {
                    if vals.len() != tys.len() {
                        return Err(self.err(
                            span,
                            format!(
                                "the branch yields {} values, {} declared",
                                vals.len(),
                                tys.len()
                            ),
                        ));
                    }
                    let mut out = Vec::new();
                    for (v, t) in vals.into_iter().zip(&tys) {
                        let o = self.coerce(v, t, span)?;
                        out.push(Val::D(o, t.clone()));
                    }
                    return Ok(out);
                }
                Ok(vals)
            }
            Val::D(o, KType::Scalar(DType::I1)) => {
                if !tys.is_empty() && else_b.is_none() {
                    return Err(self.err(span, "an `if` with results needs an `else`"));
                }
                let then_region = self.region(Some(then_b), &tys, span)?;
                let else_region = self.region(else_b, &tys, span)?;
                let mut res = Vec::new();
                let mut vals = Vec::new();
                for (i, t) in tys.iter().enumerate() {
                    let v =
                        self.new_value(names.get(i).map_or("if", |n| n.as_str()), t.clone(), span)?;
                    res.push(v);
                    vals.push(Val::D(KOperand::Value(v), t.clone()));
                }
                self.emit(
                    KOpKind::If {
                        cond: o,
                        then_region,
                        else_region,
                    },
                    res,
                    span,
                )?;
                Ok(vals)
            }
            Val::D(_, t) => Err(self.err(
                cond.span(),
                format!("an `if` condition must be an i1 scalar, found {t}"),
            )),
            Val::C(other) => Err(self.err(
                cond.span(),
                format!("an `if` condition must be i1, found {}", other.describe()),
            )),
            _ => Err(self.err(cond.span(), "an `if` condition must be i1")),
        }
    }

    /// A region from a block whose yield must match `tys`.
    fn region(&mut self, b: Option<&Block>, tys: &[KType], span: Span) -> R<KRegion> {
        self.regions.push(Vec::new());
        self.scopes.push(HashMap::new());
        let y = match b {
            Some(b) => self.block(b),
            None => Ok(None),
        };
        self.scopes.pop();
        let y = y?;
        let (vals, yspan) = y.unwrap_or((Vec::new(), span));
        if vals.len() != tys.len() {
            return Err(self.err(
                yspan,
                format!(
                    "the region yields {} values, {} expected",
                    vals.len(),
                    tys.len()
                ),
            ));
        }
        let mut ops_out = Vec::new();
        for (v, t) in vals.into_iter().zip(tys) {
            ops_out.push(self.coerce(v, t, yspan)?);
        }
        let loc = self.loc(yspan);
        let mut ops = self.regions.pop().unwrap_or_default();
        ops.push(KOp {
            kind: KOpKind::Yield(ops_out),
            results: Vec::new(),
            loc,
        });
        Ok(KRegion { ops })
    }

    #[allow(clippy::too_many_arguments)]
    fn for_op(
        &mut self,
        var: &Name,
        lo: &Expr,
        hi: &Expr,
        step: Option<&Expr>,
        iters: &[(Name, Expr, TypeExpr)],
        results: &[TypeExpr],
        body: &Block,
        span: Span,
        names: &[String],
    ) -> R<Vec<Val>> {
        let i64t = KType::Scalar(DType::I64);
        let lo = {
            let v = self.eval(lo, "")?;
            self.coerce(v, &i64t, lo.span())?
        };
        let hi = {
            let v = self.eval(hi, "")?;
            self.coerce(v, &i64t, hi.span())?
        };
        let step = match step {
            Some(s) => {
                let v = self.eval(s, "")?;
                if let Val::C(CV::Int(n)) = &v {
                    if *n <= 0 {
                        return Err(self.err(s.span(), "a loop step must be positive"));
                    }
                }
                self.coerce(v, &i64t, s.span())?
            }
            None => KOperand::Imm(KImm::I64(1), DType::I64),
        };
        let mut tys = Vec::new();
        let mut inits = Vec::new();
        for (_, init, t) in iters {
            let ty = self.ktype(t)?;
            let v = self.eval(init, "")?;
            inits.push(self.coerce(v, &ty, init.span())?);
            tys.push(ty);
        }
        if !results.is_empty() {
            let rt: Vec<KType> = results.iter().map(|t| self.ktype(t)).collect::<R<_>>()?;
            if rt != tys {
                return Err(self.err(
                    span,
                    "a loop's result types must be its iteration values' types",
                ));
            }
        }
        let iv = self.new_value(&var.text, i64t.clone(), var.span)?;
        let mut iter_vals = Vec::new();
        self.scopes.push(HashMap::new());
        self.bind(var, Val::D(KOperand::Value(iv), i64t))?;
        for ((n, _, _), t) in iters.iter().zip(&tys) {
            let v = self.new_value(&n.text, t.clone(), n.span)?;
            iter_vals.push(v);
            self.bind(n, Val::D(KOperand::Value(v), t.clone()))?;
        }
        let r = self.region(Some(body), &tys, span);
        self.scopes.pop();
        let body = r?;
        let mut res = Vec::new();
        let mut out = Vec::new();
        for (i, t) in tys.iter().enumerate() {
            let v = self.new_value(names.get(i).map_or("for", |n| n.as_str()), t.clone(), span)?;
            res.push(v);
            out.push(Val::D(KOperand::Value(v), t.clone()));
        }
        self.emit(
            KOpKind::For {
                lo,
                hi,
                step,
                iv,
                iters: iter_vals,
                inits,
                body,
            },
            res,
            span,
        )?;
        Ok(out)
    }

    /// Converts a value to an operand of type `want` (literals take the type; a constant scalar for a tile
    /// type becomes a `Full`; IR values must already have the type).
    fn coerce(&mut self, v: Val, want: &KType, span: Span) -> R<KOperand> {
        match (v, want) {
            (Val::D(o, t), want) if t == *want => Ok(o),
            (Val::D(_, t), want) => Err(self.err(span, format!("expected {want}, found {t} (no implicit conversions: use conv.* or tile.broadcast)"))),
            (Val::C(c), KType::Scalar(d)) => self.imm(&c, *d, span),
            (Val::C(c), KType::Tile { shape, dtype }) => {
                let value = self.imm(&c, *dtype, span)?;
                let Val::D(o, _) = self.emit1("full", KOpKind::Full { value, shape: shape.clone(), dtype: *dtype }, want.clone(), span)? else {
                    return Err(self.err(span, "internal: full"));
                };
                Ok(o)
            }
            _ => Err(self.err(span, format!("expected {want}, found a buffer"))),
        }
    }

    /// A literal as an immediate of dtype `d`.
    fn imm(&self, c: &CV, d: DType, span: Span) -> R<KOperand> {
        let imm = match (c, d) {
            (CV::Bool(b), DType::I1) => KImm::I1(*b),
            (CV::Int(v), d) if d.is_float() => KImm::F64(*v as f64),
            (CV::Int(v), d) if is_int(d) => KImm::I64(*v),
            (CV::Float(v), d) if d.is_float() => KImm::F64(*v),
            (c, d) => {
                return Err(self.err(
                    span,
                    format!("{} cannot be used as a value of type {d}", c.describe()),
                ));
            }
        };
        Ok(KOperand::Imm(imm, d))
    }

    // ---- expressions

    fn eval(&mut self, e: &Expr, name: &str) -> R<Val> {
        Ok(match e {
            Expr::Int(v, _) => Val::C(CV::Int(*v)),
            Expr::Float(v, _) => Val::C(CV::Float(*v)),
            Expr::Str(s, _) => Val::C(CV::Str(s.clone())),
            Expr::Bool(b, _) => Val::C(CV::Bool(*b)),
            Expr::Word(n) => match word_value(&n.text, &self.env) {
                Some(v) => Val::C(v),
                None => {
                    return Err(self.err(
                        n.span,
                        format!(
                            "unknown name `{}` (not a template parameter or dtype)",
                            n.text
                        ),
                    ));
                }
            },
            Expr::Symbol(n) => {
                let (m, f) = self
                    .sp
                    .resolve(self.cur.module, &n.text, DeviceKind::Kfunc)
                    .map_err(|m| self.err(n.span, m))?;
                Val::C(CV::Func(m, f))
            }
            Expr::Value(n) => self.lookup(n)?,
            Expr::Index { span, .. } => {
                return Err(self.err(*span, "an index operand `%buf[...]` is only allowed as the first operand of tile.load / tile.store"));
            }
            Expr::List(items, _) => {
                let mut dims = Vec::new();
                for i in items {
                    match self.const_of(i)? {
                        CV::Int(d) => dims.push(d),
                        other => {
                            return Err(self.err(
                                i.span(),
                                format!("shape dims must be integers, found {}", other.describe()),
                            ));
                        }
                    }
                }
                Val::C(CV::Shape(dims))
            }
            Expr::Call {
                name: opn,
                args,
                span,
            } => match self.simple(&opn.text, args, None, *span, name)? {
                Some(v) => v,
                None => return Err(self.err(*span, format!("`{}` gives no value", opn.text))),
            },
            Expr::Binary { op, lhs, rhs, span } => {
                let a = self.eval(lhs, "")?;
                let b = self.eval(rhs, "")?;
                let bop = match op {
                    '+' => BinOp::Add,
                    '-' => BinOp::Sub,
                    '*' => BinOp::Mul,
                    '/' => BinOp::Div,
                    _ => BinOp::Rem,
                };
                self.binary(bop, a, b, *span, name)?
            }
            Expr::Neg(inner, span) => {
                let a = self.eval(inner, "")?;
                self.unary(UnOp::Neg, a, *span, name)?
            }
        })
    }

    fn binary(&mut self, op: BinOp, a: Val, b: Val, span: Span, name: &str) -> R<Val> {
        if let (Val::C(x), Val::C(y)) = (&a, &b) {
            let sym = match op {
                BinOp::Add => Some('+'),
                BinOp::Sub => Some('-'),
                BinOp::Mul => Some('*'),
                BinOp::Div => Some('/'),
                BinOp::Rem => Some('%'),
                _ => None,
            };
            if let Some(s) = sym {
                return fold_arith(s, x, y)
                    .map(Val::C)
                    .map_err(|m| self.err(span, m));
            }
            return match (op, x, y) {
                (BinOp::Min, CV::Int(x), CV::Int(y)) => Ok(Val::C(CV::Int(*x.min(y)))),
                (BinOp::Max, CV::Int(x), CV::Int(y)) => Ok(Val::C(CV::Int(*x.max(y)))),
                (BinOp::Min, CV::Float(x), CV::Float(y)) => Ok(Val::C(CV::Float(x.min(*y)))),
                (BinOp::Max, CV::Float(x), CV::Float(y)) => Ok(Val::C(CV::Float(x.max(*y)))),
                (BinOp::And, CV::Bool(x), CV::Bool(y)) => Ok(Val::C(CV::Bool(*x && *y))),
                (BinOp::Or, CV::Bool(x), CV::Bool(y)) => Ok(Val::C(CV::Bool(*x || *y))),
                _ => Err(self.err(
                    span,
                    format!(
                        "cannot fold {op:?} of {} and {}",
                        x.describe(),
                        y.describe()
                    ),
                )),
            };
        }
        let (a, b, ty) = self.operands2(a, b, span)?;
        let d = ty.dtype();
        let ok = match op {
            BinOp::And | BinOp::Or | BinOp::Xor => is_int(d) || d == DType::I1,
            BinOp::Shl | BinOp::Shr => is_int(d),
            _ => d.is_float() || is_int(d),
        };
        if !ok {
            return Err(self.err(span, format!("{op:?} is not defined on {d}")));
        }
        self.emit1(name, KOpKind::Binary { op, a, b }, ty, span)
    }

    /// Two elementwise operands: a literal takes the other's dtype; dtypes must match; a scalar broadcasts
    /// over a tile; two tiles of different shapes are broadcast (numpy rules) with explicit `Broadcast` ops.
    fn operands2(&mut self, a: Val, b: Val, span: Span) -> R<(KOperand, KOperand, KType)> {
        let (ta, tb) = match (&a, &b) {
            (Val::D(_, t), Val::C(_)) => (t.clone(), KType::Scalar(t.dtype())),
            (Val::C(_), Val::D(_, t)) => (KType::Scalar(t.dtype()), t.clone()),
            (Val::D(_, x), Val::D(_, y)) => (x.clone(), y.clone()),
            _ => return Err(self.err(span, "expected scalar or tile operands")),
        };
        if ta.dtype() != tb.dtype() {
            return Err(self.err(
                span,
                format!(
                    "operand types differ: {ta} and {tb} (no implicit conversions: use conv.*)"
                ),
            ));
        }
        let oa = self.coerce(a, &ta, span)?;
        let ob = self.coerce(b, &tb, span)?;
        match (&ta, &tb) {
            (KType::Scalar(_), t) | (t, KType::Scalar(_)) => Ok((oa, ob, t.clone())),
            (KType::Tile { shape: sa, dtype }, KType::Tile { shape: sb, .. }) => {
                if sa == sb {
                    return Ok((oa, ob, ta.clone()));
                }
                let Some(out) = broadcast_shape(sa, sb) else {
                    return Err(self.err(
                        span,
                        format!(
                            "broadcasting mismatch: shapes {} and {} are not compatible",
                            shape_u32(sa),
                            shape_u32(sb)
                        ),
                    ));
                };
                let ty = KType::Tile {
                    shape: out.clone(),
                    dtype: *dtype,
                };
                let oa = if *sa == out {
                    oa
                } else {
                    self.bcast(oa, &out, *dtype, span)?
                };
                let ob = if *sb == out {
                    ob
                } else {
                    self.bcast(ob, &out, *dtype, span)?
                };
                Ok((oa, ob, ty))
            }
        }
    }

    fn bcast(&mut self, a: KOperand, shape: &[u32], dtype: DType, span: Span) -> R<KOperand> {
        let ty = KType::Tile {
            shape: shape.to_vec(),
            dtype,
        };
        match self.emit1(
            "bcast",
            KOpKind::Broadcast {
                a,
                shape: shape.to_vec(),
            },
            ty,
            span,
        )? {
            Val::D(o, _) => Ok(o),
            _ => Err(self.err(span, "internal: broadcast")),
        }
    }

    fn unary(&mut self, op: UnOp, a: Val, span: Span, name: &str) -> R<Val> {
        match (&op, &a) {
            (UnOp::Neg, Val::C(CV::Int(v))) => {
                return v
                    .checked_neg()
                    .map(|v| Val::C(CV::Int(v)))
                    .ok_or_else(|| self.err(span, "integer overflow"));
            }
            (UnOp::Neg, Val::C(CV::Float(v))) => return Ok(Val::C(CV::Float(-v))),
            (UnOp::Not, Val::C(CV::Bool(b))) => return Ok(Val::C(CV::Bool(!b))),
            _ => {}
        }
        let Val::D(o, ty) = a else {
            return Err(self.err(span, format!("{op:?} needs a scalar or tile value")));
        };
        let d = ty.dtype();
        let ok = match op {
            UnOp::Neg | UnOp::Abs => d.is_float() || is_int(d),
            UnOp::Not => is_int(d) || d == DType::I1,
            _ => d.is_float(),
        };
        if !ok {
            return Err(self.err(span, format!("{op:?} is not defined on {d}")));
        }
        self.emit1(name, KOpKind::Unary { op, a: o }, ty, span)
    }

    fn dyn_operand(&mut self, e: &Expr) -> R<(KOperand, KType)> {
        match self.eval(e, "")? {
            Val::D(o, t) => Ok((o, t)),
            _ => Err(self.err(e.span(), "expected a scalar or tile value")),
        }
    }

    fn axis(&mut self, e: &Expr, rank: usize) -> R<u8> {
        match self.const_of(e)? {
            CV::Int(a) if a >= 0 && (a as usize) < rank => Ok(a as u8),
            other => Err(self.err(
                e.span(),
                format!("axis must be 0..{rank}, found {}", other.describe()),
            )),
        }
    }

    fn nargs(
        &self,
        ops: &[Expr],
        n: std::ops::RangeInclusive<usize>,
        opn: &str,
        span: Span,
    ) -> R<()> {
        if n.contains(&ops.len()) {
            Ok(())
        } else {
            Err(self.err(
                span,
                format!(
                    "`{opn}` takes {} operand(s), found {}",
                    if n.start() == n.end() {
                        n.start().to_string()
                    } else {
                        format!("{} to {}", n.start(), n.end())
                    },
                    ops.len()
                ),
            ))
        }
    }

    /// A flat or nested operation; `None` for ops without a result (`tile.store`).
    fn simple(
        &mut self,
        opn: &str,
        ops: &[Expr],
        ann: Option<&TypeExpr>,
        span: Span,
        name: &str,
    ) -> R<Option<Val>> {
        let short = opn.rsplit('.').next().unwrap_or(opn);
        let vname = if name.is_empty() { short } else { name };
        if ann.is_some() && !matches!(opn, "tile.full" | "tile.zeros") {
            return Err(self.err(span, format!("`{opn}` takes no type annotation")));
        }
        if let Some(op) = bin_op(opn) {
            self.nargs(ops, 2..=2, opn, span)?;
            let a = self.eval(&ops[0], "")?;
            let b = self.eval(&ops[1], "")?;
            return self.binary(op, a, b, span, vname).map(Some);
        }
        if let Some(op) = un_op(opn) {
            self.nargs(ops, 1..=1, opn, span)?;
            let a = self.eval(&ops[0], "")?;
            return self.unary(op, a, span, vname).map(Some);
        }
        if let Some(c) = opn.strip_prefix("cmp.") {
            let op = match c {
                "eq" => CmpOp::Eq,
                "ne" => CmpOp::Ne,
                "lt" => CmpOp::Lt,
                "le" => CmpOp::Le,
                "gt" => CmpOp::Gt,
                "ge" => CmpOp::Ge,
                _ => return Err(self.err(span, format!("unknown comparison `{opn}`"))),
            };
            self.nargs(ops, 2..=2, opn, span)?;
            let a = self.eval(&ops[0], "")?;
            let b = self.eval(&ops[1], "")?;
            if let (Val::C(CV::Int(x)), Val::C(CV::Int(y))) = (&a, &b) {
                let r = match op {
                    CmpOp::Eq => x == y,
                    CmpOp::Ne => x != y,
                    CmpOp::Lt => x < y,
                    CmpOp::Le => x <= y,
                    CmpOp::Gt => x > y,
                    CmpOp::Ge => x >= y,
                };
                return Ok(Some(Val::C(CV::Bool(r))));
            }
            let (a, b, ty) = self.operands2(a, b, span)?;
            let rty = match ty {
                KType::Scalar(_) => KType::Scalar(DType::I1),
                KType::Tile { shape, .. } => KType::Tile {
                    shape,
                    dtype: DType::I1,
                },
            };
            return self
                .emit1(vname, KOpKind::Cmp { op, a, b }, rty, span)
                .map(Some);
        }
        if let Some(to) = opn.strip_prefix("conv.") {
            let Some(to) = DType::from_name(to).filter(|d| !d.is_quantized()) else {
                return Err(self.err(span, format!("unknown conversion `{opn}`")));
            };
            self.nargs(ops, 1..=1, opn, span)?;
            let (a, ty) = self.dyn_operand(&ops[0])?;
            let rty = match ty {
                KType::Scalar(_) => KType::Scalar(to),
                KType::Tile { shape, .. } => KType::Tile { shape, dtype: to },
            };
            return self
                .emit1(vname, KOpKind::Cast { a, to }, rty, span)
                .map(Some);
        }
        match opn {
            "copy" => {
                self.nargs(ops, 1..=1, opn, span)?;
                self.eval(&ops[0], name).map(Some)
            }
            "cdiv" => {
                self.nargs(ops, 2..=2, opn, span)?;
                let a = self.const_of(&ops[0])?;
                let b = self.const_of(&ops[1])?;
                match (a, b) {
                    (CV::Int(a), CV::Int(b)) if b > 0 && a >= 0 => {
                        Ok(Some(Val::C(CV::Int(a / b + i64::from(a % b != 0)))))
                    }
                    (a, b) => Err(self.err(
                        span,
                        format!(
                            "cdiv needs a non-negative and a positive integer, found {} and {}",
                            a.describe(),
                            b.describe()
                        ),
                    )),
                }
            }
            "str.eq" => {
                self.nargs(ops, 2..=2, opn, span)?;
                match (self.const_of(&ops[0])?, self.const_of(&ops[1])?) {
                    (CV::Str(a), CV::Str(b)) => Ok(Some(Val::C(CV::Bool(a == b)))),
                    (a, b) => Err(self.err(
                        span,
                        format!(
                            "str.eq compares two strings, found {} and {}",
                            a.describe(),
                            b.describe()
                        ),
                    )),
                }
            }
            "program_id" => {
                self.nargs(ops, 1..=1, opn, span)?;
                let axis = self.axis(&ops[0], 3)?;
                self.emit1(
                    vname,
                    KOpKind::ProgramId { axis },
                    KType::Scalar(DType::I64),
                    span,
                )
                .map(Some)
            }
            "tile.range" => {
                self.nargs(ops, 2..=2, opn, span)?;
                let s = self.eval(&ops[0], "")?;
                let start = self.coerce(s, &KType::Scalar(DType::I64), ops[0].span())?;
                let len = match self.const_of(&ops[1])? {
                    CV::Int(l) if l > 0 && l <= u32::MAX as i64 => l as u32,
                    other => {
                        return Err(self.err(
                            ops[1].span(),
                            format!(
                                "a range length must be a positive constant, found {}",
                                other.describe()
                            ),
                        ));
                    }
                };
                let ty = KType::Tile {
                    shape: vec![len],
                    dtype: DType::I64,
                };
                self.emit1(vname, KOpKind::Range { start, len }, ty, span)
                    .map(Some)
            }
            "tile.full" | "tile.zeros" => {
                let Some(ann) = ann else {
                    return Err(self.err(
                        span,
                        format!("`{opn}` needs a type annotation `: tile<[dims], dtype>`"),
                    ));
                };
                let ty = self.ktype(ann)?;
                let KType::Tile { shape, dtype } = ty.clone() else {
                    return Err(self.err(ann.span(), "the annotation must be a tile type"));
                };
                let value = if opn == "tile.zeros" {
                    self.nargs(ops, 0..=0, opn, span)?;
                    self.imm(&CV::Int(0), dtype, span)
                        .or_else(|_| self.imm(&CV::Bool(false), dtype, span))?
                } else {
                    self.nargs(ops, 1..=1, opn, span)?;
                    let v = self.eval(&ops[0], "")?;
                    self.coerce(v, &KType::Scalar(dtype), ops[0].span())?
                };
                self.emit1(
                    vname,
                    KOpKind::Full {
                        value,
                        shape,
                        dtype,
                    },
                    ty,
                    span,
                )
                .map(Some)
            }
            "tile.broadcast" => {
                self.nargs(ops, 2..=2, opn, span)?;
                let (a, ty) = self.dyn_operand(&ops[0])?;
                let shape = self.shape_of(&ops[1])?;
                let from = match &ty {
                    KType::Scalar(_) => vec![],
                    KType::Tile { shape, .. } => shape.clone(),
                };
                if broadcast_shape(&from, &shape).as_deref() != Some(&shape[..]) {
                    return Err(self.err(
                        span,
                        format!(
                            "broadcasting mismatch: {ty} does not broadcast to {}",
                            shape_u32(&shape)
                        ),
                    ));
                }
                let rty = KType::Tile {
                    shape: shape.clone(),
                    dtype: ty.dtype(),
                };
                self.emit1(vname, KOpKind::Broadcast { a, shape }, rty, span)
                    .map(Some)
            }
            "tile.expand_dims" => {
                self.nargs(ops, 2..=2, opn, span)?;
                let (a, ty) = self.dyn_operand(&ops[0])?;
                let KType::Tile { shape, dtype } = ty else {
                    return Err(self.err(ops[0].span(), "tile.expand_dims needs a tile"));
                };
                let axis = self.axis(&ops[1], shape.len() + 1)?;
                let mut s = shape.clone();
                s.insert(axis as usize, 1);
                self.emit1(
                    vname,
                    KOpKind::ExpandDims { a, axis },
                    KType::Tile { shape: s, dtype },
                    span,
                )
                .map(Some)
            }
            "tile.reshape" => {
                self.nargs(ops, 2..=2, opn, span)?;
                let (a, ty) = self.dyn_operand(&ops[0])?;
                let shape = self.shape_of(&ops[1])?;
                let n: u64 = shape.iter().map(|&d| d as u64).product();
                if !matches!(ty, KType::Tile { .. }) || n != ty.elements() {
                    return Err(self.err(
                        span,
                        format!(
                            "cannot reshape {ty} to {}: element counts differ",
                            shape_u32(&shape)
                        ),
                    ));
                }
                let rty = KType::Tile {
                    shape: shape.clone(),
                    dtype: ty.dtype(),
                };
                self.emit1(vname, KOpKind::Reshape { a, shape }, rty, span)
                    .map(Some)
            }
            "tile.transpose" => {
                self.nargs(ops, 1..=1, opn, span)?;
                let (a, ty) = self.dyn_operand(&ops[0])?;
                let KType::Tile { shape, dtype } = ty else {
                    return Err(self.err(span, "tile.transpose needs a 2-D tile"));
                };
                let [r, c] = shape[..] else {
                    return Err(self.err(
                        span,
                        format!(
                            "tile.transpose needs a 2-D tile, found {}",
                            shape_u32(&shape)
                        ),
                    ));
                };
                self.emit1(
                    vname,
                    KOpKind::Transpose { a },
                    KType::Tile {
                        shape: vec![c, r],
                        dtype,
                    },
                    span,
                )
                .map(Some)
            }
            "tile.sum" | "tile.max" | "tile.min" => {
                self.nargs(ops, 2..=2, opn, span)?;
                let (a, ty) = self.dyn_operand(&ops[0])?;
                let KType::Tile { shape, dtype } = ty else {
                    return Err(self.err(span, format!("`{opn}` needs a tile")));
                };
                if opn == "tile.sum" && !(dtype.is_float() || is_int(dtype)) {
                    return Err(self.err(span, format!("tile.sum is not defined on {dtype}")));
                }
                let axis = self.axis(&ops[1], shape.len())?;
                let mut s = shape.clone();
                s.remove(axis as usize);
                if s.is_empty() {
                    s.push(1);
                }
                let op = match opn {
                    "tile.sum" => ReduceOp::Sum,
                    "tile.max" => ReduceOp::Max,
                    _ => ReduceOp::Min,
                };
                self.emit1(
                    vname,
                    KOpKind::Reduce { op, a, axis },
                    KType::Tile { shape: s, dtype },
                    span,
                )
                .map(Some)
            }
            "tile.dot" => {
                self.nargs(ops, 3..=3, opn, span)?;
                let (a, ta) = self.dyn_operand(&ops[0])?;
                let (b, tb) = self.dyn_operand(&ops[1])?;
                let acc = self.eval(&ops[2], "")?;
                let (
                    KType::Tile {
                        shape: sa,
                        dtype: da,
                    },
                    KType::Tile {
                        shape: sb,
                        dtype: db,
                    },
                ) = (&ta, &tb)
                else {
                    return Err(self.err(span, "tile.dot needs 2-D tiles"));
                };
                let (&[m, k1], &[k2, n]) = (&sa[..], &sb[..]) else {
                    return Err(self.err(
                        span,
                        format!("tile.dot needs 2-D tiles, found {ta} and {tb}"),
                    ));
                };
                if k1 != k2 {
                    return Err(self.err(
                        span,
                        format!(
                            "dot shape mismatch: {ta} times {tb} (inner dims {k1} and {k2} differ)"
                        ),
                    ));
                }
                if da != db || !da.is_float() {
                    return Err(self.err(
                        span,
                        format!("tile.dot needs two float tiles of one dtype, found {ta} and {tb}"),
                    ));
                }
                let rty = KType::Tile {
                    shape: vec![m, n],
                    dtype: DType::F32,
                };
                let acc = match acc {
                    Val::D(_, ref t) if *t != rty => {
                        return Err(self.err(
                            ops[2].span(),
                            format!("dot shape mismatch: the accumulator is {t}, {rty} expected"),
                        ));
                    }
                    v => self.coerce(v, &rty, ops[2].span())?,
                };
                self.emit1(vname, KOpKind::Dot { a, b, acc }, rty, span)
                    .map(Some)
            }
            "select" => {
                self.nargs(ops, 3..=3, opn, span)?;
                let c = self.eval(&ops[0], "")?;
                let a = self.eval(&ops[1], "")?;
                let b = self.eval(&ops[2], "")?;
                if let Val::C(CV::Bool(c)) = c {
                    return Ok(Some(if c { a } else { b }));
                }
                let (a, b, ty) = self.operands2(a, b, span)?;
                let Val::D(cond, ct) = c else {
                    return Err(self.err(ops[0].span(), "select needs an i1 condition"));
                };
                let ok = ct.dtype() == DType::I1
                    && match (&ct, &ty) {
                        (KType::Scalar(_), _) => true,
                        (KType::Tile { shape: x, .. }, KType::Tile { shape: y, .. }) => x == y,
                        _ => false,
                    };
                if !ok {
                    return Err(self.err(
                        ops[0].span(),
                        format!("select's condition {ct} does not fit its values {ty}"),
                    ));
                }
                self.emit1(vname, KOpKind::Select { cond, a, b }, ty, span)
                    .map(Some)
            }
            "tile.load" => self.load(ops, span, vname).map(Some),
            "tile.store" => {
                self.store(ops, span)?;
                Ok(None)
            }
            _ => Err(self.err(span, format!("unknown kernel operation `{opn}`"))),
        }
    }

    /// The buffer and indices of an index operand; the indices' tile lengths make the access shape.
    fn index(&mut self, e: &Expr) -> R<(u32, Vec<KOperand>, Vec<u32>)> {
        let Expr::Index { buf, indices, span } = e else {
            return Err(self.err(e.span(), "expected an index operand `%buf[i, ...]`"));
        };
        let Val::Buf(p) = self.lookup(buf)? else {
            return Err(self.err(buf.span, format!("%{} is not a buffer parameter", buf.text)));
        };
        let rank = self.params.get(p as usize).map_or(0, |k| k.shape.len());
        if indices.len() != rank {
            return Err(self.err(
                *span,
                format!(
                    "%{} has {rank} dimension(s), {} indices given",
                    buf.text,
                    indices.len()
                ),
            ));
        }
        let mut out = Vec::new();
        let mut shape = Vec::new();
        for i in indices {
            match self.eval(i, "")? {
                Val::C(CV::Int(v)) => out.push(KOperand::Imm(KImm::I64(v), DType::I64)),
                Val::D(o, KType::Scalar(DType::I64)) => out.push(o),
                Val::D(
                    o,
                    KType::Tile {
                        shape: s,
                        dtype: DType::I64,
                    },
                ) if s.len() == 1 => {
                    shape.push(s[0]);
                    out.push(o);
                }
                Val::D(_, t) => {
                    return Err(self.err(
                        i.span(),
                        format!("an index must be an i64 scalar or a 1-D i64 tile, found {t}"),
                    ));
                }
                _ => {
                    return Err(
                        self.err(i.span(), "an index must be an i64 scalar or a 1-D i64 tile")
                    );
                }
            }
        }
        Ok((p, out, shape))
    }

    fn load(&mut self, ops: &[Expr], span: Span, name: &str) -> R<Val> {
        self.nargs(ops, 1..=2, "tile.load", span)?;
        let (p, indices, shape) = self.index(&ops[0])?;
        let kp = self.params[p as usize].clone();
        if kp.access == Access::Write {
            return Err(self.err(
                ops[0].span(),
                format!("load from %{}, a write-only buffer", kp.name),
            ));
        }
        let dtype = if kp.dtype.is_quantized() {
            DType::F32
        } else {
            kp.dtype
        };
        let fill = match ops.get(1) {
            None => None,
            Some(f) => {
                let v = self.eval(f, "")?;
                Some(self.coerce(v, &KType::Scalar(dtype), f.span())?)
            }
        };
        let ty = if shape.is_empty() {
            KType::Scalar(dtype)
        } else {
            KType::Tile { shape, dtype }
        };
        self.emit1(
            name,
            KOpKind::Load {
                param: p,
                indices,
                fill,
            },
            ty,
            span,
        )
    }

    fn store(&mut self, ops: &[Expr], span: Span) -> R<()> {
        self.nargs(ops, 2..=2, "tile.store", span)?;
        let (p, indices, shape) = self.index(&ops[0])?;
        let kp = self.params[p as usize].clone();
        if kp.access == Access::Read {
            return Err(self.err(
                ops[0].span(),
                format!("store to %{}, a read-only buffer", kp.name),
            ));
        }
        if kp.dtype.is_quantized() {
            return Err(self.err(
                ops[0].span(),
                format!("store to %{}, a quantized buffer", kp.name),
            ));
        }
        let want = if shape.is_empty() {
            KType::Scalar(kp.dtype)
        } else {
            KType::Tile {
                shape,
                dtype: kp.dtype,
            }
        };
        let v = self.eval(&ops[1], "")?;
        let value = match v {
            Val::D(_, ref t) if *t != want => {
                return Err(self.err(
                    ops[1].span(),
                    format!("the stored value is {t}, but the index gives {want}"),
                ));
            }
            v => self.coerce(v, &want, ops[1].span())?,
        };
        self.emit(
            KOpKind::Store {
                param: p,
                indices,
                value,
            },
            Vec::new(),
            span,
        )
    }

    /// Inlines a kfunc call.
    fn call(
        &mut self,
        callee: &Expr,
        targs: &[(Name, Expr)],
        args: &[Expr],
        span: Span,
    ) -> R<Vec<Val>> {
        let (m, fname) = match self.eval(callee, "")? {
            Val::C(CV::Func(m, f)) => (m, f),
            _ => {
                return Err(self.err(
                    callee.span(),
                    "`call` needs a kfunc (@name) or a func template parameter",
                ));
            }
        };
        if self.inline_depth >= MAX_INLINE_DEPTH {
            return Err(self.err(
                span,
                format!("kfunc calls nest deeper than {MAX_INLINE_DEPTH} (recursive kfunc?)"),
            ));
        }
        let p = self.sp.item(m, &fname).map_err(|e| e.join(""))?;
        let Header::Kfunc { params, results } = &p.item.header else {
            return Err(self.err(
                callee.span(),
                format!("@{fname} is a {}, not a kfunc", p.item.kind.keyword()),
            ));
        };
        if params.len() != args.len() {
            return Err(self.err(
                span,
                format!(
                    "@{fname} takes {} argument(s), {} given",
                    params.len(),
                    args.len()
                ),
            ));
        }
        let mut given = Vec::new();
        for (n, e) in targs {
            let v = self.const_of(e)?;
            given.push((n.text.clone(), v, n.span));
        }
        let mut argv = Vec::new();
        for a in args {
            argv.push(self.eval(a, "")?);
        }
        // infer unbound shape/dtype parameters from the argument types: `tile<S, T>` against a tile
        for ((_, pt), a) in params.iter().zip(&argv) {
            let Val::D(_, at) = a else { continue };
            let (shape_e, dtype_e) = match pt {
                TypeExpr::Tile { shape, dtype, .. } => (Some(shape), dtype),
                TypeExpr::Scalar(d) => (None, d),
            };
            if let (Some(Expr::Word(w)), KType::Tile { shape, .. }) = (shape_e, at) {
                if p.item.tparams.iter().any(|t| t.name.text == w.text)
                    && !given.iter().any(|g| g.0 == w.text)
                {
                    given.push((
                        w.text.clone(),
                        CV::Shape(shape.iter().map(|&d| d as i64).collect()),
                        span,
                    ));
                }
            }
            if let Expr::Word(w) = dtype_e {
                if p.item.tparams.iter().any(|t| t.name.text == w.text)
                    && !given.iter().any(|g| g.0 == w.text)
                {
                    given.push((w.text.clone(), CV::DType(at.dtype()), span));
                }
            }
        }
        let cur = self.cur.clone();
        let at = |s: Span, msg: String| cur.src.error(s, msg);
        let tvals = bind_tparams(self.sp, &p, given, &at, span)?;
        // switch to the kfunc's frame: its own template values and scope, the same kernel being built
        let saved_cur = std::mem::replace(&mut self.cur, p.clone());
        let saved_env = std::mem::replace(&mut self.env, tvals.into_iter().collect());
        let saved_scopes = std::mem::replace(&mut self.scopes, vec![HashMap::new()]);
        self.inline_depth += 1;
        let r = self.inline_body(&p, params, results, argv, span);
        self.inline_depth -= 1;
        self.cur = saved_cur;
        self.env = saved_env;
        self.scopes = saved_scopes;
        r.map_err(|e| {
            format!(
                "{e}{}",
                self.cur
                    .src
                    .error(span, format!("in the call of @{fname} here"))
                    .replacen("error:", "note:", 1)
            )
        })
    }

    fn inline_body(
        &mut self,
        p: &Parsed,
        params: &[(Name, TypeExpr)],
        results: &[TypeExpr],
        argv: Vec<Val>,
        span: Span,
    ) -> R<Vec<Val>> {
        for ((n, t), a) in params.iter().zip(argv) {
            let ty = self.ktype(t)?;
            let v = match a {
                Val::D(o, at) => {
                    if at != ty {
                        return Err(self.err(
                            n.span,
                            format!("parameter %{} is {ty}, the argument is {at}", n.text),
                        ));
                    }
                    Val::D(o, at)
                }
                c @ Val::C(_) => {
                    let o = self.coerce(c, &ty, span)?;
                    Val::D(o, ty)
                }
                _ => return Err(self.err(n.span, "a kfunc argument must be a scalar or a tile")),
            };
            self.bind(n, v)?;
        }
        let rtys: Vec<KType> = results.iter().map(|t| self.ktype(t)).collect::<R<_>>()?;
        let y = self.block(&p.item.body)?;
        let (vals, yspan) = y.unwrap_or((Vec::new(), p.item.body.span));
        if vals.len() != rtys.len() {
            return Err(self.err(
                yspan,
                format!(
                    "@{} returns {} value(s), {} declared",
                    p.item.name.text,
                    vals.len(),
                    rtys.len()
                ),
            ));
        }
        let mut out = Vec::new();
        for (v, t) in vals.into_iter().zip(&rtys) {
            let o = self.coerce(v, t, yspan)?;
            out.push(Val::D(o, t.clone()));
        }
        Ok(out)
    }
}

/// Numpy broadcasting of two shapes (right-aligned; size-1 dims expand), or `None`.
fn broadcast_shape(a: &[u32], b: &[u32]) -> Option<Vec<u32>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let x = if i < n - a.len() {
            1
        } else {
            a[i - (n - a.len())]
        };
        let y = if i < n - b.len() {
            1
        } else {
            b[i - (n - b.len())]
        };
        out[i] = if x == y || y == 1 {
            x
        } else if x == 1 {
            y
        } else {
            return None;
        };
    }
    Some(out)
}

// ---- stages -------------------------------------------------------------------------------------------------

/// Specializes a stage.
pub(crate) fn stage(
    sp: &mut Spec<'_>,
    m: usize,
    name: &str,
    config: &[(String, TValue)],
) -> Result<Stage, Vec<String>> {
    let p = sp.item(m, name)?;
    if p.item.kind != DeviceKind::Stage {
        return Err(vec![p.src.error(
            p.item.name.span,
            format!("@{name} is a {}, not a stage", p.item.kind.keyword()),
        )]);
    }
    let mut given = Vec::new();
    for (k, v) in config {
        match tvalue_to_cv(v) {
            Some(c) => given.push((k.clone(), c, p.item.name.span)),
            None => {
                return Err(vec![p.src.error(
                    p.item.name.span,
                    format!(
                        "config value for `{k}` is not a constant i64, bool, str, dtype or shape"
                    ),
                )]);
            }
        }
    }
    let at = |s: Span, msg: String| p.src.error(s, msg);
    let tvals = bind_tparams(sp, &p, given, &at, p.item.name.span).map_err(|e| vec![e])?;
    let env: HashMap<String, CV> = tvals.into_iter().collect();
    let qualified = format!("{}.{}", sp.module_name(m), name);
    let mut cx = KCx::new(sp, p.clone(), env);
    let mut st = Stage {
        name: qualified,
        inputs: Vec::new(),
        outputs: Vec::new(),
        workspace: Vec::new(),
        param_domain: None,
        params: Vec::new(),
        kernels: Vec::new(),
        dispatches: Vec::new(),
    };
    let one = |e: String| vec![e];
    let Header::Stage { buffers, params } = &p.item.header else {
        return Err(vec![p.src.error(p.item.name.span, "not a stage")]);
    };
    for b in buffers {
        let (dtype, shape) = cx.buffer_type(&b.dtype, &b.dims).map_err(one)?;
        let sb = StageBuffer {
            name: b.name.text.clone(),
            dtype,
            shape,
        };
        let r = match b.mode.text.as_str() {
            "input" => {
                st.inputs.push(sb);
                BufRef::Input(st.inputs.len() as u32 - 1)
            }
            "output" => {
                st.outputs.push(sb);
                BufRef::Output(st.outputs.len() as u32 - 1)
            }
            other => {
                return Err(vec![cx.err(
                    b.mode.span,
                    format!("a stage buffer is `input` or `output`, found `{other}`"),
                )]);
            }
        };
        cx.bind(&b.name, Val::Stage(r)).map_err(one)?;
    }
    if let Some(pb) = params {
        st.param_domain = Some(pb.domain.text.clone());
        let inputs = match cx.const_of(&pb.inputs).map_err(one)? {
            CV::Int(n) if n >= 0 => n,
            other => {
                return Err(vec![cx.err(
                    pb.inputs.span(),
                    format!(
                        "`inputs` must be a non-negative integer, found {}",
                        other.describe()
                    ),
                )]);
            }
        };
        for b in &pb.bindings {
            let (dtype, shape) = cx.buffer_type(&b.dtype, &b.dims).map_err(one)?;
            let input = match cx.const_of(&b.input).map_err(one)? {
                CV::Int(i) if i >= 0 && i < inputs => i as u32,
                other => {
                    return Err(vec![cx.err(
                        b.input.span(),
                        format!(
                            "the input ordinal must be 0..{inputs}, found {}",
                            other.describe()
                        ),
                    )]);
                }
            };
            st.params.push(ParamBinding {
                name: b.name.text.clone(),
                dtype,
                shape,
                input,
                key: b.key.clone(),
                layout: b.layout.clone(),
            });
            cx.bind(
                &b.name,
                Val::Stage(BufRef::Param(st.params.len() as u32 - 1)),
            )
            .map_err(one)?;
        }
    }
    let mut errors = Vec::new();
    stage_block(&mut cx, &p.item.body, &mut st, &mut errors);
    if errors.is_empty() {
        Ok(st)
    } else {
        Err(errors)
    }
}

fn stage_block(cx: &mut KCx<'_, '_>, b: &Block, st: &mut Stage, errors: &mut Vec<String>) {
    for s in &b.stmts {
        match s {
            Stmt::Yield { values, span } => {
                if !values.is_empty() {
                    errors.push(cx.err(*span, "a stage yields nothing"));
                }
            }
            Stmt::Let { results, op, span } => {
                if let Err(e) = stage_stmt(cx, results, op, *span, st, errors) {
                    errors.push(e);
                }
            }
            Stmt::Index { span, .. } => errors.push(cx.err(
                *span,
                "index notation is a kernel statement, not a stage statement",
            )),
        }
    }
}

fn stage_stmt(
    cx: &mut KCx<'_, '_>,
    results: &[Name],
    op: &Op,
    span: Span,
    st: &mut Stage,
    errors: &mut Vec<String>,
) -> R<()> {
    match op {
        Op::Alloc { dtype, dims, .. } => {
            let [r] = results else {
                return Err(cx.err(
                    span,
                    "`alloc` gives one buffer: `%name = alloc dtype[dims]`",
                ));
            };
            let (dtype, shape) = cx.buffer_type(dtype, dims)?;
            st.workspace.push(StageBuffer {
                name: r.text.clone(),
                dtype,
                shape,
            });
            cx.bind(
                r,
                Val::Stage(BufRef::Workspace(st.workspace.len() as u32 - 1)),
            )
        }
        Op::If {
            cond,
            then_block,
            else_block,
            ..
        } => {
            if !results.is_empty() {
                return Err(cx.err(span, "a stage `if` has no results"));
            }
            match cx.eval(cond, "")? {
                Val::C(CV::Bool(b)) => {
                    let blk = if b { Some(then_block) } else { else_block.as_ref() };
                    if let Some(blk) = blk {
                        stage_block(cx, blk, st, errors);
                    }
                    Ok(())
                }
                _ => Err(cx.err(cond.span(), "a stage `if` needs a compile-time condition (stages have no data-dependent control flow)")),
            }
        }
        Op::Match {
            scrutinee,
            results: tys,
            cases,
            default,
            span,
        } => {
            if !results.is_empty() || !tys.is_empty() {
                return Err(cx.err(*span, "a stage `static.match` has no results"));
            }
            let blk = cx.static_case(scrutinee, cases, default.as_ref(), *span)?;
            stage_block(cx, blk, st, errors);
            Ok(())
        }
        Op::Dispatch {
            kernel: kn,
            targs,
            args,
            span,
        } => {
            if !results.is_empty() {
                return Err(cx.err(*span, "`dispatch` gives no values"));
            }
            let (m, kname) = cx
                .sp
                .resolve(cx.cur.module, &kn.text, DeviceKind::Kernel)
                .map_err(|e| cx.err(kn.span, e))?;
            let mut given = Vec::new();
            for (n, e) in targs {
                let v = cx.const_of(e)?;
                given.push((n.text.clone(), v, e.span()));
            }
            let cur = cx.cur.clone();
            let at = |s: Span, msg: String| cur.src.error(s, msg);
            let k = kernel(cx.sp, m, &kname, given, &at, kn.span).map_err(|e| {
                format!(
                    "{e}{}",
                    cur.src
                        .error(
                            *span,
                            format!("while specializing @{kname} for this dispatch")
                        )
                        .replacen("error:", "note:", 1)
                )
            })?;
            if args.len() != k.params.len() {
                return Err(cx.err(
                    *span,
                    format!(
                        "@{kname} takes {} buffers, {} given",
                        k.params.len(),
                        args.len()
                    ),
                ));
            }
            let mut refs = Vec::new();
            for (a, kp) in args.iter().zip(&k.params) {
                let Expr::Value(n) = a else {
                    return Err(cx.err(
                        a.span(),
                        "a dispatch argument must be a stage buffer `%name`",
                    ));
                };
                let Val::Stage(r) = cx.lookup(n)? else {
                    return Err(cx.err(n.span, format!("%{} is not a stage buffer", n.text)));
                };
                let b = match r {
                    BufRef::Input(i) => &st.inputs[i as usize],
                    BufRef::Output(i) => &st.outputs[i as usize],
                    BufRef::Workspace(i) => &st.workspace[i as usize],
                    BufRef::Param(i) => {
                        let p = &st.params[i as usize];
                        &StageBuffer {
                            name: p.name.clone(),
                            dtype: p.dtype,
                            shape: p.shape.clone(),
                        }
                    }
                };
                if b.dtype != kp.dtype || b.shape != kp.shape {
                    return Err(cx.err(a.span(), format!(
                        "wrong buffer for parameter %{} of @{kname}: %{} is {}{:?}, the kernel expects {}{:?}",
                        kp.name, n.text, b.dtype, b.shape, kp.dtype, kp.shape
                    )));
                }
                if kp.access != Access::Read && matches!(r, BufRef::Input(_) | BufRef::Param(_)) {
                    return Err(cx.err(a.span(), format!("@{kname} writes parameter %{}, but %{} is a read-only stage input or parameter", kp.name, n.text)));
                }
                refs.push(r);
            }
            let ki = match st.kernels.iter().position(|x| x.name == k.name) {
                Some(i) => i,
                None => {
                    st.kernels.push(k);
                    st.kernels.len() - 1
                }
            };
            st.dispatches.push(Dispatch {
                kernel: ki as u32,
                args: refs,
            });
            Ok(())
        }
        other => Err(cx.err(
            other.span(),
            "a stage body holds `alloc`, `dispatch` and compile-time `if` only",
        )),
    }
}

/// Specializes a kernel directly (a dispatch root, or tests).
pub(crate) fn kernel_root(
    sp: &mut Spec<'_>,
    m: usize,
    name: &str,
    tv: &[(String, TValue)],
) -> Result<Kernel, Vec<String>> {
    let p = sp.item(m, name)?;
    let mut given = Vec::new();
    for (k, v) in tv {
        match tvalue_to_cv(v) {
            Some(c) => given.push((k.clone(), c, p.item.name.span)),
            None => {
                return Err(vec![p.src.error(
                    p.item.name.span,
                    format!("template value for `{k}` is not a constant"),
                )]);
            }
        }
    }
    let at = |s: Span, msg: String| p.src.error(s, msg);
    kernel(sp, m, name, given, &at, p.item.name.span).map_err(|e| vec![e])
}
