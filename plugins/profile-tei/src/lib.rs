//! `tei-0001`: an HTTP profile plugin speaking Hugging Face text-embeddings-inference's native embedding
//! route, for any model of the `embeddings` role:
//!
//! ```text
//! POST /embed {"inputs": string | [string] | [id] | [[id]], "normalize"?: bool (true),
//!              "truncate"?: bool, "model"?: string}
//!   -> 200 [[f32, ...], ...]        one array per input, in order (a single string gives one array)
//! ```
//!
//! * `inputs`: text, a list of texts, one list of token ids or a list of lists of token ids (ids in
//!   `0..=2147483647`), each becoming one embeddings protocol record (`docs/serving/finite.md`: kind 0 text
//!   or 1 ids, a reserved i32, the payload), exactly as `POST /v1/embeddings` builds them. An empty list is
//!   a 422; an empty text is one input.
//! * `normalize` (default `true`, as in TEI): the profile L2-normalises every returned vector (a zero vector
//!   stays zero). The model may already return unit vectors; normalising again changes them by rounding at
//!   most. `false` returns the model's vectors unchanged (identical to `/v1/embeddings`).
//! * `truncate`: accepted as a boolean for compatibility and **not acted on**: the protocol record carries
//!   no truncation flag, so the package's own capacity rule decides (its `max_tokens`), whatever the value.
//! * `model` (not in TEI, which serves one model): the model to run. When it is absent the server runs the
//!   only registered model of the `embeddings` role and answers 400 naming them when there are several.
//!   This is the simpler option: the host does not pass its model list into the plugin.
//! * `dimensions` and `prompt_name` (TEI options for Matryoshka truncation and prompts) are refused with a
//!   422 when set; `truncation_direction` is ignored like `truncate`; other unknown fields are ignored.
//!
//! Errors: a body that is not JSON is a 400; a content type other than JSON (`application/json`, `*+json`,
//! none, or curl's default `application/x-www-form-urlencoded`, which the built-in routes accept too) is a
//! 415; a wrong field is a
//! 422 (TEI's status for validation errors). The server answers with the OpenAI error shape (TEI's own
//! bodies are `{"error", "error_type"}`; clients checking only the status work with both). Usage units
//! are not part of TEI's response body and are dropped.
//!
//! Not here: TEI's `/rerank`, `/predict`, `/embed_sparse`, `/embed_all`, `/tokenize`, `/info`.
//!
//! Every entry point runs under `loom_plugin_api::guard_profile` / `guard_probe`.

use abi_stable::export_root_module;
use abi_stable::prefix_type::PrefixTypeTrait;
use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{RBoxError, RResult, RSlice, RStr, RString, RVec};
use loom_plugin_api::records;
use loom_plugin_api::{
    ABI_MAJOR, ABI_MINOR, CodecBox, EncodeRequest, ErrorClass, HttpMethod, LoomPlugin,
    LoomPlugin_Ref, ParseContext, ParsedRequest, PluginKind, Probe, Profile, Profile_TO,
    ProfileBox, ProfileError, ProfileResponse, ProfileRoute, error, guard, guard_list, guard_probe,
    guard_profile,
};
use serde_json::Value as Json;

/// This plugin's id.
pub const PLUGIN_ID: &str = "tei-0001";

/// The exported root module.
#[export_root_module]
pub fn root_module() -> LoomPlugin_Ref {
    LoomPlugin {
        abi_major: ABI_MAJOR,
        abi_minor: ABI_MINOR,
        id: RStr::from_str(PLUGIN_ID),
        kind: PluginKind::PROFILE,
        probe,
        hal: loom_plugin_api::no_hal,
        codec,
        profile,
        hal_files: loom_plugin_api::no_hal_files,
        profile_events: loom_plugin_api::no_profile_events,
        hal_open: loom_plugin_api::no_hal_open,
    }
    .leak_into_prefix()
}

extern "C" fn probe() -> Probe {
    guard_probe(|| Probe::available(1, "HTTP profile: text-embeddings-inference (POST /embed)"))
}

extern "C" fn codec() -> RResult<CodecBox, RBoxError> {
    RResult::RErr(error(format_args!(
        "{PLUGIN_ID} is a profile plugin, not a codec"
    )))
}

extern "C" fn profile() -> RResult<ProfileBox, RBoxError> {
    guard("tei-0001 profile", || Ok::<_, String>(profile_box()))
}

/// The profile, for in-process use.
pub fn profile_box() -> ProfileBox {
    Profile_TO::from_value(Tei, TD_Opaque)
}

/// The index of `POST /embed` in [`Profile::routes`].
const EMBED: u32 = 0;

struct Tei;

impl Profile for Tei {
    fn routes(&self) -> RVec<ProfileRoute> {
        guard_list(|| {
            RVec::from(vec![ProfileRoute::new(
                HttpMethod::POST,
                "/embed",
                "embeddings",
            )])
        })
    }

    fn parse(
        &self,
        route: u32,
        content_type: RStr<'_>,
        body: RSlice<'_, u8>,
        context: ParseContext,
    ) -> RResult<ParsedRequest, ProfileError> {
        guard_profile("parse", || match route {
            EMBED => parse_embed(content_type.as_str(), body.as_slice(), context.max_inputs),
            other => Err(ProfileError::internal(format!("no route {other}"))),
        })
    }

