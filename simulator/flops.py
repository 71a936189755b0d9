"""Achieved FLOP/s per GPU and model FLOPs utilisation (MFU) of a simulated step.

Model FLOPs of a step = the workload's exact forward + backward FLOPs per sample (the zoo's
per-layer counts: 2 FLOPs per multiply-add; backward = 2 x forward for layers with weights, so
for a transformer about 6 x parameters x tokens plus attention's s^2 terms) x the global batch.
They do not depend on the strategy: recomputed forwards, replicated work of tensor-parallel
ranks and optimizer updates are not counted (MFU, Chowdhery et al. 2022, PaLM, appendix B;
the "model FLOPs" of Korthikanti et al. 2022, sec. 6). A causal model's s^2 attention terms count in
full, as PaLM's 6N + 12 L H Q T does, while a flash-attention kernel skips the masked half
(`simulator.kernels_attention.flash_work_fraction`): at long sequences MFU can exceed the GEMM ceiling.
A mixture of experts counts each token's top-k expert work once: the copies a capacity factor c > 1
pads every expert with are executed work (the step time includes them) but not model FLOPs
(`simulator.zoo.moe.capacity_padding_flops_per_sample`), so MFU falls as c rises.

    achieved FLOP/s per GPU = model FLOPs / (step time x N)
    MFU = achieved FLOP/s per GPU / mean dense peak FLOP/s of the N GPUs (training dtype; the fp8
          peak under FP8 training, `training.fp8_recipe`, the rate of its fastest math)
"""

from __future__ import annotations

from simulator.zoo.moe import capacity_padding_flops_per_sample


def peak_flops_per_s(cluster, dtype: str) -> float:
    """Mean dense peak FLOP/s of the cluster's devices for `dtype` (mixed GPU types averaged)."""
    gpus = [cluster.node_gpus.get(node, cluster.gpu) for node in range(cluster.num_nodes)]
    return sum(gpu.peak_for(dtype) for gpu in gpus) / len(gpus)


def model_flops_per_sample(workload) -> float:
    """The workload's forward + backward FLOPs of one sample less mixtures of experts' capacity
    padding (module docstring)."""
    padding = sum(capacity_padding_flops_per_sample(layer) for layer in workload.layers)
    return workload.flops_per_sample - padding


def flops_summary(scenario, workload, step_time_s: float) -> dict:
    """model_flops_per_step, achieved_tflops_per_gpu (1e12 FLOP/s), mfu (fraction of peak)."""
    model_flops = model_flops_per_sample(workload) * scenario.training.global_batch_size
    if step_time_s <= 0:
        return {"model_flops_per_step": model_flops, "achieved_tflops_per_gpu": float("inf"), "mfu": float("inf")}
    per_gpu = model_flops / step_time_s / scenario.num_gpus
    return {"model_flops_per_step": model_flops, "achieved_tflops_per_gpu": per_gpu / 1e12,
            "mfu": per_gpu / peak_flops_per_s(scenario.cluster, "fp8" if scenario.training.fp8_recipe
                                              else scenario.training.dtype)}
