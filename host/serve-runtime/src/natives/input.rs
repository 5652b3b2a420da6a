//! `input`: the deployment's tokenizer (`encode` text to ids, `decode` ids to text), charged by input size.

use super::{Ctx, arg_i64, ctx, sig};
use crate::tokenizer::Tokenizer;
use loom_ir::Type;
use loom_vm::{NativeError, NativeModule, Value};
use std::sync::Arc;

/// Largest `input.encode` id capacity and `input.decode` byte capacity.
pub const MAX_INPUT_CAPACITY: i64 = 1 << 24;

fn tokenizer_of(c: &Ctx, what: &str) -> Result<Arc<Tokenizer>, NativeError> {
    c.tokenizer.clone().ok_or_else(|| {
        NativeError::failed(format!(
            "{what}: this model has no tokenizer (cold prepare names it; it is bound once prepare returns)"
        ))
    })
}

fn capacity(what: &str, v: i64) -> Result<usize, NativeError> {
    if (0..=MAX_INPUT_CAPACITY).contains(&v) {
        Ok(v as usize)
    } else {
        Err(NativeError::failed(format!(
            "{what}: capacity {v} is outside 0..={MAX_INPUT_CAPACITY}"
        )))
    }
}

/// `input`: the deployment's tokenizer.
pub fn input_module() -> NativeModule {
    use Type::*;
    NativeModule::new("input")
        .func(
            "encode",
            sig(vec![Buffer, I32, I64], vec![Buffer, I64]),
            50,
            |nc, a| {
                let tok = ctx(nc, "input.encode", |c| tokenizer_of(c, "input.encode"))?;
                let text = a.first().and_then(Value::as_buffer).unwrap_or_default();
                let flags = a.get(1).and_then(Value::as_i32).unwrap_or(0);
                let cap = capacity("input.encode", arg_i64(a, 2))?;
                nc.charge_fuel(text.len() as u64)?;
                nc.alloc(cap as u64 * 4)?;
                let text = std::str::from_utf8(text).map_err(|e| {
                    NativeError::failed(format!("input.encode: the text is not UTF-8 ({e})"))
                })?;
                let ids = tok.encode(text, flags).map_err(NativeError::failed)?;
                let n = ids.len().min(cap);
                let mut out = vec![0u8; cap * 4];
                for (i, id) in ids[..n].iter().enumerate() {
                    out[i * 4..i * 4 + 4].copy_from_slice(&(*id as i32).to_le_bytes());
                }
                Ok(vec![Value::buffer(out), Value::I64(n as i64)])
            },
        )
        .func(
            "decode",
            sig(vec![Buffer, I32, I64], vec![Buffer, I64]),
            50,
            |nc, a| {
                let tok = ctx(nc, "input.decode", |c| tokenizer_of(c, "input.decode"))?;
                let raw = a.first().and_then(Value::as_buffer).unwrap_or_default();
                let flags = a.get(1).and_then(Value::as_i32).unwrap_or(0);
                let cap = capacity("input.decode", arg_i64(a, 2))?;
                if raw.len() % 4 != 0 {
                    return Err(NativeError::failed(format!(
                        "input.decode: {} bytes are not whole i32 ids",
                        raw.len()
                    )));
                }
                nc.charge_fuel(raw.len() as u64)?;
                nc.alloc(cap as u64)?;
                let mut ids = Vec::with_capacity(raw.len() / 4);
                for c in raw.chunks_exact(4) {
                    let id = i32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                    if id < 0 {
                        return Err(NativeError::failed(format!(
                            "input.decode: negative token id {id}"
                        )));
                    }
                    ids.push(id as u32);
                }
                let text = tok.decode(&ids, flags).map_err(NativeError::failed)?;
                if text.len() > cap {
                    return Err(NativeError::failed(format!(
                        "input.decode: the text needs {} bytes, the capacity is {cap}",
                        text.len()
                    )));
                }
                let mut out = text.into_bytes();
                let n = out.len();
                out.resize(cap, 0);
                Ok(vec![Value::buffer(out), Value::I64(n as i64)])
            },
        )
}
