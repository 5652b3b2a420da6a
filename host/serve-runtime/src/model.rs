//! Preparing a model: catalog, linking, the cold `prepare` program, sources, stage compilation, parameter
//! activation. The result is a [`Model`]: immutable code and parameters that every request of the model
//! shares.
//!
//! Preparation runs in this order, and a failure at any step leaves nothing behind (no device memory, no
//! compiled code kept): read and validate `model.json`; compile every program and `definition.sources` file
//! into one catalog; link the `prepare` and `control` programs for their roles and load them in the VM; run
//! cold `prepare`; open and index every declared source once (a missing or invalid checkpoint fails here,
//! before placement); specialize and reflect every declared stage, check workspace limits and every parameter
//! binding against the checkpoint index; compile the stages on the shared compile queue; stream parameter
//! payloads into device buffers (shared per parameter domain).

use crate::checkpoint::Source;
use crate::device::{Budget, Device, DeviceBuffer};
use crate::natives::{self, ConfigValue, Ctx, Decls, Phase, StageDecl};
use crate::package::{self, ModelDoc, PackageFiles};
use crate::progress::{Phase as ProgressPhase, Progress};
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};
use loom_compiler::{Catalog, Role};
use loom_ir::kernel::Stage;
use loom_ir::{Signature, TParamKind, TValue, Type};
use loom_kernel::Reflection;
use loom_plugin_api::ExecutableId;
use loom_vm::{InvokeLimits, LoadLimits, Loaded, NativeModule, Value, Vm};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant};

/// A compiled stage with its bound parameters.
#[derive(Debug)]
pub struct PreparedStage {
    pub decl: StageDecl,
    pub stage: Stage,
    pub reflection: Reflection,
    pub exe: ExecutableId,
    /// One per `stage.params`, in order; empty while the model is deactivated.
    pub params: Mutex<Vec<DeviceBuffer>>,
    /// Where each parameter's bytes come from, to stream them again on reactivation.
    pub(crate) bindings: Vec<Binding>,
}

/// What cold `prepare` returned.
#[derive(Debug, Clone)]
pub struct Cold {
    pub batch_units: i64,
    pub upload_capacity: i64,
    pub output_capacity: i64,
    pub result_capacity: i64,
    pub tokenizer: String,
    pub source_name: String,
    pub state: Value,
}

/// Progress and timing of one preparation, for logs and the model detail route.
#[derive(Debug, Clone, Default)]
pub struct PrepareReport {
    pub stages: usize,
    pub parameter_bytes: u64,
    pub compile_time: Duration,
    pub total_time: Duration,
}

/// Resident parameter buffers of one domain: (ordered file lists per policy input, policy).
type DomainKey = (Vec<Vec<PathBuf>>, String);

/// A prepared model.
#[derive(Debug)]
pub struct Model {
    pub name: String,
    pub doc: ModelDoc,
    pub device: Arc<Device>,
    pub budget: Arc<Budget>,
    pub cold: Cold,
    pub stages: Vec<Arc<PreparedStage>>,
    pub report: PrepareReport,
    pub(crate) control: Loaded,
    pub(crate) catalog: Catalog,
    /// Where request-declared sources resolve (the package's files and the asset root given to `prepare`).
    pub(crate) files: PackageFiles,
    pub(crate) asset_root: String,
    pub(crate) sources: Vec<Arc<Source>>,
    pub(crate) cold_params: Vec<natives::ParamDecl>,
    pub(crate) domains: Mutex<HashMap<(DomainKey, String), DeviceBuffer>>,
    pub(crate) spec_cache: Mutex<SpecCache>,
    pub(crate) options: Arc<serde_json::Map<String, serde_json::Value>>,
    pub(crate) tokenizer: Option<Arc<Tokenizer>>,
    pub(crate) timeline: loom_plugin_api::TimelineId,
    pub(crate) timeline_value: Mutex<u64>,
    pub(crate) gather: Arc<crate::gather::GatherQueue>,
    /// The current preparation's progress (replaced by each activation).
    pub(crate) progress: Mutex<Arc<Progress>>,
}

/// The stages (and any new sources) one exact invocation declaration set resolved to.
#[derive(Debug)]
pub(crate) struct InvocationSet {
    pub(crate) stages: Vec<Arc<PreparedStage>>,
    /// The cold sources, then the ones this declaration set added.
    pub(crate) sources: Vec<Arc<Source>>,
}

