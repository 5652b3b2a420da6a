//! Cranelift lowering of one specialized kernel into one native function that runs **one program instance**:
//!
//! ```text
//! extern "C" fn(pid0: i64, pid1: i64, pid2: i64, desc: *const [ptr: u64, len: u64; params], scratch: *mut u8) -> i32
//! ```
//!
//! * Scalars are Cranelift variables in a storage class: `f32` (for f32, f16 and bf16 values, which stay
//!   rounded to their dtype), `f64`, or `i64` (every integer type, kept sign- or zero-extended and wrapped to
//!   its width, `i1` as 0/1).
//! * Tiles live in the instance's scratch memory at offsets assigned here (64-byte aligned, a bump allocator
//!   after a 64-byte error header); each tile op is a loop over its elements (f32 add/sub/mul/div use f32x4).
//!   `expand_dims`/`reshape` alias their operand's storage; broadcast and transpose are index remaps;
//!   casts between f32/f64 and integers are inline Cranelift conversions (`cast_native`); reductions, casts
//!   to f16/bf16, transcendental functions, `tile.dot` and quantised reads call the helpers in [`crate::rt`].
//! * Loads and stores: every buffer access is either checked per element or proven in range. A checked load
//!   first validates every index, dimension by dimension (the same order as the reference, so the reported
//!   index matches), and then runs unchecked; a masked access whose index tiles all come from `tile.range`
//!   tests the range bounds once and takes an unchecked fast path, otherwise it masks every element. A
//!   range moved by a scalar (`add`, `sub`) or scaled by a positive constant (`mul`) stays a range, with a
//!   step (`range(0, n) * 2 + 1`: the odd elements), so strided accesses take the fast path too. A load of
//!   f32 rows that only dots read, soon after and with no store between, from a parameter the kernel never
//!   stores to (`dot_views`: attention's key and value blocks), is not copied where its bounds test passes:
//!   the dot helper reads the buffer's rows in place, at their stride; the view's rows are prefetched where it
//!   is made (`rt::loom_prefetch`), so a value block's trip from memory overlaps the scores before it.
//! * f16/bf16 buffers: whole rows of at least [`COPY_CALL`] elements move through one converting call
//!   (`rt::loom_copy_half`, sixteen lanes at a time, the reference's bits); other accesses convert element by
//!   element. f16/bf16 tiles keep their values in f32 storage, so their cast to f32 shares it. A half load
//!   whose one use is such a cast read only by dots is a view too (of halves, prefetched the same way): the
//!   dot helper converts its rows into a per-thread f32 copy (a KV cache paged in f16).
//! * The return value is a status: 0 = done, 1 = checked load out of range (param, dim, index and extent in
//!   the header), 2 = integer division by zero (op site in the header), 3 = loop step not positive, 4 = the
//!   instance ran out of its step budget, 5 = the dispatch was cancelled.
//! * Run-time bounds (`loom_ir::kernel::RunBounds`): every iteration of a kernel `for` loop costs one step.
//!   The count lives in a Cranelift variable (a register in loops), loaded at entry from the header's
//!   [`FUEL_OFF`] word, which the host sets per instance to a slice of the instance's allowance; the back-edge
//!   decrements it and branches to a cold block when it goes negative (one compare on the hot path). The cold
//!   block calls `rt::loom_fuel`, which checks the cancellation flag (pointer at [`CANCEL_OFF`]) and takes the
//!   next slice from the rest of the allowance ([`REST_OFF`]), or returns the budget or cancel status. So the
//!   flag is looked at every [`FUEL_SLICE`] iterations at most, and at every instance by the host. Tile
//!   operations' element loops are bounded by the tile size and cost nothing.

use cranelift_codegen::Context;
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{
    AbiParam, BlockArg, FuncRef, InstBuilder, MemFlagsData, Type, UserFuncName, Value, types,
};
use cranelift_codegen::settings::{self, Configurable};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext, Variable};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{FuncId, Linkage, Module, default_libcall_names};
use loom_ir::Loc;
use loom_ir::kernel::{
    Access, BinOp, CmpOp, DType, KImm, KOp, KOpKind, KOperand, KRegion, KType, KValue, Kernel,
    MAX_TILE_ELEMENTS, UnOp,
};

use crate::rt::{self, dtype_code};

/// Bytes at the start of scratch reserved for error details.
pub(crate) const HEADER: u32 = 64;
pub(crate) const ST_OK: i32 = 0;
pub(crate) const ST_OOR: i32 = 1;
pub(crate) const ST_DIV0: i32 = 2;
pub(crate) const ST_STEP: i32 = 3;
pub(crate) const ST_BUDGET: i32 = 4;
pub(crate) const ST_CANCEL: i32 = 5;
/// Header word (i64): the steps the instance may take before its next call to `rt::loom_fuel`.
pub(crate) const FUEL_OFF: i32 = 32;
/// Header word (i64): the rest of the instance's allowance, beyond the current slice.
pub(crate) const REST_OFF: usize = 40;
/// Header word (pointer): the dispatch's cancellation flag (`AtomicU32`), or 0.
pub(crate) const CANCEL_OFF: usize = 48;
/// Loop iterations between two looks at the cancellation flag (at most).
pub(crate) const FUEL_SLICE: u64 = 1 << 16;
const MAX_DEPTH: u32 = 64;
/// Rows of at least this many f32 elements are moved between buffers and scratch by one call (`rt::loom_copy`)
/// instead of an inline loop of 128-bit moves.
const COPY_CALL: u32 = 16;

/// [`Lower::for_lanes`]: loops of at most this many iterations are emitted without a loop ...
const UNROLL_ALL: i64 = 8;
/// ... and longer ones with this many bodies an iteration.
const UNROLL: i64 = 4;
/// Scratch per instance is capped so that offsets fit Cranelift's 32-bit immediates with room to spare.
const MAX_SCRATCH: u32 = 1 << 30;

pub(crate) type KernelFn = unsafe extern "C" fn(i64, i64, i64, *const u64, *mut u8) -> i32;

/// Why lowering failed, before the caller adds the kernel and location.
#[derive(Debug)]
pub(crate) enum Fail {
    Bad(String),
    Unsupported(String),
}
type R<T> = Result<T, Fail>;

macro_rules! bad {
    ($($t:tt)*) => { Fail::Bad(format!($($t)*)) };
}

/// Helper symbols: name, address, parameter and result types (`P` = pointer-sized integer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
enum H {
    UnaryTile,
    UnaryScalar,
    RoundTile,
    RoundScalar,
    Fmod,
    HalfToF32,
    F32ToHalf,
    CastScalar,
    CastTile,
    Reduce,
    Dot,
    Dequant,
    Fuel,
    Copy,
    Prefetch,
    CopyHalf,
    BinTile,
}

/// f32 `+ - * /` over tiles of at least this many elements call [`rt::loom_bin_tile`] (sixteen lanes) instead
/// of the inline four-lane loop.
const BIN_TILE_MIN: u32 = 128;

const I32: Type = types::I32;
const I64: Type = types::I64;
const F32: Type = types::F32;
const F64: Type = types::F64;

fn helper_table() -> Vec<(&'static str, *const u8, Vec<Type>, Vec<Type>)> {
    vec![
        (
            "loom_unary_tile",
            rt::loom_unary_tile as *const u8,
            vec![I32, I32, I64, I64, I64],
            vec![],
        ),
        (
            "loom_unary_scalar",
            rt::loom_unary_scalar as *const u8,
            vec![I32, I32, F64],
            vec![F64],
        ),
        (
            "loom_round_tile",
            rt::loom_round_tile as *const u8,
            vec![I32, I64, I64],
            vec![],
        ),
        (
            "loom_round_scalar",
            rt::loom_round_scalar as *const u8,
            vec![I32, F32],
            vec![F32],
        ),
        (
            "loom_fmod",
            rt::loom_fmod as *const u8,
            vec![F64, F64],
            vec![F64],
        ),
        (
            "loom_half_to_f32",
            rt::loom_half_to_f32 as *const u8,
            vec![I32, I32],
            vec![F32],
        ),
        (
            "loom_f32_to_half",
            rt::loom_f32_to_half as *const u8,
            vec![I32, F32],
            vec![I32],
        ),
        (
            "loom_cast_scalar",
            rt::loom_cast_scalar as *const u8,
            vec![I32, I32, I64],
            vec![I64],
        ),
        (
            "loom_cast_tile",
            rt::loom_cast_tile as *const u8,
            vec![I32, I32, I64, I64, I64],
            vec![],
        ),
        (
            "loom_reduce",
            rt::loom_reduce as *const u8,
            vec![I32, I32, I64, I64, I64, I64, I64],
            vec![],
        ),
        (
            "loom_dot",
            rt::loom_dot as *const u8,
            vec![I32, I64, I64, I64, I64, I64, I64, I64, I64, I64],
            vec![],
        ),
        (
            "loom_dequant",
            rt::loom_dequant as *const u8,
            vec![I32, I64, I64],
            vec![F32],
        ),
        (
            "loom_fuel",
            rt::loom_fuel as *const u8,
            vec![I64],
            vec![I64],
        ),
        (
            "loom_copy",
            rt::loom_copy as *const u8,
            vec![I64, I64, I64],
            vec![],
        ),
        (
            "loom_prefetch",
            rt::loom_prefetch as *const u8,
            vec![I64, I64, I64, I64],
            vec![],
        ),
        (
            "loom_copy_half",
            rt::loom_copy_half as *const u8,
            vec![I64, I64, I64, I32, I32],
            vec![],
        ),
        (
            "loom_bin_tile",
            rt::loom_bin_tile as *const u8,
            vec![I32, I64, I64, F32, I64, I64, I32],
            vec![],
        ),
    ]
}

/// Storage class of a dtype's values.
fn cty(d: DType) -> Type {
    match d {
        DType::F32 | DType::F16 | DType::BF16 => F32,
        DType::F64 => F64,
        _ => I64,
    }
}

fn csize(d: DType) -> u32 {
    if cty(d) == F32 { 4 } else { 8 }
}

fn is_half(d: DType) -> bool {
    matches!(d, DType::F16 | DType::BF16)
}

/// Options for one lowering.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Opts {
    /// A write-only parameter that may also be loaded from (the GEMM epilogue re-reads its output).
    pub(crate) allow_load: Option<u32>,
}

/// The result of lowering one kernel.
#[derive(Debug)]
pub(crate) struct Lowered {
    pub(crate) id: FuncId,
    /// Scratch bytes one instance needs (header included).
    pub(crate) scratch: usize,
    /// Op locations indexed by the site number in the error header.
    pub(crate) sites: Vec<Loc>,
    /// Machine code bytes (for the profiler map, [`perf_map`]).
    pub(crate) code_bytes: usize,
}

/// A JIT module collecting the functions of one stage.
pub(crate) struct Jit {
    /// `None` once [`Jit::finish`] handed it out; a `Jit` dropped before that (a failed compile) frees the
    /// code it had defined.
    module: Option<JITModule>,
    helpers: Vec<FuncId>,
    ctx: Context,
    fctx: FunctionBuilderContext,
}

impl std::fmt::Debug for Jit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Jit")
    }
}

impl Jit {
    pub(crate) fn new() -> Result<Jit, String> {
        let mut flags = settings::builder();
        let set =
            |f: &mut settings::Builder, k: &str, v: &str| f.set(k, v).map_err(|e| e.to_string());
        set(&mut flags, "use_colocated_libcalls", "false")?;
        set(&mut flags, "is_pic", "false")?;
        set(&mut flags, "opt_level", "speed")?;
        let isa = cranelift_native::builder()
            .map_err(|e| format!("host not supported by Cranelift: {e}"))?
            .finish(settings::Flags::new(flags))
            .map_err(|e| e.to_string())?;
        if isa.pointer_type() != I64 {
            return Err("only 64-bit hosts are supported".into());
        }
        let mut builder = JITBuilder::with_isa(isa, default_libcall_names());
        let table = helper_table();
        for (name, ptr, _, _) in &table {
            builder.symbol(*name, *ptr);
        }
        let mut module = JITModule::new(builder);
        let mut helpers = Vec::new();
        for (name, _, params, rets) in &table {
            let mut sig = module.make_signature();
            sig.params.extend(params.iter().map(|&t| AbiParam::new(t)));
            sig.returns.extend(rets.iter().map(|&t| AbiParam::new(t)));
            let id = module
                .declare_function(name, Linkage::Import, &sig)
                .map_err(|e| e.to_string())?;
            helpers.push(id);
        }
        let ctx = module.make_context();
        Ok(Jit {
            module: Some(module),
            helpers,
            ctx,
            fctx: FunctionBuilderContext::new(),
        })
    }

    /// Lowers `kernel` into a new function of this module (finalised later by [`Jit::finish`]).
    pub(crate) fn lower(
        &mut self,
        kernel: &Kernel,
        opts: Opts,
        fname: &str,
    ) -> Result<Lowered, (Fail, Loc)> {
        let jerr = |e: String| (Fail::Unsupported(format!("Cranelift: {e}")), Loc::default());
        let module = self
            .module
            .as_mut()
            .ok_or_else(|| jerr("the module is finished".into()))?;
        let mut sig = module.make_signature();
        for _ in 0..5 {
            sig.params.push(AbiParam::new(I64));
        }
        sig.returns.push(AbiParam::new(I32));
        let id = module
            .declare_function(fname, Linkage::Local, &sig)
            .map_err(|e| jerr(e.to_string()))?;
        module.clear_context(&mut self.ctx);
        self.ctx.func.signature = sig;
        self.ctx.func.name = UserFuncName::user(0, id.as_u32());
        let (scratch, sites) = {
            let mut b = FunctionBuilder::new(&mut self.ctx.func, &mut self.fctx);
            let fr: Vec<FuncRef> = self
                .helpers
                .iter()
                .map(|&h| module.declare_func_in_func(h, b.func))
                .collect();
            let entry = b.create_block();
            b.append_block_params_for_function_params(entry);
            b.switch_to_block(entry);
            let p = b.block_params(entry).to_vec();
            let uses = use_counts(kernel);
            let b_only = dot_b_only(kernel, &uses);
            let views = dot_views(kernel, &uses, &b_only);
            let mut l = Lower {
                k: kernel,
                b,
                env: vec![None; kernel.values.len()],
                top: HEADER,
                pid: [p[0], p[1], p[2]],
                desc: p[3],
                base: p[4],
                fr,
                sites: Vec::new(),
                loc: Loc::default(),
                opts,
                depth: 0,
                fuel: None,
                dot_b_only: b_only,
                dot_acc_only: dot_acc_only(kernel, &uses),
                views,
                transposed: std::collections::HashSet::new(),
                zero_tiles: std::collections::HashSet::new(),
                half_rows: None,
            };
            let r = l.body();
            let loc = l.loc;
            if let Err(f) = r {
                // Leave the builder in a finishable state is unnecessary: the context is cleared on reuse.
                return Err((f, loc));
            }
            l.b.seal_all_blocks();
            let (top, sites) = (l.top, std::mem::take(&mut l.sites));
            l.b.finalize(module.target_config());
            (top as usize, sites)
        };
        module
            .define_function(id, &mut self.ctx)
            .map_err(|e| jerr(format!("{e:?}")))?;
        let code_bytes = self
            .ctx
            .compiled_code()
            .map_or(0, |c| c.code_buffer().len());
        module.clear_context(&mut self.ctx);
        Ok(Lowered {
            id,
            scratch,
            sites,
            code_bytes,
        })
    }

    /// Links everything and returns the module (which owns the code) and a lookup for function addresses.
    pub(crate) fn finish(mut self) -> Result<JITModule, String> {
        let mut module = self.module.take().ok_or("the module is finished")?;
        if let Err(e) = module.finalize_definitions() {
            // SAFETY: nothing was handed out of this module (it failed to link).
            unsafe { module.free_memory() };
            return Err(e.to_string());
        }
        Ok(module)
    }
}

impl Drop for Jit {
    fn drop(&mut self) {
        if let Some(m) = self.module.take() {
            // SAFETY: the module was never finished, so no function pointer into it was handed out.
            unsafe { m.free_memory() };
        }
    }
}

