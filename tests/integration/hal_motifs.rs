//! The same motif stages (`packages/motifs/*.loom`) on the CPU and the Vulkan HAL, on random inputs, compared
//! within tolerance; then one pass on Vulkan with wgpu's downlevel default limits. The CPU and the default
//! Vulkan pass use the loaded plugins (`libhal_cpu.so`, `libhal_vulkan.so`); the downlevel pass uses the
//! `hal-vulkan` rlib in-process (`driver_with(LimitsProfile::Downlevel)`). Only one plugin rlib may be linked
//! into a binary: each exports the same root-module symbol.
//!
//! What WGSL cannot run is asserted as the compile error it must be, never skipped silently.

use loom_ir::TValue;
use loom_ir::kernel::{DType, Stage, StageBuffer};
use loom_ir::kernel_codec::encode_stage;
use loom_plugin_api::abi_stable::std_types::{RBoxError, RResult, RSlice, RVec};
use loom_plugin_api::{
    BufferId, Command, HalDeviceBox, HalDriverBox, Submission, TimelinePoint, WaitStatus,
};

use crate::hal_conformance::{catalog, plugin};

const WAIT_NS: u64 = 120_000_000_000;

fn int(v: i64) -> TValue {
    TValue::I64(v)
}

/// (stage, configuration): every motif stage, at a tile-multiple shape and a ragged one.
fn cases() -> Vec<(&'static str, Vec<(&'static str, TValue)>)> {
    let mut v: Vec<(&'static str, Vec<(&'static str, TValue)>)> = vec![];
    for (m, n, k, act) in [
        (64, 64, 64, "none"),
        (37, 45, 70, "gelu_erf"),
        (1, 3, 129, "silu"),
    ] {
        v.push((
            "motifs.gemm.dense",
            vec![
                ("M", int(m)),
                ("N", int(n)),
                ("K", int(k)),
                ("ACT", TValue::Str(act.into())),
            ],
        ));
    }
    v.push((
        "motifs.gemm.dense",
        vec![
            ("M", int(16)),
            ("N", int(24)),
            ("K", int(40)),
            ("ACT", TValue::Str("gelu_tanh".into())),
        ],
    ));
    for (r, c) in [(16, 64), (13, 37)] {
        for s in [
            "motifs.norm.layernorm",
            "motifs.norm.rmsnorm",
            "motifs.norm.l2norm",
            "motifs.softmax.softmax",
        ] {
            v.push((s, vec![("R", int(r)), ("C", int(c))]));
        }
    }
    for (r, h, vv) in [(16, 64, 1000), (7, 33, 50)] {
        v.push((
            "motifs.embed.embed",
            vec![("R", int(r)), ("H", int(h)), ("V", int(vv))],
        ));
    }
    for (b, t, h) in [(2, 16, 64), (3, 5, 37)] {
        v.push((
            "motifs.pool.mean_pooling",
            vec![("B", int(b)), ("T", int(t)), ("H", int(h))],
        ));
    }
    for n in [1024, 1000] {
        for s in [
            "motifs.act.gelu_erf",
            "motifs.act.gelu_tanh",
            "motifs.act.silu",
            "motifs.act.silu_mul",
        ] {
            v.push((s, vec![("N", int(n))]));
        }
    }
    for (b, s, h, kv, d) in [(2, 16, 4, 4, 64), (1, 37, 6, 3, 40)] {
        v.push((
            "motifs.attention.attention_padded",
            vec![
                ("B", int(b)),
                ("S", int(s)),
                ("H", int(h)),
                ("KV", int(kv)),
                ("D", int(d)),
            ],
        ));
        v.push((
            "motifs.attention.attention_causal",
            vec![
                ("B", int(b)),
                ("S", int(s)),
                ("T", int(s + 5)),
                ("H", int(h)),
                ("KV", int(kv)),
                ("D", int(d)),
            ],
        ));
    }
    for (n, h, d) in [(16, 4, 64), (5, 3, 10)] {
        v.push((
            "motifs.rope.rope",
            vec![("N", int(n)), ("H", int(h)), ("D", int(d))],
        ));
        v.push((
            "motifs.rope.rope_qk",
            vec![("N", int(n)), ("H", int(h)), ("D", int(d))],
        ));
    }
    v
}

