//! `abi14-0001`: a HAL plugin exporting the root module exactly as ABI 1.4 declared it
//! (`loom_plugin_api::abi_1_4::LoomPlugin`, with `profile_events` and no `hal_open` field), standing in for every
//! HAL built before 1.5 (no run-time bounds, no executable release). `host/loom-plugins/tests/old_abi.rs` checks
//! that the loader still loads it, opens its driver through that shape and reads `hal_open` as absent.

use abi_stable::export_root_module;
use abi_stable::prefix_type::PrefixTypeTrait;
use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{RBoxError, RResult, RStr, RVec};
use loom_plugin_api::abi_1_4::{LoomPlugin, LoomPlugin_Ref};
use loom_plugin_api::{
    ABI_MAJOR, DeviceInfo, HalDeviceBox, HalDriver, HalDriver_TO, HalDriverBox, PluginKind, Probe,
    guard, guard_probe,
};

/// The exported root module, in the ABI 1.4 shape.
#[export_root_module]
pub fn root_module() -> LoomPlugin_Ref {
    LoomPlugin {
        abi_major: ABI_MAJOR,
        abi_minor: 4,
        id: RStr::from_str("abi14-0001"),
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
    guard_probe(|| Probe::available(1, "ABI 1.4 test plugin"))
}

extern "C" fn hal() -> RResult<HalDriverBox, RBoxError> {
    guard("abi14 driver", || {
        Ok::<_, String>(HalDriver_TO::from_value(OneDevice, TD_Opaque))
    })
}

/// A driver with one device that cannot be opened.
#[derive(Debug)]
struct OneDevice;

impl HalDriver for OneDevice {
    fn devices(&self) -> RVec<DeviceInfo> {
        RVec::from(vec![DeviceInfo {
            name: "abi14 device".into(),
            backend: "abi14".into(),
            memory_bytes: 0,
        }])
    }
    fn open(&self, index: u32) -> RResult<HalDeviceBox, RBoxError> {
        guard("open", || Err(format!("abi14-0001 has no device {index}")))
    }
}
