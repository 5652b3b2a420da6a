//! `loom-emit`: device code for Loom kernels (`loom_ir::kernel`) as **WGSL** (Vulkan via wgpu, every module
//! validated by naga) and **CUDA C** (compiled by NVRTC: by `hal-cuda` on a GPU, and in CI without one). The
//! semantics reproduced are those of `docs/loom/kernels.md` as executed by `loom-reference`; where a device
//! cannot match them exactly the divergence is listed below.
//!
//! # API
//!
//! * [`wgsl_kernel`]: one specialized kernel -> a [`WgslModule`] (WGSL text, entry point, workgroup size,
//!   grid, bindings), validated by naga before it is returned.
//! * [`wgsl_stage`]: a stage -> a [`WgslStage`] binding plan: one module per kernel, the workspace laid out as
//!   one arena buffer with 256-byte aligned offsets, and for every dispatch which buffer (or arena range) each
//!   `@binding` takes, within [`WgslLimits::max_storage_buffers_per_shader_stage`].
//! * [`cuda_kernel`]: one specialized kernel -> a [`CudaModule`] (one `extern "C" __global__` function).
//!
//! Both are pure functions of the IR; no IR input makes them panic: malformed IR is [`Error::Malformed`],
//! what a target cannot express (yet) is [`Error::Unsupported`], and WGSL that naga rejects (a bug of this
//! crate) is [`Error::Invalid`].
//!
//! # Thread mapping
//!
//! One **workgroup (CTA) per program instance**: `workgroup_id` / `blockIdx` is `program_id`, and the grid is
//! the kernel's grid. A workgroup has `WG` invocations (`@workgroup_size(WG)` / `blockDim.x`): 64, or 128 when
//! some tile of the kernel has 1024 elements or more (clamped to the limits). Within it:
//!
//! * **Scalars** are computed redundantly by every invocation, so they are uniform by construction.
//! * **Tiles** are distributed cyclically over the flat row-major element index: element `e` of a tile lives in
//!   invocation `e % WG`, in slot `e / WG` of a private array of `ceil(n / WG)` registers. Two tiles of the same
//!   element count are distributed identically, so every elementwise op, `expand_dims` and `reshape` (which keep
//!   row-major order) is purely local.
//! * Ops that read elements other invocations own go through **workgroup scratch** (`var<workgroup>` /
//!   `__shared__`), between barriers, in chunks of the scratch size: `broadcast`, `transpose` and the index tiles
//!   of loads and stores are *gathers* (stage a chunk of the source, every invocation picks what it needs);
//!   `tile.sum/max/min` stage slabs of `L` positions along the reduced axis for a chunk of result elements
//!   and fold them in index order; `tile.dot` is a **workgroup-memory tiled loop** over K in chunks of
//!   `KC = scratch / (M + N)`: stage `a[:, k0..k0+KC]` and `b[k0..k0+KC, :]`, barrier, every invocation
//!   accumulates its own output elements in f32. Gathers from a tile known to be a `tile.range` or `tile.full`
//!   recompute the element instead (no barrier), which covers the usual `%x[%rm, %rk]` indexing.
//! * **Control flow** (`for`, `if`) runs in every invocation with the same (uniform) condition. In WGSL the
//!   condition is passed through `workgroupUniformLoad`, because WGSL's uniformity analysis treats
//!   function-scope variables and `read_write` storage as non-uniform even when every invocation computed the
//!   same value, and barriers inside the region must be in uniform control flow.
//!
//! # Memory layout
//!
//! WGSL: every kernel parameter `p` is `@group(0) @binding(p) var<storage, read_write> bP: array<u32>` — raw
//! little-endian words, so one declaration serves every dtype and any range of the arena: f32/i32/u32 are
//! bitcast, i64 is two words, f16 is converted with integer ops (`unpack2x16float` needs naga's
//! `SHADER_FLOAT16_IN_FLOAT32`, which the default capabilities and downlevel GL lack), bf16 by shifting into the high half,
//! narrow integers by shift and mask, and q8_0/q4_0/q4_1/q4_k/q6_k blocks are dequantised in-shader from their
//! bytes with ggml's operations (q4_k's packed 6-bit scales and mins as in `get_scale_min_k4`). Sub-word
//! buffers that are written are `array<atomic<u32>>` and a store is an `atomicAnd` + `atomicOr` of the
//! element's bits, so neighbouring invocations never lose each other's writes.
//! Every binding is `read_write` because a dispatch may bind two ranges of the one workspace arena, and wgpu
//! tracks usage per buffer (a read-only and a writable binding of one buffer conflict). Binding
//! `params.len()` is the status buffer (10 atomic words: 8 result words zeroed by the host before a dispatch,
//! then the two run-time bound words it writes, see below). Buffers bound
//! to a kernel must be rounded up to whole words (the arena plan does this).
//!
//! CUDA: parameters are typed pointers (`const float* __restrict__`, `unsigned short*` for f16/bf16, ...) in
//! order, then `unsigned* status`; quantised buffers are `const unsigned char*`, and a load dequantises the
//! element from its block's bytes with the WGSL readers' structure and ggml's f32 operations in ggml's order;
//! where a product feeds a sum (q4_1, q4_k) they are written `__fmul_rn` / `__fadd_rn` / `__fsub_rn`, so NVRTC
//! cannot contract them into an fma and the values are bit-identical to `loom_reference::dequantize`. Scratch is
//! 4096 8-byte words of static shared memory (32 KiB), declared only by kernels that stage through it. The text
//! includes no header (NVRTC's built-ins only).
//!
//! # Bounds checks and errors
//!
//! Every load and store computes, per element, an in-range flag and the flat element offset (only in-range
//! indices contribute, so the offset of an out-of-range element is never formed from it). Masked loads read
//! the fill, stores skip, checked loads (`fill: None`) report an error and read nothing. Errors go to the
//! status buffer: word 0 counts them (`atomicAdd`); the first one also records code, two details, a value
//! and the program id (CUDA: `atomicExch`):
//!
//! | code | meaning | details |
//! |---|---|---|
//! | 1 | checked load out of range | parameter, dimension, index |
//! | 2 | integer division or remainder by zero | the op's source line, column |
//! | 3 | loop step <= 0 (the loop does not run) | the op's source line, column, the step (as i32) |
//! | 4 | (WGSL) an i64 buffer element outside the i32 range | parameter, -, element |
//! | 5 | the instance used up its loop-iteration allowance (word 8) | the loop's source line, column |
//! | 6 | the dispatch was cancelled (word 9 set) | the loop's source line, column |
//!
//! # Run-time bounds (issue 14)
//!
//! Status word 8 is the **allowance** of each program instance: the iterations of kernel `for` loops it may
//! run in all (`loom_ir::kernel::instance_allowance` of the dispatch's step budget and grid, at most
//! `u32::MAX`, which is also "no budget"); word 9 is the **cancellation word**. Both are written by the host
//! before the dispatch. Every instance counts its loop iterations in a register (`loom_steps`, the same in
//! every invocation of a workgroup, as loop control is uniform); the loop head decides, once per iteration and
//! uniformly (through `wg_flag` in WGSL, the loop's existing `workgroupUniformLoad`; `__syncthreads_or` for the
//! cancellation word in CUDA), whether to run the body, stop with error 5, or stop with error 6 when the
//! cancellation word is set (read every 1024 iterations); stopping returns from the kernel. Tile operations'
//! element loops are not counted. A device can only see a cancellation written while the dispatch runs where
//! the host can write device memory concurrently (CUDA from another stream); `hal-vulkan` checks its flag
//! between dispatches.
//!
//! # Limits and divergences from the reference
//!
//! * **i64 in WGSL** (no 64-bit integers in downlevel WGSL) is emulated with i32: index math wraps at 32 bits,
//!   so every parameter must have fewer than 2^31 elements and 2^31 words (checked: [`Error::Unsupported`]),
//!   i64 immediates must fit i32, float -> i64 casts saturate at the i32 range, shifts of i64 values take the
//!   amount mod 32, and i64 buffer elements outside i32 are error 4. Grids are limited to
//!   `max_compute_workgroups_per_dimension` (65535) per dimension.
//! * **f64** has no WGSL type (no `SHADER_FLOAT64` in the default capabilities). Values that are the same in
//!   every program instance (computed from immediates and template values only: `loom_reference::fold`,
//!   with the reference's exact semantics) and are f64 or computed from f64 are **folded**: the f64 values
//!   are not emitted and the non-f64 values derived from them are written as literals (a function-scope
//!   array when the elements differ). That is how the RoPE motif's frequency table (`exp`/`log` in f64 of
//!   template values, rounded to i32 limbs) reaches WGSL. Any other f64 value is [`Error::Unsupported`].
//!   CUDA has f64 and computes such values itself.
//! * **Q4_K / Q6_K** (and q8_0/q4_0/q4_1) loads are dequantised on both targets. WGSL is executed on lavapipe
//!   against the reference by the HAL conformance suite (a compiler may contract q4_k's `d1 * q - m1`). The
//!   CUDA readers have not run on a GPU: NVRTC and ptxas compile them (below), and `tests/cuda_dequant.rs`
//!   compiles each emitted reader with the host's C compiler and checks it bit for bit against
//!   `loom_reference::dequantize` on random blocks.
//! * Dots with `M + N` over the scratch words (4092 with the downlevel 16 KiB of workgroup memory) are
//!   [`Error::Unsupported`]; so are kernels
//!   with more than `max_storage_buffers_per_shader_stage - 1` parameters.
//! * Numerics: sums and dots accumulate in f32 in index order (the reference accumulates in f64 and rounds once:
//!   compare with the tolerance its rounding model gives). WGSL's `exp`/`log`/`tanh`/`sqrt` and `/` have the
//!   precision WGSL allows (e.g. 2.5 ulp division), `erf` is Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7),
//!   float `%` is `a - b * trunc(a / b)`, and a compiler may contract `a * b + c`. f16/bf16 values are rounded
//!   to nearest-even after every op with bit manipulation (exact, as f32 is wide enough).
//!
//! # Conformance
//!
//! `hal-vulkan` runs these WGSL modules on lavapipe (CI's software Vulkan): the HAL conformance suite
//! (`tests/integration/hal_conformance.rs`: a motif stage against `loom-reference`, checked loads out of range,
//! division by zero and non-positive loop steps with the reference's exact error text) and every motif stage against
//! the CPU backend on random inputs (`tests/integration/hal_motifs.rs`: `|vulkan - cpu| / (1 + |cpu|) <= 3e-5`,
//! 2.5e-6 measured), once with the default limits and once with `Limits::downlevel_defaults()`. Refused with [`Error::Unsupported`], under the
//! downlevel limit of 4 storage buffers, are kernels with more than 3 parameters.
//!
//! The CUDA C is checked by the real compiler without a GPU: `hal-cuda`'s `tests/nvrtc.rs` compiles every kernel
//! of every motif stage (defaults and ragged shapes, every epilogue), of the HAL conformance suite and of
//! `loom_testkit::corpus` (the hand-built kernels of `tests/ops.rs`: every op and dtype) with NVRTC 12.8 for
//! `compute_80` and `compute_90` (no warnings allowed but #550, a register array set and never read, where
//! gathers recompute a `tile.range`) and assembles the PTX with `ptxas -arch=sm_80` / `sm_90`; what this crate
//! refuses in CUDA is an expected list there (empty: every kernel there is emitted). `scripts/test.sh` fetches
//! the tools (`scripts/fetch-cuda-tools.sh`) and requires them. The same suite runs on a device from `hal-cuda`
//! where a GPU is lent (`scripts/gpu-conformance.sh`); it has not run on one yet.

