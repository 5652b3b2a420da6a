//! Quantised matrix-vector microkernels: `y[n] = sum_k W[n, k] * x[k]` with a GGUF weight `W: [N, K]`
//! (Q8_0, Q4_0 or Q4_1 blocks of 32 along K) and an f32 activation `x: [K]`.
//!
//! As ggml does, the activation row is quantised **once per call** to Q8 blocks (per block of 32: scale
//! `dx = amax / 127`, `qx = round(x / dx)` in `[-127, 127]`, ties to even; `dx` is kept in f32, not
//! rounded to f16 as ggml's `block_q8_0` does, and the block sum `sx = sum qx` is kept for the offset terms).
//! Each block then contributes an **exact integer** dot product `isum = sum qw * qx` scaled in f32:
//!
//! * Q8_0: `dw * dx * isum`;
//! * Q4_0: `dw * dx * sum (qw - 8) * qx`;
//! * Q4_1: `dw * dx * isum + mw * (dx * sx)` (`mw` the block minimum).
//!
//! # Error bound (what the tests check)
//!
//! Quantising `x` moves each element by at most `dx / 2`, so against the exact dot product of the dequantised
//! weights with `x` the result differs by at most
//! `sum_blocks (dx_b / 2) * sum_{k in b} |w_k|  +  f32 rounding`, where the f32 rounding (per-block products
//! and an f32 sum over `K / 32` block terms) is bounded by `K/32 * 2^-22 * sum_k |w_k * x_k|`-ish; the tests
//! use `1e-5 * sum_k |w_k| * |x_k| + 1e-5 * sum_k |w_k| * dx_b` on top of the quantisation term. The SIMD
//! variants compute the same integers as the scalar one and differ only in the f32 summation order.
//!
//! # Variants (chosen at run time)
//!
//! * AVX-512 VNNI (`avx512f`, `avx512bw`, `avx512vnni`): two blocks per `vpdpbusd` (u8 x i8 -> i32). Signed
//!   weights use `|w|` as the unsigned operand and `x` negated where `w < 0` as the signed one (`qx` is never
//!   -128, so the negation is exact); Q4_1's nibbles are already unsigned. Q8_0 and Q4_0 fetch the scales of
//!   16 blocks with one gather and one `vcvtph2ps` (`signed_groups`). Q4_1 takes 16 blocks at a time, one
//!   block per 32-bit lane (`q4_1_group`: the 20-byte blocks are deinterleaved with permutes, the
//!   activation is regrouped once per call, and the scales and the offset term become vector operations),
//!   the remaining blocks three at a time in their own byte order (`q4_1_chunk`: one masked load, the
//!   activation laid out to match once per call), and eight rows per call (`q4_1_rows`: each activation
//!   vector loaded once for the eight rows, their horizontal sums taken together).
//! * AVX2 + FMA (+ F16C for the scales, as the AVX-512 variant): one block per `vpmaddubsw` + `vpmaddwd` with the same sign trick (`vpsignb`); the i16 pair
//!   sums stay below 2 * 128 * 127 < 2^15, so `vpmaddubsw` never saturates. Q4_1 four rows per call
//!   (`q4_1_rows_avx2`: each activation vector loaded once for the four rows, four independent
//!   accumulators; one row at a time was bound by its chain of multiply-adds, 22-34 % of the read floor).
//! * Scalar: the definition above, one block at a time.

use loom_ir::kernel::DType;

pub(crate) const QK: usize = 32;

/// The activation row quantised to Q8 blocks.
#[derive(Debug, Clone)]
pub(crate) struct QActs {
    /// `K` quantised values, blocks of 32 contiguous.
    pub(crate) qs: Vec<i8>,
    /// Per block: `dx`.
    pub(crate) d: Vec<f32>,
    /// Per block: `dx * sum qx` (the Q4_1 offset term's activation factor).
    pub(crate) ds: Vec<f32>,
    /// `qs` regrouped for the 16-block AVX-512 Q4_1 kernel: per group of 16 whole blocks, 8 vectors of 16
    /// dwords, vector `g` lane `j` holding bytes `4g..4g + 4` of block `16 G + j` (the tail blocks past the
    /// last whole group are not included).
    pub(crate) xt: Vec<i32>,
    /// The blocks past the last whole group, three at a time in the weights' own byte order, for the
    /// AVX-512 Q4_1 kernel (`q4_1_chunk`): see [`RawChunk`].
    pub(crate) chunks: Vec<RawChunk>,
}

/// Up to three Q4_1 blocks (15 dwords of weights, read as one masked vector) seen from the dword lanes of
/// that vector: block `j` of the chunk is dwords `5 j` (its `d, m` header) and `5 j + 1 + g` (nibble bytes
/// `4 g .. 4 g + 4`, weights `4 g ..` low and `16 + 4 g ..` high).
#[derive(Debug, Clone)]
pub(crate) struct RawChunk {
    /// Activation bytes meeting each lane's low nibbles (`qx[4 g .. 4 g + 4]`) and high nibbles
    /// (`qx[16 + 4 g ..]`); 0 in header lanes and past the chunk.
    pub(crate) xl: [i32; 16],
    pub(crate) xh: [i32; 16],
    /// `dx` of the lane's block in nibble lanes, 0 elsewhere.
    pub(crate) dx: [f32; 16],
    /// `dx * sum qx` of the block in header lanes, 0 elsewhere.
    pub(crate) ds: [f32; 16],
    /// The header lanes (`5 j`) and all the chunk's lanes (`0 .. 5 * blocks`).
    pub(crate) heads: u16,
    pub(crate) lanes: u16,
}

/// Blocks per [`RawChunk`].
pub(crate) const CHUNK: usize = 3;

/// Blocks per group of the AVX-512 Q4_1 kernel (one block per 32-bit lane).
pub(crate) const GROUP: usize = 16;

/// Quantises `x` (length a multiple of 32) to Q8 blocks with the scalar loop (the tests' reference;
/// `matvec` calls [`quantize_acts_isa`]).
#[cfg(test)]
pub(crate) fn quantize_acts(x: &[f32]) -> QActs {
    quantize_acts_isa(Isa::Scalar, x)
}

