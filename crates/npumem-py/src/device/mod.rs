//! `npumem._native.Device`: the simulated device, thread-safe behind one mutex.
//!
//! The class is frozen (no PyO3 borrow flag); every method locks the core `Device` for its
//! duration. Bulk byte transfers of at least `DETACH_BYTES` detach from the interpreter while
//! they copy, so other Python threads run meanwhile.
//!
//! The methods are split by concern (pyo3's `multiple-pymethods`): allocation, batches and the
//! replay here; byte access in `io`; accounting and snapshots in `stats`; streams, events and
//! the cost model in `streams`; virtual-memory calls, faults and pool attributes in `vmm`;
//! `malloc`, `free` and `buffer` with one exact int are served by C-API methods in `fast`.

use npumem_core::acl::MemPoolAttr;
use npumem_core::backend::{FaultPlan, SimConfig};
use npumem_core::device::{Replay, ReplayEvents, ReplaySample};
use npumem_core::pool::Action;
use npumem_core::pool::PoolKind;
use npumem_core::sanitizer::{FindingKind, HOST, SanitizerMode};
use npumem_core::stream::{CostModel, duration_from_us};
use npumem_core::units::format_size;
use npumem_core::vm::PageSize;
use npumem_core::{AclError, AllocatorKind, BackendKind, Device, DeviceConfig, MemAttr, Policy};
use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use crate::args::{
    Contiguous, CopyKind, Event, Int32, MemAttrArg, Pointers, PolicyArg, PoolAttrArg, Ptr, Real, Sink, Size, Source,
    Stream, Tag, Uint, array_slice, float_arg, name, size_arg,
};
use crate::buffer::new_buffer;
use crate::errors::{catch_panics, guard, to_py};
use crate::shared::{Locked, SharedDevice};
use crate::view::DeviceView;

pub(crate) mod fast;
mod io;
mod stats;
mod streams;
mod vmm;

/// Transfers at least this large release the GIL while they copy.
pub(crate) const DETACH_BYTES: usize = 1 << 20;

#[pyclass(module = "npumem._native", name = "Device", frozen, subclass)]
pub struct PyDevice {
    inner: SharedDevice,
    config: DeviceConfig,
}

/// A raw view of a Python buffer that may cross into a detached section.
struct RawView {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the view points into a Python buffer export that the caller keeps alive (and its memory
// pinned) until the detached section returns; only plain bytes are read or written through it.
unsafe impl Send for RawView {}

impl PyDevice {
    /// The core device, locked.
    pub(crate) fn lock_inner(&self) -> Locked<'_> {
        self.inner.lock()
    }

    /// Runs `f` with a raw view of a C-contiguous Python buffer (writable if asked), detached
    /// from the interpreter for large transfers; the export is held until `f` returns.
    fn with_buffer<const WRITABLE: bool>(
        &self,
        py: Python<'_>,
        buffer: Contiguous<WRITABLE>,
        f: impl FnOnce(&mut Device, RawView) -> Result<(), AclError> + Send,
    ) -> PyResult<()> {
        let view = RawView { ptr: buffer.0.buf_ptr().cast(), len: buffer.0.len_bytes() };
        let large = view.len >= DETACH_BYTES;
        let result = self.run_detached_if(py, large, move |d| f(d, view));
        drop(buffer);
        result
    }

    fn malloc_impl(
        &self,
        py: Python<'_>,
        size: Size,
        policy: Option<PolicyArg>,
        stream: Option<Stream>,
        tag: Option<Tag>,
        padded: bool,
    ) -> PyResult<u64> {
        let (policy, stream) = (policy.map_or(Policy::HugeFirst, |p| p.0), stream.map_or(0, |s| s.0));
        self.run(py, |d| {
            let ptr = d.malloc_on(size.0, policy, padded, stream)?;
            if let Some(Tag(tag)) = &tag {
                d.set_tag(ptr, tag)?;
            }
            Ok(ptr)
        })
    }

    /// `Device.buffer` with its arguments converted: `size` bytes on `stream` under `policy`.
    pub(crate) fn make_buffer<'py>(
        &self,
        py: Python<'py>,
        size: u64,
        policy: Policy,
        stream: u64,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (ptr, owner) = self.run_locked(py, false, |d| {
            let ptr = d.malloc_held(size, policy, stream)?;
            Ok((ptr, d.share()))
        })?;
        new_buffer(py, owner, ptr, size)
    }

