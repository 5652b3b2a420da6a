//! Sessions over retained-text and known-token sequence models (loom-native routes, documented in
//! `docs/serving/http.md`): create a session, append text or token ids to it (on a text model optionally
//! generating, streamed or not, in the shape of `/v1/completions`; on a sequence model scoring the appended
//! tokens, in the shape of a `/v1/score` entry), take named checkpoints, fork a session or a checkpoint into a
//! new session, rewind to a checkpoint or a token count, list and delete. The engine sides are
//! `serve_contracts::retained::sessions` (a token list with its full pages pinned, so a fork copies no page and
//! an append computes only what follows the session's full pages) and the sequence engine's sessions (a token
//! list with its page table; forks and checkpoints share its pages, an append copies the partial one).

use crate::chat::{Form, event_channel, parse_request, respond, text_prompt, text_service};
use crate::error::ApiError;
use crate::state::{AppState, St, body_json};
use axum::Json as AxJson;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value as Json, json};
use serve_contracts::retained::RetainedService;
use serve_contracts::retained::sessions::{SessionError, SessionInfo, SessionOp};
use serve_contracts::sequence::SequenceService;
use std::sync::Arc;

/// The model a session lives in: a text model or a sequence model.
#[derive(Clone)]
enum Host {
    Text(Arc<RetainedService>),
    Seq(Arc<SequenceService>),
}

impl Host {
    fn name(&self) -> String {
        match self {
            Host::Text(s) => s.model.name.clone(),
            Host::Seq(s) => s.model.name.clone(),
        }
    }
}

impl From<SessionError> for ApiError {
    fn from(e: SessionError) -> ApiError {
        match e {
            SessionError::NotFound(m) => ApiError::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                "session_not_found",
                m,
            ),
            SessionError::Conflict(m) => ApiError::new(
                StatusCode::CONFLICT,
                "invalid_request_error",
                "session_busy",
                m,
            ),
            SessionError::Failed(e) => ApiError::from(e),
        }
    }
}

fn object(body: Result<Bytes, BytesRejection>) -> Result<Map<String, Json>, ApiError> {
    match body_json(body)? {
        Json::Object(o) => Ok(o),
        _ => Err(ApiError::bad_request("the body must be a JSON object")),
    }
}

/// A body that may be empty (`{}`).
fn object_or_empty(body: Result<Bytes, BytesRejection>) -> Result<Map<String, Json>, ApiError> {
    match &body {
        Ok(b) if b.iter().all(u8::is_ascii_whitespace) => Ok(Map::new()),
        _ => object(body),
    }
}

/// Runs `op` on `host`'s engine thread (off the async workers: it waits for the engine's current epoch).
async fn run(host: Host, id: String, op: SessionOp) -> Result<Vec<SessionInfo>, ApiError> {
    tokio::task::spawn_blocking(move || match host {
        Host::Text(svc) => svc.session(&id, op),
        Host::Seq(svc) => svc.session(&id, op),
    })
    .await
    .map_err(|e| ApiError::from(serve_runtime::Error::Internal(format!("session task: {e}"))))?
    .map_err(ApiError::from)
}

/// Every ready model that keeps sessions: retained-text and sequence models.
fn hosts(st: &AppState) -> Vec<Host> {
    st.registry
        .services()
        .into_iter()
        .filter_map(|s| {
            let any = s.as_any();
            match any.clone().downcast::<RetainedService>() {
                Ok(t) => Some(Host::Text(t)),
                Err(_) => any.downcast::<SequenceService>().ok().map(Host::Seq),
            }
        })
        .collect()
}

/// The model holding session `id` (404 when none does).
async fn owner(st: &AppState, id: &str) -> Result<Host, ApiError> {
    for svc in hosts(st) {
        match run(svc.clone(), id.to_string(), SessionOp::Get).await {
            Ok(_) => return Ok(svc),
            Err(e) if e.status == StatusCode::NOT_FOUND => continue,
            Err(e) => return Err(e),
        }
    }
    Err(SessionError::NotFound(format!("no session `{id}`")).into())
}

fn session_json(model: &str, s: &SessionInfo, full: bool) -> Json {
    let checkpoints: Vec<Json> = s
        .checkpoints
        .iter()
        .map(|(n, t, p)| json!({"name": n, "tokens": t, "pages": p}))
        .collect();
    let mut v = json!({
        "id": s.id,
        "object": "session",
        "model": model,
        "tokens": s.tokens,
        "pages": s.pages,
        "checkpoints": checkpoints,
        "busy": s.busy,
        "idle_seconds": s.idle_seconds,
    });
    if full {
        v["token_ids"] = json!(s.token_ids);
    }
    v
}

