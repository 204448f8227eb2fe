//! The device's trace of allocator actions (`record_memory_history`), in PyTorch's
//! `_record_memory_history` scheme.
//!
//! Rules:
//! - Nothing is recorded while `history` is `None`; `trace` returns at once then.
//! - A free is recorded before the segment events the allocator made while taking the block
//!   back (see `Device::trace`).

use super::*;

/// The trace being recorded and the time its entries count from.
#[derive(Debug)]
pub(super) struct Recording {
    /// The trace of allocator actions, while recording (`record_memory_history`).
    pub(super) history: Option<History>,
    pub(super) started: std::time::Instant,
}

impl Default for Recording {
    fn default() -> Self {
        Recording { history: None, started: std::time::Instant::now() }
    }
}

impl Device {
    /// Starts (with room for `max_entries` trace entries, the oldest dropped first) or stops
    /// recording the allocator's history, as `torch.cuda.memory._record_memory_history` does.
    pub fn record_memory_history(&mut self, enabled: bool, max_entries: usize) {
        self.allocator.books_mut().set_recording(enabled);
        self.allocator.books_mut().take_events();
        self.recording.history = enabled.then(|| History::new(max_entries));
    }

    /// Records `action` for `stream`, after the allocator's segment events that came before it.
    /// A free is recorded before the segment events the allocator made while taking the block back
    /// (a segment is released after the blocks in it, as PyTorch's traces and memory_viz have it):
    /// those wait in the allocator's log until the next entry or `history()`, so a batch of frees
    /// lists every block's free before the segments it emptied. They carry the stream of the first
    /// free since the last flush (a run of frees on several streams gives its segment events the
    /// first one's).
    #[inline]
    pub(super) fn trace(&mut self, action: Action, addr: u64, size: u64, stream: StreamId) {
        if self.recording.history.is_none() {
            return;
        }
        let free = matches!(action, Action::FreeRequested | Action::FreeCompleted);
        if !free {
            self.flush_events(stream);
        }
        if let Some(history) = self.recording.history.as_mut() {
            let time_us = self.recording.started.elapsed().as_micros() as u64;
            history.push(TraceEntry { action, addr, size, stream, time_us });
            if free {
                history.events_stream.get_or_insert(stream);
            }
        }
    }

    pub(super) fn flush_events(&mut self, stream: StreamId) {
        let Some(history) = self.recording.history.as_mut() else { return };
        let time_us = self.recording.started.elapsed().as_micros() as u64;
        let stream = history.events_stream.take().unwrap_or(stream);
        for (action, addr, size) in self.allocator.books_mut().take_events() {
            history.push(TraceEntry { action, addr, size, stream, time_us });
        }
    }

    /// The recorded trace, oldest first (empty when not recording), with the allocator's segment
    /// events not yet moved into it.
    pub fn history(&mut self) -> Vec<TraceEntry> {
        self.flush_events(DEFAULT_STREAM);
        self.recording.history.as_ref().map_or_else(Vec::new, |h| h.entries().copied().collect())
    }
}
