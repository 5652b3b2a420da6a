//! `serve-contracts`: the serving contracts, one folder each. A contract supplies the runtime its interface as
//! data (`serve_runtime::contract::ContractInterface`: roles, cold results, entries, phase table) and starts a
//! service for each prepared model (its scheduler, queue, protocol and metrics); its HTTP routes live in
//! `serve-http`, one file per route family.
//!
//! Adding a contract is one new folder here (an implementation of `serve_runtime::contract::Contract`), one line
//! in [`builtin`], and one route file in `serve-http`; the runtime's model, natives, registry and the compiler
//! do not change. See ARCHITECTURE.md, "How to add a contract".

pub mod finite;
pub mod retained;
pub mod sequence;
pub mod thread;

use loom_ir::Type;
use serve_runtime::contract::Contracts;
use std::sync::Arc;

/// The `!opaque` type of control entries' state parameters.
pub(crate) fn opaque_type() -> Type {
    Type::Ref {
        name: "opaque".into(),
        nullable: false,
    }
}

/// The `!hal.buffer` type of `run` entries' buffer parameters.
pub(crate) fn hal_buffer_type() -> Type {
    Type::Ref {
        name: "hal.buffer".into(),
        nullable: false,
    }
}

/// Every contract this server serves.
pub fn builtin() -> Contracts {
    Contracts::new(vec![
        Arc::new(finite::Finite::new()),
        Arc::new(retained::Retained::new()),
        Arc::new(sequence::Sequence::new()),
    ])
}
