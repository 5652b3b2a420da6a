//! WGSL emission (Vulkan/wgpu backend): module assembly around the shared body generator, the storage-buffer
//! accessors (every buffer is an array of u32 words), naga validation, and the stage binding plan.

use std::fmt::Write as _;

use loom_ir::kernel::{Access, BufRef, DType, Kernel, Stage};

use crate::body::{ERR_I64_RANGE, Gen, Target};
use crate::{Error, WgslLimits};

/// A validated WGSL module for one kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WgslModule {
    /// The kernel's specialized name.
    pub name: String,
    /// WGSL source text.
    pub source: String,
    /// The compute entry point (`main`).
    pub entry_point: String,
    /// `@workgroup_size(x, 1, 1)`.
    pub workgroup_size: u32,
    /// Workgroups to dispatch: the kernel's grid.
    pub grid: [u32; 3],
    /// Storage bindings in group 0: `0..params` are the kernel parameters in order, then the status buffer.
    pub bindings: u32,
    /// The binding of the 40-byte status buffer (`array<atomic<u32>, 10>`: 8 result words zeroed before the
    /// dispatch, then the instance's loop allowance and the cancellation word, written by the host).
    pub status_binding: u32,
    /// Bytes of workgroup memory the module declares.
    pub workgroup_bytes: u32,
}

/// Workgroup size: 64 invocations for small kernels, 128 once some tile has 1024 elements or more (more
/// invocations per workgroup share the per-element work of big tiles; both are multiples of every vendor's
/// subgroup width), never above the limits.
fn workgroup_size(k: &Kernel, limits: &WgslLimits) -> u32 {
    let biggest = k.values.iter().map(|v| v.ty.elements()).max().unwrap_or(1);
    let want = if biggest >= 1024 { 128 } else { 64 };
    let cap = limits
        .max_compute_invocations_per_workgroup
        .min(limits.max_compute_workgroup_size_x)
        .max(1);
    let mut wg = want.min(cap);
    // A power of two keeps the cyclic distribution's divisions cheap.
    while !wg.is_power_of_two() {
        wg -= 1;
    }
    wg
}

