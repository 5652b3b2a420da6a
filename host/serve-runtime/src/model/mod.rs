//! Preparing and invoking a model, whatever its contract. The result of preparation is a [`Model`]: immutable
//! code and parameters that every request of the model shares, with a narrow API for the contract that serves
//! it: invoke an entry in one of the contract's phases ([`Model::invoke`], [`Model::invoke_run`] then
//! [`Model::settle`]), the stages of a declaration set ([`Model::stages_for`]), its device, its budget, and
//! what cold `prepare` returned ([`Model::cold_results`], [`Model::state`]).
//!
//! Preparation ([`prepare`]) runs in this order, and a failure at any step leaves nothing behind (no device
//! memory, no compiled code kept): read and validate `model.json` and find its contract; compile every program
//! and `definition.sources` file into one catalog (with the server's reference types, [`crate::abi`]); link the
//! `prepare` and `control` programs for their roles (the control program's roots are the contract's entries)
//! and load them in the VM; check the entries' signatures; run cold `prepare` and check its results by the
//! contract's rules; open and index every declared source once (a missing or invalid checkpoint fails here,
//! before placement); specialize and reflect every declared stage, check workspace limits and every parameter
//! binding against the checkpoint index; compile the stages on the shared compile queue; stream parameter
//! payloads into device buffers (shared per parameter domain).

mod prepare;
mod stages;

pub use prepare::{parse_config_text, prepare};

use crate::checkpoint::Source;
use crate::contract::{Contract, Peers, Phase};
use crate::device::gather::GatherQueue;
use crate::device::{
    Budget, CancelFlag, Device, DeviceBuffer, Executable, TimelineId, TimelinePoint,
};
use crate::natives::{Ctx, Decls, RunCtx, StageDecl};
use crate::package::{self, ModelDoc, PackageFiles};
use crate::progress::{Phase as ProgressPhase, Progress};
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};
use loom_compiler::Catalog;
use loom_ir::kernel::Stage;
use loom_kernel::Reflection;
use loom_vm::{HostState, InvokeLimits, Loaded, Value};
use stages::{Binding, SpecCache};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A compiled stage with its bound parameters.
#[derive(Debug)]
pub struct PreparedStage {
    pub decl: StageDecl,
    pub stage: Stage,
    pub reflection: Reflection,
    /// Released when the last holder of the stage (the model, or its specialization cache entry) drops.
    pub exe: Executable,
    /// One per `stage.params`, in order; empty while the model is deactivated.
    pub params: Mutex<Vec<DeviceBuffer>>,
    /// Where each parameter's bytes come from, to stream them again on reactivation.
    pub(crate) bindings: Vec<Binding>,
}

/// What cold `prepare` returned, as the contract's interface describes it.
#[derive(Debug, Clone)]
pub struct ColdResults {
    /// Every result, in order (the contract reads its own: capacities, limits, ...).
    pub values: Vec<Value>,
    /// The retained state passed to the warm entries.
    pub state: Value,
}

/// Progress and timing of one preparation, for logs and the model detail route.
#[derive(Debug, Clone, Default)]
pub struct PrepareReport {
    pub stages: usize,
    pub parameter_bytes: u64,
    pub compile_time: Duration,
    pub total_time: Duration,
}

/// Resident parameter buffers of one domain: (ordered file lists per policy input, policy).
/// A parameter domain's identity: its input sources' files, each with the generation it was indexed at (a
/// rewritten checkpoint is another domain), and its policy.
type DomainKey = (Vec<Vec<(PathBuf, crate::checkpoint::FileGen)>>, String);