fn one(model: &str, v: Vec<SessionInfo>) -> Response {
    match v.first() {
        Some(s) => AxJson(session_json(model, s, true)).into_response(),
        None => StatusCode::NO_CONTENT.into_response(),
    }
}

/// `POST /v1/sessions {model, prompt? | tokens?}`.
pub(crate) async fn create(
    State(st): St,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let o = object(body)?;
    let model = o
        .get("model")
        .and_then(Json::as_str)
        .ok_or_else(|| ApiError::bad_request("`model` (a string) is required"))?
        .to_string();
    let host = match st.registry.service(&model)?.model().doc.contract.as_str() {
        "sequence" => Host::Seq(crate::score::score_service(&st, &model)?),
        _ => Host::Text(text_service(&st, &model)?),
    };
    let tokens = match &host {
        Host::Text(svc) => input(svc, &o)?,
        Host::Seq(svc) => seq_input(svc, &o)?,
    }
    .unwrap_or_default();
    let v = run(host, String::new(), SessionOp::Create { tokens }).await?;
    Ok(one(&model, v))
}

/// The `prompt` (text or token ids) or `tokens` (token ids) of a body, for a sequence model.
fn seq_input(svc: &SequenceService, o: &Map<String, Json>) -> Result<Option<Vec<u32>>, ApiError> {
    let ids = |v: &Json, field: &str| match v.as_array() {
        Some(a) => crate::score::token_ids(a, field),
        None => Err(ApiError::bad_request(format!(
            "`{field}` must be an array of token ids"
        ))),
    };
    match (o.get("prompt"), o.get("tokens")) {
        (Some(p), Some(t)) if !p.is_null() && !t.is_null() => {
            Err(ApiError::bad_request("give `prompt` or `tokens`, not both"))
        }
        (Some(Json::String(p)), _) => Ok(Some(svc.encode(p)?)),
        (Some(p), _) if !p.is_null() => ids(p, "prompt").map(Some),
        (_, Some(t)) if !t.is_null() => ids(t, "tokens").map(Some),
        _ => Ok(None),
    }
}

/// The `prompt` (text or token ids) or `tokens` (token ids) of a body.
fn input(svc: &RetainedService, o: &Map<String, Json>) -> Result<Option<Vec<u32>>, ApiError> {
    match (o.get("prompt"), o.get("tokens")) {
        (Some(p), Some(t)) if !p.is_null() && !t.is_null() => {
            Err(ApiError::bad_request("give `prompt` or `tokens`, not both"))
        }
        (Some(p), _) if !p.is_null() => text_prompt(svc, Some(p)),
        (_, Some(t)) if !t.is_null() => match text_prompt(svc, Some(t))? {
            Some(_) if t.is_string() => Err(ApiError::bad_request(
                "`tokens` must be an array of token ids",
            )),
            r => Ok(r),
        },
        _ => Ok(None),
    }
}

/// `GET /v1/sessions`.
pub(crate) async fn list(State(st): St) -> Result<Response, ApiError> {
    let mut data = Vec::new();
    for svc in hosts(&st) {
        let model = svc.name();
        for s in run(svc, String::new(), SessionOp::List).await? {
            data.push(session_json(&model, &s, false));
        }
    }
    Ok(AxJson(json!({"object": "list", "data": data})).into_response())
}

/// `GET /v1/sessions/{id}`.
pub(crate) async fn get(State(st): St, Path(id): Path<String>) -> Result<Response, ApiError> {
    let svc = owner(&st, &id).await?;
    let model = svc.name();
    Ok(one(&model, run(svc, id, SessionOp::Get).await?))
}

/// `DELETE /v1/sessions/{id}`.
pub(crate) async fn delete(State(st): St, Path(id): Path<String>) -> Result<Response, ApiError> {
    let svc = owner(&st, &id).await?;
    run(svc, id.clone(), SessionOp::Delete).await?;
    Ok(AxJson(json!({"id": id, "object": "session.deleted", "deleted": true})).into_response())
}

/// `POST /v1/sessions/{id}/checkpoints {name}`.
pub(crate) async fn checkpoint(
    State(st): St,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let o = object(body)?;
    let name = match o.get("name").and_then(Json::as_str) {
        Some(n) if !n.is_empty() && n.len() <= 256 => n.to_string(),
        _ => {
            return Err(ApiError::bad_request(
                "`name` (a string of 1 to 256 bytes) is required",
            ));
        }
    };
    let svc = owner(&st, &id).await?;
    let model = svc.name();
    Ok(one(
        &model,
        run(svc, id, SessionOp::Checkpoint { name }).await?,
    ))
}

