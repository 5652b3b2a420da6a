//! [`RetainedService`]: admission, the page pool, and the engine thread that runs a model's epochs.
//!
//! One engine thread per model owns every sequence and the page pool (no locks on the hot path); callers send
//! it requests over a channel and receive [`Event`]s on their own. Each epoch: drop cancelled sequences (their
//! pages are freed), admit waiting requests, plan ([`super::engine::plan_epoch`]), reserve pages for every
//! span (a sequence that cannot get a page waits, or the youngest running sequence is preempted and later
//! recomputed), run `epoch` and `run`, wait for the device, then commit each span's progress and draw the next
//! token of every span that asked for logits. Progress is committed only after the device work completed, so
//! a failed epoch leaves every sequence's committed state as it was.

use super::engine::{PlannedSpan, Progress, plan_epoch, propose};
use super::pages::{PagePool, PageTable};
use super::prefix::PrefixCache;
use super::sampling::{Sample, Sampler, SamplingParams};
use super::sessions::{SessionError, SessionInfo, SessionOp};
use super::text::{StopMatcher, Utf8Stream};
use super::{EPOCH, EpochInput, Limits, RUN};
use crate::thread::EngineThread;
use loom_vm::Value;
use serve_runtime::contract::{Histogram, KeptState, LATENCY_BUCKETS, Series, Service};
use serve_runtime::device::DeviceBuffer;
use serve_runtime::model::Model;
use serve_runtime::{Error, Result};
use std::any::Any;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

/// One generation request, tokenized.
#[derive(Debug, Clone)]
pub struct GenRequest {
    pub prompt: Vec<u32>,
    /// The sampling parameters; choice `i` draws from stream `i` of `sampling.seed`.
    pub sampling: SamplingParams,
    /// The most tokens each choice may draw (the terminal token included).
    pub max_tokens: u32,
    pub stop: Vec<String>,
    /// Choices to generate (OpenAI's `n`).
    pub n: u32,
    /// Keep drawing after the terminal token (it is then ordinary output).
    pub ignore_eos: bool,
    /// Score the prompt: each choice first gets an [`Event::Prompt`] with the log probability of every prompt
    /// token after the first (`max_tokens` may then be 0). Needs a package that declares
    /// `options.multi_row_logits`.
    pub prompt_logprobs: bool,
}

/// Why a choice ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// The terminal token or a stop string.
    Stop,
    /// `max_tokens`, or the model's context is full.
    Length,
}

impl Finish {
    pub fn name(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
        }
    }
}

/// What a request's receiver gets, per choice `index`, in order.
#[derive(Debug, Clone)]
pub enum Event {
    /// The prompt's tokens after the first, each with its log probability given the tokens before it (and the
    /// most likely tokens there); before the choice's first `Delta` (only when `prompt_logprobs` was asked).
    Prompt { index: u32, samples: Vec<Sample> },
    /// Final text (possibly empty: held back while it may begin a stop string) and the tokens drawn.
    Delta {
        index: u32,
        text: String,
        samples: Vec<Sample>,
    },
    /// The choice ended, after `completion_tokens` tokens.
    Done {
        index: u32,
        finish: Finish,
        completion_tokens: u32,
    },
    /// The request failed; no more events follow for any of its choices.
    Failed(Error),
}

/// Where a request's events go (called on the engine thread; it must not block).
pub type EventSink = Arc<dyn Fn(Event) + Send + Sync>;

/// The caller's handle on a submitted request.
#[derive(Debug, Clone)]
pub struct Ticket {
    cancelled: Arc<AtomicBool>,
    pub prompt_tokens: u32,
}

impl Ticket {
    /// The client is gone: the request's sequences stop at the next epoch and free their pages.
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::Relaxed);
    }
}

/// Counters exported as Prometheus series.
#[derive(Debug)]
pub struct Metrics {
    pub requests: AtomicU64,
    pub failed: AtomicU64,
    pub refused: AtomicU64,
    pub cancelled: AtomicU64,
    pub preempted: AtomicU64,
    pub waiting: AtomicU64,
    pub running: AtomicU64,
    pub pages_used: AtomicU64,
    pub pages_cached: AtomicU64,
    pub prefix_hit_tokens: AtomicU64,
    /// Shared frontier pages copied on write (a session's partial last page, continued by an append).
    pub pages_copied: AtomicU64,
    pub sessions: AtomicU64,
    pub pages_capacity: AtomicU64,
    pub prefill_tokens: AtomicU64,
    pub decode_tokens: AtomicU64,
    pub epochs: AtomicU64,
    pub epoch_ns: AtomicU64,
    /// Proposed tokens verified (speculative verify) and those of them kept.
    pub spec_proposed: AtomicU64,
    pub spec_accepted: AtomicU64,
    /// Admission to each choice's first token.
    pub ttft: Histogram,
    /// Between a choice's consecutive tokens.
    pub itl: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            preempted: AtomicU64::new(0),
            waiting: AtomicU64::new(0),
            running: AtomicU64::new(0),
            pages_used: AtomicU64::new(0),
            pages_cached: AtomicU64::new(0),
            prefix_hit_tokens: AtomicU64::new(0),
            pages_copied: AtomicU64::new(0),
            sessions: AtomicU64::new(0),
            pages_capacity: AtomicU64::new(0),
            prefill_tokens: AtomicU64::new(0),
            decode_tokens: AtomicU64::new(0),
            epochs: AtomicU64::new(0),
            epoch_ns: AtomicU64::new(0),
            spec_proposed: AtomicU64::new(0),
            spec_accepted: AtomicU64::new(0),
            ttft: Histogram::new(LATENCY_BUCKETS),
            itl: Histogram::new(LATENCY_BUCKETS),
        }
    }
}

impl Metrics {
    fn series(&self) -> Vec<Series> {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        let s = Series::sample;
        let cap = g(&self.pages_capacity).max(1.0);
        vec![
            s(
                "loom_text_requests_total",
                "text requests admitted",
                "counter",
                g(&self.requests),
            ),
            s(
                "loom_text_requests_failed_total",
                "text requests that failed",
                "counter",
                g(&self.failed),
            ),
            s(
                "loom_text_requests_refused_total",
                "text requests refused because the queue was full",
                "counter",
                g(&self.refused),
            ),
            s(
                "loom_text_requests_cancelled_total",
                "text sequences cancelled by their client",
                "counter",
                g(&self.cancelled),
            ),
            s(
                "loom_text_preemptions_total",
                "running sequences whose pages were taken for older ones (recomputed later)",
                "counter",
                g(&self.preempted),
            ),
            s(
                "loom_text_waiting",
                "sequences waiting for admission",
                "gauge",
                g(&self.waiting),
            ),
            s(
                "loom_text_running",
                "sequences being generated",
                "gauge",
                g(&self.running),
            ),
            s(
                "loom_text_pages_used",
                "pages of the page pool held by sequences (shared pages once)",
                "gauge",
                g(&self.pages_used),
            ),
            s(
                "loom_text_prefix_cache_pages",
                "full pages kept for prefix sharing (shared with the sequences that read them)",
                "gauge",
                g(&self.pages_cached),
            ),
            s(
                "loom_text_prefix_hit_tokens_total",
                "prompt tokens whose state was found in shared pages instead of computed",
                "counter",
                g(&self.prefix_hit_tokens),
            ),
            s(
                "loom_text_pages_copied_total",
                "shared partial pages copied on write (a session's frontier page continued by an append)",
                "counter",
                g(&self.pages_copied),
            ),
            s(
                "loom_text_sessions",
                "sessions alive (their pinned pages count in loom_text_pages_used)",
                "gauge",
                g(&self.sessions),
            ),
            s(
                "loom_text_pages_capacity",
                "pages in the page pool",
                "gauge",
                g(&self.pages_capacity),
            ),
            s(
                "loom_text_page_pool_usage_ratio",
                "fraction of the page pool in use",
                "gauge",
                g(&self.pages_used) / cap,
            ),
            s(
                "loom_text_prefill_tokens_total",
                "prompt tokens processed",
                "counter",
                g(&self.prefill_tokens),
            ),
            s(
                "loom_text_decode_tokens_total",
                "generated tokens processed",
                "counter",
                g(&self.decode_tokens),
            ),
            s(
                "loom_text_epochs_total",
                "epochs run",
                "counter",
                g(&self.epochs),
            ),
            s(
                "loom_text_epoch_seconds_total",
                "time spent in epochs (packing, device, sampling)",
                "counter",
                g(&self.epoch_ns) / 1e9,
            ),
            s(
                "loom_text_speculative_proposed_tokens_total",
                "proposed tokens (prompt lookup) verified by the model",
                "counter",
                g(&self.spec_proposed),
            ),
            s(
                "loom_text_speculative_accepted_tokens_total",
                "proposed tokens kept because the sequence's own draw agreed with them",
                "counter",
                g(&self.spec_accepted),
            ),
            self.ttft.series(
                "loom_text_time_to_first_token_seconds",
                "time from admission to each choice's first token",
            ),
            self.itl.series(
                "loom_text_inter_token_latency_seconds",
                "time between a choice's consecutive tokens",
            ),
        ]
    }
}

