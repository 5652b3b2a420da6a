//! CPU backend benchmarks (`cargo bench -p loom-cpu`): f32 GEMM stages against this machine's measured FMA
//! peak and numpy/OpenBLAS, softmax and layernorm over rows against memcpy bandwidth, quantised matrix-vector
//! products against the bytes-moved floor. Prints one table.

#![allow(unsafe_code)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Instant;

use common::*;
use loom_ir::kernel::{BufRef, DType, ReduceOp, UnOp};

/// Best-of-`reps` seconds of `f`.
fn best(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// A tight AVX-512 FMA loop on 12 independent accumulators (AVX2 on CPUs without AVX-512): GFLOP/s of one
/// thread (best of `windows` windows of `iters` iterations, 384 flops each, 192 on AVX2).
#[cfg(target_arch = "x86_64")]
fn fma_peak_1(windows: usize, iters: u64) -> f64 {
    #[target_feature(enable = "avx512f")]
    unsafe fn kernel(iters: u64) -> f32 {
        use std::arch::x86_64::*;
        // Distinct starting values, so the 12 chains cannot be merged into one.
        let mut acc: [__m512; 12] = std::array::from_fn(|i| _mm512_set1_ps(i as f32));
        let a = _mm512_set1_ps(1.000_000_1);
        let b = _mm512_set1_ps(0.999_999_9);
        for _ in 0..iters {
            for x in acc.iter_mut() {
                *x = _mm512_fmadd_ps(*x, a, b);
            }
        }
        let mut s = _mm512_set1_ps(0.0);
        for x in acc {
            s = _mm512_add_ps(s, x);
        }
        _mm512_reduce_add_ps(s)
    }
    /// The same on 8 lanes (AVX2 with FMA: two FMA pipes of latency 4 or 5, so 12 chains fill them).
    #[target_feature(enable = "avx2,fma")]
    unsafe fn kernel8(iters: u64) -> f32 {
        use std::arch::x86_64::*;
        let mut acc: [__m256; 12] = std::array::from_fn(|i| _mm256_set1_ps(i as f32));
        let a = _mm256_set1_ps(1.000_000_1);
        let b = _mm256_set1_ps(0.999_999_9);
        for _ in 0..iters {
            for x in acc.iter_mut() {
                *x = _mm256_fmadd_ps(*x, a, b);
            }
        }
        let mut s = _mm256_set1_ps(0.0);
        for x in acc {
            s = _mm256_add_ps(s, x);
        }
        let mut l = [0f32; 8];
        // SAFETY: l holds 8 floats.
        unsafe { _mm256_storeu_ps(l.as_mut_ptr(), s) };
        l.iter().sum()
    }
    let lanes = if is_x86_feature_detected!("avx512f") {
        16
    } else if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        8
    } else {
        return f64::NAN;
    };
    let t = best(windows, || {
        // SAFETY: the kernel's features were detected just above.
        let r = unsafe {
            if lanes == 16 {
                kernel(std::hint::black_box(iters))
            } else {
                kernel8(std::hint::black_box(iters))
            }
        };
        std::hint::black_box(r);
    });
    (iters * 12 * lanes * 2) as f64 / t / 1e9
}

/// The FMA peak of `threads` threads at once: best of 20 windows of ~10 ms each (on a shared machine one
/// long window mostly measures the load).
fn fma_peak(threads: usize) -> f64 {
    fma_peak_windows(threads, 20, 2_000_000)
}

fn fma_peak_windows(threads: usize, windows: usize, iters: u64) -> f64 {
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|_| s.spawn(move || fma_peak_1(windows, iters)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    })
}

/// Best time of one `run` (a [`prepared`] stage) on `threads` threads and the best FMA peak of as many
/// threads, the two measured alternately (`reps` of each, a ~2 ms peak window after every run): this host's
/// speed moves by up to 2x within minutes, so a peak measured once at the start of the bench says little about
/// a row measured a minute later.
fn run_stage_paired(run: &mut dyn FnMut(usize), threads: usize, reps: usize) -> (f64, f64) {
    run(threads);
    let (mut t, mut peak) = (f64::INFINITY, 0f64);
    for _ in 0..reps {
        let t0 = Instant::now();
        run(threads);
        t = t.min(t0.elapsed().as_secs_f64());
        peak = peak.max(fma_peak_windows(threads, 2, 400_000));
    }
    (t, peak)
}

fn memcpy_gbs(bytes: usize) -> f64 {
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    let t = best(10, || {
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
    });
    (2 * bytes) as f64 / t / 1e9
}

/// numpy's `a @ b` rate (GFLOP/s) on `threads` BLAS threads, measured as a peer should be: in its own
/// process (the best of 20 after a warm-up), with the BLAS build printed. numpy comes from the system or from
/// `.models/minilm` (scripts/fetch-models.sh installs it there).
fn numpy_gflops(m: u64, n: u64, k: u64, threads: usize) -> Option<(f64, String)> {
    let code = format!(
        "import numpy as np, time\n\
         blas=np.show_config(mode='dicts').get('Build Dependencies',{{}}).get('blas',{{}})\n\
         a=np.random.rand({m},{k}).astype(np.float32); b=np.random.rand({k},{n}).astype(np.float32)\n\
         a@b\nbest=1e9\n\
         for _ in range(20):\n t=time.perf_counter(); a@b; best=min(best, time.perf_counter()-t)\n\
         print(2*{m}*{n}*{k}/best/1e9)\n\
         print('numpy %s, %s %s' % (np.__version__, blas.get('name','?'), blas.get('version','')))"
    );
    let models = concat!(env!("CARGO_MANIFEST_DIR"), "/../../.models/minilm");
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(&code)
        .env("PYTHONPATH", models)
        .env("OPENBLAS_NUM_THREADS", threads.to_string())
        .env("OMP_NUM_THREADS", threads.to_string())
        .env_remove("OPENBLAS_CORETYPE")
        .env_remove("OPENBLAS_L2_SIZE")
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let mut lines = text.lines();
    let g: f64 = lines.next()?.trim().parse().ok()?;
    Some((g, lines.next().unwrap_or("").to_string()))
}

