"""Which kernel PyTorch runs for ``scaled_dot_product_attention``, by its dispatcher's rules.

The rules are PyTorch's own checks (``aten/src/ATen/native/transformers/sdp_utils_cpp.cpp``
for the CPU, ``…/cuda/sdp_utils.cpp`` for CUDA), taken in their priority order: the first
kernel whose checks all pass runs.

* This CPU: the CPU flash kernel (``_scaled_dot_product_flash_attention_for_cpu``) unless the
  call has dropout, is not 4-D, q, k and v differ in head dim, (before PyTorch 2.9) its
  key/value heads are grouped (``enable_gqa``), or its mask is one ``check_attn_mask_shape``
  refuses; then the math kernel.
* A CUDA GPU: flash (fp16/bf16, sm80–sm121, no explicit mask, head dims equal and ≤ 256, no
  causal flag with Sq ≠ Sk, and on sm86–89 / sm120–121 no training at head dim 193–224, or
  225–256 with dropout), else memory-efficient (sm50–sm121; fp32/fp16, bf16 from sm80; head
  dims aligned to the GEMM's alignment; any mask; grouped-query heads (``enable_gqa``) only
  from PyTorch 2.14), else math.
* cuDNN attention comes first on sm90 and sm100-family parts (``check_prefer_cudnn_attention``:
  cuDNN newer than 9.15 at run time). PyTorch's wheels bring that cuDNN from 2.11 (measured:
  2.11+cu130 with cuDNN 9.19 runs it on an H100; 2.14.1 requires cuDNN 9.24; 2.10's wheel has
  9.10 and 2.9 asks for ``TORCH_CUDNN_SDPA_PREFERRED``), so the target's torch release (the
  installed one) decides. cuDNN takes fp16/bf16, masks, grouped-query heads, head dims that
  are multiples of 8 up to 128 (256 on sm90/sm10x from 2.14's cuDNN), dropout in 1/16 steps.
  Its memory is flash's (output + log-sum-exp).
* An AMD GPU (ROCm, AOTriton): flash for fp16/bf16 with no mask and head dim ≤ 256, else
  memory-efficient; the CUDA rules' architecture checks do not apply.
* A mask that requires grad (a learned bias: timm's MaxxViT adds its relative-position bias
  as ``attn_mask``): ``check_attn_mask_shape`` (sdp_utils_cpp.h, shared by the CPU flash
  kernel and cuDNN) refuses it first of all, as neither kernel has a gradient for the mask;
  it also refuses a mask not 2-D or 4-D broadcasting to b×h×Sq×Sk. CUDA flash takes no mask
  at all (``check_for_attn_mask``). So a learned mask runs the math kernel on the CPU and
  the memory-efficient kernel on a GPU (its backward gives the bias its gradient,
  ``grad_bias``), else math. The same in PyTorch 2.8, 2.13 and 2.14 (their
  sdp_utils_cpp.h read; each kernel's autograd formula checked on 2.13).

What each kernel keeps for the backward is what its autograd formula saves (the output and
a log-sum-exp of b·h·Sq fp32 values, never the Sq×Sk scores); the math kernel is traced as
its decomposition (matmuls, a softmax whose Sq×Sk output the backward keeps).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..choices import Attention

_HALF = ("float16", "bfloat16")
NEWEST = (2, 14)  # the newest PyTorch release whose rules are written here


@dataclass(frozen=True)
class AttentionTarget:
    """What the dispatcher's choice depends on beyond the call: the machine and the dtype the
    step computes attention in. ``backend``: "cpu" (this machine), "cuda" or "rocm";
    ``capability``: a CUDA GPU's compute capability (None: not known, taken as sm80);
    ``kernel``: an Attention (``auto``: the dispatcher's choice); ``dtype``: the dtype a
    precision recipe runs attention in (None: the traced tensors')."""
    backend: str = "cpu"
    capability: tuple[int, int] | None = None
    kernel: str = Attention.AUTO
    dtype: str | None = None
    device: str = "this CPU"   # how the report names the target
    # the PyTorch release the step runs on, whose rules apply (None: the newest known; the
    # torch frontend sets the installed one)
    torch: tuple[int, int] | None = None
    # context parallelism: the ranks whose sequence shards each call's keys and values are
    # gathered from, PyTorch's ring attention (1: none; frontends/torch/context_parallel.py)
    ring: int = 1
    rotate: str = "allgather"   # how the ring hands on keys and values (choices.Rotate)

    @property
    def words(self) -> str:
        """The target as the report names it: "h100-sxm (sm90), bfloat16" (", context-
        parallel ring of 2" where each call is one, "… all-to-all ring …" where it passes keys
        and values on rather than gathering them)."""
        ring = "all-to-all ring" if self.rotate == "alltoall" else "ring"
        return self.device + (f", {self.dtype}" if self.dtype else "") + \
            (f", context-parallel {ring} of {self.ring}" if self.ring > 1 else "")


@dataclass(frozen=True)
class AttentionCall:
    """One attention call as the dispatcher sees it."""
    q: tuple[int, ...]
    k: tuple[int, ...]
    v: tuple[int, ...]
    dtype: str
    mask: bool = False
    dropout: float = 0.0
    causal: bool = False
    grad: bool = True   # q, k or v requires grad (sdp_utils_cpp.h input_requires_grad)
    gqa: bool = False   # enable_gqa with fewer key/value heads than query heads
    mask_grad: bool = False  # the mask requires grad (a learned bias)
    mask_shape: tuple[int, ...] | None = None  # None: not known, taken as one that fits


def choose(target: AttentionTarget, call: AttentionCall) -> tuple[str, str]:
    """(the kernel, why the kernels before it in the priority order were passed over: ""
    when the first one runs). A forced kernel runs as asked; the reason then says when
    PyTorch's checks would refuse it."""
    call = call if target.dtype is None else _as(call, target.dtype)
    order = _order(target)
    if target.kernel != Attention.AUTO:
        why = _refusal(target, call, str(target.kernel))
        return str(target.kernel), (f"asked for; PyTorch would refuse it ({why})" if why else "")
    passed = []
    for kernel in order:
        why = _refusal(target, call, kernel)
        if not why:
            return kernel, "; ".join(passed)
        passed.append(f"not {kernel}: {why}")
    return Attention.MATH, "; ".join(passed)


def _as(call: AttentionCall, dtype: str) -> AttentionCall:
    return replace(call, dtype=dtype) if call.dtype in ("float32", "float64") else call


def _order(target: AttentionTarget) -> tuple[str, ...]:
    if target.backend == "cpu":
        return (Attention.FLASH,)
    if target.backend == "cuda" and _prefers_cudnn(target):
        return (Attention.CUDNN, Attention.FLASH, Attention.EFFICIENT)
    return (Attention.FLASH, Attention.EFFICIENT)


def _prefers_cudnn(target: AttentionTarget) -> bool:
    # sdp_utils.cpp check_prefer_cudnn_attention: cuDNN > 9.15 and compute capability 9.x or
    # 10.x; the cuDNN PyTorch's wheels bring passes from 2.11 (module docstring)
    return target.capability is not None and target.capability[0] in (9, 10) and \
        _release(target) >= (2, 11)


def _refusal(target: AttentionTarget, call: AttentionCall, kernel: str) -> str:
    """Why PyTorch's checks refuse ``kernel`` for ``call`` on the target ("" when none do)."""
    if kernel == Attention.MATH:
        return ""
    if len(call.q) != 4 or len(call.k) != 4 or len(call.v) != 4:
        return "inputs are not 4-D"
    if target.backend == "cpu":
        return _cpu_flash(target, call) if kernel == Attention.FLASH else "a CUDA kernel"
    checks = {Attention.FLASH: _flash, Attention.EFFICIENT: _efficient,
              Attention.CUDNN: _cudnn}[Attention(kernel)]
    return checks(target, call)


def _cpu_flash(target: AttentionTarget, call: AttentionCall) -> str:
    if call.dropout > 0:
        return "dropout"
    if why := _mask_shape(call, "the flash kernel"):
        return why
    if not call.q[-1] == call.k[-1] == call.v[-1]:
        return "q, k and v differ in head dim"
    if call.gqa and _release(target) < (2, 9):  # PyTorch PR 157893, July 2025
        return "grouped-query heads (the CPU flash kernel takes them from PyTorch 2.9)"
    return ""


def _mask_shape(call: AttentionCall, kernel: str) -> str:
    # sdp_utils_cpp.h check_attn_mask_shape (the CPU flash kernel's and cuDNN's): a mask
    # that requires grad first (neither kernel's backward has a gradient for it), then one
    # that is not 2-D (Sq|1 × Sk|1) or 4-D (b|1 × h|1 × Sq|1 × Sk|1)
    if not call.mask:
        return ""
    if call.mask_grad:
        return f"the mask requires grad (a learned bias), which {kernel} has no gradient for"
    s = call.mask_shape
    if s is None or _fits(s, (call.q[0], call.q[1], call.q[2], call.k[2])):
        return ""
    return f"a mask of shape {'×'.join(map(str, s))} ({kernel} takes 2-D or 4-D masks)"


def _fits(mask: tuple[int, ...], bhqk: tuple[int, ...]) -> bool:
    """Whether a mask of this shape is one check_attn_mask_shape takes for (b, h, Sq, Sk)."""
    if len(mask) not in (2, 4):
        return False
    return all(m in (1, n) for m, n in zip(mask, bhqk[-len(mask):]))


def _release(target: AttentionTarget) -> tuple[int, int]:
    return target.torch or NEWEST


def _sm(target: AttentionTarget) -> tuple[int, int]:
    return target.capability or (8, 0)


def _flash(target: AttentionTarget, call: AttentionCall) -> str:
    d = call.q[-1]
    if call.dtype not in _HALF:
        return f"{call.dtype} (flash runs fp16/bf16)"
    if call.mask:
        return "an explicit attention mask"
    if not d == call.k[-1] == call.v[-1] or d > 256:
        return "head dims differ or exceed 256"
    if target.backend == "rocm":
        return ""
    sm = _sm(target)
    if not (8, 0) <= sm <= (12, 1):
        return f"sm{sm[0]}{sm[1]} (flash needs sm80–sm121)"
    if call.causal and call.q[-2] != call.k[-2]:
        return "causal with query and key lengths unequal"
    if call.grad and ((8, 6) <= sm <= (8, 9) or (12, 0) <= sm <= (12, 1)) and \
            (192 < d <= 224 or (d > 224 and call.dropout > 0)):
        return f"training at head dim {d} on sm{sm[0]}{sm[1]}"
    return ""


def _efficient(target: AttentionTarget, call: AttentionCall) -> str:
    sm = _sm(target)
    if target.backend == "cuda" and not (5, 0) <= sm <= (12, 1):
        return f"sm{sm[0]}{sm[1]} (needs sm50–sm121)"
    if call.dtype == "bfloat16" and target.backend == "cuda" and sm < (8, 0):
        return "bf16 before sm80"
    if call.dtype not in ("float32", *_HALF):
        return f"{call.dtype}"
    align = _gemm_alignment(sm, call.dtype)
    dq, dv = call.q[-1], call.v[-1]
    if dq != call.k[-1] or dq % align or dv % align:
        return f"head dims not multiples of {align}"
    if call.gqa and (target.backend == "rocm" or _release(target) < (2, 14)):
        return "grouped-query heads (the efficient kernel takes them from PyTorch 2.14)"
    return ""


def _gemm_alignment(sm: tuple[int, int], dtype: str) -> int:
    # sdp_utils.cpp minimum_gemm_alignment: 4 from sm80, 128 bits with tensor cores
    half = dtype in _HALF
    tensor_cores = sm >= (8, 0) or (sm >= (7, 0) and half)
    align = 4 if sm >= (8, 0) else 1
    return max(align, 128 // (16 if half else 32)) if tensor_cores else align


def _cudnn(target: AttentionTarget, call: AttentionCall) -> str:
    # sdp_utils.cpp can_use_cudnn_attention, check_cudnn_tensor_shapes, check_cudnn_dropout
    if target.backend != "cuda":
        return "not a CUDA GPU"
    sm = _sm(target)
    if not (8, 0) <= sm <= (12, 1):
        return f"sm{sm[0]}{sm[1]} (cuDNN attention needs sm80–sm121)"
    if call.dtype not in _HALF:
        return f"{call.dtype} (cuDNN runs fp16/bf16)"
    if why := _mask_shape(call, "cuDNN's kernel"):
        return why
    if call.dropout * 16 != int(call.dropout * 16):
        return "dropout not a multiple of 1/16"
    dq, dv = call.q[-1], call.v[-1]
    wide = (sm == (9, 0) or sm[0] == 10) and _release(target) >= (2, 14)  # cuDNN > 9.22
    if dq % 8 or dv % 8 or max(dq, dv) > (256 if wide else 128):
        return f"head dims not multiples of 8 up to {256 if wide else 128}"
    if wide and call.grad and max(dq, dv) > 128 and (dq, dv) not in ((192, 128), (256, 256)):
        return f"no cuDNN backward at head dims {dq}/{dv}"
    if call.k[-2] == 1:
        return "key length 1"
    return ""


@dataclass(frozen=True)
class AttentionUse:
    """The report's line per kernel: how many attention calls the step runs with it, the
    target it was chosen for and why the kernels before it were passed over."""
    kernel: str
    calls: int
    target: str
    reason: str


def attention_uses(kernels) -> tuple[AttentionUse, ...]:
    """A graph's ``attention`` (ir.AttentionKernel per call) grouped by kernel and reason,
    in the order first seen."""
    counts: dict[tuple[str, str, str], int] = {}
    for k in kernels:
        key = (k.kernel, k.target, k.reason)
        counts[key] = counts.get(key, 0) + 1
    return tuple(AttentionUse(kernel, n, target, reason)
                 for (kernel, target, reason), n in counts.items())


def name_kernels(graph, target: AttentionTarget):
    """An inference graph with the kernel of each ``scaled_dot_product_attention`` node (kept
    whole by the frontend; its rule costs the fused kernels' work and memory) in its
    ``attention``. A call the dispatcher sends to the math kernel says that its S×S scores
    are not counted."""
    from ..costs.registry import lookup
    from ..ir import AttentionKernel

    calls = []
    for node in graph.nodes:
        r = lookup(node.op)
        if r is None or not r.dispatched or len(node.inputs) < 3:
            continue
        specs = [graph.spec(name) for name in node.inputs[:3]]
        if any(s is None or not all(isinstance(d, int) for d in s.shape) for s in specs):
            continue
        kernel, why = choose(target, _graph_call(graph, node, specs))
        if kernel == Attention.MATH:
            why = "; ".join(filter(None, (why, "costed without its S×S scores")))
        calls.extend([AttentionKernel(node.scope, kernel, why, target.words)] * node.repeat)
    return replace(graph, attention=tuple(calls)) if calls else graph


def _graph_call(graph, node, specs) -> AttentionCall:
    """The call an inference graph's attention node makes. Its mask requires grad when it is
    a parameter itself (an nn.Parameter does under no_grad too; one computed from a
    parameter does not there)."""
    from ..ir import ValueKind

    q, k, v = specs
    name = node.inputs[3] if len(node.inputs) > 3 else ""
    value = graph.values.get(name) if name else None
    shape = value.spec.shape if value is not None else None
    return AttentionCall(q.shape, k.shape, v.shape, q.dtype, bool(name),
                         float(node.attrs.get("dropout_p", 0.0) or 0.0),
                         bool(node.attrs.get("is_causal", False)), grad=False,
                         gqa=bool(node.attrs.get("enable_gqa")) and len(q.shape) > 2
                         and k.shape[-3] != q.shape[-3],
                         mask_grad=value is not None and value.kind == ValueKind.PARAM,
                         mask_shape=tuple(shape) if shape is not None and
                         all(isinstance(d, int) for d in shape) else None)
