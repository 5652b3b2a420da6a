//! The CPU HAL plugin (`cpu-0001`): the HAL of `loom-plugin-api` on host memory, with stages lowered by
//! `loom-cpu`.
//!
//! * Buffers are zero-filled `Vec<u8>`s; `write`/`read` act immediately under the buffer's lock.
//! * `compile` decodes the stage (`loom_ir::kernel_codec`) and compiles it with `loom_cpu::compile_stage`.
//! * Submissions run in **lanes**: those whose signal points are on one timeline run one at a time, in
//!   submission order; different timelines' submissions are ordered only by their wait points (the HAL
//!   contract: `loom_plugin_api::Submission`), so the server's models, each invocation signalling a timeline of its own, run
//!   side by side and the operating system shares the cores between them. A lane that must queue gets a
//!   thread, which stops after 60 s without work. A job waits for every wait point, runs the commands, then
//!   advances the signal point's timeline, or, on the first error, fails the timeline with the error's text
//!   (a dispatch's `ExecError` text unchanged). A submission whose wait point failed does not run and fails
//!   its own signal point with the same error, so failures propagate along fence chains.
//! * A submission accepted while its lane has nothing in flight and whose wait points are already reached runs
//!   on the submitting thread instead (the hand-off to a lane thread and back cost two thread wake-ups, more
//!   than a small stage runs for); an `exec` lock per lane and the lane's in-flight count keep its jobs one at
//!   a time in acceptance order either way, and the caller sees the same points and failures.
//! * Every buffer carries a `loom_cpu::ParamCache`: what the CPU kernels derive from its bytes when it is a
//!   dispatch's parameter (repacked weight tiles), passed to `CpuStage::run_cached` and kept for the next
//!   dispatches; any mutable access to the bytes (a write, fill, copy or file read into it, or a dispatch
//!   output) clears it first, so a rewritten parameter is never computed with from stale tiles.
//! * Jobs lock their buffers in address order (lanes run side by side, so two jobs may share buffers).
//! * A submission holds its buffers (resolved from ids when it is accepted), so a buffer freed while a
//!   submission that uses it is queued stays alive until that submission retires.
//! * Every exported function runs under `catch_unwind` (`loom_plugin_api::guard`); a panic on the queue thread
//!   fails the submission's signal point.
//! * Queued file reads (ABI 1.3, `loom_plugin_api::HalFiles`, from the root's `hal_files` or [`open_with_files`]):
//!   `file_open` reopens the host's descriptor through `/proc/self/fd/<fd>` (with `O_DIRECT` for a direct file:
//!   a file system that refuses it, such as tmpfs, is an error), and a read submission runs on the
//!   device's transfer queue, in acceptance order among reads (a lane of its own: reads are ordered against
//!   dispatches, copies and fills only by timeline points, so compute work may wait for a read submitted after
//!   it), each read a positional `read_exact_at` straight into the destination
//!   buffer's bytes. A direct read needs its file offset, length and destination offset to be multiples of
//!   4096 ([`DIRECT_ALIGNMENT`]; opening, these checks and the error texts are `hal_queue::files`, shared with
//!   `hal-vulkan`: not asked of the file system, which needs a `statx`/`ioctl` call and `unsafe`;
//!   4096 is a multiple of every common logical block size), else it fails its point with
//!   `direct I/O needs 4096-byte aligned ranges: offset X length Y`, never falling back to a buffered read. The
//!   buffers are plain `Vec<u8>`s, whose start is only as aligned as the allocator makes it, so a direct read
//!   whose destination *address* is not 4096-aligned goes through an aligned bounce slice of at most 1 MiB
//!   (carved out of a slightly larger `Vec<u8>`, no `unsafe`) and is copied from there; an aligned one lands
//!   in place.
//! * Device control (ABI 1.5, `loom_plugin_api::HalControl`, from the root's `hal_open` or [`open_parts`]):
//!   `submit_bounded` runs each dispatch with `loom_cpu::CpuStage::run_bounded` (the step budget, and the
//!   cancellation flag: an `AtomicU32` per `CancelId`, shared by the jobs that carry it, so a flag set while a
//!   dispatch runs stops it at its next program instance or within 65536 loop iterations); `release` drops
//!   the executable's id, and its compiled code is freed when the last queued submission using it retires.
//!
//! The crate is both a `cdylib` (the plugin) and an `rlib` ([`driver`] gives the same driver in-process).

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use abi_stable::export_root_module;
use abi_stable::prefix_type::PrefixTypeTrait;
use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::ROption;
use abi_stable::std_types::{RBoxError, RResult, RSlice, RStr, RString, RVec};
use hal_queue::commands::{self, Executable, Objects, byte_range, copy_ranges, slot};
use hal_queue::files::{self, QueuedRead};
use hal_queue::{Timelines, lock, wait_point};
use loom_cpu::CpuStage;
use loom_ir::kernel::ExecError;
use loom_ir::kernel_codec;
use loom_plugin_api::{
    ABI_MAJOR, ABI_MINOR, BufferId, CancelId, DeviceInfo, DeviceLimits, DispatchBounds,
    ExecutableId, FileId, FileInfo, FileOpenFlags, FileReadSubmission, HalControl, HalControl_TO,
    HalDevice, HalDevice_TO, HalDeviceBox, HalDeviceParts, HalDeviceWithFiles, HalDriver,
    HalDriver_TO, HalDriverBox, HalFiles, HalFiles_TO, LoomPlugin, LoomPlugin_Ref, PluginKind,
    Probe, Submission, TimelineId, TimelinePoint, WaitStatus, guard, guard_probe, panic_message,
};

