//! Parser (to be written).
use crate::{Diagnostic, ast};
/// Parses one file.
pub fn parse(_text: &str) -> (ast::Module, Vec<Diagnostic>) {
    unimplemented!()
}