fn specialize(stage: &str, cfg: &[(&str, TValue)]) -> Stage {
    let (module, name) = stage.rsplit_once('.').expect("MODULE.STAGE");
    let cat = catalog();
    let cfg: Vec<(String, TValue)> = cfg
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    loom_kernel::specialize_stage(cat, cat.find(module).expect("module"), name, &cfg)
        .unwrap_or_else(|e| panic!("{stage} {cfg:?}: {}", e.join("")))
}

fn cfg_int(cfg: &[(&str, TValue)], key: &str) -> Option<i64> {
    cfg.iter().find_map(|(k, v)| match v {
        TValue::I64(x) if *k == key => Some(*x),
        _ => None,
    })
}

/// xorshift64*: deterministic random inputs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0
    }
}

/// Random bytes for one stage buffer: floats in [-2, 2); integers in the range the motif's contract gives
/// them (token ids below the vocabulary, lengths within the sequence, masks 0/1, positions).
fn random_buffer(b: &StageBuffer, cfg: &[(&str, TValue)], rng: &mut Rng) -> Vec<u8> {
    let n: u64 = b.shape.iter().product();
    match b.dtype {
        DType::F32 => (0..n).flat_map(|_| rng.f32().to_le_bytes()).collect(),
        DType::I32 => {
            let hi = match b.name.as_str() {
                "ids" => cfg_int(cfg, "V").unwrap_or(1) as u64,
                "lens" => cfg_int(cfg, "S").unwrap_or(1) as u64,
                "mask" => 2,
                _ => 4096,
            };
            (0..n)
                .flat_map(|_| {
                    let x = rng.below(hi) as i32 + i32::from(b.name == "lens");
                    x.to_le_bytes()
                })
                .collect()
        }
        other => panic!("no random inputs for {other} (buffer `{}`)", b.name),
    }
}

fn ok<T>(what: &str, r: RResult<T, RBoxError>) -> T {
    r.into_result().unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// Compiles and runs `stage` on `dev`: the outputs, or the compile error.
fn run(
    dev: &HalDeviceBox,
    stage: &Stage,
    inputs: &[Vec<u8>],
    params: &[Vec<u8>],
) -> Result<Vec<Vec<u8>>, String> {
    let exe = dev
        .compile(RSlice::from_slice(&encode_stage(stage)))
        .into_result()
        .map_err(|e| e.to_string())?;
    let upload = |data: &[u8]| -> BufferId {
        let b = ok("alloc", dev.alloc(data.len() as u64));
        ok("write", dev.write(b, 0, RSlice::from_slice(data)));
        b
    };
    let ins: Vec<BufferId> = inputs.iter().map(|d| upload(d)).collect();
    let ps: Vec<BufferId> = params.iter().map(|d| upload(d)).collect();
    let size = |b: &StageBuffer| b.dtype.bytes_for(&b.shape).expect("byte size");
    let outs: Vec<BufferId> = stage
        .outputs
        .iter()
        .map(|b| ok("alloc", dev.alloc(size(b))))
        .collect();
    let ws: Vec<BufferId> = stage
        .workspace
        .iter()
        .map(|b| ok("alloc", dev.alloc(size(b))))
        .collect();
    let t = ok("timeline", dev.timeline_create());
    let signal = TimelinePoint {
        timeline: t,
        value: 1,
    };
    ok(
        "submit",
        dev.submit(Submission {
            commands: RVec::from(vec![Command::Dispatch {
                exe,
                inputs: RVec::from(ins.clone()),
                params: RVec::from(ps.clone()),
                outputs: RVec::from(outs.clone()),
                workspace: RVec::from(ws.clone()),
            }]),
            wait: RVec::new(),
            signal,
        }),
    );
    let status = dev
        .timeline_wait(signal, WAIT_NS)
        .into_result()
        .map_err(|e| format!("dispatch: {e}"))?;
    assert_eq!(status, WaitStatus::Reached, "{}: timed out", stage.name);
    let got = stage
        .outputs
        .iter()
        .zip(&outs)
        .map(|(b, &id)| ok("read", dev.read(id, 0, size(b))).into_vec())
        .collect();
    for id in ins.into_iter().chain(ps).chain(outs).chain(ws) {
        ok("free", dev.free(id));
    }
    Ok(got)
}

fn floats(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Vulkan vs CPU: both accumulate in f32 but in different orders, and WGSL's `exp`/`tanh`/division have the
/// precision WGSL allows, so the bound is relative to the magnitude with a small absolute floor. Measured on
/// lavapipe: at most 2.5e-6 (a 64x64x64 dense); the bound leaves 10x for other drivers' FMA contraction.
/// Returns the largest relative error seen.
fn assert_close(what: &str, got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len(), "{what}");
    let mut worst = 0.0f32;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        if g.is_nan() && w.is_nan() {
            continue;
        }
        let err = (g - w).abs() / (1.0 + w.abs());
        assert!(
            err <= 3e-5,
            "{what}: element {i}: vulkan {g} vs cpu {w} (relative error {err:e})"
        );
        worst = worst.max(err);
    }
    worst
}

