//! `serve-runtime`: the contract-agnostic runtime between HTTP and the devices. Model packages ([`package`]),
//! checkpoint indexing ([`checkpoint`]), devices through the HAL plugins with per-model memory budgets and
//! queued checkpoint reads ([`device`], the only module that speaks the plugin ABI), the host vocabulary
//! programs compile against ([`abi`]), the native modules packages import ([`natives`]), what a contract
//! tells the runtime and what a service is ([`contract`]), model preparation and invocation ([`model`]) and
//! its progress ([`progress`]), and the model registry ([`registry`]).
//!
//! Nothing here knows HTTP, a model by name, or a contract by name: contracts (`serve-contracts`) supply
//! their interface as data and start their own services.

pub mod abi;
pub mod checkpoint;
pub mod contract;
pub mod device;
pub mod error;
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
