//! HTTP profile plugins in the real server: the TEI profile (`plugins/profile-tei`, `POST /embed`) returns the
//! same vectors as `/v1/embeddings`; its bad bodies are 4xx in the OpenAI error shape; a profile whose route
//! collides with a built-in route (`tests/plugins/profile-clash`) is one log line; panics inside a profile
//! (`tests/plugins/profile-panics`, caught by `guard_profile`) are 500s with the panic message; a profile
//! with streamed routes (`tests/plugins/profile-stream`, ABI 1.4 events) streams one event per input with
//! the vectors of `/v1/embeddings`, and a stream whose encoder panics ends without its END event; the
//! server stays healthy throughout.

use crate::support::TestServer;
use serde_json::{Value, json};
use std::path::PathBuf;

/// A plugins directory holding the profile cdylibs of this build (dev-dependencies of `loom-serve`, built
/// into `target/<profile>/deps/`, next to this test binary).
fn plugins_dir() -> PathBuf {
    plugins_dir_tagged("")
}

/// [`plugins_dir`] in a directory of its own for each call (`tag` names it; tests run in parallel in one
/// process).
pub(crate) fn plugins_dir_tagged(tag: &str) -> PathBuf {
    let deps = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    // One directory per call: two tests sharing one removed it under each other's copies (a test failed with
    // "No such file or directory").
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("loom-profiles-{}-{n}{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for lib in [
        "libprofile_tei.so",
        "libloom_test_profile_clash.so",
        "libloom_test_profile_panics.so",
        "libloom_test_profile_stream.so",
    ] {
        std::fs::copy(deps.join(lib), dir.join(lib))
            .unwrap_or_else(|e| panic!("{lib} from {}: {e}", deps.display()));
    }
    dir
}

fn vectors(v: &Value) -> Vec<Vec<f64>> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|row| {
            row.as_array()
                .unwrap_or_else(|| panic!("not a list: {row}"))
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        })
        .collect()
}

