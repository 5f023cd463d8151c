"""Golden JSON reports: the schema (the tree of keys) and the exact bytes of a few zoo reports.

* ``tests/data/report_keys.json``: the key paths of four reports (dict keys joined by ``.``,
  a list's elements as ``[]``, the union over them). A key renamed, added or removed is a
  schema change: the snapshot is rewritten and ``SCHEMA_VERSION`` (analyzer/app/report.py) is
  bumped, together. The update refuses a new tree under the old version.
* ``tests/data/report_digests.json``: the sha256 of ``analyze("zoo:NAME", **request).to_json()``
  for six zoo models under three requests, by torch release (major.minor): figures differ
  slightly between torch releases (README, "Supported versions"), so a torch with no
  recorded digests skips. A refactor that changes none of graphcost's figures keeps them.

``GRAPHCOST_UPDATE_GOLDEN=1 python -m pytest tests/test_report_golden.py`` rewrites both files
(the digests of the torch it runs on) and skips, naming what it wrote.
"""
from __future__ import annotations

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
TORCH = ".".join(torch.__version__.split("+")[0].split(".")[:2])


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
    got = {name: sorted(key_paths(json.loads(analyze(model, **request).to_json())))
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
    got = {f"{name}/{tag}": hashlib.sha256(
               analyze(f"zoo:{name}", **request).to_json().encode("utf-8")).hexdigest()
           for name in DIGEST_MODELS for tag, request in DIGEST_REQUESTS.items()}
    if UPDATE:
        _write(DIGESTS_FILE, {**recorded, TORCH: got})
        pytest.skip(f"GRAPHCOST_UPDATE_GOLDEN=1: wrote torch {TORCH}'s digests to "
                    f"{DIGESTS_FILE}")
    differ = sorted(k for k in got if got[k] != recorded[TORCH].get(k))
    assert not differ, (
        f"on torch {TORCH} these JSON reports are no longer byte-identical to the recorded ones: "
        f"{', '.join(differ)}. A refactor must keep them; a change meant to move a figure "
        "rewrites them (GRAPHCOST_UPDATE_GOLDEN=1) and says which figure moved and why.")
