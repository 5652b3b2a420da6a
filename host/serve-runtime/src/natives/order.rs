//! The dependency graph of one invocation's device work.
//!
//! A submission (`runner.execute_N`) waits on exactly:
//!
//! * the points the invocation joined so far (`runner.join`, sticky), and
//! * the buffer hazards of its arguments within the invocation: the last writer of every buffer it reads
//!   (read after write), and the last writer and every reader since of every buffer it writes (write after
//!   write, write after read). A `parameters.gather` is the writer of its target.
//!
//! Nothing else orders it: two stages that share no written buffer and no fence are independent. The
//! invocation's submissions form **chains**, one timeline each: a submission goes on the chain whose last
//! point it depends on (the device runs a timeline's work in order, so that wait is implied), else on a chain
//! with nothing submitted yet, else on a new chain (at most [`MAX_CHAINS`]; past that, on the first chain it
//! depends on, or the first). Independent stages therefore run side by side on a device that runs timelines
//! side by side (the CPU device: one lane per timeline), and a failure reaches only the work that waits on it.
//!
//! Reads by `runner.feedback` happen when the invocation's work is collected, after every submission: a
//! buffer given to it may not be written by a later submission of the invocation (that write would land
//! before the read).

use crate::device::{Device, TimelineId, TimelinePoint};
use loom_plugin_api::BufferId;
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// The most chains (timelines) one invocation submits on.
pub const MAX_CHAINS: usize = 4;

/// A model's work timelines: idle ones with their last signalled values, and how many it holds in all. An
/// invocation takes one for its first chain and more for further chains; settling gives back those whose
/// work succeeded. A failed timeline reports its failure to every later wait, so it is dropped, and the
/// failure reaches no other invocation.
#[derive(Debug, Default)]
pub struct TimelinePool {
    idle: Mutex<Vec<(TimelineId, u64)>>,
    held: AtomicU64,
}

impl TimelinePool {
    /// An idle timeline, or a new one of `device`.
    pub fn take(&self, device: &Device) -> Result<(TimelineId, u64), crate::Error> {
        if let Some(t) = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop() {
            return Ok(t);
        }
        let t = device.timeline()?;
        self.held.fetch_add(1, Ordering::Relaxed);
        Ok((t, 0))
    }

    /// Gives back timelines whose work is done and succeeded.
    pub fn give_back(&self, timelines: impl IntoIterator<Item = (TimelineId, u64)>) {
        self.idle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(timelines);
    }

    /// Forgets `n` timelines that failed (or whose work never finished).
    pub fn drop_failed(&self, n: usize) {
        self.held.fetch_sub(n as u64, Ordering::Relaxed);
    }

    /// The timelines the model holds (idle and in use).
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }
}

/// A model's idle command workspace: sets of reflected workspace buffers that dispatches used, each kept with
/// the point of its last use, so the next dispatch of a stage with the same workspace sizes takes a set whose
/// work has retired (queue order) instead of allocating. At most `cap` bytes are kept idle (the oldest sets go
/// first); [`WorkspacePool::clear`] releases them all (deactivation). The pooled buffers stay charged to the
/// model's budget.
#[derive(Debug)]
pub struct WorkspacePool {
    idle: Mutex<std::collections::VecDeque<(Vec<crate::device::DeviceBuffer>, TimelinePoint, u64)>>,
    cap: u64,
}

impl WorkspacePool {
    pub fn new(cap: u64) -> WorkspacePool {
        WorkspacePool {
            idle: Mutex::new(std::collections::VecDeque::new()),
            cap,
        }
    }

    /// A set of buffers of exactly `sizes` whose last use on `device` has retired (or failed), if one is kept.
    pub fn take(&self, device: &Device, sizes: &[u64]) -> Option<Vec<crate::device::DeviceBuffer>> {
        if sizes.is_empty() {
            // Most stages have no workspace: nothing to look up on the dispatch path.
            return Some(Vec::new());
        }
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let i = idle.iter().position(|(set, point, _)| {
            set.len() == sizes.len()
                && set.iter().zip(sizes).all(|(b, s)| b.bytes() == *s)
                && !matches!(device.wait(*point, 0), Ok(false))
        })?;
        idle.remove(i).map(|(set, _, _)| set)
    }

