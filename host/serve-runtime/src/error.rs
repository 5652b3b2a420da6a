//! The runtime's error type. Each variant says whose fault it is, which is what the HTTP layer maps to a status
//! code (in one place, `serve-http`).

use std::fmt;

/// Everything the runtime can fail with.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// A package file is invalid (the package author's fault): `file`, the JSON `field` (may be empty), why.
    #[error("{}", package_text(.file, .field, .message))]
    Package {
        file: String,
        field: String,
        message: String,
    },
    /// Loom source or bytecode did not compile or link (the package author's fault).
    #[error("{0}")]
    Program(String),
    /// A VM trap in a source entry, with the entry's name (a request input or a package bug).
    #[error("{entry}: {message}")]
    Trap { entry: String, message: String },
    /// The request itself is invalid (the client's fault).
    #[error("{0}")]
    BadRequest(String),
    /// An input is larger than the model accepts (the client's fault; the message quotes both sizes).
    #[error("{0}")]
    TooLarge(String),
    /// A re-registration would change what an existing model serves (its contract or role) and the request did
    /// not say to replace it.
    #[error("{0}")]
    RoleChanged(String),
    /// None of the devices a registration chose is present (the message names the chosen and the present
    /// ones).
    #[error("{0}")]
    DeviceAbsent(String),
    /// A checkpoint is missing or invalid.
    #[error("{0}")]
    Checkpoint(String),
    /// No model of that name.
    #[error("model `{0}` is not registered")]
    UnknownModel(String),
    /// The model exists but is not ready (preparing, failed, deactivated, draining).
    #[error("model `{name}` is {status}")]
    NotReady { name: String, status: String },
    /// Too much queued work or memory: try again later.
    #[error("{0}")]
    Overloaded(String),
    /// A model's memory budget does not fit the device next to the budgets of the models already placed there.
    #[error("{0}")]
    DeviceFull(String),
    /// The model's contract does not serve this route.
    #[error("{0}")]
    Unsupported(String),
    /// A device or plugin failed.
    #[error("device: {0}")]
    Device(String),
    /// The request was cancelled.
    #[error("cancelled")]
    Cancelled,
    /// A bug in the server.
    #[error("internal error: {0}")]
    Internal(String),
}

fn package_text(file: &str, field: &str, message: &str) -> String {
    if field.is_empty() {
        format!("{file}: {message}")
    } else {
        format!("{file}: field `{field}`: {message}")
    }
}

impl Error {
    pub fn package(file: &str, field: &str, message: impl fmt::Display) -> Error {
        Error::Package {
            file: file.to_string(),
            field: field.to_string(),
            message: message.to_string(),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
