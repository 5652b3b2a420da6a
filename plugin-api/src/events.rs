//! ABI 1.4: event encoding for HTTP profiles, i.e. streamed responses.
//!
//! A profile plugin may answer some of its routes with a **stream of events** instead of one body: the server
//! writes each event's bytes to the response as soon as the event happens, so a client sending many inputs
//! gets each result when its cohort finishes rather than all of them at the end (and a client that goes away
//! cancels what has not run yet). The capability is a separate object, [`ProfileEvents`], handed out by the
//! root-module field appended in 1.4, [`crate::LoomPlugin::profile_events`], for the reason the `files`
//! module doc gives: [`crate::Profile`]'s vtable cannot grow without making abi_stable refuse every profile
//! plugin built against 1.2 or 1.3. A profile without streamed routes puts [`no_profile_events`] in the
//! field; plugins built before 1.4 have no field and all their routes answer with one body.
//!
//! # Flow
//!
//! 1. [`ProfileEvents::streams`] (asked once, when the server mounts the profile) lists the routes, by
//!    index into [`crate::Profile::routes`], that stream, each with the response's `Content-Type`
//!    (`application/x-ndjson`, `text/event-stream`, ...). An index out of range, a route listed twice or a
//!    content type that is not a header value rejects the whole profile, in one line.
//! 2. A request to such a route is parsed by [`crate::Profile::parse`] as usual, and every record is
//!    submitted to the model. Failures up to here (a parse error, an unknown model, a record the model's
//!    `prepare_request` refuses, overload) are ordinary error responses: nothing has been sent yet.
//! 3. The server calls [`ProfileEvents::encode_event`] with an [`EventKind::START`] event; an error here is
//!    still an ordinary error response. Then it sends status 200 with the stream's content type and the
//!    START event's bytes (which may be empty).
//! 4. As each record finishes, in **completion order** (not record order: [`ProfileEvent::index`] says
//!    which record it is), one [`EventKind::RESULT`] event (the record's result rows) or one
//!    [`EventKind::ERROR`] event (the status, code and message the server's non-streamed routes would have
//!    answered for that failure; the other records go on).
//! 5. After the last record, one [`EventKind::END`] event with the usage units of the whole request, then
//!    the response ends.
//!
//! An `encode_event` error (or a panic, caught by [`crate::guard_profile`]) after the stream has started
//! cannot change the status any more: the server logs it, cancels the records that have not finished and
//! ends the response without an END event, which is how a client tells a truncated stream. The events of
//! one request are encoded one at a time, in order; events of different requests concurrently, on the
//! server's blocking pool (a profile is `Send + Sync`; per-request data lives in
//! [`crate::ParsedRequest::state`], handed back in every event).

use crate::{ProfileError, RecordResult, error};
use abi_stable::std_types::{RBox, RBoxError, RResult, RString, RVec};
use abi_stable::{StableAbi, sabi_trait};

/// The event interface as it crosses the boundary.
pub type ProfileEventsBox = ProfileEvents_TO<'static, RBox<()>>;

/// What a 1.4 plugin without streamed routes puts in [`crate::LoomPlugin::profile_events`] (every HAL and
/// codec plugin, and profiles that answer every route with one body).
pub extern "C" fn no_profile_events() -> RResult<ProfileEventsBox, RBoxError> {
    RResult::RErr(error(NO_PROFILE_EVENTS))
}

/// The error text of [`no_profile_events`], which the host takes as "no streamed routes" (any other error of
/// the factory is reported).
pub const NO_PROFILE_EVENTS: &str = "this plugin streams no responses";

/// One route answered with a stream.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq, Eq)]
pub struct StreamRoute {
    /// The route's index in [`crate::Profile::routes`].
    pub route: u32,
    /// The response's `Content-Type`.
    pub content_type: RString,
}

impl StreamRoute {
    /// Route `route` streams with `content_type`.
    pub fn new(route: u32, content_type: &str) -> StreamRoute {
        StreamRoute {
            route,
            content_type: RString::from(content_type),
        }
    }
}

/// What happened: the kind of a [`ProfileEvent`].
#[repr(transparent)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct EventKind(pub u32);

impl EventKind {
    /// Before any record finished: the head of the stream (`total` is set).
    pub const START: EventKind = EventKind(1);
    /// A record finished: `index`, `result`, `done`, `total` are set.
    pub const RESULT: EventKind = EventKind(2);
    /// A record failed: `index`, `done`, `total` and the `error_*` fields are set.
    pub const ERROR: EventKind = EventKind(3);
    /// Every record finished (or failed): `units`, `done`, `total` are set.
    pub const END: EventKind = EventKind(4);
}

/// One event of a streamed response (see the module doc). Fields a kind does not set are zero or empty.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq, Default)]
pub struct ProfileEvent {
    /// What happened.
    pub kind: EventKind,
    /// The name of the model serving the request.
    pub model: RString,
    /// [`crate::ParsedRequest::state`], unchanged.
    pub state: RVec<u8>,
    /// RESULT, ERROR: the record's index in [`crate::ParsedRequest::records`].
    pub index: u64,
    /// RESULT: the record's result rows (as [`crate::EncodeRequest::results`] would hold them).
    pub result: RecordResult,
    /// RESULT, ERROR, END: how many records have finished, this one included.
    pub done: u64,
    /// How many records the request has.
    pub total: u64,
    /// END: the usage units of the whole request.
    pub units: i64,
    /// ERROR: the HTTP status the failure has on the non-streamed routes (429, 500, ...).
    pub error_status: u16,
    /// ERROR: the OpenAI-shaped error code (`overloaded`, `model_trap`, ...).
    pub error_code: RString,
    /// ERROR: the message.
    pub error_message: RString,
}

/// Streamed responses of a profile (see the module doc).
#[sabi_trait]
pub trait ProfileEvents: Send + Sync {
    /// The routes answered with a stream, asked once when the server mounts the profile.
    fn streams(&self) -> RVec<StreamRoute>;

    /// The bytes of one event of a request to stream route `route`, written to the response as they are.
    #[sabi(last_prefix_field)]
    fn encode_event(&self, route: u32, event: &ProfileEvent) -> RResult<RVec<u8>, ProfileError>;
}
