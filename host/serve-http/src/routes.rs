//! Routes, request parsing into protocol records, and response encoding.

use crate::error::ApiError;
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Multipart, Path, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value as Json, json};
use serve_runtime::finite::{FiniteService, Rows, Ticket};
use serve_runtime::model::Overrides;
use serve_runtime::package::PackageFiles;
use serve_runtime::registry::{ModelInfo, Registry};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Server settings the routes need.
#[derive(Debug, Clone)]
pub struct Config {
    /// Bearer keys; empty means no authentication.
    pub api_keys: Vec<String>,
    /// Largest request body.
    pub body_limit: usize,
    /// Where uploaded packages' parameter files resolve.
    pub params_root: Option<PathBuf>,
    /// Most inputs in one embeddings request.
    pub max_inputs: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            api_keys: Vec::new(),
            body_limit: 2 << 20,
            params_root: None,
            max_inputs: 2048,
        }
    }
}

/// Shared state of every handler.
#[derive(Debug)]
pub struct AppState {
    pub registry: Arc<Registry>,
    pub config: Config,
    /// False until start-up registrations are done (then `/health` is 200).
    pub ready: AtomicBool,
    requests: AtomicU64,
    /// The HTTP profiles from plugins (`profiles.rs`).
    pub(crate) profiles: crate::profiles::Profiles,
}

impl AppState {
    pub fn new(registry: Arc<Registry>, config: Config) -> Arc<AppState> {
        AppState::with_profiles(registry, config, Default::default())
    }

    /// With the profiles that [`crate::Profiles::mount`] kept; their routes are mounted by [`router`].
    pub fn with_profiles(
        registry: Arc<Registry>,
        config: Config,
        profiles: crate::profiles::Profiles,
    ) -> Arc<AppState> {
        Arc::new(AppState {
            registry,
            config,
            ready: AtomicBool::new(false),
            requests: AtomicU64::new(0),
            profiles,
        })
    }
}

type St = State<Arc<AppState>>;

/// The router.
pub fn router(state: Arc<AppState>) -> Router {
    let limit = state.config.body_limit;
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(list_models).post(register))
        .route("/v1/models/upload", post(upload))
        .route("/v1/models/{name}", get(model_detail).delete(unregister))
        .route("/v1/models/{name}/deactivate", post(deactivate))
        .route("/v1/models/{name}/events", get(model_events))
        .route("/v1/models/{name}/activate", post(activate))
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/decisions", post(decisions))
        .merge(crate::profiles::routes(&state))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), frame))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "not_found",
        "no such route",
    )
}

/// Request ids, authentication, the request counter.
async fn frame(State(st): St, req: Request, next: Next) -> Response {
    let n = st.requests.fetch_add(1, Ordering::Relaxed) + 1;
    let id = req
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic()))
        .map(str::to_string)
        .unwrap_or_else(|| format!("req-{n}"));
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    let mut resp = if path != "/health" && !st.config.api_keys.is_empty() {
        let ok = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .is_some_and(|k| st.config.api_keys.iter().any(|key| key == k));
        if ok {
            next.run(req).await
        } else {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "invalid_request_error",
                "invalid_api_key",
                "missing or invalid bearer API key",
            )
            .into_response()
        }
    } else {
        next.run(req).await
    };
    log::debug!("{id} {method} {path} -> {}", resp.status().as_u16());
    if let Ok(v) = HeaderValue::from_str(&id) {
        resp.headers_mut().insert("x-request-id", v);
    }
    resp
}

/// The request body, or the OpenAI-shaped error for a body that could not be read (413 over the limit).
pub(crate) fn body_bytes(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|r| {
        let status = r.status();
        ApiError::new(
            status,
            "invalid_request_error",
            if status == StatusCode::PAYLOAD_TOO_LARGE {
                "request_too_large"
            } else {
                "invalid_body"
            },
            r.body_text(),
        )
    })
}

fn body_json(body: Result<Bytes, BytesRejection>) -> Result<Json, ApiError> {
    let bytes = body_bytes(body)?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))
}

async fn health(State(st): St) -> Response {
    if st.ready.load(Ordering::Relaxed) {
        let ready = st
            .registry
            .list()
            .iter()
            .filter(|m| m.status == serve_runtime::registry::Status::Ready)
            .count();
        (
            StatusCode::OK,
            axum::Json(json!({"status": "ok", "models_ready": ready})),
        )
            .into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"status": "starting"})),
        )
            .into_response()
    }
}

