//! [`FiniteService`]: admission, the in-place path for a lone quick request, and the handle to the model's
//! scheduler thread (see the module docs of [`super`]).

use super::metrics::{Metrics, fold};
use super::scheduler::{
    Arrival, Cmd, Ctx, Gate, Pending, ToDevice, count_cohort, finish, scheduler,
};
use super::{Limits, cohort};
use serve_runtime::contract::{Series, Service};
use serve_runtime::device::{Budget, DeviceBuffer, TimelinePoint};
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

/// One request's result rows left on the device by a producer model for a consumer model: the producer
/// cohort's output buffer (charged to the consumer's budget, so it lives on whatever becomes of the
/// producer), the readiness of the work that writes it, and the request's rows in it.
#[derive(Debug, Clone)]
pub struct DeviceRows {
    pub buffer: DeviceBuffer,
    /// Reached when the producer's work is done; failed when it failed (with its error).
    pub ready: Vec<TimelinePoint>,
    /// The request's rows: (byte offset, byte width) in `buffer`.
    pub rows: Vec<(u64, u64)>,
}

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

/// A consumer's request while its upstream model runs it: exactly one [`Arrival`] reaches the consumer's
/// scheduler, with the rows ([`Handoff::arrive`]) or the error; if the upstream drops the request unanswered
/// (say, it was cancelled while waiting), the last handle sends a cancellation.
struct Handoff {
    inner: Mutex<Option<HandoffInner>>,
}

struct HandoffInner {
    tx: mpsc::Sender<Cmd>,
    metrics: Arc<Metrics>,
    record: Vec<u8>,
    reply: Reply,
    cancelled: Arc<RequestCancel>,
}

impl Handoff {
    fn arrive(&self, result: Result<DeviceRows>) {
        let Some(h) = self.inner.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return;
        };
        let a = Box::new(Arrival {
            result,
            record: h.record,
            reply: h.reply,
            cancelled: h.cancelled,
        });
        // Waiting at the consumer from now on (its scheduler takes it off the queue count when it forms a
        // cohort or fails it). Counted before it is sent, and taken off the upstream count after: the
        // scheduler stops only when nothing is at the upstream, once it has taken what its channel holds.
        h.metrics.queue.fetch_add(1, Ordering::AcqRel);
        match h.tx.send(Cmd::Upstream(a)) {
            Ok(()) => {
                // The last one back wakes the scheduler: a drain that found this one still counted waits in
                // its channel for a command, and the arrival it waited for may already have been taken.
                if h.metrics.upstream.fetch_sub(1, Ordering::AcqRel) == 1 {
                    let _ = h.tx.send(Cmd::Requests(Vec::new()));
                }
            }
            Err(mpsc::SendError(c)) => {
                // The consumer's scheduler is gone: answer here.
                h.metrics.queue.fetch_sub(1, Ordering::AcqRel);
                h.metrics.upstream.fetch_sub(1, Ordering::AcqRel);
                h.metrics.failed.fetch_add(1, Ordering::Relaxed);
                if let Cmd::Upstream(a) = c {
                    (a.reply)(Err(Error::Cancelled));
                }
            }
        }
    }

    /// Forgets the request without answering it (its upstream refused it; the caller reports the error).
    fn disarm(&self) -> bool {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .is_some()
    }
}

