//! f32 GEMM on Intel AMX tiles (AMX-BF16) as three bf16 products ("bf16x3"): **opt-in** with
//! `LOOM_CPU_AMX=1`, because its products carry 16 significant bits where f32 has 24.
//!
//! # Numerics
//!
//! Each f32 operand is split into two bf16 numbers, `x = hi + lo + e`: `hi` is `x` rounded to bf16 (8
//! significant bits, to nearest, ties to even), `lo` is the exact remainder `x - hi` (`|x - hi| <= 2^-8 |x|`)
//! rounded to bf16, so `|e| <= 2^-16 |x|`. The product is `a b ~ a_hi b_hi + a_hi b_lo + a_lo b_hi` (the
//! dropped `a_lo b_lo` is at most `2^-16 |a b|`), each term an AMX `tdpbf16ps` (bf16 pairs multiplied exactly,
//! summed into f32 accumulators). Every product is within `3 * 2^-16 |a b|` (about `2^-14.4`) of the exact
//! one, plus the f32 accumulation; an f32 multiply-add is within `2^-24 |a b|`. The errors have random signs,
//! so over a dot of `K` terms they grow like `sqrt(K)`; where the terms cancel, the result's relative error is
//! larger: the motif tests (`tests/motifs.rs`, `1e-5` relative against numpy's float64, mixed-sign operands)
//! fail with it (2.1e-5 on an output of 0.37 at K = 64), which is why it is not the default. Embeddings
//! compared by cosine (MiniLM) do not notice. Infinite or NaN inputs give infinite or NaN results as with f32
//! (their `lo` is zero); bf16 denormals are read as zero by the tile unit (values below `2^-126` contribute
//! nothing through `lo`).
//!
//! # Speed (`cargo bench -p loom-cpu`, `LOOM_BENCH=gemm`, with and without `LOOM_CPU_AMX=1`; BENCHMARKS.md)
//!
//! One `tdpbf16ps` multiplies a 16 x 32 bf16 tile by a 32 x 16 one (8,192 multiply-adds, ~6 ns here); a tile
//! load is ~5.7 ns when its 16 rows are 64-byte aligned and about three times that when they straddle cache
//! lines, so every packed buffer is aligned. Per 32-deep slice the microkernel loads 8 tiles for 12 dots
//! (`block`), about 540 GFLOP/s of f32 product per core from L1 against the AVX-512 FMA peak of ~170.
//!
//! # Layout
//!
//! Both operands are packed into 4 KiB units, one per 32-row (A) or 32-column (B) block and 32-deep slice of
//! K: four 1 KiB tiles, `hi` rows/columns 0-15, `hi` 16-31, `lo` 0-15, `lo` 16-31. A tiles are 16 rows of 32
//! bf16 (K along the row); B tiles are in the pair layout the instruction reads: 16 rows of K pairs, each row
//! the 16 columns' `(k, k + 1)` pairs. Rows past M, columns past N and K past its end are zeros. A task packs
//! up to 1 MiB of A's rows (kept in L2) and runs every column block of its share of B past them, K in chunks
//! of four slices so a chunk of B stays in L1 for all the task's row blocks. With one group of rows, each
//! task packs the B columns it uses just before using them; with several, B is packed once up front.
//!
//! # Availability
//!
//! Used where `LOOM_CPU_AMX=1`, the CPU reports AMX-TILE, AMX-BF16 and AVX-512F, and Linux grants the process
//! the tile state (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`), for products of at least
//! `kernels::AMX_MIN_ROWS` rows; otherwise the `gemm` crate's f32 microkernels run (`kernels.rs`). The unit
//! tests below run wherever the hardware is present, opted in or not.

use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::RefCell;
use std::sync::OnceLock;

/// Bytes of one packed unit (4 tiles of 16 x 64 bytes).
const UNIT: usize = 4096;
/// bf16 elements of one unit.
const UNIT_H: usize = UNIT / 2;

/// Whether the f32 GEMMs of this process run on AMX: the CPU and the OS allow it ([`hardware`]) and the
/// operator opted in with `LOOM_CPU_AMX=1` (the products carry 16 significant bits, not f32's 24: module doc).
pub(crate) fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("LOOM_CPU_AMX").is_ok_and(|v| v == "1") && hardware())
}

