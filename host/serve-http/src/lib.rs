//! `serve-http`: the HTTP face of loom-serve (axum). OpenAI-shaped embeddings, typed decisions, model
//! lifecycle routes, `/health`, Prometheus `/metrics`; errors in the OpenAI shape with honest status codes,
//! mapped from [`serve_runtime::Error`] in one place ([`ApiError::from`]).
//!
//! This is the only crate that knows HTTP and JSON request shapes (besides profile plugins). Request inputs
//! become the contracts' *protocol records* here (`loom_plugin_api::records`, `docs/serving/finite.md`);
//! packages never see JSON. One file per route family (`lifecycle`, `embeddings`, `decisions`, `profiles`);
//! what handlers share (settings, the model lookup with its role check, submission) is `state`.
//! HTTP profiles from plugins (`loom_plugin_api::Profile`) add routes of other dialects: [`Profiles::mount`]
//! checks their routes, [`AppState::with_profiles`] + [`router`] mount them (see `profiles.rs`).

mod decisions;
mod embeddings;
mod error;
mod lifecycle;
mod metrics;
mod profiles;
mod router;
mod state;

pub use error::ApiError;
pub use profiles::{ProfilePlugin, Profiles, RejectedProfile};
pub use router::router;
pub use state::{AppState, Config};

/// Serves `app` on `listener` until SIGINT or SIGTERM; then stops accepting and lets in-flight requests
/// finish (the caller drains the models afterwards).
pub async fn serve(listener: tokio::net::TcpListener, app: axum::Router) -> std::io::Result<()> {
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown_signal())
        .await
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            log::warn!("cannot listen for SIGTERM: {e}");
            let _ = ctrl_c.await;
            return;
        }
    };
    tokio::select! {
        _ = ctrl_c => {}
        _ = term.recv() => {}
    }
    log::info!("shutdown signal received");
}
