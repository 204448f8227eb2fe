//! `VmmAllocator::check_invariants`: the rules of the module docs, asserted over the whole state
//! (test builds only; the property tests call it after every step).

use super::*;

impl VmmAllocator {
    /// Asserts every invariant of the module docs against an independent recount; `live` is
    /// the owner's record of every block live in the allocator.
    pub(super) fn check_invariants(&self, live: &[Granted]) {
        let in_bypass = live.iter().filter(|g| self.bypass.contains_key(&g.ptr)).count();
        assert_eq!(in_bypass, self.bypass.len(), "the bypass blocks are the owner's live ones outside the pools");
        let mut pooled_blocks = 0;
        let mut held = 0;
        let mut allocated = 0;
        let mut requested = 0;
        for kind in [PoolKind::Small, PoolKind::Large] {
            let cached = self.cache[kind as usize].len() as u64;
            let Some(pool) = self.pools[kind as usize].as_ref() else {
                assert_eq!(cached, 0, "cached pages belong to a pool");
                continue;
            };
            // Live and waiting blocks, in address order, never overlapping.
            let pooled: Vec<&Granted> = live.iter().filter(|g| (pool.base..pool.end).contains(&g.ptr)).collect();
            pooled_blocks += pooled.len();
            let mut blocks: Vec<(u64, u64)> = pooled.iter().map(|g| (g.ptr, g.granted)).collect();
            allocated += pooled.iter().map(|g| g.granted).sum::<u64>();
            requested += pooled.iter().map(|g| g.requested).sum::<u64>();
            blocks.extend(self.recent.iter().filter(|&(k, _, _)| k == kind).map(|(_, ptr, size)| (ptr, size)));
            blocks.sort_unstable();
            for w in blocks.windows(2) {
                assert!(w[0].0 + w[0].1 <= w[1].0, "blocks {:#x} and {:#x} overlap", w[0].0, w[1].0);
            }
            // `live` of a slot counts the blocks over it; every block lies on mapped memory, and
            // no free VA lies under a block.
            let mut live = vec![0u32; pool.slots.len()];
            for &(ptr, size) in &blocks {
                assert!(pool.base <= ptr && ptr + size <= pool.end, "block {ptr:#x} inside its pool");
                for i in pool.pages_of(ptr, size) {
                    let slot = pool.slot(i);
                    assert!(slot.handle != NO_HANDLE, "block {ptr:#x} on unmapped page {i}");
                    if slot.tail > 0 {
                        assert!(
                            ptr + size <= pool.page_va(i) + slot.tail as u64 * TAIL_UNIT,
                            "block {ptr:#x} past its tail"
                        );
                    }
                    live[i] += 1;
                }
                assert!(
                    pool.space.free_extents().all(|(s, l)| s + l <= ptr || ptr + size <= s),
                    "free VA under block {ptr:#x}"
                );
            }
            let mut mapped = 0;
            let mut tail_gap = 0;
            for (i, slot) in pool.slots.iter().enumerate() {
                assert_eq!(slot.live, live[i], "live count of page {i}");
                let is_mapped = slot.handle != NO_HANDLE;
                mapped += is_mapped as u64;
                assert_eq!(
                    is_mapped && slot.live == 0,
                    pool.idle.contains(&(slot.idle_since, i as u32)),
                    "page {i} is idle iff mapped and holding no block"
                );
                if slot.tail > 0 {
                    assert!(is_mapped, "a tail is mapped");
                    let len = slot.tail as u64 * TAIL_UNIT;
                    tail_gap += pool.page - len;
                    let (lo, hi) = (pool.page_va(i) + len, pool.page_va(i) + pool.page);
                    assert!(
                        pool.space.free_extents().all(|(s, l)| s + l <= lo || hi <= s),
                        "the fence of tail page {i} holds"
                    );
                }
            }
            assert_eq!(
                pool.idle.len() as u64,
                pool.slots.iter().filter(|s| s.handle != NO_HANDLE && s.live == 0).count() as u64
            );
            assert_eq!(pool.mapped, mapped, "mapped pages");
            assert_eq!(pool.tail_gap, tail_gap, "bytes tails leave unmapped");
            held += (mapped + cached) * pool.page - tail_gap;
        }
        assert_eq!(pooled_blocks + in_bypass, live.len(), "every live block is pooled or a bypass block");
        let bypass: u64 = self.bypass.values().map(|b| b.segment.size).sum();
        assert_eq!(self.reserved(), held + bypass, "reserved bytes");
        assert_eq!(self.books.stats.allocated_bytes.all.current, allocated + bypass, "allocated bytes");
        let bypass_requested: u64 = self.bypass.values().map(|b| b.requested).sum();
        assert_eq!(self.books.stats.requested_bytes.all.current, requested + bypass_requested, "requested bytes");
    }
}
