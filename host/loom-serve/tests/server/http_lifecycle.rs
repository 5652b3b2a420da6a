//! Model lifecycle: list, unregister (device memory released), re-register, failed preparations that leave the
//! rest serving, multipart upload, API keys, graceful shutdown.

use crate::http_embed::arith;
use crate::support::{TestServer, multipart};
use serde_json::json;
use std::os::unix::fs::OpenOptionsExt;

fn embed_status(s: &TestServer, model: &str) -> u16 {
    s.post_json("/v1/embeddings", &json!({"model": model, "input": "ping"}))
        .status
}

#[test]
fn unregister_releases_memory_and_reregister_serves_again() {
    let s = TestServer::start("lifecycle", &[]);
    let list = s.request("GET", "/v1/models", b"").json();
    let names: Vec<&str> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["arith-decision", "arith-embed", "arith-embed-weighted"]
    );
    assert_eq!(list["data"][2]["status"], "ready");
    assert_eq!(list["data"][2]["device"], "cpu:0");
    assert_eq!(
        list["data"][2]["device_bytes"], 8320,
        "the head's parameters"
    );

    let before = s.metric("loom_device_allocated_bytes{device=\"cpu:0\"}");
    assert!(before >= 8320.0);
    let r = s.request("DELETE", "/v1/models/arith-embed-weighted", b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(embed_status(&s, "arith-embed-weighted"), 404);
    let after = s.metric("loom_device_allocated_bytes{device=\"cpu:0\"}");
    assert_eq!(before - after, 8320.0, "unregistering frees the parameters");
    assert_eq!(
        s.request("DELETE", "/v1/models/arith-embed-weighted", b"")
            .status,
        404
    );

    let base = s.dir.join("arith-embed-weighted");
    let r = s.post_json("/v1/models", &json!({"base": base.display().to_string()}));
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(r.json()["status"], "ready");
    // Before any request (a request leaves its idle command workspace in the model's pool).
    assert_eq!(
        s.metric("loom_device_allocated_bytes{device=\"cpu:0\"}"),
        before
    );
    assert_eq!(embed_status(&s, "arith-embed-weighted"), 200);
    // Registering under another name with other options (a different geometry) works beside it.
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "small", "base": s.dir.join("arith-embed").display().to_string(),
                "options": {"max_tokens": 8, "dims": 4, "batch_units": 64}}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let v = s
        .post_json("/v1/embeddings", &json!({"model": "small", "input": "abc"}))
        .json();
    let got: Vec<f64> = v["data"][0]["embedding"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    let want = arith(&[97, 98, 99], 4);
    assert!(
        got.iter().zip(&want).all(|(g, w)| (g - w).abs() < 1e-5),
        "{got:?}"
    );
    let r = s.post_json(
        "/v1/embeddings",
        &json!({"model": "small", "input": "123456789"}),
    );
    assert_eq!(r.status, 400, "longer than max_tokens: {}", r.text());
    assert!(r.text().contains("max_tokens"), "{}", r.text());
}

#[test]
fn a_missing_checkpoint_fails_preparation_while_others_keep_serving() {
    let s = TestServer::start("missing", &[]);
    let base = s.dir.join("arith-embed-weighted");
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "broken", "base": base.display().to_string(),
                "options": {"checkpoint": "missing.safetensors"}}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(msg.contains("missing.safetensors"), "{msg}");
    assert_eq!(r.json()["error"]["code"], "invalid_checkpoint");
    let m = s.request("GET", "/v1/models/broken", b"").json();
    assert_eq!(m["status"], "failed");
    assert_eq!(m["device_bytes"], 0);
    assert_eq!(embed_status(&s, "broken"), 503);
    assert_eq!(embed_status(&s, "arith-embed"), 200);
    assert_eq!(embed_status(&s, "arith-embed-weighted"), 200);

    // A failed re-registration keeps the old version serving.
    let bad = s.dir.join("bad-embed");
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::write(
        bad.join("model.json"),
        r#"{"contract": "finite", "role": "embeddings", "programs": {"prepare": "nope.loom", "control": "nope.loom"}}"#,
    )
    .unwrap();
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "arith-embed", "base": bad.display().to_string()}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("programs.prepare"), "{}", r.text());
    assert_eq!(embed_status(&s, "arith-embed"), 200);
    let m = s.request("GET", "/v1/models/arith-embed", b"").json();
    assert_eq!(m["status"], "ready");
    assert!(m["error"].as_str().unwrap().contains("nope.loom"));
    // A wrong checkpoint shape is caught against the index before activation.
    let wrong = s.dir.join("wrong");
    std::fs::create_dir_all(&wrong).unwrap();
    let mut st = b"".to_vec();
    let h = br#"{"head.weight":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"head.bias":{"dtype":"F32","shape":[32],"data_offsets":[16,144]}}"#;
    st.extend_from_slice(&(h.len() as u64).to_le_bytes());
    st.extend_from_slice(h);
    st.extend_from_slice(&[0u8; 144]);
    std::fs::write(base.join("wrong.safetensors"), st).unwrap();
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "wrong", "base": base.display().to_string(), "options": {"checkpoint": "wrong.safetensors"}}),
    );
    assert_eq!(r.status, 400);
    assert!(r.text().contains("F32[2, 2]"), "{}", r.text());
    s.healthy();
}

fn read(s: &TestServer, rel: &str) -> Vec<u8> {
    std::fs::read(s.dir.join(rel)).unwrap()
}

