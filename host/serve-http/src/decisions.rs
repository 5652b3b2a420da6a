//! `POST /v1/decisions`: typed questions to decision protocol records, normalised distributions back.

use crate::error::ApiError;
use crate::state::{St, body_json, finite_service_of, run_records};
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};
use loom_plugin_api::records::decision_record;
use serde_json::{Value as Json, json};

/// `POST /v1/decisions {model, questions: {id: {type: "choice", instructions, choices}}}` ->
/// `{answers: {id: {choice, probabilities, confidence}}}`.
pub(crate) async fn decisions(
    State(st): St,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_json(body)?;
    let svc = finite_service_of(&st, &body, "decisions")?;
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
    let (rows, _) = run_records(svc, recs, Some(&ids)).await?;
    let mut answers = serde_json::Map::new();
    for ((id, choices), r) in ids.into_iter().zip(choice_lists).zip(rows) {
        let p = r.into_iter().next().unwrap_or_default();
        if p.len() != choices.len() {
            return Err(ApiError::from(serve_runtime::Error::Program(format!(
                "question `{id}`: model `{model}` returned {} probabilities for {} choices",
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
