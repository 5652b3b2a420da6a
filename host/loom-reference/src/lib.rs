//! The reference interpreter for Loom kernels and stages (`loom_ir::kernel`): the executable definition of
//! `docs/loom/kernels.md` and the **oracle** every device backend (CPU JIT, Vulkan, CUDA) is tested against.
//! Clarity and exact, documented semantics come first; tiles are still interpreted as whole arrays (one
//! `Vec<f64>` or `Vec<i64>` per tile value), so realistic shapes run in reasonable time.
//!
//! # API
//!
//! * [`run_kernel`]: one kernel over its whole grid, one little-endian byte buffer per kernel parameter.
//! * [`run_stage`]: a stage's dispatches in order, over its inputs, outputs, parameter bindings and
//!   workspace ([`alloc_outputs`] makes poisoned output buffers of the right sizes).
//! * [`fold`]: the values of a kernel that are the same in every program instance, computed with these
//!   semantics (device emitters substitute them for arithmetic their target lacks).
//! * [`dequantize`]: a GGUF block-quantised buffer as f32 values; [`float`]: the f16/bf16 conversions and
//!   `erf` the reference uses (also handy for building test inputs).
//!
//! # Execution order
//!
//! A stage runs its dispatches in order; each dispatch runs every program instance of its kernel, one after
//! another in row-major grid order (`program_id(0)` slowest, `program_id(2)` fastest). Instances are
//! independent by contract: a kernel whose result depends on that order (one instance reading what another
//! wrote in the same dispatch, or two instances writing one element) is racy on devices, and the reference's
//! sequential answer is then *an* answer, not *the* answer. Within an instance, operations run in program order;
//! a store whose indices repeat an element writes it in row-major order of the value (the last write wins).
//!
//! Workspace buffers start filled with [`POISON_BYTE`] (`0xff`): NaN for every float type, -1 or the maximum
//! for integers and `true` for `i1`, so a kernel that reads workspace nobody wrote produces visibly wrong
//! results instead of plausible zeros. [`alloc_outputs`] poisons outputs the same way; [`run_stage`] and
//! [`run_kernel`] leave every byte the kernels do not store to as it was.
//!
//! # Rounding model (the tolerance story)
//!
//! Values are modelled as **stored in their dtype with wide intermediate math**:
//!
//! * Every float operation is evaluated in f64 on the (exact) operand values and its result rounded once,
//!   to nearest-even, to the value's dtype. For `+ - * /`, `rem`, `sqrt`, `min`, `max`, `neg`, `abs` and
//!   casts this is exactly IEEE 754 f32/f16/bf16 arithmetic (f64 has more than `2p + 2` bits, so the double
//!   rounding is innocuous), so a backend doing these ops natively and IEEE-correctly in the value's type
//!   matches **bit for bit**. Backends that contract `a * b + c` into an FMA, flush subnormals to zero or use
//!   approximate division (some GPU fast-math modes) differ by about an ulp per op and need a tolerance.
//!   `exp`, `log`, `tanh`, `sigmoid`, `rsqrt` and `erf` are the f64 functions rounded once (`erf` is
//!   [`float::erf`], written here; the others are Rust's `f64` methods, i.e. the platform libm, within an
//!   ulp of f64), so the
//!   reference is (almost always) the correctly rounded result and a device may differ by its own function
//!   error (typically 1-4 ulps of f32).
//! * `tile.dot` accumulates `acc + sum_k a*b` in f64 (products of f32/f16/bf16 values are exact in f64) in
//!   increasing `k` and rounds to f32 **once per dot op**; `tile.sum` (and mean-style reductions built on it)
//!   sums in f64 and rounds once to the value's dtype. Devices accumulate in f32 (with blocking, FMA and
//!   their own order), so for dot/sum they should be compared with a relative tolerance that grows with the
//!   reduction length (about `K * 2^-24` relative to `sum |a*b|`), not bitwise.
//! * Between ops, values are rounded to their dtype: an f32 value never carries extra precision into the
//!   next op, exactly like f32 registers on a device.
//! * Integer arithmetic wraps at the value's width (two's complement; index arithmetic is `i64`); integer
//!   division or remainder by zero is an error ([`Error::DivisionByZero`]), `MIN / -1` wraps; shift amounts
//!   are taken modulo the width; `>>` is arithmetic for signed and logical for unsigned types.
//! * Casts: float to int truncates toward zero and saturates (NaN -> 0); anything to `i1` is `x != 0`;
//!   int to int wraps; int or float to a float type rounds once to nearest-even (int -> f16/bf16 never goes
//!   through f64 or f32 first). f16/bf16 values are exactly what the narrow type holds (they round-trip).
//! * Float `min`/`max` (and their reductions) ignore a NaN operand (IEEE minNum/maxNum, C `fmin`/`fmax`);
//!   comparisons follow IEEE (NaN compares unequal to everything).
//! * Quantised loads dequantise with ggml's exact f32 operations (bit-identical to `dequantize_row_*`).
//!
//! # Types are checked, nothing is converted implicitly
//!
//! Operands of an elementwise op must have one dtype (immediates included: an immediate is a scalar of its
//! tagged dtype; an integer immediate tagged with a float dtype is converted, so `0` may stand for `0.0`)
//! and be scalars or tiles of one shape; every op's result is checked against the declared type
//! of its result value. Index operands are `i64` scalars or 1-D `i64` tiles; a load's fill and a `tile.full`
//! value must have the exact element type. A mismatch is [`Error::Malformed`] naming the op's location:
//! the interpreter is meant to catch front-end mistakes, not paper over them.
//!
//! # Errors
//!
//! Nothing in the input — IR, buffers or indices — can make the interpreter panic or read out of bounds:
//!
//! * [`Error::SizeMismatch`] / [`Error::BufferCount`]: a buffer whose byte length is not its dtype and shape's
//!   size (`DType::bytes_for`), or the wrong number of buffers.
//! * [`Error::IndexOutOfRange`]: a checked load (`fill: None`) with an index outside its buffer, e.g. a token
//!   id >= vocabulary size. This is the guarantee that such an id is an error of the dispatch, never a wild
//!   read. (Masked loads read their fill; stores skip out-of-range elements.)
//! * [`Error::DivisionByZero`]: integer division or remainder by zero.
//! * [`Error::TileTooLarge`]: a tile over [`MAX_TILE_ELEMENTS`], refused before it is allocated.
//! * [`Error::Malformed`]: anything else wrong with the IR (wrong operand types or shapes, a value used before
//!   definition, a missing `yield`, a store to a read-only or quantised buffer, ...).
//!
//! The first error stops the run; buffers may then hold a partial result.
//!
//! # Limits
//!
//! This is an interpreter, not a verifier: it checks what it executes. Code in a branch or loop that never
//! runs is not checked, and SSA scoping is not enforced (a value defined inside a region stays readable
//! after it; `loom_ir`'s verifier is the place for such static checks). A loop's trip count is not limited.

