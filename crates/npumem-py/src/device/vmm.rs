//! `Device`'s virtual-memory calls (reservations, physical allocations, mappings), fault
//! injection, the cache, and the stream-ordered pool's attributes.
//!
//! - Arguments are checked before the core is called; errors carry AscendCL codes.

use super::*;

#[pymethods]
impl PyDevice {
    /// `aclrtReserveMemAddress`: `size` bytes of device address space (at `expect` when given);
    /// returns the address. `alignment` is reserved (0).
    #[pyo3(signature = (size, expect = None, alignment = None, flags = None))]
    fn reserve_mem_address(
        &self,
        py: Python<'_>,
        size: Size,
        expect: Option<Ptr<name::expect>>,
        alignment: Option<Uint<name::alignment>>,
        flags: Option<Uint<name::flags>>,
    ) -> PyResult<u64> {
        let expect = expect.map(|e| e.0).filter(|&e| e != 0);
        let (alignment, flags) = (alignment.map_or(0, |a| a.0), flags.map_or(0, |f| f.0));
        self.run(py, |d| d.reserve_mem_address(size.0, alignment, expect, flags))
    }

    /// `aclrtReleaseMemAddress`.
    fn release_mem_address(&self, py: Python<'_>, va: Ptr<name::va>) -> PyResult<()> {
        self.run(py, |d| d.release_mem_address(va.0))
    }

    /// `aclrtMallocPhysical`: `size` bytes of physical memory of `attr` (a `MemAttr`: normal,
    /// huge or 1 GiB pages); returns the handle.
    #[pyo3(signature = (size, attr, flags = None))]
    fn malloc_physical(
        &self,
        py: Python<'_>,
        size: Size,
        attr: MemAttrArg,
        flags: Option<Uint<name::flags>>,
    ) -> PyResult<u64> {
        let flags = flags.map_or(0, |f| f.0);
        self.run(py, |d| d.malloc_physical(size.0, attr.0, flags))
    }

    /// `aclrtFreePhysical` (a mapped handle keeps its memory until its last unmap).
    fn free_physical(&self, py: Python<'_>, handle: Uint) -> PyResult<()> {
        self.run(py, |d| d.free_physical(handle.0))
    }

    /// `aclrtMapMem`: maps the whole of `handle` at `va` (`size` defaults to the handle's).
    #[pyo3(signature = (va, handle, size = None, offset = None, flags = None))]
    fn map_mem(
        &self,
        py: Python<'_>,
        va: Ptr<name::va>,
        handle: Uint,
        size: Option<Size>,
        offset: Option<Uint<name::offset>>,
        flags: Option<Uint<name::flags>>,
    ) -> PyResult<()> {
        let (va, handle, size) = (va.0, handle.0, size.map(|s| s.0));
        let (offset, flags) = (offset.map_or(0, |o| o.0), flags.map_or(0, |f| f.0));
        self.run(py, |d| {
            let size = match size {
                Some(s) => s,
                None => d.physical_size(handle)?,
            };
            d.map_mem(va, size, offset, handle, flags)
        })
    }

    /// `aclrtUnmapMem`.
    fn unmap_mem(&self, py: Python<'_>, va: Ptr<name::va>) -> PyResult<()> {
        self.run(py, |d| d.unmap_mem(va.0))
    }

    /// `aclrtMemGetAllocationGranularity` for memory of `attr`.
    fn mem_get_allocation_granularity(&self, py: Python<'_>, attr: MemAttrArg) -> PyResult<u64> {
        self.run(py, |d| d.mem_get_allocation_granularity(attr.0))
    }

    // ----- fault injection (devices made with faults=True) -----

    /// Makes the `n`th physical allocation / map / unmap from now fail (1 = the next; None =
    /// never), once each: physical allocations with out-of-memory (207001), or a driver error
    /// (507899) with `driver_error=True`; maps and unmaps with a driver error.
    #[pyo3(signature = (*, physical_alloc = None, map = None, unmap = None, driver_error = false))]
    fn inject_faults(
        &self,
        py: Python<'_>,
        physical_alloc: Option<Uint<name::physical_alloc>>,
        map: Option<Uint<name::map>>,
        unmap: Option<Uint<name::unmap>>,
        driver_error: bool,
    ) -> PyResult<()> {
        let plan = FaultPlan {
            physical_alloc: physical_alloc.map(|n| n.0),
            map: map.map(|n| n.0),
            unmap: unmap.map(|n| n.0),
            driver_error,
        };
        self.run(py, |d| d.inject_faults(plan))
    }

