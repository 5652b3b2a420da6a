//! Runtime values: a scalar is a rank-0 tile. Elements live in one flat row-major vector, f64 for float dtypes
//! and i64 for integer dtypes, always already rounded/wrapped to the value's dtype.

use std::fmt;

use loom_ir::kernel::{DType, MAX_TILE_ELEMENTS};

/// Why an operation failed, before the interpreter adds where (kernel, op location, program id).
#[derive(Debug)]
pub(crate) enum Fault {
    Malformed(String),
    TileTooLarge(u64),
    DivisionByZero,
    OutOfRange {
        param: u32,
        index: i64,
        dim: usize,
        extent: u64,
    },
    /// Already complete (raised inside a nested region): passed through unchanged.
    Done(Box<crate::Error>),
}

pub(crate) type R<T> = Result<T, Fault>;

macro_rules! bad {
    ($($t:tt)*) => { $crate::tile::Fault::Malformed(format!($($t)*)) };
}
pub(crate) use bad;

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Data {
    F(Vec<f64>),
    I(Vec<i64>),
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Tile {
    pub(crate) dtype: DType,
    /// Empty for a scalar.
    pub(crate) shape: Vec<usize>,
    pub(crate) data: Data,
}

impl fmt::Display for Tile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        describe(f, &self.shape, self.dtype)
    }
}

pub(crate) fn describe(f: &mut impl fmt::Write, shape: &[usize], dtype: DType) -> fmt::Result {
    if shape.is_empty() {
        write!(f, "{dtype}")
    } else {
        let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
        write!(f, "tile<[{}], {dtype}>", dims.join(", "))
    }
}

/// Element count of a shape, refusing tiles over [`MAX_TILE_ELEMENTS`] before anything is allocated.
pub(crate) fn elements(shape: &[usize]) -> R<usize> {
    let n = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or(Fault::TileTooLarge(u64::MAX))?;
    if n as u64 > MAX_TILE_ELEMENTS {
        return Err(Fault::TileTooLarge(n as u64));
    }
    Ok(n)
}

/// Row-major strides (in elements) of a shape.
pub(crate) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// For every element of `shape` in row-major order, `sum_d index_d * strides[d]`: the source offsets of a
/// strided view (broadcast dims have stride 0).
pub(crate) fn strided_offsets(shape: &[usize], strides: &[usize]) -> Vec<usize> {
    let mut offs = vec![0usize];
    for (&n, &s) in shape.iter().zip(strides) {
        offs = offs
            .iter()
            .flat_map(|&o| (0..n).map(move |i| o + i * s))
            .collect();
    }
    offs
}

impl Tile {
    pub(crate) fn float(dtype: DType, shape: Vec<usize>, v: Vec<f64>) -> Tile {
        debug_assert_eq!(v.len(), shape.iter().product::<usize>());
        Tile {
            dtype,
            shape,
            data: Data::F(v),
        }
    }
    pub(crate) fn int(dtype: DType, shape: Vec<usize>, v: Vec<i64>) -> Tile {
        debug_assert_eq!(v.len(), shape.iter().product::<usize>());
        Tile {
            dtype,
            shape,
            data: Data::I(v),
        }
    }
    pub(crate) fn i64_scalar(x: i64) -> Tile {
        Tile::int(DType::I64, vec![], vec![x])
    }
    pub(crate) fn is_scalar(&self) -> bool {
        self.shape.is_empty()
    }
    pub(crate) fn len(&self) -> usize {
        match &self.data {
            Data::F(v) => v.len(),
            Data::I(v) => v.len(),
        }
    }
    /// The same elements under another shape (the caller checked the element count).
    pub(crate) fn with_shape(&self, shape: Vec<usize>) -> Tile {
        Tile {
            dtype: self.dtype,
            shape,
            data: self.data.clone(),
        }
    }
    /// Elements picked by flat source offsets (all in range by construction).
    pub(crate) fn gather(&self, shape: Vec<usize>, offsets: &[usize]) -> Tile {
        let data = match &self.data {
            Data::F(v) => Data::F(offsets.iter().map(|&o| v[o]).collect()),
            Data::I(v) => Data::I(offsets.iter().map(|&o| v[o]).collect()),
        };
        Tile {
            dtype: self.dtype,
            shape,
            data,
        }
    }
}

/// Two's-complement wrap of `x` into integer `dtype` (`i1` keeps the low bit).
pub(crate) fn wrap(dtype: DType, x: i64) -> i64 {
    match dtype {
        DType::I32 => i64::from(x as i32),
        DType::U32 => i64::from(x as u32),
        DType::I16 => i64::from(x as i16),
        DType::U16 => i64::from(x as u16),
        DType::I8 => i64::from(x as i8),
        DType::U8 => i64::from(x as u8),
        DType::I1 => x & 1,
        _ => x,
    }
}

/// Bit width of integer `dtype`.
pub(crate) fn int_bits(dtype: DType) -> u64 {
    match dtype {
        DType::I32 | DType::U32 => 32,
        DType::I16 | DType::U16 => 16,
        DType::I8 | DType::U8 => 8,
        DType::I1 => 1,
        _ => 64,
    }
}

pub(crate) fn is_int(dtype: DType) -> bool {
    !dtype.is_float() && !dtype.is_quantized()
}
