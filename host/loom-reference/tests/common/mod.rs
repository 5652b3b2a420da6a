//! The shared kernel builder and helpers (`loom-testkit`), re-exported for this crate's test binaries.

#![allow(dead_code, unused_imports, unreachable_pub)] // each test binary uses a subset

pub use loom_testkit::*;

use loom_ir::kernel::{DType, KOperand};

/// Runs a one-program kernel that loads all of `input` (shape `in_shape`), applies `body` and stores the
/// result to an output of `out_shape`/`out_dtype`; returns the output bytes (initially poisoned).
pub fn run_tile_fn(
    in_dtype: DType,
    in_shape: &[u64],
    input: Vec<u8>,
    out_dtype: DType,
    out_shape: &[u64],
    body: impl FnOnce(&mut KB, KOperand) -> KOperand,
) -> Result<Vec<u8>, loom_reference::Error> {
    let mut kb = KB::new("tile_fn", [1, 1, 1]);
    let x = kb.param("x", in_dtype, in_shape, READ);
    let y = kb.param("y", out_dtype, out_shape, WRITE);
    let idx: Vec<KOperand> = in_shape.iter().map(|&d| kb.range(i(0), d as u32)).collect();
    let t = kb.load(x, idx, None);
    let r = body(&mut kb, t);
    let idx: Vec<KOperand> = out_shape
        .iter()
        .map(|&d| kb.range(i(0), d as u32))
        .collect();
    kb.store(y, idx, r);
    let k = kb.finish();
    let out_len = out_dtype.bytes_for(out_shape).unwrap() as usize;
    let mut bufs = vec![input, vec![loom_reference::POISON_BYTE; out_len]];
    loom_reference::run_kernel(&k, &mut bufs)?;
    Ok(bufs.pop().unwrap())
}
