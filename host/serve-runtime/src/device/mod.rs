//! Devices through the HAL: selection by name, buffers that free themselves, per-model memory budgets, and
//! queued checkpoint reads ([`gather`]).
//!
//! This is the runtime's edge to the plugin ABI: the rest of the runtime speaks in [`DeviceBuffer`]s,
//! [`Dispatch`]es and timeline points, and only this module builds `abi_stable` values (`RVec`, `RSlice`,
//! `Submission`). The HAL drivers come from the plugin loader plus, when no plugin provides a CPU device,
//! the built-in driver the binary injects ([`BuiltinHal`]); the runtime links no HAL itself.
//!
//! # File reads
//!
//! A device opened through its plugin's `hal_files` (ABI 1.3; the built-in CPU HAL too) has queued file reads
//! ([`Device::files`]): `parameters.gather` then hands it the checkpoint files and queues the reads on it. A
//! device of an older plugin (or one whose plugin has no file reads) has none, which the start-up line of the
//! device says once (`no queued file reads: parameters.gather reads checkpoints on the host`); gathers for it
//! read on the host and write the bytes with `write`, and a package asking for direct I/O cannot use it.
//!
//! # Run-time bounds and released executables
//!
//! A device opened through its plugin's `hal_open` (ABI 1.5; the built-in CPU HAL too) has a control
//! ([`Device::has_control`]): [`Device::dispatch`] then submits each stage dispatch with the model's step
//! budget and the invocation's [`CancelFlag`] (`submit_bounded`), and an [`Executable`] releases its compiled
//! stage when its last holder (the model, or the specialization cache entry) drops. A device of an older plugin
//! has none, which its start-up line says (`no run-time bounds`): its dispatches run unbounded and cannot be
//! cancelled while running, and its executables live as long as the device.
//!
//! # Ownership
//!
//! A [`DeviceBuffer`] is an `Arc`-shared handle to one HAL buffer. Dropping the last handle calls `free`, which
//! the HAL contract makes safe while accepted submissions still use the buffer (they hold it until they
//! retire). Every buffer of a model is charged to that model's [`Budget`] when allocated and credited when
//! freed, so a model's parameters, workspace and cohort buffers draw from one budget, and an allocation that
//! would exceed it fails *before* reaching the device (admission).

pub mod gather;

use crate::Error;
use loom_plugin_api::abi_stable::std_types::{ROption, RSlice, RStr, RVec};
use loom_plugin_api::{
    BufferId, CancelId, Command, DeviceInfo, DispatchBounds, FileId, FileInfo, FileOpenFlags,
    FileReadSubmission, HalControlBox, HalDeviceBox, HalDeviceParts, HalDeviceWithFiles,
    HalDriverBox, HalFilesBox, Submission, WaitStatus,
};
/// Plain-data handles the runtime uses as they are (`repr(C)` integers, no ABI containers).
pub use loom_plugin_api::{ExecutableId, TimelineId, TimelinePoint};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A device name from a deployment: `cpu`, `vulkan:0`, `cuda:1`. Returns (backend, index).
pub fn parse_device_name(s: &str) -> Result<(String, u32), String> {
    let (backend, index) = match s.split_once(':') {
        Some((b, i)) => (
            b,
            i.parse::<u32>()
                .map_err(|_| format!("device {s:?}: the index after `:` must be a number"))?,
        ),
        None => (s, 0),
    };
    if backend.is_empty()
        || !backend
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    {
        return Err(format!(
            "device {s:?}: expected a backend name such as `cpu`, `vulkan:0` or `cuda:0`"
        ));
    }
    Ok((backend.to_string(), index))
}

/// An open device.
pub struct Device {
    /// `cpu:0`, `vulkan:0`, ...
    pub name: String,
    pub info: DeviceInfo,
    /// The plugin that provides it (`cpu-0001`, or `builtin cpu-0001`).
    pub plugin: String,
    hal: HalDeviceBox,
    files: Option<HalFilesBox>,
    control: Option<HalControlBox>,
    /// Ids of the live [`CancelFlag`]s (for [`Device::cancel_all`]).
    flags: std::sync::Mutex<std::collections::HashSet<u64>>,
    allocated: AtomicU64,
    /// What the models placed here may use in all: the device's reported memory, or for a CPU device that
    /// reports none the host's physical memory; 0 when unknown (no device-level admission).
    pub capacity: u64,
    /// Each placed model's `memory.device_bytes` (reservation id, owner, bytes).
    reservations: std::sync::Mutex<Vec<(u64, String, u64)>>,
    next_reservation: AtomicU64,
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device")
            .field("name", &self.name)
            .field("plugin", &self.plugin)
            .finish_non_exhaustive()
    }
}

