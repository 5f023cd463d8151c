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
  with example inputs — graphcost never passes any) is dropped all the same;
* every device (each tensor's, each device argument's) becomes a ``torch.device``, and a
  tensor on a backend this torch was built without aborts the process (SIGABRT, not an
  exception): each must be a device type torch names, its index below 128, and every one is
  then read as the CPU — a program exported on a GPU is costed as its CPU export is, the
  report saying where it was exported.

The work torch does on the JSON is bounded before it starts: a ``range_constraints`` key
``u<N>`` makes the deserializer count to N (``u1000000000``: 30 s), so symbol names have an
index of at most MAX_SYMBOL_INDEX and bounds are integers within ±2^64; sympy compares the
arguments of ``Max`` / ``Min`` pairwise (``Max(s0, …, s250)``: 25 s), so one expression has at
most MAX_MINMAX_ARGS of them, and the squares of those counts over the program's distinct
expressions add up to at most MAX_MINMAX_WORK (zoo:unet with dynamic sizes: 160); torch's
ShapeEnv multiplies out products of sums, so no expression may expand past 512 terms
(analyzer/frontends/torch/sympy_budget.py). Two
parameters (buffers, constants) of one name are refused (one would stand for the other). A
program has at most MAX_NODES nodes and MAX_TENSORS tensors; one that torch must re-trace to
reach core ATen (~2 ms a node: an operator outside it, symbolic sizes) at most MAX_RETRACED;
the rebuild itself is linear (analyzer/frontends/torch/pt2_rebuild.py).

Anything else is refused with a GraphcostError before torch sees the program.
"""
from __future__ import annotations

import gc
import json
import logging
import weakref
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from ....passes.errors import GraphcostError, first_line
from .pt2_checks import (
    MAX_NODES,
    MAX_PROGRAM,
    MAX_RATIO,
    MAX_RETRACED,
    MAX_TENSORS,
    BadDevice,
    Walked,
    check_device,
    check_program,
    check_state_names,
)

if TYPE_CHECKING:  # torch is imported only once the JSON passed every check
    import torch

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


def _parsed(path: Path) -> tuple[dict, Walked]:
    """The program's JSON, checked (the refusals in the order the archive is read, each
    naming what it refused), and what the check counted."""
    try:
        raw = read_program(path)
    except GraphcostError:
        raise
    except Exception as exc:  # a damaged zip: BadZipFile, a CRC error, a bad method
        raise GraphcostError(f"{path}: unreadable .pt2 archive ({type(exc).__name__}: "
                             f"{first_line(exc)})") from None
    try:
        doc = json.loads(raw)
    except ValueError as exc:  # not JSON, or an integer of over 4,300 digits
        raise GraphcostError(f"{path}: unreadable .pt2 archive: its program is not JSON "
                             f"({str(exc)[:80]})") from None
    try:
        walked = check_program(doc)
    except BadDevice as exc:
        raise GraphcostError(f"{path}: refused: the program holds {exc}") from None
    except ValueError as exc:
        raise GraphcostError(f"{path}: refused: the program holds {exc} (torch would "
                             "evaluate it); a .pt2 is read as data only") from None
    check_state_names(doc, path)
    if walked.nodes > MAX_NODES or walked.tensors > MAX_TENSORS:
        raise GraphcostError(f"{path}: refused: its program has {walked.nodes:,} nodes and "
                             f"{walked.tensors:,} tensors (a .pt2 is read up to {MAX_NODES:,} "
                             f"nodes and {MAX_TENSORS:,} tensors)")
    if not isinstance(doc, dict):
        raise GraphcostError(f"{path}: unreadable .pt2 archive: its program is not a JSON "
                             "object")
    return doc, walked


def _on_cpu(devices: list[dict]) -> tuple[str, ...]:
    """Every device object (checked) becomes the CPU, where torch here can make tensors and
    a program's devices change no figure; returns the others it named (``cuda:0``)."""
    named = {check_device(d) for d in devices}
    for d in devices:
        d.clear()
        d.update(type="cpu", index=None)
    return tuple(sorted(named - {"cpu"}))


# each program read from a .pt2: the devices it was exported on, where not the CPU alone
_READ: "weakref.WeakKeyDictionary[object, tuple[str, ...]]" = weakref.WeakKeyDictionary()


def exported_on(program) -> tuple[str, ...]:
    """The report's warning for a program read from a .pt2 exported on another device."""
    devices = _READ.get(program, ())
    return (f"exported on {', '.join(devices)}: read with its tensors on the CPU (the graph "
            "is costed, never run)",) if devices else ()


