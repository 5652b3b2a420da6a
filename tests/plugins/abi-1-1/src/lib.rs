//! `abi11-0001`: a codec plugin exporting the root module exactly as ABI 1.1 declared it
//! (`loom_plugin_api::abi_1_1::LoomPlugin`, with `codec` and no `profile` field), standing in for every plugin
//! built before 1.2. `host/loom-plugins/tests/old_abi.rs` checks that the loader still loads it, reads its
//! `codec` field and reads `profile` as absent.

use abi_stable::export_root_module;
use abi_stable::prefix_type::PrefixTypeTrait;
use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{RBoxError, RResult, RStr};
use loom_plugin_api::abi_1_1::{LoomPlugin, LoomPlugin_Ref};
use loom_plugin_api::{
    ABI_MAJOR, AudioCodecBox, Codec, Codec_TO, CodecBox, HalDriverBox, ImageCodecBox, PluginKind,
    Probe, error, guard, guard_probe, missing,
};

/// The exported root module, in the ABI 1.1 shape.
#[export_root_module]
pub fn root_module() -> LoomPlugin_Ref {
    LoomPlugin {
        abi_major: ABI_MAJOR,
        abi_minor: 1,
        id: RStr::from_str("abi11-0001"),
        kind: PluginKind::CODEC,
        probe,
        hal,
        codec,
    }
    .leak_into_prefix()
}

extern "C" fn probe() -> Probe {
    guard_probe(|| Probe::available(1, "ABI 1.1 test plugin"))
}

extern "C" fn hal() -> RResult<HalDriverBox, RBoxError> {
    RResult::RErr(error("the ABI 1.1 test plugin is not a HAL"))
}

extern "C" fn codec() -> RResult<CodecBox, RBoxError> {
    guard("abi11 codec", || {
        Ok::<_, String>(Codec_TO::from_value(Empty, TD_Opaque))
    })
}

/// A codec with neither an audio nor an image codec.
struct Empty;

impl Codec for Empty {
    fn audio(&self) -> RResult<AudioCodecBox, RBoxError> {
        RResult::RErr(missing("abi11-0001", "audio codec"))
    }
    fn image(&self) -> RResult<ImageCodecBox, RBoxError> {
        RResult::RErr(missing("abi11-0001", "image codec"))
    }
}
