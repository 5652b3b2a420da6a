//! Row-wise softmax and layernorm (`pattern::match_rows`) at memory speed: each row (contiguous, `C` f32)
//! is read from memory once and then worked on in L1 (max, exp and sum, divide; or sum, centred sum of
//! squares, scale). The element loops are written so that LLVM vectorises them; they are compiled three
//! times (AVX-512, AVX2+FMA, baseline) and the variant is chosen at run time ([`Isa::detect`]). On AVX-512
//! both are hand-written instead (module `x86`; softmax: `vscalefps` exp, sum fused into the exp pass,
//! prefetch of the next rows; layernorm: the same operations as the portable loops, and outputs of at least
//! [`NT_MIN_BYTES`] written with non-temporal stores). No fused
//! multiply-adds are formed (Rust never contracts `a * b + c`), so every f32 operation rounds as the IR says.
//!
//! Rounding model against the reference (which computes in f64 and rounds each op to f32):
//! * `+ - * /` and `max` are the same IEEE f32 operations (bit-identical);
//! * row sums accumulate in f64 (64 lanes, then the lanes in order; 32 lanes and a tree in the AVX-512
//!   softmax and layernorm) and round once: the reference sums in
//!   index order in f64, so the two differ by at most the f64 reassociation error (relative ~`C * 2^-53`)
//!   before the same final rounding;
//! * `rsqrt` is `1 / sqrt` in f64 rounded once (one scalar per row, as the reference);
//! * `exp` is [`exp_f32`] (or its 16-lane form `x86::exp16`), an f32 polynomial with at most 1 ulp error
//!   (measured over every 997th f32 bit pattern in `[-105, 89]` in the unit tests below) instead of the
//!   correctly rounded f64 `exp`; a softmax output
//!   therefore differs from the reference by at most ~2 ulp of `e` plus the sum's rounding (well inside the
//!   relative 1e-6 `tests/diff.rs` states).

use crate::pattern::{RowOp, RowsMatch};

/// Which compiled variant of the row loops to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Isa {
    Avx512,
    Avx2,
    Scalar,
}

impl Isa {
    pub(crate) fn detect() -> Isa {
        [Isa::Avx512, Isa::Avx2]
            .into_iter()
            .find(|i| i.supported())
            .unwrap_or(Isa::Scalar)
    }

    /// Whether this CPU runs the variant: AVX-512F with FMA, AVX2 with FMA, or the baseline. (`kernels`'
    /// small dots share these variants.)
    pub(crate) fn supported(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            match self {
                Isa::Avx512 => has!("avx512f") && has!("fma"),
                Isa::Avx2 => has!("avx2") && has!("fma"),
                Isa::Scalar => true,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == Isa::Scalar
        }
    }
}

/// Independent accumulators per row reduction (four AVX-512 f32 registers: hides the add/max latency).
const LANES: usize = 64;

/// `a * b + c`: fused (one rounding) when `FMA` (the AVX2/AVX-512 variants, where it is one instruction),
/// otherwise two roundings.
#[inline(always)]
fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA { a.mul_add(b, c) } else { a * b + c }
}

