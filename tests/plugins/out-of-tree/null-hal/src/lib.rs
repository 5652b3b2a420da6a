//! `null-0001`: a HAL plugin built out of tree. Host-memory buffers, copies and fills executed at submission,
//! host-signalled timelines; it compiles no stages (like IREE's null HAL). Every entry point is guarded.

use abi_stable::export_root_module;
use abi_stable::prefix_type::PrefixTypeTrait;
use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{RBoxError, RResult, RSlice, RStr, RString, RVec};
use loom_plugin_api::{
    ABI_MAJOR, ABI_MINOR, BufferId, Command, DeviceInfo, DeviceLimits, ExecutableId, HalDevice, HalDevice_TO,
    HalDeviceBox, HalDriver, HalDriver_TO, HalDriverBox, LoomPlugin, LoomPlugin_Ref, PluginKind, Probe,
    Submission, TimelineId, TimelinePoint, WaitStatus, guard, guard_probe,
};
use std::collections::HashMap;
use std::sync::Mutex;

#[export_root_module]
pub fn root_module() -> LoomPlugin_Ref {
    LoomPlugin {
        abi_major: ABI_MAJOR,
        abi_minor: ABI_MINOR,
        id: RStr::from_str("null-0001"),
        kind: PluginKind::HAL,
        probe,
        hal,
        codec: loom_plugin_api::no_codec,
        profile: loom_plugin_api::no_profile,
        hal_files: loom_plugin_api::no_hal_files,
        profile_events: loom_plugin_api::no_profile_events,
        hal_open: loom_plugin_api::no_hal_open,
    }
    .leak_into_prefix()
}

extern "C" fn probe() -> Probe {
    guard_probe(|| Probe::available(1, "null device (out-of-tree test plugin)"))
}

extern "C" fn hal() -> RResult<HalDriverBox, RBoxError> {
    guard("null driver", || Ok::<_, String>(HalDriver_TO::from_value(Driver, TD_Opaque)))
}

struct Driver;

impl HalDriver for Driver {
    fn devices(&self) -> RVec<DeviceInfo> {
        RVec::from(vec![DeviceInfo {
            name: RString::from("null device"),
            backend: RString::from("null"),
            memory_bytes: 0,
        }])
    }
    fn open(&self, index: u32) -> RResult<HalDeviceBox, RBoxError> {
        guard("open", || {
            if index != 0 {
                return Err(format!("no null device {index}"));
            }
            Ok(HalDevice_TO::from_value(Device::default(), TD_Opaque))
        })
    }
}

#[derive(Default)]
struct State {
    next: u64,
    buffers: HashMap<u64, Vec<u8>>,
    timelines: HashMap<u64, Result<u64, String>>,
}

#[derive(Default)]
struct Device(Mutex<State>);

impl Device {
    fn with<T>(&self, f: impl FnOnce(&mut State) -> Result<T, String>) -> Result<T, String> {
        let mut s = self.0.lock().map_err(|_| "poisoned".to_string())?;
        f(&mut s)
    }
}

fn run(s: &mut State, c: &Command) -> Result<(), String> {
    match c {
        Command::Copy { src, src_offset, dst, dst_offset, len } => {
            let data = s
                .buffers
                .get(&src.0)
                .and_then(|b| b.get(*src_offset as usize..(*src_offset + *len) as usize))
                .ok_or("copy source out of range")?
                .to_vec();
            let d = s.buffers.get_mut(&dst.0).ok_or("unknown copy destination")?;
            d.get_mut(*dst_offset as usize..(*dst_offset + *len) as usize)
                .ok_or("copy destination out of range")?
                .copy_from_slice(&data);
            Ok(())
        }
        Command::Fill { dst, offset, len, byte } => {
            let d = s.buffers.get_mut(&dst.0).ok_or("unknown fill destination")?;
            d.get_mut(*offset as usize..(*offset + *len) as usize)
                .ok_or("fill out of range")?
                .fill(*byte);
            Ok(())
        }
        Command::Dispatch { .. } => Err("the null HAL runs no stages".into()),
    }
}

