"""LoRA adapters beside a frozen base (peft's LoraLayer, built by hand so peft is not needed)."""

from __future__ import annotations

import math

import torch
from torch import nn

from .gpt2 import GPT2, GPT2Config


class LoRALinear(nn.Module):
    """peft's ``lora.Linear`` for an ``nn.Linear``: the frozen ``base_layer`` plus the trainable
    low-rank update ``lora_B(lora_A(lora_dropout(x))) * alpha / r``; A initialized as
    kaiming-uniform, B as zeros (peft's defaults)."""

    def __init__(self, base: nn.Linear, r: int = 8, alpha: int = 16, dropout: float = 0.0):
        super().__init__()
        self.base_layer = base
        self.lora_dropout = nn.Dropout(dropout) if dropout else nn.Identity()
        self.lora_A = nn.Linear(base.in_features, r, bias=False)
        self.lora_B = nn.Linear(r, base.out_features, bias=False)
        self.scaling = alpha / r
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base_layer(x) + self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scaling


def gpt2_lora() -> GPT2:
    """The zoo's tiny GPT-2 with every weight frozen and rank-8 LoRA adapters (alpha 16) on
    each block's attention projections (c_attn, c_proj): only the adapters train."""
    model = GPT2(GPT2Config())
    for p in model.parameters():
        p.requires_grad_(False)
    for block in model.h:  # (a ModuleList's items are plain Modules to the type checker)
        attn = block.get_submodule("attn")
        c_attn, c_proj = attn.get_submodule("c_attn"), attn.get_submodule("c_proj")
        assert isinstance(c_attn, nn.Linear) and isinstance(c_proj, nn.Linear)
        attn.c_attn = LoRALinear(c_attn)
        attn.c_proj = LoRALinear(c_proj)
    return model
