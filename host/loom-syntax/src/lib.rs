//! `loom-syntax`: the Loom lexer and parser.
//!
//! **Invariant:** parsing never fails and never panics. [`parse`] returns a [`ast::Module`] plus every
//! [`Diagnostic`] found; broken pieces become `Error` nodes so later stages keep going. The grammar is
//! `docs/loom/syntax.md`.

pub mod ast;
mod diagnostic;
mod lexer;
mod parser;

pub use diagnostic::{Diagnostic, LineCol, Severity, SourceFile, Span};
pub use parser::parse;
