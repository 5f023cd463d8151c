"""Runs shown ``graphcost`` commands for tests/test_docs.py, each in a process of its own forked
from this one, which has imported torch, transformers and graphcost once.

A fresh ``graphcost`` process spends most of a small command's time importing torch._dynamo
and transformers (4.5 s of the 6 s that ``graphcost path/to/net.py:Net`` takes on an idle
2-core machine, 13-22 s under the suite's load, the CUDA builds of the torch range slower).
Forked after those imports, each command still runs as the installed script runs it: its own
process, ``console()`` (the ``graphcost`` entry point) with its argv, stdout and stderr on
files, its exit status the process's. Nothing runs in this process before a fork but imports
and, on a CPU build of torch, one warm-up trace (``_warm_up``).

Protocol: ``python tests/docs_runner.py PARALLEL TIMEOUT`` in the working directory and the
environment the commands need; stdin: a JSON list of argv lists; stdout, once all have ended:
a JSON list of ``[status, output, seconds]`` in the same order (the output is stdout then
stderr; the status is -1 for a command killed at TIMEOUT seconds).
"""
from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
import traceback


def _child(argv: list[str], out, err) -> None:
    from graphcost.analyzer.cli.main import console

    os.dup2(out.fileno(), 1)
    os.dup2(err.fileno(), 2)
    sys.argv = ["graphcost", *argv]
    try:
        code = console()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (exc.code is not None)
    except BaseException:  # what the script would print before exiting 1
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _read(f) -> str:
    f.seek(0)
    return f.read().decode(errors="replace")


def run_all(jobs: list[list[str]], parallel: int, timeout: float) -> list[list]:
    results: list[list] = [[] for _ in jobs]
    todo, running, killed = list(enumerate(jobs)), {}, set()
    while todo or running:
        while todo and len(running) < parallel:
            i, argv = todo.pop(0)
            out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(argv, out, err)
            running[pid] = (i, time.monotonic(), out, err)
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            for child, (i, start, _, _) in running.items():
                if time.monotonic() - start > timeout and child not in killed:
                    os.kill(child, signal.SIGKILL)
                    killed.add(child)
            time.sleep(0.02)
            continue
        i, start, out, err = running.pop(pid)
        code = os.waitstatus_to_exitcode(status)
        text = _read(out) + _read(err)
        if pid in killed:
            code, text = -1, f"timed out after {timeout:.0f} s\n{text}"
        results[i] = [code, text, time.monotonic() - start]
    return results


def _warm_up() -> None:
    """One small training trace before any fork, on a CPU build of torch only: a process's
    first torch.export pays torch's lazy set-up (its operator tables, dynamo's and the fake
    tensors' caches), which every child would otherwise repeat (docs commands 148 -> 130 s of
    command time, 2026-12-04). A CUDA build's autograd starts its device threads on that
    first backward, and a forked child that runs one then fails ("Unable to handle autograd's
    threading in combination with fork-based multiprocessing": five docs commands on torch
    2.14.1), so there the children pay it. torch's thread pool is made here, one thread,
    before the forks: a child inherits it (two commands run at a time on a 2-core machine
    beside the suite's other worker)."""
    import torch

    from graphcost import analyze

    if torch.version.cuda is None and torch.version.hip is None:
        torch.set_num_threads(1)
        analyze("zoo:llama_tiny", train=True)


def main() -> None:
    import importlib.util

    import torch  # noqa: F401  the imports every child would otherwise repeat
    if importlib.util.find_spec("transformers"):
        # (and its quantizers' registry, read on the way to any model, which imports
        # torchao where installed: 0.3 s a command)
        import transformers  # noqa: F401
        import transformers.quantizers.auto  # noqa: F401

    import graphcost.analyzer.cli.main  # noqa: F401
    import graphcost.analyzer.frontends.torch.capture  # noqa: F401  (torch._dynamo)

    _warm_up()
    parallel, timeout = int(sys.argv[1]), float(sys.argv[2])
    json.dump(run_all(json.load(sys.stdin), parallel, timeout), sys.stdout)


if __name__ == "__main__":
    main()
