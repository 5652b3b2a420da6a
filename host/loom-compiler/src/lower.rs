//! Lowering one syntax tree to a typed [`loom_ir::Module`].
//!
//! Scoping: every value name is defined once per function (SSA); a use must follow its definition in the same
//! block or an enclosing one. Regions: a function body ends in `return`; `if`/`for`/`while` bodies end in `yield`
//! (implicit when they have no results), a `while` condition block ends in `condition`. `return` appears only at
//! the end of a function body: results leave nested blocks through `yield`.
//!
//! Literal typing: a literal takes the type its position expects (a call's parameter type, a store's value
//! type, the other operand of a binary operation, a declared `yield`/`return` type); with nothing to decide,
//! integers are `i64` and floats `f64`. The printer relies on exactly these rules to print literals bare.

use crate::consteval::{CValue, eval};
use loom_ir::opcode::{ArgTy, assignable, type_op};
use loom_ir::{self as ir, Imm, Loc, Opcode, Operand, Type, ValueId};
use loom_syntax::ast;
use loom_syntax::{Diagnostic, SourceFile, Span};
use std::collections::HashMap;

/// The reference types (`!name`) a program may use: the host's vocabulary, given as data by whoever embeds the
/// language (the server's natives define `!hal.buffer`, ...). [`RefTypes::Any`] accepts every name; the VM
/// still checks each import against the host's native signatures at load.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum RefTypes {
    /// Every reference type name is accepted.
    #[default]
    Any,
    /// Only these names.
    Only(Vec<String>),
}

impl RefTypes {
    /// Only the given names.
    pub fn only(names: &[&str]) -> RefTypes {
        RefTypes::Only(names.iter().map(|n| n.to_string()).collect())
    }

    fn admits(&self, name: &str) -> bool {
        match self {
            RefTypes::Any => true,
            RefTypes::Only(names) => names.iter().any(|n| n == name),
        }
    }

    fn listing(&self) -> String {
        match self {
            RefTypes::Any => String::new(),
            RefTypes::Only(names) => names
                .iter()
                .map(|r| format!("!{r}"))
                .collect::<Vec<_>>()
                .join(", "),
        }
    }
}

/// Element type names accepted as `dtype` template values.
const DTYPES: &[&str] = &[
    "f32", "f16", "bf16", "f64", "i64", "i32", "u32", "i16", "u16", "i8", "u8", "i1", "q8_0",
    "q4_0", "q4_1", "q4_k", "q6_k",
];

/// Compiles one parsed file. The module is returned only when there were no errors. `ref_types` are the
/// reference types the host defines.
pub fn compile_module(
    source: &SourceFile,
    tree: &ast::Module,
    ref_types: &RefTypes,
) -> (Option<ir::Module>, Vec<Diagnostic>) {
    let mut cx = ModCx {
        source,
        diags: Vec::new(),
        ..ModCx::default_for(source, ref_types)
    };
    let module = cx.module(tree);
    let failed = cx
        .diags
        .iter()
        .any(|d| d.severity == loom_syntax::Severity::Error);
    (if failed { None } else { Some(module) }, cx.diags)
}

struct ModCx<'a> {
    source: &'a SourceFile,
    ref_types: &'a RefTypes,
    diags: Vec<Diagnostic>,
    /// Item name -> (kind, index, where it was defined), for duplicate detection and lookup.
    funcs: HashMap<String, usize>,
    decls: HashMap<String, usize>,
    records: HashMap<String, usize>,
    consts: HashMap<String, (Imm, Type)>,
    defined: HashMap<String, Span>,
    out: ir::Module,
}

