//! Commands: one submission's copies, fills and dispatches, run in order on the device's queue thread. Copies
//! and fills are recorded into one command encoder; a dispatch records one compute pass per kernel of the stage,
//! then the submission is flushed and the dispatch's status words are read back and decoded
//! (`hal_queue::status`); commands after a failed dispatch do not run.

use std::num::NonZeroU64;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use hal_queue::commands::{byte_range, check_dispatch, copy_ranges};
use hal_queue::status::{self, STATUS_WORDS};
use loom_emit::WgslBuffer;
use loom_ir::kernel::BufRef;

use crate::buffer::{Buf, aligned};
use crate::device::Gpu;
use crate::executable::{Exe, STATUS_BYTES, STATUS_STRIDE};

/// A command with its buffers and executable resolved (and so kept alive) when the submission is accepted.
pub(crate) type Cmd = hal_queue::commands::Cmd<Buf, Exe>;

/// A submission's run-time bounds (ABI 1.5 `submit_bounded`): each dispatch's step budget (0: none), written
/// to the status words as each instance's loop allowance, and the cancellation flag, looked at before each
/// dispatch (a running wgpu dispatch cannot see a host write).
#[derive(Debug, Default)]
pub(crate) struct Bounds {
    pub(crate) steps: u64,
    pub(crate) cancel: Option<Arc<AtomicU32>>,
}

fn flush(gpu: &Gpu, enc: &mut Option<wgpu::CommandEncoder>) -> Result<(), String> {
    match enc.take() {
        Some(e) => gpu.flush(e),
        None => Ok(()),
    }
}

/// Runs one submission's commands in order on the queue thread (dropping them, and with them the last
/// references to freed buffers, before returning).
pub(crate) fn run_commands(gpu: &Gpu, cmds: Vec<Cmd>, bounds: &Bounds) -> Result<(), String> {
    let mut enc: Option<wgpu::CommandEncoder> = None;
    // Staging buffers live until the encoder that uses them is flushed.
    let mut temps: Vec<wgpu::Buffer> = Vec::new();
    for c in &cmds {
        match c {
            Cmd::Fill {
                dst,
                offset,
                len,
                byte,
            } => {
                byte_range("fill", dst.len, *offset, *len)?;
                if *len == 0 {
                    continue;
                }
                if aligned(*offset) && aligned(*len) {
                    let e = enc.get_or_insert_with(|| gpu.encoder());
                    if *byte == 0 {
                        e.clear_buffer(&dst.buffer, *offset, Some(*len));
                    } else {
                        let tmp = gpu.init_buffer(&vec![*byte; *len as usize])?;
                        e.copy_buffer_to_buffer(&tmp, 0, &dst.buffer, *offset, *len);
                        temps.push(tmp);
                    }
                } else {
                    flush(gpu, &mut enc)?;
                    gpu.write(dst, *offset, &vec![*byte; *len as usize])
                        .map_err(|e| format!("fill: {e}"))?;
                }
            }
            Cmd::Copy {
                src,
                src_offset,
                dst,
                dst_offset,
                len,
            } => {
                let same = Arc::ptr_eq(src, dst);
                copy_ranges((src.len, *src_offset), (dst.len, *dst_offset), *len, same)?;
                if *len == 0 {
                    continue;
                }
                if aligned(*src_offset) && aligned(*dst_offset) && aligned(*len) {
                    let e = enc.get_or_insert_with(|| gpu.encoder());
                    if same {
                        // WebGPU forbids a copy within one buffer: go through a temporary.
                        let tmp = gpu.create_buffer(
                            *len,
                            wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
                        )?;
                        e.copy_buffer_to_buffer(&src.buffer, *src_offset, &tmp, 0, *len);
                        e.copy_buffer_to_buffer(&tmp, 0, &dst.buffer, *dst_offset, *len);
                        temps.push(tmp);
                    } else {
                        e.copy_buffer_to_buffer(
                            &src.buffer,
                            *src_offset,
                            &dst.buffer,
                            *dst_offset,
                            *len,
                        );
                    }
                } else {
                    flush(gpu, &mut enc)?;
                    let data = gpu.read(src, *src_offset, *len)?;
                    gpu.write(dst, *dst_offset, &data)?;
                }
            }
            Cmd::Dispatch {
                exe,
                inputs,
                params,
                outputs,
            } => {
                // The contract's buffer checks (counts, then sizes) and the aliasing rule, with `hal-cpu`'s text.
                check_dispatch(&exe.stage, inputs, params, outputs, |b| b.len)?;
                if bounds
                    .cancel
                    .as_ref()
                    .is_some_and(|c| c.load(Ordering::Relaxed) != 0)
                {
                    return Err(status::cancelled(&exe.stage));
                }
                // Earlier copies and fills first: the status words are written through the queue.
                flush(gpu, &mut enc)?;
                temps.clear();
                let _busy = hal_queue::lock(&exe.busy);
                write_status(gpu, exe, bounds.steps)?;
                let e = enc.get_or_insert_with(|| gpu.encoder());
                record_dispatch(gpu, e, exe, inputs, params, outputs)?;
                flush(gpu, &mut enc)?;
                check_status(gpu, exe, bounds.steps)?;
            }
        }
    }
    flush(gpu, &mut enc)?;
    drop(temps);
    drop(cmds);
    Ok(())
}

