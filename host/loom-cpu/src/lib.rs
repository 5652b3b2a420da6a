//! The CPU lowering of Loom kernels and stages (`loom_ir::kernel`): the library the `hal-cpu` plugin wraps.
//!
//! [`compile_stage`] turns a specialized [`Stage`] into a [`CpuStage`] whose [`CpuStage::run`] has the same
//! contract as `loom_reference::run_stage` (buffer counts and sizes, poisoned workspace, dispatches in order,
//! checked loads reported as [`Error::IndexOutOfRange`] naming kernel, parameter and index, never a wild read or
//! write). The reference interpreter is this crate's oracle: the tests run both on the same random inputs.
//!
//! # Lowering
//!
//! * Every kernel becomes one Cranelift-compiled function that runs **one program instance** (see
//!   `jit.rs`): grid coordinates as arguments, a pointer to the buffer-descriptor table (`[ptr, len]` per
//!   kernel parameter) and a pointer to the instance's tile scratch; it returns a status code.
//! * Scalars are Cranelift values; tiles live in scratch at offsets fixed at compile time (a bump allocator,
//!   64-byte aligned, after a 64-byte error header; storage is f32 for f32/f16/bf16, f64, or i64 for every
//!   integer type). Tile ops are loops (f32 `+ - * /` four lanes at a time; casts among f32, f64 and the integer
//!   types inline); reductions, casts to f16/bf16, `exp`-style functions, quantised reads and `tile.dot` call
//!   Rust helpers (`rt.rs`), `tile.dot` through the `gemm`
//!   crate's microkernels.
//! * A kernel that is exactly a tiled GEMM over full buffers (`pattern.rs`) runs as one `gemm` call over the
//!   whole matrices (split over rows, or columns when N > M, between threads) plus a JIT-compiled epilogue
//!   kernel for bias or activation; `B` may be stored transposed (`[N, K]`, PyTorch's `Linear` layout, loaded as
//!   `transpose(load(B[rn, rk]))`), which the `gemm` call reads through its strides.
//! * A kernel that is exactly a tiled matrix-vector product `y = W x` with a Q8_0/Q4_0/Q4_1 weight `W: [N, K]`
//!   (GGUF layout, `tile.dot` at M = 1 against the transposed weight tile; `pattern::match_matvec`) runs on the
//!   hand-written quantised dot microkernels of `qdot.rs` (AVX-512 VNNI, AVX2 or scalar, chosen at run time),
//!   threaded over output rows. They quantise `x` to Q8 blocks once per call as ggml does, which adds a bounded
//!   error (stated in `qdot.rs`) that the JIT path (dequantise, f32 `tile.dot`) does not have.
//! * A kernel that is exactly a row softmax or layernorm over whole rows (`pattern::match_rows`) runs on the
//!   vectorised row loops of `rows.rs` (AVX-512, AVX2+FMA or baseline, chosen at run time), threaded over rows;
//!   sums are f64 rounded once as in the reference, `exp` an f32 polynomial within 1 ulp.
//!
//! # Threading
//!
//! The grid loop runs in Rust: instances in row-major order are cut into `threads` contiguous chunks, each run
//! with its own scratch on the persistent worker pool ([`pool`]; the calling thread runs chunks too). Instances are independent by the IR's contract; if several fail,
//! the error of the first failing instance in row-major order is reported (what the sequential reference
//! reports).
//!
//! # Safety argument
//!
//! `unsafe` is confined to: calling JIT code (`run_grid`), the raw-pointer helpers the JIT code calls
//! (`rt.rs`), the `gemm` call (`kernels.rs`), the quantised dot intrinsics (`qdot.rs`, `qdotf.rs`, only behind
//! run-time feature detection, on slices whose lengths are asserted) with the buffer slices `run` hands them, the row
//! loops' target-feature variants (`rows.rs`, behind run-time detection, on aligned f32 slices of distinct
//! read and write buffers, indexed through bounds-checked slices), and freeing
//! the JIT memory. The JIT code only touches (a) its
//! scratch, at offsets the compiler assigned inside the size it reports, and (b) buffers through the
//! descriptor table, at flat indices built from per-dimension indices that are each either checked against
//! the parameter's extent (per element, or once for a whole `tile.range`) or validated before the access
//! (checked loads). Buffer byte sizes are checked against every parameter's dtype and shape before anything
//! runs, so an in-range index is an in-bounds address. Stores only go to parameters bound to outputs or
//! workspace (checked at compile time), and the descriptor table hands out pointers to those buffers only
//! while `run` holds them mutably borrowed.

#![allow(unsafe_code)]

#[cfg(target_arch = "x86_64")]
mod amx;
mod epilogue;
mod jit;
mod kernels;
mod pattern;
pub mod pool;
#[cfg(target_arch = "x86_64")]
mod qamx;
mod qdot;
mod qdotf;
mod qtile;
mod quant;
mod rows;
mod rt;
mod timing;
pub mod trim;
mod vmath;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use loom_ir::Loc;
use loom_ir::kernel::{Access, BufRef, DType, Kernel, RunBounds, Stage, instance_allowance};

/// The byte workspace buffers are filled with before a stage runs (as the reference does).
pub const POISON_BYTE: u8 = 0xff;

/// Why a stage could not be compiled or run: the execution contract's error (shared with the reference, so
/// the same failure gives the same value); CPU compile failures are `Unsupported { backend: "cpu" }`.
pub use loom_ir::kernel::ExecError as Error;
use loom_ir::kernel::buffer_bytes as byte_size;

fn malformed(at: impl Into<String>, message: impl Into<String>) -> Error {
    Error::Malformed {
        at: at.into(),
        message: message.into(),
    }
}

fn kernel_at(kernel: &Kernel, loc: Loc) -> String {
    if loc == Loc::default() {
        format!("kernel `{}`", kernel.name)
    } else {
        format!("kernel `{}` at {}:{}", kernel.name, loc.line, loc.col)
    }
}

/// How one kernel was compiled.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelReport {
    pub name: String,
    /// `"jit"`, `"gemm"` (whole-kernel GEMM, with `"gemm+epilogue"` when an epilogue kernel runs after it) or
    /// `"qmatvec"` (whole-kernel quantised matrix-vector product, `qdot.rs`) or `"rows"` (whole-kernel row
    /// softmax / layernorm, `rows.rs`).
    pub path: &'static str,
    pub scratch_bytes: usize,
    pub compile_time: Duration,
}

