"""One validation step for an ONNX ModelProto, before anything else reads it.

A file from elsewhere must get a clear refusal, never a wrong report: every rule below is one
that onnx.checker (full_check) or onnxruntime also enforces, checked here in one linear walk
(onnx.checker.check_model costs ~0.7× the parse of the file, full_check ~1.4×, and it refuses
unsorted graphs that onnxruntime runs). What the walk checks, per graph and subgraph:

* names are valid UTF-8 (protobuf hands invalid ones back as bytes);
* SSA: each value is defined once — never two nodes writing one name, never a node writing a
  graph input or initializer, never a subgraph redefining an outer name;
* every node input and graph output is defined (graph input, initializer, a node's output, or
  an outer-scope value for subgraphs);
* the graph is acyclic (the cycle is named, networkx.find_cycle); a valid graph whose nodes
  are not in topological order is SORTED (stable: Kahn's algorithm keeping file order);
* attributes against the operator's schema (onnx.defs): known names, types, required ones
  present, input/output counts, no unknown operator in onnx's own domains; ops of custom
  domains are left alone;
* every node's domain is imported, opset versions are in the range onnx knows;
* tensor element types are known; dims are non-negative and element counts fit in int64
  (those value rules live in analyzer/frontends/onnx/validate_values.py);
* initializer / constant byte sizes agree with their dims (raw_data length, typed field
  count, an external file's declared length) — without opening any external file;
* Scan / Loop / If: counts of state, scan inputs and outputs agree with the body, scan axes and
  directions are well formed.

Failures raise GraphcostError with one line naming the node and the rule broken.
"""
from __future__ import annotations

from enum import Enum
from functools import lru_cache
from typing import Any

import onnx
from onnx import AttributeProto

from ....passes.costs import lookup
from ....passes.errors import GraphcostError
from . import ort_schemas
from .validate_flow import check_control_flow, toposort
from .validate_flow import invalid as _fail
from .validate_flow import node_label as _label
from .validate_values import (
    TENSOR_ATTRS,
    Bad,
    check_sparse,
    check_tensor,
    check_tensor_attr,
    check_type,
)

ONNX_DOMAINS = ("", "ai.onnx")
_ATTR_NAMES = {v: k for k, v in AttributeProto.AttributeType.items()}
_GRAPH_ATTRS = (AttributeProto.GRAPH, AttributeProto.GRAPHS)
_SPECIAL_ATTRS = frozenset(TENSOR_ATTRS + _GRAPH_ATTRS)


def _str(value, what: str) -> str:
    if type(value) is not str:  # protobuf returns bytes for a string that is not UTF-8
        raise _fail(what, "its name is not valid UTF-8")
    return value


@lru_cache(maxsize=None)
def _domain_range(domain: str) -> tuple[int, int] | None:
    return onnx.defs.C.schema_version_map().get(domain)


@lru_cache(maxsize=None)
def _schema(op_type: str, domain: str, version: int):
    """(attribute types, required attributes, min/max inputs, min/max outputs) or None."""
    try:
        s = onnx.defs.get_schema(op_type, version, domain)
    except Exception:  # no such op at this opset, or a custom domain: left alone
        return None
    # (onnx's stubs give its pybind11 enums no __int__)
    types = {name: int(a.type) for name, a in s.attributes.items()}  # pyright: ignore[reportArgumentType]
    required = tuple(name for name, a in s.attributes.items() if a.required)
    return types, required, s.min_input, s.max_input, s.min_output, s.max_output


@lru_cache(maxsize=1)
def _first_versions() -> dict[tuple[str, str], int]:
    first: dict[tuple[str, str], int] = {}
    for s in onnx.defs.get_all_schemas_with_history():
        key = (s.name, "" if s.domain == "ai.onnx" else s.domain)
        first[key] = min(first.get(key, s.since_version), s.since_version)
    return first


def _first_version(op_type: str, domain: str) -> int | None:
    """The opset in which onnx added ``op_type`` to ``domain``; None if it never did."""
    return _first_versions().get((op_type, domain))


def validate_model(model: onnx.ModelProto, name: str = "model") -> onnx.ModelProto:
    """``model`` if valid and sorted; a sorted copy if valid but unsorted; else raises."""
    try:
        return _validate(model, name)
    except GraphcostError as exc:
        raise GraphcostError(f"{name}: {exc.raw}") from None


