"""VGG-16 (configuration "D", no batch norm), as in torchvision."""

from __future__ import annotations

import torch
from torch import nn

CFG_D: list[int | str] = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]


def make_features(cfg: list[int | str]) -> nn.Sequential:
    layers: list[nn.Module] = []
    cin = 3
    for v in cfg:
        if v == "M":
            layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
        else:
            layers += [nn.Conv2d(cin, int(v), kernel_size=3, padding=1), nn.ReLU(inplace=True)]
            cin = int(v)
    return nn.Sequential(*layers)


class VGG(nn.Module):
    def __init__(self, features: nn.Sequential, num_classes: int = 1000, dropout: float = 0.5) -> None:
        super().__init__()
        self.features = features
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096),
            nn.ReLU(True),
            nn.Dropout(p=dropout),
            nn.Linear(4096, 4096),
            nn.ReLU(True),
            nn.Dropout(p=dropout),
            nn.Linear(4096, num_classes),
        )
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                if m.bias is not None:  # (every conv here has one)
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


def vgg16(num_classes: int = 1000) -> VGG:
    return VGG(make_features(CFG_D), num_classes)
