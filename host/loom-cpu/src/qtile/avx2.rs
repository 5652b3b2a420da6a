//! [`super::x86::tile`] on AVX2, FMA and F16C (CPUs without AVX-512: AMD Zen 2 and 3, Intel before Ice Lake),
//! the same bits. The tile layout is the AVX-512 one; a 256-bit vector holds half of one of its 64-byte lines
//! (four weights of 8 rows), so the kernel runs each tile as two halves of 8 rows.
//!
//! AVX2 has no `vpdpbusd`. `vpmaddubsw` multiplies unsigned by signed bytes and adds pairs into 16 bits
//! (saturating), then `vpmaddwd` by ones adds the pairs of those into the 32-bit lane `vpdpbusd` would have
//! made. Every weight byte is split into nibbles first (Q4: the low and the high weight of the byte; Q8_0:
//! its low and high four bits, `u = 16 hi + lo`), so each 16-bit sum is at most `2 * 15 * 128 = 3840` in
//! magnitude, and the eight of a block's part add up in 16 bits (`8 * 3840 < 2^15`) before the one widening.
//! The integer sums are exact, so each lane's are the AVX-512 kernel's, and the float work after them is the
//! same operations in the same order: the same results, bit for bit. The activations are quantised by
//! [`quantise_block`], the scalar form's bits on eight lanes.

use std::arch::x86_64::*;

use super::*;

/// Tile `t`'s outputs for the activation rows `a` (at most [`MANY`]; rows `i0..` of `y`, `[m, p.n]`), the
/// first `rows` lanes written (see [`super::x86::tile`]).
///
/// # Safety
/// AVX2, FMA and F16C are present; `y` is valid for the written elements.
pub(super) unsafe fn tile(p: &Packed, t: usize, a: &[Acts], y: *mut f32, rows: usize, i0: usize) {
    // One instantiation per block type, and one for a single activation row (decode at batch 1: its
    // accumulators stay in registers).
    // SAFETY: the caller's contract.
    unsafe {
        match (p.dtype, a.len() == 1) {
            (DType::Q8_0, true) => tile_of::<Q8_0, true>(p, t, a, y, rows, i0),
            (DType::Q8_0, false) => tile_of::<Q8_0, false>(p, t, a, y, rows, i0),
            (DType::Q4_0, true) => tile_of::<Q4_0, true>(p, t, a, y, rows, i0),
            (DType::Q4_0, false) => tile_of::<Q4_0, false>(p, t, a, y, rows, i0),
            (_, true) => tile_of::<Q4_1, true>(p, t, a, y, rows, i0),
            (_, false) => tile_of::<Q4_1, false>(p, t, a, y, rows, i0),
        }
    }
}

/// The block types, as [`tile_of`]'s parameter.
const Q8_0: u8 = 0;
const Q4_0: u8 = 1;
const Q4_1: u8 = 2;