#[test]
fn multipart_upload_with_parameters_under_the_operator_root() {
    let root = crate::support::package_dir("params-root");
    let root_arg = root.join("arith-embed-weighted").display().to_string();
    let s = TestServer::start("upload", &["--params-root", &root_arg]);
    let doc = r#"{"name": "uploaded", "contract": "finite", "role": "embeddings",
        "programs": {"prepare": "prepare.loom", "control": "control.loom", "kernel": "kernel.loom"},
        "definition": {"sources": ["embed.loom", "gemm.loom"]},
        "options": {"checkpoint": "weights.safetensors"}}"#;
    let (ct, body) = multipart(&[
        ("model.json", Some("model.json"), doc.as_bytes()),
        (
            "p",
            Some("prepare.loom"),
            &read(&s, "arith-embed-weighted/prepare.loom"),
        ),
        (
            "c",
            Some("control.loom"),
            &read(&s, "arith-embed/control.loom"),
        ),
        (
            "k",
            Some("kernel.loom"),
            &read(&s, "arith-embed-weighted/kernel.loom"),
        ),
        (
            "e",
            Some("embed.loom"),
            &read(&s, "arith-embed/kernel.loom"),
        ),
        ("g", Some("gemm.loom"), &read(&s, "motifs/gemm.loom")),
    ]);
    let r = s
        .try_request("POST", "/v1/models/upload", &[("Content-Type", &ct)], &body)
        .unwrap();
    assert_eq!(r.status, 201, "{}", r.text());
    let v = s
        .post_json(
            "/v1/embeddings",
            &json!({"model": "uploaded", "input": "hi"}),
        )
        .json();
    let want = crate::http_embed::weighted(&[104, 105]);
    let got = v["data"][0]["embedding"].as_array().unwrap();
    for (g, w) in got.iter().zip(&want) {
        assert!((g.as_f64().unwrap() - w).abs() <= 1e-5 * w.abs().max(1.0));
    }
    let _ = std::fs::remove_dir_all(root);
}

/// A server-local package reads its checkpoint from a directory inside the operator's `--params-root`
/// (`prepare.source(dir, path)` with `dir` not the package: weights on a shared volume). A directory outside the
/// parameter root, a relative one, a path escaping it, or no `--params-root` at all fail the registration with a
/// 400 naming the directory; the served embeddings are the checkpoint's.
#[test]
fn checkpoints_from_a_directory_inside_the_parameter_root() {
    let dir = crate::support::package_dir("shared-params");
    let shared = dir.join("volume/arith");
    std::fs::create_dir_all(&shared).unwrap();
    std::fs::rename(
        dir.join("arith-embed-weighted/weights.safetensors"),
        shared.join("head.safetensors"),
    )
    .unwrap();
    let volume = dir.join("volume").display().to_string();
    let base = dir.join("arith-embed-weighted").display().to_string();
    let roots = dir.display().to_string();
    let s = TestServer::start_models(
        "shared-params-run",
        &[],
        &["--params-root", &volume, "--package-root", &roots],
    );
    let register = |name: &str, options: serde_json::Value| {
        s.post_json(
            "/v1/models",
            &json!({"name": name, "base": base, "options": options}),
        )
    };
    let r = register(
        "shared",
        json!({"checkpoint_dir": shared.display().to_string(), "checkpoint": "head.safetensors"}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let v = s
        .post_json("/v1/embeddings", &json!({"model": "shared", "input": "hi"}))
        .json();
    let want = crate::http_embed::weighted(&[104, 105]);
    let got = v["data"][0]["embedding"].as_array().unwrap();
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        assert!((g.as_f64().unwrap() - w).abs() <= 1e-5 * w.abs().max(1.0));
    }
    // The package's own directory no longer has the file.
    let r = register("local", json!({}));
    assert_eq!(r.status, 400, "{}", r.text());
    for (options, want) in [
        (
            json!({"checkpoint_dir": dir.join("arith-embed").display().to_string(), "checkpoint": "control.loom"}),
            "resolves outside the server's --params-root",
        ),
        (
            json!({"checkpoint_dir": "volume/arith", "checkpoint": "head.safetensors"}),
            "must be the asset root given to prepare or an absolute directory inside the server's --params-root",
        ),
        (
            json!({"checkpoint_dir": shared.display().to_string(), "checkpoint": "../../arith-embed-weighted/gen_weights.py"}),
            "escapes the package base",
        ),
    ] {
        let r = register("bad", options.clone());
        assert_eq!(r.status, 400, "{options}: {}", r.text());
        let e = r.json();
        assert_eq!(e["error"]["code"], "invalid_checkpoint", "{e}");
        let msg = e["error"]["message"].as_str().unwrap();
        assert!(msg.contains(want), "{options}: {msg}");
    }
    drop(s);
    // Without --params-root, only the asset root.
    let s = TestServer::start_models("shared-params-none", &[], &["--package-root", &roots]);
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "shared", "base": base,
                "options": {"checkpoint_dir": shared.display().to_string(), "checkpoint": "head.safetensors"}}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        r.text().contains("this server has no --params-root"),
        "{}",
        r.text()
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// `"io": {"direct": true}` reads resident parameters through direct I/O when they are placed (preparation and
/// every activation): the checkpoint's tensors start at unaligned offsets, so the aligned staging must cut them
/// out exactly; the embeddings are the checkpoint's before and after a deactivation. On a file system that refuses
/// O_DIRECT (tmpfs) the registration fails naming the file instead of reading through the page cache.
#[test]
fn direct_io_places_resident_parameters() {
    let dir = crate::support::package_dir("direct-activate");
    let base = dir.join("arith-embed-weighted");
    let mut doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(base.join("model.json")).unwrap()).unwrap();
    doc["io"] = json!({"direct": true});
    std::fs::write(base.join("model.json"), doc.to_string()).unwrap();
    let roots = dir.display().to_string();
    let mut extra = vec!["--package-root".to_string(), roots];
    // A tmpfs directory for the refusal, when this machine has one.
    let shm = std::path::Path::new("/dev/shm").join(format!("loom-direct-{}", std::process::id()));
    let tmpfs = std::fs::create_dir_all(&shm).is_ok()
        && std::fs::copy(base.join("weights.safetensors"), shm.join("w.safetensors")).is_ok()
        && std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc_o_direct())
            .open(shm.join("w.safetensors"))
            .is_err();
    if tmpfs {
        extra.extend(["--params-root".to_string(), shm.display().to_string()]);
    }
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let s = TestServer::start_models("direct-activate-run", &[], &extra);
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "direct", "base": base.display().to_string()}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let check = || {
        let v = s
            .post_json(
                "/v1/embeddings",
                &json!({"model": "direct", "input": "direct"}),
            )
            .json();
        let want = crate::http_embed::weighted(&b"direct".map(i64::from));
        let got = v["data"][0]["embedding"].as_array().unwrap();
        assert_eq!(got.len(), want.len(), "{v}");
        for (g, w) in got.iter().zip(&want) {
            assert!((g.as_f64().unwrap() - w).abs() <= 1e-5 * w.abs().max(1.0));
        }
    };
    check();
    for step in ["deactivate", "activate"] {
        let r = s.post_json(&format!("/v1/models/direct/{step}"), &json!({}));
        assert_eq!(r.status, 200, "{step}: {}", r.text());
    }
    check();
    if tmpfs {
        let r = s.post_json(
            "/v1/models",
            &json!({"name": "direct-shm", "base": base.display().to_string(),
                    "options": {"checkpoint_dir": shm.display().to_string(), "checkpoint": "w.safetensors"}}),
        );
        assert_eq!(r.status, 400, "{}", r.text());
        assert!(r.text().contains("refuses direct I/O"), "{}", r.text());
    } else {
        eprintln!("SKIPPED the tmpfs refusal: no /dev/shm that refuses O_DIRECT on this machine");
    }
    let _ = std::fs::remove_dir_all(&shm);
    let _ = std::fs::remove_dir_all(dir);
}

