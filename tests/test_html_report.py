"""graphcost --html: one self-contained file, escaped, and working in a real headless browser.

The browser tests launch Debian's chromium (4 launches, about 1.5 s each) and read the DOM it
dumps after the page's scripts ran: the page sets body[data-ready] when it has rendered and its
window.onerror writes any error into <pre id="errors">.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace

import pytest
from graphcost.analyzer.app.report import NodeRow, Report, Totals
from graphcost.analyzer.render.html import html_report
from graphcost.passes.costs import Coverage
from graphcost.passes.memory.liveness import Liveness
from onnx import save

from tests.cli_runner import run_cli
from tests.onnx_builders import model, node
from tests.shared_loads import shared_loads


@pytest.fixture(scope="module", autouse=True)
def _one_load_per_model():
    # the runs that read one zoo model the same way load it once (tests/shared_loads.py)
    with shared_loads():
        yield


EVIL = "<script>alert(1)</script>&\"'"
CHAIN = 1200  # Relu nodes in the escaping model: more than the table's 1,000-row cap


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """The reports as a user makes them: `graphcost MODEL ... --html FILE`, run in this
    process (tests/cli_runner.py: the command's own main(); a process each cost a Python
    start and an onnx and torch import, ~2.5 s)."""
    tmp = tmp_path_factory.mktemp("html")
    evil = tmp / "evil.onnx"
    # x -> Relu (named EVIL) -> Relu -> ... : CHAIN nodes, the first with a hostile name.
    nodes = [node("Relu", ["x"], ["v0"], name=EVIL)]
    nodes += [node("Relu", [f"v{i - 1}"], [f"v{i}"], name=f"relu{i}") for i in range(1, CHAIN)]
    save(model(nodes, [("x", [1, 4])], [(f"v{CHAIN - 1}", [1, 4])]), evil)
    runs = {"cnn": ["zoo:small_cnn", "--batch", "2"],
            "train": ["zoo:small_cnn", "--batch", "2", "--train", "--optimizer", "sgd",
                      "--checkpoint", "sqrt"],
            "gpt2": ["zoo:gpt2", "--batch", "2"],
            "evil": [str(evil)]}
    for k, args in runs.items():
        p = run_cli(*args, "--html", tmp / f"{k}.html")
        assert p.returncode == 0, (k, p.stderr)
    return {k: tmp / f"{k}.html" for k in runs}


# --- the file itself ------------------------------------------------------------------------

def test_self_contained(pages):
    for path in pages.values():
        text = path.read_text(encoding="utf-8")
        rest = text.replace('xmlns="http://www.w3.org/2000/svg"', "")
        assert "http://" not in rest and "https://" not in rest, path
        assert not re.search(r"\bsrc\s*=", text), path           # no script/img files
        assert "<link" not in text and "@import" not in text and "url(" not in text, path
        assert text.startswith("<!DOCTYPE html>")


def test_summary_numbers_small_cnn(pages):
    text = pages["cnn"].read_text(encoding="utf-8")
    # params: conv 1->32 3x3 (288+32) + conv 32->32 3x3 (9216+32) + fc 6272->128 (802816+128)
    #         + fc 128->10 (1280+10) = 320 + 9248 + 802944 + 1290 = 813,802
    assert "813,802" in text
    # MACs at batch 2: 2·32·28·28·9 + 2·32·28·28·288 + 2·128·6272 + 2·10·128
    #                = 451,584 + 14,450,688 + 1,605,632 + 2,560 = 16,510,464
    assert "16,510,464" in text
    assert "FLOPs = 2·MACs + other arithmetic" in text
    assert "9/9 nodes costed (100.0%)" in text


def test_escaping(pages):
    text = pages["evil"].read_text(encoding="utf-8")
    assert "alert(1)" in text                       # the name is there…
    assert "<script>alert" not in text              # …but never as markup
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&amp;&quot;&#x27;" in text  # summary: peak node
    assert "\\u003cscript\\u003ealert(1)\\u003c/script\\u003e" in text       # JSON table data

    class Scripts(HTMLParser):
        opened = 0

        def handle_starttag(self, tag, attrs):
            self.opened += tag == "script"

    p = Scripts()
    p.feed(text)
    assert p.opened == 3  # the error handler, the JSON data, the table code: nothing else


def _synthetic(n: int) -> Report:
    """n Relu nodes on 1x64 float tensors (64 FLOPs·(i mod 7) to vary the sort key)."""
    nodes = tuple(NodeRow(index=i, name=f"n{i}", op="Relu", scope="", input_shapes=("1x64",),
                          output_shapes=("1x64",), params=0, output_bytes=256, macs=0,
                          flops=64 * (i % 7), bytes_read=256, bytes_written=256, status="ok")
                  for i in range(n))
    timeline = tuple(512 + 256 * (i % 3) for i in range(n))
    return Report(model="synthetic", source="onnx", batch=1, dims={},
                  totals=Totals(0, 0, 0, 0, 0, 0, 0, 0), by_op_type={},
                  coverage=Coverage(n, n, {}, {}),
                  memory=Liveness(include_inputs=True, lifetimes="dataflow", naive_sum_bytes=0,
                                  peak_bytes=1024, peak_node="n2", peak_node_index=2,
                                  live_at_peak=(), arena_bytes=1024, timeline=timeline,
                                  storages=(), value_storage={}, unknown=()),
                  nodes=nodes)


def test_coverage_warnings():
    r = _synthetic(3)
    assert "id='warnings'" not in html_report(r)
    r = replace(r, coverage=Coverage(3, 1, {"FooOp": 1}, {"NonZero": 1}),
                warnings=("opset <7> & more",))
    text = html_report(r)
    assert "unsupported ops (no cost rule, counted as 0 — not costed): FooOp×1" in text
    assert "ops with unknown shapes (not costed): NonZero×1" in text
    assert "opset &lt;7&gt; &amp; more" in text
    assert "1/3 nodes costed (33.3%)" in text


def test_optional_roofline_section():
    r = _synthetic(3)
    assert "Roofline" not in html_report(r)
    # A later pass may attach report.roofline; the page shows it when present.
    # (Duck-typed on purpose: only the fields the page reads.) Node 0 moves no bytes, so its
    # intensity is infinite, which JSON cannot carry.
    node_t = [SimpleNamespace(index=i, seconds=1e-6 * (i + 1), bound="memory",
                              intensity=float("inf") if i == 0 else 0.25) for i in range(3)]
    object.__setattr__(r, "roofline", SimpleNamespace(
        device="GPU <x>", label="fp16", total_seconds=6e-6, nodes=node_t, top=[2, 1]))
    text = html_report(r)
    assert "Roofline estimate" in text and "GPU &lt;x&gt;" in text
    assert "0.006 ms" in text                       # 1 + 2 + 3 µs
    assert '[2,"n2","Relu",3e-06,0.25,"memory"]' in text   # the top-node table's first row
    blob = re.search(r"id='gc-data'>(.*?)</script>", text, re.DOTALL).group(1)
    json.loads(blob, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))


def test_deterministic_and_linear_on_100k_nodes():
    n = 100_000
    r = _synthetic(n)
    t0 = time.perf_counter()
    a = html_report(r)
    elapsed = time.perf_counter() - t0
    small = _synthetic(1000)                        # (the same code at any size: ~0.5 s less)
    assert html_report(small) == html_report(small)  # no timestamps, no set ordering
    assert elapsed < 15, elapsed                    # measured ~1 s; quadratic would be minutes
    assert len(a) < 100 * n                         # compact JSON arrays: ~70 B a row here
    # The chart keeps ≤ 2 points per pixel (800-pixel plot width) instead of 100k.
    chart = re.search(r'<svg id="inference-chart".*?</svg>', a, re.DOTALL).group(0)
    points = re.search(r'points="([^"]*)"', chart).group(1).split()
    assert 2 <= len(points) <= 1600


# --- in a real browser ----------------------------------------------------------------------

def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("chromium not installed: apt-get install chromium to run the browser test")
    return exe


def _browse(path: Path, tmp: Path) -> tuple[str, list[str]]:
    """The DOM after the page ran, and the console lines chromium logged from the page."""
    p = subprocess.run(
        [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--disable-background-networking", "--no-first-run", f"--user-data-dir={tmp / 'prof'}",
         "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000", "--dump-dom",
         path.resolve().as_uri()], capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode == 0, p.stderr[-2000:]
    # Page console output looks like: [..:INFO:CONSOLE:3] "Uncaught ...", source: file:///...
    # The rest of stderr is chromium's own dbus/gpu noise.
    console = [ln for ln in p.stderr.splitlines() if ":CONSOLE" in ln or "Uncaught" in ln]
    return p.stdout, console


class _Dom(HTMLParser):
    """Rows of each table.data by id (cells as (data-v, text)), and SVG polylines' points."""

    def __init__(self, text: str):
        super().__init__()
        self.tables: dict[str, list[list[tuple[str | None, str]]]] = {}
        self.headers: dict[str, list[str]] = {}
        self.polylines: list[str] = []
        self.errors = self.ready = None
        self._table = self._cell = None
        self._in_errors = self._in_head = False
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "body":
            self.ready = a.get("data-ready")
        elif tag == "pre" and a.get("id") == "errors":
            self._in_errors, self.errors = True, ""
        elif tag == "table" and "data" in (a.get("class") or ""):
            self._table = a["id"]
            self.tables[self._table], self.headers[self._table] = [], []
        elif tag == "thead":
            self._in_head = True
        elif tag == "tr" and self._table and not self._in_head:
            self.tables[self._table].append([])
        elif tag in ("td", "th") and self._table:
            self._cell = [tag, a.get("data-v"), a.get("data-key"), ""]
        elif tag == "polyline":
            self.polylines.append(a.get("points", ""))

    def handle_data(self, data):
        if self._cell is not None:
            self._cell[3] += data
        if self._in_errors:
            self.errors += data

    def handle_endtag(self, tag):
        if tag == "pre":
            self._in_errors = False
        elif tag == "thead":
            self._in_head = False
        elif tag == "table":
            self._table = None
        elif tag in ("td", "th") and self._cell is not None:
            kind, v, key, text = self._cell
            if kind == "th":
                self.headers[self._table].append(key)
            else:
                self.tables[self._table][-1].append((v, text))
            self._cell = None


