//! The Vulkan HAL plugin (`vulkan-0001`): the HAL of `loom-plugin-api` on wgpu's Vulkan backend, with stages
//! lowered to WGSL by `loom-emit`.
//!
//! * **Devices** are wgpu's Vulkan adapters (lavapipe's `llvmpipe` included). A device is opened with the
//!   limits of a [`LimitsProfile`] — wgpu's defaults, or `Limits::downlevel_defaults()` — never the adapter's, and
//!   WGSL is emitted against those same requested limits, so what compiles on one machine compiles on every
//!   machine that grants them. The cdylib reads the profile from `LOOM_VULKAN_LIMITS` (`default`, `downlevel`).
//! * **Buffers** are storage buffers rounded up to whole 4-byte words (zero-filled by wgpu). `write` goes through
//!   `Queue::write_buffer` and `read` through a mapped staging copy; both finish before they return. Unaligned
//!   edges are read-modify-written, so any byte range works.
//! * **`compile`** decodes the stage (`loom_ir::kernel_codec`), plans it with `loom_emit::wgsl_stage` (one module
//!   per kernel, the workspace as one arena) and creates one compute pipeline per kernel with an explicit
//!   layout (every binding `read_write` storage). What WGSL cannot express (f64, too many parameters for the
//!   limits, ...) is a clear compile error naming the kernel and the backend.
//! * **`submit`** queues the commands on the device's queue thread (`hal-queue`: in order, waits first, a
//!   failure fails the signal point and every dependent point with the same text). Copies and fills are
//!   recorded into one command encoder; a dispatch records every kernel of the stage (one compute pass each),
//!   then the submission is flushed and the per-dispatch **status words** of the emitter are read back: a
//!   checked-load error becomes `ExecError::IndexOutOfRange` with the text `hal-cpu` and `loom-reference` give.
//!   Commands after a failed dispatch do not run.
//! * wgpu validation and out-of-memory errors are caught with error scopes and become errors of the call (or of
//!   the submission); nothing is left to wgpu's default handler, which panics.
//! * Every exported function runs under `catch_unwind` (`loom_plugin_api::guard`).
//! * **Queued file reads** (ABI 1.3, `loom_plugin_api::HalFiles`, from the root's `hal_files` or
//!   [`open_with_files`]): opening and the checks are `hal_queue::files`, shared with `hal-cpu` (the host's
//!   descriptor reopened through `/proc/self/fd`, `O_DIRECT` for a direct file and an error where the file
//!   system refuses it; a direct read needs 4096-byte aligned file offset, length and destination offset and
//!   never falls back to a buffered read). A read submission runs on the device's **transfer queue** (a
//!   `hal_queue` sibling: its own thread, the same timelines, ordered against dispatches, copies and fills only
//!   by points): positional `read_exact_at` into host memory 8 MiB at a time, `Queue::write_buffer` into the
//!   destination, and the signal point advances once the device has the bytes.
//!
//! The crate is both a `cdylib` (the plugin) and an `rlib` ([`driver`], [`driver_with`], [`open_with_files`]).

use std::collections::HashMap;
use std::num::NonZeroU64;
use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use std::time::Duration;

use abi_stable::export_root_module;
use abi_stable::prefix_type::PrefixTypeTrait;
use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{RBoxError, ROption, RResult, RSlice, RStr, RString, RVec};
use hal_queue::files::{self, OpenFile};
use hal_queue::{Queue, lock};
use loom_emit::{WgslBuffer, WgslLimits, WgslStage};
use loom_ir::kernel::{BufRef, ExecError, Stage, check_buffer_count, check_buffer_size};
use loom_ir::kernel_codec;
use loom_plugin_api::{
    ABI_MAJOR, ABI_MINOR, BufferId, Command, DeviceInfo, DeviceLimits, ExecutableId, FileId,
    FileInfo, FileOpenFlags, FileReadSubmission, HalDevice, HalDevice_TO, HalDeviceBox,
    HalDeviceWithFiles, HalDriver, HalDriver_TO, HalDriverBox, HalFiles, HalFiles_TO, LoomPlugin,
    LoomPlugin_Ref, PluginKind, Probe, Submission, TimelineId, TimelinePoint, WaitStatus, guard,
    guard_probe,
};

/// This plugin's id.
pub const PLUGIN_ID: &str = "vulkan-0001";

/// Bytes between two dispatches' status words in the status buffer (wgpu's storage offset alignment).
const STATUS_STRIDE: u64 = 256;
/// Bytes of one dispatch's status words (8 x u32, see `loom-emit`).
const STATUS_BYTES: u64 = 32;
/// How long a staging map may take before the device is considered lost.
const MAP_TIMEOUT: Duration = Duration::from_secs(120);
/// Bytes of a file read staged in host memory and written to the device at a time.
const FILE_CHUNK: usize = 8 << 20;

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
    }
    .leak_into_prefix()
}

extern "C" fn probe() -> Probe {
    guard_probe(probe_adapters)
}

extern "C" fn hal() -> RResult<HalDriverBox, RBoxError> {
    guard("hal-vulkan driver", || {
        Ok::<_, String>(driver_with(LimitsProfile::from_env()?))
    })
}

extern "C" fn hal_files(index: u32) -> RResult<HalDeviceWithFiles, RBoxError> {
    guard("hal-vulkan open with files", || {
        open_with_files(index, LimitsProfile::from_env()?)
    })
}