/// O_DIRECT on Linux (the tests do not depend on libc).
fn libc_o_direct() -> i32 {
    if cfg!(any(target_arch = "aarch64", target_arch = "arm")) {
        0o200000
    } else {
        0o40000
    }
}

/// gen_weights.py's head scaled by `k` (weights and bias), written independently here.
fn scaled_head(k: f32) -> Vec<u8> {
    let mut data = Vec::new();
    for d in 0..64 {
        for o in 0..32 {
            data.extend_from_slice(
                &(k * ((((d * 7 + o * 3) % 17) as f32) - 8.0) / 16.0).to_le_bytes(),
            );
        }
    }
    for o in 0..32 {
        data.extend_from_slice(&(k * (((o % 5) as f32) - 2.0) / 8.0).to_le_bytes());
    }
    let h = br#"{"head.weight":{"dtype":"F32","shape":[64,32],"data_offsets":[0,8192]},"head.bias":{"dtype":"F32","shape":[32],"data_offsets":[8192,8320]}}"#;
    let mut f = (h.len() as u64).to_le_bytes().to_vec();
    f.extend_from_slice(h);
    f.extend_from_slice(&data);
    f
}

/// The weighted package's files as multipart parts, model.json named `name`, plus `extra` parts.
fn weighted_upload(
    s: &TestServer,
    name: &str,
    extra: &[(&str, Option<&str>, &[u8])],
) -> crate::support::Response {
    let doc = format!(
        r#"{{"name": "{name}", "contract": "finite", "role": "embeddings",
        "programs": {{"prepare": "prepare.loom", "control": "control.loom", "kernel": "kernel.loom"}},
        "definition": {{"sources": ["embed.loom", "gemm.loom"]}},
        "options": {{"checkpoint": "model/weights.safetensors"}}}}"#
    );
    let files = [
        ("prepare.loom", "arith-embed-weighted/prepare.loom"),
        ("control.loom", "arith-embed/control.loom"),
        ("kernel.loom", "arith-embed-weighted/kernel.loom"),
        ("embed.loom", "arith-embed/kernel.loom"),
        ("gemm.loom", "motifs/gemm.loom"),
    ]
    .map(|(f, src)| (f, read(s, src)));
    let mut parts: Vec<(&str, Option<&str>, &[u8])> =
        vec![("model.json", Some("model.json"), doc.as_bytes())];
    for (f, bytes) in &files {
        parts.push(("file", Some(f), bytes));
    }
    parts.extend_from_slice(extra);
    let (ct, body) = multipart(&parts);
    s.try_request("POST", "/v1/models/upload", &[("Content-Type", &ct)], &body)
        .unwrap()
}

fn upload_dirs(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| d.count())
}

