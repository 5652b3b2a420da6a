//! The CUDA HAL plugin (`cuda-0001`): the HAL of `loom-plugin-api` on NVIDIA GPUs through cudarc, with every
//! kernel of a stage emitted as CUDA C by `loom-emit` and compiled by NVRTC.
//!
//! * **Dynamic loading.** cudarc is built with `dynamic-loading`: the crate builds and loads with no CUDA
//!   installed. cudarc *panics* on the first call when `libcuda` is missing, so the probe (and [`driver`])
//!   first ask `cudarc::driver::sys::is_culib_present()` (which only tries to open the library), then open
//!   NVRTC ([`Nvrtc::get`]), and report [`ProbeStatus::Absent`](loom_plugin_api::ProbeStatus) with the reason;
//!   a panic that still happens is caught by `guard`/`guard_probe`.
//! * **NVRTC** is opened by [`nvrtc`] (libloading), not through cudarc's `nvrtc` module, so that it can come
//!   from an explicit path (`$LOOM_NVRTC`: the library or its folder) and a missing one is an error, not a
//!   panic. It needs no GPU: [`kernel_ptx`] / [`stage_ptx`] turn a kernel's CUDA C into PTX for a virtual
//!   architecture (`compute_80`, ...) on any machine, and an emitter refusal or NVRTC's log is a [`PtxError`].
//! * **Buffers** are `cuMemAlloc` allocations (`CudaSlice<u8>`, zeroed); `write`/`read` are copies on the
//!   device's stream followed by a stream synchronisation, so they finish before returning.
//! * **`compile`** decodes the stage and compiles each kernel with [`stage_ptx`] (`loom_emit::cuda_kernel`, then
//!   NVRTC) for the device's `compute_XY`, and loads the PTX (the driver JIT-compiles it for the device).
//!   Workspace buffers and one 8-word status block per dispatch are allocated per executable.
//! * **`submit`** runs on the device's queue thread (`hal-queue`: in order, waits first, failures propagate
//!   along fence chains exactly like `hal-cpu`). A dispatch launches each kernel of the stage on the stream,
//!   synchronises, and reads the status words: a checked-load error becomes `ExecError::IndexOutOfRange` with
//!   the text `hal-cpu` and `loom-reference` give. Commands after a failed dispatch do not run.
//!
//! **Never executed here**: the machines this was written on have no NVIDIA GPU. What CI checks is that the
//! crate builds, that the probe answers Absent cleanly, that the loader reports it in one line, and
//! (`tests/nvrtc.rs`, with NVRTC and ptxas 12.8 from `scripts/fetch-cuda-tools.sh`) that every kernel of every
//! motif stage and of the HAL conformance suite compiles through [`kernel_ptx`] for `compute_80` and
//! `compute_90` without warnings and assembles with `ptxas -arch=sm_80` / `sm_90`.
//! `scripts/gpu-conformance.sh` runs the HAL conformance suite with this plugin on a machine with a GPU.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use abi_stable::export_root_module;
use abi_stable::prefix_type::PrefixTypeTrait;
use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{RBoxError, RResult, RSlice, RStr, RString, RVec};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DriverError, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use hal_queue::{Queue, lock};
use loom_emit::CudaModule;
use loom_ir::kernel::{BufRef, ExecError, Kernel, Stage, check_buffer_count, check_buffer_size};
use loom_ir::kernel_codec;
use loom_plugin_api::{
    ABI_MAJOR, ABI_MINOR, BufferId, Command, DeviceInfo, DeviceLimits, ExecutableId, HalDevice,
    HalDevice_TO, HalDeviceBox, HalDriver, HalDriver_TO, HalDriverBox, LoomPlugin, LoomPlugin_Ref,
    PluginKind, Probe, Submission, TimelineId, TimelinePoint, WaitStatus, guard, guard_probe,
};

pub mod nvrtc;

pub use nvrtc::Nvrtc;

/// This plugin's id.
pub const PLUGIN_ID: &str = "cuda-0001";

/// Largest buffer `alloc` accepts (the device's memory is the real limit).
pub const MAX_BUFFER_BYTES: u64 = 1 << 40;

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
        hal_files: loom_plugin_api::no_hal_files,
        profile_events: loom_plugin_api::no_profile_events,
    }
    .leak_into_prefix()
}