/// A prepared model.
#[derive(Debug)]
pub struct Model {
    pub name: String,
    pub doc: ModelDoc,
    /// The contract it is prepared for (it starts the model's service).
    pub contract: Arc<dyn Contract>,
    pub device: Arc<Device>,
    pub budget: Arc<Budget>,
    pub stages: Vec<Arc<PreparedStage>>,
    pub report: PrepareReport,
    /// The contract's phase table (cold preparation first).
    pub(crate) phases: &'static [&'static Phase],
    pub(crate) cold: ColdResults,
    pub(crate) control: Loaded,
    pub(crate) catalog: Catalog,
    /// Where request-declared sources resolve (the package's files and the asset root given to `prepare`).
    pub(crate) files: PackageFiles,
    /// The operator's limits it was prepared under (request-time sources are checked against them too).
    pub(crate) limits: package::OperatorLimits,
    pub(crate) asset_root: String,
    pub(crate) sources: Vec<Arc<Source>>,
    pub(crate) cold_params: Vec<crate::natives::ParamDecl>,
    pub(crate) domains: Mutex<HashMap<(DomainKey, String), DeviceBuffer>>,
    pub(crate) spec_cache: Mutex<SpecCache>,
    pub(crate) options: Arc<serde_json::Map<String, serde_json::Value>>,
    pub(crate) tokenizer: Option<Arc<Tokenizer>>,
    /// The model's work timelines. Each invocation in a running phase takes one for itself
    /// ([`Model::invoke_run`]), and more for chains of independent work; [`Model::settle`] gives them back
    /// when their work succeeded; a failed timeline reports its failure to every later wait, so it is
    /// dropped, and the failure reaches no other invocation (one sharing the timeline would see a
    /// neighbour's error). Invocations are ordered
    /// against each other only by the fences they are given: a device may run two of them side by side (the
    /// CPU device runs each timeline in a lane of its own), so work that another invocation's work must see
    /// is waited for before that invocation is made (the contracts settle it first).
    pub(crate) timelines: Arc<crate::natives::TimelinePool>,
    /// Idle command workspace of the model's dispatches, reused in queue order (at most a quarter of the
    /// budget is kept idle; released at deactivation).
    pub(crate) workspace: Arc<crate::natives::WorkspacePool>,
    pub(crate) gather: Arc<GatherQueue>,
    /// The current preparation's progress (replaced by each activation).
    pub(crate) progress: Mutex<Arc<Progress>>,
    /// The control entry cold preparation selected with `prepare.memory_forecast` (linked and checked).
    pub(crate) forecast: Option<String>,
    /// How it finds other registered models (set by the registry before its service starts).
    pub(crate) peers: PeerSlot,
}

/// A model's [`Peers`] lookup, set once.
#[derive(Default)]
pub(crate) struct PeerSlot(std::sync::OnceLock<Peers>);

impl std::fmt::Debug for PeerSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PeerSlot({})",
            if self.0.get().is_some() {
                "set"
            } else {
                "unset"
            }
        )
    }
}

/// What a memory forecast estimated for one complete request, in device bytes (the spec's three results).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Forecast {
    /// The producer's private peak: activation staging, input and command workspace (parameters excluded:
    /// they are resident already and counted apart).
    pub private_peak: u64,
    /// Every retained output root.
    pub retained: u64,
    /// Gathered output rows (16-byte aligned).
    pub expanded: u64,
}

/// The signature of a memory forecast entry: `(state, ranges, descriptors) -> (private_peak_bytes,
/// retained_bytes, expanded_bytes)`.
pub fn forecast_signature() -> loom_ir::Signature {
    use loom_ir::Type;
    loom_ir::Signature {
        params: vec![
            Type::Ref {
                name: "opaque".into(),
                nullable: false,
            },
            Type::Buffer,
            Type::Buffer,
        ],
        results: vec![Type::I64, Type::I64, Type::I64],
    }
}

/// The specialization cache's counters ([`Model::spec_cache_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpecCacheStats {
    /// Declaration sets found compiled.
    pub hits: u64,
    /// Declaration sets compiled.
    pub misses: u64,
    /// Sets dropped to keep at most `specialization_cache`.
    pub evictions: u64,
    /// Sets dropped because a checkpoint they opened changed on disk (built again from the new file).
    pub stale: u64,
    /// Sets cached now.
    pub entries: usize,
}

/// The stages an invocation may run: the cold ones, then those of its declaration set, with the sources
/// `parameters.gather` may read ([`Model::stages_for`]).
#[derive(Debug, Clone)]
pub struct StageSet {
    pub stages: Vec<Arc<PreparedStage>>,
    pub sources: Vec<Arc<Source>>,
}