    /// Keeps `set`, last used by the work that signals `point`.
    pub fn give(&self, set: Vec<crate::device::DeviceBuffer>, point: TimelinePoint) {
        let bytes: u64 = set.iter().map(|b| b.bytes()).sum();
        if bytes == 0 || bytes > self.cap {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        idle.push_back((set, point, bytes));
        let mut total: u64 = idle.iter().map(|x| x.2).sum();
        while total > self.cap {
            match idle.pop_front() {
                Some((_, _, b)) => total -= b,
                None => break,
            }
        }
    }

    /// Releases every idle set (the buffers of sets still in use are freed when their work retires).
    pub fn clear(&self) {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// The bytes kept idle.
    pub fn idle_bytes(&self) -> u64 {
        self.idle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|x| x.2)
            .sum()
    }
}

/// Who touched a buffer last within the invocation.
#[derive(Debug, Default, Clone)]
struct Access {
    writer: Option<TimelinePoint>,
    /// The readers since the last write: the latest point per timeline (a later point of a timeline implies
    /// the earlier ones).
    readers: Vec<TimelinePoint>,
}

/// One chain: a timeline, the value it had before this invocation, and its last value.
#[derive(Debug, Clone, Copy)]
struct Chain {
    timeline: TimelineId,
    start: u64,
    value: u64,
}

/// Where a submission goes and what it waits on ([`Order::place`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The chain it is appended to; `None`: a new chain (take a timeline and [`Order::add_chain`] it).
    pub chain: Option<usize>,
    /// The points it waits on, one per timeline, without those its chain's order implies.
    pub waits: Vec<TimelinePoint>,
}

/// The dependency state of one invocation (see the module docs).
#[derive(Debug)]
pub struct Order {
    chains: Vec<Chain>,
    buffers: HashMap<BufferId, Access>,
    feedback: HashSet<BufferId>,
    /// Gathers' points and the point each waited on: work after a gather is after what it waited on.
    gathers: Vec<(TimelinePoint, TimelinePoint)>,
}

/// Adds `p` to `set`, keeping the latest point per timeline.
fn merge(set: &mut Vec<TimelinePoint>, p: TimelinePoint) {
    match set.iter_mut().find(|q| q.timeline == p.timeline) {
        Some(q) => q.value = q.value.max(p.value),
        None => set.push(p),
    }
}

impl Order {
    /// An invocation whose first chain is `timeline`, last signalled at `value`.
    pub fn new(timeline: TimelineId, value: u64) -> Order {
        Order {
            chains: vec![Chain {
                timeline,
                start: value,
                value,
            }],
            buffers: HashMap::new(),
            feedback: HashSet::new(),
            gathers: Vec::new(),
        }
    }

    /// The first chain's timeline (the invocation's own, e.g. to name its gathers).
    pub fn first_timeline(&self) -> TimelineId {
        self.chains[0].timeline
    }

    /// Where a submission reading `reads` and writing `writes` after `joins` goes, and what it waits on.
    /// `Err` names the written buffer (its index in `writes`) that a `runner.feedback` slot reads later.
    pub fn place(
        &self,
        reads: &[BufferId],
        writes: &[BufferId],
        joins: &[TimelinePoint],
    ) -> Result<Placement, usize> {
        if let Some(i) = writes.iter().position(|b| self.feedback.contains(b)) {
            return Err(i);
        }
        let mut deps: Vec<TimelinePoint> = Vec::new();
        for p in joins {
            merge(&mut deps, *p);
        }
        for b in reads {
            if let Some(w) = self.buffers.get(b).and_then(|a| a.writer) {
                merge(&mut deps, w);
            }
        }
        for b in writes {
            if let Some(a) = self.buffers.get(b) {
                if let Some(w) = a.writer {
                    merge(&mut deps, w);
                }
                for r in &a.readers {
                    merge(&mut deps, *r);
                }
            }
        }
        // What the dependencies imply: a gather's point implies the point it waited on.
        let mut covered = deps.clone();
        for (g, after) in &self.gathers {
            if deps
                .iter()
                .any(|p| p.timeline == g.timeline && p.value >= g.value)
            {
                merge(&mut covered, *after);
            }
        }
        let on = |c: &Chain| covered.iter().any(|p| p.timeline == c.timeline);
        let tail = |c: &Chain| {
            c.value > c.start
                && covered
                    .iter()
                    .any(|p| p.timeline == c.timeline && p.value >= c.value)
        };
        let chain = self
            .chains
            .iter()
            .position(tail)
            .or_else(|| self.chains.iter().position(|c| c.value == c.start))
            .or_else(|| {
                if self.chains.len() < MAX_CHAINS {
                    None
                } else {
                    Some(self.chains.iter().position(on).unwrap_or(0))
                }
            });
        let own = chain.map(|i| self.chains[i].timeline);
        // A chain's own earlier points are implied by its order (points of this invocation's chain; a point of
        // the timeline from before the invocation is reached before the chain's first submission runs too).
        deps.retain(|p| Some(p.timeline) != own);
        Ok(Placement { chain, waits: deps })
    }