/// The most proposed tokens a decoder may verify in one epoch.
const MAX_SPECULATIVE: u64 = 64;

/// Speculative verify fills an epoch up to this many token rows (decoders' pending tokens and proposals).
const SPECULATIVE_ROWS: u32 = 8;

/// Prompt lookup: n-grams of this many tokens (the longest that occurs first) propose what followed them.
const LOOKUP_NGRAM: (usize, usize) = (2, 4);

type SessionReply = std::result::Result<Vec<SessionInfo>, SessionError>;

enum Cmd {
    Submit(Box<Admitted>),
    /// An append to session `id`: `Admitted`'s prompt is the new tokens; the reply is the whole prompt's length.
    Append {
        id: String,
        admitted: Box<Admitted>,
        reply: mpsc::Sender<std::result::Result<u32, SessionError>>,
    },
    Session {
        id: String,
        op: SessionOp,
        reply: mpsc::Sender<SessionReply>,
    },
    /// Finish what is accepted, then stop, sending back the sessions (their tokens and checkpoints; the pool
    /// and its pins go with the engine).
    Drain(mpsc::Sender<KeptSessions>),
}

/// Idle sessions are deleted after this long unless the model's `options.session_idle_seconds` says otherwise.
pub const SESSION_IDLE: Duration = Duration::from_secs(600);

/// Session ids (`sess-N`) are unique in the process, across models and contracts.
pub static NEXT_SESSION: AtomicU64 = AtomicU64::new(1);

/// A session's (or a checkpoint's) references into the pool: one on each cached full page of its tokens, in
/// order (`pins`), and one on its partial frontier page (`tail`), if it has one.
#[derive(Debug, Clone, Default)]
struct Held {
    pins: Vec<u32>,
    tail: Option<Tail>,
}

/// A partial frontier page: `page` holds the state of the tokens from the last full page's end up to `tokens`
/// (exclusive; not a page boundary). Nothing writes it any more: a sequence that continues from it writes into a
/// copy (copy on write), so any number of sessions, forks and checkpoints can share it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tail {
    page: u32,
    tokens: u32,
}

impl Held {
    /// Every page it references, the tail's last.
    fn pages(&self) -> Vec<u32> {
        let mut v = self.pins.clone();
        v.extend(self.tail.map(|t| t.page));
        v
    }
}

/// A session on the engine thread (see [`super::sessions`]).
struct Session {
    tokens: Vec<u32>,
    /// Its references into the pool.
    held: Held,
    /// By name: the tokens at the checkpoint and their references.
    checkpoints: BTreeMap<String, (Vec<u32>, Held)>,
    last_used: Instant,
    busy: bool,
}

struct Admitted {
    req: GenRequest,
    events: EventSink,
    cancelled: Arc<AtomicBool>,
    arrived: Instant,
}

/// A model serving the retained-text contract.
pub struct RetainedService {
    /// The package's stage writes several logits rows per span (`options.multi_row_logits`).
    multi_row: bool,
    pub model: Arc<Model>,
    pub limits: Limits,
    pub metrics: Arc<Metrics>,
    /// Pages in the pool.
    pub pool_pages: u32,
    /// The package's chat template (`assets.chat_template`), if it has one.
    pub chat: Option<super::chat::ChatTemplate>,
    /// The engine thread; drained, it hands back the sessions (for a deactivation: [`Service::kept_state`]).
    engine: EngineThread<Cmd, KeptSessions>,
    /// Stops the compilation of epoch shapes ahead of requests ([`super::warm`]).
    warm_stop: Arc<AtomicBool>,
}

/// Sessions kept across a deactivation: each one's id, tokens and checkpoints (name, tokens). Their pages are
/// not kept (deactivation releases the model's device memory, the page pool with it): after the activation each
/// session's next append computes its tokens' state again, as a fresh request over the same tokens would, so
/// what it generates is unchanged.
#[derive(Debug, Default)]
pub struct KeptSessions(Vec<KeptSession>);

/// One kept session: its id, its tokens, and its checkpoints (name, tokens).
pub type KeptSession = (String, Vec<u32>, Vec<(String, Vec<u32>)>);

impl KeptSessions {
    /// Whether no session is kept.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for RetainedService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetainedService")
            .field("model", &self.model.name)
            .finish_non_exhaustive()
    }
}

/// The share of the model's unused budget (after cold preparation placed its parameters) the page pool takes;
/// the rest is for each epoch's buffers.
const POOL_SHARE: (u64, u64) = (3, 4);

impl RetainedService {
    /// Allocates the page pool and starts the engine thread.
    pub fn start(model: Arc<Model>, limits: Limits) -> Result<Arc<RetainedService>> {
        RetainedService::resume(model, limits, KeptSessions::default())
    }

