//! The `test` native module: printing from programs, for tests and `loomc run`.
//!
//! Functions: `test.print_i64(i64)`, `test.print_f64(f64)`, `test.print(str)`, `test.print_buffer(buffer)` (lowercase
//! hex). Each call appends one line to the sink, or writes it to stdout when there is none.

use crate::native::NativeModule;
use crate::value::Value;
use loom_ir::{Signature, Type};
use std::sync::{Arc, Mutex};

/// A shared sink of printed lines.
pub type Sink = Arc<Mutex<Vec<String>>>;

/// Fuel charged per print call.
pub const PRINT_FUEL: u64 = 10;

fn emit(sink: &Option<Sink>, line: String) {
    match sink {
        // A poisoned sink only means another printer panicked; keep the lines.
        Some(s) => s.lock().unwrap_or_else(|e| e.into_inner()).push(line),
        None => println!("{line}"),
    }
}

/// The `test` module writing into `sink` (or stdout when `None`).
pub fn test_module(sink: Option<Sink>) -> NativeModule {
    let sig = |t: Type| Signature {
        params: vec![t],
        results: vec![],
    };
    let (s1, s2, s3, s4) = (sink.clone(), sink.clone(), sink.clone(), sink);
    NativeModule::new("test")
        .func("print_i64", sig(Type::I64), PRINT_FUEL, move |_, a| {
            if let Some(Value::I64(v)) = a.first() {
                emit(&s1, v.to_string());
            }
            Ok(vec![])
        })
        .func("print_f64", sig(Type::F64), PRINT_FUEL, move |_, a| {
            if let Some(Value::F64(v)) = a.first() {
                emit(&s2, v.to_string());
            }
            Ok(vec![])
        })
        .func("print", sig(Type::Str), PRINT_FUEL, move |_, a| {
            if let Some(Value::Str(v)) = a.first() {
                emit(&s3, v.to_string());
            }
            Ok(vec![])
        })
        .func(
            "print_buffer",
            sig(Type::Buffer),
            PRINT_FUEL,
            move |ctx, a| {
                if let Some(Value::Buffer(b)) = a.first() {
                    ctx.charge_fuel(b.len() as u64 / 16)?;
                    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
                    emit(&s4, hex);
                }
                Ok(vec![])
            },
        )
}

/// A fresh sink and the `test` module writing into it.
pub fn test_module_with_sink() -> (Arc<NativeModule>, Sink) {
    let sink: Sink = Arc::new(Mutex::new(Vec::new()));
    (Arc::new(test_module(Some(sink.clone()))), sink)
}

/// Test mode: when on, programs loaded afterwards JIT every eligible function (not only those with loops), and
/// every invocation of a program with JIT code and no native imports runs twice, interpreted and JIT-ed, and
/// panics unless results, traps (kind, message, function, pc, loc), fuel used and memory used are identical.
/// `LOOM_VM_JIT_CROSS_CHECK=1` in the environment turns it on for the whole process.
#[doc(hidden)]
pub fn set_jit_cross_check(on: bool) {
    crate::JIT_CROSS_CHECK.store(on, std::sync::atomic::Ordering::Relaxed);
}
