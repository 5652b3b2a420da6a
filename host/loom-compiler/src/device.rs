//! Device items (kernels, kfuncs, stages) as canonical text.
//!
//! The host compiler does not compile device code: it stores each item's **canonical rendering** in the
//! module (`loom_ir::DeviceItem::text`), which `.loombc` carries and `loomc dis` prints; the kernel front end
//! (`loom-kernel`) parses that text. The rendering is a fixed point: parsing it again and rendering gives the
//! same text, so `.loom -> .loombc -> text -> .loombc` is stable.
//!
//! The rendering:
//! - the header `export? kind @name<tparams>` is printed from the parsed template parameters (`N: i64 = 4`,
//!   constant expressions with the minimum of parentheses);
//! - then the token trees, separated by one space, except: no space before `,` `:` `>` or after `<`, none
//!   between a word, `@symbol`, `%value` or `>` and a following `(`/`[` group or `<`, none inside `( )`/`[ ]`
//!   next to the brackets, none between `+ - * /` and a following `=` (`+=`);
//! - a line break after every `{` and before every `}`, and wherever the source had one between two tokens
//!   (statements are line-separated in bodies, so lines must survive); comments are dropped;
//! - indentation: lines of the item's header after the first are indented 4 spaces, the body's `{` and `}`
//!   sit at column 0; each group's content is indented 2 more than the line holding its opening bracket.
//!
//! Spacing never changes how the text lexes (`-` followed by a digit keeps its space, so `N -1` stays two
//! tokens, and `<` `-` `>` never fuse into `->`).

use loom_syntax::ast::{self, ConstExpr, TokenTree};
use loom_syntax::{SourceFile, Span};
use std::fmt::Write;

/// The canonical text of one device item (without a trailing newline).
pub(crate) fn render_item(source: &SourceFile, d: &ast::DeviceItem) -> String {
    let mut out = String::new();
    if d.exported {
        out.push_str("export ");
    }
    let kw = match d.kind {
        ast::DeviceKind::Kernel => "kernel",
        ast::DeviceKind::Kfunc => "kfunc",
        ast::DeviceKind::Stage => "stage",
    };
    let _ = write!(out, "{kw} @{}", d.name.text);
    if !d.tparams.is_empty() {
        out.push('<');
        for (i, tp) in d.tparams.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            render_tparam(&mut out, tp);
        }
        out.push('>');
    }
    let header_end = d.tparams.last().map_or(d.name.span, |t| t.span).end;
    let r = Renderer { source };
    let mut prev_end = header_end;
    let last = d.tokens.len().saturating_sub(1);
    for (i, t) in d.tokens.iter().enumerate() {
        let body = i == last && matches!(t, TokenTree::Group { open: '{', .. });
        let line_indent = if body { 0 } else { 4 };
        if r.newline_between(prev_end, span_of(t).start) {
            newline(&mut out, line_indent);
        } else {
            // the header's `>` (or name) precedes the first tree
            let prev_tok = if i > 0 {
                tok_of(&d.tokens[i - 1])
            } else if d.tparams.is_empty() {
                Tok::Name
            } else {
                Tok::Other(">")
            };
            if needs_space(prev_tok, t) {
                out.push(' ');
            }
        }
        r.tree(&mut out, t);
        prev_end = span_of(t).end;
    }
    out
}

fn newline(out: &mut String, indent: usize) {
    // why trim: a line that ends up empty must not keep trailing spaces
    while out.ends_with(' ') {
        out.pop();
    }
    out.push('\n');
    for _ in 0..indent {
        out.push(' ');
    }
}

fn span_of(t: &TokenTree) -> Span {
    match t {
        TokenTree::Token { span, .. } | TokenTree::Group { span, .. } => *span,
    }
}

#[derive(Clone, Copy)]
enum Tok<'a> {
    /// A word, `@symbol` or `%value`: may be followed directly by `(`, `[` or `<`.
    Name,
    Group,
    Other(&'a str),
}

fn tok_of(t: &TokenTree) -> Tok<'_> {
    match t {
        TokenTree::Group { .. } => Tok::Group,
        TokenTree::Token { text, .. } => {
            let mut cs = text.chars();
            let first = cs.next().unwrap_or(' ');
            let named = first.is_ascii_alphabetic()
                || first == '_'
                || ((first == '@' || first == '%') && text.len() > 1);
            if named { Tok::Name } else { Tok::Other(text) }
        }
    }
}

/// Whether one space goes between `prev` and `next` on one line.
fn needs_space(prev: Tok<'_>, next: &TokenTree) -> bool {
    let next_text = match next {
        TokenTree::Token { text, .. } => text.as_str(),
        TokenTree::Group { .. } => "",
    };
    match next {
        TokenTree::Group {
            open: '(' | '[', ..
        } => !matches!(prev, Tok::Name | Tok::Other(">")),
        TokenTree::Group { .. } => true,
        TokenTree::Token { .. } => {
            if matches!(prev, Tok::Other("-")) && next_text.starts_with('>') {
                return true;
            }
            if matches!(next_text, "," | ":" | ">") {
                return false;
            }
            if next_text == "<" && matches!(prev, Tok::Name) {
                return false;
            }
            if matches!(prev, Tok::Other("<")) {
                return false;
            }
            if next_text == "=" && matches!(prev, Tok::Other("+" | "-" | "*" | "/")) {
                return false;
            }
            true
        }
    }
}

struct Renderer<'a> {
    source: &'a SourceFile,
}

