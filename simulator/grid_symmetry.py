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

G replicas of an M-stage pipeline (GHP, the pipeline kinds) fold the same way onto
replica 0's M ranks, read by the megatron fold (`simulator.symmetry`) as a layout with t = c = 1
(`ReplicaGrid`): each stage's allreduce is played over its G peers' devices, and each transfer
between stages with every link counted by the multiplicity of all replicas' copies. Such a fold is
exact only where every copy of every transfer meets the same loads as its representative, which
`simulator.symmetry_check.fold_refusal` proves or refuses with the link that differs; parameter-
server synchronisation is not folded.
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


@dataclass(frozen=True)
class ReplicaGrid:
    """A G x M grid as the megatron fold reads a layout (`simulator.symmetry.Symmetry.of`,
    `simulator.symmetry_check.fold_refusal`): d = G replicas of p = M stages, t = c = e = 1, no ZeRO."""

    dp: int
    pp: int
    num_virtual_stages: int
    collective: str
    rank_to_device: tuple[int, ...]
    """Device of rank g M + j (stage j of replica g)."""
    tp: int = 1
    cp: int = 1
    ep: int = 1
    zero_stage: int = 0
    fsdp_sharding: str = "full_shard"

    @property
    def placement(self) -> tuple[int, ...]:
        """As a megatron layout's explicit placement with t = c = 1: position g M + j -> device."""
        return self.rank_to_device

    def device_of(self, dp: int, pp: int, tp: int) -> int:
        return self.rank_to_device[dp * self.pp + pp]


def grid_symmetry(num_groups: int, num_stages: int, rank_to_device: tuple[int, ...], collective: str,
                  num_virtual_stages: int = 1):
    """What the engine reads of a folded grid plan: `GridSymmetry` for data parallelism, else the
    megatron fold's `Symmetry` of the `ReplicaGrid`."""
    if num_stages == 1:
        return GridSymmetry(tuple(rank_to_device[rank] for rank in range(num_groups)))
    from simulator.symmetry import Symmetry
    layout = ReplicaGrid(num_groups, num_stages, num_virtual_stages, collective, tuple(rank_to_device))
    return Symmetry.of(layout, tuple(rank_to_device))


def grid_fold_decision(scenario, num_groups: int, workers_per_group: int, costs, topology=None,
                       rank_to_device: tuple[int, ...] | None = None, num_virtual_stages: int = 1) -> tuple[bool, str]:
    """(simulate replica 0 only?, why) for a dp / mp / ghp grid or a pipeline of `scenario` (module
    docstring); `costs` None: the datasheet catalogue's (no measured collectives, no shared host);
    `topology` and `rank_to_device` are needed to fold M > 1 stages."""
    if num_groups < 2:
        return False, "one replica: nothing to fold"
    if scenario.strategy.symmetry == "off":
        return False, "strategy.symmetry is off"
    if scenario.cluster.heterogeneous:
        return False, "heterogeneous cluster (mixed GPUs, stragglers or degraded links) breaks the symmetry"
    if costs is not None and costs.communication is not None:
        return False, "a calibration profile prices each collective by its ranks"
    shared = costs.shared_processors if costs is not None else None
    if shared is not None and not getattr(shared, "per_device", False):
        return False, "ranks share a host's processors: a lone representative would compute alone"
    if scenario.strategy.gradient_compression != "none":
        return False, "gradient compression: the sparse exchange is simulated rank by rank"
    if workers_per_group == 1:
        return True, f"rank 0 stands for the {num_groups} data-parallel replicas"
    if scenario.strategy.dp_sync == "parameter_server":
        return False, "parameter-server synchronisation of pipeline stages is simulated rank by rank"
    if topology is None or rank_to_device is None:
        return False, "the stages' transfers need the topology to be checked"
    from simulator.symmetry_check import cached_fold_refusal
    layout = ReplicaGrid(num_groups, workers_per_group, num_virtual_stages, scenario.strategy.collective,
                         tuple(rank_to_device))
    refusal = cached_fold_refusal(scenario.cluster, layout, topology)
    if refusal:
        return False, refusal
    return True, (f"the {workers_per_group} stage ranks of replica 0 each stand for their {num_groups} copies"
                  if workers_per_group > 1 else f"the one stage rank of replica 0 stands for its {num_groups} copies")


def every_rank(scenario):
    """`scenario` with `strategy.symmetry` off: its plan holds every rank's actions, as a real run of
    it needs (symmetric megatron and data-parallel plans hold representatives only)."""
    return scenario.model_copy(update={"strategy": scenario.strategy.model_copy(update={"symmetry": "off"})})
