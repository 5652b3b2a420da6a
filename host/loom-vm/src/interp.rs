//! The interpreter: one `match` per instruction over the current frame's register slices.
//!
//! Loom calls never recurse on the Rust stack: a call pushes a [`Frame`] record and continues the same loop
//! with the callee's code and register slices, a return pops it. The inner loop ([`exec`]) leaves for calls,
//! returns, traps and *slow* instructions (everything in [`cold`], and native calls), which `run` executes
//! before re-entering the loop at the next pc. The loop itself calls no function on its non-trapping paths
//! (except the copy-on-write of a shared buffer), so LLVM keeps the code pointer and length, pc, fuel and the
//! register windows in machine registers (first pass: all of them were spilled and reloaded per dispatch).

use crate::code::*;
use crate::error::{NativeError, Trap, TrapKind};
use crate::heap::{Buf, Fault, Heap, OBJ_OVERHEAD, Obj, internal};
use crate::native::NativeCtx;
use crate::value::Value;
use crate::{Inner, InvokeLimits};
use loom_ir::Type;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

mod cold;
use cold::cold;

#[derive(Clone, Copy, Debug)]
struct Frame {
    func: u32,
    /// Resume pc (while a callee runs).
    pc: u32,
    sbase: usize,
    rbase: usize,
    /// The caller's call site that created this frame.
    site: u32,
}

enum Exit {
    Fault(Fault),
    /// The instruction before the returned pc is not handled by the dispatch loop (a cold instruction or a
    /// native call): `run` executes it and re-enters the loop. Keeping every call out of the loop lets LLVM
    /// keep the loop's state (code, pc, fuel, register windows) in machine registers.
    Slow,
    Call(u32),
    Ret(u32),
}

pub(crate) struct Outcome {
    pub(crate) result: Result<(), Trap>,
    pub(crate) fuel_left: u64,
    pub(crate) mem_used: u64,
}

fn mk_trap(p: &Inner, func: u32, pc: usize, f: Fault) -> Trap {
    let fc = p.funcs.get(func as usize);
    Trap {
        kind: f.kind,
        func: fc.map(|c| c.name.clone()).unwrap_or_default(),
        pc: pc as u32,
        loc: fc.and_then(|c| c.locs.get(pc).copied()).unwrap_or_default(),
        file: fc
            .and_then(|c| p.files.get(c.file as usize).cloned())
            .unwrap_or_default(),
        message: f.msg,
    }
}

#[inline(always)]
fn ea(base: u64, disp: i32) -> Result<i64, Fault> {
    (base as i64).checked_add(disp as i64).ok_or_else(|| {
        Fault::new(
            TrapKind::IntegerOverflow,
            "i64 add overflow computing a buffer offset",
        )
    })
}

/// Offset of the indexed `X` forms: `x + y * sc + disp`, each step checked like the `mul`/`add` it replaces.
#[inline(always)]
fn ea_x(x: u64, y: u64, sc: u8, disp: i32) -> Result<i64, Fault> {
    let t = (y as i64)
        .checked_mul(sc as i64)
        .ok_or_else(|| ovf("i64 mul"))?;
    let o = (x as i64).checked_add(t).ok_or_else(|| ovf("i64 add"))?;
    ea(o as u64, disp)
}

/// Offset of the indexed `XS` forms: `(x + y) * sc + disp`.
#[inline(always)]
fn ea_xs(x: u64, y: u64, sc: u8, disp: i32) -> Result<i64, Fault> {
    let t = (x as i64)
        .checked_add(y as i64)
        .ok_or_else(|| ovf("i64 add"))?;
    let o = t.checked_mul(sc as i64).ok_or_else(|| ovf("i64 mul"))?;
    ea(o as u64, disp)
}

#[inline(always)]
fn get<const N: usize>(b: &[u8], o: i64) -> Option<[u8; N]> {
    let o = usize::try_from(o).ok()?;
    b.get(o..o.checked_add(N)?)?.try_into().ok()
}

#[inline(always)]
fn put<const N: usize>(b: &mut [u8], o: i64, v: [u8; N]) -> bool {
    let Ok(o) = usize::try_from(o) else {
        return false;
    };
    let Some(end) = o.checked_add(N) else {
        return false;
    };
    match b.get_mut(o..end) {
        Some(d) => {
            d.copy_from_slice(&v);
            true
        }
        None => false,
    }
}

#[cold]
fn oob(what: &str, off: i64, n: i64, len: usize) -> Fault {
    Fault::new(
        TrapKind::OutOfBounds,
        format!("{what} out of bounds: offset {off}, length {n}, buffer length {len}"),
    )
}

#[cold]
fn ovf(what: &str) -> Fault {
    Fault::new(
        TrapKind::IntegerOverflow,
        format!("integer overflow in {what}"),
    )
}

#[cold]
fn div0(what: &str) -> Fault {
    Fault::new(TrapKind::DivisionByZero, format!("{what} by zero"))
}

/// Bulk operations (`buffer.new`, `slice`, `copy`, `fill`, `concat`, string building and conversions) cost one
/// fuel unit per `2^BULK_FUEL_SHIFT` bytes they touch, on top of the instruction's own unit, so that fuel bounds
/// their time as it bounds any loop's: a megabyte costs 16,384 units.
pub(crate) const BULK_FUEL_SHIFT: u32 = 6;

/// Charges the bulk fuel of an operation touching `bytes` bytes (see [`BULK_FUEL_SHIFT`]).
#[inline]
pub(crate) fn bulk_fuel(fuel: &mut u64, bytes: u64) -> Result<(), Fault> {
    let cost = bytes >> BULK_FUEL_SHIFT;
    if *fuel < cost {
        return Err(out_of_fuel());
    }
    *fuel -= cost;
    Ok(())
}

#[cold]
fn out_of_fuel() -> Fault {
    Fault::new(TrapKind::OutOfFuel, "out of fuel")
}

/// A byte range `[off, off+len)` inside a buffer of `blen` bytes.
fn range(what: &str, off: u64, len: u64, blen: usize) -> Result<std::ops::Range<usize>, Fault> {
    let (o, l) = (off as i64, len as i64);
    if o < 0 || l < 0 || o.checked_add(l).is_none_or(|e| e as u64 > blen as u64) {
        return Err(oob(what, o, l, blen));
    }
    Ok(o as usize..(o + l) as usize)
}

