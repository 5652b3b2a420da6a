//! What every handler shares: the server's settings and registry, reading request bodies, finding the model
//! a request names (with its role checked), and submitting protocol records to a finite model with
//! cancellation when the client goes away. Used by the built-in routes and the profile routes alike.

use crate::error::ApiError;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use serde_json::Value as Json;
use serve_contracts::finite::{FiniteService, Reply, Rows, Ticket};
use serve_runtime::registry::{Registry, Status};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// Server settings the routes need.
#[derive(Debug, Clone)]
pub struct Config {
    /// Inference bearer keys: every route except the ones that change the set of served models. With no
    /// inference and no admin keys, nothing is authenticated.
    pub api_keys: Vec<String>,
    /// Admin bearer keys: every route, including registration, upload, unregistration, activation and
    /// deactivation.
    pub admin_keys: Vec<String>,
    /// How long a connection may take to send a request's headers, and stay idle between keep-alive
    /// requests, before it is closed; `None`: no limit.
    pub idle_timeout: Option<std::time::Duration>,
    /// Largest request body.
    pub body_limit: usize,
    /// Where checkpoints of uploaded packages that carry no parameter files resolve.
    pub params_root: Option<PathBuf>,
    /// Where uploaded parameter files are stored, a directory per upload (`None`: the system's temporary
    /// directory, `loom-serve-uploads/`).
    pub upload_dir: Option<PathBuf>,
    /// The most parameter-file bytes one upload may carry.
    pub max_upload_bytes: u64,
    /// Most inputs in one embeddings request.
    pub max_inputs: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            api_keys: Vec::new(),
            admin_keys: Vec::new(),
            idle_timeout: Some(std::time::Duration::from_secs(60)),
            body_limit: 2 << 20,
            params_root: None,
            upload_dir: None,
            max_upload_bytes: DEFAULT_MAX_UPLOAD_BYTES,
            max_inputs: 2048,
        }
    }
}

/// Default [`Config::max_upload_bytes`]: 4 GiB.
pub const DEFAULT_MAX_UPLOAD_BYTES: u64 = 4 << 30;

impl Config {
    /// The directory uploads' parameter files are stored under.
    pub fn upload_dir(&self) -> PathBuf {
        self.upload_dir
            .clone()
            .unwrap_or_else(|| std::env::temp_dir().join("loom-serve-uploads"))
    }
}

/// Shared state of every handler.
#[derive(Debug)]
pub struct AppState {
    pub registry: Arc<Registry>,
    pub config: Config,
    /// False until start-up registrations are done (then `/health` is 200).
    pub ready: AtomicBool,
    /// Set by [`AppState::begin_drain`] (SIGTERM/SIGINT): `/health` answers 503, new work is refused with 503,
    /// accepted work finishes.
    draining: AtomicBool,
    /// Requests accepted and not yet answered in full (streams until their last byte), probes excepted.
    pub(crate) work: Work,
    pub(crate) requests: AtomicU64,
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
            draining: AtomicBool::new(false),
            work: Work::default(),
            requests: AtomicU64::new(0),
            profiles,
        })
    }

    /// Starts the drain: from now on `/health` answers `503 {"status": "draining"}` and requests other than
    /// reads (`GET`, `HEAD`) are refused with `503 server_draining`; requests already accepted go on.
    pub fn begin_drain(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Whether [`AppState::begin_drain`] was called.
    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Requests accepted and not answered in full yet (a streamed response counts until its last byte);
    /// `/health` and `/metrics` are not counted.
    pub fn work_in_flight(&self) -> usize {
        self.work.count.load(Ordering::SeqCst)
    }

    /// Resolves when no counted request is in flight.
    pub async fn work_done(&self) {
        self.work.idle().await
    }
}

/// Counts requests in flight; [`Work::idle`] waits for none.
#[derive(Debug, Default)]
pub(crate) struct Work {
    count: AtomicUsize,
    idle: tokio::sync::Notify,
}

impl Work {
    /// Resolves when the count is zero.
    async fn idle(&self) {
        loop {
            // Registered before the count is read: a guard dropping in between still wakes it.
            let notified = self.idle.notified();
            if self.count.load(Ordering::SeqCst) == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// One counted request ([`AppState::work_in_flight`]); dropping it ends the count.
#[derive(Debug)]
pub(crate) struct WorkGuard(Arc<AppState>);

impl WorkGuard {
    pub(crate) fn new(st: &Arc<AppState>) -> WorkGuard {
        st.work.count.fetch_add(1, Ordering::SeqCst);
        WorkGuard(st.clone())
    }
}

impl Drop for WorkGuard {
    fn drop(&mut self) {
        if self.0.work.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.work.idle.notify_waiters();
        }
    }
}

pub(crate) type St = State<Arc<AppState>>;
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

pub(crate) fn body_json(body: Result<Bytes, BytesRejection>) -> Result<Json, ApiError> {
    let bytes = body_bytes(body)?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))
}

