"""Bad input to graph topology files and sweeps: one line on stderr naming the field (or file) and the
value, exit code 2, no traceback, no hang and no output left behind."""

from __future__ import annotations

import json

import networkx as nx
import pytest
import yaml

from ghpsim.cli import main
from simulator.errors import MAX_MESSAGE_CHARS, ScenarioError
from simulator.fabrics import build_topology
from simulator.scenario import ClusterConfig
from simulator.sweep import load_sweep, run_sweep
from simulator.sweep import runner as runner_module

SCENARIO = {"model": {"name": "mlp"}, "training": {"global_batch_size": 8}}
BASE = {"name": "tiny", "cluster": {"num_nodes": 2, "gpus_per_node": 1}, "model": {"name": "mlp"},
        "strategy": {"kind": "dp"}, "training": {"global_batch_size": 8}}


def one_error_line(code: int, err: str, *needles: str) -> str:
    """The single `ghpsim: error:` line of a refused command, which contains every needle."""
    lines = err.splitlines()
    assert code == 2 and len(lines) == 1, (code, err[:3000])
    line = lines[0]
    assert line.startswith("ghpsim: error: ") and len(line) <= MAX_MESSAGE_CHARS, line
    for needle in needles:
        assert needle in line, (needle, line)
    return line


def cli(capsys, *argv: str) -> tuple[int, str]:
    """Exit code and stderr of `ghpsim ARGV`."""
    code = main(list(argv))
    return code, capsys.readouterr().err


def graph_scenario(tmp_path, graph_name: str, num_nodes: int = 2, gpus_per_node: int = 1):
    """A scenario file using `graph_name` (in tmp_path) as its topology."""
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**SCENARIO, "cluster": {
        "num_nodes": num_nodes, "gpus_per_node": gpus_per_node, "topology": "graph_file",
        "topology_file": graph_name}}))
    return path


def write_graph(path, graph: nx.Graph) -> None:
    path.write_text(json.dumps(nx.node_link_data(graph, edges="links")))


# ----------------------------------------------------------------------------- 1. malformed GraphML

GRAPHML = '<graphml xmlns="http://graphml.graphdrawing.org/xmlns">{}</graphml>'


@pytest.mark.parametrize("text", [
    '<graphml><graph><node id="gpu0"/></graph',  # truncated XML (ParseError)
    "",  # empty file
    "\x00\x01 not xml",
    "<notgraphml/>",
    GRAPHML.format('<key id="d0" for="edge" attr.name="bandwidth" attr.type="int"/><graph edgedefault="undirected">'
                   '<node id="gpu0"/><node id="gpu1"/><edge source="gpu0" target="gpu1"><data key="d0">x</data>'
                   '</edge></graph>'),  # ValueError
    GRAPHML.format('<key id="d0" for="edge" attr.name="up" attr.type="boolean"/><graph edgedefault="undirected">'
                   '<node id="gpu0"/><node id="gpu1"/><edge source="gpu0" target="gpu1"><data key="d0">maybe</data>'
                   '</edge></graph>'),  # KeyError
    GRAPHML.format('<graph edgedefault="undirected"><hyperedge/></graph>'),  # NetworkXError
])
def test_malformed_graphml_is_one_line(tmp_path, capsys, text):
    (tmp_path / "bad.graphml").write_text(text)
    with pytest.raises(ScenarioError, match=r"cluster\.topology_file: .*bad\.graphml.*not a readable graph"):
        build_topology(ClusterConfig(num_nodes=2, gpus_per_node=1, topology="graph_file",
                                     topology_file=str(tmp_path / "bad.graphml")))
    one_error_line(*cli(capsys, "simulate", str(graph_scenario(tmp_path, "bad.graphml"))),
                   "cluster.topology_file", "bad.graphml", "not a readable graph")


# ----------------------------------------------------------------------------- 2. unconnected devices

def _edges(graph: nx.Graph, *pairs) -> nx.Graph:
    for a, b in pairs:
        graph.add_edge(a, b, bandwidth="10 GB/s", latency="1 us")
    return graph


