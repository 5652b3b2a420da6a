//! Quantised weights in **tiles of 16 rows** times **22-bit activations**: the row form of the quantised
//! matrix-vector pattern (`y[i, n] = sum_k deq(W[n, k]) * x[i, k]`, `W` Q8_0, Q4_0 or Q4_1 blocks of 32 along
//! `K`) on CPUs with AVX-512 VNNI (or AVX2, module `avx2`, the same bits) for fewer than [`MAX_ROWS`]
//! activation rows (decode), the weights repacked
//! once ([`Packed`], kept in a `ParamCache`). From [`MAX_ROWS`] rows on, CPUs with AMX-INT8 run the same
//! arithmetic on tiles (`qamx.rs`), over the same [`Packed`] weights.
//!
//! **Layout.** [`Packed`] holds the matrix as tiles of 16 weight rows; a tile holds, block by block, the 16
//! rows' weights of that block interleaved four bytes at a time (one 64-byte vector holds four consecutive
//! weights of each of the 16 rows), then the 16 rows' f16 scales and (Q4_1) minimums. One `vpdpbusd` with
//! four activation bytes broadcast then advances 16 rows' dot products by four weights each, and a block ends
//! with one vector of 16 row sums: no horizontal reductions, no per-row scale broadcasts, no widening to
//! f32. Q4 weights keep their nibbles (a byte's low nibble is weight `4j + t` of the block, its high nibble
//! weight `16 + 4j + t`, as in the GGUF block); Q8_0's signed bytes are stored offset by 128 (unsigned, as
//! `vpdpbusd` wants them), the offset taken back exactly in integers. A tile-block is 320 bytes for Q4 (the
//! GGUF's 20 a row for Q4_1) and 576 for Q8_0 (GGUF: 544), 64-byte aligned.
//!
//! **Numerics.** Each activation row is quantised per block of 32 to integers `q` of at most 21 bits and a
//! sign (`s = max |x| / 2097151`, `q = round(x / s)` within 0.75: each activation moves by at most
//! `0.75 s`). 21 bits, not fewer: language-model activations have outliers that set a block's scale, and with
//! 14 bits SmolLM2-135M's log-probabilities moved by 0.034 against a float64 reference (its tests allow 0.02;
//! ggml's Q8 activations moved them by 0.08); with 21 bits by 1.7e-4 (f32 throughout: 2.8e-5). `q` is split
//! exactly into `65536 a + 256 b + c` with `a`, `b`, `c` signed bytes, so the block's integer dot `sum u q`
//! (u the stored weight bytes) is three `vpdpbusd` sums, each exact in 32 bits. Per block and row the float
//! work is `acc += (65536 f32(A) + f32(256 B + C)) * (d * s)` (and, Q4_1, `acc += m * sum x`, the block's f32
//! activation sum), in block order. So a row's result depends on its weights and its activation row only: the
//! same bits whichever rows share the call and on every thread. The scalar form ([`matmul_scalar`]) computes
//! the same arithmetic, bit for bit (the tests check it).

use loom_ir::kernel::DType;

use crate::qdot::Isa;

/// Weights per block (along K).
const QK: usize = 32;
/// Weight rows per tile.
pub(crate) const TILE: usize = 16;
/// The row products take this path below this many activation rows (decode epochs); at more rows the f32
/// blocked dot of `qdotf` is faster (its 4 x 4 register blocking amortises the dequantisation, and the
/// three-part integer dots cost more instructions than two f32 multiply-adds a block: measured, BENCHMARKS.md),
/// unless the CPU has AMX-INT8 (`qamx.rs`).
pub(crate) const MAX_ROWS: usize = 8;
/// Activation rows per call of the kernel.
const MANY: usize = 16;
/// How many tile-blocks ahead the kernel prefetches (10 KiB of Q4 tiles): the decode group of `cargo bench -p
/// loom-cpu` on the Xeon, 2 threads, 211 products: 0 7.9 ms, 2 7.3, 8 5.5-6.0, 16 5.3-5.4, 32 4.0-5.0, 48 and 64
/// 4.4-5.9 (noisy host; 32 best on average).
const PREFETCH: usize = 32;

/// Prefetches the tile-block [`PREFETCH`] blocks after the one at `o` (`tb` bytes each; a tile's blocks are
/// consecutive, and so are the tiles a thread takes), one prefetch a line. Any address is allowed: a prefetch
/// past the data does not fault.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn prefetch_ahead(o: *const u8, tb: usize) {
    let ahead = o.wrapping_add(PREFETCH * tb);
    let mut line = 0;
    while line < tb {
        // SAFETY: a prefetch reads nothing the program can observe and does not fault on any address.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                ahead.wrapping_add(line) as *const i8,
            )
        };
        line += 64;
    }
}
/// `x + ROUNDER - ROUNDER` is `x` rounded to an integer (ties to even) for `|x| < 2^22`.
const ROUNDER: f32 = 12_582_912.0;
/// The activation quantisation's largest magnitude (21 bits).
const QMAX: f32 = 2_097_151.0;

/// The bytes `Packed::pack` writes, shared by its tasks (each writes its own tiles).
struct OutBytes(*mut u8);
// SAFETY: the tasks write disjoint ranges (see `Packed::pack`).
unsafe impl Sync for OutBytes {}

