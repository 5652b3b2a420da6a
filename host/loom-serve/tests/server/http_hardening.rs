//! What a hostile client and a first-time package author hit, through the real binary: admin and inference
//! keys, idle connections closed, upload rules (duplicates, files the server would never read), bounded
//! registration fields, a re-registration that would change a model's role, and errors a client can act on
//! (which input failed, 413 for an over-long input, 4xx for an absent device).

use crate::support::{Response, TestServer, multipart};
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::time::{Duration, Instant};

fn error_of(r: &Response) -> String {
    r.json()["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn code_of(r: &Response) -> String {
    r.json()["error"]["code"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn with_key(s: &TestServer, method: &str, path: &str, key: Option<&str>, body: &Value) -> Response {
    let auth = key.map(|k| format!("Bearer {k}"));
    let headers: Vec<(&str, &str)> = auth
        .as_deref()
        .map(|a| vec![("Authorization", a)])
        .unwrap_or_default();
    let body = if body.is_null() {
        Vec::new()
    } else {
        body.to_string().into_bytes()
    };
    s.try_request(method, path, &headers, &body)
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

#[test]
fn inference_keys_cannot_change_the_served_models() {
    let s = TestServer::start("scopes", &["--api-key", "infer", "--admin-key", "admin"]);
    let base = s.dir.join("arith-decision").display().to_string();
    let embed = json!({"model": "arith-embed", "input": "hi"});

    // No key, or a wrong one: 401 with a Bearer challenge; /health stays open.
    assert_eq!(s.request("GET", "/health", b"").status, 200);
    for key in [None, Some("wrong")] {
        let r = with_key(&s, "GET", "/v1/models", key, &Value::Null);
        assert_eq!(r.status, 401, "{}", r.text());
        assert_eq!(code_of(&r), "invalid_api_key");
        assert_eq!(
            r.header("www-authenticate"),
            Some("Bearer realm=\"loom-serve\""),
            "{:?}",
            r.headers
        );
    }

    // An inference key: inference and reads.
    let infer = Some("infer");
    assert_eq!(
        with_key(&s, "POST", "/v1/embeddings", infer, &embed).status,
        200
    );
    for path in ["/v1/models", "/v1/models/arith-embed", "/metrics"] {
        let r = with_key(&s, "GET", path, infer, &Value::Null);
        assert_eq!(r.status, 200, "{path}: {}", r.text());
    }
    // ... and none of the lifecycle changes: 403, the model untouched.
    for (method, path, body) in [
        (
            "POST",
            "/v1/models",
            json!({"name": "other", "base": base.clone()}),
        ),
        ("DELETE", "/v1/models/arith-embed", Value::Null),
        ("POST", "/v1/models/arith-embed/deactivate", Value::Null),
        ("POST", "/v1/models/arith-embed/activate", Value::Null),
    ] {
        let r = with_key(&s, method, path, infer, &body);
        assert_eq!(r.status, 403, "{method} {path}: {}", r.text());
        assert_eq!(code_of(&r), "insufficient_scope");
        assert!(error_of(&r).contains("admin key"), "{}", r.text());
        let challenge = r.header("www-authenticate").unwrap_or_default();
        assert!(
            challenge.starts_with("Bearer realm=\"loom-serve\"")
                && challenge.contains("error=\"insufficient_scope\""),
            "{challenge}"
        );
    }
    let (ct, body) = multipart(&[("model.json", Some("model.json"), b"{}")]);
    let r = s
        .try_request(
            "POST",
            "/v1/models/upload",
            &[("Content-Type", &ct), ("Authorization", "Bearer infer")],
            &body,
        )
        .unwrap();
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(
        with_key(&s, "POST", "/v1/embeddings", infer, &embed).status,
        200
    );

    // An admin key may do everything.
    let admin = Some("admin");
    let r = with_key(
        &s,
        "POST",
        "/v1/models",
        admin,
        &json!({"name": "other", "base": base}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let r = with_key(&s, "DELETE", "/v1/models/other", admin, &Value::Null);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        with_key(&s, "POST", "/v1/embeddings", admin, &embed).status,
        200
    );
    s.healthy();
}

#[test]
fn admin_keys_alone_guard_every_route() {
    let s = TestServer::start("admin-only", &["--admin-key", "admin"]);
    let embed = json!({"model": "arith-embed", "input": "hi"});
    let r = with_key(&s, "POST", "/v1/embeddings", None, &embed);
    assert_eq!(r.status, 401);
    assert_eq!(
        r.header("www-authenticate"),
        Some("Bearer realm=\"loom-serve\"")
    );
    assert_eq!(
        with_key(&s, "POST", "/v1/embeddings", Some("admin"), &embed).status,
        200
    );
    let r = with_key(
        &s,
        "POST",
        "/v1/models/arith-embed/deactivate",
        Some("admin"),
        &Value::Null,
    );
    assert_eq!(r.status, 200, "{}", r.text());
}

/// Reads until the server closes the connection (Ok with the bytes and how long it took) or `limit` passes.
fn read_until_closed(c: &mut std::net::TcpStream, limit: Duration) -> Result<Duration, String> {
    let t0 = Instant::now();
    c.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match c.read(&mut buf) {
            Ok(0) => return Ok(t0.elapsed()),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(t0.elapsed()),
            Err(e) => return Err(format!("still open after {:?}: {e}", t0.elapsed())),
        }
        if t0.elapsed() > limit {
            return Err(format!("still open after {:?}", t0.elapsed()));
        }
    }
}

#[test]
fn idle_connections_are_closed() {
    let s = TestServer::start("idle", &["--idle-timeout", "1"]);
    // Half a request line, then nothing.
    let mut slow = std::net::TcpStream::connect(&s.addr).unwrap();
    slow.write_all(b"GET /health HTTP/1.1\r\n").unwrap();
    let took = read_until_closed(&mut slow, Duration::from_secs(10)).unwrap();
    assert!(took < Duration::from_secs(5), "{took:?}");
    // A keep-alive connection that goes quiet after its first response.
    let mut idle = std::net::TcpStream::connect(&s.addr).unwrap();
    write!(idle, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let took = read_until_closed(&mut idle, Duration::from_secs(10)).unwrap();
    assert!(took < Duration::from_secs(5), "{took:?}");
    // Requests still run as before (a registration compiles, which may take longer than the timeout).
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "slow", "base": s.dir.join("slow-embed").display().to_string()}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    s.healthy();
}

fn upload_parts(s: &TestServer, parts: &[(&str, Option<&str>, &[u8])]) -> Response {
    let (ct, body) = multipart(parts);
    s.try_request("POST", "/v1/models/upload", &[("Content-Type", &ct)], &body)
        .unwrap()
}

#[test]
fn uploads_refuse_duplicates_and_files_the_server_would_ignore() {
    let s = TestServer::start("upload-rules", &[]);
    let read = |f: &str| std::fs::read(s.dir.join("arith-embed").join(f)).unwrap();
    let (prepare, control, kernel, tok) = (
        read("prepare.loom"),
        read("control.loom"),
        read("kernel.loom"),
        read("tokenizer.json"),
    );
    let doc = br#"{"name": "up", "contract": "finite", "role": "embeddings",
        "programs": {"prepare": "prepare.loom", "control": "control.loom", "kernel": "kernel.loom"},
        "assets": {"tokenizer": "tokenizer.json"}}"#;
    let other = br#"{"name": "up", "contract": "finite", "role": "embeddings",
        "programs": {"prepare": "prepare.loom", "control": "control.loom", "kernel": "kernel.loom"},
        "assets": {"tokenizer": "./tokenizer.json"}, "options": {"max_tokens": 8}}"#;
    let base: Vec<(&str, Option<&str>, &[u8])> = vec![
        ("model.json", Some("model.json"), doc),
        ("p", Some("prepare.loom"), &prepare),
        ("c", Some("control.loom"), &control),
        ("k", Some("kernel.loom"), &kernel),
        ("t", Some("tokenizer.json"), &tok),
    ];
    let with = |extra: &[(&'static str, Option<&'static str>, &'static [u8])]| {
        let mut p = base.clone();
        p.extend_from_slice(extra);
        p
    };
    // A second model.json (another name for the same path, too): refused, naming it.
    for dup in ["model.json", "./model.json"] {
        let mut parts = base.clone();
        parts.push(("again", Some(dup), other));
        let r = upload_parts(&s, &parts);
        assert_eq!(r.status, 400, "{dup}: {}", r.text());
        assert!(
            error_of(&r).contains("two file parts for `model.json`"),
            "{}",
            r.text()
        );
    }
    // A second program.
    let r = upload_parts(&s, &with(&[("p2", Some("prepare.loom"), b"module @x {}")]));
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(error_of(&r).contains("`prepare.loom`"), "{}", r.text());
    // A checkpoint sent along, and a stray file: the server would never read them.
    for (f, bytes) in [
        ("weights.safetensors", &b"\x08\0\0\0\0\0\0\0{}      "[..]),
        ("notes/readme.txt", b"hello"),
    ] {
        let r = upload_parts(&s, &with(&[("w", Some(f), bytes)]));
        assert_eq!(r.status, 400, "{f}: {}", r.text());
        assert!(error_of(&r).contains(&format!("`{f}`")), "{}", r.text());
        assert!(
            error_of(&r).contains("parts named `parameters`"),
            "{}",
            r.text()
        );
    }
    // A text field the server does not know, and one sent twice.
    let r = upload_parts(&s, &with(&[("devices", None, b"cpu")]));
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(error_of(&r).contains("`devices`"), "{}", r.text());
    let r = upload_parts(&s, &with(&[("name", None, b"a"), ("name", None, b"b")]));
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(error_of(&r).contains("two `name` fields"), "{}", r.text());
    // Nothing was registered; the package on its own uploads fine.
    assert_eq!(s.request("GET", "/v1/models/up", b"").status, 404);
    let r = upload_parts(&s, &base);
    assert_eq!(r.status, 201, "{}", r.text());
    let r = s.post_json("/v1/embeddings", &json!({"model": "up", "input": "hi"}));
    assert_eq!(r.status, 200, "{}", r.text());
    s.healthy();
}

#[test]
fn registration_options_and_devices_are_bounded() {
    let s = TestServer::start("bounded", &["--body-limit", "4194304"]);
    let base = s.dir.join("arith-embed").display().to_string();
    let big = json!({"pad": "x".repeat(100_000)});
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "big", "base": base, "options": big}),
    );
    assert_eq!(r.status, 413, "{}", r.text());
    assert_eq!(code_of(&r), "field_too_large");
    assert!(
        error_of(&r).contains("`options`") && error_of(&r).contains("65536"),
        "{}",
        r.text()
    );
    let devices: Vec<String> = (0..17).map(|i| format!("cpu:{i}")).collect();
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "big", "base": base, "device": devices}),
    );
    assert_eq!(r.status, 413, "{}", r.text());
    assert!(
        error_of(&r).contains("`device`") && error_of(&r).contains("16"),
        "{}",
        r.text()
    );
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "big", "base": base, "device": "c".repeat(1000)}),
    );
    assert_eq!(r.status, 413, "{}", r.text());
    // The multipart upload's `options` field is bounded the same way.
    let (ct, body) = multipart(&[
        ("model.json", Some("model.json"), b"{}"),
        ("options", None, big.to_string().as_bytes()),
    ]);
    let r = s
        .try_request("POST", "/v1/models/upload", &[("Content-Type", &ct)], &body)
        .unwrap();
    assert_eq!(r.status, 413, "{}", r.text());
    assert!(error_of(&r).contains("`options`"), "{}", r.text());
    assert_eq!(s.request("GET", "/v1/models/big", b"").status, 404);
    // Small options still work.
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "small", "base": base, "options": {"max_tokens": 128}}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    s.healthy();
}

