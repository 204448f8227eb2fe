"""The `npu` device's registration, its torch.npu memory surface, out of memory, and the bad
inputs of its set-up: each answered by the npumem Device behind npu:0."""

from __future__ import annotations

import pickle
import subprocess
import sys
import types

import pytest
from conftest import NPU_SETTINGS, MiB, require_torch

torch = require_torch()

import npumem.torch as nt  # noqa: E402
from npumem.torch import registration, settings  # noqa: E402


def _ptrs(dev) -> set[int]:
    return {a["ptr"] for a in dev.allocations()}


def test_install_names_privateuse1_npu_and_registers_torch_npu(npu):
    assert torch._C._get_privateuse1_backend_name() == "npu"
    assert torch.npu is nt.npu and sys.modules["torch.npu.memory"] is nt.npu.memory
    t = torch.ones(3).npu()
    assert t.is_npu and t.device == torch.device("npu:0") and str(t.device) == "npu:0"
    assert torch.nn.Linear(2, 2).npu().weight.is_npu
    assert nt.installed() == settings.Settings("host", "host", 1 << 30, "torch_npu", "", 1)


def test_every_npu_storage_is_one_npumem_allocation_freed_with_it(npu):
    before = _ptrs(npu)
    t = torch.empty(1000, device="npu")
    v = t[10:20]
    new = _ptrs(npu) - before
    assert new == {t.data_ptr()} and v.untyped_storage().data_ptr() == t.data_ptr()
    assert npu.allocation(t.data_ptr())["size"] == 4000
    del t
    assert _ptrs(npu) - before == new  # the view keeps the storage alive
    del v
    assert _ptrs(npu) == before
    assert torch.empty(0, device="npu").data_ptr() == 0  # no bytes, no allocation


def test_a_second_install_with_the_same_settings_returns_them_and_other_settings_are_refused(npu):
    assert nt.install(**NPU_SETTINGS) == nt.installed()
    with pytest.raises(nt.InstallError, match=r"installed already with .*capacity=1073741824.*capacity=2147483648"):
        nt.install(**{**NPU_SETTINGS, "capacity": "2GiB"})
    assert nt.device() is npu and nt.installed().capacity == 1 << 30


def test_a_name_taken_by_another_backend_is_refused_before_anything_changes(monkeypatch):
    def fake(name: str, **attrs):
        c = types.SimpleNamespace(_get_privateuse1_backend_name=lambda: name, _acc=torch._C._acc)
        return types.SimpleNamespace(_C=c, __version__="x", **attrs)

    with pytest.raises(nt.InstallError, match=r"registered already as 'npu' \(by torch_npu"):
        registration.check_free(fake("npu"))
    with pytest.raises(nt.InstallError, match=r"torch.npu exists already"):
        registration.check_free(fake("privateuseone", npu=object()))
    monkeypatch.delitem(sys.modules, "torch.npu", raising=False)
    with pytest.raises(nt.InstallError, match=r"lacks the Python PrivateUse1 backend API"):
        registration.check_free(
            types.SimpleNamespace(
                _C=types.SimpleNamespace(_get_privateuse1_backend_name=lambda: "privateuseone"), __version__="2.0"
            )
        )


