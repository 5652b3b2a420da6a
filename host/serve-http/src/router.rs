//! The router: every built-in route (one file per route family: [`crate::lifecycle`], [`crate::embeddings`],
//! [`crate::decisions`], [`crate::classify`]), the profile routes ([`crate::profiles`]), `/health`, `/metrics`,
//! and the `frame` middleware (request ids, authentication, the request counter).

use crate::error::ApiError;
use crate::state::{AppState, St, WorkGuard};
use crate::{chat, classify, decisions, embeddings, lifecycle, score, sessions};
use axum::Router;
use axum::extract::{DefaultBodyLimit, RawQuery, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;
use serve_runtime::registry::Status;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// The router.
pub fn router(state: Arc<AppState>) -> Router {
    let limit = state.config.body_limit;
    Router::new()
        .route("/health", get(health))
        .route("/health/live", get(live))
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
        .route("/v1/score", post(score::score))
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

/// Request ids, authentication, the request counter, and the drain: every request but the probes
/// ([`is_probe`]) is counted in [`AppState::work_in_flight`] until its response's last byte; while the server
/// drains, requests other than reads are refused with `503 server_draining` and every response closes its
/// connection (so that a client's next request opens one to another replica).
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
    // Counted before the drain flag is read: the drain waits for every request that got past this point.
    let guard = (!is_probe(&path)).then(|| WorkGuard::new(&st));
    let draining = st.draining();
    let mut resp = match refusal(&st.config, &req) {
        Some(refused) => refused,
        None if draining && !is_read(&method) => draining_refusal(),
        None => next.run(req).await,
    };
    log::debug!("{id} {method} {path} -> {}", resp.status().as_u16());
    if let Ok(v) = HeaderValue::from_str(&id) {
        resp.headers_mut().insert("x-request-id", v);
    }
    if draining || st.draining() {
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    match guard {
        Some(guard) => resp.map(|body| {
            axum::body::Body::new(Counted {
                body,
                _guard: guard,
            })
        }),
        None => resp,
    }
}

/// The probes, never counted as work in flight: `/health`, `/health/live`, `/metrics`.
fn is_probe(path: &str) -> bool {
    matches!(path, "/health" | "/health/live" | "/metrics")
}

fn is_read(method: &axum::http::Method) -> bool {
    method == axum::http::Method::GET || method == axum::http::Method::HEAD
}

/// What a request that is not a read gets while the server drains (`Retry-After: 1` comes with every 503).
fn draining_refusal() -> Response {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "server_error",
        "server_draining",
        "this server is shutting down: it finishes the requests it accepted and takes no new ones; retry \
         (another replica will answer)",
    )
    .into_response()
}

/// A response body that keeps its request counted in [`AppState::work_in_flight`] until it is dropped
/// (after its last frame, or when the client goes away).
struct Counted {
    body: axum::body::Body,
    _guard: WorkGuard,
}

impl axum::body::HttpBody for Counted {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
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

/// Authentication and scopes: with no keys configured everything is open; `/health` and `/health/live`
/// always are. An admin key may call every route; an inference key every route but the
/// [admin routes](is_admin_route) (403); no valid key is a 401. Both carry a `WWW-Authenticate` challenge. `None`: the request may go on.
fn refusal(config: &crate::state::Config, req: &Request) -> Option<Response> {
    let open = matches!(req.uri().path(), "/health" | "/health/live");
    if open || (config.api_keys.is_empty() && config.admin_keys.is_empty()) {
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

/// Readiness: `200` when the server serves every model it has; `503` while start-up registrations run, while
/// a model is being prepared with no version serving (a first registration, an activation), and from the
/// drain's start (SIGTERM) on. Failed models do not make it `503` (the server serves the others; they are
/// listed) unless the query says `strict=true`: then a failed model is a `503` too (a pod that cannot serve
/// every model it was deployed with takes no traffic, and a rollout of a broken version stops there).
async fn health(State(st): St, RawQuery(query): RawQuery) -> Response {
    let strict = query.as_deref().is_some_and(|q| {
        q.split('&')
            .any(|kv| matches!(kv, "strict" | "strict=true" | "strict=1"))
    });
    let unavailable = |body: serde_json::Value| {
        (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response()
    };
    if st.draining() {
        return unavailable(json!({
            "status": "draining",
            "reason": "shutting down: finishing accepted work, refusing new work",
            "in_flight": st.work_in_flight(),
        }));
    }
    if !st.ready.load(Ordering::Relaxed) {
        return unavailable(json!({"status": "starting"}));
    }
    let models = st.registry.list();
    let serving: Vec<String> = st
        .registry
        .services()
        .iter()
        .map(|s| s.model().name.clone())
        .collect();
    let preparing: Vec<&str> = models
        .iter()
        .filter(|m| m.status == Status::Preparing && !serving.contains(&m.name))
        .map(|m| m.name.as_str())
        .collect();
    if !preparing.is_empty() {
        return unavailable(json!({"status": "preparing", "preparing": preparing}));
    }
    let ready = models.iter().filter(|m| m.status == Status::Ready).count();
    let failed: Vec<&str> = models
        .iter()
        .filter(|m| m.status == Status::Failed)
        .map(|m| m.name.as_str())
        .collect();
    if strict && !failed.is_empty() {
        return unavailable(json!({"status": "failed", "failed": failed}));
    }
    let mut body = json!({"status": "ok", "models_ready": ready});
    if !failed.is_empty() {
        body["models_failed"] = json!(failed);
    }
    (StatusCode::OK, axum::Json(body)).into_response()
}

/// Liveness: `200` whenever the process answers HTTP, also while models prepare and while it drains.
async fn live() -> Response {
    (StatusCode::OK, axum::Json(json!({"status": "alive"}))).into_response()
}

async fn metrics(State(st): St) -> Response {
    let text = crate::metrics::render(&st);
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
