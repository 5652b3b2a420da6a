//! HTTP profiles from plugins (`loom_plugin_api::Profile`, ABI 1.2, with streamed routes through
//! `loom_plugin_api::ProfileEvents`, ABI 1.4): checking their routes against the built-in ones and each
//! other, mounting them, and the one handler every profile route shares.
//!
//! A profile request runs like a built-in finite route, with the profile doing the HTTP/JSON part:
//!
//! ```text
//! body + Content-Type --Profile::parse (blocking pool)--> model name, protocol records, state
//!   --model lookup (the only model of the route's role when the name is empty), role check (501)-->
//!   --run_records: every record submitted to the model's FiniteService, results in order-->
//!   --Profile::encode (blocking pool)--> Content-Type + body, status 200
//! ```
//!
//! A **streamed** route (listed by the profile's `ProfileEvents::streams`) runs the same way up to the
//! submission of every record (so a bad record, an unknown model or overload are still ordinary error
//! responses), then: the START event is encoded (an error is still a response), status 200 with the
//! stream's content type goes out with the START bytes, and a task forwards one RESULT or ERROR event per
//! record as it finishes (completion order; an ERROR carries the status, code and message the one-body
//! routes would answer, and the other records go on), then END with the usage. Each event is encoded on
//! the blocking pool, one at a time per request. A client that goes away, or an `encode_event` error
//! (logged), ends the stream and cancels the records that have not run; a truncated stream has no END.
//!
//! A [`ProfileError`] becomes the OpenAI error shape with its class as the status (4xx as given, anything
//! else 500 naming the profile). Profiles catch their own panics ([`loom_plugin_api::guard_profile`]: a
//! panic is an `INTERNAL` error, so a 500 with the panic message); a panic on the host side of the call is
//! caught by the blocking task and is a 500 too. The server keeps serving either way.
//!
//! Route rules, checked when the server starts ([`Profiles::mount`]): a profile declares at least one route;
//! each has a known method, a known role (`serve_contracts::finite::ROLES`) and a literal path (`/`
//! then ASCII letters, digits and `-._~/`, at most 256 bytes). A path collides with a built-in route when it
//! matches it (a `{parameter}` segment matches any segment) or goes through one of its parameters (so
//! `/v1/models/x/y` is refused: it would change how `/v1/models/{name}` routes), whatever the method; and
//! with a profile mounted earlier when the paths are equal. A profile with any bad route is rejected whole,
//! in one line, and the others keep loading (profiles are checked in the loader's order: file name order).

use crate::error::ApiError;
use crate::state::{
    AppState, Submitted, body_bytes, finite_service, in_record, run_records, submit_records,
};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodFilter, on};
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use loom_plugin_api::abi_stable::std_types::{RSlice, RStr, RVec};
use loom_plugin_api::{
    EncodeRequest, ErrorClass, EventKind, HttpMethod, ParseContext, ProfileBox, ProfileError,
    ProfileEvent, ProfileEventsBox, RecordResult,
};
use serve_contracts::finite::{self, FiniteService};
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

/// Every path the built-in router serves (`routes::router`; a test keeps the two in step).
pub(crate) const BUILTIN_PATHS: &[&str] = &[
    "/health",
    "/health/live",
    "/metrics",
    "/v1/models",
    "/v1/models/upload",
    "/v1/models/{name}",
    "/v1/models/{name}/deactivate",
    "/v1/models/{name}/activate",
    "/v1/models/{name}/events",
    "/v1/embeddings",
    "/v1/decisions",
    "/classify",
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/score",
    "/v1/sessions",
    "/v1/sessions/{id}",
    "/v1/sessions/{id}/append",
    "/v1/sessions/{id}/checkpoints",
    "/v1/sessions/{id}/fork",
    "/v1/sessions/{id}/rewind",
];

/// Longest profile route path.
const MAX_PATH: usize = 256;

/// A loaded profile plugin, as the binary hands it over.
pub struct ProfilePlugin {
    /// The plugin id, e.g. `tei-0001`.
    pub id: String,
    /// The library it came from (for messages).
    pub path: PathBuf,
    /// The profile.
    pub profile: ProfileBox,
    /// Its streamed responses (ABI 1.4), if it has any.
    pub events: Option<ProfileEventsBox>,
}

impl fmt::Debug for ProfilePlugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProfilePlugin")
            .field("id", &self.id)
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// A profile that could not be mounted; displays as the one line to log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejectedProfile {
    pub id: String,
    pub path: PathBuf,
    pub reason: String,
}

