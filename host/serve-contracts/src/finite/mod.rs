//! The finite contract: one request in, a bounded result out (embeddings, decisions). The package's control
//! program exports `prepare_request`, `prepare_batch` and `run`; the server forms cohorts of compatible
//! requests and runs each through them.
//!
//! # Protocol
//!
//! * **Admission.** [`FiniteService::submit`] runs `prepare_request(state, input)` on the caller's thread, so a
//!   bad input fails fast with the trap's message and never reaches the queue. A request whose units exceed the
//!   cold batch-unit limit is refused there too. A full queue refuses with `Error::Overloaded`. The caller is
//!   an HTTP blocking worker, or the async worker itself while [`FiniteService::admits_inline`] holds (a small
//!   fuel budget and quick recent admissions: the hand-off costs a thread wake-up).
//! * **In place.** A request that arrives alone, when nothing is waiting, nothing of the model is on the device
//!   or being specialized, and the model's cohorts are quick, runs its cohort of one on the submitting thread
//!   ([`FiniteService::submit_one`]) when its stages are compiled. This is the scheduler's own rule (the oldest
//!   request, filled with the compatible waiting ones: none) without the two wake-ups of a round trip through
//!   the scheduler thread, which cost more than such a cohort runs for.
//! * **Scheduling.** One scheduler thread per model owns the waiting queue (nobody else touches it; callers
//!   send it commands over a channel, [`scheduler`]). It takes the *oldest* waiting request, then fills the
//!   cohort with waiting requests of the same compatibility tag, oldest first, while the units fit the
//!   batch-unit limit ([`scheduler::form_cohort`], a pure function). It never waits for requests that have not
//!   arrived.
//! * **Execution** ([`cohort`]), pipelined. `prepare_batch(state, stage_tags, ranges, prepared)` runs in the
//!   `prepare_batch` phase, which grants invocation-scoped declarations. Declarations found in the model's
//!   specialization cache (the exact declaration set) resolve at once; a miss parks the cohort and compiles on
//!   the shared specialization workers while the scheduler goes on with other cohorts. The upload payload goes
//!   into a fresh device input buffer and `run(stage, input, output)` enqueues the stage; up to
//!   [`scheduler::PIPELINE_DEPTH`] cohorts are on the device at once, so the next cohort's preparation and
//!   upload overlap the running one. A collector thread waits for each cohort's last work point and downloads
//!   only the live prefix of its output (a compact snapshot); the result plan ([`plan`]) maps physical rows to
//!   requests.
//! * **Cancellation.** A cancelled request that is still waiting is dropped from the queue. One that was
//!   accepted into a cohort stays a member and only its reply is discarded, until every member's client is
//!   gone: then the cohort's device work is cancelled (its kernels stop at their next loop iteration or program
//!   instance), and a parked cohort is not submitted at all.
//! * **Failure.** When a cohort of several requests fails, each member is retried alone, so one bad request
//!   (say, a token id outside the vocabulary) fails only itself.
//!
//! Record layouts are in `docs/serving/finite.md`; the protocol records the HTTP routes and profile plugins
//! build are `loom_plugin_api::records`.

mod cohort;
mod metrics;
pub mod plan;
pub mod scheduler;
mod service;

pub use metrics::Metrics;
pub use plan::ResultPlan;
pub use service::{
    DeviceRows, FiniteService, IN_PLACE_COHORT_NS, INLINE_ADMISSION_FUEL, INLINE_ADMISSION_NS,
    Prepared, Reply, Rows, Ticket,
};

use crate::{hal_buffer_type as hal_buffer, opaque_type as opaque};
use loom_ir::{Signature, Type};
use loom_vm::Value;
use serve_runtime::Result;
use serve_runtime::contract::{
    COLD, ColdInterface, Contract, ContractInterface, Grants, Phase, Service,
};
use serve_runtime::model::Model;
use std::sync::Arc;

/// The roles a finite package can serve over HTTP.
pub const ROLES: &[&str] = &["embeddings", "decisions"];

/// `prepare_request(state, record)`: no capabilities beyond `options` and `input`.
pub static REQUEST: Phase = Phase {
    name: "prepare_request",
    grants: Grants::NONE,
};

