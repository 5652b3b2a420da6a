//! Packages and deployments the way operators ship them: programs as `.loombc` bytecode, and a deployment file
//! whose device preference list falls back to the CPU (logged).

use crate::support::{TestServer, package_dir};
use serde_json::json;

/// `arith-embed` with its programs compiled to `.loombc` (by the compiler, as `loomc build` does) serves the
/// same embeddings as the `.loom` package.
#[test]
fn bytecode_programs_serve_like_their_source() {
    let s = TestServer::start("deploy-bc", &[]);
    let base = s.dir.join("bytecode");
    std::fs::create_dir_all(&base).unwrap();
    let src = s.dir.join("arith-embed");
    for f in ["prepare", "control", "kernel"] {
        let name = format!("{f}.loom");
        let text = std::fs::read_to_string(src.join(&name)).unwrap();
        let (module, diags) = loom_compiler::compile_text(&name, &text);
        let module = module.unwrap_or_else(|| panic!("{name}: {}", diags.concat()));
        std::fs::write(
            base.join(format!("{f}.loombc")),
            loom_ir::bytecode::encode(&module),
        )
        .unwrap();
    }
    std::fs::copy(src.join("tokenizer.json"), base.join("tokenizer.json")).unwrap();
    let mut doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(src.join("model.json")).unwrap()).unwrap();
    doc["programs"] = json!({"prepare": "prepare.loombc", "control": "control.loombc", "kernel": "kernel.loombc"});
    std::fs::write(base.join("model.json"), doc.to_string()).unwrap();
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "bc", "base": base.display().to_string()}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let embed = |model: &str, input: &serde_json::Value| {
        let r = s.post_json("/v1/embeddings", &json!({"model": model, "input": input}));
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["data"].clone()
    };
    for input in [
        json!(["bytecode and source agree", "a second sentence"]),
        json!([[3, 1, 4, 1, 5]]),
    ] {
        let (a, b) = (embed("bc", &input), embed("arith-embed", &input));
        assert_eq!(a, b, "the .loombc package computes what the .loom one does");
    }
}

/// A deployment file registers its models at start-up with their device preference lists; a list whose first
/// choices are absent falls back to the next present device, and the log says so.
#[test]
fn a_deployment_file_registers_with_device_fallback() {
    let dir = package_dir("deploy-file");
    let file = dir.join("deploy.json");
    std::fs::write(
        &file,
        json!({"models": [
            {"base": "arith-embed", "name": "dep", "device": ["vulkan:3", "cuda:0", "cpu"]},
            {"base": "arith-decision", "name": "dec", "device": "cpu:0", "options": {"max_choices": 4}}
        ]})
        .to_string(),
    )
    .unwrap();
    let file = file.display().to_string();
    let s = TestServer::start_models("deploy-file-run", &[], &["--deployment", &file]);
    s.healthy();
    let m = s.request("GET", "/v1/models/dep", b"").json();
    assert_eq!(m["status"], "ready", "{m}");
    assert_eq!(m["device"], "cpu:0", "{m}");
    let log = s.log();
    assert!(
        log.contains("vulkan:3, cuda:0 absent, using cpu:0"),
        "the fallback is logged:\n{log}"
    );
    // The deployment's options override reached the package (max_choices 4: a fifth choice is refused).
    let ask = |n: usize| {
        let choices: Vec<String> = (0..n).map(|i| format!("c{i}")).collect();
        s.post_json(
            "/v1/decisions",
            &json!({"model": "dec", "questions": {"q": {"type": "choice", "instructions": "pick", "choices": choices}}}),
        )
    };
    assert_eq!(ask(4).status, 200);
    assert_ne!(ask(5).status, 200);
    let _ = std::fs::remove_dir_all(&dir);
}
