"""Scenario settings that the plan `ghpsim simulate` plays ignores, for a note on stderr.

A setting given a value other than its default on a kind, or under a cost model, that never reads
it would otherwise change nothing without a word: a user planning from the step time would believe
it counted. Each rule names the setting, its value and where it applies; nothing here changes a
prediction. The rules follow the code that reads each setting:
- `num_groups` on dp and mp, whose groups the GPU count fixes;
- pipeline settings: `num_microbatches` (the pipeline kinds and megatron: `simulator.schedules`,
  `simulator.strategies.tensor`), `num_virtual_stages` (interleaved_1f1b, megatron), `weight_stashing`
  (pipedream), `weight_prediction` (spectrain);
- megatron's layout degrees, `tp_comm_overlap` and `sequence_parallel` (a TP group of at least 2),
  `zero1_gradient_reduce` (ZeRO-1 only);
- gradient synchronisation: `compression_density` (gradient_compression topk), the Horovod knobs
  (gradient_fusion horovod), `bucket_size_bytes` (DDP buckets overlapped with the backward; not
  FSDP's per-unit reductions), `collective` and `overlap_backward` (not a parameter server, nor
  FSDP's full_shard / shard_grad_op, whose ring reduce-scatters and allgathers prefetch as FSDP does);
- the kernel cost model's inputs (`simulator.kernel_costs`: memory format, cuDNN TF32, the flash
  kernel's implementation, SM contention, gradient-accumulation fusion) under the analytic roofline
  (`kernel_catalogue.kernel_model_chosen`), which reads none of them;
- `costs.host_bandwidth_bytes_per_s` without `training.offload_activations`;
- `model.params` beside a layer table (`model.file` / `model.layers`), which fixes every dimension;
- with the workload's layer kinds known: flash attention and selective recompute on a model without
  attention, an analytic efficiency for a layer kind the model does not have;
- `cluster.nics_per_node` on a single node.
"""

from __future__ import annotations

from simulator.kernel_catalogue import kernel_model_chosen
from simulator.scenario import ClusterConfig, CostConfig, StrategyConfig, TrainingConfig
from simulator.validation_errors import short_repr

PIPELINE_KINDS_AND_MEGATRON = ("gpipe", "1f1b", "interleaved_1f1b", "pipedream", "spectrain", "megatron")

KERNEL_MODEL_INPUTS = (("training", "memory_format"), ("training", "cudnn_allow_tf32"),
                       ("costs", "flash_attention_kernel"), ("costs", "comm_sm_contention"),
                       ("strategy", "gradient_accumulation_fusion"))
"""Settings only the kernel cost model reads."""

_DEFAULTS = {"cluster": ClusterConfig(), "strategy": StrategyConfig(),
             "training": TrainingConfig(global_batch_size=1), "costs": CostConfig()}


def _changed(scenario, section: str, key: str) -> bool:
    return getattr(getattr(scenario, section), key) != getattr(_DEFAULTS[section], key)


def _text(scenario, section: str, key: str) -> str:
    value = getattr(getattr(scenario, section), key)
    return f"{section}.{key} {value if len(str(value)) <= 80 else short_repr(value)}"


