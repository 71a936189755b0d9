"""Hardware catalogue: the GPU and link spec models, and their presets with datasheet sources.

The presets are data, loaded once at import from simulator/data/gpus.yaml (GPUS) and
simulator/data/links.yaml (LINKS), in file order. A scenario names a preset ("A100-80GB", "ib-hdr")
or gives an inline spec with the same fields. All figures are SI: FLOP/s, bytes, bytes/s, seconds,
Hz. Bandwidths are per direction, per device port (a link is full duplex: the engine models each
direction separately).

Besides the figures the step-time model reads (dense peak FLOP/s per dtype, memory, latency and
bandwidth), a GPU records its architecture, SM (or CU) count, boost clock, L2 size and memory kind,
and a link its kind and whether its switch reduces in-network (NVLS), for kernel-level and
NCCL-style collective models. Those fields are optional: an inline spec without them stays valid.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources
from typing import Annotated, Literal, TypeVar

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from simulator.errors import nearest_names
from simulator.scenario_types import Bool, NoBool
from simulator.units import parse_quantity


def _quantity(kind: str):
    return BeforeValidator(lambda value: parse_quantity(value, kind))


Seconds = Annotated[float, _quantity("s"), Field(ge=0)]
Bytes = Annotated[float, _quantity("bytes"), Field(gt=0)]
BytesPerSecond = Annotated[float, _quantity("bytes_per_s"), Field(gt=0)]
FlopsPerSecond = Annotated[float, _quantity("flops_per_s"), Field(gt=0)]
Hertz = Annotated[float, NoBool, Field(gt=0, allow_inf_nan=False)]
Count = Annotated[int, NoBool, Field(gt=0)]

Architecture = Literal["pascal", "volta", "turing", "ampere", "ada", "hopper", "blackwell", "cdna2", "cdna3",
                       "cpu"]
MemoryKind = Literal["HBM2", "HBM2e", "HBM3", "HBM3e", "GDDR5", "GDDR5X", "GDDR6", "GDDR6X", "DDR4", "DDR5"]
PeakDtype = Literal["fp32", "tf32", "fp16", "bf16", "fp8"]
LinkKind = Literal["nvlink", "pcie", "infiniband", "roce", "ethernet", "host"]


class GpuSpec(BaseModel):
    """A compute device: dense peak FLOP/s per dtype, memory capacity and bandwidth, and (optional)
    the micro-architecture figures a kernel-level model needs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "custom"
    peak_flops_per_s: dict[PeakDtype, FlopsPerSecond]
    memory_bytes: Bytes
    memory_bandwidth_bytes_per_s: BytesPerSecond
    architecture: Architecture | None = None
    num_sms: Count | None = None
    """Streaming multiprocessors (NVIDIA) or compute units (AMD)."""
    boost_clock_hz: Hertz | None = None
    """Maximum boost clock. Hopper/Blackwell quote tensor-core peaks at a lower clock (see presets)."""
    l2_cache_bytes: Bytes | None = None
    memory_kind: MemoryKind | None = None
    source: str = "user supplied"

    def peak_for(self, dtype: str) -> float:
        """Dense peak for a dtype; falls back fp16 -> bf16, tf32 -> fp32 and fp8 -> fp16 / bf16 where a
        sheet lists one, never bf16 -> fp16: bf16 tensor cores came with Ampere, and a GPU before it
        (no bf16 figure) has no bf16 rate to borrow. A 16-bit rate below fp32's (GP102's native fp16 at
        1/64) gives way to fp32's: PyTorch multiplies 16-bit matrices with fp32 accumulation
        (`cublasGemmEx`, CUBLAS_COMPUTE_32F: aten/src/ATen/cuda/CUDABlas.cpp), which such a GPU runs
        on its fp32 units."""
        for candidate in (dtype, *_DTYPE_FALLBACK.get(dtype, ())):
            if candidate in self.peak_flops_per_s:
                peak = self.peak_flops_per_s[candidate]
                return max(peak, self.peak_flops_per_s.get("fp32", 0.0)) if dtype in ("fp16", "bf16") else peak
        raise KeyError(dtype)


_DTYPE_FALLBACK = {"fp16": ("bf16",), "tf32": ("fp32",), "fp8": ("fp16", "bf16")}


