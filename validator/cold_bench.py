"""Microbenchmark of cold operands: every layer's forward and backward, and the update, timed right
after the same pass (hot, what `validator.microbench` times) and after a pause of `gap_s` (cold), in
alternation so that both see the same machine; and the decay of the penalty over shorter pauses.
The simulator's model of the result: `simulator.cold_start`.

A pause is a sleep: the rank's core is free for other ranks and other tenants, as while it waits
for a message in a plan run. Ranks measure at once (a barrier before every layer), but on a shared
host no more of them than it has cores (`active`): with more, a rank waking from a pause waits for
a core, which is time-sharing, already played by the engine's processor-sharing model
(`simulator.host_sharing`), not a cold cache. Measured on this 2-core machine with all 4 ranks at
once, even a 2 ms pause cost the full penalty and the 4-rank predictions came out 28-51 % too high.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence

import torch

from validator.microbench import (DEFAULT_MIN_BLOCK_S, _as_input, _sync, _to, activation_chain, load_models_module,
                                  make_optimizer)

COLD_GAP_S = 0.05
"""The pause after which a pass counts as cold (the penalty measured here saturates by ~25-50 ms)."""
DECAY_GAPS_S = (0.002, 0.005, 0.015)
"""Shorter pauses whose partial penalties fix the decay time constant."""
DEFAULT_PAIRS = 7
TOPK_DENSITY = 0.01
"""Density of the top-k selection timed hot and cold (the ratio hardly depends on it: one pass over the buffers)."""
DECAY_BOUNDS_S = (0.0005, COLD_GAP_S)


def _pause(seconds: float) -> None:
    if seconds > 0:
        time.sleep(seconds)


def _timed(device, work: Callable[[], object]) -> float:
    _sync(device)
    start = time.perf_counter()
    work()
    _sync(device)
    return time.perf_counter() - start


def _ratio(cold: list[float], hot: list[float]) -> float:
    hot_s = statistics.median(hot)
    return statistics.median(cold) / hot_s if hot_s > 0 else 1.0


def fit_decay_s(gaps_s: Sequence[float], shares: Sequence[float]) -> float:
    """Time constant tau of 1 - exp(-gap / tau) closest (least squares over a log grid inside
    DECAY_BOUNDS_S) to the measured shares of the full penalty at the given pauses."""
    low, high = DECAY_BOUNDS_S
    grid = [low * (high / low) ** (i / 99) for i in range(100)]

    def error(tau: float) -> float:
        return sum((share - (1 - math.exp(-gap / tau))) ** 2 for gap, share in zip(gaps_s, shares))

    return min(grid, key=error)


def _layer_passes(module, x_source, output_grad, with_loss, loss_fn, workload, targets, needs_grad):
    """(forward, backward) closures sharing the forward's output."""
    state = {}

    def forward():
        x = _as_input(x_source, needs_grad=needs_grad)
        out = module(x)
        state["out"] = loss_fn(workload, out, targets) if with_loss else out

    def backward():
        out = state.pop("out")
        out.backward() if with_loss else out.backward(output_grad)

    return forward, backward


def _block_iterations(device, forward, backward, min_block_s: float) -> int:
    """Back-to-back iterations of forward + backward that last at least `min_block_s`."""
    probe_s = _timed(device, forward) + _timed(device, backward)
    return max(1, math.ceil(min_block_s / probe_s)) if probe_s > 0 else 1


def _hot_and_cold(device, forward, backward, pairs: int, gap_s: float,
                  min_block_s: float = DEFAULT_MIN_BLOCK_S) -> dict[str, list[float]]:
    """Per pair (after one to warm up): a block of back-to-back forward + backward iterations
    (the layer microbenchmark's sample, `validator.microbench._time_blocks`; its mean forward and
    backward), then, after a pause, one untimed pass and the hot pass right after it, then the cold
    forward and backward, each after a pause. Lists keyed forward / backward x block / hot / cold."""
    samples = {f"{kind}_{phase}": [] for kind in ("block", "hot", "cold") for phase in ("forward", "backward")}
    iterations = _block_iterations(device, forward, backward, min_block_s)
    for pair in range(pairs + 1):  # the first pair warms up
        block_f = block_b = 0.0
        for _ in range(iterations):
            block_f += _timed(device, forward)
            block_b += _timed(device, backward)
        _pause(gap_s)
        forward()
        backward()
        f = _timed(device, forward)
        b = _timed(device, backward)
        _pause(gap_s)
        cf = _timed(device, forward)
        _pause(gap_s)
        cb = _timed(device, backward)
        if pair:
            for key, value in (("block_forward", block_f / iterations), ("block_backward", block_b / iterations),
                               ("hot_forward", f), ("hot_backward", b), ("cold_forward", cf), ("cold_backward", cb)):
                samples[key].append(value)
    return samples


