//! The CUDA HAL plugin (`cuda-0001`): the HAL of `loom-plugin-api` on NVIDIA GPUs through cudarc, with every
//! kernel of a stage emitted as CUDA C by `loom-emit` and compiled by NVRTC.
//!
//! * **Dynamic loading.** cudarc is built with `dynamic-loading`: the crate builds and loads with no CUDA
//!   installed. cudarc *panics* on the first call when `libcuda` is missing, so the probe (and [`driver()`])
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
//! * **`submit`** is checked by `hal_queue::commands` (the same checks and texts on every plugin) and runs on
//!   the device's queue thread (`hal-queue`: in order, waits first, failures propagate along fence chains
//!   exactly like `hal-cpu`). A dispatch launches each kernel of the stage on the stream, synchronises, and
//!   reads the status words (decoded by `hal_queue::status`, shared with `hal-vulkan`): a checked-load error
//!   becomes `ExecError::IndexOutOfRange` with the text `hal-cpu` and `loom-reference` give. Commands after a
//!   failed dispatch do not run.
//!
//! **Never executed here**: the machines this was written on have no NVIDIA GPU. What CI checks is that the
//! crate builds, that the probe answers Absent cleanly, that the loader reports it in one line, and
//! (`tests/nvrtc.rs`, with NVRTC and ptxas 12.8 from `scripts/fetch-cuda-tools.sh`) that every kernel of every
//! motif stage and of the HAL conformance suite compiles through [`kernel_ptx`] for `compute_80` and
//! `compute_90` without warnings and assembles with `ptxas -arch=sm_80` / `sm_90`.
//! `scripts/gpu-conformance.sh` runs the HAL conformance suite with this plugin on a machine with a GPU.
//!
//! Modules, as `hal-vulkan`'s: `driver` (the probe, the device list, architectures), `device` (the `HalDevice`
//! calls, the context, stream and queue), `buffer` (staged write/read), `executable` (NVRTC and module loading)
//! and `commands` (running a submission, launching dispatches, reading back the status words).

use abi_stable::export_root_module;
use abi_stable::prefix_type::PrefixTypeTrait;
use abi_stable::std_types::{RBoxError, RResult, RStr};
use loom_plugin_api::{
    ABI_MAJOR, ABI_MINOR, HalDeviceParts, HalDriverBox, LoomPlugin, LoomPlugin_Ref, PluginKind,
    Probe, guard, guard_probe,
};

mod buffer;
mod commands;
mod device;
mod driver;
mod executable;
pub mod nvrtc;

pub use driver::driver;
pub use executable::{PtxError, kernel_ptx, stage_ptx};
pub use nvrtc::Nvrtc;

use driver::probe_cuda;

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
        hal_open,
    }
    .leak_into_prefix()
}

extern "C" fn probe() -> Probe {
    guard_probe(probe_cuda)
}

extern "C" fn hal() -> RResult<HalDriverBox, RBoxError> {
    guard("hal-cuda driver", driver)
}

extern "C" fn hal_open(index: u32) -> RResult<HalDeviceParts, RBoxError> {
    guard("hal-cuda open", || driver::open_parts(index))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::arch_name;
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
