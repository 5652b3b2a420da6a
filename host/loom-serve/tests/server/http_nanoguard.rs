//! NanoGuard (`packages/nanoguard`, the metatronnanoguard 0.1.0 prompt-injection classifier) served by the real
//! binary on `/classify` and `/v1/decisions`, against an independent float64 numpy implementation
//! (`packages/nanoguard/oracle/oracle.py`, written from the wheel's model.py and scanner.py, tokenising with
//! tiktoken itself). Needs `scripts/fetch-models.sh` (which `scripts/test.sh` runs): the wheel, its converted
//! checkpoint and tokenizer, and the oracle's Python packages live in `.models/nanoguard`.
//!
//! - the corpus (`oracle/corpus.jsonl`, 248 texts: benign requests, injection attempts, edge cases, texts of
//!   511, 512 and 513 tokens and truncated ones) through `/classify` in requests of 1 to 16 inputs from two
//!   concurrent clients: every probability within 1e-5 of the oracle's, token counts and truncation as the
//!   oracle's; a subset through `/v1/decisions` with the choices in both orders;
//! - the converted tokenizer.json (the `tokenizers` crate, the server's) gives tiktoken's ids on every text;
//! - the hand-labelled set (`oracle/labelled.jsonl`, 44 prompts): predictions as the oracle's, accuracy
//!   reported (and at least 0.85: the model gets 40 of 44);
//! - errors: choices other than safe/injection, a model without class names, bad inputs.
//!
//! The oracle's outputs are cached under `.models/nanoguard/oracle-cache/KEY` (KEY from the oracle, the texts
//! and the converted checkpoint's stamp): the float64 forward pass takes about 0.4 s a text on two cores.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use serde_json::{Value, json};

use crate::support::{TestServer, repo_root};

const MODEL: &str = "nanoguard";
const TOL: f64 = 1e-5;

fn models_dir() -> PathBuf {
    repo_root().join(".models/nanoguard")
}

fn package() -> PathBuf {
    repo_root().join("packages/nanoguard")
}

fn require_fetched() {
    for p in [
        models_dir().join("nanoguard/assets/model.pt"),
        models_dir().join("converted/stamp"),
        package().join("model/model.safetensors"),
        package().join("tokenizer.json"),
    ] {
        assert!(
            p.exists(),
            "{} is missing: run `bash scripts/fetch-models.sh` first (scripts/test.sh does)",
            p.display()
        );
    }
}

/// One text's oracle output: tokens used, tokens before truncation, the ids used, [p_safe, p_injection].
#[derive(Debug, Clone)]
struct Row {
    n: u64,
    total: u64,
    ids: Vec<u32>,
    probs: [f64; 2],
}

fn texts_of(file: &str) -> Vec<String> {
    std::fs::read_to_string(package().join("oracle").join(file))
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            match v {
                Value::String(s) => s,
                v => v["text"].as_str().unwrap().to_string(),
            }
        })
        .collect()
}

