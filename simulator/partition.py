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

import numpy as np

from simulator.errors import ScenarioError
from simulator.stage_costs import HostIssue, StageUpdate, range_sum

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
    unshared = list(_stage_costs(compute_s, send_forward_s, send_backward_s, num_chunks, issue))  # no update share
    if allowed is not None:  # masked once: the update's share keeps a refused range at inf
        unshared = [np.where(mask, cost, np.inf) for cost, mask in zip(unshared, allowed)]
    costs = unshared if exposed is None else _with_update(unshared, exposed)
    v, paced = num_virtual_stages, num_microbatches - 1 / num_virtual_stages
    num_devices = num_chunks // v
    per_microbatch = costs if v == 1 else unshared

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
    if exposed is not None and played_s is not None:  # the play may prefer the split of compute and transfers alone
        found.add(_best_chain(unshared, np.maximum)[1])
    best_s = step_s(best)
    if step_s(fewest) < best_s * (1 - SUM_TIE_TOLERANCE):
        best_s, best = step_s(fewest), fewest
    if paced == 0:  # one micro-batch, one chunk a device: the sum alone (ties: the least-max chain), or the play
        return best if played_s is None else polished(min((best, fewest), key=played_s), played_s, polish_plays)
    # a split whose slowest chunk costs X takes at least floor(X) = least_sum / v + max((m v - 1)(X - u(X)),
    # paced X), u(X) the largest update share of a range costing at most X (0 for v = 1): no X from `above`
    # on, nor past the last X whose floor is under the best, can beat the best
    largest_share_s = max(float(np.max(cost[np.isfinite(cost)] - plain[np.isfinite(cost)], initial=0.0))
                          for cost, plain in zip(costs, per_microbatch))
    slack_s = best_s - least_sum / v
    above = min(slack_s / paced, slack_s / (num_microbatches * v - 1) + largest_share_s)
    share_s = _largest_share_within(costs, per_microbatch, least_max, above)
    values = np.unique(np.concatenate([cost[(cost >= least_max) & (cost < above)] for cost in costs]))

    def floor_s(bounds):
        return least_sum / v + np.maximum((num_microbatches * v - 1) * (bounds - share_s(bounds)), paced * bounds)
    values = values[:int(np.flatnonzero(floor_s(values) < best_s)[-1]) + 1] if np.any(floor_s(values) < best_s) \
        else values[:0]
    count = int(np.clip(FLUSHED_BOUND_WORK / (num_chunks * np.shape(costs[0])[0] ** 2), SERIAL_MIN_TAIL_CANDIDATES,
                        SERIAL_TAIL_CANDIDATES))
    if len(values) > count:
        values = np.unique(np.quantile(values, np.linspace(0.0, 1.0, count)))
    for bound, floor in zip(values, floor_s(values)):  # ascending
        if floor >= best_s:  # (the best falls as the loop goes)
            continue
        total, ranges = _best_chain([np.where(cost <= bound, cost, np.inf) for cost in costs], np.add)
        if np.isfinite(total):
            found.add(ranges)
            if step_s(ranges) < best_s:
                best_s, best = step_s(ranges), ranges
    if played_s is None:
        return best
    return polished(min(sorted(found, key=step_s), key=played_s), played_s, polish_plays)  # ties: closed form's order


def _largest_share_within(costs, per_microbatch, low: float, high: float):
    """bounds (in [low, high)) -> per bound X, the largest update share (cost less its per-micro-batch
    cost) of any chunk's range costing at most X; 0 where the costs carry none."""
    if costs is per_microbatch:
        return lambda bounds: np.zeros_like(bounds, dtype=float)
    below = [np.isfinite(cost) & (cost < low) for cost in costs]
    base = max((float(np.max(cost[mask] - plain[mask], initial=0.0))
                for cost, plain, mask in zip(costs, per_microbatch, below)), default=0.0)
    within = [(cost >= low) & (cost < high) for cost in costs]
    keys = np.concatenate([cost[mask] for cost, mask in zip(costs, within)])
    shares = np.concatenate([cost[mask] - plain[mask] for cost, plain, mask in zip(costs, per_microbatch, within)])
    order = np.argsort(keys, kind="stable")
    keys, largest = keys[order], np.maximum.accumulate(np.maximum(shares[order], base)) if len(keys) else shares

    def share_s(bounds):
        index = np.searchsorted(keys, bounds, side="right")
        return np.where(index > 0, largest[np.maximum(index - 1, 0)] if len(keys) else base, base)
    return share_s


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
        feasible &= range_sum(layer_bytes, clipped, ends) <= memory_cap_bytes
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
        cost = range_sum(compute_s[stage], clipped, ends)
        if stage < num_stages - 1:
            cost = cost + send_forward_s[stage][None, :]
        if stage > 0:
            cost = cost + send_backward_s[stage][:, None]
        if extra is not None:
            cost = cost + extra(stage, clipped, ends)
        yield np.where(starts > ends, np.inf, cost)


def _with_update(costs, exposed):
    """Each stage's costs plus `exposed(m, starts, ends)`, its update's share (inf stays inf)."""
    starts, ends = np.arange(costs[0].shape[0])[:, None], np.arange(costs[0].shape[0])[None, :]
    clipped = np.minimum(starts, ends)
    return [cost + exposed(stage, clipped, ends) for stage, cost in enumerate(costs)]


def searched_partition(partition, num_chunks: int):
    """`strategy.partition` as a searched layout of `num_chunks` chunks takes it: a split given for
    another chunk count gives way to the balanced one."""
    return partition if isinstance(partition, str) or len(partition) == num_chunks else "balanced"


def least_max_chain(costs) -> float:
    """The least, over splits into contiguous ranges (one per costs[m][start, end]), of the largest range cost."""
    return _best_chain(costs, np.maximum)[0]


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
