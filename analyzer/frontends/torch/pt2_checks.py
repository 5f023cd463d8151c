"""A saved program's JSON checked before torch sees it (pt2.py reads and rebuilds it): the
grammar of every symbolic size (torch's deserializer hands each to ``sympy.sympify``), every
node's target, every device, the range constraints, the state's names, and the program's size
— the bounds are stated beside each constant, the reasons in pt2.py's docstring."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ....passes.errors import GraphcostError
from .sympy_budget import check_terms

MAX_EXPR = 20_000       # characters in one expr_str
MAX_DEPTH = 32          # nested parentheses (real programs: under 10; CeilDiv 99 deep: 10 s)
MAX_DIGITS = 40         # digits in one number (no power operator: products stay small)
MAX_SYMBOL_INDEX = 10 ** 6  # s<N>, u<N>: torch numbers them from 0, one per dynamic size
MAX_MINMAX_ARGS = 8     # Max/Min arguments in one expression (~20 ms at 8, quadratic beyond)
MAX_MINMAX_WORK = 2048  # Σ arguments² over the distinct expressions: 512 Max(a, b), ~1 s
MAX_INT = 2 ** 64       # any integer in the program: torch writes int64 sizes and bounds
MAX_PROGRAM = 1 << 30   # bytes of program JSON, unpacked
MAX_RATIO = 100         # unpacked / packed past 64 MiB (JSON packs ~10×; a zip bomb 1000×)
MAX_NODES = 200_000     # nodes of one program, subgraphs' included (100,000: ~25 s, 1.2 GB)
MAX_TENSORS = 400_000   # its tensors (parameters and each output of a node)
MAX_RETRACED = 20_000   # nodes of a program torch re-traces to reach core ATen (~1.6 ms each)
MAX_DEVICE_INDEX = 128  # c10's DeviceIndex is an int8
# the device types torch names (c10/core/DeviceType.h), and npu (Ascend's privateuse1 name):
# each is read as the CPU, so none reaches torch, which aborts on a backend it was built without
DEVICE_TYPES = frozenset("""cpu cuda mkldnn opengl opencl ideep hip ve fpga maia xla vulkan
    metal mps meta hpu lazy ipu xpu mtia privateuseone npu""".split())
MINMAX = frozenset({"Max", "Min"})
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


class BadDevice(ValueError):
    """A device object outside check_device's grammar."""


def _check_symbol(name: str) -> None:
    digits = name[len(name.rstrip("0123456789")):]
    if SYMBOL.fullmatch(name) and (len(digits) > 7 or int(digits) > MAX_SYMBOL_INDEX):
        raise ValueError(f"the symbol {name[:40]!r} (an index beyond {MAX_SYMBOL_INDEX:,})")


# long: a tokenizer and grammar for size arithmetic in one place, so it reads as the grammar
def check_expr(text) -> int:
    """Raises ValueError unless ``text`` is size arithmetic in the grammar above; returns the
    number of Max/Min arguments it holds."""
    if not isinstance(text, str):
        raise ValueError(f"an expression that is not a string ({type(text).__name__})")
    if len(text) > MAX_EXPR:
        raise ValueError(f"an expression of {len(text):,} characters (at most {MAX_EXPR:,})")
    tokens, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            if text[pos:].strip():
                raise ValueError(f"unexpected character {text[pos:].lstrip()[0]!r}")
            break
        kind = m.lastgroup
        assert kind is not None  # every alternative is a named group
        tokens.append((kind, m.group(kind)))
        pos = m.end()
    calls: list[str | None] = []  # the function of each open parenthesis (None: grouping)
    minmax = 0
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
            else:
                _check_symbol(tok)
        elif kind == "str":
            rule = STRING_ARG.get(calls[-1] or "") if calls and prev[1] == "(" else None
            if rule is None or not rule.fullmatch(tok[1:-1]):
                raise ValueError(f"the string {tok}")
            _check_symbol(tok[1:-1])
        elif tok in ("**", "<<", ">>"):
            raise ValueError(f"the operator {tok!r}")
        elif tok == "(":
            calls.append(prev[1] if prev[0] == "name" else None)
            if len(calls) > MAX_DEPTH:
                raise ValueError("parentheses nested too deep")
            minmax += calls[-1] in MINMAX
        elif tok == "," and calls and calls[-1] in MINMAX:
            minmax += 1
        elif tok == ")":
            if not calls:
                raise ValueError("unbalanced parentheses")
            calls.pop()
        elif tok == "=" and (prev[0] != "name" or not (
                nxt in ("True", "False") or nxt.isdigit())):
            raise ValueError("a keyword without a literal value")
    if calls:
        raise ValueError("unbalanced parentheses")
    check_terms(tokens)
    if minmax > MAX_MINMAX_ARGS:
        raise ValueError(f"an expression with {minmax} Max/Min arguments (at most "
                         f"{MAX_MINMAX_ARGS}: sympy compares them pairwise)")
    return minmax


def check_target(target) -> None:
    if not isinstance(target, str) or not (target in SIZE_OPS or OPERATOR.fullmatch(target)) \
            or REFUSED_OPERATORS.fullmatch(target):
        raise ValueError(f"the call target {str(target)[:80]!r} is not an ATen, prims, "
                         "higher-order or size operator")


