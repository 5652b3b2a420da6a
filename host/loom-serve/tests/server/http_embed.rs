//! Embeddings and decisions against independent oracles: ragged inputs, mixed request sizes, token ids,
//! base64, concurrent requests sharing cohorts.

use crate::support::TestServer;
use serde_json::json;
use std::io::Write;

/// xorshift64*: a fixed-seed generator for test inputs.
pub(crate) struct Rng(u64);
impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The arithmetic embedding (packages/arith-embed/kernel.loom's formula), in f64.
pub(crate) fn arith(values: &[i64], dims: usize) -> Vec<f64> {
    let n = values.len() as f64;
    (0..dims)
        .map(|j| {
            let s: f64 = values
                .iter()
                .enumerate()
                .map(|(t, &v)| v as f64 * 64.0 / (64.0 + ((t + 1) * (j + 1)) as f64))
                .sum();
            s / (256.0 * n)
        })
        .collect()
}

/// The weighted variant: the arithmetic embedding (D = 64) times gen_weights.py's head, plus its bias.
pub(crate) fn weighted(values: &[i64]) -> Vec<f64> {
    let e = arith(values, 64);
    (0..32)
        .map(|o| {
            let dot: f64 = (0..64)
                .map(|d| e[d] * ((((d * 7 + o * 3) % 17) as f64) - 8.0) / 16.0)
                .sum();
            dot + (((o % 5) as f64) - 2.0) / 8.0
        })
        .collect()
}

pub(crate) fn text(rng: &mut Rng, len: usize) -> String {
    const ALPHA: &[u8] = b"abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,;!?";
    (0..len)
        .map(|_| ALPHA[rng.below(ALPHA.len() as u64) as usize] as char)
        .collect()
}

fn close(got: &[serde_json::Value], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let g = g.as_f64().unwrap();
        assert!(
            (g - w).abs() <= 1e-5 * w.abs().max(1.0),
            "{what}[{i}]: got {g}, oracle {w}"
        );
    }
}

fn embed(s: &TestServer, model: &str, input: serde_json::Value) -> serde_json::Value {
    let r = s.post_json("/v1/embeddings", &json!({"model": model, "input": input}));
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

#[test]
fn ragged_inputs_and_mixed_request_sizes_match_the_oracle() {
    let s = TestServer::start("ragged", &[]);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    // Request sizes 1, 2, 5, 16 and 33 inputs; lengths 1..=256 including both ends.
    for (round, size) in [1usize, 2, 5, 16, 33].into_iter().enumerate() {
        let texts: Vec<String> = (0..size)
            .map(|i| {
                let len = match (round, i) {
                    (0, _) => 256,
                    (1, 0) => 1,
                    _ => 1 + rng.below(256) as usize,
                };
                text(&mut rng, len)
            })
            .collect();
        for model in ["arith-embed", "arith-embed-weighted"] {
            let v = embed(&s, model, json!(texts));
            let data = v["data"].as_array().unwrap();
            assert_eq!(data.len(), size);
            let total: usize = texts.iter().map(String::len).sum();
            assert_eq!(v["usage"]["prompt_tokens"], json!(total));
            for (i, d) in data.iter().enumerate() {
                assert_eq!(d["index"], json!(i));
                let vals: Vec<i64> = texts[i].bytes().map(i64::from).collect();
                let want = if model == "arith-embed" {
                    arith(&vals, 64)
                } else {
                    weighted(&vals)
                };
                close(
                    d["embedding"].as_array().unwrap(),
                    &want,
                    &format!("{model} input {i}"),
                );
            }
        }
    }
    // A single string, token ids (one list and a list of lists), UTF-8 beyond ASCII.
    let v = embed(&s, "arith-embed", json!("héllo"));
    let vals: Vec<i64> = "héllo".bytes().map(i64::from).collect();
    close(
        v["data"][0]["embedding"].as_array().unwrap(),
        &arith(&vals, 64),
        "utf-8",
    );
    let v = embed(&s, "arith-embed", json!([5, 70000, 3]));
    close(
        v["data"][0]["embedding"].as_array().unwrap(),
        &arith(&[5, 70000, 3], 64),
        "ids",
    );
    let v = embed(&s, "arith-embed", json!([[1], [2, 3]]));
    close(
        v["data"][1]["embedding"].as_array().unwrap(),
        &arith(&[2, 3], 64),
        "ids 2",
    );
    // base64 carries the same f32 values.
    let r = s.post_json(
        "/v1/embeddings",
        &json!({"model": "arith-embed", "input": "abc", "encoding_format": "base64"}),
    );
    let b64 = r.json()["data"][0]["embedding"]
        .as_str()
        .unwrap()
        .to_string();
    let floats = decode_b64_f32(&b64);
    let want = arith(&[97, 98, 99], 64);
    for (g, w) in floats.iter().zip(&want) {
        assert!((*g as f64 - w).abs() <= 1e-5 * w.abs().max(1.0));
    }
    assert_eq!(floats.len(), 64);
}

fn decode_b64_f32(s: &str) -> Vec<f32> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => 0,
    } as u32;
    let mut bytes = Vec::new();
    for c in s.as_bytes().chunks(4) {
        let n = val(c[0]) << 18 | val(c[1]) << 12 | val(c[2]) << 6 | val(c[3]);
        bytes.push((n >> 16) as u8);
        if c[2] != b'=' {
            bytes.push((n >> 8) as u8);
        }
        if c[3] != b'=' {
            bytes.push(n as u8);
        }
    }
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn concurrent_requests_share_cohorts_and_each_gets_its_own_rows() {
    let s = TestServer::start("concurrent", &[]);
    let s = std::sync::Arc::new(s);
    let mut handles = Vec::new();
    for c in 0..16u64 {
        let s = s.clone();
        handles.push(std::thread::spawn(move || {
            let mut rng = Rng(c * 7919 + 1);
            for _ in 0..4 {
                let texts: Vec<String> = (0..1 + rng.below(8))
                    .map(|_| {
                        let l = 1 + rng.below(200) as usize;
                        text(&mut rng, l)
                    })
                    .collect();
                let v = embed(&s, "arith-embed", json!(texts));
                for (i, d) in v["data"].as_array().unwrap().iter().enumerate() {
                    let vals: Vec<i64> = texts[i].bytes().map(i64::from).collect();
                    close(
                        d["embedding"].as_array().unwrap(),
                        &arith(&vals, 64),
                        "concurrent",
                    );
                }
            }
        }));
    }
    for h in handles {
        h.join().unwrap();
    }
    let shared = s.metric("loom_cohorts_shared_total{model=\"arith-embed\"}");
    let cohorts = s.metric("loom_cohorts_total{model=\"arith-embed\"}");
    let members = s.metric("loom_cohort_members_total{model=\"arith-embed\"}");
    assert!(
        shared >= 1.0,
        "no cohort was shared: {cohorts} cohorts, {members} members"
    );
    assert!(
        cohorts < members,
        "{cohorts} cohorts for {members} requests"
    );
    // Cohort extents are specialized and reused from the cache.
    assert!(s.metric("loom_specialization_cache_hits_total{model=\"arith-embed\"}") >= 1.0);
}

