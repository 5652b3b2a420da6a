//! The model registry: names -> running services (one per model, of whichever contract its package names),
//! with Triton's re-registration rule. The registry knows no contract: it prepares a package under the
//! contracts it was given ([`Contracts`]) and asks the model's contract to start its service.
//!
//! # Protocol
//!
//! * `register` marks the slot *preparing* and prepares without holding the registry lock, so every other
//!   model keeps serving (and the old version of this one, if any).
//! * On success the new service replaces the old one atomically; the old one is drained (its accepted work
//!   retires) and dropped, which releases its device memory.
//! * On failure a previous version keeps serving (its slot records the failed attempt's error); a first
//!   registration becomes *failed* with the error, visible in the model list, and holds no device memory.
//! * A re-registration whose package serves another contract or role than the serving version is refused
//!   ([`Error::RoleChanged`]) unless the caller says to replace it ([`Registry::register_replacing`]).
//! * `unregister` removes the name first (new requests get 404), then drains accepted work, then drops the
//!   model.

use crate::contract::{Contracts, Service};
use crate::device::Devices;
use crate::model::{self, Model, Overrides};
use crate::package::{OperatorLimits, PackageFiles, check_model_name};
use crate::progress::{Phase as ProgressPhase, Progress, Snapshot};
use crate::{Error, Result};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// A model's lifecycle state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Preparing,
    Ready,
    Failed,
    /// Compiled code kept, parameters released; `activate` streams them again.
    Deactivated,
}

impl Status {
    pub fn name(self) -> &'static str {
        match self {
            Status::Preparing => "preparing",
            Status::Ready => "ready",
            Status::Failed => "failed",
            Status::Deactivated => "deactivated",
        }
    }
}

#[derive(Debug)]
struct Slot {
    status: Status,
    service: Option<Arc<dyn Service>>,
    /// A deactivated model: compiled stages kept, parameters released.
    parked: Option<Arc<Model>>,
    /// What its service kept across the deactivation (retained sessions), for the next activation.
    kept: Option<crate::contract::KeptState>,
    error: Option<String>,
    /// Where the serving version came from (for a model that never became ready: the latest attempt).
    source: String,
    /// Where the latest registration attempt came from, while it prepares or after it failed beside a serving
    /// version.
    attempt: Option<String>,
    /// The latest preparation's (registration's or activation's) progress.
    progress: Arc<Progress>,
}

/// What the model list shows.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    pub name: String,
    pub status: Status,
    pub contract: String,
    pub role: String,
    pub device: String,
    /// Where the serving version came from.
    pub source: String,
    /// The latest error (a failed registration or activation); a failed re-registration's beside a serving
    /// version.
    pub error: Option<String>,
    /// Where a failed re-registration (the one `error` is about) came from, while the old version serves.
    pub failed_source: Option<String>,
    pub device_bytes: u64,
    /// The device capacity reserved for it ([`crate::device::Budget::reserved_bytes`]).
    pub reserved_bytes: u64,
    pub stages: usize,
}

/// Every registered model.
#[derive(Debug)]
pub struct Registry {
    pub devices: Arc<Devices>,
    pub contracts: Contracts,
    /// What the operator allows packages.
    pub limits: OperatorLimits,
    /// Shared with the models' [`Peers`] lookups (which hold it weakly).
    slots: Arc<Mutex<BTreeMap<String, Slot>>>,
}

impl Registry {
    pub fn new(devices: Arc<Devices>, contracts: Contracts) -> Registry {
        Registry {
            devices,
            contracts,
            limits: OperatorLimits::default(),
            slots: Arc::new(Mutex::new(BTreeMap::new())),
        }
    }

    /// With the operator's `limits` instead of the defaults.
    pub fn with_limits(mut self, limits: OperatorLimits) -> Registry {
        self.limits = limits;
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Slot>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The lookup a model uses to find another registered model's service (a finite consumer's upstream):
    /// [`Registry::service`] without holding the registry alive.
    fn peers(&self) -> crate::contract::Peers {
        let slots = Arc::downgrade(&self.slots);
        Arc::new(move |name: &str| {
            let slots = slots
                .upgrade()
                .ok_or_else(|| Error::UnknownModel(name.to_string()))?;
            let slots = slots.lock().unwrap_or_else(|p| p.into_inner());
            serving(&slots, name)
        })
    }

    /// Prepares `files` as model `name` (blocking: call it from a worker thread). A re-registration that
    /// would change what `name` serves is refused ([`Registry::register_replacing`]).
    pub fn register(
        &self,
        name: &str,
        files: PackageFiles,
        overrides: Overrides,
    ) -> Result<ModelInfo> {
        self.register_replacing(name, files, overrides, false)
    }

