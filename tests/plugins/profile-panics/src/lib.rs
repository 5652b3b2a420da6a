//! `ppanic-0001`: an HTTP profile whose calls panic, caught by `guard_profile` as every profile must:
//! `POST /test/panic-parse` panics in `parse`; `POST /test/panic-encode` parses (its body is the model name,
//! the one record is the text `x`) and panics in `encode`. The server must answer 500 with the panic
//! message and keep serving (`host/loom-serve/tests/server/profiles.rs`).

use abi_stable::export_root_module;
use abi_stable::prefix_type::PrefixTypeTrait;
use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{RBoxError, RResult, RSlice, RStr, RString, RVec};
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
        id: RStr::from_str("ppanic-0001"),
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
    guard_probe(|| Probe::available(1, "test profile that panics"))
}

extern "C" fn profile() -> RResult<ProfileBox, RBoxError> {
    guard("panics profile", || {
        Ok::<_, String>(Profile_TO::from_value(Panics, TD_Opaque))
    })
}

struct Panics;

impl Profile for Panics {
    fn routes(&self) -> RVec<ProfileRoute> {
        guard_list(|| {
            vec![
                ProfileRoute::new(HttpMethod::POST, "/test/panic-parse", "embeddings"),
                ProfileRoute::new(HttpMethod::POST, "/test/panic-encode", "embeddings"),
            ]
            .into()
        })
    }
    fn parse(
        &self,
        route: u32,
        _: RStr<'_>,
        body: RSlice<'_, u8>,
        _: ParseContext,
    ) -> RResult<ParsedRequest, ProfileError> {
        guard_profile("parse", || {
            if route == 0 {
                panic!("this test profile panics in parse on purpose");
            }
            let mut record = vec![0u8; 8];
            record.push(b'x');
            Ok(ParsedRequest {
                model: RString::from(String::from_utf8_lossy(body.as_slice()).into_owned()),
                records: vec![RVec::from(record)].into(),
                state: RVec::new(),
            })
        })
    }
    fn encode(&self, _: u32, _: &EncodeRequest) -> RResult<ProfileResponse, ProfileError> {
        guard_profile("encode", || {
            panic!("this test profile panics in encode on purpose")
        })
    }
}