def _clean(dom: _Dom, console: list[str]) -> None:
    assert dom.ready == "1", "the page's script did not finish"
    assert dom.errors == "", dom.errors
    assert console == [], console


def _column(dom: _Dom, table: str, key: str) -> list[tuple[str | None, str]]:
    c = dom.headers[table].index(key)
    return [row[c] for row in dom.tables[table]]


def test_browser_inference_report(pages, tmp_path):
    t0 = time.perf_counter()
    text, console = _browse(pages["cnn"], tmp_path)
    dom = _Dom(text)
    _clean(dom, console)
    # the chart: one curve with a point per node (small_cnn's ONNX graph has 9 nodes)
    assert len(dom.polylines) == 1 and len(dom.polylines[0].split()) == 9
    # issue 48: the node table shows the nodes that matter; node 5, the Flatten (a view: no
    # FLOPs, no parameter, no byte written), waits behind the box
    assert [v for v, _ in _column(dom, "nodes", "index")] == ["0", "1", "2", "3", "4", "6",
                                                              "7", "8"]
    # raw numbers in data-v, human text shown: conv2's MACs 2·32·28·28·288 = 14,450,688
    assert ("14450688", "14.45M") in _column(dom, "nodes", "macs")
    assert len(dom.tables["modules"]) > 1 and len(dom.tables["ops"]) == 5  # Conv Gemm Relu …
    print(f"chromium run: {time.perf_counter() - t0:.1f} s")


