//! `serve-runtime`: everything between HTTP and the devices. Model packages ([`package`]), checkpoint
//! indexing ([`checkpoint`]), devices through the HAL plugins with per-model memory budgets ([`device`]), the
//! native modules packages import ([`natives`]), model preparation ([`model`]) and its progress ([`progress`]), the finite contract and its
//! cohort scheduler ([`finite`]), and the model registry ([`registry`]).
//!
//! Nothing here knows HTTP; nothing here knows a model by name.

pub mod checkpoint;
pub mod device;
pub mod error;
pub mod finite;
pub mod gather;
pub mod model;
pub mod natives;
pub mod package;
pub mod progress;
pub mod registry;
pub mod tokenizer;

pub use error::{Error, Result};

pub use loom_plugins::{LoadedPlugin as PluginHandle, load_all as load_plugins};
/// Re-exported so the binary parses `model.json` names without its own JSON dependency.
pub use serde_json as json;