/// Compile times of a stage: per kernel, and in total (including linking).
#[derive(Debug, Clone, PartialEq)]
pub struct CompileReport {
    pub kernels: Vec<KernelReport>,
    pub total: Duration,
}

/// A compiled kernel: its per-instance function and what the error statuses refer to.
#[derive(Debug, Clone)]
struct Func {
    f: jit::KernelFn,
    scratch: usize,
    sites: Vec<Loc>,
}

#[derive(Debug)]
struct GemmPlan {
    m: usize,
    n: usize,
    k: usize,
    a: u32,
    b: u32,
    c: u32,
    trans_b: bool,
    epilogue: Option<(Kernel, Func)>,
    /// The epilogue's native row form (`epilogue.rs`), run instead of the JIT epilogue when the buffers allow.
    native: Option<epilogue::Epilogue>,
}

#[derive(Debug)]
struct KPlan {
    kernel: Kernel,
    func: Func,
    gemm: Option<GemmPlan>,
    matvec: Option<(pattern::MatvecMatch, qdot::Isa)>,
    rows: Option<(pattern::RowsMatch, rows::Isa)>,
}

/// Forms of one parameter buffer's bytes that the CPU kernels derive and keep between runs: the weight tiles
/// of the quantised row products (`qtile`), one per matrix shape the buffer is read as. Whoever owns the
/// buffer keeps one of these beside it, passes it to [`CpuStage::run_cached`], and calls [`ParamCache::clear`]
/// whenever the buffer's bytes change (a stale form would compute with the old weights).
#[derive(Debug, Default)]
pub struct ParamCache {
    tiles: Mutex<Vec<std::sync::Arc<qtile::Packed>>>,
}

impl ParamCache {
    /// An empty cache.
    pub fn new() -> ParamCache {
        ParamCache::default()
    }

    /// Drops every derived form (the buffer's bytes changed).
    pub fn clear(&self) {
        self.tiles.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// Bytes the derived forms hold.
    pub fn bytes(&self) -> usize {
        let t = self.tiles.lock().unwrap_or_else(|e| e.into_inner());
        t.iter().map(|p| p.bytes()).sum()
    }

    /// The tiles of `w` read as `[n, k]` of `dtype`: kept in `cache` (made there on first use), or made for the
    /// caller alone without one (on up to `threads` threads).
    pub(crate) fn tiles_or_pack(
        cache: Option<&ParamCache>,
        dtype: DType,
        n: usize,
        k: usize,
        w: &[u8],
        threads: usize,
    ) -> std::sync::Arc<qtile::Packed> {
        match cache {
            Some(c) => c.tiles(dtype, n, k, w, threads),
            None => std::sync::Arc::new(qtile::Packed::pack(dtype, n, k, w, threads)),
        }
    }

    /// The tiles read as `[n, k]` of `dtype`, if they were made.
    fn peek(&self, dtype: DType, n: usize, k: usize) -> Option<std::sync::Arc<qtile::Packed>> {
        let t = self.tiles.lock().unwrap_or_else(|e| e.into_inner());
        t.iter().find(|p| p.is(dtype, n, k)).cloned()
    }

    /// The tiles of `w` read as `[n, k]` of `dtype`, made on first use (on up to `threads` threads).
    fn tiles(
        &self,
        dtype: DType,
        n: usize,
        k: usize,
        w: &[u8],
        threads: usize,
    ) -> std::sync::Arc<qtile::Packed> {
        let mut t = self.tiles.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = t.iter().find(|p| p.is(dtype, n, k)) {
            return p.clone();
        }
        let p = std::sync::Arc::new(qtile::Packed::pack(dtype, n, k, w, threads));
        t.push(p.clone());
        p
    }
}

/// JIT modules alive (compiled stages not yet dropped): each holds executable memory, freed on drop.
static LIVE_MODULES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// How many compiled stages' code is alive in this process (each owns executable mappings until it drops);
/// tests use it to check that unloading a model frees its code.
pub fn live_code_modules() -> usize {
    LIVE_MODULES.load(std::sync::atomic::Ordering::Relaxed)
}

/// Owns the JIT code; freed on drop.
struct Code(Option<cranelift_jit::JITModule>);

impl Code {
    fn new(m: cranelift_jit::JITModule) -> Code {
        LIVE_MODULES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Code(Some(m))
    }
}

impl std::fmt::Debug for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Code")
    }
}

impl Drop for Code {
    fn drop(&mut self) {
        if let Some(m) = self.0.take() {
            // SAFETY: the function pointers into this module live in the `CpuStage` being dropped; nothing
            // can call them afterwards.
            unsafe { m.free_memory() };
            LIVE_MODULES.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// A stage compiled for this CPU.
#[derive(Debug)]
pub struct CpuStage {
    stage: Stage,
    plans: Vec<KPlan>,
    /// Per dispatch: for each kernel parameter, its slot (inputs, outputs, workspace, parameters).
    maps: Vec<Vec<usize>>,
    /// The workspace buffers' places in one region (`Stage::workspace_placement`: buffers whose live
    /// dispatch ranges do not meet share bytes).
    ws: loom_ir::kernel::WorkspacePlacement,
    /// Per dispatch: the workspace buffers first used there that are poisoned just before it (every one
    /// except those the dispatch writes whole before anything reads them: a GEMM's C, a row kernel's or a
    /// matvec's y), so that no kernel ever reads bytes of an earlier buffer or an earlier run.
    ws_poison_at: Vec<Vec<usize>>,
    /// Per dispatch: how many consecutive dispatches from it (itself included) are quantised row products on
    /// weight tiles whose workspace needs no poisoning (`qdotf::tiled`), candidates to run as one group
    /// (`qtile::matmul_group`) once their buffers are seen not to overlap; 0 where it is not such a product.
    tiled_run: Vec<usize>,
    /// Per dispatch: the next dispatch that is such a product, whose weight tiles idle threads prefetch
    /// while this one runs (`pool::prefetch`).
    next_tiled: Vec<Option<usize>>,
    report: CompileReport,
    _code: std::sync::Mutex<Code>,
}

fn lowering_error(kernel: &Kernel, f: jit::Fail, loc: Loc) -> Error {
    match f {
        jit::Fail::Bad(message) => malformed(kernel_at(kernel, loc), message),
        jit::Fail::Unsupported(message) => Error::Unsupported {
            backend: "cpu".into(),
            kernel: kernel.name.clone(),
            message,
        },
    }
}

/// `n` zero bytes from the allocator's zeroed allocation (`calloc`: a large buffer is fresh pages the kernel
/// zeroes on first touch, so bytes never written cost no memory traffic), or `None` when out of memory.
pub fn zeroed_bytes(n: usize) -> Option<Vec<u8>> {
    if n == 0 {
        return Some(Vec::new());
    }
    let layout = std::alloc::Layout::array::<u8>(n).ok()?;
    // SAFETY: `layout` has a non-zero size.
    let p = unsafe { std::alloc::alloc_zeroed(layout) };
    if p.is_null() {
        return None;
    }
    // SAFETY: `p` was allocated by the global allocator with the layout of `n` bytes of alignment 1, which is
    // `Vec<u8>`'s for capacity `n`; all `n` bytes are initialised (zero).
    Some(unsafe { Vec::from_raw_parts(p, n, n) })
}

/// Compilation switches (the defaults are what a server wants).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Run kernels that are exactly a tiled GEMM as one `gemm` call (plus epilogue), and kernels that are
    /// exactly a quantised matrix-vector product on the `qdot` microkernels; `false` JIT-compiles them like
    /// any other kernel (tests use this to check both paths).
    pub match_gemm: bool,
    /// Run a matched GEMM's elementwise epilogue row by row natively (`epilogue.rs`) when it is one of the
    /// forms that path runs; `false` keeps the JIT epilogue (tests compare the two, bit for bit).
    pub native_epilogues: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            match_gemm: true,
            native_epilogues: true,
        }
    }
}