/// The records of one request are queued together: on an idle model, a request of 24 inputs is one cohort of
/// 24 (queued one by one, the first record would start a cohort of its own while the rest were admitted).
#[test]
fn a_request_of_many_inputs_is_one_cohort() {
    let s = TestServer::start("one-cohort", &[]);
    let mut rng = Rng(77);
    for round in 1..=3 {
        let texts: Vec<String> = (0..24)
            .map(|_| {
                let l = 1 + rng.below(60) as usize;
                text(&mut rng, l)
            })
            .collect();
        let v = embed(&s, "arith-embed", json!(texts));
        for (i, d) in v["data"].as_array().unwrap().iter().enumerate() {
            let vals: Vec<i64> = texts[i].bytes().map(i64::from).collect();
            close(
                d["embedding"].as_array().unwrap(),
                &arith(&vals, 64),
                "one cohort",
            );
        }
        assert_eq!(
            s.metric("loom_cohorts_total{model=\"arith-embed\"}"),
            f64::from(round)
        );
        assert_eq!(
            s.metric("loom_cohort_max_members{model=\"arith-embed\"}"),
            24.0
        );
    }
}

/// A lone request runs its cohort of one on the admitting thread once the model has shown quick cohorts; those
/// results are as right as the scheduler's, and a failing request in place fails only itself.
#[test]
fn lone_requests_run_in_place_once_cohorts_are_quick() {
    let s = TestServer::start("in-place", &[]);
    // A copy of arith-embed whose in-place threshold is 1 s instead of 200 us (what counts as quick depends on
    // the machine; here, a debug build, it is the behaviour that is tested). A bad threshold is refused.
    let base = s.dir.join("arith-embed").display().to_string();
    let options = json!({"max_tokens": 256, "dims": 64, "batch_units": 2048});
    let mut bad = options.clone();
    bad["in_place_cohort_us"] = json!("fast");
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "arith-quick", "base": base, "options": bad}),
    );
    assert!(
        r.text().contains("options.in_place_cohort_us"),
        "{} {}",
        r.status,
        r.text()
    );
    let mut quick = options;
    quick["in_place_cohort_us"] = json!(1_000_000);
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "arith-quick", "base": base, "options": quick, "replace": true}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let mut rng = Rng(4242);
    for i in 0..120 {
        let l = 1 + rng.below(120) as usize;
        let t = text(&mut rng, l);
        let v = embed(&s, "arith-quick", json!(t));
        let vals: Vec<i64> = t.bytes().map(i64::from).collect();
        close(
            v["data"][0]["embedding"].as_array().unwrap(),
            &arith(&vals, 64),
            "in place",
        );
        if i % 40 == 39 {
            // A bad request in between (the package refuses an empty input) fails only itself.
            let r = s.post_json(
                "/v1/embeddings",
                &json!({"model": "arith-quick", "input": ""}),
            );
            assert_eq!(r.status, 400, "{}", r.text());
        }
    }
    let in_place = s.metric("loom_cohorts_in_place_total{model=\"arith-quick\"}");
    let cohorts = s.metric("loom_cohorts_total{model=\"arith-quick\"}");
    assert!(
        in_place >= 1.0,
        "no cohort ran in place ({cohorts} cohorts)"
    );
    assert!(in_place <= cohorts);
    s.healthy();
}

/// The decision oracle: "<instructions>\n<choice>" bytes truncated to 128, scored per the package's formula,
/// then a softmax in f64.
fn decision(instr: &str, choices: &[&str]) -> Vec<f64> {
    let scores: Vec<f64> = choices
        .iter()
        .map(|c| {
            let framed: Vec<u8> = format!("{instr}\n{c}").bytes().take(128).collect();
            let s: f64 = framed
                .iter()
                .enumerate()
                .map(|(t, &v)| v as f64 * (((t + 1) % 7 + 1) as f64))
                .sum();
            s / (64.0 * framed.len() as f64)
        })
        .collect();
    let m = scores.iter().cloned().fold(f64::MIN, f64::max);
    let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
    let z: f64 = e.iter().sum();
    e.iter().map(|x| x / z).collect()
}

