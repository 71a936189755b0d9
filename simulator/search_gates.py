"""Layouts the search lists as skipped instead of simulating: runs that cannot fold
(`simulator.symmetry`) and would simulate every rank for too many passes.

- Context parallelism: `simulator.symmetry` folds a CP run only where its checks pass (not known
  before the plan); an unfolded one simulates every rank. A CP layout whose N m v (ranks x
  micro-batches x chunks per rank) exceeds `CP_UNFOLDED_PASSES` is skipped unless it folds
  (LLaMA-3 405B's CP 2 on 256 GPUs, N m v = 8,192: seconds; GPT-3 175B's t 2 x c 2 x p 8 x d 32 on
  a 1,024-GPU fat-tree, 196,608: over ten minutes).
- Asynchronous pipelines (pipedream, spectrain, delayed_gradient) never fold, and their step is
  measured in steady state on K whole steps back to back (`simulator.schedules.steady_state`,
  n = K m >= 3p + m + 1 micro-batches) after the one-step plan's m: N (n + m) passes. Over
  `ASYNCHRONOUS_UNFOLDED_PASSES` they are skipped (GPT-3 175B's pipedream G 8 x p 64, m 4 on 512
  GPUs, 104,448 passes: 55 s and 2 GB; G 256 x p 16 on 4,096 GPUs, over 10 minutes and 5 GB).
"""

from __future__ import annotations

from simulator.schedules.analysis import steady_state_steps
from simulator.schedules.ir import ASYNCHRONOUS_KINDS

CP_UNFOLDED_PASSES = 2**15
ASYNCHRONOUS_UNFOLDED_PASSES = 2**17


def asynchronous_passes(num_gpus: int, num_stages: int, num_microbatches: int) -> int:
    """N (n + m): the steady-state run's micro-batches plus the one-step plan's, on every rank."""
    p, m = num_stages, num_microbatches
    return num_gpus * (steady_state_steps(p, m) * m + m)


def cp_folds(scenario, candidate, topology, cache: dict) -> bool:
    """Whether `simulator.symmetry` folds a CP candidate (its answer depends on the layout alone, so
    one per t, c, p, placement and interleaving)."""
    from simulator.errors import ScenarioError
    from simulator.planner import candidate_scenario
    from simulator.scenario import scenario_from_dict
    from simulator.strategies.tensor import tensor_config
    from simulator.symmetry import symmetry_decision
    key = (candidate.tp_degree, candidate.cp_degree, candidate.workers_per_group, candidate.placement,
           candidate.num_virtual_stages > 1)
    if key not in cache:
        try:
            layout = scenario_from_dict(candidate_scenario(scenario, candidate), scenario.source, scenario.base_dir)
            catalogue = type("Catalogue", (), {"communication": None})  # the search's costs: per flow, not per rank
            cache[key] = symmetry_decision(layout, tensor_config(layout), topology, catalogue)[0]
        except (ScenarioError, ValueError):
            cache[key] = False
    return cache[key]


def unfolded_refusal(scenario, candidate, topology, cache: dict) -> str | None:
    """Why the search skips `candidate` (module docstring), or None; checked only where it could fit."""
    if candidate.kind in ASYNCHRONOUS_KINDS:
        passes = asynchronous_passes(scenario.num_gpus, candidate.workers_per_group, candidate.num_microbatches)
        if passes > ASYNCHRONOUS_UNFOLDED_PASSES:
            return (f"asynchronous pipelines are simulated unfolded to their steady state: {passes:,} rank x "
                    f"micro-batch passes exceed {ASYNCHRONOUS_UNFOLDED_PASSES:,} (simulate it alone)")
        return None
    passes = scenario.num_gpus * candidate.num_microbatches * candidate.num_virtual_stages
    if (candidate.cp_degree or 1) > 1 and passes > CP_UNFOLDED_PASSES \
            and not cp_folds(scenario, candidate, topology, cache):
        return (f"context parallelism is simulated unfolded: {passes:,} rank x micro-batch x chunk passes "
                f"exceed {CP_UNFOLDED_PASSES:,}")
    return None
