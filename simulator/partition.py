"""Contiguous layer partitions: balanced by dynamic programming, uniform, or given explicitly.

Uniform: equal numbers of the model's repeated layer per stage, as Megatron-LM (num_layers / pp
transformer layers a stage) and DeepSpeed's `PipelineModule(partition_method="type:transformer")`
(what Megatron-DeepSpeed's GPT uses) cut a model; the framework does not weigh the embedding or
the head, which stay on the first and the last stage.

Balanced: choose M contiguous layer ranges minimising the slowest stage, where a stage's cost is
its forward + backward compute plus the transfers it sends: its output activations forward and
its input gradients backward. This is the linear-partition DP (Bokhari 1988; the PipeDream
partitioner, Narayanan et al. SOSP 2019, without replication), O(M L^2), vectorised with numpy.
"""

from __future__ import annotations

import numpy as np

from simulator.errors import ScenarioError


def balanced_partition(compute_s: np.ndarray, send_forward_s: np.ndarray, send_backward_s: np.ndarray,
                       num_stages: int) -> tuple[tuple[int, int], ...]:
    """Layer ranges [(start, end), ...] minimising max stage cost.

    compute_s[l]: forward + backward seconds of layer l, or compute_s[m, l] on the device(s) of
    stage m (heterogeneous devices: a slow device gets fewer layers). send_forward_s[m, l]: seconds
    for stage m to send layer l's output to stage m+1; send_backward_s[m, l]: seconds for stage m
    to send the gradient of layer l's input to stage m-1 (arrays of shape (M, L)).
    """
    compute_s = np.broadcast_to(compute_s, (num_stages, np.shape(compute_s)[-1]))
    num_layers = compute_s.shape[1]
    if num_stages > num_layers:
        raise ValueError(f"{num_stages} stages for {num_layers} layers")
    prefixes = np.concatenate((np.zeros((num_stages, 1)), np.cumsum(compute_s, axis=1)), axis=1)
    starts = np.arange(num_layers)[:, None]
    ends = np.arange(num_layers)[None, :]
    invalid = starts > ends
    best_prev = None
    choices = []
    for stage in range(num_stages):
        prefix = prefixes[stage]
        cost = prefix[ends + 1] - prefix[starts]
        if stage < num_stages - 1:
            cost = cost + send_forward_s[stage][None, :]
        if stage > 0:
            cost = cost + send_backward_s[stage][:, None]
        if best_prev is None:
            value = np.where(starts == 0, cost, np.inf)
        else:
            before = np.concatenate(([np.inf], best_prev[:-1]))[:, None]
            value = np.maximum(before, cost)
        value = np.where(invalid, np.inf, value)
        choices.append(np.argmin(value, axis=0))
        best_prev = value[choices[-1], np.arange(num_layers)]
    ranges = []
    end = num_layers - 1
    for stage in range(num_stages - 1, -1, -1):
        start = int(choices[stage][end])
        ranges.append((start, end + 1))
        end = start - 1
    return tuple(reversed(ranges))


def uniform_partition(layer_kinds: list[str], num_stages: int) -> tuple[tuple[int, int], ...]:
    """Ranges giving each stage an equal count of the most common layer kind (the first stages
    take one more when it does not divide); layers before the first such layer join the first
    stage, every other layer the stage of the repeated layer before it (module docstring)."""
    repeated = max(set(layer_kinds), key=lambda kind: (layer_kinds.count(kind), kind))
    positions = [index for index, kind in enumerate(layer_kinds) if kind == repeated]
    if num_stages > len(positions):
        raise ScenarioError(f"strategy.partition: uniform needs at least {num_stages} {repeated!r} layers "
                            f"for {num_stages} stages; the model has {len(positions)}")
    per_stage, extra = divmod(len(positions), num_stages)
    counts = [per_stage + (stage < extra) for stage in range(num_stages)]
    starts = [0] + [positions[sum(counts[:stage])] for stage in range(1, num_stages)]
    return tuple(zip(starts, starts[1:] + [len(layer_kinds)]))


def explicit_partition(layer_counts: tuple[int, ...], num_layers: int, num_stages: int) -> tuple[tuple[int, int], ...]:
    """Ranges from layer counts per stage; ScenarioError if they do not cover the model exactly."""
    if len(layer_counts) != num_stages or sum(layer_counts) != num_layers:
        raise ScenarioError(
            f"strategy.partition: {list(layer_counts)} must give {num_stages} stage sizes summing "
            f"to the model's {num_layers} layers")
    bounds = np.concatenate(([0], np.cumsum(layer_counts)))
    return tuple((int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:]))
