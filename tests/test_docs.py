"""The commands the README and docs/*.md show, run as a user runs them.

Only fenced ```console blocks run (lines starting with ``$ ``); ```text and plain blocks are
shown, never run (the slow ones, 7B models, live there). Each ``$ graphcost …`` command runs
through the installed ``graphcost`` on PATH with COLUMNS=100; its exit status must be 0, or the
one a trailing ``# exit N`` comment states. Each output line shown under a command (trailing
whitespace stripped, lines that are just ``…`` skipped) must appear in the real output.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
ELIDED = {"…", "...", "[…]"}


def console_commands():
    """(page, line, command, expected exit status, shown output lines) of every console block."""
    found = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        i = 0
        while i < len(lines):
            if lines[i].strip() != "```console":
                i += 1
                continue
            i += 1
            current = None
            while i < len(lines) and lines[i].strip() != "```":
                line = lines[i].rstrip()
                if line.startswith("$ "):
                    cmd, status = line[2:], 0
                    m = re.search(r"\s+#\s*exit\s+(\d+)\s*$", cmd)
                    if m:
                        cmd, status = cmd[:m.start()], int(m.group(1))
                    current = (f"{page.name}:{i + 1}", cmd, status, [])
                    found.append(current)
                elif current is not None and line.strip() and line.strip() not in ELIDED:
                    current[3].append(line)
                i += 1
            i += 1
    return found


COMMANDS = console_commands()


def test_there_are_commands_to_run():
    assert len(COMMANDS) >= 5, COMMANDS
    print(f"\ntest_docs: {len(COMMANDS)} console commands")


@pytest.mark.parametrize("where,cmd,status,shown", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_console_command(where, cmd, status, shown, tmp_path):
    argv = shlex.split(cmd)
    assert argv[0] == "graphcost", f"{where}: console blocks run graphcost only: {cmd}"
    exe = shutil.which("graphcost")
    assert exe, "graphcost is not on PATH (pip install -e . first)"
    env = dict(os.environ, COLUMNS="100")
    env.setdefault("GRAPHCOST_CACHE", str(ROOT / ".cache" / "zoo"))
    start = time.monotonic()
    proc = subprocess.run([exe, *argv[1:]], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    took = time.monotonic() - start
    out = [line.rstrip() for line in (proc.stdout + proc.stderr).splitlines()]
    assert proc.returncode == status, (
        f"{where}: `{cmd}` exited {proc.returncode}, the page says {status}\n"
        + "\n".join(out[-20:]))
    missing = [line for line in shown if line not in out]
    assert not missing, (f"{where}: `{cmd}` no longer prints these shown lines:\n"
                         + "\n".join(missing) + "\n--- real output:\n" + "\n".join(out))
    print(f"{where}: {took:.1f} s")
