//! The timeline and queue semantics of the HAL (`loom-plugin-api`), shared by the GPU plugins (`hal-vulkan`,
//! `hal-cuda`) so that every backend fails, waits and retires exactly like `hal-cpu`:
//!
//! * a timeline is a `u64` that only increases, or a failure (the first error wins; every later wait or value
//!   query reports it);
//! * a queue runs jobs on lanes, one thread each: a job goes to the lane of its signal point's timeline
//!   ([`Queue::with_lanes`]; [`Queue::new`] has one lane), so the jobs of one timeline run in submission order
//!   and jobs of different timelines are ordered only by their wait points (one waiting on its points, or a
//!   long one running, does not hold up another timeline's on another lane). A lane waits for every wait point
//!   of its next job (a failed wait point fails the job with the same error, so failures propagate along fence
//!   chains), runs the job, then advances the signal point's timeline or fails it with the job's error text;
//! * the job owns whatever it resolved when it was accepted (buffers, executables) and is dropped *before* its
//!   point is signalled, so a buffer freed while queued lives exactly until its last accepted use retires;
//! * a panic of the job runner is caught and fails the signal point;
//! * a device may run a second queue on the same timelines ([`Queue::sibling`], e.g. for file reads);
//! * [`timelines`]: the timeline table itself, which `hal-cpu` (with queue threads of its own) uses too;
//! * [`commands`]: the checks of `HalDevice::submit` and of the commands it queues (the ids of buffers and
//!   executables, byte ranges, copies, the execution contract's buffer checks, aliasing), the same on every
//!   plugin;
//! * [`status`]: the decoding of `loom-emit`'s status words into the kernel contract's error text (the GPU
//!   plugins);
//! * [`files`]: the checks and error texts of queued file reads (`HalFiles`), the same on every plugin.

use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use loom_plugin_api::{TimelineId, TimelinePoint, WaitStatus, panic_message};

pub mod commands;
pub mod files;
pub mod status;
pub mod timelines;

pub use timelines::{Timelines, wait_point};

/// Locks `m`, ignoring poisoning (a panic on another thread is already reported as an error).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Debug, Default)]
struct State {
    timelines: Timelines,
    next_id: u64,
    closed: bool,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    /// Notified whenever a timeline advances or fails, and on close.
    changed: Condvar,
}

impl Shared {
    fn retire(&self, point: TimelinePoint, result: Result<(), String>) {
        lock(&self.state).timelines.retire(point, result);
        self.changed.notify_all();
    }

    fn wait(&self, point: TimelinePoint, deadline: Option<Instant>) -> Result<WaitStatus, String> {
        let st = lock(&self.state);
        wait_point(
            &self.changed,
            st,
            |s| (&s.timelines, s.closed),
            point,
            deadline,
        )
    }
}

struct Job<J> {
    job: J,
    wait: Vec<TimelinePoint>,
    signal: TimelinePoint,
}

/// Starts one lane: a thread running the jobs sent to it in order, each after its wait points (`None`: the
/// thread could not start).
fn lane_thread<J: Send + 'static>(
    shared: &Arc<Shared>,
    name: &str,
    mut run: impl FnMut(J) -> Result<(), String> + Send + 'static,
) -> (mpsc::Sender<Job<J>>, Option<JoinHandle<()>>) {
    let (tx, rx) = mpsc::channel::<Job<J>>();
    let q = Arc::clone(shared);
    let worker = std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            while let Ok(job) = rx.recv() {
                let signal = job.signal;
                let result = catch_unwind(AssertUnwindSafe(|| {
                    for &w in &job.wait {
                        q.wait(w, None)?;
                    }
                    run(job.job)
                }))
                .unwrap_or_else(|p| Err(format!("queue panicked: {}", panic_message(&*p))));
                q.retire(signal, result);
            }
        })
        .ok();
    (tx, worker)
}

/// A device's timelines and its lanes (threads) running jobs of type `J`, each lane in submission order.
pub struct Queue<J: Send + 'static> {
    shared: Arc<Shared>,
    /// One sender per lane (empty when no lane thread could start).
    tx: Mutex<Vec<mpsc::Sender<Job<J>>>>,
    workers: Mutex<Vec<JoinHandle<()>>>,
}

impl<J: Send + 'static> fmt::Debug for Queue<J> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Queue")
            .field("shared", &self.shared)
            .finish_non_exhaustive()
    }
}