/// Our two-thread time for `run` (a [`prepared`] stage) and numpy's rate for the same product, measured
/// alternately: three numpy processes, each followed by four runs of ours; the best of each side.
fn against_numpy(
    run: &mut dyn FnMut(usize),
    (m, n, k): (u64, u64, u64),
) -> Option<(f64, f64, String)> {
    let mut ours = f64::INFINITY;
    let mut np: Option<(f64, String)> = None;
    for _ in 0..3 {
        let (g, what) = numpy_gflops(m, n, k, 2)?;
        if np.as_ref().is_none_or(|(b, _)| g > *b) {
            np = Some((g, what));
        }
        ours = ours.min(best(4, || run(2)));
    }
    np.map(|(g, what)| (ours, g, what))
}

fn run_stage_best(
    st: &loom_ir::kernel::Stage,
    ins: &[Vec<u8>],
    threads: usize,
    reps: usize,
) -> f64 {
    let mut run = prepared(st, ins);
    best(reps, || run(threads))
}

/// `st` compiled once, with its inputs and outputs: runs it on the given number of threads.
fn prepared<'a>(st: &loom_ir::kernel::Stage, ins: &'a [Vec<u8>]) -> impl FnMut(usize) + 'a {
    let cs = loom_cpu::compile_stage(st).expect("compile");
    let ins: Vec<&[u8]> = ins.iter().map(|v| v.as_slice()).collect();
    let mut out = loom_reference::alloc_outputs(st).unwrap();
    move |threads| {
        cs.run(&ins, &[], &mut out, threads).expect("run");
    }
}

