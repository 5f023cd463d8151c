"""``torch.autocast`` as a training step runs it, made explicit in the joint trace: before an
op on autocast's lists runs, its floating inputs are cast as autocast would cast them, so the
joint graph holds the casts, what each op saves for the backward in the dtype it ran in, and
the casts' own backward (gradients reach the fp32 weights in fp32).

The lists are PyTorch's (``aten/src/ATen/autocast_mode.cpp`` for the CPU, the
``AT_FORALL_*`` lists of ``autocast_mode.h`` for CUDA), by op name:

* lower precision: the op's floating inputs are cast to the half dtype (fp64 ones are not);
  the half copy of a weight is made once per forward (autocast caches the casts of leaf
  tensors that require grad) and kept as long as a backward needs it;
* fp32: its half inputs are cast to fp32;
* fp32 with a dtype argument (CUDA's softmax, log_softmax, sum, cumsum, prod, norms): the op
  is asked for an fp32 result when its input is floating and no dtype was given;
* promote: every floating input is cast to the widest floating dtype among them.

Done in the graph rather than by ``torch.autocast`` itself: a model on the meta device (a 7B
decoder) has no autocast dispatch, and a GPU's lists are not this machine's."""
from __future__ import annotations

from typing import Any

import torch

from ....passes.training.precision import AutocastSpec

# autocast_mode.cpp, TORCH_LIBRARY_IMPL(aten, AutocastCPU, m)
_CPU_LOWER = frozenset((
    "conv1d conv2d conv3d bmm mm linalg_vecdot baddbmm addmm _addmm_activation addbmm linear "
    "_convolution matmul conv_tbc mkldnn_rnn_layer conv_transpose1d conv_transpose2d "
    "conv_transpose3d prelu scaled_dot_product_attention _native_multi_head_attention"
).split())
_CPU_FP32 = frozenset((
    "avg_pool3d binary_cross_entropy grid_sampler polar prod quantile nanquantile stft cdist "
    "grid_sampler_2d _grid_sampler_2d_cpu_fallback grid_sampler_3d trace view_as_complex "
    "cholesky cholesky_inverse cholesky_solve inverse lu_solve orgqr ormqr pinverse max_pool3d "
    "max_unpool2d max_unpool3d adaptive_avg_pool3d reflection_pad1d reflection_pad2d "
    "replication_pad1d replication_pad2d replication_pad3d mse_loss cosine_embedding_loss "
    "nll_loss nll_loss2d hinge_embedding_loss poisson_nll_loss smooth_l1_loss "
    "cross_entropy_loss l1_loss huber_loss margin_ranking_loss soft_margin_loss "
    "triplet_margin_loss multi_margin_loss ctc_loss kl_div multilabel_margin_loss "
    "binary_cross_entropy_with_logits fft_fft fft_ifft fft_fft2 fft_ifft2 fft_fftn fft_ifftn "
    "fft_rfft fft_irfft fft_rfft2 fft_irfft2 fft_rfftn fft_irfftn fft_hfft fft_ihfft "
    "linalg_cond linalg_matrix_rank linalg_solve linalg_cholesky linalg_svdvals "
    "linalg_eigvals linalg_eigvalsh linalg_inv linalg_householder_product linalg_tensorinv "
    "linalg_tensorsolve fake_quantize_per_tensor_affine geqrf _lu_with_info qr svd "
    "triangular_solve fractional_max_pool2d fractional_max_pool3d adaptive_max_pool3d "
    "multilabel_margin_loss_forward linalg_qr linalg_cholesky_ex linalg_svd linalg_eig "
    "linalg_eigh linalg_lstsq linalg_inv_ex"
).split())
_CPU_PROMOTE = frozenset("stack cat index_copy".split())

# autocast_mode.h: AT_FORALL_LOWER_PRECISION_FP, AT_FORALL_FP32, AT_FORALL_FP32_SET_OPT_DTYPE,
# AT_FORALL_PROMOTE (the CUDA registrations)
_CUDA_LOWER = frozenset((
    "_convolution conv1d conv2d conv3d conv_tbc conv_transpose1d conv_transpose2d "
    "conv_transpose3d convolution prelu addmm addmv addr matmul einsum mm mv linalg_vecdot "
    "linear addbmm baddbmm bmm chain_matmul linalg_multi_dot _thnn_fused_lstm_cell "
    "_thnn_fused_gru_cell lstm_cell gru_cell rnn_tanh_cell rnn_relu_cell "
    "_scaled_dot_product_flash_attention scaled_dot_product_attention"
).split())
_CUDA_FP32 = frozenset((
    "acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan pow "
    "softplus layer_norm native_layer_norm group_norm frobenius_norm nuclear_norm "
    "cosine_similarity poisson_nll_loss cosine_embedding_loss nll_loss nll_loss2d "
    "hinge_embedding_loss kl_div l1_loss smooth_l1_loss huber_loss mse_loss "
    "margin_ranking_loss multilabel_margin_loss soft_margin_loss triplet_margin_loss "
    "multi_margin_loss binary_cross_entropy_with_logits dist pdist cdist renorm logsumexp "
    "upsample_nearest1d _upsample_nearest_exact1d upsample_nearest2d "
    "_upsample_nearest_exact2d upsample_nearest3d _upsample_nearest_exact3d "
    "upsample_linear1d upsample_bilinear2d _upsample_bilinear2d_aa upsample_trilinear3d "
    "upsample_bicubic2d _upsample_bicubic2d_aa"
).split())
_CUDA_FP32_DTYPE = frozenset(
    "prod softmax log_softmax cumprod cumsum linalg_vector_norm linalg_matrix_norm sum".split())
