"""Predicted vs measured: simulate each plan with a calibration profile, run the same plan for
real, and report the error per strategy.

The profile comes from microbenchmarks only (`validator.calibrate`); these plan runs are never fed
back into it: they are the held-out test of the prediction.
"""

from __future__ import annotations

import statistics
from dataclasses import replace

from simulator.compare import with_strategy
from simulator.errors import ScenarioError
from simulator.model_source import resolve_workload
from simulator.profile import profile_costs
from simulator.records import device_breakdown
from simulator.scenario import Scenario
from simulator.schedules.steady_state import steady_state_plan, steady_state_window
from simulator.simulate import simulate
from simulator.topology import build_topology
from validator.launch import LaunchConfig, spawn
from validator.measure import RunOptions, run_rank


def validate(scenario: Scenario, profile_path: str, specs: list[tuple[str, int | None]],
             options: RunOptions = RunOptions(), launch_timeout_s: float = 300.0, progress=None,
             on_case=None) -> dict:
    """Returns {"rows": [...], "measured_spans": {label: spans}, "simulated": {label: SimulationResult}}."""
    workload = resolve_workload(scenario.model, scenario.base_dir)
    costs = profile_costs(profile_path, workload)
    backend = costs.profile.backend
    rows, measured_spans, simulated = [], {}, {}
    for kind, groups in specs:
        variant = with_strategy(scenario, kind, groups)
        predicted = simulate(variant, costs=costs, workload=workload)
        plan, run_options = predicted.plan, options
        if plan.meta.get("topk") and "schedule_kind" in plan.meta:
            raise ScenarioError(f"strategy.gradient_compression: topk runs for real only with dp or ghp, "
                                f"not {plan.strategy}")
        if plan.meta.get("asynchronous"):  # run the steady-state plan and time the window predicted
            plan = steady_state_plan(variant, workload, build_topology(variant.cluster), costs)
            run_options = replace(options, steady_state=(plan.workers_per_group,
                                                         variant.strategy.num_microbatches))
        label = f"{kind} (G={plan.num_groups} x M={plan.workers_per_group})"
        if progress:
            progress(f"running {label} on {plan.num_ranks} ranks")
        config = LaunchConfig(world_size=plan.num_ranks, backend=backend, device=options.device,
                              timeout_s=launch_timeout_s)
        results = spawn(run_rank, (plan, workload, run_options), config)
        step_times = results[0]["step_times_s"]
        measured_s = statistics.median(step_times)
        spans = [span for result in results for span in result["spans"]]
        if run_options.steady_state is not None:
            spans = steady_state_window(spans, *run_options.steady_state)[0]
        measured_devices = device_breakdown(spans, plan.num_ranks, measured_s)
        rows.append({
            "strategy": label,
            "kind": kind,
            "num_groups": plan.num_groups,
            "workers_per_group": plan.workers_per_group,
            "world_size": plan.num_ranks,
            "predicted_s": predicted.step_time_s,
            "measured_s": measured_s,
            "measured_min_s": min(step_times),
            "measured_max_s": max(step_times),
            "error_pct": 100.0 * (predicted.step_time_s - measured_s) / measured_s,
            "predicted_compute_s": _mean(predicted.summary["devices"], "compute_s"),
            "measured_compute_s": _mean(measured_devices, "compute_s"),
        })
        measured_spans[label] = spans
        simulated[label] = predicted
        if on_case is not None:
            on_case(rows[-1], spans, predicted)
    return {"rows": rows, "measured_spans": measured_spans, "simulated": simulated}


def _mean(devices: list[dict], key: str) -> float:
    return sum(row[key] for row in devices) / len(devices)


def mape_pct(rows: list[dict]) -> float:
    return statistics.mean(abs(row["error_pct"]) for row in rows)
