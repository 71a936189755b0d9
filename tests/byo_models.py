"""Small torch models for `tests/test_import_model.py` ("bring your own model" factories)."""

from __future__ import annotations

import torch
from torch import nn

NOT_A_FACTORY = 42


def tiny_mlp(in_features: int = 32, hidden: int = 64, num_classes: int = 10) -> nn.Module:
    """Linear-ReLU-Linear-ReLU-Linear as an nn.Sequential (one row per child)."""
    return nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                         nn.ReLU(), nn.Linear(hidden, num_classes))


class SmallConvNet(nn.Module):
    """Conv-BN-ReLU-maxpool features, a functional flatten in forward, a linear classifier."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                      nn.MaxPool2d(2))
        self.classifier = nn.Linear(8 * 8 * 8, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


class Wrapped(nn.Module):
    """A wrapper whose only child is the real network (the importer unwraps it)."""

    def __init__(self):
        super().__init__()
        self.net = tiny_mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class TinyLM(nn.Module):
    """Embedding + a ModuleList of encoder layers + a head whose weight is tied to the
    embedding; takes token ids."""

    def __init__(self, vocab: int = 50, hidden: int = 16, layers: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(hidden, 2, 4 * hidden, dropout=0.0, batch_first=True)
            for _ in range(layers))
        self.head = nn.Linear(hidden, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class ReadsValues(nn.Module):
    """A forward that branches on its input's values, which a meta tensor does not hold."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) if x.sum().item() > 0 else -self.linear(x)


def failing_factory() -> nn.Module:
    raise RuntimeError("cannot build this one")


def not_a_module() -> str:
    return "not a module"