/// Waits (up to 10 s) until `dir` holds `n` upload directories.
fn wait_upload_dirs(dir: &std::path::Path, n: usize) {
    let t = std::time::Instant::now();
    while upload_dirs(dir) != n {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(10),
            "{} upload directories, expected {n}",
            upload_dirs(dir)
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn uploads_carry_their_own_parameter_files() {
    let uploads =
        std::env::temp_dir().join(format!("loom-serve-test-{}-uploads", std::process::id()));
    let _ = std::fs::remove_dir_all(&uploads);
    let s = TestServer::start(
        "upload-params",
        &[
            "--upload-dir",
            &uploads.display().to_string(),
            "--max-upload-bytes",
            "20000",
        ],
    );
    // Two uploads with a checkpoint at the same package path and different weights: each reads its own.
    let (one, two) = (scaled_head(1.0), scaled_head(3.0));
    let r = weighted_upload(
        &s,
        "one",
        &[("parameters", Some("model/weights.safetensors"), &one)],
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let r = weighted_upload(
        &s,
        "two",
        &[("parameters", Some("./model/weights.safetensors"), &two)],
    );
    assert_eq!(r.status, 201, "{}", r.text());
    for (model, k) in [("one", 1.0), ("two", 3.0)] {
        let v = s
            .post_json("/v1/embeddings", &json!({"model": model, "input": "hi"}))
            .json();
        let got = v["data"][0]["embedding"].as_array().unwrap();
        let want = crate::http_embed::weighted(&[104, 105]);
        for (g, w) in got.iter().zip(&want) {
            let w = k * w;
            assert!(
                (g.as_f64().unwrap() - w).abs() <= 1e-5 * w.abs().max(1.0),
                "{model}: {g} vs {w}"
            );
        }
    }
    wait_upload_dirs(&uploads, 2);
    // A parameter file prepare never opens is refused (and its upload's files removed).
    let r = weighted_upload(
        &s,
        "three",
        &[
            ("parameters", Some("model/weights.safetensors"), &one),
            ("parameters", Some("model/stray.safetensors"), &one),
        ],
    );
    assert_eq!(r.status, 400, "{}", r.text());
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(
        msg.contains("`model/stray.safetensors` is not opened by prepare"),
        "{msg}"
    );
    assert!(!msg.contains(&uploads.display().to_string()), "{msg}");
    // The same parameter path twice, and more parameter bytes than --max-upload-bytes.
    let r = weighted_upload(
        &s,
        "three",
        &[
            ("parameters", Some("model/weights.safetensors"), &one),
            ("parameters", Some("model//weights.safetensors"), &one),
        ],
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("two `parameters` parts"), "{}", r.text());
    let r = weighted_upload(
        &s,
        "three",
        &[
            ("parameters", Some("model/weights.safetensors"), &one),
            ("parameters", Some("model/b.safetensors"), &one),
            ("parameters", Some("model/c.safetensors"), &one),
        ],
    );
    assert_eq!(r.status, 413, "{}", r.text());
    assert_eq!(
        r.json()["error"]["code"],
        "upload_too_large",
        "{}",
        r.text()
    );
    wait_upload_dirs(&uploads, 2);
    // Without parameter files and without --params-root, the checkpoint has nowhere to resolve.
    let r = weighted_upload(&s, "three", &[]);
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        r.text().contains("carried no parameter files"),
        "{}",
        r.text()
    );
    // Unregistering (and replacing) a model removes its upload's files.
    assert_eq!(s.request("DELETE", "/v1/models/one", b"").status, 200);
    wait_upload_dirs(&uploads, 1);
    let r = weighted_upload(
        &s,
        "two",
        &[("parameters", Some("model/weights.safetensors"), &one)],
    );
    assert_eq!(r.status, 201, "{}", r.text());
    wait_upload_dirs(&uploads, 1);
    let v = s
        .post_json("/v1/embeddings", &json!({"model": "two", "input": "hi"}))
        .json();
    let got = v["data"][0]["embedding"][0].as_f64().unwrap();
    let want = crate::http_embed::weighted(&[104, 105])[0];
    assert!(
        (got - want).abs() <= 1e-5 * want.abs().max(1.0),
        "{got} vs {want}"
    );
    s.healthy();
    let _ = std::fs::remove_dir_all(&uploads);
}

#[test]
fn api_keys_guard_everything_but_health() {
    let s = TestServer::start("keys", &["--api-key", "sekret"]);
    assert_eq!(s.request("GET", "/health", b"").status, 200);
    let r = s.request("GET", "/v1/models", b"");
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error"]["code"], "invalid_api_key");
    let r = s
        .try_request(
            "GET",
            "/v1/models",
            &[("Authorization", "Bearer sekret")],
            b"",
        )
        .unwrap();
    assert_eq!(r.status, 200);
    let r = s
        .try_request(
            "GET",
            "/v1/models",
            &[("Authorization", "Bearer wrong"), ("X-Request-Id", "abc-1")],
            b"",
        )
        .unwrap();
    assert_eq!(r.status, 401);
    assert_eq!(r.header("x-request-id"), Some("abc-1"));
}

#[test]
fn sigterm_drains_and_exits_cleanly() {
    let s = TestServer::start("shutdown", &[]);
    assert_eq!(embed_status(&s, "arith-embed"), 200);
    let st = s.terminate();
    assert!(st.success(), "{st:?}");
}

#[test]
fn deactivation_releases_parameters_and_keeps_compiled_code() {
    let s = TestServer::start("deactivate", &[]);
    let m = "arith-embed-weighted";
    let before = s
        .post_json("/v1/embeddings", &json!({"model": m, "input": "same"}))
        .json();
    let r = s.request("POST", &format!("/v1/models/{m}/deactivate"), b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["status"], "deactivated");
    assert_eq!(r.json()["device_bytes"], 0);
    assert_eq!(r.json()["reserved_bytes"], 0, "its share is given back");
    assert_eq!(r.json()["stages"], 1, "compiled stages stay");
    assert_eq!(embed_status(&s, m), 503);
    assert_eq!(
        s.request("POST", &format!("/v1/models/{m}/deactivate"), b"")
            .status,
        503
    );
    let r = s.request("POST", &format!("/v1/models/{m}/activate"), b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["device_bytes"], 8320);
    assert_eq!(r.json()["reserved_bytes"], 67108864);
    let after = s
        .post_json("/v1/embeddings", &json!({"model": m, "input": "same"}))
        .json();
    assert_eq!(before["data"], after["data"]);
    assert_eq!(
        s.request("POST", "/v1/models/arith-embed/activate", b"")
            .status,
        400
    );
}

#[test]
fn prepare_batch_can_declare_a_request_time_checkpoint() {
    let s = TestServer::start("cohort-source", &[]);
    let base = s.dir.join("arith-embed-weighted");
    std::fs::write(base.join("weights2.safetensors"), scaled_head(2.0)).unwrap();
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "w2", "base": base.display().to_string(),
                "options": {"cohort_checkpoint": "weights2.safetensors"}}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    for _ in 0..2 {
        weighted_times(&s, "w2", 2.0);
    }
    // The second cohort reused the first one's declaration set (and its indexed source).
    assert!(s.metric("loom_specialization_cache_hits_total{model=\"w2\"}") >= 1.0);
    // A request-time checkpoint that is missing fails those cohorts with the file named, not the model.
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "w3", "base": base.display().to_string(),
                "options": {"cohort_checkpoint": "absent.safetensors"}}),
    );
    assert_eq!(r.status, 201, "the cold layout is fine: {}", r.text());
    let r = s.post_json("/v1/embeddings", &json!({"model": "w3", "input": "x"}));
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("absent.safetensors"), "{}", r.text());
    assert_eq!(
        s.post_json(
            "/v1/embeddings",
            &json!({"model": "arith-embed-weighted", "input": "x"})
        )
        .status,
        200
    );
}

