//! A device: the wgpu device and queue ([`Gpu`]: error scopes, flushing), its buffers and executables by id,
//! its compute queue and transfer queue (`hal_queue`), and the `HalDevice` calls.

use std::sync::{Arc, Mutex, MutexGuard};

use abi_stable::std_types::{RBoxError, RResult, RSlice, RString, RVec};
use hal_queue::commands::Objects;
use hal_queue::files::{FileTable, QueuedRead};
use hal_queue::{Queue, lock};
use loom_ir::kernel_codec;
use loom_plugin_api::{
    BufferId, CancelId, DeviceLimits, DispatchBounds, ExecutableId, HalControl, HalDevice,
    Submission, TimelineId, TimelinePoint, WaitStatus, guard,
};
use std::sync::atomic::AtomicU32;

use crate::buffer::{Buf, VkBuf};
use crate::commands::{Bounds, Cmd, run_commands};
use crate::driver::{LimitsProfile, adapter_name};
use crate::executable::{Exe, compile_stage};
use crate::files::run_reads;

#[derive(Debug)]
pub(crate) struct Gpu {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub(crate) limits: wgpu::Limits,
}

impl Gpu {
    /// Runs `f` inside validation and out-of-memory error scopes: a wgpu error becomes `Err("{what}: ...")`.
    pub(crate) fn scoped<T>(&self, what: &str, f: impl FnOnce() -> T) -> Result<T, String> {
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let val = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let r = f();
        let e1 = pollster::block_on(val.pop());
        let e2 = pollster::block_on(oom.pop());
        match e1.or(e2) {
            Some(e) => Err(format!("{what}: {e}")),
            None => Ok(r),
        }
    }

    pub(crate) fn encoder(&self) -> wgpu::CommandEncoder {
        self.device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("loom"),
            })
    }

    pub(crate) fn wait(&self, index: wgpu::SubmissionIndex) -> Result<(), String> {
        self.device
            .poll(wgpu::PollType::Wait {
                submission_index: Some(index),
                timeout: None,
            })
            .map(|_| ())
            .map_err(|e| format!("vulkan: waiting for the queue: {e}"))
    }

    /// Finishes and submits `enc` and waits until the GPU has executed it.
    pub(crate) fn flush(&self, enc: wgpu::CommandEncoder) -> Result<(), String> {
        let idx = self.scoped("vulkan submission", || self.queue.submit([enc.finish()]))?;
        self.wait(idx)
    }
}

#[derive(Debug, Default)]
pub(crate) struct State {
    pub(crate) objects: Objects<Buf, Exe>,
    pub(crate) files: FileTable,
    /// Cancellation flags by id (ABI 1.5); jobs hold their own `Arc`.
    pub(crate) cancels: std::collections::HashMap<u64, Arc<AtomicU32>>,
}

/// Lanes of a device's compute queue (jobs of different timelines run side by side on them).
const QUEUE_LANES: usize = 4;

#[derive(Debug)]
pub(crate) struct Core {
    pub(crate) gpu: Arc<Gpu>,
    name: String,
    state: Mutex<State>,
    queue: Queue<(Vec<Cmd>, Bounds)>,
    /// File reads: ordered among themselves, against `queue` only by timeline points (the same timelines).
    pub(crate) transfer: Queue<Vec<QueuedRead<Buf>>>,
}

/// A device: the `HalDevice` and the `HalFiles` of one `hal_files` call share it.
#[derive(Clone, Debug)]
pub(crate) struct VkDevice(Arc<Core>);

impl std::ops::Deref for VkDevice {
    type Target = Core;
    fn deref(&self) -> &Core {
        &self.0
    }
}

impl VkDevice {
    pub(crate) fn open(
        adapter: &wgpu::Adapter,
        profile: LimitsProfile,
    ) -> Result<VkDevice, String> {
        let limits = profile.limits();
        let name = adapter_name(adapter);
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("loom"),
            required_features: wgpu::Features::empty(),
            required_limits: limits.clone(),
            ..Default::default()
        }))
        .map_err(|e| format!("open {name} with {profile:?} limits: {e}"))?;
        // Errors are caught by error scopes; anything that escapes one must not reach wgpu's panicking default.
        device.on_uncaptured_error(Arc::new(|e: wgpu::Error| {
            eprintln!("hal-vulkan: uncaptured wgpu error: {e}");
        }));
        let gpu = Arc::new(Gpu {
            device,
            queue,
            limits,
        });
        let g = Arc::clone(&gpu);
        // Lanes: another timeline's job is encoded and submitted while one waits for the device (an
        // executable's arena and status words are held by one job at a time).
        let queue = Queue::with_lanes(
            "hal-vulkan-queue",
            QUEUE_LANES,
            move |(cmds, bounds): (Vec<Cmd>, Bounds)| run_commands(&g, cmds, &bounds),
        );
        let g = Arc::clone(&gpu);
        let transfer = queue.sibling("hal-vulkan-transfer", move |reads| run_reads(&g, reads));
        Ok(VkDevice(Arc::new(Core {
            gpu,
            name,
            state: Mutex::new(State::default()),
            queue,
            transfer,
        })))
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }
}

impl VkDevice {
    /// `submit`, with `bounds` (ABI 1.5 `submit_bounded`) when given.
    fn submit_with(
        &self,
        submission: Submission,
        bounds: Option<DispatchBounds>,
    ) -> Result<(), String> {
        // The device uses the executable's own arena: workspace buffers are only checked to exist.
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
}

impl HalControl for VkDevice {
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

impl HalDevice for VkDevice {
    fn limits(&self) -> DeviceLimits {
        DeviceLimits {
            max_buffer_bytes: self.gpu.limits.max_buffer_size,
            max_stage_bytes: kernel_codec::MAX_STAGE_BYTES as u64,
            parallelism: 1,
        }
    }

    fn alloc(&self, bytes: u64) -> RResult<BufferId, RBoxError> {
        guard("alloc", || {
            let size = bytes.div_ceil(4) * 4;
            let buffer = self
                .gpu
                .create_buffer(
                    size,
                    wgpu::BufferUsages::STORAGE
                        | wgpu::BufferUsages::COPY_SRC
                        | wgpu::BufferUsages::COPY_DST,
                )
                .map_err(|e| format!("alloc of {bytes} bytes on {}: {e}", self.name))?;
            Ok::<_, String>(
                self.state()
                    .objects
                    .add_buffer(Arc::new(VkBuf { buffer, len: bytes })),
            )
        })
    }

    fn free(&self, buffer: BufferId) -> RResult<(), RBoxError> {
        // The wgpu buffer is reference counted: queued submissions keep it until they retire.
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
