//! The finite contract: `prepare_request`, `prepare_batch`, `run`, and the cohort scheduler.
//!
//! # Protocol
//!
//! * **Admission.** [`FiniteService::submit`] runs `prepare_request(state, input)` on the caller's thread, so a
//!   bad input fails fast with the trap's message and never reaches the queue. A request whose units exceed the
//!   cold batch-unit limit is refused there too. A full queue refuses with [`Error::Overloaded`]. The caller is
//!   an HTTP blocking worker, or the async worker itself while [`FiniteService::admits_inline`] holds (a small
//!   fuel budget and quick recent admissions: the hand-off costs a thread wake-up).
//! * **In place.** A request that arrives alone, when nothing is waiting, no cohort is running and the model's
//!   cohorts are quick, runs its cohort of one on the submitting thread ([`FiniteService::submit_one`]). This is
//!   the scheduler's own rule (the oldest request, filled with the compatible waiting ones: none) without the
//!   two wake-ups of a round trip through the scheduler thread, which cost more than such a cohort runs for.
//!   One cohort of a model runs at a time either way (the `exec` lock).
//! * **Scheduling.** One scheduler thread per model owns the waiting queue (nobody else touches it; callers
//!   send it requests over a channel). It takes the *oldest* waiting request, then fills the cohort with
//!   waiting requests of the same compatibility tag, oldest first, while the units fit the batch-unit limit.
//!   It never waits for requests that have not arrived.
//! * **Execution.** `prepare_batch(state, stage_tags, ranges, prepared)` runs with the invocation-scoped
//!   `prepare` capability; its declarations, if any, are looked up in the model's specialization cache (the exact
//!   declaration set) or compiled on the shared compile queue. The upload payload goes into a fresh device input
//!   buffer, `run(stage, input, output)` enqueues the stage, and the scheduler waits for the last work point.
//!   Only the live prefix of the output is downloaded, once per cohort (a compact snapshot); the result plan maps
//!   physical rows to requests.
//! * **Cancellation.** A cancelled request that is still waiting is dropped from the queue. One that was
//!   accepted into a cohort stays a member: the cohort runs and is collected whole; only the reply is discarded.
//! * **Failure.** When a cohort of several requests fails, each member is retried alone, so one bad request
//!   (say, a token id outside the vocabulary) fails only itself.
//!
//! Record layouts are in `docs/serving/finite.md`.

use crate::checkpoint::Source;
use crate::model::{InvocationSet, Model, invoke, limits, resolve_source_path};
use crate::natives::{Phase, RunCtx};
use crate::{Error, Result};
use loom_vm::Value;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

/// A request after `prepare_request`.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub bytes: Arc<Vec<u8>>,
    pub units: i64,
    pub tag: i64,
}

/// One request's result: its rows of f32 values (an embedding, or a decision's probabilities).
pub type Rows = Vec<Vec<f32>>;

/// The reply callback of one request.
pub type Reply = Box<dyn FnOnce(Result<Rows>) + Send>;

struct Pending {
    prepared: Prepared,
    reply: Reply,
    cancelled: Arc<AtomicBool>,
    arrived: Instant,
}

enum Cmd {
    Request(Pending),
    /// Finish everything accepted, then stop.
    Drain(mpsc::Sender<()>),
}

/// Counters the HTTP layer exports as Prometheus metrics.
#[derive(Debug, Default)]
pub struct Metrics {
    pub requests: AtomicU64,
    pub failed: AtomicU64,
    pub refused: AtomicU64,
    pub cancelled_waiting: AtomicU64,
    pub cohorts: AtomicU64,
    pub cohort_members: AtomicU64,
    pub cohort_max: AtomicU64,
    pub cohorts_shared: AtomicU64,
    pub retried_alone: AtomicU64,
    pub device_ns: AtomicU64,
    pub queue: AtomicUsize,
    /// A moving average of `prepare_request`'s wall time (ns), for [`FiniteService::admits_inline`].
    pub admit_ns: AtomicU64,
    /// A moving average of a cohort's wall time (ns), for [`FiniteService::submit_one`].
    pub cohort_ns: AtomicU64,
    /// Cohorts run in place by the submitting thread (a subset of `cohorts`).
    pub cohorts_in_place: AtomicU64,
}

/// A cohort runs in place on the submitting thread only while cohorts average below this (see
/// [`FiniteService::submit_one`]).
pub const IN_PLACE_COHORT_NS: u64 = 200_000;

