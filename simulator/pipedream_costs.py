"""Inputs of PipeDream's partitioner (`simulator.pipedream_partition.StageCosts`) from a workload,
a cost model and a topology: for `ghpsim partition` and for `strategy.partition: pipedream`.

Per layer l at b samples per micro-batch (e = bytes per element of training.dtype):
- compute_s[l]: forward + backward of l on b samples (the cost model: datasheet roofline or a
  calibration profile);
- gradient_bytes[l] = params_l x e;
- boundary_s[l] = 2 (alpha + out_l b e / beta): l's output forward and its gradient back over the
  route between two stages (Hockney's alpha-beta, `collective_forms.p2p_time_s`);
- allreduce_s(S, r) = 2 (r - 1) / r S / beta + 2 (r - 1) alpha: an analytic ring allreduce
  (`collective_forms.ring_allreduce_time_s`; Patarasuk & Yuan, JPDC 2009) on the slowest hop of the
  ring, whatever `strategy.collective` says;
- memory (the partitioner's PipeDream model): state_bytes[l] = params_l x (2 e + optimizer state
  + an fp32 master copy when e < 4: `heuristics.state_bytes_per_param`); weight_bytes[l] =
  params_l x e (one stashed version); activation_bytes[l] = saved_l x b x e, under
  training.recompute what l keeps (`activation_bytes`; full also runs each forward twice).

`ghpsim partition` (free replication): the r replicas of a stage sit on consecutive devices 0..r-1
(a ring inside a node while r <= GPUs per node), and a boundary crosses the route from device 0 to
device N - 1 (between nodes as soon as the N workers span several).

`strategy.partition: pipedream` (the uniform G x M grid the simulator runs, every stage replicated
G = num_groups times): each replica has its own boundary link, so boundary_s is divided by G and a
stage costs (compute + allreduce + boundary) / G per micro-batch; the allreduce is the slowest of
the placed peer rings (`heuristics.ring_link`: NICs shared by the rings leaving a node), paid once
per m micro-batches by the flushed kinds (1/m of it per micro-batch) and after every micro-batch by
the asynchronous ones; the boundary is the slowest link between consecutive stages of a group.
The grid's boundaries are chosen for time only: memory is what the simulation's memory model reports.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from simulator.collective_forms import p2p_time_s, ring_allreduce_time_s
from simulator.costs import BACKWARD, FORWARD, CostModel
from simulator.heterogeneity import stage_compute_s
from simulator.memory_activations import Sharding, is_block, kept_bytes
from simulator.heuristics import ring_link, route_bandwidth, state_bytes_per_param
from simulator.pipedream_partition import StageCosts, pipedream_partition
from simulator.placement import place_ranks
from simulator.schedules.ir import ASYNCHRONOUS_KINDS
from simulator.topology import Topology
from simulator.workload import Workload, dtype_bytes

LinkFigures = tuple[float, float]
"""(latency_s, bandwidth_bytes_per_s) of a route."""


def layer_compute_s(costs: CostModel, workload: Workload, batch: float, recompute: str = "none") -> list[float]:
    """Forward + backward seconds of each layer on `batch` samples; under full recompute the forward
    twice (the plans' recompute actions; selective's attention core is in the cost model's backward)."""
    forwards = 2 if recompute == "full" else 1
    return [forwards * costs.compute_s(i, FORWARD, batch) + costs.compute_s(i, BACKWARD, batch)
            for i in range(workload.num_layers)]


def activation_bytes(workload: Workload, batch: float, element: int, recompute: str = "none",
                     flash_attention: bool = False) -> list[float]:
    """Bytes each layer keeps for its backward on `batch` samples: all it saves; under full
    recompute its input only (a checkpoint per layer, Megatron's granularity and the partitioner's
    bound on the engine's checkpoint per backward segment); under selective a transformer block
    without its attention core's s x s tensors (`memory_activations.kept_bytes`, Korthikanti et al.)."""
    sharding = Sharding(flash_attention=flash_attention)
    kept = []
    for layer in workload.layers:
        if recompute == "full":
            kept.append(layer.input_elements_per_sample * element)
        elif recompute == "selective" and (is_block(layer) or layer.kind == "attention"):
            kept.append(kept_bytes(layer, "selective", element, sharding, checkpoint=False))
        else:
            kept.append(layer.saved_elements_per_sample * element)
    return [bytes_ * batch for bytes_ in kept]


def stage_costs(workload: Workload, compute_s, *, batch: float, dtype: str, optimizer: str | None,
                boundary: LinkFigures | None, allreduce_s: Callable[[float, int], float],
                boundary_divisor: float = 1.0, recompute: str = "none", flash_attention: bool = False) -> StageCosts:
    """The partitioner's inputs (module docstring); `boundary` None: one device, no transfers;
    `optimizer` None: no memory terms."""
    element = dtype_bytes(dtype)
    params = np.array([layer.num_params for layer in workload.layers], dtype=float)
    outputs = np.array([layer.output_elements_per_sample for layer in workload.layers], dtype=float)
    boundary_s = np.zeros(workload.num_layers) if boundary is None else \
        2 * p2p_time_s(outputs * batch * element, *boundary) / boundary_divisor
    memory = {}
    if optimizer is not None:
        memory = {"state_bytes": list(params * state_bytes_per_param(dtype, optimizer)),
                  "weight_bytes": list(params * element),
                  "activation_bytes": activation_bytes(workload, batch, element, recompute, flash_attention)}
    return StageCosts(compute_s=[float(t) for t in compute_s], gradient_bytes=list(params * element),
                      boundary_s=list(boundary_s), allreduce_s=allreduce_s, **memory)


def route_figures(topology: Topology, source: int, target: int) -> LinkFigures:
    """(latency, slowest bandwidth) of the route between two devices."""
    return topology.route_latency_s(source, target), route_bandwidth(topology, source, target)


def ring_figures(topology: Topology, devices) -> LinkFigures:
    """(slowest hop latency, slowest hop bandwidth) of a ring over `devices` in order."""
    hops = [route_figures(topology, a, b) for a, b in zip(devices, devices[1:] + devices[:1])]
    return max(latency for latency, _ in hops), min(bandwidth for _, bandwidth in hops)


def cluster_stage_costs(workload: Workload, costs: CostModel, topology: Topology, num_workers: int, *,
                        batch: float, dtype: str, optimizer: str, recompute: str = "none",
                        flash_attention: bool = False) -> StageCosts:
    """Inputs for `ghpsim partition`: replicas on consecutive devices, boundaries over the route
    from device 0 to device N - 1 (module docstring), with training.recompute's time and memory."""
    rings = {r: ring_figures(topology, list(range(r))) for r in range(2, num_workers + 1)}

    def allreduce_s(size_bytes: float, replicas: int) -> float:
        return ring_allreduce_time_s(size_bytes, replicas, *rings[replicas]) if replicas > 1 else 0.0

    boundary = route_figures(topology, 0, num_workers - 1) if num_workers > 1 else None
    return stage_costs(workload, layer_compute_s(costs, workload, batch, recompute), batch=batch, dtype=dtype,
                       optimizer=optimizer, boundary=boundary, allreduce_s=allreduce_s, recompute=recompute,
                       flash_attention=flash_attention)


def grid_stage_costs(config, workload: Workload, topology: Topology, costs: CostModel,
                     rank_to_device: tuple[int, ...], batch: float) -> StageCosts:
    """Inputs for `strategy.partition: pipedream` on a G x M grid (`strategies.ghp.GridConfig`;
    `rank_to_device` starts with the devices of group 0's stages, as `stage_partition.grid_partition` gets it)."""
    groups, num_stages = config.num_groups, config.workers_per_group
    compute = stage_compute_s(costs, topology, rank_to_device, groups, num_stages, workload.num_layers, batch)
    compute = compute.max(axis=0) if compute.ndim == 2 else compute  # heterogeneous: the slowest device
    hops = [route_figures(topology, rank_to_device[j], rank_to_device[j + 1]) for j in range(num_stages - 1)]
    boundary = (max(h[0] for h in hops), min(h[1] for h in hops)) if hops else None
    ring = (0.0, 1.0)  # unused with one group: the partitioner allreduces only among r > 1 replicas
    if groups > 1:
        per_group = topology.num_devices // groups
        devices = place_ranks(config.placement, groups, per_group, topology.gpus_per_node)
        rings = [ring_link(topology, devices, per_group, [devices[g * per_group + s] for g in range(groups)])
                 for s in range(per_group)]
        ring = (max(r[0] for r in rings), min(r[1] for r in rings))
    microbatches = config.global_batch_size / (groups * batch)
    per_microbatch = 1.0 if config.strategy in ASYNCHRONOUS_KINDS else 1.0 / microbatches

    def allreduce_s(size_bytes: float, replicas: int) -> float:
        return per_microbatch * ring_allreduce_time_s(size_bytes, replicas, *ring)

    return stage_costs(workload, compute, batch=batch, dtype=config.dtype, optimizer=None,
                       boundary=boundary, allreduce_s=allreduce_s, boundary_divisor=groups)


def grid_pipedream_partition(config, workload: Workload, topology: Topology, costs: CostModel,
                             rank_to_device: tuple[int, ...], batch: float) -> tuple[tuple[int, int], ...]:
    """Stage ranges of `strategy.partition: pipedream`: the DP with every stage replicated G times."""
    inputs = grid_stage_costs(config, workload, topology, costs, rank_to_device, batch)
    groups = config.num_groups
    partition = pipedream_partition(inputs, groups * config.workers_per_group, replicas=groups)
    return tuple((stage.layer_start, stage.layer_end) for stage in partition.stages)
