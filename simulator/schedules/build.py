"""Builders of the schedule IR for each pipeline kind (`SCHEDULES`, `build_schedule`).

p ranks (stages), m micro-batches, v model chunks per rank (interleaved only). Rank k:

- gpipe (Huang et al., NeurIPS 2019): the m forwards, then the m backwards (in micro-batch order,
  as torch's ScheduleGPipe), then one update after the flush.
- 1f1b (Narayanan et al., SC'21, section 2.2; PipeDream-Flush): min(p - 1 - k, m) warm-up forwards,
  then alternately one forward and one backward, then the remaining backwards, one update.
- interleaved_1f1b (same paper, section 2.2.1; Megatron-LM's schedule): rank k holds chunks k,
  k + p, ..., k + (v - 1) p. Forwards visit (chunk, micro-batch) in groups of p micro-batches per
  chunk: the n-th forward of the rank is local chunk (n // p) % v of micro-batch
  (n // (p v)) p + n % p; backwards the same with the chunks in reverse. Warm-up
  2 (p - 1 - k) + (v - 1) p forwards (all of them when m = p), then 1F1B, then the cool-down.
  m must be a multiple of p.
- pipedream (Narayanan et al., SOSP 2019): the 1f1b order without a flush: an update ("U") after
  every backward; stage k has p - k micro-batches in flight.
- spectrain (Chen et al., arXiv 1809.02839): pipedream's order; a weight prediction ("P") before
  every forward and, with staggered prediction, before every backward.
- delayed_gradient (Ouroboros, Yang et al., NeurIPS 2019; its basis, decoupled parallel
  backpropagation with delayed gradients, Huo et al., ICML 2018). Our reading: in iteration t
  module k runs the forward of micro-batch t with its current weights, then the backward of
  micro-batch t - (p - 1 - k) using the output gradient module k + 1 produced in an earlier
  iteration (so a backward never waits for the current iteration's downstream backward; the
  delay grows by one iteration per module from the output), then updates with that delayed
  gradient; no weight versions are stashed, the backward uses the current weights. Written as a
  per-rank order this is F(t), B(t - (p - 1 - k)), U: the same order, dependencies and timing as
  pipedream without weight stashing. The kinds differ only in which weights the backward uses
  (pipedream stashes by default), which the validator's runtime implements.
"""

from __future__ import annotations

from simulator.errors import ScenarioError
from simulator.schedules.ir import BACKWARD, FORWARD, PREDICT, UPDATE, Op, Schedule


def _one_f_one_b(rank: int, p: int, m: int) -> list[tuple[str, int]]:
    """(phase, micro-batch) of stage `rank` in 1F1B order."""
    warmup = min(p - 1 - rank, m)
    order = [(FORWARD, i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [(FORWARD, warmup + i), (BACKWARD, i)]
    return order + [(BACKWARD, i) for i in range(m - warmup, m)]


def gpipe(p: int, m: int, v: int = 1, staggered: bool = True) -> Schedule:
    ranks = tuple((*(Op(FORWARD, k, i) for i in range(m)), *(Op(BACKWARD, k, i) for i in range(m)),
                   Op(UPDATE, k, -1)) for k in range(p))
    return Schedule("gpipe", p, m, 1, ranks)


def one_f_one_b(p: int, m: int, v: int = 1, staggered: bool = True) -> Schedule:
    ranks = tuple((*(Op(phase, k, i) for phase, i in _one_f_one_b(k, p, m)), Op(UPDATE, k, -1))
                  for k in range(p))
    return Schedule("1f1b", p, m, 1, ranks)


def interleaved_1f1b(p: int, m: int, v: int = 2, staggered: bool = True) -> Schedule:
    if m % p:
        raise ScenarioError(f"strategy.num_microbatches: {m} is not a multiple of the {p} stages "
                            "(interleaved_1f1b needs m divisible by p)")
    total = m * v

    def visit(n: int, phase: str, rank: int) -> Op:
        local = (n // p) % v
        if phase == BACKWARD:
            local = v - 1 - local
        return Op(phase, local * p + rank, (n // (p * v)) * p + n % p)

    ranks = []
    for k in range(p):
        warmup = total if m == p else min(2 * (p - 1 - k) + (v - 1) * p, total)
        order = [visit(n, FORWARD, k) for n in range(warmup)]
        for n in range(total - warmup):
            order += [visit(warmup + n, FORWARD, k), visit(n, BACKWARD, k)]
        order += [visit(n, BACKWARD, k) for n in range(total - warmup, total)]
        ranks.append((*order, Op(UPDATE, k, -1)))
    return Schedule("interleaved_1f1b", p, m, v, tuple(ranks))


def _asynchronous(kind: str, p: int, m: int, predict_forward: bool, predict_backward: bool) -> Schedule:
    ranks = []
    for k in range(p):
        order: list[Op] = []
        for phase, i in _one_f_one_b(k, p, m):
            if (phase == FORWARD and predict_forward) or (phase == BACKWARD and predict_backward):
                order.append(Op(PREDICT, k, i))
            order.append(Op(phase, k, i))
            if phase == BACKWARD:
                order.append(Op(UPDATE, k, i))
        ranks.append(tuple(order))
    return Schedule(kind, p, m, 1, tuple(ranks))


def pipedream(p: int, m: int, v: int = 1, staggered: bool = True) -> Schedule:
    return _asynchronous("pipedream", p, m, False, False)


def spectrain(p: int, m: int, v: int = 1, staggered: bool = True) -> Schedule:
    return _asynchronous("spectrain", p, m, True, staggered)


def delayed_gradient(p: int, m: int, v: int = 1, staggered: bool = True) -> Schedule:
    return _asynchronous("delayed_gradient", p, m, False, False)


SCHEDULES = {"gpipe": gpipe, "1f1b": one_f_one_b, "interleaved_1f1b": interleaved_1f1b,
             "pipedream": pipedream, "spectrain": spectrain, "delayed_gradient": delayed_gradient}


def build_schedule(kind: str, num_stages: int, num_microbatches: int, num_virtual_stages: int = 1,
                   staggered_prediction: bool = True) -> Schedule:
    """The schedule of `kind`; ScenarioError (naming the strategy field) for impossible settings."""
    if kind not in SCHEDULES:
        raise ScenarioError(f"strategy.kind: {kind!r} is not a pipeline schedule "
                            f"(one of {', '.join(SCHEDULES)})")
    if num_stages < 1:
        raise ScenarioError(f"stages: {num_stages} must be at least 1")
    if num_microbatches < 1:
        raise ScenarioError(f"strategy.num_microbatches: {num_microbatches} must be at least 1")
    if num_virtual_stages < 1:
        raise ScenarioError(f"strategy.num_virtual_stages: {num_virtual_stages} must be at least 1")
    if kind == "interleaved_1f1b":
        return interleaved_1f1b(num_stages, num_microbatches, num_virtual_stages)
    if num_virtual_stages != 1:
        raise ScenarioError(f"strategy.num_virtual_stages: {num_virtual_stages} is only used by "
                            f"interleaved_1f1b (kind is {kind})")
    return SCHEDULES[kind](num_stages, num_microbatches, 1, staggered_prediction)
