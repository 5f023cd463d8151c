"""One trace, any batch: the traced ATen graph re-run on fake tensors with its batch re-bound.

A static trace bakes every size into the graph (``view(x, [b·s, d])``), so it cannot be run
at another batch as it is. Traced at a *marker* batch P — a prime larger than every size the
model has of its own (parameter, buffer and non-batch input dims) — every size that comes from
the batch is a multiple of P and no other is (a product of sizes below a prime is never its
multiple). Re-running the graph's ops on fake tensors with each multiple k·P of an argument or
input size replaced by k·b gives every value's shape at batch b, through torch's own meta
kernels, in a tenth of a trace (GPT-2 tiny's joint graph: 0.12 s against 1.5 s).
tests/test_fake_rerun.py checks the re-run graph node for node against a real trace at that
batch for twelve models: the zoo's, and smaller builds of its and transformers' classes
(training and inference) and a stack
traced as three layers.

What a re-run cannot see is Python that takes another path at another batch (a model that
branches on ``x.shape[0]``) or a size the code states that happens to be a multiple of P:
the graph is the one traced at P. ``same_path`` runs the forward at batch 2 and at P first
and refuses a forward whose ATen ops differ between them. A size that is a multiple of P²
(batch²) is refused, and a re-run that fails (an op refusing a re-bound size) makes the
caller trace instead.
"""
from __future__ import annotations

from typing import Any, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

FIRST = 1009  # markers are primes from here up: above every small model's own sizes


def marker_batch(sizes: Iterable[int]) -> int:
    """The smallest prime ≥ FIRST above every size in ``sizes`` (the model's own)."""
    p = max(FIRST, max(sizes, default=0) + 1)
    while not _prime(p):
        p += 1
    return p


def model_sizes(module: torch.nn.Module, inputs: Iterable) -> list[int]:
    """Every dim of the module's parameters and buffers and every non-batch input dim."""
    out = [int(d) for t in (*module.parameters(), *module.buffers()) for d in t.shape]
    for x in inputs:
        if isinstance(x, torch.Tensor):
            out += [int(d) for d in x.shape[1:]]
    return out


def same_path(marked, small, *, train: bool) -> bool:
    """Whether the forward of two resolved models (analyzer/load/resolve.py: the model at the
    marker batch and at a small one) calls the same ATen ops in the same order, run eagerly on
    fake tensors (nothing is allocated) with the flags torch.export's non-strict trace sets
    (``torch.compiler.is_exporting()``), so that a library skips its checks of the data as it
    does in the trace (transformers' padding warning, its mask checks). A forward that loops
    over the batch stops as soon as the marker's run outgrows the small one's; a forward that
    cannot run on fake tensors is not the same path (a size the data decides, a kernel with no
    fake implementation): it is traced at each batch instead."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from .capture import quiet_torch_logs
    from .transformers_tracing import call_defaults, eager_paths, traceable_experts

    def ops(r, limit: int | None) -> list | None:
        log, was = _OpLog(limit), r.module.training
        try:
            with quiet_torch_logs(), traceable_experts(r.module), torch.no_grad(), \
                    _exporting(), eager_paths(), FakeTensorMode(allow_non_fake_inputs=True), \
                    log:
                r.module.train(train)
                r.module(*r.inputs, **call_defaults(r.module, dict(r.kwargs)))
        except Exception:  # (_Outgrown included) not a path a re-run can follow
            return None
        finally:
            r.module.train(was)
        return log.ops
    first = ops(small, None)
    return first is not None and ops(marked, len(first)) == first


def _exporting():
    """torch.export's own context for the flags ``torch.compiler.is_compiling()`` and
    ``is_exporting()`` read (private to torch; without it the forward runs unflagged)."""
    import sys
    from contextlib import nullcontext

    import torch._export.utils as export_utils
    if "transformers" in sys.modules:
        # transformers registers its output classes with torch's pytree when
        # modeling_outputs is first imported, but not while torch says it is compiling: a
        # first import inside this context (a forward reaching transformers lazily) would
        # leave every later torch.export of a transformers model failing in this process
        import transformers.modeling_outputs  # noqa: F401
    return getattr(export_utils, "_compiling_state_context", nullcontext)()


class _OpLog(TorchDispatchMode):
    """The ATen ops a forward calls, in order; raises _Outgrown past ``limit`` of them."""

    def __init__(self, limit: int | None):
        super().__init__()
        self.ops: list = []
        self.limit = limit

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func)
        if self.limit is not None and len(self.ops) > self.limit:
            raise _Outgrown
        return func(*args, **(kwargs or {}))


class _Outgrown(Exception):
    pass


def _prime(n: int) -> bool:
    return n > 1 and all(n % k for k in range(2, int(n ** 0.5) + 1))


def rerun(gm: torch.fx.GraphModule, marker: int, batch: int) -> None:
    """Re-run ``gm`` (traced at batch ``marker``) at ``batch`` on fake tensors: each node's
    ``meta["val"]`` and its size arguments become those at ``batch``, so lowering the graph
    again gives the graph at ``batch``. The first call keeps the traced arguments (every
    re-run starts from them). Raises whatever the ops raise on sizes that do not fit."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.node import map_aggregate, map_arg

    def size(x):
        # bool is an int subclass: flags are not sizes
        if type(x) is not int or not x or x % marker:
            return x
        if x % (marker * marker) == 0:  # b² or the like: not a size on a line in b
            raise ValueError(f"a size ({x:,}) grows faster than the batch")
        return x // marker * batch

    traced = gm.meta.setdefault("graphcost_traced", {})
    env: dict[str, Any] = {}  # what each node computed (map_arg puts them in its args)
    with FakeTensorMode(allow_non_fake_inputs=True):
        for node in gm.graph.nodes:
            if node.op == "output":
                continue
            if node.op == "placeholder":
                val = traced.setdefault(node.name, node.meta.get("val"))
                if isinstance(val, torch.Tensor):
                    val = torch.empty_strided([size(int(d)) for d in val.shape],
                                              [size(int(s)) for s in val.stride()],
                                              dtype=val.dtype, device=val.device)
            elif node.op == "call_function":
                args, kwargs = traced.setdefault(node.name, (node.args, node.kwargs))
                node.args = map_aggregate(args, size)
                node.kwargs = map_aggregate(kwargs, size)
                val = node.target(*map_arg(node.args, lambda n: env[n.name]),
                                  **map_arg(node.kwargs, lambda n: env[n.name]))
            else:
                raise NotImplementedError(f"re-running a {node.op} node")
            env[node.name] = val
            node.meta["val"] = val


def reruns(gm: torch.fx.GraphModule) -> bool:
    """Whether ``gm`` can be re-run: every size in it is a plain int (a size the data decides
    is a symbol, and the trace bounded it: trace each batch instead)."""
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        vals = val if isinstance(val, (list, tuple)) else (val,)
        for v in vals:
            if isinstance(v, torch.SymInt) or (isinstance(v, torch.Tensor) and any(
                    isinstance(d, torch.SymInt) for d in v.shape)):
                return False
    return True
