"""The one registry of per-op rules: everything graphcost knows about an op lives in its Rule.

Each rule is registered once under every name it serves (ONNX op types, ``domain::Type`` for
other domains, ``aten.<op>.<overload>`` for torch), and a second registration of a name raises,
so an op is described in exactly one place (the pattern of torch/utils/flop_counter.py). Unlike
flop_counter, an op without a rule is never silently zero: ``lookup`` returns None and the cost
pass reports the node as unsupported. Every other per-op list in graphcost (in-place ops,
receptive-field roles, ops whose output has its input's shape, normalizations and their saved
statistics, gradient pass-through) is derived from these fields; no pass names an op.

Cost. A rule computes MACs and FLOPs from an ``OpView``; bytes read/written follow from the
rule's declared memory behaviour, so the convention for bytes lives here once:
  reads="inputs"  – every distinct input tensor is read once (weights included), outputs written;
  reads="outputs" – only the selected part is read (Slice, Gather): bytes read = bytes written
                    plus any index inputs;
  reads="none"    – nothing read (Constant, Shape reads metadata only), outputs written;
  alias=True      – a view: the output shares the input's storage, nothing moves (0 / 0).
``routing`` marks the ops a mixture-of-experts layer is found by (passes/graph/moe.py): "experts" — a
grouped matmul whose input 1 holds one weight matrix per expert (E, K, N) and whose rows each meet
one of them; "top_k" — a selection of the k largest of each row (a router's choice of experts).
``bound`` (a sentence) marks ops whose output size depends on the data (NonZero, NonMaxSuppression,
Unique, TopK with a tensor k): where ONNX shape inference leaves such an output's size symbolic,
``bound_shapes`` gives the largest size the inputs allow, the node is costed there and every
format says so (the sentence travels with the node: ``Node.bound``). ``writes="inputs"`` counts
the bytes of the tensor inputs as written (ops whose output is a sequence handle holding copies
of them: SequenceConstruct, SplitToSequence).

``bodies=True``: the node's graph attributes are bodies that run (If/Loop/Scan, SequenceMap,
FlexAttention's score_mod / prob_mod): the ONNX frontend lowers them as nodes of their own
before the op, repeated as often as they run; the op itself is then costed by its rule.

``input_attrs`` names constant inputs a rule reads like attributes (DFT's axis became an input
in opset 20): the frontend copies a constant input's value (an int, or a tuple of ints) into the
node's attributes under that name.

Shapes the ONNX schemas do not give (other domains: com.microsoft): ``shapes(ShapeView)`` returns
each output's (dtype, shape); the ONNX frontend runs it inside ONNX's own inference, so shapes
downstream of the op resolve in the same pass (analyzer/frontends/onnx/shapes.py).

Inputs by role: ``buffer_inputs`` hold non-trainable state (BatchNorm's running statistics),
``config_inputs`` are settings rather than weights (Clip bounds, Pad values), ``index_inputs``
are read in full by a selection (Gather's indices), ``meta_inputs`` are quantization metadata
(scales and zero points: counted apart from the parameters); ``meta_outputs`` are outputs that
are such metadata (DynamicQuantizeLinear's scale and zero point: a weight combined with one, as
the per-tensor weight scale of a dynamically quantized MatMul, is metadata too).
``packed_inputs`` maps an input position to ``fn(spec, attrs) -> (elements, dtype)`` for
weights stored packed in another type (MatMulNBits' uint8 blocks hold N·K 4-bit values): params
count the logical elements, param bytes the stored ones.

Backward (read by the ONNX training estimate, passes/training/backward_estimate.py; the FX path traces
the real backward and ignores it). ``saves`` — what the backward keeps from the forward:
  "nothing"   – the gradient needs no forward tensor (Add, Sub, views, AveragePool);
  "inputs"    – every activation input (Div, Pow, GELU, Erf);
  "operands"  – products (Conv, Gemm, MatMul, Mul, Div): of the first two inputs, each is kept
                only when the other needs a gradient (dW needs x; dx needs W, a persistent
                weight; x/y keeps y for dx, x for dy); a bias (input 2) is never kept;
  "outputs"   – the output (ReLU, Sigmoid, Tanh, Exp, Softmax: the derivative is f(y));
  "stat"      – input 0 plus the per-row / per-channel mean and 1/σ (the normalizations), whose
                size ``stat(shape, attrs) -> (rows, groups)`` gives (float32);
  "indices"   – input 0 plus an int64 argmax per output element (MaxPool, as PyTorch's
                max_pool2d_with_indices writes);
  "mask"      – a 1-byte keep-mask per element (training Dropout; exports run it as identity);
  a tuple of input positions – exactly those inputs (Where keeps its condition).
None: not declared; the estimate then keeps every input and says how many ops it assumed.
``grad_view`` — "always" when the backward hands the incoming gradient on unchanged (a
transpose's or a concat's, as a view), "same_shape" when it does so to the inputs of the
output's shape (Add; ``grad_view_inputs`` limits the positions: Sub's second operand is
negated). ``train_attrs`` — attributes the op takes when a training step runs it (BatchNorm's
``training_mode``).

Memory. ``inplace`` — the op may write its output into input 0's storage when input 0 dies
there (the in-place activations what-if). ``same_shape`` — output 0 has input 0's shape and
dtype (the frontend's fallback where ONNX inference has no rule for the op at the model's
opset). On a CUDA GPU (passes/device/gpu_workspaces.py): ``cublas`` — the op is a cuBLAS GEMM, so
the first one a thread runs allocates that thread's cuBLAS workspace, kept; ``workspace`` —
``fn(op, device) -> (bytes, ...)``: what the op's CUDA kernel allocates through the caching
allocator after its outputs and frees before it returns, one size per allocation (a
reduction's staging buffer and semaphores, a broadcast GEMM operand's copy, cuDNN's
attention backward and convolution workspaces; the function says where its figure comes
from and whether it is an estimate); ``workspace_in_training`` False leaves it out of a
training step's replay (cuDNN's convolution workspaces: a training step measured to reserve
less with them than without).

Receptive fields (passes/graph/receptive_field.py): ``rf`` is the op's role — "conv",
"conv_transpose", "pool", "adaptive_pool" (windows), "pointwise" (passes a field through, joins
several), "reshape" (passes it when the shape is unchanged), "softmax" (over channels),
"concat", "constant_pad"; None ends the chain. ``attr_names`` maps a canonical attribute name
to its spellings in both vocabularies (ONNX ``kernel_shape`` / aten ``kernel_size``):
``rule_attr`` and ``OpView.attr`` read whichever the node has.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence

from ..ir import Dim, Graph, Node, TensorSpec

if TYPE_CHECKING:
    from ..device_rates import DeviceRates


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
    """What a rule sees of a node: input/output specs and attributes. The one thing a rule may
    set is ``bound``: a rule whose count is an upper bound whatever the shapes (every pair of
    boxes in NonMaxSuppression, the longest path of every tree) says so with ``bounded``."""
    __slots__ = ("node", "_graph", "_rule", "bound")

    def __init__(self, node: Node, graph: Graph, rule_: "Rule | None" = None):
        self.node = node
        self._graph = graph
        self._rule = rule_ if rule_ is not None else lookup(node.op)
        self.bound = ""

    def bounded(self, why: str) -> None:
        """Mark this node's count as an upper bound, with what it assumes."""
        self.bound = f"upper bound: {why}"

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
        """An attribute by its canonical name, in whichever vocabulary the node uses."""
        if self._rule is not None:
            return self._rule.attr(self.node.attrs, name, default)
        return self.node.attrs.get(name, default)

    def present_inputs(self) -> list[int]:
        return [i for i in range(len(self.node.inputs)) if self.node.inputs[i] != ""]

    def broadcast(self, i: int) -> bool:
        """Whether input ``i`` is a view of an ``expand`` that grew its input (stride 0 where
        it was expanded: a sum's gradient, one scalar spread over its input's shape)."""
        name, graph = self.node.inputs[i] if self.has_input(i) else "", self._graph
        while (v := graph.values.get(name)) is not None and v.producer is not None:
            node = graph.nodes[v.producer]
            if node.op == "aten.expand.default":
                src = graph.spec(node.inputs[0])
                return src is not None and (src.numel or 0) < (v.spec.numel or 0)
            r = lookup(node.op)
            if r is None or not r.alias or not node.inputs:
                return False
            name = node.inputs[0]
        return False


