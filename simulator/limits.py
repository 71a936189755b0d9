"""Upper bounds on what a scenario may ask for (documented in SECURITY.md), checked before any work
starts, and the shape check of loaded input: nesting depth, alias expansion, cycles, numbers.

A YAML alias is shared, not copied, when loaded; `check_structure` counts every use of it, so a
"billion laughs" file is refused after visiting each distinct value once.
"""

from __future__ import annotations

import math

from simulator.errors import ScenarioError

MAX_FILE_BYTES = 16 * 2**20
"""Largest scenario, sweep, layer-table or graph file read."""
MAX_DEPTH = 32
"""Deepest nesting of sections and lists."""
MAX_VALUES = 200_000
"""Most values (aliases counted each time they are used) in one scenario or file."""
MAX_STRING_CHARS = 10_000
"""Longest text value or key."""
MAX_GPUS = 16_384
"""cluster.num_nodes x cluster.gpus_per_node, and NICs (num_nodes x nics_per_node)."""
MAX_LAYERS = 2_048
"""Layers of a model (zoo, inline table or file)."""
MAX_MICROBATCHES = 4_096
"""strategy.num_microbatches."""
MAX_FAT_TREE_K = 128
"""cluster.fat_tree_k."""
MAX_BATCH = 2**24
"""training.global_batch_size."""
MAX_INT = 2**53
"""Largest integer anywhere in the input (exact as a float)."""
MAX_MAGNITUDE = 1e30
"""Largest number anywhere in the input (SI units)."""
MIN_MAGNITUDE = 1e-30
"""Smallest non-zero number anywhere in the input (SI units)."""
MIN_LINK_FACTOR = 1e-6
"""Smallest cluster.degraded_links bandwidth factor."""
MAX_PARAMS = 2 * 10**14
"""Parameters of one model (zoo, Hugging Face config or layer table): above the 174 trillion BaGuaLu
can train (Ma et al., PPoPP 2022, the largest model reported; GPT-3 has 175 billion), so no real model
is refused. A model's size is materialised in places (the optimizer step is one kernel a launch, one
launch per ~21M parameters: `simulator.kernels.optimizer_kernels`): at this bound a data-parallel
fp16 Adam step needs ~0.7 GB (tests/test_huge_sizes.py); a hidden size of 10^9 (~10^18 parameters)
would need terabytes."""
LAYER_COUNT_PARAMS = ("num_layers", "num_hidden_layers", "depth")
"""model.params keys that set a zoo model's number of layers (bounded by MAX_LAYERS before building)."""


