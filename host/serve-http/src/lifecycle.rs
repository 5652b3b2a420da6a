//! Model lifecycle routes: list, detail, preparation events, register (server-local directory or multipart
//! upload), unregister, deactivate, activate. Documented in `docs/serving/http.md`.

use crate::error::ApiError;
use crate::state::{AppState, St, body_json};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Multipart, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value as Json, json};
use serve_runtime::model::Overrides;
use serve_runtime::package::{PackageFiles, UploadedParams};
use serve_runtime::registry::ModelInfo;
use std::collections::BTreeMap;
use std::path::PathBuf;
use tokio::io::AsyncWriteExt;

fn model_json(m: &ModelInfo) -> Json {
    json!({
        "id": m.name,
        "object": "model",
        "owned_by": "loom-serve",
        "status": m.status.name(),
        "contract": m.contract,
        "role": m.role,
        "device": m.device,
        "source": m.source,
        "stages": m.stages,
        "device_bytes": m.device_bytes,
        "reserved_bytes": m.reserved_bytes,
        "error": m.error,
        "failed_source": m.failed_source,
    })
}

pub(crate) async fn list_models(State(st): St) -> Response {
    let data: Vec<Json> = st.registry.list().iter().map(model_json).collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

pub(crate) async fn model_detail(
    State(st): St,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let m = st
        .registry
        .get(&name)
        .ok_or_else(|| ApiError::from(serve_runtime::Error::UnknownModel(name.clone())))?;
    Ok(axum::Json(model_json(&m)).into_response())
}

/// How often the event stream looks at a preparation's progress.
const PROGRESS_POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// `GET /v1/models/{name}/events`: the latest preparation's progress as server-sent events, one `progress`
/// event per change (stages compiled of total, parameter bytes placed of total, the error), ending after the
/// event that shows the model out of `preparing` (ready, failed or deactivated). A model that is not preparing
/// gets one event. A model unregistered meanwhile ends the stream with a `removed` event.
pub(crate) async fn model_events(
    State(st): St,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    use axum::response::sse::{Event, KeepAlive, Sse};
    if st.registry.progress(&name).is_none() {
        return Err(ApiError::from(serve_runtime::Error::UnknownModel(name)));
    }
    let reg = st.registry.clone();
    let events = futures_util::stream::unfold(
        (reg, name, None::<u64>, false),
        |(reg, name, last, done)| async move {
            if done {
                return None;
            }
            loop {
                let Some((status, p)) = reg.progress(&name) else {
                    let e = Event::default()
                        .event("removed")
                        .data(json!({"model": name}).to_string());
                    return Some((
                        Ok::<_, std::convert::Infallible>(e),
                        (reg, name, last, true),
                    ));
                };
                let end = status != serve_runtime::registry::Status::Preparing;
                if last != Some(p.version) || end {
                    let data = json!({
                        "model": name,
                        "status": status.name(),
                        "phase": p.phase.name(),
                        "stages_compiled": p.stages_compiled,
                        "stages_total": p.stages_total,
                        "bytes_placed": p.bytes_placed,
                        "bytes_total": p.bytes_total,
                        "error": p.error,
                    });
                    let e = Event::default().event("progress").data(data.to_string());
                    return Some((Ok(e), (reg, name, Some(p.version), end)));
                }
                tokio::time::sleep(PROGRESS_POLL).await;
            }
        },
    );
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// The largest `options` object a registration may send, serialized (a package's own options live in its
/// `model.json`; these are a deployment's overrides).
pub(crate) const MAX_OPTIONS_BYTES: usize = 64 << 10;
/// The most device names a registration's `device` preference list may hold, and the longest name.
pub(crate) const MAX_DEVICES: usize = 16;
pub(crate) const MAX_DEVICE_NAME_BYTES: usize = 64;

fn too_large(message: String) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "invalid_request_error",
        "field_too_large",
        message,
    )
}