    /// [`start`](Self::start) with the sessions a deactivated service kept: same ids, tokens and checkpoints,
    /// no pages (see [`KeptSessions`]); their idle clocks start again.
    pub fn resume(
        model: Arc<Model>,
        limits: Limits,
        kept: KeptSessions,
    ) -> Result<Arc<RetainedService>> {
        let free = model.budget.limit.saturating_sub(model.budget.used());
        let pool_pages =
            (free / POOL_SHARE.1 * POOL_SHARE.0 / limits.page_bytes).min(u32::MAX as u64) as u32;
        let per_seq = limits.context.div_ceil(limits.page_tokens);
        if pool_pages < per_seq.min(2) || pool_pages == 0 {
            return Err(Error::Program(format!(
                "model `{}`: its memory budget leaves {free} device bytes after its parameters, {pool_pages} \
                 pages of {} bytes; raise memory.device_bytes",
                model.name, limits.page_bytes
            )));
        }
        let multi_row = match model.options().get("multi_row_logits") {
            None => false,
            Some(v) => v.as_bool().ok_or_else(|| {
                Error::package(
                    "model.json",
                    "options.multi_row_logits",
                    "expected true or false (whether the package's stage honours a span's logit_count)",
                )
            })?,
        };
        let speculate = match model.options().get("speculative_tokens") {
            None => 0,
            Some(v) => v
                .as_u64()
                .filter(|&k| k <= MAX_SPECULATIVE)
                .filter(|&k| k < u64::from(limits.epoch_tokens))
                .ok_or_else(|| {
                    Error::package(
                        "model.json",
                        "options.speculative_tokens",
                        format!(
                            "expected a whole number of proposed tokens from 0 to {} (at most {MAX_SPECULATIVE} \
                             and below the epoch token capacity {})",
                            (MAX_SPECULATIVE).min(u64::from(limits.epoch_tokens) - 1),
                            limits.epoch_tokens
                        ),
                    )
                })? as u32,
        };
        if speculate > 0 && !multi_row {
            return Err(Error::package(
                "model.json",
                "options.speculative_tokens",
                "speculative verify needs a package whose stage writes a logits row per verified token: set \
                 options.multi_row_logits to true only if it does",
            ));
        }
        let prefill_chunk = match model.options().get("prefill_chunk_tokens") {
            None => limits.epoch_tokens,
            Some(v) => v
                .as_u64()
                .filter(|&n| n >= 1 && n <= u64::from(limits.epoch_tokens))
                .ok_or_else(|| {
                    Error::package(
                        "model.json",
                        "options.prefill_chunk_tokens",
                        format!(
                            "expected a whole number of prompt tokens from 1 to the epoch token capacity {}",
                            limits.epoch_tokens
                        ),
                    )
                })? as u32,
        };
        let warm_budget = super::warm::budget(&model)?;
        let chat = match model.asset("chat_template")? {
            Some(bytes) => {
                let text = String::from_utf8(bytes).map_err(|_| {
                    Error::package(
                        "model.json",
                        "assets.chat_template",
                        "the chat template is not UTF-8",
                    )
                })?;
                Some(
                    super::chat::ChatTemplate::new("assets.chat_template", &text, "", "")
                        .map_err(|m| Error::package("model.json", "assets.chat_template", m))?,
                )
            }
            None => None,
        };
        let pool = model
            .device
            .alloc(u64::from(pool_pages) * limits.page_bytes, &model.budget)?;
        let metrics = Arc::new(Metrics::default());
        metrics
            .pages_capacity
            .store(u64::from(pool_pages), Ordering::Relaxed);
        let engine = Engine {
            model: model.clone(),
            limits,
            metrics: metrics.clone(),
            pool: PagePool::new(pool_pages),
            prefix: PrefixCache::default(),
            pool_buf: pool,
            pool_pages,
            output: None,
            waiting: VecDeque::new(),
            running: Vec::new(),
            next_id: 0,
            sessions: kept
                .0
                .into_iter()
                .map(|(id, tokens, checkpoints)| {
                    let s = Session {
                        tokens,
                        held: Held::default(),
                        checkpoints: checkpoints
                            .into_iter()
                            .map(|(name, t)| (name, (t, Held::default())))
                            .collect(),
                        last_used: Instant::now(),
                        busy: false,
                    };
                    (id, s)
                })
                .collect(),
            session_idle: model
                .options()
                .get("session_idle_seconds")
                .and_then(serde_json::Value::as_f64)
                .filter(|s| *s > 0.0)
                .map_or(SESSION_IDLE, Duration::from_secs_f64),
            speculate,
            prefill_chunk,
        };
        metrics
            .sessions
            .store(engine.sessions.len() as u64, Ordering::Relaxed);
        let engine = EngineThread::spawn(&model.name, format!("text-{}", model.name), move |rx| {
            engine.run(rx)
        })?;
        log::info!(
            "model {}: page pool of {pool_pages} pages ({} tokens, {} bytes each)",
            model.name,
            limits.page_tokens,
            limits.page_bytes
        );
        let warm_stop = super::warm::start(
            &model,
            metrics.clone(),
            limits,
            pool_pages,
            speculate,
            prefill_chunk,
            warm_budget,
        );
        Ok(Arc::new(RetainedService {
            warm_stop,
            multi_row,
            model,
            limits,
            metrics,
            pool_pages,
            chat,
            engine,
        }))
    }

    /// The longest prompt a request may have (one token of the context is left to generate).
    pub fn max_prompt(&self) -> u32 {
        self.limits
            .context
            .min(self.pool_pages.saturating_mul(self.limits.page_tokens))
            .saturating_sub(1)
    }

    /// Checks and queues `req`; its events arrive on `events`. Errors: an empty or too long prompt, invalid
    /// sampling parameters (400), a full queue (`Overloaded`).
    pub fn submit(&self, req: GenRequest, events: EventSink) -> Result<Ticket> {
        if req.prompt.is_empty() {
            return Err(Error::BadRequest("the prompt is empty".into()));
        }
        self.check(&req)?;
        let (cmd, ticket) = self.admitted(req, events);
        self.engine.send(Cmd::Submit(cmd))?;
        Ok(ticket)
    }

    /// Appends `req.prompt` to session `id` and generates after it (`req.n` must be 1): a sequence over the
    /// session's tokens and the new ones, which reads the session's pages and computes only what follows them.
    /// When it finishes the session holds every token it knows (the terminal token excepted).
    pub fn append(
        &self,
        id: &str,
        req: GenRequest,
        events: EventSink,
    ) -> std::result::Result<Ticket, SessionError> {
        if req.n != 1 {
            return Err(
                Error::BadRequest("an append generates one choice (`n` must be 1)".into()).into(),
            );
        }
        self.check(&req)?;
        let (admitted, mut ticket) = self.admitted(req, events);
        let r = self
            .engine
            .ask(|reply| Cmd::Append {
                id: id.to_string(),
                admitted,
                reply,
            })
            .map_err(SessionError::from)
            .and_then(|r| r);
        match r {
            Ok(prompt_tokens) => {
                ticket.prompt_tokens = prompt_tokens;
                Ok(ticket)
            }
            Err(e) => {
                self.metrics.waiting.fetch_sub(1, Ordering::Relaxed);
                Err(e)
            }
        }
    }

    /// Runs a session operation on the engine thread.
    pub fn session(&self, id: &str, op: SessionOp) -> SessionReply {
        if let SessionOp::Create { tokens } | SessionOp::Extend { tokens } = &op {
            self.check_tokens(tokens)?;
        }
        let (reply, rx) = mpsc::channel();
        self.engine.send(Cmd::Session {
            id: id.to_string(),
            op,
            reply,
        })?;
        rx.recv()
            .unwrap_or_else(|_| Err(SessionError::NotFound(format!("no session `{id}`"))))
    }

    fn check_tokens(&self, tokens: &[u32]) -> Result<()> {
        let max = self.max_prompt();
        if tokens.len() as u64 > u64::from(max) {
            return Err(Error::TooLarge(format!(
                "the prompt is {} tokens; model `{}` takes at most {max} (its context is {} tokens)",
                tokens.len(),
                self.model.name,
                self.limits.context
            )));
        }
        if let Some(bad) = tokens.iter().find(|&&t| t >= self.limits.vocab) {
            return Err(Error::BadRequest(format!(
                "token {bad} is outside the vocabulary of {}",
                self.limits.vocab
            )));
        }
        Ok(())
    }

    /// Checks everything about `req` but whether its prompt is empty.
    fn check(&self, req: &GenRequest) -> Result<()> {
        self.check_tokens(&req.prompt)?;
        req.sampling
            .validate(self.limits.vocab as usize)
            .map_err(Error::BadRequest)?;
        if req.n == 0 || req.n > 16 {
            return Err(Error::BadRequest(format!(
                "`n` must be between 1 and 16, got {}",
                req.n
            )));
        }
        if req.prompt_logprobs && !self.multi_row {
            return Err(Error::BadRequest(format!(
                "model `{}` cannot score prompt tokens (`echo` with `logprobs`): its package does not declare \
                 options.multi_row_logits",
                self.model.name
            )));
        }
        if req.max_tokens == 0 && !req.prompt_logprobs {
            return Err(Error::BadRequest(
                "`max_tokens` must be at least 1 (0 only to score the prompt: with `echo` and `logprobs`)".into(),
            ));
        }
        let waiting = self.metrics.waiting.load(Ordering::Relaxed);
        if waiting >= self.model.doc.capacities.max_queue as u64 {
            self.metrics.refused.fetch_add(1, Ordering::Relaxed);
            return Err(Error::Overloaded(format!(
                "model `{}` has {waiting} sequences waiting (capacities.max_queue)",
                self.model.name
            )));
        }
        Ok(())
    }

    /// The engine's form of a checked request, and its ticket (counted as waiting).
    fn admitted(&self, req: GenRequest, events: EventSink) -> (Box<Admitted>, Ticket) {
        let cancelled = Arc::new(AtomicBool::new(false));
        let prompt_tokens = req.prompt.len() as u32;
        self.metrics
            .waiting
            .fetch_add(u64::from(req.n), Ordering::Relaxed);
        self.metrics.requests.fetch_add(1, Ordering::Relaxed);
        let cmd = Box::new(Admitted {
            req,
            events,
            cancelled: cancelled.clone(),
            arrived: Instant::now(),
        });
        (
            cmd,
            Ticket {
                cancelled,
                prompt_tokens,
            },
        )
    }

    /// Token ids for `text` (the package's tokenizer, special tokens matched; bytes without one).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        encode(&self.model, text)
    }

    /// Stops accepting requests, finishes every accepted one, and joins the engine. Idempotent.
    pub fn drain(&self) {
        self.warm_stop.store(true, Ordering::Relaxed);
        self.engine.drain(Cmd::Drain)
    }
}

