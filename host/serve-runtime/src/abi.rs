//! The host vocabulary package programs are compiled and linked against: the reference types the server's
//! native modules traffic in, and the two program roles with the native modules each may import. The compiler
//! knows none of these words; it receives them from here (`loom_compiler::RefTypes`, `loom_compiler::Role`).
//!
//! What a call may do *at run time* is narrower than what a role may import: it depends on the phase of the
//! invocation making it (the contract's phase table, [`crate::contract::Phase`]).

use loom_compiler::{RefTypes, Role};

/// The reference types of the native modules: a device buffer, a readiness fence, accepted device work, and
/// the opaque state a contract's entries carry between invocations.
pub const REF_TYPES: &[&str] = &["hal.buffer", "hal.fence", "runner.work", "opaque"];

/// [`REF_TYPES`] as the compiler takes them.
pub fn ref_types() -> RefTypes {
    RefTypes::only(REF_TYPES)
}

/// The cold preparation program's role: declarations (`prepare`), the tokenizer (`input`), the options object.
pub fn prepare_role() -> Role {
    Role::new("prepare", &["prepare", "input", "options"])
}

/// The warm control program's role: `runner`, `parameters`, `input`, and `prepare` (usable only in phases whose
/// grants include declarations, such as a finite `prepare_batch`; the natives check that at call time).
pub fn control_role() -> Role {
    Role::new("control", &["runner", "parameters", "input", "prepare"])
}
