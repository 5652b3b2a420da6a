//! The scheduler of one finite model: a thread that owns the waiting queue, forms cohorts and submits them,
//! and a collector thread that waits for submitted cohorts and replies. Everyone else talks to the scheduler
//! with [`Cmd`]s over a channel. How a cohort is formed is [`form_cohort`], a pure function.
//!
//! **Pipelining.** Up to [`PIPELINE_DEPTH`] cohorts of a model are submitted and not yet collected: while one
//! runs on the device, the next one's `prepare_batch`, upload and `run` (which only enqueues) proceed, and the
//! scheduler never waits for the device except for a free slot ([`Gate`]). A submission refused for the
//! model's memory budget while another cohort holds device memory waits for that one and is tried again.
//!
//! **Specialization.** A cohort whose declarations are not compiled is parked and specialized on the shared
//! workers ([`Model::specialize`]); cohorts whose stages are cached keep being submitted meanwhile. Cohorts
//! with the same missing declarations wait for one compilation. When it finishes ([`Cmd::Specialized`]), the
//! parked cohorts are submitted (or, on a compile error, fail as any cohort does).

use super::Limits;
use super::cohort::{self, InFlight, Staged};
use super::metrics::{Metrics, fold};
use super::service::{CohortCancel, DeviceRows, Prepared, Reply, RequestCancel, Rows};
use serve_runtime::device::Budget;
use serve_runtime::model::{Model, StageSet};
use serve_runtime::natives::Decls;
use serve_runtime::{Error, Result};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, mpsc};
use std::time::Instant;

/// The most cohorts of one model submitted and not yet collected.
pub const PIPELINE_DEPTH: usize = 2;

/// An admitted request waiting for a cohort.
pub(crate) struct Pending {
    pub(crate) prepared: Prepared,
    /// Called once with the result: the rows (empty for a request whose rows stay on the device, which
    /// [`ToDevice::handoff`] received) or the error.
    pub(crate) reply: Reply,
    pub(crate) cancelled: Arc<RequestCancel>,
    /// A producer's request run for a consumer model: its rows stay on the device.
    pub(crate) to_device: Option<ToDevice>,
    /// A consumer's request: the upstream result it reads.
    pub(crate) upstream: Option<DeviceRows>,
}

/// Where a producer's request hands its rows on the device.
pub(crate) struct ToDevice {
    /// The consumer's budget, which the cohort's output buffer is charged to.
    pub(crate) budget: Arc<Budget>,
    /// Called once the cohort's work is submitted, with the request's rows and their readiness.
    pub(crate) handoff: Option<Box<dyn FnOnce(DeviceRows) + Send>>,
}

impl Pending {
    /// What members of one cohort share besides their compatibility tag: where their results go (the host,
    /// or one consumer's budget) and which upstream result they read.
    fn route_key(&self) -> (usize, u64) {
        (
            self.to_device
                .as_ref()
                .map_or(0, |d| Arc::as_ptr(&d.budget) as usize),
            self.upstream.as_ref().map_or(u64::MAX, |u| u.buffer.id().0),
        )
    }
}

/// A consumer's request coming back from its upstream model: the rows it left on the device (or why it
/// failed), with what the consumer needs to admit it.
pub(crate) struct Arrival {
    pub(crate) result: Result<DeviceRows>,
    /// The client's record (appended to the upstream record `prepare_request` receives).
    pub(crate) record: Vec<u8>,
    pub(crate) reply: Reply,
    pub(crate) cancelled: Arc<RequestCancel>,
}

/// What the scheduler is told.
pub(crate) enum Cmd {
    /// Queue admitted requests (the records of one HTTP request arrive together).
    Requests(Vec<Pending>),
    /// Finish everything accepted, then stop (and say so on the channel).
    Drain(mpsc::Sender<()>),
    /// The specialization of a parked cohort's declarations finished.
    Specialized(Decls, Result<StageSet>),
    /// A consumer's request is back from its upstream model.
    Upstream(Box<Arrival>),
}

/// The cohorts of a model that are submitted and not yet collected (the scheduler's and the in-place path's).
#[derive(Debug, Default)]
pub(crate) struct Gate {
    busy: Mutex<usize>,
    cv: Condvar,
}

