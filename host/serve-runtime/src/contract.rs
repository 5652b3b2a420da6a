//! What a contract tells the runtime, and what the runtime asks of a contract's service.
//!
//! The runtime prepares every model the same way; a *contract* (the `serve-contracts` crate: `finite`, ...)
//! supplies what differs, as data: its [`ContractInterface`] (the HTTP roles its packages may serve, the cold
//! `prepare` results and how to read them, the control program's entries and their signatures, and the
//! phase table: which capabilities each phase's invocations get), and a `start` that turns a prepared
//! [`Model`] into a running [`Service`] (its scheduler, queue and metrics). The registry holds one service
//! per model, of whichever contract it is, and knows none of them by name.

use crate::model::Model;
use crate::package::ModelDoc;
use crate::{Error, Result};
use loom_ir::{Signature, Type};
use loom_vm::Value;
use std::any::Any;
use std::fmt;
use std::sync::Arc;

/// One capability a phase may grant (see `natives` for the calls each covers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grant {
    /// Stage, source and parameter declarations (`prepare.*`).
    Declare,
    /// `prepare.memory_forecast` (a cold declaration).
    Forecast,
    /// Device work: `runner.*`, `parameters.gather`.
    Run,
}

/// The capabilities of a phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grants {
    pub declare: bool,
    pub forecast: bool,
    pub run: bool,
}

impl Grants {
    /// Nothing beyond `options` and `input`.
    pub const NONE: Grants = Grants {
        declare: false,
        forecast: false,
        run: false,
    };
    /// Invocation-scoped declarations.
    pub const DECLARE: Grants = Grants {
        declare: true,
        ..Grants::NONE
    };
    /// Device work.
    pub const RUN: Grants = Grants {
        run: true,
        ..Grants::NONE
    };

    pub fn has(self, g: Grant) -> bool {
        match g {
            Grant::Declare => self.declare,
            Grant::Forecast => self.forecast,
            Grant::Run => self.run,
        }
    }
}

/// A phase: the kind of invocation an entry runs as, with what it may do.
#[derive(Debug, PartialEq, Eq)]
pub struct Phase {
    /// How messages name it (`prepare_batch`, `run`, ...).
    pub name: &'static str,
    pub grants: Grants,
}

/// A memory forecast: the entry cold preparation selected with `prepare.memory_forecast`, run on the host over
/// one complete request's input descriptors (no grants).
pub static FORECAST: Phase = Phase {
    name: "memory forecast",
    grants: Grants::NONE,
};

/// Cold preparation (`prepare`), the same in every contract: declarations and the memory forecast.
pub static COLD: Phase = Phase {
    name: "cold preparation",
    grants: Grants {
        declare: true,
        forecast: true,
        run: false,
    },
};

/// What cold `prepare(asset_root: str, options: str)` returns in a contract, and how to read it.
#[derive(Debug, Clone)]
pub struct ColdInterface {
    pub results: Vec<Type>,
    /// The result naming the tokenizer asset (an empty string: none).
    pub tokenizer: Option<usize>,
    /// The result holding the model's retained state, passed to the warm entries.
    pub state: usize,
    /// Checks the results (e.g. capacities must be positive); the message is prefixed with the program's file.
    pub check: fn(&[Value]) -> std::result::Result<(), String>,
}

/// Everything the runtime needs to know of a contract to prepare and invoke its packages.
#[derive(Debug, Clone)]
pub struct ContractInterface {
    /// The `contract` value of `model.json`.
    pub name: &'static str,
    /// The `role` values a package of this contract may declare (the HTTP roles that serve it).
    pub roles: &'static [&'static str],
    pub cold: ColdInterface,
    /// The control program's entries: linked as roots and checked for exactly these signatures.
    pub entries: Vec<(&'static str, Signature)>,
    /// Every phase of the contract, [`COLD`] first.
    pub phases: &'static [&'static Phase],
}

impl ContractInterface {
    /// The cold `prepare` signature.
    pub fn cold_signature(&self) -> Signature {
        Signature {
            params: vec![Type::Str, Type::Str],
            results: self.cold.results.clone(),
        }
    }
}

/// Finds another registered model's running service by name (a consumer's upstream); the registry gives
/// each model one ([`crate::model::Model::peer`]).
pub type Peers = Arc<dyn Fn(&str) -> Result<Arc<dyn Service>> + Send + Sync>;

/// One Prometheus sample a service exports, labelled with its model by the exporter.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: &'static str,
    pub help: &'static str,
    /// `counter`, `gauge` or `histogram`.
    pub kind: &'static str,
    /// The sample (a histogram's: its count).
    pub value: f64,
    /// A histogram's buckets, sum and count (`kind` is then `histogram`).
    pub histogram: Option<HistogramSnapshot>,
}

impl Series {
    /// A counter or gauge.
    pub fn sample(
        name: &'static str,
        help: &'static str,
        kind: &'static str,
        value: f64,
    ) -> Series {
        Series {
            name,
            help,
            kind,
            value,
            histogram: None,
        }
    }
}

/// Bucket bounds (seconds) for latencies from a millisecond to a minute.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// A Prometheus histogram of durations, recorded lock-free.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Per bucket (not cumulative), then the `+Inf` bucket.
    counts: Vec<std::sync::atomic::AtomicU64>,
    sum_ns: std::sync::atomic::AtomicU64,
}

