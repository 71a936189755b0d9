"""Calibration profiles (format `ghpsim-profile/2`): what `ghpsim calibrate` measured on a machine.

One versioned pydantic schema, read by `load_profile` and written by `validator.calibrate` with
`profile_document`. Times are seconds, sizes bytes, bandwidths bytes per second.

| key | meaning |
| --- | --- |
| `format` | `"ghpsim-profile/2"`; any other value is refused with what to do |
| `device` | `{kind: cpu or cuda, name, num_threads}`: what the layers ran on |
| `backend` | `gloo` or `nccl`, the process group of the communication benchmarks |
| `world_size` | ranks that ran the calibration at once |
| `model` | `{name, params, layer_names, num_params, forward_flops_per_sample}`: must match the workload |
| `layers` | per layer, in order: `{name, forward: LAYER_FIT, backward: LAYER_FIT}`: the layer's pass inside whole-model sweeps, as a training step runs it |
| `optimizer` | `{name: sgd, momentum or adam, intercept_s, per_param_s}`: one update of n parameters |
| `weight_passes` | optional `{stash, predict, repredict, accumulate, average: PARAM_FIT}`: the per-micro-batch passes of asynchronous pipelines (and `average`, dividing reduced gradients by the replicas) |
| `topk` | optional `{"<density>": {intercept_s, per_element_s}}`: error feedback and top-k selection over n gradient elements |
| `p2p` | `ALPHA_BETA` of one message between two ranks, plus optional `send_overhead_s` and `receive_overhead_s` (LogP's o, on the ranks' threads); null when `world_size` is 1 |
| `allreduce`, `allgather` | `{"<group size>": ALPHA_BETA}`; allgather's size is what each rank contributes |
| `compute_slowdown` | `{"<k>": factor}`: a pass with k ranks computing at once over one rank alone |
| `shared_processors` | optional: the ranks share one host's processors (a CPU host): `{parallelism, measured_ranks, wakeup_s, compute_slowdown_while, comm_slowdown_while_computing}`, see `SharedProcessors` |
| `fsdp` | optional `{collective_overhead_s, per_tensor_s, layer_tensors}`: FSDP2's host work per all-gather or reduce-scatter beyond the collective, a + b x the unit's parameter tensors (`validator.fsdp_bench`; per layer its tensors), charged with each of its copy passes |
| `provenance` | optional free-form object: time, torch version, settings and notes |

* `LAYER_FIT`: a pass on b samples takes `intercept_s + per_sample_s x b` (least squares over the
  calibrated batch sizes; the last layer includes the loss). `PARAM_FIT` likewise with
  `per_param_s`. Every compute fit was timed with `world_size` ranks computing at once;
  `compute_slowdown` rescales it to any other number (`simulator.profile_costs`).
* `ALPHA_BETA`: `{latency_s, bandwidth_bytes_per_s}`; S bytes take `latency_s + S / bandwidth`
  (Hockney's model). For an allreduce it is the algorithm bandwidth: no 2(p-1)/p on top.

A kernel profile (`"kind": "kernel"`, written by `ghpsim fit`) holds instead the fitted physical
parameters of the GPU kernel model for one architecture: `{format, kind, architecture,
parameters: {name: value}, fit: {...}, provenance}`; `parameters` replace the catalogue's values
of `simulator.kernel_catalogue.KernelParameters` for GPUs of that architecture, and `fit` records the
held-out error and each parameter's spread over the folds.

A kernel profile from `ghpsim calibrate --kernels` (`validator.kernel_bench`) carries the same
`parameters`, derived from microbenchmarks on one GPU (its `provenance` says how), and the
measurements themselves in the optional `measured`: `{device, gpu, peak_flops_per_s,
memory_bandwidth_bytes_per_s, gemm: [GEMM], misaligned_gemm: [GEMM], memory: [STREAM], launch:
{kernel_s, host_issue_s}}`.
`gpu` names the catalogue entry whose datasheet figures the efficiencies divide by.
* `GEMM`: `{dtype, m, n, k, time_s, achieved_flops_per_s, efficiency, tile_efficiency}`: C[m, n] =
  A[m, k] B[k, n] timed back to back; `efficiency` = 2mnk / time_s / datasheet peak;
  `tile_efficiency` = the efficiency with which the tile / wave model
  (`simulator.kernel_costs.tiled_compute_s`) takes time_s less the launch overhead. Per dtype the
  rows form a full grid over the m, n and k values measured; `misaligned_gemm` holds a few shapes
  with an odd n or k (no grid), behind the `misaligned_gemm_efficiency` parameter.
* `STREAM`: `{size_bytes, time_s, bandwidth_bytes_per_s, efficiency}`: a memory-bound kernel moving
  size_bytes (read + written); `efficiency` = size_bytes / ((time_s - launch) x datasheet bandwidth).
`simulator.kernel_tables.MeasuredTables` interpolates both tables in place of the ceilings.
"""