/// `e^x` in f32: Cody-Waite reduction `x = n ln2 + r` (|r| <= ~0.35), the Cephes `expf` degree-5
/// polynomial, and the scale `2^n` applied as two exact powers of two so that results in the subnormal range
/// round once. NaN propagates; `x < -104` gives 0, `x > 88.73` gives +inf. With `FMA` the reduction and the
/// polynomial use fused multiply-adds (a different rounding, the same 1 ulp bound: both are unit-tested).
#[inline(always)]
pub(crate) fn exp_f32<const FMA: bool>(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer in the low mantissa bits.
    const C1: f32 = 0.693_359_4; // ln 2 high part (9 significant bits: n * C1 is exact)
    const C2: f32 = -2.121_944_4e-4; // ln 2 - C1
    let xc = x.clamp(-105.0, 89.0);
    let t = madd::<FMA>(xc, LOG2E, MAGIC);
    let n = t - MAGIC;
    let ni = (t.to_bits() as i32).wrapping_sub(0x4B40_0000);
    let r = madd::<FMA>(-n, C2, madd::<FMA>(-n, C1, xc));
    let mut p = 1.987_569_1e-4f32;
    p = madd::<FMA>(p, r, 1.398_199_9e-3);
    p = madd::<FMA>(p, r, 8.333_452e-3);
    p = madd::<FMA>(p, r, 4.166_579_6e-2);
    p = madd::<FMA>(p, r, 1.666_666_5e-1);
    p = madd::<FMA>(p, r, 0.5); // Cephes 5.0000001201e-1, which rounds to 0.5 in f32
    let y = madd::<FMA>(p, r * r, r) + 1.0;
    let n1 = ni.clamp(-126, 127);
    let n2 = ni - n1;
    let pow2 = |k: i32| f32::from_bits(((k + 127) as u32) << 23);
    let e = y * pow2(n1) * pow2(n2);
    if x.is_nan() { x } else { e }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::{exp_tile, exp16, map16, reduce_rows};

/// Hand-written AVX-512 row loops (softmax): LLVM's vectorisation of the portable loops spends about twice
/// the instructions on `exp` (two-power scaling with clamps and a NaN select) and on the NaN-ignoring max.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// `e^x` on 16 lanes: the same reduction and Cephes polynomial as [`super::exp_f32`] (fused), with
    /// `n = round(x log2 e)` from `vrndscaleps` and the scale `2^n` applied by `vscalefps` (one rounding, also
    /// for subnormal results). The clamps to [-105, 89] keep NaN (`vmaxps`/`vminps` return the second
    /// operand when either is NaN), which then propagates through every step. Without `HI` the upper clamp
    /// is left out (one instruction of ~16): only for `x <= 0` (or NaN), as softmax's `x - max` is.
    ///
    /// Subnormal results are avoided where they are not the answer: an instruction whose result is
    /// subnormal takes a microcode assist on Intel cores (on the order of a hundred cycles a vector), and
    /// masked attention scores (`-3e38`) put every lane of a vector there. Lanes below `ZERO` (`e^x <
    /// 2^-150`, whose correctly rounded result is +0) give +0 directly; when no lane lies between `ZERO` and
    /// `-87` (`e^-87 > 2^-126`: normal results), the rest are computed clamped at -87 and nothing is
    /// subnormal. Otherwise (a result that is really subnormal) the clamp is -105.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) fn exp16<const HI: bool>(x: __m512) -> __m512 {
        const ZERO: f32 = -103.98;
        // NaN compares false in both: it takes the normal path and propagates.
        let zero = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(ZERO));
        let low = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(-87.0));
        let floor = if low & !zero == 0 { -87.0 } else { -105.0 };
        let xc = _mm512_max_ps(_mm512_set1_ps(floor), x);
        let xc = if HI {
            _mm512_min_ps(_mm512_set1_ps(89.0), xc)
        } else {
            xc
        };
        let t = _mm512_mul_ps(xc, _mm512_set1_ps(std::f32::consts::LOG2_E));
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(t);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_359_4), xc);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.121_944_4e-4), r);
        // The polynomial by Estrin's scheme (three FMA levels instead of Horner's five: the exp pass is
        // latency-bound, not throughput-bound).
        let c = |v: f32| _mm512_set1_ps(v);
        let r2 = _mm512_mul_ps(r, r);
        let r4 = _mm512_mul_ps(r2, r2);
        let a = _mm512_fmadd_ps(c(1.666_666_5e-1), r, c(0.5));
        let b = _mm512_fmadd_ps(c(8.333_452e-3), r, c(4.166_579_6e-2));
        let d = _mm512_fmadd_ps(c(1.987_569_1e-4), r, c(1.398_199_9e-3));
        let p = _mm512_fmadd_ps(d, r4, _mm512_fmadd_ps(b, r2, a));
        let y = _mm512_fmadd_ps(p, r2, r);
        let y = _mm512_add_ps(y, _mm512_set1_ps(1.0));
        _mm512_maskz_mov_ps(!zero, _mm512_scalef_ps(y, n))
    }

    #[inline]
    fn tail(n: usize) -> __mmask16 {
        ((1u32 << n) - 1) as __mmask16
    }

    /// `dst[i] = f(src[i])` for `i < n`, sixteen lanes at a time, the tail masked: the loop of the 16-lane
    /// functions' tile entry points (`exp_tile`, and `vmath`'s `erf_tile` and `sigmoid_tile`). `src` and `dst`
    /// may be the same region (each block is read before it is written).
    ///
    /// # Safety
    /// AVX-512F; `src` is readable and `dst` writable for `n` f32 values.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn map16(
        src: *const f32,
        dst: *mut f32,
        n: usize,
        f: impl Fn(__m512) -> __m512,
    ) {
        let mut i = 0;
        // SAFETY (both loops): i + 16 <= n, or the tail's mask covers the n - i < 16 elements left.
        unsafe {
            while i + 16 <= n {
                let x = _mm512_loadu_ps(src.add(i));
                _mm512_storeu_ps(dst.add(i), f(x));
                i += 16;
            }
            if i < n {
                let k = tail(n - i);
                let x = _mm512_maskz_loadu_ps(k, src.add(i));
                _mm512_mask_storeu_ps(dst.add(i), k, f(x));
            }
        }
    }

    /// `dst[i] = e^src[i]` for `i < n` by [`exp16`] (the JIT's `exp` of a tile, `vmath::tile`). `src` and
    /// `dst` may be the same region.
    ///
    /// # Safety
    /// `src` is readable and `dst` writable for `n` f32 values.
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn exp_tile(src: *const f32, dst: *mut f32, n: usize) {
        // SAFETY: the caller's contract.
        unsafe { map16(src, dst, n, |x| exp16::<true>(x)) }
    }

    /// `rt::loom_reduce`'s f32 sum or max along contiguous rows (`dst[o]` of `src[o * len..][..len]`), bit for
    /// bit: the sum adds eight f64 lanes in index order, then the lanes in order, then the remainder in order,
    /// exactly as the portable loop does, and rounds once; the max ignores NaN (`vmaxps` returns its second
    /// operand, the accumulator, when the element is NaN), as `f32::max` does, and is exact in any order.
    ///
    /// # Safety
    /// `src` is readable for `outer * len` f32 values and `dst` writable for `outer`.
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn reduce_rows(
        max: bool,
        src: *const f32,
        dst: *mut f32,
        outer: usize,
        len: usize,
    ) {
        // SAFETY (whole body): row o is src[o * len..(o + 1) * len]; loads stay inside it (eight at a time, or
        // sixteen with the tail masked); dst[o] for o < outer.
        unsafe {
            for o in 0..outer {
                let row = src.add(o * len);
                if max {
                    let mut acc = _mm512_set1_ps(f32::NEG_INFINITY);
                    let mut i = 0;
                    while i + 16 <= len {
                        acc = _mm512_max_ps(_mm512_loadu_ps(row.add(i)), acc);
                        i += 16;
                    }
                    if i < len {
                        let x = _mm512_mask_loadu_ps(
                            _mm512_set1_ps(f32::NEG_INFINITY),
                            tail(len - i),
                            row.add(i),
                        );
                        acc = _mm512_max_ps(x, acc);
                    }
                    *dst.add(o) = _mm512_reduce_max_ps(acc);
                } else {
                    let mut acc = _mm512_setzero_pd();
                    let mut i = 0;
                    while i + 8 <= len {
                        acc = _mm512_add_pd(acc, _mm512_cvtps_pd(_mm256_loadu_ps(row.add(i))));
                        i += 8;
                    }
                    let mut lanes = [0f64; 8];
                    _mm512_storeu_pd(lanes.as_mut_ptr(), acc);
                    let mut t: f64 = lanes.iter().sum();
                    while i < len {
                        t += f64::from(*row.add(i));
                        i += 1;
                    }
                    *dst.add(o) = t as f32;
                }
            }
        }
    }

    /// The f64 widening of 16 f32 lanes added to two f64 accumulators.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn add_f64(acc: &mut [__m512d; 2], e: __m512) {
        let lo = _mm512_cvtps_pd(_mm512_castps512_ps256(e));
        let hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(
            _mm512_castps_pd(e),
        )));
        acc[0] = _mm512_add_pd(acc[0], lo);
        acc[1] = _mm512_add_pd(acc[1], hi);
    }

    /// The f64 widening of 16 f32 lanes added to two f64 accumulators starting at `acc[j]`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn add_f64_at(acc: &mut [__m512d; 4], j: usize, e: __m512) {
        let lo = _mm512_cvtps_pd(_mm512_castps512_ps256(e));
        let hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(
            _mm512_castps_pd(e),
        )));
        acc[j] = _mm512_add_pd(acc[j], lo);
        acc[j + 1] = _mm512_add_pd(acc[j + 1], hi);
    }

    /// The f64 sum of `f(v)` over the row `x[..n]` (16 lanes at a time, four f64 accumulators: two
    /// independent add chains per 16 lanes), rounded once to f32. `f` must map the masked-off lanes of the
    /// tail (loaded as 0) to 0.
    ///
    /// # Safety
    /// `xp` points to `n` readable f32.
    #[inline(always)]
    unsafe fn sum_f64(xp: *const f32, n: usize, f: impl Fn(__m512) -> __m512) -> f32 {
        // SAFETY: offsets `i + 16 <= n` are in bounds; the tail's masked load touches lanes `< n` only.
        unsafe {
            let mut acc = [_mm512_setzero_pd(); 4];
            let mut i = 0;
            while i + 32 <= n {
                add_f64_at(&mut acc, 0, f(_mm512_loadu_ps(xp.add(i))));
                add_f64_at(&mut acc, 2, f(_mm512_loadu_ps(xp.add(i + 16))));
                i += 32;
            }
            if i + 16 <= n {
                add_f64_at(&mut acc, 0, f(_mm512_loadu_ps(xp.add(i))));
                i += 16;
            }
            if i < n {
                let k = tail(n - i);
                let v = _mm512_maskz_mov_ps(k, f(_mm512_maskz_loadu_ps(k, xp.add(i))));
                add_f64_at(&mut acc, 2, v);
            }
            let s = _mm512_add_pd(_mm512_add_pd(acc[0], acc[1]), _mm512_add_pd(acc[2], acc[3]));
            _mm512_reduce_add_pd(s) as f32
        }
    }

    /// Writes `y[..n]` as `f(i, mask)` (the 16 outputs at `i`; `mask` `None` for 16 whole lanes, else the
    /// lanes `< n`), with non-temporal stores (`vmovntps`, no read for ownership of `y`'s lines) when `nt`:
    /// the lanes before `y`'s first 64-byte boundary and the tail are ordinary masked stores. The caller
    /// issues `sfence` before the results may be read by another thread.
    ///
    /// # Safety
    /// `yp` points to `n` writable f32 (4-byte aligned), and `f` reads only what its mask allows.
    #[inline(always)]
    unsafe fn store_row(
        yp: *mut f32,
        n: usize,
        nt: bool,
        f: impl Fn(usize, Option<__mmask16>) -> __m512,
    ) {
        // SAFETY: every store covers offsets `< n` (full vectors at `i + 16 <= n`, masked ones elsewhere);
        // a streamed vector starts on a 64-byte boundary.
        unsafe {
            let mut i = 0;
            if nt {
                let head = ((64 - (yp as usize & 63)) & 63) / 4;
                if head > 0 {
                    let h = head.min(n);
                    let k = tail(h);
                    _mm512_mask_storeu_ps(yp, k, f(0, Some(k)));
                    i = h;
                }
                while i + 16 <= n {
                    _mm512_stream_ps(yp.add(i), f(i, None));
                    i += 16;
                }
            } else {
                while i + 16 <= n {
                    _mm512_storeu_ps(yp.add(i), f(i, None));
                    i += 16;
                }
            }
            if i < n {
                let k = tail(n - i);
                _mm512_mask_storeu_ps(yp.add(i), k, f(i, Some(k)));
            }
        }
    }

    /// 16 f32 at `p`, or the lanes of `k` (others 0).
    ///
    /// # Safety
    /// `p` points to 16 readable f32, or to the lanes of `k`.
    #[inline(always)]
    unsafe fn load(p: *const f32, k: Option<__mmask16>) -> __m512 {
        // SAFETY: the caller's contract.
        unsafe {
            match k {
                None => _mm512_loadu_ps(p),
                Some(k) => _mm512_maskz_loadu_ps(k, p),
            }
        }
    }

    /// Layernorm over the rows of `x` (row length `cols`) into `y`, with the same operations as the
    /// portable `layernorm_row` (f64 sums rounded once, unfused f32 `(x - mean) * inv * g + b`), the
    /// output streamed when `nt`. No software prefetch: the hardware prefetcher follows the row-by-row
    /// stream, and prefetching the row two ahead (as the softmax does) measured ~40 % slower on 4096 x 1024.
    #[target_feature(enable = "avx512f")]
    pub(super) fn layernorm_rows(
        cols: usize,
        x: &[f32],
        y: &mut [f32],
        g: &[f32],
        b: &[f32],
        (n1, n2, eps): (f32, f32, f32),
        nt: bool,
    ) {
        assert!(g.len() >= cols && b.len() >= cols);
        for (xr, yr) in x.chunks_exact(cols).zip(y.chunks_exact_mut(cols)) {
            let (xp, yp) = (xr.as_ptr(), yr.as_mut_ptr());
            let n = cols;
            // SAFETY: `xr`, `yr`, `g`, `b` hold `n` f32.
            unsafe {
                let mean = sum_f64(xp, n, |v| v) / n1;
                let m = _mm512_set1_ps(mean);
                let var = sum_f64(xp, n, |v| {
                    let d = _mm512_sub_ps(v, m);
                    _mm512_mul_ps(d, d)
                }) / n2
                    + eps;
                let inv = _mm512_set1_ps((1.0 / f64::from(var).sqrt()) as f32);
                store_row(yp, n, nt, |i, k| {
                    let d = _mm512_sub_ps(load(xp.add(i), k), m);
                    let o = _mm512_mul_ps(_mm512_mul_ps(d, inv), load(g.as_ptr().add(i), k));
                    _mm512_add_ps(o, load(b.as_ptr().add(i), k))
                });
            }
        }
        if nt {
            _mm_sfence();
        }
    }

    /// Softmax over the rows of `x` (row length `cols`) into `y`, software-pipelined: the division pass
    /// of row `r - 1` runs inside the exp pass of row `r` (one `vdivps` per 16 exps), so the divider works
    /// next to the FMA units instead of alone after them (4096 x 1024: ~10 % faster standalone).
    #[target_feature(enable = "avx512f")]
    pub(super) fn softmax_rows(cols: usize, x: &[f32], y: &mut [f32]) {
        // Prefetch distance: two rows ahead, at least 8 KiB (one line per 16-element step of the exp pass,
        // so the lines of the rows ahead are each requested once, while this row is computed in L1; one row
        // ahead measured ~10 % slower on 4096 x 1024).
        let ahead = (2 * cols).max(2048);
        let mut prev: Option<(*mut f32, __m512)> = None;
        for (xr, yr) in x.chunks_exact(cols).zip(y.chunks_exact_mut(cols)) {
            let yp = yr.as_mut_ptr();
            let m = row_max(xr);
            // SAFETY: `yr` and the previous row of `y` (`pp`) hold `cols` f32 each and do not overlap.
            let s = unsafe {
                match prev {
                    Some((pp, ps)) => exp_row::<true>(xr, yp, m, ahead, pp, ps),
                    None => exp_row::<false>(xr, yp, m, ahead, yp, m),
                }
            };
            prev = Some((yp, s));
        }
        if let Some((pp, ps)) = prev {
            // SAFETY: the last row of `y`, `cols` f32.
            unsafe { div_row(pp, cols, ps) };
        }
    }

    /// The NaN-ignoring max of a row (four accumulators), broadcast.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn row_max(x: &[f32]) -> __m512 {
        let (n, xp) = (x.len(), x.as_ptr());
        let full = n / 16 * 16;
        // SAFETY (every load): offsets `i < full` cover 16 elements of `x`; the tail's masked load touches
        // only lanes `full..n`.
        let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
        let mut acc = [ninf; 4];
        let mut i = 0;
        while i + 64 <= n {
            for (j, a) in acc.iter_mut().enumerate() {
                let v = unsafe { _mm512_loadu_ps(xp.add(i + 16 * j)) };
                // `vmaxps v, a` returns `a` where `v` is NaN: NaNs are ignored.
                *a = _mm512_max_ps(v, *a);
            }
            i += 64;
        }
        while i < full {
            let v = unsafe { _mm512_loadu_ps(xp.add(i)) };
            acc[0] = _mm512_max_ps(v, acc[0]);
            i += 16;
        }
        if full < n {
            let v = unsafe { _mm512_mask_loadu_ps(ninf, tail(n - full), xp.add(full)) };
            acc[0] = _mm512_max_ps(v, acc[0]);
        }
        let m = _mm512_max_ps(_mm512_max_ps(acc[0], acc[1]), _mm512_max_ps(acc[2], acc[3]));
        _mm512_set1_ps(_mm512_reduce_max_ps(m))
    }

    /// `e = exp(x - m)` stored to `yp` with the f64 row sum taken in the same pass (32 f64 lanes); returns
    /// the sum rounded to f32, broadcast. With `DIV`, each step also divides 16 elements of the previous
    /// row `pp` by its sum `ps` in place (exact `vdivps`). The pass prefetches `x` and `y` `ahead` elements
    /// on (the next rows), so that their memory traffic overlaps this row's arithmetic; a prefetch never
    /// faults, so addresses past the buffers are harmless.
    ///
    /// # Safety
    /// `yp` (and with `DIV`, `pp`) point to `x.len()` writable f32; the rows do not overlap.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn exp_row<const DIV: bool>(
        x: &[f32],
        yp: *mut f32,
        m: __m512,
        ahead: usize,
        pp: *mut f32,
        ps: __m512,
    ) -> __m512 {
        let (n, xp) = (x.len(), x.as_ptr());
        let full = n / 16 * 16;
        // SAFETY (every load and store below): offsets `i < full` cover 16 in-bounds elements of `x`, `yp`
        // and `pp`; the tail's masked accesses touch only lanes `full..n`.
        let mut sum = [_mm512_setzero_pd(); 2];
        let mut i = 0;
        while i < full {
            _mm_prefetch::<_MM_HINT_T0>(xp.wrapping_add(i + ahead) as *const i8);
            _mm_prefetch::<_MM_HINT_ET0>(yp.wrapping_add(i + ahead) as *const i8);
            let v = unsafe { _mm512_loadu_ps(xp.add(i)) };
            let e = exp16::<false>(_mm512_sub_ps(v, m));
            unsafe { _mm512_storeu_ps(yp.add(i), e) };
            add_f64(&mut sum, e);
            if DIV {
                unsafe {
                    _mm512_storeu_ps(pp.add(i), _mm512_div_ps(_mm512_loadu_ps(pp.add(i)), ps))
                };
            }
            i += 16;
        }
        if full < n {
            let k = tail(n - full);
            let v = unsafe { _mm512_maskz_loadu_ps(k, xp.add(full)) };
            let e = _mm512_maskz_mov_ps(k, exp16::<false>(_mm512_sub_ps(v, m)));
            unsafe { _mm512_mask_storeu_ps(yp.add(full), k, e) };
            add_f64(&mut sum, e);
            if DIV {
                unsafe {
                    let q = _mm512_div_ps(_mm512_maskz_loadu_ps(k, pp.add(full)), ps);
                    _mm512_mask_storeu_ps(pp.add(full), k, q);
                }
            }
        }
        _mm512_set1_ps(_mm512_reduce_add_pd(_mm512_add_pd(sum[0], sum[1])) as f32)
    }

    /// `p[..n] /= s` (exact `vdivps`).
    ///
    /// # Safety
    /// `p` points to `n` writable f32.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn div_row(p: *mut f32, n: usize, s: __m512) {
        // SAFETY: the caller's contract; `load`/`store_row` touch lanes `< n` only.
        unsafe { store_row(p, n, false, |i, k| _mm512_div_ps(load(p.add(i), k), s)) };
    }
}

