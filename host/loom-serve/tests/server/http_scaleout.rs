//! What a Kubernetes deployment relies on (`deploy/kubernetes/`, `docs/serving/kubernetes.md`), through the real
//! binary: the drain on SIGTERM (readiness fails at once, accepted streams finish, new work is refused with 503,
//! exit 0), the inference gateway's model-server protocol gauges under load, and a simulation of three
//! replicas behind a client that routes the way the gateway's endpoint picker does.
//!
//! The model is `slow-chat`: `packages/arith-chat` with a kernel that spins after each epoch (so streams stay
//! running long enough to be observed) and pages made large (`options.token_words`) so that a small
//! `memory.device_bytes` gives a pool of a chosen number of pages. Prompts of 4 bytes with `max_tokens` 10
//! never leave their first page (16 tokens), so each running sequence holds exactly one page.

use crate::support::{TestServer, copy_dir, repo_root};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Bytes of one page of slow-chat: 16 tokens of `TOKEN_WORDS` i32 words.
const TOKEN_WORDS: u64 = 1024;
const PAGE_BYTES: u64 = 16 * TOKEN_WORDS * 4;

/// The toy model's next byte (see `http_chat.rs`).
fn next(seq: &[u8]) -> u8 {
    let h = seq
        .iter()
        .enumerate()
        .map(|(p, &t)| (u64::from(t) + p as u64 + 1) * (p as u64 + 1))
        .sum::<u64>()
        % 26;
    if h == 0 { b'.' } else { b'a' + h as u8 }
}

/// The text `max` greedy tokens add to `prompt` with `ignore_eos` (the terminal '.' is ordinary text then).
fn oracle(prompt: &[u8], max: usize) -> String {
    let mut seq = prompt.to_vec();
    for _ in 0..max {
        seq.push(next(&seq));
    }
    String::from_utf8(seq[prompt.len()..].to_vec()).unwrap()
}

/// Writes slow-chat into `dir`: a pool of `pages` pages and a spin of `spin` iterations per epoch.
fn slow_chat(dir: &Path, pages: u64, spin: u64) -> PathBuf {
    let pkg = dir.join("slow-chat");
    let _ = std::fs::remove_dir_all(&pkg);
    copy_dir(&repo_root().join("packages/arith-chat"), &pkg);
    let k = std::fs::read_to_string(pkg.join("kernel.loom")).unwrap();
    let stage = "R: i64 = 8>\n";
    assert!(k.contains(stage), "arith-chat's epoch stage signature");
    let dispatch = "    dispatch @logits<S = S, T = T, G = G, PT = PT, P = P, W = W, V = V, R = R>(%x, %pool, %out)\n";
    assert!(k.contains(dispatch), "arith-chat's logits dispatch");
    let k = k
        .replace(stage, &format!("R: i64 = 8, SPIN: i64 = {spin}>\n"))
        .replace(
            dispatch,
            &format!("{dispatch}    dispatch @spin<S = S, V = V, R = R, SPIN = SPIN>(%out)\n"),
        )
        .replace(
            "module @chat.kernel {\n",
            "module @chat.kernel {
  // Test fixture: adds zero to every logits row after spinning SPIN iterations (a slow epoch).
  export kernel @spin<S: i64, V: i64, R: i64, SPIN: i64>
      grid(S)
      (%out: buffer<f32, [R, V]> readwrite)
  {
    %s = program_id 0
    %rv = tile.range 0, V
    %e = tile.load %out[%s, %rv], 0.0
    %z = tile.zeros : tile<[V], f32>
    %acc = for %i = 0 to SPIN iter(%a = %z : tile<[V], f32>) -> tile<[V], f32> {
      %n = mul %a, 0.5
      yield %n
    }
    %o = add %e, %acc
    tile.store %out[%s, %rv], %o
  }
",
        );
    std::fs::write(pkg.join("kernel.loom"), k).unwrap();
    let mut doc: Value =
        serde_json::from_slice(&std::fs::read(pkg.join("model.json")).unwrap()).unwrap();
    doc["name"] = json!("slow-chat");
    doc["options"]["token_words"] = json!(TOKEN_WORDS);
    // The pool takes 3/4 of the budget (RetainedService::start): `pages` pages and a half page to spare, and
    // the epochs' buffers fit the rest.
    doc["memory"]["device_bytes"] = json!((pages * PAGE_BYTES + PAGE_BYTES / 2) / 3 * 4);
    std::fs::write(pkg.join("model.json"), doc.to_string()).unwrap();
    pkg
}

