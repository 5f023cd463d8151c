"""``--serve`` and its options on the main command (analyzer/cli/main.py adds them)."""
from __future__ import annotations

import argparse

from ...passes.errors import GraphcostError
from ...passes.serving.dtypes import KV_DTYPES, WEIGHT_DTYPES
from ..load.serving import ENGINES, LOGITS


def add_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--serve", action="store_true",
                   help="serving review of a decoder LM: prefill of --prompt tokens and one "
                        "decode step over the KV cache of --prompt + --generate − 1 tokens, "
                        "traced with the cache as graph tensors; KV cache, weights, prefill and "
                        "decode costs, tokens/s and the largest batch and context on --device "
                        "(--batch = concurrent sequences)")
    p.add_argument("--prompt", type=int, metavar="P", help="with --serve: prompt tokens")
    p.add_argument("--generate", type=int, metavar="G", help="with --serve: tokens generated")
    p.add_argument("--kv-dtype", choices=KV_DTYPES,
                   help="with --serve: the KV cache's dtype (default: the activations')")
    p.add_argument("--engine", choices=ENGINES,
                   help="with --serve: how the steps' time is priced — eager PyTorch as "
                        "transformers' generate runs it (default), or vllm: torch.compile's "
                        "kernels, the decode step replayed from a CUDA graph. With --parallel "
                        "tp=N the replica is N tensor-parallel GPUs (vLLM's "
                        "--tensor-parallel-size)")
    p.add_argument("--logits", choices=LOGITS,
                   help="with --serve: the prefill's logits — of each sequence's last "
                        "position, what generate and serving engines sample from (default), "
                        "or of every prompt position (a plain forward: prompt log-probabilities)")
    p.add_argument("--weight-dtype", choices=WEIGHT_DTYPES,
                   help="with --serve: the weights' dtype (int8/int4/fp8: weight-only "
                        "quantization, fp16 activations; default: as traced)")


def serve_kwargs(args) -> dict:
    """``analyze``'s ``serve`` argument from the options ({} without --serve)."""
    given = [f"--{k.replace('_', '-')}" for k in ("prompt", "generate", "kv_dtype",
                                                  "weight_dtype", "engine", "logits")
             if getattr(args, k, None) is not None]
    if not getattr(args, "serve", False):
        if given:
            raise GraphcostError(f"{given[0]} goes with --serve")
        return {}
    if getattr(args, "max_batch", False):   # (graphcost check has none)
        raise GraphcostError("--serve reports the largest number of concurrent sequences "
                             "itself: leave out --max-batch")
    for flag in ("prompt", "generate"):
        if getattr(args, flag) is None:
            raise GraphcostError(f"--serve needs --{flag} N")
    serve = {"prompt": args.prompt, "generate": args.generate}
    if args.kv_dtype:
        serve["kv_dtype"] = args.kv_dtype
    if args.weight_dtype:
        serve["weight_dtype"] = args.weight_dtype
    if args.engine:
        serve["engine"] = args.engine
    if getattr(args, "logits", None):
        serve["logits"] = args.logits
    return {"serve": serve}
