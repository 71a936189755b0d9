"""Microbenchmark of how much a whole training pass varies from one pass to the next, and from one
rank to another at the same moment: the spread that a step, which waits for its slowest rank,
pays and a median of back-to-back blocks (`validator.microbench.time_layers`) hides.

Every rank runs the whole model's forward and backward (loss included, gradients zeroed after, as
a runtime step does) at one batch size, `passes` times, each pass after a barrier: k ranks at once
(the others wait at the barriers); a calibration records k = all ranks (as in a data-parallel
step) and, on a CPU host with fewer cores than ranks, k = the number of cores (as when the ranks
of a pipeline take turns). The rows (one per pass: every rank's time) go into the profile's
`pass_jitter` section; the simulator's model of them: `simulator.pass_jitter`. When all ranks run
on one host, each pass's barrier exits are compared on the host's monotonic clock as well: the
ranks do not leave a barrier together (the `start_offsets_s` rows).

Barrier exits, measured on the same machine (40 passes at batch 16, one launch each): with 2 ranks
on the 2 cores the last rank left 0.02 ms after the first in the median pass (90th percentile
3.4 ms); with 4 ranks, 7.7 ms (ResNet, median pass 28 ms) and 9.4 ms (transformer, 81 ms), the
90th percentiles 11.5 and 18.2 ms: the ranks woken last wait for a core the first ones compute on.

Measured on this project's 2-core CPU machine (the three validation models at batch 16, 60 passes
per level, one calibration each): a rank's pass varies by 10-33 % (coefficient of variation) from
pass to pass, two ranks' times correlate by -0.03 to 0.57, and the median over passes of the
slowest rank is 1.03-1.34x the median pass.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from validator.microbench import _sync, _to, load_models_module

DEFAULT_JITTER_PASSES = 15
"""Passes per burst; `validator.calibration_phases` runs a burst before, between and after its
phases (4 bursts: 60 passes), at each number of ranks at once it records."""


def time_model_passes(workload, batch_size: int, passes: int = DEFAULT_JITTER_PASSES, *, device: str = "cpu",
                      models=None, seed: int = 0, warmup: int = 2,
                      barrier: Callable[[], None] | None = None, active: bool = True,
                      started_at_s: list[float] | None = None) -> list[float]:
    """Seconds of each of `passes` whole-model forward + backward passes (after `warmup` untimed).
    With `active=False` the rank only takes part in the barriers (and returns []). `started_at_s`
    (optional) receives each timed pass's start, the rank's exit from the barrier, on the host's
    monotonic clock (`time.perf_counter`, shared by the processes of one host)."""
    barrier = barrier or (lambda: None)
    if not active:
        for _ in range(warmup + passes):
            barrier()
        return []
    models = load_models_module(models)
    device = torch.device(device)
    modules = [module.to(device).train() for module in models.build_modules(workload, seed=seed)]
    inputs, targets = models.make_batch(workload, batch_size, seed=seed)
    inputs, targets = _to(inputs, device), _to(targets, device)
    loss_fn = getattr(models, "loss_fn", None)
    times = []
    for index in range(warmup + passes):
        barrier()
        started = time.perf_counter()
        x = inputs
        for module in modules:
            x = module(x)
        loss = loss_fn(workload, x, targets) if loss_fn is not None else x.float().sum()
        loss.backward()
        _sync(device)
        elapsed = time.perf_counter() - started
        for module in modules:
            module.zero_grad(set_to_none=False)
        if index >= warmup:
            times.append(elapsed)
            if started_at_s is not None:
                started_at_s.append(started)
    return times