fn main() {
    // LOOM_BENCH=gemm|gemmprobe|qmatvec|decode|rows|cast|pool|small|attend|rowops|encattn runs one group only.
    let only = std::env::var("LOOM_BENCH").unwrap_or_default();
    let on = |g: &str| only.is_empty() || only == g;
    let mut rng = Rng::new(42);
    let peak = [fma_peak(1), fma_peak(2)];
    println!(
        "FMA peak (AVX-512, or AVX2 without it; 12 accumulators): 1 thread {:.1} GFLOP/s, 2 threads {:.1} GFLOP/s",
        peak[0], peak[1]
    );
    println!();
    println!("| benchmark | threads | time | rate | reference | ratio | target |");
    println!("|---|---|---|---|---|---|---|");
    // Then MiniLM's dense layers for one sentence of 37 tokens and for a cohort of 32 (1,184 tokens).
    for (m, n, k) in [
        (1024u64, 1024u64, 1024u64),
        (128, 384, 1536),
        (37, 384, 384),
        (1184, 384, 384),
        (1184, 1536, 384),
        (1184, 384, 1536),
    ] {
        if !on("gemm") {
            break;
        }
        let st = one_kernel_stage(gemm_kernel(m, n, k, 64, 64, 32, false));
        let ins = [
            rand_f32(&mut rng, (m * k) as usize, -1.0, 1.0),
            rand_f32(&mut rng, (k * n) as usize, -1.0, 1.0),
        ];
        let mut run = prepared(&st, &ins);
        for threads in [1usize, 2] {
            let (t, p) = run_stage_paired(&mut run, threads, 12);
            let g = (2 * m * n * k) as f64 / t / 1e9;
            println!(
                "| f32 GEMM stage {m}x{n}x{k} | {threads} | {:.3} ms | {g:.1} GFLOP/s | FMA peak {p:.1} (alternating) | {:.0} % | >= 85 % |",
                t * 1e3,
                100.0 * g / p
            );
            if threads == 2 {
                match against_numpy(&mut run, (m, n, k)) {
                    Some((t, npg, what)) => println!(
                        "| f32 GEMM stage {m}x{n}x{k} | 2 | {:.3} ms | {:.1} GFLOP/s | {what}, 2 threads, alternating: {npg:.1} GFLOP/s | {:.2}x | >= 1.0x |",
                        t * 1e3,
                        (2 * m * n * k) as f64 / t / 1e9,
                        (2 * m * n * k) as f64 / t / 1e9 / npg
                    ),
                    None => println!(
                        "| f32 GEMM stage {m}x{n}x{k} | 2 | - | - | numpy unavailable | - | >= 1.0x |"
                    ),
                }
            }
        }
    }
    let (r, c) = (4096u64, 1024u64);
    let bytes = (r * c * 4) as usize;
    let bw = memcpy_gbs(bytes);
    let x = rand_f32(&mut rng, (r * c) as usize, -3.0, 3.0);
    let cases: Vec<(&str, loom_ir::kernel::Stage, Vec<Vec<u8>>)> = vec![
        (
            "softmax rows 4096x1024",
            one_kernel_stage(softmax_kernel(r, c, 4)),
            vec![x.clone()],
        ),
        (
            "layernorm rows 4096x1024",
            one_kernel_stage(layernorm(r, c, 4)),
            vec![
                x.clone(),
                rand_f32(&mut rng, c as usize, 0.5, 1.5),
                rand_f32(&mut rng, c as usize, -1.0, 1.0),
            ],
        ),
    ];
    // Quantised matrix-vector products: y = W x with W [n, k] in GGUF layout. The floor moves the weight bytes
    // plus x (f32) and y (f32) once at memcpy bandwidth.
    for dtype in [DType::Q4_1, DType::Q8_0] {
        if !on("qmatvec") {
            break;
        }
        for (n, k) in [(576u64, 1536u64), (1536, 576)] {
            let st = one_kernel_stage(matvec_kernel(dtype, n, k, 64, 256));
            let w = random_blocks(&mut rng, dtype, (n * k / 32) as usize);
            let moved = w.len() + 4 * (n + k) as usize;
            let ins = vec![w, rand_f32(&mut rng, k as usize, -1.0, 1.0)];
            for threads in [1usize, 2] {
                let t = run_stage_best(&st, &ins, threads, 50);
                let floor = moved as f64 / (bw * 1e9);
                println!(
                    "| {dtype} matvec y = W x, W {n}x{k} | {threads} | {:.1} us | {:.1} GB/s | floor {:.1} us (memcpy {bw:.1} GB/s) | {:.0} % | >= 60 % |",
                    t * 1e6,
                    moved as f64 / t / 1e9,
                    floor * 1e6,
                    100.0 * floor / t
                );
            }
        }
    }
    // One SmolLM2-135M decode token's weight products, as its epoch stage runs them (kernel.loom): per block
    // the Q4_1 q, k, v, o, gate, up and down matrices at M = 1 (30 blocks), then the Q8_0 tied output head,
    // each its own dispatch over its own weights (96.4 MB in all, far more than the caches). The floor is a
    // plain two-thread read of the same bytes in one buffer, measured in the same run.
    if on("decode") {
        decode_products(&mut rng);
    }
    // The `gemm` crate's own rate at MiniLM's cohort shapes, without a stage around it, against the FMA peak of
    // as many threads measured right after each shape.
    if on("gemmprobe") {
        gemm_probe();
    }
    // MiniLM's packed attention (`packages/minilm/kernel.loom`'s @attention_packed) over a cohort of short
    // sentences.
    if on("encattn") {
        encoder_attention(&mut rng, peak);
    }
    // SmolLM2's paged attention (`packages/smollm2/kernel.loom`'s @attend) for one decode token, as the
    // epoch stage runs it: 30 dispatches, one per layer, over the pool's pages in a shuffled order.
    if on("attend") {
        decode_attention(&mut rng);
    }
    // SmolLM2's per-row kernels for 16 streams decoding together, 30 dispatches each as in an epoch.
    if on("rowops") {
        decode_row_kernels(&mut rng);
    }
    // An integer-to-float cast over a [T, D] tile (token ids or positions to f32), JIT path; no target,
    // reported against memcpy for scale (8 bytes in, 4 out per element).
    if on("cast") {
        let (t, d) = (128u64, 384u64);
        let st = one_kernel_stage(cast_kernel(t, d, 16));
        let v: Vec<i64> = (0..t * d)
            .map(|i| (i as i64 * 7919) % 100_003 - 50_000)
            .collect();
        let ins = vec![i64_bytes(&v)];
        for threads in [1usize, 2] {
            let tm = run_stage_best(&st, &ins, threads, 50);
            let moved = 12 * t * d;
            println!(
                "| cast i64 -> f32 tile {t}x{d} (JIT) | {threads} | {:.1} us | {:.1} GB/s | memcpy {bw:.1} GB/s | {:.0} % | - |",
                tm * 1e6,
                moved as f64 / tm / 1e9,
                100.0 * moved as f64 / tm / 1e9 / bw
            );
        }
    }
    // The persistent pool's round trip (the cost that the per-thread work thresholds of kernels.rs, qdot.rs
    // and rows.rs must cover): two empty indices, one on the caller and one on a worker, back to back
    // (the worker is still spinning) and after a 1 ms pause (the worker has parked).
    if on("pool") {
        let spin = best(2000, || loom_cpu::pool::run(2, 1, &|_| {}));
        let mut parked = Vec::new();
        for _ in 0..50 {
            std::thread::sleep(std::time::Duration::from_millis(1));
            let t = Instant::now();
            loom_cpu::pool::run(2, 1, &|_| {});
            parked.push(t.elapsed().as_secs_f64());
        }
        parked.sort_by(f64::total_cmp);
        let parked = parked[parked.len() / 2];
        println!(
            "| pool round trip, worker spinning | 2 | {:.1} us | - | - | - | - |",
            spin * 1e6
        );
        println!(
            "| pool round trip, worker parked (median of 50) | 2 | {:.1} us | - | - | - | - |",
            parked * 1e6
        );
    }
    // Sizes just above the per-thread thresholds (two threads each at the current thresholds), 1 vs 2
    // threads: whether splitting still pays at the smallest size that splits.
    if on("small") {
        let sm = one_kernel_stage(softmax_kernel(32, 1024, 4));
        let xs = vec![rand_f32(&mut rng, 32 * 1024, -3.0, 3.0)];
        let gm = one_kernel_stage(gemm_kernel(32, 128, 256, 32, 64, 32, false));
        let gi = vec![
            rand_f32(&mut rng, 32 * 256, -1.0, 1.0),
            rand_f32(&mut rng, 256 * 128, -1.0, 1.0),
        ];
        let qm = one_kernel_stage(matvec_kernel(DType::Q8_0, 256, 1024, 64, 256));
        let qi = vec![
            random_blocks(&mut rng, DType::Q8_0, 256 * 1024 / 32),
            rand_f32(&mut rng, 1024, -1.0, 1.0),
        ];
        for (name, st, ins) in [
            ("softmax rows 32x1024", &sm, &xs),
            ("f32 GEMM stage 32x128x256", &gm, &gi),
            ("q8_0 matvec 256x1024", &qm, &qi),
        ] {
            for threads in [1usize, 2] {
                let t = run_stage_best(st, ins, threads, 200);
                println!("| {name} | {threads} | {:.1} us | - | - | - | - |", t * 1e6);
            }
        }
    }
    for (name, st, ins) in cases.into_iter().filter(|_| on("rows")) {
        for threads in [1usize, 2] {
            let t = run_stage_best(&st, &ins, threads, 20);
            let g = (2 * bytes) as f64 / t / 1e9;
            println!(
                "| {name} | {threads} | {:.3} ms | {g:.1} GB/s | memcpy {bw:.1} GB/s | {:.0} % | >= 60 % |",
                t * 1e3,
                100.0 * g / bw
            );
        }
    }
}