/// Folds a sample into a moving average (weight 1/8).
fn fold(avg: &AtomicU64, sample: Duration) {
    let ns = sample.as_nanos().min(u64::MAX as u128) as u64;
    let a = avg.load(Ordering::Relaxed);
    avg.store(a - a / 8 + ns / 8, Ordering::Relaxed);
}

/// The largest `fuel.prepare_request` budget whose admission may run on an async worker (see
/// [`FiniteService::admits_inline`]); about a millisecond of interpreted code at worst.
pub const INLINE_ADMISSION_FUEL: u64 = 1_000_000;

/// Admission runs inline while its moving average stays below this.
pub const INLINE_ADMISSION_NS: u64 = 100_000;

/// A model serving the finite contract.
pub struct FiniteService {
    pub model: Arc<Model>,
    pub metrics: Arc<Metrics>,
    tx: Mutex<Option<mpsc::Sender<Cmd>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Held while a cohort runs, by the scheduler thread or by a submitter running one in place: one cohort of
    /// a model at a time.
    exec: Arc<Mutex<()>>,
}

impl std::fmt::Debug for FiniteService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FiniteService")
            .field("model", &self.model.name)
            .finish_non_exhaustive()
    }
}

/// A handle the caller keeps to cancel its request.
#[derive(Debug, Clone)]
pub struct Ticket {
    cancelled: Arc<AtomicBool>,
    /// The units `prepare_request` counted (reported as usage).
    pub units: i64,
}

impl Ticket {
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::Relaxed);
    }
}

impl FiniteService {
    pub fn start(model: Arc<Model>) -> Arc<FiniteService> {
        let (tx, rx) = mpsc::channel();
        let metrics = Arc::new(Metrics::default());
        // Nothing runs on the caller's thread until this model has shown its admissions and cohorts are quick:
        // the averages start high and fall below the thresholds after a few dozen fast ones.
        metrics
            .admit_ns
            .store(10 * INLINE_ADMISSION_NS, Ordering::Relaxed);
        metrics
            .cohort_ns
            .store(50 * IN_PLACE_COHORT_NS, Ordering::Relaxed);
        let m = model.clone();
        let met = metrics.clone();
        let exec = Arc::new(Mutex::new(()));
        let ex = exec.clone();
        let thread = std::thread::Builder::new()
            .name(format!("sched-{}", model.name))
            .spawn(move || scheduler(m, met, rx, ex))
            .expect("spawning a scheduler thread; this is a bug");
        Arc::new(FiniteService {
            model,
            metrics,
            tx: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
            exec,
        })
    }

    /// Whether a caller on an async worker may run [`submit`](Self::submit) in place instead of handing it to a
    /// blocking thread: the package's `prepare_request` budget is small ([`INLINE_ADMISSION_FUEL`]) and recent
    /// admissions were quick ([`INLINE_ADMISSION_NS`], a moving average). The hand-off costs a thread wake-up,
    /// which is most of a small request's latency; a slow or hostile `prepare_request` still stalls an async
    /// worker at most for its fuel budget, once, before the average sends its requests to the blocking pool.
    pub fn admits_inline(&self) -> bool {
        self.model.doc.fuel.prepare_request <= INLINE_ADMISSION_FUEL
            && self.metrics.admit_ns.load(Ordering::Relaxed) < INLINE_ADMISSION_NS
    }

    /// Runs `prepare_request` here, then queues the request. `reply` is called exactly once, from the scheduler
    /// thread, unless this returns an error (then it is not called).
    pub fn submit(&self, input: Vec<u8>, reply: Reply) -> Result<Ticket> {
        let prepared = self.admit(input)?;
        let q = self.metrics.queue.fetch_add(1, Ordering::Relaxed);
        if q >= self.model.doc.capacities.max_queue {
            self.metrics.queue.fetch_sub(1, Ordering::Relaxed);
            self.metrics.refused.fetch_add(1, Ordering::Relaxed);
            return Err(Error::Overloaded(format!(
                "model `{}` has {q} requests waiting (capacities.max_queue)",
                self.model.name
            )));
        }
        let cancelled = Arc::new(AtomicBool::new(false));
        let units = prepared.units;
        let p = Pending {
            prepared,
            reply,
            cancelled: cancelled.clone(),
            arrived: Instant::now(),
        };
        let sent = self
            .tx
            .lock()
            .ok()
            .and_then(|g| g.as_ref().map(|tx| tx.send(Cmd::Request(p)).is_ok()));
        if sent != Some(true) {
            self.metrics.queue.fetch_sub(1, Ordering::Relaxed);
            return Err(Error::NotReady {
                name: self.model.name.clone(),
                status: "draining".into(),
            });
        }
        Ok(Ticket { cancelled, units })
    }

