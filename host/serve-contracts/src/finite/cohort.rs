//! One request's admission (`prepare_request`) and one cohort's execution through the prepared model's
//! invocation API, in three steps the scheduler pipelines: [`stage`] (`prepare_batch`), [`submit`] (upload
//! and `run`, which enqueues device work) and [`collect`] (wait, the compact download, rows per member).

use super::metrics::Metrics;
use super::plan::ResultPlan;
use super::service::{DeviceRows, Prepared, Rows};
use super::{BATCH, Limits, REQUEST, RUN};
use loom_vm::Value;
use serve_runtime::device::{Budget, DeviceBuffer};
use serve_runtime::model::{DEVICE_TIMEOUT, Import, Model, RunOutcome, StageSet};
use serve_runtime::natives::Decls;
use serve_runtime::{Error, Result};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// Runs `prepare_request(state, input)`: the request's prepared bytes, units and compatibility tag. A trap is
/// the client's error (its input).
pub(crate) fn prepare_request(model: &Model, limits: &Limits, input: Vec<u8>) -> Result<Prepared> {
    let (r, _) = model.invoke(
        "prepare_request",
        &REQUEST,
        &[model.state().clone(), Value::buffer(input)],
        model.doc.fuel.entry("prepare_request"),
    );
    let out = r.map_err(|e| match e {
        Error::Trap { entry, message } => Error::BadRequest(format!("{entry}: {message}")),
        e => e,
    })?;
    let bytes = match &out[0] {
        Value::Buffer(b) => b.clone(),
        _ => Arc::new(Vec::new()),
    };
    let units = out[1].as_i64().unwrap_or(0);
    let tag = out[2].as_i64().unwrap_or(0);
    if units <= 0 {
        return Err(Error::Program(format!(
            "prepare_request returned {units} units; units must be positive"
        )));
    }
    if units > limits.batch_units {
        return Err(Error::BadRequest(format!(
            "this input needs {units} units, more than model `{}`'s batch-unit limit of {}",
            model.name, limits.batch_units
        )));
    }
    Ok(Prepared { bytes, units, tag })
}

/// A cohort after `prepare_batch`: what it declared, the stage it selected, its upload and result plan.
pub(crate) struct Staged {
    pub(crate) decls: Decls,
    stage_index: i64,
    upload: Vec<u8>,
    plan: ResultPlan,
    started: Instant,
}

/// A cohort whose device work is submitted: collected by [`collect`].
pub(crate) struct InFlight {
    run: RunOutcome,
    output: DeviceBuffer,
    /// Kept alive until the work that reads it is collected.
    _input: DeviceBuffer,
    /// The upstream result the work reads (a consumer's cohort), kept alive likewise.
    _upstream: Option<DeviceBuffer>,
    /// The results stay on the device for a consumer: nothing is downloaded.
    on_device: bool,
    plan: ResultPlan,
    started: Instant,
    submitted: Instant,
}

/// Runs `prepare_batch(state, stage_tags, ranges, prepared)` for `members` and checks what it returned.
pub(crate) fn stage(model: &Model, limits: &Limits, members: &[&Prepared]) -> Result<Staged> {
    let started = Instant::now();
    let mut tags = Vec::with_capacity(model.stages.len() * 8);
    for s in &model.stages {
        tags.extend_from_slice(&s.decl.tag.to_le_bytes());
    }
    let total: usize = members.iter().map(|m| m.bytes.len()).sum();
    let mut bytes = Vec::with_capacity(total);
    let mut ranges = Vec::with_capacity(members.len() * 16);
    for m in members {
        ranges.extend_from_slice(&(bytes.len() as i64).to_le_bytes());
        ranges.extend_from_slice(&(m.bytes.len() as i64).to_le_bytes());
        bytes.extend_from_slice(&m.bytes);
    }
    let (r, decls) = model.invoke(
        "prepare_batch",
        &BATCH,
        &[
            model.state().clone(),
            Value::buffer(tags),
            Value::buffer(ranges),
            Value::buffer(bytes),
        ],
        model.doc.fuel.entry("prepare_batch"),
    );
    let out = r?;
    let stage_index = out[0].as_i64().unwrap_or(-1);
    let upload = out[1].as_buffer().unwrap_or_default().to_vec();
    let plan = out[2].as_buffer().unwrap_or_default().to_vec();
    let plan = ResultPlan::parse(&plan, members.len(), limits.result_capacity)?;
    if upload.len() as i64 > limits.upload_capacity {
        return Err(Error::Program(format!(
            "prepare_batch returned a {}-byte upload; the declared upload capacity is {}",
            upload.len(),
            limits.upload_capacity
        )));
    }
    if plan.output_bytes as i64 > limits.output_capacity {
        return Err(Error::Program(format!(
            "the result plan's output is {} bytes; the declared output capacity is {}",
            plan.output_bytes, limits.output_capacity
        )));
    }
    Ok(Staged {
        decls,
        stage_index,
        upload,
        plan,
        started,
    })
}