/// This plugin's id.
pub const PLUGIN_ID: &str = "cpu-0001";

/// Largest buffer `alloc` accepts.
pub const MAX_BUFFER_BYTES: u64 = 1 << 40;

/// What a direct read's file offset, length and destination offset must be multiples of.
pub const DIRECT_ALIGNMENT: u64 = hal_queue::files::DIRECT_ALIGNMENT;

/// The exported root module.
#[export_root_module]
pub fn root_module() -> LoomPlugin_Ref {
    LoomPlugin {
        abi_major: ABI_MAJOR,
        abi_minor: ABI_MINOR,
        id: RStr::from_str(PLUGIN_ID),
        kind: PluginKind::HAL,
        probe,
        hal,
        codec: loom_plugin_api::no_codec,
        profile: loom_plugin_api::no_profile,
        hal_files,
        profile_events: loom_plugin_api::no_profile_events,
        hal_open,
    }
    .leak_into_prefix()
}

extern "C" fn probe() -> Probe {
    guard_probe(|| Probe::available(1, device_name()))
}

extern "C" fn hal() -> RResult<HalDriverBox, RBoxError> {
    guard("hal-cpu driver", || Ok::<_, String>(driver()))
}

extern "C" fn hal_files(index: u32) -> RResult<HalDeviceWithFiles, RBoxError> {
    guard("hal-cpu open with files", || open_with_files(index))
}

extern "C" fn hal_open(index: u32) -> RResult<HalDeviceParts, RBoxError> {
    guard("hal-cpu open", || open_parts(index))
}

/// Opens cpu device `index` with its queued file reads and its control (also what the plugin's `hal_open`
/// returns).
pub fn open_parts(index: u32) -> Result<HalDeviceParts, String> {
    if index != 0 {
        return Err(format!("no cpu device {index} (there is 1)"));
    }
    let dev = CpuDevice::new();
    Ok(HalDeviceParts {
        device: HalDevice_TO::from_value(dev.clone(), TD_Opaque),
        files: ROption::RSome(HalFiles_TO::from_value(dev.clone(), TD_Opaque)),
        control: ROption::RSome(HalControl_TO::from_value(dev, TD_Opaque)),
    })
}

/// Opens cpu device `index` with its queued file reads (also what the plugin's `hal_files` returns).
pub fn open_with_files(index: u32) -> Result<HalDeviceWithFiles, String> {
    if index != 0 {
        return Err(format!("no cpu device {index} (there is 1)"));
    }
    let dev = CpuDevice::new();
    Ok(HalDeviceWithFiles {
        device: HalDevice_TO::from_value(dev.clone(), TD_Opaque),
        files: ROption::RSome(HalFiles_TO::from_value(dev, TD_Opaque)),
    })
}

/// The CPU driver (also what the plugin's `hal` returns).
pub fn driver() -> HalDriverBox {
    HalDriver_TO::from_value(CpuDriver, TD_Opaque)
}

