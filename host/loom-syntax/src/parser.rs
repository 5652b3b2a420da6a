//! Recursive-descent parser: tokens -> [`ast::Module`] plus diagnostics; never fails, never panics.
//!
//! Error handling follows three rules:
//! - Every loop consumes at least one token per iteration or ends, so parsing is linear and terminates.
//! - After an error the parser resynchronises: lists skip to their `,` or closing bracket, statements skip to
//!   the next token that starts a line and can start a statement (or the block's `}`), items skip to the next
//!   item keyword (or the module's `}`). Bracketed groups are skipped whole.
//! - A second diagnostic at the same token as the previous one is dropped, so one mistake gives one message.
//!
//! Recursion (blocks, nested operands, groups, types, const expressions) is bounded by [`MAX_DEPTH`]; deeper
//! input gets one "nesting too deep" diagnostic and the deep part is skipped iteratively.
//!
//! Newlines are insignificant except in one place: an operation with no operands followed by a statement on
//! the next line (`%l = list.empty` then `trap "x"`) is ambiguous, so a *word* on a later line than the
//! operation name is read as the next statement rather than as the first operand, and `%a, %b = ...` is
//! always an assignment.

use crate::ast::{
    self, Block, Callee, Const, ConstExpr, DeviceItem, DeviceKind, Expr, Func, FuncDecl, IterArg,
    Name, Operand, Param, Record, Stmt, TArg, TParam, TParamKind, TokenTree, Type,
};
use crate::lexer::{self, TokKind, Token};
use crate::{Diagnostic, Span};

/// The deepest nesting of blocks, operands, groups, types and expressions the parser accepts (a block
/// counts as [`BLOCK_COST`] levels).
pub const MAX_DEPTH: u32 = 256;

/// What one nested block takes of [`MAX_DEPTH`]: a block is five parser frames deep (block, statement,
/// expression, `if`/`for`/`while`, block), the other constructs one or two, and the limit exists to keep
/// the stack small (the worst case fits in 1 MiB in a debug build), so blocks nest at most 64 deep.
pub(crate) const BLOCK_COST: u32 = 4;

/// Diagnostics beyond this many are summarised in one final diagnostic (garbage input would otherwise give
/// one per token).
pub(crate) const MAX_DIAGNOSTICS: usize = 500;

/// Words that start an item; statement recovery and device bodies stop at them.
const ITEM_KEYWORDS: &[&str] = &[
    "func",
    "func.decl",
    "export",
    "type",
    "const",
    "kernel",
    "kfunc",
    "stage",
];

/// Words that start a statement form of their own and so never are a first operand.
const STMT_KEYWORDS: &[&str] = &["return", "yield", "condition", "call", "if", "for", "while"];

/// Parses one file.
pub fn parse(text: &str) -> (ast::Module, Vec<Diagnostic>) {
    let mut diags = Vec::new();
    let toks = lexer::lex(text, &mut diags);
    let lex_diags = diags.len();
    let mut p = Parser {
        toks,
        pos: 0,
        diags,
        lex_diags,
        depth: 0,
        split_neg: false,
        too_deep_reported: false,
    };
    let module = p.module(text.len());
    let mut diags = p.diags;
    // why: lexer and parser diagnostics interleave; report them in file order (stable for equal starts)
    diags.sort_by_key(|d| d.span.start);
    if diags.len() > MAX_DIAGNOSTICS {
        let rest = diags.len() - MAX_DIAGNOSTICS;
        let span = diags[MAX_DIAGNOSTICS].span;
        diags.truncate(MAX_DIAGNOSTICS);
        diags.push(Diagnostic::error(
            span,
            format!("too many errors: {rest} more not shown"),
        ));
    }
    (module, diags)
}

struct Parser<'a> {
    /// Always ends with an `Eof` token.
    toks: Vec<Token<'a>>,
    pos: usize,
    diags: Vec<Diagnostic>,
    /// How many of `diags` came from the lexer (the same-token dedup only looks at parser diagnostics).
    lex_diags: usize,
    depth: u32,
    too_deep_reported: bool,
    /// Set when the current token is a negative literal whose `-` was taken as a binary minus (`N -1`).
    split_neg: bool,
}

fn name_of(t: &Token<'_>) -> Name {
    Name {
        text: t.name().to_string(),
        span: t.span,
    }
}

fn missing_name(span: Span) -> Name {
    Name {
        text: String::new(),
        span,
    }
}

fn tree_span(t: &TokenTree) -> Span {
    match t {
        TokenTree::Token { span, .. } | TokenTree::Group { span, .. } => *span,
    }
}

/// A token tree's first token, for messages.
fn tree_text(t: &TokenTree) -> String {
    match t {
        TokenTree::Token { text, .. } => text.chars().take(32).collect(),
        TokenTree::Group { open, .. } => open.to_string(),
    }
}

fn closer_of(open: char) -> char {
    match open {
        '(' => ')',
        '[' => ']',
        _ => '}',
    }
}

impl<'a> Parser<'a> {
    // ---- token access -------------------------------------------------------------------------------------

