use super::*;

impl VmmAllocator {
    /// A request that bypasses the pools gets its own segment, trying the page kinds of `plan` in
    /// order (for HUGE_FIRST: giant, then huge, then normal), each only if its page-rounded size
    /// fits under the limit; when none can be had, cached and idle pages go back to the device and
    /// the kinds are tried again.
    pub(super) fn malloc_bypass(
        &mut self,
        backend: &mut dyn Backend,
        request: &Request,
        size: u64,
        plan: &[PageKind],
    ) -> Result<Grant> {
        let segment = 'found: loop {
            let mut last = None;
            for &kind in plan {
                let rounded = checked_align_up(size, backend.page_size(kind).bytes()).unwrap_or(u64::MAX);
                if self.reserved().saturating_add(rounded) > self.limit() {
                    last = Some(AclError::oom(format!(
                        "{} in {} pages would pass the npumem pool's limit of {}",
                        format_size(rounded),
                        backend.page_size(kind).label(),
                        format_size(self.limit())
                    )));
                    continue;
                }
                match Segment::map(backend, size, &[kind]) {
                    Ok(s) => break 'found s,
                    Err(e) if e.code.is_out_of_memory() => last = Some(e),
                    Err(e) => return Err(e),
                }
            }
            if !self.release_coldest(backend)? {
                return Err(last.unwrap_or_else(|| AclError::internal("no page kind tried")));
            }
        };
        self.books.stats.on_segment_alloc(PoolKind::Large, segment.size);
        self.books.stats.num_cache_misses += 1;
        self.books.stats.oversize_segments.add(1);
        self.books.events.push(Action::SegmentAlloc, segment.ptr, segment.size);
        let grant = Grant { ptr: segment.ptr, granted: segment.size, page: segment.page };
        self.bypass.insert(segment.ptr, Bypass { segment, requested: request.size });
        self.books.stats.on_alloc(PoolKind::Large, grant.granted, request.size);
        self.books.stats.oversize_allocations.add(1);
        Ok(grant)
    }

    /// The last resort of a pooled request that its pool cannot map for want of memory (see
    /// `short_of_memory`): a segment of its own, as a bypass request gets (idle and cached pages
    /// go back to the device first), in the pages its policy allows: 2 MiB, else normal frames
    /// for exactly its size, as the direct family maps. With 2 MiB pool pages, the partly empty
    /// end pages of the blocks placed around it can be what is missing; a segment of normal
    /// frames needs none of them.
    #[cold]
    pub(super) fn malloc_alone(
        &mut self,
        backend: &mut dyn Backend,
        request: &Request,
        size: u64,
        kind: PoolKind,
        policy: Policy,
    ) -> Result<Grant> {
        let plan: &[PageKind] = match (policy, kind) {
            (Policy::HugeOnly, _) => &[PageKind::Huge],
            (_, PoolKind::Small) => &[PageKind::Normal],
            (_, PoolKind::Large) => &[PageKind::Huge, PageKind::Normal],
        };
        self.malloc_bypass(backend, request, size, plan)
    }

    /// Whether the device, within the pool's limit, has less free memory than any placement of
    /// a block of `size` bytes in `kind`'s pool could need (its pages, plus one where it
    /// straddles a boundary): only then can the pool's failure be for want of memory that a
    /// segment of its own, in smaller pages, might still find. A failure with that much free is
    /// the driver's, and is reported.
    pub(super) fn short_of_memory(&self, backend: &dyn Backend, kind: PoolKind, size: u64) -> bool {
        let page = self.page_of(kind);
        let most = size.div_ceil(page).saturating_add(1).saturating_mul(page);
        let (free, _) = backend.mem_info(crate::acl::MemScope::All);
        free.min(self.limit().saturating_sub(self.reserved())) < most
    }

    #[inline(never)]
    pub(super) fn free_bypass(&mut self, backend: &mut dyn Backend, ptr: u64) -> Result<()> {
        let segment = self
            .bypass
            .get(&ptr)
            .ok_or_else(|| AclError::internal(format!("npumem pool does not own {ptr:#x}")))?
            .segment;
        // A driver failure leaves the block live, as it was.
        segment.unmap(backend)?;
        let Bypass { segment, requested } = self.bypass.remove(&ptr).expect("present");
        self.books.stats.on_free(PoolKind::Large, segment.size, requested);
        self.books.stats.oversize_allocations.sub(1);
        self.books.stats.on_segment_free(PoolKind::Large, segment.size);
        self.books.stats.oversize_segments.sub(1);
        self.books.events.push(Action::SegmentFree, segment.ptr, segment.size);
        Ok(())
    }
}