/// A fresh directory for packages (beside, not inside, the servers' own directories).
fn package_home(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("loom-serve-test-{}-{tag}-pkg", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Every sample of a Prometheus text without labels, by name.
fn gauges(text: &str) -> std::collections::HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once(' '))
        .filter(|(k, _)| !k.contains('{'))
        .filter_map(|(k, v)| Some((k.to_string(), v.trim().parse().ok()?)))
        .collect()
}

/// The protocol gauges of `addr`: (queued, running, KV utilization).
fn load(addr: &str) -> Option<(f64, f64, f64)> {
    let r = raw_request(addr, "GET", "/metrics", b"").ok()?;
    let g = gauges(&String::from_utf8_lossy(&r.1));
    Some((
        g["loom_num_requests_waiting"],
        g["loom_num_requests_running"],
        g["loom_kv_cache_utilization"],
    ))
}

/// One HTTP/1.1 request on a fresh connection: (status, body, headers).
fn raw_request(
    addr: &str,
    method: &str,
    path: &str,
    body: &[u8],
) -> std::io::Result<(u16, Vec<u8>, String)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(120)))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )?;
    s.write_all(body)?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no header end"))?;
    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other("no status"))?;
    Ok((status, raw[end + 4..].to_vec(), head))
}

/// A streamed completion: its status, and (when 200) the text of its data events, checked to end with
/// `[DONE]`.
struct Stream {
    status: u16,
    text: String,
    done: bool,
}

/// Sends a streamed completion of `prompt` and reads it to the end (chunked SSE, read line by line).
fn stream_completion(addr: &str, prompt: &str, max_tokens: u32) -> std::io::Result<Stream> {
    let body = json!({"model": "slow-chat", "prompt": prompt, "max_tokens": max_tokens,
                      "temperature": 0, "ignore_eos": true, "stream": true})
    .to_string();
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(120)))?;
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut r = BufReader::new(s);
    let mut status_line = String::new();
    r.read_line(&mut status_line)?;
    let status: u16 = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("status line {status_line:?}")))?;
    let (mut text, mut done) = (String::new(), false);
    let mut line = String::new();
    while {
        line.clear();
        r.read_line(&mut line)? > 0
    } {
        let Some(data) = line.trim_end().strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            done = true;
            continue;
        }
        let v: Value = serde_json::from_str(data)
            .map_err(|e| std::io::Error::other(format!("{e}: {data}")))?;
        if let Some(t) = v["choices"][0]["text"].as_str() {
            text.push_str(t);
        }
    }
    Ok(Stream { status, text, done })
}