fn cast_kernel(t: u64, d: u64, bt: u32) -> loom_ir::kernel::Kernel {
    let mut kb = KB::new("cast", [cdiv(t, bt as u64), 1, 1]);
    let x = kb.param("x", DType::I64, &[t, d], READ);
    let y = kb.param("y", DType::F32, &[t, d], WRITE);
    let p = kb.pid(0);
    let r0 = kb.mul(p, i(bt as i64));
    let rr = kb.range(r0, bt);
    let rc = kb.range(i(0), d as u32);
    let v = kb.load(x, vec![rr.clone(), rc.clone()], None);
    let v = kb.cast(v, DType::F32);
    kb.store(y, vec![rr, rc], v);
    kb.finish()
}

fn softmax_kernel(r: u64, c: u64, br: u32) -> loom_ir::kernel::Kernel {
    let bc = c as u32;
    let mut kb = KB::new("softmax", [cdiv(r, br as u64), 1, 1]);
    let x = kb.param("x", DType::F32, &[r, c], READ);
    let y = kb.param("y", DType::F32, &[r, c], WRITE);
    let p = kb.pid(0);
    let r0 = kb.mul(p, i(br as i64));
    let rr = kb.range(r0, br);
    let rc = kb.range(i(0), bc);
    let t = kb.load(x, vec![rr.clone(), rc.clone()], Some(f(f64::NEG_INFINITY)));
    let m = kb.reduce(ReduceOp::Max, t.clone(), 1);
    let m = kb.expand_dims(m, 1);
    let m = kb.broadcast(m, &[br, bc]);
    let d = kb.sub(t, m);
    let e = kb.un(UnOp::Exp, d);
    let s = kb.reduce(ReduceOp::Sum, e.clone(), 1);
    let s = kb.expand_dims(s, 1);
    let s = kb.broadcast(s, &[br, bc]);
    let o = kb.div(e, s);
    kb.store(y, vec![rr, rc], o);
    kb.finish()
}

/// Row layernorm (the same kernel as `tests/diff.rs`).
fn layernorm(r: u64, c: u64, br: u32) -> loom_ir::kernel::Kernel {
    let mut kb = KB::new("layernorm", [cdiv(r, br as u64), 1, 1]);
    let x = kb.param("x", DType::F32, &[r, c], READ);
    let g = kb.param("gamma", DType::F32, &[c], READ);
    let b = kb.param("beta", DType::F32, &[c], READ);
    let y = kb.param("y", DType::F32, &[r, c], WRITE);
    let c32 = c as u32;
    let p = kb.pid(0);
    let r0 = kb.mul(p, i(br as i64));
    let rr = kb.range(r0, br);
    let rc = kb.range(i(0), c32);
    let t = kb.load(x, vec![rr.clone(), rc.clone()], Some(f(0.0)));
    let s = kb.reduce(ReduceOp::Sum, t.clone(), 1);
    let mean = kb.div(s, f(c as f64));
    let mean = kb.expand_dims(mean, 1);
    let mean = kb.broadcast(mean, &[br, c32]);
    let xc = kb.sub(t, mean);
    let sq = kb.mul(xc.clone(), xc.clone());
    let v = kb.reduce(ReduceOp::Sum, sq, 1);
    let v = kb.div(v, f(c as f64));
    let v = kb.add(v, f(1e-5));
    let inv = kb.un(UnOp::Rsqrt, v);
    let inv = kb.expand_dims(inv, 1);
    let inv = kb.broadcast(inv, &[br, c32]);
    let n = kb.mul(xc, inv);
    let gv = kb.load(g, vec![rc.clone()], None);
    let gv = kb.expand_dims(gv, 0);
    let gv = kb.broadcast(gv, &[br, c32]);
    let bv = kb.load(b, vec![rc.clone()], None);
    let bv = kb.expand_dims(bv, 0);
    let bv = kb.broadcast(bv, &[br, c32]);
    let o = kb.mul(n, gv);
    let o = kb.add(o, bv);
    kb.store(y, vec![rr, rc], o);
    kb.finish()
}

