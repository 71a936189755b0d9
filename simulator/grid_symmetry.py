"""Symmetric data parallelism: simulate one rank of a DP run and stand it for all G replicas.

In data parallelism (`simulator.strategies.ghp` with M = 1) on a homogeneous cluster every rank
runs the same actions with the same durations: each starts its forward at 0, reaches each gradient
bucket at the same instant, and every bucket's allreduce starts when the last rank arrives, which
is then. The collective is one flow set over all G devices either way (`simulator.collectives`),
so a plan holding rank 0's actions alone, whose collectives are played over every peer's device
(`GridSymmetry.device_groups`), gives the full run's step time, link loads, byte counts and
memory; the summary's per-device rows are rank 0's, copied to every device
(`simulator.symmetry.expand_summary`).
With `strategy.symmetry: auto` a DP plan folds unless (`grid_fold_decision`): `symmetry` is off;
the cluster is heterogeneous (mixed GPUs, stragglers, degraded links); a calibration profile prices
collectives by their ranks; ranks share a host's processors (one pool per node, not per GPU);
or gradients are compressed. The reason goes in `summary["symmetry"]`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GridSymmetry:
    """The devices a DP representative's collectives stand for."""

    peer_devices: tuple[int, ...]
    """Device of every replica's rank, in rank order."""

    def device_groups(self, action) -> tuple[tuple[tuple[int, ...], ...], int]:
        """(device groups, tier-byte weight) of the representative's collective: all G peers, once."""
        return (self.peer_devices,), 1

    def prune(self, topology, action, phases: tuple) -> tuple:
        return phases

    def send_phase(self, topology, rank: int, dst: int, size_bytes: float):
        raise AssertionError("a folded data-parallel plan has no point-to-point transfers")


def grid_fold_decision(scenario, num_groups: int, workers_per_group: int, costs) -> tuple[bool, str]:
    """(simulate rank 0 only?, why) for a dp / mp / ghp grid of `scenario` (module docstring)."""
    if workers_per_group != 1 or num_groups < 2:
        return False, "only data parallelism (G > 1 replicas of one stage) folds"
    if scenario.strategy.symmetry == "off":
        return False, "strategy.symmetry is off"
    if scenario.cluster.heterogeneous:
        return False, "heterogeneous cluster (mixed GPUs, stragglers or degraded links) breaks the symmetry"
    if costs.communication is not None:
        return False, "a calibration profile prices each collective by its ranks"
    shared = costs.shared_processors
    if shared is not None and not getattr(shared, "per_device", False):
        return False, "ranks share a host's processors: a lone representative would compute alone"
    if scenario.strategy.gradient_compression != "none":
        return False, "gradient compression: the sparse exchange is simulated rank by rank"
    return True, f"rank 0 stands for the {num_groups} data-parallel replicas"


def every_rank(scenario):
    """`scenario` with `strategy.symmetry` off: its plan holds every rank's actions, as a real run of
    it needs (symmetric megatron and data-parallel plans hold representatives only)."""
    return scenario.model_copy(update={"strategy": scenario.strategy.model_copy(update={"symmetry": "off"})})
