"""Long synchronous pipelines: simulate a few micro-batches, verify the steady state, extend it.

A 1F1B pipeline of p stages and m micro-batches runs a fill, then the same cycle over and over
(one forward and one backward per stage: its period T), then a drain. Once the cycle repeats, each
further micro-batch (interleaved_1f1b: each further group of p) adds exactly one period and
changes nothing else: the state at the start of the drain is the same, shifted by T. A simulation
of m' << m micro-batches therefore holds everything a simulation of m holds, if its cycle has
settled. Max-plus linear systems reach such a periodic regime after a transient (Baccelli, Cohen,
Olsder and Quadrat, "Synchronization and Linearity", 1992, sec. 3.7); the flow model's link sharing
is not max-plus, so the regime is checked, never assumed:

- the m'-micro-batch plan is played (m' = p + 8 for 1f1b, 6 p for interleaved_1f1b), its stages
  split as the step of m would split them (`short_plan`);
- T is the distance between the backwards of micro-batches i and i + c on the first stage's rank
  (c = 1, or p interleaved), late in its steady phase;
- three consecutive windows of length T, ending before that rank's last forward, must hold the same
  spans (every rank and stream: kind, size, label without digits, start and end) shifted by T, and
  the same bytes per tier and collective algorithms, to 1e-9 of the makespan; each kind of span
  must number on by one step a period (its micro-batch by c, a CP ring transfer by its counter's);
- then (m - m') / c copies of one window are inserted at its end, and everything later shifts by
  (m - m') / c x T.
- A periodic regime may repeat only every k > c micro-batches: its cyclicity (Baccelli et al.,
  sec. 3.7). Where links are shared, one slightly faster cycle in every p - 2 is common (two
  transfers that meet once a round trip of the pipeline). Where the first play has not settled, a
  longer one (m' = 5 p + 8, or 12 p interleaved: four windows of up to p micro-batches after the
  transient) is searched for the smallest k (a multiple of c) over which the first stage's steady
  backwards repeat (`candidate_periods`), each checked as above with windows of k micro-batches;
  m' is then made congruent to m modulo k (one more play if it is not) so that whole periods fill
  the gap. Where it has not settled either, plays twice as long follow while m' <= m / 2
  (`simulator.simulate`). Otherwise the full plan is simulated, and the summary says why.

Used by megatron plans and the layer-table kinds 1f1b and interleaved_1f1b under `strategy.symmetry:
auto` (off plays every micro-batch) when m is at least twice m' and no activations are offloaded
(their exposed time is per micro-batch), and for megatron when every replica runs at one pace
(`unlike_replicas`). The layer-table kinds take one longer play, not the plays
twice as long: where that has not settled, neither did the next ones (a 64-stage ResNet-1001 over
10 GbE: three failed plays cost twice the step again).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

SETTLE_MICROBATCHES = 8
"""1f1b: micro-batches beyond the p of the fill, so the cycle settles and three windows fit."""
INTERLEAVED_GROUPS = 6
"""interleaved_1f1b: groups of p micro-batches simulated."""
WINDOWS = 3
LONGER_PLAY_STAGES = 4
"""1f1b's longer play: p micro-batches x this beyond the first play's p + 8, room for WINDOWS + 1
windows of up to p micro-batches."""
DIGITS = re.compile(r"\d+")
ONE_F_ONE_B_KINDS = ("megatron", "1f1b", "interleaved_1f1b")
"""The kinds whose synchronous schedule settles into one forward and one backward a stage."""


def short_microbatches(scenario, longer: bool = False, at_least: int = 0,
                       doubled: bool = False) -> tuple[int, int] | None:
    """(m', c) when `scenario` is played on m' micro-batches and extended in steps of c, else None;
    `longer`: the play searched for a cyclicity k > c (module docstring), of at least `at_least`;
    `doubled`: a play twice as long as the last, which megatron plans alone take."""
    strategy, m = scenario.strategy, scenario.strategy.num_microbatches
    if strategy.kind not in ONE_F_ONE_B_KINDS or strategy.symmetry != "auto" or scenario.training.offload_activations:
        return None
    if doubled and strategy.kind != "megatron":
        return None
    p, v = strategy.pp_degree if strategy.kind == "megatron" else scenario.grid()[1], strategy.num_virtual_stages
    if v == 1:
        short, period = (LONGER_PLAY_STAGES * p if longer else 0) + p + SETTLE_MICROBATCHES, 1
    else:
        short, period = (2 if longer else 1) * INTERLEAVED_GROUPS * p, p
    short = max(short, at_least)
    if p < 2 or 2 * short > m or (m - short) % period or scenario.training.global_batch_size * short % m:
        return None
    return None if unlike_replicas(scenario) else (short, period)


def unlike_replicas(scenario) -> str:
    """Why a megatron plan's replicas share no period (the summary's note), else "". Their pipelines
    run apart until the gradient reduction, each at its own devices' pace: a replica holding a
    straggler or another GPU type where another replica does not keeps its own period, and a short
    play never settles (its failed plays cost about the step again). Degraded links are not mapped
    to replicas: those plans are still played short."""
    cluster = scenario.cluster
    if scenario.strategy.kind != "megatron" or not (cluster.stragglers or cluster.node_gpus):
        return ""
    from simulator.errors import ScenarioError
    from simulator.strategies.tensor import tensor_config
    try:
        config = tensor_config(scenario)
    except ScenarioError:  # the step's own plan names the fault
        return ""

    def pace(device: int) -> tuple[str, float]:
        return (cluster.node_gpus.get(device // cluster.gpus_per_node, cluster.gpu).name,
                cluster.stragglers.get(device, 1.0))
    paces = {tuple(pace(config.device_of(replica, stage, rank)) for stage in range(config.pp)
                   for rank in range(config.tp)) for replica in range(config.dp)}
    return "" if len(paces) == 1 else ("every micro-batch simulated: the data-parallel replicas run at different paces "
                                       "(a straggler or another GPU in some of them), so no common period settles")


def shortened(scenario, short: int):
    """`scenario` with `short` micro-batches of the same size (the global batch scaled with them)."""
    strategy, training, m = scenario.strategy, scenario.training, scenario.strategy.num_microbatches
    batch = training.global_batch_size * short // m
    return scenario.model_copy(update={
        "strategy": strategy.model_copy(update={"num_microbatches": short}),
        "training": training.model_copy(update={"global_batch_size": batch})})


def short_plan(scenario, short: int, workload, topology, costs):
    """The plan of `short` micro-batches (`shortened`), its stages split as the step's m micro-batches
    would be (`stage_partition.partitioned_as_the_step`): the balanced split depends on m."""
    from simulator.strategies import compile_plan
    from simulator.strategies.stage_partition import partitioned_as_the_step
    with partitioned_as_the_step(scenario.strategy.num_microbatches):
        return compile_plan(shortened(scenario, short), workload, topology, costs)


class ExtendedSpans(Sequence):
    """The spans of every micro-batch: the played spans with `periods` copies of the window
    [window_s, window_s + T) inserted at its end, each kind of span numbered on by its step per
    period, and the drain after it shifted by periods x T. Built only when first read as a list;
    the summary takes what it needs from the played spans and the window (`periodic_parts`,
    `simulator.records`), so a planner reading summaries never builds millions of tuples."""

    def __init__(self, played: list[tuple], window_s: float, period_s: float, periods: int, templates: list,
                 drain: list):
        self.played, self.window_s, self.period_s, self.periods = played, window_s, period_s, periods
        self._templates, self._drain = templates, drain  # (label parts, step, span) of the window's / drain's spans
        self._list: list[tuple] | None = None

    @property
    def periodic_parts(self) -> tuple[list[tuple], float, float, int]:
        """(the played spans, the window's start, T, periods): the spans are the played ones plus
        `periods` copies of those that start in the window, and cover what the played ones cover
        plus `periods` times what they cover in one steady period (the one after the window)."""
        return self.played, self.window_s, self.period_s, self.periods

    @property
    def makespan_s(self) -> float:
        """The latest end, as the list would give it (the same sums)."""
        cut_s, shift_s = self.window_s + self.period_s, self.periods * self.period_s
        return max([s[5] for s in self.played if s[4] < cut_s] + [s[5] + shift_s for *_, s in self._templates]
                   + [s[5] + shift_s for *_, s in self._drain])

    def _spans(self) -> list[tuple]:
        if self._list is None:
            cut_s, shift_s = self.window_s + self.period_s, self.periods * self.period_s
            self._list = ([s for s in self.played if s[4] < cut_s] + _copies(self._templates, self.period_s, self.periods)
                          + [_moved(span, parts, shift_s, self.periods * step) for parts, step, span in self._drain])
        return self._list

    def __len__(self) -> int:
        return len(self.played) + self.periods * len(self._templates)

    def __getitem__(self, index):
        return self._spans()[index]

    def __iter__(self):
        return iter(self._spans())


@dataclass(frozen=True)
class Extension:
    """The step of every micro-batch, built from the played one: its spans and counts, and the
    period added `periods` times."""

    spans: ExtendedSpans
    tier_bytes: dict[str, float]
    collective_algorithms: dict[str, int]
    period_s: float
    periods: int


class Unaligned(str):
    """`extend`'s answer when the cycle has settled but its period does not divide the micro-batches to add."""


def extend(plan, spans: list[tuple], count_log: list[tuple], tier_bytes: dict, algorithms: dict, short: int,
           period: int, target: int) -> Extension | str:
    """The run of `target` micro-batches from the played run of `short` (`plan`, its spans, the
    engine's `count_log` of (time, is_bytes, key, amount)) with a period of `period` micro-batches,
    or why its steady state cannot be extended (`Unaligned`: it can, from a play of another length)."""
    anchors, last_forward_s = _anchors(plan, spans)
    if len(anchors) <= period:
        return "no steady phase on the first stage"
    period_s = anchors[-1] - anchors[-1 - period]
    makespan_s = max(s[5] for s in spans)
    tolerance_s = 1e-9 * max(makespan_s, 1e-12)
    if period_s <= tolerance_s:
        return "no period"
    window_s = _window_start(spans, count_log, last_forward_s - (WINDOWS + 1) * period_s, period_s)
    windows = [_window(spans, count_log, window_s + k * period_s, period_s, k) for k in range(WINDOWS)]
    steps: dict[tuple, int] = {}
    for k in range(1, WINDOWS):
        reason = _same(windows[k - 1], windows[k], tolerance_s, steps)
        if reason:
            return f"the cycle has not settled within {short} micro-batches ({reason})"
    if (target - short) % period:
        return Unaligned(f"a period of {period} micro-batches does not divide the {target - short} to add")
    periods = (target - short) // period
    extended = _extended_spans(spans, window_s, period_s, periods, steps)
    if isinstance(extended, str):
        return extended
    return Extension(extended, _added(tier_bytes, windows[0][1], periods), _added(algorithms, windows[0][2], periods),
                     period_s, periods)


def candidate_periods(plan, spans: list[tuple], base: int) -> list[int]:
    """The periods k (multiples of `base` micro-batches, ascending) worth checking with `extend`: the
    first stage's steady backward starts repeat every k over their last 3 k gaps (room for the
    windows: k at most a quarter of them)."""
    anchors, _ = _anchors(plan, spans)
    gaps = [b - a for a, b in zip(anchors, anchors[1:])]
    tolerance_s = 1e-9 * max(max(s[5] for s in spans), 1e-12)
    return [k for k in range(base, len(anchors) // (WINDOWS + 1) + 1, base)
            if all(abs(gaps[i] - gaps[i + k]) <= tolerance_s for i in range(len(gaps) - 3 * k, len(gaps) - k))]


def _anchors(plan, spans) -> tuple[list[float], float | None]:
    """(the first stage's backward starts, one per micro-batch, up to its last forward, sorted;
    the start of that last forward)."""
    backward_starts: dict[int, float] = {}
    last_forward_s = None
    for action, span in _first_rank_computes(plan, spans):
        if action.phase == "B":
            backward_starts.setdefault(action.microbatch, span[4])
        elif action.phase == "F":
            last_forward_s = span[4]
    return sorted(start for start in backward_starts.values()
                  if last_forward_s is not None and start <= last_forward_s), last_forward_s


def _first_rank_computes(plan, spans):
    """(action, span) of rank 0's compute stream in order, recomputed forwards left out."""
    recomputed = set(plan.meta.get("recompute_actions", {}).get(0, ()))
    computes = [a for a in plan.actions[0] if hasattr(a, "phase")]
    played = sorted((s for s in spans if s[0] == 0 and s[1] == "compute"), key=lambda s: s[4])
    return [(a, s) for a, s in zip(computes, played) if a.id not in recomputed]


def _window_start(spans, count_log, earliest_s: float, period_s: float) -> float:
    """A window start in [earliest_s, earliest_s + period_s) that lies in the widest gap between span
    starts (modulo the period), so no boundary cuts through a tie of floating-point times."""
    offsets = sorted({(s[4] - earliest_s) % period_s for s in spans if earliest_s <= s[4] < earliest_s + period_s}
                     | {(entry[0] - earliest_s) % period_s for entry in count_log
                        if earliest_s <= entry[0] < earliest_s + period_s})
    if not offsets:
        return earliest_s
    gaps = [(b - a, a) for a, b in zip(offsets, offsets[1:])] + [(offsets[0] + period_s - offsets[-1], offsets[-1])]
    width, after = max(gaps)
    return earliest_s + (after + width / 2) % period_s


def _window(spans, count_log, start_s: float, period_s: float, k: int):
    """(the spans starting in [start_s, start_s + T), shifted back by k T, sorted; bytes per tier;
    algorithm counts)."""
    end_s, shift_s = start_s + period_s, k * period_s
    inside = sorted((rank, stream, DIGITS.sub("", name), kind, size, begin - shift_s, end - shift_s, microbatch)
                    for rank, stream, name, kind, begin, end, size, microbatch in spans if start_s <= begin < end_s)
    tiers: dict = {}
    algorithms: dict = {}
    for time_s, is_bytes, key, amount in count_log:
        if start_s <= time_s < end_s:
            counts = tiers if is_bytes else algorithms
            counts[key] = counts.get(key, 0) + amount
    return inside, tiers, algorithms


def _same(one, other, tolerance_s: float, steps: dict) -> str:
    """'' when a window and the next hold the same spans and counts, else what differs. `steps`
    collects how far each kind of span (rank, stream, label without digits, kind) numbers on per
    period: its micro-batch (c) or another counter (a CP ring's transfers); one step per kind."""
    if len(one[0]) != len(other[0]):
        return f"{len(one[0])} spans in one period, {len(other[0])} in the next"
    for a, b in zip(one[0], other[0]):
        if a[:5] != b[:5] or abs(a[5] - b[5]) > tolerance_s or abs(a[6] - b[6]) > tolerance_s:
            return f"rank {a[0]} {a[1]} differs"
        if (a[7] < 0) != (b[7] < 0) or steps.setdefault(a[:4], b[7] - a[7]) != b[7] - a[7]:
            return f"rank {a[0]} {a[1]} numbers its spans unevenly"
    if one[2] != other[2] or one[1].keys() != other[1].keys() or any(
            abs(one[1][key] - other[1][key]) > 1e-9 * max(abs(one[1][key]), 1.0) for key in one[1]):
        return "the traffic differs"
    return ""


def _extended_spans(spans, window_s: float, period_s: float, periods: int, steps: dict) -> ExtendedSpans | str:
    """`spans` with `periods` copies of the window [window_s, window_s + T) inserted after it, each
    kind of span numbered on by its step per period (`steps`) (`ExtendedSpans`); or why not."""
    cut_s = window_s + period_s
    templates = [(_label_parts(s[2], s[7]), _step(s, steps), s) for s in spans if window_s <= s[4] < cut_s]
    if any(step is None for _, step, _ in templates):
        return "a span of the steady state has no step"
    drain = []
    for span in spans:
        if span[4] >= cut_s:
            step = _step(span, steps)
            if step is None:
                return f"rank {span[0]}'s {span[1]} span {span[2]!r} of the drain numbers on unlike the steady state's"
            drain.append((_label_parts(span[2], span[7]), step, span))
    return ExtendedSpans(spans, window_s, period_s, periods, templates, drain)


def _copies(templates: list[tuple], period_s: float, periods: int) -> list[tuple]:
    """The window's spans (`templates`: (label parts, step, span)) copied `periods` times, copy j
    shifted by j T and numbered on by j steps, in order: `_moved` of each, inlined (millions of
    spans in a long step)."""
    copies: list[tuple] = []
    append = copies.append
    for j in range(1, periods + 1):
        shift_s = j * period_s
        for parts, step, (rank, stream, name, kind, start, end, size, microbatch) in templates:
            if parts is not None and step:
                microbatch += j * step
                if parts[1] is not None:
                    name = f"{parts[0]}{microbatch}{parts[1]}"
            append((rank, stream, name, kind, start + shift_s, end + shift_s, size, microbatch))
    return copies


def _step(span: tuple, steps: dict) -> int | None:
    """How far the span's number moves per period: 0 for a span of no micro-batch, else its kind's."""
    if span[7] < 0:
        return 0
    return steps.get((span[0], span[1], DIGITS.sub("", span[2]), span[3]))


def _moved(span: tuple, parts: tuple | None, shift_s: float, renumber: int) -> tuple:
    """The span `shift_s` later and numbered `renumber` on (its label around the number: `parts`)."""
    rank, stream, name, kind, start, end, size, microbatch = span
    if parts is not None and renumber:
        microbatch += renumber
        name = name if parts[1] is None else f"{parts[0]}{microbatch}{parts[1]}"
    return rank, stream, name, kind, start + shift_s, end + shift_s, size, microbatch


def _label_parts(name: str, microbatch: int) -> tuple[str, str | None] | None:
    """(before, after) the label's micro-batch number (its first number equal to it; after None:
    the label has none); None for a span of no micro-batch."""
    if microbatch < 0:
        return None
    for match in DIGITS.finditer(name):
        if int(match.group()) == microbatch:
            return name[:match.start()], name[match.end():]
    return name, None


def _added(counts: dict, per_period: dict, periods: int) -> dict:
    total = dict(counts)
    for key, amount in per_period.items():
        total[key] = total.get(key, 0) + periods * amount
    return total


def extended_plan(plan, target: int):
    """The played plan's summary view: the step's micro-batch count and replica batch (the played
    one's micro-batches are of the same size), and, as `played_microbatches`, the count it played."""
    played = plan.meta["num_microbatches"]
    return replace(plan, group_batch=plan.group_batch * target / played,
                   meta={**plan.meta, "num_microbatches": target, "played_microbatches": played})