/// Waits until `f` holds (polling every 10 ms), or panics with `what` after `secs` seconds.
fn wait_for(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(
            t0.elapsed() < Duration::from_secs(secs),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// SIGTERM while two streams and a whole completion run: `/health` turns 503 `draining` at once, new work
/// gets 503 `server_draining` with `Retry-After`, reads (`/v1/models`, `/metrics`) still answer on new
/// connections, every accepted request finishes in full, and the process exits 0.
#[test]
fn sigterm_fails_readiness_finishes_streams_refuses_new_work_and_exits_0() {
    let home = package_home("drain");
    let pkg = slow_chat(&home, 8, 300_000);
    let s = TestServer::start_models("drain", &[pkg], &["--drain-timeout", "60"]);
    let addr = s.addr.clone();
    let streams: Vec<_> = ["abcd", "wxyz"]
        .into_iter()
        .map(|p| {
            let addr = addr.clone();
            std::thread::spawn(move || (p, stream_completion(&addr, p, 14).unwrap()))
        })
        .collect();
    let whole = {
        let addr = addr.clone();
        std::thread::spawn(move || {
            let body = json!({"model": "slow-chat", "prompt": "mnop", "max_tokens": 14,
                              "temperature": 0, "ignore_eos": true});
            raw_request(
                &addr,
                "POST",
                "/v1/completions",
                body.to_string().as_bytes(),
            )
            .unwrap()
        })
    };
    wait_for("three requests running", 30, || {
        load(&addr).is_some_and(|(_, running, _)| running == 3.0)
    });
    s.sigterm();
    wait_for("/health to fail", 5, || {
        raw_request(&addr, "GET", "/health", b"").is_ok_and(|r| r.0 == 503)
    });
    let (status, body, _) = raw_request(&addr, "GET", "/health", b"").unwrap();
    assert_eq!(status, 503);
    let h: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(h["status"], "draining", "{h}");
    // New work: refused, with a retry hint and the connection closed.
    let body = json!({"model": "slow-chat", "prompt": "late", "max_tokens": 2});
    let (status, body, head) = raw_request(
        &addr,
        "POST",
        "/v1/completions",
        body.to_string().as_bytes(),
    )
    .unwrap();
    assert_eq!(status, 503, "{}", String::from_utf8_lossy(&body));
    let e: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(e["error"]["code"], "server_draining", "{e}");
    let head = head.to_ascii_lowercase();
    assert!(head.contains("retry-after: 1"), "{head}");
    assert!(head.contains("connection: close"), "{head}");
    // Reads still answer while the accepted work runs.
    let (status, _, _) = raw_request(&addr, "GET", "/v1/models", b"").unwrap();
    assert_eq!(status, 200);
    let (_, metrics, _) = raw_request(&addr, "GET", "/metrics", b"").unwrap();
    let g = gauges(&String::from_utf8_lossy(&metrics));
    assert_eq!(g["loom_draining"], 1.0);
    // ... and the checks above ran while accepted requests were still going.
    assert!(g["loom_http_requests_in_flight"] >= 1.0, "{g:?}");
    // Every accepted request finished in full.
    for t in streams {
        let (p, st) = t.join().unwrap();
        assert_eq!(st.status, 200);
        assert!(st.done, "stream {p} ended without [DONE]");
        assert_eq!(st.text, oracle(p.as_bytes(), 14), "stream {p}");
    }
    let (status, body, _) = whole.join().unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["choices"][0]["text"], oracle(b"mnop", 14));
    let (st, log) = s.wait_exit(Duration::from_secs(30));
    assert_eq!(st.code(), Some(0), "{st:?}\n{log}");
    assert!(log.contains("draining: /health answers 503"), "{log}");
    assert!(log.contains("accepted requests answered"), "{log}");
    let _ = std::fs::remove_dir_all(&home);
}

/// The model-server protocol's gauges under load: with a pool of 3 one-page sequences and 5 streams, 3 run
/// and 2 wait, and the KV utilization is 3/3; as they finish the gauges follow, and they return to idle.
#[test]
fn protocol_gauges_read_running_queued_and_pages_in_use() {
    let home = package_home("gauges");
    let pkg = slow_chat(&home, 3, 100_000);
    let s = TestServer::start_models("gauges", &[pkg], &[]);
    let addr = s.addr.clone();
    assert_eq!(
        s.metric("loom_text_pages_capacity{model=\"slow-chat\"}"),
        3.0,
        "the fixture's pool"
    );
    assert_eq!(load(&addr), Some((0.0, 0.0, 0.0)), "idle");
    let text = s.request("GET", "/metrics", b"").text();
    for family in [
        "# TYPE loom_num_requests_waiting gauge",
        "# TYPE loom_num_requests_running gauge",
        "# TYPE loom_kv_cache_utilization gauge",
    ] {
        assert!(text.contains(family), "{family} missing:\n{text}");
    }
    let send = |p: &'static str| {
        let addr = addr.clone();
        std::thread::spawn(move || (p, stream_completion(&addr, p, 10).unwrap()))
    };
    // Three fill the pool; the next two wait (sent once the three run, so that none can have finished).
    let mut streams: Vec<_> = ["aaaa", "bbbb", "cccc"].into_iter().map(send).collect();
    wait_for("3 running", 30, || {
        load(&addr).is_some_and(|(_, running, _)| running == 3.0)
    });
    streams.extend(["dddd", "eeee"].into_iter().map(send));
    // Within one scrape: 3 running (the pool's pages), 2 queued, every page in use.
    wait_for("3 running and 2 queued", 30, || {
        load(&addr) == Some((2.0, 3.0, 1.0))
    });
    // The per-model series agree with the server-wide ones.
    assert_eq!(s.metric("loom_text_running{model=\"slow-chat\"}"), 3.0);
    assert_eq!(s.metric("loom_text_waiting{model=\"slow-chat\"}"), 2.0);
    // Then the last two run alone: 2 running, none queued, 2 of 3 pages.
    let mut seen = Vec::new();
    wait_for("the queued streams to run", 60, || {
        let l = load(&addr);
        if seen.last() != Some(&l) {
            seen.push(l);
        }
        l.is_some_and(|(w, r, kv)| w == 0.0 && r == 2.0 && (kv - 2.0 / 3.0).abs() < 1e-9)
    });
    for t in streams {
        let (p, st) = t.join().unwrap();
        assert_eq!(st.status, 200);
        assert!(st.done);
        assert_eq!(st.text, oracle(p.as_bytes(), 10), "stream {p}");
    }
    wait_for("idle again", 10, || load(&addr) == Some((0.0, 0.0, 0.0)));
    // Every scrape on the way was consistent: never more running than pages, and utilization = running / 3
    // within one page (a sequence is counted running when admitted, its page is taken when its epoch is
    // planned; a finished one frees its page as it stops running).
    for (w, r, kv) in seen.into_iter().flatten() {
        assert!(r <= 3.0 && w <= 2.0, "{w} {r}");
        assert!(
            (kv - r / 3.0).abs() <= 1.0 / 3.0 + 1e-9,
            "kv {kv} with {r} running"
        );
    }
    s.healthy();
    let _ = std::fs::remove_dir_all(&home);
}

