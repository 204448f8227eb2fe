//! Streams and events that are really asynchronous.
//!
//! Each stream is a FIFO of operations run in order by its own worker thread; every operation
//! waits the configured delay (`NPUMEM_FAKE_DELAY_US`) before it runs, so work queued behind it
//! — and an event recorded after it — completes later than the call that queued it returns.
//! An event counts its records: a record queues an operation that marks that record complete;
//! a query asks whether the latest record has completed (an event never recorded is complete on
//! CUDA and not ready on AscendCL);
//! a synchronize waits for the latest record at the time of the call; a stream's wait on an
//! event queues an operation that blocks the stream until the record current at the time of the
//! call has completed. Stream and event handles are table keys, never dereferenced, so a stale
//! or foreign handle is an error, not a crash. The NULL stream is a stream of its own, made on
//! first use and not counted among the live streams; so is each thread's implicit per-thread
//! stream ([`per_thread_key`], CUDA's `CU_STREAM_PER_THREAD`).
//!
//! Streams and events belong to the device current when they were made: using a stream, or
//! recording an event, from a thread whose current device is another is an error
//! ([`Fail::WrongDevice`]); an event may be queried, synchronized and waited on from any device,
//! and a device's synchronize waits for its own streams.
//!
//! Invariants: a stream runs its operations one at a time in the order they were queued;
//! `completed <= submitted`; an event's `completed <= recorded`; a wait names a record that
//! was already queued when the wait was, so waits never form a cycle; the first failure of a
//! queued operation is kept and reported by the next synchronize of its stream; destroying a
//! stream lets its queue drain, then joins its worker.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::Fail;

/// One queued operation.
pub type Op = Box<dyn FnOnce() -> Result<(), Fail> + Send>;

#[derive(Default)]
struct Queue {
    ops: VecDeque<Op>,
    submitted: u64,
    completed: u64,
    error: Option<Fail>,
    closing: bool,
}

pub struct Stream {
    queue: Mutex<Queue>,
    changed: Condvar,
    worker: Mutex<Option<JoinHandle<()>>>,
    /// The device current when it was made (none for the implicit streams).
    device: Option<i32>,
}

#[derive(Default)]
pub struct Event {
    /// (records made, records completed).
    state: Mutex<(u64, u64)>,
    changed: Condvar,
    /// The device current when it was made.
    device: Option<i32>,
}

impl Event {
    fn complete(&self, record: u64) {
        let mut s = self.state.lock();
        s.1 = s.1.max(record);
        self.changed.notify_all();
    }

    fn wait_for(&self, record: u64) {
        let mut s = self.state.lock();
        while s.1 < record {
            self.changed.wait(&mut s);
        }
    }

    /// The latest record, and whether it has completed.
    pub fn status(&self) -> (u64, bool) {
        let s = self.state.lock();
        (s.0, s.1 >= s.0)
    }
}

/// Handles: non-null keys, in ranges of their own so that mixing them up is caught.
const STREAM_BASE: u64 = 0x5000_0000;
const EVENT_BASE: u64 = 0xE000_0000;
/// Keys of the implicit per-thread streams (CUDA's `CU_STREAM_PER_THREAD`), one per thread.
const PER_THREAD_BASE: u64 = 0x7000_0000;

static THREADS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static THREAD_INDEX: u64 = THREADS.fetch_add(1, Ordering::Relaxed);
}

/// The key of the calling thread's implicit per-thread stream.
pub fn per_thread_key() -> u64 {
    PER_THREAD_BASE + THREAD_INDEX.with(|i| *i)
}

fn is_per_thread(key: u64) -> bool {
    (PER_THREAD_BASE..PER_THREAD_BASE + 0x1000_0000).contains(&key)
}

pub struct Streams {
    streams: Mutex<HashMap<u64, Arc<Stream>>>,
    events: Mutex<HashMap<u64, Arc<Event>>>,
    default: Mutex<Option<Arc<Stream>>>,
    /// The implicit per-thread streams made so far (not counted among the live streams).
    per_thread: Mutex<HashMap<u64, Arc<Stream>>>,
    fresh_events_complete: bool,
    next: AtomicU64,
    delay_us: Arc<AtomicU64>,
}

impl Streams {
    /// Streams whose operations wait `delay_us` each; a query of an event never recorded
    /// answers `fresh_events_complete` (CUDA: complete; AscendCL, whose `aclrtCreateEvent`
    /// makes an event in its initial state: not ready).
    pub fn new(delay_us: u64, fresh_events_complete: bool) -> Streams {
        Streams {
            streams: Mutex::new(HashMap::new()),
            events: Mutex::new(HashMap::new()),
            default: Mutex::new(None),
            per_thread: Mutex::new(HashMap::new()),
            fresh_events_complete,
            next: AtomicU64::new(1),
            delay_us: Arc::new(AtomicU64::new(delay_us)),
        }
    }

    pub fn set_delay_us(&self, us: u64) {
        self.delay_us.store(us, Ordering::Relaxed);
    }

