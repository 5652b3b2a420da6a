//! The invocation heap: reference objects addressed by `u32` handles, with the memory meter.
//!
//! Every reference the program touches (buffer, str, list, opaque, native object) is an entry of one `Vec<Obj>`
//! owned by the invocation; reference registers hold indices into it (0 is `null`). Handles are `Copy`, so
//! moving references between registers costs nothing and needs no reference counting; interior mutability is
//! unnecessary because the interpreter owns the heap outright. Objects are never freed before the invocation
//! ends, so the memory cap bounds the **total bytes allocated** by the invocation (list growth charges only the
//! added capacity, since the old allocation is freed).

use crate::error::TrapKind;
use crate::value::Value;
use loom_ir::Type;
use std::any::Any;
use std::sync::Arc;

/// Bytes charged per heap object on top of its payload (the entry itself), so that a loop creating empty
/// strings or lists still runs into the cap.
pub(crate) const OBJ_OVERHEAD: u64 = 32;

/// How deep a value may nest when converted to a host [`Value`].
pub(crate) const MAX_EXPORT_DEPTH: u32 = 64;

/// A trap before it is located (function, pc) by the interpreter.
#[derive(Debug)]
pub(crate) struct Fault {
    pub(crate) kind: TrapKind,
    pub(crate) msg: String,
}

impl Fault {
    #[cold]
    pub(crate) fn new(kind: TrapKind, msg: impl Into<String>) -> Fault {
        Fault {
            kind,
            msg: msg.into(),
        }
    }
}

#[cold]
pub(crate) fn internal(what: &str) -> Fault {
    Fault::new(TrapKind::Internal, format!("internal VM error: {what}"))
}

/// Buffer bytes: owned by the invocation, or shared with the host (copied on first write).
#[derive(Debug)]
pub(crate) enum Buf {
    Owned(Vec<u8>),
    Shared(Arc<Vec<u8>>),
}

pub(crate) enum Obj {
    Null,
    Buf(Buf),
    Str(Arc<str>),
    /// Elements as canonical scalar bits or handles.
    List(Vec<u64>),
    /// Made by `opaque.new`: (type id, bits or handle) per element.
    Opaque(Box<[(u32, u64)]>),
    /// From the host, or an exported `Opaque` (memoized so identity survives repeated export).
    HostOpaque(Arc<[Value]>),
    Native(Arc<str>, Arc<dyn Any + Send + Sync>),
}

#[derive(Default)]
pub(crate) struct Heap {
    pub(crate) objs: Vec<Obj>,
    pub(crate) used: u64,
    pub(crate) cap: u64,
    /// Handle of each program string constant once materialized in this invocation (0: not yet).
    pub(crate) const_strs: Vec<u32>,
    /// The host state of the running invocation (moved in and out by `interp::invoke`).
    pub(crate) host: Option<crate::native::HostState>,
}

impl std::fmt::Debug for Heap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Heap({} objects, {} bytes)", self.objs.len(), self.used)
    }
}

#[cold]
fn oom(n: u64, used: u64, cap: u64) -> Fault {
    Fault::new(
        TrapKind::OutOfMemory,
        format!(
            "allocation of {n} bytes exceeds the invocation's memory cap of {cap} bytes ({used} already allocated)"
        ),
    )
}

/// `n` zero bytes, or the out-of-memory trap when the system cannot give them (fallible, unlike `vec!`).
pub(crate) fn zeroed(n: u64) -> Result<Vec<u8>, Fault> {
    let mut v = Vec::new();
    usize::try_from(n)
        .ok()
        .and_then(|n| v.try_reserve_exact(n).ok().map(|()| n))
        .map(|n| {
            v.resize(n, 0);
            v
        })
        .ok_or_else(|| {
            Fault::new(
                TrapKind::OutOfMemory,
                format!("the system could not allocate {n} bytes for a buffer"),
            )
        })
}

/// An empty vector with room for `n` items, or the out-of-memory trap.
pub(crate) fn with_capacity<T>(n: usize) -> Result<Vec<T>, Fault> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| {
        Fault::new(
            TrapKind::OutOfMemory,
            format!("the system could not allocate room for {n} values"),
        )
    })?;
    Ok(v)
}

pub(crate) fn charge(used: &mut u64, cap: u64, n: u64) -> Result<(), Fault> {
    match used.checked_add(n) {
        Some(t) if t <= cap => {
            *used = t;
            Ok(())
        }
        _ => Err(oom(n, *used, cap)),
    }
}

impl Heap {
    pub(crate) fn new(cap: u64, n_strs: usize) -> Heap {
        let mut objs = Vec::with_capacity(64);
        objs.push(Obj::Null);
        Heap {
            objs,
            used: 0,
            cap,
            const_strs: vec![0; n_strs],
            host: None,
        }
    }

