//! A plugin whose probe panics (caught inside the plugin by `guard_probe`, as every plugin must): the loader must
//! report it in one line and keep loading the others.

use abi_stable::export_root_module;
use abi_stable::prefix_type::PrefixTypeTrait;
use abi_stable::std_types::{RBoxError, RResult, RStr};
use loom_plugin_api::{ABI_MAJOR, ABI_MINOR, HalDriverBox, LoomPlugin, LoomPlugin_Ref, PluginKind, Probe, error, guard_probe};

#[export_root_module]
pub fn root_module() -> LoomPlugin_Ref {
    LoomPlugin {
        abi_major: ABI_MAJOR,
        abi_minor: ABI_MINOR,
        id: RStr::from_str("panics-0001"),
        kind: PluginKind::HAL,
        probe,
        hal,
        codec: loom_plugin_api::no_codec,
        profile: loom_plugin_api::no_profile,
        hal_files: loom_plugin_api::no_hal_files,
        profile_events: loom_plugin_api::no_profile_events,
        hal_open: loom_plugin_api::no_hal_open,
    }
    .leak_into_prefix()
}

extern "C" fn probe() -> Probe {
    guard_probe(|| panic!("the probe of this test plugin panics on purpose"))
}

extern "C" fn hal() -> RResult<HalDriverBox, RBoxError> {
    RResult::RErr(error("never called"))
}
