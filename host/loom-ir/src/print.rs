//! The canonical text printer (`loomc dis`).
//!
//! [`print_module`] writes a module as canonical Loom text: compiling that text again gives the same module, and
//! canonical text survives `.loom -> .loombc -> print` unchanged. The format, fixed so that it is stable:
//! - 2-space indentation, `\n` line ends, the file ends with `}\n`;
//! - items in IR order, grouped decls, records, consts, functions, device items (kernels, kfuncs, stages: their
//!   stored canonical text, indented); one-line items of a group follow each other
//!   directly; one blank line between groups and between functions;
//! - values by their names; only the flat op form; `-> T` for one result, `-> (T, U)` for several, nothing for none;
//! - a result-less `if`/`for`/`while` omits the empty `yield` that ends its regions, and a result-less `if` omits
//!   an `else` that holds only that `yield`; `step 1` and an empty `iter()` are omitted;
//! - integers in decimal, floats in Rust's shortest round-trip form (`{:?}` of `f32`/`f64`), strings with the
//!   escapes `\\ \" \n \t \r \0` and `\u{..}` for other control characters.
//!
//! The printer never panics, even on unverified IR: an out-of-range index prints as `<bad ...>`, which no parser
//! accepts. Only verified modules print as valid text.

use crate::{
    Callee, Decl, Function, Imm, Module, Op, OpKind, Operand, Program, Record, Region, Signature,
    TArg, TParam, TParamKind, TValue, Type, ValueId,
};
use std::fmt::{self, Write};

/// `(T, U) -> R` (the `func(...)` kind and decl signatures without the keyword).
pub(crate) struct SigText<'a>(pub(crate) &'a Signature);

impl fmt::Display for SigText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("(")?;
        comma_list(f, &self.0.params)?;
        write!(f, "){}", ResultsText(&self.0.results))
    }
}

/// ` -> T`, ` -> (T, U)`, or nothing.
struct ResultsText<'a>(&'a [Type]);

impl fmt::Display for ResultsText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            [] => Ok(()),
            [t] => write!(f, " -> {t}"),
            ts => {
                f.write_str(" -> (")?;
                comma_list(f, ts)?;
                f.write_str(")")
            }
        }
    }
}

fn comma_list<T: fmt::Display>(f: &mut impl Write, items: &[T]) -> fmt::Result {
    for (i, t) in items.iter().enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        write!(f, "{t}")?;
    }
    Ok(())
}

/// A string literal with the canonical escapes.
pub(crate) fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\0' => out.push_str("\\0"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// An immediate as a literal. Non-finite floats print as Rust does (`NaN`, `inf`); the verifier rejects them.
pub(crate) fn literal(imm: &Imm) -> String {
    match imm {
        Imm::I1(b) => b.to_string(),
        Imm::I32(v) => v.to_string(),
        Imm::I64(v) => v.to_string(),
        Imm::F32(v) => format!("{v:?}"),
        Imm::F64(v) => format!("{v:?}"),
        Imm::Str(s) => quote(s),
        Imm::Null(_) => "null".into(),
    }
}

/// The items a function body refers to: a module's or a program's.
struct Printer<'a> {
    funcs: &'a [Function],
    decls: &'a [Decl],
    records: &'a [Record],
    out: String,
}

fn indent(out: &mut String, level: usize) {
    for _ in 0..level {
        out.push_str("  ");
    }
}

impl<'a> Printer<'a> {
    fn callee(&self, c: &Callee, tps: &[TParam]) -> String {
        match c {
            Callee::Func(i) => match self.funcs.get(*i as usize) {
                Some(f) => format!("@{}", f.name),
                None => format!("<bad function {i}>"),
            },
            Callee::Decl(i) => match self.decls.get(*i as usize) {
                Some(d) => format!("@{}", d.symbol),
                None => format!("<bad decl {i}>"),
            },
            Callee::TParam(i) => tparam_name(tps, *i),
        }
    }

    fn tvalue(&self, v: &TValue, tps: &[TParam]) -> String {
        match v {
            TValue::I64(i) => i.to_string(),
            TValue::Bool(b) => b.to_string(),
            TValue::Str(s) => quote(s),
            TValue::DType(d) => d.clone(),
            TValue::Shape(dims) => {
                let mut s = String::from("[");
                let _ = comma_list(&mut s, dims);
                s.push(']');
                s
            }
            TValue::Func(c) => self.callee(c, tps),
        }
    }

