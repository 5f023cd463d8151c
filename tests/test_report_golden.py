"""Golden JSON reports: the schema (the tree of keys) and the exact bytes of a few zoo reports.

* ``tests/data/report_keys.json``: the key paths of four reports (dict keys joined by ``.``,
  a list's elements as ``[]``, the union over them). A key renamed, added or removed is a
  schema change: the snapshot is rewritten and ``SCHEMA_VERSION`` (analyzer/app/report.py) is
  bumped, together. The update refuses a new tree under the old version.
* ``tests/data/report_digests.json``: the sha256 of ``analyze("zoo:NAME", **request).to_json()``
  for six zoo models (DIGESTS: each one's inference and its training step under one or both
  training requests) and of the key tree's reports, by torch release (major.minor): figures
  differ slightly between torch releases (README, "Supported versions"), so a torch with no
  recorded digests skips. A refactor that changes none of graphcost's figures keeps them.

``GRAPHCOST_UPDATE_GOLDEN=1 python -m pytest tests/test_report_golden.py`` rewrites both files
(the digests of the torch it runs on) and skips, naming what it wrote.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path

import pytest
import torch
from graphcost.analyzer.app.report import SCHEMA_VERSION

from graphcost import analyze

DATA = Path(__file__).resolve().parent / "data"
KEYS_FILE = DATA / "report_keys.json"
DIGESTS_FILE = DATA / "report_digests.json"
UPDATE = os.environ.get("GRAPHCOST_UPDATE_GOLDEN") == "1"

# Objects whose keys are data, not fields (op types, dim names, dtypes): their keys are
# written "{}", so the tree is the schema's and not the model's or the torch release's ops.
MAPS = {"by_op_type", "dims", "totals.flops_by_dtype", "totals.param_bytes_by_dtype",
        "coverage.unsupported", "coverage.unknown_shape", "coverage.bounded"}

# Between them every section of the report is filled: inference, training with a device,
# serving, and a data-parallel training step.
KEY_REPORTS = {
    "mlp": ("zoo:mlp", {}),
    "mlp_train_a100": ("zoo:mlp", {"train": True, "device": "a100-80gb"}),
    "gpt2_serve": ("zoo:gpt2", {"serve": {"prompt": 64, "generate": 32}}),
    "mlp_fsdp8_h100": ("zoo:mlp", {"train": True, "parallel": {"strategy": "fsdp",
                                                                "world_size": 8},
                                   "device": "h100"}),
}

DIGEST_MODELS = ("small_cnn", "mlp", "resnet18", "gpt2", "bert", "llama_tiny")
DIGEST_REQUESTS = {
    "infer": {},
    "train": {"train": True},
    "train_a100": {"train": True, "device": "a100-80gb", "precision": "bf16-mixed"},
}
# Every model's inference (its cached ONNX export: cheap). A training request traces the
# model (~2 s for the larger ones), so each is digested under one request, the small CNN under
# both: the fp32 step on this CPU (its dropout masks, its attention kernel) for the decoder
# gpt2 and the encoder bert; the bf16-mixed step on an A100 (autocast's casts, the attention
# kernel an A100 runs) for the BatchNorm CNN resnet18 and the gated-SiLU decoder llama_tiny.
# The MLP's training steps are KEY_REPORTS' (fp32 on an A100, fully_shard over 8 H100s),
# digested too, with the serving review.
DIGESTS = tuple((name, "infer") for name in DIGEST_MODELS) + (
    ("small_cnn", "train"), ("gpt2", "train"), ("bert", "train"),
    ("small_cnn", "train_a100"), ("resnet18", "train_a100"), ("llama_tiny", "train_a100"))
TORCH = ".".join(torch.__version__.split("+")[0].split(".")[:2])


@functools.cache
def _report_json(model: str, request: str) -> str:
    """analyze(model, **request).to_json(), once per module (``request`` as JSON: hashable);
    zoo:mlp's inference serves both tests."""
    return analyze(model, **json.loads(request)).to_json()


def _json_of(model: str, request: dict) -> str:
    return _report_json(model, json.dumps(request, sort_keys=True))


def _digest(model: str, request: dict) -> str:
    return hashlib.sha256(_json_of(model, request).encode("utf-8")).hexdigest()


