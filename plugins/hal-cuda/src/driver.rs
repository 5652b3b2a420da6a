//! The driver: the probe, the device list, and NVRTC's architecture for a device's compute capability.

use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{RBoxError, ROption, RResult, RString, RVec};
use cudarc::driver::CudaContext;
use loom_plugin_api::{
    DeviceInfo, HalControl_TO, HalDevice_TO, HalDeviceBox, HalDeviceParts, HalDriver, HalDriver_TO,
    HalDriverBox, Probe, guard,
};

use crate::device::CudaDev;
use crate::missing_libraries;

pub(crate) fn probe_cuda() -> Probe {
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

/// Opens cuda device `index` with its control (ABI 1.5: run-time bounds, executable release); no file reads.
pub(crate) fn open_parts(index: u32) -> Result<HalDeviceParts, String> {
    if let Some(why) = crate::missing_libraries() {
        return Err(why);
    }
    let dev = CudaDev::open(index as usize)?;
    Ok(HalDeviceParts {
        device: HalDevice_TO::from_value(dev.clone(), TD_Opaque),
        files: ROption::RNone,
        control: ROption::RSome(HalControl_TO::from_value(dev, TD_Opaque)),
    })
}

/// NVRTC's `--gpu-architecture` for a compute capability: the virtual architecture (`compute_XY`), whose PTX
/// the driver JIT-compiles for the device when the module is loaded.
pub(crate) fn arch_name(major: i32, minor: i32) -> &'static str {
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