impl Service for RetainedService {
    fn model(&self) -> &Arc<Model> {
        &self.model
    }

    fn drain(&self) {
        RetainedService::drain(self)
    }

    fn series(&self) -> Vec<Series> {
        self.metrics.series()
    }

    fn as_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }

    fn kept_state(&self) -> Option<KeptState> {
        let k = self.engine.take_kept()?;
        (!k.is_empty()).then(|| Box::new(k) as KeptState)
    }
}

/// One generated choice.
struct Seq {
    id: u64,
    index: u32,
    tokens: Vec<u32>,
    prompt_len: u32,
    table: PageTable,
    sampler: Sampler,
    stop: StopMatcher,
    utf8: Utf8Stream,
    max_tokens: u32,
    ignore_eos: bool,
    events: EventSink,
    cancelled: Arc<AtomicBool>,
    arrived: Instant,
    last_token: Option<Instant>,
    /// Tokens drawn so far.
    generated: u32,
    /// The chain hash of each full page of `table` known to the prefix cache, in order.
    hashes: Vec<u64>,
    /// The session this sequence appends to.
    session: Option<String>,
    /// Proposed tokens after `tokens`, verified by the next epoch (speculative verify).
    proposal: Vec<u32>,
    /// Its session's frontier page (one pool reference), copied into its own page when it is admitted.
    tail: Option<Tail>,
    /// The prompt is scored ([`GenRequest::prompt_logprobs`]): the log probabilities found so far (prompt
    /// positions 1 ..= their count), sent in one [`Event::Prompt`] when the last is known.
    scored: Option<Vec<Sample>>,
}

impl Seq {
    fn progress(&self) -> Progress {
        Progress {
            known: self.tokens.len() as u32,
            committed: self.table.tokens,
            proposed: self.proposal.len() as u32,
        }
    }
}

struct Engine {
    model: Arc<Model>,
    limits: Limits,
    metrics: Arc<Metrics>,
    pool: PagePool,
    /// Full pages by token content, shared between sequences (see `super::prefix`).
    prefix: PrefixCache,
    pool_buf: DeviceBuffer,
    pool_pages: u32,
    /// Sequences not admitted yet (their requests' order).
    waiting: VecDeque<Seq>,
    /// Admitted sequences, oldest first.
    running: Vec<Seq>,
    next_id: u64,
    sessions: HashMap<String, Session>,
    session_idle: Duration,
    /// The most proposed tokens a decoder verifies per epoch (`options.speculative_tokens`; 0: none).
    speculate: u32,
    /// The most prompt tokens an epoch takes while sequences decode (`options.prefill_chunk_tokens`).
    prefill_chunk: u32,
    /// The last epoch's logits buffer, used again by the next epoch of the same size (decoding streams ask for
    /// the same rows epoch after epoch): a fresh one would be allocated and cleared, megabytes at a time, only
    /// to be overwritten. Released when the engine idles.
    output: Option<DeviceBuffer>,
}

impl Engine {
    fn run(mut self, rx: mpsc::Receiver<Cmd>) {
        let mut drain: Option<mpsc::Sender<KeptSessions>> = None;
        loop {
            if self.waiting.is_empty() && self.running.is_empty() {
                // An idle model holds no logits buffer against its budget.
                self.output = None;
                if let Some(d) = drain.take() {
                    let _ = d.send(self.keep_sessions());
                    return;
                }
                let c = if self.sessions.is_empty() {
                    rx.recv().map_err(|_| mpsc::RecvTimeoutError::Disconnected)
                } else {
                    rx.recv_timeout(self.session_idle.min(Duration::from_secs(1)))
                };
                match c {
                    Ok(c) => self.command(c, &mut drain),
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    Err(mpsc::RecvTimeoutError::Disconnected) => return,
                }
            }
            self.expire_sessions();
            while let Ok(c) = rx.try_recv() {
                self.command(c, &mut drain);
            }
            self.drop_cancelled();
            self.admit();
            if self.running.is_empty() {
                if !self.waiting.is_empty() {
                    // Nothing runs and the oldest waiting sequence cannot get a page: it never will.
                    let s = self.waiting.pop_front().expect("not empty");
                    self.metrics.waiting.fetch_sub(1, Ordering::Relaxed);
                    self.fail(
                        s,
                        Error::TooLarge(
                            "the sequence needs more pages than the model's page pool holds".into(),
                        ),
                    );
                }
                continue;
            }
            self.epoch();
        }
    }

    fn command(&mut self, c: Cmd, drain: &mut Option<mpsc::Sender<KeptSessions>>) {
        match c {
            Cmd::Drain(d) => *drain = Some(d),
            Cmd::Submit(a) => self.enqueue(*a, None, None),
            Cmd::Append {
                id,
                admitted,
                reply,
            } => {
                let r = self.append(&id, *admitted);
                let _ = reply.send(r);
            }
            Cmd::Session { id, op, reply } => {
                let r = self.session_op(&id, op);
                self.update_pages();
                let _ = reply.send(r);
            }
        }
    }

    /// Queues an append to session `id` (its tokens, then the request's); returns the whole prompt's length.
    fn append(&mut self, id: &str, mut a: Admitted) -> std::result::Result<u32, SessionError> {
        let max = self.limits.context.saturating_sub(1);
        let s = self
            .sessions
            .get_mut(id)
            .ok_or_else(|| SessionError::NotFound(format!("no session `{id}`")))?;
        if s.busy {
            return Err(SessionError::Conflict(format!(
                "session `{id}` is busy with another append"
            )));
        }
        let mut prompt = s.tokens.clone();
        prompt.extend_from_slice(&a.req.prompt);
        if prompt.is_empty() {
            return Err(
                Error::BadRequest("the session and the appended prompt are empty".into()).into(),
            );
        }
        if prompt.len() as u64 > u64::from(max) {
            return Err(Error::TooLarge(format!(
                "the session would hold {} tokens; model `{}` takes at most {max} (its context is {} tokens)",
                prompt.len(),
                self.model.name,
                self.limits.context
            ))
            .into());
        }
        s.busy = true;
        s.last_used = Instant::now();
        let tail = s.held.tail;
        let n = prompt.len() as u32;
        a.req.prompt = prompt;
        self.enqueue(a, Some(id.to_string()), tail);
        Ok(n)
    }

    /// Queues `a`'s choices; an append's (`session`) also start from the session's frontier page `tail`.
    fn enqueue(&mut self, a: Admitted, session: Option<String>, tail: Option<Tail>) {
        {
            {
                let Admitted {
                    req,
                    events,
                    cancelled,
                    arrived,
                } = a;
                for index in 0..req.n {
                    self.next_id += 1;
                    self.waiting.push_back(Seq {
                        id: self.next_id,
                        index,
                        tokens: req.prompt.clone(),
                        prompt_len: req.prompt.len() as u32,
                        table: PageTable::default(),
                        sampler: Sampler::new(req.sampling.clone(), u64::from(index), &req.prompt),
                        stop: StopMatcher::new(req.stop.clone()),
                        utf8: Utf8Stream::default(),
                        max_tokens: req.max_tokens,
                        ignore_eos: req.ignore_eos,
                        events: events.clone(),
                        cancelled: cancelled.clone(),
                        arrived,
                        last_token: None,
                        generated: 0,
                        hashes: Vec::new(),
                        session: session.clone(),
                        proposal: Vec::new(),
                        tail,
                        scored: req.prompt_logprobs.then(Vec::new),
                    });
                    if let Some(t) = tail {
                        self.pool.retain(&[t.page]);
                    }
                }
            }
        }
    }

    /// The cached full pages of `tokens`, retained once more (a session's pins).
    fn pins_for(&mut self, tokens: &[u32]) -> Vec<u32> {
        let pt = self.limits.page_tokens;
        let full = tokens.len() / pt as usize;
        self.prefix
            .lookup(&mut self.pool, tokens, pt, full)
            .into_iter()
            .map(|h| h.0)
            .collect()
    }