#![forbid(unsafe_code)]

mod elem;
mod exec;
pub mod float;
mod fold;
mod ops;
mod tile;

pub use fold::{Elements, Folded, MAX_FOLDED_ELEMENTS, fold};
pub use loom_ir::kernel::MAX_TILE_ELEMENTS;
use loom_ir::kernel::{Access, BufRef, DType, Kernel, RunBounds, Stage};

use exec::Slot;
use loom_ir::kernel::{
    buffer_bytes as byte_size, check_buffer_count as check_count, check_buffer_size as check_size,
};

/// The byte workspace (and [`alloc_outputs`]) buffers are filled with before a stage runs.
pub const POISON_BYTE: u8 = 0xff;

/// Why a kernel or stage could not run to completion: the execution contract's error, shared with every
/// backend so their failures compare equal to the reference's.
pub use loom_ir::kernel::ExecError as Error;

fn malformed(at: impl Into<String>, message: impl Into<String>) -> Error {
    Error::Malformed {
        at: at.into(),
        message: message.into(),
    }
}

/// Byte size of a buffer, or `Malformed` when the shape is not a whole number of blocks or overflows.
/// Poisoned buffers of the right sizes for a stage's outputs.
pub fn alloc_outputs(stage: &Stage) -> Result<Vec<Vec<u8>>, Error> {
    let at = format!("stage `{}`", stage.name);
    stage
        .outputs
        .iter()
        .map(|b| poisoned(byte_size(&at, &b.name, b.dtype, &b.shape)?, &at))
        .collect()
}

fn poisoned(len: usize, at: &str) -> Result<Vec<u8>, Error> {
    let mut v = Vec::new();
    v.try_reserve_exact(len)
        .map_err(|_| malformed(at, format!("cannot allocate {len} bytes")))?;
    v.resize(len, POISON_BYTE);
    Ok(v)
}

/// Runs one kernel over its whole grid. `buffers[p]` is parameter `p`'s little-endian contents and must be
/// exactly `dtype.bytes_for(shape)` long; parameters declared `write`/`readwrite` are updated in place.
pub fn run_kernel(kernel: &Kernel, buffers: &mut [Vec<u8>]) -> Result<(), Error> {
    check_count(
        format!("kernel `{}` parameters", kernel.name),
        kernel.params.len(),
        buffers.len(),
    )?;
    for (p, b) in kernel.params.iter().zip(buffers.iter()) {
        check_size(
            format!("kernel `{}` parameter `{}`", kernel.name, p.name),
            p.dtype,
            &p.shape,
            b.len(),
        )?;
    }
    let mut slots: Vec<Slot<'_>> = buffers
        .iter_mut()
        .map(|b| Slot::Rw(b.as_mut_slice()))
        .collect();
    let map: Vec<usize> = (0..slots.len()).collect();
    exec::run(kernel, &mut slots, &map, "", &RunBounds::NONE)
}

