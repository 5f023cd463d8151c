"""The training-step ESTIMATE of an inference-only graph (an ONNX export): a synthesized backward.

An ONNX file holds the forward only. ``estimate_joint(graph)`` returns a new joint graph in the
conventions of the traced FX one (``analyzer.frontends.torch.frontend.lower_joint``), so the
training passes (``passes/training/step.py``: memory, checkpoint plans, what-ifs) run on it
unchanged:

* the forward nodes as they are — except that BatchNormalization runs in training mode (batch
  statistics) and the ops whose backward keeps a statistic or indices write it as an extra
  output (BatchNorm / LayerNorm mean and 1/σ, MaxPool's int64 argmax);
* the loss: the sum of every floating graph output (as torch_capture's ``_SumLoss``), which is
  ``outputs[0]``; every node up to it is the forward;
* the backward, the forward in reverse: for each forward node with an output that has a
  gradient and an input that needs one, one node reading the output gradients and the tensors
  its cost rule declares it keeps (``Rule.saves``, passes/costs/registry.py) and writing the
  gradients of its inputs. A gradient that only passes through (a view's, a transpose's, an
  add's or a concat's) is a view of the incoming one, as in autograd. A tensor read by several
  nodes gets one gradient per consumer, added out of place into the running sum (what the
  functionalized FX joint graph does); a parameter's final gradient is a graph output, so it
  lives from its first contribution to the optimizer step.

What needs a gradient: the trainable parameters (``passes.graph.params``: not BatchNorm's running
statistics, not settings such as Clip bounds) and every floating tensor computed from one at a
differentiable position (no buffers, settings, indices or integer inputs).

It is an estimate — no autograd runs, and dtype casts, in-place ops and the exporter's
rewrites (fused or split ops, constant folding) differ from the eager model — and is labelled
so in ``Graph.warnings``. An op without a ``saves`` declaration keeps every input (an upper
bound) and is counted in a warning. Measured against the exact FX figures:
``python -m benchmarks.accuracy_onnx_training``.
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Any, Mapping

from ..costs.backward import (
    BACKWARD_OP,
    GRAD_SEED_OP,
    GRAD_VIEW_OP,
    LOSS_ADD_OP,
    LOSS_REDUCE_OP,
)
from ..costs.registry import lookup
from ..graph.params import count_params
from ..ir import FLOAT_DTYPES, Graph, Node, TensorSpec, Value, ValueKind

ESTIMATE_WARNING = ("training memory of an ONNX graph is an ESTIMATE: the backward is "
                    "synthesized from per-op save rules, not traced (see README, 'ONNX training "
                    "estimate')")
_EMPTY = MappingProxyType({})


def estimate_joint(graph: Graph) -> Graph:
    """A new joint forward+backward Graph estimated from the forward ``graph`` (not mutated)."""
    return _Builder(graph).build()


class _Builder:
    def __init__(self, graph: Graph):
        self.src = graph
        self.values: dict[str, Value] = dict(graph.values)
        self.nodes: list[Node] = []
        self.grad: dict[str, str] = {}          # value -> its (running) gradient value
        self.undeclared: dict[str, int] = {}    # op -> nodes whose backward kept every input
        self.dropouts = 0
        self.node_names = {n.name for n in graph.nodes}

    # -- helpers ---------------------------------------------------------------------------
    def fresh(self, base: str) -> str:
        name, k = base, 1
        while name in self.values:
            k += 1
            name = f"{base}#{k}"
        return name

    def new_value(self, base: str, spec: TensorSpec) -> str:
        name = self.fresh(base)
        self.values[name] = Value(name, spec, ValueKind.ACTIVATION, len(self.nodes))
        return name

    def add_node(self, name: str, op: str, inputs, outputs, attrs: Mapping[str, Any] = _EMPTY,
                 scope: str = "", repeat: int = 1) -> None:
        base, k = name, 1
        while name in self.node_names:  # node names stay unique, as the frontend's
            k += 1
            name = f"{base}#{k}"
        self.node_names.add(name)
        self.nodes.append(Node(len(self.nodes), name, op, tuple(inputs), tuple(outputs),
                               MappingProxyType(dict(attrs)) if attrs else _EMPTY, scope,
                               repeat))

    def is_float(self, name: str) -> bool:
        v = self.values.get(name) if name else None
        return v is not None and v.spec.dtype in FLOAT_DTYPES

    # -- the three parts -------------------------------------------------------------------
    def build(self) -> Graph:
        src = self.src
        trainable = set(count_params(src).names)
        self.rekind(trainable)
        needs = self.requires_grad(trainable)
        # the nodes that get a backward: reached from the loss through tensors needing a grad
        reached = {o for o in src.outputs if o in needs}
        has_backward = set()
        for node in reversed(src.nodes):
            if any(o in reached for o in node.outputs):
                ins = [name for _, name in self.differentiable(node) if name in needs]
                if ins:
                    has_backward.add(node.index)
                    reached.update(ins)
        saved: dict[int, tuple[str, ...]] = {}
        for node in src.nodes:
            saved[node.index] = self.forward_node(node, node.index in has_backward, needs)
        loss, summed = self.loss(needs)
        self.seed(summed)
        for node in reversed(src.nodes):
            self.backward_node(self.nodes[node.index], needs, saved[node.index])
        grad_of = {p: self.grad[p] for p in src.values if p in trainable and p in self.grad}
        grads = tuple(grad_of.values())
        warnings = list(src.warnings) + [ESTIMATE_WARNING]
        if self.undeclared:
            ops = ", ".join(f"{op} ×{n}" for op, n in sorted(self.undeclared.items()))
            warnings.append(f"training estimate: {sum(self.undeclared.values())} node(s) of ops "
                            f"with no declared backward save rule keep every input (an upper "
                            f"bound): {ops}")
        if self.dropouts:
            warnings.append(f"training estimate: {self.dropouts} Dropout node(s) run as the "
                            "inference identity they are in this export; a training dropout "
                            "would also keep a 1-byte mask per element")
        rules = [r for r in map(lookup, {n.op for n in src.nodes}) if r is not None]
        if any(r.rf == "conv" for r in rules) and not any(r.saves == "stat" for r in rules):
            warnings.append("training estimate: convolutions and no BatchNormalization: if the "
                            "exporter folded BatchNorm into the convolutions (inference "
                            "exports do), the training step, which runs it, keeps more than "
                            "estimated (zoo resnet18: -12%, mobilenet_v2: -30%)")
        if any(r.family == "control" for r in rules):
            warnings.append("training estimate: control-flow bodies are differentiated as "
                            "straight-line code (one backward per body node)")
        if not grads:
            warnings.append("training estimate: no graph output depends on a trainable weight "
                            "(float initializer): there is no backward")
        return Graph(name=src.name, source=src.source, nodes=tuple(self.nodes),
                     values=MappingProxyType(self.values), inputs=src.inputs,
                     outputs=(loss, *grads), dims=src.dims, batch=src.batch,
                     module_types=src.module_types, warnings=tuple(warnings),
                     grads=MappingProxyType(grad_of))

    def rekind(self, trainable: set[str]) -> None:
        """An ONNX initializer is PARAM until passes.graph.params classifies it; the training pass
        counts PARAM values as weights with gradients and optimizer state, so BatchNorm's
        running statistics become BUFFER and settings CONST here, as they are in torch."""
        buffers = set()
        for node in self.src.nodes:
            r = lookup(node.op)
            for pos in (r.buffer_inputs if r else ()):
                if pos < len(node.inputs):
                    buffers.add(node.inputs[pos])
        for name, v in self.src.values.items():
            if v.kind == ValueKind.PARAM and name not in trainable:
                kind = ValueKind.BUFFER if name in buffers else ValueKind.CONST
                self.values[name] = Value(name, v.spec, kind, v.producer)

    def requires_grad(self, trainable: set[str]) -> set[str]:
        needs = set(trainable)
        for node in self.src.nodes:
            if any(name in needs for _, name in self.differentiable(node)):
                needs.update(o for o in node.outputs if self.is_float(o))
        return needs

    def differentiable(self, node: Node):
        """(position, value) of the floating inputs a gradient can flow into."""
        r = lookup(node.op)
        skip = set(r.buffer_inputs) | set(r.config_inputs) | set(r.index_inputs) if r else set()
        for pos, name in enumerate(node.inputs):
            if name and pos not in skip and self.is_float(name):
                yield pos, name

    def forward_node(self, node: Node, has_backward: bool, needs: set[str]) -> tuple[str, ...]:
        """Append the forward node (with training-mode changes); return what its backward
        keeps (empty when it gets no backward)."""
        r = lookup(node.op)
        if not has_backward:
            self.nodes.append(node)
            return ()
        saves = r.saves if r is not None else None
        if saves is None:
            self.undeclared[node.op] = self.undeclared.get(node.op, 0) + 1
            saves = "inputs"
        attrs, outputs = node.attrs, list(node.outputs)
        kept: list[str] = []
        if saves in ("inputs", "stat", "indices"):
            kept = [n for n in node.inputs if n and self.values[n].kind != ValueKind.CONST]
            if saves != "inputs":
                kept = kept[:1]
        elif saves == "operands":
            ins = node.inputs
            for i, j in ((0, 1), (1, 0)):
                if j < len(ins) and i < len(ins) and ins[i] and ins[j] in needs:
                    kept.append(ins[i])
        elif saves == "outputs":
            kept = [o for o in node.outputs if o]
        elif saves == "mask":
            if len(outputs) > 1 and outputs[1]:
                kept = [outputs[1]]
            else:
                self.dropouts += 1
        elif isinstance(saves, tuple):
            kept = [node.inputs[i] for i in saves if i < len(node.inputs) and node.inputs[i]]
        if saves == "stat":
            assert r is not None  # "stat" is what a rule declares
            if r.train_attrs:
                attrs = MappingProxyType({**node.attrs, **r.train_attrs})
            spec = self.stat_spec(node, r)
            name = self.fresh(f"{node.name}::saved_stat")
            self.values[name] = Value(name, spec, ValueKind.ACTIVATION, node.index)
            outputs.append(name)
            kept.append(name)
        elif saves == "indices":
            if len(outputs) > 1 and outputs[1]:
                kept.append(outputs[1])
            else:
                out = self.values[outputs[0]].spec
                name = self.fresh(f"{node.name}::argmax")
                self.values[name] = Value(name, TensorSpec(out.shape, "int64"),
                                          ValueKind.ACTIVATION, node.index)
                outputs.append(name)
                kept.append(name)
        if attrs is not node.attrs or len(outputs) != len(node.outputs):
            node = Node(node.index, node.name, node.op, node.inputs, tuple(outputs), attrs,
                        node.scope, node.repeat)
        self.nodes.append(node)
        return tuple(dict.fromkeys(kept))

    def stat_spec(self, node: Node, r) -> TensorSpec:
        """The statistic a normalization's backward keeps (its rule's ``stat``: mean and 1/σ
        per normalized group, 1/rms for RMSNorm), float32."""
        x = self.values[node.inputs[0]].spec
        shape = x.shape
        if shape is None or not x.known or len(shape) < 2:
            return TensorSpec(None, "float32")
        return TensorSpec(r.stat(shape, node.attrs), "float32")

    def loss(self, needs: set[str]) -> tuple[str, list[str]]:
        """outputs[0] = the sum of every floating output (torch_capture._SumLoss)."""
        summed = [o for o in self.src.outputs if self.is_float(o)]
        scalar = TensorSpec((), "float32")
        parts = []
        for k, out in enumerate(summed):
            name = self.new_value(f"graphcost.loss.{k}" if len(summed) > 1 else
                                  "graphcost.loss", scalar)
            self.add_node(f"graphcost/loss/ReduceSum_{k}", LOSS_REDUCE_OP, (out,), (name,),
                          {"keepdims": 0, "noop_with_empty_axes": 0})
            parts.append(name)
        total = parts[0] if parts else self.new_value("graphcost.loss", scalar)
        if not parts:
            self.add_node("graphcost/loss/empty", GRAD_SEED_OP, (), (total,))
        for k, part in enumerate(parts[1:], 1):
            acc = self.new_value("graphcost.loss", scalar)
            self.add_node(f"graphcost/loss/Add_{k}", LOSS_ADD_OP, (total, part), (acc,))
            total = acc
        return total, [o for o in summed if o in needs]

    def seed(self, summed: list[str]) -> None:
        """d loss / d output: a scalar 1 broadcast (a view, as autograd's expand)."""
        if not summed:
            return
        one = self.new_value("graphcost.loss.grad", TensorSpec((), "float32"))
        self.add_node("graphcost/backward/seed", GRAD_SEED_OP, (), (one,))
        grads = [self.new_value(f"{o}.grad", self.values[o].spec) for o in summed]
        self.add_node("graphcost/backward/seed_broadcast", GRAD_VIEW_OP, (one,), grads)
        self.grad.update(zip(summed, grads))

    def backward_node(self, node: Node, needs: set[str], kept: tuple[str, ...]) -> None:
        gouts = [self.grad[o] for o in node.outputs if o in self.grad]
        targets: dict[str, int] = {}  # input value -> its first differentiable position
        for pos, name in self.differentiable(node):
            if name in needs:
                targets.setdefault(name, pos)
        if not gouts or not targets:
            return
        r = lookup(node.op)
        out_spec = self.values[node.outputs[0]].spec
        passing: list[str] = []
        view = r.grad_view if r is not None else None
        if (r is not None and r.alias) or view == "always":
            passing = list(targets)
        elif view == "same_shape":
            assert r is not None  # a grad_view is what a rule declares
            allowed = r.grad_view_inputs
            passing = [n for n, pos in targets.items()
                       if (allowed is None or pos in allowed)
                       and self.values[n].spec == out_spec]
        computed = [n for n in targets if n not in passing]
        base = f"{node.name}/backward"
        if computed:
            op = BACKWARD_OP if r is not None else f"{BACKWARD_OP}:{node.op}"
            outs = [self.new_value(f"{n}.grad", self.values[n].spec) for n in computed]
            self.add_node(base, op, dict.fromkeys([*gouts, *kept]), outs,
                          {"forward_op": node.op, "forward_index": node.index,
                           "grad_inputs": tuple(sorted(targets[n] for n in computed))},
                          repeat=node.repeat)
            self.contribute(computed, outs, node)
        if passing:
            outs = [self.new_value(f"{n}.grad", self.values[n].spec) for n in passing]
            self.add_node(base + "_view", GRAD_VIEW_OP, (gouts[0],), outs,
                          {"forward_op": node.op, "forward_index": node.index})
            self.contribute(passing, outs, node)

    def contribute(self, targets: list[str], grads: list[str], node: Node) -> None:
        """A second consumer's gradient is added out of place into the running sum."""
        for target, g in zip(targets, grads):
            prev = self.grad.get(target)
            if prev is None:
                self.grad[target] = g
                continue
            total = self.new_value(f"{target}.grad", self.values[target].spec)
            self.add_node(f"{node.name}/backward/accumulate", BACKWARD_OP,
                          (prev, g), (total,), {"accumulate": True, "forward_op": node.op,
                                               "forward_index": node.index},
                          repeat=node.repeat)
            self.grad[target] = total
