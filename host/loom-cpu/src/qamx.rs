//! Quantised weights ([`qtile::Packed`]) times 22-bit activations on Intel **AMX-INT8** tiles: the row form of
//! the quantised matrix product (`y[i, n] = sum_k deq(W[n, k]) * x[i, k]`, `W` Q8_0, Q4_0 or Q4_1) for
//! [`qtile::MAX_ROWS`] activation rows or more (decode epochs of many streams, prompts), with **the arithmetic
//! of `qtile`** (see its module doc), so every output has the bits `qtile`'s kernels give it: the same numbers
//! whichever path, row count or neighbours a row's call has.
//!
//! **Why tiles.** `qtile`'s AVX-512 VNNI kernel needs three integer dots (the activation parts `a`, `b`, `c`)
//! per block where f32 needs two multiply-adds, so above a few rows the f32 blocked dot of `qdotf` was faster.
//! One `tdpbsud` multiplies 16 activation rows by 16 weight rows over one block of 32 (8,192 exact
//! multiply-adds of signed activation bytes and unsigned weight bytes into 32-bit sums), which moves the
//! bottleneck to the per-block float work that every path has: the parts combined, scaled and accumulated in
//! f32 (11 vector operations per 16 outputs), which the vector units do for one block while the tile unit
//! multiplies the next (two sets of C tiles).
//!
//! **Layout.** The B tile (8 rows of 64 bytes: four consecutive weights of each of 16 weight rows) is exactly
//! `qtile`'s tile-block layout: Q8_0's eight lines are loaded in place, Q4's four lines are split into low
//! nibbles (weights `4j..`) and high nibbles (`16 + 4j..`) first. The activations are laid out once per call
//! as, per 16 rows, block and part, a 16 x 32-byte A tile ([`TileActs`]). A block's three products land in
//! three C tiles (16 activation rows x 16 weight rows of i32), stored and combined per activation row:
//! `f = 65536 f32(A) + f32(256 B + C)`, `acc += f * (d * s)`, `acc += m * sum x` (Q4_1), in block order, as
//! `qtile`'s kernels do ([`CONFIG`] names the tiles).
//!
//! **Availability.** CPUs with AMX-TILE, AMX-INT8 and AMX-BF16 (Sapphire Rapids and later) where Linux grants
//! the tile state (`amx::int8`), with AVX-512 VNNI (`qtile::available`). Nothing to opt in: the numerics are
//! the tiled path's. Elsewhere `qdotf` keeps its f32 product at these row counts.

use std::arch::asm;
use std::arch::x86_64::*;

use loom_ir::kernel::DType;

use crate::amx::{TileConfig, Tiles};
use crate::qdot::Isa;
use crate::qtile::{self, Acts, Packed, Product, TILE};

/// Weights per block (along K).
const QK: usize = 32;
/// Activation rows per A tile.
const ROWS: usize = 16;
/// Bytes of one A tile (16 rows of one block of one part).
const A_TILE: usize = ROWS * QK;

/// Tiles 0-2 and 4, 5, 7: two sets of three C tiles, 16 rows (activation rows) of 64 bytes (16 i32: weight
/// rows). Tile 3: A, 16 rows of 32 bytes (one block of one activation part). Tile 6: B, 8 rows of 64 bytes
/// (the block's 32 weights of 16 weight rows, four at a time).
static CONFIG: TileConfig = {
    let mut c = [0u8; 64];
    c[0] = 1;
    let mut t = 0;
    while t < 8 {
        let (colsb, rows) = match t {
            3 => (32, 16),
            6 => (64, 8),
            _ => (64, 16),
        };
        c[16 + 2 * t] = colsb;
        c[48 + t] = rows;
        t += 1;
    }
    TileConfig(c)
};

/// Whether [`matmul`] runs here: AVX-512 VNNI (`qtile::available`) and AMX-INT8 granted by the OS.
pub(crate) fn available(isa: Isa) -> bool {
    isa == Isa::Avx512Vnni && qtile::available(isa) && crate::amx::int8()
}

