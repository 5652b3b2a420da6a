//! Preparation: `model.json`, the catalog, linking and loading the programs for their roles, cold `prepare`
//! under the contract's interface, sources, and the cold stages (see the module docs of [`super`]).

use super::stages::SpecCache;
use super::{ColdResults, Model, Overrides, PrepareReport, invoke};
use crate::abi;
use crate::checkpoint::Source;
use crate::contract::{COLD, ContractInterface, Contracts};
use crate::device::gather::GatherQueue;
use crate::device::{Budget, Device};
use crate::natives::{self, Ctx};
use crate::package::{self, OperatorLimits, PackageFiles};
use crate::progress::{Phase as ProgressPhase, Progress};
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};
use loom_compiler::{Catalog, Role};
use loom_ir::{Signature, TParamKind, TValue};
use loom_vm::{LoadLimits, Loaded, Value, Vm};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

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

/// The package's programs: the catalog (programs and `definition.sources`, each compiled once), and the
/// `prepare` and `control` programs linked for their roles, loaded with their natives, entries checked.
struct Programs {
    catalog: Catalog,
    prepare: Loaded,
    prepare_file: String,
    control: Loaded,
    control_file: String,
    control_index: usize,
}

impl Programs {
    fn build(
        name: &str,
        files: &PackageFiles,
        limits: &OperatorLimits,
        doc_file: &str,
        doc: &package::ModelDoc,
        interface: &ContractInterface,
    ) -> Result<Programs> {
        let mut catalog = Catalog::with_ref_types(abi::ref_types());
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
        // another package or a shared library (`../arith-embed/control.loom`), an uploaded one only its own
        // files.
        let read_prog = |field: &str, path: &str| -> Result<(String, Vec<u8>)> {
            let bytes = files.read_source(doc_file, field, path, limits)?;
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
            let b = files.read_source(doc_file, &field, path, limits)?;
            if !seen.contains(path) {
                add(&mut catalog, path, b)?;
                seen.push(path.clone());
            }
        }

        let (prep_role, ctl_role) = (abi::prepare_role(), abi::control_role());
        let roots: Vec<&str> = interface.entries.iter().map(|(n, _)| *n).collect();
        let prepare = load(
            &catalog,
            prep_idx,
            &prep_file,
            &["prepare"],
            &prep_role,
            &natives::prepare_program_modules(),
        )?;
        let control = load(
            &catalog,
            ctl_idx,
            &ctl_file,
            &roots,
            &ctl_role,
            &natives::control_program_modules(),
        )?;
        check_entry(&prepare, &prep_file, "prepare", &interface.cold_signature())?;
        for (n, s) in &interface.entries {
            check_entry(&control, &ctl_file, n, s)?;
        }
        Ok(Programs {
            catalog,
            prepare,
            prepare_file: prep_file,
            control,
            control_file: ctl_file,
            control_index: ctl_idx,
        })
    }
}

/// Links `roots` of catalog module `primary` for `role` and loads the program with `natives`.
fn load(
    catalog: &Catalog,
    primary: usize,
    file: &str,
    roots: &[&str],
    role: &Role,
    natives: &[Arc<loom_vm::NativeModule>],
) -> Result<Loaded> {
    let program = loom_compiler::link(catalog, primary, roots, role).map_err(|errs| {
        Error::Program(
            errs.iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join(""),
        )
    })?;
    let grants: Vec<&str> = role.grants.iter().map(|s| s.as_str()).collect();
    Vm::load(&program, natives, &grants, &LoadLimits::default())
        .map_err(|e| Error::Program(format!("{file}: {e}")))
}

