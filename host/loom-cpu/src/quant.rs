//! GGUF block dequantisation (bit for bit ggml's `dequantize_row_*`, the same f32 operations in the same
//! order as `loom_reference`), used by quantised `tile.load`s through [`crate::rt::loom_dequant`].

use loom_ir::kernel::DType;

fn f16_at(b: &[u8], at: usize) -> f32 {
    crate::rt::f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

fn nibble(blk: &[u8], at: usize, i: usize) -> u8 {
    let byte = blk[at + i % 16];
    if i < 16 { byte & 0x0f } else { byte >> 4 }
}

fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        let d = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
        let m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
        (d, m)
    }
}

/// Element `i` of one block (`blk` is exactly one block of `dtype`; `i` < elements per block).
pub(crate) fn dequant_in_block(dtype: DType, blk: &[u8], i: usize) -> f32 {
    match dtype {
        DType::Q8_0 => f32::from(blk[2 + i] as i8) * f16_at(blk, 0),
        DType::Q4_0 => (nibble(blk, 2, i) as f32 - 8.0) * f16_at(blk, 0),
        DType::Q4_1 => nibble(blk, 4, i) as f32 * f16_at(blk, 0) + f16_at(blk, 2),
        DType::Q4K => {
            let (d, dmin) = (f16_at(blk, 0), f16_at(blk, 2));
            let (scales, qs) = (&blk[4..16], &blk[16..144]);
            let (chunk, within) = (i / 64, i % 64);
            let sub = 2 * chunk + within / 32;
            let byte = qs[32 * chunk + within % 32];
            let q = if within < 32 { byte & 0x0f } else { byte >> 4 };
            let (sc, m) = scale_min_k4(sub, scales);
            d * f32::from(sc) * f32::from(q) - dmin * f32::from(m)
        }
        DType::Q6K => {
            let (ql, qh, sc) = (&blk[0..128], &blk[128..192], &blk[192..208]);
            let d = f16_at(blk, 208);
            let (h, r) = (i / 128, i % 128);
            let (k, l) = (r / 32, r % 32);
            let low_byte = ql[64 * h + l + 32 * (k & 1)];
            let low = if k < 2 {
                low_byte & 0x0f
            } else {
                low_byte >> 4
            };
            let high = (qh[32 * h + l] >> (2 * k)) & 3;
            let q = i32::from(low | (high << 4)) - 32;
            let s = sc[8 * h + l / 16 + 2 * k] as i8;
            d * f32::from(s) * q as f32
        }
        _ => f32::NAN,
    }
}
