//! The baseline JIT tier: a Cranelift translation of a function's lowered register bytecode, instruction by
//! instruction.
//!
//! # What is translated
//!
//! Control flow (`Fuel`, jumps, fused compare-and-branch, `ForLoop*`, `StepCheck`, `Ret`), scalar moves and
//! constants, integer arithmetic (checked, wrapping, immediate forms, division), bitwise ops, shifts, compares,
//! `f32`/`f64` add/sub/mul/div, neg/abs/sqrt, float compares, conversions, reference moves/selects/`null` tests,
//! `buffer.new`, `buffer.len`, and every buffer load/store form (plain, indexed, record fields). Every other
//! instruction (Loom calls, native calls, strings, lists, opaque tuples, slices/copies/fills, `assert`/`trap`, the
//! rare float ops `rem`/`min`/`max`/`floor`/`ceil`/`exp`/`log`) is an *exit point*: JIT code leaves to the
//! interpreter there, the interpreter executes that one instruction (for a call: the whole callee, itself JIT-ed
//! or not) and re-enters the JIT code at the next pc. Tier-up happens at load time ([`compile`]): functions that
//! contain a loop (a backward jump) and have at most [`MAX_JIT_CODE`] instructions are compiled (every function
//! up to that size when the test cross-check is on).
//!
//! # Exits and traps: the interpreter finishes the job
//!
//! JIT code is entered at pc 0 of a fresh frame or at the pc after an exit point (a jump table in the entry block;
//! any other pc returns at once), and leaves with a **resume pc**: the interpreter continues at that pc with the
//! register window and fuel exactly as they would be had it executed everything before that pc itself. It leaves
//! (a) at `Ret` (the interpreter executes the return), (b) at exit points, and (c) *before* any instruction that
//! would trap (out of fuel, overflow, division by zero, out-of-bounds, bad conversion, null, a failed
//! `buffer.new`, a non-buffer handle): every check is done before the instruction's first side effect, so the
//! interpreter re-executes that instruction, traps on it, and builds the trap itself (kind, message with offsets
//! and lengths, pc, loc). Semantics of traps are therefore the interpreter's by construction. Fuel is a counter
//! decremented at exactly the instructions and by exactly the amounts the interpreter charges (the jump
//! instructions' `fuel`/`tfuel`, `Fuel { n }`), so both tiers run out of fuel at the same pc with the same fuel
//! used.
//!
//! Scalar registers live in Cranelift variables between instructions (loaded from the window on entry); every
//! write is also stored to the window as it happens, so the memory image is correct at every exit and exits only
//! write fuel back (keeping registers live into every exit instead doubled compile time, with no measured speed
//! difference). Reference registers are read and written in memory directly.
//!
//! # Safety argument
//!
//! - **Registers**: JIT code addresses the frame's register windows at `base + 8 * r` / `base + 4 * r` with `r` a
//!   `u16` register index; [`enter`] takes the windows as `&mut [u64; WINDOW]` / `&mut [u32; WINDOW]` with
//!   `WINDOW = 65536`, so every register access is in bounds.
//! - **Buffers**: a buffer's data pointer and length come from the heap through [`loom_vm_jit_buf`] (which goes
//!   through [`Heap::buf`] / [`Heap::buf_mut`]: a non-buffer handle makes the JIT code exit). Every access of `n`
//!   bytes at offset `o` is checked `0 <= o` and `o + n <= len` against that length before it happens; buffers
//!   never change length. A data pointer is cached in a Cranelift variable (reset at every entry, since the
//!   interpreter may have run anything in between) and reused only while it is
//!   provably current: it is keyed by the register holding the handle and dropped when that register is written;
//!   a *read* pointer is dropped for every register when any store fetches a writable pointer (a store may copy a
//!   shared buffer on write, which moves its data; writable pointers are to owned buffers, whose data never moves
//!   until the invocation ends, since eligible code frees nothing and buffers are never resized). Nothing the JIT
//!   code can call frees or reallocates buffer data other than that copy-on-write.
//! - **The heap** is reached only through the helpers, via the raw pointer in [`JitContext`], created in [`enter`] from
//!   the interpreter's exclusive `&mut Heap`, which is not used while the JIT code runs.
//! - **Code lifetime**: the compiled code is owned by [`JitCode`], which lives in the loaded program next to the
//!   bytecode; it is freed only when the program is dropped, when no invocation can be running.
//!
//! The helpers never panic (a panic cannot unwind through JIT frames): they only call the heap's
//! `Result`-returning accessors.

