//! Allocators: the pluggable layer between `Device` and the `Backend`.
//!
//! An [`Allocator`] turns a checked request into a device address by obtaining [`Segment`]s from
//! the backend (VA reservation + physical memory + mapping) and, for caching allocators, carving
//! blocks out of them and keeping freed blocks for reuse. `Device` does the AscendCL checks
//! (sizes, padding, pointers, bounds) and hands an allocator only valid requests and blocks it
//! granted and has not yet freed.
//!
//! Rules:
//! - granted ranges `[ptr, ptr + granted)` of live blocks never overlap, `ptr` is 64-byte
//!   aligned, `granted >= requested`, and the whole granted range is mapped;
//! - the owner (the `Device`'s live table, or whoever drives an allocator directly) keeps the
//!   one record of each live block, as a [`Granted`]; every free hands back the owner's
//!   `Granted` of a block the allocator granted and has not freed, and every snapshot takes the
//!   `Granted` of every block live in the allocator, in address order (as RMM's `deallocate`
//!   takes the size its caller knows). An allocator keeps per-block records only where its own
//!   rules need them (a caching allocator's split blocks, a segment to unmap);
//! - statistics, segment events and the memory fraction are the family's [`Books`], and
//!   `books().stats` equals a recount of the blocks.

pub mod books;
pub mod caching;
pub mod config;
pub mod direct;
pub mod fragmentation;
#[cfg(test)]
mod held;
pub mod recent;
pub mod segment;
pub mod snapshot;
pub mod stats;
pub mod vmm;

pub use books::Books;
pub use caching::CachingAllocator;
pub use config::{CachingConfig, Family};
pub use direct::DirectAllocator;
pub use fragmentation::{Fragmentation, SegmentUse};
pub use segment::Segment;
pub use snapshot::{Action, BlockSnapshot, EventLog, History, SegmentSnapshot, TraceEntry};
pub use stats::{PoolKind, PoolStats, Stat, Tally};
pub use vmm::{VmmAllocator, VmmConfig};

use crate::acl::Policy;
use crate::backend::Backend;
use crate::error::Result;
use crate::vm::PageSize;

/// A request that has passed the runtime's checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// Bytes the caller asked for.
    pub size: u64,
    /// Bytes the runtime books (aligned and padded, as `aclrtMalloc` does).
    pub booked: u64,
    pub policy: Policy,
}

/// What an allocator handed out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    pub ptr: u64,
    /// Bytes set aside for this allocation (at least the request).
    pub granted: u64,
    /// The page size backing it.
    pub page: PageSize,
}

/// A live block as its owner records it: the grant, and the size the request asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Granted {
    pub ptr: u64,
    /// [`Grant::granted`].
    pub granted: u64,
    /// [`Request::size`] of the malloc that made the block.
    pub requested: u64,
    /// [`Grant::page`].
    pub page: PageSize,
}

impl Grant {
    /// The owner's record of this grant, made for a request of `requested` bytes.
    #[inline]
    pub fn held(&self, requested: u64) -> Granted {
        Granted { ptr: self.ptr, granted: self.granted, requested, page: self.page }
    }
}

pub trait Allocator: Send {
    /// The family name ("direct", "pytorch", "torch_npu", ...).
    fn name(&self) -> &'static str;

    fn malloc(&mut self, backend: &mut dyn Backend, request: &Request) -> Result<Grant>;

    /// Serves requests of `sizes` bytes under `policy` (valid sizes, in order) from blocks it
    /// can hand out without searching or calling the driver (a front cache), appending the
    /// grants to `out`; stops at the first request it cannot serve so and returns how many it
    /// served. The caller sends that one through `malloc`. Allocators without such a cache
    /// serve none.
    fn malloc_cached(&mut self, _sizes: &[u64], _policy: Policy, _out: &mut Vec<Grant>) -> usize {
        0
    }

    /// Frees the live `block`.
    fn free(&mut self, backend: &mut dyn Backend, block: &Granted) -> Result<()>;

    /// Frees `blocks` (live) in order as long as each needs no driver call; returns how many
    /// it freed. The caller frees the next one with `free`.
    fn free_cached(&mut self, _blocks: &[Granted]) -> usize {
        0
    }

    /// Returns cached, unused memory to the backend.
    fn empty_cache(&mut self, backend: &mut dyn Backend) -> Result<()>;

    /// Returns the coldest cached memory to the backend until at most `bytes` are reserved (or
    /// nothing cached is left); returns the bytes still reserved.
    fn trim_to(&mut self, backend: &mut dyn Backend, bytes: u64) -> Result<u64>;

    /// Statistics, segment events and the memory fraction.
    fn books(&self) -> &Books;

    fn books_mut(&mut self) -> &mut Books;

    /// Segments and their blocks, in address order, for `memory_snapshot`; `live` is every
    /// block live in the allocator, in address order.
    fn segments(&self, live: &[Granted]) -> Vec<SegmentSnapshot>;

    /// Where the allocator's memory goes, given every block live in it (`live`, in address
    /// order). The summary (segments, free memory) does not depend on `live`.
    fn fragmentation(&self, live: &[Granted]) -> Fragmentation;
}
