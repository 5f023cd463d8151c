"""The report as a user reads it: the terminal view fits the terminal, numbers are never cut,
every figure says what it includes, and savers that cannot help say why (issue #13)."""
from __future__ import annotations

import functools
import json
import os
import re
import subprocess

import pytest

from tests.cli_runner import run_cli
from tests.shared_loads import shared_loads


@pytest.fixture(scope="module", autouse=True)
def _one_load_per_model():
    # the runs that read one zoo model the same way load it once (tests/shared_loads.py)
    with shared_loads():
        yield


UNIT = re.compile(r"^\s*(B|KiB|MiB|GiB|TiB|FLOPs|ms|µs|s)\b")


def run(*args, columns: int | None = None, rc: int = 0) -> subprocess.CompletedProcess:
    """graphcost's main in this process (tests/cli_runner.py), printing to a pipe at
    COLUMNS=``columns`` (unset: a pipe with no width given, which wraps at 100)."""
    saved = os.environ.pop("COLUMNS", None)
    try:
        p = run_cli(*args, env={"COLUMNS": str(columns)} if columns else None)
    finally:
        if saved is not None:
            os.environ["COLUMNS"] = saved
    assert p.returncode == rc, (p.returncode, p.stderr[-1500:])
    return p


@functools.cache
def shared_run(*args, columns: int | None = None) -> str:
    """The stdout of a run two tests read (a training run traces its model: ~2 s)."""
    return run(*args, columns=columns).stdout


GPT2_TRAIN_GPU = ("zoo:gpt2", "--train", "--device", "a100-80gb")           # Adam by default
# (the serving review test_devices_and_serving_tables_fit reads at 80 columns, piped below)
GPT2_SERVE = ("zoo:gpt2", "--serve", "--prompt", 16, "--generate", 8, "--device", "a10",
              "--max-rows", 1)
GPT2_CHECKPOINTED = ("zoo:gpt2", "--batch", "8", "--train", "--checkpoint-every", "1", "--details")


@pytest.fixture(scope="module")
def resnet_json():
    return json.loads(run("zoo:resnet18", "--format", "json").stdout)


@pytest.mark.parametrize("width", [80, 100, 160])
def test_table_fits_and_cuts_no_number(width, resnet_json):
    out = run("zoo:resnet18", "--max-rows", 30, columns=width).stdout
    lines = out.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= width
    header = next(line for line in lines if line.lstrip().startswith("#"))
    for col in ("node", "op", "shape", "MACs", "FLOPs", "out bytes", "FLOPs %"):
        assert col in header, (col, header)
    # every number of the default columns is printed whole (the same text as --wide)
    wide = shared_run("zoo:resnet18", "--max-rows", 30, "--wide")  # (one for the 3 widths)
    for i in range(30):
        row = next(line for line in lines if re.match(rf" *{i}\s", line))  # index right-aligned
        wide_row = next(line for line in wide.splitlines() if re.match(rf" *{i}\s", line))
        nums = re.findall(r"\d[\d,.]*[KMGT]?(?: [KMGT]?i?B)?\*?", row.split("  ", 1)[1])
        for num in nums[-4:]:  # MACs, FLOPs, out bytes, share: the right-hand cells
            assert num in wide_row, (num, row)
    # the summary wraps between values: no line ends in a number whose unit starts the next
    for a, b in zip(lines, lines[1:]):
        assert not (re.search(r"\d$", a.rstrip()) and UNIT.match(b)), (a, b)
    assert "11,689,512 (44.59 MiB)" in out
    # one peak, labelled: parameters + buffers + the activation peak (incl. the inputs)
    t = resnet_json["totals"]
    assert resnet_json["peak_bytes"] == t["param_bytes"] + t["buffer_bytes"] + \
        resnet_json["memory"]["peak_bytes"]
    assert f"{resnet_json['peak_bytes']:,} B" in out and "parameters + buffers" in out


def test_wide_and_columns():
    wide = run("zoo:mnist_net", "--wide", columns=80).stdout
    assert "input shape(s)" in wide and "R+W" in wide  # every column, natural widths
    some = run("zoo:mnist_net", "--columns", "name,flops,status").stdout
    header = next(line for line in some.splitlines() if "FLOPs" in line)
    assert header.split() == ["node", "FLOPs", "status"]
    p = run("zoo:mnist_net", "--columns", "name,nope", rc=2)
    assert "unknown column(s) nope" in p.stderr and p.stderr.count("\n") == 1


def test_aten_ops_drop_their_namespace_before_being_cut():
    from graphcost.analyzer.render.table import Col, fit
    op = Col("op", min_width=10, abbreviate=lambda t: t.removeprefix("aten.").split(".")[0])
    rows = [["aten.relu.default", "1,234"], ["aten.upsample_nearest2d.vec", "5"]]
    _, cells = fit([op, Col("n", numeric=True)], rows, width=30)
    assert [r[0] for r in cells] == ["relu", "upsample_nearest2d"]  # fits once abbreviated
    assert fit([op, Col("n", numeric=True)], rows, width=None)[1] == rows  # files: whole
    out = run("zoo:mnist_net", "--fx", columns=80).stdout
    assert re.search(r"^ *2\s+relu\s+relu\s", out, re.M) and "aten." not in out