class ShapeView(Protocol):
    """What a shape function sees of a node while ONNX infers shapes (the frontend implements
    it): input dtypes (graphcost names) and shapes (ints, symbols, None for an unknown dim; the
    shape None when even the rank is unknown), attributes, and the values of constant inputs."""
    n_inputs: int

    def has_input(self, i: int) -> bool: ...
    def dtype(self, i: int) -> str | None: ...
    def shape(self, i: int) -> tuple[Dim | None, ...] | None: ...
    def attr(self, name: str, default: Any = None) -> Any: ...
    def const(self, i: int) -> Any: ...  # numpy array, or None when not a constant


OutType = tuple[str | None, "tuple[Dim | None, ...] | None"] | None  # (dtype, shape) per output
ShapeFn = Callable[[ShapeView], Sequence[OutType]]
PackedFn = Callable[[TensorSpec, Mapping[str, Any]], tuple[int, str]]  # -> (elements, dtype)
RuleFn = Callable[[OpView], tuple[int, int]]  # -> (macs, flops)
StatFn = Callable[[tuple[int, ...], Mapping[str, Any]], tuple[int, int]]  # -> (rows, groups)
WorkspaceFn = Callable[[OpView, "DeviceRates"], tuple[int, ...]]  # -> bytes per allocation
_NO_ATTRS: Mapping[Any, Any] = MappingProxyType({})

