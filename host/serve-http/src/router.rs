//! The router: every built-in route (one file per route family: [`crate::lifecycle`], [`crate::embeddings`],
//! [`crate::decisions`], [`crate::classify`]), the profile routes ([`crate::profiles`]), `/health`, `/metrics`,
//! and the `frame` middleware (request ids, authentication, the request counter).

use crate::error::ApiError;
use crate::state::{AppState, St};
use crate::{chat, classify, decisions, embeddings, lifecycle, sessions};
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
        // Parameter files stream to disk (bounded by max_upload_bytes); the rest by body_limit, checked in
        // the handler.
        .route(
            "/v1/models/upload",
            post(lifecycle::upload).layer(DefaultBodyLimit::max(
                usize::try_from(state.config.max_upload_bytes)
                    .unwrap_or(usize::MAX)
                    .saturating_add(limit),
            )),
        )
        .route(
            "/v1/models/{name}",
            get(lifecycle::model_detail).delete(lifecycle::unregister),
        )
        .route("/v1/models/{name}/deactivate", post(lifecycle::deactivate))
        .route("/v1/models/{name}/events", get(lifecycle::model_events))
        .route("/v1/models/{name}/activate", post(lifecycle::activate))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/v1/decisions", post(decisions::decisions))
        .route("/classify", post(classify::classify))
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/completions", post(chat::completions))
        .route("/v1/sessions", post(sessions::create).get(sessions::list))
        .route(
            "/v1/sessions/{id}",
            get(sessions::get).delete(sessions::delete),
        )
        .route("/v1/sessions/{id}/append", post(sessions::append))
        .route("/v1/sessions/{id}/checkpoints", post(sessions::checkpoint))
        .route("/v1/sessions/{id}/fork", post(sessions::fork))
        .route("/v1/sessions/{id}/rewind", post(sessions::rewind))
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
    let mut resp = match refusal(&st.config, &req) {
        None => next.run(req).await,
        Some(refused) => refused,
    };
    log::debug!("{id} {method} {path} -> {}", resp.status().as_u16());
    if let Ok(v) = HeaderValue::from_str(&id) {
        resp.headers_mut().insert("x-request-id", v);
    }
    resp
}

/// The realm of the `WWW-Authenticate` challenges.
const CHALLENGE: &str = "Bearer realm=\"loom-serve\"";

/// Whether `req` changes the set of served models or their state (registration, upload, unregistration,
/// activation, deactivation): anything but a read under `/v1/models`.
fn is_admin_route(method: &axum::http::Method, path: &str) -> bool {
    let models = path == "/v1/models" || path.starts_with("/v1/models/");
    models && method != axum::http::Method::GET && method != axum::http::Method::HEAD
}

/// Compares two keys in time independent of where they differ.
fn same_key(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// Authentication and scopes: with no keys configured everything is open; `/health` always is. An admin key
/// may call every route; an inference key every route but the [admin routes](is_admin_route) (403); no
/// valid key is a 401. Both carry a `WWW-Authenticate` challenge. `None`: the request may go on.
fn refusal(config: &crate::state::Config, req: &Request) -> Option<Response> {
    if req.uri().path() == "/health" || (config.api_keys.is_empty() && config.admin_keys.is_empty())
    {
        return None;
    }
    let key = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let matches = |keys: &[String]| key.is_some_and(|k| keys.iter().any(|key| same_key(key, k)));
    if matches(&config.admin_keys) {
        return None;
    }
    if matches(&config.api_keys) {
        if !is_admin_route(req.method(), req.uri().path()) {
            return None;
        }
        let mut r = ApiError::new(
            StatusCode::FORBIDDEN,
            "invalid_request_error",
            "insufficient_scope",
            format!(
                "{} {} changes the served models and needs an admin key (--admin-key); this key may only \
                 call the inference and read routes",
                req.method(),
                req.uri().path()
            ),
        )
        .into_response();
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static(
                "Bearer realm=\"loom-serve\", error=\"insufficient_scope\", scope=\"admin\"",
            ),
        );
        return Some(r);
    }
    let mut r = ApiError::new(
        StatusCode::UNAUTHORIZED,
        "invalid_request_error",
        "invalid_api_key",
        "missing or invalid bearer API key",
    )
    .into_response();
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static(CHALLENGE),
    );
    Some(r)
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

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::Method;

    #[test]
    fn admin_routes_are_the_changes_under_v1_models() {
        for (m, p) in [
            (Method::POST, "/v1/models"),
            (Method::POST, "/v1/models/upload"),
            (Method::DELETE, "/v1/models/m"),
            (Method::POST, "/v1/models/m/activate"),
            (Method::POST, "/v1/models/m/deactivate"),
        ] {
            assert!(is_admin_route(&m, p), "{m} {p}");
        }
        for (m, p) in [
            (Method::GET, "/v1/models"),
            (Method::GET, "/v1/models/m"),
            (Method::GET, "/v1/models/m/events"),
            (Method::POST, "/v1/embeddings"),
            (Method::POST, "/v1/decisions"),
            (Method::POST, "/classify"),
            (Method::POST, "/v1/modelsx"),
            (Method::GET, "/metrics"),
        ] {
            assert!(!is_admin_route(&m, p), "{m} {p}");
        }
    }

    #[test]
    fn keys_compare_whole() {
        assert!(same_key("abc", "abc"));
        assert!(!same_key("abc", "abd"));
        assert!(!same_key("abc", "ab"));
        assert!(!same_key("", "a"));
    }
}