/// [`tile`] for block type `DT` (`ONE`: `a` holds one row).
///
/// # Safety
/// As [`tile`]; `p.dtype` is `DT`'s type and `a.len() == 1` where `ONE`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_of<const DT: u8, const ONE: bool>(
    p: &Packed,
    t: usize,
    a: &[Acts],
    y: *mut f32,
    rows: usize,
    i0: usize,
) {
    let (tb, wb) = (tile_block(p.dtype), weight_bytes(p.dtype));
    let nb = p.k / QK;
    let z = zero_point(p.dtype);
    let q8 = DT == Q8_0;
    let nib = _mm256_set1_epi8(0x0f);
    let ones = _mm256_set1_epi16(1);
    assert!(a.len() <= MANY && (!ONE || a.len() == 1));
    let g_end = if ONE { 1 } else { a.len() };
    // Each activation row's parts and per-block values, as pointers (read per block below).
    let parts: [[*const i8; 3]; MANY] = std::array::from_fn(|g| {
        a.get(g).map_or([std::ptr::null(); 3], |a| {
            a.parts.each_ref().map(|v| v.as_ptr())
        })
    });
    let scales: [*const f32; MANY] =
        std::array::from_fn(|g| a.get(g).map_or(std::ptr::null(), |a| a.s.as_ptr()));
    let sums: [*const [i32; 3]; MANY] =
        std::array::from_fn(|g| a.get(g).map_or(std::ptr::null(), |a| a.sums.as_ptr()));
    let xsums: [*const f32; MANY] =
        std::array::from_fn(|g| a.get(g).map_or(std::ptr::null(), |a| a.sum.as_ptr()));
    // SAFETY (the whole body): tile `t`'s `nb` tile-blocks lie inside `p.data` (`pack` made `tiles * nb` of
    // `tb` bytes, 64-byte aligned, `tb` a multiple of 64; half `h` of a line is its bytes `32 h..32 h + 32`,
    // of the scales `2 * 8 h..`); each activation row `g < g_end` holds `nb * 32` bytes of each part and `nb`
    // of the per-block values (`Acts::new` over `k = 32 nb`); the broadcast reads are 4 bytes at `4j` (Q8_0,
    // `j < 8`) or `4j` and `16 + 4j` (Q4, `j < 4`) of the block's 32. Prefetches may point past the data (a
    // prefetch does not fault). The stores write lanes `8 h..rows` of the tile's outputs of rows
    // `i0..i0 + a.len()` (the caller's contract).
    unsafe {
        let base = p.ptr().add(t * nb * tb);
        for h in 0..2 {
            if 8 * h >= rows {
                break;
            }
            let mut acc = [_mm256_setzero_ps(); MANY];
            for b in 0..nb {
                let o = base.add(b * tb);
                if h == 0 {
                    prefetch_ahead(o, tb);
                }
                let line = |j: usize| _mm256_load_si256(o.add(64 * j + 32 * h) as *const __m256i);
                // Q4: the low nibbles (inputs 4j..) and the high ones (inputs 16 + 4j..), as bytes.
                // Q8_0: line j's low nibbles in w[j], its high ones in w[8 + j] (both inputs 4j..).
                let mut w = [_mm256_setzero_si256(); 16];
                let lines = if q8 { 8 } else { 4 };
                for j in 0..lines {
                    let v = line(j);
                    w[j] = _mm256_and_si256(v, nib);
                    w[lines + j] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), nib);
                }
                let d = _mm256_cvtph_ps(_mm_loadu_si128(o.add(wb + 16 * h) as *const __m128i));
                let mv = if DT == Q4_1 {
                    _mm256_cvtph_ps(_mm_loadu_si128(o.add(wb + 32 + 16 * h) as *const __m128i))
                } else {
                    _mm256_setzero_ps()
                };
                for g in 0..g_end {
                    // Four activation bytes of part `t` at `at`, broadcast to the 8 lanes.
                    let bc = |t: usize, at: usize| {
                        _mm256_set1_epi32(
                            (parts[g][t].add(b * QK + at) as *const i32).read_unaligned(),
                        )
                    };
                    let bsums = *sums[g].add(b);
                    // The block's integer dot of part `t` with each of the 8 rows, less the weights' offset.
                    let part = |t: usize| {
                        let v = if q8 {
                            let (mut lo, mut hi) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                            for j in 0..8 {
                                let x = bc(t, 4 * j);
                                lo = _mm256_add_epi16(lo, _mm256_maddubs_epi16(w[j], x));
                                hi = _mm256_add_epi16(hi, _mm256_maddubs_epi16(w[8 + j], x));
                            }
                            _mm256_add_epi32(
                                _mm256_madd_epi16(lo, ones),
                                _mm256_slli_epi32::<4>(_mm256_madd_epi16(hi, ones)),
                            )
                        } else {
                            let mut s = _mm256_setzero_si256();
                            for j in 0..4 {
                                s = _mm256_add_epi16(s, _mm256_maddubs_epi16(w[j], bc(t, 4 * j)));
                                s = _mm256_add_epi16(
                                    s,
                                    _mm256_maddubs_epi16(w[4 + j], bc(t, 16 + 4 * j)),
                                );
                            }
                            _mm256_madd_epi16(s, ones)
                        };
                        if z != 0 {
                            _mm256_sub_epi32(v, _mm256_set1_epi32(z * bsums[t]))
                        } else {
                            v
                        }
                    };
                    let (p0, p1, p2) = (part(0), part(1), part(2));
                    let low = _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_slli_epi32::<8>(p1), p2));
                    let f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_set1_ps(65536.0), low);
                    let sc = _mm256_mul_ps(d, _mm256_set1_ps(*scales[g].add(b)));
                    acc[g] = _mm256_fmadd_ps(f, sc, acc[g]);
                    if DT == Q4_1 {
                        acc[g] = _mm256_fmadd_ps(mv, _mm256_set1_ps(*xsums[g].add(b)), acc[g]);
                    }
                }
            }
            let lanes = (rows - 8 * h).min(8) as i32;
            let mask = _mm256_cmpgt_epi32(
                _mm256_set1_epi32(lanes),
                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
            );
            for (g, acc) in acc.iter().take(g_end).enumerate() {
                let yp = y.add((i0 + g) * p.n + t * TILE + 8 * h);
                _mm256_maskstore_ps(yp, mask, *acc);
            }
        }
    }
}

