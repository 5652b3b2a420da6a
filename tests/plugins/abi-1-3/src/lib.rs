//! `abi13-0001`: an HTTP profile plugin exporting the root module exactly as ABI 1.3 declared it
//! (`loom_plugin_api::abi_1_3::LoomPlugin`, with `profile` and `hal_files` and no `profile_events` field),
//! standing in for every profile built before 1.4. `host/loom-plugins/tests/old_abi.rs` checks that the
//! loader still loads it, calls its profile through that shape and reads `profile_events` as absent.

use abi_stable::export_root_module;
use abi_stable::prefix_type::PrefixTypeTrait;
use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{RBoxError, RResult, RSlice, RStr, RVec};
use loom_plugin_api::abi_1_3::{LoomPlugin, LoomPlugin_Ref};
use loom_plugin_api::{
    ABI_MAJOR, EncodeRequest, HttpMethod, ParseContext, ParsedRequest, PluginKind, Probe, Profile,
    Profile_TO, ProfileBox, ProfileError, ProfileResponse, ProfileRoute, guard, guard_list,
    guard_probe, guard_profile,
};

/// The exported root module, in the ABI 1.3 shape.
#[export_root_module]
pub fn root_module() -> LoomPlugin_Ref {
    LoomPlugin {
        abi_major: ABI_MAJOR,
        abi_minor: 3,
        id: RStr::from_str("abi13-0001"),
        kind: PluginKind::PROFILE,
        probe,
        hal: loom_plugin_api::no_hal,
        codec: loom_plugin_api::no_codec,
        profile,
        hal_files: loom_plugin_api::no_hal_files,
    }
    .leak_into_prefix()
}

extern "C" fn probe() -> Probe {
    guard_probe(|| Probe::available(1, "ABI 1.3 test plugin"))
}

extern "C" fn profile() -> RResult<ProfileBox, RBoxError> {
    guard("abi13 profile", || {
        Ok::<_, String>(Profile_TO::from_value(Old, TD_Opaque))
    })
}

/// A profile with one route whose parse always refuses the body.
struct Old;

impl Profile for Old {
    fn routes(&self) -> RVec<ProfileRoute> {
        guard_list(|| vec![ProfileRoute::new(HttpMethod::POST, "/old", "embeddings")].into())
    }
    fn parse(
        &self,
        _: u32,
        _: RStr<'_>,
        _: RSlice<'_, u8>,
        _: ParseContext,
    ) -> RResult<ParsedRequest, ProfileError> {
        guard_profile("parse", || {
            Err(ProfileError::bad_request("abi13 parses nothing"))
        })
    }
    fn encode(&self, _: u32, _: &EncodeRequest) -> RResult<ProfileResponse, ProfileError> {
        guard_profile("encode", || Err(ProfileError::internal("never called")))
    }
}
