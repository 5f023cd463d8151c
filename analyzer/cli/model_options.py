"""The options that say which model to analyze, at what size and how (shared by ``graphcost``
and its subcommands), and the analysis they ask for: analyze()'s keyword arguments, run under
the terminal's progress spinner."""
from __future__ import annotations

import argparse
import re
import sys
from contextlib import contextmanager

from ...passes.choices import Attention, Float8, Lifetimes, Loss, Optimizer
from ...passes.errors import GraphcostError
from ...passes.training.precision import CHOICES
from ..app.devices import get_device, parse_device_spec, parse_overhead
from ..app.units import parse_count
from ..load.checks import DTYPE_WORDS
from ..load.progress import Step
from .parallel import add_parallel_args, parallel_args


def _kv(text: str, what: str) -> tuple[str, str]:
    if "=" not in text:
        raise GraphcostError(f"{what} expects NAME=VALUE, got {text!r}")
    k, v = text.split("=", 1)
    if "=" in v:  # `--input-shape ids=2x256,labels=2x256` read as one odd shape ("bad shape")
        parts = re.split(r",(?=[^,=]*=)", text)
        raise GraphcostError(f"{what} {text}: one NAME=VALUE per option; repeat the option: "
                             + " ".join(f"{what} {p.strip()}" for p in parts))
    return k.strip(), v.strip()


# long: the option table: one add_argument per option
def add_model_args(p: argparse.ArgumentParser, *, model: bool = True) -> None:
    """The options that say which model to analyze and at what size (shared by the main
    command and the subcommands)."""
    if model:
        p.add_argument("model", help=(
            "an .onnx file; a saved torch.export program (.pt2: its JSON graph is read, its "
            "pickled weights never); zoo:NAME for a bundled reference model; timm:NAME for a "
            "timm architecture (built on the meta device); a Hugging Face "
            "id ORG/NAME[@REV], a config.json or a snapshot folder (only config.json is "
            "read; the model is built on the meta device); or "
            "path/to/file.py:Class — "
            "this IMPORTS AND RUNS that Python file, builds Class() with no arguments on the "
            "meta device (no weights allocated) and traces its forward with torch.export on "
            "fake inputs of the --input-shape sizes"))
    p.add_argument("--fx", action="store_true",
                   help="zoo models: trace the torch module with torch.export instead of "
                        "analyzing its ONNX export")
    p.add_argument("--all-layers", action="store_true",
                   help="PyTorch models: trace every block of a stack of 8+ identical blocks "
                        "(default: three traced, the middle one repeated in the IR)")
    p.add_argument("--input-dtype", action="append", default=[], metavar="NAME=DTYPE",
                   help="dtype of a traced module's input (default float32), e.g. "
                        "--input-dtype input_ids=int64")
    p.add_argument("--batch", type=int, default=None,
                   help="bind the batch dim (axis 0) of the graph inputs (default 1)")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=VALUE",
                   help="bind a symbolic input dim by name, e.g. --dim sequence=128; on the "
                        "torch route, u0, u1… set the maximum of a size the data decides")
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME=SHAPE",
                   help="override an input's shape, e.g. --input-shape x=1x3x224x224")
    p.add_argument("--exclude-inputs", action="store_true",
                   help="leave graph inputs out of activation memory")
    p.add_argument("--inplace-activations", action="store_true",
                   help="what-if: unary activations write into their dying input")
    p.add_argument("--lifetimes", choices=Lifetimes.words(), default=None,
                   help="how long tensors live: dataflow = freed after the last use (a graph "
                        "runtime; default for ONNX), eager = module arguments held until the "
                        "module returns (PyTorch eager; default for traced torch models)")
    p.add_argument("--train", action="store_true",
                   help="analyze one training step (forward + real backward traced with "
                        "AOTAutograd + optimizer step) of a PyTorch model; of an ONNX file, "
                        "an ESTIMATE (backward synthesized from per-op save rules)")
    p.add_argument("--optimizer", choices=Optimizer.words(),
                   default="adam", help="with --train: optimizer state and step (default adam)")
    p.add_argument("--precision", choices=CHOICES, default="fp32",
                   help="with --train, Lightning's names: fp32 (32-true); bf16-mixed / "
                        "16-mixed: torch.autocast (fp32 weights, gradients and optimizer state, "
                        "autocast's ops in half); bf16-master / 16-master: half weights, "
                        "activations and gradients with fp32 master weights and optimizer "
                        "state; bf16-true / 16-true: everything half, optimizer state too")
    p.add_argument("--attention", choices=Attention.words(), default="auto",
                   help="with --train: the kernel scaled_dot_product_attention is traced as "
                        "(default auto: the one PyTorch picks on --device, or this CPU, in "
                        "the --precision dtype)")
    p.add_argument("--loss", choices=Loss.words(), default="auto",
                   help="with --train: the loss the step backpropagates (default auto: the "
                        "model's own, e.g. a transformers causal LM given labels; else "
                        "cross-entropy over the vocabulary for a language-model head; else "
                        "the sum of the outputs); ce: fp32 cross-entropy as torchtitan; "
                        "chunked-ce: torchtune's CEWithChunkedOutputLoss (8 chunks)")
    p.add_argument("--float8", choices=Float8.words(), default=None, metavar="RECIPE",
                   help="with --train: the linears run torchao's float8 recipe (tensorwise, "
                        "rowwise, rowwise_with_gw_hp), swapped as torchtitan's float8 "
                        "converter swaps them (the output projection kept); needs torchao")
    add_parallel_args(p)
    add_checkpoint_args(p)
    p.add_argument("--device", metavar="NAME",
                   help="roofline time per node and whether the memory fits on this device "
                        "(a lower bound, not a benchmark); `graphcost devices` lists the known ones")
    p.add_argument("--device-spec", metavar="flops=…,bandwidth=…,memory=…",
                   help="a device of your own, e.g. flops=19.5T,bandwidth=1555G,memory=40GiB "
                        "(optional fp16=…, bf16=…, tf32=…, int8=… rates)")
    p.add_argument("--device-profile", metavar="FILE.json",
                   help="the time estimate with its error band, priced with the profile "
                        "`graphcost calibrate` measured on a machine")
    p.add_argument("--compile", action="store_true",
                   help="with a GPU device: the time of the kernels torch.compile launches "
                        "(pointwise runs fused; docs/time.md)")
    p.add_argument("--tokens", metavar="COUNT",
                   help="a training run of this many tokens, e.g. 15T: its days and GPU-hours "
                        "at the estimated tokens/s (a GPU --device)")
    p.add_argument("--price", metavar="USD", type=float,
                   help="with --tokens: the run's cost at this price per GPU-hour")
    p.add_argument("--tf32", action="store_true",
                   help="with a device: fp32 matmuls and convolutions run at the TF32 rate")
    p.add_argument("--dtype", choices=DTYPE_WORDS,
                   help="the weights' dtype for inference and --serve (a PyTorch model; "
                        "default: the published config's where known, e.g. zoo:llama7b "
                        "float16, a hub model's config.json's)")
    p.add_argument("--allocator", metavar="CONF",
                   help="the CUDA caching allocator's settings for the reserved replay and "
                        "the fit, as PYTORCH_CUDA_ALLOC_CONF spells them: "
                        "expandable_segments:True, max_split_size_mb:N (default: PyTorch's)")
    p.add_argument("--overhead", metavar="context=SIZE,allocator=PCT",
                   help="your own figures for 'fits' and --max-batch, replacing the model's: "
                        "context = everything beyond the tensors and the allocator's cache, "
                        "allocator = tensors x (1 + PCT) instead of the replay; 'none': "
                        "tensors only")