/// What an invocation in a running phase did ([`Model::invoke_run`]): its results, and the device work and
/// gathers it submitted, which are collected ([`Model::settle`]) whatever the results.
#[derive(Debug)]
pub struct RunOutcome {
    pub results: Result<Vec<Value>>,
    /// Every point its submissions signal, in order.
    pub signalled: Vec<TimelinePoint>,
    /// The last point of each chain it submitted on (its work is done when these are reached).
    pub tails: Vec<TimelinePoint>,
    /// Every point its gathers signal.
    pub gathers: Vec<TimelinePoint>,
    /// `runner.feedback` slots, in call order: (after this work, buffer, offset, length).
    pub feedback: Vec<(TimelinePoint, DeviceBuffer, u64, u64)>,
    /// The timelines this invocation submitted on and their last values, given back by [`Model::settle`]
    /// when their work succeeded.
    leases: Vec<(TimelineId, u64)>,
}

/// A buffer an invocation imports from another model's work (a finite consumer's upstream result): its
/// submissions wait on `ready` (the producer's readiness, joined from the start) and may only read it.
#[derive(Debug, Clone)]
pub struct Import {
    pub buffer: DeviceBuffer,
    pub ready: Vec<TimelinePoint>,
}

/// How long [`Model::settle`] waits for an invocation's device work before failing it.
pub const DEVICE_TIMEOUT: Duration = Duration::from_secs(300);

/// Overrides a registration can apply on top of `model.json`.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub device: Option<Vec<String>>,
    pub options: Option<serde_json::Map<String, serde_json::Value>>,
    /// The package's manifest to prepare instead of `model.json` (a deployment of the same package family,
    /// e.g. `score.json`): a package-relative `.json` file ([`package::manifest_name`] checks it).
    pub manifest: Option<String>,
}

impl Overrides {
    /// The manifest file this registration prepares: `manifest`, else `model.json`.
    pub fn manifest_file(&self) -> &str {
        self.manifest.as_deref().unwrap_or("model.json")
    }
}

pub(crate) fn limits(fuel: u64, memory: u64) -> InvokeLimits {
    InvokeLimits {
        fuel: fuel.min(package::MAX_FUEL),
        memory_bytes: memory,
        call_depth: 256,
        retained_bytes: None,
    }
}

/// Runs one VM entry with `ctx` as the invocation's host state (see [`crate::natives`]). A trap becomes
/// [`Error::Trap`]. Returns the context as the invocation left it.
pub(crate) fn invoke(
    loaded: &Loaded,
    entry: &str,
    args: &[Value],
    limits: &InvokeLimits,
    ctx: Ctx,
) -> (Result<Vec<Value>>, Ctx) {
    let mut host: Option<HostState> = Some(Box::new(ctx));
    let r = match loaded.entry(entry) {
        Some(id) => {
            let mut out = Vec::new();
            loaded
                .invoke_hosted(id, args, limits, &mut out, &mut host)
                .map(|_| out)
        }
        // The VM's own error names the exports.
        None => loaded.invoke(entry, args, limits),
    };
    let ctx = host
        .and_then(|h| h.downcast::<Ctx>().ok())
        .expect("the VM gives the invocation's host state back; this is a bug");
    (
        r.map_err(|t| Error::Trap {
            entry: entry.to_string(),
            message: t.to_string(),
        }),
        *ctx,
    )
}

impl Model {
    /// Gives the model its way to find other registered models (the registry does, once, before starting its
    /// service); later calls are ignored.
    pub fn set_peers(&self, peers: Peers) {
        let _ = self.peers.0.set(peers);
    }

    /// Another registered model's running service (a consumer's upstream): unknown or not ready is the
    /// registry's error; a model outside a registry finds none.
    pub fn peer(&self, name: &str) -> Result<Arc<dyn crate::contract::Service>> {
        match self.peers.0.get() {
            Some(p) => p(name),
            None => Err(Error::UnknownModel(name.to_string())),
        }
    }

    /// The options it was prepared with (the registration's, else `model.json`'s).
    pub fn options(&self) -> &serde_json::Map<String, serde_json::Value> {
        &self.options
    }