extern "C" fn probe() -> Probe {
    guard_probe(probe_cuda)
}

extern "C" fn hal() -> RResult<HalDriverBox, RBoxError> {
    guard("hal-cuda driver", driver)
}

/// Why CUDA cannot be used here, checked without calling into any CUDA library (`None`: both are present).
pub fn missing_libraries() -> Option<String> {
    // SAFETY: `is_culib_present` only tries `dlopen` on the candidate library names (and drops what it opened);
    // it resolves and calls no CUDA symbol.
    let driver = unsafe { cudarc::driver::sys::is_culib_present() };
    if !driver {
        return Some(
            "no CUDA driver library (libcuda.so) could be opened: no NVIDIA driver on this machine"
                .into(),
        );
    }
    if let Err(e) = Nvrtc::get() {
        return Some(format!(
            "the NVIDIA driver is present but NVRTC is not: install the CUDA toolkit's NVRTC (cuda-nvrtc) \
             to compile kernels ({e})"
        ));
    }
    None
}

/// Why a kernel has no PTX: the CUDA emitter refused it, or NVRTC rejected the emitted C.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PtxError {
    /// `loom_emit::cuda_kernel` refused the kernel ([`loom_emit::Error::Unsupported`] for what CUDA C cannot
    /// express yet, [`loom_emit::Error::Malformed`] for inconsistent IR).
    Emit {
        kernel: String,
        error: loom_emit::Error,
    },
    /// NVRTC rejected the emitted CUDA C: a bug of `loom-emit` (the log says where).
    Nvrtc {
        kernel: String,
        error: nvrtc::CompileError,
    },
}

impl std::fmt::Display for PtxError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PtxError::Emit { kernel, error } => write!(f, "kernel `{kernel}`: {error}"),
            PtxError::Nvrtc { kernel, error } => write!(f, "kernel `{kernel}`: {error}"),
        }
    }
}

impl std::error::Error for PtxError {}

/// One kernel's CUDA C (`loom_emit::cuda_kernel`) compiled by NVRTC to PTX for the virtual architecture
/// `arch` (`compute_80`, `compute_90`, ...). Needs no GPU and no driver, only NVRTC: the device's `compile`
/// uses it for the device's architecture, and `tests/nvrtc.rs` for every motif kernel.
pub fn kernel_ptx(
    nvrtc: &Nvrtc,
    kernel: &Kernel,
    arch: &str,
) -> Result<(CudaModule, nvrtc::Ptx), PtxError> {
    let m = loom_emit::cuda_kernel(kernel).map_err(|error| PtxError::Emit {
        kernel: kernel.name.clone(),
        error,
    })?;
    let ptx = nvrtc
        .compile_ptx(&m.source, &format!("{}.cu", m.function), arch)
        .map_err(|error| PtxError::Nvrtc {
            kernel: kernel.name.clone(),
            error,
        })?;
    Ok((m, ptx))
}

/// Every kernel of a stage through [`kernel_ptx`], in the stage's kernel order.
pub fn stage_ptx(
    nvrtc: &Nvrtc,
    stage: &Stage,
    arch: &str,
) -> Result<Vec<(CudaModule, nvrtc::Ptx)>, PtxError> {
    stage
        .kernels
        .iter()
        .map(|k| kernel_ptx(nvrtc, k, arch))
        .collect()
}

fn probe_cuda() -> Probe {
    if let Some(why) = missing_libraries() {
        return Probe::absent(why);
    }
    match CudaContext::device_count() {
        Ok(n) if n > 0 => {
            let names: Vec<String> = (0..n as usize)
                .map(|i| {
                    CudaContext::new(i)
                        .and_then(|c| c.name())
                        .unwrap_or_else(|e| format!("device {i} ({e})"))
                })
                .collect();
            Probe::available(n as u32, names.join("; "))
        }
        Ok(_) => Probe::absent("the CUDA driver reports no devices"),
        Err(e) => Probe::absent(format!("the CUDA driver did not initialise: {e}")),
    }
}