mod body;
mod cuda;
mod wgsl;

pub use cuda::{CudaModule, cuda_kernel};
pub use wgsl::{
    WgslBinding, WgslBuffer, WgslDispatch, WgslModule, WgslStage, wgsl_kernel, wgsl_stage,
};

/// Why a kernel could not be emitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The IR is inconsistent (types, shapes, indices, regions).
    #[error("malformed IR: {0}")]
    Malformed(String),
    /// Valid IR this target cannot express (yet).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// naga rejected the emitted WGSL: a bug of this crate.
    #[error("emitted WGSL for `{kernel}` does not validate:\n{message}")]
    Invalid { kernel: String, message: String },
}

/// The device limits WGSL is compiled against: the **requested** limits of the wgpu device, not the adapter's,
/// so a module that works on one machine works on every machine that grants them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WgslLimits {
    /// Storage buffers one dispatch may bind (kernel parameters + the status buffer). wgpu default: 8.
    pub max_storage_buffers_per_shader_stage: u32,
    /// Bytes of workgroup memory (downlevel default: 16384).
    pub max_compute_workgroup_storage_size: u32,
    /// Invocations per workgroup (downlevel default: 256).
    pub max_compute_invocations_per_workgroup: u32,
    /// `@workgroup_size` x (downlevel default: 256).
    pub max_compute_workgroup_size_x: u32,
    /// Workgroups per dispatch dimension (65535).
    pub max_compute_workgroups_per_dimension: u32,
    /// Bytes of one storage binding (128 MiB).
    pub max_storage_buffer_binding_size: u64,
}

impl Default for WgslLimits {
    /// wgpu's default storage-buffer count (8) with the downlevel-default compute limits.
    fn default() -> Self {
        WgslLimits {
            max_storage_buffers_per_shader_stage: 8,
            max_compute_workgroup_storage_size: 16384,
            max_compute_invocations_per_workgroup: 256,
            max_compute_workgroup_size_x: 256,
            max_compute_workgroups_per_dimension: 65535,
            max_storage_buffer_binding_size: 128 << 20,
        }
    }
}
