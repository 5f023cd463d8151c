"""``graphcost plan MODEL --serve --gpus N --device GPU --prompt P --generate G``: the serving
setting that makes the most output tokens per second within the latency targets
(analyzer/app/serve_plan.py), the command that analyzes it alone and vLLM's arguments."""
from __future__ import annotations

import argparse
import math
import shlex
from typing import Any, Mapping

from ...passes.errors import GraphcostError
from ...passes.serving.dtypes import KV_DTYPES, WEIGHT_DTYPES
from ..app.devices import GPUS_PER_NODE
from ..app.serve_plan import ServeCandidate, ServePlan, ServePlanSpec, plan_serving
from ..app.units import parse_time
from .engine_args import vllm_args, vllm_line
from .model_options import analysis_kwargs, progress

# what a serving plan leaves to its analyses' defaults (the training plan's defaults: unset)
TRAINING = ("train", "optimizer", "checkpoint", "precision", "what_if", "batch", "loss",
            "optimizer_impl", "compile", "tokens", "price", "attention")


def add_serve_plan_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--serve", action="store_true",
                   help="plan serving instead: each replica's tensor-parallel size, the "
                        "sequences it serves at once and the dtypes, for requests of --prompt "
                        "+ --generate tokens, priced as vLLM runs them")
    p.add_argument("--prompt", type=int, metavar="P", help="with --serve: prompt tokens")
    p.add_argument("--generate", type=int, metavar="G", help="with --serve: tokens generated")
    p.add_argument("--ttft", metavar="TIME", help="with --serve: the most time to the first "
                                                  "token, e.g. 500ms")
    p.add_argument("--tpot", metavar="TIME", help="with --serve: the most time per output "
                                                  "token, e.g. 50ms")
    p.add_argument("--weight-dtype", metavar=",".join(WEIGHT_DTYPES),
                   help="with --serve: the weights' dtypes to try (default: the model's)")
    p.add_argument("--kv-dtype", metavar=",".join(KV_DTYPES),
                   help="with --serve: the KV cache's dtypes to try (default: the model's)")


def run_serve(args, sizes: tuple[int, ...] | None) -> tuple[ServePlan, str]:
    """The plan and its text (table or JSON) for ``args``."""
    if args.global_batch or args.global_tokens or args.checkpoint or args.batch:
        raise GraphcostError("--serve plans the sequences a replica serves at once: leave out "
                             "--batch, --global-batch, --global-tokens and --checkpoint")
    for flag in ("prompt", "generate"):
        if getattr(args, flag) is None:
            raise GraphcostError(f"--serve needs --{flag} N")
    args.train = False
    extra = {k: v for k, v in (("interconnect", args.interconnect),
                               ("gpus_per_node", args.nodes_of)) if v}
    args.interconnect = args.nodes_of = None
    base = {k: v for k, v in analysis_kwargs(args).items() if k not in TRAINING}
    base["parallel"] = extra or None
    spec = ServePlanSpec(args.gpus, args.prompt, args.generate,
                         _time(args.ttft, "--ttft"), _time(args.tpot, "--tpot"), sizes,
                         _dtypes(args.weight_dtype, WEIGHT_DTYPES, "--weight-dtype"),
                         _dtypes(args.kv_dtype, KV_DTYPES, "--kv-dtype"),
                         extra.get("gpus_per_node", GPUS_PER_NODE))
    with progress(bar=True) as note:
        plan = plan_serving(args.model, spec, base, note)
    return plan, _text(args, plan, extra)


def _text(args, plan: ServePlan, parallel: Mapping[str, Any]) -> str:
    from ..render.serve_plan import serve_plan_json, serve_plan_lines
    from .output import fitted, terminal_width
    from .wording import cli_message

    def command(c: ServeCandidate) -> str:
        return _command(args, c, parallel)

    def engine(c: ServeCandidate) -> str | None:
        return vllm_line(_vllm(args, plan, c))
    if args.format == "json":
        return serve_plan_json(plan, command, engine, cli_message)
    width = None if args.output else terminal_width()
    return "\n".join(fitted(line, width) for line in serve_plan_lines(
        plan, command, args.top, engine, cli_message)) + "\n"


def _vllm(args, plan: ServePlan, c: ServeCandidate) -> list[str] | None:
    s, serving = c.settings, c.serving
    fit = serving.fit if serving else None
    if fit is None:
        return None
    share = math.ceil(fit.needs / plan.device_bytes * 100) / 100   # of the whole GPU
    return vllm_args(args.model, tp=s.tp, sequences=s.batch,
                     context=plan.spec.prompt + plan.spec.generate,
                     batched_tokens=s.batch * plan.spec.prompt, memory_share=min(share, 1.0),
                     weight_dtype=s.weight_dtype, kv_dtype=s.kv_dtype)


def _command(args, c: ServeCandidate, parallel: Mapping[str, Any]) -> str:
    """The command line that analyzes candidate ``c`` alone."""
    s = c.settings
    words = ["graphcost", args.model, "--serve", "--prompt", str(args.prompt), "--generate",
             str(args.generate), "--batch", str(s.batch)]
    if s.tp > 1:
        words += ["--parallel", f"tp={s.tp}"]
    words += ["--engine", "vllm", "--device", args.device]
    for flag, key in (("--interconnect", "interconnect"), ("--nodes-of", "gpus_per_node")):
        if s.tp > 1 and parallel.get(key):   # (what a replica's collectives cross)
            words += [flag, str(parallel[key])]
    for flag, value in (("--weight-dtype", s.weight_dtype), ("--kv-dtype", s.kv_dtype),
                        ("--dtype", args.dtype)):
        if value:
            words += [flag, value]
    return shlex.join(words)


def _time(text: str | None, flag: str) -> float | None:
    return None if text is None else parse_time(text, flag)


def _dtypes(text: str | None, known: tuple[str, ...], flag: str) -> tuple[str | None, ...]:
    if text is None:
        return (None,)
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise GraphcostError(f"{flag} {text}: one or several of {', '.join(known)}")
    return names
