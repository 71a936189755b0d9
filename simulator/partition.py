"""Contiguous layer partitions: balanced or serial by dynamic programming, uniform, or given explicitly.

Uniform: equal numbers of the model's repeated layer per stage, as Megatron-LM (num_layers / pp
transformer layers a stage) and DeepSpeed's `PipelineModule(partition_method="type:transformer")`
(what Megatron-DeepSpeed's GPT uses) cut a model; the framework does not weigh the embedding or
the head, which stay on the first and the last stage.

Balanced: choose M contiguous layer ranges minimising the slowest stage, where a stage's cost per
micro-batch is its forward + backward compute, the transfers it sends (its output activations
forward and its input gradients backward) and its share of what closes its step: the part of its
gradient allreduce that its backward does not hide, and its optimizer step (`StageUpdate`). This
is the linear-partition DP (Bokhari 1988) with the PipeDream partitioner's stage cost at a fixed
replication (Narayanan et al. SOSP 2019), O(M L^2), vectorised with numpy. A flushed pipeline
weighs the fill too (`flushed_partition`: the sum plus m - 1 times the slowest stage; interleaved, the busiest device).
Where a GPU's kernels are issued by an asynchronous host (`HostIssue`), a pass over a range takes
max(its device seconds, its host seconds) summed over the range, not the sum of each layer's larger
side: a layer of large GEMMs lets the host catch up on the small kernels beside it.

Serial (one batch through the stages, no micro-batches: GHP, MP): the step is the sum of the
stages' costs plus the longest tail of allreduce and optimizer step left after the backward pass
(`StageUpdate.tail_s`), the GHP paper's T_GHP = sum of compute + boundary transfers + max_j AR_j
(Joo & Youn, IEEE Access 2021; `simulator.heuristics`) with DDP's overlap and the update. Balance
does not matter there: cuts at small activations and allreduces hidden behind the backward do.
For each bound X on the tails, a min-sum DP over the ranges whose tail is at most X; the best
X + sum over every tail value X (quantiles of them on long models: `SERIAL_TAIL_CANDIDATES`, fewer
where M L^2 is large, `SERIAL_TAIL_WORK`), ranges let back in as X rises. A
range may also be refused for memory (`memory_cap_bytes`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np

from simulator.errors import ScenarioError

SERIAL_TAIL_CANDIDATES = 256
"""Most tail bounds X the serial partition tries (quantiles of the tail values when there are more)..."""
SERIAL_TAIL_WORK = 2e8
"""... and fewer on long models with many stages: at most this many (stage, range) entries masked and
chained in all (each bound costs M L^2), at least `SERIAL_MIN_TAIL_CANDIDATES` bounds."""
SERIAL_MIN_TAIL_CANDIDATES = 16
FLUSHED_BOUND_WORK = 2e7
"""`flushed_partition`'s bounds on the slowest chunk cost a min-sum chain each (M L^2): a tenth of
the serial partition's work, as the planner partitions every pipeline geometry it bounds."""
SERIAL_MEMORY_LIMIT_BYTES = 2**28
"""The serial partition holds two (L, L) matrices a stage; beyond this it declines (None)."""


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

    def alone(self) -> StageUpdate:
        """The same update with each ring at its own rate, as if no other ring shared its NICs."""
        return self if self.shared_by is None else \
            replace(self, per_byte_s=self.per_byte_s / self.shared_by, shared_by=None, _sums={})

    def _backward(self, stage: int) -> np.ndarray:
        if np.ndim(self.backward_s) == 1:
            return self.backward_s
        return np.broadcast_to(self.backward_s, (len(self.per_byte_s), len(self.gradient_bytes)))[stage]

    def _sum(self, values: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        key = (id(values), id(starts), id(ends))
        found = self._sums.get(key)
        if found is None:  # the arrays are kept with their sums, so their ids are not reused meanwhile
            found = self._sums[key] = (values, starts, ends, _range_sum(values, starts, ends))
        return found[3]

    def closing_s(self, stage: int, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Seconds after stage `stage`'s backward over layers [start, end] (inclusive): its exposed
        allreduce, then its optimizer step."""
        allreduce = self.per_byte_s[stage] * self._sum(self.gradient_bytes, starts, ends) + self.constant_s[stage]
        if self.overlapped:
            allreduce = np.maximum(allreduce - self._sum(self._backward(stage), starts, ends), 0.0)
        return allreduce + self._sum(self.optimizer_s, starts, ends)

    def closing_parts_s(self, stage: int, start: int, end: int) -> tuple[float, float, float]:
        """`closing_s` in parts for one range: (allreduce, the part the backward leaves exposed, optimizer step)."""
        (gradients,), (optimizer,), backward = self._prefixes
        allreduce = float(self.per_byte_s[stage] * (gradients[end + 1] - gradients[start]) + self.constant_s[stage])
        row = backward[stage % len(backward)]
        exposed = max(allreduce - float(row[end + 1] - row[start]), 0.0) if self.overlapped else allreduce
        return allreduce, exposed, float(optimizer[end + 1] - optimizer[start])

    @cached_property
    def _prefixes(self):  # prefix sums of the gradient bytes, the optimizer steps and each row of the backward
        return tuple(np.concatenate((np.zeros((len(rows), 1)), np.cumsum(rows, axis=1)), axis=1) for rows in (
            np.atleast_2d(self.gradient_bytes)[0:1], np.atleast_2d(self.optimizer_s), np.atleast_2d(self.backward_s)))

    def exposed_s(self, stage: int, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Pipelined: the closing seconds per micro-batch."""
        return self.share * self.closing_s(stage, starts, ends)

    def tail_s(self, stage: int, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Serial: closing seconds left after the whole backward pass, which still runs the backward
        of every stage before this one (layers [0, start))."""
        before = _range_sum(self._backward(stage), 0, starts - 1)
        return np.maximum(self.closing_s(stage, starts, ends) - before, 0.0)


def _range_sum(values, starts, ends):
    """Sum of values[start..end] (inclusive; empty where end < start)."""
    prefix = np.concatenate(([0.0], np.cumsum(values)))
    return prefix[ends + 1] - prefix[starts]


@dataclass(frozen=True)
class HostIssue:
    """Per layer (shape (L,), or (M, L) per stage) the device and host seconds of its forward and
    backward passes (`simulator.costs.compute_parts`). A pass over layers [a, b] takes max(sum of
    device, sum of host): the engine's host issues a pass's kernels ahead of the device and the pass
    ends no earlier than its last kernel is issued (`simulator.engine`)."""

    device_forward_s: np.ndarray
    host_forward_s: np.ndarray
    device_backward_s: np.ndarray
    host_backward_s: np.ndarray

    @property
    def device_s(self) -> np.ndarray:
        """Forward + backward device seconds per layer: the additive part of a range's cost."""
        return self.device_forward_s + self.device_backward_s

    @cached_property
    def _prefix(self) -> np.ndarray:
        """Prefix sums over the layers, shape (6, rows, L + 1): device and host seconds of the
        forward, of the backward, then host less device of either (a range's excess is linear in it)."""
        sides = np.array([np.atleast_2d(values) for values in (self.device_forward_s, self.host_forward_s,
                                                                self.device_backward_s, self.host_backward_s)])
        sides = np.concatenate([sides, sides[1:2] - sides[0:1], sides[3:4] - sides[2:3]])
        return np.concatenate([np.zeros(sides.shape[:2] + (1,)), np.cumsum(sides, axis=2)], axis=2)

    def _rows(self, stage: int) -> np.ndarray:
        return self._prefix[:, 0 if self._prefix.shape[1] == 1 else stage]

    def excess_s(self, stage: int, starts, ends) -> np.ndarray:
        """What the host adds to the device's seconds of ranges [starts, ends] on `stage`, both passes."""
        prefix = self._rows(stage)
        return (np.maximum(prefix[4][ends + 1] - prefix[4][starts], 0.0)
                + np.maximum(prefix[5][ends + 1] - prefix[5][starts], 0.0))

    def pass_s(self, stage: int, start: int, end: int) -> tuple[float, float]:
        """(forward, backward) seconds of one pass over layers [start, end) on `stage`."""
        device_forward, host_forward, device_backward, host_backward = self._rows(stage)[:4, end] - \
            self._rows(stage)[:4, start]
        return float(max(device_forward, host_forward)), float(max(device_backward, host_backward))


def balanced_partition(compute_s: np.ndarray, send_forward_s: np.ndarray, send_backward_s: np.ndarray,
                       num_stages: int, update: StageUpdate | None = None) -> tuple[tuple[int, int], ...]:
    """Layer ranges [(start, end), ...] minimising the slowest stage (module docstring).

    compute_s[l]: forward + backward seconds of layer l, or compute_s[m, l] on the device(s) of
    stage m (heterogeneous devices: a slow device gets fewer layers). send_forward_s[m, l]: seconds
    for stage m to send layer l's output to stage m+1; send_backward_s[m, l]: seconds for stage m
    to send the gradient of layer l's input to stage m-1 (arrays of shape (M, L)); `update`: what
    closes each stage's step (None: nothing is weighed).
    """
    extra = None if update is None else update.exposed_s
    return _best_chain(_stage_costs(compute_s, send_forward_s, send_backward_s, num_stages, extra), np.maximum)[1]


SUM_TIE_TOLERANCE = 1e-9
"""Relative difference below which two splits' sums are equal (rounding): one micro-batch crosses
every layer once whatever the split, so sums often tie, and the least-max chain then wins, whose
largest stage holds, reduces and updates the fewest parameters (a sum-minimising chain among tied
ones may put most layers on one stage)."""


def flushed_partition(compute_s: np.ndarray, send_forward_s: np.ndarray, send_backward_s: np.ndarray,
                      num_chunks: int, update: StageUpdate | None, num_microbatches: int,
                      num_virtual_stages: int = 1, played_s=None, polish_plays: int = 0,
                      host: HostIssue | None = None, allowed=None) -> tuple[tuple[int, int], ...] | None:
    """Layer ranges of a flushed pipeline (GPipe, 1F1B, interleaved, megatron) minimising its step,
    sum_k c_k / v + max((m v - 1) max_k p_k, (m - 1 / v) max_d L_d) over the chunks' costs c_k a
    micro-batch (arguments as `balanced_partition`; c_k holds its share of the stage's update,
    p_k not), L_d the sum of the v chunks device d holds (chunks d, d + M, ...): one micro-batch
    crosses every chunk (the fill and drain), then the slowest chunk and the busiest device pace
    the rest (TeraPipe, Li et al. ICML 2021, eq. 2, with v chunks a device as Narayanan et al.
    SC'21 sec. 2.2 count them; for v = 1 both terms are (m - 1) max_k c_k, and the update, paid
    once a step, paces no chunk m v times). With few micro-batches the fill dominates and
    a split that keeps the transfers small beats one that evens the compute. For each bound X on
    the slowest chunk between the balanced split's and the first that cannot beat it (L_d >= each
    of its chunks), a min-sum chain over the ranges whose cost is at most X (quantiles of the costs
    there when there are more than `SERIAL_TAIL_CANDIDATES`, fewer where M L^2 is large:
    `FLUSHED_BOUND_WORK`). Exact for v = 1; for v > 1 the best of those chains, as no bound on one
    chunk evens the sums of chunks a device holds. `played_s(ranges)`, when given, is the step the
    schedule plays with a split (`schedules.makespan`): the chains found (at least the closed
    form's best) are then ranked by it, as the closed form misses a heavy chunk that delays the fill
    or the drain, and the best is polished by moving one cut at a time (`polished`, at most
    `polish_plays` more plays). With `host`, compute_s is its device seconds and each range pays what
    its host adds (`HostIssue.excess_s`). `allowed`: per chunk, the (L, L) mask of ranges it may take
    (memory); None when no chain of them covers the layers."""
    exposed = None if update is None else update.exposed_s
    issue = None if host is None else host.excess_s
    extra = (lambda m, starts, ends: exposed(m, starts, ends) + issue(m, starts, ends)) if exposed and issue \
        else exposed or issue
    costs = list(_stage_costs(compute_s, send_forward_s, send_backward_s, num_chunks, extra))
    v, paced = num_virtual_stages, num_microbatches - 1 / num_virtual_stages
    num_devices = num_chunks // v
    per_microbatch = costs if v == 1 or exposed is None else \
        list(_stage_costs(compute_s, send_forward_s, send_backward_s, num_chunks, issue))
    if allowed is not None:
        costs, per_microbatch = ([np.where(mask, cost, np.inf) for cost, mask in zip(matrices, allowed)]
                                 for matrices in (costs, per_microbatch))

    def step_s(ranges) -> float:
        chunk_costs = [cost[a, b - 1] for cost, (a, b) in zip(costs, ranges)]
        busiest_s = max(sum(chunk_costs[device::num_devices]) for device in range(num_devices))
        slowest_s = max(cost[a, b - 1] for cost, (a, b) in zip(per_microbatch, ranges))
        return sum(chunk_costs) / v + max((num_microbatches * v - 1) * slowest_s, paced * busiest_s)

    least_max, best = _best_chain(costs, np.maximum)
    least_sum, fewest = _best_chain(costs, np.add)
    if not np.isfinite(least_max):
        return None
    found = {best, fewest}
    best_s = step_s(best)
    if step_s(fewest) < best_s * (1 - SUM_TIE_TOLERANCE):
        best_s, best = step_s(fewest), fewest
    if paced == 0:  # one micro-batch, one chunk a device: the sum alone (ties: the least-max chain), or the play
        return best if played_s is None else polished(min((best, fewest), key=played_s), played_s, polish_plays)
    # a split whose slowest chunk costs X takes at least least_sum / v + max((m v - 1)(X - u), paced X),
    # u the largest update share of a chunk (0 for v = 1): no X from `above` on can beat the best
    share_s = max(float(np.max(cost[np.isfinite(cost)] - plain[np.isfinite(cost)], initial=0.0))
                  for cost, plain in zip(costs, per_microbatch))
    slack_s = best_s - least_sum / v
    above = min(slack_s / paced, slack_s / (num_microbatches * v - 1) + share_s)
    values = np.unique(np.concatenate([cost[(cost >= least_max) & (cost < above)] for cost in costs]))
    count = int(np.clip(FLUSHED_BOUND_WORK / (num_chunks * np.shape(costs[0])[0] ** 2), SERIAL_MIN_TAIL_CANDIDATES,
                        SERIAL_TAIL_CANDIDATES))
    if len(values) > count:
        values = np.unique(np.quantile(values, np.linspace(0.0, 1.0, count)))
    for bound in values:  # ascending: once the floor at X reaches the best, no larger X can beat it
        if least_sum / v + max((num_microbatches * v - 1) * (bound - share_s), paced * bound) >= best_s:
            break
        total, ranges = _best_chain([np.where(cost <= bound, cost, np.inf) for cost in costs], np.add)
        if np.isfinite(total):
            found.add(ranges)
            if step_s(ranges) < best_s:
                best_s, best = step_s(ranges), ranges
    if played_s is None:
        return best
    return polished(min(sorted(found, key=step_s), key=played_s), played_s, polish_plays)  # ties: closed form's order


def polished(ranges, played_s, plays: int):
    """Moves single cuts by one layer while the played step falls, for at most `plays` plays (a
    local search from the best candidate: the chains a bound on one chunk yields can miss a
    neighbour that plays faster)."""
    best, best_s, improved = tuple(ranges), played_s(ranges), plays > 0
    while improved:
        improved = False
        for k in range(len(best) - 1):
            for cut in (best[k][1] - 1, best[k][1] + 1):
                if not best[k][0] < cut < best[k + 1][1] or plays <= 0:
                    continue
                plays -= 1
                moved = (*best[:k], (best[k][0], cut), (cut, best[k + 1][1]), *best[k + 2:])
                moved_s = played_s(moved)
                if moved_s < best_s:
                    best, best_s, improved = moved, moved_s, True
    return best


def serial_partition(compute_s: np.ndarray, send_forward_s: np.ndarray, send_backward_s: np.ndarray,
                     num_stages: int, update: StageUpdate, layer_bytes: np.ndarray | None = None,
                     memory_cap_bytes: float = np.inf) -> tuple[tuple[int, int], ...] | None:
    """Layer ranges minimising the sum of the stages' costs plus the longest tail (module docstring;
    arguments as `balanced_partition`), each stage's sum of `layer_bytes` at most `memory_cap_bytes`;
    None when no partition is that small, or when its matrices would pass `SERIAL_MEMORY_LIMIT_BYTES`."""
    num_layers = np.shape(compute_s)[-1]
    if 2 * num_stages * num_layers**2 * 8 > SERIAL_MEMORY_LIMIT_BYTES:
        return None
    starts = np.arange(num_layers)[:, None]
    ends = np.arange(num_layers)[None, :]
    clipped = np.minimum(starts, ends)
    feasible = starts <= ends
    if layer_bytes is not None:
        feasible &= _range_sum(layer_bytes, clipped, ends) <= memory_cap_bytes
    stage_costs = [(np.where(feasible, cost, np.inf), np.where(feasible, update.tail_s(stage, clipped, ends), np.inf))
                   for stage, cost in enumerate(_stage_costs(compute_s, send_forward_s, send_backward_s, num_stages))]
    values = np.unique(np.concatenate([tail[np.isfinite(tail)] for _, tail in stage_costs]))
    count = int(np.clip(SERIAL_TAIL_WORK / (num_stages * num_layers**2), SERIAL_MIN_TAIL_CANDIDATES, SERIAL_TAIL_CANDIDATES))
    if len(values) > count:
        values = np.unique(np.quantile(values, np.linspace(0.0, 1.0, count)))
    least_total = _best_chain([cost for cost, _ in stage_costs], np.add)[0]  # no bound: a floor for every X's sum
    best_s, best = np.inf, None
    if len(values) == 0:
        return best
    # each stage's costs with the ranges whose tail passes X refused; as X rises, ranges are let back
    # in the order of their tails (each once), instead of masking every stage anew for each X
    masked = [np.where(tail <= values[0], cost, np.inf) for cost, tail in stage_costs]
    pending = []
    for _, tail in stage_costs:
        flat = tail.ravel()
        waiting = np.flatnonzero(np.isfinite(flat) & (flat > values[0]))
        waiting = waiting[np.argsort(flat[waiting], kind="stable")]
        pending.append([waiting, flat[waiting], 0])
    for bound in values:  # ascending: once X + the floor reaches the best, no larger X can beat it
        if bound + least_total >= best_s:
            break
        for (cost, _), stage_masked, entry in zip(stage_costs, masked, pending):
            waiting, tails, done = entry
            stop = int(np.searchsorted(tails, bound, side="right"))
            if stop > done:
                stage_masked.flat[waiting[done:stop]] = cost.flat[waiting[done:stop]]
                entry[2] = stop
        total, ranges = _best_chain(masked, np.add)
        if total + bound < best_s:
            best_s, best = total + bound, ranges
    return best


def _stage_costs(compute_s, send_forward_s, send_backward_s, num_stages: int, extra=None):
    """Per stage m, one after another: cost[start, end] of giving it layers [start, end] (inclusive),
    its compute plus the transfers it sends, plus `extra(m, starts, ends)` when given; inf where
    start > end."""
    compute_s = np.broadcast_to(compute_s, (num_stages, np.shape(compute_s)[-1]))
    num_layers = compute_s.shape[1]
    if num_stages > num_layers:
        raise ValueError(f"{num_stages} stages for {num_layers} layers")
    starts = np.arange(num_layers)[:, None]
    ends = np.arange(num_layers)[None, :]
    clipped = np.minimum(starts, ends)
    for stage in range(num_stages):
        cost = _range_sum(compute_s[stage], clipped, ends)
        if stage < num_stages - 1:
            cost = cost + send_forward_s[stage][None, :]
        if stage > 0:
            cost = cost + send_backward_s[stage][:, None]
        if extra is not None:
            cost = cost + extra(stage, clipped, ends)
        yield np.where(starts > ends, np.inf, cost)


def _best_chain(costs, combine) -> tuple[float, tuple[tuple[int, int], ...]]:
    """(objective, ranges) of the contiguous ranges, one per stage's costs[m][start, end], whose
    costs `combine` best: np.maximum, the slowest stage; np.add, their sum."""
    best_prev, choices = None, []
    for cost in costs:
        num_layers = cost.shape[0]
        value = np.where(np.arange(num_layers)[:, None] == 0, cost, np.inf) if best_prev is None else \
            combine(np.concatenate(([np.inf], best_prev[:-1]))[:, None], cost)
        choices.append(np.argmin(value, axis=0))
        best_prev = value[choices[-1], np.arange(num_layers)]
    ranges, end = [], len(best_prev) - 1
    for choice in reversed(choices):
        start = int(choice[end])
        ranges.append((start, end + 1))
        end = start - 1
    return float(best_prev[-1]), tuple(reversed(ranges))


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
            f"strategy.partition: {list(layer_counts)} must give {num_stages} stage "
            f"size{'s' * (num_stages != 1)} summing to the model's {num_layers} layers")
    bounds = np.concatenate(([0], np.cumsum(layer_counts)))
    return tuple((int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:]))
