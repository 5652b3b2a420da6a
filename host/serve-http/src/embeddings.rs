//! `POST /v1/embeddings` (OpenAI): inputs to embeddings protocol records, results to the OpenAI shape.

use crate::error::ApiError;
use crate::state::{St, body_json, finite_service_of, run_records};
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};
use loom_plugin_api::records;
use serde_json::Value as Json;

fn ids_record(a: &[Json]) -> Result<Vec<u8>, ApiError> {
    let bad = || ApiError::bad_request("token ids must be integers in 0..=2147483647");
    let ids: Vec<i64> = a
        .iter()
        .map(|v| v.as_i64().ok_or_else(bad))
        .collect::<Result<_, _>>()?;
    records::ids_record(ids).map_err(|_| bad())
}

fn embedding_records(input: &Json, max: usize) -> Result<Vec<Vec<u8>>, ApiError> {
    let recs = match input {
        Json::String(s) => vec![records::text_record(s)],
        Json::Array(a) if a.is_empty() => {
            return Err(ApiError::bad_request("`input` is an empty list"));
        }
        Json::Array(a) if a.iter().all(Json::is_string) => a
            .iter()
            .map(|s| records::text_record(s.as_str().unwrap_or_default()))
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
pub(crate) async fn embeddings(
    State(st): St,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_json(body)?;
    let svc = finite_service_of(&st, &body, "embeddings")?;
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
    let (rows, units) = run_records(svc, recs, None).await?;
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