/// The endpoint picker's default scheduling profile (gateway-api-inference-extension v1.5.0, `epp-config.yaml`),
/// as this simulation applies it: among the ready replicas, the highest `2 q + 2 k + 3 p` where `q` is the
/// queue scorer's `(max - queue) / (max - min)` (1 when all queues are equal), `k` the KV-cache scorer's
/// `1 - utilization`, and `p` the prefix-cache scorer's share of the prompt's 16-byte blocks (one page of
/// slow-chat) already sent to that replica; ties broken at random (seeded here).
struct Picker {
    /// Per replica: the prompt prefixes (whole blocks) sent to it.
    sent: Vec<std::collections::HashSet<String>>,
    rng: u64,
}

const BLOCK: usize = 16;

impl Picker {
    fn new(n: usize) -> Picker {
        Picker {
            sent: vec![Default::default(); n],
            rng: 0x9e37_79b9_7f4a_7c15,
        }
    }

    /// `ready`: (replica, (queued, running, KV utilization)).
    fn pick(&mut self, prompt: &str, ready: &[(usize, (f64, f64, f64))]) -> usize {
        assert!(!ready.is_empty(), "no replica is ready");
        let (min_q, max_q) = ready.iter().fold((f64::MAX, f64::MIN), |(a, b), (_, l)| {
            (a.min(l.0), b.max(l.0))
        });
        let blocks = prompt.len() / BLOCK;
        let mut best = (f64::MIN, Vec::new());
        for &(i, (queued, _, kv)) in ready {
            let q = if max_q == min_q {
                1.0
            } else {
                (max_q - queued) / (max_q - min_q)
            };
            let matched = (1..=blocks)
                .take_while(|b| self.sent[i].contains(&prompt[..b * BLOCK]))
                .count();
            let p = if blocks == 0 {
                0.0
            } else {
                matched as f64 / blocks as f64
            };
            let score = 2.0 * q + 2.0 * (1.0 - kv) + 3.0 * p;
            if score > best.0 + 1e-9 {
                best = (score, vec![i]);
            } else if (score - best.0).abs() <= 1e-9 {
                best.1.push(i);
            }
        }
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let chosen = best.1[(self.rng % best.1.len() as u64) as usize];
        self.record(prompt, chosen);
        chosen
    }

    /// Like the picker's prefix index: the prompt's blocks are now on `replica`.
    fn record(&mut self, prompt: &str, replica: usize) {
        for b in 1..=prompt.len() / BLOCK {
            self.sent[replica].insert(prompt[..b * BLOCK].to_string());
        }
    }
}

