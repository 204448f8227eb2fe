"""`torch.npu.Event`: npumem's stream events behind torch_npu's event API, the timing idiom, and
the allocator's stream-ordered reuse seeing the waits."""

from __future__ import annotations

import time

import pytest
from conftest import require_torch

torch = require_torch()

import npumem  # noqa: E402

FLOATS = 1 << 18  # 1 MiB of float32: the large pool, one block per tensor


def test_the_timing_idiom_gives_the_wall_milliseconds_between_the_records(npu):
    start, end = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
    start.record()
    x = torch.randn(64, 64, device="npu") @ torch.randn(64, 64, device="npu")
    time.sleep(0.02)
    end.record()
    end.synchronize()
    ms = start.elapsed_time(end)
    assert 20 <= ms < 5000 and x.shape == (64, 64)
    assert start.device == torch.device("npu:0") and end.query()
    assert isinstance(torch.npu.current_stream().record_event(), torch.npu.Event)


def test_an_event_completes_with_the_work_queued_before_it_on_npumems_clock(npu):
    s = torch.npu.Stream()
    npu.launch(s.stream_id, 1000.0)  # simulated work queued on s (npu kernels run when issued)
    e = s.record_event()
    assert not e.query() and not s.query()
    after = torch.npu.Event()
    after.record(torch.npu.default_stream())
    assert after.query()  # the default stream has nothing queued
    e.synchronize()
    assert e.query() and s.query()
    never = torch.npu.Event()
    assert never.query() and never.synchronize() is None and never.wait() is None and never.device is None


def test_a_block_used_on_another_stream_is_reused_once_its_stream_waits_on_that_streams_event(npu):
    s = torch.npu.Stream()
    x = torch.empty(FLOATS, device="npu")
    ptr = x.data_ptr()
    x.record_stream(s)
    npu.launch(s.stream_id, 1000.0, reads=[ptr])  # s still reads x after the free below
    del x
    busy = torch.empty(FLOATS, device="npu")
    assert busy.data_ptr() != ptr  # s has not reached the free: the block is not reused
    torch.npu.current_stream().wait_event(s.record_event())
    again = torch.empty(FLOATS, device="npu")
    assert again.data_ptr() == ptr  # the default stream's later work is ordered after s's use
    del busy, again

    y = torch.empty(FLOATS, device="npu")
    ptr = y.data_ptr()
    y.record_stream(s)
    npu.launch(s.stream_id, 1000.0, reads=[ptr])
    del y
    hold = torch.empty(FLOATS, device="npu")
    torch.npu.current_stream().wait_stream(s)  # the same through wait_stream
    assert torch.empty(FLOATS, device="npu").data_ptr() == ptr and hold.data_ptr() != ptr
    torch.npu.synchronize()  # the default stream's wait would hold the next tests' events back


def test_a_wait_orders_the_waiting_streams_later_work_after_the_event(npu):
    a, b = torch.npu.Stream(), torch.npu.Stream()
    _, a_end = npu.launch(a.stream_id, 500.0)
    e = torch.npu.Event()
    e.record(a)
    e.wait(b)
    b_start, _ = npu.launch(b.stream_id, 10.0)
    assert b_start >= a_end
    b.synchronize()


def test_bad_event_use_is_one_clear_error_each(npu):
    plain, timed = torch.npu.Event(), torch.npu.Event(enable_timing=True)
    with pytest.raises(ValueError, match=r"Both events must be recorded"):
        timed.elapsed_time(torch.npu.Event(enable_timing=True))
    plain.record()
    timed.record()
    with pytest.raises(ValueError, match=r"created with argument 'enable_timing=True'"):
        plain.elapsed_time(timed)
    with pytest.raises(TypeError, match=r"end_event=3: expected a torch.npu.Event"):
        timed.elapsed_time(3)
    with pytest.raises(TypeError, match=r"enable_timing='yes': expected True or False"):
        torch.npu.Event(enable_timing="yes")
    with pytest.raises(npumem.UnsupportedError, match=r"interprocess=True: .* one process"):
        torch.npu.Event(interprocess=True)
    with pytest.raises(npumem.UnsupportedError, match=r"ipc_handle"):
        timed.ipc_handle()
    with pytest.raises(TypeError, match=r"stream='s': expected an npu stream"):
        plain.record("s")
    with pytest.raises(TypeError, match=r"event=1: expected a torch.npu.Event"):
        torch.npu.current_stream().wait_event(1)
    with pytest.raises(TypeError, match=r"event=1: expected a torch.npu.Event"):
        torch.npu.current_stream().record_event(1)
    s = torch.npu.Stream()
    npu.launch(s.stream_id, 1000.0)
    late = s.record_event(torch.npu.Event(enable_timing=True))
    with pytest.raises(RuntimeError, match=r"the events have not completed; call end_event.synchronize"):
        timed.elapsed_time(late)
    late.synchronize()
    assert timed.elapsed_time(late) >= 0
