"""The search's unfolded gate for megatron layouts (simulator/search_gates.py): a layout whose ranks x
micro-batches x chunks exceed the limit is skipped with its reason unless `simulator.symmetry` folds
it; below the limit the fold is not even asked."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

import simulator.search_gates as search_gates
from simulator.fabrics import cached_topology
from simulator.planner import Candidate, scenario_for_gpus
from simulator.scenario import load_scenario
from simulator.search_gates import CP_UNFOLDED_PASSES, UNFOLDED_PASSES, unfolded_refusal

GPT3 = Path(__file__).resolve().parent.parent / "scenarios" / "gpt3_175b_dgx_a100_3d.yaml"


def megatron(d: int, t: int, p: int, m: int, placement="tp_dp_pp", v=1, c=1) -> Candidate:
    return Candidate("megatron", d * c * t, p, placement, num_microbatches=m, num_virtual_stages=v, tp_degree=t,
                     recompute="none", zero_stage=1, sequence_parallel=True, cp_degree=c)


@pytest.mark.parametrize("folds", [True, False])
def test_the_limit_applies_to_the_passes_and_asks_the_fold_only_above_it(monkeypatch, folds):
    asked = []
    monkeypatch.setattr(search_gates, "megatron_folds", lambda *args: asked.append(args[1].label) or folds)
    n = 1024
    at_limit = megatron(16, 8, 8, UNFOLDED_PASSES // n)  # N m = the limit exactly: not over it
    assert unfolded_refusal(SimpleNamespace(num_gpus=n), at_limit, None, {}) is None and not asked
    over = megatron(16, 8, 8, UNFOLDED_PASSES // n, v=2)  # the chunks count as passes too
    reason = unfolded_refusal(SimpleNamespace(num_gpus=n), over, None, {})
    assert asked == [over.label]
    if folds:
        assert reason is None
    else:
        assert reason == (f"this placement does not fold, so it is simulated unfolded: {2 * UNFOLDED_PASSES:,} "
                          f"rank x micro-batch x chunk passes exceed {UNFOLDED_PASSES:,} (simulate it alone)")
    context = megatron(8, 8, 8, CP_UNFOLDED_PASSES // n + 1, c=2)  # context parallelism: the tighter limit
    reason = unfolded_refusal(SimpleNamespace(num_gpus=n), context, None, {})
    assert (reason is None) == folds
    assert folds or reason.startswith("context parallelism is simulated unfolded")
    assert unfolded_refusal(SimpleNamespace(num_gpus=n), Candidate("1f1b", 64, 16, num_microbatches=512),
                            None, {}) is None  # other synchronous kinds have their own fast paths


@pytest.mark.slow
def test_gpt3_on_16384_gpus_skips_a_placement_that_does_not_fold_and_keeps_its_twin():
    """t 8 x p 8 x d 256 on a 16,384-GPU fat-tree of k 48 (3 nodes an edge switch): placed tp-dp-pp
    its replicas' transfers meet other loads and it does not fold (simulated unfolded it took 80 s
    at m 6); placed group per node it folds and is simulated. With the default k (64: 4 nodes an
    edge switch) both placements fold."""
    scenario = scenario_for_gpus(load_scenario(str(GPT3), ["cluster.fat_tree_k=48"]), 16384)
    topology, cache = cached_topology(scenario.cluster.model_dump_json()), {}
    reason = unfolded_refusal(scenario, megatron(256, 8, 8, 8), topology, cache)
    assert reason is not None and f"{16384 * 8:,} rank x micro-batch x chunk passes" in reason
    assert unfolded_refusal(scenario, megatron(256, 8, 8, 8, "group_per_node"), topology, cache) is None
    assert unfolded_refusal(scenario, megatron(256, 8, 8, 4), topology, cache) is None  # 65,536: at the limit
    default_k = scenario_for_gpus(load_scenario(str(GPT3)), 16384)
    topology = cached_topology(default_k.cluster.model_dump_json())
    assert topology.fat_tree_k == 64 and unfolded_refusal(default_k, megatron(256, 8, 8, 8), topology, {}) is None
