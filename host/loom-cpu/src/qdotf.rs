//! Quantised weights times **f32** activations: `y[i, n] = sum_k deq(W[n, k]) * x[i, k]` for `M` activation rows,
//! with a GGUF weight `W: [N, K]` (Q8_0, Q4_0 or Q4_1 blocks of 32 along K), for the row form of the quantised
//! matrix-vector pattern (`pattern::match_matvec`).
//!
//! Unlike `qdot.rs` (which quantises the activation to Q8 blocks as ggml does), the activations stay f32: each
//! weight row is dequantised once into f32 (`x = d * q` or `d * q + m`, the block's f16 scale and minimum) and
//! dotted with every activation row in f32 (8 lanes, four accumulators), so the result is the dequantised
//! product up to f32 rounding, as the JIT's `tile.dot` and the reference compute it (within `1e-5 * sum |w x|`,
//! what the tests check). Dequantising a row costs about as much as one dot with it, so the M rows share it.
//!
//! With fewer than four activation rows (decode) each weight row is dotted straight from its blocks
//! (`fused_dot`, AVX2; `fused_dot512` for Q4_1 and Q8_0 where the CPU has AVX-512: 16 weights per instruction,
//! 16 blocks' scales per gather, the weights prefetched two 16-block groups ahead), never stored dequantised.
//!
//! Threads split the weight rows; each computes its rows for every activation row.

use loom_ir::kernel::DType;

use crate::qdot::Isa;

const QK: usize = 32;

pub(crate) fn block_bytes(dtype: DType) -> usize {
    match dtype {
        DType::Q8_0 => 34,
        DType::Q4_0 => 18,
        _ => 20,
    }
}

/// One weight row (`K / 32` whole blocks) to f32.
fn dequant_row_scalar(dtype: DType, w: &[u8], out: &mut [f32]) {
    let bs = block_bytes(dtype);
    for (blk, o) in w.chunks_exact(bs).zip(out.chunks_exact_mut(QK)) {
        let d = crate::rt::f16_to_f32(u16::from_le_bytes([blk[0], blk[1]]));
        match dtype {
            DType::Q8_0 => {
                for (o, &q) in o.iter_mut().zip(&blk[2..]) {
                    *o = d * f32::from(q as i8);
                }
            }
            DType::Q4_0 => {
                for j in 0..16 {
                    o[j] = d * f32::from(i16::from(blk[2 + j] & 15) - 8);
                    o[j + 16] = d * f32::from(i16::from(blk[2 + j] >> 4) - 8);
                }
            }
            _ => {
                let m = crate::rt::f16_to_f32(u16::from_le_bytes([blk[2], blk[3]]));
                for j in 0..16 {
                    o[j] = d * f32::from(blk[4 + j] & 15) + m;
                    o[j + 16] = d * f32::from(blk[4 + j] >> 4) + m;
                }
            }
        }
    }
}

