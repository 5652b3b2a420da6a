//! `loomc`: check, build, disassemble, run and report on Loom programs.
//!
//! ```text
//! loomc check FILE [--lib FILE]... [--role all|prepare|control|test] [--root NAME]...
//! loomc build FILE -o OUT.loombc
//! loomc dis FILE                      (.loombc or .loom) -> canonical text on stdout
//! loomc run FILE [--lib FILE]... --entry NAME [--fuel N] [--memory BYTES] [ARG]...
//! loomc report FILE [--lib FILE]... [--stage NAME [--config KEY=VALUE]...]
//! ```
//!
//! `report` lists the module's items, device items (kernels, kfuncs, stages) included; with `--stage` it
//! specializes that stage (`loom-kernel`) with the given template values and prints its reflection: buffers
//! and sizes, workspace liveness and offsets, parameter bindings, grids, barriers and the specialization time.
//!
//! `.loom` and `.loombc` files are accepted interchangeably wherever a FILE is expected. Diagnostics go to
//! stderr as `file:line:col: error: message` with an excerpt; the exit status is 1 on any error, 2 on bad usage.

mod run;

use anyhow::{Context, Result, bail};
use loom_compiler::{Catalog, Role};
use std::path::Path;
use std::process::ExitCode;

const USAGE: &str = "usage:
  loomc check FILE [--lib FILE]... [--role all|prepare|control|test] [--root NAME]...
  loomc build FILE -o OUT.loombc
  loomc dis FILE
  loomc run FILE [--lib FILE]... --entry NAME [--fuel N] [--memory BYTES] [ARG]...
  loomc report FILE [--lib FILE]... [--stage NAME [--config KEY=VALUE]...]

FILE may be .loom source or .loombc bytecode. ARGs of `run` are parsed by the entry's parameter types:
integers and floats as written, i1 as true/false, str as given, buffer as hex bytes (e.g. 0a0b0c).";

/// Parsed command-line options shared by the subcommands.
#[derive(Debug, Default)]
pub(crate) struct Opts {
    pub(crate) file: Option<String>,
    pub(crate) libs: Vec<String>,
    pub(crate) roots: Vec<String>,
    pub(crate) role: Option<String>,
    pub(crate) out: Option<String>,
    pub(crate) entry: Option<String>,
    pub(crate) fuel: Option<u64>,
    pub(crate) memory: Option<u64>,
    pub(crate) args: Vec<String>,
    pub(crate) stage: Option<String>,
    pub(crate) config: Vec<String>,
}