def add_checkpoint_args(p: argparse.ArgumentParser) -> None:
    """--checkpoint and the options that go with it."""
    p.add_argument("--checkpoint", metavar="NAMES|none|full|sqrt|auto|sac|core_attn",
                   help="with --train: nothing recomputed (none, the default), or "
                        "checkpoint these modules (comma-separated paths), "
                        "every repeated block (full: torchtitan's mode = \"full\"), √N "
                        "segments of the repeated blocks (sqrt), the cheapest plan that fits "
                        "--budget (auto), or selective checkpointing of each repeated block "
                        "(sac: torchtitan's op policy, or --sac-save OPS), or the fused "
                        "attention alone recomputed (core_attn: Megatron-LM's selective "
                        "recompute)")
    p.add_argument("--sac-save", metavar="OPS",
                   help="with --checkpoint sac: the ops whose outputs the policy saves "
                        "(comma-separated aten names such as mm,addmm, or sdpa); default "
                        "torchtitan's op policy")
    p.add_argument("--checkpoint-every", type=int, metavar="N",
                   help="with --train: one checkpoint segment per N repeated blocks")
    p.add_argument("--checkpoint-nth", type=int, metavar="N",
                   help="with --train: checkpoint every N-th repeated block whole, the others "
                        "not (torchtitan's per-layer selective AC, selective_ac_option = N)")
    p.add_argument("--budget", metavar="SIZE",
                   help="memory budget for --checkpoint auto, e.g. 40GiB, 4GB, 4e9")