/// Emits (and validates) WGSL for one specialized kernel. See the crate doc for the mapping.
pub fn wgsl_kernel(kernel: &Kernel, limits: &WgslLimits) -> Result<WgslModule, Error> {
    let nb = kernel.params.len() as u64 + 1;
    if nb > u64::from(limits.max_storage_buffers_per_shader_stage) {
        return Err(Error::Unsupported(format!(
            "kernel `{}` needs {nb} storage buffers ({} parameters + status), the limit is {}",
            kernel.name,
            kernel.params.len(),
            limits.max_storage_buffers_per_shader_stage
        )));
    }
    let mut grid = [0u32; 3];
    for (g, &n) in grid.iter_mut().zip(&kernel.grid) {
        if n == 0 || n > u64::from(limits.max_compute_workgroups_per_dimension) {
            return Err(Error::Unsupported(format!(
                "kernel `{}`: grid {:?} exceeds {} workgroups per dimension (or is empty)",
                kernel.name, kernel.grid, limits.max_compute_workgroups_per_dimension
            )));
        }
        *g = n as u32;
    }
    for p in &kernel.params {
        check_param(kernel, p, limits)?;
    }
    let wg = workgroup_size(kernel, limits);
    // Workgroup memory: the scratch words plus the uniform-condition flag.
    let scratch = (limits.max_compute_workgroup_storage_size / 4)
        .saturating_sub(4)
        .min(4096);
    if scratch < 64 {
        return Err(Error::Unsupported(
            "max_compute_workgroup_storage_size is too small for the scratch array".into(),
        ));
    }
    let body = Gen::new(kernel, Target::Wgsl, wg, scratch).run()?;

    let mut s = String::new();
    let _ = writeln!(
        s,
        "// loom-emit: kernel `{}`",
        kernel.name.replace('\n', " ")
    );
    let _ = writeln!(
        s,
        "// grid {:?}, workgroup {wg}; bindings 0..{} = parameters (u32 words), {} = status",
        kernel.grid,
        kernel.params.len(),
        kernel.params.len()
    );
    for (i, p) in kernel.params.iter().enumerate() {
        let atomic = needs_atomic(p.dtype, p.access);
        let elem = if atomic { "atomic<u32>" } else { "u32" };
        let _ = writeln!(
            s,
            "@group(0) @binding({i}) var<storage, read_write> b{i}: array<{elem}>; // {} {}{:?} {:?}",
            p.name.replace('\n', " "),
            p.dtype,
            p.shape,
            p.access
        );
    }
    let sb = kernel.params.len();
    let _ = writeln!(
        s,
        "@group(0) @binding({sb}) var<storage, read_write> status: array<atomic<u32>, 10>;"
    );
    let _ = writeln!(s, "var<workgroup> scratch: array<u32, {scratch}>;");
    let _ = writeln!(s, "var<workgroup> wg_flag: u32;");
    s.push_str(PRELUDE);
    for (i, p) in kernel.params.iter().enumerate() {
        if body.loaded[i] {
            s.push_str(&reader(i, p.dtype, needs_atomic(p.dtype, p.access))?);
        }
        if body.stored[i] {
            s.push_str(&writer(i, p.dtype)?);
        }
    }
    let _ = writeln!(s, "\n@compute @workgroup_size({wg})");
    let _ = writeln!(
        s,
        "fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {{"
    );
    s.push_str("    g_wid = wid;\n");
    if body.code.contains("loom_steps") {
        // The instance's loop-iteration allowance (status word 8, written by the host) and its count.
        s.push_str(
            "    let loom_allow: u32 = atomicLoad(&status[8]);\n    var loom_steps: u32 = 0u;\n",
        );
    }
    s.push_str(&body.decls);
    s.push_str(&body.code);
    s.push_str("}\n");

    validate(&kernel.name, &s)?;
    Ok(WgslModule {
        name: kernel.name.clone(),
        source: s,
        entry_point: "main".into(),
        workgroup_size: wg,
        grid,
        bindings: sb as u32 + 1,
        status_binding: sb as u32,
        workgroup_bytes: (scratch + 1) * 4,
    })
}

/// Parameters must be addressable with i32 element indices and fit one binding.
fn check_param(k: &Kernel, p: &loom_ir::kernel::KParam, limits: &WgslLimits) -> Result<(), Error> {
    let bytes = p.dtype.bytes_for(&p.shape).ok_or_else(|| {
        Error::Malformed(format!(
            "kernel `{}`: `{}`: {}{:?} has no byte size",
            k.name, p.name, p.dtype, p.shape
        ))
    })?;
    let elems = p.shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
    // i64 buffers take two words per element; every element index (and word index) must fit i32.
    let words = bytes.div_ceil(4);
    if elems.is_none_or(|e| e > i32::MAX as u64) || words > i32::MAX as u64 {
        return Err(Error::Unsupported(format!(
            "kernel `{}`: `{}` has more elements than the i32 index emulation of WGSL can address",
            k.name, p.name
        )));
    }
    if bytes > limits.max_storage_buffer_binding_size {
        return Err(Error::Unsupported(format!(
            "kernel `{}`: `{}` is {bytes} bytes, over max_storage_buffer_binding_size ({})",
            k.name, p.name, limits.max_storage_buffer_binding_size
        )));
    }
    Ok(())
}

/// Sub-word element types written by several invocations share u32 words: such buffers are atomic words and
/// stores are `atomicAnd` + `atomicOr` of the element's bits (no lost updates between neighbours).
fn needs_atomic(d: DType, access: Access) -> bool {
    access != Access::Read && d.size().is_some_and(|s| s < 4)
}