#[test]
fn reregistration_that_changes_the_role_needs_replace() {
    let s = TestServer::start("role-change", &[]);
    let dir = |p: &str| s.dir.join(p).display().to_string();
    // A decisions package under the name of an embeddings model: 409, the embeddings model keeps serving.
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "arith-embed", "base": dir("arith-decision")}),
    );
    assert_eq!(r.status, 409, "{}", r.text());
    assert_eq!(code_of(&r), "role_changed");
    assert!(
        error_of(&r).contains("embeddings")
            && error_of(&r).contains("decisions")
            && error_of(&r).contains("replace"),
        "{}",
        r.text()
    );
    let r = s.post_json(
        "/v1/embeddings",
        &json!({"model": "arith-embed", "input": "hi"}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let m = s.request("GET", "/v1/models/arith-embed", b"").json();
    assert_eq!(m["role"], "embeddings");
    assert_eq!(m["status"], "ready");
    // The same role: replaced as before.
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "arith-embed", "base": dir("arith-embed-weighted")}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    // `replace: true` says so: now it serves decisions.
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "arith-embed", "base": dir("arith-decision"), "replace": true}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(r.json()["role"], "decisions");
    let r = s.post_json(
        "/v1/embeddings",
        &json!({"model": "arith-embed", "input": "hi"}),
    );
    assert_eq!(r.status, 501, "{}", r.text());
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "arith-embed", "base": dir("arith-embed"), "replace": "yes"}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    s.healthy();
}