fn dot_scalar(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    for (ca, cb) in a.chunks_exact(8).zip(b.chunks_exact(8)) {
        for l in 0..8 {
            acc[l] += ca[l] * cb[l];
        }
    }
    acc.iter().sum()
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{DType, QK, block_bytes};
    use std::arch::x86_64::*;

    /// [`super::dequant_row_scalar`] with AVX2 + FMA + F16C (the scale multiply and minimum add fused).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dequant_row(dtype: DType, w: &[u8], out: &mut [f32]) {
        // SAFETY: the caller's contract; one instantiation per block type, so that the block loop has no
        // type tests in it.
        unsafe {
            match dtype {
                DType::Q8_0 => dequant_row_of::<0>(w, out),
                DType::Q4_0 => dequant_row_of::<1>(w, out),
                _ => dequant_row_of::<2>(w, out),
            }
        }
    }

    /// [`dequant_row`] for block type `DT` (0 Q8_0, 1 Q4_0, 2 Q4_1). Q4_1's `d` and `m` are converted
    /// together from the block's first four bytes (one `vcvtph2ps`).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dequant_row_of<const DT: u8>(w: &[u8], out: &mut [f32]) {
        let dtype = [DType::Q8_0, DType::Q4_0, DType::Q4_1][DT as usize];
        let bs = block_bytes(dtype);
        let nb = w.len() / bs;
        assert!(out.len() >= nb * QK);
        let mask = _mm_set1_epi8(15);
        for b in 0..nb {
            // SAFETY: block `b` is `bs` whole bytes inside `w` (loads of 4, 16 or 32 bytes inside it); `op`
            // has 32 f32 of room (asserted above).
            unsafe {
                let blk = w.as_ptr().add(b * bs);
                let op = out.as_mut_ptr().add(b * QK);
                // Lane 0 `d`, lane 1 (Q4_1) `m`.
                let dm = _mm_cvtph_ps(_mm_cvtsi32_si128((blk as *const i32).read_unaligned()));
                let d = _mm256_broadcastss_ps(dm);
                if DT == 0 {
                    let q = _mm256_loadu_si256(blk.add(2) as *const __m256i);
                    let lo = _mm256_castsi256_si128(q);
                    let hi = _mm256_extracti128_si256::<1>(q);
                    for (i, part) in [lo, _mm_srli_si128::<8>(lo), hi, _mm_srli_si128::<8>(hi)]
                        .into_iter()
                        .enumerate()
                    {
                        let f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(part));
                        _mm256_storeu_ps(op.add(8 * i), _mm256_mul_ps(f, d));
                    }
                } else {
                    let q = _mm_loadu_si128(blk.add(if DT == 1 { 2 } else { 4 }) as *const __m128i);
                    let lo = _mm_and_si128(q, mask);
                    let hi = _mm_and_si128(_mm_srli_epi16::<4>(q), mask);
                    let m = _mm256_broadcastss_ps(_mm_movehdup_ps(dm));
                    for (i, part) in [lo, _mm_srli_si128::<8>(lo), hi, _mm_srli_si128::<8>(hi)]
                        .into_iter()
                        .enumerate()
                    {
                        let qi = _mm256_cvtepu8_epi32(part);
                        let v = if DT == 1 {
                            let f = _mm256_cvtepi32_ps(_mm256_sub_epi32(qi, _mm256_set1_epi32(8)));
                            _mm256_mul_ps(f, d)
                        } else {
                            _mm256_fmadd_ps(_mm256_cvtepi32_ps(qi), d, m)
                        };
                        _mm256_storeu_ps(op.add(8 * i), v);
                    }
                }
            }
        }
    }

    /// One quantised weight row (whole blocks) dotted with one f32 activation row without storing the
    /// dequantised row: per block `d * sum q x` (+ `m * sum x` for Q4_1, `xsum` holding each block's `sum x`),
    /// the `q x` products in 8-lane f32.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn fused_dot(dtype: DType, w: &[u8], x: &[f32], xsum: &[f32]) -> f32 {
        let bs = block_bytes(dtype);
        let nb = w.len() / bs;
        assert!(x.len() >= nb * QK && xsum.len() >= nb);
        let half = |lo: u8, hi: u8| {
            let h = _mm_cvtsi32_si128(i32::from(u16::from_le_bytes([lo, hi])));
            _mm_cvtss_f32(_mm_cvtph_ps(h))
        };
        let mut tot = [_mm256_setzero_ps(); 2];
        let mut msum = 0f32;
        for b in 0..nb {
            let blk = &w[b * bs..(b + 1) * bs];
            let xp = x[b * QK..].as_ptr();
            // SAFETY: `blk` is one whole block; `xp` has 32 f32 (checked above).
            unsafe {
                let parts = match dtype {
                    DType::Q8_0 => {
                        let q = _mm256_loadu_si256(blk[2..].as_ptr() as *const __m256i);
                        let lo = _mm256_castsi256_si128(q);
                        let hi = _mm256_extracti128_si256(q, 1);
                        [lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)]
                            .map(|p| _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(p)))
                    }
                    _ => {
                        let qs = if dtype == DType::Q4_0 {
                            &blk[2..18]
                        } else {
                            &blk[4..20]
                        };
                        let q = _mm_loadu_si128(qs.as_ptr() as *const __m128i);
                        let mask = _mm_set1_epi8(15);
                        let lo = _mm_and_si128(q, mask);
                        let hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
                        let off = _mm256_set1_epi32(if dtype == DType::Q4_0 { 8 } else { 0 });
                        [lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)].map(|p| {
                            _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(p), off))
                        })
                    }
                };
                let a = _mm256_fmadd_ps(
                    parts[1],
                    _mm256_loadu_ps(xp.add(8)),
                    _mm256_mul_ps(parts[0], _mm256_loadu_ps(xp)),
                );
                let c = _mm256_fmadd_ps(
                    parts[3],
                    _mm256_loadu_ps(xp.add(24)),
                    _mm256_mul_ps(parts[2], _mm256_loadu_ps(xp.add(16))),
                );
                let d = _mm256_set1_ps(half(blk[0], blk[1]));
                tot[b & 1] = _mm256_fmadd_ps(d, _mm256_add_ps(a, c), tot[b & 1]);
                if dtype == DType::Q4_1 {
                    msum += half(blk[2], blk[3]) * xsum[b];
                }
            }
        }
        hsum(_mm256_add_ps(tot[0], tot[1])) + msum
    }

    /// [`fused_dot`] for Q4_1 and Q8_0 with AVX-512 (16 lanes): per block the 32 weights widened to two
    /// 16-dword vectors, converted, multiplied by the activation and summed into one vector that the block's
    /// scale multiplies into one of two accumulators. The scales (and Q4_1's minimums, whose term
    /// `sum m * xsum` becomes one vector multiply-add) of 16 blocks at a time are fetched by one gather and
    /// converted by one `vcvtph2ps` (the blocks past the last whole 16 one by one). About a quarter of the
    /// AVX2 variant's instructions per block, which spends most of its time widening bytes 8 at a time.
    #[target_feature(enable = "avx512f,avx512bw,fma,f16c")]
    pub(super) unsafe fn fused_dot512(dtype: DType, w: &[u8], x: &[f32], xsum: &[f32]) -> f32 {
        const G: usize = 16;
        let bs = block_bytes(dtype);
        let nb = w.len() / bs;
        assert!(matches!(dtype, DType::Q4_1 | DType::Q8_0));
        assert!(x.len() >= nb * QK && xsum.len() >= nb);
        let half = |lo: u8, hi: u8| {
            let h = _mm_cvtsi32_si128(i32::from(u16::from_le_bytes([lo, hi])));
            _mm_cvtss_f32(_mm_cvtph_ps(h))
        };
        let offs = _mm512_mullo_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32(bs as i32),
        );
        let (mut acc0, mut acc1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        let mut macc = _mm512_setzero_ps();
        let mut msum = 0f32;
        let mut ds = [0f32; G];
        let mut b = 0;
        while b < nb {
            let n = (nb - b).min(G);
            // SAFETY: blocks `b..b + n` lie inside `w` (`nb` whole blocks) and `x`/`xsum` (checked above);
            // each gathered dword (`bs * j .. bs * j + 4` past block `b`, `j < 16`, `bs >= 20`) lies inside
            // the 16 blocks, which are whole when `n == 16`.
            unsafe {
                let base = w.as_ptr().add(b * bs);
                if n == G {
                    let hdr = _mm512_i32gather_epi32::<1>(offs, base as *const _);
                    let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(hdr));
                    _mm512_storeu_ps(ds.as_mut_ptr(), d);
                    if dtype == DType::Q4_1 {
                        let m = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(hdr, 16)));
                        macc = _mm512_fmadd_ps(m, _mm512_loadu_ps(xsum.as_ptr().add(b)), macc);
                    }
                } else {
                    for j in 0..n {
                        let blk = &w[(b + j) * bs..];
                        ds[j] = half(blk[0], blk[1]);
                        if dtype == DType::Q4_1 {
                            msum += half(blk[2], blk[3]) * xsum[b + j];
                        }
                    }
                }
                // The weights two groups ahead, one prefetch per cache line (the row is read once, from
                // memory: without it each group's gather waits for its lines).
                let ahead = base.wrapping_add(2 * G * bs);
                let mut line = 0;
                while line < G * bs {
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line) as *const i8);
                    line += 64;
                }
                let block = |j: usize| {
                    let p = base.add(j * bs);
                    let xp = x.as_ptr().add((b + j) * QK);
                    let [lo, hi] = weights512(dtype, p);
                    _mm512_fmadd_ps(
                        hi,
                        _mm512_loadu_ps(xp.add(16)),
                        _mm512_mul_ps(lo, _mm512_loadu_ps(xp)),
                    )
                };
                let mut j = 0;
                while j + 2 <= n {
                    acc0 = _mm512_fmadd_ps(_mm512_set1_ps(ds[j]), block(j), acc0);
                    acc1 = _mm512_fmadd_ps(_mm512_set1_ps(ds[j + 1]), block(j + 1), acc1);
                    j += 2;
                }
                if j < n {
                    acc0 = _mm512_fmadd_ps(_mm512_set1_ps(ds[j]), block(j), acc0);
                }
            }
            b += n;
        }
        _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) + _mm512_reduce_add_ps(macc) + msum
    }

    /// [`dequant_row`] for Q4_1 and Q8_0 with AVX-512: 16 weights per instruction.
    #[target_feature(enable = "avx512f,fma,f16c")]
    pub(super) unsafe fn dequant_row512(dtype: DType, w: &[u8], out: &mut [f32]) {
        let bs = block_bytes(dtype);
        let nb = w.len() / bs;
        assert!(matches!(dtype, DType::Q4_1 | DType::Q8_0) && out.len() >= nb * QK);
        let half = |lo: u8, hi: u8| {
            let h = _mm_cvtsi32_si128(i32::from(u16::from_le_bytes([lo, hi])));
            _mm_cvtss_f32(_mm_cvtph_ps(h))
        };
        for b in 0..nb {
            let blk = &w[b * bs..(b + 1) * bs];
            let op = out[b * QK..].as_mut_ptr();
            let d = _mm512_set1_ps(half(blk[0], blk[1]));
            let m = _mm512_set1_ps(if dtype == DType::Q4_1 {
                half(blk[2], blk[3])
            } else {
                0.0
            });
            // SAFETY: `blk` is one whole block (the loads of `weights512` lie inside it); `op` has 32 f32 of
            // room.
            unsafe {
                for (h, q) in weights512(dtype, blk.as_ptr()).into_iter().enumerate() {
                    _mm512_storeu_ps(op.add(16 * h), _mm512_fmadd_ps(q, d, m));
                }
            }
        }
    }

    /// The 32 weights of the Q4_1 or Q8_0 block at `p`, as f32 (Q4_1's unscaled nibbles, Q8_0's `q`), weights
    /// 0-15 and 16-31.
    ///
    /// # Safety
    /// `p` points at a whole block; only called from functions that enable avx512f.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn weights512(dtype: DType, p: *const u8) -> [__m512; 2] {
        // SAFETY: the loads (bytes 4..20 of a 20-byte Q4_1 block, 2..34 of a 34-byte Q8_0 one) lie inside the
        // block (the caller's contract).
        unsafe {
            if dtype == DType::Q4_1 {
                let v = _mm512_cvtepu8_epi32(_mm_loadu_si128(p.add(4) as *const __m128i));
                [
                    _mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(15))),
                    _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4)),
                ]
            } else {
                [2, 18].map(|o| {
                    _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                        p.add(o) as *const __m128i
                    )))
                })
            }
        }
    }

    /// The dots of `R` weight rows with `C` activation rows (lengths a multiple of 8): `R C` 8-lane
    /// accumulators, each loaded activation vector used `R` times and each weight vector `C` times.
    /// `out[a][b] = w[a] . x[b]`, each one 8-lane fused multiply-add chain over k in order and then
    /// [`hsum`]: the bits do not depend on `R` or `C` (so not on which block a row falls in).
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot_rc<const R: usize, const C: usize>(
        w: [&[f32]; R],
        x: [&[f32]; C],
    ) -> [[f32; C]; R] {
        let n = w.iter().chain(x.iter()).map(|v| v.len()).min().unwrap_or(0) / 8 * 8;
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        let mut k = 0;
        while k < n {
            // SAFETY: k + 8 <= n <= every length.
            unsafe {
                let xv = x.map(|r| _mm256_loadu_ps(r.as_ptr().add(k)));
                for (acc, w) in acc.iter_mut().zip(&w) {
                    let wv = _mm256_loadu_ps(w.as_ptr().add(k));
                    for (acc, xv) in acc.iter_mut().zip(&xv) {
                        *acc = _mm256_fmadd_ps(wv, *xv, *acc);
                    }
                }
            }
            k += 8;
        }
        acc.map(|row| row.map(|v| hsum(v)))
    }

    /// [`dot_rc`] of four activation rows with AVX-512 (lengths a multiple of 16): `4 R` 16-lane accumulators
    /// (16 at `R = 4`, of the 32 registers), summed together by one reduction tree (`sums16`).
    #[target_feature(enable = "avx512f,fma")]
    pub(super) unsafe fn dot_rx4_512<const R: usize>(
        w: [&[f32]; R],
        x: [&[f32]; 4],
    ) -> [[f32; 4]; R] {
        let n = w.iter().chain(x.iter()).map(|v| v.len()).min().unwrap_or(0) / 16 * 16;
        let mut acc = [[_mm512_setzero_ps(); 4]; R];
        let mut k = 0;
        while k < n {
            // SAFETY: k + 16 <= n <= every length.
            unsafe {
                let xv = x.map(|r| _mm512_loadu_ps(r.as_ptr().add(k)));
                for (acc, w) in acc.iter_mut().zip(&w) {
                    let wv = _mm512_loadu_ps(w.as_ptr().add(k));
                    for (acc, xv) in acc.iter_mut().zip(&xv) {
                        *acc = _mm512_fmadd_ps(wv, *xv, *acc);
                    }
                }
            }
            k += 16;
        }
        let sums = sums16(std::array::from_fn(|i| {
            if i / 4 < R {
                acc[i / 4][i % 4]
            } else {
                _mm512_setzero_ps()
            }
        }));
        std::array::from_fn(|a| std::array::from_fn(|b| sums[4 * a + b]))
    }

    /// The lane sums of 16 vectors, `out[i] = sum(v[i])`, by [`crate::kernels::sum16`]'s tree.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn sums16(v: [__m512; 16]) -> [f32; 16] {
        let t = crate::kernels::sum16(&v);
        let mut out = [0f32; 16];
        // SAFETY: `out` has room for 16 f32.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), t) };
        out
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    fn hsum(s: __m256) -> f32 {
        let h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
        let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
        let h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
        _mm_cvtss_f32(h)
    }

    /// `sum a[k] b[k]` (lengths a multiple of 32) in four 8-lane accumulators.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len()) / 32 * 32;
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut k = 0;
        while k < n {
            for (j, acc) in acc.iter_mut().enumerate() {
                // SAFETY: k + 8 j + 8 <= n <= both lengths.
                unsafe {
                    *acc = _mm256_fmadd_ps(
                        _mm256_loadu_ps(pa.add(k + 8 * j)),
                        _mm256_loadu_ps(pb.add(k + 8 * j)),
                        *acc,
                    );
                }
            }
            k += 32;
        }
        let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        let h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
        let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
        let h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
        _mm_cvtss_f32(h)
    }
}