/// Invocation-declared stage sets, most recently used last; bounded by `specialization_cache`.
#[derive(Debug, Default)]
pub(crate) struct SpecCache {
    pub(crate) entries: Vec<(Decls, Arc<InvocationSet>)>,
    pub(crate) hits: u64,
    pub(crate) misses: u64,
}

// ---- the shared compile queue ---------------------------------------------------------------------------

type Job = Box<dyn FnOnce() + Send>;

/// One compile worker shared by every model: preparation of one model never takes more than this worker from
/// the request workers, and other models keep serving while it compiles.
fn compile_queue() -> &'static Mutex<mpsc::Sender<Job>> {
    static Q: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    Q.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("loom-compile".into())
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    job();
                }
            })
            .expect("spawning the compile thread; this is a bug");
        Mutex::new(tx)
    })
}

/// Runs `f` on the compile queue and waits for it. A panic inside `f` becomes an error.
pub(crate) fn on_compile_queue<R: Send + 'static>(
    f: impl FnOnce() -> Result<R> + Send + 'static,
) -> Result<R> {
    let (tx, rx) = mpsc::channel();
    let job: Job = Box::new(move || {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
            .unwrap_or_else(|_| Err(Error::Internal("the stage compiler panicked".into())));
        let _ = tx.send(r);
    });
    compile_queue()
        .lock()
        .map_err(|_| Error::Internal("compile queue poisoned".into()))?
        .send(job)
        .map_err(|_| Error::Internal("compile queue stopped".into()))?;
    rx.recv()
        .map_err(|_| Error::Internal("compile job lost".into()))?
}

// ---- entry signatures -----------------------------------------------------------------------------------

fn opaque() -> Type {
    Type::Ref {
        name: "opaque".into(),
        nullable: false,
    }
}

fn hal_buffer() -> Type {
    Type::Ref {
        name: "hal.buffer".into(),
        nullable: false,
    }
}

/// The finite contract's entry signatures (documented in `docs/serving/finite.md`).
pub fn finite_signatures() -> Vec<(&'static str, Signature)> {
    use Type::*;
    vec![
        (
            "prepare_request",
            Signature {
                params: vec![opaque(), Buffer],
                results: vec![Buffer, I64, I64],
            },
        ),
        (
            "prepare_batch",
            Signature {
                params: vec![opaque(), Buffer, Buffer, Buffer],
                results: vec![I64, Buffer, Buffer],
            },
        ),
        (
            "run",
            Signature {
                params: vec![I64, hal_buffer(), hal_buffer()],
                results: vec![],
            },
        ),
    ]
}

fn cold_signature() -> Signature {
    use Type::*;
    Signature {
        params: vec![Str, Str],
        results: vec![I64, I64, I64, I64, Str, Str, opaque()],
    }
}

fn sig_text(s: &Signature) -> String {
    let p: Vec<String> = s.params.iter().map(|t| t.to_string()).collect();
    let r: Vec<String> = s.results.iter().map(|t| t.to_string()).collect();
    format!("({}) -> ({})", p.join(", "), r.join(", "))
}

fn check_entry(loaded: &Loaded, file: &str, name: &str, want: &Signature) -> Result<()> {
    match loaded.signature(name) {
        None => Err(Error::Program(format!(
            "{file}: the program exports no `{name}` (expected `export func @{name}{}`)",
            sig_text(want)
        ))),
        Some(s) if &s != want => Err(Error::Program(format!(
            "{file}: `{name}` has signature {}, expected {}",
            sig_text(&s),
            sig_text(want)
        ))),
        Some(_) => Ok(()),
    }
}

// ---- preparation ----------------------------------------------------------------------------------------

/// Overrides a registration can apply on top of `model.json`.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub device: Option<Vec<String>>,
    pub options: Option<serde_json::Map<String, serde_json::Value>>,
}

pub(crate) fn limits(fuel: u64, memory: u64) -> InvokeLimits {
    InvokeLimits {
        fuel: fuel.min(package::MAX_FUEL),
        memory_bytes: memory,
        call_depth: 256,
        retained_bytes: None,
    }
}

/// Runs one VM entry with `ctx` installed. A trap becomes [`Error::Trap`].
pub(crate) fn invoke(
    loaded: &Loaded,
    entry: &str,
    args: &[Value],
    limits: &InvokeLimits,
    ctx: Ctx,
) -> (Result<Vec<Value>>, Ctx) {
    let (r, ctx) = natives::with_invocation(ctx, || loaded.invoke(entry, args, limits));
    (
        r.map_err(|t| Error::Trap {
            entry: entry.to_string(),
            message: t.to_string(),
        }),
        ctx,
    )
}