def key_paths(value, prefix: str = "") -> set[str]:
    out = set()
    if isinstance(value, dict):
        for key, v in value.items():
            path = f"{prefix}.{{}}" if prefix in MAPS else f"{prefix}.{key}" if prefix else key
            out.add(path)
            out |= key_paths(v, path)
    elif isinstance(value, list):
        for v in value:
            out |= key_paths(v, f"{prefix}[]")
    return out


def _write(path: Path, body: dict) -> None:
    DATA.mkdir(exist_ok=True)
    path.write_text(json.dumps(body, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def test_key_paths_read_fields_lists_and_maps():
    report = {"a": {"b": 1}, "nodes": [{"x": 1}, {"y": 2}], "by_op_type": {"Conv": {"flops": 1}}}
    assert key_paths(report) == {"a", "a.b", "nodes", "nodes[].x", "nodes[].y", "by_op_type",
                                 "by_op_type.{}", "by_op_type.{}.flops"}


def test_report_key_tree_is_the_snapshot():
    got = {name: sorted(key_paths(json.loads(_json_of(model, request))))
           for name, (model, request) in KEY_REPORTS.items()}
    stored = json.loads(KEYS_FILE.read_text(encoding="utf-8")) if KEYS_FILE.exists() else None
    if UPDATE:
        if stored is not None and stored["reports"] != got and \
                stored["schema_version"] == SCHEMA_VERSION:
            pytest.fail(f"the key tree changed but SCHEMA_VERSION is still {SCHEMA_VERSION}: "
                        "bump it in analyzer/app/report.py (and README's JSON section) first")
        _write(KEYS_FILE, {"schema_version": SCHEMA_VERSION, "reports": got})
        pytest.skip(f"GRAPHCOST_UPDATE_GOLDEN=1: wrote {KEYS_FILE}")
    assert stored is not None, f"no {KEYS_FILE}: run with GRAPHCOST_UPDATE_GOLDEN=1"
    changes = []
    for name, paths in got.items():
        was = set(stored["reports"].get(name, []))
        changes += [f"{name}: added {p}" for p in sorted(set(paths) - was)]
        changes += [f"{name}: removed {p}" for p in sorted(was - set(paths))]
    assert not changes, (
        "the JSON report's keys changed. A renamed, added or removed field is a schema change: "
        "bump SCHEMA_VERSION in analyzer/app/report.py (and README's JSON section), then "
        "update the snapshot with GRAPHCOST_UPDATE_GOLDEN=1 python -m pytest "
        "tests/test_report_golden.py\n" + "\n".join(changes))
    assert stored["schema_version"] == SCHEMA_VERSION, \
        "SCHEMA_VERSION changed: update the snapshot (GRAPHCOST_UPDATE_GOLDEN=1)"


def test_report_digests_are_the_recorded_ones():
    recorded = json.loads(DIGESTS_FILE.read_text(encoding="utf-8")) \
        if DIGESTS_FILE.exists() else {}
    if TORCH not in recorded and not UPDATE:
        pytest.skip(f"no report digests recorded for torch {TORCH} (recorded: "
                    f"{', '.join(sorted(recorded)) or 'none'}); figures differ slightly by "
                    "torch release. Record them with GRAPHCOST_UPDATE_GOLDEN=1")
    got = {f"{name}/{tag}": _digest(f"zoo:{name}", DIGEST_REQUESTS[tag]) for name, tag in DIGESTS}
    # (zoo:mlp's inference is mlp/infer)
    got |= {name: _digest(model, request) for name, (model, request) in KEY_REPORTS.items()
            if request}
    if UPDATE:
        _write(DIGESTS_FILE, {**recorded, TORCH: got})
        pytest.skip(f"GRAPHCOST_UPDATE_GOLDEN=1: wrote torch {TORCH}'s digests to "
                    f"{DIGESTS_FILE}")
    differ = sorted(k for k in got if got[k] != recorded[TORCH].get(k))
    assert not differ, (
        f"on torch {TORCH} these JSON reports are no longer byte-identical to the recorded ones: "
        f"{', '.join(differ)}. A refactor must keep them; a change meant to move a figure "
        "rewrites them (GRAPHCOST_UPDATE_GOLDEN=1) and says which figure moved and why.")
