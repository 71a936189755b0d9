"""Fluid flows on shared directed links with max-min fair rates (progressive filling).

A flow is one phase of lock-step sub-flows (`simulator.collectives.FlowPhase`): `usage` =
((link, count), ...), every sub-flow moves the same bytes at the same rate r, so the flow demands
count x r of link l, and r never exceeds the flow's per-sub-flow `cap`. Rates are the weighted
max-min fair allocation of the link capacities, found by progressive filling (Bertsekas &
Gallager, Data Networks, 2nd ed. 1992, sec. 6.5.2): raise the rate of every unfrozen flow
together; a link fills when that rate reaches (capacity left) / (summed counts of its unfrozen
flows), and the flows crossing it freeze; a flow reaching its cap freezes. A flow limited
elsewhere thus leaves its unused share to the others. With a heap of link fill levels this costs
O(U log U) for U (flow, link) incidences.

Rates are recomputed whenever a flow starts or ends, but only among the flows connected to it
through shared links (max-min allocations of disjoint components are independent); other flows
keep their rates and predicted finish times, which sit in one heap under one armed timer. A flow
alone on its links (the common case) is its own component, and one ending leaves nobody to
reallocate: neither walks the links beyond its own. This is
the fluid model of SimGrid (Velho et al., ACM TOMACS 2013). The network only needs an environment
with `now`, `event()` and `timeout()` (SimPy's), so it does not import simpy itself.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import replace


RATES_CACHE_SIZE = 4096
"""Component patterns remembered (`FlowNetwork._reallocate`); the cache is emptied when full."""


class _Flow:
    __slots__ = ("id", "size", "remaining", "usage", "cap", "rate", "since_s", "done", "version")

    def __init__(self, flow_id, size, usage, cap, now_s, done):
        self.id = flow_id
        self.size = self.remaining = size
        self.usage = usage
        self.cap = cap
        self.rate = 0.0
        self.since_s = now_s
        self.done = done
        self.version = 0


def max_min_rates(flows, capacities) -> dict[int, float]:
    """Weighted max-min fair rate per flow id by progressive filling (see the module docstring).

    `flows`: objects with `id`, `usage` ((link, count), ...) and `cap`; `capacities[link]`.
    """
    if len(flows) == 1:
        flow = flows[0]
        return {flow.id: min(flow.cap, min(capacities[link] / count for link, count in flow.usage))}
    usages = _binding_usages(flows, capacities)
    left: dict[int, float] = {}
    weight: dict[int, int] = {}
    on_link: dict[int, list] = {}
    for flow in flows:
        for link, count in usages[flow.id]:
            if link not in weight:
                left[link], weight[link], on_link[link] = capacities[link], 0, []
            weight[link] += count
            on_link[link].append(flow)
    version = dict.fromkeys(weight, 0)
    fills = [(left[link] / weight[link], link, 0) for link in weight]
    heapq.heapify(fills)
    caps = sorted((flow.cap, index) for index, flow in enumerate(flows) if flow.cap < math.inf)
    rates: dict[int, float] = {}
    level, next_cap = 0.0, 0

    def freeze(flow, rate):
        rates[flow.id] = rate
        for link, count in usages[flow.id]:
            left[link] -= count * rate
            weight[link] -= count
            version[link] += 1
            if weight[link]:
                heapq.heappush(fills, (max(left[link], 0.0) / weight[link], link, version[link]))

    while len(rates) < len(flows):
        while fills[0][2] != version[fills[0][1]]:
            heapq.heappop(fills)
        while next_cap < len(caps) and flows[caps[next_cap][1]].id in rates:
            next_cap += 1
        if next_cap < len(caps) and caps[next_cap][0] <= fills[0][0]:
            level = max(level, caps[next_cap][0])
            freeze(flows[caps[next_cap][1]], level)
            continue
        fill, link, _ = heapq.heappop(fills)
        level = max(level, fill)  # levels never fall; max() only absorbs rounding
        for flow in on_link[link]:
            if flow.id not in rates:
                freeze(flow, level)
    return rates


def _binding_usages(flows, capacities, min_incidences: int = 256) -> dict[int, tuple]:
    """Per flow id, its (link, count) pairs less the links that cannot fill first: of links crossed
    by exactly the same flows with the same counts, only the one of least capacity (lowest index on
    a tie). Their weights stay equal and their spare capacities keep their order, so that link fills
    first, at the same level, freezing the same flows: the rates are those of the full usage. Worth
    it on large components only (long rings crossing many links with the same traffic)."""
    if sum(len(flow.usage) for flow in flows) < min_incidences:
        return {flow.id: flow.usage for flow in flows}
    kept = _tightest_per_class({flow.id: flow.usage for flow in flows}, capacities)
    return {flow.id: tuple(entry for entry in flow.usage if entry[0] in kept) for flow in flows}


def _tightest_per_class(usages: dict, capacities) -> set[int]:
    """Of the links crossed by exactly the same usages (`usages`: name -> ((link, count), ...)) with
    the same counts, the one of least capacity (lowest index on a tie)."""
    crossing: dict[int, list] = {}
    for name, usage in usages.items():
        for link, count in usage:
            crossing.setdefault(link, []).append((name, count))
    best: dict[tuple, int] = {}
    for link, signature in crossing.items():
        key = tuple(signature)
        other = best.get(key)
        if other is None or (capacities[link], link) < (capacities[other], other):
            best[key] = link
    return set(best.values())


def merged_usages(usages, capacities) -> dict[tuple, tuple]:
    """Each distinct usage ((link, count), ...) of `usages` (every flow a run will play) without the
    links that can never matter: of links crossed by exactly the same usages with the same counts,
    only the one of least capacity (lowest index on a tie) is kept. Their fill levels keep their
    order under progressive filling (equal weights, equal drops), so the kept one fills first and
    freezes every flow the others would; and a flow on any of them is on the kept one, so the
    components are the same. The rates and finish times are those of the full usages, while a
    folded run's ring sets of thousands of links shrink to their few classes of links."""
    families = list(dict.fromkeys(usages))
    kept = _tightest_per_class(dict(enumerate(families)), capacities)
    return {usage: tuple(entry for entry in usage if entry[0] in kept) for usage in families}


