//! The router: every built-in route (one file per route family: [`crate::lifecycle`], [`crate::embeddings`],
//! [`crate::decisions`]), the profile routes ([`crate::profiles`]), `/health`, `/metrics`, and the `frame`
//! middleware (request ids, authentication, the request counter).

use crate::error::ApiError;
use crate::state::{AppState, St};
use crate::{decisions, embeddings, lifecycle};
use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// The router.
pub fn router(state: Arc<AppState>) -> Router {
    let limit = state.config.body_limit;
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route(
            "/v1/models",
            get(lifecycle::list_models).post(lifecycle::register),
        )
        .route("/v1/models/upload", post(lifecycle::upload))
        .route(
            "/v1/models/{name}",
            get(lifecycle::model_detail).delete(lifecycle::unregister),
        )
        .route("/v1/models/{name}/deactivate", post(lifecycle::deactivate))
        .route("/v1/models/{name}/events", get(lifecycle::model_events))
        .route("/v1/models/{name}/activate", post(lifecycle::activate))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/v1/decisions", post(decisions::decisions))
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
