//! The verifier: everything the VM and the printer rely on, checked before anything executes.
//!
//! It runs on decoded `.loombc` (untrusted) as on freshly compiled modules, so it never panics and never trusts
//! an index. It is linear in the size of the module (per-call template checks use tables built once per callee)
//! and recurses only once per region nesting level, up to [`MAX_NESTING`].
//!
//! What it checks:
//! - **Names:** identifiers are valid words; value names are `[A-Za-z0-9_]+` and unique in their function;
//!   module-level symbols (decls, records, consts, functions) share one namespace, because the text form refers
//!   to all of them as `@name`; template parameter names are plain identifiers other than `true`/`false`/`null`.
//! - **SSA scoping:** every value is defined exactly once (parameters by [`Function::params`], which must be
//!   values `0..n`; region arguments by `for`/`while`), and used only after its definition in the same region or an
//!   enclosing one.
//! - **Types:** the result types of every op are the ones [`type_op`] derives from its operands (or the callee's
//!   signature), operands are [`assignable`] to what the op expects, immediates are finite and `null` is of a
//!   nullable reference type, types nest at most [`MAX_TYPE_DEPTH`] deep.
//! - **Regions:** each region ends in exactly one terminator of the right kind (`return` for a body, `yield` for
//!   `if`/`for`/`while` bodies, `condition` for a `while` condition) carrying the right types.
//! - **Templates:** template arguments name the callee's parameters with values of the right kind; missing ones
//!   have defaults; forwarded ones name a caller parameter of the same kind.
//! - **Programs:** no templates at all, only capability imports, export indices in range.

use crate::bytecode::{MAX_NESTING, MAX_TYPE_DEPTH};
use crate::opcode::{ArgTy, assignable, type_op};
use crate::{
    Callee, Decl, Function, Imm, Loc, Module, Op, OpKind, Operand, Program, Record, Region,
    Signature, TArg, TParam, TParamKind, TValue, Type, ValueId,
};
use std::collections::{HashMap, HashSet};
use std::fmt;
use thiserror::Error;

/// A verification failure: which item, where, and what is wrong. The fault lies with whoever produced the IR (a
/// compiler bug for freshly compiled code, a corrupt or hostile file for decoded bytecode).
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("{item}{}: {message}", AtLoc(*loc))]
pub struct VerifyError {
    /// `function @f`, `record @R`, `decl @m.f`, `const @C`, `module @m` or `program`.
    pub item: String,
    /// The op's (or item's) location; 0:0 when unknown.
    pub loc: Loc,
    pub message: String,
}

struct AtLoc(Loc);

impl fmt::Display for AtLoc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.line == 0 {
            Ok(())
        } else {
            write!(f, " at {}:{}", self.0.line, self.0.col)
        }
    }
}

type Result<T> = std::result::Result<T, VerifyError>;

