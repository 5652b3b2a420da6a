//! Whole-tile operations: elementwise math, casts, shape manipulation, reductions and `dot`. Each takes its
//! operands as tiles, checks their types (a malformed combination is a [`Fault::Malformed`], never a panic) and
//! returns the result tile, rounded or wrapped to its dtype.

use loom_ir::kernel::{BinOp, CmpOp, DType, ReduceOp, UnOp};

use crate::float::{erf, int_to_float, round_to};
use crate::tile::{
    Data, Fault, R, Tile, bad, elements, int_bits, is_int, strided_offsets, strides, wrap,
};

/// The shape of an elementwise result: scalars broadcast over tiles; tiles must have equal shapes.
fn common_shape(ts: &[&Tile]) -> R<Vec<usize>> {
    let mut shape: Option<&Vec<usize>> = None;
    for t in ts.iter().filter(|t| !t.is_scalar()) {
        match shape {
            None => shape = Some(&t.shape),
            Some(s) if *s == t.shape => {}
            Some(_) => {
                let list: Vec<String> = ts.iter().map(|t| t.to_string()).collect();
                return Err(bad!(
                    "elementwise operands {} must be scalars or tiles of one shape (broadcast explicitly)",
                    list.join(", ")
                ));
            }
        }
    }
    Ok(shape.cloned().unwrap_or_default())
}

/// Element `i` of an operand that is either broadcast (one element) or full-size.
fn at<T: Copy>(v: &[T], i: usize) -> T {
    if v.len() == 1 { v[0] } else { v[i] }
}

fn same_dtype(what: &str, a: &Tile, b: &Tile) -> R<DType> {
    if a.dtype != b.dtype {
        return Err(bad!(
            "{what}: operand types {a} and {b} differ (cast explicitly)"
        ));
    }
    Ok(a.dtype)
}

pub(crate) fn binary(op: BinOp, a: &Tile, b: &Tile) -> R<Tile> {
    let dtype = same_dtype(&format!("{op:?}"), a, b)?;
    let shape = common_shape(&[a, b])?;
    let n = elements(&shape)?;
    match (&a.data, &b.data) {
        (Data::F(x), Data::F(y)) => {
            let f: fn(f64, f64) -> f64 = match op {
                BinOp::Add => |x, y| x + y,
                BinOp::Sub => |x, y| x - y,
                BinOp::Mul => |x, y| x * y,
                BinOp::Div => |x, y| x / y,
                // fmod: the result has the sign of the dividend (C `fmod`, Rust `%`).
                BinOp::Rem => |x, y| x % y,
                // IEEE minNum/maxNum: a NaN operand is ignored (C `fmin`/`fmax`).
                BinOp::Min => f64::min,
                BinOp::Max => f64::max,
                _ => return Err(bad!("`{op:?}` is not defined on {dtype}")),
            };
            let v = (0..n)
                .map(|i| round_to(dtype, f(at(x, i), at(y, i))))
                .collect();
            Ok(Tile::float(dtype, shape, v))
        }
        (Data::I(x), Data::I(y)) => {
            let bits = int_bits(dtype);
            let mut v = Vec::with_capacity(n);
            for i in 0..n {
                let (x, y) = (at(x, i), at(y, i));
                let r = match op {
                    BinOp::Add => x.wrapping_add(y),
                    BinOp::Sub => x.wrapping_sub(y),
                    BinOp::Mul => x.wrapping_mul(y),
                    // Truncating division and remainder (C semantics); MIN / -1 wraps.
                    BinOp::Div if y == 0 => return Err(Fault::DivisionByZero),
                    BinOp::Div => x.wrapping_div(y),
                    BinOp::Rem if y == 0 => return Err(Fault::DivisionByZero),
                    BinOp::Rem => x.wrapping_rem(y),
                    BinOp::Min => x.min(y),
                    BinOp::Max => x.max(y),
                    BinOp::And => x & y,
                    BinOp::Or => x | y,
                    BinOp::Xor => x ^ y,
                    // Shift amounts are taken modulo the bit width (as WGSL and the hardware do); values are
                    // stored sign-extended (signed) or zero-extended (unsigned), so `>>` is arithmetic for signed
                    // and logical for unsigned dtypes.
                    BinOp::Shl => x.wrapping_shl(((y as u64) % bits) as u32),
                    BinOp::Shr => x >> ((y as u64) % bits),
                };
                v.push(wrap(dtype, r));
            }
            Ok(Tile::int(dtype, shape, v))
        }
        _ => Err(bad!(
            "`{op:?}`: operands {a} and {b} are not both float or both integer"
        )),
    }
}