/// The worker count, read once: `available_parallelism` reads cgroup files on every call (tens of
/// microseconds), and every dispatch asks.
fn threads() -> usize {
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *THREADS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

fn device_name() -> String {
    format!("cpu ({} threads)", threads())
}

#[derive(Debug)]
struct CpuDriver;

impl HalDriver for CpuDriver {
    fn devices(&self) -> RVec<DeviceInfo> {
        let r = guard("devices", || {
            Ok::<_, String>(RVec::from(vec![DeviceInfo {
                name: RString::from(device_name()),
                backend: RString::from("cpu"),
                memory_bytes: 0,
            }]))
        });
        r.into_result().unwrap_or_default()
    }

    fn open(&self, index: u32) -> RResult<HalDeviceBox, RBoxError> {
        guard("open", || {
            if index != 0 {
                return Err(format!("no cpu device {index} (there is 1)"));
            }
            Ok(HalDevice_TO::from_value(CpuDevice::new(), TD_Opaque))
        })
    }
}

// ---- device state ----------------------------------------------------------------------------------------------

// `lock` (hal_queue's) ignores poisoning: a panic on another thread is already reported as an error; the
// data is still usable bytes.
type Buf = Arc<Mutex<Lazy>>;

/// A buffer's bytes, allocated (zeroed) the first time anything locks it: a stage's reflected workspace
/// buffers, which the CPU never touches (its kernels use their own scratch), then cost no memory at all. They
/// used to be `calloc`ed for every cohort, and glibc serves mid-sized blocks from its heap, zeroing (and
/// faulting in) all of them: at MiniLM requests of 32, ~170 MB a cohort, and the kernel clearing those pages was
/// 4-19 % of the samples (`BENCHMARKS.md`).
#[derive(Debug)]
struct Lazy {
    bytes: Vec<u8>,
    /// The size; `bytes` is empty until [`lock_buf`] allocates it.
    len: usize,
    ready: bool,
    /// What the CPU kernels derived from these bytes as a dispatch's parameter (repacked weight tiles), kept
    /// for the next dispatches; cleared by every mutable access to the bytes (see `DerefMut`).
    derived: loom_cpu::ParamCache,
}

impl Lazy {
    fn new(len: usize) -> Lazy {
        Lazy {
            bytes: Vec::new(),
            len,
            ready: len == 0,
            derived: loom_cpu::ParamCache::new(),
        }
    }
}

impl std::ops::Deref for Lazy {
    type Target = Vec<u8>;
    fn deref(&self) -> &Vec<u8> {
        &self.bytes
    }
}

impl std::ops::DerefMut for Lazy {
    /// The bytes, to change: whatever was derived from them is dropped first.
    fn deref_mut(&mut self) -> &mut Vec<u8> {
        self.derived.clear();
        &mut self.bytes
    }
}

/// Locks a buffer, allocating its zeroed bytes first if nothing has yet. Fails only when the allocator does.
fn lock_buf(b: &Buf) -> Result<MutexGuard<'_, Lazy>, String> {
    let mut g = lock(b);
    if !g.ready {
        g.bytes = loom_cpu::zeroed_bytes(g.len)
            .ok_or_else(|| format!("out of memory for a buffer of {} bytes", g.len))?;
        g.ready = true;
    }
    Ok(g)
}

#[derive(Debug)]
struct Exe {
    stage: CpuStage,
    name: String,
    n_workspace: usize,
}

impl Executable for Exe {
    fn stage_name(&self) -> &str {
        &self.name
    }
    fn workspace_len(&self) -> usize {
        self.n_workspace
    }
}

#[derive(Debug, Default)]
struct State {
    /// Buffers and executables; timelines take their ids from the same counter.
    objects: Objects<Buf, Exe>,
    /// Each live buffer's size, so that `free` can report it without taking the buffer's lock (a running
    /// dispatch may hold it).
    buffer_bytes: HashMap<BufferId, u64>,
    files: files::FileTable,
    /// Cancellation flags by id (ABI 1.5); jobs hold their own `Arc`.
    cancels: HashMap<u64, Arc<AtomicU32>>,
    timelines: Timelines,
    closed: bool,
    /// The lanes that have accepted jobs not yet retired, or a thread still serving them.
    lanes: HashMap<Lane, LaneState>,
}

