//! `Segment`: one range of device memory obtained from the backend the way `aclrtMalloc` does it:
//! a VA reservation, one physical allocation and one mapping, all of the same size.
//!
//! Invariants: `size` is a multiple of `page`; the reservation starts at `ptr` and is exactly
//! `size` long; `handle` is mapped at `ptr` for the segment's whole life and released with it.

use crate::backend::{Backend, PhysHandle};
use crate::error::{AclError, Result};
use crate::units::checked_align_up;
use crate::vm::{PageKind, PageSize};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub ptr: u64,
    pub size: u64,
    pub page: PageSize,
    pub handle: PhysHandle,
}

impl Segment {
    /// Maps at least `bytes` with the first page kind of `plan` that has the memory; running out
    /// of memory for one kind moves on to the next (the HUGE_FIRST fallback).
    pub fn map(backend: &mut dyn Backend, bytes: u64, plan: &[PageKind]) -> Result<Segment> {
        let mut last_err = None;
        for &kind in plan {
            let page = backend.page_size(kind);
            let size = checked_align_up(bytes, page.bytes())
                .ok_or_else(|| AclError::invalid_param(format!("size {bytes} overflows when rounded to pages")))?;
            let handle = match backend.create_physical(size, kind) {
                Ok(h) => h,
                Err(e) if e.code.is_out_of_memory() => {
                    last_err = Some(e);
                    continue;
                }
                Err(e) => return Err(e),
            };
            let mapped = backend.reserve(size, page.bytes(), None).and_then(|va| {
                backend.map(va, handle).map(|()| va).inspect_err(|_| {
                    let _ = backend.release(va);
                })
            });
            return match mapped {
                Ok(ptr) => Ok(Segment { ptr, size, page, handle }),
                Err(e) => {
                    backend.free_physical(handle)?;
                    Err(e)
                }
            };
        }
        Err(last_err.unwrap_or_else(|| AclError::internal("empty page plan")))
    }

    /// Unmaps the segment and returns its memory and VA to the backend. A failed unmap changes
    /// nothing (the segment stays mapped and can be released later); freeing the memory and the
    /// VA of an unmapped segment cannot fail under the backend contract.
    pub fn unmap(self, backend: &mut dyn Backend) -> Result<()> {
        backend.unmap(self.ptr)?;
        backend.free_physical(self.handle)?;
        backend.release(self.ptr)
    }
}
