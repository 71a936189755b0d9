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
reallocate: neither walks the links beyond its own. Flows of one (usage, cap) always share one
rate, so they move as one class (`_FlowClass`): thousands of sends of one stage pair queued on a
link are one entry of the finish heap and one demand of weight n in the allocation. This is
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
    __slots__ = ("id", "size", "threshold", "done")

    def __init__(self, flow_id, size, threshold, done):
        self.id, self.size, self.threshold, self.done = flow_id, size, threshold, done


class _FlowClass:
    """The active flows of one (usage, cap). Progressive filling treats such flows alike, so they
    always share one rate: the class moves as one flow of weight n x count on each link, keeps one
    `served` counter (bytes each of its flows has moved since the class formed, up to `since_s`)
    and one entry in the network's finish heap. A flow ends when `served` reaches its `threshold`
    (`served` when it joined + its size): processor sharing's virtual time (Kleinrock, Queueing
    Systems vol. 2, 1976, sec. 4.4), so n flows queued on one link cost O(log n) per event, not O(n)."""
    __slots__ = ("id", "usage", "cap", "pending", "rate", "served", "since_s", "version")

    def __init__(self, class_id, usage, cap, now_s):
        self.id, self.usage, self.cap = class_id, usage, cap
        self.pending: list[tuple[float, int, _Flow]] = []  # heap of (threshold, flow id, flow)
        self.rate = self.served = 0.0
        self.since_s = now_s
        self.version = 0

    def advance(self, now_s: float) -> None:
        self.served += self.rate * (now_s - self.since_s)
        self.since_s = now_s

    def next_finish_s(self) -> float:
        return self.since_s + max(self.pending[0][0] - self.served, 0.0) / self.rate