    /// Runs `f` on the locked device; with `detach`, outside the interpreter so other Python
    /// threads run meanwhile (for transfers of at least `DETACH_BYTES`).
    fn run_detached_if<T: Send>(
        &self,
        py: Python<'_>,
        detach: bool,
        f: impl FnOnce(&mut Device) -> Result<T, AclError> + Send,
    ) -> PyResult<T> {
        self.run_locked(py, detach, |d| f(d))
    }

    /// `run_detached_if` with the lock itself (to `share` the device with a new holder in the
    /// same critical section).
    fn run_locked<T: Send>(
        &self,
        py: Python<'_>,
        detach: bool,
        f: impl FnOnce(&mut Locked<'_>) -> Result<T, AclError> + Send,
    ) -> PyResult<T> {
        self.call(py, detach, f).map_err(|e| to_py(py, e))
    }

    /// Runs `f` on the locked device (detached with `detach`) and logs the backend's warnings;
    /// the core's error is returned as it is (npumem.acl makes a return code of it).
    pub(crate) fn call<T: Send>(
        &self,
        py: Python<'_>,
        detach: bool,
        f: impl FnOnce(&mut Locked<'_>) -> Result<T, AclError> + Send,
    ) -> Result<T, AclError> {
        let inner = &self.inner;
        let work = move || {
            let mut device = inner.lock();
            let result = catch_panics(|| f(&mut device));
            (result, device.take_warnings())
        };
        let (result, warnings) = if detach { py.detach(work) } else { work() };
        if !warnings.is_empty() {
            // The call's result (an allocation, say) must reach the caller whatever logging does.
            if let Err(e) = log_warnings(py, &warnings) {
                e.write_unraisable(py, None);
            }
        }
        result
    }

    fn run<T: Send>(&self, py: Python<'_>, f: impl FnOnce(&mut Device) -> Result<T, AclError> + Send) -> PyResult<T> {
        self.run_detached_if(py, false, f)
    }
}

/// Records each of the backend's warnings (a free the runtime refused) at WARNING level on the
/// `npumem` logger.
fn log_warnings(py: Python<'_>, warnings: &[String]) -> PyResult<()> {
    let logger = py.import("logging")?.call_method1("getLogger", ("npumem",))?;
    for w in warnings {
        logger.call_method1("warning", ("%s", w))?;
    }
    Ok(())
}

/// The runtime's device a `device_id` names: any id the runtime has on `acl` and `cuda` (the
/// runtime checks it when the device opens), only 0 on the simulator and host memory.
fn device_ordinal(backend: BackendKind, device_id: u64) -> Result<i32, AclError> {
    match backend {
        BackendKind::Acl | BackendKind::Cuda => i32::try_from(device_id).map_err(|_| {
            AclError::invalid_param(format!("device_id={device_id} is not a device of the runtime (0 to {})", i32::MAX))
        }),
        _ if device_id == 0 => Ok(0),
        _ => Err(AclError::invalid_param(format!(
            "device_id={device_id}: the {} backend has one device, 0; several simulated devices sharing one \
             address space are npumem.acl's system (va_slice)",
            backend.name()
        ))),
    }
}

#[pymethods]
impl PyDevice {
    #[new]
    #[pyo3(signature = (capacity = None, *, normal_page = None, giant_frames = None, backend = "sim", allocator = "npumem", alloc_conf = None, preset = "ascend910b", sanitizer = "collect", faults = false, va_slice = None, device_id = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        capacity: Option<Size<name::capacity>>,
        normal_page: Option<Size<name::normal_page>>,
        giant_frames: Option<Uint<name::giant_frames>>,
        backend: &str,
        allocator: &str,
        alloc_conf: Option<&str>,
        preset: &str,
        sanitizer: &str,
        faults: bool,
        va_slice: Option<(u32, u32)>,
        device_id: Option<Uint<name::device_id>>,
    ) -> PyResult<Self> {
        let capacity = capacity.map(|c| c.0);
        let device_id = device_id.map_or(0, |d| d.0);
        let giant_frames = giant_frames.map_or(0, |g| g.0);
        let normal_page = normal_page.map(|p| p.0);
        guard(py, || {
            let backend = BackendKind::parse(backend)?;
            let ordinal = device_ordinal(backend, device_id)?;
            // A real backend's defaults come from it (its memory, its page), asked only when needed.
            let defaults = || backend.defaults(ordinal);
            let normal_page = match normal_page {
                None => defaults()?.1,
                Some(bytes) => PageSize::from_bytes(bytes)
                    .filter(|p| matches!(p, PageSize::Size4K | PageSize::Size64K))
                    .ok_or_else(|| {
                        AclError::invalid_param(format!(
                            "normal_page must be \"4KiB\" or \"64KiB\", not {}",
                            format_size(bytes)
                        ))
                    })?,
            };
            let capacity = match capacity {
                Some(c) => c,
                None => defaults()?.0,
            };
            let sim = SimConfig { capacity, normal_page, giant_frames };
            let config = DeviceConfig {
                sim,
                backend,
                ordinal,
                allocator: AllocatorKind::parse(allocator)?,
                alloc_conf: alloc_conf.unwrap_or_default().to_string(),
                faults,
                va_slice,
            };
            let mut device = Device::new(config.clone())?;
            device.scheduler().cost = CostModel::preset(preset)?;
            device.set_sanitizer(SanitizerMode::parse(sanitizer)?);
            Ok(PyDevice { inner: SharedDevice::new(device), config })
        })
    }

    /// Device memory in bytes.
    #[getter]
    fn capacity(&self) -> u64 {
        self.config.sim.capacity
    }

    /// The normal page size in bytes.
    #[getter]
    fn normal_page(&self) -> u64 {
        self.config.sim.normal_page.bytes()
    }

    #[getter]
    fn giant_frames(&self) -> u64 {
        self.config.sim.giant_frames
    }

    /// `[start, end)` of the addresses this device hands out (a slice of the device window
    /// when made with `va_slice`).
    #[getter]
    fn va_window(&self) -> (u64, u64) {
        self.inner.lock().va_window()
    }

    /// Whether `ptr` is this device's memory and no other device's, of the same runtime too
    /// (AscendCL's devices share one address window).
    fn holds(&self, ptr: u64) -> bool {
        self.inner.lock().holds(ptr)
    }

    #[getter]
    fn backend(&self) -> &'static str {
        self.inner.lock().backend_name()
    }

