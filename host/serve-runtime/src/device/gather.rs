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
//! 3. checks every record (inside the entry, inside the target, destination ranges disjoint) and then
//!    * on a device that queues file reads (`loom_plugin_api::HalFiles`, see [`crate::device`]): hands the
//!      device the checkpoint shard once (the worker keeps it open while the source lives) and queues the
//!      ranges as file reads straight into the target, at most `MAX_FILE_READS` per submission, on a private
//!      I/O timeline of the worker, and waits for them. A failed read fails that I/O point on the device
//!      (its message names the file offset and length); the worker records it against the gather point and
//!      replaces the I/O timeline (a failed timeline stays failed), so one bad gather never poisons the next;
//!    * otherwise (a plugin built before ABI 1.3): reads each range from the checkpoint with a positional read
//!      on the host into a staging slice, then writes it to the target;
//! 4. signals the point.
//!
//! # Direct I/O
//!
//! `model.json`'s `"io": {"direct": true}` makes the worker open the shards for direct I/O (`O_DIRECT`). It
//! needs a device with queued file reads (the model fails to load otherwise, naming the field), and every
//! range's file offset (the entry's offset in its file plus the record's), length and destination offset must
//! be multiples of the device's alignment (4096 on the CPU HAL): a misaligned record fails the gather with
//! `parameters.gather `KEY`: descriptor N: direct I/O needs 4096-byte aligned ranges: offset X length Y`
//! before anything is read, never falling back to buffered reads. The cohort fails; the model keeps serving.
//!
//! The job holds the descriptor and target buffers and the source until it is done, so removing the model or
//! dropping the program's handles cannot release them early. A failure (a failed `wait`, a bad record, a read
//! error) **fails the point** on the device (`Device::fail`, ABI 1.5), so every dispatch that waits on the
//! gather's fence fails with the read's message instead of running on a target nobody filled (failed readiness
//! is never success), and records the error against the point for the collector ([`GatherQueue::failure`]).
//! Only that point fails: the gather timeline goes on, so other gathers (another cohort's, queued behind it)
//! are unaffected. On a device built before 1.5 the point is signalled and only the record carries the failure
//! (the consumer runs; its cohort still fails at collection).
//! Jobs complete in order, so point values increase monotonically.

use crate::checkpoint::{Entry, Source};
use crate::device::{Device, DeviceBuffer};
use loom_plugin_api::abi_stable::std_types::RVec;
use loom_plugin_api::{
    FileId, FileRead, FileReadSubmission, MAX_FILE_READS, TimelineId, TimelinePoint,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak, mpsc};

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
    /// Failed gathers' messages by point, taken by the collector of the work that joined them.
    failures: Arc<Mutex<HashMap<u64, String>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for GatherQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatherQueue").finish_non_exhaustive()
    }
}

