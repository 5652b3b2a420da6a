//! Epoch shapes compiled ahead of demand.
//!
//! A package's `epoch` declares its stage for the epoch's shape (its token, logit-row and span buckets: see
//! `packages/smollm2/control.loom`), and each new declaration set compiles once, on the engine thread that
//! meets it (tens of milliseconds to seconds, during which every stream of the model waits). After a model
//! starts, a background thread runs `epoch` over synthetic epochs of the shapes serving meets first and
//! compiles their sets on the shared compile queue, one at a time (a request's own miss waits for at most the
//! one compile in progress):
//!
//! 1. decode epochs of 1 to `epoch_spans` sequences (one token and one logits row each);
//! 2. with speculative verify, one sequence verifying 1 to `speculative_tokens` proposals;
//! 3. one prompt chunk of 1 to `prefill_chunk_tokens` tokens (the last chunk: one logits row);
//! 4. decoders joined by a prompt chunk: `epoch_spans - 1` decoders first (the busiest server meets these),
//!    chunk sizes from small to large, then fewer decoders.
//!
//! Sets already cached are skipped; the thread stops after `options.warm_epochs` new sets (default: the
//! model's `specialization_cache`; the cache keeps the most recently used sets, so shapes requests never meet
//! are the first evicted), when the model is drained or unregistered, or at the first set that fails to build
//! (logged). Compiled sets count as specialization misses. The package is asked nothing new: shapes are plain
//! `epoch` calls over zero tokens and page 0, and a package that rejects one (an `assert`) only loses that
//! shape.

use super::pages::PageTable;
use super::{EPOCH, EpochInput, Limits};
use loom_vm::Value;
use serve_runtime::model::Model;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// One synthetic span: its position, token count and logits rows.
#[derive(Clone, Copy, Debug)]
struct Span {
    position: u32,
    count: u32,
    logits: u32,
}

/// The position decoders of the synthetic epochs are at (past a short prompt).
const DECODE_AT: u32 = 64;

/// The synthetic epochs, most likely first (see the module doc).
fn shapes(limits: &Limits, speculate: u32, prefill_chunk: u32) -> impl Iterator<Item = Vec<Span>> {
    let (spans, tokens, context) = (limits.epoch_spans, limits.epoch_tokens, limits.context);
    let decode_at = DECODE_AT.min(limits.context.saturating_sub(speculate + 2));
    let decoder = Span {
        position: decode_at,
        count: 1,
        logits: 1,
    };
    let decode = (1..=spans.min(tokens)).map(move |n| vec![decoder; n as usize]);
    let verify = (1..=speculate)
        .filter(move |v| decode_at + 1 + v <= context)
        .map(move |v| {
            vec![Span {
                position: decode_at,
                count: 1 + v,
                logits: 1 + v,
            }]
        });
    let chunk_max = prefill_chunk
        .min(tokens)
        .min(limits.context.saturating_sub(1));
    let chunk = |c: u32| Span {
        position: 0,
        count: c,
        logits: 1,
    };
    let chunks = (1..=chunk_max).map(move |c| vec![chunk(c)]);
    let mixed = (1..spans).rev().flat_map(move |n| {
        (1..=chunk_max)
            .filter(move |&c| n + c <= tokens)
            .map(move |c| {
                let mut v = vec![decoder; n as usize];
                v.push(chunk(c));
                v
            })
    });
    decode.chain(verify).chain(chunks).chain(mixed)
}

/// `epoch`'s arguments for `spans`: zero tokens, every page table of page 0.
fn epoch_args(model: &Model, pool_pages: u32, limits: &Limits, spans: &[Span]) -> [Value; 5] {
    let mut input = EpochInput::default();
    for (i, s) in spans.iter().enumerate() {
        let table = PageTable::pages_for(s.position + s.count, limits.page_tokens);
        input.push(
            i as u64,
            s.position,
            s.logits,
            std::iter::repeat_n(0, s.count as usize),
            std::iter::repeat_n(0, table as usize),
        );
    }
    input.args(model, pool_pages)
}

/// How many sets to compile ahead: `options.warm_epochs` (0 turns it off), else the whole specialization cache
/// (the cache keeps the most recently used sets, so a shape requests never meet is the first to go).
pub(super) fn budget(model: &Model) -> serve_runtime::Result<usize> {
    let cache = model.doc.specialization_cache;
    match model.options().get("warm_epochs") {
        None => Ok(cache),
        Some(v) => v
            .as_u64()
            .filter(|&n| n as usize <= cache)
            .map(|n| n as usize)
            .ok_or_else(|| {
                serve_runtime::Error::package(
                    "model.json",
                    "options.warm_epochs",
                    format!(
                        "expected a whole number of epoch shapes to compile ahead, from 0 to the model's \
                         specialization_cache ({cache})"
                    ),
                )
            }),
    }
}

