"""Context parallelism in the megatron kind (`strategy.cp_degree` c): each of the c ranks of a CP
group holds s / c tokens of every sequence and runs ring attention over the group.

Sources: Liu et al. 2023, "Ring Attention with Blockwise Transformers for Near-Infinite Context";
Megatron-Core's context parallelism (docs "context_parallel", `--context-parallel-size`) and
TransformerEngine's `attn_forward_func_with_cp` (P2P ring, the sequence split into 2c chunks so
that each rank's causal work is equal).

Work per rank: every GEMM and elementwise kernel sees b s / c tokens, and with the 2c-chunk causal
balancing each rank's attention core does 1 / c of the full (causal) attention work, so a CP rank
does exactly 1 / c of a micro-batch's FLOPs, moves 1 / c of its bytes and saves 1 / c of its
activations. The plan gives each CP rank the micro-batch share b / c of whole sequences: the same
FLOPs, bytes and saved tensors (Korthikanti et al. 2023's s b h terms and the core's a s^2 b term,
s / c queries against s keys), with the kernels' shapes at b / c x s rather than b x s / c tokens
(the one approximation: kernel efficiency at that shape).

Communication (TE's P2P ring): per attention layer and micro-batch the forward runs c - 1 steps,
each sending the rank's current K and V block, 2 (b s / c) (h g / a) / t x dtype bytes (g key-value
heads of a, GQA; the rank's h g / (a t) key-value width under TP) to the next rank of the ring; the
backward passes K and V again plus dK and dV back: twice the forward bytes. TE overlaps each step
with the attention of the block in hand; the plan starts a pass's ring transfers with its compute
and what follows waits for both (as `tp_comm_overlap`): the pass takes max(compute, ring) at pass
granularity (an upper bound on the overlap, like TE's at block granularity). Under a causal sliding
window of W keys the queries of chunk a see only keys [a L - W, (a + 1) L) (L = s / 2c), so a
window-aware exchange moves each chunk's halo, the W keys before it held by other ranks, instead of
the c - 1 ring steps, and the backward returns their dK, dV (`halo_tokens`; a window wider than
(c - 1) L keeps the ring, which then moves no more). Each ring step waits for the previous hop, so a
pass's transfer pays the route's latency once per step and layer (`ring_messages_per_layer`).

Weights are replicated over CP: the gradients are reduced over the d x c ranks of a (stage, TP
rank) (Megatron's data-parallel-with-CP group), and ZeRO-1 shards over them too. Rank order:
tp fastest, then cp, then pp, then dp (`TensorConfig.device_of`), so a CP group sits in a node when
t c divides gpus_per_node.

Folding (`simulator.symmetry`): a symmetric run's representative sends its ring hop to itself, played
as every CP rank's hop at once; refused where a CP ring mixes hops inside and between nodes (its
ranks then differ) or where copies meet other loads (`simulator.symmetry_check`).

Not modelled (refused): ZeRO-2/3 or expert parallelism with c > 1; models without attention.
"""

from __future__ import annotations

from simulator.errors import ScenarioError
from simulator.plan import BACKWARD, Recv, Send
from simulator.zero_config import zero_setting


def attention_specs(workload, start: int = 0, end: int | None = None) -> list[dict]:
    """The specs of the layers in [start, end) with an attention core over a sequence."""
    return [layer.spec for layer in workload.layers[start:end]
            if layer.spec.get("num_heads") and layer.spec.get("seq_len")]


def check_context_parallel(config, workload) -> None:
    """ScenarioError naming the field and value when `config.cp` (TensorConfig) cannot run `workload`."""
    cp = config.cp
    if cp == 1:
        return
    specs = attention_specs(workload)
    if not specs:
        raise ScenarioError(f"strategy.cp_degree: {cp} needs a transformer model ({workload.name} has no "
                            "attention layers)")
    for s in sorted({spec["seq_len"] for spec in specs}):
        if s % (2 * cp):
            raise ScenarioError(f"strategy.cp_degree: {cp} does not split the sequence length {s} into 2 x {cp} "
                                "equal chunks (Megatron's causal load balancing)")
    if config.zero_stage >= 2:
        raise ScenarioError(f"{zero_setting(config, config.zero_stage)} with cp_degree {cp} is not modelled "
                            "(use zero_stage 0 or 1, and no fsdp_sharding)")
    if config.ep > 1:
        raise ScenarioError(f"strategy.ep_degree: {config.ep} with cp_degree {cp} is not modelled")


def chunk_owner(chunk: int, cp: int) -> int:
    """The CP rank holding sequence chunk `chunk` of 2c (rank r holds r and 2c - 1 - r)."""
    return chunk if chunk < cp else 2 * cp - 1 - chunk


