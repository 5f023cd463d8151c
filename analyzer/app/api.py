"""The Python entry point: ``analyze(model, ...) -> Report``. Never prints.

Accepted models (analyzer/load/resolve.py): an ONNX path, ``zoo:NAME``, ``path/to/file.py:Class``
(imports and runs that file, builds the class on the meta device), an ``onnx.ModelProto``, a
``torch.export.ExportedProgram``, an ``fx.GraphModule`` or any ``nn.Module`` (with
``example_inputs`` or ``input_shapes``). The ONNX paths never import torch. The model is
loaded by analyzer/load/ (its front door: ``load``) and analyzed by the passes
(analyzer/app/pipeline.py).
"""
from __future__ import annotations

import gc
import inspect
from typing import Any, Mapping, Sequence

from ...passes.errors import GraphcostError, first_line
from ..load.loading import load
from ..load.progress import Progress
from .api_checks import check_unknown
from .pipeline import run_passes
from .report import Report
from .request import Request, build_request


# long: the API's docstring is most of it
def analyze(model, example_inputs: Sequence[Any] | None = None, *extra,
            batch: int | None = None,
            dims: Mapping[str, int] | None = None,
            input_shapes: Mapping[str, Sequence[int]] | None = None,
            input_dtypes: Mapping[str, Any] | None = None,
            include_inputs: bool = True, inplace: bool = False, lifetimes: str | None = None,
            zoo_exporter: str = "onnx", progress: Progress | None = None,
            train: bool = False, optimizer: str = "adam",
            checkpoint: Mapping[str, Any] | None = None, precision: str = "fp32",
            device: Any = None, tf32: bool = False, overhead: Any = None,
            what_if: bool = True, parallel: Mapping[str, Any] | None = None,
            optimizer_impl: str | None = None, serve: Mapping[str, Any] | None = None,
            all_layers: bool = False, attention: str = "auto", allocator: str | None = None,
            dtype: str | None = None, loss: str = "auto", device_profile: Any = None,
            compile: bool = False, tokens: int | None = None,  # noqa: A002 (torch's name)
            price: float | None = None, float8: str | None = None, **unknown) -> Report:
    """Analyze ``model`` at the given bindings; see the module docstring for what it accepts.

    ONNX: ``batch`` binds axis 0 of the graph inputs (default 1), ``dims`` any other symbolic
    dim by name, ``input_shapes`` whole input shapes. PyTorch: ``example_inputs`` (real, fake
    or meta tensors) or ``input_shapes`` (+ ``input_dtypes``, default float32) by forward
    argument name; ``batch`` replaces axis 0 of ``input_shapes``. ``progress`` receives short
    stage messages (the CLI shows them; nothing is printed otherwise). ``train`` analyzes one
    training step of a PyTorch model (its joint forward+backward graph) with ``optimizer``
    (none, sgd, momentum, adam, adamw); ``checkpoint`` adds a checkpoint plan:
    ``{"names": [...]}``, ``{"every": N}``, ``{"sqrt": True}``, ``{"budget": BYTES}`` (the
    plan with the least recompute that fits), ``{"sac": True}`` (torchtitan's op policy) or
    ``{"sac": [op, ...]}``, ``{"nth": N}``, ``{"core_attn": True}`` (Megatron-LM's selective
    recompute); ``precision`` (training; Lightning's names):
    bf16-mixed / 16-mixed trace the forward under torch.autocast, bf16-master / 16-master
    re-type weights, activations and gradients to half with fp32 master weights and optimizer
    state, bf16-true / 16-true re-type everything to half. ``device`` (a name such as "a100-40gb" or a passes.device_rates.DeviceRates)
    adds the roofline time per node and whether the peak fits with ``overhead``
    (passes.device.roofline.Overhead); ``tf32`` uses the TF32 rate for fp32 matmuls.
    ``what_if=False`` skips the training what-ifs (each re-runs the training passes).
    ``optimizer_impl`` ("forloop" | "foreach") sets the optimizer step's temporaries; default
    what PyTorch uses on the target: foreach on a GPU ``device``, the for-loop otherwise.
    ``parallel`` (with ``train``) divides the step across data-parallel ranks:
    ``{"strategy": "ddp"|"zero1"|"zero2"|"zero3"|"fsdp", "world_size": N or "auto"}`` (auto:
    the smallest N that fits ``device``) or ``{"mesh": "dp_replicate=2,dp_shard=4"}`` (a
    device mesh of dp_replicate, dp_shard, tp, cp, ep, pp: passes/parallel/mesh.py; with pp,
    ``"microbatches"`` and ``"schedule"``: "1f1b"|"gpipe"|"interleaved-1f1b"|"interleaved-zb"|"zbv" — with
    ``example_inputs``, the batch is theirs, split into micro-batches along dimension 0 as
    torch.distributed.pipelining splits them), optionally
    ``"offload": "optimizer"|"params"``,
    ``"bucket_cap_mb"`` (DDP, default 25), ``"units"`` (module paths to shard as FSDP units;
    default the repeated blocks), ``"interconnect"`` (a name from analyzer.app.devices
    INTERCONNECTS). The batch is each rank's (global = batch × world size); the report's
    ``parallel`` section and ``peak_bytes`` are then one rank's; the what-ifs are skipped.
    ``serve={"prompt": P, "generate": G}`` (+ ``kv_dtype``, ``weight_dtype``) reviews a decoder
    for serving (analyzer/load/serving.py): prefill and one decode step traced with the KV cache, the
    report's ``serving`` section; ``batch`` is the number of sequences. A PyTorch model's
    stack of 8+ identical blocks is traced as three, the middle one repeated in the IR (the
    report's ``traced_layers`` says so); ``all_layers=True`` traces every block.
    ``attention`` (auto, flash, efficient, cudnn, math): the kernel a training step's
    ``scaled_dot_product_attention`` is traced as; auto is the one PyTorch's dispatcher picks
    on ``device`` (none: this CPU) in the ``precision`` recipe's dtype. ``allocator``: the
    CUDA caching allocator's settings as ``PYTORCH_CUDA_ALLOC_CONF`` spells them
    (``"expandable_segments:True"``, ``"max_split_size_mb:128"``), for the reserved replay
    and the fit. ``dtype`` (fp32, fp16, bf16) casts a PyTorch model's weights for inference
    and serving; default the published weights' dtype where the zoo knows it (zoo:llama7b:
    float16), a hub model's config.json's, else as built. ``loss`` (training: auto, ce,
    chunked-ce, sum; analyzer/frontends/torch/lm_loss.py): the loss the step backpropagates;
    auto is the model's own (a transformers causal LM given labels), else cross-entropy
    over the vocabulary for a language-model head, else the sum of the outputs.
    ``float8`` (training: tensorwise, rowwise, rowwise_with_gw_hp; torchao's recipes): the
    step's linears swapped for torchao's Float8Linear as torchtitan's converter swaps them
    (analyzer/frontends/torch/float8_linears.py); a module already converted is traced as
    it is.
    ``device_profile`` (the path of a profile ``graphcost calibrate`` wrote, or a
    passes.device.profile.DeviceProfile) adds the time estimate with its error band (the
    report's ``time``; passes/device/time_estimate.py). Raises
    GraphcostError, in these arguments' names. The arguments become one typed Request
    (analyzer/app/request.py), which the command line builds too.
    """
    try:
        check_unknown(extra, unknown, ANALYZE_ARGS)
        request = build_request(
            batch=batch, dims=dims, input_shapes=input_shapes, input_dtypes=input_dtypes,
            include_inputs=include_inputs, inplace=inplace, lifetimes=lifetimes,
            zoo_exporter=zoo_exporter, train=train, optimizer=optimizer, checkpoint=checkpoint,
            precision=precision, device=device, tf32=tf32, overhead=overhead, what_if=what_if,
            parallel=parallel, optimizer_impl=optimizer_impl, serve=serve,
            all_layers=all_layers, attention=attention, allocator=allocator, dtype=dtype,
            loss=loss, device_profile=device_profile, compile=compile, tokens=tokens,
            price=price, float8=float8)
        return run_request(model, request, example_inputs, progress)
    except GraphcostError:  # (its message names this face's arguments)
        raise
    except Exception as exc:
        # the API promises one exception type; the cause stays chained for the bug report
        raise GraphcostError(f"internal error ({type(exc).__name__}: "
                             f"{first_line(exc, 300)}); please "
                             "report it with the model and graphcost's version") from exc


def run_request(model, request: Request, example_inputs: Sequence[Any] | None = None,
                progress: Progress | None = None) -> Report:
    """The analysis ``request`` asks for (both faces come here)."""
    if progress is not None and not callable(progress):
        raise GraphcostError(f"progress must be callable, got {type(progress).__name__}")
    # The IR is hundreds of thousands of small acyclic objects: the cyclic collector would
    # rescan them again and again (≈15% of the time on a 100k-node graph) and free nothing.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        spec = request.passes.parallel
        if spec is not None and spec.pp > 1:
            from .pipeline_stages import run_pipeline
            return run_pipeline(model, request, spec, example_inputs, progress)
        loaded = load(model, request.load, example_inputs, progress, serve=request.serve)
        if progress:
            progress("running the passes")
        return run_passes(loaded.graph, request.passes, serving=loaded.serving)
    finally:
        if was_enabled:
            gc.enable()


# the keywords analyze takes, for the error naming one it does not
ANALYZE_ARGS = tuple(n for n, p in inspect.signature(analyze).parameters.items()
                     if p.kind is p.KEYWORD_ONLY)