async fn metrics(State(st): St) -> Response {
    let text = crate::metrics::render(&st.registry, st.requests.load(Ordering::Relaxed));
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

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

async fn list_models(State(st): St) -> Response {
    let data: Vec<Json> = st.registry.list().iter().map(model_json).collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

async fn model_detail(State(st): St, Path(name): Path<String>) -> Result<Response, ApiError> {
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
async fn model_events(State(st): St, Path(name): Path<String>) -> Result<Response, ApiError> {
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
async fn register(
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
async fn upload(State(st): St, mut mp: Multipart) -> Result<Response, ApiError> {
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

async fn unregister(State(st): St, Path(name): Path<String>) -> Result<Response, ApiError> {
    let reg = st.registry.clone();
    let n = name.clone();
    tokio::task::spawn_blocking(move || reg.unregister(&n))
        .await
        .map_err(|e| ApiError::from(serve_runtime::Error::Internal(e.to_string())))??;
    Ok(axum::Json(json!({"id": name, "object": "model", "deleted": true})).into_response())
}

async fn deactivate(State(st): St, Path(name): Path<String>) -> Result<Response, ApiError> {
    let reg = st.registry.clone();
    let info = tokio::task::spawn_blocking(move || reg.deactivate(&name))
        .await
        .map_err(|e| ApiError::from(serve_runtime::Error::Internal(e.to_string())))??;
    Ok(axum::Json(model_json(&info)).into_response())
}

async fn activate(State(st): St, Path(name): Path<String>) -> Result<Response, ApiError> {
    let reg = st.registry.clone();
    let info = tokio::task::spawn_blocking(move || reg.activate(&name))
        .await
        .map_err(|e| ApiError::from(serve_runtime::Error::Internal(e.to_string())))??;
    Ok(axum::Json(model_json(&info)).into_response())
}

/// Cancels the tickets of a request whose handler future is dropped (the client went away).
pub(crate) struct CancelOnDrop(Vec<Ticket>, bool);

impl CancelOnDrop {
    /// Every record finished: dropping cancels nothing.
    pub(crate) fn disarm(&mut self) {
        self.1 = true;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if !self.1 {
            for t in &self.0 {
                t.cancel();
            }
        }
    }
}

/// The records of one request, all admitted: one receiver per record (in record order) and the usage units;
/// dropping `guard` before [`CancelOnDrop::disarm`] cancels the records that have not run.
pub(crate) struct Submitted {
    pub(crate) results: Vec<tokio::sync::oneshot::Receiver<serve_runtime::Result<Rows>>>,
    pub(crate) units: i64,
    pub(crate) guard: CancelOnDrop,
}

/// Submits each record as one finite request (all or none: a record the model refuses cancels the ones
/// submitted before it). Shared by the built-in finite routes and the profile routes (`profiles.rs`).
pub(crate) async fn submit_records(
    svc: &Arc<FiniteService>,
    records: Vec<Vec<u8>>,
) -> Result<Submitted, ApiError> {
    let n = records.len();
    let mut rxs = Vec::with_capacity(n);
    let mut txs = Vec::with_capacity(n);
    for _ in 0..n {
        let (tx, rx) = tokio::sync::oneshot::channel();
        txs.push(tx);
        rxs.push(rx);
    }
    let svc2 = svc.clone();
    // prepare_request runs VM code: off the async workers unless it is known to be quick.
    let admit = move || {
        let alone = records.len() == 1;
        let mut tickets = Vec::with_capacity(records.len());
        for (rec, tx) in records.into_iter().zip(txs) {
            let reply: serve_runtime::finite::Reply = Box::new(move |r| {
                let _ = tx.send(r);
            });
            // A request that arrives alone may run its cohort right here when cohorts are quick.
            let submitted = if alone {
                svc2.submit_one(rec, reply)
            } else {
                svc2.submit(rec, reply)
            };
            match submitted {
                Ok(t) => tickets.push(t),
                Err(e) => {
                    for t in &tickets {
                        t.cancel();
                    }
                    return Err(e);
                }
            }
        }
        Ok(tickets)
    };
    let tickets = if svc.admits_inline() {
        admit()?
    } else {
        tokio::task::spawn_blocking(admit)
            .await
            .map_err(|e| ApiError::from(serve_runtime::Error::Internal(e.to_string())))??
    };
    Ok(Submitted {
        results: rxs,
        units: tickets.iter().map(|t| t.units).sum(),
        guard: CancelOnDrop(tickets, false),
    })
}

/// Submits each record as one finite request and waits for every result (in order).
pub(crate) async fn run_records(
    svc: Arc<FiniteService>,
    records: Vec<Vec<u8>>,
) -> Result<(Vec<Rows>, i64), ApiError> {
    let Submitted {
        results,
        units,
        mut guard,
    } = submit_records(&svc, records).await?;
    let mut out = Vec::with_capacity(results.len());
    for rx in results {
        let r = rx
            .await
            .map_err(|_| ApiError::from(serve_runtime::Error::Cancelled))?;
        out.push(r.map_err(ApiError::from)?);
    }
    guard.disarm();
    drop(svc);
    Ok((out, units))
}

fn finite_service(st: &AppState, body: &Json, role: &str) -> Result<Arc<FiniteService>, ApiError> {
    let model = body
        .get("model")
        .and_then(Json::as_str)
        .ok_or_else(|| ApiError::bad_request("`model` (a string) is required"))?;
    let svc = st.registry.service(model)?;
    if svc.model.doc.role != role {
        return Err(ApiError::from(serve_runtime::Error::Unsupported(format!(
            "model `{model}` serves {}, not {role}",
            svc.model.doc.role
        ))));
    }
    Ok(svc)
}

/// An embeddings input record: kind (0 text, 1 token ids) as i32, a reserved i32, then the payload.
fn record(kind: i32, payload: &[u8]) -> Vec<u8> {
    let mut r = Vec::with_capacity(8 + payload.len());
    r.extend_from_slice(&kind.to_le_bytes());
    r.extend_from_slice(&0i32.to_le_bytes());
    r.extend_from_slice(payload);
    r
}

fn ids_record(a: &[Json]) -> Result<Vec<u8>, ApiError> {
    let mut p = Vec::with_capacity(a.len() * 4);
    for v in a {
        let id = v
            .as_i64()
            .filter(|i| (0..=i32::MAX as i64).contains(i))
            .ok_or_else(|| ApiError::bad_request("token ids must be integers in 0..=2147483647"))?;
        p.extend_from_slice(&(id as i32).to_le_bytes());
    }
    Ok(record(1, &p))
}

fn embedding_records(input: &Json, max: usize) -> Result<Vec<Vec<u8>>, ApiError> {
    let recs = match input {
        Json::String(s) => vec![record(0, s.as_bytes())],
        Json::Array(a) if a.is_empty() => {
            return Err(ApiError::bad_request("`input` is an empty list"));
        }
        Json::Array(a) if a.iter().all(Json::is_string) => a
            .iter()
            .map(|s| record(0, s.as_str().unwrap_or_default().as_bytes()))
            .collect(),
        Json::Array(a) if a.iter().all(Json::is_number) => vec![ids_record(a)?],
        Json::Array(a) if a.iter().all(Json::is_array) => a
            .iter()
            .map(|v| ids_record(v.as_array().map(Vec::as_slice).unwrap_or_default()))
            .collect::<Result<_, _>>()?,
        _ => {
            return Err(ApiError::bad_request(
                "`input` must be a string, a list of strings, a list of token ids or a list of lists of token ids",
            ));
        }
    };
    if recs.len() > max {
        return Err(ApiError::bad_request(format!(
            "{} inputs in one request; at most {max}",
            recs.len()
        )));
    }
    Ok(recs)
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn base64(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len().div_ceil(3) * 4);
    for c in b.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        s.push(B64[(n >> 18) as usize & 63] as char);
        s.push(B64[(n >> 12) as usize & 63] as char);
        s.push(if c.len() > 1 {
            B64[(n >> 6) as usize & 63] as char
        } else {
            '='
        });
        s.push(if c.len() > 2 {
            B64[n as usize & 63] as char
        } else {
            '='
        });
    }
    s
}

/// `POST /v1/embeddings` (OpenAI).
async fn embeddings(
    State(st): St,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_json(body)?;
    let svc = finite_service(&st, &body, "embeddings")?;
    let input = body
        .get("input")
        .ok_or_else(|| ApiError::bad_request("`input` is required"))?;
    let b64 = match body.get("encoding_format").and_then(Json::as_str) {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "`encoding_format` must be \"float\" or \"base64\", found {other:?}"
            )));
        }
    };
    let dims = match body.get("dimensions") {
        None | Some(Json::Null) => None,
        Some(v) => Some(
            v.as_u64()
                .filter(|&d| d > 0)
                .ok_or_else(|| ApiError::bad_request("`dimensions` must be a positive integer"))?
                as usize,
        ),
    };
    let model = svc.model.name.clone();
    let recs = embedding_records(input, st.config.max_inputs)?;
    let (rows, units) = run_records(svc, recs).await?;
    let vectors: Vec<Vec<f32>> = rows
        .into_iter()
        .map(|r| r.into_iter().next().unwrap_or_default())
        .collect();
    if let Some(d) = dims {
        if let Some(v) = vectors.iter().find(|v| v.len() != d) {
            return Err(ApiError::bad_request(format!(
                "`dimensions` {d}: model `{model}` produces {} dimensions and does not truncate",
                v.len()
            )));
        }
    }
    let data: Vec<EmbeddingOut<'_>> = vectors
        .iter()
        .enumerate()
        .map(|(index, v)| EmbeddingOut {
            object: "embedding",
            index,
            embedding: if b64 {
                let bytes: Vec<u8> = v.iter().flat_map(|f| f.to_le_bytes()).collect();
                Embedding::Base64(base64(&bytes))
            } else {
                Embedding::Float(v)
            },
        })
        .collect();
    Ok(axum::Json(EmbeddingsOut {
        object: "list",
        data,
        model: &model,
        usage: Usage {
            prompt_tokens: units,
            total_tokens: units,
        },
    })
    .into_response())
}

// Typed response shapes: serialized straight from the result rows (f32 values as f32), no JSON tree.
#[derive(serde::Serialize)]
struct EmbeddingsOut<'a> {
    object: &'static str,
    data: Vec<EmbeddingOut<'a>>,
    model: &'a str,
    usage: Usage,
}