/// Whether this CPU has AMX-TILE, AMX-BF16 and AVX-512F and Linux granted the process the tile state
/// (detected once).
pub(crate) fn hardware() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        // CPUID leaf 7: EDX bit 22 AMX-BF16, bit 24 AMX-TILE; the split needs AVX-512F.
        let l7 = __cpuid_count(7, 0);
        let amx = l7.edx & (1 << 22) != 0 && l7.edx & (1 << 24) != 0;
        amx && is_x86_feature_detected!("avx512f") && request_tile_state()
    })
}

/// Asks Linux for the AMX tile data state (`arch_prctl(ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA =
/// 18)`): process-wide, idempotent; without it the first tile instruction faults.
#[cfg(target_os = "linux")]
fn request_tile_state() -> bool {
    let ret: i64;
    // SAFETY: the arch_prctl system call (158) with a permission request reads no memory of ours; the
    // syscall instruction clobbers rcx and r11, which are declared.
    unsafe {
        asm!(
            "syscall",
            inlateout("rax") 158i64 => ret,
            in("rdi") 0x1023i64,
            in("rsi") 18i64,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret == 0
}

#[cfg(not(target_os = "linux"))]
fn request_tile_state() -> bool {
    false
}

/// A tile configuration (64 bytes, `ldtilecfg`'s layout). This module's: palette 1, all eight tiles 16 rows
/// of 64 bytes.
#[repr(C, align(64))]
pub(crate) struct TileConfig(pub(crate) [u8; 64]);

static CONFIG: TileConfig = {
    let mut c = [0u8; 64];
    c[0] = 1;
    let mut t = 0;
    while t < 8 {
        c[16 + 2 * t] = 64;
        c[48 + t] = 16;
        t += 1;
    }
    TileConfig(c)
};

/// Loads the tile configuration on this thread and releases the tiles when dropped (so a thread that stops
/// using them does not keep the tile state live in every context switch).
pub(crate) struct Tiles;

impl Tiles {
    /// # Safety
    /// [`hardware`] returned true.
    unsafe fn config() -> Tiles {
        // SAFETY: the caller's contract.
        unsafe { Tiles::with(&CONFIG) }
    }

    /// Loads `config`.
    ///
    /// # Safety
    /// [`hardware`] returned true and `config` is a valid palette-1 configuration.
    pub(crate) unsafe fn with(config: &TileConfig) -> Tiles {
        // SAFETY: AMX is present and permitted, the configuration valid (caller).
        unsafe { asm!("ldtilecfg [{0}]", in(reg) config.0.as_ptr(), options(nostack, readonly)) };
        Tiles
    }
}

/// Whether the CPU also has AMX-INT8 (CPUID leaf 7, EDX bit 25), besides [`hardware`]'s requirements.
pub(crate) fn int8() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| __cpuid_count(7, 0).edx & (1 << 25) != 0 && hardware())
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: a configuration was loaded by `config`.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}

/// Splits 16 f32 into bf16 `hi` and `lo` (see the module doc), each as the low halves of 16 dwords.
///
/// # Safety
/// The CPU has AVX-512F (checked by [`hardware`]).
#[inline]
#[target_feature(enable = "avx512f")]
fn split16(x: __m512) -> (__m512i, __m512i) {
    let exp = _mm512_set1_epi32(0x7f80_0000);
    let rne = |b: __m512i| {
        let odd = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
        _mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7fff)), odd)
    };
    let bits = _mm512_castps_si512(x);
    let mut hi = _mm512_and_si512(rne(bits), _mm512_set1_epi32(-65536));
    // Rounding a finite value past the largest bf16: truncate instead (hi stays finite, lo takes the rest).
    let hi_special = _mm512_cmpeq_epi32_mask(_mm512_and_si512(hi, exp), exp);
    let x_special = _mm512_cmpeq_epi32_mask(_mm512_and_si512(bits, exp), exp);
    hi = _mm512_mask_and_epi32(hi, hi_special & !x_special, bits, _mm512_set1_epi32(-65536));
    // NaN stays NaN (truncating 0x7f800001 would make it infinite): set the quiet bit.
    let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
    hi = _mm512_mask_or_epi32(hi, nan, hi, _mm512_set1_epi32(0x0040_0000));
    let r = _mm512_sub_ps(x, _mm512_castsi512_ps(hi));
    // Infinite or NaN hi: lo is zero (inf - inf would be NaN).
    let lo = _mm512_maskz_mov_epi32(
        !x_special,
        _mm512_srli_epi32(rne(_mm512_castps_si512(r)), 16),
    );
    (_mm512_srli_epi32(hi, 16), lo)
}