def test_what_ifs_and_plans_that_cannot_help_say_why():
    # llama_tiny + Adam peaks in the optimizer step: no activation saver can lower it (every
    # what-if is in the whole view; the default one, issue 48, shows the best saver alone)
    out = run("zoo:llama_tiny", "--train", "--checkpoint", "sqrt", "--details",
              columns=100).stdout
    text = " ".join(out.split())
    assert "in optimizer step (steady state)" in text
    assert "the plan saves nothing: the peak is in the optimizer step" in text
    assert "inplace activations: peak 10.42 MiB (saves nothing: the peak is in the optimizer" \
        in text
    assert "first step the same (adam state is created inside its step()" in text


def test_files_written_are_announced(tmp_path):
    html = tmp_path / "r.html"
    p = run("zoo:mnist_net", "--format", "json", "--html", html)
    assert p.stderr == f"graphcost: wrote HTML report to {html}\n" and html.exists()
    p = run("zoo:mnist_net", "--html", tmp_path / "y.txt", rc=2)
    assert ".html" in p.stderr and not (tmp_path / "y.txt").exists()


def test_input_dtypes_the_model_rejects_are_refused():
    p = run("zoo:mnist_net", "--input-dtype", "x=float16", rc=2)
    assert "declares x as float32" in p.stderr


def test_api_errors_speak_the_api(tmp_path):
    import onnx

    from graphcost import GraphcostError, analyze
    from tests.onnx_builders import model, node, weight
    m = model([node("MatMul", ["x", "W"], ["y"])], [("x", ["batch", "seq", 8])],
              [("y", ["batch", "seq", 4])], inits=[weight("W", 8, 4)])
    with pytest.raises(GraphcostError, match=r"dims=\{'seq': N\}") as exc:
        analyze(m, batch=2)
    assert "--" not in str(exc.value)
    path = tmp_path / "m.onnx"
    onnx.save(m, path)
    p = run(path, "--batch", 2, rc=2)
    assert "--dim seq=N" in p.stderr


def test_max_batch_fits_the_terminal():
    # --max-batch's lines wrap between values at 80 columns (its memory fit alone is ~105
    # characters); on a wide terminal each stays on one line (piped: 100 columns, below)
    narrow = run("zoo:small_cnn", "--max-batch", "--device", "t4", columns=80).stdout
    assert max(len(line) for line in narrow.splitlines()) <= 80
    wide = run("zoo:small_cnn", "--max-batch", "--device", "t4", columns=200).stdout
    assert len(wide.splitlines()) < len(narrow.splitlines())
    # the same words either way: wrapping moves only line breaks
    assert narrow.split() == wide.split()
    assert re.search(r"^max batch   [\d,]+ \(needs", narrow, re.M)


def test_diff_prose_fits_the_terminal():
    # the diff's sentences (what matched, the peak moving, what is live only in one model:
    # 211 characters on one line for resnet18 → resnet50) wrap between words at 80 columns,
    # never between a number and its unit; the words are those of the unwrapped text
    narrow = run("diff", "zoo:resnet18", "zoo:resnet50", "--top", 3, columns=80).stdout
    lines = narrow.splitlines()
    assert max(len(line) for line in lines) <= 80
    for a, b in zip(lines, lines[1:]):
        assert not (re.search(r"\d$", a.rstrip()) and UNIT.match(b)), (a, b)
    wide = run("diff", "zoo:resnet18", "zoo:resnet50", "--top", 3).stdout
    live = next(line for line in wide.splitlines() if "live at peak only in new" in line)
    assert len(live) > 80
    assert " ".join(live.split()) in " ".join(narrow.split())


@pytest.mark.parametrize("width", [80, None])
def test_numbers_are_right_aligned(width):
    # numeric columns end in one column: every node row of the default view ends with its
    # FLOPs share, so right-aligned rows all end at the same place (left-aligned ones end
    # wherever '0.1' or '12.5*' does)
    out = run("zoo:resnet18", "--max-rows", 12, columns=width).stdout
    rows = [line.rstrip() for line in out.splitlines() if re.match(r" *\d+\s", line)]
    assert len(rows) == 12 and len({len(r) for r in rows}) == 1, rows