def _validate(model: onnx.ModelProto, name: str) -> onnx.ModelProto:
    if model.ir_version > onnx.IR_VERSION:
        raise _fail("model", f"IR version {model.ir_version} is newer than this onnx knows "
                             f"(at most {onnx.IR_VERSION})")
    opsets: dict[str, int] = {}
    for o in model.opset_import:
        domain = _str(o.domain, "opset_import domain")
        domain = "" if domain == "ai.onnx" else domain
        known = _domain_range(domain)
        if known is not None and not known[0] <= o.version <= known[1]:
            raise _fail("model", f"opset {o.version} of domain {domain or 'ai.onnx'!r} is "
                                 f"outside the range this onnx knows ({known[0]}..{known[1]})")
        opsets[domain] = o.version
    checker = _GraphChecker(opsets, model.ir_version)
    checker.check(model.graph, [], "", sort=False)
    if not checker.unsorted:
        return model
    sorted_model = onnx.ModelProto()
    sorted_model.CopyFrom(model)
    _GraphChecker(opsets, model.ir_version).check(sorted_model.graph, [], "", sort=True)
    return sorted_model


class _Missing(Enum):  # a sentinel the type checker can narrow away (an object() is not)
    MISSING = 0


_MISSING = _Missing.MISSING


class _GraphChecker:
    def __init__(self, opsets: dict[str, int], ir_version: int):
        self.opsets = opsets
        self.ir_version = ir_version
        self.unsorted = False
        self.schemas: dict[tuple[str, str], tuple | None] = {}

    def check(self, g: onnx.GraphProto, outer: list[dict[str, int]], scope: str,
              sort: bool) -> set[str]:
        """Validates ``g``; returns the outer-scope names it reads. ``outer``: the enclosing
        graphs' name tables, innermost last (a chain, so nested bodies cost no copies).
        One pass over the nodes (protobuf field reads are the cost: each is read once)."""
        _str(g.name, f"{scope}graph name")
        defined = self._definitions(g, outer, scope)
        pending: list[tuple[str, int]] = []   # inputs read before (or without) a definition
        bodies: list[int] = []                # nodes with subgraphs, checked after the pass
        self._walk(g.node, defined, outer, scope, pending, bodies)
        if any(type(k) is not str for k in defined):
            bad = next(k for k in defined if type(k) is not str)
            raise _fail(f"{scope}value {bad!r}", "its name is not valid UTF-8")
        # Subgraphs see every name of this graph (an unsorted file may define them later).
        sub_reads = self._check_bodies(g.node, bodies, [*outer, defined], scope, sort, pending)
        free, backward = _free_names(g, pending, defined, outer, scope)
        if backward:
            self.unsorted = True
            order = toposort(g, defined, sub_reads, scope)
            if sort:
                _reorder(g, order)
        return free

    def _walk(self, nodes, defined: dict[str, int], outer: list[dict[str, int]], scope: str,
              pending: list[tuple[str, int]], bodies: list[int]) -> None:
        """The one pass over the nodes: definitions (SSA), reads before a definition into
        ``pending``, each node against its schema."""
        schemas = self.schemas
        for i, node in enumerate(nodes):
            ins = node.input
            for v in ins:
                if v not in defined and v:
                    pending.append((v, i))
            outs = node.output
            for out in outs:
                if out:
                    if out in defined or (outer and any(out in t for t in outer)):
                        self._ssa_error(nodes, i, out, defined, scope)
                    defined[out] = i
            if type(node.name) is not str:
                raise _fail(f"{scope}node #{i}", "its name is not valid UTF-8")
            key = (node.op_type, node.domain)
            schema = schemas.get(key, _MISSING)
            if schema is _MISSING:
                schema = schemas[key] = self._schema_of(node, i, scope)
            self._check_node(node, i, key, schema, len(ins), len(outs), scope, bodies)

    def _check_node(self, node: onnx.NodeProto, i: int, key: tuple[str, str],
                    schema: tuple | None, n_in: int, n_out: int, scope: str,
                    bodies: list[int]) -> None:
        """One node against its (op type, domain)'s ``schema``: input and output counts,
        attributes, control-flow bodies' counts."""
        attrs = node.attribute
        if schema is not None and not (schema[2] <= n_in <= schema[3]
                                       and schema[4] <= n_out <= schema[5]):
            self._count_error(node, i, scope, schema)
        if schema is None or schema[0] is None:
            # a custom op, or one onnxruntime knows (counts only): its attributes are its
            # own business
            for a in attrs:
                self._check_attr_value(node, i, a, scope, bodies)
            return
        types, required, _, _, _, _, version = schema
        if attrs:
            self._check_attrs(node, i, attrs, types, required, version, scope, bodies)
        elif required:
            raise _fail(_label(node, i, scope), f"required attribute {required[0]!r} is "
                                                "missing")
        if key[1] in ONNX_DOMAINS and key[0] in ("Scan", "Loop", "If"):
            check_control_flow(node, _label(node, i, scope), version)

    def _check_attrs(self, node: onnx.NodeProto, i: int, attrs, types: dict[str, int],
                     required: tuple[str, ...], version: int, scope: str,
                     bodies: list[int]) -> None:
        """A node's attributes against its schema's: names and types, none twice, the
        required ones present; tensor and graph values checked."""
        for a in attrs:
            at = a.type
            if types.get(a.name) != at:
                self._attr_error(node, i, a, scope, types, version)
            if at in _SPECIAL_ATTRS:
                self._check_attr_value(node, i, a, scope, bodies)
        if len(attrs) > 1 or required:
            present = {a.name for a in attrs}
            if len(present) < len(attrs):
                raise _fail(_label(node, i, scope), "an attribute is given twice")
            if required:
                missing = [r for r in required if r not in present]
                if missing:
                    raise _fail(_label(node, i, scope),
                                f"required attribute {missing[0]!r} is missing")

    def _check_bodies(self, nodes, bodies: list[int], chain: list[dict[str, int]], scope: str,
                      sort: bool, pending: list[tuple[str, int]]) -> dict[int, set[str]]:
        """Checks the subgraphs of the nodes ``bodies``; what each node's bodies read from
        outside them (also added to ``pending``, read by that node)."""
        sub_reads: dict[int, set[str]] = {}  # control-flow node -> what its bodies read
        for i in dict.fromkeys(bodies):
            node = nodes[i]
            inner: set[str] = set()
            for a in node.attribute:
                subs = [a.g] if a.type == AttributeProto.GRAPH else \
                    list(a.graphs) if a.type == AttributeProto.GRAPHS else []
                for k, sub in enumerate(subs):
                    inner |= self.check(sub, chain, f"{_label(node, i, scope)} {a.name}"
                                                    f"{f'[{k}]' if k else ''}: ", sort)
            sub_reads[i] = inner
            pending.extend((v, i) for v in inner)
        return sub_reads


    def _schema_of(self, node: onnx.NodeProto, i: int, scope: str) -> tuple | None:
        """The first node of each (op type, domain): names, domain import, schema."""
        op_type, domain = node.op_type, node.domain
        if type(op_type) is not str or type(domain) is not str:
            raise _fail(f"{scope}node #{i}", "its op type or domain is not valid UTF-8")
        domain = "" if domain == "ai.onnx" else domain
        version = self.opsets.get(domain)
        if version is None:
            raise _fail(_label(node, i, scope), f"its domain {domain or 'ai.onnx'!r} is not in "
                                                "the model's opset_import")
        if not op_type:
            raise _fail(_label(node, i, scope), "it has no op type")
        schema = _schema(op_type, domain, version)
        if schema is not None:
            return (*schema, version)
        ort = ort_schemas.counts(op_type, domain, version)
        if ort is not None:  # onnxruntime's own op (com.microsoft, LayerNormalization:1)
            return (None, (), *ort, version)
        first = _first_version(op_type, domain) if _domain_range(domain) is not None else None
        if first is not None or (_domain_range(domain) is not None and
                                 lookup(op_type if not domain else f"{domain}::{op_type}")
                                 is None):
            # onnx knows every operator of its own domains: a name it lacks at this opset is
            # no operator — but for the few onnxruntime runs there as its own contrib ops
            # (SimplifiedLayerNormalization), which graphcost has rules for
            since = f" (onnx has it from opset {first})" if first and first > version else ""
            raise _fail(_label(node, i, scope), f"no operator {op_type!r} in domain "
                                                f"{domain or 'ai.onnx'!r} at opset {version}"
                                                f"{since}")
        return None

    def _ssa_error(self, nodes, i: int, out: str, defined: dict[str, int], scope: str):
        prev = defined.get(out)
        what = "a name of the enclosing graph" if prev is None else \
            "a graph input or initializer" if prev < 0 else \
            f"also written by {_label(nodes[prev], prev, scope)}"
        raise _fail(_label(nodes[i], i, scope), f"writes {out!r}, which is {what} (each name "
                                                "is defined once: SSA)")

    def _count_error(self, node: onnx.NodeProto, i: int, scope: str, schema: tuple):
        _, _, min_in, max_in, min_out, max_out, _ = schema
        n_in, n_out = len(node.input), len(node.output)
        if not min_in <= n_in <= max_in:
            raise _fail(_label(node, i, scope), f"{n_in} inputs, the {node.op_type} schema "
                                                f"takes {_range(min_in, max_in)}")
        raise _fail(_label(node, i, scope), f"{n_out} outputs, the {node.op_type} schema "
                                            f"gives {_range(min_out, max_out)}")

    def _attr_error(self, node: onnx.NodeProto, i: int, a: onnx.AttributeProto, scope: str,
                    types: dict[str, int], version: int) -> None:
        name = _str(a.name, f"{_label(node, i, scope)} attribute")
        want = types.get(name)
        if want is None:
            raise _fail(_label(node, i, scope), f"attribute {name!r} is not in the "
                                                f"{node.op_type} schema (opset {version})")
        if a.type == 0 and self.ir_version < 2:  # IR 1 attributes carry no type
            return
        raise _fail(_label(node, i, scope),
                    f"attribute {name!r} is {_ATTR_NAMES.get(a.type, a.type)}, the "
                    f"{node.op_type} schema says {_ATTR_NAMES.get(want, want)}")

    def _check_attr_value(self, node: onnx.NodeProto, i: int, a: onnx.AttributeProto,
                          scope: str, bodies: list[int]) -> None:
        name = _str(a.name, f"{_label(node, i, scope)} attribute")
        if a.type in _GRAPH_ATTRS:
            bodies.append(i)
        elif a.type in TENSOR_ATTRS:
            check_tensor_attr(a, f"{_label(node, i, scope)} attribute {name!r}")

    def _definitions(self, g: onnx.GraphProto, outer: list[dict[str, int]],
                     scope: str) -> dict[str, int]:
        """Graph inputs and initializers (index -1), checked; value_info / output types."""
        defined: dict[str, int] = {}   # name -> producing node index (-1: input/initializer)
        seen: set[str] = set()  # an initializer may also be listed as an input (IR < 4)
        # (kind, its proto, name): the kind says which proto it is
        items: list[tuple[str, Any, str]] = [("graph input", vi, vi.name) for vi in g.input] + \
            [("initializer", t, t.name) for t in g.initializer] + \
            [("sparse initializer", sp, sp.values.name) for sp in g.sparse_initializer]
        for kind, item, n in items:
            try:
                if type(n) is not str:
                    raise Bad("its name is not valid UTF-8")
                if not n and kind == "sparse initializer":
                    raise Bad("it has no name")
                if n in (defined if kind == "graph input" else seen):
                    raise Bad("defined twice (SSA)")
                if outer and any(n in t for t in outer):
                    raise Bad("redefines a name of the enclosing graph (SSA)")
                if kind == "graph input":
                    check_type(item.type, True)
                else:
                    seen.add(n)
                    (check_tensor if kind == "initializer" else check_sparse)(item)
            except Bad as exc:
                raise _fail(f"{scope}{kind} {n!r}", str(exc)) from None
            defined[n] = -1
        for coll in (g.output, g.value_info):
            for vi in coll:
                try:
                    if type(vi.name) is not str:
                        raise Bad("its name is not valid UTF-8")
                    check_type(vi.type, False)
                except Bad as exc:
                    raise _fail(f"{scope}value {vi.name!r}", str(exc)) from None
        return defined


