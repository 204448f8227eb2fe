"""Graphs from PyTorch models, for static planning (:mod:`npumem.graph`). torch is an optional
dependency: it is imported only when one of these functions is called.

- :func:`from_fx`: ``torch.fx.symbolic_trace`` + ``ShapeProp`` — module-level inference graphs
  (torchvision classifiers). ``fuse=True`` aliases batch norm, activations, dropout, identity and
  flatten into their producer when it has no other user, as inference engines fold and fuse them.
- :func:`from_export`: ``torch.export.export(strict=False)`` — ATen-level inference graphs
  (transformers' BERT); parameters and buffers become weights.
- :func:`from_training`: ``make_fx`` of one training step (forward, a scalar loss, and
  ``torch.autograd.grad`` for every parameter) with fake tensors: the joint forward + backward
  graph; gradients are graph outputs. With ``lr``, the step ends with SGD's in-place update of
  every parameter (``p -= lr * grad``): writes to the weights, kept after their last read.

In every graph the nodes keep their execution order; view ops (view, reshape, transpose,
permute, expand, slice, select, squeeze, split, getitem, ...) and in-place ops alias their base,
so they add no bytes; sizes are ``numel * element_size`` of each node's tensor meta. Nodes
without a tensor result (shapes, scalars) are skipped.

Example (needs torch and torchvision)::

    import torch, torchvision
    from npumem.torch_graphs import from_fx
    g = from_fx(torchvision.models.resnet50(), torch.randn(1, 3, 224, 224), fuse=True)
    print(g.plan().table())
"""

from __future__ import annotations

from typing import Any

from . import _args
from ._optional import require
from .errors import invalid_param
from .graph import Graph

# ATen / Python view ops: their result shares the first argument's memory.
_VIEW_NAMES = {
    "view",
    "_unsafe_view",
    "reshape",
    "t",
    "transpose",
    "permute",
    "expand",
    "expand_as",
    "slice",
    "select",
    "squeeze",
    "unsqueeze",
    "alias",
    "detach",
    "split",
    "split_with_sizes",
    "chunk",
    "unbind",
    "getitem",
    "flatten",
    "contiguous",
    "as_strided",
    "view_as",
    "narrow",
    "unflatten",
    "lift_fresh_copy",
    "_to_copy_noop",
}
# Modules and functions that inference engines fold or fuse into their producer (fuse=True).
_FUSABLE = {"BatchNorm1d", "BatchNorm2d", "ReLU", "ReLU6", "Hardswish", "Hardsigmoid", "SiLU", "GELU"}
_FUSABLE |= {"Dropout", "Identity", "Flatten", "relu", "relu_", "hardswish", "dropout", "flatten", "silu", "gelu"}


def _target_name(node: Any) -> str:
    """The bare op name of a node: ``aten.view.default`` -> ``view``; ``operator.getitem`` ->
    ``getitem``; a module call -> the module class name."""
    t = node.target
    if node.op == "call_module":
        return type(node.graph.owning_module.get_submodule(t)).__name__
    if isinstance(t, str):
        return t
    name = getattr(t, "__name__", None) or str(t)
    overload = getattr(t, "_overloadpacket", None)  # OpOverload: aten.view.default
    if overload is not None:
        name = overload.__name__
    return name.split(".")[-1]


def _nbytes(meta: Any) -> int | list[int] | None:
    """Bytes of a node's result: one int for a tensor, a list for a tuple of tensors, None
    otherwise. Understands ShapeProp's ``TensorMetadata`` and FakeTensors."""
    import torch

    if isinstance(meta, torch.Tensor):
        return meta.numel() * meta.element_size()
    shape = getattr(meta, "shape", None)
    dtype = getattr(meta, "dtype", None)
    if shape is not None and isinstance(dtype, torch.dtype):
        n = 1
        for d in shape:
            n *= int(d)
        return n * (torch.finfo(dtype).bits if dtype.is_floating_point else torch.iinfo(dtype).bits) // 8
    if isinstance(meta, (tuple, list)):
        parts = [_nbytes(m) for m in meta]
        return [p if isinstance(p, int) else 0 for p in parts]
    return None


def _meta(node: Any) -> Any:
    m = node.meta
    return m.get("val", m.get("tensor_meta"))