def test_devices_and_serving_tables_fit():
    # graphcost devices was a 96-column box; --serve's phase table 83 columns with its text
    # cut to 'pre…ll': both fit 80 now, the serving table by its shorter headers
    devices = run("devices", columns=80).stdout
    assert max(len(line) for line in devices.splitlines()) <= 80
    assert "h100-sxm" in devices and "3,350" in devices  # names and numbers whole
    serve = run(*GPT2_SERVE, columns=80).stdout
    lines = serve.splitlines()
    assert max(len(line) for line in lines) <= 80
    start = lines.index(next(line for line in lines if line.startswith("serving: prefill")))
    table = "\n".join(lines[start:start + 5])
    assert "time ≥" in table and "prefill" in table and "decode step" in table


@pytest.mark.parametrize("args", [("zoo:gpt2", "--max-rows", 5), GPT2_TRAIN_GPU, GPT2_SERVE])
def test_piped_text_wraps_at_100_columns(args):
    # issue #26: piped or redirected text (| less, > out.txt) with no $COLUMNS used to print
    # 200+-character summary lines; it now wraps at 100, as a terminal of 100 columns would
    # (analyzer/cli/output.py PIPED_WIDTH). A line is counted in characters.
    lines = shared_run(*args).splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 100, \
        [line for line in lines if len(line.rstrip()) > 100][:3]


def test_narrow_tables_drop_columns_before_cutting_names():
    from graphcost.analyzer.render.table import Col, fit, short_name
    # an ONNX exporter's name without what the op column says and the scope it repeats
    assert short_name("/layer1/layer1.0/conv2/Conv") == "layer1.0/conv2"
    assert short_name("/h.0/attn/MatMul_1") == "h.0/attn/MatMul_1"     # stays distinct
    assert short_name("mm_14") == "mm_14"
    # 2 + 20 + 8 (+ 2 separators) = 34 fits 36 without the optional column, 44 with it:
    # the column goes and the name stays whole
    cols = [Col("#", numeric=True), Col("node", min_width=8, priority=1, keep_end=True),
            Col("shape", min_width=8, optional=True, priority=3), Col("FLOPs", numeric=True)]
    rows = [["12", "layer1.0/conv2/conv_a", "1×64×56×56", "231.21M"]]
    kept, cells = fit(cols, rows, 36)
    assert [c.header for c in kept] == ["#", "node", "FLOPs"]
    assert cells == [["12", "layer1.0/conv2/conv_a", "231.21M"]]
    # where nothing optional can make room, the name is cut at its start: its end is kept
    # (2 + 21 + 7 + 4 = 34 in 26: the name loses 8, to 13 characters)
    kept, cells = fit(cols[:2] + cols[3:], [["12", rows[0][1], rows[0][3]]], 26)
    assert cells[0][1] == "…conv2/conv_a" and len("  ".join(cells[0])) == 26


@pytest.mark.parametrize("width", [80, 120])
def test_names_are_whole_at_80_and_120_columns(width):
    # zoo:resnet50's heaviest nodes: at 80 columns shortened names (layer1.0/conv2), whole,
    # beside whole shapes — the receptive-field columns are what gave way; at 120 as named
    out = run("zoo:resnet50", columns=width).stdout
    rows = [line for line in out.splitlines() if re.match(r" *\d+  \S", line)][:15]
    assert len(rows) == 15 and not any("…" in row for row in rows)
    name = " layer1.0/conv2 " if width == 80 else " /layer1/layer1.0/conv2/Conv "
    assert any(name in row and " 1×64×56×56 " in row for row in rows)
    assert max(len(line) for line in out.splitlines()) <= width


def test_the_optimizer_implementation_a_device_chose_is_said():
    # issue 26: --device moved zoo:gpt2's Adam step peak (9.27 → 10.32 MiB) without a word: on
    # a GPU PyTorch's Adam runs foreach (a temporary per parameter at once), on this CPU the
    # for-loop; the training line now names the one costed
    # (both runs are other tests' too: gpt2 trained with Adam, the default optimizer, on this
    # CPU under a checkpoint plan, and on an A100 piped; the words compared across line breaks)
    cpu = " ".join(shared_run(*GPT2_CHECKPOINTED, columns=120).split())
    gpu = " ".join(shared_run(*GPT2_TRAIN_GPU).split())
    assert "optimizer adam (forloop step: PyTorch's default with the parameters on a CPU)" in cpu
    assert "optimizer adam (foreach step: PyTorch's default with the parameters on a GPU)" in gpu


def test_recompute_flops_are_written_one_way():
    # issue 26: the what-if said "recompute 447,648,000 FLOPs", the plan "447.65M FLOPs"
    # (446,595,328 since the math kernel's _safe_softmax is one softmax, as eager runs it).
    # Checkpointing every other block recomputes the same forward as every block, which the
    # what-if shows (not shown under --checkpoint-every 1: it would repeat the plan)
    out = shared_run(*GPT2_CHECKPOINTED[:-2], "2", "--details", columns=120)
    said = re.findall(r"recompute (\S+) FLOPs", out)
    assert len(said) == 2 and said[0] == said[1] == "446.60M", said