/// 64 bytes, 64-byte aligned: the unit of [`Packed`]'s storage.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// A quantised weight matrix `[n, k]` repacked into tiles of [`TILE`] rows (see the module doc).
pub(crate) struct Packed {
    pub(crate) dtype: DType,
    pub(crate) n: usize,
    pub(crate) k: usize,
    data: Vec<Line>,
}

impl std::fmt::Debug for Packed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Packed({} [{}, {}])", self.dtype, self.n, self.k)
    }
}

/// Bytes of one tile-block: the 16 rows' weights of a block, their scales and minimums (or padding).
pub(crate) fn tile_block(dtype: DType) -> usize {
    if dtype == DType::Q8_0 { 576 } else { 320 }
}

/// Bytes of the weights part of a tile-block.
pub(crate) fn weight_bytes(dtype: DType) -> usize {
    if dtype == DType::Q8_0 { 512 } else { 256 }
}

/// The offset the stored weight bytes carry (`w = d (u - z) + m`).
pub(crate) fn zero_point(dtype: DType) -> i32 {
    match dtype {
        DType::Q8_0 => 128,
        DType::Q4_0 => 8,
        _ => 0,
    }
}

impl Packed {
    /// Whether `dtype` has a tiled form.
    pub(crate) fn supports(dtype: DType) -> bool {
        matches!(dtype, DType::Q8_0 | DType::Q4_0 | DType::Q4_1)
    }

    /// Repacks `w` (`n` rows of `k / 32` GGUF blocks of `dtype`, row-major) into tiles. Rows past `n` in the
    /// last tile are zero (their outputs are never written).
    pub(crate) fn pack(dtype: DType, n: usize, k: usize, w: &[u8], threads: usize) -> Packed {
        assert!(Self::supports(dtype) && k.is_multiple_of(QK));
        let (gb, tb, wb) = (
            crate::qdotf::block_bytes(dtype),
            tile_block(dtype),
            weight_bytes(dtype),
        );
        let nb = k / QK;
        let row = nb * gb;
        assert_eq!(w.len(), n * row, "qtile: {n} rows of {k} {dtype} weights");
        let tiles = n.div_ceil(TILE);
        let bytes = tiles * nb * tb;
        let mut data = vec![Line([0; 64]); bytes / 64];
        let base = OutBytes(data.as_mut_ptr() as *mut u8);
        // One tile's bytes from its rows' blocks.
        let pack_tile = |t: usize| {
            let base = &base;
            // SAFETY: `data` holds `tiles * nb * tb` initialised bytes; tile `t`'s range is written by this
            // call only (each tile is one task), and `data` outlives the tasks.
            let out = unsafe { std::slice::from_raw_parts_mut(base.0.add(t * nb * tb), nb * tb) };
            for b in 0..nb {
                let o = &mut out[b * tb..(b + 1) * tb];
                for r in 0..TILE.min(n - t * TILE) {
                    let blk = &w[(t * TILE + r) * row + b * gb..][..gb];
                    // Scales (and minimums) after the weights: 16 f16 each.
                    o[wb + 2 * r..wb + 2 * r + 2].copy_from_slice(&blk[..2]);
                    match dtype {
                        DType::Q4_1 => {
                            o[wb + 32 + 2 * r..wb + 32 + 2 * r + 2].copy_from_slice(&blk[2..4]);
                            for j in 0..4 {
                                o[64 * j + 4 * r..64 * j + 4 * r + 4]
                                    .copy_from_slice(&blk[4 + 4 * j..8 + 4 * j]);
                            }
                        }
                        DType::Q4_0 => {
                            for j in 0..4 {
                                o[64 * j + 4 * r..64 * j + 4 * r + 4]
                                    .copy_from_slice(&blk[2 + 4 * j..6 + 4 * j]);
                            }
                        }
                        _ => {
                            for j in 0..8 {
                                for t in 0..4 {
                                    o[64 * j + 4 * r + t] = blk[2 + 4 * j + t] ^ 0x80;
                                }
                            }
                        }
                    }
                }
            }
        };
        // Large matrices on every thread (the first product after a model is loaded packs them all).
        let threads = threads.clamp(1, tiles.max(1)).min((bytes >> 18).max(1));
        if threads <= 1 {
            (0..tiles).for_each(pack_tile);
        } else {
            crate::pool::run(tiles, threads - 1, &pack_tile);
        }
        Packed { dtype, n, k, data }
    }

    /// Whether this is the matrix `[n, k]` of `dtype`.
    pub(crate) fn is(&self, dtype: DType, n: usize, k: usize) -> bool {
        (self.dtype, self.n, self.k) == (dtype, n, k)
    }

    /// Bytes held.
    pub(crate) fn bytes(&self) -> usize {
        self.data.len() * 64
    }

    pub(crate) fn ptr(&self) -> *const u8 {
        self.data.as_ptr() as *const u8
    }
}

/// One activation row quantised per block (see the module doc): `q = 65536 a + 256 b + c` with `a`, `b`, `c`
/// signed bytes (`parts[0..3]`), and per block the scale `s`, the parts' sums and the f32 sum of the block's
/// activations.
pub(crate) struct Acts {
    pub(crate) parts: [Vec<i8>; 3],
    pub(crate) s: Vec<f32>,
    pub(crate) sums: Vec<[i32; 3]>,
    pub(crate) sum: Vec<f32>,
}