#[test]
fn decisions_are_normalised_distributions_matching_the_oracle() {
    let s = TestServer::start("decide", &[]);
    let mut rng = Rng(42);
    let mut questions = serde_json::Map::new();
    let mut expected = Vec::new();
    for q in 0..9 {
        let n = 2 + q % 7;
        let il = rng.below(150) as usize;
        let instr = text(&mut rng, il);
        let choices: Vec<String> = (0..n)
            .map(|i| format!("{i}:{}", text(&mut rng, 1 + q)))
            .collect();
        questions.insert(
            format!("q{q}"),
            json!({"type": "choice", "instructions": instr, "choices": choices}),
        );
        expected.push((format!("q{q}"), instr, choices));
    }
    let r = s.post_json(
        "/v1/decisions",
        &json!({"model": "arith-decision", "questions": questions}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    for (id, instr, choices) in expected {
        let refs: Vec<&str> = choices.iter().map(String::as_str).collect();
        let want = decision(&instr, &refs);
        let a = &v["answers"][&id];
        let mut total = 0.0;
        for (c, w) in choices.iter().zip(&want) {
            let p = a["probabilities"][c].as_f64().unwrap();
            assert!((p - w).abs() < 1e-5, "{id} {c}: {p} vs {w}");
            total += p;
        }
        assert!((total - 1.0).abs() < 1e-5, "{id}: sums to {total}");
        let best = want
            .iter()
            .enumerate()
            .fold((0, f64::MIN), |b, (i, &p)| if p > b.1 { (i, p) } else { b });
        assert_eq!(a["choice"], json!(choices[best.0]));
    }
    // A typed rejection: one choice is not a question.
    let r = s.post_json(
        "/v1/decisions",
        &json!({"model": "arith-decision", "questions": {"x": {"type": "choice", "choices": ["only"]}}}),
    );
    assert_eq!(r.status, 400);
    // The embeddings route does not serve a decision model.
    let r = s.post_json(
        "/v1/embeddings",
        &json!({"model": "arith-decision", "input": "x"}),
    );
    assert_eq!(r.status, 501, "{}", r.text());
}

/// `input.decode` through the server: a copy of arith-embed whose `prepare_request` encodes text with special
/// tokens, decodes the live ids back with SKIP_SPECIAL_TOKENS (1) into at most 12 bytes, and embeds the ids of
/// that text encoded again without special tokens. A text that decodes to more than 12 bytes fails its request
/// with the capacity error (never partial text).
#[test]
fn input_decode_skips_special_tokens_and_fails_past_its_capacity() {
    let s = TestServer::start("tokenizer-decode", &[]);
    let base = s.dir.join("tok-decode");
    crate::support::copy_dir(&s.dir.join("arith-embed"), &base);
    let ctl = std::fs::read_to_string(base.join("control.loom")).unwrap();
    let encode =
        "      %ids, %live = call @input.encode(%body, 4, %max_t)\n      yield %ids, %live\n";
    let decl = "  func.decl @input.encode(buffer, i32, i64) -> (buffer, i64) import(\"input\")\n";
    assert!(
        ctl.contains(encode) && ctl.contains(decl),
        "the fixture's encode call"
    );
    let ctl = ctl.replace(
        decl,
        &format!(
            "{decl}  func.decl @input.decode(buffer, i32, i64) -> (buffer, i64) import(\"input\")\n"
        ),
    );
    let ctl = ctl.replace(
        encode,
        "      %ids, %live = call @input.encode(%body, 4, %max_t)
      %text, %tlen = call @input.decode(buffer.slice(%ids, 0, mul(%live, 4)), 1, 12)
      %again, %n2 = call @input.encode(buffer.slice(%text, 0, %tlen), 0, %max_t)
      yield %again, %n2
",
    );
    std::fs::write(base.join("control.loom"), ctl).unwrap();
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "tok-decode", "base": base.display().to_string(),
                "options": {"tokenizer": "tokenizer", "max_tokens": 8}}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    // [CLS] the [MASK] sat [SEP] decodes to "the sat" without the special tokens: ids [7, 9].
    let v = embed(&s, "tok-decode", json!("the [MASK] sat"));
    close(
        v["data"][0]["embedding"].as_array().unwrap(),
        &arith(&[7, 9], 64),
        "decoded without special tokens",
    );
    // "hello, world!" needs more than 12 bytes: the request fails naming the capacity; the model keeps serving.
    let r = s.post_json(
        "/v1/embeddings",
        &json!({"model": "tok-decode", "input": "Hello, world!"}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        r.text().contains("input.decode: the text needs")
            && r.text().contains("the capacity is 12"),
        "{}",
        r.text()
    );
    let v = embed(&s, "tok-decode", json!("the sat"));
    close(
        v["data"][0]["embedding"].as_array().unwrap(),
        &arith(&[7, 9], 64),
        "after a failed request",
    );
    s.healthy();
}

#[test]
fn a_tokenizer_asset_feeds_input_encode() {
    let s = TestServer::start("tokenizer", &[]);
    let base = s.dir.join("arith-embed").display().to_string();
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "tok", "base": base, "options": {"tokenizer": "tokenizer", "max_tokens": 8}}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    // Ids from the fixture vocabulary, worked out by hand: [CLS] hello , world ! [SEP]
    let v = embed(&s, "tok", json!(["Hello, world!", "the [MASK] sat"]));
    close(
        v["data"][0]["embedding"].as_array().unwrap(),
        &arith(&[2, 5, 14, 6, 13, 3], 64),
        "tokenized",
    );
    close(
        v["data"][1]["embedding"].as_array().unwrap(),
        &arith(&[2, 7, 4, 9, 3], 64),
        "special token in text",
    );
    assert_eq!(v["usage"]["prompt_tokens"], json!(11));
    // Truncation at max_tokens (the encode capacity): 8 of the 12 ids.
    let v = embed(
        &s,
        "tok",
        json!("hello hello hello hello hello hello hello hello hello hello"),
    );
    close(
        v["data"][0]["embedding"].as_array().unwrap(),
        &arith(&[2, 5, 5, 5, 5, 5, 5, 5], 64),
        "truncated",
    );
    // A missing tokenizer asset fails preparation, naming the file.
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "tok2", "base": base, "options": {"tokenizer": "no-such-tokenizer.json"}}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("no-such-tokenizer.json"), "{}", r.text());
}