    /// `{"injected": {kind: count}, "armed": {kind: countdown or None}}`.
    fn faults<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (injected, armed) = self.run(py, |d| d.faults())?;
        let counts = PyDict::new(py);
        counts.set_item("physical_alloc", injected.physical_alloc)?;
        counts.set_item("map", injected.map)?;
        counts.set_item("unmap", injected.unmap)?;
        let plan = PyDict::new(py);
        plan.set_item("physical_alloc", armed.physical_alloc)?;
        plan.set_item("map", armed.map)?;
        plan.set_item("unmap", armed.unmap)?;
        let out = PyDict::new(py);
        out.set_item("injected", counts)?;
        out.set_item("armed", plan)?;
        Ok(out)
    }

    /// Returns cached, unused memory to the device (unmaps whole free segments).
    fn empty_cache(&self, py: Python<'_>) -> PyResult<()> {
        self.run(py, |d| d.empty_cache())
    }

    // ----- the stream-ordered pool's attributes (aclrtMemPoolSetAttr / GetAttr) -----

    /// Sets a pool attribute (`MemPoolAttr` 1-4): the three reuse rules (bool) or the release
    /// threshold (bytes; `None` keeps everything).
    fn set_pool_attr(&self, py: Python<'_>, attr: PoolAttrArg, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let attr = attr.0;
        let threshold = if attr == MemPoolAttr::ReleaseThreshold {
            if value.is_none() { Some(u64::MAX) } else { Some(size_arg(value, "release threshold")?) }
        } else {
            None
        };
        // A reuse rule is a bool (0 and 1 are accepted as such); anything else is refused
        // rather than judged by its truthiness.
        let flag = match value.extract::<bool>() {
            Ok(flag) => flag,
            Err(_) => match value.extract::<u8>() {
                Ok(v @ (0 | 1)) => v == 1,
                _ if threshold.is_some() => false,
                _ => {
                    let got = value.get_type().name().map(|n| n.to_string()).unwrap_or_default();
                    return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                        "value of {} must be a bool, got {got} {value}",
                        attr.name()
                    )));
                }
            },
        };
        self.run(py, |d| {
            let mut p = d.reuse_policy();
            match attr {
                MemPoolAttr::ReuseFollowEventDependencies => p.follow_event_dependencies = flag,
                MemPoolAttr::ReuseAllowOpportunistic => p.allow_opportunistic = flag,
                MemPoolAttr::ReuseAllowInternalDependencies => p.allow_internal_dependencies = flag,
                MemPoolAttr::ReleaseThreshold => p.release_threshold = threshold.unwrap_or(u64::MAX),
                other => {
                    return Err(AclError::invalid_param(format!(
                        "{} is read-only; get it with get_pool_attr",
                        other.name()
                    )));
                }
            }
            d.set_reuse_policy(p);
            Ok(())
        })
    }

    /// Reads a pool attribute (`MemPoolAttr` 1-8).
    fn get_pool_attr<'py>(&self, py: Python<'py>, attr: PoolAttrArg) -> PyResult<Bound<'py, PyAny>> {
        let attr = attr.0;
        let d = self.inner.lock();
        let (p, stats) = (d.reuse_policy(), d.pool_stats().clone());
        drop(d);
        Ok(match attr {
            MemPoolAttr::ReuseFollowEventDependencies => {
                p.follow_event_dependencies.into_pyobject(py)?.to_owned().into_any()
            }
            MemPoolAttr::ReuseAllowOpportunistic => p.allow_opportunistic.into_pyobject(py)?.to_owned().into_any(),
            MemPoolAttr::ReuseAllowInternalDependencies => {
                p.allow_internal_dependencies.into_pyobject(py)?.to_owned().into_any()
            }
            MemPoolAttr::ReleaseThreshold => {
                if p.release_threshold == u64::MAX {
                    py.None().into_bound(py)
                } else {
                    p.release_threshold.into_pyobject(py)?.into_any()
                }
            }
            MemPoolAttr::ReservedMemCurrent => stats.reserved_bytes.all.current.into_pyobject(py)?.into_any(),
            MemPoolAttr::ReservedMemHigh => stats.reserved_bytes.all.peak.into_pyobject(py)?.into_any(),
            MemPoolAttr::UsedMemCurrent => stats.allocated_bytes.all.current.into_pyobject(py)?.into_any(),
            MemPoolAttr::UsedMemHigh => stats.allocated_bytes.all.peak.into_pyobject(py)?.into_any(),
        })
    }

    // ----- the memory sanitizer -----
}
