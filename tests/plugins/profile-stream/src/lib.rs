//! `pstream-0001`: an HTTP profile with streamed routes (ABI 1.4, `loom_plugin_api::ProfileEvents`), for the
//! server tests (`host/loom-serve/tests/server/profiles.rs`):
//!
//! * `POST /test/stream-embed` `{"model": string, "inputs": [string]}` streams NDJSON
//!   (`application/x-ndjson`), one line per event: `{"event":"start","total":N}`, then per input as it
//!   finishes `{"event":"result","index":I,"done":D,"embedding":[...]}` or
//!   `{"event":"error","index":I,"done":D,"status":S,"code":C,"message":M}`, then
//!   `{"event":"end","done":N,"units":U}`. The model name must be in the state handed back.
//! * `POST /test/stream-panic` (same body) streams the START line, then panics in `encode_event` on the first
//!   result: the server must end that stream without an END line and keep serving.
//! * `POST /test/one-body` (same body) is not streamed: `encode` answers `{"count": N}` in one body.

use abi_stable::export_root_module;
use abi_stable::prefix_type::PrefixTypeTrait;
use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{RBoxError, RResult, RSlice, RStr, RString, RVec};
use loom_plugin_api::{
    ABI_MAJOR, ABI_MINOR, EncodeRequest, EventKind, HttpMethod, LoomPlugin, LoomPlugin_Ref,
    ParseContext, ParsedRequest, PluginKind, Probe, Profile, Profile_TO, ProfileBox, ProfileError,
    ProfileEvent, ProfileEvents, ProfileEvents_TO, ProfileEventsBox, ProfileResponse, ProfileRoute,
    StreamRoute, guard, guard_list, guard_probe, guard_profile,
};
use serde_json::{Value as Json, json};

#[export_root_module]
pub fn root_module() -> LoomPlugin_Ref {
    LoomPlugin {
        abi_major: ABI_MAJOR,
        abi_minor: ABI_MINOR,
        id: RStr::from_str("pstream-0001"),
        kind: PluginKind::PROFILE,
        probe,
        hal: loom_plugin_api::no_hal,
        codec: loom_plugin_api::no_codec,
        profile,
        hal_files: loom_plugin_api::no_hal_files,
        profile_events,
        hal_open: loom_plugin_api::no_hal_open,
    }
    .leak_into_prefix()
}

extern "C" fn probe() -> Probe {
    guard_probe(|| Probe::available(1, "test profile with streamed routes"))
}

extern "C" fn profile() -> RResult<ProfileBox, RBoxError> {
    guard("stream profile", || {
        Ok::<_, String>(Profile_TO::from_value(Stream, TD_Opaque))
    })
}

extern "C" fn profile_events() -> RResult<ProfileEventsBox, RBoxError> {
    guard("stream profile events", || {
        Ok::<_, String>(ProfileEvents_TO::from_value(Stream, TD_Opaque))
    })
}

const EMBED: u32 = 0;
const PANIC: u32 = 1;

struct Stream;

/// An embeddings protocol record for a text: kind 0, a reserved i32, the bytes.
fn text_record(text: &str) -> RVec<u8> {
    let mut r = vec![0u8; 8];
    r.extend_from_slice(text.as_bytes());
    r.into()
}

fn line(v: Json) -> RVec<u8> {
    let mut b = serde_json::to_vec(&v).unwrap_or_default();
    b.push(b'\n');
    b.into()
}

impl Profile for Stream {
    fn routes(&self) -> RVec<ProfileRoute> {
        guard_list(|| {
            vec![
                ProfileRoute::new(HttpMethod::POST, "/test/stream-embed", "embeddings"),
                ProfileRoute::new(HttpMethod::POST, "/test/stream-panic", "embeddings"),
                ProfileRoute::new(HttpMethod::POST, "/test/one-body", "embeddings"),
            ]
            .into()
        })
    }

    fn parse(
        &self,
        _: u32,
        _: RStr<'_>,
        body: RSlice<'_, u8>,
        context: ParseContext,
    ) -> RResult<ParsedRequest, ProfileError> {
        guard_profile("parse", || {
            let v: Json = serde_json::from_slice(body.as_slice())
                .map_err(|e| ProfileError::bad_request(format!("the body is not JSON: {e}")))?;
            let model = v["model"].as_str().unwrap_or_default().to_string();
            let inputs = v["inputs"]
                .as_array()
                .ok_or_else(|| ProfileError::bad_request("`inputs` must be a list of strings"))?;
            if inputs.len() as u64 > context.max_inputs {
                return Err(ProfileError::bad_request("too many inputs"));
            }
            let records = inputs
                .iter()
                .map(|i| i.as_str().map(text_record))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| ProfileError::bad_request("`inputs` must be a list of strings"))?;
            Ok(ParsedRequest {
                model: RString::from(model.clone()),
                records: records.into(),
                state: model.into_bytes().into(),
            })
        })
    }

    fn encode(&self, _: u32, request: &EncodeRequest) -> RResult<ProfileResponse, ProfileError> {
        guard_profile("encode", || {
            Ok(ProfileResponse {
                content_type: "application/json".into(),
                body: line(json!({ "count": request.results.len() })),
            })
        })
    }
}

impl ProfileEvents for Stream {
    fn streams(&self) -> RVec<StreamRoute> {
        guard_list(|| {
            vec![
                StreamRoute::new(EMBED, "application/x-ndjson"),
                StreamRoute::new(PANIC, "application/x-ndjson"),
            ]
            .into()
        })
    }

    fn encode_event(&self, route: u32, e: &ProfileEvent) -> RResult<RVec<u8>, ProfileError> {
        guard_profile("encode_event", || {
            if e.state.as_slice() != e.model.as_str().as_bytes() {
                return Err(ProfileError::internal("the state did not come back"));
            }
            Ok(line(match e.kind {
                EventKind::START => json!({ "event": "start", "total": e.total }),
                EventKind::RESULT if route == PANIC => {
                    panic!("this test profile panics in encode_event on purpose")
                }
                EventKind::RESULT => json!({
                    "event": "result",
                    "index": e.index,
                    "done": e.done,
                    "embedding": e.result.rows.first().map(|r| r.to_vec()).unwrap_or_default(),
                }),
                EventKind::ERROR => json!({
                    "event": "error",
                    "index": e.index,
                    "done": e.done,
                    "status": e.error_status,
                    "code": e.error_code.as_str(),
                    "message": e.error_message.as_str(),
                }),
                EventKind::END => json!({ "event": "end", "done": e.done, "units": e.units }),
                other => return Err(ProfileError::internal(format!("unknown event {}", other.0))),
            }))
        })
    }
}
