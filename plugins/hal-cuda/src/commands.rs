//! Commands: one submission's copies, fills and dispatches, run in order on the device's queue thread; a
//! dispatch launches each kernel of the stage on the stream, synchronises, and reads back the status words
//! (decoded by `hal_queue::status`, shared with `hal-vulkan`). Commands after a failed dispatch do not run.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, MutexGuard};

use cudarc::driver::{CudaSlice, PushKernelArg};
use hal_queue::commands::{byte_range, check_dispatch, copy_ranges, slot};
use hal_queue::lock;
use hal_queue::status::{self, STATUS_WORDS};
use loom_ir::kernel::BufRef;

use crate::buffer::Buf;
use crate::device::{Gpu, cu};
use crate::executable::Exe;

/// A command with its buffers and executable resolved (and so kept alive) when the submission is accepted.
pub(crate) type Cmd = hal_queue::commands::Cmd<Buf, Exe>;

/// A submission's run-time bounds (ABI 1.5 `submit_bounded`): each dispatch's step budget (0: none), written to
/// the status words as each instance's loop allowance, and the cancellation flag, looked at before each
/// dispatch (the emitted kernels also poll status word 9, which this plugin does not write while they run).
#[derive(Debug, Default)]
pub(crate) struct Bounds {
    pub(crate) steps: u64,
    pub(crate) cancel: Option<Arc<AtomicU32>>,
}

