"""The choice lists users pick from, each defined once: the command line's ``choices=``, the
API's checks and the passes' branches all read these.

A member is its word: ``Optimizer.ADAMW == "adamw"``, it hashes as the word (so a dict keyed
by members answers a lookup by the word) and formats as it (so messages and the JSON report
read the same as before there were members).
"""
from __future__ import annotations

from enum import Enum


class Choice(str, Enum):
    """A choice whose value is the word users type."""

    __hash__ = str.__hash__  # (Enum hashes its name: "adamw" would miss a member key)

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return self.value.__format__(spec)

    @classmethod
    def words(cls) -> tuple[str, ...]:
        return tuple(m.value for m in cls)


class Optimizer(Choice):
    NONE = "none"
    SGD = "sgd"
    MOMENTUM = "momentum"
    ADAM = "adam"
    ADAMW = "adamw"

    @property
    def adaptive(self) -> bool:
        """Adam's family: two state tensors per parameter and a foreach step's temporaries."""
        return self in (Optimizer.ADAM, Optimizer.ADAMW)


class OptimizerImpl(Choice):
    FORLOOP = "forloop"
    FOREACH = "foreach"


class Strategy(Choice):
    DDP = "ddp"
    ZERO1 = "zero1"
    ZERO2 = "zero2"
    ZERO3 = "zero3"
    FSDP = "fsdp"

    @property
    def shards_gradients(self) -> bool:
        return self in (Strategy.ZERO2, Strategy.ZERO3, Strategy.FSDP)

    @property
    def shards_parameters(self) -> bool:
        return self in (Strategy.ZERO3, Strategy.FSDP)


class Offload(Choice):
    OPTIMIZER = "optimizer"
    PARAMS = "params"


class Lifetimes(Choice):
    DATAFLOW = "dataflow"   # a graph runtime frees each tensor after its last use
    EAGER = "eager"         # PyTorch eager: module arguments live until the call returns


class Exporter(Choice):
    """How a zoo model reaches the IR: its cached ONNX export or a torch.export trace."""
    ONNX = "onnx"
    FX = "fx"


class Attention(Choice):
    """Which kernel runs ``scaled_dot_product_attention``: ``auto`` is the one PyTorch's
    dispatcher picks for the target (passes/graph/attention_dispatch.py)."""
    AUTO = "auto"
    FLASH = "flash"
    EFFICIENT = "efficient"
    CUDNN = "cudnn"
    MATH = "math"


class Loss(Choice):
    """The loss a training step backpropagates (analyzer/frontends/torch/lm_loss.py)."""
    AUTO = "auto"               # the model's own, else ce for a language-model head, else sum
    CE = "ce"                   # cross-entropy over the vocabulary, fp32 logits (torchtitan)
    CHUNKED_CE = "chunked-ce"   # torchtune's CEWithChunkedOutputLoss
    SUM = "sum"                 # the sum of the floating outputs


class Float8(Choice):
    """torchao's float8 training recipes (``Float8LinearConfig.from_recipe_name``): the
    linears a training step runs in float8 (analyzer/frontends/torch/float8_linears.py)."""
    TENSORWISE = "tensorwise"                   # one scale a tensor
    ROWWISE = "rowwise"                         # a scale a row (torchtitan 0.3's default)
    ROWWISE_WITH_GW_HP = "rowwise_with_gw_hp"   # rowwise, the weight gradient's product in bf16


class Rotate(Choice):
    """How a context-parallel ring hands each rank the others' keys and values (PyTorch's
    ``set_rotate_method``, torchtitan's ``context_parallel_rotate_method``): analyzer/
    frontends/torch/context_parallel.py."""
    ALL_GATHER = "allgather"   # all of them gathered once into one buffer (the default)
    ALL_TO_ALL = "alltoall"    # one rank's passed on at each step of the ring