    /// A fresh invocation context in `phase`.
    fn ctx(&self, phase: &'static Phase) -> Ctx {
        let mut c = Ctx::new(phase, self.phases, self.options.clone());
        c.tokenizer = self.tokenizer.clone();
        if phase.grants.declare {
            c.stage_base = self.stages.len();
            c.source_base = self.sources.len();
        }
        c
    }

    /// The memory forecast of one complete request whose input descriptors are `descriptors` (for the finite
    /// contract: its input records, in order), when cold preparation selected one: the entry runs with a
    /// `ranges` table of little-endian i64 (offset, length) pairs into the descriptors laid back to back. A
    /// request whose three estimates together exceed what the model's budget leaves after its resident
    /// parameters can never run, alone or not, and is refused here ([`Error::TooLarge`], naming the
    /// estimates and the budget) before anything is prepared; the forecast reserves nothing, so a request that
    /// fits still goes through ordinary admission. `Ok(None)`: no forecast selected.
    pub fn check_forecast(&self, descriptors: &[&[u8]]) -> Result<Option<Forecast>> {
        let Some(root) = &self.forecast else {
            return Ok(None);
        };
        let mut ranges = Vec::with_capacity(descriptors.len() * 16);
        let mut bytes = Vec::new();
        for d in descriptors {
            ranges.extend_from_slice(&(bytes.len() as i64).to_le_bytes());
            ranges.extend_from_slice(&(d.len() as i64).to_le_bytes());
            bytes.extend_from_slice(d);
        }
        let (r, _) = self.invoke(
            root,
            &crate::contract::FORECAST,
            &[
                self.state().clone(),
                Value::buffer(ranges),
                Value::buffer(bytes),
            ],
            self.doc.fuel.entry(root),
        );
        let out = r?;
        let get = |i: usize| out.get(i).and_then(Value::as_i64).unwrap_or(-1);
        let (p, k, e) = (get(0), get(1), get(2));
        if p < 0 || k < 0 || e < 0 {
            return Err(Error::Program(format!(
                "the memory forecast `{root}` returned ({p}, {k}, {e}); its three byte estimates must not be \
                 negative"
            )));
        }
        let f = Forecast {
            private_peak: p as u64,
            retained: k as u64,
            expanded: e as u64,
        };
        let total = f
            .private_peak
            .saturating_add(f.retained)
            .saturating_add(f.expanded);
        let room = self
            .budget
            .limit
            .saturating_sub(self.report.parameter_bytes);
        if total > room {
            return Err(Error::TooLarge(format!(
                "model `{}` forecasts {total} device bytes for this request (private peak {p}, retained output \
                 {k}, gathered rows {e}); its memory budget leaves {room} bytes after its parameters \
                 (memory.device_bytes is {})",
                self.name, self.budget.limit
            )));
        }
        Ok(Some(f))
    }

    /// What cold `prepare` returned, every result in order.
    pub fn cold_results(&self) -> &[Value] {
        &self.cold.values
    }

    /// The retained state cold `prepare` returned.
    pub fn state(&self) -> &Value {
        &self.cold.state
    }

    /// The tokenizer cold `prepare` named, if any.
    pub fn tokenizer(&self) -> Option<&Arc<Tokenizer>> {
        self.tokenizer.as_ref()
    }

    /// The bytes of the package asset named `key` in `model.json`'s `assets` (`None`: no such asset). Errors
    /// name the package-relative path only.
    pub fn asset(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let Some(path) = self.doc.assets.get(key) else {
            return Ok(None);
        };
        let rel = package::relative("model.json", &format!("assets.{key}"), path)?;
        self.files
            .read(&rel)
            .map(Some)
            .map_err(|m| Error::package("model.json", &format!("assets.{key}"), m))
    }

    /// Runs control entry `entry` as an invocation of `phase` (which must not grant running: see
    /// [`Model::invoke_run`]) with `fuel` and the model's per-invocation memory cap. Returns the results and
    /// what the invocation declared (empty unless the phase grants declarations).
    pub fn invoke(
        &self,
        entry: &str,
        phase: &'static Phase,
        args: &[Value],
        fuel: u64,
    ) -> (Result<Vec<Value>>, Decls) {
        debug_assert!(!phase.grants.run, "Model::invoke_run runs device phases");
        let lim = limits(fuel, self.doc.memory.invocation_bytes);
        let (r, ctx) = invoke(&self.control, entry, args, &lim, self.ctx(phase));
        (r, ctx.decls)
    }

