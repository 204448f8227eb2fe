"""Every PYTORCH_NPU_ALLOC_CONF key npumem's torch_npu allocator takes changes what a PyTorch
program on `npu` gets, the way the key does in the replay: one small program per key, run in
shape mode (only shapes; the allocator sees host mode's allocations) on a fresh device with and
without the key. `expandable_segments:True` is the npumem allocator's (torch_npu's refuses it)."""

from __future__ import annotations

import textwrap

import pytest
from conftest import require_torch, run_torch_programs

require_torch()

KiB = 1 << 10

PROGRAM = textwrap.dedent(
    """
    import json, sys
    import torch
    import npumem, npumem.torch as nt
    from npumem.torch import runtime

    nt.install(mode="shape", capacity="8GiB")
    MiB = 1 << 20

    def floats(nbytes):
        return torch.empty(nbytes // 4, device="npu")

    def growing_batch():
        model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).npu()
        for batch in (256, 512, 768, 1024, 1536, 2048):
            model(torch.empty(batch, 1024, device="npu")).sum().backward()

    def big_then_smaller():  # a 100 MiB block cached, then 30 MiB asked
        a = floats(100 * MiB); del a
        b = floats(30 * MiB)

    def cached_then_near():  # an 80 MiB block cached, then 50 MiB asked
        a = floats(80 * MiB); del a
        b = floats(50 * MiB)

    def one_tensor(nbytes):
        return lambda: floats(nbytes)

    def three_gib():
        try:
            floats(3 << 30)
            return "fits"
        except torch.OutOfMemoryError:
            return "out of memory"

    def churn_under_a_fraction():
        torch.npu.set_per_process_memory_fraction(0.5)
        for i in range(8):
            a = floats((300 + 40 * i) * MiB); del a

    runs = {
        "growing_batch": growing_batch, "big_then_smaller": big_then_smaller, "cached_then_near": cached_then_near,
        "4MiB": one_tensor(4 * MiB), "1300KiB": one_tensor(1300 * 1024), "3MiB": one_tensor(3 * MiB),
        "3GiB": three_gib, "churn": churn_under_a_fraction,
    }
    out = {}
    for case in json.loads(sys.argv[2]):
        allocator, conf, run = case
        # a fresh device for each run: npu:0's allocator with this alloc_conf
        runtime.RUNTIME.devices[0] = npumem.Device(8 << 30, backend="sim", allocator=allocator, alloc_conf=conf)
        held = runs[run]()  # a tensor stays alive until the peaks are read
        answer = held if isinstance(held, str) else None
        dev = runtime.RUNTIME.devices[0]
        stats = dev.memory_stats()
        out["|".join(case)] = {
            "answer": answer, "reserved": dev.max_memory_reserved(), "allocated": dev.max_memory_allocated(),
            "oversize": stats["oversize_allocations.peak"], "device_frees": stats["num_device_free"],
        }
    try:
        npumem.Device("64MiB", backend="sim", allocator="torch_npu", alloc_conf="expandable_segments:True")
    except Exception as e:
        out["refused"] = [type(e).__name__, str(e)]
    json.dump(out, open(sys.argv[1], "w"))
    """
)

#: key: (run, allocator, the setting, the baseline's alloc_conf)
CASES = {
    "expandable_segments": ("growing_batch", "npumem", "expandable_segments:True", ""),
    "max_split_size_mb": ("big_then_smaller", "torch_npu", "max_split_size_mb:64", ""),
    "max_non_split_rounding_mb": (
        "cached_then_near",
        "torch_npu",
        "max_split_size_mb:40,max_non_split_rounding_mb:40",
        "max_split_size_mb:40",
    ),
    "large_segment_size_mb": ("4MiB", "torch_npu", "large_segment_size_mb:64", ""),
    "roundup_power2_divisions": ("1300KiB", "torch_npu", "roundup_power2_divisions:4", ""),
    "per_process_memory_fraction": ("3GiB", "torch_npu", "per_process_memory_fraction:0.25", ""),
    "garbage_collection_threshold": ("churn", "torch_npu", "garbage_collection_threshold:0.6", ""),
    "page_size": ("3MiB", "torch_npu", "page_size:1g", ""),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    cases = []
    for run, allocator, conf, baseline in CASES.values():
        cases += [[allocator, conf, run], [allocator if allocator != "npumem" else "torch_npu", baseline, run]]
    program = PROGRAM.replace("json.loads(sys.argv[2])", repr(cases))
    return run_torch_programs(tmp_path_factory.mktemp("alloc_conf"), program, {"out": {}})["out"]


def _pair(results, key):
    run, allocator, conf, baseline = CASES[key]
    base_allocator = allocator if allocator != "npumem" else "torch_npu"
    return results[f"{allocator}|{conf}|{run}"], results[f"{base_allocator}|{baseline}|{run}"]


def test_every_key_npumem_takes_has_a_case():
    from npumem import Device

    for key, (_, allocator, conf, _) in CASES.items():
        assert key in conf
        Device("64MiB", allocator=allocator, alloc_conf=conf)  # accepted as written


@pytest.mark.parametrize(
    ("key", "effect"),
    [
        # segments grow in place: a growing batch strands no segments
        ("expandable_segments", lambda on, off: on["reserved"] < 0.6 * off["reserved"]),
        # a cached block above the limit is not split for a smaller request: a new segment
        ("max_split_size_mb", lambda on, off: on["oversize"] == 1 and on["reserved"] > off["reserved"]),
        # an oversize block serves a request up to this much smaller: the 82 MiB segment (80 MiB and
        # torch_npu's 32-byte pad, rounded to 2 MiB) is reused for 50 MiB, no second segment
        ("max_non_split_rounding_mb", lambda on, off: on["reserved"] == 82 << 20 < off["reserved"]),
        # mid-sized requests take segments of this size
        ("large_segment_size_mb", lambda on, off: (on["reserved"], off["reserved"]) == (64 << 20, 20 << 20)),
        # 1,300 KiB rounds to the next quarter of a power of two (1.5 MiB), not to 512 bytes past the pad
        (
            "roundup_power2_divisions",
            lambda on, off: (on["allocated"], off["allocated"]) == (1536 * KiB, 1300 * KiB + 512),
        ),
        ("per_process_memory_fraction", lambda on, off: (on["answer"], off["answer"]) == ("out of memory", "fits")),
        # cached blocks go back to the device once reserved passes 60% of the allowed memory
        ("garbage_collection_threshold", lambda on, off: on["device_frees"] > 0 == off["device_frees"]),
        # 1 GiB pages: even 3 MiB reserves a whole page
        ("page_size", lambda on, off: (on["reserved"], off["reserved"]) == (1 << 30, 20 << 20)),
    ],
)
def test_each_key_changes_the_program_s_memory_as_in_the_replay(results, key, effect):
    on, off = _pair(results, key)
    assert effect(on, off), (key, on, off)


def test_expandable_segments_on_torch_npu_s_allocator_is_a_clear_error(results):
    kind, message = results["refused"]
    assert kind == "UnsupportedError"
    assert "expandable_segments is not available for the torch_npu family" in message
