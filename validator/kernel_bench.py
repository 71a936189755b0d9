"""Kernel microbenchmarks for `ghpsim calibrate --kernels` and the kernel profile derived from them
(format: `simulator.profile`, `KernelProfile` with `measured`; read by `simulator.kernel_costs`).

What is timed, on one device (`measure`):
* **GEMMs** `torch.mm(A[m, k], B[k, n], out=C)` over a grid of (m, n, k) per dtype (fp32 with
  TF32 off, tf32 = fp32 tensors with TF32 on, fp16, bf16);
* **memory-bound** kernels: the STREAM triad a = b + 2 c (McCalpin, "STREAM", 1995; the
  catalogue's memory efficiencies are triad figures) over fp32 arrays, 3 x 4 bytes moved per
  element, at log-spaced sizes;
* **misaligned GEMMs**: a few large shapes with n or k one short of the grid's (odd: their
  leading dimensions miss cuBLAS's 16-byte alignment, `simulator.kernel_catalogue.ALIGNMENT_BYTES`);
* **launch**: a one-element in-place add, the least kernel torch launches;
* **framework host** (CUDA): training steps of a tiny eager MLP (`FRAMEWORK_LAYERS` x
  Linear(`FRAMEWORK_WIDTH`) + GELU, fused Adam), whose GPU work is negligible: the step's wall time
  over the kernels it launches (counted by torch.profiler, `validator.kernel_trace`) is the host's
  time per kernel as a training framework issues them (module hooks, autograd, the optimizer).

Timing (`Clock`): a figure is the median over `repeats` blocks (after `warmup` blocks) of a
block's time per call; a block is n back-to-back calls lasting about `min_block_s`. On CPU the
block is timed with `time.perf_counter`, on one torch thread (as the validator's ranks run). On
CUDA with CUDA events on the stream, and the block is enqueued behind a `torch.cuda._sleep`
kernel long enough to cover the host's issuing of it, so that the events time the GPU running
the calls back to back (launch gaps included) rather than the host's issue rate (the usual trick
of CUDA launch-overhead measurements; without `_sleep` the block is enqueued uncovered). The
host's time per call (perf_counter around the issuing) is the launch's `host_issue_s`.

The profile's parameters (`kernel_profile_document`), each from the measurements:
* `launch_overhead_s` = the launch kernel's time (GPU: back to back on the stream; CPU: the
  operator's wall time); on CPU `host_overhead_s` = 0 (the operators run synchronously, so their
  dispatch is in every kernel's time already); on CUDA it is the framework host's time per kernel
  (the bare launch's issue time, kept in `measured.launch`, is a floor, not what a training step
  spends: 42-45 us a kernel in host-bound eager GPT steps on the H200 of reports/gpu/h200_kernels,
  where the tiny step gives 33 us and a bare issue 11 us); without a framework figure the
  catalogue's stays;
* `misaligned_gemm_efficiency` = the median tile efficiency of the first dtype's misaligned GEMMs;
* per GEMM, efficiency = 2mnk / time / datasheet peak and tile_efficiency = the efficiency with
  which `simulator.kernel_costs.tiled_compute_s` takes time - launch (at least `MIN_WORK_SHARE`
  of the time); `gemm_efficiency` = the largest tile efficiency among the first dtype's large
  GEMMs (2mnk >= `LARGE_SHARE` x the largest), capped at 1: the large-GEMM ceiling;
* per stream size S, efficiency = S / ((time - launch) x datasheet bandwidth); `memory_efficiency`
  = their median over the large sizes (S >= `LARGE_SHARE` x the largest), capped at 1;
* flash attention is not timed: `flash_attention_efficiency` stays the catalogue's.
The datasheet figures are the catalogue GPU's (`simulator/data/gpus.yaml`: `--gpu`, else the
CUDA device's name matched by `GPU_NAMES`); on CPU the catalogue's `cpu` entry, a nominal
placeholder (2 x 2.5 GHz x 32 FLOP/cycle, 20 GB/s), stands in: the efficiencies are relative to
it, which the profile's provenance says.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from simulator.errors import ScenarioError
from simulator.hardware import GPUS, GpuSpec, resolve_gpu
from simulator.kernel_costs import device_for, tiled_compute_s
from simulator.profile import FORMAT
from validator.kernel_trace import busy_s, kernel_trace

TORCH_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
MIN_WORK_SHARE = 0.05
"""A kernel's time less the launch overhead is taken as at least this share of its time (a kernel
no slower than the launch floor keeps a finite efficiency)."""
LARGE_SHARE = 0.25
"""Large GEMMs (streams): FLOPs (bytes) at least this share of the largest measured."""
MAX_BLOCK_CALLS = 256
"""At most this many calls in a timed block: a CUDA stream queues about 1024 launches, and a call
may launch two kernels (cuBLAS's split-K reduction)."""
SLEEP_MARGIN = 3.0
"""The covering sleep lasts this many times the block's host issue time, as the previous block
took it (+ 0.1 ms)."""
STAND_IN_NOTE = ("datasheet figures: the catalogue's 'cpu' entry, a nominal placeholder (2 cores x 2.5 GHz x "
                 "32 FLOP/cycle = 160 GFLOP/s, 20 GB/s), stands in for this CPU's peak; efficiencies are "
                 "relative to it")
GPU_NAMES = ((("h200",), "H200"), (("h100", "pcie"), "H100-PCIe"), (("h100",), "H100-SXM"), (("b200",), "B200"),
             (("a100", "pcie", "80"), "A100-80GB-PCIe"), (("a100", "pcie"), "A100-40GB-PCIe"),
             (("a100", "80"), "A100-80GB"), (("a100",), "A100-40GB"), (("v100", "pcie"), "V100-PCIe"),
             (("v100", "16"), "V100-16GB"), (("v100",), "V100"), (("l40s",), "L40S"), (("l4",), "L4"),
             (("a10",), "A10"), (("t4",), "T4"), (("mi300x",), "MI300X"), (("mi250x",), "MI250X"),
             (("p100", "pcie"), "P100-PCIe"), (("p100",), "P100-SXM2"), (("p40",), "P40"))
"""(substrings all in the lower-cased CUDA device name, catalogue entry), first match wins."""


@dataclass(frozen=True)
class KernelBenchSettings:
    device: str
    dtypes: tuple[str, ...]
    gemm_m: tuple[int, ...]
    gemm_n: tuple[int, ...]
    gemm_k: tuple[int, ...]
    memory_sizes_bytes: tuple[int, ...]
    """Bytes a triad moves (3 arrays of fp32)."""
    misaligned_gemms: tuple[tuple[int, int, int], ...] = ()
    """(m, n, k) shapes with an odd n or k (module docstring)."""
    repeats: int = 5
    warmup: int = 1
    min_block_s: float = 0.005
    num_threads: int | None = None
    """torch's intra-op threads while timing; None: as they are."""

    def record(self) -> dict:
        return {"dtypes": list(self.dtypes), "gemm_m": list(self.gemm_m), "gemm_n": list(self.gemm_n),
                "gemm_k": list(self.gemm_k), "memory_sizes_bytes": list(self.memory_sizes_bytes),
                "misaligned_gemms": [list(shape) for shape in self.misaligned_gemms],
                "repeats": self.repeats, "warmup": self.warmup, "min_block_s": self.min_block_s,
                "num_threads": self.num_threads}


def _triads(count: int, first_array_bytes: int = 4096) -> tuple[int, ...]:
    return tuple(3 * first_array_bytes * 4 ** j for j in range(count))


SIZES = {  # (m values, n values, k values, triad sizes, misaligned (m, n, k))
    "cuda": ((128, 512, 2048, 8192, 16384), (128, 512, 2048, 8192, 16384), (64, 256, 1024, 4096, 16384),
             _triads(10),  # arrays 4 KiB .. 1 GiB: past any L2
             ((8192, 8191, 1024), (8192, 8192, 1023), (8192, 8191, 4096), (8192, 8192, 4095))),
    "cpu": ((32, 128, 512), (32, 128, 512), (32, 128, 512), _triads(7), ((512, 511, 128), (512, 512, 127))),
    "quick": ((8, 32, 64), (8, 32, 64), (8, 32, 64), _triads(4, 1024),  # for tests: about a second
              ((64, 63, 32), (64, 64, 31))),
}
DEFAULT_DTYPES = {"cuda": ("fp16", "bf16", "fp32"), "cpu": ("fp32",)}


def bench_settings(device: str, dtypes: tuple[str, ...] | None = None, quick: bool = False,
                   repeats: int | None = None) -> KernelBenchSettings:
    """The default grid of `device` (`SIZES`), or the tiny one with `quick`."""
    m, n, k, memory, misaligned = SIZES["quick" if quick else device]
    dtypes = tuple(dtypes or DEFAULT_DTYPES[device])
    for dtype in dtypes:
        if dtype not in TORCH_DTYPES:
            raise ScenarioError(f"--dtypes: {dtype!r} is not one of {', '.join(TORCH_DTYPES)}")
    return KernelBenchSettings(device, dtypes, m, n, k, memory, misaligned, repeats=repeats or (3 if quick else 5),
                               min_block_s=0.002 if quick else 0.005, num_threads=1 if device == "cpu" else None)


def catalogue_gpu(device: str, name: str | None = None) -> GpuSpec:
    """The catalogue entry whose datasheet figures the efficiencies divide by: `name`, else on CPU
    the `cpu` stand-in, on CUDA the device's name matched by `GPU_NAMES`."""
    if name:
        try:
            return resolve_gpu(name)
        except ValueError as error:
            raise ScenarioError(f"--gpu: {error}") from None
    if device == "cpu":
        return GPUS["cpu"]
    found = torch.cuda.get_device_name()
    lowered = found.lower()
    for parts, entry in GPU_NAMES:
        if all(part in lowered for part in parts):
            return GPUS[entry]
    raise ScenarioError(f"--gpu: cannot tell which catalogue GPU {found!r} is; name it with --gpu "
                        "(`ghpsim list gpus`)")


# ----------------------------------------------------------------------------- timing

class Clock:
    """Per-call times of a function on `device` (module docstring, "Timing")."""

    def __init__(self, settings: KernelBenchSettings):
        self.settings = settings
        self.cuda = settings.device == "cuda"
        self.uncovered_blocks = 0
        self.sleep_cycles_per_s = self._sleep_rate() if self.cuda and hasattr(torch.cuda, "_sleep") else None

    @staticmethod
    def _sleep_rate(cycles: int = 10_000_000) -> float:
        torch.cuda._sleep(cycles // 10)  # warm up
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        return cycles / (start.elapsed_time(end) / 1e3)

    def _block(self, fn: Callable[[], object], calls: int, cover_s: float) -> tuple[float, float]:
        """(time per call, host issue time per call) of one block."""
        if not self.cuda:
            started = time.perf_counter()
            for _ in range(calls):
                fn()
            per_call = (time.perf_counter() - started) / calls
            return per_call, per_call
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if cover_s > 0 and self.sleep_cycles_per_s:
            torch.cuda._sleep(int(cover_s * self.sleep_cycles_per_s))
        start.record()
        issued = time.perf_counter()
        for _ in range(calls):
            fn()
        host_s = time.perf_counter() - issued
        end.record()
        end.synchronize()
        if cover_s > 0 and host_s > cover_s:
            self.uncovered_blocks += 1
        return start.elapsed_time(end) / 1e3 / calls, host_s / calls

    def time(self, fn: Callable[[], object], cover: bool = True) -> tuple[float, float]:
        """Median (time per call, host issue time per call) over the timed blocks; `cover`: behind a
        sleep (CUDA), so that the GPU runs the calls back to back."""
        s = self.settings
        fn()
        if self.cuda:
            torch.cuda.synchronize()
        probe, host = self._block(fn, 1, 1e-4 if cover else 0.0)
        calls = max(1, min(MAX_BLOCK_CALLS, math.ceil(s.min_block_s / max(probe, 1e-7))))
        blocks = []
        for _ in range(s.warmup + s.repeats):
            blocks.append(self._block(fn, calls, SLEEP_MARGIN * calls * host + 1e-4 if cover else 0.0))
            host = blocks[-1][1]
        blocks = blocks[s.warmup:]
        return statistics.median(b[0] for b in blocks), statistics.median(b[1] for b in blocks)


@contextlib.contextmanager
def tf32_matmul(enabled: bool):
    """CUDA matmuls of fp32 tensors in TF32 (`enabled`) or not, inside the block."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def bench_gemm(settings: KernelBenchSettings, clock: Clock, say=lambda message: None,
               shapes=None) -> list[dict]:
    """Each dtype's GEMMs over the grid, or over `shapes` ((m, n, k) triples) where given."""
    rows, generator = [], torch.Generator(device=settings.device).manual_seed(0)
    shapes = list(shapes if shapes is not None else
                  itertools.product(settings.gemm_m, settings.gemm_n, settings.gemm_k))
    for dtype in settings.dtypes:
        say(f"GEMMs in {dtype}: {len(shapes)} shapes")
        with tf32_matmul(dtype == "tf32"):
            for m, n, k in shapes:
                options = dict(device=settings.device, dtype=TORCH_DTYPES[dtype])
                a = torch.randn(m, k, generator=generator, **options)
                b = torch.randn(k, n, generator=generator, **options)
                c = torch.empty(m, n, **options)
                time_s, _ = clock.time(lambda: torch.mm(a, b, out=c))
                rows.append({"dtype": dtype, "m": m, "n": n, "k": k, "time_s": time_s})
                del a, b, c
    return rows


def bench_memory(settings: KernelBenchSettings, clock: Clock) -> list[dict]:
    rows = []
    for size in settings.memory_sizes_bytes:
        elements = max(1, size // 12)
        a, b, c = (torch.full((elements,), 1.0, device=settings.device) for _ in range(3))
        time_s, _ = clock.time(lambda: torch.add(b, c, alpha=2.0, out=a))
        rows.append({"size_bytes": 12 * elements, "time_s": time_s})
        del a, b, c
    return rows


def bench_launch(settings: KernelBenchSettings, clock: Clock) -> dict:
    x = torch.zeros(1, device=settings.device)
    kernel_s, host_s = clock.time(lambda: x.add_(1.0))
    return {"kernel_s": kernel_s, "host_issue_s": host_s if clock.cuda else 0.0}


FRAMEWORK_LAYERS, FRAMEWORK_WIDTH, FRAMEWORK_BATCH, FRAMEWORK_STEPS = 16, 64, 8, 50


def bench_framework_host(settings: KernelBenchSettings) -> dict | None:
    """The framework host's time per kernel on CUDA (module docstring); None on CPU."""
    if settings.device != "cuda":
        return None
    torch.manual_seed(0)
    layers = [layer for _ in range(FRAMEWORK_LAYERS)
              for layer in (torch.nn.Linear(FRAMEWORK_WIDTH, FRAMEWORK_WIDTH), torch.nn.GELU())]
    model = torch.nn.Sequential(*layers).to(settings.device)
    update = torch.optim.Adam(model.parameters(), lr=1e-4, fused=True)
    x = torch.randn(FRAMEWORK_BATCH, FRAMEWORK_WIDTH, device=settings.device)

    def step() -> None:
        update.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        update.step()

    return framework_host(step, lambda: kernel_trace(step, settings.device), torch.cuda.synchronize,
                          FRAMEWORK_STEPS, settings.repeats)


def framework_host(step, trace, synchronize, steps: int, repeats: int) -> dict | None:
    """{step_s: the median over `repeats` blocks of `steps` steps of a step's wall time, kernels: the
    GPU launches of one step (`trace()`), gpu_busy_s: their busy time}; None without a trace."""
    for _ in range(3):
        step()
    synchronize()
    kernels = trace()
    if not kernels:
        return None
    blocks = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            step()
        synchronize()
        blocks.append((time.perf_counter() - start) / steps)
    return {"step_s": statistics.median(blocks), "kernels": len(kernels), "gpu_busy_s": busy_s(kernels)}


def measure(settings: KernelBenchSettings, say=lambda message: None) -> dict:
    """Every kernel figure of `settings.device` (module docstring), raw."""
    clock, threads = Clock(settings), torch.get_num_threads()
    torch.set_num_threads(settings.num_threads or threads)
    try:
        say("launch overhead")
        launch = bench_launch(settings, clock)
        say(f"memory-bound kernels: {len(settings.memory_sizes_bytes)} sizes")
        memory = bench_memory(settings, clock)
        gemm = bench_gemm(settings, clock, say)
        misaligned = bench_gemm(settings, clock, lambda message: say(f"misaligned {message}"),
                                settings.misaligned_gemms) if settings.misaligned_gemms else []
        if settings.device == "cuda":
            say("framework host: a tiny eager training step")
        framework = bench_framework_host(settings)
        num_threads = torch.get_num_threads()
    finally:
        torch.set_num_threads(threads)
    return {"dtypes": list(settings.dtypes), "launch": launch, "memory": memory, "gemm": gemm,
            "misaligned_gemm": misaligned, "framework": framework,
            "timing": {"sleep_cycles_per_s": clock.sleep_cycles_per_s, "uncovered_blocks": clock.uncovered_blocks,
                       "tf32_matmul_default": torch.backends.cuda.matmul.allow_tf32,
                       "num_threads": num_threads}}


# ----------------------------------------------------------------------------- the profile

def _capped(value: float, what: str, notes: list[str]) -> float:
    if value > 1.0:
        notes.append(f"{what}: measured {value:.3f} x the datasheet figure (above it); capped at 1")
    return min(1.0, value)


def _gemm_rows(rows, gpu: GpuSpec, launch_s: float) -> list[dict]:
    """Timed GEMMs with their achieved FLOP/s, efficiency and tile efficiency (module docstring)."""
    derived = []
    for row in rows:
        target = device_for(gpu, row["dtype"])
        flops, time_s = 2.0 * row["m"] * row["n"] * row["k"], row["time_s"]
        work_s = max(time_s - launch_s, MIN_WORK_SHARE * time_s)
        derived.append({**row, "achieved_flops_per_s": flops / time_s,
                        "efficiency": flops / time_s / target.peak_flops_per_s,
                        "tile_efficiency": tiled_compute_s(row["m"], row["n"], row["k"], 1, target, 1.0) / work_s})
    return derived


def kernel_profile_document(raw: dict, gpu: GpuSpec, device: dict, notes: list[str]) -> dict:
    """The kernel profile (without provenance) from `measure`'s raw figures, the catalogue `gpu`
    and `device` (`{kind, name, num_threads}`); capped figures are noted in `notes`."""
    launch_s = raw["launch"]["kernel_s"]
    gemm = _gemm_rows(raw["gemm"], gpu, launch_s)
    misaligned = _gemm_rows(raw.get("misaligned_gemm", ()), gpu, launch_s)
    primary = [row for row in gemm if row["dtype"] == raw["dtypes"][0]]
    largest = max(2.0 * row["m"] * row["n"] * row["k"] for row in primary)
    ceiling = max(row["tile_efficiency"] for row in primary
                  if 2.0 * row["m"] * row["n"] * row["k"] >= LARGE_SHARE * largest)
    bandwidth = gpu.memory_bandwidth_bytes_per_s
    memory = [{**row, "bandwidth_bytes_per_s": row["size_bytes"] / row["time_s"],
               "efficiency": row["size_bytes"] / (max(row["time_s"] - launch_s, MIN_WORK_SHARE * row["time_s"])
                                                   * bandwidth)} for row in raw["memory"]]
    biggest = max(row["size_bytes"] for row in memory)
    stream = statistics.median(row["efficiency"] for row in memory if row["size_bytes"] >= LARGE_SHARE * biggest)
    parameters = {"gemm_efficiency": _capped(ceiling, "gemm_efficiency", notes),
                  "memory_efficiency": _capped(stream, "memory_efficiency", notes),
                  "launch_overhead_s": launch_s}
    framework = raw.get("framework")
    if device["kind"] == "cpu":
        parameters["host_overhead_s"] = 0.0
    elif framework:
        parameters["host_overhead_s"] = framework["step_s"] / framework["kernels"]
        if framework["gpu_busy_s"] > 0.5 * framework["step_s"]:
            notes.append(f"framework host: the GPU was busy {framework['gpu_busy_s'] / framework['step_s']:.0%} "
                         "of the tiny step, so its host time per kernel is an upper bound")
    primary_misaligned = [row["tile_efficiency"] for row in misaligned if row["dtype"] == raw["dtypes"][0]]
    if primary_misaligned:
        parameters["misaligned_gemm_efficiency"] = _capped(statistics.median(primary_misaligned),
                                                           "misaligned_gemm_efficiency", notes)
    peaks = {dtype: gpu.peak_for(dtype) for dtype in raw["dtypes"]}
    return {"format": FORMAT, "kind": "kernel", "architecture": (gpu.architecture or "generic").lower(),
            "parameters": parameters,
            "measured": {"device": device, "gpu": gpu.name, "peak_flops_per_s": peaks,
                         "memory_bandwidth_bytes_per_s": bandwidth, "gemm": gemm, "misaligned_gemm": misaligned,
                         "memory": memory, **({"framework": framework} if framework else {}),
                         "launch": raw["launch"]}}

