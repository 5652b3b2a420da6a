//! Known-token sequence stages: a deployment that runs supplied token ids through retained rows (pages of the
//! model's page pool), packed epochs and chunking, and publishes output the package defines, without sampling
//! or feeding anything back. The example is scoring: the log probability of every supplied token
//! (`POST /v1/score`, the `score` role's profile).
//!
//! # The package's side
//!
//! Cold `prepare(asset_root, options)` returns the retained-text contract's ten results (see
//! [`crate::retained`]: epoch token and span capacities, page geometry, vocabulary, context, terminal token (may
//! be -1), tokenizer, source name, state). The control program exports:
//! * `encode_epoch(state, pool_pages, spans, tokens, pages) -> (stage, output_bytes, metadata, input, plan,
//!   plan_offset, plan_length)`: packs one epoch. `spans` is one record of 8 little-endian i64 per span
//!   ([`crate::retained::SPAN_WORDS`]: sequence, position, count, token offset, page offset, page count,
//!   **next token** (the supplied token after the span, -1 when the span ends its sequence), 0); `tokens` and
//!   `pages` as in retained text. It may declare stages like `epoch`. It returns the stage to run, the size
//!   of its output buffer, two host packets (metadata and input) and a byte-placement plan over them
//!   ([`plan`]): the server writes exactly the listed bytes into the stage's metadata and input buffers (its
//!   first two inputs, kept on the device across epochs), so a one-token epoch uploads a few bytes whatever
//!   capacity the stage was prepared for.
//! * `capture_epoch(state, stage, span_count, spans) -> buffer`: which bytes of the output belong to which span
//!   (i64 triples, [`plan::captures`]). It runs before the epoch's device work; the server copies the ranges
//!   out after that work completes, before the next epoch reuses the output, and appends them to each span's
//!   sequence.
//! * `run(stage, metadata, input, pool, output)`: enqueues the device work (`runner.execute_4`).
//!
//! # The server's side
//!
//! [`service`]: a bounded queue, admission when the pool holds pages for the whole sequence (its length is
//! known, so an admitted sequence never waits for pages), epochs packed by the retained planner (oldest first,
//! long inputs chunked), progress committed after the device work, the captured bytes of a sequence handed to
//! its request when its last token is done.

pub mod plan;
pub mod service;

pub use service::{Captured, SequenceService, Submitted};

use crate::retained::Limits;
use crate::{hal_buffer_type as hal_buffer, opaque_type as opaque};
use loom_ir::{Signature, Type};
use serve_runtime::Result;
use serve_runtime::contract::{COLD, Contract, ContractInterface, Grants, Phase, Service};
use serve_runtime::model::Model;
use std::sync::Arc;

/// The roles a sequence package can serve over HTTP: `score` (the output of each token is the f32 log
/// probability of the supplied token after it).
pub const ROLES: &[&str] = &["score"];

/// `encode_epoch(state, pool_pages, spans, tokens, pages)`: invocation-scoped declarations.
pub static ENCODE: Phase = Phase {
    name: "encode_epoch",
    grants: Grants::DECLARE,
};

/// `capture_epoch(state, stage, span_count, spans)`: host code only.
pub static CAPTURE: Phase = Phase {
    name: "capture_epoch",
    grants: Grants::NONE,
};

/// `run(stage, metadata, input, pool, output)`: device work.
pub static RUN: Phase = Phase {
    name: "run",
    grants: Grants::RUN,
};

/// The sequence contract's phases.
pub static PHASES: [&Phase; 4] = [&COLD, &ENCODE, &CAPTURE, &RUN];

/// The known-token sequence contract.
#[derive(Debug)]
pub struct Sequence {
    interface: ContractInterface,
}

impl Default for Sequence {
    fn default() -> Self {
        Sequence::new()
    }
}

impl Sequence {
    pub fn new() -> Sequence {
        use Type::*;
        Sequence {
            interface: ContractInterface {
                name: "sequence",
                roles: ROLES,
                cold: crate::retained::cold_interface(),
                entries: vec![
                    (
                        "encode_epoch",
                        Signature {
                            params: vec![opaque(), I64, Buffer, Buffer, Buffer],
                            results: vec![I64, I64, Buffer, Buffer, Buffer, I64, I64],
                        },
                    ),
                    (
                        "capture_epoch",
                        Signature {
                            params: vec![opaque(), I64, I64, Buffer],
                            results: vec![Buffer],
                        },
                    ),
                    (
                        "run",
                        Signature {
                            params: vec![
                                I64,
                                hal_buffer(),
                                hal_buffer(),
                                hal_buffer(),
                                hal_buffer(),
                            ],
                            results: vec![],
                        },
                    ),
                ],
                phases: &PHASES,
            },
        }
    }
}

impl Contract for Sequence {
    fn interface(&self) -> &ContractInterface {
        &self.interface
    }

    fn start(&self, model: Arc<Model>) -> Result<Arc<dyn Service>> {
        self.resume(model, Box::new(service::KeptSessions::default()))
    }

    /// Sessions survive a deactivation (their tokens and checkpoints; their pages are computed again by their
    /// next append).
    fn resume(
        &self,
        model: Arc<Model>,
        kept: serve_runtime::contract::KeptState,
    ) -> Result<Arc<dyn Service>> {
        let limits = Limits::from_cold(model.cold_results())
            .map_err(|m| serve_runtime::Error::Program(format!("model `{}`: {m}", model.name)))?;
        let sessions = kept
            .downcast::<service::KeptSessions>()
            .map(|k| *k)
            .unwrap_or_default();
        Ok(SequenceService::start(model, limits, sessions)?)
    }
}
