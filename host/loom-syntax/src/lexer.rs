//! Lexer: source text -> tokens with spans, plus diagnostics for malformed tokens.
//!
//! The lexer never fails. A malformed literal still becomes a token (with `None` as its value, so the parser
//! turns it into an `Error` node without reporting it twice), and a run of characters that cannot start any
//! token becomes one [`TokKind::Unknown`] token with one diagnostic. Every loop advances by at least one
//! character, so lexing is linear in the input.
//!
//! Decisions not spelled out in `docs/loom/syntax.md`:
//! - `-` directly followed by a digit starts a negative literal, unless the previous token ends an operand
//!   (word, symbol, value, literal, `)`, `]`) and touches the `-` (no space between): `N-1` and `N - 1` are
//!   subtractions, `return -1` and `add -1, %x` have literals. The const-expression parser also reads
//!   `N -1` as a subtraction, since juxtaposition means nothing there.
//! - Strings cannot contain a raw newline: an unterminated string then ends at its line, so the rest of the
//!   file still lexes normally.
//! - `\xHH` is at most `\x7f` (strings are UTF-8 text; use `\u{..}` for other characters).
//! - Integer literals, decimal or hex, must fit `i64` after applying the sign.

use crate::{Diagnostic, Span};

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum TokKind {
    /// `func.decl`, `N`, `buffer.load.i64`.
    Word,
    /// `@name` (text without `@`).
    Symbol,
    /// `%name` (text without `%`).
    Value,
    /// `!name` (text without `!`).
    RefType,
    /// `None`: malformed or out of range (already diagnosed).
    Int(Option<i64>),
    /// `None`: malformed (already diagnosed).
    Float(Option<f64>),
    /// `ok == false`: an escape was bad or the string was unterminated (already diagnosed); `value` holds
    /// what could be read.
    Str {
        value: String,
        ok: bool,
    },
    /// One of `{ } ( ) [ ] < > , : = ? + - * / %`.
    Punct(char),
    /// `->`
    Arrow,
    /// Characters that start no token (already diagnosed).
    Unknown,
    Eof,
}

#[derive(Clone, Debug)]
pub(crate) struct Token<'a> {
    pub(crate) kind: TokKind,
    /// The token's text as written (with its sigil); for names, `name()` strips the sigil.
    pub(crate) text: &'a str,
    pub(crate) span: Span,
    /// 0-based line of the token's start: used only to decide where a statement's operand list may end.
    pub(crate) line: u32,
}

impl<'a> Token<'a> {
    /// The name without its sigil (`@`, `%`, `!`), for symbol, value and ref-type tokens; the text otherwise.
    pub(crate) fn name(&self) -> &'a str {
        match self.kind {
            TokKind::Symbol | TokKind::Value | TokKind::RefType => self.text.get(1..).unwrap_or(""),
            _ => self.text,
        }
    }

    pub(crate) fn is_punct(&self, c: char) -> bool {
        self.kind == TokKind::Punct(c)
    }

    pub(crate) fn is_word(&self, w: &str) -> bool {
        self.kind == TokKind::Word && self.text == w
    }

    /// How the token is quoted in a diagnostic: `'{'`, `'%x'`, `end of file`.
    pub(crate) fn describe(&self) -> String {
        match self.kind {
            TokKind::Eof => "end of file".to_string(),
            TokKind::Str { .. } => "a string".to_string(),
            _ => {
                // why: a huge unknown run or literal would make the message unreadable
                let mut t: String = self.text.chars().take(32).collect();
                if t.len() < self.text.len() {
                    t.push_str("...");
                }
                format!("'{t}'")
            }
        }
    }
}

/// Splits `text` into tokens (always ending with one `Eof` token) and reports malformed tokens.
pub(crate) fn lex<'a>(text: &'a str, diags: &mut Vec<Diagnostic>) -> Vec<Token<'a>> {
    let mut lx = Lexer {
        src: text,
        bytes: text.as_bytes(),
        pos: 0,
        line: 0,
        tokens: Vec::new(),
        diags,
    };
    lx.run();
    lx.tokens
}

struct Lexer<'a, 'd> {
    src: &'a str,
    bytes: &'a [u8],
    pos: usize,
    line: u32,
    tokens: Vec<Token<'a>>,
    diags: &'d mut Vec<Diagnostic>,
}

fn is_ident_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_'
}

