//! A device's timelines: each a `u64` that only increases, or a failure (the first error wins; every later
//! wait or value query reports it). A point the host fails (`fail`, for host-side work that failed) fails
//! only itself: waits for it report the message, and the timeline goes on past it. Used by
//! [`Queue`](crate::Queue) and by `hal-cpu`, which runs its own queue threads, so that both answer with the
//! same texts.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Condvar, MutexGuard};
use std::time::Instant;

use loom_plugin_api::{TimelineId, TimelinePoint, WaitStatus};

#[derive(Debug, Default)]
struct Timeline {
    value: u64,
    failure: Option<String>,
    /// Points the host failed (at most [`MAX_FAILED_POINTS`], the oldest forgotten first).
    failed_points: BTreeMap<u64, String>,
}

/// Failed points remembered per timeline: a wait for one comes from work submitted around its failure, long
/// before this many later failures.
pub const MAX_FAILED_POINTS: usize = 4096;

/// A device's timelines by id.
#[derive(Debug, Default)]
pub struct Timelines {
    map: HashMap<u64, Timeline>,
}

impl Timelines {
    /// Creates timeline `id` at value 0 (the caller picks the ids).
    pub fn create(&mut self, id: u64) -> TimelineId {
        self.map.insert(id, Timeline::default());
        TimelineId(id)
    }

    fn get(&self, id: TimelineId) -> Result<&Timeline, String> {
        self.map
            .get(&id.0)
            .ok_or_else(|| format!("unknown timeline {}", id.0))
    }

    /// Checks that every timeline of `points` exists (submissions are checked when accepted).
    pub fn check<'a>(
        &self,
        points: impl IntoIterator<Item = &'a TimelinePoint>,
    ) -> Result<(), String> {
        for p in points {
            self.get(p.timeline)?;
        }
        Ok(())
    }

    /// Whether `point` is reached (`Ok(false)`: not yet); its timeline's failure, or an unknown timeline, is
    /// the error.
    pub fn reached(&self, point: TimelinePoint) -> Result<bool, String> {
        let t = self.get(point.timeline)?;
        if let Some(m) = t.failed_points.get(&point.value) {
            return Err(m.clone());
        }
        if t.value >= point.value {
            return Ok(true);
        }
        match &t.failure {
            Some(f) => Err(f.clone()),
            None => Ok(false),
        }
    }

    /// Whether waiting for `point` would return at once: it is reached or its timeline failed.
    pub fn settled(&self, point: TimelinePoint) -> bool {
        self.map
            .get(&point.timeline.0)
            .is_some_and(|t| t.value >= point.value || t.failure.is_some())
    }

    /// Advances (`Ok`) or fails (`Err`, unless already failed) the timeline of `point`, the job signalling it
    /// having finished; an unknown timeline is ignored.
    pub fn retire(&mut self, point: TimelinePoint, result: Result<(), String>) {
        if let Some(t) = self.map.get_mut(&point.timeline.0) {
            match result {
                Ok(()) => t.value = t.value.max(point.value),
                Err(e) => {
                    if t.failure.is_none() {
                        t.failure = Some(e);
                    }
                }
            }
        }
    }

    /// The timeline's value, or its failure.
    pub fn value(&self, timeline: TimelineId) -> Result<u64, String> {
        let t = self.get(timeline)?;
        match &t.failure {
            Some(f) => Err(f.clone()),
            None => Ok(t.value),
        }
    }

    /// Fails `point` from the host: the timeline advances to it (as a signal does), but waits for exactly
    /// this point report `message`; later points are unaffected. The point must not be reached yet. The caller
    /// notifies the waiters.
    pub fn fail(&mut self, point: TimelinePoint, message: String) -> Result<(), String> {
        let t = self
            .map
            .get_mut(&point.timeline.0)
            .ok_or_else(|| format!("unknown timeline {}", point.timeline.0))?;
        if let Some(f) = &t.failure {
            return Err(f.clone());
        }
        if point.value <= t.value {
            return Err(format!(
                "timeline_fail: point {} is already reached (the timeline is at {})",
                point.value, t.value
            ));
        }
        t.value = point.value;
        t.failed_points.insert(point.value, message);
        while t.failed_points.len() > MAX_FAILED_POINTS {
            t.failed_points.pop_first();
        }
        Ok(())
    }

    /// Signals a point from the host (the value must increase); the caller notifies the waiters.
    pub fn signal(&mut self, point: TimelinePoint) -> Result<(), String> {
        let t = self
            .map
            .get_mut(&point.timeline.0)
            .ok_or_else(|| format!("unknown timeline {}", point.timeline.0))?;
        if let Some(f) = &t.failure {
            return Err(f.clone());
        }
        if point.value <= t.value {
            return Err(format!(
                "timeline_signal: value {} is not above the current {}",
                point.value, t.value
            ));
        }
        t.value = point.value;
        Ok(())
    }
}

/// Blocks until `point` is reached, fails, the device closes, or `deadline` passes. `st` is the locked device
/// state, `view` gives its timelines and whether the device is closed, and `changed` is notified whenever a
/// timeline advances or fails, and on close.
pub fn wait_point<S>(
    changed: &Condvar,
    mut st: MutexGuard<'_, S>,
    view: impl Fn(&S) -> (&Timelines, bool),
    point: TimelinePoint,
    deadline: Option<Instant>,
) -> Result<WaitStatus, String> {
    loop {
        let (timelines, closed) = view(&st);
        if timelines.reached(point)? {
            return Ok(WaitStatus::Reached);
        }
        if closed {
            return Err("the device was closed".into());
        }
        st = match deadline {
            None => changed.wait(st).unwrap_or_else(|e| e.into_inner()),
            Some(d) => {
                let now = Instant::now();
                if now >= d {
                    return Ok(WaitStatus::TimedOut);
                }
                changed
                    .wait_timeout(st, d - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0
            }
        };
    }
}