/// `POST /v1/sessions/{id}/fork {checkpoint?}`.
pub(crate) async fn fork(
    State(st): St,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let o = object_or_empty(body)?;
    let checkpoint = match o.get("checkpoint") {
        None | Some(Json::Null) => None,
        Some(Json::String(s)) => Some(s.clone()),
        Some(_) => return Err(ApiError::bad_request("`checkpoint` must be a string")),
    };
    let svc = owner(&st, &id).await?;
    let model = svc.name();
    Ok(one(
        &model,
        run(svc, id, SessionOp::Fork { checkpoint }).await?,
    ))
}

/// `POST /v1/sessions/{id}/rewind {checkpoint | tokens}`.
pub(crate) async fn rewind(
    State(st): St,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let o = object(body)?;
    let op = match (o.get("checkpoint"), o.get("tokens")) {
        (Some(Json::String(c)), None | Some(Json::Null)) => {
            SessionOp::RewindCheckpoint { name: c.clone() }
        }
        (None | Some(Json::Null), Some(t)) => match t.as_u64() {
            Some(n) => SessionOp::RewindTokens {
                tokens: n.min(u64::from(u32::MAX)) as u32,
            },
            None => {
                return Err(ApiError::bad_request(
                    "`tokens` must be a non-negative integer (a token count)",
                ));
            }
        },
        _ => {
            return Err(ApiError::bad_request(
                "give `checkpoint` (a name) or `tokens` (a token count)",
            ));
        }
    };
    let svc = owner(&st, &id).await?;
    let model = svc.name();
    Ok(one(&model, run(svc, id, op).await?))
}

/// `POST /v1/sessions/{id}/append {prompt | tokens, max_tokens?, temperature?, ..., stream?}`: a completion in
/// the shape of `/v1/completions`; `max_tokens: 0` only adds the tokens (answered with the session).
pub(crate) async fn append(
    State(st): St,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let o = object(body)?;
    let svc = match owner(&st, &id).await? {
        Host::Text(svc) => svc,
        Host::Seq(svc) => return score_append(svc, id, &o).await,
    };
    let model = svc.model.name.clone();
    let tokens = input(&svc, &o)?.unwrap_or_default();
    if o.get("max_tokens").and_then(Json::as_u64) == Some(0) {
        return Ok(one(
            &model,
            run(Host::Text(svc), id, SessionOp::Extend { tokens }).await?,
        ));
    }
    let (mut req, stream, include_usage) = parse_request(&o, Form::Text)?;
    req.max_tokens = req.max_tokens.min(svc.limits.context);
    req.prompt = tokens;
    let (sink, rx) = event_channel();
    let n = req.n;
    let s2 = svc.clone();
    let ticket = tokio::task::spawn_blocking(move || s2.append(&id, req, sink))
        .await
        .map_err(|e| {
            ApiError::from(serve_runtime::Error::Internal(format!("append task: {e}")))
        })??;
    respond(
        svc,
        model,
        Form::Text,
        n,
        ticket,
        rx,
        stream,
        include_usage,
        None,
    )
    .await
}

/// `POST /v1/sessions/{id}/append {prompt | tokens}` on a sequence model: the appended tokens, scored given the
/// session's tokens before them.
async fn score_append(
    svc: Arc<SequenceService>,
    id: String,
    o: &Map<String, Json>,
) -> Result<Response, ApiError> {
    let tokens = seq_input(&svc, o)?.ok_or_else(|| {
        ApiError::bad_request("give `prompt` (text or token ids) or `tokens` (token ids) to append")
    })?;
    let (tx, rx) = tokio::sync::oneshot::channel();
    let s2 = svc.clone();
    let t2 = tokens.clone();
    let id2 = id.clone();
    let submitted = tokio::task::spawn_blocking(move || {
        s2.append(
            &id2,
            t2,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        )
    })
    .await
    .map_err(|e| ApiError::from(serve_runtime::Error::Internal(format!("append task: {e}"))))??;
    let mut guard = crate::score::Guard(vec![submitted]);
    let captured = rx.await.map_err(|_| {
        ApiError::from(serve_runtime::Error::NotReady {
            name: svc.model.name.clone(),
            status: "draining".into(),
        })
    })??;
    guard.0.clear();
    let from = captured.from as usize;
    let end = from + captured.positions as usize;
    let lp = crate::score::logprobs(&crate::score::profile(captured)?);
    // The session's tokens before the append: the appended token j (of all of them, `before + k`) was scored at
    // position j - 1, which the append computed.
    let before = end + 1 - tokens.len();
    let mut v = crate::score::scored(&svc, &tokens, |k| {
        let p = (before + k).checked_sub(1)?;
        (p >= from && p < end).then(|| lp[p - from])
    });
    v["object"] = json!("score");
    v["session"] = json!(id);
    v["model"] = json!(svc.model.name);
    v["usage"] = json!({"prompt_tokens": tokens.len(), "total_tokens": tokens.len()});
    Ok(AxJson(v).into_response())
}