class _Demand:
    """A class as `max_min_rates` sees it: one flow whose counts are scaled by its n flows."""
    __slots__ = ("id", "usage", "cap")

    def __init__(self, flow_class: _FlowClass):
        num_flows = len(flow_class.pending)
        self.id, self.cap = flow_class.id, flow_class.cap
        self.usage = tuple((link, count * num_flows) for link, count in flow_class.usage)


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
        self._on_link: list[dict[int, _FlowClass]] = [{} for _ in self.capacities]
        self._classes: dict[tuple, _FlowClass] = {}
        self._finishes: list[tuple[float, int, int, _FlowClass]] = []
        self._timer_at_s = math.inf
        self._next_id = 0
        self._next_class_id = 0
        self._rates_cache: dict[tuple, tuple[float, ...]] = {}
        """((usage, cap, flows) of each class of a component, in order) -> their rates: a step's
        pattern of concurrent flows recurs every micro-batch, and the usages are the engine's cached
        phases."""

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
        now, on_link = self.env.now, self._on_link
        flow_class = self._classes.get((usage, cap))
        if flow_class is None:
            flow_class = self._classes[usage, cap] = _FlowClass(self._next_class_id, usage, cap, now)
            self._next_class_id += 1
            for link, _ in usage:
                on_link[link][flow_class.id] = flow_class
        else:
            flow_class.advance(now)
        flow = _Flow(self._next_id, size_bytes, flow_class.served + size_bytes, done)
        self._next_id += 1
        heapq.heappush(flow_class.pending, (flow.threshold, flow.id, flow))
        # a class alone on its links is its own component: no walk
        alone = all(len(on_link[link]) == 1 for link, _ in usage)
        self._reallocate([flow_class] if alone else self._component([link for link, _ in usage]),
                         touched=(flow_class,))
        return done

    # ------------------------------------------------------------------ internals
    def _component(self, links) -> list[_FlowClass]:
        """Classes connected to `links` through shared links, in a deterministic order."""
        found: dict[int, _FlowClass] = {}
        seen_links = set(links)
        stack = list(seen_links)
        while stack:
            for class_id, flow_class in self._on_link[stack.pop()].items():
                if class_id in found:
                    continue
                found[class_id] = flow_class
                for link, _ in flow_class.usage:
                    if link not in seen_links:
                        seen_links.add(link)
                        stack.append(link)
        return sorted(found.values(), key=lambda flow_class: flow_class.id)

    def _reallocate(self, classes: list[_FlowClass], touched=()) -> None:
        """New rates for `classes`; a class whose rate changed, or in `touched` (its flows changed),
        gets a fresh finish-heap entry."""
        if not classes:
            return
        now = self.env.now
        key = tuple((c.usage, c.cap, len(c.pending)) for c in classes)  # rates depend on these alone
        rates = self._rates_cache.get(key)
        if rates is None:
            if len(self._rates_cache) >= RATES_CACHE_SIZE:
                self._rates_cache.clear()
            if len(classes) == 1:
                flow_class = classes[0]
                num_flows = len(flow_class.pending)
                rates = (min(flow_class.cap, min(self.capacities[link] / (count * num_flows)
                                                 for link, count in flow_class.usage)),)
            else:
                by_id = max_min_rates([_Demand(c) for c in classes], self.capacities)
                rates = tuple(by_id[c.id] for c in classes)
            self._rates_cache[key] = rates
        touched_ids = {flow_class.id for flow_class in touched}
        for flow_class, rate in zip(classes, rates):
            if rate == flow_class.rate and flow_class.id not in touched_ids:
                continue
            flow_class.advance(now)
            flow_class.rate = rate
            flow_class.version += 1
            heapq.heappush(self._finishes,
                           (flow_class.next_finish_s(), flow_class.id, flow_class.version, flow_class))
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

    @staticmethod
    def _is_due(left_s: float, left_bytes: float, size: float, now: float) -> bool:
        """Done when what is left would finish within float resolution of the clock or is a
        negligible number of bytes (else a very fast flow could stall time)."""
        return left_s <= 1e-12 * (1.0 + now) or left_bytes <= 1e-9 * size + 1e-6

    def _on_timer(self, at_s: float) -> None:
        if at_s == self._timer_at_s:
            self._timer_at_s = math.inf
        now = self.env.now
        finishes = self._finishes
        ended: list[tuple[float, int, _Flow]] = []
        changed: list[_FlowClass] = []
        while finishes:
            finish_s, _, version, flow_class = finishes[0]
            if version != flow_class.version:
                heapq.heappop(finishes)
                continue
            left_s = finish_s - now
            if not self._is_due(left_s, left_s * flow_class.rate, flow_class.pending[0][2].size, now):
                break
            heapq.heappop(finishes)
            flow_class.advance(now)
            flow_class.version += 1
            changed.append(flow_class)
            pending = flow_class.pending
            while True:  # the head flow is due (its class's entry is); then any flow due with it
                threshold, flow_id, flow = heapq.heappop(pending)
                ended.append((now + (threshold - flow_class.served) / flow_class.rate, flow_id, flow))
                if not pending:
                    break
                left_bytes = pending[0][0] - flow_class.served
                if not self._is_due(left_bytes / flow_class.rate, left_bytes, pending[0][2].size, now):
                    break
        links, touched = [], []
        for flow_class in changed:
            links.extend(link for link, _ in flow_class.usage)
            if flow_class.pending:
                touched.append(flow_class)
                continue
            for link, _ in flow_class.usage:
                del self._on_link[link][flow_class.id]
            del self._classes[flow_class.usage, flow_class.cap]
        ended.sort(key=lambda entry: entry[:2])
        callbacks = []
        for _, _, flow in ended:
            if hasattr(flow.done, "succeed"):  # an event (SimPy's)
                flow.done.succeed()
            else:
                callbacks.append(flow.done)
        on_link = self._on_link
        if any(on_link[link] for link in links):  # else the ended flows touched nobody: nothing to reallocate
            self._reallocate(self._component(links), touched=touched)
        self._arm()
        for callback in callbacks:
            callback()