use crate::code::*;
use crate::heap::Heap;
use crate::interp::WINDOW;
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::types::{F32, F64, I8, I32, I64};
use cranelift_codegen::ir::{
    AbiParam, Block, BlockArg, FuncRef, InstBuilder, JumpTableData, MemFlagsData, UserFuncName,
    Value,
};
use cranelift_codegen::settings::{self, Configurable};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext, Variable};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{FuncId, Linkage, Module, default_libcall_names};
use std::time::{Duration, Instant};

mod arith;
mod emit;
mod instr;
mod memory;

/// The compiled function: `(ctx, scalar window, reference window) -> resume pc`.
type JitFn = unsafe extern "C" fn(*mut JitContext, *mut u64, *mut u32, u32) -> u32;

/// State shared between JIT code and its helpers (field offsets are used by the generated code).
#[repr(C)]
struct JitContext {
    fuel: u64,
    heap: *mut Heap,
    /// Out-parameters of [`loom_vm_jit_buf`].
    ptr: *mut u8,
    len: u64,
}

const CTX_FUEL: i32 = 0;
const CTX_PTR: i32 = 16;
const CTX_LEN: i32 = 24;

/// Fetches the data pointer and length of buffer `h` into `ctx.ptr` / `ctx.len` (writable, i.e. after any
/// copy-on-write, when `write != 0`). Returns 0 when `h` is not a buffer or the copy does not fit the memory cap.
extern "C" fn loom_vm_jit_buf(ctx: *mut JitContext, h: u32, write: u32) -> u32 {
    // SAFETY: `ctx` is the `JitContext` built by `enter` for the running JIT code, alive for the whole call; its heap
    // pointer comes from the `&mut Heap` `enter` holds and does not otherwise use while the JIT code runs.
    let ctx = unsafe { &mut *ctx };
    // SAFETY: see above; no other reference to the heap exists during this call.
    let heap = unsafe { &mut *ctx.heap };
    let r = if write != 0 {
        heap.buf_mut(h).map(|b| (b.as_mut_ptr(), b.len()))
    } else {
        heap.buf(h).map(|b| (b.as_ptr().cast_mut(), b.len()))
    };
    match r {
        Ok((p, l)) => {
            ctx.ptr = p;
            ctx.len = l as u64;
            1
        }
        Err(_) => 0,
    }
}

/// `buffer.new` of `n` bytes: the new handle, or 0 when the interpreter would trap (negative length, over the
/// memory cap); nothing is charged or allocated then.
extern "C" fn loom_vm_jit_buf_new(ctx: *mut JitContext, n: i64) -> u32 {
    // SAFETY: as in `loom_vm_jit_buf`.
    let ctx = unsafe { &mut *ctx };
    // SAFETY: as in `loom_vm_jit_buf`.
    let heap = unsafe { &mut *ctx.heap };
    if n < 0 {
        return 0;
    }
    heap.alloc_zeroed_buf(n as u64, None).unwrap_or(0)
}

/// The compiled functions of one program. Owns the machine code.
pub(crate) struct JitCode {
    module: Option<JITModule>,
    fns: Vec<Option<JitFn>>,
    /// Functions compiled.
    pub(crate) compiled: usize,
    /// Wall time spent translating and compiling.
    pub(crate) compile_time: Duration,
}

impl std::fmt::Debug for JitCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "JitCode({} functions, {:?})",
            self.compiled, self.compile_time
        )
    }
}

