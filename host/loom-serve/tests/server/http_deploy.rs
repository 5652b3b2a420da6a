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

/// Compatibility tags through the server: `prepare_request`'s third result keeps requests of different tags out
/// of one cohort. Two copies of a slow package differ only in that result (0 for every request, or the input's
/// kind: 0 text, 1 token ids); while a first request keeps the device busy, six text and six token-id requests
/// queue. Untagged, they share one cohort; tagged, no cohort mixes them (largest cohort at most 7). Results are the arithmetic embedding
/// either way.
#[test]
fn compatibility_tags_keep_cohorts_apart() {
    let s = TestServer::start("deploy-tags", &[]);
    let make = |name: &str, tagged: bool| {
        let base = s.dir.join(name);
        std::fs::create_dir_all(&base).unwrap();
        let ctl = std::fs::read_to_string(s.dir.join("arith-embed/control.loom")).unwrap();
        assert!(
            ctl.contains("return %out, %n, 0"),
            "the fixture's prepare_request result"
        );
        let ctl = if tagged {
            ctl.replace("return %out, %n, 0", "return %out, %n, conv.i64(%kind)")
        } else {
            ctl
        };
        std::fs::write(base.join("control.loom"), ctl).unwrap();
        // slow-embed's kernel: each request spins long enough (hundreds of ms) for the others to queue.
        std::fs::copy(
            s.dir.join("slow-embed/kernel.loom"),
            base.join("kernel.loom"),
        )
        .unwrap();
        let doc = json!({
            "contract": "finite", "role": "embeddings",
            "programs": {"prepare": "../arith-embed/prepare.loom", "control": "control.loom", "kernel": "kernel.loom"},
            "definition": {"sources": ["../arith-embed/kernel.loom"]},
            "options": {"stage": "slow.kernel.embed", "max_tokens": 64, "batch_units": 4096}
        });
        std::fs::write(base.join("model.json"), doc.to_string()).unwrap();
        let r = s.post_json(
            "/v1/models",
            &json!({"name": name, "base": base.display().to_string()}),
        );
        assert_eq!(r.status, 201, "{}", r.text());
    };
    make("untagged", false);
    make("tagged", true);
    let burst = |model: &str| -> f64 {
        std::thread::scope(|sc| {
            let send = |input: serde_json::Value| {
                let s = &s;
                let model = model.to_string();
                sc.spawn(move || {
                    s.post_json("/v1/embeddings", &json!({"model": model, "input": input}))
                })
            };
            let blocker = send(json!("keeps the device busy"));
            std::thread::sleep(std::time::Duration::from_millis(150));
            let mut waiting = Vec::new();
            for i in 0..6i64 {
                // Text is embedded as its bytes (the package has no tokenizer): "hi0" is [104, 105, 48].
                waiting.push((vec![104i64, 105, 48 + i], send(json!(format!("hi{i}")))));
                waiting.push((vec![7, i, 9], send(json!([[7, i, 9]]))));
            }
            assert_eq!(blocker.join().unwrap().status, 200);
            for (values, h) in waiting {
                let r = h.join().unwrap();
                assert_eq!(r.status, 200, "{}", r.text());
                let got = r.json()["data"][0]["embedding"][5].as_f64().unwrap();
                let want = crate::http_embed::arith(&values, 64)[5];
                assert!(
                    (got - want).abs() < 1e-5 * want.abs().max(1.0),
                    "{got} vs {want}"
                );
            }
        });
        s.metric(&format!("loom_cohort_max_members{{model=\"{model}\"}}"))
    };
    assert!(burst("untagged") > 6.0, "untagged requests share a cohort");
    assert!(
        burst("tagged") <= 6.0,
        "no cohort mixes text and token-id requests"
    );
}
