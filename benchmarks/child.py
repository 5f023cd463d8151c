"""One measurement in a fresh Python process, so that its time and peak RSS are its own."""
from __future__ import annotations

import json
import subprocess
import sys


def run(code: str, timeout: float | None = None) -> dict:
    """Run ``code``; its last stdout line is a JSON object. A failure comes back as
    ``{"error": <its last stderr line>}`` (or the timeout), so a table can say which case
    failed and why."""
    try:
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if p.returncode != 0:
        lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
        return {"error": lines[-1] if lines else f"exit {p.returncode}"}
    return json.loads(p.stdout.strip().splitlines()[-1])


def write_rows(rows: list[str], path: str | None) -> None:
    """A table's rows to ``path`` (``--markdown``), if one is given."""
    if path:
        with open(path, "w") as fh:
            fh.write("\n".join(rows) + "\n")


def add_row(rows: list[str], line: str) -> None:
    """``line`` added to a table's rows and printed as it is measured."""
    rows.append(line)
    print(line, flush=True)
