//! [`FiniteService`]: admission, the in-place path for a lone quick request, and the handle to the model's
//! scheduler thread (see the module docs of [`super`]).

use super::metrics::{Metrics, fold};
use super::scheduler::{Cmd, Ctx, Gate, Pending, count_cohort, finish, scheduler};
use super::{Limits, cohort};
use serve_runtime::contract::{Series, Service};
use serve_runtime::model::Model;
use serve_runtime::{Error, Result};
use std::any::Any;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, mpsc};
use std::time::Instant;

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

/// A cohort runs in place on the submitting thread only while cohorts average below this (see
/// [`FiniteService::submit_one`]), unless the model's `options.in_place_cohort_us` says otherwise.
pub const IN_PLACE_COHORT_NS: u64 = 200_000;

/// The model's in-place threshold in nanoseconds: `options.in_place_cohort_us` (a number of microseconds,
/// at least 0; 0 never runs in place) or [`IN_PLACE_COHORT_NS`]. Anything else is refused naming the field.
/// The average starts at 50 times the default (10 ms) whatever the threshold, so a threshold above that runs
/// lone requests in place from the first one.
pub(super) fn in_place_threshold_ns(
    options: &serde_json::Map<String, serde_json::Value>,
) -> Result<u64> {
    match options.get("in_place_cohort_us") {
        None => Ok(IN_PLACE_COHORT_NS),
        Some(v) => v
            .as_f64()
            .filter(|us| us.is_finite() && (0.0..=60e6).contains(us))
            .map(|us| (us * 1000.0) as u64)
            .ok_or_else(|| {
                Error::package(
                    "model.json",
                    "options.in_place_cohort_us",
                    format!("expected a number of microseconds from 0 to 60000000, found {v}"),
                )
            }),
    }
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
    /// What cold `prepare` declared.
    pub limits: Limits,
    tx: Mutex<Option<mpsc::Sender<Cmd>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The cohorts submitted and not yet collected (the scheduler's pipeline, or one run in place).
    gate: Arc<Gate>,
    /// Cohorts run in place while they average below this ([`in_place_threshold_ns`]).
    in_place_ns: u64,
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
    cancelled: Arc<RequestCancel>,
    /// The units `prepare_request` counted (reported as usage).
    pub units: i64,
}

impl Ticket {
    /// The client is gone: a waiting request leaves the queue; when every member of the running cohort it
    /// belongs to is gone, the cohort's device work is cancelled (its kernels stop at their next loop
    /// iteration or program instance).
    pub fn cancel(&self) {
        self.cancelled.cancel();
    }
}

/// One request's cancellation: its flag and, once it runs, its cohort's.
#[derive(Debug, Default)]
pub(crate) struct RequestCancel {
    /// Both under one lock, so that a cancel racing the cohort's start is counted exactly once.
    inner: Mutex<(bool, Option<Arc<CohortCancel>>)>,
}

impl RequestCancel {
    pub(crate) fn is_cancelled(&self) -> bool {
        self.inner.lock().map(|g| g.0).unwrap_or(true)
    }

    fn cancel(&self) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if std::mem::replace(&mut g.0, true) {
            return;
        }
        if let Some(c) = g.1.clone() {
            drop(g);
            c.member_gone();
        }
    }

    /// The request joins running cohort `c` (a request already cancelled counts as gone at once).
    pub(crate) fn join(&self, c: &Arc<CohortCancel>) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.1 = Some(c.clone());
        if g.0 {
            drop(g);
            c.member_gone();
        }
    }
}

/// A running cohort's cancellation: its live member count and the device flag its dispatches carry.
#[derive(Debug)]
pub(crate) struct CohortCancel {
    live: std::sync::atomic::AtomicUsize,
    pub(crate) flag: Option<Arc<serve_runtime::device::CancelFlag>>,
}

impl CohortCancel {
    pub(crate) fn new(
        members: usize,
        flag: Option<Arc<serve_runtime::device::CancelFlag>>,
    ) -> Self {
        CohortCancel {
            live: std::sync::atomic::AtomicUsize::new(members),
            flag,
        }
    }