impl Gate {
    fn lock(&self) -> std::sync::MutexGuard<'_, usize> {
        self.busy.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes a slot, waiting while `max` are taken; returns how many are taken with it.
    fn acquire(&self, max: usize) -> usize {
        let mut b = self.lock();
        while *b >= max {
            b = self.cv.wait(b).unwrap_or_else(|e| e.into_inner());
        }
        *b += 1;
        *b
    }

    /// Takes a slot only when none is taken (the in-place path: nothing of the model is running).
    pub(crate) fn try_acquire_idle(&self) -> bool {
        let mut b = self.lock();
        if *b == 0 {
            *b = 1;
            true
        } else {
            false
        }
    }

    pub(crate) fn release(&self) {
        let mut b = self.lock();
        *b = b.saturating_sub(1);
        self.cv.notify_all();
    }

    /// Waits until at most `n` slots are taken.
    fn wait_until(&self, n: usize) {
        let mut b = self.lock();
        while *b > n {
            b = self.cv.wait(b).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Waits until nothing is in flight.
    pub(crate) fn wait_idle(&self) {
        self.wait_until(0)
    }
}

/// Forms the next cohort from `waiting` (oldest first): the oldest request, then every waiting request of the
/// same compatibility tag, oldest first, whose units still fit `limit` (a request that does not fit is
/// skipped, and a later smaller one may still join). The members leave `waiting`; the others keep their
/// order. `key` gives a request's (compatibility key, units). At most `max_members` join (at least the
/// oldest). Empty when nothing waits.
pub fn form_cohort<T, K: PartialEq>(
    waiting: &mut VecDeque<T>,
    limit: i64,
    max_members: usize,
    key: impl Fn(&T) -> (K, i64),
) -> Vec<T> {
    let Some(first) = waiting.pop_front() else {
        return Vec::new();
    };
    let (tag, mut units) = key(&first);
    let mut cohort = vec![first];
    let mut i = 0;
    while i < waiting.len() && cohort.len() < max_members {
        let (t, u) = key(&waiting[i]);
        if t == tag && units + u <= limit {
            units += u;
            if let Some(p) = waiting.remove(i) {
                cohort.push(p);
            }
        } else {
            i += 1;
        }
    }
    cohort
}

/// A cohort waiting for its declarations to be specialized.
struct Parked {
    cohort: Vec<Pending>,
    staged: Staged,
    started: Instant,
}

/// A submitted cohort on its way to the collector.
struct Job {
    cohort: Vec<Pending>,
    inflight: InFlight,
    cc: Arc<CohortCancel>,
    started: Instant,
}

/// What the scheduler and the collector share.
pub(crate) struct Ctx {
    pub(crate) model: Arc<Model>,
    pub(crate) limits: Limits,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) gate: Arc<Gate>,
}

/// The scheduler thread's loop: take every command that has arrived (never wait for more while requests
/// wait), drop cancelled waiting requests, form the next cohort and start it. Ends after a drain once
/// nothing waits, nothing is parked and the collector has replied to every submitted cohort. `me` is a sender
/// of the scheduler's own channel, for specialization results.
pub(crate) fn scheduler(ctx: Ctx, rx: mpsc::Receiver<Cmd>, me: mpsc::Sender<Cmd>) {
    let ctx = Arc::new(ctx);
    let (jobs, job_rx) = mpsc::channel::<Job>();
    let c = ctx.clone();
    let collector = std::thread::Builder::new()
        .name(format!("collect-{}", ctx.model.name))
        .spawn(move || {
            for job in job_rx {
                let r = cohort::collect(&c.model, &c.metrics, job.inflight);
                // The slot is free once the device work is collected; retries alone run outside it.
                c.gate.release();
                finish(&c, job.cohort, &job.cc, r, job.started);
            }
        })
        .expect("spawning a collector thread; this is a bug");
    let mut st = State {
        waiting: VecDeque::new(),
        parked: Vec::new(),
        drain: None,
        cap: usize::MAX,
    };
    loop {
        // Take whatever has already arrived; never wait for more while requests wait.
        while let Ok(c) = rx.try_recv() {
            handle(&ctx, &jobs, c, &mut st);
        }
        if st.waiting.is_empty() {
            // A consumer's requests still at its upstream model come back (as arrivals) before it stops: once
            // none is left there (each is counted off after it is sent), what was sent is in the channel.
            if st.parked.is_empty()
                && st.drain.is_some()
                && ctx.metrics.upstream.load(Ordering::Acquire) == 0
            {
                while let Ok(c) = rx.try_recv() {
                    handle(&ctx, &jobs, c, &mut st);
                }
                if st.waiting.is_empty() && st.parked.is_empty() {
                    if let Some(d) = st.drain.take() {
                        drop(jobs);
                        let _ = collector.join();
                        let _ = d.send(());
                        return;
                    }
                }
                continue;
            }
            match rx.recv() {
                Ok(c) => handle(&ctx, &jobs, c, &mut st),
                Err(_) => return,
            }
            continue;
        }
        st.waiting.retain(|p| {
            let keep = !p.cancelled.is_cancelled();
            if !keep {
                ctx.metrics.queue.fetch_sub(1, Ordering::Relaxed);
                ctx.metrics
                    .cancelled_waiting
                    .fetch_add(1, Ordering::Relaxed);
            }
            keep
        });
        let cohort = form_cohort(&mut st.waiting, ctx.limits.batch_units, st.cap, |p| {
            ((p.prepared.tag, p.route_key()), p.prepared.units)
        });
        st.cap = usize::MAX;
        if cohort.is_empty() {
            continue;
        }
        take_cohort(&ctx.metrics, cohort.len() as u64);
        let started = Instant::now();
        let members: Vec<&Prepared> = cohort.iter().map(|p| &p.prepared).collect();
        let staged = cohort::stage(&ctx.model, &ctx.limits, &members);
        drop(members);
        let staged = match staged {
            Ok(s) => s,
            Err(e) => {
                fail(&ctx, cohort, e, started);
                continue;
            }
        };
        if let Some(set) = ctx.model.cached_stages(&staged.decls) {
            dispatch(&ctx, &jobs, cohort, staged, set, started, &mut st);
            continue;
        }
        // A miss: park the cohort; the first one with these declarations starts their specialization.
        ctx.metrics.specializing.fetch_add(1, Ordering::Relaxed);
        let decls = staged.decls.clone();
        let p = Parked {
            cohort,
            staged,
            started,
        };
        match st.parked.iter_mut().find(|(d, _)| *d == decls) {
            Some((_, v)) => v.push(p),
            None => {
                st.parked.push((decls.clone(), vec![p]));
                let me = me.clone();
                ctx.model.specialize(decls.clone(), move |r| {
                    let _ = me.send(Cmd::Specialized(decls, r));
                });
            }
        }
    }
}

/// The scheduler thread's own state.
struct State {
    waiting: VecDeque<Pending>,
    /// Cohorts waiting for their declarations' specialization, by declaration set.
    parked: Vec<(Decls, Vec<Parked>)>,
    drain: Option<mpsc::Sender<()>>,
    /// The most members the next cohort may have: lowered when a cohort's prepared working set did not fit
    /// the budget (it went back to the queue and half of it is tried), then unbounded again.
    cap: usize,
}

/// Applies one command.
fn handle(ctx: &Ctx, jobs: &mpsc::Sender<Job>, c: Cmd, st: &mut State) {
    match c {
        Cmd::Requests(ps) => st.waiting.extend(ps),
        Cmd::Drain(d) => st.drain = Some(d),
        Cmd::Upstream(a) => arrive(ctx, *a, &mut st.waiting),
        Cmd::Specialized(decls, r) => {
            let Some(i) = st.parked.iter().position(|(d, _)| *d == decls) else {
                return;
            };
            let (_, cohorts) = st.parked.remove(i);
            for p in cohorts {
                ctx.metrics.specializing.fetch_sub(1, Ordering::Relaxed);
                match &r {
                    Ok(set) => dispatch(ctx, jobs, p.cohort, p.staged, set.clone(), p.started, st),
                    Err(e) => fail(ctx, p.cohort, e.clone(), p.started),
                }
            }
        }
    }
}

/// Counts a formed cohort that runs (or fails): [`take_cohort`] and [`count_run`].
pub(crate) fn count_cohort(metrics: &Metrics, n: u64) {
    take_cohort(metrics, n);
    count_run(metrics, n);
}

/// Moves a formed cohort's members from the queue gauge to the running one.
fn take_cohort(metrics: &Metrics, n: u64) {
    metrics.queue.fetch_sub(n as usize, Ordering::Relaxed);
    metrics.running.fetch_add(n as usize, Ordering::Relaxed);
}

/// Counts a cohort that runs or fails (not one that goes back to the queue).
fn count_run(metrics: &Metrics, n: u64) {
    metrics.cohorts.fetch_add(1, Ordering::Relaxed);
    metrics.cohort_members.fetch_add(n, Ordering::Relaxed);
    metrics.cohort_max.fetch_max(n, Ordering::Relaxed);
    if n > 1 {
        metrics.cohorts_shared.fetch_add(1, Ordering::Relaxed);
    }
}

/// The cohort's cancellation: when every member's client is gone, its dispatches are stopped.
pub(crate) fn cohort_cancel(model: &Model, cohort: &[Pending]) -> Arc<CohortCancel> {
    let flag = model.device.cancel_flag().unwrap_or_else(|e| {
        log::warn!("model {}: no cancellation flag: {e}", model.name);
        None
    });
    let cc = Arc::new(CohortCancel::new(cohort.len(), flag));
    for p in cohort {
        p.cancelled.join(&cc);
    }
    cc
}

/// Admission by the prepared working set, then submission in a free pipeline slot; the collector takes it from
/// there. The cohort's peak ([`Staged::peak`]) must fit the room its model's budget has beside the resident
/// parameters: a cohort of several that does not goes back to the queue to be formed again with half as many
/// members (`st`'s waiting queue and cap; `loom_cohorts_split_total`), a lone request fails with 413 naming its peak. A peak that
/// fits that room but not what the budget has free now first releases the model's idle workspace, then waits
/// for the model's other cohorts in flight to be collected.
fn dispatch(
    ctx: &Ctx,
    jobs: &mpsc::Sender<Job>,
    mut cohort: Vec<Pending>,
    staged: Staged,
    set: StageSet,
    started: Instant,
    st: &mut State,
) {
    let model = &ctx.model;
    let peak = staged.peak(&set, cohort[0].to_device.is_none());
    let room = room(model);
    if peak.total() > room {
        let n = cohort.len();
        if n > 1 {
            log::debug!(
                "model {}: a cohort of {n} needs {} device bytes at its peak, {room} fit: forming it again with {}",
                model.name,
                peak.total(),
                n / 2
            );
            ctx.metrics.cohorts_split.fetch_add(1, Ordering::Relaxed);
            ctx.metrics.queue.fetch_add(n, Ordering::Relaxed);
            ctx.metrics.running.fetch_sub(n, Ordering::Relaxed);
            for p in cohort.into_iter().rev() {
                st.waiting.push_front(p);
            }
            st.cap = n / 2;
            return;
        }
        fail(ctx, cohort, too_large(model, &peak), started);
        return;
    }
    count_run(&ctx.metrics, cohort.len() as u64);
    let busy = ctx.gate.acquire(PIPELINE_DEPTH);
    if model.device_bytes().saturating_add(peak.total()) > model.budget.limit {
        model.release_idle_workspace();
        if model.device_bytes().saturating_add(peak.total()) > model.budget.limit {
            ctx.metrics
                .waited_for_memory
                .fetch_add(1, Ordering::Relaxed);
            ctx.gate.wait_until(1);
        }
    }
    ctx.metrics
        .in_flight_max
        .fetch_max(busy as u64, Ordering::Relaxed);
    let cc = cohort_cancel(&ctx.model, &cohort);
    if cc.all_gone() {
        ctx.gate.release();
        let e = Error::BadRequest("the request was cancelled".into());
        finish(ctx, cohort, &cc, Err(e), started);
        return;
    }
    // Members share their route (the cohort key): the first one's is the cohort's.
    let route = cohort::Route {
        to_device: cohort[0].to_device.as_ref().map(|d| &d.budget),
        upstream: cohort[0].upstream.as_ref(),
    };
    let mut r = cohort::submit(&ctx.model, &staged, set.clone(), cc.flag.clone(), route);
    if matches!(r, Err(Error::Overloaded(_))) {
        // The memory budget is held by the cohort before this one: wait for it and try once more.
        ctx.gate.wait_until(1);
        r = cohort::submit(&ctx.model, &staged, set, cc.flag.clone(), route);
    }
    match r {
        Ok(inflight) => {
            // Rows that stay on the device go to their consumers now: they wait on this work's readiness on
            // the device, not on its collection.
            if let Some(rows) = inflight.device_rows() {
                ctx.metrics
                    .device_results
                    .fetch_add(rows.len() as u64, Ordering::Relaxed);
                for (p, rows) in cohort.iter_mut().zip(rows) {
                    if let Some(h) = p.to_device.as_mut().and_then(|d| d.handoff.take()) {
                        h(rows);
                    }
                }
            }
            let job = Job {
                cohort,
                inflight,
                cc,
                started,
            };
            if let Err(mpsc::SendError(job)) = jobs.send(job) {
                ctx.gate.release();
                let e = Error::Internal("the collector is gone".into());
                finish(ctx, job.cohort, &job.cc, Err(e), started);
            }
        }
        Err(e) => {
            ctx.gate.release();
            finish(ctx, cohort, &cc, Err(e), started);
        }
    }
}

/// What a cohort's prepared working set may use of its model's budget: all of it but the parameters placed by
/// cold preparation.
pub(crate) fn room(model: &Model) -> u64 {
    model.budget.limit.saturating_sub(model.resident_bytes())
}

/// The error of a lone request whose prepared working set can never fit its model's budget.
pub(crate) fn too_large(model: &Model, peak: &cohort::Peak) -> Error {
    Error::TooLarge(format!(
        "model `{}`: this input needs {} device bytes at its peak (upload {}, output {}, command workspace {}); \
         its memory budget leaves {} bytes beside its parameters (memory.device_bytes is {})",
        model.name,
        peak.total(),
        peak.upload,
        peak.output,
        peak.workspace,
        room(model),
        model.budget.limit
    ))
}

/// Fails a cohort that never reached the device (its `prepare_batch` or specialization failed, or its
/// prepared working set can never fit).
fn fail(ctx: &Ctx, cohort: Vec<Pending>, e: Error, started: Instant) {
    count_run(&ctx.metrics, cohort.len() as u64);
    let cc = Arc::new(CohortCancel::new(cohort.len(), None));
    finish(ctx, cohort, &cc, Err(e), started);
}

/// Replies to a cohort's members with its result. When a cohort of several failed (and its clients are not
/// all gone), each member is retried alone, so that one bad request fails only itself (each invocation has
/// a timeline of its own, so another cohort's failure never reaches this one's waits).
pub(crate) fn finish(
    ctx: &Ctx,
    cohort: Vec<Pending>,
    cc: &CohortCancel,
    result: Result<Vec<Rows>>,
    started: Instant,
) {
    let (model, metrics) = (&ctx.model, &ctx.metrics);
    let n = cohort.len() as u64;
    let results = match result {
        Ok(r) => r.into_iter().map(Ok).collect::<Vec<_>>(),
        Err(e) if cc.all_gone() => {
            metrics.cancelled_running.fetch_add(n, Ordering::Relaxed);
            log::debug!(
                "model {}: cohort of {n} stopped: every client is gone ({e})",
                model.name
            );
            cohort.iter().map(|_| Err(e.clone())).collect()
        }
        // Rows left on the device were handed on with this work's readiness, which carries the failure to the
        // consumer: they cannot be produced again elsewhere.
        Err(e) if cohort.len() > 1 && cohort[0].to_device.is_none() => {
            log::debug!(
                "model {}: cohort of {n} failed ({e}); retrying each alone",
                model.name
            );
            metrics.retried_alone.fetch_add(n, Ordering::Relaxed);
            cohort
                .iter()
                .map(|p| {
                    cohort::run_cohort(
                        model,
                        &ctx.limits,
                        metrics,
                        &[&p.prepared],
                        cc.flag.clone(),
                        p.upstream.as_ref(),
                    )
                    .map(|mut r| r.remove(0))
                })
                .collect()
        }
        Err(e) if cohort.len() > 1 => cohort.iter().map(|_| Err(e.clone())).collect(),
        Err(e) => vec![Err(e)],
    };
    let took = started.elapsed();
    fold(&metrics.cohort_ns, took);
    metrics
        .device_ns
        .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
    for (p, r) in cohort.into_iter().zip(results) {
        if r.is_err() {
            metrics.failed.fetch_add(1, Ordering::Relaxed);
        }
        // The gauges first: a client that reads the metrics after its answer must not see itself running.
        metrics.running.fetch_sub(1, Ordering::Relaxed);
        (p.reply)(r);
    }
}

/// Admits a consumer's request that came back from its upstream model: `prepare_request` over the upstream
/// record (the rows' buffer size, their (offset, width) pairs, then the client's record) queues it, to share
/// a cohort only with requests that read the same upstream buffer; a failure replies at once.
fn arrive(ctx: &Ctx, a: Arrival, waiting: &mut VecDeque<Pending>) {
    // It is on the queue count already (since it was sent).
    let fail = |reply: Reply, e: Error| {
        ctx.metrics.queue.fetch_sub(1, Ordering::Relaxed);
        ctx.metrics.failed.fetch_add(1, Ordering::Relaxed);
        reply(Err(e));
    };
    let rows = match a.result {
        Ok(rows) => rows,
        Err(e) => return fail(a.reply, e),
    };
    let mut record = Vec::with_capacity(16 + rows.rows.len() * 16 + a.record.len());
    record.extend_from_slice(&(rows.buffer.bytes() as i64).to_le_bytes());
    record.extend_from_slice(&(rows.rows.len() as i64).to_le_bytes());
    for &(off, width) in &rows.rows {
        record.extend_from_slice(&(off as i64).to_le_bytes());
        record.extend_from_slice(&(width as i64).to_le_bytes());
    }
    record.extend_from_slice(&a.record);
    let t0 = Instant::now();
    let prepared = cohort::prepare_request(&ctx.model, &ctx.limits, record);
    fold(&ctx.metrics.admit_ns, t0.elapsed());
    match prepared {
        Ok(prepared) => {
            waiting.push_back(Pending {
                prepared,
                reply: a.reply,
                cancelled: a.cancelled,
                to_device: None,
                upstream: Some(rows),
            });
        }
        Err(e) => fail(a.reply, e),
    }
}

#[cfg(test)]
mod tests {
    use super::form_cohort;
    use std::collections::VecDeque;