/// The `gemmprobe` group (see `main`): the `gemm` crate called directly (no stage, no pool: one thread, then
/// two scoped threads each on half the rows, as `kernels::sgemm_threads` splits them) at MiniLM's cohort shapes,
/// best of 30 alternating runs, with the FMA peak of one and of two threads measured right after each shape.
/// This host's second vCPU is at times not all ours (the two-thread peak itself reads anywhere from one core's
/// to two cores' worth), so the two-thread row is only meaningful beside its own peak.
fn gemm_probe() {
    fn run(m: usize, n: usize, k: usize, c: &mut [f32], a: &[f32], b: &[f32]) {
        // SAFETY: a is m x k, b is k x n, c is m x n, all row-major and contiguous.
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                c.as_mut_ptr(),
                1,
                n as isize,
                false,
                a.as_ptr(),
                1,
                k as isize,
                b.as_ptr(),
                1,
                n as isize,
                1.0f32,
                1.0f32,
                false,
                false,
                false,
                gemm::Parallelism::None,
            )
        }
    }
    for (m, n, k) in [
        (1184usize, 384usize, 384usize),
        (1184, 1536, 384),
        (1184, 384, 1536),
    ] {
        let a: Vec<f32> = (0..m * k)
            .map(|i| ((i * 7 % 13) as f32 - 6.0) / 8.0)
            .collect();
        let b: Vec<f32> = (0..k * n)
            .map(|i| ((i * 5 % 11) as f32 - 5.0) / 8.0)
            .collect();
        let mut c = vec![0f32; m * n];
        let half = m / 2;
        let (mut t1, mut t2) = (f64::INFINITY, f64::INFINITY);
        for _ in 0..30 {
            let t = Instant::now();
            run(m, n, k, &mut c, &a, &b);
            t1 = t1.min(t.elapsed().as_secs_f64());
            let t = Instant::now();
            let (c0, c1) = c.split_at_mut(half * n);
            let (a0, a1) = a.split_at(half * k);
            std::thread::scope(|s| {
                s.spawn(|| run(m - half, n, k, c1, a1, &b));
                run(half, n, k, c0, a0, &b);
            });
            t2 = t2.min(t.elapsed().as_secs_f64());
        }
        let (p1, p2) = (
            fma_peak_windows(1, 4, 400_000),
            fma_peak_windows(2, 4, 400_000),
        );
        let g = (2 * m * n * k) as f64 / 1e9;
        for (threads, t, p) in [(1, t1, p1), (2, t2, p2)] {
            println!(
                "| gemm crate alone {m}x{n}x{k} | {threads} | {:.3} ms | {:.1} GFLOP/s | FMA peak {p:.1} (right after) | {:.0} % | >= 95 % |",
                t * 1e3,
                g / t,
                100.0 * g / t / p
            );
        }
    }
}

/// The `encattn` group (see `main`): MiniLM's own packed attention (`packages/minilm/kernel.loom`) over a cohort
/// of 32 sequences of 20-56 tokens (mean ~37, like `benches/candle-bert/short.jsonl`), 12 heads of 32, against
/// the FMA peak: the rate counts only the real work (2 x 2 x len^2 x 32 per sequence and head, no padding).
fn encoder_attention(rng: &mut Rng, peak: [f64; 2]) {
    use loom_ir::TValue;
    let mut cat = package_catalog(&[
        "motifs/gemm.loom",
        "motifs/attention.loom",
        "minilm/kernel.loom",
    ]);
    let bench = "module @bench.encattn {
  export stage @s<B: i64, NT: i64, NH: i64, D: i64, TMAX: i64>
      (%q: buffer<f32, [NT, NH * D]> input, %k: buffer<f32, [NT, NH * D]> input,
       %v: buffer<f32, [NT, NH * D]> input, %x: buffer<i32, [2 * B + 2 * NT]> input,
       %o: buffer<f32, [NT, NH * D]> output)
  {
    dispatch @minilm.kernel.attention_packed<B = B, NT = NT, NH = NH, D = D, TMAX = TMAX>(%q, %k, %v, %x, %o)
  }
}";
    cat.add_source("bench.loom", bench).expect("bench module");
    let (b, nh, d) = (64usize, 12usize, 32usize);
    let lens: Vec<usize> = (0..32)
        .map(|_| 20 + (rng.next_u64() % 37) as usize)
        .collect();
    let total: usize = lens.iter().sum();
    let nt = total.div_ceil(256) * 256;
    let cfg: Vec<(String, TValue)> = [("B", b), ("NT", nt), ("NH", nh), ("D", d), ("TMAX", 256)]
        .into_iter()
        .map(|(k, v)| (k.to_string(), TValue::I64(v as i64)))
        .collect();
    let mi = cat.find("bench.encattn").expect("module");
    let st = loom_kernel::specialize_stage(&cat, mi, "s", &cfg)
        .unwrap_or_else(|e| panic!("{}", e.join("")));
    let mut x = vec![0i32; 2 * b + 2 * nt];
    let mut start = 0;
    for (i, &l) in lens.iter().enumerate() {
        x[i] = start as i32;
        x[b + i] = l as i32;
        start += l;
    }
    let n = nt * nh * d;
    let ins = vec![
        rand_f32(rng, n, -1.0, 1.0),
        rand_f32(rng, n, -1.0, 1.0),
        rand_f32(rng, n, -1.0, 1.0),
        x.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>(),
    ];
    let flops: f64 = lens.iter().map(|&l| (4 * l * l * d * nh) as f64).sum();
    for threads in [1usize, 2] {
        let t = run_stage_best(&st, &ins, threads, 30);
        let g = flops / t / 1e9;
        let p = peak[threads - 1];
        println!(
            "| MiniLM packed attention, 32 sequences of {total} tokens, 12 heads | {threads} | {:.1} us | {g:.1} GFLOP/s | FMA peak {p:.1} | {:.1} % | - |",
            t * 1e6,
            100.0 * g / p
        );
    }
}

/// SmolLM2's kernels with the motifs they call.
fn smollm2_catalog() -> loom_compiler::Catalog {
    package_catalog(&[
        "motifs/rope.loom",
        "motifs/attention.loom",
        "smollm2/kernel.loom",
    ])
}

/// The template values of an epoch stage of SmolLM2's geometry (`packages/smollm2/kernel.loom`: pages of 16
/// tokens, 30 layers, 9 query and 3 KV heads of 64) for `s` span slots, `t` token rows and a pool of `p` pages,
/// the page list `p` words long; then `extra`.
fn smollm2_epoch_cfg(
    s: i64,
    t: i64,
    p: i64,
    extra: &[(&str, i64)],
) -> Vec<(String, loom_ir::TValue)> {
    let base = [
        ("X", 7 * s + 3 * t + p),
        ("S", s),
        ("T", t),
        ("PT", 16),
        ("P", p),
        ("L", 30),
        ("NH", 9),
        ("KV", 3),
        ("HD", 64),
    ];
    base.iter()
        .chain(extra)
        .map(|(k, v)| (k.to_string(), loom_ir::TValue::I64(*v)))
        .collect()
}

