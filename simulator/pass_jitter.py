"""Pass-to-pass jitter: the predicted median step when every rank's speed varies from step to step.

A calibration's layer figures are medians of back-to-back blocks: the typical speed of a pass. A
synchronous step, though, waits for its slowest rank, and on a shared host the ranks' speeds
vary from pass to pass and from rank to rank (time slices, other tenants, caches). The expected
maximum of n such times lies above their common median (for two normal times of deviation sigma
and correlation rho, by sigma sqrt((1 - rho) / pi); Clark, Operations Research 9(2), 1961), and the
validator reports the median over steps of the step time, which is that maximum.

The profile's `pass_jitter` section (`validator.pass_jitter_bench`) holds rows of whole-model pass
times, one row per pass, one column per rank, k ranks passing at once (k = all ranks, and on a CPU
host with fewer cores also k = the cores). Each row divided by the median over all rows and ranks
of its level is one joint draw of the ranks' speed factors (the correlation between ranks kept).
The level used is the one nearest the plan's compute concurrency (ranks' compute time over the
nominal step: ~world for data parallelism, ~1 for a pipeline's ranks taking turns), since k ranks
sharing fewer cores vary more than k ranks with a core each. The engine plays the same plan once
per draw with every rank's compute (passes, update, weight passes, selection) scaled by its factor
(`cluster.stragglers`' mechanism, `simulator.heterogeneity.Slowed`), and the prediction is the
median over draws of the step time. Draws are taken at evenly spaced rows (the rows are in time
order, so the spells of a calibration are all represented), deterministically.

Start offsets (`start_offsets_s`, recorded when all ranks run on one host): the ranks do not leave
a barrier together. With more ranks than cores, those woken last wait for a core while the first
ones compute (measured here with 4 ranks on 2 cores: the last rank left 7.7-9.4 ms after the first
in the median pass). A draw then also delays each rank's first action by its offset, and the step
is timed as the validator times it: the slowest rank's time from its own start to its end.
A barrier is a collective followed by compute, and so is the allreduce a data-parallel rank waits
for before its update: a rank that waited for a collective resumes after an exit offset drawn the
same way, from the row half the calibration further on (independent of the draw's start offsets).
Traced here (ResNet, 4-rank DP, 90 steps): the allreduce ended on the last rank 7.1 ms after the
last rank issued it in the median step (10th-90th percentile 3.7-12.6 ms; the fit: 2.7 ms), while the first ranks to leave
it ran their updates.

On a shared host (`host_parallelism` P known: a calibrated CPU host, `simulator.host_sharing`) a
rank's measured pass time is not its work: a rank computing while the others wait runs at a whole
core, one that shares runs slower, and the engine plays the draw on that same pool. So a row's
factors are the ranks' work (core-seconds) under processor sharing, recovered from the measured
intervals [offset, offset + time]: between consecutive interval ends with n ranks computing, each
runs at min(1, P / n) (`shared_work_s`); over the level's median work. Replayed on the pool, one
pass of the row ends as measured. Without a shared host a factor is the time over the level's
median time.
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

DEFAULT_JITTER_SAMPLES = 31
"""Engine runs (draws) per jittered prediction."""


Rows = tuple[tuple[float, ...], ...]


@dataclass(frozen=True)
class PassJitter:
    """The profile's `pass_jitter` section: `levels[k][i][r]` = rank r's time in pass i with k ranks
    passing at once, over the median of all k ranks' passes; `start_offsets_s[k][i][r]` = rank r's
    start of that pass after the first rank's, seconds (a level without: all ranks at once);
    `times_s[k]` the level's rows in seconds (absent: `levels` stands for them)."""
    batch_size: int
    levels: Mapping[int, Rows]
    start_offsets_s: Mapping[int, Rows] = field(default_factory=dict)
    times_s: Mapping[int, Rows] = field(default_factory=dict)

    def level_for(self, concurrency: float) -> int:
        """The measured number of ranks at once nearest to `concurrency` (ties: the larger)."""
        return min(self.levels, key=lambda k: (abs(k - concurrency), -k))

    def draws(self, level: int, samples: int) -> list[tuple[float, ...]]:
        """`samples` rows of `level` at evenly spaced positions (all rows when there are fewer)."""
        rows = self.levels[level]
        return [rows[i] for i in _spaced(len(rows), samples)]

    def speed_draws(self, level: int, samples: int,
                    parallelism: float | None = None) -> list[tuple[tuple[float, ...], tuple[float, ...]]]:
        """(factors, start offsets in seconds) of `samples` rows of `level`, spaced as `draws`. With
        `parallelism` P (a shared host) the factors are the ranks' work under processor sharing over
        the level's median work (module docstring); else the rows of `levels`."""
        factors = self.levels[level]
        offsets = self.start_offsets_s.get(level) or tuple((0.0,) * len(row) for row in factors)
        if parallelism is not None:
            times = self.times_s.get(level) or factors
            work = [shared_work_s(starts, row, parallelism) for starts, row in zip(offsets, times)]
            median_work = statistics.median(w for row in work for w in row)
            factors = tuple(tuple(w / median_work for w in row) for row in work)
        return [(factors[i], offsets[i]) for i in _spaced(len(factors), samples)]

    def exit_draws(self, level: int, samples: int) -> list[tuple[float, ...]]:
        """Offsets (seconds) of the ranks' exits from a collective they waited for, one row per draw
        of `speed_draws`: the start offsets of the row half the level's rows further on (so
        independent of the draw's own start offsets; all zero at a level without them)."""
        rows = self.start_offsets_s.get(level)
        if not rows:
            return [(0.0,) * len(self.levels[level][0])] * len(_spaced(len(self.levels[level]), samples))
        return [rows[(i + len(rows) // 2) % len(rows)] for i in _spaced(len(rows), samples)]

    def spread(self, level: int) -> dict:
        """The median over passes of the slowest rank's factor, and the ranks' mean coefficient of
        variation, at `level`."""
        rows = self.levels[level]
        cvs = [statistics.pstdev(c) / statistics.mean(c) for c in zip(*rows)]
        return {"median_slowest_factor": statistics.median(max(row) for row in rows),
                "mean_cv": statistics.mean(cvs), "passes": len(rows)}


def _spaced(count: int, samples: int) -> list[int]:
    """`samples` indices evenly spaced over `count` rows (all of them when there are fewer)."""
    if samples >= count:
        return list(range(count))
    return [(2 * i + 1) * count // (2 * samples) for i in range(samples)]


def shared_work_s(starts_s: Sequence[float], times_s: Sequence[float], parallelism: float) -> tuple[float, ...]:
    """Each rank's work (seconds at a whole core) over its interval [start, start + time] when the n
    ranks computing at each moment share `parallelism` P cores equally, min(1, P / n) each
    (processor sharing, as `simulator.host_sharing.HostPool` plays it)."""
    ends = [start + time for start, time in zip(starts_s, times_s)]
    points = sorted(set(starts_s) | set(ends))
    work = [0.0] * len(ends)
    for left, right in zip(points, points[1:]):
        active = [r for r, (start, end) in enumerate(zip(starts_s, ends)) if start <= left and end >= right]
        for r in active:
            work[r] += min(1.0, parallelism / len(active)) * (right - left)
    return tuple(work)


def parse_pass_jitter(read, document: Mapping) -> PassJitter | None:
    """The optional `pass_jitter` section (`read`: the profile's reader, naming the field of any
    error); None when absent."""
    section = read.mapping(document, "pass_jitter", "pass_jitter", optional=True)
    if not section:
        return None
    times_s = _read_levels(read, section, "levels", "times", positive=True)
    if not times_s:
        raise read.fail("pass_jitter.levels", "expected at least one number of ranks at once")
    offsets_s = _read_levels(read, section, "start_offsets_s", "start offsets", positive=False)
    for ranks, rows in offsets_s.items():
        if len(rows) != len(times_s.get(ranks, ())):
            raise read.fail(f"pass_jitter.start_offsets_s.{ranks}",
                            f"expected one row per pass of pass_jitter.levels.{ranks} "
                            f"({len(times_s.get(ranks, ()))}), got {len(rows)}")
    levels = {}
    for ranks, rows in times_s.items():
        median_s = statistics.median(t for row in rows for t in row)
        levels[ranks] = tuple(tuple(t / median_s for t in row) for row in rows)
    return PassJitter(batch_size=read.integer(section, "batch_size", "pass_jitter.batch_size", minimum=1),
                      levels=levels, start_offsets_s=offsets_s, times_s=times_s)


def _read_levels(read, section: Mapping, key: str, what: str, *, positive: bool) -> dict[int, Rows]:
    """{k: rows of k numbers} of `pass_jitter.<key>` (optional); numbers > 0 or, if not `positive`,
    >= 0."""
    raw = read.mapping(section, key, f"pass_jitter.{key}", optional=True) or {}
    levels = {}
    for name, rows in raw.items():
        where = f"pass_jitter.{key}.{name}"
        if not (isinstance(name, str) and name.isdigit() and int(name) >= 1):
            raise read.fail(where, f"expected a number of ranks (an integer >= 1) as key, got {name!r}")
        ranks = int(name)
        if not isinstance(rows, list) or not rows:
            raise read.fail(where, f"expected a non-empty list of rows, got {rows!r}")
        parsed = []
        for i, row in enumerate(rows):
            if not isinstance(row, list) or len(row) != ranks:
                raise read.fail(f"{where}[{i}]", f"expected a list of {ranks} {what} (one per rank), got {row!r}")
            parsed.append(tuple(read.number({"value": v}, "value", f"{where}[{i}][{r}]", positive=positive,
                                            minimum=None if positive else 0.0)
                                for r, v in enumerate(row)))
        levels[ranks] = tuple(parsed)
    return dict(sorted(levels.items()))


def percentile(values, percent: int) -> float:
    """The value at `percent` % of the sorted values (nearest rank below); the validator takes the
    measured steps' percentiles the same way."""
    ordered = sorted(values)
    return ordered[(percent * len(ordered)) // 100]


def compute_concurrency(result) -> float:
    """Ranks computing at once on average over the step: the ranks' compute time / the step time."""
    spans = result.spans
    compute = spans[spans["stream"] == "compute"]
    makespan_s = float(spans["end_s"].max() - spans["start_s"].min()) if len(spans) else 0.0
    return float((compute["end_s"] - compute["start_s"]).sum()) / makespan_s if makespan_s > 0 else 1.0


def jittered_step_times_s(result, costs, samples: int = DEFAULT_JITTER_SAMPLES) -> tuple[int, list[float]]:
    """(level, step times): the step of `result`'s plan (a `SimulationResult`) played once per draw
    of `costs.pass_jitter` at the level nearest the plan's compute concurrency: the same plan, every
    rank's compute scaled by its factor, started after its offset and resumed after each collective
    it waited for by its exit offset (rank r of the plan takes column r mod the level;
    `PassJitter.speed_draws`, `PassJitter.exit_draws`)."""
    from simulator.engine import Engine
    from simulator.schedules.steady_state import steady_state_plan, steady_state_window
    from simulator.simulate import engine_costs
    from simulator.topology import build_topology

    jitter: PassJitter = costs.pass_jitter
    level = jitter.level_for(compute_concurrency(result))
    scenario, workload, plan = result.scenario, result.workload, result.plan
    topology = build_topology(scenario.cluster)
    asynchronous = bool(plan.meta.get("asynchronous"))
    if asynchronous:  # the window the simulator predicts for asynchronous pipelines
        plan = steady_state_plan(scenario, workload, topology, costs)
    played_costs = engine_costs(plan, costs)
    servers = scenario.strategy.num_parameter_servers
    offload_s = result.summary["memory"].get("offload_exposed_s", 0.0)
    times = []
    draws = jitter.speed_draws(level, samples, getattr(costs, "host_parallelism", None))
    for (factors, offsets_s), exits_s in zip(draws, jitter.exit_draws(level, samples)):
        jittered = copy.copy(topology)
        jittered.slowdowns = {device: factors[rank % len(factors)] for rank, device in enumerate(plan.rank_to_device)}
        delays_s = [offsets_s[rank % len(offsets_s)] for rank in range(plan.num_ranks)]
        jittered.start_delays_s = {device: delays_s[rank] for rank, device in enumerate(plan.rank_to_device)}
        jittered.exit_delays_s = {device: exits_s[rank % len(exits_s)] for rank, device in enumerate(plan.rank_to_device)}
        spans = Engine(plan, jittered, played_costs, servers).run().spans
        if asynchronous:
            step_s = steady_state_window(spans, plan.workers_per_group, scenario.strategy.num_microbatches)[1]
        else:  # as the validator times a step: each rank from its own start, the slowest rank
            step_s = max((span[5] - delays_s[span[0]] for span in spans), default=0.0)
        times.append(step_s + offload_s)
    return level, times


def jittered_prediction(result, costs, samples: int = DEFAULT_JITTER_SAMPLES) -> dict | None:
    """{"step_time_s": median over draws, "nominal_step_s", "p10_step_s", "p90_step_s", "draws",
    "ranks_at_once" (the level drawn from), "median_slowest_factor", "mean_cv"}; None when the cost
    model has no `pass_jitter`."""
    if getattr(costs, "pass_jitter", None) is None:
        return None
    level, times = jittered_step_times_s(result, costs, samples)
    return {"step_time_s": statistics.median(times), "nominal_step_s": result.step_time_s,
            "p10_step_s": percentile(times, 10), "p90_step_s": percentile(times, 90),
            "draws": len(times), "ranks_at_once": level,
            **{k: v for k, v in costs.pass_jitter.spread(level).items() if k != "passes"}}