#[derive(serde::Serialize)]
struct EmbeddingOut<'a> {
    object: &'static str,
    index: usize,
    embedding: Embedding<'a>,
}

#[derive(serde::Serialize)]
#[serde(untagged)]
enum Embedding<'a> {
    Float(&'a [f32]),
    Base64(String),
}

#[derive(serde::Serialize)]
struct Usage {
    prompt_tokens: i64,
    total_tokens: i64,
}

/// A decision record: choice count (i32), instruction length (i32), instruction bytes, then per choice its
/// length (i32) and bytes.
fn decision_record(instructions: &str, choices: &[String]) -> Vec<u8> {
    let mut r = Vec::new();
    r.extend_from_slice(&(choices.len() as i32).to_le_bytes());
    r.extend_from_slice(&(instructions.len() as i32).to_le_bytes());
    r.extend_from_slice(instructions.as_bytes());
    for c in choices {
        r.extend_from_slice(&(c.len() as i32).to_le_bytes());
        r.extend_from_slice(c.as_bytes());
    }
    r
}

/// `POST /v1/decisions {model, questions: {id: {type: "choice", instructions, choices}}}` ->
/// `{answers: {id: {choice, probabilities, confidence}}}`.
async fn decisions(
    State(st): St,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_json(body)?;
    let svc = finite_service(&st, &body, "decisions")?;
    let qs = body
        .get("questions")
        .and_then(Json::as_object)
        .filter(|q| !q.is_empty())
        .ok_or_else(|| {
            ApiError::bad_request("`questions` must be a non-empty object of id -> question")
        })?;
    if qs.len() > st.config.max_inputs {
        return Err(ApiError::bad_request(format!(
            "at most {} questions",
            st.config.max_inputs
        )));
    }
    let mut ids = Vec::with_capacity(qs.len());
    let mut choice_lists = Vec::with_capacity(qs.len());
    let mut recs = Vec::with_capacity(qs.len());
    for (id, q) in qs {
        let bad = |m: &str| ApiError::bad_request(format!("questions.{id}: {m}"));
        if q.get("type").and_then(Json::as_str) != Some("choice") {
            return Err(bad("`type` must be \"choice\""));
        }
        let instr = q
            .get("instructions")
            .and_then(Json::as_str)
            .unwrap_or_default();
        let choices: Vec<String> = q
            .get("choices")
            .and_then(Json::as_array)
            .and_then(|a| a.iter().map(|c| c.as_str().map(str::to_string)).collect())
            .ok_or_else(|| bad("`choices` must be a list of strings"))?;
        if choices.len() < 2 {
            return Err(bad("at least two choices are needed"));
        }
        let mut seen = std::collections::HashSet::new();
        if !choices.iter().all(|c| seen.insert(c)) {
            return Err(bad("choices must be distinct"));
        }
        recs.push(decision_record(instr, &choices));
        ids.push(id.clone());
        choice_lists.push(choices);
    }
    let model = svc.model.name.clone();
    let (rows, _) = run_records(svc, recs).await?;
    let mut answers = serde_json::Map::new();
    for ((id, choices), r) in ids.into_iter().zip(choice_lists).zip(rows) {
        let p = r.into_iter().next().unwrap_or_default();
        if p.len() != choices.len() {
            return Err(ApiError::from(serve_runtime::Error::Program(format!(
                "model `{model}` returned {} probabilities for {} choices",
                p.len(),
                choices.len()
            ))));
        }
        let (best, conf) =
            p.iter().enumerate().fold(
                (0, f32::MIN),
                |(bi, bp), (i, &v)| if v > bp { (i, v) } else { (bi, bp) },
            );
        let probs: serde_json::Map<String, Json> = choices
            .iter()
            .zip(&p)
            .map(|(c, &v)| (c.clone(), json!(v)))
            .collect();
        answers.insert(
            id,
            json!({"choice": choices[best], "probabilities": probs, "confidence": conf}),
        );
    }
    Ok(
        axum::Json(json!({"object": "decision", "model": model, "answers": answers}))
            .into_response(),
    )
}
