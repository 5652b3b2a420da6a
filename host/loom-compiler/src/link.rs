//! The linker: roots -> dependency closure -> one monomorphic [`Program`].
//!
//! Resolution rules (see `docs/loom/syntax.md`):
//! - a call to a function of the same module needs nothing;
//! - `func.decl @m.f(...)` without `import` resolves to the exported `func @f` of catalog module `@m`, and
//!   `func.decl @f(...)` to the one exported `@f` among all catalog modules; the declaration's signature and
//!   template parameters must be identical to the definition's. A private definition is not visible; two
//!   candidates are ambiguous;
//! - `func.decl @m.f(...) import("m")` is a capability import and needs `m` among the role's grants;
//! - a template function is instantiated once per distinct list of template values (memoised), with
//!   forwarded parameters and defaults filled in; function-typed arguments are resolved in the module where
//!   they were written.

use crate::catalog::Catalog;
use crate::lower::show_sig;
use loom_ir::{
    self as ir, Callee, Decl, Imm, Loc, Operand, Program, Region, TArg, TParamKind, TValue,
};
use std::collections::HashMap;
use std::fmt;

/// How many distinct template instantiations one link may create.
pub const MAX_INSTANTIATIONS: usize = 4096;

/// The capabilities a program's role is granted. Roles are the host's data: the compiler knows no role by name
/// (the server defines its `prepare` and `control` roles next to the native modules they grant).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Role {
    pub name: String,
    pub grants: Vec<String>,
}

impl Role {
    pub fn new(name: &str, grants: &[&str]) -> Role {
        Role {
            name: name.into(),
            grants: grants.iter().map(|g| g.to_string()).collect(),
        }
    }
}

/// A link problem, located in a module's source where possible.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkError {
    /// `file:line:col: error: message`, then a source excerpt when the source is known, then notes.
    pub rendered: String,
}

impl fmt::Display for LinkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.rendered)
    }
}

impl std::error::Error for LinkError {}

/// A template value resolved to catalog coordinates.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum RVal {
    I64(i64),
    Bool(bool),
    Str(String),
    DType(String),
    Shape(Vec<i64>),
    /// (module, function)
    Func(usize, usize),
    /// (module, decl) of a capability import.
    Import(usize, usize),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    module: usize,
    func: usize,
    targs: Vec<RVal>,
}

struct Linker<'c> {
    catalog: &'c Catalog,
    role: &'c Role,
    errors: Vec<LinkError>,
    program: Program,
    instances: HashMap<Key, u32>,
    queue: Vec<(Key, u32)>,
    imports: HashMap<(String, String, ir::Signature), u32>,
    records: HashMap<(usize, u32), u32>,
    files: HashMap<usize, u32>,
    resolved_decls: HashMap<(usize, usize), Option<(usize, usize)>>,
}

/// Links the closure of `roots` (exported functions of the primary module; all its exports when empty).
pub fn link(
    catalog: &Catalog,
    primary: usize,
    roots: &[&str],
    role: &Role,
) -> Result<Program, Vec<LinkError>> {
    let mut l = Linker {
        catalog,
        role,
        errors: Vec::new(),
        program: Program::default(),
        instances: HashMap::new(),
        queue: Vec::new(),
        imports: HashMap::new(),
        records: HashMap::new(),
        files: HashMap::new(),
        resolved_decls: HashMap::new(),
    };
    let Some(entry) = catalog.entries().get(primary) else {
        return Err(vec![LinkError {
            rendered: format!("error: no module {primary} in the catalog"),
        }]);
    };
    let m = &entry.module;
    let root_funcs: Vec<usize> = if roots.is_empty() {
        m.funcs
            .iter()
            .enumerate()
            .filter(|(_, f)| f.exported)
            .map(|(i, _)| i)
            .collect()
    } else {
        let mut out = Vec::new();
        for r in roots {
            match m.funcs.iter().position(|f| f.name == *r) {
                Some(i) if m.funcs[i].exported => out.push(i),
                Some(i) => l.error(
                    primary,
                    m.funcs[i].loc,
                    format!("root @{r} is not exported by module @{}", m.name),
                    vec![],
                ),
                None => l.errors.push(LinkError {
                    rendered: format!(
                        "{}: error: module @{} has no function @{r} (a requested root)\n",
                        m.file, m.name
                    ),
                }),
            }
        }
        out
    };
    for fi in root_funcs {
        let f = &m.funcs[fi];
        let mut targs = Vec::new();
        for tp in &f.tparams {
            match &tp.default {
                Some(v) => {
                    if let Some(r) = l.rval(primary, v, f.loc) {
                        targs.push(r)
                    }
                }
                None => l.error(
                    primary,
                    f.loc,
                    format!("root @{} has template parameter `{}` without a default, so it cannot be an entry point", f.name, tp.name),
                    vec![],
                ),
            }
        }
        if targs.len() == f.tparams.len() {
            let idx = l.instance(Key {
                module: primary,
                func: fi,
                targs,
            });
            l.program.exports.push((f.name.clone(), idx));
        }
    }
    while let Some((key, idx)) = l.queue.pop() {
        l.instantiate(&key, idx);
    }
    if l.errors.is_empty() {
        if let Err(e) = loom_ir::verify::verify_program(&l.program) {
            l.errors.push(LinkError {
                rendered: format!(
                    "error: the linked program does not verify (a linker bug): {e}\n"
                ),
            });
        }
    }
    if l.errors.is_empty() {
        Ok(l.program)
    } else {
        Err(l.errors)
    }
}