def _range(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"{lo}..{hi}" if hi < 2 ** 31 - 1 else f"at least {lo}"


def _free_names(g: onnx.GraphProto, pending: list[tuple[str, int]], defined: dict[str, int],
                outer: list[dict[str, int]], scope: str) -> tuple[set[str], bool]:
    """The outer-scope names ``g`` reads (its nodes and outputs), and whether a node reads a
    later node's output (the graph needs sorting); a name nothing defines is refused."""
    nodes = g.node
    free: set[str] = set()
    backward = False
    for v, i in pending:
        p = defined.get(v)
        if p is None:
            if not (outer and any(v in t for t in outer)):
                raise _fail(_label(nodes[i], i, scope),
                            f"reads {_str(v, 'an input name')!r}, which nothing defines "
                            "(not a graph input, initializer or node output)")
            free.add(v)
        elif p >= i:
            backward = True  # reads a later node's output (or its own): sort
    for o in g.output:
        if o.name not in defined:
            if not (outer and any(o.name in t for t in outer)):
                raise _fail(f"{scope}graph output {o.name!r}", "nothing produces it")
            free.add(o.name)
    return free, backward


def _reorder(g: onnx.GraphProto, order: list[int]) -> None:
    """``g``'s nodes put in ``order`` (indices into them)."""
    sorted_nodes = []
    for i in order:
        copy = onnx.NodeProto()
        copy.CopyFrom(g.node[i])
        sorted_nodes.append(copy)
    del g.node[:]
    g.node.extend(sorted_nodes)