fn dequant_row(isa: Isa, dtype: DType, w: &[u8], out: &mut [f32]) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx512Vnni` is only produced after detecting avx512f and f16c.
        Isa::Avx512Vnni if matches!(dtype, DType::Q4_1 | DType::Q8_0) => unsafe {
            x86::dequant_row512(dtype, w, out)
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` and `Isa::Avx512Vnni` are only produced after detecting avx2, fma and f16c.
        Isa::Avx2 | Isa::Avx512Vnni => unsafe { x86::dequant_row(dtype, w, out) },
        _ => dequant_row_scalar(dtype, w, out),
    }
}

fn dot(isa: Isa, a: &[f32], b: &[f32]) -> f32 {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `dequant_row`.
        Isa::Avx2 | Isa::Avx512Vnni => unsafe { x86::dot(a, b) },
        _ => dot_scalar(a, b),
    }
}

/// What the blocked path of [`matmul_rows`] reads: the weights (`row` bytes a row), the activation rows `xf`
/// (`m` of `k`), and where the outputs go.
#[cfg(target_arch = "x86_64")]
struct Block<'a> {
    isa: Isa,
    dtype: DType,
    row: usize,
    w: &'a [u8],
    xf: &'a [f32],
    m: usize,
    k: usize,
    out: Out,
}