    fn session_op(&mut self, id: &str, op: SessionOp) -> SessionReply {
        let pt = self.limits.page_tokens as usize;
        let now = Instant::now();
        let missing = || SessionError::NotFound(format!("no session `{id}`"));
        let info = |id: &str, s: &Session, full: bool| SessionInfo {
            id: id.to_string(),
            token_ids: if full { s.tokens.clone() } else { Vec::new() },
            tokens: s.tokens.len() as u32,
            pages: s.held.pages().len() as u32,
            checkpoints: s
                .checkpoints
                .iter()
                .map(|(n, (t, h))| (n.clone(), t.len() as u32, h.pages().len() as u32))
                .collect(),
            busy: s.busy,
            idle_seconds: now.duration_since(s.last_used).as_secs_f64(),
        };
        let new_session = |this: &mut Engine, tokens: Vec<u32>, held: Held| {
            let id = format!("sess-{}", NEXT_SESSION.fetch_add(1, Ordering::Relaxed));
            let s = Session {
                tokens,
                held,
                checkpoints: BTreeMap::new(),
                last_used: now,
                busy: false,
            };
            let r = info(&id, &s, true);
            this.sessions.insert(id, s);
            this.metrics
                .sessions
                .store(this.sessions.len() as u64, Ordering::Relaxed);
            r
        };
        match op {
            SessionOp::Create { tokens } => {
                let pins = self.pins_for(&tokens);
                Ok(vec![new_session(self, tokens, Held { pins, tail: None })])
            }
            SessionOp::List => {
                let mut v: Vec<SessionInfo> = self
                    .sessions
                    .iter()
                    .map(|(id, s)| info(id, s, false))
                    .collect();
                v.sort_by_key(|i| i.id[5..].parse::<u64>().unwrap_or(0));
                Ok(v)
            }
            SessionOp::Get => {
                let s = self.sessions.get(id).ok_or_else(missing)?;
                Ok(vec![info(id, s, true)])
            }
            SessionOp::Delete => {
                let s = self.sessions.remove(id).ok_or_else(missing)?;
                self.release_session(s);
                Ok(Vec::new())
            }
            SessionOp::Extend { tokens } => {
                let s = self.sessions.get(id).ok_or_else(missing)?;
                if s.busy {
                    return Err(SessionError::Conflict(format!(
                        "session `{id}` is busy with another append"
                    )));
                }
                let mut all = s.tokens.clone();
                all.extend_from_slice(&tokens);
                let max = self.limits.context.saturating_sub(1);
                if all.len() as u64 > u64::from(max) {
                    return Err(Error::TooLarge(format!(
                        "the session would hold {} tokens; model `{}` takes at most {max}",
                        all.len(),
                        self.model.name
                    ))
                    .into());
                }
                let pins = self.pins_for(&all);
                let s = self.sessions.get_mut(id).expect("checked");
                // The frontier page stays valid for the tokens it holds, unless the new tokens completed pages the
                // prefix cache knows (their pins then reach past it).
                let tail = s
                    .held
                    .tail
                    .filter(|t| (t.tokens / pt as u32) as usize == pins.len());
                let old = std::mem::replace(&mut s.held, Held { pins, tail });
                if let Some(t) = tail {
                    self.pool.retain(&[t.page]);
                }
                self.pool.release(&old.pages());
                s.tokens = all;
                s.last_used = now;
                Ok(vec![info(id, s, true)])
            }
            SessionOp::Checkpoint { name } => {
                let s = self.sessions.get_mut(id).ok_or_else(missing)?;
                self.pool.retain(&s.held.pages());
                if let Some((_, old)) = s
                    .checkpoints
                    .insert(name, (s.tokens.clone(), s.held.clone()))
                {
                    self.pool.release(&old.pages());
                }
                s.last_used = now;
                Ok(vec![info(id, s, true)])
            }
            SessionOp::Fork { checkpoint } => {
                let s = self.sessions.get_mut(id).ok_or_else(missing)?;
                s.last_used = now;
                let (tokens, held) = match &checkpoint {
                    None => (s.tokens.clone(), s.held.clone()),
                    Some(c) => s.checkpoints.get(c).cloned().ok_or_else(|| {
                        SessionError::NotFound(format!("session `{id}` has no checkpoint `{c}`"))
                    })?,
                };
                self.pool.retain(&held.pages());
                Ok(vec![new_session(self, tokens, held)])
            }
            SessionOp::RewindCheckpoint { name } => {
                let s = self.sessions.get_mut(id).ok_or_else(missing)?;
                if s.busy {
                    return Err(SessionError::Conflict(format!(
                        "session `{id}` is busy with an append"
                    )));
                }
                let (tokens, held) = s.checkpoints.get(&name).cloned().ok_or_else(|| {
                    SessionError::NotFound(format!("session `{id}` has no checkpoint `{name}`"))
                })?;
                self.pool.retain(&held.pages());
                self.pool.release(&s.held.pages());
                s.tokens = tokens;
                s.held = held;
                s.last_used = now;
                Ok(vec![info(id, s, true)])
            }
            SessionOp::RewindTokens { tokens } => {
                let s = self.sessions.get_mut(id).ok_or_else(missing)?;
                if s.busy {
                    return Err(SessionError::Conflict(format!(
                        "session `{id}` is busy with an append"
                    )));
                }
                let n = tokens as usize;
                if n > s.tokens.len() {
                    return Err(Error::BadRequest(format!(
                        "cannot rewind session `{id}` to {n} tokens: it holds {}",
                        s.tokens.len()
                    ))
                    .into());
                }
                s.tokens.truncate(n);
                // The state of the first n tokens is what it was: whole pages up to n stay pinned, and the page
                // n falls into (a pinned full page or the frontier page) becomes the frontier, shared, holding
                // the tokens up to n (the next append copies it instead of computing them again).
                let old = std::mem::take(&mut s.held);
                let keep = (n / pt).min(old.pins.len());
                let valid = old
                    .tail
                    .map_or(old.pins.len() * pt, |t| t.tokens as usize)
                    .min(n);
                let tail = if !valid.is_multiple_of(pt) && valid / pt == keep {
                    match old.pins.get(keep) {
                        Some(&page) => Some(Tail {
                            page,
                            tokens: valid as u32,
                        }),
                        None => old.tail.map(|t| Tail {
                            page: t.page,
                            tokens: valid as u32,
                        }),
                    }
                } else {
                    None
                };
                s.held = Held {
                    pins: old.pins[..keep].to_vec(),
                    tail,
                };
                self.pool.retain(&s.held.pages());
                self.pool.release(&old.pages());
                s.last_used = now;
                Ok(vec![info(id, s, true)])
            }
        }
    }

    /// Every session's id, tokens and checkpoints, for after a deactivation; their pins are released.
    fn keep_sessions(&mut self) -> KeptSessions {
        let sessions: Vec<(String, Session)> = self.sessions.drain().collect();
        let mut kept = Vec::with_capacity(sessions.len());
        for (id, sess) in sessions {
            let tokens = sess.tokens.clone();
            let checkpoints = sess
                .checkpoints
                .iter()
                .map(|(n, (t, _))| (n.clone(), t.clone()))
                .collect();
            self.release_session(sess);
            kept.push((id, tokens, checkpoints));
        }
        KeptSessions(kept)
    }

    /// Releases a session's pins and its checkpoints' pins.
    fn release_session(&mut self, s: Session) {
        self.pool.release(&s.held.pages());
        for (_, (_, held)) in s.checkpoints {
            self.pool.release(&held.pages());
        }
        self.metrics
            .sessions
            .store(self.sessions.len() as u64, Ordering::Relaxed);
    }

    /// Deletes sessions idle for longer than the idle timeout (never one with an append running).
    fn expire_sessions(&mut self) {
        if self.sessions.is_empty() {
            return;
        }
        let now = Instant::now();
        let idle = self.session_idle;
        let gone: Vec<String> = self
            .sessions
            .iter()
            .filter(|(_, s)| !s.busy && now.duration_since(s.last_used) >= idle)
            .map(|(id, _)| id.clone())
            .collect();
        for id in gone {
            if let Some(s) = self.sessions.remove(&id) {
                log::debug!("model {}: session {id} expired", self.model.name);
                self.release_session(s);
            }
        }
        self.update_pages();
    }