def _walk(
    gm: Any,
    *,
    weights: set[str],
    alignment: int,
    fuse: bool,
    output_role: str = "output",
) -> Graph:
    """Lowers an fx ``GraphModule`` with tensor metadata to a :class:`Graph`. ``weights`` names
    the placeholders that are parameters or buffers."""
    g = Graph(alignment=alignment)
    names: dict[Any, str] = {}  # fx node -> tensor name (for tuples: the op's parts)
    parts: dict[Any, list[str]] = {}

    def args_of(node: Any) -> list[Any]:
        import torch.fx

        found: list[Any] = []
        torch.fx.node.map_arg((node.args, node.kwargs), lambda n: found.append(n))
        return [n for n in found if n in names or n in parts]

    def inputs_of(node: Any) -> list[str]:
        out = []
        for n in args_of(node):
            out.extend([names[n]] if n in names else parts[n])
        return list(dict.fromkeys(out))

    for node in gm.graph.nodes:
        size = _nbytes(_meta(node))
        if node.op == "placeholder":
            if isinstance(size, int) and size > 0:
                names[node] = (g.weight if node.name in weights else g.input)(node.name, size)
            continue
        if node.op == "get_attr":
            if isinstance(size, int) and size > 0:
                names[node] = g.weight(node.name, size)
            continue
        if node.op == "output":
            outs = []
            for n in args_of(node):
                outs.extend([names[n]] if n in names else parts[n])
            for t in dict.fromkeys(outs):
                if g.role(t) == "activation":
                    if output_role == "output":
                        g.mark_output(t)
            continue
        ins = inputs_of(node)
        if node.op == "call_module":
            # The module's parameters and buffers are the op's weights.
            mod = gm.get_submodule(node.target)
            for pname, tensor in [*mod.named_parameters(recurse=False), *mod.named_buffers(recurse=False)]:
                wname = f"{node.target}.{pname}"
                if wname not in g.tensors:
                    g.weight(wname, max(tensor.numel() * tensor.element_size(), 1))
                ins.append(wname)
        kind = _target_name(node)
        first = args_of(node)[0] if args_of(node) else None
        base = names.get(first) if first is not None else None
        inplace = (kind.endswith("_") and not kind.endswith("__")) or getattr(
            gm.get_submodule(node.target) if node.op == "call_module" else None, "inplace", False
        )
        alias = base is not None and (
            kind in _VIEW_NAMES
            or inplace
            or (fuse and kind in _FUSABLE and len(first.users) == 1 and g.role(base) == "activation")
        )
        if kind == "getitem" and first in parts:
            idx = node.args[1] if isinstance(node.args[1], int) else 0
            base = parts[first][idx] if idx < len(parts[first]) else None
            alias = base is not None
        if isinstance(size, list):
            outs = [(f"{node.name}.{i}", s) for i, s in enumerate(size) if s > 0]
            if not outs:
                continue
            g.op(node.name, ins, outs)
            parts[node] = [o for o, _ in outs]
            continue
        if not isinstance(size, int) or size <= 0:
            continue
        if alias and base is not None:
            out = g.alias(node.name, base, size)
        else:
            out = g.tensor(node.name, size)
        g.op(node.name, ins, [out])
        names[node] = out
    return g


def _alignment(alignment: Any) -> int:
    alignment = _args.integer(alignment, "alignment", 1, 1 << 40)
    if alignment & (alignment - 1):
        raise invalid_param(f"alignment {alignment} must be a power of two (e.g. 512)")
    return alignment


def from_fx(model: Any, *example_inputs: Any, fuse: bool = False, alignment: int = 512) -> Graph:
    """An inference graph by ``torch.fx.symbolic_trace`` and ``ShapeProp`` (module level)."""
    alignment = _alignment(alignment)
    fuse = _args.flag(fuse, "fuse")
    torch = require("torch", "npumem.torch_graphs.from_fx")
    from torch.fx.passes.shape_prop import ShapeProp

    gm = torch.fx.symbolic_trace(model.eval())
    with torch.no_grad():
        ShapeProp(gm).propagate(*example_inputs)
    return _walk(gm, weights=set(), alignment=alignment, fuse=fuse)


def from_export(model: Any, args: tuple = (), kwargs: dict | None = None, *, alignment: int = 512) -> Graph:
    """An ATen-level inference graph by ``torch.export.export(strict=False)``."""
    alignment = _alignment(alignment)
    if not isinstance(args, (tuple, list)):
        raise _args.type_error("args", args, "a tuple of example inputs")
    if kwargs is not None:
        _args.mapping(kwargs, "kwargs")
    torch = require("torch", "npumem.torch_graphs.from_export")

    with torch.no_grad():
        ep = torch.export.export(model.eval(), tuple(args), kwargs or {}, strict=False)
    sig = ep.graph_signature
    weights = set(sig.inputs_to_parameters) | set(sig.inputs_to_buffers)
    weights |= set(getattr(sig, "inputs_to_lifted_tensor_constants", {}) or {})
    return _walk(ep.graph_module, weights=weights, alignment=alignment, fuse=False)


def from_training(
    model: Any, *example_inputs: Any, loss: Any = None, alignment: int = 512, lr: float | None = None
) -> Graph:
    """The joint forward + backward graph of one training step, traced with fake tensors.
    ``loss(output)`` makes the scalar (default: ``output.float().square().mean()``); every
    parameter's gradient is a graph output. ``lr`` adds the SGD update of every parameter."""
    alignment = _alignment(alignment)
    if lr is not None:
        lr = _args.real(lr, "lr", 0.0, 1e9)
    if loss is not None and not callable(loss):
        raise _args.type_error("loss", loss, "a function of the model's output, or None")
    torch = require("torch", "npumem.torch_graphs.from_training")
    from torch.func import functional_call
    from torch.fx.experimental.proxy_tensor import make_fx

    model.train()
    params = {k: v.detach() for k, v in model.named_parameters()}
    buffers = {k: v.detach() for k, v in model.named_buffers()}
    loss_fn = loss or (lambda out: out.float().square().mean())

    def step(params: dict, buffers: dict, *inputs: Any) -> Any:
        out = functional_call(model, (params, buffers), inputs)
        grads = torch.autograd.grad(loss_fn(out), list(params.values()))
        if lr is not None:
            with torch.no_grad():
                for p, g in zip(params.values(), grads, strict=True):
                    p.sub_(g, alpha=lr)
        return grads

    trainable = {k: v.requires_grad_(True) for k, v in params.items()}
    gm = make_fx(step, tracing_mode="fake")(trainable, buffers, *example_inputs)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    n_weights = len(params) + len(buffers)
    weights = {n.name for n in placeholders[:n_weights]}
    return _walk(gm, weights=weights, alignment=alignment, fuse=False)


__all__ = ["from_export", "from_fx", "from_training"]