/// Compiles every kernel of `stage` (each once, however often it is dispatched) and checks every dispatch's
/// bindings, so that [`CpuStage::run`] only has to check the buffers it is given.
pub fn compile_stage(stage: &Stage) -> Result<CpuStage, Error> {
    compile_stage_with(stage, Options::default())
}

/// [`compile_stage`] with explicit [`Options`].
pub fn compile_stage_with(stage: &Stage, options: Options) -> Result<CpuStage, Error> {
    let t0 = Instant::now();
    let at = format!("stage `{}`", stage.name);
    let mut jit = jit::Jit::new().map_err(|message| Error::Unsupported {
        backend: "cpu".into(),
        kernel: String::new(),
        message,
    })?;
    let mut lowered = Vec::new();
    let mut reports = Vec::new();
    for (ki, k) in stage.kernels.iter().enumerate() {
        let tk = Instant::now();
        for p in &k.params {
            byte_size(&kernel_at(k, Loc::default()), &p.name, p.dtype, &p.shape)?;
        }
        let main = jit
            .lower(k, jit::Opts::default(), &format!("k{ki}"))
            .map_err(|(f, loc)| lowering_error(k, f, loc))?;
        let gm = if options.match_gemm {
            pattern::match_gemm(k)
        } else {
            None
        };
        let mv = if options.match_gemm {
            pattern::match_matvec(k).map(|m| (m, qdot::Isa::detect()))
        } else {
            None
        };
        let rw = if options.match_gemm {
            pattern::match_rows(k).map(|m| (m, rows::Isa::detect()))
        } else {
            None
        };
        let epi = match gm
            .as_ref()
            .and_then(|g| g.epilogue.clone().map(|e| (e, g.c)))
        {
            Some((e, c)) => {
                let opts = jit::Opts {
                    allow_load: Some(c),
                };
                let l = jit
                    .lower(&e, opts, &format!("k{ki}e"))
                    .map_err(|(f, loc)| lowering_error(&e, f, loc))?;
                Some((e, l))
            }
            None => None,
        };
        let native = match (&gm, &epi) {
            (Some(g), Some((e, _))) if options.native_epilogues => epilogue::match_epilogue(g, e),
            _ => None,
        };
        reports.push(KernelReport {
            name: k.name.clone(),
            path: match (&gm, &epi) {
                _ if mv.is_some() => "qmatvec",
                _ if rw.is_some() => "rows",
                (None, _) => "jit",
                (Some(_), None) => "gemm",
                (Some(_), Some(_)) if native.is_some() => "gemm+native-epilogue",
                (Some(_), Some(_)) => "gemm+epilogue",
            },
            scratch_bytes: main.scratch,
            compile_time: tk.elapsed(),
        });
        lowered.push((main, gm, epi, native, mv, rw));
    }
    let maps = bind_dispatches(stage, &at)?;
    let module = jit.finish().map_err(|message| Error::Unsupported {
        backend: "cpu".into(),
        kernel: String::new(),
        message,
    })?;
    let func = |l: jit::Lowered, name: &str| {
        let f = jit::func_ptr(&module, l.id);
        jit::perf_map(f, l.code_bytes, name);
        Func {
            f,
            scratch: l.scratch,
            sites: l.sites,
        }
    };
    let plans: Vec<KPlan> = stage
        .kernels
        .iter()
        .zip(lowered)
        .map(|(k, (main, gm, epi, native, mv, rw))| KPlan {
            kernel: k.clone(),
            func: func(main, &k.name),
            gemm: gm.map(|g| GemmPlan {
                m: g.m,
                n: g.n,
                k: g.k,
                a: g.a,
                b: g.b,
                c: g.c,
                trans_b: g.trans_b,
                epilogue: epi.map(|(e, l)| (e, func(l, &format!("{}.epilogue", k.name)))),
                native,
            }),
            matvec: mv,
            rows: rw,
        })
        .collect();
    let ws = stage.workspace_placement();
    let slot0 = stage.inputs.len() + stage.outputs.len();
    let mut ws_poison_at = vec![Vec::new(); stage.dispatches.len()];
    for (w, live) in ws.live.iter().enumerate() {
        let Some((first, _)) = *live else { continue };
        let (slot, map) = (slot0 + w, &maps[first]);
        let plan = &plans[stage.dispatches[first].kernel as usize];
        let at = |p: u32| map.get(p as usize) == Some(&slot);
        let written_whole = map.iter().filter(|&&s| s == slot).count() == 1
            && (plan.gemm.as_ref().is_some_and(|g| at(g.c))
                || plan.rows.as_ref().is_some_and(|(r, _)| at(r.y))
                || plan.matvec.as_ref().is_some_and(|(m, _)| at(m.y)));
        if !written_whole {
            ws_poison_at[first].push(w);
        }
    }
    let tiled: Vec<bool> = stage
        .dispatches
        .iter()
        .map(|d| {
            plans[d.kernel as usize]
                .matvec
                .as_ref()
                .is_some_and(|(mv, isa)| {
                    mv.row_form
                        && (qdotf::tiled(*isa, mv.dtype, mv.m)
                            || qdotf::on_amx(*isa, mv.dtype, mv.m))
                })
        })
        .collect();
    let tiled_run: Vec<usize> = (0..stage.dispatches.len())
        .map(|i| {
            if !tiled[i] {
                return 0;
            }
            1 + (i + 1..stage.dispatches.len())
                .take_while(|&j| tiled[j] && ws_poison_at[j].is_empty())
                .count()
        })
        .collect();
    let next_tiled: Vec<Option<usize>> = (0..stage.dispatches.len())
        .map(|i| (i + 1..stage.dispatches.len()).find(|&j| tiled[j]))
        .collect();
    let total = t0.elapsed();
    timing::compiled(&stage.name, &reports, total);
    Ok(CpuStage {
        stage: stage.clone(),
        plans,
        maps,
        ws,
        ws_poison_at,
        tiled_run,
        next_tiled,
        report: CompileReport {
            kernels: reports,
            total,
        },
        _code: std::sync::Mutex::new(Code::new(module)),
    })
}

