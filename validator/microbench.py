"""Micro-benchmarks for calibration: per-layer compute, optimizer steps and top-k selection
(communication: `validator.comm_bench`). `validator/calibrate.py` runs them on several ranks, fits
their medians (`validator.fitting`) and writes a profile (format: `simulator.profile`).

Every figure is a *median* of `repeats` timed samples after `warmup` untimed ones. A compute
sample is a block of back-to-back iterations lasting at least `min_block_s` (10 ms), reported per
iteration, so that time-sharing of cores by more ranks than cores is counted (see
`_time_blocks`). Timing is wall time
(`time.perf_counter`); on CUDA the device is synchronised before each clock read. No end-to-end
training step is ever timed: each layer is timed alone, on the real input it sees in the model
(the output of the layers before it on a real batch), and its backward pass alone from a saved
output gradient. Threads are the caller's business (`torch.set_num_threads`).
"""

from __future__ import annotations

import importlib
import math
import statistics
import time
from collections.abc import Callable, Sequence

import torch

from simulator.workload import Workload
from validator.optimizers import make_optimizer
from validator.stream_timing import settled as _settled, stream_timed as _stream_timed



# ----------------------------------------------------------------------------- helpers


def load_models_module(models=None):
    """The model-building module (default `validator.models`), or a module name to import."""
    if models is None:
        models = "validator.models"
    return importlib.import_module(models) if isinstance(models, str) else models


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _to(value, device):
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(_to(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    return value


def activation_chain(modules, inputs) -> list:
    """[inputs, output of layer 0, output of layers 0..1, ...] without autograd: each layer's input
    for timing it alone."""
    chain = [inputs]
    with torch.no_grad():
        for module in modules:
            chain.append(module(chain[-1]))
    return chain


def _as_input(tensor: torch.Tensor, needs_grad: bool) -> torch.Tensor:
    tensor = tensor.detach()
    if needs_grad and tensor.is_floating_point():
        tensor.requires_grad_(True)
    return tensor


# ----------------------------------------------------------------------------- compute


DEFAULT_MIN_BLOCK_S = 0.01
"""A timed sample is a block of back-to-back iterations lasting at least this long."""


def _time_blocks(run: Callable[[], tuple[float, ...]], repeats: int, warmup: int, min_block_s: float,
                 agree: Callable[[int], int]) -> tuple[float, ...]:
    """Median over `repeats` blocks (after `warmup` blocks) of the mean per-iteration time of
    each part that `run()` times.

    A block is `n` back-to-back iterations with n chosen so that a block lasts >= `min_block_s`
    (n is agreed between ranks with `agree`, a max over ranks). Timing blocks rather than single
    iterations keeps time-sharing in the figure: when more ranks than cores compute at once, an
    iteration shorter than the scheduler's time slice usually runs uninterrupted, so the median
    of single iterations shows no slowdown although each rank only gets a share of a core; over
    a block of several time slices the waits are counted.

    `run()` may return a callable instead of the parts (CUDA: events recorded on the stream, read
    once the block is done, `validator.stream_timing`); then the block runs without synchronising
    between its iterations."""
    _settled(run())
    probe = sum(_settled(run()))
    iterations = agree(max(1, math.ceil(min_block_s / probe)) if probe > 0 else 1)
    blocks = []
    for _ in range(warmup + repeats):
        pending = [run() for _ in range(iterations)]
        totals = None
        for parts in map(_settled, pending):
            totals = parts if totals is None else tuple(t + p for t, p in zip(totals, parts))
        blocks.append(tuple(t / iterations for t in totals))
    kept = blocks[warmup:] or blocks
    return tuple(float(statistics.median(column)) for column in zip(*kept))


def _same(value: int) -> int:
    return value


def time_layers(workload: Workload, batch_sizes: Sequence[int], repeats: int = 7, device: str = "cpu",
                warmup: int = 2, *, models=None, seed: int = 0, barrier: Callable[[], None] | None = None,
                agree: Callable[[int], int] | None = None, active: bool = True,
                rounds: Sequence[bool] | None = None, include_loss: bool = True,
                min_block_s: float = DEFAULT_MIN_BLOCK_S,
                progress: Callable[[str], None] | None = None) -> list[dict]:
    """Forward and backward wall time of every layer at every batch size (median over blocks).

    Layer i's input is the output of layers 0..i-1 on a real batch (`make_batch`); the backward
    of layer i alone is timed from a saved random output gradient (for the last layer, with
    `include_loss`, from `loss_fn` instead, and its forward time includes the loss). Inputs of
    layers after the first require grad, as in training. Modules are in train mode; gradients
    accumulate in `.grad` across iterations. Each figure is the median over `repeats` blocks of
    the mean time per iteration within a block of back-to-back iterations lasting at least
    `min_block_s` (see `_time_blocks`; `min_block_s=0` times single iterations).

    Several ranks calling this at the same time: `barrier` is called before every (batch size,
    layer) measurement so that they measure the same layer at the same time, and `agree`
    (max over ranks) fixes a common block length. With `active=False` a rank only takes part in
    the barriers and agreements (it waits while the others measure).

    `rounds` (default `(active,)`): each (batch size, layer) is measured once per round, the
    rounds back to back, and this rank computes in round j iff `rounds[j]` (so that ranks can
    compare k ranks computing at once with fewer, under the same background load).

    Returns one dict per layer: `{"index", "name", "batch_sizes", "forward_s", "backward_s",
    "rounds"}`: `forward_s` / `backward_s` are lists in batch-size order for round 0 (empty when
    this rank is idle in it) and `rounds[j]` is `{"forward_s", "backward_s"}` of round j.
    """
    barrier = barrier or (lambda: None)
    agree = agree or _same
    rounds = tuple(rounds) if rounds is not None else (active,)
    layers = workload.layers
    results = [{"index": i, "name": layer.name, "batch_sizes": list(batch_sizes),
                "rounds": [{"forward_s": [], "backward_s": []} for _ in rounds]}
               for i, layer in enumerate(layers)]
    if not any(rounds):
        for _ in range(len(batch_sizes) * len(layers) * len(rounds)):
            barrier()
            agree(0)
        barrier()
        return _round_zero(results)

    models = load_models_module(models)
    device = torch.device(device)
    modules = [module.to(device).train() for module in models.build_modules(workload, seed=seed)]
    if len(modules) != len(layers):
        raise ValueError(f"build_modules gave {len(modules)} modules for {len(layers)} layers of {workload.name!r}")
    loss_fn = getattr(models, "loss_fn", None) if include_loss else None
    generator = torch.Generator(device="cpu").manual_seed(seed)

    for batch in batch_sizes:
        inputs, targets = models.make_batch(workload, batch, seed=seed)
        inputs, targets = _to(inputs, device), _to(targets, device)
        chain = activation_chain(modules, inputs)
        for index, module in enumerate(modules):
            with_loss = loss_fn is not None and index == len(modules) - 1
            output_grad = torch.randn(chain[index + 1].shape, generator=generator,
                                      dtype=chain[index + 1].dtype).to(device)

            def run_on_stream(module=module, index=index, with_loss=with_loss, output_grad=output_grad):
                x = _as_input(chain[index], needs_grad=index > 0)
                held = {}

                def forward():
                    out = module(x)
                    held["out"] = loss_fn(workload, out, targets) if with_loss else out

                def backward():
                    out = held.pop("out")
                    out.backward() if with_loss else out.backward(output_grad)

                return _stream_timed(forward, backward)

            def run(module=module, index=index, with_loss=with_loss, output_grad=output_grad):
                x = _as_input(chain[index], needs_grad=index > 0)
                _sync(device)
                start = time.perf_counter()
                out = module(x)
                if with_loss:
                    out = loss_fn(workload, out, targets)
                _sync(device)
                middle = time.perf_counter()
                if with_loss:
                    out.backward()
                else:
                    out.backward(output_grad)
                _sync(device)
                return middle - start, time.perf_counter() - middle

            for computes, record in zip(rounds, results[index]["rounds"]):
                barrier()
                if computes:
                    timed = run_on_stream if device.type == "cuda" else run
                    forward, backward = _time_blocks(timed, repeats, warmup, min_block_s, agree)
                    record["forward_s"].append(forward)
                    record["backward_s"].append(backward)
                else:
                    agree(0)
            module.zero_grad(set_to_none=True)
            if progress:
                progress(f"layer {index} {layers[index].name} batch {batch}")
        del chain
    barrier()
    return _round_zero(results)


def _round_zero(results: list[dict]) -> list[dict]:
    for entry in results:
        entry["forward_s"] = entry["rounds"][0]["forward_s"]
        entry["backward_s"] = entry["rounds"][0]["backward_s"]
    return results


def time_optimizer(optimizer: str, parameter_sets: Sequence, repeats: int = 7, device: str = "cpu",
                   warmup: int = 2, *, barrier: Callable[[], None] | None = None,
                   agree: Callable[[int], int] | None = None, min_block_s: float = DEFAULT_MIN_BLOCK_S,
                   seed: int = 0) -> list[dict]:
    """Time of one update, `optimizer.step()` then `zero_grad(set_to_none=False)` as the runtimes
    do it, for each set of parameters (median over blocks, as `time_layers`; `barrier` before each
    set, `agree` for the block length).

    A set is an int (one flat fp32 tensor of that many parameters) or a list of tensors (e.g. the
    parameters of some layers: copies are stepped, with random gradients, so the originals are
    untouched). Returns `[{"num_params", "num_tensors", "median_s"}]` in order.
    """
    barrier = barrier or (lambda: None)
    agree = agree or _same
    device = torch.device(device)
    generator = torch.Generator(device="cpu").manual_seed(seed)
    results = []
    for parameter_set in parameter_sets:
        if isinstance(parameter_set, int):
            shapes = [(parameter_set,)]
        else:
            shapes = [tuple(p.shape) for p in parameter_set]
        params = []
        for shape in shapes:
            p = torch.zeros(shape, device=device, requires_grad=True)
            p.grad = torch.randn(shape, generator=generator).to(device)
            params.append(p)
        step = make_optimizer(optimizer, params)

        def run(step=step):
            _sync(device)
            start = time.perf_counter()
            step.step()
            step.zero_grad(set_to_none=False)  # as every runtime's update does
            _sync(device)
            return (time.perf_counter() - start,)

        barrier()
        (median,) = _time_blocks(run, repeats, warmup, min_block_s, agree)
        results.append({"num_params": int(sum(p.numel() for p in params)), "num_tensors": len(params),
                        "median_s": median})
        del step, params
    barrier()
    return results


def time_topk(element_counts: Sequence[int], density: float, repeats: int = 7, device: str = "cpu",
              warmup: int = 2, *, barrier: Callable[[], None] | None = None,
              agree: Callable[[int], int] | None = None, min_block_s: float = DEFAULT_MIN_BLOCK_S,
              seed: int = 0) -> list[dict]:
    """Time of the runtime's top-k selection with error feedback (`validator.runtime.sparsify`:
    residual += gradient, torch.topk of the magnitudes with k = ceil(density x n), gather of the
    values, residual zeroed there, payload packed) on a flat fp32 gradient of each size (median
    over blocks, `barrier` and `agree` as `time_optimizer`). Returns `[{"num_elements", "median_s"}]`."""
    from simulator.sparse import topk_count
    from validator.runtime import sparsify
    barrier = barrier or (lambda: None)
    agree = agree or _same
    device = torch.device(device)
    generator = torch.Generator(device="cpu").manual_seed(seed)
    results = []
    for count in element_counts:
        gradient = torch.randn(count, generator=generator).to(device)
        residual = torch.zeros(count, device=device)
        k = topk_count(count, density)

        def run(gradient=gradient, residual=residual, k=k):
            _sync(device)
            start = time.perf_counter()
            sparsify(gradient, residual, k)
            _sync(device)
            return (time.perf_counter() - start,)

        barrier()
        (median,) = _time_blocks(run, repeats, warmup, min_block_s, agree)
        results.append({"num_elements": int(count), "median_s": median})
    barrier()
    return results