/// With `LOOM_PERF_MAP=1` in the environment, appends `start size name` for a compiled kernel to
/// `/tmp/perf-<pid>.map`, the file `perf report` reads to name JIT code (the address would otherwise show as
/// `[JIT] tid ...`). Off by default: the map grows with every compilation and names kernels of every package.
pub(crate) fn perf_map(f: KernelFn, bytes: usize, name: &str) {
    static ON: std::sync::OnceLock<Option<std::sync::Mutex<std::fs::File>>> =
        std::sync::OnceLock::new();
    let file = ON.get_or_init(|| {
        (std::env::var("LOOM_PERF_MAP").as_deref() == Ok("1"))
            .then(|| {
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(format!("/tmp/perf-{}.map", std::process::id()))
                    .ok()
            })
            .flatten()
            .map(std::sync::Mutex::new)
    });
    if let Some(m) = file {
        use std::io::Write;
        if let Ok(mut f2) = m.lock() {
            let _ = writeln!(f2, "{:x} {bytes:x} loom:{name}", f as usize);
            // With LOOM_JIT_DUMP=<dir>, also the machine code, as <dir>/<address>.bin: a profile's sample
            // addresses then map to instructions (`objdump -D -b binary -m i386:x86-64` on the file).
            if let Some(dir) = std::env::var_os("LOOM_JIT_DUMP") {
                // SAFETY: `f` is a finalised function of `bytes` bytes of code (the caller's contract).
                let code = unsafe { std::slice::from_raw_parts(f as usize as *const u8, bytes) };
                let _ = std::fs::write(
                    std::path::Path::new(&dir).join(format!("{:x}.bin", f as usize)),
                    code,
                );
            }
        }
    }
}

/// The address of a finalised function.
pub(crate) fn func_ptr(module: &JITModule, id: FuncId) -> KernelFn {
    let p = module.get_finalized_function(id);
    // SAFETY: `id` was defined with the signature (i64, i64, i64, i64, i64) -> i32 in the platform's C ABI,
    // which is what `KernelFn` describes (pointers are 64-bit, checked in `Jit::new`).
    unsafe { std::mem::transmute::<*const u8, KernelFn>(p) }
}

#[derive(Clone, Debug)]
struct TileV {
    off: u32,
    shape: Vec<u32>,
    dtype: DType,
    /// For tiles made by `tile.range`, or from one by adding or subtracting a scalar or multiplying by a
    /// positive constant: the element values start, start + step, start + 2 step, ...
    range: Option<RangeV>,
    /// A range tile whose elements are not in its scratch yet (only with `range`): accesses index with the
    /// range itself, and [`operand`](Lower::operand) writes the elements where any other operation reads
    /// them. Most ranges only ever index, and writing their elements cost a loop of one store an element.
    lazy: bool,
    /// For tiles loaded as a view (see [`dot_views`]): where the rows are (the buffer's rows in place on the
    /// fast path, the tile's scratch otherwise) and their stride in elements. Only dots read such a tile.
    view: Option<ViewV>,
}

/// The rows of a view tile: element (r, c) at `ptr + (r * ld + c) * size`, where `half` (an i32 variable) is
/// 0 for f32 rows (size 4), 1 for f16 and 2 for bf16 (size 2, the dot converts them).
#[derive(Clone, Copy, Debug)]
struct ViewV {
    ptr: Variable,
    ld: Variable,
    half: Variable,
}

/// The values of a range tile: element j is `start + j * step` (i64, wrapping like the tile's own
/// arithmetic, so the two always agree).
#[derive(Clone, Copy, Debug)]
struct RangeV {
    start: Variable,
    step: i64,
}

impl TileV {
    /// The range of a one-dimensional range tile with unit step (whole rows can be moved along it).
    fn unit_range(&self) -> Option<Variable> {
        self.range.filter(|r| r.step == 1).map(|r| r.start)
    }

    fn n(&self) -> u32 {
        self.shape.iter().product()
    }
}

#[derive(Clone, Debug)]
enum Val {
    Scalar(Variable, DType),
    Tile(TileV),
}

/// An operand ready for use: a scalar SSA value or a tile in scratch.
#[derive(Clone, Debug)]
enum Opnd {
    S(Value, DType),
    T(TileV),
}

impl Opnd {
    fn dtype(&self) -> DType {
        match self {
            Opnd::S(_, d) => *d,
            Opnd::T(t) => t.dtype,
        }
    }
}

/// One load/store index.
#[derive(Clone, Debug)]
enum Ix {
    S(Value),
    T(TileV),
}

struct Lower<'k, 'f> {
    k: &'k Kernel,
    b: FunctionBuilder<'f>,
    env: Vec<Option<Val>>,
    top: u32,
    pid: [Value; 3],
    desc: Value,
    base: Value,
    fr: Vec<FuncRef>,
    sites: Vec<Loc>,
    loc: Loc,
    opts: Opts,
    depth: u32,
    /// The instance's remaining steps in the current slice (see the module doc).
    fuel: Option<Variable>,
    /// Values whose every use is as the `b` operand of a `dot` (see [`dot_b_only`]).
    dot_b_only: Vec<bool>,
    /// Values read only as f32 dots' accumulators (see [`dot_acc_only`]).
    dot_acc_only: Vec<bool>,
    /// Loads that may be views (see [`dot_views`]).
    views: Vec<bool>,
    /// Transposes left unmaterialised (`dot_b_only`): their ids.
    transposed: std::collections::HashSet<u32>,
    /// f32 tiles made by `full` of +0.0: a dot accumulating onto one need not read it.
    zero_tiles: std::collections::HashSet<u32>,
    /// While [`Lower::copy_rows`] moves rows of an f16 or bf16 buffer: its dtype (the whole-row moves then
    /// convert, `rt::loom_copy_half`).
    half_rows: Option<DType>,
}

/// For every value of `k`: whether it is used, and only as the `b` operand of `dot`s (a transpose feeding
/// only dots is then passed to the dot helper as a transposed operand instead of being copied).
/// `uses` is [`use_counts`] of `k`.
fn dot_b_only(k: &Kernel, uses: &[u32]) -> Vec<bool> {
    let mut dot_b = vec![0u32; uses.len()];
    fn walk(r: &KRegion, dot_b: &mut [u32]) {
        for op in &r.ops {
            if let KOpKind::Dot {
                b: KOperand::Value(v),
                ..
            } = &op.kind
                && let Some(d) = dot_b.get_mut(v.0 as usize)
            {
                *d += 1;
            }
            for r in op_regions(&op.kind) {
                walk(r, dot_b);
            }
        }
    }
    walk(&k.body, &mut dot_b);
    uses.iter()
        .zip(&dot_b)
        .map(|(&u, &d)| u > 0 && u == d)
        .collect()
}

/// For every value of `k`: whether it is read, and only as the accumulator of dots over f32 storage (`a` not
/// f64). A tile of +0.0 read only so is never filled: the dot helper writes such a product instead of adding
/// it to its accumulator (bit 2 of its flags), so the zeros are never read (attention's `tile.zeros` score
/// accumulators, 4 KiB of stores a step at 32 x 32).
fn dot_acc_only(k: &Kernel, uses: &[u32]) -> Vec<bool> {
    let mut acc = vec![0u32; uses.len()];
    fn walk(k: &Kernel, r: &KRegion, acc: &mut [u32]) {
        for op in &r.ops {
            if let KOpKind::Dot {
                a,
                acc: KOperand::Value(v),
                ..
            } = &op.kind
            {
                let f64_a = match a {
                    KOperand::Value(a) => matches!(
                        k.values.get(a.0 as usize).map(|d| &d.ty),
                        Some(KType::Tile {
                            dtype: DType::F64,
                            ..
                        })
                    ),
                    KOperand::Imm(_, d) => *d == DType::F64,
                };
                if let Some(n) = acc.get_mut(v.0 as usize) {
                    // A dot over f64 reads its accumulator: never counted, so the value is not skipped.
                    *n += u32::from(!f64_a);
                }
            }
            for r in op_regions(&op.kind) {
                walk(k, r, acc);
            }
        }
    }
    walk(k, &k.body, &mut acc);
    uses.iter()
        .zip(&acc)
        .map(|(&u, &d)| u > 0 && u == d)
        .collect()
}

/// How many times each value of `k` is read, in every region.
fn use_counts(k: &Kernel) -> Vec<u32> {
    fn count(r: &KRegion, uses: &mut [u32]) {
        for op in &r.ops {
            for o in op_operands(&op.kind) {
                if let KOperand::Value(v) = o
                    && let Some(u) = uses.get_mut(v.0 as usize)
                {
                    *u += 1;
                }
            }
            for r in op_regions(&op.kind) {
                count(r, uses);
            }
        }
    }
    let mut uses = vec![0u32; k.values.len()];
    count(&k.body, &mut uses);
    uses
}

/// For every value of `k`: whether it is a `load` of f32 rows (or of f16/bf16 rows whose one use is a
/// `conv.f32`, which shares their storage) that only dots read, in the same region soon
/// after, as their `a` or `b` operand (directly, or through a transpose that only dots read), with no store
/// in between, from a parameter the kernel never stores to (a store, by this instance or a concurrent one,
/// could change the rows the dots would read in place). Such a load may hand the dots
/// the buffer's rows in place (a view) instead of copying them into scratch: attention's key and value pages.
/// `uses` and `b_only` are [`use_counts`] and [`dot_b_only`] of `k`.
fn dot_views(k: &Kernel, uses: &[u32], b_only: &[bool]) -> Vec<bool> {
    let n = uses.len();
    fn stores(op: &KOp) -> bool {
        matches!(op.kind, KOpKind::Store { .. })
            || op_regions(&op.kind)
                .iter()
                .any(|r| r.ops.iter().any(stores))
    }
    let is = |o: &KOperand, v: KValue| matches!(o, KOperand::Value(x) if *x == v);
    // Parameters some instance stores to: another instance's store could land between a load and its dot.
    fn stored(r: &KRegion, out: &mut Vec<u32>) {
        for op in &r.ops {
            if let KOpKind::Store { param, .. } = op.kind {
                out.push(param);
            }
            for r in op_regions(&op.kind) {
                stored(r, out);
            }
        }
    }
    let mut written = Vec::new();
    stored(&k.body, &mut written);
    let half: Vec<bool> = k.params.iter().map(|p| is_half(p.dtype)).collect();
    let mut views = vec![false; n];
    #[allow(clippy::too_many_arguments)]
    fn walk(
        r: &KRegion,
        uses: &[u32],
        b_only: &[bool],
        written: &[u32],
        half: &[bool],
        views: &mut [bool],
        is: &dyn Fn(&KOperand, KValue) -> bool,
    ) {
        for (i, op) in r.ops.iter().enumerate() {
            for r in op_regions(&op.kind) {
                walk(r, uses, b_only, written, half, views, is);
            }
            let (KOpKind::Load { param, .. }, [loaded]) = (&op.kind, &op.results[..]) else {
                continue;
            };
            if written.contains(param) {
                continue;
            }
            // f16/bf16 rows: their one use a `conv.f32` (which shares the storage) right here, whose uses are
            // checked as an f32 load's would be; the view then reads halves (the dot converts them).
            let v = if half.get(*param as usize) == Some(&true) {
                let cast = r
                    .ops
                    .iter()
                    .skip(i + 1)
                    .find_map(|o| match (&o.kind, &o.results[..]) {
                        (KOpKind::Cast { a, to }, [w]) if is(a, *loaded) && *to == DType::F32 => {
                            Some(*w)
                        }
                        _ => None,
                    });
                match cast {
                    Some(w) if uses[loaded.0 as usize] == 1 => w,
                    _ => continue,
                }
            } else {
                *loaded
            };
            let v = &v;
            // Its uses in this region after it: dots (not as the accumulator), or transposes whose own uses are
            // all dots' b here.
            let (mut found, mut last, mut ok) = (0u32, i, true);
            for (j, o) in r.ops.iter().enumerate().skip(i + 1) {
                match &o.kind {
                    KOpKind::Dot { a, b, acc } => {
                        let here = u32::from(is(a, *v)) + u32::from(is(b, *v));
                        if here > 0 {
                            found += here;
                            last = j;
                        }
                        ok &= !is(acc, *v);
                    }
                    KOpKind::Transpose { a } if is(a, *v) => {
                        let t = o.results[0];
                        let tdots: Vec<usize> = r
                            .ops
                            .iter()
                            .enumerate()
                            .skip(j + 1)
                            .filter(|(_, d)| matches!(&d.kind, KOpKind::Dot { b, .. } if is(b, t)))
                            .map(|(e, _)| e)
                            .collect();
                        ok &= b_only.get(t.0 as usize) == Some(&true)
                            && tdots.len() as u32 == uses[t.0 as usize];
                        found += 1;
                        last = last.max(tdots.last().copied().unwrap_or(j));
                    }
                    _ => {}
                }
            }
            views[loaded.0 as usize] = ok
                && found > 0
                && found == uses[v.0 as usize]
                && !r.ops[i + 1..=last].iter().any(stores);
        }
    }
    walk(&k.body, uses, b_only, &written, &half, &mut views, &is);
    views
}

/// The operands an operation reads (not those of its nested regions).
fn op_operands(kind: &KOpKind) -> Vec<&KOperand> {
    match kind {
        KOpKind::ProgramId { .. } => vec![],
        KOpKind::Binary { a, b, .. } | KOpKind::Cmp { a, b, .. } => vec![a, b],
        KOpKind::Unary { a, .. }
        | KOpKind::Cast { a, .. }
        | KOpKind::Broadcast { a, .. }
        | KOpKind::ExpandDims { a, .. }
        | KOpKind::Reshape { a, .. }
        | KOpKind::Transpose { a }
        | KOpKind::Reduce { a, .. } => vec![a],
        KOpKind::Select { cond, a, b } => vec![cond, a, b],
        KOpKind::Range { start, .. } => vec![start],
        KOpKind::Full { value, .. } => vec![value],
        KOpKind::Dot { a, b, acc } => vec![a, b, acc],
        KOpKind::Load { indices, fill, .. } => indices.iter().chain(fill.iter()).collect(),
        KOpKind::Store { indices, value, .. } => {
            indices.iter().chain(std::iter::once(value)).collect()
        }
        KOpKind::For {
            lo,
            hi,
            step,
            inits,
            ..
        } => [lo, hi, step].into_iter().chain(inits.iter()).collect(),
        KOpKind::If { cond, .. } => vec![cond],
        KOpKind::Yield(vs) => vs.iter().collect(),
    }
}

/// The regions nested in an operation.
fn op_regions(kind: &KOpKind) -> Vec<&KRegion> {
    match kind {
        KOpKind::For { body, .. } => vec![body],
        KOpKind::If {
            then_region,
            else_region,
            ..
        } => vec![then_region, else_region],
        _ => vec![],
    }
}

fn flags_buf() -> MemFlagsData {
    // Buffers are byte vectors: no alignment promise; in-range accesses never trap.
    MemFlagsData::new().with_notrap()
}

fn flags_scratch() -> MemFlagsData {
    MemFlagsData::trusted()
}

/// The per-element callback of a buffer access: flat buffer index, in-range flag, result index.
type Leaf<'c, 'k, 'f> = dyn FnMut(&mut Lower<'k, 'f>, Value, Option<Value>, Value) -> R<()> + 'c;

impl<'k, 'f> Lower<'k, 'f> {
    fn body(&mut self) -> R<()> {
        let fuel = self.b.declare_var(I64);
        let f0 = self.b.ins().load(I64, flags_scratch(), self.base, FUEL_OFF);
        self.b.def_var(fuel, f0);
        self.fuel = Some(fuel);
        let ys = self.region(&self.k.body)?;
        if !ys.is_empty() {
            return Err(bad!("the kernel body must end in an empty `yield`"));
        }
        let z = self.b.ins().iconst(I32, i64::from(ST_OK));
        self.b.ins().return_(&[z]);
        Ok(())
    }

    fn region(&mut self, r: &KRegion) -> R<Vec<KOperand>> {
        if self.depth >= MAX_DEPTH {
            return Err(bad!("regions nested deeper than {MAX_DEPTH}"));
        }
        self.depth += 1;
        let Some((last, ops)) = r.ops.split_last() else {
            return Err(bad!("empty region (every region ends in `yield`)"));
        };
        for op in ops {
            self.loc = op.loc;
            self.op(op)?;
        }
        self.loc = last.loc;
        self.depth -= 1;
        match &last.kind {
            KOpKind::Yield(v) if last.results.is_empty() => Ok(v.clone()),
            _ => Err(bad!("region does not end in `yield`")),
        }
    }

    // ---- small builders ----

