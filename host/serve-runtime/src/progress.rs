//! Preparation progress: what a model's preparation has done so far, for the log and the HTTP event stream.
//!
//! A [`Progress`] is created per preparation (registration or activation) and shared by the preparing thread,
//! which updates it, and by readers ([`Progress::snapshot`]), which poll it and compare
//! [`Snapshot::version`] to see whether anything changed. Stage counts grow when a stage set is declared and as
//! each stage compiles; byte counts grow as each parameter buffer is placed. Request-time stage sets (the
//! specialization cache's misses) keep counting on the same object after the model is ready.

use std::sync::Mutex;

/// Where a preparation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Reading and compiling the package's programs, running `prepare`.
    Programs,
    /// Opening and indexing checkpoint sources.
    Sources,
    /// Compiling stages on the shared compile queue.
    Compiling,
    /// Placing parameters on the device.
    Placing,
    /// Serving.
    Ready,
    /// Preparation failed (`error` says why).
    Failed,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Programs => "programs",
            Phase::Sources => "sources",
            Phase::Compiling => "compiling",
            Phase::Placing => "placing",
            Phase::Ready => "ready",
            Phase::Failed => "failed",
        }
    }

    /// Whether nothing more will happen in this preparation.
    pub fn terminal(self) -> bool {
        matches!(self, Phase::Ready | Phase::Failed)
    }
}

/// One reading of a preparation's progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// Increases on every change.
    pub version: u64,
    pub phase: Phase,
    pub stages_total: u64,
    pub stages_compiled: u64,
    pub bytes_total: u64,
    pub bytes_placed: u64,
    pub error: Option<String>,
}

/// A preparation's progress (see the module doc).
#[derive(Debug)]
pub struct Progress {
    inner: Mutex<Snapshot>,
}

impl Default for Progress {
    fn default() -> Progress {
        Progress::new()
    }
}

impl Progress {
    pub fn new() -> Progress {
        Progress {
            inner: Mutex::new(Snapshot {
                version: 0,
                phase: Phase::Programs,
                stages_total: 0,
                stages_compiled: 0,
                bytes_total: 0,
                bytes_placed: 0,
                error: None,
            }),
        }
    }

    fn update(&self, f: impl FnOnce(&mut Snapshot)) {
        let mut s = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut s);
        s.version += 1;
    }

    pub fn snapshot(&self) -> Snapshot {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn phase(&self, phase: Phase) {
        self.update(|s| s.phase = phase);
    }

    /// `n` more stages to compile (a stage set was declared).
    pub fn stages_declared(&self, n: u64) {
        self.update(|s| s.stages_total += n);
    }

    pub fn stage_compiled(&self) {
        self.update(|s| s.stages_compiled += 1);
    }

    /// `n` more parameter bytes to place.
    pub fn bytes_declared(&self, n: u64) {
        self.update(|s| s.bytes_total += n);
    }

    pub fn bytes_placed(&self, n: u64) {
        self.update(|s| s.bytes_placed += n);
    }

    pub fn failed(&self, error: String) {
        self.update(|s| {
            s.phase = Phase::Failed;
            s.error = Some(error);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_change_bumps_the_version() {
        let p = Progress::new();
        let a = p.snapshot();
        p.stages_declared(3);
        p.stage_compiled();
        p.bytes_declared(100);
        p.bytes_placed(40);
        let b = p.snapshot();
        assert_eq!(b.version, a.version + 4);
        assert_eq!((b.stages_total, b.stages_compiled), (3, 1));
        assert_eq!((b.bytes_total, b.bytes_placed), (100, 40));
        assert!(!b.phase.terminal());
        p.failed("boom".into());
        let c = p.snapshot();
        assert!(c.phase.terminal());
        assert_eq!(c.error.as_deref(), Some("boom"));
    }
}
