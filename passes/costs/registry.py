"""The one registry of per-op cost rules.

Each rule is registered once under every name it serves (ONNX op types, and later aten ops),
and a second registration of a name raises, so an op's cost is defined in exactly one place
(the pattern of torch/utils/flop_counter.py). Unlike flop_counter, an op without a rule is
never silently zero: ``lookup`` returns None and the cost pass reports the node as unsupported.

A rule computes MACs and FLOPs from an ``OpView``; bytes read/written follow from the rule's
declared memory behaviour, so the convention for bytes lives here once:
  reads="inputs"  – every distinct input tensor is read once (weights included), outputs written;
  reads="outputs" – only the selected part is read (Slice, Gather): bytes read = bytes written
                    plus any index inputs;
  reads="none"    – nothing read (Constant, Shape reads metadata only), outputs written;
  alias=True      – a view: the output shares the input's storage, nothing moves (0 / 0).

A rule may also declare what its op's backward keeps from the forward (``saves``), which the
ONNX training estimate (passes/backward_estimate.py) reads; the FX path traces the real
backward and ignores it:
  "nothing"   – the gradient needs no forward tensor (Add, Sub, views, AveragePool);
  "inputs"    – every activation input (Div, Pow, GELU, Erf);
  "operands"  – products (Conv, Gemm, MatMul, Mul, Div): of the first two inputs, each is kept
                only when the other needs a gradient (dW needs x; dx needs W, a persistent
                weight; x/y keeps y for dx, x for dy); a bias (input 2) is never kept;
  "outputs"   – the output (ReLU, Sigmoid, Tanh, Exp, Softmax: the derivative is f(y));
  "stat"      – input 0 plus the per-row / per-channel mean and 1/σ (the normalizations);
  "indices"   – input 0 plus an int64 argmax per output element (MaxPool, as PyTorch's
                max_pool2d_with_indices writes);
  "mask"      – a 1-byte keep-mask per element (training Dropout; exports run it as identity);
  a tuple of input positions – exactly those inputs (Where keeps its condition).
None: not declared; the estimate then keeps every input and says how many ops it assumed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from graphcost.analyzer.ir import Graph, Node, TensorSpec


class ShapeUnknown(Exception):
    """A rule needed a shape that no binding made concrete."""


@dataclass(frozen=True, slots=True)
class Cost:
    macs: int = 0
    flops: int = 0
    bytes_read: int = 0
    bytes_written: int = 0

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(self.macs + other.macs, self.flops + other.flops,
                    self.bytes_read + other.bytes_read, self.bytes_written + other.bytes_written)

    def scaled(self, k: int) -> "Cost":
        return Cost(self.macs * k, self.flops * k, self.bytes_read * k, self.bytes_written * k)


ZERO = Cost()


class OpView:
    """What a rule sees of a node: input/output specs and attributes, nothing mutable."""
    __slots__ = ("node", "_graph")

    def __init__(self, node: Node, graph: Graph):
        self.node = node
        self._graph = graph

    @property
    def n_inputs(self) -> int:
        return len(self.node.inputs)

    def has_input(self, i: int) -> bool:
        return i < len(self.node.inputs) and self.node.inputs[i] != ""

    def in_spec(self, i: int) -> TensorSpec:
        if not self.has_input(i):
            raise ShapeUnknown(f"input {i} absent")
        s = self._graph.spec(self.node.inputs[i])
        if s is None or not s.known:
            raise ShapeUnknown(self.node.inputs[i])
        return s

    def out_spec(self, i: int = 0) -> TensorSpec:
        s = self._graph.spec(self.node.outputs[i]) if i < len(self.node.outputs) else None
        if s is None or not s.known:
            raise ShapeUnknown(self.node.outputs[i] if i < len(self.node.outputs) else f"output {i}")
        return s

    def in_shape(self, i: int) -> tuple[int, ...]:
        return self.in_spec(i).shape  # type: ignore[return-value]

    def out_shape(self, i: int = 0) -> tuple[int, ...]:
        return self.out_spec(i).shape  # type: ignore[return-value]

    def in_numel(self, i: int) -> int:
        return self.in_spec(i).numel  # type: ignore[return-value]

    def out_numel(self, i: int = 0) -> int:
        return self.out_spec(i).numel  # type: ignore[return-value]

    @property
    def graph(self) -> Graph:
        return self._graph

    def attr(self, name: str, default: Any = None) -> Any:
        return self.node.attrs.get(name, default)

    def present_inputs(self) -> list[int]:
        return [i for i in range(len(self.node.inputs)) if self.node.inputs[i] != ""]


RuleFn = Callable[[OpView], tuple[int, int]]  # -> (macs, flops)


@dataclass(frozen=True, slots=True)
class Rule:
    names: tuple[str, ...]
    fn: RuleFn
    reads: str = "inputs"           # "inputs" | "outputs" | "none"
    alias: bool = False             # output is a view of input 0
    zero_reason: str | None = None  # set for ops declared to do no arithmetic
    buffer_inputs: tuple[int, ...] = ()  # input positions that hold non-trainable state
    config_inputs: tuple[int, ...] = ()  # inputs that are settings, not weights (Clip bounds)
    index_inputs: tuple[int, ...] = ()   # with reads="outputs": inputs read in full (indices)
    family: str = ""
    saves: str | tuple[int, ...] | None = None  # what the backward keeps (module docstring)


_REGISTRY: dict[str, Rule] = {}


def _add(rule: Rule) -> Rule:
    for name in rule.names:  # all-or-nothing: check every name before registering any
        if name in _REGISTRY:
            raise ValueError(f"cost rule for {name!r} registered twice "
                             f"({_REGISTRY[name].family} and {rule.family})")
    for name in rule.names:
        _REGISTRY[name] = rule
    return rule


def rule(*names: str, reads: str = "inputs", buffer_inputs: tuple[int, ...] = (),
         index_inputs: tuple[int, ...] = (), config_inputs: tuple[int, ...] = (),
         saves: str | tuple[int, ...] | None = None) -> Callable[[RuleFn], RuleFn]:
    """Register ``fn`` as the rule of every op in ``names``."""
    def deco(fn: RuleFn) -> RuleFn:
        _add(Rule(tuple(names), fn, reads=reads, buffer_inputs=buffer_inputs,
                  index_inputs=index_inputs, config_inputs=config_inputs,
                  family=fn.__module__.rsplit(".", 1)[-1], saves=saves))
        return fn
    return deco


def _no_arithmetic(_: OpView) -> tuple[int, int]:
    return 0, 0


def zero_cost(*names: str, reason: str, reads: str = "inputs", alias: bool = False,
              index_inputs: tuple[int, ...] = (), config_inputs: tuple[int, ...] = (),
              family: str = "", saves: str | tuple[int, ...] | None = "nothing") -> None:
    """Declare ops that do no arithmetic, with the reason; they still move bytes unless alias.
    Their backward keeps nothing unless ``saves`` says otherwise (a gather keeps indices)."""
    _add(Rule(tuple(names), _no_arithmetic, reads=reads, alias=alias, zero_reason=reason,
              index_inputs=index_inputs, config_inputs=config_inputs, family=family or "zero",
              saves=saves))


def lookup(op: str) -> Rule | None:
    return _REGISTRY.get(op)


def registered() -> Mapping[str, Rule]:
    return dict(_REGISTRY)


def node_cost(rule_: Rule, view: OpView) -> Cost:
    """MACs/FLOPs from the rule, bytes from its declared memory behaviour. Raises ShapeUnknown."""
    macs, flops = rule_.fn(view)
    if rule_.alias:
        return Cost(macs, flops, 0, 0)
    node = view.node
    values = view._graph.values
    written = 0
    for name in node.outputs:
        if name:
            b = values[name].spec.nbytes
            if b is None:
                raise ShapeUnknown(name)
            written += b
    if rule_.reads == "inputs":
        read = 0
        names = node.inputs
        for k, name in enumerate(names):
            if name and name not in names[:k]:  # each distinct input once
                v = values.get(name)
                b = v.spec.nbytes if v is not None else None
                if b is None:
                    raise ShapeUnknown(name)
                read += b
    elif rule_.reads == "outputs":
        read = written + sum(view.in_spec(i).nbytes for i in rule_.index_inputs  # type: ignore[misc]
                             if view.has_input(i))
    else:
        read = 0
    return Cost(macs, flops, read, written)
