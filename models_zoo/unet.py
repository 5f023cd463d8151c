"""A small UNet: 3 down levels (16, 32, 64 channels), a 128-channel bottleneck and a
mirrored up path (ConvTranspose2d stride 2 + skip concat + double conv)."""

from __future__ import annotations

import torch
from torch import nn


class DoubleConv(nn.Sequential):
    """(3x3 conv -> BN -> ReLU) x 2."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__(
            nn.Conv2d(cin, cout, 3, padding=1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(inplace=True),
            nn.Conv2d(cout, cout, 3, padding=1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(inplace=True),
        )


class Up(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(cin, cout, kernel_size=2, stride=2)
        self.conv = DoubleConv(2 * cout, cout)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return self.conv(torch.cat([skip, self.up(x)], dim=1))


class UNet(nn.Module):
    def __init__(self, in_channels: int = 3, num_classes: int = 2, widths: tuple[int, ...] = (16, 32, 64), bottleneck: int = 128) -> None:
        super().__init__()
        self.pool = nn.MaxPool2d(2)
        self.down = nn.ModuleList()
        cin = in_channels
        for w in widths:
            self.down.append(DoubleConv(cin, w))
            cin = w
        self.bottleneck = DoubleConv(cin, bottleneck)
        self.up = nn.ModuleList()
        cin = bottleneck
        for w in reversed(widths):
            self.up.append(Up(cin, w))
            cin = w
        self.head = nn.Conv2d(cin, num_classes, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 3, H, W), H and W divisible by 8
        skips = []
        for down in self.down:
            x = down(x)
            skips.append(x)
            x = self.pool(x)
        x = self.bottleneck(x)
        for up, skip in zip(self.up, reversed(skips)):
            x = up(x, skip)
        return self.head(x)


def unet_small() -> UNet:
    return UNet()
