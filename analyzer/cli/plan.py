"""``graphcost plan MODEL --gpus N --device GPU``: the fastest training setting that fits
(analyzer/app/plan.py), and the command that analyzes it alone."""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from ...passes.errors import GraphcostError
from ..app.devices import GPUS_PER_NODE
from ..app.plan import Candidate, plan_training
from ..app.plan_settings import CHECKPOINTS, PlanSpec
from ..app.units import parse_count
from .engine_args import torchrun_line, torchtitan_args
from .main import Parser, refuse_overwrite
from .model_options import add_model_args, analysis_kwargs, progress
from .output import check_writable, fitted, terminal_width
from .serve_plan import add_serve_plan_args, run_serve

# the options a plan sets per candidate or reads itself: not passed on to its command line
OWN = {"gpus", "global_batch", "global_tokens", "tp", "pp", "ep", "cp", "top", "format", "output", "checkpoint", "batch",
       "precision", "optimizer", "train", "parallel", "model", "serve", "prompt", "generate",
       "ttft", "tpot", "weight_dtype", "kv_dtype", "cp_rotate"}


def build_parser():
    p = Parser(prog="graphcost plan", description=(
        "Search the layouts (FSDP, HSDP, DDP beside each tensor-parallel size; pipeline "
        "stages beside FSDP and HSDP where no layout without them fits; expert parallelism "
        "beside FSDP, HSDP and pipeline stages for a mixture of experts; context "
        "parallelism beside FSDP where no layout without it fits), checkpoint "
        "plans (none, sac, full) and batches of a training step on N GPUs; keep those whose "
        "every rank fits --device and rank them by the time estimate's tokens/s per GPU. "
        "Each candidate is what `graphcost MODEL --train --parallel MESH …` gives, and the "
        "best's command line is printed last. With --serve: the serving replicas (tensor-"
        "parallel size), the sequences each serves at once and the dtypes with the most "
        "output tokens/s within --ttft/--tpot, ending on vLLM's arguments."),
        conflict_handler="resolve")
    add_model_args(p)
    p.add_argument("--checkpoint", metavar="none,sac,full",
                   help="the checkpoint plans to try (default all three: none, torchtitan's "
                        "selective op policy, every block)")
    p.set_defaults(train=True, precision="bf16-master", optimizer="adamw")
    p.add_argument("--gpus", type=int, required=True, metavar="N",
                   help="the GPUs the step runs on (eight a node)")
    p.add_argument("--global-batch", type=int, metavar="SEQS",
                   help="the step's batch (sequences), split over each layout's data ranks "
                        "(default: --batch per data rank, 1 unless given)")
    p.add_argument("--global-tokens", metavar="COUNT",
                   help="the step's batch in tokens (e.g. 4194304 or 4.19M): --global-batch "
                        "in sequences of --dim seq")
    p.add_argument("--tp", metavar="N[,N…]",
                   help="the tensor-parallel sizes to try (default 1, 2, 4, … up to a node)")
    p.add_argument("--pp", metavar="N[,N…]",
                   help="the pipeline sizes to try (1: none; default none, then 2, 4, … "
                        "stages for a tensor-parallel size none of whose layouts fits)")
    p.add_argument("--ep", metavar="N[,N…]",
                   help="the expert-parallel sizes to try for a mixture of experts (1: none; "
                        "default none, and 2, 4, … up to a node that divide its experts), "
                        "carved out of FSDP's ranks")
    p.add_argument("--cp", metavar="N[,N…]",
                   help="the context-parallel sizes to try (1: none; default none, then 2, "
                        "4, … up to a node, each sequence in 2·cp chunks, where no layout "
                        "without it fits), sharding the weights with FSDP's ranks")
    p.add_argument("--top", type=int, default=5, metavar="K",
                   help="the candidates the table shows (default 5; JSON lists all)")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.add_argument("-o", "--output", help="write the plan to this file instead of stdout")
    add_serve_plan_args(p)
    p.epilog = ("A plan's defaults: --precision bf16-master --optimizer adamw (torchtitan's); "
                "--checkpoint none,sac,full are searched unless one is given.")
    return p