fn is_ident_continue(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Characters that may begin some token (used to end a run of unknown characters).
fn starts_token(b: u8) -> bool {
    is_ident_continue(b)
        || b.is_ascii_whitespace()
        || matches!(
            b,
            b'@' | b'%'
                | b'!'
                | b'"'
                | b'{'
                | b'}'
                | b'('
                | b')'
                | b'['
                | b']'
                | b'<'
                | b'>'
                | b','
                | b':'
                | b'='
                | b'?'
                | b'+'
                | b'-'
                | b'*'
                | b'/'
        )
}

impl<'a> Lexer<'a, '_> {
    fn peek(&self, off: usize) -> u8 {
        self.bytes.get(self.pos + off).copied().unwrap_or(0)
    }

    fn error(&mut self, start: usize, end: usize, msg: impl Into<String>) {
        self.diags
            .push(Diagnostic::error(Span::new(start, end), msg));
    }

    fn push(&mut self, kind: TokKind, start: usize) {
        let text = self.src.get(start..self.pos).unwrap_or("");
        self.tokens.push(Token {
            kind,
            text,
            span: Span::new(start, self.pos),
            line: self.line,
        });
    }

    /// True when the previous token ends an operand and touches `pos` (so `-` there is the minus operator).
    fn prev_ends_operand_adjacent(&self) -> bool {
        let Some(prev) = self.tokens.last() else {
            return false;
        };
        let ends = matches!(
            prev.kind,
            TokKind::Word
                | TokKind::Symbol
                | TokKind::Value
                | TokKind::Int(_)
                | TokKind::Float(_)
                | TokKind::Str { .. }
                | TokKind::Punct(')')
                | TokKind::Punct(']')
        );
        ends && prev.span.end as usize == self.pos
    }

    fn run(&mut self) {
        while self.pos < self.bytes.len() {
            let b = self.peek(0);
            let start = self.pos;
            match b {
                b'\n' => {
                    self.pos += 1;
                    self.line = self.line.saturating_add(1);
                }
                b' ' | b'\t' | b'\r' | 0x0c => self.pos += 1,
                b'/' if self.peek(1) == b'/' => {
                    while self.pos < self.bytes.len() && self.peek(0) != b'\n' {
                        self.pos += 1;
                    }
                }
                _ if is_ident_start(b) => {
                    self.word_body();
                    self.push(TokKind::Word, start);
                }
                b'@' | b'!' => {
                    self.pos += 1;
                    if is_ident_start(self.peek(0)) {
                        self.word_body();
                        let kind = if b == b'@' {
                            TokKind::Symbol
                        } else {
                            TokKind::RefType
                        };
                        self.push(kind, start);
                    } else {
                        let what = if b == b'@' {
                            "symbol"
                        } else {
                            "reference type"
                        };
                        self.error(
                            start,
                            self.pos,
                            format!(
                                "expected a name after '{}' (a {what} such as {}x), found {}",
                                b as char,
                                b as char,
                                self.describe_char()
                            ),
                        );
                        self.push(TokKind::Unknown, start);
                    }
                }
                b'%' => {
                    self.pos += 1;
                    if is_ident_continue(self.peek(0)) {
                        while is_ident_continue(self.peek(0)) {
                            self.pos += 1;
                        }
                        self.push(TokKind::Value, start);
                    } else {
                        self.push(TokKind::Punct('%'), start);
                    }
                }
                b'"' => self.string(),
                b'-' if self.peek(1) == b'>' => {
                    self.pos += 2;
                    self.push(TokKind::Arrow, start);
                }
                b'-' if self.peek(1).is_ascii_digit() && !self.prev_ends_operand_adjacent() => {
                    self.pos += 1;
                    self.number(start, true);
                }
                _ if b.is_ascii_digit() => self.number(start, false),
                b'{' | b'}' | b'(' | b')' | b'[' | b']' | b'<' | b'>' | b',' | b':' | b'='
                | b'?' | b'+' | b'-' | b'*' | b'/' => {
                    self.pos += 1;
                    self.push(TokKind::Punct(b as char), start);
                }
                _ => self.unknown_run(),
            }
        }
        let end = self.bytes.len();
        self.tokens.push(Token {
            kind: TokKind::Eof,
            text: "",
            span: Span::new(end, end),
            line: self.line,
        });
    }

    /// The character at `pos`, quoted, for messages.
    fn describe_char(&self) -> String {
        match self.src.get(self.pos..).and_then(|s| s.chars().next()) {
            None => "end of file".to_string(),
            Some(c) if c.is_whitespace() => "whitespace".to_string(),
            Some(c) => format!("'{}'", c.escape_debug()),
        }
    }

    /// `[A-Za-z_][A-Za-z0-9_]*` parts joined by `.`; `pos` is at the first part's first character.
    fn word_body(&mut self) {
        loop {
            while is_ident_continue(self.peek(0)) {
                self.pos += 1;
            }
            if self.peek(0) == b'.' && is_ident_start(self.peek(1)) {
                self.pos += 1;
            } else {
                break;
            }
        }
    }

    /// A run of characters that start no token: one token, one diagnostic.
    fn unknown_run(&mut self) {
        let start = self.pos;
        // why: advance by whole characters so spans stay on char boundaries
        let rest = self.src.get(start..).unwrap_or("");
        let mut end = start;
        for (i, c) in rest.char_indices() {
            if i > 0 && c.is_ascii() && starts_token(c as u8) {
                break;
            }
            end = start + i + c.len_utf8();
        }
        self.pos = end.max(start + 1).min(self.bytes.len());
        let shown: String = rest
            .chars()
            .take(if end - start > 1 { 2 } else { 1 })
            .collect();
        let msg = if self
            .src
            .get(start..self.pos)
            .is_some_and(|s| s.chars().count() > 1)
        {
            format!(
                "unknown characters starting with '{}'",
                shown.escape_debug()
            )
        } else {
            format!("unknown character '{}'", shown.escape_debug())
        };
        self.error(start, self.pos, msg);
        self.push(TokKind::Unknown, start);
    }

    fn digits(&mut self, hex: bool) -> usize {
        let from = self.pos;
        loop {
            let b = self.peek(0);
            if b == b'_' || b.is_ascii_digit() || (hex && b.is_ascii_hexdigit()) {
                self.pos += 1;
            } else {
                break;
            }
        }
        self.pos - from
    }

    /// A number; `pos` is at its first digit (after a `-` when `negative`).
    fn number(&mut self, start: usize, negative: bool) {
        let digits_start = self.pos;
        let hex = self.peek(0) == b'0' && matches!(self.peek(1), b'x' | b'X');
        let mut is_float = false;
        if hex {
            self.pos += 2;
            self.digits(true);
        } else {
            self.digits(false);
            if self.peek(0) == b'.' && self.peek(1).is_ascii_digit() {
                is_float = true;
                self.pos += 1;
                self.digits(false);
            }
            let exp_digit = match self.peek(1) {
                b'+' | b'-' => self.peek(2).is_ascii_digit(),
                d => d.is_ascii_digit(),
            };
            if matches!(self.peek(0), b'e' | b'E') && exp_digit {
                is_float = true;
                self.pos += if matches!(self.peek(1), b'+' | b'-') {
                    2
                } else {
                    1
                };
                self.digits(false);
            }
        }
        // why: `12abc` or `1.5f` is one malformed token, not a number followed by a word
        if is_ident_continue(self.peek(0)) || (self.peek(0) == b'.' && is_ident_start(self.peek(1)))
        {
            while is_ident_continue(self.peek(0))
                || (self.peek(0) == b'.' && is_ident_continue(self.peek(1)))
            {
                self.pos += 1;
            }
            let text = self.src.get(start..self.pos).unwrap_or("");
            self.error(
                start,
                self.pos,
                format!("invalid number literal '{}'", text.escape_debug()),
            );
            let kind = if is_float {
                TokKind::Float(None)
            } else {
                TokKind::Int(None)
            };
            self.push(kind, start);
            return;
        }
        let body: String = self
            .src
            .get(digits_start..self.pos)
            .unwrap_or("")
            .chars()
            .filter(|&c| c != '_')
            .collect();
        let text = self.src.get(start..self.pos).unwrap_or("").to_string();
        if is_float {
            let v = body
                .parse::<f64>()
                .ok()
                .map(|v| if negative { -v } else { v });
            match v {
                Some(v) if v.is_finite() => self.push(TokKind::Float(Some(v)), start),
                _ => {
                    self.error(
                        start,
                        self.pos,
                        format!("float literal {text} is out of range for f64"),
                    );
                    self.push(TokKind::Float(None), start);
                }
            }
            return;
        }
        let magnitude = if hex {
            let h = body.get(2..).unwrap_or("");
            if h.is_empty() {
                self.error(
                    start,
                    self.pos,
                    "expected hex digits after '0x'".to_string(),
                );
                self.push(TokKind::Int(None), start);
                return;
            }
            u128::from_str_radix(h, 16).ok()
        } else {
            body.parse::<u128>().ok()
        };
        // why: the magnitude of i64::MIN does not fit i64, so apply the sign in i128
        let value = magnitude
            .and_then(|m| i128::try_from(m).ok())
            .map(|m| if negative { -m } else { m })
            .and_then(|v| i64::try_from(v).ok());
        match value {
            Some(v) => self.push(TokKind::Int(Some(v)), start),
            None => {
                self.error(
                    start,
                    self.pos,
                    format!(
                        "integer literal {text} is out of range for i64 (-9223372036854775808 to 9223372036854775807)"
                    ),
                );
                self.push(TokKind::Int(None), start);
            }
        }
    }

    /// A string literal; `pos` is at the opening quote.
    fn string(&mut self) {
        let start = self.pos;
        self.pos += 1;
        let mut value = String::new();
        let mut ok = true;
        loop {
            let rest = self.src.get(self.pos..).unwrap_or("");
            let Some(c) = rest.chars().next() else {
                self.error(
                    start,
                    self.pos,
                    "unterminated string literal: expected '\"' before end of file",
                );
                ok = false;
                break;
            };
            match c {
                '"' => {
                    self.pos += 1;
                    break;
                }
                '\n' => {
                    // why: ending at the line keeps the rest of the file lexing normally
                    self.error(
                        start,
                        self.pos,
                        "unterminated string literal: expected '\"' before end of line (write \\n for a newline)",
                    );
                    ok = false;
                    break;
                }
                '\\' => {
                    if !self.escape(&mut value) {
                        ok = false;
                    }
                }
                c => {
                    value.push(c);
                    self.pos += c.len_utf8();
                }
            }
        }
        self.push(TokKind::Str { value, ok }, start);
    }

    /// One escape; `pos` is at the backslash. Returns false (after a diagnostic) when it is invalid.
    fn escape(&mut self, value: &mut String) -> bool {
        let start = self.pos;
        self.pos += 1;
        let Some(c) = self.src.get(self.pos..).and_then(|s| s.chars().next()) else {
            // the unterminated-string diagnostic follows
            return false;
        };
        let simple = match c {
            'n' => Some('\n'),
            't' => Some('\t'),
            'r' => Some('\r'),
            '\\' => Some('\\'),
            '"' => Some('"'),
            '0' => Some('\0'),
            _ => None,
        };
        if let Some(s) = simple {
            value.push(s);
            self.pos += 1;
            return true;
        }
        match c {
            'x' => {
                self.pos += 1;
                let h1 = self.peek(0);
                let h2 = self.peek(1);
                if h1.is_ascii_hexdigit() && h2.is_ascii_hexdigit() {
                    self.pos += 2;
                    let v = hex_val(h1) * 16 + hex_val(h2);
                    if v > 0x7f {
                        self.error(
                            start,
                            self.pos,
                            format!(
                                "escape '\\x{}{}' is above \\x7f; write the character as \\u{{{:x}}}",
                                h1 as char, h2 as char, v
                            ),
                        );
                        return false;
                    }
                    value.push(char::from(v as u8));
                    true
                } else {
                    self.error(
                        start,
                        self.pos,
                        "invalid escape '\\x': expected two hex digits (\\x00 to \\x7f)",
                    );
                    false
                }
            }
            'u' => {
                self.pos += 1;
                if self.peek(0) != b'{' {
                    self.error(
                        start,
                        self.pos,
                        "invalid escape '\\u': expected '{' and hex digits, as in \\u{e9}",
                    );
                    return false;
                }
                self.pos += 1;
                let digits_start = self.pos;
                while self.peek(0).is_ascii_hexdigit() {
                    self.pos += 1;
                }
                let digits = self.src.get(digits_start..self.pos).unwrap_or("");
                if self.peek(0) != b'}' || digits.is_empty() || digits.len() > 6 {
                    if self.peek(0) == b'}' {
                        self.pos += 1;
                    }
                    self.error(
                        start,
                        self.pos,
                        "invalid escape '\\u{..}': expected 1 to 6 hex digits and '}'",
                    );
                    return false;
                }
                self.pos += 1;
                match u32::from_str_radix(digits, 16)
                    .ok()
                    .and_then(char::from_u32)
                {
                    Some(ch) => {
                        value.push(ch);
                        true
                    }
                    None => {
                        self.error(
                            start,
                            self.pos,
                            format!("invalid escape '\\u{{{digits}}}': not a Unicode scalar value"),
                        );
                        false
                    }
                }
            }
            '\n' => {
                // leave the newline: the string is unterminated at this line
                self.error(start, self.pos, "invalid escape '\\' at end of line");
                false
            }
            other => {
                self.pos += other.len_utf8();
                self.error(
                    start,
                    self.pos,
                    format!(
                        "unknown escape '\\{}' in string (valid: \\n \\t \\r \\\\ \\\" \\0 \\xHH \\u{{H..}})",
                        other.escape_debug()
                    ),
                );
                false
            }
        }
    }
}

fn hex_val(b: u8) -> u32 {
    match b {
        b'0'..=b'9' => u32::from(b - b'0'),
        b'a'..=b'f' => u32::from(b - b'a' + 10),
        b'A'..=b'F' => u32::from(b - b'A' + 10),
        _ => 0,
    }
}
