//! The native modules packages import: `prepare`, `options`, `input`, `runner`.
//!
//! # Protocol
//!
//! The VM binds imports once, at load, to these modules; what a call may do depends on the *invocation* it
//! is part of. The runtime installs an [`Ctx`] in a thread-local for the duration of one `invoke`
//! ([`with_invocation`]); the VM runs an invocation synchronously on the calling thread, so a native call
//! always sees the context of the invocation that made it, and nothing else.
//!
//! | phase | `prepare.*` | `runner.*` |
//! |---|---|---|
//! | cold `prepare` | declarations (stages, config, sources, parameters, limits) | no |
//! | `prepare_request` | no | no |
//! | finite `prepare_batch` | invocation-scoped stages, sources and parameters (ordinals follow the cold ones) | no |
//! | finite `run` | no | `execute_N`, `fence`, `join`, `feedback`, `buffer`, `stage_buffer`, `size`; `parameters.gather` |
//!
//! A call outside its phase fails the invocation with a message naming the phase. Declarations copy their
//! strings. `runner.execute_N` only enqueues: it checks the stage and buffers, submits one dispatch that waits
//! on the points joined so far and signals the next value of the model's work timeline, and returns that point
//! as `!runner.work`.

use crate::checkpoint::Source;
use crate::device::{Budget, Device, DeviceBuffer};
use crate::gather::{DESCRIPTOR_BYTES, GatherQueue, Job, MAX_DESCRIPTORS};
use crate::model::PreparedStage;
use crate::tokenizer::Tokenizer;
use loom_ir::{Signature, Type};
use loom_plugin_api::abi_stable::std_types::RVec;
use loom_plugin_api::{Command, Submission, TimelineId, TimelinePoint};
use loom_vm::{NativeError, NativeModule, Value};
use std::cell::RefCell;
use std::sync::Arc;

/// Which entry an invocation runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Cold,
    Request,
    Batch,
    Run,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Cold => "cold preparation",
            Phase::Request => "prepare_request",
            Phase::Batch => "prepare_batch",
            Phase::Run => "run",
        }
    }
}

/// A configuration value bound by `prepare.config` (text) or `prepare.config_i64`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ConfigValue {
    Text(String),
    I64(i64),
}

/// One `prepare.stage` / `prepare.dispatch` declaration.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct StageDecl {
    pub root: String,
    pub tag: i64,
    pub dispatch: bool,
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

/// Runner state of a `run` invocation.
#[derive(Debug)]
pub struct RunCtx {
    pub device: Arc<Device>,
    pub budget: Arc<Budget>,
    /// Cold stages, then this cohort's invocation stages.
    pub stages: Vec<Arc<PreparedStage>>,
    pub timeline: TimelineId,
    /// The last value signalled on `timeline` before this invocation.
    pub value: u64,
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
}

/// The context of one invocation.
#[derive(Debug)]
pub struct Ctx {
    pub phase: Phase,
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
    pub fn new(phase: Phase, options: Arc<serde_json::Map<String, serde_json::Value>>) -> Ctx {
        Ctx {
            phase,
            stage_base: 0,
            source_base: 0,
            decls: Decls::default(),
            options,
            runner: None,
            tokenizer: None,
        }
    }
}

thread_local! {
    static CTX: RefCell<Option<Ctx>> = const { RefCell::new(None) };
}

/// Runs `f` (one VM invocation) with `ctx` installed; returns `f`'s result and the context as it was left.
pub fn with_invocation<R>(ctx: Ctx, f: impl FnOnce() -> R) -> (R, Ctx) {
    let prev = CTX.with(|c| c.borrow_mut().replace(ctx));
    let r = f();
    let ctx = CTX
        .with(|c| std::mem::replace(&mut *c.borrow_mut(), prev))
        .expect("invocation context removed during the invocation; this is a bug");
    (r, ctx)
}

fn ctx<R>(
    what: &str,
    f: impl FnOnce(&mut Ctx) -> Result<R, NativeError>,
) -> Result<R, NativeError> {
    CTX.with(|c| match c.borrow_mut().as_mut() {
        Some(ctx) => f(ctx),
        None => Err(NativeError::failed(format!(
            "{what}: called outside a server invocation"
        ))),
    })
}