def paired_excess_s(single: Sequence[float], block: Sequence[float]) -> float:
    """Median over pairs of (single pass - back-to-back iteration) measured tens of milliseconds
    apart (one pause between them). Pairing keeps the host's slow spells out: on this project's
    2-core VM a core runs 1.5-1.7x slower for 0.1-2 s at a time, so a single pass and a block median
    taken minutes apart differ by whatever spell either met (measured: excess / fit equal for a layer's forward and backward and
    changing in runs over consecutive layers, the signature of a spell, 0.55-0.87 in one profile)."""
    return float(statistics.median(s - b for s, b in zip(single, block)))


def _cold_ratio(device, work: Callable[[], object], pairs: int, gap_s: float,
                fresh: Callable[[], object] = lambda: None) -> float:
    """Median time of `work` after a pause of `gap_s` over its median right after itself, from
    `pairs` alternations (after one to warm up); `fresh()` runs untimed before every `work`."""
    hot, cold = [], []
    for pair in range(pairs + 1):
        fresh()
        work()
        fresh()
        hot_s = _timed(device, work)
        _pause(gap_s)
        fresh()
        cold_s = _timed(device, work)
        if pair:
            hot.append(hot_s), cold.append(cold_s)
    return _ratio(cold, hot)


def single_pass_overheads(cold_start: dict, level_medians: dict, batch_sizes: Sequence[int],
                          compute_slowdown: dict, world_size: int) -> dict:
    """Per layer and phase, how much longer one pass right after the same pass takes than an
    iteration of the layer microbenchmark's back-to-back blocks, at the cold-start batch size:

        single_pass_s = max(0, excess) x slowdown[world_size] / slowdown[k]

    `excess` is the median over the cold benchmark's pairs of (hot pass - block iteration), both
    timed here tens of milliseconds apart (one pause) with k = `ranks_at_once` ranks measuring at once
    (`paired_excess_forward_s` / `paired_excess_backward_s`, `paired_excess_s`); the factor converts
    to the fits' concurrency (world_size ranks at once). A pass in a training step never runs inside
    such a block, so the simulator adds this to the fitted back-to-back time (`simulator.cold_start`).
    Profiles from before the pairing compared the hot pass with the layer microbenchmark's median at
    k ranks (`level_medians[k][phase][layer]`, taken at other moments of the calibration), which let
    the host's slow spells in: that is used only when the paired figures are absent. Empty when the
    section lacks what it needs (older runs, a level or batch size not timed)."""
    k, batch = cold_start.get("ranks_at_once"), cold_start.get("batch_size")
    if k not in compute_slowdown:
        return {}
    to_fit_level = compute_slowdown[world_size] / compute_slowdown[k]
    if all(f"paired_excess_{phase}_s" in cold_start for phase in ("forward", "backward")):
        return {f"{phase}_single_pass_s": [max(0.0, excess) * to_fit_level
                                           for excess in cold_start[f"paired_excess_{phase}_s"]]
                for phase in ("forward", "backward")}
    if k not in level_medians or batch not in batch_sizes:
        return {}
    column = list(batch_sizes).index(batch)
    return {f"{phase}_single_pass_s": [max(0.0, hot - medians[column]) * to_fit_level
                                       for hot, medians in zip(cold_start[f"hot_{phase}_s"], level_medians[k][phase])]
            for phase in ("forward", "backward")}


