//! A device: its context and stream ([`Gpu`]), its buffers and executables by id, its queue thread
//! (`hal_queue`), and the `HalDevice` calls.

use std::sync::{Arc, Mutex, MutexGuard};

use abi_stable::std_types::{RBoxError, RResult, RSlice, RString, RVec};
use cudarc::driver::{CudaContext, CudaStream, DriverError};
use hal_queue::commands::Objects;
use hal_queue::{Queue, lock};
use loom_ir::kernel_codec;
use loom_plugin_api::{
    BufferId, CancelId, DeviceLimits, DispatchBounds, ExecutableId, HalControl, HalDevice,
    Submission, TimelineId, TimelinePoint, WaitStatus, guard,
};
use std::sync::atomic::AtomicU32;

use crate::MAX_BUFFER_BYTES;
use crate::buffer::{Buf, CuBuf};
use crate::commands::{Bounds, Cmd, run_commands};
use crate::driver::arch_name;
use crate::executable::{Exe, compile_stage};

/// A CUDA driver error as `cuda: {what}: {error}`.
pub(crate) fn cu(what: &str) -> impl Fn(DriverError) -> String + '_ {
    move |e| format!("cuda: {what}: {e}")
}

#[derive(Debug)]
pub(crate) struct Gpu {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) arch: &'static str,
}

#[derive(Debug, Default)]
struct State {
    objects: Objects<Buf, Exe>,
    /// Cancellation flags by id (ABI 1.5); jobs hold their own `Arc`.
    cancels: std::collections::HashMap<u64, Arc<AtomicU32>>,
}

#[derive(Debug)]
pub(crate) struct CudaCore {
    gpu: Arc<Gpu>,
    sms: u32,
    state: Mutex<State>,
    queue: Queue<(Vec<Cmd>, Bounds)>,
}

/// A device handle: its `HalDevice` and `HalControl` share the core.
#[derive(Clone, Debug)]
pub(crate) struct CudaDev(Arc<CudaCore>);

impl std::ops::Deref for CudaDev {
    type Target = CudaCore;
    fn deref(&self) -> &CudaCore {
        &self.0
    }
}

/// Lanes of a device's queue (jobs of different timelines run side by side on them).
const QUEUE_LANES: usize = 4;

impl CudaDev {
    pub(crate) fn open(ordinal: usize) -> Result<CudaDev, String> {
        let ctx = CudaContext::new(ordinal).map_err(cu("open"))?;
        let (major, minor) = ctx.compute_capability().map_err(cu("compute capability"))?;
        let sms = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_or(1, |n| n.max(1) as u32);
        let stream = ctx.new_stream().map_err(cu("stream"))?;
        let gpu = Arc::new(Gpu {
            ctx,
            stream,
            arch: arch_name(major, minor),
        });
        let g = Arc::clone(&gpu);
        // Lanes: another timeline's job is launched while one waits on its stream (a job locks its buffers, its
        // executable's workspace and status words, so concurrent jobs never share them).
        let queue = Queue::with_lanes(
            "hal-cuda-queue",
            QUEUE_LANES,
            move |(cmds, bounds): (Vec<Cmd>, Bounds)| run_commands(&g, cmds, &bounds),
        );
        Ok(CudaDev(Arc::new(CudaCore {
            gpu,
            sms,
            state: Mutex::new(State::default()),
            queue,
        })))
    }

    /// `submit`, with `bounds` (ABI 1.5 `submit_bounded`) when given.
    fn submit_with(
        &self,
        submission: Submission,
        bounds: Option<DispatchBounds>,
    ) -> Result<(), String> {
        // The executable has its own workspace: the submission's are only checked to exist.
        self.queue
            .submit_checked(&submission.wait, submission.signal, || {
                let st = self.state();
                let bounds = match bounds {
                    None => Bounds::default(),
                    Some(b) => Bounds {
                        steps: b.steps,
                        cancel: match b.cancel.0 {
                            0 => None,
                            id => Some(st.cancels.get(&id).cloned().ok_or_else(|| {
                                format!("submit: unknown cancellation flag {id}")
                            })?),
                        },
                    },
                };
                Ok((st.objects.resolve(&submission.commands)?, bounds))
            })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }
}

impl HalControl for CudaDev {
    fn release(&self, exe: ExecutableId) -> RResult<(), RBoxError> {
        guard("release", || self.state().objects.release_executable(exe))
    }

