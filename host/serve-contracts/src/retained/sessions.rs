//! Sessions: a token list the server keeps between requests, with named checkpoints, forks and rewinds.
//!
//! A session is its tokens and **pins**: one extra pool reference on each full page of its tokens that the prefix
//! cache holds ([`super::prefix`]), so those pages are never evicted while the session lives. Pages are shared by
//! content, so nothing is ever copied: appending to a session runs an ordinary sequence over `session tokens +
//! new tokens`, which finds the session's full pages in the prefix cache and computes only the partial last page
//! and the new tokens; a fork clones the token list and retains the same pins once more; a rewind truncates the
//! token list and releases the pins past its full pages; a checkpoint is a token list and its pins, retained.
//! Every operation runs on the model's engine thread, which owns the pool.

use serve_runtime::Error;

/// What a session operation changes or reads (the engine thread runs it).
#[derive(Debug, Clone)]
pub enum SessionOp {
    /// A new session holding `tokens` (nothing is computed until the first append).
    Create { tokens: Vec<u32> },
    /// The session's state.
    Get,
    /// Every session of the model.
    List,
    /// Adds `tokens` without generating (they are computed by the next append).
    Extend { tokens: Vec<u32> },
    /// Takes (or replaces) checkpoint `name` at the session's current tokens.
    Checkpoint { name: String },
    /// A new session with the tokens of the session, or of its checkpoint.
    Fork { checkpoint: Option<String> },
    /// Back to a checkpoint's tokens.
    RewindCheckpoint { name: String },
    /// Back to the first `tokens` tokens.
    RewindTokens { tokens: u32 },
    /// Releases everything the session holds.
    Delete,
}

/// A session as the HTTP layer shows it.
#[derive(Debug, Clone)]
pub struct SessionInfo {
    pub id: String,
    /// Its token ids (empty in listings).
    pub token_ids: Vec<u32>,
    pub tokens: u32,
    /// Pages pinned by its tokens.
    pub pages: u32,
    /// `(name, tokens, pages)` of each checkpoint, by name.
    pub checkpoints: Vec<(String, u32, u32)>,
    /// An append is running.
    pub busy: bool,
    /// Seconds since it was last used.
    pub idle_seconds: f64,
}

/// Why a session operation was refused.
#[derive(Debug, Clone)]
pub enum SessionError {
    /// No such session, or no such checkpoint (404).
    NotFound(String),
    /// The session is busy with an append (409).
    Conflict(String),
    /// Anything else (the usual mapping: 400, 413, 503...).
    Failed(Error),
}

impl From<Error> for SessionError {
    fn from(e: Error) -> Self {
        SessionError::Failed(e)
    }
}

impl std::fmt::Display for SessionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SessionError::NotFound(m) | SessionError::Conflict(m) => f.write_str(m),
            SessionError::Failed(e) => write!(f, "{e}"),
        }
    }
}