/// Max of a row ignoring NaNs (as the reference's `f64::max` fold from -inf).
#[inline(always)]
fn row_max(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let mut chunks = x.chunks_exact(LANES);
    for ch in &mut chunks {
        for j in 0..LANES {
            acc[j] = acc[j].max(ch[j]);
        }
    }
    let mut m = f32::NEG_INFINITY;
    for &v in acc.iter().chain(chunks.remainder()) {
        m = m.max(v);
    }
    m
}

/// The lanes and the remainder summed in order.
#[inline(always)]
fn lanes_total(acc: &[f64; LANES], rest: impl Iterator<Item = f64>) -> f64 {
    acc.iter().copied().chain(rest).sum()
}

/// f64 sum of a row's f32 values in `LANES` lanes, rounded once.
#[inline(always)]
fn row_sum(x: &[f32]) -> f32 {
    let mut acc = [0f64; LANES];
    let xc = x.chunks_exact(LANES);
    let xr = xc.remainder();
    for xs in xc {
        for j in 0..LANES {
            acc[j] += f64::from(xs[j]);
        }
    }
    lanes_total(&acc, xr.iter().map(|&v| f64::from(v))) as f32
}

#[inline(always)]
fn softmax_row<const FMA: bool>(x: &[f32], y: &mut [f32]) {
    let m = row_max(x);
    for (o, &v) in y.iter_mut().zip(x) {
        *o = exp_f32::<FMA>(v - m);
    }
    let s = row_sum(y);
    for v in y.iter_mut() {
        *v /= s;
    }
}

