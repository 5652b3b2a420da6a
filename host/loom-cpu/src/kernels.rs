//! The contraction provider: f32 GEMM through the `gemm` crate (its AVX-512 microkernels with `x86-v4`),
//! split over rows (or columns, for wide and short products) for several threads.

#[cfg(target_arch = "x86_64")]
use crate::rows::Isa;

/// `c[m, n] (+)= a[m, k] @ b[k, n]`, row-major with the given row strides (in elements); with `accumulate`
/// the product is added to `c`, otherwise it overwrites it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn sgemm(
    m: usize,
    n: usize,
    k: usize,
    c: *mut f32,
    ldc: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    accumulate: bool,
) {
    sgemm_strided(m, n, k, c, ldc, a, lda, b, 1, ldb as isize, accumulate)
}

/// [`sgemm`] with `b`'s element `(k, n)` at `b + k * b_rs + n * b_cs` (so `b_cs = K, b_rs = 1` reads a
/// row-major `[N, K]` matrix as its transpose).
#[allow(clippy::too_many_arguments)]
pub(crate) fn sgemm_strided(
    m: usize,
    n: usize,
    k: usize,
    c: *mut f32,
    ldc: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    b_cs: isize,
    b_rs: isize,
    accumulate: bool,
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                // SAFETY: row i of c has n elements at stride ldc (caller's contract).
                unsafe { std::ptr::write_bytes(c.add(i * ldc), 0, n) };
            }
        }
        return;
    }
    // SAFETY: the caller passes non-aliasing, f32-aligned matrices of the stated shapes and strides; the
    // gemm crate only reads a/b and writes c inside those extents. dst := 1*dst + 1*a@b (alpha applies to
    // the destination when read_dst is set, beta to the product).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c,
            1,
            ldc as isize,
            accumulate,
            a,
            1,
            lda as isize,
            b,
            b_cs,
            b_rs,
            1.0f32,
            1.0f32,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}

/// Products with at least this many rows of A run on AMX tiles where the operator opted in (`amx.rs`). Below
/// it packing B (the weights, read cold from memory in a served model) costs about what the tiles save:
/// MiniLM requests of 8 sentences (~300 rows) measured no faster through the server, requests of 32 (~1,200
/// rows) ~1.2x (BENCHMARKS.md).
#[cfg(target_arch = "x86_64")]
const AMX_MIN_ROWS: usize = 512;

/// Raw pointers that may cross into the worker threads of [`sgemm_threads`].
#[derive(Clone, Copy)]
struct Ptrs(*mut f32, *const f32, *const f32);
// SAFETY: each worker gets disjoint row (or column) blocks of c and only reads a and b.
unsafe impl Send for Ptrs {}
// SAFETY: as above; the pool calls the block closure from several threads at once, each with its own block.
unsafe impl Sync for Ptrs {}