    fn tok(&self) -> &Token<'a> {
        let last = self.toks.len().saturating_sub(1);
        &self.toks[self.pos.min(last)]
    }

    fn nth(&self, n: usize) -> &Token<'a> {
        let last = self.toks.len().saturating_sub(1);
        &self.toks[self.pos.saturating_add(n).min(last)]
    }

    fn at_eof(&self) -> bool {
        self.tok().kind == TokKind::Eof
    }

    fn at_punct(&self, c: char) -> bool {
        self.tok().is_punct(c)
    }

    fn at_word(&self, w: &str) -> bool {
        self.tok().is_word(w)
    }

    fn bump(&mut self) -> Token<'a> {
        let t = self.tok().clone();
        if t.kind != TokKind::Eof {
            self.pos += 1;
        }
        t
    }

    fn eat_punct(&mut self, c: char) -> bool {
        if self.at_punct(c) {
            self.bump();
            true
        } else {
            false
        }
    }

    /// End of the previous token (for node spans).
    fn prev_end(&self) -> Span {
        match self.pos.checked_sub(1).and_then(|i| self.toks.get(i)) {
            Some(t) => t.span,
            None => self.tok().span,
        }
    }

    fn span_from(&self, start: Span) -> Span {
        let end = self.prev_end();
        if end.end < start.start {
            start
        } else {
            start.to(end)
        }
    }

    /// True when the current token is the first on its line.
    fn at_line_start(&self) -> bool {
        match self.pos.checked_sub(1).and_then(|i| self.toks.get(i)) {
            Some(prev) => prev.line < self.tok().line,
            None => true,
        }
    }

    fn at_item_keyword(&self) -> bool {
        let t = self.tok();
        t.kind == TokKind::Word && ITEM_KEYWORDS.contains(&t.text)
    }

    // ---- diagnostics --------------------------------------------------------------------------------------

    fn error_at(&mut self, span: Span, msg: impl Into<String>) {
        // why: after one mistake, enclosing constructs often complain about the same token again
        if self.diags.len() > self.lex_diags
            && self
                .diags
                .last()
                .is_some_and(|d| d.span.start == span.start)
        {
            return;
        }
        self.diags.push(Diagnostic::error(span, msg));
    }

    /// "expected {what}, found {current token}" on the current token.
    fn expected(&mut self, what: &str) {
        let t = self.tok();
        // why: the lexer already reported this token
        let lex_error = matches!(
            t.kind,
            TokKind::Unknown
                | TokKind::Int(None)
                | TokKind::Float(None)
                | TokKind::Str { ok: false, .. }
        );
        if lex_error {
            return;
        }
        let msg = format!("expected {what}, found {}", t.describe());
        let span = t.span;
        self.error_at(span, msg);
    }

    fn expect_punct(&mut self, c: char, context: &str) -> Option<()> {
        if self.eat_punct(c) {
            Some(())
        } else {
            self.expected(&format!("'{c}' {context}"));
            None
        }
    }

    /// Enters one nesting level; on overflow reports, skips the construct at the current token, and
    /// returns false (the caller then returns an `Error` node without calling `leave`).
    fn enter(&mut self) -> bool {
        self.enter_cost(1)
    }

    /// [`Parser::enter`] for a construct that takes `cost` units of the nesting budget.
    fn enter_cost(&mut self, cost: u32) -> bool {
        if self.depth + cost > MAX_DEPTH {
            let span = self.tok().span;
            self.too_deep(span);
            self.skip_tree();
            return false;
        }
        self.depth += cost;
        true
    }

    /// Reports excessive nesting, once per file (the skipped remainder would repeat it at every level).
    fn too_deep(&mut self, span: Span) {
        if !self.too_deep_reported {
            self.too_deep_reported = true;
            self.error_at(
                span,
                format!("nesting too deep (more than {MAX_DEPTH} levels of blocks, groups, operands or operators)"),
            );
        }
    }

    fn leave(&mut self) {
        self.leave_cost(1);
    }

    fn leave_cost(&mut self, cost: u32) {
        self.depth = self.depth.saturating_sub(cost);
    }

    // ---- skipping -----------------------------------------------------------------------------------------

    /// Skips one token, or a whole bracketed group when at an opener (iteratively; a `}` closes the
    /// innermost `{` even across unclosed `(`/`[`; a `}` that matches no `{` of the group ends the skip
    /// without being consumed). At `Eof` does nothing.
    fn skip_tree(&mut self) {
        let open = match self.tok().kind {
            TokKind::Punct(c @ ('(' | '[' | '{')) => c,
            TokKind::Eof => return,
            _ => {
                self.bump();
                return;
            }
        };
        let mut stack = vec![open];
        self.bump();
        while let Some(&top) = stack.last() {
            match self.tok().kind {
                TokKind::Eof => return,
                TokKind::Punct(c @ ('(' | '[' | '{')) => stack.push(c),
                TokKind::Punct('}') => {
                    if !stack.contains(&'{') {
                        return;
                    }
                    while let Some(o) = stack.pop() {
                        if o == '{' {
                            break;
                        }
                    }
                }
                TokKind::Punct(c @ (')' | ']')) if closer_of(top) == c => {
                    stack.pop();
                }
                _ => {}
            }
            self.bump();
        }
    }

    /// After a broken statement that began at token index `start`: skip up to the block's `}`, the end of
    /// file, or a token that starts a line and can start a statement (never stopping where the statement
    /// began, so the parse moves on).
    fn recover_stmt(&mut self, start: usize) {
        while !self.at_eof() && !self.at_punct('}') {
            let starts = matches!(self.tok().kind, TokKind::Value | TokKind::Word);
            if self.pos > start && starts && self.at_line_start() {
                return;
            }
            self.skip_tree();
        }
    }

    /// At a line start, at what looks like the next statement: `%a, %b = ...`, or a word not followed by
    /// `(`, `,` or `)` (which would make it an operand). Ends operand lists left open.
    fn at_new_stmt(&self) -> bool {
        if !self.at_line_start() {
            return false;
        }
        match self.tok().kind {
            TokKind::Value => self.at_assignment(),
            TokKind::Word => {
                let next = self.nth(1);
                !(next.is_punct('(') || next.is_punct(',') || next.is_punct(')'))
            }
            _ => false,
        }
    }

    /// After a broken item: skip to the next item keyword, the module's `}`, or the end of file.
    fn recover_item(&mut self) {
        while !self.at_eof() && !self.at_punct('}') && !self.at_item_keyword() {
            self.skip_tree();
        }
    }

    /// Parses `elem (',' elem)* ','? close` after the opener was consumed. `what` names the list in
    /// messages. `follow` says whether the parser is at what comes after the list (so a missing closer is
    /// reported once and parsing goes on from there); `{`, a stray `}`, the next item and the end of file
    /// always end a list.
    fn list<T>(
        &mut self,
        close: char,
        what: &str,
        follow: fn(&Self) -> bool,
        mut elem: impl FnMut(&mut Self) -> Option<T>,
    ) -> Vec<T> {
        let mut out = Vec::new();
        loop {
            if self.eat_punct(close) {
                return out;
            }
            if self.list_stop(close) || follow(self) {
                self.expected(&format!("'{close}' to close the {what}"));
                return out;
            }
            let before = self.diags.len();
            let start = self.pos;
            let parsed = elem(self);
            let failed = parsed.is_none() || self.diags.len() > before;
            out.extend(parsed);
            if self.eat_punct(',') {
                continue;
            }
            if self.eat_punct(close) {
                return out;
            }
            if !failed {
                if self.list_stop(close) || follow(self) {
                    self.expected(&format!("'{close}' to close the {what}"));
                    return out;
                }
                self.expected(&format!("',' or '{close}' in the {what}"));
            }
            // resynchronise on ',' or the closer of this list
            let mut moved = self.pos > start;
            loop {
                if self.list_stop(close) || (moved && follow(self)) {
                    return out;
                }
                if self.eat_punct(close) {
                    return out;
                }
                if self.at_punct(',') {
                    break;
                }
                self.skip_tree();
                moved = true;
            }
            self.bump();
        }
    }

    /// Tokens that end every list: the end of file, `{`, a `}` that is not the list's own closer, the
    /// next item.
    fn list_stop(&self, close: char) -> bool {
        self.at_eof()
            || self.at_punct('{')
            || (close != '}' && self.at_punct('}'))
            || self.at_item_start()
    }

    // ---- module and items ---------------------------------------------------------------------------------

    fn module(&mut self, len: usize) -> ast::Module {
        let mut name = None;
        let mut braced = false;
        if self.at_word("module") {
            self.bump();
            if matches!(self.tok().kind, TokKind::Symbol | TokKind::Word) {
                name = Some(self.item_name("module"));
            } else {
                self.expected("the module name (a symbol such as @my.module) after 'module'");
            }
            if self.eat_punct('{') {
                braced = true;
            } else {
                self.expected("'{' to open the module body");
            }
        } else {
            self.expected("'module @name {' at the start of the file");
        }
        let mut items = Vec::new();
        loop {
            if self.at_eof() {
                if braced {
                    let what = match &name {
                        Some(n) => format!("'}}' to close module @{}", n.text),
                        None => "'}' to close the module".to_string(),
                    };
                    self.expected(&what);
                }
                break;
            }
            if self.at_punct('}') {
                if braced {
                    self.bump();
                    if !self.at_eof() {
                        self.expected("end of file after the module's closing '}'");
                    }
                    break;
                }
                self.expected("an item (func, func.decl, type, const, kernel, kfunc or stage)");
                self.bump();
                continue;
            }
            let before = self.pos;
            if let Some(item) = self.item() {
                items.push(item);
            }
            if self.pos == before {
                // why: guarantees progress whatever an item parser did
                self.skip_tree();
            }
        }
        ast::Module {
            name,
            items,
            span: Span::new(0, len),
        }
    }

    fn item(&mut self) -> Option<ast::Item> {
        let start = self.tok().span;
        let exported = self.at_word("export");
        if exported {
            self.bump();
        }
        let t = self.tok();
        let word = if t.kind == TokKind::Word { t.text } else { "" };
        match word {
            "func" => self.func(exported, start).map(ast::Item::Func),
            "func.decl" => {
                if exported {
                    self.error_at(
                        start,
                        "'export' is not allowed on 'func.decl' (a declaration refers to a function defined elsewhere)",
                    );
                }
                self.decl(start).map(ast::Item::Decl)
            }
            "type" => self.record(exported, start).map(ast::Item::Record),
            "const" => self.constant(exported, start).map(ast::Item::Const),
            "kernel" | "kfunc" | "stage" => self.device(exported, start).map(ast::Item::Device),
            _ => {
                if exported {
                    self.expected(
                        "'func', 'type', 'const', 'kernel', 'kfunc' or 'stage' after 'export'",
                    );
                } else {
                    self.expected("an item (func, func.decl, type, const, kernel, kfunc or stage)");
                }
                self.recover_item();
                None
            }
        }
    }

    /// The item's `@name`. A bare word is taken as the name (with a diagnostic) so later messages can
    /// still use it.
    fn item_name(&mut self, what: &str) -> Name {
        let t = self.tok().clone();
        match t.kind {
            TokKind::Symbol => {
                self.bump();
                name_of(&t)
            }
            TokKind::Word => {
                self.error_at(
                    t.span,
                    format!(
                        "expected the {what} name as a symbol, found {}; write @{}",
                        t.describe(),
                        t.text
                    ),
                );
                self.bump();
                name_of(&t)
            }
            _ => {
                self.expected(&format!("the {what} name (a symbol such as @name)"));
                missing_name(t.span)
            }
        }
    }

    fn func(&mut self, exported: bool, start: Span) -> Option<Func> {
        self.bump(); // func
        let name = self.item_name("function");
        let tparams = self.tparams_opt();
        let mut params = Vec::new();
        if self.eat_punct('(') {
            params = self.list(
                ')',
                "parameter list",
                |p| p.tok().kind == TokKind::Arrow,
                Self::param,
            );
        } else {
            self.expected(&format!(
                "'(' to start the parameter list of @{}",
                name.text
            ));
        }
        let results = self.results();
        if !self.at_punct('{') {
            self.expected(&format!("'{{' to start the body of @{}", name.text));
            // why: junk in the header should not cost the whole body: look for its '{'
            while !self.at_eof()
                && !self.at_punct('{')
                && !self.at_punct('}')
                && !self.at_item_start()
            {
                self.skip_tree();
            }
            if !self.at_punct('{') {
                return None;
            }
        }
        let body = self.block();
        Some(Func {
            exported,
            name,
            tparams,
            params,
            results,
            body,
            span: self.span_from(start),
        })
    }

    fn param(&mut self) -> Option<Param> {
        let t = self.tok().clone();
        if t.kind != TokKind::Value {
            self.expected("a parameter (%name: type)");
            return None;
        }
        self.bump();
        let name = name_of(&t);
        self.expect_punct(':', &format!("after parameter %{}", name.text))?;
        let ty = self.ty();
        Some(Param { name, ty })
    }

    fn decl(&mut self, start: Span) -> Option<FuncDecl> {
        self.bump(); // func.decl
        let name = self.item_name("function");
        let tparams = self.tparams_opt();
        let mut params = Vec::new();
        if self.eat_punct('(') {
            params = self.list(
                ')',
                "parameter type list",
                |p| p.tok().kind == TokKind::Arrow || p.at_word("import"),
                |p| Some(p.ty()),
            );
        } else {
            self.expected(&format!(
                "'(' to start the parameter types of @{}",
                name.text
            ));
        }
        let results = self.results();
        let mut import = None;
        if self.at_word("import") {
            self.bump();
            if self.expect_punct('(', "after 'import'").is_some() {
                let t = self.tok().clone();
                if let TokKind::Str { value, ok } = &t.kind {
                    self.bump();
                    import = Some(Name {
                        text: value.clone(),
                        span: t.span,
                    });
                    // an unterminated string already explains a missing ')'
                    if *ok {
                        self.expect_punct(')', "to close 'import(...)'");
                    } else {
                        self.eat_punct(')');
                    }
                } else {
                    self.expected("the native module name as a string, as in import(\"runner\")");
                    import = Some(missing_name(t.span));
                    self.skip_until_close(')');
                }
            }
        }
        Some(FuncDecl {
            name,
            tparams,
            params,
            results,
            import,
            span: self.span_from(start),
        })
    }

    /// Skips to and over `close` on this nesting level, stopping early at `{`, `}` or the end of file.
    fn skip_until_close(&mut self, close: char) {
        while !self.at_eof() && !self.at_punct('{') && !self.at_punct('}') {
            if self.eat_punct(close) {
                return;
            }
            self.skip_tree();
        }
    }

    fn record(&mut self, exported: bool, start: Span) -> Option<Record> {
        self.bump(); // type
        let name = self.item_name("record");
        let ok = self
            .expect_punct('=', &format!("after the type name @{}", name.text))
            .is_some();
        if !ok {
            self.recover_item();
            return None;
        }
        if self.at_word("record") {
            self.bump();
        } else {
            self.expected("'record' (the only kind of type definition)");
            self.recover_item();
            return None;
        }
        if !self.eat_punct('{') {
            self.expected("'{' to start the record fields");
            self.recover_item();
            return None;
        }
        let fields = self.list('}', "record fields", |_| false, Self::field);
        Some(Record {
            exported,
            name,
            fields,
            span: self.span_from(start),
        })
    }

    fn field(&mut self) -> Option<(Name, Type)> {
        let t = self.tok().clone();
        if t.kind != TokKind::Word {
            self.expected("a field (name: type)");
            return None;
        }
        self.bump();
        self.expect_punct(':', &format!("after field name '{}'", t.text))?;
        let ty = self.ty();
        let scalar = matches!(
            ty,
            Type::I1(_)
                | Type::I32(_)
                | Type::I64(_)
                | Type::F32(_)
                | Type::F64(_)
                | Type::Error(_)
        );
        if !scalar {
            self.error_at(
                ty.span(),
                "record fields must have a scalar type (i1, i32, i64, f32 or f64)",
            );
        }
        Some((name_of(&t), ty))
    }

    fn constant(&mut self, exported: bool, start: Span) -> Option<Const> {
        self.bump(); // const
        let name = self.item_name("constant");
        if self
            .expect_punct(':', &format!("and the type of constant @{}", name.text))
            .is_none()
        {
            self.recover_item();
            return None;
        }
        let ty = self.ty();
        if self
            .expect_punct('=', &format!("and the value of constant @{}", name.text))
            .is_none()
        {
            self.recover_item();
            return None;
        }
        let value = self.const_expr();
        Some(Const {
            exported,
            name,
            ty,
            value,
            span: self.span_from(start),
        })
    }

    fn device(&mut self, exported: bool, start: Span) -> Option<DeviceItem> {
        let kw = self.bump();
        let kind = match kw.text {
            "kernel" => DeviceKind::Kernel,
            "kfunc" => DeviceKind::Kfunc,
            _ => DeviceKind::Stage,
        };
        let name = self.item_name(kw.text);
        let tparams = self.tparams_opt();
        let mut tokens = Vec::new();
        // index just after the last top-level `{}` group: the body ends there
        let mut body_end: Option<usize> = None;
        loop {
            let t = self.tok().clone();
            let at_end = t.kind == TokKind::Eof || t.is_punct('}');
            if at_end || (body_end.is_some() && self.at_item_start()) {
                break;
            }
            if let TokKind::Punct(c @ (')' | ']')) = t.kind {
                self.error_at(t.span, format!("unmatched '{c}'"));
                self.bump();
                continue;
            }
            let tree = self.token_tree();
            let body = matches!(tree, TokenTree::Group { open: '{', .. });
            tokens.push(tree);
            if body {
                body_end = Some(tokens.len());
                // why: `params @x(...) { ... }` blocks in stage headers are `{}` groups too; the body is the
                // one followed by the next item or the module's end
                if self.at_item_keyword() || self.at_punct('}') || self.at_eof() {
                    break;
                }
            }
        }
        match body_end {
            None => self.expected(&format!(
                "the body '{{ ... }}' of {} @{}",
                kw.text, name.text
            )),
            Some(n) if n < tokens.len() => {
                let span = tokens.get(n).map_or(start, tree_span);
                let found = tokens.get(n).map_or(String::new(), tree_text);
                self.error_at(
                    span,
                    format!(
                        "expected the next item or '}}' after the body of {} @{}, found '{found}'",
                        kw.text, name.text
                    ),
                );
                tokens.truncate(n);
            }
            Some(_) => {}
        }
        let span = tokens
            .last()
            .map_or(self.span_from(start), |t| start.to(tree_span(t)));
        Some(DeviceItem {
            exported,
            kind,
            name,
            tparams,
            tokens,
            span,
        })
    }

    /// One token tree, built iteratively (so deep input cannot overflow the stack); groups deeper than
    /// [`MAX_DEPTH`] are reported and skipped.
    fn token_tree(&mut self) -> TokenTree {
        let t = self.bump();
        let TokKind::Punct(open @ ('(' | '[' | '{')) = t.kind else {
            return TokenTree::Token {
                text: t.text.to_string(),
                span: t.span,
            };
        };
        // (opener, trees so far, opener's span, opener's 0-based line)
        let mut stack: Vec<(char, Vec<TokenTree>, Span, u32)> =
            vec![(open, Vec::new(), t.span, t.line)];
        loop {
            let t = self.tok().clone();
            let closer = match t.kind {
                TokKind::Punct(c @ (')' | ']' | '}')) => Some(c),
                TokKind::Eof => Some('\0'),
                _ => None,
            };
            let finished = if let TokKind::Punct(c @ ('(' | '[' | '{')) = t.kind {
                if self.depth as usize + stack.len() >= MAX_DEPTH as usize {
                    self.too_deep(t.span);
                    self.skip_tree();
                } else {
                    self.bump();
                    stack.push((c, Vec::new(), t.span, t.line));
                }
                None
            } else if let Some(c) = closer {
                let top_open = stack.last().map_or('{', |f| f.0);
                if c != '\0' && closer_of(top_open) == c {
                    self.bump();
                    stack.pop().map(|(o, trees, s, _)| TokenTree::Group {
                        open: o,
                        trees,
                        span: s.to(t.span),
                    })
                } else if c == '\0' || c == '}' || stack.iter().any(|f| closer_of(f.0) == c) {
                    // the innermost group is unclosed: close it here, leaving the token for an outer group
                    if let Some((o, _, _, line)) = stack.last() {
                        let msg = format!(
                            "expected '{}' to close the '{}' opened on line {}, found {}",
                            closer_of(*o),
                            o,
                            line + 1,
                            t.describe()
                        );
                        self.error_at(t.span, msg);
                    }
                    let prev = self.prev_end();
                    stack.pop().map(|(o, trees, s, _)| TokenTree::Group {
                        open: o,
                        trees,
                        span: s.to(prev),
                    })
                } else {
                    self.error_at(t.span, format!("unmatched '{c}'"));
                    self.bump();
                    None
                }
            } else {
                self.bump();
                Some(TokenTree::Token {
                    text: t.text.to_string(),
                    span: t.span,
                })
            };
            if let Some(tree) = finished {
                match stack.last_mut() {
                    Some(top) => top.1.push(tree),
                    None => return tree,
                }
            }
        }
    }

    // ---- templates and types ------------------------------------------------------------------------------

    fn tparams_opt(&mut self) -> Vec<TParam> {
        if !self.eat_punct('<') {
            return Vec::new();
        }
        self.list(
            '>',
            "template parameter list",
            |p| p.at_punct('('),
            Self::tparam,
        )
    }

    fn tparam(&mut self) -> Option<TParam> {
        let t = self.tok().clone();
        if t.kind != TokKind::Word {
            self.expected("a template parameter (NAME: kind)");
            return None;
        }
        self.bump();
        let name = name_of(&t);
        self.expect_punct(
            ':',
            &format!("and the kind of template parameter {}", t.text),
        )?;
        let kind = self.tkind()?;
        let default = if self.eat_punct('=') {
            Some(self.const_expr())
        } else {
            None
        };
        Some(TParam {
            name,
            kind,
            default,
            span: self.span_from(t.span),
        })
    }

    fn tkind(&mut self) -> Option<TParamKind> {
        let t = self.tok().clone();
        let kind = match (&t.kind, t.text) {
            (TokKind::Word, "i64") => TParamKind::I64,
            (TokKind::Word, "bool") => TParamKind::Bool,
            (TokKind::Word, "str") => TParamKind::Str,
            (TokKind::Word, "dtype") => TParamKind::DType,
            (TokKind::Word, "shape") => TParamKind::Shape,
            (TokKind::Word, "func") => {
                self.bump();
                self.expect_punct('(', "after 'func' in a template parameter kind")?;
                let params = self.list(
                    ')',
                    "parameter type list",
                    |p| p.tok().kind == TokKind::Arrow,
                    |p| Some(p.ty()),
                );
                let results = self.results();
                return Some(TParamKind::Func { params, results });
            }
            _ => {
                self.expected(
                    "a template parameter kind (i64, bool, str, dtype, shape or func(...) -> ...)",
                );
                if t.kind == TokKind::Word {
                    self.bump();
                }
                return None;
            }
        };
        self.bump();
        Some(kind)
    }

    /// `-> T` or `-> (T, ...)`; empty when there is no arrow.
    fn results(&mut self) -> Vec<Type> {
        if self.tok().kind != TokKind::Arrow {
            return Vec::new();
        }
        self.bump();
        if self.eat_punct('(') {
            self.list(')', "result type list", |_| false, |p| Some(p.ty()))
        } else {
            vec![self.ty()]
        }
    }

    fn ty(&mut self) -> Type {
        let t = self.tok().clone();
        let simple = match (&t.kind, t.text) {
            (TokKind::Word, "i1") => Some(Type::I1(t.span)),
            (TokKind::Word, "i32") => Some(Type::I32(t.span)),
            (TokKind::Word, "i64") => Some(Type::I64(t.span)),
            (TokKind::Word, "f32") => Some(Type::F32(t.span)),
            (TokKind::Word, "f64") => Some(Type::F64(t.span)),
            (TokKind::Word, "str") => Some(Type::Str(t.span)),
            (TokKind::Word, "buffer") => Some(Type::Buffer(t.span)),
            (TokKind::RefType, _) => Some(Type::Ref {
                name: name_of(&t),
                nullable: false,
                span: t.span,
            }),
            _ => None,
        };
        if let Some(ty) = simple {
            self.bump();
            return ty;
        }
        match t.kind {
            TokKind::Word if t.text == "list" => {
                if !self.enter() {
                    return Type::Error(t.span);
                }
                self.bump();
                let ty = if self.expect_punct('<', "after 'list'").is_some() {
                    let inner = self.ty();
                    if self.eat_punct('>') {
                        Type::List(Box::new(inner), self.span_from(t.span))
                    } else {
                        self.expected("'>' to close 'list<...>'");
                        Type::Error(self.span_from(t.span))
                    }
                } else {
                    Type::Error(t.span)
                };
                self.leave();
                ty
            }
            TokKind::Punct('?') => {
                self.bump();
                let r = self.tok().clone();
                if r.kind == TokKind::RefType {
                    self.bump();
                    Type::Ref {
                        name: name_of(&r),
                        nullable: true,
                        span: t.span.to(r.span),
                    }
                } else {
                    self.expected("a reference type after '?' (only references are nullable, as in ?!hal.fence)");
                    if r.kind == TokKind::Word {
                        self.bump();
                        return Type::Error(t.span.to(r.span));
                    }
                    Type::Error(t.span)
                }
            }
            TokKind::Word => {
                self.error_at(
                    t.span,
                    format!(
                        "unknown type '{}' (expected i1, i32, i64, f32, f64, str, buffer, list<T> or a reference type such as !hal.buffer)",
                        t.text
                    ),
                );
                self.bump();
                Type::Error(t.span)
            }
            TokKind::Unknown => {
                self.bump();
                Type::Error(t.span)
            }
            _ => {
                self.expected("a type");
                Type::Error(t.span)
            }
        }
    }

    // ---- const expressions --------------------------------------------------------------------------------

    fn at_negative_literal(&self) -> bool {
        let t = self.tok();
        matches!(t.kind, TokKind::Int(_) | TokKind::Float(_)) && t.text.starts_with('-')
    }

    fn const_expr(&mut self) -> ConstExpr {
        self.cexpr().0
    }

    // The `c*` functions return the expression and its height, so that left-leaning operator chains
    // (`1+1+1+...`, which the parser builds in a loop) stay within MAX_DEPTH like everything else: dropping
    // or walking a tree recurses on its height.

    fn cexpr(&mut self) -> (ConstExpr, u32) {
        let mut lhs = self.cterm();
        loop {
            let op = if self.at_punct('+') || self.at_punct('-') {
                let c = if self.at_punct('+') { '+' } else { '-' };
                self.bump();
                c
            } else if self.at_negative_literal() {
                // why: `N -1` can only mean a subtraction here
                self.split_neg = true;
                '-'
            } else {
                break;
            };
            let rhs = self.cterm();
            lhs = self.binary(op, lhs, rhs);
        }
        self.const_trailing_hint();
        lhs
    }

    fn cterm(&mut self) -> (ConstExpr, u32) {
        let mut lhs = self.cunary();
        while let TokKind::Punct(op @ ('*' | '/' | '%')) = self.tok().kind {
            self.bump();
            let rhs = self.cunary();
            lhs = self.binary(op, lhs, rhs);
        }
        lhs
    }

    fn binary(
        &mut self,
        op: char,
        lhs: (ConstExpr, u32),
        rhs: (ConstExpr, u32),
    ) -> (ConstExpr, u32) {
        let span = lhs.0.span().to(rhs.0.span());
        let height = lhs.1.max(rhs.1) + 1;
        if height > MAX_DEPTH {
            self.too_deep(rhs.0.span());
            return (ConstExpr::Error(span), 1);
        }
        let e = ConstExpr::Binary {
            op,
            lhs: Box::new(lhs.0),
            rhs: Box::new(rhs.0),
            span,
        };
        (e, height)
    }

    /// `N %2` lexes as `N` then the value `%2`; say how to fix it.
    fn const_trailing_hint(&mut self) {
        let t = self.tok();
        if t.kind == TokKind::Value {
            let msg = format!(
                "expected an operator or the end of the expression, found {}; write '% {}' for the remainder",
                t.describe(),
                t.name()
            );
            let span = t.span;
            self.error_at(span, msg);
        }
    }

    fn cunary(&mut self) -> (ConstExpr, u32) {
        if self.at_punct('-') {
            let start = self.tok().span;
            if !self.enter() {
                return (ConstExpr::Error(start), 1);
            }
            self.bump();
            let (inner, h) = self.cunary();
            self.leave();
            let span = start.to(inner.span());
            return (ConstExpr::Neg(Box::new(inner), span), h + 1);
        }
        self.cprimary()
    }

    fn cprimary(&mut self) -> (ConstExpr, u32) {
        let t = self.tok().clone();
        let split = std::mem::take(&mut self.split_neg);
        // a negative literal whose '-' was taken as a binary minus: drop the sign
        let lit_span = if split {
            Span {
                start: t.span.start.saturating_add(1).min(t.span.end),
                end: t.span.end,
            }
        } else {
            t.span
        };
        let leaf = match &t.kind {
            TokKind::Int(v) => {
                self.bump();
                match v.map(|v| if split { v.checked_neg() } else { Some(v) }) {
                    Some(Some(v)) => ConstExpr::Int(v, lit_span),
                    Some(None) => {
                        let digits = t.text.get(1..).unwrap_or("");
                        self.error_at(
                            lit_span,
                            format!("integer literal {digits} is out of range for i64"),
                        );
                        ConstExpr::Error(lit_span)
                    }
                    None => ConstExpr::Error(lit_span),
                }
            }
            TokKind::Float(v) => {
                self.bump();
                match v {
                    Some(v) => ConstExpr::Float(if split { -v } else { *v }, lit_span),
                    None => ConstExpr::Error(lit_span),
                }
            }
            TokKind::Str { value, ok } => {
                self.bump();
                if *ok {
                    ConstExpr::Str(value.clone(), t.span)
                } else {
                    ConstExpr::Error(t.span)
                }
            }
            TokKind::Word => {
                self.bump();
                match t.text {
                    "true" => ConstExpr::Bool(true, t.span),
                    "false" => ConstExpr::Bool(false, t.span),
                    _ => ConstExpr::Word(name_of(&t)),
                }
            }
            TokKind::Symbol => {
                self.bump();
                ConstExpr::Symbol(name_of(&t))
            }
            TokKind::Punct('(') => {
                if !self.enter() {
                    return (ConstExpr::Error(t.span), 1);
                }
                self.bump();
                let inner = self.cexpr();
                if !self.eat_punct(')') {
                    self.expected(&format!(
                        "')' to close the '(' opened on line {}",
                        t.line + 1
                    ));
                }
                self.leave();
                return inner;
            }
            TokKind::Punct('[') => {
                if !self.enter() {
                    return (ConstExpr::Error(t.span), 1);
                }
                self.bump();
                let mut height = 0;
                let items = self.list(
                    ']',
                    "list",
                    |p| p.at_punct('>') || p.at_punct(')'),
                    |p| {
                        let (e, h) = p.cexpr();
                        height = height.max(h);
                        Some(e)
                    },
                );
                self.leave();
                return (ConstExpr::List(items, self.span_from(t.span)), height + 1);
            }
            TokKind::Unknown => {
                self.bump();
                ConstExpr::Error(t.span)
            }
            _ => {
                self.expected("a constant expression (a literal, word, @symbol, '(' or '[')");
                ConstExpr::Error(t.span)
            }
        };
        (leaf, 1)
    }

    // ---- function bodies ----------------------------------------------------------------------------------

    /// `{ stmt* }`; the current token is `{`.
    fn block(&mut self) -> Block {
        let open = self.tok().clone();
        if !self.enter_cost(BLOCK_COST) {
            return Block {
                stmts: vec![Stmt::Error(open.span)],
                span: self.span_from(open.span),
            };
        }
        self.bump();
        let mut stmts = Vec::new();
        loop {
            if self.eat_punct('}') {
                break;
            }
            if self.at_eof() {
                self.expected(&format!(
                    "'}}' to close the block opened on line {}",
                    open.line + 1
                ));
                break;
            }
            if self.at_item_start() {
                // why: a missing '}' would otherwise swallow every following item as statements
                self.expected(&format!(
                    "'}}' to close the block opened on line {} before the next item",
                    open.line + 1
                ));
                break;
            }
            let before = self.pos;
            stmts.push(self.stmt());
            if self.pos == before {
                self.skip_tree();
            }
        }
        self.leave_cost(BLOCK_COST);
        Block {
            stmts,
            span: self.span_from(open.span),
        }
    }

    /// An item keyword at the start of a line followed by what only an item has (`func @f`, `export func`).
    fn at_item_start(&self) -> bool {
        if !self.at_item_keyword() || !self.at_line_start() {
            return false;
        }
        let next = self.nth(1);
        if self.at_word("export") {
            next.kind == TokKind::Word && ITEM_KEYWORDS.contains(&next.text)
        } else {
            next.kind == TokKind::Symbol
        }
    }

    fn stmt(&mut self) -> Stmt {
        let start = self.tok().span;
        let start_pos = self.pos;
        let parsed = match self.tok().kind {
            TokKind::Value => self.let_stmt(start),
            TokKind::Word => match self.tok().text {
                "return" | "yield" => {
                    let kw = self.bump();
                    let values = self.stmt_operands(kw.line);
                    let span = self.span_from(start);
                    Some(if kw.text == "return" {
                        Stmt::Return { values, span }
                    } else {
                        Stmt::Yield { values, span }
                    })
                }
                "condition" => {
                    let kw = self.bump();
                    let value = if self.starts_operands(kw.line) {
                        self.operand()
                    } else {
                        // why: `condition` alone must not take the next line's statement as its value
                        self.expected("the condition value after 'condition'");
                        Operand::Error(self.tok().span)
                    };
                    Some(Stmt::Condition {
                        value,
                        span: self.span_from(start),
                    })
                }
                _ => self.expr().map(|expr| Stmt::Let {
                    results: Vec::new(),
                    expr,
                    span: self.span_from(start),
                }),
            },
            _ => {
                self.expected("a statement");
                None
            }
        };
        match parsed {
            Some(s) => s,
            None => {
                self.recover_stmt(start_pos);
                Stmt::Error(self.span_from(start))
            }
        }
    }

    fn let_stmt(&mut self, start: Span) -> Option<Stmt> {
        let mut results = vec![name_of(&self.bump())];
        while self.eat_punct(',') {
            let t = self.tok().clone();
            if t.kind != TokKind::Value {
                self.expected("a result name (%name) after ','");
                return None;
            }
            self.bump();
            results.push(name_of(&t));
        }
        self.expect_punct('=', "after the result names")?;
        let expr = self.expr()?;
        Some(Stmt::Let {
            results,
            expr,
            span: self.span_from(start),
        })
    }

    fn expr(&mut self) -> Option<Expr> {
        let t = self.tok().clone();
        if t.kind != TokKind::Word {
            self.expected("an operation (a name such as add, call, if, for or while)");
            return None;
        }
        match t.text {
            "call" => self.call(),
            "if" => self.if_expr(),
            "for" => self.for_expr(),
            "while" => self.while_expr(),
            _ => {
                self.bump();
                // why: `add(%a, 1)` at statement level means the same as `add %a, 1`
                let operands = if self.at_punct('(') && self.tok().span.start == t.span.end {
                    self.bump();
                    self.list(
                        ')',
                        &format!("operand list of '{}'", t.text),
                        Self::at_new_stmt,
                        |p| Some(p.operand()),
                    )
                } else {
                    self.stmt_operands(t.line)
                };
                let annotation = if self.eat_punct(':') {
                    Some(self.ty())
                } else {
                    None
                };
                Some(Expr::Op {
                    name: name_of(&t),
                    operands,
                    annotation,
                    span: self.span_from(t.span),
                })
            }
        }
    }

    /// True when the tokens from the current one are `%a (, %b)* =`: the start of an assignment.
    /// (All on one line: `add %x,` followed by a line `%y = ...` is a missing operand, not `%x, %y = ...`.)
    fn at_assignment(&self) -> bool {
        let line = self.tok().line;
        let mut i = 0;
        loop {
            if self.nth(i).kind != TokKind::Value {
                return false;
            }
            let next = self.nth(i + 1);
            if next.line != line {
                return false;
            }
            if next.is_punct('=') {
                return true;
            }
            if !next.is_punct(',') {
                return false;
            }
            i += 2;
        }
    }

    /// Whether the current token is the first operand of a statement whose head is on line `head_line`.
    fn starts_operands(&self, head_line: u32) -> bool {
        let t = self.tok();
        match t.kind {
            TokKind::Value => !self.at_assignment(),
            TokKind::Word => {
                matches!(t.text, "true" | "false" | "null")
                    || (t.line == head_line && !STMT_KEYWORDS.contains(&t.text))
            }
            TokKind::Symbol
            | TokKind::Int(_)
            | TokKind::Float(_)
            | TokKind::Str { .. }
            | TokKind::Unknown => true,
            _ => false,
        }
    }

    /// The operands of a flat operation, `return` or `yield`: possibly none; comma-separated.
    fn stmt_operands(&mut self, head_line: u32) -> Vec<Operand> {
        let mut out = Vec::new();
        if !self.starts_operands(head_line) {
            return out;
        }
        out.push(self.operand());
        let mut reported = false;
        loop {
            if self.eat_punct(',') {
                if self.tok().kind == TokKind::Value && self.at_assignment() {
                    self.expected("an operand after ','");
                    return out;
                }
                out.push(self.operand());
                continue;
            }
            // why: `add %a %b` — report the missing comma (once per list, and not right after a token the
            // lexer already rejected) and keep reading the list
            let last_line = self.prev_end_line();
            if self.tok().line == last_line && self.starts_operands(last_line) {
                let after_bad = out.last().is_some_and(|o| matches!(o, Operand::Error(_)));
                if !reported && !after_bad {
                    self.expected("',' between operands");
                }
                reported = true;
                out.push(self.operand());
                continue;
            }
            return out;
        }
    }

    fn prev_end_line(&self) -> u32 {
        match self.pos.checked_sub(1).and_then(|i| self.toks.get(i)) {
            Some(t) => t.line,
            None => 0,
        }
    }

    fn operand(&mut self) -> Operand {
        let t = self.tok().clone();
        match &t.kind {
            TokKind::Value => {
                self.bump();
                Operand::Value(name_of(&t))
            }
            TokKind::Int(v) => {
                self.bump();
                v.map_or(Operand::Error(t.span), |v| Operand::Int(v, t.span))
            }
            TokKind::Float(v) => {
                self.bump();
                v.map_or(Operand::Error(t.span), |v| Operand::Float(v, t.span))
            }
            TokKind::Str { value, ok } => {
                self.bump();
                if *ok {
                    Operand::Str(value.clone(), t.span)
                } else {
                    Operand::Error(t.span)
                }
            }
            TokKind::Symbol => {
                self.bump();
                Operand::Symbol(name_of(&t))
            }
            TokKind::Word => match t.text {
                "true" => {
                    self.bump();
                    Operand::Bool(true, t.span)
                }
                "false" => {
                    self.bump();
                    Operand::Bool(false, t.span)
                }
                "null" => {
                    self.bump();
                    Operand::Null(t.span)
                }
                _ if self.nth(1).is_punct('(') => {
                    if !self.enter() {
                        return Operand::Error(t.span);
                    }
                    self.bump();
                    self.bump();
                    let operands = self.list(
                        ')',
                        &format!("operand list of '{}'", t.text),
                        Self::at_new_stmt,
                        |p| Some(p.operand()),
                    );
                    self.leave();
                    Operand::Nested {
                        name: name_of(&t),
                        operands,
                        span: self.span_from(t.span),
                    }
                }
                _ => {
                    self.bump();
                    Operand::Word(name_of(&t))
                }
            },
            TokKind::Unknown => {
                self.bump();
                Operand::Error(t.span)
            }
            _ => {
                self.expected("an operand (a %value, literal, @symbol, word or op(...))");
                Operand::Error(t.span)
            }
        }
    }

    fn call(&mut self) -> Option<Expr> {
        let start = self.bump().span; // call
        let t = self.tok().clone();
        let callee = match t.kind {
            TokKind::Symbol => Callee::Symbol(name_of(&t)),
            TokKind::Word => Callee::TParam(name_of(&t)),
            _ => {
                self.expected("the function to call (@name, or a template parameter)");
                return None;
            }
        };
        self.bump();
        let mut targs = Vec::new();
        if self.eat_punct('<') {
            targs = self.list(
                '>',
                "template argument list",
                |p| p.at_punct('('),
                Self::targ,
            );
        }
        self.expect_punct('(', "with the call's arguments")?;
        let args = self.list(')', "argument list", Self::at_new_stmt, |p| {
            Some(p.operand())
        });
        Some(Expr::Call {
            callee,
            targs,
            args,
            span: self.span_from(start),
        })
    }

    fn targ(&mut self) -> Option<TArg> {
        let t = self.tok().clone();
        if t.kind != TokKind::Word {
            self.expected("a template argument (NAME = value)");
            return None;
        }
        self.bump();
        self.expect_punct('=', &format!("after template argument name {}", t.text))?;
        let value = self.const_expr();
        Some(TArg {
            name: name_of(&t),
            value,
        })
    }

    /// A `{` block, or `None` after "expected '{' to start the {what}".
    fn required_block(&mut self, what: &str) -> Option<Block> {
        if self.at_punct('{') {
            Some(self.block())
        } else {
            self.expected(&format!("'{{' to start the {what}"));
            None
        }
    }

    fn if_expr(&mut self) -> Option<Expr> {
        let start = self.bump().span; // if
        let cond = self.operand();
        if matches!(cond, Operand::Error(_)) {
            return None;
        }
        let results = self.results();
        let then_block = self.required_block("'if' block")?;
        let else_block = if self.at_word("else") {
            self.bump();
            Some(self.required_block("'else' block")?)
        } else {
            None
        };
        Some(Expr::If {
            cond,
            results,
            then_block,
            else_block,
            span: self.span_from(start),
        })
    }

    fn for_expr(&mut self) -> Option<Expr> {
        let start = self.bump().span; // for
        let v = self.tok().clone();
        if v.kind != TokKind::Value {
            self.expected("the loop variable (%name) after 'for'");
            return None;
        }
        self.bump();
        self.expect_punct('=', "after the loop variable")?;
        let lo = self.operand();
        if !self.at_word("to") {
            self.expected("'to' after the loop's lower bound");
            return None;
        }
        self.bump();
        let hi = self.operand();
        let step = if self.at_word("step") {
            self.bump();
            Some(self.operand())
        } else {
            None
        };
        let iters = self.iters_opt()?;
        let results = self.results();
        let body = self.required_block("loop body")?;
        Some(Expr::For {
            var: name_of(&v),
            lo,
            hi,
            step,
            iters,
            results,
            body,
            span: self.span_from(start),
        })
    }

    fn while_expr(&mut self) -> Option<Expr> {
        let start = self.bump().span; // while
        let iters = self.iters_opt()?;
        let results = self.results();
        let cond_block = self.required_block("'while' condition block")?;
        if !self.at_word("do") {
            self.expected("'do' and the loop body after the 'while' condition block");
            return None;
        }
        self.bump();
        let body = self.required_block("'do' block")?;
        Some(Expr::While {
            iters,
            results,
            cond_block,
            body,
            span: self.span_from(start),
        })
    }

    /// `iter(%a = init : T, ...)` when present.
    fn iters_opt(&mut self) -> Option<Vec<IterArg>> {
        if !self.at_word("iter") {
            return Some(Vec::new());
        }
        self.bump();
        self.expect_punct('(', "after 'iter'")?;
        Some(self.list(
            ')',
            "iter list",
            |p| p.tok().kind == TokKind::Arrow,
            Self::iter_arg,
        ))
    }

    fn iter_arg(&mut self) -> Option<IterArg> {
        let t = self.tok().clone();
        if t.kind != TokKind::Value {
            self.expected("a loop-carried value (%name = init : type)");
            return None;
        }
        self.bump();
        self.expect_punct('=', &format!("and the initial value of %{}", t.name()))?;
        let init = self.operand();
        self.expect_punct(':', &format!("and the type of %{}", t.name()))?;
        let ty = self.ty();
        Some(IterArg {
            name: name_of(&t),
            init,
            ty,
        })
    }
}