@pytest.mark.parametrize("graph, message", [
    (_edges(nx.Graph(), ("gpu0", "sw")), "the graph has no vertex gpu1"),
    (_edges(nx.Graph(), (0, "sw"), (1, "sw")), "the graph has no vertex gpu0"),  # devices named 0, 1
])
def test_a_missing_device_vertex_names_the_file(tmp_path, capsys, graph, message):
    write_graph(tmp_path / "g.json", graph)
    one_error_line(*cli(capsys, "simulate", str(graph_scenario(tmp_path, "g.json"))),
                   "cluster.topology_file", "g.json", message)


@pytest.mark.parametrize("graph, message", [
    (_edges(nx.Graph(nx.empty_graph(["gpu1"])), ("gpu0", "sw"), ("gpu2", "sw"), ("gpu3", "sw")),
     "gpu1 is not connected to gpu0"),  # gpu1 has no edge
    (_edges(nx.Graph(), ("gpu0", "sw0"), ("gpu1", "sw0"), ("gpu2", "sw1"), ("gpu3", "sw1")),
     "gpu2 is not connected to gpu0"),  # two islands
    (_edges(nx.DiGraph(), ("gpu0", "sw"), ("gpu1", "sw"), ("gpu2", "sw"), ("gpu3", "sw")),
     "no path from gpu0 to gpu1"),  # one-way edges into a switch
    (_edges(nx.DiGraph(), ("gpu0", "sw"), ("sw", "gpu0"), ("gpu1", "sw"), ("sw", "gpu1"), ("gpu2", "sw"),
            ("sw", "gpu2"), ("sw", "gpu3")), "no path from gpu3 to gpu0"),  # gpu3 only receives
])
def test_unconnected_devices_name_the_file_and_the_device(tmp_path, capsys, graph, message):
    write_graph(tmp_path / "g.json", graph)
    with pytest.raises(ScenarioError, match=f"cluster.topology_file: .*g.json.*: .*{message}"):
        build_topology(ClusterConfig(num_nodes=2, gpus_per_node=2, topology="graph_file",
                                     topology_file=str(tmp_path / "g.json")))
    scenario = graph_scenario(tmp_path, "g.json", gpus_per_node=2)
    for command in ("simulate", "compare"):
        one_error_line(*cli(capsys, command, str(scenario)), "cluster.topology_file", "g.json", message)


def test_a_connected_graph_with_unused_vertices_still_builds(tmp_path):
    graph = _edges(nx.Graph(), ("gpu0", "sw"), ("gpu1", "sw"), ("gpu9", "other"))  # gpu9 is not used
    write_graph(tmp_path / "g.json", graph)
    topology = build_topology(ClusterConfig(num_nodes=2, gpus_per_node=1, topology="graph_file",
                                            topology_file=str(tmp_path / "g.json")))
    assert len(topology.route(0, 1)) == 2


# ----------------------------------------------------------------------------- 3, 4. --scheduler

def sweep_file(tmp_path, base=None, axes=None):
    """A sweep file in tmp_path (by default: a valid base and two points)."""
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"base": BASE if base is None else base,
                                    "axes": axes or {"training.global_batch_size": [8, 16]}}))
    return path


@pytest.mark.parametrize("address", ["notanaddress", "tcp://localhost:notaport", "tcp://[::1", "inproc://x",
                                     "tcp://host", "tcp://host:0", "tcp://host:65536", "tcp://host:8786/x",
                                     "localhost:8786", "nonsense://x", "tcp://a b:1", "tcp://:8786",
                                     "inproc://192.0.2.2/0/1"])
def test_malformed_scheduler_addresses_are_refused_before_connecting(tmp_path, capsys, address):
    with pytest.raises(ScenarioError, match="--scheduler .*not a scheduler address"):
        runner_module.check_scheduler_address(address)
    out = tmp_path / "out"
    line = one_error_line(*cli(capsys, "sweep", str(sweep_file(tmp_path)), "--out", str(out), "--scheduler", address),
                          "--scheduler", "not a scheduler address")
    assert repr(address) in line
    assert not out.exists()


@pytest.mark.parametrize("address", ["tcp://host:8786", "tcp://10.0.0.1:1", "tcp://[::1]:65535",
                                     "tcp://node-3.cluster.local:8786"])
def test_well_formed_scheduler_addresses_pass_the_check(address):
    runner_module.check_scheduler_address(address)