/// Opens vulkan device `index` with `profile`'s limits together with its queued file reads (what the plugin's
/// `hal_files` returns, with the profile of `LOOM_VULKAN_LIMITS`).
pub fn open_with_files(index: u32, profile: LimitsProfile) -> Result<HalDeviceWithFiles, String> {
    let instance = instance();
    let ads = adapters(&instance);
    let dev = open_adapter(&ads, index, profile)?;
    Ok(HalDeviceWithFiles {
        device: HalDevice_TO::from_value(dev.clone(), TD_Opaque),
        files: ROption::RSome(HalFiles_TO::from_value(dev, TD_Opaque)),
    })
}

fn open_adapter(
    adapters: &[wgpu::Adapter],
    index: u32,
    profile: LimitsProfile,
) -> Result<VkDevice, String> {
    let adapter = adapters.get(index as usize).ok_or_else(|| {
        if adapters.is_empty() {
            format!("no vulkan device {index}: {NO_ADAPTER}")
        } else {
            format!("no vulkan device {index} (there are {})", adapters.len())
        }
    })?;
    VkDevice::open(adapter, profile)
}

/// Which limits a device is opened with (and WGSL compiled against).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LimitsProfile {
    /// `wgpu::Limits::default()` (WebGPU's defaults: 8 storage buffers per stage, 16 KiB workgroup memory,
    /// 128 MiB per binding, 256 MiB per buffer).
    #[default]
    Default,
    /// `wgpu::Limits::downlevel_defaults()` (4 storage buffers per stage, 16352 bytes of workgroup memory).
    Downlevel,
}

impl LimitsProfile {
    /// The profile named by `LOOM_VULKAN_LIMITS` (`default` when unset).
    pub fn from_env() -> Result<LimitsProfile, String> {
        match std::env::var("LOOM_VULKAN_LIMITS").as_deref() {
            Err(_) | Ok("") | Ok("default") => Ok(LimitsProfile::Default),
            Ok("downlevel") => Ok(LimitsProfile::Downlevel),
            Ok(other) => Err(format!(
                "LOOM_VULKAN_LIMITS={other:?}: expected `default` or `downlevel`"
            )),
        }
    }

    /// The wgpu limits requested for a device.
    pub fn limits(self) -> wgpu::Limits {
        match self {
            LimitsProfile::Default => wgpu::Limits::default(),
            LimitsProfile::Downlevel => wgpu::Limits::downlevel_defaults(),
        }
    }
}

/// The emitter's limits from the requested device limits.
pub fn wgsl_limits(l: &wgpu::Limits) -> WgslLimits {
    WgslLimits {
        max_storage_buffers_per_shader_stage: l.max_storage_buffers_per_shader_stage,
        max_compute_workgroup_storage_size: l.max_compute_workgroup_storage_size,
        max_compute_invocations_per_workgroup: l.max_compute_invocations_per_workgroup,
        max_compute_workgroup_size_x: l.max_compute_workgroup_size_x,
        max_compute_workgroups_per_dimension: l.max_compute_workgroups_per_dimension,
        max_storage_buffer_binding_size: l.max_storage_buffer_binding_size,
    }
}

fn instance() -> wgpu::Instance {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = wgpu::Backends::VULKAN;
    wgpu::Instance::new(desc)
}

fn adapters(instance: &wgpu::Instance) -> Vec<wgpu::Adapter> {
    pollster::block_on(instance.enumerate_adapters(wgpu::Backends::VULKAN))
}

fn adapter_name(a: &wgpu::Adapter) -> String {
    let i = a.get_info();
    format!("{} ({:?}, {})", i.name, i.device_type, i.driver)
}

const NO_ADAPTER: &str = "no Vulkan adapter found (needs the Vulkan loader libvulkan.so.1 and a driver, e.g. \
                          Debian's libvulkan1 and mesa-vulkan-drivers for lavapipe)";

fn probe_adapters() -> Probe {
    let ads = adapters(&instance());
    if ads.is_empty() {
        return Probe::absent(NO_ADAPTER);
    }
    let names: Vec<String> = ads.iter().map(adapter_name).collect();
    Probe::available(ads.len() as u32, names.join("; "))
}

/// The Vulkan driver with the limits of `LOOM_VULKAN_LIMITS` (wgpu's defaults when unset); an unknown value
/// falls back to the defaults.
pub fn driver() -> HalDriverBox {
    driver_with(LimitsProfile::from_env().unwrap_or_default())
}

/// The Vulkan driver opening devices with `profile`'s limits.
pub fn driver_with(profile: LimitsProfile) -> HalDriverBox {
    let instance = instance();
    let adapters = adapters(&instance);
    HalDriver_TO::from_value(
        VkDriver {
            _instance: instance,
            adapters,
            profile,
        },
        TD_Opaque,
    )
}

#[derive(Debug)]
struct VkDriver {
    _instance: wgpu::Instance,
    adapters: Vec<wgpu::Adapter>,
    profile: LimitsProfile,
}

impl HalDriver for VkDriver {
    fn devices(&self) -> RVec<DeviceInfo> {
        let r = guard("devices", || {
            Ok::<_, String>(
                self.adapters
                    .iter()
                    .map(|a| DeviceInfo {
                        name: RString::from(adapter_name(a)),
                        backend: RString::from("vulkan"),
                        memory_bytes: 0,
                    })
                    .collect::<RVec<_>>(),
            )
        });
        r.into_result().unwrap_or_default()
    }

