//! `loom-vm`: loads a linked, verified [`loom_ir::Program`], lowers it to register bytecode and runs it in a
//! sandbox.
//!
//! # Protocol
//!
//! **Loading.** [`Vm::load`] lowers every function once. Each import `Decl { symbol: "m.f", import: Some("m") }`
//! binds to function `f` of the host's [`NativeModule`] `m`, only if `m` is in the role's `granted` list and the
//! declared and native signatures are identical; otherwise loading fails with a [`LoadError`] naming both sides.
//! Inconsistencies that would make lowering panic (out-of-range values, bank mismatches) are load errors too.
//! [`LoadLimits`] bound registers per frame and instructions per function and per program.
//!
//! **Register banks and frames.** Each SSA value gets a register in one of two banks: scalars (`i1 i32 i64 f32
//! f64`) as `u64` bit patterns in canonical form (`i32`/`f32` zero-extended), references as `u32` handles into the
//! invocation heap (0 = `null`). Register indices are `u16`. All frames of an invocation live in two contiguous
//! stacks (`Vec<u64>`, `Vec<u32>`); a call places the callee's frame right after the caller's, copies arguments into
//! the callee's first registers, and pushes a small frame record. Loom calls never recurse on the Rust stack, so the
//! call-depth limit, not the host stack, bounds recursion. Structured `if`/`for`/`while` become jumps; compares
//! whose only use is a branch fuse into compare-and-branch; `add`/`sub`/`mul`/compares/shifts with an immediate
//! and loads/stores with constant offsets (including a folded single-use `add %x, K`) have immediate forms;
//! immediates elsewhere live in constant registers set by a per-function prologue.
//!
//! **Fuel.** Fuel is charged per basic block *of the IR*: a block is a run of ops ending at a structured op
//! (`if`/`for`/`while`, counted in the block) or a terminator; its cost is its op count, charged before it runs.
//! Loop back-edges charge the body's (or condition's) first block each iteration; the block after an `if`
//! (the join) is charged together with the branch that leads to it. Calls charge the callee's first block, native
//! imports their declared `fuel_cost` (and whatever they charge through [`NativeCtx::charge_fuel`]). Bulk
//! operations (`buffer.new`, `slice`, `copy`, `fill`, `concat`, `str.concat`, `str.to_buffer`,
//! `str.from_buffer`) also charge one unit per 64 bytes they touch, before touching them, so fuel bounds their
//! time too (a megabyte is 16,384 units). Charges do not
//! depend on lowering details, so the same program with the same fuel traps with [`TrapKind::OutOfFuel`] at the
//! same pc every time; after that trap the fuel used equals the budget.
//!
//! **Memory.** Every allocation the program causes (`buffer.new`, slices, concatenations, strings, lists and their
//! growth, opaque tuples, copy-on-write copies, plus 32 bytes per heap object) is charged against
//! [`InvokeLimits::memory_bytes`] *before* allocating, so an oversized `buffer.new` traps with
//! [`TrapKind::OutOfMemory`] without touching the allocator. The VM frees nothing until the invocation ends, so
//! the cap is on the **total bytes allocated during the invocation**, not on live bytes. Natives account their
//! own allocations with [`NativeCtx::alloc`]. Register stacks and frame records are bounded by the register and
//! call-depth limits and are not charged.
//!
//! **Values and ownership across the boundary.** Inside an invocation, buffers and lists are references:
//! registers hold handles into one heap owned by the invocation, so a callee's store into a buffer argument is seen
//! by the caller, at zero reference-counting cost. At the boundary (entry arguments, native arguments/results,
//! returned values) values are [`Value`]s: `Send + Sync`, immutable, `Arc`-backed. A buffer coming in is *shared*:
//! loads read the host's bytes in place, and the first store copies it (copy-on-write; the copy is charged), so
//! host-owned inputs and retained `!opaque` state are never mutated. A buffer going out is moved into an `Arc`
//! without copying; if the program writes it again afterwards (e.g. after passing it to a native), it is copied
//! only if someone else still holds it. Two `Value`s sharing an `Arc` are two distinct buffers inside the VM
//! (aliasing is not reconstructed); likewise each `opaque.get` of a buffer yields a fresh copy-on-write handle.
//! The host bounds what it keeps across invocations with [`Value::retained_bytes`] against its per-model cap;
//! [`InvokeLimits::retained_bytes`] makes the VM enforce that cap on the returned values.
//!
//! **Tiers.** With [`LoadLimits::jit`] (default on when Cranelift supports the host CPU, off under
//! `LOOM_VM_JIT=0`), loading also compiles functions that contain a loop to machine code with Cranelift,
//! translating the register bytecode instruction by instruction (see `src/jit/`). Instructions the JIT does not
//! translate (calls, natives, strings, lists, opaque tuples, rare float ops) are executed by the interpreter, which
//! then re-enters the JIT code at the next pc. JIT code charges fuel at the same instructions and amounts, and
//! hands over to the interpreter *before* any instruction that would trap, which then traps exactly as it always
//! does: results, traps (kind, message, pc, loc), fuel used and memory used are identical in both tiers. [`Loaded::jit_stats`] reports what was compiled and how long it took.
//!
//! **Traps.** Every failure is a [`Trap`] with kind, function, bytecode pc and source location; nothing in the VM
//! panics the process (integer arithmetic is checked per the opcode semantics, every buffer/list access is
//! bounds-checked, natives run under `catch_unwind` and their results are type-checked).