/// The package's epoch words (`x`, see `packages/smollm2/control.loom`) for `streams` spans of `s` slots, each
/// decoding one token at position `ctx - 1` in its own row, with `per` pages each (stream u's at u * per in the
/// page list); the page list in a shuffled order with `shuffle`, else in order.
fn decode_epoch_x(s: i64, streams: i64, per: i64, ctx: i64, shuffle: Option<&mut Rng>) -> Vec<i32> {
    let (t, p) = (streams, per * streams);
    let mut x = vec![0i32; (7 * s + 3 * t + p) as usize];
    for u in 0..s as usize {
        x[u * 7 + 5] = -1;
    }
    let base = 7 * s as usize;
    for u in 0..streams as usize {
        x[u * 7..u * 7 + 7].copy_from_slice(&[
            ctx as i32 - 1,
            1,
            u as i32,
            (u as i64 * per) as i32,
            per as i32,
            -1,
            1,
        ]);
        x[base + t as usize + u] = ctx as i32 - 1;
        x[base + 2 * t as usize + u] = u as i32;
    }
    let mut pages: Vec<i32> = (0..p as i32).collect();
    if let Some(rng) = shuffle {
        for i in (1..pages.len()).rev() {
            pages.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
        }
    }
    x[base + 3 * t as usize..].copy_from_slice(&pages);
    x
}

/// The `attend` group (see `main`): the package's own kernel, at three context lengths, against a plain read
/// of the keys and values it must touch (30 layers x 3 heads x 2 x context x 64 f16, as the package pages them).
fn decode_attention(rng: &mut Rng) {
    let mut cat = smollm2_catalog();
    // The layer index reaches @attend in a one-element buffer, as in the package's epoch stage.
    let bench = "module @bench.attend {
  export stage @s<X: i64, S: i64, T: i64, PT: i64, P: i64, L: i64, NH: i64, KV: i64, HD: i64, BQ: i64>
      (%x: buffer<i32, [X]> input, %q: buffer<f32, [T, NH * HD]> input,
       %pool: buffer<f16, [P, L * 2 * KV * PT, HD]> input, %o: buffer<f32, [T, NH * HD]> output)
  {
    %li[0] = alloc i32[1]
    dispatch @smollm2.kernel.layer_first(%li[0])
    static.for %l = 0 to L {
      dispatch @smollm2.kernel.attend<X = X, S = S, T = T, PT = PT, P = P, L = L, NH = NH, KV = KV,
                                      HD = HD, BQ = BQ>(%x, %q, %li[%l], %pool, %o)
      %li[%l + 1] = alloc i32[1]
      dispatch @smollm2.kernel.layer_next(%li[%l], %li[%l + 1])
    }
  }
}";
    cat.add_source("bench.loom", bench).expect("bench module");
    let (pt, l, nh, kv, hd) = (16i64, 30i64, 9i64, 3i64, 64i64);
    // One stream at three context lengths, then 16 streams decoding together (an epoch of 16 spans).
    for (streams, ctx) in [(1i64, 64i64), (1, 160), (1, 320), (16, 160)] {
        let (s, t) = (16i64, streams);
        let per = (ctx + pt - 1) / pt;
        let p = per * streams;
        let cfg = smollm2_epoch_cfg(s, t, p, &[("BQ", 1)]);
        let mi = cat.find("bench.attend").expect("module");
        let st = loom_kernel::specialize_stage(&cat, mi, "s", &cfg)
            .unwrap_or_else(|e| panic!("{}", e.join("")));
        // Pages in a shuffled order (a pool's pages are not contiguous).
        let x = decode_epoch_x(s, streams, per, ctx, Some(rng));
        let ins = vec![
            x.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>(),
            rand_f32(rng, (t * nh * hd) as usize, -1.0, 1.0),
            // f16 keys and values of magnitude 2^-5 .. 1 and either sign.
            (0..p * l * 2 * kv * pt * hd)
                .flat_map(|_| {
                    let r = rng.next_u64();
                    let h = ((r & 1) << 15) | ((10 + (r >> 1) % 5) << 10) | ((r >> 8) & 0x3ff);
                    (h as u16).to_le_bytes()
                })
                .collect::<Vec<u8>>(),
        ];
        // The reference: one thread copying the bytes the kernel must read.
        let touched = (streams * l * kv * 2 * ctx * hd * 2) as usize;
        let copy = 2.0 * touched as f64 / memcpy_gbs(touched) / 1e9;
        for threads in [1usize, 2] {
            let t = run_stage_best(&st, &ins, threads, 30);
            println!(
                "| attend, {streams} decoding stream(s), context {ctx}, 30 layers | {threads} | {:.1} us | {:.2} us a layer | memcpy of its keys and values {:.1} us | {:.1}x | - |",
                t * 1e6,
                t * 1e6 / l as f64,
                copy * 1e6,
                t / copy
            );
        }
    }
}

