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

use serve_runtime::contract::Contracts;
use std::sync::Arc;

/// Every contract this server serves.
pub fn builtin() -> Contracts {
    Contracts::new(vec![
        Arc::new(finite::Finite::new()),
        Arc::new(retained::Retained::new()),
        Arc::new(sequence::Sequence::new()),
    ])
}