fn dev_err(what: &str, e: impl fmt::Display) -> Error {
    Error::Device(format!("{what}: {e}"))
}

impl Device {
    pub fn new(name: String, info: DeviceInfo, plugin: String, hal: HalDeviceBox) -> Device {
        Device::with_files(name, info, plugin, hal, None)
    }

    /// A device with its queued file reads (`None`: the host reads files for it).
    pub fn with_files(
        name: String,
        info: DeviceInfo,
        plugin: String,
        hal: HalDeviceBox,
        files: Option<HalFilesBox>,
    ) -> Device {
        Device::with_parts(name, info, plugin, hal, files, None)
    }

    /// A device with its queued file reads and its control (ABI 1.5; `None`: unbounded dispatches).
    pub fn with_parts(
        name: String,
        info: DeviceInfo,
        plugin: String,
        hal: HalDeviceBox,
        files: Option<HalFilesBox>,
        control: Option<HalControlBox>,
    ) -> Device {
        let capacity = match info.memory_bytes {
            0 if info.backend.as_str() == "cpu" => host_memory_bytes(),
            m => m,
        };
        Device {
            name,
            info,
            plugin,
            hal,
            files,
            control,
            flags: std::sync::Mutex::new(std::collections::HashSet::new()),
            allocated: AtomicU64::new(0),
            capacity,
            reservations: std::sync::Mutex::new(Vec::new()),
            next_reservation: AtomicU64::new(0),
        }
    }

    /// Reserves `bytes` (a model's `memory.device_bytes`) for `owner` until the returned guard drops: the
    /// sum of every placed model's limit stays within [`Device::capacity`] (when known), so one model's
    /// budget cannot be promised memory another model was promised. Refused with an error naming the field,
    /// the device and the models holding it.
    pub fn reserve(self: &Arc<Device>, owner: &str, bytes: u64) -> Result<Reservation, Error> {
        let mut r = self.reservations.lock().unwrap_or_else(|e| e.into_inner());
        self.check_fits(&r, None, owner, bytes)?;
        let id = self.next_reservation.fetch_add(1, Ordering::Relaxed);
        r.push((id, owner.to_string(), bytes));
        Ok(Reservation {
            device: self.clone(),
            id,
        })
    }

    /// Refuses `bytes` for `owner` when the reservations in `r` other than `except` leave too little of the
    /// device's capacity (the message names the field, the device and the models holding it).
    fn check_fits(
        &self,
        r: &[(u64, String, u64)],
        except: Option<u64>,
        owner: &str,
        bytes: u64,
    ) -> Result<(), Error> {
        let others = || r.iter().filter(|x| Some(x.0) != except);
        let held: u64 = others().map(|x| x.2).sum();
        if self.capacity == 0 || held.saturating_add(bytes) <= self.capacity {
            return Ok(());
        }
        let holders: Vec<String> = others().map(|(_, o, b)| format!("`{o}` {b}")).collect();
        Err(Error::DeviceFull(format!(
            "model `{owner}`: memory.device_bytes asks {bytes} bytes of device {}, which has {held} of {} \
             bytes reserved by {} models placed on it ({})",
            self.name,
            self.capacity,
            if except.is_some() { "the other" } else { "the" },
            if holders.is_empty() {
                "none".to_string()
            } else {
                holders.join(", ")
            }
        )))
    }

    /// Sets reservation `id`'s bytes to `bytes`. Shrinking always succeeds; growing is refused like
    /// [`Device::reserve`] when the other models' reservations leave too little (the message names them).
    fn resize(&self, id: u64, owner: &str, bytes: u64) -> Result<(), Error> {
        let mut r = self.reservations.lock().unwrap_or_else(|e| e.into_inner());
        let mine = r.iter().find(|x| x.0 == id).map_or(0, |x| x.2);
        if bytes > mine {
            self.check_fits(&r, Some(id), owner, bytes)?;
        }
        if let Some(x) = r.iter_mut().find(|x| x.0 == id) {
            x.2 = bytes;
        }
        Ok(())
    }

