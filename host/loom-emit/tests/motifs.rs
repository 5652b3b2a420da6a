//! Every motif stage in `packages/motifs/`, specialized by `loom-kernel` at a couple of shapes (tile multiples
//! and ragged ones): every kernel emits WGSL that naga validates (RoPE's f64 frequency table included: it is
//! folded to literals), every stage gets a binding plan within the default limits, and every kernel emits CUDA C.

use loom_compiler::Catalog;
use loom_emit::{WgslBuffer, WgslLimits, cuda_kernel, wgsl_kernel, wgsl_stage};
use loom_ir::TValue;
use loom_ir::kernel::Stage;

fn catalog() -> &'static Catalog {
    loom_testkit::motif_catalog()
}

fn specialize(stage: &str, cfg: &[(&str, TValue)]) -> Stage {
    let (module, name) = stage.rsplit_once('.').expect("MODULE.STAGE");
    let cat = catalog();
    let mi = cat
        .find(module)
        .unwrap_or_else(|| panic!("no module @{module}"));
    let cfg: Vec<(String, TValue)> = cfg
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    loom_kernel::specialize_stage(cat, mi, name, &cfg)
        .unwrap_or_else(|e| panic!("{stage} {cfg:?}:\n{}", e.join("")))
}

fn int(v: i64) -> TValue {
    TValue::I64(v)
}

/// (stage, configuration) pairs: defaults-like shapes and shapes that are not multiples of the tiles.
fn cases() -> Vec<(&'static str, Vec<(&'static str, TValue)>)> {
    let mut v: Vec<(&'static str, Vec<(&'static str, TValue)>)> = vec![];
    for (m, n, k) in [(64, 64, 64), (37, 45, 70), (1, 3, 129)] {
        for act in ["none", "gelu_erf", "gelu_tanh", "silu"] {
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
    }
    for (r, c) in [(16, 64), (13, 37), (5, 4096)] {
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
    for n in [1024, 1000, 3] {
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

#[test]
fn every_motif_kernel_emits_valid_wgsl() {
    let limits = WgslLimits::default();
    let mut validated = 0;
    for (stage, cfg) in cases() {
        let st = specialize(stage, &cfg);
        for k in &st.kernels {
            match wgsl_kernel(k, &limits) {
                Ok(m) => {
                    assert!(m.source.contains("@compute"), "{}", k.name);
                    assert!(m.workgroup_size == 64 || m.workgroup_size == 128);
                    validated += 1;
                }
                Err(e) => panic!("{stage} {cfg:?}: kernel `{}`: {e}", k.name),
            }
        }
        let plan = wgsl_stage(&st, &limits).unwrap_or_else(|e| panic!("{stage}: {e}"));
        assert_eq!(plan.dispatches.len(), st.dispatches.len());
        for d in &plan.dispatches {
            assert!(d.bindings.len() <= 8);
            assert_eq!(
                d.bindings.last().map(|b| b.buffer),
                Some(WgslBuffer::Status)
            );
        }
        for (w, off) in st.workspace.iter().zip(&plan.workspace_offsets) {
            assert_eq!(off % 256, 0, "{}", w.name);
        }
    }
    assert!(validated >= 44, "only {validated} kernels validated");
}

#[test]
fn every_motif_kernel_emits_cuda() {
    for (stage, cfg) in cases() {
        let st = specialize(stage, &cfg);
        for k in &st.kernels {
            let m = cuda_kernel(k)
                .unwrap_or_else(|e| panic!("{stage} {cfg:?}: kernel `{}`: {e}", k.name));
            assert!(m.source.contains(&format!(
                "extern \"C\" __global__ void __launch_bounds__({}) {}(",
                m.block_dim, m.function
            )));
            assert_eq!(m.source.matches("__global__").count(), 1);
            // Balanced braces and parentheses: a cheap structural check of the C text.
            assert_eq!(
                m.source.matches('{').count(),
                m.source.matches('}').count(),
                "{}",
                k.name
            );
            assert_eq!(
                m.source.matches('(').count(),
                m.source.matches(')').count(),
                "{}",
                k.name
            );
        }
    }
}

#[test]
fn attention_dot_fits_the_downlevel_workgroup_memory() {
    let st = specialize(
        "motifs.attention.attention_causal",
        &[("B", int(1)), ("S", int(16)), ("H", int(4)), ("D", int(64))],
    );
    let m = wgsl_kernel(&st.kernels[0], &WgslLimits::default()).unwrap();
    assert!(m.workgroup_bytes <= 16384);
    assert!(m.source.contains("workgroupBarrier()"));
    assert!(m.source.contains("workgroupUniformLoad(&wg_flag)"));
}