    fn iconst(&mut self, x: i64) -> Value {
        self.b.ins().iconst(I64, x)
    }
    fn i32c(&mut self, x: u32) -> Value {
        self.b.ins().iconst(I32, i64::from(x))
    }
    fn call(&mut self, h: H, args: &[Value]) -> Option<Value> {
        let inst = self.b.ins().call(self.fr[h as usize], args);
        self.b.inst_results(inst).first().copied()
    }
    fn sptr(&mut self, off: u32) -> Value {
        self.b.ins().iadd_imm_s(self.base, i64::from(off))
    }
    /// Scratch element `i` of a tile at `off` with elements of `ty`.
    fn ld(&mut self, ty: Type, off: u32, i: Value) -> Value {
        let sz = i64::from(ty.bytes());
        let t = self.b.ins().imul_imm_s(i, sz);
        let a = self.b.ins().iadd(self.base, t);
        self.b.ins().load(ty, flags_scratch(), a, off as i32)
    }
    /// A vector of `ty` starting at f32 element `i` of a tile.
    fn ldv(&mut self, ty: Type, off: u32, i: Value) -> Value {
        let bo = self.b.ins().imul_imm_s(i, 4);
        let a = self.b.ins().iadd(self.base, bo);
        self.b.ins().load(ty, flags_scratch(), a, off as i32)
    }
    fn st(&mut self, x: Value, off: u32, i: Value) {
        let ty = self.b.func.dfg.value_type(x);
        let sz = i64::from(ty.bytes());
        let t = self.b.ins().imul_imm_s(i, sz);
        let a = self.b.ins().iadd(self.base, t);
        self.b.ins().store(flags_scratch(), x, a, off as i32);
    }

    /// `for i in lo..hi step step { body(i) }` over i64 (step > 0 known at compile time).
    fn for_range(
        &mut self,
        lo: i64,
        hi: Value,
        step: i64,
        body: &mut dyn FnMut(&mut Self, Value) -> R<()>,
    ) -> R<()> {
        let header = self.b.create_block();
        let i = self.b.append_block_param(header, I64);
        let bb = self.b.create_block();
        let exit = self.b.create_block();
        let lo = self.iconst(lo);
        self.b.ins().jump(header, &[BlockArg::Value(lo)]);
        self.b.switch_to_block(header);
        let c = self.b.ins().icmp(IntCC::SignedLessThan, i, hi);
        self.b.ins().brif(c, bb, &[], exit, &[]);
        self.b.switch_to_block(bb);
        body(self, i)?;
        let n = self.b.ins().iadd_imm_s(i, step);
        self.b.ins().jump(header, &[BlockArg::Value(n)]);
        self.b.switch_to_block(exit);
        Ok(())
    }

    /// `body(i)` for `i = lo, lo + step, ... < hi`, a count known here: the vector loops over a tile's
    /// elements. Up to [`UNROLL_ALL`] iterations are emitted straight (constant offsets); more run as a loop
    /// with [`UNROLL`] bodies an iteration and the rest straight. (Cranelift reloads spilled values at every
    /// loop head, which cost more than a short body: a 48-iteration multiply of a `[3, 64]` tile spent half
    /// its instructions on reloads.)
    fn for_lanes(
        &mut self,
        lo: i64,
        hi: i64,
        step: i64,
        body: &mut dyn FnMut(&mut Self, Value) -> R<()>,
    ) -> R<()> {
        let count = if hi > lo {
            (hi - lo + step - 1) / step
        } else {
            0
        };
        if count <= UNROLL_ALL {
            for it in 0..count {
                let i = self.iconst(lo + it * step);
                body(self, i)?;
            }
            return Ok(());
        }
        let looped = count / UNROLL * UNROLL;
        let end = self.iconst(lo + looped * step);
        self.for_range(lo, end, UNROLL * step, &mut |l, i| {
            for u in 0..UNROLL {
                let iu = if u == 0 {
                    i
                } else {
                    l.b.ins().iadd_imm_s(i, u * step)
                };
                body(l, iu)?;
            }
            Ok(())
        })?;
        for it in looped..count {
            let i = self.iconst(lo + it * step);
            body(self, i)?;
        }
        Ok(())
    }

    fn for_n(&mut self, n: u32, body: &mut dyn FnMut(&mut Self, Value) -> R<()>) -> R<()> {
        let hi = self.iconst(i64::from(n));
        self.for_range(0, hi, 1, body)
    }

    /// Branches to an error exit returning `status` unless `ok`; `fill` writes the header in the error block.
    fn guard(&mut self, ok: Value, status: i32, fill: &mut dyn FnMut(&mut Self)) {
        let err = self.b.create_block();
        let cont = self.b.create_block();
        self.b.ins().brif(ok, cont, &[], err, &[]);
        self.b.switch_to_block(err);
        self.b.set_cold_block(err);
        fill(self);
        let s = self.b.ins().iconst(I32, i64::from(status));
        self.b.ins().return_(&[s]);
        self.b.switch_to_block(cont);
    }

    fn site(&mut self) -> u32 {
        self.sites.push(self.loc);
        (self.sites.len() - 1) as u32
    }