/// Where a job runs. Submissions whose signal points are on one timeline form one lane: they run one at a
/// time, in acceptance order. Lanes are ordered against each other only by timeline points, so the dispatches
/// of two models (each invocation signals a timeline of its own) run side by side, and the operating system shares the
/// cores between them: one model's long dispatch no longer holds up every other model on the device. File
/// reads have a lane of their own (the transfer queue), ordered only by points too: `parameters.gather`
/// queues the consumer of the rows before the reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Lane {
    /// Dispatches, copies and fills that signal this timeline.
    Compute(TimelineId),
    /// File reads.
    Reads,
}

#[derive(Debug, Default)]
struct LaneState {
    /// Held while one of the lane's jobs runs, inline or on the lane's thread.
    exec: Arc<Mutex<()>>,
    /// Accepted jobs not yet retired (queued, running on the lane's thread, or running inline).
    in_flight: u64,
    /// The channel of the thread serving the lane, while one does (it stops after [`LANE_IDLE`] without
    /// work).
    tx: Option<mpsc::Sender<Job>>,
}

/// How long a lane's thread waits for more work before it stops (the next queued job starts another). Long
/// enough that a model under intermittent load keeps its thread: with 5 s, HTTP load at 16 clients had 2 runs
/// of 9 with a 13-19 ms p99 (threads starting and stopping, probably: a start happens under the device's state
/// lock), with an hour or a minute none of 9.
const LANE_IDLE: Duration = Duration::from_secs(60);

#[derive(Debug)]
struct Inner {
    state: Mutex<State>,
    /// Notified whenever a timeline advances or fails, and on close.
    changed: Condvar,
    /// The lanes' threads (finished ones are dropped when the next one starts, the rest joined on close).
    /// Locked only after `state`, never before.
    workers: Mutex<Vec<JoinHandle<()>>>,
}

impl Inner {
    /// Advances (`Ok`) or fails (`Err`) the timeline of `point`; the job of `lane` that signals it is no
    /// longer in flight.
    fn retire(&self, lane: Lane, point: TimelinePoint, result: Result<(), String>) {
        let mut st = lock(&self.state);
        if let Some(l) = st.lanes.get_mut(&lane) {
            l.in_flight = l.in_flight.saturating_sub(1);
            if l.in_flight == 0 && l.tx.is_none() {
                st.lanes.remove(&lane);
            }
        }
        st.timelines.retire(point, result);
        drop(st);
        self.changed.notify_all();
    }