/// The lookup package: the mean of table rows (gen_table.py's formula) named by the input bytes, read on demand
/// with parameters.gather from descriptors a kernel produced.
fn lookup(values: &[i64]) -> Vec<f64> {
    (0..16)
        .map(|h| {
            values
                .iter()
                .map(|&v| ((((v * 31 + h * 7) % 101) - 50) as f64) / 64.0)
                .sum::<f64>()
                / values.len() as f64
        })
        .collect()
}

/// `prepare_batch` may declare a checkpoint source without declaring a stage: the cold stages run and
/// `parameters.gather` reads the request-time source (a copy of arith-lookup whose table is not declared by
/// cold preparation but by each cohort, one request a cohort, on the cold stages).
#[test]
fn prepare_batch_declares_a_source_for_the_cold_stages() {
    let s = TestServer::start("late-source", &[]);
    let base = s.dir.join("lookup-late");
    crate::support::copy_dir(&s.dir.join("arith-lookup"), &base);
    let edit = |file: &str, from: &str, to: &str| {
        let text = std::fs::read_to_string(base.join(file)).unwrap();
        assert!(text.contains(from), "{file}: {from}");
        std::fs::write(base.join(file), text.replace(from, to)).unwrap();
    };
    edit(
        "prepare.loom",
        "    %src = call @prepare.source(%asset_root, %table)\n    assert cmp.eq(%src, 0), \"the table is source 0\"\n",
        "",
    );
    edit(
        "control.loom",
        "  func.decl @prepare.stage(str, i64) -> i64 import(\"prepare\")\n",
        "  func.decl @prepare.stage(str, i64) -> i64 import(\"prepare\")\n  func.decl @prepare.source(str, str) -> i64 import(\"prepare\")\n",
    );
    edit(
        "control.loom",
        r#"    %t = mul(div(add(%max_n, 7), 8), 8)
    %d = call @prepare.stage("lookup.kernel.descriptors", 0)
    call @prepare.config_i64(%d, "B", %count)
    call @prepare.config_i64(%d, "T", %t)
    %p = call @prepare.stage("lookup.kernel.pool", 1)
    call @prepare.config_i64(%p, "B", %count)
    call @prepare.config_i64(%p, "T", %t)
"#,
        r#"    assert cmp.eq(%count, 1), "one request a cohort (the cold stages hold one)"
    %t = const.i64 128
    %table = call @prepare.source("", "table.safetensors")
    assert cmp.eq(%table, 0), "the table is the first request-time source"
    %p = const.i64 1
"#,
    );
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "lookup-late", "base": base.display().to_string()}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let mut rng = Rng(11);
    for i in 0..4 {
        let t = text(&mut rng, 1 + (i * 37) % 128);
        let v = embed(&s, "lookup-late", json!(t));
        let vals: Vec<i64> = t.bytes().map(i64::from).collect();
        close(
            v["data"][0]["embedding"].as_array().unwrap(),
            &lookup(&vals),
            "request-time source",
        );
    }
    // Every cohort declared the same source: indexed once, then found in the specialization cache.
    assert!(s.metric("loom_specialization_cache_hits_total{model=\"lookup-late\"}") >= 3.0);
    s.healthy();
}

