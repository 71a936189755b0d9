"""What a stage's costs are made of besides its compute, as the partitions weigh them
(`simulator.partition`): what closes its step (`StageUpdate`: its gradient reduction beyond what
its backward hides, then its optimizer step) and what its host adds to a pass (`HostIssue`)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np


@dataclass(frozen=True)
class StageUpdate:
    """What closes a stage's step over layers [a, b]: its gradient allreduce among its replicas,
    AR = per_byte_s[m] x (gradient bytes of [a, b]) + constant_s[m] (a ring allreduce is affine in
    its size; zero without replicas), then its optimizer step, the sum of optimizer_s[a..b]. DDP's
    buckets start the allreduce as the stage's backward starts, so it exposes max(0, AR - backward
    of [a, b]) (all of AR when not `overlapped`); `share` is updates per micro-batch: 1/m for the
    flushed kinds, 1 for the asynchronous ones."""

    per_byte_s: np.ndarray  # (M,)
    constant_s: np.ndarray  # (M,)
    gradient_bytes: np.ndarray  # (L,)
    backward_s: np.ndarray  # (L,) or (M, L)
    optimizer_s: np.ndarray  # (L,)
    share: float
    overlapped: bool
    _sums: dict = field(default_factory=dict, repr=False, compare=False)
    """(id of values, starts, ends) -> (the arrays, their range sums): every stage's costs share the
    index grids, and the per-layer arrays are the same for every stage but a heterogeneous backward."""
    shared_by: np.ndarray | None = None
    """(M,) how many stage rings per_byte_s[m] assumes share the NIC of stage m's busiest node (all
    at once, the closed form's separable price); None: per_byte_s is the ring's own rate."""
    expert_bytes: np.ndarray | None = None
    """(L,) expert weight gradient bytes reduced among fewer copies (megatron's expert parallelism,
    `strategies.chain_reduction`), at expert_per_byte_s[m] + expert_constant_s[m] (M,) where a range
    holds any; `gradient_bytes` then counts the other weights' alone. None: no such reduction."""
    expert_per_byte_s: np.ndarray | None = None
    expert_constant_s: np.ndarray | None = None

    def alone(self) -> StageUpdate:
        """The same update with each ring at its own rate, as if no other ring shared its NICs."""
        if self.shared_by is None:
            return self
        experts = None if self.expert_per_byte_s is None else self.expert_per_byte_s / self.shared_by
        return replace(self, per_byte_s=self.per_byte_s / self.shared_by, shared_by=None, _sums={},
                       expert_per_byte_s=experts)

    def _reduced_s(self, stage: int, gradient_bytes, expert_bytes):
        """The reduction of ranges holding `gradient_bytes` and `expert_bytes` (arrays or floats) on `stage`."""
        seconds = self.per_byte_s[stage] * gradient_bytes + self.constant_s[stage]
        if self.expert_bytes is None:
            return seconds
        return seconds + self.expert_per_byte_s[stage] * expert_bytes + np.where(
            expert_bytes > 0, self.expert_constant_s[stage], 0.0)

    def _backward(self, stage: int) -> np.ndarray:
        if np.ndim(self.backward_s) == 1:
            return self.backward_s
        return np.broadcast_to(self.backward_s, (len(self.per_byte_s), len(self.gradient_bytes)))[stage]

    def _sum(self, values: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        key = (id(values), id(starts), id(ends))
        found = self._sums.get(key)
        if found is None:  # the arrays are kept with their sums, so their ids are not reused meanwhile
            found = self._sums[key] = (values, starts, ends, range_sum(values, starts, ends))
        return found[3]

    def closing_s(self, stage: int, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Seconds after stage `stage`'s backward over layers [start, end] (inclusive): its exposed
        allreduce, then its optimizer step."""
        experts = 0.0 if self.expert_bytes is None else self._sum(self.expert_bytes, starts, ends)
        allreduce = self._reduced_s(stage, self._sum(self.gradient_bytes, starts, ends), experts)
        if self.overlapped:
            allreduce = np.maximum(allreduce - self._sum(self._backward(stage), starts, ends), 0.0)
        return allreduce + self._sum(self.optimizer_s, starts, ends)

    def closing_parts_s(self, stage: int, start: int, end: int) -> tuple[float, float, float]:
        """`closing_s` in parts for one range: (allreduce, the part the backward leaves exposed, optimizer step)."""
        (gradients, experts), (optimizer,), backward = self._prefixes
        allreduce = float(self._reduced_s(stage, gradients[end + 1] - gradients[start],
                                          experts[end + 1] - experts[start]))
        row = backward[stage % len(backward)]
        exposed = max(allreduce - float(row[end + 1] - row[start]), 0.0) if self.overlapped else allreduce
        return allreduce, exposed, float(optimizer[end + 1] - optimizer[start])

    @cached_property
    def _prefixes(self):  # prefix sums of the gradient bytes, the optimizer steps and each row of the backward
        experts = np.zeros_like(self.gradient_bytes) if self.expert_bytes is None else self.expert_bytes
        return tuple(np.concatenate((np.zeros((len(rows), 1)), np.cumsum(rows, axis=1)), axis=1) for rows in (
            np.array([self.gradient_bytes, experts], dtype=float), np.atleast_2d(self.optimizer_s),
            np.atleast_2d(self.backward_s)))

    def exposed_s(self, stage: int, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Pipelined: the closing seconds per micro-batch."""
        return self.share * self.closing_s(stage, starts, ends)

    def tail_s(self, stage: int, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Serial: closing seconds left after the whole backward pass, which still runs the backward
        of every stage before this one (layers [0, start))."""
        before = range_sum(self._backward(stage), 0, starts - 1)
        return np.maximum(self.closing_s(stage, starts, ends) - before, 0.0)


def range_sum(values, starts, ends):
    """Sum of values[start..end] (inclusive; empty where end < start)."""
    prefix = np.concatenate(([0.0], np.cumsum(values)))
    return prefix[ends + 1] - prefix[starts]


@dataclass(frozen=True)
class HostIssue:
    """Per layer (shape (L,), or (M, L) per stage) the device and host seconds of its forward and
    backward passes (`simulator.costs.compute_parts`), what each pass plays after its compute
    (`after_*`: a megatron pass's TP collectives, `strategies.pass_tails`) and what a backward
    re-runs before it that waits for no gradient (`redo_*`: a layer-table pipeline's recomputed
    forward, `ghp.apply_training_options`). A pass over layers [a, b] takes max(sum of device, sum
    of host) + sum of after: the engine's host issues a pass's kernels ahead of the device and the
    compute ends no earlier than its last kernel is issued (`simulator.engine`); the collectives
    wait for the compute. A recompute takes max(sum of device, sum of host) the same way."""

    device_forward_s: np.ndarray
    host_forward_s: np.ndarray
    device_backward_s: np.ndarray
    host_backward_s: np.ndarray
    after_forward_s: np.ndarray | float = 0.0
    after_backward_s: np.ndarray | float = 0.0
    redo_device_s: np.ndarray | float = 0.0
    redo_host_s: np.ndarray | float = 0.0

    @property
    def device_s(self) -> np.ndarray:
        """Device seconds per layer of its passes and what comes with them: the additive part of a range's cost."""
        return (self.device_forward_s + self.device_backward_s + self.after_forward_s + self.after_backward_s
                + self.redo_device_s)

    @cached_property
    def _prefix(self) -> np.ndarray:
        """Prefix sums over the layers, shape (11, rows, L + 1): device and host seconds of the
        forward, of the backward, host less device of either (a range's excess is linear in it), the
        seconds after each pass, then device and host seconds of the recompute and host less device."""
        rows = np.broadcast_arrays(*(np.atleast_2d(values) for values in (
            self.device_forward_s, self.host_forward_s, self.device_backward_s, self.host_backward_s,
            self.after_forward_s, self.after_backward_s, self.redo_device_s, self.redo_host_s)))
        sides = np.array([*rows[:4], rows[1] - rows[0], rows[3] - rows[2], *rows[4:], rows[7] - rows[6]])
        return np.concatenate([np.zeros(sides.shape[:2] + (1,)), np.cumsum(sides, axis=2)], axis=2)

    def _rows(self, stage: int) -> np.ndarray:
        return self._prefix[:, 0 if self._prefix.shape[1] == 1 else stage]

    def excess_s(self, stage: int, starts, ends) -> np.ndarray:
        """What the host adds to the device's seconds of ranges [starts, ends] on `stage`: passes, recompute."""
        prefix = self._rows(stage)
        excess = (np.maximum(prefix[4][ends + 1] - prefix[4][starts], 0.0)
                  + np.maximum(prefix[5][ends + 1] - prefix[5][starts], 0.0))
        if self._recomputes:
            excess += np.maximum(prefix[10][ends + 1] - prefix[10][starts], 0.0)
        return excess

    @cached_property
    def _recomputes(self) -> bool:
        return bool(np.any(self.redo_device_s) or np.any(self.redo_host_s))

    def pass_s(self, stage: int, start: int, end: int) -> tuple[float, float]:
        """(forward, backward) seconds of one pass over layers [start, end) on `stage`."""
        rows = self._rows(stage)
        device_forward, host_forward, device_backward, host_backward = rows[:4, end] - rows[:4, start]
        after_forward, after_backward = rows[6:8, end] - rows[6:8, start]
        return (float(max(device_forward, host_forward) + after_forward),
                float(max(device_backward, host_backward) + after_backward))

    def redo_s(self, stage: int, start: int, end: int) -> float:
        """Seconds of the recompute before a backward over layers [start, end) on `stage`."""
        rows = self._rows(stage)
        return float(max(rows[8, end] - rows[8, start], rows[9, end] - rows[9, start]))


def joined_classes(sets: list) -> list[int]:
    """Per item, its class: the least index of the items whose sets (of nodes, of links) it meets,
    joined transitively; -1 where its set is None."""
    classes = {item: item for item, members in enumerate(sets) if members is not None}
    for item in classes:
        for other in range(item):
            if other in classes and sets[other] & sets[item] and classes[other] != classes[item]:
                old, new = classes[item], classes[other]
                classes = {key: new if value == old else value for key, value in classes.items()}
    return [classes.get(item, -1) for item in range(len(sets))]