impl<J: Send + 'static> Queue<J> {
    /// Starts the queue thread `name` (one lane: every job in submission order); `run` executes one job (and
    /// drops it) on that thread.
    pub fn new(name: &str, run: impl FnMut(J) -> Result<(), String> + Send + 'static) -> Queue<J> {
        Queue::with_shared(Arc::new(Shared::default()), name, run)
    }

    /// Starts `lanes` lane threads (`name-0`, ...): a job runs on the lane of its signal timeline (the
    /// timeline's id modulo `lanes`), so jobs of different timelines may run side by side. `run` executes one
    /// job on whichever lane it is on (the device makes concurrent jobs safe: e.g. one executable's
    /// workspace used by one job at a time).
    pub fn with_lanes(
        name: &str,
        lanes: usize,
        run: impl Fn(J) -> Result<(), String> + Send + Sync + 'static,
    ) -> Queue<J> {
        let shared = Arc::new(Shared::default());
        let run = Arc::new(run);
        let mut txs = Vec::new();
        let mut workers = Vec::new();
        for lane in 0..lanes.max(1) {
            let run = Arc::clone(&run);
            let (tx, w) = lane_thread(&shared, &format!("{name}-{lane}"), move |j| run(j));
            if let Some(w) = w {
                txs.push(tx);
                workers.push(w);
            }
        }
        Queue {
            shared,
            tx: Mutex::new(txs),
            workers: Mutex::new(workers),
        }
    }

    /// A second queue of the same device (e.g. a transfer queue): its own thread running jobs of type `K` in
    /// their submission order, ordered against this queue's jobs only by timeline points, on the **same
    /// timelines** (created, signalled and waited on through either queue).
    pub fn sibling<K: Send + 'static>(
        &self,
        name: &str,
        run: impl FnMut(K) -> Result<(), String> + Send + 'static,
    ) -> Queue<K> {
        Queue::with_shared(Arc::clone(&self.shared), name, run)
    }

    fn with_shared(
        shared: Arc<Shared>,
        name: &str,
        run: impl FnMut(J) -> Result<(), String> + Send + 'static,
    ) -> Queue<J> {
        let (tx, worker) = lane_thread(&shared, name, run);
        Queue {
            shared,
            tx: Mutex::new(worker.as_ref().map(|_| tx).into_iter().collect()),
            workers: Mutex::new(worker.into_iter().collect()),
        }
    }

    /// Checks that every timeline of `points` exists (submissions are checked when accepted).
    pub fn check_points<'a>(
        &self,
        points: impl IntoIterator<Item = &'a TimelinePoint>,
    ) -> Result<(), String> {
        lock(&self.shared.state).timelines.check(points)
    }

    /// Queues `job`: it runs after every `wait` point is reached, then `signal` is advanced or failed.
    pub fn submit(
        &self,
        job: J,
        wait: Vec<TimelinePoint>,
        signal: TimelinePoint,
    ) -> Result<(), String> {
        self.check_points(wait.iter().chain([&signal]))?;
        if lock(&self.shared.state).closed {
            return Err("submit: the device is closed".into());
        }
        let tx = lock(&self.tx);
        if tx.is_empty() {
            return Err("submit: the device has no queue thread".into());
        }
        tx[(signal.timeline.0 % tx.len() as u64) as usize]
            .send(Job { job, wait, signal })
            .map_err(|_| "submit: the queue thread has stopped".to_string())
    }

    /// A submission's acceptance: checks its timeline points, then `resolve`s the job (the device's checks of
    /// the submission's ids, with the device state locked as long as it needs), then queues it.
    pub fn submit_checked(
        &self,
        wait: &[TimelinePoint],
        signal: TimelinePoint,
        resolve: impl FnOnce() -> Result<J, String>,
    ) -> Result<(), String> {
        self.check_points(wait.iter().chain([&signal]))?;
        let job = resolve()?;
        self.submit(job, wait.to_vec(), signal)
    }

    /// Creates a timeline at value 0.
    pub fn timeline_create(&self) -> TimelineId {
        let mut st = lock(&self.shared.state);
        st.next_id += 1;
        let id = st.next_id;
        st.timelines.create(id)
    }

    /// The timeline's value, or its failure.
    pub fn timeline_value(&self, timeline: TimelineId) -> Result<u64, String> {
        lock(&self.shared.state).timelines.value(timeline)
    }

    /// Signals a point from the host (the value must increase).
    pub fn timeline_signal(&self, point: TimelinePoint) -> Result<(), String> {
        lock(&self.shared.state).timelines.signal(point)?;
        self.shared.changed.notify_all();
        Ok(())
    }

    /// Fails the timeline of `point` with `message` (see `Timelines::fail`) and wakes its waiters.
    pub fn timeline_fail(&self, point: TimelinePoint, message: String) -> Result<(), String> {
        lock(&self.shared.state).timelines.fail(point, message)?;
        self.shared.changed.notify_all();
        Ok(())
    }

    /// Blocks until `point` is reached, fails, or `timeout_ns` passes.
    pub fn timeline_wait(
        &self,
        point: TimelinePoint,
        timeout_ns: u64,
    ) -> Result<WaitStatus, String> {
        let deadline = Instant::now().checked_add(Duration::from_nanos(timeout_ns));
        self.shared.wait(point, deadline)
    }
}