// SAFETY: after `finalize_definitions` the module is never mutated (only read through the function pointers,
// which is thread-safe: the code pages are read-only and executable) until it is freed in `drop`.
unsafe impl Send for JitCode {}
// SAFETY: as above.
unsafe impl Sync for JitCode {}

impl Drop for JitCode {
    fn drop(&mut self) {
        if let Some(m) = self.module.take() {
            // SAFETY: the function pointers into this module live in `self.fns`, dropped with it; the owning
            // program is being dropped, so no invocation is running.
            unsafe { m.free_memory() };
        }
    }
}

impl JitCode {
    pub(crate) fn get(&self, func: u32) -> Option<JitFnRef> {
        self.fns.get(func as usize).copied().flatten().map(JitFnRef)
    }
}

/// A compiled function (only obtainable from a live [`JitCode`]).
#[derive(Clone, Copy)]
pub(crate) struct JitFnRef(JitFn);

/// Runs compiled code on a frame from `pc`; returns where the interpreter resumes and the fuel left. JIT code
/// entered at a pc that is not one of its entry points (pc 0 and the pc after each instruction it leaves to the
/// interpreter) returns at once with the same pc.
pub(crate) fn enter(
    f: JitFnRef,
    s: &mut [u64; WINDOW],
    r: &mut [u32; WINDOW],
    heap: &mut Heap,
    fuel: u64,
    pc: usize,
) -> (usize, u64) {
    let Ok(pc) = u32::try_from(pc) else {
        return (pc, fuel);
    };
    let mut ctx = JitContext {
        fuel,
        heap,
        ptr: std::ptr::null_mut(),
        len: 0,
    };
    // SAFETY: `f` was compiled by `compile` for the frame's function with the `JitFn` signature and is kept
    // alive by the `JitCode` borrowed (through the program) by the caller. It accesses the windows only at
    // `u16` register indices (in bounds of the 65536-slot arrays), buffers only after checking offsets against
    // the current length (module doc), and the heap only through the helpers.
    let pc = unsafe { (f.0)(&mut ctx, s.as_mut_ptr(), r.as_mut_ptr(), pc) };
    (pc as usize, ctx.fuel)
}

/// Whether the JIT is usable on this host (and not disabled with `LOOM_VM_JIT=0`).
pub(crate) fn default_on() -> bool {
    if std::env::var("LOOM_VM_JIT").is_ok_and(|v| v == "0") {
        return false;
    }
    cfg!(target_pointer_width = "64") && cranelift_native::builder().is_ok()
}

/// Whether the JIT translates `ins`; JIT code leaves to the interpreter at any other instruction and is
/// re-entered right after it.
fn translated(ins: &Instr) -> bool {
    use Instr as I;
    match *ins {
        I::Call { .. }
        | I::CallNative { .. }
        | I::Assert { .. }
        | I::Trap { .. }
        | I::ConstStr { .. }
        | I::BufSlice { .. }
        | I::BufCopy { .. }
        | I::BufFill { .. }
        | I::BufConcat { .. }
        | I::StrLen { .. }
        | I::StrConcat { .. }
        | I::StrEq { .. }
        | I::StrFromI64 { .. }
        | I::StrFromF64 { .. }
        | I::StrToBuf { .. }
        | I::StrFromBuf { .. }
        | I::StrParse { .. }
        | I::ListNew { .. }
        | I::ListLen { .. }
        | I::ListGetS { .. }
        | I::ListGetR { .. }
        | I::ListSetS { .. }
        | I::ListSetR { .. }
        | I::ListPushS { .. }
        | I::ListPushR { .. }
        | I::OpaqueNew { .. }
        | I::OpaqueGetS { .. }
        | I::OpaqueGetR { .. }
        | I::OpaqueLen { .. } => false,
        I::FBin { op, .. } => op == FloatBinary::Div,
        I::FUn { op, .. } => matches!(op, FloatUnary::Neg | FloatUnary::Abs | FloatUnary::Sqrt),
        I::ShlK32 { k, .. } | I::ShrK32 { k, .. } | I::ShrUK32 { k, .. } => k < 32,
        I::ShlK64 { k, .. } | I::ShrK64 { k, .. } | I::ShrUK64 { k, .. } => k < 64,
        _ => true,
    }
}