impl Linker<'_> {
    fn module(&self, m: usize) -> &ir::Module {
        &self.catalog.entries()[m].module
    }

    fn error(&mut self, m: usize, loc: Loc, message: String, notes: Vec<String>) {
        let rendered = render(self.catalog, m, loc, &message, &notes);
        self.errors.push(LinkError { rendered });
    }

    fn where_is(&self, m: usize, loc: Loc) -> String {
        format!("{}:{}:{}", self.module(m).file, loc.line, loc.col)
    }

    /// The program index of an instance, queued for instantiation when new.
    fn instance(&mut self, key: Key) -> u32 {
        if let Some(&i) = self.instances.get(&key) {
            return i;
        }
        let idx = self.program.funcs.len() as u32;
        if self.instances.len() >= MAX_INSTANTIATIONS {
            let f = self.module(key.module).funcs[key.func].loc;
            self.error(
                key.module,
                f,
                format!("more than {MAX_INSTANTIATIONS} template instantiations"),
                vec![],
            );
            return 0;
        }
        let file = match self.files.get(&key.module) {
            Some(&f) => f,
            None => {
                let f = self.program.files.len() as u32;
                self.program
                    .files
                    .push(self.module(key.module).file.clone());
                self.files.insert(key.module, f);
                f
            }
        };
        // Placeholder body until instantiated; the signature is filled in right away.
        let src = &self.module(key.module).funcs[key.func];
        let mut name = format!("{}.{}", self.module(key.module).name, src.name);
        if !key.targs.is_empty() {
            let parts: Vec<String> = src
                .tparams
                .iter()
                .zip(&key.targs)
                .map(|(p, v)| format!("{}={}", p.name, self.show_rval(v)))
                .collect();
            name.push_str(&format!("<{}>", parts.join(",")));
        }
        let placeholder = ir::Function {
            name,
            exported: false,
            tparams: vec![],
            body: Region::default(),
            ..src.clone()
        };
        self.program.funcs.push(placeholder);
        self.program.func_files.push(file);
        self.instances.insert(key.clone(), idx);
        self.queue.push((key, idx));
        idx
    }

    fn show_rval(&self, v: &RVal) -> String {
        match v {
            RVal::I64(i) => i.to_string(),
            RVal::Bool(b) => b.to_string(),
            RVal::Str(s) => format!("{s:?}"),
            RVal::DType(d) => d.clone(),
            RVal::Shape(s) => format!("{s:?}"),
            RVal::Func(m, f) => format!(
                "@{}.{}",
                self.module(*m).name,
                self.module(*m).funcs[*f].name
            ),
            RVal::Import(m, d) => format!("@{}", self.module(*m).decls[*d].symbol),
        }
    }

    /// Resolves a template value written in module `m`.
    fn rval(&mut self, m: usize, v: &TValue, loc: Loc) -> Option<RVal> {
        Some(match v {
            TValue::I64(i) => RVal::I64(*i),
            TValue::Bool(b) => RVal::Bool(*b),
            TValue::Str(s) => RVal::Str(s.clone()),
            TValue::DType(d) => RVal::DType(d.clone()),
            TValue::Shape(s) => RVal::Shape(s.clone()),
            TValue::Func(Callee::Func(f)) => RVal::Func(m, *f as usize),
            TValue::Func(Callee::Decl(d)) => {
                let d = *d as usize;
                if self.module(m).decls.get(d)?.import.is_some() {
                    RVal::Import(m, d)
                } else {
                    let (m2, f2) = self.resolve_decl(m, d)?;
                    RVal::Func(m2, f2)
                }
            }
            TValue::Func(Callee::TParam(_)) => {
                self.error(
                    m,
                    loc,
                    "a template value cannot name a template parameter here".into(),
                    vec![],
                );
                return None;
            }
        })
    }

    /// Resolves the template arguments of a call to `callee_tparams` (of function `(cm, _)`): written ones in
    /// the caller's module `m` (forwarding from `outer`), defaults in the callee's module `cm`.
    fn call_targs(
        &mut self,
        m: usize,
        outer: &[RVal],
        written: &[(String, TArg)],
        callee_tparams: &[ir::TParam],
        cm: usize,
        loc: Loc,
    ) -> Option<Vec<RVal>> {
        let mut out = Vec::new();
        for tp in callee_tparams {
            let v = match written.iter().find(|(n, _)| *n == tp.name) {
                Some((_, TArg::Value(v))) => self.rval(m, v, loc)?,
                Some((_, TArg::Forward(i))) => outer.get(*i as usize)?.clone(),
                None => match &tp.default {
                    Some(d) => self.rval(cm, d, loc)?,
                    None => {
                        self.error(
                            m,
                            loc,
                            format!("missing template argument `{}`", tp.name),
                            vec![],
                        );
                        return None;
                    }
                },
            };
            out.push(v);
        }
        Some(out)
    }

    /// Resolves a definition reference `func.decl` (decl `d` of module `m`) to (module, function).
    fn resolve_decl(&mut self, m: usize, d: usize) -> Option<(usize, usize)> {
        if let Some(r) = self.resolved_decls.get(&(m, d)) {
            return *r;
        }
        let r = self.resolve_decl_uncached(m, d);
        self.resolved_decls.insert((m, d), r);
        r
    }

    fn resolve_decl_uncached(&mut self, m: usize, d: usize) -> Option<(usize, usize)> {
        let decl: Decl = self.module(m).decls[d].clone();
        let here = self.module(m).name.clone();
        let (prefix, fname) = decl.split_symbol();
        let (prefix, fname) = (prefix.to_string(), fname.to_string());
        // Candidates: the named module when the prefix names one, else every module.
        let scope: Vec<usize> = match self.catalog.find(&prefix) {
            Some(mi) if !prefix.is_empty() => vec![mi],
            _ if !prefix.is_empty() => {
                let known: Vec<String> = self
                    .catalog
                    .entries()
                    .iter()
                    .map(|e| format!("@{}", e.module.name))
                    .collect();
                self.error(
                    m,
                    decl.loc,
                    format!("@{}: no module @{prefix} in the catalog", decl.symbol),
                    vec![format!("the catalog has {}", known.join(", "))],
                );
                return None;
            }
            _ => (0..self.catalog.entries().len()).collect(),
        };
        let mut exported = Vec::new();
        let mut private = Vec::new();
        for mi in scope {
            for (fi, f) in self.module(mi).funcs.iter().enumerate() {
                if f.name == fname {
                    if f.exported {
                        exported.push((mi, fi))
                    } else {
                        private.push((mi, fi))
                    }
                }
            }
        }
        match exported.len() {
            0 => {
                if let Some(&(pm, pf)) = private.first() {
                    let at = self.where_is(pm, self.module(pm).funcs[pf].loc);
                    let owner = self.module(pm).name.clone();
                    self.error(
                        m,
                        decl.loc,
                        format!("@{fname} is private to module @{owner} and not visible from module @{here}"),
                        vec![format!("the private definition is at {at}; mark it `export` to use it from @{here}")],
                    );
                } else {
                    let place = if prefix.is_empty() {
                        "any catalog module".to_string()
                    } else {
                        format!("module @{prefix}")
                    };
                    self.error(
                        m,
                        decl.loc,
                        format!("no definition of @{fname} in {place}"),
                        vec![],
                    );
                }
                None
            }
            1 => {
                let (mi, fi) = exported[0];
                let def = &self.module(mi).funcs[fi];
                let (def_sig, def_tp) = (def.signature(), def.tparams.clone());
                let same_tparams = def_tp.len() == decl.tparams.len()
                    && def_tp
                        .iter()
                        .zip(&decl.tparams)
                        .all(|(a, b)| a.name == b.name && a.kind == b.kind);
                if def_sig != decl.sig || !same_tparams {
                    let at = self.where_is(mi, def.loc);
                    self.error(
                        m,
                        decl.loc,
                        format!(
                            "declaration @{}{} does not match its definition @{}.{fname}{}",
                            decl.symbol,
                            show_sig(&decl.sig),
                            self.module(mi).name,
                            show_sig(&def_sig)
                        ),
                        vec![format!("the definition is at {at}")],
                    );
                    return None;
                }
                Some((mi, fi))
            }
            _ => {
                let places: Vec<String> = exported
                    .iter()
                    .map(|&(mi, fi)| {
                        format!(
                            "@{}.{fname} at {}",
                            self.module(mi).name,
                            self.where_is(mi, self.module(mi).funcs[fi].loc)
                        )
                    })
                    .collect();
                self.error(
                    m,
                    decl.loc,
                    format!(
                        "@{fname} is ambiguous: {} modules export it",
                        exported.len()
                    ),
                    vec![format!(
                        "candidates: {}; qualify the declaration as @module.{fname}",
                        places.join(", ")
                    )],
                );
                None
            }
        }
    }

    fn import(&mut self, m: usize, d: usize) -> Option<u32> {
        let decl = self.module(m).decls[d].clone();
        let module = decl.import.clone().unwrap_or_default();
        if !self.role.grants.contains(&module) {
            self.error(
                m,
                decl.loc,
                format!(
                    "capability module \"{module}\" is not granted to the {} role (granted: {})",
                    self.role.name,
                    self.role.grants.join(", ")
                ),
                vec![],
            );
            return None;
        }
        let key = (decl.symbol.clone(), module, decl.sig.clone());
        if let Some(&i) = self.imports.get(&key) {
            return Some(i);
        }
        let i = self.program.imports.len() as u32;
        self.program.imports.push(decl);
        self.imports.insert(key, i);
        Some(i)
    }

    fn record(&mut self, m: usize, r: u32) -> u32 {
        if let Some(&i) = self.records.get(&(m, r)) {
            return i;
        }
        let mut rec = self.module(m).records[r as usize].clone();
        rec.name = format!("{}.{}", self.module(m).name, rec.name);
        let i = self.program.records.len() as u32;
        self.program.records.push(rec);
        self.records.insert((m, r), i);
        i
    }

    fn instantiate(&mut self, key: &Key, idx: u32) {
        let src = self.module(key.module).funcs[key.func].clone();
        let mut body = src.body.clone();
        self.rewrite_region(key, &mut body);
        self.program.funcs[idx as usize].body = body;
    }

    fn rewrite_region(&mut self, key: &Key, region: &mut Region) {
        for op in &mut region.ops {
            let loc = op.loc;
            match &mut op.kind {
                ir::OpKind::Simple { operands, .. } => operands
                    .iter_mut()
                    .for_each(|o| self.rewrite_operand(key, o)),
                ir::OpKind::Call {
                    callee,
                    targs,
                    args,
                } => {
                    args.iter_mut().for_each(|o| self.rewrite_operand(key, o));
                    if let Some(c) = self.rewrite_callee(key, callee, targs, loc) {
                        *callee = c;
                    }
                    targs.clear();
                }
                ir::OpKind::If {
                    cond,
                    then_region,
                    else_region,
                } => {
                    self.rewrite_operand(key, cond);
                    self.rewrite_region(key, then_region);
                    self.rewrite_region(key, else_region);
                }
                ir::OpKind::For {
                    lo,
                    hi,
                    step,
                    inits,
                    body,
                    ..
                } => {
                    for o in [lo, hi, step] {
                        self.rewrite_operand(key, o);
                    }
                    inits.iter_mut().for_each(|o| self.rewrite_operand(key, o));
                    self.rewrite_region(key, body);
                }
                ir::OpKind::While {
                    inits,
                    cond_region,
                    body,
                    ..
                } => {
                    inits.iter_mut().for_each(|o| self.rewrite_operand(key, o));
                    self.rewrite_region(key, cond_region);
                    self.rewrite_region(key, body);
                }
                ir::OpKind::Yield(v) | ir::OpKind::Return(v) => {
                    v.iter_mut().for_each(|o| self.rewrite_operand(key, o))
                }
                ir::OpKind::Condition(o) => self.rewrite_operand(key, o),
            }
        }
    }

    fn rewrite_operand(&mut self, key: &Key, o: &mut Operand) {
        match o {
            Operand::TParam(i) => {
                *o = match key.targs.get(*i as usize) {
                    Some(RVal::I64(v)) => Operand::Imm(Imm::I64(*v)),
                    Some(RVal::Bool(v)) => Operand::Imm(Imm::I1(*v)),
                    Some(RVal::Str(v)) => Operand::Imm(Imm::Str(v.clone())),
                    // The verifier of the source module rejected every other use.
                    _ => Operand::Imm(Imm::I64(0)),
                }
            }
            Operand::Record(r) => *o = Operand::Record(self.record(key.module, *r)),
            Operand::Field(r, f) => *o = Operand::Field(self.record(key.module, *r), *f),
            Operand::Value(_) | Operand::Imm(_) => {}
        }
    }

    fn rewrite_callee(
        &mut self,
        key: &Key,
        callee: &Callee,
        targs: &[(String, TArg)],
        loc: Loc,
    ) -> Option<Callee> {
        let m = key.module;
        let target = match callee {
            Callee::Func(f) => RVal::Func(m, *f as usize),
            Callee::Decl(d) => {
                let d = *d as usize;
                if self.module(m).decls[d].import.is_some() {
                    RVal::Import(m, d)
                } else {
                    let (m2, f2) = self.resolve_decl(m, d)?;
                    RVal::Func(m2, f2)
                }
            }
            Callee::TParam(i) => key.targs.get(*i as usize)?.clone(),
        };
        match target {
            RVal::Import(im, d) => self.import(im, d).map(Callee::Decl),
            RVal::Func(cm, cf) => {
                let tparams = self.module(cm).funcs[cf].tparams.clone();
                let values = if matches!(callee, Callee::TParam(_)) {
                    // A function passed as a template value is instantiated with its defaults.
                    self.call_targs(cm, &[], &[], &tparams, cm, loc)?
                } else {
                    self.call_targs(m, &key.targs, targs, &tparams, cm, loc)?
                };
                for (tp, v) in tparams.iter().zip(&values) {
                    if !kind_matches(&tp.kind, v) {
                        self.error(
                            m,
                            loc,
                            format!("template argument `{}` has the wrong kind", tp.name),
                            vec![],
                        );
                        return None;
                    }
                }
                Some(Callee::Func(self.instance(Key {
                    module: cm,
                    func: cf,
                    targs: values,
                })))
            }
            _ => None,
        }
    }
}