pub(crate) fn unary(op: UnOp, a: &Tile) -> R<Tile> {
    let dtype = a.dtype;
    match &a.data {
        Data::F(x) => {
            let f: fn(f64) -> f64 = match op {
                UnOp::Neg => |x| -x,
                UnOp::Abs => f64::abs,
                UnOp::Exp => f64::exp,
                UnOp::Log => f64::ln,
                UnOp::Tanh => f64::tanh,
                UnOp::Erf => erf,
                UnOp::Sqrt => f64::sqrt,
                UnOp::Rsqrt => |x| 1.0 / x.sqrt(),
                UnOp::Sigmoid => |x| 1.0 / (1.0 + (-x).exp()),
                UnOp::Not => return Err(bad!("`Not` is not defined on {dtype}")),
            };
            Ok(Tile::float(
                dtype,
                a.shape.clone(),
                x.iter().map(|&x| round_to(dtype, f(x))).collect(),
            ))
        }
        Data::I(x) => {
            let f: fn(i64) -> i64 = match op {
                UnOp::Neg => i64::wrapping_neg,
                UnOp::Abs => i64::wrapping_abs,
                UnOp::Not => |x| !x,
                _ => return Err(bad!("`{op:?}` is not defined on {dtype}")),
            };
            Ok(Tile::int(
                dtype,
                a.shape.clone(),
                x.iter().map(|&x| wrap(dtype, f(x))).collect(),
            ))
        }
    }
}

pub(crate) fn cmp(op: CmpOp, a: &Tile, b: &Tile) -> R<Tile> {
    same_dtype(&format!("{op:?}"), a, b)?;
    let shape = common_shape(&[a, b])?;
    let n = elements(&shape)?;
    fn test<T: PartialOrd>(op: CmpOp, x: T, y: T) -> bool {
        // IEEE comparisons: everything but `Ne` is false when a NaN is involved.
        match op {
            CmpOp::Eq => x == y,
            CmpOp::Ne => x != y,
            CmpOp::Lt => x < y,
            CmpOp::Le => x <= y,
            CmpOp::Gt => x > y,
            CmpOp::Ge => x >= y,
        }
    }
    let v = match (&a.data, &b.data) {
        (Data::F(x), Data::F(y)) => (0..n)
            .map(|i| i64::from(test(op, at(x, i), at(y, i))))
            .collect(),
        (Data::I(x), Data::I(y)) => (0..n)
            .map(|i| i64::from(test(op, at(x, i), at(y, i))))
            .collect(),
        _ => return Err(bad!("comparison of {a} and {b}")),
    };
    Ok(Tile::int(DType::I1, shape, v))
}

pub(crate) fn select(c: &Tile, a: &Tile, b: &Tile) -> R<Tile> {
    if c.dtype != DType::I1 {
        return Err(bad!("select condition must be i1, got {c}"));
    }
    let dtype = same_dtype("select", a, b)?;
    let shape = common_shape(&[c, a, b])?;
    let n = elements(&shape)?;
    let Data::I(cv) = &c.data else {
        return Err(bad!("select condition {c} holds no integers"));
    };
    let data = match (&a.data, &b.data) {
        (Data::F(x), Data::F(y)) => Data::F(
            (0..n)
                .map(|i| if at(cv, i) != 0 { at(x, i) } else { at(y, i) })
                .collect(),
        ),
        (Data::I(x), Data::I(y)) => Data::I(
            (0..n)
                .map(|i| if at(cv, i) != 0 { at(x, i) } else { at(y, i) })
                .collect(),
        ),
        _ => return Err(bad!("select between {a} and {b}")),
    };
    Ok(Tile { dtype, shape, data })
}

/// Float to integer: truncate toward zero, saturate at the target's range, NaN -> 0 (Rust `as` semantics,
/// extended to narrow types). Anything to `i1` is `x != 0` (C `bool` conversion: NaN -> 1).
fn float_to_int(to: DType, x: f64) -> i64 {
    if to == DType::I1 {
        return i64::from(x != 0.0);
    }
    let (lo, hi) = to.int_range();
    if x.is_nan() {
        0
    } else if x <= lo as f64 {
        lo
    } else if x >= hi as f64 {
        hi
    } else {
        x.trunc() as i64
    }
}