    fn tparams(&mut self, tps: &[TParam]) {
        if tps.is_empty() {
            return;
        }
        self.out.push('<');
        for (i, tp) in tps.iter().enumerate() {
            if i > 0 {
                self.out.push_str(", ");
            }
            let kind = match &tp.kind {
                TParamKind::I64 => "i64".to_string(),
                TParamKind::Bool => "bool".into(),
                TParamKind::Str => "str".into(),
                TParamKind::DType => "dtype".into(),
                TParamKind::Shape => "shape".into(),
                TParamKind::Func(sig) => format!("func{}", SigText(sig)),
            };
            let _ = write!(self.out, "{}: {kind}", tp.name);
            if let Some(d) = &tp.default {
                let d = self.tvalue(d, &[]);
                let _ = write!(self.out, " = {d}");
            }
        }
        self.out.push('>');
    }

    fn decl(&mut self, d: &Decl) {
        let _ = write!(self.out, "  func.decl @{}", d.symbol);
        self.tparams(&d.tparams);
        let _ = write!(self.out, "{}", SigText(&d.sig));
        if let Some(m) = &d.import {
            let _ = write!(self.out, " import({})", quote(m));
        }
        self.out.push('\n');
    }

    fn record(&mut self, r: &Record) {
        let export = if r.exported { "export " } else { "" };
        let _ = write!(self.out, "  {export}type @{} = record {{ ", r.name);
        for (i, (name, t)) in r.fields.iter().enumerate() {
            if i > 0 {
                self.out.push_str(", ");
            }
            let _ = write!(self.out, "{name}: {t}");
        }
        self.out.push_str(" }\n");
    }

    fn func(&mut self, f: &Function) {
        let export = if f.exported { "export " } else { "" };
        let _ = write!(self.out, "  {export}func @{}", f.name);
        self.tparams(&f.tparams);
        self.out.push('(');
        for (i, p) in f.params.iter().enumerate() {
            if i > 0 {
                self.out.push_str(", ");
            }
            let v = value(f, *p);
            let _ = write!(self.out, "{v}: {}", value_type(f, *p));
        }
        let _ = writeln!(self.out, "){} {{", ResultsText(&f.results));
        self.region(f, &f.body, 2, false);
        self.out.push_str("  }\n");
    }

    /// Prints a region's ops at `level`; `omit_empty_yield` drops a final empty `yield` (result-less ops).
    fn region(&mut self, f: &Function, r: &Region, level: usize, omit_empty_yield: bool) {
        let n = match r.ops.last() {
            Some(Op {
                kind: OpKind::Yield(os),
                ..
            }) if omit_empty_yield && os.is_empty() => r.ops.len() - 1,
            _ => r.ops.len(),
        };
        for op in &r.ops[..n] {
            self.op(f, op, level);
        }
    }

    fn operand(&self, f: &Function, o: &Operand) -> String {
        match o {
            Operand::Value(v) => value(f, *v),
            Operand::Imm(imm) => literal(imm),
            Operand::TParam(i) => tparam_name(&f.tparams, *i),
            Operand::Record(r) => match self.records.get(*r as usize) {
                Some(rec) => format!("@{}", rec.name),
                None => format!("<bad record {r}>"),
            },
            Operand::Field(r, fi) => match self
                .records
                .get(*r as usize)
                .and_then(|rec| Some((rec, rec.fields.get(*fi as usize)?)))
            {
                Some((rec, (name, _))) => format!("@{}.{name}", rec.name),
                None => format!("<bad field {r}.{fi}>"),
            },
        }
    }

    fn operands(&self, f: &Function, os: &[Operand]) -> String {
        let list: Vec<String> = os.iter().map(|o| self.operand(f, o)).collect();
        list.join(", ")
    }

