//! `Device`'s byte access: copies, fills, reads and writes of device memory, views, aliases,
//! peer copies, and address translation.
//!
//! - Every range is checked against the device's allocations before bytes move.
//! - Host buffers are taken through the buffer protocol, contiguous only.

use super::*;

#[pymethods]
impl PyDevice {
    #[pyo3(signature = (dst, dst_max, src, count, kind = None))]
    fn memcpy(
        &self,
        py: Python<'_>,
        dst: Ptr<name::dst>,
        dst_max: Size<name::dst_max>,
        src: Ptr<name::src>,
        count: Size<name::count>,
        kind: Option<CopyKind>,
    ) -> PyResult<()> {
        let (dst, dst_max, src, count, kind) = (dst.0, dst_max.0, src.0, count.0, kind.map_or(4, |k| k.0));
        self.run_detached_if(py, count >= DETACH_BYTES as u64, |d| d.memcpy(dst, dst_max, src, count, kind))
    }

    fn memset(
        &self,
        py: Python<'_>,
        ptr: Ptr,
        dst_max: Size<name::dst_max>,
        value: Int32,
        count: Size<name::count>,
    ) -> PyResult<()> {
        self.run(py, |d| d.memset(ptr.0, dst_max.0, value.0, count.0))
    }

    /// Writes the bytes of a C-contiguous buffer (bytes, bytearray, memoryview, numpy array) at
    /// `ptr`. With `stream`, the copy is queued on that stream; the buffer is pageable host
    /// memory, so the call returns once the copy has completed, as in the real runtime.
    #[pyo3(signature = (ptr, buffer, stream = None))]
    fn write(&self, py: Python<'_>, ptr: Ptr, buffer: Source, stream: Option<Stream>) -> PyResult<()> {
        let (ptr, stream) = (ptr.0, stream.map(|s| s.0));
        self.with_buffer(py, buffer, move |d, v| {
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
    fn _check_range(&self, py: Python<'_>, ptr: Ptr, count: Size<name::count>) -> PyResult<()> {
        self.run(py, |d| d.check_range(ptr.0, count.0))
    }

    /// A direct view of `nbytes` at `ptr` (host backend): an object exporting that memory through
    /// the buffer protocol; the allocation cannot be freed while it lives.
    fn _view(slf: &Bound<'_, Self>, ptr: Ptr, nbytes: Size<name::nbytes>) -> PyResult<DeviceView> {
        let (ptr, nbytes) = (ptr.0, nbytes.0);
        let py = slf.py();
        let len = usize::try_from(nbytes).map_err(|_| to_py(py, AclError::invalid_param("nbytes too large")))?;
        let base = slf.get().run(py, |d| d.pin(ptr, nbytes))?;
        Ok(DeviceView::new(slf.clone().unbind(), base, ptr, len))
    }

    /// Reads `count` bytes at `ptr` into a new `bytes`.
    fn read<'py>(&self, py: Python<'py>, ptr: Ptr, count: Size<name::count>) -> PyResult<Bound<'py, PyBytes>> {
        let (ptr, count) = (ptr.0, count.0);
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
    fn _map_alias(&self, py: Python<'_>, ptr: Ptr, size: Size) -> PyResult<u64> {
        self.run(py, |d| d.map_alias(ptr.0, size.0))
    }

    /// Undoes the `_map_alias` whose range holds `addr`.
    fn _unmap_alias(&self, py: Python<'_>, addr: Ptr<name::addr>) -> PyResult<()> {
        self.run(py, |d| d.unmap_alias(addr.0))
    }

    /// Moves `count` bytes from `src` on this device to `dst` on `peer` (another device of one
    /// address space), charging no clock: the caller queues the copy first (`launch`). The two
    /// devices are locked in a fixed order (by address), so concurrent peer copies cannot deadlock.
    fn _copy_to_peer(
        &self,
        py: Python<'_>,
        src: Ptr<name::src>,
        peer: &Bound<'_, PyDevice>,
        dst: Ptr<name::dst>,
        count: Size<name::count>,
    ) -> PyResult<()> {
        let (src, dst, count) = (src.0, dst.0, count.0);
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
    fn read_into(&self, py: Python<'_>, ptr: Ptr, buffer: Sink, stream: Option<Stream>) -> PyResult<()> {
        let (ptr, stream) = (ptr.0, stream.map(|s| s.0));
        self.with_buffer(py, buffer, move |d, v| {
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
    fn mem_info(&self, py: Python<'_>, attr: Option<MemAttrArg>) -> PyResult<(u64, u64)> {
        let attr = attr.map_or(MemAttr::Hbm, |a| a.0);
        self.run(py, |d| Ok(d.mem_info(attr)))
    }

    /// (physical address, page size in bytes) of a mapped device address.
    fn translate(&self, py: Python<'_>, va: Ptr<name::va>) -> PyResult<(u64, u64)> {
        self.run(py, |d| d.translate(va.0).map(|t| (t.pa, t.page_size.bytes())))
    }

    /// (physical address, page size in bytes, descriptors read by the walk); the simulator only.
    fn walk(&self, py: Python<'_>, va: Ptr<name::va>) -> PyResult<(u64, u64, u32)> {
        self.run(py, |d| d.walk(va.0).map(|t| (t.pa, t.page_size.bytes(), t.depth)))
    }
}