from __future__ import annotations

from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from simulator.errors import ScenarioError
from simulator.kernel_catalogue import MAX_HOST_OVERHEAD_S
from simulator.yaml_loading import load_json_text

FORMAT = "ghpsim-profile/2"
WEIGHT_PASS_NAMES = ("stash", "predict", "repredict", "accumulate", "average")


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _numbers_are_numbers(cls, value, info):
        """A JSON number where a number is expected: text or true / false is refused (pydantic's lax
        mode reads "2" as 2 and true as 1), as the scenario loader refuses them."""
        if isinstance(value, (str, bool)) and _numeric(cls.model_fields[info.field_name].annotation):
            raise ValueError(f"expected a number, got {value!r}")
        return value


def _numeric(annotation) -> bool:
    """Whether a field's type is int or float, or either or None."""
    options = get_args(annotation) if get_origin(annotation) in (Union, UnionType) else (annotation,)
    return any(option in (int, float) for option in options) and all(option in (int, float, type(None)) for option in options)


class LayerFit(_Frozen):
    intercept_s: float = Field(ge=0)
    per_sample_s: float = Field(ge=0)

    def at(self, batch: float) -> float:
        return self.intercept_s + self.per_sample_s * batch


class ParamFit(_Frozen):
    intercept_s: float = Field(ge=0)
    per_param_s: float = Field(ge=0)

    def at(self, num_params: float) -> float:
        return self.intercept_s + self.per_param_s * num_params


class OptimizerFit(ParamFit):
    name: Literal["sgd", "momentum", "adam"]


class ElementFit(_Frozen):
    intercept_s: float = Field(ge=0)
    per_element_s: float = Field(ge=0)

    def at(self, num_elements: float) -> float:
        return self.intercept_s + self.per_element_s * num_elements


class AlphaBeta(_Frozen):
    latency_s: float = Field(ge=0)
    bandwidth_bytes_per_s: float = Field(gt=0)

    def time_s(self, size_bytes: float) -> float:
        """Hockney's alpha-beta model: latency + size / bandwidth."""
        return self.latency_s + size_bytes / self.bandwidth_bytes_per_s


class P2PFit(AlphaBeta):
    """One message between two ranks: Hockney's time on the wire plus LogP's per-message overheads
    o_s and o_r (Culler et al., "LogP", PPoPP 1993): the time the sending and the receiving rank's
    thread spend posting and completing it (`isend` and `wait`), during which it computes nothing."""

    send_overhead_s: float = Field(default=0.0, ge=0)
    receive_overhead_s: float = Field(default=0.0, ge=0)


class FsdpFit(_Frozen):
    """FSDP2's host work per all-gather or reduce-scatter beyond the bare collective,
    `collective_overhead_s + per_tensor_s x` the unit's parameter tensors (`layer_tensors`, per
    layer), from `validator.fsdp_bench`: charged with each of its copy passes (`simulator.strategies.zero`)."""

    collective_overhead_s: float = Field(ge=0)
    per_tensor_s: float = Field(default=0.0, ge=0)
    layer_tensors: tuple[int, ...] = ()

    def host_s(self, layers: tuple[int, int] | None) -> float:
        """The work beside one collective of the unit of `layers` (first, end)."""
        tensors = sum(self.layer_tensors[slice(*layers)]) if layers is not None else 0
        return self.collective_overhead_s + self.per_tensor_s * tensors


class LayerProfile(_Frozen):
    name: str
    forward: LayerFit
    backward: LayerFit


class Device(_Frozen):
    kind: Literal["cpu", "cuda"]
    name: str
    num_threads: int = Field(ge=1)


class ProfiledModel(_Frozen):
    name: str
    params: dict[str, Any] = {}
    layer_names: tuple[str, ...]
    num_params: int | None = Field(default=None, ge=0)
    forward_flops_per_sample: float | None = Field(default=None, ge=0)


class SharedProcessors(_Frozen):
    """Ranks that share one host's processors (processes on a CPU host's cores).

    `parallelism` P: how many ranks compute at full speed at once; n computing threads each run
    at min(1, P / n) (processor sharing, Kleinrock, Queueing Systems vol. 2, 1976, ch. 4).
    Calibration takes P = W / compute_slowdown[W]. With all `measured_ranks` ranks computing while
    all of them communicate (`collective`, `p2p`), compute ran `compute_slowdown_while[c]` times
    and communication `comm_slowdown_while_computing[c]` times slower than each alone; with a share
    x of the other class's threads active the slowdown is 1 + (s - 1) x min(1, x), a linear
    interpolation between the two measured points (`simulator.host_sharing`). A message that
    arrives for a rank while its host's processors compute reaches it `wakeup_s` later: the
    receiving thread waits to be scheduled (measured in a chain of ranks that compute between
    messages: the mean delivery delay, less the idle point-to-point fit and the sender's o_s)."""

    parallelism: float = Field(gt=0)
    measured_ranks: int = Field(ge=1)
    wakeup_s: float = Field(default=0.0, ge=0)
    compute_slowdown_while: dict[Literal["collective", "p2p"], float] = {}
    comm_slowdown_while_computing: dict[Literal["collective", "p2p"], float] = {}

    @field_validator("compute_slowdown_while", "comm_slowdown_while_computing")
    @classmethod
    def _positive(cls, value: dict) -> dict:
        for key, factor in value.items():
            if not factor > 0:
                raise ValueError(f"{key}: expected a factor > 0, got {factor!r}")
        return value