    /// Counts the request, checks its size and runs `prepare_request`.
    fn admit(&self, input: Vec<u8>) -> Result<Prepared> {
        self.metrics.requests.fetch_add(1, Ordering::Relaxed);
        let max = self.model.doc.capacities.max_request_bytes;
        if input.len() > max {
            self.metrics.failed.fetch_add(1, Ordering::Relaxed);
            return Err(Error::BadRequest(format!(
                "the input record is {} bytes; model `{}` accepts at most {max} (capacities.max_request_bytes)",
                input.len(),
                self.model.name
            )));
        }
        let t0 = Instant::now();
        let prepared = self.model.prepare_request(input);
        fold(&self.metrics.admit_ns, t0.elapsed());
        let prepared = prepared.inspect_err(|_| {
            self.metrics.failed.fetch_add(1, Ordering::Relaxed);
        })?;
        Ok(prepared)
    }

    /// [`submit`](Self::submit) for a request that arrives alone, from a caller that may block for a short
    /// while (see [`admits_inline`](Self::admits_inline)). When nothing is waiting, no cohort is running and
    /// this model's cohorts are quick ([`IN_PLACE_COHORT_NS`]), the request's cohort (itself: nothing else is
    /// waiting to join it, and the scheduler never waits for arrivals) runs here and `reply` is called before
    /// this returns: the hand-off to the scheduler thread and back would cost two thread wake-ups, more than
    /// such a cohort runs for. Otherwise the request is queued as by `submit`. Order is kept: it runs in place
    /// only when it is the oldest request of the model.
    pub fn submit_one(&self, input: Vec<u8>, reply: Reply) -> Result<Ticket> {
        let quick = self.metrics.cohort_ns.load(Ordering::Relaxed) < IN_PLACE_COHORT_NS;
        if !quick || self.metrics.queue.load(Ordering::Relaxed) != 0 {
            return self.submit(input, reply);
        }
        let Ok(guard) = self.exec.try_lock() else {
            return self.submit(input, reply);
        };
        if self.metrics.queue.load(Ordering::Relaxed) != 0
            || self.tx.lock().map(|g| g.is_none()).unwrap_or(true)
        {
            drop(guard);
            return self.submit(input, reply);
        }
        let prepared = self.admit(input)?;
        let units = prepared.units;
        self.metrics.cohorts.fetch_add(1, Ordering::Relaxed);
        self.metrics.cohort_members.fetch_add(1, Ordering::Relaxed);
        self.metrics.cohort_max.fetch_max(1, Ordering::Relaxed);
        self.metrics
            .cohorts_in_place
            .fetch_add(1, Ordering::Relaxed);
        let t1 = Instant::now();
        let r = self.model.run_cohort(&[&prepared]).map(|mut r| r.remove(0));
        let took = t1.elapsed();
        drop(guard);
        fold(&self.metrics.cohort_ns, took);
        self.metrics
            .device_ns
            .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
        if r.is_err() {
            self.metrics.failed.fetch_add(1, Ordering::Relaxed);
        }
        reply(r);
        Ok(Ticket {
            cancelled: Arc::new(AtomicBool::new(false)),
            units,
        })
    }

    /// Stops accepting requests, finishes every accepted one, and joins the scheduler. Idempotent.
    pub fn drain(&self) {
        let tx = self.tx.lock().ok().and_then(|mut g| g.take());
        if let Some(tx) = tx {
            let (done_tx, done_rx) = mpsc::channel();
            if tx.send(Cmd::Drain(done_tx)).is_ok() {
                let _ = done_rx.recv();
            }
        }
        if let Some(t) = self.thread.lock().ok().and_then(|mut g| g.take()) {
            let _ = t.join();
        }
        // A cohort running in place (accepted before the drain) finishes too.
        drop(self.exec.lock());
    }
}

