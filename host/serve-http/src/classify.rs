//! `POST /classify` (vLLM's classification API): texts to a decisions model as text records, one class
//! distribution per input back, with the model's class names and the tokens each input used.

use crate::error::ApiError;
use crate::state::{St, body_json, finite_service_of, run_records};
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};
use loom_plugin_api::records;
use serde_json::Value as Json;
use std::sync::atomic::{AtomicU64, Ordering};

/// The class names a decisions package declares in its `model.json` options (`"labels": ["safe",
/// "injection"]`). Read from the package, not from a registration's options, which replace the package's
/// for the program (`prepare`) only: class names belong to the package's outputs.
fn labels(model: &serve_runtime::model::Model, name: &str) -> Result<Vec<String>, ApiError> {
    let unsupported = || {
        ApiError::from(serve_runtime::Error::Unsupported(format!(
            "model `{name}` declares no class names (options.labels, a list of two or more strings), which \
             /classify needs"
        )))
    };
    let labels: Vec<String> = model
        .doc
        .options
        .get("labels")
        .and_then(Json::as_array)
        .and_then(|a| a.iter().map(|l| l.as_str().map(str::to_string)).collect())
        .ok_or_else(unsupported)?;
    if labels.len() < 2 {
        return Err(unsupported());
    }
    Ok(labels)
}

fn texts(input: Option<&Json>, max: usize) -> Result<Vec<String>, ApiError> {
    let texts: Vec<String> = match input {
        Some(Json::String(s)) => vec![s.clone()],
        Some(Json::Array(a)) if a.is_empty() => {
            return Err(ApiError::bad_request("`input` is an empty list"));
        }
        Some(Json::Array(a)) if a.iter().all(Json::is_string) => a
            .iter()
            .map(|s| s.as_str().unwrap_or_default().to_string())
            .collect(),
        Some(_) => {
            return Err(ApiError::bad_request(
                "`input` must be a string or a list of strings",
            ));
        }
        None => return Err(ApiError::bad_request("`input` is required")),
    };
    if texts.len() > max {
        return Err(ApiError::bad_request(format!(
            "{} inputs in one request; at most {max}",
            texts.len()
        )));
    }
    Ok(texts)
}

/// `POST /classify {model, input}` -> `{id, object: "list", created, model, data: [{index, label, probs,
/// num_classes}], usage}`. Every input is one finite request (text record); the model's row for it holds the
/// class probabilities (in `options.labels` order), then the tokens it used and the tokens before truncation.
/// `usage` counts both and lists every truncated input.
pub(crate) async fn classify(
    State(st): St,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_json(body)?;
    let svc = finite_service_of(&st, &body, "decisions")?;
    let model = svc.model.name.clone();
    let labels = labels(&svc.model, &model)?;
    let texts = texts(body.get("input"), st.config.max_inputs)?;
    let recs = texts.iter().map(|t| records::text_record(t)).collect();
    let (rows, _) = run_records(svc, recs, None).await?;
    let k = labels.len();
    let mut data = Vec::with_capacity(rows.len());
    let (mut used, mut given) = (0u64, 0u64);
    let mut truncated = Vec::new();
    for (index, r) in rows.into_iter().enumerate() {
        let row = r.into_iter().next().unwrap_or_default();
        if row.len() != k + 2 {
            return Err(ApiError::from(serve_runtime::Error::Program(format!(
                "input {index}: model `{model}` returned {} values for a text; /classify expects {k} \
                 probabilities (options.labels) and two token counts",
                row.len()
            ))));
        }
        let (n, total) = (row[k] as u64, row[k + 1] as u64);
        used += n;
        given += total;
        if total > n {
            truncated.push(Truncated {
                index,
                input_tokens: total,
                used_tokens: n,
            });
        }
        let probs = row[..k].to_vec();
        let best = probs
            .iter()
            .enumerate()
            .fold(
                (0, f32::MIN),
                |(bi, bp), (i, &v)| {
                    if v > bp { (i, v) } else { (bi, bp) }
                },
            )
            .0;
        data.push(ClassOut {
            index,
            label: labels[best].clone(),
            probs,
            num_classes: k,
        });
    }
    static SERIAL: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let serial = SERIAL.fetch_add(1, Ordering::Relaxed);
    Ok(axum::Json(ClassifyOut {
        id: format!("classify-{:x}{serial:08x}", now.as_micros()),
        object: "list",
        created: now.as_secs(),
        model: &model,
        data,
        usage: Usage {
            prompt_tokens: used,
            total_tokens: used,
            completion_tokens: 0,
            input_tokens: given,
            truncated,
        },
    })
    .into_response())
}

#[derive(serde::Serialize)]
struct ClassifyOut<'a> {
    id: String,
    object: &'static str,
    created: u64,
    model: &'a str,
    data: Vec<ClassOut>,
    usage: Usage,
}

#[derive(serde::Serialize)]
struct ClassOut {
    index: usize,
    label: String,
    probs: Vec<f32>,
    num_classes: usize,
}

/// Token counts: `prompt_tokens` the tokens the model read (after truncation), `input_tokens` the tokens the
/// inputs had, `truncated` every input cut to the model's window.
#[derive(serde::Serialize)]
struct Usage {
    prompt_tokens: u64,
    total_tokens: u64,
    completion_tokens: u64,
    input_tokens: u64,
    truncated: Vec<Truncated>,
}

#[derive(serde::Serialize)]
struct Truncated {
    index: usize,
    input_tokens: u64,
    used_tokens: u64,
}