/// Prepares a package on `device`. `name` is the registered model name.
pub fn prepare(
    name: &str,
    files: &PackageFiles,
    overrides: &Overrides,
    device_for: impl FnOnce(&[String]) -> Result<Arc<Device>>,
    progress: Arc<Progress>,
) -> Result<Model> {
    let start = Instant::now();
    let doc_bytes = files
        .read("model.json")
        .map_err(|m| Error::package("model.json", "", m))?;
    let doc = package::parse_model_doc("model.json", &doc_bytes)?;
    let prefs = overrides
        .device
        .clone()
        .or_else(|| doc.device.as_ref().map(|d| d.preferences()))
        .unwrap_or_else(|| vec!["cpu".to_string()]);
    let device = device_for(&prefs)?;
    let options = Arc::new(
        overrides
            .options
            .clone()
            .unwrap_or_else(|| doc.options.clone()),
    );

    // The catalog: programs and shared sources, each compiled once.
    let mut catalog = Catalog::new();
    let add = |catalog: &mut Catalog, label: &str, bytes: Vec<u8>| -> Result<usize> {
        catalog
            .add_file(label, &bytes)
            .map(|(i, warnings)| {
                for w in warnings {
                    log::warn!("model {name}: {}", w.trim_end());
                }
                i
            })
            .map_err(|e| Error::Program(e.to_string()))
    };
    // Program references resolve from the package directory; a server-local package may name programs of
    // another package or a shared library (`../arith-embed/control.loom`), an uploaded one only its own files.
    let read_prog = |field: &str, path: &str| -> Result<(String, Vec<u8>)> {
        let bytes = files.read_source("model.json", field, path)?;
        Ok((path.to_string(), bytes))
    };
    let (prep_file, b) = read_prog("programs.prepare", &doc.programs.prepare)?;
    let prep_idx = add(&mut catalog, &prep_file, b)?;
    let (ctl_file, b) = read_prog("programs.control", &doc.programs.control)?;
    let ctl_idx = if ctl_file == prep_file {
        prep_idx
    } else {
        add(&mut catalog, &ctl_file, b)?
    };
    let mut seen = vec![prep_file.clone(), ctl_file.clone()];
    for (role, path) in &doc.programs.other {
        let (f, b) = read_prog(&format!("programs.{role}"), path)?;
        if !seen.contains(&f) {
            add(&mut catalog, &f, b)?;
            seen.push(f);
        }
    }
    for (i, path) in doc.definition.sources.iter().enumerate() {
        let field = format!("definition.sources[{i}]");
        let b = files.read_source("model.json", &field, path)?;
        if !seen.contains(path) {
            add(&mut catalog, path, b)?;
            seen.push(path.clone());
        }
    }

    let link = |primary: usize, roots: &[&str], role: &Role| -> Result<loom_ir::Program> {
        loom_compiler::link(&catalog, primary, roots, role).map_err(|errs| {
            Error::Program(
                errs.iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
                    .join(""),
            )
        })
    };
    let prep_prog = link(prep_idx, &["prepare"], &Role::prepare())?;
    let roots: Vec<&str> = finite_signatures().iter().map(|(n, _)| *n).collect();
    let ctl_prog = link(ctl_idx, &roots, &Role::control())?;

    let prep_natives: Vec<Arc<NativeModule>> = vec![
        Arc::new(natives::prepare_module()),
        Arc::new(natives::options_module()),
        Arc::new(natives::input_module()),
    ];
    let ctl_natives: Vec<Arc<NativeModule>> = vec![
        Arc::new(natives::prepare_module()),
        Arc::new(natives::runner_module()),
        Arc::new(natives::input_module()),
        Arc::new(natives::parameters_module()),
    ];
    let load_err = |file: &str, e: loom_vm::LoadError| Error::Program(format!("{file}: {e}"));
    let (prep_role, ctl_role) = (Role::prepare(), Role::control());
    let prep_grants: Vec<&str> = prep_role.grants.iter().map(|s| s.as_str()).collect();
    let prepare_loaded = Vm::load(
        &prep_prog,
        &prep_natives,
        &prep_grants,
        &LoadLimits::default(),
    )
    .map_err(|e| load_err(&prep_file, e))?;
    let ctl_grants: Vec<&str> = ctl_role.grants.iter().map(|s| s.as_str()).collect();
    let control = Vm::load(&ctl_prog, &ctl_natives, &ctl_grants, &LoadLimits::default())
        .map_err(|e| load_err(&ctl_file, e))?;
    check_entry(&prepare_loaded, &prep_file, "prepare", &cold_signature())?;
    for (n, s) in finite_signatures() {
        check_entry(&control, &ctl_file, n, &s)?;
    }

    // Cold preparation.
    let asset_root = files.describe();
    let options_text = serde_json::Value::Object((*options).clone()).to_string();
    let mut lim = limits(doc.fuel.prepare, doc.memory.invocation_bytes);
    lim.retained_bytes = Some(doc.memory.state_bytes);
    let (r, ctx) = invoke(
        &prepare_loaded,
        "prepare",
        &[Value::str(&asset_root), Value::str(&options_text)],
        &lim,
        Ctx::new(Phase::Cold, options.clone()),
    );
    let out = r?;
    let cold = Cold {
        batch_units: out[0].as_i64().unwrap_or(0),
        upload_capacity: out[1].as_i64().unwrap_or(0),
        output_capacity: out[2].as_i64().unwrap_or(0),
        result_capacity: out[3].as_i64().unwrap_or(0),
        tokenizer: out[4].as_str().unwrap_or_default().to_string(),
        source_name: out[5].as_str().unwrap_or_default().to_string(),
        state: out[6].clone(),
    };
    for (what, v) in [
        ("batch-unit limit", cold.batch_units),
        ("upload capacity", cold.upload_capacity),
        ("output capacity", cold.output_capacity),
        ("result capacity", cold.result_capacity),
    ] {
        if v <= 0 {
            return Err(Error::Program(format!(
                "{prep_file}: prepare returned a {what} of {v}; it must be positive"
            )));
        }
    }
    let tokenizer = if cold.tokenizer.is_empty() {
        None
    } else {
        let path = doc
            .assets
            .get(&cold.tokenizer)
            .cloned()
            .unwrap_or_else(|| cold.tokenizer.clone());
        let rel = package::relative(&prep_file, "prepare tokenizer result", &path)?;
        let bytes = files
            .read(&rel)
            .map_err(|m| Error::package("model.json", "assets", m))?;
        Some(Arc::new(
            Tokenizer::from_bytes(&rel, &bytes).map_err(|m| Error::package(&rel, "", m))?,
        ))
    };
    let decls = ctx.decls;
    if decls.stages.is_empty() {
        return Err(Error::Program(format!(
            "{prep_file}: prepare declared no stage (call prepare.stage)"
        )));
    }

    // Sources: each opened and indexed once, before any placement.
    progress.phase(ProgressPhase::Sources);
    let mut sources = Vec::with_capacity(decls.sources.len());
    for (i, shards) in decls.sources.iter().enumerate() {
        let mut paths = Vec::with_capacity(shards.len());
        for (dir, path) in shards {
            paths.push(resolve_source_path(files, &asset_root, dir, path, i)?);
        }
        sources.push(Arc::new(
            Source::open(&paths).map_err(|m| Error::Checkpoint(format!("source {i}: {m}")))?,
        ));
    }

    let budget = Budget::reserved(&device, name, doc.memory.device_bytes)?;
    let timeline = device.timeline()?;
    let gather = crate::gather::GatherQueue::start(device.clone(), name, doc.io.direct)?;
    let mut model = Model {
        name: name.to_string(),
        doc,
        device,
        budget,
        cold,
        stages: Vec::new(),
        report: PrepareReport::default(),
        control,
        catalog,
        files: files.clone(),
        asset_root: asset_root.clone(),
        sources,
        cold_params: decls.params.clone(),
        domains: Mutex::new(HashMap::new()),
        spec_cache: Mutex::new(SpecCache::default()),
        options,
        tokenizer,
        timeline,
        timeline_value: Mutex::new(0),
        gather,
        progress: Mutex::new(progress.clone()),
    };
    progress.phase(ProgressPhase::Compiling);
    let compile_start = Instant::now();
    let cold_sources = model.sources.clone();
    let stages = model.build_stages(&decls.stages, &decls.params, 0, &cold_sources)?;
    model.report.compile_time = compile_start.elapsed();
    model.report.stages = stages.len();
    model.report.parameter_bytes = model.budget.used();
    model.stages = stages;
    model.report.total_time = start.elapsed();
    Ok(model)
}