    fn cancel_create(&self) -> RResult<CancelId, RBoxError> {
        guard("cancel_create", || {
            let mut st = self.state();
            let id = st.objects.next_id();
            st.cancels.insert(id, Arc::new(AtomicU32::new(0)));
            Ok::<_, String>(CancelId(id))
        })
    }

    fn cancel_signal(&self, cancel: CancelId) -> RResult<(), RBoxError> {
        guard("cancel_signal", || {
            let st = self.state();
            let flag = st
                .cancels
                .get(&cancel.0)
                .ok_or_else(|| format!("cancel_signal: unknown cancellation flag {}", cancel.0))?;
            flag.store(1, std::sync::atomic::Ordering::Relaxed);
            Ok::<_, String>(())
        })
    }

    fn cancel_destroy(&self, cancel: CancelId) -> RResult<(), RBoxError> {
        guard("cancel_destroy", || {
            self.state()
                .cancels
                .remove(&cancel.0)
                .map(|_| ())
                .ok_or_else(|| format!("cancel_destroy: unknown cancellation flag {}", cancel.0))
        })
    }

    fn submit_bounded(
        &self,
        submission: Submission,
        bounds: DispatchBounds,
    ) -> RResult<(), RBoxError> {
        guard("submit_bounded", || {
            self.submit_with(submission, Some(bounds))
        })
    }

    fn timeline_fail(&self, point: TimelinePoint, message: RString) -> RResult<(), RBoxError> {
        guard("timeline_fail", || {
            self.queue.timeline_fail(point, message.into_string())
        })
    }
}

impl HalDevice for CudaDev {
    fn limits(&self) -> DeviceLimits {
        DeviceLimits {
            max_buffer_bytes: MAX_BUFFER_BYTES,
            max_stage_bytes: kernel_codec::MAX_STAGE_BYTES as u64,
            parallelism: self.sms,
        }
    }

    fn alloc(&self, bytes: u64) -> RResult<BufferId, RBoxError> {
        guard("alloc", || {
            if bytes > MAX_BUFFER_BYTES {
                return Err(format!(
                    "alloc: {bytes} bytes is over the limit of {MAX_BUFFER_BYTES}"
                ));
            }
            let mem = self
                .gpu
                .stream
                .alloc_zeros::<u8>(bytes.max(1) as usize)
                .map_err(|e| format!("alloc of {bytes} bytes: {e}"))?;
            self.gpu.stream.synchronize().map_err(cu("alloc"))?;
            Ok(self.state().objects.add_buffer(Arc::new(CuBuf {
                mem: Mutex::new(mem),
                len: bytes,
            })))
        })
    }

    fn free(&self, buffer: BufferId) -> RResult<(), RBoxError> {
        guard("free", || self.state().objects.free(buffer))
    }

    fn write(&self, buffer: BufferId, offset: u64, data: RSlice<'_, u8>) -> RResult<(), RBoxError> {
        guard("write", || {
            let b = self.state().objects.buffer(buffer)?;
            self.gpu.write(&b, offset, data.as_slice())
        })
    }

    fn read(&self, buffer: BufferId, offset: u64, len: u64) -> RResult<RVec<u8>, RBoxError> {
        guard("read", || {
            let b = self.state().objects.buffer(buffer)?;
            self.gpu.read(&b, offset, len).map(RVec::from)
        })
    }

    fn compile(&self, stage: RSlice<'_, u8>) -> RResult<ExecutableId, RBoxError> {
        guard("compile", || {
            let stage = kernel_codec::decode_stage(stage.as_slice()).map_err(|e| e.to_string())?;
            let exe = compile_stage(&self.gpu, stage)?;
            Ok::<_, String>(self.state().objects.add_executable(exe))
        })
    }

    fn submit(&self, submission: Submission) -> RResult<(), RBoxError> {
        guard("submit", || self.submit_with(submission, None))
    }

    fn timeline_create(&self) -> RResult<TimelineId, RBoxError> {
        guard("timeline_create", || {
            Ok::<_, String>(self.queue.timeline_create())
        })
    }

    fn timeline_value(&self, timeline: TimelineId) -> RResult<u64, RBoxError> {
        guard("timeline_value", || self.queue.timeline_value(timeline))
    }

    fn timeline_signal(&self, point: TimelinePoint) -> RResult<(), RBoxError> {
        guard("timeline_signal", || self.queue.timeline_signal(point))
    }

    fn timeline_wait(
        &self,
        point: TimelinePoint,
        timeout_ns: u64,
    ) -> RResult<WaitStatus, RBoxError> {
        guard("timeline_wait", || {
            self.queue.timeline_wait(point, timeout_ns)
        })
    }
}
