"""Layouts the search lists as skipped instead of simulating: runs that cannot fold
(`simulator.symmetry`) and would simulate every rank for too many passes.

- Megatron layouts: `simulator.symmetry` folds a run only where its checks pass (not known before
  the plan); an unfolded one simulates every rank. A layout whose N m v (ranks x micro-batches x
  chunks per rank) exceeds `UNFOLDED_PASSES` is skipped unless it folds. GPT-3 175B placed tp-dp-pp
  on a 16,384-GPU fat-tree of k 48 (3 nodes an edge switch; the default k is 64) does not fold:
  t 8 x p 64 x d 32, 786,432 passes, 181 s (its group-per-node twin folds: 1.6 s); t 8 x p 8 x d 256
  at m 6, 98,304 passes, 80 s. With context
  parallelism, whose unfolded runs carry more flows a pass, the limit is `CP_UNFOLDED_PASSES`
  (LLaMA-3 405B's CP 2 on 256 GPUs, N m v = 8,192: seconds; GPT-3 175B's t 2 x c 2 x p 8 x d 32 on
  a 1,024-GPU fat-tree, 196,608: over ten minutes).
- Asynchronous pipelines (pipedream, spectrain, delayed_gradient): their step is measured in
  steady state on K whole steps back to back (`simulator.schedules.steady_state`, n = K m >=
  3p + m + 1 micro-batches) after the one-step plan's m: R (n + m) passes, with R the ranks
  simulated: the M stages of replica 0 where the replicas fold (`simulator.grid_symmetry`), else
  all N. Over `ASYNCHRONOUS_UNFOLDED_PASSES` they are skipped (GPT-3 175B's pipedream G 8 x p 64,
  m 4 on 512 GPUs unfolded, 104,448 passes: 55 s and 2 GB).
"""

from __future__ import annotations

from simulator.schedules.analysis import steady_state_steps
from simulator.schedules.ir import ASYNCHRONOUS_KINDS

CP_UNFOLDED_PASSES = 2**15
UNFOLDED_PASSES = 2**16
ASYNCHRONOUS_UNFOLDED_PASSES = 2**17


def asynchronous_passes(num_ranks: int, num_stages: int, num_microbatches: int) -> int:
    """R (n + m): the steady-state run's micro-batches plus the one-step plan's, on the R ranks
    simulated; R m where the step's own play holds the steady-state window (n = m: one run)."""
    p, m = num_stages, num_microbatches
    steps = steady_state_steps(p, m)
    return num_ranks * (m if steps == 1 else steps * m + m)


def replicas_fold(scenario, candidate, topology, cache: dict) -> bool:
    """Whether `simulator.grid_symmetry` folds a pipeline candidate's replicas (its answer depends on
    the layout alone: one per G, M, placement and interleaving)."""
    from simulator.errors import ScenarioError
    from simulator.grid_symmetry import grid_fold_decision
    from simulator.placement import place_ranks
    from simulator.planner import candidate_scenario
    from simulator.scenario import scenario_from_dict
    key = ("replicas", candidate.num_groups, candidate.workers_per_group, candidate.placement,
           candidate.num_virtual_stages)
    if topology is None:
        return False
    if key not in cache:
        try:
            layout = scenario_from_dict(candidate_scenario(scenario, candidate), scenario.source, scenario.base_dir)
            groups, stages = layout.grid()
            devices = place_ranks(layout.strategy.placement, groups, stages, topology.gpus_per_node)
            cache[key] = grid_fold_decision(layout, groups, stages, None, topology, devices,
                                            layout.strategy.num_virtual_stages)[0]
        except (ScenarioError, ValueError):
            cache[key] = False
    return cache[key]


def megatron_folds(scenario, candidate, topology, cache: dict) -> bool:
    """Whether `simulator.symmetry` folds a megatron candidate (its answer depends on the layout alone, so
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
        if passes > ASYNCHRONOUS_UNFOLDED_PASSES and replicas_fold(scenario, candidate, topology, cache):
            passes = asynchronous_passes(candidate.workers_per_group, candidate.workers_per_group,
                                         candidate.num_microbatches)
        if passes > ASYNCHRONOUS_UNFOLDED_PASSES:
            return (f"asynchronous pipelines are simulated to their steady state: {passes:,} rank x "
                    f"micro-batch passes exceed {ASYNCHRONOUS_UNFOLDED_PASSES:,} (simulate it alone)")
        return None
    if candidate.kind != "megatron":
        return None
    passes = scenario.num_gpus * candidate.num_microbatches * candidate.num_virtual_stages
    context = (candidate.cp_degree or 1) > 1
    limit = CP_UNFOLDED_PASSES if context else UNFOLDED_PASSES
    if passes > limit and not megatron_folds(scenario, candidate, topology, cache):
        what = "context parallelism is" if context else "this placement does not fold, so it is"
        return (f"{what} simulated unfolded: {passes:,} rank x micro-batch x chunk passes exceed {limit:,} "
                "(simulate it alone)")
    return None