/// [`sgemm`] over `threads` workers, each owning a contiguous block of rows of `c`, or of columns when `n > m`
/// (no accumulation); with
/// `trans_b`, `b` is a row-major `[N, K]` matrix and the product is `a @ b^T`.
pub(crate) fn sgemm_threads(
    m: usize,
    n: usize,
    k: usize,
    c: *mut f32,
    a: *const f32,
    b: *const f32,
    trans_b: bool,
    threads: usize,
) {
    let (b_cs, b_rs) = if trans_b {
        (k as isize, 1)
    } else {
        (1, n as isize)
    };
    #[cfg(target_arch = "x86_64")]
    if m >= AMX_MIN_ROWS && crate::amx::enabled() {
        // SAFETY: AMX is present and permitted (`enabled` implies `hardware`); the caller's contract (shapes,
        // no overlap of c with a or b).
        unsafe { crate::amx::sgemm(m, n, k, c, a, b, b_cs, b_rs, threads.max(1)) };
        return;
    }
    // At least 512 K multiply-adds (~4 us) per thread: the pool's round trip is ~0.5 us with the worker
    // spinning and ~10-13 us when it has parked (`LOOM_BENCH=pool`); was 1 M for a thread spawn per call.
    let threads = threads
        .clamp(1, m.max(n).max(1))
        .min((m * n * k / (1 << 19)).max(1));
    if threads <= 1 {
        sgemm_strided(m, n, k, c, n, a, k, b, b_cs, b_rs, false);
        return;
    }
    let p = Ptrs(c, a, b);
    if n > m {
        // Wide and short (a BERT-style 128 x 384 x 1536): column blocks, so that each thread packs only its
        // part of `b`, the larger operand (row blocks would have every thread pack all of it).
        let cols = n.div_ceil(threads).div_ceil(16) * 16;
        let block = move |t: usize| {
            let p = p;
            let c0 = t * cols;
            if c0 < n {
                let w = cols.min(n - c0);
                // SAFETY: columns c0..c0+w are inside n; `c + c0` keeps row stride n, `b`'s column c0 starts
                // at `b + c0 * b_cs` (b_cs is 1 or k), so every access stays inside the matrices.
                let (c, b) = unsafe { (p.0.add(c0), p.2.offset(c0 as isize * b_cs)) };
                sgemm_strided(m, w, k, c, n, p.1, k, b, b_cs, b_rs, false);
            }
        };
        let blocks = n.div_ceil(cols);
        crate::pool::run(blocks, blocks - 1, &block);
        return;
    }
    // Row blocks rounded up to 16 rows keep the microkernel's M panels full.
    let rows = m.div_ceil(threads).div_ceil(16) * 16;
    let block = move |t: usize| {
        let p = p;
        let r0 = t * rows;
        if r0 < m {
            let r = rows.min(m - r0);
            // SAFETY: rows r0..r0+r are inside m; offsets stay inside the matrices.
            let (c, a) = unsafe { (p.0.add(r0 * n), p.1.add(r0 * k)) };
            sgemm_strided(r, n, k, c, n, a, k, p.2, b_cs, b_rs, false);
        }
    };
    // Row blocks on the persistent pool; the calling thread takes part.
    let blocks = m.div_ceil(rows);
    crate::pool::run(blocks, blocks - 1, &block);
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "x86_64")]
    use super::{Isa, small_dot_on};

    /// The instruction sets of `small_dot` this CPU runs.
    #[cfg(target_arch = "x86_64")]
    fn isas() -> Vec<Isa> {
        [Isa::Avx2, Isa::Avx512]
            .into_iter()
            .filter(|i| i.supported())
            .collect()
    }

    /// The transposes of `small_dot`'s copies (AVX-512 and AVX2), bit for bit, over whole blocks, ragged edges
    /// and a row stride past the row, without writing past `n * k`.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn transposes_blocks_and_ragged_edges() {
        for isa in isas() {
            transposes_on(isa);
        }
    }

    #[cfg(target_arch = "x86_64")]
    fn transposes_on(isa: Isa) {
        for (n, k, ldb) in [
            (1, 1, 1),
            (16, 16, 16),
            (32, 32, 40),
            (17, 33, 33),
            (5, 70, 71),
            (70, 3, 3),
        ] {
            let b: Vec<f32> = (0..n * ldb).map(|i| i as f32 * 0.5 - 3.0).collect();
            let mut t = vec![f32::NAN; n * k + 1];
            // SAFETY: `isa` detected; b holds n rows of ldb >= k, t has n * k (+ 1 sentinel) values.
            unsafe {
                if isa == Isa::Avx512 {
                    super::x86::transpose(n, k, b.as_ptr(), ldb, t.as_mut_ptr())
                } else {
                    super::x86v3::transpose(n, k, b.as_ptr(), ldb, t.as_mut_ptr())
                }
            };
            for j in 0..n {
                for d in 0..k {
                    assert_eq!(
                        t[d * n + j].to_bits(),
                        b[j * ldb + d].to_bits(),
                        "{isa:?} n {n} k {k}: ({j}, {d})"
                    );
                }
            }
            assert!(t[n * k].is_nan(), "{isa:?} n {n} k {k}: wrote past the end");
        }
    }

    /// `dot_bn` (AVX-512 and AVX2) for narrow `b` (its packed forms: RoPE's pair swap and its kin, `n`
    /// dividing 16 or 8, `k <= n`) and wider ones (the register blocks, ragged columns), bit for bit against
    /// each output's fused multiply-add chain over `k` in order (from `out`, or from +0), over ragged row
    /// counts, signed zeros included.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn packed_narrow_products_are_each_outputs_chain() {
        for isa in isas() {
            bn_chains_on(isa);
        }
    }

    #[cfg(target_arch = "x86_64")]
    fn bn_chains_on(isa: Isa) {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            match seed % 11 {
                0 => 0.0,
                1 => -0.0,
                r => ((seed >> 20) % 2001) as f32 / 250.0 - 4.0 + r as f32 * 1e-3,
            }
        };
        for (n, k) in [
            (1, 1),
            (2, 1),
            (2, 2),
            (4, 2),
            (4, 3),
            (4, 4),
            (8, 5),
            (8, 8),
            (16, 3),
            (12, 12),
            (17, 9),
            (40, 64),
            (64, 16),
        ] {
            for m in [1usize, 2, 3, 7, 8, 9, 16, 17, 31, 288] {
                let a: Vec<f32> = (0..m * k).map(|_| next()).collect();
                let b: Vec<f32> = (0..k * n).map(|_| next()).collect();
                let init: Vec<f32> = (0..m * n).map(|_| next()).collect();
                for accumulate in [false, true] {
                    let mut out = init.clone();
                    // SAFETY: the features were detected; a, b and out hold m * k, k * n and m * n values.
                    unsafe {
                        small_dot_on(
                            isa,
                            m,
                            n,
                            k,
                            out.as_mut_ptr(),
                            a.as_ptr(),
                            k,
                            b.as_ptr(),
                            n,
                            false,
                            accumulate,
                        )
                    };
                    for i in 0..m {
                        for j in 0..n {
                            let mut v = if accumulate { init[i * n + j] } else { 0.0 };
                            for kk in 0..k {
                                v = a[i * k + kk].mul_add(b[kk * n + j], v);
                            }
                            assert_eq!(
                                out[i * n + j].to_bits(),
                                v.to_bits(),
                                "{isa:?} m {m} n {n} k {k} accumulate {accumulate}: out[{i}, {j}]"
                            );
                        }
                    }
                }
            }
        }
    }

    /// `small_dot` against a transposed `b` (attention's scores: a few query rows by a page of keys, and more
    /// rows through the transposed copy), AVX-512 and AVX2, with row strides past the rows and ragged column
    /// groups and depths, within the f32 dot tolerance of the f64 product (`1e-5 * sum |a b|`), writing nothing
    /// past `out`.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn transposed_products_match_the_f64_product() {
        for isa in isas() {
            let mut seed = 0x9e37_79b9_7f4a_7c15u64;
            let mut next = move || {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                ((seed >> 20) % 2001) as f32 / 500.0 - 2.0
            };
            for (n, k) in [
                (1, 1),
                (5, 7),
                (8, 8),
                (16, 64),
                (17, 64),
                (40, 70),
                (3, 130),
            ] {
                for m in [1usize, 2, 7, 8, 9, 32] {
                    let (lda, ldb) = (k + 3, k + 5);
                    let a: Vec<f32> = (0..m * lda).map(|_| next()).collect();
                    let b: Vec<f32> = (0..n * ldb).map(|_| next()).collect();
                    let init: Vec<f32> = (0..m * n).map(|_| next()).collect();
                    for accumulate in [false, true] {
                        let mut out = init.clone();
                        out.push(f32::NAN);
                        // SAFETY: `isa` detected; a holds m rows of lda >= k, b n rows of ldb >= k, out m * n
                        // values (and a sentinel).
                        let done = unsafe {
                            small_dot_on(
                                isa,
                                m,
                                n,
                                k,
                                out.as_mut_ptr(),
                                a.as_ptr(),
                                lda,
                                b.as_ptr(),
                                ldb,
                                true,
                                accumulate,
                            )
                        };
                        assert!(done, "{isa:?} m {m} n {n} k {k}");
                        for i in 0..m {
                            for j in 0..n {
                                let terms = (0..k)
                                    .map(|d| f64::from(a[i * lda + d]) * f64::from(b[j * ldb + d]));
                                let base = if accumulate {
                                    f64::from(init[i * n + j])
                                } else {
                                    0.0
                                };
                                let want = base + terms.clone().sum::<f64>();
                                let scale = base.abs() + terms.map(f64::abs).sum::<f64>();
                                let got = f64::from(out[i * n + j]);
                                assert!(
                                    (got - want).abs() <= 1e-5 * scale + 1e-30,
                                    "{isa:?} m {m} n {n} k {k} accumulate {accumulate}: out[{i}, {j}] = {got}, want {want}"
                                );
                            }
                        }
                        assert!(
                            out[m * n].is_nan(),
                            "{isa:?} m {m} n {n} k {k}: wrote past out"
                        );
                    }
                }
            }
        }
    }

    /// Every row and column split (1 to 3 threads, ragged last blocks) and both layouts of `b` against a plain
    /// triple loop.
    #[test]
    fn threaded_splits_match_a_plain_product() {
        for (m, n, k) in [
            (1, 700, 300),
            (20, 384, 384),
            (60, 1536, 200),
            (300, 96, 512),
            (7, 33, 5),
            (128, 384, 64),
            (16, 1000, 40),
        ] {
            let a: Vec<f32> = (0..m * k)
                .map(|i| ((i * 7 % 13) as f32 - 6.0) / 8.0)
                .collect();
            let b: Vec<f32> = (0..k * n)
                .map(|i| ((i * 5 % 11) as f32 - 5.0) / 4.0)
                .collect();
            for trans_b in [false, true] {
                let at = |kk: usize, nn: usize| {
                    if trans_b {
                        b[nn * k + kk]
                    } else {
                        b[kk * n + nn]
                    }
                };
                for threads in [1, 2, 3] {
                    let mut c = vec![f32::NAN; m * n];
                    super::sgemm_threads(
                        m,
                        n,
                        k,
                        c.as_mut_ptr(),
                        a.as_ptr(),
                        b.as_ptr(),
                        trans_b,
                        threads,
                    );
                    for i in 0..m {
                        for j in 0..n {
                            let want: f64 = (0..k)
                                .map(|kk| f64::from(a[i * k + kk]) * f64::from(at(kk, j)))
                                .sum();
                            let got = f64::from(c[i * n + j]);
                            assert!(
                                (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                                "m {m} n {n} k {k} trans_b {trans_b} threads {threads}: c[{i}, {j}] = {got}, want {want}"
                            );
                        }
                    }
                }
            }
        }
    }
}