/// Packs `a` rows `r0 .. r0 + 32 * blocks` (rows past `m` as zeros) into `out` (`blocks * nkb` units, block
/// by block, each block's K slices in order). `a` is row-major `[m, k]`.
///
/// # Safety
/// AVX-512F is present; `a` is valid for `m * k` f32; `out` has room.
#[target_feature(enable = "avx512f")]
unsafe fn pack_a(a: *const f32, m: usize, k: usize, r0: usize, blocks: usize, out: &mut [u16]) {
    let nkb = k.div_ceil(32);
    assert!(out.len() >= blocks * nkb * UNIT_H);
    for ib in 0..blocks {
        for rr in 0..32 {
            let i = r0 + ib * 32 + rr;
            let (tile, row) = (rr / 16, rr % 16);
            for kb in 0..nkb {
                let unit = (ib * nkb + kb) * UNIT_H;
                let (hi_at, lo_at) = (
                    unit + tile * 512 + row * 32,
                    unit + (2 + tile) * 512 + row * 32,
                );
                for half in 0..2 {
                    let k0 = kb * 32 + half * 16;
                    let n = if i < m {
                        k.saturating_sub(k0).min(16)
                    } else {
                        0
                    };
                    // SAFETY: lanes below n read row i < m at columns k0 .. k0 + n <= k.
                    let x = unsafe {
                        _mm512_maskz_loadu_ps(((1u32 << n) - 1) as u16, a.wrapping_add(i * k + k0))
                    };
                    let (hi, lo) = split16(x);
                    // SAFETY: 16 u16 at hi_at/lo_at + 16 * half lie inside this unit's row.
                    unsafe {
                        _mm256_storeu_si256(
                            out.as_mut_ptr().add(hi_at + 16 * half) as *mut __m256i,
                            _mm512_cvtepi32_epi16(hi),
                        );
                        _mm256_storeu_si256(
                            out.as_mut_ptr().add(lo_at + 16 * half) as *mut __m256i,
                            _mm512_cvtepi32_epi16(lo),
                        );
                    }
                }
            }
        }
    }
}

