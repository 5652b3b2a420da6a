//! A device: its context and stream ([`Gpu`]), its buffers and executables by id, its queue thread
//! (`hal_queue`), and the `HalDevice` calls.

use std::sync::{Arc, Mutex, MutexGuard};

use abi_stable::std_types::{RBoxError, RResult, RSlice, RVec};
use cudarc::driver::{CudaContext, CudaStream, DriverError};
use hal_queue::commands::Objects;
use hal_queue::{Queue, lock};
use loom_ir::kernel_codec;
use loom_plugin_api::{
    BufferId, DeviceLimits, ExecutableId, HalDevice, Submission, TimelineId, TimelinePoint,
    WaitStatus, guard,
};

use crate::MAX_BUFFER_BYTES;
use crate::buffer::{Buf, CuBuf};
use crate::commands::{Cmd, run_commands};
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
}

#[derive(Debug)]
pub(crate) struct CudaDev {
    gpu: Arc<Gpu>,
    sms: u32,
    state: Mutex<State>,
    queue: Queue<Vec<Cmd>>,
}

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
        let queue = Queue::new("hal-cuda-queue", move |cmds| run_commands(&g, cmds));
        Ok(CudaDev {
            gpu,
            sms,
            state: Mutex::new(State::default()),
            queue,
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
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
        guard("submit", || {
            // The executable has its own workspace: the submission's are only checked to exist.
            self.queue
                .submit_checked(&submission.wait, submission.signal, || {
                    self.state().objects.resolve(&submission.commands)
                })
        })
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