/// `[A-Za-z_][A-Za-z0-9_]*`
pub(crate) fn is_ident(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Identifiers joined by `.`: `embed.control`, `input.encode`.
pub(crate) fn is_word(s: &str) -> bool {
    s.split('.').all(is_ident)
}

/// `[A-Za-z0-9_]+`
pub(crate) fn is_value_name(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn kind_name(k: &TParamKind) -> String {
    match k {
        TParamKind::I64 => "i64".into(),
        TParamKind::Bool => "bool".into(),
        TParamKind::Str => "str".into(),
        TParamKind::DType => "dtype".into(),
        TParamKind::Shape => "shape".into(),
        TParamKind::Func(sig) => format!("func{}", crate::print::SigText(sig)),
    }
}

fn check_type(t: &Type) -> std::result::Result<(), String> {
    let mut t = t;
    let mut depth = 1;
    loop {
        match t {
            Type::List(elem) => {
                depth += 1;
                if depth > MAX_TYPE_DEPTH {
                    return Err(format!("a type nests deeper than {MAX_TYPE_DEPTH}"));
                }
                t = elem;
            }
            Type::Ref { name, .. } if !is_word(name) => {
                return Err(format!("invalid reference type name {name:?}"));
            }
            _ => return Ok(()),
        }
    }
}

fn check_types(ts: &[Type]) -> std::result::Result<(), String> {
    ts.iter().try_for_each(check_type)
}

fn check_imm(imm: &Imm) -> std::result::Result<(), String> {
    match imm {
        Imm::F32(v) if !v.is_finite() => Err(format!(
            "non-finite float immediate {v:?} (it has no text form)"
        )),
        Imm::F64(v) if !v.is_finite() => Err(format!(
            "non-finite float immediate {v:?} (it has no text form)"
        )),
        Imm::Null(t) => {
            check_type(t)?;
            if t.is_nullable() {
                Ok(())
            } else {
                Err(format!(
                    "null must have a nullable reference type, found {t}"
                ))
            }
        }
        _ => Ok(()),
    }
}

/// Per-callee template parameter table, built once so that checking a call costs O(its template arguments).
struct TpTable {
    index: HashMap<String, usize>,
    required: usize,
}

impl TpTable {
    fn new(tps: &[TParam]) -> TpTable {
        TpTable {
            index: tps
                .iter()
                .enumerate()
                .map(|(i, tp)| (tp.name.clone(), i))
                .collect(),
            required: tps.iter().filter(|tp| tp.default.is_none()).count(),
        }
    }
}

/// What a function body or region may refer to: the module's (or program's) items.
struct Env<'a> {
    funcs: &'a [Function],
    decls: &'a [Decl],
    records: &'a [Record],
    program: bool,
    /// Signature of each function (its header was checked first, so these are safe to compute).
    sigs: Vec<Signature>,
    func_tps: Vec<TpTable>,
    decl_tps: Vec<TpTable>,
}

fn err(item: &str, loc: Loc, message: impl Into<String>) -> VerifyError {
    VerifyError {
        item: item.to_string(),
        loc,
        message: message.into(),
    }
}

impl<'a> Env<'a> {
    fn new(
        funcs: &'a [Function],
        decls: &'a [Decl],
        records: &'a [Record],
        program: bool,
    ) -> Env<'a> {
        Env {
            funcs,
            decls,
            records,
            program,
            sigs: Vec::new(),
            func_tps: funcs.iter().map(|f| TpTable::new(&f.tparams)).collect(),
            decl_tps: decls.iter().map(|d| TpTable::new(&d.tparams)).collect(),
        }
    }

    fn callee_name(&self, c: &Callee, caller_tps: &[TParam]) -> String {
        match c {
            Callee::Func(i) => match self.funcs.get(*i as usize) {
                Some(f) => format!("@{}", f.name),
                None => format!("function #{i}"),
            },
            Callee::Decl(i) => match self.decls.get(*i as usize) {
                Some(d) => format!("@{}", d.symbol),
                None => format!("decl #{i}"),
            },
            Callee::TParam(i) => match caller_tps.get(*i as usize) {
                Some(tp) => tp.name.clone(),
                None => format!("template parameter #{i}"),
            },
        }
    }

    /// Checks a function header: names, values, parameters, results; returns its signature.
    fn func_header(&self, f: &Function) -> Result<Signature> {
        let item = format!("function @{}", f.name);
        let e = |m: String| err(&item, f.loc, m);
        if self.program {
            if f.name.is_empty() {
                return Err(e("empty function name".into()));
            }
            if !f.tparams.is_empty() {
                return Err(e("a linked program cannot have template parameters".into()));
            }
        } else if !is_word(&f.name) {
            return Err(e(format!("invalid function name {:?}", f.name)));
        }
        let mut names = HashSet::with_capacity(f.values.len());
        for v in &f.values {
            if !is_value_name(&v.name) {
                return Err(e(format!("invalid value name {:?}", v.name)));
            }
            if !names.insert(v.name.as_str()) {
                return Err(e(format!("value name %{} is used twice", v.name)));
            }
            check_type(&v.ty).map_err(e)?;
        }
        let mut params = Vec::with_capacity(f.params.len());
        for (i, p) in f.params.iter().enumerate() {
            // why: `Function::params` documents that the parameters are the first values; the VM relies on it
            if p.0 as usize != i || i >= f.values.len() {
                return Err(e(format!(
                    "parameter {} must be value #{i}, found #{}",
                    i + 1,
                    p.0
                )));
            }
            params.push(f.values[i].ty.clone());
        }
        check_types(&f.results).map_err(e)?;
        Ok(Signature {
            params,
            results: f.results.clone(),
        })
    }

    fn tparams(&self, item: &str, loc: Loc, tps: &[TParam]) -> Result<()> {
        if self.program && !tps.is_empty() {
            return Err(err(
                item,
                loc,
                "a linked program cannot have template parameters",
            ));
        }
        let mut seen = HashSet::with_capacity(tps.len());
        for tp in tps {
            if !is_ident(&tp.name) || matches!(tp.name.as_str(), "true" | "false" | "null") {
                return Err(err(
                    item,
                    loc,
                    format!("invalid template parameter name {:?}", tp.name),
                ));
            }
            if !seen.insert(tp.name.as_str()) {
                return Err(err(
                    item,
                    loc,
                    format!("template parameter {} is declared twice", tp.name),
                ));
            }
            if let TParamKind::Func(sig) = &tp.kind {
                check_types(&sig.params)
                    .and_then(|()| check_types(&sig.results))
                    .map_err(|m| err(item, loc, m))?;
            }
            if let Some(v) = &tp.default {
                self.tvalue(v, &tp.kind).map_err(|m| {
                    err(
                        item,
                        loc,
                        format!("default of template parameter {}: {m}", tp.name),
                    )
                })?;
            }
        }
        Ok(())
    }

    /// Whether a template value fits a template parameter kind.
    fn tvalue(&self, v: &TValue, kind: &TParamKind) -> std::result::Result<(), String> {
        match (v, kind) {
            (TValue::I64(_), TParamKind::I64)
            | (TValue::Bool(_), TParamKind::Bool)
            | (TValue::Str(_), TParamKind::Str)
            | (TValue::Shape(_), TParamKind::Shape) => Ok(()),
            (TValue::DType(d), TParamKind::DType) => {
                if is_ident(d) {
                    Ok(())
                } else {
                    Err(format!("invalid dtype {d:?}"))
                }
            }
            (TValue::Func(c), TParamKind::Func(want)) => {
                let (sig, table, name) = match c {
                    Callee::Func(i) => match self.funcs.get(*i as usize) {
                        Some(f) => (
                            self.sigs.get(*i as usize),
                            self.func_tps.get(*i as usize),
                            &f.name,
                        ),
                        None => return Err(format!("function #{i} is out of range")),
                    },
                    Callee::Decl(i) => match self.decls.get(*i as usize) {
                        Some(d) => (Some(&d.sig), self.decl_tps.get(*i as usize), &d.symbol),
                        None => return Err(format!("decl #{i} is out of range")),
                    },
                    Callee::TParam(_) => {
                        return Err(
                            "a template parameter is passed on by forwarding, not as a value"
                                .into(),
                        );
                    }
                };
                if table.is_some_and(|t| t.required > 0) {
                    return Err(format!(
                        "@{name} needs template arguments and cannot be passed as a function value"
                    ));
                }
                match sig {
                    Some(sig) if sig == want => Ok(()),
                    Some(sig) => Err(format!(
                        "@{name} has signature {}, expected {}",
                        crate::print::SigText(sig),
                        crate::print::SigText(want)
                    )),
                    // signatures not computed yet: only while checking headers, which never gets here
                    None => Ok(()),
                }
            }
            (v, kind) => Err(format!(
                "expected a value of kind {}, found {}",
                kind_name(kind),
                match v {
                    TValue::I64(_) => "an i64",
                    TValue::Bool(_) => "a bool",
                    TValue::Str(_) => "a str",
                    TValue::DType(_) => "a dtype",
                    TValue::Shape(_) => "a shape",
                    TValue::Func(_) => "a function",
                }
            )),
        }
    }

    fn record(&self, r: &Record) -> Result<()> {
        let item = format!("record @{}", r.name);
        let e = |m: String| err(&item, r.loc, m);
        if !is_word(&r.name) {
            return Err(e(format!("invalid record name {:?}", r.name)));
        }
        if r.fields.is_empty() {
            return Err(e("a record needs at least one field".into()));
        }
        let mut seen = HashSet::with_capacity(r.fields.len());
        for (name, t) in &r.fields {
            if !is_ident(name) {
                return Err(e(format!("invalid field name {name:?}")));
            }
            if !seen.insert(name.as_str()) {
                return Err(e(format!("field {name} is declared twice")));
            }
            if !t.is_scalar() {
                return Err(e(format!(
                    "field {name} has type {t}; record fields must be scalars"
                )));
            }
        }
        Ok(())
    }

    fn decl(&self, d: &Decl) -> Result<()> {
        let item = format!("decl @{}", d.symbol);
        let e = |m: String| err(&item, d.loc, m);
        if !is_word(&d.symbol) {
            return Err(e(format!("invalid symbol {:?}", d.symbol)));
        }
        self.tparams(&item, d.loc, &d.tparams)?;
        check_types(&d.sig.params).map_err(e)?;
        check_types(&d.sig.results).map_err(e)?;
        match &d.import {
            Some(m) if !is_word(m) => Err(e(format!("invalid import module name {m:?}"))),
            None if self.program => Err(e(
                "a linked program may only import capabilities (`import(\"...\")`)".into(),
            )),
            _ => Ok(()),
        }
    }

    fn records(&self) -> Result<()> {
        let mut seen = HashSet::with_capacity(self.records.len());
        for r in self.records {
            self.record(r)?;
            if !seen.insert(r.name.as_str()) {
                return Err(err(
                    &format!("record @{}", r.name),
                    r.loc,
                    "duplicate record name",
                ));
            }
        }
        Ok(())
    }

    /// Checks the headers, then computes the signatures, then the template parameter lists (whose function-valued
    /// defaults need the signatures).
    fn items(&mut self) -> Result<()> {
        let mut sigs = Vec::with_capacity(self.funcs.len());
        for f in self.funcs {
            sigs.push(self.func_header(f)?);
        }
        self.sigs = sigs;
        for d in self.decls {
            self.decl(d)?;
        }
        self.records()?;
        for f in self.funcs {
            self.tparams(&format!("function @{}", f.name), f.loc, &f.tparams)?;
        }
        Ok(())
    }

    fn bodies(&self) -> Result<()> {
        for f in self.funcs {
            FnCx::new(self, f).body()?;
        }
        Ok(())
    }
}

