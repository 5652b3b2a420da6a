//! `loom-syntax`: the Loom lexer and parser.
//!
//! **Invariant:** parsing never fails and never panics. [`parse`] returns a [`ast::Module`] plus every
//! [`Diagnostic`] found; broken pieces become `Error` nodes so later stages keep going. The grammar is
//! `docs/loom/syntax.md`. [`dump`] prints a tree in the compact form the golden tests compare.

pub mod ast;
mod diagnostic;
mod dump;
mod lexer;
mod parser;
#[cfg(test)]
mod tests;

pub use diagnostic::{Diagnostic, LineCol, Severity, SourceFile, Span};
pub use dump::dump;
pub use parser::{MAX_DEPTH, parse};
