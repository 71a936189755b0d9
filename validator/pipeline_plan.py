"""What the pipeline runtime (`validator.pipeline_runtime`) reads off a pipeline `Plan` for one
rank: the weight handling of its kind, its micro-batches and chunks' layer ranges, SpecTrain's
prediction variant and steps, which receives prove a send delivered, and the gloo tag of a
message; plus SpecTrain's predicted weights. Shared with the single-process reference
(`validator.pipeline_reference`) and torch's schedules (`validator.torch_pipelining`).
"""

from __future__ import annotations

import torch

from simulator.plan import FORWARD, Compute, Plan, Recv, Send
from simulator.schedules.ir import ASYNCHRONOUS_KINDS
from simulator.strategies.pipeline import PREDICT_PHASE as PREDICT
from simulator.strategies.pipeline import REPREDICT_PHASE


def weight_mode(plan: Plan) -> str:
    """The weights a micro-batch's passes use (`validator.pipeline_runtime`): accumulate for a
    synchronous plan (the live weights, gradients accumulated over the step); for an asynchronous
    one predict (SpecTrain), stash (PipeDream with weight stashing) or newest (the live weights as
    they are: PipeDream without stashing, delayed gradients)."""
    if plan.strategy not in ASYNCHRONOUS_KINDS:
        return "accumulate"
    if plan.strategy == "spectrain":
        return "predict"
    if plan.strategy == "pipedream" and plan.meta.get("weight_stashing", True):
        return "stash"
    return "newest"


def num_microbatches(plan: Plan) -> int:
    forwards = {a.microbatch for a in plan.actions[0] if isinstance(a, Compute) and a.phase == FORWARD}
    return int(plan.meta.get("num_microbatches", len(forwards)))


def chunk_ranges(plan: Plan) -> list[tuple[int, int]]:
    """Layer range of every global chunk c (chunk t of stage j is c = t * M + j)."""
    stages = plan.workers_per_group
    per_stage = [getattr(s, "chunks", ()) or ((s.layer_start, s.layer_end),) for s in plan.stages]
    ranges = [per_stage[c % stages][c // stages] for c in range(stages * len(per_stage[0]))]
    assert all(ranges[c][1] == ranges[c + 1][0] for c in range(len(ranges) - 1)), ranges
    return ranges


def prediction_variant(plan: Plan, rank: int) -> str:
    """SpecTrain variant: meta "weight_prediction", else "staggered" iff a micro-batch's weights are
    predicted again after its forward (a backward prediction)."""
    if "weight_prediction" in plan.meta:
        return plan.meta["weight_prediction"]
    forwarded: set[int] = set()
    for action in plan.actions[rank]:
        if isinstance(action, Compute) and action.phase == FORWARD:
            forwarded.add(action.microbatch)
        elif isinstance(action, Compute) and (action.phase == REPREDICT_PHASE or (
                action.phase == PREDICT and action.microbatch in forwarded)):
            return "staggered"
    return "forward"


def prediction_steps(stage: int, num_stages: int, variant: str) -> tuple[int, int | None]:
    """(s for the forward, s for the backward or None = keep the forward's weights), SpecTrain 3."""
    if variant == "staggered":
        return stage // 2 + num_stages - stage - 1, stage // 2
    return num_stages - stage - 1, None


def sends_delivered_by(plan: Plan, rank: int) -> dict[tuple, list[tuple]]:
    """Receive key -> keys of the rank's sends that this receive proves delivered: the peer sends the
    received message after its receive of ours (gloo sends complete only when received, and the
    work holds the tensor until waited; waiting then returns at once and frees it)."""
    delivered = {}
    for send in (a for a in plan.actions[rank] if isinstance(a, Send)):
        peer = plan.actions[send.dst]
        at = next(i for i, a in enumerate(peer) if isinstance(a, Recv) and a.key == send.key)
        reply = next((a for a in peer[at + 1:] if isinstance(a, Send) and a.dst == rank), None)
        if reply is not None:
            delivered.setdefault(reply.key, []).append(send.key)
    return delivered


def message_tag(key: tuple, num_chunks: int) -> int:
    kind, _group, chunk, microbatch = key
    return (0 if kind == "act" else 1) + 2 * (chunk + num_chunks * microbatch)


def predicted_weights(parameters, optimizer: torch.optim.Optimizer, steps: int, learning_rate: float):
    """W - steps * lr * v for each parameter (v = 0 before the first update)."""
    out = []
    with torch.no_grad():
        for p in parameters:
            buffer = optimizer.state.get(p, {}).get("momentum_buffer")
            out.append(p.detach().clone() if buffer is None else p.detach() - steps * learning_rate * buffer)
    return out