    fn open(&self, index: u32) -> RResult<HalDeviceBox, RBoxError> {
        guard("open", || {
            let dev = open_adapter(&self.adapters, index, self.profile)?;
            Ok::<_, String>(HalDevice_TO::from_value(dev, TD_Opaque))
        })
    }
}

// ---- the wgpu device ----------------------------------------------------------------------------------------

#[derive(Debug)]
struct Gpu {
    device: wgpu::Device,
    queue: wgpu::Queue,
    limits: wgpu::Limits,
}

#[derive(Debug)]
struct VkBuf {
    buffer: wgpu::Buffer,
    /// The buffer's size as allocated by the host (the wgpu buffer is rounded up to whole words).
    len: u64,
}

type Buf = Arc<VkBuf>;

fn range(what: &str, len: u64, offset: u64, n: u64) -> Result<(), String> {
    match offset.checked_add(n) {
        Some(end) if end <= len => Ok(()),
        _ => Err(format!(
            "{what}: bytes {offset}..{offset}+{n} are outside the buffer ({len} bytes)"
        )),
    }
}

fn aligned(x: u64) -> bool {
    x.is_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT)
}

impl Gpu {
    /// Runs `f` inside validation and out-of-memory error scopes: a wgpu error becomes `Err("{what}: ...")`.
    fn scoped<T>(&self, what: &str, f: impl FnOnce() -> T) -> Result<T, String> {
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let val = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let r = f();
        let e1 = pollster::block_on(val.pop());
        let e2 = pollster::block_on(oom.pop());
        match e1.or(e2) {
            Some(e) => Err(format!("{what}: {e}")),
            None => Ok(r),
        }
    }

    fn encoder(&self) -> wgpu::CommandEncoder {
        self.device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("loom"),
            })
    }

    fn wait(&self, index: wgpu::SubmissionIndex) -> Result<(), String> {
        self.device
            .poll(wgpu::PollType::Wait {
                submission_index: Some(index),
                timeout: None,
            })
            .map(|_| ())
            .map_err(|e| format!("vulkan: waiting for the queue: {e}"))
    }

    /// Finishes and submits `enc` and waits until the GPU has executed it.
    fn flush(&self, enc: wgpu::CommandEncoder) -> Result<(), String> {
        let idx = self.scoped("vulkan submission", || self.queue.submit([enc.finish()]))?;
        self.wait(idx)
    }

    fn create_buffer(&self, size: u64, usage: wgpu::BufferUsages) -> Result<wgpu::Buffer, String> {
        if size > self.limits.max_buffer_size {
            return Err(format!(
                "{size} bytes is over the device's max_buffer_size of {}",
                self.limits.max_buffer_size
            ));
        }
        self.scoped("vulkan buffer", || {
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size: size.max(4),
                usage,
                mapped_at_creation: false,
            })
        })
    }

    /// A `COPY_SRC` buffer holding `data` (a whole number of words).
    fn init_buffer(&self, data: &[u8]) -> Result<wgpu::Buffer, String> {
        let b = self.scoped("vulkan staging buffer", || {
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size: data.len() as u64,
                usage: wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: true,
            })
        })?;
        {
            let mut view = b
                .slice(..)
                .get_mapped_range_mut()
                .map_err(|e| format!("vulkan staging map: {e}"))?;
            view.copy_from_slice(data);
        }
        b.unmap();
        Ok(b)
    }

    /// Maps a `MAP_READ` buffer after the work that fills it was submitted, and copies `len` bytes from `at`.
    fn map_read(&self, b: &wgpu::Buffer, at: u64, len: u64) -> Result<Vec<u8>, String> {
        let (tx, rx) = mpsc::channel();
        b.slice(..).map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| format!("vulkan: waiting for a map: {e}"))?;
        rx.recv_timeout(MAP_TIMEOUT)
            .map_err(|_| "vulkan: the staging map never completed".to_string())?
            .map_err(|e| format!("vulkan: staging map failed: {e}"))?;
        let out = {
            let view = b
                .slice(..)
                .get_mapped_range()
                .map_err(|e| format!("vulkan staging view: {e}"))?;
            view[at as usize..(at + len) as usize].to_vec()
        };
        b.unmap();
        Ok(out)
    }

    /// Reads `len` bytes at `offset` (whole words are copied to a staging buffer and mapped).
    fn read(&self, b: &VkBuf, offset: u64, len: u64) -> Result<Vec<u8>, String> {
        range("read", b.len, offset, len)?;
        if len == 0 {
            return Ok(Vec::new());
        }
        let a0 = offset / 4 * 4;
        let a1 = (offset + len).div_ceil(4) * 4;
        let staging = self.create_buffer(
            a1 - a0,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        )?;
        let mut enc = self.encoder();
        enc.copy_buffer_to_buffer(&b.buffer, a0, &staging, 0, a1 - a0);
        self.flush(enc)?;
        self.map_read(&staging, offset - a0, len)
    }

    /// Writes `data` at `offset`; unaligned edge words are read first and merged.
    fn write(&self, b: &VkBuf, offset: u64, data: &[u8]) -> Result<(), String> {
        range("write", b.len, offset, data.len() as u64)?;
        if data.is_empty() {
            return Ok(());
        }
        let end = offset + data.len() as u64;
        let a0 = offset / 4 * 4;
        let a1 = end.div_ceil(4) * 4;
        let mut words = vec![0u8; (a1 - a0) as usize];
        if a0 != offset {
            let head = self.read_words(b, a0)?;
            words[..4].copy_from_slice(&head);
        }
        if a1 != end {
            let tail = self.read_words(b, a1 - 4)?;
            let n = words.len();
            words[n - 4..].copy_from_slice(&tail);
        }
        let at = (offset - a0) as usize;
        words[at..at + data.len()].copy_from_slice(data);
        let idx = self.scoped("write", || {
            self.queue.write_buffer(&b.buffer, a0, &words);
            self.queue.submit([])
        })?;
        self.wait(idx)
    }

    /// The word at `at` (a multiple of 4 inside the rounded buffer).
    fn read_words(&self, b: &VkBuf, at: u64) -> Result<[u8; 4], String> {
        let staging = self.create_buffer(
            4,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        )?;
        let mut enc = self.encoder();
        enc.copy_buffer_to_buffer(&b.buffer, at, &staging, 0, 4);
        self.flush(enc)?;
        let v = self.map_read(&staging, 0, 4)?;
        Ok([v[0], v[1], v[2], v[3]])
    }
}

