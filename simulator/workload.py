"""Per-layer workload description: the simulator's view of a DNN.

A workload is a chain of layers. A "layer" is the unit of partitioning: it never has a skip
connection crossing its boundary (a residual block is one layer), so any contiguous range of
layers can be a pipeline / model-parallel stage and exchanges exactly one activation tensor with
its neighbours.

Every count is *per sample* and in *elements* (not bytes): the training dtype turns elements into
bytes (`dtype_bytes`). FLOPs count one multiply-add as 2 FLOPs (the convention of the GHP, PaSE and
Megatron papers and of `torch.utils.flop_counter`).

`spec` carries the constructor attributes the validator needs to build the same layer as a torch
module (kind-specific, documented in `simulator/zoo/README.md`); layer tables brought by a user
may leave it empty, and such workloads can be simulated but not run for real.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

DTYPE_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1}


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a training dtype (activations, weights and gradients)."""
    return DTYPE_BYTES[dtype]


@dataclass(frozen=True)
class Layer:
    """One partitionable layer; all figures per sample, element counts not bytes."""

    name: str
    kind: str
    forward_flops_per_sample: float
    backward_flops_per_sample: float
    num_params: int
    input_elements_per_sample: int
    output_elements_per_sample: int
    saved_elements_per_sample: int
    spec: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @property
    def flops_per_sample(self) -> float:
        """Forward + backward FLOPs of one sample."""
        return self.forward_flops_per_sample + self.backward_flops_per_sample


@dataclass(frozen=True)
class Workload:
    """A model as an ordered chain of layers plus the shape of one input sample."""

    name: str
    layers: tuple[Layer, ...]
    input_spec: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def num_params(self) -> int:
        return sum(layer.num_params for layer in self.layers)

    @property
    def flops_per_sample(self) -> float:
        """Forward + backward FLOPs of one sample through the whole model."""
        return sum(layer.flops_per_sample for layer in self.layers)

    @property
    def forward_flops_per_sample(self) -> float:
        return sum(layer.forward_flops_per_sample for layer in self.layers)


LAYER_TABLE_COLUMNS = (
    "name",
    "kind",
    "forward_flops_per_sample",
    "backward_flops_per_sample",
    "num_params",
    "input_elements_per_sample",
    "output_elements_per_sample",
    "saved_elements_per_sample",
)