class LinkSpec(BaseModel):
    """A link tier: one-way latency (alpha), per-direction bandwidth (1/beta), and its kind.

    `kind` names the transport (NCCL's tables key on it: NVLink, PCIe, network); an inline spec
    without it is taken as "ethernet". `nvls` marks an NVSwitch fabric that reduces in the switch
    (NVLink SHARP, third-generation NVSwitch and later)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "custom"
    latency_s: Seconds
    bandwidth_bytes_per_s: BytesPerSecond
    kind: LinkKind = "ethernet"
    nvls: Bool = False
    source: str = "user supplied"

    @model_validator(mode="after")
    def _nvls_needs_nvlink(self) -> LinkSpec:
        if self.nvls and self.kind != "nvlink":
            raise ValueError(f"nvls: NVLink SHARP is an NVSwitch feature, so it needs kind 'nvlink', "
                             f"got kind {self.kind!r}")
        return self


SpecT = TypeVar("SpecT", GpuSpec, LinkSpec)

# ---------------------------------------------------------------------------------------------
# Catalogue conventions (the presets themselves are data: simulator/data/gpus.yaml and links.yaml,
# each entry with its datasheet source and, as a comment, the arithmetic behind its figures)
#
# * Peak FLOP/s are DENSE (no 2:4 structured sparsity): NVIDIA datasheets for A100/H100/H200,
#   L4, L40S and B200 print the sparse figure with an asterisk; those are halved here.
# * fp16 / bf16 / tf32 / fp8 use the tensor-core (AMD: matrix-core) rate wherever the part has
#   them. "fp32" is the plain IEEE fp32 GEMM peak: CUDA cores on NVIDIA, the FP32 matrix (MFMA)
#   rate on AMD CDNA. fp64 and int8 are not listed (no training dtype uses them).
# * Memory bandwidth "GB/s" / "TB/s" in datasheets is decimal (1e9 / 1e12 bytes/s).
# * Memory capacity: a datasheet's "32 GB" of HBM (or GDDR) is 32 GiB in practice (e.g. an
#   A100-40GB reports 40960 MiB), so capacities use GiB. H100 (~79.6 GiB usable) and H200
#   (~140 GiB usable) report slightly less than the nominal figure; the nominal is kept.
#   L2 sizes are binary too (A100 "40 MB" = 40960 KiB).
# * num_sms x per-SM rate x clock reproduces each peak; the per-SM dense rates (FMA per clock per
#   SM, 1 FMA = 2 FLOP) come from the architecture whitepapers: fp32 64 (Pascal GP100, Volta,
#   Turing, A100) or 128 (GP102, GA102, Ada, Hopper, Blackwell) lanes; fp16 tensor 512 (Volta,
#   Turing, GA102, Ada), 1024 (A100), 2048 (Hopper). The tests check this arithmetic.
# * Link bandwidth is per direction, per device port; latency is one-way, end to end for the
#   tier. Bandwidths are theoretical line (data) rates; latencies are typical measured values.
# ---------------------------------------------------------------------------------------------

CATALOGUE_FILES = {"GPUS": "data/gpus.yaml", "LINKS": "data/links.yaml"}  # inside the package


class HardwareCatalogueError(ValueError):
    """A malformed hardware data file; the message names the file and the preset."""


def _load_presets(text: str, spec_type: type[SpecT], filename: str) -> dict[str, SpecT]:
    """Validate one data file's text: a mapping of preset name -> spec fields, kept in file order."""
    where = f"simulator/{filename}"
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)  # node level: sees duplicate names
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise HardwareCatalogueError(f"{where}: not valid YAML: {exc}") from exc
    if not isinstance(document, dict) or not document:
        raise HardwareCatalogueError(f"{where}: expected a mapping of preset name to spec fields")
    names = [node.value for node, _ in root.value]
    if duplicates := sorted({name for name in names if names.count(name) > 1}):
        raise HardwareCatalogueError(f"{where}: preset {duplicates[0]!r} is defined more than once")
    presets: dict[str, SpecT] = {}
    for name, fields in document.items():
        if not isinstance(name, str):
            raise HardwareCatalogueError(f"{where}: preset name {name!r} is not a string (quote it)")
        if not isinstance(fields, dict):
            raise HardwareCatalogueError(f"{where}: preset {name!r}: expected a mapping of "
                                         f"{spec_type.__name__} fields, got {fields!r}")
        if fields.get("name", name) != name:
            raise HardwareCatalogueError(f"{where}: preset {name!r}: its key is its name, but it "
                                         f"says name {fields['name']!r}")
        try:
            presets[name] = spec_type.model_validate({**fields, "name": name})
        except ValidationError as exc:
            raise HardwareCatalogueError(f"{where}: preset {name!r} is malformed: {exc}") from exc
    return presets


def _read_presets(filename: str, spec_type: type[SpecT]) -> dict[str, SpecT]:
    text = resources.files("simulator").joinpath(filename).read_text(encoding="utf-8")
    return _load_presets(text, spec_type, filename)


GPUS: dict[str, GpuSpec] = _read_presets(CATALOGUE_FILES["GPUS"], GpuSpec)
LINKS: dict[str, LinkSpec] = _read_presets(CATALOGUE_FILES["LINKS"], LinkSpec)


def _lookup(value: str, catalogue: Mapping[str, object], what: str):
    by_lower = {key.lower(): key for key in catalogue}
    key = by_lower.get(value.strip().lower())
    if key is not None:
        return catalogue[key]
    names = nearest_names(value, catalogue)  # where none is near, all of them would not fit on one line
    hint = f"nearest: {', '.join(names)}" if names else f"`ghpsim list {what.lower()}s` lists them"
    raise ValueError(f"unknown {what} preset {value!r}; {hint}")


def resolve_gpu(value: str | Mapping | GpuSpec) -> GpuSpec:
    """A preset name (case-insensitive), an inline spec mapping, or a GpuSpec -> GpuSpec.

    Unknown names raise ValueError naming the nearest presets; a bad mapping raises pydantic's
    ValidationError (itself a ValueError).
    """
    if isinstance(value, GpuSpec):
        return value
    if isinstance(value, str):
        return _lookup(value, GPUS, "GPU")
    if isinstance(value, Mapping):
        return GpuSpec.model_validate(dict(value))
    raise ValueError(f"expected a GPU preset name or an inline spec mapping, got {value!r}")


def resolve_link(value: str | Mapping | LinkSpec) -> LinkSpec:
    """A preset name (case-insensitive), an inline spec mapping, or a LinkSpec -> LinkSpec."""
    if isinstance(value, LinkSpec):
        return value
    if isinstance(value, str):
        return _lookup(value, LINKS, "link")
    if isinstance(value, Mapping):
        return LinkSpec.model_validate(dict(value))
    raise ValueError(f"expected a link preset name or an inline spec mapping, got {value!r}")