// ---- executables --------------------------------------------------------------------------------------------

#[derive(Debug)]
struct Exe {
    stage: Stage,
    plan: WgslStage,
    layouts: Vec<wgpu::BindGroupLayout>,
    pipelines: Vec<wgpu::ComputePipeline>,
    /// The workspace arena (the stage's workspace buffers in the submission are only checked to exist).
    arena: wgpu::Buffer,
    /// One 32-byte status block per dispatch, [`STATUS_STRIDE`] apart.
    status: wgpu::Buffer,
}

fn compile_stage(gpu: &Gpu, stage: Stage) -> Result<Exe, String> {
    let unsupported = |message: String| {
        ExecError::Unsupported {
            kernel: stage.name.clone(),
            backend: "vulkan".into(),
            message,
        }
        .to_string()
    };
    let plan = loom_emit::wgsl_stage(&stage, &wgsl_limits(&gpu.limits))
        .map_err(|e| unsupported(e.to_string()))?;
    let mut layouts = Vec::with_capacity(plan.modules.len());
    let mut pipelines = Vec::with_capacity(plan.modules.len());
    for m in &plan.modules {
        let entries: Vec<wgpu::BindGroupLayoutEntry> = (0..m.bindings)
            .map(|binding| wgpu::BindGroupLayoutEntry {
                binding,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: wgpu::BufferBindingType::Storage { read_only: false },
                    has_dynamic_offset: false,
                    min_binding_size: None,
                },
                count: None,
            })
            .collect();
        let what = format!("vulkan pipeline for kernel `{}`", m.name);
        let (layout, pipeline) = gpu
            .scoped(&what, || {
                let layout =
                    gpu.device
                        .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                            label: None,
                            entries: &entries,
                        });
                let pl = gpu
                    .device
                    .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                        label: None,
                        bind_group_layouts: &[Some(&layout)],
                        immediate_size: 0,
                    });
                let module = gpu
                    .device
                    .create_shader_module(wgpu::ShaderModuleDescriptor {
                        label: Some(&m.name),
                        source: wgpu::ShaderSource::Wgsl(m.source.as_str().into()),
                    });
                let pipeline =
                    gpu.device
                        .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                            label: Some(&m.name),
                            layout: Some(&pl),
                            module: &module,
                            entry_point: Some(&m.entry_point),
                            compilation_options: wgpu::PipelineCompilationOptions::default(),
                            cache: None,
                        });
                (layout, pipeline)
            })
            .map_err(unsupported)?;
        layouts.push(layout);
        pipelines.push(pipeline);
    }
    let storage =
        wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
    let arena = gpu
        .create_buffer(plan.arena_bytes, storage)
        .map_err(|e| unsupported(format!("workspace arena: {e}")))?;
    let status = gpu
        .create_buffer(STATUS_STRIDE * plan.dispatches.len().max(1) as u64, storage)
        .map_err(|e| unsupported(format!("status buffer: {e}")))?;
    Ok(Exe {
        stage,
        plan,
        layouts,
        pipelines,
        arena,
        status,
    })
}

/// The kernel contract's error for the status words of dispatch `di` (`None`: no error).
fn status_error(stage: &Stage, di: usize, w: &[u32; 8]) -> Option<String> {
    if w[0] == 0 {
        return None;
    }
    let kernel = stage
        .dispatches
        .get(di)
        .and_then(|d| stage.kernels.get(d.kernel as usize));
    let name = kernel.map_or("?", |k| k.name.as_str()).to_string();
    let program_id = [u64::from(w[5]), u64::from(w[6]), u64::from(w[7])];
    let (a, b, c) = (w[2] as usize, w[3] as usize, w[4] as i32);
    Some(match w[1] {
        1 => {
            let p = kernel.and_then(|k| k.params.get(a));
            ExecError::IndexOutOfRange {
                kernel: name,
                param: p.map_or_else(|| format!("#{a}"), |p| p.name.clone()),
                index: i64::from(c),
                dim: b,
                extent: p.and_then(|p| p.shape.get(b)).copied().unwrap_or(0),
                program_id,
            }
            .to_string()
        }
        2 => ExecError::DivisionByZero {
            kernel: name,
            loc: loom_ir::Loc {
                line: w[2],
                col: w[3],
            },
            program_id,
        }
        .to_string(),
        3 => ExecError::Malformed {
            at: if (w[2], w[3]) == (0, 0) {
                format!("kernel `{name}`")
            } else {
                format!("kernel `{name}` at {}:{}", w[2], w[3])
            },
            message: format!("loop step must be positive, got {c}"),
        }
        .to_string(),
        4 => {
            let p = kernel.and_then(|k| k.params.get(a));
            format!(
                "kernel `{name}`: element {c} of `{}` is outside the i32 range the WGSL backend emulates i64 with, \
                 in program {program_id:?}",
                p.map_or_else(|| format!("#{a}"), |p| p.name.clone())
            )
        }
        code => format!("kernel `{name}`: device error code {code} in program {program_id:?}"),
    })
}