    #[getter]
    fn allocator(&self) -> &'static str {
        self.inner.lock().allocator_name()
    }

    /// `aclrtMalloc` for `stream` (the default stream when None); `tag` names the allocation
    /// in sanitizer findings and leak reports.
    #[pyo3(signature = (size, policy = None, stream = None, tag = None))]
    fn malloc(
        &self,
        py: Python<'_>,
        size: Size,
        policy: Option<PolicyArg>,
        stream: Option<Stream>,
        tag: Option<Tag>,
    ) -> PyResult<u64> {
        self.malloc_impl(py, size, policy, stream, tag, true)
    }

    /// `aclrtMallocAlign32` for `stream`.
    #[pyo3(signature = (size, policy = None, stream = None, tag = None))]
    fn malloc_align32(
        &self,
        py: Python<'_>,
        size: Size,
        policy: Option<PolicyArg>,
        stream: Option<Stream>,
        tag: Option<Tag>,
    ) -> PyResult<u64> {
        self.malloc_impl(py, size, policy, stream, tag, false)
    }

    /// `aclrtFree`; with `stream`, the memory is reusable once that stream reaches this point
    /// (an event-driven free), else once the block's streams finish their queued work.
    #[pyo3(signature = (ptr, stream = None))]
    fn free(&self, py: Python<'_>, ptr: Ptr, stream: Option<Stream>) -> PyResult<()> {
        self.run(py, |d| d.free_on(ptr.0, stream.map(|s| s.0)))
    }

    /// Allocates one block per size (a 1-D uint64 array) in one call, without the GIL; all or
    /// nothing. Returns the pointers as a uint64 array.
    #[pyo3(signature = (sizes, policy = None, stream = None))]
    fn malloc_many<'py>(
        &self,
        py: Python<'py>,
        sizes: PyReadonlyArray1<'py, u64>,
        policy: Option<PolicyArg>,
        stream: Option<Stream>,
    ) -> PyResult<Bound<'py, PyArray1<u64>>> {
        let (policy, stream) = (policy.map_or(Policy::HugeFirst, |p| p.0), stream.map_or(0, |s| s.0));
        let sizes = array_slice(&sizes)?;
        let ptrs = self.run_detached_if(py, true, |d| d.malloc_many(sizes, policy, stream))?;
        Ok(PyArray1::from_vec(py, ptrs))
    }

    /// Frees every pointer of a 1-D uint64 array in one call, without the GIL; nothing is freed
    /// if one of them is not a live allocation.
    fn free_many(&self, py: Python<'_>, ptrs: PyReadonlyArray1<'_, u64>) -> PyResult<()> {
        let ptrs = array_slice(&ptrs)?;
        self.run_detached_if(py, true, |d| d.free_many(ptrs))
    }

    /// Replays a trace given as equal-length arrays (is_alloc as uint8, id, size, and optionally
    /// each event's device stream) in Rust, `chunk` events at a time (all at once when 0) without
    /// the GIL; between chunks `progress(done, total)` is called (when given) and Ctrl-C is
    /// honoured. With `sample_every` > 0 the memory in use is sampled after every that many
    /// events. Returns allocs, ooms, peak_live, first_oom, the pointers still live (`leftover`)
    /// and the samples (`sample_event`, `sample_live`, `sample_allocated`, `sample_reserved`).
    #[pyo3(signature = (is_alloc, ids, sizes, streams = None, policy = None, stop_on_oom = false,
                        sample_every = 0, chunk = 0, progress = None))]
    #[allow(clippy::too_many_arguments)]
    fn _replay<'py>(
        &self,
        py: Python<'py>,
        is_alloc: PyReadonlyArray1<'py, u8>,
        ids: PyReadonlyArray1<'py, u64>,
        sizes: PyReadonlyArray1<'py, u64>,
        streams: Option<PyReadonlyArray1<'py, u64>>,
        policy: Option<PolicyArg>,
        stop_on_oom: bool,
        sample_every: u64,
        chunk: usize,
        progress: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let policy = policy.map_or(Policy::HugeFirst, |p| p.0);
        let (a, i, s) = (array_slice(&is_alloc)?, array_slice(&ids)?, array_slice(&sizes)?);
        let st = streams.as_ref().map(array_slice).transpose()?;
        let n = a.len();
        if i.len() != n || s.len() != n || st.is_some_and(|st| st.len() != n) {
            return Err(to_py(
                py,
                AclError::invalid_param("is_alloc, ids, sizes (and streams) must have the same length"),
            ));
        }
        let id_bound = i.iter().max().map_or(0, |&m| m.saturating_add(1));
        let mut replay = Replay::new(id_bound, n as u64, sample_every);
        let chunk = if chunk == 0 { n.max(1) } else { chunk };
        let mut start = 0;
        while start < n && !replay.stopped() {
            let end = n.min(start.saturating_add(chunk));
            let events = ReplayEvents {
                is_alloc: &a[start..end],
                ids: &i[start..end],
                sizes: &s[start..end],
                streams: st.map(|st| &st[start..end]),
            };
            let r = &mut replay;
            self.run_detached_if(py, true, move |d| d.replay_chunk(r, events, policy, stop_on_oom))?;
            start = end;
            let between = py.check_signals().and_then(|()| progress.map_or(Ok(()), |p| p.call1((start, n)).map(drop)));
            if let Err(e) = between {
                // Interrupted (Ctrl-C, or the progress callback raised): what the replay holds
                // goes back before the error propagates.
                let left = std::mem::replace(&mut replay, Replay::new(0, 0, 0)).finish().leftover;
                self.run(py, |d| d.free_many(&left))?;
                return Err(e);
            }
        }
        let samples = replay.samples().to_vec();
        let out = replay.finish();
        let dict = PyDict::new(py);
        dict.set_item("allocs", out.allocs)?;
        dict.set_item("ooms", out.ooms)?;
        dict.set_item("peak_live", out.peak_live)?;
        dict.set_item("first_oom", out.first_oom)?;
        dict.set_item("leftover", PyArray1::from_vec(py, out.leftover))?;
        let column = |f: fn(&ReplaySample) -> u64| PyArray1::from_iter(py, samples.iter().map(f));
        dict.set_item("sample_event", column(|x| x.event))?;
        dict.set_item("sample_live", column(|x| x.live))?;
        dict.set_item("sample_allocated", column(|x| x.allocated))?;
        dict.set_item("sample_reserved", column(|x| x.reserved))?;
        Ok(dict)
    }

    /// One owning allocation of `nbytes` on `stream`: a `DeviceBuffer` that converts to its
    /// pointer and frees its block when collected (a plain `free` of it is refused meanwhile).
    // A call with one exact int takes `fast::BUFFER`, installed over this method.
    #[pyo3(signature = (nbytes, policy = None, stream = None))]
    fn buffer<'py>(
        &self,
        py: Python<'py>,
        nbytes: Size<name::nbytes>,
        policy: Option<PolicyArg>,
        stream: Option<Stream>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (policy, stream) = (policy.map_or(Policy::HugeFirst, |p| p.0), stream.map_or(0, |s| s.0));
        self.make_buffer(py, nbytes.0, policy, stream)
    }

    /// Marks the allocation at `ptr` as used by `stream` too: its free waits for that stream.
    fn record_stream(&self, py: Python<'_>, ptr: Ptr, stream: Stream) -> PyResult<()> {
        self.run(py, |d| d.record_stream(ptr.0, stream.0))
    }

    fn malloc_host(&self, py: Python<'_>, size: Size) -> PyResult<u64> {
        self.run(py, |d| d.malloc_host(size.0))
    }

    fn free_host(&self, py: Python<'_>, ptr: Ptr) -> PyResult<()> {
        self.run(py, |d| d.free_host(ptr.0))
    }

    fn __repr__(&self) -> String {
        let c = self.config.sim;
        let capacity = format_size(c.capacity);
        let capacity =
            if capacity.contains('.') { c.capacity.to_string() } else { format!("{:?}", capacity.replace(' ', "")) };
        let conf = if self.config.alloc_conf.is_empty() {
            String::new()
        } else {
            format!(", alloc_conf={:?}", self.config.alloc_conf)
        };
        let backend = self.config.backend.name();
        format!(
            "Device(capacity={}, normal_page={:?}, giant_frames={}, backend={backend:?}, allocator={:?}{conf})",
            capacity,
            c.normal_page.label(),
            c.giant_frames,
            self.inner.lock().allocator_name()
        )
    }
}

