//! `Books`: what every allocator family keeps beside its blocks — the statistics, the log of
//! segment events and the cap on what it may reserve (RMM's `statistics_resource_adaptor` kept
//! inside the resource, so that the hot paths count without a second call).
//!
//! Rules:
//! - each family holds one `Books` and exposes it through [`Allocator::books`] /
//!   [`Allocator::books_mut`](super::Allocator::books_mut); nothing else keeps statistics,
//!   events or the memory fraction of an allocator;
//! - the family updates `stats` and pushes `events` as it works; owners read them, reset peaks,
//!   switch recording and take events only through these books;
//! - a capped family's limit is `fraction × capacity`; an uncapped one (`direct`) refuses
//!   `set_memory_fraction` with `FeatureUnsupported`.
//!
//! [`Allocator::books`]: super::Allocator::books

use super::{Action, EventLog, PoolStats};
use crate::error::{AclError, ErrorCode, Result};

/// The cap on what an allocator may reserve.
#[derive(Clone, Copy, Debug)]
enum Cap {
    /// `fraction` of a device of `capacity` bytes (`set_per_process_memory_fraction`).
    Fraction { capacity: u64, fraction: f64 },
    /// No limit of its own: the `family` maps what it is asked for.
    Uncapped { family: &'static str },
}

#[derive(Debug)]
pub struct Books {
    pub stats: PoolStats,
    pub events: EventLog,
    cap: Cap,
}

impl Books {
    /// Books of a family that may reserve at most `fraction` of `capacity` bytes.
    pub fn capped(stats: PoolStats, capacity: u64, fraction: f64) -> Self {
        Books { stats, events: EventLog::default(), cap: Cap::Fraction { capacity, fraction } }
    }

    /// Books of a `family` with no limit of its own.
    pub fn uncapped(stats: PoolStats, family: &'static str) -> Self {
        Books { stats, events: EventLog::default(), cap: Cap::Uncapped { family } }
    }

    /// The share of the device the family may reserve (1 for an uncapped one).
    #[inline]
    pub fn memory_fraction(&self) -> f64 {
        match self.cap {
            Cap::Fraction { fraction, .. } => fraction,
            Cap::Uncapped { .. } => 1.0,
        }
    }

    /// The most the family may reserve, in bytes.
    #[inline]
    pub fn limit(&self) -> u64 {
        match self.cap {
            Cap::Fraction { capacity, fraction } => (capacity as f64 * fraction) as u64,
            Cap::Uncapped { .. } => u64::MAX,
        }
    }

    /// Bytes reserved from the device.
    #[inline]
    pub fn reserved(&self) -> u64 {
        self.stats.reserved_bytes.all.current
    }

    /// Caps what the family may reserve at `fraction` of the device
    /// (`set_per_process_memory_fraction`).
    pub fn set_memory_fraction(&mut self, fraction: f64) -> Result<()> {
        match &mut self.cap {
            Cap::Fraction { fraction: f, .. } => {
                check_fraction(fraction)?;
                *f = fraction;
                Ok(())
            }
            Cap::Uncapped { family } => Err(AclError::new(
                ErrorCode::FeatureUnsupported,
                format!(
                    "the {family} allocator has no limit of its own; use a caching allocator (npumem, pytorch, \
                     torch_npu)"
                ),
            )),
        }
    }

    pub fn reset_peak_stats(&mut self) {
        self.stats.reset_peaks();
    }

    /// Starts or stops logging segment events (alloc/free/map/unmap of device memory).
    pub fn set_recording(&mut self, on: bool) {
        self.events.enabled = on;
    }

    /// The segment events logged since the last call.
    pub fn take_events(&mut self) -> Vec<(Action, u64, u64)> {
        self.events.take()
    }
}

/// Checks a `set_per_process_memory_fraction` argument.
pub fn check_fraction(fraction: f64) -> Result<()> {
    if (0.0..=1.0).contains(&fraction) {
        Ok(())
    } else {
        Err(AclError::invalid_param(format!("the memory fraction must be in [0, 1], got {fraction}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_capped_family_takes_fractions_in_range_and_an_uncapped_one_none() {
        let mut capped = Books::capped(PoolStats::default(), 1000, 1.0);
        assert_eq!(capped.limit(), 1000);
        capped.set_memory_fraction(0.25).unwrap();
        assert_eq!((capped.limit(), capped.memory_fraction()), (250, 0.25));
        let err = capped.set_memory_fraction(1.5).unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidParam);
        assert!(err.message.contains("got 1.5"), "{}", err.message);
        assert_eq!(capped.limit(), 250, "a refused fraction changes nothing");
        let mut uncapped = Books::uncapped(PoolStats::default(), "direct");
        let err = uncapped.set_memory_fraction(0.5).unwrap_err();
        assert_eq!(err.code, ErrorCode::FeatureUnsupported);
        assert!(err.message.starts_with("the direct allocator has no limit of its own"), "{}", err.message);
        assert_eq!(uncapped.limit(), u64::MAX);
    }

    #[test]
    fn events_are_logged_only_while_recording() {
        let mut books = Books::uncapped(PoolStats::default(), "direct");
        books.events.push(Action::SegmentAlloc, 1, 2);
        books.set_recording(true);
        books.events.push(Action::SegmentFree, 3, 4);
        assert_eq!(books.take_events(), vec![(Action::SegmentFree, 3, 4)]);
        assert!(books.take_events().is_empty());
    }
}