#[test]
fn layout_transpose_places_a_transposed_checkpoint_tensor() {
    let s = TestServer::start("transpose", &[]);
    let base = s.dir.join("weighted-t");
    // gen_weights.py's head, stored transposed ([E = 32, D = 64]) under another key; the bias as it is.
    let mut data = Vec::new();
    for o in 0..32 {
        for d in 0..64 {
            data.extend_from_slice(&(((((d * 7 + o * 3) % 17) as f32) - 8.0) / 16.0).to_le_bytes());
        }
    }
    for o in 0..32 {
        data.extend_from_slice(&((((o % 5) as f32) - 2.0) / 8.0).to_le_bytes());
    }
    let h = br#"{"head.weight_t":{"dtype":"F32","shape":[32,64],"data_offsets":[0,8192]},"head.bias":{"dtype":"F32","shape":[32],"data_offsets":[8192,8320]}}"#;
    let mut f = (h.len() as u64).to_le_bytes().to_vec();
    f.extend_from_slice(h);
    f.extend_from_slice(&data);
    std::fs::write(base.join("weights_t.safetensors"), f).unwrap();
    let r = s.post_json("/v1/models", &json!({"base": base.display().to_string()}));
    assert_eq!(r.status, 201, "{}", r.text());
    let v = s
        .post_json(
            "/v1/embeddings",
            &json!({"model": "weighted-t", "input": ["hi", "there"]}),
        )
        .json();
    for (i, t) in ["hi", "there"].iter().enumerate() {
        let vals: Vec<i64> = t.bytes().map(i64::from).collect();
        let want = crate::http_embed::weighted(&vals);
        let got = v["data"][i]["embedding"].as_array().unwrap();
        for (g, w) in got.iter().zip(&want) {
            assert!(
                (g.as_f64().unwrap() - w).abs() <= 1e-5 * w.abs().max(1.0),
                "{g} vs {w}"
            );
        }
    }
    // A tensor stored untransposed ([64, 32]) does not fit the placement: checked against the index.
    let h2 = br#"{"head.weight_t":{"dtype":"F32","shape":[64,32],"data_offsets":[0,8192]},"head.bias":{"dtype":"F32","shape":[32],"data_offsets":[8192,8320]}}"#;
    let mut f2 = (h2.len() as u64).to_le_bytes().to_vec();
    f2.extend_from_slice(h2);
    f2.extend_from_slice(&data);
    std::fs::write(base.join("plain.safetensors"), f2).unwrap();
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "t2", "base": base.display().to_string(),
                "options": {"stage": "weighted_t.kernel.embed_head", "checkpoint": "plain.safetensors"}}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("stored transposed"), "{}", r.text());
    // One weight bank places each key once: a second binding of the same key in the checkpoint's layout
    // (before: a second resident copy beside the transposed one) is refused, naming the binding.
    let both = s.dir.join("weighted-tt");
    crate::support::copy_dir(&base, &both);
    let k = std::fs::read_to_string(both.join("kernel.loom")).unwrap();
    let bias = "        %bias: f32[E] = weights(0, \"head.bias\")\n";
    assert!(k.contains(bias), "the fixture's bias binding");
    let k = k.replace(
        bias,
        &format!("{bias}        %plain: f32[E, D] = weights(0, \"head.weight_t\")\n"),
    );
    std::fs::write(both.join("kernel.loom"), k).unwrap();
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "tt", "base": both.display().to_string()}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        r.text().contains("binding `plain` of domain @head")
            && r.text().contains("must agree on its placement"),
        "{}",
        r.text()
    );
    // The model that placed it transposed keeps serving.
    let r = s.post_json(
        "/v1/embeddings",
        &json!({"model": "weighted-t", "input": "hi"}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
}

/// The `progress` events of `GET /v1/models/{name}/events`, parsed.
fn progress_events(s: &TestServer, name: &str) -> Vec<serde_json::Value> {
    let r = s.request("GET", &format!("/v1/models/{name}/events"), b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        r.header("content-type")
            .is_some_and(|c| c.starts_with("text/event-stream")),
        "{:?}",
        r.header("content-type")
    );
    let text = r.text();
    text.split("\n\n")
        .filter(|e| e.lines().any(|l| l == "event: progress"))
        .map(|e| {
            let data = e
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .unwrap_or_else(|| panic!("an event without data: {e:?}"));
            serde_json::from_str(data).unwrap()
        })
        .collect()
}

#[test]
fn preparation_progress_streams_as_server_sent_events() {
    let s = TestServer::start("progress", &[]);
    // Registered while the stream is open: events follow the preparation to its end.
    let base = s.dir.join("arith-embed-weighted").display().to_string();
    let reg = {
        let (addr, base) = (s.addr.clone(), base.clone());
        std::thread::spawn(move || {
            let body = json!({"name": "w2", "base": base}).to_string();
            let mut c = std::net::TcpStream::connect(addr).unwrap();
            use std::io::{Read, Write};
            write!(
                c,
                "POST /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .unwrap();
            let mut out = String::new();
            c.read_to_string(&mut out).unwrap();
            out
        })
    };
    // Until the slot exists the route answers 404; then it streams to the end of the preparation.
    let t0 = std::time::Instant::now();
    let events = loop {
        let r = s.request("GET", "/v1/models/w2", b"");
        if r.status == 200 {
            break progress_events(&s, "w2");
        }
        assert!(t0.elapsed().as_secs() < 60, "w2 never appeared");
        std::thread::sleep(std::time::Duration::from_millis(2));
    };
    assert!(reg.join().unwrap().starts_with("HTTP/1.1 201"));
    let last = events.last().expect("at least one event");
    assert_eq!(last["status"], "ready", "{events:?}");
    assert_eq!(last["phase"], "ready");
    assert!(last["stages_total"].as_u64().unwrap() >= 1);
    assert_eq!(last["stages_compiled"], last["stages_total"]);
    // The weighted package places its checkpoint head: 64 x 32 f32 weights and 32 biases.
    assert!(
        last["bytes_total"].as_u64().unwrap() >= 64 * 32 * 4,
        "{last}"
    );
    assert_eq!(last["bytes_placed"], last["bytes_total"]);
    // Each resident buffer counts once: the total is what the model holds on the device (no cohort ran yet).
    let m = s.request("GET", "/v1/models/w2", b"").json();
    assert_eq!(last["bytes_total"], m["device_bytes"], "{last} vs {m}");
    assert!(last["error"].is_null());
    // Counts never go backwards along the stream.
    for w in events.windows(2) {
        for k in ["stages_compiled", "bytes_placed"] {
            assert!(w[0][k].as_u64() <= w[1][k].as_u64(), "{k}: {events:?}");
        }
    }

    // A model that is not preparing gets one event; a failed preparation says why; unknown models are 404.
    let ready = progress_events(&s, "arith-embed");
    assert_eq!(ready.len(), 1, "{ready:?}");
    assert_eq!(ready[0]["status"], "ready");
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "broken", "base": base, "options": {"checkpoint": "missing.safetensors"}}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    let failed = progress_events(&s, "broken");
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0]["status"], "failed");
    assert_eq!(failed[0]["phase"], "failed");
    assert!(
        failed[0]["error"]
            .as_str()
            .unwrap()
            .contains("missing.safetensors"),
        "{failed:?}"
    );
    assert_eq!(s.request("GET", "/v1/models/nope/events", b"").status, 404);
    // The log names each compiled stage.
    assert!(
        s.log().contains("model w2: compiled stage 1/"),
        "{}",
        s.log()
    );
    s.healthy();
}