impl<'a> ModCx<'a> {
    fn default_for(source: &'a SourceFile, ref_types: &'a RefTypes) -> ModCx<'a> {
        ModCx {
            source,
            ref_types,
            diags: Vec::new(),
            funcs: HashMap::new(),
            decls: HashMap::new(),
            records: HashMap::new(),
            consts: HashMap::new(),
            defined: HashMap::new(),
            out: ir::Module::default(),
        }
    }

    fn loc(&self, span: Span) -> Loc {
        let lc = self.source.line_col(span.start);
        Loc {
            line: lc.line,
            col: lc.col,
        }
    }

    fn error(&mut self, span: Span, msg: impl Into<String>) {
        self.diags.push(Diagnostic::error(span, msg));
    }

    fn claim(&mut self, name: &ast::Name, what: &str) -> bool {
        if let Some(prev) = self.defined.get(&name.text) {
            let at = self.source.location(*prev);
            self.diags.push(
                Diagnostic::error(name.span, format!("{what} @{} is defined twice", name.text))
                    .with_note(format!("the first definition is at {at}")),
            );
            return false;
        }
        self.defined.insert(name.text.clone(), name.span);
        true
    }

    fn module(&mut self, tree: &ast::Module) -> ir::Module {
        match &tree.name {
            Some(n) => self.out.name = n.text.clone(),
            None => self.error(tree.span, "missing `module @name { ... }` header"),
        }
        self.out.file = self.source.name.clone();
        // Pass 1: every item's header, so bodies can refer to items defined later in the file.
        for item in &tree.items {
            match item {
                ast::Item::Record(r) => self.record(r),
                ast::Item::Const(c) => self.constant(c),
                ast::Item::Decl(d) => self.decl(d),
                ast::Item::Func(f) => self.func_header(f),
                ast::Item::Device(d) => self.device(d),
            }
        }
        // Pass 2: bodies.
        let funcs: Vec<&ast::Func> = tree
            .items
            .iter()
            .filter_map(|i| {
                if let ast::Item::Func(f) = i {
                    Some(f)
                } else {
                    None
                }
            })
            .collect();
        for f in funcs {
            if let Some(&idx) = self.funcs.get(&f.name.text) {
                if self.out.funcs[idx].loc == self.loc(f.name.span) {
                    self.func_body(idx, f);
                }
            }
        }
        std::mem::take(&mut self.out)
    }

    fn ty(&mut self, t: &ast::Type) -> Type {
        match t {
            ast::Type::I1(_) => Type::I1,
            ast::Type::I32(_) => Type::I32,
            ast::Type::I64(_) => Type::I64,
            ast::Type::F32(_) => Type::F32,
            ast::Type::F64(_) => Type::F64,
            ast::Type::Str(_) => Type::Str,
            ast::Type::Buffer(_) => Type::Buffer,
            ast::Type::List(inner, _) => Type::List(Box::new(self.ty(inner))),
            ast::Type::Ref { name, nullable, .. } => {
                if !self.ref_types.admits(&name.text) {
                    let expected = self.ref_types.listing();
                    self.error(
                        name.span,
                        format!(
                            "unknown reference type !{}: expected one of {expected}",
                            name.text
                        ),
                    );
                }
                Type::Ref {
                    name: name.text.clone(),
                    nullable: *nullable,
                }
            }
            // The parser already reported it; any type keeps later checks quiet enough.
            ast::Type::Error(_) => Type::I64,
        }
    }

    fn types(&mut self, ts: &[ast::Type]) -> Vec<Type> {
        ts.iter().map(|t| self.ty(t)).collect()
    }

    fn record(&mut self, r: &ast::Record) {
        if !self.claim(&r.name, "record") {
            return;
        }
        if r.name.text.contains('.') {
            // `@R.f` names a field, so a dotted record name would be ambiguous.
            self.error(
                r.name.span,
                format!("record names cannot contain `.`: @{}", r.name.text),
            );
        }
        let mut fields = Vec::new();
        for (name, t) in &r.fields {
            let ty = self.ty(t);
            if !ty.is_scalar() {
                self.error(
                    t.span(),
                    format!("record fields must be i1, i32, i64, f32 or f64, found {ty}"),
                );
            }
            if fields.iter().any(|(n, _): &(String, Type)| *n == name.text) {
                self.error(
                    name.span,
                    format!("field `{}` is defined twice in @{}", name.text, r.name.text),
                );
            }
            fields.push((name.text.clone(), ty));
        }
        if fields.is_empty() {
            self.error(r.span, format!("record @{} has no fields", r.name.text));
        }
        self.records
            .insert(r.name.text.clone(), self.out.records.len());
        let loc = self.loc(r.name.span);
        self.out.records.push(ir::Record {
            name: r.name.text.clone(),
            exported: r.exported,
            fields,
            loc,
        });
    }

    fn constant(&mut self, c: &ast::Const) {
        if !self.claim(&c.name, "constant") {
            return;
        }
        let ty = self.ty(&c.ty);
        let value = match eval(&c.value) {
            Ok(v) => v,
            Err(d) => {
                self.diags.push(d);
                return;
            }
        };
        let imm = match (&ty, value) {
            (Type::I64, CValue::Int(v)) => Imm::I64(v),
            (Type::I32, CValue::Int(v)) => match i32::try_from(v) {
                Ok(v) => Imm::I32(v),
                Err(_) => return self.error(c.value.span(), format!("{v} does not fit in i32")),
            },
            (Type::F64, CValue::Float(v)) => Imm::F64(v),
            (Type::F64, CValue::Int(v)) => Imm::F64(v as f64),
            (Type::F32, CValue::Float(v)) => Imm::F32(v as f32),
            (Type::F32, CValue::Int(v)) => Imm::F32(v as f32),
            (Type::I1, CValue::Bool(v)) => Imm::I1(v),
            (Type::Str, CValue::Str(v)) => Imm::Str(v),
            (t, v) => {
                return self.error(
                    c.value.span(),
                    format!("a constant of type {t} cannot hold {}", describe(&v)),
                );
            }
        };
        if matches!(imm, Imm::F32(v) if !v.is_finite())
            || matches!(imm, Imm::F64(v) if !v.is_finite())
        {
            return self.error(c.value.span(), "constants must be finite");
        }
        self.consts.insert(c.name.text.clone(), (imm.clone(), ty));
        let loc = self.loc(c.name.span);
        self.out.consts.push(ir::Const {
            name: c.name.text.clone(),
            exported: c.exported,
            value: imm,
            loc,
        });
    }

    /// A device item: stored as canonical text for the kernel front end (`loom-kernel`), which compiles it.
    fn device(&mut self, d: &ast::DeviceItem) {
        let what = match d.kind {
            ast::DeviceKind::Kernel => "kernel",
            ast::DeviceKind::Kfunc => "kfunc",
            ast::DeviceKind::Stage => "stage",
        };
        if !self.claim(&d.name, what) {
            return;
        }
        let kind = match d.kind {
            ast::DeviceKind::Kernel => ir::DeviceKind::Kernel,
            ast::DeviceKind::Kfunc => ir::DeviceKind::Kfunc,
            ast::DeviceKind::Stage => ir::DeviceKind::Stage,
        };
        let mut tparams: Vec<ir::TParam> = Vec::new();
        for tp in &d.tparams {
            if tparams.iter().any(|p| p.name == tp.name.text) {
                self.error(
                    tp.name.span,
                    format!("template parameter `{}` is declared twice", tp.name.text),
                );
            }
            let kind = match &tp.kind {
                ast::TParamKind::I64 => ir::TParamKind::I64,
                ast::TParamKind::Bool => ir::TParamKind::Bool,
                ast::TParamKind::Str => ir::TParamKind::Str,
                ast::TParamKind::DType => ir::TParamKind::DType,
                ast::TParamKind::Shape => ir::TParamKind::Shape,
                ast::TParamKind::Func { params, results } => ir::TParamKind::Func(ir::Signature {
                    params: self.types(params),
                    results: self.types(results),
                }),
            };
            // why quiet: device defaults may be expressions over other parameters (`BK: i64 = BM / 2`) that
            // only the kernel front end evaluates; the IR keeps plain values for reflection
            let default = tp
                .default
                .as_ref()
                .and_then(|e| eval(e).ok())
                .and_then(|v| match (&kind, v) {
                    (ir::TParamKind::I64, CValue::Int(v)) => Some(ir::TValue::I64(v)),
                    (ir::TParamKind::Bool, CValue::Bool(v)) => Some(ir::TValue::Bool(v)),
                    (ir::TParamKind::Str, CValue::Str(v)) => Some(ir::TValue::Str(v)),
                    (ir::TParamKind::DType, CValue::Word(w)) if DTYPES.contains(&w.as_str()) => {
                        Some(ir::TValue::DType(w))
                    }
                    (ir::TParamKind::Shape, CValue::List(items)) => items
                        .into_iter()
                        .map(|i| match i {
                            CValue::Int(d) if d >= 0 => Some(d),
                            _ => None,
                        })
                        .collect::<Option<Vec<i64>>>()
                        .map(ir::TValue::Shape),
                    _ => None,
                });
            tparams.push(ir::TParam {
                name: tp.name.text.clone(),
                kind,
                default,
            });
        }
        let text = crate::device::render_item(self.source, d);
        let loc = self.loc(d.span);
        self.out.device.push(ir::DeviceItem {
            kind,
            name: d.name.text.clone(),
            exported: d.exported,
            tparams,
            text,
            loc,
        });
    }

    fn tparams(&mut self, tps: &[ast::TParam]) -> Vec<ir::TParam> {
        let mut out: Vec<ir::TParam> = Vec::new();
        for tp in tps {
            if out.iter().any(|p| p.name == tp.name.text) {
                self.error(
                    tp.name.span,
                    format!("template parameter `{}` is declared twice", tp.name.text),
                );
            }
            let kind = match &tp.kind {
                ast::TParamKind::I64 => ir::TParamKind::I64,
                ast::TParamKind::Bool => ir::TParamKind::Bool,
                ast::TParamKind::Str => ir::TParamKind::Str,
                ast::TParamKind::DType => ir::TParamKind::DType,
                ast::TParamKind::Shape => ir::TParamKind::Shape,
                ast::TParamKind::Func { params, results } => ir::TParamKind::Func(ir::Signature {
                    params: self.types(params),
                    results: self.types(results),
                }),
            };
            let default = match &tp.default {
                None => None,
                Some(e) => match eval(e) {
                    Err(d) => {
                        self.diags.push(d);
                        None
                    }
                    Ok(v) => match self.tvalue(&kind, v, &[], e.span()) {
                        Some(ir::TArg::Value(v)) => Some(v),
                        _ => None,
                    },
                },
            };
            out.push(ir::TParam {
                name: tp.name.text.clone(),
                kind,
                default,
            });
        }
        out
    }

    /// Converts a constant to a template value of `kind`; words naming one of `caller` (the enclosing
    /// function's template parameters) forward it.
    fn tvalue(
        &mut self,
        kind: &ir::TParamKind,
        v: CValue,
        caller: &[ir::TParam],
        span: Span,
    ) -> Option<ir::TArg> {
        use ir::TParamKind as K;
        if let CValue::Word(w) = &v {
            if let Some(i) = caller.iter().position(|p| p.name == *w) {
                if caller[i].kind != *kind {
                    self.error(
                        span,
                        format!(
                            "template parameter `{w}` has another kind than the one expected here"
                        ),
                    );
                    return None;
                }
                return Some(ir::TArg::Forward(i as u32));
            }
        }
        let value = match (kind, v) {
            (K::I64, CValue::Int(v)) => ir::TValue::I64(v),
            (K::Bool, CValue::Bool(v)) => ir::TValue::Bool(v),
            (K::Str, CValue::Str(v)) => ir::TValue::Str(v),
            (K::DType, CValue::Word(w)) if DTYPES.contains(&w.as_str()) => ir::TValue::DType(w),
            (K::Shape, CValue::List(items)) => {
                let mut dims = Vec::new();
                for i in items {
                    match i {
                        CValue::Int(d) if d >= 0 => dims.push(d),
                        other => {
                            self.error(
                                span,
                                format!(
                                    "shape dimensions must be non-negative integers, found {}",
                                    describe(&other)
                                ),
                            );
                            return None;
                        }
                    }
                }
                ir::TValue::Shape(dims)
            }
            (K::Func(sig), CValue::Symbol(s)) => {
                let callee = if let Some(&i) = self.funcs.get(&s) {
                    let f = &self.out.funcs[i];
                    if f.signature() != *sig {
                        let msg = format!(
                            "@{s} has signature {} but {} is expected",
                            show_sig(&f.signature()),
                            show_sig(sig)
                        );
                        self.error(span, msg);
                        return None;
                    }
                    ir::Callee::Func(i as u32)
                } else if let Some(&i) = self.decls.get(&s) {
                    if self.out.decls[i].sig != *sig {
                        let msg = format!(
                            "@{s} has signature {} but {} is expected",
                            show_sig(&self.out.decls[i].sig),
                            show_sig(sig)
                        );
                        self.error(span, msg);
                        return None;
                    }
                    ir::Callee::Decl(i as u32)
                } else {
                    self.error(span, format!("unknown function @{s}"));
                    return None;
                };
                ir::TValue::Func(callee)
            }
            (kind, v) => {
                let want = match kind {
                    K::I64 => "an integer".to_string(),
                    K::Bool => "true or false".into(),
                    K::Str => "a string".into(),
                    K::DType => format!("an element type ({})", DTYPES.join(", ")),
                    K::Shape => "a shape such as [2, 3]".into(),
                    K::Func(sig) => {
                        format!("a function reference @f with signature {}", show_sig(sig))
                    }
                };
                self.error(span, format!("expected {want}, found {}", describe(&v)));
                return None;
            }
        };
        Some(ir::TArg::Value(value))
    }

    fn decl(&mut self, d: &ast::FuncDecl) {
        if !self.claim(&d.name, "declaration") {
            return;
        }
        let tparams = self.tparams(&d.tparams);
        let sig = ir::Signature {
            params: self.types(&d.params),
            results: self.types(&d.results),
        };
        if let Some(m) = &d.import {
            let (prefix, _) = d.name.text.rsplit_once('.').unwrap_or(("", &d.name.text));
            if prefix != m.text {
                self.error(
                    d.name.span,
                    format!(
                        "capability import @{} must be named @{}.<function> to import from module \"{}\"",
                        d.name.text, m.text, m.text
                    ),
                );
            }
            if !tparams.is_empty() {
                self.error(
                    d.name.span,
                    "capability imports cannot have template parameters",
                );
            }
        }
        self.decls.insert(d.name.text.clone(), self.out.decls.len());
        let loc = self.loc(d.name.span);
        self.out.decls.push(ir::Decl {
            symbol: d.name.text.clone(),
            tparams,
            sig,
            import: d.import.as_ref().map(|m| m.text.clone()),
            loc,
        });
    }

    fn func_header(&mut self, f: &ast::Func) {
        if !self.claim(&f.name, "function") {
            return;
        }
        if f.name.text.contains('.') {
            self.error(
                f.name.span,
                format!("function names cannot contain `.`: @{}", f.name.text),
            );
        }
        let tparams = self.tparams(&f.tparams);
        let mut values = Vec::new();
        let mut params = Vec::new();
        for p in &f.params {
            if values.iter().any(|v: &ir::ValueDef| v.name == p.name.text) {
                self.error(
                    p.name.span,
                    format!("parameter %{} is declared twice", p.name.text),
                );
            }
            let ty = self.ty(&p.ty);
            params.push(ValueId(values.len() as u32));
            values.push(ir::ValueDef {
                name: p.name.text.clone(),
                ty,
            });
        }
        let results = self.types(&f.results);
        self.funcs.insert(f.name.text.clone(), self.out.funcs.len());
        let loc = self.loc(f.name.span);
        self.out.funcs.push(ir::Function {
            name: f.name.text.clone(),
            exported: f.exported,
            tparams,
            params,
            results,
            values,
            body: ir::Region::default(),
            loc,
        });
    }

    fn func_body(&mut self, idx: usize, f: &ast::Func) {
        let func = &self.out.funcs[idx];
        let mut fx = FnCx {
            values: func.values.clone(),
            temps: Vec::new(),
            scopes: vec![HashMap::new()],
            first_def: HashMap::new(),
            tparams: func.tparams.clone(),
            results: func.results.clone(),
        };
        for (i, p) in f.params.iter().enumerate() {
            fx.scopes[0].insert(p.name.text.clone(), ValueId(i as u32));
            fx.first_def.insert(p.name.text.clone(), p.name.span);
        }
        let results = fx.results.clone();
        let body = self.block(&mut fx, &f.body, RegionKind::Body(results));
        fx.name_temps();
        let func = &mut self.out.funcs[idx];
        func.values = fx.values;
        func.body = body;
    }
}