fn f2i(v: f64, lo: f64, hi: f64) -> Option<i64> {
    if !v.is_finite() {
        return None;
    }
    let t = v.trunc();
    if t < lo || t >= hi {
        None
    } else {
        Some(t as i64)
    }
}

fn fmin(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else if a == b {
        if a.is_sign_negative() { a } else { b }
    } else {
        a.min(b)
    }
}

fn fmax(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else if a == b {
        if a.is_sign_positive() { a } else { b }
    } else {
        a.max(b)
    }
}

fn conv(op: Conv, bits: u64) -> Result<u64, Fault> {
    let bad = |what: String| Fault::new(TrapKind::BadConversion, what);
    Ok(match op {
        Conv::TruncI32 => bits as u32 as u64,
        Conv::To { from, to } => {
            // Widen the source exactly, then narrow with checks.
            /// The source value widened exactly: to i64 or to f64.
            enum Widened {
                Int(i64),
                Float(f64),
            }
            let w = match from {
                ScalarKind::I1 => Widened::Int((bits & 1) as i64),
                ScalarKind::I32 => Widened::Int(bits as i32 as i64),
                ScalarKind::I64 => Widened::Int(bits as i64),
                ScalarKind::F32 => Widened::Float(f32::from_bits(bits as u32) as f64),
                ScalarKind::F64 => Widened::Float(f64::from_bits(bits)),
            };
            match (to, w) {
                (ScalarKind::I32, Widened::Int(v)) => i32::try_from(v)
                    .map_err(|_| bad(format!("conv.i32: {v} does not fit in i32")))?
                    as u32 as u64,
                (ScalarKind::I32, Widened::Float(v)) => f2i(v, -2147483648.0, 2147483648.0)
                    .ok_or_else(|| bad(format!("conv.i32: {v} does not fit in i32")))?
                    as i32 as u32 as u64,
                (ScalarKind::I64, Widened::Int(v)) => v as u64,
                (ScalarKind::I64, Widened::Float(v)) => {
                    f2i(v, -9223372036854775808.0, 9223372036854775808.0)
                        .ok_or_else(|| bad(format!("conv.i64: {v} does not fit in i64")))?
                        as u64
                }
                (ScalarKind::F32, Widened::Int(v)) => (v as f32).to_bits() as u64,
                (ScalarKind::F32, Widened::Float(v)) => {
                    let r = v as f32;
                    if v.is_finite() && r.is_infinite() {
                        return Err(bad(format!("conv.f32: {v} does not fit in f32")));
                    }
                    r.to_bits() as u64
                }
                (ScalarKind::F64, Widened::Int(v)) => (v as f64).to_bits(),
                (ScalarKind::F64, Widened::Float(v)) => v.to_bits(),
                (ScalarKind::I1, _) => return Err(internal("conversion to i1")),
            }
        }
    })
}

/// Registers addressable by one frame: a `u16` index. Every frame sees a window of exactly this many registers
/// (the stacks always extend at least `WINDOW` slots past the current frame's base), so a `u16` register index
/// needs no bounds check in the dispatch loop. Registers past the frame's own `n_s`/`n_r` are scratch that the
/// program never reads (lowering only reads registers it wrote).
pub(crate) const WINDOW: usize = 1 << 16;

type SWin = [u64; WINDOW];
type RWin = [u32; WINDOW];

/// Register stacks and frame records, pooled per thread so an invocation does not allocate or zero them. Between
/// invocations the stacks are all zero (the used prefix is cleared on return), so no value of one invocation is
/// ever visible to the next.
struct Stacks {
    /// The invocation heap, reset (objects dropped, capacity kept) between invocations.
    heap: Heap,
    ss: Vec<u64>,
    rs: Vec<u32>,
    frames: Vec<Frame>,
    /// High-water marks of the registers written (exclusive): what must be zeroed before reuse.
    hw_s: usize,
    hw_r: usize,
}

/// A heap whose object table grew past this many entries is not kept in the pool.
const POOL_MAX_OBJS: usize = 4096;

/// Stacks larger than this are not kept in the pool (a deep recursion should not pin its memory forever).
const POOL_MAX_SLOTS: usize = 8 * WINDOW;

impl Stacks {
    fn new() -> Stacks {
        Stacks {
            heap: Heap::new(0, 0),
            ss: vec![0; 2 * WINDOW],
            rs: vec![0; 2 * WINDOW],
            frames: Vec::with_capacity(32),
            hw_s: 0,
            hw_r: 0,
        }
    }

    /// Zeroes what the last invocation wrote.
    fn clear(&mut self) {
        let (hs, hr) = (self.hw_s.min(self.ss.len()), self.hw_r.min(self.rs.len()));
        zero(&mut self.ss[..hs]);
        zero(&mut self.rs[..hr]);
        self.hw_s = 0;
        self.hw_r = 0;
        self.frames.clear();
        self.heap.reset(0, 0);
    }
}

/// Zeroes `v`. Short ranges (the common case for small invocations) are written one by one: a `memset` call
/// for a few bytes costs more than the invocation itself on CPUs where the libc's small-size path uses masked
/// vector stores (measured: ~110 ns per call on the AMD EPYC bench machine).
fn zero<T: Copy + Default>(v: &mut [T]) {
    if v.len() <= 32 {
        for x in v {
            // `black_box` keeps LLVM from turning the loop back into a `memset` call.
            *x = std::hint::black_box(T::default());
        }
    } else {
        v.fill(T::default());
    }
}

thread_local! {
    static POOL: std::cell::RefCell<Option<Stacks>> = const { std::cell::RefCell::new(None) };
}