    /// (id, tag, units)
    fn queue(items: &[(u32, i64, i64)]) -> VecDeque<(u32, i64, i64)> {
        items.iter().copied().collect()
    }

    fn ids(v: &[(u32, i64, i64)]) -> Vec<u32> {
        v.iter().map(|x| x.0).collect()
    }

    fn form(q: &mut VecDeque<(u32, i64, i64)>, limit: i64) -> Vec<u32> {
        ids(&form_cohort(q, limit, usize::MAX, |x| (x.1, x.2)))
    }

    #[test]
    fn nothing_waiting_forms_nothing() {
        let mut q = queue(&[]);
        assert!(form(&mut q, 10).is_empty());
    }

    #[test]
    fn the_oldest_leads_and_compatible_requests_join_oldest_first() {
        let mut q = queue(&[(1, 0, 2), (2, 1, 2), (3, 0, 2), (4, 0, 2)]);
        assert_eq!(form(&mut q, 100), vec![1, 3, 4]);
        assert_eq!(ids(&q.iter().copied().collect::<Vec<_>>()), vec![2]);
        assert_eq!(form(&mut q, 100), vec![2]);
        assert!(q.is_empty());
    }

    #[test]
    fn units_bound_a_cohort_and_a_smaller_later_request_still_fits() {
        let mut q = queue(&[(1, 0, 5), (2, 0, 4), (3, 0, 2), (4, 0, 1)]);
        // 5 + 4 > 8: 2 is skipped; 5 + 2 + 1 = 8 fits.
        assert_eq!(form(&mut q, 8), vec![1, 3, 4]);
        assert_eq!(form(&mut q, 8), vec![2]);
    }

