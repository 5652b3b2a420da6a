//! The scheduler thread a contract's service runs, as the service holds it: the command channel, the join
//! handle, and what the thread hands back when it drains (for a deactivation: [`Service::kept_state`]).
//!
//! [`Service::kept_state`]: serve_runtime::contract::Service::kept_state

use serve_runtime::{Error, Result};
use std::sync::{Mutex, mpsc};
use std::thread::JoinHandle;

/// One model's scheduler thread: it receives commands `C` and, drained, answers with what it keeps `K`.
pub struct EngineThread<C, K> {
    model: String,
    tx: Mutex<Option<mpsc::Sender<C>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    kept: Mutex<Option<K>>,
}

impl<C, K> std::fmt::Debug for EngineThread<C, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineThread")
            .field("model", &self.model)
            .finish_non_exhaustive()
    }
}

impl<C: Send + 'static, K> EngineThread<C, K> {
    /// Starts thread `name` (shown in debuggers: at most 15 bytes are kept) running `run` over the commands of
    /// model `model`.
    pub fn spawn(
        model: &str,
        name: String,
        run: impl FnOnce(mpsc::Receiver<C>) + Send + 'static,
    ) -> Result<EngineThread<C, K>> {
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || run(rx))
            .map_err(|e| Error::Internal(format!("spawning an engine thread: {e}")))?;
        Ok(EngineThread {
            model: model.to_string(),
            tx: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
            kept: Mutex::new(None),
        })
    }

    /// The error of a model that takes no more commands.
    pub fn draining(&self) -> Error {
        Error::NotReady {
            name: self.model.clone(),
            status: "draining".into(),
        }
    }

    /// Sends `cmd` (a draining model: [`draining`](Self::draining)).
    pub fn send(&self, cmd: C) -> Result<()> {
        let sent = self
            .tx
            .lock()
            .ok()
            .and_then(|g| g.as_ref().map(|tx| tx.send(cmd).is_ok()));
        if sent == Some(true) {
            Ok(())
        } else {
            Err(self.draining())
        }
    }

    /// Sends the command `make` builds around a reply channel and waits for the reply (blocking).
    pub fn ask<R>(&self, make: impl FnOnce(mpsc::Sender<R>) -> C) -> Result<R> {
        let (reply, rx) = mpsc::channel();
        self.send(make(reply))?;
        rx.recv().map_err(|_| self.draining())
    }

    /// Stops taking commands, sends the drain command `make` builds (the thread finishes its accepted work and
    /// answers with what it keeps), keeps that, and joins the thread. Idempotent.
    pub fn drain(&self, make: impl FnOnce(mpsc::Sender<K>) -> C) {
        let tx = self.tx.lock().ok().and_then(|mut g| g.take());
        if let Some(tx) = tx {
            let (done_tx, done_rx) = mpsc::channel();
            if tx.send(make(done_tx)).is_ok() {
                if let Ok(k) = done_rx.recv() {
                    if let Ok(mut g) = self.kept.lock() {
                        *g = Some(k);
                    }
                }
            }
        }
        if let Some(t) = self.thread.lock().ok().and_then(|mut g| g.take()) {
            let _ = t.join();
        }
    }

    /// What the drained thread handed back, once.
    pub fn take_kept(&self) -> Option<K> {
        self.kept.lock().ok()?.take()
    }
}