def time_cold_start(workload, batch_size: int, optimizer: str, parameters: Sequence[torch.Tensor] | None = None, *,
                    gap_s: float = COLD_GAP_S, decay_gaps_s: Sequence[float] = DECAY_GAPS_S,
                    pairs: int = DEFAULT_PAIRS, device: str = "cpu", models=None, seed: int = 0,
                    barrier: Callable[[], None] | None = None, active: bool = True,
                    progress: Callable[[str], None] | None = None) -> dict | None:
    """Cold-over-hot ratios of every layer's forward and backward at `batch_size`, of the update
    (`optimizer` over copies of `parameters`, default the model's) and of the top-k selection with
    error feedback over as many gradients (residual cold, gradient fresh), and the decay constant.
    With `active=False` a rank only takes part in the barriers and returns None.

    Returns the profile's `cold_start` section (`simulator.profile_format`) plus raw medians:
    `{"gap_s", "decay_s", "batch_size", "forward_factors", "backward_factors", "optimizer_factor", "topk_factor",
    "decay_gaps_s", "decay_shares", "hot_forward_s", "hot_backward_s", "paired_excess_forward_s",
    "paired_excess_backward_s"}`.
    """
    barrier = barrier or (lambda: None)
    if not active:  # only the barriers of the ranks that measure (one per layer, decay, update, top-k, end)
        for _ in range(workload.num_layers + 4):
            barrier()
        return None
    models = load_models_module(models)
    device = torch.device(device)
    modules = [module.to(device).train() for module in models.build_modules(workload, seed=seed)]
    loss_fn = models.loss_fn
    inputs, targets = models.make_batch(workload, batch_size, seed=seed)
    inputs, targets = _to(inputs, device), _to(targets, device)
    chain = activation_chain(modules, inputs)
    generator = torch.Generator(device="cpu").manual_seed(seed)

    forward_factors, backward_factors, hot_forward, hot_backward, passes = [], [], [], [], []
    excess_forward, excess_backward = [], []
    for index, module in enumerate(modules):
        with_loss = index == len(modules) - 1
        output_grad = torch.randn(chain[index + 1].shape, generator=generator,
                                  dtype=chain[index + 1].dtype).to(device)
        forward, backward = _layer_passes(module, chain[index], output_grad, with_loss, loss_fn, workload,
                                          targets, needs_grad=index > 0)
        barrier()
        samples = _hot_and_cold(device, forward, backward, pairs, gap_s)
        forward_factors.append(_ratio(samples["cold_forward"], samples["hot_forward"]))
        backward_factors.append(_ratio(samples["cold_backward"], samples["hot_backward"]))
        hot_forward.append(statistics.median(samples["hot_forward"]))
        hot_backward.append(statistics.median(samples["hot_backward"]))
        excess_forward.append(paired_excess_s(samples["hot_forward"], samples["block_forward"]))
        excess_backward.append(paired_excess_s(samples["hot_backward"], samples["block_backward"]))
        passes.append((forward, backward))
        module.zero_grad(set_to_none=True)
        if progress:
            progress(f"cold start: layer {index} {workload.layers[index].name}")

    # decay: the whole model's forward + backward (layer by layer) after each shorter pause
    def model_pass(gap: float) -> float:
        total = 0.0
        for forward, backward in passes:
            _pause(gap)
            total += _timed(device, forward)
            _pause(gap)
            total += _timed(device, backward)
        return total

    barrier()
    samples: dict[float, list[float]] = {gap: [] for gap in (0.0, *decay_gaps_s, gap_s)}
    for repeat in range(max(3, pairs // 2) + 1):
        for gap in samples:
            value = model_pass(gap)
            if repeat:
                samples[gap].append(value)
    medians = {gap: statistics.median(values) for gap, values in samples.items()}
    penalty_s = medians[gap_s] - medians[0.0]
    shares = [min(1.0, max(0.0, (medians[gap] - medians[0.0]) / penalty_s)) if penalty_s > 0 else 1.0
              for gap in decay_gaps_s]
    decay_s = fit_decay_s(decay_gaps_s, shares) if penalty_s > 0 else min(decay_gaps_s)

    # the update, on copies of the parameters with random gradients (and state, after one step)
    params = []
    for p in (parameters if parameters is not None else [q for m in modules for q in m.parameters()]):
        copy = torch.randn(tuple(p.shape), generator=generator).to(device).requires_grad_(True)
        copy.grad = torch.randn(tuple(p.shape), generator=generator).to(device)
        params.append(copy)
    update = make_optimizer(optimizer, params)

    def step():
        update.step()
        update.zero_grad(set_to_none=False)

    barrier()
    optimizer_factor = _cold_ratio(device, step, pairs, gap_s)

    # top-k selection with error feedback over the model's gradients: the gradient just written by
    # the backward (hot in both samples), the residual last touched one selection earlier
    from simulator.sparse import topk_count
    from validator.runtime import sparsify
    count = sum(p.numel() for p in params)
    source = torch.randn(count, generator=generator).to(device)
    gradient, residual = source.clone(), torch.zeros(count, device=device)
    k = topk_count(count, TOPK_DENSITY)

    def select():
        sparsify(gradient, residual, k)

    barrier()
    topk_factor = _cold_ratio(device, select, pairs, gap_s, fresh=lambda: gradient.copy_(source))
    barrier()
    return {"gap_s": gap_s, "decay_s": decay_s, "batch_size": batch_size,
            "forward_factors": forward_factors, "backward_factors": backward_factors,
            "optimizer_factor": optimizer_factor, "topk_factor": topk_factor,
            "decay_gaps_s": list(decay_gaps_s), "decay_shares": shares,
            "hot_forward_s": hot_forward, "hot_backward_s": hot_backward,
            "paired_excess_forward_s": excess_forward, "paired_excess_backward_s": excess_backward}