def test_browser_the_box_shows_the_nodes_that_matter_little(pages, tmp_path):
    page = tmp_path / "all.html"
    driver = """<script>
      var box = document.querySelector('input.minor[data-table=nodes]');
      box.checked = true; box.dispatchEvent(new Event('change'));
    </script></body>"""
    page.write_text(pages["cnn"].read_text(encoding="utf-8").replace("</body>", driver),
                    encoding="utf-8")
    text, console = _browse(page, tmp_path)
    dom = _Dom(text)
    _clean(dom, console)
    assert [v for v, _ in _column(dom, "nodes", "index")] == [str(i) for i in range(9)]
    assert _column(dom, "nodes", "op")[5][1] == "Flatten"


def test_browser_training_report(pages, tmp_path):
    text, console = _browse(pages["train"], tmp_path)
    dom = _Dom(text)
    _clean(dom, console)
    # inference chart + training chart's plain and checkpointed curves
    assert len(dom.polylines) == 3 and all(len(p.split()) > 10 for p in dom.polylines)
    for shade in ("#e8f0fe", "#fdf1e5", "#e9f7ef"):   # forward, backward, optimizer phases
        assert f'fill="{shade}"' in text
    assert "Training step" in text and "What-ifs" in text and "Checkpoint plan" in text