impl fmt::Display for RejectedProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: profile `{}`: {}",
            self.path.display(),
            self.id,
            self.reason
        )
    }
}

/// How a streamed route answers.
struct Stream {
    events: Arc<ProfileEventsBox>,
    content_type: HeaderValue,
}

/// One mounted route of a profile.
struct MountedRoute {
    /// The profile's id.
    id: String,
    profile: Arc<ProfileBox>,
    /// The index into the profile's `routes()`.
    index: u32,
    method: HttpMethod,
    path: String,
    role: String,
    /// Set when the route answers with a stream of events.
    stream: Option<Stream>,
}

/// The profiles that passed the route checks.
#[derive(Default)]
pub struct Profiles {
    routes: Vec<Arc<MountedRoute>>,
}

impl fmt::Debug for Profiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.describe()).finish()
    }
}

fn method_filter(m: HttpMethod) -> Option<MethodFilter> {
    Some(match m {
        HttpMethod::GET => MethodFilter::GET,
        HttpMethod::POST => MethodFilter::POST,
        HttpMethod::PUT => MethodFilter::PUT,
        HttpMethod::DELETE => MethodFilter::DELETE,
        HttpMethod::PATCH => MethodFilter::PATCH,
        _ => return None,
    })
}

fn segments(path: &str) -> Vec<&str> {
    path.split('/').skip(1).collect()
}

/// Whether a literal profile path collides with a built-in path pattern (see the module doc).
fn collides_with_builtin(path: &str, builtin: &str) -> bool {
    let (p, b) = (segments(path), segments(builtin));
    let n = p.len().min(b.len());
    let is_param = |s: &str| s.starts_with('{');
    if !(0..n).all(|i| is_param(b[i]) || b[i] == p[i]) {
        return false;
    }
    p.len() == b.len() || b[..n].iter().any(|s| is_param(s))
}

fn check_path(path: &str) -> Result<(), String> {
    if !path.starts_with('/') {
        return Err(format!("route path {path:?} does not start with `/`"));
    }
    if path.len() > MAX_PATH {
        return Err(format!(
            "a route path is longer than {MAX_PATH} bytes ({})",
            path.len()
        ));
    }
    if let Some(c) = path
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "-._~/".contains(*c)))
    {
        return Err(format!(
            "route path {path:?} has {c:?}: paths are literal (letters, digits, `-._~/`; no parameters)"
        ));
    }
    if path.contains("//") {
        return Err(format!("route path {path:?} has an empty segment"));
    }
    Ok(())
}

impl Profiles {
    /// Checks every profile's routes (see the module doc) and keeps the ones that pass, in order; each
    /// rejected profile is one [`RejectedProfile`].
    pub fn mount(plugins: Vec<ProfilePlugin>) -> (Profiles, Vec<RejectedProfile>) {
        let mut out = Profiles::default();
        let mut rejected = Vec::new();
        for p in plugins {
            let profile = Arc::new(p.profile);
            let events = p.events.map(Arc::new);
            let checked = out
                .check(&profile)
                .and_then(|routes| Ok((streams(events.as_ref(), routes.len())?, routes)));
            match checked {
                Ok((mut streams, routes)) => {
                    for (index, (method, path, role)) in routes.into_iter().enumerate() {
                        let stream = streams[index].take().map(|content_type| Stream {
                            events: events.clone().expect("streams come from events"),
                            content_type,
                        });
                        out.routes.push(Arc::new(MountedRoute {
                            id: p.id.clone(),
                            profile: profile.clone(),
                            index: index as u32,
                            method,
                            path,
                            role,
                            stream,
                        }));
                    }
                }
                Err(reason) => rejected.push(RejectedProfile {
                    id: p.id,
                    path: p.path,
                    reason,
                }),
            }
        }
        (out, rejected)
    }