    fn encode(
        &self,
        route: u32,
        request: &EncodeRequest,
    ) -> RResult<ProfileResponse, ProfileError> {
        guard_profile("encode", || match route {
            EMBED => encode_embed(request),
            other => Err(ProfileError::internal(format!("no route {other}"))),
        })
    }
}

fn invalid(message: impl Into<String>) -> ProfileError {
    ProfileError::new(ErrorClass::UNPROCESSABLE, message)
}

/// The token ids of `inputs` as an embeddings record.
fn ids_record(ids: &[Json]) -> Result<RVec<u8>, ProfileError> {
    let bad = || invalid("`inputs`: token ids must be integers in 0..=2147483647");
    let ids: Vec<i64> = ids
        .iter()
        .map(|v| v.as_i64().ok_or_else(bad))
        .collect::<Result<_, _>>()?;
    records::ids_record(ids).map(RVec::from).map_err(|_| bad())
}

fn text_record(s: &str) -> RVec<u8> {
    RVec::from(records::text_record(s))
}

fn records(inputs: &Json) -> Result<Vec<RVec<u8>>, ProfileError> {
    Ok(match inputs {
        Json::String(s) => vec![text_record(s)],
        Json::Array(a) if a.is_empty() => return Err(invalid("`inputs` cannot be empty")),
        Json::Array(a) if a.iter().all(Json::is_string) => a
            .iter()
            .map(|s| text_record(s.as_str().unwrap_or_default()))
            .collect(),
        Json::Array(a) if a.iter().all(Json::is_number) => vec![ids_record(a)?],
        Json::Array(a) if a.iter().all(Json::is_array) => a
            .iter()
            .map(|v| ids_record(v.as_array().map(Vec::as_slice).unwrap_or_default()))
            .collect::<Result<_, _>>()?,
        _ => {
            return Err(invalid(
                "`inputs` must be a string, a list of strings, a list of token ids or a list of lists of token ids",
            ));
        }
    })
}

fn flag(body: &Json, name: &str, default: bool) -> Result<bool, ProfileError> {
    match body.get(name) {
        None | Some(Json::Null) => Ok(default),
        Some(Json::Bool(b)) => Ok(*b),
        Some(_) => Err(invalid(format!("`{name}` must be a boolean"))),
    }
}

/// `POST /embed`: the body to records; the state is one byte, `normalize`.
fn parse_embed(
    content_type: &str,
    body: &[u8],
    max_inputs: u64,
) -> Result<ParsedRequest, ProfileError> {
    let media = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    // curl's `-d` sends `application/x-www-form-urlencoded`; the built-in routes read such bodies as JSON
    // too, so this profile does (the README's examples omit the header).
    let json_like = media.is_empty()
        || media == "application/json"
        || media.ends_with("+json")
        || media == "application/x-www-form-urlencoded";
    if !json_like {
        return Err(ProfileError::new(
            ErrorClass::UNSUPPORTED_MEDIA_TYPE,
            format!(
                "expected a JSON body (Content-Type: application/json), found {content_type:?}"
            ),
        ));
    }
    let body: Json = serde_json::from_slice(body)
        .map_err(|e| ProfileError::bad_request(format!("the body is not valid JSON: {e}")))?;
    if !body.is_object() {
        return Err(invalid("the body must be a JSON object with `inputs`"));
    }
    let inputs = body
        .get("inputs")
        .ok_or_else(|| invalid("`inputs` is required"))?;
    let normalize = flag(&body, "normalize", true)?;
    flag(&body, "truncate", false)?;
    for unsupported in ["dimensions", "prompt_name"] {
        if body.get(unsupported).is_some_and(|v| !v.is_null()) {
            return Err(invalid(format!(
                "`{unsupported}` is not supported by this server"
            )));
        }
    }
    let model = match body.get("model") {
        None | Some(Json::Null) => String::new(),
        Some(Json::String(s)) if !s.is_empty() => s.clone(),
        Some(_) => return Err(invalid("`model` must be a non-empty string")),
    };
    let records = records(inputs)?;
    if records.len() as u64 > max_inputs {
        return Err(invalid(format!(
            "batch size {} > maximum allowed batch size {max_inputs}",
            records.len()
        )));
    }
    Ok(ParsedRequest {
        model: RString::from(model),
        records: RVec::from(records),
        state: RVec::from(vec![u8::from(normalize)]),
    })
}

/// `v / |v|` (a zero vector stays zero); the norm is accumulated in f64.
pub fn l2_normalize(v: &mut [f32]) {
    let norm = v
        .iter()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum::<f64>()
        .sqrt();
    if norm > 0.0 {
        for x in v {
            *x = (f64::from(*x) / norm) as f32;
        }
    }
}