/// Runs `entry` with `args` (already type-checked) under `limits`, writing its results into `out`. Panics inside
/// are caught and reported as an internal trap: a VM bug must not take the server down.
pub(crate) fn invoke(
    p: &Inner,
    entry: u32,
    args: &[Value],
    limits: &InvokeLimits,
    out: &mut Vec<Value>,
    use_jit: bool,
    host: &mut Option<crate::native::HostState>,
) -> Outcome {
    // The pooled stacks are used in place (no move in or out of the thread-local). A native that re-enters the
    // VM on this thread finds the pool borrowed and gets fresh stacks and heap.
    let pooled = POOL.try_with(|c| {
        let mut g = c.try_borrow_mut().ok()?;
        let st = g.get_or_insert_with(Stacks::new);
        let (o, keep) = invoke_with(p, entry, args, limits, out, st, use_jit, host);
        if !keep {
            *g = None;
        }
        Some(o)
    });
    match pooled {
        Ok(Some(o)) => o,
        _ => {
            invoke_with(
                p,
                entry,
                args,
                limits,
                out,
                &mut Stacks::new(),
                use_jit,
                host,
            )
            .0
        }
    }
}

/// One invocation on `st`; also says whether `st` is clean and small enough to go back to the pool.
fn invoke_with(
    p: &Inner,
    entry: u32,
    args: &[Value],
    limits: &InvokeLimits,
    out: &mut Vec<Value>,
    st: &mut Stacks,
    use_jit: bool,
    host: &mut Option<crate::native::HostState>,
) -> (Outcome, bool) {
    let mut fuel = limits.fuel;
    st.heap.reset(limits.memory_bytes, p.strs.len());
    st.heap.host = host.take();
    let r = catch_unwind(AssertUnwindSafe(|| {
        run(p, entry, args, limits, &mut fuel, st, out, use_jit)
    }));
    *host = st.heap.host.take();
    let mem_used = st.heap.used;
    let mut keep = false;
    let result = match r {
        Ok(r) => {
            keep = st.ss.len() <= POOL_MAX_SLOTS
                && st.rs.len() <= POOL_MAX_SLOTS
                && st.heap.objs.capacity() <= POOL_MAX_OBJS;

            st.clear();
            r
        }
        Err(_) => Err(mk_trap(p, entry, 0, internal("panic in the interpreter"))),
    };
    if matches!(&result, Err(t) if t.kind == TrapKind::OutOfFuel) {
        fuel = 0;
    }
    let result = result.and_then(|()| check_retained(p, entry, out, limits));
    (
        Outcome {
            result,
            fuel_left: fuel,
            mem_used,
        },
        keep,
    )
}

/// Enforces [`InvokeLimits::retained_bytes`] on the returned values.
fn check_retained(
    p: &Inner,
    entry: u32,
    vals: &[Value],
    limits: &InvokeLimits,
) -> Result<(), Trap> {
    let Some(cap) = limits.retained_bytes else {
        return Ok(());
    };
    let total = vals
        .iter()
        .map(Value::retained_bytes)
        .fold(0u64, u64::saturating_add);
    if total > cap {
        let mut t = mk_trap(
            p,
            entry,
            0,
            Fault::new(
                TrapKind::RetainedTooLarge,
                format!(
                    "returned values retain {total} bytes, above the per-model cap of {cap} bytes"
                ),
            ),
        );
        t.loc = p
            .funcs
            .get(entry as usize)
            .map(|f| f.loc)
            .unwrap_or_default();
        return Err(t);
    }
    Ok(())
}

/// The register windows of a frame.
fn windows<'a>(
    ss: &'a mut [u64],
    rs: &'a mut [u32],
    sbase: usize,
    rbase: usize,
) -> Option<(&'a mut SWin, &'a mut RWin)> {
    let s = ss
        .get_mut(sbase..sbase.checked_add(WINDOW)?)?
        .try_into()
        .ok()?;
    let r = rs
        .get_mut(rbase..rbase.checked_add(WINDOW)?)?
        .try_into()
        .ok()?;
    Some((s, r))
}