/// 64 bytes, 64-byte aligned.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// The activation rows quantised (`qtile::Acts`) and laid out for the A tiles: per (16-row group, block,
/// part) one 512-byte tile, rows past `m` zero; per (group, block) the 16 rows' scales and f32 sums, and per
/// (group, block, part) the 16 rows' part sums times the weights' zero point.
struct TileActs {
    nb: usize,
    tiles: Vec<Line>,
    s: Vec<f32>,
    sum: Vec<f32>,
    zs: Vec<i32>,
}

impl TileActs {
    fn new(dtype: DType, m: usize, k: usize, x: &[f32], threads: usize) -> TileActs {
        let nb = k / QK;
        let groups = m.div_ceil(ROWS);
        let mut a = TileActs {
            nb,
            tiles: vec![Line([0; 64]); groups * nb * 3 * A_TILE / 64],
            s: vec![0.0; groups * nb * ROWS],
            sum: vec![0.0; groups * nb * ROWS],
            zs: vec![0; groups * nb * 3 * ROWS],
        };
        let z = qtile::zero_point(dtype);
        let out = Shared(
            a.tiles.as_mut_ptr() as *mut u8,
            a.s.as_mut_ptr(),
            a.sum.as_mut_ptr(),
            a.zs.as_mut_ptr(),
        );
        let group = |g: usize| {
            let out = &out;
            for r in 0..ROWS.min(m - g * ROWS) {
                let i = g * ROWS + r;
                let q = Acts::new(&x[i * k..(i + 1) * k]);
                for b in 0..nb {
                    let gb = g * nb + b;
                    // SAFETY: group `g`'s ranges (tiles `gb * 3 ..`, scales `gb * 16 ..`) are written by this
                    // task only; every index is inside the vectors sized above, which outlive the tasks.
                    unsafe {
                        for t in 0..3 {
                            std::ptr::copy_nonoverlapping(
                                q.parts[t].as_ptr().add(b * QK) as *const u8,
                                out.0.add((gb * 3 + t) * A_TILE + r * QK),
                                QK,
                            );
                            *out.3.add((gb * 3 + t) * ROWS + r) = z * q.sums[b][t];
                        }
                        *out.1.add(gb * ROWS + r) = q.s[b];
                        *out.2.add(gb * ROWS + r) = q.sum[b];
                    }
                }
            }
        };
        let threads = threads.clamp(1, groups.max(1)).min(((m * k) >> 15).max(1));
        if threads <= 1 {
            (0..groups).for_each(group);
        } else {
            crate::pool::run(groups, threads - 1, &group);
        }
        a
    }
}

/// [`TileActs::new`]'s outputs, written by its tasks at disjoint indices.
struct Shared(*mut u8, *mut f32, *mut f32, *mut i32);
// SAFETY: each task writes its own group's indices only (see `TileActs::new`).
unsafe impl Sync for Shared {}

/// `y [m, p.n] = x [m, p.k] @ W^T` on AMX-INT8 tiles (see the module doc), `y` row-major f32 (possibly
/// unaligned); every output has the bits `qtile::matmul` gives it. Threads claim chunks of 16 weight rows.
///
/// # Safety
/// [`available`] holds; `y` is valid for `m * p.n` f32 writes and overlaps neither `p` nor `x`.
pub(crate) unsafe fn matmul(p: &Packed, m: usize, x: &[f32], y: *mut f32, threads: usize) {
    // SAFETY: the caller's contract.
    unsafe { matmul_group(&[Product { p, m, x, y }], threads) }
}

