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
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_JITTER_SAMPLES = 31
"""Engine runs (draws) per jittered prediction."""


@dataclass(frozen=True)
class PassJitter:
    """The profile's `pass_jitter` section: `levels[k][i][r]` = rank r's time in pass i with k ranks
    passing at once, over the median of all k ranks' passes."""
    batch_size: int
    levels: Mapping[int, tuple[tuple[float, ...], ...]]

    def level_for(self, concurrency: float) -> int:
        """The measured number of ranks at once nearest to `concurrency` (ties: the larger)."""
        return min(self.levels, key=lambda k: (abs(k - concurrency), -k))

    def draws(self, level: int, samples: int) -> list[tuple[float, ...]]:
        """`samples` rows of `level` at evenly spaced positions (all rows when there are fewer)."""
        rows = self.levels[level]
        count = len(rows)
        if samples >= count:
            return list(rows)
        return [rows[(2 * i + 1) * count // (2 * samples)] for i in range(samples)]

    def spread(self, level: int) -> dict:
        """The median over passes of the slowest rank's factor, and the ranks' mean coefficient of
        variation, at `level`."""
        rows = self.levels[level]
        cvs = [statistics.pstdev(c) / statistics.mean(c) for c in zip(*rows)]
        return {"median_slowest_factor": statistics.median(max(row) for row in rows),
                "mean_cv": statistics.mean(cvs), "passes": len(rows)}


def parse_pass_jitter(read, document: Mapping) -> PassJitter | None:
    """The optional `pass_jitter` section (`read`: the profile's reader, naming the field of any
    error); None when absent."""
    section = read.mapping(document, "pass_jitter", "pass_jitter", optional=True)
    if not section:
        return None
    raw_levels = read.mapping(section, "levels", "pass_jitter.levels")
    if not raw_levels:
        raise read.fail("pass_jitter.levels", "expected at least one number of ranks at once")
    levels = {}
    for key, rows in raw_levels.items():
        where = f"pass_jitter.levels.{key}"
        if not (isinstance(key, str) and key.isdigit() and int(key) >= 1):
            raise read.fail(where, f"expected a number of ranks (an integer >= 1) as key, got {key!r}")
        ranks = int(key)
        if not isinstance(rows, list) or not rows:
            raise read.fail(where, f"expected a non-empty list of rows, got {rows!r}")
        times = []
        for i, row in enumerate(rows):
            if not isinstance(row, list) or len(row) != ranks:
                raise read.fail(f"{where}[{i}]", f"expected a list of {ranks} times (one per rank), got {row!r}")
            times.append(tuple(read.number({"value": v}, "value", f"{where}[{i}][{r}]", positive=True)
                               for r, v in enumerate(row)))
        median_s = statistics.median(t for row in times for t in row)
        levels[ranks] = tuple(tuple(t / median_s for t in row) for row in times)
    return PassJitter(batch_size=read.integer(section, "batch_size", "pass_jitter.batch_size", minimum=1),
                      levels=dict(sorted(levels.items())))


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
    rank's compute scaled by its factor (rank r of the plan takes column r mod the level)."""
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
    for row in jitter.draws(level, samples):
        jittered = copy.copy(topology)
        jittered.slowdowns = {device: row[rank % len(row)] for rank, device in enumerate(plan.rank_to_device)}
        spans = Engine(plan, jittered, played_costs, servers).run().spans
        if asynchronous:
            step_s = steady_state_window(spans, plan.workers_per_group, scenario.strategy.num_microbatches)[1]
        else:
            step_s = max((span[5] for span in spans), default=0.0)
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