/// The terminator a region must end with.
#[derive(Clone)]
enum Term {
    Return,
    Yield(Vec<Type>),
    Condition,
}

impl Term {
    fn name(&self) -> &'static str {
        match self {
            Term::Return => "return",
            Term::Yield(_) => "yield",
            Term::Condition => "condition",
        }
    }
}

fn op_name(op: &Op) -> String {
    match &op.kind {
        OpKind::Simple { opcode, .. } => opcode.name().to_string(),
        OpKind::Call { .. } => "call".into(),
        OpKind::If { .. } => "if".into(),
        OpKind::For { .. } => "for".into(),
        OpKind::While { .. } => "while".into(),
        OpKind::Yield(_) => "yield".into(),
        OpKind::Condition(_) => "condition".into(),
        OpKind::Return(_) => "return".into(),
    }
}

/// A region to start.
struct Enter<'a> {
    r: &'a Region,
    args: Vec<ValueId>,
    /// False for a `while` body, whose arguments the condition region already defined.
    first_binding: bool,
    term: Term,
    depth: usize,
    owner_loc: Loc,
    owner: &'static str,
}

/// Work items of the body walk.
enum Task<'a> {
    Enter(Enter<'a>),
    /// Continue region `r` at op `i`; `mark` is the scope length to truncate back to at its end.
    Ops {
        r: &'a Region,
        i: usize,
        term: Term,
        depth: usize,
        owner: &'static str,
        mark: usize,
    },
    /// A structured op's regions are done: check and define its results.
    Results {
        op: &'a Op,
        tys: Vec<Type>,
        what: &'static str,
    },
}