fn reader(i: usize, d: DType, atomic: bool) -> Result<String, Error> {
    let w = |idx: &str| {
        if atomic {
            format!("atomicLoad(&b{i}[{idx}])")
        } else {
            format!("b{i}[{idx}]")
        }
    };
    let mut s = String::new();
    let sub = |bits: u32| -> String {
        let per = 32 / bits;
        let sh = per.trailing_zeros();
        format!(
            "(({}) >> ((u32(g) & {}u) * {bits}u)) & {}u",
            w(&format!("u32(g) >> {sh}u")),
            per - 1,
            (1u64 << bits) - 1
        )
    };
    let body = match d {
        DType::F32 => format!("return bitcast<f32>({});", w("g")),
        DType::I32 => format!("return bitcast<i32>({});", w("g")),
        DType::U32 => format!("return {};", w("g")),
        DType::I64 => format!(
            "let lo = {}; let hi = {};\n    if (hi != select(0u, 0xffffffffu, (lo & 0x80000000u) != 0u)) {{ fail({ERR_I64_RANGE}u, {i}u, 0u, g); }}\n    return bitcast<i32>(lo);",
            w("2 * g"),
            w("2 * g + 1")
        ),
        DType::F16 => format!("return h2f({});", sub(16)),
        DType::BF16 => format!("return bitcast<f32>(({}) << 16u);", sub(16)),
        DType::I16 => format!("return bitcast<i32>(({}) << 16u) >> 16u;", sub(16)),
        DType::U16 => format!("return i32({});", sub(16)),
        DType::I8 => format!("return bitcast<i32>(({}) << 24u) >> 24u;", sub(8)),
        DType::U8 => format!("return i32({});", sub(8)),
        DType::I1 => format!("return ({}) != 0u;", sub(8)),
        DType::Q8_0 | DType::Q4_0 | DType::Q4_1 => {
            // Byte and f16 accessors at byte offsets (block sizes 34/18/20 keep every f16 2-byte aligned).
            let _ = writeln!(
                s,
                "fn byte{i}(o: u32) -> u32 {{ return ({} >> ((o & 3u) * 8u)) & 0xffu; }}",
                w("o >> 2u")
            );
            let _ = writeln!(
                s,
                "fn half{i}(o: u32) -> f32 {{ return h2f(({} >> ((o & 2u) * 8u)) & 0xffffu); }}",
                w("o >> 2u")
            );
            let (size, qs) = match d {
                DType::Q8_0 => (34, 2),
                DType::Q4_0 => (18, 2),
                _ => (20, 4),
            };
            let pre = format!(
                "let blk = u32(g) / 32u; let i = u32(g) % 32u; let bo = blk * {size}u;\n    let d = half{i}(bo);"
            );
            let val = match d {
                // ggml: x = qs[i] * d (qs signed)
                DType::Q8_0 => format!(
                    "let q = bitcast<i32>(byte{i}(bo + {qs}u + i) << 24u) >> 24u;\n    return f32(q) * d;"
                ),
                // ggml: x = (q - 8) * d, low nibbles hold elements 0..16, high nibbles 16..32
                DType::Q4_0 => format!(
                    "let by = byte{i}(bo + {qs}u + i % 16u); let q = select(by >> 4u, by & 15u, i < 16u);\n    return (f32(q) - 8.0f) * d;"
                ),
                // ggml: x = q * d + m
                _ => format!(
                    "let m = half{i}(bo + 2u);\n    let by = byte{i}(bo + {qs}u + i % 16u); let q = select(by >> 4u, by & 15u, i < 16u);\n    return f32(q) * d + m;"
                ),
            };
            format!("{pre}\n    {val}")
        }
        DType::Q4K | DType::Q6K => {
            // 144- and 210-byte blocks: every block starts at an even byte, so the f16 fields stay 2-byte aligned.
            let _ = writeln!(
                s,
                "fn byte{i}(o: u32) -> u32 {{ return ({} >> ((o & 3u) * 8u)) & 0xffu; }}",
                w("o >> 2u")
            );
            let _ = writeln!(
                s,
                "fn half{i}(o: u32) -> f32 {{ return h2f(({} >> ((o & 2u) * 8u)) & 0xffffu); }}",
                w("o >> 2u")
            );
            if d == DType::Q4K {
                // block_q4_K { f16 d; f16 dmin; u8 scales[12]; u8 qs[128] }: 4 chunks of 64 elements; chunk c
                // reads qs[32c..32c+32], low nibbles for sub-block 2c, high nibbles for 2c+1; the 6-bit scale and
                // min of sub-block j are ggml's get_scale_min_k4; x = (d * sc) * q - dmin * m.
                format!(
                    "let blk = u32(g) / 256u; let i = u32(g) % 256u; let bo = blk * 144u;
    let d = half{i}(bo); let dmin = half{i}(bo + 2u);
    let c = i / 64u; let w = i % 64u; let j = 2u * c + w / 32u;
    let by = byte{i}(bo + 16u + 32u * c + w % 32u); let q = select(by >> 4u, by & 15u, w < 32u);
    var sc: u32; var m: u32;
    if (j < 4u) {{
        sc = byte{i}(bo + 4u + j) & 63u; m = byte{i}(bo + 8u + j) & 63u;
    }} else {{
        let hi = byte{i}(bo + 8u + j);
        sc = (hi & 15u) | ((byte{i}(bo + j) >> 6u) << 4u);
        m = (hi >> 4u) | ((byte{i}(bo + 4u + j) >> 6u) << 4u);
    }}
    let d1 = d * f32(sc); let m1 = dmin * f32(m);
    return d1 * f32(q) - m1;"
                )
            } else {
                // block_q6_K { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d }: two halves of 128; element 32k + l of
                // half h takes its low 4 bits from ql[64h + l + 32(k & 1)] (low nibble for k < 2) and its high 2
                // bits from qh[32h + l] >> 2k; x = (d * scales[8h + l / 16 + 2k]) * (q - 32).
                format!(
                    "let blk = u32(g) / 256u; let i = u32(g) % 256u; let bo = blk * 210u;
    let h = i / 128u; let r = i % 128u; let k = r / 32u; let l = r % 32u;
    let lb = byte{i}(bo + 64u * h + l + 32u * (k & 1u)); let lo = select(lb >> 4u, lb & 15u, k < 2u);
    let hi = (byte{i}(bo + 128u + 32u * h + l) >> (2u * k)) & 3u;
    let q = i32(lo | (hi << 4u)) - 32;
    let s = bitcast<i32>(byte{i}(bo + 192u + 8u * h + l / 16u + 2u * k) << 24u) >> 24u;
    let d = half{i}(bo + 208u);
    return d * f32(s) * f32(q);"
                )
            }
        }
        other => {
            return Err(Error::Unsupported(format!(
                "loads from {other} buffers in WGSL"
            )));
        }
    };
    let rt = match d {
        DType::U32 => "u32",
        DType::I1 => "bool",
        d if d.is_float() || d.is_quantized() => "f32",
        _ => "i32",
    };
    let _ = writeln!(s, "fn rd{i}(g: i32) -> {rt} {{\n    {body}\n}}");
    Ok(s)
}

