//! The driver: wgpu's Vulkan adapters (the probe, the device list), the [`LimitsProfile`] a device is opened
//! with and the WGSL emitter's limits derived from it, and opening a device.

use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{RBoxError, ROption, RResult, RString, RVec};
use loom_emit::WgslLimits;
use loom_plugin_api::{
    DeviceInfo, HalControl_TO, HalDevice_TO, HalDeviceBox, HalDeviceParts, HalDeviceWithFiles,
    HalDriver, HalDriver_TO, HalDriverBox, HalFiles_TO, Probe, guard,
};

use crate::device::VkDevice;

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

/// Opens vulkan device `index` with `profile`'s limits, its queued file reads and its control (ABI 1.5).
pub fn open_parts(index: u32, profile: LimitsProfile) -> Result<HalDeviceParts, String> {
    let instance = instance();
    let ads = adapters(&instance);
    let dev = open_adapter(&ads, index, profile)?;
    Ok(HalDeviceParts {
        device: HalDevice_TO::from_value(dev.clone(), TD_Opaque),
        files: ROption::RSome(HalFiles_TO::from_value(dev.clone(), TD_Opaque)),
        control: ROption::RSome(HalControl_TO::from_value(dev, TD_Opaque)),
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

pub(crate) fn adapter_name(a: &wgpu::Adapter) -> String {
    let i = a.get_info();
    format!("{} ({:?}, {})", i.name, i.device_type, i.driver)
}

const NO_ADAPTER: &str = "no Vulkan adapter found (needs the Vulkan loader libvulkan.so.1 and a driver, e.g. \
                          Debian's libvulkan1 and mesa-vulkan-drivers for lavapipe)";

pub(crate) fn probe_adapters() -> Probe {
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
