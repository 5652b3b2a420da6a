//! Executables: every kernel of a stage emitted as CUDA C (`loom_emit::cuda_kernel`) and compiled by NVRTC to
//! PTX ([`kernel_ptx`], [`stage_ptx`]: no GPU needed), loaded for the device, with the stage's workspace and one
//! status block per dispatch.

use std::sync::Mutex;

use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig};
use cudarc::nvrtc::Ptx;
use hal_queue::commands::Executable;
use hal_queue::status::STATUS_WORDS;
use loom_emit::CudaModule;
use loom_ir::kernel::{ExecError, Kernel, Stage};

use crate::device::Gpu;
use crate::nvrtc::{self, Nvrtc};

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

#[derive(Debug)]
pub(crate) struct Loaded {
    pub(crate) func: CudaFunction,
    pub(crate) cfg: LaunchConfig,
}

#[derive(Debug)]
pub(crate) struct Exe {
    pub(crate) stage: Stage,
    pub(crate) kernels: Vec<Loaded>,
    pub(crate) workspace: Vec<Mutex<CudaSlice<u8>>>,
    /// 8 status words per dispatch.
    pub(crate) status: Mutex<CudaSlice<u32>>,
}

impl Executable for Exe {
    fn stage_name(&self) -> &str {
        &self.stage.name
    }
    fn workspace_len(&self) -> usize {
        self.stage.workspace.len()
    }
}

pub(crate) fn compile_stage(gpu: &Gpu, stage: Stage) -> Result<Exe, String> {
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
        .alloc_zeros::<u32>(STATUS_WORDS * stage.dispatches.len().max(1))
        .map_err(|e| unsupported(format!("status words: {e}")))?;
    Ok(Exe {
        stage,
        kernels,
        workspace,
        status: Mutex::new(status),
    })
}