pub(crate) fn resolve_source_path(
    files: &PackageFiles,
    asset_root: &str,
    dir: &str,
    path: &str,
    ordinal: usize,
) -> Result<PathBuf> {
    if !dir.is_empty() && dir != asset_root {
        return Err(Error::Checkpoint(format!(
            "source {ordinal}: directory {dir:?} is not the asset root given to prepare ({asset_root:?})"
        )));
    }
    let rel = package::relative("prepare.source", "path", path)
        .map_err(|e| Error::Checkpoint(format!("source {ordinal}: {e}")))?;
    let root = files.params_root().ok_or_else(|| {
        Error::Checkpoint(format!(
            "source {ordinal}: {path}: this uploaded package has no parameter root (the server was \
             started without --params-root)"
        ))
    })?;
    Ok(root.join(rel))
}

/// The key of a binding's resident buffer: its domain and entry (a transposed placement is another buffer).
fn resident_key(b: &Binding) -> (DomainKey, String) {
    (
        b.domain.clone(),
        if b.transpose {
            format!("{}\u{0}transpose", b.key)
        } else {
            b.key.clone()
        },
    )
}

/// Parses a `prepare.config` text value by the kind of the template parameter it binds.
pub fn parse_config_text(kind: &TParamKind, text: &str) -> std::result::Result<TValue, String> {
    let t = text.trim();
    match kind {
        TParamKind::I64 => t
            .replace('_', "")
            .parse::<i64>()
            .map(TValue::I64)
            .map_err(|_| format!("expected an i64, found {t:?}")),
        TParamKind::Bool => match t {
            "true" => Ok(TValue::Bool(true)),
            "false" => Ok(TValue::Bool(false)),
            _ => Err(format!("expected true or false, found {t:?}")),
        },
        TParamKind::Str => {
            let inner = t
                .strip_prefix('"')
                .and_then(|s| s.strip_suffix('"'))
                .ok_or_else(|| {
                    format!("expected a string literal such as \"gelu\", found {t:?}")
                })?;
            Ok(TValue::Str(inner.to_string()))
        }
        TParamKind::DType => loom_ir::kernel::DType::from_name(t)
            .map(|_| TValue::DType(t.to_string()))
            .ok_or_else(|| format!("expected a dtype such as f32, found {t:?}")),
        TParamKind::Shape => {
            let inner = t
                .strip_prefix('[')
                .and_then(|s| s.strip_suffix(']'))
                .ok_or_else(|| format!("expected a shape such as [2, 3], found {t:?}"))?;
            inner
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| s.parse::<i64>())
                .collect::<std::result::Result<Vec<_>, _>>()
                .map(TValue::Shape)
                .map_err(|_| format!("expected a shape such as [2, 3], found {t:?}"))
        }
        TParamKind::Func(_) => Err("a func template parameter cannot be configured".into()),
    }
}

