//! The fast paths between the waiting stacks and the owner's blocks.
//!
//! Rules:
//! - a malloc hit pops a waiting block of exactly the request's rounded size and writes no
//!   record: the owner records the grant;
//! - a free pushes the owner's `Granted` onto its size's stack (a pointer inside a pool's range
//!   is pooled, any other is a bypass block);
//! - statistics are the callers'.

use super::*;

impl VmmAllocator {
    /// The fast path of a malloc: a waiting block of exactly the request's rounded size, in the
    /// pool its policy picks (see `route_cached`). Statistics are the caller's.
    #[inline(always)]
    pub(super) fn take_recent(&mut self, requested: u64, policy: Policy) -> Option<(PoolKind, Grant)> {
        let (kind, size) = self.route_cached(requested, policy)?;
        let w = self.recent.pop(kind, size)?;
        Some((kind, Grant { ptr: w.ptr, granted: size, page: w.page }))
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

    /// The fast path of a free: the live pooled `block` goes to the waiting stacks. Statistics
    /// are the caller's. None for a block outside the pools (a bypass block).
    #[inline(always)]
    pub(super) fn take_pooled(&mut self, block: &Granted) -> Option<PoolKind> {
        let (kind, _) = self.pool_holding(block.ptr)?;
        self.recent.push(kind, block.granted, Waiting { ptr: block.ptr, page: block.page });
        Some(kind)
    }

    pub(super) fn oom(&mut self, e: AclError, request: &Request) -> AclError {
        self.books.stats.num_ooms += 1;
        AclError::oom(format!("npumem pool out of memory for {}: {}", format_size(request.size), e.message))
    }
}
