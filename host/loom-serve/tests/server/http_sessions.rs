//! Sessions, checkpoints, fork and rewind over retained text, with `packages/arith-chat` (16 tokens a page; tokens
//! are bytes). Full-replay equivalence: whatever sequence of appends, forks and rewinds built a session, what an
//! append generates is exactly what a fresh `/v1/completions` request over the session's whole replayed text
//! generates (greedy: also what the independent oracle below computes; seeded sampling; log probabilities
//! equal to the bit). A fork copies no page (the pages gauge does not move); an append continues from a copy
//! of its session's partial frontier page instead of computing its tokens again; and deletion, idle expiry and
//! unregistration free the pages sessions pin.

use crate::support::TestServer;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// The toy model: the next byte after `seq` (the package's documented formula, written independently).
fn next(seq: &[u8]) -> u8 {
    let h = seq
        .iter()
        .enumerate()
        .map(|(p, &t)| (u64::from(t) + p as u64 + 1) * (p as u64 + 1))
        .sum::<u64>()
        % 26;
    if h == 0 { b'.' } else { b'a' + h as u8 }
}

/// Greedy generation: the text (without the terminal '.') and the finish reason.
fn oracle(prompt: &[u8], max: usize) -> (String, &'static str) {
    let mut seq = prompt.to_vec();
    let mut out = String::new();
    for _ in 0..max {
        let t = next(&seq);
        seq.push(t);
        if t == b'.' {
            return (out, "stop");
        }
        out.push(t as char);
    }
    (out, "length")
}

const M: &str = "arith-chat";

fn start(tag: &str) -> TestServer {
    // TestServer::start copies the example packages (arith-chat among them) to this directory.
    let pkg = std::env::temp_dir()
        .join(format!("loom-serve-test-{}-{tag}", std::process::id()))
        .join("arith-chat")
        .display()
        .to_string();
    TestServer::start(tag, &["--model", pkg.as_str()])
}

fn ok(r: crate::support::Response) -> Value {
    assert!(r.status == 200, "{} {}", r.status, r.text());
    r.json()
}

fn create(s: &TestServer, prompt: &str) -> String {
    let v = ok(s.post_json("/v1/sessions", &json!({"model": M, "prompt": prompt})));
    assert_eq!(v["object"], "session");
    assert_eq!(v["tokens"], prompt.len());
    v["id"].as_str().unwrap().to_string()
}

fn get(s: &TestServer, id: &str) -> Value {
    ok(s.request("GET", &format!("/v1/sessions/{id}"), b""))
}