impl Renderer<'_> {
    fn newline_between(&self, from: u32, to: u32) -> bool {
        let (a, b) = (from as usize, to as usize);
        a < b && self.source.text.get(a..b).is_some_and(|s| s.contains('\n'))
    }

    /// Writes one tree. A group's content is indented 2 more than the line holding its opening bracket, and
    /// a closing bracket on its own line sits at that line's indentation.
    fn tree(&self, out: &mut String, t: &TokenTree) {
        match t {
            TokenTree::Token { text, .. } => out.push_str(text),
            TokenTree::Group { open, trees, span } => {
                let close = match open {
                    '(' => ')',
                    '[' => ']',
                    _ => '}',
                };
                let line_indent = current_indent(out);
                out.push(*open);
                let inner = line_indent + 2;
                let brace = *open == '{';
                let mut prev_end = span.start.saturating_add(1);
                let mut prev: Option<&TokenTree> = None;
                for child in trees {
                    let cs = span_of(child);
                    if (brace && prev.is_none()) || self.newline_between(prev_end, cs.start) {
                        newline(out, inner);
                    } else if let Some(p) = prev {
                        if needs_space(tok_of(p), child) {
                            out.push(' ');
                        }
                    }
                    self.tree(out, child);
                    prev_end = cs.end;
                    prev = Some(child);
                }
                let close_at = span.end.saturating_sub(1);
                if brace || (prev.is_some() && self.newline_between(prev_end, close_at)) {
                    newline(out, line_indent);
                }
                out.push(close);
            }
        }
    }
}

/// The indentation (leading spaces) of the line being written.
fn current_indent(out: &str) -> usize {
    let line = out.rsplit('\n').next().unwrap_or("");
    line.len() - line.trim_start_matches(' ').len()
}

fn render_tparam(out: &mut String, tp: &ast::TParam) {
    let _ = write!(out, "{}: ", tp.name.text);
    match &tp.kind {
        ast::TParamKind::I64 => out.push_str("i64"),
        ast::TParamKind::Bool => out.push_str("bool"),
        ast::TParamKind::Str => out.push_str("str"),
        ast::TParamKind::DType => out.push_str("dtype"),
        ast::TParamKind::Shape => out.push_str("shape"),
        ast::TParamKind::Func { params, results } => {
            out.push_str("func(");
            for (i, t) in params.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                render_type(out, t);
            }
            out.push(')');
            match results.as_slice() {
                [] => {}
                [t] => {
                    out.push_str(" -> ");
                    render_type(out, t);
                }
                ts => {
                    out.push_str(" -> (");
                    for (i, t) in ts.iter().enumerate() {
                        if i > 0 {
                            out.push_str(", ");
                        }
                        render_type(out, t);
                    }
                    out.push(')');
                }
            }
        }
    }
    if let Some(d) = &tp.default {
        out.push_str(" = ");
        render_const(out, d, 0);
    }
}

fn render_type(out: &mut String, t: &ast::Type) {
    match t {
        ast::Type::I1(_) => out.push_str("i1"),
        ast::Type::I32(_) => out.push_str("i32"),
        ast::Type::I64(_) => out.push_str("i64"),
        ast::Type::F32(_) => out.push_str("f32"),
        ast::Type::F64(_) => out.push_str("f64"),
        ast::Type::Str(_) => out.push_str("str"),
        ast::Type::Buffer(_) => out.push_str("buffer"),
        ast::Type::List(inner, _) => {
            out.push_str("list<");
            render_type(out, inner);
            out.push('>');
        }
        ast::Type::Ref { name, nullable, .. } => {
            let _ = write!(out, "{}!{}", if *nullable { "?" } else { "" }, name.text);
        }
        // unreachable after a clean parse; any text keeps the renderer total
        ast::Type::Error(_) => out.push_str("i64"),
    }
}

/// `prec`: 0 anywhere, 1 as an operand of `+`/`-` on the right, 2 as an operand of `*`/`/`/`%`.
fn render_const(out: &mut String, e: &ConstExpr, prec: u8) {
    match e {
        ConstExpr::Int(v, _) => {
            let _ = write!(out, "{v}");
        }
        ConstExpr::Float(v, _) => {
            let _ = write!(out, "{v:?}");
        }
        ConstExpr::Bool(b, _) => {
            let _ = write!(out, "{b}");
        }
        ConstExpr::Str(s, _) => out.push_str(&quote(s)),
        ConstExpr::List(items, _) => {
            out.push('[');
            for (i, it) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                render_const(out, it, 0);
            }
            out.push(']');
        }
        ConstExpr::Word(n) => out.push_str(&n.text),
        ConstExpr::Symbol(n) => {
            let _ = write!(out, "@{}", n.text);
        }
        ConstExpr::Binary { op, lhs, rhs, .. } => {
            let mine = if matches!(op, '+' | '-') { 1 } else { 2 };
            let paren = mine < prec;
            if paren {
                out.push('(');
            }
            render_const(out, lhs, mine);
            let _ = write!(out, " {op} ");
            // right operands of the same precedence need parentheses (left associativity)
            render_const(out, rhs, mine + 1);
            if paren {
                out.push(')');
            }
        }
        ConstExpr::Neg(inner, _) => {
            out.push('-');
            let atom = matches!(
                **inner,
                ConstExpr::Int(..) | ConstExpr::Float(..) | ConstExpr::Word(_) | ConstExpr::Neg(..)
            );
            if atom {
                render_const(out, inner, 3);
            } else {
                out.push('(');
                render_const(out, inner, 0);
                out.push(')');
            }
        }
        ConstExpr::Error(_) => out.push('0'),
    }
}

fn quote(s: &str) -> String {
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