#[test]
fn parameters_gather_reads_rows_named_by_device_descriptors() {
    let s = TestServer::start("gather", &[]);
    let base = s.dir.join("arith-lookup").display().to_string();
    let r = s.post_json("/v1/models", &json!({"base": base}));
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(r.json()["device_bytes"], 0, "the table is not resident");
    let mut rng = Rng(7);
    let texts: Vec<String> = (0..12)
        .map(|i| {
            let l = if i == 0 {
                128
            } else {
                1 + rng.below(128) as usize
            };
            text(&mut rng, l)
        })
        .collect();
    let v = embed(&s, "arith-lookup", json!(texts));
    for (i, d) in v["data"].as_array().unwrap().iter().enumerate() {
        let vals: Vec<i64> = texts[i].bytes().map(i64::from).collect();
        close(d["embedding"].as_array().unwrap(), &lookup(&vals), "lookup");
    }
    // Token ids past the table become a gather error for that request only; the others still succeed.
    let r = s.post_json(
        "/v1/embeddings",
        &json!({"model": "arith-lookup", "input": [[1, 2], [300]]}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("outside the entry"), "{}", r.text());
    let v = embed(&s, "arith-lookup", json!([[1, 2], [255]]));
    close(
        v["data"][1]["embedding"].as_array().unwrap(),
        &lookup(&[255]),
        "after failure",
    );
    // Good requests sent together with bad ones succeed however they are grouped into cohorts (a failed cohort
    // is retried one request at a time, while the next cohorts run: a failure never reaches another
    // request's wait).
    let s = std::sync::Arc::new(s);
    let handles: Vec<_> = (0..48)
        .map(|i| {
            let s = s.clone();
            std::thread::spawn(move || {
                let input = if i % 3 == 0 {
                    json!([[400 + i]])
                } else {
                    json!([[i, i + 1]])
                };
                let r = s.post_json(
                    "/v1/embeddings",
                    &json!({"model": "arith-lookup", "input": input}),
                );
                if i % 3 == 0 {
                    assert_eq!(r.status, 400, "{}", r.text());
                } else {
                    assert_eq!(r.status, 200, "{}", r.text());
                    let v = r.json();
                    close(
                        v["data"][0]["embedding"].as_array().unwrap(),
                        &lookup(&[i, i + 1]),
                        "mixed",
                    );
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

/// `arith-lookup` copied under `name` with `io` set in its model.json (next to the original, so that its
/// `../arith-embed` source still resolves).
fn lookup_package_with_io(s: &TestServer, name: &str, io: serde_json::Value) -> String {
    let from = s.dir.join("arith-lookup");
    let to = s.dir.join(name);
    std::fs::create_dir_all(&to).unwrap();
    for e in std::fs::read_dir(&from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
    let doc = to.join("model.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&doc).unwrap()).unwrap();
    v["name"] = json!(name);
    v["io"] = io;
    std::fs::write(&doc, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    to.display().to_string()
}

#[test]
fn parameters_gather_with_direct_io_refuses_misaligned_rows_and_keeps_serving() {
    let s = TestServer::start("gather-direct", &[]);
    // A bad `io` names its field.
    let bad = lookup_package_with_io(&s, "lookup-bad-io", json!({"direct": "yes"}));
    let r = s.post_json("/v1/models", &json!({"base": bad}));
    assert!(r.status >= 400, "{}", r.text());
    assert!(r.text().contains("field `io.direct`"), "{}", r.text());
    // The table's rows are 64 bytes at file offset 80 + 64 * id: never 4096-byte aligned.
    let base = lookup_package_with_io(&s, "lookup-direct", json!({"direct": true}));
    let r = s.post_json("/v1/models", &json!({"base": base}));
    assert_eq!(r.status, 201, "{}", r.text());
    let r = s.post_json(
        "/v1/models",
        &json!({"base": s.dir.join("arith-lookup").display().to_string()}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    for round in 0..2 {
        let r = s.post_json(
            "/v1/embeddings",
            &json!({"model": "lookup-direct", "input": [[1, 2]]}),
        );
        assert!(r.status >= 400, "round {round}: {}", r.text());
        let t = r.text();
        if t.contains("refuses direct I/O") {
            eprintln!(
                "SKIPPED the alignment check: the file system of {} refuses O_DIRECT: {t}",
                s.dir.display()
            );
        } else {
            assert!(
                t.contains("direct I/O needs 4096-byte aligned ranges: offset 144 length 64"),
                "round {round}: {t}"
            );
        }
        // The buffered model on the same device keeps serving.
        let v = embed(&s, "arith-lookup", json!([[1, 2], [255]]));
        close(
            v["data"][1]["embedding"].as_array().unwrap(),
            &lookup(&[255]),
            "next to a failing direct gather",
        );
    }
}

/// Failed readiness is never success: when a gather fails, the dispatch that waits on its fence fails with the
/// read's message instead of running on the rows nobody read. Shown with a pooling stage that spins for a while
/// after pooling: a request whose gather fails answers well before a good one, which runs the spin.
#[test]
fn a_failed_gather_fails_its_consumers_without_running_them() {
    let s = TestServer::start("gather-ready", &[]);
    let base = s.dir.join("lookup-slow");
    crate::support::copy_dir(&s.dir.join("arith-lookup"), &base);
    let kernel = std::fs::read_to_string(base.join("kernel.loom")).unwrap();
    let kernel = kernel
        .replace(
            "    dispatch @mean_rows<B = B, T = T, H = H>(%x, %rows, %y)\n",
            "    dispatch @mean_rows<B = B, T = T, H = H>(%x, %rows, %y)\n    dispatch @spin<B = B, H = H>(%y)\n",
        )
        .replace(
            "  export stage @pool<",
            "  // Spins after pooling (adds zero), so that running this stage takes a while.
  export kernel @spin<B: i64, H: i64>
      grid(B)
      (%y: buffer<f32, [B, H]> readwrite)
  {
    %b = program_id 0
    %rh = tile.range 0, H
    %e = tile.load %y[%b, %rh], 0.0
    %z = tile.zeros : tile<[H], f32>
    %acc = for %i = 0 to 30000000 iter(%a = %z : tile<[H], f32>) -> tile<[H], f32> {
      yield mul(%a, 0.5)
    }
    tile.store %y[%b, %rh], add(%e, %acc)
  }

  export stage @pool<",
        );
    assert!(kernel.contains("@spin<B = B"), "the fixture edit applies");
    std::fs::write(base.join("kernel.loom"), kernel).unwrap();
    let doc = std::fs::read_to_string(base.join("model.json"))
        .unwrap()
        .replace("\"name\": \"arith-lookup\"", "\"name\": \"lookup-slow\"");
    std::fs::write(base.join("model.json"), doc).unwrap();
    let r = s.post_json("/v1/models", &json!({"base": base.display().to_string()}));
    assert_eq!(r.status, 201, "{}", r.text());
    // Warm the stages for one-value inputs, then time a good request and a bad one of the same shape.
    let v = embed(&s, "lookup-slow", json!([[7]]));
    close(
        v["data"][0]["embedding"].as_array().unwrap(),
        &lookup(&[7]),
        "warm",
    );
    let t0 = std::time::Instant::now();
    let v = embed(&s, "lookup-slow", json!([[9]]));
    let good = t0.elapsed();
    close(
        v["data"][0]["embedding"].as_array().unwrap(),
        &lookup(&[9]),
        "good",
    );
    let t0 = std::time::Instant::now();
    let r = s.post_json(
        "/v1/embeddings",
        &json!({"model": "lookup-slow", "input": [[300]]}),
    );
    let bad = t0.elapsed();
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("outside the entry"), "{}", r.text());
    assert!(
        bad * 3 < good,
        "the failed gather's consumer ran: {bad:?} for the failing request, {good:?} for a good one"
    );
    // The failure stays with that request: a good request after it succeeds.
    let v = embed(&s, "lookup-slow", json!([[11]]));
    close(
        v["data"][0]["embedding"].as_array().unwrap(),
        &lookup(&[11]),
        "after",
    );
    s.healthy();
}

/// A package whose cold preparation selects a memory forecast (`fixtures/forecast-embed`: arith-embed with
/// `options.memory_forecast` and a 64 KiB budget): a request that cannot fit alone is refused with 413 before
/// any record is prepared, naming the estimates; one that fits is served as usual. Bad selections fail the
/// registration naming the entry.
#[test]
fn a_memory_forecast_refuses_requests_that_cannot_fit_alone() {
    let s = TestServer::start("forecast", &[]);
    let base = s.dir.join("forecast-embed").display().to_string();
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "forecast-embed", "base": base}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let mut rng = Rng(0xf00d);
    let inputs =
        |n: usize, rng: &mut Rng| -> Vec<String> { (0..n).map(|_| text(rng, 200)).collect() };
    // 16 records of 200 bytes: 16 x 209 i32 + 16 x 64 f32 = 17,472 bytes forecast; served, as arith-embed.
    let small = inputs(16, &mut rng);
    let v = embed(&s, "forecast-embed", json!(small));
    for (i, t) in small.iter().enumerate() {
        let values: Vec<i64> = t.bytes().map(i64::from).collect();
        close(
            v["data"][i]["embedding"].as_array().unwrap(),
            &arith(&values, 64),
            &format!("input {i}"),
        );
    }
    // 64 records: 64 x 209 x 4 + 64 x 64 x 4 = 69,888 bytes of private peak > 65,536: never fits.
    let big = inputs(64, &mut rng);
    let r = s.post_json(
        "/v1/embeddings",
        &json!({"model": "forecast-embed", "input": big}),
    );
    assert_eq!(r.status, 413, "{}", r.text());
    let text = r.text();
    assert!(
        text.contains("forecasts 102656 device bytes")
            && text.contains("private peak 69888")
            && text.contains("leaves 65536 bytes"),
        "{text}"
    );
    assert!(
        !text.contains("input 0"),
        "the whole request's error: {text}"
    );
    // The same records in requests that fit are served; the model keeps serving.
    let v = embed(&s, "forecast-embed", json!(big[..8]));
    assert_eq!(v["data"].as_array().unwrap().len(), 8);
    // Bad selections: an entry the control program lacks, one with another signature.
    for (entry, want) in [
        ("nope", "prepare.memory_forecast selected `nope`"),
        (
            "prepare_request",
            "prepare.memory_forecast selected `prepare_request`",
        ),
    ] {
        let r = s.post_json(
            "/v1/models",
            &json!({"name": "bad", "base": base,
                    "options": {"max_tokens": 256, "dims": 64, "batch_units": 2048, "memory_forecast": entry}}),
        );
        assert!(r.status == 400 || r.status == 422, "{entry}: {}", r.text());
        assert!(r.text().contains(want), "{entry}: {}", r.text());
    }
    s.healthy();
}

/// Work within one invocation is ordered by its fences and buffer hazards only. The `branches` fixture runs
/// the embedding twice from the same input into two buffers of its own (no fence, no shared written buffer:
/// independent), then a stage that averages them. The two go on chains of their own (the model holds two
/// work timelines after its first request; one chain per invocation before this change), the average waits on
/// both through the buffers it reads, and every result matches the oracle, for a batch of ragged inputs and
/// for concurrent requests. A model whose stages form one chain keeps one timeline per invocation.
#[test]
fn independent_stages_of_one_invocation_go_on_chains_of_their_own() {
    let s = TestServer::start("branches", &[]);
    let base = s.dir.join("branches");
    let r = s.post_json("/v1/models", &json!({"base": base.display().to_string()}));
    assert_eq!(r.status, 201, "{}", r.text());
    let texts = [
        "a",
        "independent stages",
        "of one invocation, joined by a third",
    ];
    let v = embed(&s, "branches", json!(texts));
    for (i, t) in texts.iter().enumerate() {
        let vals: Vec<i64> = t.bytes().map(i64::from).collect();
        close(
            v["data"][i]["embedding"].as_array().unwrap(),
            &arith(&vals, 64),
            &format!("input {i}"),
        );
    }
    assert_eq!(s.metric("loom_work_timelines{model=\"branches\"}"), 2.0);
    std::thread::scope(|sc| {
        for c in 0..4 {
            let s = &s;
            sc.spawn(move || {
                for k in 0..6 {
                    let t = format!("client {c} request {k}: {}", "x".repeat(k * 7));
                    let v = embed(s, "branches", json!(t));
                    let vals: Vec<i64> = t.bytes().map(i64::from).collect();
                    close(
                        v["data"][0]["embedding"].as_array().unwrap(),
                        &arith(&vals, 64),
                        &t,
                    );
                }
            });
        }
    });
    let held = s.metric("loom_work_timelines{model=\"branches\"}");
    assert!(
        held >= 2.0 && held % 1.0 == 0.0,
        "{held} timelines after concurrent requests"
    );
    // One chain: the embedding alone.
    embed(&s, "arith-embed", json!("one stage"));
    assert_eq!(s.metric("loom_work_timelines{model=\"arith-embed\"}"), 1.0);
    s.healthy();
}

/// A stage that reads gathered rows waits for the gather because it reads its target (a buffer hazard), not
/// only because the package joined the gather's fence: arith-lookup without its `runner.join` pools the rows
/// the gather read, and stays on one chain (the gather waited on the descriptor work, so the pooling follows
/// that chain). Without the hazard nothing would order the pooling after the read; on the CPU device the race
/// did not show in a run of this test with hazards switched off (the read is quick and the jobs lock their
/// buffers), so this is a check of the ordering, not a demonstration of the race.
#[test]
fn a_stage_reading_gathered_rows_waits_for_the_gather_without_a_join() {
    let s = TestServer::start("gather-hazard", &[]);
    let base = s.dir.join("lookup-nojoin");
    crate::support::copy_dir(&s.dir.join("arith-lookup"), &base);
    let control = std::fs::read_to_string(base.join("control.loom")).unwrap();
    let edited = control.replace("    call @runner.join(%g)\n", "");
    assert_ne!(edited, control, "the fixture edit applies");
    std::fs::write(base.join("control.loom"), edited).unwrap();
    let doc = std::fs::read_to_string(base.join("model.json"))
        .unwrap()
        .replace("\"name\": \"arith-lookup\"", "\"name\": \"lookup-nojoin\"");
    std::fs::write(base.join("model.json"), doc).unwrap();
    let r = s.post_json("/v1/models", &json!({"base": base.display().to_string()}));
    assert_eq!(r.status, 201, "{}", r.text());
    for round in 0..8i64 {
        let inputs: Vec<Vec<i64>> = (0..5)
            .map(|i| {
                (0..(1 + (round * 5 + i) % 40))
                    .map(|t| (t * 37 + round * 11 + i) % 256)
                    .collect()
            })
            .collect();
        let v = embed(&s, "lookup-nojoin", json!(inputs));
        for (i, vals) in inputs.iter().enumerate() {
            close(
                v["data"][i]["embedding"].as_array().unwrap(),
                &lookup(vals),
                &format!("round {round} input {i}"),
            );
        }
    }
    assert_eq!(
        s.metric("loom_work_timelines{model=\"lookup-nojoin\"}"),
        1.0
    );
    // A failed gather still fails the stage that reads its rows.
    let r = s.post_json(
        "/v1/embeddings",
        &json!({"model": "lookup-nojoin", "input": [[300]]}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("outside the entry"), "{}", r.text());
    let v = embed(&s, "lookup-nojoin", json!([[5, 6]]));
    close(
        v["data"][0]["embedding"].as_array().unwrap(),
        &lookup(&[5, 6]),
        "after",
    );
    s.healthy();
}

/// embed-head's documented formula over its upstream's embedding `e` (D = 64): y[j] = 3 e[63 - j] + 1.
fn head(e: &[f64]) -> Vec<f64> {
    (0..64).map(|j| 3.0 * e[63 - j] + 1.0).collect()
}

/// Registers the embed-head fixture (a consumer of arith-embed's results on the device) as `name`.
fn register_head(s: &TestServer, name: &str, options: serde_json::Value) {
    let base = s.dir.join("embed-head");
    let r = s.post_json(
        "/v1/models",
        &json!({"name": name, "base": base.display().to_string(), "options": options}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
}

/// A consumer model reads its upstream model's results on the device (issue 15 item 5): embed-head names
/// arith-embed as its upstream, so each of its requests is embedded by arith-embed, whose rows stay on the
/// device (counted, never downloaded: arith-embed's download bytes do not move) and are read by embed-head's
/// stage, which waits on arith-embed's readiness. Results match the oracle in a batch and while direct
/// arith-embed requests share the producer's cohorts.
#[test]
fn a_consumer_reads_its_upstream_models_results_on_the_device() {
    let s = TestServer::start("upstream", &[]);
    register_head(&s, "embed-head", json!({}));
    let texts = [
        "a",
        "device rows",
        "read by another model",
        "without a host round trip",
        "e",
    ];
    let downloads = "loom_result_download_bytes_total{model=\"arith-embed\"}";
    let on_device = "loom_device_results_total{model=\"arith-embed\"}";
    let (d0, r0) = (s.metric(downloads), s.metric(on_device));
    let v = embed(&s, "embed-head", json!(texts));
    for (i, t) in texts.iter().enumerate() {
        let vals: Vec<i64> = t.bytes().map(i64::from).collect();
        close(
            v["data"][i]["embedding"].as_array().unwrap(),
            &head(&arith(&vals, 64)),
            &format!("input {i}"),
        );
    }
    assert_eq!(
        s.metric(downloads),
        d0,
        "nothing of arith-embed's was downloaded"
    );
    assert_eq!(s.metric(on_device), r0 + texts.len() as f64);
    assert!(s.metric("loom_result_download_bytes_total{model=\"embed-head\"}") > 0.0);
    // Consumers and direct clients of the producer at once: the producer's cohorts keep them apart.
    std::thread::scope(|sc| {
        for c in 0..4 {
            let s = &s;
            sc.spawn(move || {
                for k in 0..6 {
                    let t = format!("client {c} request {k}: {}", "y".repeat(k * 5));
                    let vals: Vec<i64> = t.bytes().map(i64::from).collect();
                    let (model, want) = if (c + k) % 2 == 0 {
                        ("embed-head", head(&arith(&vals, 64)))
                    } else {
                        ("arith-embed", arith(&vals, 64))
                    };
                    let v = embed(s, model, json!([t.clone(), "z"]));
                    close(v["data"][0]["embedding"].as_array().unwrap(), &want, &t);
                }
            });
        }
    });
    // A bad client record fails at the producer, naming it; the consumer goes on serving.
    let r = s.post_json(
        "/v1/embeddings",
        &json!({"model": "embed-head", "input": "x".repeat(300)}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("max_tokens"), "{}", r.text());
    assert!(
        !r.text().contains(&s.dir.display().to_string()),
        "{}",
        r.text()
    );
    embed(&s, "embed-head", json!("still serving"));
    // The upstream must be a finite model of the same role: arith-decision serves decisions.
    let base = s.dir.join("wrong-head");
    crate::support::copy_dir(&s.dir.join("embed-head"), &base);
    let doc = std::fs::read_to_string(base.join("model.json"))
        .unwrap()
        .replace(
            "\"model\": \"arith-embed\"",
            "\"model\": \"arith-decision\"",
        );
    std::fs::write(base.join("model.json"), doc).unwrap();
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "wrong-head", "base": base.display().to_string()}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let r = s.post_json(
        "/v1/embeddings",
        &json!({"model": "wrong-head", "input": "x"}),
    );
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(
        r.text().contains("arith-decision") && r.text().contains("serves decisions"),
        "{}",
        r.text()
    );
    s.healthy();
}

/// A consumer's results outlive their producer: with embed-head slowed down so that arith-embed's results
/// wait in its queue, arith-embed is unregistered while embed-head still holds them (they are charged to
/// embed-head's budget, and their readiness is the device's). Every request completes with the oracle's
/// values; then the consumer answers 503 naming its missing upstream, and serves again once it is back.
#[test]
fn a_consumer_keeps_its_upstream_results_after_the_producer_is_unregistered() {
    let s = TestServer::start("upstream-gone", &[]);
    register_head(
        &s,
        "head-slow",
        json!({"batch_units": 1, "slow": 8_000_000}),
    );
    let idle = s.request("GET", "/v1/models/head-slow", b"").json()["device_bytes"]
        .as_f64()
        .unwrap();
    let texts: Vec<String> = (0..6)
        .map(|i| format!("held result {i} {}", "q".repeat(i)))
        .collect();
    let at_upstream = "loom_requests_upstream{model=\"head-slow\"}";
    // Requests at the consumer: waiting, or in a cohort not yet answered (parked for its stage's
    // compilation, or on the device).
    let held = || {
        s.metric("loom_queue_depth{model=\"head-slow\"}")
            + s.metric("loom_requests_running{model=\"head-slow\"}")
    };
    std::thread::scope(|sc| {
        let mut clients = Vec::new();
        for t in &texts {
            let s = &s;
            clients.push(sc.spawn(move || embed(s, "head-slow", json!(t))));
        }
        // Wait until the producer has handed every result on and some wait in the consumer's queue.
        let t0 = std::time::Instant::now();
        while !(s.metric(at_upstream) == 0.0 && held() >= 3.0) {
            assert!(
                t0.elapsed().as_secs() < 60,
                "results never held at the consumer: {} held, {} at the upstream",
                held(),
                s.metric(at_upstream)
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let bytes = s.request("GET", "/v1/models/head-slow", b"").json()["device_bytes"]
            .as_f64()
            .unwrap();
        assert!(
            bytes > idle,
            "the held results are charged to the consumer ({bytes} vs {idle})"
        );
        let r = s.request("DELETE", "/v1/models/arith-embed", b"");
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(
            held() >= 1.0,
            "the consumer still held results when the producer left"
        );
        for (t, c) in texts.iter().zip(clients) {
            let v = c.join().unwrap();
            let vals: Vec<i64> = t.bytes().map(i64::from).collect();
            close(
                v["data"][0]["embedding"].as_array().unwrap(),
                &head(&arith(&vals, 64)),
                t,
            );
        }
    });
    let r = s.post_json(
        "/v1/embeddings",
        &json!({"model": "head-slow", "input": "x"}),
    );
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(
        r.text().contains("arith-embed") && r.text().contains("not registered"),
        "{}",
        r.text()
    );
    let base = s.dir.join("arith-embed");
    let r = s.post_json("/v1/models", &json!({"base": base.display().to_string()}));
    assert_eq!(r.status, 201, "{}", r.text());
    let v = embed(&s, "head-slow", json!("back"));
    close(
        v["data"][0]["embedding"].as_array().unwrap(),
        &head(&arith(&b"back".map(i64::from), 64)),
        "back",
    );
    let after = s.request("GET", "/v1/models/head-slow", b"").json()["device_bytes"]
        .as_f64()
        .unwrap();
    assert!(
        after <= idle + 65536.0,
        "results were released ({after} vs {idle})"
    );
    s.healthy();
}

/// A consumer's client that disconnects while its request is still at the upstream model loses nothing else:
/// the request is dropped there (or its rows are handed on and its consumer cohort stopped), the consumer's
/// count of requests at its upstream returns to 0, and the consumer unregisters (its drain waits for what it
/// accepted) and serves as before. The upstream is slow-embed, busy with a request of its own.
#[test]
fn a_consumer_request_cancelled_at_its_upstream_is_dropped_cleanly() {
    let s = TestServer::start("upstream-cancel", &[]);
    let r = s.post_json(
        "/v1/models",
        &json!({"base": s.dir.join("slow-embed").display().to_string()}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let base = s.dir.join("head-on-slow");
    crate::support::copy_dir(&s.dir.join("embed-head"), &base);
    let doc = std::fs::read_to_string(base.join("model.json"))
        .unwrap()
        .replace("\"model\": \"arith-embed\"", "\"model\": \"slow-embed\"");
    std::fs::write(base.join("model.json"), doc).unwrap();
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "head-on-slow", "base": base.display().to_string()}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let want = |t: &str| head(&arith(&t.bytes().map(i64::from).collect::<Vec<_>>(), 64));
    let v = embed(&s, "head-on-slow", json!("warm"));
    close(
        v["data"][0]["embedding"].as_array().unwrap(),
        &want("warm"),
        "warm",
    );
    let m = |k: &str| s.metric(&format!("{k}{{model=\"head-on-slow\"}}"));
    std::thread::scope(|sc| {
        let busy = sc.spawn(|| embed(&s, "slow-embed", json!("busy")));
        std::thread::sleep(std::time::Duration::from_millis(30));
        let body = json!({"model": "head-on-slow", "input": ["a", "bb", "ccc"]}).to_string();
        let mut c = std::net::TcpStream::connect(&s.addr).unwrap();
        write!(
            c,
            "POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let t0 = std::time::Instant::now();
        while m("loom_requests_upstream") < 3.0 {
            assert!(
                t0.elapsed().as_secs() < 30,
                "the request never reached the upstream"
            );
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        drop(c);
        busy.join().unwrap();
    });
    let t0 = std::time::Instant::now();
    while m("loom_requests_upstream") + m("loom_queue_depth") + m("loom_requests_running") > 0.0 {
        assert!(
            t0.elapsed().as_secs() < 30,
            "the cancelled requests were never settled"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let up = |k: &str| s.metric(&format!("{k}{{model=\"slow-embed\"}}"));
    assert_eq!(
        up("loom_cancelled_waiting_total") + up("loom_cancelled_running_total"),
        3.0,
        "the upstream dropped the three cancelled requests"
    );
    assert_eq!(
        m("loom_requests_failed_total"),
        3.0,
        "the consumer answered them (to nobody)"
    );
    let v = embed(&s, "head-on-slow", json!("after"));
    close(
        v["data"][0]["embedding"].as_array().unwrap(),
        &want("after"),
        "after",
    );
    let r = s.request("DELETE", "/v1/models/head-on-slow", b"");
    assert_eq!(r.status, 200, "{}", r.text());
    s.healthy();
}