    /// The routes of one profile, or why it cannot be mounted next to the ones already kept.
    fn check(&self, profile: &ProfileBox) -> Result<Vec<(HttpMethod, String, String)>, String> {
        let declared = profile.routes();
        if declared.is_empty() {
            return Err("declares no routes".into());
        }
        if declared.len() > 64 {
            return Err(format!("declares {} routes; at most 64", declared.len()));
        }
        let mut routes: Vec<(HttpMethod, String, String)> = Vec::with_capacity(declared.len());
        for r in declared.iter() {
            let (method, path, role) = (r.method, r.path.as_str(), r.role.as_str());
            check_path(path)?;
            if method_filter(method).is_none() {
                return Err(format!("route {path}: unknown {method}"));
            }
            if !finite::ROLES.contains(&role) {
                return Err(format!(
                    "route {method} {path}: role {role:?} is not one this server serves ({})",
                    finite::ROLES.join(", ")
                ));
            }
            if let Some(b) = BUILTIN_PATHS
                .iter()
                .find(|b| collides_with_builtin(path, b))
            {
                return Err(format!(
                    "route {method} {path} collides with the built-in route {b}"
                ));
            }
            if let Some(other) = self.routes.iter().find(|m| m.path == path) {
                return Err(format!(
                    "route {method} {path} collides with profile `{}`'s route {} {}",
                    other.id, other.method, other.path
                ));
            }
            if routes.iter().any(|(m, p, _)| *m == method && p == path) {
                return Err(format!("route {method} {path} is declared twice"));
            }
            routes.push((method, path.to_string(), role.to_string()));
        }
        Ok(routes)
    }

    /// One line per mounted route: `tei-0001: POST /embed (embeddings)`, with `, streamed as TYPE` for a
    /// streamed route.
    pub fn describe(&self) -> Vec<String> {
        self.routes
            .iter()
            .map(|r| {
                let stream = r.stream.as_ref().map_or(String::new(), |s| {
                    format!(", streamed as {}", s.content_type.to_str().unwrap_or("?"))
                });
                format!("{}: {} {} ({}{stream})", r.id, r.method, r.path, r.role)
            })
            .collect()
    }

    /// Whether no profile route is mounted.
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }
}

/// Per route of a profile with `routes` routes, the content type of its stream (`None`: one body), or why
/// the profile's `streams()` cannot be mounted.
fn streams(
    events: Option<&Arc<ProfileEventsBox>>,
    routes: usize,
) -> Result<Vec<Option<HeaderValue>>, String> {
    let mut out = vec![None; routes];
    let Some(events) = events else {
        return Ok(out);
    };
    for s in events.streams().iter() {
        let slot = out.get_mut(s.route as usize).ok_or_else(|| {
            format!(
                "streams route {}, but the profile declares {routes} routes",
                s.route
            )
        })?;
        if slot.is_some() {
            return Err(format!("streams route {} twice", s.route));
        }
        let ct = s.content_type.as_str();
        if ct.is_empty() {
            return Err(format!("route {}'s stream has no content type", s.route));
        }
        *slot = Some(HeaderValue::from_str(ct).map_err(|_| {
            format!(
                "route {}'s stream content type {ct:?} is not a header value",
                s.route
            )
        })?);
    }
    Ok(out)
}

/// The profile routes of `state`, for `routes::router` to merge before its layers.
pub(crate) fn routes(state: &AppState) -> Router<Arc<AppState>> {
    let mut router = Router::new();
    for r in &state.profiles.routes {
        let Some(filter) = method_filter(r.method) else {
            continue;
        };
        let route = r.clone();
        let handler = move |State(st): State<Arc<AppState>>,
                            headers: HeaderMap,
                            body: Result<Bytes, BytesRejection>| {
            let route = route.clone();
            async move { handle(st, route, headers, body).await }
        };
        router = router.route(&r.path, on(filter, handler));
    }
    router
}

fn internal(message: String) -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "server_error",
        "profile_error",
        message,
    )
}

/// A profile's error as the response: 4xx as the profile classed it, anything else a 500 naming the
/// profile and the call.
fn profile_error(id: &str, call: &str, e: ProfileError) -> ApiError {
    let message = e.message.into_string();
    let code = match e.class {
        ErrorClass::NOT_FOUND => "not_found",
        ErrorClass::PAYLOAD_TOO_LARGE => "request_too_large",
        ErrorClass::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        _ => "invalid_request",
    };
    match StatusCode::from_u16(e.class.0) {
        Ok(status) if status.is_client_error() => {
            ApiError::new(status, "invalid_request_error", code, message)
        }
        _ => internal(format!("profile `{id}`: {call}: {message}")),
    }
}

