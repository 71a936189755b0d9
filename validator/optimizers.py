"""The optimizers the validator trains with (one place for the runtimes and the microbenchmarks)."""

from __future__ import annotations

import torch

OPTIMIZERS = ("sgd", "momentum", "adam")


def make_optimizer(name: str, parameters, lr: float = 0.01) -> torch.optim.Optimizer:
    """sgd, momentum (SGD, momentum 0.9) or adam."""
    if name == "sgd":
        return torch.optim.SGD(parameters, lr=lr)
    if name == "momentum":
        return torch.optim.SGD(parameters, lr=lr, momentum=0.9)
    if name == "adam":
        return torch.optim.Adam(parameters, lr=lr)
    raise ValueError(f"unknown optimizer {name!r} (expected one of {', '.join(OPTIMIZERS)})")
