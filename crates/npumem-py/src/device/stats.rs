//! `Device`'s accounting: statistics, allocations, fragmentation, PyTorch-keyed memory stats and
//! snapshots, memory history, the sanitizer's findings and leaks, trimming and memory fractions.
//!
//! - Read-only views of the device's state, except `trim_to`, the memory fraction, the history
//!   switch and the sanitizer's mode.

use super::*;

#[pymethods]
impl PyDevice {
    fn frame_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.run(py, |d| d.frame_stats())?;
        let dict = PyDict::new(py);
        let sizes: Vec<u64> = (0..s.free_blocks.len()).map(|k| s.frame_size << k).collect();
        let bytes: Vec<u64> = s.free_blocks.iter().zip(&sizes).map(|(n, b)| n * b).collect();
        dict.set_item("frame_size", s.frame_size)?;
        dict.set_item("buddy_bytes", s.buddy_bytes)?;
        dict.set_item("free_bytes", s.free_bytes)?;
        dict.set_item("block_sizes", sizes)?;
        dict.set_item("free_blocks", &s.free_blocks)?;
        dict.set_item("free_bytes_by_order", bytes)?;
        dict.set_item("largest_free_block", s.largest_free_block)?;
        dict.set_item("free_in_huge_blocks", s.free_bytes_in_blocks_of(PageSize::Size2M.bytes()))?;
        dict.set_item("giant_total", s.giant_total)?;
        dict.set_item("giant_free", s.giant_free)?;
        Ok(dict)
    }

    fn page_table_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.run(py, |d| d.page_table_stats())?;
        let dict = PyDict::new(py);
        let pages = PyDict::new(py);
        let entries = PyDict::new(py);
        for (i, p) in PageSize::ALL.iter().enumerate() {
            pages.set_item(p.label(), s.pages[i])?;
            entries.set_item(p.label(), s.leaf_entries[i])?;
        }
        dict.set_item("pages", pages)?;
        dict.set_item("leaf_entries", entries)?;
        dict.set_item("tables", s.tables.to_vec())?;
        dict.set_item("table_bytes", s.table_bytes)?;
        dict.set_item("mapped_bytes", s.mapped_bytes)?;
        Ok(dict)
    }

    /// The live allocation starting at `ptr` as a dict, or None.
    fn allocation<'py>(&self, py: Python<'py>, ptr: Ptr) -> PyResult<Option<Bound<'py, PyDict>>> {
        let a = self.inner.lock().allocation(ptr.0);
        a.map(|a| allocation_dict(py, &a)).transpose()
    }

    /// Every live allocation, in address order.
    fn allocations<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let all = self.inner.lock().allocations();
        let items = all.iter().map(|a| allocation_dict(py, a)).collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, items)
    }

    /// Runtime and driver counters.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (s, c, host, stranded) = {
            let d = self.inner.lock();
            (d.stats(), d.backend_counters(), d.host_usage(), d.stranded())
        };
        let dict = PyDict::new(py);
        for (k, v) in [
            ("mallocs", s.mallocs),
            ("frees", s.frees),
            ("failed_mallocs", s.failed_mallocs),
            ("huge_fallbacks", s.huge_fallbacks),
            ("kind_mismatches", s.kind_mismatches),
            ("lost_effects", s.lost_effects),
            ("deferred_frees", s.deferred_frees),
            ("pending_frees", s.pending_frees),
            ("sync_reclaims", s.sync_reclaims),
            ("same_stream_reuses", s.same_stream_reuses),
            ("event_dependency_reuses", s.event_dependency_reuses),
            ("internal_dependency_reuses", s.internal_dependency_reuses),
            ("live_count", s.live_count),
            ("live_requested", s.live_requested),
            ("live_granted", s.live_granted),
            ("peak_granted", s.peak_granted),
            ("reserves", c.reserves),
            ("releases", c.releases),
            ("physical_allocs", c.physical_allocs),
            ("physical_frees", c.physical_frees),
            ("maps", c.maps),
            ("unmaps", c.unmaps),
            ("pages_mapped", c.pages_mapped),
            ("pages_unmapped", c.pages_unmapped),
            ("bytes_read", c.bytes_read),
            ("bytes_written", c.bytes_written),
            ("refused_frees", c.refused_frees),
            ("stranded_frees", stranded.0),
            ("stranded_bytes", stranded.1),
            ("host_live_bytes", host.0),
            ("host_live_count", host.1 as u64),
        ] {
            dict.set_item(k, v)?;
        }
        Ok(dict)
    }

    // ----- the program's own virtual memory management (aclrtReserveMemAddress & co.) -----

    /// The findings so far, as dicts: kind, message, addr, size, allocation, streams (-1 = host).
    fn sanitizer_reports<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let findings = self.inner.lock().sanitizer_reports().to_vec();
        let out = PyList::empty(py);
        for f in findings {
            let d = PyDict::new(py);
            d.set_item("kind", f.kind.name())?;
            d.set_item("message", f.message)?;
            d.set_item("addr", f.addr)?;
            d.set_item("size", f.size)?;
            d.set_item("allocation", f.allocation)?;
            let streams: Vec<i64> = f.streams.iter().map(|&s| if s == HOST { -1 } else { s as i64 }).collect();
            d.set_item("streams", streams)?;
            d.set_item("tag", f.tag)?;
            out.append(d)?;
        }
        Ok(out)
    }

    /// Every finding made since the last clear, by kind (`sanitizer_reports` keeps the first
    /// 10,000), and how many were counted but not kept (`dropped`).
    fn sanitizer_counts<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let counts = self.inner.lock().sanitizer_counts();
        let d = PyDict::new(py);
        for kind in FindingKind::ALL {
            d.set_item(kind.name(), counts.get(kind))?;
        }
        d.set_item("dropped", counts.dropped)?;
        Ok(d)
    }

    fn clear_sanitizer_reports(&self) {
        self.inner.lock().clear_sanitizer_reports();
    }

    /// "raise", "collect" or "off".
    fn set_sanitizer(&self, py: Python<'_>, mode: &str) -> PyResult<()> {
        self.run(py, |d| {
            d.set_sanitizer(SanitizerMode::parse(mode)?);
            Ok(())
        })
    }

    /// What is still held: allocations (dicts), host blocks, streams and events not destroyed.
    fn leak_report<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let device = self.inner.lock();
        let (allocations, host_blocks, streams, events) = device.leak_report();
        let tags: Vec<Option<String>> = allocations.iter().map(|a| device.tag(a.ptr).map(str::to_string)).collect();
        drop(device);
        let d = PyDict::new(py);
        let list = PyList::empty(py);
        for (a, tag) in allocations.iter().zip(tags) {
            let entry = allocation_dict(py, a)?;
            entry.set_item("tag", tag)?;
            list.append(entry)?;
        }
        d.set_item("allocations", list)?;
        d.set_item("host_blocks", host_blocks)?;
        d.set_item("streams", streams)?;
        d.set_item("events", events)?;
        Ok(d)
    }

    // ----- streams, events and the simulated clock -----

    /// Unmaps/frees the coldest cached memory until at most `bytes` are reserved; returns the
    /// bytes still reserved (live blocks are never touched).
    fn trim_to(&self, py: Python<'_>, bytes: Size<name::bytes>) -> PyResult<u64> {
        self.run(py, |d| d.trim_to(bytes.0))
    }

    /// Caps what the allocator may reserve at `fraction` (0..1) of the device.
    fn set_per_process_memory_fraction(&self, py: Python<'_>, fraction: f64) -> PyResult<()> {
        self.run(py, |d| d.set_memory_fraction(fraction))
    }

    /// The allocator's settings string (PYTORCH_NPU_ALLOC_CONF grammar).
    #[getter]
    fn alloc_conf(&self) -> &str {
        &self.config.alloc_conf
    }

    /// Starts or stops recording the allocator's history (`max_entries` newest entries kept).
    #[pyo3(signature = (enabled = true, max_entries = None))]
    fn record_memory_history(&self, enabled: bool, max_entries: Option<Uint<name::max_entries>>) -> PyResult<()> {
        let max_entries = max_entries.map_or(1_000_000, |m| m.0);
        // The history grows as entries come; a bound past memory is simply never reached.
        self.inner.lock().record_memory_history(enabled, usize::try_from(max_entries).unwrap_or(usize::MAX));
        Ok(())
    }

    /// Segments with their blocks, in PyTorch's snapshot schema.
    fn _segments<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let segments = self.inner.lock().segments();
        let out = PyList::empty(py);
        for s in segments {
            let d = PyDict::new(py);
            let blocks = PyList::empty(py);
            let (mut allocated, mut requested) = (0u64, 0u64);
            for b in &s.blocks {
                let bd = PyDict::new(py);
                bd.set_item("address", b.address)?;
                bd.set_item("size", b.size)?;
                bd.set_item("requested_size", b.requested_size)?;
                bd.set_item("state", if b.allocated { "active_allocated" } else { "inactive" })?;
                bd.set_item("frames", PyList::empty(py))?;
                blocks.append(bd)?;
                if b.allocated {
                    allocated += b.size;
                    requested += b.requested_size;
                }
            }
            d.set_item("device", 0)?;
            d.set_item("address", s.address)?;
            d.set_item("total_size", s.total_size)?;
            d.set_item("allocated_size", allocated)?;
            d.set_item("active_size", allocated)?;
            d.set_item("requested_size", requested)?;
            d.set_item("stream", 0)?;
            d.set_item("segment_type", if s.pool == PoolKind::Small { "small" } else { "large" })?;
            d.set_item("segment_pool_id", (0, 0))?;
            d.set_item("is_expandable", s.is_expandable)?;
            d.set_item("frames", PyList::empty(py))?;
            d.set_item("blocks", blocks)?;
            out.append(d)?;
        }
        Ok(out)
    }

    /// The recorded trace entries, in PyTorch's device-trace schema.
    fn _trace<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let entries = self.inner.lock().history();
        let out = PyList::empty(py);
        for e in entries {
            let d = PyDict::new(py);
            d.set_item("action", e.action.name())?;
            // PyTorch's OOM entry carries the device's free bytes as `device_free` (no address).
            d.set_item(if e.action == Action::Oom { "device_free" } else { "addr" }, e.addr)?;
            d.set_item("size", e.size)?;
            d.set_item("stream", e.stream)?;
            d.set_item("time_us", e.time_us)?;
            d.set_item("frames", PyList::empty(py))?;
            out.append(d)?;
        }
        Ok(out)
    }

    /// Allocator statistics under PyTorch's keys (`allocated_bytes.all.current`, `num_ooms`, ...).
    fn memory_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let pairs = self.inner.lock().pool_stats().pairs();
        let dict = PyDict::new(py);
        for (k, v) in pairs {
            dict.set_item(k, v)?;
        }
        Ok(dict)
    }

    /// Bytes in live blocks (`allocated_bytes.all.current`).
    fn memory_allocated(&self) -> u64 {
        self.inner.lock().pool_stats().allocated_bytes.all.current
    }

    /// Peak of `memory_allocated()` since start or the last reset.
    fn max_memory_allocated(&self) -> u64 {
        self.inner.lock().pool_stats().allocated_bytes.all.peak
    }

    /// Bytes the allocator holds from the device (`reserved_bytes.all.current`).
    fn memory_reserved(&self) -> u64 {
        self.inner.lock().pool_stats().reserved_bytes.all.current
    }

    fn max_memory_reserved(&self) -> u64 {
        self.inner.lock().pool_stats().reserved_bytes.all.peak
    }

    fn reset_peak_memory_stats(&self) {
        self.inner.lock().reset_peak_stats();
    }

    /// Fragmentation diagnostics: internal waste, cached memory, external fragmentation, free
    /// extents by size class and per-segment occupancy.
    fn fragmentation<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let f = self.inner.lock().fragmentation();
        let dict = PyDict::new(py);
        dict.set_item("requested", f.requested)?;
        dict.set_item("allocated", f.allocated)?;
        dict.set_item("reserved", f.reserved)?;
        dict.set_item("internal_waste", f.internal_waste())?;
        dict.set_item("reserved_unallocated", f.reserved_unallocated())?;
        dict.set_item("free", f.free)?;
        dict.set_item("largest_free_extent", f.largest_free_extent)?;
        dict.set_item("external", f.external())?;
        let buckets = PyList::empty(py);
        for (class, n, bytes) in &f.free_by_bucket {
            buckets.append((class, n, bytes))?;
        }
        dict.set_item("free_by_bucket", buckets)?;
        let segments = PyList::empty(py);
        for s in &f.segments {
            let d = PyDict::new(py);
            d.set_item("address", s.ptr)?;
            d.set_item("size", s.size)?;
            d.set_item("allocated", s.allocated)?;
            d.set_item("blocks", s.blocks)?;
            d.set_item("free_blocks", s.free_blocks)?;
            segments.append(d)?;
        }
        dict.set_item("segments", segments)?;
        dict.set_item("summary", f.summary())?;
        Ok(dict)
    }
}
