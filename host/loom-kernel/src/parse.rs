//! Parsing a device item's text into the kernel AST ([`crate::ast`]).
//!
//! The text is the canonical rendering the host compiler stores (`loom_ir::DeviceItem::text`), or any source
//! text of one item. It is wrapped in a throwaway `module` and handed to `loom_syntax::parse`, which gives
//! the header (name, template parameters) and balanced token trees; this module parses the trees with the
//! kernel grammar (`docs/loom/kernels.md`). Statements in a `{}` block are separated by line breaks (as in
//! host code): a tree that starts on a later line than the previous tree ended begins a new statement,
//! unless the previous token is `,`.
//!
//! Diagnostics are rendered against an *overlay* of the item's file: the item's text placed at its stored
//! line and column, so `file:line:col` points into the original file for conventionally formatted code.
//! Parsing never panics; nesting of groups, blocks and expressions is bounded by [`MAX_DEPTH`].

use crate::ast::*;
use loom_syntax::ast::{self as sx, TokenTree};
use loom_syntax::{Diagnostic, SourceFile, Span};

/// Deepest nesting of blocks and expressions the kernel parser accepts.
pub const MAX_DEPTH: u32 = 64;

const PREFIX: &str = "module @k {\n";

/// Where a parsed item's spans point: renders diagnostics as `file:line:col: error: ...` with an excerpt.
#[derive(Debug, Clone)]
pub struct ItemSource {
    overlay: SourceFile,
    /// Added to a span of the parsed text to get a span of `overlay`.
    shift: i64,
}

impl ItemSource {
    /// Renders an error at `span` (a span of the parsed text).
    pub fn error(&self, span: Span, msg: impl Into<String>) -> String {
        self.render(&Diagnostic::error(span, msg))
    }

    pub fn render(&self, d: &Diagnostic) -> String {
        let mut d = d.clone();
        d.span = self.map(d.span);
        self.overlay.render(&d)
    }

    /// `file:line:col` of a span.
    pub fn location(&self, span: Span) -> String {
        self.overlay.location(self.map(span))
    }

    fn map(&self, s: Span) -> Span {
        let f = |v: u32| (i64::from(v) + self.shift).clamp(0, u32::MAX as i64) as usize;
        Span::new(f(s.start), f(s.end))
    }
}

/// Parses one device item's text; `file`, `line` and `col` place it for diagnostics.
pub fn parse_item(
    file: &str,
    line: u32,
    col: u32,
    text: &str,
) -> Result<(Item, ItemSource), Vec<String>> {
    // why capped: positions come from (untrusted) bytecode; a huge pad would only waste memory
    let (line, col) = if line == 0 || line > 1_000_000 || col == 0 || col > 10_000 {
        (1, 1)
    } else {
        (line, col)
    };
    let mut pad = "\n".repeat(line as usize - 1);
    pad.push_str(&" ".repeat(col as usize - 1));
    let src = ItemSource {
        overlay: SourceFile::new(file, format!("{pad}{text}")),
        shift: pad.len() as i64 - PREFIX.len() as i64,
    };
    let input = format!("{PREFIX}{text}\n}}\n");
    let (module, diags) = loom_syntax::parse(&input);
    let errors: Vec<String> = diags
        .iter()
        .filter(|d| d.severity == loom_syntax::Severity::Error)
        .map(|d| src.render(d))
        .collect();
    if !errors.is_empty() {
        return Err(errors);
    }
    let items: Vec<&sx::DeviceItem> = module
        .items
        .iter()
        .filter_map(|i| match i {
            sx::Item::Device(d) => Some(d),
            _ => None,
        })
        .collect();
    let [d] = items.as_slice() else {
        return Err(vec![src.error(
            Span::new(PREFIX.len(), PREFIX.len()),
            format!(
                "expected exactly one kernel, kfunc or stage, found {}",
                items.len()
            ),
        )]);
    };
    if module.items.len() != 1 {
        return Err(vec![
            src.error(d.span, "expected only the device item in its text"),
        ]);
    }
    let lines = SourceFile::new("", input.clone());
    let mut p = Parser {
        lines: &lines,
        depth: 0,
        stage: d.kind == sx::DeviceKind::Stage,
    };
    match p.item(d) {
        Ok(item) => Ok((item, src)),
        Err(e) => Err(vec![src.render(&e)]),
    }
}

type R<T> = Result<T, Diagnostic>;

