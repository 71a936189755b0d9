"""The measured breakdown of a data-parallel step: a rank waiting for a late peer's allreduce spends
that time in the allreduce's comm span, not in its update's compute span (the simulator's split)."""

import time

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from simulator.grid_symmetry import every_rank  # noqa: E402
from simulator import load_scenario, simulate  # noqa: E402
from validator.launch import LaunchConfig, spawn  # noqa: E402
from validator.runtime import RankExecutor  # noqa: E402

LATE_S = 0.3


def _late_peer_step(rank: int, plan, workload) -> list[tuple]:
    torch.set_num_threads(1)
    executor = RankExecutor(plan, workload, rank, "sgd", 0.01, 0, "cpu")
    executor.load_batch(0)
    dist.barrier()
    if rank == 1:
        time.sleep(LATE_S)  # rank 0 reaches the update and waits for this rank's allreduce
    return executor.step(0)


@pytest.mark.slow
def test_waiting_for_a_late_peer_is_communication_not_update_compute():
    scenario = load_scenario({
        "cluster": {"num_nodes": 1, "gpus_per_node": 2, "gpu": "cpu",
                    "intra_node_link": "loopback", "inter_node_link": "loopback"},
        "model": {"name": "mlp", "params": {"input_dim": 32, "hidden_dim": 48, "num_hidden_layers": 2,
                                            "num_classes": 10}},
        "strategy": {"kind": "dp"},
        "training": {"global_batch_size": 8, "optimizer": "sgd"},
    })
    result = simulate(every_rank(scenario))
    spans = spawn(_late_peer_step, (result.plan, result.workload), LaunchConfig(2, timeout_s=120))[0]
    update = [end - start for _rank, stream, _name, kind, start, end, *_ in spans if stream == "compute"
              and kind not in ("F", "B")]
    allreduce = [end - start for _rank, stream, *_rest, start, end, _size, _mb in spans if stream == "comm"]
    assert len(update) == 1 and allreduce
    assert max(allreduce) >= 0.8 * LATE_S  # rank 0's wait for the late peer
    assert update[0] < 0.5 * LATE_S  # the update itself: an SGD step over a small MLP
