//! Runtime helpers the JIT-compiled kernels call through registered symbols: f16/bf16 conversions, the
//! transcendental functions, casts, reductions, `tile.dot` and quantised-element reads.
//!
//! Every helper is `extern "C"` and never panics (a panic cannot unwind through JIT frames). Tile helpers take
//! raw pointers into the calling instance's scratch memory; the lowering guarantees that each pointer covers
//! the element count it passes (offsets and sizes are assigned at compile time from the checked tile types).
//! Numerics follow `loom_reference`'s rounding model: every float op is evaluated in f64 on exact operands
//! and rounded once to the value's dtype, so these helpers match the reference bit for bit except for
//! `exp`/`log`/`tanh`/`erf`, where the platform functions (or the erf below) may differ by an f64 ulp.

use loom_ir::kernel::{BinOp, DType, ReduceOp, UnOp};

// ---- run-time bounds ----

/// `bytes` bytes from `src` to `dst`: a tile row (or a contiguous block of rows) moved between a buffer and
/// scratch, which the JIT's 128-bit lanes would move 16 bytes an iteration.
///
/// # Safety
/// The JIT calls it only for accesses whose bounds it proved: `src` and `dst` are valid for `bytes` bytes and
/// do not overlap (one is in a buffer, the other in the instance's scratch).
pub(crate) unsafe extern "C" fn loom_copy(dst: *mut u8, src: *const u8, bytes: u64) {
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, bytes as usize) };
}

/// Asks the CPU to bring `rows` rows of `row_bytes` bytes, `stride` bytes apart from `ptr` on, into its
/// caches (a tile the dots will read in place: the loads that wait for memory then overlap the work before
/// the dots). Prefetches never fault, so any address is allowed.
pub(crate) extern "C" fn loom_prefetch(ptr: *const u8, rows: u64, row_bytes: u64, stride: u64) {
    #[cfg(target_arch = "x86_64")]
    for r in 0..rows {
        let row = ptr.wrapping_add((r * stride) as usize);
        let mut b = 0;
        while b < row_bytes {
            // SAFETY: a prefetch reads nothing the program can observe and does not fault on any address.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                    row.wrapping_add(b as usize) as *const i8,
                )
            };
            b += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (ptr, rows, row_bytes, stride);
}

/// `n` elements between an f16 or bf16 buffer (`dtype`, its code) and f32 scratch: with `load`, `src` holds
/// halves and `dst` gets f32; otherwise `src` holds f32 and `dst` gets halves. Bit for bit what
/// [`loom_half_to_f32`] and [`loom_f32_to_half`] give element by element (round to nearest even; a stored NaN
/// and a loaded f16 NaN become the canonical quiet NaN with their sign, a loaded bf16 NaN is quieted with its
/// payload kept), sixteen at a time where the CPU has AVX-512 F/BW/VL (F16C conversions, a rounding add for
/// bf16), eight at a time with AVX2 and F16C, the scalar functions for the rest.
///
/// # Safety
/// `src` is readable and `dst` writable for `n` elements of their types; they do not overlap.
pub(crate) unsafe extern "C" fn loom_copy_half(
    dst: *mut u8,
    src: *const u8,
    n: u64,
    dtype: u32,
    load: u32,
) {
    // SAFETY: the caller's contract.
    unsafe { copy_half_on(HalfIsa::detect(), dst, src, n as usize, dtype, load != 0) }
}

/// The vector width [`loom_copy_half`] converts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HalfIsa {
    Scalar,
    /// AVX2 and F16C: eight lanes.
    Avx2,
    /// AVX-512 F, BW and VL: sixteen lanes.
    Avx512,
}

impl HalfIsa {
    fn detect() -> HalfIsa {
        [HalfIsa::Avx512, HalfIsa::Avx2]
            .into_iter()
            .find(|w| w.supported())
            .unwrap_or(HalfIsa::Scalar)
    }