/// Whether `fc` can be compiled (well-formed jump targets; any instruction is allowed).
pub(crate) fn eligible(fc: &FuncCode) -> bool {
    let n = fc.code.len();
    n > 0
        && fc.code.iter().all(|i| {
            let mut c = *i;
            c.target_mut().is_none_or(|t| (*t as usize) < n)
        })
}

fn has_loop(fc: &FuncCode) -> bool {
    fc.code.iter().enumerate().any(|(pc, i)| {
        let mut i = *i;
        i.target_mut().is_some_and(|t| (*t as usize) <= pc)
    })
}

/// The reference register an instruction reads a buffer handle from.
fn buf_reg(ins: &Instr) -> Option<R> {
    use Instr as I;
    match *ins {
        I::BufLen { b, .. }
        | I::Ld8s { b, .. }
        | I::Ld8u { b, .. }
        | I::Ld16s { b, .. }
        | I::Ld16u { b, .. }
        | I::Ld32 { b, .. }
        | I::Ld64 { b, .. }
        | I::St8 { b, .. }
        | I::St16 { b, .. }
        | I::St32 { b, .. }
        | I::St64 { b, .. }
        | I::Ld32X { b, .. }
        | I::Ld32XS { b, .. }
        | I::Ld64X { b, .. }
        | I::Ld64XS { b, .. }
        | I::St32X { b, .. }
        | I::St32XS { b, .. }
        | I::St64X { b, .. }
        | I::St64XS { b, .. }
        | I::LdField { b, .. }
        | I::StField { b, .. } => Some(b),
        _ => None,
    }
}

/// Functions longer than this (bytecode instructions) stay interpreted: compile time grows with size, and the
/// loops worth compiling are short.
const MAX_JIT_CODE: usize = 20_000;

