//! `options`: typed reads of the deployment's source-owned options object.

use super::{Ctx, arg_i64, arg_str, ctx, sig};
use loom_ir::Type;
use loom_vm::{NativeError, NativeModule, Value};

fn option<'a>(c: &'a Ctx, key: &str) -> Option<&'a serde_json::Value> {
    c.options.get(key)
}

/// `options`: typed reads of the deployment's source-owned options object.
pub fn options_module() -> NativeModule {
    use Type::*;
    NativeModule::new("options")
        .func("i64", sig(vec![Str, I64], vec![I64]), 5, |nc, a| {
            ctx(nc, "options.i64", |c| {
                let key = arg_str(a, 0);
                match option(c, &key) {
                    None => Ok(vec![Value::I64(arg_i64(a, 1))]),
                    Some(v) => v.as_i64().map(|i| vec![Value::I64(i)]).ok_or_else(|| {
                        NativeError::failed(format!(
                            "model.json: field `options.{key}`: expected an integer, found {v}"
                        ))
                    }),
                }
            })
        })
        .func("f64", sig(vec![Str, F64], vec![F64]), 5, |nc, a| {
            ctx(nc, "options.f64", |c| {
                let key = arg_str(a, 0);
                match option(c, &key) {
                    None => Ok(vec![Value::F64(
                        a.get(1).and_then(Value::as_f64).unwrap_or(0.0),
                    )]),
                    Some(v) => v.as_f64().map(|f| vec![Value::F64(f)]).ok_or_else(|| {
                        NativeError::failed(format!(
                            "model.json: field `options.{key}`: expected a number, found {v}"
                        ))
                    }),
                }
            })
        })
        .func("str", sig(vec![Str, Str], vec![Str]), 5, |nc, a| {
            ctx(nc, "options.str", |c| {
                let key = arg_str(a, 0);
                match option(c, &key) {
                    None => Ok(vec![Value::str(&arg_str(a, 1))]),
                    Some(v) => v.as_str().map(|s| vec![Value::str(s)]).ok_or_else(|| {
                        NativeError::failed(format!(
                            "model.json: field `options.{key}`: expected a string, found {v}"
                        ))
                    }),
                }
            })
        })
}
