"""Hardware catalogue: GPU and link presets with their datasheet sources.

A scenario names a preset ("A100-80GB", "ib-hdr") or gives an inline spec with the same fields.
All figures are SI: FLOP/s, bytes, bytes/s, seconds. Bandwidths are per direction, per device
port (a link is full duplex: the engine models each direction separately).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from simulator.units import parse_quantity


def _quantity(kind: str):
    return BeforeValidator(lambda value: parse_quantity(value, kind))


Seconds = Annotated[float, _quantity("s"), Field(ge=0)]
Bytes = Annotated[float, _quantity("bytes"), Field(gt=0)]
BytesPerSecond = Annotated[float, _quantity("bytes_per_s"), Field(gt=0)]
FlopsPerSecond = Annotated[float, _quantity("flops_per_s"), Field(gt=0)]


class GpuSpec(BaseModel):
    """A compute device: dense peak FLOP/s per dtype, memory capacity and bandwidth."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "custom"
    peak_flops_per_s: dict[str, FlopsPerSecond]
    memory_bytes: Bytes
    memory_bandwidth_bytes_per_s: BytesPerSecond
    source: str = "user supplied"

    def peak_for(self, dtype: str) -> float:
        """Dense peak for a dtype; falls back fp16<->bf16 and tf32->fp32 where a sheet lists one."""
        for candidate in (dtype, *_DTYPE_FALLBACK.get(dtype, ())):
            if candidate in self.peak_flops_per_s:
                return self.peak_flops_per_s[candidate]
        raise KeyError(dtype)


_DTYPE_FALLBACK = {"bf16": ("fp16",), "fp16": ("bf16",), "tf32": ("fp32",), "fp8": ("fp16", "bf16")}


