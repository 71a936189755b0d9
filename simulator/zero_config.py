"""Schema rules of sharded data parallelism: `strategy.zero_stage` and `strategy.fsdp_sharding`.

Kept apart from `simulator.scenario` (which calls these from its validators) so the schema module
stays one screenful per idea. Sources: Rajbhandari et al., "ZeRO", SC'20 sec. 5 (stages 1-3);
Zhao et al., "PyTorch FSDP", VLDB'23 sec. 3.2 (ShardingStrategy); DeepSpeed's engine refuses
ZeRO-2/3 with pipeline parallelism.
"""

from __future__ import annotations

from typing import Any

from simulator.workload import dtype_bytes

FSDP_ZERO_STAGES: dict[str, int] = {"full_shard": 3, "hybrid_shard": 3, "shard_grad_op": 2, "no_shard": 0}
"""strategy.fsdp_sharding -> the ZeRO stage it equals (FSDP paper sec. 3.2: FULL_SHARD shards
parameters, gradients and optimizer state; SHARD_GRAD_OP keeps parameters unsharded between forward
and backward; HYBRID_SHARD fully shards within a node and replicates across nodes; NO_SHARD is DDP)."""


def zero_stage_from_fsdp(data: Any) -> Any:
    """The raw strategy mapping with zero_stage filled in from fsdp_sharding; ValueError naming both
    fields when both are given and disagree."""
    if not isinstance(data, dict) or data.get("fsdp_sharding") not in FSDP_ZERO_STAGES:
        return data
    stage = FSDP_ZERO_STAGES[data["fsdp_sharding"]]
    if "zero_stage" not in data:
        return {**data, "zero_stage": stage}
    if data["zero_stage"] != stage or isinstance(data["zero_stage"], bool):
        raise ValueError(f"strategy.zero_stage: {data['zero_stage']!r} disagrees with strategy.fsdp_sharding: "
                         f"{data['fsdp_sharding']} (ZeRO-{stage})")
    return data


def zero_setting(strategy, zero_stage: int) -> str:
    """How the user set the ZeRO stage, for an error: `fsdp_sharding` (which sets it) when given."""
    sharding = getattr(strategy, "fsdp_sharding", None)
    return f"strategy.fsdp_sharding: {sharding} (ZeRO-{zero_stage})" if sharding else f"strategy.zero_stage: {zero_stage}"


def check_zero(strategy) -> None:
    """ZeRO is modelled for the megatron kind only (FSDP alone: tp 1, pp 1), ZeRO-2/3, as in DeepSpeed,
    not with pipeline parallelism; a reduce dtype applies to sharded gradients only, an FSDP version
    to plans that gather parameters per unit (ZeRO-3, SHARD_GRAD_OP). `strategy`: the validated
    `simulator.scenario.StrategyConfig`."""
    kind, zero_stage, pp_degree = strategy.kind, strategy.zero_stage, strategy.pp_degree
    reduce_dtype, fsdp_version = strategy.fsdp_reduce_dtype, strategy.fsdp_version
    if fsdp_version is not None and zero_stage < 3 and strategy.fsdp_sharding != "shard_grad_op":
        raise ValueError(f"strategy.fsdp_version: {fsdp_version} applies to parameters gathered per unit (zero_stage "
                         f"3, or fsdp_sharding full_shard / shard_grad_op / hybrid_shard); got zero_stage {zero_stage}")
    if reduce_dtype is not None and zero_stage < 2:
        raise ValueError(f"strategy.fsdp_reduce_dtype: {reduce_dtype} applies to sharded gradients (zero_stage 2 "
                         f"or 3, or fsdp_sharding full_shard / shard_grad_op / hybrid_shard); got zero_stage {zero_stage}")
    if strategy.grad_reduce_dtype is not None and (zero_stage >= 2 or kind != "megatron"):
        raise ValueError(f"strategy.grad_reduce_dtype: {strategy.grad_reduce_dtype} applies to Megatron's gradient "
                         f"buffer (kind megatron, zero_stage 0 or 1; sharded gradients: fsdp_reduce_dtype); got kind "
                         f"{kind!r}, zero_stage {zero_stage}")
    if zero_stage >= 1 and kind != "megatron":
        raise ValueError(f"strategy.zero_stage: {zero_stage} needs strategy.kind megatron (got {kind!r}, which "
                         "reduces gradients as DDP does; FSDP alone is megatron with tp_degree 1 and pp_degree 1)")
    if zero_stage >= 2 and pp_degree > 1:
        raise ValueError(f"{zero_setting(strategy, zero_stage)} with strategy.pp_degree {pp_degree}: "
                         "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism (DeepSpeed)")


