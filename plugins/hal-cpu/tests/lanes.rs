//! The CPU device's lanes: submissions of one timeline run in submission order; submissions of different
//! timelines are ordered only by their wait points, so work blocked (or running long) on one timeline does not
//! hold up another's; jobs of different lanes that share buffers never deadlock.

use abi_stable::std_types::{RBoxError, RResult, RSlice, RVec};
use loom_plugin_api::{
    BufferId, Command, HalDeviceBox, Submission, TimelineId, TimelinePoint, WaitStatus,
};

const WAIT_NS: u64 = 30_000_000_000;

fn ok<T>(what: &str, r: RResult<T, RBoxError>) -> T {
    r.into_result().unwrap_or_else(|e| panic!("{what}: {e}"))
}

fn device() -> HalDeviceBox {
    hal_cpu::open_parts(0).expect("cpu device 0").device
}

fn point(timeline: TimelineId, value: u64) -> TimelinePoint {
    TimelinePoint { timeline, value }
}

fn submit(
    dev: &HalDeviceBox,
    commands: Vec<Command>,
    wait: &[TimelinePoint],
    signal: TimelinePoint,
) {
    ok(
        "submit",
        dev.submit(Submission {
            commands: RVec::from(commands),
            wait: RVec::from(wait.to_vec()),
            signal,
        }),
    );
}

fn fill(dst: BufferId, byte: u8) -> Command {
    Command::Fill {
        dst,
        offset: 0,
        len: 64,
        byte,
    }
}

fn read(dev: &HalDeviceBox, b: BufferId) -> Vec<u8> {
    ok("read", dev.read(b, 0, 64)).into_vec()
}

#[test]
fn a_blocked_timeline_does_not_hold_up_another() {
    let dev = device();
    let host = ok("timeline", dev.timeline_create());
    let (t1, t2) = (
        ok("timeline", dev.timeline_create()),
        ok("timeline", dev.timeline_create()),
    );
    let (a, b) = (ok("alloc", dev.alloc(64)), ok("alloc", dev.alloc(64)));
    // t1's work waits for the host; t2's, submitted after it, waits for nothing.
    submit(&dev, vec![fill(a, 1)], &[point(host, 1)], point(t1, 1));
    submit(&dev, vec![fill(b, 2)], &[], point(t2, 1));
    assert_eq!(
        ok("wait", dev.timeline_wait(point(t2, 1), WAIT_NS)),
        WaitStatus::Reached,
        "t2's work waited behind t1's"
    );
    assert_eq!(read(&dev, b), vec![2; 64]);
    assert_eq!(
        ok("value", dev.timeline_value(t1)),
        0,
        "t1's work ran before its wait point"
    );
    assert_eq!(read(&dev, a), vec![0; 64]);
    ok("signal", dev.timeline_signal(point(host, 1)));
    assert_eq!(
        ok("wait", dev.timeline_wait(point(t1, 1), WAIT_NS)),
        WaitStatus::Reached
    );
    assert_eq!(read(&dev, a), vec![1; 64]);
}

#[test]
fn one_timeline_runs_in_submission_order() {
    let dev = device();
    let host = ok("timeline", dev.timeline_create());
    let t = ok("timeline", dev.timeline_create());
    let a = ok("alloc", dev.alloc(64));
    // The first waits for the host; the second, on the same timeline, waits for nothing but must run after it.
    submit(&dev, vec![fill(a, 1)], &[point(host, 1)], point(t, 1));
    submit(&dev, vec![fill(a, 2)], &[], point(t, 2));
    assert_eq!(
        ok("wait", dev.timeline_wait(point(t, 2), 100_000_000)),
        WaitStatus::TimedOut,
        "the second job of a timeline ran before the first"
    );
    assert_eq!(read(&dev, a), vec![0; 64]);
    ok("signal", dev.timeline_signal(point(host, 1)));
    assert_eq!(
        ok("wait", dev.timeline_wait(point(t, 2), WAIT_NS)),
        WaitStatus::Reached
    );
    assert_eq!(read(&dev, a), vec![2; 64], "the later fill landed last");
}

#[test]
fn lanes_sharing_buffers_do_not_deadlock() {
    // Two timelines copy between the same two buffers in opposite directions, many times, while a third fills
    // both: every job locks both buffers, so without one lock order they would deadlock sooner or later.
    let dev = device();
    let n = 1 << 20;
    let a = ok("alloc", dev.alloc(n));
    let b = ok("alloc", dev.alloc(n));
    ok(
        "write",
        dev.write(a, 0, RSlice::from_slice(&vec![5u8; n as usize])),
    );
    let lanes: Vec<TimelineId> = (0..3)
        .map(|_| ok("timeline", dev.timeline_create()))
        .collect();
    let copy = |src, dst| Command::Copy {
        src,
        src_offset: 0,
        dst,
        dst_offset: 0,
        len: n,
    };
    let rounds = 400;
    for v in 1..=rounds {
        submit(&dev, vec![copy(a, b)], &[], point(lanes[0], v));
        submit(&dev, vec![copy(b, a)], &[], point(lanes[1], v));
        submit(&dev, vec![copy(a, b), copy(b, a)], &[], point(lanes[2], v));
    }
    for &t in &lanes {
        assert_eq!(
            ok("wait", dev.timeline_wait(point(t, rounds), WAIT_NS)),
            WaitStatus::Reached,
            "a lane did not finish"
        );
    }
    // Only copies of 5s ever ran.
    assert!(ok("read", dev.read(b, 0, n)).iter().all(|&x| x == 5));
}

#[test]
fn a_failure_stays_on_its_timeline() {
    let dev = device();
    let (t1, t2) = (
        ok("timeline", dev.timeline_create()),
        ok("timeline", dev.timeline_create()),
    );
    let a = ok("alloc", dev.alloc(64));
    // Out of range: fails t1's point; t2's work is not affected.
    submit(
        &dev,
        vec![Command::Fill {
            dst: a,
            offset: 60,
            len: 64,
            byte: 9,
        }],
        &[],
        point(t1, 1),
    );
    submit(&dev, vec![fill(a, 3)], &[], point(t2, 1));
    assert!(
        dev.timeline_wait(point(t1, 1), WAIT_NS)
            .into_result()
            .is_err()
    );
    assert_eq!(
        ok("wait", dev.timeline_wait(point(t2, 1), WAIT_NS)),
        WaitStatus::Reached
    );
    assert_eq!(read(&dev, a), vec![3; 64]);
}
