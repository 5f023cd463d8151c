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

The work torch does on the JSON is bounded before it starts: a ``range_constraints`` key
``u<N>`` makes the deserializer count to N (``u1000000000``: 30 s), so symbol names have an
index of at most MAX_SYMBOL_INDEX and bounds are integers within ±2^64; sympy compares the
arguments of ``Max`` / ``Min`` pairwise (``Max(s0, …, s250)``: 25 s), so one expression has at
most MAX_MINMAX_ARGS of them, and the squares of those counts over the program's distinct
expressions add up to at most MAX_MINMAX_WORK (zoo:unet with dynamic sizes: 160); torch's
ShapeEnv multiplies out products of sums, so no expression may expand past 512 terms
(analyzer/frontends/torch/sympy_budget.py). Two
parameters (buffers, constants) of one name are refused (one would stand for the other).

Anything else is refused with a GraphcostError before torch sees the program.
"""
from __future__ import annotations

import json
import logging
import re
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, cast

from ....passes.errors import GraphcostError
from .sympy_budget import check_terms

if TYPE_CHECKING:  # torch is imported only once the JSON passed every check
    import torch

MAX_EXPR = 20_000       # characters in one expr_str
MAX_DEPTH = 32          # nested parentheses (real programs: under 10; CeilDiv 99 deep: 10 s)
MAX_DIGITS = 40         # digits in one number (no power operator: products stay small)
MAX_SYMBOL_INDEX = 10 ** 6  # s<N>, u<N>: torch numbers them from 0, one per dynamic size
MAX_MINMAX_ARGS = 8     # Max/Min arguments in one expression (~20 ms at 8, quadratic beyond)
MAX_MINMAX_WORK = 2048  # Σ arguments² over the distinct expressions: 512 Max(a, b), ~1 s
MAX_INT = 2 ** 64       # any integer in the program: torch writes int64 sizes and bounds
MAX_PROGRAM = 1 << 30   # bytes of program JSON, unpacked
MAX_RATIO = 100         # unpacked / packed past 64 MiB (JSON packs ~10×; a zip bomb 1000×)
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


def check_program(data) -> None:
    """Walks the program's JSON: every expr_str, every call target (nodes, operator
    arguments), every integer and the range constraints, iteratively (a deeply nested file
    cannot exhaust the stack)."""
    seen: set[str] = set()  # torch parses each occurrence; sympy's cache makes repeats cheap
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
            elif isinstance(value, (dict, list)):
                stack.append(value)
            elif isinstance(value, int) and not -MAX_INT <= value <= MAX_INT:
                raise ValueError(f"the integer {_digits(value)} (beyond ±2^64)")
    if minmax > MAX_MINMAX_WORK:
        raise ValueError(f"Max/Min comparisons over its expressions worth {minmax:,} (the "
                         f"squares of their argument counts; at most {MAX_MINMAX_WORK:,})")
    if isinstance(data, dict):
        check_ranges(data.get("range_constraints"))


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


@contextmanager
def quiet_logging():
    """No log record reaches the terminal meanwhile: torch logs the errors (and the
    tracebacks) of a program it cannot rebuild before raising them, and graphcost turns the
    exception into its one line. Global (torch's handlers sit on several loggers and hold
    the stream they were made with), restored after."""
    saved = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(saved)


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


def read_program(path: Path) -> bytes:
    """The archive's program JSON (``<archive>/models/<name>.json``), read with zipfile: a
    refusal costs no torch import (2 s, 300 MB). Its unpacked size is bounded before it is
    read whole: at most MAX_PROGRAM bytes, and past 64 MiB at most MAX_RATIO times its packed
    size (a zip bomb: 500 MB of JSON from a 0.5 MB archive)."""
    if not path.is_file():
        raise GraphcostError(f"{path}: no such file")
    if not zipfile.is_zipfile(path):
        raise GraphcostError(f"{path}: not a torch.export archive (.pt2 is a zip file)")
    with zipfile.ZipFile(path) as z:
        programs = [i for i in z.infolist() if i.filename.endswith(".json")
                    and "models" in i.filename.split("/")[:2]]
        if not programs:
            raise GraphcostError(f"{path}: no exported program in the archive")
        info = programs[0]
        limit = min(MAX_PROGRAM, max(64 << 20, MAX_RATIO * info.compress_size))
        with z.open(info) as fh:
            raw = fh.read(limit + 1)
    if len(raw) > limit:
        raise GraphcostError(f"{path}: refused: its program unpacks to over {limit:,} bytes "
                             f"from {info.compress_size:,} in the archive")
    return raw


# long: the .pt2 refusals in the order the archive is read; each names what it refused
def load_pt2(path: Path) -> "torch.export.ExportedProgram":
    try:
        raw = read_program(path)
    except GraphcostError:
        raise
    except Exception as exc:  # a damaged zip: BadZipFile, a CRC error, a bad method
        raise GraphcostError(f"{path}: unreadable .pt2 archive ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
    try:
        try:
            doc = json.loads(raw)
        except ValueError as exc:  # not JSON, or an integer of over 4,300 digits
            raise GraphcostError(f"{path}: unreadable .pt2 archive: its program is not JSON "
                                 f"({str(exc)[:80]})") from None
        try:
            check_program(doc)
        except ValueError as exc:
            raise GraphcostError(f"{path}: refused: the program holds {exc} (torch would "
                                 "evaluate it); a .pt2 is read as data only") from None
        check_state_names(doc, path)
        import torch  # only now: every check above is on the JSON alone
        from torch._export.serde import schema
        from torch._export.serde.serialize import (
            _SERIALIZE_TO_TORCH_DTYPE,
            ExportedProgramDeserializer,
            _dict_to_dataclass,
        )
        from torch._subclasses.fake_tensor import FakeTensorMode
        # Python source that torch (2.9+) exec()s when the program becomes a module: never
        # needed to cost the graph, never run (and torch 2.8's schema has no such field)
        doc.pop("guards_code", None)
        # (torch 2.9+'s _bytes_to_dataclass is this; 2.8 has only _dict_to_dataclass)
        serialized = cast(schema.ExportedProgram,  # (torch types the result as any schema value)
                          _dict_to_dataclass(schema.ExportedProgram, doc))
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
            if kind in ("parameter", "buffer", "tensor_constant"):
                key = getattr(value, f"{kind}_name")
                table = constants if kind == "tensor_constant" else state
                t = placeholder(value.arg.name)
                table[key] = torch.nn.Parameter(t) if kind == "parameter" else t
        with quiet_logging():
            return ExportedProgramDeserializer().deserialize(serialized, state, constants, None)
    except GraphcostError:
        raise
    except Exception as exc:
        raise GraphcostError(f"{path}: cannot rebuild the exported program "
                             f"({type(exc).__name__}: {str(exc).splitlines()[0][:200]})") from None