    /// Runs control entry `entry` as an invocation of `phase` (one that grants running) over the stages of
    /// `set`: its `runner.execute_N` calls enqueue on the model's device, ordered by the fences they are given
    /// and their buffer hazards only ([`crate::natives::order`]), on work timelines of its own (idle ones of
    /// the model's, or new ones). `feedback_limit` bounds the bytes of its `runner.feedback` slots.
    pub fn invoke_run(
        &self,
        entry: &str,
        phase: &'static Phase,
        args: &[Value],
        fuel: u64,
        set: StageSet,
        feedback_limit: u64,
        cancel: Option<Arc<CancelFlag>>,
        imports: &[Import],
    ) -> RunOutcome {
        let (timeline, value) = match self.timelines.take(&self.device) {
            Ok(t) => t,
            Err(e) => {
                return RunOutcome {
                    results: Err(e),
                    signalled: Vec::new(),
                    tails: Vec::new(),
                    gathers: Vec::new(),
                    feedback: Vec::new(),
                    leases: Vec::new(),
                };
            }
        };
        let mut ctx = self.ctx(phase);
        ctx.runner = Some(RunCtx {
            device: self.device.clone(),
            budget: self.budget.clone(),
            stages: set.stages,
            order: crate::natives::Order::new(timeline, value),
            spare: self.timelines.clone(),
            workspace: self.workspace.clone(),
            joins: imports
                .iter()
                .flat_map(|i| i.ready.iter().copied())
                .collect(),
            signalled: Vec::new(),
            sources: set.sources,
            gather: self.gather.clone(),
            gathers: Vec::new(),
            feedback: Vec::new(),
            feedback_limit,
            kernel_steps: self.doc.kernel_steps(&self.limits),
            cancel,
            readonly: imports.iter().map(|i| i.buffer.id()).collect(),
        });
        let lim = limits(fuel, self.doc.memory.invocation_bytes);
        let (results, ctx) = invoke(&self.control, entry, args, &lim, ctx);
        let runner = ctx.runner.expect("the runner context stays; this is a bug");
        RunOutcome {
            results,
            signalled: runner.signalled,
            tails: runner.order.tails(),
            gathers: runner.gathers,
            feedback: runner.feedback,
            leases: runner.order.leases(),
        }
    }

    /// The work timelines the model holds (idle and in use).
    pub fn work_timelines(&self) -> u64 {
        self.timelines.held()
    }

