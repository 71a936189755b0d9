"""Read a cluster graph file: networkx node-link JSON (`.json`) or GraphML (`.graphml`).

Vertices gpu0 .. gpu{N-1} are the devices; other vertices are switches (any names). Each edge
carries `bandwidth` (bytes/s per direction, a number or a string such as "25 GB/s" or
"200 Gb/s") and `latency` (one-way seconds, a number or "2 us"), optionally `tier` ("intra" or
"inter", default "inter"). An undirected graph's edges are full duplex; a directed graph's are
one-way. A relative path is read from the scenario's folder (`simulator.scenario` resolves it);
the file may be at most `simulator.limits.MAX_FILE_BYTES`, and errors never quote its contents.
"""

from __future__ import annotations

import json
from pathlib import Path

import networkx as nx

from simulator.errors import ScenarioError
from simulator.limits import MAX_FILE_BYTES, check_structure
from simulator.units import parse_quantity
from simulator.yaml_loading import read_text_file


def read_graph_file(path: Path) -> nx.Graph:
    """The graph with edge attributes `tier`, `latency_s`, `bandwidth_bytes_per_s` (SI floats)."""
    what = f"cluster.topology_file: {str(path)!r}"
    if not path.is_file():
        raise ScenarioError(f"{what}: file not found")
    if path.suffix not in (".json", ".graphml"):
        raise ScenarioError(f"{what}: expected a .json (node-link) or .graphml file")
    if path.stat().st_size > MAX_FILE_BYTES:
        raise ScenarioError(f"{what}: larger than the {MAX_FILE_BYTES} bytes ghpsim reads")
    try:
        if path.suffix == ".graphml":
            graph = nx.read_graphml(path)
        else:
            data = json.loads(read_text_file(path, what))
            check_structure(data, what)
            graph = nx.node_link_graph(data, multigraph=False, edges="links" if "links" in data else "edges")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError, RecursionError, SyntaxError,
            nx.NetworkXError) as error:  # SyntaxError: xml.etree's ParseError (malformed GraphML)
        if isinstance(error, ScenarioError):
            raise
        raise ScenarioError(f"{what}: not a readable graph ({type(error).__name__})") from None
    if graph.is_multigraph():
        raise ScenarioError(f"cluster.topology_file: {str(path)!r}: parallel edges are not supported (give one "
                            "edge with their summed bandwidth)")
    for a, b, data in graph.edges(data=True):
        try:
            data["bandwidth_bytes_per_s"] = parse_quantity(data["bandwidth"], "bytes_per_s")
            data["latency_s"] = parse_quantity(data.get("latency", 0.0), "s")
        except (KeyError, ValueError):
            raise ScenarioError(f"cluster.topology_file: {str(path)!r}: edge {a}--{b} needs a bandwidth and a "
                                "latency, numbers or quantities such as '25 GB/s' and '2 us'") from None
        data["tier"] = data.get("tier", "inter")
        for name, bad, rule in (("bandwidth", data["bandwidth_bytes_per_s"] <= 0, "must be > 0"),
                                ("latency", data["latency_s"] < 0, "must be >= 0"),
                                ("tier", data["tier"] not in ("intra", "inter"), "must be intra or inter")):
            if bad:
                raise ScenarioError(f"cluster.topology_file: {str(path)!r}: edge {a}--{b}: {name} "
                                    f"{str(data.get(name))[:40]!r} {rule}")
    return graph


def check_devices(graph: nx.Graph, num_devices: int, what: str = "cluster.topology_file") -> None:
    """Refuse a graph that lacks a device vertex gpu0 .. gpu{num_devices-1} or whose devices are not
    all connected (both ways in a directed graph); `what` names the field and file in the error."""
    names = [f"gpu{device}" for device in range(num_devices)]
    missing = [name for name in names if name not in graph]
    if missing:
        raise ScenarioError(f"{what}: the graph has no vertex {missing[0]} (it needs gpu0 .. "
                            f"gpu{num_devices - 1} for num_nodes x gpus_per_node devices)")
    if num_devices < 2:
        return
    if graph.is_directed():
        reached, reaching = nx.descendants(graph, names[0]), nx.ancestors(graph, names[0])
        for name in names[1:]:
            if name not in reached:
                raise ScenarioError(f"{what}: there is no path from {names[0]} to {name}")
            if name not in reaching:
                raise ScenarioError(f"{what}: there is no path from {name} to {names[0]}")
        return
    component = nx.node_connected_component(graph, names[0])
    unreachable = next((name for name in names[1:] if name not in component), None)
    if unreachable is not None:
        raise ScenarioError(f"{what}: {unreachable} is not connected to {names[0]}")