@pytest.mark.parametrize("address", ["", "  "])
def test_an_empty_scheduler_is_refused_not_run_locally(tmp_path, capsys, address):
    out = tmp_path / "out"
    one_error_line(*cli(capsys, "sweep", str(sweep_file(tmp_path)), "--out", str(out), "--scheduler", address),
                   "--scheduler", "empty address")
    assert not out.exists()


def test_dask_results_close_the_client_even_when_never_iterated():
    class Client:
        closed = 0

        def close(self):
            self.closed += 1

    client = Client()
    results = runner_module._DaskResults(client, [], {})
    results.close()
    assert client.closed >= 1


def test_a_failed_submission_closes_the_client(monkeypatch):
    distributed = pytest.importorskip("distributed")
    closed = []

    class Client:
        def __init__(self, *args, **kwargs):
            pass

        def map(self, *args, **kwargs):
            raise TypeError("cannot pickle")

        def close(self):
            closed.append(True)

    monkeypatch.setattr(distributed, "Client", Client)
    with pytest.raises(TypeError):
        runner_module._run_dask([("k", None)], "tcp://host:8786")
    assert closed


# ----------------------------------------------------------------------------- 5. invalid base, overlapping axes

@pytest.mark.parametrize("base, needles", [
    ({"model": {"name": "mlp"}}, ["training", "missing"]),
    ({**BASE, "cluster": {"num_nodes": 0, "gpus_per_node": 1}}, ["cluster.num_nodes", "0"]),
    ({**BASE, "strategy": {"kind": "nope"}}, ["strategy.kind", "nope"]),
])
def test_an_invalid_inline_base_is_refused(tmp_path, capsys, base, needles):
    path = sweep_file(tmp_path, base=base, axes={"cluster.gpus_per_node": [1, 2]})
    with pytest.raises(ScenarioError, match="sweep.yaml: base"):
        load_sweep(path)
    out = tmp_path / "out"
    one_error_line(*cli(capsys, "sweep", str(path), "--out", str(out), "--workers", "1"),
                   "sweep.yaml: base", *needles)
    assert not out.exists()


def test_a_base_file_that_is_not_a_scenario_is_refused(tmp_path, capsys):
    path = tmp_path / "self.yaml"
    path.write_text(yaml.safe_dump({"base": "self.yaml", "axes": {"cluster.num_nodes": [1]}}))
    out = tmp_path / "out"
    one_error_line(*cli(capsys, "sweep", str(path), "--out", str(out), "--workers", "1"),
                   "self.yaml: base", "'" + str(tmp_path / "self.yaml") + "'")
    assert not out.exists()


def test_a_base_whose_missing_field_the_axes_fill_in_still_runs(tmp_path):
    base = {key: value for key, value in BASE.items() if key != "training"}
    path = sweep_file(tmp_path, base=base, axes={"training.global_batch_size": [8, 16]})
    report = run_sweep(load_sweep(path), tmp_path / "out", workers=1, progress=False)
    assert report.counts()["ok"] == 2 and report.counts().get("invalid", 0) == 0


def test_a_valid_base_with_some_invalid_points_still_runs(tmp_path):
    path = sweep_file(tmp_path, axes={"cluster.num_nodes": [1, 0]})
    report = run_sweep(load_sweep(path), tmp_path / "out", workers=1, progress=False)
    counts = report.counts()
    assert counts["ok"] == 1 and counts["invalid"] == 1
    assert (tmp_path / "out").is_dir()


@pytest.mark.parametrize("axes, first, second", [
    ({"cluster.num_nodes": [1, 2], "cluster": [{}]}, "cluster.num_nodes", "cluster"),
    ({"model": [{"name": "mlp"}], "model.params.num_hidden_layers": [2]}, "model", "model.params.num_hidden_layers"),
    ({"strategy,strategy.kind": [[{}, "dp"]]}, "strategy", "strategy.kind"),
])
def test_overlapping_axes_are_refused(tmp_path, capsys, axes, first, second):
    path = sweep_file(tmp_path, axes=axes)
    out = tmp_path / "out"
    one_error_line(*cli(capsys, "sweep", str(path), "--out", str(out)), "sweep.yaml", repr(first), repr(second),
                   "overlap")
    assert not out.exists()