fn scheduler(
    model: Arc<Model>,
    metrics: Arc<Metrics>,
    rx: mpsc::Receiver<Cmd>,
    exec: Arc<Mutex<()>>,
) {
    let mut waiting: VecDeque<Pending> = VecDeque::new();
    let mut drain: Option<mpsc::Sender<()>> = None;
    loop {
        if waiting.is_empty() {
            if let Some(d) = drain.take() {
                let _ = d.send(());
                return;
            }
            match rx.recv() {
                Ok(Cmd::Request(p)) => waiting.push_back(p),
                Ok(Cmd::Drain(d)) => drain = Some(d),
                Err(_) => return,
            }
        }
        // Take whatever else has already arrived; never wait for more.
        while let Ok(c) = rx.try_recv() {
            match c {
                Cmd::Request(p) => waiting.push_back(p),
                Cmd::Drain(d) => drain = Some(d),
            }
        }
        waiting.retain(|p| {
            let keep = !p.cancelled.load(Ordering::Relaxed);
            if !keep {
                metrics.queue.fetch_sub(1, Ordering::Relaxed);
                metrics.cancelled_waiting.fetch_add(1, Ordering::Relaxed);
            }
            keep
        });
        let Some(first) = waiting.pop_front() else {
            continue;
        };
        let tag = first.prepared.tag;
        let limit = model.cold.batch_units;
        let mut units = first.prepared.units;
        let mut cohort = vec![first];
        let mut i = 0;
        while i < waiting.len() {
            let p = &waiting[i];
            if p.prepared.tag == tag && units + p.prepared.units <= limit {
                units += p.prepared.units;
                cohort.push(waiting.remove(i).expect("index checked; this is a bug"));
            } else {
                i += 1;
            }
        }
        metrics.queue.fetch_sub(cohort.len(), Ordering::Relaxed);
        let n = cohort.len() as u64;
        metrics.cohorts.fetch_add(1, Ordering::Relaxed);
        metrics.cohort_members.fetch_add(n, Ordering::Relaxed);
        metrics.cohort_max.fetch_max(n, Ordering::Relaxed);
        if n > 1 {
            metrics.cohorts_shared.fetch_add(1, Ordering::Relaxed);
        }
        let guard = exec.lock().unwrap_or_else(|e| e.into_inner());
        let t0 = Instant::now();
        let members: Vec<&Prepared> = cohort.iter().map(|p| &p.prepared).collect();
        let results = match model.run_cohort(&members) {
            Ok(r) => r.into_iter().map(Ok).collect::<Vec<_>>(),
            Err(e) if cohort.len() > 1 => {
                log::debug!(
                    "model {}: cohort of {n} failed ({e}); retrying each alone",
                    model.name
                );
                metrics.retried_alone.fetch_add(n, Ordering::Relaxed);
                members
                    .iter()
                    .map(|m| model.run_cohort(&[*m]).map(|mut r| r.remove(0)))
                    .collect()
            }
            Err(e) => vec![Err(e)],
        };
        let took = t0.elapsed();
        drop(members);
        drop(guard);
        fold(&metrics.cohort_ns, took);
        metrics
            .device_ns
            .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
        for (p, r) in cohort.into_iter().zip(results) {
            if r.is_err() {
                metrics.failed.fetch_add(1, Ordering::Relaxed);
            }
            let _ = p.arrived;
            (p.reply)(r);
        }
    }
}

/// Little-endian i64 at record index `i` of `b`.
fn i64_at(b: &[u8], i: usize) -> Option<i64> {
    b.get(i * 8..i * 8 + 8)
        .map(|s| i64::from_le_bytes(s.try_into().unwrap_or([0; 8])))
}

/// How long the scheduler waits for a cohort's device work before failing it.
pub const DEVICE_TIMEOUT: Duration = Duration::from_secs(300);

impl Model {
    /// Runs `prepare_request(state, input)`.
    pub fn prepare_request(&self, input: Vec<u8>) -> Result<Prepared> {
        let lim = limits(
            self.doc.fuel.prepare_request,
            self.doc.memory.invocation_bytes,
        );
        let (r, _) = invoke(
            &self.control,
            "prepare_request",
            &[self.cold.state.clone(), Value::buffer(input)],
            &lim,
            self.ctx(Phase::Request),
        );
        let out = r.map_err(|e| match e {
            Error::Trap { entry, message } => Error::BadRequest(format!("{entry}: {message}")),
            e => e,
        })?;
        let bytes = match &out[0] {
            Value::Buffer(b) => b.clone(),
            _ => Arc::new(Vec::new()),
        };
        let units = out[1].as_i64().unwrap_or(0);
        let tag = out[2].as_i64().unwrap_or(0);
        if units <= 0 {
            return Err(Error::Program(format!(
                "prepare_request returned {units} units; units must be positive"
            )));
        }
        if units > self.cold.batch_units {
            return Err(Error::BadRequest(format!(
                "this input needs {units} units, more than model `{}`'s batch-unit limit of {}",
                self.name, self.cold.batch_units
            )));
        }
        Ok(Prepared { bytes, units, tag })
    }