mod code;
pub mod error;
mod heap;
mod interp;
#[allow(unsafe_code)]
mod jit;
mod lower;
pub mod native;
pub mod testing;
pub mod value;

pub use error::{LoadError, NativeError, Trap, TrapKind};
pub use native::{HostState, NativeCtx, NativeFnBody, NativeFunc, NativeModule};
pub use value::Value;

use loom_ir::{Loc, Program, Signature, Type};
use std::sync::Arc;

/// Limits checked while loading.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadLimits {
    /// Registers per bank per frame (at most 65535).
    pub max_registers: u32,
    /// Bytecode instructions per function.
    pub max_code_per_function: u32,
    /// Bytecode instructions in the whole program.
    pub max_total_code: u64,
    /// Compile loop-heavy functions with the baseline JIT (Cranelift) at load time. Default: on when the host
    /// CPU is supported, off when the environment sets `LOOM_VM_JIT=0`. Results, traps, fuel and memory used
    /// are identical in both tiers.
    pub jit: bool,
}

impl Default for LoadLimits {
    fn default() -> Self {
        LoadLimits {
            max_registers: 16_384,
            max_code_per_function: 1 << 20,
            max_total_code: 1 << 24,
            jit: jit_default(),
        }
    }
}

fn jit_default() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(jit::default_on)
}

/// Test switch (see [`testing::set_jit_cross_check`]).
static JIT_CROSS_CHECK: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The cross-check is on when a test turned it on, or for the whole process under `LOOM_VM_JIT_CROSS_CHECK=1`
/// (e.g. to run another crate's test suite in both tiers).
pub(crate) fn jit_cross_check() -> bool {
    static ENV: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    JIT_CROSS_CHECK.load(std::sync::atomic::Ordering::Relaxed)
        || *ENV.get_or_init(|| std::env::var("LOOM_VM_JIT_CROSS_CHECK").as_deref() == Ok("1"))
}

/// Limits of one invocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvokeLimits {
    /// Fuel budget (roughly: IR ops executed).
    pub fuel: u64,
    /// Cap on the total bytes allocated by the invocation.
    pub memory_bytes: u64,
    /// Maximum number of active Loom frames (the entry counts as one).
    pub call_depth: u32,
    /// Per-model cap on retained state: when set, the sum of [`Value::retained_bytes`] of the returned values
    /// must not exceed it, else the invocation fails with [`TrapKind::RetainedTooLarge`].
    pub retained_bytes: Option<u64>,
}

impl Default for InvokeLimits {
    fn default() -> Self {
        InvokeLimits {
            fuel: 100_000_000,
            memory_bytes: 256 << 20,
            call_depth: 256,
            retained_bytes: None,
        }
    }
}

/// Fuel and memory used by a successful [`Loaded::invoke_into`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Metered {
    pub fuel_used: u64,
    /// Bytes charged against the memory cap.
    pub memory_used: u64,
}

struct Raw {
    result: Result<(), Trap>,
    fuel_used: u64,
    memory_used: u64,
}

fn bad_args(func: String, message: String) -> Trap {
    Trap {
        kind: TrapKind::BadArguments,
        func,
        pc: 0,
        loc: Loc::default(),
        file: String::new(),
        message,
    }
}