@dataclass
class Walked:
    """What check_program counted on its way: the calls (nodes, subgraphs' included), the
    tensors (``tensor_values``), the distinct call targets, and the device objects (tensor
    metadata's and device arguments'), each checked."""
    nodes: int = 0
    tensors: int = 0
    targets: set[str] = field(default_factory=set)
    devices: list[dict] = field(default_factory=list)


def check_program(data) -> Walked:
    """Walks the program's JSON: every expr_str, every call target (nodes, operator
    arguments), every device, every integer and the range constraints, iteratively (a
    deeply nested file cannot exhaust the stack)."""
    seen: set[str] = set()  # torch parses each occurrence; sympy's cache makes repeats cheap
    walked = Walked()
    minmax = 0
    stack = [data]
    while stack:
        obj = stack.pop()
        items = obj.items() if isinstance(obj, dict) else enumerate(obj)
        for key, value in items:
            if key == "expr_str" and isinstance(obj, dict):
                if not isinstance(value, str) or value not in seen:
                    minmax += check_expr(value) ** 2
                    seen.add(value)
            elif (key == "as_operator" or (key == "target" and "inputs" in obj)) and \
                    isinstance(obj, dict):
                check_target(value)
                if key == "target":
                    walked.nodes += 1
                    walked.targets.add(value)
            elif is_device(key, obj):
                check_device(value)
                walked.devices.append(value)
            elif isinstance(value, (dict, list)):
                walked.tensors += len(value) if key == "tensor_values" else 0
                stack.append(value)
            elif isinstance(value, int) and not -MAX_INT <= value <= MAX_INT:
                raise ValueError(f"the integer {_digits(value)} (beyond ±2^64)")
    if minmax > MAX_MINMAX_WORK:
        raise ValueError(f"Max/Min comparisons over its expressions worth {minmax:,} (the "
                         f"squares of their argument counts; at most {MAX_MINMAX_WORK:,})")
    if isinstance(data, dict):
        check_ranges(data.get("range_constraints"))
    return walked


def is_device(key, obj) -> bool:
    """Where the schema reads a Device: a TensorMeta's ``device`` (beside its ``dtype``) and
    an Argument's ``as_device`` (its one key). A tensor or an argument named "device" is
    neither."""
    return isinstance(obj, dict) and (key == "device" and "dtype" in obj
                                      or key == "as_device" and len(obj) == 1)


def check_device(value) -> str:
    """Raises BadDevice unless ``value`` is a Device of a type torch names, its index none or
    below MAX_DEVICE_INDEX; returns it as torch writes it (``cuda:0``)."""
    kind = value.get("type") if isinstance(value, dict) else None
    index = value.get("index") if isinstance(value, dict) else None
    if not isinstance(value, dict) or set(value) - {"type", "index"} or \
            not isinstance(kind, str):
        raise BadDevice(f"a device that is not {{type, index}}: {str(value)[:60]!r}")
    if kind not in DEVICE_TYPES or not (index is None or type(index) is int
                                        and 0 <= index < MAX_DEVICE_INDEX):
        raise BadDevice(f"the device {kind[:40]!r} of index {str(index)[:40]!r} (a device "
                        f"type torch names, such as cpu, cuda, mps or xpu, and an index "
                        f"below {MAX_DEVICE_INDEX})")
    return kind if index is None else f"{kind}:{index}"


def _digits(value: int) -> str:
    return f"{value}" if abs(value) < 10 ** 30 else f"of {len(str(abs(value)))} digits"


def check_ranges(ranges) -> None:
    """``range_constraints``: symbol name -> {min_val, max_val}, integers or null. torch's
    deserializer counts up to the index of each unbacked symbol (``u<N>``) it names."""
    if ranges is None:
        return
    if not isinstance(ranges, dict):
        raise ValueError("range_constraints that are not a mapping")
    for name, bounds in ranges.items():
        if not SYMBOL.fullmatch(name):
            raise ValueError(f"a range constraint on {name[:40]!r}, not a symbol name")
        _check_symbol(name)
        if not isinstance(bounds, dict) or set(bounds) - {"min_val", "max_val"}:
            raise ValueError(f"a range constraint on {name!r} that is not "
                             "{min_val, max_val}")
        for v in bounds.values():
            if v is not None and (type(v) is not int or not -MAX_INT <= v <= MAX_INT):
                raise ValueError(f"a range constraint on {name!r} with the bound "
                                 f"{str(v)[:40]} (integers within ±2^64 or null)")



def check_state_names(doc, path: Path) -> None:
    """Two parameters (buffers, constants) of one name: one would stand for the other when
    the state is bound by name (a 1-D bias in a matmul)."""
    seen: set[tuple[str, str]] = set()
    specs = doc.get("graph_module", {}).get("signature", {}).get("input_specs", []) \
        if isinstance(doc, dict) else []
    for spec in specs if isinstance(specs, list) else []:
        for kind in ("parameter", "buffer", "tensor_constant"):
            value = spec.get(kind) if isinstance(spec, dict) else None
            key = value.get(f"{kind}_name") if isinstance(value, dict) else None
            table = "constant" if kind == "tensor_constant" else "state"
            if isinstance(key, str):
                if (table, key) in seen:
                    raise GraphcostError(f"{path}: invalid program: two inputs are the "
                                         f"{kind.replace('_', ' ')} {key!r}")
                seen.add((table, key))