    /// Whether this CPU has the width's features.
    fn supported(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            match self {
                HalfIsa::Scalar => true,
                HalfIsa::Avx2 => has!("avx2") && has!("f16c"),
                HalfIsa::Avx512 => has!("avx512f") && has!("avx512bw") && has!("avx512vl"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == HalfIsa::Scalar
        }
    }
}

/// [`loom_copy_half`] with the given vector width (which the CPU must have).
///
/// # Safety
/// As [`loom_copy_half`]; the CPU has `isa`'s features.
unsafe fn copy_half_on(
    isa: HalfIsa,
    dst: *mut u8,
    src: *const u8,
    n: usize,
    dtype: u32,
    load: bool,
) {
    let bf16 = dtype_of(dtype) == DType::BF16;
    // SAFETY: the features are present (the caller's contract); the extents as the caller promised.
    #[cfg(target_arch = "x86_64")]
    let i = unsafe {
        match isa {
            HalfIsa::Avx512 => half_x86::convert(dst, src, n, bf16, load),
            HalfIsa::Avx2 => half_x86::convert8(dst, src, n, bf16, load),
            HalfIsa::Scalar => 0,
        }
    };
    #[cfg(not(target_arch = "x86_64"))]
    let i = {
        let _ = (isa, bf16);
        0
    };
    for j in i..n {
        // SAFETY: j < n: inside both regions (the caller's contract); unaligned accesses.
        unsafe {
            if load {
                let h = (src as *const u16).add(j).read_unaligned();
                (dst as *mut f32)
                    .add(j)
                    .write_unaligned(loom_half_to_f32(dtype, u32::from(h)));
            } else {
                let x = (src as *const f32).add(j).read_unaligned();
                (dst as *mut u16)
                    .add(j)
                    .write_unaligned(loom_f32_to_half(dtype, x) as u16);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod half_x86 {
    use std::arch::x86_64::*;

    /// The whole blocks of 16 of [`super::loom_copy_half`]; returns how many elements it converted.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(super) unsafe fn convert(
        dst: *mut u8,
        src: *const u8,
        n: usize,
        bf16: bool,
        load: bool,
    ) -> usize {
        let mut i = 0;
        let sign = _mm512_set1_epi32(i32::MIN);
        while i + 16 <= n {
            // SAFETY: i + 16 <= n: inside both regions (the caller's contract); unaligned loads and stores.
            unsafe {
                if load {
                    let h = _mm256_loadu_si256(src.add(2 * i) as *const __m256i);
                    let v = if bf16 {
                        // NaN: quiet, payload kept (as `loom_half_to_f32`).
                        let v =
                            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)));
                        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
                        let q =
                            _mm512_or_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x0040_0000));
                        _mm512_mask_blend_ps(nan, v, _mm512_castsi512_ps(q))
                    } else {
                        // NaN: the canonical quiet NaN with the half's sign, as `f16_to_f32` gives.
                        let v = _mm512_cvtph_ps(h);
                        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
                        let q = _mm512_or_si512(
                            _mm512_and_si512(_mm512_castps_si512(v), sign),
                            _mm512_set1_epi32(0x7fc0_0000),
                        );
                        _mm512_mask_blend_ps(nan, v, _mm512_castsi512_ps(q))
                    };
                    _mm512_storeu_ps(dst.add(4 * i) as *mut f32, v);
                } else {
                    let v = _mm512_loadu_ps(src.add(4 * i) as *const f32);
                    let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
                    let neg = _mm512_test_epi32_mask(_mm512_castps_si512(v), sign);
                    let h = if bf16 {
                        // Round to nearest even on the high 16 bits: add 0x7fff plus the kept part's lowest bit.
                        let b = _mm512_castps_si512(v);
                        let odd =
                            _mm512_and_si512(_mm512_srli_epi32::<16>(b), _mm512_set1_epi32(1));
                        let r =
                            _mm512_add_epi32(b, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd));
                        let r = _mm512_srli_epi32::<16>(r);
                        // NaN: 0x7fc0 or 0xffc0.
                        let q = _mm512_mask_blend_epi32(
                            neg,
                            _mm512_set1_epi32(0x7fc0),
                            _mm512_set1_epi32(0xffc0),
                        );
                        _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, r, q))
                    } else {
                        let h =
                            _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
                        // NaN: 0x7e00 with the sign.
                        let q = _mm256_mask_blend_epi16(
                            neg,
                            _mm256_set1_epi16(0x7e00),
                            _mm256_set1_epi16(0xfe00u16 as i16),
                        );
                        _mm256_mask_blend_epi16(nan, h, q)
                    };
                    _mm256_storeu_si256(dst.add(2 * i) as *mut __m256i, h);
                }
            }
            i += 16;
        }
        i
    }

    /// [`convert`] on AVX2 and F16C: whole blocks of 8, the same bits (NaN handling included).
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn convert8(
        dst: *mut u8,
        src: *const u8,
        n: usize,
        bf16: bool,
        load: bool,
    ) -> usize {
        let mut i = 0;
        let sign = _mm256_set1_epi32(i32::MIN);
        // Eight 32-bit lanes holding 16-bit values to eight 16-bit lanes (values below 2^16: no saturation).
        let pack = |v: __m256i| {
            _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v))
        };
        while i + 8 <= n {
            // SAFETY: i + 8 <= n: inside both regions (the caller's contract); unaligned loads and stores.
            unsafe {
                if load {
                    let h = _mm_loadu_si128(src.add(2 * i) as *const __m128i);
                    let v = if bf16 {
                        // NaN: quiet, payload kept (as `loom_half_to_f32`).
                        let v =
                            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)));
                        let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v);
                        let q =
                            _mm256_or_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x0040_0000)));
                        _mm256_blendv_ps(v, q, nan)
                    } else {
                        // NaN: the canonical quiet NaN with the half's sign, as `f16_to_f32` gives.
                        let v = _mm256_cvtph_ps(h);
                        let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v);
                        let q = _mm256_or_si256(
                            _mm256_and_si256(_mm256_castps_si256(v), sign),
                            _mm256_set1_epi32(0x7fc0_0000),
                        );
                        _mm256_blendv_ps(v, _mm256_castsi256_ps(q), nan)
                    };
                    _mm256_storeu_ps(dst.add(4 * i) as *mut f32, v);
                } else {
                    let v = _mm256_loadu_ps(src.add(4 * i) as *const f32);
                    let b = _mm256_castps_si256(v);
                    let nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
                    // The sign moved to bit 15 of each lane.
                    let neg = _mm256_srli_epi32::<16>(_mm256_and_si256(b, sign));
                    let h = if bf16 {
                        // Round to nearest even on the high 16 bits: add 0x7fff plus the kept part's lowest bit.
                        let odd =
                            _mm256_and_si256(_mm256_srli_epi32::<16>(b), _mm256_set1_epi32(1));
                        let r =
                            _mm256_add_epi32(b, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd));
                        let r = _mm256_srli_epi32::<16>(r);
                        // NaN: 0x7fc0 or 0xffc0.
                        let q = _mm256_or_si256(neg, _mm256_set1_epi32(0x7fc0));
                        pack(_mm256_blendv_epi8(r, q, nan))
                    } else {
                        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
                        // NaN: 0x7e00 with the sign.
                        let q = pack(_mm256_or_si256(neg, _mm256_set1_epi32(0x7e00)));
                        _mm_blendv_epi8(
                            h,
                            q,
                            _mm_packs_epi32(
                                _mm256_castsi256_si128(nan),
                                _mm256_extracti128_si256::<1>(nan),
                            ),
                        )
                    };
                    _mm_storeu_si128(dst.add(2 * i) as *mut __m128i, h);
                }
            }
            i += 8;
        }
        i
    }
}