    /// An append's sequence ended: with the tokens it knows (`Some`, the terminal token dropped), or failed or
    /// cancelled (`None`: the session keeps what it had).
    fn settle_session(&mut self, s: &Seq, tokens: Option<Vec<u32>>) {
        let Some(id) = &s.session else { return };
        if !self.sessions.contains_key(id) {
            return;
        }
        let pins = tokens.as_ref().map(|t| self.pins_for(t));
        let pt = self.limits.page_tokens;
        let sess = self.sessions.get_mut(id).expect("checked");
        sess.busy = false;
        sess.last_used = Instant::now();
        if let (Some(tokens), Some(pins)) = (tokens, pins) {
            // The sequence's partial last page becomes the session's frontier: its tokens' state is kept (the
            // caller releases the sequence's own reference after this).
            let valid = s.table.tokens.min(tokens.len() as u32);
            let tail = match s.table.pages.get((valid / pt) as usize) {
                Some(&page) if !valid.is_multiple_of(pt) && (valid / pt) as usize == pins.len() => {
                    Some(Tail {
                        page,
                        tokens: valid,
                    })
                }
                _ => None,
            };
            let old = std::mem::replace(&mut sess.held, Held { pins, tail });
            if let Some(t) = tail {
                self.pool.retain(&[t.page]);
            }
            self.pool.release(&old.pages());
            sess.tokens = tokens;
        }
    }

    fn drop_cancelled(&mut self) {
        let (pool, metrics) = (&mut self.pool, &self.metrics);
        let mut ended = Vec::new();
        self.waiting.retain(|s| {
            let gone = s.cancelled.load(Ordering::Relaxed);
            if gone {
                metrics.waiting.fetch_sub(1, Ordering::Relaxed);
                metrics.cancelled.fetch_add(1, Ordering::Relaxed);
                if let Some(t) = s.tail {
                    pool.release(&[t.page]);
                }
                if s.session.is_some() {
                    ended.push(s.session.clone());
                }
            }
            !gone
        });
        self.running.retain_mut(|s| {
            let gone = s.cancelled.load(Ordering::Relaxed);
            if gone {
                s.table.clear(pool);
                s.hashes.clear();
                metrics.running.fetch_sub(1, Ordering::Relaxed);
                metrics.cancelled.fetch_add(1, Ordering::Relaxed);
                if s.session.is_some() {
                    ended.push(s.session.clone());
                }
            }
            !gone
        });
        for id in ended.into_iter().flatten() {
            if let Some(sess) = self.sessions.get_mut(&id) {
                sess.busy = false;
                sess.last_used = Instant::now();
            }
        }
        self.update_pages();
    }

    /// Moves waiting sequences to running, oldest first, while the pool has the pages for their prompts (so an
    /// admitted sequence can run its prompt; its generated tokens take pages as they come).
    fn admit(&mut self) {
        let pt = self.limits.page_tokens;
        while let Some(s) = self.waiting.front() {
            let need = PageTable::pages_for(s.tokens.len() as u32 + 1, pt);
            let reserved: u32 = self
                .running
                .iter()
                .map(|r| {
                    PageTable::pages_for(r.tokens.len() as u32 + 1, pt)
                        .saturating_sub(r.table.pages.len() as u32)
                })
                .sum();
            if need + reserved > self.pool.free() + self.prefix.evictable(&self.pool) {
                break;
            }
            let s = self.waiting.pop_front().expect("not empty");
            self.metrics.waiting.fetch_sub(1, Ordering::Relaxed);
            self.metrics.running.fetch_add(1, Ordering::Relaxed);
            self.running.push(s);
            let k = self.running.len() - 1;
            self.attach_prefix(k);
        }
    }