fn open(driver: &HalDriverBox) -> HalDeviceBox {
    assert!(!driver.devices().is_empty(), "no device");
    ok("open", driver.open(0))
}

/// What WGSL cannot express, asserted rather than skipped.
fn expected_compile_error(downlevel: bool, s: &Stage) -> Option<&'static str> {
    let most = s.kernels.iter().map(|k| k.params.len()).max().unwrap_or(0) as u32;
    let limit = if downlevel { 4 } else { 8 };
    if most + 1 > limit {
        // Not a bug: one storage binding per parameter plus the status buffer exceeds the requested limit.
        return Some("storage buffers");
    }
    None
}

fn compare_motifs(vk: &HalDeviceBox, downlevel: bool) {
    let cpu = open(&plugin("cpu-0001").hal().expect("cpu driver"));
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let mut ran = 0;
    let mut worst = (0.0f32, String::new());
    let mut refused = Vec::new();
    for (name, cfg) in cases() {
        let stage = specialize(name, &cfg);
        let what = format!(
            "{name} {cfg:?}{}",
            if downlevel { " (downlevel)" } else { "" }
        );
        let inputs: Vec<Vec<u8>> = stage
            .inputs
            .iter()
            .map(|b| random_buffer(b, &cfg, &mut rng))
            .collect();
        let params: Vec<Vec<u8>> = stage
            .params
            .iter()
            .map(|p| {
                let b = StageBuffer {
                    name: p.name.clone(),
                    dtype: p.dtype,
                    shape: p.shape.clone(),
                };
                random_buffer(&b, &cfg, &mut rng)
            })
            .collect();
        let got = run(vk, &stage, &inputs, &params);
        match (expected_compile_error(downlevel, &stage), got) {
            (Some(needle), Err(e)) => {
                assert!(
                    e.contains(needle) && e.contains("not supported by the vulkan backend"),
                    "{what}: expected a clear `{needle}` compile error, got: {e}"
                );
                refused.push(name);
            }
            (Some(needle), Ok(_)) => {
                panic!("{what}: ran on vulkan, but a `{needle}` compile error was expected")
            }
            (None, Err(e)) => panic!("{what}: {e}"),
            (None, Ok(got)) => {
                let want = run(&cpu, &stage, &inputs, &params)
                    .unwrap_or_else(|e| panic!("{what}: cpu: {e}"));
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    let e = assert_close(&format!("{what} output {i}"), &floats(g), &floats(w));
                    if e > worst.0 {
                        worst = (e, what.clone());
                    }
                }
                ran += 1;
            }
        }
    }
    assert!(
        ran >= 10,
        "only {ran} motif stages ran on vulkan (refused: {refused:?})"
    );
    eprintln!(
        "{ran} motif stages agree on cpu and vulkan (largest relative error {:e}, {}); \
         refused as expected: {refused:?}",
        worst.0, worst.1
    );
}

#[test]
fn hal_motifs_agree_on_cpu_and_vulkan() {
    let vk = open(&plugin("vulkan-0001").hal().expect("vulkan driver"));
    compare_motifs(&vk, false);
}

#[test]
fn hal_motifs_on_vulkan_with_downlevel_limits() {
    let vk = open(&hal_vulkan::driver_with(
        hal_vulkan::LimitsProfile::Downlevel,
    ));
    compare_motifs(&vk, true);
}
