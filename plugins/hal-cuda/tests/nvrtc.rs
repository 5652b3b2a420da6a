//! The real CUDA compiler on every CUDA kernel `loom-emit` writes for the motif packages and the HAL
//! conformance suite, with no GPU: each kernel's CUDA C is compiled by NVRTC (`hal_cuda::kernel_ptx`, the
//! function the device's `compile` uses) for `compute_80` and `compute_90`, and the PTX is assembled by
//! `ptxas -arch=sm_80` / `sm_90`. Every exported stage of `packages/motifs/` is specialized at its defaults and
//! at the ragged shapes and epilogues the other motif tests use; then the conformance suite's stages (every
//! GGUF dequantisation, the division-by-zero and loop-step kernels) and `loom_testkit::corpus` (every op, dtype
//! and access kind, also `loom-emit`'s `tests/ops.rs`).
//!
//! Tools: NVRTC from `$LOOM_NVRTC` (the library or its folder), else `.models/cuda/lib/` (what
//! `scripts/fetch-cuda-tools.sh` unpacks), else the system's; ptxas from `$LOOM_PTXAS`, else
//! `.models/cuda/bin/ptxas`, else `/usr/local/cuda/bin/ptxas` or `ptxas` on `PATH`. Without them the test prints
//! one `skipped:` line and passes, unless `LOOM_REQUIRE_CUDA_TOOLS=1` (set by `scripts/test.sh`), where it fails.
//!
//! What the CUDA emitter refuses (`Error::Unsupported`) is an expected list, so a new refusal fails the test,
//! and so does a refusal that went away (update the list).

use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use hal_cuda::kernel_ptx;
use hal_cuda::nvrtc::Nvrtc;
use loom_compiler::Catalog;
use loom_ir::kernel::{Access, DType, Kernel, Stage};
use loom_ir::{DeviceKind, TValue};

/// (virtual architecture for NVRTC, real architecture for ptxas).
const ARCHES: &[(&str, &str)] = &[("compute_80", "sm_80"), ("compute_90", "sm_90")];

/// Kernels the CUDA emitter refuses today, as (case, kernel name without template values).
/// None: every kernel of the motifs, the conformance suite (Q4_K / Q6_K included) and the corpus is emitted.
const EXPECTED_UNSUPPORTED: &[(&str, &str)] = &[];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

struct Tools {
    nvrtc: &'static Nvrtc,
    ptxas: PathBuf,
}

fn env_path(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

fn find_nvrtc() -> Result<&'static Nvrtc, String> {
    if let Some(p) = env_path("LOOM_NVRTC") {
        return Nvrtc::open(&p).map(|n| &*Box::leak(Box::new(n)));
    }
    let local = repo().join(".models/cuda/lib/libnvrtc.so.12");
    if local.exists() {
        return Nvrtc::open(&local).map(|n| &*Box::leak(Box::new(n)));
    }
    Nvrtc::get()
}

fn find_ptxas() -> Result<PathBuf, String> {
    if let Some(p) = env_path("LOOM_PTXAS") {
        return Ok(p);
    }
    let mut tried = Vec::new();
    for p in [
        repo().join(".models/cuda/bin/ptxas"),
        PathBuf::from("/usr/local/cuda/bin/ptxas"),
    ] {
        if p.is_file() {
            return Ok(p);
        }
        tried.push(p.display().to_string());
    }
    if Command::new("ptxas").arg("--version").output().is_ok() {
        return Ok(PathBuf::from("ptxas"));
    }
    tried.push("ptxas on PATH".into());
    Err(format!("no ptxas (tried {})", tried.join(", ")))
}

/// The tools, or `None` after a skip line (a panic where `LOOM_REQUIRE_CUDA_TOOLS=1`).
fn tools() -> Option<Tools> {
    let found = find_nvrtc().and_then(|nvrtc| Ok((nvrtc, find_ptxas()?)));
    match found {
        Ok((nvrtc, ptxas)) => Some(Tools { nvrtc, ptxas }),
        Err(why) => {
            let require = std::env::var("LOOM_REQUIRE_CUDA_TOOLS").is_ok_and(|v| v == "1");
            assert!(
                !require,
                "LOOM_REQUIRE_CUDA_TOOLS=1 but the CUDA tools are missing: {why} \
                 (run scripts/fetch-cuda-tools.sh)"
            );
            eprintln!(
                "skipped: NVRTC/ptxas check of the emitted CUDA C: {why} \
                 (run scripts/fetch-cuda-tools.sh, or set LOOM_NVRTC and LOOM_PTXAS)"
            );
            None
        }
    }
}

// ---- the kernels -----------------------------------------------------------------------------------------

fn catalog() -> &'static Catalog {
    loom_testkit::motif_catalog()
}

fn int(v: i64) -> TValue {
    TValue::I64(v)
}