fn tokens(s: &TestServer, id: &str) -> Vec<u8> {
    get(s, id)["token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u8)
        .collect()
}

fn post(s: &TestServer, id: &str, what: &str, body: Value) -> Value {
    ok(s.post_json(&format!("/v1/sessions/{id}/{what}"), &body))
}

fn pages_used(s: &TestServer) -> f64 {
    s.metric(&format!("loom_text_pages_used{{model=\"{M}\"}}"))
}

/// Appends `text` with `params` to session `id` and checks the result against a fresh completion over the
/// session's replayed tokens (and, greedy, the oracle) and the session's new tokens; returns the text.
fn append_checked(s: &TestServer, id: &str, text: &str, params: Value) -> String {
    let before = tokens(s, id);
    let mut body = params.clone();
    body["prompt"] = json!(text);
    let got = post(s, id, "append", body);
    let mut replay = before.clone();
    replay.extend_from_slice(text.as_bytes());
    let mut fresh = params.clone();
    fresh["model"] = json!(M);
    fresh["prompt"] = json!(replay);
    let want = ok(s.post_json("/v1/completions", &fresh));
    let g = &got["choices"][0];
    let w = &want["choices"][0];
    assert_eq!(
        g["text"], w["text"],
        "session {id} after {before:?} + {text:?}"
    );
    assert_eq!(g["finish_reason"], w["finish_reason"]);
    assert_eq!(
        g["logprobs"], w["logprobs"],
        "log probabilities, to the bit"
    );
    assert_eq!(got["usage"], want["usage"]);
    assert_eq!(got["object"], "text_completion");
    let out = g["text"].as_str().unwrap().to_string();
    if params["temperature"] == json!(0) {
        let max = params["max_tokens"].as_u64().unwrap() as usize;
        let (t, f) = oracle(&replay, max);
        assert_eq!(
            (out.as_str(), g["finish_reason"].as_str().unwrap()),
            (t.as_str(), f)
        );
    }
    // The session now holds the replay and everything generated but the terminal token.
    let mut known = replay;
    known.extend_from_slice(out.as_bytes());
    assert_eq!(tokens(s, id), known, "session {id}'s tokens");
    out
}

fn greedy(max: u64) -> Value {
    json!({"max_tokens": max, "temperature": 0, "logprobs": 2})
}

fn seeded(max: u64, seed: u64) -> Value {
    json!({"max_tokens": max, "temperature": 1.3, "top_p": 0.9, "seed": seed, "logprobs": 1})
}

#[test]
fn appends_forks_and_rewinds_replay_exactly_and_forks_copy_no_pages() {
    let s = start("sessions-replay");
    // 19 tokens: a full page and a partial one.
    let a = create(&s, "The quick brown fox");
    append_checked(&s, &a, " jumps", greedy(20));
    let hits = s.metric(&format!(
        "loom_text_prefix_hit_tokens_total{{model=\"{M}\"}}"
    ));
    append_checked(&s, &a, " over", seeded(12, 7));
    let hits2 = s.metric(&format!(
        "loom_text_prefix_hit_tokens_total{{model=\"{M}\"}}"
    ));
    assert!(
        hits2 - hits >= 16.0 * 2.0,
        "the append read the session's full pages ({hits} -> {hits2}), the fresh replay too"
    );
    let at = tokens(&s, &a);
    let cp = post(&s, &a, "checkpoints", json!({"name": "c1"}));
    assert_eq!(cp["checkpoints"][0]["name"], "c1");
    assert_eq!(cp["checkpoints"][0]["tokens"], at.len());

    // A fork at a partial page copies nothing: the pages held do not move.
    assert_ne!(at.len() % 16, 0, "the fork point is inside a page");
    let used = pages_used(&s);
    assert!(
        used >= (at.len() / 16) as f64,
        "the session pins its full pages"
    );
    let b = post(&s, &a, "fork", json!({}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(pages_used(&s), used, "a fork copies no page");
    assert_eq!(tokens(&s, &b), at);
    assert_eq!(get(&s, &b)["pages"], get(&s, &a)["pages"]);
    append_checked(&s, &b, " the lazy", greedy(9));
    append_checked(&s, &b, "", seeded(5, 11));

    // A rewind into the middle of a page, then appends after it.
    let r = post(&s, &a, "rewind", json!({"tokens": 21}));
    assert_eq!(r["tokens"], 21);
    assert_eq!(
        r["pages"], 2,
        "one full page and the page 21 falls in (its frontier)"
    );
    assert_eq!(tokens(&s, &a), at[..21]);
    append_checked(&s, &a, "xyz", greedy(30));
    append_checked(&s, &a, " dog", seeded(20, 3));

    // A fork of a fork; a fork of a checkpoint; a rewind to a checkpoint.
    let c = post(&s, &b, "fork", json!({}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    append_checked(&s, &c, " and then", greedy(25));
    let d = post(&s, &a, "fork", json!({"checkpoint": "c1"}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(tokens(&s, &d), at);
    let r = post(&s, &a, "rewind", json!({"checkpoint": "c1"}));
    assert_eq!(r["tokens"], at.len());
    assert_eq!(tokens(&s, &a), at);

    // Two branches of one prefix appended concurrently (and a third session beside them).
    std::thread::scope(|sc| {
        let s = &s;
        let t: Vec<_> = [
            (&a, " one", greedy(40)),
            (&d, " two", seeded(40, 5)),
            (&c, "!", greedy(40)),
        ]
        .into_iter()
        .map(|(id, text, p)| sc.spawn(move || append_checked(s, id, text, p)))
        .collect();
        for h in t {
            h.join().unwrap();
        }
    });

    // Listing shows every session with its tokens and pages.
    let list = ok(s.request("GET", "/v1/sessions", b""));
    let data = list["data"].as_array().unwrap();
    assert_eq!(data.len(), 4);
    for e in data {
        assert_eq!(e["model"], M);
        let id = e["id"].as_str().unwrap();
        let n = tokens(&s, id).len();
        assert_eq!(e["tokens"], n);
        assert!(e["pages"].as_u64().unwrap() <= (n / 16) as u64 + 1);
    }
    assert_eq!(
        s.metric(&format!("loom_text_sessions{{model=\"{M}\"}}")),
        4.0
    );

    // Errors.
    let r = s.post_json(
        &format!("/v1/sessions/{a}/rewind"),
        &json!({"tokens": 100000}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    let r = s.post_json(
        &format!("/v1/sessions/{a}/rewind"),
        &json!({"checkpoint": "nope"}),
    );
    assert_eq!(r.status, 404, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "session_not_found");
    let r = s.post_json(
        &format!("/v1/sessions/{a}/fork"),
        &json!({"checkpoint": "nope"}),
    );
    assert_eq!(r.status, 404, "{}", r.text());
    let r = s.post_json("/v1/sessions/sess-999999/append", &json!({"prompt": "x"}));
    assert_eq!(r.status, 404, "{}", r.text());
    let r = s.post_json(
        &format!("/v1/sessions/{a}/append"),
        &json!({"prompt": "x", "n": 2}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    let r = s.post_json(&format!("/v1/sessions/{a}/rewind"), &json!({}));
    assert_eq!(r.status, 400, "{}", r.text());
    let r = s.post_json("/v1/sessions", &json!({"model": "nope"}));
    assert_eq!(r.status, 404, "{}", r.text());

    // Deleting every session frees every page they pinned.
    for id in [&a, &b, &c, &d] {
        let r = s.request("DELETE", &format!("/v1/sessions/{id}"), b"");
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert_eq!(
        s.request("DELETE", &format!("/v1/sessions/{a}"), b"")
            .status,
        404
    );
    assert_eq!(pages_used(&s), 0.0);
    assert_eq!(
        s.metric(&format!("loom_text_sessions{{model=\"{M}\"}}")),
        0.0
    );
    s.healthy();
}

#[test]
fn streamed_appends_extend_and_empty_sessions() {
    let s = start("sessions-stream");
    // An empty session: the first append is its whole prompt.
    let e = create(&s, "");
    append_checked(&s, &e, "hello there", greedy(10));
    // Adding tokens without generating (max_tokens 0): computed by the next append.
    let v = post(
        &s,
        &e,
        "append",
        json!({"tokens": [32, 119, 111], "max_tokens": 0}),
    );
    assert_eq!(v["tokens"], tokens(&s, &e).len());
    append_checked(&s, &e, "", greedy(10));
    // A streamed append continues the session like a whole one.
    let before = tokens(&s, &e);
    let r = s.post_json(
        &format!("/v1/sessions/{e}/append"),
        &json!({"prompt": " more", "max_tokens": 15, "temperature": 0, "stream": true}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let text: String = r
        .text()
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| {
            serde_json::from_str::<Value>(d).unwrap()["choices"][0]["text"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    let mut replay = before;
    replay.extend_from_slice(b" more");
    assert_eq!(text, oracle(&replay, 15).0);
    replay.extend_from_slice(text.as_bytes());
    assert_eq!(tokens(&s, &e), replay);

    // While an append runs, another append or a rewind of that session is refused (409); a fork is not.
    let mut seen = false;
    for _ in 0..10 {
        let busy = std::thread::scope(|sc| {
            let s = &s;
            let e = e.as_str();
            let long = sc.spawn(move || {
                let body =
                    json!({"prompt": "", "max_tokens": 900, "ignore_eos": true, "temperature": 0});
                s.post_json(&format!("/v1/sessions/{e}/append"), &body)
                    .status
            });
            let mut busy = false;
            while !long.is_finished() {
                if get(s, e)["busy"] == true {
                    let r =
                        s.post_json(&format!("/v1/sessions/{e}/append"), &json!({"prompt": "x"}));
                    let w = s.post_json(&format!("/v1/sessions/{e}/rewind"), &json!({"tokens": 1}));
                    let f = s.post_json(&format!("/v1/sessions/{e}/fork"), &json!({}));
                    if long.is_finished() {
                        break;
                    }
                    assert_eq!(r.status, 409, "{}", r.text());
                    assert_eq!(r.json()["error"]["code"], "session_busy");
                    assert_eq!(w.status, 409, "{}", w.text());
                    assert_eq!(f.status, 200, "{}", f.text());
                    busy = true;
                    break;
                }
            }
            assert_eq!(long.join().unwrap(), 200);
            busy
        });
        // Back to where it was, for the next try.
        post(&s, &e, "rewind", json!({"tokens": replay.len()}));
        if busy {
            seen = true;
            break;
        }
    }
    assert!(seen, "never caught the session busy");
    s.healthy();
}

#[test]
fn idle_sessions_expire_and_unregistering_drops_sessions() {
    let s = start("sessions-idle");
    // A second registration of the package whose sessions expire after a second.
    let base = s.dir.join("arith-chat");
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "short", "base": base.display().to_string(),
                "options": {"session_idle_seconds": 1}}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let long: String = (0..80)
        .map(|i| (b'a' + (i * 5 % 26) as u8) as char)
        .collect();
    let v = ok(s.post_json("/v1/sessions", &json!({"model": "short", "prompt": long})));
    let id = v["id"].as_str().unwrap().to_string();
    post(
        &s,
        &id,
        "append",
        json!({"prompt": "!", "max_tokens": 4, "temperature": 0}),
    );
    let used = || s.metric("loom_text_pages_used{model=\"short\"}");
    assert!(used() >= 5.0, "the session pins its pages: {}", used());
    let t0 = Instant::now();
    while s.request("GET", &format!("/v1/sessions/{id}"), b"").status != 404 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the session never expired"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(t0.elapsed() >= Duration::from_millis(500));
    assert_eq!(used(), 0.0, "expiry released the pins");

    // Unregistering a model drops its sessions; registered again, it has none.
    let a = create(&s, "a session on the main model");
    post(
        &s,
        &a,
        "append",
        json!({"prompt": "?", "max_tokens": 3, "temperature": 0}),
    );
    assert_eq!(
        s.request("DELETE", &format!("/v1/models/{M}"), b"").status,
        200
    );
    assert_eq!(
        s.request("GET", &format!("/v1/sessions/{a}"), b"").status,
        404
    );
    let r = s.post_json("/v1/models", &json!({"base": base.display().to_string()}));
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(
        s.request("GET", &format!("/v1/sessions/{a}"), b"").status,
        404
    );
    let list = ok(s.request("GET", "/v1/sessions", b""));
    assert_eq!(list["data"], json!([]));
    assert_eq!(pages_used(&s), 0.0);
    s.healthy();
}

#[test]
fn sessions_survive_deactivation_and_replay_exactly_after_it() {
    // The spec: deactivation releases reloadable backing (the parameters, the page pool) without discarding
    // retained session state. Sessions come back with their tokens and checkpoints; their next append computes
    // their pages again and generates exactly what a fresh request over the replayed tokens generates.
    let s = start("sessions-deactivate");
    let a = create(&s, "a session that outlives its model's deactivation");
    append_checked(&s, &a, " and then", greedy(12));
    post(&s, &a, "checkpoints", json!({"name": "before"}));
    append_checked(&s, &a, " more", seeded(9, 5));
    let b = ok(s.post_json(
        &format!("/v1/sessions/{a}/fork"),
        &json!({"checkpoint": "before"}),
    ))["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (ta, tb) = (tokens(&s, &a), tokens(&s, &b));
    assert!(pages_used(&s) > 0.0);
    let r = s.request("POST", &format!("/v1/models/{M}/deactivate"), b"");
    assert_eq!(r.status, 200, "{}", r.text());
    // While deactivated the model does not serve (its sessions with it).
    assert_ne!(
        s.request("GET", &format!("/v1/sessions/{a}"), b"").status,
        200
    );
    let r = s.request("POST", &format!("/v1/models/{M}/activate"), b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(tokens(&s, &a), ta, "session a's tokens");
    assert_eq!(tokens(&s, &b), tb, "session b's tokens");
    let info = get(&s, &a);
    assert_eq!(
        info["pages"], 0,
        "pages are computed again, not kept: {info}"
    );
    assert_eq!(info["checkpoints"][0]["name"], "before", "{info}");
    assert_eq!(pages_used(&s), 0.0);
    // Appends after the activation: exactly a fresh request over the replayed tokens (and the oracle).
    append_checked(&s, &a, " again", greedy(10));
    append_checked(&s, &b, " branch", seeded(7, 11));
    post(&s, &a, "rewind", json!({"checkpoint": "before"}));
    append_checked(&s, &a, " rewound", greedy(8));
    let list = ok(s.request("GET", "/v1/sessions", b""));
    assert_eq!(list["data"].as_array().unwrap().len(), 2);
    s.healthy();
}

fn metric(s: &TestServer, name: &str) -> f64 {
    s.metric(&format!("{name}{{model=\"{M}\"}}"))
}

/// Appends `text` greedily (up to `max` tokens) to session `id` and checks that only the session's tokens past
/// its frontier (`computed` of them) were computed, from a copy of its frontier page when `copied`; then that
/// the result equals a fresh completion over the replayed tokens and the oracle. Returns 1 when the append ended
/// at its length limit (its last token is then pending: its state is not computed), else 0.
fn append_from_frontier(
    s: &TestServer,
    id: &str,
    text: &str,
    max: u64,
    computed: usize,
    copied: bool,
) -> usize {
    let before = tokens(s, id);
    let (pre, cop) = (
        metric(s, "loom_text_prefill_tokens_total"),
        metric(s, "loom_text_pages_copied_total"),
    );
    let mut body = greedy(max);
    body["prompt"] = json!(text);
    let got = post(s, id, "append", body);
    assert_eq!(
        metric(s, "loom_text_prefill_tokens_total") - pre,
        computed as f64,
        "prompt tokens computed by the append to {id} after {} tokens + {text:?}",
        before.len()
    );
    assert_eq!(
        metric(s, "loom_text_pages_copied_total") - cop,
        if copied { 1.0 } else { 0.0 }
    );
    let mut replay = before;
    replay.extend_from_slice(text.as_bytes());
    let mut fresh = greedy(max);
    fresh["model"] = json!(M);
    fresh["prompt"] = json!(replay);
    let want = ok(s.post_json("/v1/completions", &fresh));
    assert_eq!(got["choices"][0]["text"], want["choices"][0]["text"]);
    assert_eq!(
        got["choices"][0]["logprobs"],
        want["choices"][0]["logprobs"]
    );
    let (t, f) = oracle(&replay, max as usize);
    assert_eq!(got["choices"][0]["text"], t);
    assert_eq!(got["choices"][0]["finish_reason"], f);
    usize::from(f == "length")
}

#[test]
fn appends_copy_the_partial_frontier_page_instead_of_recomputing_it() {
    let s = start("sessions-frontier");
    // 25 tokens, then 20 generated (the oracle says this prompt runs to the length limit): 45 tokens, the last
    // drawn one pending, so the state of 44 is kept: 2 full pages and 12 tokens on the frontier page.
    let prompt = "The quick brown fox leaps";
    assert_eq!(oracle(prompt.as_bytes(), 20).1, "length");
    let a = create(&s, prompt);
    append_from_frontier(&s, &a, "", 20, 25, false);
    let info = get(&s, &a);
    assert_eq!(info["tokens"], 45);
    assert_eq!(info["pages"], 3, "2 full pages and the frontier: {info}");
    // The next append computes the pending token and its own 5, not the frontier's 12 again.
    let pending = append_from_frontier(&s, &a, " over", 7, 6, true);
    // A fork shares the frontier; appends to both branches copy it (each into a page of its own).
    let n = tokens(&s, &a).len();
    let used = pages_used(&s);
    let b = post(&s, &a, "fork", json!({}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(pages_used(&s), used, "a fork copies no page");
    assert_ne!((n - pending) % 16, 0, "the frontier is a partial page");
    let pending_b = append_from_frontier(&s, &b, " the", 9, pending + 4, true);
    append_from_frontier(&s, &a, " lazy", 9, pending + 5, true);
    // A rewind into a full page: that page becomes the frontier (shared with the prefix cache) and is copied.
    let r = post(&s, &a, "rewind", json!({"tokens": 21}));
    assert_eq!(r["pages"], 2);
    append_from_frontier(&s, &a, "xy", 5, 2, true);
    // A checkpoint keeps its frontier across later appends and rewinds to it.
    post(&s, &b, "checkpoints", json!({"name": "c"}));
    append_from_frontier(&s, &b, "zz", 6, pending_b + 2, true);
    post(&s, &b, "rewind", json!({"checkpoint": "c"}));
    append_from_frontier(&s, &b, "q", 6, pending_b + 1, true);
    // Everything is released with the sessions.
    for id in [&a, &b] {
        ok(s.request("DELETE", &format!("/v1/sessions/{id}"), b""));
    }
    assert_eq!(pages_used(&s), 0.0);
    s.healthy();
}

#[test]
fn sessions_of_a_speculating_model_replay_exactly() {
    let s = start("sessions-speculative");
    let base = s.dir.join(M).display().to_string();
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "spec", "base": base,
                "options": {"epoch_tokens": 256, "epoch_spans": 8, "page_tokens": 16, "context": 1024,
                            "multi_row_logits": true, "speculative_tokens": 4}}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    // Greedy arith-chat falls into cycles, so the appends verify (and keep, and reject) proposals; rejected
    // proposals' state is written past the committed tokens, into the page that becomes the frontier.
    let v = ok(s.post_json(
        "/v1/sessions",
        &json!({"model": "spec", "prompt": "abcabcabcabcabc xyz"}),
    ));
    let a = v["id"].as_str().unwrap().to_string();
    let fresh = |replay: &[u8], params: &Value| {
        let mut b = params.clone();
        b["model"] = json!(M);
        b["prompt"] = json!(replay);
        ok(s.post_json("/v1/completions", &b))
    };
    let check = |id: &str, text: &str, params: Value| {
        let mut replay = tokens(&s, id);
        replay.extend_from_slice(text.as_bytes());
        let mut b = params.clone();
        b["prompt"] = json!(text);
        let got = post(&s, id, "append", b);
        let want = fresh(&replay, &params);
        assert_eq!(got["choices"], want["choices"], "{id} + {text:?}");
    };
    check(&a, "", greedy(80));
    check(&a, " again", greedy(60));
    let b = post(&s, &a, "fork", json!({}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    check(&b, "q", seeded(50, 9));
    check(&a, "r", greedy(40));
    post(&s, &a, "rewind", json!({"tokens": 37}));
    check(&a, "zz", greedy(70));
    let kept = s.metric("loom_text_speculative_accepted_tokens_total{model=\"spec\"}");
    let proposed = s.metric("loom_text_speculative_proposed_tokens_total{model=\"spec\"}");
    assert!(
        kept > 10.0 && kept < proposed,
        "{kept} of {proposed} proposals kept"
    );
    assert!(s.metric("loom_text_pages_copied_total{model=\"spec\"}") >= 4.0);
    s.healthy();
}