    /// [`Registry::register`]; a re-registration of a serving model whose package names another contract or
    /// role is refused with [`Error::RoleChanged`] unless `replace` (clients of the old role would silently
    /// be served by a model of another kind).
    pub fn register_replacing(
        &self,
        name: &str,
        files: PackageFiles,
        overrides: Overrides,
        replace: bool,
    ) -> Result<ModelInfo> {
        check_model_name(name).map_err(Error::BadRequest)?;
        // What the new package says it serves; a model.json that cannot be read is preparation's to report.
        let serves = (!replace)
            .then(|| declared_role(&files, overrides.manifest_file()))
            .flatten();
        let progress = Arc::new(Progress::new());
        {
            let mut slots = self.lock();
            if let (Some((contract, role)), Some(slot)) = (&serves, slots.get(name)) {
                if let Some(m) = slot.service.as_ref().map(|s| s.model()) {
                    if (&m.doc.contract, &m.doc.role) != (contract, role) {
                        return Err(Error::RoleChanged(format!(
                            "model `{name}` serves {} ({}); the new package serves {role} ({contract}): \
                             unregister it first or register with \"replace\": true",
                            m.doc.role, m.doc.contract
                        )));
                    }
                }
            }
            match slots.get_mut(name) {
                Some(s) if s.status == Status::Preparing => {
                    return Err(Error::Overloaded(format!(
                        "model `{name}` is already being prepared"
                    )));
                }
                Some(s) if s.status == Status::Deactivated => {
                    return Err(Error::NotReady {
                        name: name.to_string(),
                        status: "deactivated (activate or unregister it first)".into(),
                    });
                }
                Some(s) => {
                    s.status = Status::Preparing;
                    if s.service.is_some() {
                        s.attempt = Some(files.describe());
                    } else {
                        s.source = files.describe();
                        s.attempt = None;
                    }
                    s.progress = progress.clone();
                }
                None => {
                    slots.insert(
                        name.to_string(),
                        Slot {
                            status: Status::Preparing,
                            service: None,
                            parked: None,
                            kept: None,
                            error: None,
                            source: files.describe(),
                            attempt: None,
                            progress: progress.clone(),
                        },
                    );
                }
            }
        }
        log::info!("model {name}: preparing from {}", files.describe());
        let devices = self.devices.clone();
        let r = model::prepare(
            name,
            &files,
            &overrides,
            &self.contracts,
            &self.limits,
            |prefs| devices.select(prefs),
            progress.clone(),
        )
        .and_then(|m| {
            let m = Arc::new(m);
            m.set_peers(self.peers());
            m.contract.clone().start(m)
        });
        let mut slots = self.lock();
        let Some(slot) = slots.get_mut(name) else {
            // Unregistered while preparing: the new model is dropped.
            return Err(Error::UnknownModel(name.to_string()));
        };
        match r {
            Ok(svc) => {
                let m = svc.model();
                log::info!(
                    "model {name}: ready on {} ({} stage(s), {} parameter bytes, compiled in {:?}, prepared in {:?})",
                    m.device.name,
                    m.report.stages,
                    m.report.parameter_bytes,
                    m.report.compile_time,
                    m.report.total_time
                );
                progress.phase(ProgressPhase::Ready);
                let old = slot.service.replace(svc);
                slot.status = Status::Ready;
                slot.error = None;
                if let Some(a) = slot.attempt.take() {
                    slot.source = a;
                }
                let info = info(name, slot);
                drop(slots);
                if let Some(old) = old {
                    old.drain();
                }
                Ok(info)
            }
            Err(e) => {
                log::warn!("model {name}: preparation failed: {e}");
                progress.failed(e.to_string());
                slot.error = Some(e.to_string());
                slot.status = if slot.service.is_some() {
                    Status::Ready
                } else {
                    Status::Failed
                };
                Err(e)
            }
        }
    }

    /// Removes `name`, draining its accepted work first.
    pub fn unregister(&self, name: &str) -> Result<()> {
        let slot = self
            .lock()
            .remove(name)
            .ok_or_else(|| Error::UnknownModel(name.to_string()))?;
        if let Some(svc) = slot.service {
            svc.drain();
            log::info!("model {name}: unregistered");
        }
        Ok(())
    }

    /// Drains `name`'s accepted work, then releases its parameters; its compiled stages stay.
    pub fn deactivate(&self, name: &str) -> Result<ModelInfo> {
        let svc = {
            let mut slots = self.lock();
            let slot = slots
                .get_mut(name)
                .ok_or_else(|| Error::UnknownModel(name.to_string()))?;
            if slot.status != Status::Ready {
                return Err(Error::NotReady {
                    name: name.to_string(),
                    status: slot.status.name().to_string(),
                });
            }
            slot.status = Status::Preparing;
            slot.service.take()
        };
        let svc = svc.ok_or_else(|| Error::Internal("a ready model without a service".into()))?;
        svc.drain();
        let kept = svc.kept_state();
        let model = svc.model().clone();
        model.deactivate();
        // The service (its pools and kept device buffers) goes first, then the reservation shrinks to what
        // the model still holds: the rest of its share of the device is free for other models meanwhile.
        drop(svc);
        let reserved = model.budget.trim();
        log::info!(
            "model {name}: deactivated ({} device bytes held, {reserved} reserved)",
            model.device_bytes()
        );
        let mut slots = self.lock();
        let slot = slots
            .get_mut(name)
            .ok_or_else(|| Error::UnknownModel(name.to_string()))?;
        slot.parked = Some(model);
        slot.kept = kept;
        slot.status = Status::Deactivated;
        Ok(info(name, slot))
    }