    /// Empties the heap for the next invocation (objects are dropped, the tables' capacity is kept).
    pub(crate) fn reset(&mut self, cap: u64, n_strs: usize) {
        if self.objs.len() != 1 {
            self.objs.clear();
            self.objs.push(Obj::Null);
        }
        self.used = 0;
        self.cap = cap;
        if self.const_strs.len() != n_strs {
            self.const_strs.clear();
            self.const_strs.resize(n_strs, 0);
        } else if self.const_strs.iter().any(|&h| h != 0) {
            self.const_strs.fill(0);
        }
    }

    pub(crate) fn charge(&mut self, n: u64) -> Result<(), Fault> {
        charge(&mut self.used, self.cap, n)
    }

    /// Adds an object whose payload (`bytes`) was already charged; charges the entry overhead.
    pub(crate) fn push(&mut self, o: Obj) -> Result<u32, Fault> {
        self.charge(OBJ_OVERHEAD)?;
        let h =
            u32::try_from(self.objs.len()).map_err(|_| oom(OBJ_OVERHEAD, self.used, self.cap))?;
        self.objs.push(o);
        Ok(h)
    }

    /// Charges `bytes + overhead` then builds and adds the object (so nothing is allocated over the cap).
    /// A new zeroed buffer of `n` bytes: the memory is charged first (over the cap: the out-of-memory trap),
    /// then `fuel`'s bulk cost when given (the interpreter's; JIT code charges its own), then the bytes are
    /// allocated; an allocation the system refuses is the program's out-of-memory trap, never the process's
    /// end. Nothing stays charged on failure.
    pub(crate) fn alloc_zeroed_buf(
        &mut self,
        n: u64,
        fuel: Option<&mut u64>,
    ) -> Result<u32, Fault> {
        self.charge(n.saturating_add(OBJ_OVERHEAD))?;
        self.used -= OBJ_OVERHEAD; // `push` charges it again
        if let Some(fuel) = fuel {
            if let Err(f) = crate::interp::bulk_fuel(fuel, n) {
                self.used -= n;
                return Err(f);
            }
        }
        let v = match zeroed(n) {
            Ok(v) => v,
            Err(f) => {
                self.used -= n;
                return Err(f);
            }
        };
        self.push(Obj::Buf(Buf::Owned(v)))
    }

    #[inline(always)]
    pub(crate) fn buf(&self, h: u32) -> Result<&[u8], Fault> {
        match self.objs.get(h as usize) {
            Some(Obj::Buf(Buf::Owned(v))) => Ok(v),
            Some(Obj::Buf(Buf::Shared(v))) => Ok(v),
            other => Err(wrong(other, "buffer")),
        }
    }

    /// Mutable bytes of a buffer, copying it first if it is shared with the host (copy-on-write; the copy is
    /// charged). A shared buffer nobody else holds any more is taken back without copying.
    #[inline(always)]
    pub(crate) fn buf_mut(&mut self, h: u32) -> Result<&mut [u8], Fault> {
        if let Some(Obj::Buf(Buf::Shared(_))) = self.objs.get(h as usize) {
            self.unshare(h)?;
        }
        match self.objs.get_mut(h as usize) {
            Some(Obj::Buf(Buf::Owned(v))) => Ok(v),
            other => Err(wrong(other.map(|o| &*o), "buffer")),
        }
    }

    #[cold]
    fn unshare(&mut self, h: u32) -> Result<(), Fault> {
        let Heap {
            objs, used, cap, ..
        } = self;
        let Some(Obj::Buf(b)) = objs.get_mut(h as usize) else {
            return Err(internal("unshare of a non-buffer"));
        };
        let Buf::Shared(a) = std::mem::replace(b, Buf::Owned(Vec::new())) else {
            return Ok(());
        };
        match Arc::try_unwrap(a) {
            Ok(v) => *b = Buf::Owned(v),
            Err(a) => {
                if let Err(e) = charge(used, *cap, a.len() as u64) {
                    *b = Buf::Shared(a);
                    return Err(e);
                }
                *b = Buf::Owned(a.to_vec());
            }
        }
        Ok(())
    }

    pub(crate) fn str(&self, h: u32) -> Result<&Arc<str>, Fault> {
        match self.objs.get(h as usize) {
            Some(Obj::Str(s)) => Ok(s),
            other => Err(wrong(other, "str")),
        }
    }

    pub(crate) fn list(&self, h: u32) -> Result<&Vec<u64>, Fault> {
        match self.objs.get(h as usize) {
            Some(Obj::List(l)) => Ok(l),
            other => Err(wrong(other, "list")),
        }
    }