#[cfg(target_arch = "x86_64")]
impl Block<'_> {
    /// Weight rows `r .. r + R`, dequantised into `wf`, by every activation row: with AVX-512 four at a time
    /// (`dot_rx4_512`), the rest one by one; with AVX2 three at a time (`dot_rc`: 12 of its 16 registers
    /// accumulate), the rest one or two at a time with the same arithmetic. Results into columns
    /// `r .. r + R` of `y` (which belong to the calling chunk only).
    fn rows<const R: usize>(&self, r: usize, wf: &mut [&mut [f32]; R]) {
        let k = self.k;
        for (j, wr) in wf.iter_mut().enumerate() {
            let at = (r + j) * self.row;
            dequant_row(self.isa, self.dtype, &self.w[at..at + self.row], wr);
        }
        let ws: [&[f32]; R] = std::array::from_fn(|a| &wf[a][..]);
        let x = |i: usize| &self.xf[i * k..(i + 1) * k];
        let put = |i: usize, d: &[f32], a: usize| {
            for (b, v) in d.iter().enumerate() {
                // SAFETY: row i + b < m, column r + a < n, owned by this chunk.
                unsafe { self.out.put(i + b, r + a, *v) };
            }
        };
        let mut i = 0;
        if self.isa == Isa::Avx512Vnni {
            while i + 4 <= self.m {
                // SAFETY: `Isa::Avx512Vnni` is only produced after detecting avx2, fma and avx512f.
                let d = unsafe { x86::dot_rx4_512(ws, [x(i), x(i + 1), x(i + 2), x(i + 3)]) };
                for (a, da) in d.iter().enumerate() {
                    put(i, da, a);
                }
                i += 4;
            }
            for i in i..self.m {
                for (a, wr) in ws.iter().enumerate() {
                    put(i, &[dot(self.isa, wr, x(i))], a);
                }
            }
            return;
        }
        while i + 3 <= self.m {
            // SAFETY: the caller never passes `Isa::Scalar`; `Isa::Avx2` is only produced after detecting avx2
            // and fma.
            let d = unsafe { x86::dot_rc(ws, [x(i), x(i + 1), x(i + 2)]) };
            for (a, da) in d.iter().enumerate() {
                put(i, da, a);
            }
            i += 3;
        }
        match self.m - i {
            2 => {
                // SAFETY: as above.
                let d = unsafe { x86::dot_rc(ws, [x(i), x(i + 1)]) };
                for (a, da) in d.iter().enumerate() {
                    put(i, da, a);
                }
            }
            1 => {
                // SAFETY: as above.
                let d = unsafe { x86::dot_rc(ws, [x(i)]) };
                for (a, da) in d.iter().enumerate() {
                    put(i, da, a);
                }
            }
            _ => {}
        }
    }
}

