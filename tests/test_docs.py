"""Every ``graphcost`` command the README and docs/*.md show, run as a user runs them.

What counts as a shown command, in any fenced block:

- ``$ graphcost …`` lines of a ```console block. The lines under one (trailing whitespace
  stripped; lines starting with ``…`` are elisions, skipped) are its output: each must appear in
  the real output. A ``…`` inside a line stands for a figure that differs between torch
  releases (the 8B step's spare bytes: cuDNN attention's workspace from 2.11 on, flash's
  before): the rest of the line must match.
- ``graphcost …`` lines of any other block (lists of example commands), and the ``graphcost …``
  that ends an install line (``… && graphcost zoo:resnet50 --batch 16``). Their placeholders
  (model.onnx, old.onnx/new.onnx, lm.onnx, path/to/net.py:Net, path/to/lm.py:LM, program.pt2,
  decoder_with_past.onnx, ./my-model/, meta-llama/Llama-3.1-8B, cpu.json) exist in the working
  directory, small stand-ins the ``workspace`` fixture writes; only the exit status is
  checked, and that the files a command writes (``--html F``, ``> F``) are there. Two are no stand-ins, so that
  a console block may show them: resnet50.onnx is the zoo's ResNet-50 export and the hub id
  meta-llama/Llama-3.1-8B its published config.json in a local hub cache.

Each command runs in that working directory with COLUMNS=100 and a local Hugging Face cache
(HF_HOME, HF_HUB_OFFLINE=1): one with shell syntax (pipes, redirections) through bash with the
installed ``graphcost`` on PATH, the others in processes forked from one that imported torch,
transformers and graphcost once (tests/docs_runner.py: the imports were most of a command's
time), the commands of one zoo or timm model one after another in one process, as a notebook
analyzes one model again (the later ones read the traces the first kept, and must still print
what the page shows). A trailing ``# comment`` is not part of the command; ``# exit N`` states the
exit status, otherwise it is 0. ``timm:`` commands are skipped when timm is not installed.

The commands run two at a time in one module-scoped fixture (the zoo:llama7b ones take 5–15 s
each), a command shown on several pages once; each shown command's test then checks its result.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PARALLEL = 2          # commands at once: more only slows each down on a 2-core runner
TIMEOUT = 120         # seconds per command; the slowest (zoo:llama7b) take about 15
ZOO_CACHE = ROOT / ".cache" / "zoo"   # the zoo's exports, unless $GRAPHCOST_CACHE says
# a command that needs a package the dev environment may lack: (prefix, module)
NEEDS = [("graphcost timm:", "timm")]
# commands shown but deliberately not run, with why. A new entry needs a reason that no
# stand-in can serve.
NOT_RUN: dict[str, str] = {
    "graphcost calibrate -o cpu.json": "a minute of measurements on this machine: "
    "tests/test_time_estimate.py runs the command itself over a few small sizes",
    "graphcost calibrate --device h200 -o h200.json": "needs a CUDA GPU: tests/"
    "test_gpu_calibration.py runs its code on this CPU at tiny sizes; the profile it wrote on "
    "an H200 is benchmarks/results/cuda_h200_profile.json, h200.json in the docs' workspace",
    "graphcost plan zoo:llama3_8b --serve --gpus 8 --device h100-sxm --prompt 2048 --generate "
    "256 --ttft 2s --tpot 50ms": "about two minutes (eight traces of the 8B): tests/"
    "test_serve_plan.py runs the same search on llama_tiny; its output is benchmarks/results/"
    "serve_plan_8b.md",
    "graphcost zoo:llama3_8b --train --batch 8 --dim seq=8192 --parallel pp=4 --microbatches 8 "
    "--precision bf16-master --checkpoint full --optimizer adamw --device h100-sxm": "about 15 s "
    "(seven traces of the 8B's stages): tests/test_pipeline_parallel.py runs the same path on "
    "Llama 3 8B's stages; its figures are benchmarks/results/large_layouts.md's",
    "graphcost zoo:llama3_405b --train --batch 32 --dim seq=8192 --parallel "
    "pp=8,dp_shard=8,tp=8 --precision bf16-master --checkpoint full --optimizer adamw --device "
    "h100-sxm": "about 20 s (nine traces of the 405B's stages): tests/test_pipeline_parallel.py "
    "reads a long stage off its short traces against the whole one; its figures are "
    "benchmarks/results/large_layouts.md's",
}


@dataclass
class Command:
    where: str                       # page:line
    cmd: str                         # the command, its trailing comment removed
    status: int = 0                  # the exit status the page states
    shown: list[str] = field(default_factory=list)   # the output lines a console block shows
    console: bool = False

    def missing_module(self) -> str | None:
        if self.cmd.startswith("graphcost timm:"):
            from graphcost.analyzer.frontends.torch.optional_imports import (
                torchvision_problem,
            )
            if torchvision_problem():
                return "a torchvision that imports beside this torch"
        return next((mod for prefix, mod in NEEDS if self.cmd.startswith(prefix)
                     and importlib.util.find_spec(mod) is None), None)


def split_comment(line: str) -> tuple[str, int]:
    """The command without its trailing ``# …`` comment, and the exit status a ``# exit N``
    comment states (0 without one)."""
    comment = re.search(r"\s+#(.*)$", line)
    if not comment:
        return line.strip(), 0
    status = re.fullmatch(r"\s*exit\s+(\d+)\s*", comment.group(1))
    return line[:comment.start()].strip(), int(status.group(1)) if status else 0


def commands_in(page: Path) -> list[Command]:
    """The commands a page shows, in its fenced blocks, in order."""
    found, lines = [], page.read_text().splitlines()
    i = 0
    while i < len(lines):
        if not lines[i].startswith("```"):
            i += 1
            continue
        console, current = lines[i].strip() == "```console", None
        i += 1
        while i < len(lines) and not lines[i].startswith("```"):
            line, where = lines[i].rstrip(), f"{page.name}:{i + 1}"
            i += 1
            if console and line.startswith("$ "):
                current = Command(where, *split_comment(line[2:]), console=True)
                found.append(current)
            elif console:
                if current is not None and line.strip() and not line.strip().startswith("…"):
                    current.shown.append(line)
            elif line.startswith("$ graphcost "):   # output shown outside a console block
                found.append(Command(where, "", 0, [line]))
            elif line.startswith("graphcost ") or " && graphcost " in line:
                found.append(Command(where, *split_comment(line[line.find("graphcost "):])))
        i += 1
    return found


COMMANDS = [c for page in PAGES for c in commands_in(page)]


def test_there_are_commands_to_run():
    stray = [c.where for c in COMMANDS if not c.cmd]
    assert not stray, f"`$ graphcost` lines outside a ```console block (never checked): {stray}"
    assert all(c.cmd.startswith("graphcost ") for c in COMMANDS)
    # the commands run at COLUMNS=100: a longer shown line was made at another width
    wide = [f"{c.where}: {line}" for c in COMMANDS for line in c.shown if len(line) > 100]
    assert not wide, "shown output lines over 100 characters:\n" + "\n".join(wide)
    console = sum(c.console for c in COMMANDS)
    print(f"\ntest_docs: {len(COMMANDS)} commands ({len({c.cmd for c in COMMANDS})} distinct): "
          f"{console} console, {len(COMMANDS) - console} with stand-ins; not run: {len(NOT_RUN)}")
    assert console >= 15 and len(COMMANDS) >= 50


# --- the stand-ins for the placeholders --------------------------------------------------------

NET_PY = '''\
"""The stand-in for the user's path/to/net.py: a small CNN taking an image x."""
from torch import nn


