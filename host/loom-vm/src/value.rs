//! Values exchanged with the host: thread-safe, immutable, cheap to clone.

use loom_ir::Type;
use std::any::Any;
use std::fmt;
use std::sync::Arc;

/// A value passed into or returned from an invocation, or to and from a native function.
///
/// Reference variants are `Arc`s, so values are `Send + Sync` and cloning is O(1). A `Value` is immutable: the VM
/// never writes through one (a store into a buffer that came from a `Value` copies it first).
#[derive(Clone)]
pub enum Value {
    I1(bool),
    I32(i32),
    I64(i64),
    F32(f32),
    F64(f64),
    Str(Arc<str>),
    /// `buffer`. `Arc<Vec<u8>>` rather than `Arc<[u8]>` so that a buffer the VM gives away and gets back
    /// uniquely owned can be written again without a copy.
    Buffer(Arc<Vec<u8>>),
    /// `list<T>`; the element type comes from the signature the value is checked against.
    List(Arc<Vec<Value>>),
    /// `!opaque`: an immutable tuple made by `opaque.new`.
    Opaque(Arc<[Value]>),
    /// A host object of nominal type `!type_name` (e.g. `hal.buffer`).
    Native {
        type_name: Arc<str>,
        obj: Arc<dyn Any + Send + Sync>,
    },
    /// `null` of a nullable reference type (the payload is that type).
    Null(Type),
}

impl fmt::Debug for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::I1(v) => write!(f, "I1({v})"),
            Value::I32(v) => write!(f, "I32({v})"),
            Value::I64(v) => write!(f, "I64({v})"),
            Value::F32(v) => write!(f, "F32({v:?})"),
            Value::F64(v) => write!(f, "F64({v:?})"),
            Value::Str(s) => write!(f, "Str({s:?})"),
            Value::Buffer(b) => write!(f, "Buffer({} bytes)", b.len()),
            Value::List(l) => f.debug_tuple("List").field(&**l).finish(),
            Value::Opaque(o) => f.debug_tuple("Opaque").field(&&**o).finish(),
            Value::Native { type_name, .. } => write!(f, "Native(!{type_name})"),
            Value::Null(t) => write!(f, "Null({t})"),
        }
    }
}

/// Structural equality; natives compare by pointer identity, floats by bits (so NaN equals itself).
impl PartialEq for Value {
    fn eq(&self, other: &Self) -> bool {
        use Value::*;
        match (self, other) {
            (I1(a), I1(b)) => a == b,
            (I32(a), I32(b)) => a == b,
            (I64(a), I64(b)) => a == b,
            (F32(a), F32(b)) => a.to_bits() == b.to_bits(),
            (F64(a), F64(b)) => a.to_bits() == b.to_bits(),
            (Str(a), Str(b)) => a == b,
            (Buffer(a), Buffer(b)) => a == b,
            (List(a), List(b)) => a == b,
            (Opaque(a), Opaque(b)) => a == b,
            (Native { obj: a, .. }, Native { obj: b, .. }) => Arc::ptr_eq(a, b),
            (Null(a), Null(b)) => a == b,
            _ => false,
        }
    }
}

/// Fixed per-value overhead counted by [`Value::retained_bytes`] (an `Arc` header plus the enum slot).
const VALUE_OVERHEAD: u64 = 32;

impl Value {
    pub fn buffer(bytes: Vec<u8>) -> Value {
        Value::Buffer(Arc::new(bytes))
    }
    pub fn str(s: &str) -> Value {
        Value::Str(Arc::from(s))
    }
    pub fn list(items: Vec<Value>) -> Value {
        Value::List(Arc::new(items))
    }
    pub fn opaque(items: Vec<Value>) -> Value {
        Value::Opaque(Arc::from(items))
    }
    pub fn native<T: Any + Send + Sync>(type_name: &str, obj: T) -> Value {
        Value::Native {
            type_name: Arc::from(type_name),
            obj: Arc::new(obj),
        }
    }

    /// The bytes this value keeps alive if the host retains it (e.g. `!opaque` state kept across invocations):
    /// payload bytes plus a fixed overhead per value. Shared sub-values are counted once per occurrence (an upper
    /// bound); native objects count only their overhead (the host owns their size). The host compares the sum over
    /// what it keeps against its per-model retained-state cap.
    pub fn retained_bytes(&self) -> u64 {
        let inner = match self {
            Value::I1(_) | Value::I32(_) | Value::I64(_) | Value::F32(_) | Value::F64(_) => 0,
            Value::Str(s) => s.len() as u64,
            Value::Buffer(b) => b.len() as u64,
            Value::List(l) => l
                .iter()
                .map(Value::retained_bytes)
                .fold(0u64, u64::saturating_add),
            Value::Opaque(o) => o
                .iter()
                .map(Value::retained_bytes)
                .fold(0u64, u64::saturating_add),
            Value::Native { type_name, .. } => type_name.len() as u64,
            Value::Null(_) => 0,
        };
        inner.saturating_add(VALUE_OVERHEAD)
    }

    /// Whether this value has type `ty` (deep for lists; a non-null reference also has its nullable type).
    pub fn has_type(&self, ty: &Type) -> bool {
        match (self, ty) {
            (Value::I1(_), Type::I1)
            | (Value::I32(_), Type::I32)
            | (Value::I64(_), Type::I64)
            | (Value::F32(_), Type::F32)
            | (Value::F64(_), Type::F64)
            | (Value::Str(_), Type::Str)
            | (Value::Buffer(_), Type::Buffer) => true,
            (Value::List(items), Type::List(elem)) => items.iter().all(|v| v.has_type(elem)),
            (Value::Opaque(_), Type::Ref { name, .. }) => name == "opaque",
            (Value::Native { type_name, .. }, Type::Ref { name, .. }) => **type_name == **name,
            (
                Value::Null(t),
                Type::Ref {
                    name,
                    nullable: true,
                },
            ) => {
                matches!(t, Type::Ref { name: n, .. } if n == name)
            }
            _ => false,
        }
    }

    /// A short description of the value's type for error messages (`buffer`, `list`, `!hal.buffer`, `null`).
    pub fn type_desc(&self) -> String {
        match self {
            Value::I1(_) => "i1".into(),
            Value::I32(_) => "i32".into(),
            Value::I64(_) => "i64".into(),
            Value::F32(_) => "f32".into(),
            Value::F64(_) => "f64".into(),
            Value::Str(_) => "str".into(),
            Value::Buffer(_) => "buffer".into(),
            Value::List(_) => "list".into(),
            Value::Opaque(_) => "!opaque".into(),
            Value::Native { type_name, .. } => format!("!{type_name}"),
            Value::Null(t) => format!("null ({t})"),
        }
    }

    pub fn as_i64(&self) -> Option<i64> {
        if let Value::I64(v) = self {
            Some(*v)
        } else {
            None
        }
    }
    pub fn as_i32(&self) -> Option<i32> {
        if let Value::I32(v) = self {
            Some(*v)
        } else {
            None
        }
    }
    pub fn as_f64(&self) -> Option<f64> {
        if let Value::F64(v) = self {
            Some(*v)
        } else {
            None
        }
    }
    pub fn as_bool(&self) -> Option<bool> {
        if let Value::I1(v) = self {
            Some(*v)
        } else {
            None
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        if let Value::Str(v) = self {
            Some(v)
        } else {
            None
        }
    }
    pub fn as_buffer(&self) -> Option<&[u8]> {
        if let Value::Buffer(v) = self {
            Some(v)
        } else {
            None
        }
    }
}