/// A token tree classified for the kernel parser: a word, `@symbol`, `%value`, literal, punctuation or group.
#[derive(Clone, Debug)]
enum Classified<'t> {
    Word(&'t str),
    Symbol(&'t str),
    Value(&'t str),
    Int(i64),
    Float(f64),
    Str(String),
    Punct(char),
    Arrow,
    Group(char, &'t [TokenTree]),
    Bad,
}

fn span_of(t: &TokenTree) -> Span {
    match t {
        TokenTree::Token { span, .. } | TokenTree::Group { span, .. } => *span,
    }
}

fn classify(t: &TokenTree) -> Classified<'_> {
    let text = match t {
        TokenTree::Group { open, trees, .. } => return Classified::Group(*open, trees),
        TokenTree::Token { text, .. } => text.as_str(),
    };
    let first = text.chars().next().unwrap_or(' ');
    match first {
        c if c.is_ascii_alphabetic() || c == '_' => Classified::Word(text),
        '@' => Classified::Symbol(&text[1..]),
        '%' if text.len() > 1 => Classified::Value(&text[1..]),
        '"' => unescape(text).map_or(Classified::Bad, Classified::Str),
        '-' if text == "->" => Classified::Arrow,
        c if c.is_ascii_digit() || (c == '-' && text.len() > 1) => number(text),
        _ => {
            let mut cs = text.chars();
            match (cs.next(), cs.next()) {
                (Some(c), None) => Classified::Punct(c),
                _ => Classified::Bad,
            }
        }
    }
}

fn number(text: &str) -> Classified<'_> {
    let (neg, body) = match text.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, text),
    };
    let clean: String = body.chars().filter(|&c| c != '_').collect();
    if let Some(h) = clean
        .strip_prefix("0x")
        .or_else(|| clean.strip_prefix("0X"))
    {
        return match i128::from_str_radix(h, 16) {
            Ok(v) => {
                i64::try_from(if neg { -v } else { v }).map_or(Classified::Bad, Classified::Int)
            }
            Err(_) => Classified::Bad,
        };
    }
    if clean.contains(['.', 'e', 'E']) {
        return match clean.parse::<f64>() {
            Ok(v) if v.is_finite() => Classified::Float(if neg { -v } else { v }),
            _ => Classified::Bad,
        };
    }
    match clean.parse::<i128>() {
        Ok(v) => i64::try_from(if neg { -v } else { v }).map_or(Classified::Bad, Classified::Int),
        Err(_) => Classified::Bad,
    }
}

/// A string literal's value (the lexer already validated its escapes).
fn unescape(text: &str) -> Option<String> {
    let inner = text.strip_prefix('"')?.strip_suffix('"')?;
    let mut out = String::new();
    let mut cs = inner.chars();
    while let Some(c) = cs.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match cs.next()? {
            'n' => out.push('\n'),
            't' => out.push('\t'),
            'r' => out.push('\r'),
            '\\' => out.push('\\'),
            '"' => out.push('"'),
            '0' => out.push('\0'),
            'x' => {
                let h: String = cs.by_ref().take(2).collect();
                out.push(char::from(u8::from_str_radix(&h, 16).ok()?));
            }
            'u' => {
                if cs.next()? != '{' {
                    return None;
                }
                let h: String = cs.by_ref().take_while(|&c| c != '}').collect();
                out.push(char::from_u32(u32::from_str_radix(&h, 16).ok()?)?);
            }
            _ => return None,
        }
    }
    Some(out)
}

/// A cursor over a sequence of sibling token trees.
struct Cursor<'t> {
    trees: &'t [TokenTree],
    pos: usize,
    /// Where "end of input" diagnostics point.
    end: Span,
}

impl<'t> Cursor<'t> {
    fn new(trees: &'t [TokenTree], end: Span) -> Cursor<'t> {
        Cursor { trees, pos: 0, end }
    }
    fn peek(&self) -> Option<Classified<'t>> {
        self.trees.get(self.pos).map(classify)
    }
    fn peek_at(&self, k: usize) -> Option<Classified<'t>> {
        self.trees.get(self.pos + k).map(classify)
    }
    fn span(&self) -> Span {
        self.trees.get(self.pos).map_or(self.end, span_of)
    }
    fn prev_span(&self) -> Span {
        self.pos
            .checked_sub(1)
            .and_then(|i| self.trees.get(i))
            .map_or(self.end, span_of)
    }
    fn at_end(&self) -> bool {
        self.pos >= self.trees.len()
    }
    fn bump(&mut self) -> Option<(Classified<'t>, Span)> {
        let t = self.trees.get(self.pos)?;
        self.pos += 1;
        Some((classify(t), span_of(t)))
    }
    fn is_punct(&self, c: char) -> bool {
        matches!(self.peek(), Some(Classified::Punct(p)) if p == c)
    }
    fn is_word(&self, w: &str) -> bool {
        matches!(self.peek(), Some(Classified::Word(x)) if x == w)
    }
    fn eat_punct(&mut self, c: char) -> bool {
        if self.is_punct(c) {
            self.pos += 1;
            true
        } else {
            false
        }
    }
    fn eat_word(&mut self, w: &str) -> bool {
        if self.is_word(w) {
            self.pos += 1;
            true
        } else {
            false
        }
    }
    fn describe(&self) -> String {
        match self.trees.get(self.pos) {
            None => "the end of the list".into(),
            Some(TokenTree::Group { open, .. }) => format!("'{open}'"),
            Some(TokenTree::Token { text, .. }) => {
                let t: String = text.chars().take(32).collect();
                format!("'{t}'")
            }
        }
    }
    fn expected(&self, what: &str) -> Diagnostic {
        Diagnostic::error(
            self.span(),
            format!("expected {what}, found {}", self.describe()),
        )
    }
    fn expect_punct(&mut self, c: char, ctx: &str) -> R<()> {
        if self.eat_punct(c) {
            Ok(())
        } else {
            Err(self.expected(&format!("'{c}' {ctx}")))
        }
    }
    fn group(&mut self, open: char, what: &str) -> R<(&'t [TokenTree], Span)> {
        match self.peek() {
            Some(Classified::Group(o, trees)) if o == open => {
                let s = self.span();
                self.pos += 1;
                Ok((trees, s))
            }
            _ => Err(self.expected(what)),
        }
    }
    fn value(&mut self, what: &str) -> R<Name> {
        match self.peek() {
            Some(Classified::Value(v)) => {
                let span = self.span();
                self.pos += 1;
                Ok(Name {
                    text: v.to_string(),
                    span,
                })
            }
            _ => Err(self.expected(what)),
        }
    }
    fn word(&mut self, what: &str) -> R<Name> {
        match self.peek() {
            Some(Classified::Word(v)) => {
                let span = self.span();
                self.pos += 1;
                Ok(Name {
                    text: v.to_string(),
                    span,
                })
            }
            _ => Err(self.expected(what)),
        }
    }
    fn done(&self, ctx: &str) -> R<()> {
        if self.at_end() {
            Ok(())
        } else {
            Err(Diagnostic::error(
                self.span(),
                format!("unexpected {} {ctx}", self.describe()),
            ))
        }
    }
}