pub(crate) fn cast(a: &Tile, to: DType) -> R<Tile> {
    if to.is_quantized() {
        return Err(bad!("cast to quantised type {to}"));
    }
    let shape = a.shape.clone();
    Ok(match &a.data {
        Data::F(x) if to.is_float() => {
            Tile::float(to, shape, x.iter().map(|&x| round_to(to, x)).collect())
        }
        Data::F(x) => Tile::int(to, shape, x.iter().map(|&x| float_to_int(to, x)).collect()),
        Data::I(x) if to.is_float() => {
            Tile::float(to, shape, x.iter().map(|&x| int_to_float(to, x)).collect())
        }
        // Integer to integer: two's-complement truncation / extension; to `i1`: `x != 0`.
        Data::I(x) if to == DType::I1 => {
            Tile::int(to, shape, x.iter().map(|&x| i64::from(x != 0)).collect())
        }
        Data::I(x) => Tile::int(to, shape, x.iter().map(|&x| wrap(to, x)).collect()),
    })
}

pub(crate) fn shape_of(s: &[u32]) -> Vec<usize> {
    s.iter().map(|&d| d as usize).collect()
}

/// numpy broadcasting to `target`: dims right-aligned, each source dim equal to the target's or 1.
pub(crate) fn broadcast(a: &Tile, target: &[u32]) -> R<Tile> {
    let target = shape_of(target);
    elements(&target)?;
    if a.shape.len() > target.len() {
        return Err(bad!("cannot broadcast {a} to a lower rank {:?}", target));
    }
    let off = target.len() - a.shape.len();
    let src = strides(&a.shape);
    let mut st = vec![0; target.len()];
    for (i, &d) in a.shape.iter().enumerate() {
        if d == target[off + i] {
            st[off + i] = src[i];
        } else if d != 1 {
            return Err(bad!("cannot broadcast {a} to {:?}: dim {i} is {d}", target));
        }
    }
    let offsets = strided_offsets(&target, &st);
    Ok(a.gather(target, &offsets))
}

pub(crate) fn expand_dims(a: &Tile, axis: u8) -> R<Tile> {
    let axis = usize::from(axis);
    if axis > a.shape.len() {
        return Err(bad!(
            "expand_dims axis {axis} of {a} (at most {})",
            a.shape.len()
        ));
    }
    let mut shape = a.shape.clone();
    shape.insert(axis, 1);
    Ok(a.with_shape(shape))
}

pub(crate) fn reshape(a: &Tile, shape: &[u32]) -> R<Tile> {
    let shape = shape_of(shape);
    let n = elements(&shape)?;
    if n != a.len() {
        return Err(bad!(
            "cannot reshape {a} ({} elements) to {:?} ({n} elements)",
            a.len(),
            shape
        ));
    }
    Ok(a.with_shape(shape))
}

pub(crate) fn transpose(a: &Tile) -> R<Tile> {
    let [r, c] = a.shape[..] else {
        return Err(bad!("transpose needs a 2-D tile, got {a}"));
    };
    // Output [c, r]: output dim 0 walks source columns (stride 1), dim 1 source rows (stride c).
    let offsets = strided_offsets(&[c, r], &[1, c]);
    Ok(a.gather(vec![c, r], &offsets))
}

/// Removes `axis`; float sums accumulate in f64 in index order and round once; integer sums wrap. An empty
/// reduction gives the identity (0, the lowest or the highest value). Float max/min ignore NaNs like
/// [`binary`] does.
pub(crate) fn reduce(op: ReduceOp, a: &Tile, axis: u8) -> R<Tile> {
    let axis = usize::from(axis);
    if axis >= a.shape.len() {
        return Err(bad!("reduce axis {axis} of {a}"));
    }
    let outer: usize = a.shape[..axis].iter().product();
    let len = a.shape[axis];
    let inner: usize = a.shape[axis + 1..].iter().product();
    let mut shape = a.shape.clone();
    shape.remove(axis);
    if shape.is_empty() {
        shape.push(1);
    }
    let dtype = a.dtype;
    let idx = |o: usize, l: usize, i: usize| (o * len + l) * inner + i;
    let data = match &a.data {
        Data::F(x) => {
            let mut v = Vec::with_capacity(outer * inner);
            for o in 0..outer {
                for i in 0..inner {
                    let it = (0..len).map(|l| x[idx(o, l, i)]);
                    let r = match op {
                        ReduceOp::Sum => it.sum::<f64>(),
                        ReduceOp::Max => it.fold(f64::NEG_INFINITY, f64::max),
                        ReduceOp::Min => it.fold(f64::INFINITY, f64::min),
                    };
                    v.push(round_to(dtype, r));
                }
            }
            Data::F(v)
        }
        Data::I(x) => {
            let (lo, hi) = dtype.int_range();
            let mut v = Vec::with_capacity(outer * inner);
            for o in 0..outer {
                for i in 0..inner {
                    let it = (0..len).map(|l| x[idx(o, l, i)]);
                    let r = match op {
                        ReduceOp::Sum => wrap(dtype, it.fold(0i64, i64::wrapping_add)),
                        ReduceOp::Max => it.fold(lo, i64::max),
                        ReduceOp::Min => it.fold(hi, i64::min),
                    };
                    v.push(r);
                }
            }
            Data::I(v)
        }
    };
    Ok(Tile { dtype, shape, data })
}

