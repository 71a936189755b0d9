"""Read a cluster graph file: networkx node-link JSON (`.json`) or GraphML (`.graphml`).

Vertices gpu0 .. gpu{N-1} are the devices; other vertices are switches (any names). Each edge
carries `bandwidth` (bytes/s per direction, a number or a string such as "25 GB/s" or
"200 Gb/s") and `latency` (one-way seconds, a number or "2 us"), optionally `tier` ("intra" or
"inter", default "inter"). An undirected graph's edges are full duplex; a directed graph's are
one-way.
"""

from __future__ import annotations

import json
from pathlib import Path

import networkx as nx

from simulator.errors import ScenarioError
from simulator.units import parse_quantity


def read_graph_file(path: Path) -> nx.Graph:
    """The graph with edge attributes `tier`, `latency_s`, `bandwidth_bytes_per_s` (SI floats)."""
    if not path.is_file():
        raise ScenarioError(f"cluster.topology_file: {str(path)!r}: file not found")
    if path.suffix not in (".json", ".graphml"):
        raise ScenarioError(f"cluster.topology_file: {str(path)!r}: expected a .json (node-link) or .graphml file")
    try:
        if path.suffix == ".graphml":
            graph = nx.read_graphml(path)
        else:
            data = json.loads(path.read_text(encoding="utf-8"))
            graph = nx.node_link_graph(data, multigraph=False, edges="links" if "links" in data else "edges")
    except (ValueError, KeyError, TypeError, AttributeError, nx.NetworkXError) as error:
        raise ScenarioError(f"cluster.topology_file: {str(path)!r}: not a readable graph ({error})") from None
    if graph.is_multigraph():
        raise ScenarioError(f"cluster.topology_file: {str(path)!r}: parallel edges are not supported (give one "
                            "edge with their summed bandwidth)")
    for a, b, data in graph.edges(data=True):
        try:
            data["bandwidth_bytes_per_s"] = parse_quantity(data["bandwidth"], "bytes_per_s")
            data["latency_s"] = parse_quantity(data.get("latency", 0.0), "s")
        except (KeyError, ValueError) as error:
            raise ScenarioError(f"cluster.topology_file: {str(path)!r}: edge {a}--{b} needs a bandwidth and a "
                                f"latency ({error})") from None
        data["tier"] = data.get("tier", "inter")
        if data["bandwidth_bytes_per_s"] <= 0 or data["latency_s"] < 0 or data["tier"] not in ("intra", "inter"):
            raise ScenarioError(f"cluster.topology_file: {str(path)!r}: edge {a}--{b}: bandwidth must be > 0, "
                                f"latency >= 0 and tier intra or inter (got {data})")
    return graph