impl Drop for Handoff {
    fn drop(&mut self) {
        self.arrive(Err(Error::Cancelled));
    }
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
        self.model.doc.upstream.is_none()
            && self.model.doc.fuel.entry("prepare_request") <= INLINE_ADMISSION_FUEL
            && self.metrics.admit_ns.load(Ordering::Relaxed) < INLINE_ADMISSION_NS
    }

    /// Runs `prepare_request` here, then queues the request. `reply` is called exactly once, from the scheduler
    /// thread, unless this returns an error (then it is not called).
    pub fn submit(&self, input: Vec<u8>, reply: Reply) -> Result<Ticket> {
        if self.model.doc.upstream.is_some() {
            return self
                .submit_via_upstream(vec![(input, reply)])
                .map(|mut t| t.remove(0))
                .map_err(|(_, e)| e);
        }
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
        if self.model.doc.upstream.is_some() {
            return self.submit_via_upstream(inputs);
        }
        let records: Vec<&[u8]> = inputs.iter().map(|(b, _)| b.as_slice()).collect();
        self.forecast(&records).map_err(|e| (usize::MAX, e))?;
        let mut admitted = Vec::with_capacity(inputs.len());
        for (i, (input, reply)) in inputs.into_iter().enumerate() {
            admitted.push((self.admit(input).map_err(|e| (i, e))?, reply));
        }
        self.enqueue(admitted).map_err(|e| (0, e))
    }

    /// Runs a consumer's request records through the model it names as `upstream` (all or none, like
    /// [`submit_all`](Self::submit_all)): the upstream admits and runs them, leaving each one's rows on the
    /// device, charged to this model's budget; each comes back as an [`Arrival`] that this model's scheduler
    /// admits (`prepare_request` over the upstream record) and runs in a cohort of requests reading the same
    /// upstream buffer, its work waiting on the upstream's readiness on the device. The upstream must be a
    /// finite model of the same role on the same device. Requests at the upstream count against this model's
    /// `max_queue` too (their rows hold its budget).
    fn submit_via_upstream(
        &self,
        inputs: Vec<(Vec<u8>, Reply)>,
    ) -> std::result::Result<Vec<Ticket>, (usize, Error)> {
        let whole = |e| (usize::MAX, e);
        let name = &self.model.doc.upstream.as_ref().expect("a consumer").model;
        let not_ready = |why: String| Error::NotReady {
            name: self.model.name.clone(),
            status: format!("waiting for its upstream model `{name}`, which {why}"),
        };
        let up = match self.model.peer(name) {
            Ok(s) => s,
            Err(Error::UnknownModel(_)) => {
                return Err(whole(not_ready("is not registered".into())));
            }
            Err(Error::NotReady { status, .. }) => {
                return Err(whole(not_ready(format!("is {status}"))));
            }
            Err(e) => return Err(whole(e)),
        };
        let up_model = up.model().clone();
        let up = up.as_any().downcast::<FiniteService>().map_err(|_| {
            whole(not_ready(format!(
                "serves the {} contract, not finite",
                up_model.doc.contract
            )))
        })?;
        if up.model.doc.role != self.model.doc.role {
            return Err(whole(not_ready(format!(
                "serves {}, not {}",
                up.model.doc.role, self.model.doc.role
            ))));
        }
        if !Arc::ptr_eq(&up.model.device, &self.model.device) {
            return Err(whole(not_ready(format!(
                "is on device {}, not {} (a consumer reads its upstream's results on the device)",
                up.model.device.name, self.model.device.name
            ))));
        }
        let n = inputs.len();
        self.metrics.requests.fetch_add(n as u64, Ordering::Relaxed);
        let q = self.metrics.queue.load(Ordering::Relaxed)
            + self.metrics.upstream.load(Ordering::Relaxed);
        if q + n > self.model.doc.capacities.max_queue {
            self.metrics.refused.fetch_add(n as u64, Ordering::Relaxed);
            self.metrics.failed.fetch_add(n as u64, Ordering::Relaxed);
            return Err(whole(Error::Overloaded(format!(
                "model `{}` has {q} requests waiting or at its upstream (capacities.max_queue is {})",
                self.model.name, self.model.doc.capacities.max_queue
            ))));
        }
        let Some(tx) = self.tx.lock().ok().and_then(|g| g.clone()) else {
            return Err(whole(Error::NotReady {
                name: self.model.name.clone(),
                status: "draining".into(),
            }));
        };
        let mut handoffs = Vec::with_capacity(n);
        let mut items = Vec::with_capacity(n);
        for (record, reply) in inputs {
            let cancelled = Arc::new(RequestCancel::default());
            let h = Arc::new(Handoff {
                inner: Mutex::new(Some(HandoffInner {
                    tx: tx.clone(),
                    metrics: self.metrics.clone(),
                    record: record.clone(),
                    reply,
                    cancelled: cancelled.clone(),
                })),
            });
            handoffs.push(h.clone());
            items.push((record, cancelled, h));
        }
        // Counted before the upstream can answer (it may do so before this returns).
        self.metrics.upstream.fetch_add(n, Ordering::AcqRel);
        let r = up.submit_for_consumer(items, &self.model.budget);
        if r.is_err() {
            let mut last = false;
            for h in &handoffs {
                if h.disarm() {
                    last |= self.metrics.upstream.fetch_sub(1, Ordering::AcqRel) == 1;
                }
            }
            if last {
                // Wakes a draining scheduler waiting for this count (see `Handoff::arrive`).
                if let Some(tx) = self.tx.lock().ok().and_then(|g| g.clone()) {
                    let _ = tx.send(Cmd::Requests(Vec::new()));
                }
            }
            self.metrics.failed.fetch_add(n as u64, Ordering::Relaxed);
        }
        r
    }

    /// Admits request records for a consumer model (see [`submit_via_upstream`](Self::submit_via_upstream)):
    /// the memory forecast and `prepare_request` as for any request, then one command to the scheduler. Each
    /// request's rows are handed to its [`Handoff`] once its cohort's work is submitted; its errors go there
    /// too.
    fn submit_for_consumer(
        &self,
        items: Vec<(Vec<u8>, Arc<RequestCancel>, Arc<Handoff>)>,
        budget: &Arc<Budget>,
    ) -> std::result::Result<Vec<Ticket>, (usize, Error)> {
        let records: Vec<&[u8]> = items.iter().map(|(b, _, _)| b.as_slice()).collect();
        self.forecast(&records).map_err(|e| (usize::MAX, e))?;
        let mut admitted = Vec::with_capacity(items.len());
        for (i, (input, cancelled, h)) in items.into_iter().enumerate() {
            let prepared = self.admit(input).map_err(|e| (i, e))?;
            let h2 = h.clone();
            let reply: Reply = Box::new(move |r| {
                // Rows went on at submission; only an error before that is answered here.
                if let Err(e) = r {
                    h2.arrive(Err(e));
                }
            });
            let to_device = ToDevice {
                budget: budget.clone(),
                handoff: Some(Box::new(move |rows| h.arrive(Ok(rows)))),
            };
            admitted.push((prepared, reply, cancelled, Some(to_device)));
        }
        self.enqueue_with(admitted).map_err(|e| (0, e))
    }

    /// Queues admitted requests for the scheduler, in one command (all or none against `max_queue`).
    fn enqueue(&self, requests: Vec<(Prepared, Reply)>) -> Result<Vec<Ticket>> {
        self.enqueue_with(
            requests
                .into_iter()
                .map(|(p, r)| (p, r, Arc::new(RequestCancel::default()), None))
                .collect(),
        )
    }

    /// [`enqueue`](Self::enqueue) of requests with their cancellation handles and, for a consumer, where
    /// their rows go.
    #[allow(clippy::type_complexity)]
    fn enqueue_with(
        &self,
        requests: Vec<(Prepared, Reply, Arc<RequestCancel>, Option<ToDevice>)>,
    ) -> Result<Vec<Ticket>> {
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
        for (prepared, reply, cancelled, to_device) in requests {
            tickets.push(Ticket {
                cancelled: cancelled.clone(),
                units: prepared.units,
            });
            pending.push(Pending {
                prepared,
                reply,
                cancelled,
                to_device,
                upstream: None,
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
        if self.model.doc.upstream.is_some() {
            return self.submit(input, reply);
        }
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
        // Admission by the prepared working set, as the scheduler's (nothing else of the model is in flight).
        let peak = staged.peak(&set, true);
        if peak.total() > super::scheduler::room(&self.model) {
            self.gate.release();
            let e = super::scheduler::too_large(&self.model, &peak);
            self.in_place_done(vec![(prepared, reply)], Err(e), t1);
            return Ok(Ticket {
                cancelled: Arc::new(RequestCancel::default()),
                units,
            });
        }
        self.metrics
            .cohorts_in_place
            .fetch_add(1, Ordering::Relaxed);
        // Running while it runs here; in_place_done counts it as a cohort (running until replied to).
        self.metrics.running.fetch_add(1, Ordering::Relaxed);
        let r = cohort::submit(&self.model, &staged, set, None, Default::default())
            .and_then(|f| cohort::collect(&self.model, &self.metrics, f));
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
                to_device: None,
                upstream: None,
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