/// One block of 32: `qx` into `q`, returns `(dx, dx * sum qx)`.
pub(crate) fn quantize_block(xb: &[f32], q: &mut [i8]) -> (f32, f32) {
    let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
    let dx = amax / 127.0;
    let id = if dx != 0.0 { 1.0 / dx } else { 0.0 };
    let mut s = 0i32;
    for (q, &v) in q.iter_mut().zip(xb) {
        // Round half to even by the 1.5 * 2^23 trick (exact for |v * id| <= 127; `f32::round` is a libm
        // call on baseline x86-64).
        const MAGIC: f32 = 12_582_912.0;
        let r = ((v * id + MAGIC) - MAGIC).clamp(-127.0, 127.0) as i8;
        *q = r;
        s += i32::from(r);
    }
    (dx, dx * s as f32)
}

/// [`quantize_acts`] with the block loop of `isa` (AVX-512: `x86::quantize_blocks`, the same result bit
/// for bit; otherwise [`quantize_block`]).
pub(crate) fn quantize_acts_isa(isa: Isa, x: &[f32]) -> QActs {
    let nb = x.len() / QK;
    let mut qs = vec![0i8; nb * QK];
    let mut d = vec![0f32; nb];
    let mut ds = vec![0f32; nb];
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx512Vnni` is only produced after detecting avx512f and avx512bw (among others);
        // the slices hold `nb` blocks.
        Isa::Avx512Vnni => unsafe { x86::quantize_blocks(&x[..nb * QK], &mut qs, &mut d, &mut ds) },
        _ => {
            for b in 0..nb {
                (d[b], ds[b]) =
                    quantize_block(&x[b * QK..(b + 1) * QK], &mut qs[b * QK..(b + 1) * QK]);
            }
        }
    }
    let groups = nb / GROUP;
    let mut xt = vec![0i32; groups * 8 * GROUP];
    for gr in 0..groups {
        for g in 0..8 {
            for j in 0..GROUP {
                let o = (gr * GROUP + j) * QK + 4 * g;
                let q = &qs[o..o + 4];
                xt[(gr * 8 + g) * GROUP + j] =
                    i32::from_le_bytes([q[0] as u8, q[1] as u8, q[2] as u8, q[3] as u8]);
            }
        }
    }
    let mut chunks = Vec::new();
    let mut b0 = groups * GROUP;
    while b0 < nb {
        let cnt = (nb - b0).min(CHUNK);
        let mut c = RawChunk {
            xl: [0; 16],
            xh: [0; 16],
            dx: [0.0; 16],
            ds: [0.0; 16],
            heads: 0,
            lanes: ((1u32 << (5 * cnt)) - 1) as u16,
        };
        for j in 0..cnt {
            let b = b0 + j;
            c.heads |= 1 << (5 * j);
            c.ds[5 * j] = ds[b];
            for g in 0..4 {
                let l = 5 * j + 1 + g;
                let o = b * QK + 4 * g;
                let word =
                    |q: &[i8]| i32::from_le_bytes([q[0] as u8, q[1] as u8, q[2] as u8, q[3] as u8]);
                c.xl[l] = word(&qs[o..o + 4]);
                c.xh[l] = word(&qs[o + 16..o + 20]);
                c.dx[l] = d[b];
            }
        }
        chunks.push(c);
        b0 += cnt;
    }
    QActs {
        qs,
        d,
        ds,
        xt,
        chunks,
    }
}

/// f16 bits to f32: a bit shuffle for normal numbers, the exact general conversion otherwise.
#[inline(always)]
fn f16(lo: u8, hi: u8) -> f32 {
    let h = u16::from_le_bytes([lo, hi]);
    let e = (h >> 10) & 0x1f;
    if e != 0 && e != 31 {
        let bits = (u32::from(h & 0x8000) << 16)
            | ((u32::from(e) + 112) << 23)
            | (u32::from(h & 0x3ff) << 13);
        f32::from_bits(bits)
    } else {
        crate::rt::f16_to_f32(h)
    }
}

/// The quantised weight types these kernels handle.
pub(crate) fn supported(dtype: DType) -> bool {
    matches!(dtype, DType::Q8_0 | DType::Q4_0 | DType::Q4_1)
}

fn block_bytes(dtype: DType) -> usize {
    match dtype {
        DType::Q8_0 => 34,
        DType::Q4_0 => 18,
        _ => 20,
    }
}

/// Which implementation runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Isa {
    Scalar,
    Avx2,
    Avx512Vnni,
}

impl Isa {
    /// The best variant this CPU supports.
    pub(crate) fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vnni")
                && is_x86_feature_detected!("f16c")
            {
                return Isa::Avx512Vnni;
            }
            if is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
            {
                return Isa::Avx2;
            }
        }
        Isa::Scalar
    }

    /// Every variant this CPU can run (for the tests).
    #[cfg(test)]
    pub(crate) fn available() -> Vec<Isa> {
        let best = Isa::detect();
        let mut v = vec![Isa::Scalar];
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
        {
            v.push(Isa::Avx2);
        }
        if best == Isa::Avx512Vnni {
            v.push(Isa::Avx512Vnni);
        }
        v
    }
}

/// One row: `sum_k W[row, k] * x[k]` for the `nb` blocks of `w` (exactly `nb` blocks of `dtype`).
pub(crate) fn dot_row(isa: Isa, dtype: DType, w: &[u8], a: &QActs) -> f32 {
    let nb = a.d.len();
    assert!(w.len() == nb * block_bytes(dtype) && a.qs.len() == nb * QK && supported(dtype));
    match isa {
        Isa::Scalar => dot_scalar(dtype, w, a),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` is only produced after detecting avx2, fma and f16c; the lengths were checked above.
        Isa::Avx2 => unsafe { x86::dot_avx2(dtype, w, a) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx512Vnni` is only produced after detecting avx512f, avx512bw, avx512vnni and f16c; the
        // lengths were checked above.
        Isa::Avx512Vnni => unsafe { x86::dot_avx512vnni(dtype, w, a) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => dot_scalar(dtype, w, a),
    }
}

fn dot_scalar(dtype: DType, w: &[u8], a: &QActs) -> f32 {
    dot_scalar_from(dtype, w, a, 0)
}

/// [`dot_scalar`] over blocks `b0..` of the row only.
fn dot_scalar_from(dtype: DType, w: &[u8], a: &QActs, b0: usize) -> f32 {
    let bs = block_bytes(dtype);
    let mut acc = 0f32;
    for (b, blk) in w.chunks_exact(bs).enumerate().skip(b0) {
        let qx = &a.qs[b * QK..(b + 1) * QK];
        let dw = f16(blk[0], blk[1]);
        match dtype {
            DType::Q8_0 => {
                let isum: i32 = blk[2..]
                    .iter()
                    .zip(qx)
                    .map(|(&q, &x)| i32::from(q as i8) * i32::from(x))
                    .sum();
                acc += dw * a.d[b] * isum as f32;
            }
            DType::Q4_0 => {
                let isum: i32 = (0..QK)
                    .map(|j| {
                        let byte = blk[2 + j % 16];
                        let q = if j < 16 { byte & 15 } else { byte >> 4 };
                        (i32::from(q) - 8) * i32::from(qx[j])
                    })
                    .sum();
                acc += dw * a.d[b] * isum as f32;
            }
            _ => {
                let mw = f16(blk[2], blk[3]);
                let isum: i32 = (0..QK)
                    .map(|j| {
                        let byte = blk[4 + j % 16];
                        let q = if j < 16 { byte & 15 } else { byte >> 4 };
                        i32::from(q) * i32::from(qx[j])
                    })
                    .sum();
                acc += dw * a.d[b] * isum as f32 + mw * a.ds[b];
            }
        }
    }
    acc
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{CHUNK, GROUP, QActs, QK, RawChunk, block_bytes};
    use loom_ir::kernel::DType;
    use std::arch::x86_64::*;

    /// [`super::quantize_acts`]' per-block loop on AVX-512 (the same f32 operations, so the same `qs`, `d`
    /// and `ds` bit for bit): per block of 32, `amax` by `vmaxps` of `|x|` and one reduction, `q =
    /// clamp((x * id + 1.5 * 2^23) - 1.5 * 2^23)` unfused, packed by `vpmovdb`, and the integer block sum.
    ///
    /// # Safety
    /// avx512f and avx512bw must be available; `qs` holds `x.len()` bytes and `d`, `ds` `x.len() / 32`
    /// values.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn quantize_blocks(x: &[f32], qs: &mut [i8], d: &mut [f32], ds: &mut [f32]) {
        let nb = x.len() / QK;
        assert!(qs.len() >= nb * QK && d.len() >= nb && ds.len() >= nb);
        const MAGIC: f32 = 12_582_912.0;
        let magic = _mm512_set1_ps(MAGIC);
        let (lo, hi) = (_mm512_set1_ps(-127.0), _mm512_set1_ps(127.0));
        for b in 0..nb {
            // SAFETY: block `b` is 32 f32 of `x` and 32 bytes of `qs` (asserted above).
            unsafe {
                let xp = x.as_ptr().add(b * QK);
                let v = [_mm512_loadu_ps(xp), _mm512_loadu_ps(xp.add(16))];
                let amax =
                    _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v[0]), _mm512_abs_ps(v[1])));
                let dx = amax / 127.0;
                let id = _mm512_set1_ps(if dx != 0.0 { 1.0 / dx } else { 0.0 });
                let r = v.map(|v| _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(v, id), magic), magic));
                // NaN in `x` (or inf, where `inf * 0` is NaN): the scalar loop's `f32::max`/`clamp`
                // semantics for NaN differ from `vmaxps`; that block takes the scalar loop.
                let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(r[0], r[0])
                    | _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(r[1], r[1]);
                if nan != 0 {
                    let (xb, qb) = (&x[b * QK..(b + 1) * QK], &mut qs[b * QK..(b + 1) * QK]);
                    (d[b], ds[b]) = super::quantize_block(xb, qb);
                    continue;
                }
                let q = r.map(|r| _mm512_cvttps_epi32(_mm512_min_ps(_mm512_max_ps(r, lo), hi)));
                let qp = qs.as_mut_ptr().add(b * QK);
                _mm_storeu_si128(qp as *mut __m128i, _mm512_cvtepi32_epi8(q[0]));
                _mm_storeu_si128(qp.add(16) as *mut __m128i, _mm512_cvtepi32_epi8(q[1]));
                let s = _mm512_reduce_add_epi32(_mm512_add_epi32(q[0], q[1]));
                d[b] = dx;
                ds[b] = dx * s as f32;
            }
        }
    }

    /// The f16 with bytes `lo, hi` to f32 (F16C `vcvtph2ps`).
    #[inline]
    #[target_feature(enable = "f16c")]
    fn f16(lo: u8, hi: u8) -> f32 {
        let h = _mm_cvtsi32_si128(i32::from(u16::from_le_bytes([lo, hi])));
        _mm_cvtss_f32(_mm_cvtph_ps(h))
    }

    /// 32 weights of block `blk` as i8 (Q4_0 shifted to `q - 8`) or, for Q4_1, as unsigned nibbles.
    #[inline(always)]
    unsafe fn weights256(dtype: DType, blk: *const u8) -> __m256i {
        // SAFETY (all loads): the caller passes a pointer to a whole block of `dtype`.
        unsafe {
            match dtype {
                DType::Q8_0 => _mm256_loadu_si256(blk.add(2) as *const __m256i),
                _ => {
                    let off = if dtype == DType::Q4_0 { 2 } else { 4 };
                    let b = _mm_loadu_si128(blk.add(off) as *const __m128i);
                    let m = _mm_set1_epi8(15);
                    let lo = _mm_and_si128(b, m);
                    let hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
                    let v = _mm256_set_m128i(hi, lo);
                    if dtype == DType::Q4_0 {
                        _mm256_sub_epi8(v, _mm256_set1_epi8(8))
                    } else {
                        v
                    }
                }
            }
        }
    }

    /// # Safety
    /// avx2 and fma must be available; `w` holds `a.d.len()` blocks of `dtype` and `a.qs` 32 values per block.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_avx2(dtype: DType, w: &[u8], a: &QActs) -> f32 {
        let bs = block_bytes(dtype);
        let nb = a.d.len();
        let ones = _mm256_set1_epi16(1);
        let mut acc = _mm256_setzero_ps();
        let mut off = 0f32;
        for b in 0..nb {
            // SAFETY: block b lies inside `w`, activation block b inside `a.qs` (caller's contract).
            let (wv, xv) = unsafe {
                (
                    weights256(dtype, w.as_ptr().add(b * bs)),
                    _mm256_loadu_si256(a.qs.as_ptr().add(b * QK) as *const __m256i),
                )
            };
            let blk = &w[b * bs..];
            let dw = f16(blk[0], blk[1]);
            let p16 = if dtype == DType::Q4_1 {
                off += f16(blk[2], blk[3]) * a.ds[b];
                _mm256_maddubs_epi16(wv, xv)
            } else {
                _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv))
            };
            let p32 = _mm256_madd_epi16(p16, ones);
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p32), _mm256_set1_ps(dw * a.d[b]), acc);
        }
        let s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s) + off
    }

    /// `R` consecutive Q4_1 rows on AVX2 (`w` holds exactly `R` rows of `a.d.len()` blocks): block by block,
    /// the activation vector loaded once for the `R` rows, one `vpmaddubsw` + `vpmaddwd` a row, each row's
    /// scales from its block header by one `vcvtph2ps` (`d` and `m` together), the offset term `m * dx * sx`
    /// summed in its own lane. `R` independent accumulators: one row's chain of multiply-adds (a block a
    /// link) no longer sets the pace, and the per-row call and horizontal sum are shared.
    ///
    /// # Safety
    /// avx2, fma and f16c must be available; `a` was quantised for rows of `a.d.len()` blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q4_1_rows_avx2<const R: usize>(w: &[u8], a: &QActs) -> [f32; R] {
        const BS: usize = 20;
        let nb = a.d.len();
        let row = nb * BS;
        assert!(w.len() == R * row && a.qs.len() >= nb * QK && a.ds.len() >= nb);
        let (wp, xp) = (w.as_ptr(), a.qs.as_ptr());
        let ones = _mm256_set1_epi16(1);
        let m4 = _mm_set1_epi8(15);
        let mut acc = [_mm256_setzero_ps(); R];
        let mut off = [_mm_setzero_ps(); R];
        for b in 0..nb {
            // SAFETY: block `b` of each of the `R` rows (20 bytes at `r * row + 20 b`) lies inside `w`, its
            // 32 activation bytes inside `a.qs` and `d`, `ds` inside `a.d`, `a.ds` (asserted above).
            unsafe {
                let xv = _mm256_loadu_si256(xp.add(b * QK) as *const __m256i);
                let dx = _mm_set_ss(*a.d.get_unchecked(b));
                let ds = _mm_set_ss(*a.ds.get_unchecked(b));
                for r in 0..R {
                    let blk = wp.add(r * row + b * BS);
                    // Lanes 0 and 1: the block's `d` and `m`.
                    let dm = _mm_cvtph_ps(_mm_cvtsi32_si128((blk as *const i32).read_unaligned()));
                    let q = _mm_loadu_si128(blk.add(4) as *const __m128i);
                    let wv = _mm256_set_m128i(
                        _mm_and_si128(_mm_srli_epi16::<4>(q), m4),
                        _mm_and_si128(q, m4),
                    );
                    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(wv, xv), ones);
                    let sc = _mm256_broadcastss_ps(_mm_mul_ss(dm, dx));
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), sc, acc[r]);
                    off[r] = _mm_fmadd_ss(_mm_movehdup_ps(dm), ds, off[r]);
                }
            }
        }
        std::array::from_fn(|r| {
            let v = acc[r];
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_movehdup_ps(s));
            _mm_cvtss_f32(_mm_add_ss(s, off[r]))
        })
    }

    /// # Safety
    /// avx512f, avx512bw and avx512vnni must be available; `w` holds `a.d.len()` blocks of `dtype` and `a.qs`
    /// 32 values per block.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn dot_avx512vnni(dtype: DType, w: &[u8], a: &QActs) -> f32 {
        // SAFETY (all three): the caller's contract; for Q4_1, `a` was quantised from the row's `nb` blocks,
        // so `a.xt` holds its `nb / GROUP` whole groups. One call per constant dtype, so that each inlined
        // copy of the pair loop is specialised.
        unsafe {
            match dtype {
                DType::Q8_0 => {
                    let (acc, b) = signed_groups(DType::Q8_0, w, a);
                    pairs(DType::Q8_0, w, a, b, acc)
                }
                DType::Q4_0 => {
                    let (acc, b) = signed_groups(DType::Q4_0, w, a);
                    pairs(DType::Q4_0, w, a, b, acc)
                }
                _ => q4_1_rows::<1>(w, a)[0],
            }
        }
    }

    /// Blocks `b0..` two at a time (`vpdpbusd` over 64 bytes) added to the lanes `acc`, alternating two
    /// accumulators; the odd last block on the scalar path. The row's sum.
    ///
    /// # Safety
    /// As [`dot_avx512vnni`]; only called from functions with its target features.
    #[inline(always)]
    unsafe fn pairs(dtype: DType, w: &[u8], a: &QActs, b0: usize, acc: __m512) -> f32 {
        // SAFETY: the intrinsics need AVX-512F/BW/VNNI and F16C, which every caller enables; blocks `b`,
        // `b + 1` lie inside `w` and activation blocks `b`, `b + 1` (64 bytes) inside `a.qs` (the caller's
        // contract: `w` holds `nb` whole blocks).
        unsafe {
            let bs = block_bytes(dtype);
            let nb = a.d.len();
            let mut acc = [acc, _mm512_setzero_ps()];
            let mut off = 0f32;
            let zero = _mm512_setzero_si512();
            let mut b = b0;
            let mut t = 0;
            while b + 2 <= nb {
                let w0 = weights256(dtype, w.as_ptr().add(b * bs));
                let w1 = weights256(dtype, w.as_ptr().add((b + 1) * bs));
                let xv = _mm512_loadu_si512(a.qs.as_ptr().add(b * QK) as *const _);
                let wv = _mm512_inserti64x4(_mm512_castsi256_si512(w0), w1, 1);
                let (b0, b1) = (&w[b * bs..], &w[(b + 1) * bs..]);
                let p = if dtype == DType::Q4_1 {
                    off += f16(b0[2], b0[3]) * a.ds[b] + f16(b1[2], b1[3]) * a.ds[b + 1];
                    _mm512_dpbusd_epi32(zero, wv, xv)
                } else {
                    let neg = _mm512_movepi8_mask(wv);
                    let sx = _mm512_mask_sub_epi8(xv, neg, zero, xv);
                    _mm512_dpbusd_epi32(zero, _mm512_abs_epi8(wv), sx)
                };
                let s0 = _mm512_set1_ps(f16(b0[0], b0[1]) * a.d[b]);
                let s1 = _mm512_set1_ps(f16(b1[0], b1[1]) * a.d[b + 1]);
                let sc = _mm512_mask_blend_ps(0xff00, s0, s1);
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), sc, acc[t]);
                t ^= 1;
                b += 2;
            }
            let mut r = _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1])) + off;
            if b < nb {
                r += super::dot_scalar_from(dtype, w, a, b);
            }
            r
        }
    }

    /// Q8_0 / Q4_0 over the row's whole groups of 16 blocks, two blocks per `vpdpbusd` as in [`pairs`], but
    /// with the 16 blocks' f16 scales fetched by one gather and converted by one `vcvtph2ps`, multiplied by
    /// the 16 `dx` in one vector op, and each pair's scale vector taken from them by one permute (instead of
    /// two scalar conversions, multiplications and broadcasts per pair). Returns the lanes and the first
    /// block not covered.
    ///
    /// # Safety
    /// As [`dot_avx512vnni`]; only called from functions with its target features.
    #[inline(always)]
    unsafe fn signed_groups(dtype: DType, w: &[u8], a: &QActs) -> (__m512, usize) {
        // SAFETY: the callers enable the intrinsics' features; group `gr` covers blocks `16 gr..16 gr + 16`,
        // inside `w` and `a` (the caller's contract), and each gathered dword (`bs * j .. bs * j + 4` of the
        // group, `bs >= 18`) lies inside the group's bytes.
        unsafe {
            let bs = block_bytes(dtype);
            let groups = a.d.len() / GROUP;
            let offs = _mm512_mullo_epi32(
                _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                _mm512_set1_epi32(bs as i32),
            );
            let lo8 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
            let zero = _mm512_setzero_si512();
            let mut acc = [_mm512_setzero_ps(); 2];
            for gr in 0..groups {
                let base = w.as_ptr().add(gr * GROUP * bs);
                let hdr = _mm512_i32gather_epi32::<1>(offs, base as *const _);
                let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(hdr));
                let sc16 = _mm512_mul_ps(d, _mm512_loadu_ps(a.d.as_ptr().add(gr * GROUP)));
                for p in 0..GROUP / 2 {
                    let b = gr * GROUP + 2 * p;
                    let w0 = weights256(dtype, w.as_ptr().add(b * bs));
                    let w1 = weights256(dtype, w.as_ptr().add((b + 1) * bs));
                    let xv = _mm512_loadu_si512(a.qs.as_ptr().add(b * QK) as *const _);
                    let wv = _mm512_inserti64x4(_mm512_castsi256_si512(w0), w1, 1);
                    let neg = _mm512_movepi8_mask(wv);
                    let sx = _mm512_mask_sub_epi8(xv, neg, zero, xv);
                    let ip = _mm512_dpbusd_epi32(zero, _mm512_abs_epi8(wv), sx);
                    let idx = _mm512_add_epi32(lo8, _mm512_set1_epi32(2 * p as i32));
                    let sc = _mm512_permutexvar_ps(idx, sc16);
                    acc[p & 1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ip), sc, acc[p & 1]);
                }
            }
            (_mm512_add_ps(acc[0], acc[1]), groups * GROUP)
        }
    }

    /// Dword `5 j + k` of 80 (five vectors) for lanes `j = 0..16`: word `k` of each of 16 consecutive 20-byte
    /// Q4_1 blocks (`k = 0` the two f16 `d, m`, `k = 1..5` the 16 nibble bytes).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn deinterleave5(r: &[__m512i; 5], k: usize) -> __m512i {
        let idx = |lo: usize, hi: usize, base: usize| -> __m512i {
            let mut v = [0i32; 16];
            for (j, x) in v.iter_mut().enumerate() {
                let i = 5 * j + k;
                if (lo..hi).contains(&i) {
                    *x = (i - base) as i32;
                }
            }
            // SAFETY: `v` holds 16 i32.
            unsafe { _mm512_loadu_si512(v.as_ptr() as *const _) }
        };
        let mask = |lo: usize, hi: usize| -> __mmask16 {
            (0..16)
                .filter(|j| (lo..hi).contains(&(5 * j + k)))
                .fold(0, |m, j| m | (1 << j))
        };
        let t = _mm512_permutex2var_epi32(r[0], idx(0, 32, 0), r[1]);
        let u = _mm512_permutex2var_epi32(r[2], idx(32, 64, 32), r[3]);
        let v = _mm512_permutexvar_epi32(idx(64, 80, 64), r[4]);
        let o = _mm512_mask_mov_epi32(t, mask(32, 64), u);
        _mm512_mask_mov_epi32(o, mask(64, 80), v)
    }

    /// One group of 16 Q4_1 blocks at `base` (320 bytes), one block per 32-bit lane: the 16 blocks' words are
    /// deinterleaved (five loads, permutes), nibble word `g` of every block meets activation word `g`
    /// (`xt`, the group's 8 vectors of `a.xt`, regrouped once per call) in one `vpdpbusd`, so the 16 exact
    /// block sums land in one vector and the scales `d`, `m` of all 16 blocks convert with one `vcvtph2ps`
    /// each; `acc += (d * dx) * isum` and `off += m * (dx * sx)` as whole vectors.
    ///
    /// # Safety
    /// `base` points to 320 readable bytes; only called from functions with [`q4_1_rows`]' target features.
    #[inline(always)]
    unsafe fn q4_1_group(
        base: *const u8,
        xt: &[__m512i; 8],
        (dx, ds): (__m512, __m512),
        acc: &mut __m512,
        off: &mut __m512,
    ) {
        // SAFETY: the caller's contract (the intrinsics' features and the 320 bytes at `base`).
        unsafe {
            let m4 = _mm512_set1_epi8(15);
            let r = [0, 1, 2, 3, 4].map(|i| _mm512_loadu_si512(base.add(64 * i) as *const _));
            let h = deinterleave5(&r, 0);
            let (mut s0, mut s1) = (_mm512_setzero_si512(), _mm512_setzero_si512());
            for g in 0..4 {
                let q = deinterleave5(&r, g + 1);
                // Byte i of a block's nibbles holds weight i (low) and weight i + 16 (high).
                let lo = _mm512_and_si512(q, m4);
                let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(q), m4);
                s0 = _mm512_dpbusd_epi32(s0, lo, xt[g]);
                s1 = _mm512_dpbusd_epi32(s1, hi, xt[g + 4]);
            }
            let isum = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
            let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h));
            let m = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(h)));
            *acc = _mm512_fmadd_ps(_mm512_mul_ps(d, dx), isum, *acc);
            *off = _mm512_fmadd_ps(m, ds, *off);
        }
    }

    /// Up to three Q4_1 blocks at `p` (a [`RawChunk`] of `a.chunks`, read by one masked 15-dword load)
    /// with the weights left in their own byte order: the nibbles meet the activation bytes laid out to
    /// match (`xl`, `xh`; 0 under the headers) in two `vpdpbusd`, each header's `d` converts in place
    /// (`vcvtph2ps` of every lane's low half) and is broadcast to its block's lanes by one permute, so
    /// `acc += (d * dx) * isum` per lane (four partial sums per block) and `off += m * (dx * sx)` in the
    /// header lanes only (masked). This replaced the pair loop, with its scalar f16 conversions, as Q4_1's
    /// tail: a K = 576 row (one group and two blocks) spent about as long on the two blocks as on the group.
    ///
    /// # Safety
    /// `p` points to the chunk's blocks (`ch.lanes` dwords readable); only called from functions with
    /// [`q4_1_rows`]' target features.
    #[inline(always)]
    unsafe fn q4_1_chunk(
        p: *const u8,
        ch: &RawChunk,
        (xl, xh, dx, ds): (__m512i, __m512i, __m512, __m512),
        acc: &mut __m512,
        off: &mut __m512,
    ) {
        // SAFETY: the caller's contract; the masked load reads only the lanes `ch.lanes`.
        unsafe {
            let m4 = _mm512_set1_epi8(15);
            let idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 5, 5, 5, 5, 5, 10, 10, 10, 10, 10, 15);
            let v = _mm512_maskz_loadu_epi32(ch.lanes, p as *const i32);
            let lo = _mm512_and_si512(v, m4);
            let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4);
            let z = _mm512_setzero_si512();
            let isum = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, lo, xl), hi, xh);
            let d = _mm512_permutexvar_ps(idx, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v)));
            *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(d, dx), *acc);
            let m = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(v)));
            *off = _mm512_mask3_fmadd_ps(m, ds, *off, ch.heads);
        }
    }

    /// The sums of the 4 vectors' lanes, in lane order of the result.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn reduce4(v: [__m512; 4]) -> __m128 {
        let t = v.map(|x| {
            _mm256_add_ps(
                _mm512_castps512_ps256(x),
                _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(x))),
            )
        });
        let u = _mm256_hadd_ps(_mm256_hadd_ps(t[0], t[1]), _mm256_hadd_ps(t[2], t[3]));
        _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps::<1>(u))
    }

    /// `R` consecutive Q4_1 rows (`w` holds exactly `R` rows of `a.d.len()` blocks): the whole groups of 16
    /// blocks ([`q4_1_group`]), then the remaining blocks three at a time ([`q4_1_chunk`]), each activation
    /// vector loaded once for the `R` rows, and the `R` horizontal sums taken together ([`reduce4`] for
    /// `R = 4`).
    ///
    /// # Safety
    /// avx512f, avx512bw, avx512vnni, avx2, fma and f16c must be available; `a` was quantised for rows of
    /// `a.d.len()` blocks.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn q4_1_rows<const R: usize>(w: &[u8], a: &QActs) -> [f32; R] {
        const BS: usize = 20;
        let nb = a.d.len();
        let row = nb * BS;
        let groups = nb / GROUP;
        assert!(w.len() == R * row && a.xt.len() >= groups * 8 * GROUP);
        assert!(a.d.len() >= groups * GROUP && a.ds.len() >= groups * GROUP);
        let wp = w.as_ptr();
        let mut acc = [_mm512_setzero_ps(); R];
        let mut off = [_mm512_setzero_ps(); R];
        for gr in 0..groups {
            // SAFETY: the group's 8 activation vectors and 16 `d`, `ds` values are inside `a.xt`, `a.d`,
            // `a.ds` (asserted above); group `gr` of row `r` is 320 bytes inside `w` (`w` holds `R` rows
            // of `nb >= 16 (gr + 1)` blocks); the features are this function's.
            unsafe {
                let xp = a.xt.as_ptr().add(gr * 8 * GROUP);
                let xt = [0, 1, 2, 3, 4, 5, 6, 7]
                    .map(|g| _mm512_loadu_si512(xp.add(g * GROUP) as *const _));
                let dx = _mm512_loadu_ps(a.d.as_ptr().add(gr * GROUP));
                let ds = _mm512_loadu_ps(a.ds.as_ptr().add(gr * GROUP));
                for r in 0..R {
                    let base = wp.add(r * row + gr * GROUP * BS);
                    q4_1_group(base, &xt, (dx, ds), &mut acc[r], &mut off[r]);
                }
            }
        }
        let b0 = groups * GROUP;
        for (c, ch) in a.chunks.iter().enumerate() {
            // SAFETY: chunk `c` covers blocks `b0 + 3 c ..` of each row, at most `nb` (quantize_acts made
            // the chunks for `nb` blocks): its masked lanes read only those blocks' 20-byte records. The
            // arrays hold 16 lanes.
            unsafe {
                let regs = (
                    _mm512_loadu_si512(ch.xl.as_ptr() as *const _),
                    _mm512_loadu_si512(ch.xh.as_ptr() as *const _),
                    _mm512_loadu_ps(ch.dx.as_ptr()),
                    _mm512_loadu_ps(ch.ds.as_ptr()),
                );
                for r in 0..R {
                    let p = wp.add(r * row + (b0 + CHUNK * c) * BS);
                    q4_1_chunk(p, ch, regs, &mut acc[r], &mut off[r]);
                }
            }
        }
        let sums: [__m512; R] = std::array::from_fn(|r| _mm512_add_ps(acc[r], off[r]));
        let mut out = [0f32; R];
        if R.is_multiple_of(4) {
            for (o, v) in out.chunks_exact_mut(4).zip(sums.chunks_exact(4)) {
                // SAFETY: `o` holds 4 f32.
                unsafe { _mm_storeu_ps(o.as_mut_ptr(), reduce4([v[0], v[1], v[2], v[3]])) };
            }
        } else {
            for (o, v) in out.iter_mut().zip(sums) {
                *o = _mm512_reduce_add_ps(v);
            }
        }
        out
    }
}