fn run(
    p: &Inner,
    entry: u32,
    args: &[Value],
    limits: &InvokeLimits,
    fuel_out: &mut u64,
    st: &mut Stacks,
    results: &mut Vec<Value>,
    use_jit: bool,
) -> Result<(), Trap> {
    let jit = p.jit.as_ref().filter(|_| use_jit);
    let ef = p
        .funcs
        .get(entry as usize)
        .ok_or_else(|| mk_trap(p, entry, 0, internal("entry")))?;
    if st.ss.len() < WINDOW || st.rs.len() < WINDOW {
        return Err(mk_trap(p, entry, 0, internal("register stacks")));
    }
    st.hw_s = ef.n_s as usize;
    st.hw_r = ef.n_r as usize;
    for (v, slot) in args.iter().zip(&ef.params) {
        let bits = st.heap.import(v).map_err(|f| mk_trap(p, entry, 0, f))?;
        match *slot {
            Slot::S(x) => st.ss[x as usize] = bits,
            Slot::R(x) => st.rs[x as usize] = bits as u32,
        }
    }
    let mut fuel = *fuel_out;
    if fuel < ef.entry_fuel as u64 {
        *fuel_out = 0;
        return Err(mk_trap(p, entry, 0, out_of_fuel()));
    }
    fuel -= ef.entry_fuel as u64;
    st.frames.clear();
    st.frames.push(Frame {
        func: entry,
        pc: 0,
        sbase: 0,
        rbase: 0,
        site: u32::MAX,
    });
    let types = &p.types[..];
    loop {
        let Some(&fr) = st.frames.last() else {
            return Err(mk_trap(p, entry, 0, internal("empty frame stack")));
        };
        let Some(fc) = p.funcs.get(fr.func as usize) else {
            return Err(mk_trap(p, entry, 0, internal("bad function")));
        };
        let Stacks {
            heap,
            ss,
            rs,
            frames,
            hw_s,
            hw_r,
        } = &mut *st;
        let Some((s, r)) = windows(ss, rs, fr.sbase, fr.rbase) else {
            return Err(mk_trap(
                p,
                fr.func,
                fr.pc as usize,
                internal("frame out of range"),
            ));
        };
        // A JIT-compiled function runs from the frame's pc and hands over to `exec` at the pc where the
        // interpreter resumes (a return, a call, an instruction the JIT does not translate, or one that traps),
        // with registers and fuel in sync; `exec` then stops after that instruction (a call, return or slow
        // instruction) and the JIT is re-entered at the next pc.
        let (exit, pc, f2) = match jit.and_then(|j| j.get(fr.func)) {
            Some(f) => {
                let (pc0, fuel0) = crate::jit::enter(f, s, r, heap, fuel, fr.pc as usize);
                exec(fc, s, r, heap, pc0, fuel0)
            }
            None => exec(fc, s, r, heap, fr.pc as usize, fuel),
        };
        fuel = f2;
        // Only calls, returns, slow instructions and traps get here.
        let at = pc.saturating_sub(1);
        match exit {
            Exit::Slow => {
                let Some(&ins) = fc.code.get(at) else {
                    return Err(mk_trap(p, fr.func, at, internal("slow pc")));
                };
                let res = match ins {
                    Instr::CallNative { site } => {
                        call_native(p, fc, site, &mut s[..], &mut r[..], heap, fuel, types)
                            .map(|f| fuel = f)
                    }
                    _ => cold(ins, p, fc, &mut s[..], &mut r[..], heap, &mut fuel),
                };
                if let Err(f) = res {
                    *fuel_out = fuel;
                    return Err(mk_trap(p, fr.func, at, f));
                }
                if let Some(top) = frames.last_mut() {
                    top.pc = pc as u32;
                }
            }
            Exit::Fault(f) => {
                *fuel_out = fuel;
                return Err(mk_trap(p, fr.func, at, f));
            }
            Exit::Call(site) => {
                let Some(cs) = fc.calls.get(site as usize) else {
                    return Err(mk_trap(p, fr.func, at, internal("call site")));
                };
                let Some(callee) = p.funcs.get(cs.callee as usize) else {
                    return Err(mk_trap(p, fr.func, at, internal("callee")));
                };
                if frames.len() >= limits.call_depth as usize {
                    *fuel_out = fuel;
                    return Err(mk_trap(
                        p,
                        fr.func,
                        at,
                        Fault::new(
                            TrapKind::CallDepth,
                            format!(
                                "call depth limit of {} exceeded calling @{}",
                                limits.call_depth, callee.name
                            ),
                        ),
                    ));
                }
                if fuel < callee.entry_fuel as u64 {
                    *fuel_out = 0;
                    return Err(mk_trap(p, fr.func, at, out_of_fuel()));
                }
                fuel -= callee.entry_fuel as u64;
                let nsb = fr.sbase + fc.n_s as usize;
                let nrb = fr.rbase + fc.n_r as usize;
                // Keep a full window past the new frame's base.
                if ss.len() < nsb + WINDOW {
                    ss.resize((nsb + WINDOW).max(ss.len() * 2), 0);
                }
                if rs.len() < nrb + WINDOW {
                    rs.resize((nrb + WINDOW).max(rs.len() * 2), 0);
                }
                *hw_s = (*hw_s).max(nsb + callee.n_s as usize);
                *hw_r = (*hw_r).max(nrb + callee.n_r as usize);
                for &(a, d) in cs.sargs.iter() {
                    ss[nsb + d as usize] = ss[fr.sbase + a as usize];
                }
                for &(a, d) in cs.rargs.iter() {
                    rs[nrb + d as usize] = rs[fr.rbase + a as usize];
                }
                if let Some(top) = frames.last_mut() {
                    top.pc = pc as u32;
                }
                frames.push(Frame {
                    func: cs.callee,
                    pc: 0,
                    sbase: nsb,
                    rbase: nrb,
                    site,
                });
            }
            Exit::Ret(site) => {
                let Some(vals) = fc.rets.get(site as usize) else {
                    return Err(mk_trap(p, fr.func, at, internal("return site")));
                };
                frames.pop();
                match frames.last() {
                    Some(caller) => {
                        let Some(cs) = p
                            .funcs
                            .get(caller.func as usize)
                            .and_then(|c| c.calls.get(fr.site as usize))
                        else {
                            return Err(mk_trap(
                                p,
                                fr.func,
                                at,
                                internal("return to a bad call site"),
                            ));
                        };
                        for (v, d) in vals.iter().zip(cs.results.iter()) {
                            match (*v, *d) {
                                (Slot::S(a), Slot::S(b)) => {
                                    ss[caller.sbase + b as usize] = ss[fr.sbase + a as usize]
                                }
                                (Slot::R(a), Slot::R(b)) => {
                                    rs[caller.rbase + b as usize] = rs[fr.rbase + a as usize]
                                }
                                _ => {
                                    return Err(mk_trap(
                                        p,
                                        fr.func,
                                        at,
                                        internal("result bank mismatch"),
                                    ));
                                }
                            }
                        }
                    }
                    None => {
                        *fuel_out = fuel;
                        results.reserve(vals.len());
                        for (v, t) in vals.iter().zip(&fc.result_types) {
                            let bits = match *v {
                                Slot::S(a) => ss[fr.sbase + a as usize],
                                Slot::R(a) => rs[fr.rbase + a as usize] as u64,
                            };
                            results.push(
                                heap.export(bits, t, types, 0)
                                    .map_err(|f| mk_trap(p, fr.func, at, f))?,
                            );
                        }
                        return Ok(());
                    }
                }
            }
        }
    }
}

