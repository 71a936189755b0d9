"""Configurable multi-layer perceptron: input -> [Linear + ReLU] x num_hidden_layers -> Linear.

Each Linear (+ ReLU) is one layer.  Conventions: ``simulator/zoo/_ops.py`` and ``README.md``.
"""

from __future__ import annotations

from simulator.workload import Workload
from simulator.zoo._ops import DimensionError, require_positive
from simulator.zoo.cnn import fc_layer


def mlp(*, input_dim: int = 784, hidden_dim: int = 1024, num_hidden_layers: int = 4,
        num_classes: int = 10) -> Workload:
    """MLP classifier; the default 784-1024x4-10 has 3,962,890 parameters."""
    require_positive(input_dim=input_dim, hidden_dim=hidden_dim, num_classes=num_classes)
    if num_hidden_layers < 0:
        raise DimensionError("{num_hidden_layers} must be at least 0", num_hidden_layers=num_hidden_layers)
    layers, fin = [], input_dim
    for i in range(num_hidden_layers):
        layers.append(fc_layer(f"fc{i + 1}", fin, hidden_dim, relu=True))
        fin = hidden_dim
    layers.append(fc_layer(f"fc{num_hidden_layers + 1}", fin, num_classes, relu=False))
    input_spec = {"shape": [input_dim], "num_classes": num_classes, "task": "classification"}
    return Workload("mlp", tuple(layers), input_spec)