def test_browser_sorting_and_filter(pages, tmp_path):
    # A copy of the report with a script that uses the page as a user would: click the FLOPs
    # header of the node table (first click: largest first), type a filter, and click the
    # module table's params header twice (ascending).
    page = tmp_path / "sorted.html"
    driver = """<script>
      document.querySelector('#nodes th[data-key=flops]').click();
      var box = document.querySelector('input.filter[data-table=nodes]');
      box.value = 'matmul'; box.dispatchEvent(new Event('input'));
      var th = document.querySelector('#modules th[data-key=params]'); th.click(); th.click();
    </script></body>"""
    page.write_text(pages["gpt2"].read_text(encoding="utf-8").replace("</body>", driver),
                    encoding="utf-8")
    text, console = _browse(page, tmp_path)
    dom = _Dom(text)
    _clean(dom, console)
    flops = [int(v) for v, _ in _column(dom, "nodes", "flops")]
    ops = {t for _, t in _column(dom, "nodes", "op")}
    assert len(flops) > 10 and ops == {"MatMul"}      # gpt2's matmuls, all of them matching
    assert flops == sorted(flops, reverse=True) and flops[0] > flops[-1]
    params = [int(v) for v, _ in _column(dom, "modules", "params")]
    assert params == sorted(params) and params[0] < params[-1]
    # numeric, not text, order: text order would put e.g. "1000" before "999"
    assert 'aria-sort="descending"' in text and 'aria-sort="ascending"' in text


def test_browser_escaping_and_row_cap(pages, tmp_path):
    page = tmp_path / "evil.html"
    trap = ("<head><script>window.alert = function () { "
            "document.documentElement.dataset.alerted = '1'; };</script>")
    driver = """<script>
      document.body.dataset.before = document.querySelectorAll('#nodes tbody tr').length;
      document.getElementById('nodes-all').click();
    </script></body>"""
    html = pages["evil"].read_text(encoding="utf-8")
    page.write_text(html.replace("<head>", trap, 1).replace("</body>", driver), encoding="utf-8")
    text, console = _browse(page, tmp_path)
    dom = _Dom(text)
    _clean(dom, console)
    assert "data-alerted" not in text                    # the trap never fired
    assert 'data-before="1000"' in text                 # capped at first…
    assert len(dom.tables["nodes"]) == CHAIN             # …all rows after "show all"
    assert dom.tables["nodes"][0][1][1] == EVIL          # the name shown as text, intact