impl Acts {
    pub(crate) fn new(x: &[f32]) -> Acts {
        let nb = x.len() / QK;
        let mut a = Acts {
            parts: [vec![0; nb * QK], vec![0; nb * QK], vec![0; nb * QK]],
            s: vec![0.0; nb],
            sums: vec![[0; 3]; nb],
            sum: vec![0.0; nb],
        };
        #[cfg(target_arch = "x86_64")]
        let (simd, avx2) = (
            std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512bw"),
            std::is_x86_feature_detected!("avx2"),
        );
        for (b, c) in x.chunks_exact(QK).enumerate() {
            let c: &[f32; QK] = c.try_into().expect("32 activations");
            let [p0, p1, p2] = &mut a.parts;
            let out = [p0, p1, p2].map(|p| -> &mut [i8; QK] {
                (&mut p[b * QK..(b + 1) * QK]).try_into().expect("32 bytes")
            });
            #[cfg(target_arch = "x86_64")]
            let q = if simd {
                // SAFETY: avx512f and avx512bw were detected.
                unsafe { x86::quantise_block(c, out) }
            } else if avx2 {
                // SAFETY: avx2 was detected.
                unsafe { avx2::quantise_block(c, out) }
            } else {
                quantise_block(c, out)
            };
            #[cfg(not(target_arch = "x86_64"))]
            let q = quantise_block(c, out);
            (a.s[b], a.sums[b], a.sum[b]) = q;
        }
        a
    }
}

/// A block's scale and its inverse from its largest magnitude: `(NaN, 0)` for a block that is not finite,
/// `(0, 0)` for zeros or magnitudes so small that the inverse overflows (the block then counts as zeros).
fn scale(finite: bool, amax: f32) -> (f32, f32) {
    if !finite {
        return (f32::NAN, 0.0);
    }
    let s = amax / QMAX;
    let inv = 1.0 / s;
    if s > 0.0 && inv.is_finite() {
        (s, inv)
    } else {
        (0.0, 0.0)
    }
}

/// One block of 32 activations quantised (see the module doc): writes its three parts to `out` and returns the
/// scale `s`, the parts' sums and the block's f32 sum (in a fixed tree order: halves of 16, 8, 4, 2, 1 lanes,
/// which the AVX-512 and AVX2 forms follow, so all give the same bits).
///
/// A block of zeros (or of magnitudes so small that the scale's inverse overflows) quantises to zeros with scale
/// zero; a block holding a NaN or an infinity to zeros with a NaN scale, so the products it enters are NaN (as
/// the f32 product's would be).
fn quantise_block(c: &[f32; QK], out: [&mut [i8; QK]; 3]) -> (f32, [i32; 3], f32) {
    let amax = c.iter().fold(0f32, |m, v| m.max(v.abs()));
    let finite = c.iter().all(|v| v.is_finite());
    let (s, inv) = scale(finite, amax);
    let mut sums = [0i32; 3];
    if inv > 0.0 {
        for (j, v) in c.iter().enumerate() {
            // `q = round(x / s)` (the product rounded to f32 first: within 0.25 of `x / s`, so `q` within 0.75), ties to even by
            // adding and taking back 1.5 * 2^23; then split into the rest, the middle byte and the low byte, each
            // in [-128, 127] (the top one in [-32, 32]).
            let q = (((v * inv).clamp(-QMAX, QMAX) + ROUNDER) - ROUNDER) as i32;
            let parts = [
                (q + 32896) >> 16,
                ((((q + 128) >> 8) + 128) & 255) - 128,
                ((q + 128) & 255) - 128,
            ];
            for t in 0..3 {
                out[t][j] = parts[t] as i8;
                sums[t] += parts[t];
            }
        }
    } else {
        for o in out {
            o.fill(0);
        }
    }
    let mut v = [0f32; 16];
    for (j, v) in v.iter_mut().enumerate() {
        *v = c[j] + c[16 + j];
    }
    let mut w = 8;
    while w > 0 {
        for j in 0..w {
            v[j] += v[j + w];
        }
        w /= 2;
    }
    (s, sums, v[0])
}

#[cfg(test)]
/// The f32 of the little-endian f16 at `p[0..2]`.
fn half(p: &[u8]) -> f32 {
    crate::rt::f16_to_f32(u16::from_le_bytes([p[0], p[1]]))
}