fn openai(s: &TestServer, input: Value) -> Vec<Vec<f64>> {
    let r = s.post_json(
        "/v1/embeddings",
        &json!({"model": "arith-embed", "input": input}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| vectors(&json!([d["embedding"]])).remove(0))
        .collect()
}

/// The error message of an OpenAI-shaped error response with `status`.
fn error(r: &crate::support::Response, status: u16) -> String {
    assert_eq!(r.status, status, "{}", r.text());
    let v = r.json();
    assert!(v["error"]["type"].is_string(), "{v}");
    v["error"]["message"].as_str().unwrap().to_string()
}

#[test]
fn tei_profile_serves_embed_like_the_openai_route() {
    let dir = plugins_dir();
    let dir_arg = dir.display().to_string();
    let s = TestServer::start("profiles", &["--plugins", &dir_arg]);
    let log = s.log();

    // Loading: the TEI and the panicking profiles are mounted; the clashing one is one line.
    assert!(
        log.contains("profile route tei-0001: POST /embed (embeddings)"),
        "{log}"
    );
    assert!(
        log.contains("profile route ppanic-0001: POST /test/panic-parse (embeddings)"),
        "{log}"
    );
    let clash: Vec<&str> = log.lines().filter(|l| l.contains("collides")).collect();
    assert_eq!(clash.len(), 1, "{log}");
    assert!(
        clash[0].contains("plugin rejected: ")
            && clash[0].contains("libloom_test_profile_clash.so: profile `clash-0001`: route POST /v1/embeddings collides with the built-in route /v1/embeddings"),
        "{}",
        clash[0]
    );
    assert!(!log.contains("profile route clash-0001"), "{log}");
    assert_eq!(s.request("POST", "/clash/ok", b"{}").status, 404);

    // normalize=false: exactly the vectors of /v1/embeddings (same records, same f32 values).
    let inputs = json!(["hello", "world", "a longer sentence to embed"]);
    let want = openai(&s, inputs.clone());
    let r = s.post_json(
        "/embed",
        &json!({"model": "arith-embed", "inputs": inputs, "normalize": false}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(vectors(&r.json()), want);

    // Token ids, one list and a list of lists, and a single string (still a list of vectors).
    for ids in [json!([1, 2, 3]), json!([[1], [2, 3]])] {
        let r = s.post_json(
            "/embed",
            &json!({"model": "arith-embed", "inputs": ids, "normalize": false}),
        );
        assert_eq!(vectors(&r.json()), openai(&s, ids), "{}", r.text());
    }
    let r = s.post_json(
        "/embed",
        &json!({"model": "arith-embed", "inputs": "hello", "normalize": false}),
    );
    assert_eq!(vectors(&r.json()), vec![want[0].clone()]);

    // normalize defaults to true: the same vectors with unit L2 norm.
    let r = s.post_json("/embed", &json!({"model": "arith-embed", "inputs": inputs}));
    assert_eq!(r.status, 200, "{}", r.text());
    let got = vectors(&r.json());
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        let norm = w.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!(norm > 0.0);
        assert_eq!(g.len(), w.len());
        for (a, b) in g.iter().zip(w) {
            assert!((a - b / norm).abs() < 1e-6, "{a} vs {}", b / norm);
        }
        let unit = g.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!((unit - 1.0).abs() < 1e-5, "{unit}");
    }

    // Bad bodies: 4xx with a clear message in the OpenAI shape.
    let m = error(&s.request("POST", "/embed", b"{"), 400);
    assert!(m.starts_with("the body is not valid JSON"), "{m}");
    assert_eq!(
        error(&s.request("POST", "/embed", b"{}"), 422),
        "`inputs` is required"
    );
    let r = s.post_json("/embed", &json!({"model": "arith-embed", "inputs": []}));
    assert_eq!(error(&r, 422), "`inputs` cannot be empty");
    let r = s.post_json(
        "/embed",
        &json!({"model": "arith-embed", "inputs": "x", "normalize": 1}),
    );
    assert_eq!(error(&r, 422), "`normalize` must be a boolean");
    let r = s
        .try_request(
            "POST",
            "/embed",
            &[("Content-Type", "text/plain")],
            b"{\"inputs\": \"x\"}",
        )
        .unwrap();
    assert!(error(&r, 415).contains("expected a JSON body"));
    // Model errors are the server's, as on /v1/embeddings.
    let r = s.post_json("/embed", &json!({"model": "nope", "inputs": "x"}));
    assert!(error(&r, 404).contains("nope"));
    let r = s.post_json("/embed", &json!({"model": "arith-decision", "inputs": "x"}));
    assert!(error(&r, 501).contains("serves decisions, not embeddings"));
    // Two embeddings models are registered: a request without `model` must name one.
    let r = s.post_json("/embed", &json!({"inputs": "x"}));
    let m = error(&r, 400);
    assert!(
        m.contains("2 models serve embeddings (arith-embed, arith-embed-weighted)"),
        "{m}"
    );

    // Panics inside the profile are 500s with the message; the server keeps serving.
    let m = error(&s.request("POST", "/test/panic-parse", b""), 500);
    assert!(
        m.contains("parse: the plugin panicked: this test profile panics in parse on purpose"),
        "{m}"
    );
    let m = error(
        &s.request("POST", "/test/panic-encode", b"arith-embed"),
        500,
    );
    assert!(
        m.contains("encode: the plugin panicked: this test profile panics in encode on purpose"),
        "{m}"
    );
    s.healthy();
    assert_eq!(openai(&s, json!("hello")), vec![want[0].clone()]);

    // With one embeddings model left, `model` may be left out (TEI serves one model).
    let r = s.request("DELETE", "/v1/models/arith-embed-weighted", b"");
    assert_eq!(r.status, 200, "{}", r.text());
    let r = s.post_json("/embed", &json!({"inputs": ["hello"], "normalize": false}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(vectors(&r.json()), vec![want[0].clone()]);
    s.healthy();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The NDJSON lines of a streamed response.
fn ndjson(r: &crate::support::Response) -> Vec<Value> {
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/x-ndjson"));
    r.text()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect()
}

#[test]
fn streamed_profile_routes_send_one_event_per_input() {
    let dir = plugins_dir();
    let dir_arg = dir.display().to_string();
    let s = TestServer::start("profile-streams", &["--plugins", &dir_arg]);
    let log = s.log();
    assert!(
        log.contains("profile route pstream-0001: POST /test/stream-embed (embeddings, streamed as application/x-ndjson)"),
        "{log}"
    );
    assert!(
        log.lines()
            .any(|l| l.ends_with("profile route pstream-0001: POST /test/one-body (embeddings)")),
        "{log}"
    );

    // Every input once, with the vectors /v1/embeddings gives, `done` counting up, then END with the usage.
    let inputs: Vec<String> = (0..12)
        .map(|i| format!("sentence number {i} to embed"))
        .collect();
    let want = openai(&s, json!(inputs));
    let usage = s
        .post_json(
            "/v1/embeddings",
            &json!({"model": "arith-embed", "input": inputs}),
        )
        .json()["usage"]["prompt_tokens"]
        .as_i64()
        .unwrap();
    let body = json!({"model": "arith-embed", "inputs": inputs});
    let events = ndjson(&s.post_json("/test/stream-embed", &body));
    assert_eq!(events.len(), inputs.len() + 2, "{events:?}");
    assert_eq!(events[0], json!({"event": "start", "total": 12}));
    let mut seen = vec![false; inputs.len()];
    for (k, e) in events[1..=inputs.len()].iter().enumerate() {
        assert_eq!(e["event"], "result", "{e}");
        assert_eq!(e["done"], k as u64 + 1, "{e}");
        let i = e["index"].as_u64().unwrap() as usize;
        assert!(!std::mem::replace(&mut seen[i], true), "index {i} twice");
        // The plugin writes each f32 widened to f64 (`json!`); the server writes the shortest f32 digits.
        let got: Vec<f32> = vectors(&json!([e["embedding"]]))
            .remove(0)
            .iter()
            .map(|&x| x as f32)
            .collect();
        let want: Vec<f32> = want[i].iter().map(|&x| x as f32).collect();
        assert_eq!(got, want, "{i}");
    }
    assert_eq!(
        events.last().unwrap(),
        &json!({"event": "end", "done": 12, "units": usage})
    );

    // Failures before the stream starts are ordinary error responses.
    let r = s.post_json(
        "/test/stream-embed",
        &json!({"model": "nope", "inputs": ["x"]}),
    );
    assert!(error(&r, 404).contains("nope"));
    let r = s.request("POST", "/test/stream-embed", b"{");
    assert!(error(&r, 400).contains("not JSON"));

    // A route the profile does not stream answers with one body.
    let r = s.post_json("/test/one-body", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json(), json!({"count": 12}));

    // The encoder panics on the first result: START, then the stream ends without END; the server serves on.
    let r = s.post_json("/test/stream-panic", &body);
    let events = ndjson(&r);
    assert_eq!(events, vec![json!({"event": "start", "total": 12})]);
    s.healthy();
    assert!(
        s.log().contains(
            "encode_event: the plugin panicked: this test profile panics in encode_event on purpose"
        ),
        "{}",
        s.log()
    );
    assert_eq!(openai(&s, json!(["x"])), openai(&s, json!(["x"])));
    let events = ndjson(&s.post_json("/test/stream-embed", &body));
    assert_eq!(events.len(), 14);
    let _ = std::fs::remove_dir_all(&dir);
}
