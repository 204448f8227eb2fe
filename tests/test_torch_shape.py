"""Shape mode (`mode="shape"`): the npu device's memory is a simulated device's and ops compute
only shapes. The same program makes the very allocations host mode makes, an op that needs values
is one clear error naming it, and `npumem fit --mode shape` answers for a Llama-style model far
larger than the machine (a 2-layer one here; `make bench B=torch-shape` runs the 7B one)."""

from __future__ import annotations

import json
import os
import pathlib
import pickle
import re
import subprocess
import sys
import textwrap

import pytest
from conftest import require_torch, run_torch_programs

torch = require_torch()

ROOT = pathlib.Path(__file__).resolve().parent.parent
LLAMA = ROOT / "examples" / "llama_train_step.py"

PROGRAM = textwrap.dedent(
    """
    import json, sys
    import torch
    from torch import nn
    import npumem.torch

    settings = npumem.torch.install(capacity="1GiB", allocator="torch_npu")
    dev = npumem.torch.device()
    torch.npu.memory._record_memory_history()
    torch.manual_seed(0)
    cnn = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10),
    ).npu()
    sgd = torch.optim.SGD(cnn.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(4, 3, 16, 16).npu(), torch.randint(0, 10, (4,), device="npu")
    for _ in range(2):
        sgd.zero_grad()
        nn.CrossEntropyLoss()(cnn(x), y).backward()
        sgd.step()
    layer = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.0, batch_first=True)
    encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).npu()
    adamw = torch.optim.AdamW(encoder.parameters(), lr=1e-3)
    with torch.autocast("npu", dtype=torch.bfloat16):
        loss = encoder(torch.randn(2, 5, 32, device="npu")).square().mean()
    loss.backward()
    adamw.step()
    cnn.eval()
    with torch.no_grad():
        out = cnn(x)
    out.resize_(64)  # grows: onto a fresh allocation
    torch.abs(x.flatten(), out=torch.empty(0, device="npu"))  # the kernel resizes its out= tensor
    view = out[3:7]
    torch.npu.memory._dump_snapshot(sys.argv[1] + ".pickle")
    result = {
        "mode": settings.mode,
        "trace": [[e["action"], e["size"]] for e in dev.memory_snapshot()["device_traces"][0]],
        "peak_allocated": dev.max_memory_allocated(),
        "allocated": dev.memory_allocated(),
        "view": [view.untyped_storage().data_ptr() == out.untyped_storage().data_ptr(), view.storage_offset()],
        "shapes": [list(out.shape), list(encoder.layers[0].linear1.weight.grad.shape)],
        "errors": {},
    }
    a = torch.ones(3, 4, device="npu")
    for name, fn in [
        ("item", lambda: loss.item()),
        ("bool", lambda: bool(a.sum() > 0)),
        ("nonzero", lambda: a.nonzero()),
        ("mask", lambda: a[a > 0]),
        ("print", lambda: print(a)),
        ("cpu", lambda: a.cpu()),
        ("tolist", lambda: a.tolist()),
        ("mismatch", lambda: a @ a),
    ]:
        try:
            fn()
            result["errors"][name] = None
        except Exception as e:
            result["errors"][name] = [type(e).__name__, str(e)]
    json.dump(result, open(sys.argv[1], "w"))
    """
)


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NPUMEM_", "PYTORCH_NPU"))}
    return {**env, **extra}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The program's result in host mode and in shape mode (both processes run at once)."""
    envs = {mode: {"NPUMEM_TORCH_MODE": mode} for mode in ("host", "shape")}
    return run_torch_programs(tmp_path_factory.mktemp("shape"), PROGRAM, envs)


def test_shape_mode_makes_the_allocations_host_mode_makes(runs):
    host, shape = runs["host"], runs["shape"]
    assert (host["mode"], shape["mode"]) == ("host", "shape")
    assert len(shape["trace"]) > 100 and {"alloc", "free_completed"} <= {a for a, _ in shape["trace"]}
    assert shape["trace"] == host["trace"]  # every allocation and free, in order, with its size
    for key in ("peak_allocated", "allocated", "view", "shapes"):
        assert shape[key] == host[key], key
    assert shape["view"] == [True, 3] and shape["shapes"] == [[64], [64, 32]]


