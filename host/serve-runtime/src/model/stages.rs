//! Stages: specialization, reflection checks, compilation on the shared compile queue, parameter bindings and
//! their resident buffers (shared per parameter domain), and the model's cache of invocation-declared stage
//! sets (exact declaration sets, most recently used last, bounded by `specialization_cache`).

use super::{DomainKey, Model, PreparedStage, StageSet, parse_config_text};
use crate::checkpoint::Source;
use crate::device::DeviceBuffer;
use crate::natives::{self, ConfigValue, Decls, StageDecl};
use crate::progress::Phase as ProgressPhase;
use crate::{Error, Result};
use loom_ir::kernel::Stage;
use loom_ir::{TParamKind, TValue};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, mpsc};
use std::time::Instant;

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

type SpecJob = Box<dyn FnOnce() + Send>;

/// Workers that specialize request-time declaration sets ([`Model::specialize`]): open their sources, then
/// compile on the compile queue and place parameters. Shared by every model, so a miss never holds a model's
/// scheduler; two, so that one model's miss waiting for the compiler does not keep another's sources from
/// opening.
const SPECIALIZE_WORKERS: usize = 2;

fn specialize_queue() -> &'static Mutex<mpsc::Sender<SpecJob>> {
    static Q: OnceLock<Mutex<mpsc::Sender<SpecJob>>> = OnceLock::new();
    Q.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpecJob>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..SPECIALIZE_WORKERS {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("loom-specialize-{i}"))
                .spawn(move || {
                    loop {
                        let job = match rx.lock() {
                            Ok(r) => r.recv(),
                            Err(_) => return,
                        };
                        match job {
                            Ok(job) => job(),
                            Err(_) => return,
                        }
                    }
                })
                .expect("spawning a specialization worker; this is a bug");
        }
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

/// The key of a binding's resident buffer: its domain and entry (a transposed placement is another buffer).
fn resident_key(b: &Binding) -> (DomainKey, String) {
    placed_key(b, b.transpose)
}

/// The resident key of `b`'s tensor placed transposed or not.
fn placed_key(b: &Binding, transpose: bool) -> (DomainKey, String) {
    (
        b.domain.clone(),
        if transpose {
            format!("{}\u{0}transpose", b.key)
        } else {
            b.key.clone()
        },
    )
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
    pub(crate) evictions: u64,
    /// Sets dropped because a checkpoint they opened changed on disk.
    pub(crate) stale: u64,
    /// A set was dropped: release the resident buffers no set uses any more.
    pub(crate) release_pending: bool,
}