    fn alloc(&mut self, shape: &[u32], dtype: DType) -> R<TileV> {
        let n = shape
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(u64::from(d)));
        let n = match n {
            Some(n) if n <= MAX_TILE_ELEMENTS => n as u32,
            _ => {
                return Err(Fail::Unsupported(format!(
                    "tile {shape:?} exceeds {MAX_TILE_ELEMENTS} elements"
                )));
            }
        };
        let off = self.top.div_ceil(64) * 64;
        let end = u64::from(off) + u64::from(n.max(1)) * u64::from(csize(dtype));
        if end > u64::from(MAX_SCRATCH) {
            return Err(Fail::Unsupported(
                "kernel needs more than 1 GiB of tile scratch".into(),
            ));
        }
        self.top = end as u32;
        Ok(TileV {
            off,
            shape: shape.to_vec(),
            dtype,
            range: None,
            lazy: false,
            view: None,
        })
    }

    // ---- values ----

    fn decl(&self, v: KValue) -> R<&KType> {
        self.k
            .values
            .get(v.0 as usize)
            .map(|d| &d.ty)
            .ok_or_else(|| bad!("value #{} does not exist", v.0))
    }

    fn name(&self, v: KValue) -> String {
        self.k
            .values
            .get(v.0 as usize)
            .map(|d| d.name.clone())
            .unwrap_or_default()
    }

    fn def_scalar(&mut self, v: KValue, x: Value, dtype: DType) -> R<()> {
        if *self.decl(v)? != KType::Scalar(dtype) {
            return Err(bad!(
                "%{} is declared {} but its operation produces {dtype}",
                self.name(v),
                self.decl(v)?
            ));
        }
        let var = match self.env[v.0 as usize] {
            Some(Val::Scalar(var, d)) if d == dtype => var,
            _ => self.b.declare_var(cty(dtype)),
        };
        self.b.def_var(var, x);
        self.env[v.0 as usize] = Some(Val::Scalar(var, dtype));
        Ok(())
    }

    fn def_tile(&mut self, v: KValue, t: TileV) -> R<()> {
        let want = KType::Tile {
            shape: t.shape.clone(),
            dtype: t.dtype,
        };
        if *self.decl(v)? != want {
            return Err(bad!(
                "%{} is declared {} but its operation produces {want}",
                self.name(v),
                self.decl(v)?
            ));
        }
        self.env[v.0 as usize] = Some(Val::Tile(t));
        Ok(())
    }

    fn operand(&mut self, o: &KOperand) -> R<Opnd> {
        match o {
            KOperand::Value(v) => match self.env.get(v.0 as usize) {
                Some(Some(Val::Scalar(var, d))) => {
                    let (var, d) = (*var, *d);
                    Ok(Opnd::S(self.b.use_var(var), d))
                }
                Some(Some(Val::Tile(t))) => {
                    let t = t.clone();
                    Ok(Opnd::T(self.materialised(t)))
                }
                Some(None) => Err(bad!("%{} is used before it is defined", self.name(*v))),
                None => Err(bad!("value #{} does not exist", v.0)),
            },
            KOperand::Imm(imm, d) => {
                let d = *d;
                if d.is_quantized() {
                    return Err(bad!("{d} is a buffer layout, not a value type"));
                }
                let x = match (*imm, cty(d)) {
                    (KImm::F64(x), F32) if d.is_float() => {
                        self.b.ins().f32const(rt::round_to(d, x) as f32)
                    }
                    (KImm::I64(x), F32) if d.is_float() => {
                        // Integer immediates to a float dtype: one rounding from the integer (as the reference).
                        let bits =
                            rt::loom_cast_scalar(dtype_code(DType::I64), dtype_code(d), x as u64);
                        self.b.ins().f32const(f32::from_bits(bits as u32))
                    }
                    (KImm::F64(x), F64) if d == DType::F64 => self.b.ins().f64const(x),
                    (KImm::I64(x), F64) if d == DType::F64 => self.b.ins().f64const(x as f64),
                    (KImm::I64(x), I64) if rt::wrap(d, x) == x => self.iconst(x),
                    (KImm::I1(b), I64) if d == DType::I1 => self.iconst(i64::from(b)),
                    _ => return Err(bad!("immediate {imm:?} is not a {d} value")),
                };
                Ok(Opnd::S(x, d))
            }
        }
    }

    /// `o` as [`operand`](Self::operand) gives it, except that a lazy range tile stays lazy: for uses that
    /// read a range through its start and step (access indices, moved ranges).
    fn operand_lazy(&mut self, o: &KOperand) -> R<Opnd> {
        if let KOperand::Value(v) = o
            && let Some(Some(Val::Tile(t))) = self.env.get(v.0 as usize)
        {
            return Ok(Opnd::T(t.clone()));
        }
        self.operand(o)
    }

    /// `t` with its elements in scratch: a lazy range's are written here (where the reading operation is;
    /// a use in another branch or loop writes them again there).
    fn materialised(&mut self, mut t: TileV) -> TileV {
        if t.lazy {
            let r = t
                .range
                .unwrap_or_else(|| unreachable!("lazy tiles are ranges"));
            let s = self.b.use_var(r.start);
            let off = t.off;
            self.for_n(t.n(), &mut |l, j| {
                let x = l.range_at(s, r.step, j);
                l.st(x, off, j);
                Ok(())
            })
            .unwrap_or_else(|_| unreachable!("the body does not fail"));
            t.lazy = false;
        }
        t
    }

    fn scalar_i64(&mut self, o: &KOperand, what: &str) -> R<Value> {
        match self.operand(o)? {
            Opnd::S(x, DType::I64) => Ok(x),
            other => Err(bad!(
                "{what} must be an i64 scalar, got {:?}",
                other.dtype()
            )),
        }
    }

    fn wrap(&mut self, d: DType, x: Value) -> Value {
        let ins = |b: &mut FunctionBuilder<'_>, t: Type, signed: bool| {
            let r = b.ins().ireduce(t, x);
            if signed {
                b.ins().sextend(I64, r)
            } else {
                b.ins().uextend(I64, r)
            }
        };
        match d {
            DType::I32 => ins(&mut self.b, I32, true),
            DType::U32 => ins(&mut self.b, I32, false),
            DType::I16 => ins(&mut self.b, types::I16, true),
            DType::U16 => ins(&mut self.b, types::I16, false),
            DType::I8 => ins(&mut self.b, types::I8, true),
            DType::U8 => ins(&mut self.b, types::I8, false),
            DType::I1 => self.b.ins().band_imm_s(x, 1),
            _ => x,
        }
    }

    // ---- ops ----

    fn op(&mut self, op: &KOp) -> R<()> {
        use KOpKind as K;
        let one = |op: &KOp| -> R<KValue> {
            match op.results[..] {
                [r] => Ok(r),
                _ => Err(bad!(
                    "operation has {} results, expected 1",
                    op.results.len()
                )),
            }
        };
        match &op.kind {
            K::Yield(_) => Err(bad!("`yield` before the end of its region")),
            K::ProgramId { axis } => {
                let p = *self
                    .pid
                    .get(usize::from(*axis))
                    .ok_or_else(|| bad!("program_id axis {axis} (0..3)"))?;
                self.def_scalar(one(op)?, p, DType::I64)
            }
            K::Binary {
                op: bop,
                a: ka,
                b: kb,
            } => {
                let (a, b) = (self.operand_lazy(ka)?, self.operand_lazy(kb)?);
                let res = one(op)?;
                if let Some(r) = self.moved_range(*bop, &a, &b, kb) {
                    // A range moved: a lazy range too (its elements written only where they are read).
                    let t = self.alloc(&[self.range_len(&a, &b)], DType::I64)?;
                    return self.def_tile(
                        res,
                        TileV {
                            range: Some(r),
                            lazy: true,
                            ..t
                        },
                    );
                }
                let (a, b) = (self.materialise_opnd(a), self.materialise_opnd(b));
                self.binary(res, *bop, a, b)
            }
            K::Unary { op: uop, a } => {
                let a = self.operand(a)?;
                self.unary(one(op)?, *uop, a)
            }
            K::Cmp { op: cop, a, b } => {
                let (a, b) = (self.operand(a)?, self.operand(b)?);
                if a.dtype() != b.dtype() {
                    return Err(bad!("comparison of {} and {}", a.dtype(), b.dtype()));
                }
                let d = a.dtype();
                let cop = *cop;
                self.elementwise(one(op)?, DType::I1, &[a, b], false, &mut |l, v| {
                    Ok(l.cmp_val(cop, d, v[0], v[1]))
                })
            }
            K::Select { cond, a, b } => {
                let (c, a, b) = (self.operand(cond)?, self.operand(a)?, self.operand(b)?);
                if c.dtype() != DType::I1 || a.dtype() != b.dtype() {
                    return Err(bad!(
                        "select needs an i1 condition and operands of one type"
                    ));
                }
                let d = a.dtype();
                self.elementwise(one(op)?, d, &[c, a, b], false, &mut |l, v| {
                    Ok(l.b.ins().select(v[0], v[1], v[2]))
                })
            }
            K::Cast { a, to } => {
                let a = self.operand(a)?;
                self.cast(one(op)?, a, *to)
            }
            K::Range { start, len } => {
                let s = self.scalar_i64(start, "range start")?;
                let t = self.alloc(&[*len], DType::I64)?;
                let var = self.b.declare_var(I64);
                self.b.def_var(var, s);
                // Lazy: the elements are written where an operation reads them (`materialised`).
                self.def_tile(
                    one(op)?,
                    TileV {
                        range: Some(RangeV {
                            start: var,
                            step: 1,
                        }),
                        lazy: true,
                        ..t
                    },
                )
            }
            K::Full {
                value,
                shape,
                dtype,
            } => {
                let x = match self.operand(value)? {
                    Opnd::S(x, d) if d == *dtype => x,
                    _ => return Err(bad!("full value must be a {dtype} scalar")),
                };
                let t = self.alloc(shape, *dtype)?;
                let zero = match value {
                    KOperand::Imm(KImm::F64(z), _) => *z == 0.0 && z.is_sign_positive(),
                    KOperand::Imm(KImm::I64(z), _) => *z == 0,
                    _ => false,
                };
                let res = one(op)?;
                // Zeros that only f32 dots' accumulators read are never read (see `dot_acc_only`).
                let unread = zero
                    && *dtype == DType::F32
                    && self.dot_acc_only.get(res.0 as usize) == Some(&true);
                if !unread {
                    self.fill(&t, x)?;
                }
                if zero && *dtype == DType::F32 {
                    self.zero_tiles.insert(res.0);
                }
                self.def_tile(res, t)
            }
            K::Broadcast { a, shape } => {
                let a = self.operand(a)?;
                self.broadcast(one(op)?, a, shape)
            }
            K::ExpandDims { a, axis } => {
                let a = self.operand(a)?;
                let t = self.as_tile(a)?;
                let axis = usize::from(*axis);
                if axis > t.shape.len() {
                    return Err(bad!(
                        "expand_dims axis {axis} of a rank-{} tile",
                        t.shape.len()
                    ));
                }
                let mut shape = t.shape.clone();
                shape.insert(axis, 1);
                self.def_tile(
                    one(op)?,
                    TileV {
                        shape,
                        range: None,
                        ..t
                    },
                )
            }
            K::Reshape { a, shape } => {
                let a = self.operand(a)?;
                let t = self.as_tile(a)?;
                let n: u64 = shape.iter().map(|&d| u64::from(d)).product();
                if n != u64::from(t.n()) {
                    return Err(bad!("cannot reshape {:?} to {shape:?}", t.shape));
                }
                self.def_tile(
                    one(op)?,
                    TileV {
                        shape: shape.clone(),
                        range: None,
                        ..t
                    },
                )
            }
            K::Transpose { a } => {
                let Opnd::T(t) = self.operand(a)? else {
                    return Err(bad!("transpose needs a 2-D tile"));
                };
                let [r, c] = t.shape[..] else {
                    return Err(bad!("transpose needs a 2-D tile, got {:?}", t.shape));
                };
                let res = one(op)?;
                if t.dtype == DType::F32 && self.dot_b_only.get(res.0 as usize) == Some(&true) {
                    // Only dots read it: they read `t`'s storage transposed (no copy). The value is `t`'s
                    // storage under the transposed shape, which nothing but those dots sees.
                    self.transposed.insert(res.0);
                    return self.def_tile(
                        res,
                        TileV {
                            shape: vec![c, r],
                            range: None,
                            ..t
                        },
                    );
                }
                let o = self.alloc(&[c, r], t.dtype)?;
                let ty = cty(t.dtype);
                let (so, d) = (t.off, o.off);
                self.nest2(&[c, r], &[1, i64::from(c)], &mut |l, src, dst| {
                    let x = l.ld(ty, so, src);
                    l.st(x, d, dst);
                    Ok(())
                })?;
                self.def_tile(one(op)?, o)
            }
            K::Reduce { op: rop, a, axis } => {
                let Opnd::T(t) = self.operand(a)? else {
                    return Err(bad!("reduce needs a tile"));
                };
                let axis = usize::from(*axis);
                if axis >= t.shape.len() {
                    return Err(bad!("reduce axis {axis} of {:?}", t.shape));
                }
                let outer: u32 = t.shape[..axis].iter().product();
                let len = t.shape[axis];
                let inner: u32 = t.shape[axis + 1..].iter().product();
                let mut shape = t.shape.clone();
                shape.remove(axis);
                if shape.is_empty() {
                    shape.push(1);
                }
                let o = self.alloc(&shape, t.dtype)?;
                let args = [
                    self.i32c(rt::reduce_code(*rop)),
                    self.i32c(dtype_code(t.dtype)),
                    self.sptr(t.off),
                    self.sptr(o.off),
                    self.iconst(i64::from(outer)),
                    self.iconst(i64::from(len)),
                    self.iconst(i64::from(inner)),
                ];
                self.call(H::Reduce, &args);
                self.def_tile(one(op)?, o)
            }
            K::Dot { a, b, acc } => {
                let bt = match b {
                    KOperand::Value(v) => self.transposed.contains(&v.0),
                    KOperand::Imm(..) => false,
                };
                let acc_zero = match acc {
                    KOperand::Value(v) => self.zero_tiles.contains(&v.0),
                    KOperand::Imm(..) => false,
                };
                let (a, b, c) = (self.operand(a)?, self.operand(b)?, self.operand(acc)?);
                let (Opnd::T(a), Opnd::T(b), Opnd::T(c)) = (a, b, c) else {
                    return Err(bad!("dot operands must be 2-D tiles"));
                };
                // A transposed b has its logical [k, n] shape over its source's [n, k] storage.
                let ([m, k], [k2, n]) = (&a.shape[..], &b.shape[..]) else {
                    return Err(bad!("dot operands must be 2-D tiles"));
                };
                let (m, k, n) = (*m, *k, *n);
                if k != *k2
                    || c.shape != [m, n]
                    || !a.dtype.is_float()
                    || a.dtype != b.dtype
                    || c.dtype != DType::F32
                {
                    return Err(bad!("dot shapes or types do not line up"));
                }
                let o = self.alloc(&[m, n], DType::F32)?;
                // An operand's rows and their stride: a view's (see `load`), or the tile's own.
                // A view's third part: 0 for f32 rows, 1 / 2 for f16 / bf16 rows the dot converts.
                let rows = |l: &mut Self, t: &TileV, cols: u32| match t.view {
                    Some(v) => (
                        l.b.use_var(v.ptr),
                        l.b.use_var(v.ld),
                        Some(l.b.use_var(v.half)),
                    ),
                    None => (l.sptr(t.off), l.iconst(i64::from(cols)), None),
                };
                let (ap, lda, ah) = rows(self, &a, k);
                let (bp, ldb, bh) = rows(self, &b, if bt { k } else { n });
                let mut flags = self.i32c(
                    u32::from(a.dtype == DType::F64)
                        | (u32::from(bt) << 1)
                        | (u32::from(acc_zero) << 2),
                );
                for (h, shift) in [(ah, 3), (bh, 5)] {
                    if let Some(h) = h {
                        let s = self.b.ins().ishl_imm_s(h, shift);
                        flags = self.b.ins().bor(flags, s);
                    }
                }
                let args = [
                    flags,
                    ap,
                    bp,
                    self.sptr(c.off),
                    self.sptr(o.off),
                    self.iconst(i64::from(m)),
                    self.iconst(i64::from(k)),
                    self.iconst(i64::from(n)),
                    lda,
                    ldb,
                ];
                self.call(H::Dot, &args);
                self.def_tile(one(op)?, o)
            }
            K::Load {
                param,
                indices,
                fill,
            } => {
                let r = one(op)?;
                self.load(r, *param, indices, fill.as_ref())
            }
            K::Store {
                param,
                indices,
                value,
            } => {
                if !op.results.is_empty() {
                    return Err(bad!("store has no results"));
                }
                self.store(*param, indices, value)
            }
            K::For {
                lo,
                hi,
                step,
                iv,
                iters,
                inits,
                body,
            } => self.for_op(op, lo, hi, step, *iv, iters, inits, body),
            K::If {
                cond,
                then_region,
                else_region,
            } => self.if_op(op, cond, then_region, else_region),
        }
    }

    fn as_tile(&mut self, a: Opnd) -> R<TileV> {
        match a {
            Opnd::T(t) => Ok(t),
            Opnd::S(x, d) => {
                // A scalar used as a 1-element tile.
                let t = self.alloc(&[], d)?;
                let z = self.iconst(0);
                self.st(x, t.off, z);
                Ok(t)
            }
        }
    }

    fn fill(&mut self, t: &TileV, x: Value) -> R<()> {
        let off = t.off;
        let ty = self.b.func.dfg.value_type(x);
        let lanes = 16 / ty.bytes();
        let (n, f) = (t.n(), flags_buf());
        let nv = n / lanes * lanes;
        if nv > 0 {
            // Sixteen bytes at a time.
            let vt = ty.by(lanes).unwrap_or(types::I8X16);
            let v = self.b.ins().splat(vt, x);
            let size = i64::from(ty.bytes());
            self.for_lanes(0, i64::from(nv), i64::from(lanes), &mut |l, i| {
                let bo = l.b.ins().imul_imm_s(i, size);
                let a = l.b.ins().iadd(l.base, bo);
                l.b.ins().store(f, v, a, off as i32);
                Ok(())
            })?;
        }
        for i in nv..n {
            let i = self.iconst(i64::from(i));
            self.st(x, off, i);
        }
        Ok(())
    }

    /// Nested loops over `dims` (row-major); `sa` are source strides; the destination index is row-major.
    fn nest2(
        &mut self,
        dims: &[u32],
        sa: &[i64],
        body: &mut dyn FnMut(&mut Self, Value, Value) -> R<()>,
    ) -> R<()> {
        let z = self.iconst(0);
        self.nest2_at(dims, sa, 0, z, z, body)
    }

    fn nest2_at(
        &mut self,
        dims: &[u32],
        sa: &[i64],
        level: usize,
        src: Value,
        dst: Value,
        body: &mut dyn FnMut(&mut Self, Value, Value) -> R<()>,
    ) -> R<()> {
        if level == dims.len() {
            return body(self, src, dst);
        }
        let len = dims[level];
        let st = sa[level];
        self.for_n(len, &mut |l, j| {
            let s1 = l.b.ins().imul_imm_s(j, st);
            let s = l.b.ins().iadd(src, s1);
            let d0 = l.b.ins().imul_imm_s(dst, i64::from(len));
            let d = l.b.ins().iadd(d0, j);
            l.nest2_at(dims, sa, level + 1, s, d, body)
        })
    }

    /// An elementwise op: scalars broadcast over tiles of one shape; `f` computes one element.
    fn elementwise(
        &mut self,
        res: KValue,
        out: DType,
        ins: &[Opnd],
        round: bool,
        f: &mut dyn FnMut(&mut Self, &[Value]) -> R<Value>,
    ) -> R<()> {
        let mut shape: Option<Vec<u32>> = None;
        for o in ins {
            if let Opnd::T(t) = o {
                match &shape {
                    None => shape = Some(t.shape.clone()),
                    Some(s) if *s == t.shape => {}
                    Some(s) => {
                        return Err(bad!(
                            "elementwise operands {s:?} and {:?} differ in shape",
                            t.shape
                        ));
                    }
                }
            }
        }
        let Some(shape) = shape else {
            let v: Vec<Value> = ins
                .iter()
                .map(|o| {
                    if let Opnd::S(x, _) = o {
                        *x
                    } else {
                        unreachable!()
                    }
                })
                .collect();
            let mut r = f(self, &v)?;
            if round && is_half(out) {
                let c = self.i32c(dtype_code(out));
                r = self.call(H::RoundScalar, &[c, r]).unwrap_or(r);
            }
            return self.def_scalar(res, r, out);
        };
        let t = self.alloc(&shape, out)?;
        let off = t.off;
        self.for_n(t.n(), &mut |l, i| {
            let v: Vec<Value> = ins
                .iter()
                .map(|o| match o {
                    Opnd::S(x, _) => *x,
                    Opnd::T(s) => l.ld(cty(s.dtype), s.off, i),
                })
                .collect();
            let r = f(l, &v)?;
            l.st(r, off, i);
            Ok(())
        })?;
        if round && is_half(out) {
            let args = [
                self.i32c(dtype_code(out)),
                self.sptr(off),
                self.iconst(i64::from(t.n())),
            ];
            self.call(H::RoundTile, &args);
        }
        self.def_tile(res, t)
    }

    /// The range of `a op b` when it is one: a one-dimensional i64 range tile plus or minus a scalar (either
    /// order for `add`), or times a positive immediate (`kb`, the operand as written). The elements are
    /// still computed into the result tile as usual; the range only lets accesses skip reading them.
    fn moved_range(&mut self, op: BinOp, a: &Opnd, b: &Opnd, kb: &KOperand) -> Option<RangeV> {
        let (t, x, tile_first) = match (a, b) {
            (Opnd::T(t), Opnd::S(x, DType::I64)) => (t, *x, true),
            (Opnd::S(x, DType::I64), Opnd::T(t)) => (t, *x, false),
            _ => return None,
        };
        let r = t
            .range
            .filter(|_| t.dtype == DType::I64 && t.shape.len() == 1)?;
        let s = self.b.use_var(r.start);
        let (start, step) = match op {
            BinOp::Add => (self.b.ins().iadd(s, x), r.step),
            BinOp::Sub if tile_first => (self.b.ins().isub(s, x), r.step),
            BinOp::Mul if tile_first => {
                let c = match kb {
                    KOperand::Imm(KImm::I64(c), DType::I64) if *c > 0 => *c,
                    _ => return None,
                };
                (self.b.ins().imul(s, x), r.step.checked_mul(c)?)
            }
            _ => return None,
        };
        let var = self.b.declare_var(I64);
        self.b.def_var(var, start);
        Some(RangeV { start: var, step })
    }

    /// The length of the one tile operand of a [`moved_range`](Self::moved_range).
    fn range_len(&self, a: &Opnd, b: &Opnd) -> u32 {
        match (a, b) {
            (Opnd::T(t), _) | (_, Opnd::T(t)) => t.n(),
            _ => unreachable!("a moved range has a tile operand"),
        }
    }

    fn materialise_opnd(&mut self, o: Opnd) -> Opnd {
        match o {
            Opnd::T(t) => Opnd::T(self.materialised(t)),
            s => s,
        }
    }

    fn binary(&mut self, res: KValue, op: BinOp, a: Opnd, b: Opnd) -> R<()> {
        if a.dtype() != b.dtype() {
            return Err(bad!(
                "`{op:?}`: operand types {} and {} differ (cast explicitly)",
                a.dtype(),
                b.dtype()
            ));
        }
        let d = a.dtype();
        if d.is_float()
            && !matches!(
                op,
                BinOp::Add
                    | BinOp::Sub
                    | BinOp::Mul
                    | BinOp::Div
                    | BinOp::Rem
                    | BinOp::Min
                    | BinOp::Max
            )
        {
            return Err(bad!("`{op:?}` is not defined on {d}"));
        }
        // f32 add/sub/mul/div over tiles: four lanes at a time.
        if d == DType::F32 && matches!(op, BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div) {
            if let Some(shape) = match (&a, &b) {
                (Opnd::T(x), Opnd::T(y)) if x.shape == y.shape => Some(x.shape.clone()),
                (Opnd::T(x), Opnd::S(..)) | (Opnd::S(..), Opnd::T(x)) => Some(x.shape.clone()),
                _ => None,
            } {
                return self.binary_f32x4(res, op, &shape, a, b);
            }
        }
        let site = if matches!(op, BinOp::Div | BinOp::Rem) && !d.is_float() {
            self.site()
        } else {
            0
        };
        self.elementwise(res, d, &[a, b], true, &mut |l, v| {
            l.bin_val(op, d, v[0], v[1], site)
        })
    }

    fn binary_f32x4(&mut self, res: KValue, op: BinOp, shape: &[u32], a: Opnd, b: Opnd) -> R<()> {
        let t = self.alloc(shape, DType::F32)?;
        let n = t.n();
        if n >= BIN_TILE_MIN {
            // A long tile: one call of the sixteen-lane helper (the same IEEE operations, so the same bits).
            let code = match op {
                BinOp::Add => 0,
                BinOp::Sub => 1,
                BinOp::Mul => 2,
                _ => 3,
            };
            let (mode, s) = match (&a, &b) {
                (_, Opnd::S(x, _)) => (1, *x),
                (Opnd::S(x, _), _) => (2, *x),
                _ => (0, self.b.ins().f32const(0.0)),
            };
            let ptr = |l: &mut Self, o: &Opnd| match o {
                Opnd::T(t) => l.sptr(t.off),
                Opnd::S(..) => l.iconst(0),
            };
            let args = [
                self.i32c(code),
                ptr(self, &a),
                ptr(self, &b),
                s,
                self.sptr(t.off),
                self.iconst(i64::from(n)),
                self.i32c(mode),
            ];
            self.call(H::BinTile, &args);
            return self.def_tile(res, t);
        }
        let n4 = n / 4 * 4;
        let v4 = types::F32X4;
        let splat = |l: &mut Self, o: &Opnd| match o {
            Opnd::S(x, _) => Some(l.b.ins().splat(v4, *x)),
            Opnd::T(_) => None,
        };
        let (sa, sb) = (splat(self, &a), splat(self, &b));
        let off = t.off;
        let apply = |l: &mut Self, x: Value, y: Value| match op {
            BinOp::Add => l.b.ins().fadd(x, y),
            BinOp::Sub => l.b.ins().fsub(x, y),
            BinOp::Mul => l.b.ins().fmul(x, y),
            _ => l.b.ins().fdiv(x, y),
        };
        // `i` counts elements; a vector is 16 bytes, so the byte offset is i * 4.
        self.for_lanes(0, i64::from(n4), 4, &mut |l, i| {
            let get = |l: &mut Self, o: &Opnd, s: Option<Value>| match (o, s) {
                (_, Some(s)) => s,
                (Opnd::T(t), None) => l.ldv(v4, t.off, i),
                _ => unreachable!(),
            };
            let x = get(l, &a, sa);
            let y = get(l, &b, sb);
            let r = apply(l, x, y);
            let bo = l.b.ins().imul_imm_s(i, 4);
            let ad = l.b.ins().iadd(l.base, bo);
            l.b.ins().store(flags_scratch(), r, ad, off as i32);
            Ok(())
        })?;
        if n4 < n {
            self.for_lanes(i64::from(n4), i64::from(n), 1, &mut |l, i| {
                let get = |l: &mut Self, o: &Opnd| match o {
                    Opnd::S(x, _) => *x,
                    Opnd::T(t) => l.ld(F32, t.off, i),
                };
                let (x, y) = (get(l, &a), get(l, &b));
                let r = apply(l, x, y);
                l.st(r, off, i);
                Ok(())
            })?;
        }
        self.def_tile(res, t)
    }

    fn bin_val(&mut self, op: BinOp, d: DType, x: Value, y: Value, site: u32) -> R<Value> {
        let ty = cty(d);
        if ty != I64 {
            let ins = self.b.ins();
            return Ok(match op {
                BinOp::Add => ins.fadd(x, y),
                BinOp::Sub => ins.fsub(x, y),
                BinOp::Mul => ins.fmul(x, y),
                BinOp::Div => ins.fdiv(x, y),
                BinOp::Rem => {
                    let (x, y) = if ty == F32 {
                        (self.b.ins().fpromote(F64, x), self.b.ins().fpromote(F64, y))
                    } else {
                        (x, y)
                    };
                    let r = self.call(H::Fmod, &[x, y]).unwrap_or(x);
                    if ty == F32 {
                        self.b.ins().fdemote(F32, r)
                    } else {
                        r
                    }
                }
                // IEEE minNum/maxNum: a NaN operand is ignored.
                BinOp::Min | BinOp::Max => {
                    let cc = if op == BinOp::Min {
                        FloatCC::LessThan
                    } else {
                        FloatCC::GreaterThan
                    };
                    let c = self.b.ins().fcmp(cc, y, x);
                    let r = self.b.ins().select(c, y, x);
                    let nan = self.b.ins().fcmp(FloatCC::Unordered, x, x);
                    self.b.ins().select(nan, y, r)
                }
                _ => return Err(bad!("`{op:?}` is not defined on {d}")),
            });
        }
        let r = match op {
            BinOp::Add => self.b.ins().iadd(x, y),
            BinOp::Sub => self.b.ins().isub(x, y),
            BinOp::Mul => self.b.ins().imul(x, y),
            BinOp::Div | BinOp::Rem => {
                let nz = self.b.ins().icmp_imm_s(IntCC::NotEqual, y, 0);
                self.guard(nz, ST_DIV0, &mut |l| {
                    let s = l.i32c(site);
                    l.b.ins().store(flags_scratch(), s, l.base, 0);
                });
                // x / -1 is computed as a negation: `sdiv` would trap on MIN / -1, which wraps here.
                let m1 = self.b.ins().icmp_imm_s(IntCC::Equal, y, -1);
                let one = self.iconst(1);
                let ys = self.b.ins().select(m1, one, y);
                if op == BinOp::Div {
                    let q = self.b.ins().sdiv(x, ys);
                    let neg = self.b.ins().ineg(x);
                    self.b.ins().select(m1, neg, q)
                } else {
                    let q = self.b.ins().srem(x, ys);
                    let z = self.iconst(0);
                    self.b.ins().select(m1, z, q)
                }
            }
            BinOp::Min | BinOp::Max => {
                let cc = if op == BinOp::Min {
                    IntCC::SignedLessThan
                } else {
                    IntCC::SignedGreaterThan
                };
                let c = self.b.ins().icmp(cc, x, y);
                self.b.ins().select(c, x, y)
            }
            BinOp::And => self.b.ins().band(x, y),
            BinOp::Or => self.b.ins().bor(x, y),
            BinOp::Xor => self.b.ins().bxor(x, y),
            BinOp::Shl | BinOp::Shr => {
                let bits: i64 = match d {
                    DType::I32 | DType::U32 => 32,
                    DType::I16 | DType::U16 => 16,
                    DType::I8 | DType::U8 => 8,
                    DType::I1 => 1,
                    _ => 64,
                };
                let amt = self.b.ins().band_imm_s(y, bits - 1);
                if op == BinOp::Shl {
                    self.b.ins().ishl(x, amt)
                } else {
                    self.b.ins().sshr(x, amt)
                }
            }
        };
        Ok(self.wrap(d, r))
    }

    fn cmp_val(&mut self, op: CmpOp, d: DType, x: Value, y: Value) -> Value {
        let c = if cty(d) == I64 {
            let cc = match op {
                CmpOp::Eq => IntCC::Equal,
                CmpOp::Ne => IntCC::NotEqual,
                CmpOp::Lt => IntCC::SignedLessThan,
                CmpOp::Le => IntCC::SignedLessThanOrEqual,
                CmpOp::Gt => IntCC::SignedGreaterThan,
                CmpOp::Ge => IntCC::SignedGreaterThanOrEqual,
            };
            self.b.ins().icmp(cc, x, y)
        } else {
            // IEEE: everything but `Ne` is false with a NaN (Cranelift's NotEqual is "unordered or unequal").
            let cc = match op {
                CmpOp::Eq => FloatCC::Equal,
                CmpOp::Ne => FloatCC::NotEqual,
                CmpOp::Lt => FloatCC::LessThan,
                CmpOp::Le => FloatCC::LessThanOrEqual,
                CmpOp::Gt => FloatCC::GreaterThan,
                CmpOp::Ge => FloatCC::GreaterThanOrEqual,
            };
            self.b.ins().fcmp(cc, x, y)
        };
        self.b.ins().uextend(I64, c)
    }

    fn unary(&mut self, res: KValue, op: UnOp, a: Opnd) -> R<()> {
        let d = a.dtype();
        if cty(d) == I64 {
            if !matches!(op, UnOp::Neg | UnOp::Abs | UnOp::Not) {
                return Err(bad!("`{op:?}` is not defined on {d}"));
            }
            return self.elementwise(res, d, &[a], false, &mut |l, v| {
                let r = match op {
                    UnOp::Neg => l.b.ins().ineg(v[0]),
                    UnOp::Abs => l.b.ins().iabs(v[0]),
                    _ => l.b.ins().bnot(v[0]),
                };
                Ok(l.wrap(d, r))
            });
        }
        match op {
            UnOp::Not => Err(bad!("`Not` is not defined on {d}")),
            UnOp::Neg | UnOp::Abs | UnOp::Sqrt => {
                self.elementwise(res, d, &[a], true, &mut |l, v| {
                    Ok(match op {
                        UnOp::Neg => l.b.ins().fneg(v[0]),
                        UnOp::Abs => l.b.ins().fabs(v[0]),
                        _ => l.b.ins().sqrt(v[0]),
                    })
                })
            }
            _ => match a {
                Opnd::S(x, _) => {
                    let x64 = if cty(d) == F32 {
                        self.b.ins().fpromote(F64, x)
                    } else {
                        x
                    };
                    let args = [self.i32c(rt::unop_code(op)), self.i32c(dtype_code(d)), x64];
                    let r = self.call(H::UnaryScalar, &args).unwrap_or(x64);
                    let r = if cty(d) == F32 {
                        self.b.ins().fdemote(F32, r)
                    } else {
                        r
                    };
                    self.def_scalar(res, r, d)
                }
                Opnd::T(t) => {
                    let o = self.alloc(&t.shape, d)?;
                    let args = [
                        self.i32c(rt::unop_code(op)),
                        self.i32c(dtype_code(d)),
                        self.sptr(t.off),
                        self.sptr(o.off),
                        self.iconst(i64::from(t.n())),
                    ];
                    self.call(H::UnaryTile, &args);
                    self.def_tile(res, o)
                }
            },
        }
    }

    fn bits_of(&mut self, x: Value, d: DType) -> Value {
        match cty(d) {
            F32 => {
                let b = self.b.ins().bitcast(I32, MemFlagsData::new(), x);
                self.b.ins().uextend(I64, b)
            }
            F64 => self.b.ins().bitcast(I64, MemFlagsData::new(), x),
            _ => x,
        }
    }

    fn of_bits(&mut self, x: Value, d: DType) -> Value {
        match cty(d) {
            F32 => {
                let b = self.b.ins().ireduce(I32, x);
                self.b.ins().bitcast(F32, MemFlagsData::new(), b)
            }
            F64 => self.b.ins().bitcast(F64, MemFlagsData::new(), x),
            _ => x,
        }
    }

    /// Whether [`Self::cast_native`] lowers the cast `from -> to` inline (everything but a cast to f16/bf16,
    /// which needs the runtime's rounding to 11 / 8 significant bits, and identity casts of those types).
    fn cast_is_native(from: DType, to: DType) -> bool {
        from == to || !is_half(to)
    }

    /// The cast `from -> to` of one storage-class value, inline, with the reference's semantics
    /// (`loom_reference` `ops::cast`, the same as `rt::cast_bits`):
    /// * float to float: `round_to(to, x)`; f16/bf16/f32 share f32 storage, so to f32 it is the value itself,
    ///   f64 to f32 rounds to nearest even (`fdemote`), to f64 is exact (`fpromote`);
    /// * float to integer: NaN gives 0, `x <= MIN` gives MIN, `x >= MAX` gives MAX, otherwise `trunc(x)`:
    ///   exactly a saturating truncation to i64 (`fcvt_to_sint_sat`, which maps NaN to 0) clamped to the
    ///   type's range (truncation is monotonic and the range bounds are integers);
    /// * float to i1: `x != 0.0` (NaN gives 1);
    /// * integer to f32/f64: one rounding from the i64 (`fcvt_from_sint`, x86 `cvtsi2ss/sd` with a 64-bit
    ///   source: round to nearest even, no double rounding);
    /// * integer to integer: two's-complement truncation and sign or zero extension; to i1: `x != 0`.
    fn cast_native(&mut self, x: Value, from: DType, to: DType) -> Value {
        if from == to {
            return x;
        }
        let (fc, tc) = (cty(from), cty(to));
        if from.is_float() {
            if to.is_float() {
                return match (fc, tc) {
                    (F64, F32) => self.b.ins().fdemote(F32, x),
                    (F32, F64) => self.b.ins().fpromote(F64, x),
                    _ => x,
                };
            }
            if to == DType::I1 {
                let z = if fc == F32 {
                    self.b.ins().f32const(0.0)
                } else {
                    self.b.ins().f64const(0.0)
                };
                let c = self.b.ins().fcmp(FloatCC::NotEqual, x, z);
                return self.b.ins().uextend(I64, c);
            }
            let r = self.b.ins().fcvt_to_sint_sat(I64, x);
            let (lo, hi) = to.int_range();
            if (lo, hi) == (i64::MIN, i64::MAX) {
                return r;
            }
            let (lo, hi) = (self.iconst(lo), self.iconst(hi));
            let r = self.b.ins().smax(r, lo);
            return self.b.ins().smin(r, hi);
        }
        if to.is_float() {
            return self.b.ins().fcvt_from_sint(tc, x);
        }
        if to == DType::I1 {
            let c = self.b.ins().icmp_imm_s(IntCC::NotEqual, x, 0);
            return self.b.ins().uextend(I64, c);
        }
        self.wrap(to, x)
    }

    fn cast(&mut self, res: KValue, a: Opnd, to: DType) -> R<()> {
        if to.is_quantized() {
            return Err(bad!("cast to quantised type {to}"));
        }
        let from = a.dtype();
        match a {
            Opnd::S(x, _) if Self::cast_is_native(from, to) => {
                let r = self.cast_native(x, from, to);
                self.def_scalar(res, r, to)
            }
            Opnd::S(x, _) => {
                let bits = self.bits_of(x, from);
                let args = [self.i32c(dtype_code(from)), self.i32c(dtype_code(to)), bits];
                let r = self.call(H::CastScalar, &args).unwrap_or(bits);
                let r = self.of_bits(r, to);
                self.def_scalar(res, r, to)
            }
            // f16 and bf16 tiles hold their values in f32 storage already (NaNs quiet, as the reference's):
            // the cast to f32 is the same storage, shared like a reshape's.
            Opnd::T(t) if is_half(from) && to == DType::F32 => self.def_tile(
                res,
                TileV {
                    dtype: DType::F32,
                    range: None,
                    ..t
                },
            ),
            Opnd::T(t) => {
                let o = self.alloc(&t.shape, to)?;
                if Self::cast_is_native(from, to) {
                    let (s, d) = (t.off, o.off);
                    self.for_n(t.n(), &mut |l, i| {
                        let x = l.ld(cty(from), s, i);
                        let r = l.cast_native(x, from, to);
                        l.st(r, d, i);
                        Ok(())
                    })?;
                } else {
                    let args = [
                        self.i32c(dtype_code(from)),
                        self.i32c(dtype_code(to)),
                        self.sptr(t.off),
                        self.sptr(o.off),
                        self.iconst(i64::from(t.n())),
                    ];
                    self.call(H::CastTile, &args);
                }
                self.def_tile(res, o)
            }
        }
    }

    fn broadcast(&mut self, res: KValue, a: Opnd, target: &[u32]) -> R<()> {
        let t = match a {
            Opnd::S(x, d) => {
                let o = self.alloc(target, d)?;
                self.fill(&o, x)?;
                return self.def_tile(res, o);
            }
            Opnd::T(t) => t,
        };
        if t.shape.len() > target.len() {
            return Err(bad!(
                "cannot broadcast {:?} to a lower rank {target:?}",
                t.shape
            ));
        }
        let off = target.len() - t.shape.len();
        let mut src = vec![0i64; t.shape.len()];
        for d in (0..t.shape.len()).rev() {
            src[d] = if d + 1 == t.shape.len() {
                1
            } else {
                src[d + 1] * i64::from(t.shape[d + 1])
            };
        }
        let mut st = vec![0i64; target.len()];
        for (i, &d) in t.shape.iter().enumerate() {
            if d == target[off + i] {
                st[off + i] = src[i];
            } else if d != 1 {
                return Err(bad!("cannot broadcast {:?} to {target:?}", t.shape));
            }
        }
        let o = self.alloc(target, t.dtype)?;
        let ty = cty(t.dtype);
        let (so, d) = (t.off, o.off);
        let last = target.len() - 1;
        let n = target[last];
        let (size, lanes) = (ty.bytes(), 16 / ty.bytes());
        if n >= lanes && (st[last] == 1 || st[last] == 0) {
            // Rows sixteen bytes at a time: a row of the source repeated (stride 1) or one element splat
            // (stride 0) over the last dimension.
            let (splat, nv) = (st[last] == 0, n / lanes * lanes);
            let vt = ty.by(lanes).unwrap_or(types::I8X16);
            let (f, size) = (flags_buf(), i64::from(size));
            return self
                .nest2(&target[..last], &st[..last], &mut |l, s, row| {
                    let r0 = l.b.ins().imul_imm_s(row, i64::from(n));
                    let one = if splat {
                        let x = l.ld(ty, so, s);
                        Some((x, l.b.ins().splat(vt, x)))
                    } else {
                        None
                    };
                    l.for_lanes(0, i64::from(nv), i64::from(lanes), &mut |l, j| {
                        let v = match one {
                            Some((_, v)) => v,
                            None => {
                                let sj = l.b.ins().iadd(s, j);
                                let sb = l.b.ins().imul_imm_s(sj, size);
                                let sa = l.b.ins().iadd(l.base, sb);
                                l.b.ins().load(vt, f, sa, so as i32)
                            }
                        };
                        let dj = l.b.ins().iadd(r0, j);
                        let db = l.b.ins().imul_imm_s(dj, size);
                        let da = l.b.ins().iadd(l.base, db);
                        l.b.ins().store(f, v, da, d as i32);
                        Ok(())
                    })?;
                    for j in nv..n {
                        let j = l.iconst(i64::from(j));
                        let x = match one {
                            Some((x, _)) => x,
                            None => {
                                let sj = l.b.ins().iadd(s, j);
                                l.ld(ty, so, sj)
                            }
                        };
                        let dj = l.b.ins().iadd(r0, j);
                        l.st(x, d, dj);
                    }
                    Ok(())
                })
                .and_then(|()| self.def_tile(res, o));
        }
        self.nest2(target, &st, &mut |l, s, di| {
            let x = l.ld(ty, so, s);
            l.st(x, d, di);
            Ok(())
        })?;
        self.def_tile(res, o)
    }

    /// Copies `n` elements of `ty` between scratch tiles, sixteen bytes at a time.
    fn copy_scratch(&mut self, ty: Type, from: u32, to: u32, n: u32) -> R<()> {
        let bytes = n * ty.bytes();
        let (v16, f) = (bytes / 16 * 16, flags_buf());
        if v16 > 0 {
            self.for_lanes(0, i64::from(v16), 16, &mut |l, b| {
                let a = l.b.ins().iadd(l.base, b);
                let x = l.b.ins().load(types::I8X16, f, a, from as i32);
                l.b.ins().store(f, x, a, to as i32);
                Ok(())
            })?;
        }
        for i in (v16 / ty.bytes())..n {
            let i = self.iconst(i64::from(i));
            let x = self.ld(ty, from, i);
            self.st(x, to, i);
        }
        Ok(())
    }

    // ---- buffers ----

    fn buf_ptr(&mut self, param: u32) -> Value {
        self.b
            .ins()
            .load(I64, flags_scratch(), self.desc, (param * 16) as i32)
    }

    fn buf_addr(&mut self, ptr: Value, g: Value, size: i64) -> Value {
        let o = self.b.ins().imul_imm_s(g, size);
        self.b.ins().iadd(ptr, o)
    }

    /// Reads element `g` of a buffer of `dtype` as its storage-class value.
    fn read_buf(&mut self, dtype: DType, ptr: Value, g: Value) -> Value {
        let f = flags_buf();
        if dtype.is_quantized() {
            let c = self.i32c(dtype_code(dtype));
            return self.call(H::Dequant, &[c, ptr, g]).unwrap_or(g);
        }
        let size = dtype.size().unwrap_or(1) as i64;
        let a = self.buf_addr(ptr, g, size);
        let ins = self.b.ins();
        match dtype {
            DType::F32 => ins.load(F32, f, a, 0),
            DType::F64 => ins.load(F64, f, a, 0),
            DType::BF16 => {
                // A signalling NaN arrives quiet, payload kept (`rt::loom_half_to_f32`, the reference).
                let h = ins.uload16(I32, f, a, 0);
                let s = self.b.ins().ishl_imm_s(h, 16);
                let mag = self.b.ins().band_imm_u(s, 0x7fff_ffff);
                let nan = self
                    .b
                    .ins()
                    .icmp_imm_s(IntCC::UnsignedGreaterThan, mag, 0x7f80_0000);
                let q = self.b.ins().bor_imm_u(s, 0x0040_0000);
                let s = self.b.ins().select(nan, q, s);
                self.b.ins().bitcast(F32, MemFlagsData::new(), s)
            }
            DType::F16 => {
                let h = ins.uload16(I32, f, a, 0);
                let c = self.i32c(dtype_code(dtype));
                self.call(H::HalfToF32, &[c, h]).unwrap_or(h)
            }
            DType::I64 => ins.load(I64, f, a, 0),
            DType::I32 => ins.sload32(f, a, 0),
            DType::U32 => ins.uload32(f, a, 0),
            DType::I16 => ins.sload16(I64, f, a, 0),
            DType::U16 => ins.uload16(I64, f, a, 0),
            DType::I8 => ins.sload8(I64, f, a, 0),
            DType::U8 => ins.uload8(I64, f, a, 0),
            _ => {
                let x = ins.uload8(I64, f, a, 0);
                let c = self.b.ins().icmp_imm_s(IntCC::NotEqual, x, 0);
                self.b.ins().uextend(I64, c)
            }
        }
    }

    fn write_buf(&mut self, dtype: DType, ptr: Value, g: Value, x: Value) {
        let f = flags_buf();
        let size = dtype.size().unwrap_or(1) as i64;
        let a = self.buf_addr(ptr, g, size);
        match dtype {
            DType::F32 | DType::F64 | DType::I64 => {
                self.b.ins().store(f, x, a, 0);
            }
            DType::F16 | DType::BF16 => {
                let c = self.i32c(dtype_code(dtype));
                let h = self.call(H::F32ToHalf, &[c, x]).unwrap_or(c);
                self.b.ins().istore16(f, h, a, 0);
            }
            DType::I32 | DType::U32 => {
                self.b.ins().istore32(f, x, a, 0);
            }
            DType::I16 | DType::U16 => {
                self.b.ins().istore16(f, x, a, 0);
            }
            _ => {
                self.b.ins().istore8(f, x, a, 0);
            }
        }
    }

    fn indices(&mut self, param: u32, indices: &[KOperand]) -> R<(Vec<Ix>, Vec<u32>)> {
        let p = self
            .k
            .params
            .get(param as usize)
            .ok_or_else(|| bad!("parameter #{param} does not exist"))?;
        if indices.len() != p.shape.len() {
            return Err(bad!(
                "`{}` has {} dimensions but {} indices are given",
                p.name,
                p.shape.len(),
                indices.len()
            ));
        }
        let mut ixs = Vec::new();
        let mut shape = Vec::new();
        for (d, o) in indices.iter().enumerate() {
            // Range tiles stay lazy: every access path reads them through their start and step.
            match self.operand_lazy(o)? {
                Opnd::S(x, DType::I64) => ixs.push(Ix::S(x)),
                Opnd::T(t) if t.dtype == DType::I64 && t.shape.len() == 1 => {
                    shape.push(t.shape[0]);
                    ixs.push(Ix::T(t));
                }
                _ => {
                    return Err(bad!(
                        "index {d} of `{}` must be an i64 scalar or 1-D i64 tile",
                        p.name
                    ));
                }
            }
        }
        let n: u64 = shape.iter().map(|&d| u64::from(d)).product();
        if n > MAX_TILE_ELEMENTS {
            return Err(Fail::Unsupported(format!(
                "access of {n} elements exceeds the tile limit"
            )));
        }
        Ok((ixs, shape))
    }

    /// Visits every accessed element: `leaf(g, ok, r)` with the flat buffer index `g`, an in-range flag
    /// (`None` when every index is proven in range) and the row-major result index `r`.
    ///
    /// `mode`: 0 = proven (indices checked before), 1 = fast (range tiles, bounds tested once: offsets come
    /// from the range starts), 2 = masked per element.
    fn visit(
        &mut self,
        ixs: &[Ix],
        strides: &[i64],
        extents: &[u64],
        mode: u8,
        leaf: &mut Leaf<'_, 'k, 'f>,
    ) -> R<()> {
        let z = self.iconst(0);
        self.visit_at(ixs, strides, extents, mode, 0, z, None, z, leaf)
    }

    #[allow(clippy::too_many_arguments)]
    fn visit_at(
        &mut self,
        ixs: &[Ix],
        strides: &[i64],
        extents: &[u64],
        mode: u8,
        d: usize,
        g: Value,
        ok: Option<Value>,
        r: Value,
        leaf: &mut Leaf<'_, 'k, 'f>,
    ) -> R<()> {
        if d == ixs.len() {
            return leaf(self, g, ok, r);
        }
        let (st, ext) = (strides[d], extents[d] as i64);
        let step = |l: &mut Self, v: Value, g: Value, ok: Option<Value>| {
            let c = l.b.ins().imul_imm_s(v, st);
            let g = l.b.ins().iadd(g, c);
            let ok = if mode == 2 {
                let e = l.iconst(ext);
                let inr = l.b.ins().icmp(IntCC::UnsignedLessThan, v, e);
                Some(match ok {
                    Some(o) => l.b.ins().band(o, inr),
                    None => inr,
                })
            } else {
                ok
            };
            (g, ok)
        };
        match &ixs[d] {
            Ix::S(v) => {
                let (g, ok) = step(self, *v, g, ok);
                self.visit_at(ixs, strides, extents, mode, d + 1, g, ok, r, leaf)
            }
            Ix::T(t) => {
                let t = t.clone();
                let len = t.shape[0];
                // A range's elements are its start and step (a lazy range has no others).
                let start = t.range.map(|r| (self.b.use_var(r.start), r.step));
                self.for_n(len, &mut |l, j| {
                    let v = match start {
                        Some((s, step)) => l.range_at(s, step, j),
                        None => l.ld(I64, t.off, j),
                    };
                    let (g, ok) = step(l, v, g, ok);
                    let r0 = l.b.ins().imul_imm_s(r, i64::from(len));
                    let r = l.b.ins().iadd(r0, j);
                    l.visit_at(ixs, strides, extents, mode, d + 1, g, ok, r, leaf)
                })
            }
        }
    }

    /// Whether the fast mode of an access to `param` can copy whole rows: f32 elements (in the buffer and in
    /// the tile), or f16/bf16 ones in rows of at least [`COPY_CALL`] (each row then one converting call),
    /// every index a scalar or a range, and the last one a range over a unit-stride dimension (so each row of
    /// the tile is contiguous in the buffer and in scratch).
    fn row_copyable(&self, param: u32, ixs: &[Ix], strides: &[i64]) -> bool {
        let p = &self.k.params[param as usize];
        let long_rows = matches!(ixs.last(), Some(Ix::T(t)) if t.shape[0] >= COPY_CALL);
        (p.dtype == DType::F32 || (is_half(p.dtype) && long_rows))
            && strides.last() == Some(&1)
            && matches!(ixs.last(), Some(Ix::T(t)) if t.unit_range().is_some())
            && ixs
                .iter()
                .all(|ix| matches!(ix, Ix::S(_)) || matches!(ix, Ix::T(t) if t.range.is_some()))
    }

    /// The dimension of the rows when a load of `param` can be a view: f32 elements, every index a scalar or a
    /// unit range, exactly two ranges, the last over a unit-stride dimension (the tile's rows are then rows of
    /// the buffer at that dimension's stride).
    fn view_rows(&self, param: u32, ixs: &[Ix], strides: &[i64]) -> Option<usize> {
        let p = &self.k.params[param as usize];
        let tiles: Vec<usize> = (0..ixs.len())
            .filter(|&d| matches!(ixs[d], Ix::T(_)))
            .collect();
        let unit = |d: usize| matches!(&ixs[d], Ix::T(t) if t.unit_range().is_some());
        ((p.dtype == DType::F32 || is_half(p.dtype))
            && strides.last() == Some(&1)
            && tiles.len() == 2
            && tiles[1] == ixs.len() - 1
            && unit(tiles[0])
            && unit(tiles[1]))
        .then(|| tiles[0])
    }

    /// Whether an access to `param` can move whole rows with its other indices gathered: f32 elements, the
    /// last index a range over a unit-stride dimension, and at least one other index a tile that is not a
    /// range (which [`row_copyable`](Self::row_copyable) does not take).
    fn row_gatherable(&self, param: u32, ixs: &[Ix], strides: &[i64]) -> bool {
        let p = &self.k.params[param as usize];
        let Some((last, outer)) = ixs.split_last() else {
            return false;
        };
        p.dtype == DType::F32
            && strides.last() == Some(&1)
            && matches!(last, Ix::T(t) if t.unit_range().is_some())
            && outer
                .iter()
                .any(|ix| matches!(ix, Ix::T(t) if t.range.is_none()))
    }

    /// A [`row_gatherable`](Self::row_gatherable) access row by row: one test that the last index's range is
    /// inside its dimension (otherwise `slow`, the per-element path), then [`rows_at`](Self::rows_at) with a
    /// test of each row's indices (`masked`; none when they were checked before). A row out of range reads
    /// `fill` (`load`) or is skipped (store).
    #[allow(clippy::too_many_arguments)]
    fn gather_rows(
        &mut self,
        ixs: &[Ix],
        strides: &[i64],
        extents: &[u64],
        ptr: Value,
        off: u32,
        load: bool,
        fill: Option<Value>,
        masked: bool,
        slow: &mut dyn FnMut(&mut Self) -> R<()>,
    ) -> R<()> {
        let d = ixs.len() - 1;
        let inside = self.ranges_inside(&ixs[d..], &extents[d..]);
        self.branch(inside, &mut |l, fast| {
            if !fast {
                return slow(l);
            }
            let z = l.iconst(0);
            let ok = masked.then(|| l.b.ins().iconst(types::I8, 1));
            l.rows_at(ixs, strides, extents, 0, z, ok, z, ptr, off, load, fill)
        })
    }

    /// The fast mode of a [`row_copyable`](Self::row_copyable) access: row by row, four lanes at a time,
    /// between the buffer at `ptr` and the tile at scratch offset `off` (`load`: into the tile). Bounds were
    /// tested once by [`ranges_inside`](Self::ranges_inside).
    #[allow(clippy::too_many_arguments)]
    fn copy_rows(
        &mut self,
        ixs: &[Ix],
        strides: &[i64],
        extents: &[u64],
        ptr: Value,
        off: u32,
        load: bool,
        dtype: DType,
    ) -> R<()> {
        let z = self.iconst(0);
        self.half_rows = is_half(dtype).then_some(dtype);
        let r = self.rows_at(ixs, strides, extents, 0, z, None, z, ptr, off, load, None);
        self.half_rows = None;
        r
    }

    /// One whole-row move of `len` elements between the buffer (`ba`) and scratch (`sa`): a copy of f32
    /// rows, or a converting one of f16/bf16 rows ([`Lower::half_rows`]).
    fn move_row(&mut self, ba: Value, sa: Value, len: i64, load: bool) {
        let (dst, src) = if load { (sa, ba) } else { (ba, sa) };
        match self.half_rows {
            Some(dt) => {
                let n = self.iconst(len);
                let c = self.i32c(dtype_code(dt));
                let l = self.i32c(u32::from(load));
                self.call(H::CopyHalf, &[dst, src, n, c, l]);
            }
            None => {
                let n = self.iconst(4 * len);
                self.call(H::Copy, &[dst, src, n]);
            }
        }
    }

    /// Element `j` of a range tile: `start + j * step`.
    fn range_at(&mut self, start: Value, step: i64, j: Value) -> Value {
        let o = if step == 1 {
            j
        } else {
            self.b.ins().imul_imm_s(j, step)
        };
        self.b.ins().iadd(start, o)
    }

    /// Emits `body(true)` where `cond` (an i8 flag) holds and `body(false)` where it does not.
    fn branch(&mut self, cond: Value, body: &mut dyn FnMut(&mut Self, bool) -> R<()>) -> R<()> {
        let yes = self.b.create_block();
        let no = self.b.create_block();
        let done = self.b.create_block();
        self.b.ins().brif(cond, yes, &[], no, &[]);
        self.b.switch_to_block(yes);
        body(self, true)?;
        self.b.ins().jump(done, &[]);
        self.b.switch_to_block(no);
        body(self, false)?;
        self.b.ins().jump(done, &[]);
        self.b.switch_to_block(done);
        Ok(())
    }

    /// `f(j, F32X4)` for the four-lane groups of a row of `len` f32 elements (a loop), then `f(j, F32)` for the
    /// rest.
    fn row_lanes(&mut self, len: u32, f: &mut dyn FnMut(&mut Self, Value, Type)) -> R<()> {
        let n4 = len / 4 * 4;
        if n4 > 0 {
            self.for_lanes(0, i64::from(n4), 4, &mut |l, j| {
                f(l, j, types::F32X4);
                Ok(())
            })?;
        }
        for j in n4..len {
            let j = self.iconst(i64::from(j));
            f(self, j, F32);
        }
        Ok(())
    }

    /// Moves whole rows (the last index a range over a unit-stride dimension) between the buffer and the tile,
    /// dimension `d` onwards: `g` the flat buffer index so far, `r` the tile row so far. The other indices are
    /// scalars, ranges or gathered tiles; with `ok` (the row's in-range flag so far) each of them is tested, and
    /// a row outside is filled with `fill` (a load) or skipped; without it they are proven in range.
    #[allow(clippy::too_many_arguments)]
    fn rows_at(
        &mut self,
        ixs: &[Ix],
        strides: &[i64],
        extents: &[u64],
        d: usize,
        g: Value,
        ok: Option<Value>,
        r: Value,
        ptr: Value,
        off: u32,
        load: bool,
        fill: Option<Value>,
    ) -> R<()> {
        let (st, ext) = (strides[d], extents[d] as i64);
        if d + 1 == ixs.len() {
            let Ix::T(t) = &ixs[d] else {
                unreachable!("checked by row_gatherable")
            };
            let len = t.shape[0];
            let s = self.b.use_var(
                t.unit_range()
                    .unwrap_or_else(|| unreachable!("checked by row_gatherable")),
            );
            let g = self.b.ins().iadd(g, s);
            let r0 = self.b.ins().imul_imm_s(r, i64::from(len));
            let f = flags_buf();
            // The tile row's element j in scratch, and its address.
            let at = |l: &mut Self, j: Value| {
                let rj = l.b.ins().iadd(r0, j);
                let so = l.b.ins().imul_imm_s(rj, 4);
                l.b.ins().iadd(l.base, so)
            };
            let mut copy = |l: &mut Self, j: Value, ty: Type| {
                let gj = l.b.ins().iadd(g, j);
                let ba = l.buf_addr(ptr, gj, 4);
                let sa = at(l, j);
                if load {
                    let x = l.b.ins().load(ty, f, ba, 0);
                    l.b.ins().store(f, x, sa, off as i32);
                } else {
                    let x = l.b.ins().load(ty, f, sa, off as i32);
                    l.b.ins().store(f, x, ba, 0);
                }
            };
            let Some(ok) = ok else {
                if len >= COPY_CALL {
                    // A long row: one call that moves it with the CPU's widest moves.
                    let z = self.iconst(0);
                    let esize = if self.half_rows.is_some() { 2 } else { 4 };
                    let ba = self.buf_addr(ptr, g, esize);
                    let sa = at(self, z);
                    let sa = self.b.ins().iadd_imm_s(sa, i64::from(off));
                    self.move_row(ba, sa, i64::from(len), load);
                    return Ok(());
                }
                debug_assert!(
                    self.half_rows.is_none(),
                    "half rows are long (row_copyable)"
                );
                return self.row_lanes(len, &mut copy);
            };
            let fill = fill.filter(|_| load);
            return self.branch(ok, &mut |l, inside| {
                if inside {
                    return l.row_lanes(len, &mut copy);
                }
                let Some(fv) = fill else {
                    return Ok(());
                };
                let v4 = l.b.ins().splat(types::F32X4, fv);
                l.row_lanes(len, &mut |l, j, ty| {
                    let sa = at(l, j);
                    let x = if ty == F32 { fv } else { v4 };
                    l.b.ins().store(f, x, sa, off as i32);
                })
            });
        }
        let step = |l: &mut Self, v: Value, g: Value, ok: Option<Value>| {
            let c = l.b.ins().imul_imm_s(v, st);
            let g = l.b.ins().iadd(g, c);
            let ok = ok.map(|o| {
                let e = l.iconst(ext);
                let inr = l.b.ins().icmp(IntCC::UnsignedLessThan, v, e);
                l.b.ins().band(o, inr)
            });
            (g, ok)
        };
        match &ixs[d] {
            Ix::S(v) => {
                let (g, ok) = step(self, *v, g, ok);
                self.rows_at(ixs, strides, extents, d + 1, g, ok, r, ptr, off, load, fill)
            }
            Ix::T(t) => {
                let t = t.clone();
                let len = t.shape[0];
                let start = t.range.map(|r| (self.b.use_var(r.start), r.step));
                // Rows contiguous in the buffer (the last index covers whole rows of its dimension) and, as
                // always, in the tile: the block of `len` rows is one move.
                if let (Some((s, 1)), None, true, Some(Ix::T(last))) =
                    (start, ok, d + 2 == ixs.len(), ixs.get(d + 1))
                    && last.unit_range().is_some()
                    && strides[d + 1] == 1
                    && st == i64::from(last.shape[0])
                    && u64::from(len) * u64::from(last.shape[0]) >= u64::from(COPY_CALL)
                {
                    let row = i64::from(last.shape[0]);
                    let c = self.b.ins().imul_imm_s(s, st);
                    let g = self.b.ins().iadd(g, c);
                    let s1 = self.b.use_var(
                        last.unit_range()
                            .unwrap_or_else(|| unreachable!("checked above")),
                    );
                    let g = self.b.ins().iadd(g, s1);
                    let esize = if self.half_rows.is_some() { 2 } else { 4 };
                    let ba = self.buf_addr(ptr, g, esize);
                    let r0 = self.b.ins().imul_imm_s(r, i64::from(len) * row * 4);
                    let sa = self.b.ins().iadd(self.base, r0);
                    let sa = self.b.ins().iadd_imm_s(sa, i64::from(off));
                    self.move_row(ba, sa, i64::from(len) * row, load);
                    return Ok(());
                }
                self.for_n(len, &mut |l, j| {
                    let v = match start {
                        Some((s, step)) => l.range_at(s, step, j),
                        None => l.ld(I64, t.off, j),
                    };
                    let (g, ok) = step(l, v, g, ok);
                    let r0 = l.b.ins().imul_imm_s(r, i64::from(len));
                    let r = l.b.ins().iadd(r0, j);
                    l.rows_at(ixs, strides, extents, d + 1, g, ok, r, ptr, off, load, fill)
                })
            }
        }
    }

    /// Runs `body(mode)` in the fast mode when every tile index is a range whose bounds are inside the buffer
    /// (one test), otherwise in the masked mode.
    fn fast_or_masked(
        &mut self,
        ixs: &[Ix],
        extents: &[u64],
        body: &mut dyn FnMut(&mut Self, u8) -> R<()>,
    ) -> R<()> {
        if !self.all_ranged(ixs) {
            return body(self, 2);
        }
        let all = self.ranges_inside(ixs, extents);
        self.branch(all, &mut |l, fast| body(l, if fast { 1 } else { 2 }))
    }

    /// Whether every index is a scalar or a range tile, with at least one range (the accesses whose bounds
    /// one test can prove: [`ranges_inside`](Self::ranges_inside)).
    fn all_ranged(&self, ixs: &[Ix]) -> bool {
        ixs.iter()
            .all(|ix| matches!(ix, Ix::S(_)) || matches!(ix, Ix::T(t) if t.range.is_some()))
            && ixs.iter().any(|ix| matches!(ix, Ix::T(_)))
    }

    /// An i8 flag: every element of an [`all_ranged`](Self::all_ranged) access is inside the buffer.
    fn ranges_inside(&mut self, ixs: &[Ix], extents: &[u64]) -> Value {
        let mut all = self.b.ins().iconst(types::I8, 1);
        for (ix, &ext) in ixs.iter().zip(extents) {
            let ext = ext as i64;
            let c = match ix {
                Ix::S(v) => {
                    let e = self.iconst(ext);
                    self.b.ins().icmp(IntCC::UnsignedLessThan, *v, e)
                }
                Ix::T(t) => {
                    let r = t
                        .range
                        .unwrap_or_else(|| unreachable!("checked by all_ranged"));
                    // The elements span (len - 1) * step + 1 indices (step >= 1).
                    let span = (i64::from(t.shape[0]) - 1)
                        .checked_mul(r.step)
                        .and_then(|x| x.checked_add(1))
                        .unwrap_or(i64::MAX);
                    if span > ext {
                        self.b.ins().iconst(types::I8, 0)
                    } else {
                        // 0 <= start <= ext - span  <=>  start <=u ext - span
                        let s = self.b.use_var(r.start);
                        let lim = self.iconst(ext - span);
                        self.b.ins().icmp(IntCC::UnsignedLessThanOrEqual, s, lim)
                    }
                }
            };
            all = self.b.ins().band(all, c);
        }
        all
    }

    fn geometry(&self, param: u32) -> (Vec<i64>, Vec<u64>) {
        let shape = &self.k.params[param as usize].shape;
        let mut st = vec![1i64; shape.len()];
        for d in (0..shape.len().saturating_sub(1)).rev() {
            // Buffer sizes are validated against their shapes, so these products fit.
            st[d] = st[d + 1].saturating_mul(shape[d + 1] as i64);
        }
        (st, shape.clone())
    }

    fn load(
        &mut self,
        res: KValue,
        param: u32,
        indices: &[KOperand],
        fill: Option<&KOperand>,
    ) -> R<()> {
        let p = self
            .k
            .params
            .get(param as usize)
            .ok_or_else(|| bad!("parameter #{param} does not exist"))?
            .clone();
        if p.access == Access::Write && self.opts.allow_load != Some(param) {
            return Err(bad!("load from write-only parameter `{}`", p.name));
        }
        let dtype = if p.dtype.is_quantized() {
            DType::F32
        } else {
            p.dtype
        };
        let fill = match fill {
            Some(f) => match self.operand(f)? {
                Opnd::S(x, d) if d == dtype => Some(x),
                _ => return Err(bad!("load fill must be a {dtype} scalar")),
            },
            None => None,
        };
        let (ixs, shape) = self.indices(param, indices)?;
        let (strides, extents) = self.geometry(param);
        let ptr = self.buf_ptr(param);
        let out = if shape.is_empty() {
            None
        } else {
            Some(self.alloc(&shape, dtype)?)
        };
        let var = self.b.declare_var(cty(dtype));
        let mut leaf = |l: &mut Self, g: Value, ok: Option<Value>, r: Value| -> R<()> {
            let put = |l: &mut Self, x: Value| match &out {
                Some(t) => l.st(x, t.off, r),
                None => l.b.def_var(var, x),
            };
            match (ok, fill) {
                (Some(ok), Some(fv)) => {
                    let inb = l.b.create_block();
                    let oob = l.b.create_block();
                    let join = l.b.create_block();
                    l.b.ins().brif(ok, inb, &[], oob, &[]);
                    l.b.switch_to_block(inb);
                    let x = l.read_buf(p.dtype, ptr, g);
                    put(l, x);
                    l.b.ins().jump(join, &[]);
                    l.b.switch_to_block(oob);
                    put(l, fv);
                    l.b.ins().jump(join, &[]);
                    l.b.switch_to_block(join);
                }
                _ => {
                    let x = l.read_buf(p.dtype, ptr, g);
                    put(l, x);
                }
            }
            Ok(())
        };
        let rows = match &out {
            Some(t) if self.row_copyable(param, &ixs, &strides) => Some(t.off),
            _ => None,
        };
        // A view (only dots read the tile, see `dot_views`): where every index is inside, the dots read the
        // buffer's rows in place; otherwise the tile is filled as below (masked, or checked) and read there.
        if let (Some(t), Some(row_dim), true) = (
            &out,
            self.view_rows(param, &ixs, &strides),
            self.views.get(res.0 as usize) == Some(&true),
        ) {
            let (off, cols) = (t.off, t.shape[1]);
            let (vptr, vld) = (self.b.declare_var(I64), self.b.declare_var(I64));
            let vhalf = self.b.declare_var(I32);
            // In the buffer: f32, or halves the dot converts (1 f16, 2 bf16); the scratch copy is f32.
            let (kind, esize) = match p.dtype {
                DType::F16 => (1, 2),
                DType::BF16 => (2, 2),
                _ => (0, 4),
            };
            let all = self.ranges_inside(&ixs, &extents);
            self.branch(all, &mut |l, fast| {
                let (at, ld, hk) = if fast {
                    let mut g = l.iconst(0);
                    for (d, ix) in ixs.iter().enumerate() {
                        let v = match ix {
                            Ix::S(v) => *v,
                            Ix::T(t) => {
                                let r = t.range.unwrap_or_else(|| unreachable!("view_rows"));
                                l.b.use_var(r.start)
                            }
                        };
                        let c = l.b.ins().imul_imm_s(v, strides[d]);
                        g = l.b.ins().iadd(g, c);
                    }
                    let at = l.buf_addr(ptr, g, esize);
                    // The rows are read later by the dots (attention's values after the scores and their
                    // softmax): asking for them now overlaps their trip from memory with that work.
                    let rows = l.iconst(i64::from(t.shape[0]));
                    let rb = l.iconst(esize * i64::from(cols));
                    let sb = l.iconst(esize * strides[row_dim]);
                    l.call(H::Prefetch, &[at, rows, rb, sb]);
                    (at, strides[row_dim], kind)
                } else {
                    match fill {
                        Some(_) => l.visit(&ixs, &strides, &extents, 2, &mut leaf)?,
                        None => l.checked_visit(param, &ixs, &strides, &extents, &mut leaf)?,
                    }
                    (l.sptr(off), i64::from(cols), 0)
                };
                l.b.def_var(vptr, at);
                let ld = l.iconst(ld);
                l.b.def_var(vld, ld);
                let hk = l.b.ins().iconst(I32, hk);
                l.b.def_var(vhalf, hk);
                Ok(())
            })?;
            let view = Some(ViewV {
                ptr: vptr,
                ld: vld,
                half: vhalf,
            });
            return self.def_tile(res, TileV { view, ..t.clone() });
        }
        if fill.is_none() && self.all_ranged(&ixs) {
            // Checked, with every tile index a range: one test of the ranges' bounds takes the fast path
            // (whole rows where they are contiguous); otherwise the per-element check below finds and
            // reports the first index out of range, as the reference does.
            let all = self.ranges_inside(&ixs, &extents);
            self.branch(all, &mut |l, fast| match (fast, rows) {
                (true, Some(off)) => l.copy_rows(&ixs, &strides, &extents, ptr, off, true, p.dtype),
                (true, None) => l.visit(&ixs, &strides, &extents, 1, &mut leaf),
                (false, _) => l.checked_visit(param, &ixs, &strides, &extents, &mut leaf),
            })?;
        } else if let Some(off) = out
            .as_ref()
            .filter(|_| self.row_gatherable(param, &ixs, &strides))
            .map(|t| t.off)
        {
            // Gathered rows: each row's indices tested once (or checked before, in the reference's order),
            // whole rows copied.
            if fill.is_none() {
                self.check_indices(param, &ixs, &extents)?;
            }
            self.gather_rows(
                &ixs,
                &strides,
                &extents,
                ptr,
                off,
                true,
                fill,
                fill.is_some(),
                &mut |l| {
                    let mode = if fill.is_some() { 2 } else { 0 };
                    l.visit(&ixs, &strides, &extents, mode, &mut leaf)
                },
            )?;
        } else if fill.is_none() {
            self.checked_visit(param, &ixs, &strides, &extents, &mut leaf)?;
        } else {
            self.fast_or_masked(&ixs, &extents, &mut |l, mode| match rows {
                Some(off) if mode == 1 => {
                    l.copy_rows(&ixs, &strides, &extents, ptr, off, true, p.dtype)
                }
                _ => l.visit(&ixs, &strides, &extents, mode, &mut leaf),
            })?;
        }
        match out {
            Some(t) => self.def_tile(res, t),
            None => {
                let x = self.b.use_var(var);
                self.def_scalar(res, x, dtype)
            }
        }
    }

    /// A checked access: validates every index in the reference's order (the first one out of range is
    /// reported), then visits the elements unchecked.
    fn checked_visit(
        &mut self,
        param: u32,
        ixs: &[Ix],
        strides: &[i64],
        extents: &[u64],
        leaf: &mut Leaf<'_, 'k, 'f>,
    ) -> R<()> {
        self.check_indices(param, ixs, extents)?;
        self.visit(ixs, strides, extents, 0, leaf)
    }

    /// Validates every index of a checked access in the reference's order; the first one out of range ends
    /// the instance with its status and details.
    fn check_indices(&mut self, param: u32, ixs: &[Ix], extents: &[u64]) -> R<()> {
        {
            for (d, ix) in ixs.iter().enumerate() {
                let ext = extents[d] as i64;
                let check = |l: &mut Self, v: Value| {
                    let e = l.iconst(ext);
                    let inr = l.b.ins().icmp(IntCC::UnsignedLessThan, v, e);
                    l.guard(inr, ST_OOR, &mut |l| {
                        let pc = l.i32c(param);
                        let dc = l.i32c(d as u32);
                        let e = l.iconst(ext);
                        l.b.ins().store(flags_scratch(), pc, l.base, 0);
                        l.b.ins().store(flags_scratch(), dc, l.base, 4);
                        l.b.ins().store(flags_scratch(), v, l.base, 8);
                        l.b.ins().store(flags_scratch(), e, l.base, 16);
                    });
                };
                match ix {
                    Ix::S(v) => check(self, *v),
                    Ix::T(t) => {
                        let off = t.off;
                        let start = t.range.map(|r| (self.b.use_var(r.start), r.step));
                        self.for_n(t.shape[0], &mut |l, j| {
                            let v = match start {
                                Some((s, step)) => l.range_at(s, step, j),
                                None => l.ld(I64, off, j),
                            };
                            check(l, v);
                            Ok(())
                        })?;
                    }
                }
            }
        }
        Ok(())
    }

    fn store(&mut self, param: u32, indices: &[KOperand], value: &KOperand) -> R<()> {
        let p = self
            .k
            .params
            .get(param as usize)
            .ok_or_else(|| bad!("parameter #{param} does not exist"))?
            .clone();
        if p.access == Access::Read {
            return Err(bad!("store to read-only parameter `{}`", p.name));
        }
        if p.dtype.is_quantized() {
            return Err(bad!(
                "store to `{}`: quantised buffers are read-only",
                p.name
            ));
        }
        let (ixs, shape) = self.indices(param, indices)?;
        let v = self.operand(value)?;
        let ok_shape = match &v {
            Opnd::S(..) => shape.is_empty(),
            Opnd::T(t) => t.shape == shape,
        };
        if v.dtype() != p.dtype || !ok_shape {
            return Err(bad!(
                "store to `{}` needs a {}{shape:?} value",
                p.name,
                p.dtype
            ));
        }
        let (strides, extents) = self.geometry(param);
        let ptr = self.buf_ptr(param);
        let dtype = p.dtype;
        let mut leaf = |l: &mut Self, g: Value, ok: Option<Value>, r: Value| -> R<()> {
            let get = |l: &mut Self| match &v {
                Opnd::S(x, _) => *x,
                Opnd::T(t) => l.ld(cty(t.dtype), t.off, r),
            };
            match ok {
                Some(ok) => {
                    let inb = l.b.create_block();
                    let join = l.b.create_block();
                    l.b.ins().brif(ok, inb, &[], join, &[]);
                    l.b.switch_to_block(inb);
                    let x = get(l);
                    l.write_buf(dtype, ptr, g, x);
                    l.b.ins().jump(join, &[]);
                    l.b.switch_to_block(join);
                }
                None => {
                    let x = get(l);
                    l.write_buf(dtype, ptr, g, x);
                }
            }
            Ok(())
        };
        if let Opnd::T(t) = &v
            && self.row_gatherable(param, &ixs, &strides)
        {
            let off = t.off;
            return self.gather_rows(
                &ixs,
                &strides,
                &extents,
                ptr,
                off,
                false,
                None,
                true,
                &mut |l| l.visit(&ixs, &strides, &extents, 2, &mut leaf),
            );
        }
        let rows = match &v {
            Opnd::T(t) if self.row_copyable(param, &ixs, &strides) => Some(t.off),
            _ => None,
        };
        self.fast_or_masked(&ixs, &extents, &mut |l, mode| match rows {
            Some(off) if mode == 1 => l.copy_rows(&ixs, &strides, &extents, ptr, off, false, dtype),
            _ => l.visit(&ixs, &strides, &extents, mode, &mut leaf),
        })
    }

    // ---- structured control flow ----

    /// Storage for a loop-carried or branch-result value shaped like `o`.
    fn carrier(&mut self, o: &Opnd) -> R<Val> {
        Ok(match o {
            Opnd::S(_, d) => Val::Scalar(self.b.declare_var(cty(*d)), *d),
            Opnd::T(t) => Val::Tile(self.alloc(&t.shape, t.dtype)?),
        })
    }

    /// Moves `o` into carrier `c` (tile copies are skipped when `o` already lives there).
    fn assign(&mut self, c: &Val, o: Opnd) -> R<()> {
        match (c, o) {
            (Val::Scalar(var, d), Opnd::S(x, d2)) if *d == d2 => {
                self.b.def_var(*var, x);
                Ok(())
            }
            (Val::Tile(t), Opnd::T(s)) if t.shape == s.shape && t.dtype == s.dtype => {
                if t.off != s.off {
                    self.copy_scratch(cty(t.dtype), s.off, t.off, t.n())?;
                }
                Ok(())
            }
            _ => Err(bad!(
                "a yielded value does not match its loop or branch result type"
            )),
        }
    }

    fn bind(&mut self, v: KValue, c: &Val) -> R<()> {
        match c {
            Val::Scalar(var, d) => {
                let x = self.b.use_var(*var);
                self.def_scalar(v, x, *d)
            }
            Val::Tile(t) => self.def_tile(v, t.clone()),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn for_op(
        &mut self,
        op: &KOp,
        lo: &KOperand,
        hi: &KOperand,
        step: &KOperand,
        iv: KValue,
        iters: &[KValue],
        inits: &[KOperand],
        body: &KRegion,
    ) -> R<()> {
        let lo = self.scalar_i64(lo, "loop lower bound")?;
        let hi = self.scalar_i64(hi, "loop upper bound")?;
        let step = self.scalar_i64(step, "loop step")?;
        if inits.len() != iters.len() || op.results.len() != iters.len() {
            return Err(bad!(
                "loop iteration values, initial values and results differ in number"
            ));
        }
        let site = self.site();
        let pos = self.b.ins().icmp_imm_s(IntCC::SignedGreaterThan, step, 0);
        self.guard(pos, ST_STEP, &mut |l| {
            let s = l.i32c(site);
            l.b.ins().store(flags_scratch(), s, l.base, 0);
            l.b.ins().store(flags_scratch(), step, l.base, 8);
        });
        let mut carriers = Vec::new();
        for init in inits {
            let o = self.operand(init)?;
            let c = self.carrier(&o)?;
            self.assign(&c, o)?;
            carriers.push(c);
        }
        let header = self.b.create_block();
        let i = self.b.append_block_param(header, I64);
        let bb = self.b.create_block();
        let exit = self.b.create_block();
        self.b.ins().jump(header, &[BlockArg::Value(lo)]);
        self.b.switch_to_block(header);
        let c = self.b.ins().icmp(IntCC::SignedLessThan, i, hi);
        self.b.ins().brif(c, bb, &[], exit, &[]);
        self.b.switch_to_block(bb);
        self.def_scalar(iv, i, DType::I64)?;
        for (v, c) in iters.iter().zip(&carriers) {
            self.bind(*v, c)?;
        }
        let ys = self.region(body)?;
        self.loc = op.loc;
        if ys.len() != carriers.len() {
            return Err(bad!(
                "loop body yields {} values for {} iteration values",
                ys.len(),
                carriers.len()
            ));
        }
        let yv = ys.iter().map(|y| self.operand(y)).collect::<R<Vec<_>>>()?;
        // A yielded tile that is another carrier of this loop would be overwritten before it is copied.
        for (k, y) in yv.iter().enumerate() {
            if let Opnd::T(t) = y {
                if carriers
                    .iter()
                    .enumerate()
                    .any(|(j, c)| j != k && matches!(c, Val::Tile(ct) if ct.off == t.off))
                {
                    return Err(Fail::Unsupported(
                        "a loop yields one iteration tile into another".into(),
                    ));
                }
            }
        }
        for (c, y) in carriers.iter().zip(yv) {
            self.assign(c, y)?;
        }
        self.count_step();
        let next = self.b.ins().iadd(i, step);
        // Past i64::MAX the loop is over (as in the reference).
        let wrapped = self.b.ins().icmp(IntCC::SignedLessThan, next, i);
        self.b
            .ins()
            .brif(wrapped, exit, &[], header, &[BlockArg::Value(next)]);
        self.b.switch_to_block(exit);
        for (v, c) in op.results.iter().zip(&carriers) {
            self.bind(*v, c)?;
        }
        Ok(())
    }

    /// One step of the instance's budget at a loop back-edge: decrement, and when the slice is spent, the
    /// cold refill (`rt::loom_fuel`) that may end the instance with the budget or cancel status.
    fn count_step(&mut self) {
        let Some(fuel) = self.fuel else { return };
        let f = self.b.use_var(fuel);
        let f1 = self.b.ins().iadd_imm_s(f, -1);
        self.b.def_var(fuel, f1);
        let spent = self.b.ins().icmp_imm_s(IntCC::SignedLessThan, f1, 0);
        let refill = self.b.create_block();
        let cont = self.b.create_block();
        self.b.ins().brif(spent, refill, &[], cont, &[]);
        self.b.switch_to_block(refill);
        self.b.set_cold_block(refill);
        let base = self.base;
        let r = self.call(H::Fuel, &[base]).unwrap_or(f1);
        let stop = self.b.ins().icmp_imm_s(IntCC::SignedLessThan, r, 0);
        let err = self.b.create_block();
        let more = self.b.create_block();
        self.b.ins().brif(stop, err, &[], more, &[]);
        self.b.switch_to_block(err);
        self.b.set_cold_block(err);
        let st = self.b.ins().ineg(r);
        let st = self.b.ins().ireduce(I32, st);
        self.b.ins().return_(&[st]);
        self.b.switch_to_block(more);
        self.b.set_cold_block(more);
        self.b.def_var(fuel, r);
        self.b.ins().jump(cont, &[]);
        self.b.switch_to_block(cont);
    }

    fn if_op(&mut self, op: &KOp, cond: &KOperand, then_r: &KRegion, else_r: &KRegion) -> R<()> {
        let c = match self.operand(cond)? {
            Opnd::S(x, DType::I1) => x,
            _ => return Err(bad!("`if` condition must be an i1 scalar")),
        };
        let tb = self.b.create_block();
        let eb = self.b.create_block();
        let join = self.b.create_block();
        self.b.ins().brif(c, tb, &[], eb, &[]);
        let mut carriers: Option<Vec<Val>> = None;
        for (blk, region) in [(tb, then_r), (eb, else_r)] {
            self.b.switch_to_block(blk);
            let ys = self.region(region)?;
            self.loc = op.loc;
            if ys.len() != op.results.len() {
                return Err(bad!(
                    "`if` branch yields {} values for {} results",
                    ys.len(),
                    op.results.len()
                ));
            }
            let yv = ys.iter().map(|y| self.operand(y)).collect::<R<Vec<_>>>()?;
            if carriers.is_none() {
                carriers = Some(yv.iter().map(|o| self.carrier(o)).collect::<R<Vec<_>>>()?);
            }
            let cs = carriers.clone().unwrap_or_default();
            for (cv, y) in cs.iter().zip(yv) {
                self.assign(cv, y)?;
            }
            self.b.ins().jump(join, &[]);
        }
        self.b.switch_to_block(join);
        for (v, cv) in op.results.iter().zip(carriers.unwrap_or_default()) {
            self.bind(*v, &cv)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{dot_acc_only, dot_b_only, dot_views, use_counts};
    use loom_ir::kernel::{Access, DType, KOperand, ReduceOp};
    use loom_testkit::{KB, f, i};

    /// The tile loaded from `w` (a `[k, n]` block, or `[n, k]` transposed with `bt`) in a kernel built by
    /// `body`, which gets the loaded tile and the other operand and returns whatever it wants stored.
    fn views_of(
        bt: bool,
        body: impl FnOnce(&mut KB, KOperand, KOperand, u32, u32) -> KOperand,
    ) -> bool {
        let mut kb = KB::new("v", [1, 1, 1]);
        let a = kb.param("a", DType::F32, &[4, 8], Access::Read);
        let w = kb.param("w", DType::F32, &[8, 8], Access::Read);
        let y = kb.param("y", DType::F32, &[4, 8], Access::Write);
        let (r4, r8) = (kb.range(i(0), 4), kb.range(i(0), 8));
        let at = kb.load(a, vec![r4.clone(), r8.clone()], None);
        let wt = kb.load(w, vec![r8.clone(), r8.clone()], None);
        let wt = if bt { kb.transpose(wt) } else { wt };
        let out = body(&mut kb, at, wt, y, w);
        kb.store(y, vec![r4, r8], out);
        let k = kb.finish();
        // The second load's result (the first defines `at`).
        let loads: Vec<usize> = k
            .body
            .ops
            .iter()
            .filter(|o| matches!(o.kind, loom_ir::kernel::KOpKind::Load { .. }))
            .map(|o| o.results[0].0 as usize)
            .collect();
        let uses = use_counts(&k);
        dot_views(&k, &uses, &dot_b_only(&k, &uses))[loads[1]]
    }

    /// Zeros read only as f32 dots' accumulators are found; read otherwise too (here: a loop's initial
    /// value, the sum after the dot), or by a dot over f64, they are not.
    #[test]
    fn zeros_read_only_as_f32_dot_accumulators() {
        let only = |f64_a: bool, extra: &dyn Fn(&mut KB, KOperand, KOperand) -> KOperand| {
            let mut kb = KB::new("z", [1, 1, 1]);
            let d = if f64_a { DType::F64 } else { DType::F32 };
            let a = kb.param("a", d, &[4, 8], Access::Read);
            let y = kb.param("y", DType::F32, &[4, 4], Access::Write);
            let (r4, r8) = (kb.range(i(0), 4), kb.range(i(0), 8));
            let at = kb.load(a, vec![r4.clone(), r8.clone()], None);
            let bt = kb.transpose(at.clone());
            let z = kb.full(f(0.0), &[4, 4], DType::F32);
            let p = kb.dot(at, bt, z.clone());
            let out = extra(&mut kb, p, z.clone());
            kb.store(y, vec![r4.clone(), r4], out);
            let k = kb.finish();
            let KOperand::Value(zv) = z else {
                panic!("z is a value")
            };
            let uses = use_counts(&k);
            dot_acc_only(&k, &uses)[zv.0 as usize]
        };
        assert!(only(false, &|_, p, _| p));
        assert!(!only(true, &|_, p, _| p));
        assert!(!only(false, &|kb, p, z| kb.add(p, z)));
        assert!(!only(false, &|kb, p, z| {
            kb.for_(i(0), i(2), i(1), vec![z], |_, _, it| vec![it[0].clone()])
                .remove(0);
            p
        }));
    }

    #[test]
    fn loads_that_only_dots_read_soon_after_are_views() {
        let dot = |kb: &mut KB, a: KOperand, b: KOperand| {
            let z = kb.full(f(0.0), &[4, 8], DType::F32);
            kb.dot(a, b, z)
        };
        // Read by a dot directly, or through a transpose that only dots read.
        assert!(views_of(false, |kb, a, b, _, _| dot(kb, a, b)));
        assert!(views_of(true, |kb, a, b, _, _| dot(kb, a, b)));
        // Read by a dot and by something else: not a view.
        assert!(!views_of(false, |kb, a, b, _, _| {
            let d = dot(kb, a, b.clone());
            let s = kb.reduce(ReduceOp::Sum, b, 0);
            let s = kb.expand_dims(s, 0);
            let s = kb.broadcast(s, &[4, 8]);
            kb.add(d, s)
        }));
        // A store between the load and the dot: not a view.
        assert!(!views_of(false, |kb, a, b, y, _| {
            let r4 = kb.range(i(0), 4);
            let r8 = kb.range(i(0), 8);
            let z = kb.full(f(1.0), &[4, 8], DType::F32);
            kb.store(y, vec![r4, r8], z);
            dot(kb, a, b)
        }));
        // From a parameter the kernel also stores to (after the dot here; another instance's store could
        // come at any time): not a view.
        assert!(!views_of(false, |kb, a, b, _, w| {
            let d = dot(kb, a, b);
            let r8 = kb.range(i(0), 8);
            let z = kb.full(f(0.0), &[8, 8], DType::F32);
            kb.store(w, vec![r8.clone(), r8], z);
            d
        }));
        // The accumulator of a dot: not a view.
        assert!(!views_of(false, |kb, a, b, _, _| {
            let sq = kb.full(f(0.0), &[8, 8], DType::F32);
            let bb = kb.dot(b.clone(), sq, b);
            let z = kb.full(f(0.0), &[4, 8], DType::F32);
            kb.dot(a, bb, z)
        }));
        // Read by a dot inside a loop (another region): not a view.
        assert!(!views_of(false, |kb, a, b, _, _| {
            let z = kb.full(f(0.0), &[4, 8], DType::F32);
            kb.for_(i(0), i(2), i(1), vec![z], |kb, _, it| {
                vec![kb.dot(a.clone(), b.clone(), it[0].clone())]
            })
            .remove(0)
        }));
    }

    /// An f16 (or bf16) load whose one use is a `conv.f32` read only by dots is a view (of halves); a load
    /// with other uses, or whose cast has other uses, is not.
    #[test]
    fn half_loads_cast_for_dots_only_are_views() {
        let view = |dt: DType, bt: bool, extra_load_use: bool, extra_cast_use: bool| {
            let mut kb = KB::new("h", [1, 1, 1]);
            let a = kb.param("a", DType::F32, &[4, 8], Access::Read);
            let w = kb.param("w", dt, &[8, 8], Access::Read);
            let y = kb.param("y", DType::F32, &[4, 8], Access::Write);
            let (r4, r8) = (kb.range(i(0), 4), kb.range(i(0), 8));
            let at = kb.load(a, vec![r4.clone(), r8.clone()], None);
            let wt = kb.load(w, vec![r8.clone(), r8.clone()], None);
            let wf = kb.cast(wt.clone(), DType::F32);
            let b = if bt {
                kb.transpose(wf.clone())
            } else {
                wf.clone()
            };
            let z = kb.full(f(0.0), &[4, 8], DType::F32);
            let mut out = kb.dot(at, b, z);
            if extra_load_use {
                let c = kb.cast(wt, DType::F32);
                let c = kb.reduce(ReduceOp::Sum, c, 0);
                let c = kb.expand_dims(c, 0);
                let c = kb.broadcast(c, &[4, 8]);
                out = kb.add(out, c);
            }
            if extra_cast_use {
                let c = kb.reduce(ReduceOp::Sum, wf, 0);
                let c = kb.expand_dims(c, 0);
                let c = kb.broadcast(c, &[4, 8]);
                out = kb.add(out, c);
            }
            kb.store(y, vec![r4, r8], out);
            let k = kb.finish();
            let load = k
                .body
                .ops
                .iter()
                .filter(|o| matches!(o.kind, loom_ir::kernel::KOpKind::Load { .. }))
                .map(|o| o.results[0].0 as usize)
                .nth(1)
                .expect("two loads");
            let uses = use_counts(&k);
            dot_views(&k, &uses, &dot_b_only(&k, &uses))[load]
        };
        for dt in [DType::F16, DType::BF16] {
            assert!(view(dt, false, false, false));
            assert!(view(dt, true, false, false));
            assert!(!view(dt, false, true, false));
            assert!(!view(dt, false, false, true));
        }
    }
}
