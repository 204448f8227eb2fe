//! The stream half of [`DriverBackend`]: the runtime's streams and events, with books of what
//! the backend created.
//!
//! - An event the backend did not create (or destroyed) is an error before the runtime sees it.
//! - Streams other than its own pass through: the runtime checks them.

use super::*;

impl<D: Driver> DriverBackend<D> {
    fn known_event(&self, event: Handle) -> Result<()> {
        if self.events.contains(&event) {
            Ok(())
        } else {
            Err(AclError::new(
                ErrorCode::RtInvalidHandle,
                format!("event {event:#x} is not one the {} backend created (or it was destroyed)", self.name()),
            ))
        }
    }
}

/// The runtime's own streams and events (the stream half of the seam), with books of what this
/// backend created: an event it did not create (or destroyed) is an error before the runtime
/// sees it; streams other than its own pass through (a framework's stream adopted by the device
/// is the program's, and the runtime checks it).
impl<D: Driver> RuntimeStreams for DriverBackend<D> {
    fn is_real(&self) -> bool {
        self.driver.is_real()
    }

    fn create_stream(&mut self) -> Result<Handle> {
        let stream = self.driver.create_stream()?;
        self.streams.insert(stream);
        Ok(stream)
    }

    fn destroy_stream(&mut self, stream: Handle) -> Result<()> {
        if !self.streams.contains(&stream) {
            return Err(AclError::new(
                ErrorCode::RtInvalidHandle,
                format!("stream {stream:#x} is not one the {} backend created (or it was destroyed)", self.name()),
            ));
        }
        self.driver.destroy_stream(stream)?;
        self.streams.remove(&stream);
        Ok(())
    }

    fn create_event(&mut self) -> Result<Handle> {
        let event = match self.spare_events.pop() {
            Some(event) => {
                self.reissued.insert(event);
                event
            }
            None => self.driver.create_event()?,
        };
        self.events.insert(event);
        Ok(event)
    }

    fn destroy_event(&mut self, event: Handle) -> Result<()> {
        self.known_event(event)?;
        // Only an event whose latest record has completed is kept: waits on it wait for
        // nothing, and queries answer as for a new event until it is recorded (`reissued`).
        let reissued = self.reissued.remove(&event);
        if self.spare_events.len() < EVENT_POOL && (reissued || self.driver.query_event(event).unwrap_or(false)) {
            self.spare_events.push(event);
        } else {
            self.driver.destroy_event(event)?;
        }
        self.events.remove(&event);
        Ok(())
    }

    fn record_event(&mut self, event: Handle, stream: Handle) -> Result<()> {
        self.known_event(event)?;
        self.driver.record_event(event, stream)?;
        self.reissued.remove(&event);
        Ok(())
    }

    fn stream_wait_event(&mut self, stream: Handle, event: Handle) -> Result<()> {
        self.known_event(event)?;
        self.driver.stream_wait_event(stream, event)
    }

    fn query_event(&mut self, event: Handle) -> Result<bool> {
        self.known_event(event)?;
        if self.reissued.contains(&event) {
            return Ok(self.driver.fresh_event_complete());
        }
        self.driver.query_event(event)
    }

    fn synchronize_event(&mut self, event: Handle) -> Result<()> {
        self.known_event(event)?;
        self.driver.synchronize_event(event)
    }

    fn synchronize_stream(&mut self, stream: Handle) -> Result<()> {
        self.driver.synchronize_stream(stream)
    }

    fn synchronize_device(&mut self) -> Result<()> {
        self.driver.synchronize_device()
    }

    fn memcpy_async(&mut self, dst: u64, src: u64, count: u64, stream: Handle) -> Result<bool> {
        for (addr, role) in [(dst, "destination"), (src, "source")] {
            if self.owns(addr) {
                self.ledger
                    .space
                    .check_mapped(addr, count)
                    .map_err(|e| AclError::new(e.code, format!("{role}: {}", e.message)))?;
            }
        }
        let queued = self.driver.memcpy_async(dst, src, count, stream)?;
        if queued {
            self.ledger.counters.bytes_read += count;
            self.ledger.counters.bytes_written += count;
        }
        Ok(queued)
    }

    fn memset_async(&mut self, dst: u64, value: u8, count: u64, stream: Handle) -> Result<bool> {
        self.ledger.space.check_mapped(dst, count)?;
        let queued = self.driver.memset_async(dst, value, count, stream)?;
        if queued {
            self.ledger.counters.bytes_written += count;
        }
        Ok(queued)
    }
}
