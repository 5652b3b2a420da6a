//! Retained text: generation with state the server keeps between epochs. One prepared model serves many
//! sequences; a sequence is a row of state (its pages in the model's page pool), never a VM process.
//!
//! # The package's side
//!
//! Cold `prepare(asset_root, options)` returns ten results: `(epoch_tokens, epoch_spans, page_tokens,
//! page_bytes, vocab, context, terminal_token, tokenizer, source_name, state)`:
//! * `epoch_tokens`, `epoch_spans`: the most tokens and the most spans (independently advancing sequences) one
//!   epoch holds: two separate limits.
//! * `page_tokens`, `page_bytes`: the page geometry. The server owns a pool of pages in one device buffer inside
//!   the model's memory budget (page `p` is bytes `p * page_bytes ..`); what a page holds is the package's.
//! * `vocab`: the width of a logits row; `context`: the longest sequence (prompt and generated tokens);
//!   `terminal_token`: the end-of-sequence token, or -1 for none.
//! * `tokenizer`: the asset that encodes prompts and decodes tokens (empty: tokens are bytes, vocab 256).
//!
//! The control program exports:
//! * `epoch(state, pool_pages, spans, tokens, pages) -> (stage, upload, output_bytes)`: packs one epoch. `spans`
//!   is one record of 8 little-endian i64 per span ([`SPAN_WORDS`]: sequence, position, count, token offset,
//!   page offset, page count, logit row or -1, logit count); `tokens` the spans' i32 token ids back to back;
//!   `pages` each span's page table (i32 page indices covering positions `0 .. position + count`). It runs in
//!   a phase that may declare stages (cached by exact declaration set, like finite cohorts), and returns the
//!   stage to run, the upload and the size of the output buffer (at least `rows * vocab * 4` bytes).
//! * `run(stage, input, pool, output)`: enqueues the epoch's device work (`runner.execute_3`). It writes the
//!   spans' state into their pages and the logits of every span with a logit row into that row of `output`
//!   (f32, `vocab` wide). A span's logit count is 1 (the logits after its last token), 0 without a logit row,
//!   or `n + 1` for a verifier span ending in `n` proposed tokens (speculative verify, only when the model's
//!   `options.speculative_tokens` is above 0): rows `logit_row ..= logit_row + n` then hold the logits after
//!   each of the span's last `n + 1` tokens, in order.
//!
//! # The server's side
//!
//! Requests are tokenized (a chat's messages rendered by the package's chat template, [`chat`]), admitted to a
//! bounded queue and scheduled in epochs by one thread per model ([`service`]): each epoch packs the decode
//! token of every running sequence and prompt chunks of new ones (continuous batching; a long prompt is
//! chunked so that it never stalls the sequences already decoding), reserves their pages, runs, commits the
//! progress after the device work completed, samples ([`sampling`]) and streams text ([`text`]). Pages go back
//! to the pool when a sequence finishes, fails or is cancelled.

pub mod chat;
pub mod engine;
pub mod pages;
pub mod prefix;
pub mod sampling;
pub mod service;
pub mod sessions;
pub mod text;
mod warm;

pub use service::{Event, EventSink, Finish, GenRequest, RetainedService, Ticket};

use crate::{hal_buffer_type as hal_buffer, opaque_type as opaque};
use loom_ir::{Signature, Type};
use loom_vm::Value;
use serve_runtime::Result;
use serve_runtime::contract::{
    COLD, ColdInterface, Contract, ContractInterface, Grants, Phase, Service,
};
use serve_runtime::model::Model;
use std::sync::Arc;

/// The roles a retained-text package can serve over HTTP.
pub const ROLES: &[&str] = &["chat"];

/// Words (i64) of one span record passed to `epoch`.
pub const SPAN_WORDS: usize = 8;

/// The buffers `epoch` takes, built span by span: the span records ([`SPAN_WORDS`] little-endian i64 each),
/// the spans' i32 tokens back to back and their i32 page tables back to back. Serving packs real epochs with it
/// (`service`), and the compilation ahead of requests synthetic ones (`warm`).
#[derive(Debug, Default)]
pub(crate) struct EpochInput {
    spans: Vec<u8>,
    tokens: Vec<u8>,
    pages: Vec<u8>,
    /// Logits rows asked for so far.
    rows: i64,
}

impl EpochInput {
    /// Appends a span of sequence `seq` at `position`: its `tokens`, `logit_rows` logits rows (0: none) and
    /// its page table `pages` (covering `position` plus its token count).
    pub(crate) fn push(
        &mut self,
        seq: u64,
        position: u32,
        logit_rows: u32,
        tokens: impl IntoIterator<Item = u32>,
        pages: impl IntoIterator<Item = u32>,
    ) {
        let (token_at, page_at) = (self.tokens.len() / 4, self.pages.len() / 4);
        for t in tokens {
            self.tokens.extend_from_slice(&(t as i32).to_le_bytes());
        }
        for p in pages {
            self.pages.extend_from_slice(&(p as i32).to_le_bytes());
        }
        let words: [i64; SPAN_WORDS] = [
            seq as i64,
            i64::from(position),
            (self.tokens.len() / 4 - token_at) as i64,
            token_at as i64,
            page_at as i64,
            (self.pages.len() / 4 - page_at) as i64,
            if logit_rows > 0 { self.rows } else { -1 },
            i64::from(logit_rows),
        ];
        for w in words {
            self.spans.extend_from_slice(&w.to_le_bytes());
        }
        self.rows += i64::from(logit_rows);
    }