def run(args) -> int:
    refuse_overwrite(args.output, args.model)
    check_writable(args.output, "-o")
    if args.parallel:
        raise GraphcostError("--parallel: a plan searches the layout (fix the "
                             "tensor-parallel size with --tp)")
    if args.top < 1:
        raise GraphcostError(f"--top {args.top}: a whole number ≥ 1")
    if args.serve:
        for given in ("pp", "ep", "cp"):
            if getattr(args, given):
                raise GraphcostError(f"--{given}: a serving plan's replicas are "
                                     "tensor-parallel (pipeline stages, experts and "
                                     "sequence shards are searched for training)")
        _, text = run_serve(args, _sizes(args.tp))
        _write(args.output, text)
        return 0
    _no_serve_options(args)
    template = _passed_on(build_parser(), args)
    checkpoints = _checkpoints(args.checkpoint)
    extra = {k: v for k, v in (("interconnect", args.interconnect),
                               ("async_tp", args.async_tp), ("gpus_per_node", args.nodes_of),
                               ("float8_all_gather", args.float8_all_gather),
                               ("cp_rotate", args.cp_rotate))
             if v}
    args.checkpoint = args.interconnect = args.async_tp = args.nodes_of = None   # (the plan's)
    args.float8_all_gather = args.cp_rotate = None
    base = {**analysis_kwargs(args), "parallel": extra or None, "what_if": False}
    base.pop("batch")
    spec = PlanSpec(args.gpus, batch=args.batch,
                    global_batch=_global_batch(args, base["dims"].get("seq")),
                    tp=_sizes(args.tp), checkpoints=checkpoints,
                    node=extra.get("gpus_per_node", GPUS_PER_NODE),
                    pp=_sizes(args.pp, "--pp"), ep=_sizes(args.ep, "--ep"),
                    cp=_sizes(args.cp, "--cp"))
    with progress(bar=True) as note:
        plan = plan_training(args.model, spec, base, note)

    def command(c: Candidate) -> str:
        return _command(args, template, c, extra.get("cp_rotate"))

    def engine(c: Candidate) -> str | None:
        s = c.settings
        return torchrun_line(spec.gpus, torchtitan_args(
            args.model, {k: n or 1 for k, n in s.mesh.dims}, s.batch, s.checkpoint, base,
            s.schedule),
            spec.node)

    from ..render.plan import plan_json, plan_lines
    from .wording import cli_message
    if args.format == "json":
        text = plan_json(plan, command, cli_message, engine)
    else:
        width = None if args.output else terminal_width()
        text = "\n".join(fitted(line, width)
                         for line in plan_lines(plan, command, args.top, cli_message,
                                                engine)) + "\n"
    _write(args.output, text)
    return 0


def _write(output: str | None, text: str) -> None:
    if output:
        Path(output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)


def _no_serve_options(args) -> None:
    given = [f"--{k.replace('_', '-')}" for k in ("prompt", "generate", "ttft", "tpot",
                                                  "weight_dtype", "kv_dtype")
             if getattr(args, k) is not None]
    if given:
        raise GraphcostError(f"{given[0]} goes with --serve")


def _global_batch(args, seq: int | None) -> int | None:
    """--global-batch, or --global-tokens in whole sequences of --dim seq."""
    if args.global_tokens is None:
        return args.global_batch
    if args.global_batch is not None:
        raise GraphcostError("use either --global-batch (sequences) or --global-tokens")
    if not seq:
        raise GraphcostError("--global-tokens counts sequences of --dim seq=N: give it")
    tokens = parse_count(args.global_tokens, "--global-tokens")
    if tokens % seq or tokens < seq:
        near = max(round(tokens / seq), 1)
        raise GraphcostError(f"--global-tokens {args.global_tokens}: {tokens:,.0f} tokens is "
                             f"not a whole number of {seq:,}-token sequences (≈ "
                             f"{tokens / seq:,.1f}); {near * seq:,} is {near}")
    return int(tokens // seq)


def _sizes(text: str | None, option: str = "--tp") -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        sizes = tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise GraphcostError(f"{option} {text}: whole numbers, e.g. 8 or 2,4") from None
    if not sizes or any(s < 1 for s in sizes):
        raise GraphcostError(f"{option} {text}: whole numbers ≥ 1, e.g. 8 or 2,4")
    return sizes


def _checkpoints(text: str | None) -> tuple[str, ...]:
    if text is None:
        return tuple(CHECKPOINTS)
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    bad = [n for n in names if n not in CHECKPOINTS]
    if bad or not names:
        raise GraphcostError(f"--checkpoint {text}: a plan tries {', '.join(CHECKPOINTS)} "
                             "(one or several, comma-separated)")
    return names


def _passed_on(parser: argparse.ArgumentParser, args) -> list[str]:
    """The options given that a candidate's own command line repeats as they were."""
    out: list[str] = []
    for action in parser._actions:  # noqa: SLF001 (argparse's list of what it parses)
        value = getattr(args, action.dest, None)
        if not action.option_strings or action.dest in OWN or value in (None, action.default):
            continue
        flag = action.option_strings[-1]
        if action.nargs == 0:
            out.append(flag)
        elif isinstance(value, list):
            for v in value:
                out += [flag, str(v)]
        else:
            out += [flag, str(value)]
    return out


def _command(args, template: list[str], c: Candidate, rotate: str | None = None) -> str:
    """The command line that analyzes candidate ``c`` alone (``rotate``: --cp-rotate, said
    where its layout has a ring)."""
    s = c.settings
    words = ["graphcost", args.model, "--train"]
    if s.mesh.dims:
        words += ["--parallel", s.mesh.words]
    words += ["--batch", str(s.batch)]
    if s.pp > 1:   # (one sequence a micro-batch, as the plan analyzed it)
        words += ["--microbatches", str(s.batch)]
    if s.interleaved:   # (its default stages a rank: torchtitan's)
        words += ["--pp-schedule", s.schedule]
    if rotate and s.cp > 1:
        words += ["--cp-rotate", rotate]
    if s.checkpoint != "none":
        words += ["--checkpoint", s.checkpoint]
    words += ["--precision", args.precision, "--optimizer", args.optimizer, *template]
    return shlex.join(words)
