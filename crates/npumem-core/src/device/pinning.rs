//! Holds and tags on live allocations: a pinned allocation (a direct view of its memory, or an
//! owning object such as `Device.buffer`) cannot be freed or unmapped; a tag names where an
//! allocation came from in sanitizer findings and leak reports.
//!
//! Rules:
//! - Only memory of this process (`Backend::host_accessible`) can be viewed directly.
//! - A tag is set only on a live allocation's start.

use super::*;

impl Device {
    /// Pins the live allocation (or `map_mem` mapping) holding `[ptr, ptr + len)` for a direct
    /// view of its memory (backends whose memory is this process's, i.e. the host backend): it
    /// cannot be freed (or unmapped) until `unpin`. Returns its start.
    pub fn pin(&mut self, ptr: u64, len: u64) -> Result<u64> {
        if !self.backend.host_accessible() {
            return Err(self.unsupported(
                "memory of this process: its bytes live in the simulator (copy them, or use backend=\"host\")",
            ));
        }
        if self.side(ptr, len.max(1), "view")? != Side::Device {
            return Err(AclError::rt_param(format!(
                "{ptr:#x} is malloc_host memory, already a host address: view it directly"
            )));
        }
        // A live allocation, or a range the program mapped with map_mem (classified above).
        let base = self
            .containing(ptr)
            .map(|a| a.ptr)
            .or_else(|| self.user_vmm.mapping_of(ptr, 1))
            .ok_or_else(|| AclError::internal(format!("{ptr:#x} is device memory of no allocation or mapping")))?;
        self.pins.add(base);
        Ok(base)
    }

    /// `malloc_on` (with `aclrtMalloc`'s booking) for an object that owns the allocation
    /// (`Device.buffer`), pinned in the same call: a plain `free` of it is refused until the
    /// owner's `free_held`.
    pub fn malloc_held(&mut self, size: u64, policy: Policy, stream: StreamId) -> Result<u64> {
        let ptr = self.malloc_on(size, policy, true, stream)?;
        self.pins.add(ptr);
        Ok(ptr)
    }

    /// The owner's free of a `malloc_held` allocation: releases its hold, then frees it as
    /// `free` does (refused while a view still pins it; the hold is released all the same).
    pub fn free_held(&mut self, ptr: u64) -> Result<()> {
        self.unpin(ptr);
        self.free_on(ptr, None)
    }

    /// Releases one pin of the allocation at `base`.
    pub fn unpin(&mut self, base: u64) {
        self.pins.release(base);
    }

    /// The error for a free (or unmap) of a pinned allocation (or mapping).
    pub(super) fn pinned(&self, ptr: u64) -> Option<AclError> {
        let n = self.pins.count(ptr);
        if n == 0 {
            return None;
        }
        Some(AclError::bad_free(format!(
            "the memory at {ptr:#x} is held by {n} view(s) or owner(s) (to_numpy(copy=False), Device.buffer); \
             delete them before freeing or unmapping it"
        )))
    }

    /// Tags the live allocation at `ptr` with where it came from (a call site, a tensor name);
    /// sanitizer findings and leak reports carry it.
    pub fn set_tag(&mut self, ptr: u64, tag: &str) -> Result<()> {
        if !self.live.contains(ptr) {
            return Err(AclError::rt_param(format!(
                "{ptr:#x} is not a live allocation; tag the pointer malloc returned"
            )));
        }
        self.tags.insert(ptr, tag.to_string());
        Ok(())
    }

    /// The tag of the live allocation at `ptr`.
    pub fn tag(&self, ptr: u64) -> Option<&str> {
        self.tags.get(&ptr).map(String::as_str)
    }
}
