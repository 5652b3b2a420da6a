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
use serve_runtime::package::PackageFiles;
use serve_runtime::registry::ModelInfo;
use std::collections::BTreeMap;
use std::path::PathBuf;

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
        "error": m.error,
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
    let options = match body.get("options") {
        None | Some(Json::Null) => None,
        Some(Json::Object(o)) => Some(o.clone()),
        Some(_) => return Err(ApiError::bad_request("`options` must be an object")),
    };
    Ok(Overrides { device, options })
}

async fn register_files(
    st: &AppState,
    name: String,
    files: PackageFiles,
    ov: Overrides,
) -> Result<Response, ApiError> {
    let reg = st.registry.clone();
    let info = tokio::task::spawn_blocking(move || reg.register(&name, files, ov))
        .await
        .map_err(|e| ApiError::from(serve_runtime::Error::Internal(e.to_string())))??;
    Ok((StatusCode::CREATED, axum::Json(model_json(&info))).into_response())
}

/// `POST /v1/models {name, base, device?, options?}`: a server-local package directory.
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
    let name = match body.get("name").and_then(Json::as_str) {
        Some(n) => n.to_string(),
        None => PackageFiles::Dir(base.clone())
            .default_name()
            .map_err(ApiError::bad_request)?,
    };
    register_files(&st, name, PackageFiles::Dir(base), ov).await
}

/// `POST /v1/models/upload` (multipart): text fields `name`, `device`, `options` (JSON); every file part's
/// file name is its package-relative path. Parameter files are not uploaded: they resolve under the server's
/// `--params-root`.
pub(crate) async fn upload(State(st): St, mut mp: Multipart) -> Result<Response, ApiError> {
    let mut files = BTreeMap::new();
    let mut meta = serde_json::Map::new();
    let mut total = 0usize;
    while let Some(field) = mp.next_field().await.map_err(|e| {
        ApiError::new(
            e.status(),
            "invalid_request_error",
            "invalid_multipart",
            e.body_text(),
        )
    })? {
        let fname = field.file_name().map(str::to_string);
        let name = field.name().unwrap_or_default().to_string();
        let data = field.bytes().await.map_err(|e| {
            ApiError::new(
                e.status(),
                "invalid_request_error",
                "invalid_multipart",
                e.body_text(),
            )
        })?;
        total += data.len();
        if files.len() > 256 {
            return Err(ApiError::bad_request("an upload holds at most 256 files"));
        }
        match fname {
            Some(f) => {
                let rel =
                    serve_runtime::package::relative("upload", &f, &f).map_err(ApiError::from)?;
                files.insert(rel, data.to_vec());
            }
            None => {
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
    let _ = total;
    if !files.contains_key("model.json") {
        return Err(ApiError::bad_request(
            "the upload has no model.json file part",
        ));
    }
    let pf = PackageFiles::Uploaded {
        files,
        params_root: st.config.params_root.clone(),
    };
    let meta = Json::Object(meta);
    let ov = overrides(&meta)?;
    let name = match meta.get("name").and_then(Json::as_str) {
        Some(n) => n.to_string(),
        None => pf.default_name().map_err(ApiError::bad_request)?,
    };
    register_files(&st, name, pf, ov).await
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