/// The cold path of a loop back-edge whose step slice is spent (see `jit.rs`'s module doc): the cancel status
/// (negated) when the dispatch's flag is set, the budget status (negated) when the instance's allowance is used
/// up, else the next slice's steps minus the one being taken now.
///
/// # Safety
/// `scratch` is the calling instance's scratch, whose header the host wrote (`run_grid`): an i64 at
/// `REST_OFF` and a pointer at `CANCEL_OFF` that is null or points to a live `AtomicU32`.
pub(crate) unsafe extern "C" fn loom_fuel(scratch: *mut u8) -> i64 {
    use crate::jit::{CANCEL_OFF, FUEL_SLICE, REST_OFF, ST_BUDGET, ST_CANCEL};
    // SAFETY: see the function's contract; the header is 64-byte aligned, the words 8-byte aligned.
    unsafe {
        let flag = *(scratch.add(CANCEL_OFF) as *const *const std::sync::atomic::AtomicU32);
        if !flag.is_null() && (*flag).load(std::sync::atomic::Ordering::Relaxed) != 0 {
            return -i64::from(ST_CANCEL);
        }
        let rest = scratch.add(REST_OFF) as *mut i64;
        if *rest <= 0 {
            return -i64::from(ST_BUDGET);
        }
        let take = (*rest).min(FUEL_SLICE as i64);
        *rest -= take;
        take - 1
    }
}

/// The code a dtype travels under through the JIT ABI: its index in [`DType::ALL`].
pub(crate) fn dtype_code(d: DType) -> u32 {
    DType::ALL.iter().position(|&x| x == d).unwrap_or(0) as u32
}

fn dtype_of(code: u32) -> DType {
    DType::ALL.get(code as usize).copied().unwrap_or(DType::F32)
}

pub(crate) fn unop_code(op: UnOp) -> u32 {
    op as u32
}

fn unop_of(code: u32) -> UnOp {
    const ALL: [UnOp; 10] = [
        UnOp::Neg,
        UnOp::Abs,
        UnOp::Not,
        UnOp::Exp,
        UnOp::Log,
        UnOp::Tanh,
        UnOp::Erf,
        UnOp::Sqrt,
        UnOp::Rsqrt,
        UnOp::Sigmoid,
    ];
    ALL.get(code as usize).copied().unwrap_or(UnOp::Neg)
}

pub(crate) fn reduce_code(op: ReduceOp) -> u32 {
    op as u32
}

// ---- f16 / bf16 ----

fn pow2(k: i32) -> f64 {
    f64::from_bits(((k + 1023) as u64) << 52)
}

/// Rounds `x` to a binary format with `p` significand bits, minimum normal exponent `emin` and largest finite
/// `max` (ties to even, overflow to infinity): the same single rounding as the reference.
fn round_to_format(x: f64, p: i32, emin: i32, max: f64) -> f64 {
    if !x.is_finite() || x == 0.0 {
        return x;
    }
    let a = x.abs();
    let e = ((a.to_bits() >> 52) as i32) - 1023;
    let q = e.max(emin) - (p - 1);
    let r = (a * pow2(-q)).round_ties_even() * pow2(q);
    let r = if r > max { f64::INFINITY } else { r };
    r.copysign(x)
}

const F16_MAX: f64 = 65504.0;
const BF16_MAX: f64 = 3.389_531_389_251_535_5e38;

/// `x` rounded once to `dtype` (identity for f64 and non-float types).
pub(crate) fn round_to(dtype: DType, x: f64) -> f64 {
    match dtype {
        DType::F32 => x as f32 as f64,
        DType::F16 => round_to_format(x, 11, -14, F16_MAX),
        DType::BF16 => round_to_format(x, 8, -126, BF16_MAX),
        _ => x,
    }
}

pub(crate) fn f16_to_f32(h: u16) -> f32 {
    let exp = i32::from((h >> 10) & 0x1f);
    let man = f64::from(h & 0x3ff);
    let mag = match exp {
        0 => man * pow2(-24),
        31 if man == 0.0 => f64::INFINITY,
        31 => f64::NAN,
        _ => (1024.0 + man) * pow2(exp - 25),
    };
    (if h & 0x8000 != 0 { -mag } else { mag }) as f32
}

/// An f16 value (already representable) to its bits; NaN becomes `0x7e00` with the sign.
pub(crate) fn f64_to_f16(x: f64) -> u16 {
    let sign: u16 = if x.is_sign_negative() { 0x8000 } else { 0 };
    if x.is_nan() {
        return sign | 0x7e00;
    }
    let r = round_to(DType::F16, x).abs();
    if r.is_infinite() {
        sign | 0x7c00
    } else if r < pow2(-14) {
        sign | (r * pow2(24)) as u16
    } else {
        let e = ((r.to_bits() >> 52) as i32) - 1023;
        let man = (r * pow2(10 - e)) as u16 - 1024;
        sign | (((e + 15) as u16) << 10) | man
    }
}

pub(crate) fn f64_to_bf16(x: f64) -> u16 {
    if x.is_nan() {
        return if x.is_sign_negative() { 0xffc0 } else { 0x7fc0 };
    }
    ((round_to(DType::BF16, x) as f32).to_bits() >> 16) as u16
}

/// Integer to float `dtype` with one rounding (never through f64 for the narrow types).
fn int_to_float(dtype: DType, x: i64) -> f64 {
    fn round_int(x: i64, p: u32) -> f64 {
        let a = x.unsigned_abs();
        let bits = 64 - a.leading_zeros();
        let mag = if bits <= p {
            a as f64
        } else {
            let shift = bits - p;
            let mut q = a >> shift;
            let rem = a & ((1u64 << shift) - 1);
            let half = 1u64 << (shift - 1);
            if rem > half || (rem == half && q & 1 == 1) {
                q += 1;
            }
            q as f64 * pow2(shift as i32)
        };
        if x < 0 { -mag } else { mag }
    }
    match dtype {
        DType::F32 => x as f32 as f64,
        DType::F16 => {
            let r = round_int(x, 11);
            if r.abs() > F16_MAX {
                f64::INFINITY.copysign(r)
            } else {
                r
            }
        }
        DType::BF16 => round_int(x, 8),
        _ => x as f64,
    }
}

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

// ---- erf (f64, a few f64 ulps; rounded to f32 it is almost always the correctly rounded value) ----

fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let a = x.abs();
    let r = if a < 3.0 {
        // A&S 7.1.6: erf(a) = 2/sqrt(pi) exp(-a^2) sum 2^n a^(2n+1) / (1*3*...*(2n+1)); positive terms.
        let f = 2.0 * a * a;
        let (mut t, mut s, mut d) = (a, a, 3.0);
        for _ in 0..200 {
            t *= f / d;
            s += t;
            d += 2.0;
            if t <= s * 1e-17 {
                break;
            }
        }
        std::f64::consts::FRAC_2_SQRT_PI * (-a * a).exp() * s
    } else if a < 6.0 {
        // erfc by its continued fraction (modified Lentz).
        let (mut f, mut c, mut d) = (a, a, 0.0f64);
        for n in 1..2000 {
            let an = f64::from(n) * 0.5;
            d = a + an * d;
            if d == 0.0 {
                d = 1e-300;
            }
            d = 1.0 / d;
            c = a + an / c;
            if c == 0.0 {
                c = 1e-300;
            }
            let delta = c * d;
            f *= delta;
            if (delta - 1.0).abs() < 1e-16 {
                break;
            }
        }
        1.0 - (-a * a).exp() / (std::f64::consts::PI.sqrt() * f)
    } else {
        1.0
    };
    r.copysign(x)
}

fn unary_f64(op: UnOp, x: f64) -> f64 {
    match op {
        UnOp::Neg => -x,
        UnOp::Abs => x.abs(),
        UnOp::Exp => x.exp(),
        UnOp::Log => x.ln(),
        UnOp::Tanh => x.tanh(),
        UnOp::Erf => erf(x),
        UnOp::Sqrt => x.sqrt(),
        UnOp::Rsqrt => 1.0 / x.sqrt(),
        UnOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        UnOp::Not => x,
    }
}

// ---- the symbols ----

/// `out[i] = a[i] op b[i]` over `n` f32 (`op`: 0 add, 1 sub, 2 mul, 3 div), IEEE single precision rounded to
/// nearest as the JIT's own four-lane loop computes it (so the same bits); `mode` 1: `b` is the scalar `s`
/// (every element), 2: `a` is. The loops below, which the native GEMM epilogues run too: sixteen lanes where
/// the CPU has AVX-512F.
///
/// # Safety
/// `a` (unless `mode` 2), `b` (unless `mode` 1) readable and `out` writable for `n` f32, `out` overlapping
/// neither (the JIT gives every operation's result a tile of its own).
pub(crate) unsafe extern "C" fn loom_bin_tile(
    op: u32,
    a: *const f32,
    b: *const f32,
    s: f32,
    out: *mut f32,
    n: u64,
    mode: u32,
) {
    let n = n as usize;
    let op = match op {
        0 => BinOp::Add,
        1 => BinOp::Sub,
        2 => BinOp::Mul,
        _ => BinOp::Div,
    };
    // SAFETY: the caller's contract (extents, no overlap with `out`).
    let (o, x, y) = unsafe {
        (
            std::slice::from_raw_parts_mut(out, n),
            (mode != 2).then(|| std::slice::from_raw_parts(a, n)),
            (mode != 1).then(|| std::slice::from_raw_parts(b, n)),
        )
    };
    let args = match (x, y) {
        (Some(x), Some(y)) => BinArgs::VV(x, y),
        (Some(x), None) => BinArgs::VS(x, s),
        (None, Some(y)) => BinArgs::SV(s, y),
        (None, None) => return,
    };
    bin_best(op, args, o);
}

/// The operands of a binary tile loop: two rows, a row and a scalar, or a scalar and a row.
#[derive(Clone, Copy)]
pub(crate) enum BinArgs<'a> {
    VV(&'a [f32], &'a [f32]),
    VS(&'a [f32], f32),
    SV(f32, &'a [f32]),
}

/// `o[i] = a[i] op b[i]` over as many lanes as the CPU has: 16 with AVX-512F, 8 with AVX2, else the
/// baseline's. The same IEEE operation on each element whatever the width, so the same bits.
pub(crate) fn bin_best(op: BinOp, args: BinArgs<'_>, o: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the feature is present.
            return unsafe { bin_512(op, args, o) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the feature is present.
            return unsafe { bin_256(op, args, o) };
        }
    }
    bin_any(op, args, o)
}

#[inline(always)]
fn bin_any(op: BinOp, args: BinArgs<'_>, o: &mut [f32]) {
    match args {
        BinArgs::VV(a, b) => bin_vv(op, a, b, o),
        BinArgs::VS(a, c) => bin_vs(op, a, c, o),
        BinArgs::SV(c, b) => bin_sv(op, c, b, o),
    }
}

/// The binary loops compiled for 16 lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn bin_512(op: BinOp, args: BinArgs<'_>, o: &mut [f32]) {
    bin_any(op, args, o)
}

/// The binary loops compiled for 8 lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn bin_256(op: BinOp, args: BinArgs<'_>, o: &mut [f32]) {
    bin_any(op, args, o)
}

macro_rules! bin_loops {
    ($name:ident, $a:ty, $b:ty, $zip:ident) => {
        #[inline(always)]
        fn $name(op: BinOp, a: $a, b: $b, o: &mut [f32]) {
            match op {
                BinOp::Add => $zip(o, a, b, |x, y| x + y),
                BinOp::Sub => $zip(o, a, b, |x, y| x - y),
                BinOp::Mul => $zip(o, a, b, |x, y| x * y),
                _ => $zip(o, a, b, |x, y| x / y),
            }
        }
    };
}

#[inline(always)]
fn zip_vv(o: &mut [f32], a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32) {
    for ((y, &x), &z) in o.iter_mut().zip(a).zip(b) {
        *y = f(x, z);
    }
}

#[inline(always)]
fn zip_vs(o: &mut [f32], a: &[f32], c: f32, f: impl Fn(f32, f32) -> f32) {
    for (y, &x) in o.iter_mut().zip(a) {
        *y = f(x, c);
    }
}

#[inline(always)]
fn zip_sv(o: &mut [f32], c: f32, b: &[f32], f: impl Fn(f32, f32) -> f32) {
    for (y, &z) in o.iter_mut().zip(b) {
        *y = f(c, z);
    }
}

bin_loops!(bin_vv, &[f32], &[f32], zip_vv);
bin_loops!(bin_vs, &[f32], f32, zip_vs);
bin_loops!(bin_sv, f32, &[f32], zip_sv);

