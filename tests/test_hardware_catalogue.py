"""The hardware catalogue as a specification: every preset sourced, the micro-architecture fields a
kernel-level model needs, the datasheet arithmetic (SMs x per-SM rate x clock = peak), and the
link kinds an NCCL-style collective model keys on."""

from __future__ import annotations

import re
from importlib import resources

import pytest
import yaml
from pydantic import ValidationError

from simulator import hardware
from simulator.hardware import GPUS, LINKS, GpuSpec, LinkSpec, resolve_gpu, resolve_link

GHZ = 1e9

NAMED_GPUS = ("P100-PCIe", "P100-SXM2", "P40", "T4", "V100-PCIe", "V100", "A10", "L4", "L40S",
              "A100-40GB", "A100-80GB", "A100-40GB-PCIe", "A100-80GB-PCIe", "H100-PCIe", "H100-SXM",
              "H200", "B200", "MI250X", "MI300X", "GTX-1080Ti", "RTX-2080Ti")
"""The GPU presets the catalogue issue names."""

PUBLISHED_SMS = {"A100-40GB": 108, "A100-80GB": 108, "A100-40GB-PCIe": 108, "A100-80GB-PCIe": 108,
                 "H100-SXM": 132, "H200": 132, "H100-PCIe": 114, "V100": 80, "V100-PCIe": 80,
                 "P100-PCIe": 56, "P100-SXM2": 56, "T4": 40, "A10": 72, "L4": 58, "L40S": 142, "B200": 148,
                 "MI250X": 220, "MI300X": 304}


# ----------------------------------------------------------------------------- every preset

@pytest.mark.parametrize("key", sorted(GPUS))
def test_every_gpu_preset_has_a_source(key):
    assert GPUS[key].source.strip() and GPUS[key].source != "user supplied"


@pytest.mark.parametrize("key", sorted(LINKS))
def test_every_link_preset_has_a_source_a_kind_and_a_bandwidth(key):
    link = LINKS[key]
    assert link.source.strip() and link.source != "user supplied"
    assert link.kind in ("nvlink", "pcie", "infiniband", "roce", "ethernet", "host")
    assert link.bandwidth_bytes_per_s > 0


@pytest.mark.parametrize("key", NAMED_GPUS)
def test_named_gpu_has_the_kernel_model_fields(key):
    gpu = GPUS[key]
    assert gpu.architecture is not None
    assert gpu.num_sms and gpu.num_sms > 0
    assert gpu.boost_clock_hz and 0.5 * GHZ < gpu.boost_clock_hz < 3 * GHZ
    assert gpu.memory_kind is not None


@pytest.mark.parametrize("key", NAMED_GPUS)
def test_tensor_core_parts_are_faster_in_half_precision(key):
    gpu = GPUS[key]
    if gpu.architecture == "pascal":  # no tensor cores: P100 fp16 = 2x fp32, GP102 fp16 = fp32 / 64
        return
    half = max(gpu.peak_flops_per_s.get("fp16", 0), gpu.peak_flops_per_s.get("bf16", 0))
    assert half >= gpu.peak_for("fp32")


@pytest.mark.parametrize("key, num_sms", sorted(PUBLISHED_SMS.items()))
def test_published_sm_counts(key, num_sms):
    assert GPUS[key].num_sms == num_sms


# ----------------------------------------------------------------------------- datasheet arithmetic

# (preset, dtype, dense FMA per clock per SM (CU), clock in Hz or None for the preset's boost clock,
#  tolerance). Per-SM rates: Volta whitepaper (8 tensor cores x 64 fp16 FMA), Turing whitepaper
# (8 x 64), A100 whitepaper (4 x 256 = 1024 dense fp16 FMA), GA102 and Ada whitepapers (4 x 128),
# H100 whitepaper (2048 dense fp16 FMA per SM, 2x A100 clock for clock); AMD CDNA2 whitepaper
# (1024 fp16 matrix FLOP per clock per CU = 512 FMA) and CDNA3 whitepaper (2048 FLOP = 1024 FMA).
# NVIDIA quotes Hopper tensor peaks at 1.83 GHz (SXM) / 1.62 GHz (PCIe), below the max boost clock
# its fp32 peak uses (1.98 / 1.755 GHz), so those two clocks are given explicitly.
TENSOR_ARITHMETIC = [
    ("V100", "fp16", 512, None, 0.01),
    ("T4", "fp16", 512, None, 0.01),
    ("A100-40GB", "fp16", 1024, None, 0.01),  # 108 x 1024 x 2 x 1.41 GHz = 311.9 TFLOP/s
    ("A100-80GB-PCIe", "bf16", 1024, None, 0.01),
    ("A10", "fp16", 512, None, 0.01),
    ("L4", "fp16", 512, None, 0.01),
    ("L40S", "bf16", 512, None, 0.01),
    ("H100-SXM", "fp16", 2048, 1.83 * GHZ, 0.02),  # 132 x 2048 x 2 x 1.83 GHz = 989.4 TFLOP/s
    ("H100-PCIe", "fp16", 2048, 1.62 * GHZ, 0.02),
    ("MI250X", "fp16", 512, None, 0.01),
    ("MI300X", "bf16", 1024, None, 0.01),
]