type Config = Vec<(&'static str, TValue)>;

/// Configurations beyond the defaults: the ragged shapes and every epilogue the other motif tests use.
fn extra_configs(stage: &str) -> Vec<Config> {
    let mnk = |m, n, k| vec![("M", int(m)), ("N", int(n)), ("K", int(k))];
    let with_act = |mut c: Config, act: &str| {
        c.push(("ACT", TValue::Str(act.into())));
        c
    };
    match stage {
        "motifs.gemm.dense" => ["none", "gelu_erf", "gelu_tanh", "silu"]
            .iter()
            .flat_map(|a| [with_act(mnk(64, 64, 64), a), with_act(mnk(37, 45, 70), a)])
            .chain([with_act(mnk(1, 3, 129), "silu")])
            .collect(),
        "motifs.gemm.dense_nt" => ["none", "gelu_erf"]
            .iter()
            .map(|a| with_act(mnk(37, 45, 70), a))
            .collect(),
        "motifs.gemm.dense_nt_add" | "motifs.gemm.dense_add" => vec![mnk(37, 45, 70)],
        "motifs.norm.layernorm"
        | "motifs.norm.rmsnorm"
        | "motifs.norm.l2norm"
        | "motifs.softmax.softmax" => [(13, 37), (5, 4096)]
            .iter()
            .map(|&(r, c)| vec![("R", int(r)), ("C", int(c))])
            .collect(),
        "motifs.embed.embed" => vec![vec![("R", int(7)), ("H", int(33)), ("V", int(50))]],
        "motifs.pool.mean_pooling" => vec![vec![("B", int(3)), ("T", int(5)), ("H", int(37))]],
        "motifs.act.gelu_erf"
        | "motifs.act.gelu_tanh"
        | "motifs.act.silu"
        | "motifs.act.silu_mul" => {
            vec![vec![("N", int(1000))], vec![("N", int(3))]]
        }
        "motifs.attention.attention_padded" => vec![vec![
            ("B", int(1)),
            ("S", int(37)),
            ("H", int(6)),
            ("KV", int(3)),
            ("D", int(40)),
        ]],
        "motifs.attention.attention_causal" => vec![vec![
            ("B", int(1)),
            ("S", int(37)),
            ("T", int(42)),
            ("H", int(6)),
            ("KV", int(3)),
            ("D", int(40)),
        ]],
        "motifs.rope.rope" | "motifs.rope.rope_qk" => {
            vec![vec![("N", int(5)), ("H", int(3)), ("D", int(10))]]
        }
        _ => vec![],
    }
}

/// (case, stage): every exported motif stage at each configuration.
fn motif_stages() -> Vec<(String, Stage)> {
    let cat = catalog();
    let mut out = Vec::new();
    for (mi, e) in cat.entries().iter().enumerate() {
        for item in &e.module.device {
            if item.kind != DeviceKind::Stage || !item.exported {
                continue;
            }
            let name = format!("{}.{}", e.module.name, item.name);
            for cfg in std::iter::once(vec![]).chain(extra_configs(&name)) {
                let c: Vec<(String, TValue)> = cfg
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.clone()))
                    .collect();
                let st = loom_kernel::specialize_stage(cat, mi, &item.name, &c)
                    .unwrap_or_else(|e| panic!("{name} {cfg:?}: {}", e.join("")));
                out.push((name.clone(), st));
            }
        }
    }
    out
}

/// The conformance suite's hand-built error kernels: integer division by zero, a loop step from a buffer, and
/// the run-time bounds kernel (a loop counted against the step allowance, polling the cancellation word).
fn error_kernels() -> Vec<(String, Kernel)> {
    use loom_testkit::{KB, i};
    let mut kb = KB::new("div", [1, 1, 1]);
    let pa = kb.param("a", DType::I32, &[8], Access::Read);
    let pb = kb.param("b", DType::I32, &[8], Access::Read);
    let po = kb.param("o", DType::I32, &[8], Access::Write);
    let r = kb.range(i(0), 8);
    let a = kb.load(pa, vec![r.clone()], None);
    let b = kb.load(pb, vec![r.clone()], None);
    let q = kb.div(a, b);
    kb.store(po, vec![r], q);
    let div = kb.finish();

    let mut kb = KB::new("steps", [1, 1, 1]);
    let ps = kb.param("s", DType::I64, &[1], Access::Read);
    let po = kb.param("o", DType::I64, &[1], Access::Write);
    let step = kb.load(ps, vec![i(0)], None);
    let sum = kb.for_(i(0), i(4), step, vec![i(0)], |kb, iv, it| {
        vec![kb.add(it[0].clone(), iv)]
    });
    kb.store(po, vec![i(0)], sum[0].clone());
    let steps = kb.finish();
    vec![
        ("conformance.div".into(), div),
        ("conformance.steps".into(), steps),
        (
            "conformance.bounded".into(),
            loom_testkit::corpus::counted_loop(4),
        ),
    ]
}