def check_structure(data: object, origin: str) -> None:
    """ScenarioError unless `data` (loaded YAML or JSON) nests at most MAX_DEPTH deep, expands to
    at most MAX_VALUES values, has no cycle, and holds only finite numbers within the bounds."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def fail(path: str, problem: str) -> ScenarioError:
        return ScenarioError(f"{origin}: {path or 'top level'}: {problem}")

    def visit(value: object, path: str, depth: int) -> int:
        """The number of values in `value`, aliases expanded."""
        if depth > MAX_DEPTH:
            raise fail(path, f"nested more than {MAX_DEPTH} levels deep")
        if not isinstance(value, (dict, list, tuple)):
            check_scalar(value, path, fail)
            return 1
        if id(value) in sizes:  # an alias used again: its values count again, without a walk
            return sizes[id(value)]
        if id(value) in active:
            raise fail(path, "refers to itself (a recursive YAML alias)")
        active.add(id(value))
        size = 1
        for key, item in (value.items() if isinstance(value, dict) else enumerate(value)):
            if isinstance(value, dict):
                check_scalar(key, path, fail)
            size += visit(item, f"{path}.{key}" if path else str(key), depth + 1)
            if size > MAX_VALUES:
                raise fail(path, f"more than {MAX_VALUES} values (YAML aliases count each time used)")
        active.discard(id(value))
        sizes[id(value)] = size
        return size

    visit(data, "", 0)


def check_scalar(value: object, path: str, fail) -> None:
    """A number finite and within the bounds, a text value at most MAX_STRING_CHARS long."""
    if isinstance(value, bool):
        return
    if isinstance(value, int) and abs(value) > MAX_INT:
        raise fail(path, f"{_short(value)} is larger than {MAX_INT} (2^53)")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise fail(path, f"{value!r} is not a finite number")
        if abs(value) > MAX_MAGNITUDE or 0 < abs(value) < MIN_MAGNITUDE:
            raise fail(path, f"{value!r} is outside the numbers a scenario may hold "
                             f"({MIN_MAGNITUDE:g} to {MAX_MAGNITUDE:g} in magnitude, or 0)")
    if isinstance(value, str) and len(value) > MAX_STRING_CHARS:
        raise fail(path, f"a text of {len(value)} characters (at most {MAX_STRING_CHARS})")


def check_quantity(value: float, text: str) -> float:
    """ValueError unless a parsed quantity is finite and within the bounds; returns it."""
    if not math.isfinite(value) or abs(value) > MAX_MAGNITUDE or 0 < abs(value) < MIN_MAGNITUDE:
        raise ValueError(f"quantity {_short(text)!r} is outside {MIN_MAGNITUDE:g} to {MAX_MAGNITUDE:g} "
                         "in magnitude (SI units)")
    return value


def check_model_params(params: dict) -> None:
    """ScenarioError when a zoo model's layer-count parameter exceeds MAX_LAYERS (before building it)."""
    for key in LAYER_COUNT_PARAMS:
        value = params.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > MAX_LAYERS:
            raise ScenarioError(f"model.params.{key}: {value} is more than the {MAX_LAYERS} layers a model may have")


def check_num_params(num_params: int, source: str) -> None:
    """ScenarioError naming `source` (the field and value that set the size) when a built model has
    more than MAX_PARAMS parameters: refused before anything is sized by its parameter count."""
    if num_params > MAX_PARAMS:
        raise ScenarioError(f"{source}: {num_params:.3g} parameters, more than the {MAX_PARAMS:.0e} a model may have "
                            "(BaGuaLu, the largest reported, was built for 1.74e+14)")


def check_num_layers(num_layers: int, source: str) -> None:
    if num_layers > MAX_LAYERS:
        raise ScenarioError(f"{source}: {num_layers} layers, more than the {MAX_LAYERS} a model may have")


def _short(value: object, limit: int = 40) -> str:
    if isinstance(value, int) and value.bit_length() > 128:
        return f"an integer of {value.bit_length()} bits"
    text = str(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


BYTES_PER_ACTION = 1_000
"""Memory one plan action costs through a simulation (the action, its engine state, its span, the span
table and the summary's walk): 630 B measured on GPT-3 175B simulated in full on 1024 GPUs (992,768
actions, 0.72 GB peak), 1,000 B on the 1T GPT folded (326,084 actions, 0.42 GB); benchmarks/bench_scale.py."""
MEMORY_HEADROOM = 0.8
"""Share of the memory available when a simulation starts that it may plan to use."""


def available_memory_bytes() -> float:
    """Memory the system can give this process now (Linux MemAvailable; else physical memory)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    import os
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return math.inf


def check_simulation_size(num_ranks: int, actions_per_rank: float, hint: str = "") -> None:
    """ScenarioError (one line, with the estimate) when simulating `num_ranks` ranks of about
    `actions_per_rank` actions each would need more than MEMORY_HEADROOM of the memory available:
    refused before the plan is built, instead of running out of memory."""
    needed = num_ranks * actions_per_rank * BYTES_PER_ACTION
    available = available_memory_bytes()
    if needed > MEMORY_HEADROOM * available:
        raise ScenarioError(f"simulating {num_ranks} ranks x ~{actions_per_rank:,.0f} actions needs ~{needed / 2**30:.1f} GiB, "
                            f"more than the {MEMORY_HEADROOM * available / 2**30:.1f} GiB a simulation may use "
                            f"({MEMORY_HEADROOM:.0%} of the {available / 2**30:.1f} GiB this machine has available){hint}")
