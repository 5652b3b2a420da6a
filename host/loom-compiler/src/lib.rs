//! `loom-compiler`: from source text to a linked [`loom_ir::Program`].
//!
//! Two steps, both of which report problems as diagnostics with `file:line:col`, a source excerpt and a caret:
//! - [`compile_module`]: one `.loom` file -> one typed [`loom_ir::Module`] (name resolution within the module,
//!   literal typing from context, SSA scoping, type checking through [`loom_ir::opcode::type_op`], implicit
//!   terminators). Nested operations (`add(mul(%i, 16), 8)`) become fresh values named `%0`, `%1`, ...
//! - [`link`]: a [`Catalog`] of modules (from `.loom` or `.loombc`), a primary module and its roots -> the
//!   dependency closure with definition references resolved, templates instantiated (memoised) and capability
//!   imports checked against the role's grants.
//!
//! **Invariant:** this crate performs no IO: callers hand it text or bytes with a display name.

mod catalog;
mod consteval;
mod device;
mod link;
mod lower;

pub use catalog::{Catalog, CatalogError, Entry};
pub use link::{LinkError, MAX_INSTANTIATIONS, link};
pub use lower::{RefTypes, compile_module};

/// Parses and compiles one source text, accepting any reference type name (see [`compile_text_for`]).
/// Returns the module (when there were no errors) and every diagnostic, already rendered against the source
/// (`file:line:col: error: ...` plus excerpt).
pub fn compile_text(file_name: &str, text: &str) -> (Option<loom_ir::Module>, Vec<String>) {
    compile_text_for(file_name, text, &RefTypes::Any)
}

/// [`compile_text`] for a host that defines the reference types `ref_types`: any other `!name` is an error.
pub fn compile_text_for(
    file_name: &str,
    text: &str,
    ref_types: &RefTypes,
) -> (Option<loom_ir::Module>, Vec<String>) {
    let source = loom_syntax::SourceFile::new(file_name, text);
    let (tree, mut diags) = loom_syntax::parse(text);
    let parse_failed = diags
        .iter()
        .any(|d| d.severity == loom_syntax::Severity::Error);
    let mut module = None;
    if !parse_failed {
        let (m, more) = compile_module(&source, &tree, ref_types);
        diags.extend(more);
        module = m;
    }
    (module, diags.iter().map(|d| source.render(d)).collect())
}

pub use link::Role;

/// Decodes and verifies `.loombc` bytes. The error is one complete message naming the file.
pub fn load_bytecode(file_name: &str, bytes: &[u8]) -> Result<loom_ir::Module, String> {
    let module = loom_ir::bytecode::decode(bytes)
        .map_err(|e| format!("{file_name}: error: invalid bytecode: {e}"))?;
    loom_ir::verify::verify_module(&module)
        .map_err(|e| format!("{file_name}: error: bytecode does not verify: {e}"))?;
    Ok(module)
}
