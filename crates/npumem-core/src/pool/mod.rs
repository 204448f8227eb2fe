//! Allocators: the pluggable layer between `Device` and the `Backend`.
//!
//! An [`Allocator`] turns a booked request into a device address by reserving VA, creating
//! physical memory and mapping it through the backend it is handed; it may cache what it gets
//! back on free. `Device` does the AscendCL checks (sizes, padding, pointers, bounds) and hands an
//! allocator only valid requests and pointers it granted and has not yet freed.
//!
//! Invariant for every allocator: granted ranges `[ptr, ptr + granted)` of live allocations never
//! overlap, `ptr` is 64-byte aligned, `granted >= booked`, and the whole granted range is mapped.

pub mod direct;

pub use direct::DirectAllocator;

use crate::acl::Policy;
use crate::backend::Backend;
use crate::error::Result;
use crate::vm::PageSize;

/// A request that has passed the runtime's checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// Bytes the caller asked for.
    pub size: u64,
    /// Bytes the runtime books (aligned and padded).
    pub booked: u64,
    pub policy: Policy,
}

/// What an allocator handed out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    pub ptr: u64,
    /// Bytes set aside for this allocation (at least `booked`).
    pub granted: u64,
    /// The page size backing it.
    pub page: PageSize,
}

pub trait Allocator: Send {
    /// The family name ("direct", later "npumem", "pytorch", "torch_npu").
    fn name(&self) -> &'static str;

    fn malloc(&mut self, backend: &mut dyn Backend, request: &Request) -> Result<Grant>;

    /// Frees `ptr`, a pointer this allocator granted and that is still live.
    fn free(&mut self, backend: &mut dyn Backend, ptr: u64) -> Result<()>;

    /// Returns cached, unused memory to the backend. Allocators without a cache have nothing to do.
    fn empty_cache(&mut self, _backend: &mut dyn Backend) -> Result<()> {
        Ok(())
    }
}
