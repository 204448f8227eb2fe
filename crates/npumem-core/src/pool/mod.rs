//! Allocators: the pluggable layer between `Device` and the `Backend`.
//!
//! An [`Allocator`] turns a checked request into a device address by obtaining [`Segment`]s from
//! the backend (VA reservation + physical memory + mapping) and, for caching allocators, carving
//! blocks out of them and keeping freed blocks for reuse. `Device` does the AscendCL checks
//! (sizes, padding, pointers, bounds) and hands an allocator only valid requests and pointers it
//! granted and has not yet freed.
//!
//! Invariant for every allocator: granted ranges `[ptr, ptr + granted)` of live allocations never
//! overlap, `ptr` is 64-byte aligned, `granted >= requested`, the whole granted range is mapped,
//! and `stats()` equals a recount of the blocks.
//!
//! Owner tracking: an allocator may let its owner keep the one record of each live block
//! ([`Allocator::track_blocks_for_owner`]; the `Device`'s live table does). It then keeps no
//! per-block record of its own for the blocks it can find by address (the npumem pool's pooled
//! blocks), and the owner hands back, on every free and snapshot, the [`Granted`] facts the
//! malloc returned (`granted` and `page` from the [`Grant`], `requested` the [`Request`]'s
//! size), exactly and for every block the allocator still holds live.

pub mod block_map;
pub mod caching;
pub mod config;
pub mod direct;
pub mod fragmentation;
pub mod recent;
pub mod segment;
pub mod snapshot;
pub mod stats;
pub mod vmm;

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

/// A live block as its owner records it (owner tracking): the grant, and the size the request
/// asked for.
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

pub trait Allocator: Send {
    /// The family name ("direct", "pytorch", "torch_npu", ...).
    fn name(&self) -> &'static str;

    fn malloc(&mut self, backend: &mut dyn Backend, request: &Request) -> Result<Grant>;

    /// Frees `ptr`, a pointer this allocator granted and that is still live.
    fn free(&mut self, backend: &mut dyn Backend, ptr: u64) -> Result<()>;

    /// Returns cached, unused memory to the backend.
    fn empty_cache(&mut self, backend: &mut dyn Backend) -> Result<()>;

    /// Returns the coldest cached memory to the backend until at most `bytes` are reserved (or
    /// nothing cached is left); returns the bytes still reserved.
    fn trim_to(&mut self, backend: &mut dyn Backend, bytes: u64) -> Result<u64>;

    /// Caps what the allocator may reserve at `fraction` of the device
    /// (`set_per_process_memory_fraction`).
    fn set_memory_fraction(&mut self, fraction: f64) -> Result<()>;

    fn stats(&self) -> &PoolStats;

    fn stats_mut(&mut self) -> &mut PoolStats;

    /// The allocator's log of segment events.
    fn events(&mut self) -> &mut EventLog;

    fn fragmentation(&self) -> Fragmentation;

    /// Segments and their blocks, in address order, for `memory_snapshot`.
    fn segments(&self) -> Vec<SegmentSnapshot>;

    /// Serves requests of `sizes` bytes under `policy` (valid sizes, in order) from blocks it
    /// can hand out without searching or calling the driver (a front cache), appending the
    /// grants to `out`; stops at the first request it cannot serve so and returns how many it
    /// served. The caller sends that one through `malloc`. Allocators without such a cache
    /// serve none.
    fn malloc_cached(&mut self, _sizes: &[u64], _policy: Policy, _out: &mut Vec<Grant>) -> usize {
        0
    }

    /// Frees `ptrs` (granted and live) in order as long as each needs no driver call; returns
    /// how many it freed. The caller frees the next one with `free`.
    fn free_cached(&mut self, _ptrs: &[u64]) -> usize {
        0
    }

    /// The owner asks to keep the one record of each live block (before any malloc): from then
    /// on it frees blocks with `free_block` / `free_cached_blocks` (never `free` /
    /// `free_cached`) and reads snapshots with `segments_with` / `fragmentation_with`, passing
    /// the [`Granted`] of every block live in the allocator. Returns whether the allocator
    /// agreed; the default (and any allocator holding blocks already) keeps its own records.
    fn track_blocks_for_owner(&mut self) -> bool {
        false
    }

    /// Frees the live `block` (`free` for an allocator that keeps its own records).
    fn free_block(&mut self, backend: &mut dyn Backend, block: &Granted) -> Result<()> {
        self.free(backend, block.ptr)
    }

    /// `free_cached` of `blocks` (live, in order): frees them as long as each needs no driver
    /// call; returns how many it freed.
    fn free_cached_blocks(&mut self, blocks: &[Granted]) -> usize {
        blocks.iter().take_while(|b| self.free_cached(&[b.ptr]) == 1).count()
    }

    /// `segments`, given every block live in the allocator (`live`, in address order).
    fn segments_with(&self, _live: &[Granted]) -> Vec<SegmentSnapshot> {
        self.segments()
    }

    /// `fragmentation`, given every block live in the allocator (`live`, in address order).
    fn fragmentation_with(&self, _live: &[Granted]) -> Fragmentation {
        self.fragmentation()
    }

    fn reset_peak_stats(&mut self) {
        self.stats_mut().reset_peaks();
    }

    /// Starts or stops logging segment events (alloc/free/map/unmap of device memory).
    fn set_recording(&mut self, on: bool) {
        self.events().enabled = on;
    }

    /// The segment events logged since the last call.
    fn take_events(&mut self) -> Vec<(Action, u64, u64)> {
        self.events().take()
    }
}