    /// Blocks until `point` is reached, failed, the device closes, or `deadline` passes.
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

/// A job's work, resolved (and so kept alive) when accepted: the commands of a `submit` or the reads of a
/// `submit_reads` (on [`Lane::Reads`]).
#[derive(Debug)]
enum Work {
    Commands(Vec<commands::Cmd<Buf, Exe>>, Bounds),
    Reads(Vec<QueuedRead<Buf>>),
}

/// A submission's run-time bounds (ABI 1.5): each dispatch's step budget (0: none) and its cancellation flag.
#[derive(Debug, Default)]
struct Bounds {
    steps: u64,
    cancel: Option<Arc<AtomicU32>>,
}

#[derive(Debug)]
struct Job {
    work: Work,
    wait: Vec<TimelinePoint>,
    signal: TimelinePoint,
    lane: Lane,
    /// The lane's `exec` lock.
    exec: Arc<Mutex<()>>,
}

/// The device state and its lanes; closed when the last [`CpuDevice`] handle (the device's, its file reads'
/// and its control's) drops.
#[derive(Debug)]
struct Core {
    inner: Arc<Inner>,
}

/// A handle to one device: `HalDevice`, `HalFiles` and `HalControl` are implemented on it.
#[derive(Debug, Clone)]
struct CpuDevice(Arc<Core>);

impl std::ops::Deref for CpuDevice {
    type Target = Core;
    fn deref(&self) -> &Core {
        &self.0
    }
}

impl CpuDevice {
    fn new() -> CpuDevice {
        CpuDevice(Arc::new(Core::new()))
    }
}

impl Core {
    fn new() -> Core {
        Core {
            inner: Arc::new(Inner {
                state: Mutex::new(State::default()),
                changed: Condvar::new(),
                workers: Mutex::new(Vec::new()),
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.inner.state)
    }

    /// Queues a resolved job on `lane` (or runs it here: see below). `st` has checked its timelines.
    fn accept(
        &self,
        mut st: MutexGuard<'_, State>,
        lane: Lane,
        work: Work,
        wait: &[TimelinePoint],
        signal: TimelinePoint,
    ) -> Result<(), String> {
        if st.closed {
            return Err("submit: the device is closed".to_string());
        }
        let settled = wait.iter().all(|&p| st.timelines.settled(p));
        let l = st.lanes.entry(lane).or_default();
        // An idle lane whose waits are already satisfied runs the job here, on the submitting thread: the
        // CPU has no other processor to hand it to, and the hand-off to a lane thread and back cost two
        // thread wake-ups (~50 us each on this machine class) per cohort. Later submissions of the lane queue
        // behind it (`in_flight`) and its thread takes `exec` only after this job releases it, so the lane's
        // jobs still run one at a time in acceptance order; the caller sees the same points and failures
        // either way.
        let ready = l.in_flight == 0 && settled;
        l.in_flight += 1;
        let job = Job {
            work,
            wait: wait.to_vec(),
            signal,
            lane,
            exec: Arc::clone(&l.exec),
        };
        if ready {
            drop(st);
            execute(&self.inner, job);
            return Ok(());
        }
        // Sent under the state lock, so a lane thread that finds its channel empty under the same lock may
        // stop (see `lane_thread`).
        let sent = match &l.tx {
            Some(tx) => tx
                .send(job)
                .map_err(|_| "submit: the lane's thread has stopped".to_string()),
            None => {
                let (tx, rx) = mpsc::channel::<Job>();
                let inner = Arc::clone(&self.inner);
                let name = match lane {
                    Lane::Reads => "hal-cpu-reads".to_string(),
                    Lane::Compute(t) => format!("hal-cpu-lane-{}", t.0),
                };
                match std::thread::Builder::new()
                    .name(name)
                    .spawn(move || lane_thread(&inner, lane, &rx))
                {
                    Ok(handle) => {
                        let sent = tx
                            .send(job)
                            .map_err(|_| "submit: the lane's thread has stopped".to_string());
                        l.tx = Some(tx);
                        let mut w = lock(&self.inner.workers);
                        w.retain(|h| !h.is_finished());
                        w.push(handle);
                        sent
                    }
                    Err(e) => Err(format!("submit: no thread for the queue: {e}")),
                }
            }
        };
        if let Err(e) = sent {
            l.in_flight = l.in_flight.saturating_sub(1);
            return Err(e);
        }
        Ok(())
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        let mut st = lock(&self.inner.state);
        st.closed = true;
        // The lanes' threads run what they were sent (failing on their waits: the device is closed), then
        // see their channels closed and stop.
        for l in st.lanes.values_mut() {
            l.tx = None;
        }
        drop(st);
        self.inner.changed.notify_all();
        let workers = std::mem::take(&mut *lock(&self.inner.workers));
        for w in workers {
            let _ = w.join();
        }
    }
}

/// A lane's thread: runs the jobs sent to it, in order; stops once its channel is closed, or after
/// [`LANE_IDLE`] without work (the lane then has no thread until a job must queue again).
fn lane_thread(inner: &Inner, lane: Lane, rx: &mpsc::Receiver<Job>) {
    loop {
        match rx.recv_timeout(LANE_IDLE) {
            Ok(job) => execute(inner, job),
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let mut st = lock(&inner.state);
                // Jobs are sent under this lock: one sent while this thread waited for it is still its own.
                if let Ok(job) = rx.try_recv() {
                    drop(st);
                    execute(inner, job);
                    continue;
                }
                if let Some(l) = st.lanes.get_mut(&lane) {
                    l.tx = None;
                    if l.in_flight == 0 {
                        st.lanes.remove(&lane);
                    }
                }
                return;
            }
        }
    }
}

/// Runs one accepted job (after the one before it in its lane) and retires its signal point.
fn execute(inner: &Inner, job: Job) {
    let (signal, lane, exec) = (job.signal, job.lane, Arc::clone(&job.exec));
    let _order = lock(&exec);
    let result = catch_unwind(AssertUnwindSafe(|| run_job(inner, job)))
        .unwrap_or_else(|p| Err(format!("hal-cpu panicked: {}", panic_message(&*p))));
    inner.retire(lane, signal, result);
}

fn run_job(inner: &Inner, job: Job) -> Result<(), String> {
    for &w in &job.wait {
        inner.wait(w, None)?;
    }
    match &job.work {
        Work::Commands(cmds, b) => {
            let bounds = loom_ir::kernel::RunBounds {
                steps: b.steps,
                cancel: b.cancel.as_deref(),
            };
            cmds.iter().try_for_each(|c| run_command(c, &bounds))?
        }
        Work::Reads(reads) => reads.iter().try_for_each(file_read)?,
    }
    // `job` (and with it the last references to freed buffers) drops here, before the point is signalled.
    drop(job);
    Ok(())
}

fn run_command(
    c: &commands::Cmd<Buf, Exe>,
    bounds: &loom_ir::kernel::RunBounds<'_>,
) -> Result<(), String> {
    use commands::Cmd;
    match c {
        Cmd::Fill {
            dst,
            offset,
            len,
            byte,
        } => {
            let mut d = lock_buf(dst)?;
            let r = byte_range("fill", d.len() as u64, *offset, *len)?;
            d[r].fill(*byte);
        }
        Cmd::Copy {
            src,
            src_offset,
            dst,
            dst_offset,
            len,
        } => {
            if Arc::ptr_eq(src, dst) {
                let mut b = lock_buf(src)?;
                let n = b.len() as u64;
                let (s, d) = copy_ranges((n, *src_offset), (n, *dst_offset), *len, true)?;
                b.copy_within(s, d.start);
            } else {
                // Two buffers locked in address order, as every job does (see `lock_in_order`).
                let mut g = lock_in_order(&[src, dst])?;
                let mut d = g.pop().expect("two guards");
                let s = g.pop().expect("two guards");
                let (sr, dr) = copy_ranges(
                    (s.len() as u64, *src_offset),
                    (d.len() as u64, *dst_offset),
                    *len,
                    false,
                )?;
                d[dr].copy_from_slice(&s[sr]);
            }
        }
        Cmd::Dispatch {
            exe,
            inputs,
            params,
            outputs,
        } => {
            commands::check_aliasing(&exe.name, inputs, params, outputs)?;
            // Read-only arguments: lock each distinct buffer once (the same buffer may be bound twice).
            let mut distinct: Vec<&Buf> = Vec::new();
            let in_slots: Vec<usize> = inputs.iter().map(|b| slot(b, &mut distinct)).collect();
            let p_slots: Vec<usize> = params.iter().map(|b| slot(b, &mut distinct)).collect();
            // Every buffer of the dispatch locked in address order (see `lock_in_order`).
            let n_in = distinct.len();
            let all: Vec<&Buf> = distinct.iter().copied().chain(outputs.iter()).collect();
            let mut guards = lock_in_order(&all)?;
            let mut out_guards = guards.split_off(n_in);
            let ins: Vec<&[u8]> = in_slots.iter().map(|&i| guards[i].as_slice()).collect();
            let ps: Vec<&[u8]> = p_slots.iter().map(|&i| guards[i].as_slice()).collect();
            let caches: Vec<&loom_cpu::ParamCache> =
                p_slots.iter().map(|&i| &guards[i].derived).collect();
            let mut outs: Vec<Vec<u8>> = out_guards
                .iter_mut()
                .map(|g| std::mem::take(&mut ***g))
                .collect();
            let r = exe
                .stage
                .run_cached(&ins, &ps, &caches, &mut outs, threads(), bounds);
            for (g, o) in out_guards.iter_mut().zip(outs) {
                ***g = o;
            }
            r.map_err(|e: ExecError| e.to_string())?;
        }
    }
    Ok(())
}

/// Locks `bufs` (distinct buffers) in the order of their addresses and returns the guards in the order of
/// `bufs`. Lanes run side by side, so two jobs may each need a buffer the other holds; taking every job's locks
/// in one global order means neither can wait for the other while holding what it needs.
fn lock_in_order<'a>(bufs: &[&'a Buf]) -> Result<Vec<MutexGuard<'a, Lazy>>, String> {
    let mut order: Vec<usize> = (0..bufs.len()).collect();
    order.sort_by_key(|&i| Arc::as_ptr(bufs[i]) as usize);
    let mut guards: Vec<Option<MutexGuard<'a, Lazy>>> = (0..bufs.len()).map(|_| None).collect();
    for i in order {
        guards[i] = Some(lock_buf(bufs[i])?);
    }
    Ok(guards
        .into_iter()
        .map(|g| g.expect("every buffer locked"))
        .collect())
}

