//! `prepare`: declarations of stages, their configuration, sources and parameter bindings; in cold preparation
//! and in any phase whose grants include declarations (invocation-scoped: ordinals follow the cold ones).

use super::{
    ConfigValue, Ctx, Grant, ParamDecl, StageDecl, arg_i64, arg_str, ctx, need_grant, sig,
};
use loom_ir::Type;
use loom_vm::{NativeError, NativeModule, Value};

/// Declaration limits per invocation (a hostile program cannot grow the server's tables without bound).
pub const MAX_DECLS: usize = 4096;

fn stage_ordinal(c: &Ctx, what: &str, s: i64) -> Result<usize, NativeError> {
    let local = (s as usize).checked_sub(c.stage_base);
    match local {
        Some(l) if s >= 0 && l < c.decls.stages.len() => Ok(l),
        _ => Err(NativeError::failed(format!(
            "{what}: stage {s} was not declared by this invocation (its stages are {}..{})",
            c.stage_base,
            c.stage_base + c.decls.stages.len()
        ))),
    }
}

/// `prepare`: cold and invocation-scoped declarations.
pub fn prepare_module() -> NativeModule {
    use Type::*;
    NativeModule::new("prepare")
        .func("stage", sig(vec![Str, I64], vec![I64]), 10, |nc, args| {
            let what = "prepare.stage";
            ctx(nc, what, |c| {
                need_grant(c, what, Grant::Declare)?;
                if c.decls.stages.len() >= MAX_DECLS {
                    return Err(NativeError::failed(format!(
                        "{what}: more than {MAX_DECLS} stages"
                    )));
                }
                let root = arg_str(args, 0);
                if root.is_empty() || root.len() > 512 {
                    return Err(NativeError::failed(format!(
                        "{what}: root must name a stage (`module.stage`), found {root:?}"
                    )));
                }
                c.decls.stages.push(StageDecl {
                    root,
                    tag: arg_i64(args, 1),
                    config: Vec::new(),
                    workspace_limit: None,
                });
                Ok(vec![Value::I64(
                    (c.stage_base + c.decls.stages.len() - 1) as i64,
                )])
            })
        })
        // Refused where it is called, with the reason, rather than failing preparation later.
        .func("dispatch", sig(vec![Str, I64], vec![I64]), 10, |nc, _| {
            ctx(nc, "prepare.dispatch", |c| {
                need_grant(c, "prepare.dispatch", Grant::Declare)?;
                Err(NativeError::failed(
                    "prepare.dispatch: direct-dispatch roots need a device plugin that runs them, and no HAL \
                     of this server does yet; declare a stage with prepare.stage",
                ))
            })
        })
        .func("config", sig(vec![I64, Str, Str], vec![]), 10, |nc, a| {
            ctx(nc, "prepare.config", |c| {
                need_grant(c, "prepare.config", Grant::Declare)?;
                let s = stage_ordinal(c, "prepare.config", arg_i64(a, 0))?;
                let cfg = &mut c.decls.stages[s].config;
                if cfg.len() >= 256 {
                    return Err(NativeError::failed("prepare.config: more than 256 values"));
                }
                cfg.push((arg_str(a, 1), ConfigValue::Text(arg_str(a, 2))));
                Ok(vec![])
            })
        })
        .func(
            "config_i64",
            sig(vec![I64, Str, I64], vec![]),
            10,
            |nc, a| {
                ctx(nc, "prepare.config_i64", |c| {
                    need_grant(c, "prepare.config_i64", Grant::Declare)?;
                    let s = stage_ordinal(c, "prepare.config_i64", arg_i64(a, 0))?;
                    let cfg = &mut c.decls.stages[s].config;
                    if cfg.len() >= 256 {
                        return Err(NativeError::failed(
                            "prepare.config_i64: more than 256 values",
                        ));
                    }
                    cfg.push((arg_str(a, 1), ConfigValue::I64(arg_i64(a, 2))));
                    Ok(vec![])
                })
            },
        )
        .func(
            "workspace_limit",
            sig(vec![I64, I64], vec![]),
            10,
            |nc, a| {
                ctx(nc, "prepare.workspace_limit", |c| {
                    need_grant(c, "prepare.workspace_limit", Grant::Declare)?;
                    let s = stage_ordinal(c, "prepare.workspace_limit", arg_i64(a, 0))?;
                    let b = arg_i64(a, 1);
                    if b < 0 {
                        return Err(NativeError::failed(format!(
                            "prepare.workspace_limit: {b} is negative"
                        )));
                    }
                    c.decls.stages[s].workspace_limit = Some(b as u64);
                    Ok(vec![])
                })
            },
        )
        .func("memory_forecast", sig(vec![Str], vec![]), 10, |nc, a| {
            ctx(nc, "prepare.memory_forecast", |c| {
                need_grant(c, "prepare.memory_forecast", Grant::Forecast)?;
                c.decls.memory_forecast = Some(arg_str(a, 0));
                Ok(vec![])
            })
        })
        .func("source", sig(vec![Str, Str], vec![I64]), 10, |nc, a| {
            ctx(nc, "prepare.source", |c| {
                need_grant(c, "prepare.source", Grant::Declare)?;
                if c.decls.sources.len() >= 256 {
                    return Err(NativeError::failed("prepare.source: more than 256 sources"));
                }
                c.decls.sources.push(vec![(arg_str(a, 0), arg_str(a, 1))]);
                Ok(vec![Value::I64(
                    (c.source_base + c.decls.sources.len() - 1) as i64,
                )])
            })
        })
        .func(
            "source_append",
            sig(vec![I64, Str, Str], vec![]),
            10,
            |nc, a| {
                ctx(nc, "prepare.source_append", |c| {
                    need_grant(c, "prepare.source_append", Grant::Declare)?;
                    let s = arg_i64(a, 0);
                    let local = (s as usize).checked_sub(c.source_base);
                    let Some(list) = local.and_then(|l| c.decls.sources.get_mut(l)) else {
                        return Err(NativeError::failed(format!(
                            "prepare.source_append: source {s} was not declared by this invocation \
                         (a cold source cannot get shards later)"
                        )));
                    };
                    if list.len() >= 4096 {
                        return Err(NativeError::failed(
                            "prepare.source_append: more than 4096 shards",
                        ));
                    }
                    list.push((arg_str(a, 1), arg_str(a, 2)));
                    Ok(vec![])
                })
            },
        )
        .func(
            "parameter",
            sig(vec![I64, Str, I64, I64, Str], vec![]),
            10,
            |nc, a| {
                ctx(nc, "prepare.parameter", |c| {
                    need_grant(c, "prepare.parameter", Grant::Declare)?;
                    let stage = stage_ordinal(c, "prepare.parameter", arg_i64(a, 0))?;
                    let input = arg_i64(a, 2);
                    let source = arg_i64(a, 3);
                    if !(0..=255).contains(&input) {
                        return Err(NativeError::failed(format!(
                            "prepare.parameter: input ordinal {input} is not in 0..=255"
                        )));
                    }
                    if source < 0 || source as usize >= c.source_base + c.decls.sources.len() {
                        return Err(NativeError::failed(format!(
                            "prepare.parameter: source {source} was not declared"
                        )));
                    }
                    if c.decls.params.len() >= MAX_DECLS {
                        return Err(NativeError::failed(
                            "prepare.parameter: too many declarations",
                        ));
                    }
                    c.decls.params.push(ParamDecl {
                        stage,
                        binding: arg_str(a, 1),
                        input: input as u32,
                        source: source as usize,
                        policy: arg_str(a, 4),
                    });
                    Ok(vec![])
                })
            },
        )
}
