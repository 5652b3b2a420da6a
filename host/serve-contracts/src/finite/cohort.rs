//! One request's admission (`prepare_request`) and one cohort's execution (`prepare_batch`, upload, `run`,
//! collection, the compact download), through the prepared model's invocation API.

use super::plan::ResultPlan;
use super::service::{Prepared, Rows};
use super::{BATCH, Limits, REQUEST, RUN};
use loom_vm::Value;
use serve_runtime::model::{DEVICE_TIMEOUT, Model, RunOutcome};
use serve_runtime::{Error, Result};
use std::sync::Arc;
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

/// Runs one cohort through `prepare_batch` and `run`; one result per member, in order.
pub(crate) fn run_cohort(
    model: &Model,
    limits: &Limits,
    members: &[&Prepared],
    cancel: Option<Arc<serve_runtime::device::CancelFlag>>,
) -> Result<Vec<Rows>> {
    let t_start = Instant::now();
    // prepare_batch(state, stage_tags, ranges, prepared)
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

    let set = model.stages_for(decls)?;
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

    // Upload, run, wait, download the live prefix.
    let t_batch = Instant::now();
    let input = model.device.alloc(upload.len() as u64, &model.budget)?;
    model.device.write(&input, 0, &upload)?;
    let output = model.device.alloc(plan.output_bytes, &model.budget)?;
    let mut run = model.invoke_run(
        "run",
        &RUN,
        &[
            Value::I64(stage_index),
            Value::native("hal.buffer", input.clone()),
            Value::native("hal.buffer", output.clone()),
        ],
        model.doc.fuel.entry("run"),
        set,
        plan.live_bytes,
        cancel,
    );
    let t_run = Instant::now();
    model.settle(&mut run)?;
    if run.signalled.is_empty() {
        return Err(Error::Program(
            "run submitted no work (call runner.execute_N)".into(),
        ));
    }
    let t_wait = Instant::now();
    let live = download(model, &run, &output, &plan)?;
    let rows = plan.split(&live);
    if log::log_enabled!(log::Level::Trace) {
        let us = |a: Instant, b: Instant| b.duration_since(a).as_micros();
        let end = Instant::now();
        log::trace!(
            "model {}: cohort of {}: prepare_batch {} us, upload+run {} us, device wait {} us, download {} us",
            model.name,
            members.len(),
            us(t_start, t_batch),
            us(t_batch, t_run),
            us(t_run, t_wait),
            us(t_wait, end)
        );
    }
    Ok(rows)
}

/// The compact snapshot: the feedback slots in order when the program asked for them (their total must be
/// the plan's live bytes), else the output's live prefix.
fn download(
    model: &Model,
    run: &RunOutcome,
    output: &serve_runtime::device::DeviceBuffer,
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