fn writer(i: usize, d: DType) -> Result<String, Error> {
    let narrow = |bits: u32, v: &str, ty: &str| -> String {
        let per = 32 / bits;
        let sh = per.trailing_zeros();
        let mask = (1u64 << bits) - 1;
        format!(
            "fn wr{i}(g: i32, x: {ty}) {{\n    let w = u32(g) >> {sh}u; let s = (u32(g) & {}u) * {bits}u;\n    atomicAnd(&b{i}[w], ~({mask}u << s));\n    atomicOr(&b{i}[w], (({v}) & {mask}u) << s);\n}}\n",
            per - 1
        )
    };
    Ok(match d {
        DType::F32 => format!("fn wr{i}(g: i32, x: f32) {{ b{i}[g] = bitcast<u32>(x); }}\n"),
        DType::I32 => format!("fn wr{i}(g: i32, x: i32) {{ b{i}[g] = bitcast<u32>(x); }}\n"),
        DType::U32 => format!("fn wr{i}(g: i32, x: u32) {{ b{i}[g] = x; }}\n"),
        // The high word is the sign extension: i64 values are i32 in registers.
        DType::I64 => format!(
            "fn wr{i}(g: i32, x: i32) {{ b{i}[2 * g] = bitcast<u32>(x); b{i}[2 * g + 1] = select(0u, 0xffffffffu, x < 0); }}\n"
        ),
        // Values are already rounded to the narrow type, so these conversions are exact.
        DType::F16 => narrow(16, "f2h(x)", "f32"),
        DType::BF16 => narrow(16, "bitcast<u32>(x) >> 16u", "f32"),
        DType::I16 | DType::U16 => narrow(16, "bitcast<u32>(x)", "i32"),
        DType::I8 | DType::U8 => narrow(8, "bitcast<u32>(x)", "i32"),
        DType::I1 => narrow(8, "select(0u, 1u, x)", "bool"),
        other => {
            return Err(Error::Unsupported(format!(
                "stores to {other} buffers in WGSL"
            )));
        }
    })
}

