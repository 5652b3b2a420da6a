//! The sequence service: one engine thread per model owns the page pool, the waiting queue and the running
//! sequences, and runs epochs (see the module doc of [`super`]).

use super::plan::{self, Placement};
use super::{CAPTURE, ENCODE, RUN};
use crate::retained::engine::{Progress, plan_epoch};
use crate::retained::pages::{PagePool, PageTable};
use crate::retained::service::{KeptSession, NEXT_SESSION, SESSION_IDLE, copy_pool_page};
use crate::retained::sessions::{SessionError, SessionInfo, SessionOp};
use crate::retained::{Limits, SPAN_WORDS};
use crate::thread::EngineThread;
use loom_vm::Value;
use serve_runtime::contract::{Histogram, LATENCY_BUCKETS, Series, Service};
use serve_runtime::device::DeviceBuffer;
use serve_runtime::model::Model;
use serve_runtime::{Error, Result};
use std::any::Any;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

/// Where a sequence's result goes (called once, on the engine thread; it must not block): what the package
/// captured, or why it failed.
pub type Done = Box<dyn FnOnce(Result<Captured>) + Send>;

/// A sequence's captured output: the bytes the package captured for the positions `from ..` of its tokens that
/// it computed (all of them for a submitted sequence; for a session's append, from the first position the
/// session had not computed up to the one before its new last token), concatenated in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Captured {
    pub bytes: Vec<u8>,
    /// The first position computed.
    pub from: u32,
    /// The positions computed.
    pub positions: u32,
}

/// The caller's handle on a submitted sequence.
#[derive(Debug, Clone)]
pub struct Submitted {
    cancelled: Arc<AtomicBool>,
}

impl Submitted {
    /// The client is gone: the sequence leaves at the next epoch and frees its pages.
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
    pub waiting: AtomicU64,
    pub running: AtomicU64,
    pub pages_used: AtomicU64,
    pub pages_capacity: AtomicU64,
    pub tokens: AtomicU64,
    pub epochs: AtomicU64,
    pub epoch_ns: AtomicU64,
    /// Bytes the placement plans listed (and the server uploaded), and the target buffers' capacity per epoch
    /// summed (what uploading whole buffers would have cost).
    pub uploaded: AtomicU64,
    pub upload_capacity: AtomicU64,
    pub captured: AtomicU64,
    /// Admission to completion of each sequence.
    pub latency: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            waiting: AtomicU64::new(0),
            running: AtomicU64::new(0),
            pages_used: AtomicU64::new(0),
            pages_capacity: AtomicU64::new(0),
            tokens: AtomicU64::new(0),
            epochs: AtomicU64::new(0),
            epoch_ns: AtomicU64::new(0),
            uploaded: AtomicU64::new(0),
            upload_capacity: AtomicU64::new(0),
            captured: AtomicU64::new(0),
            latency: Histogram::new(LATENCY_BUCKETS),
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
                "loom_sequence_requests_total",
                "sequences submitted",
                "counter",
                g(&self.requests),
            ),
            s(
                "loom_sequence_requests_failed_total",
                "sequences that failed",
                "counter",
                g(&self.failed),
            ),
            s(
                "loom_sequence_requests_refused_total",
                "sequences refused because the queue was full",
                "counter",
                g(&self.refused),
            ),
            s(
                "loom_sequence_requests_cancelled_total",
                "sequences cancelled by their client",
                "counter",
                g(&self.cancelled),
            ),
            s(
                "loom_sequence_waiting",
                "sequences waiting for pages",
                "gauge",
                g(&self.waiting),
            ),
            s(
                "loom_sequence_running",
                "sequences admitted and not finished",
                "gauge",
                g(&self.running),
            ),
            s(
                "loom_sequence_pages_used",
                "pages of the page pool held by sequences",
                "gauge",
                g(&self.pages_used),
            ),
            s(
                "loom_sequence_page_pool_usage_ratio",
                "fraction of the page pool in use",
                "gauge",
                g(&self.pages_used) / cap,
            ),
            s(
                "loom_sequence_tokens_total",
                "supplied tokens computed",
                "counter",
                g(&self.tokens),
            ),
            s(
                "loom_sequence_epochs_total",
                "epochs run",
                "counter",
                g(&self.epochs),
            ),
            s(
                "loom_sequence_epoch_seconds_total",
                "time spent in epochs (packing, device work, capture)",
                "counter",
                g(&self.epoch_ns) / 1e9,
            ),
            s(
                "loom_sequence_upload_bytes_total",
                "bytes the epochs' placement plans listed (all that was uploaded)",
                "counter",
                g(&self.uploaded),
            ),
            s(
                "loom_sequence_upload_capacity_bytes_total",
                "bytes of the epochs' metadata and input buffers (what whole uploads would have moved)",
                "counter",
                g(&self.upload_capacity),
            ),
            s(
                "loom_sequence_captured_bytes_total",
                "output bytes captured and downloaded for sequences",
                "counter",
                g(&self.captured),
            ),
            self.latency.series(
                "loom_sequence_seconds",
                "time from submission to a sequence's last captured byte",
            ),
        ]
    }
}

