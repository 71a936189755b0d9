"""FP8 training as NVIDIA Transformer Engine runs it (`training.fp8_recipe`): a transformer block's
linear layers compute in FP8, everything else stays in the 16-bit training dtype.

Inside `te.fp8_autocast`, TE's `Linear`, `LayerNormLinear` and `GroupedLinear` modules (what
Megatron-Core builds a block's QKV, out-projection, MLP and expert GEMMs from) multiply FP8 operands
(E4M3 forward, E5M2 gradients: the "hybrid" format) with 16-bit outputs; the attention core, the
norms, the router, the embedding and the output layer are not TE linears and stay 16-bit (Megatron-
Core's `TEColumnParallelLinear` / `TERowParallelLinear` / `TEGroupedMLP`; the output layer is a
plain `ColumnParallelLinear`). The kernels that adds, per linear layer and pass:
- forward: the input x[m, k] cast to FP8 with its transpose (TE's fused cast-transpose: Hopper's FP8
  tensor cores take only the TN layout, so the backward's weight gradient needs x^T), reading e and
  writing 2 bytes an element; the GEMM reads 1-byte operands at the GPU's FP8 peak;
- backward: the output gradient dy[m, n] cast the same way, then both GEMMs in FP8 (dgrad: dy and
  W^T; wgrad: dy^T and the x^T saved in the forward);
- recipe `current` (per-tensor current scaling, TE's `Float8CurrentScaling`): each cast first
  reads its tensor for the amax that sets the scale (one more read, e bytes an element); `delayed`
  (TE's `DelayedScaling`, the default) takes the scale from earlier steps' amax history, which
  the cast kernel records on the fly;
- once a step, each weight cast with its transpose (`weight_cast_passes`): TE caches FP8 weights
  across a step's micro-batches (Megatron passes `is_first_microbatch`); priced over all the
  parameters the optimizer updates (the embedding's and norms' few % too).
Simplification: TE's `LayerNormLinear` writes the norm's output in FP8 directly; here the norm
writes 16 bits and a cast follows (one more read of that input, a few % of a block's memory time).
"""

from __future__ import annotations

from dataclasses import replace

from simulator.errors import ScenarioError
from simulator.kernel_ops import Kernel, pointwise

FP8_LINEARS = frozenset({"qkv", "proj", "fc1", "fc2", "shared_fc1", "shared_fc2", "experts.fc1", "experts.fc2"})
"""The GEMMs of `simulator.kernels` that TE linear modules run (router and logits excluded)."""
FP8_BYTES = 1
FP8_KINDS = frozenset({"transformer_block", "moe_block"})
"""Zoo spec kinds whose linear layers are TE modules."""


def _linear_name(kernel: Kernel) -> str | None:
    """The linear layer a GEMM belongs to, if TE runs it in FP8."""
    if kernel.kind != "gemm":
        return None
    base = kernel.name.removesuffix(".dgrad").removesuffix(".wgrad")
    return base if base in FP8_LINEARS else None


def _cast(name: str, elements: float, e: int, recipe: str) -> list[Kernel]:
    """A tensor of `elements` 16-bit values cast to FP8 with its transpose (amax first under `current`)."""
    amax = [pointwise(f"{name}.amax", "reduction", elements, e, 0.0)] if recipe == "current" else []
    return amax + [pointwise(f"{name}.fp8_cast_transpose", "elementwise", elements, e, 2 * FP8_BYTES)]


def fp8_linears(kernels: list[Kernel], e: int, phase: str, recipe: str) -> list[Kernel]:
    """A block pass's kernels with its TE linear layers in FP8 (module docstring). Forward GEMM
    C[m, n] = x[m, k] W: x has m k elements; backward dgrad (m, k_in, n_out) and wgrad
    (n_out, k_in, m): dy has m x k elements of the first of them in either case."""
    out: list[Kernel] = []
    cast_done: set[str] = set()
    for kernel in kernels:
        name = _linear_name(kernel)
        if name is None:
            out.append(kernel)
            continue
        if name not in cast_done:  # backward: dy once for both GEMMs; forward: x
            cast_done.add(name)
            which = "input" if phase != "B" else "output_grad"
            out += _cast(f"{name}.{which}", kernel.m * kernel.k * kernel.batch_count, e, recipe)
        operands = (kernel.m * kernel.k + kernel.k * kernel.n) * kernel.batch_count * FP8_BYTES
        out.append(replace(kernel, bytes_read=operands, fp8=True))
    return out


def weight_cast_passes(recipe: str | None, e: int) -> list[tuple[str, int, float, float]]:
    """The optimizer-step passes FP8 adds, as `simulator.kernels.optimizer_kernels` lists them (name,
    tensor lists, bytes read and written per parameter): each weight cast with its transpose."""
    if recipe is None:
        return []
    return [("fp8_weight_cast", 2, e * (2 if recipe == "current" else 1), 2.0 * FP8_BYTES)]


def check_fp8_workload(workload, recipe: str | None) -> None:
    """ScenarioError where FP8 training would change nothing: a model without transformer or MoE blocks
    has no Transformer Engine linear layer (convolutions and plain layers stay 16-bit)."""
    if recipe is not None and not any(layer.spec.get("kind") in FP8_KINDS for layer in workload.layers):
        raise ScenarioError(f"training.fp8_recipe: {recipe!r} runs the linear layers of transformer and MoE blocks "
                            f"in FP8 (Transformer Engine); model {workload.name!r} has none: drop it")
