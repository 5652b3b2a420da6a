// loom-emit: kernel `golden.axpb`
// grid [2, 1, 1], workgroup 64; bindings 0..2 = parameters (u32 words), 2 = status
@group(0) @binding(0) var<storage, read_write> b0: array<u32>; // x f32[37] Read
@group(0) @binding(1) var<storage, read_write> b1: array<u32>; // y f32[37] Write
@group(0) @binding(2) var<storage, read_write> status: array<atomic<u32>, 10>;
var<workgroup> scratch: array<u32, 4092>;
var<workgroup> wg_flag: u32;
var<private> g_wid: vec3<u32>;

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
fn rd0(g: i32) -> f32 {
    return bitcast<f32>(b0[g]);
}
fn wr1(g: i32, x: f32) { b1[g] = bitcast<u32>(x); }

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    g_wid = wid;
    var v0: i32;
    var v1: i32;
    var v2: array<i32, 1>;
    var off1: array<i32, 1>;
    var ok2: array<bool, 1>;
    var v3: array<f32, 1>;
    var v4: array<f32, 1>;
    var v5: array<f32, 1>;
    var off4: array<i32, 1>;
    var ok5: array<bool, 1>;
    v0 = i32(wid.x);
    v1 = (v0 * 32i);
    for (var k: u32 = 0u; k < 1u; k = k + 1u) {
        let e: u32 = k * 64u + lid;
        if (e < 32u) {
            v2[k] = (v1 + i32(e));
        }
    }
    for (var k: u32 = 0u; k < 1u; k = k + 1u) {
        let e: u32 = k * 64u + lid;
        if (e < 32u) {
            off1[k] = 0; ok2[k] = true;
        }
    }
    for (var k: u32 = 0u; k < 1u; k = k + 1u) {
        let e: u32 = k * 64u + lid;
        if (e < 32u) {
            let x3: i32 = (v1 + i32(((e / 1u) % 32u)));
            let inr: bool = x3 >= 0 && x3 < 37i;
            off1[k] = off1[k] + select(0, x3 * 1i, inr);
            ok2[k] = ok2[k] && inr;
        }
    }
    for (var k: u32 = 0u; k < 1u; k = k + 1u) {
        let e: u32 = k * 64u + lid;
        if (e < 32u) {
            v3[k] = 0.0f;
            if (ok2[k]) { v3[k] = rd0(off1[k]); }
        }
    }
    for (var k: u32 = 0u; k < 1u; k = k + 1u) {
        let e: u32 = k * 64u + lid;
        if (e < 32u) {
            v4[k] = (v3[k] * 2.0f);
        }
    }
    for (var k: u32 = 0u; k < 1u; k = k + 1u) {
        let e: u32 = k * 64u + lid;
        if (e < 32u) {
            v5[k] = (v4[k] + 1.0f);
        }
    }
    for (var k: u32 = 0u; k < 1u; k = k + 1u) {
        let e: u32 = k * 64u + lid;
        if (e < 32u) {
            off4[k] = 0; ok5[k] = true;
        }
    }
    for (var k: u32 = 0u; k < 1u; k = k + 1u) {
        let e: u32 = k * 64u + lid;
        if (e < 32u) {
            let x6: i32 = (v1 + i32(((e / 1u) % 32u)));
            let inr: bool = x6 >= 0 && x6 < 37i;
            off4[k] = off4[k] + select(0, x6 * 1i, inr);
            ok5[k] = ok5[k] && inr;
        }
    }
    for (var k: u32 = 0u; k < 1u; k = k + 1u) {
        let e: u32 = k * 64u + lid;
        if (e < 32u) {
            if (ok5[k]) { wr1(off4[k], v5[k]); }
        }
    }
}
