"""Link-rate floors of transfers and collectives for the search's bounds (`simulator.step_bound`):
each flow phase the engine would play takes at least its latency plus its bytes at the bottleneck
link's share for its own sub-flows, so contention with other traffic can only add (max-min fairness
never exceeds capacity)."""

from __future__ import annotations

from simulator.collectives import choose_algorithm, collective_phases, pairs_phase


def isolated_time_s(topology, phases) -> float:
    """Each phase alone on the fabric: latency + bytes at its bottleneck link's share."""
    total = 0.0
    links = topology.links
    for phase in phases:
        slowest = max((count / links[link].bandwidth_bytes_per_s for link, count in phase.usage), default=0.0)
        total += phase.latency_s + phase.bytes_per_subflow * slowest
    return total


class LinkFloors:
    """Mixed into a bound model with `topology`, `_cache`, `_measured` (a profile's measured
    communication: no floor) and `uniform_links`."""

    def phases_floor_s(self, phases) -> float:
        return isolated_time_s(self.topology, phases)

    def collective_floor_s(self, groups, op: str, size_bytes: float, algorithm: str, repeat: int = 1) -> float:
        if self._measured is not None:
            return 0.0
        if op == "allreduce" and algorithm == "ring":
            algorithm = choose_algorithm(self.topology, groups[0], "ring")
        key = ("collective", self._signature(groups), op, size_bytes, algorithm, repeat)
        found = self._cache.get(key)
        if found is None:
            phases = collective_phases(self.topology, groups, op, size_bytes, algorithm, 1, repeat)
            found = self._cache[key] = self.phases_floor_s(phases)
        return found

    def p2p_floor_s(self, src: int, dst: int, size_bytes: float) -> float:
        if self._measured is not None or src == dst:
            return 0.0
        key = ("p2p", self._signature(((src, dst),)), size_bytes)
        found = self._cache.get(key)
        if found is None:
            found = self._cache[key] = self.phases_floor_s((pairs_phase(self.topology, ((src, dst),), size_bytes),))
        return found

    def _signature(self, groups) -> tuple:
        """Groups inside one node on a fabric whose nodes are alike time the same wherever they sit."""
        per_node = self.topology.gpus_per_node
        nodes = {device // per_node for group in groups for device in group}
        if self.uniform_links and len(nodes) == 1:
            return ("node", tuple(tuple(device % per_node for device in group) for group in groups))
        return tuple(tuple(group) for group in groups)
