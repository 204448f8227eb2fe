//! `CostModel`: how long the simulated device takes for each kind of work, in nanoseconds.
//!
//! Times are latency + bytes / bandwidth. Presets carry approximate public figures of real parts
//! (spec-sheet bandwidths, not measurements); every field can be overridden within
//! [`BANDWIDTH`] and [`LATENCY_NS`]. Invariant: every bandwidth lies in `BANDWIDTH` and every
//! latency in `LATENCY_NS` (through [`CostModel::set`]), so every duration is finite and
//! non-negative; a duration past `u64::MAX` ns saturates there, and the scheduler refuses to move
//! a clock past that, so nothing wraps.

use std::ops::RangeInclusive;

use crate::error::{AclError, Result};

/// Accepted bandwidths, bytes per second: from 1 MB/s (below any real link; a 1 TiB copy then
/// takes 25 simulated days, still far inside the 64-bit clock) to 1 PB/s (600 times the 910B's HBM).
pub const BANDWIDTH: RangeInclusive<f64> = 1e6..=1e15;

/// Accepted per-call costs (launch, driver allocation, map, PCIe latency), nanoseconds: up to one
/// second, 10^4 to 10^5 times the real figures, so the host clock would need 1.8e10 calls at the
/// bound to reach 2^64 ns.
pub const LATENCY_NS: RangeInclusive<f64> = 0.0..=1e9;

/// The longest duration a caller may give one operation (a kernel's run time): 2^53 ns, about
/// 104 days, the largest whole number of nanoseconds an `f64` holds exactly; 2,048 of them fit
/// the 64-bit clock, and the scheduler refuses, never wraps, past that.
pub const MAX_DURATION_NS: u64 = 1 << 53;

/// Converts a caller's duration in microseconds (the Python API's unit; `what` names the
/// argument) to whole nanoseconds: it must be finite, non-negative and at most
/// [`MAX_DURATION_NS`].
pub fn duration_from_us(what: &str, us: f64) -> Result<u64> {
    let limit_us = MAX_DURATION_NS as f64 / 1e3;
    if !(0.0..=limit_us).contains(&us) {
        return Err(AclError::invalid_param(format!(
            "{what} must be a finite number of microseconds from 0 to {limit_us} (2^53 ns, about 104 days), got {us:?}"
        )));
    }
    Ok((us * 1e3).round().min(MAX_DURATION_NS as f64) as u64)
}

/// Bandwidths in bytes per second, latencies in nanoseconds.
#[derive(Clone, Debug, PartialEq)]
pub struct CostModel {
    pub name: String,
    /// Device memory (device-to-device copies, memset).
    pub hbm_bandwidth: f64,
    /// Host↔device over PCIe from pinned (`malloc_host`) memory: DMA at full speed.
    pub pcie_pinned_bandwidth: f64,
    /// Host↔device from pageable memory: staged through a bounce buffer.
    pub pcie_pageable_bandwidth: f64,
    /// Device↔device between chips (HCCS / P2P).
    pub p2p_bandwidth: f64,
    /// Fixed cost of one transfer over PCIe.
    pub pcie_latency_ns: f64,
    /// Host-side cost of enqueueing any async operation (a kernel launch, an async copy).
    pub launch_ns: f64,
    /// Host-side cost of a driver allocation (`aclrtMallocPhysical`) and of one map call.
    pub driver_alloc_ns: f64,
    pub map_ns: f64,
}

impl CostModel {
    /// Ascend 910B-class training part: HBM2e about 1.6 TB/s, PCIe 5.0 x16.
    pub fn ascend910b() -> Self {
        CostModel {
            name: "ascend910b".into(),
            hbm_bandwidth: 1.6e12,
            pcie_pinned_bandwidth: 50e9,
            pcie_pageable_bandwidth: 20e9,
            p2p_bandwidth: 56e9,
            pcie_latency_ns: 10_000.0,
            launch_ns: 5_000.0,
            driver_alloc_ns: 50_000.0,
            map_ns: 10_000.0,
        }
    }

    /// Ascend 310P-class inference part: LPDDR4X about 204.8 GB/s, PCIe 4.0 x16.
    pub fn ascend310p() -> Self {
        CostModel {
            name: "ascend310p".into(),
            hbm_bandwidth: 204.8e9,
            pcie_pinned_bandwidth: 25e9,
            pcie_pageable_bandwidth: 10e9,
            p2p_bandwidth: 25e9,
            pcie_latency_ns: 10_000.0,
            launch_ns: 5_000.0,
            driver_alloc_ns: 50_000.0,
            map_ns: 10_000.0,
        }
    }

    pub fn preset(name: &str) -> Result<Self> {
        match name {
            "ascend910b" => Ok(Self::ascend910b()),
            "ascend310p" => Ok(Self::ascend310p()),
            other => Err(AclError::invalid_param(format!(
                "unknown device preset {other:?}; available: \"ascend910b\", \"ascend310p\""
            ))),
        }
    }