_CUDA_PROMOTE = frozenset((
    "addcdiv addcmul atan2 bilinear cross dot vdot grid_sampler index_put tensordot scatter_add"
).split())

_LISTS = {"cpu": (_CPU_LOWER, _CPU_FP32, frozenset(), _CPU_PROMOTE),
          "cuda": (_CUDA_LOWER, _CUDA_FP32, _CUDA_FP32_DTYPE, _CUDA_PROMOTE)}


class Autocaster:
    """The casts autocast makes before each op of one forward (``weights``: the ids of the
    tensors whose half copy is made once and reused, autocast's cache)."""

    def __init__(self, spec: AutocastSpec):
        self.half = getattr(torch, spec.dtype)
        self.device_type = spec.device_type
        self.lower, self.fp32, self.fp32_dtype, self.promote = _LISTS[spec.device_type]
        self.weights: set[int] = set()
        self._cache: dict[int, torch.Tensor] = {}

    def cast(self, target: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        name = getattr(getattr(target, "overloadpacket", None), "__name__", None)
        if name in self.lower:
            return self._all(args, kwargs, self._to_half)
        if name in self.fp32:
            return self._all(args, kwargs, lambda t: _to(t, torch.float32))
        if name in self.fp32_dtype:
            return args, _fp32_result(target, args, kwargs)
        if name in self.promote:
            wide = _widest([*args, *kwargs.values()])
            return self._all(args, kwargs, lambda t: _to(t, wide)) if wide else (args, kwargs)
        return args, kwargs

    def float8_args(self, args: tuple) -> tuple:
        """A float8 linear's product (float8_linears.py): torchao's Float8Linear casts its
        input to CUDA autocast's dtype where that is on (``torch.is_autocast_enabled()``
        reads CUDA's state), so under CPU autocast its input stays as it is."""
        return (_to(args[0], self.half), *args[1:]) if self.device_type == "cuda" else args

    def cached(self) -> list[torch.Tensor]:
        """The half copies in the cache: autocast holds them until its region exits."""
        return list(self._cache.values())

    def _to_half(self, t: torch.Tensor) -> torch.Tensor:
        if not _eligible(t) or t.dtype == self.half:
            return t
        if id(t) not in self.weights:
            return t.to(self.half)
        if id(t) not in self._cache:
            self._cache[id(t)] = t.to(self.half)
        return self._cache[id(t)]

    @staticmethod
    def _all(args: tuple, kwargs: dict, fn) -> tuple[tuple, dict]:
        def each(a):
            if isinstance(a, torch.Tensor):
                return fn(a)
            if isinstance(a, (list, tuple)):
                return type(a)(each(x) for x in a)
            return a
        return tuple(each(a) for a in args), {k: each(v) for k, v in kwargs.items()}


def _eligible(t: torch.Tensor) -> bool:
    return t.is_floating_point() and t.dtype != torch.float64


def _to(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if not _eligible(t) or t.dtype == dtype:
        return t
    return t.to(dtype)


def _widest(values) -> torch.dtype | None:
    dtypes = [v.dtype for v in _tensors(values) if _eligible(v)]
    return max(dtypes, key=lambda d: torch.finfo(d).bits) if dtypes else None


def _tensors(values):
    for v in values:
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from _tensors(v)


def _fp32_result(target: Any, args: tuple, kwargs: dict) -> dict:
    """``kwargs`` asking for an fp32 result, when the op takes a dtype, none was given and
    its first input is floating (autocast's fp32_set_opt_dtype)."""
    names = [a.name for a in target._schema.arguments]
    if "dtype" not in names or not args or not isinstance(args[0], torch.Tensor) \
            or not _eligible(args[0]):
        return kwargs
    at = names.index("dtype")
    if kwargs.get("dtype") is not None or (len(args) > at and args[at] is not None):
        return kwargs
    return {**kwargs, "dtype": torch.float32}
