"""Every model type of transformers' task mappings, from its config, as a user's config.json.

For each type of the mappings named (``MODEL_FOR_CTC_MAPPING_NAMES``, …: transformers' auto
classes), its default config shrunk as the breadth sweep shrinks it (sweep_hf.py ``shrink``:
width 64, 2 layers, …) is written as a config.json naming the mapping's class and analyzed
with the command line, a training step of 2 samples (``--train --batch 2``, plus the options
given after ``--``) in a process of its own. Prints each type that fails, in the error's own
line, then the counts. A failure of a shrunk config can be the shrinking's (a config left
inconsistent); one of the published config is graphcost's to mend.

    python -m benchmarks.sweep_tasks MODEL_FOR_CTC_MAPPING_NAMES [...] [-- --dim seq=32]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor


def _case(mapping: str, model_type: str, extra: list[str]) -> str:
    """'' where the type trains, else its one line of error."""
    import transformers
    from transformers.models.auto import modeling_auto

    from benchmarks.sweep_hf import shrink

    name = getattr(modeling_auto, mapping)[model_type]
    name = name[0] if isinstance(name, (list, tuple)) else name
    try:
        config = shrink(transformers.AutoConfig.for_model(model_type), width=True)
        data = json.loads(config.to_json_string())
    except Exception as exc:  # noqa: BLE001 - the config's own refusal, reported
        return f"config: {str(exc).splitlines()[0][:120]}"
    folder = tempfile.mkdtemp(prefix=model_type)
    with open(os.path.join(folder, "config.json"), "w") as fh:
        json.dump({**data, "architectures": [name]}, fh)
    try:
        run = subprocess.run(["graphcost", folder, "--train", "--batch", "2", *extra],
                             capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return "timed out after 300 s"
    lines = [ln for ln in run.stderr.splitlines() if ln.startswith("graphcost:")]
    return "" if run.returncode == 0 else (lines[-1] if lines else f"exit {run.returncode}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mappings", nargs="+")
    parser.add_argument("--workers", type=int, default=2)
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    from transformers.models.auto import modeling_auto

    cases = [(m, t) for m in args.mappings for t in sorted(getattr(modeling_auto, m))]
    with ThreadPoolExecutor(args.workers) as pool:
        said = list(pool.map(lambda c: _case(*c, extra), cases))
    for (mapping, model_type), line in zip(cases, said):
        if line:
            print(f"| {mapping.removeprefix('MODEL_FOR_').removesuffix('_MAPPING_NAMES')} "
                  f"| {model_type} | {line} |", flush=True)
    failed = sum(1 for line in said if line)
    print(f"\n{len(cases)} model types: {len(cases) - failed} trained, {failed} failed")


if __name__ == "__main__":
    main()