/// One queued file read (see the crate doc; checks and error texts are `hal_queue::files`, shared with
/// `hal-vulkan`): errors name the file offset and length.
fn file_read(r: &QueuedRead<Buf>) -> Result<(), String> {
    let mut d = lock_buf(&r.dst)?;
    let range = r
        .file
        .check(r.file_offset, r.len, d.len() as u64, r.dst_offset)?;
    r.file.read_piece(
        (r.file_offset, r.len),
        r.file_offset,
        &mut d[range.start as usize..range.end as usize],
    )
}

impl CpuDevice {
    /// `submit`, with `bounds` (ABI 1.5 `submit_bounded`) when given.
    fn submit_with(
        &self,
        submission: Submission,
        bounds: Option<DispatchBounds>,
    ) -> Result<(), String> {
        let st = self.state();
        st.timelines
            .check(submission.wait.iter().chain([&submission.signal]))?;
        let bounds = match bounds {
            None => Bounds::default(),
            Some(b) => Bounds {
                steps: b.steps,
                cancel: match b.cancel.0 {
                    0 => None,
                    id => Some(
                        st.cancels
                            .get(&id)
                            .cloned()
                            .ok_or_else(|| format!("submit: unknown cancellation flag {id}"))?,
                    ),
                },
            },
        };
        // The CPU uses its own (poisoned) scratch: workspace buffers are only checked to exist.
        let commands = st.objects.resolve(&submission.commands)?;
        self.accept(
            st,
            Lane::Compute(submission.signal.timeline),
            Work::Commands(commands, bounds),
            &submission.wait,
            submission.signal,
        )
    }
}