/// (case, kernel): every kernel of every case, in order.
fn all_kernels() -> Vec<(String, Kernel)> {
    let mut v: Vec<(String, Kernel)> = Vec::new();
    for (case, st) in motif_stages() {
        v.extend(st.kernels.into_iter().map(|k| (case.clone(), k)));
    }
    for d in ["q8_0", "q4_0", "q4_1", "q4_k", "q6_k"] {
        let st = loom_testkit::dequant_stage(d, &[("R", 3), ("C", 512), ("BR", 2), ("BC", 96)]);
        v.extend(
            st.kernels
                .into_iter()
                .map(|k| (format!("conformance.qload.{d}"), k)),
        );
    }
    v.extend(error_kernels());
    v.extend(
        loom_testkit::corpus::all()
            .into_iter()
            .map(|(name, k)| (format!("corpus.{name}"), k)),
    );
    v
}

fn base_name(kernel: &str) -> &str {
    kernel.split('<').next().unwrap_or(kernel)
}

/// `ptxas -arch=<sm>` on `ptx` (through a temporary file): Ok(warnings) or the error output.
fn ptxas(tools: &Tools, dir: &Path, function: &str, sm: &str, ptx: &str) -> Result<String, String> {
    // Distinct kernels can share a function name (one kernel at several shapes) and workers run at once: a
    // serial number keeps their files apart.
    static SERIAL: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let src = dir.join(format!("{function}.{sm}.{n}.ptx"));
    let out = dir.join(format!("{function}.{sm}.{n}.cubin"));
    std::fs::write(&src, ptx).expect("write the PTX");
    let run = Command::new(&tools.ptxas)
        .arg(format!("-arch={sm}"))
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .output()
        .map_err(|e| format!("{}: {e}", tools.ptxas.display()))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    let _ = std::fs::remove_file(&src);
    if !run.status.success() {
        return Err(format!("ptxas -arch={sm} failed ({}):\n{text}", run.status));
    }
    let cubin = std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0);
    let _ = std::fs::remove_file(&out);
    if cubin == 0 {
        return Err(format!("ptxas -arch={sm} wrote no cubin:\n{text}"));
    }
    Ok(text)
}

/// NVRTC diagnostics the generated code may give without a defect: #550, a value set but never read (index
/// tiles whose elements the gathers recompute instead of reading the registers).
const BENIGN: &[&str] = &["warning #550-D"];

/// NVRTC's log without its benign diagnostics (each diagnostic is its `file(line): warning ...` line and the
/// excerpt and caret lines after it; the `Remark:` footer goes too).
fn significant(log: &str) -> String {
    let mut out = Vec::new();
    let mut skip = false;
    for line in log.lines() {
        if line.contains("): warning") || line.contains("): error") {
            skip = BENIGN.iter().any(|b| line.contains(b));
        } else if line.starts_with("Remark: The warnings can be suppressed") {
            skip = true;
        }
        if !skip && !line.trim().is_empty() {
            out.push(line);
        }
    }
    out.join("\n")
}

/// One compilation: a distinct CUDA C source for one architecture.
struct Job<'a> {
    case: &'a str,
    kernel: &'a Kernel,
    arch: &'static str,
    sm: &'static str,
}

#[derive(Default)]
struct Outcome {
    failures: Vec<String>,
    warnings: Vec<String>,
    compiled: usize,
    nvrtc: std::time::Duration,
    ptxas: std::time::Duration,
}

fn run_job(tools: &Tools, dir: &Path, job: &Job<'_>, out: &mut Outcome) {
    let (case, k, arch, sm) = (job.case, job.kernel, job.arch, job.sm);
    let t = std::time::Instant::now();
    let r = kernel_ptx(tools.nvrtc, k, arch);
    out.nvrtc += t.elapsed();
    let (m, ptx) = match r {
        Ok(r) => r,
        Err(e) => {
            out.failures.push(format!("{case}: {arch}: {e}"));
            return;
        }
    };
    let log = significant(&ptx.log);
    if !log.is_empty() {
        out.warnings
            .push(format!("{case}: `{}` {arch}: NVRTC:\n{log}", k.name));
    }
    let t = std::time::Instant::now();
    let r = ptxas(tools, dir, &format!("{}.{arch}", m.function), sm, &ptx.text);
    out.ptxas += t.elapsed();
    match r {
        Ok(w) if !w.trim().is_empty() => {
            out.warnings
                .push(format!("{case}: `{}` {sm}: ptxas: {}", k.name, w.trim()))
        }
        Ok(_) => {}
        Err(e) => out.failures.push(format!(
            "{case}: `{}`: {e}\n--- CUDA C ---\n{}",
            k.name, m.source
        )),
    }
    out.compiled += 1;
}