/// The host's physical memory from /proc/meminfo (the CPU device's capacity).
fn mem_total() -> u64 {
    let t = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kib: u64 = t
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .unwrap()
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    kib * 1024
}

/// A copy of arith-embed named `name` whose `memory.device_bytes` is `bytes`.
fn sized_package(s: &TestServer, name: &str, bytes: u64) -> String {
    let dir = s.dir.join(name);
    crate::support::copy_dir(&s.dir.join("arith-embed"), &dir);
    let mut doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("model.json")).unwrap()).unwrap();
    doc["name"] = json!(name);
    doc["memory"]["device_bytes"] = json!(bytes);
    std::fs::write(dir.join("model.json"), doc.to_string()).unwrap();
    dir.display().to_string()
}

#[test]
fn model_budgets_are_admitted_against_the_device_capacity() {
    let s = TestServer::start("capacity", &[]);
    let share = mem_total() / 10 * 6;
    let a = sized_package(&s, "big-a", share);
    let b = sized_package(&s, "big-b", share);
    let r = s.post_json("/v1/models", &json!({"base": a}));
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(embed_status(&s, "big-a"), 200);
    // Two budgets of 60 % each do not fit one device: refused before placement, naming the field, the device
    // and who holds it; everything else keeps serving.
    let r = s.post_json("/v1/models", &json!({"base": b}));
    assert_eq!(r.status, 507, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "insufficient_device_memory");
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    for want in [
        "memory.device_bytes",
        "cpu:0",
        "`big-a`",
        &share.to_string(),
    ] {
        assert!(msg.contains(want), "{want:?} not in {msg}");
    }
    assert_eq!(embed_status(&s, "big-a"), 200);
    assert_eq!(embed_status(&s, "arith-embed"), 200);
    // Unregistering the holder releases its reservation: the second now fits.
    assert_eq!(s.request("DELETE", "/v1/models/big-a", b"").status, 200);
    let r = s.post_json("/v1/models", &json!({"base": b}));
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(embed_status(&s, "big-b"), 200);
    s.healthy();
}

