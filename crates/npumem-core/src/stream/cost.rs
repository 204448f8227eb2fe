//! `CostModel`: how long the simulated device takes for each kind of work, in nanoseconds.
//!
//! Times are latency + bytes / bandwidth. Presets carry approximate public figures of real parts
//! (spec-sheet bandwidths, not measurements); every field can be overridden. Invariant: every
//! bandwidth is positive and every latency finite, so every duration is finite.

use crate::error::{AclError, Result};

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

    /// Sets one field by name (for overrides from Python).
    pub fn set(&mut self, field: &str, value: f64) -> Result<()> {
        if !value.is_finite() || value < 0.0 {
            return Err(AclError::invalid_param(format!("{field} must be a finite number >= 0, got {value}")));
        }
        let bandwidth = field.ends_with("bandwidth");
        if bandwidth && value == 0.0 {
            return Err(AclError::invalid_param(format!("{field} must be > 0")));
        }
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
        *slot = value;
        Ok(())
    }

    /// Duration of a copy of `bytes` between the given sides; `pinned` says whether the host side
    /// is pinned memory.
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

    /// Duration of a device memset of `bytes`.
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
}