async fn handle(
    st: Arc<AppState>,
    route: Arc<MountedRoute>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_bytes(body)?;
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let max_inputs = st.config.max_inputs;
    let context = ParseContext {
        max_inputs: max_inputs as u64,
    };
    let r = route.clone();
    let parsed = tokio::task::spawn_blocking(move || {
        r.profile
            .parse(
                r.index,
                RStr::from_str(&content_type),
                RSlice::from_slice(&body),
                context,
            )
            .into_result()
    })
    .await
    .map_err(|e| internal(format!("profile `{}`: parse: {e}", route.id)))?
    .map_err(|e| profile_error(&route.id, "parse", e))?;
    let svc = finite_service(&st, parsed.model.as_str(), &route.role)?;
    if parsed.records.is_empty() {
        return Err(ApiError::bad_request("the request has no inputs"));
    }
    if parsed.records.len() > max_inputs {
        return Err(ApiError::bad_request(format!(
            "{} inputs in one request; at most {max_inputs}",
            parsed.records.len()
        )));
    }
    let model = svc.model.name.clone();
    let records: Vec<Vec<u8>> = parsed.records.into_iter().map(RVec::into_vec).collect();
    if route.stream.is_some() {
        return stream_response(route, svc, model, parsed.state, records).await;
    }
    let (rows, units) = run_records(svc, records, None).await?;
    let request = EncodeRequest {
        model: model.into(),
        state: parsed.state,
        results: rows
            .into_iter()
            .map(|r| RecordResult {
                rows: r.into_iter().map(RVec::from).collect(),
            })
            .collect(),
        units,
    };
    let r = route.clone();
    let encoded =
        tokio::task::spawn_blocking(move || r.profile.encode(r.index, &request).into_result())
            .await
            .map_err(|e| internal(format!("profile `{}`: encode: {e}", route.id)))?
            .map_err(|e| profile_error(&route.id, "encode", e))?;
    let content_type = HeaderValue::from_str(encoded.content_type.as_str()).map_err(|_| {
        internal(format!(
            "profile `{}`: encode: the content type {:?} is not a header value",
            route.id,
            encoded.content_type.as_str()
        ))
    })?;
    Ok((
        [(header::CONTENT_TYPE, content_type)],
        encoded.body.into_vec(),
    )
        .into_response())
}

/// One event of a streamed route, encoded on the blocking pool; the error is the line to log.
async fn encode_event(route: &Arc<MountedRoute>, event: ProfileEvent) -> Result<Bytes, String> {
    let r = route.clone();
    let kind = event.kind;
    let encoded = tokio::task::spawn_blocking(move || {
        let stream = r.stream.as_ref().expect("a streamed route");
        stream.events.encode_event(r.index, &event).into_result()
    })
    .await;
    match encoded {
        Ok(Ok(bytes)) => Ok(Bytes::from(bytes.into_vec())),
        Ok(Err(e)) => Err(format!(
            "profile `{}`: encode_event ({}): {e}",
            route.id, kind.0
        )),
        Err(e) => Err(format!("profile `{}`: encode_event: {e}", route.id)),
    }
}