def unused_settings(scenario, priced_by_profile: bool = False, layer_kinds: frozenset | None = None) -> list[str]:
    """One phrase per setting the scenario's own plan ignores ("strategy.num_microbatches 8: not
    used by kind dp (pipeline kinds and megatron only)"); `priced_by_profile`: a calibrated profile
    prices compute (`simulate --profile`), so the cost-model rules do not apply; `layer_kinds`: the
    workload's layer kinds, where known (flash attention and selective recompute act on attention)."""
    strategy, kind = scenario.strategy, scenario.strategy.kind
    notes = []

    def unless(condition: bool, section: str, key: str, where: str) -> None:
        if not condition and _changed(scenario, section, key):
            notes.append(f"{_text(scenario, section, key)}: {where}")

    by_kind = f"not used by kind {kind}"
    unless(kind not in ("dp", "mp"), "strategy", "num_groups", f"{by_kind} (dp: a group per GPU, mp: one group)")
    unless(kind in PIPELINE_KINDS_AND_MEGATRON, "strategy", "num_microbatches", f"{by_kind} (pipeline kinds and megatron only)")
    unless(kind in ("interleaved_1f1b", "megatron"), "strategy", "num_virtual_stages",
           f"{by_kind} (interleaved_1f1b and megatron only)")
    unless(kind == "pipedream", "strategy", "weight_stashing", f"{by_kind} (pipedream only)")
    unless(kind == "spectrain", "strategy", "weight_prediction", f"{by_kind} (spectrain only)")
    if kind != "megatron":
        for key in ("tp_degree", "pp_degree", "sequence_parallel", "tp_comm_overlap"):
            unless(False, "strategy", key, f"{by_kind} (kind megatron only)")
    else:
        unless(strategy.tp_degree > 1, "strategy", "tp_comm_overlap", "no TP collectives to overlap at tp_degree 1")
        unless(strategy.tp_degree > 1, "strategy", "sequence_parallel", "no TP group to split the sequence over at "
                                                                        "tp_degree 1")
    unless(strategy.gradient_compression == "topk", "strategy", "compression_density",
           "used with strategy.gradient_compression topk only")
    for key in ("horovod_cycle_time_s", "horovod_fusion_threshold_bytes"):
        unless(strategy.gradient_fusion == "horovod", "strategy", key, "used with strategy.gradient_fusion horovod only")
    unless(strategy.gradient_fusion != "horovod", "strategy", "bucket_size_bytes",
           "not used with strategy.gradient_fusion horovod (its own fusion threshold)")
    unless(kind == "megatron" or strategy.overlap_backward, "strategy", "bucket_size_bytes",
           "not used with strategy.overlap_backward false (one allreduce after the backward)")
    if strategy.fsdp_sharding is not None:
        unless(kind == "megatron", "strategy", "fsdp_sharding", f"{by_kind} (kind megatron only)")
        unless(kind != "megatron", "strategy", "bucket_size_bytes",
               f"not used with strategy.fsdp_sharding {strategy.fsdp_sharding} (each FSDP unit is reduced on its own)")
    if kind == "megatron" and strategy.fsdp_sharding in ("full_shard", "shard_grad_op"):
        for key in ("collective", "overlap_backward"):
            unless(False, "strategy", key, f"not used with strategy.fsdp_sharding {strategy.fsdp_sharding} (per-unit "
                                           "reduce-scatters and allgathers as rings, overlapped as FSDP prefetches)")
    unless(kind == "megatron" and strategy.zero_stage == 1, "strategy", "zero1_gradient_reduce",
           f"used with kind megatron and strategy.zero_stage 1 only (got {kind}, zero_stage {strategy.zero_stage})")
    unless(strategy.dp_sync != "parameter_server", "strategy", "collective",
           "not used with strategy.dp_sync parameter_server (pushes and pulls, no allreduce)")
    if not priced_by_profile and not kernel_model_chosen(scenario.costs.model, scenario.cluster.gpu):
        for section, key in KERNEL_MODEL_INPUTS:
            unless(False, section, key, "read by the kernel cost model only; this scenario is priced by the "
                                        f"analytic roofline (costs.model {scenario.costs.model})")
    unless(scenario.training.offload_activations, "costs", "host_bandwidth_bytes_per_s",
           "used with training.offload_activations only")
    absent = sorted(set(scenario.costs.efficiency) - layer_kinds) if layer_kinds is not None else []
    if absent and not any(note.startswith("costs.efficiency") for note in notes):
        notes.append(f"costs.efficiency {', '.join(absent)}: the model has no {' or '.join(absent)} layer")
    unless(scenario.cluster.num_nodes > 1, "cluster", "nics_per_node", "one node: no traffic leaves it")
    if layer_kinds is not None and "attention" not in layer_kinds:
        unless(False, "costs", "flash_attention", "the model has no attention layer to fuse")
        if scenario.training.recompute == "selective":
            notes.append("training.recompute selective: recomputes attention cores only, and the model has none "
                         "(the plan is recompute none)")
    model = scenario.model
    if model.params and (model.file or model.layers):
        notes.append(f"model.params {short_repr(dict(model.params))}: not used with a layer table "
                     f"({'model.file' if model.file else 'model.layers'} fixes every dimension)")
    return notes