    /// Streams a deactivated model's parameters again and serves it.
    pub fn activate(&self, name: &str) -> Result<ModelInfo> {
        let progress = Arc::new(Progress::new());
        let (model, mut kept) = {
            let mut slots = self.lock();
            let slot = slots
                .get_mut(name)
                .ok_or_else(|| Error::UnknownModel(name.to_string()))?;
            if slot.status != Status::Deactivated {
                return Err(Error::BadRequest(format!(
                    "model `{name}` is {}, not deactivated",
                    slot.status.name()
                )));
            }
            slot.status = Status::Preparing;
            slot.progress = progress.clone();
            (slot.parked.take(), slot.kept.take())
        };
        let model =
            model.ok_or_else(|| Error::Internal("a deactivated model without a model".into()))?;
        // The kept state stays with the parked model when the parameters cannot be placed again (a later
        // activation may succeed); once handed to `resume`, it is the new service's.
        // The whole budget is reserved again first (refused, naming the holders, when other models were
        // placed in the share it gave back).
        let r = model
            .budget
            .restore()
            .and_then(|()| model.activate_params(progress.clone()))
            .and_then(|()| match kept.take() {
                Some(k) => model.contract.clone().resume(model.clone(), k),
                None => model.contract.clone().start(model.clone()),
            });
        let mut slots = self.lock();
        let slot = slots
            .get_mut(name)
            .ok_or_else(|| Error::UnknownModel(name.to_string()))?;
        match r {
            Ok(svc) => {
                log::info!(
                    "model {name}: activated ({} device bytes)",
                    model.device_bytes()
                );
                progress.phase(ProgressPhase::Ready);
                slot.service = Some(svc);
                slot.status = Status::Ready;
                slot.error = None;
                Ok(info(name, slot))
            }
            Err(e) => {
                progress.failed(e.to_string());
                // Nothing stays resident (activate_params released what it placed; a service that did not
                // start leaves its parameters too), and the share is given back again.
                model.deactivate();
                model.budget.trim();
                slot.parked = Some(model);
                slot.kept = kept;
                slot.status = Status::Deactivated;
                slot.error = Some(e.to_string());
                Err(e)
            }
        }
    }

    /// The serving model `name` (the routes of its contract downcast it with [`Service::as_any`]).
    pub fn service(&self, name: &str) -> Result<Arc<dyn Service>> {
        serving(&self.lock(), name)
    }

    pub fn list(&self) -> Vec<ModelInfo> {
        self.lock().iter().map(|(n, s)| info(n, s)).collect()
    }

    /// `name`'s status and its latest preparation's progress.
    pub fn progress(&self, name: &str) -> Option<(Status, Snapshot)> {
        self.lock()
            .get(name)
            .map(|s| (s.status, s.progress.snapshot()))
    }

    pub fn get(&self, name: &str) -> Option<ModelInfo> {
        self.lock().get(name).map(|s| info(name, s))
    }

    /// Every serving model (for metrics).
    pub fn services(&self) -> Vec<Arc<dyn Service>> {
        self.lock()
            .values()
            .filter_map(|s| s.service.clone())
            .collect()
    }

    /// Drains every model (graceful shutdown).
    pub fn drain_all(&self) {
        for s in self.services() {
            s.drain();
        }
    }
}

/// The `contract` and `role` a package's manifest (`model.json` or the registration's) declares, if it can be read.
fn declared_role(files: &PackageFiles, manifest: &str) -> Option<(String, String)> {
    let bytes = files.read(manifest).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let field = |k: &str| {
        v.get(k)
            .and_then(serde_json::Value::as_str)
            .map(str::to_string)
    };
    Some((field("contract")?, field("role")?))
}

/// The serving service of `name` in `slots`: unknown, or not ready (with its status), is the error.
fn serving(slots: &BTreeMap<String, Slot>, name: &str) -> Result<Arc<dyn Service>> {
    let slot = slots
        .get(name)
        .ok_or_else(|| Error::UnknownModel(name.to_string()))?;
    slot.service.clone().ok_or_else(|| Error::NotReady {
        name: name.to_string(),
        status: slot.status.name().to_string(),
    })
}

fn info(name: &str, s: &Slot) -> ModelInfo {
    let m = s
        .service
        .as_ref()
        .map(|svc| svc.model())
        .or(s.parked.as_ref());
    ModelInfo {
        name: name.to_string(),
        status: s.status,
        contract: m.map(|m| m.doc.contract.clone()).unwrap_or_default(),
        role: m.map(|m| m.doc.role.clone()).unwrap_or_default(),
        device: m.map(|m| m.device.name.clone()).unwrap_or_default(),
        source: s.source.clone(),
        error: s.error.clone(),
        failed_source: s
            .attempt
            .clone()
            .filter(|_| s.status != Status::Preparing && s.error.is_some()),
        device_bytes: m.map(|m| m.device_bytes()).unwrap_or(0),
        reserved_bytes: m.map(|m| m.budget.reserved_bytes()).unwrap_or(0),
        stages: m.map(|m| m.stages.len()).unwrap_or(0),
    }
}