/// Where a cohort's results go and what it reads besides its upload.
#[derive(Clone, Copy, Default)]
pub(crate) struct Route<'a> {
    /// The results stay on the device for a consumer model, whose budget their output buffer is charged to
    /// (else the model's own, and they are downloaded).
    pub(crate) to_device: Option<&'a Arc<Budget>>,
    /// The upstream result every member of a consumer's cohort reads (`run`'s fourth argument).
    pub(crate) upstream: Option<&'a DeviceRows>,
}

/// Uploads a staged cohort's payload and runs `run(stage, input, output)` (a consumer's:
/// `run(stage, input, output, upstream)`, its submissions waiting on the upstream's readiness) over `set`
/// (the stages its declarations resolved to): the device work is enqueued, not waited for.
pub(crate) fn submit(
    model: &Model,
    staged: &Staged,
    set: StageSet,
    cancel: Option<Arc<serve_runtime::device::CancelFlag>>,
    route: Route<'_>,
) -> Result<InFlight> {
    let Staged {
        stage_index,
        upload,
        plan,
        started,
        ..
    } = staged;
    let (stage_index, plan, started) = (*stage_index, plan.clone(), *started);
    if usize::try_from(stage_index)
        .ok()
        .and_then(|i| set.stages.get(i))
        .is_none()
    {
        return Err(Error::Program(format!(
            "prepare_batch selected stage {stage_index}; {} stages are declared",
            set.stages.len()
        )));
    }
    let input = model.device.alloc(upload.len() as u64, &model.budget)?;
    model.device.write(&input, 0, upload)?;
    let output = model
        .device
        .alloc(plan.output_bytes, route.to_device.unwrap_or(&model.budget))?;
    let mut args = vec![
        Value::I64(stage_index),
        Value::native("hal.buffer", input.clone()),
        Value::native("hal.buffer", output.clone()),
    ];
    let imports: Vec<Import> = route
        .upstream
        .map(|u| Import {
            buffer: u.buffer.clone(),
            ready: u.ready.clone(),
        })
        .into_iter()
        .collect();
    if let Some(u) = route.upstream {
        args.push(Value::native("hal.buffer", u.buffer.clone()));
    }
    let run = model.invoke_run(
        "run",
        &RUN,
        &args,
        model.doc.fuel.entry("run"),
        set,
        plan.live_bytes,
        cancel,
        &imports,
    );
    Ok(InFlight {
        run,
        output,
        _input: input,
        _upstream: route.upstream.map(|u| u.buffer.clone()),
        on_device: route.to_device.is_some(),
        plan,
        started,
        submitted: Instant::now(),
    })
}

/// A staged cohort's prepared working set on its model's budget: the bytes it holds at its peak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Peak {
    pub(crate) upload: u64,
    /// The output buffer, when it is charged to the model's own budget (not a consumer's).
    pub(crate) output: u64,
    /// The selected stage's reflected command workspace (one buffer per entry, as a dispatch takes it).
    pub(crate) workspace: u64,
}

impl Peak {
    pub(crate) fn total(&self) -> u64 {
        self.upload
            .saturating_add(self.output)
            .saturating_add(self.workspace)
    }
}

impl Staged {
    /// The cohort's prepared working set once `set` resolved its declarations (see [`Peak`]). A `run` that
    /// dispatches other stages beside the selected one, or allocates more, is still bounded by the budget at
    /// each allocation.
    pub(crate) fn peak(&self, set: &StageSet, output_here: bool) -> Peak {
        let workspace = usize::try_from(self.stage_index)
            .ok()
            .and_then(|i| set.stages.get(i))
            .map_or(0, |s| {
                s.reflection.workspace.iter().map(|w| w.buffer.bytes).sum()
            });
        Peak {
            upload: self.upload.len() as u64,
            output: if output_here {
                self.plan.output_bytes
            } else {
                0
            },
            workspace,
        }
    }
}

