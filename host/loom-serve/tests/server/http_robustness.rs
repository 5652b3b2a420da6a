//! Bad input gets a clear 4xx and the server stays healthy: malformed JSON, oversized bodies, invalid
//! model.json, uploaded programs with an endless loop or a huge allocation, paths escaping the base, a client
//! that disconnects mid-request.

use crate::support::{TestServer, multipart};
use serde_json::json;
use std::io::Write;

fn error_of(r: &crate::support::Response) -> String {
    r.json()["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn malformed_and_oversized_requests_are_4xx() {
    let s = TestServer::start("malformed", &["--body-limit", "65536"]);
    let r = s.request("POST", "/v1/embeddings", b"{\"model\": ");
    assert_eq!(r.status, 400);
    assert!(error_of(&r).contains("not valid JSON"), "{}", r.text());
    let r = s.post_json("/v1/embeddings", &json!({"input": "x"}));
    assert_eq!(r.status, 400);
    assert!(error_of(&r).contains("`model`"));
    let r = s.post_json("/v1/embeddings", &json!({"model": "nope", "input": "x"}));
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["code"], "model_not_found");
    let r = s.post_json(
        "/v1/embeddings",
        &json!({"model": "arith-embed", "input": ""}),
    );
    assert_eq!(r.status, 400);
    assert!(error_of(&r).contains("empty input"), "{}", r.text());
    let r = s.post_json(
        "/v1/embeddings",
        &json!({"model": "arith-embed", "input": [1, -1]}),
    );
    assert_eq!(r.status, 400);
    let r = s.post_json(
        "/v1/embeddings",
        &json!({"model": "arith-embed", "input": {"a": 1}}),
    );
    assert_eq!(r.status, 400);
    let big = "x".repeat(70_000);
    let r = s.post_json(
        "/v1/embeddings",
        &json!({"model": "arith-embed", "input": big}),
    );
    assert_eq!(r.status, 413, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "request_too_large");
    // 300 bytes: over max_tokens (256).
    let r = s.post_json(
        "/v1/embeddings",
        &json!({"model": "arith-embed", "input": "y".repeat(300)}),
    );
    assert_eq!(r.status, 400);
    // A failed request followed by successful ones.
    let r = s.post_json(
        "/v1/embeddings",
        &json!({"model": "arith-embed", "input": ["ok", ""]}),
    );
    assert_eq!(r.status, 400);
    for _ in 0..3 {
        let r = s.post_json(
            "/v1/embeddings",
            &json!({"model": "arith-embed", "input": ["ok", "fine"]}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert_eq!(s.request("GET", "/nope", b"").status, 404);
    s.healthy();
}

#[test]
fn invalid_packages_and_escaping_paths_are_rejected() {
    let s = TestServer::start("packages", &[]);
    let r = s.post_json("/v1/models", &json!({"base": "relative/dir"}));
    assert_eq!(r.status, 400);
    assert!(error_of(&r).contains("absolute"));
    let bad = s.dir.join("invalid");
    std::fs::create_dir_all(&bad).unwrap();
    for (doc, needle) in [
        (
            r#"{"contract": "retained-text", "role": "chat", "programs": {"prepare": "a", "control": "b"}}"#,
            "field `contract`",
        ),
        (
            r#"{"contract": "finite", "role": "chat", "programs": {"prepare": "a", "control": "b"}}"#,
            "field `role`",
        ),
        (
            r#"{"contract": "finite", "role": "embeddings", "programs": {"prepare": "a"}}"#,
            "control",
        ),
        (
            r#"{"contract": "finite", "role": "embeddings", "programs": {"prepare": "a", "control": "b"}, "fuel": {"run": 0}}"#,
            "fuel.run",
        ),
        (
            r#"{"contract": "finite", "role": "embeddings", "programs": {"prepare": "a", "control": "b"}, "device": "gpu!"}"#,
            "field `device`",
        ),
        (
            r#"{"contract": "finite", "role": "embeddings", "programs": {"prepare": "a", "control": "b"}, "bogus": 1}"#,
            "bogus",
        ),
        (r#"not json"#, "model.json"),
    ] {
        std::fs::write(bad.join("model.json"), doc).unwrap();
        let r = s.post_json(
            "/v1/models",
            &json!({"name": "invalid", "base": bad.display().to_string()}),
        );
        assert_eq!(r.status, 400, "{doc}: {}", r.text());
        assert!(error_of(&r).contains("model.json"), "{doc}: {}", r.text());
        assert!(
            error_of(&r).contains(needle),
            "{doc}: wanted {needle:?} in {}",
            r.text()
        );
    }
    // A device that is not present.
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "gpu", "base": s.dir.join("arith-embed").display().to_string(), "device": "cuda:0"}),
    );
    assert_eq!(r.status, 422, "{}", r.text());
    assert!(
        error_of(&r).contains("cuda:0") && error_of(&r).contains("cpu:0"),
        "{}",
        r.text()
    );
    s.healthy();
}

fn upload(
    s: &TestServer,
    name: &str,
    prepare: &str,
    extra: &[(&str, &[u8])],
) -> crate::support::Response {
    let doc = format!(
        r#"{{"name": "{name}", "contract": "finite", "role": "embeddings",
           "programs": {{"prepare": "prepare.loom", "control": "control.loom", "kernel": "kernel.loom"}},
           "fuel": {{"prepare": 1000000}}, "memory": {{"invocation_bytes": 16777216}}}}"#
    );
    let control = std::fs::read(s.dir.join("arith-embed/control.loom")).unwrap();
    let kernel = std::fs::read(s.dir.join("arith-embed/kernel.loom")).unwrap();
    let mut parts: Vec<(&str, Option<&str>, &[u8])> = vec![
        ("model.json", Some("model.json"), doc.as_bytes()),
        ("prepare", Some("prepare.loom"), prepare.as_bytes()),
        ("control", Some("control.loom"), &control),
        ("kernel", Some("kernel.loom"), &kernel),
    ];
    for (f, b) in extra {
        parts.push(("extra", Some(f), b));
    }
    let (ct, body) = multipart(&parts);
    s.try_request("POST", "/v1/models/upload", &[("Content-Type", &ct)], &body)
        .unwrap()
}