/// Verification state of one function body.
struct FnCx<'e, 'a> {
    env: &'e Env<'a>,
    f: &'a Function,
    item: String,
    /// Ever defined (a second definition is an error).
    defined: Vec<bool>,
    /// Defined and in scope here.
    visible: Vec<bool>,
    /// Values in scope, innermost region last; a region truncates it back on exit.
    scope: Vec<u32>,
}

impl<'e, 'a> FnCx<'e, 'a> {
    fn new(env: &'e Env<'a>, f: &'a Function) -> Self {
        FnCx {
            env,
            f,
            item: format!("function @{}", f.name),
            defined: vec![false; f.values.len()],
            visible: vec![false; f.values.len()],
            scope: Vec::new(),
        }
    }

    fn err(&self, loc: Loc, m: impl Into<String>) -> VerifyError {
        err(&self.item, loc, m)
    }

    fn name(&self, v: ValueId) -> String {
        match self.f.values.get(v.0 as usize) {
            Some(d) => format!("%{}", d.name),
            None => format!("value #{}", v.0),
        }
    }

    fn value_ty(&self, v: ValueId, loc: Loc) -> Result<&'a Type> {
        match self.f.values.get(v.0 as usize) {
            Some(d) => Ok(&d.ty),
            None => Err(self.err(
                loc,
                format!(
                    "value #{} is out of range (the function has {} values)",
                    v.0,
                    self.f.values.len()
                ),
            )),
        }
    }

    fn define(&mut self, v: ValueId, loc: Loc) -> Result<()> {
        self.value_ty(v, loc)?;
        let i = v.0 as usize;
        if self.defined[i] {
            return Err(self.err(loc, format!("{} is defined more than once", self.name(v))));
        }
        self.defined[i] = true;
        self.visible[i] = true;
        self.scope.push(v.0);
        Ok(())
    }

    /// Makes an already defined region argument visible again (a `while` body sees the iter values too).
    fn rebind(&mut self, v: ValueId) {
        if let Some(vis) = self.visible.get_mut(v.0 as usize) {
            *vis = true;
            self.scope.push(v.0);
        }
    }

    fn use_value(&self, v: ValueId, loc: Loc) -> Result<&'a Type> {
        let t = self.value_ty(v, loc)?;
        let i = v.0 as usize;
        if !self.visible[i] {
            let why = if self.defined[i] {
                "outside the region that defines it"
            } else {
                "before its definition"
            };
            return Err(self.err(loc, format!("{} is used {why}", self.name(v))));
        }
        Ok(t)
    }

    fn operand(&self, o: &Operand, loc: Loc) -> Result<ArgTy> {
        match o {
            Operand::Value(v) => Ok(ArgTy::Known(self.use_value(*v, loc)?.clone())),
            Operand::Imm(imm) => {
                check_imm(imm).map_err(|m| self.err(loc, m))?;
                Ok(ArgTy::Known(imm.ty()))
            }
            Operand::TParam(i) => {
                if self.env.program {
                    return Err(self.err(loc, "template parameter operand in a linked program"));
                }
                let Some(tp) = self.f.tparams.get(*i as usize) else {
                    return Err(self.err(loc, format!("template parameter #{i} is out of range")));
                };
                match tp.kind {
                    TParamKind::I64 => Ok(ArgTy::Known(Type::I64)),
                    TParamKind::Bool => Ok(ArgTy::Known(Type::I1)),
                    TParamKind::Str => Ok(ArgTy::Known(Type::Str)),
                    ref k => Err(self.err(
                        loc,
                        format!(
                            "template parameter {} of kind {} cannot be used as a value",
                            tp.name,
                            kind_name(k)
                        ),
                    )),
                }
            }
            Operand::Record(r) => match self.env.records.get(*r as usize) {
                Some(_) => Ok(ArgTy::Record),
                None => Err(self.err(loc, format!("record #{r} is out of range"))),
            },
            Operand::Field(r, fi) => {
                let Some(rec) = self.env.records.get(*r as usize) else {
                    return Err(self.err(loc, format!("record #{r} is out of range")));
                };
                match rec.fields.get(*fi as usize) {
                    Some((_, t)) => Ok(ArgTy::Field(t.clone())),
                    None => Err(self.err(
                        loc,
                        format!("field #{fi} of record @{} is out of range", rec.name),
                    )),
                }
            }
        }
    }

    /// The type of an operand that must be a value (not a record or field).
    fn value_operand(&self, o: &Operand, loc: Loc, what: &str) -> Result<Type> {
        match self.operand(o, loc)? {
            ArgTy::Known(t) => Ok(t),
            _ => Err(self.err(loc, format!("{what}: a record operand is not allowed here"))),
        }
    }

    /// Operands given against the types expected (`call` arguments, `yield`/`return` values, `iter` inits).
    fn operands_against(&self, os: &[Operand], want: &[Type], loc: Loc, what: &str) -> Result<()> {
        if os.len() != want.len() {
            return Err(self.err(
                loc,
                format!(
                    "{what} gives {} value{}, expected {}",
                    os.len(),
                    if os.len() == 1 { "" } else { "s" },
                    want.len()
                ),
            ));
        }
        for (i, (o, w)) in os.iter().zip(want).enumerate() {
            let t = self.value_operand(o, loc, what)?;
            if !assignable(&t, w) {
                return Err(self.err(
                    loc,
                    format!("{what}: value {} has type {t}, expected {w}", i + 1),
                ));
            }
        }
        Ok(())
    }

    /// Checks that `results` have the types `want` and defines them.
    fn results(&mut self, op: &Op, want: &[Type], what: &str) -> Result<()> {
        if op.results.len() != want.len() {
            return Err(self.err(
                op.loc,
                format!(
                    "{what} produces {} result{}, but the op defines {}",
                    want.len(),
                    if want.len() == 1 { "" } else { "s" },
                    op.results.len()
                ),
            ));
        }
        for (v, w) in op.results.iter().zip(want) {
            let t = self.value_ty(*v, op.loc)?;
            if t != w {
                return Err(self.err(
                    op.loc,
                    format!("{} has type {t}, but {what} produces {w}", self.name(*v)),
                ));
            }
            self.define(*v, op.loc)?;
        }
        Ok(())
    }

    /// Walks the body with an explicit work stack rather than recursion: nesting is bounded by
    /// [`MAX_NESTING`], but a recursive walk needs several KiB of stack per level in debug builds, which 256
    /// levels on a 2 MiB thread cannot afford.
    fn body(mut self) -> Result<()> {
        let f = self.f;
        let mut stack = vec![Task::Enter(Enter {
            r: &f.body,
            args: f.params.clone(),
            first_binding: true,
            term: Term::Return,
            depth: 0,
            owner_loc: f.loc,
            owner: "function body",
        })];
        while let Some(task) = stack.pop() {
            match task {
                Task::Enter(e) => {
                    let mark = self.enter(&e)?;
                    stack.push(Task::Ops {
                        r: e.r,
                        i: 0,
                        term: e.term,
                        depth: e.depth,
                        owner: e.owner,
                        mark,
                    });
                }
                Task::Ops {
                    r,
                    mut i,
                    term,
                    depth,
                    owner,
                    mark,
                } => loop {
                    let Some(op) = r.ops.get(i) else {
                        for v in self.scope.drain(mark..) {
                            self.visible[v as usize] = false;
                        }
                        break;
                    };
                    let last = i + 1 == r.ops.len();
                    let is_term = matches!(
                        op.kind,
                        OpKind::Yield(_) | OpKind::Condition(_) | OpKind::Return(_)
                    );
                    if is_term && !last {
                        return Err(self.err(
                            op.loc,
                            format!("`{}` must be the last op of its region", op_name(op)),
                        ));
                    }
                    if is_term {
                        self.terminator(op, &term, owner)?;
                        i += 1;
                        continue;
                    }
                    if last {
                        return Err(self.err(
                            op.loc,
                            format!(
                                "{owner} must end in `{}`, found `{}`",
                                term.name(),
                                op_name(op)
                            ),
                        ));
                    }
                    let nested = self.op(op, depth)?;
                    i += 1;
                    if !nested.is_empty() {
                        stack.push(Task::Ops {
                            r,
                            i,
                            term,
                            depth,
                            owner,
                            mark,
                        });
                        stack.extend(nested);
                        break;
                    }
                },
                Task::Results { op, tys, what } => self.results(op, &tys, what)?,
            }
        }
        if let Some(i) = self.defined.iter().position(|d| !d) {
            return Err(self.err(
                f.loc,
                format!("{} is never defined", self.name(ValueId(i as u32))),
            ));
        }
        Ok(())
    }

    /// Starts a region: checks its depth, binds its arguments, requires it to be non-empty. Returns the scope
    /// mark to truncate back to when it ends.
    fn enter(&mut self, e: &Enter<'a>) -> Result<usize> {
        if e.depth > MAX_NESTING {
            return Err(self.err(
                e.owner_loc,
                format!("regions nest deeper than {MAX_NESTING}"),
            ));
        }
        let mark = self.scope.len();
        for a in &e.args {
            if e.first_binding {
                self.define(*a, e.owner_loc)?;
            } else {
                self.rebind(*a);
            }
        }
        if e.r.ops.is_empty() {
            return Err(self.err(
                e.owner_loc,
                format!("{} is empty: it must end in `{}`", e.owner, e.term.name()),
            ));
        }
        Ok(mark)
    }

    fn terminator(&self, op: &Op, term: &Term, owner: &str) -> Result<()> {
        if !op.results.is_empty() {
            return Err(self.err(op.loc, format!("`{}` defines no values", op_name(op))));
        }
        match (&op.kind, term) {
            (OpKind::Return(os), Term::Return) => {
                self.operands_against(os, &self.f.results, op.loc, "return")
            }
            (OpKind::Yield(os), Term::Yield(tys)) => {
                self.operands_against(os, tys, op.loc, "yield")
            }
            (OpKind::Condition(o), Term::Condition) => {
                let t = self.value_operand(o, op.loc, "condition")?;
                if t != Type::I1 {
                    return Err(self.err(op.loc, format!("condition must be i1, found {t}")));
                }
                Ok(())
            }
            _ => Err(self.err(
                op.loc,
                format!(
                    "{owner} must end in `{}`, found `{}`",
                    term.name(),
                    op_name(op)
                ),
            )),
        }
    }

    /// Checks a non-terminator op. A structured op returns the tasks for its regions and results, in stack
    /// order (the first region last); the caller runs them before the next op.
    fn op(&mut self, op: &'a Op, depth: usize) -> Result<Vec<Task<'a>>> {
        let loc = op.loc;
        let enter = |r: &'a Region, args: Vec<ValueId>, first_binding, term, owner| {
            Task::Enter(Enter {
                r,
                args,
                first_binding,
                term,
                depth: depth + 1,
                owner_loc: loc,
                owner,
            })
        };
        match &op.kind {
            OpKind::Simple {
                opcode,
                operands,
                annotation,
            } => {
                let mut args = Vec::with_capacity(operands.len());
                for o in operands {
                    args.push(self.operand(o, loc)?);
                }
                if let Some(t) = annotation {
                    check_type(t).map_err(|m| self.err(loc, m))?;
                }
                let typing =
                    type_op(*opcode, &args, annotation.as_ref()).map_err(|m| self.err(loc, m))?;
                for (i, (a, want)) in args.iter().zip(&typing.operands).enumerate() {
                    if let ArgTy::Known(have) = a {
                        if !assignable(have, want) {
                            return Err(self.err(
                                loc,
                                format!(
                                    "{opcode}: operand {} has type {have}, expected {want}",
                                    i + 1
                                ),
                            ));
                        }
                    }
                }
                self.results(op, &typing.results, opcode.name())?;
                Ok(Vec::new())
            }
            OpKind::Call {
                callee,
                targs,
                args,
            } => {
                self.call(op, callee, targs, args)?;
                Ok(Vec::new())
            }
            OpKind::If {
                cond,
                then_region,
                else_region,
            } => {
                let t = self.value_operand(cond, loc, "if")?;
                if t != Type::I1 {
                    return Err(self.err(loc, format!("if condition must be i1, found {t}")));
                }
                let tys = self.result_types(op)?;
                Ok(vec![
                    Task::Results {
                        op,
                        tys: tys.clone(),
                        what: "if",
                    },
                    enter(
                        else_region,
                        vec![],
                        true,
                        Term::Yield(tys.clone()),
                        "else region",
                    ),
                    enter(then_region, vec![], true, Term::Yield(tys), "if region"),
                ])
            }
            OpKind::For {
                lo,
                hi,
                step,
                iv,
                iters,
                inits,
                body,
            } => {
                let ivt = self.value_ty(*iv, loc)?;
                if !ivt.is_int() {
                    return Err(self.err(
                        loc,
                        format!(
                            "for induction variable {} must be i32 or i64, found {ivt}",
                            self.name(*iv)
                        ),
                    ));
                }
                for (what, o) in [("lower bound", lo), ("upper bound", hi), ("step", step)] {
                    let t = self.value_operand(o, loc, "for")?;
                    if t != *ivt {
                        return Err(self.err(
                            loc,
                            format!("for {what} has type {t}, expected {ivt} (the induction variable's type)"),
                        ));
                    }
                }
                if let Operand::Imm(Imm::I32(s)) = step {
                    if *s <= 0 {
                        return Err(self.err(loc, format!("for step must be positive, found {s}")));
                    }
                }
                if let Operand::Imm(Imm::I64(s)) = step {
                    if *s <= 0 {
                        return Err(self.err(loc, format!("for step must be positive, found {s}")));
                    }
                }
                let tys = self.iters(op, iters, inits, "for")?;
                let mut args = Vec::with_capacity(iters.len() + 1);
                args.push(*iv);
                args.extend_from_slice(iters);
                Ok(vec![
                    Task::Results {
                        op,
                        tys: tys.clone(),
                        what: "for",
                    },
                    enter(body, args, true, Term::Yield(tys), "for body"),
                ])
            }
            OpKind::While {
                iters,
                inits,
                cond_region,
                body,
            } => {
                let tys = self.iters(op, iters, inits, "while")?;
                Ok(vec![
                    Task::Results {
                        op,
                        tys: tys.clone(),
                        what: "while",
                    },
                    enter(body, iters.clone(), false, Term::Yield(tys), "while body"),
                    enter(
                        cond_region,
                        iters.clone(),
                        true,
                        Term::Condition,
                        "while condition region",
                    ),
                ])
            }
            // the region loop sends terminators to `terminator`
            OpKind::Yield(_) | OpKind::Condition(_) | OpKind::Return(_) => Ok(Vec::new()),
        }
    }

    fn result_types(&self, op: &Op) -> Result<Vec<Type>> {
        op.results
            .iter()
            .map(|v| self.value_ty(*v, op.loc).cloned())
            .collect()
    }

    /// Checks `iter` values against their initial values; returns their types.
    fn iters(
        &self,
        op: &Op,
        iters: &[ValueId],
        inits: &[Operand],
        what: &str,
    ) -> Result<Vec<Type>> {
        if iters.len() != inits.len() {
            return Err(self.err(
                op.loc,
                format!(
                    "{what} has {} iter values but {} initial values",
                    iters.len(),
                    inits.len()
                ),
            ));
        }
        let mut tys = Vec::with_capacity(iters.len());
        for v in iters {
            tys.push(self.value_ty(*v, op.loc)?.clone());
        }
        self.operands_against(inits, &tys, op.loc, &format!("{what} initial values"))?;
        Ok(tys)
    }

    fn call(
        &mut self,
        op: &Op,
        callee: &Callee,
        targs: &[(String, TArg)],
        args: &[Operand],
    ) -> Result<()> {
        let loc = op.loc;
        let env = self.env;
        let name = env.callee_name(callee, &self.f.tparams);
        let (sig, tps, table): (&Signature, &[TParam], Option<&TpTable>) = match callee {
            Callee::Func(i) => match (env.funcs.get(*i as usize), env.sigs.get(*i as usize)) {
                (Some(f), Some(sig)) => (sig, &f.tparams, env.func_tps.get(*i as usize)),
                _ => return Err(self.err(loc, format!("call to {name}, which is out of range"))),
            },
            Callee::Decl(i) => match env.decls.get(*i as usize) {
                Some(d) => (&d.sig, &d.tparams, env.decl_tps.get(*i as usize)),
                None => return Err(self.err(loc, format!("call to {name}, which is out of range"))),
            },
            Callee::TParam(i) => {
                if env.program {
                    return Err(
                        self.err(loc, "call through a template parameter in a linked program")
                    );
                }
                match self.f.tparams.get(*i as usize) {
                    Some(TParam {
                        kind: TParamKind::Func(sig),
                        ..
                    }) => (sig, &[], None),
                    Some(tp) => {
                        return Err(self.err(
                            loc,
                            format!(
                                "template parameter {} has kind {} and cannot be called",
                                tp.name,
                                kind_name(&tp.kind)
                            ),
                        ));
                    }
                    None => {
                        return Err(self.err(loc, format!("call to {name}, which is out of range")));
                    }
                }
            }
        };
        if env.program && !targs.is_empty() {
            return Err(self.err(loc, "template arguments in a linked program"));
        }
        let mut given = HashSet::with_capacity(targs.len());
        let mut required_given = 0;
        for (tname, arg) in targs {
            let Some(&ti) = table.and_then(|t| t.index.get(tname)) else {
                return Err(self.err(loc, format!("{name} has no template parameter {tname}")));
            };
            if !given.insert(tname.as_str()) {
                return Err(self.err(loc, format!("template argument {tname} is given twice")));
            }
            let tp = &tps[ti];
            if tp.default.is_none() {
                required_given += 1;
            }
            match arg {
                TArg::Value(v) => env.tvalue(v, &tp.kind).map_err(|m| {
                    self.err(loc, format!("template argument {tname} of {name}: {m}"))
                })?,
                TArg::Forward(ci) => {
                    let Some(ctp) = self.f.tparams.get(*ci as usize) else {
                        return Err(self.err(
                            loc,
                            format!("template argument {tname} forwards template parameter #{ci}, which is out of range"),
                        ));
                    };
                    if ctp.kind != tp.kind {
                        return Err(self.err(
                            loc,
                            format!(
                                "template argument {tname} of {name}: forwarded parameter {} has kind {}, expected {}",
                                ctp.name,
                                kind_name(&ctp.kind),
                                kind_name(&tp.kind)
                            ),
                        ));
                    }
                }
            }
        }
        if table.is_some_and(|t| required_given < t.required) {
            // error path only: find the first missing one
            if let Some(tp) = tps
                .iter()
                .find(|tp| tp.default.is_none() && !given.contains(tp.name.as_str()))
            {
                return Err(self.err(
                    loc,
                    format!("call to {name} is missing template argument {}", tp.name),
                ));
            }
        }
        self.operands_against(args, &sig.params, loc, &format!("call to {name}"))?;
        self.results(op, &sig.results, &format!("call to {name}"))
    }
}

