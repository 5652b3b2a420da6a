//! ABI 1.5: run-time bounds of dispatches and executables released, the HAL capability behind issue 14's
//! kernel budget, cancellation and code freed on unregister.
//!
//! # Why a separate object
//!
//! As for [`crate::HalFiles`]: [`crate::HalDevice`] cannot grow a method without making abi_stable refuse every
//! HAL plugin built before. So the capability is its own trait object, [`HalControl`], handed out with the
//! device (and its file reads) by the root-module field appended in 1.5, [`crate::LoomPlugin::hal_open`]. A
//! plugin built before 1.5 has no such field and loads as before: its dispatches run **without** a step budget
//! and cannot be cancelled while they run, and its executables live as long as the device (the host says so in
//! the device's start-up line). A 1.5 plugin without the capability puts [`no_hal_open`] in the field; one that
//! opens devices with it but not all answers [`HalDeviceParts::control`] `RNone` for the others.
//!
//! # Bounds
//!
//! [`HalControl::submit_bounded`] is [`crate::HalDevice::submit`] with [`DispatchBounds`] applied to every
//! dispatch of the submission:
//!
//! * **steps**: the budget of each dispatch (0: none). A dispatch of `G` program instances under `B` steps
//!   fails before it runs when `G > B`; otherwise each instance may run `B / G - 1` iterations of the kernel's
//!   `for` loops in all (`loom_ir::kernel::instance_allowance`). Exceeding it fails the signal point with the
//!   kernel contract's text `kernel `K` of stage `S` exceeded its budget of B steps`;
//! * **cancel**: a flag made by [`HalControl::cancel_create`] ([`CancelId`], 0: none). Once
//!   [`HalControl::cancel_signal`] has set it, every dispatch carrying it stops at its next program instance or
//!   loop iteration (a GPU at its next back-edge check; a dispatch not yet started does not start) and fails
//!   its point with `kernel `K` of stage `S` was cancelled`. The flag lives until
//!   [`HalControl::cancel_destroy`] and the retirement of the last submission that carries it.
//!
//! # Releasing executables
//!
//! [`HalControl::release`] ends an executable's id (later submissions naming it are refused); its code is
//! freed when the last accepted submission that uses it retires.
//!
//! # Failed readiness
//!
//! [`HalControl::timeline_fail`] is [`crate::HalDevice::timeline_signal`]'s failing twin: host-side work that
//! a point stands for (the server's checkpoint gathers) failed, so the point fails instead of being reached,
//! and everything waiting on it fails with the message rather than running on buffers nobody filled.

use crate::{ExecutableId, HalDeviceBox, HalFilesBox, Submission, TimelinePoint, error};
use abi_stable::StableAbi;
use abi_stable::sabi_trait;
use abi_stable::std_types::{RBox, RBoxError, ROption, RResult, RString};

/// A cancellation flag of one device (0 is "none").
#[repr(transparent)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CancelId(pub u64);

/// The bounds [`HalControl::submit_bounded`] applies to each dispatch of a submission.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq)]
pub struct DispatchBounds {
    /// Each dispatch's step budget (see the module doc); 0: none.
    pub steps: u64,
    /// The cancellation flag the dispatches watch; `CancelId(0)`: none.
    pub cancel: CancelId,
}

/// What [`crate::LoomPlugin::hal_open`] returns: a device with its optional capabilities.
#[repr(C)]
#[derive(StableAbi)]
pub struct HalDeviceParts {
    /// The device.
    pub device: HalDeviceBox,
    /// Its queued file reads (ABI 1.3), when it has them.
    pub files: ROption<HalFilesBox>,
    /// Its run-time bounds and executable release (ABI 1.5), when it has them.
    pub control: ROption<HalControlBox>,
}

/// A device's control as it crosses the boundary.
pub type HalControlBox = HalControl_TO<'static, RBox<()>>;

/// Run-time bounds, cancellation and executable release of one open device (ABI 1.5; see the module doc).
#[sabi_trait]
pub trait HalControl: Send + Sync {
    /// Ends `exe`'s id; its code is freed when the last accepted submission that uses it retires.
    fn release(&self, exe: ExecutableId) -> RResult<(), RBoxError>;

    /// A new, unset cancellation flag.
    fn cancel_create(&self) -> RResult<CancelId, RBoxError>;

    /// Sets the flag: dispatches carrying it stop (see the module doc). Setting it again is harmless.
    fn cancel_signal(&self, cancel: CancelId) -> RResult<(), RBoxError>;

    /// Ends the flag's id (submissions that carry it keep it until they retire).
    fn cancel_destroy(&self, cancel: CancelId) -> RResult<(), RBoxError>;

    /// [`crate::HalDevice::submit`] with `bounds` applied to each of its dispatches.
    fn submit_bounded(
        &self,
        submission: Submission,
        bounds: DispatchBounds,
    ) -> RResult<(), RBoxError>;

    /// Fails `point` with `message`: the timeline advances to it as [`crate::HalDevice::timeline_signal`]
    /// would, but every wait for exactly this point, and every submission waiting on it, fails with the
    /// message (later points of the timeline are not affected). How a host reports that work it did on the
    /// host side for the point (a read, a transfer) failed, so that dependents never run on what it did not
    /// produce. An error when `point` is already reached.
    #[sabi(last_prefix_field)]
    fn timeline_fail(&self, point: TimelinePoint, message: RString) -> RResult<(), RBoxError>;
}

/// What a 1.5 plugin without [`HalControl`] (and every codec and profile plugin) puts in
/// [`crate::LoomPlugin::hal_open`].
pub extern "C" fn no_hal_open(_index: u32) -> RResult<HalDeviceParts, RBoxError> {
    RResult::RErr(error(NO_HAL_OPEN))
}

/// The error text of [`no_hal_open`].
pub const NO_HAL_OPEN: &str = "this plugin has no device control (ABI 1.5)";

impl std::fmt::Debug for HalDeviceParts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HalDeviceParts")
            .field("files", &self.files.is_some())
            .field("control", &self.control.is_some())
            .finish_non_exhaustive()
    }
}