const EPILOGUE: &str = "    %st = opaque.new %x\n    return 1, 1, 1, 1, \"\", \"\", %st\n  }\n}\n";

const PRELUDE: &str = r#"module @evil.prepare {
  func.decl @prepare.stage(str, i64) -> i64 import("prepare")
  export func @prepare(%asset_root: str, %options: str) -> (i64, i64, i64, i64, str, str, !opaque) {"#;

#[test]
fn hostile_uploads_are_contained() {
    let s = TestServer::start("hostile", &[]);
    // An endless loop stops at the fuel budget.
    let spin = format!(
        "{PRELUDE}\n    %x = while iter(%i = 0 : i64) -> i64 {{\n      condition cmp.ge(%i, 0)\n    }} do {{\n      yield add.wrap(%i, 1)\n    }}\n{EPILOGUE}"
    );
    let r = upload(&s, "spin", &spin, &[]);
    assert_eq!(r.status, 422, "{}", r.text());
    assert!(error_of(&r).to_lowercase().contains("fuel"), "{}", r.text());
    // A huge allocation traps at the memory cap without allocating.
    let huge =
        format!("{PRELUDE}\n    %b = buffer.new 1099511627776\n    %x = buffer.len %b\n{EPILOGUE}");
    let r = upload(&s, "huge", &huge, &[]);
    assert_eq!(r.status, 422, "{}", r.text());
    assert!(
        error_of(&r).to_lowercase().contains("memory"),
        "{}",
        r.text()
    );
    // A file name escaping the upload namespace.
    let r = upload(&s, "escape", &spin, &[("../../etc/passwd", b"x")]);
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(error_of(&r).contains("escapes"), "{}", r.text());
    // A program reference escaping the upload.
    let doc = r#"{"name": "esc2", "contract": "finite", "role": "embeddings",
        "programs": {"prepare": "../arith-embed/prepare.loom", "control": "control.loom"}}"#;
    let (ct, body) = multipart(&[("model.json", Some("model.json"), doc.as_bytes())]);
    let r = s
        .try_request("POST", "/v1/models/upload", &[("Content-Type", &ct)], &body)
        .unwrap();
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(error_of(&r).contains("escapes"), "{}", r.text());
    // A checkpoint path escaping the package.
    let ckpt = format!(
        "module @evil.prepare {{\n  func.decl @prepare.source(str, str) -> i64 import(\"prepare\")\n  export func @prepare(%asset_root: str, %options: str) -> (i64, i64, i64, i64, str, str, !opaque) {{\n    %x = call @prepare.source(%asset_root, \"../../../etc/passwd\")\n{EPILOGUE}"
    );
    let r = upload(&s, "ckpt", &ckpt, &[]);
    assert!(r.status == 400 || r.status == 422, "{}", r.text());
    // Not Loom at all, and a capability the prepare role is not granted.
    let r = upload(&s, "junk", "this is not loom", &[]);
    assert_eq!(r.status, 400);
    assert!(error_of(&r).contains("prepare.loom"), "{}", r.text());
    let grant = "module @evil.prepare {\n  func.decl @runner.join(?!hal.fence) import(\"runner\")\n  export func @prepare(%asset_root: str, %options: str) -> (i64, i64, i64, i64, str, str, !opaque) {\n    call @runner.join(null)\n    %x = const.i64 1\n    %st = opaque.new %x\n    return 1, 1, 1, 1, \"\", \"\", %st\n  }\n}\n";
    let r = upload(&s, "grant", grant, &[]);
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(error_of(&r).contains("runner"), "{}", r.text());
    // Everything else keeps serving.
    let r = s.post_json(
        "/v1/embeddings",
        &json!({"model": "arith-embed", "input": "still here"}),
    );
    assert_eq!(r.status, 200);
    s.healthy();
}