    /// Adds a chain on `timeline`, last signalled at `value`; returns its index.
    pub fn add_chain(&mut self, timeline: TimelineId, value: u64) -> usize {
        self.chains.push(Chain {
            timeline,
            start: value,
            value,
        });
        self.chains.len() - 1
    }

    /// The point the next submission on `chain` signals.
    pub fn next_point(&self, chain: usize) -> TimelinePoint {
        let c = &self.chains[chain];
        TimelinePoint {
            timeline: c.timeline,
            value: c.value + 1,
        }
    }

    /// Records a submission accepted on `chain` (at [`Order::next_point`]), reading `reads` and writing
    /// `writes`; returns its point.
    pub fn record(
        &mut self,
        chain: usize,
        reads: &[BufferId],
        writes: &[BufferId],
    ) -> TimelinePoint {
        let p = self.next_point(chain);
        self.chains[chain].value = p.value;
        for b in reads {
            let a = self.buffers.entry(*b).or_default();
            merge(&mut a.readers, p);
        }
        for b in writes {
            let a = self.buffers.entry(*b).or_default();
            a.writer = Some(p);
            a.readers.clear();
        }
        p
    }

    /// Records a gather that waited on `after`, writes `target` and signals `point`.
    pub fn record_gather(
        &mut self,
        target: BufferId,
        after: Option<TimelinePoint>,
        point: TimelinePoint,
    ) {
        let a = self.buffers.entry(target).or_default();
        a.writer = Some(point);
        a.readers.clear();
        if let Some(w) = after {
            self.gathers.push((point, w));
        }
    }

    /// The last writer of `buffer` within the invocation.
    pub fn writer(&self, buffer: BufferId) -> Option<TimelinePoint> {
        self.buffers.get(&buffer).and_then(|a| a.writer)
    }

    /// Records that a `runner.feedback` slot reads `buffer` when the work is collected.
    pub fn record_feedback(&mut self, buffer: BufferId) {
        self.feedback.insert(buffer);
    }

    /// The last point of every chain that this invocation submitted to (collection waits on these).
    pub fn tails(&self) -> Vec<TimelinePoint> {
        self.chains
            .iter()
            .filter(|c| c.value > c.start)
            .map(|c| TimelinePoint {
                timeline: c.timeline,
                value: c.value,
            })
            .collect()
    }

