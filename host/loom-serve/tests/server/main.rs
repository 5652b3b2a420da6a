//! End-to-end tests of the real `loom-serve` binary over HTTP, with packages copied to a temporary directory.
//! Numerical results are checked against independent arithmetic oracles written here from the packages'
//! documented formulas (not from their code).

mod support;

mod http_bounds;
mod http_chat;
mod http_deploy;
mod http_embed;
mod http_hardening;
mod http_lifecycle;
mod http_minilm;
mod http_nanoguard;
mod http_packages;
mod http_robustness;
mod http_scaleout;
mod http_sequence;
mod http_sessions;
mod http_smollm2;
mod http_specialize;
mod plugins;
mod profiles;