    pub(crate) fn list_mut(&mut self, h: u32) -> Result<&mut Vec<u64>, Fault> {
        match self.objs.get_mut(h as usize) {
            Some(Obj::List(l)) => Ok(l),
            other => Err(wrong(other.map(|o| &*o), "list")),
        }
    }

    /// Brings a host value into the invocation: canonical bits for scalars, a handle for references. Host
    /// buffers are shared, not copied.
    pub(crate) fn import(&mut self, v: &Value) -> Result<u64, Fault> {
        Ok(match v {
            Value::I1(b) => *b as u64,
            Value::I32(x) => *x as u32 as u64,
            Value::I64(x) => *x as u64,
            Value::F32(x) => x.to_bits() as u64,
            Value::F64(x) => x.to_bits(),
            Value::Str(s) => self.push(Obj::Str(s.clone()))? as u64,
            Value::Buffer(b) => self.push(Obj::Buf(Buf::Shared(b.clone())))? as u64,
            Value::List(items) => {
                self.charge((items.len() as u64).saturating_mul(8))?;
                let mut out = Vec::with_capacity(items.len());
                for it in items.iter() {
                    out.push(self.import(it)?);
                }
                self.push(Obj::List(out))? as u64
            }
            Value::Opaque(o) => self.push(Obj::HostOpaque(o.clone()))? as u64,
            Value::Native { type_name, obj } => {
                self.push(Obj::Native(type_name.clone(), obj.clone()))? as u64
            }
            Value::Null(_) => 0,
        })
    }

    /// Converts a register value of type `ty` to a host value. Owned buffers become shared in place, so the
    /// invocation's later writes copy instead of mutating what the host now holds.
    pub(crate) fn export(
        &mut self,
        bits: u64,
        ty: &Type,
        types: &[Type],
        depth: u32,
    ) -> Result<Value, Fault> {
        if depth > MAX_EXPORT_DEPTH {
            return Err(Fault::new(
                TrapKind::TooDeep,
                format!("value nests more than {MAX_EXPORT_DEPTH} levels deep"),
            ));
        }
        match ty {
            Type::I1 => return Ok(Value::I1(bits & 1 != 0)),
            Type::I32 => return Ok(Value::I32(bits as i32)),
            Type::I64 => return Ok(Value::I64(bits as i64)),
            Type::F32 => return Ok(Value::F32(f32::from_bits(bits as u32))),
            Type::F64 => return Ok(Value::F64(f64::from_bits(bits))),
            _ => {}
        }
        let h = bits as usize;
        if h == 0 {
            return if ty.is_nullable() {
                Ok(Value::Null(ty.clone()))
            } else {
                Err(internal("null in a non-null register"))
            };
        }
        let obj = self
            .objs
            .get_mut(h)
            .ok_or_else(|| internal("dangling handle"))?;
        Ok(match obj {
            Obj::Null => return Err(internal("null object")),
            Obj::Buf(b) => {
                if let Buf::Owned(v) = b {
                    *b = Buf::Shared(Arc::new(std::mem::take(v)));
                }
                match b {
                    Buf::Shared(a) => Value::Buffer(a.clone()),
                    Buf::Owned(_) => return Err(internal("buffer share")),
                }
            }
            Obj::Str(s) => Value::Str(s.clone()),
            Obj::List(items) => {
                let Type::List(elem) = ty else {
                    return Err(internal("list exported as a non-list type"));
                };
                let items = items.clone();
                let mut out = Vec::with_capacity(items.len());
                for it in items {
                    out.push(self.export(it, elem, types, depth + 1)?);
                }
                Value::List(Arc::new(out))
            }
            Obj::Opaque(items) => {
                let items = items.clone();
                let mut out = Vec::with_capacity(items.len());
                for (t, it) in items.iter() {
                    let t = types.get(*t as usize).ok_or_else(|| internal("type id"))?;
                    out.push(self.export(*it, t, types, depth + 1)?);
                }
                let a: Arc<[Value]> = Arc::from(out);
                if let Some(o) = self.objs.get_mut(h) {
                    *o = Obj::HostOpaque(a.clone());
                }
                Value::Opaque(a)
            }
            Obj::HostOpaque(a) => Value::Opaque(a.clone()),
            Obj::Native(n, o) => Value::Native {
                type_name: n.clone(),
                obj: o.clone(),
            },
        })
    }
}

#[cold]
fn wrong(o: Option<&Obj>, want: &str) -> Fault {
    match o {
        Some(Obj::Null) => Fault::new(
            TrapKind::NullReference,
            format!("null reference where a {want} is expected"),
        ),
        _ => internal(&format!("register does not hold a {want}")),
    }
}