class LinkSpec(BaseModel):
    """A link tier: one-way latency (alpha) and per-direction bandwidth (1/beta)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "custom"
    latency_s: Seconds
    bandwidth_bytes_per_s: BytesPerSecond
    source: str = "user supplied"


# ---------------------------------------------------------------------------------------------
# Catalogue conventions
#
# * Peak FLOP/s are DENSE (no 2:4 structured sparsity): NVIDIA datasheets for A100/H100/H200
#   print the sparse figure with an asterisk; those are halved here.
# * fp16 / bf16 / tf32 / fp8 use the tensor-core rate wherever the part has tensor cores.
# * Memory bandwidth "GB/s" / "TB/s" in datasheets is decimal (1e9 / 1e12 bytes/s).
# * Memory capacity: a datasheet's "32 GB" of HBM (or GDDR) is 32 GiB in practice (e.g. an
#   A100-40GB reports 40960 MiB), so capacities use GiB. H100 (~79.6 GiB usable) and H200
#   (~140 GiB usable) report slightly less than the nominal figure; the nominal is kept.
# * Link bandwidth is per direction, per device port; latency is one-way, end to end for the
#   tier. Bandwidths are theoretical line rates; latencies are typical measured values.
# ---------------------------------------------------------------------------------------------

GB = 1e9
GiB = 2**30
TFLOPS = 1e12
GFLOPS = 1e9
us = 1e-6

GPUS: dict[str, GpuSpec] = {
    # Tesla V100 datasheet, SXM2: 15.7 TFLOP/s fp32, 125 TFLOP/s tensor (fp16), 900 GB/s HBM2.
    "V100": GpuSpec(
        name="V100",
        peak_flops_per_s={"fp32": 15.7 * TFLOPS, "fp16": 125 * TFLOPS},
        memory_bytes=32 * GiB,
        memory_bandwidth_bytes_per_s=900 * GB,
        source="NVIDIA Tesla V100 datasheet, SXM2 32GB (datasheet figures; fp16 = tensor core)",
    ),
    # Same SXM2 part with 16 GB HBM2: compute and bandwidth identical to the 32 GB SKU.
    "V100-16GB": GpuSpec(
        name="V100-16GB",
        peak_flops_per_s={"fp32": 15.7 * TFLOPS, "fp16": 125 * TFLOPS},
        memory_bytes=16 * GiB,
        memory_bandwidth_bytes_per_s=900 * GB,
        source="NVIDIA Tesla V100 datasheet, SXM2 16GB (datasheet figures; fp16 = tensor core)",
    ),
    # A100 datasheet, SXM 40GB: 19.5 fp32, 156 tf32, 312 fp16/bf16 (dense), 1555 GB/s HBM2.
    "A100-40GB": GpuSpec(
        name="A100-40GB",
        peak_flops_per_s={
            "fp32": 19.5 * TFLOPS,
            "tf32": 156 * TFLOPS,
            "fp16": 312 * TFLOPS,
            "bf16": 312 * TFLOPS,
        },
        memory_bytes=40 * GiB,
        memory_bandwidth_bytes_per_s=1555 * GB,
        source="NVIDIA A100 Tensor Core GPU datasheet, SXM4 40GB (datasheet figures, dense)",
    ),
    # A100 datasheet, SXM 80GB: same compute as 40GB, 2039 GB/s HBM2e.
    "A100-80GB": GpuSpec(
        name="A100-80GB",
        peak_flops_per_s={
            "fp32": 19.5 * TFLOPS,
            "tf32": 156 * TFLOPS,
            "fp16": 312 * TFLOPS,
            "bf16": 312 * TFLOPS,
        },
        memory_bytes=80 * GiB,
        memory_bandwidth_bytes_per_s=2039 * GB,
        source="NVIDIA A100 Tensor Core GPU datasheet, SXM4 80GB (datasheet figures, dense)",
    ),
    # H100 datasheet, SXM5: 67 fp32; sparse tf32 989 / fp16,bf16 1979 / fp8 3958 -> halved
    # to dense 494.5 / 989.5 / 1979; 3.35 TB/s HBM3.
    "H100-SXM": GpuSpec(
        name="H100-SXM",
        peak_flops_per_s={
            "fp32": 67 * TFLOPS,
            "tf32": 494.5 * TFLOPS,
            "fp16": 989.5 * TFLOPS,
            "bf16": 989.5 * TFLOPS,
            "fp8": 1979 * TFLOPS,
        },
        memory_bytes=80 * GiB,
        memory_bandwidth_bytes_per_s=3350 * GB,
        source="NVIDIA H100 Tensor Core GPU datasheet, SXM5 80GB (datasheet sparse figures halved to dense)",
    ),
    # H200 datasheet, SXM: same Hopper compute as H100 SXM; 141 GB HBM3e at 4.8 TB/s.
    "H200": GpuSpec(
        name="H200",
        peak_flops_per_s={
            "fp32": 67 * TFLOPS,
            "tf32": 494.5 * TFLOPS,
            "fp16": 989.5 * TFLOPS,
            "bf16": 989.5 * TFLOPS,
            "fp8": 1979 * TFLOPS,
        },
        memory_bytes=141 * GiB,
        memory_bandwidth_bytes_per_s=4800 * GB,
        source="NVIDIA H200 Tensor Core GPU datasheet, SXM 141GB (datasheet sparse figures halved to dense)",
    ),
    # GeForce GTX 1080 Ti spec (Pascal GP102, no tensor cores): 3584 cores x 2 x 1582 MHz boost
    # = 11.34 TFLOP/s fp32; native fp16 runs at 1/64 of fp32; 11 GB GDDR5X at 484 GB/s.
    "GTX-1080Ti": GpuSpec(
        name="GTX-1080Ti",
        peak_flops_per_s={"fp32": 11.34 * TFLOPS, "fp16": 11.34 * TFLOPS / 64},
        memory_bytes=11 * GiB,
        memory_bandwidth_bytes_per_s=484 * GB,
        source="NVIDIA GeForce GTX 1080 Ti spec (reference boost clock); fp16 = 1/64 of fp32 (GP102)",
    ),
    # Turing whitepaper, RTX 2080 Ti reference (1545 MHz boost): 13.4 TFLOP/s fp32; fp16 tensor
    # 107.6 TFLOP/s with fp16 accumulate but 53.8 with fp32 accumulate (GeForce runs it at
    # half rate); training accumulates in fp32, so 53.8 is used. 11 GB GDDR6 at 616 GB/s.
    "RTX-2080Ti": GpuSpec(
        name="RTX-2080Ti",
        peak_flops_per_s={"fp32": 13.4 * TFLOPS, "fp16": 53.8 * TFLOPS},
        memory_bytes=11 * GiB,
        memory_bandwidth_bytes_per_s=616 * GB,
        source="NVIDIA Turing architecture whitepaper, RTX 2080 Ti reference clocks; "
        "fp16 = tensor core with fp32 accumulate (half the fp16-accumulate rate)",
    ),
    # Nominal placeholder: generic 2-core AVX2-FMA x86 server CPU, 2 cores x ~2.5 GHz x
    # 32 FLOP/cycle (2 FMA units x 8 fp32 lanes x 2) = 160 GFLOP/s fp32; no native fp16/bf16
    # arithmetic, so those are taken at the fp32 rate (an upper bound). Calibration replaces it.
    "cpu": GpuSpec(
        name="cpu",
        peak_flops_per_s={"fp32": 160 * GFLOPS, "fp16": 160 * GFLOPS, "bf16": 160 * GFLOPS},
        memory_bytes=24 * GiB,
        memory_bandwidth_bytes_per_s=20 * GB,
        source="nominal placeholder: generic 2-core AVX2 x86 server CPU (2 x 2.5 GHz x 32 FLOP/cycle); "
        "replace by calibration",
    ),
}

LINKS: dict[str, LinkSpec] = {
    # NVLink 2 on V100 SXM2: 6 links x 25 GB/s per direction = 150 GB/s (300 GB/s bidirectional).
    "nvlink2-v100": LinkSpec(
        name="nvlink2-v100",
        latency_s=2 * us,
        bandwidth_bytes_per_s=150 * GB,
        source="NVIDIA Tesla V100 datasheet: NVLink 2, 6 x 25 GB/s per direction (datasheet); "
        "latency typical measured NCCL-level p2p",
    ),
    # NVLink 3 on A100 SXM4: 12 links x 25 GB/s per direction = 300 GB/s (600 GB/s bidirectional).
    "nvlink3-a100": LinkSpec(
        name="nvlink3-a100",
        latency_s=2 * us,
        bandwidth_bytes_per_s=300 * GB,
        source="NVIDIA A100 datasheet: NVLink 3, 12 x 25 GB/s per direction (datasheet); "
        "latency typical measured NCCL-level p2p",
    ),
    # NVLink 4 on H100/H200 SXM5: 18 links x 25 GB/s per direction = 450 GB/s (900 bidirectional).
    "nvlink4-h100": LinkSpec(
        name="nvlink4-h100",
        latency_s=2 * us,
        bandwidth_bytes_per_s=450 * GB,
        source="NVIDIA H100 datasheet: NVLink 4, 18 x 25 GB/s per direction (datasheet); "
        "latency typical measured NCCL-level p2p",
    ),
    # PCIe 3.0 x16: 8 GT/s x 16 lanes x 128/130 encoding / 8 = 15.75 GB/s per direction.
    "pcie3": LinkSpec(
        name="pcie3",
        latency_s=3 * us,
        bandwidth_bytes_per_s=15.75 * GB,
        source="PCI Express 3.0 spec, x16 with GPU peer-to-peer: 15.75 GB/s theoretical per direction; "
        "latency typical measured NCCL-level p2p",
    ),
    # Modelling assumption: without P2P the copy is staged through host memory (two hops), so
    # half the pcie3 bandwidth and twice its latency.
    "pcie3-no-p2p": LinkSpec(
        name="pcie3-no-p2p",
        latency_s=6 * us,
        bandwidth_bytes_per_s=15.75 * GB / 2,
        source="PCI Express 3.0 x16 without peer-to-peer (staged via host memory): modelling "
        "assumption of half pcie3 bandwidth and twice its latency",
    ),
    # PCIe 4.0 x16: 16 GT/s x 16 lanes x 128/130 / 8 = 31.5 GB/s per direction.
    "pcie4": LinkSpec(
        name="pcie4",
        latency_s=3 * us,
        bandwidth_bytes_per_s=31.5 * GB,
        source="PCI Express 4.0 spec, x16 with GPU peer-to-peer: 31.5 GB/s theoretical per direction; "
        "latency typical measured NCCL-level p2p",
    ),
    # Modelling assumption, as for pcie3-no-p2p.
    "pcie4-no-p2p": LinkSpec(
        name="pcie4-no-p2p",
        latency_s=6 * us,
        bandwidth_bytes_per_s=31.5 * GB / 2,
        source="PCI Express 4.0 x16 without peer-to-peer (staged via host memory): modelling "
        "assumption of half pcie4 bandwidth and twice its latency",
    ),
    # InfiniBand EDR: 4x 25 Gb/s lanes = 100 Gb/s = 12.5 GB/s per direction.
    "ib-edr": LinkSpec(
        name="ib-edr",
        latency_s=1.5 * us,
        bandwidth_bytes_per_s=12.5 * GB,
        source="InfiniBand EDR 100 Gb/s (4x 25 Gb/s lanes), line rate; latency typical measured "
        "(verbs/MPI level)",
    ),
    # InfiniBand HDR: 4x 50 Gb/s lanes = 200 Gb/s = 25 GB/s per direction.
    "ib-hdr": LinkSpec(
        name="ib-hdr",
        latency_s=1.5 * us,
        bandwidth_bytes_per_s=25 * GB,
        source="InfiniBand HDR 200 Gb/s (4x 50 Gb/s lanes), line rate; latency typical measured "
        "(verbs/MPI level)",
    ),
    # InfiniBand NDR: 4x 100 Gb/s lanes = 400 Gb/s = 50 GB/s per direction.
    "ib-ndr": LinkSpec(
        name="ib-ndr",
        latency_s=1.5 * us,
        bandwidth_bytes_per_s=50 * GB,
        source="InfiniBand NDR 400 Gb/s (4x 100 Gb/s lanes), line rate; latency typical measured "
        "(verbs/MPI level)",
    ),
    # Ethernet: bandwidth = line rate / 8; latency dominated by the kernel TCP/IP stack.
    "10gbe": LinkSpec(
        name="10gbe",
        latency_s=20 * us,
        bandwidth_bytes_per_s=10 * GB / 8,
        source="10 Gigabit Ethernet, line rate / 8; latency typical measured TCP/IP (10-30 us)",
    ),
    "25gbe": LinkSpec(
        name="25gbe",
        latency_s=20 * us,
        bandwidth_bytes_per_s=25 * GB / 8,
        source="25 Gigabit Ethernet, line rate / 8; latency typical measured TCP/IP (10-30 us)",
    ),
    "100gbe": LinkSpec(
        name="100gbe",
        latency_s=20 * us,
        bandwidth_bytes_per_s=100 * GB / 8,
        source="100 Gigabit Ethernet, line rate / 8; latency typical measured TCP/IP (10-30 us)",
    ),
    # Nominal placeholder: shared-memory transport between processes on one host.
    "loopback": LinkSpec(
        name="loopback",
        latency_s=5 * us,
        bandwidth_bytes_per_s=5 * GB,
        source="nominal placeholder: intra-host shared-memory transport; replace by calibration",
    ),
}


def _lookup(value: str, catalogue: Mapping[str, object], what: str):
    by_lower = {key.lower(): key for key in catalogue}
    key = by_lower.get(value.strip().lower())
    if key is not None:
        return catalogue[key]
    near = difflib.get_close_matches(value.strip().lower(), list(by_lower), n=3, cutoff=0.6)
    names = [by_lower[n] for n in near] or list(catalogue)
    raise ValueError(f"unknown {what} preset {value!r}; nearest: {', '.join(names)}")


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
