//! A device's timelines: each a `u64` that only increases, or a failure (the first error wins; every later
//! wait or value query reports it). A point the host fails (`fail`, for host-side work that failed) fails
//! only itself: waits for it report the message, and the timeline goes on past it. Used by
//! [`Queue`](crate::Queue) and by `hal-cpu`, which runs its own queue threads, so that both answer with the
//! same texts.

use std::collections::{BTreeMap, HashMap, VecDeque};
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

/// Failed timelines remembered per device. A failed timeline is never used again (the server takes a new one),
/// so without a bound a client sending bad requests would grow the table for ever; past this many the oldest
/// failed timeline is forgotten, and a wait for one of its points reports an unknown timeline: still a
/// failure, never success.
pub const MAX_FAILED_TIMELINES: usize = 4096;

/// A device's timelines by id.
#[derive(Debug, Default)]
pub struct Timelines {
    map: HashMap<u64, Timeline>,
    /// Failed timelines, oldest first (at most [`MAX_FAILED_TIMELINES`]).
    failed: VecDeque<u64>,
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
        let Some(t) = self.map.get_mut(&point.timeline.0) else {
            return;
        };
        match result {
            Ok(()) => t.value = t.value.max(point.value),
            Err(e) => {
                if t.failure.is_some() {
                    return;
                }
                t.failure = Some(e);
                self.failed.push_back(point.timeline.0);
                while self.failed.len() > MAX_FAILED_TIMELINES {
                    if let Some(old) = self.failed.pop_front() {
                        self.map.remove(&old);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn point(t: TimelineId, value: u64) -> TimelinePoint {
        TimelinePoint { timeline: t, value }
    }

    #[test]
    fn failed_timelines_are_bounded_and_a_forgotten_one_still_fails() {
        let mut tl = Timelines::default();
        let live = tl.create(0);
        tl.retire(point(live, 1), Ok(()));
        let n = MAX_FAILED_TIMELINES as u64 + 10;
        for id in 1..=n {
            let t = tl.create(id);
            tl.retire(point(t, 1), Err(format!("failure {id}")));
        }
        // The live timeline and the newest failed ones are kept; the oldest failed ones are gone.
        assert_eq!(tl.map.len(), MAX_FAILED_TIMELINES + 1);
        assert_eq!(tl.reached(point(live, 1)), Ok(true));
        assert_eq!(
            tl.reached(point(TimelineId(n), 1)),
            Err(format!("failure {n}"))
        );
        let forgotten = tl.reached(point(TimelineId(1), 1));
        assert_eq!(forgotten, Err("unknown timeline 1".to_string()));
        // Failing an already failed timeline does not count it twice.
        tl.retire(point(TimelineId(n), 2), Err("again".into()));
        assert_eq!(tl.failed.len(), MAX_FAILED_TIMELINES);
    }
}