impl Model {
    /// A fresh invocation context for a warm entry of this model.
    pub(crate) fn ctx(&self, phase: Phase) -> Ctx {
        let mut c = Ctx::new(phase, self.options.clone());
        c.tokenizer = self.tokenizer.clone();
        c
    }

    /// Specializes, checks, compiles and binds `decls` (ordinals start at `base`).
    pub(crate) fn build_stages(
        &self,
        decls: &[StageDecl],
        params: &[natives::ParamDecl],
        base: usize,
        sources: &[Arc<Source>],
    ) -> Result<Vec<Arc<PreparedStage>>> {
        let mut specialized = Vec::with_capacity(decls.len());
        for (i, d) in decls.iter().enumerate() {
            let ordinal = base + i;
            let at = format!("stage {ordinal} (`{}`)", d.root);
            if d.dispatch {
                return Err(Error::Program(format!(
                    "{at}: prepare.dispatch roots (direct-dispatch stages) need a device plugin that runs them; \
                     no HAL of this server does yet"
                )));
            }
            let root = d.root.trim_start_matches('@');
            let (module_name, stage_name) = root.rsplit_once('.').ok_or_else(|| {
                Error::Program(format!(
                    "{at}: a root is `module.stage`, found {:?}",
                    d.root
                ))
            })?;
            let module = self.catalog.find(module_name).ok_or_else(|| {
                Error::Program(format!(
                    "{at}: no module @{module_name} in the package catalog"
                ))
            })?;
            let item = self.catalog.entries()[module]
                .module
                .device
                .iter()
                .find(|it| it.name == stage_name && it.kind == loom_ir::DeviceKind::Stage)
                .ok_or_else(|| {
                    Error::Program(format!(
                        "{at}: module @{module_name} has no stage @{stage_name}"
                    ))
                })?;
            let mut config = Vec::with_capacity(d.config.len());
            for (k, v) in &d.config {
                let tp = item.tparams.iter().find(|t| &t.name == k).ok_or_else(|| {
                    Error::Program(format!(
                        "{at}: stage @{stage_name} has no template parameter `{k}`"
                    ))
                })?;
                let tv = match v {
                    ConfigValue::I64(i) => match tp.kind {
                        TParamKind::I64 => TValue::I64(*i),
                        _ => {
                            return Err(Error::Program(format!(
                                "{at}: `{k}` is not an i64 parameter; bind it with prepare.config"
                            )));
                        }
                    },
                    ConfigValue::Text(t) => parse_config_text(&tp.kind, t)
                        .map_err(|m| Error::Program(format!("{at}: config `{k}`: {m}")))?,
                };
                config.push((k.clone(), tv));
            }
            let stage = loom_kernel::specialize_stage(&self.catalog, module, stage_name, &config)
                .map_err(|d| Error::Program(d.join("")))?;
            let reflection = loom_kernel::reflect(&stage);
            if let Some(limit) = d.workspace_limit {
                if reflection.workspace_bytes > limit {
                    return Err(Error::Program(format!(
                        "{at}: needs {} workspace bytes, over its workspace_limit of {limit}",
                        reflection.workspace_bytes
                    )));
                }
            }
            let bindings = self.resolve_params(ordinal, base, &stage, params, sources)?;
            specialized.push((d.clone(), stage, reflection, bindings));
        }
        // Compile on the shared queue (encoded stages are what plugins receive).
        let device = self.device.clone();
        let encoded: Vec<(String, Vec<u8>)> = specialized
            .iter()
            .map(|(_, s, _, _)| (s.name.clone(), loom_ir::kernel_codec::encode_stage(s)))
            .collect();
        let progress = self.progress();
        progress.stages_declared(encoded.len() as u64);
        let (name, cold) = (self.name.clone(), base == 0);
        let exes = on_compile_queue(move || {
            let n = encoded.len();
            encoded
                .iter()
                .enumerate()
                .map(|(i, (stage, e))| {
                    let t0 = Instant::now();
                    let exe = device.compile(e)?;
                    progress.stage_compiled();
                    let (at, took) = (i + 1, t0.elapsed());
                    if cold {
                        log::info!("model {name}: compiled stage {at}/{n} `{stage}` in {took:.1?}");
                    } else {
                        log::debug!("model {name}: compiled request-time stage {at}/{n} `{stage}` in {took:.1?}");
                    }
                    Ok(exe)
                })
                .collect::<Result<Vec<_>>>()
        })?;
        let progress = self.progress();
        if progress.snapshot().phase == ProgressPhase::Compiling {
            progress.phase(ProgressPhase::Placing);
        }
        progress.bytes_declared(self.bytes_to_place(specialized.iter().flat_map(|(_, _, _, b)| b)));
        let mut out = Vec::with_capacity(specialized.len());
        for ((decl, stage, reflection, bindings), exe) in specialized.into_iter().zip(exes) {
            let mut params = Vec::with_capacity(bindings.len());
            for b in &bindings {
                params.push(self.activate(b)?);
            }
            out.push(Arc::new(PreparedStage {
                decl,
                stage,
                reflection,
                exe,
                params: Mutex::new(params),
                bindings,
            }));
        }
        Ok(out)
    }