@pytest.mark.parametrize("mode", ["host", "shape"])
def test_memory_viz_reads_the_dumped_snapshot(runs, mode, tmp_path):
    from torch.cuda import _memory_viz

    with open(runs[mode]["json"] + ".pickle", "rb") as f:
        snap = pickle.load(f)
    events = snap["device_traces"][0]
    assert [[e["action"], e["size"]] for e in events] == runs[mode]["trace"]
    assert "Summary of segments" in _memory_viz.segsum(snap)  # `python -m torch.cuda._memory_viz stats`
    trace = _memory_viz.trace(snap)  # `... trace`
    assert f"Device 0 ----------------\n{len(events)} entries\n" in trace and "\ndel " in trace
    html = _memory_viz.trace_plot(snap)  # `... trace_plot`
    assert "<html" in html.lower() and len(html) > 10_000


@pytest.mark.parametrize(
    ("case", "op", "why"),
    [
        ("item", "aten::_local_scalar_dense", r"Tensor.item\(\), float\(t\)"),
        ("bool", "aten::_local_scalar_dense", r"bool\(t\) and `if t:` read a value"),
        ("nonzero", "aten::nonzero", "its result depends on them"),
        ("mask", "aten::index", "its result depends on them"),
        ("print", r"printing a tensor \(aten::\w+\)", r"print\(\), str\(\) and repr\(\) format its values"),
        ("cpu", "aten::_copy_from", r"copying to the CPU \(.cpu\(\)"),
        ("tolist", "aten::_copy_from", r"\.tolist\(\)"),
    ],
)
def test_an_op_that_needs_values_is_one_clear_error_naming_it(runs, case, op, why):
    kind, message = runs["shape"]["errors"][case]
    assert kind == "ShapeModeError"
    assert re.match(rf"ACL_ERROR_FEATURE_UNSUPPORTED \(200006\): {op} needs the tensors' values", message), message
    assert re.search(why, message) and "Run in host mode (mode='host'" in message, message
    assert runs["host"]["errors"][case] is None  # host mode has the values


def test_a_shape_error_of_the_program_reads_as_the_cpu_kernel_s(runs):
    with pytest.raises(RuntimeError) as cpu:
        torch.ones(3, 4) @ torch.ones(3, 4)
    assert runs["shape"]["errors"]["mismatch"] == ["RuntimeError", str(cpu.value)]
    assert runs["host"]["errors"]["mismatch"] == ["RuntimeError", str(cpu.value)]


def _fit(*runs: tuple[str, list[str]]) -> list[subprocess.CompletedProcess]:
    """``npumem fit --mode shape --json`` at each (capacity, script and arguments), all at once."""
    procs = []
    for capacity, script in runs:
        cmd = [sys.executable, "-m", "npumem", "fit", "--mode", "shape", "--capacity", capacity, "--json", *script]
        procs.append(subprocess.Popen(cmd, env=_clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return done


def test_a_llama_style_training_step_fits_only_where_weights_grads_and_adam_states_do(tmp_path):
    reads = tmp_path / "reads.py"
    reads.write_text("import torch\nloss = torch.ones(3, device='npu').sum()\nprint(loss.item())\n")
    llama = [str(LLAMA), "--layers", "2", "--seq", "256"]
    small, large, value = _fit(("8GiB", llama), ("24GiB", llama), ("1GiB", [str(reads)]))
    params = int(large.stdout.splitlines()[0].removeprefix("parameters: "))
    assert params == 2 * 32000 * 4096 + 2 * (4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096) + 4096
    assert small.returncode == 1, small.stderr
    answer = json.loads(small.stdout.splitlines()[-1])
    assert not answer["fits"] and answer["out_of_memory"]["file"] == str(LLAMA)
    assert large.returncode == 0, large.stderr
    answer = json.loads(large.stdout.splitlines()[-1])
    assert answer["fits"] and answer["capacity"] == 24 << 30
    # weights, gradients and AdamW's two moments: 16 bytes per parameter live at once
    assert 16 * params <= answer["peak_allocated"] <= answer["peak_reserved"] <= 24 << 30
    # a script that reads a value: one line naming its line and the op, exit status 2
    assert value.returncode == 2 and value.stdout == ""
    last = value.stderr.strip().splitlines()[-1]
    assert last.startswith(f"npumem fit: {reads}:3: ACL_ERROR_FEATURE_UNSUPPORTED (200006): aten::_local_scalar_dense")
    assert "Traceback" not in value.stderr