    fn member_gone(&self) {
        if self.live.fetch_sub(1, Ordering::AcqRel) == 1 {
            if let Some(f) = &self.flag {
                f.signal();
            }
        }
    }

    /// Whether every member's client is gone.
    pub(crate) fn all_gone(&self) -> bool {
        self.live.load(Ordering::Acquire) == 0
    }
}

impl FiniteService {
    /// Starts the scheduler thread of `model`, whose cold `prepare` returned `limits`.
    pub fn start(model: Arc<Model>, limits: Limits, in_place_ns: u64) -> Arc<FiniteService> {
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
        let gate = Arc::new(Gate::default());
        let ctx = Ctx {
            model: model.clone(),
            limits,
            metrics: metrics.clone(),
            gate: gate.clone(),
        };
        let me = tx.clone();
        let thread = std::thread::Builder::new()
            .name(format!("sched-{}", model.name))
            .spawn(move || scheduler(ctx, rx, me))
            .expect("spawning a scheduler thread; this is a bug");
        Arc::new(FiniteService {
            model,
            metrics,
            limits,
            tx: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
            gate,
            in_place_ns,
        })
    }

    /// Whether a caller on an async worker may run [`submit`](Self::submit) in place instead of handing it to a
    /// blocking thread: the package's `prepare_request` budget is small ([`INLINE_ADMISSION_FUEL`]) and recent
    /// admissions were quick ([`INLINE_ADMISSION_NS`], a moving average). The hand-off costs a thread wake-up,
    /// which is most of a small request's latency; a slow or hostile `prepare_request` still stalls an async
    /// worker at most for its fuel budget, once, before the average sends its requests to the blocking pool.
    pub fn admits_inline(&self) -> bool {
        self.model.doc.fuel.entry("prepare_request") <= INLINE_ADMISSION_FUEL
            && self.metrics.admit_ns.load(Ordering::Relaxed) < INLINE_ADMISSION_NS
    }

    /// Runs `prepare_request` here, then queues the request. `reply` is called exactly once, from the scheduler
    /// thread, unless this returns an error (then it is not called).
    pub fn submit(&self, input: Vec<u8>, reply: Reply) -> Result<Ticket> {
        self.forecast(&[&input])?;
        let prepared = self.admit(input)?;
        let mut t = self.enqueue(vec![(prepared, reply)])?;
        Ok(t.remove(0))
    }

    /// Admits every input (`prepare_request`, in order), then queues them all at once, so that the scheduler
    /// sees the request's records together and can place them in one cohort (queued one by one, the first
    /// would start a cohort of its own while the others are still being admitted). All or none: when input
    /// `i` is refused, nothing is queued, no reply is called and the error is `(i, error)`; otherwise every
    /// reply is called exactly once, from the scheduler, and the tickets are in input order. The model's memory
    /// forecast (when it has one) sees the whole request first; its refusal is `(usize::MAX, error)`.
    pub fn submit_all(
        &self,
        inputs: Vec<(Vec<u8>, Reply)>,
    ) -> std::result::Result<Vec<Ticket>, (usize, Error)> {
        let records: Vec<&[u8]> = inputs.iter().map(|(b, _)| b.as_slice()).collect();
        self.forecast(&records).map_err(|e| (usize::MAX, e))?;
        let mut admitted = Vec::with_capacity(inputs.len());
        for (i, (input, reply)) in inputs.into_iter().enumerate() {
            admitted.push((self.admit(input).map_err(|e| (i, e))?, reply));
        }
        self.enqueue(admitted).map_err(|e| (0, e))
    }