thread_local! {
    /// Four dequantised weight rows of the blocked path, kept per thread (`matmul_rows`).
    static WEIGHT_ROWS: std::cell::Cell<[Vec<f32>; 4]> = const {
        std::cell::Cell::new([Vec::new(), Vec::new(), Vec::new(), Vec::new()])
    };
}

/// The longest weight row whose buffers a thread keeps (64 K weights: 1 MiB for the four).
const MAX_KEPT_ROW: usize = 1 << 16;

/// Where [`matmul_rows`]' chunks write: `y` as f32 `[m, n]` (possibly unaligned bytes).
#[derive(Clone, Copy)]
struct Out(*mut u8, usize);
// SAFETY: every chunk writes a disjoint set of columns of `y`, and `matmul_rows` does not return before all
// chunks have finished.
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

impl Out {
    /// `y[i, j] = v`.
    ///
    /// # Safety
    /// `i < m`, `j < n`, and no other thread writes `y[i, j]` at the same time.
    unsafe fn put(self, i: usize, j: usize, v: f32) {
        // SAFETY: (i, j) is inside the [m, n] f32 array of 4 m n bytes at self.0 (caller's contract).
        unsafe { (self.0.add(4 * (i * self.1 + j)) as *mut f32).write_unaligned(v) }
    }
}

