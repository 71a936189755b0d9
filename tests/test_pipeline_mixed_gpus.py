"""Pipeline kinds with several replicas on mixed GPUs: the partitioner sees every replica's devices."""

from __future__ import annotations

import math

from simulator.scenario import scenario_from_dict
from simulator.simulate import simulate


def _scenario(node_gpus: dict) -> dict:
    return {"name": "mixed_pipe",
            "cluster": {"num_nodes": 2, "gpus_per_node": 2, "gpu": "V100", "intra_node_link": "nvlink2-v100",
                        "inter_node_link": "10gbe", "node_gpus": node_gpus},
            "model": {"name": "vgg16"},
            "strategy": {"kind": "gpipe", "num_groups": 2, "num_microbatches": 4},
            "training": {"global_batch_size": 32, "dtype": "fp32", "optimizer": "sgd"}}


def test_two_replicas_on_mixed_gpus_simulate():
    """Replica 1's ranks sit on node 1's A100s; before the fix the partitioner indexed past the
    first replica's devices (IndexError)."""
    mixed = simulate(scenario_from_dict(_scenario({1: "A100-80GB"})))
    same = simulate(scenario_from_dict(_scenario({})))
    assert math.isfinite(mixed.step_time_s) and mixed.step_time_s > 0
    # the stage time is set by the slower replica (V100s on node 0), so mixing in A100s cannot help much
    assert mixed.step_time_s >= 0.5 * same.step_time_s