/// Compiles the eligible functions of a program (those with a loop, or all eligible ones when `all`). `None`
/// when nothing was compiled or Cranelift is unavailable on this host; a function Cranelift rejects stays
/// interpreted.
pub(crate) fn compile(funcs: &[FuncCode], all: bool) -> Option<JitCode> {
    let t0 = Instant::now();
    let picked: Vec<usize> = funcs
        .iter()
        .enumerate()
        .filter(|(_, f)| f.code.len() <= MAX_JIT_CODE && eligible(f) && (all || has_loop(f)))
        .map(|(i, _)| i)
        .collect();
    if picked.is_empty() {
        return None;
    }
    let mut flags = settings::builder();
    flags.set("use_colocated_libcalls", "false").ok()?;
    flags.set("is_pic", "false").ok()?;
    flags.set("opt_level", "speed").ok()?;
    let isa = cranelift_native::builder()
        .ok()?
        .finish(settings::Flags::new(flags))
        .ok()?;
    if isa.pointer_type() != I64 {
        return None;
    }
    let mut jb = JITBuilder::with_isa(isa, default_libcall_names());
    jb.symbol("loom_vm_jit_buf", loom_vm_jit_buf as *const u8);
    jb.symbol("loom_vm_jit_buf_new", loom_vm_jit_buf_new as *const u8);
    let mut module = JITModule::new(jb);
    let mut hs = module.make_signature();
    hs.params
        .extend([AbiParam::new(I64), AbiParam::new(I32), AbiParam::new(I32)]);
    hs.returns.push(AbiParam::new(I32));
    let h_buf = module
        .declare_function("loom_vm_jit_buf", Linkage::Import, &hs)
        .ok()?;
    let mut hn = module.make_signature();
    hn.params.extend([AbiParam::new(I64), AbiParam::new(I64)]);
    hn.returns.push(AbiParam::new(I32));
    let h_new = module
        .declare_function("loom_vm_jit_buf_new", Linkage::Import, &hn)
        .ok()?;
    let mut sig = module.make_signature();
    sig.params.extend([AbiParam::new(I64); 3]);
    sig.params.push(AbiParam::new(I32));
    sig.returns.push(AbiParam::new(I32));

    let tcfg = module.target_config();
    let mut ctx = module.make_context();
    let mut fctx = FunctionBuilderContext::new();
    let mut ids: Vec<(usize, FuncId)> = Vec::new();
    for &fi in &picked {
        let Ok(id) = module.declare_function(&format!("loom_jit_{fi}"), Linkage::Local, &sig)
        else {
            continue;
        };
        module.clear_context(&mut ctx);
        ctx.func.signature = sig.clone();
        ctx.func.name = UserFuncName::user(0, id.as_u32());
        {
            let mut b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
            let hb = module.declare_func_in_func(h_buf, b.func);
            let hnf = module.declare_func_in_func(h_new, b.func);
            translate(&mut b, &funcs[fi], hb, hnf);
            b.seal_all_blocks();
            b.finalize(tcfg);
        }
        if module.define_function(id, &mut ctx).is_ok() {
            ids.push((fi, id));
        }
        module.clear_context(&mut ctx);
    }
    module.finalize_definitions().ok()?;
    let mut fns = vec![None; funcs.len()];
    for &(fi, id) in &ids {
        let p = module.get_finalized_function(id);
        // SAFETY: `id` was defined with the signature (i64, i64, i64, i32) -> i32 in the platform's C ABI, which is
        // what `JitFn` describes (pointers are 64-bit, checked above).
        fns[fi] = Some(unsafe { std::mem::transmute::<*const u8, JitFn>(p) });
    }
    Some(JitCode {
        module: Some(module),
        compiled: ids.len(),
        fns,
        compile_time: t0.elapsed(),
    })
}

fn win() -> MemFlagsData {
    MemFlagsData::trusted()
}

fn heapf() -> MemFlagsData {
    MemFlagsData::new().with_notrap()
}

/// Cached data pointer state of one reference register.
#[derive(Clone, Copy)]
struct Cache {
    rptr: Variable,
    wptr: Variable,
    len: Variable,
}

/// The Cranelift translation of one function's register bytecode: the builder, the block of each jump target,
/// the variable of each scalar register, the fuel counter and the cached buffer pointers.
struct JitTranslator<'a, 'b> {
    b: &'a mut FunctionBuilder<'b>,
    fc: &'a FuncCode,
    blocks: Vec<Option<Block>>,
    exit: Block,
    vars: Vec<Option<Variable>>,
    fuel: Variable,
    ctx: Value,
    sp: Value,
    rp: Value,
    cache: Vec<Option<Cache>>,
    caches: Vec<Cache>,
    /// Bail-out block per pc (created on demand).
    bails: Vec<Option<Block>>,
    h_buf: FuncRef,
    h_new: FuncRef,
}