def as_is(program, name: str) -> bool:
    """Whether ``program`` is lowered as it is, torch's retrace (run_decompositions, ~2 ms a
    node) left out: pt2_rebuild.unchecked says why not. One read from a .pt2 past
    MAX_RETRACED nodes that is not so is refused."""
    from .pt2_rebuild import unchecked

    why = unchecked(program)
    if why is None:
        return True
    nodes = sum(n.op == "call_function" for n in program.graph.nodes)
    if program in _READ and nodes > MAX_RETRACED:
        raise GraphcostError(f"{name}: refused: {why}; a program torch must re-trace is read "
                             f"up to {MAX_RETRACED:,} nodes (this one has {nodes:,})")
    return False


def _retrace_bound(path: Path, walked: Walked, plain: bool) -> None:
    """A program outside core ATen, or of symbolic sizes, is re-traced by torch
    (run_decompositions, ~2 ms a node, in graphcost's lowering): its nodes are bounded lower
    than a core ATen one's."""
    from .pt2_rebuild import outside_core

    if walked.nodes <= MAX_RETRACED:
        return
    outside = outside_core(walked.targets)
    shown = ", ".join(t.removeprefix("torch.ops.") for t in outside[:3]) + \
        (", …" if len(outside) > 3 else "")
    if outside or not plain:
        raise GraphcostError(
            f"{path}: refused: its program has {walked.nodes:,} nodes and "
            f"{f'operators outside core ATen ({shown})' if outside else 'symbolic sizes'}, "
            f"which torch re-traces at ~2 ms a node: a .pt2 is read up to {MAX_RETRACED:,} "
            f"nodes, or up to {MAX_NODES:,} of static sizes saved after "
            "ep.run_decompositions()")


@contextmanager
def _collector_paused():
    """The cyclic collector waits while a program is read: millions of objects are made and
    none is garbage, and it would walk them again and again (100,000 nodes: the dataclasses
    took 9.4 s with it, 3.6 s without; the JSON 3.9 s, 1.0 s)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def load_pt2(path: Path) -> "torch.export.ExportedProgram":
    """The saved program at ``path``, read as data (see the module docstring)."""
    with _collector_paused():
        return _load(path)


def _load(path: Path) -> "torch.export.ExportedProgram":
    doc, walked = _parsed(path)
    devices = _on_cpu(walked.devices)
    try:  # (torch is imported only now: every check above is on the JSON alone)
        from .pt2_rebuild import serialized
        # Python source that torch (2.9+) exec()s when the program becomes a module: never
        # needed to cost the graph, never run (and torch 2.8's schema has no such field)
        doc.pop("guards_code", None)
        program = serialized(doc)
    except Exception as exc:
        raise GraphcostError(f"{path}: unreadable .pt2 archive ({type(exc).__name__}: "
                             f"{first_line(exc)})") from None
    _retrace_bound(path, walked, program.plain)
    rebuilt = _rebuilt(path, program)
    _READ[rebuilt] = devices
    return rebuilt


def _rebuilt(path: Path, program) -> "torch.export.ExportedProgram":
    """The program (a pt2_rebuild.Serialized), its parameters, buffers and constants fake
    tensors of their recorded shapes and dtypes."""
    import torch
    from torch._export.serde.serialize import (
        _SERIALIZE_TO_TORCH_DTYPE,
        ExportedProgramDeserializer,
    )
    from torch._subclasses.fake_tensor import FakeTensorMode

    from .pt2_rebuild import fast_rebuild

    fake = FakeTensorMode(allow_non_fake_inputs=True)

    def placeholder(name: str) -> torch.Tensor:
        tensors = program.graph["tensor_values"]
        dims = [d.get("as_int") if isinstance(d, dict) else None for d in tensors[name]["sizes"]]
        sizes = [d for d in dims if type(d) is int]
        if len(sizes) != len(dims):
            raise GraphcostError(f"{path}: a weight with a symbolic size; not supported")
        with fake:  # (every device is the CPU by now)
            return torch.empty(sizes, dtype=_SERIALIZE_TO_TORCH_DTYPE[tensors[name]["dtype"]])

    try:
        state, constants = {}, {}
        for spec in program.program.graph_module.signature.input_specs:
            kind = spec.type
            value = getattr(spec, kind)
            if kind in ("parameter", "buffer", "tensor_constant"):
                key = getattr(value, f"{kind}_name")
                table = constants if kind == "tensor_constant" else state
                t = placeholder(value.arg.name)
                table[key] = torch.nn.Parameter(t) if kind == "parameter" else t
        with quiet_logging(), fast_rebuild(program):
            return ExportedProgramDeserializer().deserialize(program.program, state, constants,
                                                             None)
    except GraphcostError:
        raise
    except Exception as exc:
        raise GraphcostError(f"{path}: cannot rebuild the exported program "
                             f"({type(exc).__name__}: {first_line(exc, 200)})") from None