fn overrides(body: &Json) -> Result<Overrides, ApiError> {
    let device = match body.get("device") {
        None | Some(Json::Null) => None,
        Some(Json::String(s)) => Some(vec![s.clone()]),
        Some(Json::Array(a)) => Some(
            a.iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    ApiError::bad_request("`device` must be a string or a list of strings")
                })?,
        ),
        Some(_) => {
            return Err(ApiError::bad_request(
                "`device` must be a string or a list of strings",
            ));
        }
    };
    if let Some(d) = &device {
        if d.len() > MAX_DEVICES {
            return Err(too_large(format!(
                "`device` lists {} devices; at most {MAX_DEVICES}",
                d.len()
            )));
        }
        if let Some(n) = d.iter().find(|n| n.len() > MAX_DEVICE_NAME_BYTES) {
            return Err(too_large(format!(
                "`device`: a device name of {} bytes; at most {MAX_DEVICE_NAME_BYTES}",
                n.len()
            )));
        }
    }
    let options = match body.get("options") {
        None | Some(Json::Null) => None,
        Some(Json::Object(o)) => {
            let size = serde_json::to_vec(o).map(|v| v.len()).unwrap_or(usize::MAX);
            if size > MAX_OPTIONS_BYTES {
                return Err(too_large(format!(
                    "`options` is {size} bytes of JSON; at most {MAX_OPTIONS_BYTES}"
                )));
            }
            Some(o.clone())
        }
        Some(_) => return Err(ApiError::bad_request("`options` must be an object")),
    };
    let manifest = match body.get("manifest") {
        None | Some(Json::Null) => None,
        Some(Json::String(m)) => {
            serve_runtime::package::manifest_name(m).map_err(ApiError::bad_request)?;
            Some(m.clone())
        }
        Some(_) => {
            return Err(ApiError::bad_request(
                "`manifest` must be a string (a `.json` file in the package's directory)",
            ));
        }
    };
    Ok(Overrides {
        device,
        options,
        manifest,
    })
}

/// The registration's `replace` (default false): whether a model of this name that serves another role may be
/// replaced.
fn replace_flag(body: &Json) -> Result<bool, ApiError> {
    match body.get("replace") {
        None | Some(Json::Null) => Ok(false),
        Some(Json::Bool(b)) => Ok(*b),
        Some(Json::String(s)) if s == "true" || s == "false" => Ok(s == "true"),
        Some(_) => Err(ApiError::bad_request("`replace` must be true or false")),
    }
}

async fn register_files(
    st: &AppState,
    name: String,
    files: PackageFiles,
    ov: Overrides,
    replace: bool,
) -> Result<Response, ApiError> {
    let reg = st.registry.clone();
    let info =
        tokio::task::spawn_blocking(move || reg.register_replacing(&name, files, ov, replace))
            .await
            .map_err(|e| ApiError::from(serve_runtime::Error::Internal(e.to_string())))??;
    Ok((StatusCode::CREATED, axum::Json(model_json(&info))).into_response())
}

/// `POST /v1/models {name, base, manifest?, device?, options?, replace?}`: a server-local package directory.
pub(crate) async fn register(
    State(st): St,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_json(body)?;
    let base = body.get("base").and_then(Json::as_str).ok_or_else(|| {
        ApiError::bad_request("`base` (an absolute server-local package directory) is required")
    })?;
    let base = PathBuf::from(base);
    if !base.is_absolute() {
        return Err(ApiError::bad_request(format!(
            "`base` must be an absolute path, found {:?}",
            base.display()
        )));
    }
    if !base.is_dir() {
        return Err(ApiError::bad_request(format!(
            "`base` {} is not a directory",
            base.display()
        )));
    }
    let ov = overrides(&body)?;
    let replace = replace_flag(&body)?;
    let name = match body.get("name").and_then(Json::as_str) {
        Some(n) => n.to_string(),
        None => PackageFiles::Dir(base.clone())
            .default_name(ov.manifest_file())
            .map_err(ApiError::bad_request)?,
    };
    register_files(&st, name, PackageFiles::Dir(base), ov, replace).await
}

/// The text fields an upload may carry.
const UPLOAD_FIELDS: &[&str] = &["name", "device", "options", "replace"];

/// The package-relative paths an uploaded `model.json` names: itself, its programs, `definition.sources` and
/// assets. `None` when it is not a JSON object (registration reports what is wrong with it). Entries that are
/// not strings or do not normalise are left out (registration reports them too).
fn named_files(model_json: &[u8]) -> Option<std::collections::BTreeSet<String>> {
    let doc: Json = serde_json::from_slice(model_json).ok()?;
    let mut named = std::collections::BTreeSet::from(["model.json".to_string()]);
    let strings = |v: Option<&Json>| -> Vec<String> {
        match v {
            Some(Json::Object(o)) => o
                .values()
                .filter_map(Json::as_str)
                .map(str::to_string)
                .collect(),
            Some(Json::Array(a)) => a
                .iter()
                .filter_map(Json::as_str)
                .map(str::to_string)
                .collect(),
            _ => Vec::new(),
        }
    };
    let paths = strings(doc.get("programs"))
        .into_iter()
        .chain(strings(
            doc.get("definition").and_then(|d| d.get("sources")),
        ))
        .chain(strings(doc.get("assets")));
    for p in paths {
        if let Ok(rel) = serve_runtime::package::relative("model.json", "", &p) {
            named.insert(rel);
        }
    }
    Some(named)
}

