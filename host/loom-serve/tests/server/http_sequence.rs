//! The known-token sequence contract through the real binary, with the toy package `packages/arith-score`
//! (`POST /v1/score`). Its output is exact arithmetic over the whole sequence, carried across epochs in the page
//! pool, so the oracle here (written from the package's documented formula) catches a mistake in chunking,
//! paging, byte placement or capture:
//!
//!   sum[p] = tok[0] + ... + tok[p];  score of token p + 1 = -((sum[p] + 3 * tok[p + 1]) mod 1024) / 16

use crate::support::TestServer;
use serde_json::{Value, json};

/// Each token's score after the first (the first has none), as the package documents it.
fn oracle(tokens: &[u32]) -> Vec<Option<f64>> {
    let mut out = vec![None];
    let mut sum = 0u64;
    for p in 0..tokens.len().saturating_sub(1) {
        sum += u64::from(tokens[p]);
        out.push(Some(
            -(((sum + 3 * u64::from(tokens[p + 1])) % 1024) as f64) / 16.0,
        ));
    }
    out
}

fn logprobs(entry: &Value) -> Vec<Option<f64>> {
    entry["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["logprob"].as_f64())
        .collect()
}

/// A pseudo-random sequence of `n` byte tokens.
fn tokens(seed: u64, n: usize) -> Vec<u32> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 256) as u32
        })
        .collect()
}

fn register(s: &TestServer, body: Value) {
    let r = s.post_json("/v1/models", &body);
    assert_eq!(r.status, 201, "{}", r.text());
}