    /// Invocation-declared stages: the cached set for this exact declaration set, or a fresh one (new sources
    /// opened and indexed, stages compiled on the shared queue, parameters placed).
    fn invocation_stages(&self, decls: crate::natives::Decls) -> Result<Arc<InvocationSet>> {
        {
            let mut c = self
                .spec_cache
                .lock()
                .map_err(|_| Error::Internal("spec cache poisoned".into()))?;
            if let Some(i) = c.entries.iter().position(|(d, _)| *d == decls) {
                let e = c.entries.remove(i);
                let set = e.1.clone();
                c.entries.push(e);
                c.hits += 1;
                return Ok(set);
            }
            c.misses += 1;
        }
        let mut sources = self.sources.clone();
        for (i, shards) in decls.sources.iter().enumerate() {
            let ordinal = self.sources.len() + i;
            let mut paths = Vec::with_capacity(shards.len());
            for (dir, path) in shards {
                paths.push(resolve_source_path(
                    &self.files,
                    &self.asset_root,
                    dir,
                    path,
                    ordinal,
                )?);
            }
            sources
                .push(Arc::new(Source::open(&paths).map_err(|m| {
                    Error::Checkpoint(format!("source {ordinal}: {m}"))
                })?));
        }
        let stages =
            self.build_stages(&decls.stages, &decls.params, self.stages.len(), &sources)?;
        let built = Arc::new(InvocationSet { stages, sources });
        let mut c = self
            .spec_cache
            .lock()
            .map_err(|_| Error::Internal("spec cache poisoned".into()))?;
        c.entries.push((decls, built.clone()));
        let mut evicted = false;
        while c.entries.len() > self.doc.specialization_cache {
            c.entries.remove(0);
            evicted = true;
        }
        drop(c);
        if evicted {
            // Resident buffers only an evicted set used are released (cohorts still running keep theirs).
            if let Ok(mut d) = self.domains.lock() {
                d.retain(|_, b| b.holders() > 1);
            }
        }
        Ok(built)
    }

