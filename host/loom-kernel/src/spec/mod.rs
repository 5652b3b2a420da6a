//! Specialization: a kernel or stage with bound template values -> the portable IR (`loom_ir::kernel`).
//!
//! Specialization and type checking are one pass: every expression evaluates either to a compile-time value
//! ([`ConstValue`]: integers, floats, booleans, strings, dtypes, shapes, kfunc references) or to an IR value with a
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

mod access;
mod builder;
mod calls;
mod control;
mod expr;
mod index;
mod kernels;
mod ops;
mod stages;
mod tile_ops;

pub(crate) use kernels::{kernel, kernel_root};
pub(crate) use stages::stage;

/// Deepest kfunc inlining (a kfunc calling itself is reported, not expanded forever).
pub const MAX_INLINE_DEPTH: usize = 32;
/// Most IR ops one kernel may have after inlining.
pub const MAX_KERNEL_OPS: usize = 1 << 16;
/// Most iterations of one `static.for` (a bound is a specialization error above it).
pub const MAX_STATIC_TRIPS: i64 = 4096;
/// Most `static.for` iterations one stage unrolls in all (nested loops multiply).
pub const MAX_STATIC_ITERATIONS: u64 = 1 << 16;

/// A compile-time value.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum ConstValue {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    DType(DType),
    Shape(Vec<i64>),
    /// A kfunc: (catalog module, name).
    Func(usize, String),
}

impl ConstValue {
    fn describe(&self) -> String {
        match self {
            ConstValue::Int(v) => format!("the integer {v}"),
            ConstValue::Float(v) => format!("the float {v:?}"),
            ConstValue::Bool(b) => format!("{b}"),
            ConstValue::Str(s) => format!("the string {s:?}"),
            ConstValue::DType(d) => format!("the dtype {d}"),
            ConstValue::Shape(s) => format!("the shape {s:?}"),
            ConstValue::Func(_, n) => format!("the kfunc @{n}"),
        }
    }
}

/// A value during specialization.
#[derive(Clone, Debug)]
enum SpecValue {
    /// A compile-time value.
    Const(ConstValue),
    /// An IR value of a concrete type.
    Dyn(KOperand, KType),
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

fn kind_ok(k: &TParamKind, v: &ConstValue) -> bool {
    matches!(
        (k, v),
        (TParamKind::I64, ConstValue::Int(_))
            | (TParamKind::Bool, ConstValue::Bool(_))
            | (TParamKind::Str, ConstValue::Str(_))
            | (TParamKind::DType, ConstValue::DType(_))
            | (TParamKind::Shape, ConstValue::Shape(_))
            | (TParamKind::Func { .. }, ConstValue::Func(..))
    )
}

pub(crate) fn tvalue_to_const(v: &TValue) -> Option<ConstValue> {
    Some(match v {
        TValue::I64(i) => ConstValue::Int(*i),
        TValue::Bool(b) => ConstValue::Bool(*b),
        TValue::Str(s) => ConstValue::Str(s.clone()),
        TValue::DType(d) => ConstValue::DType(DType::from_name(d)?),
        TValue::Shape(s) => ConstValue::Shape(s.clone()),
        TValue::Func(_) => return None,
    })
}

pub(crate) fn const_text(v: &ConstValue) -> String {
    match v {
        ConstValue::Int(i) => i.to_string(),
        ConstValue::Float(f) => format!("{f:?}"),
        ConstValue::Bool(b) => b.to_string(),
        ConstValue::Str(s) => format!("{s:?}"),
        ConstValue::DType(d) => d.to_string(),
        ConstValue::Shape(s) => format!(
            "[{}]",
            s.iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        ConstValue::Func(_, n) => format!("@{n}"),
    }
}

/// Binds an item's template parameters: given values (by name) first, then defaults in order (which may use
/// earlier parameters). `given` names must all exist.
fn bind_tparams(
    sp: &mut Spec<'_>,
    p: &Parsed,
    given: Vec<(String, ConstValue, Span)>,
    at: &dyn Fn(Span, String) -> String,
    call_span: Span,
) -> R<Vec<(String, ConstValue)>> {
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
    let mut out: Vec<(String, ConstValue)> = Vec::new();
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
            let env: HashMap<String, ConstValue> = out.iter().cloned().collect();
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
    env: &HashMap<String, ConstValue>,
) -> Result<ConstValue, String> {
    Ok(match e {
        ConstExpr::Int(v, _) => ConstValue::Int(*v),
        ConstExpr::Float(v, _) => ConstValue::Float(*v),
        ConstExpr::Bool(v, _) => ConstValue::Bool(*v),
        ConstExpr::Str(s, _) => ConstValue::Str(s.clone()),
        ConstExpr::List(items, _) => {
            let mut dims = Vec::new();
            for i in items {
                match const_eval(sp, p, i, env)? {
                    ConstValue::Int(d) => dims.push(d),
                    other => {
                        return Err(format!(
                            "shape dims must be integers, found {}",
                            other.describe()
                        ));
                    }
                }
            }
            ConstValue::Shape(dims)
        }
        ConstExpr::Word(n) => {
            word_value(&n.text, env).ok_or_else(|| format!("unknown name `{}`", n.text))?
        }
        ConstExpr::Symbol(n) => {
            let (m, name) = sp.resolve(p.module, &n.text, DeviceKind::Kfunc)?;
            ConstValue::Func(m, name)
        }
        ConstExpr::Neg(inner, _) => match const_eval(sp, p, inner, env)? {
            ConstValue::Int(v) => ConstValue::Int(v.checked_neg().ok_or("integer overflow")?),
            ConstValue::Float(v) => ConstValue::Float(-v),
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

fn word_value(w: &str, env: &HashMap<String, ConstValue>) -> Option<ConstValue> {
    env.get(w)
        .cloned()
        .or_else(|| DType::from_name(w).map(ConstValue::DType))
}

fn fold_arith(op: char, a: &ConstValue, b: &ConstValue) -> Result<ConstValue, String> {
    match (a, b) {
        (ConstValue::Int(a), ConstValue::Int(b)) => {
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
            r.map(ConstValue::Int)
                .ok_or_else(|| "integer overflow in a constant expression".into())
        }
        (ConstValue::Float(_) | ConstValue::Int(_), ConstValue::Float(_) | ConstValue::Int(_)) => {
            let f = |v: &ConstValue| match v {
                ConstValue::Int(i) => *i as f64,
                ConstValue::Float(f) => *f,
                _ => 0.0,
            };
            let (a, b) = (f(a), f(b));
            Ok(ConstValue::Float(match op {
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

/// One kernel being built (kfunc bodies are inlined into it with their own frame).
struct KernelBuilder<'s, 'c> {
    sp: &'s mut Spec<'c>,
    /// The item whose text is being evaluated (the kernel, or an inlined kfunc).
    cur: Rc<Parsed>,
    env: HashMap<String, ConstValue>,
    scopes: Vec<HashMap<String, SpecValue>>,
    values: Vec<KValueDef>,
    names: HashMap<String, u32>,
    regions: Vec<Vec<KOp>>,
    params: Vec<KParam>,
    inline_depth: usize,
    nops: usize,
    /// Stages: the indices defined of each family (`%h[0]`, `%h[1]`: `h` -> {0, 1}).
    families: HashMap<String, std::collections::BTreeSet<i64>>,
    /// Stages: member name -> (family, index), `h1` -> (`h`, 1), for diagnostics.
    members: HashMap<String, (String, i64)>,
    /// Stages: `static.for` iterations unrolled so far.
    unrolled: u64,
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