fn unique_symbols<'a>(
    item_names: impl Iterator<Item = (&'static str, &'a str, Loc)>,
) -> Result<()> {
    let mut seen = HashSet::new();
    for (kind, name, loc) in item_names {
        if !seen.insert(name) {
            return Err(err(
                &format!("{kind} @{name}"),
                loc,
                format!("the symbol @{name} is defined more than once"),
            ));
        }
    }
    Ok(())
}

/// Verifies one module (templates and definition references allowed).
pub fn verify_module(m: &Module) -> Result<()> {
    if !is_word(&m.name) {
        return Err(err(
            &format!("module @{}", m.name),
            Loc::default(),
            format!("invalid module name {:?}", m.name),
        ));
    }
    let mut env = Env::new(&m.funcs, &m.decls, &m.records, false);
    env.items()?;
    for c in &m.consts {
        let item = format!("const @{}", c.name);
        if !is_word(&c.name) {
            return Err(err(
                &item,
                c.loc,
                format!("invalid const name {:?}", c.name),
            ));
        }
        check_imm(&c.value).map_err(|msg| err(&item, c.loc, msg))?;
    }
    unique_symbols(
        m.decls
            .iter()
            .map(|d| ("decl", d.symbol.as_str(), d.loc))
            .chain(m.records.iter().map(|r| ("record", r.name.as_str(), r.loc)))
            .chain(m.consts.iter().map(|c| ("const", c.name.as_str(), c.loc)))
            .chain(m.funcs.iter().map(|f| ("function", f.name.as_str(), f.loc)))
            .chain(
                m.device
                    .iter()
                    .map(|d| (d.kind.keyword(), d.name.as_str(), d.loc)),
            ),
    )?;
    for d in &m.device {
        // why minimal: the kernel front end parses and checks the text; here only what the module table needs
        let item = format!("{} @{}", d.kind.keyword(), d.name);
        if !is_word(&d.name) {
            return Err(err(&item, d.loc, format!("invalid name {:?}", d.name)));
        }
        if d.text.len() > crate::bytecode::MAX_STRING_LEN {
            return Err(err(&item, d.loc, "the item's text is too long"));
        }
    }
    env.bodies()
}