    /// For each of `stage`'s parameter bindings: which source and entry feed it, checked against the index.
    fn resolve_params(
        &self,
        ordinal: usize,
        base: usize,
        stage: &Stage,
        params: &[natives::ParamDecl],
        sources: &[Arc<Source>],
    ) -> Result<Vec<Binding>> {
        if stage.params.is_empty() {
            return Ok(Vec::new());
        }
        let domain = stage.param_domain.clone().unwrap_or_default();
        let at = format!("stage {ordinal} (`{}`)", stage.name);
        // This invocation's declarations for the stage, else (for invocation stages) the cold layout of the
        // same domain: omitting parameter declarations preserves it.
        let mine: Vec<&natives::ParamDecl> = params
            .iter()
            .filter(|p| p.stage + base == ordinal && p.binding == domain)
            .collect();
        let decls: Vec<natives::ParamDecl> = if !mine.is_empty() {
            mine.into_iter().cloned().collect()
        } else {
            let cold: Vec<natives::ParamDecl> = self
                .cold_params
                .iter()
                .filter(|p| p.binding == domain)
                .cloned()
                .collect();
            let first_stage = cold.first().map(|p| p.stage);
            cold.into_iter()
                .filter(|p| Some(p.stage) == first_stage)
                .collect()
        };
        if decls.is_empty() {
            return Err(Error::Program(format!(
                "{at}: parameter domain @{domain} is not bound: call prepare.parameter(stage, \"{domain}\", \
                 input, source, policy)"
            )));
        }
        let policy = decls[0].policy.clone();
        let n_inputs = decls.iter().map(|p| p.input).max().unwrap_or(0) + 1;
        let mut inputs: Vec<Option<usize>> = vec![None; n_inputs as usize];
        for p in &decls {
            if p.policy != policy {
                return Err(Error::Program(format!(
                    "{at}: domain @{domain} binds inputs under two policies ({policy:?} and {:?})",
                    p.policy
                )));
            }
            if inputs[p.input as usize].replace(p.source).is_some() {
                return Err(Error::Program(format!(
                    "{at}: domain @{domain} input {} is bound twice",
                    p.input
                )));
            }
        }
        if let Some(gap) = inputs.iter().position(Option::is_none) {
            return Err(Error::Program(format!(
                "{at}: domain @{domain} inputs must be declared densely from 0; input {gap} is missing"
            )));
        }
        let inputs: Vec<usize> = inputs.into_iter().flatten().collect();
        let key_files: Vec<Vec<PathBuf>> =
            inputs.iter().map(|&s| sources[s].files.clone()).collect();
        let dkey: DomainKey = (key_files, policy);
        let mut out = Vec::with_capacity(stage.params.len());
        for b in &stage.params {
            let src_ord = *inputs.get(b.input as usize).ok_or_else(|| {
                Error::Program(format!(
                    "{at}: binding `{}` reads policy input {}, but domain @{domain} declares {} input(s)",
                    b.name,
                    b.input,
                    inputs.len()
                ))
            })?;
            let src = sources[src_ord].clone();
            let entry = src.entries.get(&b.key).cloned().ok_or_else(|| {
                Error::Checkpoint(format!(
                    "{at}: binding `{}`: key {:?} is not in source {src_ord} ({})",
                    b.name,
                    b.key,
                    src.files
                        .iter()
                        .map(|f| f.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })?;
            // The resident layout: the checkpoint's, or `layout(transpose)` of a 2-D element-typed tensor
            // (the checkpoint holds [cols, rows] of the stage's [rows, cols], e.g. PyTorch's Linear [out, in]).
            let transpose = match b.layout.as_deref() {
                None => false,
                Some("transpose") => {
                    let elem = b.dtype.size().filter(|_| !b.dtype.is_quantized());
                    if b.shape.len() != 2 || elem.is_none() {
                        return Err(Error::Program(format!(
                            "{at}: binding `{}`: layout(transpose) needs a 2-D tensor of an element type, \
                             found {}{:?}",
                            b.name,
                            b.dtype.name(),
                            b.shape
                        )));
                    }
                    true
                }
                Some(other) => {
                    return Err(Error::Program(format!(
                        "{at}: binding `{}`: layout({other}) is not a placement this server performs (supported: \
                         transpose)",
                        b.name
                    )));
                }
            };
            let want: Vec<u64> = if transpose {
                b.shape.iter().rev().copied().collect()
            } else {
                b.shape.clone()
            };
            if entry.dtype != Some(b.dtype) || entry.shape != want {
                return Err(Error::Checkpoint(format!(
                    "{at}: binding `{}`: key {:?} is {}{:?} in the checkpoint, the stage expects {}{:?}{}",
                    b.name,
                    b.key,
                    entry.format_dtype,
                    entry.shape,
                    b.dtype.name(),
                    want,
                    if transpose {
                        " (stored transposed)"
                    } else {
                        ""
                    }
                )));
            }
            out.push(Binding {
                domain: dkey.clone(),
                key: b.key.clone(),
                source: src,
                entry,
                transpose,
            });
        }
        Ok(out)
    }

    /// The bytes placing `bindings` will move: each resident buffer once, none already resident.
    fn bytes_to_place<'a>(&self, bindings: impl Iterator<Item = &'a Binding>) -> u64 {
        let domains = self.domains.lock().unwrap_or_else(|e| e.into_inner());
        let mut seen = std::collections::HashSet::new();
        bindings
            .filter(|b| {
                let k = resident_key(b);
                !domains.contains_key(&k) && seen.insert(k)
            })
            .map(|b| b.entry.len)
            .sum()
    }

    /// The resident buffer of one binding: shared with every stage of the same domain.
    fn activate(&self, b: &Binding) -> Result<DeviceBuffer> {
        let mut domains = self
            .domains
            .lock()
            .map_err(|_| Error::Internal("domains poisoned".into()))?;
        let k = resident_key(b);
        let progress = self.progress();
        if let Some(buf) = domains.get(&k) {
            // Shared with a stage placed before: nothing more to move (nor counted in the progress).
            return Ok(buf.clone());
        }
        let buf = self.device.alloc(b.entry.len, &self.budget)?;
        if b.transpose {
            // [r, c] in the checkpoint -> [c, r] resident, element by element, on the host.
            let (r, c) = (b.entry.shape[0] as usize, b.entry.shape[1] as usize);
            let esz = (b.entry.len as usize) / (r * c).max(1);
            let mut src = vec![0u8; b.entry.len as usize];
            b.source
                .read(&b.entry, 0, &mut src)
                .map_err(Error::Checkpoint)?;
            let mut dst = vec![0u8; src.len()];
            for i in 0..r {
                for j in 0..c {
                    let from = (i * c + j) * esz;
                    let to = (j * r + i) * esz;
                    dst[to..to + esz].copy_from_slice(&src[from..from + esz]);
                }
            }
            self.device.write(&buf, 0, &dst)?;
            progress.bytes_placed(b.entry.len);
            domains.insert(k, buf.clone());
            return Ok(buf);
        }
        const CHUNK: u64 = 8 << 20;
        let mut tmp = vec![0u8; CHUNK.min(b.entry.len) as usize];
        let mut off = 0u64;
        while off < b.entry.len {
            let n = CHUNK.min(b.entry.len - off) as usize;
            b.source
                .read(&b.entry, off, &mut tmp[..n])
                .map_err(Error::Checkpoint)?;
            self.device.write(&buf, off, &tmp[..n])?;
            progress.bytes_placed(n as u64);
            off += n as u64;
        }
        domains.insert(k, buf.clone());
        Ok(buf)
    }

    /// Every stage with parameters: the cold ones and the cached invocation sets.
    fn all_stages(&self) -> Vec<Arc<PreparedStage>> {
        let mut v = self.stages.clone();
        if let Ok(c) = self.spec_cache.lock() {
            for (_, set) in &c.entries {
                v.extend(set.stages.iter().cloned());
            }
        }
        v
    }

    /// Releases every resident parameter buffer (the reloadable backing); compiled stages stay. The caller
    /// makes sure no cohort is running (the registry drains the scheduler first).
    pub fn deactivate(&self) {
        for s in self.all_stages() {
            if let Ok(mut p) = s.params.lock() {
                p.clear();
            }
        }
        if let Ok(mut d) = self.domains.lock() {
            d.clear();
        }
    }

    /// The current preparation's progress.
    pub fn progress(&self) -> Arc<Progress> {
        self.progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Streams every parameter again from its (already indexed) source; on failure nothing stays resident.
    /// `progress` follows this activation from here on.
    pub fn activate_params(&self, progress: Arc<Progress>) -> Result<()> {
        *self.progress.lock().unwrap_or_else(|e| e.into_inner()) = progress.clone();
        progress.phase(ProgressPhase::Placing);
        let stages = self.all_stages();
        progress.bytes_declared(self.bytes_to_place(stages.iter().flat_map(|s| &s.bindings)));
        for s in &stages {
            let mut fresh = Vec::with_capacity(s.bindings.len());
            for b in &s.bindings {
                match self.activate(b) {
                    Ok(buf) => fresh.push(buf),
                    Err(e) => {
                        self.deactivate();
                        return Err(e);
                    }
                }
            }
            if let Ok(mut p) = s.params.lock() {
                *p = fresh;
            }
        }
        Ok(())
    }

    /// Device bytes the model holds now.
    pub fn device_bytes(&self) -> u64 {
        self.budget.used()
    }

    /// (hits, misses, cached sets) of the specialization cache.
    pub fn spec_cache_stats(&self) -> (u64, u64, usize) {
        self.spec_cache
            .lock()
            .map(|c| (c.hits, c.misses, c.entries.len()))
            .unwrap_or((0, 0, 0))
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Binding {
    domain: DomainKey,
    key: String,
    source: Arc<Source>,
    entry: crate::checkpoint::Entry,
    /// Placed transposed (`layout(transpose)`).
    transpose: bool,
}