    /// Every chain's timeline and last value (given back to the model's idle timelines once settled).
    pub fn leases(&self) -> Vec<(TimelineId, u64)> {
        self.chains.iter().map(|c| (c.timeline, c.value)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: BufferId = BufferId(1);
    const B: BufferId = BufferId(2);
    const C: BufferId = BufferId(3);
    const D: BufferId = BufferId(4);

    fn submit(
        o: &mut Order,
        reads: &[BufferId],
        writes: &[BufferId],
        next: &mut u64,
    ) -> (TimelinePoint, Vec<TimelinePoint>) {
        let pl = o.place(reads, writes, &[]).unwrap();
        let chain = match pl.chain {
            Some(c) => c,
            None => {
                *next += 1;
                o.add_chain(TimelineId(*next), 10 * *next)
            }
        };
        (o.record(chain, reads, writes), pl.waits)
    }

    fn pt(t: u64, v: u64) -> TimelinePoint {
        TimelinePoint {
            timeline: TimelineId(t),
            value: v,
        }
    }

    #[test]
    fn a_dependent_chain_stays_on_one_timeline_without_waits() {
        let mut o = Order::new(TimelineId(0), 5);
        let mut next = 0;
        assert_eq!(submit(&mut o, &[A], &[B], &mut next), (pt(0, 6), vec![]));
        assert_eq!(submit(&mut o, &[B], &[C], &mut next), (pt(0, 7), vec![]));
        assert_eq!(submit(&mut o, &[C, A], &[D], &mut next), (pt(0, 8), vec![]));
        assert_eq!(o.tails(), vec![pt(0, 8)]);
    }

    #[test]
    fn independent_stages_go_on_chains_of_their_own_and_a_join_waits_on_both() {
        let mut o = Order::new(TimelineId(0), 0);
        let mut next = 0;
        // Two stages reading the same input and writing different outputs are independent.
        assert_eq!(submit(&mut o, &[A], &[B], &mut next), (pt(0, 1), vec![]));
        assert_eq!(submit(&mut o, &[A], &[C], &mut next), (pt(1, 11), vec![]));
        // A stage reading both outputs continues one chain and waits on the other.
        assert_eq!(
            submit(&mut o, &[B, C], &[D], &mut next),
            (pt(0, 2), vec![pt(1, 11)])
        );
        assert_eq!(o.tails(), vec![pt(0, 2), pt(1, 11)]);
    }

    #[test]
    fn writes_wait_for_earlier_readers_and_writers() {
        let mut o = Order::new(TimelineId(0), 0);
        let mut next = 0;
        submit(&mut o, &[], &[A], &mut next); // (0,1) writes A
        submit(&mut o, &[B], &[C], &mut next); // (1,11), independent
        // Reads A (after (0,1)), writes B which (1,11) read: waits on it.
        assert_eq!(
            submit(&mut o, &[A], &[B], &mut next),
            (pt(0, 2), vec![pt(1, 11)])
        );
        // Writes A: the writer (0,1) and the reader (0,2) are on its chain.
        assert_eq!(submit(&mut o, &[], &[A], &mut next), (pt(0, 3), vec![]));
    }

    #[test]
    fn joins_are_waited_on_and_chains_are_bounded() {
        let mut o = Order::new(TimelineId(0), 0);
        let mut next = 0;
        let bufs: Vec<BufferId> = (10..20).map(BufferId).collect();
        for b in &bufs[..MAX_CHAINS] {
            submit(&mut o, &[], &[*b], &mut next);
        }
        assert_eq!(o.tails().len(), MAX_CHAINS);
        // A fifth independent stage goes on the first chain.
        let pl = o.place(&[], &[bufs[8]], &[pt(99, 3)]).unwrap();
        assert_eq!(
            pl,
            Placement {
                chain: Some(0),
                waits: vec![pt(99, 3)]
            }
        );
        // One depending on the third chain's work goes there.
        let pl = o.place(&[bufs[2]], &[bufs[9]], &[]).unwrap();
        assert_eq!(pl.chain, Some(2));
        assert!(pl.waits.is_empty());
    }

    #[test]
    fn work_after_a_gather_stays_on_the_chain_the_gather_waited_on() {
        // descriptors = execute(input); g = gather(after descriptors) into rows; pool = execute(input, rows)
        let mut o = Order::new(TimelineId(0), 0);
        let mut next = 0;
        let (d, _) = submit(&mut o, &[A], &[B], &mut next);
        o.record_gather(C, Some(d), pt(7, 1));
        let pl = o.place(&[A, C], &[D], &[pt(7, 1)]).unwrap();
        assert_eq!(
            pl,
            Placement {
                chain: Some(0),
                waits: vec![pt(7, 1)]
            }
        );
    }

    #[test]
    fn gathers_order_their_readers_and_feedback_buffers_are_not_rewritten() {
        let mut o = Order::new(TimelineId(0), 0);
        let mut next = 0;
        o.record_gather(A, None, pt(7, 4));
        assert_eq!(
            submit(&mut o, &[A], &[B], &mut next),
            (pt(0, 1), vec![pt(7, 4)])
        );
        o.record_feedback(B);
        assert_eq!(o.place(&[B], &[C], &[]).map(|p| p.waits), Ok(vec![]));
        assert_eq!(o.place(&[A], &[C, B], &[]), Err(1));
    }
}
