//! CUDA C emission (NVRTC backend): one `extern "C" __global__` function per kernel around the shared body
//! generator, typed buffer accessors and a header-free prelude (f16/bf16 conversions by bit manipulation, so
//! the text compiles with NVRTC's built-ins alone).

use std::fmt::Write as _;

use loom_ir::kernel::{Access, DType, Kernel};

use crate::Error;
use crate::body::{Gen, Target};

/// CUDA C text for one kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaModule {
    /// The kernel's specialized name.
    pub name: String,
    /// The `extern "C"` function to look up after NVRTC compilation.
    pub function: String,
    pub source: String,
    /// `blockDim.x` (the block is one-dimensional).
    pub block_dim: u32,
    /// `gridDim`: the kernel's grid.
    pub grid: [u32; 3],
    /// Static shared memory the function declares (the scratch, when the kernel uses it; else 0).
    pub shared_bytes: u32,
}

/// Words (8 bytes each) of shared scratch: 32 KiB, under the 48 KiB static limit of every architecture.
const SCRATCH: u32 = 4096;

/// A C identifier from a specialized kernel name (`motifs.gemm.gemm_bias<M=64,...>` ->
/// `loom_motifs_gemm_gemm_bias_M_64_...`), with a hash suffix so distinct names never collide.
fn ident(name: &str) -> String {
    let mut s = String::from("loom_");
    let mut last = '_';
    for c in name.chars() {
        let c = if c.is_ascii_alphanumeric() { c } else { '_' };
        if !(c == '_' && last == '_') {
            s.push(c);
        }
        last = c;
    }
    let s = s.trim_end_matches('_').to_string();
    // FNV-1a: stable across runs and platforms.
    let mut h: u32 = 0x811c_9dc5;
    for b in name.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    format!("{s}_{h:08x}")
}

fn block_dim(k: &Kernel) -> u32 {
    let biggest = k.values.iter().map(|v| v.ty.elements()).max().unwrap_or(1);
    if biggest >= 1024 { 128 } else { 64 }
}

/// The C element type of a buffer.
fn ctype(d: DType) -> &'static str {
    match d {
        DType::F32 => "float",
        DType::F64 => "double",
        DType::F16 | DType::BF16 | DType::U16 => "unsigned short",
        DType::I16 => "short",
        DType::I64 => "long long",
        DType::I32 => "int",
        DType::U32 => "unsigned",
        DType::I8 => "signed char",
        _ => "unsigned char",
    }
}

/// Emits CUDA C for one specialized kernel. See the crate doc for the mapping (it is WGSL's).
pub fn cuda_kernel(kernel: &Kernel) -> Result<CudaModule, Error> {
    let mut grid = [0u32; 3];
    for (i, (g, &n)) in grid.iter_mut().zip(&kernel.grid).enumerate() {
        let max = if i == 0 { i32::MAX as u64 } else { 65535 };
        if n == 0 || n > max {
            return Err(Error::Unsupported(format!(
                "kernel `{}`: grid {:?} is empty or exceeds CUDA's grid limits",
                kernel.name, kernel.grid
            )));
        }
        *g = n as u32;
    }
    for p in &kernel.params {
        if p.dtype.bytes_for(&p.shape).is_none() {
            return Err(Error::Malformed(format!(
                "kernel `{}`: `{}`: {}{:?} has no byte size",
                kernel.name, p.name, p.dtype, p.shape
            )));
        }
    }
    let wg = block_dim(kernel);
    let body = Gen::new(kernel, Target::Cuda, wg, SCRATCH).run()?;
    let func = ident(&kernel.name);

    let mut s = String::new();
    let _ = writeln!(
        s,
        "// loom-emit: kernel `{}`",
        kernel.name.replace('\n', " ")
    );
    let _ = writeln!(
        s,
        "// grid {:?}, blockDim {wg}; parameters in order, then the status words",
        kernel.grid
    );
    s.push_str(PRELUDE);
    for (i, p) in kernel.params.iter().enumerate() {
        if body.loaded[i] {
            s.push_str(&reader(i, p.dtype));
        }
        if body.stored[i] {
            s.push_str(&writer(i, p.dtype)?);
        }
    }
    let mut params = Vec::new();
    for (i, p) in kernel.params.iter().enumerate() {
        let c = if p.access == Access::Read {
            "const "
        } else {
            ""
        };
        params.push(format!("{c}{}* __restrict__ b{i}", ctype(p.dtype)));
    }
    params.push("unsigned* __restrict__ status".into());
    let _ = writeln!(
        s,
        "\nextern \"C\" __global__ void __launch_bounds__({wg}) {func}({}) {{",
        params.join(", ")
    );
    // Only kernels that stage through scratch declare it (NVRTC warns about an unreferenced array, #177).
    let uses_scratch = body.code.contains("scratch[");
    if uses_scratch {
        let _ = writeln!(s, "    __shared__ unsigned long long scratch[{SCRATCH}];");
    }
    s.push_str("    const unsigned lid = threadIdx.x;\n");
    if body.code.contains("loom_steps") {
        // The instance's loop-iteration allowance (status word 8, written by the host) and its count.
        s.push_str("    const unsigned loom_allow = status[8];\n    unsigned loom_steps = 0u;\n");
    }
    s.push_str(&body.decls);
    s.push_str(&body.code);
    s.push_str("}\n");
    Ok(CudaModule {
        name: kernel.name.clone(),
        function: func,
        source: s,
        block_dim: wg,
        grid,
        shared_bytes: if uses_scratch { SCRATCH * 8 } else { 0 },
    })
}