/// Prepares a package on the device `device_for` picks, under the contract its `model.json` names (one of
/// `contracts`). `name` is the registered model name.
pub fn prepare(
    name: &str,
    files: &PackageFiles,
    overrides: &Overrides,
    contracts: &Contracts,
    limits: &OperatorLimits,
    device_for: impl FnOnce(&[String]) -> Result<Arc<Device>>,
    progress: Arc<Progress>,
) -> Result<Model> {
    let start = Instant::now();
    if let PackageFiles::Dir(base) = files {
        limits.check_base(base)?;
    }
    let doc_file = overrides.manifest_file();
    let doc_bytes = files
        .read(doc_file)
        .map_err(|m| Error::package(doc_file, "", m))?;
    let doc = package::parse_model_doc(doc_file, &doc_bytes)?;
    let contract = contracts.for_doc(doc_file, &doc)?.clone();
    limits.check_doc(doc_file, &doc)?;
    let interface = contract
        .interface_for(&doc)
        .map_err(|m| Error::package(doc_file, "upstream", m))?;
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

    let programs = Programs::build(name, files, limits, doc_file, &doc, &interface)?;
    let prep_file = programs.prepare_file.clone();
    let (ctl_file, ctl_idx) = (programs.control_file.clone(), programs.control_index);
    let (prepare_loaded, control, catalog) = (programs.prepare, programs.control, programs.catalog);

    // Cold preparation.
    let asset_root = files.describe();
    let options_text = serde_json::Value::Object((*options).clone()).to_string();
    let mut lim = super::limits(doc.fuel.prepare(), doc.memory.invocation_bytes);
    lim.retained_bytes = Some(doc.memory.state_bytes);
    let (r, ctx) = invoke(
        &prepare_loaded,
        "prepare",
        &[Value::str(&asset_root), Value::str(&options_text)],
        &lim,
        Ctx::new(&COLD, interface.phases, options.clone()),
    );
    let values = r?;
    (interface.cold.check)(&values).map_err(|m| Error::Program(format!("{prep_file}: {m}")))?;
    let tokenizer_name = interface
        .cold
        .tokenizer
        .and_then(|i| values.get(i))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let cold = ColdResults {
        state: values
            .get(interface.cold.state)
            .cloned()
            .ok_or_else(|| Error::Internal("the cold state result is missing".into()))?,
        values,
    };
    let tokenizer = if tokenizer_name.is_empty() {
        None
    } else {
        let path = doc
            .assets
            .get(&tokenizer_name)
            .cloned()
            .unwrap_or_else(|| tokenizer_name.clone());
        let rel = package::relative(&prep_file, "prepare tokenizer result", &path)?;
        let bytes = files
            .read(&rel)
            .map_err(|m| Error::package(doc_file, "assets", m))?;
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
    // The memory forecast entry: linked into the control program beside the contract's entries, and checked.
    let (control, forecast) = match &decls.memory_forecast {
        None => (control, None),
        Some(root) => {
            let mut roots: Vec<&str> = interface.entries.iter().map(|(n, _)| *n).collect();
            roots.push(root);
            let selected = |e: Error| {
                Error::Program(format!(
                    "{prep_file}: prepare.memory_forecast selected `{root}` of {ctl_file}: {e}"
                ))
            };
            let linked = load(
                &catalog,
                ctl_idx,
                &ctl_file,
                &roots,
                &abi::control_role(),
                &natives::control_program_modules(),
            )
            .map_err(selected)?;
            check_entry(&linked, &ctl_file, root, &super::forecast_signature())
                .map_err(selected)?;
            (linked, Some(root.clone()))
        }
    };

    // Sources: each opened and indexed once, before any placement.
    progress.phase(ProgressPhase::Sources);
    let mut sources = Vec::with_capacity(decls.sources.len());
    for (i, shards) in decls.sources.iter().enumerate() {
        let mut paths = Vec::with_capacity(shards.len());
        for (dir, path) in shards {
            paths.push(resolve_source_path(
                files,
                limits,
                &asset_root,
                dir,
                path,
                i,
            )?);
        }
        sources.push(Arc::new(
            Source::open_named(&paths)
                .map_err(|m| Error::Checkpoint(format!("source {i}: {m}")))?,
        ));
    }

    if let PackageFiles::Uploaded {
        params: Some(up), ..
    } = files
    {
        // Every parameter file that came with the upload is read by a source `prepare` opens: one it never
        // opens would be silently ignored (a misnamed checkpoint, a file meant for another package).
        let opened: std::collections::BTreeSet<&str> = sources
            .iter()
            .flat_map(|s| s.names.iter().map(String::as_str))
            .collect();
        if let Some(unread) = up.files().iter().find(|f| !opened.contains(f.as_str())) {
            return Err(Error::package(
                "upload",
                "parameters",
                format!(
                    "the uploaded parameter file `{unread}` is not opened by prepare (prepare.source opens: \
                     {}); every uploaded parameter file must be a checkpoint prepare reads",
                    if opened.is_empty() {
                        "nothing".to_string()
                    } else {
                        opened.iter().copied().collect::<Vec<_>>().join(", ")
                    }
                ),
            ));
        }
    }
    let budget = Budget::reserved(&device, name, doc.memory.device_bytes)?;
    let budget_limit = doc.memory.device_bytes;
    let gather = GatherQueue::start(device.clone(), name, doc.io.direct)?;
    let mut model = Model {
        name: name.to_string(),
        doc,
        contract,
        phases: interface.phases,
        device,
        budget,
        cold,
        stages: Vec::new(),
        report: PrepareReport::default(),
        control,
        catalog,
        files: files.clone(),
        limits: limits.clone(),
        asset_root: asset_root.clone(),
        sources,
        cold_params: decls.params.clone(),
        domains: Mutex::new(HashMap::new()),
        spec_cache: Mutex::new(SpecCache::default()),
        options,
        tokenizer,
        timelines: Arc::default(),
        workspace: Arc::new(crate::natives::WorkspacePool::new(budget_limit / 4)),
        gather,
        progress: Mutex::new(progress.clone()),
        forecast,
        peers: Default::default(),
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

/// Where source shard `path` (declared with directory `dir`) of source `ordinal` is: its canonical path and its
/// name for messages.
///
/// With `dir` the asset root given to `prepare` (or empty), `path` resolves against the package's parameter root
/// (a server-local package's directory; an uploaded package's own parameter files, or `--params-root` when it
/// carried none) and, symlinks resolved, must stay inside it (a server-local package: inside the operator's
/// package roots, [`OperatorLimits::admits`]); its name is the package-relative path. Any other `dir` must be an
/// absolute directory inside the operator's `--params-root` ([`OperatorLimits::params_root`]), and `path`
/// resolves against it and must stay inside it; its name is `dir/path`.
pub(crate) fn resolve_source_path(
    files: &PackageFiles,
    limits: &OperatorLimits,
    asset_root: &str,
    dir: &str,
    path: &str,
    ordinal: usize,
) -> Result<(PathBuf, String)> {
    let rel = package::relative("prepare.source", "path", path)
        .map_err(|e| Error::Checkpoint(format!("source {ordinal}: {e}")))?;
    if !dir.is_empty() && dir != asset_root {
        return resolve_in_params_root(limits, dir, &rel, ordinal);
    }
    let root = files.params_root().ok_or_else(|| {
        Error::Checkpoint(format!(
            "source {ordinal}: {path}: this uploaded package carried no parameter files (multipart \
             parts named `parameters`) and the server has no --params-root"
        ))
    })?;
    let bad = |m: String| Error::Checkpoint(format!("source {ordinal}: checkpoint {rel}: {m}"));
    let canon = root
        .join(&rel)
        .canonicalize()
        .map_err(|e| bad(package::io_text(&e)))?;
    let inside = match files {
        PackageFiles::Dir(base) => limits.admits(base, &canon),
        PackageFiles::Uploaded { .. } => root.canonicalize().is_ok_and(|r| canon.starts_with(r)),
    };
    if !inside {
        return Err(bad(
            "resolves outside the places this server reads checkpoints from".into(),
        ));
    }
    Ok((canon, rel))
}

/// `prepare.source(dir, rel)` with `dir` other than the asset root: `dir` absolute, inside `--params-root`, and
/// `dir/rel` (symlinks resolved) inside it too.
fn resolve_in_params_root(
    limits: &OperatorLimits,
    dir: &str,
    rel: &str,
    ordinal: usize,
) -> Result<(PathBuf, String)> {
    // Messages name the file by its place in the parameter root, never by its absolute path.
    let name = format!("{rel} in {dir:?}");
    let bad = |m: String| Error::Checkpoint(format!("source {ordinal}: checkpoint {name}: {m}"));
    let Some(root) = &limits.params_root else {
        return Err(bad(format!(
            "directory {dir:?} is not the asset root given to prepare, and this server has no --params-root \
             (checkpoints outside the package are read only from inside the operator's parameter root)"
        )));
    };
    if !Path::new(dir).is_absolute() {
        return Err(bad(format!(
            "directory {dir:?} must be the asset root given to prepare or an absolute directory inside the \
             server's --params-root"
        )));
    }
    let outside = |p: &Path| p.canonicalize().is_ok_and(|c| !c.starts_with(root));
    if outside(Path::new(dir)) {
        return Err(bad(
            "resolves outside the server's --params-root (checkpoints outside the package are read only from \
             inside it)"
                .into(),
        ));
    }
    let canon = Path::new(dir)
        .join(rel)
        .canonicalize()
        .map_err(|e| bad(package::io_text(&e)))?;
    let Ok(inside) = canon.strip_prefix(root) else {
        return Err(bad(
            "resolves outside the server's --params-root (checkpoints outside the package are read only from \
             inside it)"
                .into(),
        ));
    };
    let shown = format!("params-root/{}", inside.display());
    Ok((canon, shown))
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
