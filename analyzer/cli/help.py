"""What the command says about itself: the usage a bare ``graphcost`` prints, ``--version``,
and the parser whose errors are one line and name the option that was meant."""
from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from typing import Any, TypeVar, overload

from ...passes.errors import did_you_mean

EXIT_BAD_INPUT = 2  # analyzer/cli/main.py's: bad input, one line

# A bare `graphcost` used to print only "the following arguments are required: model"; a first
# run gets what a model is and three commands that work (tests/test_first_contact.py runs
# their options through the parser, so an example cannot go stale). Lines fit 80 columns.
EXAMPLES = (
    ("graphcost model.onnx --batch 16", "FLOPs, params, peak memory"),
    ("graphcost zoo:resnet50 --train --device h100", "does a training step fit?"),
    ("graphcost devices", "the devices --device knows"),
)


def bare_usage(subcommands) -> str:
    """The short usage of a bare ``graphcost``: what a model is, three examples, where next."""
    width = max(len(cmd) for cmd, _ in EXAMPLES) + 2
    return "\n".join([
        "usage: graphcost MODEL [options]",
        "MODEL: an .onnx file, a .pt2 from torch.export.save, file.py:Class, zoo:NAME,",
        "       timm:NAME (timm installed), a Hugging Face id (ORG/NAME) or a local",
        "       config.json or its folder (only the config is read, never weights)",
        "examples:",
        *(f"  {cmd:<{width}}{what}" for cmd, what in EXAMPLES),
        "graphcost --help lists every option;",
        f"subcommands: {', '.join(subcommands)}",
    ]) + "\n"


def unrecognized(parser: argparse.ArgumentParser, extras: list[str]) -> str:
    """argparse's "unrecognized arguments" as the options it could not place, each with the
    nearest real option (Python 3.11's argparse suggests none: `--bach` said only
    "unrecognized arguments: --bach 3"). Words after an unknown option are its value, not
    news; without an unknown option, argparse's own message stands."""
    unknown = [e.split("=", 1)[0] for e in extras if e.startswith("-") and e.lstrip("-")
               and not e.lstrip("-")[0].isdigit()]
    if not unknown:
        return f"unrecognized arguments: {' '.join(extras)}"
    # compared without the dashes every option shares, which would make any two look alike
    known = [s[2:] for a in parser._actions for s in a.option_strings if s.startswith("--")]
    named = ", ".join(f"{u}{did_you_mean(u.lstrip('-'), known, '--{}')}" for u in unknown)
    return (f"unknown option{'s' if len(unknown) > 1 else ''} {named}; "
            f"{parser.prog} --help lists every option")


_N = TypeVar("_N")  # the namespace parse_args fills


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors, exit 2 (its usage block would bury the message)."""

    def error(self, message: str):
        sys.stderr.write(f"graphcost: error: {message}\n")
        raise SystemExit(EXIT_BAD_INPUT)

    # argparse's three signatures (typeshed's overloads), so that this override matches them
    @overload
    def parse_args(self, args: Iterable[str] | None = None, namespace: None = None
                   ) -> argparse.Namespace: ...
    @overload
    def parse_args(self, args: Iterable[str] | None, namespace: _N) -> _N: ...
    @overload
    def parse_args(self, *, namespace: _N) -> _N: ...

    def parse_args(self, args: Iterable[str] | None = None, namespace: Any = None) -> Any:
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(unrecognized(self, extras))
        return namespace


def versions_line() -> str:
    """graphcost's version and the installed versions of what it runs on (a bug report's
    first line), read from the packages' metadata: nothing is imported."""
    from importlib.metadata import PackageNotFoundError, version

    parts = []
    for dist in ("torch", "onnx", "onnxruntime", "transformers"):
        try:
            parts.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            parts.append(f"{dist} not installed")
    return f"graphcost {version('graphcost')} ({', '.join(parts)}; Python {sys.version.split()[0]})"


class Version(argparse.Action):
    """--version: the versions are read when asked for (an analysis opens no metadata file)."""

    def __call__(self, parser, namespace, values, option_string=None):
        sys.stdout.write(versions_line() + "\n")
        parser.exit()