def without_unused_fsdp_keys(strategy: dict) -> dict:
    """A raw strategy mapping (a search candidate's) with the FSDP keys its ZeRO stage does not use
    set to None, so that the schema accepts it: the sharding name of another stage, the reduce dtype
    below stage 2, the version without per-unit gathers."""
    stage = strategy["zero_stage"]
    sharding = strategy.get("fsdp_sharding") if FSDP_ZERO_STAGES.get(strategy.get("fsdp_sharding")) == stage else None
    gathers = stage == 3 or sharding == "shard_grad_op"
    return {**strategy, "fsdp_sharding": sharding, "fsdp_version": strategy.get("fsdp_version") if gathers else None,
            "fsdp_reduce_dtype": strategy.get("fsdp_reduce_dtype") if stage >= 2 else None,
            "grad_reduce_dtype": strategy.get("grad_reduce_dtype") if stage <= 1 else None}


def without_zero(strategy: dict) -> dict:
    """A raw strategy mapping moved to a kind other than megatron: its ZeRO stage (megatron's) and
    the FSDP keys that go with it dropped, as those kinds reduce gradients as DDP does."""
    return without_unused_fsdp_keys({**strategy, "zero_stage": 0}) if strategy["zero_stage"] else strategy


def gradient_reduce_op(config) -> str:
    """How the replicas reduce a gradient bucket for the update: allreduce without sharding and with
    `zero1_gradient_reduce: allreduce` (DeepSpeed's BF16_Optimizer: `runtime/pipe/engine.py` `_bf16_reduce_grads`
    allreduces the fp32 gradients, then each rank updates its shard and allgathers), else reduce-scatter."""
    allreduce = config.zero_stage == 0 or (config.zero_stage == 1 and config.zero1_gradient_reduce == "allreduce")
    return "allreduce" if allreduce else "reduce_scatter"


def gradient_element_bytes(dtype: str, zero_stage: int, reduce_dtype: str | None = None) -> int:
    """Bytes of a gradient as the data-parallel reduction moves it. Megatron's DDP buffer (stages 0-1):
    fp32 under bf16 (Megatron-LM `arguments.py`: "bfloat16 requires gradient accumulation and
    all-reduce to be done in fp32"; `docs/distrib_optimizer.md`: bf16 parameters with fp32
    gradients), else the training dtype's. Sharded gradients (stages 2-3, DeepSpeed and FSDP): the
    training dtype's, or `reduce_dtype`'s (`strategy.fsdp_reduce_dtype`: FSDP's MixedPrecision
    reduce_dtype, the gradient cast before its reduce-scatter and its shard kept so). `reduce_dtype` at
    stages 0-1: Megatron-Core's buffer dtype (`strategy.grad_reduce_dtype`; `reduce_dtype_of`)."""
    if reduce_dtype is not None:
        return dtype_bytes(reduce_dtype)
    return 4 if dtype == "bf16" and zero_stage <= 1 else dtype_bytes(dtype)


def reduce_dtype_of(strategy) -> str | None:
    """The dtype a scenario's strategy reduces and keeps gradients in, where it names one: FSDP's
    `fsdp_reduce_dtype` (stages 2-3) or Megatron-Core's `grad_reduce_dtype` (stages 0-1)."""
    return strategy.fsdp_reduce_dtype or strategy.grad_reduce_dtype