    /// Runs one cohort through `prepare_batch` and `run`; one result per member, in order.
    pub fn run_cohort(&self, members: &[&Prepared]) -> Result<Vec<Rows>> {
        let t_start = Instant::now();
        // prepare_batch(state, stage_tags, ranges, prepared)
        let mut tags = Vec::with_capacity(self.stages.len() * 8);
        for s in &self.stages {
            tags.extend_from_slice(&s.decl.tag.to_le_bytes());
        }
        let total: usize = members.iter().map(|m| m.bytes.len()).sum();
        let mut bytes = Vec::with_capacity(total);
        let mut ranges = Vec::with_capacity(members.len() * 16);
        for m in members {
            ranges.extend_from_slice(&(bytes.len() as i64).to_le_bytes());
            ranges.extend_from_slice(&(m.bytes.len() as i64).to_le_bytes());
            bytes.extend_from_slice(&m.bytes);
        }
        let lim = limits(
            self.doc.fuel.prepare_batch,
            self.doc.memory.invocation_bytes,
        );
        let mut ctx = self.ctx(Phase::Batch);
        ctx.stage_base = self.stages.len();
        ctx.source_base = self.sources.len();
        let (r, ctx) = invoke(
            &self.control,
            "prepare_batch",
            &[
                self.cold.state.clone(),
                Value::buffer(tags),
                Value::buffer(ranges),
                Value::buffer(bytes),
            ],
            &lim,
            ctx,
        );
        let out = r?;
        let stage_index = out[0].as_i64().unwrap_or(-1);
        let upload = out[1].as_buffer().unwrap_or_default().to_vec();
        let plan = out[2].as_buffer().unwrap_or_default().to_vec();

        let mut stages = self.stages.clone();
        let mut sources = self.sources.clone();
        if !ctx.decls.stages.is_empty() {
            let set = self.invocation_stages(ctx.decls)?;
            stages.extend(set.stages.iter().cloned());
            sources = set.sources.clone();
        } else if !ctx.decls.params.is_empty() || !ctx.decls.sources.is_empty() {
            return Err(Error::Program(
                "prepare_batch declared sources or parameters but no stage".into(),
            ));
        }
        let stage = usize::try_from(stage_index)
            .ok()
            .and_then(|i| stages.get(i))
            .cloned()
            .ok_or_else(|| {
                Error::Program(format!(
                    "prepare_batch selected stage {stage_index}; {} stages are declared",
                    stages.len()
                ))
            })?;
        let plan = ResultPlan::parse(&plan, members.len(), self.cold.result_capacity)?;
        if upload.len() as i64 > self.cold.upload_capacity {
            return Err(Error::Program(format!(
                "prepare_batch returned a {}-byte upload; the declared upload capacity is {}",
                upload.len(),
                self.cold.upload_capacity
            )));
        }
        if plan.output_bytes as i64 > self.cold.output_capacity {
            return Err(Error::Program(format!(
                "the result plan's output is {} bytes; the declared output capacity is {}",
                plan.output_bytes, self.cold.output_capacity
            )));
        }
        let _ = stage;

        // Upload, run, wait, download the live prefix.
        let t_batch = Instant::now();
        let input = self.device.alloc(upload.len() as u64, &self.budget)?;
        self.device.write(&input, 0, &upload)?;
        let output = self.device.alloc(plan.output_bytes, &self.budget)?;
        let mut tl = self
            .timeline_value
            .lock()
            .map_err(|_| Error::Internal("timeline poisoned".into()))?;
        let mut ctx = self.ctx(Phase::Run);
        ctx.runner = Some(RunCtx {
            device: self.device.clone(),
            budget: self.budget.clone(),
            stages,
            timeline: self.timeline,
            value: *tl,
            joins: Vec::new(),
            signalled: Vec::new(),
            sources,
            gather: self.gather.clone(),
            gathers: Vec::new(),
            feedback: Vec::new(),
            feedback_limit: plan.live_bytes,
        });
        let lim = limits(self.doc.fuel.run, self.doc.memory.invocation_bytes);
        let (r, ctx) = invoke(
            &self.control,
            "run",
            &[
                Value::I64(stage_index),
                Value::native("hal.buffer", input.clone()),
                Value::native("hal.buffer", output.clone()),
            ],
            &lim,
            ctx,
        );
        let runner = ctx.runner.expect("the runner context stays; this is a bug");
        *tl = runner.value;
        drop(tl);
        // Accepted work is collected even when the invocation trapped after submitting it.
        let last = runner.signalled.last().copied();
        let t_run = Instant::now();
        if let Some(p) = last {
            match self.device.wait(p, DEVICE_TIMEOUT.as_nanos() as u64) {
                Ok(true) => {}
                Ok(false) => {
                    return Err(Error::Device(format!(
                        "model `{}`: device work did not finish within {DEVICE_TIMEOUT:?}",
                        self.name
                    )));
                }
                Err(e) => {
                    r?;
                    return Err(Error::BadRequest(format!("device execution failed: {e}")));
                }
            }
        }
        // Every gather of the invocation retires before the cohort does; a failed one fails the cohort.
        for g in &runner.gathers {
            let _ = self.device.wait(*g, DEVICE_TIMEOUT.as_nanos() as u64);
        }
        for g in &runner.gathers {
            if let Some(e) = self.gather.failure(*g) {
                r?;
                return Err(Error::BadRequest(e));
            }
        }
        r?;
        if last.is_none() {
            return Err(Error::Program(
                "run submitted no work (call runner.execute_N)".into(),
            ));
        }
        // The compact snapshot: the feedback slots in order when the program asked for them (their total must
        // be the plan's live bytes), else the output's live prefix.
        let t_wait = Instant::now();
        let live = if runner.feedback.is_empty() {
            self.device.read(&output, 0, plan.live_bytes)?
        } else {
            let mut live = Vec::with_capacity(plan.live_bytes as usize);
            for (after, buf, off, len) in &runner.feedback {
                if let Err(e) = self.device.wait(*after, DEVICE_TIMEOUT.as_nanos() as u64) {
                    return Err(Error::BadRequest(format!("device execution failed: {e}")));
                }
                live.extend(self.device.read(buf, *off, *len)?);
            }
            if live.len() as u64 != plan.live_bytes {
                return Err(Error::Program(format!(
                    "runner.feedback slots hold {} bytes; the result plan's live prefix is {}",
                    live.len(),
                    plan.live_bytes
                )));
            }
            live
        };
        let rows = plan.split(&live);
        if log::log_enabled!(log::Level::Trace) {
            let us = |a: Instant, b: Instant| b.duration_since(a).as_micros();
            let end = Instant::now();
            log::trace!(
                "model {}: cohort of {}: prepare_batch {} us, upload+run {} us, device wait {} us, download {} us",
                self.name,
                members.len(),
                us(t_start, t_batch),
                us(t_batch, t_run),
                us(t_run, t_wait),
                us(t_wait, end)
            );
        }
        Ok(rows)
    }
}

