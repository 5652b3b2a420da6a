//! HTTP profile interface (ABI 1.2): routes, request parsing into protocol records, response encoding.
//!
//! A [`PluginKind::PROFILE`](crate::PluginKind::PROFILE) plugin's
//! [`LoomPlugin::profile`](crate::LoomPlugin::profile) returns a [`Profile`]: an HTTP dialect (TEI's `/embed`,
//! a vendor's classification route, ...) for models the server already serves. The server owns HTTP itself
//! (listening, authentication, request ids, the body limit, model lookup, scheduling, the OpenAI error
//! shape); a profile only translates bytes:
//!
//! 1. [`Profile::routes`] (asked once, when the server starts): each [`ProfileRoute`] is a method, a literal
//!    path (no parameters) and the model *role* it serves (`"embeddings"`, `"decisions"`: the `role` of
//!    `model.json`). The role fixes the protocol record format (`docs/serving/finite.md`). A route that
//!    collides with a built-in route or with a route of a profile loaded earlier rejects the whole profile.
//! 2. [`Profile::parse`] gets the route's index, the request's `Content-Type` and body and a
//!    [`ParseContext`]; it returns a [`ParsedRequest`]: the model name (empty: the server picks the only
//!    model of the route's role, and answers 400 when there is not exactly one), the protocol input records
//!    (byte buffers exactly as the built-in routes produce them, one finite request each) and an opaque
//!    `state` the profile wants back when encoding (its request options, e.g. `normalize`).
//! 3. The server submits every record to the model, in order, and waits for all of them.
//! 4. [`Profile::encode`] gets an [`EncodeRequest`] (the model's name, the state, per record its result rows
//!    of `f32`, the usage units of the whole request) and returns a [`ProfileResponse`] (content type and
//!    body), which the server sends with status 200.
//!
//! Failures of `parse` or `encode` are a [`ProfileError`]: an [`ErrorClass`] (an HTTP status, 4xx for the
//! client's mistakes) and a message; the server answers with the OpenAI error shape
//! `{"error": {"message", "type", "code"}}`. Errors of the model (unknown model, overload, a trap in the
//! model's programs) never reach the profile: the server answers them as on its built-in routes.
//!
//! Everything that crosses is plain data ([`RVec`], [`RString`], `#[repr(C)]` structs, integer newtypes);
//! the profile never calls back into the host. Each call may come from any thread (the server calls on its
//! blocking pool) and calls for different requests run concurrently, so a profile is `Send + Sync` and keeps
//! per-request data in `state`, not in itself. Every method body runs under [`guard_profile`], which turns a
//! panic into an [`ErrorClass::INTERNAL`] error (a panic that reached the boundary would abort the server).
//!
//! Streamed responses (events) came in 1.4 as a separate object, [`ProfileEvents`](crate::ProfileEvents); see
//! the `events` module. Not in the interface: route parameters.

use abi_stable::std_types::{RBox, RBoxError, RResult, RSlice, RStr, RString, RVec};
use abi_stable::{StableAbi, sabi_trait};
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::{error, panic_message};

/// A profile as it crosses the boundary.
pub type ProfileBox = Profile_TO<'static, RBox<()>>;

/// The [`LoomPlugin::profile`](crate::LoomPlugin::profile) of a plugin that is not a profile: always an
/// error.
pub extern "C" fn no_profile() -> RResult<ProfileBox, RBoxError> {
    RResult::RErr(error("this plugin is not an HTTP profile plugin"))
}

/// An HTTP method, as a plain integer (unknown values are rejected by the server when it mounts the route).
#[repr(transparent)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HttpMethod(pub u32);

impl HttpMethod {
    /// `GET` (the body is empty).
    pub const GET: HttpMethod = HttpMethod(1);
    /// `POST`.
    pub const POST: HttpMethod = HttpMethod(2);
    /// `PUT`.
    pub const PUT: HttpMethod = HttpMethod(3);
    /// `DELETE`.
    pub const DELETE: HttpMethod = HttpMethod(4);
    /// `PATCH`.
    pub const PATCH: HttpMethod = HttpMethod(5);

    /// The method's name (`"GET"`, ...), or `"unknown"`.
    pub fn name(self) -> &'static str {
        match self {
            HttpMethod::GET => "GET",
            HttpMethod::POST => "POST",
            HttpMethod::PUT => "PUT",
            HttpMethod::DELETE => "DELETE",
            HttpMethod::PATCH => "PATCH",
            _ => "unknown",
        }
    }
}

impl fmt::Display for HttpMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            "unknown" => write!(f, "method {}", self.0),
            n => f.write_str(n),
        }
    }
}

/// One route a profile serves.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq, Eq)]
pub struct ProfileRoute {
    /// The method.
    pub method: HttpMethod,
    /// A literal path starting with `/` (no `{parameters}`, no wildcards, no query).
    pub path: RString,
    /// The model role it serves: `"embeddings"` or `"decisions"` (a finite package's `role`).
    pub role: RString,
}

impl ProfileRoute {
    /// A route.
    pub fn new(method: HttpMethod, path: &str, role: &str) -> ProfileRoute {
        ProfileRoute {
            method,
            path: RString::from(path),
            role: RString::from(role),
        }
    }
}

/// What the server tells [`Profile::parse`] about its limits.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParseContext {
    /// Most records one request may produce (the server checks it again).
    pub max_inputs: u64,
}