/// What one invocation returned and consumed.
#[derive(Debug)]
pub struct Invocation {
    pub result: Result<Vec<Value>, Trap>,
    pub fuel_used: u64,
    /// Bytes charged against the memory cap.
    pub memory_used: u64,
}

#[derive(Debug)]
pub(crate) struct BoundImport {
    pub(crate) symbol: String,
    pub(crate) sig: Signature,
    pub(crate) func: NativeFunc,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) funcs: Vec<code::FuncCode>,
    pub(crate) types: Vec<Type>,
    pub(crate) strs: Vec<Arc<str>>,
    pub(crate) imports: Vec<BoundImport>,
    pub(crate) files: Vec<String>,
    pub(crate) exports: Vec<(String, u32)>,
    pub(crate) jit: Option<jit::JitCode>,
}

/// The loader.
#[derive(Debug)]
pub struct Vm;

impl Vm {
    /// Binds imports against `natives` (only modules in `granted`), lowers every function, checks limits.
    pub fn load(
        program: &Program,
        natives: &[Arc<NativeModule>],
        granted: &[&str],
        limits: &LoadLimits,
    ) -> Result<Loaded, LoadError> {
        let file_of = |loc_file: Option<u32>| -> String {
            loc_file
                .and_then(|i| program.files.get(i as usize).cloned())
                .unwrap_or_else(|| {
                    program
                        .files
                        .first()
                        .cloned()
                        .unwrap_or_else(|| "<program>".to_string())
                })
        };
        let mut imports = Vec::with_capacity(program.imports.len());
        for d in &program.imports {
            let file = file_of(None);
            let Some(module) = d.import.clone() else {
                return Err(LoadError::Invalid {
                    func: d.symbol.clone(),
                    message: "a linked program may only contain capability imports".into(),
                    loc: d.loc,
                    file,
                });
            };
            let (prefix, fname) = d.split_symbol();
            if prefix != module {
                return Err(LoadError::BadImportSymbol {
                    module,
                    symbol: d.symbol.clone(),
                    loc: d.loc,
                    file,
                });
            }
            if !granted.contains(&module.as_str()) {
                return Err(LoadError::NotGranted {
                    module,
                    symbol: d.symbol.clone(),
                    granted: granted.iter().map(|s| s.to_string()).collect(),
                    loc: d.loc,
                    file,
                });
            }
            let Some(m) = natives.iter().find(|m| m.name == module) else {
                return Err(LoadError::UnknownModule {
                    module,
                    symbol: d.symbol.clone(),
                    loc: d.loc,
                    file,
                });
            };
            let Some(f) = m.get(fname) else {
                return Err(LoadError::UnknownFunction {
                    module,
                    func: fname.to_string(),
                    symbol: d.symbol.clone(),
                    loc: d.loc,
                    file,
                });
            };
            if f.sig != d.sig {
                return Err(LoadError::SignatureMismatch {
                    symbol: d.symbol.clone(),
                    declared: Box::new(d.sig.clone()),
                    native: Box::new(f.sig.clone()),
                    loc: d.loc,
                    file,
                });
            }
            imports.push(BoundImport {
                symbol: d.symbol.clone(),
                sig: d.sig.clone(),
                func: f.clone(),
            });
        }
        let mut tables = lower::Tables::default();
        let mut funcs = Vec::with_capacity(program.funcs.len());
        let mut total = 0u64;
        for fi in 0..program.funcs.len() {
            let fc = lower::lower_function(program, fi, &mut tables, limits)?;
            total += fc.code.len() as u64;
            if total > limits.max_total_code {
                return Err(LoadError::Limit {
                    func: fc.name.clone(),
                    message: format!(
                        "program exceeds {} bytecode instructions",
                        limits.max_total_code
                    ),
                    loc: fc.loc,
                    file: file_of(program.func_files.get(fi).copied()),
                });
            }
            funcs.push(fc);
        }
        for (name, fi) in &program.exports {
            if *fi as usize >= funcs.len() {
                return Err(LoadError::Invalid {
                    func: name.clone(),
                    message: "export of a missing function".into(),
                    loc: Loc::default(),
                    file: file_of(None),
                });
            }
        }
        // A Cranelift failure (even a panic) only means no JIT code: the interpreter runs everything.
        let jit = if limits.jit {
            let all = jit_cross_check();
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| jit::compile(&funcs, all)))
                .ok()
                .flatten()
        } else {
            None
        };
        Ok(Loaded {
            inner: Arc::new(Inner {
                jit,
                funcs,
                types: tables.types,
                strs: tables.strs,
                imports,
                files: program.files.clone(),
                exports: program.exports.clone(),
            }),
        })
    }
}

