//! `parameters.gather`: asynchronous, fence-ordered reads of checkpoint byte ranges into device buffers.
//!
//! # Protocol
//!
//! Each model has one gather worker thread and one gather timeline on its device. A call from a program
//! (`parameters.gather(source, key, wait, descriptors, offset, count, target)`) checks its arguments, takes the
//! next point of the gather timeline, queues a job and returns that point as a `!hal.fence`: the VM never waits.
//! The worker runs jobs in order:
//!
//! 1. waits for `wait` (descriptor production and destination availability);
//! 2. snapshots the `count` 24-byte descriptors (`entry offset`, `destination offset`, `length`: u64 each)
//!    from the device buffer to host memory;
//! 3. checks every record (inside the entry, inside the target, destination ranges disjoint) and reads each range
//!    from the checkpoint with a positional read straight into a staging slice, then writes it to the target;
//! 4. signals the point.
//!
//! The job holds the descriptor and target buffers and the source until it is done, so removing the model or
//! dropping the program's handles cannot release them early. A failure (a failed `wait`, a bad record, a read
//! error) still signals the point, so dependents never hang, and records the error against the point; the
//! collector of the work that joined the fence ([`GatherQueue::failure`]) turns it into the cohort's error.
//! Jobs complete in order, so point values increase monotonically.

use crate::checkpoint::{Entry, Source};
use crate::device::{Device, DeviceBuffer};
use loom_plugin_api::{TimelineId, TimelinePoint};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, mpsc};

/// Bytes of one descriptor record.
pub const DESCRIPTOR_BYTES: u64 = 24;
/// Most descriptors one gather takes.
pub const MAX_DESCRIPTORS: u64 = 1 << 20;

/// One queued gather.
pub(crate) struct Job {
    pub(crate) wait: Option<TimelinePoint>,
    pub(crate) descriptors: DeviceBuffer,
    pub(crate) offset: u64,
    pub(crate) count: u64,
    pub(crate) target: DeviceBuffer,
    pub(crate) source: Arc<Source>,
    pub(crate) entry: Entry,
    pub(crate) key: String,
    pub(crate) point: TimelinePoint,
}

/// A model's gather worker.
pub struct GatherQueue {
    device: Arc<Device>,
    timeline: TimelineId,
    next: Mutex<u64>,
    tx: Mutex<Option<mpsc::Sender<Job>>>,
    failures: Arc<Mutex<HashMap<u64, String>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for GatherQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatherQueue").finish_non_exhaustive()
    }
}

impl GatherQueue {
    pub fn start(device: Arc<Device>, name: &str) -> Result<Arc<GatherQueue>, crate::Error> {
        let timeline = device.timeline()?;
        let (tx, rx) = mpsc::channel::<Job>();
        let failures = Arc::new(Mutex::new(HashMap::new()));
        let (dev, fails) = (device.clone(), failures.clone());
        let thread = std::thread::Builder::new()
            .name(format!("gather-{name}"))
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    let point = job.point;
                    if let Err(e) = run(&dev, job) {
                        if let Ok(mut f) = fails.lock() {
                            f.insert(point.value, e);
                        }
                    }
                    if let Err(e) = dev.signal(point) {
                        log::error!("gather: signalling point {}: {e}", point.value);
                    }
                }
            })
            .map_err(|e| crate::Error::Internal(format!("spawning a gather thread: {e}")))?;
        Ok(Arc::new(GatherQueue {
            device,
            timeline,
            next: Mutex::new(0),
            tx: Mutex::new(Some(tx)),
            failures,
            thread: Mutex::new(Some(thread)),
        }))
    }

    /// Queues `job` (its `point` is assigned here) and returns the point.
    pub(crate) fn submit(&self, mut job: Job) -> Result<TimelinePoint, String> {
        let tx = self
            .tx
            .lock()
            .map_err(|_| "gather queue poisoned".to_string())?;
        let tx = tx.as_ref().ok_or("the model is being removed")?;
        let mut next = self
            .next
            .lock()
            .map_err(|_| "gather queue poisoned".to_string())?;
        *next += 1;
        job.point = TimelinePoint {
            timeline: self.timeline,
            value: *next,
        };
        let p = job.point;
        tx.send(job)
            .map_err(|_| "the gather worker stopped".to_string())?;
        Ok(p)
    }

    pub fn timeline(&self) -> TimelineId {
        self.timeline
    }

    /// The error of a gather whose point is `point`, if it failed (taken: reported once).
    pub fn failure(&self, point: TimelinePoint) -> Option<String> {
        if point.timeline != self.timeline {
            return None;
        }
        self.failures.lock().ok()?.remove(&point.value)
    }

    /// Finishes queued gathers and stops the worker.
    pub fn stop(&self) {
        if let Ok(mut tx) = self.tx.lock() {
            tx.take();
        }
        if let Some(t) = self.thread.lock().ok().and_then(|mut t| t.take()) {
            let _ = t.join();
        }
    }

    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }
}

impl Drop for GatherQueue {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Longest a gather waits for its incoming fence.
const WAIT_NS: u64 = 300_000_000_000;

fn run(dev: &Device, job: Job) -> Result<(), String> {
    let at = format!("parameters.gather `{}`", job.key);
    if let Some(w) = job.wait {
        match dev.wait(w, WAIT_NS) {
            Ok(true) => {}
            Ok(false) => return Err(format!("{at}: the incoming fence did not complete")),
            Err(e) => return Err(format!("{at}: the incoming fence failed: {e}")),
        }
    }
    if job.count == 0 {
        return Ok(());
    }
    let raw = dev
        .read(&job.descriptors, job.offset, job.count * DESCRIPTOR_BYTES)
        .map_err(|e| format!("{at}: reading descriptors: {e}"))?;
    let u = |i: usize| u64::from_le_bytes(raw[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
    let mut ranges = Vec::with_capacity(job.count as usize);
    for r in 0..job.count as usize {
        let (src, dst, len) = (u(3 * r), u(3 * r + 1), u(3 * r + 2));
        if len == 0 {
            continue;
        }
        if src.checked_add(len).is_none_or(|e| e > job.entry.len) {
            return Err(format!(
                "{at}: descriptor {r}: bytes {src}+{len} are outside the entry's {} bytes",
                job.entry.len
            ));
        }
        if dst.checked_add(len).is_none_or(|e| e > job.target.bytes()) {
            return Err(format!(
                "{at}: descriptor {r}: destination {dst}+{len} is outside the target's {} bytes",
                job.target.bytes()
            ));
        }
        ranges.push((dst, src, len, r));
    }
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        if w[0].0 + w[0].2 > w[1].0 {
            return Err(format!(
                "{at}: descriptors {} and {} write overlapping destination ranges",
                w[0].3, w[1].3
            ));
        }
    }
    let mut buf = Vec::new();
    for (dst, src, len, _) in ranges {
        buf.resize(len as usize, 0);
        job.source.read(&job.entry, src, &mut buf)?;
        dev.write(&job.target, dst, &buf)
            .map_err(|e| format!("{at}: {e}"))?;
    }
    Ok(())
}
