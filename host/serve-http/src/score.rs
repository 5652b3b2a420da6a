//! `POST /v1/score`: the sequence contract's `score` profile. Each input (a text, or token ids) runs through a
//! known-token sequence model, whose package captures one little-endian f32 per token: the log probability of
//! the supplied token after it (the last one's is not used). The route turns that into each token's log
//! probability given the tokens before it, their total, and the perplexity. Documented in
//! `docs/serving/http.md` and `docs/serving/sequence.md`.

use crate::error::ApiError;
use crate::state::{St, body_json};
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};
use serde_json::{Value as Json, json};
use serve_contracts::retained::service::token_bytes;
use serve_contracts::sequence::{Captured, SequenceService, Submitted};
use std::sync::Arc;

/// The most inputs one request may carry.
pub(crate) const MAX_INPUTS: usize = 64;

/// Cancels the submitted sequences when the response is dropped before they finished (the client went away).
pub(crate) struct Guard(pub(crate) Vec<Submitted>);

impl Drop for Guard {
    fn drop(&mut self) {
        for s in self.0.drain(..) {
            s.cancel();
        }
    }
}

/// The sequence model `name` serving `score` (404 unknown, 503 not ready, 501 another role).
pub(crate) fn score_service(
    st: &crate::state::AppState,
    name: &str,
) -> Result<Arc<SequenceService>, ApiError> {
    let svc = st.registry.service(name)?;
    if svc.model().doc.role != "score" {
        return Err(ApiError::from(serve_runtime::Error::Unsupported(format!(
            "model `{name}` serves {}, not scores",
            svc.model().doc.role
        ))));
    }
    svc.as_any().downcast::<SequenceService>().map_err(|_| {
        ApiError::from(serve_runtime::Error::Unsupported(format!(
            "model `{name}` is not a sequence model"
        )))
    })
}

/// One input as the client gave it.
enum Input {
    Text(String),
    Tokens(Vec<u32>),
}

/// The token ids of the list `v`, the field `field` of the body (errors name `field[i]`).
pub(crate) fn token_ids(v: &[Json], field: &str) -> Result<Vec<u32>, ApiError> {
    v.iter()
        .enumerate()
        .map(|(i, t)| {
            t.as_u64()
                .and_then(|t| u32::try_from(t).ok())
                .ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "`{field}[{i}]` must be a token id (a non-negative integer)"
                    ))
                })
        })
        .collect()
}

/// `input`: a string, a list of strings, a list of token ids (one sequence), or a list of lists of token ids.
fn inputs(v: &Json) -> Result<Vec<Input>, ApiError> {
    let what = "`input` must be a string, a list of strings, a list of token ids or a list of lists of token ids";
    let out = match v {
        Json::String(s) => vec![Input::Text(s.clone())],
        Json::Array(a) if a.is_empty() => return Err(ApiError::bad_request("`input` is empty")),
        Json::Array(a) if a[0].is_number() => vec![Input::Tokens(token_ids(a, "input")?)],
        Json::Array(a) => a
            .iter()
            .enumerate()
            .map(|(i, x)| match x {
                Json::String(s) => Ok(Input::Text(s.clone())),
                Json::Array(t) => Ok(Input::Tokens(token_ids(t, &format!("input[{i}]"))?)),
                _ => Err(ApiError::bad_request(format!(
                    "`input[{i}]` must be a string or a list of token ids"
                ))),
            })
            .collect::<Result<_, _>>()?,
        _ => return Err(ApiError::bad_request(what)),
    };
    if out.len() > MAX_INPUTS {
        return Err(ApiError::new(
            axum::http::StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            "input_too_large",
            format!("`input` has {} entries; at most {MAX_INPUTS}", out.len()),
        ));
    }
    Ok(out)
}