/// `POST /v1/models/upload` (multipart): text fields `name`, `device`, `options` (JSON), `replace`
/// (`true`/`false`); every file part's file name is its package-relative path. File parts named
/// `parameters` are the package's parameter files (checkpoints): streamed to a directory of this upload's
/// own under `--upload-dir` (at most `--max-upload-bytes` in all), where its checkpoint paths then resolve;
/// `prepare` must open each of them. An upload without parameter parts resolves checkpoints under
/// `--params-root`. Every other file part is held in memory (at most `--body-limit` bytes in all). Refused
/// with a 400: a file path or text field sent twice, an unknown text field, and a package file that
/// `model.json` does not name as a program, `definition.sources` entry or asset (the server would never
/// read it).
pub(crate) async fn upload(State(st): St, mut mp: Multipart) -> Result<Response, ApiError> {
    let multipart_error = |e: axum::extract::multipart::MultipartError| {
        ApiError::new(
            e.status(),
            "invalid_request_error",
            "invalid_multipart",
            e.body_text(),
        )
    };
    let mut files = BTreeMap::new();
    let mut meta = serde_json::Map::new();
    let mut params: Option<UploadedParams> = None;
    let (mut memory_bytes, mut param_bytes) = (0usize, 0u64);
    while let Some(mut field) = mp.next_field().await.map_err(multipart_error)? {
        let fname = field.file_name().map(str::to_string);
        let name = field.name().unwrap_or_default().to_string();
        if files.len() + params.as_ref().map_or(0, |p| p.files().len()) > 256 {
            return Err(ApiError::bad_request("an upload holds at most 256 files"));
        }
        if let (Some(f), "parameters") = (&fname, name.as_str()) {
            let rel = serve_runtime::package::relative("upload", "parameters", f)
                .map_err(ApiError::from)?;
            if params.is_none() {
                let parent = st.config.upload_dir();
                params = Some(UploadedParams::create(&parent).map_err(storage_error)?);
            }
            let up = params.as_mut().expect("created above");
            let Some(path) = up.add(&rel).map_err(storage_error)? else {
                return Err(ApiError::bad_request(format!(
                    "the upload has two `parameters` parts for `{rel}`"
                )));
            };
            let mut out = tokio::fs::File::create(&path)
                .await
                .map_err(storage_error)?;
            while let Some(chunk) = field.chunk().await.map_err(multipart_error)? {
                param_bytes += chunk.len() as u64;
                if param_bytes > st.config.max_upload_bytes {
                    return Err(ApiError::new(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "invalid_request_error",
                        "upload_too_large",
                        format!(
                            "the upload's parameter files exceed this server's limit of {} bytes \
                             (--max-upload-bytes)",
                            st.config.max_upload_bytes
                        ),
                    ));
                }
                out.write_all(&chunk).await.map_err(storage_error)?;
            }
            out.flush().await.map_err(storage_error)?;
            continue;
        }
        let data = field.bytes().await.map_err(multipart_error)?;
        memory_bytes += data.len();
        if memory_bytes > st.config.body_limit {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                "upload_too_large",
                format!(
                    "the upload's package files and fields exceed this server's limit of {} bytes \
                     (--body-limit; parameter files go in parts named `parameters`)",
                    st.config.body_limit
                ),
            ));
        }
        match fname {
            Some(f) => {
                let rel =
                    serve_runtime::package::relative("upload", &f, &f).map_err(ApiError::from)?;
                if files.contains_key(&rel) {
                    return Err(ApiError::bad_request(format!(
                        "the upload has two file parts for `{rel}`"
                    )));
                }
                files.insert(rel, data.to_vec());
            }
            None => {
                if !UPLOAD_FIELDS.contains(&name.as_str()) {
                    return Err(ApiError::bad_request(format!(
                        "unknown upload field `{name}` (text fields: {}; files are parts with a file name)",
                        UPLOAD_FIELDS.join(", ")
                    )));
                }
                if meta.contains_key(&name) {
                    return Err(ApiError::bad_request(format!(
                        "the upload has two `{name}` fields"
                    )));
                }
                let text = String::from_utf8(data.to_vec())
                    .map_err(|_| ApiError::bad_request(format!("field `{name}` is not UTF-8")))?;
                let v = if name == "options" {
                    serde_json::from_str(&text)
                        .map_err(|e| ApiError::bad_request(format!("field `options`: {e}")))?
                } else {
                    Json::String(text)
                };
                meta.insert(name, v);
            }
        }
    }
    let Some(doc) = files.get("model.json") else {
        return Err(ApiError::bad_request(
            "the upload has no model.json file part",
        ));
    };
    if let Some(named) = named_files(doc) {
        let unused: Vec<&str> = files
            .keys()
            .filter(|f| !named.contains(*f))
            .map(String::as_str)
            .collect();
        if let Some(first) = unused.first() {
            return Err(ApiError::bad_request(format!(
                "the uploaded file `{first}`{} is not a program, definition source or asset that model.json \
                 names, so the server would never read it (parameter files are sent in parts named \
                 `parameters`)",
                match unused.len() {
                    1 => String::new(),
                    n => format!(" (and {} more)", n - 1),
                }
            )));
        }
    }
    let pf = PackageFiles::Uploaded {
        files,
        params_root: st.config.params_root.clone(),
        params: params.map(std::sync::Arc::new),
    };
    let meta = Json::Object(meta);
    let ov = overrides(&meta)?;
    let replace = replace_flag(&meta)?;
    let name = match meta.get("name").and_then(Json::as_str) {
        Some(n) => n.to_string(),
        None => pf
            .default_name(ov.manifest_file())
            .map_err(ApiError::bad_request)?,
    };
    register_files(&st, name, pf, ov, replace).await
}