    /// The bytes reserved by placed models.
    pub fn reserved(&self) -> u64 {
        let r = self.reservations.lock().unwrap_or_else(|e| e.into_inner());
        r.iter().map(|x| x.2).sum()
    }

    /// Whether the device bounds and cancels dispatches and releases executables (ABI 1.5 `HalControl`).
    pub fn has_control(&self) -> bool {
        self.control.is_some()
    }

    /// A new cancellation flag for dispatches on this device (`None` when the device has no control: its
    /// dispatches cannot be stopped while they run).
    pub fn cancel_flag(self: &Arc<Self>) -> Result<Option<Arc<CancelFlag>>, Error> {
        let Some(c) = &self.control else {
            return Ok(None);
        };
        let id = c
            .cancel_create()
            .into_result()
            .map_err(|e| dev_err("cancel_create", e))?;
        self.flags
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.0);
        Ok(Some(Arc::new(CancelFlag {
            dev: self.clone(),
            id,
            set: std::sync::atomic::AtomicBool::new(false),
        })))
    }

    /// Sets every live cancellation flag of this device: what is running stops at its next program instance or
    /// loop iteration (the drain deadline uses it). Returns how many flags were set.
    pub fn cancel_all(&self) -> usize {
        let Some(c) = &self.control else { return 0 };
        let ids: Vec<u64> = self
            .flags
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .copied()
            .collect();
        for &id in &ids {
            let _ = c.cancel_signal(CancelId(id));
        }
        ids.len()
    }

    /// Whether the device queues file reads (ABI 1.3 `HalFiles`).
    pub fn has_file_reads(&self) -> bool {
        self.files.is_some()
    }

    fn files(&self) -> Result<&HalFilesBox, Error> {
        self.files.as_ref().ok_or_else(|| {
            Error::Device(format!(
                "device {} (plugin {}) cannot queue file reads",
                self.name, self.plugin
            ))
        })
    }

    /// Hands the device the host's open file `fd` (`path` for messages).
    pub fn file_open(&self, fd: i32, path: &str, direct: bool) -> Result<FileInfo, Error> {
        let flags = if direct {
            FileOpenFlags::DIRECT
        } else {
            FileOpenFlags::BUFFERED
        };
        self.files()?
            .file_open(fd, RStr::from_str(path), flags)
            .into_result()
            .map_err(|e| dev_err("file_open", e))
    }

    pub fn file_close(&self, file: FileId) -> Result<(), Error> {
        self.files()?
            .file_close(file)
            .into_result()
            .map_err(|e| dev_err("file_close", e))
    }

    pub fn submit_reads(&self, s: FileReadSubmission) -> Result<(), Error> {
        self.files()?
            .submit_reads(s)
            .into_result()
            .map_err(|e| dev_err("submit_reads", e))
    }

    /// Bytes currently allocated on this device by the server.
    pub fn allocated(&self) -> u64 {
        self.allocated.load(Ordering::Relaxed)
    }

    /// Allocates a zero-filled buffer charged to `budget`.
    pub fn alloc(
        self: &Arc<Self>,
        bytes: u64,
        budget: &Arc<Budget>,
    ) -> Result<DeviceBuffer, Error> {
        budget.charge(bytes)?;
        let bytes_alloc = bytes.max(1);
        match self.hal.alloc(bytes_alloc).into_result() {
            Ok(id) => {
                self.allocated.fetch_add(bytes, Ordering::Relaxed);
                Ok(DeviceBuffer(Arc::new(BufInner {
                    dev: self.clone(),
                    id,
                    bytes,
                    budget: budget.clone(),
                })))
            }
            Err(e) => {
                budget.credit(bytes);
                Err(dev_err("alloc", e))
            }
        }
    }

    pub fn write(&self, buf: &DeviceBuffer, offset: u64, data: &[u8]) -> Result<(), Error> {
        self.hal
            .write(buf.id(), offset, RSlice::from_slice(data))
            .into_result()
            .map_err(|e| dev_err("write", e))
    }

    pub fn read(&self, buf: &DeviceBuffer, offset: u64, len: u64) -> Result<Vec<u8>, Error> {
        self.hal
            .read(buf.id(), offset, len)
            .into_result()
            .map(|v| v.into_vec())
            .map_err(|e| dev_err("read", e))
    }

    /// Compiles an encoded stage; the [`Executable`] releases it when dropped (devices with a control).
    pub fn compile(self: &Arc<Self>, encoded_stage: &[u8]) -> Result<Executable, Error> {
        let id = self
            .hal
            .compile(RSlice::from_slice(encoded_stage))
            .into_result()
            .map_err(|e| dev_err("compile", e))?;
        Ok(Executable {
            dev: self.clone(),
            id,
        })
    }

    /// Enqueues one stage dispatch that waits for `wait` and signals `signal`, within `bounds` when the
    /// device has a control. The device holds the buffers until the submission retires, so the caller may
    /// drop its handles at once.
    pub fn dispatch(
        &self,
        d: &Dispatch<'_>,
        wait: &[TimelinePoint],
        signal: TimelinePoint,
        bounds: &Bounds<'_>,
    ) -> Result<(), Error> {
        let ids =
            |b: &[DeviceBuffer]| -> RVec<BufferId> { b.iter().map(DeviceBuffer::id).collect() };
        let cmd = Command::Dispatch {
            exe: d.exe,
            inputs: ids(d.inputs),
            params: ids(d.params),
            outputs: ids(d.outputs),
            workspace: ids(d.workspace),
        };
        let submission = Submission {
            commands: RVec::from(vec![cmd]),
            wait: RVec::from(wait.to_vec()),
            signal,
        };
        match &self.control {
            Some(c) => c
                .submit_bounded(
                    submission,
                    DispatchBounds {
                        steps: bounds.steps,
                        cancel: bounds.cancel.map_or(CancelId(0), |f| f.id),
                    },
                )
                .into_result()
                .map_err(|e| dev_err("submit", e)),
            None => self
                .hal
                .submit(submission)
                .into_result()
                .map_err(|e| dev_err("submit", e)),
        }
    }

    pub fn timeline(&self) -> Result<TimelineId, Error> {
        self.hal
            .timeline_create()
            .into_result()
            .map_err(|e| dev_err("timeline", e))
    }

    pub fn signal(&self, point: TimelinePoint) -> Result<(), Error> {
        self.hal
            .timeline_signal(point)
            .into_result()
            .map_err(|e| dev_err("signal", e))
    }

    /// Fails `point` with `message` (host-side work it stands for failed), so that every wait and submission
    /// depending on it fails with that message. `Ok(false)` on a device without a control (a plugin built
    /// before ABI 1.5): the point is then signalled, and only the caller's own record carries the failure.
    pub fn fail(&self, point: TimelinePoint, message: &str) -> Result<bool, Error> {
        match &self.control {
            Some(c) => c
                .timeline_fail(point, message.into())
                .into_result()
                .map(|()| true)
                .map_err(|e| dev_err("timeline_fail", e)),
            None => self.signal(point).map(|()| false),
        }
    }

    /// Waits for `point`; a failed point is `Err` with the failure's text (e.g. a kernel's checked-load error).
    pub fn wait(&self, point: TimelinePoint, timeout_ns: u64) -> Result<bool, String> {
        match self.hal.timeline_wait(point, timeout_ns).into_result() {
            Ok(WaitStatus::Reached) => Ok(true),
            Ok(WaitStatus::TimedOut) => Ok(false),
            Err(e) => Err(e.to_string()),
        }
    }

    fn free(&self, id: BufferId, bytes: u64) {
        if let Err(e) = self.hal.free(id).into_result() {
            log::warn!("device {}: free of buffer {}: {e}", self.name, id.0);
        }
        self.allocated.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// The run-time bounds of a dispatch ([`Device::dispatch`]): the step budget (0: none) and the flag.
#[derive(Debug, Clone, Copy, Default)]
pub struct Bounds<'a> {
    pub steps: u64,
    pub cancel: Option<&'a CancelFlag>,
}

