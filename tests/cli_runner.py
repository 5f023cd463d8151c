"""The ``graphcost`` command run in this process: the same ``main`` the installed script calls,
with its stdout, stderr and exit status captured, minus a Python start and a torch import per
call. tests/test_cli.py runs the installed command itself as a subprocess."""
from __future__ import annotations

import contextlib
import io
import os
import subprocess


def run_cli(*args, env: dict | None = None) -> subprocess.CompletedProcess:
    from graphcost.analyzer.cli.main import main

    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    saved = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exc:  # argparse's own exits
                code = exc.code if isinstance(exc.code, int) else 2
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return subprocess.CompletedProcess(["graphcost", *argv], code, out.getvalue(),
                                       err.getvalue())


def run(*args, check_rc=None, columns: int = 200) -> subprocess.CompletedProcess:
    """``graphcost ARGS`` in this process at COLUMNS=``columns``; ``check_rc``: the status
    it must exit with."""
    p = run_cli(*args, env={"COLUMNS": str(columns)})
    if check_rc is not None:
        assert p.returncode == check_rc, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    return p