#[test]
fn a_client_that_disconnects_does_not_disturb_others() {
    let s = TestServer::start("disconnect", &[]);
    let texts: Vec<String> = (0..200).map(|i| "z".repeat(1 + i % 250)).collect();
    let body = json!({"model": "arith-embed", "input": texts}).to_string();
    for _ in 0..5 {
        let mut c = std::net::TcpStream::connect(&s.addr).unwrap();
        write!(
            c,
            "POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        drop(c);
    }
    // The rows the cancelled requests used are reused by the next ones, with correct results.
    for _ in 0..3 {
        let r = s.post_json(
            "/v1/embeddings",
            &json!({"model": "arith-embed", "input": ["abc", "de"]}),
        );
        assert_eq!(r.status, 200);
        let v = r.json();
        let got = v["data"][1]["embedding"][0].as_f64().unwrap();
        let want = crate::http_embed::arith(&[100, 101], 64)[0];
        assert!((got - want).abs() < 1e-5);
    }
    s.healthy();
    let submitted = s.metric("loom_requests_total{model=\"arith-embed\"}");
    assert!(submitted >= 6.0, "{submitted}");
}

#[test]
fn cancellation_during_accepted_device_work_then_the_rows_are_reused() {
    let s = TestServer::start("cancel", &[]);
    let base = s.dir.join("slow-embed").display().to_string();
    let r = s.post_json("/v1/models", &json!({"base": base}));
    assert_eq!(r.status, 201, "{}", r.text());
    // Time one cohort of the slow stage (its spin kernel makes it last well over the disconnect delay).
    let t0 = std::time::Instant::now();
    let r = s.post_json(
        "/v1/embeddings",
        &json!({"model": "slow-embed", "input": "warm"}),
    );
    assert_eq!(r.status, 200);
    let cohort = t0.elapsed();
    assert!(
        cohort > std::time::Duration::from_millis(200),
        "the spin is too short: {cohort:?}"
    );
    eprintln!("one slow cohort: {cohort:?}");
    let cohorts_before = s.metric("loom_cohorts_total{model=\"slow-embed\"}");
    let members_before = s.metric("loom_cohort_members_total{model=\"slow-embed\"}");
    // A client sends 8 inputs and disconnects while their cohort executes.
    let body =
        json!({"model": "slow-embed", "input": ["a", "bb", "ccc", "dddd", "e", "f", "g", "h"]})
            .to_string();
    let mut c = std::net::TcpStream::connect(&s.addr).unwrap();
    write!(
        c,
        "POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    std::thread::sleep(cohort / 4);
    drop(c);
    // The next request reuses the rows after the accepted cohort is collected, with the right results.
    let v = s.post_json(
        "/v1/embeddings",
        &json!({"model": "slow-embed", "input": ["xy", "z"]}),
    );
    assert_eq!(v.status, 200, "{}", v.text());
    let v = v.json();
    let got: Vec<f64> = v["data"][0]["embedding"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    let want = crate::http_embed::arith(&[120, 121], 64);
    assert!(
        got.iter()
            .zip(&want)
            .all(|(g, w)| (g - w).abs() <= 1e-5 * w.abs().max(1.0))
    );
    // Of the 8 cancelled inputs, those already accepted into the executing cohort ran to completion and were
    // collected (at least the first: the scheduler never waits for more), and those still waiting were dropped
    // without running; together they are all 8.
    let cancelled_waiting = s.metric("loom_cancelled_waiting_total{model=\"slow-embed\"}");
    let ran = s.metric("loom_cohort_members_total{model=\"slow-embed\"}") - members_before - 2.0;
    assert!(ran >= 1.0, "{ran}");
    assert_eq!(
        ran + cancelled_waiting,
        8.0,
        "ran {ran}, dropped while waiting {cancelled_waiting}"
    );
    assert!(s.metric("loom_cohorts_total{model=\"slow-embed\"}") >= cohorts_before + 2.0);
    s.healthy();
}