/// Sequences of every length from 1 to the context, alone and many at once, with epochs and pages small
/// enough that sequences are chunked over several epochs and share epochs with each other: every score equals
/// the oracle's, totals are their sums, and the pool is empty afterwards.
#[test]
fn scores_equal_the_arithmetic_oracle_across_chunks_pages_and_neighbours() {
    let s = TestServer::start_models("seq-oracle", &[], &[]);
    let base = crate::support::package_dir("seq-oracle-pkgs").join("arith-score");
    register(&s, json!({"base": base.display().to_string()}));
    // 7-token epochs of at most 3 spans, 3-token pages.
    register(
        &s,
        json!({"name": "tiny", "base": base.display().to_string(),
               "options": {"epoch_tokens": 7, "epoch_spans": 3, "page_tokens": 3, "context": 256}}),
    );
    for model in ["arith-score", "tiny"] {
        // One request of 24 sequences (1 to 256 tokens), then the same sequences as 24 concurrent requests.
        let seqs: Vec<Vec<u32>> = (0..24)
            .map(|i| {
                tokens(
                    i,
                    [1, 2, 3, 4, 5, 7, 64, 65, 200, 256][i as usize % 10] + i as usize % 3,
                )
            })
            .map(|mut t| {
                t.truncate(256);
                t
            })
            .collect();
        let r = s.post_json("/v1/score", &json!({"model": model, "input": seqs}));
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        assert_eq!(v["object"], "list");
        assert_eq!(v["model"], model);
        let n: usize = seqs.iter().map(Vec::len).sum();
        assert_eq!(v["usage"]["prompt_tokens"], n);
        for (i, (d, t)) in v["data"].as_array().unwrap().iter().zip(&seqs).enumerate() {
            assert_eq!(d["index"], i);
            assert_eq!(d["object"], "score");
            let want = oracle(t);
            assert_eq!(logprobs(d), want, "{model}: input {i} ({} tokens)", t.len());
            let total: f64 = want.iter().flatten().sum();
            assert_eq!(d["total_logprob"].as_f64().unwrap(), total);
            let ids: Vec<u32> = d["tokens"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x["id"].as_u64().unwrap() as u32)
                .collect();
            assert_eq!(&ids, t);
            if t.len() > 1 {
                let mean = total / (t.len() - 1) as f64;
                let ppl = d["perplexity"].as_f64().unwrap();
                assert!((ppl / (-mean).exp() - 1.0).abs() < 1e-12, "{ppl}");
            } else {
                assert!(d["perplexity"].is_null() && d["mean_logprob"].is_null());
            }
        }
        std::thread::scope(|sc| {
            for (i, t) in seqs.iter().enumerate() {
                let s = &s;
                sc.spawn(move || {
                    let r = s.post_json("/v1/score", &json!({"model": model, "input": t}));
                    assert_eq!(r.status, 200, "{}", r.text());
                    assert_eq!(
                        logprobs(&r.json()["data"][0]),
                        oracle(t),
                        "{model}: request {i}"
                    );
                });
            }
        });
        let m = format!("{{model=\"{model}\"}}");
        assert_eq!(s.metric(&format!("loom_sequence_pages_used{m}")), 0.0);
        assert_eq!(s.metric(&format!("loom_sequence_running{m}")), 0.0);
        assert_eq!(
            s.metric(&format!("loom_sequence_tokens_total{m}")),
            2.0 * n as f64
        );
        assert_eq!(
            s.metric(&format!("loom_sequence_captured_bytes_total{m}")),
            8.0 * n as f64,
            "every token's f32 captured once"
        );
    }
    // Text goes through the package's tokenizer (none: bytes).
    let r = s.post_json(
        "/v1/score",
        &json!({"model": "arith-score", "input": "hello"}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let d = &r.json()["data"][0];
    assert_eq!(logprobs(d), oracle(&[104, 101, 108, 108, 111]));
    assert_eq!(d["tokens"][1]["text"], "e");
    s.healthy();
}

/// Only the bytes a plan lists are uploaded: a one-token sequence moves its header block, one token, one page
/// entry and the next-token slots, not the stage's whole metadata and input buffers.
#[test]
fn an_epoch_uploads_only_the_listed_bytes() {
    let s = TestServer::start_models("seq-upload", &[], &[]);
    let base = crate::support::package_dir("seq-upload-pkgs").join("arith-score");
    register(&s, json!({"base": base.display().to_string()}));
    let m = "{model=\"arith-score\"}";
    let r = s.post_json(
        "/v1/score",
        &json!({"model": "arith-score", "input": [[7]]}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // S = 4 spans, T = 64 tokens, G = 4 * 256 / 4 page slots: metadata 4 S + G words, input T + S words.
    let capacity = ((4 * 4 + 256) + (64 + 4)) * 4;
    assert_eq!(
        s.metric(&format!("loom_sequence_upload_capacity_bytes_total{m}")),
        f64::from(capacity)
    );
    // Headers (4 S words), one page entry, one token, S next tokens.
    assert_eq!(
        s.metric(&format!("loom_sequence_upload_bytes_total{m}")),
        f64::from((16 + 1 + 1 + 4) * 4)
    );
    s.healthy();
}

/// Each broken rule of a placement plan or a capture fails the request with a 400 naming the record, and the
/// server keeps serving (the broken model's next request, and other models).
#[test]
fn broken_plans_and_captures_are_refused_by_record() {
    let s = TestServer::start_models("seq-faults", &[], &[]);
    let base = crate::support::package_dir("seq-faults-pkgs").join("arith-score");
    register(&s, json!({"base": base.display().to_string()}));
    let plan = "input 0: encode_epoch: transfer plan record";
    let cases = [
        (
            1,
            format!("{plan} 0: source binding 2: expected 0 (metadata) or 1 (input)"),
        ),
        (
            2,
            format!("{plan} 3: target bytes 260+16 are outside the 272-byte input buffer"),
        ),
        (
            3,
            format!(
                "{plan} 3: targets input buffer bytes 0.. after input buffer bytes 256..: nonempty records \
                     must be ordered by target binding and offset"
            ),
        ),
        (
            4,
            format!(
                "{plan} 1: target metadata buffer bytes 60+4 overlap the previous record's 0+64"
            ),
        ),
        (
            5,
            format!("{plan} 3: source bytes 16+16 are outside the 28-byte input packet"),
        ),
        (
            6,
            "input 0: capture_epoch: span 0 has no nonempty range (every span needs at least one)"
                .into(),
        ),
        (
            7,
            "input 0: capture_epoch: range 0: span ordinal 1: the epoch has 1 spans".into(),
        ),
    ];
    for (fault, want) in cases {
        let name = format!("fault{fault}");
        register(
            &s,
            json!({"name": name, "base": base.display().to_string(), "options": {"fault": fault}}),
        );
        let r = s.post_json("/v1/score", &json!({"model": name, "input": [[1, 2, 3]]}));
        assert_eq!(r.status, 400, "{}", r.text());
        let e = r.json();
        assert_eq!(e["error"]["code"], "invalid_program", "{e}");
        let msg = e["error"]["message"].as_str().unwrap();
        assert_eq!(msg, want);
        assert!(!msg.contains('/'), "no server path: {msg}");
        assert_eq!(
            s.metric(&format!("loom_sequence_pages_used{{model=\"{name}\"}}")),
            0.0
        );
    }
    let r = s.post_json(
        "/v1/score",
        &json!({"model": "arith-score", "input": [[1, 2, 3]]}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(logprobs(&r.json()["data"][0]), oracle(&[1, 2, 3]));
    s.healthy();
}

/// Bad requests get a 400 (or 413, 404, 501) naming the input and the field; none of them disturbs the model.
#[test]
fn bad_score_requests_name_the_input() {
    let s = TestServer::start_models("seq-bad", &[], &[]);
    let dir = crate::support::package_dir("seq-bad-pkgs");
    register(
        &s,
        json!({"base": dir.join("arith-score").display().to_string()}),
    );
    register(
        &s,
        json!({"base": dir.join("arith-chat").display().to_string()}),
    );
    let ask = |body: Value| {
        let r = s.post_json("/v1/score", &body);
        let e = r.json();
        (
            r.status,
            e["error"]["message"].as_str().unwrap_or("").to_string(),
        )
    };
    let cases: Vec<(Value, u16, &str)> = vec![
        (json!({"input": "x"}), 400, "`model` (a string) is required"),
        (json!({"model": "arith-score"}), 400, "`input` is required"),
        (
            json!({"model": "arith-score", "input": 5}),
            400,
            "`input` must be a string, a list of strings",
        ),
        (
            json!({"model": "arith-score", "input": []}),
            400,
            "`input` is empty",
        ),
        (
            json!({"model": "arith-score", "input": ["ok", 3]}),
            400,
            "`input[1]` must be a string or a list of token ids",
        ),
        (
            json!({"model": "arith-score", "input": [[1, -2]]}),
            400,
            "`input[0][1]` must be a token id",
        ),
        (
            json!({"model": "arith-score", "input": ["ok", ""]}),
            400,
            "input 1: no tokens",
        ),
        (
            json!({"model": "arith-score", "input": [[1], [2, 256]]}),
            400,
            "input 1: token 1 is 256; the vocabulary has 256 tokens",
        ),
        (
            json!({"model": "arith-score", "input": [vec![1; 257]]}),
            413,
            "input 0: the sequence has 257 tokens; model `arith-score` takes at most 256",
        ),
        (
            json!({"model": "arith-score", "input": vec!["a"; 65]}),
            413,
            "`input` has 65 entries; at most 64",
        ),
        (json!({"model": "nope", "input": "x"}), 404, "nope"),
        (
            json!({"model": "arith-chat", "input": "x"}),
            501,
            "model `arith-chat` serves chat, not scores",
        ),
    ];
    for (body, status, want) in cases {
        let (st, msg) = ask(body.clone());
        assert_eq!(st, status, "{body}: {msg}");
        assert!(msg.contains(want), "{body}: {msg:?} lacks {want:?}");
    }
    let r = s.post_json(
        "/v1/score",
        &json!({"model": "arith-score", "input": [[9, 9]]}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    s.healthy();
}

/// A package's other manifest is another deployment of the same files (`manifest` on registration and in a
/// deployment file); bad manifest names are refused.
#[test]
fn a_manifest_selects_another_deployment_of_a_package() {
    let dir = crate::support::package_dir("seq-manifest");
    let base = dir.join("arith-score");
    let mut doc: Value =
        serde_json::from_slice(&std::fs::read(base.join("model.json")).unwrap()).unwrap();
    doc["name"] = json!("small-epochs");
    doc["options"]["epoch_tokens"] = json!(5);
    std::fs::write(base.join("small.json"), doc.to_string()).unwrap();
    let file = dir.join("deploy.json");
    std::fs::write(
        &file,
        json!({"models": [{"base": "arith-score", "manifest": "small.json"}]}).to_string(),
    )
    .unwrap();
    let s = TestServer::start_models(
        "seq-manifest-run",
        &[],
        &["--deployment", &file.display().to_string()],
    );
    s.healthy();
    let m = s.request("GET", "/v1/models/small-epochs", b"").json();
    assert_eq!(m["status"], "ready", "{m}");
    assert_eq!(m["contract"], "sequence");
    let t = tokens(3, 40);
    let r = s.post_json("/v1/score", &json!({"model": "small-epochs", "input": [t]}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(logprobs(&r.json()["data"][0]), oracle(&t));
    // 40 tokens in epochs of 5.
    assert_eq!(
        s.metric("loom_sequence_epochs_total{model=\"small-epochs\"}"),
        8.0
    );
    for (manifest, want) in [
        (
            json!("../model.json"),
            "`manifest` \"../model.json\": expected the name of a `.json` file",
        ),
        (json!("model.toml"), "expected the name of a `.json` file"),
        (json!(3), "`manifest` must be a string"),
    ] {
        let r = s.post_json(
            "/v1/models",
            &json!({"name": "m2", "base": base.display().to_string(), "manifest": manifest}),
        );
        assert_eq!(r.status, 400, "{}", r.text());
        let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
        assert!(msg.contains(want), "{msg}");
    }
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "m3", "base": base.display().to_string(), "manifest": "absent.json"}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "invalid_package");
    assert!(r.text().contains("absent.json"), "{}", r.text());
    let _ = std::fs::remove_dir_all(&dir);
}
