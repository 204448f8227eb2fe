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
}
