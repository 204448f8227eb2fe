//! `Held`: the record of live blocks a test keeps when it drives an allocator directly (what the
//! `Device`'s live table is to an allocator under a device).
//!
//! Rules:
//! - every block `malloc` grants is held, as its `Granted`, until `free` succeeds;
//! - `free` hands the allocator the held `Granted`, never one made up;
//! - `live` lists the held blocks in address order, as snapshots take them.

use std::collections::BTreeMap;

use super::{Allocator, Grant, Granted, Request};
use crate::backend::Backend;
use crate::error::Result;

#[derive(Debug, Default)]
pub(crate) struct Held(BTreeMap<u64, Granted>);

impl Held {
    pub(crate) fn malloc(
        &mut self,
        allocator: &mut (impl Allocator + ?Sized),
        backend: &mut dyn Backend,
        request: &Request,
    ) -> Result<Grant> {
        let grant = allocator.malloc(backend, request)?;
        let earlier = self.0.insert(grant.ptr, grant.held(request.size));
        assert!(earlier.is_none(), "{:#x} granted twice", grant.ptr);
        Ok(grant)
    }

    /// Frees the held block at `ptr`; it stays held if the allocator fails.
    pub(crate) fn free(
        &mut self,
        allocator: &mut (impl Allocator + ?Sized),
        backend: &mut dyn Backend,
        ptr: u64,
    ) -> Result<()> {
        let block = *self.0.get(&ptr).unwrap_or_else(|| panic!("{ptr:#x} is not held"));
        allocator.free(backend, &block)?;
        self.0.remove(&ptr);
        Ok(())
    }

    pub(crate) fn live(&self) -> Vec<Granted> {
        self.0.values().copied().collect()
    }
}