impl HalControl for CpuDevice {
    fn release(&self, exe: ExecutableId) -> RResult<(), RBoxError> {
        guard("release", || self.state().objects.release_executable(exe))
    }

    fn cancel_create(&self) -> RResult<CancelId, RBoxError> {
        guard("cancel_create", || {
            let mut st = self.state();
            let id = st.objects.next_id();
            st.cancels.insert(id, Arc::new(AtomicU32::new(0)));
            Ok::<_, String>(CancelId(id))
        })
    }

    fn cancel_signal(&self, cancel: CancelId) -> RResult<(), RBoxError> {
        guard("cancel_signal", || {
            let st = self.state();
            let flag = st
                .cancels
                .get(&cancel.0)
                .ok_or_else(|| format!("cancel_signal: unknown cancellation flag {}", cancel.0))?;
            flag.store(1, std::sync::atomic::Ordering::Relaxed);
            Ok::<_, String>(())
        })
    }

    fn cancel_destroy(&self, cancel: CancelId) -> RResult<(), RBoxError> {
        guard("cancel_destroy", || {
            self.state()
                .cancels
                .remove(&cancel.0)
                .map(|_| ())
                .ok_or_else(|| format!("cancel_destroy: unknown cancellation flag {}", cancel.0))
        })
    }

    fn submit_bounded(
        &self,
        submission: Submission,
        bounds: DispatchBounds,
    ) -> RResult<(), RBoxError> {
        guard("submit_bounded", || {
            self.submit_with(submission, Some(bounds))
        })
    }

    fn timeline_fail(&self, point: TimelinePoint, message: RString) -> RResult<(), RBoxError> {
        guard("timeline_fail", || {
            self.state().timelines.fail(point, message.into_string())?;
            self.inner.changed.notify_all();
            Ok::<_, String>(())
        })
    }
}

impl HalDevice for CpuDevice {
    fn limits(&self) -> DeviceLimits {
        DeviceLimits {
            max_buffer_bytes: MAX_BUFFER_BYTES,
            max_stage_bytes: kernel_codec::MAX_STAGE_BYTES as u64,
            parallelism: u32::try_from(threads()).unwrap_or(u32::MAX),
        }
    }

    fn alloc(&self, bytes: u64) -> RResult<BufferId, RBoxError> {
        guard("alloc", || {
            let n = usize::try_from(bytes)
                .ok()
                .filter(|_| bytes <= MAX_BUFFER_BYTES)
                .ok_or_else(|| {
                    format!("alloc: {bytes} bytes is over the limit of {MAX_BUFFER_BYTES}")
                })?;
            // Allocated when first used (see `Lazy`): the workspace buffers the CPU backend does not use
            // never are.
            let mut st = self.state();
            let id = st.objects.add_buffer(Arc::new(Mutex::new(Lazy::new(n))));
            st.buffer_bytes.insert(id, bytes);
            Ok::<_, String>(id)
        })
    }