def _checkpoint_args(args) -> dict | None:
    from ..app.units import parse_size

    if args.budget is not None and args.checkpoint != "auto":
        raise GraphcostError("--budget goes with --checkpoint auto")
    if args.sac_save is not None and args.checkpoint != "sac":
        raise GraphcostError("--sac-save goes with --checkpoint sac")
    if args.checkpoint_nth is not None:
        if args.checkpoint or args.checkpoint_every is not None:
            raise GraphcostError("use one of --checkpoint, --checkpoint-every, --checkpoint-nth")
        return {"nth": args.checkpoint_nth}
    if args.checkpoint_every is not None:
        if args.checkpoint:
            raise GraphcostError("use either --checkpoint or --checkpoint-every")
        return {"every": args.checkpoint_every}
    if not args.checkpoint or args.checkpoint == "none":  # (torchtitan's mode = "none")
        return None
    if args.checkpoint == "sqrt":
        return {"sqrt": True}
    if args.checkpoint == "full":  # torchtitan's full AC: each block one checkpoint
        return {"every": 1}
    if args.checkpoint == "core_attn":  # Megatron-LM's --recompute-granularity selective
        return {"core_attn": True}
    if args.checkpoint == "sac":  # torchtitan's op policy, or the ops --sac-save names
        return {"sac": [n.strip() for n in args.sac_save.split(",") if n.strip()]
                if args.sac_save else True}
    if args.checkpoint == "auto":
        if args.budget is None:
            raise GraphcostError("--checkpoint auto needs --budget SIZE (e.g. 40GiB)")
        return {"budget": parse_size(args.budget, "--budget")}
    return {"names": [n.strip() for n in args.checkpoint.split(",") if n.strip()]}


@contextmanager
def progress(bar: bool = False):
    """A rich spinner on stderr while the model is read, traced and analyzed — ``bar``: with
    a bar of the counted steps (a plan's candidates) — on terminals only: nothing when
    stderr is redirected, so pipes and CI logs stay clean."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    if not bar:
        with Console(stderr=True).status("graphcost: starting") as status:
            yield lambda msg: status.update(f"graphcost: {msg}")
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )
    columns = (SpinnerColumn(), BarColumn(bar_width=20), MofNCompleteColumn(),
               TimeElapsedColumn(), TextColumn("{task.description}"))
    with Progress(*columns, console=Console(stderr=True), transient=True) as shown:
        task = shown.add_task("starting", total=None)

        def note(msg) -> None:
            if isinstance(msg, Step):
                shown.update(task, completed=msg.done - 1, total=msg.total, description=msg.what)
            else:
                shown.update(task, description=str(msg))
        yield note


def analysis_kwargs(args) -> dict:
    """analyze()'s keyword arguments from the shared model options (see add_model_args)."""
    from ..frontends.binding import parse_shape

    dims = {}
    for text in args.dim:
        k, v = _kv(text, "--dim")
        try:
            dims[k] = int(v)
        except ValueError:
            raise GraphcostError(f"--dim {text}: the value must be an integer") from None
    shapes = {}
    for text in args.input_shape:
        k, v = _kv(text, "--input-shape")
        shapes[k] = parse_shape(v)
    dtypes = dict(_kv(text, "--input-dtype") for text in args.input_dtype)
    return dict(device=device_from_args(args), tf32=args.tf32,
                overhead=parse_overhead(args.overhead) if args.overhead else None,
                batch=args.batch, dims=dims, input_shapes=shapes, input_dtypes=dtypes,
                include_inputs=not args.exclude_inputs, inplace=args.inplace_activations,
                lifetimes=args.lifetimes, zoo_exporter="fx" if args.fx else "onnx",
                train=args.train, optimizer=args.optimizer,
                checkpoint=_checkpoint_args(args), precision=args.precision,
                parallel=parallel_args(args), optimizer_impl=args.optimizer_impl,
                all_layers=args.all_layers, attention=args.attention,
                allocator=args.allocator, dtype=args.dtype, loss=args.loss,
                float8=args.float8,
                device_profile=args.device_profile, compile=args.compile,
                tokens=int(parse_count(args.tokens, "--tokens")) if args.tokens else None,
                price=args.price)


def device_from_args(args):
    if args.device and args.device_spec:
        raise GraphcostError("use either --device or --device-spec")
    if args.device_spec:
        return parse_device_spec(args.device_spec)
    if args.device:
        return get_device(args.device)
    if args.tf32:
        raise GraphcostError("--tf32 goes with --device or --device-spec")
    return None


def run_analysis(model: str, args, **overrides):
    """The analysis the shared options ask for, under the terminal progress spinner."""
    from ..app.api import run_request
    from ..app.request import build_request

    request = build_request(**{**analysis_kwargs(args), **overrides})
    with progress() as note:
        return run_request(model, request, progress=note)