/// Float unary op over a tile: `f32` storage for f32/f16/bf16, `f64` storage for f64.
pub(crate) extern "C" fn loom_unary_tile(
    op: u32,
    dtype: u32,
    src: *const u8,
    dst: *mut u8,
    n: u64,
) {
    let (op, dtype) = (unop_of(op), dtype_of(dtype));
    let n = n as usize;
    if dtype == DType::F64 {
        // SAFETY: the lowering passes scratch regions of `n` f64 elements (8-byte aligned offsets).
        let (s, d) = unsafe {
            (
                std::slice::from_raw_parts(src as *const f64, n),
                dst as *mut f64,
            )
        };
        for (i, &x) in s.iter().enumerate() {
            // SAFETY: i < n, inside the destination region; src and dst may be equal, so write through a pointer.
            unsafe { d.add(i).write(unary_f64(op, x)) };
        }
    } else {
        // SAFETY: as above, with f32 elements.
        let (s, d) = unsafe {
            (
                std::slice::from_raw_parts(src as *const f32, n),
                dst as *mut f32,
            )
        };
        // f32 `exp`, `erf` and `sigmoid` are the hot transcendental functions of real models (attention's
        // softmax, GELU, SiLU): they run in f32, vectorised (`vmath::tile`: exp <= 1 ulp, erf and sigmoid
        // <= 2 ulp) instead of an f64
        // function rounded once, inside the 2 ulp the backend promises for transcendental functions.
        match (op, dtype) {
            (UnOp::Exp, DType::F32) => {
                // SAFETY: as above; `vmath::tile` allows src == dst.
                unsafe { crate::vmath::tile(crate::vmath::Fun::Exp, src as *const f32, d, n) };
                return;
            }
            (UnOp::Erf, DType::F32) => {
                // SAFETY: as above.
                unsafe { crate::vmath::tile(crate::vmath::Fun::Erf, src as *const f32, d, n) };
                return;
            }
            (UnOp::Sigmoid, DType::F32) => {
                // SiLU's gate (SmolLM2's FFN: 1536 a token row a layer). SAFETY: as above.
                unsafe { crate::vmath::tile(crate::vmath::Fun::Sigmoid, src as *const f32, d, n) };
                return;
            }
            _ => {}
        }
        for (i, &x) in s.iter().enumerate() {
            let r = round_to(dtype, unary_f64(op, f64::from(x))) as f32;
            // SAFETY: as above.
            unsafe { d.add(i).write(r) };
        }
    }
}

pub(crate) extern "C" fn loom_unary_scalar(op: u32, dtype: u32, x: f64) -> f64 {
    round_to(dtype_of(dtype), unary_f64(unop_of(op), x))
}

/// Rounds f32-stored values of an f16/bf16 tile to their dtype in place (after an f32 computation).
pub(crate) extern "C" fn loom_round_tile(dtype: u32, ptr: *mut u8, n: u64) {
    let dtype = dtype_of(dtype);
    // SAFETY: the lowering passes a scratch region of `n` f32 elements.
    let s = unsafe { std::slice::from_raw_parts_mut(ptr as *mut f32, n as usize) };
    for x in s {
        *x = round_to(dtype, f64::from(*x)) as f32;
    }
}

pub(crate) extern "C" fn loom_round_scalar(dtype: u32, x: f32) -> f32 {
    round_to(dtype_of(dtype), f64::from(x)) as f32
}

pub(crate) extern "C" fn loom_fmod(a: f64, b: f64) -> f64 {
    a % b
}

pub(crate) extern "C" fn loom_half_to_f32(dtype: u32, bits: u32) -> f32 {
    match dtype_of(dtype) {
        // A signalling NaN arrives quiet (payload kept), as the reference's value does.
        DType::BF16 => {
            let x = f32::from_bits(bits << 16);
            if x.is_nan() {
                f32::from_bits((bits << 16) | 0x0040_0000)
            } else {
                x
            }
        }
        _ => f16_to_f32(bits as u16),
    }
}

pub(crate) extern "C" fn loom_f32_to_half(dtype: u32, x: f32) -> u32 {
    match dtype_of(dtype) {
        DType::BF16 => u32::from(f64_to_bf16(f64::from(x))),
        _ => u32::from(f64_to_f16(f64::from(x))),
    }
}

/// The storage-class bits of a value: f32 bits (zero-extended), f64 bits or the i64 itself.
fn get_f(dtype: DType, bits: u64) -> f64 {
    if dtype == DType::F64 {
        f64::from_bits(bits)
    } else {
        f64::from(f32::from_bits(bits as u32))
    }
}

fn put_f(dtype: DType, x: f64) -> u64 {
    if dtype == DType::F64 {
        x.to_bits()
    } else {
        u64::from((x as f32).to_bits())
    }
}

/// A cast with the reference's semantics, on storage-class bits.
fn cast_bits(from: DType, to: DType, bits: u64) -> u64 {
    if from.is_float() {
        let x = get_f(from, bits);
        if to.is_float() {
            put_f(to, round_to(to, x))
        } else if to == DType::I1 {
            u64::from(x != 0.0)
        } else {
            let (lo, hi) = to.int_range();
            let r = if x.is_nan() {
                0
            } else if x <= lo as f64 {
                lo
            } else if x >= hi as f64 {
                hi
            } else {
                x.trunc() as i64
            };
            r as u64
        }
    } else {
        let x = bits as i64;
        if to.is_float() {
            put_f(to, int_to_float(to, x))
        } else if to == DType::I1 {
            u64::from(x != 0)
        } else {
            wrap(to, x) as u64
        }
    }
}

pub(crate) extern "C" fn loom_cast_scalar(from: u32, to: u32, bits: u64) -> u64 {
    cast_bits(dtype_of(from), dtype_of(to), bits)
}

fn class_size(d: DType) -> usize {
    match d {
        DType::F32 | DType::F16 | DType::BF16 => 4,
        _ => 8,
    }
}