/// The CUDA driver, or why CUDA is not usable here.
pub fn driver() -> Result<HalDriverBox, String> {
    if let Some(why) = missing_libraries() {
        return Err(why);
    }
    let n = CudaContext::device_count().map_err(|e| format!("cuda: {e}"))?;
    let mut devices = Vec::new();
    for i in 0..n.max(0) as usize {
        let ctx = CudaContext::new(i).map_err(|e| format!("cuda device {i}: {e}"))?;
        devices.push(DeviceInfo {
            name: RString::from(ctx.name().unwrap_or_else(|e| format!("device {i} ({e})"))),
            backend: RString::from("cuda"),
            memory_bytes: ctx.total_mem().map_or(0, |m| m as u64),
        });
    }
    Ok(HalDriver_TO::from_value(CudaDriver { devices }, TD_Opaque))
}

#[derive(Debug)]
struct CudaDriver {
    devices: Vec<DeviceInfo>,
}

impl HalDriver for CudaDriver {
    fn devices(&self) -> RVec<DeviceInfo> {
        RVec::from(self.devices.clone())
    }

    fn open(&self, index: u32) -> RResult<HalDeviceBox, RBoxError> {
        guard("open", || {
            if index as usize >= self.devices.len() {
                return Err(format!(
                    "no cuda device {index} (there are {})",
                    self.devices.len()
                ));
            }
            let dev = CudaDev::open(index as usize)?;
            Ok(HalDevice_TO::from_value(dev, TD_Opaque))
        })
    }
}

// ---- device state -------------------------------------------------------------------------------------------

fn cu(what: &str) -> impl Fn(DriverError) -> String + '_ {
    move |e| format!("cuda: {what}: {e}")
}

#[derive(Debug)]
struct CuBuf {
    mem: Mutex<CudaSlice<u8>>,
    len: u64,
}

type Buf = Arc<CuBuf>;

#[derive(Debug)]
struct Loaded {
    func: CudaFunction,
    cfg: LaunchConfig,
}

#[derive(Debug)]
struct Exe {
    stage: Stage,
    kernels: Vec<Loaded>,
    workspace: Vec<Mutex<CudaSlice<u8>>>,
    /// 8 status words per dispatch.
    status: Mutex<CudaSlice<u32>>,
}

#[derive(Debug)]
struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    arch: &'static str,
}

fn range(what: &str, len: u64, offset: u64, n: u64) -> Result<std::ops::Range<usize>, String> {
    match offset.checked_add(n) {
        Some(end) if end <= len => Ok(offset as usize..end as usize),
        _ => Err(format!(
            "{what}: bytes {offset}..{offset}+{n} are outside the buffer ({len} bytes)"
        )),
    }
}

/// NVRTC's `--gpu-architecture` for a compute capability: the virtual architecture (`compute_XY`), whose PTX
/// the driver JIT-compiles for the device when the module is loaded.
fn arch_name(major: i32, minor: i32) -> &'static str {
    match (major, minor) {
        (5, 0) => "compute_50",
        (5, 2) => "compute_52",
        (6, 0) => "compute_60",
        (6, 1) => "compute_61",
        (7, 0) => "compute_70",
        (7, 5) => "compute_75",
        (8, 0) => "compute_80",
        (8, 6) => "compute_86",
        (8, 7) => "compute_87",
        (8, 9) => "compute_89",
        (9, 0) => "compute_90",
        (10, 0) => "compute_100",
        (12, 0) => "compute_120",
        // Older than listed: the oldest; newer: PTX for compute_90 is JIT-compiled forward by the driver.
        (m, _) if m < 5 => "compute_50",
        _ => "compute_90",
    }
}

impl Gpu {
    fn read(&self, b: &CuBuf, offset: u64, len: u64) -> Result<Vec<u8>, String> {
        let r = range("read", b.len, offset, len)?;
        let mut out = vec![0u8; r.len()];
        if !out.is_empty() {
            let mem = lock(&b.mem);
            self.stream
                .memcpy_dtoh(&mem.slice(r), &mut out[..])
                .map_err(cu("read"))?;
            self.stream.synchronize().map_err(cu("read"))?;
        }
        Ok(out)
    }