impl Model {
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
        let key_files: Vec<Vec<(PathBuf, crate::checkpoint::FileGen)>> = inputs
            .iter()
            .map(|&s| {
                let src = &sources[s];
                src.files
                    .iter()
                    .cloned()
                    .zip(src.gens.iter().copied())
                    .collect()
            })
            .collect();
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
                    src.names.join(", ")
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
                site: format!("{at}: binding `{}` of domain @{domain}", b.name),
            });
        }
        Ok(out)
    }

    /// The bytes placing `bindings` will move: each resident buffer once, none already resident.
    pub(super) fn bytes_to_place<'a>(&self, bindings: impl Iterator<Item = &'a Binding>) -> u64 {
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
    pub(super) fn activate(&self, b: &Binding) -> Result<DeviceBuffer> {
        let mut domains = self
            .domains
            .lock()
            .map_err(|_| Error::Internal("domains poisoned".into()))?;
        let k = resident_key(b);
        // Stages sharing a weight bank agree on its placement: one resident layout per key, never a plain and
        // a transposed copy side by side.
        if domains.contains_key(&placed_key(b, !b.transpose)) {
            let layout = |t: bool| {
                if t {
                    "layout(transpose)"
                } else {
                    "the checkpoint's layout"
                }
            };
            return Err(Error::Program(format!(
                "{}: key {:?} is placed with {}, but another binding of the same weight bank placed it with {}; \
                 stages sharing a weight bank must agree on its placement (bind the key with one layout)",
                b.site,
                b.key,
                layout(b.transpose),
                layout(!b.transpose)
            )));
        }
        let progress = self.progress();
        if let Some(buf) = domains.get(&k) {
            // Shared with a stage placed before: nothing more to move (nor counted in the progress).
            return Ok(buf.clone());
        }
        let buf = self.device.alloc(b.entry.len, &self.budget)?;
        // `io.direct`: the checkpoint's bytes come through a handle opened for direct I/O (whole aligned blocks
        // into an aligned staging buffer, bypassing the page cache), never a buffered read.
        let direct = match self.doc.io.direct {
            true => Some(
                b.source
                    .open_direct(b.entry.file)
                    .map_err(Error::Checkpoint)?,
            ),
            false => None,
        };
        let mut staging = Vec::new();
        let mut read = |off: u64, dst: &mut [u8]| -> Result<()> {
            match &direct {
                Some(f) => b.source.read_direct(f, &mut staging, &b.entry, off, dst),
                None => b.source.read(&b.entry, off, dst),
            }
            .map_err(Error::Checkpoint)
        };
        if b.transpose {
            // [r, c] in the checkpoint -> [c, r] resident, element by element, on the host.
            let (r, c) = (b.entry.shape[0] as usize, b.entry.shape[1] as usize);
            let esz = (b.entry.len as usize) / (r * c).max(1);
            let mut src = vec![0u8; b.entry.len as usize];
            read(0, &mut src)?;
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
            read(off, &mut tmp[..n])?;
            self.device.write(&buf, off, &tmp[..n])?;
            progress.bytes_placed(n as u64);
            off += n as u64;
        }
        domains.insert(k, buf.clone());
        Ok(buf)
    }

    /// The stages (cold, then declared) and sources one exact declaration set resolves to: the cached set, or a
    /// fresh one (new sources opened and indexed, stages compiled on the shared queue, parameters placed).
    /// Sources may be declared without a stage (the cold stages then run, and `parameters.gather` can read the
    /// new sources); parameters bound without a stage are an error. The cache keeps the
    /// `specialization_cache` most recently used sets; evicting one releases the resident buffers only it used.
    pub fn stages_for(&self, decls: Decls) -> Result<StageSet> {
        if decls.stages.is_empty() && !decls.params.is_empty() {
            return Err(Error::Program(
                "the invocation bound parameters but declared no stage (parameter bindings are made for the \
                 invocation's own stages)"
                    .into(),
            ));
        }
        if decls.stages.is_empty() && decls.sources.is_empty() {
            return Ok(StageSet {
                stages: self.stages.clone(),
                sources: self.sources.clone(),
            });
        }
        let set = self.invocation_set(decls)?;
        let mut stages = self.stages.clone();
        stages.extend(set.stages.iter().cloned());
        Ok(StageSet {
            stages,
            sources: set.sources.clone(),
        })
    }

    /// The stage set of `decls` when it needs no compilation: the cold set (no stage declared) or a cached
    /// set (counted as a hit, and made the most recently used). `None` on a miss, which
    /// [`stages_for`](Self::stages_for) or [`specialize`](Self::specialize) then builds (and counts).
    pub fn cached_stages(&self, decls: &Decls) -> Option<StageSet> {
        if decls.stages.is_empty() && !decls.params.is_empty() {
            return None;
        }
        if decls.stages.is_empty() && decls.sources.is_empty() {
            return Some(StageSet {
                stages: self.stages.clone(),
                sources: self.sources.clone(),
            });
        }
        let mut c = self.spec_cache.lock().ok()?;
        let set = self.cache_lookup(&mut c, decls)?;
        drop(c);
        let mut stages = self.stages.clone();
        stages.extend(set.stages.iter().cloned());
        Some(StageSet {
            stages,
            sources: set.sources.clone(),
        })
    }

    /// Whether the specialization cache holds `decls`'s set (counted neither as a hit nor as a miss, and the
    /// cache's order unchanged): for work ahead of demand, such as compiling likely epoch shapes.
    pub fn has_stages(&self, decls: &Decls) -> bool {
        self.spec_cache
            .lock()
            .map(|c| c.entries.iter().any(|(d, _)| d == decls))
            .unwrap_or(false)
    }

    /// [`stages_for`](Self::stages_for) on the shared specialization workers: returns at once, and calls
    /// `done` with the set (or the error) from a worker. The model's scheduler keeps running other cohorts
    /// meanwhile; sources are opened on the worker, never on the caller's thread.
    pub fn specialize(
        self: &Arc<Self>,
        decls: Decls,
        done: impl FnOnce(Result<StageSet>) + Send + 'static,
    ) {
        let model = self.clone();
        let job: SpecJob = Box::new(move || {
            let r =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| model.stages_for(decls)))
                    .unwrap_or_else(|_| Err(Error::Internal("specialization panicked".into())));
            done(r);
        });
        let sent = specialize_queue()
            .lock()
            .map_err(|_| ())
            .and_then(|q| q.send(job).map_err(|_| ()));
        if let Err(()) = sent {
            log::error!("model {}: the specialization workers are gone", self.name);
        }
    }

    /// The cached set of `decls` (counted as a hit and made the most recently used), unless a checkpoint it
    /// opened is no longer the generation it indexed: the set is then dropped (counted in `stale`) and built
    /// again from the files as they are, so compiled code and placed parameters are reused only within their
    /// source generation.
    fn cache_lookup(&self, c: &mut SpecCache, decls: &Decls) -> Option<Arc<InvocationSet>> {
        let i = c.entries.iter().position(|(d, _)| d == decls)?;
        let cold = self.sources.len();
        if let Some(name) = c.entries[i].1.sources[cold..]
            .iter()
            .find_map(|s| s.stale())
        {
            log::info!(
                "model {}: checkpoint {name} changed since it was indexed; its declaration set is built again",
                self.name
            );
            c.entries.remove(i);
            c.stale += 1;
            // Its resident buffers are released once the set built instead is in (see `invocation_set`).
            c.release_pending = true;
            return None;
        }
        let e = c.entries.remove(i);
        let set = e.1.clone();
        c.entries.push(e);
        c.hits += 1;
        Some(set)
    }

    fn invocation_set(&self, decls: Decls) -> Result<Arc<InvocationSet>> {
        {
            let mut c = self
                .spec_cache
                .lock()
                .map_err(|_| Error::Internal("spec cache poisoned".into()))?;
            if let Some(set) = self.cache_lookup(&mut c, &decls) {
                return Ok(set);
            }
            c.misses += 1;
        }
        let mut sources = self.sources.clone();
        for (i, shards) in decls.sources.iter().enumerate() {
            let ordinal = self.sources.len() + i;
            let mut paths = Vec::with_capacity(shards.len());
            for (dir, path) in shards {
                paths.push(super::prepare::resolve_source_path(
                    &self.files,
                    &self.limits,
                    &self.asset_root,
                    dir,
                    path,
                    ordinal,
                )?);
            }
            sources
                .push(Arc::new(Source::open_named(&paths).map_err(|m| {
                    Error::Checkpoint(format!("source {ordinal}: {m}"))
                })?));
        }
        let stages =
            self.build_stages(&decls.stages, &decls.params, self.stages.len(), &sources)?;
        let built = Arc::new(InvocationSet { stages, sources });
        let mut c = self
            .spec_cache
            .lock()
            .map_err(|_| Error::Internal("spec cache poisoned".into()))?;
        // Two callers that missed the same set at once (a request and compilation ahead of demand) both built
        // it; the first one in is kept.
        if let Some((_, set)) = c.entries.iter().find(|(d, _)| *d == decls) {
            return Ok(set.clone());
        }
        c.entries.push((decls, built.clone()));
        let mut evicted = std::mem::take(&mut c.release_pending);
        while c.entries.len() > self.doc.specialization_cache {
            c.entries.remove(0);
            c.evictions += 1;
            evicted = true;
        }
        drop(c);
        if evicted {
            // Resident buffers only an evicted set used are released (invocations still running keep theirs).
            if let Ok(mut d) = self.domains.lock() {
                d.retain(|_, b| b.holders() > 1);
            }
        }
        Ok(built)
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
    /// `stage N (`name`): binding `b` of domain @d`, for messages.
    site: String,
}