/// The `rowops` group (see `main`): the package's @rope_store (after its @rope_table), @add_rmsnorm and
/// @silu_mul_rows for 16 rows (16 streams decoding together), each dispatched 30 times (once a layer, as the
/// epoch stage does), against one thread copying the bytes each reads and writes.
fn decode_row_kernels(rng: &mut Rng) {
    use loom_ir::TValue;
    let mut cat = smollm2_catalog();
    let bench = "module @bench.rows {
  export stage @rope<X: i64, S: i64, T: i64, PT: i64, P: i64, L: i64, NH: i64, KV: i64, HD: i64>
      (%x: buffer<i32, [X]> input, %q: buffer<f32, [T, NH * HD]> input,
       %k: buffer<f32, [T, KV * HD]> input, %v: buffer<f32, [T, KV * HD]> input,
       %qr: buffer<f32, [T, NH * HD]> output, %pool: buffer<f16, [P, L * 2 * KV * PT, HD]> output)
  {
    %sc = alloc f32[T, 2 * HD]
    dispatch @smollm2.kernel.rope_table<X = X, S = S, T = T, HD = HD, BASE = 100000>(%x, %sc)
    %li[0] = alloc i32[1]
    dispatch @smollm2.kernel.layer_first(%li[0])
    static.for %l = 0 to L {
      dispatch @smollm2.kernel.rope_store<X = X, S = S, T = T, PT = PT, P = P, L = L, NH = NH, KV = KV,
                                          HD = HD>(%x, %sc, %q, %k, %v, %li[%l], %qr, %pool)
      %li[%l + 1] = alloc i32[1]
      dispatch @smollm2.kernel.layer_next(%li[%l], %li[%l + 1])
    }
  }
  export stage @norm<T: i64, C: i64, L: i64>
      (%a: buffer<f32, [T, C]> input, %b: buffer<f32, [T, C]> input, %g: buffer<f32, [C]> input,
       %s: buffer<f32, [T, C]> output, %y: buffer<f32, [T, C]> output)
  {
    static.for %l = 0 to L {
      dispatch @smollm2.kernel.add_rmsnorm<R = T, C = C, BR = min(T, 4)>(%a, %b, %g, %s, %y)
    }
  }
  export stage @silu<T: i64, C: i64, L: i64>
      (%g: buffer<f32, [T, C]> input, %u: buffer<f32, [T, C]> input, %y: buffer<f32, [T, C]> output)
  {
    static.for %l = 0 to L {
      dispatch @smollm2.kernel.silu_mul_rows<R = T, C = C>(%g, %u, %y)
    }
  }
}";
    cat.add_source("bench.loom", bench).expect("bench module");
    let mi = cat.find("bench.rows").expect("module");
    let cfg = |pairs: &[(&str, i64)]| -> Vec<(String, TValue)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), TValue::I64(*v)))
            .collect()
    };
    let (t, pt, l, nh, kv, hd, ctx) = (16i64, 16i64, 30i64, 9i64, 3i64, 64i64, 160i64);
    let s = 16i64;
    let per = (ctx + pt - 1) / pt;
    let p = per * t;
    let x = decode_epoch_x(s, t, per, ctx, None);
    let f32s = |rng: &mut Rng, n: i64| rand_f32(rng, n as usize, -1.0, 1.0);
    let row = |name: &str, st: loom_ir::kernel::Stage, ins: Vec<Vec<u8>>, bytes: usize| {
        let copy = bytes as f64 / memcpy_gbs(bytes) / 1e9;
        for threads in [1usize, 2] {
            let secs = run_stage_best(&st, &ins, threads, 30);
            println!(
                "| {name}, 16 rows, 30 dispatches | {threads} | {:.1} us | {:.2} us a dispatch | memcpy of its bytes {:.1} us | {:.1}x | - |",
                secs * 1e6,
                secs * 1e6 / l as f64,
                copy * 1e6 * l as f64,
                secs / (copy * l as f64)
            );
        }
    };
    let spec = |name: &str, c: &[(&str, i64)]| {
        loom_kernel::specialize_stage(&cat, mi, name, &cfg(c))
            .unwrap_or_else(|e| panic!("{}", e.join("")))
    };

    let ins = vec![
        x.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>(),
        f32s(rng, t * nh * hd),
        f32s(rng, t * kv * hd),
        f32s(rng, t * kv * hd),
    ];
    // q, k, v read; qr written (f32), keys and values written (f16).
    let bytes = (t * (2 * nh * hd + 2 * kv * hd) * 4 + t * 2 * kv * hd * 2) as usize;
    let st = loom_kernel::specialize_stage(&cat, mi, "rope", &smollm2_epoch_cfg(s, t, p, &[]))
        .unwrap_or_else(|e| panic!("{}", e.join("")));
    row("@rope_table + @rope_store", st, ins, bytes);
    let c = 576i64;
    let st = spec("norm", &[("T", t), ("C", c), ("L", l)]);
    let ins = vec![f32s(rng, t * c), f32s(rng, t * c), f32s(rng, c)];
    row("@add_rmsnorm", st, ins, (t * c * 4 * 4) as usize);
    let c = 1536i64;
    let st = spec("silu", &[("T", t), ("C", c), ("L", l)]);
    let ins = vec![f32s(rng, t * c), f32s(rng, t * c)];
    row("@silu_mul_rows", st, ins, (t * c * 3 * 4) as usize);
}