/// Products of at most this many rows of `a` may take [`small_dot`] with `b` transposed ...
pub(crate) const SMALL_DOT_ROWS: usize = 8;
/// ... and at most this many with `b` as it is, or transposed into a copy of at most [`BT_COPY_MAX`] values
/// (the register blocks of rows share each row of `b`: faster than the gemm crate's call at MiniLM's 32 x 32 x
/// 32 attention blocks).
pub(crate) const SMALL_DOT_ROWS_BN: usize = 32;
/// ... and any number of rows where `b` (as it is) is at most this deep and [`NARROW_B_COLS`] wide: a
/// product by a tiny matrix (a pair swap in RoPE: `[288, 2] @ [2, 2]`), where the gemm crate's call costs
/// several times the arithmetic of every row.
pub(crate) const NARROW_B_DEPTH: usize = 8;
/// See [`NARROW_B_DEPTH`].
pub(crate) const NARROW_B_COLS: usize = 32;
/// The largest transposed `b` (values) copied for [`small_dot`] (16 KiB).
const BT_COPY_MAX: usize = 4096;

thread_local! {
    /// Each thread's copy of a transposed `b` for [`small_dot`], kept between calls.
    static BT_COPY: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// `out[m, n] (+)= a[m, k] @ b` for a product of a few rows (m <= [`SMALL_DOT_ROWS`], or
/// [`SMALL_DOT_ROWS_BN`]), or of any rows by a tiny `b` ([`NARROW_B_DEPTH`]), on an AVX-512 or AVX2 CPU:
/// `b` is `[k, n]`, or `[n, k]` read transposed (`bt`); the rows of `a` and `b` are `lda` and `ldb` elements
/// apart, those of `out` `n`. This is attention's shape at
/// decode (a token's query heads against a page of keys, then its weights against the page's values), where
/// the gemm crate's per-call setup (dispatch, packing buffers) costs several times the arithmetic. Returns
/// false, doing nothing, where it does not apply (more rows, or neither AVX-512 nor AVX2 with FMA): the caller
/// uses the gemm crate.
///
/// Numerics: each output is one f32 fused multiply-add chain (sixteen lanes, summed in a fixed tree for the
/// transposed form of up to 8 rows, eight lanes and their own tree on AVX2; over k in order otherwise, the
/// same bits on both), deterministic for the shape and the CPU, within the
/// documented f32 dot tolerance.
pub(crate) fn small_dot(
    m: usize,
    n: usize,
    k: usize,
    out: *mut f32,
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    bt: bool,
    accumulate: bool,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let narrow = !bt && k <= NARROW_B_DEPTH && n <= NARROW_B_COLS;
        if m <= SMALL_DOT_ROWS_BN || narrow {
            // The row loops' instruction sets (`rows::Isa`): the forms here need the same features.
            let isa = crate::rows::Isa::detect();
            if isa != Isa::Scalar {
                // SAFETY: `isa`'s features were detected; the caller's contract.
                return unsafe { small_dot_on(isa, m, n, k, out, a, lda, b, ldb, bt, accumulate) };
            }
        }
    }
    let _ = (m, n, k, out, a, lda, b, ldb, bt, accumulate);
    false
}