def test_install_in_a_process_where_another_backend_owns_privateuse1_fails_cleanly():
    code = (
        "import torch, npumem.torch as nt\n"
        "torch.utils.rename_privateuse1_backend('npu')\n"
        "try:\n    nt.install(capacity='64MiB')\nexcept nt.InstallError as e:\n    print('refused:', e)\n"
        "print(nt.installed(), hasattr(torch, 'npu'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "refused: PyTorch's PrivateUse1 backend is registered already as 'npu'" in out.stdout
    assert out.stdout.strip().endswith("None False")


def test_device_queries_answer_from_npumem(npu):
    npu_mod = torch.npu
    assert npu_mod.is_available() and npu_mod.is_initialized()
    assert npu_mod.device_count() == 1 and npu_mod.current_device() == 0
    npu_mod.set_device(0)
    npu_mod.set_device("npu:0")
    npu_mod.synchronize()
    assert npu_mod.mem_get_info() == npu.mem_info() and npu_mod.mem_get_info()[1] == 1 << 30
    assert "torch_npu allocator" in npu_mod.get_device_name()
    assert npu_mod.OutOfMemoryError is torch.OutOfMemoryError


@pytest.mark.parametrize("bad", [1, "npu:3", -1, True, "cuda:0"])
def test_an_unknown_device_index_is_a_clear_error(npu, bad):
    with pytest.raises(ValueError, match=r"device=.*(no such npu device; npumem.torch has npu:0|expected an npu)"):
        torch.npu.set_device(bad)
    assert torch.npu.current_device() == 0


def test_a_tensor_on_an_unknown_device_index_is_refused(npu):
    before = _ptrs(npu)
    with pytest.raises(ValueError, match=r"device='npu:1': no such npu device; npumem.torch has npu:0"):
        torch.zeros(2, device="npu:1")
    with pytest.raises(ValueError, match=r"npu:2"):
        torch.ones(2).to("npu:2")
    assert _ptrs(npu) == before


def test_memory_counters_follow_the_tensors(npu):
    m = torch.npu
    torch.npu.empty_cache()
    base = m.memory_allocated()
    m.reset_peak_memory_stats()
    a = torch.empty(MiB // 4, device="npu")  # 1 MiB
    b = torch.empty(MiB // 4, device="npu")
    assert m.memory_allocated() == base + 2 * (MiB + 512)  # torch_npu's 32-byte pad rounded to 512
    del a
    assert m.memory_allocated() == base + MiB + 512
    assert m.max_memory_allocated() == base + 2 * (MiB + 512)
    stats = m.memory_stats()
    assert list(stats) == sorted(stats)
    assert stats["allocated_bytes.all.current"] == m.memory_allocated()
    assert stats["reserved_bytes.all.current"] == m.memory_reserved() >= m.memory_allocated()
    assert stats["allocated_bytes.all.peak"] == m.max_memory_allocated()
    assert m.max_memory_reserved() >= m.memory_reserved()
    for key in ("active_bytes.all.current", "segment.all.current", "num_alloc_retries", "num_ooms", "max_split_size"):
        assert key in stats
    del b
    reserved = m.memory_reserved()
    m.empty_cache()
    assert m.memory_reserved() < reserved and m.memory_allocated() == base
    m.reset_peak_memory_stats()
    assert m.max_memory_allocated() == base


def test_summary_snapshot_and_memory_viz_read_the_device(npu, tmp_path):
    from torch.cuda import _memory_viz

    m = torch.npu
    m.memory._record_memory_history()
    try:
        x = torch.randn(64, 64, device="npu")
        y = x @ x
        del x
        assert "allocated memory" in m.memory_summary()
        segments = m.memory_snapshot()
        blocks = {b["address"] for s in segments for b in s["blocks"] if b["state"] == "active_allocated"}
        assert y.data_ptr() in blocks
        snap = m.memory._snapshot()
        actions = [e["action"] for e in snap["device_traces"][0]]
        assert actions.count("alloc") >= 2 and "free_completed" in actions
        path = tmp_path / "npu.pickle"
        m.memory._dump_snapshot(str(path))
        with open(path, "rb") as f:
            dumped = pickle.load(f)
        assert "Summary of segments" in _memory_viz.segsum(dumped)
        assert "<html" in _memory_viz.trace_plot(dumped).lower()
    finally:
        m.memory._record_memory_history(enabled=None)
    with pytest.raises(ValueError, match=r"enabled='yes'"):
        m.memory._record_memory_history(enabled="yes")


def test_an_oversized_tensor_is_torch_out_of_memory_worded_as_torch_npu_and_the_device_stays_usable(npu):
    keep = torch.ones(1000, device="npu")
    allocated, reserved, ptrs = torch.npu.memory_allocated(), torch.npu.memory_reserved(), _ptrs(npu)
    with pytest.raises(torch.OutOfMemoryError) as info:
        torch.empty(1 << 29, device="npu")  # 2 GiB on a 1 GiB device
    msg = str(info.value)
    assert msg.startswith("NPU out of memory. Tried to allocate 2.00 GiB (NPU 0; 1.00 GiB total capacity; ")
    assert "already allocated;" in msg and "reserved in total by PyTorch)" in msg and "max_split_size_mb" in msg
    with pytest.raises(torch.OutOfMemoryError, match=r"Tried to allocate 1\.50 GiB"):
        keep.new_zeros(3 << 27)  # a factory op on the device of its input
    assert (torch.npu.memory_allocated(), _ptrs(npu)) == (allocated, ptrs)
    assert torch.npu.memory_reserved() == reserved
    assert torch.npu.memory_stats()["num_ooms"] >= 2
    assert (keep * 2).sum().item() == 2000.0  # still usable


def test_memory_fraction_caps_the_device(npu):
    torch.npu.empty_cache()
    torch.npu.set_per_process_memory_fraction(0.25)
    try:
        assert torch.npu.memory.get_per_process_memory_fraction() == 0.25
        with pytest.raises(torch.OutOfMemoryError, match="NPU out of memory"):
            torch.empty(300 * MiB // 4, device="npu")
        for bad in (1.5, -0.1, "half", True):
            with pytest.raises(ValueError, match=r"fraction=.*expected a number from 0 to 1"):
                torch.npu.set_per_process_memory_fraction(bad)
    finally:
        torch.npu.set_per_process_memory_fraction(1.0)
    del_me = torch.empty(300 * MiB // 4, device="npu")
    assert del_me.is_npu


@pytest.mark.parametrize(
    ("kwargs", "env", "match"),
    [
        ({"mode": "shape", "backend": "host"}, {}, r"backend='host' with mode='shape'.*needs backend='sim'"),
        ({"mode": "shape", "capacity": "2TiB"}, {}, r"capacity='2TiB' with devices=1: .*at most 1 TiB per device"),
        ({"mode": "fast"}, {}, r"mode='fast': expected one of host, shape"),
        ({"backend": "sim"}, {}, r"backend='sim' with mode='host'.*needs backend='host'"),
        ({"devices": 65}, {}, r"devices=65: expected a number of devices from 1 to 64"),
        ({"devices": 8, "mode": "shape", "capacity": "256GiB"}, {}, r"capacity='256GiB' with devices=8: .*128 GiB"),
        ({"devices": 0}, {}, r"devices=0: expected a number of devices from 1 to 64"),
        ({"capacity": "lots"}, {}, r"capacity='lots': expected a size"),
        ({"allocator": "tcmalloc"}, {}, r"allocator='tcmalloc': expected one of npumem, direct, pytorch, torch_npu"),
        ({}, {"NPUMEM_CAPACITY": "-1GiB"}, r"NPUMEM_CAPACITY='-1GiB'"),
        ({}, {"NPUMEM_ALLOCATOR": "tcmalloc"}, r"NPUMEM_ALLOCATOR='tcmalloc': expected one of"),
        ({}, {"NPUMEM_TORCH_MODE": "fast"}, r"NPUMEM_TORCH_MODE='fast': expected one of host, shape"),
        ({}, {"NPUMEM_DEVICES": "two"}, r"NPUMEM_DEVICES='two': expected a whole number"),
        ({}, {"NPUMEM_BACKEND": "tpu"}, r"NPUMEM_BACKEND='tpu': expected one of sim, host, acl, cuda"),
        ({}, {"NPUMEM_BACKEND": "acl"}, r"NPUMEM_BACKEND='acl' with mode='host'.*needs backend='host'"),
        ({}, {"PYTORCH_NPU_ALLOC_CONF": "bogus_key:1"}, r"PYTORCH_NPU_ALLOC_CONF='bogus_key:1'"),
        ({}, {"NPUMEM_ALLOC_CONF": "max_split_size_mb:x"}, r"NPUMEM_ALLOC_CONF='max_split_size_mb:x'"),
    ],
)
def test_bad_settings_are_one_clear_error_naming_the_argument_or_variable(kwargs, env, match):
    with pytest.raises(nt.ConfigError, match=match):
        settings.resolve(**kwargs, environ=env)


def test_settings_come_from_the_arguments_then_the_variables_then_the_defaults():
    env = {"NPUMEM_CAPACITY": "2GiB", "PYTORCH_NPU_ALLOC_CONF": "max_split_size_mb:64", "NPUMEM_ALLOCATOR": " "}
    s = settings.resolve(environ=env)
    assert (s.capacity, s.alloc_conf, s.allocator, s.mode, s.devices) == (
        2 << 30,
        "max_split_size_mb:64",
        "torch_npu",
        "host",
        1,
    )
    s = settings.resolve(capacity="1GiB", alloc_conf="", environ={**env, "NPUMEM_ALLOC_CONF": "max_split_size_mb:32"})
    assert (s.capacity, s.alloc_conf) == (1 << 30, "")
    assert (
        settings.resolve(environ={**env, "NPUMEM_ALLOC_CONF": "max_split_size_mb:32"}).alloc_conf
        == "max_split_size_mb:32"
    )
    assert settings.resolve(environ={}).capacity is None  # host memory available
    shape = settings.resolve(environ={"NPUMEM_TORCH_MODE": "shape"})
    assert (shape.mode, shape.backend, shape.capacity) == ("shape", "sim", 64 << 30)  # the simulator's default


def test_streams_are_npumem_streams_and_pick_the_stream_allocations_are_made_on(npu):
    s = torch.npu.Stream()
    assert isinstance(s, torch.Stream) and s.device == torch.device("npu:0") and s.stream_id > 0
    assert torch.npu.current_stream() == torch.npu.default_stream() and torch.npu.default_stream().stream_id == 0
    with torch.npu.stream(s):
        assert torch.npu.current_stream().stream_id == s.stream_id
        on_s = torch.empty(1000, device="npu")
    outside = torch.empty(1000, device="npu")
    assert npu.allocation(on_s.data_ptr())["stream"] == s.stream_id
    assert npu.allocation(outside.data_ptr())["stream"] != s.stream_id
    outside.record_stream(s)  # npumem's Device.record_stream: the block is in use on s too
    del outside
    torch.npu.set_stream(s)
    try:
        current = torch.empty(10, device="npu")
        assert npu.allocation(current.data_ptr())["stream"] == s.stream_id
    finally:
        torch.npu.set_stream(torch.npu.default_stream())
    s.synchronize()
    assert s.query() and s.wait_stream(torch.npu.default_stream()) is None
    with pytest.raises(TypeError, match=r"stream='x': expected an npu stream"):
        torch.npu.set_stream("x")
    with pytest.raises(ValueError, match=r"device=3: no such npu device"):
        torch.npu.Stream(3)
    with pytest.raises(ValueError, match=r"record_stream: stream .* is not a stream of the tensor's device"):
        on_s.record_stream(torch.Stream(stream_id=s.stream_id, device_index=1, device_type=s.device_type))
