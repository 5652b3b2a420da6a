//! A compact, readable, deterministic text form of a syntax tree, used by the golden tests.
//!
//! The form is S-expression-like. Items and statements start on their own line, indented two spaces per
//! level, and carry the `line:col` of their start; everything inside a statement stays on its line:
//!
//! ```text
//! (module @embed.control
//!   (decl @input.encode 2:3 (params buffer i32 i64) (results buffer i64) (import "input"))
//!   (record @Range 5:3 (offset i64) (length i64))
//!   (const export @MAX 6:3 i64 (+ N (* 2 -1)))
//!   (func export @f 8:3 (tparams (N i64 = 4) (F (func (i64) -> (i64)))) (params (%x i64)) (results i64)
//!     (let 9:5 (%t) (op mul %x (add %x 1)))
//!     (let 10:5 () (for %i 0 N (step 2) (iter (%acc 0 i64)) (results i64)
//!       (yield 11:7 (add %acc %i))))
//!     (return 12:5 %t)))
//! ```
//!
//! Operands print as written (`%x`, `@sym`, `N`, `"text"`, `1.5`), nested operations as `(name operands)`,
//! const-expression operators as `(+ a b)` and `(neg a)`, lists as `(list a b)`, broken pieces as
//! `(error L:C)`, missing names as `@?`. Device items print their token trees with groups in their
//! brackets, keeping the source's line breaks.

use std::fmt::Write as _;

use crate::SourceFile;
use crate::ast::{
    Block, Callee, ConstExpr, DeviceKind, Expr, Item, IterArg, Module, Name, Operand, Stmt, TParam,
    TParamKind, TokenTree, Type,
};
use crate::diagnostic::Span;

/// Renders `module` (parsed from `source`) in the form described in the module docs.
pub fn dump(module: &Module, source: &SourceFile) -> String {
    let mut d = Dumper {
        src: source,
        out: String::new(),
    };
    d.module(module);
    d.out
}

struct Dumper<'s> {
    src: &'s SourceFile,
    out: String,
}

fn sym(n: &Name) -> String {
    if n.text.is_empty() {
        "@?".to_string()
    } else {
        format!("@{}", n.text)
    }
}

fn word(n: &Name) -> String {
    if n.text.is_empty() {
        "?".to_string()
    } else {
        n.text.clone()
    }
}

