//! A planning problem: buffers with half-open lifetimes `[lower, upper)` in steps and sizes in
//! bytes, as in MiniMalloc's CSV format (`id,lower,upper,size`), plus the offset alignment.
//!
//! Invariants: `lower < upper`, `size > 0` and `alignment` a power of two, checked by
//! [`Problem::new`]; aligned sizes and their sums fit in `u64`.

use std::collections::BTreeMap;

use npumem_base::error::{AclError, Result};

/// One buffer: live from step `lower` up to (not including) `upper`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Buffer {
    pub lower: u64,
    pub upper: u64,
    pub size: u64,
}

impl Buffer {
    pub const fn new(lower: u64, upper: u64, size: u64) -> Self {
        Buffer { lower, upper, size }
    }

    /// Whether the two lifetimes share a step.
    pub fn overlaps_in_time(&self, other: &Buffer) -> bool {
        self.lower < other.upper && other.lower < self.upper
    }
}

/// Buffers to place and the alignment of every offset.
#[derive(Clone, Debug)]
pub struct Problem {
    buffers: Vec<Buffer>,
    alignment: u64,
}

impl Problem {
    /// Checks every buffer and the alignment; the error names the first bad buffer by index.
    pub fn new(buffers: Vec<Buffer>, alignment: u64) -> Result<Self> {
        if alignment == 0 || !alignment.is_power_of_two() {
            return Err(AclError::invalid_param(format!(
                "alignment {alignment} is not a power of two; use 1 for none or e.g. 64 or 512"
            )));
        }
        let mut total: u64 = 0;
        for (i, b) in buffers.iter().enumerate() {
            if b.lower >= b.upper {
                return Err(AclError::invalid_param(format!(
                    "buffer {i}: lifetime [{}, {}) is empty; upper must be greater than lower (it is exclusive)",
                    b.lower, b.upper
                )));
            }
            if b.size == 0 {
                return Err(AclError::invalid_param(format!(
                    "buffer {i}: size is 0; every buffer needs at least 1 byte"
                )));
            }
            total = b
                .size
                .checked_next_multiple_of(alignment)
                .and_then(|s| total.checked_add(s))
                .ok_or_else(|| AclError::invalid_param(format!("buffer {i}: sizes add up past 2^64 bytes")))?;
        }
        Ok(Problem { buffers, alignment })
    }

    pub fn buffers(&self) -> &[Buffer] {
        &self.buffers
    }

    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// `size` rounded up to the alignment (a power of two: a mask, not a division; cannot
    /// overflow for sizes and offsets of a plan, whose rounded value `new` checked: adding
    /// `alignment - 1` first would overflow for a size of `u64::MAX` with alignment 1).
    #[inline]
    pub(crate) fn aligned(&self, size: u64) -> u64 {
        (size + (self.alignment - 1)) & !(self.alignment - 1)
    }

    /// Checks that `offsets` are a valid placement: aligned, and no two buffers that are live at
    /// the same step overlap in address. Returns the peak (largest `offset + size`, sizes rounded
    /// up to the alignment).
    /// A sweep over time with the live buffers ordered by offset: O(n log n).
    pub fn validate(&self, offsets: &[u64]) -> Result<u64> {
        if offsets.len() != self.buffers.len() {
            return Err(AclError::invalid_param(format!(
                "{} offsets for {} buffers; give one offset per buffer",
                offsets.len(),
                self.buffers.len()
            )));
        }
        let mut peak = 0u64;
        for (i, (b, &o)) in self.buffers.iter().zip(offsets).enumerate() {
            if o % self.alignment != 0 {
                return Err(AclError::invalid_param(format!(
                    "buffer {i}: offset {o} is not a multiple of the alignment {}",
                    self.alignment
                )));
            }
            let end = o
                .checked_add(self.aligned(b.size))
                .ok_or_else(|| AclError::invalid_param(format!("buffer {i}: offset {o} + size overflows")))?;
            peak = peak.max(end);
        }
        // Events: ends sort before starts at the same step (lifetimes are half-open).
        let mut events: Vec<(u64, bool, usize)> = Vec::with_capacity(2 * self.buffers.len());
        for (i, b) in self.buffers.iter().enumerate() {
            events.push((b.lower, true, i));
            events.push((b.upper, false, i));
        }
        events.sort_unstable();
        let mut live: BTreeMap<(u64, usize), u64> = BTreeMap::new();
        for (_, start, i) in events {
            let key = (offsets[i], i);
            if !start {
                live.remove(&key);
                continue;
            }
            let end = offsets[i] + self.buffers[i].size;
            if let Some((&(o, j), &e)) = live.range(..key).next_back()
                && e > offsets[i]
            {
                return Err(overlap(i, j, offsets[i], o));
            }
            if let Some((&(o, j), _)) = live.range(key..).next()
                && o < end
            {
                return Err(overlap(i, j, offsets[i], o));
            }
            live.insert(key, end);
        }
        Ok(peak)
    }
}

fn overlap(i: usize, j: usize, oi: u64, oj: u64) -> AclError {
    AclError::invalid_param(format!(
        "buffers {i} (offset {oi}) and {j} (offset {oj}) are live at the same step and overlap in address"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_input() {
        assert!(Problem::new(vec![Buffer::new(1, 1, 8)], 1).is_err());
        assert!(Problem::new(vec![Buffer::new(0, 1, 0)], 1).is_err());
        assert!(Problem::new(vec![Buffer::new(0, 1, 8)], 3).is_err());
        assert!(Problem::new(vec![Buffer::new(0, 1, u64::MAX), Buffer::new(0, 1, 2)], 1).is_err());
    }

    #[test]
    fn validate_finds_overlaps_and_accepts_disjoint_lifetimes() {
        let p = Problem::new(vec![Buffer::new(0, 2, 8), Buffer::new(1, 3, 8), Buffer::new(2, 4, 8)], 8).unwrap();
        assert_eq!(p.validate(&[0, 8, 0]).unwrap(), 16);
        assert!(p.validate(&[0, 4, 16]).is_err());
        assert!(p.validate(&[0, 8, 8]).is_err());
        assert!(p.validate(&[0, 0, 16]).is_err());
        assert!(p.validate(&[0, 8]).is_err());
    }
}