/// Runs a stage: allocates its workspace (filled with [`POISON_BYTE`]) and runs its dispatches in order.
///
/// `inputs`, `params` (the reflected parameter bindings, in [`Stage::params`] order) and `outputs` are
/// little-endian buffers whose lengths must match their declared dtype and shape. Outputs are updated in
/// place; bytes no kernel stores to keep their previous contents ([`alloc_outputs`] makes poisoned ones).
///
/// A dispatch binds each kernel parameter to a stage buffer of the same dtype and byte size; the kernel sees
/// the buffer under its own shape (row-major reinterpretation, e.g. `[B, T]` ids as `[B * T]`). Parameters the
/// kernel writes must be bound to outputs or workspace; one buffer may be bound to several parameters.
pub fn run_stage(
    stage: &Stage,
    inputs: &[&[u8]],
    params: &[&[u8]],
    outputs: &mut [Vec<u8>],
) -> Result<(), Error> {
    run_stage_bounded(stage, inputs, params, outputs, &RunBounds::NONE)
}

/// [`run_stage`] within `bounds`: each dispatch has the step budget (a grid larger than the budget fails
/// before it runs; each program instance may run `budget / instances - 1` loop iterations), and the flag stops
/// the stage at its next program instance or loop iteration ([`Error::BudgetExceeded`], [`Error::Cancelled`],
/// naming the kernel and the stage). Every backend gives the same error for the same bounds.
pub fn run_stage_bounded(
    stage: &Stage,
    inputs: &[&[u8]],
    params: &[&[u8]],
    outputs: &mut [Vec<u8>],
    bounds: &RunBounds<'_>,
) -> Result<(), Error> {
    let at = format!("stage `{}`", stage.name);
    stage.check_buffers(inputs, params, outputs)?;
    let mut workspace = stage
        .workspace
        .iter()
        .map(|b| poisoned(byte_size(&at, &b.name, b.dtype, &b.shape)?, &at))
        .collect::<Result<Vec<_>, _>>()?;

    // One slot table for the whole stage: inputs, outputs, workspace, parameters.
    let (n_in, n_out, n_ws) = (inputs.len(), outputs.len(), workspace.len());
    let mut slots: Vec<Slot<'_>> = Vec::with_capacity(n_in + n_out + n_ws + params.len());
    slots.extend(inputs.iter().map(|b| Slot::Ro(b)));
    slots.extend(outputs.iter_mut().map(|b| Slot::Rw(b.as_mut_slice())));
    slots.extend(workspace.iter_mut().map(|b| Slot::Rw(b.as_mut_slice())));
    slots.extend(params.iter().map(|b| Slot::Ro(b)));

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
        let mut map = Vec::with_capacity(d.args.len());
        for (p, arg) in kernel.params.iter().zip(&d.args) {
            let (slot, dtype, shape, name, writable) = match *arg {
                BufRef::Input(i) => stage
                    .inputs
                    .get(i as usize)
                    .map(|b| (i as usize, b.dtype, &b.shape, &b.name, false)),
                BufRef::Output(i) => stage
                    .outputs
                    .get(i as usize)
                    .map(|b| (n_in + i as usize, b.dtype, &b.shape, &b.name, true)),
                BufRef::Workspace(i) => stage
                    .workspace
                    .get(i as usize)
                    .map(|b| (n_in + n_out + i as usize, b.dtype, &b.shape, &b.name, true)),
                BufRef::Param(i) => stage.params.get(i as usize).map(|b| {
                    (
                        n_in + n_out + n_ws + i as usize,
                        b.dtype,
                        &b.shape,
                        &b.name,
                        false,
                    )
                }),
            }
            .ok_or_else(|| malformed(&here, format!("argument {arg:?} does not exist")))?;
            let want = byte_size(&here, &p.name, p.dtype, &p.shape)?;
            let have = byte_size(&here, name, dtype, shape)?;
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
        exec::run(kernel, &mut slots, &map, &stage.name, bounds)?;
    }
    Ok(())
}

/// Dequantises a whole GGUF block-quantised buffer (a sequence of blocks) to f32, exactly as loads do.
pub fn dequantize(dtype: DType, bytes: &[u8]) -> Result<Vec<f32>, Error> {
    let at = format!("dequantize {dtype}");
    let (per, size) = dtype
        .block()
        .ok_or_else(|| malformed(&at, "not a block-quantised type"))?;
    let (per, size) = (per as usize, size as usize);
    if !bytes.len().is_multiple_of(size) {
        return Err(malformed(
            &at,
            format!(
                "{} bytes is not a whole number of {size}-byte blocks",
                bytes.len()
            ),
        ));
    }
    (0..bytes.len() / size * per)
        .map(|g| {
            elem::dequant_element(dtype, bytes, g)
                .ok_or_else(|| malformed(&at, "internal: block read"))
        })
        .collect()
}