impl HalDevice for Device {
    fn limits(&self) -> DeviceLimits {
        DeviceLimits { max_buffer_bytes: 1 << 30, max_stage_bytes: 0, parallelism: 1 }
    }
    fn alloc(&self, bytes: u64) -> RResult<BufferId, RBoxError> {
        guard("alloc", || {
            if bytes > 1 << 30 {
                return Err(format!("{bytes} bytes is over the null device's 1 GiB"));
            }
            self.with(|s| {
                s.next += 1;
                s.buffers.insert(s.next, vec![0; bytes as usize]);
                Ok(BufferId(s.next))
            })
        })
    }
    fn free(&self, buffer: BufferId) -> RResult<(), RBoxError> {
        guard("free", || self.with(|s| s.buffers.remove(&buffer.0).map(|_| ()).ok_or("unknown buffer".into())))
    }
    fn write(&self, buffer: BufferId, offset: u64, data: RSlice<'_, u8>) -> RResult<(), RBoxError> {
        guard("write", || {
            self.with(|s| {
                let b = s.buffers.get_mut(&buffer.0).ok_or("unknown buffer")?;
                b.get_mut(offset as usize..offset as usize + data.len())
                    .ok_or("write out of range")?
                    .copy_from_slice(data.as_slice());
                Ok(())
            })
        })
    }
    fn read(&self, buffer: BufferId, offset: u64, len: u64) -> RResult<RVec<u8>, RBoxError> {
        guard("read", || {
            self.with(|s| {
                let b = s.buffers.get(&buffer.0).ok_or("unknown buffer")?;
                Ok(RVec::from(b.get(offset as usize..(offset + len) as usize).ok_or("read out of range")?.to_vec()))
            })
        })
    }
    fn compile(&self, _stage: RSlice<'_, u8>) -> RResult<ExecutableId, RBoxError> {
        guard("compile", || Err::<ExecutableId, _>("the null HAL compiles no stages"))
    }
    fn submit(&self, sub: Submission) -> RResult<(), RBoxError> {
        guard("submit", || {
            self.with(|s| {
                let mut failed = None;
                for w in sub.wait.iter() {
                    match s.timelines.get(&w.timeline.0) {
                        Some(Ok(v)) if *v >= w.value => {}
                        Some(Err(e)) => failed = Some(e.clone()),
                        _ => return Err("a wait point is not reached (the null HAL runs at submission)".into()),
                    }
                }
                let r = match failed {
                    Some(e) => Err(e),
                    None => sub.commands.iter().try_for_each(|c| run(s, c)),
                };
                let t = s.timelines.entry(sub.signal.timeline.0).or_insert(Ok(0));
                *t = match r {
                    Ok(()) => Ok(sub.signal.value),
                    Err(e) => Err(e),
                };
                Ok(())
            })
        })
    }
    fn timeline_create(&self) -> RResult<TimelineId, RBoxError> {
        guard("timeline_create", || {
            self.with(|s| {
                s.next += 1;
                s.timelines.insert(s.next, Ok(0));
                Ok(TimelineId(s.next))
            })
        })
    }
    fn timeline_value(&self, t: TimelineId) -> RResult<u64, RBoxError> {
        guard("timeline_value", || self.with(|s| s.timelines.get(&t.0).cloned().unwrap_or(Err("unknown timeline".into()))))
    }
    fn timeline_signal(&self, p: TimelinePoint) -> RResult<(), RBoxError> {
        guard("timeline_signal", || {
            self.with(|s| {
                s.timelines.insert(p.timeline.0, Ok(p.value));
                Ok(())
            })
        })
    }
    fn timeline_wait(&self, p: TimelinePoint, _timeout_ns: u64) -> RResult<WaitStatus, RBoxError> {
        guard("timeline_wait", || {
            self.with(|s| match s.timelines.get(&p.timeline.0) {
                Some(Ok(v)) if *v >= p.value => Ok(WaitStatus::Reached),
                Some(Err(e)) => Err(e.clone()),
                _ => Ok(WaitStatus::TimedOut),
            })
        })
    }
}