pub(crate) fn run_commands(gpu: &Gpu, cmds: Vec<Cmd>, bounds: &Bounds) -> Result<(), String> {
    for c in &cmds {
        match c {
            Cmd::Fill {
                dst,
                offset,
                len,
                byte,
            } => {
                let r = byte_range("fill", dst.len, *offset, *len)?;
                if r.is_empty() {
                    continue;
                }
                let mut mem = lock(&dst.mem);
                let mut view = mem.slice_mut(r.clone());
                if *byte == 0 {
                    gpu.stream.memset_zeros(&mut view).map_err(cu("fill"))?;
                } else {
                    let pattern = vec![*byte; r.len()];
                    gpu.stream
                        .memcpy_htod(&pattern[..], &mut view)
                        .map_err(cu("fill"))?;
                    // The pattern is pageable host memory: finish before it is dropped.
                    gpu.stream.synchronize().map_err(cu("fill"))?;
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
                let (s, d) =
                    copy_ranges((src.len, *src_offset), (dst.len, *dst_offset), *len, same)?;
                if same {
                    if s.is_empty() {
                        continue;
                    }
                    // One buffer: through a temporary (a view and a mutable view of one slice cannot coexist).
                    let mut mem = lock(&src.mem);
                    let mut tmp = gpu.stream.alloc_zeros::<u8>(s.len()).map_err(cu("copy"))?;
                    gpu.stream
                        .memcpy_dtod(&mem.slice(s), &mut tmp)
                        .map_err(cu("copy"))?;
                    gpu.stream
                        .memcpy_dtod(&tmp, &mut mem.slice_mut(d))
                        .map_err(cu("copy"))?;
                } else {
                    if s.is_empty() {
                        continue;
                    }
                    let sm = lock(&src.mem);
                    let mut dm = lock(&dst.mem);
                    gpu.stream
                        .memcpy_dtod(&sm.slice(s), &mut dm.slice_mut(d))
                        .map_err(cu("copy"))?;
                }
            }
            Cmd::Dispatch {
                exe,
                inputs,
                params,
                outputs,
            } => dispatch(gpu, exe, inputs, params, outputs, bounds)?,
        }
    }
    gpu.stream.synchronize().map_err(cu("submission"))?;
    drop(cmds);
    Ok(())
}

fn dispatch(
    gpu: &Gpu,
    exe: &Exe,
    inputs: &[Buf],
    params: &[Buf],
    outputs: &[Buf],
    bounds: &Bounds,
) -> Result<(), String> {
    // The execution contract's buffer checks (counts, then sizes) and the aliasing rule, with `hal-cpu`'s text.
    check_dispatch(&exe.stage, inputs, params, outputs, |b| b.len)?;
    let mut distinct: Vec<&Buf> = Vec::new();
    let in_slots: Vec<usize> = inputs.iter().map(|b| slot(b, &mut distinct)).collect();
    let p_slots: Vec<usize> = params.iter().map(|b| slot(b, &mut distinct)).collect();
    let o_slots: Vec<usize> = outputs.iter().map(|b| slot(b, &mut distinct)).collect();
    // Locked in one global order (by address), so that jobs on two lanes sharing buffers (parameters) never
    // hold them crosswise.
    let mut order: Vec<usize> = (0..distinct.len()).collect();
    order.sort_by_key(|&i| Arc::as_ptr(distinct[i]) as usize);
    let mut locked: Vec<Option<MutexGuard<'_, CudaSlice<u8>>>> =
        (0..distinct.len()).map(|_| None).collect();
    for i in order {
        locked[i] = Some(lock(&distinct[i].mem));
    }
    let guards: Vec<MutexGuard<'_, CudaSlice<u8>>> = locked.into_iter().flatten().collect();
    let ws: Vec<MutexGuard<'_, CudaSlice<u8>>> = exe.workspace.iter().map(|w| lock(w)).collect();
    if bounds
        .cancel
        .as_ref()
        .is_some_and(|c| c.load(Ordering::Relaxed) != 0)
    {
        return Err(status::cancelled(&exe.stage));
    }
    // Zeroed result words, then each dispatch's loop allowance and a clear cancellation word.
    let mut words = vec![0u32; STATUS_WORDS * exe.stage.dispatches.len().max(1)];
    for (di, d) in exe.stage.dispatches.iter().enumerate() {
        let kernel = exe
            .stage
            .kernels
            .get(d.kernel as usize)
            .ok_or_else(|| format!("dispatch {di}: no kernel #{}", d.kernel))?;
        words[STATUS_WORDS * di + status::RESULT_WORDS] =
            status::allowance_word(&exe.stage, kernel, bounds.steps)?;
    }
    let mut status = lock(&exe.status);
    gpu.stream
        .memcpy_htod(&words[..], &mut *status)
        .map_err(cu("status words"))?;
    for (di, d) in exe.stage.dispatches.iter().enumerate() {
        let k = exe
            .kernels
            .get(d.kernel as usize)
            .ok_or_else(|| format!("dispatch {di}: no kernel #{}", d.kernel))?;
        let st = status.slice(STATUS_WORDS * di..STATUS_WORDS * (di + 1));
        let mut launch = gpu.stream.launch_builder(&k.func);
        for arg in &d.args {
            let mem: &CudaSlice<u8> = match *arg {
                BufRef::Input(i) => in_slots.get(i as usize).map(|&s| &*guards[s]),
                BufRef::Param(i) => p_slots.get(i as usize).map(|&s| &*guards[s]),
                BufRef::Output(i) => o_slots.get(i as usize).map(|&s| &*guards[s]),
                BufRef::Workspace(i) => ws.get(i as usize).map(|g| &**g),
            }
            .ok_or_else(|| format!("dispatch {di}: argument {arg:?} does not exist"))?;
            launch.arg(mem);
        }
        launch.arg(&st);
        // SAFETY: the function was compiled from `loom-emit`'s CUDA C for exactly this kernel, whose parameters
        // are one device pointer per kernel parameter, in order, then `unsigned* status`; those are the
        // arguments pushed above. Every buffer was checked against the declared byte size of its parameter
        // (`check_dispatch`; workspace and status were allocated for this stage), and the emitted code bounds-checks
        // every access against those declared shapes, so the kernel touches no memory outside them. The buffers
        // stay locked and alive until the stream is synchronised below.
        unsafe { launch.launch(k.cfg) }
            .map_err(|e| format!("cuda: launch of dispatch {di}: {e}"))?;
    }
    gpu.stream.synchronize().map_err(cu("dispatch"))?;
    let words = gpu
        .stream
        .clone_dtoh(&*status)
        .map_err(cu("status words"))?;
    gpu.stream.synchronize().map_err(cu("status words"))?;
    let blocks = words
        .chunks_exact(STATUS_WORDS)
        .take(exe.stage.dispatches.len())
        .map(|w| std::array::from_fn(|j| w[j]));
    status::check_status_bounded(&exe.stage, blocks, bounds.steps)
}