impl GatherQueue {
    /// Starts the worker of model `name`; `direct` is `model.json`'s `io.direct` (the device must then queue
    /// file reads).
    pub fn start(
        device: Arc<Device>,
        name: &str,
        direct: bool,
    ) -> Result<Arc<GatherQueue>, crate::Error> {
        if direct && !device.has_file_reads() {
            return Err(crate::Error::package(
                "model.json",
                "io.direct",
                format!(
                    "direct I/O needs a device that queues file reads; device {} (plugin {}) has none \
                     (a HAL plugin built before ABI 1.3, or one without them)",
                    device.name, device.plugin
                ),
            ));
        }
        let timeline = device.timeline()?;
        let (tx, rx) = mpsc::channel::<Job>();
        let failures = Arc::new(Mutex::new(HashMap::new()));
        let (dev, fails) = (device.clone(), failures.clone());
        let thread = std::thread::Builder::new()
            .name(format!("gather-{name}"))
            .spawn(move || {
                let mut io = DeviceIo {
                    direct,
                    ..DeviceIo::default()
                };
                while let Ok(job) = rx.recv() {
                    let point = job.point;
                    match run(&dev, job, &mut io) {
                        Ok(()) => {
                            if let Err(e) = dev.signal(point) {
                                log::error!("gather: signalling point {}: {e}", point.value);
                            }
                        }
                        Err(e) => {
                            // Failed readiness: the point fails (only it), so work waiting on it fails with the
                            // read's message instead of running on a target nobody filled.
                            if let Ok(mut f) = fails.lock() {
                                f.insert(point.value, e.clone());
                            }
                            if let Err(e) = dev.fail(point, &e) {
                                log::error!("gather: failing point {}: {e}", point.value);
                            }
                        }
                    }
                }
                io.close_all(&dev);
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

/// The worker's queued-read state: its I/O timeline and the shards it handed the device.
#[derive(Default)]
struct DeviceIo {
    direct: bool,
    /// The current I/O timeline and its last point (replaced after a failure).
    timeline: Option<(TimelineId, u64)>,
    /// (source, shard) -> the device's file and its direct-read alignment (0: buffered).
    files: Vec<(Weak<Source>, usize, FileId, u64)>,
}

impl DeviceIo {
    /// The device's file for shard `shard` of `source`, handed over on first use; files of sources that are
    /// gone are closed first.
    fn file(
        &mut self,
        dev: &Device,
        source: &Arc<Source>,
        shard: usize,
    ) -> Result<(FileId, u64), String> {
        let mut i = 0;
        while i < self.files.len() {
            if self.files[i].0.strong_count() == 0 {
                let (_, _, f, _) = self.files.swap_remove(i);
                if let Err(e) = dev.file_close(f) {
                    log::warn!("gather: closing a file of a dropped source: {e}");
                }
            } else {
                i += 1;
            }
        }
        let weak = Arc::downgrade(source);
        if let Some(&(_, _, f, a)) = self
            .files
            .iter()
            .find(|(w, s, _, _)| *s == shard && Weak::ptr_eq(w, &weak))
        {
            return Ok((f, a));
        }
        let path = source
            .files
            .get(shard)
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        let fd = source
            .raw_fd(shard)
            .ok_or_else(|| format!("no shard {shard} in the source"))?;
        let info = dev
            .file_open(fd, &path, self.direct)
            .map_err(|e| e.to_string())?;
        self.files
            .push((weak, shard, info.file, info.direct_alignment));
        Ok((info.file, info.direct_alignment))
    }

    /// The next point of the I/O timeline (created on first use).
    fn next_point(&mut self, dev: &Device) -> Result<TimelinePoint, String> {
        let (t, v) = match self.timeline {
            Some(tv) => tv,
            None => (dev.timeline().map_err(|e| e.to_string())?, 0),
        };
        self.timeline = Some((t, v + 1));
        Ok(TimelinePoint {
            timeline: t,
            value: v + 1,
        })
    }

    fn close_all(&mut self, dev: &Device) {
        for (_, _, f, _) in self.files.drain(..) {
            let _ = dev.file_close(f);
        }
    }
}

/// Queues `ranges` (destination, offset in the entry, length, descriptor index) as file reads on the device
/// and waits for them.
fn device_reads(
    dev: &Device,
    job: &Job,
    ranges: &[(u64, u64, u64, usize)],
    io: &mut DeviceIo,
    at: &str,
) -> Result<(), String> {
    let (file, align) = io
        .file(dev, &job.source, job.entry.file)
        .map_err(|e| format!("{at}: {e}"))?;
    let mut reads = Vec::with_capacity(ranges.len());
    for &(dst, src, len, r) in ranges {
        let file_offset = job.entry.offset + src;
        if io.direct
            && align > 0
            && !(file_offset.is_multiple_of(align)
                && len.is_multiple_of(align)
                && dst.is_multiple_of(align))
        {
            return Err(format!(
                "{at}: descriptor {r}: direct I/O needs {align}-byte aligned ranges: offset \
                 {file_offset} length {len} (destination offset {dst}; `io.direct` in model.json)"
            ));
        }
        reads.push(FileRead {
            file,
            file_offset,
            len,
            dst: job.target.id(),
            dst_offset: dst,
        });
    }
    let mut last: Option<TimelinePoint> = None;
    let mut submitted = Ok(());
    for chunk in reads.chunks(MAX_FILE_READS) {
        let signal = match io.next_point(dev) {
            Ok(p) => p,
            Err(e) => {
                submitted = Err(e);
                break;
            }
        };
        let s = FileReadSubmission {
            reads: RVec::from(chunk.to_vec()),
            wait: RVec::from(last.into_iter().collect::<Vec<_>>()),
            signal,
        };
        if let Err(e) = dev.submit_reads(s) {
            // The point will never be signalled: the timeline cannot be used past it.
            io.timeline = None;
            submitted = Err(e.to_string());
            break;
        }
        last = Some(signal);
    }
    // Whatever was accepted finishes before the gather signals (it writes into the target).
    let waited = match last {
        None => Ok(()),
        Some(p) => match dev.wait(p, WAIT_NS) {
            Ok(true) => Ok(()),
            Ok(false) => {
                io.timeline = None;
                Err("the device's file reads did not complete".to_string())
            }
            Err(e) => {
                // A failed timeline stays failed: the next gather starts a new one.
                io.timeline = None;
                Err(e)
            }
        },
    };
    submitted.and(waited).map_err(|e| format!("{at}: {e}"))
}

fn run(dev: &Device, job: Job, io: &mut DeviceIo) -> Result<(), String> {
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
    if dev.has_file_reads() {
        return device_reads(dev, &job, &ranges, io, &at);
    }
    if io.direct {
        return Err(format!(
            "{at}: direct I/O was requested (`io.direct` in model.json) but device {} cannot queue file reads",
            dev.name
        ));
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
