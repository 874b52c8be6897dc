"""Models for the benchmarks that torchvision would otherwise supply: a ResNet-18-sized CIFAR
network (``resnet18``), built from plain ``torch.nn`` so the benchmarks need no torchvision."""

from __future__ import annotations

import torch
from torch import nn


class BasicBlock(nn.Module):
    """ResNet's basic block: two 3x3 convolutions with BatchNorm, a shortcut (a 1x1
    convolution with BatchNorm when the shape changes), ReLU after the sum."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


def resnet18(width: int = 64, classes: int = 10, channels: int = 3) -> nn.Module:
    """ResNet-18 for 32x32 inputs (CIFAR's stem: one 3x3 convolution, no max-pool): 4 stages of
    2 basic blocks, widths ``width * (1, 2, 4, 8)``, strides 1-2-2-2, global average pooling
    and a linear head. ``width=64`` has 11.2M parameters, as torchvision's ``resnet18``; any
    input size of at least 8x8 works.

    Example:
        >>> m = resnet18(width=4)
        >>> m(torch.randn(2, 3, 8, 8)).shape
        torch.Size([2, 10])
        >>> sum(p.numel() for p in resnet18().parameters())
        11173962
    """
    if not isinstance(width, int) or width < 1:
        raise ValueError(f"width must be a positive int, got {width!r}")
    widths = [width * m for m in (1, 2, 4, 8)]
    layers: list[nn.Module] = [
        nn.Conv2d(channels, width, 3, 1, 1, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(),
    ]
    cin = width
    for i, cout in enumerate(widths):
        layers += [BasicBlock(cin, cout, 1 if i == 0 else 2), BasicBlock(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)
