//! The CUDA dequantisation of every GGUF format, run on the host without a GPU: the `rd0` reader that
//! `cuda_kernel` emits for a quantised load (and the prelude's `h2f` it calls) is cut out of the CUDA C,
//! compiled by the host's C compiler (`$CC`, else `cc`, the linker Rust itself uses) with the few CUDA
//! built-ins it uses defined as their IEEE single-precision operations (`__fmul_rn` is `a * b`, with
//! `-ffp-contract=off` so nothing is fused), and run over random blocks. Every element must be bit-identical
//! to `loom_reference::dequantize` (ggml's `dequantize_row_*`), NaN for NaN: the random f16 scales include
//! subnormals, infinities and NaNs.
//!
//! This checks the readers' C text and arithmetic, not NVRTC's code generation or a device: NVRTC and ptxas
//! compile the whole kernels in `hal-cuda`'s `tests/nvrtc.rs`, and the HAL conformance suite executes them
//! on a GPU where one is lent.

use std::path::PathBuf;
use std::process::Command;

use loom_emit::cuda_kernel;
use loom_ir::kernel::DType;
use loom_testkit::corpus;

/// The function whose signature starts with `head`, through its closing `}` at the start of a line.
fn function(src: &str, head: &str) -> String {
    let start = src
        .find(head)
        .unwrap_or_else(|| panic!("no `{head}` in:\n{src}"));
    let len = src[start..]
        .find("\n}\n")
        .unwrap_or_else(|| panic!("`{head}` does not end"));
    src[start..start + len + 3].to_string()
}

const HARNESS_HEAD: &str = r#"#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if FLT_EVAL_METHOD != 0
#error "float arithmetic must be evaluated in single precision"
#endif
#define __device__
#define __forceinline__ static inline
#define __restrict__ restrict
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
"#;

const HARNESS_MAIN: &str = r#"
/* quantised bytes on stdin; argv[1] elements; f32 little-endian values on stdout */
int main(int argc, char** argv) {
    if (argc != 2) return 2;
    const long long n = atoll(argv[1]);
    size_t cap = 1 << 16, len = 0, got;
    unsigned char* b = malloc(cap);
    while ((got = fread(b + len, 1, cap - len, stdin)) > 0) {
        len += got;
        if (len == cap) b = realloc(b, cap *= 2);
    }
    float* y = malloc((size_t)n * sizeof(float));
    for (long long g = 0; g < n; g++) y[g] = rd0(b, g);
    return fwrite(y, sizeof(float), (size_t)n, stdout) == (size_t)n ? 0 : 1;
}
"#;

fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

/// `blocks` blocks of random bytes; one in four blocks gets finite, normal f16 scales (so most of its values
/// are ordinary numbers), the others keep their random scale bits (subnormal, infinite and NaN included).
fn random_blocks(d: DType, blocks: usize, seed: u64) -> Vec<u8> {
    let (_, size) = d.block().expect("a block type");
    let mut next = xorshift(seed);
    let mut out = Vec::new();
    for n in 0..blocks {
        let mut b: Vec<u8> = (0..size).map(|_| next() as u8).collect();
        let f16_at: &[usize] = match d {
            DType::Q8_0 | DType::Q4_0 => &[0],
            DType::Q4_1 | DType::Q4K => &[0, 2],
            DType::Q6K => &[208],
            _ => &[],
        };
        if n % 4 == 0 {
            for &o in f16_at {
                let r = next();
                let h = ((r & 1) << 15) as u16
                    | (((1 + (r >> 1) % 30) as u16) << 10)
                    | ((r >> 8) as u16 & 0x3ff);
                b[o..o + 2].copy_from_slice(&h.to_le_bytes());
            }
        }
        out.extend(b);
    }
    out
}

fn compile(d: DType, dir: &std::path::Path) -> PathBuf {
    let k = corpus::quantised_load(d);
    let m = cuda_kernel(&k).unwrap_or_else(|e| panic!("CUDA for `{}`: {e}", k.name));
    let h2f = function(
        &m.source,
        "__device__ __forceinline__ float h2f(unsigned short h) {",
    );
    let rd = function(
        &m.source,
        "__device__ __forceinline__ float rd0(const unsigned char* __restrict__ b, long long g) {",
    );
    let c = dir.join(format!("{d}.c"));
    let exe = dir.join(format!("{d}.exe"));
    std::fs::write(&c, format!("{HARNESS_HEAD}{h2f}{rd}{HARNESS_MAIN}")).expect("write C");
    let cc = std::env::var("CC")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "cc".into());
    let out = Command::new(&cc)
        .args([
            "-std=c99",
            "-O2",
            "-ffp-contract=off",
            "-Wall",
            "-Werror",
            "-o",
        ])
        .arg(&exe)
        .arg(&c)
        .output()
        .unwrap_or_else(|e| panic!("running the host C compiler `{cc}`: {e}"));
    assert!(
        out.status.success(),
        "{cc} rejected the {d} reader:\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(&c).unwrap_or_default()
    );
    exe
}

fn run(exe: &std::path::Path, bytes: &[u8], n: usize) -> Vec<f32> {
    use std::io::Write;
    let mut child = Command::new(exe)
        .arg(n.to_string())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run the harness");
    let mut stdin = child.stdin.take().expect("stdin");
    let input = bytes.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output().expect("harness output");
    writer.join().expect("writer").expect("write stdin");
    assert!(out.status.success(), "harness failed: {:?}", out.status);
    assert_eq!(out.stdout.len(), n * 4);
    out.stdout
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn cuda_readers_of_every_gguf_format_match_the_reference_bit_for_bit() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cuda_dequant");
    std::fs::create_dir_all(&dir).expect("temp dir");
    for d in [
        DType::Q8_0,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q4K,
        DType::Q6K,
    ] {
        let (per, _) = d.block().expect("block");
        let blocks = 16384 / per as usize;
        let bytes = random_blocks(d, blocks, 0x2545_f491_4f6c_dd1d ^ per);
        let want = loom_reference::dequantize(d, &bytes).expect("reference");
        assert_eq!(want.len(), blocks * per as usize);
        let got = run(&compile(d, &dir), &bytes, want.len());
        let mut ordinary = 0;
        for (g, (x, w)) in got.iter().zip(&want).enumerate() {
            let same = x.to_bits() == w.to_bits() || (x.is_nan() && w.is_nan());
            assert!(
                same,
                "{d} element {g} (block {}, index {}): CUDA reader {x:e} ({:#010x}) vs reference {w:e} ({:#010x})",
                g / per as usize,
                g % per as usize,
                x.to_bits(),
                w.to_bits()
            );
            ordinary += usize::from(w.is_finite() && *w != 0.0);
        }
        // The comparison is not vacuous: most values are ordinary numbers.
        assert!(
            ordinary * 2 > want.len(),
            "{d}: only {ordinary} finite non-zero values"
        );
    }
}
