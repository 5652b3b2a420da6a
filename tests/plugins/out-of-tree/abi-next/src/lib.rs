//! A plugin that claims the next ABI major: the loader must reject it in one line ("ABI version mismatch").

use abi_stable::export_root_module;
use abi_stable::prefix_type::PrefixTypeTrait;
use abi_stable::std_types::{RBoxError, RResult, RStr};
use loom_plugin_api::{ABI_MAJOR, HalDriverBox, LoomPlugin, LoomPlugin_Ref, PluginKind, Probe, error, guard_probe};

#[export_root_module]
pub fn root_module() -> LoomPlugin_Ref {
    LoomPlugin {
        abi_major: ABI_MAJOR + 1,
        abi_minor: 0,
        id: RStr::from_str("next-0001"),
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
    guard_probe(|| Probe::available(1, "from the future"))
}

extern "C" fn hal() -> RResult<HalDriverBox, RBoxError> {
    RResult::RErr(error("never called"))
}