fn translate(b: &mut FunctionBuilder<'_>, fc: &FuncCode, h_buf: FuncRef, h_new: FuncRef) {
    let n = fc.code.len();
    let mut leader = vec![false; n + 1];
    leader[0] = true;
    for (pc, ins) in fc.code.iter().enumerate() {
        let mut i = *ins;
        if let Some(t) = i.target_mut() {
            if (*t as usize) <= n {
                leader[*t as usize] = true;
            }
            leader[pc + 1] = true;
        }
        if matches!(ins, Instr::Ret { .. }) || !translated(ins) {
            leader[pc + 1] = true;
        }
    }
    let entry = b.create_block();
    b.append_block_params_for_function_params(entry);
    let preload = b.create_block();
    let exit = b.create_block();
    b.append_block_param(exit, I32);
    let blocks: Vec<Option<Block>> = leader
        .iter()
        .map(|&l| if l { Some(b.create_block()) } else { None })
        .collect();
    b.switch_to_block(entry);
    let p = b.block_params(entry).to_vec();
    b.ins().jump(preload, &[]);
    let fuel = b.declare_var(I64);
    let mut cache = vec![None; WINDOW];
    for ins in &fc.code {
        if let Some(r) = buf_reg(ins) {
            if cache[r as usize].is_none() {
                cache[r as usize] = Some(Cache {
                    rptr: b.declare_var(I64),
                    wptr: b.declare_var(I64),
                    len: b.declare_var(I64),
                });
            }
        }
    }
    let caches: Vec<Cache> = cache.iter().flatten().copied().collect();
    let mut t = JitTranslator {
        caches,
        bails: vec![None; n + 1],
        b,
        fc,
        blocks,
        exit,
        vars: vec![None; WINDOW],
        fuel,
        ctx: p[0],
        sp: p[1],
        rp: p[2],
        cache,
        h_buf,
        h_new,
    };
    let mut open = false;
    for pc in 0..n {
        if let Some(blk) = t.blocks[pc] {
            if open {
                t.b.ins().jump(blk, &[]);
            }
            t.b.switch_to_block(blk);
            open = true;
        }
        if !open {
            continue; // unreachable code
        }
        open = t.instr(pc);
    }
    if open {
        t.exit_at(n);
    }
    if let Some(blk) = t.blocks[n] {
        t.b.switch_to_block(blk);
        t.exit_at(n);
    }
    for (pc, blk) in std::mem::take(&mut t.bails).into_iter().enumerate() {
        if let Some(blk) = blk {
            t.b.switch_to_block(blk);
            t.exit_at(pc);
        }
    }
    // The preload block: scalar registers into variables, fuel, empty caches.
    t.b.switch_to_block(preload);
    let f = t.b.ins().load(I64, win(), t.ctx, CTX_FUEL);
    t.b.def_var(t.fuel, f);
    for r in 0..WINDOW {
        if let Some(v) = t.vars[r] {
            let x = t.b.ins().load(I64, win(), t.sp, (r * 8) as i32);
            t.b.def_var(v, x);
        }
    }
    let zero = t.b.ins().iconst(I64, 0);
    for c in &t.caches {
        t.b.def_var(c.rptr, zero);
        t.b.def_var(c.wptr, zero);
        t.b.def_var(c.len, zero);
    }
    // Dispatch on the entry pc: 0, or the pc after an instruction left to the interpreter.
    let mut entries = vec![0usize];
    entries.extend(
        fc.code
            .iter()
            .enumerate()
            .filter(|(_, i)| !translated(i))
            .map(|(pc, _)| pc + 1),
    );
    let start = p[3];
    if entries.len() == 1 {
        let b0 = t.blocks[0].expect("pc 0 is a leader");
        let other = t.b.create_block();
        t.b.ins().brif(start, other, &[], b0, &[]);
        t.b.switch_to_block(other);
        t.b.ins().jump(exit, &[BlockArg::Value(start)]);
    } else {
        let other = t.b.create_block();
        let top = entries.iter().copied().max().unwrap_or(0);
        let def = t.b.func.dfg.block_call(other, &[]);
        let mut table = vec![def; top + 1];
        for &e in &entries {
            if let Some(blk) = t.blocks[e] {
                table[e] = t.b.func.dfg.block_call(blk, &[]);
            }
        }
        let jt = t.b.create_jump_table(JumpTableData::new(def, &table));
        t.b.ins().br_table(start, jt);
        t.b.switch_to_block(other);
        t.b.ins().jump(exit, &[BlockArg::Value(start)]);
    }
    // The exit block: fuel back to memory (register writes are already stored).
    t.b.switch_to_block(exit);
    let pc = t.b.block_params(exit)[0];
    let f = t.b.use_var(t.fuel);
    t.b.ins().store(win(), f, t.ctx, CTX_FUEL);
    t.b.ins().return_(&[pc]);
}