// ---- commands -----------------------------------------------------------------------------------------------

/// A command with its buffers and executable resolved (and so kept alive) when the submission is accepted.
#[derive(Debug)]
enum Cmd {
    Dispatch {
        exe: Arc<Exe>,
        inputs: Vec<Buf>,
        params: Vec<Buf>,
        outputs: Vec<Buf>,
    },
    Copy {
        src: Buf,
        src_offset: u64,
        dst: Buf,
        dst_offset: u64,
        len: u64,
    },
    Fill {
        dst: Buf,
        offset: u64,
        len: u64,
        byte: u8,
    },
}

fn flush(gpu: &Gpu, enc: &mut Option<wgpu::CommandEncoder>) -> Result<(), String> {
    match enc.take() {
        Some(e) => gpu.flush(e),
        None => Ok(()),
    }
}

/// Runs one submission's commands in order on the queue thread (dropping them, and with them the last
/// references to freed buffers, before returning).
fn run_commands(gpu: &Gpu, cmds: Vec<Cmd>) -> Result<(), String> {
    let mut enc: Option<wgpu::CommandEncoder> = None;
    // Staging buffers live until the encoder that uses them is flushed.
    let mut temps: Vec<wgpu::Buffer> = Vec::new();
    for c in &cmds {
        match c {
            Cmd::Fill {
                dst,
                offset,
                len,
                byte,
            } => {
                range("fill", dst.len, *offset, *len)?;
                if *len == 0 {
                    continue;
                }
                if aligned(*offset) && aligned(*len) {
                    let e = enc.get_or_insert_with(|| gpu.encoder());
                    if *byte == 0 {
                        e.clear_buffer(&dst.buffer, *offset, Some(*len));
                    } else {
                        let tmp = gpu.init_buffer(&vec![*byte; *len as usize])?;
                        e.copy_buffer_to_buffer(&tmp, 0, &dst.buffer, *offset, *len);
                        temps.push(tmp);
                    }
                } else {
                    flush(gpu, &mut enc)?;
                    gpu.write(dst, *offset, &vec![*byte; *len as usize])
                        .map_err(|e| format!("fill: {e}"))?;
                }
            }
            Cmd::Copy {
                src,
                src_offset,
                dst,
                dst_offset,
                len,
            } => {
                range("copy source", src.len, *src_offset, *len)?;
                range("copy destination", dst.len, *dst_offset, *len)?;
                let same = Arc::ptr_eq(src, dst);
                if same && *src_offset < *dst_offset + *len && *dst_offset < *src_offset + *len {
                    return Err("copy: source and destination overlap".into());
                }
                if *len == 0 {
                    continue;
                }
                if aligned(*src_offset) && aligned(*dst_offset) && aligned(*len) {
                    let e = enc.get_or_insert_with(|| gpu.encoder());
                    if same {
                        // WebGPU forbids a copy within one buffer: go through a temporary.
                        let tmp = gpu.create_buffer(
                            *len,
                            wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
                        )?;
                        e.copy_buffer_to_buffer(&src.buffer, *src_offset, &tmp, 0, *len);
                        e.copy_buffer_to_buffer(&tmp, 0, &dst.buffer, *dst_offset, *len);
                        temps.push(tmp);
                    } else {
                        e.copy_buffer_to_buffer(
                            &src.buffer,
                            *src_offset,
                            &dst.buffer,
                            *dst_offset,
                            *len,
                        );
                    }
                } else {
                    flush(gpu, &mut enc)?;
                    let data = gpu.read(src, *src_offset, *len)?;
                    gpu.write(dst, *dst_offset, &data)?;
                }
            }
            Cmd::Dispatch {
                exe,
                inputs,
                params,
                outputs,
            } => {
                check_dispatch(exe, inputs, params, outputs)?;
                let e = enc.get_or_insert_with(|| gpu.encoder());
                record_dispatch(gpu, e, exe, inputs, params, outputs)?;
                flush(gpu, &mut enc)?;
                temps.clear();
                check_status(gpu, exe)?;
            }
        }
    }
    flush(gpu, &mut enc)?;
    drop(temps);
    drop(cmds);
    Ok(())
}

