use super::*;

impl VmmAllocator {
    /// The fast path of a malloc: a waiting block of exactly the request's rounded size, in the
    /// pool its policy picks (see `route_cached`), recorded as live. Statistics are the caller's.
    #[inline(always)]
    pub(super) fn take_recent(&mut self, requested: u64, policy: Policy) -> Option<(PoolKind, Grant)> {
        let (kind, size) = self.route_cached(requested, policy)?;
        let w = self.recent.pop(kind, size)?;
        self.note_live(kind, w.ptr, Block { size, requested, page: w.page });
        Some((kind, Grant { ptr: w.ptr, granted: size, page: w.page }))
    }

    /// Records the block just handed out at `ptr` in `kind`'s pool as live (nothing to do when
    /// the owner keeps the records).
    #[inline(always)]
    pub(super) fn note_live(&mut self, kind: PoolKind, ptr: u64, block: Block) {
        if !self.owner_tracked {
            self.record_live(kind, ptr, block);
        }
    }

    /// `note_live`'s record (out of line, so that an owner-tracked pool's fast path carries
    /// none of the block map's code).
    #[inline(never)]
    pub(super) fn record_live(&mut self, kind: PoolKind, ptr: u64, block: Block) {
        self.pool_mut(kind).blocks.insert(ptr, block);
    }

    /// The pool and rounded size under which a request may find a waiting block: not for
    /// HUGE_ONLY (a waiting block may sit on normal-frame pages), nor for requests that bypass
    /// the pools.
    #[inline(always)]
    pub(super) fn route_cached(&self, requested: u64, policy: Policy) -> Option<(PoolKind, u64)> {
        let size = checked_align_up(requested, self.config.quantum)?;
        let kind = match policy.base() {
            Policy::NormalOnly => PoolKind::Small,
            Policy::HugeOnly | Policy::Huge1gOnly => return None,
            _ => pool_kind(size),
        };
        (size < self.config.bypass_threshold).then_some((kind, size))
    }

    /// The pool `ptr` lies in, if any.
    #[inline(always)]
    pub(super) fn pool_holding(&mut self, ptr: u64) -> Option<(PoolKind, &mut VmmPool)> {
        let [small, large] = &mut self.pools;
        match (small, large) {
            (Some(p), _) if (p.base..p.end).contains(&ptr) => Some((PoolKind::Small, p)),
            (_, Some(p)) if (p.base..p.end).contains(&ptr) => Some((PoolKind::Large, p)),
            _ => None,
        }
    }

    /// `take_pooled` of a block whose record the owner keeps (`block`, live): it goes to the
    /// waiting stacks. None for a block outside the pools (a bypass block).
    #[inline(always)]
    pub(super) fn take_owned(&mut self, block: &Granted) -> Option<PoolKind> {
        let (kind, _) = self.pool_holding(block.ptr)?;
        self.recent.push(kind, block.granted, Waiting { ptr: block.ptr, page: block.page });
        Some(kind)
    }

    /// Starts loading the record of the pooled block at `ptr` (a hint for a batch's look-ahead).
    #[inline(always)]
    pub(super) fn prefetch_block(&self, ptr: u64) {
        if let Some(pool) = self.pools.iter().flatten().find(|p| (p.base..p.end).contains(&ptr)) {
            pool.blocks.prefetch(ptr);
        }
    }

    /// The fast path of a free: a live pooled block goes to the waiting stacks. Statistics are
    /// the caller's. None for a pointer outside the pools (or not live).
    #[inline(always)]
    pub(super) fn take_pooled(&mut self, ptr: u64) -> Option<(PoolKind, Block)> {
        let (kind, pool) = self.pool_holding(ptr)?;
        let block = pool.blocks.remove(ptr)?;
        self.recent.push(kind, block.size, Waiting { ptr, page: block.page });
        Some((kind, block))
    }

    /// `free` (out of line: `free_block`'s path for a pool that keeps its own records).
    #[inline(never)]
    pub(super) fn free_recorded(&mut self, backend: &mut dyn Backend, ptr: u64) -> Result<()> {
        Allocator::free(self, backend, ptr)
    }

    pub(super) fn oom(&mut self, e: AclError, request: &Request) -> AclError {
        self.stats.num_ooms += 1;
        AclError::oom(format!("npumem pool out of memory for {}: {}", format_size(request.size), e.message))
    }
}