/// Every buffer dtype can be read (quantised ones dequantise to f32), so this has no error.
fn reader(i: usize, d: DType) -> String {
    let c = ctype(d);
    let (rt, body) = match d {
        DType::F32 => ("float", "return b[g];"),
        DType::F64 => ("double", "return b[g];"),
        DType::F16 => ("float", "return h2f(b[g]);"),
        DType::BF16 => ("float", "return __uint_as_float(((unsigned)b[g]) << 16);"),
        DType::I64 => ("long long", "return b[g];"),
        DType::U32 => ("unsigned", "return b[g];"),
        DType::I32 | DType::I16 | DType::U16 | DType::I8 | DType::U8 => {
            ("int", "return (int)b[g];")
        }
        DType::I1 => ("bool", "return b[g] != 0;"),
        // ggml's block layouts; the same f32 operations in the same order as dequantize_row_*.
        DType::Q8_0 => (
            "float",
            "const unsigned char* k = b + (g / 32) * 34; const int j = (int)(g % 32);\n    const float d = h2f((unsigned short)(k[0] | (k[1] << 8)));\n    return (float)(signed char)k[2 + j] * d;",
        ),
        DType::Q4_0 => (
            "float",
            "const unsigned char* k = b + (g / 32) * 18; const int j = (int)(g % 32);\n    const float d = h2f((unsigned short)(k[0] | (k[1] << 8)));\n    const int q = j < 16 ? (k[2 + j] & 15) : (k[2 + j - 16] >> 4);\n    return ((float)q - 8.0f) * d;",
        ),
        DType::Q4_1 => (
            "float",
            "const unsigned char* k = b + (g / 32) * 20; const int j = (int)(g % 32);\n    const float d = h2f((unsigned short)(k[0] | (k[1] << 8)));\n    const float m = h2f((unsigned short)(k[2] | (k[3] << 8)));\n    const int q = j < 16 ? (k[4 + j] & 15) : (k[4 + j - 16] >> 4);\n    return __fadd_rn(__fmul_rn((float)q, d), m);",
        ),
        // block_q4_K { f16 d; f16 dmin; u8 scales[12]; u8 qs[128] }: 4 chunks of 64 elements; chunk c reads
        // qs[32c..32c+32], low nibbles for sub-block 2c, high nibbles for 2c+1; the 6-bit scale and min of
        // sub-block j are ggml's get_scale_min_k4; x = (d * sc) * q - dmin * m, never contracted into an fma.
        DType::Q4K => (
            "float",
            "const unsigned char* k = b + (g / 256) * 144; const int i = (int)(g % 256);
    const float d = h2f((unsigned short)(k[0] | (k[1] << 8)));
    const float dmin = h2f((unsigned short)(k[2] | (k[3] << 8)));
    const int c = i / 64, w = i % 64, j = 2 * c + w / 32;
    const int by = k[16 + 32 * c + w % 32]; const int q = w < 32 ? (by & 15) : (by >> 4);
    int sc, m;
    if (j < 4) {
        sc = k[4 + j] & 63; m = k[8 + j] & 63;
    } else {
        sc = (k[8 + j] & 15) | ((k[j] >> 6) << 4);
        m = (k[8 + j] >> 4) | ((k[4 + j] >> 6) << 4);
    }
    const float d1 = __fmul_rn(d, (float)sc); const float m1 = __fmul_rn(dmin, (float)m);
    return __fsub_rn(__fmul_rn(d1, (float)q), m1);",
        ),
        // block_q6_K { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d }: two halves of 128; element 32t + l of
        // half h takes its low 4 bits from ql[64h + l + 32(t & 1)] (low nibble for t < 2) and its high 2 bits
        // from qh[32h + l] >> 2t; x = (d * scales[8h + l / 16 + 2t]) * (q - 32).
        DType::Q6K => (
            "float",
            "const unsigned char* k = b + (g / 256) * 210; const int i = (int)(g % 256);
    const int h = i / 128, r = i % 128, t = r / 32, l = r % 32;
    const int lb = k[64 * h + l + 32 * (t & 1)]; const int lo = t < 2 ? (lb & 15) : (lb >> 4);
    const int hi = (k[128 + 32 * h + l] >> (2 * t)) & 3;
    const int q = (lo | (hi << 4)) - 32;
    const float s = (float)(signed char)k[192 + 8 * h + l / 16 + 2 * t];
    const float d = h2f((unsigned short)(k[208] | (k[209] << 8)));
    return __fmul_rn(__fmul_rn(d, s), (float)q);",
        ),
    };
    format!(
        "__device__ __forceinline__ {rt} rd{i}(const {c}* __restrict__ b, long long g) {{\n    {body}\n}}\n"
    )
}