    /// Queues admitted requests for the scheduler, in one command (all or none against `max_queue`).
    fn enqueue(&self, requests: Vec<(Prepared, Reply)>) -> Result<Vec<Ticket>> {
        let n = requests.len();
        let q = self.metrics.queue.fetch_add(n, Ordering::Relaxed);
        if q + n > self.model.doc.capacities.max_queue {
            self.metrics.queue.fetch_sub(n, Ordering::Relaxed);
            self.metrics.refused.fetch_add(n as u64, Ordering::Relaxed);
            return Err(Error::Overloaded(format!(
                "model `{}` has {q} requests waiting (capacities.max_queue is {}){}",
                self.model.name,
                self.model.doc.capacities.max_queue,
                if n > 1 {
                    format!("; this request adds {n}")
                } else {
                    String::new()
                }
            )));
        }
        let mut tickets = Vec::with_capacity(n);
        let mut pending = Vec::with_capacity(n);
        for (prepared, reply) in requests {
            let cancelled = Arc::new(RequestCancel::default());
            tickets.push(Ticket {
                cancelled: cancelled.clone(),
                units: prepared.units,
            });
            pending.push(Pending {
                prepared,
                reply,
                cancelled,
            });
        }
        let sent = self
            .tx
            .lock()
            .ok()
            .and_then(|g| g.as_ref().map(|tx| tx.send(Cmd::Requests(pending)).is_ok()));
        if sent != Some(true) {
            self.metrics.queue.fetch_sub(n, Ordering::Relaxed);
            return Err(Error::NotReady {
                name: self.model.name.clone(),
                status: "draining".into(),
            });
        }
        Ok(tickets)
    }

    /// The model's memory forecast over one complete request's input records ([`Model::check_forecast`]):
    /// a request that cannot fit in the model's budget alone is refused (and counted as failed) before any of
    /// its records is prepared.
    fn forecast(&self, records: &[&[u8]]) -> Result<()> {
        if let Err(e) = self.model.check_forecast(records) {
            let n = records.len() as u64;
            self.metrics.requests.fetch_add(n, Ordering::Relaxed);
            self.metrics.failed.fetch_add(n, Ordering::Relaxed);
            return Err(e);
        }
        Ok(())
    }

    /// Counts the request, checks its size and runs `prepare_request`.
    fn admit(&self, input: Vec<u8>) -> Result<Prepared> {
        self.metrics.requests.fetch_add(1, Ordering::Relaxed);
        let max = self.model.doc.capacities.max_request_bytes;
        if input.len() > max {
            self.metrics.failed.fetch_add(1, Ordering::Relaxed);
            let header = record_header_bytes(&self.model.doc.role, &input);
            return Err(Error::TooLarge(format!(
                "the input is {} bytes; model `{}` accepts inputs of at most {} bytes \
                 (capacities.max_request_bytes is {max} bytes per record, including its {header}-byte header)",
                input.len() - header,
                self.model.name,
                max.saturating_sub(header),
            )));
        }
        let t0 = Instant::now();
        let prepared = cohort::prepare_request(&self.model, &self.limits, input);
        fold(&self.metrics.admit_ns, t0.elapsed());
        let prepared = prepared.inspect_err(|_| {
            self.metrics.failed.fetch_add(1, Ordering::Relaxed);
        })?;
        Ok(prepared)
    }