class Profile(_Frozen):
    """A calibration profile (module docstring)."""

    format: Literal["ghpsim-profile/2"]
    device: Device
    backend: Literal["gloo", "nccl"]
    world_size: int = Field(ge=1)
    model: ProfiledModel
    layers: tuple[LayerProfile, ...] = Field(min_length=1)
    optimizer: OptimizerFit
    weight_passes: dict[Literal["stash", "predict", "repredict", "accumulate", "average"], ParamFit] = {}
    topk: dict[float, ElementFit] = {}
    p2p: P2PFit | None = None
    allreduce: dict[int, AlphaBeta] = {}
    allgather: dict[int, AlphaBeta] = {}
    compute_slowdown: dict[int, float] = {1: 1.0}
    shared_processors: SharedProcessors | None = None
    fsdp: FsdpFit | None = None
    provenance: dict[str, Any] = {}
    source: str = Field(default="<profile>", exclude=True)

    @model_validator(mode="after")
    def _consistent(self) -> "Profile":
        if len(self.layers) != len(self.model.layer_names):
            raise ValueError(f"layers: {len(self.layers)} entries but model.layer_names has "
                             f"{len(self.model.layer_names)}")
        if self.fsdp is not None and self.fsdp.layer_tensors and len(self.fsdp.layer_tensors) != len(self.layers):
            raise ValueError(f"fsdp.layer_tensors: {len(self.fsdp.layer_tensors)} entries but {len(self.layers)} layers")
        if self.world_size > 1 and self.p2p is None:
            raise ValueError(f"p2p: required when world_size is {self.world_size} > 1")
        if self.world_size > 1 and not self.allreduce:
            raise ValueError(f"allreduce: no group size profiled (world_size is {self.world_size})")
        for size in (*self.allreduce, *self.allgather):
            if size < 2:
                raise ValueError(f"allreduce/allgather: group size {size} (expected >= 2)")
        for density in self.topk:
            if not 0 < density <= 1:
                raise ValueError(f"topk: density {density} (expected in (0, 1])")
        for ranks, factor in self.compute_slowdown.items():
            if ranks < 1 or not factor > 0:
                raise ValueError(f"compute_slowdown: {ranks}: {factor} (expected ranks >= 1 and a factor > 0)")
        return self

    @property
    def num_layers(self) -> int:
        return len(self.layers)


class GemmMeasurement(_Frozen):
    """One GEMM shape timed by `ghpsim calibrate --kernels` (module docstring)."""

    dtype: Literal["fp32", "tf32", "fp16", "bf16"]
    m: int = Field(ge=1)
    n: int = Field(ge=1)
    k: int = Field(ge=1)
    time_s: float = Field(gt=0)
    achieved_flops_per_s: float = Field(gt=0)
    efficiency: float = Field(gt=0)
    tile_efficiency: float = Field(gt=0)


class StreamMeasurement(_Frozen):
    """One memory-bound kernel size timed by `ghpsim calibrate --kernels` (module docstring)."""

    size_bytes: float = Field(gt=0)
    time_s: float = Field(gt=0)
    bandwidth_bytes_per_s: float = Field(gt=0)
    efficiency: float = Field(gt=0)


class LaunchMeasurement(_Frozen):
    kernel_s: float = Field(ge=0)
    """GPU time of a tiny kernel queued back to back (CPU: one tiny operator's time)."""
    host_issue_s: float = Field(ge=0)
    """Host time to issue one tiny operator asynchronously (CPU: 0, operators run synchronously)."""


class FrameworkMeasurement(_Frozen):
    """A tiny eager training step on the device (`validator.kernel_bench.bench_framework_host`)."""

    step_s: float = Field(gt=0)
    kernels: int = Field(ge=1)
    gpu_busy_s: float = Field(ge=0)