/// The inside of a group: its trees and the span of its closing bracket.
fn inner(trees: &[TokenTree], span: Span) -> Cursor<'_> {
    Cursor::new(
        trees,
        Span::new(span.end.saturating_sub(1) as usize, span.end as usize),
    )
}

struct Parser<'a> {
    lines: &'a SourceFile,
    depth: u32,
    /// Parsing a stage: `%h[i] = op` defines a family member (in kernels it is index notation).
    stage: bool,
}

impl Parser<'_> {
    fn enter(&mut self, span: Span) -> R<()> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(Diagnostic::error(
                span,
                format!(
                    "nesting too deep (more than {MAX_DEPTH} levels of blocks and expressions)"
                ),
            ));
        }
        Ok(())
    }
    fn leave(&mut self) {
        self.depth = self.depth.saturating_sub(1);
    }

    fn item(&mut self, d: &sx::DeviceItem) -> R<Item> {
        let kind = match d.kind {
            sx::DeviceKind::Kernel => DeviceKind::Kernel,
            sx::DeviceKind::Kfunc => DeviceKind::Kfunc,
            sx::DeviceKind::Stage => DeviceKind::Stage,
        };
        let end = Span::new(d.span.end as usize, d.span.end as usize);
        let mut c = Cursor::new(&d.tokens, end);
        let header = match kind {
            DeviceKind::Kernel => {
                if !c.eat_word("grid") {
                    return Err(c.expected("'grid(...)' after the kernel's name"));
                }
                let (g, gs) = c.group('(', "'(' after 'grid'")?;
                let grid = self.expr_list(g, gs)?;
                if grid.is_empty() || grid.len() > 3 {
                    return Err(Diagnostic::error(gs, "a grid has 1 to 3 dimensions"));
                }
                let (p, ps) = c.group('(', "the kernel's parameter list '(...)'")?;
                let params = self.buf_decls(p, ps)?;
                Header::Kernel { grid, params }
            }
            DeviceKind::Kfunc => {
                let (p, ps) = c.group('(', "the kfunc's parameter list '(...)'")?;
                let mut pc = inner(p, ps);
                let mut params = Vec::new();
                while !pc.at_end() {
                    let name = pc.value("a parameter '%name: type'")?;
                    pc.expect_punct(':', "and the parameter's type")?;
                    let ty = self.type_expr(&mut pc)?;
                    params.push((name, ty));
                    if !pc.eat_punct(',') {
                        pc.done("in the parameter list")?;
                    }
                }
                let mut results = Vec::new();
                if matches!(c.peek(), Some(Classified::Arrow)) {
                    c.bump();
                    if let Some(Classified::Group('(', trees)) = c.peek() {
                        let s = c.span();
                        c.bump();
                        let mut rc = inner(trees, s);
                        while !rc.at_end() {
                            results.push(self.type_expr(&mut rc)?);
                            if !rc.eat_punct(',') {
                                rc.done("in the result list")?;
                            }
                        }
                    } else {
                        results.push(self.type_expr(&mut c)?);
                    }
                }
                Header::Kfunc { params, results }
            }
            DeviceKind::Stage => {
                let (p, ps) = c.group('(', "the stage's buffer list '(...)'")?;
                let buffers = self.buf_decls(p, ps)?;
                let params = if c.eat_word("params") {
                    let domain = match c.bump() {
                        Some((Classified::Symbol(s), span)) => Name {
                            text: s.to_string(),
                            span,
                        },
                        _ => return Err(c.expected("the parameter domain '@name'")),
                    };
                    let (a, as_) = c.group('(', "'(inputs: N)' after the parameter domain")?;
                    let mut ac = inner(a, as_);
                    if !ac.eat_word("inputs") {
                        return Err(ac.expected("'inputs'"));
                    }
                    ac.expect_punct(':', "after 'inputs'")?;
                    let inputs = self.expr(&mut ac)?;
                    ac.done("after the input count")?;
                    let (b, bs) = c.group('{', "the parameter bindings '{ ... }'")?;
                    let bindings = self.bindings(b, bs)?;
                    Some(ParamBlock {
                        domain,
                        inputs,
                        bindings,
                    })
                } else {
                    None
                };
                Header::Stage { buffers, params }
            }
        };
        let (b, bs) = c.group('{', "the body '{ ... }'")?;
        let body = self.block(b, bs)?;
        c.done("after the body")?;
        Ok(Item {
            kind,
            exported: d.exported,
            name: Name {
                text: d.name.text.clone(),
                span: d.name.span,
            },
            tparams: d.tparams.clone(),
            header,
            body,
            span: d.span,
        })
    }

    fn buf_decls(&mut self, trees: &[TokenTree], span: Span) -> R<Vec<BufDecl>> {
        let mut c = inner(trees, span);
        let mut out = Vec::new();
        while !c.at_end() {
            let name = c.value("a buffer '%name: buffer<dtype, [dims]> mode'")?;
            c.expect_punct(':', "and the buffer's type")?;
            if !c.eat_word("buffer") {
                return Err(c.expected("'buffer<dtype, [dims]>'"));
            }
            c.expect_punct('<', "after 'buffer'")?;
            let dtype = self.expr(&mut c)?;
            c.expect_punct(',', "between the buffer's dtype and its dims")?;
            let (d, ds) = c.group('[', "the buffer's dims '[...]'")?;
            let dims = self.expr_list(d, ds)?;
            c.expect_punct('>', "to close 'buffer<'")?;
            let mode =
                c.word("an access mode (read, write, readwrite) or direction (input, output)")?;
            out.push(BufDecl {
                span: name.span.to(mode.span),
                name,
                dtype,
                dims,
                mode,
            });
            if !c.eat_punct(',') {
                c.done("in the buffer list")?;
            }
        }
        Ok(out)
    }

    fn bindings(&mut self, trees: &[TokenTree], span: Span) -> R<Vec<ParamItem>> {
        self.enter(span)?;
        let r = self.bindings_inner(trees, span);
        self.leave();
        r
    }

    fn bindings_inner(&mut self, trees: &[TokenTree], span: Span) -> R<Vec<ParamItem>> {
        let mut c = inner(trees, span);
        let mut out = Vec::new();
        while !c.at_end() {
            let start = c.span();
            if c.eat_word("static.for") {
                let header = self.static_for(&mut c, start)?;
                let (b, bs) = c.group('{', "the loop body '{ ... }'")?;
                let body = self.bindings(b, bs)?;
                out.push(ParamItem::For { header, body });
                continue;
            }
            let name =
                c.value("a parameter binding '%name: dtype[dims] = weights(input, \"key\")'")?;
            let index = self.family_index(&mut c)?;
            c.expect_punct(':', "and the binding's type")?;
            let dtype = Expr::Word(c.word("an element type")?);
            let (d, ds) = c.group('[', "the binding's dims '[...]'")?;
            let dims = self.expr_list(d, ds)?;
            c.expect_punct('=', "and the binding's source")?;
            if !c.eat_word("weights") {
                return Err(c.expected("'weights(input, \"key\")'"));
            }
            let (w, ws) = c.group('(', "'(input, \"key\")' after 'weights'")?;
            let mut wc = inner(w, ws);
            let input = self.expr(&mut wc)?;
            wc.expect_punct(',', "between the input ordinal and the key")?;
            let key = match wc.bump() {
                Some((Classified::Str(s), ks)) => key_template(&s, ks)?,
                _ => {
                    return Err(Diagnostic::error(
                        wc.prev_span(),
                        "expected the checkpoint key as a string",
                    ));
                }
            };
            wc.done("after the key")?;
            let mut layout = None;
            if c.eat_word("layout") {
                let (l, ls) = c.group('(', "'(name)' after 'layout'")?;
                let mut lc = inner(l, ls);
                layout = Some(lc.word("a layout name")?.text);
                lc.done("after the layout")?;
            }
            out.push(ParamItem::Binding(Binding {
                span: name.span.to(c.prev_span()),
                name,
                index,
                dtype,
                dims,
                input,
                key,
                layout,
            }));
        }
        Ok(out)
    }

    /// `[INDEX]` after a defined name: the member of a family (one compile-time index).
    fn family_index(&mut self, c: &mut Cursor<'_>) -> R<Option<Expr>> {
        let Some(Classified::Group('[', trees)) = c.peek() else {
            return Ok(None);
        };
        let gs = c.span();
        c.bump();
        let mut idx = self.expr_list(trees, gs)?;
        if idx.len() != 1 {
            return Err(Diagnostic::error(
                gs,
                "a family member has one index: `%name[INDEX]`",
            ));
        }
        Ok(idx.pop())
    }

    /// `%l = LO to HI (step S)?` after `static.for`.
    fn static_for(&mut self, c: &mut Cursor<'_>, start: Span) -> R<StaticFor> {
        let var = c.value("the loop variable '%l' after 'static.for'")?;
        c.expect_punct('=', "after the loop variable")?;
        let lo = self.expr(c)?;
        if !c.eat_word("to") {
            return Err(c.expected("'to'"));
        }
        let hi = self.expr(c)?;
        let step = if c.eat_word("step") {
            Some(self.expr(c)?)
        } else {
            None
        };
        Ok(StaticFor {
            var,
            lo,
            hi,
            step,
            span: start.to(c.prev_span()),
        })
    }

    fn type_expr(&mut self, c: &mut Cursor<'_>) -> R<TypeExpr> {
        if c.is_word("tile") {
            let start = c.span();
            c.bump();
            c.expect_punct('<', "after 'tile'")?;
            let shape = self.expr(c)?;
            c.expect_punct(',', "between the tile's shape and its dtype")?;
            let dtype = self.expr(c)?;
            c.expect_punct('>', "to close 'tile<'")?;
            return Ok(TypeExpr::Tile {
                shape,
                dtype,
                span: start.to(c.prev_span()),
            });
        }
        match c.peek() {
            Some(Classified::Word(_)) => Ok(TypeExpr::Scalar(Expr::Word(c.word("a type")?))),
            _ => Err(c.expected("a type (a dtype such as f32, or tile<[dims], dtype>)")),
        }
    }

    fn results(&mut self, c: &mut Cursor<'_>) -> R<Vec<TypeExpr>> {
        let mut out = Vec::new();
        if matches!(c.peek(), Some(Classified::Arrow)) {
            c.bump();
            if let Some(Classified::Group('(', trees)) = c.peek() {
                let s = c.span();
                c.bump();
                let mut rc = inner(trees, s);
                while !rc.at_end() {
                    out.push(self.type_expr(&mut rc)?);
                    if !rc.eat_punct(',') {
                        rc.done("in the result list")?;
                    }
                }
            } else {
                out.push(self.type_expr(c)?);
            }
        }
        Ok(out)
    }

    fn line_of(&self, offset: u32) -> u32 {
        self.lines.line_col(offset).line
    }

    /// A `{}` block: statements split at line breaks.
    fn block(&mut self, trees: &[TokenTree], span: Span) -> R<Block> {
        self.enter(span)?;
        let mut stmts = Vec::new();
        let mut start = 0;
        for i in 1..=trees.len() {
            let split = i == trees.len() || {
                let prev = &trees[i - 1];
                let prev_comma = matches!(classify(prev), Classified::Punct(','));
                let prev_line = self.line_of(span_of(prev).end.saturating_sub(1));
                !prev_comma && self.line_of(span_of(&trees[i]).start) > prev_line
            };
            if split {
                let slice = &trees[start..i];
                let end = span_of(&slice[slice.len() - 1]);
                let mut c = Cursor::new(slice, Span::new(end.end as usize, end.end as usize));
                stmts.push(self.stmt(&mut c)?);
                start = i;
            }
        }
        self.leave();
        Ok(Block { stmts, span })
    }

    fn stmt(&mut self, c: &mut Cursor<'_>) -> R<Stmt> {
        let start = c.span();
        if c.eat_word("yield") || c.eat_word("return") {
            let mut values = Vec::new();
            while !c.at_end() {
                values.push(self.expr(c)?);
                if !c.eat_punct(',') {
                    c.done("after the yielded values")?;
                }
            }
            return Ok(Stmt::Yield {
                values,
                span: start.to(c.prev_span()),
            });
        }
        if let (Some(Classified::Value(_)), Some(Classified::Group('[', _))) =
            (c.peek(), c.peek_at(1))
        {
            if self.stage && matches!(c.peek_at(2), Some(Classified::Punct('='))) {
                let name = c.value("a family member '%name[INDEX]'")?;
                let index = self.family_index(c)?;
                c.expect_punct('=', "after the family member")?;
                let op = self.op(c)?;
                c.done("at the end of the statement (statements are separated by line breaks)")?;
                return Ok(Stmt::Let {
                    results: vec![name],
                    index,
                    span: start.to(c.prev_span()),
                    op,
                });
            }
            if matches!(
                c.peek_at(2),
                Some(Classified::Punct('=' | '+' | '-' | '*' | '/'))
            ) {
                return self.index_stmt(c, start);
            }
        }
        let mut results = Vec::new();
        let assigns = matches!(c.peek(), Some(Classified::Value(_)))
            && matches!(c.peek_at(1), Some(Classified::Punct(',' | '=')));
        if assigns {
            loop {
                results.push(c.value("a result '%name'")?);
                if c.eat_punct('=') {
                    break;
                }
                c.expect_punct(',', "or '=' after a result")?;
            }
        }
        let op = self.op(c)?;
        c.done("at the end of the statement (statements are separated by line breaks)")?;
        Ok(Stmt::Let {
            results,
            index: None,
            span: start.to(c.prev_span()),
            op,
        })
    }

    /// `%out[i, j] = EXPR`: index notation (SSA: the statement defines the new tile `%out`).
    fn index_stmt(&mut self, c: &mut Cursor<'_>, start: Span) -> R<Stmt> {
        let out = c.value("the defined tile '%name'")?;
        let (g, gs) = c.group('[', "the index list '[i, j]'")?;
        let mut indices = Vec::new();
        for e in self.expr_list(g, gs)? {
            match e {
                Expr::Word(n) => indices.push(n),
                other => {
                    return Err(Diagnostic::error(
                        other.span(),
                        "expected an index name (a bare word such as `i`) on the left of index notation",
                    ));
                }
            }
        }
        if indices.is_empty() {
            return Err(Diagnostic::error(
                gs,
                "index notation needs at least one index on the left",
            ));
        }
        if !c.eat_punct('=') {
            if matches!(c.peek(), Some(Classified::Punct('+' | '-' | '*' | '/')))
                && matches!(c.peek_at(1), Some(Classified::Punct('=')))
            {
                return Err(Diagnostic::error(
                    c.span(),
                    format!(
                        "index notation is SSA: a statement defines a new tile, write `%new[...] = %{}[...] + ...`",
                        out.text
                    ),
                ));
            }
            return Err(c.expected("'=' after the index list"));
        }
        let expr = self.expr(c)?;
        c.done("at the end of the statement (statements are separated by line breaks)")?;
        Ok(Stmt::Index {
            out,
            indices,
            expr,
            span: start.to(c.prev_span()),
        })
    }

    fn targs(&mut self, c: &mut Cursor<'_>) -> R<Vec<(Name, Expr)>> {
        let mut out = Vec::new();
        if !c.eat_punct('<') {
            return Ok(out);
        }
        while !c.eat_punct('>') {
            let name = c.word("a template argument 'NAME = value'")?;
            c.expect_punct('=', "after the template argument's name")?;
            let value = self.expr(c)?;
            out.push((name, value));
            if !c.eat_punct(',') {
                c.expect_punct('>', "to close the template arguments")?;
                break;
            }
        }
        Ok(out)
    }

    fn op(&mut self, c: &mut Cursor<'_>) -> R<Op> {
        let start = c.span();
        let name = c.word("an operation")?;
        match name.text.as_str() {
            "if" => {
                let cond = self.expr(c)?;
                let results = self.results(c)?;
                let (t, ts) = c.group('{', "the 'if' block '{ ... }'")?;
                let then_block = self.block(t, ts)?;
                let else_block = if c.eat_word("else") {
                    let (e, es) = c.group('{', "the 'else' block '{ ... }'")?;
                    Some(self.block(e, es)?)
                } else {
                    None
                };
                Ok(Op::If {
                    cond,
                    results,
                    then_block,
                    else_block,
                    span: start.to(c.prev_span()),
                })
            }
            "static.for" => {
                let header = self.static_for(c, start)?;
                let (b, bs) = c.group('{', "the loop body '{ ... }'")?;
                let body = self.block(b, bs)?;
                Ok(Op::StaticFor { header, body })
            }
            "static.match" => {
                let scrutinee = self.expr(c)?;
                let results = self.results(c)?;
                let (g, gs) = c.group('{', "the cases '{ case VALUE { ... } default { ... } }'")?;
                let mut ic = inner(g, gs);
                let mut cases = Vec::new();
                let mut default = None;
                while !ic.at_end() {
                    let at = ic.span();
                    if ic.eat_word("case") {
                        let mut values = vec![self.expr(&mut ic)?];
                        while ic.eat_punct(',') {
                            values.push(self.expr(&mut ic)?);
                        }
                        let (b, bs) = ic.group('{', "the case's block '{ ... }'")?;
                        cases.push((values, self.block(b, bs)?));
                    } else if ic.eat_word("default") {
                        if default.is_some() {
                            return Err(Diagnostic::error(
                                at,
                                "a second `default` in `static.match`",
                            ));
                        }
                        let (b, bs) = ic.group('{', "the default block '{ ... }'")?;
                        default = Some(self.block(b, bs)?);
                    } else {
                        return Err(ic.expected("`case VALUE { ... }` or `default { ... }`"));
                    }
                }
                if cases.is_empty() {
                    return Err(Diagnostic::error(
                        start.to(c.prev_span()),
                        "`static.match` needs at least one `case`",
                    ));
                }
                Ok(Op::Match {
                    scrutinee,
                    results,
                    cases,
                    default,
                    span: start.to(c.prev_span()),
                })
            }
            "for" => {
                let var = c.value("the loop variable '%i'")?;
                c.expect_punct('=', "after the loop variable")?;
                let lo = self.expr(c)?;
                if !c.eat_word("to") {
                    return Err(c.expected("'to'"));
                }
                let hi = self.expr(c)?;
                let step = if c.eat_word("step") {
                    Some(self.expr(c)?)
                } else {
                    None
                };
                let mut iters = Vec::new();
                if c.eat_word("iter") {
                    let (g, gs) = c.group('(', "'(' after 'iter'")?;
                    let mut ic = inner(g, gs);
                    while !ic.at_end() {
                        let n = ic.value("an iteration value '%v = init : type'")?;
                        ic.expect_punct('=', "after the iteration value")?;
                        let init = self.expr(&mut ic)?;
                        ic.expect_punct(':', "and the iteration value's type")?;
                        let ty = self.type_expr(&mut ic)?;
                        iters.push((n, init, ty));
                        if !ic.eat_punct(',') {
                            ic.done("in the iteration values")?;
                        }
                    }
                }
                let results = self.results(c)?;
                let (b, bs) = c.group('{', "the loop body '{ ... }'")?;
                let body = self.block(b, bs)?;
                Ok(Op::For {
                    var,
                    lo,
                    hi,
                    step,
                    iters,
                    results,
                    body,
                    span: start.to(c.prev_span()),
                })
            }
            "call" => {
                let callee = match c.bump() {
                    Some((Classified::Symbol(s), span)) => Expr::Symbol(Name {
                        text: s.to_string(),
                        span,
                    }),
                    Some((Classified::Word(w), span)) => Expr::Word(Name {
                        text: w.to_string(),
                        span,
                    }),
                    _ => {
                        return Err(Diagnostic::error(
                            c.prev_span(),
                            "expected a kfunc '@name' or a func template parameter after 'call'",
                        ));
                    }
                };
                let targs = self.targs(c)?;
                let (a, as_) = c.group('(', "the call's arguments '(...)'")?;
                let args = self.expr_list(a, as_)?;
                Ok(Op::Call {
                    callee,
                    targs,
                    args,
                    span: start.to(c.prev_span()),
                })
            }
            "alloc" => {
                let dtype = Expr::Word(c.word("an element type after 'alloc'")?);
                let (d, ds) = c.group('[', "the dims '[...]' of the allocation")?;
                let dims = self.expr_list(d, ds)?;
                Ok(Op::Alloc {
                    dtype,
                    dims,
                    span: start.to(c.prev_span()),
                })
            }
            "dispatch" => {
                let kernel = match c.bump() {
                    Some((Classified::Symbol(s), span)) => Name {
                        text: s.to_string(),
                        span,
                    },
                    _ => {
                        return Err(Diagnostic::error(
                            c.prev_span(),
                            "expected a kernel '@name' after 'dispatch'",
                        ));
                    }
                };
                let targs = self.targs(c)?;
                let (a, as_) = c.group('(', "the dispatch's buffers '(...)'")?;
                let args = self.expr_list(a, as_)?;
                Ok(Op::Dispatch {
                    kernel,
                    targs,
                    args,
                    span: start.to(c.prev_span()),
                })
            }
            _ => {
                let mut operands = Vec::new();
                let mut annotation = None;
                while !c.at_end() {
                    if c.eat_punct(':') {
                        annotation = Some(self.type_expr(c)?);
                        break;
                    }
                    operands.push(self.expr(c)?);
                    if !c.eat_punct(',') {
                        if c.eat_punct(':') {
                            annotation = Some(self.type_expr(c)?);
                        }
                        break;
                    }
                }
                Ok(Op::Simple {
                    name,
                    operands,
                    annotation,
                    span: start.to(c.prev_span()),
                })
            }
        }
    }

    fn expr_list(&mut self, trees: &[TokenTree], span: Span) -> R<Vec<Expr>> {
        let mut c = inner(trees, span);
        let mut out = Vec::new();
        while !c.at_end() {
            out.push(self.expr(&mut c)?);
            if !c.eat_punct(',') {
                c.done("in the list (expected ',')")?;
            }
        }
        Ok(out)
    }

    /// `term (('+' | '-') term)*`
    fn expr(&mut self, c: &mut Cursor<'_>) -> R<Expr> {
        self.enter(c.span())?;
        let r = self.expr_inner(c);
        self.leave();
        r
    }

    fn expr_inner(&mut self, c: &mut Cursor<'_>) -> R<Expr> {
        let mut lhs = self.term(c)?;
        let mut chain = 0;
        loop {
            let (op, rhs) = match c.peek() {
                Some(Classified::Punct(op @ ('+' | '-'))) => {
                    c.bump();
                    (op, self.term(c)?)
                }
                // why: `N -1` lexes as `N` and the literal `-1`; after an operand it can only be a subtraction
                Some(Classified::Int(v)) if v < 0 => {
                    let s = c.span();
                    c.bump();
                    let pos = v
                        .checked_neg()
                        .ok_or_else(|| Diagnostic::error(s, "integer out of range"))?;
                    ('-', Expr::Int(pos, s))
                }
                Some(Classified::Float(v)) if v < 0.0 => {
                    let s = c.span();
                    c.bump();
                    ('-', Expr::Float(-v, s))
                }
                _ => break,
            };
            let span = lhs.span().to(rhs.span());
            lhs = Expr::Binary {
                op,
                lhs: Box::new(lhs),
                rhs: Box::new(rhs),
                span,
            };
            chain += 1;
            self.chain_limit(chain, span)?;
        }
        Ok(lhs)
    }

    /// Left-leaning operator chains are built in a loop but walked recursively later: bound their height too.
    fn chain_limit(&self, chain: u32, span: Span) -> R<()> {
        if self.depth + chain > MAX_DEPTH {
            return Err(Diagnostic::error(
                span,
                format!("expression too deep (more than {MAX_DEPTH} levels)"),
            ));
        }
        Ok(())
    }

    fn term(&mut self, c: &mut Cursor<'_>) -> R<Expr> {
        let mut lhs = self.unary(c)?;
        let mut chain = 0;
        while let Some(Classified::Punct(op @ ('*' | '/' | '%'))) = c.peek() {
            c.bump();
            let rhs = self.unary(c)?;
            let span = lhs.span().to(rhs.span());
            lhs = Expr::Binary {
                op,
                lhs: Box::new(lhs),
                rhs: Box::new(rhs),
                span,
            };
            chain += 1;
            self.chain_limit(chain, span)?;
        }
        Ok(lhs)
    }

    fn unary(&mut self, c: &mut Cursor<'_>) -> R<Expr> {
        if c.is_punct('-') {
            let s = c.span();
            c.bump();
            self.enter(s)?;
            let inner = self.unary(c);
            self.leave();
            let inner = inner?;
            let span = s.to(inner.span());
            return Ok(Expr::Neg(Box::new(inner), span));
        }
        self.primary(c)
    }

    fn primary(&mut self, c: &mut Cursor<'_>) -> R<Expr> {
        let Some((t, span)) = c.bump() else {
            return Err(c.expected("an operand"));
        };
        Ok(match t {
            Classified::Value(v) => {
                let name = Name {
                    text: v.to_string(),
                    span,
                };
                if let Some(Classified::Group('[', trees)) = c.peek() {
                    let gs = c.span();
                    c.bump();
                    let indices = self.expr_list(trees, gs)?;
                    Expr::Index {
                        buf: name,
                        indices,
                        span: span.to(gs),
                    }
                } else {
                    Expr::Value(name)
                }
            }
            Classified::Int(v) => Expr::Int(v, span),
            Classified::Float(v) => Expr::Float(v, span),
            Classified::Str(s) => Expr::Str(s, span),
            Classified::Word("true") => Expr::Bool(true, span),
            Classified::Word("false") => Expr::Bool(false, span),
            Classified::Word(w) => {
                let name = Name {
                    text: w.to_string(),
                    span,
                };
                if let Some(Classified::Group('(', trees)) = c.peek() {
                    let gs = c.span();
                    c.bump();
                    let args = self.expr_list(trees, gs)?;
                    Expr::Call {
                        name,
                        args,
                        span: span.to(gs),
                    }
                } else {
                    Expr::Word(name)
                }
            }
            Classified::Symbol(s) => Expr::Symbol(Name {
                text: s.to_string(),
                span,
            }),
            Classified::Group('[', trees) => Expr::List(self.expr_list(trees, span)?, span),
            Classified::Group('(', trees) => {
                let mut ic = inner(trees, span);
                let e = self.expr(&mut ic)?;
                ic.done("inside the parentheses")?;
                e
            }
            _ => {
                c.pos -= 1;
                return Err(c.expected("an operand"));
            }
        })
    }
}

