"""Buffers that persist for the whole step on a rank: the persistent rules of `simulator.memory`;
and the device memory they and the activations share (`usable_memory_bytes`).

Persistent for the whole step (P = the rank's parameters, e = bytes of the training dtype):
- weights P e; master_weights 4P when the dtype is fp16/bf16 (mixed precision keeps fp32 master
  weights, Micikevicius et al., ICLR 2018); optimizer_state 4P x (sgd 0, momentum 1, adam 2 copies,
  fp32, Kingma & Ba 2015); weight_gradients P e (P x the plan's `gradient_element_bytes` where it
  sets them: Megatron's fp32 gradient buffer under bf16);
- stashed_weights P e x (`stashed_weight_versions` + `extra_weight_copies` of the stage in
  plan.meta: PipeDream's weight stash, SpecTrain's predicted copy; absent = 0);
- residual P e for top-k compression (error feedback, Stich et al. 2018);
- under FP8 training (`training.fp8_recipe`) the weights also hold each block parameter's FP8 copy
  and its transpose, 2 bytes, which Transformer Engine caches across a step's micro-batches
  (`simulator.kernels_fp8`; the linear layers' saved inputs in FP8: `simulator.memory_activations`).
"""

from __future__ import annotations

from simulator.kernels_fp8 import FP8_KINDS
from simulator.plan import Plan
from simulator.workload import Workload, dtype_bytes

OPTIMIZER_STATE_COPIES = {"sgd": 0, "momentum": 1, "adam": 2}
MASTER_WEIGHT_DTYPES = ("fp16", "bf16")


def persistent(plan: Plan, workload: Workload, rank: int, config) -> dict[str, float]:
    """Bytes of each persistent buffer of `rank` (module docstring); `config` a `simulator.memory.MemoryConfig`."""
    stage_index = plan.grid_position(rank)[1]
    stage = plan.stages[stage_index]
    params, element = stage.num_params, dtype_bytes(config.dtype)
    ranges = getattr(stage, "chunks", ()) or ((stage.layer_start, stage.layer_end),)
    largest = max((workload.layers[i].num_params for a, b in ranges for i in range(a, b)), default=0)
    copies = sum(plan.meta.get(key, [0] * (stage_index + 1))[stage_index]
                 for key in ("stashed_weight_versions", "extra_weight_copies"))
    fp8_copies = 0.0
    if config.fp8_recipe is not None:  # 2 bytes for each parameter of the rank's share of its blocks
        layers = [workload.layers[i] for a, b in ranges for i in range(a, b)]
        block_params = sum(layer.num_params for layer in layers if layer.spec.get("kind") in FP8_KINDS)
        fp8_copies = 2.0 * params * block_params / max(1, sum(layer.num_params for layer in layers))
    return {
        "weights": params * element + fp8_copies,
        "master_weights": params * 4 if config.dtype in MASTER_WEIGHT_DTYPES else 0,
        "optimizer_state": params * 4 * OPTIMIZER_STATE_COPIES[config.optimizer],
        "weight_gradients": (largest if config.memory_policy == "laysa" else params)
        * plan.meta.get("gradient_element_bytes", element),
        "residual": params * element if plan.meta.get("topk") else 0,
        "stashed_weights": copies * params * element,
    }


def usable_memory_bytes(scenario) -> float:
    """The device memory a run's tensors can use: the GPU's, less the share its caching allocator
    loses to fragmentation (`training.allocator_fragmentation`, f): memory_bytes x (1 - f), f being
    1 - allocated / reserved. Default 0: of the published MPT and torchtitan runs, whose
    micro-batches are the largest that fit, the model's peaks fit 111 of 114 at f = 0 (3 over by at
    most 1.2 %), 78 at f = 0.15 (`reports/ACCURACY.md`). GMLake (Guo et al., ASPLOS 2024) measured PyTorch's allocator at 15 %
    on average, up to 33 %, over eight LLM fine-tunings on A100 80 GB with recomputation,
    offloading, ZeRO or LoRA: set f there."""
    return scenario.cluster.gpu.memory_bytes * (1.0 - scenario.training.allocator_fragmentation)


def node_memory_bytes(scenario) -> dict[int, float]:
    """`usable_memory_bytes` of each node whose GPU differs from cluster.gpu (`cluster.node_gpus`)."""
    cluster, kept = scenario.cluster, 1.0 - scenario.training.allocator_fragmentation
    return {node: gpu.memory_bytes * kept for node, gpu in cluster.node_gpus.items() if gpu != cluster.gpu}