/// A compiled stage on one device; released (its code freed once no queued submission uses it) when dropped,
/// on devices with a control.
pub struct Executable {
    dev: Arc<Device>,
    id: ExecutableId,
}

impl Executable {
    pub fn id(&self) -> ExecutableId {
        self.id
    }
}

impl fmt::Debug for Executable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Executable({} on {})", self.id.0, self.dev.name)
    }
}

impl Drop for Executable {
    fn drop(&mut self) {
        if let Some(c) = &self.dev.control {
            if let Err(e) = c.release(self.id).into_result() {
                log::warn!(
                    "device {}: release of executable {}: {e}",
                    self.dev.name,
                    self.id.0
                );
            }
        }
    }
}

/// A cancellation flag of one device ([`Device::cancel_flag`]): dispatches submitted with it stop when it is
/// [`signal`](CancelFlag::signal)led. Destroyed when dropped (queued submissions keep it until they retire).
pub struct CancelFlag {
    dev: Arc<Device>,
    id: CancelId,
    set: std::sync::atomic::AtomicBool,
}

impl CancelFlag {
    /// Stops the dispatches carrying this flag (idempotent).
    pub fn signal(&self) {
        if self.set.swap(true, Ordering::Relaxed) {
            return;
        }
        if let Some(c) = &self.dev.control {
            if let Err(e) = c.cancel_signal(self.id).into_result() {
                log::warn!("device {}: cancel: {e}", self.dev.name);
            }
        }
    }