/// What a [`Histogram`] holds at one moment: cumulative counts per upper bound (the last is `+Inf`), the sum
/// (seconds) and the count.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSnapshot {
    pub buckets: Vec<(f64, u64)>,
    pub sum: f64,
    pub count: u64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: (0..=bounds.len())
                .map(|_| std::sync::atomic::AtomicU64::new(0))
                .collect(),
            sum_ns: std::sync::atomic::AtomicU64::new(0),
        }
    }

    pub fn observe(&self, d: std::time::Duration) {
        use std::sync::atomic::Ordering;
        let secs = d.as_secs_f64();
        let i = self
            .bounds
            .iter()
            .position(|&b| secs <= b)
            .unwrap_or(self.bounds.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ns
            .fetch_add(d.as_nanos().min(u64::MAX as u128) as u64, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> HistogramSnapshot {
        use std::sync::atomic::Ordering;
        let mut acc = 0;
        let mut buckets = Vec::with_capacity(self.counts.len());
        for (i, c) in self.counts.iter().enumerate() {
            acc += c.load(Ordering::Relaxed);
            buckets.push((self.bounds.get(i).copied().unwrap_or(f64::INFINITY), acc));
        }
        HistogramSnapshot {
            buckets,
            sum: self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9,
            count: acc,
        }
    }

    /// The histogram as a series named `name`.
    pub fn series(&self, name: &'static str, help: &'static str) -> Series {
        let h = self.snapshot();
        Series {
            name,
            help,
            kind: "histogram",
            value: h.count as f64,
            histogram: Some(h),
        }
    }
}

/// A model being served under its contract: a running scheduler over a prepared [`Model`].
pub trait Service: Send + Sync + fmt::Debug + 'static {
    fn model(&self) -> &Arc<Model>;
    /// Stops accepting work, finishes everything accepted, stops the scheduler. Idempotent.
    fn drain(&self);
    /// The service's own metrics (the registry's exporter adds the model's generic ones).
    fn series(&self) -> Vec<Series>;
    /// For the routes of the contract, which downcast to the service type they serve.
    fn as_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync>;
    /// After [`drain`](Self::drain) for a deactivation: the state the spec says deactivation keeps (retained
    /// sessions), handed to [`Contract::resume`] when the model is activated again. `None`: nothing to keep.
    fn kept_state(&self) -> Option<KeptState> {
        None
    }
}

/// What a drained service keeps across deactivation ([`Service::kept_state`]), opaque to the registry.
pub type KeptState = Box<dyn Any + Send>;

/// A contract: its interface, and how a prepared model starts serving under it.
pub trait Contract: Send + Sync + fmt::Debug + 'static {
    fn interface(&self) -> &ContractInterface;

    /// The interface a package with `doc` is prepared against: [`Contract::interface`], unless the contract
    /// shapes its entries by the manifest (a finite consumer's `run` takes its upstream buffer). A manifest
    /// the contract cannot serve is refused with the reason (the caller names the field): by default, one
    /// that names an `upstream` model.
    fn interface_for(&self, doc: &ModelDoc) -> std::result::Result<ContractInterface, String> {
        if doc.upstream.is_some() {
            return Err(format!(
                "a {} package cannot consume another model's results (only finite packages name an upstream)",
                self.interface().name
            ));
        }
        Ok(self.interface().clone())
    }
    /// Starts serving `model` (prepared with this contract's interface).
    fn start(&self, model: Arc<Model>) -> Result<Arc<dyn Service>>;
    /// Starts serving `model` again after a deactivation, with what the previous service kept
    /// ([`Service::kept_state`]). By default the kept state is dropped and the model starts afresh.
    fn resume(&self, model: Arc<Model>, kept: KeptState) -> Result<Arc<dyn Service>> {
        drop(kept);
        self.start(model)
    }
}

/// The contracts this server serves.
#[derive(Debug, Clone, Default)]
pub struct Contracts {
    list: Vec<Arc<dyn Contract>>,
}

impl Contracts {
    /// `list` in order; each contract's phase table must start with [`COLD`], and names must be distinct.
    pub fn new(list: Vec<Arc<dyn Contract>>) -> Contracts {
        for (i, c) in list.iter().enumerate() {
            let ci = c.interface();
            assert!(
                ci.phases.first().is_some_and(|p| std::ptr::eq(*p, &COLD)),
                "contract `{}`: the phase table starts with contract::COLD; this is a bug",
                ci.name
            );
            assert!(
                list[..i].iter().all(|o| o.interface().name != ci.name),
                "contract `{}` is given twice; this is a bug",
                ci.name
            );
        }
        Contracts { list }
    }

    /// The names, in order.
    pub fn names(&self) -> Vec<&'static str> {
        self.list.iter().map(|c| c.interface().name).collect()
    }

    /// The contract `doc` declares, with its role and its fuel budgets' entries checked. Errors name `file`
    /// and the field.
    pub fn for_doc(&self, file: &str, doc: &ModelDoc) -> Result<&Arc<dyn Contract>> {
        let Some(c) = self
            .list
            .iter()
            .find(|c| c.interface().name == doc.contract)
        else {
            return Err(Error::package(
                file,
                "contract",
                format!(
                    "expected one of {:?} (the contracts this server serves), found {:?}",
                    self.names(),
                    doc.contract
                ),
            ));
        };
        let ci = c.interface();
        if !ci.roles.contains(&doc.role.as_str()) {
            return Err(Error::package(
                file,
                "role",
                format!(
                    "a {} package's role is one of {:?}, found {:?}",
                    ci.name, ci.roles, doc.role
                ),
            ));
        }
        for entry in doc.fuel.0.keys() {
            if entry != "prepare" && !ci.entries.iter().any(|(n, _)| n == entry) {
                let names: Vec<&str> = ci.entries.iter().map(|(n, _)| *n).collect();
                return Err(Error::package(
                    file,
                    &format!("fuel.{entry}"),
                    format!(
                        "not an entry of a {} package (fuel is given per entry: prepare, {})",
                        ci.name,
                        names.join(", ")
                    ),
                ));
            }
        }
        Ok(c)
    }
}
