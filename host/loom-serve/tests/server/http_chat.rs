//! Retained text through the server, with `packages/arith-chat`: a toy model whose next token is a function of
//! the whole sequence read back from the server's page pool, checked against an independent implementation of
//! that function here (so paging, chunked prefill, commit and batching mistakes show as wrong text).

use crate::support::TestServer;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Write};
use std::time::{Duration, Instant};

/// The toy model: the next byte after `seq`.
fn next(seq: &[u8]) -> u8 {
    let h = seq
        .iter()
        .enumerate()
        .map(|(p, &t)| (u64::from(t) + p as u64 + 1) * (p as u64 + 1))
        .sum::<u64>()
        % 26;
    if h == 0 { b'.' } else { b'a' + h as u8 }
}

/// Greedy generation: up to `max` tokens, stopping after the terminal '.' (not part of the text).
fn oracle(prompt: &[u8], max: usize) -> (String, &'static str, usize) {
    let mut seq = prompt.to_vec();
    let mut out = String::new();
    for i in 0..max {
        let t = next(&seq);
        seq.push(t);
        if t == b'.' {
            return (out, "stop", i + 1);
        }
        out.push(t as char);
    }
    (out, "length", max)
}

fn start(tag: &str, extra: &[&str]) -> TestServer {
    // TestServer::start copies the example packages (arith-chat among them) to this directory.
    let pkg = std::env::temp_dir()
        .join(format!("loom-serve-test-{}-{tag}", std::process::id()))
        .join("arith-chat")
        .display()
        .to_string();
    let mut args = vec!["--model", pkg.as_str()];
    args.extend_from_slice(extra);
    TestServer::start(tag, &args)
}

