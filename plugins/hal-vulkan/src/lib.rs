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
//! * **`submit`** checks the submission (`hal_queue::commands`, the same checks and texts on every plugin) and
//!   queues the commands on the device's queue thread (`hal-queue`: in order, waits first, a failure fails the
//!   signal point and every dependent point with the same text). Copies and fills are
//!   recorded into one command encoder; a dispatch records every kernel of the stage (one compute pass each),
//!   then the submission is flushed and the per-dispatch **status words** of the emitter are read back
//!   (decoded by `hal_queue::status`, shared with `hal-cuda`): a checked-load error becomes
//!   `ExecError::IndexOutOfRange` with the text `hal-cpu` and `loom-reference` give.
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
//!
//! Modules, IREE's way: `driver` (the probe, adapters, limits profiles, opening a device), `device` (the
//! `HalDevice` calls, the wgpu device and its queues), `buffer` (allocation, staged write/read), `executable`
//! (stage compilation, pipelines), `commands` (running a submission, recording dispatches, reading back the
//! status words) and `files` (queued file reads).
//!
//! The crate is both a `cdylib` (the plugin) and an `rlib` ([`driver()`], [`driver_with`], [`open_with_files`]).

use abi_stable::export_root_module;
use abi_stable::prefix_type::PrefixTypeTrait;
use abi_stable::std_types::{RBoxError, RResult, RStr};
use loom_plugin_api::{
    ABI_MAJOR, ABI_MINOR, HalDeviceParts, HalDeviceWithFiles, HalDriverBox, LoomPlugin,
    LoomPlugin_Ref, PluginKind, Probe, guard, guard_probe,
};

mod buffer;
mod commands;
mod device;
mod driver;
mod executable;
mod files;

pub use driver::{LimitsProfile, driver, driver_with, open_parts, open_with_files, wgsl_limits};

use driver::probe_adapters;

/// This plugin's id.
pub const PLUGIN_ID: &str = "vulkan-0001";

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
    guard_probe(probe_adapters)
}

extern "C" fn hal() -> RResult<HalDriverBox, RBoxError> {
    guard("hal-vulkan driver", || {
        Ok::<_, String>(driver_with(LimitsProfile::from_env()?))
    })
}

extern "C" fn hal_open(index: u32) -> RResult<HalDeviceParts, RBoxError> {
    guard("hal-vulkan open", || {
        open_parts(index, LimitsProfile::from_env()?)
    })
}

extern "C" fn hal_files(index: u32) -> RResult<HalDeviceWithFiles, RBoxError> {
    guard("hal-vulkan open with files", || {
        open_with_files(index, LimitsProfile::from_env()?)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use loom_emit::WgslLimits;
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
}
