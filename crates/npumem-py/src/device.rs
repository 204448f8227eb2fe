//! `npumem._native.Device`: the simulated device, thread-safe behind one mutex.
//!
//! The class is frozen (no PyO3 borrow flag); every method locks the core `Device` for its
//! duration. Bulk byte transfers of at least `DETACH_BYTES` detach from the interpreter while
//! they copy, so other Python threads run meanwhile.

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
use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::{PyOverflowError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use crate::buffer::new_buffer;
use crate::convert::{array_slice, enum_arg, i32_arg, size_arg, uint_arg};
use crate::errors::{catch_panics, guard, to_py};
use crate::shared::{Locked, SharedDevice};
use crate::view::DeviceView;

/// Transfers at least this large release the GIL while they copy.
const DETACH_BYTES: usize = 1 << 20;

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

fn contiguous_buffer(obj: &Bound<'_, PyAny>, writable: bool) -> PyResult<PyUntypedBuffer> {
    let buf = PyUntypedBuffer::get(obj)?;
    if buf.format().to_bytes().contains(&b'O') {
        return Err(to_py(
            obj.py(),
            AclError::invalid_param(
                "the buffer holds Python object pointers, not data; convert it to a numeric dtype first",
            ),
        ));
    }
    if !buf.is_c_contiguous() {
        return Err(to_py(
            obj.py(),
            AclError::invalid_param("the buffer is not C-contiguous; pass numpy.ascontiguousarray(x)"),
        ));
    }
    if writable && buf.readonly() {
        return Err(to_py(obj.py(), AclError::invalid_param("the buffer is read-only; pass a writable one")));
    }
    Ok(buf)
}

impl PyDevice {
    /// The core device, locked.
    pub(crate) fn lock_inner(&self) -> Locked<'_> {
        self.inner.lock()
    }

    /// Runs `f` with a raw view of a C-contiguous Python buffer (writable if asked), detached
    /// from the interpreter for large transfers; the export is held until `f` returns.
    fn with_buffer(
        &self,
        py: Python<'_>,
        buffer: &Bound<'_, PyAny>,
        writable: bool,
        f: impl FnOnce(&mut Device, RawView) -> Result<(), AclError> + Send,
    ) -> PyResult<()> {
        let buf = contiguous_buffer(buffer, writable)?;
        let view = RawView { ptr: buf.buf_ptr().cast(), len: buf.len_bytes() };
        let large = view.len >= DETACH_BYTES;
        let result = self.run_detached_if(py, large, move |d| f(d, view));
        drop(buf);
        result
    }

    fn malloc_impl(
        &self,
        py: Python<'_>,
        size: &Bound<'_, PyAny>,
        policy: Option<&Bound<'_, PyAny>>,
        stream: Option<&Bound<'_, PyAny>>,
        tag: Option<&Bound<'_, PyAny>>,
        padded: bool,
    ) -> PyResult<u64> {
        let tag = tag
            .map(|t| {
                t.cast::<pyo3::types::PyString>().map(|t| t.to_string()).map_err(|_| {
                    let got = t.get_type().name().map(|n| n.to_string()).unwrap_or_default();
                    pyo3::exceptions::PyTypeError::new_err(format!("tag must be a str, got {got}"))
                })
            })
            .transpose()?;
        let size = size_arg(size, "size")?;
        let policy = policy.map(|p| enum_arg(p, "policy")).transpose()?.unwrap_or(0);
        let stream = opt_stream(stream)?.unwrap_or(0);
        self.run(py, |d| {
            let ptr = d.malloc_on(size, Policy::from_raw(policy)?, padded, stream)?;
            if let Some(tag) = &tag {
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
        policy: u32,
        stream: u64,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (ptr, owner) = self.run_locked(py, false, |d| {
            let ptr = d.malloc_held(size, Policy::from_raw(policy)?, stream)?;
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
        result.map_err(|e| to_py(py, e))
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
        capacity: Option<&Bound<'_, PyAny>>,
        normal_page: Option<&Bound<'_, PyAny>>,
        giant_frames: Option<&Bound<'_, PyAny>>,
        backend: &str,
        allocator: &str,
        alloc_conf: Option<&str>,
        preset: &str,
        sanitizer: &str,
        faults: bool,
        va_slice: Option<(u32, u32)>,
        device_id: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let capacity = capacity.map(|c| size_arg(c, "capacity")).transpose()?;
        let device_id = device_id.map(|d| uint_arg(d, "device_id")).transpose()?.unwrap_or(0);
        let giant_frames = giant_frames.map(|g| uint_arg(g, "giant_frames")).transpose()?.unwrap_or(0);
        let normal_page = normal_page.map(|p| size_arg(p, "normal_page")).transpose()?;
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
        size: &Bound<'_, PyAny>,
        policy: Option<&Bound<'_, PyAny>>,
        stream: Option<&Bound<'_, PyAny>>,
        tag: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<u64> {
        self.malloc_impl(py, size, policy, stream, tag, true)
    }

    /// `aclrtMallocAlign32` for `stream`.
    #[pyo3(signature = (size, policy = None, stream = None, tag = None))]
    fn malloc_align32(
        &self,
        py: Python<'_>,
        size: &Bound<'_, PyAny>,
        policy: Option<&Bound<'_, PyAny>>,
        stream: Option<&Bound<'_, PyAny>>,
        tag: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<u64> {
        self.malloc_impl(py, size, policy, stream, tag, false)
    }

    /// `aclrtFree`; with `stream`, the memory is reusable once that stream reaches this point
    /// (an event-driven free), else once the block's streams finish their queued work.
    #[pyo3(signature = (ptr, stream = None))]
    fn free(&self, py: Python<'_>, ptr: &Bound<'_, PyAny>, stream: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let ptr = uint_arg(ptr, "ptr")?;
        let stream = opt_stream(stream)?;
        self.run(py, |d| d.free_on(ptr, stream))
    }

    /// Allocates one block per size (a 1-D uint64 array) in one call, without the GIL; all or
    /// nothing. Returns the pointers as a uint64 array.
    #[pyo3(signature = (sizes, policy = None, stream = None))]
    fn malloc_many<'py>(
        &self,
        py: Python<'py>,
        sizes: PyReadonlyArray1<'py, u64>,
        policy: Option<&Bound<'_, PyAny>>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Bound<'py, PyArray1<u64>>> {
        let policy = policy.map(|p| enum_arg(p, "policy")).transpose()?.unwrap_or(0);
        let stream = opt_stream(stream)?.unwrap_or(0);
        let sizes = array_slice(&sizes)?;
        let ptrs = self.run_detached_if(py, true, |d| d.malloc_many(sizes, Policy::from_raw(policy)?, stream))?;
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
        policy: Option<&Bound<'_, PyAny>>,
        stop_on_oom: bool,
        sample_every: u64,
        chunk: usize,
        progress: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let policy = Policy::from_raw(policy.map(|p| enum_arg(p, "policy")).transpose()?.unwrap_or(0))
            .map_err(|e| to_py(py, e))?;
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
    // A call with one exact int takes `buffer::fast_buffer`, installed over this method.
    #[pyo3(signature = (nbytes, policy = None, stream = None))]
    fn buffer<'py>(
        &self,
        py: Python<'py>,
        nbytes: &Bound<'_, PyAny>,
        policy: Option<&Bound<'_, PyAny>>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let size = size_arg(nbytes, "nbytes")?;
        let policy = policy.map(|p| enum_arg(p, "policy")).transpose()?.unwrap_or(0);
        let stream = opt_stream(stream)?.unwrap_or(0);
        self.make_buffer(py, size, policy, stream)
    }

    /// Marks the allocation at `ptr` as used by `stream` too: its free waits for that stream.
    fn record_stream(&self, py: Python<'_>, ptr: &Bound<'_, PyAny>, stream: &Bound<'_, PyAny>) -> PyResult<()> {
        let (ptr, stream) = (uint_arg(ptr, "ptr")?, uint_arg(stream, "stream")?);
        self.run(py, |d| d.record_stream(ptr, stream))
    }

    fn malloc_host(&self, py: Python<'_>, size: &Bound<'_, PyAny>) -> PyResult<u64> {
        let size = size_arg(size, "size")?;
        self.run(py, |d| d.malloc_host(size))
    }

    fn free_host(&self, py: Python<'_>, ptr: &Bound<'_, PyAny>) -> PyResult<()> {
        let ptr = uint_arg(ptr, "ptr")?;
        self.run(py, |d| d.free_host(ptr))
    }

    #[pyo3(signature = (dst, dst_max, src, count, kind = None))]
    fn memcpy(
        &self,
        py: Python<'_>,
        dst: &Bound<'_, PyAny>,
        dst_max: &Bound<'_, PyAny>,
        src: &Bound<'_, PyAny>,
        count: &Bound<'_, PyAny>,
        kind: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let (dst, src) = (uint_arg(dst, "dst")?, uint_arg(src, "src")?);
        let (dst_max, count) = (size_arg(dst_max, "dst_max")?, size_arg(count, "count")?);
        let kind = kind.map(|k| enum_arg(k, "kind")).transpose()?.unwrap_or(4);
        self.run_detached_if(py, count >= DETACH_BYTES as u64, |d| d.memcpy(dst, dst_max, src, count, kind))
    }

    fn memset(
        &self,
        py: Python<'_>,
        ptr: &Bound<'_, PyAny>,
        dst_max: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        count: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let ptr = uint_arg(ptr, "ptr")?;
        let value = i32_arg(value, "value")?;
        let (dst_max, count) = (size_arg(dst_max, "dst_max")?, size_arg(count, "count")?);
        self.run(py, |d| d.memset(ptr, dst_max, value, count))
    }

    /// Writes the bytes of a C-contiguous buffer (bytes, bytearray, memoryview, numpy array) at
    /// `ptr`. With `stream`, the copy is queued on that stream; the buffer is pageable host
    /// memory, so the call returns once the copy has completed, as in the real runtime.
    #[pyo3(signature = (ptr, buffer, stream = None))]
    fn write(
        &self,
        py: Python<'_>,
        ptr: &Bound<'_, PyAny>,
        buffer: &Bound<'_, PyAny>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let (ptr, stream) = (uint_arg(ptr, "ptr")?, opt_stream(stream)?);
        self.with_buffer(py, buffer, false, move |d, v| {
            // SAFETY: `with_buffer` keeps the exported memory valid and unmoved while this runs;
            // it is read as plain bytes.
            let data = unsafe { std::slice::from_raw_parts(v.ptr as *const u8, v.len) };
            match stream {
                Some(s) => d.write_on(ptr, data, s).map(|_| ()),
                None => d.write(ptr, data),
            }
        })
    }

    /// Checks that `count` bytes at `ptr` may be read or written (without touching them).
    fn _check_range(&self, py: Python<'_>, ptr: &Bound<'_, PyAny>, count: &Bound<'_, PyAny>) -> PyResult<()> {
        let (ptr, count) = (uint_arg(ptr, "ptr")?, size_arg(count, "count")?);
        self.run(py, |d| d.check_range(ptr, count))
    }

    /// A direct view of `nbytes` at `ptr` (host backend): an object exporting that memory through
    /// the buffer protocol; the allocation cannot be freed while it lives.
    fn _view(slf: &Bound<'_, Self>, ptr: &Bound<'_, PyAny>, nbytes: &Bound<'_, PyAny>) -> PyResult<DeviceView> {
        let (ptr, nbytes) = (uint_arg(ptr, "ptr")?, size_arg(nbytes, "nbytes")?);
        let py = slf.py();
        let len = usize::try_from(nbytes).map_err(|_| to_py(py, AclError::invalid_param("nbytes too large")))?;
        let base = slf.get().run(py, |d| d.pin(ptr, nbytes))?;
        Ok(DeviceView::new(slf.clone().unbind(), base, ptr, len))
    }

    /// Reads `count` bytes at `ptr` into a new `bytes`.
    fn read<'py>(
        &self,
        py: Python<'py>,
        ptr: &Bound<'_, PyAny>,
        count: &Bound<'_, PyAny>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let ptr = uint_arg(ptr, "ptr")?;
        let count = size_arg(count, "count")?;
        // Check the range before allocating the result, so a bad count costs nothing.
        self.run(py, |d| d.check_range(ptr, count))?;
        let len = usize::try_from(count).map_err(|_| to_py(py, AclError::invalid_param("count too large")))?;
        let mut failure = None;
        let bytes = PyBytes::new_with(py, len, |out| {
            if let Err(e) = guard(py, || self.inner.lock().read(ptr, out)) {
                failure = Some(e);
            }
            Ok(())
        })?;
        failure.map_or(Ok(bytes), Err)
    }

    /// Maps the pages under `size` bytes at `ptr` (inside a live allocation) a second time, at a
    /// new address of this device (an IPC import); returns the address of `ptr`'s byte there.
    fn _map_alias(&self, py: Python<'_>, ptr: &Bound<'_, PyAny>, size: &Bound<'_, PyAny>) -> PyResult<u64> {
        let (ptr, size) = (uint_arg(ptr, "ptr")?, size_arg(size, "size")?);
        self.run(py, |d| d.map_alias(ptr, size))
    }

    /// Undoes the `_map_alias` whose range holds `addr`.
    fn _unmap_alias(&self, py: Python<'_>, addr: &Bound<'_, PyAny>) -> PyResult<()> {
        let addr = uint_arg(addr, "addr")?;
        self.run(py, |d| d.unmap_alias(addr))
    }

    /// Moves `count` bytes from `src` on this device to `dst` on `peer` (another device of one
    /// address space), charging no clock: the caller queues the copy first (`launch`). The two
    /// devices are locked in a fixed order (by address), so concurrent peer copies cannot deadlock.
    fn _copy_to_peer(
        &self,
        py: Python<'_>,
        src: &Bound<'_, PyAny>,
        peer: &Bound<'_, PyDevice>,
        dst: &Bound<'_, PyAny>,
        count: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let (src, dst, count) = (uint_arg(src, "src")?, uint_arg(dst, "dst")?, size_arg(count, "count")?);
        let peer = peer.get();
        if std::ptr::eq(self, peer) {
            return Err(to_py(py, AclError::invalid_param("a peer copy needs two devices; use memcpy on one")));
        }
        let work = || {
            catch_panics(|| {
                let (mut a, mut b) = if (self as *const Self) < (peer as *const Self) {
                    let a = self.inner.lock();
                    (a, peer.inner.lock())
                } else {
                    let b = peer.inner.lock();
                    (self.inner.lock(), b)
                };
                a.copy_to_peer(src, &mut b, dst, count)
            })
        };
        let result = if count >= DETACH_BYTES as u64 { py.detach(work) } else { work() };
        result.map_err(|e| to_py(py, e))
    }

    /// Fills a writable C-contiguous buffer (e.g. a numpy array) with the bytes at `ptr`; with
    /// `stream`, after the stream's queued work (synchronously, as for any pageable copy).
    #[pyo3(signature = (ptr, buffer, stream = None))]
    fn read_into(
        &self,
        py: Python<'_>,
        ptr: &Bound<'_, PyAny>,
        buffer: &Bound<'_, PyAny>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let (ptr, stream) = (uint_arg(ptr, "ptr")?, opt_stream(stream)?);
        self.with_buffer(py, buffer, true, move |d, v| {
            // SAFETY: `with_buffer` keeps the writable export alive and unmoved while this runs;
            // npumem is the only Rust code writing through it.
            let out = unsafe { std::slice::from_raw_parts_mut(v.ptr, v.len) };
            match stream {
                Some(s) => d.read_on(ptr, out, s).map(|_| ()),
                None => d.read(ptr, out),
            }
        })
    }

    #[pyo3(signature = (attr = None))]
    fn mem_info(&self, py: Python<'_>, attr: Option<&Bound<'_, PyAny>>) -> PyResult<(u64, u64)> {
        let attr = attr.map(|a| enum_arg(a, "attr")).transpose()?.unwrap_or(MemAttr::Hbm as u32);
        self.run(py, |d| Ok(d.mem_info(MemAttr::from_raw(attr)?)))
    }

    /// (physical address, page size in bytes) of a mapped device address.
    fn translate(&self, py: Python<'_>, va: &Bound<'_, PyAny>) -> PyResult<(u64, u64)> {
        let va = uint_arg(va, "va")?;
        self.run(py, |d| d.translate(va).map(|t| (t.pa, t.page_size.bytes())))
    }

    /// (physical address, page size in bytes, descriptors read by the walk).
    fn walk(&self, py: Python<'_>, va: &Bound<'_, PyAny>) -> PyResult<(u64, u64, u32)> {
        let va = uint_arg(va, "va")?;
        self.run(py, |d| d.translate(va).map(|t| (t.pa, t.page_size.bytes(), t.depth)))
    }

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
    fn allocation<'py>(&self, py: Python<'py>, ptr: &Bound<'_, PyAny>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let ptr = uint_arg(ptr, "ptr")?;
        let a = self.inner.lock().allocation(ptr);
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

    /// `aclrtReserveMemAddress`: `size` bytes of device address space (at `expect` when given);
    /// returns the address. `alignment` is reserved (0).
    #[pyo3(signature = (size, expect = None, alignment = None, flags = None))]
    fn reserve_mem_address(
        &self,
        py: Python<'_>,
        size: &Bound<'_, PyAny>,
        expect: Option<&Bound<'_, PyAny>>,
        alignment: Option<&Bound<'_, PyAny>>,
        flags: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<u64> {
        let size = size_arg(size, "size")?;
        let expect = expect.map(|e| uint_arg(e, "expect")).transpose()?.filter(|&e| e != 0);
        let (alignment, flags) = (opt_uint(alignment, "alignment")?, opt_uint(flags, "flags")?);
        self.run(py, |d| d.reserve_mem_address(size, alignment, expect, flags))
    }

    /// `aclrtReleaseMemAddress`.
    fn release_mem_address(&self, py: Python<'_>, va: &Bound<'_, PyAny>) -> PyResult<()> {
        let va = uint_arg(va, "va")?;
        self.run(py, |d| d.release_mem_address(va))
    }

    /// `aclrtMallocPhysical`: `size` bytes of physical memory of `attr` (a `MemAttr`: normal,
    /// huge or 1 GiB pages); returns the handle.
    #[pyo3(signature = (size, attr, flags = None))]
    fn malloc_physical(
        &self,
        py: Python<'_>,
        size: &Bound<'_, PyAny>,
        attr: &Bound<'_, PyAny>,
        flags: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<u64> {
        let size = size_arg(size, "size")?;
        let attr = MemAttr::from_raw(enum_arg(attr, "attr")?).map_err(|e| to_py(py, e))?;
        let flags = opt_uint(flags, "flags")?;
        self.run(py, |d| d.malloc_physical(size, attr, flags))
    }

    /// `aclrtFreePhysical` (a mapped handle keeps its memory until its last unmap).
    fn free_physical(&self, py: Python<'_>, handle: &Bound<'_, PyAny>) -> PyResult<()> {
        let handle = uint_arg(handle, "handle")?;
        self.run(py, |d| d.free_physical(handle))
    }

    /// `aclrtMapMem`: maps the whole of `handle` at `va` (`size` defaults to the handle's).
    #[pyo3(signature = (va, handle, size = None, offset = None, flags = None))]
    fn map_mem(
        &self,
        py: Python<'_>,
        va: &Bound<'_, PyAny>,
        handle: &Bound<'_, PyAny>,
        size: Option<&Bound<'_, PyAny>>,
        offset: Option<&Bound<'_, PyAny>>,
        flags: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let (va, handle) = (uint_arg(va, "va")?, uint_arg(handle, "handle")?);
        let size = size.map(|s| size_arg(s, "size")).transpose()?;
        let (offset, flags) = (opt_uint(offset, "offset")?, opt_uint(flags, "flags")?);
        self.run(py, |d| {
            let size = match size {
                Some(s) => s,
                None => d.physical_size(handle)?,
            };
            d.map_mem(va, size, offset, handle, flags)
        })
    }

    /// `aclrtUnmapMem`.
    fn unmap_mem(&self, py: Python<'_>, va: &Bound<'_, PyAny>) -> PyResult<()> {
        let va = uint_arg(va, "va")?;
        self.run(py, |d| d.unmap_mem(va))
    }

    /// `aclrtMemGetAllocationGranularity` for memory of `attr`.
    fn mem_get_allocation_granularity(&self, py: Python<'_>, attr: &Bound<'_, PyAny>) -> PyResult<u64> {
        let attr = MemAttr::from_raw(enum_arg(attr, "attr")?).map_err(|e| to_py(py, e))?;
        self.run(py, |d| d.mem_get_allocation_granularity(attr))
    }

    // ----- fault injection (devices made with faults=True) -----

    /// Makes the `n`th physical allocation / map / unmap from now fail (1 = the next; None =
    /// never), once each: physical allocations with out-of-memory (207001), or a driver error
    /// (507899) with `driver_error=True`; maps and unmaps with a driver error.
    #[pyo3(signature = (*, physical_alloc = None, map = None, unmap = None, driver_error = false))]
    fn inject_faults(
        &self,
        py: Python<'_>,
        physical_alloc: Option<&Bound<'_, PyAny>>,
        map: Option<&Bound<'_, PyAny>>,
        unmap: Option<&Bound<'_, PyAny>>,
        driver_error: bool,
    ) -> PyResult<()> {
        let count = |v: Option<&Bound<'_, PyAny>>, what| v.map(|v| uint_arg(v, what)).transpose();
        let plan = FaultPlan {
            physical_alloc: count(physical_alloc, "physical_alloc")?,
            map: count(map, "map")?,
            unmap: count(unmap, "unmap")?,
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
    fn set_pool_attr(&self, py: Python<'_>, attr: &Bound<'_, PyAny>, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let attr = MemPoolAttr::from_raw(enum_arg(attr, "attr")?).map_err(|e| to_py(py, e))?;
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
    fn get_pool_attr<'py>(&self, py: Python<'py>, attr: &Bound<'_, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let attr = MemPoolAttr::from_raw(enum_arg(attr, "attr")?).map_err(|e| to_py(py, e))?;
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

    /// A new stream (an int handle; 0 is the default stream).
    fn create_stream(&self, py: Python<'_>) -> PyResult<u64> {
        self.run(py, |d| d.create_stream())
    }

    fn destroy_stream(&self, py: Python<'_>, stream: &Bound<'_, PyAny>) -> PyResult<()> {
        let stream = uint_arg(stream, "stream")?;
        self.run(py, |d| d.destroy_stream(stream))
    }

    /// Blocks (on the simulated clock) until the stream's queued work is done.
    #[pyo3(signature = (stream = None))]
    fn synchronize_stream(&self, py: Python<'_>, stream: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let stream = opt_stream(stream)?.unwrap_or(0);
        self.run(py, |d| d.synchronize_stream(stream))
    }

    fn synchronize_device(&self, py: Python<'_>) -> PyResult<()> {
        self.run(py, |d| d.synchronize_device())
    }

    fn create_event(&self, py: Python<'_>) -> PyResult<u64> {
        self.run(py, |d| d.create_event())
    }

    fn destroy_event(&self, py: Python<'_>, event: &Bound<'_, PyAny>) -> PyResult<()> {
        let event = uint_arg(event, "event")?;
        self.run(py, |d| d.destroy_event(event))
    }

    /// `aclrtRecordEvent`: the event completes when the stream's work queued so far has.
    #[pyo3(signature = (event, stream = None))]
    fn record_event(
        &self,
        py: Python<'_>,
        event: &Bound<'_, PyAny>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let event = uint_arg(event, "event")?;
        let stream = opt_stream(stream)?.unwrap_or(0);
        self.run(py, |d| d.record_event(event, stream))
    }

    /// `aclrtStreamWaitEvent`: work queued on `stream` after this starts once `event` completes.
    fn stream_wait_event(&self, py: Python<'_>, stream: &Bound<'_, PyAny>, event: &Bound<'_, PyAny>) -> PyResult<()> {
        let (stream, event) = (uint_arg(stream, "stream")?, uint_arg(event, "event")?);
        self.run(py, |d| d.stream_wait_event(stream, event))
    }

    fn synchronize_event(&self, py: Python<'_>, event: &Bound<'_, PyAny>) -> PyResult<()> {
        let event = uint_arg(event, "event")?;
        self.run(py, |d| d.synchronize_event(event))
    }

    /// `aclrtQueryEvent` as pyACL returns it: 0 (ACL_EVENT_STATUS_COMPLETE) or 1 (NOT_READY).
    fn query_event(&self, py: Python<'_>, event: &Bound<'_, PyAny>) -> PyResult<u32> {
        let event = uint_arg(event, "event")?;
        self.run(py, |d| d.query_event(event).map(|done| if done { 0 } else { 1 }))
    }

    /// Milliseconds between two recorded events on the device clock.
    fn event_elapsed_time(&self, py: Python<'_>, start: &Bound<'_, PyAny>, end: &Bound<'_, PyAny>) -> PyResult<f64> {
        let (start, end) = (uint_arg(start, "start")?, uint_arg(end, "end")?);
        self.run(py, |d| d.event_elapsed_time(start, end))
    }

    /// `aclrtMemcpyAsync`: queues a copy on `stream`; returns (start_us, end_us) on the device
    /// clock. Host memory must come from `malloc_host` (pinned), as async copies need.
    #[pyo3(signature = (dst, dst_max, src, count, kind = None, stream = None))]
    #[allow(clippy::too_many_arguments)]
    fn memcpy_async(
        &self,
        py: Python<'_>,
        dst: &Bound<'_, PyAny>,
        dst_max: &Bound<'_, PyAny>,
        src: &Bound<'_, PyAny>,
        count: &Bound<'_, PyAny>,
        kind: Option<&Bound<'_, PyAny>>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<(f64, f64)> {
        let (dst, src) = (uint_arg(dst, "dst")?, uint_arg(src, "src")?);
        let (dst_max, count) = (size_arg(dst_max, "dst_max")?, size_arg(count, "count")?);
        let kind = kind.map(|k| enum_arg(k, "kind")).transpose()?.unwrap_or(4);
        let stream = opt_stream(stream)?.unwrap_or(0);
        let (a, b) = self.run(py, |d| d.memcpy_async(dst, dst_max, src, count, kind, stream))?;
        Ok((a as f64 / 1e3, b as f64 / 1e3))
    }

    /// `aclrtMemsetAsync`: queues a byte fill on `stream`; returns (start_us, end_us).
    #[pyo3(signature = (ptr, dst_max, value, count, stream = None))]
    fn memset_async(
        &self,
        py: Python<'_>,
        ptr: &Bound<'_, PyAny>,
        dst_max: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        count: &Bound<'_, PyAny>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<(f64, f64)> {
        let ptr = uint_arg(ptr, "ptr")?;
        let value = i32_arg(value, "value")?;
        let (dst_max, count) = (size_arg(dst_max, "dst_max")?, size_arg(count, "count")?);
        let stream = opt_stream(stream)?.unwrap_or(0);
        let (a, b) = self.run(py, |d| d.memset_async(ptr, dst_max, value, count, stream))?;
        Ok((a as f64 / 1e3, b as f64 / 1e3))
    }

    /// Queues a kernel of `duration` microseconds on `stream` that reads and writes the given
    /// allocations; returns (start_us, end_us).
    #[pyo3(signature = (stream, duration, reads = None, writes = None))]
    fn launch(
        &self,
        py: Python<'_>,
        stream: &Bound<'_, PyAny>,
        duration: &Bound<'_, PyAny>,
        reads: Option<&Bound<'_, PyAny>>,
        writes: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<(f64, f64)> {
        let (reads, writes) = (pointers(reads, "reads")?, pointers(writes, "writes")?);
        let stream = uint_arg(stream, "stream")?;
        let ns = duration_from_us("duration", float_arg(duration, "duration")?).map_err(|e| to_py(py, e))?;
        let (a, b) = self.run(py, |d| d.launch(stream, ns, &reads, &writes))?;
        Ok((a as f64 / 1e3, b as f64 / 1e3))
    }

    /// The host's simulated clock, in microseconds.
    fn now_us(&self) -> f64 {
        self.inner.lock().scheduler().now_ns() as f64 / 1e3
    }

    /// The queued operations as dicts (stream, label, start_us, end_us, bytes), oldest first.
    fn timeline<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let spans: Vec<_> = self.inner.lock().scheduler().timeline().cloned().collect();
        let out = PyList::empty(py);
        for s in spans {
            let d = PyDict::new(py);
            d.set_item("stream", s.stream)?;
            d.set_item("label", s.label)?;
            d.set_item("start_us", s.start_ns as f64 / 1e3)?;
            d.set_item("end_us", s.end_ns as f64 / 1e3)?;
            d.set_item("bytes", s.bytes)?;
            out.append(d)?;
        }
        Ok(out)
    }

    /// Returns its argument: the floor cost of one call into the binding (for benchmarks).
    fn _noop(&self, value: u64) -> u64 {
        value
    }

    /// The cost model's fields (bandwidths in bytes/s, times in ns).
    fn cost_model<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = self.inner.lock().scheduler().cost.clone();
        cost_dict(py, &c)
    }

    /// Overrides one cost-model field (bandwidths 1e6 to 1e15 bytes/s, times 0 to 1e9 ns).
    fn set_cost(&self, py: Python<'_>, field: &str, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let value = float_arg(value, field)?;
        self.run(py, |d| d.scheduler().cost.set(field, value))
    }

    /// Switches to a preset cost model ("ascend910b", "ascend310p").
    fn use_preset(&self, py: Python<'_>, name: &str) -> PyResult<()> {
        self.run(py, |d| {
            d.scheduler().cost = CostModel::preset(name)?;
            Ok(())
        })
    }

    /// Unmaps/frees the coldest cached memory until at most `bytes` are reserved; returns the
    /// bytes still reserved (live blocks are never touched).
    fn trim_to(&self, py: Python<'_>, bytes: &Bound<'_, PyAny>) -> PyResult<u64> {
        let bytes = size_arg(bytes, "bytes")?;
        self.run(py, |d| d.trim_to(bytes))
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
    fn record_memory_history(&self, enabled: bool, max_entries: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let max_entries = max_entries.map(|m| uint_arg(m, "max_entries")).transpose()?.unwrap_or(1_000_000);
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

/// An optional stream handle.
/// A real-number argument (a float, an int or anything with `__float__`); an int too large for
/// a float is out of range (`InvalidParamError`), anything else a `TypeError`, both naming `what`.
fn float_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<f64> {
    match obj.extract::<f64>() {
        Ok(v) => Ok(v),
        Err(e) if e.is_instance_of::<PyOverflowError>(obj.py()) => Err(to_py(
            obj.py(),
            AclError::invalid_param(format!("{what} = {obj} is out of range: too large for a float")),
        )),
        Err(_) => Err(PyTypeError::new_err(format!("{what} must be a number, got {}", obj.get_type().name()?))),
    }
}

/// An optional non-negative int argument, 0 when absent.
fn opt_uint(obj: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<u64> {
    obj.map_or(Ok(0), |o| uint_arg(o, what))
}

/// A sequence of device pointers (kernel arguments), each a non-negative int below 2**64.
fn pointers(seq: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Vec<u64>> {
    let Some(seq) = seq else { return Ok(Vec::new()) };
    if seq.is_instance_of::<pyo3::types::PyString>() || seq.is_instance_of::<PyBytes>() {
        return Err(pyo3::exceptions::PyTypeError::new_err(format!("{what} must be a sequence of pointers (ints)")));
    }
    seq.try_iter()
        .map_err(|_| {
            pyo3::exceptions::PyTypeError::new_err(format!(
                "{what} must be a sequence of pointers (ints), got {}",
                seq.get_type().name().map(|n| n.to_string()).unwrap_or_default()
            ))
        })?
        .enumerate()
        .map(|(i, p)| uint_arg(&p?, &format!("{what}[{i}]")))
        .collect()
}

fn opt_stream(stream: Option<&Bound<'_, PyAny>>) -> PyResult<Option<u64>> {
    stream.map(|s| uint_arg(s, "stream")).transpose()
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
