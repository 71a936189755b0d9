"""A layer's pass inside a step's sweep over the layers against the same pass back to back, as the
layer microbenchmark times it: the profile's `layer_sweep` section (`validator.sweep_bench`).

A step runs each layer once per sweep, the other layers refilling the caches in between; the layer
fits come from a layer repeated on itself. The ratio per layer, phase and calibrated batch size
(median over trials of sweep / back-to-back, both single passes, all ranks at once) multiplies the
layer's pass cost (`ProfileCosts.compute_s`). Between calibrated batch sizes it is interpolated
linearly in the batch size, and outside them it is held at the nearest one. Measured on this project's 2-core CPU
host: memory-bound layers' backwards 1.0-1.45x, their forwards 0.8-1.15x, the small last layer with
the loss about 2x (reports/ACCURACY.md). Profiles without the section: 1.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LayerSweep:
    batch_sizes: tuple[int, ...]
    forward_ratios: tuple[tuple[float, ...], ...]
    """Per layer, one ratio per batch size in `batch_sizes`."""
    backward_ratios: tuple[tuple[float, ...], ...]

    def ratio(self, phase: str, layer: int, batch: float) -> float:
        """The sweep / back-to-back ratio of layer `layer`'s pass (`phase` "F" or "B") at `batch`."""
        ratios = (self.forward_ratios if phase == "F" else self.backward_ratios)[layer]
        return float(np.interp(batch, self.batch_sizes, ratios))  # linear between sizes, held outside


def parse_layer_sweep(read, document: Mapping, num_layers: int) -> LayerSweep | None:
    """The optional `layer_sweep` section of a profile document (`read`: the profile's reader, which
    names the field of any error); None when absent."""
    section = read.mapping(document, "layer_sweep", "layer_sweep", optional=True)
    if not section:
        return None
    sizes = section.get("batch_sizes")
    if not isinstance(sizes, list) or not sizes:
        raise read.fail("layer_sweep.batch_sizes", f"expected a list of batch sizes, got {sizes!r}")
    batch_sizes = tuple(read.integer({"value": size}, "value", f"layer_sweep.batch_sizes[{i}]", minimum=1)
                        for i, size in enumerate(sizes))
    if list(batch_sizes) != sorted(set(batch_sizes)):
        raise read.fail("layer_sweep.batch_sizes", f"expected increasing batch sizes, got {sizes!r}")
    ratios = {}
    for phase in ("forward", "backward"):
        field_name = f"layer_sweep.{phase}_ratios"
        rows = section.get(f"{phase}_ratios")
        if not isinstance(rows, list) or len(rows) != num_layers:
            raise read.fail(field_name, f"expected a list of {num_layers} lists (one per layer), got {rows!r}")
        parsed = []
        for layer, row in enumerate(rows):
            if not isinstance(row, list) or len(row) != len(batch_sizes):
                raise read.fail(f"{field_name}[{layer}]",
                                f"expected {len(batch_sizes)} ratios (one per batch size), got {row!r}")
            parsed.append(tuple(read.number({"value": value}, "value", f"{field_name}[{layer}][{i}]", positive=True)
                                for i, value in enumerate(row)))
        ratios[phase] = tuple(parsed)
    return LayerSweep(batch_sizes=batch_sizes, forward_ratios=ratios["forward"], backward_ratios=ratios["backward"])
