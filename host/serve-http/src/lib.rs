//! `serve-http`: the HTTP face of loom-serve (axum). OpenAI-shaped embeddings, typed decisions, vLLM-shaped
//! classification, model lifecycle routes, `/health`, Prometheus `/metrics`; errors in the OpenAI shape with
//! honest status codes, mapped from [`serve_runtime::Error`] in one place ([`ApiError::from`]).
//!
//! This is the only crate that knows HTTP and JSON request shapes (besides profile plugins). Request inputs
//! become the contracts' *protocol records* here (`loom_plugin_api::records`, `docs/serving/finite.md`);
//! packages never see JSON. One file per route family (`lifecycle`, `embeddings`, `decisions`, `classify`,
//! `profiles`); what handlers share (settings, the model lookup with its role check, submission) is `state`.
//! HTTP profiles from plugins (`loom_plugin_api::Profile`) add routes of other dialects: [`Profiles::mount`]
//! checks their routes, [`AppState::with_profiles`] + [`router`] mount them (see `profiles.rs`).

mod chat;
mod classify;
mod decisions;
mod embeddings;
mod error;
mod lifecycle;
mod metrics;
mod profiles;
mod router;
mod score;
mod sessions;
mod state;

pub use error::ApiError;
pub use profiles::{ProfilePlugin, Profiles, RejectedProfile};
pub use router::router;
pub use state::{AppState, Config, DEFAULT_MAX_UPLOAD_BYTES};

/// Serves `app` over HTTP/1.1 on `listener` until SIGINT or SIGTERM, then drains: [`AppState::begin_drain`]
/// (`/health` answers 503, new work is refused with 503 and `Retry-After`), the listener keeps answering
/// until every accepted request is answered in full (streams included), then it stops accepting, closes idle
/// connections and returns (the caller drains the models' queues afterwards and exits).
///
/// `state.config.idle_timeout` bounds how long a connection may take to send a request's headers, counted
/// from when the server starts waiting for them: from the accept, and after each response on a keep-alive
/// connection. A connection over it is closed (a client that sends half a request line and stops holds
/// nothing for long). It does not bound request bodies or responses. `None`: no limit.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    state: std::sync::Arc<AppState>,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(state.config.idle_timeout);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown_signal());
    let mut draining = false;
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: wait instead of spinning.
                    log::warn!("accept: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = &mut shutdown, if !draining => {
                state.begin_drain();
                draining = true;
                log::info!(
                    "draining: /health answers 503, new work is refused; waiting for {} request(s) in flight",
                    state.work_in_flight()
                );
                continue;
            }
            _ = state.work_done(), if draining => break,
        };
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let conn = builder.serve_connection(TokioIo::new(stream), service);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                log::debug!("connection {peer}: {e}");
            }
        });
    }
    log::info!("draining: accepted requests answered; closing the listener");
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

async fn shutdown_signal() {
    shutdown_requested().await;
    log::info!("shutdown signal received");
}

/// Resolves when SIGINT or SIGTERM arrives. Every caller gets every signal: [`serve`] stops accepting on it, the
/// binary starts its drain deadline on it.
pub async fn shutdown_requested() {
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
}
