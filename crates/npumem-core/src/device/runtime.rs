//! The device's side of the stream seam: npumem's streams and events are mirrored on the
//! backend's runtime (`Backend::streams`), so that on an accelerator the runtime's own queue runs
//! the async copies and memsets and the runtime's own events decide when freed memory is safe to
//! hand out. Without a runtime queue (`NoRuntime`: the simulator, host memory) every call here is
//! free and the simulated clock alone decides.
//!
//! Invariants: every stream and event the device knows has its runtime handle (0 without a
//! runtime queue; the default stream is 0 on every runtime); a stream is `dirty` while runtime
//! work queued on it (or waited on by it) may be incomplete — from the first such operation until
//! the host synchronises with the stream or the device; a *mark* (an event recorded on a dirty
//! stream) is owned by exactly one holder (a busy entry or a pending free) and destroyed when
//! that holder is done with it.

use super::*;
use crate::stream::runtime::Handle;

/// Streams with runtime work that may be incomplete.
pub(super) type Dirty = rustc_hash::FxHashSet<StreamId>;

/// The runtime handles of the device's streams and events (absent: 0), and the streams whose
/// runtime work may be incomplete.
#[derive(Debug, Default)]
pub(super) struct RuntimeHandles {
    pub(super) streams: FxHashMap<StreamId, Handle>,
    pub(super) events: FxHashMap<EventId, Handle>,
    pub(super) dirty: Dirty,
    /// Streams adopted from the program (`adopt_stream`): never destroyed on the runtime.
    pub(super) adopted: Dirty,
    /// Adopted streams (the default stream too) on a runtime with a queue: the program queues
    /// work on them that npumem does not see, so they count as dirty always.
    pub(super) opaque: Dirty,
}

impl Device {
    /// A new stream (on the runtime too).
    pub fn create_stream(&mut self) -> Result<StreamId> {
        let handle = self.backend.streams().create_stream()?;
        let id = self.sched.create_stream();
        if handle != 0 {
            self.rt.streams.insert(id, handle);
        }
        Ok(id)
    }

    /// A stream for a runtime stream the program already has (a framework's `aclrtStream` or
    /// `CUstream`, passed to the pluggable allocator): npumem orders its frees on it and waits
    /// on its events, but never destroys it. Handle 0 is the default stream. On a runtime with a
    /// queue the program's kernels on the stream are invisible to npumem, so the stream counts as
    /// dirty always: a free on it records the runtime's event, and the block goes to another
    /// stream only once that event completes (its own stream reuses it at once).
    pub fn adopt_stream(&mut self, handle: Handle) -> StreamId {
        let real = self.backend.streams().is_real();
        let id = if handle == 0 {
            DEFAULT_STREAM
        } else {
            let id = self.sched.create_stream();
            self.rt.streams.insert(id, handle);
            self.rt.adopted.insert(id);
            id
        };
        if real {
            self.rt.opaque.insert(id);
        }
        id
    }

    /// Destroys a stream; its queued work still completes, and `synchronize_device` waits for it.
    pub fn destroy_stream(&mut self, stream: StreamId) -> Result<()> {
        if stream == DEFAULT_STREAM {
            return Err(AclError::invalid_param("the default stream cannot be destroyed"));
        }
        self.sched.tail_ns(stream)?;
        // The runtime finishes the stream's work first, so that marks recorded on it resolve.
        self.rt_synchronize_stream(stream)?;
        let handle = self.rt_stream(stream);
        if handle != 0 {
            if !self.rt.adopted.contains(&stream) {
                self.backend.streams().destroy_stream(handle)?;
            }
            self.rt.adopted.remove(&stream);
            self.rt.opaque.remove(&stream);
            self.rt.streams.remove(&stream);
        }
        self.sched.destroy_stream(stream)
    }

    /// A new event (on the runtime too).
    pub fn create_event(&mut self) -> Result<EventId> {
        let handle = self.backend.streams().create_event()?;
        let id = self.sched.create_event();
        if handle != 0 {
            self.rt.events.insert(id, handle);
        }
        Ok(id)
    }

    pub fn destroy_event(&mut self, event: EventId) -> Result<()> {
        if !self.sched.has_event(event) {
            return self.sched.destroy_event(event); // the error naming the event
        }
        if let Some(&handle) = self.rt.events.get(&event) {
            self.backend.streams().destroy_event(handle)?;
            self.rt.events.remove(&event);
        }
        self.sched.destroy_event(event)
    }

    /// The runtime handle of `stream` (0: the default stream, or no runtime queue).
    pub(super) fn rt_stream(&self, stream: StreamId) -> Handle {
        if self.rt.streams.is_empty() { 0 } else { self.rt.streams.get(&stream).copied().unwrap_or(0) }
    }