fn complete(s: &TestServer, body: Value) -> Value {
    let r = s.post_json("/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

/// The data lines of a streamed response, parsed (without the final `[DONE]`, which is checked).
fn stream(s: &TestServer, path: &str, body: Value) -> Vec<Value> {
    let r = s.post_json(path, &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let text = r.text();
    let data: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{text}");
    data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

#[test]
fn greedy_text_matches_the_oracle_across_pages_and_prefill_chunks() {
    let s = start("chat-greedy", &[]);
    // Prompts shorter than a page, spanning pages, and longer than an epoch's 256 tokens (chunked prefill).
    let long: String = (0..700)
        .map(|i| (b'a' + (i * 7 % 26) as u8) as char)
        .collect();
    for prompt in [
        "hello",
        "a",
        "The quick brown fox jumps over the lazy dog",
        long.as_str(),
    ] {
        for max in [1usize, 17, 40] {
            let v = complete(
                &s,
                json!({"model": "arith-chat", "prompt": prompt, "max_tokens": max, "temperature": 0}),
            );
            let (text, finish, n) = oracle(prompt.as_bytes(), max);
            assert_eq!(v["choices"][0]["text"], text, "prompt {prompt:?} max {max}");
            assert_eq!(v["choices"][0]["finish_reason"], finish);
            assert_eq!(v["usage"]["prompt_tokens"], prompt.len());
            assert_eq!(v["usage"]["completion_tokens"], n);
        }
    }
    // The pool is empty again once nothing runs.
    assert_eq!(s.metric("loom_text_pages_used{model=\"arith-chat\"}"), 0.0);
    s.healthy();
}

#[test]
fn streamed_equals_whole_and_chat_renders_the_template() {
    let s = start("chat-stream", &[]);
    let body = json!({"model": "arith-chat", "messages": [{"role": "user", "content": "hi there"}],
                      "max_tokens": 30, "temperature": 0});
    let whole = s.post_json("/v1/chat/completions", &body).json();
    let msg = whole["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    // The package's template: "role: content\n" per message, then "assistant: ".
    let (want, finish, n) = oracle(b"user: hi there\nassistant: ", 30);
    assert_eq!(msg, want);
    assert_eq!(whole["choices"][0]["finish_reason"], finish);
    assert_eq!(whole["object"], "chat.completion");
    let mut b = body.clone();
    b["stream"] = json!(true);
    b["stream_options"] = json!({"include_usage": true});
    let chunks = stream(&s, "/v1/chat/completions", b);
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, msg);
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    let last_choice = &chunks[chunks.len() - 2];
    assert_eq!(last_choice["choices"][0]["finish_reason"], finish);
    let usage = &chunks[chunks.len() - 1];
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], n);
    assert_eq!(usage["usage"]["prompt_tokens"], 26);
    // Latency histograms: one first token per response so far, and the intervals after them.
    let text = s.request("GET", "/metrics", b"").text();
    assert!(
        text.contains("# TYPE loom_text_time_to_first_token_seconds histogram"),
        "{text}"
    );
    let count = s.metric("loom_text_time_to_first_token_seconds_count{model=\"arith-chat\"}");
    assert_eq!(count, 2.0);
    assert_eq!(
        s.metric("loom_text_time_to_first_token_seconds_bucket{model=\"arith-chat\",le=\"+Inf\"}"),
        2.0
    );
    assert_eq!(
        s.metric("loom_text_inter_token_latency_seconds_count{model=\"arith-chat\"}"),
        2.0 * (n as f64 - 1.0)
    );
    s.healthy();
}

#[test]
fn batched_requests_get_their_solo_results_greedy_and_seeded() {
    let s = start("chat-batch", &[]);
    let prompts: Vec<String> = (0..8)
        .map(|i| format!("request number {i} {}", "xyz".repeat(i * 9)))
        .collect();
    let body = |p: &str, seeded: bool| {
        if seeded {
            json!({"model": "arith-chat", "prompt": p, "max_tokens": 24, "temperature": 1.5, "seed": 7})
        } else {
            json!({"model": "arith-chat", "prompt": p, "max_tokens": 24, "temperature": 0})
        }
    };
    for seeded in [false, true] {
        let solo: Vec<Value> = prompts
            .iter()
            .map(|p| complete(&s, body(p, seeded))["choices"][0].clone())
            .collect();
        // The same requests, staggered, concurrently: they share epochs.
        let together: Vec<Value> = std::thread::scope(|sc| {
            let hs: Vec<_> = prompts
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let s = &s;
                    let b = body(p, seeded);
                    sc.spawn(move || {
                        std::thread::sleep(Duration::from_millis(3 * i as u64));
                        complete(s, b)["choices"][0].clone()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(solo, together, "seeded: {seeded}");
        if !seeded {
            for (p, c) in prompts.iter().zip(&solo) {
                assert_eq!(c["text"], oracle(p.as_bytes(), 24).0);
            }
        }
    }
    assert!(s.metric("loom_text_epochs_total{model=\"arith-chat\"}") > 0.0);
    s.healthy();
}

#[test]
fn stop_strings_eos_n_and_logprobs() {
    let s = start("chat-stop", &[]);
    let prompt = (0..200)
        .map(|i| format!("q{i}"))
        .find(|p| oracle(p.as_bytes(), 40).1 == "length")
        .expect("some prompt runs 40 tokens without '.'");
    let (full, _, _) = oracle(prompt.as_bytes(), 40);
    // A stop string spanning two generated tokens: the text ends before it.
    let stop: String = full[5..7].to_string();
    let v = complete(
        &s,
        json!({"model": "arith-chat", "prompt": prompt, "max_tokens": 40, "temperature": 0, "stop": [stop]}),
    );
    let want = &full[..full.find(&stop).unwrap()];
    assert_eq!(v["choices"][0]["text"], want);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    // A prompt whose continuation reaches the terminal '.': found by the oracle.
    let eos_prompt = (0..200)
        .map(|i| format!("p{i}"))
        .find(|p| oracle(p.as_bytes(), 20).1 == "stop")
        .expect("some prompt reaches '.' within 20 tokens");
    let (text, _, n) = oracle(eos_prompt.as_bytes(), 20);
    let v = complete(
        &s,
        json!({"model": "arith-chat", "prompt": eos_prompt, "max_tokens": 20, "temperature": 0}),
    );
    assert_eq!(v["choices"][0]["text"], text);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["completion_tokens"], n);
    let v = complete(
        &s,
        json!({"model": "arith-chat", "prompt": eos_prompt, "max_tokens": 20, "temperature": 0, "ignore_eos": true}),
    );
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert!(v["choices"][0]["text"].as_str().unwrap().contains('.'));
    // n = 3 seeded choices: three streams of one seed, each reproducible.
    let b = json!({"model": "arith-chat", "prompt": "abc", "max_tokens": 12, "temperature": 2.0, "seed": 11, "n": 3, "ignore_eos": true});
    let a = complete(&s, b.clone());
    let again = complete(&s, b);
    assert_eq!(a["choices"], again["choices"]);
    let texts: Vec<&str> = (0..3)
        .map(|i| a["choices"][i]["text"].as_str().unwrap())
        .collect();
    assert!(texts[0] != texts[1] || texts[1] != texts[2], "{texts:?}");
    assert_eq!(a["usage"]["completion_tokens"], 36);
    // Log probabilities of the raw distribution: the greedy token's is the largest.
    let v = complete(
        &s,
        json!({"model": "arith-chat", "prompt": prompt, "max_tokens": 3, "temperature": 0, "logprobs": 2}),
    );
    let lp = &v["choices"][0]["logprobs"];
    let tokens: Vec<String> = lp["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_string())
        .collect();
    assert_eq!(tokens.concat(), oracle(prompt.as_bytes(), 3).0);
    for (i, t) in tokens.iter().enumerate() {
        let top = lp["top_logprobs"][i].as_object().unwrap();
        assert_eq!(top.len(), 2);
        let best = top
            .iter()
            .max_by(|a, b| a.1.as_f64().unwrap().total_cmp(&b.1.as_f64().unwrap()))
            .unwrap();
        assert_eq!(best.0, t);
        assert_eq!(lp["token_logprobs"][i], *best.1);
    }
    s.healthy();
}

#[test]
fn bad_requests_are_clear_and_the_model_keeps_serving() {
    let s = start("chat-errors", &[]);
    for (body, status, want) in [
        (
            json!({"model": "arith-chat", "prompt": "x", "temperature": 3}),
            400,
            "`temperature`",
        ),
        (
            json!({"model": "arith-chat", "prompt": "x", "temperature": "hot"}),
            400,
            "`temperature` must be a number",
        ),
        (
            json!({"model": "arith-chat", "prompt": "x", "stop": 5}),
            400,
            "`stop`",
        ),
        (
            json!({"model": "arith-chat", "prompt": [300]}),
            400,
            "outside the vocabulary",
        ),
        (json!({"model": "arith-chat", "prompt": ""}), 400, "empty"),
        (
            json!({"model": "arith-chat", "prompt": "x".repeat(2000)}),
            413,
            "at most 1023",
        ),
        (json!({"model": "arith-chat"}), 400, "`prompt`"),
        (json!({"model": "nope", "prompt": "x"}), 404, "nope"),
        (
            json!({"model": "arith-chat", "messages": [{"role": "robot", "content": "x"}]}),
            400,
            "messages[0].role",
        ),
    ] {
        let path = if body.get("messages").is_some() {
            "/v1/chat/completions"
        } else {
            "/v1/completions"
        };
        let r = s.post_json(path, &body);
        assert_eq!(r.status, status, "{body}: {}", r.text());
        assert!(r.text().contains(want), "{body}: {}", r.text());
    }
    // Unknown fields are tolerated, as OpenAI's API does.
    let v = complete(
        &s,
        json!({"model": "arith-chat", "prompt": "hello", "max_tokens": 2, "temperature": 0,
                                "user": "someone", "suffix": null}),
    );
    assert_eq!(v["choices"][0]["text"], oracle(b"hello", 2).0);
    s.healthy();
}

/// Opens a streamed completion and reads `lines` data lines, then drops the connection.
fn abandon_stream(s: &TestServer, prompt: &str, lines: usize) {
    let body =
        json!({"model": "arith-chat", "prompt": prompt, "max_tokens": 1000, "temperature": 0,
                      "ignore_eos": true, "stream": true})
        .to_string();
    let mut c = std::net::TcpStream::connect(&s.addr).unwrap();
    write!(
        c,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut r = BufReader::new(c.try_clone().unwrap());
    let mut seen = 0;
    let mut line = String::new();
    while seen < lines {
        line.clear();
        if r.read_line(&mut line).unwrap() == 0 {
            break;
        }
        if line.starts_with("data: ") {
            seen += 1;
        }
    }
    drop(r);
    let _ = c.shutdown(std::net::Shutdown::Both);
}

#[test]
fn cancelled_streams_free_their_pages() {
    let s = start("chat-cancel", &[]);
    // 1,000 streams abandoned after their first chunks, four clients at a time.
    std::thread::scope(|sc| {
        for c in 0..4 {
            let s = &s;
            sc.spawn(move || {
                for i in 0..250 {
                    abandon_stream(s, &format!("cancel me {c} {i}"), 2);
                }
            });
        }
    });
    let t = Instant::now();
    loop {
        let used = s.metric("loom_text_pages_used{model=\"arith-chat\"}");
        let running = s.metric("loom_text_running{model=\"arith-chat\"}");
        if used == 0.0 && running == 0.0 {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "{used} pages still used, {running} running"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let cancelled = s.metric("loom_text_requests_cancelled_total{model=\"arith-chat\"}");
    assert!(
        cancelled >= 900.0,
        "{cancelled} of 1,000 streams were cancelled (the others finished first)"
    );
    // A request after them is served in full.
    let v = complete(
        &s,
        json!({"model": "arith-chat", "prompt": "after", "max_tokens": 10, "temperature": 0}),
    );
    assert_eq!(v["choices"][0]["text"], oracle(b"after", 10).0);
    // Unregister and register again: the pool goes with the model and comes back.
    assert_eq!(
        s.request("DELETE", "/v1/models/arith-chat", b"").status,
        200
    );
    let base = s.dir.join("arith-chat");
    let r = s.post_json("/v1/models", &json!({"base": base.display().to_string()}));
    assert_eq!(r.status, 201, "{}", r.text());
    let v = complete(
        &s,
        json!({"model": "arith-chat", "prompt": "after", "max_tokens": 10, "temperature": 0}),
    );
    assert_eq!(v["choices"][0]["text"], oracle(b"after", 10).0);
    s.healthy();
}

/// A pool too small for every running sequence: sequences that need pages take the youngest ones', which are
/// recomputed from their tokens later; every text is still the oracle's.
#[test]
fn a_small_pool_preempts_and_recomputes_without_changing_any_text() {
    let s = start("chat-preempt", &[]);
    let base = s.dir.join("arith-chat-small");
    crate::support::copy_dir(&s.dir.join("arith-chat"), &base);
    let mut doc: Value =
        serde_json::from_slice(&std::fs::read(base.join("model.json")).unwrap()).unwrap();
    // 16 words of state per token (1 KiB pages, like a small transformer's keys and values) in a 200 KiB
    // budget: a pool of 150 pages (the pool takes 3/4) and room for an epoch's buffers.
    doc["name"] = json!("arith-chat-small");
    doc["memory"]["device_bytes"] = json!(204800);
    doc["options"]["epoch_spans"] = json!(4);
    doc["options"]["epoch_tokens"] = json!(64);
    doc["options"]["token_words"] = json!(16);
    std::fs::write(base.join("model.json"), doc.to_string()).unwrap();
    let r = s.post_json("/v1/models", &json!({"base": base.display().to_string()}));
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(
        s.metric("loom_text_pages_capacity{model=\"arith-chat-small\"}"),
        150.0
    );
    // Four prompts of 500 tokens (32 pages each) are admitted together; growing to 1,000 tokens they would
    // need 4 x 63 pages.
    let prompts: Vec<String> = (0..4)
        .map(|i| {
            (0..500)
                .map(|k| (b'a' + ((k * (i + 3)) % 26) as u8) as char)
                .collect()
        })
        .collect();
    let got: Vec<Value> = std::thread::scope(|sc| {
        let hs: Vec<_> = prompts
            .iter()
            .map(|p| {
                let s = &s;
                sc.spawn(move || {
                    complete(
                        s,
                        json!({"model": "arith-chat-small", "prompt": p, "max_tokens": 500,
                               "temperature": 0, "ignore_eos": true}),
                    )
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (p, v) in prompts.iter().zip(&got) {
        let mut seq = p.as_bytes().to_vec();
        let mut want = String::new();
        for _ in 0..500 {
            let t = next(&seq);
            seq.push(t);
            want.push(t as char);
        }
        assert_eq!(v["choices"][0]["text"], want);
    }
    assert!(
        s.metric("loom_text_preemptions_total{model=\"arith-chat-small\"}") >= 1.0,
        "{}",
        s.request("GET", "/metrics", b"").text()
    );
    assert_eq!(
        s.metric("loom_text_pages_used{model=\"arith-chat-small\"}"),
        0.0
    );
    s.healthy();
}

/// Prefix sharing: requests that start with the same tokens read the same full pages; their prefill is not
/// recomputed, and their text is still the oracle's.
#[test]
fn shared_prefixes_are_stored_once_and_not_recomputed() {
    let s = start("chat-prefix", &[]);
    let m = |name: &str| s.metric(&format!("{name}{{model=\"arith-chat\"}}"));
    let system: String = (0..500)
        .map(|k| (b'a' + ((k * 5 + 3) % 26) as u8) as char)
        .collect();
    let first = format!("{system} first question");
    let v = complete(
        &s,
        json!({"model": "arith-chat", "prompt": first, "max_tokens": 8, "temperature": 0}),
    );
    assert_eq!(v["choices"][0]["text"], oracle(first.as_bytes(), 8).0);
    assert_eq!(m("loom_text_prefix_hit_tokens_total"), 0.0);
    // The system prompt's 31 full pages (496 tokens) are found for every later request that starts with it.
    let prefill0 = m("loom_text_prefill_tokens_total");
    let prompts: Vec<String> = (0..16).map(|i| format!("{system} question {i}?")).collect();
    let got: Vec<Value> = std::thread::scope(|sc| {
        let hs: Vec<_> = prompts
            .iter()
            .map(|p| {
                let s = &s;
                sc.spawn(move || {
                    complete(s, json!({"model": "arith-chat", "prompt": p, "max_tokens": 8, "temperature": 0}))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (p, v) in prompts.iter().zip(&got) {
        assert_eq!(v["choices"][0]["text"], oracle(p.as_bytes(), 8).0, "{p}");
    }
    let hits = m("loom_text_prefix_hit_tokens_total");
    assert_eq!(hits, 16.0 * 496.0);
    let computed = m("loom_text_prefill_tokens_total") - prefill0;
    let total: usize = prompts.iter().map(String::len).sum();
    assert_eq!(
        computed,
        (total - 16 * 496) as f64,
        "only the suffixes were computed"
    );
    // The shared pages stay cached (held once) after the requests; nothing is held by a sequence.
    assert_eq!(m("loom_text_pages_used"), 0.0);
    assert!(m("loom_text_prefix_cache_pages") >= 31.0);
    s.healthy();
}

/// Registers a copy of arith-chat named `name` with `speculative_tokens` proposals (prompt lookup).
fn register_speculative(s: &TestServer, name: &str, k: u64) {
    let base = s.dir.join("arith-chat");
    let r = s.post_json(
        "/v1/models",
        &json!({"name": name, "base": base.display().to_string(),
                "options": {"epoch_tokens": 256, "epoch_spans": 8, "page_tokens": 16, "context": 1024,
                            "multi_row_logits": true, "speculative_tokens": k}}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
}

#[test]
fn speculative_verify_gives_exactly_what_plain_decoding_gives() {
    let s = start("chat-speculative", &[]);
    register_speculative(&s, "spec", 4);
    // A bad value is refused at registration, naming the option.
    for bad in [json!(-1), json!(1000), json!("4")] {
        let r = s.post_json(
            "/v1/models",
            &json!({"name": "bad", "base": s.dir.join("arith-chat").display().to_string(),
                    "options": {"speculative_tokens": bad}}),
        );
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
        assert!(
            r.text().contains("options.speculative_tokens"),
            "{}",
            r.text()
        );
    }
    // Speculation needs a package that declares multi-row logits.
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "bad", "base": s.dir.join("arith-chat").display().to_string(),
                "options": {"speculative_tokens": 2}}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        r.text().contains("options.multi_row_logits"),
        "{}",
        r.text()
    );
    // Greedy arith-chat falls into cycles that prompt lookup proposes (and the prompts repeat themselves), so
    // proposals are verified, some kept and some rejected, across page boundaries and prompt chunks.
    let prompts: Vec<String> = (0..6)
        .map(|i| format!("{}{}", "abc".repeat(4 + i * 7), "xyz".repeat(i)))
        .collect();
    for p in &prompts {
        let (want, finish, _) = oracle(p.as_bytes(), 300);
        for model in ["arith-chat", "spec"] {
            let v = complete(
                &s,
                json!({"model": model, "prompt": p, "max_tokens": 300, "temperature": 0}),
            );
            assert_eq!(v["choices"][0]["text"], want, "{model} {p}");
            assert_eq!(v["choices"][0]["finish_reason"], finish, "{model} {p}");
        }
    }
    let proposed = s.metric("loom_text_speculative_proposed_tokens_total{model=\"spec\"}");
    let accepted = s.metric("loom_text_speculative_accepted_tokens_total{model=\"spec\"}");
    assert!(
        accepted > 20.0 && accepted < proposed,
        "{accepted} of {proposed} proposals kept"
    );
    assert_eq!(
        s.metric("loom_text_speculative_proposed_tokens_total{model=\"arith-chat\"}"),
        0.0
    );
    // Seeded sampling draws each token from the same logits with the same random stream, so it is the same
    // with and without proposals; so are n > 1, stop strings, log probabilities, max_tokens and the usage,
    // alone and batched (8 staggered requests).
    let bodies: Vec<Value> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mut b = json!({"prompt": p, "max_tokens": 40 + i, "temperature": 0.7, "seed": i,
                               "n": 1 + i % 3, "logprobs": 2, "ignore_eos": i % 2 == 0});
            if i == 3 {
                b["stop"] = json!(["kk", "q."]);
            }
            b
        })
        .collect();
    let run = |model: &str, together: bool| -> Vec<Value> {
        let one = |b: &Value| {
            let mut b = b.clone();
            b["model"] = json!(model);
            let v = complete(&s, b);
            (v["choices"].clone(), v["usage"].clone())
        };
        let out: Vec<(Value, Value)> = if together {
            std::thread::scope(|sc| {
                let hs: Vec<_> = bodies
                    .iter()
                    .enumerate()
                    .map(|(i, b)| {
                        sc.spawn(move || {
                            std::thread::sleep(Duration::from_millis(3 * i as u64));
                            one(b)
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            })
        } else {
            bodies.iter().map(one).collect()
        };
        out.into_iter().map(|(c, u)| json!([c, u])).collect()
    };
    let plain = run("arith-chat", false);
    assert_eq!(run("spec", false), plain, "alone");
    assert_eq!(run("spec", true), plain, "batched");
    let before = accepted;
    assert!(s.metric("loom_text_speculative_accepted_tokens_total{model=\"spec\"}") > before);
    assert_eq!(s.metric("loom_text_pages_used{model=\"spec\"}"), 0.0);
    s.healthy();
}

#[test]
fn a_small_prefill_share_changes_no_text_and_bad_values_are_refused() {
    let s = start("chat-prefill-share", &[]);
    let base = s.dir.join("arith-chat").display().to_string();
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "chunky", "base": base,
                "options": {"epoch_tokens": 64, "epoch_spans": 8, "page_tokens": 16, "context": 1024,
                            "prefill_chunk_tokens": 3}}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    for bad in [json!(0), json!(65), json!(2.5)] {
        let r = s.post_json(
            "/v1/models",
            &json!({"name": "bad", "base": base,
                    "options": {"epoch_tokens": 64, "prefill_chunk_tokens": bad}}),
        );
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
        assert!(
            r.text().contains("options.prefill_chunk_tokens"),
            "{}",
            r.text()
        );
    }
    // Long prompts join running decoders 3 prompt tokens an epoch; every text is still the oracle's.
    let prompts: Vec<String> = (0..6)
        .map(|i| format!("prompt {i} {}", "lmnop".repeat(i * 12)))
        .collect();
    let texts: Vec<(String, String)> = std::thread::scope(|sc| {
        let hs: Vec<_> = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let s = &s;
                sc.spawn(move || {
                    std::thread::sleep(Duration::from_millis(20 * i as u64));
                    let v = complete(
                        s,
                        json!({"model": "chunky", "prompt": p, "max_tokens": 60, "temperature": 0}),
                    );
                    (
                        v["choices"][0]["text"].as_str().unwrap().to_string(),
                        v["choices"][0]["finish_reason"]
                            .as_str()
                            .unwrap()
                            .to_string(),
                    )
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (p, (text, finish)) in prompts.iter().zip(&texts) {
        let (want, f, _) = oracle(p.as_bytes(), 60);
        assert_eq!((text.as_str(), finish.as_str()), (want.as_str(), f), "{p}");
    }
    s.healthy();
}

/// The toy model's log probability of each token of `seq` after the first, given the tokens before it (its
/// logits are -|v - next|, v = 0..256), and the best token there.
fn prompt_logprobs(seq: &[u8]) -> Vec<(f64, u8)> {
    (1..seq.len())
        .map(|i| {
            let nx = f64::from(next(&seq[..i]));
            let lse = (0..256)
                .map(|v| (-(f64::from(v) - nx).abs()).exp())
                .sum::<f64>()
                .ln();
            (-(f64::from(seq[i]) - nx).abs() - lse, nx as u8)
        })
        .collect()
}

#[test]
fn echo_with_logprobs_scores_the_prompt() {
    let s = start("chat-echo", &[]);
    let base = s.dir.join("arith-chat").display().to_string();
    // Prompts chunked over several epochs (16 tokens each), and a package that does not declare multi-row logits.
    for (name, options) in [
        (
            "chunked",
            json!({"epoch_tokens": 16, "epoch_spans": 4, "multi_row_logits": true}),
        ),
        ("one-row", json!({"epoch_tokens": 256})),
    ] {
        let r = s.post_json(
            "/v1/models",
            &json!({"name": name, "base": base, "options": options}),
        );
        assert_eq!(r.status, 201, "{}", r.text());
    }
    let prompt = "Scoring a prompt: every token after the first, given all before it.";
    let want = prompt_logprobs(prompt.as_bytes());
    for model in ["arith-chat", "chunked", "arith-chat"] {
        // max_tokens 0: the prompt only.
        let v = complete(
            &s,
            json!({"model": model, "prompt": prompt, "echo": true, "logprobs": 2, "max_tokens": 0}),
        );
        let c = &v["choices"][0];
        assert_eq!(c["text"], prompt);
        assert_eq!(c["finish_reason"], "length");
        assert_eq!(v["usage"]["completion_tokens"], 0);
        let lp = &c["logprobs"];
        assert_eq!(lp["tokens"].as_array().unwrap().len(), prompt.len());
        assert_eq!(lp["tokens"][0], "S");
        assert!(lp["token_logprobs"][0].is_null() && lp["top_logprobs"][0].is_null());
        for (i, (l, best)) in want.iter().enumerate() {
            let got = lp["token_logprobs"][i + 1].as_f64().unwrap();
            assert!(
                (got - l).abs() < 1e-4,
                "{model} token {}: {got} vs {l}",
                i + 1
            );
            let top = lp["top_logprobs"][i + 1].as_object().unwrap();
            assert_eq!(top.len(), 2);
            assert!(top.contains_key(&(*best as char).to_string()), "{top:?}");
        }
    }
    // With generated tokens: the prompt's entries, then the completion's; text = prompt + completion.
    let body = json!({"model": "chunked", "prompt": prompt, "echo": true, "logprobs": 1, "max_tokens": 5,
                      "temperature": 0});
    let v = complete(&s, body.clone());
    let (generated, _, _) = oracle(prompt.as_bytes(), 5);
    let c = &v["choices"][0];
    assert_eq!(c["text"], format!("{prompt}{generated}"));
    // Every drawn token has an entry (the terminal '.' too, which adds no text).
    assert_eq!(
        c["logprobs"]["tokens"].as_array().unwrap().len() as u64,
        prompt.len() as u64 + v["usage"]["completion_tokens"].as_u64().unwrap()
    );
    // Streamed: the same text and log probabilities, the prompt first.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let events = stream(&s, "/v1/completions", streamed);
    let text: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(text, c["text"]);
    assert_eq!(events[0]["choices"][0]["text"], prompt);
    let logprobs: Vec<Value> = events
        .iter()
        .filter_map(|e| e["choices"][0]["logprobs"]["token_logprobs"].as_array())
        .flatten()
        .cloned()
        .collect();
    assert_eq!(
        logprobs,
        *c["logprobs"]["token_logprobs"].as_array().unwrap()
    );
    // Echo without logprobs: the text only; and with n = 2, each choice echoes.
    let v = complete(
        &s,
        json!({"model": "one-row", "prompt": "abc", "echo": true, "max_tokens": 3, "temperature": 0, "n": 2}),
    );
    for i in 0..2 {
        assert_eq!(
            v["choices"][i]["text"],
            format!("abc{}", oracle(b"abc", 3).0)
        );
        assert!(v["choices"][i]["logprobs"].is_null());
    }
    // Scoring requests and generating ones sharing epochs (staggered): every row goes to its own sequence.
    let prompts: Vec<String> = (0..6)
        .map(|i| format!("{i} score me {}", "qrst".repeat(i * 3)))
        .collect();
    std::thread::scope(|sc| {
        for (i, p) in prompts.iter().enumerate() {
            let s = &s;
            sc.spawn(move || {
                std::thread::sleep(Duration::from_millis(2 * i as u64));
                let score = i % 2 == 0;
                let v = complete(
                    s,
                    json!({"model": "chunked", "prompt": p, "echo": score, "logprobs": 1,
                           "max_tokens": if score { 0 } else { 20 }, "temperature": 0}),
                );
                let c = &v["choices"][0];
                if score {
                    let want = prompt_logprobs(p.as_bytes());
                    for (j, (l, _)) in want.iter().enumerate() {
                        let got = c["logprobs"]["token_logprobs"][j + 1].as_f64().unwrap();
                        assert!((got - l).abs() < 1e-4, "{p} token {}: {got} vs {l}", j + 1);
                    }
                } else {
                    assert_eq!(c["text"], oracle(p.as_bytes(), 20).0);
                }
            });
        }
    });
    // Errors: scoring on a package without multi-row logits; max_tokens 0 without scoring.
    for (body, want) in [
        (
            json!({"model": "one-row", "prompt": "abc", "echo": true, "logprobs": 1, "max_tokens": 0}),
            "options.multi_row_logits",
        ),
        (
            json!({"model": "arith-chat", "prompt": "abc", "max_tokens": 0}),
            "`max_tokens` must be at least 1",
        ),
        (
            json!({"model": "arith-chat", "prompt": "abc", "echo": "yes"}),
            "`echo` must be a boolean",
        ),
    ] {
        let r = s.post_json("/v1/completions", &body);
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        assert!(r.text().contains(want), "{body}: {}", r.text());
    }
    assert_eq!(s.metric("loom_text_pages_used{model=\"chunked\"}"), 0.0);
    s.healthy();
}

/// Epoch shapes compiled ahead (`options.warm_epochs`): while the model is idle its sets appear in the
/// specialization cache before any request; with 0 none do; either way the text is the same; bad values are
/// refused naming the option.
#[test]
fn epoch_shapes_compiled_ahead_change_no_text_and_bad_values_are_refused() {
    let s = start("chat-warm", &[]);
    let base = s.dir.join("arith-chat").display().to_string();
    // arith-chat's specialization_cache is 4.
    for bad in [json!(-1), json!(5), json!(2.5), json!("4")] {
        let r = s.post_json(
            "/v1/models",
            &json!({"name": "bad", "base": base, "options": {"warm_epochs": bad}}),
        );
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
        assert!(r.text().contains("options.warm_epochs"), "{}", r.text());
    }
    for (name, n) in [("ahead", 4), ("demand", 0)] {
        let r = s.post_json(
            "/v1/models",
            &json!({"name": name, "base": base, "options": {"warm_epochs": n}}),
        );
        assert_eq!(r.status, 201, "{}", r.text());
    }
    let entries = |m: &str| {
        s.metric(&format!(
            "loom_specialization_cache_entries{{model=\"{m}\"}}"
        ))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while entries("ahead") < 1.0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(entries("ahead") >= 1.0, "no epoch shape was compiled ahead");
    assert_eq!(
        entries("demand"),
        0.0,
        "warm_epochs 0 compiles nothing ahead"
    );
    let text = |m: &str| {
        let v = complete(
            &s,
            json!({"model": m, "prompt": "abc 12", "max_tokens": 20, "temperature": 0}),
        );
        v["choices"][0]["text"].as_str().unwrap().to_string()
    };
    assert_eq!(text("ahead"), text("demand"));
    assert!(entries("demand") >= 1.0);
    s.healthy();
}