/// The interpreter dispatch loop of one frame. Kept in its own function so its few live values (code, register
/// slices, pc, fuel) stay in machine registers.
///
/// This is deliberately one long function: a single `match` over the hot instructions, so each one is a jump-table
/// entry with its operands in registers; splitting it into per-family functions would add a call (or an inlining
/// decision the compiler may get wrong) to every instruction. Everything rare goes through [`cold`], which is split
/// by family in `interp/cold.rs`.
#[allow(clippy::too_many_arguments)]
#[inline(never)]
fn exec(
    fc: &FuncCode,
    s: &mut SWin,
    r: &mut RWin,
    heap: &mut Heap,
    mut pc: usize,
    mut fuel: u64,
) -> (Exit, usize, u64) {
    let code = &fc.code[..];

    macro_rules! tri {
        ($e:expr) => {
            match $e {
                Ok(v) => v,
                Err(f) => break Exit::Fault(f),
            }
        };
    }
    macro_rules! fault {
        ($f:expr) => {
            break Exit::Fault($f)
        };
    }
    macro_rules! charge {
        ($n:expr) => {{
            let n = $n as u64;
            if fuel < n {
                fault!(out_of_fuel());
            }
            fuel -= n;
        }};
    }
    macro_rules! jif {
        ($c:expr, $target:expr, $fuel:expr, $tfuel:expr) => {{
            if $c {
                charge!($tfuel);
                pc = $target as usize;
            } else {
                charge!($fuel);
            }
        }};
    }
    macro_rules! s {
        ($x:expr) => {
            s[$x as usize]
        };
    }
    macro_rules! i32_ {
        ($x:expr) => {
            (s[$x as usize] as i32)
        };
    }
    macro_rules! i64_ {
        ($x:expr) => {
            (s[$x as usize] as i64)
        };
    }
    macro_rules! f32_ {
        ($x:expr) => {
            f32::from_bits(s[$x as usize] as u32)
        };
    }
    macro_rules! f64_ {
        ($x:expr) => {
            f64::from_bits(s[$x as usize])
        };
    }
    macro_rules! w32 {
        ($d:expr, $v:expr) => {
            s[$d as usize] = ($v) as u32 as u64
        };
    }
    macro_rules! w64 {
        ($d:expr, $v:expr) => {
            s[$d as usize] = ($v) as u64
        };
    }
    macro_rules! chk32 {
        ($d:expr, $v:expr, $what:expr) => {
            match $v {
                Some(v) => w32!($d, v),
                None => fault!(ovf($what)),
            }
        };
    }
    macro_rules! chk64 {
        ($d:expr, $v:expr, $what:expr) => {
            match $v {
                Some(v) => w64!($d, v),
                None => fault!(ovf($what)),
            }
        };
    }
    macro_rules! load {
        ($n:literal, $d:expr, $b:expr, $off:expr, $disp:expr, $conv:expr) => {{
            let o = tri!(ea(s!($off), $disp));
            load_at!($n, $d, $b, o, $conv)
        }};
    }
    macro_rules! load_at {
        ($n:literal, $d:expr, $b:expr, $o:expr, $conv:expr) => {{
            let o = $o;
            let bytes = tri!(heap.buf(r[$b as usize]));
            match get::<$n>(bytes, o) {
                Some(a) => s[$d as usize] = $conv(a),
                None => fault!(oob("buffer load", o, $n, bytes.len())),
            }
        }};
    }
    macro_rules! store {
        ($n:literal, $b:expr, $off:expr, $v:expr, $disp:expr, $bytes:expr) => {{
            let o = tri!(ea(s!($off), $disp));
            store_at!($n, $b, o, $bytes)
        }};
    }
    macro_rules! store_at {
        ($n:literal, $b:expr, $o:expr, $bytes:expr) => {{
            let o = $o;
            let v = $bytes;
            let bytes = tri!(heap.buf_mut(r[$b as usize]));
            if !put::<$n>(bytes, o, v) {
                fault!(oob("buffer store", o, $n, bytes.len()));
            }
        }};
    }

    let exit = loop {
        let Some(ins) = code.get(pc) else {
            break Exit::Fault(internal("pc out of range"));
        };
        pc += 1;
        use Instr as I;
        match *ins {
            I::Fuel { n } => charge!(n),
            I::Jump { target, fuel: f } => {
                charge!(f);
                pc = target as usize;
            }
            I::Jz {
                c,
                target,
                fuel: f,
                tfuel: tf,
            } => jif!(s!(c) == 0, target, f, tf),
            I::JEq {
                a,
                b,
                target,
                fuel: f,
                tfuel: tf,
            } => jif!(s!(a) == s!(b), target, f, tf),
            I::JNe {
                a,
                b,
                target,
                fuel: f,
                tfuel: tf,
            } => jif!(s!(a) != s!(b), target, f, tf),
            I::JUlt {
                a,
                b,
                target,
                fuel: f,
                tfuel: tf,
            } => jif!(s!(a) < s!(b), target, f, tf),
            I::JUle {
                a,
                b,
                target,
                fuel: f,
                tfuel: tf,
            } => jif!(s!(a) <= s!(b), target, f, tf),
            I::JUgt {
                a,
                b,
                target,
                fuel: f,
                tfuel: tf,
            } => jif!(s!(a) > s!(b), target, f, tf),
            I::JUge {
                a,
                b,
                target,
                fuel: f,
                tfuel: tf,
            } => jif!(s!(a) >= s!(b), target, f, tf),
            I::JLt64 {
                a,
                b,
                target,
                fuel: f,
                tfuel: tf,
            } => jif!(i64_!(a) < i64_!(b), target, f, tf),
            I::JLe64 {
                a,
                b,
                target,
                fuel: f,
                tfuel: tf,
            } => jif!(i64_!(a) <= i64_!(b), target, f, tf),
            I::JGt64 {
                a,
                b,
                target,
                fuel: f,
                tfuel: tf,
            } => jif!(i64_!(a) > i64_!(b), target, f, tf),
            I::JGe64 {
                a,
                b,
                target,
                fuel: f,
                tfuel: tf,
            } => jif!(i64_!(a) >= i64_!(b), target, f, tf),
            I::JLt32 {
                a,
                b,
                target,
                fuel: f,
                tfuel: tf,
            } => jif!(i32_!(a) < i32_!(b), target, f, tf),
            I::JLe32 {
                a,
                b,
                target,
                fuel: f,
                tfuel: tf,
            } => jif!(i32_!(a) <= i32_!(b), target, f, tf),
            I::JGt32 {
                a,
                b,
                target,
                fuel: f,
                tfuel: tf,
            } => jif!(i32_!(a) > i32_!(b), target, f, tf),
            I::JGe32 {
                a,
                b,
                target,
                fuel: f,
                tfuel: tf,
            } => jif!(i32_!(a) >= i32_!(b), target, f, tf),
            I::JEqK {
                a,
                k,
                target,
                fuel: f,
                tfuel: tf,
            } => jif!(s!(a) == k as i64 as u64, target, f, tf),
            I::JNeK {
                a,
                k,
                target,
                fuel: f,
                tfuel: tf,
            } => jif!(s!(a) != k as i64 as u64, target, f, tf),
            I::JLtK64 {
                a,
                k,
                target,
                fuel: f,
                tfuel: tf,
            } => jif!(i64_!(a) < k as i64, target, f, tf),
            I::JLeK64 {
                a,
                k,
                target,
                fuel: f,
                tfuel: tf,
            } => jif!(i64_!(a) <= k as i64, target, f, tf),
            I::JGtK64 {
                a,
                k,
                target,
                fuel: f,
                tfuel: tf,
            } => jif!(i64_!(a) > k as i64, target, f, tf),
            I::JGeK64 {
                a,
                k,
                target,
                fuel: f,
                tfuel: tf,
            } => jif!(i64_!(a) >= k as i64, target, f, tf),
            I::JLtK32 {
                a,
                k,
                target,
                fuel: f,
                tfuel: tf,
            } => jif!(i32_!(a) < k, target, f, tf),
            I::JLeK32 {
                a,
                k,
                target,
                fuel: f,
                tfuel: tf,
            } => jif!(i32_!(a) <= k, target, f, tf),
            I::JGtK32 {
                a,
                k,
                target,
                fuel: f,
                tfuel: tf,
            } => jif!(i32_!(a) > k, target, f, tf),
            I::JGeK32 {
                a,
                k,
                target,
                fuel: f,
                tfuel: tf,
            } => jif!(i32_!(a) >= k, target, f, tf),
            I::JTestNz {
                a,
                mask,
                target,
                fuel: f,
                tfuel: tf,
            } => jif!(s!(a) & mask as u64 != 0, target, f, tf),
            I::JTestZ {
                a,
                mask,
                target,
                fuel: f,
                tfuel: tf,
            } => jif!(s!(a) & mask as u64 == 0, target, f, tf),
            I::MulAddW64 { d, a, b, c } => w64!(d, s!(a).wrapping_mul(s!(b)).wrapping_add(s!(c))),
            I::MulKAddW64 { d, a, k, c } => {
                w64!(d, s!(a).wrapping_mul(k as i64 as u64).wrapping_add(s!(c)))
            }
            I::Ld32X {
                d,
                b,
                x,
                y,
                sc,
                disp,
            } => load_at!(4, d, b, tri!(ea_x(s!(x), s!(y), sc, disp)), |a| {
                u32::from_le_bytes(a) as u64
            }),
            I::Ld32XS {
                d,
                b,
                x,
                y,
                sc,
                disp,
            } => load_at!(4, d, b, tri!(ea_xs(s!(x), s!(y), sc, disp)), |a| {
                u32::from_le_bytes(a) as u64
            }),
            I::Ld64X {
                d,
                b,
                x,
                y,
                sc,
                disp,
            } => load_at!(
                8,
                d,
                b,
                tri!(ea_x(s!(x), s!(y), sc, disp)),
                u64::from_le_bytes
            ),
            I::Ld64XS {
                d,
                b,
                x,
                y,
                sc,
                disp,
            } => load_at!(
                8,
                d,
                b,
                tri!(ea_xs(s!(x), s!(y), sc, disp)),
                u64::from_le_bytes
            ),
            I::St32X {
                b,
                x,
                y,
                v,
                sc,
                disp,
            } => store_at!(
                4,
                b,
                tri!(ea_x(s!(x), s!(y), sc, disp)),
                (s!(v) as u32).to_le_bytes()
            ),
            I::St32XS {
                b,
                x,
                y,
                v,
                sc,
                disp,
            } => store_at!(
                4,
                b,
                tri!(ea_xs(s!(x), s!(y), sc, disp)),
                (s!(v) as u32).to_le_bytes()
            ),
            I::St64X {
                b,
                x,
                y,
                v,
                sc,
                disp,
            } => store_at!(
                8,
                b,
                tri!(ea_x(s!(x), s!(y), sc, disp)),
                s!(v).to_le_bytes()
            ),
            I::St64XS {
                b,
                x,
                y,
                v,
                sc,
                disp,
            } => store_at!(
                8,
                b,
                tri!(ea_xs(s!(x), s!(y), sc, disp)),
                s!(v).to_le_bytes()
            ),
            I::ForLoop {
                iv,
                hi,
                step,
                target,
                fuel: f,
            } => {
                if let Some(n) = i64_!(iv).checked_add(i64_!(step)) {
                    w64!(iv, n);
                    if n < i64_!(hi) {
                        charge!(f);
                        pc = target as usize;
                    }
                }
            }
            I::ForLoopK {
                iv,
                hi,
                step,
                target,
                fuel: f,
            } => {
                if let Some(n) = i64_!(iv).checked_add(step as i64) {
                    w64!(iv, n);
                    if n < i64_!(hi) {
                        charge!(f);
                        pc = target as usize;
                    }
                }
            }
            I::Call { site } => break Exit::Call(site),
            I::Ret { site } => break Exit::Ret(site),
            I::MovS { d, a } => s[d as usize] = s!(a),
            I::MovR { d, a } => r[d as usize] = r[a as usize],
            I::ConstS { d, bits } => s[d as usize] = bits,
            I::ConstNull { d } => r[d as usize] = 0,
            I::SelS { d, c, a, b } => s[d as usize] = if s!(c) != 0 { s!(a) } else { s!(b) },
            I::Add32 { d, a, b } => chk32!(d, i32_!(a).checked_add(i32_!(b)), "i32 add"),
            I::Add64 { d, a, b } => chk64!(d, i64_!(a).checked_add(i64_!(b)), "i64 add"),
            I::Sub32 { d, a, b } => chk32!(d, i32_!(a).checked_sub(i32_!(b)), "i32 sub"),
            I::Sub64 { d, a, b } => chk64!(d, i64_!(a).checked_sub(i64_!(b)), "i64 sub"),
            I::Mul32 { d, a, b } => chk32!(d, i32_!(a).checked_mul(i32_!(b)), "i32 mul"),
            I::Mul64 { d, a, b } => chk64!(d, i64_!(a).checked_mul(i64_!(b)), "i64 mul"),
            I::AddK32 { d, a, k } => chk32!(d, i32_!(a).checked_add(k), "i32 add"),
            I::AddK64 { d, a, k } => chk64!(d, i64_!(a).checked_add(k as i64), "i64 add"),
            I::SubK32 { d, a, k } => chk32!(d, i32_!(a).checked_sub(k), "i32 sub"),
            I::SubK64 { d, a, k } => chk64!(d, i64_!(a).checked_sub(k as i64), "i64 sub"),
            I::MulK32 { d, a, k } => chk32!(d, i32_!(a).checked_mul(k), "i32 mul"),
            I::MulK64 { d, a, k } => chk64!(d, i64_!(a).checked_mul(k as i64), "i64 mul"),
            I::AddW32 { d, a, b } => w32!(d, i32_!(a).wrapping_add(i32_!(b))),
            I::AddW64 { d, a, b } => w64!(d, i64_!(a).wrapping_add(i64_!(b))),
            I::SubW32 { d, a, b } => w32!(d, i32_!(a).wrapping_sub(i32_!(b))),
            I::SubW64 { d, a, b } => w64!(d, i64_!(a).wrapping_sub(i64_!(b))),
            I::MulW32 { d, a, b } => w32!(d, i32_!(a).wrapping_mul(i32_!(b))),
            I::MulW64 { d, a, b } => w64!(d, i64_!(a).wrapping_mul(i64_!(b))),
            I::AddWK32 { d, a, k } => w32!(d, i32_!(a).wrapping_add(k)),
            I::AddWK64 { d, a, k } => w64!(d, i64_!(a).wrapping_add(k as i64)),
            I::MulWK32 { d, a, k } => w32!(d, i32_!(a).wrapping_mul(k)),
            I::MulWK64 { d, a, k } => w64!(d, i64_!(a).wrapping_mul(k as i64)),
            I::Min32 { d, a, b } => w32!(d, i32_!(a).min(i32_!(b))),
            I::Min64 { d, a, b } => w64!(d, i64_!(a).min(i64_!(b))),
            I::Max32 { d, a, b } => w32!(d, i32_!(a).max(i32_!(b))),
            I::Max64 { d, a, b } => w64!(d, i64_!(a).max(i64_!(b))),
            I::And { d, a, b } => s[d as usize] = s!(a) & s!(b),
            I::Or { d, a, b } => s[d as usize] = s!(a) | s!(b),
            I::Xor { d, a, b } => s[d as usize] = s!(a) ^ s!(b),
            I::AndK { d, a, k } => s[d as usize] = s!(a) & k as u64,
            I::AndK64 { d, a, k } => s[d as usize] = s!(a) & (k as i64 as u64),
            I::OrK { d, a, k } => s[d as usize] = s!(a) | k as u64,
            I::XorK { d, a, k } => s[d as usize] = s!(a) ^ k as u64,
            I::Not1 { d, a } => s[d as usize] = s!(a) ^ 1,
            I::Not32 { d, a } => w32!(d, !(s!(a) as u32)),
            I::Not64 { d, a } => s[d as usize] = !s!(a),
            I::Shl32 { d, a, b } => w32!(d, (s!(a) as u32).wrapping_shl(s!(b) as u32)),
            I::Shl64 { d, a, b } => w64!(d, s!(a).wrapping_shl(s!(b) as u32)),
            I::Shr32 { d, a, b } => w32!(d, i32_!(a).wrapping_shr(s!(b) as u32)),
            I::Shr64 { d, a, b } => w64!(d, i64_!(a).wrapping_shr(s!(b) as u32)),
            I::ShrU32 { d, a, b } => w32!(d, (s!(a) as u32).wrapping_shr(s!(b) as u32)),
            I::ShrU64 { d, a, b } => w64!(d, s!(a).wrapping_shr(s!(b) as u32)),
            I::ShlK32 { d, a, k } => w32!(d, (s!(a) as u32) << k),
            I::ShlK64 { d, a, k } => w64!(d, s!(a) << k),
            I::ShrK32 { d, a, k } => w32!(d, i32_!(a) >> k),
            I::ShrK64 { d, a, k } => w64!(d, i64_!(a) >> k),
            I::ShrUK32 { d, a, k } => w32!(d, (s!(a) as u32) >> k),
            I::ShrUK64 { d, a, k } => w64!(d, s!(a) >> k),

            I::Eq { d, a, b } => s[d as usize] = (s!(a) == s!(b)) as u64,
            I::Ne { d, a, b } => s[d as usize] = (s!(a) != s!(b)) as u64,
            I::Ult { d, a, b } => s[d as usize] = (s!(a) < s!(b)) as u64,
            I::Ule { d, a, b } => s[d as usize] = (s!(a) <= s!(b)) as u64,
            I::Lt32 { d, a, b } => s[d as usize] = (i32_!(a) < i32_!(b)) as u64,
            I::Le32 { d, a, b } => s[d as usize] = (i32_!(a) <= i32_!(b)) as u64,
            I::Lt64 { d, a, b } => s[d as usize] = (i64_!(a) < i64_!(b)) as u64,
            I::Le64 { d, a, b } => s[d as usize] = (i64_!(a) <= i64_!(b)) as u64,
            I::EqK { d, a, k } => s[d as usize] = (s!(a) == k as i64 as u64) as u64,
            I::NeK { d, a, k } => s[d as usize] = (s!(a) != k as i64 as u64) as u64,
            I::LtK32 { d, a, k } => s[d as usize] = (i32_!(a) < k) as u64,
            I::LeK32 { d, a, k } => s[d as usize] = (i32_!(a) <= k) as u64,
            I::GtK32 { d, a, k } => s[d as usize] = (i32_!(a) > k) as u64,
            I::GeK32 { d, a, k } => s[d as usize] = (i32_!(a) >= k) as u64,
            I::LtK64 { d, a, k } => s[d as usize] = (i64_!(a) < k as i64) as u64,
            I::LeK64 { d, a, k } => s[d as usize] = (i64_!(a) <= k as i64) as u64,
            I::GtK64 { d, a, k } => s[d as usize] = (i64_!(a) > k as i64) as u64,
            I::GeK64 { d, a, k } => s[d as usize] = (i64_!(a) >= k as i64) as u64,

            I::FAdd32 { d, a, b } => w32!(d, (f32_!(a) + f32_!(b)).to_bits()),
            I::FAdd64 { d, a, b } => s[d as usize] = (f64_!(a) + f64_!(b)).to_bits(),
            I::FSub32 { d, a, b } => w32!(d, (f32_!(a) - f32_!(b)).to_bits()),
            I::FSub64 { d, a, b } => s[d as usize] = (f64_!(a) - f64_!(b)).to_bits(),
            I::FMul32 { d, a, b } => w32!(d, (f32_!(a) * f32_!(b)).to_bits()),
            I::FMul64 { d, a, b } => s[d as usize] = (f64_!(a) * f64_!(b)).to_bits(),
            I::Ld8s { d, b, off, disp } => {
                load!(1, d, b, off, disp, |a: [u8; 1]| a[0] as i8 as i32 as u32
                    as u64)
            }
            I::Ld8u { d, b, off, disp } => load!(1, d, b, off, disp, |a: [u8; 1]| a[0] as u64),
            I::Ld16s { d, b, off, disp } => {
                load!(2, d, b, off, disp, |a| i16::from_le_bytes(a) as i32 as u32
                    as u64)
            }
            I::Ld16u { d, b, off, disp } => {
                load!(2, d, b, off, disp, |a| u16::from_le_bytes(a) as u64)
            }
            I::Ld32 { d, b, off, disp } => {
                load!(4, d, b, off, disp, |a| u32::from_le_bytes(a) as u64)
            }
            I::Ld64 { d, b, off, disp } => load!(8, d, b, off, disp, u64::from_le_bytes),
            I::St8 { b, off, v, disp } => store!(1, b, off, v, disp, [s!(v) as u8]),
            I::St16 { b, off, v, disp } => {
                store!(2, b, off, v, disp, (s!(v) as u16).to_le_bytes())
            }
            I::St32 { b, off, v, disp } => {
                store!(4, b, off, v, disp, (s!(v) as u32).to_le_bytes())
            }
            I::St64 { b, off, v, disp } => store!(8, b, off, v, disp, s!(v).to_le_bytes()),
            _ => break Exit::Slow,
        }
    };

    (exit, pc, fuel)
}