#[inline(always)]
fn layernorm_row(x: &[f32], y: &mut [f32], g: &[f32], b: &[f32], n1: f32, n2: f32, eps: f32) {
    let mean = row_sum(x) / n1;
    let mut acc = [0f64; LANES];
    let xc = x.chunks_exact(LANES);
    let xr = xc.remainder();
    for xs in xc {
        for j in 0..LANES {
            let d = xs[j] - mean;
            acc[j] += f64::from(d * d);
        }
    }
    let var = lanes_total(
        &acc,
        xr.iter().map(|&v| {
            let d = v - mean;
            f64::from(d * d)
        }),
    ) as f32
        / n2
        + eps;
    let inv = (1.0 / f64::from(var).sqrt()) as f32;
    for (((o, &v), &gv), &bv) in y.iter_mut().zip(x).zip(g).zip(b) {
        *o = (v - mean) * inv * gv + bv;
    }
}

#[inline(always)]
fn rows_generic<const FMA: bool>(
    op: &RowOp,
    cols: usize,
    x: &[f32],
    y: &mut [f32],
    g: &[f32],
    b: &[f32],
) {
    for (xr, yr) in x.chunks_exact(cols).zip(y.chunks_exact_mut(cols)) {
        match *op {
            RowOp::Softmax => softmax_row::<FMA>(xr, yr),
            RowOp::LayerNorm { n1, n2, eps, .. } => layernorm_row(xr, yr, g, b, n1, n2, eps),
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
fn rows_avx512(op: &RowOp, cols: usize, x: &[f32], y: &mut [f32], g: &[f32], b: &[f32], nt: bool) {
    match *op {
        RowOp::Softmax => x86::softmax_rows(cols, x, y),
        RowOp::LayerNorm { n1, n2, eps, .. } => {
            x86::layernorm_rows(cols, x, y, g, b, (n1, n2, eps), nt)
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn rows_avx2(op: &RowOp, cols: usize, x: &[f32], y: &mut [f32], g: &[f32], b: &[f32]) {
    rows_generic::<true>(op, cols, x, y, g, b)
}

fn rows_isa(
    isa: Isa,
    op: &RowOp,
    cols: usize,
    x: &[f32],
    y: &mut [f32],
    g: &[f32],
    b: &[f32],
    nt: bool,
) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the guard checked AVX-512F, AVX2 and FMA at run time (the features `rows_avx512` enables).
        Isa::Avx512 if avx512_ok() => unsafe { rows_avx512(op, cols, x, y, g, b, nt) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the guard checked AVX2 and FMA at run time (the features `rows_avx2` enables).
        Isa::Avx2 if avx2_ok() => unsafe { rows_avx2(op, cols, x, y, g, b) },
        _ => rows_generic::<false>(op, cols, x, y, g, b),
    }
}

#[cfg(target_arch = "x86_64")]
fn avx2_ok() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

#[cfg(target_arch = "x86_64")]
fn avx512_ok() -> bool {
    use std::arch::is_x86_feature_detected as has;
    has!("avx512f") && has!("avx2") && has!("fma")
}

/// Outputs of at least this many bytes are written with non-temporal stores (AVX-512 variant): they do
/// not read `y`'s lines for ownership first, and an output this large would mostly leave the cache before
/// a consumer reads it anyway. (On the 2-core Zen 4 VM a streaming copy of 16 MiB runs at ~40-50 GB/s
/// against ~20-27 GB/s for `memcpy`, which uses ordinary stores at that size.)
const NT_MIN_BYTES: usize = 8 << 20;

/// Runs a matched row kernel: `x` and `y` hold at least `rows * cols` f32, `g` and `b` (layernorm) `cols`.
/// Rows are split between up to `threads` pool threads (each at least 16 K elements).
pub(crate) fn run(
    isa: Isa,
    m: &RowsMatch,
    x: &[f32],
    y: &mut [f32],
    g: &[f32],
    b: &[f32],
    threads: usize,
) {
    let (rows, cols) = (m.rows, m.cols);
    let (x, y) = (&x[..rows * cols], &mut y[..rows * cols]);
    let (g, b) = match m.op {
        RowOp::LayerNorm { .. } => (&g[..cols], &b[..cols]),
        RowOp::Softmax => (g, b),
    };
    // At least 16 K elements (~5 us of softmax) per thread: the pool's round trip is ~0.5 us with the worker
    // spinning and ~10-13 us when it has parked (`LOOM_BENCH=pool`); was 64 K for a thread spawn per call.
    let per_thread_min = (16_384 / cols).max(1);
    let threads = threads.clamp(1, rows.div_ceil(per_thread_min).max(1));
    let nt = rows * cols * 4 >= NT_MIN_BYTES;
    if threads == 1 {
        rows_isa(isa, &m.op, cols, x, y, g, b, nt);
        return;
    }
    let per = rows.div_ceil(threads) * cols;
    let chunks: Vec<(&[f32], std::sync::Mutex<&mut [f32]>)> = x
        .chunks(per)
        .zip(y.chunks_mut(per).map(std::sync::Mutex::new))
        .collect();
    crate::pool::run(chunks.len(), chunks.len() - 1, &|t| {
        let (xc, yc) = &chunks[t];
        let mut yc = yc.lock().unwrap_or_else(|e| e.into_inner());
        rows_isa(isa, &m.op, cols, xc, &mut yc, g, b, nt);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ulps(a: f32, b: f32) -> u32 {
        let k = |v: f32| {
            let i = v.to_bits() as i32;
            if i < 0 { i32::MIN - i } else { i }
        };
        k(a).abs_diff(k(b))
    }

    #[test]
    fn exp_f32_is_within_one_ulp() {
        let mut worst = (0u32, 0f32);
        let (lo, hi) = (-105.0f32, 89.0f32);
        let mut bits = 0u32;
        while bits < 0x8000_0000 {
            for v in [f32::from_bits(bits), -f32::from_bits(bits)] {
                if (lo..=hi).contains(&v) {
                    let want = f64::from(v).exp() as f32;
                    let u = ulps(exp_f32::<false>(v), want).max(ulps(exp_f32::<true>(v), want));
                    if u > worst.0 {
                        worst = (u, v);
                    }
                }
            }
            bits += 997;
        }
        assert!(
            worst.0 <= 1,
            "exp_f32 max error {} ulp at {}",
            worst.0,
            worst.1
        );
        for e in [exp_f32::<false>, exp_f32::<true>] {
            assert_eq!(e(0.0), 1.0);
            assert_eq!(e(f32::NEG_INFINITY), 0.0);
            assert_eq!(e(-104.5), 0.0);
            assert_eq!(e(f32::INFINITY), f32::INFINITY);
            assert_eq!(e(89.0), f32::INFINITY);
            assert!(e(f32::NAN).is_nan());
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn exp16_is_within_one_ulp() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            return;
        }
        use std::arch::x86_64::*;
        let exp16 = |v: &[f32; 16]| -> [f32; 16] {
            let mut out = [0f32; 16];
            let mut lo = [0f32; 16];
            // SAFETY: AVX-512F was detected above; the arrays hold 16 f32.
            unsafe {
                let x = _mm512_loadu_ps(v.as_ptr());
                _mm512_storeu_ps(out.as_mut_ptr(), x86::exp16::<true>(x));
                _mm512_storeu_ps(lo.as_mut_ptr(), x86::exp16::<false>(x));
            }
            // The variant without the upper clamp agrees bit for bit where it applies (x <= 0, NaN).
            for ((&x, &a), &b) in v.iter().zip(&out).zip(&lo) {
                if x <= 0.0 || x.is_nan() {
                    assert_eq!(a.to_bits(), b.to_bits(), "exp16::<false>({x})");
                }
            }
            out
        };
        let (lo, hi) = (-105.0f32, 89.0f32);
        let mut vals = vec![];
        let mut bits = 0u32;
        while bits < 0x8000_0000 {
            for v in [f32::from_bits(bits), -f32::from_bits(bits)] {
                if (lo..=hi).contains(&v) {
                    vals.push(v);
                }
            }
            bits += 997;
        }
        // Around the overflow and subnormal boundaries, densely.
        for c in [88.72f32, -87.33, -103.28, 0.35, -0.35] {
            let b = c.to_bits();
            vals.extend((0..4096u32).map(|d| f32::from_bits(b - 2048 + d)));
        }
        let mut worst = (0u32, 0f32);
        for ch in vals.chunks(16) {
            let mut v = [0f32; 16];
            v[..ch.len()].copy_from_slice(ch);
            let got = exp16(&v);
            for (&x, &g) in v.iter().zip(&got) {
                let u = ulps(g, f64::from(x).exp() as f32);
                if u > worst.0 {
                    worst = (u, x);
                }
            }
        }
        assert!(
            worst.0 <= 1,
            "exp16 max error {} ulp at {}",
            worst.0,
            worst.1
        );
        let mut sp = [0f32; 16];
        sp[..7].copy_from_slice(&[
            0.0,
            f32::NEG_INFINITY,
            -104.5,
            f32::INFINITY,
            89.0,
            f32::NAN,
            -f32::NAN,
        ]);
        let r = exp16(&sp);
        assert_eq!(&r[..5], &[1.0, 0.0, 0.0, f32::INFINITY, f32::INFINITY]);
        assert!(r[5].is_nan() && r[6].is_nan());
        // Masked scores (-3e38) beside normal, subnormal and zero results, in one vector and alone: both
        // paths of the subnormal test, each lane against f64.
        let mixes: [[f32; 16]; 3] = [
            [-3e38; 16],
            std::array::from_fn(|i| if i % 2 == 0 { -3e38 } else { -(i as f32) * 5.0 }),
            std::array::from_fn(|i| {
                [-3e38, -1.0, -95.0, -103.97, -103.99, -87.0, -86.9, 0.5][i % 8]
            }),
        ];
        for v in &mixes {
            for (&x, &g) in v.iter().zip(&exp16(v)) {
                let want = f64::from(x).exp() as f32;
                assert!(ulps(g, want) <= 1, "exp16({x}) = {g}, want {want}");
                assert!(g.to_bits() != (-0.0f32).to_bits(), "exp16({x}) is -0");
            }
        }
    }

    /// The AVX-512 row sums and maxima of `rt::loom_reduce` against its portable loops (`rt::sum_row_f64`,
    /// `f32::max`), bit for bit: ragged lengths, a NaN (ignored by max), values whose f64 sum order matters.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn reduce_rows_match_the_portable_order() {
        for isa in [Isa::Avx512, Isa::Avx2] {
            if isa.supported() {
                reduce_rows_on(isa);
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    fn reduce_rows_on(isa: Isa) {
        for len in [0usize, 1, 7, 8, 9, 16, 31, 32, 33, 100] {
            let outer = 5;
            let mut x: Vec<f32> = (0..outer * len)
                .map(|i| ((i * 7919) % 1009) as f32 * 1.37e-3 * if i % 3 == 0 { -1e4 } else { 1.0 })
                .collect();
            if len > 2 {
                x[len + 1] = f32::NAN;
            }
            for max in [false, true] {
                let mut got = vec![0f32; outer];
                // SAFETY: the CPU has `isa`; x holds outer rows of len, got outer values.
                unsafe {
                    if isa == Isa::Avx512 {
                        x86::reduce_rows(max, x.as_ptr(), got.as_mut_ptr(), outer, len)
                    } else {
                        let f32 = loom_ir::kernel::DType::F32;
                        crate::rt::reduce_contiguous_avx2(f32, !max, max, &x, &mut got, len);
                    }
                };
                for o in 0..outer {
                    let row = &x[o * len..(o + 1) * len];
                    let want = if max {
                        row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b))
                    } else {
                        crate::rt::sum_row_f64(row) as f32
                    };
                    if max && o == 1 && len > 2 {
                        assert!(!got[o].is_nan(), "max of a row with a NaN");
                    }
                    assert_eq!(
                        got[o].to_bits(),
                        want.to_bits(),
                        "len {len} row {o} max {max}"
                    );
                }
            }
        }
    }

    /// The streamed (non-temporal) output path: rows that start off a 64-byte boundary, heads longer than
    /// a row, tails; against the scalar variant.
    #[test]
    fn streamed_rows_match_scalar() {
        if Isa::detect() != Isa::Avx512 {
            return;
        }
        for cols in [5usize, 16, 37, 64, 100] {
            let rows = 7;
            let x: Vec<f32> = (0..cols * rows)
                .map(|i| ((i * 7919) % 1000) as f32 / 97.0 - 5.0)
                .collect();
            let g: Vec<f32> = (0..cols).map(|i| 0.5 + i as f32 / 50.0).collect();
            let b: Vec<f32> = (0..cols).map(|i| i as f32 / 30.0 - 0.5).collect();
            for op in [
                RowOp::Softmax,
                RowOp::LayerNorm {
                    n1: cols as f32,
                    n2: cols as f32,
                    eps: 1e-5,
                    gamma: 0,
                    beta: 0,
                },
            ] {
                let mut want = vec![0f32; x.len()];
                rows_isa(Isa::Scalar, &op, cols, &x, &mut want, &g, &b, false);
                for off in [0usize, 1, 3, 15] {
                    let mut buf = vec![f32::NAN; x.len() + 32];
                    rows_isa(
                        Isa::Avx512,
                        &op,
                        cols,
                        &x,
                        &mut buf[off..off + x.len()],
                        &g,
                        &b,
                        true,
                    );
                    assert!(buf[..off].iter().all(|v| v.is_nan()), "{op:?} {cols} {off}");
                    assert!(buf[off + x.len()..].iter().all(|v| v.is_nan()));
                    for (a, w) in buf[off..off + x.len()].iter().zip(&want) {
                        assert!(
                            ulps(*a, *w) <= 2,
                            "{op:?} cols {cols} off {off}: {a} vs {w}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn every_isa_gives_the_same_rows() {
        let cols = 37;
        let mut x: Vec<f32> = (0..cols * 5)
            .map(|i| ((i * 7919) % 1000) as f32 / 97.0 - 5.0)
            .collect();
        // -inf (exp gives 0), far below the max (0), and results in the subnormal range; one row in the
        // vector tail.
        for (i, v) in [
            (3, f32::NEG_INFINITY),
            (40, -200.0),
            (41, -90.0),
            (42, -95.5),
            (35, -88.0),
        ] {
            x[i] = v;
        }
        let g: Vec<f32> = (0..cols).map(|i| 0.5 + i as f32 / 50.0).collect();
        let b: Vec<f32> = (0..cols).map(|i| i as f32 / 30.0 - 0.5).collect();
        for op in [
            RowOp::Softmax,
            RowOp::LayerNorm {
                n1: cols as f32,
                n2: cols as f32,
                eps: 1e-5,
                gamma: 0,
                beta: 0,
            },
        ] {
            let m = RowsMatch {
                rows: 5,
                cols,
                x: 0,
                y: 1,
                op,
            };
            let mut want = vec![0f32; x.len()];
            run(Isa::Scalar, &m, &x, &mut want, &g, &b, 1);
            for isa in [Isa::detect(), Isa::Avx2, Isa::Avx512] {
                if isa != Isa::Scalar && Isa::detect() == Isa::Scalar {
                    continue;
                }
                if isa == Isa::Avx512 && Isa::detect() != Isa::Avx512 {
                    continue;
                }
                let mut got = vec![0f32; x.len()];
                run(isa, &m, &x, &mut got, &g, &b, 2);
                // Layernorm is bit-identical; softmax's exp may differ by the FMA rounding (<= 2 ulp).
                for (a, w) in got.iter().zip(&want) {
                    assert!(ulps(*a, *w) <= 2, "{isa:?} {:?}: {a} vs {w}", m.op);
                }
            }
        }
    }
}