/// # Safety contract
/// `src`/`dst` cover `n` elements of the storage class of `from`/`to`.
pub(crate) extern "C" fn loom_cast_tile(from: u32, to: u32, src: *const u8, dst: *mut u8, n: u64) {
    let to_code = to;
    let (from, to) = (dtype_of(from), dtype_of(to));
    let (fs, ts) = (class_size(from), class_size(to));
    if from == DType::F32 && matches!(to, DType::F16 | DType::BF16) {
        // f32 rounded to f16/bf16 (kept in f32 storage): through the halves and back in chunks, sixteen lanes
        // at a time (`loom_copy_half`); NaN inputs take the reference's cast one by one (their payloads).
        let (mut xs, mut half) = ([0u32; 64], [0u16; 64]);
        let mut i = 0usize;
        while i < n as usize {
            let k = (n as usize - i).min(64);
            // SAFETY: i + k <= n: inside both regions (f32 storage, 4 bytes each); the chunk is copied out
            // before anything is written (src may be dst); `xs` and `half` hold k elements.
            unsafe {
                std::ptr::copy_nonoverlapping(src.add(4 * i), xs.as_mut_ptr() as *mut u8, 4 * k);
                loom_copy_half(
                    half.as_mut_ptr() as *mut u8,
                    xs.as_ptr() as *const u8,
                    k as u64,
                    to_code,
                    0,
                );
                loom_copy_half(
                    dst.add(4 * i),
                    half.as_ptr() as *const u8,
                    k as u64,
                    to_code,
                    1,
                );
                for (j, &x) in xs[..k].iter().enumerate() {
                    if f32::from_bits(x).is_nan() {
                        let r = cast_bits(from, to, u64::from(x));
                        (dst.add(4 * (i + j)) as *mut u32).write_unaligned(r as u32);
                    }
                }
            }
            i += k;
        }
        return;
    }
    for i in 0..n as usize {
        // SAFETY: i < n and the regions cover n elements of their class size (see the contract above).
        unsafe {
            let bits = if fs == 4 {
                u64::from((src.add(i * 4) as *const u32).read_unaligned())
            } else {
                (src.add(i * 8) as *const u64).read_unaligned()
            };
            let r = cast_bits(from, to, bits);
            if ts == 4 {
                (dst.add(i * 4) as *mut u32).write_unaligned(r as u32);
            } else {
                (dst.add(i * 8) as *mut u64).write_unaligned(r);
            }
        }
    }
}

/// `row` folded with `f` over eight interleaved lanes, then the lanes and the remainder (for max and min,
/// where the order does not change the result).
#[inline(always)]
fn fold8(row: &[f32], init: f32, f: impl Fn(f32, f32) -> f32 + Copy) -> f32 {
    let mut acc = [init; 8];
    let chunks = row.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for j in 0..8 {
            acc[j] = f(acc[j], c[j]);
        }
    }
    rest.iter()
        .fold(acc.iter().copied().fold(init, f), |a, &x| f(a, x))
}

/// The portable f32 row sum: eight f64 lanes in index order, then the lanes in order, then the remainder in
/// order (`rows::reduce_rows` adds in this order too, bit for bit).
#[inline(always)]
pub(crate) fn sum_row_f64(row: &[f32]) -> f64 {
    let mut acc = [0f64; 8];
    let chunks = row.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for j in 0..8 {
            acc[j] += f64::from(c[j]);
        }
    }
    let mut t: f64 = acc.iter().sum();
    for &x in rest {
        t += f64::from(x);
    }
    t
}

/// [`loom_reduce`] along contiguous rows (`inner == 1`, f32 storage): `d[o]` of `s[o * len..][..len]`. Sums
/// add eight f64 lanes in index order, then the lanes, then the remainder ([`sum_row_f64`]); maxima and minima
/// fold eight f32 lanes ([`fold8`]: exact, so equal to the f64 fold rounded back; NaNs are ignored by both, as
/// IEEE maxNum/minNum). Each result is rounded once to `dtype`.
#[inline(always)]
fn reduce_contiguous(dtype: DType, sum: bool, max: bool, s: &[f32], d: &mut [f32], len: usize) {
    for (o, out) in d.iter_mut().enumerate() {
        let row = &s[o * len..(o + 1) * len];
        let r = if sum {
            // The reference adds in index order; with 2^29 headroom of f64 over f32 products this reordering
            // changes the f64 sum by far less than an f32 ulp for realistic lengths.
            sum_row_f64(row)
        } else if max {
            f64::from(fold8(row, f32::NEG_INFINITY, f32::max))
        } else {
            f64::from(fold8(row, f32::INFINITY, f32::min))
        };
        *out = round_to(dtype, r) as f32;
    }
}

/// [`reduce_contiguous`] compiled for AVX2: the same order and bits in wider registers.
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn reduce_contiguous_avx2(
    dtype: DType,
    sum: bool,
    max: bool,
    s: &[f32],
    d: &mut [f32],
    len: usize,
) {
    reduce_contiguous(dtype, sum, max, s, d, len)
}