impl Dumper<'_> {
    fn lc(&self, span: Span) -> String {
        let lc = self.src.line_col(span.start);
        format!("{}:{}", lc.line, lc.col)
    }

    fn line(&mut self, indent: usize, text: &str) {
        if !self.out.is_empty() {
            self.out.push('\n');
        }
        for _ in 0..indent {
            self.out.push_str("  ");
        }
        self.out.push_str(text);
    }

    fn module(&mut self, m: &Module) {
        let name = m.name.as_ref().map_or("(no name)".to_string(), sym);
        self.line(0, &format!("(module {name}"));
        for item in &m.items {
            self.item(item, 1);
        }
        self.out.push_str(")\n");
    }

    fn item(&mut self, item: &Item, ind: usize) {
        match item {
            Item::Decl(d) => {
                let mut s = format!("(decl {} {}", sym(&d.name), self.lc(d.span));
                self.tparams(&mut s, &d.tparams);
                let _ = write!(s, " (params{})", self.types(&d.params));
                if !d.results.is_empty() {
                    let _ = write!(s, " (results{})", self.types(&d.results));
                }
                if let Some(i) = &d.import {
                    let _ = write!(s, " (import {:?})", i.text);
                }
                s.push(')');
                self.line(ind, &s);
            }
            Item::Func(f) => {
                let mut s = format!(
                    "(func {}{} {}",
                    if f.exported { "export " } else { "" },
                    sym(&f.name),
                    self.lc(f.span)
                );
                self.tparams(&mut s, &f.tparams);
                s.push_str(" (params");
                for p in &f.params {
                    let _ = write!(s, " (%{} {})", word(&p.name), self.ty(&p.ty));
                }
                s.push(')');
                if !f.results.is_empty() {
                    let _ = write!(s, " (results{})", self.types(&f.results));
                }
                self.line(ind, &s);
                self.stmts(&f.body, ind + 1);
                self.out.push(')');
            }
            Item::Record(r) => {
                let mut s = format!(
                    "(record {}{} {}",
                    if r.exported { "export " } else { "" },
                    sym(&r.name),
                    self.lc(r.span)
                );
                for (n, t) in &r.fields {
                    let _ = write!(s, " ({} {})", word(n), self.ty(t));
                }
                s.push(')');
                self.line(ind, &s);
            }
            Item::Const(c) => {
                let s = format!(
                    "(const {}{} {} {} {})",
                    if c.exported { "export " } else { "" },
                    sym(&c.name),
                    self.lc(c.span),
                    self.ty(&c.ty),
                    self.cexpr(&c.value)
                );
                self.line(ind, &s);
            }
            Item::Device(d) => {
                let kind = match d.kind {
                    DeviceKind::Kernel => "kernel",
                    DeviceKind::Kfunc => "kfunc",
                    DeviceKind::Stage => "stage",
                };
                let mut s = format!(
                    "({kind} {}{} {}",
                    if d.exported { "export " } else { "" },
                    sym(&d.name),
                    self.lc(d.span)
                );
                self.tparams(&mut s, &d.tparams);
                self.line(ind, &s);
                self.line(ind + 1, "(tokens");
                let mut last_line = 0;
                let mut first = true;
                self.trees(&d.tokens, ind + 2, &mut last_line, &mut first);
                self.out.push_str("))");
            }
        }
    }

    /// Token trees, space-separated, starting a new line wherever the source does.
    fn trees(&mut self, trees: &[TokenTree], ind: usize, last_line: &mut u32, first: &mut bool) {
        for t in trees {
            let (span, text) = match t {
                TokenTree::Token { text, span } => (*span, text.clone()),
                TokenTree::Group { open, span, .. } => (*span, open.to_string()),
            };
            let line = self.src.line_col(span.start).line;
            if *first || line != *last_line {
                self.line(ind, &text);
            } else {
                self.out.push(' ');
                self.out.push_str(&text);
            }
            *first = false;
            *last_line = line;
            if let TokenTree::Group { open, trees, span } = t {
                self.trees(trees, ind + 1, last_line, first);
                let close = match open {
                    '(' => ')',
                    '[' => ']',
                    _ => '}',
                };
                // the closer sits at the group's end (a group closed by error ends at its last tree)
                let end_line = self.src.line_col(span.end.saturating_sub(1)).line;
                if end_line != *last_line {
                    self.line(ind, &close.to_string());
                } else {
                    self.out.push(' ');
                    self.out.push(close);
                }
                *last_line = end_line;
            }
        }
    }

    fn tparams(&self, s: &mut String, tparams: &[TParam]) {
        if tparams.is_empty() {
            return;
        }
        s.push_str(" (tparams");
        for t in tparams {
            let kind = match &t.kind {
                TParamKind::I64 => "i64".to_string(),
                TParamKind::Bool => "bool".to_string(),
                TParamKind::Str => "str".to_string(),
                TParamKind::DType => "dtype".to_string(),
                TParamKind::Shape => "shape".to_string(),
                TParamKind::Func { params, results } => {
                    format!(
                        "(func ({}) -> ({}))",
                        self.types(params).trim_start(),
                        self.types(results).trim_start()
                    )
                }
            };
            let _ = write!(s, " ({} {kind}", word(&t.name));
            if let Some(d) = &t.default {
                let _ = write!(s, " = {}", self.cexpr(d));
            }
            s.push(')');
        }
        s.push(')');
    }

    /// Types, each preceded by a space.
    fn types(&self, tys: &[Type]) -> String {
        tys.iter().map(|t| format!(" {}", self.ty(t))).collect()
    }

    fn ty(&self, t: &Type) -> String {
        match t {
            Type::I1(_) => "i1".into(),
            Type::I32(_) => "i32".into(),
            Type::I64(_) => "i64".into(),
            Type::F32(_) => "f32".into(),
            Type::F64(_) => "f64".into(),
            Type::Str(_) => "str".into(),
            Type::Buffer(_) => "buffer".into(),
            Type::List(inner, _) => format!("list<{}>", self.ty(inner)),
            Type::Ref { name, nullable, .. } => {
                format!("{}!{}", if *nullable { "?" } else { "" }, word(name))
            }
            Type::Error(s) => format!("(error {})", self.lc(*s)),
        }
    }

    fn cexpr(&self, e: &ConstExpr) -> String {
        match e {
            ConstExpr::Int(v, _) => v.to_string(),
            ConstExpr::Float(v, _) => format!("{v:?}"),
            ConstExpr::Bool(v, _) => v.to_string(),
            ConstExpr::Str(v, _) => format!("{v:?}"),
            ConstExpr::List(items, _) => {
                let mut s = "(list".to_string();
                for i in items {
                    s.push(' ');
                    s.push_str(&self.cexpr(i));
                }
                s.push(')');
                s
            }
            ConstExpr::Word(n) => word(n),
            ConstExpr::Symbol(n) => sym(n),
            ConstExpr::Binary { op, lhs, rhs, .. } => {
                format!("({op} {} {})", self.cexpr(lhs), self.cexpr(rhs))
            }
            ConstExpr::Neg(inner, _) => format!("(neg {})", self.cexpr(inner)),
            ConstExpr::Error(s) => format!("(error {})", self.lc(*s)),
        }
    }

    fn operand(&self, o: &Operand) -> String {
        match o {
            Operand::Value(n) => format!("%{}", word(n)),
            Operand::Int(v, _) => v.to_string(),
            Operand::Float(v, _) => format!("{v:?}"),
            Operand::Str(v, _) => format!("{v:?}"),
            Operand::Bool(v, _) => v.to_string(),
            Operand::Null(_) => "null".into(),
            Operand::Word(n) => word(n),
            Operand::Symbol(n) => sym(n),
            Operand::Nested { name, operands, .. } => {
                format!("({}{})", word(name), self.operands(operands))
            }
            Operand::Error(s) => format!("(error {})", self.lc(*s)),
        }
    }

    /// Operands, each preceded by a space.
    fn operands(&self, ops: &[Operand]) -> String {
        ops.iter()
            .map(|o| format!(" {}", self.operand(o)))
            .collect()
    }

    fn stmts(&mut self, b: &Block, ind: usize) {
        for s in &b.stmts {
            self.stmt(s, ind);
        }
    }

    fn stmt(&mut self, s: &Stmt, ind: usize) {
        match s {
            Stmt::Let {
                results,
                expr,
                span,
            } => {
                let names: Vec<String> = results.iter().map(|n| format!("%{}", word(n))).collect();
                let head = format!("(let {} ({}) ", self.lc(*span), names.join(" "));
                self.expr(expr, head, ind);
                self.out.push(')');
            }
            Stmt::Return { values, span } => {
                let s = format!("(return {}{})", self.lc(*span), self.operands(values));
                self.line(ind, &s);
            }
            Stmt::Yield { values, span } => {
                let s = format!("(yield {}{})", self.lc(*span), self.operands(values));
                self.line(ind, &s);
            }
            Stmt::Condition { value, span } => {
                let s = format!("(condition {} {})", self.lc(*span), self.operand(value));
                self.line(ind, &s);
            }
            Stmt::Error(span) => {
                let s = format!("(error {})", self.lc(*span));
                self.line(ind, &s);
            }
        }
    }

    /// Writes `head` + the expression on a new line; blocks go on the following lines.
    fn expr(&mut self, e: &Expr, mut head: String, ind: usize) {
        match e {
            Expr::Op {
                name,
                operands,
                annotation,
                ..
            } => {
                let _ = write!(head, "(op {}{}", word(name), self.operands(operands));
                if let Some(t) = annotation {
                    let _ = write!(head, " : {}", self.ty(t));
                }
                head.push(')');
                self.line(ind, &head);
            }
            Expr::Call {
                callee,
                targs,
                args,
                ..
            } => {
                let callee = match callee {
                    Callee::Symbol(n) => sym(n),
                    Callee::TParam(n) => word(n),
                };
                let _ = write!(head, "(call {callee}");
                if !targs.is_empty() {
                    head.push_str(" (targs");
                    for t in targs {
                        let _ = write!(head, " ({} = {})", word(&t.name), self.cexpr(&t.value));
                    }
                    head.push(')');
                }
                let _ = write!(head, " (args{}))", self.operands(args));
                self.line(ind, &head);
            }
            Expr::If {
                cond,
                results,
                then_block,
                else_block,
                ..
            } => {
                let _ = write!(head, "(if {}", self.operand(cond));
                self.results(&mut head, results);
                self.line(ind, &head);
                self.line(ind + 1, "(then");
                self.stmts(then_block, ind + 2);
                self.out.push(')');
                if let Some(b) = else_block {
                    self.line(ind + 1, "(else");
                    self.stmts(b, ind + 2);
                    self.out.push(')');
                }
                self.out.push(')');
            }
            Expr::For {
                var,
                lo,
                hi,
                step,
                iters,
                results,
                body,
                ..
            } => {
                let _ = write!(
                    head,
                    "(for %{} {} {}",
                    word(var),
                    self.operand(lo),
                    self.operand(hi)
                );
                if let Some(s) = step {
                    let _ = write!(head, " (step {})", self.operand(s));
                }
                self.iters(&mut head, iters);
                self.results(&mut head, results);
                self.line(ind, &head);
                self.stmts(body, ind + 1);
                self.out.push(')');
            }
            Expr::While {
                iters,
                results,
                cond_block,
                body,
                ..
            } => {
                head.push_str("(while");
                self.iters(&mut head, iters);
                self.results(&mut head, results);
                self.line(ind, &head);
                self.line(ind + 1, "(cond");
                self.stmts(cond_block, ind + 2);
                self.out.push(')');
                self.line(ind + 1, "(do");
                self.stmts(body, ind + 2);
                self.out.push_str("))");
            }
        }
    }

    fn results(&self, s: &mut String, results: &[Type]) {
        if !results.is_empty() {
            let _ = write!(s, " (results{})", self.types(results));
        }
    }

    fn iters(&self, s: &mut String, iters: &[IterArg]) {
        if iters.is_empty() {
            return;
        }
        s.push_str(" (iter");
        for i in iters {
            let _ = write!(
                s,
                " (%{} {} {})",
                word(&i.name),
                self.operand(&i.init),
                self.ty(&i.ty)
            );
        }
        s.push(')');
    }
}
