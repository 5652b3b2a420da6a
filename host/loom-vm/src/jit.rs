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
//! - **The heap** is reached only through the helpers, via the raw pointer in [`Ctx`], created in [`enter`] from
//!   the interpreter's exclusive `&mut Heap`, which is not used while the JIT code runs.
//! - **Code lifetime**: the compiled code is owned by [`JitCode`], which lives in the loaded program next to the
//!   bytecode; it is freed only when the program is dropped, when no invocation can be running.
//!
//! The helpers never panic (a panic cannot unwind through JIT frames): they only call the heap's
//! `Result`-returning accessors.

use crate::code::*;
use crate::heap::{Buf, Heap, Obj};
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

/// The compiled function: `(ctx, scalar window, reference window) -> resume pc`.
type JitFn = unsafe extern "C" fn(*mut Ctx, *mut u64, *mut u32, u32) -> u32;

/// State shared between JIT code and its helpers (field offsets are used by the generated code).
#[repr(C)]
struct Ctx {
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
extern "C" fn loom_vm_jit_buf(ctx: *mut Ctx, h: u32, write: u32) -> u32 {
    // SAFETY: `ctx` is the `Ctx` built by `enter` for the running JIT code, alive for the whole call; its heap
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
extern "C" fn loom_vm_jit_buf_new(ctx: *mut Ctx, n: i64) -> u32 {
    // SAFETY: as in `loom_vm_jit_buf`.
    let ctx = unsafe { &mut *ctx };
    // SAFETY: as in `loom_vm_jit_buf`.
    let heap = unsafe { &mut *ctx.heap };
    if n < 0 {
        return 0;
    }
    heap.alloc(n as u64, || Obj::Buf(Buf::Owned(vec![0u8; n as usize])))
        .unwrap_or(0)
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
    let mut ctx = Ctx {
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
        I::FBin { op, .. } => op == FBin::Div,
        I::FUn { op, .. } => matches!(op, FUn::Neg | FUn::Abs | FUn::Sqrt),
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

struct Tr<'a, 'b> {
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
    let mut t = Tr {
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

impl Tr<'_, '_> {
    fn var(&mut self, r: R) -> Variable {
        match self.vars[r as usize] {
            Some(v) => v,
            None => {
                let v = self.b.declare_var(I64);
                self.vars[r as usize] = Some(v);
                v
            }
        }
    }
    fn g(&mut self, r: R) -> Value {
        let v = self.var(r);
        self.b.use_var(v)
    }
    fn g32(&mut self, r: R) -> Value {
        let x = self.g(r);
        self.b.ins().ireduce(I32, x)
    }
    fn set(&mut self, r: R, x: Value) {
        let v = self.var(r);
        self.b.ins().store(win(), x, self.sp, r as i32 * 8);
        self.b.def_var(v, x);
    }
    fn set32(&mut self, r: R, x: Value) {
        let x = self.b.ins().uextend(I64, x);
        self.set(r, x);
    }
    fn set_bool(&mut self, r: R, c: Value) {
        let x = self.b.ins().uextend(I64, c);
        self.set(r, x);
    }
    fn k64(&mut self, k: i64) -> Value {
        self.b.ins().iconst(I64, k)
    }
    fn k32(&mut self, k: i32) -> Value {
        self.b.ins().iconst(I32, k as u32 as i64)
    }
    fn pcv(&mut self, pc: usize) -> Value {
        self.b.ins().iconst(I32, pc as i64)
    }
    /// Leaves for the interpreter at `pc` when `c` holds; continues in a new block otherwise.
    fn bail_if(&mut self, c: Value, pc: usize) {
        let cont = self.b.create_block();
        let bail = self.bail_block(pc);
        self.b.ins().brif(c, bail, &[], cont, &[]);
        self.b.switch_to_block(cont);
    }
    /// The cold block that leaves for the interpreter at `pc` (one per pc; filled at the end).
    fn bail_block(&mut self, pc: usize) -> Block {
        if let Some(blk) = self.bails[pc] {
            return blk;
        }
        let blk = self.b.create_block();
        self.b.set_cold_block(blk);
        self.bails[pc] = Some(blk);
        blk
    }
    fn exit_at(&mut self, pc: usize) {
        let pv = self.pcv(pc);
        self.b.ins().jump(self.exit, &[BlockArg::Value(pv)]);
    }
    fn charge(&mut self, n: u64, pc: usize) {
        if n == 0 {
            return;
        }
        let f = self.b.use_var(self.fuel);
        let c = self
            .b
            .ins()
            .icmp_imm_s(IntCC::UnsignedLessThan, f, n as i64);
        self.bail_if(c, pc);
        let f2 = self.b.ins().iadd_imm_s(f, -(n as i64));
        self.b.def_var(self.fuel, f2);
    }
    fn block(&self, pc: u32) -> Block {
        self.blocks[pc as usize].expect("jump targets are leaders")
    }
    /// `if c { charge tf; goto target } else { charge f; fall through }`.
    fn jif(&mut self, c: Value, target: u32, f: u16, tf: u16, pc: usize) -> bool {
        let (tb, fb) = (self.b.create_block(), self.b.create_block());
        self.b.ins().brif(c, tb, &[], fb, &[]);
        self.b.switch_to_block(tb);
        self.charge(tf as u64, pc);
        let tgt = self.block(target);
        self.b.ins().jump(tgt, &[]);
        self.b.switch_to_block(fb);
        self.charge(f as u64, pc);
        true
    }
    fn jcmp(&mut self, cc: IntCC, a: R, b: R, w32: bool, target: u32, f: u16, tf: u16, pc: usize) {
        let (x, y) = if w32 {
            (self.g32(a), self.g32(b))
        } else {
            (self.g(a), self.g(b))
        };
        let c = self.b.ins().icmp(cc, x, y);
        self.jif(c, target, f, tf, pc);
    }
    fn jcmpk(
        &mut self,
        cc: IntCC,
        a: R,
        k: i32,
        w32: bool,
        target: u32,
        f: u16,
        tf: u16,
        pc: usize,
    ) {
        let (x, y) = if w32 {
            (self.g32(a), self.k32(k))
        } else {
            (self.g(a), self.k64(k as i64))
        };
        let c = self.b.ins().icmp(cc, x, y);
        self.jif(c, target, f, tf, pc);
    }
    fn for_loop(&mut self, iv: R, hi: R, step: Value, target: u32, f: u32, pc: usize) {
        let x = self.g(iv);
        let (nv, of) = self.b.ins().sadd_overflow(x, step);
        let (c1, fall) = (self.b.create_block(), self.b.create_block());
        self.b.ins().brif(of, fall, &[], c1, &[]);
        self.b.switch_to_block(c1);
        // The interpreter writes `iv` before reading `hi`: the same register reads the new value.
        let h = if hi == iv { nv } else { self.g(hi) };
        let lt = self.b.ins().icmp(IntCC::SignedLessThan, nv, h);
        let (take, stay) = (self.b.create_block(), self.b.create_block());
        self.b.ins().brif(lt, take, &[], stay, &[]);
        self.b.switch_to_block(take);
        self.charge(f as u64, pc);
        self.set(iv, nv);
        let tgt = self.block(target);
        self.b.ins().jump(tgt, &[]);
        self.b.switch_to_block(stay);
        self.set(iv, nv);
        self.b.ins().jump(fall, &[]);
        self.b.switch_to_block(fall);
    }
    /// Checked binary op: bails on overflow.
    fn chk(&mut self, d: R, x: Value, y: Value, op: u8, w32: bool, pc: usize) {
        let (v, of) = match op {
            0 => self.b.ins().sadd_overflow(x, y),
            1 => self.b.ins().ssub_overflow(x, y),
            _ => self.b.ins().smul_overflow(x, y),
        };
        self.bail_if(of, pc);
        if w32 {
            self.set32(d, v)
        } else {
            self.set(d, v)
        }
    }
    fn chk_rr(&mut self, d: R, a: R, b: R, op: u8, w32: bool, pc: usize) {
        let (x, y) = if w32 {
            (self.g32(a), self.g32(b))
        } else {
            (self.g(a), self.g(b))
        };
        self.chk(d, x, y, op, w32, pc);
    }
    fn chk_rk(&mut self, d: R, a: R, k: i32, op: u8, w32: bool, pc: usize) {
        let (x, y) = if w32 {
            (self.g32(a), self.k32(k))
        } else {
            (self.g(a), self.k64(k as i64))
        };
        self.chk(d, x, y, op, w32, pc);
    }
    fn div(&mut self, d: R, a: R, b: R, signed: bool, rem: bool, w32: bool, pc: usize) {
        let (x, y) = if w32 {
            (self.g32(a), self.g32(b))
        } else {
            (self.g(a), self.g(b))
        };
        let z = self.b.ins().icmp_imm_s(IntCC::Equal, y, 0);
        self.bail_if(z, pc);
        let v = if signed {
            let (min, m1) = if w32 {
                (self.k32(i32::MIN), self.k32(-1))
            } else {
                (self.k64(i64::MIN), self.k64(-1))
            };
            let m1 = self.b.ins().icmp(IntCC::Equal, y, m1);
            let mn = self.b.ins().icmp(IntCC::Equal, x, min);
            let o = self.b.ins().band(m1, mn);
            self.bail_if(o, pc);
            if rem {
                self.b.ins().srem(x, y)
            } else {
                self.b.ins().sdiv(x, y)
            }
        } else if rem {
            self.b.ins().urem(x, y)
        } else {
            self.b.ins().udiv(x, y)
        };
        if w32 {
            self.set32(d, v)
        } else {
            self.set(d, v)
        }
    }
    fn wrap(&mut self, d: R, v: Value, w32: bool) {
        if w32 {
            let t = self.b.ins().ireduce(I32, v);
            self.set32(d, t)
        } else {
            self.set(d, v)
        }
    }
    fn f32v(&mut self, r: R) -> Value {
        let x = self.g32(r);
        self.b.ins().bitcast(F32, MemFlagsData::new(), x)
    }
    fn f64v(&mut self, r: R) -> Value {
        let x = self.g(r);
        self.b.ins().bitcast(F64, MemFlagsData::new(), x)
    }
    /// `f32` operands widened to `f64` (as the interpreter's cold path does), or `f64` operands.
    fn fwide(&mut self, r: R, wide: bool) -> Value {
        if wide {
            self.f64v(r)
        } else {
            let x = self.f32v(r);
            self.b.ins().fpromote(F64, x)
        }
    }
    fn set_f64(&mut self, d: R, v: Value) {
        let x = self.b.ins().bitcast(I64, MemFlagsData::new(), v);
        self.set(d, x)
    }
    fn set_f32(&mut self, d: R, v: Value) {
        let x = self.b.ins().bitcast(I32, MemFlagsData::new(), v);
        self.set32(d, x)
    }
    /// Result of a cold-path float op computed in `f64`.
    fn set_fwide(&mut self, d: R, v: Value, wide: bool) {
        if wide {
            self.set_f64(d, v)
        } else {
            let n = self.b.ins().fdemote(F32, v);
            self.set_f32(d, n)
        }
    }
    fn rload(&mut self, r: R) -> Value {
        self.b.ins().load(I32, win(), self.rp, r as i32 * 4)
    }
    fn rstore(&mut self, d: R, h: Value) {
        self.b.ins().store(win(), h, self.rp, d as i32 * 4);
        if let Some(c) = self.cache[d as usize] {
            let z = self.b.ins().iconst(I64, 0);
            self.b.def_var(c.rptr, z);
            self.b.def_var(c.wptr, z);
        }
    }
    /// Data pointer and length of the buffer in `r[b]` (writable when `write`).
    fn buf(&mut self, b: R, write: bool, pc: usize) -> (Value, Value) {
        let c = self.cache[b as usize].expect("buffer registers have caches");
        let var = if write { c.wptr } else { c.rptr };
        let cur = self.b.use_var(var);
        let (slow, join) = (self.b.create_block(), self.b.create_block());
        self.b.set_cold_block(slow);
        let z = self.b.ins().icmp_imm_s(IntCC::Equal, cur, 0);
        self.b.ins().brif(z, slow, &[], join, &[]);
        self.b.switch_to_block(slow);
        let h = self.rload(b);
        let w = self.b.ins().iconst(I32, write as i64);
        let call = self.b.ins().call(self.h_buf, &[self.ctx, h, w]);
        let ok = self.b.inst_results(call)[0];
        let bad = self.b.ins().icmp_imm_s(IntCC::Equal, ok, 0);
        self.bail_if(bad, pc);
        let p = self.b.ins().load(I64, win(), self.ctx, CTX_PTR);
        let l = self.b.ins().load(I64, win(), self.ctx, CTX_LEN);
        if write {
            // A copy-on-write may have moved this handle's data: every cached read pointer may be stale.
            let zero = self.b.ins().iconst(I64, 0);
            for x in &self.caches {
                self.b.def_var(x.rptr, zero);
            }
            self.b.def_var(c.wptr, p);
        }
        self.b.def_var(c.rptr, p);
        self.b.def_var(c.len, l);
        self.b.ins().jump(join, &[]);
        self.b.switch_to_block(join);
        let p = self.b.use_var(var);
        let l = self.b.use_var(c.len);
        (p, l)
    }
    /// Address of `n` bytes at offset `o` of the buffer in `r[b]`, bounds-checked (bails when out of bounds).
    fn addr(&mut self, b: R, o: Value, n: i64, write: bool, pc: usize) -> Value {
        let (p, l) = self.buf(b, write, pc);
        let neg = self.b.ins().icmp_imm_s(IntCC::SignedLessThan, o, 0);
        let end = self.b.ins().iadd_imm_s(o, n);
        let past = self.b.ins().icmp(IntCC::UnsignedGreaterThan, end, l);
        let bad = self.b.ins().bor(neg, past);
        self.bail_if(bad, pc);
        self.b.ins().iadd(p, o)
    }
    fn ea(&mut self, off: R, disp: i32, pc: usize) -> Value {
        let x = self.g(off);
        self.add_disp(x, disp, pc)
    }
    fn ea_x(&mut self, x: R, y: R, sc: u8, disp: i32, scaled_sum: bool, pc: usize) -> Value {
        let (xv, yv) = (self.g(x), self.g(y));
        let s = self.k64(sc as i64);
        let o = if scaled_sum {
            let (t, of1) = self.b.ins().sadd_overflow(xv, yv);
            self.bail_if(of1, pc);
            let (o, of2) = self.b.ins().smul_overflow(t, s);
            self.bail_if(of2, pc);
            o
        } else {
            let (t, of1) = self.b.ins().smul_overflow(yv, s);
            self.bail_if(of1, pc);
            let (o, of2) = self.b.ins().sadd_overflow(xv, t);
            self.bail_if(of2, pc);
            o
        };
        self.add_disp(o, disp, pc)
    }
    fn add_disp(&mut self, o: Value, disp: i32, pc: usize) -> Value {
        if disp == 0 {
            return o;
        }
        let k = self.k64(disp as i64);
        let (v, of) = self.b.ins().sadd_overflow(o, k);
        self.bail_if(of, pc);
        v
    }
    /// Loads `n` bytes (`kind`: 0 unsigned, 1 signed-to-i32) into `s[d]`.
    fn load(&mut self, d: R, b: R, o: Value, n: i64, signed: bool, pc: usize) {
        let a = self.addr(b, o, n, false, pc);
        let f = heapf();
        let v = match (n, signed) {
            (1, false) => self.b.ins().uload8(I64, f, a, 0),
            (2, false) => self.b.ins().uload16(I64, f, a, 0),
            (4, _) => self.b.ins().uload32(f, a, 0),
            (8, _) => self.b.ins().load(I64, f, a, 0),
            (1, true) => {
                let x = self.b.ins().sload8(I32, f, a, 0);
                self.b.ins().uextend(I64, x)
            }
            _ => {
                let x = self.b.ins().sload16(I32, f, a, 0);
                self.b.ins().uextend(I64, x)
            }
        };
        self.set(d, v);
    }
    fn store(&mut self, b: R, o: Value, v: R, n: i64, pc: usize) {
        let a = self.addr(b, o, n, true, pc);
        let x = self.g(v);
        let f = heapf();
        match n {
            1 => self.b.ins().istore8(f, x, a, 0),
            2 => self.b.ins().istore16(f, x, a, 0),
            4 => self.b.ins().istore32(f, x, a, 0),
            _ => self.b.ins().store(f, x, a, 0),
        };
    }
    fn field_off(&mut self, idx: R, size: u16, off: u16, pc: usize) -> Value {
        let x = self.g(idx);
        let s = self.k64(size as i64);
        let (m, of1) = self.b.ins().smul_overflow(x, s);
        let k = self.k64(off as i64);
        let (o, of2) = self.b.ins().sadd_overflow(m, k);
        let of = self.b.ins().bor(of1, of2);
        self.bail_if(of, pc);
        o
    }
    fn conv(&mut self, d: R, a: R, op: Conv, pc: usize) {
        let (from, to) = match op {
            Conv::TruncI32 => {
                let x = self.g32(a);
                return self.set32(d, x);
            }
            Conv::To { from, to } => (from, to),
        };
        enum W {
            I(Value),
            F(Value),
        }
        let w = match from {
            SK::I1 => {
                let x = self.g(a);
                W::I(self.b.ins().band_imm_s(x, 1))
            }
            SK::I32 => {
                let x = self.g32(a);
                W::I(self.b.ins().sextend(I64, x))
            }
            SK::I64 => W::I(self.g(a)),
            SK::F32 => {
                let x = self.f32v(a);
                W::F(self.b.ins().fpromote(F64, x))
            }
            SK::F64 => W::F(self.f64v(a)),
        };
        match (to, w) {
            (SK::I32, W::I(v)) => {
                let n = self.b.ins().ireduce(I32, v);
                let back = self.b.ins().sextend(I64, n);
                let bad = self.b.ins().icmp(IntCC::NotEqual, back, v);
                self.bail_if(bad, pc);
                self.set32(d, n);
            }
            (SK::I64, W::I(v)) => self.set(d, v),
            (SK::I32 | SK::I64, W::F(v)) => {
                let (lo, hi) = if to == SK::I32 {
                    (-2147483648.0, 2147483648.0)
                } else {
                    (-9223372036854775808.0, 9223372036854775808.0)
                };
                let t = self.b.ins().trunc(v);
                let lo = self.b.ins().f64const(lo);
                let hi = self.b.ins().f64const(hi);
                let ge = self.b.ins().fcmp(FloatCC::GreaterThanOrEqual, t, lo);
                let lt = self.b.ins().fcmp(FloatCC::LessThan, t, hi);
                let ok = self.b.ins().band(ge, lt);
                let bad = self.b.ins().icmp_imm_s(IntCC::Equal, ok, 0);
                self.bail_if(bad, pc);
                let i = self.b.ins().fcvt_to_sint_sat(I64, t);
                self.wrap(d, i, to == SK::I32);
            }
            (SK::F32, W::I(v)) => {
                let f = self.b.ins().fcvt_from_sint(F32, v);
                self.set_f32(d, f);
            }
            (SK::F64, W::I(v)) => {
                let f = self.b.ins().fcvt_from_sint(F64, v);
                self.set_f64(d, f);
            }
            (SK::F32, W::F(v)) => {
                let r = self.b.ins().fdemote(F32, v);
                if from == SK::F64 {
                    // finite input whose f32 rounding is infinite: the interpreter traps
                    let inf = self.b.ins().f32const(f32::INFINITY);
                    let ra = self.b.ins().fabs(r);
                    let rinf = self.b.ins().fcmp(FloatCC::Equal, ra, inf);
                    let vinf = self.b.ins().f64const(f64::INFINITY);
                    let va = self.b.ins().fabs(v);
                    let vfin = self.b.ins().fcmp(FloatCC::NotEqual, va, vinf);
                    let bad = self.b.ins().band(rinf, vfin);
                    self.bail_if(bad, pc);
                }
                self.set_f32(d, r);
            }
            (SK::F64, W::F(v)) => self.set_f64(d, v),
            (SK::I1, _) => self.exit_at_mid(pc),
        }
    }
    /// An unconditional exit in the middle of a block (the rest of the block is unreachable but well-formed).
    fn exit_at_mid(&mut self, pc: usize) {
        let t = self.b.ins().iconst(I8, 1);
        self.bail_if(t, pc);
    }

    /// Translates the instruction at `pc`; returns false when it ends the block with a terminator.
    fn instr(&mut self, pc: usize) -> bool {
        use Instr as I;
        let ins = self.fc.code[pc];
        if !translated(&ins) {
            // The interpreter executes it (a call, a native, a string or list op, ...) and re-enters at pc + 1.
            self.exit_at(pc);
            return false;
        }
        macro_rules! ii {
            ($op:ident, $d:expr, $a:expr, $b:expr) => {{
                let (x, y) = (self.g($a), self.g($b));
                let v = self.b.ins().$op(x, y);
                self.set($d, v);
            }};
        }
        macro_rules! ii32 {
            ($op:ident, $d:expr, $a:expr, $b:expr) => {{
                let (x, y) = (self.g32($a), self.g32($b));
                let v = self.b.ins().$op(x, y);
                self.set32($d, v);
            }};
        }
        macro_rules! cmp {
            ($cc:expr, $d:expr, $x:expr, $y:expr) => {{
                let (x, y) = ($x, $y);
                let c = self.b.ins().icmp($cc, x, y);
                self.set_bool($d, c);
            }};
        }
        macro_rules! fop {
            ($op:ident, $d:expr, $a:expr, $b:expr, $w:expr) => {{
                if $w {
                    let (x, y) = (self.f64v($a), self.f64v($b));
                    let v = self.b.ins().$op(x, y);
                    self.set_f64($d, v);
                } else {
                    let (x, y) = (self.f32v($a), self.f32v($b));
                    let v = self.b.ins().$op(x, y);
                    self.set_f32($d, v);
                }
            }};
        }
        use IntCC::*;
        match ins {
            I::Fuel { n } => self.charge(n as u64, pc),
            I::Jump { target, fuel } => {
                self.charge(fuel as u64, pc);
                let t = self.block(target);
                self.b.ins().jump(t, &[]);
                return false;
            }
            I::Jz {
                c,
                target,
                fuel,
                tfuel,
            } => {
                let x = self.g(c);
                let z = self.b.ins().icmp_imm_s(Equal, x, 0);
                self.jif(z, target, fuel, tfuel, pc);
            }
            I::JEq {
                a,
                b,
                target,
                fuel,
                tfuel,
            } => self.jcmp(Equal, a, b, false, target, fuel, tfuel, pc),
            I::JNe {
                a,
                b,
                target,
                fuel,
                tfuel,
            } => self.jcmp(NotEqual, a, b, false, target, fuel, tfuel, pc),
            I::JUlt {
                a,
                b,
                target,
                fuel,
                tfuel,
            } => self.jcmp(UnsignedLessThan, a, b, false, target, fuel, tfuel, pc),
            I::JUle {
                a,
                b,
                target,
                fuel,
                tfuel,
            } => self.jcmp(
                UnsignedLessThanOrEqual,
                a,
                b,
                false,
                target,
                fuel,
                tfuel,
                pc,
            ),
            I::JUgt {
                a,
                b,
                target,
                fuel,
                tfuel,
            } => self.jcmp(UnsignedGreaterThan, a, b, false, target, fuel, tfuel, pc),
            I::JUge {
                a,
                b,
                target,
                fuel,
                tfuel,
            } => self.jcmp(
                UnsignedGreaterThanOrEqual,
                a,
                b,
                false,
                target,
                fuel,
                tfuel,
                pc,
            ),
            I::JLt64 {
                a,
                b,
                target,
                fuel,
                tfuel,
            } => self.jcmp(SignedLessThan, a, b, false, target, fuel, tfuel, pc),
            I::JLe64 {
                a,
                b,
                target,
                fuel,
                tfuel,
            } => self.jcmp(SignedLessThanOrEqual, a, b, false, target, fuel, tfuel, pc),
            I::JGt64 {
                a,
                b,
                target,
                fuel,
                tfuel,
            } => self.jcmp(SignedGreaterThan, a, b, false, target, fuel, tfuel, pc),
            I::JGe64 {
                a,
                b,
                target,
                fuel,
                tfuel,
            } => self.jcmp(
                SignedGreaterThanOrEqual,
                a,
                b,
                false,
                target,
                fuel,
                tfuel,
                pc,
            ),
            I::JLt32 {
                a,
                b,
                target,
                fuel,
                tfuel,
            } => self.jcmp(SignedLessThan, a, b, true, target, fuel, tfuel, pc),
            I::JLe32 {
                a,
                b,
                target,
                fuel,
                tfuel,
            } => self.jcmp(SignedLessThanOrEqual, a, b, true, target, fuel, tfuel, pc),
            I::JGt32 {
                a,
                b,
                target,
                fuel,
                tfuel,
            } => self.jcmp(SignedGreaterThan, a, b, true, target, fuel, tfuel, pc),
            I::JGe32 {
                a,
                b,
                target,
                fuel,
                tfuel,
            } => self.jcmp(
                SignedGreaterThanOrEqual,
                a,
                b,
                true,
                target,
                fuel,
                tfuel,
                pc,
            ),
            I::JEqK {
                a,
                k,
                target,
                fuel,
                tfuel,
            } => self.jcmpk(Equal, a, k, false, target, fuel, tfuel, pc),
            I::JNeK {
                a,
                k,
                target,
                fuel,
                tfuel,
            } => self.jcmpk(NotEqual, a, k, false, target, fuel, tfuel, pc),
            I::JLtK64 {
                a,
                k,
                target,
                fuel,
                tfuel,
            } => self.jcmpk(SignedLessThan, a, k, false, target, fuel, tfuel, pc),
            I::JLeK64 {
                a,
                k,
                target,
                fuel,
                tfuel,
            } => self.jcmpk(SignedLessThanOrEqual, a, k, false, target, fuel, tfuel, pc),
            I::JGtK64 {
                a,
                k,
                target,
                fuel,
                tfuel,
            } => self.jcmpk(SignedGreaterThan, a, k, false, target, fuel, tfuel, pc),
            I::JGeK64 {
                a,
                k,
                target,
                fuel,
                tfuel,
            } => self.jcmpk(
                SignedGreaterThanOrEqual,
                a,
                k,
                false,
                target,
                fuel,
                tfuel,
                pc,
            ),
            I::JLtK32 {
                a,
                k,
                target,
                fuel,
                tfuel,
            } => self.jcmpk(SignedLessThan, a, k, true, target, fuel, tfuel, pc),
            I::JLeK32 {
                a,
                k,
                target,
                fuel,
                tfuel,
            } => self.jcmpk(SignedLessThanOrEqual, a, k, true, target, fuel, tfuel, pc),
            I::JGtK32 {
                a,
                k,
                target,
                fuel,
                tfuel,
            } => self.jcmpk(SignedGreaterThan, a, k, true, target, fuel, tfuel, pc),
            I::JGeK32 {
                a,
                k,
                target,
                fuel,
                tfuel,
            } => self.jcmpk(
                SignedGreaterThanOrEqual,
                a,
                k,
                true,
                target,
                fuel,
                tfuel,
                pc,
            ),
            I::JTestNz {
                a,
                mask,
                target,
                fuel,
                tfuel,
            }
            | I::JTestZ {
                a,
                mask,
                target,
                fuel,
                tfuel,
            } => {
                let x = self.g(a);
                let m = self.b.ins().band_imm_s(x, mask as i64);
                let cc = if matches!(ins, I::JTestNz { .. }) {
                    NotEqual
                } else {
                    Equal
                };
                let c = self.b.ins().icmp_imm_s(cc, m, 0);
                self.jif(c, target, fuel, tfuel, pc);
            }
            I::ForLoop {
                iv,
                hi,
                step,
                target,
                fuel,
            } => {
                let s = self.g(step);
                self.for_loop(iv, hi, s, target, fuel, pc);
            }
            I::ForLoopK {
                iv,
                hi,
                step,
                target,
                fuel,
            } => {
                let s = self.k64(step as i64);
                self.for_loop(iv, hi, s, target, fuel, pc);
            }
            I::StepCheck { step } => {
                let x = self.g(step);
                let c = self.b.ins().icmp_imm_s(SignedLessThanOrEqual, x, 0);
                self.bail_if(c, pc);
            }
            I::Ret { .. } => {
                self.exit_at(pc);
                return false;
            }
            I::MovS { d, a } => {
                let x = self.g(a);
                self.set(d, x)
            }
            I::MovR { d, a } => {
                let h = self.rload(a);
                self.rstore(d, h)
            }
            I::ConstS { d, bits } => {
                let x = self.k64(bits as i64);
                self.set(d, x)
            }
            I::ConstNull { d } => {
                let z = self.b.ins().iconst(I32, 0);
                self.rstore(d, z)
            }
            I::SelS { d, c, a, b } => {
                let (cv, x, y) = (self.g(c), self.g(a), self.g(b));
                let v = self.b.ins().select(cv, x, y);
                self.set(d, v)
            }
            I::SelR { d, c, a, b } => {
                let cv = self.g(c);
                let (x, y) = (self.rload(a), self.rload(b));
                let v = self.b.ins().select(cv, x, y);
                self.rstore(d, v)
            }
            I::IsNull { d, a } => {
                let h = self.rload(a);
                let c = self.b.ins().icmp_imm_s(Equal, h, 0);
                self.set_bool(d, c)
            }
            I::Unwrap { d, a } => {
                let h = self.rload(a);
                let c = self.b.ins().icmp_imm_s(Equal, h, 0);
                self.bail_if(c, pc);
                self.rstore(d, h)
            }
            I::Add32 { d, a, b } => self.chk_rr(d, a, b, 0, true, pc),
            I::Add64 { d, a, b } => self.chk_rr(d, a, b, 0, false, pc),
            I::Sub32 { d, a, b } => self.chk_rr(d, a, b, 1, true, pc),
            I::Sub64 { d, a, b } => self.chk_rr(d, a, b, 1, false, pc),
            I::Mul32 { d, a, b } => self.chk_rr(d, a, b, 2, true, pc),
            I::Mul64 { d, a, b } => self.chk_rr(d, a, b, 2, false, pc),
            I::AddK32 { d, a, k } => self.chk_rk(d, a, k, 0, true, pc),
            I::AddK64 { d, a, k } => self.chk_rk(d, a, k, 0, false, pc),
            I::SubK32 { d, a, k } => self.chk_rk(d, a, k, 1, true, pc),
            I::SubK64 { d, a, k } => self.chk_rk(d, a, k, 1, false, pc),
            I::MulK32 { d, a, k } => self.chk_rk(d, a, k, 2, true, pc),
            I::MulK64 { d, a, k } => self.chk_rk(d, a, k, 2, false, pc),
            I::AddW32 { d, a, b } | I::AddW64 { d, a, b } => {
                let (x, y) = (self.g(a), self.g(b));
                let v = self.b.ins().iadd(x, y);
                self.wrap(d, v, matches!(ins, I::AddW32 { .. }))
            }
            I::SubW32 { d, a, b } | I::SubW64 { d, a, b } => {
                let (x, y) = (self.g(a), self.g(b));
                let v = self.b.ins().isub(x, y);
                self.wrap(d, v, matches!(ins, I::SubW32 { .. }))
            }
            I::MulW32 { d, a, b } | I::MulW64 { d, a, b } => {
                let (x, y) = (self.g(a), self.g(b));
                let v = self.b.ins().imul(x, y);
                self.wrap(d, v, matches!(ins, I::MulW32 { .. }))
            }
            I::AddWK32 { d, a, k } | I::AddWK64 { d, a, k } => {
                let x = self.g(a);
                let v = self.b.ins().iadd_imm_s(x, k as i64);
                self.wrap(d, v, matches!(ins, I::AddWK32 { .. }))
            }
            I::MulWK32 { d, a, k } | I::MulWK64 { d, a, k } => {
                let x = self.g(a);
                let v = self.b.ins().imul_imm_s(x, k as i64);
                self.wrap(d, v, matches!(ins, I::MulWK32 { .. }))
            }
            I::MulAddW64 { d, a, b, c } => {
                let (x, y, z) = (self.g(a), self.g(b), self.g(c));
                let m = self.b.ins().imul(x, y);
                let v = self.b.ins().iadd(m, z);
                self.set(d, v)
            }
            I::MulKAddW64 { d, a, k, c } => {
                let (x, z) = (self.g(a), self.g(c));
                let m = self.b.ins().imul_imm_s(x, k as i64);
                let v = self.b.ins().iadd(m, z);
                self.set(d, v)
            }
            I::Div32 { d, a, b } => self.div(d, a, b, true, false, true, pc),
            I::Div64 { d, a, b } => self.div(d, a, b, true, false, false, pc),
            I::Rem32 { d, a, b } => self.div(d, a, b, true, true, true, pc),
            I::Rem64 { d, a, b } => self.div(d, a, b, true, true, false, pc),
            I::DivU32 { d, a, b } => self.div(d, a, b, false, false, true, pc),
            I::DivU64 { d, a, b } => self.div(d, a, b, false, false, false, pc),
            I::RemU32 { d, a, b } => self.div(d, a, b, false, true, true, pc),
            I::RemU64 { d, a, b } => self.div(d, a, b, false, true, false, pc),
            I::Min32 { d, a, b } => ii32!(smin, d, a, b),
            I::Min64 { d, a, b } => ii!(smin, d, a, b),
            I::Max32 { d, a, b } => ii32!(smax, d, a, b),
            I::Max64 { d, a, b } => ii!(smax, d, a, b),
            I::Neg32 { d, a } | I::Abs32 { d, a } => {
                let x = self.g32(a);
                let mn = self.k32(i32::MIN);
                let c = self.b.ins().icmp(Equal, x, mn);
                self.bail_if(c, pc);
                let v = if matches!(ins, I::Neg32 { .. }) {
                    self.b.ins().ineg(x)
                } else {
                    self.b.ins().iabs(x)
                };
                self.set32(d, v)
            }
            I::Neg64 { d, a } | I::Abs64 { d, a } => {
                let x = self.g(a);
                let c = self.b.ins().icmp_imm_s(Equal, x, i64::MIN);
                self.bail_if(c, pc);
                let v = if matches!(ins, I::Neg64 { .. }) {
                    self.b.ins().ineg(x)
                } else {
                    self.b.ins().iabs(x)
                };
                self.set(d, v)
            }
            I::And { d, a, b } => ii!(band, d, a, b),
            I::Or { d, a, b } => ii!(bor, d, a, b),
            I::Xor { d, a, b } => ii!(bxor, d, a, b),
            I::AndK { d, a, k } => {
                let x = self.g(a);
                let v = self.b.ins().band_imm_s(x, k as i64);
                self.set(d, v)
            }
            I::AndK64 { d, a, k } => {
                let x = self.g(a);
                let v = self.b.ins().band_imm_s(x, k as i64);
                self.set(d, v)
            }
            I::OrK { d, a, k } => {
                let x = self.g(a);
                let v = self.b.ins().bor_imm_s(x, k as i64);
                self.set(d, v)
            }
            I::XorK { d, a, k } => {
                let x = self.g(a);
                let v = self.b.ins().bxor_imm_s(x, k as i64);
                self.set(d, v)
            }
            I::Not1 { d, a } => {
                let x = self.g(a);
                let v = self.b.ins().bxor_imm_s(x, 1);
                self.set(d, v)
            }
            I::Not32 { d, a } => {
                let x = self.g32(a);
                let v = self.b.ins().bnot(x);
                self.set32(d, v)
            }
            I::Not64 { d, a } => {
                let x = self.g(a);
                let v = self.b.ins().bnot(x);
                self.set(d, v)
            }
            I::Shl32 { d, a, b } => ii32!(ishl, d, a, b),
            I::Shr32 { d, a, b } => ii32!(sshr, d, a, b),
            I::ShrU32 { d, a, b } => ii32!(ushr, d, a, b),
            I::Shl64 { d, a, b } => ii!(ishl, d, a, b),
            I::Shr64 { d, a, b } => ii!(sshr, d, a, b),
            I::ShrU64 { d, a, b } => ii!(ushr, d, a, b),
            I::ShlK32 { d, a, k } | I::ShrK32 { d, a, k } | I::ShrUK32 { d, a, k } => {
                let x = self.g32(a);
                let k = k as i64;
                let v = match ins {
                    I::ShlK32 { .. } => self.b.ins().ishl_imm_u(x, k),
                    I::ShrK32 { .. } => self.b.ins().sshr_imm_u(x, k),
                    _ => self.b.ins().ushr_imm_u(x, k),
                };
                self.set32(d, v)
            }
            I::ShlK64 { d, a, k } | I::ShrK64 { d, a, k } | I::ShrUK64 { d, a, k } => {
                let x = self.g(a);
                let k = k as i64;
                let v = match ins {
                    I::ShlK64 { .. } => self.b.ins().ishl_imm_u(x, k),
                    I::ShrK64 { .. } => self.b.ins().sshr_imm_u(x, k),
                    _ => self.b.ins().ushr_imm_u(x, k),
                };
                self.set(d, v)
            }
            I::Eq { d, a, b } => cmp!(Equal, d, self.g(a), self.g(b)),
            I::Ne { d, a, b } => cmp!(NotEqual, d, self.g(a), self.g(b)),
            I::Ult { d, a, b } => cmp!(UnsignedLessThan, d, self.g(a), self.g(b)),
            I::Ule { d, a, b } => cmp!(UnsignedLessThanOrEqual, d, self.g(a), self.g(b)),
            I::Lt32 { d, a, b } => cmp!(SignedLessThan, d, self.g32(a), self.g32(b)),
            I::Le32 { d, a, b } => cmp!(SignedLessThanOrEqual, d, self.g32(a), self.g32(b)),
            I::Lt64 { d, a, b } => cmp!(SignedLessThan, d, self.g(a), self.g(b)),
            I::Le64 { d, a, b } => cmp!(SignedLessThanOrEqual, d, self.g(a), self.g(b)),
            I::EqK { d, a, k } => cmp!(Equal, d, self.g(a), self.k64(k as i64)),
            I::NeK { d, a, k } => cmp!(NotEqual, d, self.g(a), self.k64(k as i64)),
            I::LtK32 { d, a, k } => cmp!(SignedLessThan, d, self.g32(a), self.k32(k)),
            I::LeK32 { d, a, k } => cmp!(SignedLessThanOrEqual, d, self.g32(a), self.k32(k)),
            I::GtK32 { d, a, k } => cmp!(SignedGreaterThan, d, self.g32(a), self.k32(k)),
            I::GeK32 { d, a, k } => cmp!(SignedGreaterThanOrEqual, d, self.g32(a), self.k32(k)),
            I::LtK64 { d, a, k } => cmp!(SignedLessThan, d, self.g(a), self.k64(k as i64)),
            I::LeK64 { d, a, k } => cmp!(SignedLessThanOrEqual, d, self.g(a), self.k64(k as i64)),
            I::GtK64 { d, a, k } => cmp!(SignedGreaterThan, d, self.g(a), self.k64(k as i64)),
            I::GeK64 { d, a, k } => {
                cmp!(SignedGreaterThanOrEqual, d, self.g(a), self.k64(k as i64))
            }
            I::FAdd32 { d, a, b } => fop!(fadd, d, a, b, false),
            I::FAdd64 { d, a, b } => fop!(fadd, d, a, b, true),
            I::FSub32 { d, a, b } => fop!(fsub, d, a, b, false),
            I::FSub64 { d, a, b } => fop!(fsub, d, a, b, true),
            I::FMul32 { d, a, b } => fop!(fmul, d, a, b, false),
            I::FMul64 { d, a, b } => fop!(fmul, d, a, b, true),
            I::FBin { d, a, b, op, wide } => {
                let (x, y) = (self.fwide(a, wide), self.fwide(b, wide));
                let v = match op {
                    FBin::Div => self.b.ins().fdiv(x, y),
                    _ => unreachable!("ineligible"),
                };
                self.set_fwide(d, v, wide)
            }
            I::FUn { d, a, op, wide } => {
                let x = self.fwide(a, wide);
                let v = match op {
                    FUn::Neg => self.b.ins().fneg(x),
                    FUn::Abs => self.b.ins().fabs(x),
                    FUn::Sqrt => self.b.ins().sqrt(x),
                    _ => unreachable!("ineligible"),
                };
                self.set_fwide(d, v, wide)
            }
            I::FCmp { d, a, b, op, wide } => {
                let (x, y) = (self.fwide(a, wide), self.fwide(b, wide));
                let cc = match op {
                    FCmp::Eq => FloatCC::Equal,
                    FCmp::Ne => FloatCC::NotEqual,
                    FCmp::Lt => FloatCC::LessThan,
                    FCmp::Le => FloatCC::LessThanOrEqual,
                    FCmp::Gt => FloatCC::GreaterThan,
                    FCmp::Ge => FloatCC::GreaterThanOrEqual,
                };
                let c = self.b.ins().fcmp(cc, x, y);
                self.set_bool(d, c)
            }
            I::Conv { d, a, op } => self.conv(d, a, op, pc),
            I::BufNew { d, len } => {
                let n = self.g(len);
                let call = self.b.ins().call(self.h_new, &[self.ctx, n]);
                let h = self.b.inst_results(call)[0];
                let c = self.b.ins().icmp_imm_s(Equal, h, 0);
                self.bail_if(c, pc);
                self.rstore(d, h)
            }
            I::BufLen { d, b } => {
                let (_, l) = self.buf(b, false, pc);
                self.set(d, l)
            }
            I::Ld8s { d, b, off, disp } => {
                let o = self.ea(off, disp, pc);
                self.load(d, b, o, 1, true, pc)
            }
            I::Ld8u { d, b, off, disp } => {
                let o = self.ea(off, disp, pc);
                self.load(d, b, o, 1, false, pc)
            }
            I::Ld16s { d, b, off, disp } => {
                let o = self.ea(off, disp, pc);
                self.load(d, b, o, 2, true, pc)
            }
            I::Ld16u { d, b, off, disp } => {
                let o = self.ea(off, disp, pc);
                self.load(d, b, o, 2, false, pc)
            }
            I::Ld32 { d, b, off, disp } => {
                let o = self.ea(off, disp, pc);
                self.load(d, b, o, 4, false, pc)
            }
            I::Ld64 { d, b, off, disp } => {
                let o = self.ea(off, disp, pc);
                self.load(d, b, o, 8, false, pc)
            }
            I::St8 { b, off, v, disp } => {
                let o = self.ea(off, disp, pc);
                self.store(b, o, v, 1, pc)
            }
            I::St16 { b, off, v, disp } => {
                let o = self.ea(off, disp, pc);
                self.store(b, o, v, 2, pc)
            }
            I::St32 { b, off, v, disp } => {
                let o = self.ea(off, disp, pc);
                self.store(b, o, v, 4, pc)
            }
            I::St64 { b, off, v, disp } => {
                let o = self.ea(off, disp, pc);
                self.store(b, o, v, 8, pc)
            }
            I::Ld32X {
                d,
                b,
                x,
                y,
                sc,
                disp,
            } => {
                let o = self.ea_x(x, y, sc, disp, false, pc);
                self.load(d, b, o, 4, false, pc)
            }
            I::Ld32XS {
                d,
                b,
                x,
                y,
                sc,
                disp,
            } => {
                let o = self.ea_x(x, y, sc, disp, true, pc);
                self.load(d, b, o, 4, false, pc)
            }
            I::Ld64X {
                d,
                b,
                x,
                y,
                sc,
                disp,
            } => {
                let o = self.ea_x(x, y, sc, disp, false, pc);
                self.load(d, b, o, 8, false, pc)
            }
            I::Ld64XS {
                d,
                b,
                x,
                y,
                sc,
                disp,
            } => {
                let o = self.ea_x(x, y, sc, disp, true, pc);
                self.load(d, b, o, 8, false, pc)
            }
            I::St32X {
                b,
                x,
                y,
                v,
                sc,
                disp,
            } => {
                let o = self.ea_x(x, y, sc, disp, false, pc);
                self.store(b, o, v, 4, pc)
            }
            I::St32XS {
                b,
                x,
                y,
                v,
                sc,
                disp,
            } => {
                let o = self.ea_x(x, y, sc, disp, true, pc);
                self.store(b, o, v, 4, pc)
            }
            I::St64X {
                b,
                x,
                y,
                v,
                sc,
                disp,
            } => {
                let o = self.ea_x(x, y, sc, disp, false, pc);
                self.store(b, o, v, 8, pc)
            }
            I::St64XS {
                b,
                x,
                y,
                v,
                sc,
                disp,
            } => {
                let o = self.ea_x(x, y, sc, disp, true, pc);
                self.store(b, o, v, 8, pc)
            }
            I::LdField {
                d,
                b,
                idx,
                size,
                off,
                kind,
            } => {
                let o = self.field_off(idx, size, off, pc);
                match kind {
                    SK::I1 => {
                        let a = self.addr(b, o, 1, false, pc);
                        let x = self.b.ins().uload8(I64, heapf(), a, 0);
                        let c = self.b.ins().icmp_imm_s(NotEqual, x, 0);
                        self.set_bool(d, c)
                    }
                    SK::I32 | SK::F32 => self.load(d, b, o, 4, false, pc),
                    SK::I64 | SK::F64 => self.load(d, b, o, 8, false, pc),
                }
            }
            I::StField {
                b,
                idx,
                v,
                size,
                off,
                kind,
            } => {
                let o = self.field_off(idx, size, off, pc);
                let n = match kind {
                    SK::I1 => 1,
                    SK::I32 | SK::F32 => 4,
                    SK::I64 | SK::F64 => 8,
                };
                self.store(b, o, v, n, pc)
            }
            _ => {
                // Not translated (filtered above).
                self.exit_at(pc);
                return false;
            }
        }
        true
    }
}
