//! Constant folding: the values of a kernel that do not depend on its program instance or its buffers.
//!
//! A device emitter calls [`fold`] to learn which values are the same in every program instance and what
//! they are, computed with the reference's own semantics (so a backend that substitutes them is exact with
//! respect to the oracle by construction). The WGSL emitter uses it for values derived from f64
//! arithmetic WGSL cannot express (RoPE's frequency table: `exp`/`log` of template values in f64, rounded to
//! i32 limbs), which it then writes as literal arrays.
//!
//! Only the kernel body's top level is folded (nothing inside `for` / `if`), and only pure operations whose
//! operands are immediates or folded values: elementwise arithmetic, comparisons, selects, casts,
//! `tile.range`, `tile.full`, broadcasts, reshapes, transposes and reductions. `program_id`, loads, dots
//! and stores are never folded. An operation that would fail (integer division by zero, a malformed operand)
//! or whose result has more than [`MAX_FOLDED_ELEMENTS`] elements is simply left unfolded, so it fails or
//! runs on the device exactly as it would have.

use std::collections::HashMap;

use loom_ir::kernel::{DType, KOpKind, KOperand, Kernel};

use crate::exec::immediate;
use crate::ops;
use crate::tile::{Data, Tile};

/// Results with more elements than this are not folded (a device would hold them as literal arrays).
pub const MAX_FOLDED_ELEMENTS: usize = 4096;

/// A folded value's elements, row-major: f64 for float dtypes, i64 for integer dtypes, already rounded or
/// wrapped to the dtype (an f32 value is exactly representable in f32, an i32 value in i32).
#[derive(Clone, Debug, PartialEq)]
pub enum Elements {
    Float(Vec<f64>),
    Int(Vec<i64>),
}

/// One folded value.
#[derive(Clone, Debug, PartialEq)]
pub struct Folded {
    pub dtype: DType,
    /// Empty for a scalar.
    pub shape: Vec<usize>,
    pub elements: Elements,
}

/// Every foldable value of `kernel`'s top level, by value index (`KValue.0`).
pub fn fold(kernel: &Kernel) -> HashMap<u32, Folded> {
    let mut known: HashMap<u32, Tile> = HashMap::new();
    for op in &kernel.body.ops {
        let [r] = op.results[..] else { continue };
        if let Some(t) = compute(&op.kind, &known) {
            let n = t.shape.iter().product::<usize>();
            if n <= MAX_FOLDED_ELEMENTS && declared_as(kernel, r.0, &t) {
                known.insert(r.0, t);
            }
        }
    }
    known
        .into_iter()
        .map(|(v, t)| {
            let elements = match t.data {
                Data::F(x) => Elements::Float(x),
                Data::I(x) => Elements::Int(x),
            };
            (
                v,
                Folded {
                    dtype: t.dtype,
                    shape: t.shape,
                    elements,
                },
            )
        })
        .collect()
}

/// The result agrees with the value's declared type (the interpreter's `define` check).
fn declared_as(kernel: &Kernel, v: u32, t: &Tile) -> bool {
    let Some(def) = kernel.values.get(v as usize) else {
        return false;
    };
    let (shape, dtype): (&[u32], DType) = match &def.ty {
        loom_ir::kernel::KType::Scalar(d) => (&[], *d),
        loom_ir::kernel::KType::Tile { shape, dtype } => (shape, *dtype),
    };
    dtype == t.dtype
        && shape.len() == t.shape.len()
        && shape.iter().zip(&t.shape).all(|(&a, &b)| a as usize == b)
}

fn compute(kind: &KOpKind, known: &HashMap<u32, Tile>) -> Option<Tile> {
    use KOpKind as K;
    let get = |o: &KOperand| -> Option<Tile> {
        match o {
            KOperand::Value(v) => known.get(&v.0).cloned(),
            KOperand::Imm(imm, d) => immediate(*imm, *d).ok(),
        }
    };
    let t = match kind {
        K::Binary { op, a, b } => ops::binary(*op, &get(a)?, &get(b)?),
        K::Unary { op, a } => ops::unary(*op, &get(a)?),
        K::Cmp { op, a, b } => ops::cmp(*op, &get(a)?, &get(b)?),
        K::Select { cond, a, b } => ops::select(&get(cond)?, &get(a)?, &get(b)?),
        K::Cast { a, to } => ops::cast(&get(a)?, *to),
        K::Range { start, len } => ops::range(&get(start)?, *len),
        K::Full {
            value,
            shape,
            dtype,
        } => ops::full(&get(value)?, shape, *dtype),
        K::Broadcast { a, shape } => ops::broadcast(&get(a)?, shape),
        K::ExpandDims { a, axis } => ops::expand_dims(&get(a)?, *axis),
        K::Reshape { a, shape } => ops::reshape(&get(a)?, shape),
        K::Transpose { a } => ops::transpose(&get(a)?),
        K::Reduce { op, a, axis } => ops::reduce(*op, &get(a)?, *axis),
        _ => return None,
    };
    t.ok()
}