/// The execution contract's buffer checks (counts, then sizes) and the aliasing rule, with `hal-cpu`'s text.
fn check_dispatch(
    exe: &Exe,
    inputs: &[Buf],
    params: &[Buf],
    outputs: &[Buf],
) -> Result<(), String> {
    let s = &exe.stage;
    let at = format!("stage `{}`", s.name);
    let contract = || -> Result<(), ExecError> {
        check_buffer_count(format!("{at} inputs"), s.inputs.len(), inputs.len())?;
        check_buffer_count(format!("{at} parameters"), s.params.len(), params.len())?;
        check_buffer_count(format!("{at} outputs"), s.outputs.len(), outputs.len())?;
        let len = |b: &Buf| usize::try_from(b.len).unwrap_or(usize::MAX);
        for (d, b) in s.inputs.iter().zip(inputs) {
            check_buffer_size(
                format!("{at} input `{}`", d.name),
                d.dtype,
                &d.shape,
                len(b),
            )?;
        }
        for (d, b) in s.params.iter().zip(params) {
            check_buffer_size(
                format!("{at} parameter `{}`", d.name),
                d.dtype,
                &d.shape,
                len(b),
            )?;
        }
        for (d, b) in s.outputs.iter().zip(outputs) {
            check_buffer_size(
                format!("{at} output `{}`", d.name),
                d.dtype,
                &d.shape,
                len(b),
            )?;
        }
        Ok(())
    };
    contract().map_err(|e| e.to_string())?;
    for (i, o) in outputs.iter().enumerate() {
        let mut others = inputs.iter().chain(params).chain(&outputs[..i]);
        if others.any(|b| Arc::ptr_eq(b, o)) {
            return Err(format!(
                "dispatch of `{}`: output {i} is also bound to another argument",
                s.name
            ));
        }
    }
    Ok(())
}

fn record_dispatch(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    exe: &Exe,
    inputs: &[Buf],
    params: &[Buf],
    outputs: &[Buf],
) -> Result<(), String> {
    enc.clear_buffer(&exe.status, 0, None);
    for (di, d) in exe.plan.dispatches.iter().enumerate() {
        let mut entries = Vec::with_capacity(d.bindings.len());
        for b in &d.bindings {
            let (buffer, offset, size) = match b.buffer {
                WgslBuffer::Stage(r) => {
                    let (list, i) = match r {
                        BufRef::Input(i) => (inputs, i),
                        BufRef::Param(i) => (params, i),
                        BufRef::Output(i) => (outputs, i),
                        BufRef::Workspace(i) => {
                            return Err(format!("vulkan: workspace {i} bound as a stage buffer"));
                        }
                    };
                    let buf = list
                        .get(i as usize)
                        .ok_or_else(|| format!("vulkan: no buffer for {r:?}"))?;
                    (&buf.buffer, 0, None)
                }
                WgslBuffer::Arena { offset, size } => (&exe.arena, offset, NonZeroU64::new(size)),
                WgslBuffer::Status => (
                    &exe.status,
                    STATUS_STRIDE * di as u64,
                    NonZeroU64::new(STATUS_BYTES),
                ),
            };
            entries.push(wgpu::BindGroupEntry {
                binding: b.binding,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer,
                    offset,
                    size,
                }),
            });
        }
        let k = d.kernel as usize;
        let bg = gpu.scoped(&format!("dispatch {di} of `{}`", exe.stage.name), || {
            gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: None,
                layout: &exe.layouts[k],
                entries: &entries,
            })
        })?;
        // One pass per kernel: every dispatch of the stage sees the previous one's writes.
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: None,
            timestamp_writes: None,
        });
        pass.set_pipeline(&exe.pipelines[k]);
        pass.set_bind_group(0, &bg, &[]);
        pass.dispatch_workgroups(d.grid[0], d.grid[1], d.grid[2]);
    }
    Ok(())
}

/// Reads back every dispatch's status words; the first dispatch (in stage order) that reported an error gives
/// the submission's error.
fn check_status(gpu: &Gpu, exe: &Exe) -> Result<(), String> {
    let n = exe.plan.dispatches.len() as u64;
    if n == 0 {
        return Ok(());
    }
    let staging = gpu.create_buffer(
        STATUS_STRIDE * n,
        wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
    )?;
    let mut enc = gpu.encoder();
    enc.copy_buffer_to_buffer(&exe.status, 0, &staging, 0, STATUS_STRIDE * n);
    gpu.flush(enc)?;
    let bytes = gpu.map_read(&staging, 0, STATUS_STRIDE * n)?;
    for di in 0..n as usize {
        let at = di * STATUS_STRIDE as usize;
        let mut w = [0u32; 8];
        for (j, x) in w.iter_mut().enumerate() {
            let o = at + 4 * j;
            *x = u32::from_le_bytes([bytes[o], bytes[o + 1], bytes[o + 2], bytes[o + 3]]);
        }
        if let Some(e) = status_error(&exe.stage, di, &w) {
            return Err(e);
        }
    }
    Ok(())
}

// ---- the device ---------------------------------------------------------------------------------------------

#[derive(Debug, Default)]
struct State {
    buffers: HashMap<u64, Buf>,
    exes: HashMap<u64, Arc<Exe>>,
    files: files::FileTable,
    next_id: u64,
}

impl State {
    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }
    fn buffer(&self, id: BufferId) -> Result<Buf, String> {
        self.buffers
            .get(&id.0)
            .cloned()
            .ok_or_else(|| format!("unknown buffer {}", id.0))
    }
}

/// One queued file read, resolved when accepted.
#[derive(Debug)]
struct FileRead {
    file: Arc<OpenFile>,
    file_offset: u64,
    len: u64,
    dst: Buf,
    dst_offset: u64,
}