/// Packs `b`'s column blocks `jb0 .. jb0 + blocks` (32 columns each; columns past `n` as zeros) into `out`,
/// block by block, each block's K slices in order. `b`'s element `(k, j)` is at `b + k * b_rs + j * b_cs`:
/// rows of `b` contiguous (`b_cs == 1`, a `[K, N]` matrix) or columns (`b_rs == 1`, `[N, K]`, PyTorch's
/// `Linear` layout), read 16 at a time (the only layouts `kernels::sgemm_threads` passes).
///
/// # Safety
/// AVX-512F is present; `b` is valid for every `(k, j)` with `k < kk`, `j < n`; `out` has room.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f")]
unsafe fn pack_b(
    b: *const f32,
    b_cs: isize,
    b_rs: isize,
    n: usize,
    kk: usize,
    jb0: usize,
    blocks: usize,
    out: &mut [u16],
) {
    let nkb = kk.div_ceil(32);
    assert!(out.len() >= blocks * nkb * UNIT_H && (b_cs == 1 || b_rs == 1));
    let mask = |valid: usize| ((1u32 << valid.min(16)) - 1) as u16;
    let o = out.as_mut_ptr();
    for jb in 0..blocks {
        for kb in 0..nkb {
            let unit = (jb * nkb + kb) * UNIT_H;
            let k0 = kb * 32;
            for tile in 0..2 {
                let j0 = (jb0 + jb) * 32 + tile * 16;
                let (hi_t, lo_t) = (unit + tile * 512, unit + (2 + tile) * 512);
                if b_cs == 1 {
                    // Rows of b: pair row p is rows k0 + 2p and k0 + 2p + 1, 16 columns each, interleaved.
                    let cols = mask(n.saturating_sub(j0));
                    for p in 0..16 {
                        let row = |k: usize| {
                            let mk = if k < kk { cols } else { 0 };
                            // SAFETY: lanes in `mk` read (k, j0 + c) with k < kk, j0 + c < n.
                            split16(unsafe {
                                _mm512_maskz_loadu_ps(
                                    mk,
                                    b.wrapping_offset(k as isize * b_rs + j0 as isize),
                                )
                            })
                        };
                        let ((h0, l0), (h1, l1)) = (row(k0 + 2 * p), row(k0 + 2 * p + 1));
                        // SAFETY: 32 u16 at hi_t/lo_t + 32 p lie inside the tile.
                        unsafe {
                            _mm512_storeu_si512(
                                o.add(hi_t + 32 * p) as *mut __m512i,
                                _mm512_or_si512(h0, _mm512_slli_epi32(h1, 16)),
                            );
                            _mm512_storeu_si512(
                                o.add(lo_t + 32 * p) as *mut __m512i,
                                _mm512_or_si512(l0, _mm512_slli_epi32(l1, 16)),
                            );
                        }
                    }
                } else {
                    // Columns of b: column c's 32 values are contiguous; its pairs go down the tile's rows.
                    for c in 0..16 {
                        let j = j0 + c;
                        for half in 0..2 {
                            let k = k0 + 16 * half;
                            let mk = if j < n { mask(kk.saturating_sub(k)) } else { 0 };
                            // SAFETY: lanes in `mk` read (k + t, j) with k + t < kk, j < n.
                            let (h, l) = split16(unsafe {
                                _mm512_maskz_loadu_ps(
                                    mk,
                                    b.wrapping_offset(k as isize + j as isize * b_cs),
                                )
                            });
                            let (mut hv, mut lv) = ([0u32; 8], [0u32; 8]);
                            // SAFETY: 8 u32 (16 u16) each.
                            unsafe {
                                _mm256_storeu_si256(
                                    hv.as_mut_ptr() as *mut __m256i,
                                    _mm512_cvtepi32_epi16(h),
                                );
                                _mm256_storeu_si256(
                                    lv.as_mut_ptr() as *mut __m256i,
                                    _mm512_cvtepi32_epi16(l),
                                );
                            }
                            for q in 0..8 {
                                let at = (8 * half + q) * 32 + 2 * c;
                                // SAFETY: the pair at row 8 half + q, column c lies inside the tile.
                                unsafe {
                                    (o.add(hi_t + at) as *mut u32).write_unaligned(hv[q]);
                                    (o.add(lo_t + at) as *mut u32).write_unaligned(lv[q]);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// K slices (32 deep) of one chunk: the chunk's B units (`KC * 4` KiB) stay in L1 while every row block of
/// the task passes them, each row block's accumulators loaded from and stored to the task's C buffer.
const KC: usize = 4;

/// 64-byte aligned storage: a tile row that straddles two cache lines loads at about a third of the speed.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Line([u16; 32]);

thread_local! {
    /// Each thread's packed A rows, and (on the calling thread) the packed B, kept between calls: a fresh
    /// allocation of megabytes is page faults on every call, serialised between the threads.
    static PACKED_A: RefCell<Vec<Line>> = const { RefCell::new(Vec::new()) };
    static PACKED_B: RefCell<Vec<Line>> = const { RefCell::new(Vec::new()) };
}

/// Kept buffers larger than this are freed after the call.
const KEEP_BYTES: usize = 64 << 20;

/// Runs `f` with `units` packed units of `slot`'s buffer (contents unspecified: the packers write every
/// element).
fn with_packed<R>(
    slot: &'static std::thread::LocalKey<RefCell<Vec<Line>>>,
    units: usize,
    f: impl FnOnce(&mut [u16]) -> R,
) -> R {
    slot.with(|cell| {
        let mut v = cell.borrow_mut();
        let lines = units * UNIT / 64;
        if v.len() < lines {
            v.resize(lines, Line([0; 32]));
        }
        // SAFETY: `Line` is 32 u16 with no padding; the vector's lines are contiguous.
        let buf = unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u16, lines * 32) };
        let r = f(buf);
        if v.len() * 64 > KEEP_BYTES {
            *v = Vec::new();
        }
        r
    })
}

/// One 32 x 32 block of f32 accumulators (row stride 128 bytes), 64-byte aligned.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Acc([f32; 1024]);

/// Adds the product of `kn` packed A units `pa` and B units `pb` to `acc`, which is zeroed first when
/// `first`. The tile loads of each step are spread between its dots, each into a tile the dots before it are
/// done with (the tiles are not renamed: a load waits for every earlier dot that reads its tile).
///
/// # Safety
/// The tile configuration is loaded on this thread; `pa` and `pb` hold `kn >= 1` units, 64-byte aligned.
unsafe fn block(pa: *const u16, pb: *const u16, kn: usize, acc: &mut Acc, first: bool) {
    let dst = acc.0.as_mut_ptr();
    let stride = 128usize;
    let s = 64usize;
    // SAFETY (all asm below): every tile load reads one 1 KiB tile (16 rows of 64 bytes at stride 64) inside
    // the caller's units, or 16 rows of 64 bytes at stride 128 inside `acc`; stores write the same inside
    // `acc`.
    unsafe {
        if first {
            asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                options(nostack, nomem)
            );
        } else {
            asm!(
                "tileloadd tmm0, [{c0} + {s}*1]",
                "tileloadd tmm1, [{c1} + {s}*1]",
                "tileloadd tmm2, [{c2} + {s}*1]",
                "tileloadd tmm3, [{c3} + {s}*1]",
                c0 = in(reg) dst,
                c1 = in(reg) dst.add(16),
                c2 = in(reg) dst.add(512),
                c3 = in(reg) dst.add(528),
                s = in(reg) stride,
                options(nostack, readonly)
            );
        }
        // Step 0's B_hi and A_lo.
        asm!(
            "tileloadd tmm6, [{b} + {s}*1]",
            "tileloadd tmm7, [{b1} + {s}*1]",
            "tileloadd tmm4, [{a2} + {s}*1]",
            "tileloadd tmm5, [{a3} + {s}*1]",
            b = in(reg) pb,
            b1 = in(reg) pb.add(512),
            a2 = in(reg) pa.add(1024),
            a3 = in(reg) pa.add(1536),
            s = in(reg) s,
            options(nostack, readonly)
        );
        for kb in 0..kn {
            let a = pa.add(kb * UNIT_H);
            let b = pb.add(kb * UNIT_H);
            // With B_hi in tmm6/7 and A_lo in tmm4/5: A_lo B_hi, then A_hi B_hi, then A_hi B_lo.
            asm!(
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tileloadd tmm4, [{a} + {s}*1]",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                "tileloadd tmm5, [{a1} + {s}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tileloadd tmm6, [{b2} + {s}*1]",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tdpbf16ps tmm3, tmm5, tmm7",
                "tileloadd tmm7, [{b3} + {s}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm2, tmm5, tmm6",
                a = in(reg) a,
                a1 = in(reg) a.add(512),
                b2 = in(reg) b.add(1024),
                b3 = in(reg) b.add(1536),
                s = in(reg) s,
                options(nostack, readonly)
            );
            if kb + 1 < kn {
                // The next step's B_hi and A_lo, each after the last dot that reads its tile.
                let (a, b) = (a.add(UNIT_H), b.add(UNIT_H));
                asm!(
                    "tileloadd tmm6, [{b} + {s}*1]",
                    "tdpbf16ps tmm1, tmm4, tmm7",
                    "tdpbf16ps tmm3, tmm5, tmm7",
                    "tileloadd tmm4, [{a2} + {s}*1]",
                    "tileloadd tmm5, [{a3} + {s}*1]",
                    "tileloadd tmm7, [{b1} + {s}*1]",
                    b = in(reg) b,
                    b1 = in(reg) b.add(512),
                    a2 = in(reg) a.add(1024),
                    a3 = in(reg) a.add(1536),
                    s = in(reg) s,
                    options(nostack, readonly)
                );
            } else {
                asm!(
                    "tdpbf16ps tmm1, tmm4, tmm7",
                    "tdpbf16ps tmm3, tmm5, tmm7",
                    options(nostack, nomem)
                );
            }
        }
        asm!(
            "tilestored [{c0} + {s}*1], tmm0",
            "tilestored [{c1} + {s}*1], tmm1",
            "tilestored [{c2} + {s}*1], tmm2",
            "tilestored [{c3} + {s}*1], tmm3",
            c0 = in(reg) dst,
            c1 = in(reg) dst.add(16),
            c2 = in(reg) dst.add(512),
            c3 = in(reg) dst.add(528),
            s = in(reg) stride,
            options(nostack)
        );
    }
}

/// Raw pointers that cross into the pool's threads: C, A and the packed B.
#[derive(Clone, Copy)]
struct Ptrs(*mut f32, *const f32, *const u16);
// SAFETY: the tasks write disjoint blocks of C and only read A and the packed B.
unsafe impl Send for Ptrs {}
unsafe impl Sync for Ptrs {}

/// Bytes of packed A rows one task keeps (in L2) while every column block of B streams past them once: the
/// more rows, the fewer times B is read from L3 (with 128 rows, two threads were bound by those reads).
const TASK_A_BYTES: usize = 1 << 20;

/// `c[m, n] = a[m, k] @ b` with `b`'s element `(k, j)` at `b + k * b_rs + j * b_cs`; `a` row stride `k`, `c`
/// row stride `n`; over `threads` threads of the pool.
///
/// # Safety
/// [`hardware`] returned true; the matrices are valid for their shapes, `a` and `c` 4-byte aligned, and `c`
/// does not overlap `a` or `b`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn sgemm(
    m: usize,
    n: usize,
    k: usize,
    c: *mut f32,
    a: *const f32,
    b: *const f32,
    b_cs: isize,
    b_rs: isize,
    threads: usize,
) {
    #[derive(Clone, Copy)]
    struct B(*const f32);
    // SAFETY: only read, while `sgemm` runs.
    unsafe impl Send for B {}
    unsafe impl Sync for B {}
    let bp = B(b);
    let fill = move |jb: usize, out: &mut [u16]| {
        let bp = bp;
        // SAFETY: AVX-512F (hardware); b valid for k x n (caller); `out` holds one block's units.
        unsafe { pack_b(bp.0, b_cs, b_rs, n, k, jb, 1, out) }
    };
    // SAFETY: the caller's contract.
    unsafe { sgemm_with(m, n, k, c, a, &fill, threads) }
}

/// [`sgemm`] with B given by `fill(jb, out)`, which packs column block `jb` (columns `32 jb ..`, zeros past
/// `n`) into `out` (`ceil(k / 32)` units), as `pack_b` would.
///
/// # Safety
/// As [`sgemm`]; `fill` writes every element of `out`.
unsafe fn sgemm_with(
    m: usize,
    n: usize,
    k: usize,
    c: *mut f32,
    a: *const f32,
    fill: &(dyn Fn(usize, &mut [u16]) + Sync),
    threads: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        // An empty sum: nothing to pack (the kept buffers would be read unwritten).
        // SAFETY: c holds m x n f32 (caller).
        unsafe { std::ptr::write_bytes(c, 0, m * n) };
        return;
    }
    let nkb = k.div_ceil(32);
    let (mb, nb) = (m.div_ceil(32), n.div_ceil(32));
    let row_blocks = (TASK_A_BYTES / (nkb * UNIT)).clamp(1, 16);
    let row_groups = mb.div_ceil(row_blocks);
    // Tasks: groups of row blocks by groups of column blocks, at least two per thread where the shape allows.
    let col_groups = (2 * threads).div_ceil(row_groups).clamp(1, nb);
    let cols_per = nb.div_ceil(col_groups);
    let col_groups = nb.div_ceil(cols_per);
    let tasks = row_groups * col_groups;
    let helpers = threads.saturating_sub(1);
    if row_groups == 1 {
        // One row group: every column block of B is used by one task only, which packs it right before
        // using it (the packed panel stays in L2; packing all of B first would write it to memory and read
        // it back).
        let p = Ptrs(c, a, std::ptr::null());
        let task = |t: usize| {
            with_packed(&PACKED_B, nkb, |panel| {
                // SAFETY: as in `run_task`.
                unsafe {
                    run_task(
                        m,
                        n,
                        k,
                        p,
                        0,
                        mb,
                        t * cols_per..((t + 1) * cols_per).min(nb),
                        &mut |jb| {
                            fill(jb, panel);
                            panel.as_ptr()
                        },
                    )
                }
            });
        };
        crate::pool::run(tasks, helpers, &task);
        return;
    }
    // Several row groups read every column block: B is packed once, its column blocks split between the
    // threads.
    with_packed(&PACKED_B, nb * nkb, |packed_b| {
        {
            let per = nb.div_ceil(threads.max(1));
            let parts: Vec<std::sync::Mutex<&mut [u16]>> = packed_b
                .chunks_mut(per * nkb * UNIT_H)
                .map(std::sync::Mutex::new)
                .collect();
            let pack = |t: usize| {
                let mut out = parts[t].lock().unwrap_or_else(|e| e.into_inner());
                for (i, unit) in out.chunks_mut(nkb * UNIT_H).enumerate() {
                    fill(t * per + i, unit);
                }
            };
            crate::pool::run(parts.len(), helpers, &pack);
        }
        let p = Ptrs(c, a, packed_b.as_ptr());
        let task = |t: usize| {
            let (rg, cg) = (t / col_groups, t % col_groups);
            let ib0 = rg * row_blocks;
            let cols = cg * cols_per..((cg + 1) * cols_per).min(nb);
            // SAFETY: as in `run_task`; the packed B holds every column block.
            unsafe {
                run_task(m, n, k, p, ib0, row_blocks.min(mb - ib0), cols, &mut |jb| {
                    p.2.add(jb * nkb * UNIT_H)
                })
            };
        };
        crate::pool::run(tasks, helpers, &task);
    });
}

/// One task: packs A's row blocks `ib0 .. ib0 + blocks` and computes their C blocks for the column blocks
/// `cols`, each column block's packed B units (`nkb` of them) at `panel(jb)`.
///
/// # Safety
/// AVX-512F and AMX are available; `p.1` holds `m` rows of `k` f32; `p.0` is C (`m x n`), whose blocks this
/// task writes no other task writes; `panel(jb)` returns `nkb` 64-byte aligned units valid until the next call.
#[allow(clippy::too_many_arguments)]
unsafe fn run_task(
    m: usize,
    n: usize,
    k: usize,
    p: Ptrs,
    ib0: usize,
    blocks: usize,
    cols: std::ops::Range<usize>,
    panel: &mut dyn FnMut(usize) -> *const u16,
) {
    let nkb = k.div_ceil(32);
    let mut acc = vec![Acc([0f32; 1024]); blocks];
    with_packed(&PACKED_A, blocks * nkb, |packed_a| {
        // SAFETY: the caller's contract.
        unsafe {
            pack_a(p.1, m, k, ib0 * 32, blocks, packed_a);
            let _tiles = Tiles::config();
            for jb in cols {
                let pb = panel(jb);
                for k0 in (0..nkb).step_by(KC) {
                    let kn = KC.min(nkb - k0);
                    for (ib, acc) in acc.iter_mut().enumerate() {
                        let pa = packed_a.as_ptr().add((ib * nkb + k0) * UNIT_H);
                        block(pa, pb.add(k0 * UNIT_H), kn, acc, k0 == 0);
                    }
                }
                let c0 = jb * 32;
                let w = (n - c0).min(32);
                for (ib, acc) in acc.iter().enumerate() {
                    let r0 = (ib0 + ib) * 32;
                    for r in 0..(m - r0).min(32) {
                        std::ptr::copy_nonoverlapping(
                            acc.0.as_ptr().add(r * 32),
                            p.0.add((r0 + r) * n + c0),
                            w,
                        );
                    }
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rng(seed: u64) -> impl FnMut() -> f32 {
        let mut s = seed;
        move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        }
    }

    /// The split is exact to `2^-16` and keeps infinities and NaN.
    #[test]
    fn split_is_within_its_bound() {
        if !hardware() {
            eprintln!("AMX not available on this host: split test skipped");
            return;
        }
        let mut r = rng(7);
        let mut xs: Vec<f32> = (0..4096).map(|i| r() * 2f32.powi((i % 60) - 30)).collect();
        xs.extend([
            0.0,
            -0.0,
            f32::MAX,
            -f32::MAX,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::from_bits(0x7f80_0001),
            1.0 + f32::EPSILON,
            f32::MIN_POSITIVE,
        ]);
        xs.resize(xs.len().div_ceil(16) * 16, 1.0);
        for c in xs.chunks_exact(16) {
            // SAFETY: AVX-512F (hardware).
            let (h, l) = unsafe { split16(_mm512_loadu_ps(c.as_ptr())) };
            let (mut hv, mut lv) = ([0u32; 16], [0u32; 16]);
            // SAFETY: 16 u32 each.
            unsafe {
                _mm512_storeu_si512(hv.as_mut_ptr() as *mut __m512i, h);
                _mm512_storeu_si512(lv.as_mut_ptr() as *mut __m512i, l);
            }
            for (j, &x) in c.iter().enumerate() {
                let hi = f32::from_bits(hv[j] << 16);
                let lo = f32::from_bits(lv[j] << 16);
                if x.is_nan() {
                    assert!(hi.is_nan() && lo == 0.0, "{x}");
                } else if x.is_infinite() {
                    assert!(hi == x && lo == 0.0, "{x}");
                } else {
                    let e = (x as f64 - hi as f64 - lo as f64).abs();
                    assert!(e <= 2f64.powi(-16) * (x as f64).abs(), "{x}: {hi} + {lo}");
                    assert!(hi.is_finite());
                }
            }
        }
    }

    /// Products of every shape class (whole and partial tiles, K not a multiple of 32, B in both layouts,
    /// one and two threads) within `3 * 2^-16 sum |a b|` of the f64 product.
    #[test]
    fn products_match_f64() {
        if !hardware() {
            eprintln!("AMX not available on this host: product test skipped");
            return;
        }
        let mut r = rng(11);
        for (m, n, k) in [
            (3, 5, 0),
            (1, 1, 1),
            (32, 32, 32),
            (37, 50, 29),
            (130, 70, 300),
            (5, 200, 64),
            (300, 33, 384),
            // Several row groups: B packed up front and shared.
            (600, 40, 1536),
        ] {
            let a: Vec<f32> = (0..m * k).map(|_| r()).collect();
            let b: Vec<f32> = (0..k * n).map(|_| r()).collect();
            for trans in [false, true] {
                // trans: b holds [n, k] rows.
                let (cs, rs) = if trans {
                    (k as isize, 1)
                } else {
                    (1, n as isize)
                };
                for threads in [1, 2] {
                    let mut c = vec![f32::NAN; m * n];
                    // SAFETY: hardware() holds; shapes as stated.
                    unsafe {
                        sgemm(
                            m,
                            n,
                            k,
                            c.as_mut_ptr(),
                            a.as_ptr(),
                            b.as_ptr(),
                            cs,
                            rs,
                            threads,
                        )
                    };
                    for i in 0..m {
                        for j in 0..n {
                            let (mut want, mut mag) = (0f64, 0f64);
                            for t in 0..k {
                                let bv = b[(t as isize * rs + j as isize * cs) as usize] as f64;
                                want += a[i * k + t] as f64 * bv;
                                mag += (a[i * k + t] as f64 * bv).abs();
                            }
                            let got = c[i * n + j] as f64;
                            assert!(
                                (got - want).abs() <= 3.0 * 2f64.powi(-16) * mag + 1e-30,
                                "{m}x{n}x{k} trans {trans} threads {threads} [{i}, {j}]: {got} vs {want}"
                            );
                        }
                    }
                }
            }
        }
    }
}
