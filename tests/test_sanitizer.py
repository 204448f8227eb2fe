"""The memory sanitizer: each hazard fires exactly when it should."""

from __future__ import annotations

import pickle

import pytest

import npumem
from npumem import MemcpyKind
from npumem.errors import KINDS

MiB = 1 << 20


def kinds(dev):
    return [f.kind for f in dev.sanitizer_reports()]


@pytest.fixture
def dev():
    return npumem.Device("256MiB")


def test_two_streams_racing_on_a_buffer(dev):
    x = dev.malloc(MiB, tag="activations[3]")
    a, b = dev.create_stream(), dev.create_stream()
    dev.launch(a, 100.0, writes=[x])
    dev.launch(b, 100.0, reads=[x])
    [finding] = dev.sanitizer_reports()
    assert finding.kind == "race"
    assert finding.allocation == x and sorted(finding.streams) == sorted([a, b])
    assert "record an event" in finding.message
    assert finding.tag == "activations[3]"
    assert str(finding).startswith("race [activations[3]]: ")


def test_an_event_orders_the_streams(dev):
    x = dev.malloc(MiB)
    compute, copy = dev.create_stream(), dev.create_stream()
    host = dev.malloc_host(MiB)
    dev.launch(compute, 100.0, writes=[x])
    done = dev.create_event()
    dev.record_event(done, compute)
    dev.stream_wait_event(copy, done)
    dev.memcpy_async(host, MiB, x, MiB, MemcpyKind.DEVICE_TO_HOST, copy)
    dev.synchronize_stream(copy)
    dev.read(host, 4)
    assert kinds(dev) == []


def test_readers_do_not_race_and_disjoint_ranges_do_not_race(dev):
    x = dev.malloc(2 * MiB)
    a, b = dev.create_stream(), dev.create_stream()
    dev.launch(a, 50.0, reads=[x])
    dev.launch(b, 50.0, reads=[x])
    dev.memset_async(x, MiB, 1, MiB, a)
    dev.memset_async(x + MiB, MiB, 2, MiB, b)
    assert kinds(dev) == ["race", "race"]  # each memset overlaps the other stream's whole-buffer read
    dev.clear_sanitizer_reports()
    dev.synchronize_device()
    dev.memset_async(x, MiB, 1, MiB, a)
    dev.memset_async(x + MiB, MiB, 2, MiB, b)
    assert kinds(dev) == []


def test_host_read_of_a_pending_write(dev):
    x = dev.malloc(MiB)
    host = dev.malloc_host(MiB)
    s = dev.create_stream()
    dev.memcpy_async(x, MiB, host, MiB, MemcpyKind.HOST_TO_DEVICE, s)
    dev.read(x, 16)
    assert kinds(dev) == ["pending_write_read"]
    dev.synchronize_stream(s)
    dev.read(x, 16)
    assert kinds(dev) == ["pending_write_read"]
    # A device-to-host copy into pinned memory, read by the host before synchronising.
    dev.memcpy_async(host, MiB, x, MiB, MemcpyKind.DEVICE_TO_HOST, s)
    dev.read(host, 8)
    assert kinds(dev)[-1] == "pending_write_read"


def test_raise_mode_refuses_the_hazard():
    dev = npumem.Device("64MiB", sanitizer="raise")
    x = dev.malloc(MiB)
    a, b = dev.create_stream(), dev.create_stream()
    dev.launch(a, 100.0, writes=[x])
    before = len(dev.timeline())
    with pytest.raises(npumem.SanitizerError) as info:
        dev.launch(b, 100.0, writes=[x])
    err = info.value
    assert err.kind == "race" and err.code == 107000 and "sanitizer" in err.message
    assert len(dev.timeline()) == before, "the racy launch did not run"
    clone = pickle.loads(pickle.dumps(err))
    assert clone.kind == "race"
    with pytest.raises(npumem.SanitizerError, match="not synchronised") as info:
        dev.read(x, 4)
    assert info.value.kind == "pending_write_read"
    with pytest.raises(npumem.SanitizerError):
        dev.launch(b, 100.0, writes=[x])  # still unordered with a's write
    assert kinds(dev) == ["race", "pending_write_read", "race"]
    dev.synchronize_device()
    dev.read(x, 4)
    dev.launch(b, 100.0, writes=[x])  # ordered now: the host synchronised before enqueueing
    assert len(kinds(dev)) == 3


