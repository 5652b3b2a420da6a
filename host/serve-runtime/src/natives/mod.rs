//! The native modules packages import: `prepare`, `options`, `input`, `runner`, `parameters` (one file each).
//!
//! # Protocol
//!
//! The VM binds imports once, at load, to these modules; what a call may do depends on the *invocation* it
//! is part of. The runtime hands each invocation its own [`Ctx`] as the VM's host state
//! (`loom_vm::Loaded::invoke_hosted`): a native reaches it through its call context (`NativeCtx::host`),
//! never through a thread-local or shared state, and gets nothing outside a server invocation.
//!
//! Which calls an invocation may make is decided by its phase's grants ([`crate::contract::Grants`]), which
//! the contract's phase table supplies; the natives know no contract:
//!
//! | grant | natives |
//! |---|---|
//! | declare | `prepare.stage`, `dispatch`, `config`, `config_i64`, `workspace_limit`, `source`, `source_append`, `parameter` (ordinals after the cold ones outside cold preparation) |
//! | forecast | `prepare.memory_forecast` (cold preparation only) |
//! | run | `runner.*` but `size` and `fence`; `parameters.gather` |
//! | (any phase) | `options.*`, `input.*`, `runner.size`, `runner.fence` |
//!
//! A call outside its phase fails the invocation with a message naming the phases that allow it. Declarations
//! copy their strings. `runner.execute_N` only enqueues: it checks the stage and buffers, submits one dispatch
//! that waits on the points joined so far and on its buffers' hazards within the invocation, and signals the next
//! value of one of the invocation's work timelines ([`order`]: independent stages go on chains of their own), and
//! returns that point as `!runner.work`.

mod input;
mod options;
pub mod order;
mod parameters;
mod prepare;
mod runner;

pub use input::{MAX_INPUT_CAPACITY, input_module};
pub use options::options_module;
pub use order::{MAX_CHAINS, Order, TimelinePool, WorkspacePool};
pub use parameters::parameters_module;
pub use prepare::{MAX_DECLS, prepare_module};
pub use runner::{MAX_EXECUTE_ARITY, runner_module};

use crate::checkpoint::Source;
use crate::contract::{Grant, Phase};
use crate::device::gather::GatherQueue;
use crate::device::{Budget, CancelFlag, Device, DeviceBuffer, TimelinePoint};
use crate::model::PreparedStage;
use crate::tokenizer::Tokenizer;
use loom_ir::{Signature, Type};
use loom_plugin_api::BufferId;
use loom_vm::{NativeCtx, NativeError, NativeModule, Value};
use std::sync::Arc;

/// A configuration value bound by `prepare.config` (text) or `prepare.config_i64`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ConfigValue {
    Text(String),
    I64(i64),
}

/// One `prepare.stage` declaration.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct StageDecl {
    pub root: String,
    pub tag: i64,
    pub config: Vec<(String, ConfigValue)>,
    pub workspace_limit: Option<u64>,
}

/// One `prepare.parameter` declaration.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ParamDecl {
    pub stage: usize,
    pub binding: String,
    pub input: u32,
    pub source: usize,
    pub policy: String,
}

/// What one invocation declared.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Decls {
    pub stages: Vec<StageDecl>,
    /// Each source's ordered (directory, path) shards.
    pub sources: Vec<Vec<(String, String)>>,
    pub params: Vec<ParamDecl>,
    pub memory_forecast: Option<String>,
}

/// Runner state of an invocation whose phase grants running.
#[derive(Debug)]
pub struct RunCtx {
    pub device: Arc<Device>,
    pub budget: Arc<Budget>,
    /// Cold stages, then this invocation's declared stages.
    pub stages: Vec<Arc<PreparedStage>>,
    /// The invocation's dependency graph: its chains (timelines) and buffer hazards ([`order`]).
    pub order: Order,
    /// The model's work timelines, from which further chains are drawn.
    pub spare: Arc<TimelinePool>,
    /// The model's idle command workspace, reused in queue order.
    pub workspace: Arc<WorkspacePool>,
    pub joins: Vec<TimelinePoint>,
    /// Every point this invocation's submissions signal.
    pub signalled: Vec<TimelinePoint>,
    /// The model's sources (cold ones first), for `parameters.gather`.
    pub sources: Vec<Arc<Source>>,
    pub gather: Arc<GatherQueue>,
    /// Every point this invocation's gathers signal.
    pub gathers: Vec<TimelinePoint>,
    /// `runner.feedback` slots, in call order: (after this work, buffer, offset, length).
    pub feedback: Vec<(TimelinePoint, DeviceBuffer, u64, u64)>,
    /// The most feedback bytes one invocation may request.
    pub feedback_limit: u64,
    /// The step budget of each dispatch (`limits.kernel_steps` within the operator's cap).
    pub kernel_steps: u64,
    /// The flag that stops this invocation's dispatches (its cohort's clients all gone, the drain deadline).
    pub cancel: Option<Arc<CancelFlag>>,
    /// Buffers the invocation imported from another model (a finite consumer's upstream result): read, never
    /// written (no stage output, no gather target).
    pub readonly: Vec<BufferId>,
}

