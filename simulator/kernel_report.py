"""Where a micro-batch's compute time goes under the kernel cost model: the summary's `kernel_passes`.

For rank 0's first micro-batch (every forward and backward action of it: the layers of the rank's
stage or chunks, gradient-bucket segments together), the GPU seconds per kernel kind
(`simulator.kernel_costs.time_breakdown`: GEMMs, flash attention, the memory-bound kinds, and the
launches apart) and the time the GPU would wait for a host that issues its kernels slower than they
run if each action ran alone (max(its kernels' sum, kernels x host time per kernel)); in the step
the engine lets the host run ahead across actions, so the wait there can be less
(`simulator.engine`). The backward includes the forward's re-run under full recompute.
None for other cost models (a calibration profile times whole layers; the roofline has no kernels).
"""

from __future__ import annotations

from collections import defaultdict

from simulator.costs import pass_parts
from simulator.plan import BACKWARD, FORWARD, Compute, Plan


def kernel_passes(plan: Plan, costs) -> dict | None:
    """{"num_layers", "batch", "host_overhead_s", "forward" / "backward": {"total_s", "host_wait_s",
    "gpu_s": {kind: seconds}}} of rank 0's first micro-batch (module docstring)."""
    from simulator.kernel_costs import KernelCosts
    if not isinstance(costs, KernelCosts) or not plan.actions:
        return None
    passes = [a for a in plan.actions[0] if isinstance(a, Compute) and a.phase in (FORWARD, BACKWARD)]
    if not passes:
        return None
    microbatch = passes[0].microbatch
    recomputed = set(plan.meta.get("recompute_actions", {}).get(0, ()))
    forward = [a for a in passes if a.microbatch == microbatch and a.phase == FORWARD and a.id not in recomputed]
    backward = [a for a in passes if a.microbatch == microbatch and (a.phase == BACKWARD or a.id in recomputed)]
    report = {"num_layers": sum(a.layer_end - a.layer_start for a in forward), "batch": passes[0].batch,
              "host_overhead_s": costs.parameters.host_overhead_s, "forward": _pass(costs, forward)}
    if backward:
        report["backward"] = _pass(costs, backward)
    return report


def _pass(costs, actions: list[Compute]) -> dict:
    gpu: dict[str, float] = defaultdict(float)
    total_s = wait_s = 0.0
    for action in actions:  # each action alone: max(its kernels on the GPU, their issue on the host)
        device_s, host_s = pass_parts(costs, action.phase, action.layer_start, action.layer_end, action.batch)
        for layer in range(action.layer_start, action.layer_end):
            for kind, seconds in costs.breakdown(layer, action.phase, action.batch).items():
                gpu[kind] += seconds
        total_s, wait_s = total_s + max(device_s, host_s), wait_s + max(host_s - device_s, 0.0)
    return {"total_s": total_s, "host_wait_s": wait_s, "gpu_s": dict(gpu)}