/// The server could not store an upload's parameter files; the message names no server path.
fn storage_error(e: std::io::Error) -> ApiError {
    log::warn!("storing uploaded parameter files: {e}");
    ApiError::new(
        StatusCode::INSUFFICIENT_STORAGE,
        "server_error",
        "insufficient_storage",
        "the server could not store the upload's parameter files",
    )
}

pub(crate) async fn unregister(
    State(st): St,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let reg = st.registry.clone();
    let n = name.clone();
    tokio::task::spawn_blocking(move || reg.unregister(&n))
        .await
        .map_err(|e| ApiError::from(serve_runtime::Error::Internal(e.to_string())))??;
    Ok(axum::Json(json!({"id": name, "object": "model", "deleted": true})).into_response())
}

pub(crate) async fn deactivate(
    State(st): St,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let reg = st.registry.clone();
    let info = tokio::task::spawn_blocking(move || reg.deactivate(&name))
        .await
        .map_err(|e| ApiError::from(serve_runtime::Error::Internal(e.to_string())))??;
    Ok(axum::Json(model_json(&info)).into_response())
}

pub(crate) async fn activate(
    State(st): St,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let reg = st.registry.clone();
    let info = tokio::task::spawn_blocking(move || reg.activate(&name))
        .await
        .map_err(|e| ApiError::from(serve_runtime::Error::Internal(e.to_string())))??;
    Ok(axum::Json(model_json(&info)).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_files_are_programs_sources_and_assets_normalised() {
        let doc =
            br#"{"programs": {"prepare": "p.loom", "control": "./c.loom", "kernel": "k/../k.loom"},
            "definition": {"sources": ["lib/a.loom", 3]}, "assets": {"tokenizer": "tok.json"}}"#;
        let named: Vec<String> = named_files(doc).unwrap().into_iter().collect();
        assert_eq!(
            named,
            [
                "c.loom",
                "k.loom",
                "lib/a.loom",
                "model.json",
                "p.loom",
                "tok.json"
            ]
        );
        assert!(named_files(b"not json").is_none());
    }

    #[test]
    fn registration_fields_are_bounded() {
        let big = json!({"options": {"pad": "x".repeat(MAX_OPTIONS_BYTES)}});
        assert_eq!(
            overrides(&big).unwrap_err().status,
            StatusCode::PAYLOAD_TOO_LARGE
        );
        let many: Vec<String> = (0..=MAX_DEVICES).map(|i| format!("cpu:{i}")).collect();
        assert!(overrides(&json!({"device": many})).is_err());
        assert!(overrides(&json!({"device": ["cpu"], "options": {"a": 1}})).is_ok());
        assert!(!replace_flag(&json!({})).unwrap());
        assert!(replace_flag(&json!({"replace": true})).unwrap());
        assert!(replace_flag(&json!({"replace": 1})).is_err());
    }
}
