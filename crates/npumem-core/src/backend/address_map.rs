//! `AddressMap`: the bookkeeping every backend keeps of its address space — the VA reservations
//! (a [`VaSpace`]) and the mappings in them — and the checks the VMM contract puts on reserve,
//! release and map, so that each backend only does what is its own (frames and a page table, or
//! system calls).
//!
//! Invariants: every mapping lies inside one live reservation, starts at a multiple of its page
//! size and overlaps no other; a reservation with a mapping in it is not released.

use std::collections::BTreeMap;

use super::PhysHandle;
use crate::error::{AclError, ErrorCode, Result};
use crate::units::format_size;
use crate::vm::{PageSize, VaSpace};

/// One mapping: `size` bytes of the physical allocation `handle`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub handle: PhysHandle,
    pub size: u64,
}

#[derive(Debug)]
pub struct AddressMap {
    va: VaSpace,
    /// Mappings by start address.
    mappings: BTreeMap<u64, Mapping>,
}

impl AddressMap {
    pub fn new(va: VaSpace) -> Self {
        AddressMap { va: va.with_containment_index(), mappings: BTreeMap::new() }
    }

    /// Reserves `size` bytes aligned to `align`, at `hint` if given (and free).
    pub fn reserve(&mut self, size: u64, align: u64, hint: Option<u64>) -> Result<u64> {
        match hint {
            Some(at) => self.va.reserve_at(at, size, align),
            None => self.va.reserve(size, align),
        }
    }

    /// Releases the reservation that starts at `va`, which must have nothing mapped in it.
    pub fn release(&mut self, va: u64) -> Result<()> {
        self.check_release(va)?;
        self.va.release(va).map(|_| ())
    }

    /// Checks that `va` starts a reservation with nothing mapped in it (what `release` needs).
    pub fn check_release(&self, va: u64) -> Result<()> {
        let Some(len) = self.va.reservation_at(va) else {
            return Err(AclError::invalid_param(format!(
                "{va:#x} is not the start of a VA reservation; pass the address reserve returned"
            )));
        };
        if let Some((&m, _)) = self.mappings.range(va..va + len).next() {
            return Err(AclError::rt_param(format!(
                "the reservation at {va:#x} still has a mapping at {m:#x}; unmap it before releasing"
            )));
        }
        Ok(())
    }

    /// Whether `va` lies inside a live reservation.
    pub fn reserved(&self, va: u64) -> bool {
        self.va.reservation_containing(va).is_some()
    }

    /// Checks that `size` bytes of `page` pages may be mapped at `va`: inside one reservation,
    /// page aligned, over nothing mapped.
    pub fn check_map(&self, va: u64, size: u64, page: PageSize) -> Result<()> {
        let inside = self
            .va
            .reservation_containing(va)
            .is_some_and(|(s, l)| va.checked_add(size).is_some_and(|end| end <= s + l));
        if !inside {
            return Err(AclError::rt_param(format!(
                "cannot map {} at {va:#x}: the range is not inside one VA reservation",
                format_size(size)
            )));
        }
        if va % page.bytes() != 0 {
            return Err(AclError::new(
                ErrorCode::RtAddrUnaligned,
                format!("cannot map {} pages at {va:#x}: the address is not page aligned", page.label()),
            ));
        }
        if let Some((&m, mp)) = self.mappings.range(..va + size).next_back() {
            if m + mp.size > va {
                return Err(AclError::rt_param(format!(
                    "cannot map at {va:#x}: the range overlaps the mapping at {m:#x}; unmap it first"
                )));
            }
        }
        Ok(())
    }

    /// Records a mapping that `check_map` allowed.
    pub fn insert(&mut self, va: u64, mapping: Mapping) {
        self.mappings.insert(va, mapping);
    }

    /// The mapping that starts at `va`.
    pub fn mapping_at(&self, va: u64) -> Result<Mapping> {
        self.mappings.get(&va).copied().ok_or_else(|| {
            AclError::rt_param(format!("nothing is mapped starting at {va:#x}; pass the address given to map"))
        })
    }

    /// Forgets the mapping that starts at `va`.
    pub fn remove(&mut self, va: u64) -> Option<Mapping> {
        self.mappings.remove(&va)
    }

    /// The mapping holding `va`, as (start, mapping).
    pub fn containing(&self, va: u64) -> Option<(u64, Mapping)> {
        self.mappings.range(..=va).next_back().filter(|&(&m, mp)| va < m + mp.size).map(|(&m, &mp)| (m, mp))
    }

    /// The window reservations come from, `[start, end)`.
    pub fn window(&self) -> (u64, u64) {
        self.va.window()
    }

    /// Checks that every byte of `[va, va + len)` is mapped.
    pub fn check_mapped(&self, va: u64, len: u64) -> Result<()> {
        let end = va.checked_add(len).ok_or_else(|| {
            AclError::rt_param(format!("{len} bytes at {va:#x} run past the end of the address space"))
        })?;
        let mut at = va;
        while at < end {
            let Some((m, mp)) = self.containing(at) else {
                return Err(AclError::rt_param(format!("device address {at:#x} is not mapped")));
            };
            at = m + mp.size;
        }
        Ok(())
    }

    /// The mappings, as (start, mapping), in address order.
    pub fn mappings(&self) -> Vec<(u64, Mapping)> {
        self.mappings.iter().map(|(&m, &mp)| (m, mp)).collect()
    }

    /// The live reservations.
    pub fn reservation_count(&self) -> usize {
        self.va.reservation_count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::MIB;

    #[test]
    fn release_takes_exactly_a_reservation_start_with_nothing_mapped() {
        let mut m = AddressMap::new(VaSpace::default());
        let va = m.reserve(4 * MIB, 2 * MIB, None).unwrap();
        assert_eq!(m.release(va + 4096).unwrap_err().code, ErrorCode::InvalidParam, "inside, not the start");
        assert_eq!(m.release(va + 4 * MIB).unwrap_err().code, ErrorCode::InvalidParam, "just past it");
        m.check_map(va + 2 * MIB, 2 * MIB, PageSize::Size2M).unwrap();
        m.insert(va + 2 * MIB, Mapping { handle: 1, size: 2 * MIB });
        assert_eq!(m.release(va).unwrap_err().code, ErrorCode::RtParamInvalid, "a mapping in it");
        assert!(m.check_map(va + 2 * MIB, 4096, PageSize::Size4K).is_err(), "overlap");
        assert!(m.check_map(va + 2 * MIB, 4 * MIB, PageSize::Size2M).is_err(), "past the reservation");
        assert_eq!(m.remove(va + 2 * MIB), Some(Mapping { handle: 1, size: 2 * MIB }));
        m.release(va).unwrap();
        assert!(m.release(va).is_err(), "released twice");
        assert_eq!(m.reservation_count(), 0);
    }
}