/// A streamed route's response (see the module doc): every record is already parsed, the model found.
async fn stream_response(
    route: Arc<MountedRoute>,
    svc: Arc<FiniteService>,
    model: String,
    state: RVec<u8>,
    records: Vec<Vec<u8>>,
) -> Result<Response, ApiError> {
    let total = records.len() as u64;
    let Submitted {
        results,
        units,
        mut guard,
    } = submit_records(&svc, records, None).await?;
    drop(svc);
    let base = ProfileEvent {
        model: model.into(),
        state,
        total,
        ..ProfileEvent::default()
    };
    let start = ProfileEvent {
        kind: EventKind::START,
        ..base.clone()
    };
    let start = encode_event(&route, start).await.map_err(internal)?;
    let content_type = route
        .stream
        .as_ref()
        .expect("a streamed route")
        .content_type
        .clone();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(16);
    let _ = tx.try_send(Ok(start));
    tokio::spawn(async move {
        let mut pending: FuturesUnordered<_> = results
            .into_iter()
            .enumerate()
            .map(|(i, rx)| async move { (i, rx.await) })
            .collect();
        let mut done = 0u64;
        while let Some((index, r)) = pending.next().await {
            done += 1;
            let mut event = ProfileEvent {
                index: index as u64,
                done,
                ..base.clone()
            };
            match r.unwrap_or(Err(serve_runtime::Error::Cancelled)) {
                Ok(rows) => {
                    event.kind = EventKind::RESULT;
                    event.result = RecordResult {
                        rows: rows.into_iter().map(RVec::from).collect(),
                    };
                }
                Err(e) => {
                    let e = in_record(ApiError::from(e), None, total as usize, index);
                    event.kind = EventKind::ERROR;
                    event.error_status = e.status.as_u16();
                    event.error_code = e.code.into();
                    event.error_message = e.message.into();
                }
            }
            let bytes = match encode_event(&route, event).await {
                Ok(b) => b,
                Err(line) => {
                    log::warn!("{line}: the stream ends here");
                    return;
                }
            };
            if tx.send(Ok(bytes)).await.is_err() {
                return; // the client went away: `guard` cancels what has not run
            }
        }
        guard.disarm();
        let end = ProfileEvent {
            kind: EventKind::END,
            done,
            units,
            ..base
        };
        match encode_event(&route, end).await {
            Ok(b) => {
                let _ = tx.send(Ok(b)).await;
            }
            Err(line) => log::warn!("{line}: the stream ends without its END event"),
        }
    });
    let body =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (b, rx)) });
    Ok((
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        Body::from_stream(body),
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use loom_plugin_api::abi_stable::sabi_trait::TD_Opaque;
    use loom_plugin_api::abi_stable::std_types::RResult;
    use loom_plugin_api::{
        ParsedRequest, Profile, Profile_TO, ProfileEvents, ProfileEvents_TO, ProfileResponse,
        ProfileRoute, StreamRoute,
    };

    struct Fake(Vec<ProfileRoute>);

    impl Profile for Fake {
        fn routes(&self) -> RVec<ProfileRoute> {
            self.0.clone().into()
        }
        fn parse(
            &self,
            _: u32,
            _: RStr<'_>,
            _: RSlice<'_, u8>,
            _: ParseContext,
        ) -> RResult<ParsedRequest, ProfileError> {
            RResult::RErr(ProfileError::bad_request("fake"))
        }
        fn encode(&self, _: u32, _: &EncodeRequest) -> RResult<ProfileResponse, ProfileError> {
            RResult::RErr(ProfileError::internal("fake"))
        }
    }

    fn plugin(id: &str, routes: &[(HttpMethod, &str, &str)]) -> ProfilePlugin {
        let routes = routes
            .iter()
            .map(|(m, p, r)| ProfileRoute::new(*m, p, r))
            .collect();
        ProfilePlugin {
            id: id.into(),
            path: format!("lib{id}.so").into(),
            profile: Profile_TO::from_value(Fake(routes), TD_Opaque),
            events: None,
        }
    }

    const POST: HttpMethod = HttpMethod::POST;

    fn rejection(routes: &[(HttpMethod, &str, &str)]) -> String {
        let (p, r) = Profiles::mount(vec![plugin("x-0001", routes)]);
        assert!(p.is_empty());
        assert_eq!(r.len(), 1);
        r[0].to_string()
    }

    #[test]
    fn routes_colliding_with_builtins_or_earlier_profiles_reject_the_profile() {
        let (p, r) = Profiles::mount(vec![
            plugin("a-0001", &[(POST, "/embed", "embeddings")]),
            plugin(
                "b-0001",
                &[(POST, "/ok", "embeddings"), (POST, "/embed", "embeddings")],
            ),
            plugin("c-0001", &[(POST, "/v1/embeddings", "embeddings")]),
            plugin("d-0001", &[(POST, "/predict", "decisions")]),
        ]);
        assert_eq!(
            p.describe(),
            [
                "a-0001: POST /embed (embeddings)",
                "d-0001: POST /predict (decisions)"
            ]
        );
        let lines: Vec<String> = r.iter().map(|r| r.to_string()).collect();
        assert_eq!(
            lines,
            [
                "libb-0001.so: profile `b-0001`: route POST /embed collides with profile `a-0001`'s route POST /embed",
                "libc-0001.so: profile `c-0001`: route POST /v1/embeddings collides with the built-in route /v1/embeddings",
            ]
        );
    }

    #[test]
    fn bad_routes_are_one_line_each() {
        assert!(
            rejection(&[(HttpMethod::GET, "/v1/models/x", "embeddings")]).ends_with(
                "route GET /v1/models/x collides with the built-in route /v1/models/{name}"
            )
        );
        assert!(rejection(&[(POST, "/v1/models/x/y/z", "embeddings")]).contains("built-in route"));
        assert!(rejection(&[(HttpMethod::GET, "/health", "embeddings")]).contains("/health"));
        assert!(rejection(&[]).ends_with("declares no routes"));
        assert!(rejection(&[(POST, "embed", "embeddings")]).contains("does not start with `/`"));
        assert!(rejection(&[(POST, "/e/{x}", "embeddings")]).contains("paths are literal"));
        assert!(rejection(&[(POST, "/e//f", "embeddings")]).contains("empty segment"));
        assert!(rejection(&[(HttpMethod(9), "/e", "embeddings")]).contains("unknown method 9"));
        assert!(rejection(&[(POST, "/e", "chat")]).contains("role \"chat\" is not one"));
        assert!(
            rejection(&[(POST, "/e", "embeddings"), (POST, "/e", "embeddings")])
                .contains("declared twice")
        );
        // Paths next to built-ins but not through them are fine.
        for ok in ["/health/x", "/v1/embed", "/v1/modelsx", "/metrics2"] {
            let (p, r) = Profiles::mount(vec![plugin("ok-0001", &[(POST, ok, "embeddings")])]);
            assert!(r.is_empty() && !p.is_empty(), "{ok}: {r:?}");
        }
    }

    struct FakeEvents(Vec<StreamRoute>);

    impl ProfileEvents for FakeEvents {
        fn streams(&self) -> RVec<StreamRoute> {
            self.0.clone().into()
        }
        fn encode_event(&self, _: u32, _: &ProfileEvent) -> RResult<RVec<u8>, ProfileError> {
            RResult::RErr(ProfileError::internal("fake"))
        }
    }

    fn streaming(streams: Vec<StreamRoute>) -> (Profiles, Vec<String>) {
        let mut p = plugin(
            "s-0001",
            &[(POST, "/a", "embeddings"), (POST, "/b", "embeddings")],
        );
        p.events = Some(ProfileEvents_TO::from_value(FakeEvents(streams), TD_Opaque));
        let (p, r) = Profiles::mount(vec![p]);
        (p, r.iter().map(|r| r.to_string()).collect())
    }

    #[test]
    fn streamed_routes_are_checked_when_mounted() {
        let (p, r) = streaming(vec![StreamRoute::new(1, "application/x-ndjson")]);
        assert!(r.is_empty(), "{r:?}");
        assert_eq!(
            p.describe(),
            [
                "s-0001: POST /a (embeddings)",
                "s-0001: POST /b (embeddings, streamed as application/x-ndjson)"
            ]
        );
        let one = |streams| {
            let (p, r) = streaming(streams);
            assert!(p.is_empty());
            assert_eq!(r.len(), 1);
            r[0].clone()
        };
        assert!(
            one(vec![StreamRoute::new(2, "text/event-stream")])
                .ends_with("streams route 2, but the profile declares 2 routes")
        );
        assert!(
            one(vec![
                StreamRoute::new(0, "text/event-stream"),
                StreamRoute::new(0, "text/event-stream")
            ])
            .ends_with("streams route 0 twice")
        );
        assert!(
            one(vec![StreamRoute::new(0, "")]).ends_with("route 0's stream has no content type")
        );
        assert!(one(vec![StreamRoute::new(0, "a\nb")]).contains("is not a header value"));
    }

    #[test]
    fn profile_errors_keep_client_classes() {
        let e = profile_error("t", "parse", ProfileError::bad_request("bad `inputs`"));
        assert_eq!(
            (e.status, e.code, e.message.as_str()),
            (StatusCode::BAD_REQUEST, "invalid_request", "bad `inputs`")
        );
        let e = profile_error(
            "t",
            "parse",
            ProfileError::new(ErrorClass::UNSUPPORTED_MEDIA_TYPE, "json only"),
        );
        assert_eq!(e.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
        let e = profile_error("t", "encode", ProfileError::internal("boom"));
        assert_eq!(
            (e.status, e.message.as_str()),
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "profile `t`: encode: boom"
            )
        );
        let e = profile_error("t", "parse", ProfileError::new(ErrorClass(200), "odd"));
        assert_eq!(e.status, StatusCode::INTERNAL_SERVER_ERROR);
    }

    /// `BUILTIN_PATHS` is every path `routes::router` mounts (read from its source, so that a new built-in
    /// route cannot be forgotten here).
    #[test]
    fn builtin_paths_match_the_router() {
        let src = include_str!("router.rs");
        let start = src.find("pub fn router(").expect("router::router");
        let body = &src[start..];
        let body = &body[..body.find("\n}\n").expect("end of router")];
        let mut found: Vec<&str> = body
            .split(".route(")
            .skip(1)
            .map(|s| {
                let s = s.trim_start().strip_prefix('"').expect("a literal path");
                &s[..s.find('"').expect("closing quote")]
            })
            .collect();
        found.sort();
        let mut ours = BUILTIN_PATHS.to_vec();
        ours.sort();
        assert_eq!(found, ours);
    }
}