/// Several independent products in one parallel region (consecutive dispatches of a stage, as
/// `qtile::matmul_group`): threads claim chunks of weight tiles across all of them, and products that read the
/// same activation rows lay them out once. Each product's results are the bits [`matmul`] gives it alone.
///
/// # Safety
/// [`available`] holds; each `y` is valid for `m * p.n` f32 writes and overlaps no product's `x`, `y` or weights.
pub(crate) unsafe fn matmul_group(products: &[Product<'_>], threads: usize) {
    let mut acts: Vec<std::rc::Rc<TileActs>> = Vec::with_capacity(products.len());
    for (j, pr) in products.iter().enumerate() {
        assert!(pr.x.len() == pr.m * pr.p.k && pr.p.k.is_multiple_of(QK));
        let same = products[..j].iter().position(|q| {
            std::ptr::eq(q.x, pr.x) && q.x.len() == pr.x.len() && q.p.dtype == pr.p.dtype
        });
        acts.push(match same {
            Some(i) => acts[i].clone(),
            None => std::rc::Rc::new(TileActs::new(pr.p.dtype, pr.m, pr.p.k, pr.x, threads)),
        });
    }
    let acts: Vec<&TileActs> = acts.iter().map(|a| a.as_ref()).collect();
    let (threads, per, chunks) = qtile::chunks(products, threads);
    let work = |c: usize| {
        let (j, t0) = chunks[c];
        let (pr, a) = (&products[j], acts[j]);
        // SAFETY: AMX is present and granted (`available`); CONFIG is a valid palette-1 configuration.
        let _tiles = unsafe { Tiles::with(&CONFIG) };
        let mut scratch = Scratch {
            c: [Line([0; 64]); 96],
            b: [Line([0; 64]); 16],
        };
        for t in t0..(t0 + per).min(pr.p.n.div_ceil(TILE)) {
            for g in 0..pr.m.div_ceil(ROWS) {
                // SAFETY: the configuration is loaded on this thread; the outputs (rows of group g, weight rows
                // of tile t of product j) are this chunk's only and lie inside that product's y (caller).
                unsafe { tile(pr.p, t, a, g, pr.m, pr.y, &mut scratch) };
            }
        }
    };
    if threads <= 1 {
        (0..chunks.len()).for_each(work);
    } else {
        crate::pool::run(chunks.len(), threads - 1, &work);
    }
}

/// A thread's scratch: two sets of three C tiles (3 KiB each) and two Q4 blocks' B tiles (512 bytes each),
/// one of each for the block being multiplied and one for the block being combined.
struct Scratch {
    c: [Line; 96],
    b: [Line; 16],
}

/// One block's three products into C tile set `SET` (0: tmm0-2, 1: tmm4, tmm5, tmm7), stored at `c` (three
/// 1 KiB tiles): each activation part's A tile is loaded into tmm3 in turn, the weights' B tile into tmm6.
///
/// # Safety
/// The tile configuration [`CONFIG`] is loaded on this thread; `bt` holds 8 rows of 64 bytes, `at` three
/// 512-byte A tiles, `c` 3 KiB.
#[inline(always)]
unsafe fn products<const SET: usize>(bt: *const u8, at: *const u8, c: *mut u8) {
    // One block's products into the C tiles named: zeroed, each part's A tile loaded into tmm3 and multiplied
    // by the B tile in tmm6, then stored.
    macro_rules! block {
        ($c0:literal, $c1:literal, $c2:literal) => {
            asm!(
                concat!("tilezero ", $c0),
                concat!("tilezero ", $c1),
                concat!("tilezero ", $c2),
                "tileloadd tmm6, [{b} + {s64}*1]",
                "tileloadd tmm3, [{a0} + {s32}*1]",
                concat!("tdpbsud ", $c0, ", tmm3, tmm6"),
                "tileloadd tmm3, [{a1} + {s32}*1]",
                concat!("tdpbsud ", $c1, ", tmm3, tmm6"),
                "tileloadd tmm3, [{a2} + {s32}*1]",
                concat!("tdpbsud ", $c2, ", tmm3, tmm6"),
                concat!("tilestored [{c0} + {s64}*1], ", $c0),
                concat!("tilestored [{c1} + {s64}*1], ", $c1),
                concat!("tilestored [{c2} + {s64}*1], ", $c2),
                b = in(reg) bt,
                a0 = in(reg) at,
                a1 = in(reg) at.add(A_TILE),
                a2 = in(reg) at.add(2 * A_TILE),
                c0 = in(reg) c,
                c1 = in(reg) c.add(1024),
                c2 = in(reg) c.add(2048),
                s32 = in(reg) 32usize,
                s64 = in(reg) 64usize,
                options(nostack)
            )
        };
    }
    // SAFETY: the caller's contract: every tile load and store stays inside those buffers.
    unsafe {
        if SET == 0 {
            block!("tmm0", "tmm1", "tmm2");
        } else {
            block!("tmm4", "tmm5", "tmm7");
        }
    }
}

/// Weight tile `t` (rows `16 t ..`) times activation group `g` (rows `16 g ..`), into `y`. The tile unit
/// multiplies block `b + 1` (into the other C set) while the vector units combine block `b`, so neither waits
/// for the other's latency.
///
/// # Safety
/// The tile configuration [`CONFIG`] is loaded on this thread; AVX-512 F/BW and F16C are present; `y` is valid
/// for the written elements (rows `16 g .. min(16 g + 16, m)`, columns `16 t .. min(16 t + 16, p.n)`).
#[target_feature(enable = "avx512f,avx512bw,f16c")]
unsafe fn tile(
    p: &Packed,
    t: usize,
    a: &TileActs,
    g: usize,
    m: usize,
    y: *mut f32,
    scratch: &mut Scratch,
) {
    let (tb, wb) = (qtile::tile_block(p.dtype), qtile::weight_bytes(p.dtype));
    let nb = a.nb;
    let z = qtile::zero_point(p.dtype);
    let q8 = p.dtype == DType::Q8_0;
    let q41 = p.dtype == DType::Q4_1;
    let lo_mask = _mm512_set1_epi8(0x0f);
    let mut acc = [_mm512_setzero_ps(); ROWS];
    let c = scratch.c.as_mut_ptr() as *mut u8;
    let bs = scratch.b.as_mut_ptr() as *mut u8;
    // SAFETY (the whole body): tile t's nb tile-blocks lie inside `p`'s data (64-byte aligned, `tb` a multiple
    // of 64); group g's A tiles (512 bytes each) and per-block values lie inside `a` (made for `m` rows over
    // `nb` blocks); `products` reads 8 rows of 64 bytes of B (the block's weight lines, or a half of
    // `scratch.b`) and writes one half of `scratch.c`.
    unsafe {
        let base = p.ptr().add(t * nb * tb);
        // Block b's products into C set b % 2 (stored in that half of the scratch).
        let issue = |b: usize| {
            let o = base.add(b * tb);
            let bt = if q8 {
                o
            } else {
                let bh = bs.add(512 * (b % 2));
                for j in 0..4 {
                    let v = _mm512_load_si512(o.add(64 * j) as *const _);
                    _mm512_store_si512(bh.add(64 * j) as *mut _, _mm512_and_si512(v, lo_mask));
                    _mm512_store_si512(
                        bh.add(64 * (4 + j)) as *mut _,
                        _mm512_and_si512(_mm512_srli_epi16(v, 4), lo_mask),
                    );
                }
                bh as *const u8
            };
            let at = (a.tiles.as_ptr() as *const u8).add((g * nb + b) * 3 * A_TILE);
            let ch = c.add(3072 * (b % 2));
            if b.is_multiple_of(2) {
                products::<0>(bt, at, ch);
            } else {
                products::<1>(bt, at, ch);
            }
        };
        issue(0);
        for b in 0..nb {
            if b + 1 < nb {
                issue(b + 1);
            }
            let o = base.add(b * tb);
            qtile::prefetch_ahead(o, tb);
            let ch = c.add(3072 * (b % 2));
            let gb = g * nb + b;
            let d = _mm512_cvtph_ps(_mm256_load_si256(o.add(wb) as *const _));
            let mv = if q41 {
                _mm512_cvtph_ps(_mm256_load_si256(o.add(wb + 32) as *const _))
            } else {
                _mm512_setzero_ps()
            };
            let (s, sum, zs) = (
                a.s.as_ptr().add(gb * ROWS),
                a.sum.as_ptr().add(gb * ROWS),
                a.zs.as_ptr().add(gb * 3 * ROWS),
            );
            // Row by row, unrolled so that the 16 accumulators stay in registers.
            macro_rules! row {
                ($r:expr) => {{
                    let r: usize = $r;
                    let part = |t: usize| {
                        let v = _mm512_load_si512(ch.add(1024 * t + 64 * r) as *const _);
                        if z != 0 {
                            _mm512_sub_epi32(v, _mm512_set1_epi32(*zs.add(t * ROWS + r)))
                        } else {
                            v
                        }
                    };
                    let (p0, p1, p2) = (part(0), part(1), part(2));
                    let low = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(p1, 8), p2));
                    let f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p0), _mm512_set1_ps(65536.0), low);
                    let sc = _mm512_mul_ps(d, _mm512_set1_ps(*s.add(r)));
                    acc[r] = _mm512_fmadd_ps(f, sc, acc[r]);
                    if q41 {
                        acc[r] = _mm512_fmadd_ps(mv, _mm512_set1_ps(*sum.add(r)), acc[r]);
                    }
                }};
            }
            row!(0);
            row!(1);
            row!(2);
            row!(3);
            row!(4);
            row!(5);
            row!(6);
            row!(7);
            row!(8);
            row!(9);
            row!(10);
            row!(11);
            row!(12);
            row!(13);
            row!(14);
            row!(15);
        }
        let cols = (p.n - t * TILE).min(TILE);
        let mask: __mmask16 = if cols >= 16 {
            0xffff
        } else {
            (1u16 << cols) - 1
        };
        for (r, acc) in acc.iter().enumerate().take(ROWS.min(m - g * ROWS)) {
            _mm512_mask_storeu_ps(y.add((g * ROWS + r) * p.n + t * TILE), mask, *acc);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qdotf::tests::{random_blocks, xorshift};

    /// The AMX product equals `qtile`'s scalar form bit for bit (and so its VNNI kernel), for every dtype,
    /// partial weight tiles and partial groups of activation rows, on one and two threads.
    #[test]
    fn amx_products_match_the_tiled_scalar_form() {
        if !available(Isa::detect()) {
            eprintln!("no AMX-INT8 here: skipped");
            return;
        }
        let mut next = xorshift(0x2545_f491_4f6c_dd1d);
        for dtype in [DType::Q4_1, DType::Q8_0, DType::Q4_0] {
            for (n, nb, m) in [
                (16, 1, 8),
                (37, 3, 16),
                (48, 18, 17),
                (5, 2, 9),
                (64, 48, 40),
            ] {
                let k = nb * QK;
                let w = random_blocks(&mut next, dtype, n * nb);
                let x = crate::qtile::tests::activations(&mut next, m * k);
                let p = Packed::pack(dtype, n, k, &w, 1);
                let mut want = vec![0f32; m * n];
                qtile::matmul_scalar(&p, m, &x, &mut want);
                for threads in [1, 2] {
                    let mut got = vec![f32::NAN; m * n];
                    // SAFETY: available; got holds m * n f32.
                    unsafe { matmul(&p, m, &x, got.as_mut_ptr(), threads) };
                    let what = format!("{dtype} n {n} k {k} m {m} threads {threads}");
                    crate::qtile::tests::same_bits(&got, &want, &what);
                }
            }
        }
    }
}