/// Resolves every dispatch argument to a slot and checks it the way `loom_reference::run_stage` does.
fn bind_dispatches(stage: &Stage, at: &str) -> Result<Vec<Vec<usize>>, Error> {
    let (n_in, n_out, n_ws) = (
        stage.inputs.len(),
        stage.outputs.len(),
        stage.workspace.len(),
    );
    let mut maps = Vec::new();
    for (di, d) in stage.dispatches.iter().enumerate() {
        let here = format!("{at} dispatch {di}");
        let kernel = stage
            .kernels
            .get(d.kernel as usize)
            .ok_or_else(|| malformed(&here, format!("kernel #{} does not exist", d.kernel)))?;
        let here = format!("{here} (kernel `{}`)", kernel.name);
        if d.args.len() != kernel.params.len() {
            let msg = format!(
                "{} arguments for {} parameters",
                d.args.len(),
                kernel.params.len()
            );
            return Err(malformed(&here, msg));
        }
        let mut map = Vec::new();
        for (p, arg) in kernel.params.iter().zip(&d.args) {
            let sb = |b: &loom_ir::kernel::StageBuffer| (b.name.clone(), b.dtype, b.shape.clone());
            let (slot, (name, dtype, shape), writable) = match *arg {
                BufRef::Input(i) => stage
                    .inputs
                    .get(i as usize)
                    .map(|b| (i as usize, sb(b), false)),
                BufRef::Output(i) => stage
                    .outputs
                    .get(i as usize)
                    .map(|b| (n_in + i as usize, sb(b), true)),
                BufRef::Workspace(i) => stage
                    .workspace
                    .get(i as usize)
                    .map(|b| (n_in + n_out + i as usize, sb(b), true)),
                BufRef::Param(i) => stage.params.get(i as usize).map(|b| {
                    (
                        n_in + n_out + n_ws + i as usize,
                        (b.name.clone(), b.dtype, b.shape.clone()),
                        false,
                    )
                }),
            }
            .ok_or_else(|| malformed(&here, format!("argument {arg:?} does not exist")))?;
            let want = byte_size(&here, &p.name, p.dtype, &p.shape)?;
            let have = byte_size(&here, &name, dtype, &shape)?;
            if dtype != p.dtype || want != have {
                let msg = format!(
                    "`{name}` ({dtype}{shape:?}, {have} bytes) cannot bind parameter `{}` ({}{:?}, {want} bytes)",
                    p.name, p.dtype, p.shape
                );
                return Err(malformed(&here, msg));
            }
            if p.access != Access::Read && !writable {
                return Err(malformed(
                    &here,
                    format!("parameter `{}` writes read-only `{name}`", p.name),
                ));
            }
            map.push(slot);
        }
        maps.push(map);
    }
    Ok(maps)
}

/// Raw buffer pointers shared with the worker threads.
#[derive(Clone, Copy)]
struct Shared(*const u64);
// SAFETY: the descriptor table is read-only while the workers run; the buffers it points to are written
// only by JIT code at disjoint elements per instance (the IR's independence contract).
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

impl Shared {
    /// The table (a method, so that closures capture the `Sync` wrapper rather than the raw pointer).
    fn ptr(&self) -> *const u64 {
        self.0
    }
}

/// The scratch unit: 64-byte aligned so that the JIT's aligned scratch accesses are aligned.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// Workspace regions kept between runs (most recently returned last), at most [`ARENAS_KEPT`]: a run takes
/// the smallest that fits instead of allocating (and faulting in) its workspace anew.
static ARENAS: Mutex<Vec<Vec<Line>>> = Mutex::new(Vec::new());

/// How many workspace regions stay allocated between runs (two cohorts of a model may be in flight).
const ARENAS_KEPT: usize = 2;

/// A run's workspace region, returned to [`ARENAS`] when dropped.
struct Arena(Vec<Line>);

impl Arena {
    /// A region of at least `bytes`: the smallest kept one that fits, else a new (zeroed) one.
    fn take(bytes: usize) -> Option<Arena> {
        let lines = bytes.div_ceil(64);
        if lines == 0 {
            return Some(Arena(Vec::new()));
        }
        {
            let mut pool = ARENAS.lock().unwrap_or_else(|e| e.into_inner());
            let best = pool
                .iter()
                .enumerate()
                .filter(|(_, a)| a.len() >= lines)
                .min_by_key(|(_, a)| a.len())
                .map(|(i, _)| i);
            if let Some(i) = best {
                return Some(Arena(pool.swap_remove(i)));
            }
        }
        let layout = std::alloc::Layout::array::<Line>(lines).ok()?;
        // SAFETY: `layout` has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) } as *mut Line;
        if p.is_null() {
            return None;
        }
        // SAFETY: allocated by the global allocator with `Line`'s alignment for `lines` elements, all
        // initialised (zero bytes are a valid `Line`).
        Some(Arena(unsafe { Vec::from_raw_parts(p, lines, lines) }))
    }

