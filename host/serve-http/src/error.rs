//! Errors in the OpenAI shape: `{"error": {"message", "type", "code"}}`, with the status code decided here
//! and nowhere else.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serve_runtime::Error;

/// An HTTP error response.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            code: "invalid_request",
            message: message.into(),
        }
    }
    /// The same error with its message prefixed by `what` (`input 3: ...`).
    pub fn within(mut self, what: &str) -> ApiError {
        self.message = format!("{what}: {}", self.message);
        self
    }
    pub fn new(
        status: StatusCode,
        kind: &'static str,
        code: &'static str,
        m: impl Into<String>,
    ) -> ApiError {
        ApiError {
            status,
            kind,
            code,
            message: m.into(),
        }
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> ApiError {
        use StatusCode as S;
        let (status, kind, code) = match &e {
            Error::Package { .. } => (S::BAD_REQUEST, "invalid_request_error", "invalid_package"),
            Error::Program(_) => (S::BAD_REQUEST, "invalid_request_error", "invalid_program"),
            Error::Checkpoint(_) => (
                S::BAD_REQUEST,
                "invalid_request_error",
                "invalid_checkpoint",
            ),
            Error::Trap { .. } => (
                S::UNPROCESSABLE_ENTITY,
                "invalid_request_error",
                "program_trap",
            ),
            Error::BadRequest(_) => (S::BAD_REQUEST, "invalid_request_error", "invalid_request"),
            Error::TooLarge(_) => (
                S::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                "input_too_large",
            ),
            Error::RoleChanged(_) => (S::CONFLICT, "invalid_request_error", "role_changed"),
            Error::DeviceAbsent(_) => (
                S::UNPROCESSABLE_ENTITY,
                "invalid_request_error",
                "device_not_present",
            ),
            Error::UnknownModel(_) => (S::NOT_FOUND, "invalid_request_error", "model_not_found"),
            Error::NotReady { .. } => (S::SERVICE_UNAVAILABLE, "server_error", "model_not_ready"),
            Error::Overloaded(_) => (S::TOO_MANY_REQUESTS, "server_error", "overloaded"),
            Error::DeviceFull(_) => (
                S::INSUFFICIENT_STORAGE,
                "server_error",
                "insufficient_device_memory",
            ),
            Error::Unsupported(_) => (S::NOT_IMPLEMENTED, "invalid_request_error", "unsupported"),
            Error::Device(_) => (S::INTERNAL_SERVER_ERROR, "server_error", "device_error"),
            Error::Cancelled => (S::SERVICE_UNAVAILABLE, "server_error", "cancelled"),
            Error::Internal(_) => (S::INTERNAL_SERVER_ERROR, "server_error", "internal_error"),
        };
        ApiError {
            status,
            kind,
            code,
            message: e.to_string(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({
            "error": { "message": self.message, "type": self.kind, "code": self.code }
        });
        let mut r = (self.status, axum::Json(body)).into_response();
        if matches!(
            self.status,
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
        ) {
            // Full queues and pools drain in seconds; a model still preparing may take longer, but a
            // client retrying every second costs nothing.
            r.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static("1"),
            );
        }
        r
    }
}