    /// Whether [`signal`](CancelFlag::signal) was called.
    pub fn is_set(&self) -> bool {
        self.set.load(Ordering::Relaxed)
    }
}

impl fmt::Debug for CancelFlag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CancelFlag({} on {})", self.id.0, self.dev.name)
    }
}

impl Drop for CancelFlag {
    fn drop(&mut self) {
        self.dev
            .flags
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id.0);
        if let Some(c) = &self.dev.control {
            let _ = c.cancel_destroy(self.id);
        }
    }
}

/// The host's physical memory (`MemTotal` of `/proc/meminfo`), 0 when it cannot be read.
fn host_memory_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kib| kib.saturating_mul(1024))
}

/// A model's share of a device's capacity ([`Device::reserve`]); released when dropped (the model is gone).
pub struct Reservation {
    device: Arc<Device>,
    id: u64,
}

impl fmt::Debug for Reservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Reservation({} on {})", self.id, self.device.name)
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut r = self
            .device
            .reservations
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        r.retain(|x| x.0 != self.id);
    }
}

/// A model's device-memory budget: a limit on the bytes it holds, and (when placed on a device) a reservation
/// of that much of the device's capacity. The reservation is elastic: [`Budget::trim`] shrinks it to what the
/// model still holds (a deactivated model gives its share back for other models to be placed in), and
/// [`Budget::restore`] takes the whole limit again before the model is activated.
#[derive(Debug)]
pub struct Budget {
    pub owner: String,
    pub limit: u64,
    used: AtomicU64,
    /// The budget's reservation of device capacity, when it has one.
    reservation: Option<Reservation>,
    /// Whether the reservation holds the whole limit (false while trimmed).
    whole: std::sync::atomic::AtomicBool,
}

impl Budget {
    /// A budget that is not counted against any device's capacity (tests, tools).
    pub fn new(owner: &str, limit: u64) -> Arc<Budget> {
        Arc::new(Budget {
            owner: owner.to_string(),
            limit,
            used: AtomicU64::new(0),
            reservation: None,
            whole: std::sync::atomic::AtomicBool::new(true),
        })
    }

    /// A budget of `limit` bytes reserved on `device` for as long as the budget lives.
    pub fn reserved(device: &Arc<Device>, owner: &str, limit: u64) -> Result<Arc<Budget>, Error> {
        let reservation = device.reserve(owner, limit)?;
        Ok(Arc::new(Budget {
            owner: owner.to_string(),
            limit,
            used: AtomicU64::new(0),
            reservation: Some(reservation),
            whole: std::sync::atomic::AtomicBool::new(true),
        }))
    }

    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Shrinks the reservation to the bytes the model holds now (its parameters and pools released, at
    /// deactivation): the rest of its share of the device is free for other models until [`Budget::restore`].
    /// Allocations are refused while trimmed. Returns the bytes the reservation holds afterwards.
    pub fn trim(&self) -> u64 {
        let Some(r) = &self.reservation else {
            return 0;
        };
        self.whole.store(false, Ordering::SeqCst);
        let held = self.used().min(self.limit);
        // Shrinking cannot fail.
        let _ = r.device.resize(r.id, &self.owner, held);
        held
    }

    /// Takes the budget's whole limit of device capacity again (before an activation); refused with
    /// [`Error::DeviceFull`] naming the models that hold the device's capacity meanwhile.
    pub fn restore(&self) -> Result<(), Error> {
        if let Some(r) = &self.reservation {
            r.device.resize(r.id, &self.owner, self.limit)?;
        }
        self.whole.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// The device bytes the budget reserves now (its limit, or what it held when trimmed).
    pub fn reserved_bytes(&self) -> u64 {
        match &self.reservation {
            None => 0,
            Some(r) => {
                let list = r
                    .device
                    .reservations
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                list.iter().find(|x| x.0 == r.id).map_or(0, |x| x.2)
            }
        }
    }

    fn charge(&self, bytes: u64) -> Result<(), Error> {
        if !self.whole.load(Ordering::SeqCst) {
            return Err(Error::Overloaded(format!(
                "model `{}`: allocating {bytes} device bytes while deactivated (its reservation is trimmed)",
                self.owner
            )));
        }
        let mut cur = self.used.load(Ordering::Relaxed);
        loop {
            let next = cur.checked_add(bytes).filter(|&n| n <= self.limit).ok_or_else(|| {
                Error::Overloaded(format!(
                    "model `{}`: allocating {bytes} device bytes would exceed its memory budget of {} \
                     ({cur} in use)",
                    self.owner, self.limit
                ))
            })?;
            match self
                .used
                .compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Ok(()),
                Err(c) => cur = c,
            }
        }
    }

    fn credit(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::Relaxed);
    }
}