    fn base(&mut self) -> *mut u8 {
        self.0.as_mut_ptr() as *mut u8
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        let a = std::mem::take(&mut self.0);
        if a.is_empty() {
            return;
        }
        let mut pool = ARENAS.lock().unwrap_or_else(|e| e.into_inner());
        pool.push(a);
        if pool.len() > ARENAS_KEPT {
            let (i, _) = pool
                .iter()
                .enumerate()
                .min_by_key(|(_, a)| a.len())
                .unwrap_or((0, &Vec::new()));
            let gone = pool.swap_remove(i);
            drop(pool);
            trim::note_freed((gone.len() * 64) as u64);
        }
    }
}

/// A failed instance: its row-major index, program id, status and error header.
struct Failure {
    at: u64,
    pid: [u64; 3],
    status: i32,
    header: [u8; 64],
}

/// The bounds of one grid: each instance's loop allowance and the cancellation flag (0: none).
#[derive(Clone, Copy)]
struct GridBounds {
    allowance: u64,
    cancel: usize,
}

/// A failure before any instance ran (the grid is over the budget) or of a cancelled instance.
fn bound_failure(at: u64, status: i32) -> Failure {
    Failure {
        at,
        pid: [0; 3],
        status,
        header: [0; 64],
    }
}

/// Scratch lines (64 bytes) a thread keeps between dispatches at most: 16 MiB (a larger scratch is freed).
const MAX_KEPT_SCRATCH: usize = 1 << 18;