class Net(nn.Module):
    def __init__(self, width=8):
        super().__init__()
        self.layer1 = nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.ReLU())
        self.layer2 = nn.Sequential(nn.Conv2d(width, 2 * width, 3, stride=2, padding=1),
                                    nn.ReLU())
        self.head = nn.Linear(2 * width, 10)

    def forward(self, x):
        return self.head(self.layer2(self.layer1(x)).mean((2, 3)))
'''

LM_PY = '''\
"""The stand-in for the user's path/to/lm.py: a two-block language model taking input_ids."""
from torch import nn


class LM(nn.Module):
    def __init__(self, vocab=1000, dim=64):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.Sequential(*(nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, 4 * dim),
                                                    nn.GELU(), nn.Linear(4 * dim, dim))
                                      for _ in range(2)))
        self.head = nn.Linear(dim, vocab)

    def forward(self, input_ids):
        return self.head(self.blocks(self.embed(input_ids)))
'''


def load_source(path: Path) -> dict:
    scope: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), scope)
    return scope


def export_onnx(module, args, path: Path, dims: dict) -> None:
    import torch

    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")   # the TorchScript exporter's deprecation notice
        torch.onnx.export(module.eval(), args, str(path), dynamo=False, opset_version=17,
                          input_names=list(dims), dynamic_axes=dims)


def write_decoder_with_past(path: Path) -> None:
    """transformers' GPT-2 step with its cache as inputs and outputs, the layout of a
    decoder-with-past export (as tests/test_serving.py builds it)."""
    import torch
    from graphcost.analyzer.frontends.torch.serve import HFStep
    from graphcost.models_zoo import hf

    past = [f"past_key_values.{i}.{w}" for i in range(2) for w in ("key", "value")]
    present = [f"present.{i}.{w}" for i in range(2) for w in ("key", "value")]
    axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "total"},
            "logits": {0: "batch", 1: "sequence"},
            **{n: {0: "batch", 2: "past"} for n in past},
            **{n: {0: "batch", 2: "total"} for n in present}}
    args = (torch.zeros(2, 1, dtype=torch.long), torch.ones(2, 8, dtype=torch.long),
            *(torch.zeros(2, 4, 7, 16) for _ in past))
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(HFStep(hf.gpt2().eval()), args, str(path), dynamo=False,
                          opset_version=17, input_names=["input_ids", "attention_mask", *past],
                          output_names=["logits", *present], dynamic_axes=axes)


def write_hub_cache(home: Path, repo: str, config: dict, rev: str = "0123abcd") -> None:
    """The layout huggingface_hub writes (as tests/test_hub_models.py does): a config only."""
    folder = home / "hub" / ("models--" + repo.replace("/", "--"))
    (folder / "snapshots" / rev).mkdir(parents=True)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(rev)
    (folder / "snapshots" / rev / "config.json").write_text(json.dumps(config))


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """A working directory holding a small stand-in for every placeholder the pages use."""
    import torch

    from tests.test_hub_models import LLAMA_31_8B

    ws = tmp_path_factory.mktemp("docs")
    (ws / "path" / "to").mkdir(parents=True)
    (ws / "path" / "to" / "net.py").write_text(NET_PY)
    (ws / "path" / "to" / "lm.py").write_text(LM_PY)
    net = load_source(ws / "path" / "to" / "net.py")["Net"]
    torch.manual_seed(0)
    image = (torch.zeros(1, 3, 224, 224),)
    # model.onnx: an image model, batch symbolic, so that --input-shape x=1x3x224x224 applies
    # and its nodes carry module paths (/layer1/…) for --checkpoint layer1,layer2
    for name, width in (("model.onnx", 8), ("old.onnx", 8), ("new.onnx", 16)):
        export_onnx(net(width), image, ws / name, {"x": {0: "batch"}})
    # lm.onnx: a token model whose sequence length is the symbolic dim seq
    export_onnx(load_source(ws / "path" / "to" / "lm.py")["LM"](),
                (torch.zeros(1, 16, dtype=torch.long),), ws / "lm.onnx",
                {"input_ids": {0: "batch", 1: "seq"}})
    torch.export.save(torch.export.export(net().eval(), image), str(ws / "program.pt2"))
    write_decoder_with_past(ws / "decoder_with_past.onnx")
    # the hub id runs on its published config; the local folder is a two-layer Llama
    write_hub_cache(ws / "hf", "meta-llama/Llama-3.1-8B", LLAMA_31_8B)
    # resnet50.onnx: the zoo's own export (the README's ONNX file), from the cache the
    # commands use
    from graphcost.models_zoo.export import cached_export
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRAPHCOST_CACHE", os.environ.get("GRAPHCOST_CACHE", str(ZOO_CACHE)))
        shutil.copy(cached_export("resnet50"), ws / "resnet50.onnx")
    # cpu.json: a device profile as graphcost calibrate writes one (its rates flat: 1 GFLOP/s,
    # 1 GB/s, a 1 µs launch; tests/test_time_estimate.py)
    from graphcost.passes.device.profile import profile_to_json

    from tests.test_time_estimate import flat_profile
    (ws / "cpu.json").write_text(json.dumps(profile_to_json(flat_profile())))
    # h200.json: the profile graphcost calibrate --device h200 wrote on an H200
    shutil.copy(ROOT / "benchmarks" / "results" / "cuda_h200_profile.json", ws / "h200.json")
    (ws / "my-model").mkdir()
    (ws / "my-model" / "config.json").write_text(json.dumps(
        {**LLAMA_31_8B, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000}))
    return ws


# --- running them -----------------------------------------------------------------------------

@dataclass
class Result:
    status: int
    out: list[str]
    took: float


def run(cmd: str, cwd: Path, env: dict) -> Result:
    start = time.monotonic()
    try:
        proc = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:   # that command's test fails, not every command's
        return Result(-1, [f"timed out after {TIMEOUT} s"], time.monotonic() - start)
    out = [line.rstrip() for line in (proc.stdout + proc.stderr).splitlines()]
    return Result(proc.returncode, out, time.monotonic() - start)


# what only a shell reads: such a command runs through bash, the others in tests/docs_runner.py
SHELL_SYNTAX = re.compile(r"[|<>;&$`*?~'\"\\]")


def run_forked(cmds: list[str], cwd: Path, env: dict) -> list[Result]:
    """Commands without shell syntax, in processes forked from one that imported torch,
    transformers and graphcost once (tests/docs_runner.py says why and which share one)."""
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "docs_runner.py"), str(PARALLEL),
                           str(TIMEOUT)], input=json.dumps([c.split()[1:] for c in cmds]),
                          cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT * len(cmds))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [Result(status, [line.rstrip() for line in out.splitlines()], took)
            for status, out, took in json.loads(proc.stdout)]


@pytest.fixture(scope="module")
def results(workspace, request) -> dict[str, Result]:
    """Every runnable command's result, keyed by the command: one shown on several pages (the
    7B serving example, the install line's) runs once. Only the commands of the tests
    collected run (pytest -k, --torch-range)."""
    exe = shutil.which("graphcost")
    assert exe, "graphcost is not on PATH (pip install -e . first)"
    env = dict(os.environ, COLUMNS="100", HF_HOME=str(workspace / "hf"), HF_HUB_OFFLINE="1",
               PATH=f"{Path(exe).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    env.setdefault("GRAPHCOST_CACHE", str(ZOO_CACHE))
    collected = {item.callspec.params["c"].cmd for item in request.session.items
                 if getattr(item, "originalname", "") == "test_shown_command"}
    todo = {c.cmd for c in COMMANDS if c.cmd in collected and c.cmd not in NOT_RUN
            and not c.missing_module()}
    # the slow ones first, so that the fast ones fill the other slot meanwhile
    todo = sorted(todo, key=lambda cmd: ("llama7b" not in cmd and "Llama-3.1" not in cmd, cmd))
    forked = [cmd for cmd in todo if not SHELL_SYNTAX.search(cmd)]
    done = dict(zip(forked, run_forked(forked, workspace, env)))
    shell = [cmd for cmd in todo if cmd not in done]
    with ThreadPoolExecutor(PARALLEL) as pool:
        done.update(zip(shell, pool.map(lambda cmd: run(cmd, workspace, env), shell)))
    return done


def shown_in(line: str, out: list[str]) -> bool:
    """``line`` is a line of ``out``, a ``…`` in it standing for any text."""
    if "…" not in line:
        return line in out
    pattern = re.compile(".*".join(map(re.escape, line.split("…"))))
    return any(pattern.fullmatch(o) for o in out)


def written_files(cmd: str) -> list[str]:
    """The files a command says it writes: ``--html F``, ``--output F``, ``> F``."""
    return re.findall(r"(?:--html|--output|>)\s+(\S+)", cmd)


# On every torch of the range (conftest.py): each command whose output the README shows, as
# the output may differ between releases (fasterrcnn_tiny's graph has more nodes on 2.8); the
# other pages' (half a minute of each range run) and the stand-ins' commands, checked for
# their exit status, run on the pinned torch only (the torch paths they take are the range's
# own tests)
EVERY_TORCH_PAGES = ("README.md:",)


def every_torch(c: Command) -> bool:
    return c.console and c.where.startswith(EVERY_TORCH_PAGES)


@pytest.mark.parametrize("c", [pytest.param(c, marks=[pytest.mark.every_torch] * every_torch(c))
                               for c in COMMANDS], ids=[c.where for c in COMMANDS])
def test_shown_command(c, results, workspace):
    assert c.cmd, f"{c.where}: a `$ graphcost` line outside a ```console block is never checked"
    if c.cmd in NOT_RUN:
        pytest.skip(f"not run: {NOT_RUN[c.cmd]}")
    if c.missing_module():
        pytest.skip(f"needs {c.missing_module()}, not installed here")
    r = results[c.cmd]
    assert r.status == c.status, (
        f"{c.where}: `{c.cmd}` exited {r.status}, the page says {c.status}\n"
        + "\n".join(r.out[-20:]))
    missing = [line for line in c.shown if not shown_in(line, r.out)]
    assert not missing, (f"{c.where}: `{c.cmd}` no longer prints these shown lines:\n"
                         + "\n".join(missing) + "\n--- real output:\n" + "\n".join(r.out))
    for name in written_files(c.cmd):
        assert (workspace / name).stat().st_size > 0, f"{c.where}: `{c.cmd}` wrote no {name}"
    print(f"{c.where}: {r.took:.1f} s")