/// Runs `f` on the runner of a `run` invocation (any other phase is an error naming it).
fn with_runner<R>(
    what: &str,
    f: impl FnOnce(&mut RunCtx) -> Result<R, NativeError>,
) -> Result<R, NativeError> {
    ctx(what, |c| {
        need_phase(c, what, &[Phase::Run])?;
        let r = c
            .runner
            .as_mut()
            .ok_or_else(|| NativeError::failed(format!("{what}: no runner in this invocation")))?;
        f(r)
    })
}

fn need_phase(c: &Ctx, what: &str, allowed: &[Phase]) -> Result<(), NativeError> {
    if allowed.contains(&c.phase) {
        Ok(())
    } else {
        let names: Vec<&str> = allowed.iter().map(|p| p.name()).collect();
        Err(NativeError::failed(format!(
            "{what} is available in {} only, not in {}",
            names.join(" and "),
            c.phase.name()
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

/// Declaration limits per invocation (a hostile program cannot grow the server's tables without bound).
pub const MAX_DECLS: usize = 4096;

fn stage_ordinal(c: &Ctx, what: &str, s: i64) -> Result<usize, NativeError> {
    let local = (s as usize).checked_sub(c.stage_base);
    match local {
        Some(l) if s >= 0 && l < c.decls.stages.len() => Ok(l),
        _ => Err(NativeError::failed(format!(
            "{what}: stage {s} was not declared by this invocation (its stages are {}..{})",
            c.stage_base,
            c.stage_base + c.decls.stages.len()
        ))),
    }
}

/// `prepare`: cold and invocation-scoped declarations.
pub fn prepare_module() -> NativeModule {
    use Type::*;
    let declare = |dispatch: bool| {
        move |_: &mut loom_vm::NativeCtx<'_>, args: &[Value]| {
            let what = if dispatch {
                "prepare.dispatch"
            } else {
                "prepare.stage"
            };
            ctx(what, |c| {
                need_phase(c, what, &[Phase::Cold, Phase::Batch])?;
                if c.decls.stages.len() >= MAX_DECLS {
                    return Err(NativeError::failed(format!(
                        "{what}: more than {MAX_DECLS} stages"
                    )));
                }
                let root = arg_str(args, 0);
                if root.is_empty() || root.len() > 512 {
                    return Err(NativeError::failed(format!(
                        "{what}: root must name a stage (`module.stage`), found {root:?}"
                    )));
                }
                c.decls.stages.push(StageDecl {
                    root,
                    tag: arg_i64(args, 1),
                    dispatch,
                    config: Vec::new(),
                    workspace_limit: None,
                });
                Ok(vec![Value::I64(
                    (c.stage_base + c.decls.stages.len() - 1) as i64,
                )])
            })
        }
    };
    NativeModule::new("prepare")
        .func("stage", sig(vec![Str, I64], vec![I64]), 10, declare(false))
        .func(
            "dispatch",
            sig(vec![Str, I64], vec![I64]),
            10,
            declare(true),
        )
        .func("config", sig(vec![I64, Str, Str], vec![]), 10, |_, a| {
            ctx("prepare.config", |c| {
                need_phase(c, "prepare.config", &[Phase::Cold, Phase::Batch])?;
                let s = stage_ordinal(c, "prepare.config", arg_i64(a, 0))?;
                let cfg = &mut c.decls.stages[s].config;
                if cfg.len() >= 256 {
                    return Err(NativeError::failed("prepare.config: more than 256 values"));
                }
                cfg.push((arg_str(a, 1), ConfigValue::Text(arg_str(a, 2))));
                Ok(vec![])
            })
        })
        .func(
            "config_i64",
            sig(vec![I64, Str, I64], vec![]),
            10,
            |_, a| {
                ctx("prepare.config_i64", |c| {
                    need_phase(c, "prepare.config_i64", &[Phase::Cold, Phase::Batch])?;
                    let s = stage_ordinal(c, "prepare.config_i64", arg_i64(a, 0))?;
                    let cfg = &mut c.decls.stages[s].config;
                    if cfg.len() >= 256 {
                        return Err(NativeError::failed(
                            "prepare.config_i64: more than 256 values",
                        ));
                    }
                    cfg.push((arg_str(a, 1), ConfigValue::I64(arg_i64(a, 2))));
                    Ok(vec![])
                })
            },
        )
        .func(
            "workspace_limit",
            sig(vec![I64, I64], vec![]),
            10,
            |_, a| {
                ctx("prepare.workspace_limit", |c| {
                    need_phase(c, "prepare.workspace_limit", &[Phase::Cold, Phase::Batch])?;
                    let s = stage_ordinal(c, "prepare.workspace_limit", arg_i64(a, 0))?;
                    let b = arg_i64(a, 1);
                    if b < 0 {
                        return Err(NativeError::failed(format!(
                            "prepare.workspace_limit: {b} is negative"
                        )));
                    }
                    c.decls.stages[s].workspace_limit = Some(b as u64);
                    Ok(vec![])
                })
            },
        )
        .func("memory_forecast", sig(vec![Str], vec![]), 10, |_, a| {
            ctx("prepare.memory_forecast", |c| {
                need_phase(c, "prepare.memory_forecast", &[Phase::Cold])?;
                c.decls.memory_forecast = Some(arg_str(a, 0));
                Ok(vec![])
            })
        })
        .func("source", sig(vec![Str, Str], vec![I64]), 10, |_, a| {
            ctx("prepare.source", |c| {
                need_phase(c, "prepare.source", &[Phase::Cold, Phase::Batch])?;
                if c.decls.sources.len() >= 256 {
                    return Err(NativeError::failed("prepare.source: more than 256 sources"));
                }
                c.decls.sources.push(vec![(arg_str(a, 0), arg_str(a, 1))]);
                Ok(vec![Value::I64(
                    (c.source_base + c.decls.sources.len() - 1) as i64,
                )])
            })
        })
        .func(
            "source_append",
            sig(vec![I64, Str, Str], vec![]),
            10,
            |_, a| {
                ctx("prepare.source_append", |c| {
                    need_phase(c, "prepare.source_append", &[Phase::Cold, Phase::Batch])?;
                    let s = arg_i64(a, 0);
                    let local = (s as usize).checked_sub(c.source_base);
                    let Some(list) = local.and_then(|l| c.decls.sources.get_mut(l)) else {
                        return Err(NativeError::failed(format!(
                            "prepare.source_append: source {s} was not declared by this invocation \
                         (a cold source cannot get shards later)"
                        )));
                    };
                    if list.len() >= 4096 {
                        return Err(NativeError::failed(
                            "prepare.source_append: more than 4096 shards",
                        ));
                    }
                    list.push((arg_str(a, 1), arg_str(a, 2)));
                    Ok(vec![])
                })
            },
        )
        .func(
            "parameter",
            sig(vec![I64, Str, I64, I64, Str], vec![]),
            10,
            |_, a| {
                ctx("prepare.parameter", |c| {
                    need_phase(c, "prepare.parameter", &[Phase::Cold, Phase::Batch])?;
                    let stage = stage_ordinal(c, "prepare.parameter", arg_i64(a, 0))?;
                    let input = arg_i64(a, 2);
                    let source = arg_i64(a, 3);
                    if !(0..=255).contains(&input) {
                        return Err(NativeError::failed(format!(
                            "prepare.parameter: input ordinal {input} is not in 0..=255"
                        )));
                    }
                    if source < 0 || source as usize >= c.source_base + c.decls.sources.len() {
                        return Err(NativeError::failed(format!(
                            "prepare.parameter: source {source} was not declared"
                        )));
                    }
                    if c.decls.params.len() >= MAX_DECLS {
                        return Err(NativeError::failed(
                            "prepare.parameter: too many declarations",
                        ));
                    }
                    c.decls.params.push(ParamDecl {
                        stage,
                        binding: arg_str(a, 1),
                        input: input as u32,
                        source: source as usize,
                        policy: arg_str(a, 4),
                    });
                    Ok(vec![])
                })
            },
        )
}

fn option<'a>(c: &'a Ctx, key: &str) -> Option<&'a serde_json::Value> {
    c.options.get(key)
}

/// `options`: typed reads of the deployment's source-owned options object.
pub fn options_module() -> NativeModule {
    use Type::*;
    NativeModule::new("options")
        .func("i64", sig(vec![Str, I64], vec![I64]), 5, |_, a| {
            ctx("options.i64", |c| {
                let key = arg_str(a, 0);
                match option(c, &key) {
                    None => Ok(vec![Value::I64(arg_i64(a, 1))]),
                    Some(v) => v.as_i64().map(|i| vec![Value::I64(i)]).ok_or_else(|| {
                        NativeError::failed(format!(
                            "model.json: field `options.{key}`: expected an integer, found {v}"
                        ))
                    }),
                }
            })
        })
        .func("f64", sig(vec![Str, F64], vec![F64]), 5, |_, a| {
            ctx("options.f64", |c| {
                let key = arg_str(a, 0);
                match option(c, &key) {
                    None => Ok(vec![Value::F64(
                        a.get(1).and_then(Value::as_f64).unwrap_or(0.0),
                    )]),
                    Some(v) => v.as_f64().map(|f| vec![Value::F64(f)]).ok_or_else(|| {
                        NativeError::failed(format!(
                            "model.json: field `options.{key}`: expected a number, found {v}"
                        ))
                    }),
                }
            })
        })
        .func("str", sig(vec![Str, Str], vec![Str]), 5, |_, a| {
            ctx("options.str", |c| {
                let key = arg_str(a, 0);
                match option(c, &key) {
                    None => Ok(vec![Value::str(&arg_str(a, 1))]),
                    Some(v) => v.as_str().map(|s| vec![Value::str(s)]).ok_or_else(|| {
                        NativeError::failed(format!(
                            "model.json: field `options.{key}`: expected a string, found {v}"
                        ))
                    }),
                }
            })
        })
}

/// Largest `input.encode` id capacity and `input.decode` byte capacity.
pub const MAX_INPUT_CAPACITY: i64 = 1 << 24;

fn tokenizer_of(c: &Ctx, what: &str) -> Result<Arc<Tokenizer>, NativeError> {
    c.tokenizer.clone().ok_or_else(|| {
        NativeError::failed(format!(
            "{what}: this model has no tokenizer (cold prepare names it; it is bound once prepare returns)"
        ))
    })
}

fn capacity(what: &str, v: i64) -> Result<usize, NativeError> {
    if (0..=MAX_INPUT_CAPACITY).contains(&v) {
        Ok(v as usize)
    } else {
        Err(NativeError::failed(format!(
            "{what}: capacity {v} is outside 0..={MAX_INPUT_CAPACITY}"
        )))
    }
}

/// `input`: the deployment's tokenizer.
pub fn input_module() -> NativeModule {
    use Type::*;
    NativeModule::new("input")
        .func(
            "encode",
            sig(vec![Buffer, I32, I64], vec![Buffer, I64]),
            50,
            |nctx, a| {
                let tok = ctx("input.encode", |c| tokenizer_of(c, "input.encode"))?;
                let text = a.first().and_then(Value::as_buffer).unwrap_or_default();
                let flags = a.get(1).and_then(Value::as_i32).unwrap_or(0);
                let cap = capacity("input.encode", arg_i64(a, 2))?;
                nctx.charge_fuel(text.len() as u64)?;
                nctx.alloc(cap as u64 * 4)?;
                let text = std::str::from_utf8(text).map_err(|e| {
                    NativeError::failed(format!("input.encode: the text is not UTF-8 ({e})"))
                })?;
                let ids = tok.encode(text, flags).map_err(NativeError::failed)?;
                let n = ids.len().min(cap);
                let mut out = vec![0u8; cap * 4];
                for (i, id) in ids[..n].iter().enumerate() {
                    out[i * 4..i * 4 + 4].copy_from_slice(&(*id as i32).to_le_bytes());
                }
                Ok(vec![Value::buffer(out), Value::I64(n as i64)])
            },
        )
        .func(
            "decode",
            sig(vec![Buffer, I32, I64], vec![Buffer, I64]),
            50,
            |nctx, a| {
                let tok = ctx("input.decode", |c| tokenizer_of(c, "input.decode"))?;
                let raw = a.first().and_then(Value::as_buffer).unwrap_or_default();
                let flags = a.get(1).and_then(Value::as_i32).unwrap_or(0);
                let cap = capacity("input.decode", arg_i64(a, 2))?;
                if raw.len() % 4 != 0 {
                    return Err(NativeError::failed(format!(
                        "input.decode: {} bytes are not whole i32 ids",
                        raw.len()
                    )));
                }
                nctx.charge_fuel(raw.len() as u64)?;
                nctx.alloc(cap as u64)?;
                let mut ids = Vec::with_capacity(raw.len() / 4);
                for c in raw.chunks_exact(4) {
                    let id = i32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                    if id < 0 {
                        return Err(NativeError::failed(format!(
                            "input.decode: negative token id {id}"
                        )));
                    }
                    ids.push(id as u32);
                }
                let text = tok.decode(&ids, flags).map_err(NativeError::failed)?;
                if text.len() > cap {
                    return Err(NativeError::failed(format!(
                        "input.decode: the text needs {} bytes, the capacity is {cap}",
                        text.len()
                    )));
                }
                let mut out = text.into_bytes();
                let n = out.len();
                out.resize(cap, 0);
                Ok(vec![Value::buffer(out), Value::I64(n as i64)])
            },
        )
}

/// The most buffers one `runner.execute_N` takes.
pub const MAX_EXECUTE_ARITY: usize = 8;

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

fn execute(a: &[Value], n: usize) -> Result<Vec<Value>, NativeError> {
    let what = format!("runner.execute_{n}");
    with_runner(&what, |r| {
        let si = arg_i64(a, 0);
        let stage = usize::try_from(si)
            .ok()
            .and_then(|i| r.stages.get(i))
            .cloned()
            .ok_or_else(|| {
                NativeError::failed(format!(
                    "{what}: stage {si} does not exist (this cohort has {} stages)",
                    r.stages.len()
                ))
            })?;
        let ni = stage.reflection.inputs.len();
        let no = stage.reflection.outputs.len();
        if ni + no != n {
            return Err(NativeError::failed(format!(
                "{what}: stage `{}` takes {ni} input(s) and {no} output(s), so runner.execute_{}",
                stage.decl.root,
                ni + no
            )));
        }
        let mut bufs = Vec::with_capacity(n);
        for (i, v) in a[1..].iter().enumerate() {
            let b = device_buffer(v, &what, i + 1)?;
            let info = if i < ni {
                &stage.reflection.inputs[i]
            } else {
                &stage.reflection.outputs[i - ni]
            };
            if b.bytes() != info.bytes {
                return Err(NativeError::failed(format!(
                    "{what}: stage `{}` buffer `{}` is {}{:?} ({} bytes), the buffer given has {} bytes",
                    stage.decl.root,
                    info.name,
                    info.dtype.name(),
                    info.shape,
                    info.bytes,
                    b.bytes()
                )));
            }
            if !Arc::ptr_eq(b.device(), &r.device) {
                return Err(NativeError::failed(format!(
                    "{what}: argument {} lives on another device",
                    i + 1
                )));
            }
            bufs.push(b.clone());
        }
        // Command workspace: one buffer per reflected workspace entry, queue-ordered; dropping our handles
        // after submission is safe because the submission holds its buffers until it retires.
        let mut ws = Vec::with_capacity(stage.reflection.workspace.len());
        for w in &stage.reflection.workspace {
            ws.push(
                r.device
                    .alloc(w.buffer.bytes, &r.budget)
                    .map_err(|e| NativeError::failed(format!("{what}: workspace: {e}")))?,
            );
        }
        let point = TimelinePoint {
            timeline: r.timeline,
            value: r.value + 1,
        };
        let params: RVec<_> = stage
            .params
            .lock()
            .map_err(|_| NativeError::failed(format!("{what}: parameters poisoned")))?
            .iter()
            .map(|b| b.id())
            .collect();
        if params.len() != stage.stage.params.len() {
            return Err(NativeError::failed(format!(
                "{what}: stage `{}`'s parameters are not resident (the model is deactivated)",
                stage.decl.root
            )));
        }
        let cmd = Command::Dispatch {
            exe: stage.exe,
            inputs: bufs[..ni].iter().map(|b| b.id()).collect(),
            params,
            outputs: bufs[ni..].iter().map(|b| b.id()).collect(),
            workspace: ws.iter().map(|b| b.id()).collect(),
        };
        let mut wait: RVec<TimelinePoint> = r.joins.iter().copied().collect();
        if let Some(prev) = r.signalled.last() {
            wait.push(*prev);
        }
        r.device
            .submit(Submission {
                commands: vec![cmd].into_iter().collect(),
                wait,
                signal: point,
            })
            .map_err(|e| NativeError::failed(format!("{what}: {e}")))?;
        r.value += 1;
        r.signalled.push(point);
        Ok(vec![Value::native("runner.work", point)])
    })
}

/// `runner`: enqueue prepared stages, fences and joins.
pub fn runner_module() -> NativeModule {
    let mut m = NativeModule::new("runner");
    for n in 1..=MAX_EXECUTE_ARITY {
        let mut params = vec![Type::I64];
        params.extend(std::iter::repeat_n(rty("hal.buffer"), n));
        m = m.func(
            &format!("execute_{n}"),
            sig(params, vec![rty("runner.work")]),
            100,
            move |_, a| execute(a, n),
        );
    }
    m.func(
        "buffer",
        sig(vec![Type::I64], vec![rty("hal.buffer")]),
        20,
        |_, a| {
            with_runner("runner.buffer", |r| {
                let n = arg_i64(a, 0);
                if n < 0 {
                    return Err(NativeError::failed(format!(
                        "runner.buffer: {n} bytes is negative"
                    )));
                }
                let b = r
                    .device
                    .alloc(n as u64, &r.budget)
                    .map_err(|e| NativeError::failed(format!("runner.buffer: {e}")))?;
                Ok(vec![Value::native("hal.buffer", b)])
            })
        },
    )
    .func(
        "stage_buffer",
        sig(vec![Type::I64, Type::I64], vec![rty("hal.buffer")]),
        20,
        |_, a| {
            with_runner("runner.stage_buffer", |r| {
                let (si, bi) = (arg_i64(a, 0), arg_i64(a, 1));
                let stage = usize::try_from(si)
                    .ok()
                    .and_then(|i| r.stages.get(i))
                    .ok_or_else(|| {
                        NativeError::failed(format!("runner.stage_buffer: no stage {si}"))
                    })?;
                let refl = &stage.reflection;
                let info = usize::try_from(bi)
                    .ok()
                    .and_then(|i| refl.inputs.iter().chain(&refl.outputs).nth(i))
                    .ok_or_else(|| {
                        NativeError::failed(format!(
                            "runner.stage_buffer: stage `{}` has {} buffers (inputs, then outputs), not {bi}",
                            stage.decl.root,
                            refl.inputs.len() + refl.outputs.len()
                        ))
                    })?;
                let b = r
                    .device
                    .alloc(info.bytes, &r.budget)
                    .map_err(|e| NativeError::failed(format!("runner.stage_buffer: {e}")))?;
                Ok(vec![Value::native("hal.buffer", b)])
            })
        },
    )
    .func(
        "size",
        sig(vec![rty("hal.buffer")], vec![Type::I64]),
        5,
        |_, a| {
            let b = device_buffer(&a[0], "runner.size", 1)?;
            Ok(vec![Value::I64(b.bytes() as i64)])
        },
    )
    .func(
        "feedback",
        sig(
            vec![rty("runner.work"), rty("hal.buffer"), Type::I64, Type::I64],
            vec![Type::I64],
        ),
        20,
        |_, a| {
            let what = "runner.feedback";
            with_runner(what, |r| {
                let after = a.first().and_then(point_of).ok_or_else(|| {
                    NativeError::failed(format!("{what}: argument 1 is not accepted work"))
                })?;
                let b = device_buffer(&a[1], what, 2)?.clone();
                let (off, len) = (arg_i64(a, 2), arg_i64(a, 3));
                if off < 0 || len < 0 || (off as u64).checked_add(len as u64).is_none_or(|e| e > b.bytes()) {
                    return Err(NativeError::failed(format!(
                        "{what}: bytes {off}+{len} are outside the {}-byte buffer",
                        b.bytes()
                    )));
                }
                let total: u64 = r.feedback.iter().map(|f| f.3).sum::<u64>() + len as u64;
                if total > r.feedback_limit {
                    return Err(NativeError::failed(format!(
                        "{what}: {total} feedback bytes exceed this invocation's bound of {}",
                        r.feedback_limit
                    )));
                }
                if r.feedback.len() >= 1024 {
                    return Err(NativeError::failed(format!("{what}: more than 1024 slots")));
                }
                r.feedback.push((after, b, off as u64, len as u64));
                Ok(vec![Value::I64(r.feedback.len() as i64 - 1)])
            })
        },
    )
    .func(
        "fence",
        sig(vec![rty("runner.work")], vec![rty("hal.fence")]),
        5,
        |_, a| {
            let p = a.first().and_then(point_of).ok_or_else(|| {
                NativeError::failed("runner.fence: the argument is not accepted work")
            })?;
            Ok(vec![Value::native("hal.fence", p)])
        },
    )
    .func(
        "join",
        sig(
            vec![Type::Ref {
                name: "hal.fence".into(),
                nullable: true,
            }],
            vec![],
        ),
        5,
        |_, a| {
            with_runner("runner.join", |r| {
                match a.first() {
                    Some(Value::Null(_)) | None => Ok(vec![]),
                    Some(v) => {
                        let p = point_of(v)
                            .ok_or_else(|| NativeError::failed("runner.join: not a fence"))?;
                        if r.joins.len() >= 1024 {
                            return Err(NativeError::failed("runner.join: more than 1024 joins"));
                        }
                        r.joins.push(p);
                        Ok(vec![])
                    }
                }
            })
        },
    )
}

/// `parameters`: demand reads of checkpoint byte ranges (see [`crate::gather`]).
pub fn parameters_module() -> NativeModule {
    use Type::*;
    let fence_t = Type::Ref {
        name: "hal.fence".into(),
        nullable: true,
    };
    NativeModule::new("parameters").func(
        "gather",
        sig(
            vec![
                I64,
                Buffer,
                fence_t,
                rty("hal.buffer"),
                I64,
                I64,
                rty("hal.buffer"),
            ],
            vec![rty("hal.fence")],
        ),
        100,
        |_, a| {
            let what = "parameters.gather";
            with_runner(what, |r| {
                let si = arg_i64(a, 0);
                let source = usize::try_from(si)
                    .ok()
                    .and_then(|i| r.sources.get(i))
                    .cloned()
                    .ok_or_else(|| {
                        NativeError::failed(format!(
                            "{what}: source {si} does not exist ({} declared)",
                            r.sources.len()
                        ))
                    })?;
                let key = std::str::from_utf8(a.get(1).and_then(Value::as_buffer).unwrap_or_default())
                    .map_err(|_| NativeError::failed(format!("{what}: the key is not UTF-8")))?
                    .to_string();
                let entry = source.entries.get(&key).cloned().ok_or_else(|| {
                    NativeError::failed(format!("{what}: source {si} has no entry {key:?}"))
                })?;
                let wait = match a.get(2) {
                    Some(Value::Null(_)) | None => None,
                    Some(v) => Some(point_of(v).ok_or_else(|| {
                        NativeError::failed(format!("{what}: argument 3 is not a fence"))
                    })?),
                };
                let descriptors = device_buffer(&a[3], what, 4)?.clone();
                let offset = arg_i64(a, 4);
                let count = arg_i64(a, 5);
                let target = device_buffer(&a[6], what, 7)?.clone();
                if offset < 0 || !(0..=MAX_DESCRIPTORS as i64).contains(&count) {
                    return Err(NativeError::failed(format!(
                        "{what}: descriptor offset {offset} / count {count} out of range"
                    )));
                }
                let end = (offset as u64).checked_add(count as u64 * DESCRIPTOR_BYTES);
                if end.is_none_or(|e| e > descriptors.bytes()) {
                    return Err(NativeError::failed(format!(
                        "{what}: {count} descriptors at offset {offset} overrun the {}-byte descriptor buffer",
                        descriptors.bytes()
                    )));
                }
                if !Arc::ptr_eq(descriptors.device(), r.gather.device())
                    || !Arc::ptr_eq(target.device(), r.gather.device())
                {
                    return Err(NativeError::failed(format!(
                        "{what}: buffers must live on the model's device"
                    )));
                }
                let point = r
                    .gather
                    .submit(Job {
                        wait,
                        descriptors,
                        offset: offset as u64,
                        count: count as u64,
                        target,
                        source,
                        entry,
                        key,
                        point: TimelinePoint {
                            timeline: r.timeline,
                            value: 0,
                        },
                    })
                    .map_err(|m| NativeError::failed(format!("{what}: {m}")))?;
                r.gathers.push(point);
                Ok(vec![Value::native("hal.fence", point)])
            })
        },
    )
}