    fn write(&self, b: &CuBuf, offset: u64, data: &[u8]) -> Result<(), String> {
        let r = range("write", b.len, offset, data.len() as u64)?;
        if !data.is_empty() {
            let mut mem = lock(&b.mem);
            self.stream
                .memcpy_htod(data, &mut mem.slice_mut(r))
                .map_err(cu("write"))?;
            self.stream.synchronize().map_err(cu("write"))?;
        }
        Ok(())
    }
}

fn compile_stage(gpu: &Gpu, stage: Stage) -> Result<Exe, String> {
    let unsupported = |message: String| {
        ExecError::Unsupported {
            kernel: stage.name.clone(),
            backend: "cuda".into(),
            message,
        }
        .to_string()
    };
    let nvrtc = Nvrtc::get().map_err(unsupported)?;
    let compiled = stage_ptx(nvrtc, &stage, gpu.arch).map_err(|e| unsupported(e.to_string()))?;
    let mut kernels = Vec::with_capacity(compiled.len());
    for (m, ptx) in compiled {
        let module = gpu
            .ctx
            .load_module(Ptx::from_src(ptx.text))
            .map_err(|e| unsupported(format!("loading kernel `{}`: {e}", m.name)))?;
        let func = module
            .load_function(&m.function)
            .map_err(|e| unsupported(format!("kernel `{}`: {e}", m.name)))?;
        kernels.push(Loaded {
            func,
            cfg: LaunchConfig {
                grid_dim: (m.grid[0], m.grid[1], m.grid[2]),
                block_dim: (m.block_dim, 1, 1),
                shared_mem_bytes: 0,
            },
        });
    }
    let mut workspace = Vec::with_capacity(stage.workspace.len());
    for w in &stage.workspace {
        let bytes = w
            .dtype
            .bytes_for(&w.shape)
            .ok_or_else(|| unsupported(format!("workspace `{}` has no byte size", w.name)))?;
        let mem = gpu
            .stream
            .alloc_zeros::<u8>(bytes.max(1) as usize)
            .map_err(|e| unsupported(format!("workspace `{}`: {e}", w.name)))?;
        workspace.push(Mutex::new(mem));
    }
    let status = gpu
        .stream
        .alloc_zeros::<u32>(8 * stage.dispatches.len().max(1))
        .map_err(|e| unsupported(format!("status words: {e}")))?;
    Ok(Exe {
        stage,
        kernels,
        workspace,
        status: Mutex::new(status),
    })
}

/// The kernel contract's error for the status words of dispatch `di` (`None`: no error). Same decoding as
/// `hal-vulkan` (the emitter's status layout is shared).
fn status_error(stage: &Stage, di: usize, w: &[u32]) -> Option<String> {
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
        code => format!("kernel `{name}`: device error code {code} in program {program_id:?}"),
    })
}

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

fn run_commands(gpu: &Gpu, cmds: Vec<Cmd>) -> Result<(), String> {
    for c in &cmds {
        match c {
            Cmd::Fill {
                dst,
                offset,
                len,
                byte,
            } => {
                let r = range("fill", dst.len, *offset, *len)?;
                if r.is_empty() {
                    continue;
                }
                let mut mem = lock(&dst.mem);
                let mut view = mem.slice_mut(r.clone());
                if *byte == 0 {
                    gpu.stream.memset_zeros(&mut view).map_err(cu("fill"))?;
                } else {
                    let pattern = vec![*byte; r.len()];
                    gpu.stream
                        .memcpy_htod(&pattern[..], &mut view)
                        .map_err(cu("fill"))?;
                    // The pattern is pageable host memory: finish before it is dropped.
                    gpu.stream.synchronize().map_err(cu("fill"))?;
                }
            }
            Cmd::Copy {
                src,
                src_offset,
                dst,
                dst_offset,
                len,
            } => {
                let s = range("copy source", src.len, *src_offset, *len)?;
                let d = range("copy destination", dst.len, *dst_offset, *len)?;
                if Arc::ptr_eq(src, dst) {
                    if s.start < d.end && d.start < s.end {
                        return Err("copy: source and destination overlap".into());
                    }
                    if s.is_empty() {
                        continue;
                    }
                    // One buffer: through a temporary (a view and a mutable view of one slice cannot coexist).
                    let mut mem = lock(&src.mem);
                    let mut tmp = gpu.stream.alloc_zeros::<u8>(s.len()).map_err(cu("copy"))?;
                    gpu.stream
                        .memcpy_dtod(&mem.slice(s), &mut tmp)
                        .map_err(cu("copy"))?;
                    gpu.stream
                        .memcpy_dtod(&tmp, &mut mem.slice_mut(d))
                        .map_err(cu("copy"))?;
                } else {
                    if s.is_empty() {
                        continue;
                    }
                    let sm = lock(&src.mem);
                    let mut dm = lock(&dst.mem);
                    gpu.stream
                        .memcpy_dtod(&sm.slice(s), &mut dm.slice_mut(d))
                        .map_err(cu("copy"))?;
                }
            }
            Cmd::Dispatch {
                exe,
                inputs,
                params,
                outputs,
            } => dispatch(gpu, exe, inputs, params, outputs)?,
        }
    }
    gpu.stream.synchronize().map_err(cu("submission"))?;
    drop(cmds);
    Ok(())
}

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