/// Helper functions every module carries (unused ones cost nothing after the driver's dead-code elimination).
const PRELUDE: &str = r#"var<private> g_wid: vec3<u32>;

// Status word 0 counts errors; the first one records code, a, b, c and the program id.
fn fail(code: u32, a: u32, b: u32, c: i32) {
    if (atomicAdd(&status[0], 1u) == 0u) {
        atomicStore(&status[1], code);
        atomicStore(&status[2], a);
        atomicStore(&status[3], b);
        atomicStore(&status[4], bitcast<u32>(c));
        atomicStore(&status[5], g_wid.x);
        atomicStore(&status[6], g_wid.y);
        atomicStore(&status[7], g_wid.z);
    }
}

// f32 -> f16 bits, round to nearest even (pack2x16float's rounding and overflow are not pinned down by WGSL).
fn f2h(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    let s = (b >> 16u) & 0x8000u;
    let a = b & 0x7fffffffu;
    if (a > 0x7f800000u) { return s | 0x7e00u; }
    if (a >= 0x477ff000u) { return s | 0x7c00u; }
    if (a < 0x38800000u) {
        let e = a >> 23u;
        if (e < 102u) { return s; }
        let m = (a & 0x7fffffu) | 0x800000u;
        let sh = 126u - e;
        let q = m >> sh;
        let rem = m & ((1u << sh) - 1u);
        let half = 1u << (sh - 1u);
        return s | (q + select(0u, 1u, rem > half || (rem == half && (q & 1u) == 1u)));
    }
    let r = a - 0x38000000u;
    return s | ((r + 0xfffu + ((r >> 13u) & 1u)) >> 13u);
}
// f16 bits -> f32 (exact). Not `unpack2x16float`: naga's default capabilities lack SHADER_FLOAT16_IN_FLOAT32
// (downlevel GL has no packHalf2x16), so the conversion is done with integer ops.
fn h2f(h: u32) -> f32 {
    let s = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if (e == 0u) { let v = f32(m) * 5.9604644775390625e-8f; return select(v, -v, s != 0u); }
    if (e == 31u) { return bitcast<f32>(s | 0x7f800000u | (m << 13u)); }
    return bitcast<f32>(s | ((e + 112u) << 23u) | (m << 13u));
}
fn rf16(x: f32) -> f32 { return h2f(f2h(x)); }
// f32 -> bf16 -> f32, round to nearest even; NaN stays a (quiet) NaN.
fn rbf16(x: f32) -> f32 {
    let b = bitcast<u32>(x);
    if ((b & 0x7fffffffu) > 0x7f800000u) { return bitcast<f32>((b | 0x00400000u) & 0xffff0000u); }
    return bitcast<f32>((b + 0x7fffu + ((b >> 16u) & 1u)) & 0xffff0000u);
}
// IEEE minNum/maxNum: a NaN operand is ignored (WGSL's min/max leave NaN unspecified).
fn fmin_nan(a: f32, b: f32) -> f32 { if (a != a) { return b; } if (b != b) { return a; } return min(a, b); }
fn fmax_nan(a: f32, b: f32) -> f32 { if (a != a) { return b; } if (b != b) { return a; } return max(a, b); }
fn frem(a: f32, b: f32) -> f32 { return a - b * trunc(a / b); }
// tanh saturates: some implementations evaluate it through exp and overflow to NaN for large |x|.
fn tanh_s(x: f32) -> f32 { if (abs(x) > 15.0f) { return sign(x); } return tanh(x); }
// erf: Abramowitz & Stegun 7.1.26 (absolute error <= 1.5e-7); WGSL has no erf.
fn erf_s(x: f32) -> f32 {
    let a = abs(x);
    let t = 1.0f / (1.0f + 0.3275911f * a);
    let y = 1.0f - ((((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t + 0.254829592f) * t * exp(-a * a);
    return select(y, -y, x < 0.0f);
}
// Integer division by zero is an error of the dispatch (WGSL would silently return the dividend); `l`, `c` are
// the op's source line and column.
fn idiv_i32(a: i32, b: i32, l: u32, c: u32) -> i32 { if (b == 0) { fail(2u, l, c, 0); return 0; } return a / b; }
fn irem_i32(a: i32, b: i32, l: u32, c: u32) -> i32 { if (b == 0) { fail(2u, l, c, 0); return 0; } return a % b; }
fn idiv_u32(a: u32, b: u32, l: u32, c: u32) -> u32 { if (b == 0u) { fail(2u, l, c, 0); return 0u; } return a / b; }
fn irem_u32(a: u32, b: u32, l: u32, c: u32) -> u32 { if (b == 0u) { fail(2u, l, c, 0); return 0u; } return a % b; }
"#;

/// Parses and validates WGSL with naga (default capabilities: no f64, no i64).
pub(crate) fn validate(name: &str, src: &str) -> Result<(), Error> {
    let module = naga::front::wgsl::parse_str(src).map_err(|e| Error::Invalid {
        kernel: name.to_string(),
        message: e.emit_to_string(src),
    })?;
    let mut v = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::default(),
    );
    v.validate(&module).map_err(|e| Error::Invalid {
        kernel: name.to_string(),
        message: e.emit_to_string(src),
    })?;
    Ok(())
}

/// Where one binding of a dispatch comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WgslBuffer {
    /// A stage input, output or parameter binding: its own buffer, bound whole.
    Stage(BufRef),
    /// The workspace arena, bound at `offset` for `size` bytes.
    Arena { offset: u64, size: u64 },
    /// The per-dispatch 40-byte status buffer (8 result words zeroed before and read after, then the
    /// allowance and cancellation words written before).
    Status,
}

/// One `@binding` of a dispatch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WgslBinding {
    pub binding: u32,
    pub buffer: WgslBuffer,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WgslDispatch {
    /// Index into [`WgslStage::modules`] (= [`Stage::kernels`]).
    pub kernel: u32,
    pub grid: [u32; 3],
    pub bindings: Vec<WgslBinding>,
}

/// The binding plan of a stage: one module per kernel, the arena layout and each dispatch's bindings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WgslStage {
    pub modules: Vec<WgslModule>,
    /// Byte offset of each workspace buffer inside the arena (256-byte aligned: wgpu's default
    /// `min_storage_buffer_offset_alignment`); sizes are rounded up to whole u32 words.
    pub workspace_offsets: Vec<u64>,
    pub arena_bytes: u64,
    pub dispatches: Vec<WgslDispatch>,
}