/// Starts the thread (nothing when `budget` is 0); setting the returned flag stops it. It waits while `metrics`
/// counts requests running or waiting.
pub(super) fn start(
    model: &Arc<Model>,
    metrics: Arc<super::service::Metrics>,
    limits: Limits,
    pool_pages: u32,
    speculate: u32,
    prefill_chunk: u32,
    budget: usize,
) -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    if budget == 0 {
        return stop;
    }
    let (weak, flag, name) = (Arc::downgrade(model), stop.clone(), model.name.clone());
    let thread = format!("warm-{name}");
    let spawned = std::thread::Builder::new().name(thread).spawn({
        let name = name.clone();
        move || {
            run(
                &name,
                weak,
                flag,
                &metrics,
                limits,
                pool_pages,
                speculate,
                prefill_chunk,
                budget,
            )
        }
    });
    if let Err(e) = spawned {
        log::warn!("model {name}: no thread to compile epoch shapes ahead of requests: {e}");
    }
    stop
}

#[allow(clippy::too_many_arguments)]
fn run(
    name: &str,
    model: Weak<Model>,
    stop: Arc<AtomicBool>,
    metrics: &super::service::Metrics,
    limits: Limits,
    pool_pages: u32,
    speculate: u32,
    prefill_chunk: u32,
    budget: usize,
) {
    let t0 = Instant::now();
    let mut seen: HashSet<serve_runtime::natives::Decls> = HashSet::new();
    let (mut built, mut rejected) = (0usize, 0usize);
    for spans in shapes(&limits, speculate, prefill_chunk) {
        // Requests first: wait while any is running or waiting.
        while !stop.load(Ordering::Relaxed)
            && model.strong_count() > 0
            && metrics.running.load(Ordering::Relaxed) + metrics.waiting.load(Ordering::Relaxed) > 0
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        if built >= budget || stop.load(Ordering::Relaxed) {
            break;
        }
        let Some(model) = model.upgrade() else { break };
        let args = epoch_args(&model, pool_pages, &limits, &spans);
        let (r, decls) = model.invoke("epoch", &EPOCH, &args, model.doc.fuel.entry("epoch"));
        if r.is_err() {
            rejected += 1;
            continue;
        }
        if decls.stages.is_empty() || model.has_stages(&decls) || !seen.insert(decls.clone()) {
            continue;
        }
        match model.stages_for(decls) {
            Ok(_) => built += 1,
            Err(e) => {
                log::warn!(
                    "model {name}: compiling an epoch shape ahead of requests ({} spans, {} tokens) failed, so \
                     no more are: {e}",
                    spans.len(),
                    spans.iter().map(|s| s.count).sum::<u32>()
                );
                break;
            }
        }
    }
    if built + rejected > 0 {
        log::info!(
            "model {name}: compiled {built} epoch shapes ahead of requests in {:.1?}{}",
            t0.elapsed(),
            if rejected > 0 {
                format!(" ({rejected} synthetic epochs rejected by the package's `epoch`)")
            } else {
                String::new()
            }
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            epoch_tokens: 256,
            epoch_spans: 16,
            page_tokens: 16,
            page_bytes: 1024,
            vocab: 100,
            context: 2048,
            terminal: None,
        }
    }

    /// The shapes come most likely first and never exceed the epoch's capacities or the context.
    #[test]
    fn shapes_are_ordered_and_within_the_capacities() {
        let l = limits();
        let all: Vec<Vec<Span>> = shapes(&l, 3, 256).collect();
        // Decoders 1..=16, then 3 verifier spans, then 256 chunks, then the mixed epochs.
        assert_eq!(all[0].len(), 1);
        assert_eq!(all[15].len(), 16);
        assert!(all[..16].iter().all(|e| e.iter().all(|s| s.count == 1)));
        assert_eq!(all[16][0].count, 2);
        assert_eq!(all[18][0].count, 4);
        assert_eq!(all[19][0].count, 1);
        assert_eq!(all[19 + 255][0].count, 256);
        for e in &all {
            assert!(e.len() as u32 <= l.epoch_spans);
            assert!(e.iter().map(|s| s.count).sum::<u32>() <= l.epoch_tokens);
            assert!(
                e.iter()
                    .all(|s| s.position + s.count <= l.context && s.logits <= s.count)
            );
        }
        // The mixed epochs: 15 decoders first, joined by chunks from 1 token up.
        let mixed = &all[19 + 256];
        assert_eq!(mixed.len(), 16);
        assert_eq!((mixed[0].count, mixed[15].count), (1, 1));
        assert_eq!(all[19 + 256 + 1][15].count, 2);
        // A tiny context still fits.
        let small = Limits {
            context: 8,
            ..limits()
        };
        for e in shapes(&small, 3, 256) {
            assert!(e.iter().all(|s| s.position + s.count <= 8), "{e:?}");
        }
    }
}