/// [`small_dot`] on the given instruction set (m <= [`SMALL_DOT_ROWS_BN`], or a narrow `b`).
///
/// # Safety
/// The CPU has `isa` (not `Scalar`); [`small_dot`]'s contract.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn small_dot_on(
    isa: Isa,
    m: usize,
    n: usize,
    k: usize,
    out: *mut f32,
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    bt: bool,
    accumulate: bool,
) -> bool {
    let wide = isa == Isa::Avx512;
    if bt && m > SMALL_DOT_ROWS {
        if n * k > BT_COPY_MAX {
            return false;
        }
        // More rows against a transposed b (attention's scores at 32 query rows): b copied as [k, n] so
        // the rows share its vectors in `dot_bn`'s register blocks.
        BT_COPY.with(|cell| {
            let mut t = cell.take();
            t.clear();
            t.reserve(n * k);
            // SAFETY: the CPU has `isa` (the caller's contract); b holds n rows of k at stride ldb (the
            // caller's contract) and t has room for n * k values, every one of which `transpose` writes, so
            // the length may then cover them; the caller's contract covers a and out.
            unsafe {
                if wide {
                    x86::transpose(n, k, b, ldb, t.as_mut_ptr());
                    t.set_len(n * k);
                    x86::dot_bn(m, n, k, out, a, lda, t.as_ptr(), n, accumulate)
                } else {
                    x86v3::transpose(n, k, b, ldb, t.as_mut_ptr());
                    t.set_len(n * k);
                    x86v3::dot_bn(m, n, k, out, a, lda, t.as_ptr(), n, accumulate)
                }
            };
            cell.set(t);
        });
        return true;
    }
    // SAFETY: the CPU has `isa`; the caller's contract covers the extents (a: m rows of k at stride lda, b:
    // k rows of n or n rows of k at stride ldb, out: m*n f32, not overlapping a or b).
    unsafe {
        match (wide, bt) {
            (true, true) => x86::dot_bt(m, n, k, out, a, lda, b, ldb, accumulate),
            (true, false) => x86::dot_bn(m, n, k, out, a, lda, b, ldb, accumulate),
            (false, true) => x86v3::dot_bt(m, n, k, out, a, lda, b, ldb, accumulate),
            (false, false) => x86v3::dot_bn(m, n, k, out, a, lda, b, ldb, accumulate),
        }
    }
    true
}

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::sum16;

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// The lane mask of `len` (< 16) elements, or all sixteen.
    #[inline(always)]
    fn tail(len: usize) -> __mmask16 {
        if len >= 16 {
            0xffff
        } else {
            ((1u32 << len) - 1) as __mmask16
        }
    }

    /// Sixteen vectors to one: lane j of the result is the sum of the lanes of `v[j]` (a fixed tree: pairs
    /// within 128-bit lanes, then across them; about 45 instructions against about 8 dependent ones each for
    /// 16 separate reductions). Also the blocked quantised dot's reduction (`qdotf`).
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) fn sum16(v: &[__m512; 16]) -> __m512 {
        // Lanes within each 128-bit lane: [a0 + a2, b0 + b2, a1 + a3, b1 + b3] for a pair (a, b) ...
        let pair = |a: __m512, b: __m512| {
            _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b))
        };
        // ... then [a, b, c, d] partial sums per 128-bit lane for two pairs ...
        let quad = |ab: __m512, cd: __m512| {
            let (ab, cd) = (_mm512_castps_pd(ab), _mm512_castps_pd(cd));
            _mm512_add_ps(
                _mm512_castpd_ps(_mm512_unpacklo_pd(ab, cd)),
                _mm512_castpd_ps(_mm512_unpackhi_pd(ab, cd)),
            )
        };
        // ... then across the four 128-bit lanes: [x.l0 + x.l1, x.l2 + x.l3, y.l0 + y.l1, y.l2 + y.l3].
        let lanes = |x: __m512, y: __m512| {
            _mm512_add_ps(
                _mm512_shuffle_f32x4::<0b10_00_10_00>(x, y),
                _mm512_shuffle_f32x4::<0b11_01_11_01>(x, y),
            )
        };
        let q = |o: usize| quad(pair(v[o], v[o + 1]), pair(v[o + 2], v[o + 3]));
        let (x, y, z, w) = (q(0), q(4), q(8), q(12));
        lanes(lanes(x, y), lanes(z, w))
    }

    /// `out[i, j] (+)= sum_k a[i, k] * b[j, k]` (`b` is `[n, k]`): sixteen columns at a time, each a
    /// sixteen-lane chain over k, then [`sum16`].
    #[target_feature(enable = "avx512f,fma")]
    pub(super) unsafe fn dot_bt(
        m: usize,
        n: usize,
        k: usize,
        out: *mut f32,
        a: *const f32,
        lda: usize,
        b: *const f32,
        ldb: usize,
        accumulate: bool,
    ) {
        // SAFETY (whole body): every access stays within the caller's extents: row i of a at a + i * lda and
        // row j of b at b + j * ldb (j < n) hold k elements, loaded sixteen at a time with the tail masked;
        // out + i * n + j for i < m and j < n (the last group's store masked).
        unsafe {
            let mut j0 = 0;
            while j0 < n {
                let cols = (n - j0).min(16);
                // Column c's row of b (the last real one again past n: those lanes load nothing).
                let rows: [*const f32; 16] =
                    std::array::from_fn(|c| b.add((j0 + c.min(cols - 1)) * ldb));
                for i in 0..m {
                    let ai = a.add(i * lda);
                    let mut acc = [_mm512_setzero_ps(); 16];
                    let mut kk = 0;
                    if cols == 16 {
                        // Whole groups of sixteen columns and depths: no masks.
                        while kk + 16 <= k {
                            let x = _mm512_loadu_ps(ai.add(kk));
                            for (v, r) in acc.iter_mut().zip(&rows) {
                                *v = _mm512_fmadd_ps(x, _mm512_loadu_ps(r.add(kk)), *v);
                            }
                            kk += 16;
                        }
                    }
                    while kk < k {
                        let mk = tail(k - kk);
                        let x = _mm512_maskz_loadu_ps(mk, ai.add(kk));
                        // A constant trip count, so that the sixteen accumulators stay in registers; the
                        // columns past n (the last group) load nothing (their row pointer is never read).
                        for (c, v) in acc.iter_mut().enumerate() {
                            let mc = if c < cols { mk } else { 0 };
                            let y = _mm512_maskz_loadu_ps(mc, rows[c].add(kk));
                            *v = _mm512_fmadd_ps(x, y, *v);
                        }
                        kk += 16;
                    }
                    let mut s = sum16(&acc);
                    let o = out.add(i * n + j0);
                    let mo = tail(cols);
                    if accumulate {
                        s = _mm512_add_ps(_mm512_maskz_loadu_ps(mo, o), s);
                    }
                    _mm512_mask_storeu_ps(o, mo, s);
                }
                j0 += 16;
            }
        }
    }

    /// `t[d * n + j] = b[j * ldb + d]` for `j < n`, `d < k`: `b`'s `n` rows of `k` written as `k` rows of `n`,
    /// in blocks of 16 x 16 transposed in registers (unpacks, then 64- and 128-bit shuffles), the ragged
    /// edges through masked loads and stores. Every element of `t`'s `n * k` is written.
    ///
    /// # Safety
    /// AVX-512F present; `b` readable for `n` rows of `k` at stride `ldb`, `t` writable for `n * k` values.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn transpose(n: usize, k: usize, b: *const f32, ldb: usize, t: *mut f32) {
        let mut j0 = 0;
        while j0 < n {
            let rows = (n - j0).min(16);
            let mj = tail(rows);
            let mut d0 = 0;
            while d0 < k {
                let cols = (k - d0).min(16);
                let md = tail(cols);
                let mut r = [_mm512_setzero_ps(); 16];
                for (i, x) in r.iter_mut().enumerate().take(rows) {
                    // SAFETY: row j0 + i < n of b, columns d0..d0 + cols (masked) < k: inside b.
                    *x = unsafe { _mm512_maskz_loadu_ps(md, b.add((j0 + i) * ldb + d0)) };
                }
                let w = transpose16(&r);
                for (c, x) in w.iter().enumerate().take(cols) {
                    // SAFETY: row d0 + c < k of t, columns j0..j0 + rows (masked) < n: inside t.
                    unsafe { _mm512_mask_storeu_ps(t.add((d0 + c) * n + j0), mj, *x) };
                }
                d0 += 16;
            }
            j0 += 16;
        }
    }

    /// The transpose of a 16 x 16 block: `w[c]` lane `i` is `r[i]` lane `c`. Unpacks pair rows (lanes of
    /// 128 bits hold columns 4L + c of two rows), 64-bit shuffles make groups of four rows, then two rounds
    /// of 128-bit lane shuffles gather each column's four groups.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn transpose16(r: &[__m512; 16]) -> [__m512; 16] {
        let mut t = [_mm512_setzero_ps(); 16];
        for p in 0..8 {
            t[2 * p] = _mm512_unpacklo_ps(r[2 * p], r[2 * p + 1]);
            t[2 * p + 1] = _mm512_unpackhi_ps(r[2 * p], r[2 * p + 1]);
        }
        // u[4g + c]: lane L holds column 4L + c of rows 4g..4g + 3.
        let mut u = [_mm512_setzero_ps(); 16];
        for g in 0..4 {
            let (lo, hi) = (t[4 * g], t[4 * g + 1]);
            let (lo2, hi2) = (t[4 * g + 2], t[4 * g + 3]);
            u[4 * g] = _mm512_shuffle_ps::<0x44>(lo, lo2);
            u[4 * g + 1] = _mm512_shuffle_ps::<0xEE>(lo, lo2);
            u[4 * g + 2] = _mm512_shuffle_ps::<0x44>(hi, hi2);
            u[4 * g + 3] = _mm512_shuffle_ps::<0xEE>(hi, hi2);
        }
        // v[2c] (v[8 + 2c]): columns c, 8 + c of row groups 0, 1 (2, 3); v[2c + 1] (v[9 + 2c]): 4 + c, 12 + c.
        let mut v = [_mm512_setzero_ps(); 16];
        for c in 0..4 {
            v[2 * c] = _mm512_shuffle_f32x4::<0x88>(u[c], u[4 + c]);
            v[2 * c + 1] = _mm512_shuffle_f32x4::<0xDD>(u[c], u[4 + c]);
            v[8 + 2 * c] = _mm512_shuffle_f32x4::<0x88>(u[8 + c], u[12 + c]);
            v[9 + 2 * c] = _mm512_shuffle_f32x4::<0xDD>(u[8 + c], u[12 + c]);
        }
        let mut w = [_mm512_setzero_ps(); 16];
        for c in 0..4 {
            w[c] = _mm512_shuffle_f32x4::<0x88>(v[2 * c], v[8 + 2 * c]);
            w[8 + c] = _mm512_shuffle_f32x4::<0xDD>(v[2 * c], v[8 + 2 * c]);
            w[4 + c] = _mm512_shuffle_f32x4::<0x88>(v[2 * c + 1], v[9 + 2 * c]);
            w[12 + c] = _mm512_shuffle_f32x4::<0xDD>(v[2 * c + 1], v[9 + 2 * c]);
        }
        w
    }

    /// `out[i, :] (+)= sum_k a[i, k] * b[k, :]` (`b` is `[k, n]`): blocks of up to [`BN_ROWS`] rows by 32
    /// columns, 2 x rows accumulators in registers, each `k` loading `b`'s two vectors once for all the rows.
    /// Each output is one fused multiply-add chain over `k` in order, from its `out` value or +0: the bits do
    /// not depend on the blocking (nor on `m`).
    #[target_feature(enable = "avx512f,fma")]
    pub(super) unsafe fn dot_bn(
        m: usize,
        n: usize,
        k: usize,
        out: *mut f32,
        a: *const f32,
        lda: usize,
        b: *const f32,
        ldb: usize,
        accumulate: bool,
    ) {
        if n < 16 && 16 % n == 0 && k <= n && lda == k && ldb == n {
            // SAFETY: the caller's contract, as below; the packed form's conditions hold.
            unsafe { dot_packed(m, n, k, out, a, b, accumulate) };
            return;
        }
        let mut j = 0;
        while j < n {
            let cols = (n - j).min(32);
            let mut i = 0;
            while i < m {
                let rows = (m - i).min(BN_ROWS);
                // SAFETY: rows i..i + rows of a (k each, at lda), columns j..j + cols of b's k rows (at ldb) and
                // of out's rows (at n) lie inside the caller's extents.
                unsafe {
                    let (ai, bj, oi) = (a.add(i * lda), b.add(j), out.add(i * n + j));
                    match rows {
                        1 => bn_block::<1>(k, ai, lda, bj, ldb, oi, n, cols, accumulate),
                        2 => bn_block::<2>(k, ai, lda, bj, ldb, oi, n, cols, accumulate),
                        3 => bn_block::<3>(k, ai, lda, bj, ldb, oi, n, cols, accumulate),
                        4 => bn_block::<4>(k, ai, lda, bj, ldb, oi, n, cols, accumulate),
                        5 => bn_block::<5>(k, ai, lda, bj, ldb, oi, n, cols, accumulate),
                        6 => bn_block::<6>(k, ai, lda, bj, ldb, oi, n, cols, accumulate),
                        7 => bn_block::<7>(k, ai, lda, bj, ldb, oi, n, cols, accumulate),
                        8 => bn_block::<8>(k, ai, lda, bj, ldb, oi, n, cols, accumulate),
                        9 => bn_block::<9>(k, ai, lda, bj, ldb, oi, n, cols, accumulate),
                        10 => bn_block::<10>(k, ai, lda, bj, ldb, oi, n, cols, accumulate),
                        11 => bn_block::<11>(k, ai, lda, bj, ldb, oi, n, cols, accumulate),
                        _ => bn_block::<BN_ROWS>(k, ai, lda, bj, ldb, oi, n, cols, accumulate),
                    }
                }
                i += rows;
            }
            j += 32;
        }
    }

    /// [`dot_bn`] for a narrow `b` (`n` dividing 16, `k <= n`) and rows of `a` and `out` packed one after the
    /// other (`lda = k`, `out`'s stride `n`): RoPE's pair swap, `[rows, 2] x [2, 2]`, where one row at a time
    /// used two lanes of each vector. Here each vector holds `16 / n` whole rows of `out`; for each `kk` a
    /// permute spreads every row's `a[r, kk]` over that row's lanes, which are multiplied by `b`'s row `kk`
    /// repeated. Each output is the same fused multiply-add chain over `k` in order, from its `out` value or
    /// +0, as `bn_block`'s: the same bits.
    ///
    /// # Safety
    /// AVX-512F and FMA; `a` holds `m * k` f32, `b` `k * n`, `out` `m * n` (not overlapping them), and
    /// `n < 16`, `16 % n == 0`, `k <= n`.
    #[target_feature(enable = "avx512f,fma")]
    unsafe fn dot_packed(
        m: usize,
        n: usize,
        k: usize,
        out: *mut f32,
        a: *const f32,
        b: *const f32,
        accumulate: bool,
    ) {
        let per = 16 / n;
        // SAFETY (whole body): `b` holds k rows of n (read lane by lane below); row group i covers rows
        // i..i + rows of `a` (rows * k <= 16 values, masked) and of `out` (rows * n <= 16 values, masked).
        unsafe {
            let mut bv = [_mm512_setzero_ps(); 16];
            let mut ix = [_mm512_setzero_si512(); 16];
            for kk in 0..k {
                let mut w = [0f32; 16];
                let mut at = [0i32; 16];
                for lane in 0..16 {
                    w[lane] = *b.add(kk * n + lane % n);
                    at[lane] = ((lane / n) * k + kk) as i32;
                }
                bv[kk] = _mm512_loadu_ps(w.as_ptr());
                ix[kk] = _mm512_loadu_si512(at.as_ptr() as *const __m512i);
            }
            let mut i = 0;
            while i < m {
                let rows = (m - i).min(per);
                let ma = tail(rows * k);
                let mo = tail(rows * n);
                let x = _mm512_maskz_loadu_ps(ma, a.add(i * k));
                let o = out.add(i * n);
                let mut acc = if accumulate {
                    _mm512_maskz_loadu_ps(mo, o)
                } else {
                    _mm512_setzero_ps()
                };
                for kk in 0..k {
                    acc = _mm512_fmadd_ps(_mm512_permutexvar_ps(ix[kk], x), bv[kk], acc);
                }
                _mm512_mask_storeu_ps(o, mo, acc);
                i += rows;
            }
        }
    }

    /// Rows of one [`dot_bn`] block: 2 x 12 accumulators, two `b` vectors and a broadcast fit the 32 registers.
    const BN_ROWS: usize = 12;

    /// `R` rows by `cols` (<= 32) columns of [`dot_bn`].
    #[allow(clippy::too_many_arguments)]
    #[inline]
    #[target_feature(enable = "avx512f,fma")]
    unsafe fn bn_block<const R: usize>(
        k: usize,
        a: *const f32,
        lda: usize,
        b: *const f32,
        ldb: usize,
        out: *mut f32,
        ldo: usize,
        cols: usize,
        accumulate: bool,
    ) {
        let m0 = tail(cols);
        let m1 = tail(cols.saturating_sub(16));
        // SAFETY (whole body): a + r * lda + kk (r < R, kk < k); b + kk * ldb + c for c < cols (masked loads);
        // out + r * ldo + c for c < cols (masked loads and stores).
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); 2]; R];
            if accumulate {
                for (r, v) in acc.iter_mut().enumerate() {
                    let o = out.add(r * ldo);
                    v[0] = _mm512_maskz_loadu_ps(m0, o);
                    v[1] = _mm512_maskz_loadu_ps(m1, o.add(16));
                }
            }
            for kk in 0..k {
                let row = b.add(kk * ldb);
                let y0 = _mm512_maskz_loadu_ps(m0, row);
                let y1 = _mm512_maskz_loadu_ps(m1, row.add(16));
                for (r, v) in acc.iter_mut().enumerate() {
                    let x = _mm512_set1_ps(*a.add(r * lda + kk));
                    v[0] = _mm512_fmadd_ps(x, y0, v[0]);
                    v[1] = _mm512_fmadd_ps(x, y1, v[1]);
                }
            }
            for (r, v) in acc.iter().enumerate() {
                let o = out.add(r * ldo);
                _mm512_mask_storeu_ps(o, m0, v[0]);
                _mm512_mask_storeu_ps(o.add(16), m1, v[1]);
            }
        }
    }
}

