//! `runner`: enqueue prepared stages on the model's device (`execute_N`), allocate buffers, fences, joins and
//! feedback slots. Available only in phases whose grants include running.

use super::{arg_i64, device_buffer, point_of, rty, sig, with_runner};
use crate::device::{Bounds, Dispatch};
use loom_ir::Type;
use loom_vm::{NativeCtx, NativeError, NativeModule, Value};
use std::sync::Arc;

/// The most buffers one `runner.execute_N` takes.
pub const MAX_EXECUTE_ARITY: usize = 8;

fn execute(nc: &mut NativeCtx<'_>, a: &[Value], n: usize) -> Result<Vec<Value>, NativeError> {
    let what = format!("runner.execute_{n}");
    with_runner(nc, &what, |r| {
        let si = arg_i64(a, 0);
        let stage = usize::try_from(si)
            .ok()
            .and_then(|i| r.stages.get(i))
            .cloned()
            .ok_or_else(|| {
                NativeError::failed(format!(
                    "{what}: stage {si} does not exist (this invocation has {} stages)",
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
        let ids =
            |b: &[crate::device::DeviceBuffer]| -> Vec<_> { b.iter().map(|b| b.id()).collect() };
        let (reads, writes) = (ids(&bufs[..ni]), ids(&bufs[ni..]));
        if let Some(i) = writes.iter().position(|w| r.readonly.contains(w)) {
            return Err(NativeError::failed(format!(
                "{what}: stage `{}` writes its output `{}` into the upstream model's result, which this \
                 invocation may only read",
                stage.decl.root, stage.reflection.outputs[i].name
            )));
        }
        // Command workspace: one buffer per reflected workspace entry, from the model's idle sets when one of
        // the same sizes has retired (queue order), else allocated; dropping our handles after submission is
        // safe because the submission holds its buffers until it retires.
        let sizes: Vec<u64> = stage
            .reflection
            .workspace
            .iter()
            .map(|w| w.buffer.bytes)
            .collect();
        let ws = match r.workspace.take(&r.device, &sizes) {
            Some(set) => set,
            None => {
                let mut ws = Vec::with_capacity(sizes.len());
                for &bytes in &sizes {
                    let b = match r.device.alloc(bytes, &r.budget) {
                        Ok(b) => b,
                        Err(_) => {
                            // Idle sets hold budget: give them back and try once more.
                            r.workspace.clear();
                            r.device.alloc(bytes, &r.budget).map_err(|e| {
                                NativeError::failed(format!("{what}: workspace: {e}"))
                            })?
                        }
                    };
                    ws.push(b);
                }
                ws
            }
        };
        let params = stage
            .params
            .lock()
            .map_err(|_| NativeError::failed(format!("{what}: parameters poisoned")))?;
        if params.len() != stage.stage.params.len() {
            return Err(NativeError::failed(format!(
                "{what}: stage `{}`'s parameters are not resident (the model is deactivated)",
                stage.decl.root
            )));
        }
        let placement = r.order.place(&reads, &writes, &r.joins).map_err(|i| {
            NativeError::failed(format!(
                "{what}: stage `{}` writes its output `{}` into a buffer given to runner.feedback, which \
                 reads it when the invocation's work is collected; a later stage may not write it (use another \
                 buffer)",
                stage.decl.root, stage.reflection.outputs[i].name
            ))
        })?;
        let chain = match placement.chain {
            Some(c) => c,
            None => {
                let (t, v) = r
                    .spare
                    .take(&r.device)
                    .map_err(|e| NativeError::failed(format!("{what}: {e}")))?;
                r.order.add_chain(t, v)
            }
        };
        let point = r.order.next_point(chain);
        r.device
            .dispatch(
                &Dispatch {
                    exe: stage.exe.id(),
                    inputs: &bufs[..ni],
                    params: &params,
                    outputs: &bufs[ni..],
                    workspace: &ws,
                },
                &placement.waits,
                point,
                &Bounds {
                    steps: r.kernel_steps,
                    cancel: r.cancel.as_deref(),
                },
            )
            .map_err(|e| NativeError::failed(format!("{what}: {e}")))?;
        drop(params);
        r.workspace.give(ws, point);
        r.order.record(chain, &reads, &writes);
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
            move |nc, a| execute(nc, a, n),
        );
    }
    m.func(
        "buffer",
        sig(vec![Type::I64], vec![rty("hal.buffer")]),
        20,
        |nc, a| {
            with_runner(nc, "runner.buffer", |r| {
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
        |nc, a| {
            with_runner(nc, "runner.stage_buffer", |r| {
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
        |nc, a| {
            let what = "runner.feedback";
            with_runner(nc, what, |r| {
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
                r.order.record_feedback(b.id());
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
        |nc, a| {
            with_runner(nc, "runner.join", |r| {
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