def test_off_mode_records_nothing():
    dev = npumem.Device("64MiB", sanitizer="off")
    x = dev.malloc(MiB)
    dev.launch(dev.create_stream(), 1.0, writes=[x])
    dev.launch(dev.create_stream(), 1.0, writes=[x])
    dev.read(x, 1)
    assert dev.sanitizer_reports() == []
    assert set(kinds(dev)) <= set(KINDS)
    with pytest.raises(npumem.InvalidParamError, match="sanitizer mode"):
        npumem.Device("64MiB", sanitizer="loud")
    dev.set_sanitizer("collect")
    dev.launch(dev.create_stream(), 1.0, writes=[x])
    dev.launch(dev.create_stream(), 1.0, writes=[x])
    assert kinds(dev) == ["race"]


def test_refused_operations_are_reported_too(dev):
    x = dev.malloc(100)
    with pytest.raises(npumem.InvalidParamError):
        dev.read(x + 90, 20)
    dev.free(x)
    with pytest.raises(npumem.InvalidParamError):
        dev.read(x, 1)
    with pytest.raises(npumem.MemoryFreeError):
        dev.free(x)
    host = dev.malloc_host(64)
    y = dev.malloc(64)
    dev.memcpy(y, 64, host, 64, MemcpyKind.DEVICE_TO_HOST)  # the kind is wrong but ignored
    assert kinds(dev) == ["out_of_bounds", "use_after_free", "double_free", "kind_mismatch"]
    assert "ignores the kind" in dev.sanitizer_reports()[-1].message


def test_freeing_memory_another_stream_still_uses_is_a_use_after_free(dev):
    x = dev.malloc(MiB)
    host = dev.malloc_host(MiB)
    s = dev.create_stream()
    dev.memcpy_async(x, MiB, host, MiB, MemcpyKind.HOST_TO_DEVICE, s)
    dev.free(x)  # x's stream is the default one; s is not ordered before the free
    (finding,) = dev.sanitizer_reports()
    assert finding.kind == "use_after_free" and finding.allocation == x and finding.streams == [s, -1]
    assert "record_stream" in finding.message
    # npumem still keeps the memory until the copy is done: nothing is lost or handed out early.
    assert dev.malloc(MiB) != x
    dev.synchronize_device()
    assert dev.stats()["lost_effects"] == 0


def test_leak_report(dev):
    x = dev.malloc(1000, tag="forgotten")
    dev.malloc_host(10)
    s = dev.create_stream()
    e = dev.create_event()
    leaks = dev.leak_report()
    assert [(a["ptr"], a["tag"]) for a in leaks["allocations"]] == [(x, "forgotten")]
    assert (leaks["host_blocks"], leaks["streams"], leaks["events"]) == (1, [s], [e])
    dev.free(x)
    dev.destroy_stream(s)
    dev.destroy_event(e)
    assert dev.leak_report()["allocations"] == [] and dev.leak_report()["streams"] == []


def test_findings_are_capped_and_counted_by_kind(dev):
    x = dev.malloc(100)
    for _ in range(10_005):
        with pytest.raises(npumem.InvalidParamError):
            dev.read(x + 90, 20)
    assert len(dev.sanitizer_reports()) == 10_000, "only the first findings are kept"
    counts = dev.sanitizer_counts()
    assert counts["out_of_bounds"] == 10_005 and counts["dropped"] == 5
    assert sum(v for k, v in counts.items() if k != "dropped") == 10_005
    dev.clear_sanitizer_reports()
    assert dev.sanitizer_reports() == [] and dev.sanitizer_counts()["out_of_bounds"] == 0


@pytest.mark.parametrize("name", ["Finding", "KINDS"])
def test_sanitizer_module_is_a_deprecated_alias_of_errors(name):
    import npumem.errors
    import npumem.sanitizer

    with pytest.warns(DeprecationWarning, match=f"npumem.errors.{name}"):
        moved = getattr(npumem.sanitizer, name)
    assert moved is getattr(npumem.errors, name)