fn opaque_get(heap: &mut Heap, h: u32, i: i64, ty: u32, types: &[Type]) -> Result<u64, Fault> {
    let want = types.get(ty as usize).ok_or_else(|| internal("type id"))?;
    let mismatch = |have: String| {
        Fault::new(
            TrapKind::TypeMismatch,
            format!("opaque.get: element {i} is {have}, not {want}"),
        )
    };
    match heap.objs.get(h as usize) {
        Some(Obj::Opaque(items)) => {
            let Some(&(t, v)) = usize::try_from(i).ok().and_then(|x| items.get(x)) else {
                return Err(Fault::new(
                    TrapKind::OutOfBounds,
                    format!(
                        "opaque.get: index {i} out of range of a tuple of {}",
                        items.len()
                    ),
                ));
            };
            if t != ty {
                let have = types
                    .get(t as usize)
                    .map(|t| t.to_string())
                    .unwrap_or_default();
                return Err(mismatch(have));
            }
            Ok(v)
        }
        Some(Obj::HostOpaque(items)) => {
            let Some(v) = usize::try_from(i).ok().and_then(|x| items.get(x)) else {
                return Err(Fault::new(
                    TrapKind::OutOfBounds,
                    format!(
                        "opaque.get: index {i} out of range of a tuple of {}",
                        items.len()
                    ),
                ));
            };
            if !v.has_type(want) {
                return Err(mismatch(v.type_desc()));
            }
            let v = v.clone();
            heap.import(&v)
        }
        Some(Obj::Null) => Err(Fault::new(TrapKind::NullReference, "opaque.get of null")),
        _ => Err(internal("opaque.get of a non-opaque")),
    }
}