#[cfg(test)]
/// One tile's 16 outputs for one activation row, in scalar code with the SIMD kernel's arithmetic.
fn tile_scalar(p: &Packed, t: usize, a: &Acts) -> [f32; TILE] {
    let (tb, wb) = (tile_block(p.dtype), weight_bytes(p.dtype));
    let nb = p.k / QK;
    let z = zero_point(p.dtype);
    // SAFETY: `data` is initialised bytes; shared view.
    let bytes = unsafe { std::slice::from_raw_parts(p.ptr(), p.bytes()) };
    let mut acc = [0f32; TILE];
    for b in 0..nb {
        let o = &bytes[(t * nb + b) * tb..][..tb];
        for (r, acc) in acc.iter_mut().enumerate() {
            // The block's integer dot with each part, less the stored weights' offset.
            let mut ps = [0i32; 3];
            for (t, ps) in ps.iter_mut().enumerate() {
                let x = &a.parts[t][b * QK..][..QK];
                if p.dtype == DType::Q8_0 {
                    for j in 0..32 {
                        *ps += i32::from(o[64 * (j / 4) + 4 * r + j % 4]) * i32::from(x[j]);
                    }
                } else {
                    for j in 0..16 {
                        let byte = o[64 * (j / 4) + 4 * r + j % 4];
                        *ps += i32::from(byte & 15) * i32::from(x[j])
                            + i32::from(byte >> 4) * i32::from(x[16 + j]);
                    }
                }
                *ps -= z * a.sums[b][t];
            }
            let f = (ps[0] as f32).mul_add(65536.0, ((ps[1] << 8) + ps[2]) as f32);
            let d = half(&o[wb + 2 * r..]);
            *acc = f.mul_add(d * a.s[b], *acc);
            if p.dtype == DType::Q4_1 {
                *acc = half(&o[wb + 32 + 2 * r..]).mul_add(a.sum[b], *acc);
            }
        }
    }
    acc
}

#[cfg(test)]
/// `y [m, n] = x [m, k] @ W^T` in scalar code: the reference for the SIMD kernel's bits (tests).
pub(crate) fn matmul_scalar(p: &Packed, m: usize, x: &[f32], y: &mut [f32]) {
    assert!(x.len() == m * p.k && y.len() == m * p.n);
    for i in 0..m {
        let a = Acts::new(&x[i * p.k..(i + 1) * p.k]);
        for t in 0..p.n.div_ceil(TILE) {
            let v = tile_scalar(p, t, &a);
            for (r, v) in v.iter().enumerate().take(p.n - t * TILE) {
                y[i * p.n + t * TILE + r] = *v;
            }
        }
    }
}

/// Whether [`matmul`] runs on this ISA: AVX-512 with VNNI, BW and F16C (`Isa::Avx512Vnni`), or AVX2 with FMA
/// and F16C (`Isa::Avx2`, module `avx2`: the same bits).
pub(crate) fn available(isa: Isa) -> bool {
    cfg!(target_arch = "x86_64") && matches!(isa, Isa::Avx512Vnni | Isa::Avx2)
}

/// `y [m, n] = x [m, k] @ W^T` with the tiled weights `p` (`available(isa)`), `y` row-major `[m, n]` f32
/// (possibly unaligned). Threads claim chunks of tiles.
///
/// # Safety
/// `available(isa)` holds; `y` is valid for `m * p.n` f32 writes and overlaps neither `p` nor `x`.
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn matmul(p: &Packed, m: usize, x: &[f32], y: *mut f32, threads: usize) {
    // SAFETY: the caller's contract.
    unsafe { matmul_group(&[Product { p, m, x, y }], threads) }
}

/// One product of a [`matmul_group`]: `y [m, p.n] = x [m, p.k] @ W^T`.
pub(crate) struct Product<'a> {
    pub(crate) p: &'a Packed,
    pub(crate) m: usize,
    pub(crate) x: &'a [f32],
    pub(crate) y: *mut f32,
}
// SAFETY: the tasks of a group only read `p` and `x` and write disjoint elements through `y` (`matmul_group`'s
// contract).
unsafe impl Sync for Product<'_> {}