    /// `%a = init : T, ...` for `iter(...)`.
    fn iters(&self, f: &Function, iters: &[ValueId], inits: &[Operand]) -> String {
        if iters.is_empty() && inits.is_empty() {
            return String::new();
        }
        let mut s = String::from(" iter(");
        for i in 0..iters.len().max(inits.len()) {
            if i > 0 {
                s.push_str(", ");
            }
            let (name, ty) = match iters.get(i) {
                Some(v) => (value(f, *v), value_type(f, *v)),
                None => ("<bad iter>".into(), "<bad type>".into()),
            };
            let init = match inits.get(i) {
                Some(o) => self.operand(f, o),
                None => "<bad init>".into(),
            };
            let _ = write!(s, "{name} = {init} : {ty}");
        }
        s.push(')');
        s
    }

    fn op(&mut self, f: &Function, op: &Op, level: usize) {
        indent(&mut self.out, level);
        if !op.results.is_empty() {
            let names: Vec<String> = op.results.iter().map(|v| value(f, *v)).collect();
            let _ = write!(self.out, "{} = ", names.join(", "));
        }
        let result_types = || -> String {
            let tys: Vec<Type> = op
                .results
                .iter()
                .map(|v| match f.values.get(v.0 as usize) {
                    Some(d) => d.ty.clone(),
                    None => Type::Ref {
                        name: "<bad>".into(),
                        nullable: false,
                    },
                })
                .collect();
            ResultsText(&tys).to_string()
        };
        let omit = op.results.is_empty();
        match &op.kind {
            OpKind::Simple {
                opcode,
                operands,
                annotation,
            } => {
                self.out.push_str(opcode.name());
                if !operands.is_empty() {
                    let os = self.operands(f, operands);
                    let _ = write!(self.out, " {os}");
                }
                if let Some(t) = annotation {
                    let _ = write!(self.out, " : {t}");
                }
                self.out.push('\n');
            }
            OpKind::Call {
                callee,
                targs,
                args,
            } => {
                let c = self.callee(callee, &f.tparams);
                let _ = write!(self.out, "call {c}");
                if !targs.is_empty() {
                    let list: Vec<String> = targs
                        .iter()
                        .map(|(name, arg)| {
                            let v = match arg {
                                TArg::Value(v) => self.tvalue(v, &f.tparams),
                                TArg::Forward(i) => tparam_name(&f.tparams, *i),
                            };
                            format!("{name} = {v}")
                        })
                        .collect();
                    let _ = write!(self.out, "<{}>", list.join(", "));
                }
                let args = self.operands(f, args);
                let _ = writeln!(self.out, "({args})");
            }
            OpKind::If {
                cond,
                then_region,
                else_region,
            } => {
                let c = self.operand(f, cond);
                let _ = writeln!(self.out, "if {c}{} {{", result_types());
                self.region(f, then_region, level + 1, omit);
                let bare_else = matches!(
                    else_region.ops.as_slice(),
                    [Op { kind: OpKind::Yield(os), .. }] if os.is_empty()
                );
                indent(&mut self.out, level);
                if omit && bare_else {
                    self.out.push_str("}\n");
                } else {
                    self.out.push_str("} else {\n");
                    self.region(f, else_region, level + 1, omit);
                    indent(&mut self.out, level);
                    self.out.push_str("}\n");
                }
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
                let _ = write!(
                    self.out,
                    "for {} = {} to {}",
                    value(f, *iv),
                    self.operand(f, lo),
                    self.operand(f, hi)
                );
                if !matches!(step, Operand::Imm(Imm::I32(1) | Imm::I64(1))) {
                    let _ = write!(self.out, " step {}", self.operand(f, step));
                }
                let iters = self.iters(f, iters, inits);
                let _ = writeln!(self.out, "{iters}{} {{", result_types());
                self.region(f, body, level + 1, omit);
                indent(&mut self.out, level);
                self.out.push_str("}\n");
            }
            OpKind::While {
                iters,
                inits,
                cond_region,
                body,
            } => {
                let iters = self.iters(f, iters, inits);
                let _ = writeln!(self.out, "while{iters}{} {{", result_types());
                self.region(f, cond_region, level + 1, false);
                indent(&mut self.out, level);
                self.out.push_str("} do {\n");
                self.region(f, body, level + 1, omit);
                indent(&mut self.out, level);
                self.out.push_str("}\n");
            }
            OpKind::Yield(os) | OpKind::Return(os) => {
                let kw = if matches!(op.kind, OpKind::Yield(_)) {
                    "yield"
                } else {
                    "return"
                };
                self.out.push_str(kw);
                if !os.is_empty() {
                    let os = self.operands(f, os);
                    let _ = write!(self.out, " {os}");
                }
                self.out.push('\n');
            }
            OpKind::Condition(o) => {
                let o = self.operand(f, o);
                let _ = writeln!(self.out, "condition {o}");
            }
        }
    }
}