impl<J: Send + 'static> Drop for Queue<J> {
    fn drop(&mut self) {
        lock(&self.shared.state).closed = true;
        self.shared.changed.notify_all();
        lock(&self.tx).clear();
        for w in std::mem::take(&mut *lock(&self.workers)) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(t: TimelineId, v: u64) -> TimelinePoint {
        TimelinePoint {
            timeline: t,
            value: v,
        }
    }

    #[test]
    fn failures_propagate_and_order_holds() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let l = Arc::clone(&log);
        let q: Queue<u32> = Queue::new("test-queue", move |j| {
            lock(&l).push(j);
            if j == 2 {
                Err("job 2 failed".into())
            } else {
                Ok(())
            }
        });
        let host = q.timeline_create();
        let t = q.timeline_create();
        let u = q.timeline_create();
        q.submit(1, vec![p(host, 1)], p(t, 1)).unwrap();
        q.submit(2, vec![p(t, 1)], p(t, 2)).unwrap();
        q.submit(3, vec![p(t, 2)], p(u, 1)).unwrap();
        assert_eq!(
            q.timeline_wait(p(u, 1), 1_000_000).unwrap(),
            WaitStatus::TimedOut
        );
        q.timeline_signal(p(host, 1)).unwrap();
        assert_eq!(
            q.timeline_wait(p(u, 1), u64::MAX).unwrap_err(),
            "job 2 failed"
        );
        assert_eq!(q.timeline_value(t).unwrap_err(), "job 2 failed");
        assert_eq!(*lock(&log), vec![1, 2], "job 3 must not run");
        assert!(q.submit(4, vec![], p(TimelineId(99), 1)).is_err());
        assert!(q.timeline_signal(p(host, 1)).is_err());
    }

    #[test]
    fn lanes_run_another_timelines_jobs_while_one_waits_and_keep_each_timelines_order() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let l = Arc::clone(&log);
        let q: Queue<u32> = Queue::with_lanes("test-lanes", 4, move |j| {
            lock(&l).push(j);
            Ok(())
        });
        let host = q.timeline_create();
        // Two work timelines on different lanes (ids modulo 4 differ).
        let a = q.timeline_create();
        let mut b = q.timeline_create();
        while b.0 % 4 == a.0 % 4 {
            b = q.timeline_create();
        }
        // `a`'s first job waits for the host; `b`'s jobs, submitted after it, run meanwhile, in order.
        q.submit(1, vec![p(host, 1)], p(a, 1)).unwrap();
        q.submit(2, vec![], p(a, 2)).unwrap();
        q.submit(10, vec![], p(b, 1)).unwrap();
        q.submit(11, vec![p(b, 1)], p(b, 2)).unwrap();
        // (One lane would hold them behind job 1: this wait would time out.)
        assert_eq!(
            q.timeline_wait(p(b, 2), 5_000_000_000).unwrap(),
            WaitStatus::Reached
        );
        assert_eq!(
            q.timeline_wait(p(a, 1), 1_000_000).unwrap(),
            WaitStatus::TimedOut
        );
        assert_eq!(*lock(&log), vec![10, 11]);
        // A job of `b` waiting on `a` is ordered after it across lanes.
        q.submit(12, vec![p(a, 2)], p(b, 3)).unwrap();
        q.timeline_signal(p(host, 1)).unwrap();
        assert_eq!(
            q.timeline_wait(p(b, 3), u64::MAX).unwrap(),
            WaitStatus::Reached
        );
        assert_eq!(*lock(&log), vec![10, 11, 1, 2, 12]);
    }

    #[test]
    fn a_sibling_queue_shares_the_timelines_and_is_ordered_only_by_points() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let l = Arc::clone(&log);
        let compute: Queue<u32> = Queue::new("test-compute", move |j| {
            lock(&l).push(j);
            Ok(())
        });
        let l = Arc::clone(&log);
        let transfer: Queue<&'static str> = compute.sibling("test-transfer", move |j| {
            lock(&l).push(if j == "read" { 100 } else { 101 });
            if j == "bad" {
                Err("read failed".into())
            } else {
                Ok(())
            }
        });
        let t = compute.timeline_create();
        // Compute work waiting for a transfer submitted after it does not block the transfer.
        compute.submit(1, vec![p(t, 1)], p(t, 2)).unwrap();
        transfer.submit("read", vec![], p(t, 1)).unwrap();
        assert_eq!(
            compute.timeline_wait(p(t, 2), u64::MAX).unwrap(),
            WaitStatus::Reached
        );
        assert_eq!(transfer.timeline_value(t).unwrap(), 2);
        assert_eq!(*lock(&log), vec![100, 1]);
        // A failed transfer fails the compute work that waits for it.
        let u = transfer.timeline_create();
        transfer.submit("bad", vec![], p(u, 1)).unwrap();
        compute.submit(2, vec![p(u, 1)], p(u, 2)).unwrap();
        assert_eq!(
            compute.timeline_wait(p(u, 2), u64::MAX).unwrap_err(),
            "read failed"
        );
        assert_eq!(lock(&log).len(), 3, "job 2 must not run");
    }
}