/// Several independent products in one parallel region (consecutive dispatches of a stage, such as a layer's
/// query, key and value products, which read the same activations): the threads claim chunks of tiles across
/// all of them, so small matrices no longer run one at a time (or on one thread), and products that read the
/// same activation rows quantise them once. Each product's results are the bits [`matmul`] gives it alone.
///
/// # Safety
/// `available(isa)` holds; each `y` is valid for `m * p.n` f32 writes and overlaps no other product's `x`, `y`
/// or weights.
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn matmul_group(products: &[Product<'_>], threads: usize) {
    // SAFETY: the caller's contract; `available(Isa::detect())` is what it promised.
    unsafe { matmul_group_on(Isa::detect(), products, threads) }
}

/// [`matmul_group`] with the kernel of `isa` (`available(isa)`: `Isa::Avx512Vnni` or `Isa::Avx2`).
///
/// # Safety
/// The CPU has `isa`, which is `available`; [`matmul_group`]'s contract.
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn matmul_group_on(isa: Isa, products: &[Product<'_>], threads: usize) {
    assert!(available(isa));
    let wide = isa == Isa::Avx512Vnni;
    // The activation rows of each product, quantised once per distinct activation buffer.
    let mut acts: Vec<std::rc::Rc<Vec<Acts>>> = Vec::with_capacity(products.len());
    for (j, pr) in products.iter().enumerate() {
        assert!(pr.x.len() == pr.m * pr.p.k);
        let same = products[..j]
            .iter()
            .position(|q| std::ptr::eq(q.x, pr.x) && q.x.len() == pr.x.len());
        acts.push(match same {
            Some(i) => acts[i].clone(),
            None => std::rc::Rc::new(
                (0..pr.m)
                    .map(|i| Acts::new(&pr.x[i * pr.p.k..(i + 1) * pr.p.k]))
                    .collect(),
            ),
        });
    }
    let acts: Vec<&[Acts]> = acts.iter().map(|a| a.as_slice()).collect();
    let (threads, per, chunks) = chunks(products, threads);
    let work = |c: usize| {
        let (j, t0) = chunks[c];
        let (pr, a) = (&products[j], acts[j]);
        let p = pr.p;
        for t in t0..(t0 + per).min(p.n.div_ceil(TILE)) {
            let rows = (p.n - t * TILE).min(TILE);
            let mut i = 0;
            while i < pr.m {
                let g = (pr.m - i).min(MANY);
                // SAFETY: the ISA holds (caller); the (rows i..i + g, tile t) outputs of product j are this
                // chunk's only, and no product's output overlaps another's inputs (caller).
                unsafe {
                    if wide {
                        x86::tile(p, t, &a[i..i + g], pr.y, rows, i)
                    } else {
                        avx2::tile(p, t, &a[i..i + g], pr.y, rows, i)
                    }
                };
                i += g;
            }
        }
    };
    if threads <= 1 {
        (0..chunks.len()).for_each(work);
    } else {
        crate::pool::run(chunks.len(), threads - 1, &work);
    }
}

/// How a group of products is split: the threads to use (at least 128 K multiply-adds each), the tiles a chunk
/// holds (about eight chunks a thread over all the tiles), and each chunk's (product, first tile); a chunk never
/// spans two products. Shared by [`matmul_group`] and `qamx::matmul_group`.
pub(crate) fn chunks(
    products: &[Product<'_>],
    threads: usize,
) -> (usize, usize, Vec<(usize, usize)>) {
    let work_total: usize = products
        .iter()
        .map(|pr| pr.p.n * pr.p.k * pr.m.max(1))
        .sum();
    let tiles_total: usize = products.iter().map(|pr| pr.p.n.div_ceil(TILE)).sum();
    let threads = threads
        .clamp(1, tiles_total.max(1))
        .min((work_total >> 17).max(1));
    let per = tiles_total.div_ceil(threads * 8).max(1);
    let chunks = products
        .iter()
        .enumerate()
        .flat_map(|(j, pr)| {
            let tiles = pr.p.n.div_ceil(TILE);
            (0..tiles.div_ceil(per)).map(move |c| (j, c * per))
        })
        .collect();
    (threads, per, chunks)
}

#[cfg(target_arch = "x86_64")]
mod avx2;

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::*;

    /// [`super::quantise_block`] with AVX-512, bit for bit.
    ///
    /// # Safety
    /// AVX-512 F and BW are present.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn quantise_block(
        c: &[f32; QK],
        out: [&mut [i8; QK]; 3],
    ) -> (f32, [i32; 3], f32) {
        // SAFETY: `c` holds 32 f32 (two 16-lane loads); each output part holds 32 bytes (two 16-byte stores).
        unsafe {
            let x = [
                _mm512_loadu_ps(c.as_ptr()),
                _mm512_loadu_ps(c.as_ptr().add(16)),
            ];
            let abs = |v: __m512| {
                _mm512_castsi512_ps(_mm512_and_si512(
                    _mm512_castps_si512(v),
                    _mm512_set1_epi32(0x7fff_ffff),
                ))
            };
            let amax = _mm512_reduce_max_ps(_mm512_max_ps(abs(x[0]), abs(x[1])));
            // Finite lanes: x - x == 0 (NaN otherwise).
            let fin = |v: __m512| {
                _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(_mm512_sub_ps(v, v), _mm512_setzero_ps())
            };
            let finite = fin(x[0]) & fin(x[1]) == 0xffff;
            let (s, inv) = scale(finite, amax);
            let mut sums = [0i32; 3];
            if inv > 0.0 {
                let (vinv, lim) = (_mm512_set1_ps(inv), _mm512_set1_ps(QMAX));
                let mut acc = [_mm512_setzero_si512(); 3];
                for (h, x) in x.iter().enumerate() {
                    let r = _mm512_min_ps(
                        _mm512_max_ps(
                            _mm512_mul_ps(*x, vinv),
                            _mm512_sub_ps(_mm512_setzero_ps(), lim),
                        ),
                        lim,
                    );
                    // Round to nearest even (the default rounding mode), as the scalar form.
                    let q = _mm512_cvtps_epi32(r);
                    let c128 = _mm512_set1_epi32(128);
                    let m255 = _mm512_set1_epi32(255);
                    let lo =
                        _mm512_sub_epi32(_mm512_and_si512(_mm512_add_epi32(q, c128), m255), c128);
                    let q1 = _mm512_srai_epi32(_mm512_add_epi32(q, c128), 8);
                    let mid =
                        _mm512_sub_epi32(_mm512_and_si512(_mm512_add_epi32(q1, c128), m255), c128);
                    let hi = _mm512_srai_epi32(_mm512_add_epi32(q, _mm512_set1_epi32(32896)), 16);
                    for (t, v) in [hi, mid, lo].into_iter().enumerate() {
                        _mm_storeu_si128(
                            out[t].as_mut_ptr().add(16 * h) as *mut __m128i,
                            _mm512_cvtepi32_epi8(v),
                        );
                        acc[t] = _mm512_add_epi32(acc[t], v);
                    }
                }
                for t in 0..3 {
                    sums[t] = _mm512_reduce_add_epi32(acc[t]);
                }
            } else {
                for o in out {
                    o.fill(0);
                }
            }
            // The sum in the scalar form's tree: 16 lanes, then halves.
            let v16 = _mm512_add_ps(x[0], x[1]);
            let v8 = _mm256_add_ps(
                _mm512_castps512_ps256(v16),
                _mm512_extractf32x8_ps::<1>(v16),
            );
            let v4 = _mm_add_ps(_mm256_castps256_ps128(v8), _mm256_extractf128_ps::<1>(v8));
            let v2 = _mm_add_ps(v4, _mm_movehl_ps(v4, v4));
            let v1 = _mm_add_ss(v2, _mm_shuffle_ps::<1>(v2, v2));
            (s, sums, _mm_cvtss_f32(v1))
        }
    }

    /// Tile `t`'s outputs for the activation rows `a` (at most [`MANY`]; rows `i0..` of `y`, `[m, p.n]`), the
    /// first `rows` lanes written. Each tile-block's weights are loaded (and Q4's nibbles separated) once for
    /// all the rows; per row and block, three integer dots of 16 weight rows (the activation parts), their
    /// combination in f32, and the scale (see the module doc).
    ///
    /// # Safety
    /// AVX-512 F/BW/VNNI and F16C are present; `y` is valid for the written elements.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
    pub(super) unsafe fn tile(
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
        let q8 = p.dtype == DType::Q8_0;
        let q41 = p.dtype == DType::Q4_1;
        let lo_mask = _mm512_set1_epi8(0x0f);
        let hi_mask = _mm512_set1_epi8(0xf0u8 as i8);
        assert!(a.len() <= MANY);
        let mut acc = [_mm512_setzero_ps(); MANY];
        // SAFETY (the whole body): tile `t`'s `nb` tile-blocks lie inside `p.data` (`pack` made `tiles * nb`
        // of `tb` bytes, 64-byte aligned, `tb` a multiple of 64); each activation row holds `nb * 32` bytes of
        // each part and `nb` of the per-block values (`Acts::new` over `k = 32 nb`); the broadcast reads are
        // 4 bytes at `4j` (Q8_0, `j < 8`) or `4j` and `16 + 4j` (Q4, `j < 4`) of the block's 32. Prefetches
        // may point past the data (`wrapping_add`; a prefetch does not fault).
        unsafe {
            let base = p.ptr().add(t * nb * tb);
            for b in 0..nb {
                let o = base.add(b * tb);
                prefetch_ahead(o, tb);
                // The block's weights: Q8_0's eight vectors (inputs 4j..4j+4), or Q4's four split into low
                // nibbles (inputs 4j..) and high nibbles times 16 (inputs 16+4j..).
                let mut w = [_mm512_setzero_si512(); 8];
                if q8 {
                    for (j, w) in w.iter_mut().enumerate() {
                        *w = _mm512_load_si512(o.add(64 * j) as *const _);
                    }
                } else {
                    for j in 0..4 {
                        let v = _mm512_load_si512(o.add(64 * j) as *const _);
                        w[j] = _mm512_and_si512(v, lo_mask);
                        w[4 + j] = _mm512_and_si512(v, hi_mask);
                    }
                }
                let d = _mm512_cvtph_ps(_mm256_load_si256(o.add(wb) as *const _));
                let mv = if q41 {
                    _mm512_cvtph_ps(_mm256_load_si256(o.add(wb + 32) as *const _))
                } else {
                    _mm512_setzero_ps()
                };
                for (g, a) in a.iter().enumerate() {
                    // Four activation bytes of part `$t` at `$at`, broadcast to the 16 lanes.
                    macro_rules! bc {
                        ($t:expr, $at:expr) => {
                            _mm512_set1_epi32(
                                (a.parts[$t].as_ptr().add(b * QK + $at) as *const i32)
                                    .read_unaligned(),
                            )
                        };
                    }
                    // Per part: two sums (Q8_0: even and odd j; Q4: low and high nibbles).
                    let mut ps = [[_mm512_setzero_si512(); 2]; 3];
                    for (t, ps) in ps.iter_mut().enumerate() {
                        if q8 {
                            for (j, w) in w.iter().enumerate() {
                                ps[j & 1] = _mm512_dpbusd_epi32(ps[j & 1], *w, bc!(t, 4 * j));
                            }
                        } else {
                            for j in 0..4 {
                                ps[0] = _mm512_dpbusd_epi32(ps[0], w[j], bc!(t, 4 * j));
                                ps[1] = _mm512_dpbusd_epi32(ps[1], w[4 + j], bc!(t, 16 + 4 * j));
                            }
                        }
                    }
                    let part = |t: usize| {
                        // Q4: the high nibbles' sums carry a factor 16 (masked, not shifted), exact to shift.
                        let hi = if q8 {
                            ps[t][1]
                        } else {
                            _mm512_srai_epi32(ps[t][1], 4)
                        };
                        let v = _mm512_add_epi32(ps[t][0], hi);
                        if z != 0 {
                            _mm512_sub_epi32(v, _mm512_set1_epi32(z * a.sums[b][t]))
                        } else {
                            v
                        }
                    };
                    let (p0, p1, p2) = (part(0), part(1), part(2));
                    let low = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(p1, 8), p2));
                    let f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p0), _mm512_set1_ps(65536.0), low);
                    let sc = _mm512_mul_ps(d, _mm512_set1_ps(a.s[b]));
                    acc[g] = _mm512_fmadd_ps(f, sc, acc[g]);
                    if q41 {
                        acc[g] = _mm512_fmadd_ps(mv, _mm512_set1_ps(a.sum[b]), acc[g]);
                    }
                }
            }
            let mask: __mmask16 = if rows >= 16 {
                0xffff
            } else {
                (1u16 << rows) - 1
            };
            for (g, acc) in acc.iter().take(a.len()).enumerate() {
                let yp = y.add((i0 + g) * p.n + t * TILE);
                _mm512_mask_storeu_ps(yp, mask, *acc);
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::qdotf::tests::{random_blocks, xorshift};

    /// `got` equals `want` bit for bit (`what` names the case in the failure).
    pub(crate) fn same_bits(got: &[f32], want: &[f32], what: &str) {
        assert_eq!(got.len(), want.len(), "{what}");
        for (j, (g, e)) in got.iter().zip(want).enumerate() {
            assert_eq!(g.to_bits(), e.to_bits(), "{what} at {j}: {g} vs {e}");
        }
    }

    /// `len` activations in [-1, 1), every seventh block of 32 zeros and every fifth value 40 times larger
    /// (outliers that set their block's scale).
    pub(crate) fn activations(next: &mut impl FnMut() -> u64, len: usize) -> Vec<f32> {
        (0..len)
            .map(|i| {
                let v = ((next() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32;
                if (i / QK) % 7 == 3 {
                    0.0
                } else {
                    v * if i % 5 == 0 { 40.0 } else { 1.0 }
                }
            })
            .collect()
    }

    /// Row `r`'s dequantised weights, in f64.
    fn dequant(dtype: DType, w: &[u8], k: usize, r: usize) -> Vec<f64> {
        let bs = crate::qdotf::block_bytes(dtype);
        let nb = k / QK;
        let mut out = vec![0f64; k];
        for b in 0..nb {
            let blk = &w[(r * nb + b) * bs..][..bs];
            let d = f64::from(half(blk));
            for j in 0..QK {
                out[b * QK + j] = match dtype {
                    DType::Q8_0 => d * f64::from(blk[2 + j] as i8),
                    DType::Q4_0 => {
                        let byte = blk[2 + j % 16];
                        let q = if j < 16 { byte & 15 } else { byte >> 4 };
                        d * (f64::from(q) - 8.0)
                    }
                    _ => {
                        let byte = blk[4 + j % 16];
                        let q = if j < 16 { byte & 15 } else { byte >> 4 };
                        d * f64::from(q) + f64::from(half(&blk[2..]))
                    }
                };
            }
        }
        out
    }

    /// The AVX-512 and AVX2 block quantisations equal the scalar one bit for bit (parts, scale, sums), on blocks of
    /// random values, zeros, tiny values, large ones and blocks holding a NaN or an infinity; and the parts
    /// rebuild `q` within the bound.
    #[test]
    fn block_quantisation_simd_matches_scalar() {
        let mut next = xorshift(0x0123_4567_89ab_cdef);
        let mut blocks: Vec<[f32; QK]> = Vec::new();
        for i in 0..2000 {
            let scale = [1.0f32, 1e-30, 1e30, 3e-39, 0.0][i % 5];
            let mut c = [0f32; QK];
            for v in c.iter_mut() {
                *v = (((next() >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0) as f32 * scale;
            }
            if i % 97 == 5 {
                c[i % 32] = f32::NAN;
            }
            if i % 89 == 7 {
                c[(i + 3) % 32] = f32::NEG_INFINITY;
            }
            if i % 13 == 1 {
                // One outlier.
                c[i % 32] *= 1000.0;
            }
            blocks.push(c);
        }
        for c in &blocks {
            let (mut a, mut b, mut cc) = ([0i8; QK], [0i8; QK], [0i8; QK]);
            let want = quantise_block(c, [&mut a, &mut b, &mut cc]);
            let amax = c.iter().fold(0f32, |m, v| m.max(v.abs()));
            if want.0 == 0.0 {
                // Zeros, or magnitudes whose scale's inverse overflows (below ~2^-128 * 2^21).
                assert!(amax < 1e-30, "{c:?}");
                assert!([&a, &b, &cc].iter().all(|p| p.iter().all(|&v| v == 0)));
            }
            if want.0.is_finite() && want.0 > 0.0 {
                for j in 0..QK {
                    let q = 65536 * i64::from(a[j]) + 256 * i64::from(b[j]) + i64::from(cc[j]);
                    let err = (f64::from(c[j]) - q as f64 * f64::from(want.0)).abs();
                    assert!(err <= 0.75 * f64::from(want.0) + 1e-45, "{c:?}");
                }
            }
            assert_eq!(want.0.is_nan(), c.iter().any(|v| !v.is_finite()), "{c:?}");
            #[cfg(target_arch = "x86_64")]
            for wide in [true, false] {
                use std::is_x86_feature_detected as has;
                let present = if wide {
                    has!("avx512f") && has!("avx512bw")
                } else {
                    has!("avx2")
                };
                if !present {
                    continue;
                }
                let (mut a2, mut b2, mut c2) = ([0i8; QK], [0i8; QK], [0i8; QK]);
                // SAFETY: the form's features were detected.
                let got = unsafe {
                    if wide {
                        x86::quantise_block(c, [&mut a2, &mut b2, &mut c2])
                    } else {
                        avx2::quantise_block(c, [&mut a2, &mut b2, &mut c2])
                    }
                };
                assert_eq!((a, b, cc), (a2, b2, c2), "wide {wide} {c:?}");
                assert_eq!(want.0.to_bits(), got.0.to_bits(), "wide {wide} {c:?}");
                assert_eq!(want.1, got.1, "wide {wide} {c:?}");
                assert_eq!(want.2.to_bits(), got.2.to_bits(), "wide {wide} {c:?}");
            }
        }
    }

    /// Packing on two threads (large matrices) gives the bytes packing on one does.
    #[test]
    fn packing_on_threads_matches_one_thread() {
        let mut next = xorshift(0x7a3b_91c4_55e0_d2f1);
        for dtype in [DType::Q4_1, DType::Q8_0] {
            let (n, nb) = (2003, 18);
            let w = random_blocks(&mut next, dtype, n * nb);
            let (a, b) = (
                Packed::pack(dtype, n, nb * QK, &w, 1),
                Packed::pack(dtype, n, nb * QK, &w, 2),
            );
            assert!(a.bytes() >= 1 << 19, "large enough for two threads");
            // SAFETY: both hold `bytes()` initialised bytes.
            let view = |p: &Packed| unsafe { std::slice::from_raw_parts(p.ptr(), p.bytes()) };
            assert!(view(&a) == view(&b), "{dtype}");
        }
    }

    /// The tiled product against the exact product of the dequantised weights, within the activation
    /// quantisation's bound (1.5 `sum over blocks of sum |w| * max |x| / (2 * 2097151)`: each activation within 0.75 of a step), plus f32 rounding), and the
    /// SIMD kernel equal to the scalar form bit for bit, for every M group size and partial tiles.
    #[test]
    fn tiled_products_match_the_exact_product_and_the_scalar_form() {
        let mut next = xorshift(0x5851_f42d_4c95_7f2d);
        for dtype in [DType::Q4_1, DType::Q8_0, DType::Q4_0] {
            for (n, nb, m) in [(16, 1, 1), (37, 3, 2), (48, 18, 5), (5, 2, 4), (64, 48, 9)] {
                let k = nb * QK;
                let w = random_blocks(&mut next, dtype, n * nb);
                let x = activations(&mut next, m * k);
                let p = Packed::pack(dtype, n, k, &w, 2);
                let mut want = vec![0f32; m * n];
                matmul_scalar(&p, m, &x, &mut want);
                for r in 0..n {
                    let wr = dequant(dtype, &w, k, r);
                    for i in 0..m {
                        let xr = &x[i * k..(i + 1) * k];
                        let exact: f64 = wr.iter().zip(xr).map(|(a, b)| a * f64::from(*b)).sum();
                        let mag: f64 = wr
                            .iter()
                            .zip(xr)
                            .map(|(a, b)| (a * f64::from(*b)).abs())
                            .sum();
                        let qerr: f64 = (0..nb)
                            .map(|b| {
                                let amax = xr[b * QK..(b + 1) * QK]
                                    .iter()
                                    .fold(0f32, |m, v| m.max(v.abs()));
                                let sw: f64 =
                                    wr[b * QK..(b + 1) * QK].iter().map(|v| v.abs()).sum();
                                sw * f64::from(amax) / (2.0 * f64::from(QMAX))
                            })
                            .sum();
                        let got = f64::from(want[i * n + r]);
                        assert!(
                            (got - exact).abs() <= 1.5 * qerr + 1e-5 * mag + 1e-30,
                            "{dtype} n {n} k {k} row {r} act {i}: {got} vs {exact} (bound {qerr})"
                        );
                    }
                }
                #[cfg(target_arch = "x86_64")]
                for isa in crate::qdot::Isa::available() {
                    if !available(isa) {
                        continue;
                    }
                    let run = |m: usize, x: &[f32], y: &mut [f32], threads: usize| {
                        let pr = Product {
                            p: &p,
                            m,
                            x,
                            y: y.as_mut_ptr(),
                        };
                        // SAFETY: the CPU has `isa` (`Isa::available`), which is `available`; y holds m * n
                        // f32.
                        unsafe { matmul_group_on(isa, &[pr], threads) };
                    };
                    for threads in [1, 2] {
                        let mut got = vec![f32::NAN; m * n];
                        run(m, &x, &mut got, threads);
                        same_bits(&got, &want, &format!("{isa:?} {dtype} n {n} k {k} m {m}"));
                    }
                    // One row alone gives the same bits as inside the batch.
                    let mut one = vec![0f32; n];
                    run(1, &x[(m - 1) * k..], &mut one, 1);
                    assert_eq!(
                        one.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        want[(m - 1) * n..]
                            .iter()
                            .map(|v| v.to_bits())
                            .collect::<Vec<_>>()
                    );
                }
            }
        }
    }
}