/// [`x86`]'s small products on AVX2 and FMA (eight lanes, sixteen registers), for CPUs without AVX-512.
/// `dot_bn` and its packed form give the same bits as the AVX-512 forms (each output one fused multiply-add
/// chain over `k` in order); `dot_bt` sums eight-lane chains by its own tree (deterministic for the shape).
#[cfg(target_arch = "x86_64")]
mod x86v3 {
    use std::arch::x86_64::*;

    /// An 8 x 8 transpose: lane `j` of output `q` is lane `q` of input `j` (AVX2 callers only).
    #[inline(always)]
    fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
        // SAFETY: register shuffles only (the callers are compiled with AVX2).
        unsafe {
            let t0 = _mm256_unpacklo_ps(r[0], r[1]);
            let t1 = _mm256_unpackhi_ps(r[0], r[1]);
            let t2 = _mm256_unpacklo_ps(r[2], r[3]);
            let t3 = _mm256_unpackhi_ps(r[2], r[3]);
            let t4 = _mm256_unpacklo_ps(r[4], r[5]);
            let t5 = _mm256_unpackhi_ps(r[4], r[5]);
            let t6 = _mm256_unpacklo_ps(r[6], r[7]);
            let t7 = _mm256_unpackhi_ps(r[6], r[7]);
            let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
            let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
            let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
            let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
            let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
            let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
            let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
            let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
            [
                _mm256_permute2f128_ps::<0x20>(u0, u4),
                _mm256_permute2f128_ps::<0x20>(u1, u5),
                _mm256_permute2f128_ps::<0x20>(u2, u6),
                _mm256_permute2f128_ps::<0x20>(u3, u7),
                _mm256_permute2f128_ps::<0x31>(u0, u4),
                _mm256_permute2f128_ps::<0x31>(u1, u5),
                _mm256_permute2f128_ps::<0x31>(u2, u6),
                _mm256_permute2f128_ps::<0x31>(u3, u7),
            ]
        }
    }

    /// The lane mask of `len` (< 8) elements, or all eight, for `maskload`/`maskstore`.
    #[inline(always)]
    fn tail(len: usize) -> __m256i {
        // SAFETY: AVX is implied by every caller's target features.
        unsafe {
            _mm256_cmpgt_epi32(
                _mm256_set1_epi32(len.min(8) as i32),
                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
            )
        }
    }

    /// Eight vectors to one: lane j of the result is the sum of the lanes of `v[j]` (pairs within 128-bit
    /// lanes, then across them).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn sum8(v: &[__m256; 8]) -> __m256 {
        let pair = |a: __m256, b: __m256| {
            _mm256_add_ps(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b))
        };
        let quad = |ab: __m256, cd: __m256| {
            let (ab, cd) = (_mm256_castps_pd(ab), _mm256_castps_pd(cd));
            _mm256_add_ps(
                _mm256_castpd_ps(_mm256_unpacklo_pd(ab, cd)),
                _mm256_castpd_ps(_mm256_unpackhi_pd(ab, cd)),
            )
        };
        // x: [a b c d] sums of the low 128 bits, then of the high ones; y the same for e..h.
        let x = quad(pair(v[0], v[1]), pair(v[2], v[3]));
        let y = quad(pair(v[4], v[5]), pair(v[6], v[7]));
        _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(x, y),
            _mm256_permute2f128_ps::<0x31>(x, y),
        )
    }

    /// `out[i, j] (+)= sum_k a[i, k] * b[j, k]` (`b` is `[n, k]`): eight columns at a time, each an
    /// eight-lane chain over k, then [`sum8`].
    ///
    /// # Safety
    /// AVX2 and FMA; row i of a at a + i * lda and row j of b at b + j * ldb hold k elements; out holds m * n
    /// f32, overlapping neither.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot_bt(
        m: usize,
        n: usize,
        k: usize,
        out: *mut f32,
        a: *const f32,
        lda: usize,
        b: *const f32,
        ldb: usize,
        accumulate: bool,
    ) {
        // SAFETY (whole body): loads of row i of a and row j < n of b cover k elements (the tail masked);
        // out + i * n + j for i < m and j < n (the last group's loads and store masked).
        unsafe {
            let mut j0 = 0;
            while j0 < n {
                let cols = (n - j0).min(8);
                // Column c's row of b (the last real one again past n: those lanes load nothing).
                let rows: [*const f32; 8] =
                    std::array::from_fn(|c| b.add((j0 + c.min(cols - 1)) * ldb));
                let none = _mm256_setzero_si256();
                for i in 0..m {
                    let ai = a.add(i * lda);
                    let mut acc = [_mm256_setzero_ps(); 8];
                    let mut kk = 0;
                    if cols == 8 {
                        while kk + 8 <= k {
                            let x = _mm256_loadu_ps(ai.add(kk));
                            for (v, r) in acc.iter_mut().zip(&rows) {
                                *v = _mm256_fmadd_ps(x, _mm256_loadu_ps(r.add(kk)), *v);
                            }
                            kk += 8;
                        }
                    }
                    while kk < k {
                        let mk = tail(k - kk);
                        let x = _mm256_maskload_ps(ai.add(kk), mk);
                        for (c, v) in acc.iter_mut().enumerate() {
                            let mc = if c < cols { mk } else { none };
                            let y = _mm256_maskload_ps(rows[c].add(kk), mc);
                            *v = _mm256_fmadd_ps(x, y, *v);
                        }
                        kk += 8;
                    }
                    let mut s = sum8(&acc);
                    let o = out.add(i * n + j0);
                    let mo = tail(cols);
                    if accumulate {
                        s = _mm256_add_ps(_mm256_maskload_ps(o, mo), s);
                    }
                    _mm256_maskstore_ps(o, mo, s);
                }
                j0 += 8;
            }
        }
    }

    /// `t[d * n + j] = b[j * ldb + d]` for `j < n`, `d < k` (every element of `t`'s `n * k` written).
    ///
    /// # Safety
    /// AVX2 and FMA; `b` readable for `n` rows of `k` at stride `ldb`, `t` writable for `n * k` values.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn transpose(n: usize, k: usize, b: *const f32, ldb: usize, t: *mut f32) {
        // Blocks of 8 x 8 through the registers, then the ragged edges element by element.
        let (n8, k8) = (n / 8 * 8, k / 8 * 8);
        for j in (0..n8).step_by(8) {
            for d in (0..k8).step_by(8) {
                // SAFETY: rows j..j + 8 < n, elements d..d + 8 <= k of b; t's rows d..d + 8, columns j..j + 8
                // (the caller's contract).
                unsafe {
                    let rows: [__m256; 8] =
                        std::array::from_fn(|r| _mm256_loadu_ps(b.add((j + r) * ldb + d)));
                    for (q, v) in transpose8(rows).into_iter().enumerate() {
                        _mm256_storeu_ps(t.add((d + q) * n + j), v);
                    }
                }
            }
        }
        for j in 0..n {
            let d0 = if j < n8 { k8 } else { 0 };
            for d in d0..k {
                // SAFETY: j < n, d < k: inside both (the caller's contract).
                unsafe { *t.add(d * n + j) = *b.add(j * ldb + d) };
            }
        }
    }

    /// `out[i, :] (+)= sum_k a[i, k] * b[k, :]` (`b` is `[k, n]`): blocks of up to [`BN_ROWS`] rows by 16
    /// columns, each `k` loading `b`'s two vectors once for all the rows. Each output is one fused
    /// multiply-add chain over `k` in order, from its `out` value or +0: the AVX-512 form's bits.
    ///
    /// # Safety
    /// AVX2 and FMA; as the AVX-512 `dot_bn`.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot_bn(
        m: usize,
        n: usize,
        k: usize,
        out: *mut f32,
        a: *const f32,
        lda: usize,
        b: *const f32,
        ldb: usize,
        accumulate: bool,
    ) {
        if n < 8 && 8 % n == 0 && k <= n && lda == k && ldb == n {
            // SAFETY: the caller's contract, as below; the packed form's conditions hold.
            unsafe { dot_packed(m, n, k, out, a, b, accumulate) };
            return;
        }
        let mut j = 0;
        while j < n {
            let cols = (n - j).min(16);
            let mut i = 0;
            while i < m {
                let rows = (m - i).min(BN_ROWS);
                // SAFETY: rows i..i + rows of a (k each, at lda), columns j..j + cols of b's k rows (at ldb) and
                // of out's rows (at n) lie inside the caller's extents.
                unsafe {
                    let (ai, bj, oi) = (a.add(i * lda), b.add(j), out.add(i * n + j));
                    match rows {
                        1 => bn_block::<1>(k, ai, lda, bj, ldb, oi, n, cols, accumulate),
                        2 => bn_block::<2>(k, ai, lda, bj, ldb, oi, n, cols, accumulate),
                        3 => bn_block::<3>(k, ai, lda, bj, ldb, oi, n, cols, accumulate),
                        4 => bn_block::<4>(k, ai, lda, bj, ldb, oi, n, cols, accumulate),
                        5 => bn_block::<5>(k, ai, lda, bj, ldb, oi, n, cols, accumulate),
                        _ => bn_block::<BN_ROWS>(k, ai, lda, bj, ldb, oi, n, cols, accumulate),
                    }
                }
                i += rows;
            }
            j += 16;
        }
    }

    /// [`dot_bn`] for a narrow `b` (`n` dividing 8, `k <= n`) and packed rows: each vector holds `8 / n` whole
    /// rows of `out` (as the AVX-512 `dot_packed`, on eight lanes): the same chains, the same bits.
    ///
    /// # Safety
    /// AVX2 and FMA; `a` holds `m * k` f32, `b` `k * n`, `out` `m * n` (not overlapping them), and `n < 8`,
    /// `8 % n == 0`, `k <= n`.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn dot_packed(
        m: usize,
        n: usize,
        k: usize,
        out: *mut f32,
        a: *const f32,
        b: *const f32,
        accumulate: bool,
    ) {
        let per = 8 / n;
        // SAFETY (whole body): `b` holds k rows of n; row group i covers rows i..i + rows of `a` (rows * k <= 8
        // values, masked) and of `out` (rows * n <= 8 values, masked).
        unsafe {
            let mut bv = [_mm256_setzero_ps(); 8];
            let mut ix = [_mm256_setzero_si256(); 8];
            for kk in 0..k {
                let mut w = [0f32; 8];
                let mut at = [0i32; 8];
                for lane in 0..8 {
                    w[lane] = *b.add(kk * n + lane % n);
                    at[lane] = ((lane / n) * k + kk) as i32;
                }
                bv[kk] = _mm256_loadu_ps(w.as_ptr());
                ix[kk] = _mm256_loadu_si256(at.as_ptr() as *const __m256i);
            }
            let mut i = 0;
            while i < m {
                let rows = (m - i).min(per);
                let ma = tail(rows * k);
                let mo = tail(rows * n);
                let x = _mm256_maskload_ps(a.add(i * k), ma);
                let o = out.add(i * n);
                let mut acc = if accumulate {
                    _mm256_maskload_ps(o, mo)
                } else {
                    _mm256_setzero_ps()
                };
                for kk in 0..k {
                    acc = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(x, ix[kk]), bv[kk], acc);
                }
                _mm256_maskstore_ps(o, mo, acc);
                i += rows;
            }
        }
    }

    /// Rows of one [`dot_bn`] block: 2 x 6 accumulators, two `b` vectors and a broadcast fit the 16 registers.
    const BN_ROWS: usize = 6;

    /// `R` rows by `cols` (<= 16) columns of [`dot_bn`].
    #[allow(clippy::too_many_arguments)]
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn bn_block<const R: usize>(
        k: usize,
        a: *const f32,
        lda: usize,
        b: *const f32,
        ldb: usize,
        out: *mut f32,
        ldo: usize,
        cols: usize,
        accumulate: bool,
    ) {
        // SAFETY: the caller's contract, passed on.
        unsafe {
            if cols == 16 {
                bn_block_on::<R, false>(k, a, lda, b, ldb, out, ldo, cols, accumulate)
            } else {
                bn_block_on::<R, true>(k, a, lda, b, ldb, out, ldo, cols, accumulate)
            }
        }
    }

    /// [`bn_block`] with masked loads and stores (`MASKED`, for fewer than 16 columns), or plain ones: the
    /// two masks would take the registers the 6-row block needs (its accumulators spilled to the stack), and
    /// masked stores are slow on AMD's cores. The same FMAs either way, so the same bits.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn bn_block_on<const R: usize, const MASKED: bool>(
        k: usize,
        a: *const f32,
        lda: usize,
        b: *const f32,
        ldb: usize,
        out: *mut f32,
        ldo: usize,
        cols: usize,
        accumulate: bool,
    ) {
        let m0 = tail(cols);
        let m1 = tail(cols.saturating_sub(8));
        // SAFETY (whole body): a + r * lda + kk (r < R, kk < k); b + kk * ldb + c for c < cols (masked loads
        // unless all 16 columns are there); out + r * ldo + c for c < cols (likewise).
        unsafe {
            let load = |p: *const f32, m: __m256i| {
                if MASKED {
                    _mm256_maskload_ps(p, m)
                } else {
                    _mm256_loadu_ps(p)
                }
            };
            let mut acc = [[_mm256_setzero_ps(); 2]; R];
            if accumulate {
                for (r, v) in acc.iter_mut().enumerate() {
                    let o = out.add(r * ldo);
                    v[0] = load(o, m0);
                    v[1] = load(o.wrapping_add(8), m1);
                }
            }
            for kk in 0..k {
                let row = b.add(kk * ldb);
                let y0 = load(row, m0);
                let y1 = load(row.wrapping_add(8), m1);
                for (r, v) in acc.iter_mut().enumerate() {
                    let x = _mm256_set1_ps(*a.add(r * lda + kk));
                    v[0] = _mm256_fmadd_ps(x, y0, v[0]);
                    v[1] = _mm256_fmadd_ps(x, y1, v[1]);
                }
            }
            for (r, v) in acc.iter().enumerate() {
                let o = out.add(r * ldo);
                if MASKED {
                    _mm256_maskstore_ps(o, m0, v[0]);
                    _mm256_maskstore_ps(o.wrapping_add(8), m1, v[1]);
                } else {
                    _mm256_storeu_ps(o, v[0]);
                    _mm256_storeu_ps(o.wrapping_add(8), v[1]);
                }
            }
        }
    }
}