impl InFlight {
    /// Each member's rows left on the device (a cohort routed to a consumer), or `None` when `run` failed
    /// before its work could be handed on (the collection reports why) or asked for host feedback.
    pub(crate) fn device_rows(&self) -> Option<Vec<DeviceRows>> {
        if !self.on_device
            || self.run.results.is_err()
            || self.run.signalled.is_empty()
            || !self.run.feedback.is_empty()
        {
            return None;
        }
        Some(
            self.plan
                .requests
                .iter()
                .map(|&(first, count)| DeviceRows {
                    buffer: self.output.clone(),
                    ready: self.run.tails.clone(),
                    rows: self.plan.rows[first..first + count].to_vec(),
                })
                .collect(),
        )
    }
}

/// Waits for a submitted cohort's work and downloads its compact result: one result per member, in order
/// (empty rows for a cohort whose results stay on the device for a consumer).
pub(crate) fn collect(model: &Model, metrics: &Metrics, mut f: InFlight) -> Result<Vec<Rows>> {
    model.settle(&mut f.run)?;
    if f.run.signalled.is_empty() {
        return Err(Error::Program(
            "run submitted no work (call runner.execute_N)".into(),
        ));
    }
    if f.on_device {
        if !f.run.feedback.is_empty() {
            return Err(Error::Program(format!(
                "model `{}` delivers its results through runner.feedback; a consumer model reads them on the \
                 device, from the output buffer",
                model.name
            )));
        }
        return Ok(vec![Vec::new(); f.plan.requests.len()]);
    }
    let t_wait = Instant::now();
    let live = download(model, &f.run, &f.output, &f.plan)?;
    metrics
        .download_bytes
        .fetch_add(live.len() as u64, Ordering::Relaxed);
    let rows = f.plan.split(&live);
    if log::log_enabled!(log::Level::Trace) {
        let us = |a: Instant, b: Instant| b.duration_since(a).as_micros();
        log::trace!(
            "model {}: cohort: prepare_batch+upload+run {} us, device wait {} us, download {} us",
            model.name,
            us(f.started, f.submitted),
            us(f.submitted, t_wait),
            us(t_wait, Instant::now())
        );
    }
    Ok(rows)
}

/// Runs one cohort through `prepare_batch` and `run` on this thread, compiling its declarations if they are
/// not cached; one result per member, in order.
pub(crate) fn run_cohort(
    model: &Model,
    limits: &Limits,
    metrics: &Metrics,
    members: &[&Prepared],
    cancel: Option<Arc<serve_runtime::device::CancelFlag>>,
    upstream: Option<&DeviceRows>,
) -> Result<Vec<Rows>> {
    let mut staged = stage(model, limits, members)?;
    let set = model.stages_for(std::mem::take(&mut staged.decls))?;
    let route = Route {
        to_device: None,
        upstream,
    };
    collect(model, metrics, submit(model, &staged, set, cancel, route)?)
}

/// The compact snapshot: the feedback slots in order when the program asked for them (their total must be
/// the plan's live bytes), else the output's live prefix.
fn download(
    model: &Model,
    run: &RunOutcome,
    output: &DeviceBuffer,
    plan: &ResultPlan,
) -> Result<Vec<u8>> {
    if run.feedback.is_empty() {
        return model.device.read(output, 0, plan.live_bytes);
    }
    let mut live = Vec::with_capacity(plan.live_bytes as usize);
    for (after, buf, off, len) in &run.feedback {
        if let Err(e) = model.device.wait(*after, DEVICE_TIMEOUT.as_nanos() as u64) {
            return Err(Error::BadRequest(format!("device execution failed: {e}")));
        }
        live.extend(model.device.read(buf, *off, *len)?);
    }
    if live.len() as u64 != plan.live_bytes {
        return Err(Error::Program(format!(
            "runner.feedback slots hold {} bytes; the result plan's live prefix is {}",
            live.len(),
            plan.live_bytes
        )));
    }
    Ok(live)
}
