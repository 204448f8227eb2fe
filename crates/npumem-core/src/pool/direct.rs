//! `DirectAllocator`: the no-cache baseline, what plain `aclrtMalloc` / `aclrtFree` cost.
//!
//! Every malloc reserves VA, creates physical memory of the policy's page kind and maps it; every
//! free unmaps, frees the physical memory and releases the VA. HUGE_FIRST falls back from 2 MiB to
//! normal pages when the huge attempt runs out of memory, as the real runtime does.
//!
//! Invariant: `blocks` maps each live pointer to the physical handle mapped there; the VA
//! reservation starts at the pointer and spans exactly the granted bytes.

use std::collections::HashMap;

use super::{Allocator, Grant, Request};
use crate::backend::{Backend, PhysHandle};
use crate::error::{AclError, Result};
use crate::policy::page_plan;
use crate::units::checked_align_up;

#[derive(Debug, Default)]
pub struct DirectAllocator {
    blocks: HashMap<u64, PhysHandle>,
}

impl DirectAllocator {
    pub fn new() -> Self {
        Self::default()
    }
}

impl Allocator for DirectAllocator {
    fn name(&self) -> &'static str {
        "direct"
    }

    fn malloc(&mut self, backend: &mut dyn Backend, request: &Request) -> Result<Grant> {
        let plan = page_plan(request.policy, request.size);
        let mut last_err = None;
        for &kind in plan {
            let page = backend.page_size(kind);
            let Some(granted) = checked_align_up(request.booked, page.bytes()) else {
                return Err(AclError::invalid_param(format!("size {} overflows", request.size)));
            };
            let handle = match backend.create_physical(granted, kind) {
                Ok(h) => h,
                Err(e) if e.code.is_out_of_memory() => {
                    last_err = Some(e);
                    continue;
                }
                Err(e) => return Err(e),
            };
            let mapped = backend.reserve(granted, page.bytes(), None).and_then(|va| {
                backend.map(va, handle).map(|()| va).inspect_err(|_| {
                    let _ = backend.release(va);
                })
            });
            match mapped {
                Ok(ptr) => {
                    self.blocks.insert(ptr, handle);
                    return Ok(Grant { ptr, granted, page });
                }
                Err(e) => {
                    backend.free_physical(handle)?;
                    return Err(e);
                }
            }
        }
        Err(last_err.unwrap_or_else(|| AclError::internal("empty page plan")))
    }

    fn free(&mut self, backend: &mut dyn Backend, ptr: u64) -> Result<()> {
        let handle = self
            .blocks
            .remove(&ptr)
            .ok_or_else(|| AclError::internal(format!("direct allocator does not own {ptr:#x}")))?;
        backend.unmap(ptr)?;
        backend.free_physical(handle)?;
        backend.release(ptr)
    }
}