@pytest.mark.parametrize("key, dtype, fma_per_clock_per_sm, clock_hz, tolerance", TENSOR_ARITHMETIC)
def test_tensor_peak_is_sms_times_rate_times_clock(key, dtype, fma_per_clock_per_sm, clock_hz, tolerance):
    gpu = GPUS[key]
    clock_hz = clock_hz or gpu.boost_clock_hz
    assert gpu.num_sms * fma_per_clock_per_sm * 2 * clock_hz == pytest.approx(gpu.peak_for(dtype), rel=tolerance)


# fp32 FMA lanes per SM (CU): 64 on GP100, Volta, Turing and A100; 128 on GP102, GA102, Ada, Hopper
# and Blackwell (whitepapers; CUDA cores / SMs); AMD: FP32 matrix 256 FLOP/clk/CU on CDNA2 and
# CDNA3 (whitepapers). Every fp32 peak is at the boost clock.
FP32_LANES = {"P100-PCIe": 64, "P100-SXM2": 64, "P40": 128, "GTX-1080Ti": 128, "V100": 64, "V100-PCIe": 64,
              "T4": 64, "RTX-2080Ti": 64, "A100-40GB": 64, "A100-80GB-PCIe": 64, "A10": 128, "L4": 128,
              "L40S": 128, "H100-SXM": 128, "H100-PCIe": 128, "H200": 128, "B200": 128, "MI250X": 128,
              "MI300X": 128}


@pytest.mark.parametrize("key, lanes", sorted(FP32_LANES.items()))
def test_fp32_peak_is_sms_times_lanes_times_boost_clock(key, lanes):
    gpu = GPUS[key]
    assert gpu.num_sms * lanes * 2 * gpu.boost_clock_hz == pytest.approx(gpu.peak_for("fp32"), rel=0.01)


def test_sparse_figures_are_halved():
    # datasheets print these with sparsity: H100 PCIe 1513, L4 242, B200 4.5 PFLOP/s fp16
    assert GPUS["H100-PCIe"].peak_for("fp16") == pytest.approx(756.5e12)
    assert GPUS["L4"].peak_for("bf16") == pytest.approx(121e12)
    assert GPUS["L40S"].peak_for("fp8") == pytest.approx(733e12)
    assert GPUS["B200"].peak_for("fp16") == pytest.approx(2.25e15)
    assert GPUS["B200"].peak_for("fp8") == pytest.approx(4.5e15)
    assert GPUS["MI300X"].peak_for("fp16") == pytest.approx(1307.4e12)  # AMD prints dense as such


def test_a_16_bit_matmul_runs_no_slower_than_fp32():
    """GP102's native fp16 runs at 1/64 of fp32, but PyTorch multiplies 16-bit matrices with fp32
    accumulation, which such a GPU runs on its fp32 units: an fp16 step is not 64x an fp32 one."""
    from simulator import load_scenario, simulate
    for key in ("P40", "GTX-1080Ti"):
        assert GPUS[key].peak_flops_per_s["fp16"] < GPUS[key].peak_for("fp32") == GPUS[key].peak_for("fp16")
    assert GPUS["V100"].peak_for("fp16") == 125e12 and GPUS["P100-PCIe"].peak_for("fp16") == 18.7e12
    steps = {dtype: simulate(load_scenario({
        "name": "p40", "cluster": {"num_nodes": 1, "gpus_per_node": 1, "gpu": "P40"}, "model": {"name": "resnet50"},
        "strategy": {"kind": "dp"}, "training": {"global_batch_size": 32, "dtype": dtype}})).step_time_s
        for dtype in ("fp32", "fp16")}
    assert steps["fp16"] <= steps["fp32"]  # the same GEMM rate, half the bytes


def test_datasheet_memory_figures():
    assert GPUS["A100-80GB-PCIe"].memory_bandwidth_bytes_per_s == 1935e9
    assert GPUS["H100-PCIe"].memory_bandwidth_bytes_per_s == 2.0e12
    assert GPUS["MI300X"].memory_bytes == 192 * 2**30
    assert GPUS["T4"].memory_kind == "GDDR6" and GPUS["H200"].memory_kind == "HBM3e"
    assert GPUS["A100-40GB"].l2_cache_bytes == 40 * 2**20
    assert GPUS["H100-SXM"].l2_cache_bytes == 50 * 2**20


