"""How a model is to be loaded: bound, read and traced, as one typed value.

``LoadOptions`` is checked when it is built (``__post_init__``, with analyzer/load/checks.py),
so every LoadOptions that exists is a checked one, whoever made it: ``build_request``
(analyzer/app/request.py) from analyze's arguments or the command line's options, a test, or
``replace(load, batch=b)`` in the batch search. The serving review's options are
analyzer/load/serving.py's ``ServeSpec``, checked the same way.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping, Sequence

from ...passes.choices import Exporter, Float8, Loss
from ...passes.errors import GraphcostError, opt
from ...passes.graph.attention_dispatch import AttentionTarget
from ...passes.training.precision import AutocastSpec
from .checks import check_arguments, check_dtype

NONE: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True)
class LoadOptions:
    """How the model is bound, read and traced (checked when built)."""
    batch: int | None = None
    dims: Mapping[str, int] = field(default_factory=lambda: NONE)
    input_shapes: Mapping[str, Sequence[int]] = field(default_factory=lambda: NONE)
    input_dtypes: Mapping[str, Any] = field(default_factory=lambda: NONE)
    exporter: str = Exporter.ONNX       # a zoo model: its cached ONNX export, or traced (fx)
    train: bool = False                 # the joint forward+backward graph
    all_layers: bool = False            # trace every block of a repeated stack
    # the machine, dtype and kernel choice a training step's attention is traced for
    attention: AttentionTarget = AttentionTarget()
    autocast: AutocastSpec | None = None  # a training step's forward under torch.autocast
    dtype: str | None = None            # --dtype: the weights' dtype for inference and serving
    # a training recipe that casts the module (bf16-true, bf16-master): traced in its dtype
    cast: str | None = None
    loss: str = Loss.AUTO               # the loss a training step backpropagates (lm_loss.py)
    # one of this many tensor-parallel ranks: the module rewritten into the rank's program
    # (frontends/torch/tensor_parallel.py) before it is traced
    tensor_parallel: int = 1
    # one of this many expert-parallel ranks: each layer's experts rewritten into the rank's
    # slice and torchtitan's token dispatch (frontends/torch/expert_parallel.py)
    expert_parallel: int = 1
    # one of this many context-parallel ranks: its shard of each sequence (S/C tokens) traced,
    # attention as PyTorch's ring runs it (frontends/torch/context_parallel.py)
    context_parallel: int = 1
    cp_rotate: str = "allgather"   # how its ring hands on keys and values (choices.Rotate)
    # (stage, stages): the module cut to one pipeline stage (frontends/torch/pipeline_stages.py)
    pipeline_stage: tuple[int, int] | None = None
    # the stage cut to its first N blocks (a long stage's per-block step is read off two
    # short ones: analyzer/app/pipeline_stages.py)
    stage_blocks: int | None = None
    # torchao's float8 recipe the step's linears run (frontends/torch/float8_linears.py)
    float8: str | None = None
    # FSDP2 gathers the float8 linears' weights in float8 (torchao's
    # enable_fsdp_float8_all_gather): they reach the product cast already
    float8_all_gather: bool = False

    def __post_init__(self):
        check_arguments(batch=self.batch, dims=self.dims, input_shapes=self.input_shapes,
                        input_dtypes=self.input_dtypes, zoo_exporter=self.exporter,
                        flags={"train": self.train, "all_layers": self.all_layers},
                        choices={"loss": (self.loss, Loss.words()),
                                 "float8": (self.float8, (None, *Float8.words()))})
        check_dtype(self.dtype, self.train)
        if self.float8 is not None and not self.train:
            raise GraphcostError(f"{opt('float8')} is a training recipe (torchao's float8 "
                                 f"linears): add {opt('train')}")
        if self.loss != Loss.AUTO and not self.train:
            raise GraphcostError(f"{opt('loss', value=self.loss)} is a training step's loss: "
                                 f"add {opt('train')}")