/// Parses a checkpoint key: `{%var}` and `{NAME}` are holes, `{{` and `}}` literal braces.
fn key_template(key: &str, span: Span) -> R<KeyTemplate> {
    let mut parts = Vec::new();
    let mut text = String::new();
    let mut cs = key.chars().peekable();
    while let Some(ch) = cs.next() {
        match ch {
            '{' if cs.peek() == Some(&'{') => {
                cs.next();
                text.push('{');
            }
            '}' if cs.peek() == Some(&'}') => {
                cs.next();
                text.push('}');
            }
            '}' => {
                return Err(Diagnostic::error(
                    span,
                    "a lone `}` in the checkpoint key (write `}}` for a literal brace)",
                ));
            }
            '{' => {
                let mut hole = String::new();
                loop {
                    match cs.next() {
                        Some('}') => break,
                        Some(c) => hole.push(c),
                        None => {
                            return Err(Diagnostic::error(
                                span,
                                "an unclosed `{` in the checkpoint key (write `{{` for a literal brace)",
                            ));
                        }
                    }
                }
                let word = |w: &str| {
                    w.chars()
                        .next()
                        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                        && w.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                };
                let part = match hole.strip_prefix('%') {
                    Some(v)
                        if !v.is_empty()
                            && v.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') =>
                    {
                        KeyPart::Value(v.to_string())
                    }
                    None if word(&hole) => KeyPart::Word(hole),
                    _ => {
                        let shown: String = hole.chars().take(32).collect();
                        return Err(Diagnostic::error(
                            span,
                            format!(
                                "`{{{shown}}}` in a checkpoint key: a hole names a compile-time integer, `{{%l}}` (a `static.for` variable) or `{{N}}` (a template parameter)"
                            ),
                        ));
                    }
                };
                if !text.is_empty() {
                    parts.push(KeyPart::Text(std::mem::take(&mut text)));
                }
                parts.push(part);
            }
            c => text.push(c),
        }
    }
    if !text.is_empty() || parts.is_empty() {
        parts.push(KeyPart::Text(text));
    }
    Ok(KeyTemplate { parts, span })
}