/// A parsed result plan (see `docs/serving/finite.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResultPlan {
    pub output_bytes: u64,
    pub live_bytes: u64,
    /// Per request: (first row, row count).
    pub requests: Vec<(usize, usize)>,
    /// Per row: (byte offset, byte width) within the live prefix.
    pub rows: Vec<(u64, u64)>,
}

impl ResultPlan {
    /// Parses and checks a plan for `n` requests: every row lies inside the live prefix, which lies inside
    /// the output; widths are whole f32 values; each request's rows fit `result_capacity` bytes.
    pub fn parse(b: &[u8], n: usize, result_capacity: i64) -> Result<ResultPlan> {
        let bad = |m: String| Error::Program(format!("prepare_batch result plan: {m}"));
        let h = |i: usize| i64_at(b, i).ok_or_else(|| bad(format!("truncated at record {i}")));
        let output_bytes = h(0)?;
        let live_bytes = h(1)?;
        let n_req = h(2)?;
        let n_rows = h(3)?;
        if output_bytes <= 0 || live_bytes < 0 || live_bytes > output_bytes {
            return Err(bad(format!(
                "output {output_bytes} bytes, live prefix {live_bytes}: need 0 <= live <= output, output > 0"
            )));
        }
        if n_req != n as i64 {
            return Err(bad(format!("{n_req} requests, the cohort has {n}")));
        }
        if !(0..=1 << 20).contains(&n_rows) {
            return Err(bad(format!("{n_rows} rows")));
        }
        let want = (4 + 2 * n + 2 * n_rows as usize) * 8;
        if b.len() != want {
            return Err(bad(format!(
                "{} bytes, expected {want} for {n} requests and {n_rows} rows",
                b.len()
            )));
        }
        let mut requests = Vec::with_capacity(n);
        for r in 0..n {
            let first = h(4 + 2 * r)?;
            let count = h(5 + 2 * r)?;
            if first < 0 || count < 0 || first + count > n_rows {
                return Err(bad(format!(
                    "request {r}: rows {first}..{} are outside 0..{n_rows}",
                    first + count
                )));
            }
            requests.push((first as usize, count as usize));
        }
        let base = 4 + 2 * n;
        let mut rows = Vec::with_capacity(n_rows as usize);
        for i in 0..n_rows as usize {
            let off = h(base + 2 * i)?;
            let width = h(base + 2 * i + 1)?;
            if off < 0 || width < 0 || width % 4 != 0 || off % 4 != 0 || off + width > live_bytes {
                return Err(bad(format!(
                    "row {i}: bytes {off}+{width} must be 4-aligned whole f32 values inside the {live_bytes}-byte live prefix"
                )));
            }
            rows.push((off as u64, width as u64));
        }
        for (r, &(first, count)) in requests.iter().enumerate() {
            let bytes: u64 = rows[first..first + count].iter().map(|r| r.1).sum();
            if bytes as i64 > result_capacity {
                return Err(bad(format!(
                    "request {r}: {bytes} result bytes, over the declared result capacity {result_capacity}"
                )));
            }
        }
        Ok(ResultPlan {
            output_bytes: output_bytes as u64,
            live_bytes: live_bytes as u64,
            requests,
            rows,
        })
    }

    /// Each request's rows from the downloaded live prefix.
    pub fn split(&self, live: &[u8]) -> Vec<Rows> {
        self.requests
            .iter()
            .map(|&(first, count)| {
                self.rows[first..first + count]
                    .iter()
                    .map(|&(off, w)| {
                        live[off as usize..(off + w) as usize]
                            .chunks_exact(4)
                            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                            .collect()
                    })
                    .collect()
            })
            .collect()
    }
}