struct BufInner {
    dev: Arc<Device>,
    id: BufferId,
    bytes: u64,
    budget: Arc<Budget>,
}

impl Drop for BufInner {
    fn drop(&mut self) {
        self.dev.free(self.id, self.bytes);
        self.budget.credit(self.bytes);
    }
}

/// A shared handle to one device buffer; the last clone frees it.
#[derive(Clone)]
pub struct DeviceBuffer(Arc<BufInner>);

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "DeviceBuffer({} on {}, {} bytes)",
            self.0.id.0, self.0.dev.name, self.0.bytes
        )
    }
}

impl DeviceBuffer {
    pub fn id(&self) -> BufferId {
        self.0.id
    }
    pub fn bytes(&self) -> u64 {
        self.0.bytes
    }
    pub fn device(&self) -> &Arc<Device> {
        &self.0.dev
    }
    /// How many handles share this buffer (submissions hold their own inside the HAL).
    pub fn holders(&self) -> usize {
        Arc::strong_count(&self.0)
    }
}

/// One stage dispatch in the runtime's terms ([`Device::dispatch`] turns it into the HAL's command).
#[derive(Debug)]
pub struct Dispatch<'a> {
    pub exe: ExecutableId,
    pub inputs: &'a [DeviceBuffer],
    pub params: &'a [DeviceBuffer],
    pub outputs: &'a [DeviceBuffer],
    pub workspace: &'a [DeviceBuffer],
}

/// A HAL driver linked into the binary, opened when no plugin provides a device of its backend (the server
/// binary injects the CPU driver this way).
pub struct BuiltinHal {
    /// The plugin id it would have as a plugin (`cpu-0001`).
    pub id: String,
    /// Its backend (`cpu`).
    pub backend: String,
    pub driver: HalDriverBox,
    /// Opens device `i` with its queued file reads.
    pub open_with_files: fn(u32) -> Result<HalDeviceWithFiles, String>,
    /// Opens device `i` with its queued file reads and its control (ABI 1.5), when the HAL has one.
    pub open_parts: Option<fn(u32) -> Result<HalDeviceParts, String>>,
}

impl fmt::Debug for BuiltinHal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BuiltinHal")
            .field("id", &self.id)
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

/// A 1.3 device with its file reads, as the parts of a 1.5 one (no control).
fn parts_of(d: HalDeviceWithFiles) -> HalDeviceParts {
    HalDeviceParts {
        device: d.device,
        files: d.files,
        control: ROption::RNone,
    }
}

/// The devices this server can place models on.
#[derive(Debug, Default)]
pub struct Devices {
    pub devices: Vec<Arc<Device>>,
}

