//! Plugins built out of tree (`tests/plugins/out-of-tree`, a separate cargo project that depends only on
//! `loom-plugin-api`) dropped into the server's plugins directory: the good one is loaded and its device listed;
//! one claiming another ABI major, one whose probe panics and a junk file are each one log line; the server
//! starts and serves.

use crate::support::{TestServer, repo_root};
use serde_json::json;
use std::path::PathBuf;
use std::process::Command;

fn build_out_of_tree() -> PathBuf {
    let root = repo_root();
    let target = root.join("target/out-of-tree");
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.args(["build", "--locked", "--manifest-path"])
        .arg(root.join("tests/plugins/out-of-tree/Cargo.toml"))
        .arg("--target-dir")
        .arg(&target);
    // Nothing of the outer build's configuration leaks into the out-of-tree project.
    for (k, _) in std::env::vars() {
        if (k.starts_with("CARGO_") && k != "CARGO_HOME") || k == "RUSTFLAGS" {
            cmd.env_remove(k);
        }
    }
    let out = cmd.output().expect("running cargo");
    assert!(
        out.status.success(),
        "building the out-of-tree plugins failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    target.join("debug")
}

#[test]
fn out_of_tree_plugins_load_and_bad_ones_are_one_line_each() {
    let built = build_out_of_tree();
    let dir = std::env::temp_dir().join(format!("loom-plugins-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for lib in [
        "liboot_null_hal.so",
        "liboot_abi_next.so",
        "liboot_panics.so",
    ] {
        std::fs::copy(built.join(lib), dir.join(lib)).unwrap();
    }
    std::fs::write(dir.join("libjunk.so"), b"\x7fELF but not really").unwrap();
    let dir_arg = dir.display().to_string();
    let s = TestServer::start("plugins", &["--plugins", &dir_arg]);
    let log = s.log();
    let line = |needle: &str| -> Vec<&str> { log.lines().filter(|l| l.contains(needle)).collect() };
    assert_eq!(line("liboot_abi_next.so").len(), 1, "{log}");
    assert!(
        line("liboot_abi_next.so")[0].contains("ABI version mismatch"),
        "{log}"
    );
    assert_eq!(line("liboot_panics.so").len(), 1, "{log}");
    assert!(
        line("liboot_panics.so")[0].contains("panicked while probing"),
        "{log}"
    );
    assert_eq!(line("libjunk.so").len(), 1, "{log}");
    assert!(line("libjunk.so")[0].contains("not a loom plugin"), "{log}");
    assert!(!line("plugin null-0001").is_empty(), "{log}");
    assert!(!line("device null:0").is_empty(), "{log}");
    // The CPU device still serves the example models; a model placed on the null device fails its preparation
    // with the null HAL's own error (it compiles no stages), and the server keeps serving.
    let r = s.post_json(
        "/v1/embeddings",
        &json!({"model": "arith-embed", "input": "x"}),
    );
    assert_eq!(r.status, 200);
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "on-null", "base": s.dir.join("arith-embed").display().to_string(), "device": "null"}),
    );
    assert_eq!(r.status, 500, "{}", r.text());
    assert!(r.text().contains("compiles no stages"), "{}", r.text());
    s.healthy();
    let _ = std::fs::remove_dir_all(&dir);
}
