//! Little-endian buffer elements: reading every [`DType`] (dequantising GGUF blocks) and writing plain ones.
//!
//! Readers take a flat element index `g` (row-major over the buffer's logical shape). Quantised buffers hold
//! whole blocks along the last dimension, so the flat element `g` is element `g % B` of block `g / B`
//! (`B` = 32 or 256) and the buffer is simply a sequence of blocks. Every access is bounds-checked (`None`
//! when out of range), so a reader can never panic or read outside its buffer.

use loom_ir::kernel::DType;

use crate::float::{bf16_to_f32, f16_to_f32, f64_to_bf16, f64_to_f16};

fn bytes<const N: usize>(b: &[u8], at: usize) -> Option<[u8; N]> {
    b.get(at..at.checked_add(N)?)?.try_into().ok()
}

fn f16_at(b: &[u8], at: usize) -> Option<f32> {
    Some(f16_to_f32(u16::from_le_bytes(bytes(b, at)?)))
}

/// The float element `g` of a buffer of float or quantised `dtype`, as f64 (exact: it is a value of `dtype`,
/// or the f32 result of dequantisation).
pub(crate) fn read_float(dtype: DType, b: &[u8], g: usize) -> Option<f64> {
    Some(match dtype {
        DType::F32 => f64::from(f32::from_le_bytes(bytes(b, g.checked_mul(4)?)?)),
        DType::F64 => f64::from_le_bytes(bytes(b, g.checked_mul(8)?)?),
        DType::F16 => f64::from(f16_at(b, g.checked_mul(2)?)?),
        DType::BF16 => f64::from(bf16_to_f32(u16::from_le_bytes(bytes(
            b,
            g.checked_mul(2)?,
        )?))),
        DType::Q8_0 | DType::Q4_0 | DType::Q4_1 | DType::Q4K | DType::Q6K => {
            f64::from(dequant_element(dtype, b, g)?)
        }
        _ => return None,
    })
}

/// The integer element `g` of a buffer of integer `dtype` (`i1`: any nonzero byte is 1).
pub(crate) fn read_int(dtype: DType, b: &[u8], g: usize) -> Option<i64> {
    Some(match dtype {
        DType::I64 => i64::from_le_bytes(bytes(b, g.checked_mul(8)?)?),
        DType::I32 => i64::from(i32::from_le_bytes(bytes(b, g.checked_mul(4)?)?)),
        DType::U32 => i64::from(u32::from_le_bytes(bytes(b, g.checked_mul(4)?)?)),
        DType::I16 => i64::from(i16::from_le_bytes(bytes(b, g.checked_mul(2)?)?)),
        DType::U16 => i64::from(u16::from_le_bytes(bytes(b, g.checked_mul(2)?)?)),
        DType::I8 => i64::from(*b.get(g)? as i8),
        DType::U8 => i64::from(*b.get(g)?),
        DType::I1 => i64::from(*b.get(g)? != 0),
        _ => return None,
    })
}

fn put(b: &mut [u8], at: usize, src: &[u8]) -> Option<()> {
    b.get_mut(at..at.checked_add(src.len())?)?
        .copy_from_slice(src);
    Some(())
}

/// Writes float element `g` of a plain float buffer. `x` is already a value of `dtype`, so the narrowing
/// conversions here are exact.
pub(crate) fn write_float(dtype: DType, b: &mut [u8], g: usize, x: f64) -> Option<()> {
    match dtype {
        DType::F32 => put(b, g.checked_mul(4)?, &(x as f32).to_le_bytes()),
        DType::F64 => put(b, g.checked_mul(8)?, &x.to_le_bytes()),
        DType::F16 => put(b, g.checked_mul(2)?, &f64_to_f16(x).to_le_bytes()),
        DType::BF16 => put(b, g.checked_mul(2)?, &f64_to_bf16(x).to_le_bytes()),
        _ => None,
    }
}

/// Writes integer element `g` of a plain integer buffer (`x` is already in `dtype`'s range; `i1` writes 0/1).
pub(crate) fn write_int(dtype: DType, b: &mut [u8], g: usize, x: i64) -> Option<()> {
    match dtype {
        DType::I64 => put(b, g.checked_mul(8)?, &x.to_le_bytes()),
        DType::I32 | DType::U32 => put(b, g.checked_mul(4)?, &(x as u32).to_le_bytes()),
        DType::I16 | DType::U16 => put(b, g.checked_mul(2)?, &(x as u16).to_le_bytes()),
        DType::I8 | DType::U8 | DType::I1 => put(b, g, &[x as u8]),
        _ => None,
    }
}

