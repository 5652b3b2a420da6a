//! `abi10-0001`: a plugin exporting the root module exactly as ABI 1.0 declared it
//! (`loom_plugin_api::abi_1_0::LoomPlugin`, no `codec` field), standing in for every plugin built before 1.1.
//! `tests/integration/codec_conformance.rs` checks that the loader still loads it and reads `codec` as absent.

use abi_stable::export_root_module;
use abi_stable::prefix_type::PrefixTypeTrait;
use abi_stable::std_types::{RBoxError, RResult, RStr};
use loom_plugin_api::abi_1_0::{LoomPlugin, LoomPlugin_Ref};
use loom_plugin_api::{ABI_MAJOR, HalDriverBox, PluginKind, Probe, error, guard_probe};

/// The exported root module, in the ABI 1.0 shape.
#[export_root_module]
pub fn root_module() -> LoomPlugin_Ref {
    LoomPlugin {
        abi_major: ABI_MAJOR,
        abi_minor: 0,
        id: RStr::from_str("abi10-0001"),
        kind: PluginKind::HAL,
        probe,
        hal,
    }
    .leak_into_prefix()
}

extern "C" fn probe() -> Probe {
    guard_probe(|| Probe::available(1, "ABI 1.0 test plugin"))
}

extern "C" fn hal() -> RResult<HalDriverBox, RBoxError> {
    RResult::RErr(error("the ABI 1.0 test plugin opens no devices"))
}