/// Runs one submission's file reads in order on the transfer queue: each is checked (direct alignment, the
/// destination range), read with `read_exact_at` into host memory [`FILE_CHUNK`] bytes at a time and written
/// to the buffer with `Queue::write_buffer`; `Gpu::write` waits until the device has the bytes, so the point
/// is signalled only after the copies are done.
fn run_reads(gpu: &Gpu, reads: Vec<FileRead>) -> Result<(), String> {
    let mut host = Vec::new();
    for r in &reads {
        let range = r
            .file
            .check(r.file_offset, r.len, r.dst.len, r.dst_offset)?;
        let mut done = 0u64;
        while done < r.len {
            let n = (r.len - done).min(FILE_CHUNK as u64) as usize;
            host.resize(n, 0);
            r.file
                .read_piece((r.file_offset, r.len), r.file_offset + done, &mut host)?;
            gpu.write(&r.dst, range.start + done, &host).map_err(|e| {
                format!(
                    "file read at offset {} length {} of {}: {e}",
                    r.file_offset, r.len, r.file.path
                )
            })?;
            done += n as u64;
        }
    }
    drop(reads);
    Ok(())
}

#[derive(Debug)]
struct Core {
    gpu: Arc<Gpu>,
    name: String,
    state: Mutex<State>,
    queue: Queue<Vec<Cmd>>,
    /// File reads: ordered among themselves, against `queue` only by timeline points (the same timelines).
    transfer: Queue<Vec<FileRead>>,
}

/// A device: the `HalDevice` and the `HalFiles` of one `hal_files` call share it.
#[derive(Clone, Debug)]
struct VkDevice(Arc<Core>);

impl std::ops::Deref for VkDevice {
    type Target = Core;
    fn deref(&self) -> &Core {
        &self.0
    }
}

impl VkDevice {
    fn open(adapter: &wgpu::Adapter, profile: LimitsProfile) -> Result<VkDevice, String> {
        let limits = profile.limits();
        let name = adapter_name(adapter);
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("loom"),
            required_features: wgpu::Features::empty(),
            required_limits: limits.clone(),
            ..Default::default()
        }))
        .map_err(|e| format!("open {name} with {profile:?} limits: {e}"))?;
        // Errors are caught by error scopes; anything that escapes one must not reach wgpu's panicking default.
        device.on_uncaptured_error(Arc::new(|e: wgpu::Error| {
            eprintln!("hal-vulkan: uncaptured wgpu error: {e}");
        }));
        let gpu = Arc::new(Gpu {
            device,
            queue,
            limits,
        });
        let g = Arc::clone(&gpu);
        let queue = Queue::new("hal-vulkan-queue", move |cmds| run_commands(&g, cmds));
        let g = Arc::clone(&gpu);
        let transfer = queue.sibling("hal-vulkan-transfer", move |reads| run_reads(&g, reads));
        Ok(VkDevice(Arc::new(Core {
            gpu,
            name,
            state: Mutex::new(State::default()),
            queue,
            transfer,
        })))
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }
}

impl HalDevice for VkDevice {
    fn limits(&self) -> DeviceLimits {
        DeviceLimits {
            max_buffer_bytes: self.gpu.limits.max_buffer_size,
            max_stage_bytes: kernel_codec::MAX_STAGE_BYTES as u64,
            parallelism: 1,
        }
    }

    fn alloc(&self, bytes: u64) -> RResult<BufferId, RBoxError> {
        guard("alloc", || {
            let size = bytes.div_ceil(4) * 4;
            let buffer = self
                .gpu
                .create_buffer(
                    size,
                    wgpu::BufferUsages::STORAGE
                        | wgpu::BufferUsages::COPY_SRC
                        | wgpu::BufferUsages::COPY_DST,
                )
                .map_err(|e| format!("alloc of {bytes} bytes on {}: {e}", self.name))?;
            let mut st = self.state();
            let id = st.id();
            st.buffers
                .insert(id, Arc::new(VkBuf { buffer, len: bytes }));
            Ok::<_, String>(BufferId(id))
        })
    }

    fn free(&self, buffer: BufferId) -> RResult<(), RBoxError> {
        guard("free", || match self.state().buffers.remove(&buffer.0) {
            // The wgpu buffer is reference counted: queued submissions keep it until they retire.
            Some(_) => Ok(()),
            None => Err(format!("free: unknown buffer {}", buffer.0)),
        })
    }

    fn write(&self, buffer: BufferId, offset: u64, data: RSlice<'_, u8>) -> RResult<(), RBoxError> {
        guard("write", || {
            let b = self.state().buffer(buffer)?;
            self.gpu.write(&b, offset, data.as_slice())
        })
    }

    fn read(&self, buffer: BufferId, offset: u64, len: u64) -> RResult<RVec<u8>, RBoxError> {
        guard("read", || {
            let b = self.state().buffer(buffer)?;
            self.gpu.read(&b, offset, len).map(RVec::from)
        })
    }

    fn compile(&self, stage: RSlice<'_, u8>) -> RResult<ExecutableId, RBoxError> {
        guard("compile", || {
            let stage = kernel_codec::decode_stage(stage.as_slice()).map_err(|e| e.to_string())?;
            let exe = compile_stage(&self.gpu, stage)?;
            let mut st = self.state();
            let id = st.id();
            st.exes.insert(id, Arc::new(exe));
            Ok::<_, String>(ExecutableId(id))
        })
    }

