"""Real torch.nn models on the `npu` device (host mode): every loss, output and updated weight
equals the CPU run's, and npumem's books match the tensors PyTorch holds."""

from __future__ import annotations

import copy

import pytest
from conftest import require_torch

torch = require_torch()
nn = torch.nn
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402


def _cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 10),
    )


def _step(model, optimizer, x, y, loss_fn):
    optimizer.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.detach()


def _assert_same_state(cpu_model, npu_model):
    for (name, a), (_, b) in zip(cpu_model.state_dict().items(), npu_model.state_dict().items(), strict=True):
        assert b.device.type == "npu", name
        torch.testing.assert_close(b.cpu(), a, rtol=0, atol=0, msg=name)


def test_cnn_training_step_with_batchnorm_and_sgd_equals_the_cpu_run(npu):
    torch.manual_seed(0)
    cpu_model = _cnn()
    npu_model = copy.deepcopy(cpu_model).npu()
    x, y = torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))
    opt_cpu = torch.optim.SGD(cpu_model.parameters(), lr=0.1, momentum=0.9)
    opt_npu = torch.optim.SGD(npu_model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(2):
        expected = _step(cpu_model, opt_cpu, x, y, loss_fn)
        got = _step(npu_model, opt_npu, x.npu(), y.npu(), loss_fn)
        assert got.device.type == "npu"
        torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0)
    _assert_same_state(cpu_model, npu_model)  # weights, BatchNorm running stats, batch counts


def test_transformer_encoder_step_with_adamw_equals_the_cpu_run(npu):
    torch.manual_seed(1)
    layer = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=True)
    cpu_model = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
    npu_model = copy.deepcopy(cpu_model).npu()
    x = torch.randn(2, 5, 32)
    opt_cpu = torch.optim.AdamW(cpu_model.parameters(), lr=1e-3, foreach=False)
    opt_npu = torch.optim.AdamW(npu_model.parameters(), lr=1e-3, foreach=False)

    def loss_fn(out, _):
        return out.square().mean()

    for _ in range(2):
        # Attention takes PyTorch's math path on npu (the fused choice is a CPU/CUDA-only stub):
        # the CPU run takes it too, so that both compute the same sums in the same order.
        with sdpa_kernel(SDPBackend.MATH):
            expected = _step(cpu_model, opt_cpu, x, None, loss_fn)
        got = _step(npu_model, opt_npu, x.npu(), None, loss_fn)
        torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0)
    _assert_same_state(cpu_model, npu_model)
    for p_cpu, p_npu in zip(cpu_model.parameters(), npu_model.parameters(), strict=True):
        for key, value in opt_cpu.state[p_cpu].items():
            torch.testing.assert_close(opt_npu.state[p_npu][key].cpu(), value, rtol=0, atol=0, msg=key)


def test_inference_under_no_grad_equals_the_cpu_run_and_frees_its_activations(npu):
    torch.manual_seed(2)
    model = _cnn().eval()
    x = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        expected = model(x)
    on_npu = copy.deepcopy(model).npu()
    before = torch.npu.memory_allocated()
    with torch.no_grad():
        got = on_npu(x.npu())
    torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0)
    del got
    assert torch.npu.memory_allocated() == before  # the input and every activation freed


