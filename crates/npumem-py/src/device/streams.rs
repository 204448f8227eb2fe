//! `Device`'s streams and events, asynchronous copies and fills, kernel launches on the
//! simulated clock, its timeline and its cost model.
//!
//! - Handles are checked by the core: an unknown stream or event is an error, never a crash.

use super::*;

#[pymethods]
impl PyDevice {
    /// A new stream (an int handle; 0 is the default stream).
    fn create_stream(&self, py: Python<'_>) -> PyResult<u64> {
        self.run(py, |d| d.create_stream())
    }

    fn destroy_stream(&self, py: Python<'_>, stream: Stream) -> PyResult<()> {
        self.run(py, |d| d.destroy_stream(stream.0))
    }

    /// Blocks (on the simulated clock) until the stream's queued work is done.
    #[pyo3(signature = (stream = None))]
    fn synchronize_stream(&self, py: Python<'_>, stream: Option<Stream>) -> PyResult<()> {
        let stream = stream.map_or(0, |s| s.0);
        self.run(py, |d| d.synchronize_stream(stream))
    }

    fn synchronize_device(&self, py: Python<'_>) -> PyResult<()> {
        self.run(py, |d| d.synchronize_device())
    }

    fn create_event(&self, py: Python<'_>) -> PyResult<u64> {
        self.run(py, |d| d.create_event())
    }

    fn destroy_event(&self, py: Python<'_>, event: Event) -> PyResult<()> {
        self.run(py, |d| d.destroy_event(event.0))
    }

    /// `aclrtRecordEvent`: the event completes when the stream's work queued so far has.
    #[pyo3(signature = (event, stream = None))]
    fn record_event(&self, py: Python<'_>, event: Event, stream: Option<Stream>) -> PyResult<()> {
        self.run(py, |d| d.record_event(event.0, stream.map_or(0, |s| s.0)))
    }

    /// `aclrtStreamWaitEvent`: work queued on `stream` after this starts once `event` completes.
    fn stream_wait_event(&self, py: Python<'_>, stream: Stream, event: Event) -> PyResult<()> {
        self.run(py, |d| d.stream_wait_event(stream.0, event.0))
    }

    fn synchronize_event(&self, py: Python<'_>, event: Event) -> PyResult<()> {
        self.run(py, |d| d.synchronize_event(event.0))
    }

    /// `aclrtQueryEvent` as pyACL returns it: 0 (ACL_EVENT_STATUS_COMPLETE) or 1 (NOT_READY).
    fn query_event(&self, py: Python<'_>, event: Event) -> PyResult<u32> {
        self.run(py, |d| d.query_event(event.0).map(|done| if done { 0 } else { 1 }))
    }

    /// Milliseconds between two recorded events on the device clock.
    fn event_elapsed_time(&self, py: Python<'_>, start: Event<name::start>, end: Event<name::end>) -> PyResult<f64> {
        self.run(py, |d| d.event_elapsed_time(start.0, end.0))
    }

    /// `aclrtMemcpyAsync`: queues a copy on `stream`; returns (start_us, end_us) on the device
    /// clock. Host memory must come from `malloc_host` (pinned), as async copies need.
    #[pyo3(signature = (dst, dst_max, src, count, kind = None, stream = None))]
    #[allow(clippy::too_many_arguments)]
    fn memcpy_async(
        &self,
        py: Python<'_>,
        dst: Ptr<name::dst>,
        dst_max: Size<name::dst_max>,
        src: Ptr<name::src>,
        count: Size<name::count>,
        kind: Option<CopyKind>,
        stream: Option<Stream>,
    ) -> PyResult<(f64, f64)> {
        let (kind, stream) = (kind.map_or(4, |k| k.0), stream.map_or(0, |s| s.0));
        let (a, b) = self.run(py, |d| d.memcpy_async(dst.0, dst_max.0, src.0, count.0, kind, stream))?;
        Ok((a as f64 / 1e3, b as f64 / 1e3))
    }

    /// `aclrtMemsetAsync`: queues a byte fill on `stream`; returns (start_us, end_us).
    #[pyo3(signature = (ptr, dst_max, value, count, stream = None))]
    fn memset_async(
        &self,
        py: Python<'_>,
        ptr: Ptr,
        dst_max: Size<name::dst_max>,
        value: Int32,
        count: Size<name::count>,
        stream: Option<Stream>,
    ) -> PyResult<(f64, f64)> {
        let stream = stream.map_or(0, |s| s.0);
        let (a, b) = self.run(py, |d| d.memset_async(ptr.0, dst_max.0, value.0, count.0, stream))?;
        Ok((a as f64 / 1e3, b as f64 / 1e3))
    }

    /// Queues a kernel of `duration` microseconds on `stream` that reads and writes the given
    /// allocations; returns (start_us, end_us).
    #[pyo3(signature = (stream, duration, reads = None, writes = None))]
    fn launch(
        &self,
        py: Python<'_>,
        stream: Stream,
        duration: Real,
        reads: Option<Pointers<name::reads>>,
        writes: Option<Pointers<name::writes>>,
    ) -> PyResult<(f64, f64)> {
        let (reads, writes) = (reads.map(|r| r.0).unwrap_or_default(), writes.map(|w| w.0).unwrap_or_default());
        let ns = duration_from_us("duration", duration.0).map_err(|e| to_py(py, e))?;
        let (a, b) = self.run(py, |d| d.launch(stream.0, ns, &reads, &writes))?;
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
}