    /// The logits rows the spans ask for.
    pub(crate) fn rows(&self) -> i64 {
        self.rows
    }

    /// `epoch`'s arguments: the model's state, the pool's page count and the three buffers.
    pub(crate) fn args(self, model: &Model, pool_pages: u32) -> [Value; 5] {
        [
            model.state().clone(),
            Value::I64(i64::from(pool_pages)),
            Value::buffer(self.spans),
            Value::buffer(self.tokens),
            Value::buffer(self.pages),
        ]
    }
}

/// `epoch(state, pool_pages, spans, tokens, pages)`: invocation-scoped declarations.
pub static EPOCH: Phase = Phase {
    name: "epoch",
    grants: Grants::DECLARE,
};

/// `run(stage, input, pool, output)`: device work.
pub static RUN: Phase = Phase {
    name: "run",
    grants: Grants::RUN,
};

/// The retained contract's phases.
pub static PHASES: [&Phase; 3] = [&COLD, &EPOCH, &RUN];

/// What cold `prepare` declared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub epoch_tokens: u32,
    pub epoch_spans: u32,
    pub page_tokens: u32,
    pub page_bytes: u64,
    pub vocab: u32,
    pub context: u32,
    pub terminal: Option<u32>,
}

impl Limits {
    /// Reads (and checks) the first seven cold results.
    pub fn from_cold(values: &[Value]) -> std::result::Result<Limits, String> {
        let get = |i: usize| values.get(i).and_then(Value::as_i64).unwrap_or(0);
        let positive = |i: usize, what: &str, max: i64| {
            let v = get(i);
            if v <= 0 || v > max {
                Err(format!(
                    "prepare returned {v} as the {what}; it must be between 1 and {max}"
                ))
            } else {
                Ok(v)
            }
        };
        let u32max = i64::from(u32::MAX);
        let epoch_tokens = positive(0, "epoch token capacity", 1 << 20)? as u32;
        let epoch_spans = positive(1, "epoch span capacity", 1 << 16)? as u32;
        let page_tokens = positive(2, "tokens per page", 1 << 16)? as u32;
        let page_bytes = positive(3, "bytes per page", 1 << 30)? as u64;
        let vocab = positive(4, "vocabulary size", u32max)? as u32;
        let context = positive(5, "context length", 1 << 24)? as u32;
        let terminal = match get(6) {
            -1 => None,
            t if (0..i64::from(vocab)).contains(&t) => Some(t as u32),
            t => {
                return Err(format!(
                    "prepare returned {t} as the terminal token; it must be -1 (none) or a token id below the \
                     vocabulary size {vocab}"
                ));
            }
        };
        if epoch_spans > epoch_tokens {
            return Err(format!(
                "prepare returned an epoch span capacity of {epoch_spans}, more than its token capacity of \
                 {epoch_tokens}"
            ));
        }
        Ok(Limits {
            epoch_tokens,
            epoch_spans,
            page_tokens,
            page_bytes,
            vocab,
            context,
            terminal,
        })
    }
}

/// Cold `prepare`'s ten results ([`Limits`], tokenizer, source name, state): retained text's, and the
/// known-token sequence contract's.
pub(crate) fn cold_interface() -> ColdInterface {
    use Type::*;
    ColdInterface {
        results: vec![I64, I64, I64, I64, I64, I64, I64, Str, Str, opaque()],
        tokenizer: Some(7),
        state: 9,
        check: |values| Limits::from_cold(values).map(|_| ()),
    }
}

/// The retained-text contract.
#[derive(Debug)]
pub struct Retained {
    interface: ContractInterface,
}

impl Default for Retained {
    fn default() -> Self {
        Retained::new()
    }
}

impl Retained {
    pub fn new() -> Retained {
        use Type::*;
        Retained {
            interface: ContractInterface {
                name: "retained",
                roles: ROLES,
                cold: cold_interface(),
                entries: vec![
                    (
                        "epoch",
                        Signature {
                            params: vec![opaque(), I64, Buffer, Buffer, Buffer],
                            results: vec![I64, Buffer, I64],
                        },
                    ),
                    (
                        "run",
                        Signature {
                            params: vec![I64, hal_buffer(), hal_buffer(), hal_buffer()],
                            results: vec![],
                        },
                    ),
                ],
                phases: &PHASES,
            },
        }
    }
}

impl Contract for Retained {
    fn interface(&self) -> &ContractInterface {
        &self.interface
    }

    fn start(&self, model: Arc<Model>) -> Result<Arc<dyn Service>> {
        self.resume(model, Box::new(service::KeptSessions::default()))
    }

    /// Sessions survive a deactivation (the spec: deactivation does not discard retained session state):
    /// their tokens and checkpoints come back, their pages are computed again by their next append.
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
        Ok(RetainedService::resume(model, limits, sessions)?)
    }
}
