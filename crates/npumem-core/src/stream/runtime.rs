//! `RuntimeStreams`: the stream half of the backend seam — a backend's own streams and events
//! (an accelerator runtime's: AscendCL, the CUDA driver), beside npumem's simulated clock.
//!
//! Every backend has one. The simulator and host memory have no queue of their own: their
//! `NoRuntime` accepts every call and completes everything at once, so the simulated clock
//! (`Scheduler`) alone decides when work is done. A runtime-backed backend returns its loaded
//! library's streams and events: the device then queues async copies and memsets on the
//! runtime's streams (the runtime moves the bytes), records the runtime's events beside the
//! simulated ones, and takes a block freed under queued work back only once the runtime's event
//! says that work is done (and the simulated clock agrees, for simulated kernels).
//!
//! Handles are the runtime's own (`aclrtStream`, `CUstream`, events), as integers; 0 is the
//! default stream. Invariants every implementation keeps: a call on a handle it did not create
//! (or destroyed) is an error, never undefined behaviour; `query_event` of an event recorded
//! after some work is true only once that work is complete; `synchronize_*` return once the work
//! waited for is complete; nothing here blocks except the `synchronize_*` calls.

use crate::error::Result;

/// A runtime's stream or event handle (0: the default stream, or no event).
pub type Handle = u64;

pub trait RuntimeStreams: Send {
    /// Whether this runtime has a queue of its own (false: the simulated clock is all there is).
    fn is_real(&self) -> bool {
        false
    }

    fn create_stream(&mut self) -> Result<Handle> {
        Ok(0)
    }

    fn destroy_stream(&mut self, _stream: Handle) -> Result<()> {
        Ok(())
    }

    fn create_event(&mut self) -> Result<Handle> {
        Ok(0)
    }

    fn destroy_event(&mut self, _event: Handle) -> Result<()> {
        Ok(())
    }

    /// The event completes once the stream's work queued so far has.
    fn record_event(&mut self, _event: Handle, _stream: Handle) -> Result<()> {
        Ok(())
    }

    /// The stream's later work starts once the event has completed.
    fn stream_wait_event(&mut self, _stream: Handle, _event: Handle) -> Result<()> {
        Ok(())
    }

    /// Whether the event's work is complete (an event never recorded counts as complete).
    fn query_event(&mut self, _event: Handle) -> Result<bool> {
        Ok(true)
    }

    fn synchronize_event(&mut self, _event: Handle) -> Result<()> {
        Ok(())
    }

    fn synchronize_stream(&mut self, _stream: Handle) -> Result<()> {
        Ok(())
    }

    fn synchronize_device(&mut self) -> Result<()> {
        Ok(())
    }

    /// Queues a copy of `count` bytes (device or runtime-pinned host addresses) on the stream;
    /// false when this runtime has no queue (the device then applies the copy on the simulated
    /// clock).
    fn memcpy_async(&mut self, _dst: u64, _src: u64, _count: u64, _stream: Handle) -> Result<bool> {
        Ok(false)
    }

    /// Queues a byte fill on the stream; false when this runtime has no queue.
    fn memset_async(&mut self, _dst: u64, _value: u8, _count: u64, _stream: Handle) -> Result<bool> {
        Ok(false)
    }
}

/// The stream layer of a backend without a runtime of its own: everything completes at once,
/// and the simulated clock decides.
#[derive(Debug, Default)]
pub struct NoRuntime;

impl RuntimeStreams for NoRuntime {}
