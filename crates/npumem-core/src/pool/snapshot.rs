//! Snapshot types: the allocator's segments and blocks, and the trace of what happened, shaped
//! like PyTorch's `torch.cuda.memory._snapshot()` so its memory_viz tooling reads them.
//!
//! Invariants: the blocks of a `SegmentSnapshot` tile it in address order; `History` keeps at
//! most `max_entries` entries, dropping the oldest first (PyTorch's ring buffer).

use std::collections::VecDeque;

use super::PoolKind;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockSnapshot {
    pub address: u64,
    pub size: u64,
    pub requested_size: u64,
    pub allocated: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentSnapshot {
    pub address: u64,
    pub total_size: u64,
    pub pool: PoolKind,
    pub is_expandable: bool,
    pub blocks: Vec<BlockSnapshot>,
}

/// The actions of PyTorch's device traces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    Oom,
}

impl Action {
    pub fn name(self) -> &'static str {
        match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentAlloc => "segment_alloc",
            Action::SegmentFree => "segment_free",
            Action::SegmentMap => "segment_map",
            Action::SegmentUnmap => "segment_unmap",
            Action::Oom => "oom",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceEntry {
    pub action: Action,
    /// The block's (or segment's) address; for `Oom`, the device's free bytes at the failure
    /// (PyTorch's trace entry names it `device_free`).
    pub addr: u64,
    pub size: u64,
    /// The stream the allocation is ordered on (0: the default stream); segment events carry
    /// the stream of the call that made them.
    pub stream: u64,
    pub time_us: u64,
}

/// Segment-level events an allocator produced since they were last taken.
#[derive(Debug, Default)]
pub struct EventLog {
    pub enabled: bool,
    pending: Vec<(Action, u64, u64)>,
}

impl EventLog {
    #[inline]
    pub fn push(&mut self, action: Action, addr: u64, size: u64) {
        if self.enabled {
            self.pending.push((action, addr, size));
        }
    }

    pub fn take(&mut self) -> Vec<(Action, u64, u64)> {
        std::mem::take(&mut self.pending)
    }
}

/// The bounded history of trace entries.
#[derive(Debug)]
pub struct History {
    pub max_entries: usize,
    entries: VecDeque<TraceEntry>,
    /// The stream of the free whose segment events still wait in the allocator's log (they are
    /// recorded after the free, on its stream).
    pub events_stream: Option<u64>,
}

impl History {
    pub fn new(max_entries: usize) -> Self {
        History { max_entries, entries: VecDeque::new(), events_stream: None }
    }

    pub fn push(&mut self, entry: TraceEntry) {
        if self.max_entries == 0 {
            return;
        }
        if self.entries.len() == self.max_entries {
            self.entries.pop_front();
        }
        self.entries.push_back(entry);
    }

    pub fn entries(&self) -> impl Iterator<Item = &TraceEntry> {
        self.entries.iter()
    }
}