/// One lock per distinct buffer (a buffer may be bound to several read-only arguments).
fn slot<'a>(b: &'a Buf, distinct: &mut Vec<&'a Buf>) -> usize {
    match distinct.iter().position(|d| Arc::ptr_eq(d, b)) {
        Some(i) => i,
        None => {
            distinct.push(b);
            distinct.len() - 1
        }
    }
}

fn dispatch(
    gpu: &Gpu,
    exe: &Exe,
    inputs: &[Buf],
    params: &[Buf],
    outputs: &[Buf],
) -> Result<(), String> {
    check_dispatch(exe, inputs, params, outputs)?;
    let mut distinct: Vec<&Buf> = Vec::new();
    let in_slots: Vec<usize> = inputs.iter().map(|b| slot(b, &mut distinct)).collect();
    let p_slots: Vec<usize> = params.iter().map(|b| slot(b, &mut distinct)).collect();
    let o_slots: Vec<usize> = outputs.iter().map(|b| slot(b, &mut distinct)).collect();
    let guards: Vec<MutexGuard<'_, CudaSlice<u8>>> =
        distinct.iter().map(|b| lock(&b.mem)).collect();
    let ws: Vec<MutexGuard<'_, CudaSlice<u8>>> = exe.workspace.iter().map(|w| lock(w)).collect();
    let mut status = lock(&exe.status);
    gpu.stream
        .memset_zeros(&mut *status)
        .map_err(cu("status words"))?;
    for (di, d) in exe.stage.dispatches.iter().enumerate() {
        let k = exe
            .kernels
            .get(d.kernel as usize)
            .ok_or_else(|| format!("dispatch {di}: no kernel #{}", d.kernel))?;
        let st = status.slice(8 * di..8 * di + 8);
        let mut launch = gpu.stream.launch_builder(&k.func);
        for arg in &d.args {
            let mem: &CudaSlice<u8> = match *arg {
                BufRef::Input(i) => in_slots.get(i as usize).map(|&s| &*guards[s]),
                BufRef::Param(i) => p_slots.get(i as usize).map(|&s| &*guards[s]),
                BufRef::Output(i) => o_slots.get(i as usize).map(|&s| &*guards[s]),
                BufRef::Workspace(i) => ws.get(i as usize).map(|g| &**g),
            }
            .ok_or_else(|| format!("dispatch {di}: argument {arg:?} does not exist"))?;
            launch.arg(mem);
        }
        launch.arg(&st);
        // SAFETY: the function was compiled from `loom-emit`'s CUDA C for exactly this kernel, whose parameters
        // are one device pointer per kernel parameter, in order, then `unsigned* status`; those are the
        // arguments pushed above. Every buffer was checked against the declared byte size of its parameter
        // (`check_dispatch`; workspace and status were allocated for this stage), and the emitted code bounds-checks
        // every access against those declared shapes, so the kernel touches no memory outside them. The buffers
        // stay locked and alive until the stream is synchronised below.
        unsafe { launch.launch(k.cfg) }
            .map_err(|e| format!("cuda: launch of dispatch {di}: {e}"))?;
    }
    gpu.stream.synchronize().map_err(cu("dispatch"))?;
    let words = gpu
        .stream
        .clone_dtoh(&*status)
        .map_err(cu("status words"))?;
    gpu.stream.synchronize().map_err(cu("status words"))?;
    for di in 0..exe.stage.dispatches.len() {
        if let Some(e) = words
            .get(8 * di..8 * di + 8)
            .and_then(|w| status_error(&exe.stage, di, w))
        {
            return Err(e);
        }
    }
    Ok(())
}