    /// Collects what `run` submitted: waits for the last point of each of its chains and every gather
    /// (accepted work is collected even when the invocation trapped after submitting it), then returns the
    /// invocation's results. The invocation's own error comes first; then a failed dispatch or gather (a
    /// client error: the work of this input failed), then a timeout. The timelines whose work succeeded go
    /// back to the model's idle ones; a failed timeline reports its failure to every later wait, so it is
    /// dropped, and one still running is not given back (its work may yet fail it).
    pub fn settle(&self, run: &mut RunOutcome) -> Result<Vec<Value>> {
        let take = |run: &mut RunOutcome| {
            std::mem::replace(
                &mut run.results,
                Err(Error::Internal("settled twice".into())),
            )
        };
        let timeout = DEVICE_TIMEOUT.as_nanos() as u64;
        let mut failed: Option<String> = None;
        let mut late = false;
        let mut done: Vec<TimelineId> = Vec::new();
        for p in &run.tails {
            match self.device.wait(*p, timeout) {
                Ok(true) => done.push(p.timeline),
                Ok(false) => late = true,
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        // Chains with no work of this invocation were never waited on: their timelines are as they were.
        let (idle, lost): (Vec<_>, Vec<_>) = std::mem::take(&mut run.leases)
            .into_iter()
            .partition(|(t, _)| done.contains(t) || !run.tails.iter().any(|p| p.timeline == *t));
        self.timelines.give_back(idle);
        self.timelines.drop_failed(lost.len());
        if let Some(e) = failed {
            take(run)?;
            return Err(Error::BadRequest(format!("device execution failed: {e}")));
        }
        if late {
            return Err(Error::Device(format!(
                "model `{}`: device work did not finish within {DEVICE_TIMEOUT:?}",
                self.name
            )));
        }
        for g in &run.gathers {
            let _ = self.device.wait(*g, timeout);
        }
        for g in &run.gathers {
            if let Some(e) = self.gather.failure(*g) {
                take(run)?;
                return Err(Error::BadRequest(e));
            }
        }
        take(run)
    }

    /// Every stage with parameters: the cold ones and the cached invocation sets.
    fn all_stages(&self) -> Vec<Arc<PreparedStage>> {
        let mut v = self.stages.clone();
        if let Ok(c) = self.spec_cache.lock() {
            for (_, set) in &c.entries {
                v.extend(set.stages.iter().cloned());
            }
        }
        v
    }

    /// Releases every resident parameter buffer (the reloadable backing); compiled stages stay. The caller
    /// makes sure no cohort is running (the registry drains the scheduler first).
    pub fn deactivate(&self) {
        self.workspace.clear();
        for s in self.all_stages() {
            if let Ok(mut p) = s.params.lock() {
                p.clear();
            }
        }
        if let Ok(mut d) = self.domains.lock() {
            d.clear();
        }
    }

    /// The current preparation's progress.
    pub fn progress(&self) -> Arc<Progress> {
        self.progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Streams every parameter again from its (already indexed) source; on failure nothing stays resident.
    /// `progress` follows this activation from here on.
    pub fn activate_params(&self, progress: Arc<Progress>) -> Result<()> {
        // The cold stages were compiled and bound against their checkpoints' index: a checkpoint rewritten
        // since is another file, and placing from it would read the wrong bytes.
        for (i, src) in self.sources.iter().enumerate() {
            if let Some(name) = src.stale() {
                return Err(Error::Checkpoint(format!(
                    "source {i}: checkpoint {name} changed since the model was prepared (another file, size or \
                     modification time); register the model again to serve it"
                )));
            }
        }
        // Request-time sets whose checkpoints changed are dropped (built again when a cohort declares them).
        if let Ok(mut c) = self.spec_cache.lock() {
            let cold = self.sources.len();
            let before = c.entries.len();
            c.entries
                .retain(|(_, set)| set.sources[cold..].iter().all(|s| s.stale().is_none()));
            c.stale += (before - c.entries.len()) as u64;
        }
        *self.progress.lock().unwrap_or_else(|e| e.into_inner()) = progress.clone();
        progress.phase(ProgressPhase::Placing);
        let stages = self.all_stages();
        progress.bytes_declared(self.bytes_to_place(stages.iter().flat_map(|s| &s.bindings)));
        for s in &stages {
            let mut fresh = Vec::with_capacity(s.bindings.len());
            for b in &s.bindings {
                match self.activate(b) {
                    Ok(buf) => fresh.push(buf),
                    Err(e) => {
                        self.deactivate();
                        return Err(e);
                    }
                }
            }
            if let Ok(mut p) = s.params.lock() {
                *p = fresh;
            }
        }
        Ok(())
    }

    /// Device bytes the model holds now.
    pub fn device_bytes(&self) -> u64 {
        self.budget.used()
    }

    /// The device bytes of its budget that no cohort can use: the parameters placed by cold preparation.
    pub fn resident_bytes(&self) -> u64 {
        self.report.parameter_bytes
    }

    /// Bytes of idle command workspace the model keeps for reuse (freed by
    /// [`Model::release_idle_workspace`]).
    pub fn idle_workspace_bytes(&self) -> u64 {
        self.workspace.idle_bytes()
    }

    /// Frees the idle command workspace (before admitting work that needs its room).
    pub fn release_idle_workspace(&self) {
        self.workspace.clear()
    }

    /// The specialization cache's counters.
    pub fn spec_cache_stats(&self) -> SpecCacheStats {
        self.spec_cache
            .lock()
            .map(|c| SpecCacheStats {
                hits: c.hits,
                misses: c.misses,
                evictions: c.evictions,
                stale: c.stale,
                entries: c.entries.len(),
            })
            .unwrap_or_default()
    }
}