/// A simulation of a Kubernetes scale-out on one machine, not a replacement for the gateway: three replicas,
/// and a client that routes each request the way the endpoint picker's default profile does, from each
/// ready replica's scraped `/metrics` (queue depth, KV-cache utilization) and the prompts it was sent (prefix
/// affinity): [`Picker`]. The 24 streamed completions belong to three conversations (a 32-byte prefix each, two
/// pages the server shares by content, and a 4-byte suffix). One replica is drained (SIGTERM) mid-run, while it
/// runs a stream: no request is lost (those it accepted finish; one it refuses with 503 is sent to another
/// replica, as a gateway's retry would), it exits 0, the load spreads, and the prefix affinity shows as prompt
/// tokens the servers found in shared pages.
#[test]
fn three_replicas_routed_like_the_endpoint_picker_lose_nothing_when_one_drains() {
    let home = package_home("replicas");
    let pkg = slow_chat(&home, 12, 100_000);
    let replicas: Vec<TestServer> = (0..3)
        .map(|i| TestServer::start_models(&format!("replica{i}"), std::slice::from_ref(&pkg), &[]))
        .collect();
    let addrs: Vec<String> = replicas.iter().map(|r| r.addr.clone()).collect();
    let mut replicas: Vec<Option<TestServer>> = replicas.into_iter().map(Some).collect();
    let conversations = [
        "You are a terse assistant. Hi!: ",
        "Translate to French, please: ab ",
        "Summarise the following text: x ",
    ];
    assert!(conversations.iter().all(|c| c.len() == 2 * BLOCK));
    let (total, drain_after) = (24, 8);
    let mut picker = Picker::new(3);
    let mut sent = Vec::new();
    let mut drained: Option<std::thread::JoinHandle<std::process::ExitStatus>> = None;
    for k in 0..total {
        if k == drain_after {
            // Drain replica 0 while it runs a stream (the one sent to it just before).
            wait_for("replica 0 to run the pinned stream", 10, || {
                load(&addrs[0]).is_some_and(|(_, running, _)| running >= 1.0)
            });
            let r = replicas[0].take().unwrap();
            r.sigterm();
            drained = Some(std::thread::spawn(move || {
                r.wait_exit(Duration::from_secs(60)).0
            }));
        }
        let prompt = format!("{}{:04}", conversations[k % 3], k * 37);
        // The last request before the drain goes to replica 0 whatever the picker says, so that the drain
        // certainly finds a stream running there.
        let first = if k + 1 == drain_after {
            picker.record(&prompt, 0);
            0
        } else {
            let ready: Vec<(usize, (f64, f64, f64))> = addrs
                .iter()
                .enumerate()
                .filter(|(_, a)| raw_request(a, "GET", "/health", b"").is_ok_and(|r| r.0 == 200))
                .filter_map(|(i, a)| Some((i, load(a)?)))
                .collect();
            picker.pick(&prompt, &ready)
        };
        let addrs = addrs.clone();
        sent.push(std::thread::spawn(move || {
            // Like a gateway's retry: a 503 from a draining replica goes to the next live replica.
            let mut to = first;
            let mut tries = Vec::new();
            loop {
                let st = stream_completion(&addrs[to], &prompt, 10).unwrap();
                tries.push((to, st.status));
                if st.status != 503 || tries.len() > 3 {
                    return (prompt, to, st, tries);
                }
                to = if to == 2 { 1 } else { to + 1 };
            }
        }));
        std::thread::sleep(Duration::from_millis(120));
    }
    let mut served = [0usize; 3];
    let mut retried = 0;
    for t in sent {
        let (prompt, to, st, tries) = t.join().unwrap();
        assert_eq!(st.status, 200, "{prompt}: {tries:?}");
        assert!(st.done, "{prompt} on replica {to} ended without [DONE]");
        assert_eq!(st.text, oracle(prompt.as_bytes(), 10), "{prompt} on {to}");
        retried += tries.len() - 1;
        served[to] += 1;
    }
    let st = drained.unwrap().join().unwrap();
    assert_eq!(st.code(), Some(0), "the drained replica's exit: {st:?}");
    let hits: Vec<f64> = replicas
        .iter()
        .flatten()
        .map(|r| r.metric("loom_text_prefix_hit_tokens_total{model=\"slow-chat\"}"))
        .collect();
    eprintln!(
        "served per replica: {served:?} (replica 0 drained after {drain_after}); retried after 503: {retried}; \
         prefix hit tokens on replicas 1 and 2: {hits:?}"
    );
    assert!(
        (1..=drain_after).contains(&served[0]),
        "replica 0 answered {served:?}"
    );
    // Three conversations on two live replicas split about 2:1 once each sticks to its replica.
    assert!(
        served[1] >= 3 && served[2] >= 3,
        "the load did not spread: {served:?}"
    );
    // Conversations came back to the replica that had their prefix: its pages were found, not recomputed.
    assert!(
        hits.iter().sum::<f64>() >= (8 * 2 * BLOCK) as f64,
        "prefix hits {hits:?}"
    );
    for r in replicas.iter().flatten() {
        r.healthy();
    }
    drop(replicas);
    let _ = std::fs::remove_dir_all(&home);
}

