//! [`Bound`]: a runtime with the backend's device (AscendCL) or context (CUDA) current on the
//! calling thread for one call, and the thread's own current again when the call is over.
//!
//! - frameworks cache the thread's current device and call the allocator from any thread with
//!   the block's device and no guard of their own (torch_npu's `NPUFunctions.cpp` keeps a
//!   `thread_local` device and skips `aclrtSetDevice` when it believes it current; the pluggable
//!   allocators call `free` with the block's device), so every runtime call npumem makes leaves
//!   the caller's device or context as it found it;
//! - a thread whose current one is already the backend's is not switched (no runtime call);
//! - a thread with none current gets the backend's for the call and, where the runtime can clear
//!   it (CUDA: `cuCtxSetCurrent(NULL)`), none again after; AscendCL has no call that clears a
//!   thread's device short of `aclrtResetDevice`, which would release the device's resources, so
//!   there the backend's device stays current;
//! - a restore that fails cannot be reported from a destructor; it restores a device or context
//!   the runtime gave the thread itself, so it fails only with a runtime that is already broken.

use crate::error::Result;

/// A runtime whose calling thread has one current device or context, named by a number.
pub trait ThreadCurrent: Sync + 'static {
    /// The calling thread's current device or context, `None` when it has none.
    fn current(&self) -> Option<u64>;
    /// Makes `target` current on the calling thread.
    fn make_current(&self, target: u64) -> Result<()>;
    /// Makes `previous` current again (`None`: clears it where the runtime can).
    fn restore(&self, previous: Option<u64>);
}

/// `rt` with a target current on the calling thread until this goes.
#[must_use = "the device is current only while the guard lives"]
pub struct Bound<R: ThreadCurrent> {
    rt: &'static R,
    /// What was current before the switch; `None` when nothing was switched.
    previous: Option<Option<u64>>,
}

impl<R: ThreadCurrent> Bound<R> {
    /// Makes `target` current on the calling thread (unless it is already).
    pub fn new(rt: &'static R, target: u64) -> Result<Bound<R>> {
        let current = rt.current();
        if current == Some(target) {
            return Ok(Bound { rt, previous: None });
        }
        rt.make_current(target)?;
        Ok(Bound { rt, previous: Some(current) })
    }
}

impl<R: ThreadCurrent> std::ops::Deref for Bound<R> {
    type Target = R;

    fn deref(&self) -> &R {
        self.rt
    }
}

impl<R: ThreadCurrent> Drop for Bound<R> {
    fn drop(&mut self) {
        if let Some(previous) = self.previous {
            self.rt.restore(previous);
        }
    }
}