    fn free(&self, buffer: BufferId) -> RResult<(), RBoxError> {
        guard("free", || {
            let mut st = self.state();
            st.objects.free(buffer)?;
            let bytes = st.buffer_bytes.remove(&buffer).unwrap_or(0);
            drop(st);
            // After a burst, freed memory goes back to the system (see `loom_cpu::trim`).
            loom_cpu::trim::note_freed(bytes);
            Ok::<_, String>(())
        })
    }

    fn write(&self, buffer: BufferId, offset: u64, data: RSlice<'_, u8>) -> RResult<(), RBoxError> {
        guard("write", || {
            let b = self.state().objects.buffer(buffer)?;
            let mut b = lock_buf(&b)?;
            let r = byte_range("write", b.len() as u64, offset, data.len() as u64)?;
            b[r].copy_from_slice(data.as_slice());
            Ok::<_, String>(())
        })
    }

    fn read(&self, buffer: BufferId, offset: u64, len: u64) -> RResult<RVec<u8>, RBoxError> {
        guard("read", || {
            let b = self.state().objects.buffer(buffer)?;
            let b = lock_buf(&b)?;
            let r = byte_range("read", b.len() as u64, offset, len)?;
            Ok::<_, String>(RVec::from(&b[r]))
        })
    }

    fn compile(&self, stage: RSlice<'_, u8>) -> RResult<ExecutableId, RBoxError> {
        guard("compile", || {
            let stage = kernel_codec::decode_stage(stage.as_slice()).map_err(|e| e.to_string())?;
            let compiled = loom_cpu::compile_stage(&stage).map_err(|e| e.to_string())?;
            let exe = Exe {
                stage: compiled,
                name: stage.name.clone(),
                n_workspace: stage.workspace.len(),
            };
            Ok::<_, String>(self.state().objects.add_executable(exe))
        })
    }

    fn submit(&self, submission: Submission) -> RResult<(), RBoxError> {
        guard("submit", || self.submit_with(submission, None))
    }

    fn timeline_create(&self) -> RResult<TimelineId, RBoxError> {
        guard("timeline_create", || {
            let mut st = self.state();
            let id = st.objects.next_id();
            Ok::<_, String>(st.timelines.create(id))
        })
    }

    fn timeline_value(&self, timeline: TimelineId) -> RResult<u64, RBoxError> {
        guard("timeline_value", || self.state().timelines.value(timeline))
    }

    fn timeline_signal(&self, point: TimelinePoint) -> RResult<(), RBoxError> {
        guard("timeline_signal", || {
            self.state().timelines.signal(point)?;
            self.inner.changed.notify_all();
            Ok::<_, String>(())
        })
    }

    fn timeline_wait(
        &self,
        point: TimelinePoint,
        timeout_ns: u64,
    ) -> RResult<WaitStatus, RBoxError> {
        guard("timeline_wait", || {
            let deadline = Instant::now().checked_add(Duration::from_nanos(timeout_ns));
            self.inner.wait(point, deadline)
        })
    }
}

impl HalFiles for CpuDevice {
    fn file_open(
        &self,
        fd: i32,
        path: RStr<'_>,
        flags: FileOpenFlags,
    ) -> RResult<FileInfo, RBoxError> {
        guard("file_open", || {
            self.state().files.open(fd, path.as_str(), flags)
        })
    }

    fn file_close(&self, file: FileId) -> RResult<(), RBoxError> {
        guard("file_close", || self.state().files.close(file))
    }

    fn submit_reads(&self, submission: FileReadSubmission) -> RResult<(), RBoxError> {
        guard("submit_reads", || {
            files::check_read_count(submission.reads.len())?;
            let st = self.state();
            st.timelines
                .check(submission.wait.iter().chain([&submission.signal]))?;
            let reads = st
                .files
                .resolve(&submission.reads, |id| st.objects.buffer(id))?;
            self.accept(
                st,
                Lane::Reads,
                Work::Reads(reads),
                &submission.wait,
                submission.signal,
            )
        })
    }
}