/// The `decode` group (see `main`).
fn decode_products(rng: &mut Rng) {
    let (h, i_, nh, kv, l, v) = (576u64, 1536u64, 576u64, 192u64, 30usize, 49152u64);
    // `LOOM_BENCH_ROWS=M`: M activation rows (M streams decoding together) instead of one.
    let m: u64 = std::env::var("LOOM_BENCH_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&m| m >= 1)
        .unwrap_or(1);
    let shapes = [
        (DType::Q4_1, nh, h),
        (DType::Q4_1, kv, h),
        (DType::Q4_1, kv, h),
        (DType::Q4_1, h, nh),
        (DType::Q4_1, i_, h),
        (DType::Q4_1, i_, h),
        (DType::Q4_1, h, i_),
    ];
    let mut kernels: Vec<(DType, u64, u64)> = Vec::new();
    let mut inputs = Vec::new();
    let mut bufs = Vec::new();
    let mut dispatches = Vec::new();
    let mut outputs = Vec::new();
    let mut order: Vec<(DType, u64, u64)> = (0..l).flat_map(|_| shapes).collect();
    order.push((DType::Q8_0, v, h));
    // x of each width, then one output per distinct shape.
    inputs.push(buf("x576", DType::F32, &[m, h]));
    bufs.push(rand_f32(rng, (m * h) as usize, -1.0, 1.0));
    inputs.push(buf("x1536", DType::F32, &[m, i_]));
    bufs.push(rand_f32(rng, (m * i_) as usize, -1.0, 1.0));
    let mut macs = 0u64;
    let mut bytes = 0usize;
    for (j, &(dt, n, k)) in order.iter().enumerate() {
        let ki = match kernels.iter().position(|&s| s == (dt, n, k)) {
            Some(ki) => ki,
            None => {
                kernels.push((dt, n, k));
                outputs.push(buf(&format!("y{}", kernels.len()), DType::F32, &[m, n]));
                kernels.len() - 1
            }
        };
        inputs.push(buf(&format!("w{j}"), dt, &[n, k]));
        let w = random_blocks(rng, dt, (n * k / 32) as usize);
        bytes += w.len();
        macs += m * n * k;
        bufs.push(w);
        let x = if k == h { 0 } else { 1 };
        dispatches.push((
            ki as u32,
            vec![
                BufRef::Input(inputs.len() as u32 - 1),
                BufRef::Input(x),
                BufRef::Output(ki as u32),
            ],
        ));
    }
    let ks: Vec<_> = kernels
        .iter()
        .map(|&(dt, n, k)| matvec_rows_kernel(dt, m, n, k, 64, 64))
        .collect();
    // The same dispatches on one matrix of each shape (the first of each): the products from cache.
    let first: Vec<u32> = kernels
        .iter()
        .map(|s| 2 + order.iter().position(|o| o == s).unwrap_or(0) as u32)
        .collect();
    let hot: Vec<(u32, Vec<BufRef>)> = dispatches
        .iter()
        .map(|(ki, a)| (*ki, vec![BufRef::Input(first[*ki as usize]), a[1], a[2]]))
        .collect();
    let cached = stage(
        "decode-cached",
        inputs.clone(),
        outputs.clone(),
        vec![],
        ks.clone(),
        hot,
    );
    let st = stage("decode", inputs, outputs, vec![], ks, dispatches);
    // The floor: the same bytes in one buffer, read by two threads (each half summed as u64 lanes).
    let flat: Vec<u64> = (0..bytes / 8).map(|i| i as u64).collect();
    let read = best(20, || {
        let half = flat.len() / 2;
        let sums = [0u64, 0].map(std::sync::atomic::AtomicU64::new);
        loom_cpu::pool::run(2, 1, &|t| {
            let part = &flat[t * half..((t + 1) * half).min(flat.len())];
            let mut acc = [0u64; 8];
            for c in part.chunks_exact(8) {
                for (a, x) in acc.iter_mut().zip(c) {
                    *a = a.wrapping_add(*x);
                }
            }
            sums[t].store(
                acc.iter().fold(0, |s, a| s.wrapping_add(*a)),
                std::sync::atomic::Ordering::Relaxed,
            );
        });
        std::hint::black_box(&sums);
    });
    // The weights as the stage's parameters, each with its ParamCache, as the CPU HAL runs a model: the
    // quantised row products then run on weight tiles made once (`qtile.rs`, AVX-512 VNNI), and consecutive
    // ones (q, k, v; gate, up) as one group.
    let as_params = |mut s: loom_ir::kernel::Stage| {
        let ws = s.inputs.split_off(2);
        s.params = ws
            .into_iter()
            .enumerate()
            .map(|(j, b)| loom_ir::kernel::ParamBinding {
                name: b.name.clone(),
                dtype: b.dtype,
                shape: b.shape.clone(),
                input: 0,
                key: format!("w{j}"),
                layout: None,
            })
            .collect();
        for d in &mut s.dispatches {
            for a in &mut d.args {
                if let BufRef::Input(j) = *a
                    && j >= 2
                {
                    *a = BufRef::Param(j - 2);
                }
            }
        }
        s
    };
    let (cached, st) = (as_params(cached), as_params(st));
    let caches: Vec<loom_cpu::ParamCache> = bufs[2..]
        .iter()
        .map(|_| loom_cpu::ParamCache::new())
        .collect();
    let run_params = |s: &loom_ir::kernel::Stage, threads: usize| {
        let cs = loom_cpu::compile_stage(s).expect("compile");
        let ins: Vec<&[u8]> = bufs[..2].iter().map(|v| v.as_slice()).collect();
        let ps: Vec<&[u8]> = bufs[2..].iter().map(|v| v.as_slice()).collect();
        let cs_refs: Vec<&loom_cpu::ParamCache> = caches.iter().collect();
        let mut out = loom_reference::alloc_outputs(s).unwrap();
        best(20, || {
            cs.run_cached(
                &ins,
                &ps,
                &cs_refs,
                &mut out,
                threads,
                &loom_ir::kernel::RunBounds::NONE,
            )
            .expect("run")
        })
    };
    for threads in [1usize, 2] {
        let t = run_params(&cached, threads);
        println!(
            "| SmolLM2 decode token, one matrix of each shape (from cache) | {threads} | {:.2} ms | {:.1} GB/s | 2-thread read {:.2} ms | {:.0} % | - |",
            t * 1e3,
            bytes as f64 / t / 1e9,
            read * 1e3,
            100.0 * read / t
        );
        let t = run_params(&st, threads);
        println!(
            "| SmolLM2 decode token x {m} rows: {} products, {:.1} MB | {threads} | {:.2} ms | {:.1} GB/s, {:.0} GFLOP/s | 2-thread read of the same bytes {:.2} ms ({:.1} GB/s) | {:.0} % | - |",
            order.len(),
            bytes as f64 / 1e6,
            t * 1e3,
            bytes as f64 / t / 1e9,
            2.0 * macs as f64 / t / 1e9,
            read * 1e3,
            bytes as f64 / read / 1e9,
            100.0 * read / t
        );
    }
}