class KernelMeasurements(_Frozen):
    device: Device
    gpu: str
    peak_flops_per_s: dict[str, float]
    memory_bandwidth_bytes_per_s: float = Field(gt=0)
    gemm: tuple[GemmMeasurement, ...] = ()
    misaligned_gemm: tuple[GemmMeasurement, ...] = ()
    """Shapes whose leading dimensions miss 16 bytes (not part of the grid)."""
    memory: tuple[StreamMeasurement, ...] = ()
    launch: LaunchMeasurement
    framework: FrameworkMeasurement | None = None

    @model_validator(mode="after")
    def _grids(self) -> "KernelMeasurements":
        for dtype in {row.dtype for row in self.gemm}:
            rows = [row for row in self.gemm if row.dtype == dtype]
            shapes = {(row.m, row.n, row.k) for row in rows}
            grid = len({row.m for row in rows}) * len({row.n for row in rows}) * len({row.k for row in rows})
            if len(shapes) != len(rows) or len(shapes) != grid:
                raise ValueError(f"gemm: the {dtype} rows are not one full grid of distinct (m, n, k) shapes")
        if self.memory and len({row.size_bytes for row in self.memory}) != len(self.memory):
            raise ValueError("memory: sizes repeat")
        return self


class KernelProfile(_Frozen):
    """Fitted or measured parameters of the kernel model (module docstring)."""

    format: Literal["ghpsim-profile/2"]
    kind: Literal["kernel"]
    architecture: str
    parameters: dict[Literal["gemm_efficiency", "flash_attention_efficiency", "memory_efficiency",
                             "launch_overhead_s", "host_overhead_s", "misaligned_gemm_efficiency"], float]
    fit: dict[str, Any] = {}
    measured: KernelMeasurements | None = None
    provenance: dict[str, Any] = {}
    source: str = Field(default="<profile>", exclude=True)

    @model_validator(mode="after")
    def _parameters_in_range(self) -> "KernelProfile":
        """The bounds `KernelParameters` holds, checked here so a bad file is refused on loading:
        efficiencies in (0, 1], overheads from 0 to `costs.host_overhead_s`'s bound."""
        for name, value in self.parameters.items():
            if name.endswith("_efficiency") and not 0 < value <= 1:
                raise ValueError(f"parameters.{name}: {value!r} must be in (0, 1]")
            if name.endswith("_overhead_s") and not 0 <= value <= MAX_HOST_OVERHEAD_S:
                raise ValueError(f"parameters.{name}: {value!r} must be from 0 to {MAX_HOST_OVERHEAD_S:g} s "
                                 "(the bound of costs.host_overhead_s)")
        return self


def load_profile(path: str | Path) -> Profile | KernelProfile:
    """Read and validate a profile; a one-line ScenarioError naming the file and the
    field for a missing, unreadable, malformed, old or foreign file."""
    path = Path(path)
    if not path.is_file():
        problem = ("is a directory, not a profile" if path.is_dir() else
                   "is not a regular file" if path.exists() else "profile not found")
        raise ScenarioError(f"{path}: {problem}")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise ScenarioError(f"{path}: cannot read the profile: {error}") from None
    document = load_json_text(text, str(path), malformed="not a JSON profile")
    return profile_from_dict(document, str(path))


def _format_version(name: str) -> int:
    """The number of a "ghpsim-profile/N" name (-1 when it has none)."""
    tail = name.rpartition("/")[2]
    return int(tail) if tail.isdigit() and len(tail) < 6 else -1


def profile_from_dict(document: Any, source: str = "<profile>") -> Profile | KernelProfile:
    """Validate a profile document already parsed from JSON (see `load_profile`)."""
    if not isinstance(document, dict):
        raise ScenarioError(f"{source}: format: expected a JSON object with format {FORMAT!r}")
    found = document.get("format")
    if found != FORMAT:
        if isinstance(found, str) and found.startswith("ghpsim-profile/"):
            age = "a newer" if _format_version(found) > _format_version(FORMAT) else "an older"
            raise ScenarioError(f"{source}: format: {found[:40]!r} is {age} profile format; this ghpsim reads "
                                f"{FORMAT!r}: calibrate again with `ghpsim calibrate`"
                                + (" or update ghpsim" if age == "a newer" else ""))
        raise ScenarioError(f"{source}: format: expected {FORMAT!r}, got {str(found)[:60]!r} "
                            "(not a ghpsim calibration profile)")
    model = KernelProfile if document.get("kind") == "kernel" else Profile
    try:
        return model.model_validate({**document, "source": source})
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        if not where and first["msg"].startswith("Value error, "):  # a whole-profile check names its field
            raise ScenarioError(f"{source}: {first['msg'].removeprefix('Value error, ')}"[:300]) from None
        raise ScenarioError(f"{source}: {where or 'profile'}: {first['msg'].removeprefix('Value error, ')}"[:300]) from None


def profile_document(profile: Profile | KernelProfile) -> dict:
    """The JSON-ready document of `profile` (what `ghpsim calibrate` writes)."""
    return profile.model_dump(mode="json", exclude_none=True)
