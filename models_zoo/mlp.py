"""A small block-structured MLP: each block is what FSDP wraps, tiny enough to train on a CPU
in several processes at once (the data-parallel measurements)."""

from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Module):
    """Four blocks of Linear(256→512)–ReLU–Linear(512→256) and a Linear(256→10) head."""

    def __init__(self, width: int = 256, hidden: int = 512, blocks: int = 4, classes: int = 10):
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, width))
            for _ in range(blocks))
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)