def merge_phase_links(phase_cache: dict, capacities) -> None:
    """`merged_usages` over every flow phase in `phase_cache` (key -> a phase or a tuple of phases,
    `simulator.engine.Engine`'s), each phase replaced in place by its merged copy."""
    entries = {key: (value if isinstance(value, tuple) else (value,)) for key, value in phase_cache.items()}
    merged = merged_usages([phase.usage for phases in entries.values() for phase in phases], capacities)
    for key, phases in entries.items():
        phases = tuple(replace(phase, usage=merged[phase.usage]) for phase in phases)
        phase_cache[key] = phases if isinstance(phase_cache[key], tuple) else phases[0]


class FlowNetwork:
    """Max-min fair fluid flows over directed links of the given capacities (bytes/s)."""

    def __init__(self, env, capacities: list[float]):
        self.env = env
        self.capacities = list(capacities)
        self._on_link: list[dict[int, _Flow]] = [{} for _ in self.capacities]
        self._finishes: list[tuple[float, int, int, _Flow]] = []
        self._timer_at_s = math.inf
        self._next_id = 0
        self._rates_cache: dict[tuple, tuple[float, ...]] = {}
        """((usage, cap) of each flow of a component, in order) -> their rates: a step's pattern of
        concurrent flows recurs every micro-batch, and the usages are the engine's cached phases."""

    def transfer(self, size_bytes: float, usage: tuple[tuple[int, int], ...],
                 cap: float = math.inf, on_done=None):
        """Start a flow of `size_bytes` per sub-flow; `cap` bounds one sub-flow's rate.

        Returns an event that succeeds when the flow has moved all its bytes; with `on_done`
        (a callable, for a non-empty flow) nothing is returned and `on_done()` is called instead,
        once the rates of the flows left are set (no SimPy event per flow).
        """
        if on_done is not None and size_bytes > 0 and usage:
            done = on_done
        else:
            done = self.env.event()
            if size_bytes <= 0 or not usage:
                done.succeed()
                return done
        flow = _Flow(self._next_id, size_bytes, usage, cap, self.env.now, done)
        self._next_id += 1
        on_link, alone = self._on_link, True
        for link, _ in usage:
            flows = on_link[link]
            flows[flow.id] = flow
            alone = alone and len(flows) == 1
        # a flow alone on its links is its own component: no walk
        self._reallocate([flow] if alone else self._component([link for link, _ in usage]))
        return done

    # ------------------------------------------------------------------ internals
    def _component(self, links) -> list[_Flow]:
        """Flows connected to `links` through shared links, in a deterministic order."""
        found: dict[int, _Flow] = {}
        seen_links = set(links)
        stack = list(seen_links)
        while stack:
            for flow_id, flow in self._on_link[stack.pop()].items():
                if flow_id in found:
                    continue
                found[flow_id] = flow
                for link, _ in flow.usage:
                    if link not in seen_links:
                        seen_links.add(link)
                        stack.append(link)
        return sorted(found.values(), key=lambda flow: flow.id)

    def _reallocate(self, flows: list[_Flow]) -> None:
        if not flows:
            return
        now = self.env.now
        key = tuple((flow.usage, flow.cap) for flow in flows)  # rates depend on these alone
        rates = self._rates_cache.get(key)
        if rates is None:
            if len(self._rates_cache) >= RATES_CACHE_SIZE:
                self._rates_cache.clear()
            by_id = max_min_rates(flows, self.capacities)
            rates = self._rates_cache[key] = tuple(by_id[flow.id] for flow in flows)
        for flow, rate in zip(flows, rates):
            if rate == flow.rate:
                continue
            flow.remaining -= flow.rate * (now - flow.since_s)
            flow.since_s, flow.rate = now, rate
            flow.version += 1
            finish_s = now + max(flow.remaining, 0.0) / rate
            heapq.heappush(self._finishes, (finish_s, flow.id, flow.version, flow))
        self._arm()

    def _arm(self) -> None:
        finishes = self._finishes
        while finishes and finishes[0][2] != finishes[0][3].version:
            heapq.heappop(finishes)
        if finishes and finishes[0][0] < self._timer_at_s:
            at_s = finishes[0][0]
            self._timer_at_s = at_s
            timer = self.env.timeout(max(at_s - self.env.now, 0.0))
            timer.callbacks.append(lambda _event: self._on_timer(at_s))

    def _on_timer(self, at_s: float) -> None:
        if at_s == self._timer_at_s:
            self._timer_at_s = math.inf
        now = self.env.now
        finishes = self._finishes
        ended: list[_Flow] = []
        while finishes:
            finish_s, _, version, flow = finishes[0]
            if version != flow.version:
                heapq.heappop(finishes)
                continue
            # Done when what is left would finish within float resolution of the clock or is a
            # negligible number of bytes (else a very fast flow could stall time).
            left_s = finish_s - now
            if left_s > 1e-12 * (1.0 + now) and left_s * flow.rate > 1e-9 * flow.size + 1e-6:
                break
            heapq.heappop(finishes)
            flow.version += 1
            ended.append(flow)
        links = []
        for flow in ended:
            for link, _ in flow.usage:
                del self._on_link[link][flow.id]
                links.append(link)
        callbacks = []
        for flow in ended:
            if hasattr(flow.done, "succeed"):  # an event (SimPy's)
                flow.done.succeed()
            else:
                callbacks.append(flow.done)
        on_link = self._on_link
        if any(on_link[link] for link in links):  # else the ended flows touched nobody: nothing to reallocate
            self._reallocate(self._component(links))
        self._arm()
        for callback in callbacks:
            callback()