/// The `score` profile's reading of captured output: one little-endian f32 per computed position.
pub(crate) fn profile(c: Captured) -> Result<Vec<u8>, serve_runtime::Error> {
    if c.bytes.len() as u64 != u64::from(c.positions) * 4 {
        return Err(serve_runtime::Error::Program(format!(
            "the package captured {} bytes for {} tokens; the score profile takes one f32 (4 bytes) per token",
            c.bytes.len(),
            c.positions
        )));
    }
    Ok(c.bytes)
}

pub(crate) fn logprobs(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// `{tokens: [{id, text, logprob}], total_logprob, mean_logprob, perplexity}` for `tokens`, where `logprob(j)`
/// is token j's log probability (None: not scored, the first token of a sequence).
pub(crate) fn scored(
    svc: &SequenceService,
    tokens: &[u32],
    logprob: impl Fn(usize) -> Option<f32>,
) -> Json {
    let mut total = 0f64;
    let mut n = 0usize;
    let entries: Vec<Json> = tokens
        .iter()
        .enumerate()
        .map(|(j, &t)| {
            let text = String::from_utf8_lossy(&token_bytes(&svc.model, t)).into_owned();
            let l = logprob(j);
            if let Some(l) = l {
                total += f64::from(l);
                n += 1;
            }
            json!({"id": t, "text": text, "logprob": l.map(f64::from)})
        })
        .collect();
    let mean = (n > 0).then(|| total / n as f64);
    json!({
        "tokens": entries,
        "total_logprob": total,
        "mean_logprob": mean,
        "perplexity": mean.map(|m| (-m).exp()),
    })
}

/// `POST /v1/score`.
pub(crate) async fn score(
    State(st): St,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_json(body)?;
    let name = body
        .get("model")
        .and_then(Json::as_str)
        .ok_or_else(|| ApiError::bad_request("`model` (a string) is required"))?;
    let svc = score_service(&st, name)?;
    let input = body
        .get("input")
        .ok_or_else(|| ApiError::bad_request("`input` is required"))?;
    let inputs = inputs(input)?;
    let mut sequences = Vec::with_capacity(inputs.len());
    for (i, x) in inputs.into_iter().enumerate() {
        let tokens = match x {
            Input::Text(s) => svc.encode(&s),
            Input::Tokens(t) => Ok(t),
        };
        let tokens = tokens
            .and_then(|t| {
                if t.is_empty() {
                    Err(serve_runtime::Error::BadRequest("no tokens".into()))
                } else {
                    Ok(t)
                }
            })
            .map_err(|e| ApiError::from(e).within(&format!("input {i}")))?;
        sequences.push(tokens);
    }
    let mut guard = Guard(Vec::new());
    let mut waits = Vec::with_capacity(sequences.len());
    for (i, tokens) in sequences.iter().enumerate() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let s = svc
            .submit(
                tokens.clone(),
                Box::new(move |r| {
                    let _ = tx.send(r);
                }),
            )
            .map_err(|e| ApiError::from(e).within(&format!("input {i}")))?;
        guard.0.push(s);
        waits.push(rx);
    }
    let mut data = Vec::with_capacity(sequences.len());
    let mut total_tokens = 0usize;
    for (i, (rx, tokens)) in waits.into_iter().zip(&sequences).enumerate() {
        let bytes = rx
            .await
            .map_err(|_| {
                ApiError::from(serve_runtime::Error::NotReady {
                    name: svc.model.name.clone(),
                    status: "draining".into(),
                })
            })?
            .map_err(|e| ApiError::from(e).within(&format!("input {i}")))?;
        let bytes = profile(bytes).map_err(|e| ApiError::from(e).within(&format!("input {i}")))?;
        let lp = logprobs(&bytes);
        let mut entry = scored(&svc, tokens, |j| (j > 0).then(|| lp[j - 1]));
        entry["object"] = json!("score");
        entry["index"] = json!(i);
        data.push(entry);
        total_tokens += tokens.len();
    }
    guard.0.clear();
    Ok(axum::Json(json!({
        "object": "list",
        "model": svc.model.name,
        "data": data,
        "usage": {"prompt_tokens": total_tokens, "total_tokens": total_tokens},
    }))
    .into_response())
}