/// `prepare_batch(state, stage_tags, ranges, prepared)`: invocation-scoped declarations.
pub static BATCH: Phase = Phase {
    name: "prepare_batch",
    grants: Grants::DECLARE,
};

/// `run(stage, input, output)`: device work.
pub static RUN: Phase = Phase {
    name: "run",
    grants: Grants::RUN,
};

/// The finite contract's phases.
pub static PHASES: [&Phase; 4] = [&COLD, &REQUEST, &BATCH, &RUN];

/// What cold `prepare` returns for a finite package:
/// `(batch_units, upload_capacity, output_capacity, result_capacity, tokenizer, source_name, state)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The most units one cohort may hold.
    pub batch_units: i64,
    /// The largest upload `prepare_batch` may return.
    pub upload_capacity: i64,
    /// The largest output buffer a result plan may ask for.
    pub output_capacity: i64,
    /// The most result bytes one request may get.
    pub result_capacity: i64,
}

impl Limits {
    const NAMES: [&'static str; 4] = [
        "batch-unit limit",
        "upload capacity",
        "output capacity",
        "result capacity",
    ];

    /// Reads (and checks) the first four cold results.
    pub fn from_cold(values: &[Value]) -> std::result::Result<Limits, String> {
        let mut v = [0i64; 4];
        for (i, what) in Self::NAMES.iter().enumerate() {
            v[i] = values.get(i).and_then(Value::as_i64).unwrap_or(0);
            if v[i] <= 0 {
                return Err(format!(
                    "prepare returned a {what} of {}; it must be positive",
                    v[i]
                ));
            }
        }
        Ok(Limits {
            batch_units: v[0],
            upload_capacity: v[1],
            output_capacity: v[2],
            result_capacity: v[3],
        })
    }
}

/// The finite contract.
#[derive(Debug)]
pub struct Finite {
    interface: ContractInterface,
}

impl Default for Finite {
    fn default() -> Self {
        Finite::new()
    }
}

impl Finite {
    pub fn new() -> Finite {
        use Type::*;
        Finite {
            interface: ContractInterface {
                name: "finite",
                roles: ROLES,
                cold: ColdInterface {
                    results: vec![I64, I64, I64, I64, Str, Str, opaque()],
                    tokenizer: Some(4),
                    state: 6,
                    check: |values| Limits::from_cold(values).map(|_| ()),
                },
                entries: vec![
                    (
                        "prepare_request",
                        Signature {
                            params: vec![opaque(), Buffer],
                            results: vec![Buffer, I64, I64],
                        },
                    ),
                    (
                        "prepare_batch",
                        Signature {
                            params: vec![opaque(), Buffer, Buffer, Buffer],
                            results: vec![I64, Buffer, Buffer],
                        },
                    ),
                    (
                        "run",
                        Signature {
                            params: vec![I64, hal_buffer(), hal_buffer()],
                            results: vec![],
                        },
                    ),
                ],
                phases: &PHASES,
            },
        }
    }
}

impl Contract for Finite {
    fn interface(&self) -> &ContractInterface {
        &self.interface
    }

    /// A consumer (`model.json` names an `upstream` model) gets the upstream's result buffer as `run`'s
    /// fourth argument: `run(stage, input, output, upstream)`.
    fn interface_for(
        &self,
        doc: &serve_runtime::package::ModelDoc,
    ) -> std::result::Result<ContractInterface, String> {
        let mut i = self.interface.clone();
        if doc.upstream.is_some() {
            for (name, sig) in &mut i.entries {
                if *name == "run" {
                    sig.params.push(hal_buffer());
                }
            }
        }
        Ok(i)
    }

    fn start(&self, model: Arc<Model>) -> Result<Arc<dyn Service>> {
        let limits = Limits::from_cold(model.cold_results())
            .map_err(|m| serve_runtime::Error::Program(format!("model `{}`: {m}", model.name)))?;
        let in_place = service::in_place_threshold_ns(model.options())?;
        Ok(FiniteService::start(model, limits, in_place))
    }
}