/// What a block is the body of, and so how it must end.
#[derive(Clone, Debug)]
enum RegionKind {
    /// A function body: ends in `return` of these types (implicit when there are none).
    Body(Vec<Type>),
    /// `if` arm, `for` or `while` body: ends in `yield` of these types (implicit when there are none).
    Yield(Vec<Type>),
    /// `while` condition block: ends in `condition`.
    Cond,
}

struct FnCx {
    values: Vec<ir::ValueDef>,
    temps: Vec<ValueId>,
    scopes: Vec<HashMap<String, ValueId>>,
    first_def: HashMap<String, Span>,
    tparams: Vec<ir::TParam>,
    results: Vec<Type>,
}

impl FnCx {
    fn lookup(&self, name: &str) -> Option<ValueId> {
        self.scopes.iter().rev().find_map(|s| s.get(name).copied())
    }

    fn temp(&mut self, ty: Type) -> ValueId {
        let id = ValueId(self.values.len() as u32);
        self.values.push(ir::ValueDef {
            name: String::new(),
            ty,
        });
        self.temps.push(id);
        id
    }

    /// Names nested-operation temporaries `%0`, `%1`, ... skipping names the source already uses.
    fn name_temps(&mut self) {
        let used: std::collections::HashSet<String> = self
            .values
            .iter()
            .filter(|v| !v.name.is_empty())
            .map(|v| v.name.clone())
            .collect();
        let mut next = 0u64;
        for t in std::mem::take(&mut self.temps) {
            while used.contains(&next.to_string()) {
                next += 1;
            }
            self.values[t.0 as usize].name = next.to_string();
            next += 1;
        }
    }
}