def test_the_step_chart_comes_first_with_round_ticks(pages):
    # issue 48: a training report showed the activation-only chart above the step's, its
    # axis at quarters of the peak (778.50 KiB, 1.52 MiB…); now the step's chart is first,
    # and every tick is a whole number of a power-of-two size (0, 2 MiB, 4 MiB…)
    text = pages["train"].read_text(encoding="utf-8")
    assert text.index("training step memory") < text.index('id="inference-chart"')
    units = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for page in (text, pages["cnn"].read_text(encoding="utf-8")):
        for chart in re.findall(r"<svg.*?</svg>", page, re.DOTALL):
            ticks = re.findall(r'text-anchor="end">([^<]*)</text>', chart)
            assert ticks[0] == "0", ticks
            sizes = [float(v) * units[u] for v, u in (t.split() for t in ticks[1:])]
            # the first step a power of two bytes, every tick a whole number of steps
            step = sizes[0]
            assert step == int(step) and int(step) & (int(step) - 1) == 0, ticks
            assert sizes == [step * k for k in range(1, len(sizes) + 1)], ticks
    from graphcost.analyzer.render.plot import nice_axis, tick_label
    # a 3,188,740 B peak (3.04 MiB): steps of 1 MiB to 4 MiB; 10.32 MiB: 4 MiB steps to 12
    assert nice_axis(3_188_740) == (4 << 20, 1 << 20)
    assert nice_axis(10_823_792) == (12 << 20, 4 << 20)
    assert [tick_label(v) for v in range(0, 7 << 18, 3 << 18)] == ["0", "768 KiB", "1.5 MiB"]


def test_the_node_table_marks_the_nodes_that_matter_little():
    # a view (no FLOPs, no parameter, no byte written) is marked 1 past the columns, hidden
    # by the page until its box is ticked; a costed Relu is 0
    r = _synthetic(3)
    view = replace(r.nodes[1], op="Reshape", flops=0, bytes_written=0)
    text = html_report(replace(r, nodes=(r.nodes[0], view, r.nodes[2])))
    assert "show the 1 node(s) that compute nothing" in text
    blob = json.loads(re.search(r"id='gc-data'>(.*?)</script>", text, re.DOTALL).group(1))
    nodes = next(t for t in blob if t["id"] == "nodes")
    assert nodes["minor"] and [row[len(nodes["columns"])] for row in nodes["rows"]] == [0, 1, 0]
    assert "show the" not in html_report(r)


def test_the_headline_is_the_figure_that_decides_a_fit(tmp_path):
    # issue 26: a training report's HTML led with the activation peak (15.51 MiB) while the
    # step peak (21.70 MiB) decided the fit; now the first line after the title is the fit
    # (with a device) or the run's peak, and a chart without a plan does not say "plain"
    from graphcost import analyze
    r = analyze("zoo:small_cnn", batch=2, train=True, optimizer="adam")
    page = html_report(r)
    head = page[page.index("<p class='headline'"):page.index("</p>", page.index("headline"))]
    assert f"({r.training.peak_bytes:,} B) peak" in head and "optimizer state" in head
    assert r.memory.peak_bytes != r.training.peak_bytes and f"{r.memory.peak_bytes:,}" not in head
    assert ">plain<" not in page and "plain peak" not in page
    # with a device: the fit, the same needs as the report's one answer
    r = analyze("zoo:small_cnn", batch=2, train=True, optimizer="adam", device="t4")
    page = html_report(r)
    head = page[page.index("<p class='headline'"):page.index("</p>", page.index("headline"))]
    f = r.roofline.fit
    assert head.count("<b>") == 3 and "fits on NVIDIA T4" in head and f.fits
    from graphcost.analyzer.app.units import human_bytes
    assert f"needs <b>{human_bytes(f.needs)}</b> of {human_bytes(f.offers)}" in head
