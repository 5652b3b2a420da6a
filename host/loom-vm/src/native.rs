//! Native modules: typed host functions a program reaches through capability imports.

use crate::error::NativeError;
use crate::value::Value;
use loom_ir::Signature;
use std::any::Any;
use std::fmt;
use std::sync::Arc;

/// Host state an invocation carries to the native functions it calls (see [`crate::Loaded::invoke_hosted`]):
/// the host moves it in when the invocation starts and gets it back when it ends.
pub type HostState = Box<dyn Any + Send>;

/// The signature of a native function body.
pub type NativeFnBody =
    dyn Fn(&mut NativeCtx<'_>, &[Value]) -> Result<Vec<Value>, NativeError> + Send + Sync;

/// What a native function sees of the invocation calling it.
#[derive(Debug)]
pub struct NativeCtx<'a> {
    pub(crate) mem_used: &'a mut u64,
    pub(crate) mem_cap: u64,
    pub(crate) fuel_left: &'a mut u64,
    pub(crate) host: &'a mut Option<HostState>,
}

impl NativeCtx<'_> {
    /// Accounts `bytes` against the invocation's memory cap. Call it *before* allocating anything whose size
    /// the program controls; on error, do not allocate and return the error.
    pub fn alloc(&mut self, bytes: u64) -> Result<(), NativeError> {
        match self.mem_used.checked_add(bytes) {
            Some(n) if n <= self.mem_cap => {
                *self.mem_used = n;
                Ok(())
            }
            _ => Err(NativeError::OutOfMemory(format!(
                "native allocation of {bytes} bytes exceeds the invocation's memory cap of {} bytes ({} in use)",
                self.mem_cap, self.mem_used
            ))),
        }
    }
    /// Bytes accounted so far in this invocation.
    pub fn memory_used(&self) -> u64 {
        *self.mem_used
    }
    /// The invocation's memory cap.
    pub fn memory_cap(&self) -> u64 {
        self.mem_cap
    }
    /// Fuel left after this call's declared cost was charged.
    pub fn fuel_left(&self) -> u64 {
        *self.fuel_left
    }
    /// The host state of the invocation, if the host gave one of type `T` (see [`crate::Loaded::invoke_hosted`]).
    pub fn host<T: Any>(&mut self) -> Option<&mut T> {
        self.host.as_mut().and_then(|h| h.downcast_mut::<T>())
    }
    /// Charges extra fuel for data-dependent work (e.g. per input byte).
    pub fn charge_fuel(&mut self, fuel: u64) -> Result<(), NativeError> {
        if *self.fuel_left < fuel {
            *self.fuel_left = 0;
            return Err(NativeError::OutOfFuel);
        }
        *self.fuel_left -= fuel;
        Ok(())
    }
}

/// One function of a native module.
#[derive(Clone)]
pub struct NativeFunc {
    pub name: String,
    pub sig: Signature,
    /// Fuel charged per call, before the body runs.
    pub fuel_cost: u64,
    pub(crate) body: Arc<NativeFnBody>,
}

impl fmt::Debug for NativeFunc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NativeFunc")
            .field("name", &self.name)
            .field("sig", &crate::error::sig_text(&self.sig))
            .field("fuel_cost", &self.fuel_cost)
            .finish()
    }
}

/// A named set of native functions, registered by the host and bound to a program's imports at load.
///
/// ```ignore
/// let m = NativeModule::new("input").func("encode", sig, 100, |ctx, args| { ... });
/// ```
#[derive(Clone, Debug)]
pub struct NativeModule {
    pub name: String,
    pub funcs: Vec<NativeFunc>,
}

impl NativeModule {
    pub fn new(name: &str) -> Self {
        NativeModule {
            name: name.to_string(),
            funcs: Vec::new(),
        }
    }

    /// Adds function `name`. The VM checks argument and result types against `sig` at runtime: a body that
    /// returns values of other types traps the invocation instead of corrupting it.
    pub fn func<F>(mut self, name: &str, sig: Signature, fuel_cost: u64, body: F) -> Self
    where
        F: Fn(&mut NativeCtx<'_>, &[Value]) -> Result<Vec<Value>, NativeError>
            + Send
            + Sync
            + 'static,
    {
        self.funcs.retain(|f| f.name != name);
        self.funcs.push(NativeFunc {
            name: name.to_string(),
            sig,
            fuel_cost,
            body: Arc::new(body),
        });
        self
    }

    pub fn get(&self, name: &str) -> Option<&NativeFunc> {
        self.funcs.iter().find(|f| f.name == name)
    }
}