/// An operand before its type is final: literals wait for their context.
#[derive(Clone, Debug)]
enum Arg {
    Done(Operand, Type),
    Int(i64, Span),
    Float(f64),
    Null,
    Record(u32),
    Field(u32, u32, Type),
    /// Already reported.
    Bad,
}

impl Arg {
    fn argty(&self) -> ArgTy {
        match self {
            Arg::Done(_, t) => ArgTy::Known(t.clone()),
            Arg::Int(..) => ArgTy::Lit(Type::I64),
            Arg::Float(_) => ArgTy::Lit(Type::F64),
            Arg::Null => ArgTy::Lit(Type::Ref {
                name: String::new(),
                nullable: true,
            }),
            Arg::Record(_) => ArgTy::Record,
            Arg::Field(_, _, t) => ArgTy::Field(t.clone()),
            Arg::Bad => ArgTy::Lit(Type::I64),
        }
    }
}

impl ModCx<'_> {
    fn block(&mut self, fx: &mut FnCx, b: &ast::Block, kind: RegionKind) -> ir::Region {
        fx.scopes.push(HashMap::new());
        let mut ops: Vec<ir::Op> = Vec::new();
        let mut terminated: Option<Span> = None;
        for stmt in &b.stmts {
            let span = stmt_span(stmt);
            if let Some(t) = terminated {
                let at = self.source.location(t);
                self.diags.push(
                    Diagnostic::error(span, "unreachable statement: the block has already ended")
                        .with_note(format!("the block ends at {at}")),
                );
                break;
            }
            match stmt {
                ast::Stmt::Let {
                    results,
                    expr,
                    span,
                } => self.let_stmt(fx, &mut ops, results, expr, *span),
                ast::Stmt::Return { values, span } => {
                    terminated = Some(*span);
                    match &kind {
                        RegionKind::Body(want) => {
                            let operands = self.values_for(fx, &mut ops, values, want, *span, "return");
                            ops.push(ir::Op { kind: ir::OpKind::Return(operands), results: vec![], loc: self.loc(*span) });
                        }
                        _ => self.error(
                            *span,
                            "`return` is only allowed at the end of a function body; leave nested blocks with `yield`",
                        ),
                    }
                }
                ast::Stmt::Yield { values, span } => {
                    terminated = Some(*span);
                    match &kind {
                        RegionKind::Yield(want) => {
                            let operands =
                                self.values_for(fx, &mut ops, values, want, *span, "yield");
                            ops.push(ir::Op {
                                kind: ir::OpKind::Yield(operands),
                                results: vec![],
                                loc: self.loc(*span),
                            });
                        }
                        RegionKind::Body(_) => self.error(
                            *span,
                            "`yield` outside an if, for or while block; use `return`",
                        ),
                        RegionKind::Cond => self.error(
                            *span,
                            "a while condition block ends with `condition %c`, not `yield`",
                        ),
                    }
                }
                ast::Stmt::Condition { value, span } => {
                    terminated = Some(*span);
                    if let RegionKind::Cond = kind {
                        let arg = self.operand(fx, &mut ops, value);
                        if let Some(o) = self.finalize(arg, &Type::I1, value.span()) {
                            ops.push(ir::Op {
                                kind: ir::OpKind::Condition(o),
                                results: vec![],
                                loc: self.loc(*span),
                            });
                        }
                    } else {
                        self.error(*span, "`condition` only ends the first block of a `while`");
                    }
                }
                ast::Stmt::Error(_) => {}
            }
        }
        if terminated.is_none() {
            let end = Span {
                start: b.span.end.saturating_sub(1),
                end: b.span.end,
            };
            let loc = self.loc(end);
            match &kind {
                RegionKind::Body(want) if want.is_empty() => ops.push(ir::Op {
                    kind: ir::OpKind::Return(vec![]),
                    results: vec![],
                    loc,
                }),
                RegionKind::Yield(want) if want.is_empty() => ops.push(ir::Op {
                    kind: ir::OpKind::Yield(vec![]),
                    results: vec![],
                    loc,
                }),
                RegionKind::Body(want) => self.error(
                    end,
                    format!(
                        "missing `return` of {} at the end of the function",
                        show_types(want)
                    ),
                ),
                RegionKind::Yield(want) => self.error(
                    end,
                    format!(
                        "missing `yield` of {} at the end of this block",
                        show_types(want)
                    ),
                ),
                RegionKind::Cond => {
                    self.error(end, "a while condition block must end with `condition %c`")
                }
            }
        }
        fx.scopes.pop();
        ir::Region { ops }
    }

    /// Operands of `return`/`yield`, typed by the expected types.
    fn values_for(
        &mut self,
        fx: &mut FnCx,
        ops: &mut Vec<ir::Op>,
        values: &[ast::Operand],
        want: &[Type],
        span: Span,
        what: &str,
    ) -> Vec<Operand> {
        if values.len() != want.len() {
            self.error(
                span,
                format!(
                    "`{what}` gives {} value(s) but {} expected",
                    values.len(),
                    show_types(want)
                ),
            );
            return vec![];
        }
        let mut out = Vec::new();
        for (v, t) in values.iter().zip(want) {
            let arg = self.operand(fx, ops, v);
            if let Some(o) = self.finalize(arg, t, v.span()) {
                out.push(o);
            }
        }
        out
    }

    fn define(&mut self, fx: &mut FnCx, name: &ast::Name, ty: Type) -> ValueId {
        if let Some(prev) = fx.first_def.get(&name.text) {
            let at = self.source.location(*prev);
            self.diags.push(
                Diagnostic::error(
                    name.span,
                    format!(
                        "%{} is already defined: each value is defined once",
                        name.text
                    ),
                )
                .with_note(format!("the first definition is at {at}")),
            );
        } else {
            fx.first_def.insert(name.text.clone(), name.span);
        }
        let id = ValueId(fx.values.len() as u32);
        fx.values.push(ir::ValueDef {
            name: name.text.clone(),
            ty,
        });
        if let Some(scope) = fx.scopes.last_mut() {
            scope.insert(name.text.clone(), id);
        }
        id
    }

    fn let_stmt(
        &mut self,
        fx: &mut FnCx,
        ops: &mut Vec<ir::Op>,
        names: &[ast::Name],
        expr: &ast::Expr,
        span: Span,
    ) {
        let loc = self.loc(span);
        let Some((kind, types)) = self.expr(fx, ops, expr) else {
            return;
        };
        if !names.is_empty() && names.len() != types.len() {
            self.error(
                span,
                format!(
                    "this operation gives {} but {} name(s) are bound",
                    describe_results(&types),
                    names.len()
                ),
            );
            return;
        }
        let results = if names.is_empty() {
            types.into_iter().map(|t| fx.temp(t)).collect()
        } else {
            names
                .iter()
                .zip(types)
                .map(|(n, t)| self.define(fx, n, t))
                .collect()
        };
        ops.push(ir::Op { kind, results, loc });
    }

    /// Lowers an expression; the caller binds its results.
    fn expr(
        &mut self,
        fx: &mut FnCx,
        ops: &mut Vec<ir::Op>,
        e: &ast::Expr,
    ) -> Option<(ir::OpKind, Vec<Type>)> {
        match e {
            ast::Expr::Op {
                name,
                operands,
                annotation,
                span,
            } => {
                let annotation = annotation.as_ref().map(|t| self.ty(t));
                self.simple(fx, ops, name, operands, annotation, *span)
            }
            ast::Expr::Call {
                callee,
                targs,
                args,
                span,
            } => self.call(fx, ops, callee, targs, args, *span),
            ast::Expr::If {
                cond,
                results,
                then_block,
                else_block,
                span,
            } => {
                let c = self.operand(fx, ops, cond);
                let cond = self.finalize(c, &Type::I1, cond.span());
                let types = self.types(results);
                if !types.is_empty() && else_block.is_none() {
                    self.error(*span, "an `if` with results needs an `else` block");
                }
                let then_region = self.block(fx, then_block, RegionKind::Yield(types.clone()));
                let else_region = match else_block {
                    Some(b) => self.block(fx, b, RegionKind::Yield(types.clone())),
                    None => ir::Region {
                        ops: vec![ir::Op {
                            kind: ir::OpKind::Yield(vec![]),
                            results: vec![],
                            loc: self.loc(*span),
                        }],
                    },
                };
                Some((
                    ir::OpKind::If {
                        cond: cond?,
                        then_region,
                        else_region,
                    },
                    types,
                ))
            }
            ast::Expr::For {
                var,
                lo,
                hi,
                step,
                iters,
                results,
                body,
                span,
            } => {
                let (a, b) = (self.operand(fx, ops, lo), self.operand(fx, ops, hi));
                let ty = match type_op(Opcode::CmpLt, &[a.argty(), b.argty()], None) {
                    // Loops count in i64 (sizes and offsets are i64 everywhere); i32 bounds are converted
                    // explicitly, so the VM needs only one induction-variable width.
                    Ok(t) if t.operands[0] == Type::I64 => Type::I64,
                    Ok(t) => {
                        self.error(
                            lo.span().to(hi.span()),
                            format!(
                                "loop bounds must be i64 (convert with conv.i64), found {}",
                                t.operands[0]
                            ),
                        );
                        // Keep the written type so the bounds do not report a second mismatch.
                        t.operands[0].clone()
                    }
                    Err(m) => {
                        self.error(lo.span().to(hi.span()), format!("loop bounds: {m}"));
                        Type::I64
                    }
                };
                let lo_o = self.finalize(a, &ty, lo.span());
                let hi_o = self.finalize(b, &ty, hi.span());
                let step_o = match step {
                    None => Some(Operand::Imm(if ty == Type::I32 {
                        Imm::I32(1)
                    } else {
                        Imm::I64(1)
                    })),
                    Some(s) => {
                        let arg = self.operand(fx, ops, s);
                        if let Arg::Int(v, sp) = arg {
                            if v <= 0 {
                                self.error(
                                    sp,
                                    format!("a for loop's step must be positive, found {v}"),
                                );
                            }
                        }
                        self.finalize(arg, &ty, s.span())
                    }
                };
                let (inits, iter_types) = self.iter_inits(fx, ops, iters);
                self.check_results(results, &iter_types, *span);
                fx.scopes.push(HashMap::new());
                let iv = self.define(fx, var, ty);
                let iter_vals: Vec<ValueId> = iters
                    .iter()
                    .zip(&iter_types)
                    .map(|(it, t)| self.define(fx, &it.name, t.clone()))
                    .collect();
                let body = self.block(fx, body, RegionKind::Yield(iter_types.clone()));
                fx.scopes.pop();
                let kind = ir::OpKind::For {
                    lo: lo_o?,
                    hi: hi_o?,
                    step: step_o?,
                    iv,
                    iters: iter_vals,
                    inits,
                    body,
                };
                Some((kind, iter_types))
            }
            ast::Expr::While {
                iters,
                results,
                cond_block,
                body,
                span,
            } => {
                let (inits, iter_types) = self.iter_inits(fx, ops, iters);
                self.check_results(results, &iter_types, *span);
                fx.scopes.push(HashMap::new());
                let iter_vals: Vec<ValueId> = iters
                    .iter()
                    .zip(&iter_types)
                    .map(|(it, t)| self.define(fx, &it.name, t.clone()))
                    .collect();
                let cond_region = self.block(fx, cond_block, RegionKind::Cond);
                let body = self.block(fx, body, RegionKind::Yield(iter_types.clone()));
                fx.scopes.pop();
                Some((
                    ir::OpKind::While {
                        iters: iter_vals,
                        inits,
                        cond_region,
                        body,
                    },
                    iter_types,
                ))
            }
        }
    }

    fn iter_inits(
        &mut self,
        fx: &mut FnCx,
        ops: &mut Vec<ir::Op>,
        iters: &[ast::IterArg],
    ) -> (Vec<Operand>, Vec<Type>) {
        let mut inits = Vec::new();
        let mut types = Vec::new();
        for it in iters {
            let t = self.ty(&it.ty);
            let arg = self.operand(fx, ops, &it.init);
            if let Some(o) = self.finalize(arg, &t, it.init.span()) {
                inits.push(o);
            }
            types.push(t);
        }
        (inits, types)
    }

    fn check_results(&mut self, written: &[ast::Type], iter_types: &[Type], span: Span) {
        if written.is_empty() {
            return;
        }
        let written = self.types(written);
        if written != iter_types {
            self.error(
                span,
                format!(
                    "the loop's results are its iter values, {}, but {} is written",
                    show_types(iter_types),
                    show_types(&written)
                ),
            );
        }
    }

    fn simple(
        &mut self,
        fx: &mut FnCx,
        ops: &mut Vec<ir::Op>,
        name: &ast::Name,
        operands: &[ast::Operand],
        annotation: Option<Type>,
        span: Span,
    ) -> Option<(ir::OpKind, Vec<Type>)> {
        let Some(opcode) = Opcode::from_name(&name.text) else {
            let hint = if name.text == "call" {
                " (write `call @f(args)`)"
            } else {
                ""
            };
            self.error(
                name.span,
                format!("unknown operation `{}`{hint}", name.text),
            );
            return None;
        };
        let args: Vec<Arg> = operands.iter().map(|o| self.operand(fx, ops, o)).collect();
        if args.iter().any(|a| matches!(a, Arg::Bad)) {
            return None;
        }
        let argtys: Vec<ArgTy> = args.iter().map(Arg::argty).collect();
        let typing = match type_op(opcode, &argtys, annotation.as_ref()) {
            Ok(t) => t,
            Err(m) => {
                self.error(span, m);
                return None;
            }
        };
        let mut out = Vec::new();
        for ((arg, want), o) in args.into_iter().zip(&typing.operands).zip(operands) {
            out.push(self.finalize(arg, want, o.span())?);
        }
        Some((
            ir::OpKind::Simple {
                opcode,
                operands: out,
                annotation,
            },
            typing.results,
        ))
    }

    fn call(
        &mut self,
        fx: &mut FnCx,
        ops: &mut Vec<ir::Op>,
        callee: &ast::Callee,
        targs: &[ast::TArg],
        args: &[ast::Operand],
        span: Span,
    ) -> Option<(ir::OpKind, Vec<Type>)> {
        let (c, sig, tparams) = match callee {
            ast::Callee::Symbol(n) => {
                if let Some(&i) = self.funcs.get(&n.text) {
                    let f = &self.out.funcs[i];
                    (ir::Callee::Func(i as u32), f.signature(), f.tparams.clone())
                } else if let Some(&i) = self.decls.get(&n.text) {
                    let d = &self.out.decls[i];
                    (ir::Callee::Decl(i as u32), d.sig.clone(), d.tparams.clone())
                } else {
                    self.error(
                        n.span,
                        format!("unknown function @{}: define it in this module or declare it with `func.decl`", n.text),
                    );
                    return None;
                }
            }
            ast::Callee::TParam(n) => match fx.tparams.iter().position(|p| p.name == n.text) {
                Some(i) => match &fx.tparams[i].kind {
                    ir::TParamKind::Func(sig) => {
                        (ir::Callee::TParam(i as u32), sig.clone(), vec![])
                    }
                    _ => {
                        self.error(
                            n.span,
                            format!("template parameter `{}` is not a function", n.text),
                        );
                        return None;
                    }
                },
                None => {
                    self.error(n.span, format!("unknown template parameter `{}`", n.text));
                    return None;
                }
            },
        };
        // Template arguments, matched by name.
        let mut ir_targs: Vec<(String, ir::TArg)> = Vec::new();
        for ta in targs {
            let Some(tp) = tparams.iter().find(|p| p.name == ta.name.text) else {
                self.error(
                    ta.name.span,
                    format!("the callee has no template parameter `{}`", ta.name.text),
                );
                continue;
            };
            if ir_targs.iter().any(|(n, _)| *n == ta.name.text) {
                self.error(
                    ta.name.span,
                    format!("template argument `{}` is given twice", ta.name.text),
                );
                continue;
            }
            let v = match eval(&ta.value) {
                Ok(v) => v,
                Err(d) => {
                    self.diags.push(d);
                    continue;
                }
            };
            let kind = tp.kind.clone();
            if let Some(a) = self.tvalue(&kind, v, &fx.tparams.clone(), ta.value.span()) {
                ir_targs.push((ta.name.text.clone(), a));
            }
        }
        for tp in &tparams {
            if tp.default.is_none() && !targs.iter().any(|t| t.name.text == tp.name) {
                self.error(
                    span,
                    format!(
                        "missing template argument `{}` (it has no default)",
                        tp.name
                    ),
                );
            }
        }
        if args.len() != sig.params.len() {
            self.error(
                span,
                format!(
                    "the callee takes {} argument(s), {}, but {} given",
                    sig.params.len(),
                    show_types(&sig.params),
                    args.len()
                ),
            );
            return None;
        }
        let mut out = Vec::new();
        for (a, want) in args.iter().zip(&sig.params) {
            let arg = self.operand(fx, ops, a);
            out.push(self.finalize(arg, want, a.span())?);
        }
        Some((
            ir::OpKind::Call {
                callee: c,
                targs: ir_targs,
                args: out,
            },
            sig.results,
        ))
    }

    /// Lowers an operand; nested operations are emitted into `ops` first.
    fn operand(&mut self, fx: &mut FnCx, ops: &mut Vec<ir::Op>, o: &ast::Operand) -> Arg {
        match o {
            ast::Operand::Value(n) => match fx.lookup(&n.text) {
                Some(id) => Arg::Done(Operand::Value(id), fx.values[id.0 as usize].ty.clone()),
                None => {
                    let msg = if fx.first_def.contains_key(&n.text) {
                        format!(
                            "%{} is not visible here: it is defined inside another block",
                            n.text
                        )
                    } else {
                        format!(
                            "unknown value %{} (values must be defined before they are used)",
                            n.text
                        )
                    };
                    self.error(n.span, msg);
                    Arg::Bad
                }
            },
            ast::Operand::Int(v, s) => Arg::Int(*v, *s),
            ast::Operand::Float(v, _) => Arg::Float(*v),
            ast::Operand::Str(v, _) => Arg::Done(Operand::Imm(Imm::Str(v.clone())), Type::Str),
            ast::Operand::Bool(v, _) => Arg::Done(Operand::Imm(Imm::I1(*v)), Type::I1),
            ast::Operand::Null(_) => Arg::Null,
            ast::Operand::Word(n) => match fx.tparams.iter().position(|p| p.name == n.text) {
                Some(i) => {
                    let ty = match fx.tparams[i].kind {
                        ir::TParamKind::I64 => Type::I64,
                        ir::TParamKind::Bool => Type::I1,
                        ir::TParamKind::Str => Type::Str,
                        _ => {
                            self.error(
                                n.span,
                                format!("template parameter `{}` is not an i64, bool or str, so it is not a value", n.text),
                            );
                            return Arg::Bad;
                        }
                    };
                    Arg::Done(Operand::TParam(i as u32), ty)
                }
                None => {
                    self.error(
                        n.span,
                        format!(
                            "unknown name `{}`: values are written %name, constants @NAME",
                            n.text
                        ),
                    );
                    Arg::Bad
                }
            },
            ast::Operand::Symbol(n) => {
                if let Some((imm, ty)) = self.consts.get(&n.text) {
                    return Arg::Done(Operand::Imm(imm.clone()), ty.clone());
                }
                if let Some(&r) = self.records.get(&n.text) {
                    return Arg::Record(r as u32);
                }
                if let Some((rec, field)) = n.text.rsplit_once('.') {
                    if let Some(&r) = self.records.get(rec) {
                        let fields = &self.out.records[r].fields;
                        return match fields.iter().position(|(f, _)| f == field) {
                            Some(fi) => Arg::Field(r as u32, fi as u32, fields[fi].1.clone()),
                            None => {
                                self.error(n.span, format!("record @{rec} has no field `{field}`"));
                                Arg::Bad
                            }
                        };
                    }
                }
                if self.funcs.contains_key(&n.text) || self.decls.contains_key(&n.text) {
                    self.error(n.span, format!("@{} is a function, not a value: call it, or pass it as a template argument", n.text));
                } else {
                    self.error(n.span, format!("unknown constant or record @{}", n.text));
                }
                Arg::Bad
            }
            ast::Operand::Nested {
                name,
                operands,
                span,
            } => {
                let loc = self.loc(*span);
                let Some((kind, types)) = self.simple(fx, ops, name, operands, None, *span) else {
                    return Arg::Bad;
                };
                if types.len() != 1 {
                    self.error(
                        *span,
                        format!(
                            "a nested operation must give exactly one value; `{}` gives {}",
                            name.text,
                            types.len()
                        ),
                    );
                    return Arg::Bad;
                }
                let ty = types[0].clone();
                let id = fx.temp(ty.clone());
                ops.push(ir::Op {
                    kind,
                    results: vec![id],
                    loc,
                });
                Arg::Done(Operand::Value(id), ty)
            }
            ast::Operand::Error(_) => Arg::Bad,
        }
    }

    /// Gives a pending operand its final type, or reports why it cannot have it.
    fn finalize(&mut self, arg: Arg, want: &Type, span: Span) -> Option<Operand> {
        let imm = match arg {
            Arg::Bad => return None,
            Arg::Done(o, have) => {
                if assignable(&have, want) {
                    return Some(o);
                }
                self.error(span, format!("expected {want}, found {have}"));
                return None;
            }
            Arg::Record(r) => return Some(Operand::Record(r)),
            Arg::Field(r, f, _) => return Some(Operand::Field(r, f)),
            Arg::Int(v, _) => match want {
                Type::I64 => Imm::I64(v),
                Type::I32 => match i32::try_from(v) {
                    Ok(v) => Imm::I32(v),
                    Err(_) => {
                        self.error(span, format!("{v} does not fit in i32"));
                        return None;
                    }
                },
                Type::F64 => Imm::F64(v as f64),
                Type::F32 => Imm::F32(v as f32),
                Type::I1 if v == 0 || v == 1 => {
                    self.error(span, format!("expected i1: write `{}`", v == 1));
                    return None;
                }
                other => {
                    self.error(span, format!("expected {other}, found an integer literal"));
                    return None;
                }
            },
            Arg::Float(v) => match want {
                Type::F64 => Imm::F64(v),
                Type::F32 => Imm::F32(v as f32),
                other => {
                    self.error(span, format!("expected {other}, found a float literal"));
                    return None;
                }
            },
            Arg::Null => {
                if want.is_nullable() {
                    Imm::Null(want.clone())
                } else {
                    self.error(span, format!("`null` is only allowed for nullable references (`?!T`), expected {want}"));
                    return None;
                }
            }
        };
        match imm {
            Imm::F32(v) if !v.is_finite() => {
                self.error(span, "this literal is out of range for f32");
                None
            }
            Imm::F64(v) if !v.is_finite() => {
                self.error(span, "this literal is out of range for f64");
                None
            }
            imm => Some(Operand::Imm(imm)),
        }
    }
}