def test_a_mi250x_gcd_is_half_a_mi250x():
    package, gcd = GPUS["MI250X"], GPUS["MI250X-GCD"]
    assert gcd.num_sms * 2 == package.num_sms
    assert gcd.memory_bytes * 2 == package.memory_bytes
    assert gcd.memory_bandwidth_bytes_per_s * 2 == pytest.approx(package.memory_bandwidth_bytes_per_s)
    for dtype in package.peak_flops_per_s:
        assert gcd.peak_for(dtype) * 2 == pytest.approx(package.peak_for(dtype))


# ----------------------------------------------------------------------------- links

def test_link_line_rates():
    assert LINKS["ib-hdr"].bandwidth_bytes_per_s == 25e9  # 200 Gb/s data rate / 8
    assert LINKS["ib-xdr"].bandwidth_bytes_per_s == 100e9
    assert LINKS["nvlink4-h100"].bandwidth_bytes_per_s == 450e9
    assert LINKS["nvlink5-b200"].bandwidth_bytes_per_s == 18 * 50e9
    assert LINKS["nvlink1-p100"].bandwidth_bytes_per_s == 4 * 20e9
    assert LINKS["pcie5"].bandwidth_bytes_per_s == pytest.approx(32e9 * 16 * 128 / 130 / 8, rel=1e-3)
    for gbps in (25, 100, 200, 400):
        assert LINKS[f"roce-{gbps}g"].bandwidth_bytes_per_s == pytest.approx(gbps * 1e9 / 8)


@pytest.mark.parametrize("switch, nvlink", [("nvswitch1-v100", "nvlink2-v100"), ("nvswitch2-a100", "nvlink3-a100"),
                                            ("nvswitch3-h100", "nvlink4-h100"), ("nvswitch4-b200", "nvlink5-b200")])
def test_an_nvswitch_node_gives_each_gpu_its_nvlink_bandwidth(switch, nvlink):
    assert LINKS[switch].kind == LINKS[nvlink].kind == "nvlink"
    assert LINKS[switch].bandwidth_bytes_per_s == LINKS[nvlink].bandwidth_bytes_per_s


def test_nvls_only_on_third_generation_nvswitch_and_later():
    assert {key for key, link in LINKS.items() if link.nvls} == {"nvswitch3-h100", "nvswitch4-b200"}


def test_link_kinds():
    kinds = {key: link.kind for key, link in LINKS.items()}
    assert all(kinds[key] == "nvlink" for key in kinds if key.startswith(("nvlink", "nvswitch")))
    assert all(kinds[key] == "pcie" for key in kinds if key.startswith("pcie"))
    assert all(kinds[key] == "infiniband" for key in kinds if key.startswith("ib-"))
    assert all(kinds[key] == "roce" for key in kinds if key.startswith("roce-"))
    assert kinds["100gbe"] == "ethernet" and kinds["loopback"] == "host"


def test_roce_is_no_faster_to_start_than_infiniband():
    assert LINKS["roce-400g"].latency_s >= LINKS["ib-ndr"].latency_s


# ----------------------------------------------------------------------------- inline specs

def test_inline_specs_without_the_new_fields_still_validate():
    gpu = resolve_gpu({"peak_flops_per_s": {"fp32": "10 TFLOP/s"}, "memory_bytes": "16 GiB",
                       "memory_bandwidth_bytes_per_s": "500 GB/s"})
    assert (gpu.architecture, gpu.num_sms, gpu.boost_clock_hz, gpu.l2_cache_bytes, gpu.memory_kind) == (None,) * 5
    link = resolve_link({"latency_s": "5 us", "bandwidth_bytes_per_s": "16 GB/s"})
    assert link.kind == "ethernet" and link.nvls is False


def test_inline_specs_with_the_new_fields():
    gpu = resolve_gpu({"peak_flops_per_s": {"fp16": "312 TFLOP/s"}, "memory_bytes": "40 GiB",
                       "memory_bandwidth_bytes_per_s": "1555 GB/s", "architecture": "ampere", "num_sms": 108,
                       "boost_clock_hz": 1.41e9, "l2_cache_bytes": "40 MiB", "memory_kind": "HBM2"})
    assert gpu.l2_cache_bytes == 40 * 2**20 and gpu.num_sms == 108
    link = resolve_link({"latency_s": "2 us", "bandwidth_bytes_per_s": "450 GB/s", "kind": "nvlink", "nvls": True})
    assert link.nvls


@pytest.mark.parametrize("field, value", [("architecture", "maxwell2"), ("num_sms", 0), ("boost_clock_hz", -1),
                                          ("l2_cache_bytes", "0 MiB"), ("memory_kind", "HMB3")])
def test_bad_gpu_fields_rejected(field, value):
    base = {"peak_flops_per_s": {"fp32": 1e12}, "memory_bytes": "1 GiB", "memory_bandwidth_bytes_per_s": "1 TB/s"}
    with pytest.raises(ValidationError, match=field):
        resolve_gpu({**base, field: value})