fn writer(i: usize, d: DType) -> Result<String, Error> {
    let c = ctype(d);
    let (vt, body) = match d {
        DType::F32 => ("float", "b[g] = x;"),
        DType::F64 => ("double", "b[g] = x;"),
        DType::F16 => ("float", "b[g] = f2h(x);"),
        DType::BF16 => (
            "float",
            "b[g] = (unsigned short)(__float_as_uint(x) >> 16);",
        ),
        DType::I64 => ("long long", "b[g] = x;"),
        DType::U32 => ("unsigned", "b[g] = x;"),
        DType::I32 | DType::I16 | DType::U16 | DType::I8 | DType::U8 => ("int", "b[g] = x;"),
        DType::I1 => ("bool", "b[g] = x ? 1 : 0;"),
        other => {
            return Err(Error::Unsupported(format!(
                "stores to {other} buffers in CUDA"
            )));
        }
    };
    Ok(format!(
        "__device__ __forceinline__ void wr{i}({c}* __restrict__ b, long long g, {vt} x) {{ {body} }}\n"
    ))
}

const PRELUDE: &str = r#"
// Status words: [0] error count; the first error records [1] code, [2] a, [3] b, [4] c, [5..8] program id;
// the host writes [8] the loop-iteration allowance of each instance and [9] the cancellation word.
__device__ __noinline__ void loom_fail(unsigned* status, unsigned code, unsigned a, unsigned b, int c) {
    if (atomicAdd(&status[0], 1u) == 0u) {
        atomicExch(&status[1], code);
        atomicExch(&status[2], a);
        atomicExch(&status[3], b);
        atomicExch(&status[4], (unsigned)c);
        atomicExch(&status[5], blockIdx.x);
        atomicExch(&status[6], blockIdx.y);
        atomicExch(&status[7], blockIdx.z);
    }
}
// f16 <-> f32 by bit manipulation (round to nearest even), so no cuda_fp16.h is needed.
__device__ __forceinline__ float h2f(unsigned short h) {
    const unsigned s = ((unsigned)h & 0x8000u) << 16, e = ((unsigned)h >> 10) & 0x1fu, m = (unsigned)h & 0x3ffu;
    if (e == 0u) { const float v = (float)m * 5.9604644775390625e-8f; return s ? -v : v; }
    if (e == 31u) return __uint_as_float(s | 0x7f800000u | (m << 13));
    return __uint_as_float(s | ((e + 112u) << 23) | (m << 13));
}
__device__ __forceinline__ unsigned short f2h(float x) {
    const unsigned b = __float_as_uint(x), s = (b >> 16) & 0x8000u, a = b & 0x7fffffffu;
    if (a > 0x7f800000u) return (unsigned short)(s | 0x7e00u);
    if (a >= 0x477ff000u) return (unsigned short)(s | 0x7c00u);
    if (a < 0x38800000u) {
        const unsigned e = a >> 23;
        if (e < 102u) return (unsigned short)s;
        const unsigned m = (a & 0x7fffffu) | 0x800000u, sh = 126u - e, q = m >> sh;
        const unsigned rem = m & ((1u << sh) - 1u), half = 1u << (sh - 1u);
        return (unsigned short)(s | (q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u)));
    }
    const unsigned r = a - 0x38000000u;
    return (unsigned short)(s | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
}
__device__ __forceinline__ float rf16(float x) { return h2f(f2h(x)); }
__device__ __forceinline__ float rbf16(float x) {
    const unsigned b = __float_as_uint(x);
    if ((b & 0x7fffffffu) > 0x7f800000u) return __uint_as_float((b | 0x00400000u) & 0xffff0000u);
    return __uint_as_float((b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u);
}
// C fmin/fmax already ignore a NaN operand (IEEE minNum/maxNum), as the reference does.
__device__ __forceinline__ float fmin_nan(float a, float b) { return fminf(a, b); }
__device__ __forceinline__ float fmax_nan(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double fmin_nan(double a, double b) { return fmin(a, b); }
__device__ __forceinline__ double fmax_nan(double a, double b) { return fmax(a, b); }
// Integer division: by zero is an error of the dispatch (with the op's line and column); MIN / -1 wraps (both
// are undefined in C).
template <typename T> __device__ __forceinline__ T idiv(T a, T b, unsigned* status, unsigned l, unsigned c) {
    if (b == (T)0) { loom_fail(status, 2u, l, c, 0); return (T)0; }
    if ((T)-1 < (T)0 && b == (T)-1) return (T)(0ull - (unsigned long long)a);
    return a / b;
}
template <typename T> __device__ __forceinline__ T irem(T a, T b, unsigned* status, unsigned l, unsigned c) {
    if (b == (T)0) { loom_fail(status, 2u, l, c, 0); return (T)0; }
    if ((T)-1 < (T)0 && b == (T)-1) return (T)0;
    return a % b;
}
"#;