type SessionReply = std::result::Result<Vec<SessionInfo>, SessionError>;

enum Cmd {
    Submit(Seq),
    Session(String, SessionOp, mpsc::Sender<SessionReply>),
    /// An append to a session: its sequence (tokens: the new ones only), and where to say whether it was taken.
    Append(
        String,
        Seq,
        mpsc::Sender<std::result::Result<(), SessionError>>,
    ),
    Drain(mpsc::Sender<KeptSessions>),
}

/// One supplied sequence.
struct Seq {
    id: u64,
    tokens: Vec<u32>,
    /// Tokens whose state it computes: all of them, or for a session's append all but the last (whose output,
    /// the score of the token after it, waits for that token: the next append computes it).
    target: u32,
    table: PageTable,
    output: Vec<u8>,
    done: Option<Done>,
    cancelled: Arc<AtomicBool>,
    arrived: Instant,
    /// The session it appends to, and the session's token count before it.
    session: Option<(String, u32)>,
    /// The first position it computes (its table's committed tokens when it was queued).
    from: u32,
}

impl Seq {
    fn finish(&mut self, r: Result<Captured>) {
        if let Some(d) = self.done.take() {
            d(r);
        }
    }
}

/// A running sequence model.
pub struct SequenceService {
    pub model: Arc<Model>,
    pub limits: Limits,
    pub metrics: Arc<Metrics>,
    /// Pages in the pool.
    pub pool_pages: u32,
    /// The engine thread; drained, it hands back the sessions (for a deactivation: [`Service::kept_state`]).
    engine: EngineThread<Cmd, KeptSessions>,
}

/// Sessions kept across a deactivation: each one's id, tokens and checkpoints (name, tokens), without pages (the
/// pool goes with the model's device memory): after the activation an append computes the session's tokens
/// again and returns what it would have.
#[derive(Debug, Default)]
pub struct KeptSessions(Vec<KeptSession>);

impl std::fmt::Debug for SequenceService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SequenceService")
            .field("model", &self.model.name)
            .finish_non_exhaustive()
    }
}

/// The most metadata (and input) buffer sizes kept at once (one per stage geometry in use).
const MAX_TARGET_SIZES: usize = 8;

/// The share of the model's unused budget (after its parameters) the page pool takes; the rest is for each
/// epoch's buffers (as in retained text).
const POOL_SHARE: (u64, u64) = (3, 4);

