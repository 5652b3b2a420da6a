//! `clash-0001`: an HTTP profile declaring `POST /v1/embeddings`, which the server has built in. The server
//! must reject it in one log line and keep loading the other profiles (`host/loom-serve/tests/server/
//! profiles.rs`).

use abi_stable::export_root_module;
use abi_stable::prefix_type::PrefixTypeTrait;
use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{RBoxError, RResult, RSlice, RStr, RVec};
use loom_plugin_api::{
    ABI_MAJOR, ABI_MINOR, EncodeRequest, HttpMethod, LoomPlugin, LoomPlugin_Ref, ParseContext,
    ParsedRequest, PluginKind, Probe, Profile, Profile_TO, ProfileBox, ProfileError,
    ProfileResponse, ProfileRoute, guard, guard_list, guard_probe, guard_profile,
};

#[export_root_module]
pub fn root_module() -> LoomPlugin_Ref {
    LoomPlugin {
        abi_major: ABI_MAJOR,
        abi_minor: ABI_MINOR,
        id: RStr::from_str("clash-0001"),
        kind: PluginKind::PROFILE,
        probe,
        hal: loom_plugin_api::no_hal,
        codec: loom_plugin_api::no_codec,
        profile,
        hal_files: loom_plugin_api::no_hal_files,
        profile_events: loom_plugin_api::no_profile_events,
        hal_open: loom_plugin_api::no_hal_open,
    }
    .leak_into_prefix()
}

extern "C" fn probe() -> Probe {
    guard_probe(|| Probe::available(1, "test profile with a clashing route"))
}

extern "C" fn profile() -> RResult<ProfileBox, RBoxError> {
    guard("clash profile", || {
        Ok::<_, String>(Profile_TO::from_value(Clash, TD_Opaque))
    })
}

struct Clash;

impl Profile for Clash {
    fn routes(&self) -> RVec<ProfileRoute> {
        guard_list(|| {
            vec![
                ProfileRoute::new(HttpMethod::POST, "/clash/ok", "embeddings"),
                ProfileRoute::new(HttpMethod::POST, "/v1/embeddings", "embeddings"),
            ]
            .into()
        })
    }
    fn parse(
        &self,
        _: u32,
        _: RStr<'_>,
        _: RSlice<'_, u8>,
        _: ParseContext,
    ) -> RResult<ParsedRequest, ProfileError> {
        guard_profile("parse", || Err(ProfileError::internal("never mounted")))
    }
    fn encode(&self, _: u32, _: &EncodeRequest) -> RResult<ProfileResponse, ProfileError> {
        guard_profile("encode", || Err(ProfileError::internal("never mounted")))
    }
}