    #[test]
    fn a_request_over_the_limit_alone_still_forms_its_own_cohort() {
        // Admission refuses such requests; the scheduler never starves the head of the queue.
        let mut q = queue(&[(1, 0, 20), (2, 0, 1)]);
        assert_eq!(form(&mut q, 8), vec![1]);
        assert_eq!(form(&mut q, 8), vec![2]);
    }

    #[test]
    fn a_member_cap_bounds_a_cohort_and_keeps_the_rest_in_order() {
        let mut q = queue(&[(1, 0, 1), (2, 0, 1), (3, 1, 1), (4, 0, 1), (5, 0, 1)]);
        assert_eq!(
            ids(&form_cohort(&mut q, 100, 2, |x| (x.1, x.2))),
            vec![1, 2]
        );
        assert_eq!(form(&mut q, 100), vec![3]);
        assert_eq!(form(&mut q, 100), vec![4, 5]);
    }

    #[test]
    fn the_order_of_those_left_is_kept() {
        let mut q = queue(&[(1, 0, 1), (2, 1, 1), (3, 2, 1), (4, 1, 1), (5, 0, 1)]);
        assert_eq!(form(&mut q, 100), vec![1, 5]);
        assert_eq!(form(&mut q, 100), vec![2, 4]);
        assert_eq!(form(&mut q, 100), vec![3]);
    }
}