    fn spawn(&self, device: Option<i32>) -> Result<Arc<Stream>, Fail> {
        let stream = Arc::new(Stream {
            queue: Mutex::new(Queue::default()),
            changed: Condvar::new(),
            worker: Mutex::new(None),
            device,
        });
        let (s, delay) = (stream.clone(), self.delay_us.clone());
        let worker = std::thread::Builder::new()
            .name("npumem-fake-stream".into())
            .spawn(move || run(&s, &delay))
            .map_err(|_| Fail::OutOfMemory)?;
        *stream.worker.lock() = Some(worker);
        Ok(stream)
    }

    /// A stream of the calling thread's current device.
    pub fn create_stream(&self) -> Result<u64, Fail> {
        let stream = self.spawn(crate::current_device())?;
        let key = STREAM_BASE + self.next.fetch_add(1, Ordering::Relaxed);
        self.streams.lock().insert(key, stream);
        Ok(key)
    }

    /// The stream `key` names (0: the NULL stream; a [`per_thread_key`]: that thread's implicit
    /// stream).
    pub fn stream(&self, key: u64) -> Result<Arc<Stream>, Fail> {
        if is_per_thread(key) {
            let mut implicit = self.per_thread.lock();
            if let Some(s) = implicit.get(&key) {
                return Ok(s.clone());
            }
            let s = self.spawn(None)?;
            implicit.insert(key, s.clone());
            return Ok(s);
        }
        if key == 0 {
            let mut default = self.default.lock();
            if default.is_none() {
                *default = Some(self.spawn(None)?);
            }
            return Ok(default.clone().expect("made above"));
        }
        let stream = self.streams.lock().get(&key).cloned().ok_or(Fail::InvalidHandle)?;
        mine(stream.device)?;
        Ok(stream)
    }

    /// Lets the stream's queued work finish, then ends its worker.
    pub fn destroy_stream(&self, key: u64) -> Result<(), Fail> {
        self.stream(key)?;
        let stream = self.streams.lock().remove(&key).ok_or(Fail::InvalidHandle)?;
        {
            let mut q = stream.queue.lock();
            q.closing = true;
            stream.changed.notify_all();
        }
        if let Some(worker) = stream.worker.lock().take() {
            let _ = worker.join();
        }
        Ok(())
    }

    pub fn enqueue(&self, key: u64, op: Op) -> Result<(), Fail> {
        let stream = self.stream(key)?;
        let mut q = stream.queue.lock();
        q.ops.push_back(op);
        q.submitted += 1;
        stream.changed.notify_all();
        Ok(())
    }

    /// Waits for the work queued on the stream so far; reports the first failure of its queued
    /// operations since the last synchronize.
    pub fn synchronize(&self, key: u64) -> Result<(), Fail> {
        let stream = self.stream(key)?;
        let mut q = stream.queue.lock();
        let target = q.submitted;
        while q.completed < target {
            stream.changed.wait(&mut q);
        }
        q.error.take().map_or(Ok(()), Err)
    }

    /// Whether the stream has no queued work left.
    pub fn idle(&self, key: u64) -> Result<bool, Fail> {
        let stream = self.stream(key)?;
        let q = stream.queue.lock();
        Ok(q.completed == q.submitted)
    }

    /// Synchronizes every stream of the calling thread's current device (and the implicit ones).
    pub fn synchronize_all(&self) -> Result<(), Fail> {
        let current = crate::current_device();
        let mut keys: Vec<u64> =
            self.streams.lock().iter().filter(|(_, s)| s.device == current).map(|(&k, _)| k).collect();
        keys.extend(self.per_thread.lock().keys().copied());
        keys.push(0);
        keys.into_iter().try_for_each(|k| match self.synchronize(k) {
            Err(Fail::InvalidHandle) => Ok(()), // destroyed meanwhile
            other => other,
        })
    }

    /// An event of the calling thread's current device.
    pub fn create_event(&self) -> u64 {
        let key = EVENT_BASE + self.next.fetch_add(1, Ordering::Relaxed);
        self.events.lock().insert(key, Arc::new(Event { device: crate::current_device(), ..Event::default() }));
        key
    }

    pub fn event(&self, key: u64) -> Result<Arc<Event>, Fail> {
        self.events.lock().get(&key).cloned().ok_or(Fail::InvalidHandle)
    }

    pub fn destroy_event(&self, key: u64) -> Result<(), Fail> {
        self.events.lock().remove(&key).map(|_| ()).ok_or(Fail::InvalidHandle)
    }

    /// Records `event` (of the current device) on `stream`: it completes when the work queued
    /// before it has.
    pub fn record(&self, event: u64, stream: u64) -> Result<(), Fail> {
        let ev = self.event(event)?;
        mine(ev.device)?;
        let s = self.stream(stream)?;
        let mut q = s.queue.lock();
        let record = {
            let mut st = ev.state.lock();
            st.0 += 1;
            st.0
        };
        q.ops.push_back(Box::new(move || {
            ev.complete(record);
            Ok(())
        }));
        q.submitted += 1;
        s.changed.notify_all();
        Ok(())
    }

