//! `parameters`: demand reads of checkpoint byte ranges into device buffers (see [`crate::device::gather`]).

use super::{arg_i64, device_buffer, point_of, rty, sig, with_runner};
use crate::device::TimelinePoint;
use crate::device::gather::{DESCRIPTOR_BYTES, Job, MAX_DESCRIPTORS};
use loom_ir::Type;
use loom_vm::{NativeError, NativeModule, Value};
use std::sync::Arc;

/// `parameters`: demand reads of checkpoint byte ranges (see [`crate::device::gather`]).
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
        |nc, a| {
            let what = "parameters.gather";
            with_runner(nc, what, |r| {
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
                if r.readonly.contains(&target.id()) || r.readonly.contains(&descriptors.id()) {
                    return Err(NativeError::failed(format!(
                        "{what}: the upstream model's result is read by stages only (not a gather's descriptors or \
                         target)"
                    )));
                }
                if !Arc::ptr_eq(descriptors.device(), r.gather.device())
                    || !Arc::ptr_eq(target.device(), r.gather.device())
                {
                    return Err(NativeError::failed(format!(
                        "{what}: buffers must live on the model's device"
                    )));
                }
                // The gather reads its descriptors when `wait` is reached: the work of this invocation that
                // wrote them must be behind it (it is the default wait).
                let wait = match (wait, r.order.writer(descriptors.id())) {
                    (None, w) => w,
                    (Some(f), Some(w)) if !(f.timeline == w.timeline && f.value >= w.value) => {
                        return Err(NativeError::failed(format!(
                            "{what}: the descriptors are written by work of this invocation that the fence given \
                             does not follow (pass that work's fence, or null)"
                        )));
                    }
                    (Some(f), _) => Some(f),
                };
                let target_id = target.id();
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
                            timeline: r.order.first_timeline(),
                            value: 0,
                        },
                    })
                    .map_err(|m| NativeError::failed(format!("{what}: {m}")))?;
                r.order.record_gather(target_id, wait, point);
                r.gathers.push(point);
                Ok(vec![Value::native("hal.fence", point)])
            })
        },
    )
}