RF_ROLES = frozenset({"conv", "conv_transpose", "pool", "adaptive_pool", "pointwise", "reshape",
                      "softmax", "concat", "constant_pad"})
WINDOWS = frozenset({"conv", "conv_transpose", "pool", "adaptive_pool"})
KERNEL_CLASSES = frozenset({None, "conv", "grouped_conv", "attention", "pool",  # Rule.kernel
                            "random", "batch_norm"})
# The attribute spellings of windowed ops and of axis arguments in ONNX and in aten.
WINDOW_ATTRS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "kernel": ("kernel_shape", "kernel_size"), "strides": ("strides", "stride"),
    "pads": ("pads", "padding"), "dilations": ("dilations", "dilation"),
    "auto_pad": ("auto_pad",), "ceil_mode": ("ceil_mode",), "group": ("group", "groups"),
    "output_padding": ("output_padding",), "transposed": ("transposed",)})
AXIS_ATTRS: Mapping[str, tuple[str, ...]] = MappingProxyType({"axis": ("axis", "dim")})


@dataclass(frozen=True, slots=True, eq=False)  # one object per op: identity is equality
class Rule:
    """Everything graphcost knows about an op (the module docstring explains each field)."""
    names: tuple[str, ...]
    fn: RuleFn
    reads: str = "inputs"           # "inputs" | "outputs" | "none"
    alias: bool = False             # output is a view of input 0
    zero_reason: str | None = None  # set for ops declared to do no arithmetic
    buffer_inputs: tuple[int, ...] = ()  # input positions that hold non-trainable state
    config_inputs: tuple[int, ...] = ()  # inputs that are settings, not weights (Clip bounds)
    index_inputs: tuple[int, ...] = ()   # with reads="outputs": inputs read in full (indices)
    meta_inputs: tuple[int, ...] = ()    # quantization scales / zero points
    meta_outputs: tuple[int, ...] = ()   # outputs that are scales / zero points
    packed_inputs: Mapping[int, PackedFn] = field(default_factory=lambda: _NO_ATTRS)
    family: str = ""
    saves: str | tuple[int, ...] | None = None  # what the backward keeps
    stat: StatFn | None = None           # saves="stat": (rows, groups) of the saved statistic
    grad_view: str | None = None         # "always" | "same_shape": gradient passed on as a view
    grad_view_inputs: tuple[int, ...] | None = None  # positions it reaches (None: all)
    train_attrs: Mapping[str, Any] = field(default_factory=lambda: _NO_ATTRS)  # in training
    inplace: bool = False                # may write into input 0 when input 0 dies here
    same_shape: bool = False             # output 0 has input 0's shape and dtype
    rf: str | None = None                # receptive-field role (None ends the chain)
    attr_names: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: _NO_ATTRS)
    bound: str | None = None             # data-dependent output size: what the bound assumes
    bound_shapes: ShapeFn | None = None  # the largest output shapes the inputs allow
    shapes: ShapeFn | None = None        # output types where ONNX's schemas give none
    writes: str = "outputs"              # "outputs" | "inputs" (a sequence holding copies)
    input_attrs: Mapping[int, str] = field(default_factory=lambda: _NO_ATTRS)  # const inputs
    routing: str | None = None           # mixture of experts: "experts" | "top_k" (see above)
    bodies: bool = False                 # graph attributes are bodies that run (see above)
    # PyTorch picks the op's kernel at run time (SDPA: passes/graph/attention_dispatch.py names it)
    dispatched: bool = False
    cublas: bool = False                 # a cuBLAS GEMM on a CUDA GPU
    workspace: "WorkspaceFn | None" = None  # what its CUDA kernel allocates around a call
    workspace_in_training: bool = True   # False: read off inference runs only (see above)
    # the output a CPU eager run keeps in input 0's dtype (dropout's noise, where the traced
    # op writes a byte mask: passes/graph/cpu_dropout.py)
    cpu_noise: int | None = None
    # the kernel class the time estimate prices the op's arithmetic by (passes/device/
    # time_estimate.py): "conv", "grouped_conv", "attention", "pool", "random" or
    # "batch_norm" (a training step's, with its statistics), each measured by
    # ``graphcost calibrate``, or ``fn(op) -> class`` where the node's attributes decide;
    # None: a GEMM when the op multiplies-accumulates, else memory-bound
    kernel: "str | Callable[[OpView], str] | None" = None

    def __post_init__(self) -> None:
        if self.rf is not None and self.rf not in RF_ROLES:
            raise ValueError(f"rule {self.names[0]}: unknown receptive-field role {self.rf!r}")
        if self.routing not in (None, "experts", "top_k"):
            raise ValueError(f"rule {self.names[0]}: unknown routing role {self.routing!r}")
        if self.grad_view not in (None, "always", "same_shape"):
            raise ValueError(f"rule {self.names[0]}: unknown grad_view {self.grad_view!r}")
        if self.bound_shapes is not None and not self.bound:
            raise ValueError(f"rule {self.names[0]}: bound_shapes needs the bound sentence")
        if self.writes not in ("outputs", "inputs"):
            raise ValueError(f"rule {self.names[0]}: unknown writes {self.writes!r}")
        if not callable(self.kernel) and self.kernel not in KERNEL_CLASSES:
            raise ValueError(f"rule {self.names[0]}: unknown kernel class {self.kernel!r}")
        if self.saves == "stat" and self.stat is None:
            raise ValueError(f"rule {self.names[0]}: saves='stat' needs stat=(rows, groups)")

    def attr(self, attrs: Mapping[str, Any], name: str, default: Any = None) -> Any:
        """The attribute ``name`` (canonical) under whichever spelling ``attrs`` uses."""
        for spelling in self.attr_names.get(name, (name,)):
            if spelling in attrs:
                return attrs[spelling]
        return default