/// Q4_1 rows per call of the AVX-512 kernel in [`matvec`]: on the Zen 4 VM, 1536 x 576 took 24.1-24.5 us
/// at 8 (16: 24.6-25.5, 4: 25.3-39 bimodal, 1: 28.6-29.8; standalone, best of 2000, six runs each).
const Q4_1_ROWS: usize = 8;

/// Q4_1 rows per call of the AVX2 kernel in [`matvec`] (four accumulator chains; `LOOM_BENCH=qmatvec`).
const Q4_1_ROWS_AVX2: usize = 4;

/// The whole batches of `B` rows of `y` (little-endian f32, output rows `r0..` of `w`, `row` bytes a weight
/// row) by `kernel`, which takes `B` consecutive weight rows; returns the rows done.
#[cfg(target_arch = "x86_64")]
fn row_batches<const B: usize>(
    y: &mut [u8],
    r0: usize,
    w: &[u8],
    row: usize,
    kernel: impl Fn(&[u8]) -> [f32; B],
) -> usize {
    let mut done = 0;
    for (i, out) in y.chunks_exact_mut(4 * B).enumerate() {
        let r = r0 + B * i;
        for (o, v) in out
            .chunks_exact_mut(4)
            .zip(kernel(&w[r * row..(r + B) * row]))
        {
            o.copy_from_slice(&v.to_le_bytes());
        }
        done += B;
    }
    done
}

