"""Scenario schema (pydantic v2, frozen, extra keys forbidden), YAML loader and `--set` overrides.

A scenario = cluster + model + strategy + training (+ optional cost settings). Every key, its
unit and an example are documented in `scenarios/README.md`. Bad input raises `ScenarioError`,
whose message is one line naming the file, the field and the value.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from simulator.errors import ScenarioError
from simulator.hardware import BytesPerSecond, GpuSpec, LinkSpec, resolve_gpu, resolve_link
from simulator.limits import MAX_BATCH, MAX_FAT_TREE_K, MAX_GPUS, MAX_MICROBATCHES, MIN_LINK_FACTOR, check_structure
from simulator.scenario_types import (Bool, Float, GpuCount, IndexKey, Int, LayerCount, LinkName, NoBool,
                                      PositiveBytes, Slowdown)
from simulator.units import parse_quantity, plural
from simulator.validation_errors import format_validation_error
from simulator.yaml_loading import StrictLoader, load_yaml_text, read_yaml_file
from simulator.kernel_catalogue import MAX_HOST_OVERHEAD_S, check_flash_kernel
from simulator.scenario_checks import DisplayText, check_cost_settings, check_fp8, placement_name
from simulator.zero_config import check_zero, zero_stage_from_fsdp

StrategyKind = Literal["dp", "mp", "ghp", "gpipe", "1f1b", "interleaved_1f1b", "pipedream", "spectrain",
                       "delayed_gradient", "megatron"]
PIPELINE_KINDS: tuple[str, ...] = ("gpipe", "1f1b", "interleaved_1f1b", "pipedream", "spectrain", "delayed_gradient")
"""Kinds that split each group's batch into micro-batches flowing through its M stages."""


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


Gpu = Annotated[GpuSpec, BeforeValidator(resolve_gpu)]


class ClusterConfig(_Frozen):
    """Nodes of GPUs; one link tier inside a node and a fabric between nodes (`topology`, see
    `simulator.topology`); optionally other GPU types on some nodes, stragglers, degraded links."""

    num_nodes: GpuCount = 1
    gpus_per_node: GpuCount = 1
    gpu: Gpu = "V100"
    intra_node_link: Annotated[LinkSpec, BeforeValidator(resolve_link)] = "nvlink2-v100"
    inter_node_link: Annotated[LinkSpec, BeforeValidator(resolve_link)] = "ib-edr"
    nics_per_node: GpuCount = 1
    topology: Literal["two_tier", "fat_tree", "rail_optimized", "torus_2d", "graph_file"] = "two_tier"
    fat_tree_k: Annotated[int, NoBool, Field(gt=0, le=MAX_FAT_TREE_K)] | None = None
    """fat_tree: switch radix k (even); default the smallest with k^3/4 >= num_nodes x nics_per_node."""
    torus_shape: tuple[GpuCount, GpuCount] | None = None
    """torus_2d: rows x columns of nodes; default the most nearly square."""
    topology_file: str | None = None
    """graph_file: node-link JSON or GraphML (relative to the scenario file)."""
    node_gpus: dict[IndexKey, Gpu] = Field(default_factory=dict)
    """Node index -> GPU type of its devices, for nodes whose GPU is not `gpu`."""
    stragglers: dict[IndexKey, Slowdown] = Field(default_factory=dict)
    """Device index -> compute slowdown factor >= 1 (2.0: every compute action takes twice as long)."""
    degraded_links: dict[LinkName, Annotated[Float, Field(ge=MIN_LINK_FACTOR, le=1)]] = Field(default_factory=dict)
    """"node<n>" (node n's links to the fabric), "gpu<d>" (device d's links) or "<a>--<b>" (a graph
    edge) -> bandwidth factor in [MIN_LINK_FACTOR, 1] (1e-6 to 1); n and d without a leading zero."""

    @model_validator(mode="after")
    def _check_fabric(self) -> "ClusterConfig":
        for field, count in (("gpus_per_node", self.num_gpus), ("nics_per_node", self.num_nodes * self.nics_per_node)):
            if count > MAX_GPUS:
                raise ValueError(f"cluster.{field}: {getattr(self, field)} x cluster.num_nodes {self.num_nodes} "
                                 f"is {count}, more than the {MAX_GPUS} a cluster may have")
        for field, kind in (("fat_tree_k", "fat_tree"), ("torus_shape", "torus_2d"), ("topology_file", "graph_file")):
            if getattr(self, field) is not None and self.topology != kind:
                raise ValueError(f"cluster.{field}: only used with cluster.topology {kind} "
                                 f"(got topology {self.topology})")
        if self.topology == "graph_file" and self.topology_file is None:
            raise ValueError("cluster.topology_file: required with cluster.topology graph_file")
        for field, indices, limit, what in (("node_gpus", self.node_gpus, self.num_nodes, "nodes"),
                                            ("stragglers", self.stragglers, self.num_gpus, "devices")):
            bad = [index for index in indices if index >= limit]
            if bad:
                raise ValueError(f"cluster.{field}: index {bad[0]} is out of range (the cluster has {limit} {what})")
        return self

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node

    @property
    def heterogeneous(self) -> bool:
        """True when some devices or links differ from the rest (mixed GPUs, stragglers, degraded links)."""
        mixed = any(gpu != self.gpu for gpu in self.node_gpus.values())
        return mixed or any(f != 1.0 for f in self.stragglers.values()) or bool(self.degraded_links)