/// Little-endian f32 bytes as f32: in place when aligned (little-endian targets), else a copy.
pub(crate) fn f32_view(x: &[u8]) -> std::borrow::Cow<'_, [f32]> {
    if cfg!(target_endian = "little") && (x.as_ptr() as usize).is_multiple_of(4) {
        // SAFETY: 4-byte aligned, `x.len() / 4` whole f32, every bit pattern is an f32; little-endian, so the
        // bytes are the values.
        std::borrow::Cow::Borrowed(unsafe {
            std::slice::from_raw_parts(x.as_ptr() as *const f32, x.len() / 4)
        })
    } else {
        std::borrow::Cow::Owned(
            x.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        )
    }
}

/// Whether [`matmul_rows`] of `m` activation rows runs on weight tiles (`qtile.rs`): fewer than
/// `qtile::MAX_ROWS` rows, AVX-512 VNNI or AVX2 (`qtile::available`), a block type with a tiled form.
pub(crate) fn tiled(isa: Isa, dtype: DType, m: usize) -> bool {
    m < crate::qtile::MAX_ROWS
        && crate::qtile::available(isa)
        && crate::qtile::Packed::supports(dtype)
}

/// Whether [`matmul_rows`] of `m` activation rows runs on AMX-INT8 tiles (`qamx.rs`): at least
/// `qtile::MAX_ROWS` rows, a block type with a tiled form, and the hardware.
pub(crate) fn on_amx(isa: Isa, dtype: DType, m: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        m >= crate::qtile::MAX_ROWS
            && crate::qtile::Packed::supports(dtype)
            && crate::qamx::available(isa)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, dtype, m);
        false
    }
}