def halo_tokens(seq_len: int, cp: int, window: int) -> float | None:
    """The most keys a CP rank receives for its two chunks (r and 2c - 1 - r, each L = s / 2c tokens)
    under a causal window of `window` keys: the part of [a L - W, a L) before each chunk a that other
    ranks hold (module docstring); None where W > (c - 1) L, past which the halo is no smaller than the ring."""
    length = seq_len / (2 * cp)
    if window > (cp - 1) * length:
        return None
    most = 0.0
    for rank in range(cp):
        received = 0.0
        for chunk in (rank, 2 * cp - 1 - rank):
            start = max(0.0, chunk * length - window)
            received += sum(min((source + 1) * length, chunk * length) - max(source * length, start)
                            for source in range(int(start // length), chunk) if chunk_owner(source, cp) != rank)
        most = max(most, received)
    return most


def ring_messages_per_layer(spec: dict, cp: int, phase: str) -> int:
    """Back-to-back messages one CP rank sends for one attention layer: forward the c - 1 ring steps
    (each waits for the previous hop), backward twice that (K, V and dK, dV, TE's two P2P exchanges a
    step); a causal sliding window: one message to each rank its halo comes from (`halo_sources`)."""
    window = spec.get("sliding_window") or 0
    sources = halo_sources(spec["seq_len"], cp, window) if window else None
    forward = cp - 1 if sources is None else sources
    return 2 * forward if phase == BACKWARD else forward


def halo_sources(seq_len: int, cp: int, window: int) -> int | None:
    """The most ranks one CP rank receives its halo from (`halo_tokens`); None where the ring stays."""
    length = seq_len / (2 * cp)
    if window > (cp - 1) * length:
        return None
    return max(len({chunk_owner(source, cp) for chunk in (rank, 2 * cp - 1 - rank)
                    for source in range(int(max(0.0, chunk * length - window) // length), chunk)} - {rank})
               for rank in range(cp))


def ring_bytes_per_layer(spec: dict, microbatch_size: float, tp: int, cp: int, element_bytes: float,
                         phase: str) -> float:
    """Bytes one CP rank sends on the ring for one attention layer and micro-batch of b sequences:
    forward (c - 1) x 2 (K, V) x (b s / c) x kv_hidden / t x dtype, backward twice that (K, V and
    dK, dV; TE's P2P ring attention). kv_hidden = h g / a (GQA). A causal sliding window: the
    rank's halo of K and V (`halo_tokens`) forward, and their dK and dV backward."""
    heads = spec["num_heads"]
    kv_bytes_per_token = 2 * microbatch_size * spec["hidden_size"] * spec.get("num_kv_heads", heads) / heads \
        / tp * element_bytes
    window = spec.get("sliding_window") or 0
    halo = halo_tokens(spec["seq_len"], cp, window) if window else None
    if halo is not None:
        return halo * kv_bytes_per_token
    forward = (cp - 1) * spec["seq_len"] / cp * kv_bytes_per_token
    return 2 * forward if phase == BACKWARD else forward


def ring_exchange(rank, start: int, end: int, phase: str) -> tuple[int, ...]:
    """The CP ring transfers of `rank`'s (a `_TensorRank`) pass over [start, end): one send to the next
    CP rank and one receive from the previous, started with the pass's compute; what follows waits for
    the receive and the send. `rank.batch` is the CP rank's share b / c of the micro-batch."""
    config = rank.config
    if config.cp == 1:
        return ()
    microbatch = rank.batch * config.cp
    specs = attention_specs(rank.workload, start, end)
    size = sum(ring_bytes_per_layer(spec, microbatch, config.tp, config.cp, rank.element_bytes, phase) for spec in specs)
    if size == 0:
        return ()
    replica, position = divmod(rank.dp_index, config.cp)
    tp_index = rank.pipeline % config.tp

    def plan_rank(k: int) -> int:
        return ((replica * config.cp + k % config.cp) * config.tp + tp_index) * config.pp + rank.stage_index

    count = rank.num_ring
    rank.num_ring += 1
    # a symmetric run's representative sends to itself: its hop stands for every CP rank's (simulator.symmetry)
    dst, src = (rank.rank, rank.rank) if rank.symmetric else (plan_rank(position + 1), plan_rank(position - 1))
    send = rank.builder.add(Send, dst=dst, size_bytes=size, key=("cp", rank.rank, count), deps=rank.compute_deps,
                            label=f"cp ring {phase}",
                            messages=sum(ring_messages_per_layer(spec, config.cp, phase) for spec in specs))
    recv = rank.builder.add(Recv, src=src, key=("cp", src, count), label=f"cp ring recv {phase}")
    return (send, recv)