#[allow(clippy::too_many_arguments)]
fn call_native(
    p: &Inner,
    fc: &FuncCode,
    site: u32,
    s: &mut [u64],
    r: &mut [u32],
    heap: &mut Heap,
    mut fuel: u64,
    types: &[Type],
) -> Result<u64, Fault> {
    let ns = fc
        .natives
        .get(site as usize)
        .ok_or_else(|| internal("native site"))?;
    let imp = p
        .imports
        .get(ns.import as usize)
        .ok_or_else(|| internal("import"))?;
    if fuel < imp.func.fuel_cost {
        return Err(out_of_fuel());
    }
    fuel -= imp.func.fuel_cost;
    let mut args = Vec::with_capacity(ns.args.len());
    for (sl, t) in ns.args.iter().zip(&imp.sig.params) {
        let bits = match *sl {
            Slot::S(x) => s[x as usize],
            Slot::R(x) => r[x as usize] as u64,
        };
        args.push(heap.export(bits, t, types, 0)?);
    }
    let body = imp.func.body.clone();
    let res = {
        let mut ctx = NativeCtx {
            mem_used: &mut heap.used,
            mem_cap: heap.cap,
            fuel_left: &mut fuel,
            host: &mut heap.host,
        };
        catch_unwind(AssertUnwindSafe(|| body(&mut ctx, &args)))
    };
    // Drop our argument references so a buffer the native did not keep can be written again without a copy.
    drop(args);
    let sym = &imp.symbol;
    let vals = match res {
        Err(_) => {
            return Err(Fault::new(
                TrapKind::Native,
                format!("native `{sym}` panicked"),
            ));
        }
        Ok(Err(NativeError::OutOfFuel)) => return Err(out_of_fuel()),
        Ok(Err(e @ NativeError::OutOfMemory(_))) => {
            return Err(Fault::new(
                TrapKind::OutOfMemory,
                format!("native `{sym}`: {e}"),
            ));
        }
        Ok(Err(e)) => {
            return Err(Fault::new(
                TrapKind::Native,
                format!("native `{sym}` failed: {e}"),
            ));
        }
        Ok(Ok(v)) => v,
    };
    if vals.len() != imp.sig.results.len() {
        return Err(Fault::new(
            TrapKind::TypeMismatch,
            format!(
                "native `{sym}` returned {} values, its signature declares {}",
                vals.len(),
                imp.sig.results.len()
            ),
        ));
    }
    for (i, (v, t)) in vals.iter().zip(&imp.sig.results).enumerate() {
        if !v.has_type(t) {
            return Err(Fault::new(
                TrapKind::TypeMismatch,
                format!(
                    "native `{sym}` returned {} for result {i}, its signature declares {t}",
                    v.type_desc()
                ),
            ));
        }
    }
    for (v, sl) in vals.iter().zip(ns.results.iter()) {
        let bits = heap.import(v)?;
        match *sl {
            Slot::S(x) => s[x as usize] = bits,
            Slot::R(x) => r[x as usize] = bits as u32,
        }
    }
    Ok(fuel)
}