#[test]
fn every_emitted_cuda_kernel_compiles_with_nvrtc_and_assembles_with_ptxas() {
    let Some(tools) = tools() else { return };
    let start = std::time::Instant::now();
    let dir = std::env::temp_dir().join(format!("loom-nvrtc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temporary folder");

    // Emission is cheap: emit everything first, keep one job per distinct source and architecture (kernels
    // repeat across stages and configurations), and record what the emitter refuses.
    let kernels = all_kernels();
    let mut seen = HashSet::new();
    let mut refused = BTreeSet::new();
    let mut emit_errors = Vec::new();
    let mut jobs = Vec::new();
    for (case, k) in &kernels {
        match loom_emit::cuda_kernel(k) {
            Ok(m) => {
                if seen.insert(m.source) {
                    for &(arch, sm) in ARCHES {
                        jobs.push(Job {
                            case,
                            kernel: k,
                            arch,
                            sm,
                        });
                    }
                }
            }
            Err(loom_emit::Error::Unsupported(why)) => {
                if refused.insert((case.clone(), base_name(&k.name).to_string())) {
                    eprintln!("refused by the CUDA emitter: {case}: `{}`: {why}", k.name);
                }
            }
            Err(e) => emit_errors.push(format!("{case}: `{}`: {e}", k.name)),
        }
    }
    assert!(emit_errors.is_empty(), "{}", emit_errors.join("\n"));

    // NVRTC and ptxas on every core: each worker takes the next job.
    let next = std::sync::atomic::AtomicUsize::new(0);
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get().min(8));
    let outcomes: Vec<Outcome> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                s.spawn(|| {
                    let mut out = Outcome::default();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(job) = jobs.get(i) else { break };
                        run_job(&tools, &dir, job, &mut out);
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("worker"))
            .collect()
    });
    let _ = std::fs::remove_dir_all(&dir);
    let mut all = Outcome::default();
    for o in outcomes {
        all.failures.extend(o.failures);
        all.warnings.extend(o.warnings);
        all.compiled += o.compiled;
        all.nvrtc += o.nvrtc;
        all.ptxas += o.ptxas;
    }
    for w in &all.warnings {
        eprintln!("warning: {w}");
    }
    let cases: BTreeSet<&str> = kernels.iter().map(|(c, _)| c.as_str()).collect();
    let (major, minor) = tools.nvrtc.version();
    eprintln!(
        "NVRTC {major}.{minor} ({}) and ptxas ({}): {} distinct kernels of {} cases, {} compilations for {:?} \
         in {:.1?} ({} workers; NVRTC {:.1?}, ptxas {:.1?} in all); refused as expected: {refused:?}",
        tools.nvrtc.path().display(),
        tools.ptxas.display(),
        seen.len(),
        cases.len(),
        all.compiled,
        ARCHES.iter().map(|a| a.1).collect::<Vec<_>>(),
        start.elapsed(),
        workers,
        all.nvrtc,
        all.ptxas,
    );
    assert!(
        all.failures.is_empty(),
        "{} of the emitted CUDA kernels did not compile or assemble:\n\n{}",
        all.failures.len(),
        all.failures.join("\n\n")
    );
    let want: BTreeSet<(String, String)> = EXPECTED_UNSUPPORTED
        .iter()
        .map(|(c, k)| (c.to_string(), k.to_string()))
        .collect();
    assert_eq!(
        refused, want,
        "the kernels the CUDA emitter refuses changed (update EXPECTED_UNSUPPORTED if that is intended)"
    );
    assert!(
        all.warnings.is_empty(),
        "NVRTC or ptxas warned about {} compilations (see above)",
        all.warnings.len()
    );
    assert!(all.compiled >= 60, "only {} compilations", all.compiled);
}

#[test]
fn nvrtc_errors_carry_the_program_log() {
    let Some(tools) = tools() else { return };
    let e = tools
        .nvrtc
        .compile_ptx(
            "extern \"C\" __global__ void k(float* y) { y[0] = undeclared; }",
            "broken.cu",
            "compute_80",
        )
        .expect_err("an undeclared identifier");
    let text = e.to_string();
    assert!(text.contains("NVRTC_ERROR_COMPILATION"), "{text}");
    assert!(
        text.contains("broken.cu") && text.contains("undeclared"),
        "{text}"
    );
    assert!(text.contains("--gpu-architecture=compute_80"), "{text}");
    let ok = tools
        .nvrtc
        .compile_ptx(
            "extern \"C\" __global__ void k(float* y) { y[0] = 1.0f; }",
            "fine.cu",
            "compute_90",
        )
        .expect("a trivial kernel");
    assert!(
        ok.text.contains(".target sm_90") && ok.text.contains(".entry k"),
        "{}",
        ok.text
    );
}