/// Reduction over the middle axis of `[outer, len, inner]`; float sums accumulate in f64 in index order and
/// round once (as the reference does), so they match it bit for bit.
pub(crate) extern "C" fn loom_reduce(
    op: u32,
    dtype: u32,
    src: *const u8,
    dst: *mut u8,
    outer: u64,
    len: u64,
    inner: u64,
) {
    let dtype = dtype_of(dtype);
    let (outer, len, inner) = (outer as usize, len as usize, inner as usize);
    let total = outer * len * inner;
    let sum = op == reduce_code(ReduceOp::Sum);
    let max = op == reduce_code(ReduceOp::Max);
    if dtype.is_float() {
        if dtype == DType::F64 {
            // SAFETY: the lowering passes a source region of outer*len*inner f64 and a destination of outer*inner.
            let (s, d) = unsafe {
                (
                    std::slice::from_raw_parts(src as *const f64, total),
                    std::slice::from_raw_parts_mut(dst as *mut f64, outer * inner),
                )
            };
            for o in 0..outer {
                for i in 0..inner {
                    let it = (0..len).map(|l| s[(o * len + l) * inner + i]);
                    d[o * inner + i] = if sum {
                        it.sum::<f64>()
                    } else if max {
                        it.fold(f64::NEG_INFINITY, f64::max)
                    } else {
                        it.fold(f64::INFINITY, f64::min)
                    };
                }
            }
        } else {
            // SAFETY: as above with f32 storage.
            let (s, d) = unsafe {
                (
                    std::slice::from_raw_parts(src as *const f32, total),
                    std::slice::from_raw_parts_mut(dst as *mut f32, outer * inner),
                )
            };
            #[cfg(target_arch = "x86_64")]
            if inner == 1
                && (sum || max)
                && dtype == DType::F32
                && std::arch::is_x86_feature_detected!("avx512f")
            {
                // SAFETY: AVX-512F is present; the regions are as above (outer rows of len f32, outer f32).
                unsafe {
                    crate::rows::reduce_rows(max, src as *const f32, dst as *mut f32, outer, len)
                };
                return;
            }
            if inner == 1 {
                #[cfg(target_arch = "x86_64")]
                if crate::rows::Isa::Avx2.supported() {
                    // SAFETY: AVX2 and FMA are present.
                    unsafe { reduce_contiguous_avx2(dtype, sum, max, s, d, len) };
                    return;
                }
                reduce_contiguous(dtype, sum, max, s, d, len);
                return;
            }
            for o in 0..outer {
                for i in 0..inner {
                    let it = (0..len).map(|l| f64::from(s[(o * len + l) * inner + i]));
                    let r = if sum {
                        it.sum::<f64>()
                    } else if max {
                        it.fold(f64::NEG_INFINITY, f64::max)
                    } else {
                        it.fold(f64::INFINITY, f64::min)
                    };
                    d[o * inner + i] = round_to(dtype, r) as f32;
                }
            }
        }
    } else {
        let (lo, hi) = dtype.int_range();
        // SAFETY: integer tiles are stored as i64; regions as above.
        let (s, d) = unsafe {
            (
                std::slice::from_raw_parts(src as *const i64, total),
                std::slice::from_raw_parts_mut(dst as *mut i64, outer * inner),
            )
        };
        for o in 0..outer {
            for i in 0..inner {
                let it = (0..len).map(|l| s[(o * len + l) * inner + i]);
                d[o * inner + i] = if sum {
                    wrap(dtype, it.fold(0i64, i64::wrapping_add))
                } else if max {
                    it.fold(lo, i64::max)
                } else {
                    it.fold(hi, i64::min)
                };
            }
        }
    }
}

thread_local! {
    /// Each thread's f32 copies of a dot's f16/bf16 view operands (`a`, `b`), kept between calls.
    static HALF_ROWS: std::cell::Cell<[Vec<f32>; 2]> = const { std::cell::Cell::new([Vec::new(), Vec::new()]) };
}

/// `out = acc + a @ b` on scratch tiles: `a` `[m, k]`, `b` `[k, n]` in f32 storage (f32/f16/bf16 values) or
/// f64 storage (`wide` bit 0), `acc`/`out` `[m, n]` f32. `wide` bit 1: `b` is held transposed, as `[n, k]`
/// (f32 only); bit 2: `acc` is all +0.0, so `out` is the product alone (f32 only). `lda`/`ldb`: the
/// elements between rows of `a` and of `b` as held (f32 only; a view's rows lie in a buffer, in place; f64
/// operands are always contiguous). Bits 3-4 and 5-6: `a` and `b` are views of f16 (1) or bf16 (2) rows,
/// converted to f32 first. The f32 case runs [`crate::kernels::small_dot`] for a few rows, the `gemm` crate's
/// microkernels otherwise.
pub(crate) extern "C" fn loom_dot(
    wide: u32,
    a: *const u8,
    b: *const u8,
    acc: *const u8,
    out: *mut u8,
    m: u64,
    k: u64,
    n: u64,
    lda: u64,
    ldb: u64,
) {
    let (m, k, n, mut lda, mut ldb) = (
        m as usize,
        k as usize,
        n as usize,
        lda as usize,
        ldb as usize,
    );
    // Bits 3-4 / 5-6: `a` / `b` is a view of f16 (1) or bf16 (2) rows in the buffer (`jit.rs`): converted into
    // this thread's f32 copies first (rows of the operand's stored width, contiguous), so the rest reads f32.
    let (a_kind, b_kind) = ((wide >> 3) & 3, (wide >> 5) & 3);
    let mut a = a;
    let mut b = b;
    if a_kind | b_kind != 0 {
        let bt = wide & 2 != 0;
        // An operand's stored shape: a is [m, k]; b is [k, n], or [n, k] when held transposed.
        let (b_rows, b_cols) = if bt { (n, k) } else { (k, n) };
        HALF_ROWS.with(|cell| {
            let mut bufs = cell.take();
            for (kind, ptr, ld, rows, cols, slot) in [
                (a_kind, &mut a, &mut lda, m, k, 0usize),
                (b_kind, &mut b, &mut ldb, b_rows, b_cols, 1),
            ] {
                if kind == 0 {
                    continue;
                }
                let code = dtype_code(if kind == 1 { DType::F16 } else { DType::BF16 });
                let buf = &mut bufs[slot];
                buf.clear();
                buf.reserve(rows * cols);
                // Contiguous rows (a page's block) in one call, strided ones row by row.
                let (calls, per) = if *ld == cols {
                    (1, rows * cols)
                } else {
                    (rows, cols)
                };
                for r in 0..calls {
                    // SAFETY: the view's row r holds `cols` halves at `*ptr + r * ld * 2` (the caller's
                    // bounds test; with one call the rows are back to back), and `buf` has room for
                    // rows * cols f32, every one of which these calls write.
                    unsafe {
                        loom_copy_half(
                            buf.as_mut_ptr().add(r * cols) as *mut u8,
                            ptr.add(r * *ld * 2),
                            per as u64,
                            code,
                            1,
                        )
                    };
                }
                // SAFETY: the calls above wrote all rows * cols values.
                unsafe { buf.set_len(rows * cols) };
                *ptr = buf.as_ptr() as *const u8;
                *ld = cols;
            }
            // The pointers above stay valid: the buffers go back into the cell untouched (moved, not freed)
            // and are only reused by this thread's next dot.
            cell.set(bufs);
        });
    }
    // Bit 2: `acc` is a tile of +0.0 (f32): the product is written, not accumulated.
    let zero = wide & 4 != 0 && wide & 1 == 0;
    if !zero && !std::ptr::eq(acc, out) {
        // SAFETY: acc and out are distinct scratch regions of m*n f32.
        unsafe { std::ptr::copy_nonoverlapping(acc, out, m * n * 4) };
    }
    if wide & 1 != 0 {
        // SAFETY: f64 storage of m*k and k*n elements; out holds m*n f32.
        let (a, b, o) = unsafe {
            (
                std::slice::from_raw_parts(a as *const f64, m * k),
                std::slice::from_raw_parts(b as *const f64, k * n),
                std::slice::from_raw_parts_mut(out as *mut f32, m * n),
            )
        };
        for i in 0..m {
            for j in 0..n {
                let mut s = f64::from(o[i * n + j]);
                for kk in 0..k {
                    s += a[i * k + kk] * b[kk * n + j];
                }
                o[i * n + j] = s as f32;
            }
        }
        return;
    }
    if crate::kernels::small_dot(
        m,
        n,
        k,
        out as *mut f32,
        a as *const f32,
        lda,
        b as *const f32,
        ldb,
        wide & 2 != 0,
        !zero,
    ) {
        return;
    }
    if wide & 2 != 0 {
        // b held transposed, as [n, k] (a transpose that only dots read).
        crate::kernels::sgemm_strided(
            m,
            n,
            k,
            out as *mut f32,
            n,
            a as *const f32,
            lda,
            b as *const f32,
            ldb as isize,
            1,
            !zero,
        );
        return;
    }
    crate::kernels::sgemm(
        m,
        n,
        k,
        out as *mut f32,
        n,
        a as *const f32,
        lda,
        b as *const f32,
        ldb,
        !zero,
    );
}