    fn submit(&self, submission: Submission) -> RResult<(), RBoxError> {
        guard("submit", || {
            self.queue
                .check_points(submission.wait.iter().chain([&submission.signal]))?;
            let st = self.state();
            let bufs = |ids: &RVec<BufferId>| -> Result<Vec<Buf>, String> {
                ids.iter().map(|&id| st.buffer(id)).collect()
            };
            let mut commands = Vec::with_capacity(submission.commands.len());
            for c in submission.commands.iter() {
                commands.push(match c {
                    Command::Dispatch {
                        exe,
                        inputs,
                        params,
                        outputs,
                        workspace,
                    } => {
                        let exe = st
                            .exes
                            .get(&exe.0)
                            .cloned()
                            .ok_or_else(|| format!("unknown executable {}", exe.0))?;
                        check_buffer_count(
                            format!("stage `{}` workspace", exe.stage.name),
                            exe.stage.workspace.len(),
                            workspace.len(),
                        )
                        .map_err(|e| e.to_string())?;
                        // The device uses the executable's own arena: workspace buffers are only checked to exist.
                        bufs(workspace)?;
                        Cmd::Dispatch {
                            exe,
                            inputs: bufs(inputs)?,
                            params: bufs(params)?,
                            outputs: bufs(outputs)?,
                        }
                    }
                    Command::Copy {
                        src,
                        src_offset,
                        dst,
                        dst_offset,
                        len,
                    } => Cmd::Copy {
                        src: st.buffer(*src)?,
                        src_offset: *src_offset,
                        dst: st.buffer(*dst)?,
                        dst_offset: *dst_offset,
                        len: *len,
                    },
                    Command::Fill {
                        dst,
                        offset,
                        len,
                        byte,
                    } => Cmd::Fill {
                        dst: st.buffer(*dst)?,
                        offset: *offset,
                        len: *len,
                        byte: *byte,
                    },
                });
            }
            drop(st);
            self.queue
                .submit(commands, submission.wait.to_vec(), submission.signal)
        })
    }

    fn timeline_create(&self) -> RResult<TimelineId, RBoxError> {
        guard("timeline_create", || {
            Ok::<_, String>(self.queue.timeline_create())
        })
    }

    fn timeline_value(&self, timeline: TimelineId) -> RResult<u64, RBoxError> {
        guard("timeline_value", || self.queue.timeline_value(timeline))
    }

    fn timeline_signal(&self, point: TimelinePoint) -> RResult<(), RBoxError> {
        guard("timeline_signal", || self.queue.timeline_signal(point))
    }

    fn timeline_wait(
        &self,
        point: TimelinePoint,
        timeout_ns: u64,
    ) -> RResult<WaitStatus, RBoxError> {
        guard("timeline_wait", || {
            self.queue.timeline_wait(point, timeout_ns)
        })
    }
}

impl HalFiles for VkDevice {
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
            self.transfer
                .check_points(submission.wait.iter().chain([&submission.signal]))?;
            let st = self.state();
            let mut reads = Vec::with_capacity(submission.reads.len());
            for r in submission.reads.iter() {
                let file = st.files.get(r.file)?;
                reads.push(FileRead {
                    file,
                    file_offset: r.file_offset,
                    len: r.len,
                    dst: st.buffer(r.dst)?,
                    dst_offset: r.dst_offset,
                });
            }
            drop(st);
            self.transfer
                .submit(reads, submission.wait.to_vec(), submission.signal)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loom_plugin_api::ProbeStatus;

    const CHILD: &str = "HAL_VULKAN_TEST_CHILD";

    /// With no Vulkan driver the probe is a clean Absent and the driver has no devices. The Vulkan loader reads
    /// `VK_DRIVER_FILES`/`VK_ICD_FILENAMES` when an instance is created, so the check runs in a child process
    /// (this test binary again) with those pointing nowhere.
    #[test]
    fn probe_without_a_vulkan_driver_is_absent() {
        if std::env::var_os(CHILD).is_some() {
            let p = probe();
            assert_eq!(p.status, ProbeStatus::Absent, "{p:?}");
            assert!(p.detail.contains("no Vulkan adapter"), "{p:?}");
            let d = driver_with(LimitsProfile::Default);
            assert!(d.devices().is_empty());
            let e = d.open(0).into_result().map(|_| ()).unwrap_err();
            assert!(e.to_string().contains("no vulkan device 0"), "{e}");
            return;
        }
        let exe = std::env::current_exe().expect("test binary");
        let out = std::process::Command::new(exe)
            .args([
                "--exact",
                "tests::probe_without_a_vulkan_driver_is_absent",
                "--test-threads=1",
            ])
            .env(CHILD, "1")
            .env("VK_DRIVER_FILES", "/nonexistent/loom-no-icd.json")
            .env("VK_ICD_FILENAMES", "/nonexistent/loom-no-icd.json")
            .output()
            .expect("run the child");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains("1 passed"), "{text}");
    }

    #[test]
    fn limits_profiles() {
        let d = wgsl_limits(&LimitsProfile::Downlevel.limits());
        assert_eq!(d.max_storage_buffers_per_shader_stage, 4);
        assert_eq!(d.max_compute_workgroup_storage_size, 16352);
        let w = wgsl_limits(&LimitsProfile::Default.limits());
        assert_eq!(w.max_storage_buffers_per_shader_stage, 8);
        assert_eq!(w, WgslLimits::default());
    }

    #[test]
    fn status_words_become_the_contracts_errors() {
        assert_eq!(status_error(&empty_stage(), 0, &[0; 8]), None);
        let e = status_error(&empty_stage(), 0, &[1, 9, 0, 0, 0, 1, 2, 3]).unwrap();
        assert!(
            e.contains("device error code 9") && e.contains("[1, 2, 3]"),
            "{e}"
        );
    }

    fn empty_stage() -> Stage {
        Stage {
            name: "s".into(),
            inputs: vec![],
            outputs: vec![],
            workspace: vec![],
            param_domain: None,
            params: vec![],
            kernels: vec![],
            dispatches: vec![],
        }
    }
}
