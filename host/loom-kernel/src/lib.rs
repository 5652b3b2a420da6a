//! `loom-kernel`: the kernel front end. Device items (kernels, kfuncs, stages) arrive as canonical text in
//! `loom_ir::Module::device`; this crate parses them ([`parse`]), specializes stages and kernels with bound
//! template values into the portable IR `loom_ir::kernel` ([`specialize_stage`], [`specialize_kernel`]),
//! reflects stages for hosts ([`reflect()`]) and dumps the result for people ([`dump_stage`]).
//!
//! The language is `docs/loom/kernels.md`. Errors are complete rendered diagnostics (`file:line:col: error:
//! ...`, excerpt, caret, notes); nothing here panics on any input.

#![forbid(unsafe_code)]

pub mod ast;
mod dump;
pub mod parse;
mod reflect;
mod spec;

pub use dump::{dump_kernel, dump_reflection, dump_stage};
pub use parse::{ItemSource, MAX_DEPTH, parse_item};
pub use reflect::{
    BufferInfo, DispatchInfo, ParamInfo, Reflection, WORKSPACE_ALIGN, WorkspaceInfo, reflect,
};
pub use spec::{MAX_INLINE_DEPTH, MAX_KERNEL_OPS, MAX_STATIC_ITERATIONS, MAX_STATIC_TRIPS};

use loom_compiler::Catalog;
use loom_ir::TValue;
use loom_ir::kernel::{Kernel, Stage};

/// Specializes stage `stage` of catalog module `module`: binds its template parameters (`config` overrides
/// defaults), specializes every dispatched kernel (memoised, deduplicated by specialized name) and checks
/// every dispatch. Errors are rendered diagnostics.
pub fn specialize_stage(
    catalog: &Catalog,
    module: usize,
    stage: &str,
    config: &[(String, TValue)],
) -> Result<Stage, Vec<String>> {
    let mut sp = spec::Spec::new(catalog);
    spec::stage(&mut sp, module, stage, config)
}

/// Specializes one kernel of catalog module `module` with `template_values` (defaults fill the rest).
pub fn specialize_kernel(
    catalog: &Catalog,
    module: usize,
    kernel_name: &str,
    template_values: &[(String, TValue)],
) -> Result<Kernel, Vec<String>> {
    let mut sp = spec::Spec::new(catalog);
    spec::kernel_root(&mut sp, module, kernel_name, template_values)
}