/// What [`Profile::parse`] returns.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq, Eq, Default)]
pub struct ParsedRequest {
    /// The model to run; empty: the only model serving the route's role.
    pub model: RString,
    /// The protocol input records, one finite request each, in the order the results come back.
    pub records: RVec<RVec<u8>>,
    /// Opaque bytes handed back in [`EncodeRequest::state`] (the request's options).
    pub state: RVec<u8>,
}

/// The class of a [`ProfileError`]: the HTTP status the server answers with.
#[repr(transparent)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ErrorClass(pub u16);

impl ErrorClass {
    /// 400: the body is malformed or a field is invalid.
    pub const BAD_REQUEST: ErrorClass = ErrorClass(400);
    /// 404: something the request names does not exist.
    pub const NOT_FOUND: ErrorClass = ErrorClass(404);
    /// 413: the request is larger than the profile accepts.
    pub const PAYLOAD_TOO_LARGE: ErrorClass = ErrorClass(413);
    /// 415: the content type is not one the profile reads.
    pub const UNSUPPORTED_MEDIA_TYPE: ErrorClass = ErrorClass(415);
    /// 422: well-formed, but the values cannot be processed.
    pub const UNPROCESSABLE: ErrorClass = ErrorClass(422);
    /// 500: the profile itself failed (a panic caught by [`guard_profile`] is one).
    pub const INTERNAL: ErrorClass = ErrorClass(500);
}

/// An error of [`Profile::parse`] or [`Profile::encode`].
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq, Eq)]
pub struct ProfileError {
    /// The HTTP status the server answers with (values outside 400-499 become 500).
    pub class: ErrorClass,
    /// What went wrong, for the client.
    pub message: RString,
}

impl ProfileError {
    /// An error of `class`.
    pub fn new(class: ErrorClass, message: impl Into<String>) -> ProfileError {
        ProfileError {
            class,
            message: RString::from(message.into()),
        }
    }
    /// A 400.
    pub fn bad_request(message: impl Into<String>) -> ProfileError {
        ProfileError::new(ErrorClass::BAD_REQUEST, message)
    }
    /// A 500.
    pub fn internal(message: impl Into<String>) -> ProfileError {
        ProfileError::new(ErrorClass::INTERNAL, message)
    }
}

impl fmt::Display for ProfileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.message, self.class.0)
    }
}

/// The result of one record: the rows the model's result plan gave it (for embeddings one row, the vector;
/// for decisions one row, a probability per choice).
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq, Default)]
pub struct RecordResult {
    /// The rows, in order.
    pub rows: RVec<RVec<f32>>,
}

/// What [`Profile::encode`] gets.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq, Default)]
pub struct EncodeRequest {
    /// The name of the model that ran.
    pub model: RString,
    /// [`ParsedRequest::state`], unchanged.
    pub state: RVec<u8>,
    /// One result per record of [`ParsedRequest::records`], in the same order.
    pub results: RVec<RecordResult>,
    /// The usage units of the whole request (tokens for text models), as `prepare_request` counted them.
    pub units: i64,
}

/// What [`Profile::encode`] returns; the server sends it with status 200.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq, Eq)]
pub struct ProfileResponse {
    /// The `Content-Type` header, e.g. `application/json`.
    pub content_type: RString,
    /// The body.
    pub body: RVec<u8>,
}

/// An HTTP profile (see the module doc).
#[sabi_trait]
pub trait Profile: Send + Sync {
    /// The routes, asked once at start-up; `route` below is an index into this list.
    fn routes(&self) -> RVec<ProfileRoute>;

    /// Parses one request to route `route` into records for the model.
    fn parse(
        &self,
        route: u32,
        content_type: RStr<'_>,
        body: RSlice<'_, u8>,
        context: ParseContext,
    ) -> RResult<ParsedRequest, ProfileError>;

    /// Encodes the results of a request that [`parse`](Profile::parse) accepted.
    #[sabi(last_prefix_field)]
    fn encode(&self, route: u32, request: &EncodeRequest)
    -> RResult<ProfileResponse, ProfileError>;
}

/// Runs a profile method under `catch_unwind`: a panic becomes an [`ErrorClass::INTERNAL`] error
/// `"{what}: the plugin panicked: {message}"`. Wrap every [`Profile`] method body in this.
///
/// ```
/// use loom_plugin_api::{ErrorClass, ProfileError, guard_profile};
///
/// let e = guard_profile("parse", || -> Result<(), ProfileError> { panic!("boom") });
/// let e = e.into_result().unwrap_err();
/// assert_eq!((e.class, e.message.as_str()), (ErrorClass::INTERNAL, "parse: the plugin panicked: boom"));
/// ```
pub fn guard_profile<T>(
    what: &str,
    f: impl FnOnce() -> Result<T, ProfileError>,
) -> RResult<T, ProfileError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r.into(),
        Err(p) => RResult::RErr(ProfileError::internal(format!(
            "{what}: the plugin panicked: {}",
            panic_message(&*p)
        ))),
    }
}

/// Runs a function returning a plain list (such as [`Profile::routes`]) under `catch_unwind`: a panic
/// gives an empty list, which the server reports as a profile without routes.
pub fn guard_list<T>(f: impl FnOnce() -> RVec<T>) -> RVec<T> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_default()
}