fn allocation_dict<'py>(py: Python<'py>, a: &npumem_core::Allocation) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("ptr", a.ptr)?;
    dict.set_item("size", a.size)?;
    dict.set_item("booked", a.booked)?;
    dict.set_item("granted", a.granted)?;
    dict.set_item("policy", a.policy as u32)?;
    dict.set_item("page_size", a.page.bytes())?;
    dict.set_item("stream", a.stream)?;
    Ok(dict)
}

/// A cost model as a dict (bandwidths in bytes/s, times in ns).
fn cost_dict<'py>(py: Python<'py>, c: &CostModel) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("name", &c.name)?;
    for (k, v) in [
        ("hbm_bandwidth", c.hbm_bandwidth),
        ("pcie_pinned_bandwidth", c.pcie_pinned_bandwidth),
        ("pcie_pageable_bandwidth", c.pcie_pageable_bandwidth),
        ("p2p_bandwidth", c.p2p_bandwidth),
        ("pcie_latency_ns", c.pcie_latency_ns),
        ("launch_ns", c.launch_ns),
        ("driver_alloc_ns", c.driver_alloc_ns),
        ("map_ns", c.map_ns),
    ] {
        d.set_item(k, v)?;
    }
    Ok(d)
}

/// The fields of a preset cost model ("ascend910b", "ascend310p") without a device.
#[pyfunction]
pub fn cost_preset<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyDict>> {
    let c = CostModel::preset(name).map_err(|e| to_py(py, e))?;
    cost_dict(py, &c)
}
