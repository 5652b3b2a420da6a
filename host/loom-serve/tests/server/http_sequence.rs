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

/// Sessions on a sequence model: appends score only their own tokens, given everything before them in the
/// session, and equal the oracle over the session's whole token list whatever appends, checkpoints, forks
/// (of forks), rewinds (into the middle of a page) and concurrent appends to two branches built it; forks and
/// checkpoints take no page; a deactivation keeps the sessions; deleting them frees every page.
#[test]
fn sessions_score_appends_like_the_whole_sequence() {
    let s = TestServer::start_models("seq-sessions", &[], &[]);
    let base = crate::support::package_dir("seq-sessions-pkgs").join("arith-score");
    // 7-token epochs, 3-token pages: appends are chunked and end mid-page.
    register(
        &s,
        json!({"name": "tiny", "base": base.display().to_string(),
               "options": {"epoch_tokens": 7, "epoch_spans": 3, "page_tokens": 3, "context": 256}}),
    );
    let pages = || s.metric("loom_sequence_pages_used{model=\"tiny\"}");
    let new_session = |body: Value| {
        let r = s.post_json("/v1/sessions", &body);
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        assert_eq!(v["model"], "tiny");
        v["id"].as_str().unwrap().to_string()
    };
    // Appends `add` to session `id`, which holds `had`; checks the scores against the oracle over `had + add`.
    let append = |id: &str, had: &[u32], add: &[u32]| -> Vec<u32> {
        let r = s.post_json(
            &format!("/v1/sessions/{id}/append"),
            &json!({"tokens": add}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        assert_eq!(v["object"], "score");
        assert_eq!(v["session"], id);
        let all: Vec<u32> = had.iter().chain(add).copied().collect();
        assert_eq!(
            logprobs(&v),
            oracle(&all)[had.len()..].to_vec(),
            "append of {} to {} tokens",
            add.len(),
            had.len()
        );
        assert_eq!(v["usage"]["prompt_tokens"], add.len());
        all
    };
    let post = |path: String, body: Value| {
        let r = s.post_json(&path, &body);
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        r.json()
    };

    let a = new_session(json!({"model": "tiny"}));
    let mut t: Vec<u32> = Vec::new();
    for (i, n) in [1, 1, 5, 2, 17, 3, 9].into_iter().enumerate() {
        t = append(&a, &t, &tokens(100 + i as u64, n));
    }
    let held = pages();
    // The state of all but the last token, in 3-token pages.
    assert_eq!(
        held,
        ((t.len() - 1) as f64 / 3.0).ceil(),
        "{} tokens",
        t.len()
    );
    // A checkpoint and a fork take no page.
    post(
        format!("/v1/sessions/{a}/checkpoints"),
        json!({"name": "c1"}),
    );
    let f = post(format!("/v1/sessions/{a}/fork"), json!({}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(pages(), held);
    let at_c1 = t.clone();
    // The branches share the partial page their appends continue (position 36 of 38 tokens, 3 to a page): the
    // toy reads only the position before a span, so each branch appends 2 tokens (its state then ends at
    // position 38, in that page), and the other's append in between would overwrite that slot without the copy.
    let ta = append(&a, &at_c1, &tokens(5, 2));
    let tf = append(&f, &at_c1, &tokens(6, 2));
    let ta = append(&a, &ta, &tokens(7, 3));
    let tf = append(&f, &tf, &tokens(8, 1));
    // And both at once.
    let (ta, tf) = std::thread::scope(|sc| {
        let ha = sc.spawn(|| append(&a, &ta, &tokens(7, 11)));
        let hf = sc.spawn(|| append(&f, &tf, &tokens(8, 4)));
        (ha.join().unwrap(), hf.join().unwrap())
    });
    let tf = append(&f, &tf, &tokens(9, 2));
    // A fork of a fork, from its current state.
    let ff = post(format!("/v1/sessions/{f}/fork"), json!({}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    append(&ff, &tf, &tokens(10, 6));
    // Back to the checkpoint, then on from there.
    let v = post(
        format!("/v1/sessions/{a}/rewind"),
        json!({"checkpoint": "c1"}),
    );
    assert_eq!(v["tokens"], at_c1.len());
    append(&a, &at_c1, &tokens(11, 3));
    // A rewind into the middle of a page (and then past the page boundary again).
    let v = post(format!("/v1/sessions/{a}/rewind"), json!({"tokens": 20}));
    assert_eq!(v["tokens"], 20);
    let t20 = append(&a, &ta[..20], &tokens(12, 8));
    // A fork of the checkpoint.
    let fc = post(
        format!("/v1/sessions/{a}/fork"),
        json!({"checkpoint": "c1"}),
    )["id"]
        .as_str()
        .unwrap()
        .to_string();
    append(&fc, &at_c1, &tokens(13, 1));
    // A session created with tokens computes them with its first append, which returns only its own.
    let c = new_session(json!({"model": "tiny", "tokens": tokens(14, 10)}));
    append(&c, &tokens(14, 10), &tokens(15, 5));
    // The session object and the listing.
    let v = s.request("GET", &format!("/v1/sessions/{a}"), b"").json();
    assert_eq!(v["token_ids"], json!(t20));
    assert_eq!(v["checkpoints"][0]["name"], "c1");
    let listed = s.request("GET", "/v1/sessions", b"").json();
    assert!(
        listed["data"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["id"] == a.as_str() && x["model"] == "tiny")
    );
    // Deactivation keeps the sessions (tokens and checkpoints, no pages); the next append computes again.
    let r = s.post_json("/v1/models/tiny/deactivate", &json!({}));
    assert_eq!(r.status, 200, "{}", r.text());
    let r = s.post_json("/v1/models/tiny/activate", &json!({}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(pages(), 0.0);
    append(&a, &t20, &tokens(16, 4));
    post(
        format!("/v1/sessions/{a}/rewind"),
        json!({"checkpoint": "c1"}),
    );
    append(&a, &at_c1, &tokens(17, 2));
    // Errors.
    let r = s.post_json(
        &format!("/v1/sessions/{a}/append"),
        &json!({"tokens": [300]}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    let r = s.post_json(&format!("/v1/sessions/{a}/append"), &json!({}));
    assert_eq!(r.status, 400, "{}", r.text());
    let r = s.post_json(
        &format!("/v1/sessions/{a}/append"),
        &json!({"tokens": vec![1; 300]}),
    );
    assert_eq!(r.status, 413, "{}", r.text());
    let r = s.post_json("/v1/sessions/sess-999999/append", &json!({"tokens": [1]}));
    assert_eq!(r.status, 404, "{}", r.text());
    for id in [&a, &f, &ff, &fc, &c] {
        let r = s.request("DELETE", &format!("/v1/sessions/{id}"), b"");
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert_eq!(pages(), 0.0);
    s.healthy();
}
