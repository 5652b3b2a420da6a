//! Source positions and diagnostics rendered as `file:line:col: error: message` with an excerpt and a caret.

use std::fmt;

/// A byte range `[start, end)` in one source file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Span {
    pub start: u32,
    pub end: u32,
}

impl Span {
    pub fn new(start: usize, end: usize) -> Span {
        let clamp = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
        Span {
            start: clamp(start),
            end: clamp(end.max(start)),
        }
    }

    /// The smallest span covering both.
    pub fn to(self, other: Span) -> Span {
        Span {
            start: self.start.min(other.start),
            end: self.end.max(other.end),
        }
    }
}

/// 1-based line and column (column counted in characters).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LineCol {
    pub line: u32,
    pub col: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    Error,
    Warning,
}

/// A problem in a source file. Compile problems are diagnostics, not `Err`s.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    pub severity: Severity,
    pub span: Span,
    pub message: String,
    /// Further spans with a note each (e.g. "the private definition is here"); may point into other files,
    /// in which case the note already names the file.
    pub notes: Vec<String>,
}

impl Diagnostic {
    pub fn error(span: Span, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            severity: Severity::Error,
            span,
            message: message.into(),
            notes: Vec::new(),
        }
    }

    pub fn with_note(mut self, note: impl Into<String>) -> Diagnostic {
        self.notes.push(note.into());
        self
    }
}

/// A named source text with a line index, used to turn spans into `file:line:col` and excerpts.
#[derive(Clone, Debug)]
pub struct SourceFile {
    pub name: String,
    pub text: String,
    line_starts: Vec<usize>,
}

impl SourceFile {
    pub fn new(name: impl Into<String>, text: impl Into<String>) -> SourceFile {
        let text = text.into();
        let mut line_starts = vec![0];
        line_starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        SourceFile {
            name: name.into(),
            text,
            line_starts,
        }
    }

    /// Line and column of a byte offset (clamped to the text; never panics).
    pub fn line_col(&self, offset: u32) -> LineCol {
        let offset = (offset as usize).min(self.text.len());
        let line = self.line_starts.partition_point(|&s| s <= offset) - 1;
        let start = self.line_starts[line];
        let col = self
            .text
            .get(start..offset)
            .map_or(offset - start, |s| s.chars().count());
        LineCol {
            line: line as u32 + 1,
            col: col as u32 + 1,
        }
    }

    /// The text of 1-based line `line`, without its newline.
    pub fn line_text(&self, line: u32) -> &str {
        let i = (line as usize).saturating_sub(1);
        let Some(&start) = self.line_starts.get(i) else {
            return "";
        };
        let end = self
            .line_starts
            .get(i + 1)
            .map_or(self.text.len(), |&e| e - 1);
        self.text
            .get(start..end)
            .unwrap_or("")
            .trim_end_matches('\r')
    }

    /// Renders a diagnostic:
    ///
    /// ```text
    /// prog.loom:3:7: error: unknown value %y
    ///     |
    ///   3 |   %x = add %y, 1
    ///     |            ^^
    ///     = note: ...
    /// ```
    pub fn render(&self, d: &Diagnostic) -> String {
        let lc = self.line_col(d.span.start);
        let sev = match d.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        let mut out = format!(
            "{}:{}:{}: {}: {}\n",
            self.name, lc.line, lc.col, sev, d.message
        );
        let line = self.line_text(lc.line);
        let gutter = lc.line.to_string().len();
        let end = self.line_col(d.span.end);
        let width = if end.line == lc.line {
            (end.col.saturating_sub(lc.col)).max(1)
        } else {
            1
        } as usize;
        let pad: String = line
            .chars()
            .take(lc.col as usize - 1)
            .map(|c| if c == '\t' { '\t' } else { ' ' })
            .collect();
        out.push_str(&format!("{:gutter$} |\n", ""));
        out.push_str(&format!("{} | {}\n", lc.line, line));
        out.push_str(&format!("{:gutter$} | {}{}\n", "", pad, "^".repeat(width)));
        for note in &d.notes {
            out.push_str(&format!("{:gutter$} = note: {}\n", "", note));
        }
        out
    }

    /// `file:line:col` of a span's start.
    pub fn location(&self, span: Span) -> String {
        let lc = self.line_col(span.start);
        format!("{}:{}:{}", self.name, lc.line, lc.col)
    }
}

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}..{}", self.start, self.end)
    }
}
