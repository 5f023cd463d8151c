"""The ops a selective-checkpointing policy names (passes/training/checkpoint.py applies it):
the op catalogue's names, so no pass outside it spells one.

torchtitan's op SAC (torchtitan/distributed/activation_checkpoint.py, ``_op_sac_save_list``)
saves the outputs of its matmuls, the fused attention kernels, FSDP's reduce-scatter and
float8's amax (``aten.max``), and recomputes every second ``mm`` of a block.
"""
from __future__ import annotations

MM = "aten.mm.default"
TORCHTITAN_SAC = (MM, "aten._scaled_dot_product_efficient_attention.default",
                  "aten._scaled_dot_product_flash_attention.default",
                  "aten._scaled_dot_product_cudnn_attention.default",
                  "_c10d_functional.reduce_scatter_tensor.default", "aten.max.default")