    pub(super) fn rt_event(&self, event: EventId) -> Handle {
        if self.rt.events.is_empty() { 0 } else { self.rt.events.get(&event).copied().unwrap_or(0) }
    }

    /// A mark after `stream`'s latest operation, for the blocks it touches; where no event can be
    /// had, the host waits for the stream instead (so no mark is needed), and failing that the
    /// mark is 0 (the runtime is broken: its error surfaces at the next synchronisation).
    pub(super) fn rt_op_mark(&mut self, stream: StreamId) -> Handle {
        match self.rt_mark(stream) {
            Ok(m) => m,
            Err(_) => {
                let _ = self.rt_synchronize_stream(stream);
                0
            }
        }
    }

    /// A mark of `stream`'s runtime work so far: an event recorded on it when it has runtime work
    /// that may be incomplete, else 0 (nothing to wait for).
    pub(super) fn rt_mark(&mut self, stream: StreamId) -> Result<Handle> {
        if !self.rt.dirty.contains(&stream) && !self.rt.opaque.contains(&stream) {
            return Ok(0);
        }
        let handle = self.rt_stream(stream);
        let rt = self.backend.streams();
        let event = rt.create_event()?;
        if let Err(e) = rt.record_event(event, handle) {
            let _ = rt.destroy_event(event);
            return Err(e);
        }
        Ok(event)
    }

    /// Whether a free may need runtime marks: some stream has runtime work that may be
    /// incomplete, or runs work npumem does not see.
    pub(super) fn rt_any_dirty(&self) -> bool {
        !self.rt.dirty.is_empty() || !self.rt.opaque.is_empty()
    }

    /// Whether every mark in `marks` is complete. A runtime that cannot answer (an error) is
    /// taken as done: waiting forever on a broken event would strand the memory.
    pub(super) fn rt_done(&mut self, marks: &[Handle]) -> bool {
        marks.iter().all(|&m| m == 0 || self.backend.streams().query_event(m).unwrap_or(true))
    }

    /// Destroys the marks a holder owned.
    pub(super) fn rt_release(&mut self, marks: &[Handle]) {
        for &m in marks.iter().filter(|&&m| m != 0) {
            let _ = self.backend.streams().destroy_event(m);
        }
    }

    /// Queues work on `stream`'s runtime queue with `call` (given the runtime and the stream's
    /// handle); returns whether the runtime queued it (false: no queue of its own, the simulated
    /// clock runs it). The stream is dirty from then on.
    pub(super) fn rt_queue(
        &mut self,
        stream: StreamId,
        call: impl FnOnce(&mut dyn crate::stream::RuntimeStreams, Handle) -> Result<bool>,
    ) -> Result<bool> {
        let handle = self.rt_stream(stream);
        let queued = call(self.backend.streams(), handle)?;
        if queued {
            self.rt.dirty.insert(stream);
        }
        Ok(queued)
    }

    /// Blocks the host until `stream`'s runtime work is done (its marks on busy blocks are then
    /// complete, and released).
    pub(super) fn rt_synchronize_stream(&mut self, stream: StreamId) -> Result<()> {
        if self.rt.dirty.remove(&stream) || self.rt.opaque.contains(&stream) {
            let handle = self.rt_stream(stream);
            if let Err(e) = self.backend.streams().synchronize_stream(handle) {
                self.rt.dirty.insert(stream);
                return Err(e);
            }
            self.rt_drop_busy_marks(Some(stream));
        }
        Ok(())
    }

    /// Blocks the host until all of npumem's runtime work is done (its marks on busy blocks are
    /// then complete, and released).
    pub(super) fn rt_synchronize_device(&mut self) -> Result<()> {
        if self.rt_any_dirty() {
            self.backend.streams().synchronize_device()?;
            self.rt.dirty.clear();
            self.rt_drop_busy_marks(None);
        }
        Ok(())
    }

    /// Releases the marks of busy blocks whose runtime work is known complete: `stream`'s, or
    /// every stream's.
    pub(super) fn rt_drop_busy_marks(&mut self, stream: Option<StreamId>) {
        let mut done = Vec::new();
        for b in self.uses.busy.values_mut().flatten() {
            if b.mark != 0 && stream.is_none_or(|s| s == b.stream) {
                done.push(std::mem::take(&mut b.mark));
            }
        }
        self.rt_release(&done);
    }

    /// Makes `stream`'s later runtime work wait for every mark in `marks`.
    pub(super) fn rt_wait_marks(&mut self, stream: StreamId, marks: &[Handle]) -> Result<()> {
        let handle = self.rt_stream(stream);
        for &m in marks.iter().filter(|&&m| m != 0) {
            self.backend.streams().stream_wait_event(handle, m)?;
            self.rt.dirty.insert(stream);
        }
        Ok(())
    }
}