def test_nvls_needs_an_nvlink_kind():
    with pytest.raises(ValidationError, match="nvls"):
        resolve_link({"latency_s": "2 us", "bandwidth_bytes_per_s": "50 GB/s", "kind": "infiniband", "nvls": True})
    with pytest.raises(ValidationError, match="kind"):
        resolve_link({"latency_s": "2 us", "bandwidth_bytes_per_s": "50 GB/s", "kind": "token-ring"})


@pytest.mark.parametrize("mode", ["python", "json"])
def test_every_preset_round_trips_through_its_dump(mode):
    """Resolved scenarios are dumped and re-read (compare, sweeps): a preset must survive it."""
    for gpu in GPUS.values():
        assert resolve_gpu(gpu.model_dump(mode=mode)) == gpu
    for link in LINKS.values():
        assert resolve_link(link.model_dump(mode=mode)) == link


# ----------------------------------------------------------------------------- the data files

DATA_FILES = [("GPUS", GpuSpec), ("LINKS", LinkSpec)]


def _data_text(catalogue: str) -> str:
    return resources.files("simulator").joinpath(hardware.CATALOGUE_FILES[catalogue]).read_text(encoding="utf-8")


@pytest.mark.parametrize("catalogue, spec_type", DATA_FILES)
def test_every_data_file_entry_validates_as_its_preset(catalogue, spec_type):
    loaded = getattr(hardware, catalogue)
    for name, fields in yaml.safe_load(_data_text(catalogue)).items():
        assert "name" not in fields  # the key is the name
        spec = spec_type.model_validate({**fields, "name": name})
        assert loaded[name] == spec and type(loaded[name]) is spec_type


@pytest.mark.parametrize("catalogue, spec_type", DATA_FILES)
def test_presets_load_in_file_order(catalogue, spec_type):
    # top-level keys read off the raw text, independently of the YAML parser
    in_file = re.findall(r"^([^\s#][^:]*):", _data_text(catalogue), flags=re.MULTILINE)
    assert list(getattr(hardware, catalogue)) == in_file
    assert all(isinstance(spec, spec_type) for spec in getattr(hardware, catalogue).values())


def test_every_gpu_entry_keeps_its_derivation_comment():
    """The comment above each GPU entry gives its datasheet figures and arithmetic (links share
    section comments: RoCE and Ethernet rates are all rate / 8)."""
    lines = _data_text("GPUS").splitlines()
    starts = [i for i, line in enumerate(lines) if re.match(r"^[^\s#][^:]*:", line)]
    assert len(starts) == len(GPUS)
    assert all(lines[i - 1].startswith("# ") for i in starts)


def test_a_malformed_entry_names_the_file_and_the_preset():
    links = ("good:\n  latency_s: 2 us\n  bandwidth_bytes_per_s: 1 GB/s\n"
             "bad:\n  latency_s: 2 us\n  bandwidth_bytes_per_s: 1 GHz\n")
    with pytest.raises(hardware.HardwareCatalogueError, match=r"(?s)data/links\.yaml: preset 'bad'.*bandwidth"):
        hardware._load_presets(links, LinkSpec, "data/links.yaml")
    gpus = ("X:\n  peak_flops_per_s: {fp32: 1 TFLOP/s}\n  memory_bytes: 1 GiB\n"
            "  memory_bandwidth_bytes_per_s: 1 GB/s\n  boost_clock_hz: 1.4 GHz\n")
    with pytest.raises(hardware.HardwareCatalogueError, match=r"(?s)data/gpus\.yaml: preset 'X'.*boost_clock_hz"):
        hardware._load_presets(gpus, GpuSpec, "data/gpus.yaml")


@pytest.mark.parametrize("text, match", [
    ("a:\n  latency_s: 2 us\n  bandwidth_bytes_per_s: 1 GB/s\n" * 2, "preset 'a' is defined more than once"),
    ("a: [1, 2]\n", "preset 'a': expected a mapping"),
    ("100:\n  latency_s: 2 us\n  bandwidth_bytes_per_s: 1 GB/s\n", "not a string"),
    ("a:\n  name: b\n  latency_s: 2 us\n  bandwidth_bytes_per_s: 1 GB/s\n", "says name 'b'"),
    ("- a\n", "expected a mapping of preset name"),
    ("", "expected a mapping of preset name"),
    ("a: {latency_s: 2 us\n", "not valid YAML"),
])
def test_malformed_data_files_are_rejected_with_the_file_named(text, match):
    with pytest.raises(hardware.HardwareCatalogueError, match=match) as err:
        hardware._load_presets(text, LinkSpec, "data/links.yaml")
    assert "simulator/data/links.yaml" in str(err.value)