fn stmt_span(s: &ast::Stmt) -> Span {
    match s {
        ast::Stmt::Let { span, .. }
        | ast::Stmt::Return { span, .. }
        | ast::Stmt::Yield { span, .. }
        | ast::Stmt::Condition { span, .. }
        | ast::Stmt::Error(span) => *span,
    }
}

fn describe(v: &CValue) -> String {
    match v {
        CValue::Int(i) => format!("the integer {i}"),
        CValue::Float(f) => format!("the float {f:?}"),
        CValue::Bool(b) => format!("`{b}`"),
        CValue::Str(s) => format!("the string {s:?}"),
        CValue::List(_) => "a list".into(),
        CValue::Word(w) => format!("`{w}`"),
        CValue::Symbol(s) => format!("@{s}"),
    }
}

pub(crate) fn show_types(ts: &[Type]) -> String {
    format!(
        "({})",
        ts.iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

fn describe_results(ts: &[Type]) -> String {
    match ts.len() {
        0 => "no values".into(),
        1 => format!("1 value ({})", ts[0]),
        n => format!("{n} values {}", show_types(ts)),
    }
}

pub(crate) fn show_sig(s: &ir::Signature) -> String {
    let mut out = show_types(&s.params);
    if !s.results.is_empty() {
        out.push_str(" -> ");
        out.push_str(&show_types(&s.results));
    }
    out
}