    /// Whether the latest record of `event` has completed (an event never recorded: as the
    /// runtime answers, [`Streams::new`]).
    pub fn query(&self, event: u64) -> Result<bool, Fail> {
        let (records, done) = self.event(event)?.status();
        Ok(if records == 0 { self.fresh_events_complete } else { done })
    }

    /// Waits for the latest record of `event`.
    pub fn synchronize_event(&self, event: u64) -> Result<(), Fail> {
        let ev = self.event(event)?;
        let (record, _) = ev.status();
        ev.wait_for(record);
        Ok(())
    }

    /// Makes `stream`'s later work wait for the latest record of `event`.
    pub fn wait_event(&self, stream: u64, event: u64) -> Result<(), Fail> {
        let ev = self.event(event)?;
        let (record, done) = ev.status();
        if done {
            // Checks the stream handle all the same.
            return self.stream(stream).map(|_| ());
        }
        self.enqueue(
            stream,
            Box::new(move || {
                ev.wait_for(record);
                Ok(())
            }),
        )
    }

    /// (live streams, live events).
    pub fn counts(&self) -> (u64, u64) {
        (self.streams.lock().len() as u64, self.events.lock().len() as u64)
    }
}

/// `Ok` when a stream or event of `device` may be used from the calling thread: its current
/// device is that one.
fn mine(device: Option<i32>) -> Result<(), Fail> {
    if device == crate::current_device() { Ok(()) } else { Err(Fail::WrongDevice) }
}

/// A stream's worker: runs queued operations in order until the stream closes and drains.
fn run(stream: &Stream, delay_us: &AtomicU64) {
    loop {
        let op = {
            let mut q = stream.queue.lock();
            loop {
                if let Some(op) = q.ops.pop_front() {
                    break op;
                }
                if q.closing {
                    return;
                }
                stream.changed.wait(&mut q);
            }
        };
        let delay = delay_us.load(Ordering::Relaxed);
        if delay > 0 {
            std::thread::sleep(Duration::from_micros(delay));
        }
        let result = op();
        let mut q = stream.queue.lock();
        q.completed += 1;
        if let Err(e) = result {
            q.error.get_or_insert(e);
        }
        stream.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    #[test]
    fn events_wait_for_the_work_before_them() {
        let streams = Streams::new(2000, true);
        let (a, b) = (streams.create_stream().unwrap(), streams.create_stream().unwrap());
        let e = streams.create_event();
        assert!(streams.query(e).unwrap(), "never recorded: complete");
        let acl = Streams::new(0, false);
        let fresh = acl.create_event();
        assert!(!acl.query(fresh).unwrap(), "never recorded, as AscendCL answers: not ready");
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        streams
            .enqueue(
                a,
                Box::new(move || {
                    r.store(true, Ordering::SeqCst);
                    Ok(())
                }),
            )
            .unwrap();
        streams.record(e, a).unwrap();
        assert!(!streams.query(e).unwrap(), "recorded behind delayed work");
        streams.wait_event(b, e).unwrap();
        let seen = Arc::new(AtomicBool::new(false));
        let (r, s) = (ran.clone(), seen.clone());
        streams
            .enqueue(
                b,
                Box::new(move || {
                    s.store(r.load(Ordering::SeqCst), Ordering::SeqCst);
                    Ok(())
                }),
            )
            .unwrap();
        streams.synchronize(b).unwrap();
        assert!(seen.load(Ordering::SeqCst), "b's work ran after a's");
        streams.synchronize_event(e).unwrap();
        assert!(streams.query(e).unwrap());
        streams.enqueue(a, Box::new(|| Err(Fail::NotMapped))).unwrap();
        assert_eq!(streams.synchronize(a), Err(Fail::NotMapped));
        assert_eq!(streams.synchronize(a), Ok(()));
        assert_eq!(streams.counts(), (2, 1));
        streams.destroy_stream(a).unwrap();
        assert_eq!(streams.destroy_stream(a), Err(Fail::InvalidHandle));
        assert_eq!(streams.record(e, a), Err(Fail::InvalidHandle));
        streams.destroy_stream(b).unwrap();
        streams.destroy_event(e).unwrap();
        assert_eq!(streams.counts(), (0, 0));
        streams.synchronize_all().unwrap();
    }

    #[test]
    fn each_thread_has_its_own_implicit_stream() {
        let streams = Arc::new(Streams::new(20_000, true));
        let mine = per_thread_key();
        assert_eq!(per_thread_key(), mine);
        let theirs = std::thread::spawn(per_thread_key).join().unwrap();
        assert_ne!(mine, theirs);
        streams.enqueue(mine, Box::new(|| Ok(()))).unwrap();
        assert!(!streams.idle(mine).unwrap(), "queued behind the delay");
        assert!(streams.idle(0).unwrap() && streams.idle(theirs).unwrap(), "other streams have no work");
        streams.synchronize_all().unwrap();
        assert!(streams.idle(mine).unwrap());
        assert_eq!(streams.counts(), (0, 0), "implicit streams are not live streams");
    }
}
