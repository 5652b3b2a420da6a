//! `loomc run`: link a program with the `test` capability module and invoke one export in the sandbox.

use crate::{Opts, catalog, role};
use anyhow::{Context, Result, bail};
use loom_ir::Type;
use loom_vm::{InvokeLimits, LoadLimits, Value, Vm};
use std::sync::Arc;

/// Parses a command-line argument as a value of `ty`.
fn parse_arg(text: &str, ty: &Type) -> Result<Value> {
    Ok(match ty {
        Type::I1 => Value::I1(match text {
            "true" | "1" => true,
            "false" | "0" => false,
            _ => bail!("expected true or false, found `{text}`"),
        }),
        Type::I32 => Value::I32(
            text.parse()
                .with_context(|| format!("expected an i32, found `{text}`"))?,
        ),
        Type::I64 => Value::I64(
            text.parse()
                .with_context(|| format!("expected an i64, found `{text}`"))?,
        ),
        Type::F32 => Value::F32(
            text.parse()
                .with_context(|| format!("expected an f32, found `{text}`"))?,
        ),
        Type::F64 => Value::F64(
            text.parse()
                .with_context(|| format!("expected an f64, found `{text}`"))?,
        ),
        Type::Str => Value::str(text),
        Type::Buffer => {
            let hex = text.strip_prefix("0x").unwrap_or(text);
            if !hex.len().is_multiple_of(2) || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                bail!("expected a buffer as an even number of hex digits, found `{text}`");
            }
            let bytes = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16))
                .collect::<Result<Vec<u8>, _>>()?;
            Value::buffer(bytes)
        }
        other => bail!("arguments of type {other} cannot be given on the command line"),
    })
}

/// Prints a result value as `TYPE VALUE`.
fn show(v: &Value) -> String {
    match v {
        Value::I1(b) => format!("i1 {b}"),
        Value::I32(x) => format!("i32 {x}"),
        Value::I64(x) => format!("i64 {x}"),
        Value::F32(x) => format!("f32 {x:?}"),
        Value::F64(x) => format!("f64 {x:?}"),
        Value::Str(s) => format!("str {s:?}"),
        Value::Buffer(b) => format!(
            "buffer {}",
            b.iter().map(|x| format!("{x:02x}")).collect::<String>()
        ),
        other => format!("{other:?}"),
    }
}

pub(crate) fn run(o: &Opts) -> Result<bool> {
    let entry = o.entry.as_deref().context("`run` needs --entry NAME")?;
    let Some((cat, primary)) = catalog(o)? else {
        return Ok(false);
    };
    let role = role(Some(o.role.as_deref().unwrap_or("test")))?;
    let program = match loom_compiler::link(&cat, primary, &[entry], &role) {
        Ok(p) => p,
        Err(errors) => {
            errors.iter().for_each(|e| eprint!("{e}"));
            return Ok(false);
        }
    };
    let test = Arc::new(loom_vm::testing::test_module(None));
    let granted: Vec<&str> = role.grants.iter().map(String::as_str).collect();
    let loaded = match Vm::load(&program, &[test], &granted, &LoadLimits::default()) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("{e}");
            return Ok(false);
        }
    };
    let sig = loaded
        .signature(entry)
        .context("the entry is not exported")?;
    if sig.params.len() != o.args.len() {
        bail!(
            "@{entry} takes {} argument(s) ({:?}), {} given",
            sig.params.len(),
            sig.params,
            o.args.len()
        );
    }
    let args = o
        .args
        .iter()
        .zip(&sig.params)
        .enumerate()
        .map(|(i, (a, t))| parse_arg(a, t).with_context(|| format!("argument {}", i + 1)))
        .collect::<Result<Vec<_>>>()?;
    let mut limits = InvokeLimits::default();
    if let Some(f) = o.fuel {
        limits.fuel = f;
    }
    if let Some(m) = o.memory {
        limits.memory_bytes = m;
    }
    let inv = loaded.invoke_metered(entry, &args, &limits);
    match inv.result {
        Ok(values) => {
            for v in &values {
                println!("=> {}", show(v));
            }
            eprintln!(
                "fuel used: {}, memory charged: {} bytes",
                inv.fuel_used, inv.memory_used
            );
            Ok(true)
        }
        Err(trap) => {
            eprintln!("trap ({:?}): {trap}", trap.kind);
            eprintln!(
                "fuel used: {}, memory charged: {} bytes",
                inv.fuel_used, inv.memory_used
            );
            Ok(false)
        }
    }
}