class LayerRow(_Frozen):
    """One row of a layer table (see `simulator.workload.Layer`); counts per sample."""

    name: str
    kind: str = "linear"
    forward_flops_per_sample: Float = Field(ge=0)
    backward_flops_per_sample: Float | None = Field(default=None, ge=0)
    num_params: Int = Field(ge=0)
    input_elements_per_sample: Int = Field(gt=0)
    output_elements_per_sample: Int = Field(gt=0)
    saved_elements_per_sample: Int | None = Field(default=None, ge=0)


class ModelConfig(_Frozen):
    """A zoo model by name (with factory params), an inline layer table, a layer-table file, or a
    Hugging Face config.json (LLaMA-style; `params` override its dimensions, e.g. seq_len)."""

    name: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    layers: tuple[LayerRow, ...] | None = None
    file: str | None = None
    hf_config: str | None = None
    """Path of a Hugging Face config.json (relative to the scenario file)."""

    @model_validator(mode="after")
    def _exactly_one_source(self) -> "ModelConfig":
        given = [key for key in ("name", "layers", "file", "hf_config") if getattr(self, key) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of name, layers, file, hf_config (got {given or 'none'})")
        return self


def _zero_stage_filled(data: Any) -> Any:
    """The raw strategy mapping as `zero_stage_from_fsdp` fills it; ValueError first for `zero_stage:
    null` (a key left without a value), which names no stage."""
    if isinstance(data, dict) and "zero_stage" in data and data["zero_stage"] is None:
        raise ValueError("strategy.zero_stage: null is not a ZeRO stage: give 0, 1, 2 or 3, or leave the key out "
                         "(0, or strategy.fsdp_sharding's stage)")
    return zero_stage_from_fsdp(data)


class StrategyConfig(_Frozen):
    """How the N workers split the work: dp (G=N, M=1), mp (G=1, M=N), ghp (G groups x M workers);
    pipeline kinds: G replicas (num_groups, default 1) of an M-stage pipeline, M = N / G."""

    kind: StrategyKind = "dp"
    num_groups: GpuCount | None = None
    placement: Annotated[Literal["group_per_node", "stage_per_node", "tp_dp_pp"] | tuple[Int, ...],
                         BeforeValidator(placement_name)] = "group_per_node"
    """A rank order by name (`tp_dp_pp`: kind megatron only, `simulator.layout_geometry`) or a device list."""
    partition: Literal["balanced", "uniform", "pipedream"] | tuple[LayerCount, ...] = "balanced"
    bucket_size_bytes: PositiveBytes = 25 * 2**20
    overlap_backward: Bool = True
    collective: Literal["auto", "ring", "tree", "hierarchical"] = "auto"
    dp_sync: Literal["allreduce", "parameter_server"] = "allreduce"
    num_parameter_servers: GpuCount = 1
    num_microbatches: Annotated[int, NoBool, Field(gt=0, le=MAX_MICROBATCHES)] = 1
    """Pipeline kinds: micro-batches per step in each replica (m)."""
    num_virtual_stages: LayerCount = 1
    """interleaved_1f1b: model chunks per rank (v)."""
    weight_prediction: Literal["staggered", "forward"] = "staggered"
    """spectrain: s = floor(k/2) + N - k - 1 forward / floor(k/2) backward ("staggered"), or
    s = N - k - 1 with the forward weights reused in backward ("forward")."""
    weight_stashing: Bool = True
    """pipedream: keep the forward's weight version for the backward (False: the no-stash
    asynchronous schedule, whose backward uses the newest weights)."""
    gradient_compression: Literal["none", "topk"] = "none"
    compression_density: Annotated[Float, Field(gt=0, le=1)] = 0.01
    """topk: fraction rho of each layer's gradient entries sent."""
    tp_degree: GpuCount = 1
    """megatron: tensor-parallel ranks t per layer (simulator/strategies/tensor.py)."""
    pp_degree: GpuCount = 1
    """megatron: pipeline stages p; data-parallel replicas d = N / (t p)."""
    sequence_parallel: Bool = False
    """megatron: reduce-scatter + allgather instead of each TP allreduce (Korthikanti et al. 2022)."""
    cp_degree: GpuCount = 1
    """megatron: context-parallel ranks c per sequence, ring attention (simulator/strategies/context.py)."""
    ep_degree: GpuCount = 1
    """megatron: expert-parallel ranks e per MoE layer, carved out of the d replicas (e divides d and the
    experts; simulator/strategies/experts.py)."""
    zero_stage: Annotated[Literal[0, 1, 2, 3], NoBool] = 0
    """megatron: shards over the d replicas the optimizer state (1), + gradients (2), + parameters (3)
    (ZeRO, Rajbhandari et al. SC'20 sec. 5; simulator/strategies/zero.py)."""
    zero1_gradient_reduce: Literal["reduce_scatter", "allreduce"] = "reduce_scatter"
    """megatron, zero_stage 1: the d replicas reduce-scatter gradients before the sharded update (Megatron's
    distributed optimizer), or allreduce them (DeepSpeed's BF16_Optimizer, which keeps whole fp32 gradients)."""
    fsdp_sharding: Literal["full_shard", "shard_grad_op", "hybrid_shard", "no_shard"] | None = None
    """megatron: PyTorch FSDP's ShardingStrategy; sets zero_stage (simulator/zero_config.py)."""
    fsdp_reduce_dtype: Literal["fp32", "bf16", "fp16"] | None = None
    """zero_stage 2-3: the dtype gradients are reduce-scattered and kept in (FSDP's reduce_dtype); None: training's."""
    grad_reduce_dtype: Literal["fp32", "bf16", "fp16"] | None = None
    """megatron, zero_stage 0-1: Megatron-Core's gradient buffer dtype (grad_reduce_in_fp32); None: fp32 under bf16."""
    fsdp_version: Literal[1, 2] | None = None
    """Per-unit gathers: 2 PyTorch FSDP2 (copy passes), 1 flat buffers (FSDP1, DeepSpeed); None: 2 with fsdp_sharding."""
    symmetry: Annotated[Literal["auto", "off"], BeforeValidator(lambda v: "off" if v is False else v)] = "auto"
    """auto simulates one representative per symmetric set of ranks (megatron: simulator/symmetry.py;
    dp, mp, ghp and the pipeline kinds: simulator/grid_symmetry.py); off forces the full simulation."""
    gradient_accumulation_fusion: Bool | None = None
    """Kernel cost model: true, each weight-gradient GEMM accumulates into its main gradient; false, a
    separate accumulation kernel per weight; None: as the framework does (`kernel_ops.accumulation_fused`)."""
    tp_comm_overlap: Bool = False
    """megatron: the TP collectives of a pass overlap its compute (`--tp-comm-overlap`; needs sequence_parallel)."""
    gradient_fusion: Literal["buckets", "horovod"] = "buckets"
    """dp / mp / ghp: gradients allreduced in DDP buckets (bucket_size_bytes) or fused as Horovod's
    background thread does (simulator/strategies/fusion.py)."""
    horovod_cycle_time_s: Annotated[Float, Field(ge=0)] = 1e-3
    """gradient_fusion horovod: HOROVOD_CYCLE_TIME (Horovod >= 0.21 default 1 ms)."""
    horovod_fusion_threshold_bytes: Annotated[float, BeforeValidator(lambda v: parse_quantity(v, "bytes")),
                                              Field(ge=0)] = 128 * 2**20
    """gradient_fusion horovod: HOROVOD_FUSION_THRESHOLD (Horovod >= 0.21 default 128 MiB; 0: no fusion)."""

    _zero_from_fsdp = model_validator(mode="before")(classmethod(lambda cls, data: _zero_stage_filled(data)))

    _check_zero = model_validator(mode="after")(lambda self: check_zero(self) or self)

    @model_validator(mode="after")
    def _servers_need_a_server(self) -> "StrategyConfig":
        if self.num_parameter_servers > 1 and self.dp_sync != "parameter_server":
            raise ValueError(f"strategy.num_parameter_servers: {self.num_parameter_servers} shards apply with "
                             f"strategy.dp_sync: parameter_server (got {self.dp_sync})")
        return self


class TrainingConfig(_Frozen):
    global_batch_size: Annotated[int, NoBool, Field(gt=0, le=MAX_BATCH)]
    dtype: Literal["fp32", "tf32", "fp16", "bf16"] = "fp32"
    optimizer: Literal["sgd", "momentum", "adam"] = "sgd"
    memory_policy: Literal["none", "reuse", "laysa"] = "none"
    recompute: Literal["none", "selective", "full"] = "none"
    offload_activations: Bool = False
    """Move saved activations to host memory over PCIe instead of keeping them."""
    memory_format: Literal["nchw", "nhwc"] = "nchw"
    """Convolution activations' layout: PyTorch's default NCHW or channels_last NHWC (`simulator.kernels_cnn.conv`)."""
    cudnn_allow_tf32: Bool = True
    """PyTorch's `torch.backends.cudnn.allow_tf32` (default True): fp32 convolutions on Ampere and later
    run on TF32 tensor cores (`simulator.kernel_catalogue.conv_dtype`); matmuls stay fp32."""
    fp8_recipe: Literal["delayed", "current"] | None = None
    """FP8 training as Transformer Engine runs it: blocks' linear layers in FP8, with this scaling recipe; the
    rest in `dtype` (16-bit); None: off (`simulator.kernels_fp8`; checked by `scenario_checks.check_fp8`)."""
    allocator_fragmentation: Annotated[Float, Field(ge=0, lt=0.5)] = 0.0
    """Share of device memory the caching allocator loses to fragmentation (`simulator.memory.usable_memory_bytes`)."""


LayerKind = Literal["conv", "linear", "attention", "embedding", "norm", "pool", "elementwise"]


class CostConfig(_Frozen):
    """Cost settings: the compute model (`kernel`: each layer as the GPU kernels a framework
    launches, `simulator.kernel_costs`; `analytic`: a roofline at a fixed achieved fraction of peak
    per layer kind; `auto`: kernel for a GPU of a named family, else analytic:
    `kernel_catalogue.kernel_model_chosen`), the analytic model's efficiencies (0 < e <= 1), whether attention runs as one fused
    flash-attention kernel, and the device <-> host bandwidth that offloaded activations move at
    (`simulator.memory`)."""

    model: Literal["auto", "kernel", "analytic"] = "auto"
    flash_attention: Bool = False
    flash_attention_kernel: Literal["flash2", "flash1", "flash3", "triton", "xformers"] = "flash2"
    """The fused kernel's implementation (`kernel_catalogue.FLASH_KERNEL_SLOWDOWNS`)."""
    efficiency: dict[LayerKind, Annotated[Float, Field(gt=0, le=1)]] = Field(default_factory=dict)
    host_bandwidth_bytes_per_s: BytesPerSecond | None = None
    """training.offload_activations: bytes/s per direction between a device and host memory; None:
    PCIe 3.0 x16 (`simulator.memory.HOST_LINK`)."""
    comm_sm_contention: Bool = True
    """Kernel cost model: compute slows while a collective's NCCL kernels hold SMs on its GPU
    (`simulator.host_sharing.sm_sharing`)."""
    host_overhead_s: Annotated[Float, Field(ge=0, le=MAX_HOST_OVERHEAD_S)] | None = None
    """Kernel cost model: the framework's host time to issue one kernel; None: the catalogue's
    (`simulator.kernel_catalogue.HOST_OVERHEAD_S`); 0: a host that never holds the GPU back (CUDA graphs)."""
    kernel_profile: str | None = None
    """Kernel cost model: a kernel profile (`ghpsim fit`, `calibrate --kernels`; relative to the scenario's
    folder) whose parameters replace the catalogue's (`simulator.profile_costs.kernel_profile_parameters`)."""

    _check_flash_kernel = model_validator(mode="after")(lambda self: check_flash_kernel(self) or self)


class Scenario(_Frozen):
    name: DisplayText = "unnamed"
    description: DisplayText = ""
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    model: ModelConfig
    strategy: StrategyConfig = Field(default_factory=StrategyConfig)
    training: TrainingConfig
    costs: CostConfig = Field(default_factory=CostConfig)
    base_dir: str = Field(default=".", exclude=True, description="folder that relative model.file paths start from")
    source: str = Field(default="<scenario>", exclude=True, description="where the scenario came from, for errors")

    _check_costs = model_validator(mode="after")(lambda self: check_cost_settings(self) or check_fp8(self) or self)

    @model_validator(mode="after")
    def _check_grid(self) -> "Scenario":
        dtype, node_gpus = self.training.dtype, sorted(self.cluster.node_gpus.items())
        for field, gpu, node in (("cluster.gpu.peak_flops_per_s", self.cluster.gpu, ""),
                                 *(("cluster.node_gpus", gpu, f" (node {node})") for node, gpu in node_gpus)):
            try:
                gpu.peak_for(dtype)
            except KeyError:
                hint = " (bf16 tensor cores came with Ampere: train in fp16 or fp32)" if dtype == "bf16" else ""
                raise ValueError(f"{field}: GPU {gpu.name!r} has no figure for training.dtype {dtype!r}{node}"
                                 f"{hint}") from None
        num_gpus = self.cluster.num_gpus
        groups = self.strategy.num_groups
        if self.strategy.kind == "ghp" and groups is None:
            raise ValueError("strategy.num_groups: required for kind ghp")
        if self.strategy.kind not in ("dp", "mp") and groups is not None and num_gpus % groups:
            raise ValueError(f"strategy.num_groups: {groups} does not divide the {plural(num_gpus, 'GPU')} "
                             f"(cluster.num_nodes x cluster.gpus_per_node)")
        cp = self.strategy.cp_degree
        if self.strategy.kind == "megatron" and num_gpus % (self.strategy.tp_degree * self.strategy.pp_degree * cp):
            raise ValueError(f"strategy.tp_degree: {self.strategy.tp_degree} x strategy.pp_degree {self.strategy.pp_degree}"
                             f"{f' x strategy.cp_degree {cp}' if cp > 1 else ''} does not divide the {plural(num_gpus, 'GPU')}")
        for key in ("ep_degree", "cp_degree"):
            if getattr(self.strategy, key) > 1 and self.strategy.kind != "megatron":
                raise ValueError(f"strategy.{key}: {getattr(self.strategy, key)} applies to kind megatron only")
        placement = self.strategy.placement
        if isinstance(placement, tuple) and sorted(placement) != list(range(num_gpus)):
            raise ValueError(f"strategy.placement: {list(placement) if len(placement) <= 16 else f'a list of {len(placement)} devices'} is not a permutation of the {num_gpus} device indices 0..{num_gpus - 1}")
        return self

    @property
    def num_gpus(self) -> int:
        return self.cluster.num_gpus

    def grid(self) -> tuple[int, int]:
        """(G, M): number of groups and workers per group for this scenario's strategy."""
        num_gpus = self.num_gpus
        if self.strategy.kind == "dp":
            return num_gpus, 1
        if self.strategy.kind == "mp":
            return 1, num_gpus
        if self.strategy.kind == "megatron":  # d x t pipelines of p stages (simulator/strategies/tensor.py)
            return num_gpus // self.strategy.pp_degree, self.strategy.pp_degree
        groups = self.strategy.num_groups or 1
        return groups, num_gpus // groups


# ----------------------------------------------------------------------------- loading

def load_scenario(source: str | Path | dict, overrides: list[str] | tuple[str, ...] = ()) -> Scenario:
    """Load and validate a scenario from a YAML file path or a dict, applying `a.b=value` overrides."""
    if isinstance(source, dict):
        origin, raw, base_dir = "<scenario>", copy.deepcopy(source), "."
    else:
        origin, raw, base_dir = str(source), read_yaml(source), str(Path(source).parent)
    for override in overrides:
        apply_override(raw, override, origin)
    return scenario_from_dict(raw, origin, base_dir)


def read_yaml(path: str | Path) -> dict:
    """Read a YAML mapping (`simulator.yaml_loading`: no duplicate keys, bounded size and nesting);
    ScenarioError for a missing, huge or non-UTF-8 file, bad YAML or a non-mapping."""
    path = Path(path)
    data = read_yaml_file(path)
    if not isinstance(data, dict):
        raise ScenarioError(f"{path}: expected a mapping of sections at the top level, got {type(data).__name__}")
    return data


def scenario_from_dict(raw: dict, origin: str = "<scenario>", base_dir: str = ".") -> Scenario:
    """Validate a scenario mapping; its shape and sizes are checked first (`simulator.limits`), and a
    relative cluster.topology_file is taken from `base_dir` (the scenario's folder), as model.file is."""
    if not isinstance(raw, dict):
        raise ScenarioError(f"{origin}: expected a mapping of sections at the top level, got {type(raw).__name__}")
    check_structure(raw, origin)
    for internal in ("base_dir", "source"):
        if internal in raw:
            raise ScenarioError(f"{origin}: {internal}: unknown key")
    cluster = raw.get("cluster")
    if isinstance(cluster, dict) and isinstance(cluster.get("topology_file"), str) and base_dir not in ("", "."):
        path = Path(cluster["topology_file"])
        if not path.is_absolute():
            raw = {**raw, "cluster": {**cluster, "topology_file": os.path.abspath(Path(base_dir) / path)}}
    try:
        return Scenario.model_validate({**raw, "base_dir": base_dir, "source": origin})
    except ValidationError as error:
        raise ScenarioError(format_validation_error(error, origin)) from None


def apply_override(raw: dict, assignment: str, origin: str = "<scenario>") -> None:
    """Apply `a.b.c=value` in place; the value is parsed as YAML (so 8 is an int, [1,2] a list)."""
    if "=" not in assignment:
        raise ScenarioError(f"{origin}: --set {assignment!r}: expected key.path=value")
    path, _, text = assignment.partition("=")
    keys = path.strip().split(".")
    if not all(keys):
        raise ScenarioError(f"{origin}: --set {assignment!r}: empty key" if keys == [""] else
                            f"{origin}: --set {assignment!r}: an empty part in the key {path.strip()!r}")
    try:
        value = yaml.load(text, Loader=StrictLoader)  # noqa: S506 (a SafeLoader)
    except (yaml.scanner.ScannerError, yaml.parser.ParserError):
        value = text  # not YAML: the text itself
    except (yaml.YAMLError, ValueError, RecursionError):
        value = load_yaml_text(text, f"{origin}: --set {path}")  # raises its one-line error
    node = raw
    for key in keys[:-1]:
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        if not isinstance(child, dict):
            raise ScenarioError(f"{origin}: --set {path}: {key} is not a section")
        node = child
    node[keys[-1]] = value