    /// Gives running sequence `k`, which holds no pages, the shared pages of its longest cached prefix (whole
    /// pages, leaving at least its last known token to compute, so that it gets logits).
    fn attach_prefix(&mut self, k: usize) {
        let pt = self.limits.page_tokens;
        let s = &mut self.running[k];
        if !s.table.pages.is_empty() || s.table.tokens != 0 {
            return;
        }
        // A scored prompt needs the logits after every token: nothing is taken from the prefix cache.
        let max_pages = if s.scored.is_some() {
            0
        } else {
            (s.tokens.len().saturating_sub(1)) / pt as usize
        };
        let hits = self.prefix.lookup(&mut self.pool, &s.tokens, pt, max_pages);
        let tail = s.tail.take();
        let scored = s.scored.is_some();
        s.table.pages = hits.iter().map(|h| h.0).collect();
        s.table.tokens = hits.len() as u32 * pt;
        s.hashes = hits.iter().map(|h| h.1).collect();
        // An append continues from its session's frontier page: a copy of it (the original stays shared and
        // unwritten) holds the tokens after the full pages, at least the last known token left to compute.
        if let Some(t) = tail {
            let valid = t.tokens.min(s.tokens.len() as u32 - 1);
            if !scored && valid / pt == hits.len() as u32 && !valid.is_multiple_of(pt) {
                match self.copy_page(t.page) {
                    Ok(page) => {
                        let s = &mut self.running[k];
                        s.table.pages.push(page);
                        s.table.tokens = valid;
                        self.metrics.pages_copied.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => log::debug!(
                        "model {}: no copy of a frontier page ({e}); its tokens are computed again",
                        self.model.name
                    ),
                }
            }
            self.pool.release(&[t.page]);
        }
        self.metrics
            .prefix_hit_tokens
            .fetch_add(u64::from(self.running[k].table.tokens), Ordering::Relaxed);
    }

    /// A new page holding what `page` holds (copy on write of a shared frontier page). Pages run short: the
    /// idle cached ones are evicted first; none is preempted for it.
    fn copy_page(&mut self, page: u32) -> Result<u32> {
        if self.pool.free() == 0 {
            self.prefix.evict(&mut self.pool, 1);
        }
        copy_pool_page(
            &self.model,
            &self.pool_buf,
            &mut self.pool,
            self.limits.page_bytes,
            page,
        )?
        .ok_or_else(|| Error::Internal("no free page".into()))
    }

    /// Sets running sequence `k`'s proposals for the next epoch: prompt lookup over its own tokens when it is
    /// decoding (one pending token), at most `speculate` and `budget` of them and never more than it may still
    /// generate. Returns how many it proposes.
    fn propose(&mut self, k: usize, budget: u32) -> u32 {
        let s = &mut self.running[k];
        s.proposal.clear();
        let known = s.tokens.len() as u32;
        if self.speculate == 0 || budget == 0 || s.generated == 0 || known != s.table.tokens + 1 {
            return 0;
        }
        // Each verified row draws a token: the pending one's row and one per proposal.
        let room = (s.max_tokens.saturating_sub(s.generated))
            .min(self.limits.context.saturating_sub(known))
            .saturating_sub(1);
        let k = self.speculate.min(room).min(budget) as usize;
        s.proposal = propose(&s.tokens, k, LOOKUP_NGRAM.0, LOOKUP_NGRAM.1);
        s.proposal.len() as u32
    }

    /// The page gauges: pages held by sequences, and pages the prefix cache knows.
    fn update_pages(&self) {
        let idle = self.prefix.evictable(&self.pool);
        self.metrics
            .pages_used
            .store(u64::from(self.pool.used() - idle), Ordering::Relaxed);
        self.metrics
            .pages_cached
            .store(self.prefix.len() as u64, Ordering::Relaxed);
    }

    fn fail(&mut self, mut s: Seq, e: Error) {
        self.settle_session(&s, None);
        s.table.clear(&mut self.pool);
        if let Some(t) = s.tail.take() {
            self.pool.release(&[t.page]);
        }
        self.update_pages();
        self.metrics.failed.fetch_add(1, Ordering::Relaxed);
        (s.events)(Event::Failed(e));
    }

    fn epoch(&mut self) {
        let t0 = Instant::now();
        let pt = self.limits.page_tokens;
        for k in 0..self.running.len() {
            self.attach_prefix(k);
        }
        // Proposals only fill a small epoch: past SPECULATIVE_ROWS decoders' rows, the epoch's dots are no longer
        // bound by reading the weights once, and verifying costs the neighbours' time (oldest sequences first).
        // With that many decoders no lookup runs at all.
        let decoders = self
            .running
            .iter()
            .filter(|s| s.tokens.len() as u32 == s.table.tokens + 1)
            .count() as u32;
        let mut budget = SPECULATIVE_ROWS.saturating_sub(decoders);
        for k in 0..self.running.len() {
            budget -= self.propose(k, budget);
        }
        let progress: Vec<Progress> = self.running.iter().map(Seq::progress).collect();
        let mut plan = plan_epoch(
            &progress,
            self.limits.epoch_tokens,
            self.limits.epoch_spans,
            self.prefill_chunk,
        );
        // A scored prompt's chunks ask for the logits after each of their tokens (until every prompt token's log
        // probability is known: a preempted sequence computes its prompt again without asking twice).
        for sp in &mut plan {
            let s = &self.running[sp.seq];
            if let Some(scored) = &s.scored
                && (scored.len() as u32) + 1 < s.prompt_len
                && sp.position < s.prompt_len
            {
                sp.every_row = true;
            }
        }
        // Pages for every span, oldest sequence first. A span that cannot get them takes the pages of the
        // youngest running sequence younger than itself (which is then recomputed from its tokens later); with
        // none to take, it waits for pages (or fails, when the whole pool could not hold it).
        let mut i = 0;
        while i < plan.len() {
            let sp = plan[i];
            let reserved = loop {
                let sp = plan[i];
                match self.running[sp.seq]
                    .table
                    .reserve(&mut self.pool, sp.count, pt)
                {
                    Ok(()) => break true,
                    // Proposals are verified only with pages to spare: none is evicted or preempted for them.
                    Err(_) if sp.verify > 0 => {
                        plan[i].count -= sp.verify;
                        plan[i].verify = 0;
                    }
                    Err(e) if self.prefix.evict(&mut self.pool, e.needed - e.free) > 0 => continue,
                    Err(_) => {
                        let younger = (sp.seq + 1..self.running.len())
                            .rev()
                            .find(|&k| !self.running[k].table.pages.is_empty());
                        let Some(k) = younger else { break false };
                        self.running[k].table.clear(&mut self.pool);
                        self.running[k].hashes.clear();
                        self.metrics.preempted.fetch_add(1, Ordering::Relaxed);
                        log::debug!(
                            "model {}: preempted sequence {} for pages",
                            self.model.name,
                            self.running[k].id
                        );
                        plan.retain(|p| p.seq != k);
                    }
                }
            };
            if reserved {
                i += 1;
                continue;
            }
            plan.remove(i);
            let s = &self.running[sp.seq];
            if PageTable::pages_for(s.tokens.len() as u32, pt) > self.pool.capacity() {
                let s = self.running.remove(sp.seq);
                self.metrics.running.fetch_sub(1, Ordering::Relaxed);
                self.fail(
                    s,
                    Error::TooLarge(
                        "the sequence needs more pages than the model's page pool holds".into(),
                    ),
                );
                // Indices after the removed sequence shift down by one.
                for p in &mut plan {
                    if p.seq > sp.seq {
                        p.seq -= 1;
                    }
                }
            }
        }
        if plan.is_empty() {
            return;
        }
        self.update_pages();
        let t_planned = Instant::now();
        match self.run_epoch(&plan) {
            Ok(rows) => {
                let t_ran = Instant::now();
                self.commit(&plan, rows.as_f32());
                log::trace!(
                    "model {}: epoch host work: planning {} us, commit {} us",
                    self.model.name,
                    t_planned.duration_since(t0).as_micros(),
                    t_ran.elapsed().as_micros()
                );
            }
            Err(e) => {
                log::debug!(
                    "model {}: epoch of {} spans failed: {e}",
                    self.model.name,
                    plan.len()
                );
                let mut idx: Vec<usize> = plan.iter().map(|p| p.seq).collect();
                idx.sort_unstable();
                for k in idx.into_iter().rev() {
                    let s = self.running.remove(k);
                    self.metrics.running.fetch_sub(1, Ordering::Relaxed);
                    self.fail(s, e.clone());
                }
            }
        }
        self.update_pages();
        self.metrics.epochs.fetch_add(1, Ordering::Relaxed);
        self.metrics
            .epoch_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    /// Packs, runs and collects one epoch: the logits rows (one per span that asked), `vocab` f32 each.
    fn run_epoch(&mut self, plan: &[PlannedSpan]) -> Result<Logits> {
        let pt = self.limits.page_tokens;
        let mut input = EpochInput::default();
        for p in plan {
            let s = &self.running[p.seq];
            let table_len = PageTable::pages_for(p.position + p.count, pt) as usize;
            let known = (p.position + p.count - p.verify) as usize;
            let proposed = &s.proposal[..p.verify as usize];
            input.push(
                s.id,
                p.position,
                p.logit_rows(),
                s.tokens[p.position as usize..known]
                    .iter()
                    .chain(proposed)
                    .copied(),
                s.table.pages[..table_len].iter().copied(),
            );
        }
        let rows = input.rows();
        let model = &self.model;
        let t_epoch = std::time::Instant::now();
        let (r, decls) = model.invoke(
            "epoch",
            &EPOCH,
            &input.args(model, self.pool_pages),
            model.doc.fuel.entry("epoch"),
        );
        let out = r?;
        let stage = out[0].as_i64().unwrap_or(-1);
        let upload = out[1].as_buffer().unwrap_or_default().to_vec();
        let output_bytes = out[2].as_i64().unwrap_or(-1);
        let live = rows as u64 * u64::from(self.limits.vocab) * 4;
        if output_bytes < 0 || (output_bytes as u64) < live {
            return Err(Error::Program(format!(
                "epoch returned an output of {output_bytes} bytes; {rows} logits rows of {} need {live}",
                self.limits.vocab
            )));
        }
        let set = match model.cached_stages(&decls) {
            Some(s) => s,
            None => model.stages_for(decls)?,
        };
        if usize::try_from(stage)
            .ok()
            .and_then(|i| set.stages.get(i))
            .is_none()
        {
            return Err(Error::Program(format!(
                "epoch selected stage {stage}; {} stages are declared",
                set.stages.len()
            )));
        }
        let t_stages = std::time::Instant::now();
        let input = model.device.alloc(upload.len() as u64, &model.budget)?;
        model.device.write(&input, 0, &upload)?;
        let output = match self.output.take() {
            Some(b) if b.bytes() == output_bytes as u64 => b,
            old => {
                // The old one goes first, so that the budget holds the new one.
                drop(old);
                model.device.alloc(output_bytes as u64, &model.budget)?
            }
        };
        let t_upload = std::time::Instant::now();
        let mut run = model.invoke_run(
            "run",
            &RUN,
            &[
                Value::I64(stage),
                Value::native("hal.buffer", input.clone()),
                Value::native("hal.buffer", self.pool_buf.clone()),
                Value::native("hal.buffer", output.clone()),
            ],
            model.doc.fuel.entry("run"),
            set,
            0,
            None,
            &[],
        );
        let t_run = std::time::Instant::now();
        model.settle(&mut run)?;
        if run.signalled.is_empty() {
            return Err(Error::Program(
                "run submitted no work (call runner.execute_3)".into(),
            ));
        }
        let t_settled = std::time::Instant::now();
        let logits = Logits::new(model.device.read(&output, 0, live)?);
        if log::log_enabled!(log::Level::Trace) {
            let us = |a: std::time::Instant, b: std::time::Instant| b.duration_since(a).as_micros();
            log::trace!(
                "model {}: epoch of {} spans, {rows} logits rows: `epoch` and its stages {} us, upload {} us, \
                 `run` {} us, device wait {} us, logits download {} us",
                model.name,
                plan.len(),
                us(t_epoch, t_stages),
                us(t_stages, t_upload),
                us(t_upload, t_run),
                us(t_run, t_settled),
                us(t_settled, std::time::Instant::now())
            );
        }
        self.output = Some(output);
        Ok(logits)
    }

    /// Commits each span's progress, draws the next token of the spans that asked, streams and finishes. A
    /// verifier span draws from its rows in order, exactly as decoding one token an epoch would (the same
    /// sampler, the same random stream), and keeps each proposal its draw agrees with: its state is committed
    /// and the next row is used; the first draw that differs (or the draw after the last proposal) becomes
    /// the pending token, so the output is the one plain decoding gives from the same logits.
    fn commit(&mut self, plan: &[PlannedSpan], logits: &[f32]) {
        let pt = self.limits.page_tokens;
        let vocab = self.limits.vocab as usize;
        let mut row = 0usize;
        let mut finished: Vec<(usize, Finish, bool)> = Vec::new();
        let now = Instant::now();
        for p in plan {
            let s = &mut self.running[p.seq];
            // A scored prompt's rows: row j holds the logits after the span's token j, i.e. of the prompt token
            // at position + j + 1 (the last row of the prompt's last chunk is the first draw's).
            let draws = if p.logits { p.verify + 1 } else { 0 };
            let scoring = (p.logit_rows() - draws) as usize;
            if let Some(scored) = &mut s.scored {
                let top = s.sampler.params().top_logprobs;
                for j in 0..scoring {
                    let at = (p.position as usize) + j + 1;
                    if at == scored.len() + 1 && at < s.prompt_len as usize {
                        let l = &logits[(row + j) * vocab..(row + j + 1) * vocab];
                        scored.push(super::sampling::score(l, s.tokens[at], top));
                    }
                }
                if p.logits && scored.len() + 1 >= s.prompt_len as usize {
                    let samples = s.scored.take().unwrap_or_default();
                    (s.events)(Event::Prompt {
                        index: s.index,
                        samples,
                    });
                }
            }
            row += scoring;
            if p.logits && s.max_tokens == 0 {
                // Scoring only: the choice ends after its prompt, drawing nothing (its draw row goes unused).
                row += draws as usize;
                s.table.commit(p.count, pt);
                finished.push((p.seq, Finish::Length, false));
                continue;
            }
            // The span's known tokens, then the proposals its draws agree with.
            let mut valid = p.count - p.verify;
            for j in 0..draws as usize {
                let l = &logits[(row + j) * vocab..(row + j + 1) * vocab];
                let sample = s.sampler.sample(l);
                let token = sample.token;
                let agreed = s.proposal.get(j) == Some(&token) && j < p.verify as usize;
                if let Some(f) = emit(s, sample, now, &self.limits, &self.model, &self.metrics) {
                    finished.push((p.seq, f.0, f.1));
                    break;
                }
                if !agreed {
                    break;
                }
                valid += 1;
            }
            row += draws as usize;
            if p.verify > 0 {
                let kept = valid - (p.count - p.verify);
                self.metrics
                    .spec_proposed
                    .fetch_add(u64::from(p.verify), Ordering::Relaxed);
                self.metrics
                    .spec_accepted
                    .fetch_add(u64::from(kept), Ordering::Relaxed);
            }
            s.proposal.clear();
            s.table.commit(valid, pt);
            // Pages this span filled are shared from now on.
            let full = (s.table.tokens / pt) as usize;
            while s.hashes.len() < full {
                let j = s.hashes.len();
                let parent = s.hashes.last().copied().unwrap_or(super::prefix::ROOT);
                let block = &s.tokens[j * pt as usize..(j + 1) * pt as usize];
                let h = self
                    .prefix
                    .insert(&mut self.pool, parent, block, s.table.pages[j]);
                s.hashes.push(h);
            }
            let prefill = (p.position + valid)
                .min(s.prompt_len)
                .saturating_sub(p.position);
            self.metrics
                .prefill_tokens
                .fetch_add(u64::from(prefill), Ordering::Relaxed);
            self.metrics
                .decode_tokens
                .fetch_add(u64::from(valid - prefill), Ordering::Relaxed);
        }
        finished.sort_unstable_by_key(|f| f.0);
        for (k, f, terminal) in finished.into_iter().rev() {
            let mut s = self.running.remove(k);
            self.metrics.running.fetch_sub(1, Ordering::Relaxed);
            if s.session.is_some() {
                let mut known = s.tokens.clone();
                if terminal {
                    known.pop();
                }
                self.settle_session(&s, Some(known));
            }
            s.table.clear(&mut self.pool);
            // The gauges are current before the client hears of the end.
            self.update_pages();
            (s.events)(Event::Done {
                index: s.index,
                finish: f,
                completion_tokens: s.generated,
            });
        }
    }
}

/// An epoch's logits rows as the device returned them: little-endian f32 bytes, read in place where they are
/// aligned for f32 (as the allocator gives them), else converted once.
enum Logits {
    Bytes(Vec<u8>),
    Floats(Vec<f32>),
}

impl Logits {
    fn new(bytes: Vec<u8>) -> Self {
        if cfg!(target_endian = "little") && bytemuck::try_cast_slice::<u8, f32>(&bytes).is_ok() {
            Logits::Bytes(bytes)
        } else {
            Logits::Floats(
                bytes
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            )
        }
    }

    fn as_f32(&self) -> &[f32] {
        match self {
            // `new` kept the bytes only where this cast succeeds.
            Logits::Bytes(b) => bytemuck::cast_slice(b),
            Logits::Floats(f) => f,
        }
    }
}

/// Records sequence `s`'s drawn token and streams its text; the finish reason (and whether the token is the
/// terminal one) when the sequence ends with it.
fn emit(
    s: &mut Seq,
    sample: Sample,
    now: Instant,
    limits: &Limits,
    model: &Model,
    metrics: &Metrics,
) -> Option<(Finish, bool)> {
    let token = sample.token;
    s.tokens.push(token);
    s.generated += 1;
    match s.last_token {
        None => metrics.ttft.observe(now.duration_since(s.arrived)),
        Some(t) => metrics.itl.observe(now.duration_since(t)),
    }
    s.last_token = Some(now);
    let terminal = !s.ignore_eos && limits.terminal == Some(token);
    let mut text = String::new();
    let mut finish = None;
    if terminal {
        finish = Some(Finish::Stop);
    } else {
        let bytes = token_bytes(model, token);
        let step = s.stop.push(&s.utf8.push(&bytes));
        text = step.text;
        if step.stopped.is_some() {
            finish = Some(Finish::Stop);
        } else if s.generated >= s.max_tokens || s.tokens.len() as u32 >= limits.context {
            finish = Some(Finish::Length);
        }
    }
    if terminal || finish == Some(Finish::Length) {
        // The end of the text: an incomplete character and text held back for a stop string that did not
        // complete are final now (a stop string completing in them still stops).
        let tail = s.utf8.finish();
        let step = s.stop.push(&tail);
        text.push_str(&step.text);
        if step.stopped.is_some() {
            finish = Some(Finish::Stop);
        } else {
            text.push_str(&s.stop.finish());
        }
    }
    (s.events)(Event::Delta {
        index: s.index,
        text,
        samples: vec![sample],
    });
    finish.map(|f| (f, terminal))
}

/// Token ids for `text`: `model`'s tokenizer (special tokens matched), or its bytes without one.
pub fn encode(model: &Model, text: &str) -> Result<Vec<u32>> {
    match model.tokenizer() {
        Some(t) => t.encode(text, 0).map_err(Error::BadRequest),
        None => Ok(text.bytes().map(u32::from).collect()),
    }
}

/// A new page of `pages` holding a copy of page `from` of the pool buffer `buf` (pages of `page_bytes`),
/// copied through the host (one read and one write, between epochs): copy on write of a shared partial page.
/// `None` when the pool has no free page; a failed copy releases the new page.
pub(crate) fn copy_pool_page(
    model: &Model,
    buf: &DeviceBuffer,
    pages: &mut PagePool,
    page_bytes: u64,
    from: u32,
) -> Result<Option<u32>> {
    let Ok(new) = pages.alloc(1) else {
        return Ok(None);
    };
    let to = new[0];
    let copied = model
        .device
        .read(buf, u64::from(from) * page_bytes, page_bytes)
        .and_then(|b| model.device.write(buf, u64::from(to) * page_bytes, &b));
    match copied {
        Ok(()) => Ok(Some(to)),
        Err(e) => {
            pages.release(&new);
            Err(e)
        }
    }
}

/// The bytes of `token` (its tokenizer's; a byte itself without one).
pub fn token_bytes(model: &Model, token: u32) -> Vec<u8> {
    match model.tokenizer() {
        Some(t) => t.token_bytes(token).unwrap_or_default(),
        None => vec![token as u8],
    }
}
