//! Every motif stage specializes without diagnostics at shapes that are, and are not, tile multiples.

mod common;

use common::*;
use loom_ir::TValue;

fn check(cat: &loom_compiler::Catalog, m: &str, stage: &str, config: Vec<(String, TValue)>) {
    let mi = module(cat, m);
    match loom_kernel::specialize_stage(cat, mi, stage, &config) {
        Ok(s) => {
            assert!(!s.dispatches.is_empty(), "{m}.{stage}: no dispatches");
            let r = loom_kernel::reflect(&s);
            assert_eq!(r.barrier_before.len(), s.dispatches.len());
        }
        Err(e) => panic!("{m}.{stage} {config:?}:\n{}", e.join("")),
    }
}

#[test]
fn motifs_specialize_at_several_shapes() {
    let cat = motif_catalog();
    for (m, n, k) in [(64, 64, 64), (37, 50, 70), (1, 3, 129)] {
        for act in ["none", "gelu_erf", "gelu_tanh", "silu"] {
            check(
                &cat,
                "motifs.gemm",
                "dense",
                cfg(&[
                    ("M", int(m)),
                    ("N", int(n)),
                    ("K", int(k)),
                    ("ACT", TValue::Str(act.into())),
                ]),
            );
        }
    }
    for (r, c) in [(16, 64), (13, 37), (1, 1000)] {
        for (m, s) in [
            ("motifs.norm", "layernorm"),
            ("motifs.norm", "rmsnorm"),
            ("motifs.norm", "l2norm"),
            ("motifs.softmax", "softmax"),
        ] {
            check(&cat, m, s, cfg(&[("R", int(r)), ("C", int(c))]));
        }
    }
    for (r, h, v) in [(16, 64, 1000), (7, 33, 50)] {
        check(
            &cat,
            "motifs.embed",
            "embed",
            cfg(&[("R", int(r)), ("H", int(h)), ("V", int(v))]),
        );
    }
    for (b, t, h) in [(2, 16, 64), (3, 45, 20), (1, 32, 128)] {
        check(
            &cat,
            "motifs.pool",
            "mean_pooling",
            cfg(&[("B", int(b)), ("T", int(t)), ("H", int(h))]),
        );
    }
}