fn tparam_name(tps: &[TParam], i: u32) -> String {
    match tps.get(i as usize) {
        Some(tp) => tp.name.clone(),
        None => format!("<bad template parameter {i}>"),
    }
}

fn value(f: &Function, v: ValueId) -> String {
    match f.values.get(v.0 as usize) {
        Some(d) => format!("%{}", d.name),
        None => format!("<bad value {}>", v.0),
    }
}

fn value_type(f: &Function, v: ValueId) -> String {
    match f.values.get(v.0 as usize) {
        Some(d) => d.ty.to_string(),
        None => "<bad type>".into(),
    }
}

/// Writes the groups of items with the canonical blank lines.
struct Groups {
    first: bool,
}

impl Groups {
    /// Starts a group (or a function): a blank line unless it is the first thing printed.
    fn start(&mut self, out: &mut String) {
        if !self.first {
            out.push('\n');
        }
        self.first = false;
    }
}

/// The canonical text of a module (see the module docs).
pub fn print_module(m: &Module) -> String {
    let mut p = Printer {
        funcs: &m.funcs,
        decls: &m.decls,
        records: &m.records,
        out: String::new(),
    };
    let _ = writeln!(p.out, "module @{} {{", m.name);
    let mut g = Groups { first: true };
    if !m.decls.is_empty() {
        g.start(&mut p.out);
        for d in &m.decls {
            p.decl(d);
        }
    }
    if !m.records.is_empty() {
        g.start(&mut p.out);
        for r in &m.records {
            p.record(r);
        }
    }
    if !m.consts.is_empty() {
        g.start(&mut p.out);
        for c in &m.consts {
            let export = if c.exported { "export " } else { "" };
            let _ = writeln!(
                p.out,
                "  {export}const @{}: {} = {}",
                c.name,
                c.value.ty(),
                literal(&c.value)
            );
        }
    }
    for f in &m.funcs {
        g.start(&mut p.out);
        p.func(f);
    }
    // Device items are stored as canonical text already: print it indented, line by line.
    for d in &m.device {
        g.start(&mut p.out);
        for line in d.text.lines() {
            if line.is_empty() {
                p.out.push('\n');
            } else {
                let _ = writeln!(p.out, "  {line}");
            }
        }
    }
    p.out.push_str("}\n");
    p.out
}

/// A readable dump of a linked program, for debugging (qualified names, not re-parseable).
pub fn print_program(prog: &Program) -> String {
    let mut p = Printer {
        funcs: &prog.funcs,
        decls: &prog.imports,
        records: &prog.records,
        out: String::new(),
    };
    p.out.push_str("program {\n");
    for (i, file) in prog.files.iter().enumerate() {
        let _ = writeln!(p.out, "  // file {i}: {}", quote(file));
    }
    for (name, f) in &prog.exports {
        let target = p.callee(&Callee::Func(*f), &[]);
        let _ = writeln!(p.out, "  // export {name} = {target}");
    }
    let mut g = Groups { first: true };
    if !prog.imports.is_empty() {
        g.start(&mut p.out);
        for d in &prog.imports {
            p.decl(d);
        }
    }
    if !prog.records.is_empty() {
        g.start(&mut p.out);
        for r in &prog.records {
            p.record(r);
        }
    }
    for (i, f) in prog.funcs.iter().enumerate() {
        g.start(&mut p.out);
        if let Some(file) = prog
            .func_files
            .get(i)
            .and_then(|fi| prog.files.get(*fi as usize))
        {
            let _ = writeln!(p.out, "  // from {}", quote(file));
        }
        p.func(f);
    }
    p.out.push_str("}\n");
    p.out
}