/// Finite models count in the protocol's gauges too: a request whose cohort spins on the device is running
/// (`loom_requests_running` for its model, `loom_num_requests_running` for the server), then idle again.
#[test]
fn a_running_finite_cohort_counts_as_a_running_request() {
    let s = TestServer::start("gauges-finite", &[]);
    let base = s.dir.join("slow-embed");
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "slow-embed", "base": base.display().to_string()}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let addr = s.addr.clone();
    let t = std::thread::spawn(move || {
        let body = json!({"model": "slow-embed", "input": "spin"}).to_string();
        raw_request(&addr, "POST", "/v1/embeddings", body.as_bytes()).unwrap()
    });
    let mut seen = false;
    let t0 = Instant::now();
    while !t.is_finished() && t0.elapsed() < Duration::from_secs(60) {
        let per_model = s.metric("loom_requests_running{model=\"slow-embed\"}");
        let total = load(&s.addr).unwrap().1;
        assert!(per_model <= 1.0 && total <= 1.0, "{per_model} {total}");
        seen |= per_model == 1.0 && total == 1.0;
        std::thread::sleep(Duration::from_millis(5));
    }
    let (status, body, _) = t.join().unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert!(seen, "the spinning request was never seen running");
    assert_eq!(s.metric("loom_requests_running{model=\"slow-embed\"}"), 0.0);
    assert_eq!(load(&s.addr), Some((0.0, 0.0, 0.0)));
}