/// Element `g` of a block-quantised buffer starting at `base`, dequantised bit for bit like ggml.
pub(crate) extern "C" fn loom_dequant(dtype: u32, base: *const u8, g: u64) -> f32 {
    let dtype = dtype_of(dtype);
    let Some((per, size)) = dtype.block() else {
        return f32::NAN;
    };
    let g = g as usize;
    let (per, size) = (per as usize, size as usize);
    // SAFETY: the lowering only passes `g` inside the buffer's (validated) logical shape, so block g / per lies
    // inside the buffer.
    let blk = unsafe { std::slice::from_raw_parts(base.add(g / per * size), size) };
    crate::quant::dequant_in_block(dtype, blk, g % per)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `loom_copy_half` in both directions and both dtypes, bit for bit against the scalar conversions:
    /// every half bit pattern (NaN payloads, infinities, subnormals) loaded, and f32 values around every
    /// rounding case stored (ties, overflow to infinity, subnormal results, NaN payloads), at lengths with and
    /// without a tail.
    #[test]
    fn half_rows_convert_as_the_scalar_functions() {
        for isa in [HalfIsa::Scalar, HalfIsa::Avx2, HalfIsa::Avx512] {
            if isa.supported() {
                half_rows_convert_on(isa);
            }
        }
    }

    fn half_rows_convert_on(isa: HalfIsa) {
        let copy = |dst: *mut u8, src: *const u8, n: usize, code: u32, load: bool| {
            // SAFETY: the callers pass regions of n elements; the CPU has `isa` (`supported`).
            unsafe { copy_half_on(isa, dst, src, n, code, load) }
        };
        for dt in [DType::F16, DType::BF16] {
            let code = dtype_code(dt);
            let halves: Vec<u16> = (0..=u16::MAX).collect();
            let mut f = vec![0f32; halves.len()];
            copy(
                f.as_mut_ptr() as *mut u8,
                halves.as_ptr() as *const u8,
                halves.len(),
                code,
                true,
            );
            for (&h, &x) in halves.iter().zip(&f) {
                assert_eq!(
                    x.to_bits(),
                    loom_half_to_f32(code, u32::from(h)).to_bits(),
                    "{isa:?} {dt:?} load {h:#06x}"
                );
            }
            let mut xs: Vec<f32> = f.clone();
            let mut r = 0x2545_f491_4f6c_dd1du64;
            for _ in 0..100_000 {
                r ^= r << 13;
                r ^= r >> 7;
                r ^= r << 17;
                xs.push(f32::from_bits(r as u32));
            }
            for b in [
                0x7f7f_ffffu32,
                0x477f_f000,
                0x477f_efff,
                0x3380_0000,
                0x3300_0001,
                0x7f80_0001,
                0xffc0_1234,
            ] {
                xs.push(f32::from_bits(b));
            }
            xs.push(1.0);
            for n in [xs.len(), 37, 15] {
                let mut h = vec![0u16; n];
                copy(
                    h.as_mut_ptr() as *mut u8,
                    xs.as_ptr() as *const u8,
                    n,
                    code,
                    false,
                );
                for (&x, &got) in xs.iter().zip(&h) {
                    assert_eq!(
                        got,
                        loom_f32_to_half(code, x) as u16,
                        "{isa:?} {dt:?} store {:#010x}",
                        x.to_bits()
                    );
                }
            }
        }
    }

    /// `f16_to_f32` against the CPU's F16C conversion for every finite f16.
    #[test]
    fn f16_conversion_is_exact() {
        for h in 0..=u16::MAX {
            let e = (h >> 10) & 0x1f;
            if e == 31 {
                continue;
            }
            #[cfg(target_arch = "x86_64")]
            if std::is_x86_feature_detected!("f16c") {
                // SAFETY: f16c detected.
                let want = unsafe {
                    use std::arch::x86_64::*;
                    #[target_feature(enable = "f16c")]
                    unsafe fn cvt(h: u16) -> f32 {
                        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(h))))
                    }
                    cvt(h)
                };
                assert_eq!(f16_to_f32(h).to_bits(), want.to_bits(), "{h:#06x}");
            }
        }
    }
}