fn record_dispatch(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    exe: &Exe,
    inputs: &[Buf],
    params: &[Buf],
    outputs: &[Buf],
) -> Result<(), String> {
    for (di, d) in exe.plan.dispatches.iter().enumerate() {
        let mut entries = Vec::with_capacity(d.bindings.len());
        for b in &d.bindings {
            let (buffer, offset, size) = match b.buffer {
                WgslBuffer::Stage(r) => {
                    let (list, i) = match r {
                        BufRef::Input(i) => (inputs, i),
                        BufRef::Param(i) => (params, i),
                        BufRef::Output(i) => (outputs, i),
                        BufRef::Workspace(i) => {
                            return Err(format!("vulkan: workspace {i} bound as a stage buffer"));
                        }
                    };
                    let buf = list
                        .get(i as usize)
                        .ok_or_else(|| format!("vulkan: no buffer for {r:?}"))?;
                    (&buf.buffer, 0, None)
                }
                WgslBuffer::Arena { offset, size } => (&exe.arena, offset, NonZeroU64::new(size)),
                WgslBuffer::Status => (
                    &exe.status,
                    STATUS_STRIDE * di as u64,
                    NonZeroU64::new(STATUS_BYTES),
                ),
            };
            entries.push(wgpu::BindGroupEntry {
                binding: b.binding,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer,
                    offset,
                    size,
                }),
            });
        }
        let k = d.kernel as usize;
        let bg = gpu.scoped(&format!("dispatch {di} of `{}`", exe.stage.name), || {
            gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: None,
                layout: &exe.layouts[k],
                entries: &entries,
            })
        })?;
        // One pass per kernel: every dispatch of the stage sees the previous one's writes.
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: None,
            timestamp_writes: None,
        });
        pass.set_pipeline(&exe.pipelines[k]);
        pass.set_bind_group(0, &bg, &[]);
        pass.dispatch_workgroups(d.grid[0], d.grid[1], d.grid[2]);
    }
    Ok(())
}

/// Zeroes every dispatch's result words and writes its loop allowance (`steps`, 0: none) and a clear
/// cancellation word; refuses a dispatch whose grid alone is over the budget.
fn write_status(gpu: &Gpu, exe: &Exe, steps: u64) -> Result<(), String> {
    for (di, d) in exe.plan.dispatches.iter().enumerate() {
        let kernel = exe
            .stage
            .kernels
            .get(d.kernel as usize)
            .ok_or_else(|| format!("vulkan: dispatch {di} names no kernel"))?;
        let mut words = [0u32; STATUS_WORDS];
        words[status::RESULT_WORDS] = status::allowance_word(&exe.stage, kernel, steps)?;
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        gpu.queue
            .write_buffer(&exe.status, STATUS_STRIDE * di as u64, &bytes);
    }
    Ok(())
}

/// Reads back every dispatch's status words; the first dispatch (in stage order) that reported an error gives
/// the submission's error.
fn check_status(gpu: &Gpu, exe: &Exe, steps: u64) -> Result<(), String> {
    let n = exe.plan.dispatches.len() as u64;
    if n == 0 {
        return Ok(());
    }
    let staging = gpu.create_buffer(
        STATUS_STRIDE * n,
        wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
    )?;
    let mut enc = gpu.encoder();
    enc.copy_buffer_to_buffer(&exe.status, 0, &staging, 0, STATUS_STRIDE * n);
    gpu.flush(enc)?;
    let bytes = gpu.map_read(&staging, 0, STATUS_STRIDE * n)?;
    let blocks = (0..n as usize).map(|di| status::words_le(&bytes, di * STATUS_STRIDE as usize));
    status::check_status_bounded(&exe.stage, blocks, steps)
}

const _: () = assert!(STATUS_BYTES == 4 * STATUS_WORDS as u64);
