"""Small classic CNNs: ``small_cnn``, ``mnist_net`` and ``three_conv``."""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn


class SmallCNN(nn.Module):
    """Two 3x3 convs, a 2x2 max-pool and a two-layer MLP head on 1x28x28 inputs."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(32, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(14 * 14 * 32, 128),
            nn.ReLU(),
            nn.Linear(128, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class MnistNet(nn.Module):
    """The classic PyTorch MNIST example network (as used in torchstat's README)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 320)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


def three_conv() -> nn.Sequential:
    """Three 3x3 convs with a max-pool in between (a VGG-like stem)."""
    return nn.Sequential(
        OrderedDict(
            [
                ("conv_1", nn.Conv2d(3, 64, 3, padding=1)),
                ("relu_1", nn.ReLU(inplace=True)),
                ("conv_2", nn.Conv2d(64, 64, 3, padding=1)),
                ("relu_2", nn.ReLU(inplace=True)),
                ("pool", nn.MaxPool2d(2, 2)),
                ("conv_3", nn.Conv2d(64, 128, 3, padding=1)),
            ]
        )
    )
