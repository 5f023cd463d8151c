"""Runs shown ``graphcost`` commands for tests/test_docs.py in processes forked from this one,
which has imported torch, transformers and graphcost once.

A fresh ``graphcost`` process spends most of a small command's time importing torch._dynamo
and transformers (4.5 s of the 6 s that ``graphcost path/to/net.py:Net`` takes on an idle
2-core machine, 13-22 s under the suite's load, the CUDA builds of the torch range slower).
Forked after those imports, each command still runs as the installed script runs it:
``console()`` (the ``graphcost`` entry point) with its argv, stdout and stderr on files of its
own, its exit status the script's. The commands that analyze one model graphcost names
(``zoo:NAME``, ``timm:NAME``) run one after another in one child, as a notebook's analyses
of one model do: the later ones read the traces the earlier ones kept
(analyzer/load/trace_cache.py), and their output must still be what the page shows. Every
other command has a child of its own. Nothing runs in this process before a fork but imports
and, on a CPU build of torch, one warm-up trace (``_warm_up``).

Protocol: ``python tests/docs_runner.py PARALLEL TIMEOUT`` in the working directory and the
environment the commands need; stdin: a JSON list of argv lists; stdout, once all have ended:
a JSON list of ``[status, output, seconds]`` in the same order (the output is stdout then
stderr; the status is -1 for a command killed at TIMEOUT seconds, which kills the commands of
its child not yet run too).
"""
from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
import traceback


def _console(argv: list[str]) -> int:
    from graphcost.analyzer.cli.main import console

    sys.argv = ["graphcost", *argv]
    try:
        code = console()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (exc.code is not None)
    except BaseException:  # what the script would print before exiting 1
        traceback.print_exc()
        code = 1
    return int(code or 0)


def _child(argvs: list[list[str]], files: list) -> None:
    """Each command with its stdout and stderr on its own files, its status and seconds
    written to its third when it ends."""
    for argv, (out, err, status) in zip(argvs, files):
        start = time.monotonic()
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        code = _console(argv)
        sys.stdout.flush()
        sys.stderr.flush()
        status.write(f"{code} {time.monotonic() - start}".encode())
        status.flush()
    os._exit(0)


def _read(f) -> str:
    f.seek(0)
    return f.read().decode(errors="replace")


def groups(jobs: list[list[str]]) -> list[list[int]]:
    """The jobs' indices, those naming one registry model together (in the order their
    first came), every other job alone."""
    out: list[list[int]] = []
    by_model: dict[str, list[int]] = {}
    for i, argv in enumerate(jobs):
        model = next((a for a in argv if a.startswith(("zoo:", "timm:"))), None)
        if model is None:
            out.append([i])
        elif model in by_model:
            by_model[model].append(i)
        else:
            out.append(by_model.setdefault(model, [i]))
    return out


def run_all(jobs: list[list[str]], parallel: int, timeout: float) -> list[list]:
    results: list[list] = [[] for _ in jobs]
    # (the largest groups first, so that single commands fill the other slot meanwhile)
    todo, running, killed = sorted(groups(jobs), key=len, reverse=True), {}, set()
    while todo or running:
        while todo and len(running) < parallel:
            group = todo.pop(0)
            files = [tuple(tempfile.TemporaryFile() for _ in range(3)) for _ in group]
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child([jobs[i] for i in group], files)
            running[pid] = (group, time.monotonic(), files)
        pid, _ = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            for child, (group, start, _) in running.items():
                if time.monotonic() - start > timeout * len(group) and child not in killed:
                    os.kill(child, signal.SIGKILL)
                    killed.add(child)
            time.sleep(0.02)
            continue
        group, start, files = running.pop(pid)
        for i, (out, err, status) in zip(group, files):
            text, ended = _read(out) + _read(err), _read(status).split()
            if ended:
                results[i] = [int(ended[0]), text, float(ended[1])]
            else:   # killed at the group's timeout, or the child died before it ended
                why = f"timed out after {timeout:.0f} s a command" if pid in killed else \
                    "its process died"
                results[i] = [-1, f"{why}\n{text}", time.monotonic() - start]
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