/// The deployment files of `deploy/kubernetes` (the base's, on the CPU, and the CUDA overlay's, `cuda:0` else
/// the CPU) serve every model they name, with `/models` standing for this repository's `packages/` and the
/// server started with the image's flags (`--package-root`, `--drain-timeout`), and a SIGTERM ends it with 0.
#[test]
fn the_kubernetes_deployment_files_serve_their_models() {
    let packages = repo_root().join("packages").canonicalize().unwrap();
    let gguf = packages.join("smollm2/model/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !gguf.exists() {
        eprintln!(
            "SKIPPED: {} is missing: run `bash scripts/fetch-smollm2.sh` (scripts/test.sh does)",
            gguf.display()
        );
        return;
    }
    for (tag, file) in [
        ("k8s-base", "deploy/kubernetes/base/deployment.json"),
        (
            "k8s-cuda",
            "deploy/kubernetes/overlays/cuda/deployment.json",
        ),
    ] {
        let home = package_home(tag);
        let text = std::fs::read_to_string(repo_root().join(file)).unwrap();
        assert!(
            text.contains("\"/models/"),
            "{file}: packages under /models"
        );
        let deployment = home.join("deployment.json");
        std::fs::write(
            &deployment,
            text.replace("\"/models/", &format!("\"{}/", packages.display())),
        )
        .unwrap();
        let s = TestServer::start_models(
            tag,
            &[],
            &[
                "--deployment",
                &deployment.display().to_string(),
                "--package-root",
                &packages.display().to_string(),
                "--drain-timeout",
                "60",
            ],
        );
        let named: Vec<Value> = serde_json::from_str::<Value>(&text).unwrap()["models"]
            .as_array()
            .unwrap()
            .clone();
        let h = s.request("GET", "/health", b"").json();
        assert_eq!(h["models_ready"], named.len(), "{file}: {h}");
        assert!(h.get("models_failed").is_none(), "{file}: {h}");
        let list = s.request("GET", "/v1/models", b"").json();
        for m in list["data"].as_array().unwrap() {
            assert_eq!(m["status"], "ready", "{file}: {m}");
            assert_eq!(m["device"], "cpu:0", "{file}: {m}");
        }
        let r = s.post_json(
            "/v1/chat/completions",
            &json!({"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}),
        );
        assert_eq!(r.status, 200, "{file}: {}", r.text());
        assert_eq!(s.request("GET", "/health/live", b"").status, 200);
        s.sigterm();
        let (st, log) = s.wait_exit(Duration::from_secs(30));
        assert_eq!(st.code(), Some(0), "{file}: {st:?}\n{log}");
        let _ = std::fs::remove_dir_all(&home);
    }
}

/// `/health` as readiness: `503 preparing` (naming the model) while a model with no serving version prepares,
/// `200` listing a failed model in `models_failed`, `503 failed` for the same with `?strict=true`, and
/// `/health/live` 200 throughout.
#[test]
fn health_reports_preparing_and_failed_models_and_strict_fails_on_them() {
    let s = TestServer::start("health-states", &[]);
    // arith-chat whose cold prepare spins (the VM's JIT runs ~1.5 billion iterations: about a second).
    let pkg = s.dir.join("slow-prep");
    copy_dir(&repo_root().join("packages/arith-chat"), &pkg);
    let p = std::fs::read_to_string(pkg.join("prepare.loom")).unwrap();
    let first = "    %tokens = call @options.i64(\"epoch_tokens\", 256)\n";
    assert!(p.contains(first), "arith-chat's prepare");
    let spin = "    %spin = call @options.i64(\"prepare_spin\", 0)
    %burnt = for %i = 0 to %spin iter(%a = 0 : i64) -> i64 {
      yield add(%a, 1)
    }
    assert cmp.eq(%burnt, %spin), \"spin\"\n";
    std::fs::write(
        pkg.join("prepare.loom"),
        p.replacen(first, &format!("{spin}{first}"), 1),
    )
    .unwrap();
    let mut doc: Value =
        serde_json::from_slice(&std::fs::read(pkg.join("model.json")).unwrap()).unwrap();
    doc["name"] = json!("slow-prep");
    doc["fuel"]["prepare"] = json!(10_000_000_000u64);
    doc["options"]["prepare_spin"] = json!(1_500_000_000u64);
    std::fs::write(pkg.join("model.json"), doc.to_string()).unwrap();
    let addr = s.addr.clone();
    let body = json!({"base": pkg.display().to_string()}).to_string();
    let reg = std::thread::spawn(move || {
        raw_request(&addr, "POST", "/v1/models", body.as_bytes()).unwrap()
    });
    let mut preparing = None;
    wait_for("/health to say preparing", 30, || {
        let r = s.request("GET", "/health", b"");
        if r.status == 503 {
            preparing = Some(r.json());
        }
        preparing.is_some() || reg.is_finished()
    });
    let (status, body, _) = reg.join().unwrap();
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    let h = preparing.expect("/health never answered 503 while slow-prep prepared");
    assert_eq!(
        h,
        json!({"status": "preparing", "preparing": ["slow-prep"]})
    );
    s.healthy();
    // A failed model: the server serves the others (200, listed), unless strict.
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "broken", "base": s.dir.join("arith-embed-weighted").display().to_string(),
                "options": {"checkpoint": "missing.safetensors"}}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    let h = s.request("GET", "/health", b"");
    assert_eq!(h.status, 200);
    assert_eq!(h.json()["models_failed"], json!(["broken"]));
    let h = s.request("GET", "/health?strict=true", b"");
    assert_eq!(h.status, 503);
    assert_eq!(h.json(), json!({"status": "failed", "failed": ["broken"]}));
    assert_eq!(s.request("GET", "/health/live", b"").status, 200);
    // Gone again: strict readiness is back.
    assert_eq!(s.request("DELETE", "/v1/models/broken", b"").status, 200);
    assert_eq!(s.request("GET", "/health?strict=true", b"").status, 200);
}