thread_local! {
    /// The thread's kept kernel scratch (see [`run_grid`]).
    static SCRATCH: std::cell::RefCell<Vec<Line>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs every instance of `func` over `grid` on `threads` threads, within `bounds` (see
/// `loom_ir::kernel::RunBounds`: the host checks the flag before each instance, the JIT code at loop
/// back-edges, every `jit::FUEL_SLICE` iterations).
fn run_grid(
    func: &Func,
    grid: [u64; 3],
    desc: &[u64],
    threads: usize,
    bounds: &RunBounds<'_>,
) -> Result<(), Failure> {
    let total = grid[0].saturating_mul(grid[1]).saturating_mul(grid[2]);
    if total == 0 {
        return Ok(());
    }
    let Some(allowance) = instance_allowance(bounds.steps, total) else {
        return Err(bound_failure(0, jit::ST_BUDGET));
    };
    let gb = GridBounds {
        allowance,
        cancel: bounds.cancel.map_or(0, |c| c as *const _ as usize),
    };
    let threads = (threads.max(1) as u64).min(total);
    // Threads take instances in grains from a shared counter (a static split would leave a thread idle when
    // the instances' work is uneven: empty sequence slots, causal blocks), about 64 grains a thread.
    let grain = (total / (threads * 64)).max(1);
    let next = std::sync::atomic::AtomicU64::new(0);
    // The lowest failing instance found so far: instances past it need not run.
    let first_failure = std::sync::atomic::AtomicU64::new(u64::MAX);
    let d = Shared(desc.as_ptr());
    let f = func.f;
    let lines = func.scratch.div_ceil(64).max(1);
    let work = |ranges: &mut dyn FnMut() -> Option<(u64, u64)>| -> Result<(), Failure> {
        // The thread's scratch, kept between dispatches (a fresh allocation of a large kernel's scratch
        // faulted its pages in on every dispatch) and zeroed for each, so no instance sees another
        // dispatch's tiles.
        let mut scratch = SCRATCH.with(|c| c.take());
        scratch.clear();
        scratch.resize(lines, Line([0; 64]));
        let sp = scratch.as_mut_ptr() as *mut u8;
        let result = (|| {
            let slice = gb.allowance.min(jit::FUEL_SLICE);
            let rest = (gb.allowance - slice).min(i64::MAX as u64);
            let flag = gb.cancel as *const std::sync::atomic::AtomicU32;
            while let Some((lo, hi)) = ranges() {
                for at in lo..hi {
                    // SAFETY: `flag` is null or the `AtomicU32` of the `RunBounds` that outlives this call.
                    if !flag.is_null()
                        && unsafe { (*flag).load(std::sync::atomic::Ordering::Relaxed) } != 0
                    {
                        return Err(bound_failure(at, jit::ST_CANCEL));
                    }
                    let h = &mut scratch[0].0;
                    h[jit::FUEL_OFF as usize..][..8].copy_from_slice(&(slice as i64).to_le_bytes());
                    h[jit::REST_OFF..][..8].copy_from_slice(&(rest as i64).to_le_bytes());
                    h[jit::CANCEL_OFF..][..8].copy_from_slice(&(gb.cancel as u64).to_le_bytes());
                    let pid = [
                        at / (grid[1] * grid[2]),
                        at / grid[2] % grid[1],
                        at % grid[2],
                    ];
                    // SAFETY: `f` was compiled for this kernel with this scratch size; the descriptor table holds one
                    // [ptr, len] pair per parameter, each pointing to a buffer whose size matches the parameter's
                    // shape (checked by `run`), and writable parameters point to buffers `run` holds mutably. See the
                    // crate doc's safety argument for why the code stays inside them.
                    let status =
                        unsafe { f(pid[0] as i64, pid[1] as i64, pid[2] as i64, d.ptr(), sp) };
                    if status != jit::ST_OK {
                        let mut header = [0u8; 64];
                        // SAFETY: the scratch holds at least one line (64 bytes) at `sp`.
                        header.copy_from_slice(unsafe { std::slice::from_raw_parts(sp, 64) });
                        return Err(Failure {
                            at,
                            pid,
                            status,
                            header,
                        });
                    }
                }
            }
            Ok(())
        })();
        if scratch.capacity() <= MAX_KEPT_SCRATCH {
            SCRATCH.with(|c| *c.borrow_mut() = scratch);
        }
        result
    };
    if threads == 1 {
        let mut once = Some((0, total));
        return work(&mut || once.take());
    }
    // Grains on the persistent pool; the calling thread takes part. The lowest failing instance is reported
    // (every instance below it ran: grains are handed out in order).
    let failures: Mutex<Vec<Failure>> = Mutex::new(Vec::new());
    pool::run(threads as usize, threads as usize - 1, &|_| {
        let mut ranges = || {
            let lo = next.fetch_add(grain, std::sync::atomic::Ordering::Relaxed);
            let stop =
                lo >= total || lo >= first_failure.load(std::sync::atomic::Ordering::Relaxed);
            (!stop).then(|| (lo, (lo + grain).min(total)))
        };
        if let Err(f) = work(&mut ranges) {
            first_failure.fetch_min(f.at, std::sync::atomic::Ordering::Relaxed);
            failures.lock().unwrap_or_else(|e| e.into_inner()).push(f);
        }
    });
    failures
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .min_by_key(|f| f.at)
        .map_or(Ok(()), Err)
}

fn failure_error(
    stage: &Stage,
    bounds: &RunBounds<'_>,
    kernel: &Kernel,
    func: &Func,
    f: Failure,
) -> Error {
    let u32_at = |o: usize| u32::from_le_bytes(f.header[o..o + 4].try_into().unwrap_or([0; 4]));
    let i64_at = |o: usize| i64::from_le_bytes(f.header[o..o + 8].try_into().unwrap_or([0; 8]));
    let site = |s: u32| func.sites.get(s as usize).copied().unwrap_or_default();
    match f.status {
        jit::ST_OOR => Error::IndexOutOfRange {
            kernel: kernel.name.clone(),
            param: kernel
                .params
                .get(u32_at(0) as usize)
                .map(|p| p.name.clone())
                .unwrap_or_default(),
            index: i64_at(8),
            dim: u32_at(4) as usize,
            extent: i64_at(16) as u64,
            program_id: f.pid,
        },
        jit::ST_DIV0 => Error::DivisionByZero {
            kernel: kernel.name.clone(),
            loc: site(u32_at(0)),
            program_id: f.pid,
        },
        jit::ST_STEP => malformed(
            kernel_at(kernel, site(u32_at(0))),
            format!("loop step must be positive, got {}", i64_at(8)),
        ),
        jit::ST_BUDGET => Error::BudgetExceeded {
            kernel: kernel.name.clone(),
            stage: stage.name.clone(),
            budget: bounds.steps,
        },
        jit::ST_CANCEL => Error::Cancelled {
            kernel: kernel.name.clone(),
            stage: stage.name.clone(),
        },
        s => Error::Unsupported {
            backend: "cpu".into(),
            kernel: kernel.name.clone(),
            message: format!("a worker thread failed (status {s})"),
        },
    }
}

impl CpuStage {
    /// How long compiling took, per kernel and in total, and which path each kernel takes.
    pub fn compile_report(&self) -> &CompileReport {
        &self.report
    }

    /// Names the weight tiles of product dispatch `j` (when its parameter's cache holds them) to the pool's
    /// idle threads, which bring them into their caches while the kernels before `j` run
    /// ([`pool::prefetch`]). `LOOM_CPU_PREFETCH=0` turns this off.
    fn prefetch_tiles(&self, j: usize, param_base: usize, caches: &[&ParamCache]) {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        if !*ON.get_or_init(|| std::env::var("LOOM_CPU_PREFETCH").map_or(true, |v| v != "0")) {
            return;
        }
        let plan = &self.plans[self.stage.dispatches[j].kernel as usize];
        let Some((mv, _)) = &plan.matvec else { return };
        let sw = self.maps[j][mv.w as usize];
        let Some(cache) = sw.checked_sub(param_base).and_then(|p| caches.get(p)) else {
            return;
        };
        if let Some(p) = cache.peek(mv.dtype, mv.n, mv.k) {
            pool::prefetch(p.ptr(), p.bytes());
        }
    }

    /// Runs the tiled row products of dispatches `first..` (at most `tiled_run[first]` of them) as one group
    /// while each next one's buffers overlap no earlier member's output and its output overlaps no earlier
    /// member's buffers (workspace buffers that are never live together may share bytes), and its grid passes
    /// the budget and the flag. Returns how many it ran; 0 or 1 means none ran (the caller runs `first` alone).
    #[cfg(target_arch = "x86_64")]
    fn run_tiled_group(
        &self,
        first: usize,
        slots: &[(u64, u64)],
        param_base: usize,
        caches: &[&ParamCache],
        threads: usize,
        bounds: &RunBounds<'_>,
    ) -> usize {
        let overlap =
            |a: (u64, u64), b: (u64, u64)| a.1 > 0 && b.1 > 0 && a.0 < b.0 + b.1 && b.0 < a.0 + a.1;
        let mut members: Vec<(&pattern::MatvecMatch, usize, usize, usize)> = Vec::new();
        let mut reads: Vec<(u64, u64)> = Vec::new();
        let mut writes: Vec<(u64, u64)> = Vec::new();
        let amx = {
            let plan = &self.plans[self.stage.dispatches[first].kernel as usize];
            plan.matvec
                .as_ref()
                .is_some_and(|(mv, isa)| qdotf::on_amx(*isa, mv.dtype, mv.m))
        };
        for j in first..first + self.tiled_run[first] {
            let d = &self.stage.dispatches[j];
            let (map, plan) = (&self.maps[j], &self.plans[d.kernel as usize]);
            let Some((mv, isa)) = &plan.matvec else { break };
            // One path for the whole group: the tiled kernels below `qtile::MAX_ROWS` rows, AMX from there.
            if j > first && qdotf::on_amx(*isa, mv.dtype, mv.m) != amx {
                break;
            }
            let (sw, sx, sy) = (map[mv.w as usize], map[mv.x as usize], map[mv.y as usize]);
            let (w, x, y) = (slots[sw], slots[sx], slots[sy]);
            let g = plan.kernel.grid;
            let instances = g[0].saturating_mul(g[1]).saturating_mul(g[2]);
            let clash = sy == sw
                || sy == sx
                || x.1 as usize != 4 * mv.m * mv.k
                || y.1 as usize != 4 * mv.m * mv.n
                || overlap(y, w)
                || overlap(y, x)
                || writes
                    .iter()
                    .any(|&o| overlap(o, w) || overlap(o, x) || overlap(o, y))
                || reads.iter().any(|&r| overlap(r, y));
            if clash
                || (j > first
                    && (instance_allowance(bounds.steps, instances).is_none()
                        || bounds.cancelled()))
            {
                break;
            }
            members.push((mv, sw, sx, sy));
            reads.extend([w, x]);
            writes.push(y);
        }
        if members.len() < 2 {
            return 0;
        }
        // SAFETY (both views): the slot table holds (pointer, length) of live buffers; these are read-only
        // while the group runs (no member's output overlaps them, checked above).
        let view = |s: usize| unsafe {
            std::slice::from_raw_parts(slots[s].0 as *const u8, slots[s].1 as usize)
        };
        let xs: Vec<std::borrow::Cow<'_, [f32]>> = members
            .iter()
            .map(|&(_, _, sx, _)| qdotf::f32_view(view(sx)))
            .collect();
        let tiles: Vec<std::sync::Arc<qtile::Packed>> = members
            .iter()
            .map(|&(mv, sw, _, _)| {
                let cache = sw
                    .checked_sub(param_base)
                    .and_then(|p| caches.get(p))
                    .copied();
                ParamCache::tiles_or_pack(cache, mv.dtype, mv.n, mv.k, view(sw), threads)
            })
            .collect();
        let products: Vec<qtile::Product<'_>> = members
            .iter()
            .zip(&xs)
            .zip(&tiles)
            .map(|((&(mv, _, _, sy), x), p)| qtile::Product {
                p,
                m: mv.m,
                x,
                y: slots[sy].0 as *mut f32,
            })
            .collect();
        // SAFETY: `tiled_run` only counts dispatches whose ISA has the tiled kernels (`qdotf::tiled`), and with AMX-INT8
        // where `amx` (`qdotf::on_amx`); each output is m x n f32 of its buffer (the stage's shapes, checked by
        // `check_buffers`) and overlaps no member's buffers (checked above).
        unsafe {
            if amx {
                qamx::matmul_group(&products, threads)
            } else {
                qtile::matmul_group(&products, threads)
            }
        };
        members.len()
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn run_tiled_group(
        &self,
        _: usize,
        _: &[(u64, u64)],
        _: usize,
        _: &[&ParamCache],
        _: usize,
        _: &RunBounds<'_>,
    ) -> usize {
        0
    }

    /// Runs the stage with `loom_reference::run_stage`'s contract, over `threads` worker threads.
    pub fn run(
        &self,
        inputs: &[&[u8]],
        params: &[&[u8]],
        outputs: &mut [Vec<u8>],
        threads: usize,
    ) -> Result<(), Error> {
        self.run_bounded(inputs, params, outputs, threads, &RunBounds::NONE)
    }

    /// [`CpuStage::run`] within `bounds` (each dispatch has the step budget; the flag stops the stage):
    /// `loom_reference::run_stage_bounded`'s contract. Kernels that run on a whole-kernel path (GEMM,
    /// quantised matvec, rows) have no loops of their own to count; their grid is still checked against the
    /// budget and the flag before they run.
    pub fn run_bounded(
        &self,
        inputs: &[&[u8]],
        params: &[&[u8]],
        outputs: &mut [Vec<u8>],
        threads: usize,
        bounds: &RunBounds<'_>,
    ) -> Result<(), Error> {
        self.run_cached(inputs, params, &[], outputs, threads, bounds)
    }

    /// [`CpuStage::run_bounded`] with a [`ParamCache`] for each parameter buffer (`caches[i]` belongs to
    /// `params[i]`; fewer caches than parameters leave the rest without one): forms of the parameters' bytes
    /// that kernels derive once and keep (repacked weight tiles) live there instead of being derived again
    /// each run. The caller clears a parameter's cache whenever that buffer's bytes change.
    pub fn run_cached(
        &self,
        inputs: &[&[u8]],
        params: &[&[u8]],
        caches: &[&ParamCache],
        outputs: &mut [Vec<u8>],
        threads: usize,
        bounds: &RunBounds<'_>,
    ) -> Result<(), Error> {
        let stage = &self.stage;
        // Slot index of the first parameter (the order below: inputs, outputs, workspace, parameters).
        let param_base = inputs.len() + outputs.len() + stage.workspace.len();
        let at = format!("stage `{}`", stage.name);
        stage.check_buffers(inputs, params, outputs)?;
        for b in &stage.workspace {
            byte_size(&at, &b.name, b.dtype, &b.shape)?;
        }
        // The workspace: one region from the pool of regions kept between runs (returned on every exit).
        let total = usize::try_from(self.ws.total)
            .map_err(|_| malformed(&at, format!("{} workspace bytes", self.ws.total)))?;
        let mut arena = Arena::take(total)
            .ok_or_else(|| malformed(&at, format!("cannot allocate {total} workspace bytes")))?;
        let base = arena.base();
        // One slot table (pointer, length) in the reference's order: inputs, outputs, workspace, parameters.
        let mut slots: Vec<(u64, u64)> = Vec::new();
        slots.extend(inputs.iter().map(|b| (b.as_ptr() as u64, b.len() as u64)));
        slots.extend(
            outputs
                .iter_mut()
                .map(|b| (b.as_mut_ptr() as u64, b.len() as u64)),
        );
        slots.extend((0..stage.workspace.len()).map(|w| match self.ws.live[w] {
            Some(_) => (base as u64 + self.ws.offsets[w], self.ws.sizes[w]),
            // No dispatch uses it: no memory.
            None => (base as u64, 0),
        }));
        slots.extend(params.iter().map(|b| (b.as_ptr() as u64, b.len() as u64)));
        let timed = timing::on().then(Instant::now);
        let mut last = timed;
        // With timing on: the time since the previous dispatch ended, to `kernel`'s line on `path`.
        let mut mark = |kernel: &Kernel, path: &'static str| {
            if let Some(t) = last.as_mut() {
                let now = Instant::now();
                timing::dispatch(
                    &kernel.name,
                    path,
                    kernel.grid,
                    (now - *t).as_nanos() as u64,
                );
                *t = now;
            }
        };
        // Dispatches already run as members of a group of tiled products (see `tiled_run`).
        let mut skip = 0usize;
        for (di, (d, map)) in stage.dispatches.iter().zip(&self.maps).enumerate() {
            if skip > 0 {
                skip -= 1;
                continue;
            }
            for &w in &self.ws_poison_at[di] {
                // SAFETY: the buffer's bytes lie inside the region (placement: offset + size <= total), which
                // `arena` owns for this run; no other reference to them is live.
                unsafe {
                    std::ptr::write_bytes(
                        base.add(self.ws.offsets[w] as usize),
                        POISON_BYTE,
                        self.ws.sizes[w] as usize,
                    )
                };
            }
            let plan = &self.plans[d.kernel as usize];
            let g = plan.kernel.grid;
            let instances = g[0].saturating_mul(g[1]).saturating_mul(g[2]);
            if instance_allowance(bounds.steps, instances).is_none() {
                return Err(Error::BudgetExceeded {
                    kernel: plan.kernel.name.clone(),
                    stage: stage.name.clone(),
                    budget: bounds.steps,
                });
            }
            if bounds.cancelled() {
                return Err(Error::Cancelled {
                    kernel: plan.kernel.name.clone(),
                    stage: stage.name.clone(),
                });
            }
            if self.tiled_run[di] > 0 {
                pool::prefetch_stop();
            } else if let Some(j) = self.next_tiled[di] {
                self.prefetch_tiles(j, param_base, caches);
            }
            let desc: Vec<u64> = map.iter().flat_map(|&s| [slots[s].0, slots[s].1]).collect();
            if let Some(g) = &plan.gemm {
                let (sa, sb, sc) = (map[g.a as usize], map[g.b as usize], map[g.c as usize]);
                let aligned = [sa, sb, sc].iter().all(|&s| slots[s].0.is_multiple_of(4));
                if sc != sa && sc != sb && aligned {
                    kernels::sgemm_threads(
                        g.m,
                        g.n,
                        g.k,
                        slots[sc].0 as *mut f32,
                        slots[sa].0 as *const f32,
                        slots[sb].0 as *const f32,
                        g.trans_b,
                        threads,
                    );
                    mark(&plan.kernel, "gemm");
                    let native = g.native.as_ref().filter(|e| {
                        e.params().all(|p| {
                            map.get(p as usize)
                                .is_some_and(|&s| slots[s].0.is_multiple_of(4))
                        })
                    });
                    if let Some(e) = native {
                        epilogue::run(e, &|p| slots[map[p as usize]].0 as *mut f32, threads);
                    } else if let Some((ek, ef)) = &g.epilogue {
                        run_grid(ef, ek.grid, &desc, threads, bounds)
                            .map_err(|f| failure_error(stage, bounds, ek, ef, f))?;
                    }
                    mark(&plan.kernel, "epilogue");
                    continue;
                }
            }
            if self.tiled_run[di] > 1 {
                let n = self.run_tiled_group(di, &slots, param_base, caches, threads, bounds);
                if n > 1 {
                    // The group's time is reported under its first kernel.
                    mark(&plan.kernel, "matvec");
                    skip = n - 1;
                    continue;
                }
            }
            if let Some((mv, isa)) = &plan.matvec {
                let (sw, sx, sy) = (map[mv.w as usize], map[mv.x as usize], map[mv.y as usize]);
                if sy != sw && sy != sx {
                    let (w, x) = (slots[sw], slots[sx]);
                    // SAFETY: the slot table holds (pointer, length) of live buffers: inputs and parameters
                    // borrowed for `run`, outputs and workspace owned or mutably borrowed by it; `y`'s
                    // buffer is a different slot from `w`'s and `x`'s, so the mutable slice aliases neither.
                    let (w, x, y) = unsafe {
                        (
                            std::slice::from_raw_parts(w.0 as *const u8, w.1 as usize),
                            std::slice::from_raw_parts(x.0 as *const u8, x.1 as usize),
                            std::slice::from_raw_parts_mut(
                                slots[sy].0 as *mut u8,
                                slots[sy].1 as usize,
                            ),
                        )
                    };
                    if mv.row_form {
                        let cache = sw.checked_sub(param_base).and_then(|p| caches.get(p));
                        qdotf::matmul_rows(
                            *isa,
                            mv.dtype,
                            mv.m,
                            mv.n,
                            mv.k,
                            w,
                            x,
                            y,
                            threads,
                            cache.copied(),
                        );
                    } else {
                        qdot::matvec(*isa, mv.dtype, mv.n, mv.k, w, x, y, threads);
                    }
                    mark(&plan.kernel, "matvec");
                    continue;
                }
            }
            if let Some((rm, isa)) = &plan.rows {
                let (sx, sy) = (map[rm.x as usize], map[rm.y as usize]);
                let (sg, sb) = match rm.op {
                    pattern::RowOp::LayerNorm { gamma, beta, .. } => {
                        (Some(map[gamma as usize]), Some(map[beta as usize]))
                    }
                    pattern::RowOp::Softmax => (None, None),
                };
                let reads = [Some(sx), sg, sb];
                let distinct = reads.iter().flatten().all(|&s| s != sy);
                let aligned = reads
                    .iter()
                    .flatten()
                    .chain([&sy])
                    .all(|&s| slots[s].0.is_multiple_of(4));
                if distinct && aligned {
                    let f32s = |s: Option<usize>| match s {
                        // SAFETY: the slot table holds (pointer, length) of live buffers, 4-byte aligned
                        // (checked above); `y`'s slot differs from every slot read here, so these shared
                        // slices alias no mutable one.
                        Some(s) => unsafe {
                            std::slice::from_raw_parts(
                                slots[s].0 as *const f32,
                                slots[s].1 as usize / 4,
                            )
                        },
                        None => &[][..],
                    };
                    let (x, g, b) = (f32s(Some(sx)), f32s(sg), f32s(sb));
                    // SAFETY: as above; `y` is the only slice of its buffer while it lives (outputs and
                    // workspace are mutably borrowed by `run`).
                    let y = unsafe {
                        std::slice::from_raw_parts_mut(
                            slots[sy].0 as *mut f32,
                            slots[sy].1 as usize / 4,
                        )
                    };
                    rows::run(*isa, rm, x, y, g, b, threads);
                    mark(&plan.kernel, "rows");
                    continue;
                }
            }
            run_grid(&plan.func, plan.kernel.grid, &desc, threads, bounds)
                .map_err(|f| failure_error(stage, bounds, &plan.kernel, &plan.func, f))?;
            mark(&plan.kernel, "jit");
        }
        if let Some(t) = timed {
            timing::stage(&stage.name, t.elapsed().as_nanos() as u64);
        }
        Ok(())
    }
}