impl SequenceService {
    /// Allocates the page pool and starts the engine thread, with the sessions a deactivated service kept (same
    /// ids, tokens and checkpoints; no pages).
    pub fn start(
        model: Arc<Model>,
        limits: Limits,
        kept: KeptSessions,
    ) -> Result<Arc<SequenceService>> {
        let free = model.budget.limit.saturating_sub(model.budget.used());
        let pool_pages =
            (free / POOL_SHARE.1 * POOL_SHARE.0 / limits.page_bytes).min(u32::MAX as u64) as u32;
        if pool_pages == 0 {
            return Err(Error::Program(format!(
                "model `{}`: its memory budget leaves {free} device bytes after its parameters, not one page \
                 of {} bytes; raise memory.device_bytes",
                model.name, limits.page_bytes
            )));
        }
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
            pool_buf: pool,
            pool_pages,
            targets: [Vec::new(), Vec::new()],
            waiting: VecDeque::new(),
            running: Vec::new(),
            sessions: kept
                .0
                .into_iter()
                .map(|(id, tokens, checkpoints)| {
                    let s = Session {
                        tokens,
                        table: PageTable::default(),
                        checkpoints: checkpoints
                            .into_iter()
                            .map(|(n, t)| (n, (t, PageTable::default())))
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
        };
        let engine = EngineThread::spawn(&model.name, format!("seq-{}", model.name), move |rx| {
            engine.run(rx)
        })?;
        Ok(Arc::new(SequenceService {
            model,
            limits,
            metrics,
            pool_pages,
            engine,
        }))
    }

    /// The longest sequence a request may supply: the context, and what the whole pool holds.
    pub fn max_tokens(&self) -> u32 {
        self.limits
            .context
            .min(self.pool_pages.saturating_mul(self.limits.page_tokens))
    }

    /// Token ids for `text` (the package's tokenizer; bytes without one).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        crate::retained::service::encode(&self.model, text)
    }

    /// Supplied tokens are at least one, each inside the vocabulary.
    fn check_tokens(&self, tokens: &[u32], what: &str) -> Result<()> {
        if tokens.is_empty() {
            return Err(Error::BadRequest(format!("the {what} has no tokens")));
        }
        match tokens
            .iter()
            .enumerate()
            .find(|(_, t)| **t >= self.limits.vocab)
        {
            Some((i, t)) => Err(Error::BadRequest(format!(
                "token {i} is {t}; the vocabulary has {} tokens",
                self.limits.vocab
            ))),
            None => Ok(()),
        }
    }

    /// Checks and queues one sequence of supplied tokens; `done` gets its captured bytes. Errors: an empty or
    /// too long sequence, a token outside the vocabulary (400/413), a full queue (`Overloaded`), a draining
    /// model.
    pub fn submit(&self, tokens: Vec<u32>, done: Done) -> Result<Submitted> {
        self.check_tokens(&tokens, "sequence")?;
        let max = self.max_tokens();
        if tokens.len() as u64 > u64::from(max) {
            return Err(Error::TooLarge(format!(
                "the sequence has {} tokens; model `{}` takes at most {max}",
                tokens.len(),
                self.model.name
            )));
        }
        let waiting = self.metrics.waiting.load(Ordering::Relaxed);
        if waiting >= self.model.doc.capacities.max_queue as u64 {
            self.metrics.refused.fetch_add(1, Ordering::Relaxed);
            return Err(Error::Overloaded(format!(
                "model `{}` has {waiting} sequences waiting (capacities.max_queue)",
                self.model.name
            )));
        }
        let cancelled = Arc::new(AtomicBool::new(false));
        self.metrics.waiting.fetch_add(1, Ordering::Relaxed);
        self.metrics.requests.fetch_add(1, Ordering::Relaxed);
        let seq = Seq {
            id: 0,
            target: tokens.len() as u32,
            tokens,
            table: PageTable::default(),
            output: Vec::new(),
            done: Some(done),
            cancelled: cancelled.clone(),
            arrived: Instant::now(),
            session: None,
            from: 0,
        };
        if let Err(e) = self.engine.send(Cmd::Submit(seq)) {
            self.metrics.waiting.fetch_sub(1, Ordering::Relaxed);
            return Err(e);
        }
        Ok(Submitted { cancelled })
    }

    /// Runs a session operation on the engine thread (see [`SessionOp`]; `Extend` is refused: every append
    /// of a sequence session is computed, [`SequenceService::append`]). Blocks until the engine answers.
    pub fn session(&self, id: &str, op: SessionOp) -> SessionReply {
        self.engine
            .ask(|reply| Cmd::Session(id.to_string(), op, reply))?
    }

    /// Appends `tokens` to session `id` and computes them: `done` gets the captured bytes of the session's
    /// tokens from its old last token on (for `score`: the appended tokens' scores, in order; with an empty
    /// session, the scores of the appended tokens after the first). One append runs per session at a time
    /// (409 otherwise). Blocks until the engine took it.
    pub fn append(
        &self,
        id: &str,
        tokens: Vec<u32>,
        done: Done,
    ) -> std::result::Result<Submitted, SessionError> {
        self.check_tokens(&tokens, "append")?;
        let cancelled = Arc::new(AtomicBool::new(false));
        let seq = Seq {
            id: 0,
            target: 0,
            tokens,
            table: PageTable::default(),
            output: Vec::new(),
            done: Some(done),
            cancelled: cancelled.clone(),
            arrived: Instant::now(),
            session: None,
            from: 0,
        };
        self.engine
            .ask(|reply| Cmd::Append(id.to_string(), seq, reply))??;
        self.metrics.requests.fetch_add(1, Ordering::Relaxed);
        Ok(Submitted { cancelled })
    }

    /// Stops accepting sequences, finishes every accepted one, and joins the engine. Idempotent.
    pub fn drain(&self) {
        self.engine.drain(Cmd::Drain)
    }
}

impl Service for SequenceService {
    fn model(&self) -> &Arc<Model> {
        &self.model
    }

    fn drain(&self) {
        SequenceService::drain(self)
    }

    fn series(&self) -> Vec<Series> {
        self.metrics.series()
    }

    fn as_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }

    fn kept_state(&self) -> Option<serve_runtime::contract::KeptState> {
        let k = self.engine.take_kept()?;
        (!k.0.is_empty()).then(|| Box::new(k) as serve_runtime::contract::KeptState)
    }
}

