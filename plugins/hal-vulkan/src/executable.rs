//! Executables: a stage planned by `loom_emit::wgsl_stage` against the device's requested limits, one compute
//! pipeline per kernel with an explicit all-`read_write` layout, the workspace arena and the status buffer.

use hal_queue::commands::Executable;
use loom_emit::WgslStage;
use loom_ir::kernel::{ExecError, Stage};

use crate::device::Gpu;
use crate::driver::wgsl_limits;

/// Bytes between two dispatches' status words in the status buffer (wgpu's storage offset alignment).
pub(crate) const STATUS_STRIDE: u64 = 256;
/// Bytes of one dispatch's status words (10 x u32, see `loom-emit`).
pub(crate) const STATUS_BYTES: u64 = 40;

#[derive(Debug)]
pub(crate) struct Exe {
    pub(crate) stage: Stage,
    pub(crate) plan: WgslStage,
    pub(crate) layouts: Vec<wgpu::BindGroupLayout>,
    pub(crate) pipelines: Vec<wgpu::ComputePipeline>,
    /// The workspace arena (the stage's workspace buffers in the submission are only checked to exist).
    pub(crate) arena: wgpu::Buffer,
    /// One 40-byte status block per dispatch, [`STATUS_STRIDE`] apart.
    pub(crate) status: wgpu::Buffer,
    /// Held by the job dispatching it, from writing its status words to reading them back: the arena and the
    /// status words are the executable's, and the queue runs jobs of different timelines side by side.
    pub(crate) busy: std::sync::Mutex<()>,
}

impl Executable for Exe {
    fn stage_name(&self) -> &str {
        &self.stage.name
    }
    fn workspace_len(&self) -> usize {
        self.stage.workspace.len()
    }
}

pub(crate) fn compile_stage(gpu: &Gpu, stage: Stage) -> Result<Exe, String> {
    let unsupported = |message: String| {
        ExecError::Unsupported {
            kernel: stage.name.clone(),
            backend: "vulkan".into(),
            message,
        }
        .to_string()
    };
    let plan = loom_emit::wgsl_stage(&stage, &wgsl_limits(&gpu.limits))
        .map_err(|e| unsupported(e.to_string()))?;
    let mut layouts = Vec::with_capacity(plan.modules.len());
    let mut pipelines = Vec::with_capacity(plan.modules.len());
    for m in &plan.modules {
        let entries: Vec<wgpu::BindGroupLayoutEntry> = (0..m.bindings)
            .map(|binding| wgpu::BindGroupLayoutEntry {
                binding,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: wgpu::BufferBindingType::Storage { read_only: false },
                    has_dynamic_offset: false,
                    min_binding_size: None,
                },
                count: None,
            })
            .collect();
        let what = format!("vulkan pipeline for kernel `{}`", m.name);
        let (layout, pipeline) = gpu
            .scoped(&what, || {
                let layout =
                    gpu.device
                        .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                            label: None,
                            entries: &entries,
                        });
                let pl = gpu
                    .device
                    .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                        label: None,
                        bind_group_layouts: &[Some(&layout)],
                        immediate_size: 0,
                    });
                let module = gpu
                    .device
                    .create_shader_module(wgpu::ShaderModuleDescriptor {
                        label: Some(&m.name),
                        source: wgpu::ShaderSource::Wgsl(m.source.as_str().into()),
                    });
                let pipeline =
                    gpu.device
                        .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                            label: Some(&m.name),
                            layout: Some(&pl),
                            module: &module,
                            entry_point: Some(&m.entry_point),
                            compilation_options: wgpu::PipelineCompilationOptions::default(),
                            cache: None,
                        });
                (layout, pipeline)
            })
            .map_err(unsupported)?;
        layouts.push(layout);
        pipelines.push(pipeline);
    }
    let storage =
        wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
    let arena = gpu
        .create_buffer(plan.arena_bytes, storage)
        .map_err(|e| unsupported(format!("workspace arena: {e}")))?;
    let status = gpu
        .create_buffer(STATUS_STRIDE * plan.dispatches.len().max(1) as u64, storage)
        .map_err(|e| unsupported(format!("status buffer: {e}")))?;
    Ok(Exe {
        stage,
        plan,
        layouts,
        pipelines,
        arena,
        status,
        busy: std::sync::Mutex::new(()),
    })
}