/// The oracle's rows for `texts` (cached; see the module's documentation).
fn run_oracle(name: &str, texts: &[String]) -> Vec<Row> {
    require_fetched();
    let script = package().join("oracle/oracle.py");
    let corpus: String = texts
        .iter()
        .map(|t| serde_json::to_string(t).unwrap() + "\n")
        .collect();
    let mut key = 0xcbf2_9ce4_8422_2325u64; // FNV-1a
    for bytes in [
        std::fs::read(&script).unwrap(),
        corpus.as_bytes().to_vec(),
        std::fs::read(models_dir().join("converted/stamp")).unwrap(),
    ] {
        for b in bytes {
            key = (key ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    let dir = models_dir().join(format!("oracle-cache/{name}-{key:016x}"));
    let out = dir.join("oracle.json");
    if !out.exists() {
        std::fs::create_dir_all(&dir).unwrap();
        let input = dir.join("texts.jsonl");
        std::fs::write(&input, &corpus).unwrap();
        let t0 = std::time::Instant::now();
        let st = Command::new("python3")
            .arg(&script)
            .arg(models_dir().join("converted"))
            .arg(models_dir())
            .arg(&input)
            .arg(&out)
            .env("PYTHONPATH", models_dir())
            .status()
            .expect("running python3 (the numpy oracle)");
        assert!(st.success(), "the numpy oracle failed: {st}");
        eprintln!(
            "nanoguard oracle ({name}): {:.1} s",
            t0.elapsed().as_secs_f64()
        );
    }
    let v: Vec<Value> = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    assert_eq!(v.len(), texts.len(), "oracle rows");
    v.iter()
        .map(|r| Row {
            n: r["n"].as_u64().unwrap(),
            total: r["total"].as_u64().unwrap(),
            ids: r["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i.as_u64().unwrap() as u32)
                .collect(),
            probs: [
                r["probs"][0].as_f64().unwrap(),
                r["probs"][1].as_f64().unwrap(),
            ],
        })
        .collect()
}

type Set = (Vec<String>, Vec<Row>);

fn corpus() -> &'static Set {
    static C: std::sync::OnceLock<Set> = std::sync::OnceLock::new();
    C.get_or_init(|| {
        let t = texts_of("corpus.jsonl");
        let r = run_oracle("corpus", &t);
        (t, r)
    })
}

fn labelled() -> &'static (Vec<String>, Vec<String>, Vec<Row>) {
    static L: std::sync::OnceLock<(Vec<String>, Vec<String>, Vec<Row>)> =
        std::sync::OnceLock::new();
    L.get_or_init(|| {
        let raw = std::fs::read_to_string(package().join("oracle/labelled.jsonl")).unwrap();
        let (mut texts, mut labels) = (vec![], vec![]);
        for l in raw.lines().filter(|l| !l.trim().is_empty()) {
            let v: Value = serde_json::from_str(l).unwrap();
            texts.push(v["text"].as_str().unwrap().to_string());
            labels.push(v["label"].as_str().unwrap().to_string());
        }
        let rows = run_oracle("labelled", &texts);
        (texts, labels, rows)
    })
}

fn start(tag: &str, extra_models: &[&str]) -> TestServer {
    require_fetched();
    let mut models = vec![package()];
    models.extend(
        extra_models
            .iter()
            .map(|m| repo_root().join("packages").join(m)),
    );
    TestServer::start_models(tag, &models, &[])
}

/// `/classify` of `texts`: (label, probs, num_classes) per input, and the usage object.
fn classify(s: &TestServer, texts: &[String]) -> (Vec<(String, [f64; 2])>, Value) {
    let r = s.post_json("/classify", &json!({"model": MODEL, "input": texts}));
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "list");
    assert_eq!(v["model"], MODEL);
    assert!(v["id"].as_str().unwrap().starts_with("classify-"));
    assert!(v["created"].as_u64().unwrap() > 1_700_000_000);
    let data = v["data"].as_array().expect("data");
    assert_eq!(data.len(), texts.len());
    let out = data
        .iter()
        .enumerate()
        .map(|(i, d)| {
            assert_eq!(d["index"].as_u64(), Some(i as u64), "index order");
            assert_eq!(d["num_classes"].as_u64(), Some(2));
            let p = d["probs"].as_array().unwrap();
            assert_eq!(p.len(), 2);
            let probs = [p[0].as_f64().unwrap(), p[1].as_f64().unwrap()];
            let label = d["label"].as_str().unwrap().to_string();
            let want = if probs[1] > probs[0] {
                "injection"
            } else {
                "safe"
            };
            assert_eq!(label, want, "input {i}: label is the argmax");
            (label, probs)
        })
        .collect();
    (out, v["usage"].clone())
}

fn check_probs(what: &str, got: [f64; 2], want: [f64; 2]) -> f64 {
    let d = (got[0] - want[0]).abs().max((got[1] - want[1]).abs());
    assert!(
        d <= TOL,
        "{what}: probabilities {got:?}, oracle {want:?} (|diff| {d:e} > {TOL:e})"
    );
    assert!((got[0] + got[1] - 1.0).abs() < 1e-6, "{what}: sum {got:?}");
    d
}

#[test]
fn nanoguard_corpus_matches_the_numpy_oracle() {
    let (texts, want) = corpus();
    assert!(texts.len() >= 200);
    assert!(
        want.iter().filter(|r| r.total > 512).count() >= 8,
        "truncated texts"
    );
    assert!(want.iter().any(|r| r.total == 512) && want.iter().any(|r| r.total == 511));
    assert!(want.iter().any(|r| r.n == 1), "a text of BOS only");
    let server = Arc::new(start("nanoguard-corpus", &[]));
    let t0 = std::time::Instant::now();
    let sizes = [1usize, 5, 16, 3, 8, 2, 12, 1];
    let mut chunks: Vec<(usize, usize)> = vec![];
    let (mut at, mut k) = (0, 0);
    while at < texts.len() {
        let n = sizes[k % sizes.len()].min(texts.len() - at);
        chunks.push((at, n));
        at += n;
        k += 1;
    }
    let texts = Arc::new(texts.clone());
    let chunks = Arc::new(chunks);
    let clients: Vec<_> = (0..2)
        .map(|c| {
            let (server, texts, chunks) = (server.clone(), texts.clone(), chunks.clone());
            std::thread::spawn(move || {
                let mut got = vec![];
                for &(at, n) in chunks.iter().skip(c).step_by(2) {
                    let (rows, usage) = classify(&server, &texts[at..at + n]);
                    got.push((at, rows, usage));
                }
                got
            })
        })
        .collect();
    let mut results: Vec<_> = clients
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    results.sort_by_key(|(at, _, _)| *at);
    eprintln!(
        "nanoguard: {} texts through /classify in {:.1} s",
        texts.len(),
        t0.elapsed().as_secs_f64()
    );
    let mut worst = (0.0f64, 0usize);
    for (at, rows, usage) in &results {
        let mut used = 0;
        let mut given = 0;
        let mut truncated = vec![];
        for (j, (_, p)) in rows.iter().enumerate() {
            let i = at + j;
            let w = &want[i];
            let d = check_probs(&format!("text {i} ({} tokens)", w.total), *p, w.probs);
            if d > worst.0 {
                worst = (d, i);
            }
            used += w.n;
            given += w.total;
            if w.total > w.n {
                truncated.push(json!({"index": j, "input_tokens": w.total, "used_tokens": w.n}));
            }
        }
        assert_eq!(usage["prompt_tokens"].as_u64(), Some(used), "{usage}");
        assert_eq!(usage["total_tokens"].as_u64(), Some(used), "{usage}");
        assert_eq!(usage["input_tokens"].as_u64(), Some(given), "{usage}");
        assert_eq!(
            usage["truncated"],
            json!(truncated),
            "texts {at}..: {usage}"
        );
    }
    eprintln!(
        "nanoguard: worst |p - oracle| {:.3e} (text {}), {} truncated",
        worst.0,
        worst.1,
        want.iter().filter(|r| r.total > 512).count()
    );
    // /v1/decisions: the typed question form, choices in both orders, on short, window-limit and truncated texts.
    let pick: Vec<usize> = (0..texts.len())
        .filter(|&i| i % 37 == 3 || want[i].total >= 511)
        .take(12)
        .collect();
    let questions: serde_json::Map<String, Value> = pick
        .iter()
        .enumerate()
        .map(|(k, &i)| {
            let choices = if k % 2 == 0 {
                json!(["safe", "injection"])
            } else {
                json!(["injection", "safe"])
            };
            (
                format!("q{i}"),
                json!({"type": "choice", "instructions": texts[i], "choices": choices}),
            )
        })
        .collect();
    let r = server.post_json(
        "/v1/decisions",
        &json!({"model": MODEL, "questions": questions}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    for &i in &pick {
        let a = &v["answers"][format!("q{i}")];
        let p = [
            a["probabilities"]["safe"].as_f64().unwrap(),
            a["probabilities"]["injection"].as_f64().unwrap(),
        ];
        check_probs(&format!("question on text {i}"), p, want[i].probs);
        let best = if p[1] > p[0] { "injection" } else { "safe" };
        assert_eq!(a["choice"], best, "question on text {i}: {a}");
    }
    server.healthy();
}

#[test]
fn nanoguard_tokenizer_json_gives_tiktokens_ids() {
    let (texts, want) = corpus();
    let (ltexts, _, lwant) = labelled();
    // What the server loads: the tokenizers crate with special tokens as ordinary text and BOS added.
    let mut tok = tokenizers::Tokenizer::from_file(package().join("tokenizer.json")).unwrap();
    tok.set_encode_special_tokens(true);
    let mut checked = 0;
    for (t, w) in texts.iter().zip(want).chain(ltexts.iter().zip(lwant)) {
        let ids = tok.encode(t.as_str(), true).unwrap().get_ids().to_vec();
        assert_eq!(ids.len() as u64, w.total, "token count of {t:?}");
        assert_eq!(&ids[..w.n as usize], &w.ids[..], "ids of {t:?}");
        checked += ids.len();
    }
    eprintln!("nanoguard: {checked} ids equal tiktoken's");
}

#[test]
fn nanoguard_labelled_set_and_errors() {
    let (texts, labels, want) = labelled();
    let server = start("nanoguard-labelled", &["arith-decision", "arith-embed"]);
    let (rows, _) = classify(&server, texts);
    let mut right = 0;
    for (i, ((label, p), truth)) in rows.iter().zip(labels).enumerate() {
        check_probs(&format!("labelled prompt {i}"), *p, want[i].probs);
        let mark = if label == truth {
            right += 1;
            "  "
        } else {
            "X "
        };
        eprintln!(
            "{mark}{truth:>9} -> {label:<9} p(injection) {:.4}  {}",
            p[1],
            texts[i].chars().take(70).collect::<String>()
        );
    }
    let acc = f64::from(right) / texts.len() as f64;
    eprintln!(
        "nanoguard: labelled set {right}/{} right ({:.1} %)",
        texts.len(),
        100.0 * acc
    );
    assert!(acc >= 0.85, "accuracy {acc} on the labelled set");

    let bad = |path: &str, body: Value, status: u16, needle: &str| {
        let r = server.post_json(path, &body);
        assert_eq!(r.status, status, "{body}: {}", r.text());
        assert!(
            r.text().contains(needle),
            "{body}: {} lacks {needle:?}",
            r.text()
        );
    };
    let q = |choices: Value| json!({"model": MODEL, "questions": {"a": {"type": "choice", "instructions": "hi", "choices": choices}}});
    bad(
        "/v1/decisions",
        q(json!(["safe", "unsafe"])),
        400,
        "\\\"safe\\\" and \\\"injection\\\"",
    );
    bad(
        "/v1/decisions",
        q(json!(["safe", "injection", "other"])),
        400,
        "exactly two choices",
    );
    bad(
        "/classify",
        json!({"model": MODEL}),
        400,
        "`input` is required",
    );
    bad(
        "/classify",
        json!({"model": MODEL, "input": []}),
        400,
        "empty list",
    );
    bad(
        "/classify",
        json!({"model": MODEL, "input": [1, 2]}),
        400,
        "a string or a list of strings",
    );
    bad(
        "/classify",
        json!({"model": "arith-decision", "input": "x"}),
        501,
        "options.labels",
    );
    bad(
        "/classify",
        json!({"model": "arith-embed", "input": "x"}),
        501,
        "serves embeddings",
    );
    bad(
        "/classify",
        json!({"model": "nope", "input": "x"}),
        404,
        "nope",
    );
    // An empty text is BOS alone, as the wheel's tokenizer gives it.
    let (rows, usage) = classify(&server, &[String::new()]);
    assert_eq!(usage["prompt_tokens"], 1);
    assert!(rows[0].1[0] > 0.0 && rows[0].1[1] > 0.0);
    server.healthy();
}