/// The results to TEI's `[[f32, ...], ...]`: each record's first row is its vector.
fn encode_embed(request: &EncodeRequest) -> Result<ProfileResponse, ProfileError> {
    let normalize = request.state.first().copied().unwrap_or(1) != 0;
    let mut vectors: Vec<Vec<f32>> = Vec::with_capacity(request.results.len());
    for r in request.results.iter() {
        let mut v = r.rows.first().map(|row| row.to_vec()).unwrap_or_default();
        if normalize {
            l2_normalize(&mut v);
        }
        vectors.push(v);
    }
    let body = serde_json::to_vec(&vectors)
        .map_err(|e| ProfileError::internal(format!("encoding the response: {e}")))?;
    Ok(ProfileResponse {
        content_type: RString::from("application/json"),
        body: RVec::from(body),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use loom_plugin_api::RecordResult;

    fn parse(body: &str) -> Result<ParsedRequest, ProfileError> {
        parse_embed("application/json", body.as_bytes(), 8)
    }

    fn err(body: &str) -> (u16, String) {
        let e = parse(body).unwrap_err();
        (e.class.0, e.message.into_string())
    }

    #[test]
    fn inputs_become_the_built_in_records() {
        let p = parse(r#"{"inputs": "hi"}"#).unwrap();
        assert_eq!(p.model.as_str(), "");
        assert_eq!(p.records.len(), 1);
        assert_eq!(p.records[0].as_slice(), b"\0\0\0\0\0\0\0\0hi");
        assert_eq!(p.state.as_slice(), [1]);
        let p = parse(r#"{"inputs": ["a", "bc"], "normalize": false, "model": "m"}"#).unwrap();
        assert_eq!(p.model.as_str(), "m");
        assert_eq!(p.records[1].as_slice(), b"\0\0\0\0\0\0\0\0bc");
        assert_eq!(p.state.as_slice(), [0]);
        let p = parse(r#"{"inputs": [[1, 2], [3]], "truncate": true}"#).unwrap();
        assert_eq!(p.records.len(), 2);
        assert_eq!(
            p.records[0].as_slice(),
            [1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0]
        );
        for ct in [
            "application/json; charset=utf-8",
            "",
            "application/x-www-form-urlencoded",
        ] {
            let p = parse_embed(ct, br#"{"inputs": [7]}"#, 8).unwrap();
            assert_eq!(p.records.len(), 1);
        }
    }

    #[test]
    fn bad_bodies_are_clear_client_errors() {
        assert_eq!(err("{").0, 400);
        assert!(err("{").1.starts_with("the body is not valid JSON"));
        assert_eq!(err("{}"), (422, "`inputs` is required".into()));
        assert_eq!(
            err(r#"{"inputs": []}"#),
            (422, "`inputs` cannot be empty".into())
        );
        assert_eq!(err(r#"{"inputs": [1, "a"]}"#).0, 422);
        assert_eq!(err(r#"{"inputs": [-1]}"#).0, 422);
        assert_eq!(
            err(r#"{"inputs": "a", "normalize": "yes"}"#),
            (422, "`normalize` must be a boolean".into())
        );
        assert_eq!(err(r#"{"inputs": "a", "dimensions": 3}"#).0, 422);
        assert_eq!(err(r#"{"inputs": "a", "model": 3}"#).0, 422);
        assert_eq!(err(r#"[1]"#).0, 422);
        let many = format!(r#"{{"inputs": {:?}}}"#, vec!["x"; 9]);
        assert!(
            err(&many)
                .1
                .contains("batch size 9 > maximum allowed batch size 8")
        );
        let e = parse_embed("text/plain", b"{}", 8).unwrap_err();
        assert_eq!(e.class, ErrorClass::UNSUPPORTED_MEDIA_TYPE);
    }

    #[test]
    fn encode_normalizes_on_request() {
        let results = vec![
            RecordResult {
                rows: vec![RVec::from(vec![3.0f32, 4.0])].into(),
            },
            RecordResult {
                rows: vec![RVec::from(vec![0.0f32, 0.0])].into(),
            },
        ];
        let mut req = EncodeRequest {
            model: "m".into(),
            state: vec![1u8].into(),
            results: results.into(),
            units: 2,
        };
        let r = encode_embed(&req).unwrap();
        assert_eq!(r.content_type.as_str(), "application/json");
        assert_eq!(r.body.as_slice(), b"[[0.6,0.8],[0.0,0.0]]");
        req.state = vec![0u8].into();
        let r = encode_embed(&req).unwrap();
        assert_eq!(r.body.as_slice(), b"[[3.0,4.0],[0.0,0.0]]");
    }

    #[test]
    fn the_profile_object_guards_its_calls() {
        let p = profile_box();
        let routes = p.routes();
        assert_eq!(routes.len(), 1);
        assert_eq!(
            (
                routes[0].method,
                routes[0].path.as_str(),
                routes[0].role.as_str()
            ),
            (HttpMethod::POST, "/embed", "embeddings")
        );
        let e = p
            .parse(
                5,
                RStr::from_str(""),
                RSlice::from_slice(b""),
                ParseContext { max_inputs: 1 },
            )
            .into_result()
            .unwrap_err();
        assert_eq!(e.class, ErrorClass::INTERNAL);
        let probe = probe();
        assert_eq!(probe.devices, 1);
    }
}