    /// [`submit`](Self::submit) for a request that arrives alone, from a caller that may block for a short
    /// while (see [`admits_inline`](Self::admits_inline)). When nothing is waiting, nothing of the model is on
    /// the device or being specialized, and this model's cohorts are quick ([`IN_PLACE_COHORT_NS`]), the
    /// request's cohort (itself: nothing else is waiting to join it, and the scheduler never waits for
    /// arrivals) runs here and `reply` is called before this returns: the hand-off to the scheduler thread and
    /// back would cost two thread wake-ups, more than such a cohort runs for. A cohort whose declarations are
    /// not compiled is handed to the scheduler instead (it never compiles here), as is any request when the
    /// conditions do not hold. Order is kept: it runs in place only when it is the oldest request of the model.
    pub fn submit_one(&self, input: Vec<u8>, reply: Reply) -> Result<Ticket> {
        let quick = self.metrics.cohort_ns.load(Ordering::Relaxed) < self.in_place_ns;
        if !quick || self.busy() {
            return self.submit(input, reply);
        }
        if !self.gate.try_acquire_idle() {
            return self.submit(input, reply);
        }
        if self.busy() || self.tx.lock().map(|g| g.is_none()).unwrap_or(true) {
            self.gate.release();
            return self.submit(input, reply);
        }
        let prepared = match self.forecast(&[&input]).and_then(|()| self.admit(input)) {
            Ok(p) => p,
            Err(e) => {
                self.gate.release();
                return Err(e);
            }
        };
        let units = prepared.units;
        let t1 = Instant::now();
        let staged = cohort::stage(&self.model, &self.limits, &[&prepared]);
        let set = match &staged {
            Ok(s) => self.model.cached_stages(&s.decls),
            Err(_) => None,
        };
        let (staged, set) = match (staged, set) {
            (Ok(staged), Some(set)) => (staged, set),
            (Ok(_), None) => {
                // Needs specialization: the scheduler parks it while its code compiles.
                self.gate.release();
                let mut t = self.enqueue(vec![(prepared, reply)])?;
                return Ok(t.remove(0));
            }
            (Err(e), _) => {
                self.gate.release();
                self.in_place_done(vec![(prepared, reply)], Err(e), t1);
                return Ok(Ticket {
                    cancelled: Arc::new(RequestCancel::default()),
                    units,
                });
            }
        };
        self.metrics
            .cohorts_in_place
            .fetch_add(1, Ordering::Relaxed);
        // Running while it runs here; in_place_done counts it as a cohort (running until replied to).
        self.metrics.running.fetch_add(1, Ordering::Relaxed);
        let r = cohort::submit(&self.model, &staged, set, None)
            .and_then(|f| cohort::collect(&self.model, f));
        self.metrics.running.fetch_sub(1, Ordering::Relaxed);
        self.gate.release();
        self.in_place_done(vec![(prepared, reply)], r, t1);
        Ok(Ticket {
            cancelled: Arc::new(RequestCancel::default()),
            units,
        })
    }

    /// Whether anything of the model is waiting or being specialized.
    fn busy(&self) -> bool {
        self.metrics.queue.load(Ordering::Relaxed) != 0
            || self.metrics.specializing.load(Ordering::Relaxed) != 0
    }

    /// Counts and replies to a cohort run in place.
    fn in_place_done(&self, members: Vec<(Prepared, Reply)>, r: Result<Vec<Rows>>, t: Instant) {
        let n = members.len() as u64;
        // count_cohort takes the members off the queue count; they never were on it.
        self.metrics.queue.fetch_add(n as usize, Ordering::Relaxed);
        count_cohort(&self.metrics, n);
        let cohort: Vec<Pending> = members
            .into_iter()
            .map(|(prepared, reply)| Pending {
                prepared,
                reply,
                cancelled: Arc::new(RequestCancel::default()),
            })
            .collect();
        let ctx = Ctx {
            model: self.model.clone(),
            limits: self.limits,
            metrics: self.metrics.clone(),
            gate: self.gate.clone(),
        };
        let cc = CohortCancel::new(cohort.len(), None);
        finish(&ctx, cohort, &cc, r, t);
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
        self.gate.wait_idle();
    }
}

impl Drop for FiniteService {
    /// The scheduler holds a sender of its own channel (for specialization results), so it stops only when
    /// told to: a service dropped without a drain drains here.
    fn drop(&mut self) {
        self.drain();
    }
}

/// The bytes of a protocol record that are its framing, not the client's input (`loom_plugin_api::records`):
/// an embeddings record's kind and reserved word (8); a decision record's choice count and instruction length
/// (8) and each choice's length (4). Never more than the record.
fn record_header_bytes(role: &str, record: &[u8]) -> usize {
    let header = match role {
        "decisions" => {
            let choices = record
                .get(..4)
                .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]).max(0) as usize)
                .unwrap_or(0);
            choices.saturating_mul(4).saturating_add(8)
        }
        _ => 8,
    };
    header.min(record.len())
}

impl Service for FiniteService {
    fn model(&self) -> &Arc<Model> {
        &self.model
    }

    fn drain(&self) {
        FiniteService::drain(self)
    }

    fn series(&self) -> Vec<Series> {
        self.metrics.series()
    }

    fn as_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }
}
