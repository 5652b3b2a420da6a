//! Cross-checks a GEMM + bias + GELU(erf) kernel against an independent numpy computation
//! (`tests/oracle/gemm_bias_gelu.py`). numpy is installed with pip when missing; if that is impossible the
//! test fails loudly rather than skipping.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use loom_reference::{POISON_BYTE, run_kernel};

fn python() -> &'static str {
    "python3"
}

fn has_numpy() -> bool {
    Command::new(python())
        .args(["-c", "import numpy"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

fn ensure_numpy() {
    if has_numpy() {
        return;
    }
    let attempts: [&[&str]; 2] = [
        &["-m", "pip", "install", "--quiet", "numpy"],
        // Distribution Pythons refuse system-wide installs (PEP 668); a user install still works.
        &[
            "-m",
            "pip",
            "install",
            "--quiet",
            "--user",
            "--break-system-packages",
            "numpy",
        ],
    ];
    let mut log = String::new();
    for args in attempts {
        match Command::new(python()).args(args).output() {
            Ok(o) => {
                log += &format!(
                    "`{} {}`: {}\n{}",
                    python(),
                    args.join(" "),
                    o.status,
                    String::from_utf8_lossy(&o.stderr)
                );
                if o.status.success() && has_numpy() {
                    return;
                }
            }
            Err(e) => log += &format!("cannot run {}: {e}\n", python()),
        }
    }
    panic!("numpy is required for the oracle test and could not be installed:\n{log}");
}

fn scratch_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("loom-reference-oracle-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn gemm_bias_gelu_matches_numpy() {
    ensure_numpy();
    let (m, n, k) = (37usize, 29usize, 45usize);
    let mut rng = Rng::new(12);
    let a = rng.f32s(m * k, -1.0, 1.0);
    let b = rng.f32s(k * n, -1.0, 1.0);
    let bias = rng.f32s(n, -0.5, 0.5);

    let kern = gemm_kernel(m as u64, n as u64, k as u64, 16, 16, 8, true);
    let mut bufs = vec![
        f32_bytes(&a),
        f32_bytes(&b),
        f32_bytes(&bias),
        vec![POISON_BYTE; m * n * 4],
    ];
    run_kernel(&kern, &mut bufs).unwrap();
    let got = f32s(&bufs[3]);

    let dir = scratch_dir();
    std::fs::write(dir.join("a.bin"), &bufs[0]).unwrap();
    std::fs::write(dir.join("b.bin"), &bufs[1]).unwrap();
    std::fs::write(dir.join("bias.bin"), &bufs[2]).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oracle/gemm_bias_gelu.py");
    let out = Command::new(python())
        .arg(&script)
        .arg(&dir)
        .args([m.to_string(), n.to_string(), k.to_string()])
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "oracle script failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let want: Vec<f64> = std::fs::read(dir.join("want.bin"))
        .unwrap()
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let _ = std::fs::remove_dir_all(&dir);

    assert_eq!(want.len(), m * n);
    for (j, (&g, &w)) in got.iter().zip(&want).enumerate() {
        // f32 storage between ops: a few f32 ulps of the pre-activation (|y| <= ~8) plus the epilogue.
        assert!(
            rel_close(g as f64, w, 1e-5, 2e-6),
            "y[{}][{}] = {g} vs numpy {w}",
            j / n,
            j % n
        );
    }
}
