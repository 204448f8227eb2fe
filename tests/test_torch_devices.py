"""Several `npu` devices (`NPUMEM_DEVICES=2`): npu:0 and npu:1 are the devices of npumem.acl's
system (one address space), a copy between them takes the peer path, an unknown index is a clear
error, and autograd on npu:1 runs through compiled autograd (PyTorch's Python device guard knows
one device, so its engine has no worker for npu:1)."""

from __future__ import annotations

import textwrap

import pytest
from conftest import require_torch, run_torch_programs

require_torch()

PROGRAM = textwrap.dedent(
    """
    import copy, json, sys
    import numpy as np
    import torch
    import npumem.acl as acl
    import npumem.torch as nt
    from npumem.acl._runtime import RT

    out = {}
    # acl's system in use with other settings: refused, nothing changed
    acl.configure(devices=2, capacity="1GiB", backend="sim")
    acl.init(); acl.rt.set_device(0)
    try:
        nt.install(capacity="1GiB")
    except nt.InstallError as e:
        out["conflict"] = str(e)
    acl.rt.reset_device(0); acl.finalize()
    settings = nt.install(capacity="1GiB")  # NPUMEM_DEVICES and NPUMEM_TORCH_MODE from the environment
    host = settings.mode == "host"
    out["count"] = torch.npu.device_count()
    out["shared"] = all(RT.sys().device(i) is nt.device(i) for i in range(2))
    expected = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    a = expected.to("npu:1")
    out["placed"] = [str(a.device), torch.npu.memory_allocated(1), torch.npu.memory_allocated(0)]
    on1 = nt.device(1)
    on1.record_memory_history(True)
    copies = {
        "same layout": lambda: a.to("npu:0"),
        "transposed": lambda: a.t().to("npu:0"),
        "strided destination": lambda: torch.zeros(4, 6, device="npu:0")[:, ::2].copy_(a.t()),
        "dtype": lambda: a.to("npu:0", torch.float64),
    }
    want = {"same layout": expected, "transposed": expected.t(), "strided destination": expected.t()}
    want["dtype"] = expected.double()
    out["copies"] = {}
    for name, fn in copies.items():
        before = len(on1.memory_snapshot()["device_traces"][0])
        got = fn()
        staged = [e["size"] for e in on1.memory_snapshot()["device_traces"][0][before:] if e["action"] == "alloc"]
        same = torch.equal(got.cpu(), want[name]) if host else None
        out["copies"][name] = [str(got.device), list(got.shape), same, staged]
    # npumem.acl sees the same memory: it reads the tensor's bytes, its malloc is in the counters
    acl.init(); acl.rt.set_device(1)
    buf = np.zeros(12, dtype=np.float32)
    if host:
        acl.rt.memcpy(buf.ctypes.data, 48, a.data_ptr(), 48, 2)
    before = torch.npu.memory_allocated(1)
    ptr, ret = acl.rt.malloc(4096, 0)
    out["acl"] = [buf.tolist(), ret, torch.npu.memory_allocated(1) - before]
    acl.rt.free(ptr)
    torch.npu.set_device(1)
    out["current"] = [torch.npu.current_device(), str(torch.empty(2, device="npu").device)]
    torch.npu.set_device(0)
    model = torch.nn.Linear(4, 2)
    with torch.no_grad():
        y = model.to("npu:1")(a)
        out["inference"] = [str(y.device), torch.allclose(y.cpu(), model.cpu()(expected)) if host else None]
    w = torch.ones(3, device="npu:0", requires_grad=True)
    (w * 2).sum().backward()
    out["backward0"] = str(w.grad.device)
    # training on npu:1 (compiled autograd), against the same steps on the CPU
    x, target = torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,))
    runs = {}
    for where in ("cpu", "npu:1"):
        torch.manual_seed(0)
        net = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
            torch.nn.Flatten(), torch.nn.Linear(512, 10),
        ).to(where)
        opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        losses = []
        for _ in range(3):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(net(x.to(where)), target.to(where))
            loss.backward()
            opt.step()
            losses.append(loss.item() if host or where == "cpu" else list(loss.shape))
        runs[where] = [losses, [p.grad for p in net.parameters()], [p for p in net.parameters()]]
    (cpu_losses, cpu_grads, cpu_params), (losses, grads, params) = runs["cpu"], runs["npu:1"]
    out["train1"] = {
        "devices": sorted({str(g.device) for g in grads + params}),
        "losses": [cpu_losses == losses] if host else losses,
        "equal": all(torch.equal(a.cpu(), b) for a, b in zip(grads + params, cpu_grads + cpu_params)) if host else None,
        "shapes": [list(g.shape) for g in grads] == [list(g.shape) for g in cpu_grads],
        "on_npu1": torch.npu.memory_allocated(1) >= sum(4 * g.numel() for g in grads + params),
        "engine_after": None,
    }
    # model parallel, the loss on npu:0: the graph walk finds npu:1 inside
    torch.manual_seed(0)
    first, second = torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)
    cpu_first, cpu_second = copy.deepcopy(first), copy.deepcopy(second)
    first.to("npu:1")
    second.to("npu:0")
    inputs = torch.randn(3, 4)
    second(first(inputs.to("npu:1")).to("npu:0")).square().sum().backward()
    cpu_second(cpu_first(inputs)).square().sum().backward()
    out["parallel"] = [str(first.weight.grad.device), str(second.weight.grad.device)]
    if host:
        out["parallel"].append(torch.equal(first.weight.grad.cpu(), cpu_first.weight.grad))
    w1 = torch.ones(3, device="npu:1", requires_grad=True)
    out["grad1"] = [t.tolist() if host else list(t.shape) for t in torch.autograd.grad((w1 * w1).sum(), [w1])]
    w.grad = None
    (w * 3).sum().backward()  # npu:0 still takes the engine's own path
    out["train1"]["engine_after"] = w.grad.tolist() if host else str(w.grad.device)
    def anomaly(fn):
        with torch.autograd.detect_anomaly():
            fn()

    # an event of npu:1 waited on by npu:0's stream (on the host); recording it on npu:0 is refused
    e = torch.npu.Event()
    e.record(torch.npu.current_stream(1))
    e.wait(torch.npu.current_stream(0))
    out["event"] = [str(e.device), e.query()]
    for name, fn in [
        ("event0", lambda: e.record(torch.npu.current_stream(0))),
        ("backward1", lambda: torch.autograd.grad((w1 * w1).sum(), [w1], create_graph=True)),
        ("anomaly1", lambda: anomaly(lambda: (w1 * w1).sum().backward())),
        ("unknown", lambda: torch.empty(2, device="npu:2")),
        ("set_device", lambda: torch.npu.set_device(5)),
    ]:
        try:
            fn()
            out[name] = None
        except Exception as e:
            out[name] = [type(e).__name__, str(e)]
    json.dump(out, open(sys.argv[1], "w"))
    """
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The program's result in host mode and in shape mode, two devices each (both at once)."""
    envs = {mode: {"NPUMEM_DEVICES": "2", "NPUMEM_TORCH_MODE": mode} for mode in ("host", "shape")}
    return run_torch_programs(tmp_path_factory.mktemp("devices"), PROGRAM, envs)


@pytest.mark.parametrize("mode", ["host", "shape"])
def test_two_devices_are_npumem_acl_s_and_each_counts_its_own_memory(runs, mode):
    r = runs[mode]
    assert r["count"] == 2 and r["shared"]
    assert r["placed"] == ["npu:1", 512, 0]  # 48 bytes as torch_npu's allocator rounds them, on npu:1 only
    assert r["current"] == [1, "npu:1"]
    assert r["inference"][0] == "npu:1" and r["backward0"] == "npu:0"
    assert r["acl"][1:] == [0, 4608]  # acl.rt.malloc(4096) is in torch.npu.memory_allocated(1)


def test_an_acl_system_in_use_with_other_settings_is_refused(runs):
    message = runs["host"]["conflict"]
    assert message.startswith("npumem.acl's system has devices in use with Config(devices=2")
    assert "backend='sim'" in message and "backend='host'" in message and "configure both alike" in message


@pytest.mark.parametrize("mode", ["host", "shape"])
def test_copies_between_devices_take_the_peer_path_staging_only_where_layouts_differ(runs, mode):
    copies = runs[mode]["copies"]
    host = mode == "host"
    assert copies["same layout"] == ["npu:0", [3, 4], True if host else None, []]  # one peer copy, no staging
    assert copies["transposed"] == ["npu:0", [4, 3], True if host else None, []]  # .to keeps the strides
    # a destination that is not contiguous: the transposed source made contiguous on npu:1 (48
    # bytes: a 512-byte block), copied into a contiguous temporary on npu:0, then into it there
    assert copies["strided destination"] == ["npu:0", [4, 3], True if host else None, [512]]
    # another dtype: converted on the destination's device (no staging on npu:1), as CUDA does
    assert copies["dtype"] == ["npu:0", [3, 4], True if host else None, []]


def test_host_mode_copies_and_reads_equal_the_cpu_s(runs):
    r = runs["host"]
    assert all(c[2] for c in r["copies"].values())
    assert r["acl"][0] == [float(i) for i in range(12)] and r["inference"][1]


@pytest.mark.parametrize("mode", ["host", "shape"])
def test_a_training_step_on_npu1_gives_the_cpu_runs_losses_and_gradients(runs, mode):
    r = runs[mode]["train1"]
    assert r["devices"] == ["npu:1"] and r["shapes"] and r["on_npu1"]
    assert runs[mode]["parallel"] == (["npu:1", "npu:0", True] if mode == "host" else ["npu:1", "npu:0"])
    if mode == "host":
        assert r["losses"] == [True] and r["equal"] and r["engine_after"] == [3.0, 3.0, 3.0]
        assert runs[mode]["grad1"] == [[2.0, 2.0, 2.0]]
    else:
        assert r["losses"] == [[], [], []] and r["engine_after"] == "npu:0" and runs[mode]["grad1"] == [[3]]


@pytest.mark.parametrize("mode", ["host", "shape"])
def test_an_unknown_index_and_double_backward_on_npu1_are_clear_errors(runs, mode):
    r = runs[mode]
    assert r["unknown"] == ["ValueError", "device='npu:2': no such npu device; npumem.torch has npu:0, npu:1"]
    assert r["set_device"] == ["ValueError", "device=5: no such npu device; npumem.torch has npu:0, npu:1"]
    assert r["event"] == ["npu:1", True]
    assert r["event0"] == ["RuntimeError", "Event device npu:1 does not match recording stream's device npu:0"]
    kind, message = r["backward1"]
    assert kind == "DeviceAutogradError"
    assert message.startswith("ACL_ERROR_FEATURE_UNSUPPORTED (200006): this backward over tensors on npu:1 or above")
    assert "(create_graph=True, anomaly detection)" in message
    assert r["anomaly1"][0] == "DeviceAutogradError"