fn kind_matches(kind: &TParamKind, v: &RVal) -> bool {
    matches!(
        (kind, v),
        (TParamKind::I64, RVal::I64(_))
            | (TParamKind::Bool, RVal::Bool(_))
            | (TParamKind::Str, RVal::Str(_))
            | (TParamKind::DType, RVal::DType(_))
            | (TParamKind::Shape, RVal::Shape(_))
            | (TParamKind::Func(_), RVal::Func(..) | RVal::Import(..))
    )
}

/// `file:line:col: error: message`, an excerpt with a caret when the module's source is known, then notes.
fn render(catalog: &Catalog, m: usize, loc: Loc, message: &str, notes: &[String]) -> String {
    let entry = &catalog.entries()[m];
    let mut out = format!(
        "{}:{}:{}: error: {message}\n",
        entry.module.file, loc.line, loc.col
    );
    if let Some(src) = &entry.source {
        let line = src.line_text(loc.line);
        let gutter = loc.line.to_string().len();
        let col = (loc.col as usize).saturating_sub(1);
        let word: usize = line
            .chars()
            .skip(col)
            .take_while(|c| c.is_alphanumeric() || matches!(c, '_' | '.' | '@' | '%'))
            .count()
            .max(1);
        let pad: String = line
            .chars()
            .take(col)
            .map(|c| if c == '\t' { '\t' } else { ' ' })
            .collect();
        out.push_str(&format!(
            "{:gutter$} |\n{} | {line}\n{:gutter$} | {pad}{}\n",
            "",
            loc.line,
            "",
            "^".repeat(word)
        ));
    }
    for n in notes {
        out.push_str(&format!("  = note: {n}\n"));
    }
    out
}