    /// Sets one field by name (for overrides from Python): a bandwidth within [`BANDWIDTH`]
    /// bytes/s, a latency within [`LATENCY_NS`].
    pub fn set(&mut self, field: &str, value: f64) -> Result<()> {
        let (range, unit) = if field.ends_with("bandwidth") { (BANDWIDTH, "bytes/s") } else { (LATENCY_NS, "ns") };
        let slot = match field {
            "hbm_bandwidth" => &mut self.hbm_bandwidth,
            "pcie_pinned_bandwidth" => &mut self.pcie_pinned_bandwidth,
            "pcie_pageable_bandwidth" => &mut self.pcie_pageable_bandwidth,
            "p2p_bandwidth" => &mut self.p2p_bandwidth,
            "pcie_latency_ns" => &mut self.pcie_latency_ns,
            "launch_ns" => &mut self.launch_ns,
            "driver_alloc_ns" => &mut self.driver_alloc_ns,
            "map_ns" => &mut self.map_ns,
            other => {
                return Err(AclError::invalid_param(format!(
                    "unknown cost field {other:?}; fields: hbm_bandwidth, pcie_pinned_bandwidth, \
                     pcie_pageable_bandwidth, p2p_bandwidth, pcie_latency_ns, launch_ns, driver_alloc_ns, map_ns"
                )));
            }
        };
        // NaN fails `contains` too.
        if !range.contains(&value) {
            let sci = |x: f64| if x == 0.0 { "0".to_string() } else { format!("{x:e}") };
            return Err(AclError::invalid_param(format!(
                "{field} must be a finite number from {} to {} {unit}, got {value:?}",
                sci(*range.start()),
                sci(*range.end())
            )));
        }
        *slot = value;
        Ok(())
    }

    /// Duration of a copy of `bytes` between the given sides (saturating at `u64::MAX` ns);
    /// `pinned` says whether the host side is pinned memory.
    pub fn copy_ns(&self, bytes: u64, src_device: bool, dst_device: bool, pinned: bool) -> u64 {
        let b = bytes as f64;
        let ns = match (src_device, dst_device) {
            (true, true) => 2.0 * b / self.hbm_bandwidth * 1e9, // read + write
            (false, false) => 2.0 * b / self.hbm_bandwidth * 1e9,
            _ if pinned => self.pcie_latency_ns + b / self.pcie_pinned_bandwidth * 1e9,
            _ => self.pcie_latency_ns + b / self.pcie_pageable_bandwidth * 1e9,
        };
        ns.ceil() as u64
    }

    /// Duration of a device memset of `bytes` (saturating at `u64::MAX` ns).
    pub fn fill_ns(&self, bytes: u64) -> u64 {
        (bytes as f64 / self.hbm_bandwidth * 1e9).ceil() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let c = CostModel::ascend910b();
        // 50 MB over pinned PCIe at 50 GB/s: 1 ms plus the latency.
        assert_eq!(c.copy_ns(50_000_000, false, true, true), 1_010_000);
        assert!(c.copy_ns(50_000_000, false, true, false) > c.copy_ns(50_000_000, false, true, true));
        assert_eq!(c.fill_ns(1_600_000_000), 1_000_000);
        let mut c = c;
        c.set("launch_ns", 1.0).unwrap();
        assert!(c.set("hbm_bandwidth", 0.0).is_err());
        assert!(c.set("nope", 1.0).is_err());
        assert!(CostModel::preset("ascend310p").is_ok() && CostModel::preset("x").is_err());
    }

    #[test]
    fn costs_and_durations_are_bounded() {
        let mut c = CostModel::ascend910b();
        for (field, value) in [
            ("launch_ns", 1e30),
            ("launch_ns", f64::NAN),
            ("launch_ns", f64::INFINITY),
            ("map_ns", -1.0),
            ("driver_alloc_ns", 1.000_001e9),
            ("hbm_bandwidth", 1e-300),
            ("p2p_bandwidth", 1e16),
            ("pcie_pinned_bandwidth", f64::NAN),
        ] {
            let err = c.set(field, value).unwrap_err();
            assert_eq!(err.code, crate::ErrorCode::InvalidParam);
            assert!(err.message.starts_with(field) && err.message.contains(&format!("{value:?}")), "{}", err.message);
        }
        assert_eq!(c, CostModel::ascend910b(), "a refused value changes nothing");
        c.set("launch_ns", 1e9).unwrap();
        c.set("hbm_bandwidth", 1e6).unwrap();
        // The slowest copy of a terabyte stays far inside the clock.
        assert!(c.copy_ns(1 << 40, true, true, true) < u64::MAX / 1000);
        let limit_us = MAX_DURATION_NS as f64 / 1e3;
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -1.0, -0.001, 1e300, limit_us * 1.000_001] {
            let err = duration_from_us("duration", bad).unwrap_err();
            assert_eq!(err.code, crate::ErrorCode::InvalidParam);
            assert!(err.message.starts_with("duration must be") && err.message.contains(&format!("{bad:?}")));
        }
        assert_eq!(duration_from_us("duration", limit_us), Ok(MAX_DURATION_NS));
        assert_eq!(duration_from_us("duration", 2.5), Ok(2_500));
        assert_eq!(duration_from_us("duration", 0.0004), Ok(0));
    }
}