/// Plans a stage: emits every kernel, lays the workspace out as one arena (sequentially, no liveness sharing:
/// the host's `reflect` may pack tighter and rebind), and maps every dispatch argument to a binding. Each
/// dispatch uses `params + 1` bindings, checked against `max_storage_buffers_per_shader_stage`.
pub fn wgsl_stage(stage: &Stage, limits: &WgslLimits) -> Result<WgslStage, Error> {
    let modules = stage
        .kernels
        .iter()
        .map(|k| wgsl_kernel(k, limits))
        .collect::<Result<Vec<_>, _>>()?;
    let mut offsets = Vec::with_capacity(stage.workspace.len());
    let mut sizes = Vec::with_capacity(stage.workspace.len());
    let mut at = 0u64;
    for w in &stage.workspace {
        let bytes = w
            .dtype
            .bytes_for(&w.shape)
            .ok_or_else(|| Error::Malformed(format!("workspace `{}` has no byte size", w.name)))?
            .div_ceil(4)
            * 4;
        if bytes > limits.max_storage_buffer_binding_size {
            return Err(Error::Unsupported(format!(
                "workspace `{}` is {bytes} bytes, over max_storage_buffer_binding_size",
                w.name
            )));
        }
        offsets.push(at);
        sizes.push(bytes);
        at = at
            .checked_add(bytes.div_ceil(256) * 256)
            .ok_or_else(|| Error::Malformed("workspace size overflows".into()))?;
    }
    let mut dispatches = Vec::with_capacity(stage.dispatches.len());
    for (di, d) in stage.dispatches.iter().enumerate() {
        let m = modules.get(d.kernel as usize).ok_or_else(|| {
            Error::Malformed(format!(
                "dispatch {di}: kernel #{} does not exist",
                d.kernel
            ))
        })?;
        let k = &stage.kernels[d.kernel as usize];
        if d.args.len() != k.params.len() {
            return Err(Error::Malformed(format!(
                "dispatch {di}: {} arguments for {} parameters",
                d.args.len(),
                k.params.len()
            )));
        }
        let mut bindings = Vec::with_capacity(d.args.len() + 1);
        for (b, arg) in d.args.iter().enumerate() {
            let exists = match *arg {
                BufRef::Input(i) => (i as usize) < stage.inputs.len(),
                BufRef::Output(i) => (i as usize) < stage.outputs.len(),
                BufRef::Param(i) => (i as usize) < stage.params.len(),
                BufRef::Workspace(i) => (i as usize) < stage.workspace.len(),
            };
            if !exists {
                return Err(Error::Malformed(format!(
                    "dispatch {di}: argument {arg:?} does not exist"
                )));
            }
            let buffer = match *arg {
                BufRef::Workspace(i) => WgslBuffer::Arena {
                    offset: offsets[i as usize],
                    size: sizes[i as usize],
                },
                other => WgslBuffer::Stage(other),
            };
            bindings.push(WgslBinding {
                binding: b as u32,
                buffer,
            });
        }
        bindings.push(WgslBinding {
            binding: m.status_binding,
            buffer: WgslBuffer::Status,
        });
        if bindings.len() as u64 > u64::from(limits.max_storage_buffers_per_shader_stage) {
            return Err(Error::Unsupported(format!(
                "dispatch {di} needs {} storage bindings, the limit is {}",
                bindings.len(),
                limits.max_storage_buffers_per_shader_stage
            )));
        }
        dispatches.push(WgslDispatch {
            kernel: d.kernel,
            grid: m.grid,
            bindings,
        });
    }
    Ok(WgslStage {
        modules,
        workspace_offsets: offsets,
        arena_bytes: at,
        dispatches,
    })
}