/// A loaded program: immutable, `Send + Sync`, cheap to clone; invocations may run concurrently.
#[derive(Clone, Debug)]
pub struct Loaded {
    inner: Arc<Inner>,
}

/// A resolved export of a [`Loaded`] program (see [`Loaded::entry`]): invoking through it skips the lookup by
/// name. An id from another program is checked like any other input (unknown ids fail with
/// [`TrapKind::BadArguments`]; arguments are always type-checked), so it can never bypass the sandbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EntryId(u32);

impl Loaded {
    /// Runs export `entry` with `args`; returns its results or the trap.
    pub fn invoke(
        &self,
        entry: &str,
        args: &[Value],
        limits: &InvokeLimits,
    ) -> Result<Vec<Value>, Trap> {
        self.invoke_metered(entry, args, limits).result
    }

    /// Like [`Loaded::invoke`], also reporting fuel and memory used.
    pub fn invoke_metered(&self, entry: &str, args: &[Value], limits: &InvokeLimits) -> Invocation {
        match self.entry(entry) {
            Some(id) => self.invoke_entry_metered(id, args, limits),
            None => {
                let names: Vec<&str> = self.inner.exports.iter().map(|(n, _)| n.as_str()).collect();
                Invocation {
                    result: Err(bad_args(
                        entry.to_string(),
                        format!("no export named `{entry}` (exports: {})", names.join(", ")),
                    )),
                    fuel_used: 0,
                    memory_used: 0,
                }
            }
        }
    }

    /// Resolves export `name` once, for [`Loaded::invoke_entry`] and [`Loaded::invoke_into`].
    pub fn entry(&self, name: &str) -> Option<EntryId> {
        self.inner
            .exports
            .iter()
            .position(|(n, _)| n == name)
            .map(|i| EntryId(i as u32))
    }

    /// Like [`Loaded::invoke`] with a resolved export.
    pub fn invoke_entry(
        &self,
        entry: EntryId,
        args: &[Value],
        limits: &InvokeLimits,
    ) -> Result<Vec<Value>, Trap> {
        self.invoke_entry_metered(entry, args, limits).result
    }

    /// Like [`Loaded::invoke_metered`] with a resolved export.
    pub fn invoke_entry_metered(
        &self,
        entry: EntryId,
        args: &[Value],
        limits: &InvokeLimits,
    ) -> Invocation {
        let mut out = Vec::new();
        let m = self.invoke_raw(entry, args, limits, &mut out, &mut None);
        Invocation {
            result: m.result.map(|()| out),
            fuel_used: m.fuel_used,
            memory_used: m.memory_used,
        }
    }

    /// The allocation-free form for hot call sites: runs a resolved export and writes its results into
    /// `results` (cleared first; its capacity is reused). Returns fuel and memory used, or the trap (then
    /// `results` is empty).
    pub fn invoke_into(
        &self,
        entry: EntryId,
        args: &[Value],
        limits: &InvokeLimits,
        results: &mut Vec<Value>,
    ) -> Result<Metered, Trap> {
        self.invoke_hosted(entry, args, limits, results, &mut None)
    }

    /// Like [`Loaded::invoke_into`], carrying host state to the natives the invocation calls: `host` is moved
    /// into the invocation when it starts (natives reach it through [`NativeCtx::host`]) and back into `host`
    /// when it ends, whatever the outcome. This is how a host gives a native call the context of the
    /// invocation that made it, with no thread-local and no shared state.
    pub fn invoke_hosted(
        &self,
        entry: EntryId,
        args: &[Value],
        limits: &InvokeLimits,
        results: &mut Vec<Value>,
        host: &mut Option<HostState>,
    ) -> Result<Metered, Trap> {
        let m = self.invoke_raw(entry, args, limits, results, host);
        m.result.map(|()| Metered {
            fuel_used: m.fuel_used,
            memory_used: m.memory_used,
        })
    }

