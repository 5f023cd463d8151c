"""Saved ``torch.export`` programs (``.pt2``) read without unpickling anything.

``torch.export.load`` unpickles the archive's weights (and falls back to an unrestricted
unpickler), which graphcost never does: here only the program's JSON is read, and every
parameter, buffer and constant becomes a fake tensor of the shape and dtype the program itself
records. No weight byte is read.

The JSON is data only after a check, because torch's deserializer evaluates parts of it:

* every symbolic size's ``expr_str`` goes to ``sympy.sympify`` — Python's ``eval`` — so each
  one must match a strict grammar first (sympy's printed form of size arithmetic: symbols,
  integers, + - * / // %, comparisons, and a fixed list of functions such as Max, Min,
  FloorDiv, Mod, Symbol('s0', integer=True), Integer(3), Float('0.5', precision=53)); no
  attribute access, no strings but symbol names and numbers, no other names, no powers;
* every node's ``target`` is resolved by name and called when the program is re-traced: it
  must name an ATen / prims operator, a higher-order operator, or one of the size operators
  torch itself serializes (operator.add, torch.sym_max …);
* ``guards_code`` (Python source that torch exec()s when building the module of a program
  with example inputs — graphcost never passes any) is dropped all the same.

Anything else is refused with a GraphcostError before torch sees the program.
"""
from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path

import torch

from graphcost.analyzer.errors import GraphcostError

MAX_EXPR = 20_000       # characters in one expr_str
MAX_DEPTH = 100         # nested parentheses
MAX_DIGITS = 40         # digits in one number (no power operator: products stay small)
_TOKEN = re.compile(r"""\s*(?:
    (?P<num>\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<str>'[^'\\"]*'|"[^'\\"]*")
  | (?P<op>\*\*|//|<=|>=|==|!=|<<|>>|[-+*/%<>&|~(),=])
)""", re.X)
# sympy classes and torch.utils._sympy.functions that sized programs print (srepr form)
FUNCTIONS = frozenset("""Add Mul Max Min Mod FloorDiv CeilDiv CleanDiv ModularIndexing PythonMod
    CeilToInt FloorToInt TruncToInt TruncToFloat ToFloat RoundToInt RoundDecimal Identity
    IntTrueDiv FloatTrueDiv Where IsNonOverlappingAndDenseIndicator Eq Ne Lt Le Gt Ge
    Equality Unequality StrictLessThan StrictGreaterThan LessThan GreaterThan And Or Not
    Piecewise ExprCondPair Abs floor ceiling Integer Float Rational Symbol""".split())
STRING_ARG = {"Symbol": re.compile(r"[A-Za-z_][A-Za-z0-9_]*"),
              "Float": re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d{1,4})?|[-+]?inf")}
KEYWORDS = frozenset("""positive negative nonnegative nonpositive integer real finite zero
    nonzero even odd rational commutative precision""".split())
CONSTANTS = frozenset({"True", "False", "true", "false", "oo"})
SYMBOL = re.compile(r"[a-z]+_?[0-9]+")  # torch's symbol names: s0, u3, zf1, ps2 …
# Size operators torch serializes by module path (torch._export.serde.serialize._SYM_OPS),
# without pow and shifts (a hostile exponent or shift would compute a huge integer).
SIZE_OPS = frozenset("""_operator.add _operator.and_ _operator.eq _operator.floordiv
    _operator.ge _operator.gt _operator.le _operator.lt _operator.mod _operator.mul _operator.ne
    _operator.neg _operator.or_ _operator.pos _operator.sub _operator.truediv math.trunc
    torch._sym_sqrt torch.sym_float torch.sym_int torch.sym_ite torch.sym_max torch.sym_min
    torch.sym_not""".split())
OPERATOR = re.compile(r"torch\.ops\.(?:aten|prims)\.[A-Za-z0-9_]+\.[A-Za-z0-9_]+"
                      r"|torch\.ops\.higher_order\.[A-Za-z0-9_]+")
# higher-order operators that run code or have effects beyond tensors
REFUSED_OPERATORS = re.compile(r".*\.(?:from_file|triton_kernel_wrapper_\w+|call_torchbind"
                               r"|with_effects|print)(?:\.\w+)?")