fn parse_opts(args: &[String]) -> Result<Opts> {
    let mut o = Opts::default();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .cloned()
                .with_context(|| format!("{name} needs a value"))
        };
        match a.as_str() {
            "--lib" => o.libs.push(value("--lib")?),
            "--root" => o.roots.push(value("--root")?),
            "--role" => o.role = Some(value("--role")?),
            "-o" | "--output" => o.out = Some(value("-o")?),
            "--entry" => o.entry = Some(value("--entry")?),
            "--stage" => o.stage = Some(value("--stage")?),
            "--config" => o.config.push(value("--config")?),
            "--fuel" => o.fuel = Some(value("--fuel")?.parse().context("--fuel takes a number")?),
            "--memory" => {
                o.memory = Some(
                    value("--memory")?
                        .parse()
                        .context("--memory takes a number of bytes")?,
                )
            }
            "--" => o.args.extend(it.by_ref().cloned()),
            s if s.starts_with("--") => bail!("unknown option {s}"),
            _ if o.file.is_none() => o.file = Some(a.clone()),
            _ => o.args.push(a.clone()),
        }
    }
    Ok(o)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(cmd) = args.first() else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    if cmd == "-h" || cmd == "--help" || cmd == "help" {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let opts = match parse_opts(&args[1..]) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("loomc: {e:#}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let result = match cmd.as_str() {
        "check" => check(&opts),
        "build" => build(&opts),
        "dis" => dis(&opts),
        "run" => run::run(&opts),
        "report" => report(&opts),
        other => {
            eprintln!("loomc: unknown command `{other}`\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("loomc: {e:#}");
            ExitCode::from(1)
        }
    }
}

pub(crate) fn role(name: Option<&str>) -> Result<Role> {
    Ok(match name.unwrap_or("all") {
        "prepare" => serve_runtime::abi::prepare_role(),
        "control" => serve_runtime::abi::control_role(),
        "test" => Role::new("test", &["test"]),
        "all" => Role::new(
            "all",
            &[
                "prepare",
                "input",
                "options",
                "runner",
                "parameters",
                "test",
            ],
        ),
        other => bail!("unknown role `{other}` (expected all, prepare, control or test)"),
    })
}

fn file_arg(o: &Opts) -> Result<&str> {
    o.file.as_deref().context("missing FILE")
}

/// Builds a catalog of the primary file and the `--lib` files; prints every diagnostic. `None` on errors.
pub(crate) fn catalog(o: &Opts) -> Result<Option<(Catalog, usize)>> {
    let mut cat = Catalog::with_ref_types(serve_runtime::abi::ref_types());
    let mut ok = true;
    let mut primary = None;
    for (i, f) in std::iter::once(file_arg(o)?)
        .chain(o.libs.iter().map(String::as_str))
        .enumerate()
    {
        let bytes = std::fs::read(f).with_context(|| format!("reading {f}"))?;
        match cat.add_file(f, &bytes) {
            Ok((idx, warnings)) => {
                warnings.iter().for_each(|w| eprint!("{w}"));
                if i == 0 {
                    primary = Some(idx);
                }
            }
            Err(e) => {
                eprint!("{e}");
                ok = false;
            }
        }
    }
    Ok(match (ok, primary) {
        (true, Some(p)) => Some((cat, p)),
        _ => None,
    })
}

fn check(o: &Opts) -> Result<bool> {
    let Some((cat, primary)) = catalog(o)? else {
        return Ok(false);
    };
    let role = role(o.role.as_deref())?;
    let roots: Vec<&str> = o.roots.iter().map(String::as_str).collect();
    match loom_compiler::link(&cat, primary, &roots, &role) {
        Ok(p) => {
            eprintln!(
                "{}: ok ({} function(s) linked, {} import(s))",
                file_arg(o)?,
                p.funcs.len(),
                p.imports.len()
            );
            Ok(true)
        }
        Err(errors) => {
            errors.iter().for_each(|e| eprint!("{e}"));
            Ok(false)
        }
    }
}

/// Compiles or decodes a single module.
fn one_module(f: &str) -> Result<Option<loom_ir::Module>> {
    let bytes = std::fs::read(f).with_context(|| format!("reading {f}"))?;
    let mut cat = Catalog::with_ref_types(serve_runtime::abi::ref_types());
    match cat.add_file(f, &bytes) {
        Ok((_, warnings)) => {
            warnings.iter().for_each(|w| eprint!("{w}"));
            let entry = cat.entries().first().context("empty catalog")?;
            Ok(Some(entry.module.clone()))
        }
        Err(e) => {
            eprint!("{e}");
            Ok(None)
        }
    }
}

fn build(o: &Opts) -> Result<bool> {
    let f = file_arg(o)?;
    let out = o
        .out
        .clone()
        .unwrap_or_else(|| Path::new(f).with_extension("loombc").display().to_string());
    let Some(m) = one_module(f)? else {
        return Ok(false);
    };
    let bytes = loom_ir::bytecode::encode(&m);
    std::fs::write(&out, &bytes).with_context(|| format!("writing {out}"))?;
    eprintln!("{f} -> {out} ({} bytes)", bytes.len());
    Ok(true)
}

fn dis(o: &Opts) -> Result<bool> {
    let Some(m) = one_module(file_arg(o)?)? else {
        return Ok(false);
    };
    print!("{}", loom_ir::print::print_module(&m));
    Ok(true)
}

fn report(o: &Opts) -> Result<bool> {
    let Some((cat, primary)) = catalog(o)? else {
        return Ok(false);
    };
    let m = &cat.entries()[primary].module;
    let bytes = loom_ir::bytecode::encode(m);
    println!("module @{} ({})", m.name, m.file);
    println!("  bytecode: {} bytes", bytes.len());
    for d in &m.decls {
        let kind = match &d.import {
            Some(module) => format!("capability import from \"{module}\""),
            None => "definition reference".to_string(),
        };
        println!("  decl @{}: {kind}", d.symbol);
    }
    for r in &m.records {
        let (offsets, size) = r.layout();
        let fields: Vec<String> = r
            .fields
            .iter()
            .zip(&offsets)
            .map(|((n, t), off)| format!("{n}: {t} @{off}"))
            .collect();
        println!(
            "  record @{}: {size} bytes {{ {} }}",
            r.name,
            fields.join(", ")
        );
    }
    for f in &m.funcs {
        let mut ops = 0usize;
        count_ops(&f.body, &mut ops);
        let vis = if f.exported { "export " } else { "" };
        let tps = if f.tparams.is_empty() {
            String::new()
        } else {
            format!(" ({} template parameter(s))", f.tparams.len())
        };
        println!(
            "  {vis}func @{}: {} values, {ops} ops{tps}",
            f.name,
            f.values.len()
        );
    }
    for d in &m.device {
        let vis = if d.exported { "export " } else { "" };
        let tps: Vec<String> = d
            .tparams
            .iter()
            .map(|t| match &t.default {
                Some(v) => format!("{} = {}", t.name, tvalue_text(v)),
                None => t.name.clone(),
            })
            .collect();
        println!(
            "  {vis}{} @{}<{}>",
            d.kind.keyword(),
            d.name,
            tps.join(", ")
        );
    }
    if let Some(stage) = &o.stage {
        return report_stage(&cat, primary, stage, &o.config);
    }
    Ok(true)
}

fn tvalue_text(v: &loom_ir::TValue) -> String {
    match v {
        loom_ir::TValue::I64(i) => i.to_string(),
        loom_ir::TValue::Bool(b) => b.to_string(),
        loom_ir::TValue::Str(s) => format!("{s:?}"),
        loom_ir::TValue::DType(d) => d.clone(),
        loom_ir::TValue::Shape(s) => format!("{s:?}"),
        loom_ir::TValue::Func(_) => "<func>".into(),
    }
}

/// Parses `KEY=VALUE` by the kind of the stage's template parameter `KEY`.
fn config_value(m: &loom_ir::Module, stage: &str, kv: &str) -> Result<(String, loom_ir::TValue)> {
    use loom_ir::{TParamKind as K, TValue as V};
    let (k, v) = kv
        .split_once('=')
        .with_context(|| format!("--config takes KEY=VALUE, found {kv:?}"))?;
    let item = m
        .device
        .iter()
        .find(|d| d.name == stage)
        .with_context(|| format!("module @{} has no stage @{stage}", m.name))?;
    let tp = item
        .tparams
        .iter()
        .find(|t| t.name == k)
        .with_context(|| format!("stage @{stage} has no template parameter `{k}`"))?;
    let value = match &tp.kind {
        K::I64 => V::I64(
            v.parse()
                .with_context(|| format!("`{k}` is an i64, found {v:?}"))?,
        ),
        K::Bool => V::Bool(
            v.parse()
                .with_context(|| format!("`{k}` is a bool, found {v:?}"))?,
        ),
        K::Str => V::Str(v.trim_matches('"').to_string()),
        K::DType => V::DType(v.to_string()),
        K::Shape => V::Shape(
            v.trim_matches(|c| c == '[' || c == ']')
                .split(',')
                .filter(|s| !s.trim().is_empty())
                .map(|s| s.trim().parse::<i64>())
                .collect::<Result<_, _>>()
                .with_context(|| format!("`{k}` is a shape such as [2,3], found {v:?}"))?,
        ),
        K::Func(_) => {
            bail!("`{k}` is a func parameter; it cannot be configured from the command line")
        }
    };
    Ok((k.to_string(), value))
}

fn report_stage(cat: &Catalog, primary: usize, stage: &str, config: &[String]) -> Result<bool> {
    let m = &cat.entries()[primary].module;
    let config: Vec<(String, loom_ir::TValue)> = config
        .iter()
        .map(|kv| config_value(m, stage, kv))
        .collect::<Result<_>>()?;
    let start = std::time::Instant::now();
    let result = loom_kernel::specialize_stage(cat, primary, stage, &config);
    let micros = start.elapsed().as_micros();
    match result {
        Ok(s) => {
            let r = loom_kernel::reflect(&s);
            println!(
                "stage @{}: {} kernel(s), {} dispatch(es), specialized in {micros} us",
                s.name,
                s.kernels.len(),
                s.dispatches.len()
            );
            for line in loom_kernel::dump_reflection(&r).lines() {
                println!("  {line}");
            }
            Ok(true)
        }
        Err(diags) => {
            for d in diags {
                eprint!("{d}");
            }
            Ok(false)
        }
    }
}

fn count_ops(r: &loom_ir::Region, n: &mut usize) {
    for op in &r.ops {
        *n += 1;
        match &op.kind {
            loom_ir::OpKind::If {
                then_region,
                else_region,
                ..
            } => {
                count_ops(then_region, n);
                count_ops(else_region, n);
            }
            loom_ir::OpKind::For { body, .. } => count_ops(body, n),
            loom_ir::OpKind::While {
                cond_region, body, ..
            } => {
                count_ops(cond_region, n);
                count_ops(body, n);
            }
            _ => {}
        }
    }
}