/// Command workspace (a stage's reflected `alloc` buffers, here arith-decision's `%s`, f32 [B, C]) is drawn from
/// the model's pool in queue order: a dispatch takes an idle set of the same sizes whose last use has retired
/// instead of allocating one. So after a request the model holds that idle set (`device_bytes` > 0; before, each
/// dispatch allocated and freed its own, and the model held 0), asking the same again reuses it (no growth), a
/// cohort of another shape adds its own, and deactivation releases them all.
#[test]
fn command_workspace_is_reused_in_queue_order_and_released_at_deactivation() {
    let s = TestServer::start("workspace", &[]);
    let m = "arith-decision";
    let ask = |choices: &[&str]| {
        let r = s.post_json(
            "/v1/decisions",
            &json!({"model": m, "questions": {"q": {"type": "choice", "choices": choices}}}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["answers"]["q"]["probabilities"].clone()
    };
    let bytes = || s.metric(&format!("loom_device_bytes{{model=\"{m}\"}}"));
    assert_eq!(bytes(), 0.0);
    let first = ask(&["yes", "no"]);
    let one = bytes();
    assert!(one > 0.0, "an idle workspace set is kept");
    for _ in 0..5 {
        assert_eq!(ask(&["yes", "no"]), first);
    }
    assert_eq!(bytes(), one, "the same shape reuses its set");
    ask(&["a", "b", "c", "d", "e", "f", "g"]);
    assert!(bytes() > one, "another shape keeps a set of its own");
    let r = s.request("POST", &format!("/v1/models/{m}/deactivate"), b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["device_bytes"], 0);
    assert_eq!(r.json()["reserved_bytes"], 0);
    let r = s.request("POST", &format!("/v1/models/{m}/activate"), b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(ask(&["yes", "no"]), first);
    s.healthy();
}

/// The reservation is elastic: a deactivated model keeps only what it still holds (nothing), so another model
/// can be registered in its share of the device meanwhile; activating it again takes the whole share back,
/// which is refused (507, naming the holder, the model stays deactivated and keeps its compiled code) while the
/// other holds it, and succeeds once that one is gone. (Before, a deactivated model kept its whole share.)
#[test]
fn a_deactivated_model_gives_its_share_of_the_device_back() {
    let s = TestServer::start("trim", &[]);
    let share = mem_total() / 10 * 6;
    let a = sized_package(&s, "big-a", share);
    let b = sized_package(&s, "big-b", share);
    let r = s.post_json("/v1/models", &json!({"base": a}));
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(r.json()["reserved_bytes"], share);
    let before = s
        .post_json(
            "/v1/embeddings",
            &json!({"model": "big-a", "input": "kept"}),
        )
        .json();
    let r = s.request("POST", "/v1/models/big-a/deactivate", b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["reserved_bytes"], 0);
    // Its share is free: the second 60 % budget fits now.
    let r = s.post_json("/v1/models", &json!({"base": b}));
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(embed_status(&s, "big-b"), 200);
    // Taking the share back is refused while big-b holds it.
    let r = s.request("POST", "/v1/models/big-a/activate", b"");
    assert_eq!(r.status, 507, "{}", r.text());
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    for want in [
        "`big-a`",
        "`big-b`",
        "memory.device_bytes",
        &share.to_string(),
    ] {
        assert!(msg.contains(want), "{want:?} not in {msg}");
    }
    let info = s.request("GET", "/v1/models/big-a", b"").json();
    assert_eq!(info["status"], "deactivated", "{info}");
    assert_eq!(info["reserved_bytes"], 0, "{info}");
    assert_eq!(info["stages"], 1, "{info}");
    assert_eq!(embed_status(&s, "big-a"), 503);
    assert_eq!(embed_status(&s, "big-b"), 200);
    // Once big-b is gone, the activation succeeds and serves what it served before.
    assert_eq!(s.request("DELETE", "/v1/models/big-b", b"").status, 200);
    let r = s.request("POST", "/v1/models/big-a/activate", b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["reserved_bytes"], share);
    let after = s
        .post_json(
            "/v1/embeddings",
            &json!({"model": "big-a", "input": "kept"}),
        )
        .json();
    assert_eq!(before["data"], after["data"]);
    // And its whole share is held again: big-b no longer fits.
    let r = s.post_json("/v1/models", &json!({"base": b}));
    assert_eq!(r.status, 507, "{}", r.text());
    s.healthy();
}

/// A stage that never finishes cannot keep a stopping server waiting: past `--drain-timeout` after SIGTERM
/// the process exits with status 1 (before, it waited for ever), and the log says why.
#[test]
fn sigterm_has_a_drain_deadline() {
    let s = TestServer::start("drain-deadline", &["--drain-timeout", "2"]);
    // slow-embed's spin kernel, made to spin for 2^40 iterations: it does not finish in this test's life.
    let base = s.dir.join("runaway");
    crate::support::copy_dir(&s.dir.join("slow-embed"), &base);
    let k = std::fs::read_to_string(base.join("kernel.loom")).unwrap();
    assert!(
        k.contains("SPIN: i64 = 24000000"),
        "the fixture's spin default"
    );
    std::fs::write(
        base.join("kernel.loom"),
        k.replace("SPIN: i64 = 24000000", "SPIN: i64 = 1099511627776"),
    )
    .unwrap();
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "runaway", "base": base.display().to_string()}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    // A request whose cohort never finishes, left waiting on its own connection.
    let addr = s.addr.clone();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        if let Ok(mut c) = std::net::TcpStream::connect(&addr) {
            let body = r#"{"model": "runaway", "input": "spin"}"#;
            let _ = write!(
                c,
                "POST /v1/embeddings HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            let mut sink = Vec::new();
            let _ = c.read_to_end(&mut sink);
        }
    });
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let t0 = std::time::Instant::now();
    let st = s.terminate();
    assert_eq!(st.code(), Some(1), "{st:?}");
    // Not before the deadline (the runaway cohort was waited for that long), and not much after it.
    let took = t0.elapsed();
    assert!(
        took >= std::time::Duration::from_secs(2) && took < std::time::Duration::from_secs(20),
        "exited {took:?} after SIGTERM"
    );
}

/// Checks the weighted embeddings of `inputs` from `model` against the oracle's times `k` (the head and the bias
/// scaled by `scaled_head(k)`).
fn weighted_times(s: &TestServer, model: &str, k: f64) {
    let v = s
        .post_json(
            "/v1/embeddings",
            &json!({"model": model, "input": ["hi", "there"]}),
        )
        .json();
    for (i, t) in ["hi", "there"].iter().enumerate() {
        let vals: Vec<i64> = t.bytes().map(i64::from).collect();
        let want: Vec<f64> = crate::http_embed::weighted(&vals)
            .iter()
            .map(|x| k * x)
            .collect();
        let got = v["data"][i]["embedding"]
            .as_array()
            .unwrap_or_else(|| panic!("{v}"));
        for (g, w) in got.iter().zip(&want) {
            assert!(
                (g.as_f64().unwrap() - w).abs() <= 1e-5 * w.abs().max(1.0),
                "{model} x{k}: {g} vs {w}"
            );
        }
    }
}

/// Compiled code and placed parameters are reused only within a checkpoint's generation: a request-time
/// checkpoint replaced (or rewritten in place) is indexed and placed again for the next cohort, and a cold
/// checkpoint changed while the model is deactivated makes its activation fail, naming the file.
#[test]
fn a_changed_checkpoint_is_a_new_source_generation() {
    let s = TestServer::start("source-generation", &[]);
    let base = s.dir.join("arith-embed-weighted");
    let w2 = base.join("weights2.safetensors");
    std::fs::write(&w2, scaled_head(2.0)).unwrap();
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "w2", "base": base.display().to_string(),
                "options": {"cohort_checkpoint": "weights2.safetensors"}}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    weighted_times(&s, "w2", 2.0);
    weighted_times(&s, "w2", 2.0);
    let stale = || s.metric("loom_specialization_cache_stale_total{model=\"w2\"}");
    assert_eq!(stale(), 0.0);
    // Replaced (a new file renamed over it): the next cohort reads the new head.
    let tmp = base.join("weights2.tmp");
    std::fs::write(&tmp, scaled_head(3.0)).unwrap();
    std::fs::rename(&tmp, &w2).unwrap();
    weighted_times(&s, "w2", 3.0);
    assert_eq!(stale(), 1.0);
    weighted_times(&s, "w2", 3.0);
    assert_eq!(stale(), 1.0, "the new generation is cached");
    // Rewritten in place (same file, same size, a later modification time).
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::write(&w2, scaled_head(4.0)).unwrap();
    weighted_times(&s, "w2", 4.0);
    assert_eq!(stale(), 2.0);
    // A cold checkpoint changed while deactivated: activation fails naming it; the old model is not served
    // from the new file's bytes.
    let wc = base.join("weights-c.safetensors");
    std::fs::write(&wc, scaled_head(1.0)).unwrap();
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "wc", "base": base.display().to_string(),
                "options": {"checkpoint": "weights-c.safetensors"}}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    weighted_times(&s, "wc", 1.0);
    let r = s.request("POST", "/v1/models/wc/deactivate", b"");
    assert_eq!(r.status, 200, "{}", r.text());
    std::fs::write(&tmp, scaled_head(5.0)).unwrap();
    std::fs::rename(&tmp, &wc).unwrap();
    let r = s.request("POST", "/v1/models/wc/activate", b"");
    assert!(r.status >= 400, "{}", r.text());
    assert!(
        r.text().contains("weights-c.safetensors")
            && r.text().contains("changed since the model was prepared"),
        "{}",
        r.text()
    );
    assert!(
        !r.text().contains(&s.dir.display().to_string()),
        "{}",
        r.text()
    );
    // Unregistered and registered again, it serves the new file.
    let r = s.request("DELETE", "/v1/models/wc", b"");
    assert_eq!(r.status, 200, "{}", r.text());
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "wc", "base": base.display().to_string(),
                "options": {"checkpoint": "weights-c.safetensors"}}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    weighted_times(&s, "wc", 5.0);
    s.healthy();
}