    fn invoke_raw(
        &self,
        entry: EntryId,
        args: &[Value],
        limits: &InvokeLimits,
        results: &mut Vec<Value>,
        host: &mut Option<HostState>,
    ) -> Raw {
        results.clear();
        let p = &*self.inner;
        let bad = |func: String, message: String| Raw {
            result: Err(bad_args(func, message)),
            fuel_used: 0,
            memory_used: 0,
        };
        let Some((name, fi)) = p.exports.get(entry.0 as usize) else {
            return bad(
                format!("<entry {}>", entry.0),
                format!("entry id {} is not an export of this program", entry.0),
            );
        };
        let fi = *fi;
        let Some(fc) = p.funcs.get(fi as usize) else {
            return bad(name.clone(), "export of a missing function".into());
        };
        if args.len() != fc.param_types.len() {
            return bad(
                fc.name.clone(),
                format!(
                    "`{name}` takes {} arguments, {} given",
                    fc.param_types.len(),
                    args.len()
                ),
            );
        }
        for (i, (a, t)) in args.iter().zip(&fc.param_types).enumerate() {
            if !a.has_type(t) {
                return bad(
                    fc.name.clone(),
                    format!(
                        "argument {i} of `{name}` must be {t}, got {}",
                        a.type_desc()
                    ),
                );
            }
        }
        let out = if jit_cross_check() && p.jit.is_some() && p.imports.is_empty() {
            // Test mode: run the interpreter alone first; the JIT-ed run must agree on everything.
            let mut r0 = Vec::new();
            let o0 = interp::invoke(p, fi, args, limits, &mut r0, false, &mut None);
            let o1 = interp::invoke(p, fi, args, limits, results, true, host);
            let show = |r: &Result<(), Trap>, v: &[Value]| format!("{r:?} {v:?}");
            assert_eq!(
                (show(&o0.result, &r0), o0.fuel_left, o0.mem_used),
                (show(&o1.result, results), o1.fuel_left, o1.mem_used),
                "JIT tier disagrees with the interpreter on `{name}`"
            );
            assert_eq!(o0.result, o1.result);
            o1
        } else {
            interp::invoke(p, fi, args, limits, results, true, host)
        };
        if out.result.is_err() {
            results.clear();
        }
        Raw {
            result: out.result,
            fuel_used: limits.fuel - out.fuel_left.min(limits.fuel),
            memory_used: out.mem_used,
        }
    }

    /// The signature of an export.
    pub fn signature(&self, entry: &str) -> Option<Signature> {
        let &(_, fi) = self.inner.exports.iter().find(|(n, _)| n == entry)?;
        let fc = self.inner.funcs.get(fi as usize)?;
        Some(Signature {
            params: fc.param_types.clone(),
            results: fc.result_types.clone(),
        })
    }

    /// Export names.
    pub fn exports(&self) -> Vec<String> {
        self.inner.exports.iter().map(|(n, _)| n.clone()).collect()
    }

    /// A listing of the lowered bytecode (for diagnostics; the format is not stable).
    pub fn disassemble(&self) -> String {
        let mut out = String::new();
        for f in &self.inner.funcs {
            out.push_str(&format!(
                "@{} (s{} r{}, entry fuel {})\n",
                f.name, f.n_s, f.n_r, f.entry_fuel
            ));
            for (pc, i) in f.code.iter().enumerate() {
                out.push_str(&format!("  {pc:4}: {i:?}\n"));
            }
        }
        out
    }

    /// Functions compiled by the JIT tier and the time spent compiling them.
    pub fn jit_stats(&self) -> (usize, std::time::Duration) {
        self.inner
            .jit
            .as_ref()
            .map(|j| (j.compiled, j.compile_time))
            .unwrap_or_default()
    }

    /// Whether function `name` (a function name, not an export name) runs JIT-compiled.
    pub fn is_jitted(&self, name: &str) -> bool {
        let Some(j) = &self.inner.jit else {
            return false;
        };
        self.inner
            .funcs
            .iter()
            .position(|f| f.name == name)
            .is_some_and(|i| j.get(i as u32).is_some())
    }

    /// Total bytecode instructions (for diagnostics and tests).
    pub fn code_size(&self) -> usize {
        self.inner.funcs.iter().map(|f| f.code.len()).sum()
    }
}