/// Element `g` of a GGUF block-quantised buffer, dequantised exactly as ggml's `dequantize_row_*` does it (same
/// f32 operations in the same order, so the values match ggml bit for bit).
pub(crate) fn dequant_element(dtype: DType, b: &[u8], g: usize) -> Option<f32> {
    let (per, size) = dtype.block()?;
    let (per, size) = (per as usize, size as usize);
    let base = (g / per).checked_mul(size)?;
    let blk = b.get(base..base.checked_add(size)?)?;
    let i = g % per;
    match dtype {
        // block_q8_0 { f16 d; i8 qs[32] }: x = qs[i] * d
        DType::Q8_0 => {
            let d = f16_at(blk, 0)?;
            Some(f32::from(*blk.get(2 + i)? as i8) * d)
        }
        // block_q4_0 { f16 d; u8 qs[16] }: elements 0..16 are low nibbles, 16..32 high nibbles; x = (q - 8) * d
        DType::Q4_0 => {
            let d = f16_at(blk, 0)?;
            let q = nibble(blk, 2, i)?;
            Some((q as f32 - 8.0) * d)
        }
        // block_q4_1 { f16 d; f16 m; u8 qs[16] }: x = q * d + m
        DType::Q4_1 => {
            let d = f16_at(blk, 0)?;
            let m = f16_at(blk, 2)?;
            let q = nibble(blk, 4, i)?;
            Some(q as f32 * d + m)
        }
        DType::Q4K => q4_k(blk, i),
        DType::Q6K => q6_k(blk, i),
        _ => None,
    }
}

/// Nibble `i` (0..32) of the 16 bytes at `at`: low nibbles hold elements 0..16, high nibbles 16..32.
fn nibble(blk: &[u8], at: usize, i: usize) -> Option<u8> {
    let byte = *blk.get(at + i % 16)?;
    Some(if i < 16 { byte & 0x0f } else { byte >> 4 })
}

/// The 6-bit scale and min of sub-block `j` (0..8) packed in the 12 `scales` bytes of a Q4_K block
/// (ggml's `get_scale_min_k4`).
pub(crate) fn scale_min_k4(j: usize, q: &[u8]) -> Option<(u8, u8)> {
    if j < 4 {
        Some((q.get(j)? & 63, q.get(j + 4)? & 63))
    } else {
        let d = (q.get(j + 4)? & 0x0f) | ((q.get(j - 4)? >> 6) << 4);
        let m = (q.get(j + 4)? >> 4) | ((q.get(j)? >> 6) << 4);
        Some((d, m))
    }
}

/// block_q4_K { f16 d; f16 dmin; u8 scales[12]; u8 qs[128] }, 256 elements: 4 chunks of 64; chunk `c` uses
/// the 32 bytes `qs[32c..32c+32]`, low nibbles for its first 32 elements (sub-block 2c), high nibbles for the
/// next 32 (sub-block 2c+1); x = (d * sc) * q - (dmin * m).
fn q4_k(blk: &[u8], i: usize) -> Option<f32> {
    let d = f16_at(blk, 0)?;
    let dmin = f16_at(blk, 2)?;
    let scales = blk.get(4..16)?;
    let qs = blk.get(16..144)?;
    let (chunk, within) = (i / 64, i % 64);
    let sub = 2 * chunk + within / 32;
    let byte = *qs.get(32 * chunk + within % 32)?;
    let q = if within < 32 { byte & 0x0f } else { byte >> 4 };
    let (sc, m) = scale_min_k4(sub, scales)?;
    let d1 = d * f32::from(sc);
    let m1 = dmin * f32::from(m);
    Some(d1 * f32::from(q) - m1)
}

/// block_q6_K { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d }, 256 elements in two halves of 128; in half `h`,
/// element `32k + l` (k = 0..4, l = 0..32) takes its low 4 bits from `ql[64h + l + 32(k&1)]` (low nibble for
/// k < 2, high for k >= 2) and its high 2 bits from `qh[32h + l] >> 2k`; x = (d * scales[8h + l/16 + 2k]) * (q - 32).
fn q6_k(blk: &[u8], i: usize) -> Option<f32> {
    let ql = blk.get(0..128)?;
    let qh = blk.get(128..192)?;
    let sc = blk.get(192..208)?;
    let d = f16_at(blk, 208)?;
    let (h, r) = (i / 128, i % 128);
    let (k, l) = (r / 32, r % 32);
    let low_byte = *ql.get(64 * h + l + 32 * (k & 1))?;
    let low = if k < 2 {
        low_byte & 0x0f
    } else {
        low_byte >> 4
    };
    let high = (qh.get(32 * h + l)? >> (2 * k)) & 3;
    let q = i32::from(low | (high << 4)) - 32;
    let s = *sc.get(8 * h + l / 16 + 2 * k)? as i8;
    Some(d * f32::from(s) * q as f32)
}