def check_expr(text) -> None:
    """Raises ValueError unless ``text`` is size arithmetic in the grammar above."""
    if not isinstance(text, str) or len(text) > MAX_EXPR:
        raise ValueError("not a string of at most 20,000 characters")
    tokens, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            if text[pos:].strip():
                raise ValueError(f"unexpected character {text[pos:].lstrip()[0]!r}")
            break
        tokens.append((m.lastgroup, m.group(m.lastgroup)))
        pos = m.end()
    calls: list[str | None] = []  # the function of each open parenthesis (None: grouping)
    for k, (kind, tok) in enumerate(tokens):
        prev = tokens[k - 1] if k else ("", "")
        nxt = tokens[k + 1][1] if k + 1 < len(tokens) else ""
        if kind == "num":
            if len(tok) > MAX_DIGITS:
                raise ValueError(f"a number of {len(tok)} characters")
        elif kind == "name":
            if nxt == "(":
                if tok not in FUNCTIONS:
                    raise ValueError(f"a call to {tok!r}")
            elif nxt == "=":
                if tok not in KEYWORDS or not calls or calls[-1] not in STRING_ARG:
                    raise ValueError(f"keyword {tok!r}")
            elif tok not in CONSTANTS and not SYMBOL.fullmatch(tok):
                raise ValueError(f"the name {tok!r}")
        elif kind == "str":
            rule = STRING_ARG.get(calls[-1]) if calls and prev[1] == "(" else None
            if rule is None or not rule.fullmatch(tok[1:-1]):
                raise ValueError(f"the string {tok}")
        elif tok in ("**", "<<", ">>"):
            raise ValueError(f"the operator {tok!r}")
        elif tok == "(":
            calls.append(prev[1] if prev[0] == "name" else None)
            if len(calls) > MAX_DEPTH:
                raise ValueError("parentheses nested too deep")
        elif tok == ")":
            if not calls:
                raise ValueError("unbalanced parentheses")
            calls.pop()
        elif tok == "=" and (prev[0] != "name" or not (
                nxt in ("True", "False") or nxt.isdigit())):
            raise ValueError("a keyword without a literal value")
    if calls:
        raise ValueError("unbalanced parentheses")


def check_target(target) -> None:
    if not isinstance(target, str) or not (target in SIZE_OPS or OPERATOR.fullmatch(target)) \
            or REFUSED_OPERATORS.fullmatch(target):
        raise ValueError(f"the call target {str(target)[:80]!r} is not an ATen, prims, "
                         "higher-order or size operator")


def check_program(data) -> None:
    """Walks the program's JSON: every expr_str and every call target (nodes, operator
    arguments), iteratively (a deeply nested file cannot exhaust the stack)."""
    stack = [data]
    while stack:
        obj = stack.pop()
        if isinstance(obj, dict):
            for key, value in obj.items():
                if key == "expr_str":
                    check_expr(value)
                elif key == "as_operator" or (key == "target" and "inputs" in obj):
                    check_target(value)
                elif isinstance(value, (dict, list)):
                    stack.append(value)
        elif isinstance(obj, list):
            stack.extend(x for x in obj if isinstance(x, (dict, list)))


def load_pt2(path: Path) -> "torch.export.ExportedProgram":
    from torch._export.serde import schema
    from torch._export.serde.serialize import (_SERIALIZE_TO_TORCH_DTYPE,
                                               ExportedProgramDeserializer, _dict_to_dataclass)
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.export.pt2_archive._package import PT2ArchiveReader

    if not path.is_file():
        raise GraphcostError(f"{path}: no such file")
    if not zipfile.is_zipfile(path):
        raise GraphcostError(f"{path}: not a torch.export archive (.pt2 is a zip file)")
    try:
        with PT2ArchiveReader(str(path)) as reader:
            programs = [n for n in reader.get_file_names()
                        if n.startswith("models/") and n.endswith(".json")]
            if not programs:
                raise GraphcostError(f"{path}: no exported program in the archive")
            raw = reader.read_bytes(programs[0])
        program = json.loads(raw)
        try:
            check_program(program)
        except ValueError as exc:
            raise GraphcostError(f"{path}: refused: the program holds {exc} (torch would "
                                 "evaluate it); a .pt2 is read as data only") from None
        # Python source that torch (2.9+) exec()s when the program becomes a module: never
        # needed to cost the graph, never run (and torch 2.8's schema has no such field)
        program.pop("guards_code", None)
        # (torch 2.9+'s _bytes_to_dataclass is this; 2.8 has only _dict_to_dataclass)
        serialized = _dict_to_dataclass(schema.ExportedProgram, program)
    except GraphcostError:
        raise
    except Exception as exc:
        raise GraphcostError(f"{path}: unreadable .pt2 archive ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0] if str(exc) else ''})") from None

    graph = serialized.graph_module
    tensors = graph.graph.tensor_values
    fake = FakeTensorMode(allow_non_fake_inputs=True)

    def placeholder(name: str) -> torch.Tensor:
        meta = tensors[name]
        sizes = []
        for s in meta.sizes:
            if s.type != "as_int":
                raise GraphcostError(f"{path}: a weight with a symbolic size; not supported")
            sizes.append(s.as_int)
        device = meta.device.type if meta.device is not None else "cpu"
        with fake:
            return torch.empty(sizes, dtype=_SERIALIZE_TO_TORCH_DTYPE[meta.dtype], device=device)

    try:
        state, constants = {}, {}
        for spec in graph.signature.input_specs:
            kind = spec.type
            value = getattr(spec, kind)
            if kind == "parameter":
                state[value.parameter_name] = torch.nn.Parameter(placeholder(value.arg.name))
            elif kind == "buffer":
                state[value.buffer_name] = placeholder(value.arg.name)
            elif kind == "tensor_constant":
                constants[value.tensor_constant_name] = placeholder(value.arg.name)
        return ExportedProgramDeserializer().deserialize(serialized, state, constants, None)
    except GraphcostError:
        raise
    except Exception as exc:
        raise GraphcostError(f"{path}: cannot rebuild the exported program "
                             f"({type(exc).__name__}: {str(exc).splitlines()[0][:200]})") from None
