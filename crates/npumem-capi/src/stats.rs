//! `npumem_device_stats_t` (`NPUMEM_DEVICE_STATS_VERSION` 2): a device's allocator statistics
//! as a plain C struct, one field for each plain field of torch 2.15's
//! `c10::CachingDeviceAllocator::DeviceStats`, by name, type and order (a `Stat` is four
//! `int64_t`, a `StatArray` three `Stat`s indexed all / small pool / large pool), followed by
//! npumem's own figures. Torch's `reserved_bytes_by_private_pools` (a hash map) has no C form:
//! npumem has no private pools, so it stays empty. The values are those of
//! `Device.memory_stats()`.
//!
//! Invariants: the layout is `#[repr(C)]` and matches include/npumem.h (the header test compiles
//! a C program that checks `sizeof` and field offsets against this library, and a C++ one that
//! fills torch's struct field by field from it); a field torch adds or moves makes a new
//! version, never a silent change of the old.

use npumem_core::pool::stats::{PoolStats, Stat, StatArray};

/// `c10::CachingAllocator::Stat`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CStat {
    pub current: i64,
    pub peak: i64,
    pub allocated: i64,
    pub freed: i64,
}

/// Index of a `StatArray`: every pool, the small pool (blocks up to 1 MiB), the large pool.
pub const STAT_ALL: usize = 0;
pub const STAT_SMALL_POOL: usize = 1;
pub const STAT_LARGE_POOL: usize = 2;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CDeviceStats {
    pub allocation: [CStat; 3],
    pub segment: [CStat; 3],
    pub active: [CStat; 3],
    pub inactive_split: [CStat; 3],
    pub allocated_bytes: [CStat; 3],
    pub reserved_bytes: [CStat; 3],
    pub active_bytes: [CStat; 3],
    pub inactive_split_bytes: [CStat; 3],
    pub requested_bytes: [CStat; 3],
    pub num_alloc_retries: i64,
    pub num_ooms: i64,
    pub oversize_allocations: CStat,
    pub oversize_segments: CStat,
    pub num_sync_all_streams: i64,
    pub num_device_alloc: i64,
    pub num_device_free: i64,
    /// Allocations an OOM preemption policy rejected: npumem has none, so 0.
    pub num_oom_rejections: i64,
    /// -1 when blocks of every size may be split.
    pub max_split_size: i64,
    // npumem's own figures (not in PyTorch's struct).
    /// Mallocs that needed new device memory (the rest were served from the cache).
    pub num_cache_misses: i64,
}

/// A counter as `int64_t` (saturating; counters never come near it).
fn signed(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl From<&Stat> for CStat {
    fn from(s: &Stat) -> Self {
        CStat {
            current: signed(s.current),
            peak: signed(s.peak),
            allocated: signed(s.allocated),
            freed: signed(s.freed),
        }
    }
}

fn array(a: &StatArray) -> [CStat; 3] {
    let mut out = [CStat::default(); 3];
    out[STAT_ALL] = (&a.all).into();
    out[STAT_SMALL_POOL] = (&a.small_pool()).into();
    out[STAT_LARGE_POOL] = (&a.large_pool()).into();
    out
}

impl From<&PoolStats> for CDeviceStats {
    fn from(s: &PoolStats) -> Self {
        CDeviceStats {
            allocation: array(&s.allocation),
            segment: array(&s.segment),
            active: array(s.active()),
            inactive_split: array(&s.inactive_split),
            allocated_bytes: array(&s.allocated_bytes),
            reserved_bytes: array(&s.reserved_bytes),
            active_bytes: array(s.active_bytes()),
            inactive_split_bytes: array(&s.inactive_split_bytes),
            requested_bytes: array(&s.requested_bytes),
            num_alloc_retries: signed(s.num_alloc_retries),
            num_ooms: signed(s.num_ooms),
            oversize_allocations: (&s.oversize_allocations).into(),
            oversize_segments: (&s.oversize_segments).into(),
            num_sync_all_streams: signed(s.num_sync_all_streams),
            num_device_alloc: signed(s.num_device_alloc),
            num_device_free: signed(s.num_device_free),
            num_oom_rejections: 0,
            max_split_size: if s.max_split_size == u64::MAX { -1 } else { signed(s.max_split_size) },
            num_cache_misses: signed(s.num_cache_misses),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::mem::{offset_of, size_of};

    #[test]
    fn layout_is_c10s_then_npumems() {
        assert_eq!(size_of::<CStat>(), 32);
        assert_eq!(offset_of!(CDeviceStats, requested_bytes), 8 * 96);
        assert_eq!(offset_of!(CDeviceStats, num_alloc_retries), 9 * 96);
        assert_eq!(offset_of!(CDeviceStats, oversize_allocations), 9 * 96 + 16);
        assert_eq!(offset_of!(CDeviceStats, num_oom_rejections), 9 * 96 + 16 + 64 + 24);
        assert_eq!(offset_of!(CDeviceStats, max_split_size), 9 * 96 + 16 + 64 + 32);
        assert_eq!(size_of::<CDeviceStats>(), 9 * 96 + 16 + 64 + 40 + 8);
    }

    #[test]
    fn every_figure_is_the_memory_stats_one() {
        let mut s = PoolStats::default();
        s.on_segment_alloc(npumem_core::pool::PoolKind::Large, 20 << 20);
        s.on_alloc(npumem_core::pool::PoolKind::Large, 4 << 20, 3 << 20);
        s.on_alloc(npumem_core::pool::PoolKind::Small, 512, 100);
        s.num_ooms = 2;
        s.max_split_size = u64::MAX;
        let c = CDeviceStats::from(&s);
        let keys: HashMap<String, i64> = s.pairs().into_iter().collect();
        let pools = ["all", "small_pool", "large_pool"];
        for (name, arr) in [
            ("allocation", &c.allocation),
            ("segment", &c.segment),
            ("reserved_bytes", &c.reserved_bytes),
            ("allocated_bytes", &c.allocated_bytes),
            ("requested_bytes", &c.requested_bytes),
            ("active_bytes", &c.active_bytes),
        ] {
            for (i, pool) in pools.iter().enumerate() {
                assert_eq!(arr[i].current, keys[&format!("{name}.{pool}.current")], "{name}.{pool}");
                assert_eq!(arr[i].peak, keys[&format!("{name}.{pool}.peak")], "{name}.{pool}");
                assert_eq!(arr[i].allocated, keys[&format!("{name}.{pool}.allocated")], "{name}.{pool}");
            }
        }
        assert_eq!(c.allocated_bytes[STAT_ALL].current, (4 << 20) + 512);
        assert_eq!(c.num_ooms, keys["num_ooms"]);
        assert_eq!(c.num_device_alloc, 1);
        assert_eq!(c.max_split_size, -1);
        assert_eq!(keys["max_split_size"], -1);
    }
}