/// `y = W x` over `threads` workers (contiguous row blocks): `w` is `n` rows of `k / 32` blocks of `dtype`,
/// `x` holds `k` little-endian f32 and `y` receives `n` little-endian f32.
pub(crate) fn matvec(
    isa: Isa,
    dtype: DType,
    n: usize,
    k: usize,
    w: &[u8],
    x: &[u8],
    y: &mut [u8],
    threads: usize,
) {
    let row = k / QK * block_bytes(dtype);
    assert!(k.is_multiple_of(QK) && w.len() == n * row && x.len() == 4 * k && y.len() == 4 * n);
    let xf: Vec<f32> = x
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let a = quantize_acts_isa(isa, &xf);
    // At least 128 K weights (~4 us) per thread: the pool's round trip is ~0.5 us with the worker spinning
    // and ~10-13 us when it has parked (`LOOM_BENCH=pool`); was 256 K for a thread spawn per call.
    let threads = threads.clamp(1, n.max(1)).min(((n * k) >> 17).max(1));
    let rows = |y: &mut [u8], r0: usize| {
        // Q4_1 several rows a call (activation loads and horizontal sums shared): eight with AVX-512 VNNI, four
        // with AVX2; the rest one by one below.
        #[cfg(target_arch = "x86_64")]
        let done = match (isa, dtype) {
            // SAFETY (both): `Isa::Avx512Vnni` and `Isa::Avx2` are only produced after detecting their kernels'
            // features; `row_batches` hands each call exactly its batch of whole rows of `w`, and `a` was
            // quantised for `k`.
            (Isa::Avx512Vnni, DType::Q4_1) => row_batches(y, r0, w, row, |wr| unsafe {
                x86::q4_1_rows::<Q4_1_ROWS>(wr, &a)
            }),
            (Isa::Avx2, DType::Q4_1) => row_batches(y, r0, w, row, |wr| unsafe {
                x86::q4_1_rows_avx2::<Q4_1_ROWS_AVX2>(wr, &a)
            }),
            _ => 0,
        };
        #[cfg(not(target_arch = "x86_64"))]
        let done = 0;
        for (i, out) in y.chunks_exact_mut(4).enumerate().skip(done) {
            let r = r0 + i;
            out.copy_from_slice(&dot_row(isa, dtype, &w[r * row..(r + 1) * row], &a).to_le_bytes());
        }
    };
    if threads <= 1 {
        rows(y, 0);
        return;
    }
    let per = n.div_ceil(threads);
    let chunks: Vec<std::sync::Mutex<&mut [u8]>> =
        y.chunks_mut(4 * per).map(std::sync::Mutex::new).collect();
    crate::pool::run(chunks.len(), chunks.len() - 1, &|t| {
        let mut chunk = chunks[t].lock().unwrap_or_else(|e| e.into_inner());
        rows(&mut chunk, t * per);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn unit(&mut self) -> f32 {
            (self.next() >> 40) as f32 / (1u64 << 24) as f32
        }
    }

    fn half(x: f32) -> [u8; 2] {
        // Scales in 0.01..1 are normal f16: round-to-nearest by truncating the f32 mantissa plus rounding bit.
        let b = x.to_bits();
        let e = ((b >> 23) & 0xff) as i32 - 127 + 15;
        let m = (b & 0x7f_ffff) + 0x1000;
        let (e, m) = if m >> 23 != 0 {
            (e + 1, 0)
        } else {
            (e, m >> 13)
        };
        (((e as u32) << 10 | m) as u16).to_le_bytes()
    }

    fn random_row(rng: &mut Rng, dtype: DType, nb: usize) -> Vec<u8> {
        let bs = block_bytes(dtype);
        let mut w: Vec<u8> = (0..nb * bs).map(|_| rng.next() as u8).collect();
        for blk in w.chunks_mut(bs) {
            blk[0..2].copy_from_slice(&half(0.01 + rng.unit()));
            if dtype == DType::Q4_1 {
                blk[2..4].copy_from_slice(&half(-0.5 * (0.01 + rng.unit())));
            }
        }
        w
    }

    /// The reference's view: dequantise (bit for bit ggml) then an f64 dot; plus the error bound.
    fn reference(dtype: DType, w: &[u8], x: &[f32], a: &QActs) -> (f64, f64) {
        let bs = block_bytes(dtype);
        let (mut dot, mut quant, mut mag) = (0f64, 0f64, 0f64);
        for (b, blk) in w.chunks_exact(bs).enumerate() {
            for j in 0..QK {
                let wv = f64::from(crate::quant::dequant_in_block(dtype, blk, j));
                let xv = f64::from(x[b * QK + j]);
                dot += wv * xv;
                quant += wv.abs() * f64::from(a.d[b]) / 2.0;
                mag += (wv * xv).abs() + wv.abs() * f64::from(a.d[b]);
            }
        }
        (dot, quant + 1e-5 * mag)
    }

    #[test]
    fn variants_match_scalar_and_reference_within_the_bound() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for dtype in [DType::Q8_0, DType::Q4_0, DType::Q4_1] {
            for nb in [1usize, 2, 3, 4, 7, 16, 17, 18, 20, 31, 33, 48] {
                for _ in 0..20 {
                    let w = random_row(&mut rng, dtype, nb);
                    let x: Vec<f32> = (0..nb * QK).map(|_| 4.0 * rng.unit() - 2.0).collect();
                    let a = quantize_acts(&x);
                    let (want, bound) = reference(dtype, &w, &x, &a);
                    let scalar = dot_row(Isa::Scalar, dtype, &w, &a);
                    assert!(
                        (f64::from(scalar) - want).abs() <= bound,
                        "{dtype} nb {nb}: scalar {scalar} vs reference {want} (bound {bound})"
                    );
                    // The integers are exact in every variant; only the f32 summation order differs.
                    let mag: f32 = (0..nb).map(|b| a.d[b] * 127.0 * 32.0 * 16.0).sum();
                    for isa in Isa::available() {
                        let got = dot_row(isa, dtype, &w, &a);
                        assert!(
                            (got - scalar).abs() <= 1e-6 * mag,
                            "{dtype} nb {nb} {isa:?}: {got} vs scalar {scalar}"
                        );
                    }
                }
            }
        }
    }

    /// The AVX-512 activation quantisation gives the scalar loop's `qs`, `d`, `ds` bit for bit, also at
    /// rounding ties, zero blocks, +-127 edges, subnormals and NaN / inf.
    #[test]
    fn vector_quantisation_matches_scalar() {
        if Isa::detect() != Isa::Avx512Vnni {
            return;
        }
        let mut rng = Rng(0x1234_5678_9abc_def1);
        let mut x: Vec<f32> = (0..64 * QK).map(|_| 8.0 * rng.unit() - 4.0).collect();
        // Block 1: zeros; block 2: ties (k + 0.5 steps of dx = 1); block 3: subnormals; block 4: a NaN;
        // block 5: an inf; block 6: one huge value.
        x[QK..2 * QK].iter_mut().for_each(|v| *v = 0.0);
        for (j, v) in x[2 * QK..3 * QK].iter_mut().enumerate() {
            *v = if j == 0 {
                127.0
            } else {
                j as f32 * 3.0 + 0.5 - 60.0
            };
        }
        for (j, v) in x[3 * QK..4 * QK].iter_mut().enumerate() {
            *v = f32::from_bits(j as u32 * 1000 + 1) * if j % 2 == 0 { 1.0 } else { -1.0 };
        }
        x[4 * QK + 5] = f32::NAN;
        x[5 * QK + 7] = f32::INFINITY;
        x[6 * QK + 9] = 3.0e38;
        let (a, b) = (
            quantize_acts_isa(Isa::Scalar, &x),
            quantize_acts_isa(Isa::Avx512Vnni, &x),
        );
        assert_eq!(a.qs, b.qs);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a.d), bits(&b.d));
        assert_eq!(bits(&a.ds), bits(&b.ds));
        assert_eq!(a.xt, b.xt);
    }

    /// `matvec` over row counts around the AVX-512 Q4_1 row batch (`Q4_1_ROWS` at a time, the rest one
    /// by one), against the scalar variant row by row.
    #[test]
    fn matvec_row_batches_match_scalar() {
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        for dtype in [DType::Q4_1, DType::Q8_0] {
            for nb in [3usize, 18, 33] {
                for n in [1usize, Q4_1_ROWS, 2 * Q4_1_ROWS + 3] {
                    let w: Vec<u8> = (0..n)
                        .flat_map(|_| random_row(&mut rng, dtype, nb))
                        .collect();
                    let x: Vec<f32> = (0..nb * QK).map(|_| 4.0 * rng.unit() - 2.0).collect();
                    let xb: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
                    let a = quantize_acts(&x);
                    let mag: f32 = (0..nb).map(|b| a.d[b] * 127.0 * 32.0 * 16.0).sum();
                    for isa in Isa::available() {
                        for threads in [1, 2] {
                            let mut y = vec![0u8; 4 * n];
                            matvec(isa, dtype, n, nb * QK, &w, &xb, &mut y, threads);
                            for (r, out) in y.chunks_exact(4).enumerate() {
                                let got = f32::from_le_bytes([out[0], out[1], out[2], out[3]]);
                                let row =
                                    &w[r * nb * block_bytes(dtype)..][..nb * block_bytes(dtype)];
                                let want = dot_row(Isa::Scalar, dtype, row, &a);
                                assert!(
                                    (got - want).abs() <= 1e-6 * mag,
                                    "{dtype} {n}x{nb} blocks {isa:?} row {r}: {got} vs {want}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn extreme_weights_and_zero_activations() {
        // w = -128 (Q8_0) and all-zero activation blocks (dx = 0).
        for isa in Isa::available() {
            let mut w = vec![0u8; 2 * 34];
            for blk in w.chunks_mut(34) {
                blk[0..2].copy_from_slice(&half(0.5));
                blk[2..].iter_mut().for_each(|q| *q = 0x80);
            }
            let mut x = vec![-1.0f32; 64];
            x[32..].iter_mut().for_each(|v| *v = 0.0);
            let a = quantize_acts(&x);
            assert_eq!(
                dot_row(isa, DType::Q8_0, &w, &a),
                0.5 * 128.0 * 32.0,
                "{isa:?}"
            );
        }
    }
}