#[derive(Debug, Default)]
struct State {
    buffers: HashMap<u64, Buf>,
    exes: HashMap<u64, Arc<Exe>>,
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

#[derive(Debug)]
struct CudaDev {
    gpu: Arc<Gpu>,
    sms: u32,
    state: Mutex<State>,
    queue: Queue<Vec<Cmd>>,
}

impl CudaDev {
    fn open(ordinal: usize) -> Result<CudaDev, String> {
        let ctx = CudaContext::new(ordinal).map_err(cu("open"))?;
        let (major, minor) = ctx.compute_capability().map_err(cu("compute capability"))?;
        let sms = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_or(1, |n| n.max(1) as u32);
        let stream = ctx.new_stream().map_err(cu("stream"))?;
        let gpu = Arc::new(Gpu {
            ctx,
            stream,
            arch: arch_name(major, minor),
        });
        let g = Arc::clone(&gpu);
        let queue = Queue::new("hal-cuda-queue", move |cmds| run_commands(&g, cmds));
        Ok(CudaDev {
            gpu,
            sms,
            state: Mutex::new(State::default()),
            queue,
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }
}

impl HalDevice for CudaDev {
    fn limits(&self) -> DeviceLimits {
        DeviceLimits {
            max_buffer_bytes: MAX_BUFFER_BYTES,
            max_stage_bytes: kernel_codec::MAX_STAGE_BYTES as u64,
            parallelism: self.sms,
        }
    }

    fn alloc(&self, bytes: u64) -> RResult<BufferId, RBoxError> {
        guard("alloc", || {
            if bytes > MAX_BUFFER_BYTES {
                return Err(format!(
                    "alloc: {bytes} bytes is over the limit of {MAX_BUFFER_BYTES}"
                ));
            }
            let mem = self
                .gpu
                .stream
                .alloc_zeros::<u8>(bytes.max(1) as usize)
                .map_err(|e| format!("alloc of {bytes} bytes: {e}"))?;
            self.gpu.stream.synchronize().map_err(cu("alloc"))?;
            let mut st = self.state();
            let id = st.id();
            st.buffers.insert(
                id,
                Arc::new(CuBuf {
                    mem: Mutex::new(mem),
                    len: bytes,
                }),
            );
            Ok(BufferId(id))
        })
    }

    fn free(&self, buffer: BufferId) -> RResult<(), RBoxError> {
        guard("free", || match self.state().buffers.remove(&buffer.0) {
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
                        // The executable has its own workspace: these are only checked to exist.
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

#[cfg(test)]
mod tests {
    use super::*;
    use loom_plugin_api::ProbeStatus;

    /// Without an NVIDIA driver (CI, and every machine this was developed on) the probe is a clean Absent
    /// with the reason, and the driver factory an error — never a panic.
    #[test]
    fn probe_without_a_gpu_is_absent_with_a_reason() {
        let p = probe();
        if missing_libraries().is_some() {
            assert_eq!(p.status, ProbeStatus::Absent, "{p:?}");
            assert!(
                p.detail.contains("libcuda") || p.detail.contains("NVRTC"),
                "{p:?}"
            );
            let e = hal().into_result().map(|_| ()).unwrap_err().to_string();
            assert_eq!(e, p.detail.as_str());
        } else {
            assert_ne!(p.status, ProbeStatus::Panicked, "{p:?}");
        }
    }

    #[test]
    fn arch_names() {
        assert_eq!(arch_name(9, 0), "compute_90");
        assert_eq!(arch_name(8, 6), "compute_86");
        assert_eq!(arch_name(3, 5), "compute_50");
    }
}