/// Verifies a linked program: as [`verify_module`], plus no templates, only capability imports, and consistent
/// export and file tables.
pub fn verify_program(p: &Program) -> Result<()> {
    let item = "program";
    if p.func_files.len() != p.funcs.len() {
        return Err(err(
            item,
            Loc::default(),
            format!(
                "{} functions but {} function file entries",
                p.funcs.len(),
                p.func_files.len()
            ),
        ));
    }
    if let Some((i, file)) = p
        .func_files
        .iter()
        .enumerate()
        .find(|(_, f)| **f as usize >= p.files.len())
    {
        return Err(err(
            item,
            Loc::default(),
            format!("function #{i} names file #{file}, which is out of range"),
        ));
    }
    let mut env = Env::new(&p.funcs, &p.imports, &p.records, true);
    env.items()?;
    unique_symbols(p.funcs.iter().map(|f| ("function", f.name.as_str(), f.loc)))?;
    unique_symbols(p.imports.iter().map(|d| ("decl", d.symbol.as_str(), d.loc)))?;
    let mut seen = HashSet::with_capacity(p.exports.len());
    for (name, f) in &p.exports {
        if !is_word(name) {
            return Err(err(
                item,
                Loc::default(),
                format!("invalid export name {name:?}"),
            ));
        }
        if !seen.insert(name.as_str()) {
            return Err(err(
                item,
                Loc::default(),
                format!("export {name} is listed twice"),
            ));
        }
        if *f as usize >= p.funcs.len() {
            return Err(err(
                item,
                Loc::default(),
                format!("export {name} names function #{f}, which is out of range"),
            ));
        }
    }
    env.bodies()
}