struct Engine {
    model: Arc<Model>,
    limits: Limits,
    metrics: Arc<Metrics>,
    pool: PagePool,
    pool_buf: DeviceBuffer,
    pool_pages: u32,
    /// The stages' metadata and input buffers, one per size (stages of several token buckets), kept across
    /// epochs: a placement writes only its bytes, the rest keep what earlier epochs of that size placed there
    /// (zero at first). At most [`MAX_TARGET_SIZES`] sizes each, the oldest dropped first.
    targets: [Vec<DeviceBuffer>; 2],
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
    sessions: HashMap<String, Session>,
    session_idle: Duration,
}

/// A session: its tokens, and a page table holding the state of all but its last token (the last one's
/// output needs the token after it, which the next append brings). Checkpoints hold the same: their pages are
/// the session's, one more pool reference each, so a checkpoint or a fork copies nothing; an append writes
/// only into pages nobody else holds (it copies the partial page it continues, see `Engine::append`).
struct Session {
    tokens: Vec<u32>,
    table: PageTable,
    checkpoints: BTreeMap<String, (Vec<u32>, PageTable)>,
    last_used: Instant,
    busy: bool,
}

impl Engine {
    fn run(mut self, rx: mpsc::Receiver<Cmd>) {
        let mut next_id = 0u64;
        let mut drain: Option<mpsc::Sender<KeptSessions>> = None;
        loop {
            if self.waiting.is_empty() && self.running.is_empty() {
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
                    Ok(c) => self.command(c, &mut next_id, &mut drain),
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    Err(mpsc::RecvTimeoutError::Disconnected) => return,
                }
            }
            self.expire_sessions();
            while let Ok(c) = rx.try_recv() {
                self.command(c, &mut next_id, &mut drain);
            }
            self.drop_cancelled();
            self.admit();
            if self.running.is_empty() {
                if let Some(mut s) = self.waiting.pop_front() {
                    // Nothing runs and the oldest waiting sequence cannot get its pages: sessions hold them.
                    self.metrics.waiting.fetch_sub(1, Ordering::Relaxed);
                    self.metrics.failed.fetch_add(1, Ordering::Relaxed);
                    self.end_session_append(&mut s, false);
                    s.finish(Err(Error::TooLarge(format!(
                        "the sequence needs {} pages; sessions hold all but {} of the model's {} (delete \
                         sessions or rewind them)",
                        PageTable::pages_for(s.target, self.limits.page_tokens),
                        self.pool.free(),
                        self.pool.capacity()
                    ))));
                }
                continue;
            }
            self.epoch();
        }
    }

    fn command(
        &mut self,
        c: Cmd,
        next_id: &mut u64,
        drain: &mut Option<mpsc::Sender<KeptSessions>>,
    ) {
        match c {
            Cmd::Submit(mut s) => {
                s.id = *next_id;
                *next_id += 1;
                self.waiting.push_back(s);
            }
            Cmd::Session(id, op, reply) => {
                let _ = reply.send(self.session_op(&id, op));
            }
            Cmd::Append(id, mut s, reply) => {
                s.id = *next_id;
                *next_id += 1;
                let r = self.append(&id, s);
                let _ = reply.send(r);
            }
            Cmd::Drain(d) => *drain = Some(d),
        }
    }

    /// Queues an append to session `id`: a sequence over the session's tokens and `s.tokens`, starting from a
    /// copy of the session's page table (one more reference on each page) whose partial last page, which it
    /// will write, is copied first (copy on write: the session, its checkpoints and forks keep the original).
    fn append(&mut self, id: &str, mut s: Seq) -> std::result::Result<(), SessionError> {
        let max =
            (self.limits.context).min(self.pool.capacity().saturating_mul(self.limits.page_tokens));
        let sess = self
            .sessions
            .get(id)
            .ok_or_else(|| SessionError::NotFound(format!("no session `{id}`")))?;
        if sess.busy {
            return Err(SessionError::Conflict(format!(
                "session `{id}` is busy with another append"
            )));
        }
        let before = sess.tokens.len() as u32;
        let mut tokens = sess.tokens.clone();
        tokens.extend_from_slice(&s.tokens);
        if tokens.len() as u64 > u64::from(max) {
            return Err(Error::TooLarge(format!(
                "the session would hold {} tokens; model `{}` takes at most {max}",
                tokens.len(),
                self.model.name
            ))
            .into());
        }
        let mut table = sess.table.clone();
        self.pool.retain(&table.pages);
        let pt = self.limits.page_tokens;
        if table.tokens % pt != 0 {
            let last = table.pages.len() - 1;
            match self.copy_page(table.pages[last]) {
                Ok(new) => {
                    self.pool.release(&[table.pages[last]]);
                    table.pages[last] = new;
                }
                Err(e) => {
                    table.clear(&mut self.pool);
                    return Err(e.into());
                }
            }
        }
        s.target = tokens.len() as u32 - 1;
        s.from = table.tokens;
        s.tokens = tokens;
        s.table = table;
        s.session = Some((id.to_string(), before));
        let sess = self.sessions.get_mut(id).expect("checked");
        sess.busy = true;
        sess.last_used = Instant::now();
        self.metrics.waiting.fetch_add(1, Ordering::Relaxed);
        self.waiting.push_back(s);
        self.update_pages();
        Ok(())
    }

    /// A fresh page holding a copy of `page` (host read and write of `page_bytes`, between epochs).
    fn copy_page(&mut self, page: u32) -> Result<u32> {
        copy_pool_page(
            &self.model,
            &self.pool_buf,
            &mut self.pool,
            self.limits.page_bytes,
            page,
        )?
        .ok_or_else(|| {
            Error::TooLarge(
                "no free page to continue the session in (sessions hold the model's page pool)"
                    .into(),
            )
        })
    }

    /// A session append's sequence ended: `ok` moves its tokens and pages into the session (releasing what the
    /// session held), otherwise the session keeps what it had. Either way the sequence holds no page after.
    fn end_session_append(&mut self, s: &mut Seq, ok: bool) {
        let Some((id, _)) = &s.session else {
            s.table.clear(&mut self.pool);
            return;
        };
        match self.sessions.get_mut(id) {
            Some(sess) => {
                sess.busy = false;
                sess.last_used = Instant::now();
                if ok {
                    let mut old = std::mem::replace(&mut sess.table, std::mem::take(&mut s.table));
                    sess.tokens = std::mem::take(&mut s.tokens);
                    old.clear(&mut self.pool);
                } else {
                    s.table.clear(&mut self.pool);
                }
            }
            None => s.table.clear(&mut self.pool),
        }
    }

    fn session_op(&mut self, id: &str, op: SessionOp) -> SessionReply {
        let now = Instant::now();
        let missing = || SessionError::NotFound(format!("no session `{id}`"));
        let info = |id: &str, s: &Session, full: bool| SessionInfo {
            id: id.to_string(),
            token_ids: if full { s.tokens.clone() } else { Vec::new() },
            tokens: s.tokens.len() as u32,
            pages: s.table.pages.len() as u32,
            checkpoints: s
                .checkpoints
                .iter()
                .map(|(n, (t, p))| (n.clone(), t.len() as u32, p.pages.len() as u32))
                .collect(),
            busy: s.busy,
            idle_seconds: now.duration_since(s.last_used).as_secs_f64(),
        };
        let max = self.limits.context;
        let r = match op {
            SessionOp::Create { tokens } => {
                if tokens.len() as u64 > u64::from(max) {
                    return Err(Error::TooLarge(format!(
                        "the session would hold {} tokens; model `{}` takes at most {max}",
                        tokens.len(),
                        self.model.name
                    ))
                    .into());
                }
                if let Some(t) = tokens.iter().find(|t| **t >= self.limits.vocab) {
                    return Err(Error::BadRequest(format!(
                        "token {t} is outside the vocabulary of {} tokens",
                        self.limits.vocab
                    ))
                    .into());
                }
                let id = format!("sess-{}", NEXT_SESSION.fetch_add(1, Ordering::Relaxed));
                let s = Session {
                    tokens,
                    table: PageTable::default(),
                    checkpoints: BTreeMap::new(),
                    last_used: now,
                    busy: false,
                };
                let r = info(&id, &s, true);
                self.sessions.insert(id, s);
                Ok(vec![r])
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
                let mut s = self.sessions.remove(id).ok_or_else(missing)?;
                self.release_session(&mut s);
                Ok(Vec::new())
            }
            SessionOp::Extend { .. } => Err(Error::BadRequest(
                "a sequence session computes every append: append tokens to have them scored"
                    .into(),
            )
            .into()),
            SessionOp::Checkpoint { name } => {
                let s = self.sessions.get_mut(id).ok_or_else(missing)?;
                let snap = (s.tokens.clone(), s.table.clone());
                self.pool.retain(&snap.1.pages);
                if let Some((_, mut old)) = s.checkpoints.insert(name, snap) {
                    old.clear(&mut self.pool);
                }
                s.last_used = now;
                Ok(vec![info(id, s, true)])
            }
            SessionOp::Fork { checkpoint } => {
                let s = self.sessions.get_mut(id).ok_or_else(missing)?;
                let (tokens, table) = match &checkpoint {
                    None => (s.tokens.clone(), s.table.clone()),
                    Some(c) => {
                        let (t, p) = s.checkpoints.get(c).ok_or_else(|| {
                            SessionError::NotFound(format!(
                                "session `{id}` has no checkpoint `{c}`"
                            ))
                        })?;
                        (t.clone(), p.clone())
                    }
                };
                s.last_used = now;
                self.pool.retain(&table.pages);
                let new = format!("sess-{}", NEXT_SESSION.fetch_add(1, Ordering::Relaxed));
                let f = Session {
                    tokens,
                    table,
                    checkpoints: BTreeMap::new(),
                    last_used: now,
                    busy: false,
                };
                let r = info(&new, &f, true);
                self.sessions.insert(new, f);
                Ok(vec![r])
            }
            SessionOp::RewindCheckpoint { name } => {
                let s = self.sessions.get_mut(id).ok_or_else(missing)?;
                if s.busy {
                    return Err(SessionError::Conflict(format!(
                        "session `{id}` is busy with an append"
                    )));
                }
                let (t, p) = s.checkpoints.get(&name).cloned().ok_or_else(|| {
                    SessionError::NotFound(format!("session `{id}` has no checkpoint `{name}`"))
                })?;
                self.pool.retain(&p.pages);
                s.tokens = t;
                let mut old = std::mem::replace(&mut s.table, p);
                s.last_used = now;
                old.clear(&mut self.pool);
                let s = &self.sessions[id];
                Ok(vec![info(id, s, true)])
            }
            SessionOp::RewindTokens { tokens } => {
                let pt = self.limits.page_tokens;
                let s = self.sessions.get_mut(id).ok_or_else(missing)?;
                if s.busy {
                    return Err(SessionError::Conflict(format!(
                        "session `{id}` is busy with an append"
                    )));
                }
                if tokens as usize > s.tokens.len() {
                    return Err(Error::BadRequest(format!(
                        "cannot rewind session `{id}` to {tokens} tokens: it holds {}",
                        s.tokens.len()
                    ))
                    .into());
                }
                s.tokens.truncate(tokens as usize);
                s.table
                    .truncate(&mut self.pool, tokens.saturating_sub(1), pt);
                s.last_used = now;
                Ok(vec![info(id, s, true)])
            }
        };
        self.update_pages();
        r
    }

    fn release_session(&mut self, s: &mut Session) {
        s.table.clear(&mut self.pool);
        for (_, (_, mut t)) in std::mem::take(&mut s.checkpoints) {
            t.clear(&mut self.pool);
        }
    }

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
            if let Some(mut s) = self.sessions.remove(&id) {
                log::debug!("model {}: session {id} expired", self.model.name);
                self.release_session(&mut s);
            }
        }
        self.update_pages();
    }

    /// The sessions' ids, tokens and checkpoints (their pages are released).
    fn keep_sessions(&mut self) -> KeptSessions {
        let mut out = Vec::new();
        for (id, mut s) in std::mem::take(&mut self.sessions) {
            let cps = s
                .checkpoints
                .iter()
                .map(|(n, (t, _))| (n.clone(), t.clone()))
                .collect();
            let tokens = std::mem::take(&mut s.tokens);
            self.release_session(&mut s);
            out.push((id, tokens, cps));
        }
        KeptSessions(out)
    }

    fn update_pages(&self) {
        self.metrics
            .pages_used
            .store(u64::from(self.pool.used()), Ordering::Relaxed);
    }

    fn drop_cancelled(&mut self) {
        let gone = |s: &Seq| s.cancelled.load(Ordering::Relaxed);
        let mut out: Vec<Seq> = Vec::new();
        let (w, r) = (self.waiting.len(), self.running.len());
        let mut k = 0;
        while k < self.waiting.len() {
            if gone(&self.waiting[k]) {
                out.extend(self.waiting.remove(k));
            } else {
                k += 1;
            }
        }
        let mut k = 0;
        while k < self.running.len() {
            if gone(&self.running[k]) {
                out.push(self.running.remove(k));
            } else {
                k += 1;
            }
        }
        let m = self.metrics.clone();
        m.waiting
            .fetch_sub((w - self.waiting.len()) as u64, Ordering::Relaxed);
        m.running
            .fetch_sub((r - self.running.len()) as u64, Ordering::Relaxed);
        for mut s in out {
            self.end_session_append(&mut s, false);
            m.cancelled.fetch_add(1, Ordering::Relaxed);
            s.finish(Err(Error::Cancelled));
        }
        self.update_pages();
    }

    /// Admits waiting sequences in order while the pool has pages for the whole of the next one: a
    /// sequence's length is known, so it takes every page it will need at once and never waits for one
    /// (nothing is preempted). One that the whole pool cannot hold was refused at submission.
    fn admit(&mut self) {
        let pt = self.limits.page_tokens;
        while let Some(s) = self.waiting.front_mut() {
            let extra = s.target - s.table.tokens;
            if s.table.reserve(&mut self.pool, extra, pt).is_err() {
                break;
            }
            let mut s = self.waiting.pop_front().expect("front");
            self.metrics.waiting.fetch_sub(1, Ordering::Relaxed);
            if extra == 0 {
                // Nothing to compute (an append of one token to a session without any): done already.
                self.end_session_append(&mut s, true);
                self.update_pages();
                let from = s.from;
                s.finish(Ok(Captured {
                    bytes: Vec::new(),
                    from,
                    positions: 0,
                }));
                continue;
            }
            self.metrics.running.fetch_add(1, Ordering::Relaxed);
            self.running.push(s);
        }
        self.update_pages();
    }

    fn epoch(&mut self) {
        let t0 = Instant::now();
        let progress: Vec<Progress> = self
            .running
            .iter()
            .map(|s| Progress {
                known: s.target,
                committed: s.table.tokens,
                proposed: 0,
            })
            .collect();
        let plan = plan_epoch(
            &progress,
            self.limits.epoch_tokens,
            self.limits.epoch_spans,
            self.limits.epoch_tokens,
        );
        if plan.is_empty() {
            return;
        }
        let spans: Vec<(usize, u32, u32)> =
            plan.iter().map(|p| (p.seq, p.position, p.count)).collect();
        // Sequences that end this epoch, answered once the pool and the metrics say so.
        let mut ended: Vec<(Seq, Result<Captured>)> = Vec::new();
        match self.run_epoch(&spans) {
            Ok(captured) => {
                let pt = self.limits.page_tokens;
                for (&(k, _, count), bytes) in spans.iter().zip(captured) {
                    let s = &mut self.running[k];
                    s.table.commit(count, pt);
                    s.output.extend_from_slice(&bytes);
                    self.metrics
                        .tokens
                        .fetch_add(u64::from(count), Ordering::Relaxed);
                    self.metrics
                        .captured
                        .fetch_add(bytes.len() as u64, Ordering::Relaxed);
                }
                let mut k = 0;
                while k < self.running.len() {
                    let s = &self.running[k];
                    if s.table.tokens == s.target {
                        let mut s = self.running.remove(k);
                        self.metrics.latency.observe(s.arrived.elapsed());
                        let out = Captured {
                            bytes: std::mem::take(&mut s.output),
                            from: s.from,
                            positions: s.target - s.from,
                        };
                        ended.push((s, Ok(out)));
                    } else {
                        k += 1;
                    }
                }
            }
            Err(e) => {
                log::debug!(
                    "model {}: epoch of {} spans failed: {e}",
                    self.model.name,
                    spans.len()
                );
                let mut idx: Vec<usize> = spans.iter().map(|s| s.0).collect();
                idx.sort_unstable();
                for k in idx.into_iter().rev() {
                    let s = self.running.remove(k);
                    self.metrics.failed.fetch_add(1, Ordering::Relaxed);
                    ended.push((s, Err(e.clone())));
                }
            }
        }
        for (s, r) in &mut ended {
            let ok = r.is_ok();
            self.end_session_append(s, ok);
        }
        self.metrics
            .running
            .fetch_sub(ended.len() as u64, Ordering::Relaxed);
        self.update_pages();
        self.metrics.epochs.fetch_add(1, Ordering::Relaxed);
        self.metrics
            .epoch_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        for (mut s, r) in ended {
            s.finish(r);
        }
    }

    /// The stage's metadata or input buffer of `bytes` bytes (`t`: 0 or 1): the kept one of that size, or a
    /// new one (zero-filled).
    fn target(&mut self, t: usize, bytes: u64) -> Result<DeviceBuffer> {
        let kept = &mut self.targets[t];
        if let Some(b) = kept.iter().find(|b| b.bytes() == bytes) {
            return Ok(b.clone());
        }
        // Device buffers come zero-filled from the allocator.
        let b = self.model.device.alloc(bytes, &self.model.budget)?;
        if kept.len() == MAX_TARGET_SIZES {
            kept.remove(0);
        }
        kept.push(b.clone());
        Ok(b)
    }

    /// Packs (`encode_epoch`), places the listed bytes, captures (`capture_epoch`), runs and copies out one
    /// epoch; returns each span's captured bytes, in span order.
    fn run_epoch(&mut self, plan: &[(usize, u32, u32)]) -> Result<Vec<Vec<u8>>> {
        let pt = self.limits.page_tokens;
        let mut spans = Vec::with_capacity(plan.len() * SPAN_WORDS * 8);
        let mut tokens = Vec::new();
        let mut pages = Vec::new();
        for &(k, position, count) in plan {
            let s = &self.running[k];
            let end = (position + count) as usize;
            let table_len = PageTable::pages_for(position + count, pt) as usize;
            let next = s.tokens.get(end).map_or(-1, |&t| i64::from(t));
            let words: [i64; SPAN_WORDS] = [
                s.id as i64,
                i64::from(position),
                i64::from(count),
                (tokens.len() / 4) as i64,
                (pages.len() / 4) as i64,
                table_len as i64,
                next,
                0,
            ];
            for w in words {
                spans.extend_from_slice(&w.to_le_bytes());
            }
            for &t in &s.tokens[position as usize..end] {
                tokens.extend_from_slice(&(t as i32).to_le_bytes());
            }
            for &pg in &s.table.pages[..table_len] {
                pages.extend_from_slice(&(pg as i32).to_le_bytes());
            }
        }
        let model = self.model.clone();
        let spans = Value::buffer(spans);
        let (r, decls) = model.invoke(
            "encode_epoch",
            &ENCODE,
            &[
                model.state().clone(),
                Value::I64(i64::from(self.pool_pages)),
                spans.clone(),
                Value::buffer(tokens),
                Value::buffer(pages),
            ],
            model.doc.fuel.entry("encode_epoch"),
        );
        let out = r?;
        let stage = out[0].as_i64().unwrap_or(-1);
        let output_bytes = out[1].as_i64().unwrap_or(-1);
        let packets = [
            out[2].as_buffer().unwrap_or_default(),
            out[3].as_buffer().unwrap_or_default(),
        ];
        let plan_buf = out[4].as_buffer().unwrap_or_default();
        let (plan_off, plan_len) = (out[5].as_i64().unwrap_or(-1), out[6].as_i64().unwrap_or(-1));
        if output_bytes <= 0 {
            return Err(Error::Program(format!(
                "encode_epoch returned an output of {output_bytes} bytes; it must be positive"
            )));
        }
        let set = match model.cached_stages(&decls) {
            Some(s) => s,
            None => model.stages_for(decls)?,
        };
        let Some(prepared) = usize::try_from(stage).ok().and_then(|i| set.stages.get(i)) else {
            return Err(Error::Program(format!(
                "encode_epoch selected stage {stage}; {} stages are declared",
                set.stages.len()
            )));
        };
        let inputs = &prepared.reflection.inputs;
        if inputs.len() < 2 {
            return Err(Error::Program(format!(
                "encode_epoch selected stage `{}`, which has {} input(s); a sequence stage's first two inputs \
                 are the metadata and input buffers",
                prepared.decl.root,
                inputs.len()
            )));
        }
        let sizes = [inputs[0].bytes, inputs[1].bytes];
        let placements = plan::placements(
            plan_buf,
            plan_off,
            plan_len,
            [packets[0].len() as u64, packets[1].len() as u64],
            sizes,
        )
        .map_err(|m| Error::Program(format!("encode_epoch: {m}")))?;
        // The capture is asked for and checked before any row changes.
        let (r, _) = model.invoke(
            "capture_epoch",
            &CAPTURE,
            &[
                model.state().clone(),
                Value::I64(stage),
                Value::I64(plan.len() as i64),
                spans,
            ],
            model.doc.fuel.entry("capture_epoch"),
        );
        let captures = plan::captures(
            r?[0].as_buffer().unwrap_or_default(),
            plan.len(),
            output_bytes as u64,
        )
        .map_err(|m| Error::Program(format!("capture_epoch: {m}")))?;
        let targets = [self.target(0, sizes[0])?, self.target(1, sizes[1])?];
        let mut listed = 0u64;
        for Placement {
            source,
            source_offset,
            target,
            target_offset,
            length,
        } in placements
        {
            let from = &packets[source][source_offset as usize..(source_offset + length) as usize];
            model.device.write(&targets[target], target_offset, from)?;
            listed += length;
        }
        self.metrics.uploaded.fetch_add(listed, Ordering::Relaxed);
        self.metrics
            .upload_capacity
            .fetch_add(sizes[0] + sizes[1], Ordering::Relaxed);
        let output = model.device.alloc(output_bytes as u64, &model.budget)?;
        let mut run = model.invoke_run(
            "run",
            &RUN,
            &[
                Value::I64(stage),
                Value::native("hal.buffer", targets[0].clone()),
                Value::native("hal.buffer", targets[1].clone()),
                Value::native("hal.buffer", self.pool_buf.clone()),
                Value::native("hal.buffer", output.clone()),
            ],
            model.doc.fuel.entry("run"),
            set,
            0,
            None,
            &[],
        );
        model.settle(&mut run)?;
        if run.signalled.is_empty() {
            return Err(Error::Program(
                "run submitted no work (call runner.execute_4)".into(),
            ));
        }
        let mut per_span = vec![Vec::new(); plan.len()];
        for c in captures {
            per_span[c.span].extend(model.device.read(&output, c.offset, c.length)?);
        }
        Ok(per_span)
    }
}