_REGISTRY: dict[str, Rule] = {}


def _add(rule: Rule) -> Rule:
    for name in rule.names:  # all-or-nothing: check every name before registering any
        if name in _REGISTRY:
            raise ValueError(f"cost rule for {name!r} registered twice "
                             f"({_REGISTRY[name].family} and {rule.family})")
    for name in rule.names:
        _REGISTRY[name] = rule
    return rule


def rule(*names: str, **fields: Any) -> Callable[[RuleFn], RuleFn]:
    """Register ``fn`` as the rule of every op in ``names``; ``fields`` are Rule's (reads,
    saves, inplace, rf, attr_names, …). The family is the defining module's name."""
    def deco(fn: RuleFn) -> RuleFn:
        fields.setdefault("family", fn.__module__.rsplit(".", 1)[-1])
        _add(Rule(tuple(names), fn, **fields))
        return fn
    return deco


def _no_arithmetic(_: OpView) -> tuple[int, int]:
    return 0, 0


def zero_cost(*names: str, reason: str, family: str = "zero", saves: Any = "nothing",
              **fields: Any) -> None:
    """Declare ops that do no arithmetic, with the reason; they still move bytes unless alias.
    Their backward keeps nothing unless ``saves`` says otherwise (a gather keeps indices)."""
    _add(Rule(tuple(names), _no_arithmetic, zero_reason=reason, family=family, saves=saves,
              **fields))


def rule_attr(node: Node, name: str, default: Any = None) -> Any:
    """``node``'s attribute ``name`` (canonical) through its rule's spellings."""
    r = lookup(node.op)
    return r.attr(node.attrs, name, default) if r is not None else node.attrs.get(name, default)


def unreachable(removed: set[str]) -> list[str]:
    """The registered aten names that the decompositions graphcost runs remove (``removed``):
    such an op never reaches the registry on that torch, and is costed through what it
    decomposes into. Which ops a torch release decomposes changes between releases, so this is
    a test-time report per version (tests/test_torch_versions.py), never a run-time failure."""
    return sorted(n for n in _REGISTRY if n in removed)


def kernel_class(rule_: Rule, view: OpView, macs: int) -> str | None:
    """The kernel class a node of ``rule_`` is priced as: its rule's, else a GEMM when it
    multiplies and accumulates, else None (memory-bound work)."""
    kernel = rule_.kernel(view) if callable(rule_.kernel) else rule_.kernel
    return kernel or ("gemm" if macs else None)


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
    if rule_.writes == "inputs":
        written = _distinct_bytes(node.inputs, values)
    else:
        written = 0
        for name in node.outputs:
            if name:
                b = values[name].spec.nbytes
                if b is None:
                    raise ShapeUnknown(name)
                written += b
    if rule_.reads == "inputs":
        read = _distinct_bytes(node.inputs, values)
    elif rule_.reads == "outputs":
        read = written + sum(view.in_spec(i).nbytes for i in rule_.index_inputs  # type: ignore[misc]
                             if view.has_input(i))
    else:
        read = 0
    return Cost(macs, flops, read, written)


def _distinct_bytes(names: tuple[str, ...], values) -> int:
    """Each distinct input once, in one pass (a Sum of one input repeated 1M times is a 3 MB
    file: a scan of the names before each one was quadratic)."""
    total = 0
    for name in dict.fromkeys(names):
        if name:
            v = values.get(name)
            b = v.spec.nbytes if v is not None else None
            if b is None:
                raise ShapeUnknown(name)
            total += b
    return total