def _block(nbytes: int) -> int:
    """torch_npu's block size for a request (NPUCachingAllocator round_size: 32 bytes of
    padding, then a multiple of 512)."""
    return max(512, (nbytes + 32 + 511) // 512 * 512)


def _storages(tensors) -> dict[int, int]:
    out = {}
    for t in tensors:
        s = t.untyped_storage()
        if s.data_ptr():
            out[s.data_ptr()] = s.nbytes()
    return out


def test_memory_allocated_equals_a_recount_of_the_live_storages(npu):
    torch.npu.empty_cache()
    start = {a["ptr"] for a in npu.allocations()}
    base = torch.npu.memory_allocated()
    torch.manual_seed(3)
    model = _cnn().npu()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(2, 3, 8, 8).npu(), torch.randint(0, 10, (2,)).npu()
    loss = _step(model, opt, x, y, nn.CrossEntropyLoss())
    held = [*model.parameters(), *model.buffers(), x, y, loss]
    held += [p.grad for p in model.parameters()]
    held += [v for state in opt.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    live = _storages(held)
    assert {a["ptr"] for a in npu.allocations()} - start == set(live)
    assert torch.npu.memory_allocated() - base == sum(_block(n) for n in live.values())
    del model, opt, x, y, loss, held
    assert torch.npu.memory_allocated() == base


@pytest.mark.parametrize("op", ["nonzero", "topk", "index_put", "cumsum", "sort"])
def test_ops_with_new_or_resized_outputs_equal_the_cpu_run(npu, op):
    torch.manual_seed(4)
    a = torch.randn(6, 5)
    b = a.npu()
    run = {
        "nonzero": lambda t: (t > 0).nonzero(),
        "topk": lambda t: torch.topk(t, 2, dim=1).values,
        "index_put": lambda t: t.clone().index_put_((torch.tensor([0, 2]).to(t.device),), torch.tensor(7.0)),
        "cumsum": lambda t: torch.cumsum(t, 0),
        "sort": lambda t: torch.sort(t, dim=0).indices,
    }[op]
    torch.testing.assert_close(run(b).cpu(), run(a), rtol=0, atol=0)


def test_views_and_in_place_writes_share_the_npu_storage(npu):
    t = torch.zeros(4, 6, device="npu")
    v = t[1:3].t()
    v.add_(1)
    t.view(24)[0] = 5
    assert v.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
    expected = torch.zeros(4, 6)
    expected[1:3] += 1
    expected.view(24)[0] = 5
    torch.testing.assert_close(t.cpu(), expected, rtol=0, atol=0)
    assert t.sum().item() == expected.sum().item()


@pytest.mark.parametrize(
    "dtype", ["float16", "bfloat16", "float64", "int64", "uint8", "bool", "complex64", "float8_e4m3fn"]
)
def test_every_dtype_keeps_its_bytes_and_layout_on_npu(npu, dtype):
    dtype = getattr(torch, dtype)
    x = torch.arange(24).reshape(2, 3, 4).to(dtype).transpose(0, 2)
    y = x.npu()
    assert (y.dtype, y.shape, y.stride()) == (dtype, x.shape, x.stride())
    assert npu.allocation(y.data_ptr())["size"] == 24 * dtype.itemsize
    as_bytes = [t.contiguous().view(torch.uint8) for t in (y.cpu(), x)]
    torch.testing.assert_close(*as_bytes, rtol=0, atol=0)


def test_channels_last_and_zero_dim_tensors(npu):
    x = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    y = x.npu()
    assert y.stride() == x.stride() and y.is_contiguous(memory_format=torch.channels_last)
    z = torch.empty(2, 3, 4, 5, device="npu", memory_format=torch.channels_last)
    assert z.stride() == x.stride()
    assert torch.tensor(3.5).npu().item() == 3.5
    torch.testing.assert_close(torch.nn.functional.relu(y).cpu(), torch.relu(x), rtol=0, atol=0)


def test_out_tensors_and_resize_move_onto_fresh_npu_allocations(npu):
    src = torch.randn(5)
    out = torch.empty(0, device="npu")
    torch.abs(src.npu(), out=out)  # the kernel resizes its out= tensor
    torch.testing.assert_close(out.cpu(), src.abs(), rtol=0, atol=0)
    assert npu.allocation(out.data_ptr())["size"] == 20
    before = {a["ptr"] for a in npu.allocations()}
    old = out.data_ptr()
    out.resize_(100)  # grows: a new allocation, the old bytes kept, the old block freed
    assert out.data_ptr() != old and old not in {a["ptr"] for a in npu.allocations()}
    assert npu.allocation(out.data_ptr())["size"] == 400 and len(before) == len(npu.allocations())
    torch.testing.assert_close(out[:5].cpu(), src.abs(), rtol=0, atol=0)
    out.resize_(2, 3)  # shrinks in place
    assert out.data_ptr() != old and out.shape == (2, 3)
    torch.testing.assert_close(out.view(-1)[:5].cpu(), src.abs(), rtol=0, atol=0)


def test_autocast_on_npu_runs_and_casts_nothing(npu):
    model = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    with torch.autocast("npu", dtype=torch.float16):
        y = model.npu()(x.npu())
    assert y.dtype == torch.float32  # documented: no per-op cast policy is registered
    torch.testing.assert_close(y.cpu(), model.cpu()(x), rtol=0, atol=0)


def _subsequence(small: list[int], big: list[int]) -> bool:
    it = iter(big)
    return all(any(x == y for y in it) for x in small)


@pytest.mark.parametrize("kind", ["mlp", "transformer"])
def test_allocations_follow_a_cpu_profiler_trace_of_the_same_program(npu, kind, tmp_path):
    """The sizes and order of npu allocations are the CPU profiler's (profile_memory=True, read
    by npumem's importer), as torch_npu's allocator rounds them. The CPU run's extra entries are
    memory the CPU kernels take inside one op and CPU scalars the optimizer makes: CPU memory in
    the npu run too."""
    from torch.profiler import ProfilerActivity, profile

    from npumem import formats

    torch.manual_seed(5)
    if kind == "mlp":
        cpu_model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 10))
    else:
        layer = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.0, batch_first=True)
        encoder = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        cpu_model = nn.Sequential(nn.Linear(16, 32), encoder, nn.Linear(32, 10))
    npu_model = copy.deepcopy(cpu_model).npu()
    x, y = torch.randn(4, 5, 16), torch.randint(0, 10, (4, 5))

    def program(model, x, y):
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=False)
        for _ in range(2):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
            opt.step()

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof, sdpa_kernel(SDPBackend.MATH):
        program(cpu_model, x, y)
    prof.export_chrome_trace(str(tmp_path / "cpu.json"))
    trace = formats.load(str(tmp_path / "cpu.json"))
    on_cpu = [_block(int(size)) for alloc, size in zip(trace.is_alloc, trace.sizes, strict=True) if alloc]
    xn, yn = x.npu(), y.npu()
    npu.record_memory_history(True)
    try:
        program(npu_model, xn, yn)
        on_npu = [e["size"] for e in npu.memory_snapshot()["device_traces"][0] if e["action"] == "alloc"]
    finally:
        npu.record_memory_history(False)
    assert len(on_npu) > 30
    assert _subsequence(on_npu, on_cpu), (on_npu, on_cpu)
    if kind == "mlp":  # no kernel scratch: the same allocations, then the optimizer's CPU scalars
        assert on_cpu[: len(on_npu)] == on_npu and len(on_cpu) - len(on_npu) == 2 * 4
    else:
        assert len(on_npu) >= 0.7 * len(on_cpu)