/// `y [m, n] = x [m, k] @ W^T` with `W: [n, k]` quantised (`dtype`), `x` and `y` little-endian f32.
///
/// The weight rows are cut into chunks (a multiple of four rows) that the threads claim one at a time, so a
/// thread that starts late (a parked worker waking up) or runs slower takes fewer of them instead of holding
/// up the dispatch; each chunk writes its columns of `y` in place.
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul_rows(
    isa: Isa,
    dtype: DType,
    m: usize,
    n: usize,
    k: usize,
    w: &[u8],
    x: &[u8],
    y: &mut [u8],
    threads: usize,
    cache: Option<&crate::ParamCache>,
) {
    let row = k / QK * block_bytes(dtype);
    assert!(
        k.is_multiple_of(QK) && w.len() == n * row && x.len() == 4 * m * k && y.len() == 4 * m * n
    );
    // The activations as f32: in place when aligned (little-endian targets), else a copy.
    let xf = f32_view(x);
    let xf: &[f32] = &xf;
    // At least `qtile::MAX_ROWS` rows on a CPU with AMX-INT8: the tiled path's numerics on AMX tiles
    // (`qamx.rs`), the weights as tiles of 16 rows kept in `cache` as below.
    #[cfg(target_arch = "x86_64")]
    if on_amx(isa, dtype, m) {
        let p = crate::ParamCache::tiles_or_pack(cache, dtype, n, k, w, threads);
        // SAFETY: `available(isa)`; y holds m * n f32 (asserted above) and is a different buffer from w and x.
        unsafe { crate::qamx::matmul(&p, m, xf, y.as_mut_ptr() as *mut f32, threads) };
        return;
    }
    // Fewer than `qtile::MAX_ROWS` activation rows with AVX-512 VNNI or AVX2: the weights as tiles of 16 rows
    // (kept in `cache` when the weights are a parameter, else made for this call) against 22-bit activations
    // (`qtile.rs`).
    #[cfg(target_arch = "x86_64")]
    if tiled(isa, dtype, m) {
        let p = crate::ParamCache::tiles_or_pack(cache, dtype, n, k, w, threads);
        // SAFETY: `available(isa)`; y holds m * n f32 (asserted above; stores are unaligned) and is a
        // different buffer from w and x (the caller's exclusive borrow).
        unsafe { crate::qtile::matmul(&p, m, xf, y.as_mut_ptr() as *mut f32, threads) };
        return;
    }
    let _ = cache;
    let xsum: Vec<f32> = if m < 4 {
        xf.chunks_exact(QK).map(|c| c.iter().sum()).collect()
    } else {
        Vec::new()
    };
    let out = Out(y.as_mut_ptr(), n);
    // At least 128 K multiply-adds per thread (see qdot::matvec, where that is 128 K weights: one row). Every
    // activation row multiplies the weights again: 16 rows against a 192 x 576 matrix are 1.8 M of them, which
    // a threshold on the weights alone (110 K) kept on one thread.
    let threads = threads
        .clamp(1, n.max(1))
        .min(((m.max(1) * n * k) >> 17).max(1));
    // About eight chunks a thread, of at least 16 rows.
    let per = n.div_ceil(threads * 8).max(16).div_ceil(4) * 4;
    let chunks = n.div_ceil(per);
    let work = |c: usize| {
        let (r0, r1) = (c * per, ((c + 1) * per).min(n));
        let mut r = r0;
        // Four weight rows at a time by blocks of activation rows (`Block::rows`: four with AVX-512, whose 32
        // registers hold the 16 accumulators; three with AVX2), then two, and the odd rows left one by one
        // below.
        #[cfg(target_arch = "x86_64")]
        if isa != Isa::Scalar && m >= 4 {
            let ctx = Block {
                isa,
                dtype,
                row,
                w,
                xf,
                m,
                k,
                out,
            };
            // The dequantised rows' buffers, kept per thread between chunks and calls (a chunk is ~4 us of
            // work at 16 activation rows; allocating and zeroing six rows for each was a few percent of it).
            WEIGHT_ROWS.with(|c| {
                let mut bufs = c.take();
                for b in bufs.iter_mut() {
                    b.resize(k, 0.0);
                }
                let [w0, w1, w2, w3] = &mut bufs;
                let mut wf4 = [&mut w0[..k], &mut w1[..k], &mut w2[..k], &mut w3[..k]];
                while r + 4 <= r1 {
                    ctx.rows(r, &mut wf4);
                    r += 4;
                }
                let [w0, w1, ..] = wf4;
                let mut wf2 = [w0, w1];
                while r + 2 <= r1 {
                    ctx.rows(r, &mut wf2);
                    r += 2;
                }
                if k <= MAX_KEPT_ROW {
                    c.set(bufs);
                }
            });
        }
        // Fewer than four activation rows: each weight row straight into the dots (no dequantised copy).
        #[cfg(target_arch = "x86_64")]
        if isa != Isa::Scalar && m < 4 {
            let nb = k / QK;
            let wide512 = isa == Isa::Avx512Vnni && matches!(dtype, DType::Q4_1 | DType::Q8_0);
            for r in r..r1 {
                for i in 0..m {
                    let (wr, xr, sr) = (
                        &w[r * row..(r + 1) * row],
                        &xf[i * k..(i + 1) * k],
                        &xsum[i * nb..(i + 1) * nb],
                    );
                    // SAFETY: `Isa::Avx2` and `Isa::Avx512Vnni` are only produced after detecting avx2, fma and
                    // f16c; `Isa::Avx512Vnni` after detecting avx512f and avx512bw too. (i, r) is inside y
                    // and column r belongs to this chunk only.
                    unsafe {
                        let v = if wide512 {
                            x86::fused_dot512(dtype, wr, xr, sr)
                        } else {
                            x86::fused_dot(dtype, wr, xr, sr)
                        };
                        out.put(i, r, v);
                    }
                }
            }
            r = r1;
        }
        if r < r1 {
            let mut wf = vec![0f32; k];
            for r in r..r1 {
                dequant_row(isa, dtype, &w[r * row..(r + 1) * row], &mut wf);
                for i in 0..m {
                    // SAFETY: (i, r) is inside y and column r belongs to this chunk only.
                    unsafe { out.put(i, r, dot(isa, &wf, &xf[i * k..(i + 1) * k])) };
                }
            }
        }
    };
    if threads <= 1 {
        (0..chunks).for_each(work);
    } else {
        crate::pool::run(chunks, threads - 1, &work);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A xorshift64 sequence from `seed` (the generator of this crate's unit tests).
    pub(crate) fn xorshift(seed: u64) -> impl FnMut() -> u64 {
        let mut s = seed;
        move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        }
    }

    /// `nb` random blocks of `dtype` with normal f16 scales (0x3000..0x3bff: ~0.125..1) and, for Q4_1,
    /// minimums (~-0.125..-1).
    pub(crate) fn random_blocks(
        next: &mut impl FnMut() -> u64,
        dtype: DType,
        nb: usize,
    ) -> Vec<u8> {
        let bs = block_bytes(dtype);
        let mut w: Vec<u8> = (0..nb * bs).map(|_| next() as u8).collect();
        for b in 0..nb {
            let d = 0x3000u16 + (next() % 0xbff) as u16;
            w[b * bs..b * bs + 2].copy_from_slice(&d.to_le_bytes());
            if dtype == DType::Q4_1 {
                let m = 0xb000u16 + (next() % 0xbff) as u16;
                w[b * bs + 2..b * bs + 4].copy_from_slice(&m.to_le_bytes());
            }
        }
        w
    }

    /// The SIMD dequantisation and dot equal the scalar ones (dequantisation exactly up to the fused
    /// multiply-add's single rounding; dots up to summation order).
    #[test]
    fn simd_matches_scalar() {
        let mut next = xorshift(0x9e37_79b9_7f4a_7c15);
        for dtype in [DType::Q8_0, DType::Q4_0, DType::Q4_1] {
            let nb = 6;
            let w = random_blocks(&mut next, dtype, nb);
            let mut want = vec![0f32; nb * QK];
            dequant_row_scalar(dtype, &w, &mut want);
            for isa in [Isa::detect(), Isa::Scalar] {
                let mut got = vec![0f32; nb * QK];
                dequant_row(isa, dtype, &w, &mut got);
                for (g, e) in got.iter().zip(&want) {
                    assert!(
                        (g - e).abs() <= 1e-6 * e.abs().max(1.0),
                        "{dtype} {isa:?}: {g} vs {e}"
                    );
                }
                let x: Vec<f32> = (0..nb * QK).map(|i| (i as f32 * 0.37).sin()).collect();
                let exact: f64 = want
                    .iter()
                    .zip(&x)
                    .map(|(a, b)| f64::from(*a) * f64::from(*b))
                    .sum();
                let scale: f64 = want
                    .iter()
                    .zip(&x)
                    .map(|(a, b)| f64::from((a * b).abs()))
                    .sum();
                let d = dot(isa, &got, &x);
                assert!(
                    (f64::from(d) - exact).abs() <= 1e-5 * scale,
                    "{dtype} {isa:?}: {d} vs {exact}"
                );
            }
        }
    }

    /// The fused dots (AVX2, and AVX-512 where the CPU has it) against the exact product of the dequantised
    /// row, for rows of fewer than, exactly and more than 16 blocks (the AVX-512 variant's group).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn fused_dots_match_the_exact_product() {
        let mut next = xorshift(0x2545_f491_4f6c_dd1d);
        let isa = Isa::detect();
        if isa == Isa::Scalar {
            return;
        }
        for dtype in [DType::Q8_0, DType::Q4_0, DType::Q4_1] {
            for nb in [1, 5, 16, 18, 48, 50] {
                let w = random_blocks(&mut next, dtype, nb);
                let mut deq = vec![0f32; nb * QK];
                dequant_row_scalar(dtype, &w, &mut deq);
                let x: Vec<f32> = (0..nb * QK).map(|i| (i as f32 * 0.37).sin()).collect();
                let xsum: Vec<f32> = x.chunks_exact(QK).map(|c| c.iter().sum()).collect();
                let exact: f64 = deq
                    .iter()
                    .zip(&x)
                    .map(|(a, b)| f64::from(*a) * f64::from(*b))
                    .sum();
                let scale: f64 = deq
                    .iter()
                    .zip(&x)
                    .map(|(a, b)| f64::from((a * b).abs()))
                    .sum();
                // SAFETY: `isa` is not scalar, so avx2, fma and f16c were detected.
                let mut got = vec![("avx2", unsafe { x86::fused_dot(dtype, &w, &x, &xsum) })];
                if isa == Isa::Avx512Vnni && dtype != DType::Q4_0 {
                    // SAFETY: avx512f and avx512bw were detected.
                    got.push(("avx512", unsafe { x86::fused_dot512(dtype, &w, &x, &xsum) }));
                }
                for (v, d) in got {
                    assert!(
                        (f64::from(d) - exact).abs() <= 1e-5 * scale,
                        "{dtype} {v} {nb} blocks: {d} vs {exact}"
                    );
                }
            }
        }
    }

    /// The blocked dots of two weight rows with four activation rows, AVX2 and AVX-512, against f64; AVX2's
    /// other block shapes give each output the same bits.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn blocked_dots_match_the_exact_products() {
        let isa = Isa::detect();
        if isa == Isa::Scalar {
            return;
        }
        let k = 576;
        let row = |seed: f32| -> Vec<f32> { (0..k).map(|i| (i as f32 * seed).sin()).collect() };
        let w = [row(0.37), row(0.11)];
        let x = [row(0.23), row(0.71), row(0.05), row(1.3)];
        let xs = [&x[0][..], &x[1][..], &x[2][..], &x[3][..]];
        // SAFETY: `isa` is not scalar: avx2 and fma were detected (and avx512f for `Avx512Vnni`).
        let mut got = vec![unsafe { x86::dot_rc([&w[0], &w[1]], xs) }];
        // SAFETY: as above; every block shape gives each output the same bits.
        let (c3, c1) = unsafe {
            (
                x86::dot_rc([&w[0], &w[1], &w[0], &w[1]], [xs[0], xs[1], xs[2]]),
                x86::dot_rc([&w[1]], [xs[3]]),
            )
        };
        for a in 0..2 {
            for b in 0..3 {
                assert_eq!(c3[a][b].to_bits(), got[0][a][b].to_bits(), "{a} {b}");
                assert_eq!(c3[a + 2][b].to_bits(), got[0][a][b].to_bits(), "{a} {b}");
            }
        }
        assert_eq!(c1[0][0].to_bits(), got[0][1][3].to_bits());
        if isa == Isa::Avx512Vnni {
            // SAFETY: as above.
            got.push(unsafe { x86::dot_rx4_512([&w[0], &w[1]], xs) });
            // SAFETY: as above; rows 0 and 1 of the 4-row result are the 2-row one's.
            let d = unsafe { x86::dot_rx4_512([&w[0], &w[1], &w[0], &w[1]], xs) };
            got.push([d[0], d[1]]);
            got.push([d[2], d[3]]);
        }
        for g in got {
            for a in 0..2 {
                for b in 0..4 {
                    let exact: f64 = w[a]
                        .iter()
                        .zip(&x[b])
                        .map(|(p, q)| f64::from(*p) * f64::from(*q))
                        .sum();
                    let scale: f64 = w[a]
                        .iter()
                        .zip(&x[b])
                        .map(|(p, q)| f64::from((p * q).abs()))
                        .sum();
                    assert!(
                        (f64::from(g[a][b]) - exact).abs() <= 1e-5 * scale,
                        "{a} {b}"
                    );
                }
            }
        }
    }
}