/// `acc + a @ b`: every output element is `acc[m][n] + sum_k a[m][k] * b[k][n]` accumulated in f64 in
/// increasing `k` and rounded to f32 once.
pub(crate) fn dot(a: &Tile, b: &Tile, acc: &Tile) -> R<Tile> {
    let ([m, k], [k2, n]) = (&a.shape[..], &b.shape[..]) else {
        return Err(bad!("dot operands must be 2-D tiles, got {a} and {b}"));
    };
    let (m, k, k2, n) = (*m, *k, *k2, *n);
    if k != k2 || acc.shape != [m, n] {
        return Err(bad!("dot shapes do not line up: {a} @ {b} + {acc}"));
    }
    if !a.dtype.is_float() || a.dtype != b.dtype {
        return Err(bad!(
            "dot operands must be floats of one type, got {a} and {b}"
        ));
    }
    if acc.dtype != DType::F32 {
        return Err(bad!("dot accumulator must be f32, got {acc}"));
    }
    let (Data::F(x), Data::F(y), Data::F(c)) = (&a.data, &b.data, &acc.data) else {
        return Err(bad!("dot operands hold no floats"));
    };
    let mut out = c.clone();
    if n > 0 {
        for (i, row) in out.chunks_exact_mut(n).enumerate() {
            for kk in 0..k {
                let xv = x[i * k + kk];
                for (o, &yv) in row.iter_mut().zip(&y[kk * n..(kk + 1) * n]) {
                    *o += xv * yv;
                }
            }
        }
    }
    for o in &mut out {
        *o = *o as f32 as f64;
    }
    Ok(Tile::float(DType::F32, vec![m, n], out))
}

/// Checks that `t` is an integer scalar and returns it.
pub(crate) fn int_scalar(t: &Tile, what: &str) -> R<i64> {
    match &t.data {
        Data::I(v) if t.is_scalar() && t.dtype == DType::I64 => Ok(v[0]),
        _ => Err(bad!("{what} must be an i64 scalar, got {t}")),
    }
}

/// A scalar `Full`/fill value must have exactly the dtype of the tile it fills.
pub(crate) fn check_fill(t: &Tile, dtype: DType, what: &str) -> R<()> {
    if !t.is_scalar() || t.dtype != dtype {
        return Err(bad!("{what} must be a {dtype} scalar, got {t}"));
    }
    Ok(())
}

pub(crate) fn full(value: &Tile, shape: &[u32], dtype: DType) -> R<Tile> {
    check_fill(value, dtype, "full value")?;
    let shape = shape_of(shape);
    let n = elements(&shape)?;
    Ok(match &value.data {
        Data::F(v) => Tile::float(dtype, shape, vec![v[0]; n]),
        Data::I(v) => Tile::int(dtype, shape, vec![v[0]; n]),
    })
}

pub(crate) fn range(start: &Tile, len: u32) -> R<Tile> {
    let s = int_scalar(start, "range start")?;
    let n = elements(&[len as usize])?;
    // Index arithmetic wraps at 64 bits.
    Ok(Tile::int(
        DType::I64,
        vec![n],
        (0..n as i64).map(|i| s.wrapping_add(i)).collect(),
    ))
}

/// Is `dtype` one a tile can hold?
pub(crate) fn check_value_dtype(dtype: DType) -> R<()> {
    if dtype.is_quantized() {
        return Err(bad!("{dtype} is a buffer layout, not a value type"));
    }
    debug_assert!(dtype.is_float() || is_int(dtype));
    Ok(())
}