impl Devices {
    /// Opens every device of every HAL plugin in `plugins`, plus each of `builtins` whose backend no plugin
    /// provides. Problems are returned as log lines; a broken plugin never stops the others.
    pub fn open(
        plugins: &[loom_plugins::LoadedPlugin],
        builtins: &[BuiltinHal],
    ) -> (Devices, Vec<String>) {
        let mut out = Devices::default();
        let mut notes = Vec::new();
        for p in plugins {
            if p.kind != loom_plugin_api::PluginKind::HAL {
                continue;
            }
            match p.hal() {
                Ok(driver) => {
                    let with_files = |i: u32| -> Result<HalDeviceParts, String> {
                        if let Some(r) = p.hal_open(i) {
                            return r.map_err(|e| e.to_string());
                        }
                        match p.hal_files(i) {
                            Some(r) => r.map(parts_of).map_err(|e| e.to_string()),
                            None => Err(format!(
                                "plugin built against ABI {}.{}, before 1.3",
                                p.abi.0, p.abi.1
                            )),
                        }
                    };
                    out.open_driver(&driver, &p.id, &with_files, &mut notes)
                }
                Err(e) => notes.push(format!("{}: {e}", p.path.display())),
            }
        }
        for b in builtins {
            if !out
                .devices
                .iter()
                .any(|d| d.info.backend.as_str() == b.backend)
            {
                let open = |i: u32| match b.open_parts {
                    Some(f) => f(i),
                    None => (b.open_with_files)(i).map(parts_of),
                };
                out.open_driver(&b.driver, &format!("builtin {}", b.id), &open, &mut notes);
            }
        }
        (out, notes)
    }

    /// Opens every device of `driver`, each through `with_files` (its file reads) when that works, else
    /// through the driver alone (the host then reads files for it; the device's line says why).
    fn open_driver(
        &mut self,
        driver: &HalDriverBox,
        plugin: &str,
        with_files: &dyn Fn(u32) -> Result<HalDeviceParts, String>,
        notes: &mut Vec<String>,
    ) {
        for (i, info) in driver.devices().into_iter().enumerate() {
            let backend = info.backend.to_string();
            let index = self
                .devices
                .iter()
                .filter(|d| d.info.backend.as_str() == backend)
                .count();
            let opened = match with_files(i as u32) {
                Ok(HalDeviceParts {
                    device,
                    files,
                    control,
                }) => {
                    let files = files.into_option();
                    let why = if files.is_some() {
                        String::new()
                    } else {
                        "the device has none".to_string()
                    };
                    Ok((device, files, control.into_option(), why))
                }
                Err(why) => driver
                    .open(i as u32)
                    .into_result()
                    .map(|hal| (hal, None, None, why)),
            };
            match opened {
                Ok((hal, files, control, why)) => {
                    let name = format!("{backend}:{index}");
                    let reads = if files.is_some() {
                        "queued file reads".to_string()
                    } else {
                        format!(
                            "no queued file reads ({why}): parameters.gather reads checkpoints on the host"
                        )
                    };
                    let bounds = if control.is_some() {
                        "run-time bounds"
                    } else {
                        "no run-time bounds (a plugin before ABI 1.5): kernel step budgets and \
                         cancellation do not apply, compiled stages are kept until the device closes"
                    };
                    notes.push(format!(
                        "device {name}: {} (plugin {plugin}; {reads}; {bounds})",
                        info.name
                    ));
                    self.devices.push(Arc::new(Device::with_parts(
                        name,
                        info,
                        plugin.to_string(),
                        hal,
                        files,
                        control,
                    )));
                }
                Err(e) => notes.push(format!("plugin {plugin}: cannot open device {i}: {e}")),
            }
        }
    }

    /// Sets every live cancellation flag of every device ([`Device::cancel_all`]); how many were set.
    pub fn cancel_all(&self) -> usize {
        self.devices.iter().map(|d| d.cancel_all()).sum()
    }

    /// The first device of `preferences` that is present, or an error naming what is present.
    pub fn select(&self, preferences: &[String]) -> Result<Arc<Device>, Error> {
        for (i, p) in preferences.iter().enumerate() {
            let (backend, index) = parse_device_name(p).map_err(Error::BadRequest)?;
            if let Some(d) = self
                .devices
                .iter()
                .filter(|d| d.info.backend.as_str() == backend)
                .nth(index as usize)
            {
                if i > 0 {
                    // A preference list fell back: say which choices were absent (an operator expecting a GPU
                    // should see it in the log, not only in throughput).
                    log::warn!(
                        "device preference {:?}: {} absent, using {}",
                        preferences,
                        preferences[..i].join(", "),
                        d.name
                    );
                }
                return Ok(d.clone());
            }
        }
        let present: Vec<&str> = self.devices.iter().map(|d| d.name.as_str()).collect();
        Err(Error::DeviceAbsent(format!(
            "none of the chosen devices {preferences:?} is present on this server (present: {present:?})"
        )))
    }
}