/// The serving finite model `model` if it serves `role` (404 unknown, 503 not ready, 501 another role). An
/// empty `model` means the only model serving `role` (for profile routes whose dialect names none).
pub(crate) fn finite_service(
    st: &AppState,
    model: &str,
    role: &str,
) -> Result<Arc<FiniteService>, ApiError> {
    let name = if model.is_empty() {
        let serving: Vec<String> = st
            .registry
            .list()
            .into_iter()
            .filter(|m| m.role == role && m.status != Status::Failed)
            .map(|m| m.name)
            .collect();
        match serving.as_slice() {
            [one] => one.clone(),
            [] => {
                return Err(ApiError::new(
                    StatusCode::NOT_FOUND,
                    "invalid_request_error",
                    "model_not_found",
                    format!("no model serving {role} is registered"),
                ));
            }
            many => {
                return Err(ApiError::bad_request(format!(
                    "the request names no model and {} models serve {role} ({}): name one",
                    many.len(),
                    many.join(", ")
                )));
            }
        }
    } else {
        model.to_string()
    };
    let svc = st.registry.service(&name)?;
    let served = &svc.model().doc.role;
    if served != role {
        return Err(ApiError::from(serve_runtime::Error::Unsupported(format!(
            "model `{name}` serves {served}, not {role}"
        ))));
    }
    svc.as_any().downcast::<FiniteService>().map_err(|_| {
        ApiError::from(serve_runtime::Error::Unsupported(format!(
            "model `{name}` is not a finite model"
        )))
    })
}

/// [`finite_service`] for the model a JSON body names in `model` (required).
pub(crate) fn finite_service_of(
    st: &AppState,
    body: &Json,
    role: &str,
) -> Result<Arc<FiniteService>, ApiError> {
    let model = body
        .get("model")
        .and_then(Json::as_str)
        .ok_or_else(|| ApiError::bad_request("`model` (a string) is required"))?;
    finite_service(st, model, role)
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

/// What an error message calls record `i` of a request of `n` records: nothing when the request has one
/// input, else `input 3`, or the name the route gives it (`question `q1``).
pub(crate) fn label(names: Option<&[String]>, n: usize, i: usize) -> Option<String> {
    // `i` past the records: the error is the whole request's (e.g. its memory forecast), no record's.
    (n > 1 && i < n).then(|| match names.and_then(|names| names.get(i)) {
        Some(name) => format!("question `{name}`"),
        None => format!("input {i}"),
    })
}

/// `e` prefixed with [`label`]'s name for record `i`.
pub(crate) fn in_record(e: ApiError, names: Option<&[String]>, n: usize, i: usize) -> ApiError {
    match label(names, n, i) {
        Some(l) => e.within(&l),
        None => e,
    }
}

/// Submits each record as one finite request (all or none: a record the model refuses cancels the ones
/// submitted before it; its error names the record when there are several, see [`label`], with `names`
/// when the route has names for them). Shared by the built-in finite routes and the profile routes
/// (`profiles.rs`).
pub(crate) async fn submit_records(
    svc: &Arc<FiniteService>,
    records: Vec<Vec<u8>>,
    names: Option<&[String]>,
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
        let mut inputs: Vec<(Vec<u8>, Reply)> = records
            .into_iter()
            .zip(txs)
            .map(|(rec, tx)| {
                let reply: Reply = Box::new(move |r| {
                    let _ = tx.send(r);
                });
                (rec, reply)
            })
            .collect();
        if inputs.len() == 1 {
            // A request that arrives alone may run its cohort right here when cohorts are quick.
            let (rec, reply) = inputs.remove(0);
            return svc2
                .submit_one(rec, reply)
                .map(|t| vec![t])
                .map_err(|e| (0, e));
        }
        // The records are queued together, so that they can share a cohort.
        svc2.submit_all(inputs)
    };
    let admitted = if svc.admits_inline() {
        admit()
    } else {
        tokio::task::spawn_blocking(admit)
            .await
            .map_err(|e| ApiError::from(serve_runtime::Error::Internal(e.to_string())))?
    };
    let tickets = admitted.map_err(|(i, e)| in_record(ApiError::from(e), names, n, i))?;
    Ok(Submitted {
        results: rxs,
        units: tickets.iter().map(|t| t.units).sum(),
        guard: CancelOnDrop(tickets, false),
    })
}

/// Submits each record as one finite request and waits for every result (in order). An error names the
/// record that failed when there are several ([`label`]).
pub(crate) async fn run_records(
    svc: Arc<FiniteService>,
    records: Vec<Vec<u8>>,
    names: Option<&[String]>,
) -> Result<(Vec<Rows>, i64), ApiError> {
    let n = records.len();
    let Submitted {
        results,
        units,
        mut guard,
    } = submit_records(&svc, records, names).await?;
    let mut out = Vec::with_capacity(results.len());
    for (i, rx) in results.into_iter().enumerate() {
        let r = rx
            .await
            .map_err(|_| ApiError::from(serve_runtime::Error::Cancelled))?;
        out.push(r.map_err(|e| in_record(ApiError::from(e), names, n, i))?);
    }
    guard.disarm();
    drop(svc);
    Ok((out, units))
}