/// [`super::quantise_block`] with AVX2, bit for bit (as the AVX-512 form: the same rounding of the same
/// products, the same sum tree).
///
/// # Safety
/// AVX2 is present.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn quantise_block(
    c: &[f32; QK],
    out: [&mut [i8; QK]; 3],
) -> (f32, [i32; 3], f32) {
    // SAFETY: `c` holds 32 f32 (four 8-lane loads); each output part holds 32 bytes (one 32-byte store).
    unsafe {
        let x: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(c.as_ptr().add(8 * i)));
        let abs = |v: __m256| _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff)));
        let m = _mm256_max_ps(
            _mm256_max_ps(abs(x[0]), abs(x[1])),
            _mm256_max_ps(abs(x[2]), abs(x[3])),
        );
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps::<1>(m, m)));
        // Finite lanes: x - x == 0 (NaN otherwise).
        let fin = |v: __m256| {
            _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(
                _mm256_sub_ps(v, v),
                _mm256_setzero_ps(),
            ))
        };
        let finite = x.iter().all(|v| fin(*v) == 0xff);
        let (s, inv) = scale(finite, amax);
        let mut sums = [0i32; 3];
        if inv > 0.0 {
            let (vinv, lim) = (_mm256_set1_ps(inv), _mm256_set1_ps(QMAX));
            let (c128, m255) = (_mm256_set1_epi32(128), _mm256_set1_epi32(255));
            let mut parts = [[_mm256_setzero_si256(); 4]; 3];
            for (i, x) in x.iter().enumerate() {
                let r = _mm256_min_ps(
                    _mm256_max_ps(
                        _mm256_mul_ps(*x, vinv),
                        _mm256_sub_ps(_mm256_setzero_ps(), lim),
                    ),
                    lim,
                );
                // Round to nearest even (the default rounding mode), as the scalar form.
                let q = _mm256_cvtps_epi32(r);
                let lo = _mm256_sub_epi32(_mm256_and_si256(_mm256_add_epi32(q, c128), m255), c128);
                let q1 = _mm256_srai_epi32::<8>(_mm256_add_epi32(q, c128));
                let mid =
                    _mm256_sub_epi32(_mm256_and_si256(_mm256_add_epi32(q1, c128), m255), c128);
                let hi = _mm256_srai_epi32::<16>(_mm256_add_epi32(q, _mm256_set1_epi32(32896)));
                parts[0][i] = hi;
                parts[1][i] = mid;
                parts[2][i] = lo;
            }
            for t in 0..3 {
                let p = &parts[t];
                // 32 values in [-128, 127] to bytes in order: the packs interleave 128-bit lanes, the
                // permute puts them back.
                let w = _mm256_packs_epi16(
                    _mm256_packs_epi32(p[0], p[1]),
                    _mm256_packs_epi32(p[2], p[3]),
                );
                let w = _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
                _mm256_storeu_si256(out[t].as_mut_ptr() as *mut __m256i, w);
                let v =
                    _mm256_add_epi32(_mm256_add_epi32(p[0], p[1]), _mm256_add_epi32(p[2], p[3]));
                let v = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
                let v = _mm_add_epi32(v, _mm_shuffle_epi32::<0b01_00_11_10>(v));
                let v = _mm_add_epi32(v, _mm_shuffle_epi32::<0b10_11_00_01>(v));
                sums[t] = _mm_cvtsi128_si32(v);
            }
        } else {
            for o in out {
                o.fill(0);
            }
        }
        // The sum in the scalar form's tree: 16 lanes (x[j] + x[16 + j]), then halves.
        let (a, b) = (_mm256_add_ps(x[0], x[2]), _mm256_add_ps(x[1], x[3]));
        let v8 = _mm256_add_ps(a, b);
        let v4 = _mm_add_ps(_mm256_castps256_ps128(v8), _mm256_extractf128_ps::<1>(v8));
        let v2 = _mm_add_ps(v4, _mm_movehl_ps(v4, v4));
        let v1 = _mm_add_ss(v2, _mm_shuffle_ps::<1>(v2, v2));
        (s, sums, _mm_cvtss_f32(v1))
    }
}