#[test]
fn batch_errors_name_the_input_that_failed() {
    let s = TestServer::start("batch-errors", &[]);
    let r = s.post_json(
        "/v1/embeddings",
        &json!({"model": "arith-embed", "input": ["ok", "fine", "", "good"]}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        error_of(&r).starts_with("input 2: ") && error_of(&r).contains("empty input"),
        "{}",
        r.text()
    );
    // Token ids too long for the model (max_tokens 256) in the second input.
    let long: Vec<i64> = vec![1; 300];
    let r = s.post_json(
        "/v1/embeddings",
        &json!({"model": "arith-embed", "input": [[1, 2], long]}),
    );
    assert!(r.status >= 400 && r.status < 500, "{}", r.text());
    assert!(error_of(&r).starts_with("input 1: "), "{}", r.text());
    // Decisions name the question (max_choices is 8).
    let nine: Vec<String> = (0..9).map(|i| format!("c{i}")).collect();
    let r = s.post_json(
        "/v1/decisions",
        &json!({"model": "arith-decision", "questions": {
            "fine": {"type": "choice", "instructions": "pick", "choices": ["a", "b"]},
            "too-many": {"type": "choice", "instructions": "pick", "choices": nine},
        }}),
    );
    assert!(r.status >= 400 && r.status < 500, "{}", r.text());
    assert!(
        error_of(&r).starts_with("question `too-many`: "),
        "{}",
        r.text()
    );
    // One input: no prefix.
    let r = s.post_json(
        "/v1/embeddings",
        &json!({"model": "arith-embed", "input": ""}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(!error_of(&r).starts_with("input"), "{}", r.text());
    s.healthy();
}

#[test]
fn profile_batch_errors_name_the_input_that_failed() {
    let dir = crate::profiles::plugins_dir_tagged("batch-errors");
    let dir_arg = dir.display().to_string();
    let s = TestServer::start("profile-batch-errors", &["--plugins", &dir_arg]);
    let r = s.post_json(
        "/embed",
        &json!({"model": "arith-embed", "inputs": ["ok", ""], "normalize": false}),
    );
    assert!(r.status >= 400 && r.status < 500, "{}", r.text());
    assert!(error_of(&r).starts_with("input 1: "), "{}", r.text());
    let _ = std::fs::remove_dir_all(dir);
}

/// A copy of the test's `package` with `capacities.max_request_bytes` set, registered as `name`.
fn register_with_max_request_bytes(s: &TestServer, package: &str, name: &str, max: usize) {
    let from = s.dir.join(package).join("model.json");
    let mut doc: Value = serde_json::from_slice(&std::fs::read(&from).unwrap()).unwrap();
    doc["capacities"]["max_request_bytes"] = json!(max);
    doc["name"] = json!(name);
    std::fs::write(&from, doc.to_string()).unwrap();
    let r = s.post_json(
        "/v1/models",
        &json!({"base": s.dir.join(package).display().to_string()}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
}

#[test]
fn an_input_over_the_model_limit_is_413_with_its_own_size() {
    let s = TestServer::start("too-large", &[]);
    register_with_max_request_bytes(&s, "arith-embed", "small-embed", 64);
    // 60 bytes of text: a 68-byte record, over 64.
    let r = s.post_json(
        "/v1/embeddings",
        &json!({"model": "small-embed", "input": ["ok", "x".repeat(60)]}),
    );
    assert_eq!(r.status, 413, "{}", r.text());
    assert_eq!(code_of(&r), "input_too_large");
    let m = error_of(&r);
    assert!(
        m.starts_with("input 1: ") && m.contains("is 60 bytes") && m.contains("at most 56 bytes"),
        "{m}"
    );
    // 56 bytes fit.
    let r = s.post_json(
        "/v1/embeddings",
        &json!({"model": "small-embed", "input": "x".repeat(56)}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    s.healthy();
}

#[test]
fn an_absent_device_is_a_client_error_naming_the_devices() {
    let s = TestServer::start("absent-device", &[]);
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "gpu", "base": s.dir.join("arith-embed").display().to_string(),
                "device": ["cuda:0", "vulkan:3"]}),
    );
    assert_eq!(r.status, 422, "{}", r.text());
    assert_eq!(code_of(&r), "device_not_present");
    let m = error_of(&r);
    assert!(
        m.contains("cuda:0") && m.contains("vulkan:3") && m.contains("cpu:0"),
        "{m}"
    );
    s.healthy();
}