/// The context of one invocation: the VM's host state while it runs.
#[derive(Debug)]
pub struct Ctx {
    pub phase: &'static Phase,
    /// Every phase of the model's contract (cold preparation first), for messages naming where a call is
    /// allowed.
    pub phases: &'static [&'static Phase],
    /// Ordinals of invocation-declared stages start here (the cold stage count).
    pub stage_base: usize,
    /// Sources declared by cold preparation (invocation sources follow them).
    pub source_base: usize,
    pub decls: Decls,
    pub options: Arc<serde_json::Map<String, serde_json::Value>>,
    pub runner: Option<RunCtx>,
    /// The deployment's tokenizer (bound once cold `prepare` has named it).
    pub tokenizer: Option<Arc<Tokenizer>>,
}

impl Ctx {
    pub fn new(
        phase: &'static Phase,
        phases: &'static [&'static Phase],
        options: Arc<serde_json::Map<String, serde_json::Value>>,
    ) -> Ctx {
        Ctx {
            phase,
            phases,
            stage_base: 0,
            source_base: 0,
            decls: Decls::default(),
            options,
            runner: None,
            tokenizer: None,
        }
    }
}

/// Runs `f` on the invocation context of the call `nc` (an error outside a server invocation).
fn ctx<R>(
    nc: &mut NativeCtx<'_>,
    what: &str,
    f: impl FnOnce(&mut Ctx) -> Result<R, NativeError>,
) -> Result<R, NativeError> {
    match nc.host::<Ctx>() {
        Some(c) => f(c),
        None => Err(NativeError::failed(format!(
            "{what}: called outside a server invocation"
        ))),
    }
}

/// Runs `f` on the runner of an invocation whose phase grants running (any other phase is an error naming it).
fn with_runner<R>(
    nc: &mut NativeCtx<'_>,
    what: &str,
    f: impl FnOnce(&mut RunCtx) -> Result<R, NativeError>,
) -> Result<R, NativeError> {
    ctx(nc, what, |c| {
        need_grant(c, what, Grant::Run)?;
        let r = c
            .runner
            .as_mut()
            .ok_or_else(|| NativeError::failed(format!("{what}: no runner in this invocation")))?;
        f(r)
    })
}

/// Fails unless the invocation's phase grants `grant`, naming the phases of the contract that do.
fn need_grant(c: &Ctx, what: &str, grant: Grant) -> Result<(), NativeError> {
    if c.phase.grants.has(grant) {
        Ok(())
    } else {
        let names: Vec<&str> = c
            .phases
            .iter()
            .filter(|p| p.grants.has(grant))
            .map(|p| p.name)
            .collect();
        Err(NativeError::failed(format!(
            "{what} is available in {} only, not in {}",
            if names.is_empty() {
                "no phase of this contract".to_string()
            } else {
                names.join(" and ")
            },
            c.phase.name
        )))
    }
}

fn sig(params: Vec<Type>, results: Vec<Type>) -> Signature {
    Signature { params, results }
}

fn rty(name: &str) -> Type {
    Type::Ref {
        name: name.to_string(),
        nullable: false,
    }
}

fn arg_i64(args: &[Value], i: usize) -> i64 {
    args.get(i).and_then(Value::as_i64).unwrap_or(0)
}

fn arg_str(args: &[Value], i: usize) -> String {
    args.get(i)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

fn device_buffer<'a>(v: &'a Value, what: &str, i: usize) -> Result<&'a DeviceBuffer, NativeError> {
    match v {
        Value::Native { obj, .. } => obj.downcast_ref::<DeviceBuffer>(),
        _ => None,
    }
    .ok_or_else(|| NativeError::failed(format!("{what}: argument {i} is not a device buffer")))
}

fn point_of(v: &Value) -> Option<TimelinePoint> {
    match v {
        Value::Native { obj, .. } => obj.downcast_ref::<TimelinePoint>().copied(),
        _ => None,
    }
}

/// The native modules of the cold preparation program ([`crate::abi::prepare_role`]).
pub fn prepare_program_modules() -> Vec<Arc<NativeModule>> {
    vec![
        Arc::new(prepare_module()),
        Arc::new(options_module()),
        Arc::new(input_module()),
    ]
}

/// The native modules of the control program ([`crate::abi::control_role`]).
pub fn control_program_modules() -> Vec<Arc<NativeModule>> {
    vec![
        Arc::new(prepare_module()),
        Arc::new(runner_module()),
        Arc::new(input_module()),
        Arc::new(parameters_module()),
    ]
}
