//! Load errors and traps.

use loom_ir::{Loc, Signature, Type};
use std::fmt;

/// Formats a signature as `(i64, buffer) -> (i32)`.
pub(crate) fn sig_text(sig: &Signature) -> String {
    let join = |ts: &[Type]| {
        ts.iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!("({}) -> ({})", join(&sig.params), join(&sig.results))
}

/// Why a program could not be loaded. Every variant names the source location of the offending item.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LoadError {
    /// The program imports a native module that the role it runs as was not granted.
    #[error(
        "{file}:{}:{}: `{symbol}` imports native module `{module}`, which is not granted to this role \
         (granted: {}); grant `{module}` to the role in the model package or remove the import",
        loc.line, loc.col, granted_list(granted)
    )]
    NotGranted {
        module: String,
        symbol: String,
        granted: Vec<String>,
        loc: Loc,
        file: String,
    },
    /// The host registered no native module of that name.
    #[error("{file}:{}:{}: `{symbol}` imports native module `{module}`, which this host does not provide", loc.line, loc.col)]
    UnknownModule {
        module: String,
        symbol: String,
        loc: Loc,
        file: String,
    },
    /// The native module has no function of that name.
    #[error("{file}:{}:{}: native module `{module}` has no function `{func}` (imported as `{symbol}`)", loc.line, loc.col)]
    UnknownFunction {
        module: String,
        func: String,
        symbol: String,
        loc: Loc,
        file: String,
    },
    /// The import's symbol does not start with its module (`input.encode` must be imported from `input`).
    #[error("{file}:{}:{}: import `{symbol}` must be named `{module}.<function>`", loc.line, loc.col)]
    BadImportSymbol {
        module: String,
        symbol: String,
        loc: Loc,
        file: String,
    },
    /// The program declares a different signature than the native function has.
    #[error(
        "{file}:{}:{}: import `{symbol}` is declared as {} but the native function has signature {}",
        loc.line, loc.col, sig_text(declared), sig_text(native)
    )]
    SignatureMismatch {
        symbol: String,
        declared: Box<Signature>,
        native: Box<Signature>,
        loc: Loc,
        file: String,
    },
    /// A load-time limit (registers per frame, code size) was exceeded.
    #[error("{file}:{}:{}: in @{func}: {message}", loc.line, loc.col)]
    Limit {
        func: String,
        message: String,
        loc: Loc,
        file: String,
    },
    /// The program is inconsistent (it should have been rejected by the verifier).
    #[error("{file}:{}:{}: in @{func}: invalid program: {message}", loc.line, loc.col)]
    Invalid {
        func: String,
        message: String,
        loc: Loc,
        file: String,
    },
}

fn granted_list(g: &[String]) -> String {
    if g.is_empty() {
        "none".to_string()
    } else {
        g.join(", ")
    }
}

/// The class of a trap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TrapKind {
    /// The invocation's fuel budget is spent.
    OutOfFuel,
    /// An allocation would exceed the invocation's memory cap (checked before allocating).
    OutOfMemory,
    /// A call would exceed the call-depth limit.
    CallDepth,
    /// Checked integer arithmetic overflowed (`add`, `neg`, `div MIN, -1`, ...).
    IntegerOverflow,
    /// Integer division or remainder by zero.
    DivisionByZero,
    /// A buffer, string or list access outside its bounds, or a negative length.
    OutOfBounds,
    /// `str.from_buffer` on bytes that are not UTF-8.
    InvalidUtf8,
    /// `conv.*` of a value that does not fit, or `str.parse_i64` of bad text.
    BadConversion,
    /// `ref.unwrap` of null.
    NullReference,
    /// `opaque.get` of an element of another type, or a native returning values of the wrong type.
    TypeMismatch,
    /// `assert` / `trap` in the program: the message is the program's.
    SourceError,
    /// A native function failed.
    Native,
    /// The host's arguments do not match the entry's signature, or the entry does not exist.
    BadArguments,
    /// `for` with a step that is not positive.
    BadStep,
    /// A returned value nests deeper than the VM converts.
    TooDeep,
    /// The returned values retain more bytes ([`crate::Value::retained_bytes`]) than
    /// [`crate::InvokeLimits::retained_bytes`] allows.
    RetainedTooLarge,
    /// A VM invariant failed (a bug, or an unverified program): reported, never a panic.
    Internal,
}

/// A structured runtime error: which function, which bytecode pc, which source location.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{file}:{}:{}: in @{func} (pc {pc}): {message}", loc.line, loc.col)]
pub struct Trap {
    pub kind: TrapKind,
    /// The qualified name of the function that trapped (the entry's, for argument errors).
    pub func: String,
    /// Index of the trapping bytecode instruction in that function.
    pub pc: u32,
    pub loc: Loc,
    /// Source file of the function.
    pub file: String,
    pub message: String,
}

/// The error a native function returns.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NativeError {
    /// The native accounted an allocation above the invocation's memory cap.
    #[error("out of memory: {0}")]
    OutOfMemory(String),
    /// The native charged more fuel than was left.
    #[error("out of fuel")]
    OutOfFuel,
    /// Any other failure, reported with its message.
    #[error("{0}")]
    Failed(String),
}

impl NativeError {
    pub fn failed(msg: impl fmt::Display) -> Self {
        NativeError::Failed(msg.to_string())
    }
}