/// Registers a copy of arith-embed named `name` whose memory budget is `device_bytes`, with `options`.
fn register_budgeted(s: &TestServer, name: &str, device_bytes: u64, options: serde_json::Value) {
    let base = s.dir.join(name);
    crate::support::copy_dir(&s.dir.join("arith-embed"), &base);
    let mut doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(base.join("model.json")).unwrap()).unwrap();
    doc["name"] = json!(name);
    doc["memory"]["device_bytes"] = json!(device_bytes);
    doc["options"] = options;
    std::fs::write(base.join("model.json"), doc.to_string()).unwrap();
    let r = s.post_json("/v1/models", &json!({"base": base.display().to_string()}));
    assert_eq!(r.status, 201, "{}", r.text());
}

/// Admission by the prepared working set (issue 15 item 6): a cohort whose peak (upload, output, command
/// workspace) cannot fit the model's budget is formed again with half its members until it fits, instead of
/// failing at allocation and retrying each member alone; a lone input whose own peak can never fit is refused
/// with 413 naming its peak (before: 429, "try again", which could never succeed).
#[test]
fn cohorts_are_admitted_by_their_prepared_working_set() {
    let s = TestServer::start("peaks", &[]);
    // 64 KiB: a cohort of 64 inputs of 250 bytes (the batch-unit limit admits them all) needs
    // 64 x 257 x 4 = 65,792 upload bytes alone.
    register_budgeted(
        &s,
        "small-budget",
        65536,
        json!({"max_tokens": 256, "dims": 64, "batch_units": 16384}),
    );
    let inputs: Vec<String> = (0..64)
        .map(|i| {
            (0..250)
                .map(|t| (b'a' + ((i * 7 + t * 3) % 26) as u8) as char)
                .collect()
        })
        .collect();
    let r = s.post_json(
        "/v1/embeddings",
        &json!({"model": "small-budget", "input": inputs}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    for (i, t) in inputs.iter().enumerate() {
        let want = arith(&t.bytes().map(i64::from).collect::<Vec<_>>(), 64);
        let got = v["data"][i]["embedding"].as_array().unwrap();
        for (j, w) in want.iter().enumerate() {
            let g = got[j].as_f64().unwrap();
            assert!(
                (g - w).abs() <= 1e-5 * w.abs().max(1.0),
                "input {i}[{j}]: {g} vs {w}"
            );
        }
    }
    let m = |k: &str| s.metric(&format!("{k}{{model=\"small-budget\"}}"));
    assert!(m("loom_cohorts_split_total") >= 1.0);
    assert_eq!(
        m("loom_retried_alone_total"),
        0.0,
        "no cohort failed at allocation"
    );
    assert_eq!(m("loom_requests_failed_total"), 0.0);
    assert!(
        m("loom_cohort_max_members") <= 32.0,
        "{}",
        m("loom_cohort_max_members")
    );
    // 4 KiB with max_tokens 1024: one input of 1000 bytes needs 1,009 x 4 upload + 256 output bytes.
    register_budgeted(
        &s,
        "tiny-budget",
        4096,
        json!({"max_tokens": 1024, "dims": 64, "batch_units": 2048}),
    );
    let r = s.post_json(
        "/v1/embeddings",
        &json!({"model": "tiny-budget", "input": "z".repeat(1000)}),
    );
    assert_eq!(r.status, 413, "{}", r.text());
    let text = r.text();
    assert!(
        text.contains("4292 device bytes at its peak")
            && text.contains("memory.device_bytes is 4096"),
        "{text}"
    );
    assert!(!text.contains(&s.dir.display().to_string()), "{text}");
    // A smaller input fits and is served.
    let r = s.post_json(
        "/v1/embeddings",
        &json!({"model": "tiny-budget", "input": "z".repeat(100)}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // The same budget with lone requests run in place on the submitting thread (from the first one): the same
    // admission there.
    register_budgeted(
        &s,
        "tiny-in-place",
        4096,
        json!({"max_tokens": 1024, "dims": 64, "batch_units": 2048, "in_place_cohort_us": 60000000}),
    );
    // (The first compiles its stage on the scheduler's path; the next ones run in place.)
    for _ in 0..3 {
        let r = s.post_json(
            "/v1/embeddings",
            &json!({"model": "tiny-in-place", "input": "z".repeat(100)}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert!(s.metric("loom_cohorts_in_place_total{model=\"tiny-in-place\"}") > 0.0);
    // The first compiles its stage on the scheduler's path; the second, compiled, is the in-place one.
    let before = s.metric("loom_cohorts_in_place_total{model=\"tiny-in-place\"}");
    for _ in 0..2 {
        let r = s.post_json(
            "/v1/embeddings",
            &json!({"model": "tiny-in-place", "input": "z".repeat(1000)}),
        );
        assert_eq!(r.status, 413, "{}", r.text());
        assert!(
            r.text().contains("4292 device bytes at its peak"),
            "{}",
            r.text()
        );
    }
    assert_eq!(
        s.metric("loom_cohorts_in_place_total{model=\"tiny-in-place\"}"),
        before,
        "an input that cannot fit is refused before it runs in place"
    );
    s.healthy();
}
